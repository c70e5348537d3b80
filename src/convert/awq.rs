//! AutoAWQ GEMM → compressed-tensors `pack-quantized` int4, as
//! compressed-tensors' `AutoAWQConverter` writes it.
//!
//! | AutoAWQ | compressed-tensors |
//! |---|---|
//! | `qweight` int32 `[in, out/8]` | `weight_packed` int32 `[out, in/8]`, codes along rows |
//! | `qzeros` int32 `[in/g, out/8]` | `weight_zero_point` int32 `[out/8, in/g]`, packed down columns |
//! | `scales` f16 `[in/g, out]` | `weight_scale` `[out, in/g]` (transposed) |
//! | | `weight_shape` int64 `[out, in]` |
//!
//! The 4-bit codes keep their bits: compressed-tensors' signed `q − 8`
//! packs back to the stored `q`.

use std::collections::HashSet;

use safetensors::Dtype;
use serde_json::{json, Value};

use super::{ct005, py_re_escape, with_quantization_config};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result, Rule};
use crate::formats::awq::{self, Config};
use crate::formats::not_converted;
use crate::job::ZeroPoint;
use crate::output::rearrange::{Rearrange, Repack};
use crate::plan::{Output, Plan, Source};

/// compressed-tensors' `ignore`: `lm_head`, and each module not converted as
/// a regex matching any name that contains it.
fn ignore(cfg: &Config) -> Vec<String> {
    std::iter::once("lm_head".to_string())
        .chain(
            cfg.modules_to_not_convert
                .iter()
                .map(|m| format!("re:.*{}.*", py_re_escape(m))),
        )
        .collect()
}

/// Whether compressed-tensors' converter leaves `module` alone.
fn ignored(cfg: &Config, module: &str) -> bool {
    module == "lm_head" || not_converted(&cfg.modules_to_not_convert, module)
}

/// The `quantization_config` compressed-tensors writes, key for key.
fn ct_config(cfg: &Config, group: usize) -> Value {
    json!({
        "config_groups": {
            "config_group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": awq::BITS,
                    "type": "int",
                    "symmetric": !cfg.zero_point,
                    "group_size": group,
                    "strategy": "group",
                    "dynamic": false,
                },
                "input_activations": null,
                "output_activations": null,
                "format": "pack-quantized",
            }
        },
        "quant_method": "compressed-tensors",
        "kv_cache_scheme": null,
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "global_compression_ratio": null,
        "ignore": ignore(cfg),
        "moe_sparsity_config": null,
    })
}

/// Converts the planned AutoAWQ checkpoint `plan`.
pub(super) fn convert<'c>(
    ckpt: &'c Checkpoint,
    cfg: &Config,
    mut plan: Plan<'c>,
) -> Result<Plan<'c>> {
    plan.check()?;
    let Some(group) = cfg.group_size else {
        return Err(Error::new(
            Rule::Ct005,
            &cfg.path,
            "group_size -1 (one group per row) has no compressed-tensors group form",
        ));
    };
    let mut outputs = Vec::new();
    let mut used: HashSet<String> = HashSet::new();
    // The jobs planning built for the dense output hold everything stored:
    // the codes, zero points and scales, checked.
    for o in std::mem::take(&mut plan.outputs) {
        let (Source::Decode(job), Some(module)) = (&o.source, o.name.strip_suffix(".weight"))
        else {
            continue;
        };
        let (Some(q), Some(scales)) = (
            job.codes.data.tensor(),
            job.scale.as_ref().and_then(|s| s.data.tensor()),
        ) else {
            continue;
        };
        if ignored(cfg, module) {
            return Err(ct005(
                &q,
                "an AWQ weight in a module compressed-tensors ignores (lm_head, modules_to_not_convert)",
            ));
        }
        let (rows, cols, shard) = (job.dims.rows, job.dims.cols, o.shard);
        let out = |param: &str, dtype: Dtype, shape: Vec<usize>, source| Output {
            name: format!("{module}.{param}"),
            shard,
            shape,
            dtype,
            source,
            scheme: None,
        };
        if scales.shape.len() != 2 {
            return Err(ct005(
                &scales,
                format!("shape {:?}; AWQ scales are 2-D", scales.shape),
            ));
        }
        let packed = Rearrange::Repack(Repack {
            fields: job.codes.clone(),
            rows,
            cols,
            down_columns: false,
        });
        outputs.push(out(
            "weight_packed",
            Dtype::I32,
            packed.shape(),
            Source::Rearrange(packed),
        ));
        let transposed = Rearrange::Transpose(scales);
        outputs.push(out(
            "weight_scale",
            scales.dtype,
            transposed.shape(),
            Source::Rearrange(transposed),
        ));
        let shape: Vec<u8> = [rows as i64, cols as i64]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        outputs.push(out(
            "weight_shape",
            Dtype::I64,
            vec![2],
            Source::Bytes(shape),
        ));
        if let Some(ZeroPoint::PackedAlongCols { fields }) = &job.zero {
            let zeros = Rearrange::Repack(Repack {
                fields: fields.clone(),
                rows,
                cols: cols.div_ceil(group),
                down_columns: true,
            });
            outputs.push(out(
                "weight_zero_point",
                Dtype::I32,
                zeros.shape(),
                Source::Rearrange(zeros),
            ));
        }
        for p in ["qweight", "qzeros", "scales"] {
            used.insert(format!("{module}.{p}"));
        }
    }
    for name in ckpt.names() {
        if used.contains(name) {
            continue;
        }
        let Some(t) = ckpt.get(name) else { continue };
        outputs.push(Output {
            name: name.to_string(),
            shard: t.shard,
            shape: t.shape.to_vec(),
            dtype: t.dtype,
            source: Source::Copy(t),
            scheme: None,
        });
    }
    outputs.sort_by(|a, b| a.name.cmp(&b.name));
    plan.outputs = outputs;
    plan.consumed.clear();
    plan.dropped.clear();
    plan.config = Some(with_quantization_config(ckpt, ct_config(cfg, group)));
    Ok(plan)
}

//! ModelOpt NVFP4 → compressed-tensors names (rule CT-005), as
//! compressed-tensors' own `ModelOptNvfp4Converter` does it.
//!
//! Which modules are converted is decided by what the tensors are, never by
//! names: a module is converted when its `weight` is uint8 and it carries
//! `weight_scale` and `weight_scale_2`, so an embedding or `lm_head` stored in
//! bf16 can never be renamed by mistake.
//!
//! | ModelOpt | compressed-tensors |
//! |---|---|
//! | `weight` (uint8) | `weight_packed`, bytes untouched (no nibble swap) |
//! | `weight_scale` (e4m3) | `weight_scale`, unchanged |
//! | `weight_scale_2` (f32) | `weight_global_scale = 1 / weight_scale_2` (f32, same shape) |
//! | `input_scale` (f32) | `input_global_scale = 1 / input_scale` |
//! | `k_scale`, `v_scale` | unchanged names, bf16 (FP8 KV cache only) |

use std::collections::{BTreeSet, HashSet};

use safetensors::Dtype;
use serde_json::{json, Value};

use super::{ct005, py_re_escape, with_quantization_config, CT_VERSION};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule};
use crate::formats::modelopt;
use crate::numerics::OutDtype;
use crate::plan::{Output, Plan, Source};

/// `1 / x` for every f32 of `t`, in f32 as torch computes it.
fn reciprocal(t: &TensorRef<'_>) -> Result<Vec<u8>> {
    if t.dtype != Dtype::F32 {
        return Err(ct005(
            t,
            format!("dtype {}; ModelOpt global scales are F32", t.dtype),
        ));
    }
    Ok(t.data()?
        .chunks_exact(4)
        .flat_map(|c| (1.0f32 / f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes())
        .collect())
}

/// f32 (or bf16/f16) values of `t` as bf16, rounded to nearest-even.
fn to_bf16(t: &TensorRef<'_>) -> Result<Vec<u8>> {
    if t.dtype == Dtype::BF16 {
        return Ok(t.data()?.to_vec());
    }
    let values = t
        .floats()
        .map_err(|_| ct005(t, format!("dtype {}; KV cache scales are floats", t.dtype)))?;
    let mut bytes = vec![0u8; values.len() * 2];
    for (v, o) in values.iter().zip(bytes.chunks_exact_mut(2)) {
        OutDtype::Bf16.encode(*v, o);
    }
    Ok(bytes)
}

/// A ModelOpt exclude glob as a compressed-tensors `ignore` entry: plain names
/// stay as they are, globs become a `re:` pattern that matches the whole name.
fn ignore_entry(glob: &str) -> String {
    if !glob.contains(['*', '?', '[']) {
        return glob.to_string();
    }
    let mut re = String::from("re:");
    let mut chars = glob.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' => re.push_str(".*"),
            '?' => re.push('.'),
            '[' => {
                // A bracket class passes through, `!` negation becoming `^`.
                let mut class = String::from("[");
                if chars.peek() == Some(&'!') {
                    chars.next();
                    class.push('^');
                }
                let mut closed = false;
                for d in chars.by_ref() {
                    if d == ']' {
                        closed = true;
                        break;
                    }
                    if d == '\\' {
                        class.push('\\');
                    }
                    class.push(d);
                }
                if closed {
                    class.push(']');
                    re.push_str(&class);
                } else {
                    re.push_str(&py_re_escape(&class));
                }
            }
            c => re.push_str(&py_re_escape(&c.to_string())),
        }
    }
    re.push('$');
    re
}

/// The compressed-tensors `quantization_config` for NVFP4 weights (and NVFP4
/// activations when the modules carry an `input_scale`), key for key what
/// compressed-tensors' converter writes (it leaves out unset arguments).
fn ct_config(
    cfg: &modelopt::Config,
    activations: bool,
    kv_fp8: bool,
    ignore: Vec<String>,
) -> Value {
    let weights = json!({
        "dynamic": false,
        "group_size": cfg.group_size,
        "num_bits": 4,
        "scale_dtype": "torch.float8_e4m3fn",
        "strategy": "tensor_group",
        "symmetric": true,
        "type": "float",
    });
    let input = if activations {
        let mut a = weights.clone();
        a["dynamic"] = json!("local");
        a["observer"] = json!("static_minmax");
        a
    } else {
        Value::Null
    };
    let kv = if kv_fp8 {
        json!({"dynamic": false, "num_bits": 8, "strategy": "tensor", "symmetric": true, "type": "float"})
    } else {
        Value::Null
    };
    json!({
        "config_groups": {
            "config_group_0": {
                "format": "nvfp4-pack-quantized",
                "input_activations": input,
                "output_activations": null,
                "targets": ["Linear"],
                "weights": weights,
            }
        },
        "format": "nvfp4-pack-quantized",
        "global_compression_ratio": null,
        "ignore": ignore,
        "kv_cache_scheme": kv,
        "moe_sparsity_config": null,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "version": CT_VERSION,
    })
}

/// Converts the planned ModelOpt NVFP4 checkpoint `plan`: renamed and
/// inverted tensors, everything else copied, a compressed-tensors config.
pub(super) fn convert<'c>(
    ckpt: &'c Checkpoint,
    cfg: &modelopt::Config,
    mut plan: Plan<'c>,
) -> Result<Plan<'c>> {
    if cfg.algo != modelopt::Algo::Nvfp4 {
        // compressed-tensors has no converter from ModelOpt's FP8 or MXFP8
        // exports to match byte for byte (issue 26).
        return Err(Error::new(
            Rule::Ct005,
            &cfg.path,
            format!(
                "ModelOpt {} has no compressed-tensors conversion here (only NVFP4); dequantize it instead",
                cfg.quant_algo
            ),
        ));
    }
    // compressed-tensors' NVFP4 has no pre-quant scale: the converted model
    // would run without it (NVFP4_AWQ).
    if let Some(name) = ckpt
        .names()
        .into_iter()
        .find(|n| n.ends_with(".pre_quant_scale"))
    {
        return Err(Error::tensor(
            Rule::Ct005,
            ckpt.display_path(),
            name,
            format!(
                "ModelOpt {}'s pre-quant scales have no compressed-tensors equivalent; dequantize it instead",
                cfg.quant_algo
            ),
        ));
    }
    plan.check()?;
    let modules: BTreeSet<String> = plan
        .outputs
        .iter()
        .filter(|o| matches!(o.source, Source::Decode(_)))
        .filter_map(|o| o.name.strip_suffix(".weight").map(str::to_string))
        .collect();
    let kv_fp8 = match cfg.kv_cache_quant_algo.as_deref() {
        None => false,
        Some(a) if a.eq_ignore_ascii_case("fp8") => true,
        Some(a) => {
            return Err(Error::new(
                Rule::Ct005,
                &cfg.path,
                format!("kv_cache_quant_algo {a:?} has no compressed-tensors form here (only FP8)"),
            ))
        }
    };

    let mut outputs = Vec::new();
    let mut activations = false;
    let mut renamed: HashSet<String> = HashSet::new();
    for name in ckpt.names() {
        let Some(t) = ckpt.get(name) else { continue };
        let (module, param) = name.rsplit_once('.').unwrap_or(("", name));
        let converted = modules.contains(module);
        let out = |new: String, dtype: Dtype, source| Output {
            name: new,
            shard: t.shard,
            shape: t.shape.to_vec(),
            dtype,
            source,
            scheme: None,
        };
        let o = match param {
            "weight" if converted => {
                out(format!("{module}.weight_packed"), t.dtype, Source::Copy(t))
            }
            "weight_scale" if converted => out(name.to_string(), t.dtype, Source::Copy(t)),
            "weight_scale_2" if converted => out(
                format!("{module}.weight_global_scale"),
                Dtype::F32,
                Source::Bytes(reciprocal(&t)?),
            ),
            "input_scale" if converted => {
                activations = true;
                out(
                    format!("{module}.input_global_scale"),
                    Dtype::F32,
                    Source::Bytes(reciprocal(&t)?),
                )
            }
            "input_scale" | "weight_scale" | "weight_scale_2" => {
                return Err(ct005(
                    &t,
                    "a ModelOpt quantization parameter without a uint8 weight to convert",
                ))
            }
            "k_scale" | "v_scale" if kv_fp8 => {
                out(name.to_string(), Dtype::BF16, Source::Bytes(to_bf16(&t)?))
            }
            "k_scale" | "v_scale" => {
                return Err(ct005(
                    &t,
                    "a KV cache scale, but the config has no kv_cache_quant_algo",
                ))
            }
            _ => out(name.to_string(), t.dtype, Source::Copy(t)),
        };
        if !renamed.insert(o.name.clone()) {
            return Err(ct005(
                &t,
                format!("converting would write {} twice", o.name),
            ));
        }
        outputs.push(o);
    }
    outputs.sort_by(|a, b| a.name.cmp(&b.name));

    let ignore: Vec<String> = cfg
        .exclude_modules
        .iter()
        .map(|t| ignore_entry(t.text()))
        .collect();
    let qc = ct_config(cfg, activations, kv_fp8, ignore);
    plan.outputs = outputs;
    plan.consumed.clear();
    plan.dropped.clear();
    plan.config = Some(with_quantization_config(ckpt, qc));
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::formats::Target;

    #[test]
    fn ignore_entries() {
        assert_eq!(ignore_entry("lm_head"), "lm_head");
        assert_eq!(ignore_entry("*mlp.gate"), r"re:.*mlp\.gate$");
        assert_eq!(ignore_entry("model.layers.?.x"), r"re:model\.layers\..\.x$");
        assert_eq!(ignore_entry("a[!0-3]b"), r"re:a[^0-3]b$");
        for (glob, name, want) in [
            ("*mlp.gate", "model.layers.0.mlp.gate", true),
            ("*mlp.gate", "model.layers.0.mlp.gate_proj", false),
            ("*.layers.1?.*", "m.layers.12.q", true),
            ("*.layers.1?.*", "m.layers.1.q", false),
        ] {
            let t = Target::parse(&ignore_entry(glob)).unwrap();
            assert_eq!(t.rank(name).is_some(), want, "{glob} vs {name}");
        }
    }

    #[test]
    fn bf16_of_f32_rounds_to_even() {
        let data: Vec<u8> = [1.0f32 + f32::EPSILON * 64.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let t = TensorRef::of_bytes("k_scale", Dtype::F32, &[1], &data);
        // 1 + 2^-17 is below half a bf16 ulp (2^-8): rounds to 1.0.
        assert_eq!(to_bf16(&t).unwrap(), vec![0x80, 0x3F]);
    }
}

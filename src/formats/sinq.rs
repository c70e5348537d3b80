//! SINQ (`quant_method: "sinq"`): checkpoints sinq 0.2's own writer
//! (`AutoSINQHFModel.save_quantized_safetensors`, also what transformers'
//! SINQ integration saves through) leaves: sharded safetensors with each
//! quantized Linear's `W_q` (the packed codes) and its meta's tensors under
//! `<module>.meta.` (`scale`, `zero`, `scale2`), the meta's other entries
//! (`shape`, `nbits`, `group_size`, `axis`, `packing`, `method`,
//! `compute_dtype`, …) in the sidecar `model.safetensors.index.json.meta.json`,
//! one object a module.
//!
//! sinq quantizes the `[out, in]` weight in groups of G consecutive elements
//! of a row (`axis: 1`, tiling `1D`): the codes form an `[R, G]` matrix,
//! `R = out·in/G`, packed as hqq packs it (`4bit_u8`: rows `k·R/2 ..` in the
//! byte's high nibble for `k = 0`, …; see the `hqq` module). `scale` and
//! `zero` hold one value a group (`[R, 1]`), `scale2` one a column of the
//! weight (`[1, in]`). `Quantizer.dequantize` computes
//! `((W_r − zero) · scale).reshape(shape) · scale2`, `W_r` the codes in the
//! compute dtype, then casts to the compute dtype. The job reads the weight
//! in its own shape: with G dividing `in` and P parts a byte dividing `out`,
//! part `k` of the bytes read as `[out/P, in]` is rows `k·out/P ..` of the
//! weight, the group entry of (row, column) `k·R/P + row·in/G + column/G`,
//! and `scale2` a rank-0 [`LowRank`] smoothing (a factor a column).
//!
//! torch promotes: codes in bf16 less an f16 zero compute in f32, so a bf16
//! (or f32) output of f16 scales is the f32 value rounded once
//! ([`Product::F32`]); in f16 every step rounds to f16
//! ([`Product::OutDtype`]).

use std::path::PathBuf;

use safetensors::Dtype;
use serde_json::Value;

use super::{
    decoded_output, expect_dtype, float_kind, list_or_dash, modules_with, plan_each, require,
    Modules, QuantConfig,
};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule};
use crate::job::{DecodeJob, Dims, Fields, Grid, LowRank, Product, Values, ZeroPoint};
use crate::numerics::OutDtype;
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "sinq",
    producers: "SINQ (sinq 0.2.x; transformers' SinqConfig)",
    bits: &[1, 2, 4],
    modes: &[
        "asymmetric groups along rows (float zero and scale) times a per-column scale2",
        "packings 4bit_u8, 2bit_u8, 1bit_u8; not yet: quantAux int8 scales, NF3/NF4, 2D tiling, 3/5/6/8-bit",
    ],
};

/// The tensors of a `SINQLinear.state_dict()` besides `bias`: consumed.
const PARAMS: &[&str] = &[
    "W_q",
    "meta.scale",
    "meta.zero",
    "meta.scale2",
    "meta.scale.x",
    "meta.scale.s",
    "meta.scale.m",
    "meta.zero.x",
    "meta.zero.s",
    "meta.zero.m",
];

/// A SINQ quantization config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// `method`, `nbits`, `group_size`, `tiling_mode` as config.json says.
    pub settings: String,
    /// Modules left in high precision.
    pub modules_to_not_convert: Vec<String>,
}

#[derive(serde::Deserialize)]
struct Raw {
    nbits: Option<Value>,
    group_size: Option<Value>,
    tiling_mode: Option<String>,
    method: Option<String>,
    modules_to_not_convert: Option<Vec<String>>,
}

impl Config {
    /// Reads config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let raw: Raw = q.read()?;
        let path = q.path.to_path_buf();
        if let Some(t) = raw.tiling_mode.as_deref() {
            if !t.eq_ignore_ascii_case("1D") {
                return Err(Error::new(
                    Rule::Unsupported,
                    &path,
                    format!("tiling_mode {t:?}: SINQ's blocked (2D) scales are not decoded yet (only 1D)"),
                ));
            }
        }
        let f = |v: &Option<Value>| v.as_ref().map_or("?".to_string(), |x| x.to_string());
        Ok(Config {
            settings: format!(
                "method {}, nbits {}, group_size {}, tiling_mode {}",
                raw.method.as_deref().unwrap_or("?"),
                f(&raw.nbits),
                f(&raw.group_size),
                raw.tiling_mode.as_deref().unwrap_or("?"),
            ),
            path,
            modules_to_not_convert: raw.modules_to_not_convert.unwrap_or_default(),
        })
    }

    /// inspect's format line.
    pub fn format_line(&self) -> String {
        "sinq (asymmetric row groups times a column scale: ((W_q − zero) · scale) · scale2)".into()
    }

    /// `inspect`'s lines: the settings and the modules left dense.
    pub fn report_lines(&self) -> Vec<String> {
        vec![
            format!("settings {}", self.settings),
            format!(
                "modules_to_not_convert {}",
                list_or_dash(&self.modules_to_not_convert)
            ),
        ]
    }
}

/// The decoded modules: every module with a `W_q`. The rotary embedding's
/// `inv_freq` buffers sinq's writer saves (transformers recomputes them and
/// has no such weight) are consumed.
pub fn plan<'c>(_cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let modules = modules_with(ckpt, "W_q");
    let build = |m: &str, _: &mut Vec<_>| plan_module(ckpt, m, dtype);
    let mut found = plan_each(ckpt, modules, PARAMS, |_| None, build);
    for name in ckpt.names() {
        if name.ends_with("rotary_emb.inv_freq") || name.ends_with("rotary_emb.original_inv_freq") {
            found.consumed.insert(name.to_string());
        }
    }
    found
}

/// The module's object in the sidecar's `meta`.
fn sidecar_meta<'c>(ckpt: &'c Checkpoint, module: &str) -> Result<(&'c PathBuf, &'c Value)> {
    let Some(file) = &ckpt.sinq_meta else {
        return Err(Error::tensor(
            Rule::Config,
            ckpt.display_path(),
            format!("{module}.W_q"),
            format!(
                "no {}: SINQ keeps each module's shape, nbits and packing there",
                crate::checkpoint::SINQ_META
            ),
        ));
    };
    match file.value.get(module).and_then(|m| m.get("meta")) {
        Some(m) if m.is_object() => Ok((&file.path, m)),
        _ => Err(Error::tensor(
            Rule::Config,
            &file.path,
            module,
            "no meta object for this quantized module",
        )),
    }
}

/// The packings decoded: bits a field.
fn packing(name: &str) -> Option<u32> {
    match name {
        "4bit_u8" => Some(4),
        "2bit_u8" => Some(2),
        "1bit_u8" => Some(1),
        _ => None,
    }
}

/// The dtype torch computes `(W_r − zero) · scale · scale2` in: the output
/// (compute) dtype promoted with the stored meta's.
fn product(out: OutDtype, stored: Dtype) -> Product {
    match (out, stored) {
        (OutDtype::Bf16, Dtype::BF16) | (OutDtype::F16, Dtype::F16) => Product::OutDtype,
        _ => Product::F32,
    }
}

fn plan_module<'c>(ckpt: &'c Checkpoint, module: &str, out: OutDtype) -> Result<Output<'c>> {
    let w = require(ckpt, module, "W_q")?;
    let (side, meta) = sidecar_meta(ckpt, module)?;
    let bad = |rule: Rule, detail: String| Error::tensor(rule, side, module, detail);
    let text = |k: &str| meta.get(k).and_then(Value::as_str);
    let method = text("method").unwrap_or("").to_ascii_lowercase();
    let quant_aux = ["scale.x", "zero.x"]
        .iter()
        .any(|p| ckpt.get(&format!("{module}.meta.{p}")).is_some());
    if method.contains("quantaux") || quant_aux {
        return Err(bad(
            Rule::Unsupported,
            format!("method {method:?}: 8-bit quantized scales and zeros (quantAux; transformers' method \"sinq\") are not decoded yet"),
        ));
    }
    if method.contains("nf4") || method.contains("nf3") {
        return Err(bad(
            Rule::Unsupported,
            format!("method {method:?}: NF3/NF4 codebooks are not decoded yet"),
        ));
    }
    if meta.get("view_as_float").and_then(Value::as_bool) == Some(true) {
        return Err(bad(
            Rule::Unsupported,
            "view_as_float true (codes stored as floats) is not decoded yet".into(),
        ));
    }
    match meta.get("axis").and_then(Value::as_i64) {
        Some(1) | None => {}
        Some(a) => return Err(bad(Rule::Config, format!("axis {a}: sinq groups along axis 1 only"))),
    }
    let name = match meta.get("packing") {
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Null) | None => {
            return Err(bad(
                Rule::Unsupported,
                "no packing (codes stored unpacked) is not decoded".into(),
            ))
        }
        Some(v) => return Err(bad(Rule::Config, format!("packing {v}: expected a string"))),
    };
    let bits = match packing(name) {
        Some(b) => b,
        None if matches!(name, "8bit_u8" | "3bit_32" | "5bit_32" | "6bit_32") => {
            return Err(bad(
                Rule::Unsupported,
                format!("packing {name} is not decoded yet (4bit_u8, 2bit_u8, 1bit_u8 are)"),
            ))
        }
        None => {
            return Err(bad(
                Rule::Config,
                format!("packing {name:?}: sinq writes 8bit_u8, 6bit_32, 5bit_32, 4bit_u8, 3bit_32, 2bit_u8 or 1bit_u8"),
            ))
        }
    };
    let shape: Vec<u64> = meta
        .get("shape")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let (rows, cols) = match *shape.as_slice() {
        [o, i] if o > 0 && i > 0 => (o, i),
        _ => {
            return Err(bad(
                Rule::Config,
                format!("shape {:?}: expected [out, in], both positive", meta.get("shape")),
            ))
        }
    };
    let numel = rows
        .checked_mul(cols)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| bad(Rule::Config, format!("shape {shape:?} is too large")))?;
    let (rows, cols) = (rows as usize, cols as usize);
    let scale_t = require(ckpt, module, "meta.scale")?;
    if scale_t.shape.len() == 3 {
        return Err(scale_t.error(
            Rule::Unsupported,
            "a 3-D scale (SINQ's blocked 2D tiling) is not decoded yet",
        ));
    }
    let kind = float_kind(&scale_t)?;
    // W_q: [R/P, G] bytes.
    expect_dtype(&w, &[Dtype::U8])?;
    let per_byte = (8 / bits) as usize;
    let group = match *w.shape {
        [_, g] if g > 0 => g,
        _ => 0,
    };
    let fits = group > 0
        && cols.is_multiple_of(group)
        && rows.is_multiple_of(per_byte)
        && w.shape[0].checked_mul(group).and_then(|n| n.checked_mul(per_byte)) == Some(numel);
    if !fits || w.len() != numel / per_byte {
        return Err(w.error(
            Rule::TensorShape,
            format!(
                "shape {:?} does not hold a {rows}x{cols} weight {name} in groups of whole rows' parts (a group dividing {cols}, {per_byte} codes a byte, {per_byte} dividing {rows})",
                w.shape
            ),
        ));
    }
    if let Some(g) = meta.get("group_size").and_then(Value::as_u64) {
        if g as usize != group {
            return Err(bad(
                Rule::Config,
                format!("group_size {g}, but W_q holds groups of {group}"),
            ));
        }
    }
    let r = numel / group;
    let step = r / per_byte;
    let entries = |t: &TensorRef<'c>, want: [usize; 2], what: &str| -> Result<()> {
        if t.dtype != scale_t.dtype {
            return Err(t.error(
                Rule::TensorDtype,
                format!("dtype {}, but meta.scale is {}", t.dtype, scale_t.dtype),
            ));
        }
        if t.shape != want {
            return Err(t.error(
                Rule::TensorShape,
                format!("shape {:?}; {what} make it {want:?}", t.shape),
            ));
        }
        Ok(())
    };
    entries(&scale_t, [r, 1], &format!("groups of {group}"))?;
    let zero_t = require(ckpt, module, "meta.zero")?;
    entries(&zero_t, [r, 1], &format!("groups of {group}"))?;
    let scale2 = match ckpt.get(&format!("{module}.meta.scale2")) {
        None => None,
        Some(t) => {
            entries(&t, [1, cols], "a factor a column of the weight")?;
            Some(t.floats()?)
        }
    };
    let dims = Dims {
        slices: per_byte,
        rows: rows / per_byte,
        cols,
    };
    // Part k of each byte is slice k; the bytes of a slice read as
    // [out/P, in], a field a byte apart.
    let lane = cols as u64 * 8;
    let codes = Fields::new(w, bits, 1, lane)
        .with_word_bits(8)
        .with_slice_bits(bits as u64)
        .high_first();
    super::check_extent(&w, &codes, per_byte, rows / per_byte, cols)?;
    let grid = Grid {
        row_div: 1,
        col_div: group,
        row_stride: cols / group,
        slice_stride: step,
    };
    let scale = Values {
        data: scale_t.into(),
        kind: kind.clone(),
        grid,
    };
    let zero = Values {
        data: zero_t.into(),
        kind,
        grid,
    };
    let values: Vec<f32> = (0..1u32 << bits).map(|q| q as f32).collect();
    let mut job = DecodeJob::new(dims, codes, values, out)
        .with_scale(scale)
        .with_zero(ZeroPoint::Plain(zero))
        .with_product(product(out, scale_t.dtype));
    if let Some(s2) = scale2 {
        job = job.with_low_rank(LowRank {
            rank: 0,
            up: Vec::new().into(),
            down: Vec::new().into(),
            inv_smooth: s2.into(),
            smooth_first: true,
            in_product: true,
        });
    }
    let scheme = format!("sinq {method} {name}, group {group}");
    Ok(decoded_output(module, w.shard, vec![rows, cols], job, scheme))
}

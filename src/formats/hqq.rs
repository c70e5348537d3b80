//! HQQ (`quant_method: "hqq"`): checkpoints transformers' HQQ integration
//! (`HqqConfig`, hqq 0.2.x) saved with `save_pretrained`, as on the Hub.
//!
//! Each quantized Linear is stored as its `HQQLinear.state_dict()`: `W_q`
//! (the packed codes), `scale` and `zero` (one per group, in the compute
//! dtype) and its meta encoded as tensors (`encode_safetensor_type`):
//! `shape` (int64 `[out, in]`), `nbits`, `group_size`, `axis` (int32
//! scalars), `packing` and `unpack_view_dtype` (strings as uint8 code
//! points), `view_as_float`, `channel_wise`, `quant_scale`, `quant_zero`,
//! … (uint8 booleans).
//!
//! `Quantizer.quantize` reshapes the weight's elements, in row-major order,
//! to `[numel/G, G]` (`axis: 1`: a group is G consecutive elements) or
//! `[G, numel/G]` (`axis: 0`: a group is a column, elements `numel/G`
//! apart); `scale` and `zero` hold one value a group (`[R, 1]` resp.
//! `[1, C]`). The packings split that matrix's R rows in P parts of
//! `R/P` rows and put part `k` in bits `8 − (k+1)·w .. 8 − k·w` of each
//! byte (`4bit_u8`: the first half in the high nibble; `2bit_u8` four
//! parts, `1bit_u8` eight, `8bit_u8` the byte itself). `view_as_float`
//! stores the same bytes as a float tensor. The job reads part `k` as
//! slice `k` of `R/P` lanes, a field a byte apart, high bits first.
//!
//! `3bit_32` pads the R rows with zeros to a multiple of ten, splits them
//! in ten parts of `S = ⌈R/10⌉` rows and puts part `k` in bits
//! `27 − 3k .. 30 − 3k` of an int32 (bits 30 and 31 unused): `W_q` is
//! `[S, C]` int32, and `dequantize` crops the unpacked `[10·S, C]` to its
//! first R rows. The job reads the R rows in place as lanes in parts of S
//! ([`Parts`]), a field a word apart: the last part holding rows may be
//! partial, the parts after it (all padding) are never read.
//!
//! `Quantizer.dequantize` computes `(W_r − zero) · scale` in the layer's
//! compute dtype, which transformers' loader sets to the dtype the model is
//! loaded in (`HQQLinear(..., compute_dtype=torch_dtype)` casts `scale` and
//! `zero` to it): the job computes in the output dtype
//! ([`Product::OutDtype`]), the zero point rounded to it on the host, so
//! each output is what hqq gives when the model is loaded in that dtype.

use std::collections::BTreeSet;
use std::path::PathBuf;

use safetensors::Dtype;
use serde_json::Value;

use super::{
    decoded_output, expect_dtype, float_kind, list_or_dash, modules_with, plan_each,
    require, Modules, QuantConfig,
};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule};
use crate::job::{
    Bytes, DecodeJob, Dims, Fields, Grid, Parts, Product, ValueKind, Values, ZeroPoint,
};
use crate::numerics::OutDtype;
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "hqq",
    producers: "HQQ (hqq 0.2.x; transformers' HqqConfig)",
    bits: &[1, 2, 3, 4, 5, 6, 8],
    modes: &[
        "asymmetric groups along axis 1 or 0 (float zero and scale)",
        "packings 8bit_u8, 4bit_u8, 3bit_32, 2bit_u8, 1bit_u8 (view_as_float too)",
    ],
};

/// The tensors of an `HQQLinear.state_dict()` besides `bias`: consumed
/// (none belongs in a dense checkpoint).
const PARAMS: &[&str] = &[
    "W_q",
    "scale",
    "zero",
    "shape",
    "nbits",
    "group_size",
    "axis",
    "packing",
    "unpack_view_dtype",
    "view_as_float",
    "quant_scale",
    "quant_zero",
    "compute_dtype",
    "offload_meta",
    "encoded_state_dict",
    "stores_quant_config",
    "channel_wise",
    "optimize",
    "round_zero",
    "zero_scale",
];

/// An HQQ quantization config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// What `quant_config` says, a line per layer tag (or one for all).
    pub layers: Vec<String>,
    /// Linear layers left in high precision (`skip_modules`: layer tags).
    pub skip_modules: Vec<String>,
}

#[derive(serde::Deserialize)]
struct Raw {
    quant_config: Option<Value>,
    skip_modules: Option<Vec<String>>,
}

impl Config {
    /// Reads config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let raw: Raw = q.read()?;
        let path = q.path.to_path_buf();
        let describe = |v: &Value| -> Result<String> {
            let quantized = |k: &str| v.get(k).is_some_and(|p| !p.is_null());
            if quantized("scale_quant_params") || quantized("zero_quant_params") {
                return Err(Error::new(
                    Rule::Unsupported,
                    &path,
                    "scale_quant_params/zero_quant_params: quantized scales and zero points are not decoded (hqq 0.2 neither saves nor loads them)",
                ));
            }
            let w = v.get("weight_quant_params").unwrap_or(v);
            let f = |k: &str| w.get(k).map_or("?".to_string(), |x| x.to_string());
            Ok(format!(
                "nbits {}, group_size {}, axis {}",
                f("nbits"),
                f("group_size"),
                f("axis")
            ))
        };
        let layers = match &raw.quant_config {
            None => Vec::new(),
            Some(v) if v.get("weight_quant_params").is_some() => {
                vec![format!("all: {}", describe(v)?)]
            }
            Some(Value::Object(tags)) => tags
                .iter()
                .map(|(tag, v)| Ok(format!("{tag}: {}", describe(v)?)))
                .collect::<Result<_>>()?,
            Some(_) => {
                return Err(Error::new(
                    Rule::Config,
                    &path,
                    "quant_config: expected an object (hqq's BaseQuantizeConfig, or one per layer tag)",
                ))
            }
        };
        Ok(Config {
            path,
            layers,
            skip_modules: raw.skip_modules.unwrap_or_default(),
        })
    }

    /// inspect's format line.
    pub fn format_line(&self) -> String {
        "hqq (asymmetric groups, (W_q − zero) · scale in the compute dtype)".into()
    }

    /// `inspect`'s lines: the layers' settings and the skipped ones.
    pub fn report_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.layers.iter().map(|l| format!("layers {l}")).collect();
        lines.push(format!("skip_modules {}", list_or_dash(&self.skip_modules)));
        lines
    }
}

/// The decoded modules: every module with a `W_q`.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let modules: BTreeSet<&str> = modules_with(ckpt, "W_q").into_iter().collect();
    let skipped = |m: &str| {
        let tag = linear_tag(m);
        cfg.skip_modules.contains(&tag)
            .then_some("listed in skip_modules but stored quantized; decoded anyway")
    };
    let build = |m: &str, _: &mut Vec<_>| plan_module(ckpt, m, dtype);
    plan_each(ckpt, modules, PARAMS, skipped, build)
}

/// transformers' `name_to_linear_tag`: `model.layers.0.self_attn.q_proj`
/// is `self_attn.q_proj`.
fn linear_tag(module: &str) -> String {
    module
        .split('.')
        .filter(|n| !matches!(*n, "model" | "layers") && n.parse::<u64>().is_err())
        .collect::<Vec<_>>()
        .join(".")
}

/// A scalar integer meta tensor (`nbits`, `group_size`, `axis`).
fn meta_int<'c>(ckpt: &'c Checkpoint, module: &str, param: &str) -> Result<(TensorRef<'c>, i64)> {
    let t = require(ckpt, module, param)?;
    expect_dtype(&t, &[Dtype::I32, Dtype::I64, Dtype::U8])?;
    match t.ints()?.as_slice() {
        [v] if t.shape.len() <= 1 => Ok((t, *v)),
        _ => Err(t.error(
            Rule::TensorShape,
            format!("shape {:?}; one integer is expected", t.shape),
        )),
    }
}

/// A boolean meta tensor; `false` when absent.
fn meta_flag(ckpt: &Checkpoint, module: &str, param: &str) -> Result<bool> {
    match ckpt.get(&format!("{module}.{param}")) {
        None => Ok(false),
        Some(t) => {
            expect_dtype(&t, &[Dtype::U8, Dtype::BOOL, Dtype::I32, Dtype::I64])?;
            match t.ints()?.as_slice() {
                [v] => Ok(*v != 0),
                // BOOL reads as no integers: its one byte.
                [] if t.dtype == Dtype::BOOL && t.elements() == 1 => {
                    Ok(t.data()?.first().is_some_and(|&b| b != 0))
                }
                _ => Err(t.error(
                    Rule::TensorShape,
                    format!("shape {:?}; one flag is expected", t.shape),
                )),
            }
        }
    }
}

/// A string meta tensor (uint8 code points).
fn meta_str(t: &TensorRef<'_>) -> Result<String> {
    expect_dtype(t, &[Dtype::U8])?;
    if t.shape.len() != 1 {
        return Err(t.error(
            Rule::TensorShape,
            format!("shape {:?}; a string is a 1-D uint8 tensor", t.shape),
        ));
    }
    Ok(t.data()?.iter().map(|&b| b as char).collect())
}

/// The packings hqq 0.2 writes: bits a field and bytes a word (whose
/// fields hold that many parts of the rows).
fn packing(name: &str) -> Option<(u32, usize)> {
    match name {
        "8bit_u8" => Some((8, 1)),
        "4bit_u8" => Some((4, 1)),
        "3bit_32" => Some((3, 4)),
        "2bit_u8" => Some((2, 1)),
        "1bit_u8" => Some((1, 1)),
        _ => None,
    }
}

/// The R rows of a `[R, C]` grouped matrix as hqq's int32 packings (and
/// sinq's, which adds `5bit_32` and `6bit_32`) store them: padded with
/// zeros to a multiple of P, split in P parts of `S = ⌈R/P⌉` rows, part `k`
/// in bits `(P − 1 − k)·b ..` of each int32 of the `[S, C]` words (`3bit_32`:
/// P 10, b 3; `5bit_32`: 6, 5; `6bit_32`: 5, 6). Read in place as lanes in
/// parts of S ([`Parts`]), a field a word apart; the parts after the last
/// that holds rows (all padding) are never read.
pub(super) fn rows_in_words<'c>(
    w: TensorRef<'c>,
    bits: u32,
    parts: usize,
    r: usize,
    c: usize,
) -> (Dims, Fields<'c>) {
    let parts = Parts {
        lanes: r.div_ceil(parts),
        top: (parts as u64 - 1) * bits as u64,
        down: bits as u64,
    };
    let dims = Dims {
        slices: 1,
        rows: r,
        cols: c,
    };
    (dims, Fields::new(w, bits, 1, c as u64 * 32).with_parts(parts))
}

fn plan_module<'c>(ckpt: &'c Checkpoint, module: &str, out: OutDtype) -> Result<Output<'c>> {
    let w = require(ckpt, module, "W_q")?;
    for flag in ["quant_scale", "quant_zero"] {
        if meta_flag(ckpt, module, flag)? {
            let t = require(ckpt, module, flag)?;
            return Err(t.error(
                Rule::Unsupported,
                format!("{flag} true: quantized scales and zero points are not decoded (hqq 0.2 neither saves nor loads them)"),
            ));
        }
    }
    if ckpt.get(&format!("{module}.zero_scale")).is_some() {
        let t = require(ckpt, module, "zero_scale")?;
        return Err(t.error(
            Rule::Unsupported,
            "zero and scale stored together (zero_scale, hqq before 0.2) are not decoded",
        ));
    }
    if let Some(t) = ckpt.get(&format!("{module}.channel_wise")) {
        if !meta_flag(ckpt, module, "channel_wise")? {
            return Err(t.error(
                Rule::Unsupported,
                "channel_wise false (one scale for the whole weight) is not decoded",
            ));
        }
    }
    let packing_t = require(ckpt, module, "packing")?;
    let name = meta_str(&packing_t)?;
    let (bits, word_bytes) = match packing(&name) {
        Some(b) => b,
        None => {
            return Err(packing_t.error(
                Rule::TensorValue,
                format!("packing {name:?}: hqq writes 8bit_u8, 4bit_u8, 3bit_32, 2bit_u8 or 1bit_u8"),
            ))
        }
    };
    let (shape_t, shape) = {
        let t = require(ckpt, module, "shape")?;
        expect_dtype(&t, &[Dtype::I64, Dtype::I32])?;
        let v = t.ints()?;
        (t, v)
    };
    let (rows, cols) = match shape.as_slice() {
        &[o, i] if o > 0 && i > 0 => (o as u64, i as u64),
        _ => {
            return Err(shape_t.error(
                Rule::TensorValue,
                format!("shape {shape:?}: expected [out, in] with both positive"),
            ))
        }
    };
    let numel = rows
        .checked_mul(cols)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| shape_t.error(Rule::TensorValue, format!("shape {shape:?} is too large")))?;
    let (group_t, group) = meta_int(ckpt, module, "group_size")?;
    let group = usize::try_from(group).ok().filter(|&g| g > 0 && numel.is_multiple_of(g));
    let Some(group) = group else {
        return Err(group_t.error(
            Rule::TensorValue,
            format!("group_size does not divide the weight's {numel} elements"),
        ));
    };
    let (axis_t, axis) = meta_int(ckpt, module, "axis")?;
    // The quantized matrix: R rows of C, one group a row (axis 1) or a
    // column (axis 0).
    let (r, c) = match axis {
        1 => (numel / group, group),
        0 => (group, numel / group),
        a => {
            return Err(axis_t.error(
                Rule::TensorValue,
                format!("axis {a}: hqq groups along axis 0 or 1"),
            ))
        }
    };
    // Parts of the rows a word holds.
    let per_word = (8 * word_bytes as u32 / bits) as usize;
    let three = word_bytes == 4;
    if !three && !r.is_multiple_of(per_word) {
        return Err(group_t.error(
            Rule::TensorValue,
            format!("{name} packs {per_word} rows a byte; the {r} rows of the {r}x{c} grouped weight are not a multiple of it"),
        ));
    }
    // 3bit_32 pads the rows to a multiple of ten.
    let step = r.div_ceil(per_word);
    // W_q: the [step, c] words, or (view_as_float) the same bytes as floats.
    let view_as_float = meta_flag(ckpt, module, "view_as_float")?;
    let allowed: &[Dtype] = match (view_as_float, three) {
        (false, false) => &[Dtype::U8],
        (false, true) => &[Dtype::I32],
        (true, _) => &[Dtype::F16, Dtype::BF16, Dtype::F32],
    };
    expect_dtype(&w, allowed)?;
    let size = w.dtype.bitsize() / 8;
    let row_bytes = c.checked_mul(word_bytes);
    let fits = match *w.shape {
        [a, b] => a == step && b.checked_mul(size) == row_bytes,
        _ => false,
    };
    if !fits || Some(w.len()) != row_bytes.and_then(|b| b.checked_mul(step)) {
        let what = if three { "int32 words" } else { "bytes" };
        return Err(w.error(
            Rule::TensorShape,
            format!(
                "shape {:?} ({}) does not hold the [{step}, {c}] {what} of a {}x{} weight in groups of {group} along axis {axis}, {name}",
                w.shape, w.dtype, rows, cols
            ),
        ));
    }
    let (dims, codes, grid) = match three {
        // The R rows in place, lanes in parts of `step` (part k in bits
        // 27 − 3k ..), a field an int32 apart.
        true => {
            let (dims, codes) = rows_in_words(w, bits, per_word, r, c);
            let grid = match axis {
                // Entry = row of the grouped matrix.
                1 => Grid {
                    row_div: 1,
                    col_div: c,
                    row_stride: 1,
                    slice_stride: 0,
                },
                // Entry = column.
                _ => Grid {
                    row_div: r,
                    col_div: 1,
                    row_stride: 0,
                    slice_stride: 0,
                },
            };
            (dims, codes, grid)
        }
        false => {
            let dims = Dims {
                slices: per_word,
                rows: step,
                cols: c,
            };
            let codes = match bits {
                8 => Fields::dense(w, 8, c as u64 * 8),
                // Part k of a byte is slice k, from the high bits down.
                _ => Fields::new(w, bits, 1, c as u64 * 8)
                    .with_word_bits(8)
                    .with_slice_bits(bits as u64)
                    .high_first(),
            };
            let grid = match axis {
                // Entry = row of the grouped matrix, slice k's rows after k·step.
                1 => Grid {
                    row_div: 1,
                    col_div: c,
                    row_stride: 1,
                    slice_stride: step,
                },
                // Entry = column.
                _ => Grid {
                    row_div: step,
                    col_div: 1,
                    row_stride: 0,
                    slice_stride: 0,
                },
            };
            (dims, codes, grid)
        }
    };
    super::check_extent(&w, &codes, dims.slices, dims.rows, c)?;
    let (groups, want_shape) = match axis {
        1 => (r, [r, 1]),
        _ => (c, [1, c]),
    };
    let entries = |param: &str| -> Result<TensorRef<'c>> {
        let t = require(ckpt, module, param)?;
        float_kind(&t)?;
        if t.shape != want_shape {
            return Err(t.error(
                Rule::TensorShape,
                format!(
                    "shape {:?}; groups of {group} along axis {axis} make it {want_shape:?}",
                    t.shape
                ),
            ));
        }
        Ok(t)
    };
    let scale_t = entries("scale")?;
    let zero_t = entries("zero")?;
    // hqq casts zero to the compute dtype before it subtracts.
    let zeros: Vec<u8> = zero_t
        .floats()?
        .iter()
        .take(groups)
        .flat_map(|&z| out.round(z).to_le_bytes())
        .collect();
    let scale = Values {
        data: scale_t.into(),
        kind: float_kind(&scale_t)?,
        grid,
    };
    let zero = Values {
        data: Bytes::Owned(zeros.into()),
        kind: ValueKind::F32,
        grid,
    };
    let values: Vec<f32> = (0..1u32 << bits).map(|q| q as f32).collect();
    let job = DecodeJob::new(dims, codes, values, out)
        .with_scale(scale)
        .with_zero(ZeroPoint::Plain(zero))
        .with_product(Product::OutDtype);
    let scheme = format!("hqq {name}, group {group}, axis {axis}");
    Ok(decoded_output(
        module,
        w.shard,
        vec![rows as usize, cols as usize],
        job,
        scheme,
    ))
}

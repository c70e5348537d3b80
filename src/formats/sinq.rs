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
//! `8bit_u8` is the byte itself (P = 1).
//!
//! The int32 packings (`3bit_32`, `5bit_32`, `6bit_32`) pad the R rows to
//! a multiple of P = 10, 6, 5 and put part `k` of `⌈R/P⌉` rows in bits
//! `(P − 1 − k)·b ..` of each int32, as hqq's `3bit_32` (the same mapping,
//! [`super::hqq::rows_in_words`]). A part ends inside a weight row unless
//! `⌈R/P⌉·G` is a multiple of `in`, so these jobs read the grouped `[R, G]`
//! matrix in place, a group entry a row, and `scale2`'s factors repeat
//! every `in/G` rows ([`LowRank::period`]).
//!
//! quantAux methods (`sinq_quantAux`: what `sinq_base_quant_config`, and so
//! transformers' `SinqConfig`, makes of `method="sinq"`) store `scale` and
//! `zero` quantized to 8 bits by sinq's `rtn8`: `meta.<p>.x` uint8
//! `[tile, K]` (the `R` values viewed so: tile 32 for the scale, `R` for
//! the zero), `meta.<p>.s` and `.m` `[1, K]`; `dq8` reads them back as
//! `(x · s + m).view(R, 1)` in the dtype of `s` (f16), each step rounded
//! to it: a [`Nested`] scale (and zero point) whose factor and addend are
//! column `i mod K`'s. The rest is the plain method's arithmetic.
//!
//! The blocked 2D tiling (`tiling_mode: "2D"`; sinq's dequantize takes it
//! where the scale is 3-D) quantizes square tiles of G: the codes are the
//! same row-major `[R, G]` matrix, `scale` and `zero` `[tiles, G, 1]` (tile
//! `(a, c)`'s row `b` at `(a·in/G + c)·G + b`) and `scale2` `[tiles, 1, G]`,
//! a factor a column of each row of tiles. The job reads the byte packings
//! as in 1D: the scale and zero put in the weight's row-major group order
//! on the host (as f32 values, quantAux's computed as `dq8` does), and
//! `scale2` as `[out/G, in]` factors, a row of them each G rows
//! ([`LowRank::row_div`]). With an int32 packing it is refused.
//!
//! NF4 methods index sinq's `NF4_CODEBOOK` with the 4-bit codes, NF3
//! methods its `NF3_CODEBOOK` with the 3-bit ones (a method naming both is
//! NF3, as sinq decides): the codebook cast to the scales' dtype, the value
//! computed in it and returned so ([`Product::F16`]), whatever the compute
//! dtype.
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
use crate::job::{
    Bytes, DecodeJob, Dims, Fields, Grid, LowRank, Nested, Product, ValueKind, Values, ZeroPoint,
};
use crate::numerics::OutDtype;
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "sinq",
    producers: "SINQ (sinq 0.2.x; transformers' SinqConfig)",
    bits: &[1, 2, 3, 4, 5, 6, 8],
    modes: &[
        "asymmetric groups along rows (float zero and scale) times a per-column scale2",
        "scales and zeros as floats or 8-bit quantized (quantAux: transformers' method \"sinq\")",
        "NF4 and NF3 codebooks (sinq_nf4, sinq_nf3, and quantAux), computed in the scales' f16",
        "packings 8bit_u8, 4bit_u8, 2bit_u8, 1bit_u8 and the int32 6bit_32, 5bit_32, 3bit_32",
        "tiling 1D, and 2D (square tiles, 3-D scales) with the byte packings",
        "not yet: 2D tiling with the int32 packings, view_as_float, unpacked codes",
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
            if !t.eq_ignore_ascii_case("1D") && !t.eq_ignore_ascii_case("2D") {
                return Err(Error::new(
                    Rule::Config,
                    &path,
                    format!("tiling_mode {t:?}: sinq tiles 1D or 2D"),
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

/// The packings sinq writes (`Quantizer.bit_to_packing`): bits a field.
fn packing(name: &str) -> Option<u32> {
    match name {
        "8bit_u8" => Some(8),
        "6bit_32" => Some(6),
        "5bit_32" => Some(5),
        "4bit_u8" => Some(4),
        "3bit_32" => Some(3),
        "2bit_u8" => Some(2),
        "1bit_u8" => Some(1),
        _ => None,
    }
}

/// How a packing stores the `[R, G]` codes.
#[derive(Clone, Copy)]
enum Pack {
    /// uint8 `[R/P, G]`, P parts of the rows a byte (`8bit_u8` one).
    Bytes(usize),
    /// int32 `[⌈R/P⌉, G]`, the rows padded to P parts (`3bit_32`: 10,
    /// `5bit_32`: 6, `6bit_32`: 5): hqq's int32 packs
    /// ([`super::hqq::rows_in_words`]).
    Words(usize),
}

impl Pack {
    /// The packing of `bits`-bit codes (one of [`packing`]'s).
    fn of(bits: u32) -> Pack {
        match bits {
            3 | 5 | 6 => Pack::Words((32 / bits) as usize),
            b => Pack::Bytes((8 / b) as usize),
        }
    }

    fn dtype(self) -> Dtype {
        match self {
            Pack::Bytes(_) => Dtype::U8,
            Pack::Words(_) => Dtype::I32,
        }
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
    // sinq's dequantize takes NF3 where the method names it, else NF4
    // where it names that.
    let codebook: Option<(&[f32], &str, u32)> = if method.contains("nf3") {
        Some((&NF3, "NF3", 3))
    } else if method.contains("nf4") {
        Some((&NF4, "NF4", 4))
    } else {
        None
    };
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
    // quantAux (`method` naming it): `scale` and `zero` stored as
    // `{x, s, m}`; else (and where a quantAux method left a plain tensor,
    // which sinq's `dq8` passes through) as tensors.
    let aux = method.contains("quantaux");
    let stored = |p: &str| -> Result<Stored<'c>> {
        let x = ckpt.get(&format!("{module}.meta.{p}.x"));
        let plain = ckpt.get(&format!("{module}.meta.{p}"));
        match (x, plain) {
            (Some(x), None) if aux => Ok(Stored::Aux(x)),
            (Some(x), _) => Err(x.error(
                Rule::Config,
                match aux {
                    true => format!("beside meta.{p}: one of the two, not both"),
                    false => format!(
                        "8-bit quantized meta.{p} (quantAux), but method {method:?} does not name quantAux: sinq would not read it"
                    ),
                },
            )),
            (None, Some(t)) => Ok(Stored::Plain(t)),
            (None, None) => Err(Error::tensor(
                Rule::MissingTensor,
                ckpt.display_path(),
                format!("{module}.meta.{p}"),
                match aux {
                    true => format!("missing: quantAux stores meta.{p}.x, .s and .m"),
                    false => "missing".into(),
                },
            )),
        }
    };
    let scale_s = stored("scale")?;
    let zero_s = stored("zero")?;
    // sinq's dequantize takes the blocked (2D) path where the scale is
    // 3-D: a plain tensor's own shape, quantAux's `scale.shape`.
    let tiled = match &scale_s {
        Stored::Plain(t) => t.shape.len() == 3,
        Stored::Aux(_) => matches!(meta.get("scale.shape"), Some(Value::Array(a)) if a.len() == 3),
    };
    // W_q: [R/P, G] bytes, or the [⌈R/P⌉, G] int32 words.
    let pack = Pack::of(bits);
    expect_dtype(&w, &[pack.dtype()])?;
    let group = match *w.shape {
        [_, g] if g > 0 => g,
        _ => 0,
    };
    let r = match group {
        0 => 0,
        g => numel / g,
    };
    let word = pack.dtype().bitsize() / 8;
    let fits = match pack {
        Pack::Bytes(p) => {
            group > 0
                && cols.is_multiple_of(group)
                && rows.is_multiple_of(p)
                && w.shape[0].checked_mul(group).and_then(|n| n.checked_mul(p)) == Some(numel)
        }
        Pack::Words(p) => {
            group > 0
                && cols.is_multiple_of(group)
                && r.checked_mul(group) == Some(numel)
                && w.shape[0] == r.div_ceil(p)
        }
    };
    let want_len = w.shape.iter().try_fold(word, |a, &d| a.checked_mul(d));
    if !fits || Some(w.len()) != want_len {
        let what = match pack {
            Pack::Bytes(p) => format!("{p} codes a byte, {p} dividing {rows}"),
            Pack::Words(p) => format!("{p} codes an int32: [⌈{r}/{p}⌉, {group}] int32"),
        };
        return Err(w.error(
            Rule::TensorShape,
            format!(
                "shape {:?} does not hold a {rows}x{cols} weight {name} in groups of whole rows' parts (a group dividing {cols}, {what})",
                w.shape
            ),
        ));
    }
    // 2D: square tiles of G, each of G rows' scale and zero (`[tiles, G,
    // 1]`, tile-major) and G columns' scale2 (`[tiles, 1, G]`).
    let tiles = match tiled {
        false => None,
        true if matches!(pack, Pack::Words(_)) => {
            return Err(bad(
                Rule::Unsupported,
                format!("2D tiling (3-D scales) with packing {name}: its scale2 over the grouped rows is not decoded yet (the byte packings are)"),
            ))
        }
        true if rows.is_multiple_of(group) && cols.is_multiple_of(group) => {
            Some((rows / group, cols / group))
        }
        true => {
            return Err(bad(
                Rule::Config,
                format!("2D tiling (3-D scales) in tiles of {group}, which do not divide the {rows}x{cols} weight"),
            ))
        }
    };
    if let Some(g) = meta.get("group_size").and_then(Value::as_u64).filter(|_| !tiled) {
        // sinq halves a tile that does not divide the row (down to 16) and
        // keeps the group_size asked for.
        let mut tile = g;
        while tile >= 16 && !(cols as u64).is_multiple_of(tile) {
            tile /= 2;
        }
        if tile != group as u64 {
            return Err(bad(
                Rule::Config,
                format!("group_size {g} (tiles of {tile} along rows of {cols}), but W_q holds groups of {group}"),
            ));
        }
    }
    // dq8 views x·s + m as the sidecar's `<p>.shape`: [R, 1] as sinq's
    // dequantize reads it (2D: [tiles, G, 1]).
    let want: Vec<usize> = match tiles {
        None => vec![r, 1],
        Some((th, tw)) => vec![th * tw, group, 1],
    };
    for p in ["scale", "zero"] {
        if let Some(v) = meta.get(format!("{p}.shape")) {
            let dims: Option<Vec<usize>> = v
                .as_array()
                .map(|a| a.iter().filter_map(|d| d.as_u64().map(|d| d as usize)).collect());
            if dims.as_deref() != Some(&want[..]) {
                return Err(bad(
                    Rule::Config,
                    format!("{p}.shape {v}: groups of {group} make it {want:?}"),
                ));
            }
        }
    }
    let groups = match tiles {
        None => format!("groups of {group}"),
        Some(_) => format!("2D tiles of {group}"),
    };
    let scale = entries(ckpt, scale_s, &want, &groups)?;
    let zero = entries(ckpt, zero_s, &want, &groups)?;
    if zero.dtype != scale.dtype {
        return Err(zero.tensor.error(
            Rule::TensorDtype,
            format!("dtype {}, but the scale is {}", zero.dtype, scale.dtype),
        ));
    }
    // 2D: the entries from tile-major (tile, row in tile) to the weight's
    // row-major (row, tile column), as 1D groups of G would hold them.
    let (scale, zero) = match tiles {
        None => (scale, zero),
        Some((_, tw)) => (scale.tile_rows(tw, group)?, zero.tile_rows(tw, group)?),
    };
    // 1D: a factor a column; 2D: one a column of each row of tiles.
    let want2 = match tiles {
        None => vec![1, cols],
        Some((th, tw)) => vec![th * tw, 1, group],
    };
    let scale2 = match ckpt.get(&format!("{module}.meta.scale2")) {
        None => None,
        Some(t) => {
            expect_dtype(&t, &[scale.dtype])?;
            if t.shape != want2 {
                return Err(t.error(
                    Rule::TensorShape,
                    format!("shape {:?}; a factor a column of the weight{} make it {want2:?}", t.shape, match tiles {
                        None => "",
                        Some(_) => " in each row of tiles",
                    }),
                ));
            }
            Some(t.floats()?)
        }
    };
    let (dims, codes, grid, period) = match pack {
        Pack::Bytes(per_byte) => {
            // The weight in its own shape: part k of each byte is slice k,
            // the bytes of a slice read as [out/P, in], a field a byte
            // apart.
            let dims = Dims {
                slices: per_byte,
                rows: rows / per_byte,
                cols,
            };
            let lane = cols as u64 * 8;
            let codes = match bits {
                8 => Fields::dense(w, 8, lane),
                _ => Fields::new(w, bits, 1, lane)
                    .with_word_bits(8)
                    .with_slice_bits(bits as u64)
                    .high_first(),
            };
            let grid = Grid {
                row_div: 1,
                col_div: group,
                row_stride: cols / group,
                slice_stride: r / per_byte,
            };
            // 2D: scale2 [rows/G, in] (tile-major [tiles, 1, G] is that
            // order), the weight row's row of tiles its row.
            let period = match tiles {
                None => (1, 1),
                Some((th, _)) => (th, group),
            };
            (dims, codes, grid, period)
        }
        Pack::Words(parts) => {
            // The grouped [R, G] rows as hqq's int32 packs hold them, a
            // group entry a row, scale2's factors repeating every in/G
            // rows.
            let (dims, codes) = super::hqq::rows_in_words(w, bits, parts, r, group);
            let grid = Grid {
                row_div: 1,
                col_div: group,
                row_stride: 1,
                slice_stride: 0,
            };
            (dims, codes, grid, (cols / group, 1))
        }
    };
    super::check_extent(&w, &codes, dims.slices, dims.rows, dims.cols)?;
    // NF3 and NF4: each code's codebook value in the scales' dtype, the
    // whole value computed in it and returned so (not cast to the compute
    // dtype).
    let (values, product): (Vec<f32>, Product) = match codebook {
        Some((cb, what, nbits)) => {
            if bits != nbits {
                return Err(bad(
                    Rule::Config,
                    format!("method {method:?} with packing {name}: {what} codes are {nbits}-bit"),
                ));
            }
            let d = dtype_of(scale.dtype);
            let product = match d {
                OutDtype::F16 => Product::F16,
                OutDtype::Bf16 => Product::Bf16,
                OutDtype::F32 => Product::F32,
            };
            (cb.iter().map(|&v| d.round(v)).collect(), product)
        }
        None => (
            (0..1u32 << bits).map(|q| q as f32).collect(),
            product(out, scale.dtype),
        ),
    };
    let scale = Values {
        data: scale.data,
        kind: scale.kind,
        grid,
    };
    let zero = Values {
        data: zero.data,
        kind: zero.kind,
        grid,
    };
    let mut job = DecodeJob::new(dims, codes, values, out)
        .with_scale(scale)
        .with_zero(ZeroPoint::Plain(zero))
        .with_product(product);
    if let Some(s2) = scale2 {
        job = job.with_low_rank(LowRank {
            period: period.0,
            row_div: period.1,
            rank: 0,
            up: Vec::new().into(),
            down: Vec::new().into(),
            inv_smooth: s2.into(),
            smooth_first: true,
            in_product: true,
        });
    }
    let scheme = match tiles {
        None => format!("sinq {method} {name}, group {group}"),
        Some(_) => format!("sinq {method} {name}, 2D tiles of {group}"),
    };
    Ok(decoded_output(module, w.shard, vec![rows, cols], job, scheme))
}

/// sinq's `NF4_CODEBOOK` (f32; cast to the scales' dtype before use): the
/// same f32 values as bitsandbytes' NF4 table.
const NF4: [f32; 16] = super::bnb::NF4;

/// sinq's `NF3_CODEBOOK` (f32, quantizer.py; cast to the scales' dtype
/// before use).
#[allow(clippy::excessive_precision)]
const NF3: [f32; 8] = [
    -1.0,
    -0.5350227355957031,
    -0.2469314038753510,
    0.0,
    0.1833375245332718,
    0.3819939494132996,
    0.6229856610298157,
    1.0,
];

/// The arithmetic of a float dtype (one of BF16, F16, F32: checked).
fn dtype_of(d: Dtype) -> OutDtype {
    match d {
        Dtype::BF16 => OutDtype::Bf16,
        Dtype::F16 => OutDtype::F16,
        _ => OutDtype::F32,
    }
}

/// How a module stores its `scale` or `zero`.
enum Stored<'c> {
    /// A float tensor, one value a group.
    Plain(TensorRef<'c>),
    /// quantAux's `x` (the `.s` and `.m` beside it).
    Aux(TensorRef<'c>),
}

/// A scale's or zero's entries, one a group, as the job reads them.
struct Entries<'c> {
    data: Bytes<'c>,
    kind: ValueKind,
    /// The dtype of the values sinq computes with.
    dtype: Dtype,
    /// The tensor named in errors.
    tensor: TensorRef<'c>,
}

impl<'c> Entries<'c> {
    /// 2D tiling's entries (`[th·tw, g, 1]`: tile `(a, c)`'s row `b` at
    /// `(a·tw + c)·g + b`) in the weight's row-major order (row `a·g + b`,
    /// tile column `c` at `(a·g + b)·tw + c`), as f32 values (each is a
    /// value of the stored dtype, quantAux's computed as `dq8` does).
    fn tile_rows(self, tw: usize, g: usize) -> Result<Entries<'c>> {
        let n = self.tensor_entries();
        let unit = Grid {
            row_div: 1,
            col_div: 1,
            row_stride: 0,
            slice_stride: 0,
        };
        // The stored bytes, read now (a checkpoint in memory loads them).
        let v = Values {
            data: Bytes::Borrowed(self.tensor.data()?),
            kind: self.kind,
            grid: unit,
        };
        let th = n / (tw * g).max(1);
        let mut out = Vec::with_capacity(n * 4);
        for a in 0..th {
            for b in 0..g {
                for c in 0..tw {
                    out.extend_from_slice(&v.get((a * tw + c) * g + b).to_le_bytes());
                }
            }
        }
        Ok(Entries {
            data: Bytes::Owned(out.into()),
            kind: ValueKind::F32,
            dtype: self.dtype,
            tensor: self.tensor,
        })
    }

    /// How many entries there are (checked against the weight's groups).
    fn tensor_entries(&self) -> usize {
        match &self.kind {
            ValueKind::Nested(_) => self.tensor.len(),
            _ => self.tensor.len() / (self.tensor.dtype.bitsize() / 8).max(1),
        }
    }
}

/// The `r` entries of a stored scale or zero. quantAux's are sinq's
/// `rtn8`: `x` uint8 `[tile, K]` (`tile·K = r`), `s` and `m` `[1, K]` in
/// one float dtype; `dq8` computes `(x · s + m).view(r, 1)` in that dtype,
/// so entry `i` is `d(d(x[i] · s[i mod K]) + m[i mod K])`: a
/// [`Nested`] entry whose byte is its own value, a factor and an addend a
/// column of the `[tile, K]` matrix, each step rounded to the dtype.
fn entries<'c>(
    ckpt: &'c Checkpoint,
    stored: Stored<'c>,
    want: &[usize],
    what: &str,
) -> Result<Entries<'c>> {
    let r: usize = want.iter().product();
    let x = match stored {
        Stored::Plain(t) => {
            let kind = float_kind(&t)?;
            if t.shape != want {
                return Err(t.error(
                    Rule::TensorShape,
                    format!("shape {:?}; {what} make it {want:?}", t.shape),
                ));
            }
            return Ok(Entries {
                data: t.into(),
                kind,
                dtype: t.dtype,
                tensor: t,
            });
        }
        Stored::Aux(x) => x,
    };
    expect_dtype(&x, &[Dtype::U8])?;
    let (tile, k) = match *x.shape {
        [t, k] if t > 0 && k > 0 && t.checked_mul(k) == Some(r) => (t, k),
        _ => {
            return Err(x.error(
                Rule::TensorShape,
                format!("shape {:?}; the {r} entries of {what} as [tile, K] bytes, tile·K = {r}", x.shape),
            ))
        }
    };
    let base = x.name.strip_suffix(".x").unwrap_or(x.name);
    let side = |p: &str| -> Result<TensorRef<'c>> {
        let t = ckpt.get(&format!("{base}.{p}")).ok_or_else(|| {
            Error::tensor(
                Rule::MissingTensor,
                x.file,
                format!("{base}.{p}"),
                format!("missing: quantAux's {p} beside {base}.x"),
            )
        })?;
        float_kind(&t)?;
        if t.shape != [1, k] {
            return Err(t.error(
                Rule::TensorShape,
                format!("shape {:?}; {base}.x's {k} columns ({tile} rows) make it {:?}", t.shape, [1, k]),
            ));
        }
        Ok(t)
    };
    let (s, m) = (side("s")?, side("m")?);
    if m.dtype != s.dtype {
        return Err(m.error(
            Rule::TensorDtype,
            format!("dtype {}, but {base}.s is {}", m.dtype, s.dtype),
        ));
    }
    let round = dtype_of(s.dtype);
    let mut table = [0f32; 256];
    for (b, v) in table.iter_mut().enumerate() {
        *v = b as f32;
    }
    let nested = Nested {
        table,
        outer: s.floats()?.into(),
        per_outer: 1,
        offset: 0.0,
        cycle: k,
        adds: m.floats()?.into(),
        round,
    };
    Ok(Entries {
        data: x.into(),
        kind: ValueKind::Nested(Box::new(nested)),
        dtype: s.dtype,
        tensor: x,
    })
}

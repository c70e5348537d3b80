//! bitsandbytes checkpoints (`quant_method: "bitsandbytes"`): 4-bit NF4 and
//! FP4 (`load_in_4bit`, QLoRA, unsloth's `-bnb-4bit` releases), with plain
//! or double-quantized ("nested") absmax, and LLM.int8 (`load_in_8bit`).
//!
//! A 4-bit Linear `m` stores:
//!
//! | tensor | dtype | shape | holds |
//! |---|---|---|---|
//! | `weight` | U8 (or `bnb_4bit_quant_storage`: the bytes reinterpreted) | `[⌈n/2⌉, 1]` | codes of the flattened weight, element 2k in the **high** nibble of byte k |
//! | `weight.absmax` | F32 (U8 when nested) | `[⌈n/bs⌉]` | one scale per block of `bs` flat elements |
//! | `weight.quant_map` | F32 | `[16]` | the code table (kept for bitsandbytes; the kernels' own is used) |
//! | `weight.nested_absmax` | F32 | `[⌈n_blocks/nbs⌉]` | nested only: the absmax of each block of absmax codes |
//! | `weight.nested_quant_map` | F32 | `[256]` | nested only: the absmax codes' table |
//! | `weight.quant_state.bitsandbytes__nf4` (or `__fp4`) | U8 | `[len]` | UTF-8 JSON: `quant_type`, `blocksize`, `dtype`, `shape`, nested: `nested_blocksize`, `nested_dtype`, `nested_offset` |
//!
//! Block b is the flat elements `[b·bs, (b+1)·bs)` of the row-major tensor:
//! blocks cross rows, and the last may be partial. The job decodes the
//! flattened tensor through a view on which every block is whole: rows of
//! a multiple of `bs` when `bs` divides `n` (the logical shape's own rows
//! when `bs` divides them), else rows of `gcd(n, bs)` elements with the
//! blocks as [`ScaleLayout::Block`]s of rows (the last one partial). The
//! output bytes are the same row-major bytes either way; the output tensor
//! has the quant state's `shape`.
//!
//! Nested absmax is read through [`ValueKind::Nested`], as bitsandbytes
//! computes it before it decodes: `absmax[i] = f32(nested_quant_map[u8[i]]
//! · nested_absmax[i div nbs]) + f32(nested_offset)`, two f32 operations in
//! that order, by both backends (the stored bytes are read in place; only
//! the two small maps are copied).
//! The value is `f32(LUT[code] · absmax[e div bs])`, rounded once, with the
//! kernels' tables: NF4's (equal to the stored `quant_map`) and FP4's
//! (code 8 is −0.0 there, +0.0 in the stored map).
//!
//! An LLM.int8 Linear stores `weight` I8 `[out, in]`, `SCB` F32 `[out]` and
//! `weight_format` U8 `[]` (0: row-major). The value is
//! `f32(f32(q) · SCB[row]) · f32(1/127)`, the last factor a
//! [`DecodeJob::post_scale`].
//!
//! Which modules are quantized is told by what is stored (int8 configs keep
//! the 4-bit keys' defaults); `llm_int8_skip_modules` names modules stored
//! dense, which are copied (one stored quantized anyway is decoded, with a
//! warning).

use std::path::PathBuf;

use safetensors::Dtype;
use serde_json::Value;

use super::{
    byte_codes, check_extent, decoded_output, expect_dtype, grid_values, modules_with, plan_each,
    require, split_shape, Modules, QuantConfig, ScaleLayout,
};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule};
use crate::job::{gcd, DecodeJob, Dims, Fields, Nested, ValueKind, Values};
use crate::numerics::OutDtype;
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "bitsandbytes",
    producers: "bitsandbytes (QLoRA, unsloth -bnb-4bit)",
    bits: &[4, 8],
    modes: &["nf4", "fp4", "llm.int8"],
};

/// The NF4 table of bitsandbytes' kernels (`dDequantizeNF4`), equal to the
/// `quant_map` it stores.
pub const NF4: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// The FP4 table of bitsandbytes' kernels (`dDequantizeFP4Tree`: bit 3 the
/// sign, so code 8 is −0.0; the stored `quant_map` has +0.0 there).
pub const FP4: [f32; 16] = [
    0.0,
    5.208_333_3e-3,
    0.666_666_7,
    1.0,
    0.333_333_34,
    0.5,
    0.166_666_67,
    0.25,
    -0.0,
    -5.208_333_3e-3,
    -0.666_666_7,
    -1.0,
    -0.333_333_34,
    -0.5,
    -0.166_666_67,
    -0.25,
];

/// LLM.int8's last factor, `f32(1/127)` as bitsandbytes writes it
/// (`7.874015718698502e-3`, 0x3C010204).
pub const INT8_POST: f32 = f32::from_bits(0x3C01_0204);

/// The block sizes bitsandbytes' 4-bit kernels take.
pub const BLOCKSIZES: [usize; 8] = [32, 64, 128, 256, 512, 1024, 2048, 4096];

/// The quant-state keys bitsandbytes' `QuantState.from_dict` accepts.
const STATE_KEYS: [&str; 7] = [
    "quant_type",
    "blocksize",
    "dtype",
    "shape",
    "nested_blocksize",
    "nested_dtype",
    "nested_offset",
];

/// Elements of one view row at most when blocks cross the logical rows.
const VIEW_COLS: usize = 16384;

/// A bitsandbytes quantization config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// `load_in_4bit`.
    pub load_in_4bit: bool,
    /// `load_in_8bit`.
    pub load_in_8bit: bool,
    /// `bnb_4bit_quant_type` (each module's quant state says its own).
    pub quant_type: String,
    /// `bnb_4bit_use_double_quant`.
    pub double_quant: bool,
    /// `bnb_4bit_quant_storage`.
    pub quant_storage: String,
    /// `llm_int8_skip_modules`.
    pub skip_modules: Vec<String>,
    /// The skip patterns as transformers matches them.
    #[serde(skip)]
    skip: super::ModuleKeys,
}

#[derive(serde::Deserialize)]
struct Raw {
    load_in_4bit: Option<bool>,
    #[serde(rename = "_load_in_4bit")]
    load_in_4bit_: Option<bool>,
    load_in_8bit: Option<bool>,
    #[serde(rename = "_load_in_8bit")]
    load_in_8bit_: Option<bool>,
    bnb_4bit_quant_type: Option<String>,
    bnb_4bit_use_double_quant: Option<bool>,
    bnb_4bit_quant_storage: Option<String>,
    llm_int8_skip_modules: Option<Vec<String>>,
}

/// Bytes per element of a torch dtype name `bnb_4bit_quant_storage` may
/// give.
fn storage_size(name: &str) -> Option<usize> {
    Some(match name {
        "uint8" | "int8" => 1,
        "float16" | "bfloat16" | "int16" | "uint16" => 2,
        "float32" | "int32" | "uint32" => 4,
        "float64" | "int64" | "uint64" => 8,
        _ => return None,
    })
}

impl Config {
    /// Reads config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let path = q.path;
        let raw: Raw = q.read()?;
        let load_in_4bit = raw.load_in_4bit.or(raw.load_in_4bit_).unwrap_or(false);
        let load_in_8bit = raw.load_in_8bit.or(raw.load_in_8bit_).unwrap_or(false);
        if load_in_4bit && load_in_8bit {
            return Err(Error::new(
                Rule::Config,
                path,
                "load_in_4bit and load_in_8bit are both true",
            ));
        }
        let quant_type = raw
            .bnb_4bit_quant_type
            .unwrap_or_else(|| "fp4".into())
            .to_ascii_lowercase();
        if quant_type != "nf4" && quant_type != "fp4" {
            return Err(Error::new(
                Rule::Unsupported,
                path,
                format!("bnb_4bit_quant_type {quant_type:?} is not decoded (only nf4 and fp4)"),
            ));
        }
        let quant_storage = raw
            .bnb_4bit_quant_storage
            .unwrap_or_else(|| "uint8".into());
        if storage_size(&quant_storage).is_none() {
            return Err(Error::new(
                Rule::Config,
                path,
                format!("bnb_4bit_quant_storage {quant_storage:?} is not a torch dtype bitsandbytes stores codes in"),
            ));
        }
        let skip_modules = raw.llm_int8_skip_modules.unwrap_or_default();
        let skip = super::ModuleKeys::new(
            path,
            "llm_int8_skip_modules",
            skip_modules.iter().filter(|k| !k.is_empty()),
        )?;
        Ok(Config {
            path: path.to_path_buf(),
            load_in_4bit,
            load_in_8bit,
            quant_type,
            double_quant: raw.bnb_4bit_use_double_quant.unwrap_or(false),
            quant_storage,
            skip_modules,
            skip,
        })
    }

    /// Whether transformers leaves `module` unquantized
    /// (`llm_int8_skip_modules`: a prefix up to a module boundary, a regex
    /// with the same boundary, or a suffix).
    pub fn skipped(&self, module: &str) -> bool {
        self.skip.matches(module)
    }

    /// inspect's format line: `bitsandbytes 4-bit nf4`.
    pub fn format_line(&self) -> String {
        format!("bitsandbytes {}", self.describe())
    }

    /// For people: `4-bit nf4 double-quant` or `LLM.int8`.
    pub fn describe(&self) -> String {
        if self.load_in_8bit {
            "LLM.int8".into()
        } else {
            format!(
                "4-bit {}{}",
                self.quant_type,
                super::when(self.double_quant, " double-quant")
            )
        }
    }

    /// `inspect`'s lines: storage and skipped modules.
    pub fn report_lines(&self) -> Vec<String> {
        vec![
            format!("quant storage {}", self.quant_storage),
            format!(
                "llm_int8_skip_modules {}",
                super::list_or_dash(&self.skip_modules)
            ),
        ]
    }
}

/// The dtype of the first 4-bit module's quant state, for checkpoints whose
/// config.json names none.
pub fn default_dtype(ckpt: &Checkpoint) -> Option<OutDtype> {
    ckpt.names().iter().find_map(|n| {
        if !n.contains(".weight.quant_state.bitsandbytes__") {
            return None;
        }
        let t = ckpt.get(n)?;
        let v: Value = serde_json::from_slice(t.data().ok()?).ok()?;
        OutDtype::from_name(v.get("dtype")?.as_str()?)
    })
}

/// The suffixes a 4-bit module's tensors carry after `<module>.`.
const FOUR_BIT: [&str; 6] = [
    "weight.absmax",
    "weight.quant_map",
    "weight.nested_absmax",
    "weight.nested_quant_map",
    "weight.quant_state.bitsandbytes__nf4",
    "weight.quant_state.bitsandbytes__fp4",
];

/// The decoded modules: every module with a 4-bit tensor, a U8 `[k, 1]`
/// weight, an `SCB` or an int8 weight.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let mut four: std::collections::BTreeSet<&str> = FOUR_BIT
        .iter()
        .flat_map(|s| modules_with(ckpt, s))
        .collect();
    four.extend(modules_with(ckpt, "weight").into_iter().filter(|m| {
        ckpt.get(&format!("{m}.weight"))
            .is_some_and(|t| t.dtype == Dtype::U8 && matches!(*t.shape, [_, 1]))
    }));
    // An int8 weight is LLM.int8's unless its module is 4-bit (codes stored
    // as int8, `bnb_4bit_quant_storage: int8`); one with an SCB and 4-bit
    // tensors is both, and refused.
    let scb: std::collections::BTreeSet<&str> = modules_with(ckpt, "SCB").into_iter().collect();
    let eight: std::collections::BTreeSet<&str> = super::quantized_modules(ckpt, "SCB", Dtype::I8)
        .into_iter()
        .filter(|m| scb.contains(m) || !four.contains(m))
        .collect();
    let both: Vec<&str> = four.intersection(&scb).copied().collect();
    let skipped = |m: &str| {
        cfg.skipped(m).then_some(
            "named in llm_int8_skip_modules but stored quantized: decoded anyway",
        )
    };
    let mut found = plan_each(ckpt, four, &FOUR_BIT, skipped, |m, _| {
        if both.contains(&m) {
            return Err(Error::tensor(
                Rule::TensorDtype,
                ckpt.display_path(),
                format!("{m}.weight"),
                format!("module {m} stores both 4-bit and LLM.int8 tensors"),
            ));
        }
        four_bit(ckpt, m, dtype)
    });
    let int8 = plan_each(
        ckpt,
        eight.into_iter().filter(|m| !both.contains(m)),
        &["SCB", "weight_format"],
        skipped,
        |m, _| int8(ckpt, m, dtype),
    );
    found.outputs.extend(int8.outputs);
    found.consumed.extend(int8.consumed);
    found.errors.extend(int8.errors);
    found.warnings.extend(int8.warnings);
    found
}

/// A 4-bit module's quant state, as read from its JSON.
struct State {
    quant_type: &'static str,
    blocksize: usize,
    dtype: String,
    shape: Vec<usize>,
    /// `nested_blocksize`, `nested_offset`.
    nested: Option<(usize, f32)>,
}

/// Reads the UTF-8 JSON of a quant-state tensor (`kind`: `nf4` or `fp4`,
/// from its name).
fn read_state(t: &TensorRef<'_>, kind: &'static str) -> Result<State> {
    expect_dtype(t, &[Dtype::U8])?;
    let bad = |what: String| Err(t.error(Rule::TensorValue, what));
    let bytes = t.data()?;
    let text = match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => return bad(format!("quant state is not UTF-8: {e}")),
    };
    if let Some(key) = crate::checkpoint::json::duplicate_key(text.as_bytes()) {
        return bad(format!("quant state gives key {key:?} twice"));
    }
    let v: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return bad(format!("quant state is not JSON: {e}")),
    };
    let Some(o) = v.as_object() else {
        return bad("quant state is not a JSON object".into());
    };
    if let Some(k) = o.keys().find(|k| !STATE_KEYS.contains(&k.as_str())) {
        return bad(format!(
            "quant state key {k:?} is not one bitsandbytes reads ({})",
            STATE_KEYS.join(", ")
        ));
    }
    let get = |k: &str| o.get(k).filter(|v| !v.is_null());
    let required = |k: &str| get(k).ok_or_else(|| t.error(Rule::TensorValue, format!("quant state has no {k:?}")));
    let size = |k: &str, v: &Value| -> Result<usize> {
        match v.as_u64().and_then(|b| usize::try_from(b).ok()) {
            Some(b) if BLOCKSIZES.contains(&b) => Ok(b),
            _ => Err(t.error(
                Rule::TensorValue,
                format!(
                    "quant state {k} {v}: bitsandbytes takes {}",
                    BLOCKSIZES.map(|b| b.to_string()).join(", ")
                ),
            )),
        }
    };
    match required("quant_type")?.as_str() {
        Some(q) if q == kind => {}
        _ => {
            return bad(format!(
                "quant state quant_type {} disagrees with its name (bitsandbytes__{kind})",
                o["quant_type"]
            ))
        }
    }
    let blocksize = size("blocksize", required("blocksize")?)?;
    let dtype = match required("dtype")?.as_str() {
        Some(d @ ("bfloat16" | "float16" | "float32")) => d.to_string(),
        _ => {
            return bad(format!(
                "quant state dtype {}: bitsandbytes decodes to bfloat16, float16 or float32",
                o["dtype"]
            ))
        }
    };
    let shape = match required("shape")?.as_array() {
        Some(a) if !a.is_empty() => a
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<Vec<usize>>>(),
        _ => None,
    };
    let Some(shape) = shape.filter(|s| !s.contains(&0)) else {
        return Err(t.error(
            Rule::TensorShape,
            format!("quant state shape {}: expected positive dimensions", o["shape"]),
        ));
    };
    let nested_keys = ["nested_blocksize", "nested_dtype", "nested_offset"];
    let nested = match nested_keys.map(get) {
        [None, None, None] => None,
        [Some(b), Some(d), Some(off)] => {
            let b = size("nested_blocksize", b)?;
            if d.as_str() != Some("float32") {
                return bad(format!(
                    "quant state nested_dtype {d}: only float32 is decoded"
                ));
            }
            match off.as_f64().map(|x| x as f32) {
                Some(x) if x.is_finite() => Some((b, x)),
                _ => return bad(format!("quant state nested_offset {off} is not a finite number")),
            }
        }
        _ => {
            return bad(
                "quant state has some of nested_blocksize, nested_dtype, nested_offset but not all"
                    .into(),
            )
        }
    };
    Ok(State {
        quant_type: kind,
        blocksize,
        dtype,
        shape,
        nested,
    })
}

/// Fails unless `t` holds exactly `n` elements of one of `dtypes`.
fn expect_len(t: &TensorRef<'_>, dtypes: &[Dtype], n: usize, what: &str) -> Result<()> {
    expect_dtype(t, dtypes)?;
    if t.elements() != n {
        return Err(t.error(
            Rule::TensorShape,
            format!("shape {:?}; {what} needs {n} entries", t.shape),
        ));
    }
    Ok(())
}

/// The view `(rows, cols, layout)` of `n` flat elements in blocks of `bs`
/// on which no block crosses a row: the logical `[.., c]` rows when `bs`
/// divides `c`; else rows of the largest multiple of `bs` dividing `n` up
/// to [`VIEW_COLS`]; else (a partial last block) rows of `gcd(n, bs)` with
/// each block a block of rows.
fn flat_view(shape: &[usize], n: usize, bs: usize) -> (usize, usize, ScaleLayout) {
    let last = shape.last().copied().unwrap_or(n);
    if last.is_multiple_of(bs) {
        return (n / last, last, ScaleLayout::Group(bs));
    }
    if n.is_multiple_of(bs) {
        let blocks = n / bs;
        let most = (VIEW_COLS / bs).clamp(1, blocks);
        let per_row = (1..=most).rev().find(|d| blocks.is_multiple_of(*d)).unwrap_or(1);
        return (blocks / per_row, per_row * bs, ScaleLayout::Group(bs));
    }
    let g = gcd(n, bs);
    (n / g, g, ScaleLayout::Block(bs / g, g))
}

/// The job of one 4-bit module.
fn four_bit<'c>(ckpt: &'c Checkpoint, module: &str, dtype: OutDtype) -> Result<Output<'c>> {
    let states: Vec<(TensorRef<'c>, &'static str)> = ["nf4", "fp4"]
        .into_iter()
        .filter_map(|k| {
            ckpt.get(&format!("{module}.weight.quant_state.bitsandbytes__{k}"))
                .map(|t| (t, k))
        })
        .collect();
    let (state_t, kind) = match states.as_slice() {
        [one] => *one,
        [] => {
            return Err(super::missing(
                ckpt,
                format!("{module}.weight.quant_state.bitsandbytes__nf4"),
                format!("module {module} is stored 4-bit but has no quant_state.bitsandbytes__nf4 (or __fp4)"),
            ))
        }
        [(t, _), ..] => {
            return Err(t.error(
                Rule::TensorValue,
                format!("module {module} has both an nf4 and an fp4 quant state"),
            ))
        }
    };
    let st = read_state(&state_t, kind)?;
    let n = st
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| (n as u64) < 1u64 << 52)
        .ok_or_else(|| {
            state_t.error(
                Rule::TensorShape,
                format!("quant state shape {:?} is too large", st.shape),
            )
        })?;
    let bs = st.blocksize;
    let blocks = n.div_ceil(bs);

    // The codes: ⌈n/2⌉ bytes in whatever dtype they are stored as, laid out
    // as bitsandbytes' `quantize_4bit` does: [(n + 1) div (2·size), 1].
    let w = require(ckpt, module, "weight")?;
    let size = w.dtype.bitsize() / 8;
    if w.dtype == Dtype::BOOL || size == 0 || !w.dtype.bitsize().is_multiple_of(8) {
        return Err(w.error(
            Rule::TensorDtype,
            format!("dtype {} cannot hold 4-bit codes", w.dtype),
        ));
    }
    let want = (n + 1) / (2 * size) * size;
    let flat = matches!(*w.shape, [_] | [_, 1]);
    if !flat || w.len() != want || want < n.div_ceil(2) {
        return Err(w.error(
            Rule::TensorShape,
            format!(
                "shape {:?} of {} holds {} bytes; the {n} 4-bit codes of shape {:?} take {} as [{}, 1]",
                w.shape,
                w.dtype,
                w.len(),
                st.shape,
                n.div_ceil(2),
                (n + 1) / (2 * size),
            ),
        ));
    }

    // absmax: f32, or bytes quantized blockwise themselves (double quant).
    let absmax_t = require(ckpt, module, "weight.absmax")?;
    let nested_t = ckpt.get(&format!("{module}.weight.nested_absmax"));
    let scale_kind = match (st.nested, nested_t) {
        (None, None) => {
            expect_len(&absmax_t, &[Dtype::F32], blocks, "one absmax per block")?;
            ValueKind::F32
        }
        (Some((nbs, offset)), Some(nested)) => {
            expect_len(&absmax_t, &[Dtype::U8], blocks, "one absmax code per block")?;
            let outer = blocks.div_ceil(nbs);
            expect_len(&nested, &[Dtype::F32], outer, "one nested absmax per nested block")?;
            let qmap = require(ckpt, module, "weight.nested_quant_map")?;
            expect_len(&qmap, &[Dtype::F32], 256, "one value per absmax code")?;
            let mut table = [0f32; 256];
            table.copy_from_slice(&qmap.floats()?);
            ValueKind::Nested(Box::new(Nested::blockwise(
                table,
                nested.floats()?.into(),
                nbs,
                offset,
            )))
        }
        (None, Some(nested)) => {
            return Err(nested.error(
                Rule::TensorValue,
                "a nested absmax, but the quant state has no nested_blocksize, nested_dtype, nested_offset",
            ))
        }
        (Some(_), None) => {
            return Err(super::missing(
                ckpt,
                format!("{module}.weight.nested_absmax"),
                format!("the quant state of {module} is nested but there is no nested_absmax"),
            ))
        }
    };
    let qmap = require(ckpt, module, "weight.quant_map")?;
    expect_len(&qmap, &[Dtype::F32], 16, "one value per 4-bit code")?;

    let (rows, cols, layout) = flat_view(&st.shape, n, bs);
    let dims = Dims {
        slices: 1,
        rows,
        cols,
    };
    let (grid, entries) = layout.grid(dims);
    if entries != blocks {
        return Err(Error::tensor(
            Rule::Internal,
            ckpt.display_path(),
            absmax_t.name,
            format!("a {rows}x{cols} view of {n} elements has {entries} blocks, not {blocks}"),
        ));
    }
    let codes = Fields::dense(w, 4, cols as u64 * 4).high_first();
    check_extent(&w, &codes, 1, rows, cols)?;
    let lut = match kind {
        "nf4" => NF4,
        _ => FP4,
    };
    let job = DecodeJob::new(dims, codes, lut.to_vec(), dtype).with_scale(Values {
        data: absmax_t.into(),
        kind: scale_kind,
        grid,
    });
    let nested = match st.nested {
        Some((nbs, _)) => format!("nested absmax (block {nbs})"),
        None => "absmax f32".into(),
    };
    let scheme = format!(
        "bitsandbytes {} block {bs}, {nested}, storage {}, dtype {}",
        st.quant_type, w.dtype, st.dtype
    );
    Ok(decoded_output(module, w.shard, st.shape, job, scheme))
}

/// The job of one LLM.int8 module.
fn int8<'c>(ckpt: &'c Checkpoint, module: &str, dtype: OutDtype) -> Result<Output<'c>> {
    let w = require(ckpt, module, "weight")?;
    expect_dtype(&w, &[Dtype::I8])?;
    let (slices, rows, cols) = split_shape(&w, w.shape)?;
    if slices != 1 {
        return Err(w.error(
            Rule::TensorShape,
            format!("shape {:?}; an LLM.int8 weight is [out, in]", w.shape),
        ));
    }
    let scb = require(ckpt, module, "SCB")?;
    expect_len(&scb, &[Dtype::F32], rows, "one SCB per output row")?;
    if let Some(f) = ckpt.get(&format!("{module}.weight_format")) {
        expect_dtype(&f, &[Dtype::U8, Dtype::I8, Dtype::I32, Dtype::I64])?;
        match f.ints()?.as_slice() {
            [0] => {}
            [v] => {
                return Err(f.error(
                    Rule::TensorValue,
                    format!("weight_format {v}: only 0 (row-major) is decoded, not a GPU tile layout"),
                ))
            }
            _ => {
                return Err(f.error(
                    Rule::TensorShape,
                    format!("shape {:?}; weight_format is one value", f.shape),
                ))
            }
        }
    }
    let dims = Dims {
        slices: 1,
        rows,
        cols,
    };
    let scale = grid_values(scb, ValueKind::F32, ScaleLayout::Channel, dims)?;
    let codes = byte_codes(&w, dims);
    check_extent(&w, &codes, 1, rows, cols)?;
    let code_values = (0..=255u8).map(|c| c as i8 as f32).collect::<Vec<f32>>();
    let job = DecodeJob::new(dims, codes, code_values, dtype)
        .with_scale(scale)
        .with_post_scale(INT8_POST);
    let shape = vec![rows, cols];
    Ok(decoded_output(
        module,
        w.shard,
        shape,
        job,
        "bitsandbytes LLM.int8 (int8, f32 SCB per row, / 127)".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_keep_every_block_in_one_row() {
        // Blocks along the logical rows.
        assert_eq!(flat_view(&[320, 704], 320 * 704, 64), (320, 704, ScaleLayout::Group(64)));
        // Blocks crossing rows: 96 columns, blocks of 64.
        let (r, c, l) = flat_view(&[10, 96], 960, 64);
        assert_eq!((r * c, c % 64, l), (960, 0, ScaleLayout::Group(64)));
        // A partial last block: 300 elements, blocks of 64.
        assert_eq!(flat_view(&[10, 30], 300, 64), (75, 4, ScaleLayout::Block(16, 4)));
        assert_eq!(flat_view(&[7], 7, 64), (7, 1, ScaleLayout::Block(64, 1)));
    }

    #[test]
    fn the_int8_factor_is_bitsandbytes_constant() {
        assert_eq!(INT8_POST, 7.874015718698502e-3f64 as f32);
        assert_eq!(FP4[1], (0.0625f32 / 12.0));
        assert_eq!(FP4[2], 8.0f32 / 12.0);
        assert_eq!(FP4[6], 2.0f32 / 12.0);
        assert!(FP4[8] == 0.0 && FP4[8].is_sign_negative());
    }
}

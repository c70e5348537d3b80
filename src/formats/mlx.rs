//! MLX checkpoints (mlx-lm's `convert -q`, the mlx-community releases).
//!
//! `config.json` carries `quantization` (mlx-lm copies it to a
//! `quantization_config` without `quant_method`): `group_size`, `bits` and
//! `mode` (`affine` when absent; `mxfp4`, `nvfp4`, `mxfp8`), and an entry per
//! module path where a module differs (mixed recipes write one per layer;
//! `group_size: null` is 64; an entry without `mode` is affine whatever the
//! top level says; `false` is a module left dense).
//!
//! A quantized module stores `weight` U32 `[..., out, in·bits/32]`, each row
//! one LSB-first stream of `bits`-bit codes over its little-endian words
//! (3, 5 and 6 bits cross words), and `scales` `[..., out, in/group]`:
//! - affine: `scales` and `biases` in the model's dtype T; the value is
//!   `T(T(scale · q) + bias)`, rounded twice as MLX computes it (the job's
//!   product in the output dtype, then its offset);
//! - mxfp4 / mxfp8 / nvfp4: E2M1 or E4M3 codes, `scales` U8 (E8M0 for the mx
//!   modes: 0 is 2^−127 and 255 +inf, as MLX reads it; E4M3 for nvfp4), no
//!   biases; the code value and the scale are each cast to the output dtype
//!   and multiplied in it; nvfp4 with a `global_scale` (MoE switch layers)
//!   is computed in f32 and rounded once ([`global_scales`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::Dtype;
use serde_json::Value;

use super::{
    byte_table, check_extent, decoded_output, e2m1_values, e4m3_values, expect_dtype, float_kind, grid_values,
    modules_with, plan_each, require, split_shape, Modules, ScaleLayout,
};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule};
use crate::job::{DecodeJob, Dims, Fields, Nested, Product, ValueKind};
use crate::numerics::{self, OutDtype};
use crate::output::Output;
use crate::plural::plural;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "mlx",
    producers: "mlx-lm",
    bits: &[2, 3, 4, 5, 6, 8],
    modes: &["affine", "mxfp4", "nvfp4", "mxfp8"],
};

/// How a module's values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Unsigned integer codes, a scale and a bias per group.
    Affine,
    /// E2M1 codes, an E8M0 scale per 32.
    Mxfp4,
    /// E2M1 codes, an E4M3 scale per 16.
    Nvfp4,
    /// E4M3 codes, an E8M0 scale per 32.
    Mxfp8,
}

/// One module's quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Scheme {
    /// Bits per code.
    pub bits: u32,
    /// Columns per scale.
    pub group_size: usize,
    /// The codes' and scales' kind.
    pub mode: Mode,
}

impl Scheme {
    /// For people: `affine 4-bit group 64`.
    pub fn describe(&self) -> String {
        let mode = serde_json::to_value(self.mode).ok();
        let mode = mode.as_ref().and_then(Value::as_str).unwrap_or("?");
        format!("{mode} {}-bit group {}", self.bits, self.group_size)
    }

    /// Refuses what MLX does not write: the bits and group of each mode.
    fn check(&self, path: &Path, at: &str) -> Result<()> {
        let fits = match self.mode {
            Mode::Affine => {
                matches!(self.bits, 2 | 3 | 4 | 5 | 6 | 8) && matches!(self.group_size, 32 | 64 | 128)
            }
            Mode::Mxfp4 => self.bits == 4 && self.group_size == 32,
            Mode::Nvfp4 => self.bits == 4 && self.group_size == 16,
            Mode::Mxfp8 => self.bits == 8 && self.group_size == 32,
        };
        if fits {
            return Ok(());
        }
        Err(Error::new(
            Rule::Unsupported,
            path,
            format!(
                "{at}: {} is not a scheme MLX writes (affine: 2, 3, 4, 5, 6 or 8 bits, groups of 32, 64 or 128; mxfp4 4-bit group 32; nvfp4 4-bit group 16; mxfp8 8-bit group 32)",
                self.describe()
            ),
        ))
    }
}

/// An MLX `quantization` block.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// The scheme of every module without an entry of its own.
    pub default: Scheme,
    /// Modules with an entry of their own: their scheme, or `None` for a
    /// module left dense.
    pub modules: BTreeMap<String, Option<Scheme>>,
}

#[derive(serde::Deserialize)]
struct RawScheme {
    bits: Option<u32>,
    group_size: Option<usize>,
    mode: Option<Mode>,
}

/// config.json's `quantization` block, when the checkpoint is MLX's: the
/// block is there, and `quantization_config` (if any) names no
/// `quant_method` of another tool.
pub fn quantization(ckpt: &Checkpoint) -> Option<(&Path, &Value)> {
    let cfg = ckpt.config.as_ref()?;
    let q = cfg.value.get("quantization").filter(|q| q.is_object())?;
    let method = cfg.value.get("quantization_config").and_then(|qc| qc.get("quant_method"));
    method.is_none().then_some((cfg.path.as_path(), q))
}

impl Config {
    /// Reads a `quantization` block.
    pub fn parse(path: &Path, q: &Value) -> Result<Config> {
        let obj = q
            .as_object()
            .ok_or_else(|| Error::new(Rule::Config, path, "quantization must be an object"))?;
        let scheme = |at: &str, v: &Value, top: Option<Scheme>| -> Result<Scheme> {
            let raw: RawScheme = super::from_value(path, v)
                .map_err(|e| Error::new(Rule::Config, path, format!("quantization.{at}: {}", e.detail)))?;
            let scheme = Scheme {
                bits: raw.bits.or(top.map(|t| t.bits)).ok_or_else(|| {
                    Error::new(Rule::Config, path, format!("quantization.{at}: no bits"))
                })?,
                // MLX's own default for an entry without one.
                group_size: raw.group_size.unwrap_or(64),
                mode: raw.mode.unwrap_or(Mode::Affine),
            };
            scheme.check(path, &format!("quantization.{at}"))?;
            Ok(scheme)
        };
        let default = scheme("", q, None)?;
        let mut modules = BTreeMap::new();
        for (key, v) in obj {
            let entry = match v {
                Value::Object(_) => Some(scheme(key, v, Some(default))?),
                Value::Bool(false) => None,
                Value::Bool(true) => Some(default),
                _ => continue,
            };
            modules.insert(key.clone(), entry);
        }
        Ok(Config {
            path: path.to_path_buf(),
            default,
            modules,
        })
    }

    /// The scheme of `module` (`None`: left dense).
    pub fn scheme(&self, module: &str) -> Option<Scheme> {
        match self.modules.get(module) {
            Some(entry) => *entry,
            None => Some(self.default),
        }
    }

    /// inspect's format line: the default scheme, and how many modules
    /// differ.
    pub fn format_line(&self) -> String {
        match self.modules.len() {
            0 => format!("mlx {}", self.default.describe()),
            n => format!(
                "mlx {} ({} with {} own)",
                self.default.describe(),
                plural(n, "module"),
                if n == 1 { "its" } else { "their" }
            ),
        }
    }

    /// `inspect`'s lines: each scheme the per-module entries use, with how
    /// many modules use it (a mixed recipe summarised).
    pub fn report_lines(&self) -> Vec<String> {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for entry in self.modules.values() {
            let what = entry.map_or_else(|| "dense".to_string(), |s| s.describe());
            *counts.entry(what).or_default() += 1;
        }
        let mut lines = vec![format!("default {}", self.default.describe())];
        lines.extend(counts.into_iter().map(|(what, n)| format!("{what}: {}", plural(n, "module"))));
        lines
    }
}

/// E8M0 as MLX reads it: 2^(e − 127), and 255 as +inf (not NaN).
fn e8m0(byte: u8) -> f32 {
    match byte {
        0xFF => f32::INFINITY,
        b => numerics::e8m0(b),
    }
}

/// The quantized modules: every module with `scales`, or a U32 `weight`.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let mut modules: Vec<&str> = modules_with(ckpt, "scales");
    modules.extend(modules_with(ckpt, "weight").into_iter().filter(|m| {
        ckpt.get(&format!("{m}.weight"))
            .is_some_and(|t| t.dtype == Dtype::U32)
    }));
    modules.sort_unstable();
    modules.dedup();
    plan_each(
        ckpt,
        modules,
        &["weight", "scales", "biases", "global_scale"],
        |_| None,
        |m, _| plan_module(cfg, ckpt, m, dtype),
    )
}

fn plan_module<'c>(cfg: &Config, ckpt: &'c Checkpoint, module: &str, out: OutDtype) -> Result<Output<'c>> {
    let w = require(ckpt, module, "weight")?;
    let scales = require(ckpt, module, "scales")?;
    let Some(scheme) = cfg.scheme(module) else {
        return Err(scales.error(
            Rule::Config,
            format!("quantization.{module} is false (a dense module), but the module is stored quantized"),
        ));
    };
    expect_dtype(&w, &[Dtype::U32])?;
    let (slices, rows, words) = split_shape(&w, w.shape)?;
    let (s_slices, s_rows, groups) = split_shape(&scales, scales.shape)?;
    let cols = groups.saturating_mul(scheme.group_size);
    if (s_slices, s_rows) != (slices, rows) || scales.shape.len() != w.shape.len() {
        return Err(scales.error(
            Rule::TensorShape,
            format!("shape {:?} does not match the weight's {:?}", scales.shape, w.shape),
        ));
    }
    if words.checked_mul(32) != cols.checked_mul(scheme.bits as usize) {
        return Err(w.error(
            Rule::TensorShape,
            format!(
                "packed width {words} words does not hold {cols} {}-bit codes (in = {groups} groups of {}, from the scales)",
                scheme.bits, scheme.group_size
            ),
        ));
    }
    let dims = Dims { slices, rows, cols };
    let lane_bits = words as u64 * 32;
    let codes = Fields::dense(w, scheme.bits, lane_bits).with_slice_bits(rows as u64 * lane_bits);
    check_extent(&w, &codes, slices, rows, cols)?;
    let layout = ScaleLayout::Group(scheme.group_size);
    let biases = ckpt.get(&format!("{module}.biases"));
    let global = ckpt.get(&format!("{module}.global_scale"));
    if let Some(g) = global.filter(|_| scheme.mode != Mode::Nvfp4) {
        return Err(g.error(Rule::Config, "a global scale belongs to nvfp4 modules only"));
    }
    let job = match scheme.mode {
        Mode::Affine => {
            let kind = float_kind(&scales)?;
            let biases = require(ckpt, module, "biases")?;
            if biases.dtype != scales.dtype {
                return Err(biases.error(
                    Rule::TensorDtype,
                    format!("dtype {}, not the scales' {}", biases.dtype, scales.dtype),
                ));
            }
            let code_values: Vec<f32> = (0..1u32 << scheme.bits).map(|q| q as f32).collect();
            DecodeJob::new(dims, codes, code_values, out)
                .with_scale(grid_values(scales, kind, layout, dims)?)
                .with_offset(grid_values(biases, float_kind(&biases)?, layout, dims)?)
        }
        mode => {
            if let Some(b) = biases {
                return Err(b.error(Rule::Config, "biases belong to affine modules only"));
            }
            expect_dtype(&scales, &[Dtype::U8])?;
            let (code_values, table): (Vec<f32>, _) = match (mode, global) {
                (Mode::Mxfp8, _) => (e4m3_values(), byte_table(e8m0)),
                (Mode::Nvfp4, None) => (e2m1_values(), byte_table(numerics::e4m3)),
                (Mode::Nvfp4, Some(g)) => (e2m1_values(), global_scales(g, dims, scheme.group_size)?),
                _ => (e2m1_values(), byte_table(e8m0)),
            };
            DecodeJob::new(dims, codes, code_values, out).with_scale(grid_values(scales, table, layout, dims)?)
        }
    };
    // With a global scale, one rounding of the f32 product (see
    // global_scales); else the product in the output dtype, as MLX.
    let (product, scheme) = match global {
        Some(_) => (Product::F32, format!("mlx {}, global scale", scheme.describe())),
        None => (Product::OutDtype, format!("mlx {}", scheme.describe())),
    };
    let mut shape = w.shape.to_vec();
    if let Some(last) = shape.last_mut() {
        *last = cols;
    }
    Ok(decoded_output(module, w.shard, shape, job.with_product(product), scheme))
}

/// The scales of an nvfp4 module with a global scale (mlx ≥ 0.31's
/// `quantize(global_scale=...)`, MoE switch layers): F32, one per slice
/// (expert). MLX computes `f32(e2m1(q) · f32(e4m3(s) · f32(gs / 2688)))`
/// whatever the output dtype, then the value is rounded once: each scale
/// is a nested table entry, its byte's E4M3 value times its slice's
/// `gs / 2688`, plus −0 (which keeps every value, −0 included).
fn global_scales(g: TensorRef<'_>, dims: Dims, group: usize) -> Result<ValueKind> {
    expect_dtype(&g, &[Dtype::F32])?;
    let per_slice = matches!(g.shape, [e] if *e == dims.slices) || (dims.slices == 1 && g.shape.iter().all(|&d| d == 1));
    if !per_slice {
        return Err(g.error(
            Rule::TensorShape,
            format!("shape {:?}, not one value per expert ({})", g.shape, dims.slices),
        ));
    }
    let table = std::array::from_fn(|b| numerics::e4m3(b as u8));
    let outer: Vec<f32> = g.floats()?.iter().map(|gs| gs / NVFP4_GLOBAL).collect();
    Ok(ValueKind::Nested(Box::new(Nested::blockwise(
        table,
        outer.into(),
        (dims.rows * dims.cols.div_ceil(group)).max(1),
        -0.0,
    ))))
}

/// The divisor of nvfp4's global scale: E2M1's largest value (6) times
/// E4M3's (448).
const NVFP4_GLOBAL: f32 = 2688.0;

//! DeepSeek-style FP8 (`quant_method: "fp8"`, transformers'
//! `FineGrainedFP8Config`): DeepSeek-V3/R1, Qwen3 FP8, MiniMax, GLM FP8, …
//!
//! Each quantized Linear stores `weight` as float8_e4m3fn `[out, in]` and
//! `weight_scale_inv` `[ceil(out/bh), ceil(in/bw)]` (edge blocks partial).
//! The value is `f32(weight) × weight_scale_inv` of its block, rounded once
//! to the output dtype, as compressed-tensors' `FP8BlockDequantizer`.
//!
//! DeepSeek-V4 (`scale_fmt: "ue8m0"`, `expert_dtype: "fp4"`) names the scale
//! `<m>.scale` and stores it as F8_E8M0; its routed experts store `weight` as
//! I8 `[out, in/2]`, two E2M1 codes a byte (low nibble first), with one scale
//! per 32 codes of a row. Both are the same job with another code table: the
//! block is the config's where the scale grid is its (edges partial), else
//! the one the grid divides the weight into, as transformers'
//! `Fp8Dequantize._dequantize_one` derives it (V4.1 ships 32×32 blocks).

use std::collections::BTreeSet;
use std::path::PathBuf;

use safetensors::Dtype;
use serde_json::Value;

use super::{
    byte_table, decoded_output, expect_dtype, float_kind, fp4_weight_job, fp8_job, grid_values,
    list_or_dash, modules_with, not_converted, plan_each, quantized_modules, require, weight_dims,
    Modules, QuantConfig, ScaleLayout,
};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule};
use crate::job::Dims;
use crate::numerics::{self, OutDtype};
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "fp8-block",
    producers: "DeepSeek-style FP8",
    bits: &[4, 8],
    modes: &[
        "fp8 block scales",
        "DeepSeek-V4: ue8m0 block scales, fp4 experts (e8m0 group 32)",
    ],
};

/// Codes per scale of an FP4 expert row (transformers' `FP8Experts`
/// allocates its FP4 scales at this granularity).
const FP4_GROUP: usize = 32;

/// An FP8 block quantization config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// Rows and columns per scale (`weight_block_size`); `None` when the
    /// config sets it to null: one scale per tensor.
    pub block: Option<(usize, usize)>,
    /// `dynamic` or `static` activations (static ones store `input_scale`,
    /// which a dense checkpoint drops).
    pub activation_scheme: Option<String>,
    /// Modules left in high precision.
    pub modules_to_not_convert: Vec<String>,
    /// `scale_fmt`: `ue8m0` (DeepSeek-V4: F8_E8M0 scales) or `float`.
    pub scale_fmt: Option<String>,
    /// `expert_dtype`: `fp4` when the routed experts store E2M1 nibbles
    /// (read from `quantization_config`, else from config.json's top level,
    /// as transformers' DeepSeek-V4 config moves it).
    pub expert_dtype: Option<String>,
}

#[derive(serde::Deserialize)]
struct Raw {
    fmt: Option<String>,
    activation_scheme: Option<String>,
    modules_to_not_convert: Option<Vec<String>>,
    scale_fmt: Option<String>,
    expert_dtype: Option<String>,
}

impl Config {
    /// Reads config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let path = q.path;
        let raw: Raw = q.read()?;
        super::only_setting(path, "fp8 fmt", raw.fmt.as_deref(), "e4m3")?;
        if let Some(f) = raw.scale_fmt.as_deref() {
            if !["ue8m0", "float"].contains(&f.to_ascii_lowercase().as_str()) {
                let why = format!("scale_fmt {f:?} is not decoded (ue8m0 or float)");
                return Err(Error::new(Rule::Unsupported, path, why));
            }
        }
        let top = q.ckpt.config.as_ref().map(|c| &c.value["expert_dtype"]);
        let expert_dtype = match (raw.expert_dtype, top) {
            (Some(d), _) => Some(d),
            (None, None | Some(Value::Null)) => None,
            (None, Some(Value::String(d))) => Some(d.clone()),
            (None, Some(v)) => {
                let why = format!("expert_dtype {v}: expected \"fp4\" or \"fp8\"");
                return Err(Error::new(Rule::Config, path, why));
            }
        };
        if let Some(d) = expert_dtype.as_deref() {
            if !["fp4", "fp8"].contains(&d.to_ascii_lowercase().as_str()) {
                let why = format!("expert_dtype {d:?} is not decoded (fp4 or fp8)");
                return Err(Error::new(Rule::Unsupported, path, why));
            }
        }
        // transformers defaults a missing block size to 128x128.
        let block = match q.value.get("weight_block_size") {
            None => Some((128, 128)),
            Some(Value::Null) => None,
            Some(v) => match v.as_array().map(|a| a.iter().map(Value::as_u64).collect()) {
                Some(Some::<Vec<u64>>(b)) if b.len() == 2 && b.iter().all(|&x| x > 0) => {
                    let size = |x: u64| usize::try_from(x).unwrap_or(usize::MAX);
                    Some((size(b[0]), size(b[1])))
                }
                _ => {
                    return Err(Error::new(
                        Rule::Config,
                        path,
                        format!("weight_block_size {v}: expected two positive integers"),
                    ))
                }
            },
        };
        Ok(Config {
            path: path.to_path_buf(),
            block,
            activation_scheme: raw.activation_scheme,
            modules_to_not_convert: raw.modules_to_not_convert.unwrap_or_default(),
            scale_fmt: raw.scale_fmt,
            expert_dtype,
        })
    }

    /// Whether the routed experts store E2M1 nibbles.
    fn fp4_experts(&self) -> bool {
        self.expert_dtype
            .as_deref()
            .is_some_and(|d| d.eq_ignore_ascii_case("fp4"))
    }

    /// The scale layout of every quantized weight.
    pub fn layout(&self) -> ScaleLayout {
        match self.block {
            Some((h, w)) => ScaleLayout::Block(h, w),
            None => ScaleLayout::Tensor,
        }
    }

    /// `inspect`'s line: the activation scheme and the modules left dense.
    pub fn report_lines(&self) -> Vec<String> {
        vec![format!(
            "activations {}; scale_fmt {}; expert_dtype {}; not converted {}",
            self.activation_scheme.as_deref().unwrap_or("-"),
            self.scale_fmt.as_deref().unwrap_or("-"),
            self.expert_dtype.as_deref().unwrap_or("-"),
            list_or_dash(&self.modules_to_not_convert)
        )]
    }

    /// inspect's format line: `fp8-block e4m3 block 128x128
    /// (weight_scale_inv)`, or DeepSeek-V4's `… (DeepSeek-V4 ue8m0 scale),
    /// fp4 experts e8m0 group 32`.
    pub fn format_line(&self) -> String {
        let scale = match &self.scale_fmt {
            Some(f) if f.eq_ignore_ascii_case("ue8m0") => "DeepSeek-V4 ue8m0 scale",
            _ => "weight_scale_inv",
        };
        let experts = if self.fp4_experts() {
            format!(", fp4 experts e8m0 group {FP4_GROUP}")
        } else {
            String::new()
        };
        let layout = self.layout().describe();
        format!("{} e4m3 {layout} ({scale}){experts}", SUPPORT.name)
    }

    /// The layout of scale `scale` of a weight of `dims`: the config's when
    /// the scale holds its grid, else the block the scale's 2-D grid
    /// divides the weight into exactly (as transformers derives it);
    /// otherwise the config's, which the scale then fails to fit.
    fn layout_of(&self, scale: &TensorRef<'_>, dims: Dims) -> ScaleLayout {
        let own = self.layout();
        let (_, want) = own.grid(dims);
        let fits = match own {
            ScaleLayout::Block(_, bw) => scale.shape.last() == Some(&dims.cols.div_ceil(bw)),
            _ => true,
        };
        if scale.elements() == want && fits {
            return own;
        }
        match *scale.shape {
            [sr, sc] if dims.slices == 1 && sr > 0 && sc > 0 => {
                if dims.rows.is_multiple_of(sr) && dims.cols.is_multiple_of(sc) {
                    ScaleLayout::Block(dims.rows / sr, dims.cols / sc)
                } else {
                    own
                }
            }
            _ => own,
        }
    }
}

/// The decoded modules: every module with a `weight_scale_inv` (or
/// DeepSeek-V4's `scale`), every FP8 `weight` and every I8 one (one without
/// its scale is an error, never a copy; an I8 one without `expert_dtype:
/// fp4` too).
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let v4_scaled = modules_with(ckpt, "scale").into_iter().filter(|m| {
        let weight = ckpt.get(&format!("{m}.weight"));
        let scale = ckpt.get(&format!("{m}.scale"));
        weight.is_some_and(|w| matches!(w.dtype, Dtype::F8_E4M3 | Dtype::I8))
            || weight.is_some() && scale.is_some_and(|s| s.dtype == Dtype::F8_E8M0)
    });
    let v4_scaled: BTreeSet<&str> = v4_scaled.collect();
    // The name a missing scale is asked for by: DeepSeek-V4's where the
    // checkpoint uses it, else transformers' `weight_scale_inv`.
    let missing_scale = if v4_scaled.is_empty() && cfg.expert_dtype.is_none() {
        "weight_scale_inv"
    } else {
        "scale"
    };
    let modules: BTreeSet<&str> = quantized_modules(ckpt, "weight_scale_inv", Dtype::F8_E4M3)
        .into_iter()
        .chain(quantized_modules(ckpt, "weight_scale_inv", Dtype::I8))
        .chain(v4_scaled)
        .collect();
    plan_each(
        ckpt,
        modules,
        &["weight", "weight_scale_inv", "scale"],
        |m| {
            not_converted(&cfg.modules_to_not_convert, m)
                .then_some("listed in modules_to_not_convert but stored as FP8; decoded anyway")
        },
        |m, _| plan_module(cfg, ckpt, m, missing_scale, dtype),
    )
}

/// Module `m`'s job; its scale is `weight_scale_inv` or `scale`, whichever
/// is stored (`missing_scale` when neither is).
fn plan_module<'c>(
    cfg: &Config,
    ckpt: &'c Checkpoint,
    m: &str,
    missing_scale: &'static str,
    dtype: OutDtype,
) -> Result<Output<'c>> {
    let param = ["weight_scale_inv", "scale"]
        .into_iter()
        .find(|p| ckpt.get(&format!("{m}.{p}")).is_some())
        .unwrap_or(missing_scale);
    let w = require(ckpt, m, "weight")?;
    expect_dtype(&w, &[Dtype::F8_E4M3, Dtype::I8])?;
    let scale = require(ckpt, m, param)?;
    let kind = match scale.dtype {
        Dtype::F8_E8M0 => byte_table(numerics::e8m0),
        _ => float_kind(&scale).map_err(|_| {
            scale.error(
                Rule::TensorDtype,
                format!("dtype {}, expected F8_E8M0, BF16, F16 or F32", scale.dtype),
            )
        })?,
    };
    if w.dtype == Dtype::I8 {
        if !cfg.fp4_experts() {
            return Err(w.error(
                Rule::TensorDtype,
                "dtype I8 (FP4 experts), but the config's expert_dtype is not \"fp4\"",
            ));
        }
        // The runtime's FP4 experts take exactly one scale per 32 codes.
        let cols = w.shape.last().map_or(0, |&bytes| bytes.saturating_mul(2));
        if !cols.is_multiple_of(FP4_GROUP) {
            return Err(w.error(
                Rule::TensorShape,
                format!(
                    "shape {:?} holds rows of {cols} FP4 values, not whole groups of {FP4_GROUP}",
                    w.shape
                ),
            ));
        }
        let layout = ScaleLayout::Group(FP4_GROUP);
        let (job, shape) = fp4_weight_job(&w, scale, kind, layout, dtype)?;
        let scheme = format!("fp4 e2m1 e8m0 group {FP4_GROUP}");
        return Ok(decoded_output(m, w.shard, shape, job, scheme));
    }
    let dims = weight_dims(&w)?;
    let layout = cfg.layout_of(&scale, dims);
    let values = grid_values(scale, kind, layout, dims)?;
    let job = fp8_job(&w, dims, dtype).with_scale(values);
    let scheme = format!("fp8 e4m3 {} ({param})", layout.describe());
    Ok(decoded_output(m, w.shard, w.shape.to_vec(), job, scheme))
}

//! fbgemm FP8 (`quant_method: "fbgemm_fp8"`, transformers'
//! `FbgemmFp8Config`): Meta's Llama-3.1-405B-FP8 and its kin.
//!
//! Each quantized Linear stores `weight` as float8_e4m3fn `[out, in]` and
//! `weight_scale` f32 `[out, 1]`, one scale per output row (the scale
//! multiplies). fbgemm has no dequantizer of its own (its kernels are CUDA
//! only): the value is the formula, `f32(weight) · weight_scale[row]`
//! rounded once to the output dtype. `input_scale_ub` (the activations'
//! bound, `activation_scale_ub` in the config) is not a weight.

use std::path::PathBuf;

use safetensors::Dtype;

use super::{
    decoded_output, expect_dtype, fp8_job, fp8_weight, grid_values, list_or_dash, not_converted,
    plan_each, quantized_modules, weight_dims, Modules, QuantConfig, ScaleLayout,
};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result, Rule};
use crate::job::ValueKind;
use crate::numerics::OutDtype;
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "fbgemm-fp8",
    producers: "fbgemm",
    bits: &[8],
    modes: &["fp8 per row"],
};

/// An fbgemm FP8 quantization config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// The activations' scale bound (`activation_scale_ub`), when set.
    pub activation_scale_ub: Option<f64>,
    /// Modules left in high precision (substrings of module names).
    pub modules_to_not_convert: Vec<String>,
}

#[derive(serde::Deserialize)]
struct Raw {
    activation_scale_ub: Option<f64>,
    modules_to_not_convert: Option<Vec<String>>,
}

impl Config {
    /// Reads config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let path = q.path;
        let raw: Raw = q.read()?;
        if raw
            .activation_scale_ub
            .is_some_and(|u| u.is_nan() || u <= 0.0)
        {
            return Err(Error::new(
                Rule::Config,
                path,
                "activation_scale_ub must be a positive number",
            ));
        }
        Ok(Config {
            path: path.to_path_buf(),
            activation_scale_ub: raw.activation_scale_ub,
            modules_to_not_convert: raw.modules_to_not_convert.unwrap_or_default(),
        })
    }

    /// inspect's format line.
    pub fn format_line(&self) -> String {
        "fbgemm_fp8 (fp8 e4m3, f32 scale per row)".into()
    }

    /// `inspect`'s line: the activation bound and the modules left dense.
    pub fn report_lines(&self) -> Vec<String> {
        vec![format!(
            "activation_scale_ub {}; not converted {}",
            self.activation_scale_ub
                .map_or_else(|| "-".to_string(), |u| u.to_string()),
            list_or_dash(&self.modules_to_not_convert)
        )]
    }
}

/// The decoded modules: every F8_E4M3 `weight` and every module with a
/// `weight_scale` (a weight without its scale is an error, never a copy).
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    plan_each(
        ckpt,
        quantized_modules(ckpt, "weight_scale", Dtype::F8_E4M3),
        &["weight", "weight_scale", "input_scale_ub"],
        |m| {
            not_converted(&cfg.modules_to_not_convert, m)
                .then_some("listed in modules_to_not_convert but stored as FP8; decoded anyway")
        },
        |m, _| plan_module(ckpt, m, dtype),
    )
}

fn plan_module<'c>(ckpt: &'c Checkpoint, module: &str, out: OutDtype) -> Result<Output<'c>> {
    let (w, scale) = fp8_weight(ckpt, module, "weight_scale")?;
    expect_dtype(&scale, &[Dtype::F32])?;
    let dims = weight_dims(&w)?;
    // `[out, 1]` (or `[out]`): one per row; grid_values checks the count.
    let values = grid_values(scale, ValueKind::F32, ScaleLayout::Channel, dims)?;
    let job = fp8_job(&w, dims, out).with_scale(values);
    Ok(decoded_output(
        module,
        w.shard,
        w.shape.to_vec(),
        job,
        "fbgemm_fp8 fp8 e4m3 per-channel".into(),
    ))
}

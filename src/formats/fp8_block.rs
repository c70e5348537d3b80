//! DeepSeek-style FP8 (`quant_method: "fp8"`, transformers'
//! `FineGrainedFP8Config`): DeepSeek-V3/R1, Qwen3 FP8, MiniMax, GLM FP8, …
//!
//! Each quantized Linear stores `weight` as float8_e4m3fn `[out, in]` and
//! `weight_scale_inv` `[ceil(out/bh), ceil(in/bw)]` (edge blocks partial).
//! The value is `f32(weight) × weight_scale_inv` of its block, rounded once
//! to the output dtype, as compressed-tensors' `FP8BlockDequantizer`.

use std::path::PathBuf;

use safetensors::Dtype;
use serde_json::Value;

use super::{
    decoded_output, float_kind, fp8_job, fp8_weight, grid_values, list_or_dash, not_converted,
    plan_each, quantized_modules, weight_dims, Modules, QuantConfig, ScaleLayout,
};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result, Rule};
use crate::numerics::OutDtype;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "fp8-block",
    producers: "DeepSeek-style FP8",
    bits: &[8],
    modes: &["fp8 block scales"],
};

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
}

#[derive(serde::Deserialize)]
struct Raw {
    fmt: Option<String>,
    activation_scheme: Option<String>,
    modules_to_not_convert: Option<Vec<String>>,
}

impl Config {
    /// Reads config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let path = q.path;
        let raw: Raw = q.read()?;
        super::only_setting(path, "fp8 fmt", raw.fmt.as_deref(), "e4m3")?;
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
        })
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
            "activations {}; not converted {}",
            self.activation_scheme.as_deref().unwrap_or("-"),
            list_or_dash(&self.modules_to_not_convert)
        )]
    }

    /// inspect's format line: `fp8 e4m3 block 128x128 (weight_scale_inv)`.
    pub fn format_line(&self) -> String {
        format!("fp8 e4m3 {} (weight_scale_inv)", self.layout().describe())
    }
}

/// The decoded modules: every module with a `weight_scale_inv`, and every
/// FP8 `weight` (one without its scale is an error, never a copy).
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    plan_each(
        ckpt,
        quantized_modules(ckpt, "weight_scale_inv", Dtype::F8_E4M3),
        &["weight", "weight_scale_inv"],
        |m| {
            not_converted(&cfg.modules_to_not_convert, m)
                .then_some("listed in modules_to_not_convert but stored as FP8; decoded anyway")
        },
        |m, _| {
            let (w, scale) = fp8_weight(ckpt, m, "weight_scale_inv")?;
            let dims = weight_dims(&w)?;
            let values = grid_values(scale, float_kind(&scale)?, cfg.layout(), dims)?;
            let job = fp8_job(&w, dims, dtype).with_scale(values);
            Ok(decoded_output(m, w.shard, w.shape.to_vec(), job, cfg.format_line()))
        },
    )
}

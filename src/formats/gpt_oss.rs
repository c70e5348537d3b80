//! OpenAI's native MXFP4 (`quant_method: "mxfp4"`), as GPT-OSS ships its
//! experts.
//!
//! Each quantized parameter `<p>` is stored as `<p>_blocks` uint8
//! `[E, out, in/32, 16]` (two E2M1 codes per byte, the low nibble first) and
//! `<p>_scales` uint8 `[E, out, in/32]` (E8M0, one per 32 codes). The dense
//! parameter is the transpose, `<p>` `[E, in, out]`: `gate_up_proj`
//! `[E, H, 2I]` and `down_proj` `[E, I, H]`, as transformers'
//! `Mxfp4Config(dequantize=True)` writes them. Everything else (biases,
//! router, attention, embeddings: `modules_to_not_convert`) is stored dense.

use std::path::PathBuf;

use safetensors::Dtype;

use super::{
    byte_table, check_extent, e2m1_values, expect_dtype, grid_values, list_or_dash, missing,
    plan_each, Glob, Modules, QuantConfig, ScaleLayout, Target, Targets,
};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Result, Rule};
use crate::job::{DecodeJob, Dims, Fields};
use crate::numerics::{self, OutDtype};
use crate::output::{Output, Source};

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "gpt-oss",
    producers: "OpenAI GPT-OSS",
    bits: &[4],
    modes: &["mxfp4"],
};

/// Codes per scale: an MX "block", a group in [`ScaleLayout`] terms.
const GROUP: usize = 32;

/// A GPT-OSS MXFP4 config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// Modules stored dense (globs).
    pub modules_to_not_convert: Targets,
}

#[derive(serde::Deserialize)]
struct Raw {
    modules_to_not_convert: Option<Vec<String>>,
}

impl Config {
    /// inspect's format line.
    pub fn format_line(&self) -> String {
        "gpt-oss mxfp4 (e8m0 group 32, experts transposed)".into()
    }

    /// `inspect`'s line: the modules stored dense.
    pub fn report_lines(&self) -> Vec<String> {
        let kept: Vec<&str> = self
            .modules_to_not_convert
            .iter()
            .map(Target::text)
            .collect();
        vec![format!("not converted {}", list_or_dash(&kept))]
    }

    /// Reads config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let path = q.path;
        let raw: Raw = q.read()?;
        Ok(Config {
            path: path.to_path_buf(),
            modules_to_not_convert: raw
                .modules_to_not_convert
                .unwrap_or_default()
                .iter()
                .map(|s| Target::Glob(Glob::new(s)))
                .collect(),
        })
    }
}

/// The quantized parameters: every `<p>_blocks` (and every `<p>_scales`, so
/// that one without its blocks is an error, never a copy).
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let params: std::collections::BTreeSet<&str> = ckpt
        .names()
        .into_iter()
        .filter_map(|n| {
            n.strip_suffix("_blocks")
                .or_else(|| n.strip_suffix("_scales"))
        })
        .collect();
    let mut found = plan_each(
        ckpt,
        params.iter().copied(),
        &[],
        |p| {
            cfg.modules_to_not_convert
                .names_module(p)
                .then_some("listed in modules_to_not_convert but stored as MXFP4; decoded anyway")
        },
        |p, _| plan_param(ckpt, p, dtype),
    );
    for p in params {
        for suffix in ["blocks", "scales"] {
            let name = format!("{p}_{suffix}");
            if ckpt.get(&name).is_some() {
                found.consumed.insert(name);
            }
        }
    }
    found
}

fn tensor<'c>(ckpt: &'c Checkpoint, param: &str, suffix: &str) -> Result<TensorRef<'c>> {
    let name = format!("{param}_{suffix}");
    ckpt.get(&name).ok_or_else(|| {
        let why = format!("{param} is stored as MXFP4 but has no {param}_{suffix}");
        missing(ckpt, name, why)
    })
}

fn plan_param<'c>(ckpt: &'c Checkpoint, param: &str, out: OutDtype) -> Result<Output<'c>> {
    let blocks = tensor(ckpt, param, "blocks")?;
    expect_dtype(&blocks, &[Dtype::U8])?;
    let scales = tensor(ckpt, param, "scales")?;
    expect_dtype(&scales, &[Dtype::U8, Dtype::F8_E8M0])?;
    let (slices, rows, groups) = match *blocks.shape {
        [e, r, g, 16] => (e, r, g),
        [r, g, 16] => (1, r, g),
        _ => {
            return Err(blocks.error(
                Rule::TensorShape,
                format!(
                    "shape {:?}; MXFP4 blocks are [experts, out, in/32, 16] or [out, in/32, 16]",
                    blocks.shape
                ),
            ))
        }
    };
    if blocks.shape.contains(&0) {
        return Err(blocks.error(Rule::TensorShape, "has no elements"));
    }
    let stored = Dims {
        slices,
        rows,
        cols: groups.saturating_mul(GROUP),
    };
    let row_bytes = groups * GROUP / 2;
    let codes = Fields::dense(blocks, 4, row_bytes as u64 * 8)
        .with_slice_bits((rows * row_bytes) as u64 * 8);
    check_extent(&blocks, &codes, slices, rows, stored.cols)?;
    let scale = grid_values(
        scales,
        byte_table(numerics::e8m0),
        ScaleLayout::Group(GROUP),
        stored,
    )?;
    let job = DecodeJob::new(stored, codes, e2m1_values(), out)
        .with_scale(scale)
        .transpose();
    let mut shape = vec![job.dims.rows, job.dims.cols];
    if blocks.shape.len() == 4 {
        shape.insert(0, slices);
    }
    Ok(Output {
        name: param.to_string(),
        shard: blocks.shard,
        shape,
        dtype: out.safetensors(),
        source: Source::Decode(Box::new(job)),
        scheme: Some("mxfp4 fp4 e8m0 group 32, transposed".into()),
    })
}

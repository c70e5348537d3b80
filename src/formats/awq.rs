//! AutoAWQ GEMM checkpoints (`quant_method: "awq"`, `version: "gemm"`).
//!
//! A quantized Linear stores its weight transposed, `[in, out]`:
//!
//! | tensor | dtype | shape | holds |
//! |---|---|---|---|
//! | `qweight` | int32 | `[in, out/8]` | 4-bit codes q, eight per word |
//! | `qzeros` | int32 | `[in/group, out/8]` | 4-bit zero points z, same packing |
//! | `scales` | f16 | `[in/group, out]` | one scale s per group |
//!
//! Inside a word, field k holds column `8j + [0, 2, 4, 6, 1, 3, 5, 7][k]`
//! (even columns in the low half). The value is `(q − z) · s`, written
//! `[out, in]`; without zero points it is `(q − 8) · s`, as compressed-tensors'
//! `AutoAWQConverter` reads such a checkpoint.

use std::path::PathBuf;

use safetensors::Dtype;

use super::{
    check_extent, decoded_output, expect_dtype, expect_shape, float_kind, grid_values,
    list_or_dash, matrix_dims, modules_with, plan_each, require, Modules, QuantConfig, ScaleLayout,
};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule};
use crate::job::{DecodeJob, Dims, Fields, ZeroPoint};
use crate::numerics::OutDtype;
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "awq",
    producers: "AutoAWQ",
    bits: &[BITS],
    modes: &["gemm"],
};

/// Bits per code: the only width AutoAWQ GEMM writes.
pub const BITS: u32 = 4;

/// An AutoAWQ quantization config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// Input columns per scale; `None` (AutoAWQ's -1): one group per row.
    pub group_size: Option<usize>,
    /// Whether `qzeros` are stored (asymmetric).
    pub zero_point: bool,
    /// Modules left in high precision.
    pub modules_to_not_convert: Vec<String>,
}

#[derive(serde::Deserialize)]
struct Raw {
    bits: Option<u32>,
    group_size: Option<i64>,
    zero_point: Option<bool>,
    version: Option<String>,
    modules_to_not_convert: Option<Vec<String>>,
}

impl Config {
    /// Reads config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let path = q.path;
        let raw: Raw = q.read()?;
        super::only_setting(path, "AWQ version", raw.version.as_deref(), "gemm")?;
        let bits = raw.bits.unwrap_or(BITS);
        if bits != BITS {
            return Err(Error::new(
                Rule::Unsupported,
                path,
                format!("AWQ bits {bits} is not decoded (only 4)"),
            ));
        }
        let group_size = super::group_size(raw.group_size, path)?;
        Ok(Config {
            path: path.to_path_buf(),
            group_size,
            zero_point: raw.zero_point.unwrap_or(true),
            modules_to_not_convert: raw.modules_to_not_convert.unwrap_or_default(),
        })
    }

    /// `inspect`'s line: the modules left in high precision.
    pub fn report_lines(&self) -> Vec<String> {
        vec![format!(
            "not converted {}",
            list_or_dash(&self.modules_to_not_convert)
        )]
    }

    /// inspect's format line, and the scheme of each module.
    pub fn format_line(&self) -> String {
        format!("autoawq gemm {}", self.describe())
    }

    /// For people: `int4 group 128 asym`.
    pub fn describe(&self) -> String {
        format!(
            "int4 {} {}",
            ScaleLayout::of_group(self.group_size).describe(),
            if self.zero_point { "asym" } else { "sym" }
        )
    }
}

/// The decoded modules: every module with a `qweight`.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    plan_each(
        ckpt,
        modules_with(ckpt, "qweight"),
        &["qweight", "qzeros", "scales"],
        |m| {
            super::not_converted(&cfg.modules_to_not_convert, m)
                .then_some("listed in modules_to_not_convert but stored as AWQ; decoded anyway")
        },
        |m, _| {
            let (job, shard) = module_job(cfg, ckpt, m, dtype)?;
            let shape = vec![job.dims.rows, job.dims.cols];
            Ok::<Output<'c>, Error>(decoded_output(m, shard, shape, job, cfg.format_line()))
        },
    )
}

/// 4-bit fields of an `[n, out/8]` int32 tensor in AutoAWQ's word order:
/// lane = row, index = output column.
fn awq_fields<'c>(t: &TensorRef<'c>, width: usize) -> Fields<'c> {
    Fields::padded(*t, BITS, width as u64 * 32).interleaved()
}

/// The job of one module, `[out, in]`, and the shard its `qweight` is in.
pub(crate) fn module_job<'c>(
    cfg: &Config,
    ckpt: &'c Checkpoint,
    module: &str,
    out: OutDtype,
) -> Result<(DecodeJob<'c>, usize)> {
    let q = require(ckpt, module, "qweight")?;
    expect_dtype(&q, &[Dtype::I32])?;
    let (inputs, width) = matrix_dims(&q, "AWQ qweight is [in, out/8]")?;
    // Stored orientation: `inputs` rows of `outputs` columns.
    let stored = Dims {
        slices: 1,
        rows: inputs,
        cols: width.saturating_mul(8),
    };
    let codes = awq_fields(&q, width);
    check_extent(&q, &codes, 1, stored.rows, stored.cols)?;
    let group = cfg.group_size.unwrap_or(inputs);
    let layout = ScaleLayout::Block(group, 1);
    let s = require(ckpt, module, "scales")?;
    let scale = grid_values(s, float_kind(&s)?, layout, stored)?;
    let zero = if cfg.zero_point {
        let z = require(ckpt, module, "qzeros")?;
        expect_dtype(&z, &[Dtype::I32])?;
        let lanes = inputs.div_ceil(group);
        expect_shape(
            &z,
            &[lanes, width],
            format_args!(
                "the zero points of a {}x{} AWQ weight in groups of {group} are [{lanes}, {width}]",
                stored.cols, stored.rows
            ),
        )?;
        let fields = awq_fields(&z, width);
        check_extent(&z, &fields, 1, lanes, stored.cols)?;
        Some(ZeroPoint::PackedAlongCols { fields })
    } else {
        None
    };
    // Codes and zero points as compressed-tensors holds them, q − 8; the
    // offsets cancel in (q − 8) − (z − 8).
    let code_values = (0..16).map(|c| c as f32 - 8.0).collect::<Vec<f32>>();
    let job = DecodeJob::new(stored, codes, code_values, out)
        .with_scale(scale)
        .with_zero(zero);
    Ok((job.transpose(), q.shard))
}

//! BitNet b1.58 (`quant_method: "bitnet"`, transformers' `BitNetQuantConfig`):
//! microsoft/bitnet-b1.58-2B-4T, the Falcon3 1.58-bit models.
//!
//! Each quantized Linear stores `weight` uint8 `[out/4, in]`, four ternary
//! values a byte as transformers' `pack_weights` writes them: output row
//! `i·P + j` (P the stored rows) lies in bits `2i..2i+2` of stored row `j`,
//! code `c` meaning `c − 1` (`unpack_weights`; a code 3, which packing never
//! writes, reads as 2 there and here). `weight_scale` holds one value in
//! the model's dtype. `BitLinear` (the default `linear_class`) divides its
//! product by the scale, so the dense weight is `(c − 1) / s`; `AutoBitLinear`
//! offline multiplies it, `(c − 1) · s`. With `c − 1` in {−1, 0, 1, 2} both
//! equal `(c − 1) · f32(1/s)` (resp. `· s`) exactly in f32, so the job takes
//! that one factor as its per-tensor scale and rounds once, as the producer's
//! division rounds once. Slices of the job are the four bit pairs of a
//! byte, its lanes the stored rows, a field a byte apart.
//!
//! Activations are quantized to int8 per token at run time; a dense model
//! does not do that, which the plan says in a finding (`--strict` refuses it).

use std::path::PathBuf;

use safetensors::Dtype;
use serde_json::Value;

use super::{
    decoded_output, expect_dtype, list_or_dash, not_converted, plan_each, quantized_modules,
    require, Modules, QuantConfig, ScaleLayout,
};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result, Rule, Warning};
use crate::hf::config::Sizes;
use crate::job::{Bytes, DecodeJob, Dims, Fields, ValueKind, Values};
use crate::numerics::OutDtype;
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "bitnet",
    producers: "BitNet b1.58 (transformers)",
    bits: &[2],
    modes: &["bitlinear (ternary, per-tensor scale)", "autobitlinear (offline)"],
};

/// Ternary values a byte.
const PER_BYTE: usize = 4;

/// A BitNet quantization config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// `AutoBitLinear` (its scale multiplies) rather than `BitLinear` (its
    /// scale divides).
    pub auto_bit_linear: bool,
    /// Modules left in high precision (substrings of module names).
    pub modules_to_not_convert: Vec<String>,
    /// The model's Linear shapes by config.json, for the check of each
    /// stored pack.
    #[serde(skip)]
    shapes: Option<Shapes>,
}

/// The keys of `BitNetQuantConfig` read here (`rms_norm_eps` only matters
/// with `use_rms_norm`, which is refused).
#[derive(serde::Deserialize)]
struct Raw {
    modules_to_not_convert: Option<Vec<String>>,
    use_rms_norm: Option<bool>,
    linear_class: Option<String>,
    quantization_mode: Option<String>,
}

impl Config {
    /// Reads config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let (raw, path): (Raw, _) = (q.read()?, q.path);
        let auto_bit_linear = match raw.linear_class.as_deref() {
            None | Some("bitlinear") => false,
            Some("autobitlinear") => true,
            Some(other) => {
                return Err(Error::new(
                    Rule::Config,
                    path,
                    format!("linear_class {other:?}: transformers knows bitlinear and autobitlinear"),
                ))
            }
        };
        match raw.quantization_mode.as_deref() {
            None | Some("offline") => {}
            Some("online") => {
                return Err(Error::new(
                    Rule::Unsupported,
                    path,
                    "quantization_mode \"online\": the weights are stored in full precision and ternarized at every forward pass; there are no packed weights to decode",
                ))
            }
            Some(other) => {
                return Err(Error::new(
                    Rule::Config,
                    path,
                    format!("quantization_mode {other:?}: expected offline or online"),
                ))
            }
        }
        if raw.use_rms_norm == Some(true) {
            return Err(Error::new(
                Rule::Unsupported,
                path,
                "use_rms_norm true: each BitLinear normalizes its input with an RMSNorm a dense Linear has no place for",
            ));
        }
        let shapes = q
            .ckpt
            .config
            .as_ref()
            .and_then(|c| Shapes::of(&c.value));
        Ok(Config {
            path: path.to_path_buf(),
            auto_bit_linear,
            modules_to_not_convert: raw.modules_to_not_convert.unwrap_or_default(),
            shapes,
        })
    }

    /// inspect's format line.
    pub fn format_line(&self) -> String {
        let (class, op) = match self.auto_bit_linear {
            false => ("BitLinear", "divided by"),
            true => ("AutoBitLinear", "times"),
        };
        format!("bitnet ternary (2-bit, four rows a byte, {op} a per-tensor weight_scale; {class})")
    }

    /// `inspect`'s lines: the run-time activation quantization and the
    /// modules left dense.
    pub fn report_lines(&self) -> Vec<String> {
        vec![
            "activations quantized to int8 per token at run time (not in the dense model)".into(),
            format!(
                "not converted {}",
                list_or_dash(&self.modules_to_not_convert)
            ),
        ]
    }
}

/// The Linear shapes `[out, in]` of a Llama-style decoder (BitNet's) by
/// config.json.
#[derive(Debug, Clone, Copy)]
struct Shapes {
    hidden: usize,
    intermediate: usize,
    q: usize,
    kv: usize,
}

impl Shapes {
    /// config.json's sizes, when it gives all four (else no check).
    fn of(cfg: &Value) -> Option<Shapes> {
        let s = Sizes::of(cfg)?;
        Some(Shapes {
            hidden: s.hidden,
            intermediate: s.intermediate?,
            q: s.q?,
            kv: s.kv?,
        })
    }

    /// `[out, in]` of the module config.json sizes, by its last name.
    fn of_module(self, module: &str) -> Option<(usize, usize)> {
        let h = self.hidden;
        Some(match module.rsplit('.').next()? {
            "q_proj" => (self.q, h),
            "k_proj" | "v_proj" => (self.kv, h),
            "o_proj" => (h, self.q),
            "gate_proj" | "up_proj" => (self.intermediate, h),
            "down_proj" => (h, self.intermediate),
            _ => return None,
        })
    }
}

/// The decoded modules: every module with a `weight_scale` and every uint8
/// `weight` (a weight without its scale is an error, never a copy); one
/// finding says the activations' run-time quantization is gone.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let packed = quantized_modules(ckpt, "weight_scale", Dtype::U8);
    let listed = |m: &str| {
        not_converted(&cfg.modules_to_not_convert, m)
            .then_some("listed in modules_to_not_convert but stored packed; decoded anyway")
    };
    let build = |m: &str, _: &mut Vec<Warning>| plan_module(cfg, ckpt, m, dtype);
    let mut found = plan_each(ckpt, packed, &["weight", "weight_scale"], listed, build);
    if !found.outputs.is_empty() {
        found.warnings.push(Warning::new(
            Rule::Unstated,
            "quantization_config",
            "BitNet quantizes each BitLinear's input to int8 per token at run time; the dense model's Linear layers take their input as it is, so it is not the same model (its outputs differ)",
        ));
    }
    found
}

fn plan_module<'c>(cfg: &Config, ckpt: &'c Checkpoint, module: &str, out: OutDtype) -> Result<Output<'c>> {
    let w = require(ckpt, module, "weight")?;
    expect_dtype(&w, &[Dtype::U8])?;
    let scale = require(ckpt, module, "weight_scale")?;
    let (stored, cols) = super::matrix_dims(&w, "a packed BitNet weight is [out/4, in]")?;
    let rows = stored.saturating_mul(PER_BYTE);
    if let Some((o, i)) = cfg.shapes.and_then(|s| s.of_module(module)) {
        if (rows, cols) != (o, i) {
            return Err(w.error(
                Rule::TensorShape,
                format!(
                    "shape {:?} holds a {rows}x{cols} weight; config.json's sizes make it {o}x{i} (stored [{}, {i}])",
                    w.shape,
                    o / PER_BYTE
                ),
            ));
        }
    }
    if cfg.auto_bit_linear && ckpt.get(&format!("{module}.bias")).is_some() {
        return Err(w.error(
            Rule::Unsupported,
            "AutoBitLinear multiplies its bias by weight_scale too; a dense Linear's bias is not scaled",
        ));
    }
    let factor = scale_factor(cfg, &scale)?;
    let dims = Dims {
        slices: PER_BYTE,
        rows: stored,
        cols,
    };
    // Bit pair i of byte (j, c) is output row i·P + j, column c.
    let codes = Fields::new(w, 2, 1, cols as u64 * 8)
        .with_word_bits(8)
        .with_slice_bits(2);
    super::check_extent(&w, &codes, PER_BYTE, stored, cols)?;
    let values = Values {
        data: Bytes::Owned(factor.to_le_bytes().to_vec().into()),
        kind: ValueKind::F32,
        grid: ScaleLayout::Tensor.grid(dims).0,
    };
    let ternary = vec![-1.0, 0.0, 1.0, 2.0];
    let job = DecodeJob::new(dims, codes, ternary, out).with_scale(values);
    Ok(decoded_output(
        module,
        w.shard,
        vec![rows, cols],
        job,
        cfg.format_line(),
    ))
}

/// The factor each ternary value is multiplied by: `1/s` for BitLinear,
/// `s` for AutoBitLinear, from the one finite, non-zero stored scale.
fn scale_factor(cfg: &Config, scale: &crate::checkpoint::TensorRef<'_>) -> Result<f32> {
    expect_dtype(scale, &[Dtype::BF16, Dtype::F16, Dtype::F32])?;
    if scale.elements() != 1 || scale.shape.len() > 1 {
        return Err(scale.error(
            Rule::TensorShape,
            format!(
                "shape {:?}; one value per tensor is expected ([1])",
                scale.shape
            ),
        ));
    }
    let s = scale.floats()?.first().copied().unwrap_or(f32::NAN);
    if !s.is_finite() || s == 0.0 {
        return Err(scale.error(
            Rule::TensorValue,
            format!("weight_scale {s}: every weight would be infinite or NaN"),
        ));
    }
    Ok(if cfg.auto_bit_linear { s } else { 1.0 / s })
}

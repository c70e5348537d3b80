//! Gemma's own pre-quantized checkpoints (`quant_method: "gemma"`,
//! transformers' `GemmaQuantizationConfig`, `integrations/gemma_quant.py`,
//! read at 5.25).
//!
//! Each quantized Linear (`QuantizedLinear`) stores `weight` as int2 or int4
//! codes packed in uint8 `[out, ⌈in/4⌉]` / `[out, ⌈in/2⌉]`, the first field
//! of a byte in its low bits (int4: low nibble first, code − 8; int2: bits
//! 1:0 first, code − 2; a row's padding fields dropped), or int8 `[out,
//! in]`, with `weight_scale` f32 `[out, 1]`. `_dequantize_weights(dtype)`
//! computes `int.to(dtype) * weight_scale.to(dtype)`: the scale rounded to
//! the output dtype and the product in it ([`Product::OutDtype`]). A
//! quantized embedding (`QuantizedEmbedding`, `quantize_embeddings`) stores
//! `embedding_quantized` the same way and `embedding_scale` f32 `[vocab, B]`:
//! B blocks of `dim / B` columns a row, each scale repeated over its block.
//!
//! The bit width of a module is `num_bits` unless `module_quant_configs`
//! overrides it: its keys joined into one alternation
//! `(?P<g0>k0)|(?P<g1>k1)|…` and searched (`re.search`) in the module name,
//! so the match that starts leftmost wins, and among matches starting at the
//! same place the first key. Modules named by `modules_to_not_convert` (a
//! prefix up to a module boundary, a regex with that boundary, or a suffix)
//! stay dense.
//!
//! What the dense model drops: SRQ activation scales
//! (`input_activation_scale`, `output_activation_scale`: a calibrated one,
//! non-zero, rounds the Linear's input or output to int8 steps at run time;
//! 0 is a no-op) and the KV-cache scales (`k_cache_scale`, `v_cache_scale`,
//! which transformers itself leaves unloaded for external tooling). Each run
//! that drops calibrated ones names them in a warning, and `--strict`
//! refuses. A quantized embedding multiplies its rows by `embed_scale` as a
//! Python float (f32); a dense Gemma multiplies by `embed_scale` rounded to
//! the model's dtype, which also is a warning for a 16-bit output.

use std::path::PathBuf;

use fancy_regex::Regex;
use safetensors::Dtype;
use serde_json::Value;

use super::{
    decoded_output, expect_dtype, float_kind, grid_values, list_or_dash, modules_with,
    plan_each, require, Modules, QuantConfig, ScaleLayout,
};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result, Rule, Warning};
use crate::hf::config::Sizes;
use crate::job::{DecodeJob, Dims, Fields, Product};
use crate::numerics::OutDtype;
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "gemma",
    producers: "Google's Gemma quantized releases (transformers GemmaQuantizationConfig)",
    bits: &[2, 4, 8],
    modes: &[
        "int2/int4/int8, f32 scale per row",
        "embeddings: f32 scale per row block",
    ],
};

/// The widths `QuantizedLinear` stores (any other is read as int8 there).
const BITS: [u32; 3] = [2, 4, 8];

/// A Gemma quantization config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// The default width.
    pub num_bits: u32,
    /// Whether embeddings are quantized too.
    pub quantize_embeddings: bool,
    /// `module_quant_configs`: pattern and the width it gives, in order.
    pub module_quant_configs: Vec<(String, u32)>,
    /// Modules left dense (`None`: transformers' defaults, the output
    /// embedding, the last module and tied ones).
    pub modules_to_not_convert: Option<Vec<String>>,
    #[serde(skip)]
    matcher: Option<Regex>,
    #[serde(skip)]
    skip: super::ModuleKeys,
    /// The text model's sizes by config.json (`text_config` when there is
    /// one).
    #[serde(skip)]
    shapes: Option<Sizes>,
}

#[derive(serde::Deserialize)]
struct Raw {
    num_bits: Option<i64>,
    quantize_embeddings: Option<bool>,
    module_quant_configs: Option<serde_json::Map<String, Value>>,
    modules_to_not_convert: Option<Vec<String>>,
}

impl Config {
    /// Reads config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let (raw, path): (Raw, _) = (q.read()?, q.path);
        let width = |b: i64, what: &str| match u32::try_from(b) {
            Ok(b) if BITS.contains(&b) => Ok(b),
            _ => Err(Error::new(
                Rule::Unsupported,
                path,
                format!("{what} {b}: Gemma's quantized layers store 2, 4 or 8 bits"),
            )),
        };
        let num_bits = width(raw.num_bits.unwrap_or(4), "num_bits")?;
        let mut module_quant_configs = Vec::new();
        for (key, over) in raw.module_quant_configs.unwrap_or_default() {
            let Value::Object(o) = over else {
                return Err(Error::new(
                    Rule::Config,
                    path,
                    format!("module_quant_configs: {key:?} does not map to an object"),
                ));
            };
            if let Some(k) = o.keys().find(|k| *k != "num_bits") {
                return Err(Error::new(
                    Rule::Unsupported,
                    path,
                    format!("module_quant_configs: {key:?} sets {k:?}; only num_bits is understood (transformers passes it to the layer, which takes no other)"),
                ));
            }
            let bits = match o.get("num_bits") {
                None | Some(Value::Null) => num_bits,
                Some(v) => match v.as_i64() {
                    Some(b) => width(b, &format!("module_quant_configs: {key:?} num_bits"))?,
                    None => {
                        return Err(Error::new(
                            Rule::Config,
                            path,
                            format!("module_quant_configs: {key:?} num_bits {v} is not an integer"),
                        ))
                    }
                },
            };
            module_quant_configs.push((key, bits));
        }
        let matcher = match module_quant_configs.is_empty() {
            true => None,
            false => {
                let alternation = module_quant_configs
                    .iter()
                    .enumerate()
                    .map(|(i, (k, _))| format!("(?P<g{i}>{k})"))
                    .collect::<Vec<_>>()
                    .join("|");
                Some(Regex::new(&alternation).map_err(|e| {
                    Error::new(
                        Rule::Config,
                        path,
                        format!("module_quant_configs: the keys are not regexes this tool reads: {e}"),
                    )
                })?)
            }
        };
        let skip = super::ModuleKeys::new(
            path,
            "modules_to_not_convert",
            raw.modules_to_not_convert.iter().flatten(),
        )?;
        let shapes = q
            .ckpt
            .config
            .as_ref()
            .and_then(|c| Sizes::of(c.value.get("text_config").unwrap_or(&c.value)));
        Ok(Config {
            path: path.to_path_buf(),
            num_bits,
            quantize_embeddings: raw.quantize_embeddings.unwrap_or(false),
            module_quant_configs,
            modules_to_not_convert: raw.modules_to_not_convert,
            matcher,
            skip,
            shapes,
        })
    }

    /// The width transformers gives `module`: the leftmost match of the
    /// joined `module_quant_configs` keys, else `num_bits`.
    pub fn bits(&self, module: &str) -> u32 {
        let Some(re) = &self.matcher else {
            return self.num_bits;
        };
        let Ok(Some(caps)) = re.captures(module) else {
            return self.num_bits;
        };
        self.module_quant_configs
            .iter()
            .enumerate()
            .find(|(i, _)| caps.name(&format!("g{i}")).is_some())
            .map_or(self.num_bits, |(_, (_, b))| *b)
    }

    /// Whether `modules_to_not_convert` leaves `module` dense
    /// (transformers' `should_convert_module`).
    pub fn skipped(&self, module: &str) -> bool {
        self.skip.matches(module)
    }

    /// inspect's format line.
    pub fn format_line(&self) -> String {
        format!(
            "gemma int{} (f32 scale per row{})",
            self.num_bits,
            super::when(self.quantize_embeddings, "; embeddings per row block")
        )
    }

    /// `inspect`'s lines: the overrides and the modules left dense.
    pub fn report_lines(&self) -> Vec<String> {
        let overrides: Vec<String> = self
            .module_quant_configs
            .iter()
            .map(|(k, b)| format!("{k} → int{b}"))
            .collect();
        vec![
            format!("module_quant_configs {}", list_or_dash(&overrides)),
            format!(
                "not converted {}",
                self.modules_to_not_convert
                    .as_deref()
                    .map_or_else(|| "(transformers' defaults)".into(), list_or_dash)
            ),
            "activation (SRQ) and KV-cache scales are not in the dense model".into(),
        ]
    }
}

/// What Gemma reads of its text model's sizes.
trait Shapes {
    fn embed_scale(self, module: &str) -> Option<f32>;
    fn of_module(self, module: &str) -> Option<(Option<usize>, usize)>;
}

impl Shapes for Sizes {
    /// The `embed_scale` Gemma's text models give embedding `module`
    /// (`√hidden_size`; per-layer embeddings `√hidden_size_per_layer_input`).
    fn embed_scale(self, module: &str) -> Option<f32> {
        let width = match module.rsplit('.').next()? {
            "embed_tokens" => self.hidden,
            "embed_tokens_per_layer" => self.per_layer_hidden?,
            _ => return None,
        };
        Some((width as f64).sqrt() as f32)
    }

    /// `[out, in]` of a text module config.json sizes (vision and audio
    /// towers have sizes of their own, not read here).
    fn of_module(self, module: &str) -> Option<(Option<usize>, usize)> {
        if module.contains("vision") || module.contains("audio") {
            return None;
        }
        let h = self.hidden;
        Some(match module.rsplit('.').next()? {
            "q_proj" => (self.q, h),
            "k_proj" | "v_proj" => (self.kv, h),
            "o_proj" => (Some(h), self.q?),
            "gate_proj" | "up_proj" => (self.intermediate, h),
            "down_proj" => (Some(h), self.intermediate?),
            "embed_tokens" | "lm_head" => (self.vocab, h),
            "embed_tokens_per_layer" => {
                let (v, w) = self.per_layer?;
                (Some(v), w)
            }
            _ => return None,
        })
    }
}

/// The decoded modules: every Linear with a `weight_scale` or an 8-bit
/// `weight`, every embedding with `embedding_quantized` or
/// `embedding_scale`; the activation and KV-cache scales consumed, the
/// calibrated ones named in a warning.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let linears: std::collections::BTreeSet<&str> = modules_with(ckpt, "weight_scale")
        .into_iter()
        .chain(modules_with(ckpt, "weight").into_iter().filter(|m| {
            ckpt.get(&format!("{m}.weight"))
                .is_some_and(|t| matches!(t.dtype, Dtype::U8 | Dtype::I8))
        }))
        .collect();
    let embeddings: std::collections::BTreeSet<&str> = modules_with(ckpt, "embedding_quantized")
        .into_iter()
        .chain(modules_with(ckpt, "embedding_scale"))
        .collect();
    let mut guessed = Vec::new();
    let listed = |m: &str| {
        cfg.skipped(m)
            .then_some("listed in modules_to_not_convert but stored quantized; decoded anyway")
    };
    let mut found = plan_each(ckpt, linears, &["weight", "weight_scale"], listed, |m, _| {
        plan_module(cfg, ckpt, m, dtype, Kind::Linear, &mut guessed)
    });
    let unasked = |m: &str| {
        if !cfg.quantize_embeddings {
            Some("stored quantized but quantize_embeddings is false; decoded anyway")
        } else {
            listed(m)
        }
    };
    let emb = plan_each(
        ckpt,
        embeddings.iter().copied(),
        &["embedding_quantized", "embedding_scale"],
        unasked,
        |m, _| plan_module(cfg, ckpt, m, dtype, Kind::Embedding, &mut guessed),
    );
    found.outputs.extend(emb.outputs);
    found.consumed.extend(emb.consumed);
    found.errors.extend(emb.errors);
    found.warnings.extend(emb.warnings);
    if !guessed.is_empty() {
        found.warnings.push(Warning::new(
            Rule::Unstated,
            "quantization_config",
            format!(
                "config.json does not size {}: its packed rows are taken as holding no padding field (in = stored bytes × codes a byte)",
                short_list(&guessed)
            ),
        ));
    }
    if dtype != OutDtype::F32 {
        for m in &embeddings {
            let s = cfg.shapes.and_then(|s| s.embed_scale(m));
            let detail = match s {
                Some(s) if dtype.round(s) == s => continue,
                Some(s) => format!(
                    "the quantized {m} multiplies its rows by embed_scale {s} (f32); a dense Gemma multiplies by it rounded to {} ({}), so embedding outputs can differ in their last bit",
                    dtype.torch_name(),
                    dtype.round(s)
                ),
                None => format!(
                    "the quantized {m} multiplies its rows by its embed_scale in f32; a dense Gemma embedding multiplies by it rounded to {}, so, unless that scale is a {} value, embedding outputs can differ in their last bit",
                    dtype.torch_name(),
                    dtype.torch_name()
                ),
            };
            found
                .warnings
                .push(Warning::new(Rule::Unstated, "quantization_config", detail));
        }
    }
    dropped_scales(ckpt, &mut found);
    found
}

/// Consumes every SRQ and KV-cache scale; names the calibrated (non-zero)
/// activation scales and the KV-cache scales in warnings.
fn dropped_scales(ckpt: &Checkpoint, found: &mut Modules<'_>) {
    let (mut calibrated, mut kv) = (Vec::new(), Vec::new());
    for name in ckpt.names() {
        let Some((module, last)) = name.rsplit_once('.') else {
            continue;
        };
        match last {
            "input_activation_scale" | "output_activation_scale" => {
                found.consumed.insert(name.to_string());
                let live = ckpt
                    .get(name)
                    .and_then(|t| t.floats().ok())
                    .is_none_or(|v| v.iter().any(|&x| x != 0.0));
                if live {
                    calibrated.push(format!("{module}.{last}"));
                }
            }
            "k_cache_scale" | "v_cache_scale" => {
                found.consumed.insert(name.to_string());
                kv.push(name.to_string());
            }
            _ => {}
        }
    }
    if !calibrated.is_empty() {
        found.warnings.push(Warning::new(
            Rule::Unstated,
            "quantization_config",
            format!(
                "{} calibrated activation scales dropped ({}): the quantized model rounds those Linear layers' inputs or outputs to int8 steps at run time (SRQ); the dense model does not, so its outputs differ",
                calibrated.len(),
                short_list(&calibrated)
            ),
        ));
    }
    if !kv.is_empty() {
        found.warnings.push(Warning::new(
            Rule::Unstated,
            "quantization_config",
            format!(
                "{} KV-cache scales dropped ({}): a dense model keeps its cache in full precision",
                kv.len(),
                short_list(&kv)
            ),
        ));
    }
}

/// Up to four names, then how many more.
fn short_list(names: &[String]) -> String {
    let mut s = names.iter().take(4).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > 4 {
        s.push_str(&format!(" and {} more", names.len() - 4));
    }
    s
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Linear,
    Embedding,
}

fn plan_module<'c>(
    cfg: &Config,
    ckpt: &'c Checkpoint,
    module: &str,
    out: OutDtype,
    kind: Kind,
    guessed: &mut Vec<String>,
) -> Result<Output<'c>> {
    let (codes_name, scale_name) = match kind {
        Kind::Linear => ("weight", "weight_scale"),
        Kind::Embedding => ("embedding_quantized", "embedding_scale"),
    };
    let bits = cfg.bits(module);
    let w = require(ckpt, module, codes_name)?;
    expect_dtype(&w, &[if bits == 8 { Dtype::I8 } else { Dtype::U8 }]).map_err(|e| {
        w.error(
            e.rule,
            format!(
                "dtype {}; the config gives {module} {bits} bits, stored as {}",
                w.dtype,
                if bits == 8 { "int8" } else { "uint8 packs" }
            ),
        )
    })?;
    let scale = require(ckpt, module, scale_name)?;
    let (rows, width) = super::matrix_dims(&w, "a quantized Gemma weight is 2-D")?;
    let per = (8 / bits) as usize;
    let sized = cfg.shapes.and_then(|s| s.of_module(module));
    let cols = match sized {
        Some((o, i)) => {
            if i.div_ceil(per) != width || o.is_some_and(|o| o != rows) {
                return Err(w.error(
                    Rule::TensorShape,
                    format!(
                        "shape {:?}; config.json's sizes make it {}x{i} at {bits} bits, stored [{}, {}]",
                        w.shape,
                        o.map_or_else(|| "?".into(), |o| o.to_string()),
                        o.map_or_else(|| "?".into(), |o| o.to_string()),
                        i.div_ceil(per)
                    ),
                ));
            }
            i
        }
        None => {
            if per > 1 {
                guessed.push(module.to_string());
            }
            width.saturating_mul(per)
        }
    };
    let dims = Dims {
        slices: 1,
        rows,
        cols,
    };
    let kind_of_scale = float_kind(&scale)?;
    let layout = match kind {
        Kind::Linear => {
            if *scale.shape != [rows, 1] {
                return Err(scale.error(
                    Rule::TensorShape,
                    format!("shape {:?}; QuantizedLinear holds [{rows}, 1]", scale.shape),
                ));
            }
            ScaleLayout::Channel
        }
        Kind::Embedding => match *scale.shape {
            [r, b] if r == rows && b > 0 && cols % b == 0 => ScaleLayout::Group(cols / b),
            _ => {
                return Err(scale.error(
                    Rule::TensorShape,
                    format!(
                        "shape {:?}; an embedding's scales are [{rows}, B], B blocks that divide its {cols} columns",
                        scale.shape
                    ),
                ))
            }
        },
    };
    let values = grid_values(scale, kind_of_scale, layout, dims)?;
    let codes = match bits {
        8 => super::byte_codes(&w, dims),
        _ => Fields::dense(w, bits, width as u64 * 8),
    };
    super::check_extent(&w, &codes, 1, rows, cols)?;
    let table: Vec<f32> = match bits {
        8 => (0..=255u8).map(|b| f32::from(b as i8)).collect(),
        b => {
            let off = 1i32 << (b - 1);
            (0..1i32 << b).map(|c| (c - off) as f32).collect()
        }
    };
    let job = DecodeJob::new(dims, codes, table, out)
        .with_scale(values)
        .with_product(Product::OutDtype);
    let scheme = match kind {
        Kind::Linear => format!("gemma int{bits} per-channel"),
        Kind::Embedding => format!("gemma int{bits} embedding, {} blocks a row", layout.groups(cols)),
    };
    Ok(decoded_output(module, w.shard, vec![rows, cols], job, scheme))
}

//! AMD Quark exports (`quant_method: "quark"`, `export.weight_format:
//! "real_quantized"`): the `amd/*` FP8 and MXFP4 releases.
//!
//! The weight scheme is `global_quant_config.weight`, overridden per module
//! by `layer_quant_config` (keys are fnmatch globs on module names):
//! - `dtype: "fp8_e4m3"`, `qscheme: "per_tensor"` or `"per_channel"`:
//!   `weight` F8_E4M3, `weight_scale` in the model's dtype (`[]`, or one per
//!   output row);
//! - `dtype: "fp4"` (or `"mx"` with `mx_element_dtype: "fp4"`), `qscheme:
//!   "per_group"`, `group_size: 32`, `scale_format: "e8m0"`: `weight` U8
//!   `[out, in/2]`, low nibble first, `weight_scale` U8 E8M0 `[out, in/32]`.
//!
//! Quark's own dequantizer computes in f32 and casts once: the numerics
//! contract's default. `input_scale`, `output_scale` (KV cache) are not
//! weights.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use safetensors::Dtype;
use serde_json::Value;

use super::{
    byte_table, decoded_output, expect_dtype, float_kind, fp4_weight_job, fp8_job, grid_values,
    list_or_dash, modules_with, plan_each, require, weight_dims, Glob, Modules, QuantConfig,
    ScaleLayout,
};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result, Rule};
use crate::numerics::{self, OutDtype};
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "quark",
    producers: "AMD Quark",
    bits: &[4, 8],
    modes: &["fp8", "mxfp4"],
};

/// What a Quark weight scheme stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// E4M3 weight, one scale per tensor.
    Fp8Tensor,
    /// E4M3 weight, one scale per output row.
    Fp8Channel,
    /// E2M1 nibbles, E8M0 scales per 32 columns.
    Mxfp4,
}

impl Kind {
    /// For people (inspect's scheme).
    fn describe(self) -> &'static str {
        match self {
            Kind::Fp8Tensor => "quark fp8 per-tensor",
            Kind::Fp8Channel => "quark fp8 per-channel",
            Kind::Mxfp4 => "quark mxfp4 (e8m0 group 32)",
        }
    }
}

/// Columns per MXFP4 scale.
const MX_GROUP: usize = 32;

/// A Quark quantization config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// The global weight scheme (`None`: weights not quantized).
    pub weight: Option<Kind>,
    /// Per-module overrides, in the config's order: (glob, scheme).
    #[serde(skip)]
    pub layers: Vec<(Glob, Option<Kind>)>,
    /// Modules left unquantized (`exclude`).
    pub exclude: Vec<String>,
    /// The same, made quick to ask.
    #[serde(skip)]
    excludes: Excludes,
}

/// `exclude` made quick to ask of many modules: the entries without glob
/// characters hashed (one names a module that is it, or that ends with a
/// dot and it), the globs compiled once. A hostile config may list a
/// million names against as many modules.
#[derive(Debug, Clone, Default)]
struct Excludes {
    plain: HashSet<String>,
    globs: Vec<(String, Glob)>,
}

impl Excludes {
    fn new(list: &[String]) -> Excludes {
        let mut out = Excludes::default();
        for e in list {
            let glob = Glob::new(e);
            if glob.is_literal() {
                out.plain.insert(e.clone());
            } else {
                out.globs.push((e.clone(), glob));
            }
        }
        out
    }

    /// Whether an entry names `module`: the module itself, a suffix after
    /// one of its dots, or a glob matching it.
    fn name(&self, module: &str) -> bool {
        let plain = self.plain.contains(module)
            || module
                .match_indices('.')
                .any(|(i, _)| self.plain.contains(&module[i + 1..]));
        plain
            || self.globs.iter().any(|(e, g)| {
                e == module
                    || module
                        .strip_suffix(e.as_str())
                        .is_some_and(|head| head.ends_with('.'))
                    || g.matches(module)
            })
    }
}

#[derive(serde::Deserialize)]
struct RawWeight {
    dtype: Option<String>,
    qscheme: Option<String>,
    group_size: Option<i64>,
    scale_format: Option<String>,
    mx_element_dtype: Option<String>,
}

#[derive(serde::Deserialize)]
struct RawLayer {
    weight: Option<Value>,
}

#[derive(serde::Deserialize)]
struct RawExport {
    weight_format: Option<String>,
}

#[derive(serde::Deserialize)]
struct Raw {
    global_quant_config: Option<RawLayer>,
    layer_quant_config: Option<indexmap::IndexMap<String, RawLayer>>,
    exclude: Option<Vec<String>>,
    export: Option<RawExport>,
}

/// The scheme of one `weight` entry.
fn kind(path: &Path, at: &str, w: &Option<Value>) -> Result<Option<Kind>> {
    let w = match w {
        None | Some(Value::Null) => return Ok(None),
        Some(v @ Value::Object(_)) => v,
        Some(other) => {
            return Err(Error::new(
                Rule::Unsupported,
                path,
                format!("{at}.weight {other}: only one weight scheme per layer is decoded"),
            ))
        }
    };
    let raw: RawWeight = super::from_value(path, w)?;
    let dtype = raw.dtype.unwrap_or_default().to_ascii_lowercase();
    let qscheme = raw.qscheme.unwrap_or_default().to_ascii_lowercase();
    let elem = raw.mx_element_dtype.map(|d| d.to_ascii_lowercase());
    let unsupported = |what: String| Error::new(Rule::Unsupported, path, format!("{at}.weight: {what} is not decoded (fp8_e4m3 per tensor or channel, fp4/mxfp4 per group 32 with e8m0 scales)"));
    match (dtype.as_str(), qscheme.as_str()) {
        ("fp8_e4m3", "per_tensor") => Ok(Some(Kind::Fp8Tensor)),
        ("fp8_e4m3", "per_channel") => Ok(Some(Kind::Fp8Channel)),
        ("fp4" | "mxfp4", "per_group") | ("mx", "per_group")
            if dtype != "mx" || elem.as_deref() == Some("fp4") =>
        {
            if raw.group_size != Some(MX_GROUP as i64) {
                return Err(Error::new(
                    Rule::Config,
                    path,
                    format!(
                        "{at}.weight.group_size {:?}: MXFP4 scales one E8M0 byte per {MX_GROUP} columns",
                        raw.group_size
                    ),
                ));
            }
            match raw.scale_format.as_deref().map(str::to_ascii_lowercase) {
                None => Ok(Some(Kind::Mxfp4)),
                Some(f) if f == "e8m0" => Ok(Some(Kind::Mxfp4)),
                Some(f) => Err(unsupported(format!("scale_format {f:?}"))),
            }
        }
        _ => Err(unsupported(format!("dtype {dtype:?} with qscheme {qscheme:?}"))),
    }
}

impl Config {
    /// Reads config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let path = q.path;
        let raw: Raw = q.read()?;
        if let Some(f) = raw.export.and_then(|e| e.weight_format) {
            if f != "real_quantized" {
                return Err(Error::new(
                    Rule::Unsupported,
                    path,
                    format!("export.weight_format {f:?} is not decoded (only real_quantized)"),
                ));
            }
        }
        let weight = match &raw.global_quant_config {
            Some(g) => kind(path, "global_quant_config", &g.weight)?,
            None => None,
        };
        let mut layers = Vec::new();
        for (pattern, layer) in raw.layer_quant_config.iter().flatten() {
            let at = format!("layer_quant_config.{pattern}");
            layers.push((Glob::new(pattern), kind(path, &at, &layer.weight)?));
        }
        Ok(Config {
            path: path.to_path_buf(),
            weight,
            layers,
            excludes: Excludes::new(raw.exclude.as_deref().unwrap_or_default()),
            exclude: raw.exclude.unwrap_or_default(),
        })
    }

    /// The scheme of `module`: its first matching `layer_quant_config`
    /// entry's, else the global one.
    fn kind_for(&self, module: &str) -> Option<Kind> {
        self.layers
            .iter()
            .find(|(g, _)| g.matches(module))
            .map_or(self.weight, |(_, k)| *k)
    }

    /// Whether `exclude` names `module` (a name, a suffix after a dot, or
    /// a glob).
    fn excluded(&self, module: &str) -> bool {
        self.excludes.name(module)
    }

    /// `inspect`'s line: the global scheme, the overrides, the exclusions.
    pub fn report_lines(&self) -> Vec<String> {
        vec![format!(
            "weights {}; {} layer overrides; exclude {}",
            self.weight.map_or("not quantized", Kind::describe),
            self.layers.len(),
            list_or_dash(&self.exclude)
        )]
    }

    /// inspect's format line: the global scheme.
    pub fn format_line(&self) -> String {
        self.weight
            .map_or("weights not quantized", Kind::describe)
            .into()
    }
}

/// The decoded modules: every module with a `weight_scale`, and every FP8
/// `weight`.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let modules: std::collections::BTreeSet<&str> =
        super::quantized_modules(ckpt, "weight_scale", Dtype::F8_E4M3)
            .into_iter()
            .chain(modules_with(ckpt, "weight_scale"))
            .collect();
    plan_each(
        ckpt,
        modules,
        &["weight", "weight_scale"],
        |m| {
            cfg.excluded(m)
                .then_some("listed in exclude but stored quantized; decoded anyway")
        },
        |m, _| plan_module(cfg, ckpt, m, dtype),
    )
}

fn plan_module<'c>(
    cfg: &Config,
    ckpt: &'c Checkpoint,
    module: &str,
    out: OutDtype,
) -> Result<Output<'c>> {
    let w = require(ckpt, module, "weight")?;
    let scale = require(ckpt, module, "weight_scale")?;
    // A stored scale beside a module the config leaves alone: what is
    // stored says what it is.
    let kind = match (cfg.kind_for(module), w.dtype) {
        (Some(k), _) => k,
        (None, Dtype::U8) => Kind::Mxfp4,
        (None, _) => Kind::Fp8Tensor,
    };
    let (job, shape) = match kind {
        Kind::Mxfp4 => {
            expect_dtype(&w, &[Dtype::U8])?;
            expect_dtype(&scale, &[Dtype::U8])?;
            let table = byte_table(numerics::e8m0);
            fp4_weight_job(&w, scale, table, ScaleLayout::Group(MX_GROUP), out)?
        }
        Kind::Fp8Tensor | Kind::Fp8Channel => {
            expect_dtype(&w, &[Dtype::F8_E4M3])?;
            let dims = weight_dims(&w)?;
            let layout = if kind == Kind::Fp8Tensor {
                ScaleLayout::Tensor
            } else {
                ScaleLayout::Channel
            };
            let values = grid_values(scale, float_kind(&scale)?, layout, dims)?;
            let job = fp8_job(&w, dims, out)
                .with_scale(values);
            (job, w.shape.to_vec())
        }
    };
    Ok(decoded_output(
        module,
        w.shard,
        shape,
        job,
        kind.describe().into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hashed `exclude` answers as the list read one entry at a time:
    /// the module itself, a suffix after a dot, or a glob.
    #[test]
    fn excludes_as_the_list_reads() {
        let list: Vec<String> = [
            "lm_head",
            "mlp.down_proj",
            "model.layers.1.*",
            "*.q_proj",
            "odd[name",
            "",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let one_by_one = |module: &str| {
            list.iter().any(|e| {
                e == module || module.ends_with(&format!(".{e}")) || Glob::new(e).matches(module)
            })
        };
        let ex = Excludes::new(&list);
        for module in [
            "lm_head",
            "model.lm_head",
            "xlm_head",
            "model.layers.0.mlp.down_proj",
            "model.layers.0.xmlp.down_proj",
            "model.layers.1.self_attn.o_proj",
            "model.layers.2.self_attn.q_proj",
            "model.layers.2.self_attn.k_proj",
            "odd[name",
            "a.odd[name",
            "trailing.",
        ] {
            assert_eq!(ex.name(module), one_by_one(module), "{module}");
        }
    }
}

//! NVIDIA ModelOpt NVFP4 exports (`hf_quant_config.json`, or `config.json`
//! with `quant_method: "modelopt"`).

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use safetensors::Dtype;
use serde_json::Value;

use super::{
    byte_table, decoded_output, expect_dtype, fp4_job, plan_each, quantized_modules, require,
    scalar_f32, split_shape, Glob, Modules, ScaleLayout, Target,
};
use crate::checkpoint::{Checkpoint, JsonFile};
use crate::error::{Error, Result, Rule};
use crate::job::Dims;
use crate::numerics::{self, OutDtype};
use crate::output::Output;

/// A ModelOpt quantization config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// ModelOpt version that wrote it.
    pub producer_version: Option<String>,
    /// `NVFP4` (the only algorithm decoded).
    pub quant_algo: String,
    /// Columns per e4m3 scale.
    pub group_size: usize,
    /// Modules left unquantized.
    pub exclude_modules: Vec<Target>,
    /// KV cache quantization (`FP8`), when set.
    pub kv_cache_quant_algo: Option<String>,
}

/// The `quantization` object (or a flat `quantization_config`) as ModelOpt
/// writes it; keys it does not name are ignored.
#[derive(serde::Deserialize)]
struct RawQuant {
    quant_algo: Option<String>,
    group_size: Option<usize>,
    /// config.json's form keeps the group size in compressed-tensors-like groups.
    config_groups: Option<IndexMap<String, RawGroup>>,
    exclude_modules: Option<Vec<String>>,
    ignore: Option<Vec<String>>,
    kv_cache_quant_algo: Option<String>,
    producer: Option<Producer>,
}

#[derive(serde::Deserialize)]
struct RawGroup {
    weights: Option<RawWeights>,
}

#[derive(serde::Deserialize)]
struct RawWeights {
    group_size: Option<usize>,
}

/// hf_quant_config.json keeps the producer beside `quantization`.
#[derive(serde::Deserialize)]
struct Outer {
    producer: Option<Producer>,
}

#[derive(serde::Deserialize)]
struct Producer {
    version: Option<String>,
}

impl Config {
    /// `inspect`'s line: the algorithm, its group size and the excluded modules.
    pub fn report_lines(&self) -> Vec<String> {
        let ex: Vec<&str> = self.exclude_modules.iter().map(Target::text).collect();
        vec![format!(
            "{} group {}; exclude {}",
            self.quant_algo,
            self.group_size,
            ex.join(", ")
        )]
    }

    /// Reads the `quantization` object (hf_quant_config.json's, or the one a
    /// config.json may nest) or a flat config.json `quantization_config`.
    fn from_object(path: &Path, root: &Value) -> Result<Config> {
        let (q, outer) = match root.get("quantization") {
            Some(q) => (q, Some(root)),
            None => (root, None),
        };
        let raw: RawQuant = super::from_value(path, q)?;
        let outer_producer = match outer {
            Some(root) => super::from_value::<Outer>(path, root)?.producer,
            None => None,
        };
        let group_size = raw.group_size.or_else(|| {
            raw.config_groups
                .iter()
                .flat_map(|groups| groups.values())
                .find_map(|g| g.weights.as_ref()?.group_size)
        });
        if group_size == Some(0) {
            return Err(Error::new(
                Rule::Config,
                path,
                "group_size must be a positive integer",
            ));
        }
        let algo = raw.quant_algo.unwrap_or_default();
        let cfg = Config {
            path: path.to_path_buf(),
            producer_version: outer_producer.or(raw.producer).and_then(|p| p.version),
            quant_algo: algo.to_ascii_uppercase(),
            group_size: group_size.unwrap_or(16),
            exclude_modules: raw
                .exclude_modules
                .or(raw.ignore)
                .unwrap_or_default()
                .iter()
                .map(|s| Target::Glob(Glob::new(s)))
                .collect(),
            kv_cache_quant_algo: raw.kv_cache_quant_algo,
        };
        // W4A16_NVFP4 stores the same NVFP4 weights (activations stay 16-bit).
        if !matches!(cfg.quant_algo.as_str(), "NVFP4" | "W4A16_NVFP4") {
            return Err(Error::new(
                Rule::Unsupported,
                path,
                format!("ModelOpt quant_algo {algo:?} is not decoded (only NVFP4)"),
            ));
        }
        Ok(cfg)
    }

    /// Reads `hf_quant_config.json`.
    pub fn from_hf_quant_config(f: &JsonFile) -> Result<Config> {
        if f.value.get("quantization").is_none() {
            return Err(Error::new(
                Rule::Config,
                &f.path,
                "no \"quantization\" object",
            ));
        }
        Config::from_object(&f.path, &f.value)
    }

    /// Reads the `quantization_config` of a `config.json` written by ModelOpt.
    pub fn from_config_json(path: &Path, qc: &Value) -> Result<Config> {
        Config::from_object(path, qc)
    }
}

/// The decoded NVFP4 modules: every module with a uint8 `weight` beside
/// `weight_scale_2`. Other `weight`s pass through.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    plan_each(
        ckpt,
        quantized_modules(ckpt, "weight_scale_2", Dtype::U8),
        &["weight", "weight_scale", "weight_scale_2"],
        |m| {
            cfg.exclude_modules
                .iter()
                .any(|t| t.rank(m).is_some())
                .then_some("listed in exclude_modules but stored as NVFP4; decoded anyway")
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
    let packed = require(ckpt, module, "weight")?;
    expect_dtype(&packed, &[Dtype::U8])?;
    let scale_t = require(ckpt, module, "weight_scale")?;
    expect_dtype(&scale_t, &[Dtype::F8_E4M3, Dtype::U8])?;
    let scale_2 = scalar_f32(&require(ckpt, module, "weight_scale_2")?)?;
    let (slices, rows, width) = split_shape(&packed, packed.shape)?;
    let dims = Dims {
        slices,
        rows,
        cols: width.saturating_mul(2),
    };
    let layout = ScaleLayout::Group(cfg.group_size);
    let table = byte_table(|b| numerics::e4m3(b) * scale_2);
    let job = fp4_job(&packed, dims, scale_t, table, layout, out)?;
    let mut shape = packed.shape.to_vec();
    if let Some(last) = shape.last_mut() {
        *last = dims.cols;
    }
    Ok(decoded_output(
        module,
        packed.shard,
        shape,
        job,
        format!(
            "modelopt NVFP4 fp4 e4m3-scale·scale_2 {}",
            layout.describe()
        ),
    ))
}

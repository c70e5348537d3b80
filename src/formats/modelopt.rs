//! NVIDIA ModelOpt exports (`hf_quant_config.json`, or `config.json` with
//! `quant_method: "modelopt"`): NVFP4, FP8 per tensor and per channel, FP8
//! 128×128 blocks (`fp8_pb_wo`), MXFP8 and INT4 AWQ.
//!
//! ModelOpt's `FP8QTensor.dequantize` multiplies in the output dtype
//! (`weight.to(dtype) * scale.to(dtype)`): its FP8 jobs are
//! [`Product::OutDtype`] ones. `MXFP8QTensor` computes in f32.
//!
//! AWQ exports keep a `pre_quant_scale` on the modules whose input scaling
//! could not be folded into the layer before (o_proj, down_proj): the
//! model multiplies its input by it, so the dense weight carries it, column
//! by column — a rank-0 [`LowRank`] smoothing.

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use safetensors::Dtype;
use serde_json::Value;

use super::{
    byte_table, decoded_output, expect_dtype, fp4_weight_job, fp8_job, fp8_weight, grid_values,
    plan_each, quantized_modules, require, scalar_f32, split_shape, weight_dims, Glob, Modules,
    QuantConfig, ScaleLayout, Target, Targets,
};
use crate::checkpoint::{Checkpoint, JsonFile, TensorRef};
use crate::error::{Error, Result, Rule};
use crate::job::{DecodeJob, Dims, Fields, Grid, LowRank, Product, ValueKind, Values};
use crate::numerics::{self, OutDtype};
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "modelopt",
    producers: "NVIDIA ModelOpt",
    bits: &[4, 8],
    modes: &[
        "nvfp4",
        "nvfp4-awq",
        "int4-awq",
        "fp8",
        "fp8-per-channel",
        "fp8-block",
        "mxfp8",
    ],
};

/// A ModelOpt quantization config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// ModelOpt version that wrote it.
    pub producer_version: Option<String>,
    /// `NVFP4`, `FP8`, `FP8_PER_CHANNEL_PER_TOKEN`, `FP8_PB_WO`, `MXFP8`
    /// (upper case).
    pub quant_algo: String,
    /// What the algorithm stores.
    pub algo: Algo,
    /// Columns per e4m3 scale.
    pub group_size: usize,
    /// Modules left unquantized.
    pub exclude_modules: Targets,
    /// KV cache quantization (`FP8`), when set.
    pub kv_cache_quant_algo: Option<String>,
}

/// The weight layouts of the decoded ModelOpt algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algo {
    /// E2M1 nibbles, e4m3 scales per `group_size`, f32 `weight_scale_2`.
    Nvfp4,
    /// E4M3 weight, one f32 scale per tensor (`FP8`).
    Fp8Tensor,
    /// E4M3 weight, one f32 scale per output row (`FP8_PER_CHANNEL_PER_TOKEN`).
    Fp8Channel,
    /// E4M3 weight, f32 scales per 128×128 block (`FP8_PB_WO`).
    Fp8Block,
    /// E4M3 weight, E8M0 scales per 32 columns (`MXFP8`).
    Mxfp8,
    /// Signed 4-bit codes packed down the rows, f32 scales per
    /// `group_size` columns (`W4A16_AWQ`, `W4A8_AWQ`: the same weights).
    Int4Awq,
}

impl Algo {
    fn of(name: &str) -> Option<Algo> {
        Some(match name {
            // W4A16_NVFP4 stores the same NVFP4 weights (activations stay 16-bit).
            "NVFP4" | "W4A16_NVFP4" | "NVFP4_AWQ" => Algo::Nvfp4,
            "FP8" => Algo::Fp8Tensor,
            "FP8_PER_CHANNEL_PER_TOKEN" => Algo::Fp8Channel,
            "FP8_PB_WO" => Algo::Fp8Block,
            "MXFP8" => Algo::Mxfp8,
            "W4A16_AWQ" | "W4A8_AWQ" => Algo::Int4Awq,
            _ => return None,
        })
    }

    /// For people: how each weight is scaled.
    fn describe(self, group_size: usize) -> String {
        match self {
            Algo::Nvfp4 => format!("group {group_size}"),
            Algo::Fp8Tensor => "per-tensor".into(),
            Algo::Fp8Channel => "per-channel".into(),
            Algo::Fp8Block => format!("block {FP8_BLOCK}x{FP8_BLOCK}"),
            Algo::Mxfp8 => format!("e8m0 group {MX_GROUP}"),
            Algo::Int4Awq => format!("int4 group {group_size}"),
        }
    }
}

/// Rows and columns of an `FP8_PB_WO` block: written nowhere, ModelOpt's
/// only block size; a scale whose shape does not fit it is refused.
pub const FP8_BLOCK: usize = 128;

/// Columns per MXFP8 scale.
pub const MX_GROUP: usize = 32;

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
    /// Reads hf_quant_config.json when the checkpoint has one (ModelOpt's
    /// own sidecar), else config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        match &q.ckpt.hf_quant_config {
            Some(f) => Config::from_hf_quant_config(f),
            None => Config::from_config_json(q.path, q.value),
        }
    }

    /// inspect's format line: the producer's version and the algorithm.
    pub fn format_line(&self) -> String {
        format!(
            "modelopt {} ({})",
            self.producer_version.as_deref().unwrap_or("?"),
            self.quant_algo
        )
    }

    /// `inspect`'s line: the algorithm, its group size and the excluded modules.
    pub fn report_lines(&self) -> Vec<String> {
        let ex: Vec<&str> = self.exclude_modules.iter().map(Target::text).collect();
        let mut lines = vec![format!(
            "{} {}; exclude {}",
            self.quant_algo,
            self.algo.describe(self.group_size),
            ex.join(", ")
        )];
        if let Some(kv) = &self.kv_cache_quant_algo {
            lines.push(format!("kv cache {kv} (scales dropped from the dense output)"));
        }
        lines
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
        let Some(kind) = Algo::of(&algo.to_ascii_uppercase()) else {
            return Err(Error::new(
                Rule::Unsupported,
                path,
                format!(
                    "ModelOpt quant_algo {algo:?} is not decoded (NVFP4, NVFP4_AWQ, FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, MXFP8, W4A16_AWQ, W4A8_AWQ)"
                ),
            ));
        };
        let cfg = Config {
            path: path.to_path_buf(),
            producer_version: outer_producer.or(raw.producer).and_then(|p| p.version),
            quant_algo: algo.to_ascii_uppercase(),
            algo: kind,
            group_size: group_size.unwrap_or(if kind == Algo::Int4Awq { 128 } else { 16 }),
            exclude_modules: raw
                .exclude_modules
                .or(raw.ignore)
                .unwrap_or_default()
                .iter()
                .map(|s| Target::Glob(Glob::new(s)))
                .collect(),
            kv_cache_quant_algo: raw.kv_cache_quant_algo,
        };
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

/// The decoded modules. NVFP4: every module with a uint8 `weight` beside
/// `weight_scale_2`; FP8 and MXFP8: every module with an F8_E4M3 `weight`
/// or a `weight_scale`. Other `weight`s pass through.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let listed = |m: &str| cfg.exclude_modules.names_module(m);
    if cfg.algo == Algo::Int4Awq {
        return plan_each(
            ckpt,
            quantized_modules(ckpt, "weight_scale", Dtype::U8),
            // W4A8's second weight scale belongs to its FP8 activation path.
            &["weight", "weight_scale", "pre_quant_scale", "weight_scale_2"],
            |m| listed(m).then_some("listed in exclude_modules but stored as INT4; decoded anyway"),
            |m, _| plan_int4(cfg, ckpt, m, dtype),
        );
    }
    if cfg.algo != Algo::Nvfp4 {
        return plan_each(
            ckpt,
            quantized_modules(ckpt, "weight_scale", Dtype::F8_E4M3),
            &["weight", "weight_scale"],
            |m| listed(m).then_some("listed in exclude_modules but stored as FP8; decoded anyway"),
            |m, _| plan_fp8(cfg, ckpt, m, dtype),
        );
    }
    plan_each(
        ckpt,
        quantized_modules(ckpt, "weight_scale_2", Dtype::U8),
        &["weight", "weight_scale", "weight_scale_2", "pre_quant_scale"],
        |m| listed(m).then_some("listed in exclude_modules but stored as NVFP4; decoded anyway"),
        |m, _| plan_nvfp4(cfg, ckpt, m, dtype),
    )
}

/// An NVFP4 module: `weight` FP4 nibbles, `weight_scale` e4m3 per group,
/// times the global `weight_scale_2`.
fn plan_nvfp4<'c>(
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
    let layout = ScaleLayout::Group(cfg.group_size);
    let table = byte_table(|b| numerics::e4m3(b) * scale_2);
    let (job, shape) = fp4_weight_job(&packed, scale_t, table, layout, out)?;
    let job = with_pre_quant_scale(ckpt, module, job)?;
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

/// An INT4 AWQ module: `weight` uint8 `[out/2, in]`, byte `[r, c]`
/// holding rows 2r (low nibble) and 2r + 1 of column c as two's-complement
/// codes; `weight_scale` `[out, in/group]`; value `(q·s)·pre_quant_scale`
/// in f32, rounded once.
fn plan_int4<'c>(cfg: &Config, ckpt: &'c Checkpoint, module: &str, out: OutDtype) -> Result<Output<'c>> {
    let w = require(ckpt, module, "weight")?;
    expect_dtype(&w, &[Dtype::U8, Dtype::I8])?;
    let scale = require(ckpt, module, "weight_scale")?;
    let kind = super::float_kind(&scale)?;
    let (slices, pairs, cols) = split_shape(&w, w.shape)?;
    let (rows, groups) = match *scale.shape {
        [r, g] => (r, g),
        _ => (0, 0),
    };
    let g = cfg.group_size;
    if slices != 1 || rows != 2 * pairs || groups != cols.div_ceil(g) {
        return Err(scale.error(
            Rule::TensorShape,
            format!(
                "shape {:?} does not fit a 2-D weight {:?} of two rows a byte in groups of {g} columns (expected [{}, {}])",
                scale.shape,
                w.shape,
                2 * pairs,
                cols.div_ceil(g)
            ),
        ));
    }
    // A byte row is a slice of two lanes (its nibbles) a field a byte.
    let dims = Dims { slices: pairs, rows: 2, cols };
    let codes = Fields::new(w, 4, 1, 4).with_word_bits(8).with_slice_bits(cols as u64 * 8);
    super::check_extent(&w, &codes, pairs, 2, cols)?;
    let grid = Grid {
        row_div: 1,
        col_div: g,
        row_stride: groups,
        slice_stride: 2 * groups,
    };
    let int4 = (0..16).map(|c: i32| (if c < 8 { c } else { c - 16 }) as f32).collect::<Vec<f32>>();
    let job = DecodeJob::new(dims, codes, int4, out).with_scale(Values {
        data: scale.into(),
        kind,
        grid,
    });
    let job = with_pre_quant_scale(ckpt, module, job)?;
    Ok(decoded_output(
        module,
        w.shard,
        vec![rows, cols],
        job,
        format!("modelopt {} {}", cfg.quant_algo, cfg.algo.describe(g)),
    ))
}

/// `job` with the module's `pre_quant_scale` (one factor per input column)
/// multiplied in after its scale, when it has one.
fn with_pre_quant_scale<'c>(ckpt: &'c Checkpoint, module: &str, job: DecodeJob<'c>) -> Result<DecodeJob<'c>> {
    let Some(t) = ckpt.get(&format!("{module}.pre_quant_scale")) else {
        return Ok(job);
    };
    let cols = job.dims.cols;
    if job.dims.slices * job.dims.rows == 0 || t.elements() != cols || t.shape.len() > 1 {
        return Err(t.error(
            Rule::TensorShape,
            format!("shape {:?}; one factor per input column ({cols}) is expected", t.shape),
        ));
    }
    let factors = t.floats()?;
    Ok(job.with_low_rank(LowRank {
        period: 1,
        row_div: 1,
        rank: 0,
        up: Vec::new().into(),
        down: Vec::new().into(),
        inv_smooth: factors.into(),
        smooth_first: true,
            in_product: false,
    }))
}

/// An FP8 (E4M3) module of the FP8 and MXFP8 algorithms.
fn plan_fp8<'c>(cfg: &Config, ckpt: &'c Checkpoint, module: &str, out: OutDtype) -> Result<Output<'c>> {
    let (w, scale) = fp8_weight(ckpt, module, "weight_scale")?;
    let dims = weight_dims(&w)?;
    let (values, product) = match cfg.algo {
        Algo::Mxfp8 => {
            expect_dtype(&scale, &[Dtype::U8])?;
            let kind = byte_table(numerics::e8m0);
            let v = grid_values(scale, kind, ScaleLayout::Group(MX_GROUP), dims)?;
            (v, Product::F32)
        }
        Algo::Fp8Block => {
            expect_dtype(&scale, &[Dtype::F32])?;
            (block_scale(scale, dims)?, Product::OutDtype)
        }
        Algo::Fp8Channel => {
            expect_dtype(&scale, &[Dtype::F32])?;
            let v = grid_values(scale, ValueKind::F32, ScaleLayout::Channel, dims)?;
            (v, Product::OutDtype)
        }
        Algo::Fp8Tensor | Algo::Nvfp4 | Algo::Int4Awq => {
            expect_dtype(&scale, &[Dtype::F32])?;
            let v = grid_values(scale, ValueKind::F32, ScaleLayout::Tensor, dims)?;
            (v, Product::OutDtype)
        }
    };
    let job = fp8_job(&w, dims, out)
        .with_scale(values)
        .with_product(product);
    Ok(decoded_output(
        module,
        w.shard,
        w.shape.to_vec(),
        job,
        format!(
            "modelopt {} {}",
            cfg.quant_algo,
            cfg.algo.describe(cfg.group_size)
        ),
    ))
}

/// An `FP8_PB_WO` scale: f32 `[ceil(rows/128), 1, ceil(cols/128), 1]` (or
/// `[ceil(rows/128), ceil(cols/128)]`); the block size is written nowhere,
/// so the shape must be the one 128×128 blocks give.
fn block_scale<'c>(t: TensorRef<'c>, dims: Dims) -> Result<Values<'c>> {
    let (nr, nc) = (dims.rows.div_ceil(FP8_BLOCK), dims.cols.div_ceil(FP8_BLOCK));
    let grid_shape: Vec<usize> = t.shape.iter().copied().filter(|&d| d != 1).collect();
    let fits = dims.slices == 1
        && t.elements() == nr * nc
        && match *t.shape {
            [a, 1, b, 1] | [a, b] => (a, b) == (nr, nc),
            _ => false,
        };
    if !fits {
        return Err(t.error(
            Rule::TensorShape,
            format!(
                "shape {:?} does not fit {FP8_BLOCK}x{FP8_BLOCK} blocks of a {}x{} weight (expected [{nr}, 1, {nc}, 1]; {grid_shape:?} without its unit dimensions)",
                t.shape, dims.rows, dims.cols
            ),
        ));
    }
    let (grid, _) = ScaleLayout::Block(FP8_BLOCK, FP8_BLOCK).grid(dims);
    Ok(Values {
        data: t.into(),
        kind: ValueKind::F32,
        grid,
    })
}

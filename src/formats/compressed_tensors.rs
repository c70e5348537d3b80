//! compressed-tensors: `pack-quantized`, `nvfp4-pack-quantized`,
//! `mxfp4-pack-quantized`, `int-quantized`, `float-quantized`, `naive-quantized`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use safetensors::Dtype;
use serde_json::Value;

use super::transform::Transforms;
use super::{
    byte_codes, byte_table, check_extent, decoded_output, expect_dtype, float_kind, fp4_job,
    fp8_job, fp8_weight, grid_values, modules_with, plan_each, require, scalar_f32, sparse,
    split_shape, stored_kind, weight_dims, Modules, QuantConfig, ScaleLayout, Target, Targets,
};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule};
use crate::job::{DecodeJob, Dims, Fields, Product, ZeroPoint};
use crate::numerics::{self, OutDtype};
use crate::output::fold::Fold;
use crate::error::Warning;
use crate::output::{Output, Source};

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "compressed-tensors",
    producers: "llm-compressor, vLLM's releases",
    bits: &[1, 2, 3, 4, 5, 6, 7, 8],
    modes: &[
        "pack-quantized (int, sym/asym, actorder)",
        "nvfp4-pack-quantized",
        "mxfp4-pack-quantized",
        "int-quantized",
        "float-quantized (fp8)",
        "mxfp8-quantized",
        "sparse-24-bitmask",
        "sparse-bitmask",
        "transforms (QuIP, SpinQuant)",
    ],
};

/// Weight parameters of a compressed-tensors module (besides `weight` itself).
const WEIGHT_PARAMS: &[&str] = &[
    "weight_packed",
    "weight_scale",
    "weight_shape",
    "weight_zero_point",
    "weight_g_idx",
    "weight_global_scale",
];

/// The formats this module decodes.
const FORMATS: &[&str] = &[
    "pack-quantized",
    "nvfp4-pack-quantized",
    "mxfp4-pack-quantized",
    "mxfp8-quantized",
    "int-quantized",
    "float-quantized",
    "naive-quantized",
];

/// The weight quantization of one config group.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Scheme {
    /// Bits per code.
    pub num_bits: u32,
    /// `int` or `float`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `tensor`, `channel`, `group`, `tensor_group`, `block`.
    pub strategy: String,
    /// Columns per group.
    pub group_size: Option<usize>,
    /// `[BH, BW]` for block strategy.
    pub block_structure: Option<[usize; 2]>,
    /// Symmetric (no zero point).
    pub symmetric: bool,
    /// Activation ordering (`group`, `weight`, …), when set.
    pub actorder: Option<String>,
}

/// One `config_groups` entry.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Group {
    /// Its key in `config_groups`.
    pub name: String,
    /// Its format (its own, else the config's top-level one).
    pub format: String,
    /// Modules it selects.
    pub targets: Targets,
    /// Weight quantization, when it quantizes weights.
    pub weights: Option<Scheme>,
}

/// A compressed-tensors `quantization_config`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// compressed-tensors version that wrote it.
    pub version: Option<String>,
    /// Config groups, in file order.
    pub groups: Vec<Group>,
    /// Modules left unquantized.
    pub ignore: Targets,
    /// The sparse layout of modules that store a bitmask
    /// (`sparsity_config.format`).
    pub sparsity: Option<sparse::Layout>,
    /// Rotations at inference (`transform_config`).
    pub transforms: Option<Transforms>,
}

impl Scheme {
    /// For people: `int 4 bits, group 128, symmetric`.
    fn describe(&self) -> String {
        format!(
            "{} {} bits, {}{}{}",
            self.kind,
            self.num_bits,
            self.strategy,
            self.group_size.map(|g| format!(" {g}")).unwrap_or_default(),
            if self.symmetric {
                ", symmetric"
            } else {
                ", asymmetric"
            }
        )
    }
}

impl Group {
    /// `inspect`'s line for the group: `group_0  pack-quantized: …; targets Linear`.
    fn report_line(&self) -> String {
        let scheme = match &self.weights {
            Some(w) => w.describe(),
            None => "no weight quantization".into(),
        };
        let targets: Vec<&str> = self.targets.iter().map(Target::text).collect();
        format!(
            "{}  {}: {}; targets {}",
            self.name,
            self.format,
            scheme,
            targets.join(", ")
        )
    }
}

fn cfg_err(path: &Path, detail: impl Into<String>) -> Error {
    Error::new(Rule::Config, path, detail)
}

/// `quantization_config` as compressed-tensors writes it; keys it does not
/// name are ignored, as compressed-tensors ignores them.
#[derive(serde::Deserialize)]
struct RawConfig {
    format: Option<String>,
    /// Absent from configs that only sparsify.
    config_groups: Option<IndexMap<String, RawGroup>>,
    version: Option<String>,
    ignore: Option<Vec<String>>,
    sparsity_config: Option<RawSparsity>,
    transform_config: Option<Value>,
}

#[derive(serde::Deserialize)]
struct RawGroup {
    format: Option<String>,
    targets: Option<Vec<String>>,
    weights: Option<RawScheme>,
}

#[derive(serde::Deserialize)]
struct RawScheme {
    num_bits: u32,
    #[serde(rename = "type")]
    kind: Option<String>,
    strategy: Option<String>,
    /// `-1` means "a whole row" (channel strategy).
    group_size: Option<i64>,
    block_structure: Option<BlockStructure>,
    symmetric: Option<bool>,
    /// A string in current configs; older ones wrote `true`/`false`.
    actorder: Option<Value>,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum BlockStructure {
    Pair([usize; 2]),
    /// Older configs write `"128x128"`.
    Text(String),
}

#[derive(serde::Deserialize)]
struct RawSparsity {
    format: Option<String>,
}

fn targets(path: &Path, list: Option<Vec<String>>) -> Result<Targets> {
    list.unwrap_or_default()
        .iter()
        .map(|s| Target::parse(s).map_err(|e| cfg_err(path, e)))
        .collect()
}

impl RawScheme {
    fn scheme(self, path: &Path, group: &str) -> Result<Scheme> {
        let err = |what: &str| cfg_err(path, format!("config group {group}: weights.{what}"));
        let group_size = match self.group_size {
            None | Some(-1) => None,
            Some(g) => Some(
                usize::try_from(g)
                    .ok()
                    .filter(|&g| g > 0)
                    .ok_or_else(|| err("group_size must be a positive integer or -1"))?,
            ),
        };
        let block_structure = match self.block_structure {
            None => None,
            Some(BlockStructure::Pair(hw)) => Some(hw),
            Some(BlockStructure::Text(s)) => {
                let mut it = s.split('x').map(|p| p.trim().parse::<usize>().ok());
                match (it.next().flatten(), it.next().flatten(), it.next()) {
                    (Some(h), Some(w), None) => Some([h, w]),
                    _ => None,
                }
                .map(Some)
                .ok_or_else(|| err("block_structure must be [rows, cols] or \"RxC\""))?
            }
        };
        if block_structure.is_some_and(|b| b.contains(&0)) {
            return Err(err("block_structure must be positive"));
        }
        // As compressed-tensors does when a config leaves the strategy out.
        let strategy = self.strategy.map_or_else(
            || match self.group_size {
                Some(g) if g > 0 => "group".into(),
                Some(-1) => "channel".into(),
                _ => "tensor".into(),
            },
            |s| s.to_ascii_lowercase(),
        );
        Ok(Scheme {
            num_bits: self.num_bits,
            kind: self
                .kind
                .map_or_else(|| "int".into(), |k| k.to_ascii_lowercase()),
            strategy,
            group_size,
            block_structure,
            symmetric: self.symmetric.unwrap_or(true),
            actorder: self
                .actorder
                .as_ref()
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
}

impl Config {
    /// Parses `quantization_config` of `path`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let path = q.path;
        let raw: RawConfig = q.read()?;
        let sparse = raw.sparsity_config.as_ref().is_some_and(|s| s.format.is_some());
        let config_groups = match raw.config_groups {
            Some(g) => g,
            None if sparse => IndexMap::new(),
            None => return Err(cfg_err(path, "missing field `config_groups` (and no sparsity_config)")),
        };
        let mut groups = Vec::new();
        for (name, g) in config_groups {
            let format = g
                .format
                .or_else(|| raw.format.clone())
                .ok_or_else(|| cfg_err(path, format!("config group {name} has no format")))?;
            let weights = match g.weights {
                Some(w) => Some(w.scheme(path, &name)?),
                None => None,
            };
            groups.push(Group {
                targets: targets(path, g.targets)?,
                name,
                format,
                weights,
            });
        }
        let sparsity = match raw.sparsity_config.and_then(|s| s.format) {
            None => None,
            Some(f) => sparse::Layout::of(&f).ok_or_else(|| {
                let why = if f == "marlin-24" {
                    ": its Marlin tiles and `meta` tensors have no dequantizer anywhere"
                } else {
                    ""
                };
                Error::new(
                    Rule::Unsupported,
                    path,
                    format!("sparsity format {f:?} is not decoded (dense, sparse-24-bitmask and sparse-bitmask are){why}"),
                )
            })?,
        };
        let transforms = match &raw.transform_config {
            Some(t) => Transforms::parse(path, t)?,
            None => None,
        };
        Ok(Config {
            path: path.to_path_buf(),
            version: raw.version,
            groups,
            ignore: targets(path, raw.ignore)?,
            sparsity,
            transforms,
        })
    }

    /// inspect's format line: the version and the formats of the groups.
    pub fn format_line(&self) -> String {
        format!(
            "compressed-tensors {} ({})",
            self.version.as_deref().unwrap_or("(no version)"),
            self.formats().join(", ")
        )
    }

    /// `inspect`'s lines: each group's format, scheme and targets, then the
    /// modules left unquantized.
    pub fn report_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.groups.iter().map(Group::report_line).collect();
        let ignore: Vec<&str> = self.ignore.iter().map(Target::text).collect();
        if !ignore.is_empty() {
            lines.push(format!("ignore   {}", ignore.join(", ")));
        }
        if let Some(s) = self.sparsity {
            lines.push(format!("sparsity {}", s.name()));
        }
        if let Some(t) = &self.transforms {
            lines.extend(t.report_lines());
        }
        lines
    }

    /// The distinct formats of the groups.
    pub fn formats(&self) -> Vec<String> {
        let set: BTreeSet<&str> = self.groups.iter().map(|g| g.format.as_str()).collect();
        set.into_iter().map(str::to_string).collect()
    }

    /// True for compressed-tensors 0.17.x and older, which padded 3/5/6/7-bit
    /// rows (no field crosses an int32 word).
    fn legacy_packing(&self) -> bool {
        let Some(v) = &self.version else { return false };
        let mut it = v.split('.').map(|p| p.trim().parse::<u64>().unwrap_or(0));
        let (major, minor) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        (major, minor) < (0, 18)
    }

    /// The config group that quantizes `module`: the most specific target
    /// wins; among equals, a group whose format fits how the module is stored
    /// (`packed`: it has `weight_packed`) wins over one that does not.
    fn group_for(&self, module: &str, packed: bool) -> Option<&Group> {
        let fits = |g: &Group| g.format.contains("pack") == packed;
        self.groups
            .iter()
            .filter(|g| g.weights.is_some())
            .filter_map(|g| {
                let rank = g.targets.rank(module)?;
                Some(((rank, fits(g)), g))
            })
            .fold(
                None,
                |best: Option<((u8, bool), &Group)>, (r, g)| match best {
                    Some((br, _)) if br >= r => best,
                    _ => Some((r, g)),
                },
            )
            .map(|(_, g)| g)
    }
}

/// The decoded modules of a compressed-tensors checkpoint.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let mut modules: BTreeSet<&str> = modules_with(ckpt, "weight_packed").into_iter().collect();
    modules.extend(modules_with(ckpt, "weight_scale"));
    modules.extend(modules_with(ckpt, "bitmask"));
    let params: Vec<&str> = WEIGHT_PARAMS.iter().chain(sparse::PARAMS).copied().collect();

    let ignored = |m: &str| cfg.ignore.names_module(m);
    let mut found = plan_each(
        ckpt,
        modules,
        &params,
        |m| ignored(m).then_some("listed in ignore but stored quantized; decoded anyway"),
        |m, warnings| {
            let out = plan_module(cfg, ckpt, m, dtype, warnings)?;
            match &cfg.transforms {
                Some(t) => fold(t, ckpt, m, out),
                None => Ok(out),
            }
        },
    );
    if let Some(t) = &cfg.transforms {
        found.consumed.extend(t.stored_matrices(ckpt).into_iter().map(String::from));
        // A bias under an output rotation is rotated too.
        let mut biases = Vec::new();
        for o in &found.outputs {
            let (Source::Fold(f), Some(m)) = (&o.source, o.name.strip_suffix(".weight")) else {
                continue;
            };
            let (Some(b), Some(rot)) = (ckpt.get(&format!("{m}.bias")), &f.output) else {
                continue;
            };
            match b.floats() {
                Ok(v) if b.shape == [f.dims().0] => biases.push(Output {
                    name: b.name.to_string(),
                    shard: b.shard,
                    shape: b.shape.to_vec(),
                    dtype: f.out.safetensors(),
                    source: Source::Bytes(rot.fold_bias(&v, f.out)),
                    scheme: Some("rotated as its weight's outputs".into()),
                }),
                Ok(_) => found.errors.push(b.error(Rule::TensorShape, format!("shape {:?}, expected [{}]", b.shape, f.dims().0))),
                Err(e) => found.errors.push(e),
            }
        }
        found.outputs.extend(biases);
        // A Linear left dense that a runtime rotates would be copied
        // unrotated: a different model.
        for m in modules_with(ckpt, "weight").into_iter().filter(|m| ignored(m)) {
            if t.rotates(m) {
                found.errors.push(Error::tensor(
                    Rule::Unsupported,
                    &cfg.path,
                    format!("{m}.weight"),
                    "left unquantized but rotated online by transform_config: rotations are folded into decoded modules only",
                ));
            }
        }
    }
    found
}

/// A decoded module with the online rotations `t` puts on it folded in.
fn fold<'c>(t: &Transforms, ckpt: &'c Checkpoint, module: &str, out: Output<'c>) -> Result<Output<'c>> {
    let Source::Decode(job) = out.source else {
        return Ok(out);
    };
    let d = job.dims;
    if d.slices != 1 || job.transposed {
        return Ok(Output { source: Source::Decode(job), ..out });
    }
    match t.rotations(ckpt, module, (d.rows, d.cols))? {
        (None, None) => Ok(Output { source: Source::Decode(job), ..out }),
        (input, output) => {
            let dtype = job.out;
            // The runtime multiplies by the weight in the model's dtype.
            let mut wq = *job;
            wq.out = super::config_dtype(ckpt).unwrap_or(dtype);
            let fold = Fold { job: wq, input, output, out: dtype };
            let scheme = out.scheme.map(|s| format!("{s}, rotations folded"));
            Ok(Output { source: Source::Fold(Box::new(fold)), scheme, ..out })
        }
    }
}

fn plan_module<'c>(
    cfg: &Config,
    ckpt: &'c Checkpoint,
    module: &str,
    out: OutDtype,
    warnings: &mut Vec<Warning>,
) -> Result<Output<'c>> {
    let packed = ckpt.get(&format!("{module}.weight_packed")).is_some();
    if ckpt.get(&format!("{module}.bitmask")).is_some() {
        return sparse_module(cfg, ckpt, module, out);
    }
    let group = cfg.group_for(module, packed).ok_or_else(|| {
        Error::tensor(
            Rule::Config,
            &cfg.path,
            module,
            "stored quantized, but no config group with weights targets it",
        )
    })?;
    let scheme = group
        .weights
        .as_ref()
        .ok_or_else(|| cfg_err(&cfg.path, "group without weights"))?;
    if !FORMATS.contains(&group.format.as_str()) {
        return Err(Error::tensor(
            Rule::Unsupported,
            &cfg.path,
            module,
            format!(
                "format {:?} of config group {} is not decoded",
                group.format, group.name
            ),
        ));
    }
    let layout = scale_layout(cfg, module, scheme)?;
    let describe = |what: &str| {
        format!(
            "{} {what} {}{}",
            group.format,
            layout.describe(),
            if scheme.symmetric { "" } else { " asym" }
        )
    };
    match group.format.as_str() {
        "pack-quantized" => {
            let (job, shape, shard) =
                pack_quantized(cfg, ckpt, module, scheme, layout, out, warnings)?;
            Ok(decoded_output(
                module,
                shard,
                shape,
                job,
                describe(&format!("int{}", scheme.num_bits)),
            ))
        }
        "nvfp4-pack-quantized" | "mxfp4-pack-quantized" => {
            let nv = group.format.starts_with("nvfp4");
            let (job, shape, shard) = fp4_packed(ckpt, module, nv, layout, out)?;
            let what = if nv {
                "fp4 e4m3-scale/global"
            } else {
                "fp4 e8m0-scale"
            };
            Ok(decoded_output(module, shard, shape, job, describe(what)))
        }
        "mxfp8-quantized" => {
            let (job, shape, shard) = mxfp8(ckpt, module, layout, out)?;
            Ok(decoded_output(
                module,
                shard,
                shape,
                job,
                describe("fp8 e4m3 e8m0-scale (bf16 product)"),
            ))
        }
        _ => {
            let (job, shape, shard, kind) = byte_weight(ckpt, module, scheme, layout, out)?;
            Ok(decoded_output(module, shard, shape, job, describe(kind)))
        }
    }
}

/// A module stored sparse: its kept values scattered over its bitmask, then
/// dequantized as its config group says (int8 or fp8 values), or as they
/// are (16-bit float values of a model only sparsified).
fn sparse_module<'c>(cfg: &Config, ckpt: &'c Checkpoint, module: &str, out: OutDtype) -> Result<Output<'c>> {
    let layout = cfg.sparsity.ok_or_else(|| {
        Error::tensor(
            Rule::Config,
            &cfg.path,
            format!("{module}.bitmask"),
            "stored sparse, but sparsity_config names no sparse format",
        )
    })?;
    let s = sparse::read(ckpt, module, layout)?;
    let (values, dims) = (s.values, s.dims);
    let sparsity = format!("{} ({:.0}% kept)", layout.name(), 100.0 * s.kept);
    let codes = Fields::dense(values, values.dtype.bitsize() as u32, values.len() as u64 * 8);
    let group = cfg.group_for(module, false);
    let Some((group, scheme)) = group.and_then(|g| Some((g, g.weights.as_ref()?))) else {
        let code_values = sparse::float_codes(&values).ok_or_else(|| {
            values.error(
                Rule::TensorDtype,
                format!("dtype {}; values no config group quantizes are BF16 or F16", values.dtype),
            )
        })?;
        let job = DecodeJob::new(dims, codes, code_values, out).with_sparse(s.sparse);
        let shape = vec![dims.rows, dims.cols];
        return Ok(decoded_output(module, values.shard, shape, job, sparsity));
    };
    let byte_format = ["int-quantized", "float-quantized", "naive-quantized"].contains(&group.format.as_str());
    if !byte_format || scheme.num_bits != 8 {
        return Err(Error::tensor(
            Rule::Unsupported,
            &cfg.path,
            module,
            format!(
                "{} over {} ({} bits) is not a layout compressed-tensors decompresses",
                layout.name(),
                group.format,
                scheme.num_bits
            ),
        ));
    }
    let scale_layout = scale_layout(cfg, module, scheme)?;
    let (code_values, kind) = byte_values(&values, scheme)?;
    let scale_t = require(ckpt, module, "weight_scale")?;
    let scale = grid_values(scale_t, float_kind(&scale_t)?, scale_layout, dims)?;
    let zero = if scheme.symmetric {
        None
    } else {
        let t = require(ckpt, module, "weight_zero_point")?;
        Some(ZeroPoint::Plain(grid_values(t, stored_kind(&t)?, scale_layout, dims)?))
    };
    let job = DecodeJob::new(dims, codes, code_values, out)
        .with_sparse(s.sparse)
        .with_scale(scale)
        .with_zero(zero);
    let what = format!("{} {kind} {} {sparsity}", group.format, scale_layout.describe());
    Ok(decoded_output(module, values.shard, vec![dims.rows, dims.cols], job, what))
}

/// The code values of one-byte weights: int8 or fp8 e4m3, as the scheme's
/// type says.
fn byte_values(w: &TensorRef<'_>, scheme: &Scheme) -> Result<(Vec<f32>, &'static str)> {
    match (w.dtype, scheme.kind.as_str()) {
        (Dtype::I8, "int") => Ok(((0..=255u8).map(|b| b as i8 as f32).collect(), "int8")),
        (Dtype::F8_E4M3, "float") => Ok(((0..=255u8).map(numerics::e4m3).collect(), "fp8 e4m3")),
        (other, kind) => Err(w.error(
            Rule::TensorDtype,
            format!("dtype {other:?}; {kind} weights are {}", if kind == "int" { "I8" } else { "F8_E4M3" }),
        )),
    }
}

fn scale_layout(cfg: &Config, module: &str, s: &Scheme) -> Result<ScaleLayout> {
    let err = |d: String| Error::tensor(Rule::Config, &cfg.path, module, d);
    match s.strategy.as_str() {
        "tensor" => Ok(ScaleLayout::Tensor),
        "channel" => Ok(ScaleLayout::Channel),
        "group" | "tensor_group" => s
            .group_size
            .map(ScaleLayout::Group)
            .ok_or_else(|| err(format!("strategy {} without group_size", s.strategy))),
        "block" => s
            .block_structure
            .map(|[h, w]| ScaleLayout::Block(h, w))
            .ok_or_else(|| err("strategy block without block_structure".into())),
        other => Err(Error::tensor(
            Rule::Unsupported,
            &cfg.path,
            module,
            format!("weight strategy {other:?} is not decoded"),
        )),
    }
}

/// Reads `weight_shape`: 2 or 3 positive integers.
fn logical_shape(t: &TensorRef<'_>) -> Result<Vec<usize>> {
    expect_dtype(t, &[Dtype::I64, Dtype::I32])?;
    let vals = t.ints()?;
    if !(2..=3).contains(&vals.len()) || t.shape.len() != 1 {
        return Err(t.error(
            Rule::TensorShape,
            format!(
                "holds {} values; a 2-D or 3-D shape is expected",
                vals.len()
            ),
        ));
    }
    vals.iter()
        .map(|&v| usize::try_from(v).ok().filter(|_| v > 0 && v <= 1 << 40))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| {
            t.error(
                Rule::TensorValue,
                format!("shape {vals:?} has a value out of range"),
            )
        })
}

/// Whether rows of `cols` b-bit fields take `width` words dense (`Some(0)`)
/// or padded (`Some(32 div b)`), or neither (`None`).
fn packing_of(width: usize, cols: usize, bits: u32, legacy: bool) -> Option<u32> {
    let per_word = 32 / bits;
    let dense = (cols * bits as usize).div_ceil(32);
    let padded = cols.div_ceil(per_word as usize);
    match (width == dense, width == padded) {
        // Same width: the layouts differ only where a field would cross a word.
        (true, true) => Some(if legacy { per_word } else { 0 }),
        (true, false) => Some(0),
        (false, true) => Some(per_word),
        (false, false) => None,
    }
}

fn pack_quantized<'c>(
    cfg: &Config,
    ckpt: &'c Checkpoint,
    module: &str,
    scheme: &Scheme,
    layout: ScaleLayout,
    out: OutDtype,
    warnings: &mut Vec<Warning>,
) -> Result<(DecodeJob<'c>, Vec<usize>, usize)> {
    let packed = require(ckpt, module, "weight_packed")?;
    let b = scheme.num_bits;
    if !(1..=8).contains(&b) {
        return Err(packed.error(Rule::Ct001, format!("num_bits {b} is outside 1..=8")));
    }
    if scheme.kind != "int" {
        return Err(packed.error(
            Rule::Unsupported,
            format!("pack-quantized of type {:?}", scheme.kind),
        ));
    }
    if packed.dtype != Dtype::I32 {
        return Err(packed.error(
            Rule::Ct001,
            format!(
                "packed dtype {:?}; pack-quantized stores int32",
                packed.dtype
            ),
        ));
    }
    let shape_t = require(ckpt, module, "weight_shape")?;
    let shape = logical_shape(&shape_t)?;
    let (slices, rows, cols) = split_shape(&shape_t, &shape)?;
    let dims = Dims { slices, rows, cols };
    let (ps, pr, width) = split_shape(&packed, packed.shape)?;
    if packed.shape.len() != shape.len() || (ps, pr) != (slices, rows) {
        return Err(packed.error(
            Rule::Ct004,
            format!(
                "packed shape {:?} does not match weight_shape {shape:?}",
                packed.shape
            ),
        ));
    }
    let legacy = cfg.legacy_packing();
    let per_word = packing_of(width, cols, b, legacy).ok_or_else(|| {
        packed.error(
            Rule::Ct004,
            format!(
                "packed width {width} fits neither {cols} {b}-bit fields dense ({}) nor padded ({})",
                (cols * b as usize).div_ceil(32),
                cols.div_ceil(32 / b as usize)
            ),
        )
    })?;
    if 32 % b != 0 && per_word != 0 && !legacy {
        warnings.push(Warning::new(
            Rule::Ct004,
            packed.name,
            format!("{b}-bit rows use the 0.17.x padded layout (no field crosses an int32)"),
        ));
    }
    let codes = Fields::new(packed, b, per_word, width as u64 * 32)
        .with_slice_bits((rows * width) as u64 * 32);
    check_extent(&packed, &codes, slices, rows, cols)?;
    let offset = 1i32 << (b - 1);
    let code_values: Vec<f32> = (0..1i32 << b).map(|f| (f - offset) as f32).collect();

    let scale_t = require(ckpt, module, "weight_scale")?;
    let scale = grid_values(scale_t, float_kind(&scale_t)?, layout, dims)?;
    let g_idx = g_idx(ckpt, module, layout, dims)?;
    let zero = if scheme.symmetric {
        None
    } else {
        Some(zero_point(ckpt, module, b, per_word, layout, dims)?)
    };
    let job = DecodeJob::new(dims, codes, code_values, out)
        .with_scale(scale)
        .with_zero(zero)
        .with_g_idx(g_idx);
    Ok((job, shape, packed.shard))
}

/// Asymmetric zero points: b-bit fields packed along rows (int32), or one
/// stored integer per scale entry.
fn zero_point<'c>(
    ckpt: &'c Checkpoint,
    module: &str,
    b: u32,
    weight_per_word: u32,
    layout: ScaleLayout,
    dims: Dims,
) -> Result<ZeroPoint<'c>> {
    let t = require(ckpt, module, "weight_zero_point")?;
    let groups = layout.groups(dims.cols);
    if t.dtype == Dtype::I32 && matches!(layout, ScaleLayout::Group(_) | ScaleLayout::Channel) {
        if let Ok((s, zrows, g)) = split_shape(&t, t.shape) {
            let legacy = weight_per_word != 0;
            if let (Some(per_word), true) = (
                packing_of(zrows, dims.rows, b, legacy),
                (s, g) == (dims.slices, groups),
            ) {
                let fields = Fields::new(t, b, per_word, 32)
                    .with_word_bits(32 * groups as u64)
                    .with_slice_bits((zrows * groups) as u64 * 32);
                check_extent(&t, &fields, dims.slices, groups, dims.rows)?;
                return Ok(ZeroPoint::Packed { fields });
            }
        }
    }
    Ok(ZeroPoint::Plain(grid_values(
        t,
        stored_kind(&t)?,
        layout,
        dims,
    )?))
}

/// Activation-order group indices: one per column, each below the group count.
fn g_idx(
    ckpt: &Checkpoint,
    module: &str,
    layout: ScaleLayout,
    dims: Dims,
) -> Result<Option<Vec<u32>>> {
    let Some(t) = ckpt.get(&format!("{module}.weight_g_idx")) else {
        return Ok(None);
    };
    expect_dtype(&t, &[Dtype::I32, Dtype::I64])?;
    if !matches!(layout, ScaleLayout::Group(_)) || dims.slices != 1 {
        return Err(t.error(
            Rule::Unsupported,
            "g_idx only applies to 2-D group quantization",
        ));
    }
    if t.shape != [dims.cols] {
        return Err(t.error(
            Rule::TensorShape,
            format!("shape {:?}, expected [{}]", t.shape, dims.cols),
        ));
    }
    let groups = layout.groups(dims.cols) as i64;
    let vals = t.ints()?;
    vals.iter()
        .enumerate()
        .map(|(c, &g)| {
            if (0..groups).contains(&g) {
                Ok(g as u32)
            } else {
                Err(t.error(
                    Rule::TensorValue,
                    format!("g_idx[{c}] = {g} is outside 0..{groups}"),
                ))
            }
        })
        .collect::<Result<Vec<u32>>>()
        .map(Some)
}

fn fp4_packed<'c>(
    ckpt: &'c Checkpoint,
    module: &str,
    nvfp4: bool,
    layout: ScaleLayout,
    out: OutDtype,
) -> Result<(DecodeJob<'c>, Vec<usize>, usize)> {
    let packed = require(ckpt, module, "weight_packed")?;
    let shape = match ckpt.get(&format!("{module}.weight_shape")) {
        Some(t) => logical_shape(&t)?,
        None => {
            let mut s = packed.shape.to_vec();
            if let Some(last) = s.last_mut() {
                *last = last.saturating_mul(2);
            }
            s
        }
    };
    let (slices, rows, cols) = split_shape(&packed, &shape)?;
    let dims = Dims { slices, rows, cols };
    let scale_t = require(ckpt, module, "weight_scale")?;
    let table = if nvfp4 {
        expect_dtype(&scale_t, &[Dtype::F8_E4M3, Dtype::U8])?;
        let global_t = require(ckpt, module, "weight_global_scale")?;
        let global = scalar_f32(&global_t)?;
        // compressed-tensors divides the e4m3 scale, widened to bf16, by the
        // global scale in torch. A 0-dim global (`[]`, what its ModelOpt
        // converter writes) takes no part in type promotion, so the quotient
        // is rounded to bf16; a `[1]` global promotes it to f32.
        let bf16_quotient = global_t.shape.is_empty();
        byte_table(move |b| {
            let s = numerics::e4m3(b) / global;
            if bf16_quotient {
                numerics::bf16_to_f32(numerics::f32_to_bf16(s))
            } else {
                s
            }
        })
    } else {
        expect_dtype(&scale_t, &[Dtype::U8, Dtype::F8_E8M0])?;
        byte_table(numerics::e8m0)
    };
    let job = fp4_job(&packed, dims, scale_t, table, layout, out)?;
    Ok((job, shape, packed.shard))
}

/// Columns per `mxfp8-quantized` scale (the MX block).
const MX_GROUP: usize = 32;

/// `mxfp8-quantized`: `weight` F8_E4M3, `weight_scale` U8 E8M0 per 32
/// columns. compressed-tensors makes each scale a bf16 `2^(e−127)` and
/// multiplies in bf16 before it casts: a [`Product::Bf16`] job.
fn mxfp8<'c>(
    ckpt: &'c Checkpoint,
    module: &str,
    layout: ScaleLayout,
    out: OutDtype,
) -> Result<(DecodeJob<'c>, Vec<usize>, usize)> {
    let (w, scale_t) = fp8_weight(ckpt, module, "weight_scale")?;
    expect_dtype(&scale_t, &[Dtype::U8])?;
    if layout != ScaleLayout::Group(MX_GROUP) {
        return Err(scale_t.error(
            Rule::Config,
            format!(
                "mxfp8-quantized scales one E8M0 byte per {MX_GROUP} columns; the config says {}",
                layout.describe()
            ),
        ));
    }
    let dims = weight_dims(&w)?;
    let scale = grid_values(scale_t, byte_table(numerics::e8m0), layout, dims)?;
    let job = fp8_job(&w, dims, out)
        .with_scale(scale)
        .with_product(Product::Bf16);
    Ok((job, w.shape.to_vec(), w.shard))
}

/// int8 / fp8 weights stored one byte per element.
fn byte_weight<'c>(
    ckpt: &'c Checkpoint,
    module: &str,
    scheme: &Scheme,
    layout: ScaleLayout,
    out: OutDtype,
) -> Result<(DecodeJob<'c>, Vec<usize>, usize, &'static str)> {
    let w = require(ckpt, module, "weight")?;
    let (code_values, kind) = byte_values(&w, scheme)?;
    let dims = weight_dims(&w)?;
    let scale_t = require(ckpt, module, "weight_scale")?;
    let scale = grid_values(scale_t, float_kind(&scale_t)?, layout, dims)?;
    let zero = if scheme.symmetric {
        None
    } else {
        let t = require(ckpt, module, "weight_zero_point")?;
        Some(ZeroPoint::Plain(grid_values(
            t,
            stored_kind(&t)?,
            layout,
            dims,
        )?))
    };
    let job = DecodeJob::new(dims, byte_codes(&w, dims), code_values, out)
        .with_scale(scale)
        .with_zero(zero)
        .with_g_idx(g_idx(ckpt, module, layout, dims)?);
    Ok((job, w.shape.to_vec(), w.shard, kind))
}

#[cfg(test)]
mod tests {
    use super::packing_of;

    #[test]
    fn packed_width_tells_layouts_apart() {
        // 3-bit, 523 columns: dense 50 words, padded 53.
        assert_eq!(packing_of(50, 523, 3, false), Some(0));
        assert_eq!(packing_of(53, 523, 3, false), Some(10));
        assert_eq!(packing_of(51, 523, 3, false), None);
        // 11 columns: both take 2 words; the version decides.
        assert_eq!(packing_of(2, 11, 3, false), Some(0));
        assert_eq!(packing_of(2, 11, 3, true), Some(10));
        // 4-bit: one layout.
        assert_eq!(packing_of(96, 768, 4, true), Some(8));
    }
}

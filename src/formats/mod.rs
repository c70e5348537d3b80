//! Formats: what the files say, mapped onto format-free [`DecodeJob`]s.
//!
//! Each format reads its config, finds its quantized modules (a *module* is a
//! model layer: the tensors under one name prefix) by their tensor names and
//! builds one job per module with the helpers below; no format has decode
//! code of its own.

#[macro_use]
mod table;
mod gptq_dynamic;
pub mod sparse;
mod targets;
pub mod transform;

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use safetensors::Dtype;
use serde_json::Value;

use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::Warning;
use crate::error::{Error, Result, Rule};
use crate::job::{DecodeJob, Dims, Fields, Grid, ValueKind, Values};
use crate::numerics::{self, OutDtype};
use crate::output::{Output, Source};

pub use table::{QuantConfig, Support};
pub use targets::{Glob, Target, Targets};

// The format table: a line a format, its module, and the `quant_method`
// values config.json names it by (the `formats!` macro says what it makes).
formats! {
    /// A compressed-tensors checkpoint.
    CompressedTensors(compressed_tensors) by "compressed-tensors",
    /// An NVIDIA ModelOpt export.
    Modelopt(modelopt) by "modelopt",
    /// DeepSeek-style FP8 with block scales (`quant_method: "fp8"`).
    Fp8Block(fp8_block) by "fp8",
    /// fbgemm FP8 (`quant_method: "fbgemm_fp8"`): per-row f32 scales.
    #[serde(rename = "fbgemm-fp8")]
    Fbgemm(fbgemm) by "fbgemm_fp8",
    /// An AMD Quark export (`quant_method: "quark"`): FP8, MXFP4.
    Quark(quark) by "quark",
    /// An AutoAWQ GEMM checkpoint (`quant_method: "awq"`).
    Awq(awq) by "awq",
    /// A GPTQ checkpoint (`quant_method: "gptq"`) or AutoRound's GPTQ-packed
    /// export (`quant_method: "auto-round"`).
    Gptq(gptq) by "gptq", "auto-round" | "auto_round",
    /// OpenAI's native MXFP4 (`quant_method: "mxfp4"`, GPT-OSS).
    GptOss(gpt_oss) by "mxfp4",
    /// bitsandbytes 4-bit (NF4, FP4) and LLM.int8 (`quant_method: "bitsandbytes"`).
    #[serde(rename = "bitsandbytes")]
    Bnb(bnb) by "bitsandbytes",
    /// BitNet b1.58 ternary weights (`quant_method: "bitnet"`).
    Bitnet(bitnet) by "bitnet",
    /// HQQ (`quant_method: "hqq"`): hqq's HQQLinear state dicts.
    Hqq(hqq) by "hqq",
    /// Gemma's own int2/int4/int8 checkpoints (`quant_method: "gemma"`).
    Gemma(gemma) by "gemma",
    /// SINQ (`quant_method: "sinq"`): sinq's SINQLinear state dicts.
    Sinq(sinq) by "sinq",
    /// VPTQ vector codebooks (`quant_method: "vptq"`).
    Vptq(vptq) by "vptq",
    /// AQLM additive codebooks (`quant_method: "aqlm"`).
    Aqlm(aqlm) by "aqlm",
    /// An SVDQuant checkpoint written by diffuse_compressor.
    Svdquant(svdquant),
    /// An MLX checkpoint (mlx-lm: config.json's `quantization`).
    Mlx(mlx),
    /// A GGUF model (llama.cpp, gguf-py).
    Gguf(gguf),
}

/// `a, b`, or `-` for none: how report lines show a list.
fn list_or_dash<S: AsRef<str>>(v: &[S]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(", ")
    }
}

/// Module keys as transformers' `should_convert_module` matches them
/// (`modules_to_not_convert`, bnb's `llm_int8_skip_modules`): a key is a
/// regex from the start of the name up to a module boundary, or a suffix
/// of the name.
#[derive(Debug, Clone)]
struct ModuleKeys(Vec<(String, fancy_regex::Regex)>);

impl ModuleKeys {
    /// `keys`, config.json's `what` in `path`; a key that is no regex this
    /// tool reads is an error.
    fn new<'k>(
        path: &Path,
        what: &str,
        keys: impl IntoIterator<Item = &'k String>,
    ) -> Result<ModuleKeys> {
        keys.into_iter()
            .map(|k| {
                fancy_regex::Regex::new(&format!(r"^(?:{k})(?:(?<=\.)|(?=\.|$))"))
                    .map(|re| (k.clone(), re))
                    .map_err(|e| {
                        Error::new(
                            Rule::Config,
                            path,
                            format!("{what}: bad pattern {k:?}: {e}"),
                        )
                    })
            })
            .collect::<Result<Vec<_>>>()
            .map(ModuleKeys)
    }

    /// Whether a key matches `module`.
    fn matches(&self, module: &str) -> bool {
        self.0
            .iter()
            .any(|(k, re)| re.is_match(module).unwrap_or(false) || module.ends_with(k.as_str()))
    }
}

/// `text` when `on`, else nothing: an optional part of a format or report
/// line.
fn when(on: bool, text: &str) -> &str {
    if on {
        text
    } else {
        ""
    }
}

/// Reads a config object into its serde type; a mismatch names the key's
/// path (`config_groups.group_0.weights.num_bits: invalid type: …`).
fn from_value<T: serde::de::DeserializeOwned>(path: &Path, v: &Value) -> Result<T> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let at = e.path().to_string();
        let what = e.into_inner().to_string();
        match at.as_str() {
            "." => Error::new(Rule::Config, path, what),
            _ => Error::new(Rule::Config, path, format!("{at}: {what}")),
        }
    })
}

/// Reads the sidecar configs and tells which format the checkpoint is.
///
/// `config.json`'s `quantization_config` decides; `hf_quant_config.json` is
/// ModelOpt's own sidecar and is read when config.json names ModelOpt or has
/// no quantization config at all (a compressed-tensors checkpoint converted
/// from ModelOpt may still carry the old sidecar).
pub fn detect(ckpt: &Checkpoint) -> Result<Format> {
    if let Some(g) = &ckpt.gguf {
        return Ok(Format::Gguf(gguf::Config::of(ckpt, g)));
    }
    if let Some((path, q)) = mlx::quantization(ckpt) {
        return Ok(Format::Mlx(mlx::Config::parse(path, q)?));
    }
    let qc = ckpt
        .config
        .as_ref()
        .and_then(|c| c.value.get("quantization_config").map(|q| (c, q)));
    if let Some((file, qc)) = qc {
        let method = qc.get("quant_method").and_then(Value::as_str).unwrap_or("");
        let method = method.to_ascii_lowercase();
        let q = QuantConfig {
            path: &file.path,
            value: qc,
            method: &method,
            ckpt,
        };
        return Format::by_quant_method(&q).unwrap_or_else(|| {
            Err(Error::new(
                Rule::Unsupported,
                &file.path,
                format!(
                    "quant_method {method:?} is not one this tool decodes ({})",
                    QUANT_METHODS.join(", ")
                ),
            ))
        });
    }
    if let Some(f) = &ckpt.hf_quant_config {
        return Ok(Format::Modelopt(modelopt::Config::from_hf_quant_config(f)?));
    }
    if let Some(cfg) = svdquant::detect(ckpt)? {
        return Ok(Format::Svdquant(cfg));
    }
    if let Some((t, what)) = quantized_tensor(ckpt) {
        let (rule, missing) = match &ckpt.config {
            Some(c) if !c.value.is_object() => (
                Rule::Config,
                format!("{} is not a JSON object", c.path.display()),
            ),
            Some(c) => (
                Rule::NoConfig,
                format!(
                    "{} has no quantization_config (nor MLX's quantization)",
                    c.path.display()
                ),
            ),
            None => (
                Rule::NoConfig,
                "the checkpoint's config.json is missing".to_string(),
            ),
        };
        return Err(Error::tensor(
            rule,
            ckpt.display_path(),
            t,
            format!(
                "{what}, but {missing}: how to decode them cannot be told; put the config.json the checkpoint was published with beside its weights (the same Hub repository's)"
            ),
        ));
    }
    Ok(Format::Dense)
}

/// A tensor that only a quantized checkpoint stores, and what it shows,
/// for a checkpoint whose config names no quantization: read as dense, its
/// packed codes would be copied as if they were weights.
fn quantized_tensor(ckpt: &Checkpoint) -> Option<(&str, &'static str)> {
    let names = ckpt.names();
    let has = |n: &str| ckpt.get(n).is_some();
    names.into_iter().find_map(|n| {
        let (module, last) = n.rsplit_once('.').unwrap_or(("", n));
        let what = match last {
            "qweight" => "GPTQ/AWQ packed codes (qweight)",
            "weight_packed" => "compressed-tensors packed codes (weight_packed)",
            // Beside a float weight, a stray parameter (CFG-001, planned).
            "weight_scale" | "weight_scale_inv" | "weight_scale_2"
                if ckpt.get(&format!("{module}.weight")).is_some_and(|w| {
                    matches!(
                        w.dtype,
                        Dtype::F8_E4M3 | Dtype::F8_E5M2 | Dtype::I8 | Dtype::U8
                    )
                }) =>
            {
                "8-bit or packed weights with their scales"
            }
            "absmax" => "bitsandbytes scales (absmax)",
            _ if n.contains(".quant_state.bitsandbytes__") => "a bitsandbytes quant_state",
            "scales"
                if ckpt
                    .get(&format!("{module}.weight"))
                    .is_some_and(|w| w.dtype == Dtype::U32) =>
            {
                "MLX packed codes (a uint32 weight beside its scales)"
            }
            "biases" if has(&format!("{module}.scales")) => "MLX scales and biases",
            _ => return None,
        };
        Some((n, what))
    })
}

/// The checkpoint's own dtype: `torch_dtype`/`dtype` in config.json, else
/// the dtype of the first floating-point scale (SVDQuant: of the low-rank
/// branch), else bf16.
pub fn default_dtype(ckpt: &Checkpoint, format: &Format) -> OutDtype {
    if let Format::Svdquant(cfg) = format {
        return svdquant::default_dtype(cfg, ckpt);
    }
    let from_config = config_dtype(ckpt);
    let from_state = || match format {
        Format::Bnb(_) => bnb::default_dtype(ckpt),
        _ => None,
    };
    from_config
        .or_else(from_state)
        .or_else(|| {
            ckpt.names()
                .iter()
                .filter(|n| n.ends_with(".weight_scale") || n.ends_with(".scales"))
                .find_map(|n| match ckpt.get(n)?.dtype {
                    Dtype::BF16 => Some(OutDtype::Bf16),
                    Dtype::F16 => Some(OutDtype::F16),
                    Dtype::F32 => Some(OutDtype::F32),
                    _ => None,
                })
        })
        .unwrap_or(OutDtype::Bf16)
}

/// The dtype config.json names (`torch_dtype`/`dtype`).
pub fn config_dtype(ckpt: &Checkpoint) -> Option<OutDtype> {
    ckpt.config.as_ref().and_then(|c| {
        ["torch_dtype", "dtype"].iter().find_map(|k| {
            c.value
                .get(*k)
                .and_then(Value::as_str)
                .and_then(OutDtype::from_name)
        })
    })
}

/// What planning a checkpoint's quantized modules found: what each module
/// decodes to, the stored tensors they use up, and the faults and findings.
#[derive(Debug, Default)]
pub struct Modules<'c> {
    /// One output per module that can be decoded.
    pub outputs: Vec<Output<'c>>,
    /// Stored tensors that have no place in the dense output (packs,
    /// scales, activation parameters).
    pub consumed: HashSet<String>,
    /// Modules that cannot be decoded, with the rule each breaks.
    pub errors: Vec<Error>,
    /// Findings that do not stop decoding.
    pub warnings: Vec<Warning>,
}

/// Plans every quantized module of `ckpt` in `format`, decoding to `dtype`.
pub fn plan_modules<'c>(ckpt: &'c Checkpoint, format: &Format, dtype: OutDtype) -> Modules<'c> {
    let Some(mut found) = format.plan(ckpt, dtype) else {
        return Modules::default();
    };
    for name in ckpt.names() {
        let last = name.rsplit('.').next().unwrap_or(name);
        if ACTIVATION_PARAMS.contains(&last) {
            found.consumed.insert(name.to_string());
        }
    }
    found
}

/// Plans each quantized module: records its stored `params` as consumed,
/// warns when the config says the module is not quantized (`excluded` gives
/// the warning), and adds the module's output, or its error.
pub fn plan_each<'c>(
    ckpt: &'c Checkpoint,
    modules: impl IntoIterator<Item = &'c str>,
    params: &[&str],
    excluded: impl Fn(&str) -> Option<&'static str>,
    mut build: impl FnMut(&str, &mut Vec<Warning>) -> Result<Output<'c>>,
) -> Modules<'c> {
    let mut found = Modules::default();
    for module in modules {
        for p in params {
            let name = format!("{module}.{p}");
            if ckpt.get(&name).is_some() {
                found.consumed.insert(name);
            }
        }
        if let Some(why) = excluded(module) {
            found
                .warnings
                .push(Warning::new(Rule::Disagree, module, why));
        }
        match build(module, &mut found.warnings) {
            Ok(out) => found.outputs.push(out),
            Err(e) => found.errors.push(e),
        }
    }
    found
}

/// Tensor names that never belong in a dense checkpoint: activation and KV
/// cache quantization parameters.
pub const ACTIVATION_PARAMS: &[&str] = &[
    "input_scale",
    "input_zero_point",
    "input_global_scale",
    "output_scale",
    "output_zero_point",
    "k_scale",
    "k_zero_point",
    "v_scale",
    "v_zero_point",
    "q_scale",
    "q_zero_point",
];

/// Names of weight quantization parameters. One left over after planning
/// means a quantized module was not decoded: copying it would write a
/// "dense" checkpoint that is not dense.
pub const WEIGHT_QUANT_PARAMS: &[&str] = &[
    "weight_packed",
    "weight_scale",
    "weight_scale_2",
    "weight_zero_point",
    "weight_shape",
    "weight_g_idx",
    "weight_global_scale",
    "weight_scale_inv",
    "qweight",
    "qzeros",
    // bitsandbytes (`<m>.weight.absmax`, `<m>.weight.quant_state.bitsandbytes__nf4`, `<m>.SCB`, …).
    "absmax",
    "nested_absmax",
    "quant_map",
    "nested_quant_map",
    "bitsandbytes__nf4",
    "bitsandbytes__fp4",
    "SCB",
    "weight_format",
];

/// The modules that carry tensor `suffix` (`<module>.<suffix>`), sorted.
pub fn modules_with<'c>(ckpt: &'c Checkpoint, suffix: &str) -> Vec<&'c str> {
    ckpt.names()
        .into_iter()
        .filter_map(|n| n.strip_suffix(suffix)?.strip_suffix('.'))
        .collect()
}

/// The modules that carry `<module>.<companion>` or store their `weight` as
/// `weight_dtype`, sorted: a quantized weight without its companion is then
/// planned, and refused, rather than copied as if it were dense.
pub fn quantized_modules<'c>(
    ckpt: &'c Checkpoint,
    companion: &str,
    weight_dtype: Dtype,
) -> BTreeSet<&'c str> {
    modules_with(ckpt, companion)
        .into_iter()
        .chain(modules_with(ckpt, "weight").into_iter().filter(|m| {
            ckpt.get(&format!("{m}.weight"))
                .is_some_and(|t| t.dtype == weight_dtype)
        }))
        .collect()
}

/// Whether `module` is named by transformers' `modules_to_not_convert`
/// (`list`): an entry is a substring of its name.
pub fn not_converted(list: &[String], module: &str) -> bool {
    list.iter()
        .any(|m| !m.is_empty() && module.contains(m.as_str()))
}

/// A module's tensor `<module>.<param>`, or a missing-tensor error.
pub fn require<'c>(ckpt: &'c Checkpoint, module: &str, param: &str) -> Result<TensorRef<'c>> {
    let name = format!("{module}.{param}");
    ckpt.get(&name).ok_or_else(|| {
        missing(
            ckpt,
            name,
            format!("module {module} is quantized but has no {param}"),
        )
    })
}

/// The error of tensor `name`, which `ckpt` lacks: `why` it is needed.
pub fn missing(ckpt: &Checkpoint, name: String, why: String) -> Error {
    Error::tensor(Rule::MissingTensor, ckpt.display_path(), name, why)
}

/// Fails unless config setting `what` is absent or, ignoring case, `only`:
/// the one value decoded (an absent one defaults to it).
pub fn only_setting(path: &Path, what: &str, value: Option<&str>, only: &str) -> Result<()> {
    match value {
        Some(v) if !v.eq_ignore_ascii_case(only) => Err(Error::new(
            Rule::Unsupported,
            path,
            format!("{what} {v:?} is not decoded (only {only})"),
        )),
        _ => Ok(()),
    }
}

/// Fails unless `t` has shape `want`; the error says `shape [..]; {what}`.
pub fn expect_shape(t: &TensorRef<'_>, want: &[usize], what: impl std::fmt::Display) -> Result<()> {
    if t.shape == want {
        Ok(())
    } else {
        Err(t.error(Rule::TensorShape, format!("shape {:?}; {what}", t.shape)))
    }
}

/// The two dimensions of a 2-D tensor with no zero one; the error says
/// `shape [..]; {what}`.
pub fn matrix_dims(t: &TensorRef<'_>, what: impl std::fmt::Display) -> Result<(usize, usize)> {
    match *t.shape {
        [a, b] if a > 0 && b > 0 => Ok((a, b)),
        _ => Err(t.error(Rule::TensorShape, format!("shape {:?}; {what}", t.shape))),
    }
}

/// Fails unless `t` has one of `allowed` dtypes.
pub fn expect_dtype(t: &TensorRef<'_>, allowed: &[Dtype]) -> Result<()> {
    if allowed.contains(&t.dtype) {
        Ok(())
    } else {
        Err(t.error(
            Rule::TensorDtype,
            format!("dtype {}, expected one of {allowed:?}", t.dtype),
        ))
    }
}

/// The (slices, rows, last) view of a 2-D or 3-D shape with no zero
/// dimension (an empty weight has nothing to decode, and a zero beside huge
/// dimensions would let size products overflow).
pub fn split_shape(t: &TensorRef<'_>, shape: &[usize]) -> Result<(usize, usize, usize)> {
    let dims = match *shape {
        [r, c] => (1, r, c),
        [e, r, c] => (e, r, c),
        _ => {
            return Err(t.error(
                Rule::TensorShape,
                format!("shape {shape:?}: only 2-D and 3-D weights are quantized"),
            ))
        }
    };
    if shape.contains(&0) {
        return Err(t.error(
            Rule::TensorShape,
            format!("shape {shape:?} has no elements"),
        ));
    }
    Ok(dims)
}

/// A scale/zero-point layout: what one entry covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleLayout {
    /// One entry for the whole tensor.
    Tensor,
    /// One entry per row.
    Channel,
    /// One entry per row per group of `G` columns.
    Group(usize),
    /// One entry per `BH × BW` block.
    Block(usize, usize),
}

impl ScaleLayout {
    /// The grid for `dims`, and how many entries the stored tensor must hold.
    pub fn grid(self, dims: Dims) -> (Grid, usize) {
        let Dims { slices, rows, cols } = dims;
        match self {
            ScaleLayout::Tensor => (
                Grid {
                    row_div: 1,
                    col_div: cols.max(1),
                    row_stride: 0,
                    slice_stride: 0,
                },
                1,
            ),
            ScaleLayout::Channel => (
                Grid {
                    row_div: 1,
                    col_div: cols.max(1),
                    row_stride: 1,
                    slice_stride: rows,
                },
                slices * rows,
            ),
            ScaleLayout::Group(g) => {
                let ng = cols.div_ceil(g);
                (
                    Grid {
                        row_div: 1,
                        col_div: g,
                        row_stride: ng,
                        slice_stride: rows * ng,
                    },
                    slices * rows * ng,
                )
            }
            ScaleLayout::Block(bh, bw) => {
                let (nr, nc) = (rows.div_ceil(bh), cols.div_ceil(bw));
                (
                    Grid {
                        row_div: bh,
                        col_div: bw,
                        row_stride: nc,
                        slice_stride: nr * nc,
                    },
                    slices * nr * nc,
                )
            }
        }
    }

    /// Number of column groups per row.
    pub fn groups(self, cols: usize) -> usize {
        match self {
            ScaleLayout::Tensor | ScaleLayout::Channel => 1,
            ScaleLayout::Group(g) => cols.div_ceil(g),
            ScaleLayout::Block(_, bw) => cols.div_ceil(bw),
        }
    }

    /// Scales per `group` input columns, or one a row (`None`: a config's
    /// group size of -1).
    pub(crate) fn of_group(group: Option<usize>) -> ScaleLayout {
        group.map_or(ScaleLayout::Channel, ScaleLayout::Group)
    }

    /// For people.
    pub fn describe(self) -> String {
        match self {
            ScaleLayout::Tensor => "per-tensor".into(),
            ScaleLayout::Channel => "per-channel".into(),
            ScaleLayout::Group(g) => format!("group {g}"),
            ScaleLayout::Block(h, w) => format!("block {h}x{w}"),
        }
    }
}

/// Reads a scale (or plain zero-point) tensor on `layout`, checking that it
/// holds exactly the entries the layout needs.
pub fn grid_values<'c>(
    t: TensorRef<'c>,
    kind: ValueKind,
    layout: ScaleLayout,
    dims: Dims,
) -> Result<Values<'c>> {
    if matches!(
        layout,
        ScaleLayout::Group(0) | ScaleLayout::Block(0, _) | ScaleLayout::Block(_, 0)
    ) {
        return Err(t.error(Rule::Config, "group or block size 0"));
    }
    let (grid, want) = layout.grid(dims);
    let groups = layout.groups(dims.cols);
    let last_ok = match layout {
        ScaleLayout::Tensor => true,
        ScaleLayout::Channel => t.shape.last().is_none_or(|&l| l == 1 || t.shape.len() == 1),
        _ => t.shape.last() == Some(&groups),
    };
    if t.elements() != want || !last_ok {
        return Err(t.error(
            Rule::TensorShape,
            format!(
                "shape {:?} does not fit the {} grid of a {}x{}{} weight ({want} entries)",
                t.shape,
                layout.describe(),
                dims.rows,
                dims.cols,
                if dims.slices > 1 {
                    format!(" x{}", dims.slices)
                } else {
                    String::new()
                },
            ),
        ));
    }
    Ok(Values {
        data: t.into(),
        kind,
        grid,
    })
}

/// The f32 reading of a float scale dtype.
pub fn float_kind(t: &TensorRef<'_>) -> Result<ValueKind> {
    match t.dtype {
        Dtype::BF16 => Ok(ValueKind::Bf16),
        Dtype::F16 => Ok(ValueKind::F16),
        Dtype::F32 => Ok(ValueKind::F32),
        _ => Err(t.error(
            Rule::TensorDtype,
            format!("dtype {}, expected BF16, F16 or F32", t.dtype),
        )),
    }
}

/// The f32 reading of a stored zero point: an integer or a float.
pub fn stored_kind(t: &TensorRef<'_>) -> Result<ValueKind> {
    match t.dtype {
        Dtype::I8 => Ok(ValueKind::I8),
        Dtype::I32 => Ok(ValueKind::I32),
        Dtype::BF16 | Dtype::F16 | Dtype::F32 => float_kind(t),
        other => Err(t.error(
            Rule::TensorDtype,
            format!("dtype {other:?}, expected I8, I32, BF16, F16 or F32"),
        )),
    }
}

/// A config's `group_size` as AutoAWQ and GPTQ write it: absent means 128,
/// -1 one group per row (`None`), anything else below 1 is CFG-001.
pub fn group_size(raw: Option<i64>, path: &Path) -> Result<Option<usize>> {
    match raw.unwrap_or(128) {
        -1 => Ok(None),
        g if g > 0 => Ok(Some(usize::try_from(g).unwrap_or(usize::MAX))),
        g => Err(Error::new(
            Rule::Config,
            path,
            format!("group_size {g}: expected a positive integer or -1"),
        )),
    }
}

/// A single f32 stored as `[]` or `[1]` (global scales).
pub fn scalar_f32(t: &TensorRef<'_>) -> Result<f32> {
    expect_dtype(t, &[Dtype::F32])?;
    if t.elements() != 1 {
        return Err(t.error(
            Rule::TensorShape,
            format!("shape {:?}; a single value is expected", t.shape),
        ));
    }
    let bytes = t.data()?.get(..4).and_then(|b| b.try_into().ok());
    Ok(f32::from_le_bytes(bytes.unwrap_or_default()))
}

/// A 256-entry table from one byte to its effective scale.
pub fn byte_table(f: impl Fn(u8) -> f32) -> ValueKind {
    let mut t = Box::new([0f32; 256]);
    for (b, v) in t.iter_mut().enumerate() {
        *v = f(b as u8);
    }
    ValueKind::Table(t)
}

/// Values of the 16 E2M1 codes.
pub fn e2m1_values() -> Vec<f32> {
    (0..16u8).map(numerics::e2m1).collect()
}

/// Values of the 256 FP8 E4M3 bytes.
pub fn e4m3_values() -> Vec<f32> {
    (0..=255u8).map(numerics::e4m3).collect()
}

/// A module's FP8 E4M3 `weight` (one byte a code) and its `scale_param`
/// tensor, looked up and checked in that order.
pub fn fp8_weight<'c>(
    ckpt: &'c Checkpoint,
    module: &str,
    scale_param: &str,
) -> Result<(TensorRef<'c>, TensorRef<'c>)> {
    let w = require(ckpt, module, "weight")?;
    expect_dtype(&w, &[Dtype::F8_E4M3])?;
    Ok((w, require(ckpt, module, scale_param)?))
}

/// The dims of a 2-D or 3-D weight stored one element a code.
pub fn weight_dims(w: &TensorRef<'_>) -> Result<Dims> {
    let (slices, rows, cols) = split_shape(w, w.shape)?;
    Ok(Dims { slices, rows, cols })
}

/// An FP8 E4M3 weight, one byte a code, as a job still to be scaled.
pub fn fp8_job<'c>(w: &TensorRef<'c>, dims: Dims, out: OutDtype) -> DecodeJob<'c> {
    DecodeJob::new(dims, byte_codes(w, dims), e4m3_values(), out)
}

/// Fails unless every field of `fields` lies inside its bytes.
pub fn check_extent(
    t: &TensorRef<'_>,
    fields: &Fields<'_>,
    slices: usize,
    lanes: usize,
    len: usize,
) -> Result<()> {
    match fields.extent_bits(slices, lanes, len) {
        Some(end) if end <= t.len() as u64 * 8 => Ok(()),
        _ => Err(t.error(
            Rule::TensorShape,
            format!(
                "{} bytes are too few for {slices}x{lanes}x{len} {}-bit fields",
                t.len(),
                fields.bits
            ),
        )),
    }
}

/// Two FP4 (E2M1) codes per byte, low nibble first: `[.., rows, ceil(cols/2)]`.
pub fn fp4_codes<'c>(packed: &TensorRef<'c>, dims: Dims) -> Result<Fields<'c>> {
    expect_dtype(packed, &[Dtype::U8, Dtype::I8])?;
    let row_bytes = dims.cols.div_ceil(2);
    let (s, r, w) = split_shape(packed, packed.shape)?;
    if (s, r, w) != (dims.slices, dims.rows, row_bytes) {
        return Err(packed.error(
            Rule::TensorShape,
            format!(
                "shape {:?} does not hold {}x{} FP4 values",
                packed.shape, dims.rows, dims.cols
            ),
        ));
    }
    let fields = Fields::dense(*packed, 4, row_bytes as u64 * 8)
        .with_slice_bits((dims.rows * row_bytes) as u64 * 8);
    check_extent(packed, &fields, dims.slices, dims.rows, dims.cols)?;
    Ok(fields)
}

/// The job of a weight `w` stored as FP4 (E2M1) nibbles, `[.., rows,
/// cols/2]` (see [`fp4_job`]), and its dense shape, the last dimension
/// doubled.
pub fn fp4_weight_job<'c>(
    w: &TensorRef<'c>,
    scale: TensorRef<'c>,
    table: ValueKind,
    layout: ScaleLayout,
    out: OutDtype,
) -> Result<(DecodeJob<'c>, Vec<usize>)> {
    let (slices, rows, width) = split_shape(w, w.shape)?;
    let dims = Dims {
        slices,
        rows,
        cols: width.saturating_mul(2),
    };
    let job = fp4_job(w, dims, scale, table, layout, out)?;
    let mut shape = w.shape.to_vec();
    if let Some(last) = shape.last_mut() {
        *last = dims.cols;
    }
    Ok((job, shape))
}

/// The job of an FP4 (E2M1) weight: nibble codes, one byte-indexed scale
/// table (e4m3 or e8m0 with any global factor folded in), no zero point.
pub fn fp4_job<'c>(
    packed: &TensorRef<'c>,
    dims: Dims,
    scale: TensorRef<'c>,
    table: ValueKind,
    layout: ScaleLayout,
    out: OutDtype,
) -> Result<DecodeJob<'c>> {
    Ok(
        DecodeJob::new(dims, fp4_codes(packed, dims)?, e2m1_values(), out)
            .with_scale(grid_values(scale, table, layout, dims)?),
    )
}

/// One byte per element (int8 or FP8 weights), row-major.
pub fn byte_codes<'c>(t: &TensorRef<'c>, dims: Dims) -> Fields<'c> {
    Fields::dense(*t, 8, dims.cols as u64 * 8).with_slice_bits((dims.rows * dims.cols) as u64 * 8)
}

/// The dense output entry for a decoded module.
pub fn decoded_output<'c>(
    module: &str,
    shard: usize,
    shape: Vec<usize>,
    job: DecodeJob<'c>,
    scheme: String,
) -> Output<'c> {
    Output {
        name: format!("{module}.weight"),
        shard,
        shape,
        dtype: job.out.safetensors(),
        source: Source::Decode(Box::new(job)),
        scheme: Some(scheme),
    }
}

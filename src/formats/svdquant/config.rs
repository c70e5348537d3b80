//! diffuse_compressor's SVDQuant config: the safetensors metadata
//! `quantization_config` merged with the `model.config.yaml` sidecar (JSON
//! text; the sidecar wins where both say something), checked field by field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::error::{Error, Result, Rule};
use crate::plural::plural;

/// Residual precision of a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Signed 4-bit integers, 16-bit group scales.
    Int4,
    /// E2M1 codes, e4m3 group scales with per-row and per-tensor outer scales.
    Fp4,
}

/// How a target's tensors are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorLayout {
    /// Plain row-major tensors.
    Logical,
    /// Nunchaku's tensor-core tile order (see `tiles.rs`).
    NunchakuPacked,
}

impl TensorLayout {
    /// The name in the config (`runtime_tensor_layout`).
    pub fn name(self) -> &'static str {
        match self {
            TensorLayout::Logical => "logical",
            TensorLayout::NunchakuPacked => "nunchaku_packed",
        }
    }
}

/// One exported target.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TargetSpec {
    /// Target name.
    pub name: String,
    /// Prefix of its tensors.
    pub export_name: String,
    /// Source modules, in row order.
    pub modules: Vec<String>,
    /// Role of each module (may be empty).
    pub roles: Vec<String>,
    /// Residual precision.
    pub precision: Precision,
    /// Columns per residual scale.
    pub group_size: usize,
    /// `weight_layout.name`.
    pub weight_layout: String,
    /// `weight_scale_layout`, when set.
    pub weight_scale_layout: Option<String>,
    /// `runtime_tensor_layout`.
    pub tensor_layout: TensorLayout,
    /// `weight_layout.outer_scale_splits`: rows per module, when recorded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outer_scale_splits: Vec<usize>,
}

/// The kind of a structural patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum PatchKind {
    /// Children own consecutive input columns; outputs are summed; the last child holds the bias.
    #[serde(rename = "split_linear")]
    Linear,
    /// Children own consecutive output rows, each with its bias slice.
    #[serde(rename = "split_linear_output")]
    LinearOutput,
    /// A 1×1 convolution split by input channels, like `split_linear`.
    #[serde(rename = "split_conv")]
    Conv,
}

impl PatchKind {
    /// The name in the config.
    pub fn name(self) -> &'static str {
        match self {
            PatchKind::Linear => "split_linear",
            PatchKind::LinearOutput => "split_linear_output",
            PatchKind::Conv => "split_conv",
        }
    }

    /// The infix of the children's names (`<module>.linears.<i>`).
    pub fn children(self) -> &'static str {
        match self {
            PatchKind::Conv => "convs",
            _ => "linears",
        }
    }
}

/// One entry of `args.splits`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum Split {
    /// A size.
    Size(usize),
    /// A size of the original module: `in_features`, `out_features`,
    /// `in_channels`, `out_channels`.
    Named(String),
}

/// One structural patch.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Patch {
    /// Its type.
    #[serde(rename = "type")]
    pub kind: PatchKind,
    /// Module pattern (`*` matches one dotted segment).
    pub module: String,
    /// Split sizes.
    pub splits: Vec<Split>,
}

/// Why the runtime manifest was not emitted.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub struct Reason {
    /// `target`, `structural_patch` or `artifact`.
    pub kind: String,
    /// The target or patch.
    pub name: String,
    /// Why it was not emitted, in the exporter's words.
    pub reason: String,
}

/// The whole config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The sidecar (or, without one, the shard) it was read from.
    #[serde(skip)]
    pub path: PathBuf,
    /// `svdquant`.
    pub method: String,
    /// Default rank.
    pub rank: usize,
    /// Default weight dtype (`int4`, `fp4_e2m1_all`).
    pub weight_dtype: String,
    /// Default weight group size.
    pub weight_group_size: Option<usize>,
    /// Activation dtype.
    pub activation_dtype: String,
    /// Activation quantization enabled.
    pub activation_enabled: bool,
    /// GPTQ residual rounding enabled.
    pub gptq_enabled: bool,
    /// Targets, in file order.
    pub targets: Vec<TargetSpec>,
    /// Structural patches, in the order they were applied.
    pub patches: Vec<Patch>,
    /// `calibration.activation_shifts`: module → shift.
    pub activation_shifts: BTreeMap<String, f32>,
    /// `quantization_config.runtime_manifest` `schema` and `version`, when present.
    pub runtime_manifest: Option<(String, u64)>,
    /// `runtime_manifest_diagnostics.emitted`.
    pub manifest_emitted: Option<bool>,
    /// `runtime_manifest_diagnostics.reasons`.
    pub manifest_reasons: Vec<Reason>,
}

/// The config as written: serde reads every field (and names the path of a
/// field of the wrong type); [`Config::parse`] then checks what types alone
/// cannot say. `null` reads as absent, as in diffuse_compressor.
#[derive(Deserialize)]
struct Raw {
    method: String,
    rank: Positive,
    weight: RawWeight,
    gptq: RawGptq,
    activation: RawActivation,
    targets: Vec<RawTarget>,
    structural_patches: Vec<RawPatch>,
    calibration: Option<RawCalibration>,
    #[serde(rename = "quantization")]
    _quantization: Option<Map<String, Value>>,
    #[serde(rename = "artifact_cache")]
    _artifact_cache: Option<Map<String, Value>>,
    runtime_manifest: Option<RawManifest>,
    runtime_manifest_diagnostics: Option<RawDiagnostics>,
}

#[derive(Deserialize)]
struct RawWeight {
    dtype: String,
    group_size: Option<Positive>,
    #[serde(rename = "scale_dtypes")]
    _scale_dtypes: Option<Vec<Option<String>>>,
}

#[derive(Deserialize)]
struct RawGptq {
    enabled: Option<bool>,
    #[serde(rename = "damp_percentage")]
    _damp_percentage: Option<f64>,
    #[serde(rename = "block_size")]
    _block_size: Option<Positive>,
    #[serde(rename = "num_inv_tries")]
    _num_inv_tries: Option<Positive>,
    #[serde(rename = "hessian_block_size")]
    _hessian_block_size: Option<Positive>,
}

#[derive(Deserialize)]
struct RawActivation {
    dtype: String,
    enabled: Option<bool>,
    #[serde(rename = "scale_dtypes")]
    _scale_dtypes: Option<Vec<Option<String>>>,
    #[serde(rename = "group_size")]
    _group_size: Option<Positive>,
}

#[derive(Deserialize)]
struct RawTarget {
    name: String,
    export_name: Option<String>,
    modules: Vec<String>,
    roles: Option<Vec<String>>,
    precision: Option<String>,
    group_size: Option<Positive>,
    weight_layout: Option<RawWeightLayout>,
    weight_scale_layout: Option<String>,
    runtime_tensor_layout: Option<String>,
    #[serde(rename = "gptq")]
    _gptq: Option<Map<String, Value>>,
    #[serde(rename = "activation_quant")]
    _activation_quant: Option<Map<String, Value>>,
    #[serde(rename = "quant")]
    _quant: Option<Map<String, Value>>,
}

#[derive(Deserialize)]
struct RawWeightLayout {
    name: String,
    outer_scale_splits: Option<Vec<usize>>,
}

#[derive(Deserialize)]
struct RawPatch {
    #[serde(rename = "type")]
    kind: String,
    module: String,
    args: RawArgs,
}

#[derive(Deserialize)]
struct RawArgs {
    splits: Vec<Value>,
}

#[derive(Deserialize)]
struct RawCalibration {
    activation_shifts: Option<BTreeMap<String, f64>>,
}

#[derive(Deserialize)]
struct RawManifest {
    schema: String,
    version: u64,
}

#[derive(Deserialize)]
struct RawDiagnostics {
    emitted: Option<bool>,
    reasons: Option<Vec<Reason>>,
}

/// A whole number above zero.
#[derive(Debug, Clone, Copy)]
struct Positive(usize);

impl<'de> Deserialize<'de> for Positive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Positive, D::Error> {
        let n = u64::deserialize(d)?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n > 0)
            .map(Positive)
            .ok_or_else(|| serde::de::Error::custom("must be a positive integer"))
    }
}

fn err(path: &Path, field: &str, what: &str) -> Error {
    Error::new(Rule::Config, path, format!("{field} {what}"))
}

/// The precision a dtype name means (the names diffuse_compressor's runtime accepts).
fn precision(name: &str) -> Option<Precision> {
    match name.to_ascii_lowercase().as_str() {
        "int4" => Some(Precision::Int4),
        "fp4" | "nvfp4" | "fp4_e2m1_all" | "sfp4_e2m1_all" => Some(Precision::Fp4),
        _ => None,
    }
}

/// Checks target `t` (`targets[i]`) and fills in the defaults.
fn target(
    path: &Path,
    at: &str,
    t: RawTarget,
    default_group: Option<usize>,
    default_precision: &str,
) -> Result<TargetSpec> {
    let field = |key: &str| format!("{at}.{key}");
    if t.modules.is_empty() {
        return Err(err(
            path,
            &field("modules"),
            "must name at least one module",
        ));
    }
    let roles = t.roles.unwrap_or_default();
    if !roles.is_empty() && roles.len() != t.modules.len() {
        let what = format!(
            "has {} entries for {} modules",
            roles.len(),
            t.modules.len()
        );
        return Err(err(path, &field("roles"), &what));
    }
    let p = t.precision.as_deref().unwrap_or(default_precision);
    let precision = precision(p).ok_or_else(|| {
        Error::new(
            Rule::Unsupported,
            path,
            format!("{} {p:?} is not decoded (int4, fp4)", field("precision")),
        )
    })?;
    let group_size = match t.group_size.map(|g| g.0).or(default_group) {
        Some(g) => g,
        None => {
            let what = "is required (no weight.group_size default)";
            return Err(err(path, &field("group_size"), what));
        }
    };
    let (weight_layout, outer_scale_splits) = match t.weight_layout {
        Some(w) => (w.name, w.outer_scale_splits.unwrap_or_default()),
        None => ("svdq".to_string(), Vec::new()),
    };
    if weight_layout.contains("awq") {
        return Err(Error::new(
            Rule::Unsupported,
            path,
            format!(
                "{} {weight_layout:?}: AWQ targets are not decoded (only SVDQuant residuals)",
                field("weight_layout.name")
            ),
        ));
    }
    let tensor_layout = match t.runtime_tensor_layout.as_deref() {
        Some("logical") => TensorLayout::Logical,
        Some("nunchaku_packed") => TensorLayout::NunchakuPacked,
        Some(other) => {
            let what = format!("is {other:?}; expected \"logical\" or \"nunchaku_packed\"");
            return Err(err(path, &field("runtime_tensor_layout"), &what));
        }
        // Only the naive layout is logical by construction.
        None if weight_layout == "naive_svdq" => TensorLayout::Logical,
        None => return Err(err(path, &field("runtime_tensor_layout"), "is required")),
    };
    Ok(TargetSpec {
        export_name: t.export_name.unwrap_or_else(|| t.name.clone()),
        name: t.name,
        modules: t.modules,
        roles,
        precision,
        group_size,
        weight_layout,
        weight_scale_layout: t.weight_scale_layout,
        tensor_layout,
        outer_scale_splits,
    })
}

/// Checks patch `p` (`structural_patches[i]`).
fn patch(path: &Path, at: &str, p: RawPatch) -> Result<Patch> {
    let field = |key: &str| format!("{at}.{key}");
    let kind = match p.kind.as_str() {
        "split_linear" => PatchKind::Linear,
        "split_linear_output" => PatchKind::LinearOutput,
        "split_conv" => PatchKind::Conv,
        other => {
            return Err(Error::new(
                Rule::Unsupported,
                path,
                format!(
                    "{} {other:?} cannot be undone (split_linear, split_linear_output, split_conv)",
                    field("type")
                ),
            ))
        }
    };
    if p.module.is_empty() {
        return Err(err(path, &field("module"), "must not be empty"));
    }
    let named: &[&str] = match kind {
        PatchKind::Conv => &["in_channels", "out_channels"],
        _ => &["in_features", "out_features"],
    };
    let splits_at = field("args.splits");
    let splits = p
        .args
        .splits
        .iter()
        .map(|v| match v {
            Value::Number(n) => n
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Split::Size)
                .ok_or_else(|| err(path, &splits_at, "sizes must be non-negative integers")),
            Value::String(s) if named.contains(&s.as_str()) => Ok(Split::Named(s.clone())),
            _ => {
                let what = format!("entries must be sizes or one of {}", named.join(", "));
                Err(err(path, &splits_at, &what))
            }
        })
        .collect::<Result<Vec<_>>>()?;
    if splits.is_empty() {
        return Err(err(path, &splits_at, "must not be empty"));
    }
    Ok(Patch {
        kind,
        module: p.module,
        splits,
    })
}

impl TargetSpec {
    /// `inspect`'s line: where the target's tensors are, how they are laid
    /// out, and the modules it holds, in row order.
    fn report_line(&self) -> String {
        let modules: Vec<String> = self
            .modules
            .iter()
            .enumerate()
            .map(|(i, m)| match self.roles.get(i) {
                Some(r) => format!("{m} ({r})"),
                None => m.clone(),
            })
            .collect();
        format!(
            "target {} [{} g{}, {}, scales {}, {}] -> {}",
            self.export_name,
            match self.precision {
                Precision::Int4 => "int4",
                Precision::Fp4 => "fp4",
            },
            self.group_size,
            self.weight_layout,
            self.weight_scale_layout.as_deref().unwrap_or("-"),
            self.tensor_layout.name(),
            modules.join(", ")
        )
    }
}

impl Patch {
    /// `inspect`'s line: the patch, which decoding undoes.
    fn report_line(&self) -> String {
        let splits: Vec<String> = self
            .splits
            .iter()
            .map(|x| match x {
                Split::Size(n) => n.to_string(),
                Split::Named(n) => n.clone(),
            })
            .collect();
        format!(
            "patch  {} {} splits [{}] (undone)",
            self.module,
            self.kind.name(),
            splits.join(", ")
        )
    }
}

impl Config {
    /// inspect's format line: the rank, the weights, and how many targets
    /// and patches.
    pub fn format_line(&self) -> String {
        format!(
            "svdquant rank {} ({} weights, {}, {})",
            self.rank,
            self.weight_dtype,
            plural(self.targets.len(), "target"),
            plural(self.patches.len(), "structural patch")
        )
    }

    /// `inspect`'s lines: the defaults, then each target, patch and
    /// activation shift, then what the runtime manifest says.
    pub fn report_lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "method {}, rank {}; weights {} (group {}), activations {}{}; gptq {}",
            self.method,
            self.rank,
            self.weight_dtype,
            self.weight_group_size.map_or("-".into(), |g| g.to_string()),
            self.activation_dtype,
            crate::formats::when(!self.activation_enabled, " (disabled)"),
            if self.gptq_enabled { "on" } else { "off" },
        )];
        lines.extend(self.targets.iter().map(TargetSpec::report_line));
        lines.extend(self.patches.iter().map(Patch::report_line));
        lines.extend(
            self.activation_shifts
                .iter()
                .map(|(m, v)| format!("shift  {m} +{v} (folded into its bias)")),
        );
        if let Some((schema, version)) = &self.runtime_manifest {
            lines.push(format!("runtime manifest {schema} v{version}"));
        }
        if self.manifest_emitted == Some(false) {
            lines.push(format!(
                "runtime manifest not emitted: {}",
                plural(self.manifest_reasons.len(), "reason")
            ));
        }
        lines
    }

    /// Parses the merged config. `meta` is the safetensors metadata
    /// `quantization_config` (with the file it came from), `sidecar` the
    /// `model.config.yaml`.
    pub fn parse(
        meta: Option<(&Path, &Value)>,
        sidecar: Option<(&Path, &Value)>,
    ) -> Result<Config> {
        let mut merged = Map::new();
        let mut path = PathBuf::new();
        for (p, v, what) in meta
            .map(|(p, v)| (p, v, "quantization_config"))
            .into_iter()
            .chain(sidecar.map(|(p, v)| (p, v, "the sidecar")))
        {
            let map = v
                .as_object()
                .ok_or_else(|| err(p, what, "must be an object"))?;
            merged.extend(map.clone());
            path = p.to_path_buf();
        }
        if sidecar.is_none() {
            return Err(Error::new(
                Rule::Config,
                &path,
                "SVDQuant metadata without its model.config.yaml: the targets, structural patches and shifts are only there",
            ));
        }
        let raw: Raw = super::super::from_value(&path, &Value::Object(merged))?;
        if raw.method != "svdquant" {
            return Err(Error::new(
                Rule::Unsupported,
                &path,
                format!("method {:?} is not decoded (svdquant)", raw.method),
            ));
        }
        let weight_group_size = raw.weight.group_size.map(|g| g.0);
        let targets = raw
            .targets
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                let at = format!("targets[{i}]");
                target(&path, &at, t, weight_group_size, &raw.weight.dtype)
            })
            .collect::<Result<Vec<_>>>()?;
        let patches = raw
            .structural_patches
            .into_iter()
            .enumerate()
            .map(|(i, p)| patch(&path, &format!("structural_patches[{i}]"), p))
            .collect::<Result<Vec<_>>>()?;
        let activation_shifts = raw
            .calibration
            .and_then(|c| c.activation_shifts)
            .unwrap_or_default()
            .into_iter()
            .map(|(module, s)| (module, s as f32))
            .collect();
        let diagnostics = raw.runtime_manifest_diagnostics;
        Ok(Config {
            path: path.clone(),
            method: raw.method,
            rank: raw.rank.0,
            weight_dtype: raw.weight.dtype,
            weight_group_size,
            activation_dtype: raw.activation.dtype,
            activation_enabled: raw.activation.enabled.unwrap_or(false),
            gptq_enabled: raw.gptq.enabled.unwrap_or(false),
            targets,
            patches,
            activation_shifts,
            runtime_manifest: raw.runtime_manifest.map(|m| (m.schema, m.version)),
            manifest_emitted: diagnostics.as_ref().and_then(|d| d.emitted),
            manifest_reasons: diagnostics.and_then(|d| d.reasons).unwrap_or_default(),
        })
    }
}

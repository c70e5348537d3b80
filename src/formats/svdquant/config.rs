//! diffuse_compressor's SVDQuant config: the safetensors metadata
//! `quantization_config` merged with the `model.config.yaml` sidecar (JSON
//! text; the sidecar wins where both say something), checked field by field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Result, Rule};

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
#[serde(rename_all = "snake_case")]
pub enum PatchKind {
    /// Children own consecutive input columns; outputs are summed; the last child holds the bias.
    SplitLinear,
    /// Children own consecutive output rows, each with its bias slice.
    SplitLinearOutput,
    /// A 1×1 convolution split by input channels, like `split_linear`.
    SplitConv,
}

impl PatchKind {
    /// The name in the config.
    pub fn name(self) -> &'static str {
        match self {
            PatchKind::SplitLinear => "split_linear",
            PatchKind::SplitLinearOutput => "split_linear_output",
            PatchKind::SplitConv => "split_conv",
        }
    }

    /// The infix of the children's names (`<module>.linears.<i>`).
    pub fn children(self) -> &'static str {
        match self {
            PatchKind::SplitConv => "convs",
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
#[derive(Debug, Clone, serde::Serialize)]
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

/// Reads fields of one JSON object, naming the field in every error.
struct Obj<'v> {
    path: &'v Path,
    at: String,
    map: &'v Map<String, Value>,
}

impl<'v> Obj<'v> {
    fn new(path: &'v Path, at: String, v: &'v Value) -> Result<Obj<'v>> {
        match v.as_object() {
            Some(map) => Ok(Obj { path, at, map }),
            None => Err(err(path, &at, "must be an object")),
        }
    }

    fn field(&self, key: &str) -> String {
        if self.at.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.at)
        }
    }

    fn err(&self, key: &str, what: &str) -> Error {
        err(self.path, &self.field(key), what)
    }

    /// The value of `key`, `None` when absent or null.
    fn opt(&self, key: &str) -> Option<&'v Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn req(&self, key: &str) -> Result<&'v Value> {
        self.opt(key).ok_or_else(|| self.err(key, "is required"))
    }

    fn obj(&self, key: &str) -> Result<Obj<'v>> {
        Obj::new(self.path, self.field(key), self.req(key)?)
    }

    fn opt_obj(&self, key: &str) -> Result<Option<Obj<'v>>> {
        self.opt(key)
            .map(|v| Obj::new(self.path, self.field(key), v))
            .transpose()
    }

    fn string(&self, key: &str) -> Result<&'v str> {
        self.req(key)?
            .as_str()
            .ok_or_else(|| self.err(key, "must be a string"))
    }

    fn opt_string(&self, key: &str) -> Result<Option<&'v str>> {
        self.opt(key)
            .map(|v| v.as_str().ok_or_else(|| self.err(key, "must be a string")))
            .transpose()
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.opt(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.err(key, "must be true or false"))
            })
            .transpose()
    }

    fn positive(&self, key: &str) -> Result<usize> {
        self.opt_positive(key)?
            .ok_or_else(|| self.err(key, "is required"))
    }

    fn opt_positive(&self, key: &str) -> Result<Option<usize>> {
        self.opt(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|&n| n > 0)
                    .ok_or_else(|| self.err(key, "must be a positive integer"))
            })
            .transpose()
    }

    fn array(&self, key: &str) -> Result<&'v Vec<Value>> {
        self.req(key)?
            .as_array()
            .ok_or_else(|| self.err(key, "must be a list"))
    }

    fn strings(&self, key: &str) -> Result<Vec<String>> {
        self.array(key)?
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| self.err(key, "must be a list of strings"))
            })
            .collect()
    }

    fn opt_number(&self, key: &str) -> Result<Option<f64>> {
        self.opt(key)
            .map(|v| v.as_f64().ok_or_else(|| self.err(key, "must be a number")))
            .transpose()
    }

    /// An optional list whose entries are strings or null (`scale_dtypes`).
    fn scale_dtypes(&self, key: &str) -> Result<()> {
        if self.opt(key).is_none() {
            return Ok(());
        }
        let ok = self
            .array(key)?
            .iter()
            .all(|v| v.is_null() || v.is_string());
        if ok {
            Ok(())
        } else {
            Err(self.err(key, "must be a list of dtype names or nulls"))
        }
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

fn target(
    o: &Obj<'_>,
    default_group: Option<usize>,
    default_precision: &str,
) -> Result<TargetSpec> {
    let name = o.string("name")?.to_string();
    let export_name = o.opt_string("export_name")?.unwrap_or(&name).to_string();
    let modules = o.strings("modules")?;
    if modules.is_empty() {
        return Err(o.err("modules", "must name at least one module"));
    }
    let roles = match o.opt("roles") {
        None => Vec::new(),
        Some(_) => o.strings("roles")?,
    };
    if !roles.is_empty() && roles.len() != modules.len() {
        return Err(o.err(
            "roles",
            &format!("has {} entries for {} modules", roles.len(), modules.len()),
        ));
    }
    let p = o.opt_string("precision")?.unwrap_or(default_precision);
    let precision = precision(p).ok_or_else(|| {
        Error::new(
            Rule::Unsupported,
            o.path,
            format!("{} {p:?} is not decoded (int4, fp4)", o.field("precision")),
        )
    })?;
    let group_size = match o.opt_positive("group_size")?.or(default_group) {
        Some(g) => g,
        None => return Err(o.err("group_size", "is required (no weight.group_size default)")),
    };
    let (weight_layout, outer_scale_splits) = match o.opt_obj("weight_layout")? {
        Some(w) => {
            let splits = match w.opt("outer_scale_splits") {
                None => Vec::new(),
                Some(v) => v
                    .as_array()
                    .and_then(|a| {
                        a.iter()
                            .map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok()))
                            .collect::<Option<Vec<usize>>>()
                    })
                    .ok_or_else(|| w.err("outer_scale_splits", "must be a list of row counts"))?,
            };
            (w.string("name")?.to_string(), splits)
        }
        None => ("svdq".to_string(), Vec::new()),
    };
    if weight_layout.contains("awq") {
        return Err(Error::new(
            Rule::Unsupported,
            o.path,
            format!(
                "{} {weight_layout:?}: AWQ targets are not decoded (only SVDQuant residuals)",
                o.field("weight_layout.name")
            ),
        ));
    }
    let tensor_layout = match o.opt_string("runtime_tensor_layout")? {
        Some("logical") => TensorLayout::Logical,
        Some("nunchaku_packed") => TensorLayout::NunchakuPacked,
        Some(other) => {
            return Err(o.err(
                "runtime_tensor_layout",
                &format!("is {other:?}; expected \"logical\" or \"nunchaku_packed\""),
            ))
        }
        // Only the naive layout is logical by construction.
        None if weight_layout == "naive_svdq" => TensorLayout::Logical,
        None => return Err(o.err("runtime_tensor_layout", "is required")),
    };
    for key in ["gptq", "activation_quant", "quant"] {
        o.opt_obj(key)?;
    }
    Ok(TargetSpec {
        name,
        export_name,
        modules,
        roles,
        precision,
        group_size,
        weight_layout,
        weight_scale_layout: o.opt_string("weight_scale_layout")?.map(str::to_string),
        tensor_layout,
        outer_scale_splits,
    })
}

fn patch(o: &Obj<'_>) -> Result<Patch> {
    let kind = match o.string("type")? {
        "split_linear" => PatchKind::SplitLinear,
        "split_linear_output" => PatchKind::SplitLinearOutput,
        "split_conv" => PatchKind::SplitConv,
        other => {
            return Err(Error::new(
                Rule::Unsupported,
                o.path,
                format!(
                    "{} {other:?} cannot be undone (split_linear, split_linear_output, split_conv)",
                    o.field("type")
                ),
            ))
        }
    };
    let module = o.string("module")?.to_string();
    if module.is_empty() {
        return Err(o.err("module", "must not be empty"));
    }
    let args = o.obj("args")?;
    let named: &[&str] = match kind {
        PatchKind::SplitConv => &["in_channels", "out_channels"],
        _ => &["in_features", "out_features"],
    };
    let splits = args
        .array("splits")?
        .iter()
        .map(|v| match v {
            Value::Number(n) => n
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Split::Size)
                .ok_or_else(|| args.err("splits", "sizes must be non-negative integers")),
            Value::String(s) if named.contains(&s.as_str()) => Ok(Split::Named(s.clone())),
            _ => Err(args.err(
                "splits",
                &format!("entries must be sizes or one of {}", named.join(", ")),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    if splits.is_empty() {
        return Err(args.err("splits", "must not be empty"));
    }
    Ok(Patch {
        kind,
        module,
        splits,
    })
}

impl Config {
    /// Parses the merged config. `meta` is the safetensors metadata
    /// `quantization_config` (with the file it came from), `sidecar` the
    /// `model.config.yaml`.
    pub fn parse(
        meta: Option<(&Path, &Value)>,
        sidecar: Option<(&Path, &Value)>,
    ) -> Result<Config> {
        let mut merged = Map::new();
        let mut path = PathBuf::new();
        if let Some((p, v)) = meta {
            let o = Obj::new(p, "quantization_config".into(), v)?;
            merged.extend(o.map.clone());
            path = p.to_path_buf();
        }
        if let Some((p, v)) = sidecar {
            let o = Obj::new(p, String::new(), v)?;
            merged.extend(o.map.clone());
            path = p.to_path_buf();
        }
        let merged = Value::Object(merged);
        let o = Obj::new(&path, String::new(), &merged)?;
        if sidecar.is_none() {
            return Err(Error::new(
                Rule::Config,
                &path,
                "SVDQuant metadata without its model.config.yaml: the targets, structural patches and shifts are only there",
            ));
        }

        let method = o.string("method")?;
        if method != "svdquant" {
            return Err(Error::new(
                Rule::Unsupported,
                &path,
                format!("method {method:?} is not decoded (svdquant)"),
            ));
        }
        let rank = o.positive("rank")?;
        let weight = o.obj("weight")?;
        let weight_dtype = weight.string("dtype")?.to_string();
        let weight_group_size = weight.opt_positive("group_size")?;
        weight.scale_dtypes("scale_dtypes")?;
        let gptq = o.obj("gptq")?;
        let gptq_enabled = gptq.opt_bool("enabled")?.unwrap_or(false);
        gptq.opt_number("damp_percentage")?;
        for key in ["block_size", "num_inv_tries", "hessian_block_size"] {
            gptq.opt_positive(key)?;
        }
        let activation = o.obj("activation")?;
        let activation_dtype = activation.string("dtype")?.to_string();
        let activation_enabled = activation.opt_bool("enabled")?.unwrap_or(false);
        activation.scale_dtypes("scale_dtypes")?;
        activation.opt_positive("group_size")?;

        let targets = o
            .array("targets")?
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let t = Obj::new(&path, format!("targets[{i}]"), t)?;
                target(&t, weight_group_size, &weight_dtype)
            })
            .collect::<Result<Vec<_>>>()?;
        let patches = o
            .array("structural_patches")?
            .iter()
            .enumerate()
            .map(|(i, p)| patch(&Obj::new(&path, format!("structural_patches[{i}]"), p)?))
            .collect::<Result<Vec<_>>>()?;

        let mut activation_shifts = BTreeMap::new();
        if let Some(cal) = o.opt_obj("calibration")? {
            if let Some(shifts) = cal.opt_obj("activation_shifts")? {
                for (module, v) in shifts.map {
                    let s = v
                        .as_f64()
                        .filter(|s| s.is_finite())
                        .ok_or_else(|| shifts.err(module, "must be a finite number"))?;
                    activation_shifts.insert(module.clone(), s as f32);
                }
            }
        }
        for key in ["quantization", "artifact_cache"] {
            o.opt_obj(key)?;
        }
        let runtime_manifest = match o.opt_obj("runtime_manifest")? {
            None => None,
            Some(m) => Some((m.string("schema")?.to_string(), {
                let v = m.req("version")?;
                v.as_u64()
                    .ok_or_else(|| m.err("version", "must be an integer"))?
            })),
        };
        let (manifest_emitted, manifest_reasons) =
            match o.opt_obj("runtime_manifest_diagnostics")? {
                None => (None, Vec::new()),
                Some(d) => {
                    let emitted = d.opt_bool("emitted")?;
                    let reasons = match d.opt("reasons") {
                        None => Vec::new(),
                        Some(_) => d
                            .array("reasons")?
                            .iter()
                            .enumerate()
                            .map(|(i, r)| {
                                let r = Obj::new(&path, format!("{}.reasons[{i}]", d.at), r)?;
                                Ok(Reason {
                                    kind: r.string("kind")?.to_string(),
                                    name: r.string("name")?.to_string(),
                                    reason: r.string("reason")?.to_string(),
                                })
                            })
                            .collect::<Result<Vec<_>>>()?,
                    };
                    (emitted, reasons)
                }
            };
        Ok(Config {
            path: path.clone(),
            method: method.to_string(),
            rank,
            weight_dtype,
            weight_group_size,
            activation_dtype,
            activation_enabled,
            gptq_enabled,
            targets,
            patches,
            activation_shifts,
            runtime_manifest,
            manifest_emitted,
            manifest_reasons,
        })
    }
}

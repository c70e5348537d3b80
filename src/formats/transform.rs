//! compressed-tensors' `transform_config` (QuIP, SpinQuant, Hadamard
//! rotations from llmcompressor). Each scheme's `apply` entries put one
//! matrix at a location of the modules they target: `weight_input` and
//! `weight_output` are fused into the stored weights already; `input` and
//! `output` rotate a Linear's activations at inference (`x·M`, `y·M`, with
//! `M = T/√n`, `Tᵀ` when `inverse`, block-diagonal over `head_dim`), which a
//! plain dense model can only hold folded into the weight
//! ([`crate::output::fold`]); `q_attn` with `k_cache` (SpinQuant's R3)
//! rotates queries and keys alike and cancels in `q·kᵀ`. Only the first
//! module of each (scheme, size) stores `T`, as
//! `{module}.{scheme}_{location}.weight`; the others share it.

use std::path::Path;
use std::sync::Arc;

use indexmap::IndexMap;
use safetensors::Dtype;
use serde_json::Value;

use super::{Target, Targets};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result, Rule};
use crate::output::fold::Rotation;

/// A parsed `transform_config`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Transforms {
    /// Its schemes, in file order.
    pub schemes: Vec<Scheme>,
}

/// One `config_groups` entry.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Scheme {
    /// Its key (the stored matrices' prefix).
    pub name: String,
    /// `hadamard` or `random-hadamard`.
    pub kind: String,
    /// Block size, when the matrix is block-diagonal.
    pub head_dim: Option<usize>,
    /// Where it applies.
    pub apply: Vec<Apply>,
}

/// One `apply` entry.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Apply {
    /// Modules it selects.
    pub targets: Targets,
    /// Modules it leaves out.
    pub ignore: Targets,
    /// `input`, `output`, `weight_input`, `weight_output`, `q_attn`, `k_cache`.
    pub location: String,
    /// `Tᵀ` instead of `T`.
    pub inverse: bool,
}

impl Apply {
    /// Whether it selects `module` (class names in `ignore` cannot be told
    /// from a checkpoint and leave nothing out).
    fn selects(&self, module: &str) -> bool {
        self.targets.rank(module).is_some() && !self.ignore.names_module(module)
    }
}

#[derive(serde::Deserialize)]
struct RawConfig {
    #[serde(default)]
    config_groups: IndexMap<String, RawScheme>,
}

#[derive(serde::Deserialize)]
struct RawScheme {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    apply: Vec<RawApply>,
    #[serde(default)]
    randomize: bool,
    head_dim: Option<usize>,
}

#[derive(serde::Deserialize)]
struct RawApply {
    #[serde(deserialize_with = "one_or_many")]
    targets: Vec<String>,
    location: String,
    #[serde(default)]
    inverse: bool,
    #[serde(default, deserialize_with = "one_or_many")]
    ignore: Vec<String>,
}

/// A string or a list of them (compressed-tensors wraps a single one).
fn one_or_many<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<String>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Either {
        One(String),
        Many(Vec<String>),
    }
    Ok(match serde::Deserialize::deserialize(d)? {
        Either::One(s) => vec![s],
        Either::Many(v) => v,
    })
}

/// Locations a dense weight holds as stored.
const FUSED: &[&str] = &["weight_input", "weight_output"];
/// Locations folded into the weight.
const ONLINE: &[&str] = &["input", "output"];
/// Locations that cancel each other in attention (and only together).
const ATTENTION: &[&str] = &["q_attn", "k_cache"];

impl Transforms {
    /// Parses `transform_config` of `path`; `None` when it sets nothing.
    pub fn parse(path: &Path, v: &Value) -> Result<Option<Transforms>> {
        let empty = match v {
            Value::Null => true,
            Value::Object(o) => o
                .values()
                .all(|v| v.is_null() || v.as_object().is_some_and(|o| o.is_empty())),
            _ => false,
        };
        if empty {
            return Ok(None);
        }
        let raw: RawConfig = super::from_value(path, v)?;
        let err = |rule, d: String| Error::new(rule, path, format!("transform_config: {d}"));
        let mut schemes = Vec::new();
        for (name, s) in raw.config_groups {
            if !["hadamard", "random-hadamard"].contains(&s.kind.as_str()) {
                return Err(err(
                    Rule::Unsupported,
                    format!("scheme {name} of type {:?} is not folded (hadamard and random-hadamard are)", s.kind),
                ));
            }
            if s.randomize {
                return Err(err(
                    Rule::Unsupported,
                    format!(
                        "scheme {name} is randomized (a permutation per module) and is not folded"
                    ),
                ));
            }
            if s.head_dim == Some(0) {
                return Err(err(Rule::Config, format!("scheme {name}: head_dim 0")));
            }
            let mut apply = Vec::new();
            for a in s.apply {
                let known = FUSED
                    .iter()
                    .chain(ONLINE)
                    .chain(ATTENTION)
                    .any(|l| *l == a.location);
                if !known {
                    return Err(err(
                        Rule::Unsupported,
                        format!(
                            "scheme {name} applies at location {:?}, which is not folded",
                            a.location
                        ),
                    ));
                }
                let targets = |list: Vec<String>| -> Result<Targets> {
                    list.iter()
                        .map(|t| {
                            Target::parse(t)
                                .map_err(|e| err(Rule::Config, format!("scheme {name}: {e}")))
                        })
                        .collect()
                };
                apply.push(Apply {
                    targets: targets(a.targets)?,
                    ignore: targets(a.ignore)?,
                    location: a.location,
                    inverse: a.inverse,
                });
            }
            let attention: Vec<&str> = apply
                .iter()
                .map(|a| a.location.as_str())
                .filter(|l| ATTENTION.contains(l))
                .collect();
            if attention.len() == 1 {
                return Err(err(
                    Rule::Unsupported,
                    format!(
                        "scheme {name} rotates at {} alone; only q_attn with k_cache cancels",
                        attention[0]
                    ),
                ));
            }
            schemes.push(Scheme {
                name,
                kind: s.kind,
                head_dim: s.head_dim,
                apply,
            });
        }
        Ok(Some(Transforms { schemes }))
    }

    /// `inspect`'s lines: what each scheme does where.
    pub fn report_lines(&self) -> Vec<String> {
        self.schemes
            .iter()
            .map(|s| {
                let what: Vec<String> = s
                    .apply
                    .iter()
                    .map(|a| {
                        let how = if FUSED.contains(&a.location.as_str()) {
                            "fused in the stored weights"
                        } else if ONLINE.contains(&a.location.as_str()) {
                            "online, folded in"
                        } else {
                            "online, cancels in q·kᵀ: dropped"
                        };
                        format!(
                            "{}{} ({how})",
                            a.location,
                            if a.inverse { " inverse" } else { "" }
                        )
                    })
                    .collect();
                let block = s
                    .head_dim
                    .map(|h| format!(" block {h}"))
                    .unwrap_or_default();
                format!(
                    "transform {} {}{block}: {}",
                    s.name,
                    s.kind,
                    what.join(", ")
                )
            })
            .collect()
    }

    /// The stored matrices, which no dense model holds: `{m}.{scheme}_{location}.weight`.
    pub fn stored_matrices<'c>(&self, ckpt: &'c Checkpoint) -> Vec<&'c str> {
        let suffixes: Vec<String> = self
            .schemes
            .iter()
            .flat_map(|s| {
                s.apply
                    .iter()
                    .map(move |a| format!(".{}_{}.weight", s.name, a.location))
            })
            .collect();
        ckpt.names()
            .into_iter()
            .filter(|n| suffixes.iter().any(|s| n.ends_with(s.as_str())))
            .collect()
    }

    /// Whether an online rotation (input or output) selects `module`.
    pub fn rotates(&self, module: &str) -> bool {
        self.schemes
            .iter()
            .flat_map(|s| &s.apply)
            .any(|a| ONLINE.contains(&a.location.as_str()) && a.selects(module))
    }

    /// The online rotations of Linear `module` of `rows × cols` (`[out, in]`):
    /// on its input, on its output.
    pub fn rotations(
        &self,
        ckpt: &Checkpoint,
        module: &str,
        (rows, cols): (usize, usize),
    ) -> Result<(Option<Rotation>, Option<Rotation>)> {
        let mut sides: [Option<Rotation>; 2] = [None, None];
        for s in &self.schemes {
            for a in &s.apply {
                let Some(side) = ONLINE.iter().position(|l| *l == a.location) else {
                    continue;
                };
                if !a.selects(module) {
                    continue;
                }
                let size = if side == 0 { cols } else { rows };
                let n = s.head_dim.unwrap_or(size);
                let err = |rule, d: String| Error::tensor(rule, ckpt.display_path(), module, d);
                if !size.is_multiple_of(n) {
                    return Err(err(
                        Rule::TensorShape,
                        format!(
                            "scheme {}'s block {n} does not divide the {} size {size}",
                            s.name, a.location
                        ),
                    ));
                }
                if sides[side].is_some() {
                    return Err(err(
                        Rule::Unsupported,
                        format!("more than one online rotation at its {}", a.location),
                    ));
                }
                sides[side] = Some(Rotation {
                    n,
                    matrix: matrix(ckpt, module, &s.name, &a.location, n)?,
                    inverse: a.inverse,
                });
            }
        }
        let [input, output] = sides;
        Ok((input, output))
    }
}

/// The `n × n` matrix of `scheme` at `location`: the module's own, else the
/// one another module stores for the same size (entries ±1).
fn matrix(
    ckpt: &Checkpoint,
    module: &str,
    scheme: &str,
    location: &str,
    n: usize,
) -> Result<Arc<[f64]>> {
    let suffix = format!(".{scheme}_{location}.weight");
    let own = format!("{module}{suffix}");
    let t = ckpt
        .get(&own)
        .filter(|t| t.shape == [n, n])
        .or_else(|| {
            ckpt.names()
                .into_iter()
                .filter(|name| name.ends_with(&suffix))
                .filter_map(|name| ckpt.get(name))
                .find(|t| t.shape == [n, n])
        })
        .ok_or_else(|| {
            let why = format!(
                "rotated online by scheme {scheme}, but no *{suffix} of shape [{n}, {n}] is stored"
            );
            super::missing(ckpt, own.clone(), why)
        })?;
    if t.dtype != Dtype::F64 && t.dtype != Dtype::F32 {
        return Err(t.error(
            Rule::TensorDtype,
            format!("dtype {}, expected F64 (or F32)", t.dtype),
        ));
    }
    let d = t.data()?;
    let values: Vec<f64> = match t.dtype {
        Dtype::F64 => d
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        _ => d
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
    };
    // Hadamard matrices are ±1 (compressed-tensors normalises when it
    // applies them): their sums are exact, and the fold rounds once.
    if let Some(i) = values.iter().position(|v| v.abs() != 1.0) {
        return Err(t.error(
            Rule::TensorValue,
            format!("entry {i} is {}; a Hadamard matrix holds ±1", values[i]),
        ));
    }
    Ok(values.into())
}

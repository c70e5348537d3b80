//! `convert --to compressed-tensors`: quantized checkpoints of other
//! producers rewritten as compressed-tensors checkpoints, tensor for tensor
//! what compressed-tensors' own converters write (rule CT-005).
//!
//! - ModelOpt NVFP4 ([`modelopt`]): renamed, global scales inverted.
//! - AutoAWQ GEMM ([`awq`]): repacked into `pack-quantized` int4.

mod awq;
mod modelopt;

use serde_json::{json, Value};

use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule};
use crate::formats::Format;
use crate::hf::Names;
use crate::numerics::{DtypeChoice, OutDtype};
use crate::plan::Plan;

/// Formats `convert` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvertTo {
    /// compressed-tensors (`nvfp4-pack-quantized` or `pack-quantized`).
    CompressedTensors,
}

impl std::str::FromStr for ConvertTo {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "compressed-tensors" => Ok(ConvertTo::CompressedTensors),
            _ => Err(Error::bare(
                Rule::Argument,
                format!("--to: {s:?} is not a conversion target (compressed-tensors)"),
            )),
        }
    }
}

/// The compressed-tensors version whose layout and config keys the output follows.
const CT_VERSION: &str = "0.20.0";

fn ct005(t: &TensorRef<'_>, detail: impl Into<String>) -> Error {
    t.error(Rule::Ct005, detail)
}

/// Plans the conversion of `ckpt`: which tensors are written, renamed or
/// rearranged, and the config.json with its new `quantization_config`.
pub fn plan(ckpt: &Checkpoint, to: ConvertTo) -> Result<Plan<'_>> {
    let ConvertTo::CompressedTensors = to;
    // Planning the dense output checks every module (shapes, dtypes, scales).
    // A quantized checkpoint keeps the stored names (no hub names for MoE
    // experts: the converters find modules by the planned outputs' names).
    let mut plan = Plan::build(ckpt, DtypeChoice::Fixed(OutDtype::F32), Names::Stored)?;
    // The card says the weights are dense: a converted checkpoint is not.
    plan.generated
        .retain(|(name, _)| name != crate::checkpoint::CARD);
    match plan.format.clone() {
        Format::Modelopt(cfg) => modelopt::convert(ckpt, &cfg, plan),
        Format::Awq(cfg) => awq::convert(ckpt, &cfg, plan),
        other => Err(Error::new(
            Rule::Ct005,
            ckpt.display_path(),
            format!(
                "convert --to compressed-tensors reads ModelOpt NVFP4 and AutoAWQ GEMM checkpoints; this is {}",
                other.describe()
            ),
        )),
    }
}

/// The input's config.json (or `{}`) with `qc` as its `quantization_config`,
/// in the same place.
fn with_quantization_config(ckpt: &Checkpoint, qc: Value) -> Value {
    let mut config = ckpt
        .config
        .as_ref()
        .map(|c| c.value.clone())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    if let Some(obj) = config.as_object_mut() {
        obj.insert("quantization_config".into(), qc);
    }
    config
}

/// `s` with every character Python's `re.escape` escapes escaped.
fn py_re_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$#&-~ \t\n\r\x0b\x0c".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}

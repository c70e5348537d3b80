//! What `inspect` and `validate` show: the plan, for people or as JSON.

use std::fmt::Write as _;

use crate::error::Error;
use crate::formats::Format;
use crate::numerics::OutDtype;
use crate::plan::{Plan, Source, Warning};

/// A rule finding, flattened for JSON.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Finding {
    /// Rule id, e.g. `CT-004`.
    pub rule: &'static str,
    /// File concerned, when there is one.
    pub file: Option<String>,
    /// Tensor or module concerned.
    pub tensor: Option<String>,
    /// What is wrong.
    pub detail: String,
    /// The whole one-line message.
    pub message: String,
    /// The exit status the rule maps to.
    #[serde(skip)]
    pub exit_code: u8,
}

impl From<&Error> for Finding {
    fn from(e: &Error) -> Self {
        Finding {
            rule: e.rule.id(),
            file: e.file.as_ref().map(|f| f.display().to_string()),
            tensor: e.tensor.clone(),
            detail: e.detail.clone(),
            message: e.to_string(),
            exit_code: e.rule.exit_code(),
        }
    }
}

/// One output tensor.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TensorRow {
    /// Output name.
    pub name: String,
    /// Logical (output) shape.
    pub shape: Vec<usize>,
    /// Output dtype.
    pub dtype: String,
    /// `decode` or `copy`.
    pub action: &'static str,
    /// Decoding scheme, for decoded tensors.
    pub scheme: Option<String>,
    /// Output file.
    pub file: String,
}

/// Everything `inspect` reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The checkpoint path.
    pub(crate) path: String,
    /// One line describing the format.
    pub(crate) summary: String,
    /// Format and configuration.
    pub(crate) format: Format,
    /// Dtype of decoded tensors.
    pub(crate) dtype: OutDtype,
    /// Shard files.
    pub(crate) shards: Vec<String>,
    /// Output tensors.
    pub(crate) tensors: Vec<TensorRow>,
    /// How many of them come out of quantized modules ([`Plan::decoded`]).
    pub(crate) decoded: usize,
    /// Input tensors a dense checkpoint leaves out.
    pub(crate) dropped: Vec<String>,
    /// Rule violations (decoding refuses while there are any).
    pub(crate) errors: Vec<Finding>,
    /// Findings that do not stop decoding.
    pub(crate) warnings: Vec<Warning>,
    /// Tensors written under their architecture's hub names: stored → written.
    pub(crate) renamed: Vec<Renamed>,
}

/// A tensor written under its architecture's hub name (`hf::names`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Renamed {
    /// The name the quantized checkpoint stores.
    pub stored: String,
    /// The name the dense checkpoint gets.
    pub written: String,
}

impl Report {
    /// The rule violations found; decoding refuses while there are any.
    pub fn errors(&self) -> &[Finding] {
        &self.errors
    }

    /// The exit status for the findings: 0 when clean, else the first one's.
    pub fn exit_code(&self) -> u8 {
        self.errors.first().map_or(0, |e| e.exit_code)
    }

    /// The report of `plan`.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn new(plan: &Plan<'_>) -> Report {
        let ckpt = plan.checkpoint;
        Report {
            path: ckpt.display_path().display().to_string(),
            summary: plan.format.describe(),
            format: plan.format.clone(),
            dtype: plan.dtype,
            shards: ckpt.shards.iter().map(|s| s.file_name.clone()).collect(),
            tensors: plan
                .outputs
                .iter()
                .map(|o| TensorRow {
                    name: o.name.clone(),
                    shape: o.shape.clone(),
                    dtype: o.dtype.to_string(),
                    action: match o.source {
                        Source::Copy(_) => "copy",
                        Source::Cast(..) => "cast",
                        Source::Decode(_)
                        | Source::Assemble(_)
                        | Source::Fold(_)
                        | Source::Blocks(_) => "decode",
                        Source::Bytes(_) | Source::Bias(_) | Source::Rearrange(_) => "compute",
                    },
                    scheme: o.scheme.clone(),
                    file: ckpt
                        .shards
                        .get(o.shard)
                        .map(|s| s.file_name.clone())
                        .unwrap_or_default(),
                })
                .collect(),
            decoded: plan.decoded(),
            dropped: plan.dropped.clone(),
            errors: plan.errors.iter().map(Finding::from).collect(),
            warnings: plan.warnings.clone(),
            renamed: plan
                .renamed
                .iter()
                .map(|(stored, written)| Renamed {
                    stored: stored.clone(),
                    written: written.clone(),
                })
                .collect(),
        }
    }

    /// The report as aligned text.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let decoded = self.decoded;
        let copied = self
            .tensors
            .iter()
            .filter(|t| matches!(t.action, "copy" | "cast"))
            .count();
        let _ = writeln!(
            s,
            "checkpoint  {} ({} shard{})",
            self.path,
            self.shards.len(),
            if self.shards.len() == 1 { "" } else { "s" }
        );
        let _ = writeln!(s, "format      {}", self.summary);
        if let Some(r) = self.renamed.first() {
            let _ = writeln!(
                s,
                "names       {} get the names transformers loads (e.g. {} -> {}); --keep-names keeps the stored ones",
                crate::plural::plural(self.renamed.len(), "tensor"),
                r.stored,
                r.written
            );
        }
        for line in self.format.report_lines() {
            let _ = writeln!(s, "  {line}");
        }
        let _ = writeln!(
            s,
            "output      {}: {decoded} decoded to {}, {copied} copied; {} used up",
            crate::plural::plural(self.tensors.len(), "tensor"),
            self.dtype,
            crate::plural::plural(self.dropped.len(), "quantization tensor")
        );
        // Columns as wide as their longest entry up to COLUMN: a longer
        // one (a hostile header's) sticks out of its line alone, rather
        // than widening every line (or passing `format!`'s width limit).
        const COLUMN: usize = 256;
        let name_w = self.tensors.iter().map(|t| t.name.len()).max().unwrap_or(0);
        let name_w = name_w.min(COLUMN);
        let shape_w = self
            .tensors
            .iter()
            .map(|t| format!("{:?}", t.shape).len())
            .max()
            .unwrap_or(0)
            .min(COLUMN);
        for t in &self.tensors {
            let line = format!(
                "  {:<7}  {:<name_w$}  {:<shape_w$}  {:<7}  {}",
                t.action,
                t.name,
                format!("{:?}", t.shape),
                t.dtype,
                t.scheme.as_deref().unwrap_or("")
            );
            let _ = writeln!(s, "{}", line.trim_end());
        }
        if self.errors.is_empty() && self.warnings.is_empty() {
            let _ = writeln!(s, "findings    none");
        }
        for e in &self.errors {
            let _ = writeln!(s, "error       {}", e.message);
        }
        for w in &self.warnings {
            let _ = writeln!(s, "warning     {}: {}", w.subject, w.detail);
        }
        s
    }
}

/// Every rule finding of a checkpoint (`validate`): what stops decoding and
/// what does not. Serializes as `validate --json` prints it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Validation {
    /// Rule violations; decoding refuses while there are any.
    pub errors: Vec<Finding>,
    /// Findings that do not stop decoding.
    pub warnings: Vec<Warning>,
}

impl Validation {
    /// The findings of `plan`.
    pub(crate) fn of(plan: Plan<'_>) -> Validation {
        Validation {
            errors: plan.errors.iter().map(Finding::from).collect(),
            warnings: plan.warnings,
        }
    }

    /// The exit status for these findings: 0 when clean, else the first one's.
    pub fn exit_code(&self) -> u8 {
        self.errors.first().map_or(0, |e| e.exit_code)
    }
}

impl From<&Error> for Validation {
    /// A fault of the whole checkpoint, as the one finding.
    fn from(e: &Error) -> Self {
        Validation {
            errors: vec![Finding::from(e)],
            warnings: Vec::new(),
        }
    }
}

//! What `inspect` and `validate` show: the plan, for people or as JSON.

mod tensors;
mod totals;

use std::fmt::Write as _;
use std::path::Path;

use crate::error::Error;
use crate::formats::Format;
use crate::numerics::OutDtype;
use crate::plan::{Plan, Warning};
use crate::plural::plural;
use crate::writer::Schedule;
pub use tensors::TensorRow;

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

/// Everything `inspect` reports. Its JSON has one shape whether the
/// checkpoint could be planned or not: a failure has `ok` false, its one
/// finding in `errors`, and `null` or empty for what planning gives.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The checkpoint path.
    pub(crate) path: String,
    /// No rule violation: decoding would start.
    pub(crate) ok: bool,
    /// One line describing the format.
    pub(crate) summary: Option<String>,
    /// Format and configuration.
    pub(crate) format: Option<Format>,
    /// Dtype of decoded tensors.
    pub(crate) dtype: Option<OutDtype>,
    /// Shard files.
    pub(crate) shards: Vec<String>,
    /// Elements of every output tensor together.
    pub(crate) parameters: Option<u64>,
    /// Bytes of the input shards.
    pub(crate) input_bytes: Option<u64>,
    /// Bytes of the output tensors, each in the dtype it is written in.
    pub(crate) output_bytes: Option<u64>,
    /// The files a run with the same settings writes, in the order it
    /// writes them (its record of the run aside).
    pub(crate) files: Option<Vec<String>>,
    /// Free bytes on the file system the output would go to.
    pub(crate) free_bytes: Option<u64>,
    /// The transformers class of the config.json written
    /// (`architectures[0]`).
    pub(crate) architecture: Option<String>,
    /// Output tensors.
    pub(crate) tensors: Vec<TensorRow>,
    /// How many of them come out of quantized modules ([`Plan::decoded`]).
    pub(crate) decoded: usize,
    /// Quantization tensors used up ([`Plan::consumed`]).
    pub(crate) consumed: Vec<String>,
    /// Model tensors not written ([`Plan::dropped`]).
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

    /// The report of a checkpoint at `path` that cannot be read or planned
    /// at all: `error` its one finding.
    pub fn failed(path: impl AsRef<Path>, error: &Error) -> Report {
        Report {
            path: path.as_ref().display().to_string(),
            ok: false,
            summary: None,
            format: None,
            dtype: None,
            shards: Vec::new(),
            parameters: None,
            input_bytes: None,
            output_bytes: None,
            files: None,
            free_bytes: None,
            architecture: None,
            tensors: Vec::new(),
            decoded: 0,
            consumed: Vec::new(),
            dropped: Vec::new(),
            errors: vec![Finding::from(error)],
            warnings: Vec::new(),
            renamed: Vec::new(),
        }
    }

    /// The report of `plan`, as a run with the input's sharding writes it.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn new(plan: &Plan<'_>) -> Report {
        Report::planned(plan, None, None)
    }

    /// The report of `plan`, its output split at `max_shard_size` as a run
    /// splits it, with the free space of the file system that `out` (a
    /// run's output directory, which need not exist) would be on.
    pub(crate) fn planned(
        plan: &Plan<'_>,
        max_shard_size: Option<u64>,
        out: Option<&Path>,
    ) -> Report {
        let ckpt = plan.checkpoint;
        let kind = plan.format.kind();
        let tensors: Vec<TensorRow> = plan
            .outputs
            .iter()
            .map(|o| TensorRow::of(o, ckpt, kind))
            .collect();
        // What the writer would write, from its own schedule; a plan it
        // cannot lay out has no list (its errors say why).
        let schedule = Schedule::of(plan, None, max_shard_size).ok();
        let files = schedule.as_ref().map(|s| {
            let shards = s.shards.iter().map(|f| f.name.clone());
            let json = s.json.iter().map(|(name, _)| name.clone());
            let copies = s.copies.iter().map(|(_, name)| name.clone());
            shards.chain(json).chain(copies).collect::<Vec<_>>()
        });
        let architecture = schedule.as_ref().and_then(|s| {
            let (_, text) = s.json.iter().find(|(name, _)| name == "config.json")?;
            let config: serde_json::Value = serde_json::from_slice(text).ok()?;
            config["architectures"][0].as_str().map(str::to_string)
        });
        Report {
            path: ckpt.display_path().display().to_string(),
            ok: plan.errors.is_empty(),
            summary: Some(plan.format.describe()),
            format: Some(plan.format.clone()),
            dtype: Some(plan.dtype),
            shards: ckpt.shards.iter().map(|s| s.file_name.clone()).collect(),
            parameters: Some(tensors.iter().map(TensorRow::elements).sum()),
            input_bytes: Some(ckpt.shards.iter().map(|s| s.stored_len()).sum()),
            output_bytes: Some(tensors.iter().map(|t| t.bytes).sum()),
            files,
            free_bytes: out.and_then(crate::writer::free_space),
            architecture,
            tensors,
            decoded: plan.decoded(),
            consumed: plan.consumed.clone(),
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

    /// The report as aligned text: beyond 60 output tensors, one line per
    /// module pattern ([`Report::text_with`]).
    pub fn text(&self) -> String {
        self.text_with(false)
    }

    /// The report as aligned text, a line per output tensor when `every`
    /// is set or there are at most 60, else a line per module pattern with
    /// its count (`model.layers.*.mlp.down_proj.weight  x 32`).
    pub fn text_with(&self, every: bool) -> String {
        let mut s = String::new();
        let decoded = self.decoded;
        let copied = self
            .tensors
            .iter()
            .filter(|t| matches!(t.action, "copy" | "cast"))
            .count();
        let _ = writeln!(
            s,
            "checkpoint  {} ({})",
            self.path,
            plural(self.shards.len(), "shard")
        );
        if let Some(summary) = &self.summary {
            let _ = writeln!(s, "format      {summary}");
        }
        if let Some(r) = self.renamed.first() {
            let _ = writeln!(
                s,
                "names       {} get the names transformers loads (e.g. {} -> {}); --keep-names keeps the stored ones",
                plural(self.renamed.len(), "tensor"),
                r.stored,
                r.written
            );
        }
        for line in self.format.iter().flat_map(Format::report_lines) {
            let _ = writeln!(s, "  {line}");
        }
        if let Some(dtype) = self.dtype {
            let _ = writeln!(
                s,
                "output      {}: {decoded} decoded to {dtype}, {copied} copied; {} used up{}",
                plural(self.tensors.len(), "tensor"),
                plural(self.consumed.len(), "quantization tensor"),
                match self.dropped.len() {
                    0 => String::new(),
                    n => format!("; {} not written", plural(n, "model tensor")),
                }
            );
        }
        totals::write(&mut s, self);
        if every || self.tensors.len() <= tensors::COMPACT_ABOVE {
            tensors::list(&mut s, &self.tensors);
        } else {
            tensors::compact(&mut s, &self.tensors);
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

//! `inspect`'s rows of output tensors: what each is made of (its source
//! type, scheme, bits, group, stored tensors), and the compact listing
//! that folds a model's repeats into one line per module pattern.

use std::fmt::Write as _;

use crate::checkpoint::Checkpoint;
use crate::job::DecodeJob;
use crate::plan::{Output, Source};

/// One output tensor.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TensorRow {
    /// Output name.
    pub name: String,
    /// Logical (output) shape.
    pub shape: Vec<usize>,
    /// Output dtype.
    pub dtype: String,
    /// `decode`, `copy`, `cast` or `compute`.
    pub action: &'static str,
    /// What it is stored as: the dtype of a copied or cast tensor, the
    /// GGUF type of a GGUF tensor, the dtype of a decoded tensor's packs.
    pub source_dtype: Option<String>,
    /// The decoding scheme, a short machine name: the GGUF type (`q4_k`),
    /// else the format's kind (`compressed-tensors`); `None` for copies.
    pub scheme: Option<String>,
    /// Bits of a stored code (a GGUF type's bits per weight, rounded down).
    pub bits: Option<u32>,
    /// Elements along a row that share one scale, where fewer than a row do.
    pub group_size: Option<usize>,
    /// The stored tensors it is made of.
    pub sources: Vec<String>,
    /// Its bytes in the output.
    pub bytes: u64,
    /// The decoding scheme for people.
    pub scheme_text: Option<String>,
    /// Output file (the input shard's, which its output file is named
    /// after unless the output is split by size).
    pub file: String,
}

impl TensorRow {
    /// The row of `o`, planned from `ckpt` in a format of kind `kind`.
    pub(super) fn of(o: &Output<'_>, ckpt: &Checkpoint, kind: &str) -> TensorRow {
        let job = job_of(&o.source);
        let gguf_type = match &o.source {
            Source::Blocks(b) => ckpt
                .gguf
                .as_ref()
                .and_then(|g| g.tensors.get(b.tensor.name))
                .map(|(ty, _)| *ty),
            _ => None,
        };
        let quantized = gguf_type.filter(|_| o.source.is_decoded() && job.is_none());
        let quantized = quantized.filter(|ty| ty.block().0 > 1);
        let (bits, group_size) = match (job, quantized) {
            (Some(job), _) => (Some(job.codes.bits), group_of(job)),
            (None, Some(ty)) => {
                let (bits, group) = crate::formats::gguf::bits_and_group(ty);
                (Some(bits), group)
            }
            (None, None) => (None, None),
        };
        let inputs = o.inputs();
        let mut sources: Vec<String> = Vec::new();
        for t in &inputs {
            if !sources.iter().any(|s| s == t.name) {
                sources.push(t.name.to_string());
            }
        }
        let source_dtype = match (gguf_type, job) {
            (Some(ty), _) => Some(ty.name().to_string()),
            (None, Some(job)) => job.codes.data.tensor().map(|t| t.dtype.to_string()),
            (None, None) => inputs.first().map(|t| t.dtype.to_string()),
        };
        let scheme = match (quantized, o.source.is_decoded()) {
            (Some(ty), _) => Some(ty.name().to_ascii_lowercase()),
            (None, true) if gguf_type.is_none() => Some(kind.to_string()),
            _ => None,
        };
        TensorRow {
            name: o.name.clone(),
            shape: o.shape.clone(),
            dtype: o.dtype.to_string(),
            action: match o.source {
                Source::Copy(_) => "copy",
                Source::Cast(..) => "cast",
                Source::Decode(_) | Source::Assemble(_) | Source::Fold(_) | Source::Blocks(_) => {
                    "decode"
                }
                Source::Bytes(_) | Source::Bias(_) | Source::Rearrange(_) => "compute",
            },
            source_dtype,
            scheme,
            bits,
            group_size,
            sources,
            bytes: o.byte_len() as u64,
            scheme_text: o.scheme.clone(),
            file: ckpt
                .shards
                .get(o.shard)
                .map(|s| s.file_name.clone())
                .unwrap_or_default(),
        }
    }

    /// Its elements.
    pub(super) fn elements(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }

    /// Its types for people: `F16 -> BF16`, or the output dtype alone
    /// where it is stored as it is written.
    fn types(&self) -> String {
        match &self.source_dtype {
            Some(from) if *from != self.dtype => format!("{from} -> {}", self.dtype),
            _ => self.dtype.clone(),
        }
    }
}

/// The job a decoded tensor's codes are read by (the first, for one put
/// together from several).
fn job_of<'s, 'a>(source: &'s Source<'a>) -> Option<&'s DecodeJob<'a>> {
    match source {
        Source::Decode(job) => Some(job),
        Source::Fold(f) => Some(&f.job),
        Source::Assemble(a) => a
            .stack
            .bands
            .first()
            .and_then(|b| b.parts.first())
            .map(|p| &*p.job),
        _ => None,
    }
}

/// Elements along a stored row that share one scale, where fewer than the
/// row do (a transposed job's rows are the output's columns).
fn group_of(job: &DecodeJob<'_>) -> Option<usize> {
    let grid = job.scale.as_ref()?.grid;
    let stored = job.stored_dims();
    let (along, len) = match job.transposed {
        false => (grid.col_div, stored.cols),
        true => (grid.row_div, stored.rows),
    };
    (along > 1 && along < len).then_some(along)
}

/// Listings longer than this are folded by module pattern, unless every
/// tensor is asked for.
pub(crate) const COMPACT_ABOVE: usize = 60;

/// Columns as wide as their longest entry up to this: a longer one (a
/// hostile header's) sticks out of its line alone, rather than widening
/// every line (or passing `format!`'s width limit).
const COLUMN: usize = 256;

/// Writes a line per tensor of `rows` into `s`.
pub(super) fn list(s: &mut String, rows: &[TensorRow]) {
    let lines: Vec<[String; 5]> = rows
        .iter()
        .map(|t| {
            [
                t.action.to_string(),
                t.name.clone(),
                format!("{:?}", t.shape),
                t.types(),
                t.scheme_text.clone().unwrap_or_default(),
            ]
        })
        .collect();
    aligned(s, &lines);
}

/// Writes a line per module pattern of `rows` into `s` (see [`pattern`]):
/// the tensors of one pattern, action, shape, types and scheme, with
/// their count, in the order of their first.
pub(super) fn compact(s: &mut String, rows: &[TensorRow]) {
    let mut groups: Vec<([String; 5], usize)> = Vec::new();
    let mut at: std::collections::HashMap<[String; 5], usize> = Default::default();
    for t in rows {
        let key = [
            t.action.to_string(),
            pattern(&t.name),
            format!("{:?}", t.shape),
            t.types(),
            t.scheme_text.clone().unwrap_or_default(),
        ];
        match at.get(&key) {
            Some(&i) => groups[i].1 += 1,
            None => {
                at.insert(key.clone(), groups.len());
                groups.push((key, 1));
            }
        }
    }
    let pattern_w = groups.iter().map(|(k, _)| k[1].len()).max().unwrap_or(0);
    let pattern_w = pattern_w.min(COLUMN);
    let lines: Vec<[String; 5]> = groups
        .into_iter()
        .map(|([action, name, shape, types, scheme], n)| {
            [
                action,
                format!("{name:<pattern_w$}  x {n}"),
                shape,
                types,
                scheme,
            ]
        })
        .collect();
    aligned(s, &lines);
}

/// `name` with every run of digits between dots as `*`
/// (`model.layers.*.mlp.experts.*.down_proj.weight`).
pub(crate) fn pattern(name: &str) -> String {
    let parts: Vec<&str> = name
        .split('.')
        .map(
            |p| match !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                true => "*",
                false => p,
            },
        )
        .collect();
    parts.join(".")
}

/// Writes `lines` as columns.
fn aligned(s: &mut String, lines: &[[String; 5]]) {
    let width = |i: usize| {
        let w = lines.iter().map(|l| l[i].len()).max().unwrap_or(0);
        w.min(COLUMN)
    };
    let (name_w, shape_w, types_w) = (width(1), width(2), width(3));
    for [action, name, shape, types, scheme] in lines {
        let line = format!(
            "  {action:<7}  {name:<name_w$}  {shape:<shape_w$}  {types:<types_w$}  {scheme}"
        );
        let _ = writeln!(s, "{}", line.trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::pattern;

    #[test]
    fn digit_runs_between_dots_fold() {
        assert_eq!(
            pattern("model.layers.12.mlp.experts.7.down_proj.weight"),
            "model.layers.*.mlp.experts.*.down_proj.weight"
        );
        assert_eq!(pattern("blk.0a.x.1"), "blk.0a.x.*");
        assert_eq!(pattern("a..b"), "a..b");
    }
}

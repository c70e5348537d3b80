//! How the dense output is split into files, and what is written beside
//! them: the shard files' headers, the index, `config.json`, the summary.

use super::header::{self, safetensors_header};
use super::{parts, Summary};
use crate::checkpoint::INDEX_FILE;
use crate::error::Result;
use crate::json::file as json_text;
use crate::plan::{Output, Plan, Source};

/// One safetensors file of the dense output: its header, then its tensors'
/// bytes back to back. Its tensors are the plan's (`&Output`), or what a
/// writer that outlives the plan keeps of them.
pub struct ShardFile<T> {
    /// File name (the input shard's, or `model-0000i-of-0000N.safetensors`).
    pub name: String,
    /// The header ([`safetensors_header`]).
    pub header: Vec<u8>,
    /// The tensors, in file order.
    pub tensors: Vec<T>,
    /// The tensors' bytes, the header aside.
    pub bytes: u64,
    /// The input shard it is made from (its index in the checkpoint).
    pub input: usize,
}

impl<T> ShardFile<T> {
    /// The same file, each tensor made into what `f` makes of it.
    pub(crate) fn map<U>(self, f: impl FnMut(T) -> U) -> ShardFile<U> {
        ShardFile {
            name: self.name,
            header: self.header,
            tensors: self.tensors.into_iter().map(f).collect(),
            bytes: self.bytes,
            input: self.input,
        }
    }
}

/// How the dense output is split into files: one per input shard, or
/// pieces of at most `max` bytes each.
///
/// With a maximum, each input shard's tensors (in output order) fill files
/// greedily, a new file starting when the next tensor would take this one
/// past `max` (its header counted at an upper bound), so a file is larger
/// only when it holds one tensor that alone is. Files never mix input
/// shards: every `--shards` run derives the same layout from the headers
/// and writes the files of its own shards. They are named
/// `model-0000i-of-0000N.safetensors` (`model.safetensors` when there is one).
fn layout<'p, 'a>(
    plan: &'p Plan<'a>,
    max: Option<u64>,
) -> Vec<(String, usize, Vec<&'p Output<'a>>)> {
    let mut files = Vec::new();
    for (i, shard) in plan.checkpoint.shards.iter().enumerate() {
        let tensors: Vec<&Output<'_>> = plan.outputs.iter().filter(|o| o.shard == i).collect();
        if tensors.is_empty() {
            continue;
        }
        let Some(max) = max else {
            files.push((shard.file_name.clone(), i, tensors));
            continue;
        };
        let mut file: Vec<&Output<'_>> = Vec::new();
        let mut size = header::EMPTY_BOUND;
        for t in tensors {
            let cost = t.byte_len() as u64 + header::entry_bound(&t.name, t.dtype, &t.shape);
            if !file.is_empty() && size.saturating_add(cost) > max {
                files.push((String::new(), i, std::mem::take(&mut file)));
                size = header::EMPTY_BOUND;
            }
            file.push(t);
            size = size.saturating_add(cost);
        }
        files.push((String::new(), i, file));
    }
    if max.is_some() {
        let n = files.len();
        for (k, f) in files.iter_mut().enumerate() {
            f.0 = if n == 1 {
                "model.safetensors".into()
            } else {
                format!("model-{:05}-of-{n:05}.safetensors", k + 1)
            };
        }
    }
    files
}

/// The dense checkpoint's safetensors files (those of input shards `only`,
/// when given), in order: what every writer streams. `max_shard_size` splits
/// them as
/// [`OutputDir::with_max_shard_size`](super::OutputDir::with_max_shard_size)
/// says.
pub fn shard_files<'p, 'a>(
    plan: &'p Plan<'a>,
    only: Option<&[String]>,
    max_shard_size: Option<u64>,
) -> Result<Vec<ShardFile<&'p Output<'a>>>> {
    let mut files = Vec::new();
    for (name, input, tensors) in layout(plan, max_shard_size) {
        let shard = &plan.checkpoint.shards[input];
        if !wanted(only, &shard.file_name) {
            continue;
        }
        let header = safetensors_header(
            &shard.path,
            tensors
                .iter()
                .map(|t| (t.name.as_str(), t.dtype, t.shape.as_slice(), t.byte_len())),
        )?;
        let bytes = tensors.iter().map(|t| t.byte_len() as u64).sum();
        files.push(ShardFile {
            name,
            header,
            tensors,
            bytes,
            input,
        });
    }
    Ok(files)
}

/// The input shards that job `index` of `count` writes (`--part I/N`),
/// derived from the headers alone, the same in every job: each shard goes,
/// the largest output first, to the part that writes the fewest bytes so
/// far (the lowest-numbered on a tie). Each shard is in exactly one part,
/// and the parts differ by at most one shard's output bytes.
pub(crate) fn part_shards(
    plan: &Plan<'_>,
    max_shard_size: Option<u64>,
    index: usize,
    count: usize,
) -> Result<Vec<String>> {
    let shards = &plan.checkpoint.shards;
    let mut bytes = vec![0u64; shards.len()];
    for f in shard_files(plan, None, max_shard_size)? {
        bytes[f.input] += f.header.len() as u64 + f.bytes;
    }
    let mut order: Vec<usize> = (0..shards.len()).collect();
    order.sort_by(|&a, &b| bytes[b].cmp(&bytes[a]).then(a.cmp(&b)));
    let mut load = vec![0u64; count.max(1)];
    let mut mine = Vec::new();
    for i in order {
        let part = (0..load.len()).min_by_key(|&p| (load[p], p)).unwrap_or(0);
        load[part] += bytes[i];
        if part == index {
            mine.push(i);
        }
    }
    mine.sort_unstable();
    Ok(mine
        .into_iter()
        .map(|i| shards[i].file_name.clone())
        .collect())
}

/// Every output file's name, whichever run writes it.
pub(super) fn all_file_names(plan: &Plan<'_>, max_shard_size: Option<u64>) -> Vec<String> {
    layout(plan, max_shard_size)
        .into_iter()
        .map(|(name, _, _)| name)
        .collect()
}

/// The JSON files of the dense checkpoint beside its shards (the index when
/// the input has one or the output has several files, `config.json`), as
/// (file name, text).
pub fn json_files(
    plan: &Plan<'_>,
    shards: &[ShardFile<&Output<'_>>],
) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    if plan.checkpoint.index.is_some() || shards.len() > 1 {
        let index = parts::Index::new(total_bytes(shards), weight_map(shards));
        files.push((INDEX_FILE.to_string(), json_text(INDEX_FILE, &index)?));
    }
    if let Some(cfg) = &plan.config {
        files.push(("config.json".to_string(), json_text("config.json", cfg)?));
    }
    files.extend(plan.generated.iter().cloned());
    Ok(files)
}

pub(super) fn total_bytes<T>(shards: &[ShardFile<T>]) -> u64 {
    shards.iter().map(|f| f.bytes).sum()
}

/// Tensor → shard file.
pub(super) fn weight_map(
    shards: &[ShardFile<&Output<'_>>],
) -> std::collections::BTreeMap<String, String> {
    let names = shards
        .iter()
        .flat_map(|f| f.tensors.iter().map(|t| (t.name.clone(), f.name.clone())));
    names.collect()
}

impl Summary {
    /// What writing `shards` of `plan` amounts to (`files` left empty).
    pub(crate) fn of(plan: &Plan<'_>, shards: &[ShardFile<&Output<'_>>]) -> Summary {
        let mut summary = Summary {
            dtype: plan.dtype,
            decoded: 0,
            copied: 0,
            cast: 0,
            converted: 0,
            consumed: plan.consumed.len(),
            dropped: plan.dropped.len(),
            modules: 0,
            tensor_bytes: total_bytes(shards),
            files: Vec::new(),
            fetched: None,
            already_done: false,
            warnings: plan.warnings.clone(),
            format: plan.format.kind().to_string(),
            format_detail: plan.format.describe(),
            backend: String::new(),
            backend_detail: String::new(),
            seconds: 0.0,
        };
        for t in shards.iter().flat_map(|f| &f.tensors) {
            match &t.source {
                s if s.is_decoded() => summary.decoded += 1,
                Source::Bytes(_) | Source::Rearrange(_) => summary.converted += 1,
                Source::Cast(..) => {
                    summary.copied += 1;
                    summary.cast += 1;
                }
                _ => summary.copied += 1,
            }
        }
        summary
    }
}

/// Whether shard `file` is written when only the shards `only` are.
fn wanted(only: Option<&[String]>, file: &str) -> bool {
    only.is_none_or(|o| o.iter().any(|f| f == file))
}

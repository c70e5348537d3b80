//! The shard index of a dense checkpoint, and the partial indexes that
//! `--shards` runs write so that [`merge_index`] can join them once every
//! shard is there.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::checkpoint::INDEX_FILE;
use crate::error::{Context, Error, Result, ResultExt, Rule};

/// File name ending of the partial index a `--shards` run writes.
pub const PART_SUFFIX: &str = ".index-part.json";

/// `model.safetensors.index.json`, as Hugging Face writes it.
#[derive(Debug, Serialize)]
pub(super) struct Index {
    metadata: IndexMetadata,
    weight_map: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
struct IndexMetadata {
    total_size: u64,
}

impl Index {
    /// The index of `weight_map` (tensor → shard file), `total_size` bytes
    /// of tensors in all.
    pub(super) fn new(total_size: u64, weight_map: BTreeMap<String, String>) -> Index {
        Index {
            metadata: IndexMetadata { total_size },
            weight_map,
        }
    }
}

/// What one `--shards` run wrote: an index of its shards, and what every
/// part of one output must agree on.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct IndexPart {
    /// About the run.
    pub metadata: IndexPartMetadata,
    /// Tensor → shard file, for this run's shards.
    pub weight_map: BTreeMap<String, String>,
}

/// About one `--shards` run.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct IndexPartMetadata {
    /// Tensor bytes this run wrote.
    pub total_size: u64,
    /// The shards this run wrote.
    pub shards: Vec<String>,
    /// Every shard of the output: what `merge_index` waits for.
    pub all_shards: Vec<String>,
    /// The input's index, hashed ([`digest`]): parts of one input agree.
    pub source_index_sha256: String,
    /// The output dtype: parts of one run agree.
    pub dtype: String,
}

/// The SHA-256 of `index` as compact JSON, in hex.
pub(super) fn digest(index: &serde_json::Value) -> String {
    use sha2::Digest;
    let text = serde_json::to_vec(index).unwrap_or_default();
    sha2::Sha256::digest(&text)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What [`merge_index`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Merged {
    /// Wrote the index at this path.
    Wrote(PathBuf),
    /// The index at this path was already merged: no parts were left (or,
    /// for an output of one file and no index, that file).
    Already(PathBuf),
}

/// Joins the partial indexes `--shards` runs wrote into `out` into
/// `model.safetensors.index.json`, once every shard is there; the parts are
/// removed, so a second call finds the index already merged (and an
/// output of one `model.safetensors`, which has no index, complete). Fails (ST-002)
/// naming the shards still missing, or a part that contradicts the others.
pub fn merge_index(out: &Path) -> Result<Merged> {
    let mut paths: Vec<PathBuf> = fs::read_dir(out)
        .map_err(|e| Error::io(out, "cannot list", e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(PART_SUFFIX))
        .collect();
    paths.sort();
    let path = out.join(INDEX_FILE);
    if paths.is_empty() && path.is_file() {
        return Ok(Merged::Already(path));
    }
    // A checkpoint of one file has no index to merge (its one `--part`
    // job wrote it whole).
    let single = out.join("model.safetensors");
    if paths.is_empty() && single.is_file() {
        return Ok(Merged::Already(single));
    }
    if paths.is_empty() {
        return Err(Error::new(
            Rule::Index,
            out,
            format!("no *{PART_SUFFIX} to merge"),
        ));
    }
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    let mut have: Vec<String> = Vec::new();
    let mut first: Option<IndexPartMetadata> = None;
    for p in &paths {
        let text = fs::read(p).map_err(|e| Error::io(p, "cannot read", e))?;
        let part: IndexPart = serde_json::from_slice(&text)
            .context(Rule::Index, "not a partial index")
            .with_file(p)?;
        let m = &part.metadata;
        if let Some(f) = &first {
            let differs = |what: &str| {
                Error::new(
                    Rule::Index,
                    p,
                    format!("{what} differs from the other parts' (another checkpoint, or another --dtype)"),
                )
            };
            if f.all_shards != m.all_shards {
                return Err(differs("metadata.all_shards"));
            }
            if f.source_index_sha256 != m.source_index_sha256 {
                return Err(differs("metadata.source_index_sha256"));
            }
            if f.dtype != m.dtype {
                return Err(differs("metadata.dtype"));
            }
        }
        have.extend(m.shards.iter().cloned());
        total += m.total_size;
        for (name, file) in part.weight_map {
            if weight_map.contains_key(&name) {
                return Err(Error::tensor(Rule::Index, p, name, "mapped by two parts"));
            }
            weight_map.insert(name, file);
        }
        first.get_or_insert(part.metadata);
    }
    let all = first.map(|m| m.all_shards).unwrap_or_default();
    let missing: Vec<&str> = all
        .iter()
        .filter(|s| !have.contains(s))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(Error::new(
            Rule::Index,
            out,
            format!("shards not written yet: {}", missing.join(", ")),
        ));
    }
    let index = Index::new(total, weight_map);
    let tmp = out.join(format!(".{INDEX_FILE}.tmp"));
    let text = crate::json::text(&index)
        .context(Rule::Io, "cannot write JSON")
        .with_file(&tmp)?;
    fs::write(&tmp, &text).map_err(|e| Error::io(&tmp, "cannot write", e))?;
    fs::rename(&tmp, &path).map_err(|e| Error::io(&path, "cannot move into place", e))?;
    for p in paths {
        fs::remove_file(&p).map_err(|e| Error::io(&p, "cannot remove", e))?;
    }
    Ok(Merged::Wrote(path))
}

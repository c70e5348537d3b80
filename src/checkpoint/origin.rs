//! Where a checkpoint's files are (a directory on disk, or a listing handed
//! over in memory), and reading its sidecars and shards from there.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::header::{parse_header, Shard, Storage};
use super::{inside, Listing, MAX_JSON_BYTES};
use crate::error::{Context, Error, Result, ResultExt, Rule};

#[derive(Debug, Clone)]
pub struct JsonFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// What it holds.
    pub value: Value,
}

/// Where the checkpoint's files are.
pub(super) enum Origin {
    /// In this directory on disk.
    Disk(PathBuf),
    /// Handed over in memory.
    Listed(Listing),
}

impl Origin {
    pub(super) fn path(&self, name: &str) -> PathBuf {
        match self {
            Origin::Disk(dir) => dir.join(name),
            Origin::Listed(_) => PathBuf::from(name),
        }
    }

    pub(super) fn is_file(&self, name: &str) -> bool {
        match self {
            Origin::Disk(dir) => dir.join(name).is_file(),
            Origin::Listed(l) => l.files.contains_key(name),
        }
    }

    /// Names of the regular files (links followed: Hugging Face cache
    /// snapshots are all links), sorted.
    pub(super) fn names(&self) -> Result<Vec<String>> {
        match self {
            Origin::Disk(dir) => {
                let entries: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)
                    .and_then(|d| d.collect())
                    .map_err(|e| Error::io(dir, "cannot list", e))?;
                let mut names: Vec<String> = entries
                    .iter()
                    .filter(|e| e.path().is_file())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                Ok(names)
            }
            Origin::Listed(l) => Ok(l.files.keys().cloned().collect()),
        }
    }

    /// Whether `path` resolves inside the checkpoint ([`inside`](super::inside)); files
    /// handed over in memory are what they are.
    pub(super) fn inside(&self, path: &Path) -> bool {
        match self {
            Origin::Disk(dir) => inside(dir, path),
            Origin::Listed(_) => true,
        }
    }

    /// Reads JSON sidecar `name`; `rule` is the one its faults break (ST-002
    /// for the index, CFG-001 for configs).
    pub(super) fn read_json(&self, name: &str, rule: Rule) -> Result<Option<JsonFile>> {
        if !self.is_file(name) {
            return Ok(None);
        }
        let path = self.path(name);
        let too_big = |len: u64| {
            Error::new(
                rule,
                &path,
                format!("{len} bytes; a config or index over {MAX_JSON_BYTES} bytes is not read"),
            )
        };
        let text = match self {
            Origin::Disk(dir) => {
                let len = std::fs::metadata(&path)
                    .map_err(|e| Error::io(&path, "cannot read", e))?
                    .len();
                if len > MAX_JSON_BYTES {
                    return Err(too_big(len));
                }
                if !inside(dir, &path) {
                    return Err(Error::new(
                        rule,
                        &path,
                        "a link leading outside the checkpoint directory; not read",
                    ));
                }
                std::fs::read(&path).map_err(|e| Error::io(&path, "cannot read", e))?
            }
            Origin::Listed(l) => match l.files.get(name) {
                Some((len, _)) if *len > MAX_JSON_BYTES => return Err(too_big(*len)),
                Some((len, head)) if head.len() as u64 == *len => head.clone(),
                _ => return Err(Error::new(rule, &path, "was not read")),
            },
        };
        let value = serde_json::from_slice(&text)
            .context(rule, "invalid JSON")
            .with_file(&path)?;
        if let Some(key) = super::json::duplicate_key(&text) {
            return Err(Error::new(rule, &path, format!("{key} is given twice")));
        }
        Ok(Some(JsonFile { path, value }))
    }

    /// Small file `name` whole, when there is one of at most `max` bytes
    /// (inside the checkpoint, and read: a listing holds it whole only
    /// when [`Listing::wants`] said so); `None` otherwise.
    pub(super) fn read_small(&self, name: &str, max: u64) -> Option<Vec<u8>> {
        match self {
            Origin::Disk(dir) => {
                let path = dir.join(name);
                let meta = std::fs::metadata(&path).ok()?;
                if !meta.is_file() || meta.len() > max || !inside(dir, &path) {
                    return None;
                }
                std::fs::read(&path).ok()
            }
            Origin::Listed(l) => match l.files.get(name) {
                Some((len, head)) if *len <= max && head.len() as u64 == *len => Some(head.clone()),
                _ => None,
            },
        }
    }

    pub(super) fn open_shard(&self, path: &Path) -> Result<Shard> {
        match self {
            Origin::Disk(_) => Shard::open(path),
            Origin::Listed(l) => {
                let name = path.to_string_lossy();
                let (len, head) = l
                    .files
                    .get(name.as_ref())
                    .ok_or_else(|| Error::new(Rule::Container, path, "was not handed over"))?;
                let (data_start, metadata) = parse_header(path, head, *len)?;
                let storage = Storage::Partial(HashMap::new());
                Ok(Shard::new(path, storage, data_start, metadata))
            }
        }
    }
}

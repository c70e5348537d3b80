//! A Hub repository pinned to one commit ([`Remote`]): its revision
//! resolved (or, offline, the snapshot the cache last resolved), the GGUF
//! model an id picks, and the files a run reads of it, which it serves as
//! [`Files`](crate::stream::Files) to the planner.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;

use super::api::{offline, token, Meta, MAX_JSON};
use super::cache::Cache;
use super::http::{self, Client};
use super::{unserved, Input};
use crate::error::{Error, Result, Rule};
use crate::repo::{self, RepoId, Revision};

/// A repository pinned to one commit.
pub(crate) struct Remote {
    pub(super) id: RepoId,
    pub(super) commit: String,
    /// Its top-level files and their sizes (where the Hub said).
    pub(super) files: Vec<(String, Option<u64>)>,
    /// Its `.gguf` files in every folder, and their sizes.
    pub(super) ggufs: Vec<(String, Option<u64>)>,
    /// The GGUF model a run reads (its files, in split order), when the id
    /// picks one (`:QUANT`, `--gguf-file`, or a repository of GGUF files
    /// alone); `None` for a safetensors checkpoint.
    pub(super) gguf: Option<Vec<String>>,
    pub(super) client: Client,
    pub(super) cache: Cache,
    pub(super) metas: Mutex<HashMap<String, Meta>>,
    /// Set when the run stops: a download in progress ends at its next
    /// piece (its partial file kept, to resume from).
    pub(super) stopped: std::sync::atomic::AtomicBool,
    /// Bytes its downloads have received so far.
    pub(super) received: std::sync::atomic::AtomicU64,
}

impl Remote {
    /// Pins `id`'s revision to its commit, and picks the GGUF model that
    /// `tag` or `file` names (or, with neither, the repository's one when
    /// it has GGUF files and no safetensors). Offline, the revision the
    /// cache last resolved is its snapshot, used as a local folder (or its
    /// GGUF file picked the same way).
    pub(super) fn open(id: RepoId, tag: Option<&str>, file: Option<&str>) -> Result<Input> {
        let cache = Cache::from_env();
        let shown = PathBuf::from(id.to_string());
        if offline() {
            let commit = if id.is_commit() {
                Some(id.revision.clone())
            } else {
                cache.read_ref(&id)
            };
            let dir = commit
                .map(|c| cache.snapshot(&id, &c))
                .filter(|d| d.is_dir());
            let dir = dir.ok_or_else(|| {
                let detail = format!(
                    "HF_HUB_OFFLINE is set and the cache ({}) has no snapshot of it",
                    cache.root.display()
                );
                unserved(Error::new(Rule::Hub, &shown, detail))
            })?;
            let mut names = Vec::new();
            snapshot_files(&dir, "", 0, &mut names);
            let top = |n: &String| !n.contains('/');
            let ggufs: Vec<(String, Option<u64>)> = names
                .iter()
                .filter(|n| n.ends_with(".gguf"))
                .map(|n| (n.clone(), None))
                .collect();
            let has_safetensors = names
                .iter()
                .filter(|n| top(n))
                .any(|n| n.ends_with(".safetensors"));
            return match pick_gguf(&shown, &ggufs, has_safetensors, tag, file)? {
                Some(parts) => Ok(Input::Local(dir.join(&parts[0]))),
                None => Ok(Input::Local(dir)),
            };
        }
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.trim().is_empty())
            .unwrap_or_else(|| repo::ENDPOINT.to_string());
        let client = Client::new(endpoint, token());
        let url = id.revision_url(&client.endpoint);
        let (_, resp) = client
            .follow(false, &url, None, &shown, |_| false)
            .map_err(unserved)?;
        if !resp.status().is_success() {
            return Err(unserved(http::refusal(&resp, &id.to_string(), &shown)));
        }
        let text = resp
            .into_body()
            .with_config()
            .limit(MAX_JSON)
            .read_to_vec()
            .map_err(|e| {
                Error::new(Rule::Io, &shown, "cannot read the Hub's answer").caused_by(e)
            })?;
        let Revision {
            id,
            commit,
            files,
            ggufs,
        } = Revision::parse(id, &text)?;
        let has_safetensors = files.iter().any(|(n, _)| n.ends_with(".safetensors"));
        let gguf = pick_gguf(&shown, &ggufs, has_safetensors, tag, file)?;
        cache.write_ref(&id, &commit)?;
        Ok(Input::Hub(Box::new(Remote {
            id,
            commit,
            files,
            ggufs,
            gguf,
            client,
            cache,
            metas: Mutex::default(),
            stopped: Default::default(),
            received: Default::default(),
        })))
    }

    /// `ORG/NAME@COMMIT`: the id of exactly what was read.
    pub(crate) fn pinned(&self) -> String {
        format!("{}@{}", self.id.repo, self.commit)
    }

    /// How errors name `file`: `ORG/NAME[@REV]/file`.
    pub(super) fn shown(&self, file: &str) -> PathBuf {
        PathBuf::from(format!("{}/{file}", self.id))
    }

    pub(super) fn snapshot_file(&self, file: &str) -> PathBuf {
        self.cache.snapshot(&self.id, &self.commit).join(file)
    }

    /// The shards a run reads: those the index names (fetched), or every
    /// `.safetensors` file without one; sorted, as the output is written.
    pub(super) fn shards(&self) -> Result<Vec<String>> {
        if let Some(parts) = &self.gguf {
            // A GGUF model's parts, in split order (the output's order).
            return Ok(parts.clone());
        }
        let names: Vec<&str> = self.files.iter().map(|(n, _)| n.as_str()).collect();
        let index = crate::checkpoint::INDEX_FILE;
        let shards: Vec<String> = if names.contains(&index) {
            let path = self.fetch(index)?;
            let len = fs::metadata(&path)
                .map_err(|e| Error::io(&path, "cannot read", e))?
                .len();
            if len > MAX_JSON {
                return Err(Error::new(
                    Rule::Index,
                    &path,
                    format!("{len} bytes; a config or index over {MAX_JSON} bytes is not read"),
                ));
            }
            let text = fs::read(&path).map_err(|e| Error::io(&path, "cannot read", e))?;
            let value: Value = serde_json::from_slice(&text)
                .map_err(|e| Error::new(Rule::Index, &path, "invalid JSON").caused_by(e))?;
            // Sets: an index of n entries against a listing of m files is
            // read in (n + m) log m, not n·m.
            let listed: BTreeSet<&str> = names.iter().copied().collect();
            let shards: BTreeSet<&str> = value
                .get("weight_map")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(_, f)| f.as_str())
                .filter(|f| listed.contains(f))
                .collect();
            shards.into_iter().map(str::to_string).collect()
        } else {
            let mut all: Vec<String> = names
                .iter()
                .filter(|n| n.ends_with(".safetensors"))
                .map(|n| n.to_string())
                .collect();
            all.sort();
            all
        };
        Ok(shards)
    }
}

impl Remote {
    /// The files of the GGUF model the id picks (split order), if it does.
    pub(crate) fn gguf(&self) -> Option<&[String]> {
        self.gguf.as_deref()
    }

    /// The size of `file`: as the revision answer lists it, else as its
    /// resolve answer states it.
    fn size(&self, file: &str) -> Result<u64> {
        let listed = self
            .files
            .iter()
            .chain(&self.ggufs)
            .find(|(n, _)| n == file);
        match listed.and_then(|(_, s)| *s) {
            Some(size) => Ok(size),
            None => self.meta(file).map(|m| m.size),
        }
    }
}

impl crate::stream::Files for Remote {
    fn name(&self) -> Option<String> {
        match self.gguf.as_deref().and_then(<[String]>::first) {
            Some(first) => Some(format!("{}/{first}", self.pinned())),
            None => Some(self.pinned()),
        }
    }

    fn list(&self) -> Vec<(String, u64)> {
        if let Some(parts) = &self.gguf {
            // The picked GGUF model's files alone: the repository's other
            // models are not this run's.
            return parts
                .iter()
                .filter_map(|p| Some((p.clone(), self.size(p).ok()?)))
                .collect();
        }
        // A file whose size the Hub will not state is left out; reading
        // the checkpoint then names what is missing.
        self.files
            .iter()
            .filter_map(|(name, size)| {
                Some((
                    name.clone(),
                    size.or_else(|| self.meta(name).ok().map(|m| m.size))?,
                ))
            })
            .collect()
    }

    fn read(
        &self,
        name: &str,
        range: std::ops::Range<u64>,
    ) -> impl std::future::Future<Output = Result<Vec<u8>>> {
        std::future::ready(Remote::read(self, name, range))
    }
}

/// The GGUF model that `tag` or `file` picks among `ggufs` (a repository's
/// or its snapshot's), as its files in split order; with neither, the
/// model of a repository of GGUF files alone (`has_safetensors` keeps a
/// safetensors checkpoint what it was): its one, else the one tagged
/// `Q4_K_M` (llama.cpp's and Ollama's default), else a refusal listing
/// them. A split model whose parts are not all there is refused.
fn pick_gguf(
    shown: &Path,
    ggufs: &[(String, Option<u64>)],
    has_safetensors: bool,
    tag: Option<&str>,
    file: Option<&str>,
) -> Result<Option<Vec<String>>> {
    use crate::gguf::pick;
    let named = tag.is_some() || file.is_some();
    if !named && (has_safetensors || ggufs.is_empty()) {
        return Ok(None);
    }
    let found = pick::candidates(ggufs.iter().map(|(n, _)| n.as_str()));
    let chosen = pick::Pick {
        tag,
        file,
        default_tag: true,
    };
    let model = pick::choose(&found, chosen).map_err(|d| Error::new(Rule::Hub, shown, d))?;
    if let Some(missing) = model
        .parts
        .iter()
        .find(|p| !ggufs.iter().any(|(n, _)| n == *p))
    {
        let detail = format!(
            "{} is split in {} parts, and {missing} is not there",
            model.first,
            model.parts.len()
        );
        return Err(Error::new(Rule::Hub, shown, detail));
    }
    Ok(Some(model.parts.clone()))
}

/// The regular files under snapshot folder `dir` (links followed, as a
/// snapshot's all are), `/`-separated from the top, a few folders deep.
fn snapshot_files(dir: &Path, under: &str, depth: u32, out: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = match under {
            "" => name.clone(),
            _ => format!("{under}/{name}"),
        };
        let path = e.path();
        if path.is_file() {
            out.push(rel);
        } else if path.is_dir() && depth < 4 && !name.starts_with('.') {
            snapshot_files(&path, &rel, depth + 1, out);
        }
    }
}

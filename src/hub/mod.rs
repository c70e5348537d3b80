//! Checkpoints named by their Hugging Face Hub id (`ORG/NAME[@REV]`): the
//! revision is pinned to one commit, headers are read by range requests
//! (so `inspect` and `validate` of a release download a few megabytes),
//! and whole files go into the Hugging Face cache, checked against the
//! size and SHA-256 the Hub states, where Python finds them too.
//!
//! A path that exists locally always wins over an id, and one that can
//! only be meant as a path is never looked up ([`input`]).

mod cache;
mod http;

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result, Rule};
use crate::repo::{self, RepoId, Revision};
use crate::writer::{self, Download, Fetched};
use cache::Cache;
use http::Client;

/// JSON answers (a revision's file list) larger than this are refused.
const MAX_JSON: u64 = 64 << 20;

/// What a path argument names.
pub(crate) enum Input {
    /// A file or folder here (or a Hub id in offline mode: its snapshot).
    Local(PathBuf),
    /// A repository on the Hub, pinned to a commit.
    Hub(Box<Remote>),
}

/// `path` as a local path, or as a Hub id (`ORG/NAME[@REV][:QUANT]`) when
/// nothing exists there; `gguf_file` (`--gguf-file`) names one GGUF model
/// of a folder or repository that holds several. A path that exists
/// nowhere is a local error, without a request, when it can only be meant
/// as a path ([`meant_local`]); an id the Hub cannot serve says both.
pub(crate) fn input(path: &Path, gguf_file: Option<&str>) -> Result<Input> {
    if path.exists() {
        return match gguf_file {
            Some(file) => match crate::gguf::find_in(path, Some(file))? {
                Some(found) => Ok(Input::Local(found)),
                None => Ok(Input::Local(path.to_path_buf())),
            },
            None => Ok(Input::Local(path.to_path_buf())),
        };
    }
    let id = path.to_str().and_then(RepoId::parse_tagged);
    match (meant_local(path), id) {
        (None, Some((id, tag))) => Remote::open(id, tag.as_deref(), gguf_file),
        (why, _) => {
            let why = why.map(|w| format!(" ({w})")).unwrap_or_default();
            Err(Error::new(
                Rule::Io,
                path,
                format!("no such file or directory{why}"),
            ))
        }
    }
}

/// File names a path that ends in one of them is taken for a file: the
/// checkpoints' and their sidecars' own (a dot in a Hub name, as in
/// `Llama-3.1-8B`, is no extension).
const FILE_EXTENSIONS: &[&str] = &[
    "safetensors",
    "gguf",
    "json",
    "yaml",
    "yml",
    "bin",
    "pt",
    "pth",
    "ckpt",
    "md",
    "txt",
];

/// Why `path`, which does not exist, can only be meant as a local path
/// (it starts with `./`, `../`, `/` or `~`, ends in a file extension, or
/// its first component exists here), so that it is never looked up on the
/// Hub; `None` for what may be a Hub id.
fn meant_local(path: &Path) -> Option<String> {
    let text = path.to_string_lossy();
    let text = text.split(':').next().unwrap_or_default();
    let prefixes = ["./", "../", "/", "~", ".\\", "..\\", "\\"];
    if text == "." || text == ".." || prefixes.iter().any(|p| text.starts_with(p)) {
        return Some("a path, not a Hub id".into());
    }
    let ext = Path::new(text).extension().and_then(|e| e.to_str());
    if let Some(ext) = ext.filter(|e| FILE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str())) {
        return Some(format!("a .{ext} file, not a Hub id"));
    }
    let first = Path::new(text).components().next()?;
    let more = Path::new(text).components().count() > 1;
    (more && Path::new(first.as_os_str()).exists()).then(|| {
        let first = first.as_os_str().to_string_lossy();
        format!("{first} exists here, so this is a path, not a Hub id")
    })
}

/// `e`, a Hub id's refusal by the Hub (or by the cache, offline), saying
/// that no local path has that name either.
fn unserved(e: Error) -> Error {
    Error {
        detail: format!("no such local path; the Hub: {}", e.detail),
        ..e
    }
}

/// `path` as a local checkpoint: a Hub id's files needed to dequantize it
/// are fetched into the cache first, and its snapshot folder (or GGUF
/// file) returned.
pub(crate) fn local(path: &Path, gguf_file: Option<&str>) -> Result<PathBuf> {
    match input(path, gguf_file)? {
        Input::Local(p) => Ok(p),
        Input::Hub(remote) => remote.fetch_checkpoint(),
    }
}

/// Whether `HF_HUB_OFFLINE` asks for no network at all.
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// `HF_TOKEN`, else the token `huggingface-cli login` saved.
fn token() -> Option<String> {
    let saved = || fs::read_to_string(cache::home().join("token")).ok();
    let token = std::env::var("HF_TOKEN")
        .ok()
        .or_else(|| std::env::var("HUGGING_FACE_HUB_TOKEN").ok())
        .or_else(saved)?;
    let token = token.trim();
    (!token.is_empty()).then(|| token.to_string())
}

/// Where a file of the repository is served, and what it must be.
#[derive(Debug, Clone)]
struct Meta {
    url: String,
    /// The blob's name: the SHA-256 of a file stored with LFS.
    etag: String,
    size: u64,
    lfs: bool,
}

/// A repository pinned to one commit.
pub(crate) struct Remote {
    id: RepoId,
    commit: String,
    /// Its top-level files and their sizes (where the Hub said).
    files: Vec<(String, Option<u64>)>,
    /// Its `.gguf` files in every folder, and their sizes.
    ggufs: Vec<(String, Option<u64>)>,
    /// The GGUF model a run reads (its files, in split order), when the id
    /// picks one (`:QUANT`, `--gguf-file`, or a repository of GGUF files
    /// alone); `None` for a safetensors checkpoint.
    gguf: Option<Vec<String>>,
    client: Client,
    cache: Cache,
    metas: Mutex<HashMap<String, Meta>>,
    /// Set when the run stops: a download in progress ends at its next
    /// piece (its partial file kept, to resume from).
    stopped: std::sync::atomic::AtomicBool,
    /// Bytes its downloads have received so far.
    received: std::sync::atomic::AtomicU64,
}

impl Remote {
    /// Pins `id`'s revision to its commit, and picks the GGUF model that
    /// `tag` or `file` names (or, with neither, the repository's one when
    /// it has GGUF files and no safetensors). Offline, the revision the
    /// cache last resolved is its snapshot, used as a local folder (or its
    /// GGUF file picked the same way).
    fn open(id: RepoId, tag: Option<&str>, file: Option<&str>) -> Result<Input> {
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
    fn shown(&self, file: &str) -> PathBuf {
        PathBuf::from(format!("{}/{file}", self.id))
    }

    fn snapshot_file(&self, file: &str) -> PathBuf {
        self.cache.snapshot(&self.id, &self.commit).join(file)
    }

    /// Where `file` is served and what it must be: the resolve route's
    /// answer (a redirect to the CDN for LFS files, carrying the blob's
    /// SHA-256 and size).
    fn meta(&self, file: &str) -> Result<Meta> {
        if let Some(m) = self.metas.lock().ok().and_then(|m| m.get(file).cloned()) {
            return Ok(m);
        }
        let shown = self.shown(file);
        let url = format!(
            "{}/{}/resolve/{}/{}",
            self.client.endpoint,
            self.id.repo,
            self.commit,
            repo::escape_path(file)
        );
        let has_etag = |r: &ureq::http::Response<ureq::Body>| {
            http::header(r, "x-linked-etag")
                .or_else(|| http::header(r, "etag"))
                .is_some()
        };
        let (at, resp) = self.client.follow(true, &url, None, &shown, has_etag)?;
        let status = resp.status();
        if !(status.is_success() || status.is_redirection()) {
            return Err(http::refusal(&resp, &self.id.to_string(), &shown));
        }
        let linked = http::header(&resp, "x-linked-etag");
        let etag = linked
            .or_else(|| http::header(&resp, "etag"))
            .map(http::etag)
            .unwrap_or_default();
        let safe = (1..=128).contains(&etag.len())
            && etag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
        if !safe {
            return Err(Error::new(
                Rule::Hub,
                &shown,
                "the Hub states no usable ETag for it",
            ));
        }
        let size = http::header(&resp, "x-linked-size")
            .or_else(|| http::header(&resp, "content-length"))
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| Error::new(Rule::Hub, &shown, "the Hub states no size for it"))?;
        let url = match http::header(&resp, "location") {
            Some(to) if status.is_redirection() => http::join(&at, to),
            _ => at,
        };
        let m = Meta {
            url,
            etag,
            size,
            lfs: linked.is_some(),
        };
        if let Ok(mut metas) = self.metas.lock() {
            metas.insert(file.to_string(), m.clone());
        }
        Ok(m)
    }

    /// `file` in the cache (downloaded unless it is there), as a path in
    /// the commit's snapshot folder.
    fn fetch(&self, file: &str) -> Result<PathBuf> {
        self.fetched(file).map(|(path, _)| path)
    }

    /// [`Remote::fetch`], and whether this call downloaded it.
    fn fetched(&self, file: &str) -> Result<(PathBuf, bool)> {
        let at = self.snapshot_file(file);
        if at.is_file() {
            return Ok((at, false));
        }
        let m = self.meta(file)?;
        let blob = self.cache.blob(&self.id, &m.etag);
        let whole = |b: &Path| fs::metadata(b).is_ok_and(|md| md.is_file() && md.len() == m.size);
        let mut downloaded = false;
        if !whole(&blob) {
            // Another process (Python, another shard's job) may be writing it.
            let _lock = self.cache.lock(&self.id, &m.etag)?;
            if !whole(&blob) {
                self.download(file, &m, &blob)?;
                downloaded = true;
            }
        }
        let path = self.cache.link(&self.id, &self.commit, file, &m.etag)?;
        Ok((path, downloaded))
    }

    /// Removes `file` (which this run downloaded) from the cache: its
    /// snapshot entry, and its blob unless another snapshot links to it.
    pub(crate) fn remove(&self, file: &str) -> Result<()> {
        let m = self.meta(file)?;
        let _lock = self.cache.lock(&self.id, &m.etag)?;
        let ours = self.snapshot_file(file);
        let _ = fs::remove_file(&ours);
        let blob = self.cache.blob(&self.id, &m.etag);
        let snapshots = self.cache.snapshot(&self.id, &self.commit);
        let others = snapshots.parent().and_then(|d| fs::read_dir(d).ok());
        let linked = others.into_iter().flatten().flatten().any(|e| {
            let entry = e.path().join(file);
            entry != ours && fs::canonicalize(&entry).ok() == fs::canonicalize(&blob).ok()
        });
        if !linked {
            fs::remove_file(&blob).map_err(|e| Error::io(&blob, "cannot remove", e))?;
        }
        Ok(())
    }

    /// Downloads `file` into `blob`, through `<blob>.incomplete`, resuming
    /// from what a cut connection or an earlier run left there.
    fn download(&self, file: &str, m: &Meta, blob: &Path) -> Result<()> {
        let shown = self.shown(file);
        let part = part_name(blob);
        cache::create_parent(&part)?;
        let io = |what: &'static str| move |e: std::io::Error| Error::io(part_name(blob), what, e);
        let mut out = File::options()
            .create(true)
            .append(true)
            .read(true)
            .open(&part)
            .map_err(io("cannot create"))?;
        let mut have = out.metadata().map_err(io("cannot read"))?.len();
        let mut hash = Sha256::new();
        if have > m.size {
            out.set_len(0).map_err(io("cannot truncate"))?;
            have = 0;
        } else if have > 0 {
            out.seek(SeekFrom::Start(0)).map_err(io("cannot read"))?;
            let copied = std::io::copy(&mut (&mut out).take(have), &mut HashWriter(&mut hash))
                .map_err(io("cannot read"))?;
            if copied != have {
                return Err(Error::new(Rule::Io, &part, "shrank while it was read"));
            }
        }
        let mut cuts = 0;
        let mut buf = vec![0u8; 1 << 20];
        while have < m.size {
            let range = format!("bytes={have}-");
            let (_, resp) = self.client.follow(
                false,
                &m.url,
                (have > 0).then_some(range.as_str()),
                &shown,
                |_| false,
            )?;
            let status = resp.status();
            if !status.is_success() {
                return Err(http::refusal(&resp, &self.id.to_string(), &shown));
            }
            // A 200 is the whole file (the server ignored the range); a 206
            // starts where its Content-Range says (some mirrors say nothing:
            // then where it was asked to).
            let start = match (status.as_u16(), http::header(&resp, "content-range")) {
                (206, Some(cr)) => content_range_start(cr).unwrap_or(u64::MAX),
                (206, None) => have,
                _ => 0,
            };
            if start != have {
                if start != 0 {
                    return Err(Error::new(
                        Rule::Hub,
                        &shown,
                        "the server answered another range than asked",
                    ));
                }
                out.set_len(0).map_err(io("cannot truncate"))?;
                have = 0;
                hash = Sha256::new();
            }
            // A length that is not what is left of the file the Hub sized is
            // a broken or hostile server's (bytes are read up to the size
            // the Hub stated, whatever it says).
            let stated = http::header(&resp, "content-length").map(|v| v.trim().parse::<u64>());
            if let Some(stated) = stated.filter(|n| n.as_ref().ok() != Some(&(m.size - have))) {
                let stated = stated.map_or_else(|_| "an unreadable".to_string(), |n| n.to_string());
                return Err(Error::new(
                    Rule::Hub,
                    &shown,
                    format!(
                        "the server states a Content-Length of {stated} for the {} bytes left of this {}-byte file",
                        m.size - have,
                        m.size
                    ),
                ));
            }
            let mut body = resp.into_body().into_reader().take(m.size - have);
            let cut = loop {
                if self.stopped.load(std::sync::atomic::Ordering::Relaxed) {
                    let detail = "the run stopped while downloading it";
                    return Err(Error::new(Rule::Cancelled, &shown, detail));
                }
                match body.read(&mut buf) {
                    Ok(0) => break have < m.size,
                    Ok(n) => {
                        out.write_all(&buf[..n]).map_err(io("cannot write"))?;
                        hash.update(&buf[..n]);
                        have += n as u64;
                        let received = &self.received;
                        received.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break true,
                }
            };
            if cut {
                cuts += 1;
                if cuts >= http::ATTEMPTS {
                    return Err(Error::new(
                        Rule::Io,
                        &shown,
                        format!(
                            "the download broke off {cuts} times ({have} of {} bytes)",
                            m.size
                        ),
                    ));
                }
                std::thread::sleep(http::BACKOFF * cuts);
            }
        }
        out.sync_all().map_err(io("cannot write"))?;
        drop(out);
        let digest = hex(&hash.finalize());
        if m.lfs && digest != m.etag {
            let _ = fs::remove_file(&part);
            return Err(Error::new(
                Rule::Integrity,
                &shown,
                format!(
                    "downloaded bytes have SHA-256 {digest}, the Hub states {}",
                    m.etag
                ),
            ));
        }
        fs::rename(&part, blob).map_err(|e| Error::io(blob, "cannot move into place", e))
    }

    /// Bytes `range` of `file`: from the cache when it is there, else by a
    /// range request (safetensors, GGUF), else by fetching the file (sidecars).
    fn read(&self, file: &str, range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        let shown = self.shown(file);
        let len = usize::try_from(range.end.saturating_sub(range.start))
            .map_err(|_| Error::new(Rule::Argument, &shown, "range too large"))?;
        let cached = self.snapshot_file(file);
        let by_range = file.ends_with(".safetensors") || file.ends_with(".gguf");
        let path = if cached.is_file() || !by_range {
            Some(self.fetch(file)?)
        } else {
            None
        };
        if let Some(path) = path {
            let mut f = File::open(&path).map_err(|e| Error::io(&path, "cannot open", e))?;
            let mut bytes = buffer(len, &shown)?;
            f.seek(SeekFrom::Start(range.start))
                .and_then(|_| f.read_exact(&mut bytes))
                .map_err(|e| Error::io(&path, "cannot read", e))?;
            return Ok(bytes);
        }
        let m = self.meta(file)?;
        if range.end > m.size {
            return Err(Error::new(
                Rule::Container,
                &shown,
                format!("a read past its {} bytes", m.size),
            ));
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        let ask = format!("bytes={}-{}", range.start, range.end - 1);
        let (_, resp) = self
            .client
            .follow(false, &m.url, Some(&ask), &shown, |_| false)?;
        let status = resp.status().as_u16();
        let skip = match (status, http::header(&resp, "content-range")) {
            (206, Some(cr)) if content_range_start(cr) != Some(range.start) => {
                return Err(Error::new(
                    Rule::Hub,
                    &shown,
                    "the server answered another range than asked",
                ))
            }
            (206, _) => 0,
            (200, _) => range.start,
            _ => return Err(http::refusal(&resp, &self.id.to_string(), &shown)),
        };
        let mut body = resp.into_body().into_reader();
        std::io::copy(&mut (&mut body).take(skip), &mut std::io::sink())
            .map_err(|e| Error::io(&shown, "cannot download", e))?;
        let mut bytes = buffer(len, &shown)?;
        body.read_exact(&mut bytes)
            .map_err(|e| Error::io(&shown, "cannot download", e))?;
        Ok(bytes)
    }

    /// Fetches what dequantizing needs (the shards the index names, or
    /// every `.safetensors` file without one, and every file that is not
    /// weights) and returns the snapshot folder holding them.
    pub(crate) fn fetch_checkpoint(&self) -> Result<PathBuf> {
        if self.gguf.is_some() {
            return self.fetch_gguf().map(|(first, _)| first);
        }
        let names: Vec<&str> = self.files.iter().map(|(n, _)| n.as_str()).collect();
        let weights = crate::checkpoint::is_weights;
        let small: Vec<&str> = names.iter().copied().filter(|n| !weights(n)).collect();
        for name in &small {
            self.fetch(name)?;
        }
        for shard in &self.shards()? {
            self.fetch(shard)?;
        }
        Ok(self.cache.snapshot(&self.id, &self.commit))
    }

    /// The shards a run reads: those the index names (fetched), or every
    /// `.safetensors` file without one; sorted, as the output is written.
    fn shards(&self) -> Result<Vec<String>> {
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

    /// Fetches the picked GGUF model's files into the cache; returns the
    /// first one's path in the snapshot (its parts beside it) and each
    /// file with whether this call downloaded it.
    pub(crate) fn fetch_gguf(&self) -> Result<(PathBuf, Vec<(String, bool)>)> {
        let parts = self.gguf.as_deref().unwrap_or_default();
        let mut fetched = Vec::new();
        let mut first = None;
        for part in parts {
            let (path, new) = self.fetched(part)?;
            first.get_or_insert(path);
            fetched.push((part.clone(), new));
        }
        let first = first
            .ok_or_else(|| Error::new(Rule::Hub, self.id.to_string(), "picks no GGUF model"))?;
        Ok((first, fetched))
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

/// A Hub checkpoint read while its shards download, one ahead of the
/// decoder. Planning reads headers by range requests; once it is over
/// ([`Files::planned`](crate::stream::Files::planned)), a shard that a
/// batch reads is waited for whole and read from the cache, and (`delete`)
/// a shard this run downloaded is removed once the decoder has moved past
/// it. A later read of a removed shard (a scale stored beside another
/// module) is a range request, so correctness never rests on the order.
pub(crate) struct Fetcher<'r> {
    remote: &'r Remote,
    /// The shards, in the order the batches read them.
    order: Vec<(String, u64)>,
    delete: bool,
    out: PathBuf,
    state: Mutex<Fetch>,
    wake: std::sync::Condvar,
}

#[derive(Default)]
struct Fetch {
    decoding: bool,
    /// The shard the batches read now (an index into `order`).
    at: usize,
    /// How each shard's fetch ended.
    done: Vec<Option<Result<bool>>>,
    /// Shards the run will not read (`Files::skip`).
    skipped: Vec<bool>,
    /// Bytes the run downloads in all, once planned.
    to_download: u64,
    /// Bytes of this run's downloads now in the cache.
    held: u64,
    fetched: Fetched,
    stop: bool,
}

impl<'r> Fetcher<'r> {
    /// Fetches `remote`'s shards (file-name order, as the output is written)
    /// for a run writing into `out`.
    pub(crate) fn new(remote: &'r Remote, out: &Path, delete: bool) -> Result<Fetcher<'r>> {
        let listed = |name: &str| {
            remote
                .files
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, s)| *s)
        };
        let order = remote
            .shards()?
            .into_iter()
            .map(|name| {
                let size = match listed(&name) {
                    Some(size) => size,
                    None => remote.meta(&name)?.size,
                };
                Ok((name, size))
            })
            .collect::<Result<Vec<_>>>()?;
        let state = Fetch {
            done: (0..order.len()).map(|_| None).collect(),
            skipped: vec![false; order.len()],
            ..Fetch::default()
        };
        Ok(Fetcher {
            remote,
            order,
            delete,
            out: out.to_path_buf(),
            state: Mutex::new(state),
            wake: std::sync::Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Fetch> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Downloads the shards in order, at most one ahead of the batches
    /// (skipped ones not counted, nor fetched); returns when all are
    /// fetched or [`Fetcher::stop`] is called.
    pub(crate) fn download(&self) {
        for (i, (name, size)) in self.order.iter().enumerate() {
            {
                // Nothing is downloaded before planning found the
                // checkpoint sound, then at most one shard ahead.
                let ahead = |s: &Fetch| (s.at + 1..i).any(|k| !s.skipped[k]);
                let mut s = self.lock();
                while !s.stop && (!s.decoding || ahead(&s)) {
                    s = self.wake.wait(s).unwrap_or_else(|p| p.into_inner());
                }
                if s.stop {
                    return;
                }
                if s.skipped[i] {
                    s.done[i] = Some(Ok(false));
                    self.wake.notify_all();
                    continue;
                }
            }
            let result = self.remote.fetched(name).map(|(_, new)| new);
            let mut s = self.lock();
            match &result {
                Ok(true) => {
                    s.fetched.downloaded.push(name.clone());
                    s.held += size;
                    s.fetched.peak_bytes = s.fetched.peak_bytes.max(s.held);
                }
                Ok(false) => s.fetched.reused.push(name.clone()),
                Err(e) => {
                    // The run fails when the batches reach this shard, not
                    // before: the shard they decode now is still finished
                    // (and journaled, for `--resume`). No later shard is
                    // fetched; each fails with this error.
                    for d in &mut s.done[i..] {
                        *d = Some(Err(e.clone()));
                    }
                    self.wake.notify_all();
                    return;
                }
            }
            s.done[i] = Some(result);
            self.wake.notify_all();
        }
    }

    /// Whether the run is over (or failed).
    pub(crate) fn stopped(&self) -> bool {
        self.lock().stop
    }

    /// Ends [`Fetcher::download`] (the run is over, or failed).
    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.remote
            .stopped
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.wake.notify_all();
    }

    /// Ends the run: with `delete`, this run's remaining downloads are
    /// removed too. Returns what was fetched.
    pub(crate) fn finish(&self) -> Result<Fetched> {
        self.stop();
        if self.delete {
            self.remove_before(self.order.len())?;
        }
        Ok(self.lock().fetched.clone())
    }

    /// Removes this run's downloads of the shards before `i`.
    fn remove_before(&self, i: usize) -> Result<()> {
        let mut s = self.lock();
        for (name, size) in &self.order[..i.min(self.order.len())] {
            if s.fetched.downloaded.contains(name) && !s.fetched.deleted.contains(name) {
                self.remote.remove(name)?;
                s.fetched.deleted.push(name.clone());
                s.held = s.held.saturating_sub(*size);
            }
        }
        Ok(())
    }

    /// Waits for shard `i` when the batches read it, moving on to it.
    fn reach(&self, i: usize) -> Result<()> {
        let mut s = self.lock();
        if s.stop {
            // A download failed (its error), or the run did (it says why).
            let failed = s
                .done
                .iter()
                .flatten()
                .find_map(|d| d.as_ref().err().cloned());
            return Err(failed.unwrap_or_else(|| Error::bare(Rule::Cancelled, "the run stopped")));
        }
        if !s.decoding || i < s.at {
            return Ok(());
        }
        let moved = i > s.at;
        s.at = i;
        self.wake.notify_all();
        while s.done[i].is_none() && !s.stop {
            s = self.wake.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if let Some(Err(e)) = &s.done[i] {
            return Err(e.clone());
        }
        drop(s);
        if moved && self.delete {
            self.remove_before(i)?;
        }
        Ok(())
    }

    /// Bytes `range` of file `name`, once the batches may read it.
    pub(crate) fn read_now(&self, name: &str, range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        if let Some(i) = self.order.iter().position(|(n, _)| n == name) {
            self.reach(i)?;
        }
        self.remote.read(name, range)
    }

    /// File `name` whole, from the cache.
    pub(crate) fn whole(&self, name: &str) -> Result<Vec<u8>> {
        let path = self.remote.fetch(name)?;
        fs::read(&path).map_err(|e| Error::io(&path, "cannot read", e))
    }

    /// The sizes of the shards the run reads that the cache lacks.
    fn missing(&self) -> Vec<u64> {
        let skipped = self.lock().skipped.clone();
        self.order
            .iter()
            .zip(skipped)
            .filter(|((name, _), skip)| !skip && !self.remote.snapshot_file(name).is_file())
            .map(|((_, size), _)| *size)
            .collect()
    }

    /// How far the run's downloads are (none to tell before planning).
    pub(crate) fn downloads(&self) -> Option<Download> {
        let total_bytes = self.lock().to_download;
        let done = self
            .remote
            .received
            .load(std::sync::atomic::Ordering::Relaxed);
        (total_bytes > 0).then_some(Download {
            done_bytes: done.min(total_bytes),
            total_bytes,
        })
    }

    /// Refuses a run that cannot fit: the dense files on the output's
    /// file system and the shards still to download (two at a time with
    /// `delete`) in the cache's, each against its free space.
    fn check_space(&self, out_bytes: u64) -> Result<Vec<String>> {
        let missing = self.missing();
        self.lock().to_download = missing.iter().sum();
        let mut cache_bytes: u64 = missing.iter().sum();
        if self.delete {
            let mut sizes = missing.clone();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            cache_bytes = sizes.iter().take(2).sum();
        }
        let needs = [
            writer::Need {
                what: "the dense checkpoint",
                at: self.out.clone(),
                bytes: out_bytes,
            },
            writer::Need {
                what: "the downloads",
                at: self.remote.cache.root.clone(),
                bytes: cache_bytes,
            },
        ];
        writer::check_space(&self.out, &needs)
    }
}

impl crate::stream::Files for Fetcher<'_> {
    fn skip(&self, names: &std::collections::BTreeSet<String>) {
        let mut s = self.lock();
        for (i, (name, _)) in self.order.iter().enumerate() {
            s.skipped[i] |= names.contains(name);
        }
        self.wake.notify_all();
    }

    fn name(&self) -> Option<String> {
        crate::stream::Files::name(self.remote)
    }

    fn list(&self) -> Vec<(String, u64)> {
        crate::stream::Files::list(self.remote)
    }

    fn read(
        &self,
        name: &str,
        range: std::ops::Range<u64>,
    ) -> impl std::future::Future<Output = Result<Vec<u8>>> {
        std::future::ready(self.read_now(name, range))
    }

    fn downloads(&self) -> Option<Download> {
        Fetcher::downloads(self)
    }

    fn planned(&self, out_bytes: u64) -> Result<Vec<String>> {
        let notes = self.check_space(out_bytes)?;
        self.lock().decoding = true;
        self.wake.notify_all();
        Ok(notes)
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

/// `len` zero bytes, or an error where memory cannot hold them (a size a
/// server stated is a claim).
fn buffer(len: usize, shown: &Path) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(len).map_err(|_| {
        Error::new(
            Rule::Io,
            shown,
            format!("cannot hold {len} bytes in memory"),
        )
    })?;
    bytes.resize(len, 0);
    Ok(bytes)
}

fn part_name(blob: &Path) -> PathBuf {
    PathBuf::from(format!("{}.incomplete", blob.display()))
}

/// The first byte of `bytes A-B/N`.
fn content_range_start(value: &str) -> Option<u64> {
    let rest = value.trim().strip_prefix("bytes")?.trim_start();
    rest.split('-').next()?.trim().parse().ok()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Feeds what is written to a SHA-256.
struct HashWriter<'h>(&'h mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

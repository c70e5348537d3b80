//! Checkpoints named by their Hugging Face Hub id (`ORG/NAME[@REV]`): the
//! revision is pinned to one commit, headers are read by range requests
//! (so `inspect` and `validate` of a release download a few megabytes),
//! and whole files go into the Hugging Face cache, checked against the
//! size and SHA-256 the Hub states, where Python finds them too.
//!
//! A path that exists locally always wins over an id, and one that can
//! only be meant as a path is never looked up ([`input`]).
//!
//! This file is the module's face: what a path argument names, and the
//! checkpoint it stands for. The rest is one concern a file:
//! `remote.rs` a repository pinned to one commit and the files a run reads
//! of it, `api.rs` the Hub's routes it calls (a file's address, its bytes by
//! range), `fetch.rs` the downloads into the cache (resumed, checked by
//! SHA-256), `fetcher.rs` the shards downloaded one ahead of the decoder,
//! `http.rs` the HTTP beneath them and `cache.rs` the cache's layout.

mod api;
mod cache;
mod fetch;
mod fetcher;
mod http;
mod remote;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result, Rule};
use crate::repo::RepoId;
pub(crate) use fetcher::Fetcher;
pub(crate) use remote::Remote;

/// What a path argument names.
pub(crate) enum Input {
    /// A file or folder here (or a Hub id in offline mode: its snapshot).
    Local(PathBuf),
    /// A repository on the Hub, pinned to a commit.
    Hub(Box<Remote>),
}

/// `path` as a local path (a folder's GGUF model picked by `DIR:QUANT`
/// as a Hub id's is), or as a Hub id (`ORG/NAME[@REV][:QUANT]`) when
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
    if let Some((dir, tag)) = crate::gguf::tagged_dir(path) {
        let pick = crate::gguf::pick::Pick {
            tag: Some(tag),
            file: gguf_file,
            default_tag: false,
        };
        // With a tag, a folder without that model is refused, not passed on.
        return match crate::gguf::find_picked(dir, pick)? {
            Some(found) => Ok(Input::Local(found)),
            None => Ok(Input::Local(dir.to_path_buf())),
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

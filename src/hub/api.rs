//! The Hub's routes as a [`Remote`] calls them: whether to call at all
//! (`HF_HUB_OFFLINE`), the token sent, where a file is served and what it
//! must be (the resolve route), and a file's bytes by range request, so
//! that headers are read without downloading whole shards.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::cache;
use super::http;
use super::Remote;
use crate::error::{Error, Result, Rule};
use crate::repo;

/// JSON answers (a revision's file list) larger than this are refused.
pub(super) const MAX_JSON: u64 = 64 << 20;

/// Whether `HF_HUB_OFFLINE` asks for no network at all.
pub(super) fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// `HF_TOKEN`, else the token `huggingface-cli login` saved.
pub(super) fn token() -> Option<String> {
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
pub(super) struct Meta {
    pub(super) url: String,
    /// The blob's name: the SHA-256 of a file stored with LFS.
    pub(super) etag: String,
    pub(super) size: u64,
    pub(super) lfs: bool,
}

impl Remote {
    /// Where `file` is served and what it must be: the resolve route's
    /// answer (a redirect to the CDN for LFS files, carrying the blob's
    /// SHA-256 and size).
    pub(super) fn meta(&self, file: &str) -> Result<Meta> {
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

    /// Bytes `range` of `file`: from the cache when it is there, else by a
    /// range request (safetensors, GGUF), else by fetching the file (sidecars).
    pub(super) fn read(&self, file: &str, range: std::ops::Range<u64>) -> Result<Vec<u8>> {
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
            (206, Some(cr)) if http::content_range_start(cr) != Some(range.start) => {
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

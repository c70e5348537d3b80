//! Downloads into the Hugging Face cache: a file is written through
//! `<blob>.incomplete` (resumed from what a cut connection or an earlier
//! run left), checked against the size and SHA-256 the Hub states, moved
//! into place under a lock another process honours, and linked from the
//! commit's snapshot, where Python finds it too; and removed again where
//! a run was asked not to keep what it downloaded.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::api::Meta;
use super::cache;
use super::http;
use super::Remote;
use crate::error::{Error, Result, Rule};

impl Remote {
    /// `file` in the cache (downloaded unless it is there), as a path in
    /// the commit's snapshot folder.
    pub(super) fn fetch(&self, file: &str) -> Result<PathBuf> {
        self.fetched(file).map(|(path, _)| path)
    }

    /// [`Remote::fetch`], and whether this call downloaded it.
    pub(super) fn fetched(&self, file: &str) -> Result<(PathBuf, bool)> {
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
                (206, Some(cr)) => http::content_range_start(cr).unwrap_or(u64::MAX),
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

fn part_name(blob: &Path) -> PathBuf {
    PathBuf::from(format!("{}.incomplete", blob.display()))
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

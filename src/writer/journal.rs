//! What a `--resume` run has finished: each output file's size and SHA-256,
//! recorded in its staging folder once the file is synced, under the key of
//! the job (its inputs and everything that shapes its output). A later
//! `--resume` run of the same job keeps the files whose bytes still match
//! and writes the rest; a run of another job finds nothing to keep.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The journal's name in the staging folder (never moved into the output).
pub(super) const JOURNAL: &str = ".journal.json";

/// Journals larger than this are not ours: nothing is kept.
const MAX_JOURNAL_BYTES: u64 = 16 << 20;

/// One finished file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Done {
    size: u64,
    sha256: String,
}

/// The journal's contents.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Record {
    key: String,
    files: BTreeMap<String, Done>,
}

/// The journal of one run, shared by the threads that finish its files.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    record: Mutex<Record>,
}

impl Journal {
    /// The journal in staging folder `dir` for the job `key`: what an
    /// earlier run recorded under the same key, else nothing.
    pub(super) fn open(dir: &Path, key: &str) -> Journal {
        let path = dir.join(JOURNAL);
        let earlier = File::open(&path).ok().and_then(|f| {
            let mut text = String::new();
            f.take(MAX_JOURNAL_BYTES).read_to_string(&mut text).ok()?;
            serde_json::from_str::<Record>(&text).ok()
        });
        let record = match earlier {
            Some(r) if r.key == key => r,
            _ => Record {
                key: key.to_string(),
                files: BTreeMap::new(),
            },
        };
        Journal {
            dir: dir.to_path_buf(),
            record: Mutex::new(record),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether an earlier run of this job recorded file `name`.
    pub(super) fn lists(&self, name: &str) -> bool {
        self.lock().files.contains_key(name)
    }

    /// Whether file `name` of the staging folder was finished: recorded,
    /// and its bytes there still of the recorded size and SHA-256 (read
    /// whole to tell).
    pub fn done(&self, name: &str) -> Result<bool> {
        let Some(want) = self.lock().files.get(name).cloned() else {
            return Ok(false);
        };
        let path = self.dir.join(name);
        let Ok(mut f) = File::open(&path) else {
            return Ok(false);
        };
        let len = f.metadata().map_err(|e| Error::io(&path, "cannot read", e))?.len();
        if len != want.size {
            return Ok(false);
        }
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).map_err(|e| Error::io(&path, "cannot read", e))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
        }
        Ok(hex(&hash.finalize()) == want.sha256)
    }

    /// Records file `name` as finished: `size` bytes, of SHA-256 `sha256`,
    /// synced. The journal is replaced whole (written aside, synced,
    /// renamed), so a run killed meanwhile leaves the old one or the new.
    pub(super) fn record(&self, name: &str, size: u64, sha256: &[u8]) -> Result<()> {
        let mut record = self.lock();
        record.files.insert(
            name.to_string(),
            Done {
                size,
                sha256: hex(sha256),
            },
        );
        let text = serde_json::to_vec(&*record).map_err(|e| {
            Error::new(crate::error::Rule::Internal, &self.dir, format!("journal: {e}"))
        })?;
        let (path, aside) = (self.dir.join(JOURNAL), self.dir.join(format!("{JOURNAL}.new")));
        let mut f = File::create(&aside).map_err(|e| Error::io(&aside, "cannot create", e))?;
        f.write_all(&text)
            .and_then(|()| f.sync_all())
            .map_err(|e| Error::io(&aside, "cannot write", e))?;
        fs::rename(&aside, &path).map_err(|e| Error::io(&path, "cannot write", e))
    }
}

/// Whether the journal in staging folder `dir` lists file `name` (read
/// without its lock: only to tell a file a killed commit moved out).
pub(super) fn lists(dir: &Path, name: &str) -> bool {
    let Ok(f) = File::open(dir.join(JOURNAL)) else {
        return false;
    };
    let mut text = String::new();
    if f.take(MAX_JOURNAL_BYTES).read_to_string(&mut text).is_err() {
        return false;
    }
    serde_json::from_str::<Record>(&text).is_ok_and(|r| r.files.contains_key(name))
}

/// Bytes as lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A writer that counts what goes through it, and hashes it for a journal.
pub(super) struct Hashing<W> {
    inner: W,
    hash: Option<Sha256>,
    len: u64,
}

impl<W: Write> Hashing<W> {
    /// Hashing when `on` (a run that journals its files).
    pub(super) fn new(inner: W, on: bool) -> Hashing<W> {
        Hashing {
            inner,
            hash: on.then(Sha256::new),
            len: 0,
        }
    }

    /// The writer, the bytes written and their SHA-256 (when hashed).
    pub(super) fn finish(self) -> (W, u64, Option<[u8; 32]>) {
        (self.inner, self.len, self.hash.map(|h| h.finalize().into()))
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        if let Some(h) = &mut self.hash {
            h.update(&buf[..n]);
        }
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

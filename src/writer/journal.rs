//! What a run has finished: each output file's size and BLAKE3 digest, recorded
//! in its staging folder once the file is synced, under the key of the job
//! (its inputs and everything that shapes its output). A later `--resume`
//! run of the same job keeps the files whose bytes still match and writes
//! the rest; a run of another job finds nothing to keep.
//!
//! When the run commits, the journal, completed with the small files
//! written beside the shards, becomes the record of the finished run
//! ([`record_name`]), moved into the output directory after every other
//! file: a `--resume` run of the same job that finds it, with every file it
//! lists still of those bytes, has nothing left to do.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// The journal's name in the staging folder (never moved into the output).
pub(super) const JOURNAL: &str = ".journal.json";

/// Journals larger than this are not ours: nothing is kept.
const MAX_JOURNAL_BYTES: u64 = 16 << 20;

/// The folder of the output directory that holds the records of finished
/// runs: huggingface_hub leaves its own metadata there, and `hf upload`
/// (`upload_folder`, `upload_large_folder`) never uploads it: its
/// `DEFAULT_IGNORE_PATTERNS` hold `.cache/huggingface/*` and
/// `**/.cache/huggingface/**` (`huggingface_hub/utils/_paths.py`).
pub(crate) const RECORD_DIR: &str = ".cache/huggingface";

/// The record of a finished run, as a path relative to the output
/// directory (in [`RECORD_DIR`]): `tag` is a `--shards` or `--part` job's
/// (each keeps its own in a shared output). Version 0.2.0 kept them
/// beside the weights (`.wgpu-dequant-done*.json`, which `hf upload`
/// uploaded); they are not looked for, as a job's key holds the tool's
/// version: no record of another version is of the same job.
pub(crate) fn record_name(tag: Option<&str>) -> String {
    format!("{RECORD_DIR}/{}", record_file(tag))
}

/// Whether `name` is a record's file name ([`record_file`]).
pub(super) fn is_record_file(name: &str) -> bool {
    name.starts_with("wgpu-dequant-done") && name.ends_with(".json")
}

/// The record's file name ([`record_name`] without its folder).
pub(super) fn record_file(tag: Option<&str>) -> String {
    match tag {
        Some(tag) => format!("wgpu-dequant-done-{tag}.json"),
        None => "wgpu-dequant-done.json".to_string(),
    }
}

/// What a finished run wrote, as kept in the output directory.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct Finished {
    /// The tool and version that wrote it.
    tool: String,
    /// The job's key ([`Journal::open`]).
    key: String,
    /// Every file the run moved into the output directory, the record aside.
    files: BTreeMap<String, Done>,
    /// What the run reported.
    summary: super::Summary,
}

impl Finished {
    /// The record `name` in `out`, if there is one this tool can read.
    pub(super) fn read(out: &Path, name: &str) -> Option<Finished> {
        let f = File::open(out.join(name)).ok()?;
        let mut text = String::new();
        f.take(MAX_JOURNAL_BYTES).read_to_string(&mut text).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Whether this is the record of job `key`.
    pub(super) fn is_of(&self, key: &str) -> bool {
        self.key == key
    }

    /// Whether this is the record of job `key` and lists file `name`.
    pub(super) fn lists(&self, key: &str, name: &str) -> bool {
        self.key == key && self.files.contains_key(name)
    }

    /// The summary of the finished job `key` whose files in `out` all still
    /// have the recorded sizes and bytes (read whole to tell); `None` for
    /// another job, or when a file is missing or differs.
    pub(super) fn check(self, out: &Path, key: &str) -> Result<Option<super::Summary>> {
        use rayon::prelude::*;
        if self.key != key {
            return Ok(None);
        }
        let same = self
            .files
            .par_iter()
            .map(|(name, want)| matches(&out.join(name), want))
            .collect::<Result<Vec<bool>>>()?;
        if !same.iter().all(|s| *s) {
            return Ok(None);
        }
        let mut summary = self.summary;
        summary.already_done = true;
        summary.files = self.files.keys().map(|n| out.join(n)).collect();
        Ok(Some(summary))
    }
}

/// Whether the file at `path` has `want`'s size and digest.
fn matches(path: &Path, want: &Done) -> Result<bool> {
    let Ok(f) = File::open(path) else {
        return Ok(false);
    };
    let len = f
        .metadata()
        .map_err(|e| Error::io(path, "cannot read", e))?
        .len();
    Ok(len == want.size && digest(f, path)? == want.blake3)
}

/// The BLAKE3 digest of what `f` holds from where it stands, in hex.
fn digest(mut f: File, path: &Path) -> Result<String> {
    let mut hash = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::io(path, "cannot read", e))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    Ok(hex(hash.finalize().as_bytes()))
}

/// One finished file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Done {
    size: u64,
    /// Its BLAKE3 digest in hex (a record without one matches no file).
    #[serde(default)]
    blake3: String,
}

impl Done {
    /// The size and digest of the file at `path`.
    fn of(path: &Path) -> Result<Done> {
        let f = File::open(path).map_err(|e| Error::io(path, "cannot read", e))?;
        let size = f
            .metadata()
            .map_err(|e| Error::io(path, "cannot read", e))?
            .len();
        Ok(Done {
            size,
            blake3: digest(f, path)?,
        })
    }
}

/// What the journal holds.
#[derive(Debug, Default)]
struct Record {
    key: String,
    files: BTreeMap<String, Done>,
}

/// The journal as this run keeps it: what it holds, and the file it
/// appends to once written whole.
#[derive(Debug)]
struct Log {
    record: Record,
    file: Option<File>,
}

/// The journal of one run, shared by the threads that finish its files.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    log: Mutex<Log>,
    /// The run's leave to write into its staging folder.
    gate: super::staging::Gate,
    /// The run continues an earlier one (`--resume`).
    resuming: bool,
}

impl Journal {
    /// The journal in staging folder `dir` for the job `key`: with
    /// `resume`, what an earlier run recorded under the same key, else
    /// nothing.
    pub(super) fn open(dir: &Path, key: &str, resume: bool, gate: super::staging::Gate) -> Journal {
        let record = match read(dir).filter(|_| resume) {
            Some(r) if r.key == key => r,
            _ => Record {
                key: key.to_string(),
                files: BTreeMap::new(),
            },
        };
        Journal {
            dir: dir.to_path_buf(),
            log: Mutex::new(Log { record, file: None }),
            gate,
            resuming: resume,
        }
    }

    /// Tells `note`, for a `--resume` run, how many of the output files
    /// `done` marks (those of `done`'s files an earlier run finished) are
    /// kept and how many are left to write.
    pub(crate) fn tell_resumed(&self, done: &[bool], note: &mut dyn FnMut(crate::Note<'_>)) {
        if self.resuming {
            let kept = done.iter().filter(|d| **d).count();
            let left = done.len() - kept;
            note(crate::Note::Resumed { kept, left });
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether an earlier run of this job recorded file `name`.
    pub(super) fn lists(&self, name: &str) -> bool {
        self.lock().record.files.contains_key(name)
    }

    /// Whether file `name` of the staging folder was finished: recorded,
    /// and its bytes there still of the recorded size and BLAKE3 digest (read
    /// whole to tell).
    pub fn done(&self, name: &str) -> Result<bool> {
        let Some(want) = self.lock().record.files.get(name).cloned() else {
            return Ok(false);
        };
        matches(&self.dir.join(name), &want)
    }

    /// The record of the finished run that moves `staged` (paths in the
    /// staging folder) into the output directory and reported `summary`:
    /// the files the journal lists as it recorded them, the others (JSON,
    /// side files) hashed now.
    pub(super) fn finished(&self, staged: &[PathBuf], summary: &super::Summary) -> Result<Vec<u8>> {
        let log = self.lock();
        let record = &log.record;
        let mut files = BTreeMap::new();
        for path in staged {
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let done = match record.files.get(&name) {
                Some(done) => done.clone(),
                None => Done::of(path)?,
            };
            files.insert(name, done);
        }
        let finished = Finished {
            tool: concat!("wgpu-dequant ", env!("CARGO_PKG_VERSION")).to_string(),
            key: record.key.clone(),
            files,
            // Where the files are is the output directory's to say: the
            // record of one job is the same wherever it was written.
            // Nor is what ran it, or for how long.
            summary: super::Summary {
                files: Vec::new(),
                backend: String::new(),
                backend_detail: String::new(),
                seconds: 0.0,
                ..summary.clone()
            },
        };
        crate::json::text(&finished).map_err(|e| {
            Error::new(
                crate::error::Rule::Internal,
                &self.dir,
                format!("record: {e}"),
            )
        })
    }

    /// Records file `name`, finished and synced at `path`, with its size
    /// and BLAKE3 digest (read back to tell).
    pub(super) fn record_file(&self, name: &str, path: &Path) -> Result<()> {
        let done = Done::of(path)?;
        self.insert(name, done)
    }

    /// Records file `name` as finished: `size` bytes of BLAKE3 digest
    /// `digest`, synced.
    pub(super) fn record(&self, name: &str, size: u64, digest: &[u8; 32]) -> Result<()> {
        let blake3 = hex(digest);
        self.insert(name, Done { size, blake3 })
    }

    /// Records `done` for file `name`: one line appended and synced (the
    /// journal is written whole, aside and renamed, once per run, so that a
    /// run killed meanwhile leaves the old one or the new; after that each
    /// file costs one line, not the whole list again). Only while the run is
    /// neither committed nor undone ([`Gate`](super::staging::Gate)): a
    /// journal is never written once the rollback has begun.
    fn insert(&self, name: &str, done: Done) -> Result<()> {
        let path = self.dir.join(JOURNAL);
        self.gate.write(&path, || {
            let mut log = self.lock();
            let entry = Entry {
                name: name.to_string(),
                done,
            };
            let line = line_of(&entry).map_err(|e| self.internal(e))?;
            log.record.files.insert(entry.name, entry.done);
            if let Some(file) = &mut log.file {
                return file
                    .write_all(&line)
                    .and_then(|()| file.sync_data())
                    .map_err(|e| Error::io(&path, "cannot write", e));
            }
            let mut text = line_of(&Head {
                key: log.record.key.clone(),
            })
            .map_err(|e| self.internal(e))?;
            for (name, done) in &log.record.files {
                let entry = Entry {
                    name: name.clone(),
                    done: done.clone(),
                };
                text.extend(line_of(&entry).map_err(|e| self.internal(e))?);
            }
            let aside = self.dir.join(format!("{JOURNAL}.new"));
            let mut f = File::create(&aside).map_err(|e| Error::io(&aside, "cannot create", e))?;
            f.write_all(&text)
                .and_then(|()| f.sync_all())
                .map_err(|e| Error::io(&aside, "cannot write", e))?;
            fs::rename(&aside, &path).map_err(|e| Error::io(&path, "cannot write", e))?;
            log.file = Some(
                File::options()
                    .append(true)
                    .open(&path)
                    .map_err(|e| Error::io(&path, "cannot open", e))?,
            );
            Ok(())
        })
    }

    fn internal(&self, e: serde_json::Error) -> Error {
        Error::new(
            crate::error::Rule::Internal,
            &self.dir,
            format!("journal: {e}"),
        )
    }
}

/// The journal's first line.
#[derive(serde::Serialize, serde::Deserialize)]
struct Head {
    key: String,
}

/// Every later line: one finished file.
#[derive(serde::Serialize, serde::Deserialize)]
struct Entry {
    name: String,
    #[serde(flatten)]
    done: Done,
}

/// `value` as one line of JSON, with its newline.
fn line_of(value: &impl serde::Serialize) -> serde_json::Result<Vec<u8>> {
    let mut text = serde_json::to_vec(value)?;
    text.push(b'\n');
    Ok(text)
}

/// The journal in staging folder `dir`: its key line, then the files, one
/// a line, up to the first line that is not whole (a run killed while it
/// appended one). `None` when there is none this tool can read.
fn read(dir: &Path) -> Option<Record> {
    let f = File::open(dir.join(JOURNAL)).ok()?;
    let mut text = String::new();
    f.take(MAX_JOURNAL_BYTES).read_to_string(&mut text).ok()?;
    let mut lines = text.split_inclusive('\n').filter(|l| l.ends_with('\n'));
    let head: Head = serde_json::from_str(lines.next()?).ok()?;
    let mut files = BTreeMap::new();
    for l in lines {
        let Ok(entry) = serde_json::from_str::<Entry>(l) else {
            break;
        };
        files.insert(entry.name, entry.done);
    }
    Some(Record {
        key: head.key,
        files,
    })
}

/// The files the journal in staging folder `dir` lists (none when it is
/// missing or unreadable); read without its lock: only to tell the files a
/// killed commit moved out, or what a stopped run keeps.
pub(super) fn listed(dir: &Path) -> BTreeSet<String> {
    read(dir).map_or_else(BTreeSet::new, |r| r.files.into_keys().collect())
}

/// Bytes as lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

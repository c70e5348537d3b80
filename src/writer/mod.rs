//! Writes a plan as a dense Hugging Face checkpoint.
//!
//! Shapes and dtypes are known from the plan, so each shard's header is
//! written first and tensors are streamed after it, decoded a bounded chunk of
//! rows at a time. Everything goes to a staging folder inside the output
//! directory and is renamed into place only when all of it succeeded; on any
//! failure the staging folder (and the output directory, if this run created
//! it) is removed; see `staging.rs` for how runs exclude each other and how an
//! interrupted run is undone.
//!
//! Both writers walk one `Schedule` (`schedule.rs`): this one, with the
//! plan at hand, and the streamed one (`streamed.rs`), which hands its
//! files over part by part to a browser or to a `PartWriter`.

mod header;
mod journal;
mod key;
mod layout;
mod parts;
mod pipeline;
mod schedule;
mod space;
mod staging;
mod streamed;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use header::safetensors_header;
pub(crate) use journal::record_name;
pub use journal::Journal;
use key::job_key;
pub(crate) use key::{hex_sha256, input_stamps};
pub(crate) use layout::part_shards;
use layout::{all_file_names, total_bytes, weight_map};
pub use layout::{json_files, shard_files, ShardFile};
pub use parts::{merge_index, Merged, PART_SUFFIX};
pub use pipeline::row_pieces;
use pipeline::write_shard;
pub(crate) use pipeline::PIECE_BYTES;
pub(crate) use schedule::Schedule;
pub use space::FREE_SPACE_VAR;
pub(crate) use space::{check as check_space, free as free_space, human, Need};
pub use staging::{interrupt, Interrupted};
use staging::{Mode, Staging};
pub use streamed::Part;
pub(crate) use streamed::{Hooks, Inputs, Streamed};

use crate::backend::Backend;
use crate::checkpoint::INDEX_FILE;
use crate::error::{Error, Result, Rule};
use crate::numerics::OutDtype;
use crate::plan::Plan;

/// What a finished `dequantize` wrote.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Summary {
    /// Dtype of the decoded tensors.
    pub dtype: OutDtype,
    /// Tensors decoded from quantized modules.
    pub decoded: usize,
    /// Tensors copied (possibly under a new name), cast ones included.
    pub copied: usize,
    /// Copied tensors converted to the `--dtype` asked for.
    pub cast: usize,
    /// Tensors computed while planning (converted scales).
    pub converted: usize,
    /// Quantization tensors used up by decoding (packs, scales, zeros,
    /// shapes, activation scales; a GGUF's rope factors, which config.json
    /// states).
    #[serde(default)]
    pub consumed: usize,
    /// Model tensors not written: a GGUF's tensors that transformers' model
    /// has no place for (HF-001, among the warnings).
    pub dropped: usize,
    /// Quantized modules written in the new format (`convert`).
    pub modules: usize,
    /// Tensor bytes written.
    pub tensor_bytes: u64,
    /// Files written.
    pub files: Vec<PathBuf>,
    /// What a run from the Hub fetched into the cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fetched: Option<Fetched>,
    /// The output already held every file of this job (`--resume` of a
    /// finished run, checked against its record): nothing was written, and
    /// the rest of this summary is the finished run's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub already_done: bool,
    /// The plan's findings: what the run dropped, guessed or changed on the
    /// way to the dense model (told as it started, too).
    #[serde(default, skip_deserializing)]
    pub warnings: Vec<crate::Warning>,
    /// The checkpoint's format, as `formats` and `inspect --json` name it
    /// (`gptq`, `gguf`, `compressed-tensors`, …; `dense` for none).
    #[serde(default)]
    pub format: String,
    /// The format for people: `inspect`'s format line.
    #[serde(default)]
    pub format_detail: String,
    /// The backend that decoded: `cpu` or `gpu` (`cpu` too where the GPU
    /// failed and the CPU took over); empty where nothing ran (a finished
    /// job found by `--resume`, `convert`).
    #[serde(default)]
    pub backend: String,
    /// The backend for people, as [`Note::Start`](crate::Note::Start) tells
    /// it (`gpu (NVIDIA H200, Vulkan) (CPU if it fails)`).
    #[serde(default)]
    pub backend_detail: String,
    /// Wall time of the run, in seconds (0 where it is not measured: a
    /// browser's `stream`).
    #[serde(default)]
    pub seconds: f64,
}

/// What a Hub run fetched: files downloaded into the cache, files found
/// there, and downloads removed again (`--delete-downloaded`).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Fetched {
    /// Downloaded by this run.
    pub downloaded: Vec<String>,
    /// Already in the cache.
    pub reused: Vec<String>,
    /// Downloaded, then removed once every tensor that reads it was written.
    pub deleted: Vec<String>,
    /// The most bytes of shards this run kept in the cache at once.
    pub peak_bytes: u64,
}

fn finish(path: &Path, w: BufWriter<File>) -> Result<()> {
    flush(path, w)?
        .sync_all()
        .map_err(|e| Error::io(path, "cannot sync", e))
}

fn flush(path: &Path, w: BufWriter<File>) -> Result<File> {
    w.into_inner()
        .map_err(|e| Error::io(path, "cannot write", e.into_error()))
}

/// Creates file `name` in the staging folder, buffered.
fn create(staging: &Staging, name: &str) -> Result<(PathBuf, BufWriter<File>)> {
    let (path, f) = staging.create(name)?;
    Ok((path, BufWriter::with_capacity(1 << 20, f)))
}

fn write_file(staging: &Staging, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    let (path, mut w) = create(staging, name)?;
    w.write_all(bytes)
        .map_err(|e| Error::io(&path, "cannot write", e))?;
    finish(&path, w)?;
    Ok(path)
}

/// How far a run's downloads are (a Hub run's shards that the cache
/// lacked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Download {
    /// Bytes received so far.
    pub done_bytes: u64,
    /// Bytes the run downloads in all.
    pub total_bytes: u64,
}

/// What a progress callback is told after each piece of output: `bytes`
/// more bytes of `tensor` were written (and whether that finished it), and
/// how far the whole run is.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Progress<'p> {
    /// The output tensor.
    pub tensor: &'p str,
    /// Bytes just written.
    pub bytes: u64,
    /// The tensor is complete.
    pub done: bool,
    /// Tensor bytes written so far, these included.
    pub done_bytes: u64,
    /// Tensor bytes the run writes in all.
    pub total_bytes: u64,
    /// Tensors complete so far.
    pub done_tensors: usize,
    /// Tensors the run writes in all.
    pub total_tensors: usize,
    /// A Hub run's downloads, when it has any.
    pub download: Option<Download>,
}

/// Counts a run's progress, piece by piece.
pub(crate) struct Tally {
    done_bytes: u64,
    total_bytes: u64,
    done_tensors: usize,
    total_tensors: usize,
}

impl Tally {
    /// Nothing written yet of `shards`.
    pub(crate) fn of<T>(shards: &[ShardFile<T>]) -> Tally {
        Tally {
            done_bytes: 0,
            total_bytes: total_bytes(shards),
            done_tensors: 0,
            total_tensors: shards.iter().map(|f| f.tensors.len()).sum(),
        }
    }

    /// `bytes` more of `tensor` were written, finishing it when `done`.
    pub(crate) fn step<'p>(&mut self, tensor: &'p str, bytes: u64, done: bool) -> Progress<'p> {
        self.done_bytes += bytes;
        self.done_tensors += usize::from(done);
        Progress {
            tensor,
            bytes,
            done,
            done_bytes: self.done_bytes,
            total_bytes: self.total_bytes,
            done_tensors: self.done_tensors,
            total_tensors: self.total_tensors,
            download: None,
        }
    }
}

/// An output directory claimed for a dense checkpoint: it did not exist or
/// was empty. If it is dropped before [`OutputDir::write`] succeeds, everything
/// this run put there is removed again.
pub struct OutputDir {
    staging: Staging,
    /// Only these input shards are written (`--shards`).
    shards: Option<Vec<String>>,
    /// Output files hold at most this many bytes (`--max-shard-size`).
    max_shard_size: Option<u64>,
    cancelled: Arc<AtomicBool>,
}

/// Stops a run from another thread (an app's Ctrl-C, a Cancel button):
/// it fails with CANCEL-001 before its next piece and leaves nothing
/// behind, as any failed run does.
#[derive(Debug, Clone, Default)]
pub struct Canceller(Arc<AtomicBool>);

impl Canceller {
    /// Asks the write to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Fails once the write was cancelled.
fn check(cancelled: &AtomicBool) -> Result<()> {
    if cancelled.load(Ordering::SeqCst) {
        return Err(Error::bare(
            Rule::Cancelled,
            "cancelled; nothing was written",
        ));
    }
    Ok(())
}

impl OutputDir {
    /// Claims `out`, creating it (and missing parents) when needed; refuses a
    /// non-empty directory with `OUT-001`.
    pub fn create(out: &Path) -> Result<OutputDir> {
        OutputDir::open(out, false, None, false)
    }

    /// Claims `out` even when it holds files (`--force`): files of the same
    /// names are replaced when everything succeeded (and kept when anything
    /// failed); other files are left alone.
    pub fn force(out: &Path) -> Result<OutputDir> {
        OutputDir::open(out, true, None, false)
    }

    /// Claims `out` for the output of input shards `shards` only (file names),
    /// so that several runs (one per machine) fill one directory: `out` may
    /// hold other runs' shards, the run writes a partial index
    /// (`<first shard>.index-part.json`) instead of the index, and
    /// [`merge_index`] joins the parts when all runs are done.
    pub fn for_shards(out: &Path, shards: Vec<String>) -> Result<OutputDir> {
        OutputDir::open(out, false, Some(shards), false)
    }

    /// Claims `out` as [`OutputDir::force`] (`force`), [`OutputDir::for_shards`]
    /// (`shards`) or [`OutputDir::create`] do; with `resume`, an earlier
    /// run's staging folder is taken over: the output files it finished
    /// (recorded with their SHA-256 in its journal, and still of those
    /// bytes) are kept, and this run's own finished files are kept for the
    /// next `resume` run if it fails or is interrupted too.
    pub fn open(
        out: &Path,
        force: bool,
        shards: Option<Vec<String>>,
        resume: bool,
    ) -> Result<OutputDir> {
        let tag = shards.as_deref().map(share_tag).transpose()?;
        OutputDir::claim(out, force, shards, tag.as_deref(), resume, None)
    }

    /// [`OutputDir::open`] for the job of key `key` (the same for every run
    /// of one job, known before it plans), its staging folder and record
    /// tagged `tag` when it shares the directory with other jobs.
    pub(crate) fn claim(
        out: &Path,
        force: bool,
        shards: Option<Vec<String>>,
        tag: Option<&str>,
        resume: bool,
        key: Option<String>,
    ) -> Result<OutputDir> {
        let staging = match (tag, force) {
            (Some(tag), _) => Staging::new(out, Mode::Shared(tag), resume, key)?,
            (None, true) => Staging::new(out, Mode::Force, resume, key)?,
            (None, false) => Staging::new(out, Mode::Fresh, resume, key)?,
        };
        Ok(OutputDir {
            staging,
            shards,
            max_shard_size: None,
            cancelled: Arc::default(),
        })
    }

    /// Splits the output into files `model-0000i-of-0000N.safetensors` of at
    /// most `bytes` each (header included), unless one tensor alone is
    /// larger ([`shard_files`] tells how), instead of one file per input
    /// shard.
    pub fn with_max_shard_size(mut self, bytes: u64) -> OutputDir {
        self.max_shard_size = Some(bytes);
        self
    }

    /// A handle that cancels this directory's [`OutputDir::write`].
    pub fn canceller(&self) -> Canceller {
        Canceller(self.cancelled.clone())
    }

    /// Lets `canceller` stop this directory's [`OutputDir::write`].
    pub fn cancelled_by(mut self, canceller: &Canceller) -> OutputDir {
        self.cancelled = canceller.0.clone();
        self
    }

    /// Writes the dense checkpoint of `plan`; `progress` hears of every
    /// chunk written. Refuses (`OUT-001`) before writing anything when the
    /// output's file system has too little room for it.
    pub fn write(
        self,
        plan: &Plan<'_>,
        backend: &dyn Backend,
        progress: impl FnMut(Progress<'_>),
    ) -> Result<Summary> {
        self.write_noting(plan, backend, progress, &mut |_| {})
    }

    /// [`OutputDir::write`], telling `note` what is worth a line (a free
    /// space that cannot be read, the files a `--resume` run keeps).
    pub(crate) fn write_noting(
        self,
        plan: &Plan<'_>,
        backend: &dyn Backend,
        progress: impl FnMut(Progress<'_>),
        note: &mut dyn FnMut(crate::Note<'_>),
    ) -> Result<Summary> {
        plan.check()?;
        let input = plan.checkpoint.dir.canonicalize().ok();
        if input.is_some() && self.staging.out().canonicalize().ok() == input {
            return Err(Error::new(
                Rule::Output,
                self.staging.out(),
                "is the input checkpoint's directory; refusing to write into it",
            ));
        }
        write_into(
            self.staging,
            self.shards.as_deref(),
            self.max_shard_size,
            plan,
            backend,
            &self.cancelled,
            progress,
            note,
        )
    }
}

/// What a run decided about its output, handed to the writer in one
/// piece: where, whether it may hold files (`force`), which input shards
/// are written (`shards`), the tag and key of its job, whether it
/// continues an earlier run (`resume`), how its files are split
/// (`max_shard_size`) and what cancels it.
pub(crate) struct Target<'t> {
    pub(crate) out: &'t Path,
    pub(crate) force: bool,
    pub(crate) shards: Option<Vec<String>>,
    pub(crate) tag: Option<&'t str>,
    pub(crate) resume: bool,
    pub(crate) key: String,
    pub(crate) max_shard_size: Option<u64>,
    pub(crate) canceller: &'t Canceller,
}

impl Target<'_> {
    /// The output directory, claimed ([`OutputDir::claim`]) for the local
    /// writer.
    pub(crate) fn claim(self) -> Result<OutputDir> {
        let dir = OutputDir::claim(
            self.out,
            self.force,
            self.shards,
            self.tag,
            self.resume,
            Some(self.key),
        )?;
        let dir = match self.max_shard_size {
            Some(max) => dir.with_max_shard_size(max),
            None => dir,
        };
        Ok(dir.cancelled_by(self.canceller))
    }

    /// The output directory, claimed for the parts of a streamed run.
    pub(crate) fn parts(self) -> Result<PartWriter> {
        let key = self.key.clone();
        self.claim()?.parts(|| key)
    }
}

/// The tag of a `--shards` job's staging folder and record: its first
/// shard's name.
pub(crate) fn share_tag(shards: &[String]) -> Result<String> {
    shards
        .first()
        .map(|f| f.trim_end_matches(".safetensors").to_string())
        .ok_or_else(|| Error::bare(Rule::Argument, "--shards: names no shard"))
}

/// Writes the dense checkpoint of `plan` into `out`, which must not exist or
/// be empty. `progress` hears of every chunk written.
pub fn write(
    plan: &Plan<'_>,
    backend: &dyn Backend,
    out: &Path,
    progress: impl FnMut(Progress<'_>),
) -> Result<Summary> {
    OutputDir::create(out)?.write(plan, backend, progress)
}

/// The summary of the finished run of job `key` in `out` (tagged `tag`, a
/// `--shards` or `--part` job's), when its record is there and every file
/// it lists still has the recorded size and SHA-256; a staging folder a
/// run killed after its last move left is removed. `None` otherwise.
pub(crate) fn finished(out: &Path, tag: Option<&str>, key: &str) -> Result<Option<Summary>> {
    let Some(record) = journal::Finished::read(out, &record_name(tag)) else {
        return Ok(None);
    };
    let Some(summary) = record.check(out, key)? else {
        return Ok(None);
    };
    let staging = match tag {
        Some(tag) => out.join(format!("{}-{tag}", staging::STAGING)),
        None => out.join(staging::STAGING),
    };
    if staging.exists() {
        // Taken over and let go: what it holds was moved out already.
        drop(OutputDir::claim(
            out,
            false,
            None,
            tag,
            true,
            Some(key.to_string()),
        )?);
    }
    Ok(Some(summary))
}

/// Refuses `--shards` names that are not the checkpoint's shards.
fn check_shards(plan: &Plan<'_>, only: Option<&[String]>) -> Result<()> {
    let known: Vec<&str> = plan
        .checkpoint
        .shards
        .iter()
        .map(|s| s.file_name.as_str())
        .collect();
    match only.and_then(|only| only.iter().find(|f| !known.contains(&f.as_str()))) {
        Some(bad) => Err(Error::bare(
            Rule::Argument,
            format!(
                "--shards: {bad} is not a shard of this checkpoint ({})",
                known.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

/// The JSON files a run writes beside `shards`: the index and
/// `config.json`, or for a `--shards` run (`only`) its part of the index
/// (`<first shard>.index-part.json`, which [`merge_index`] joins) instead
/// of the index.
fn run_json_files(
    plan: &Plan<'_>,
    shards: &[ShardFile<&crate::plan::Output<'_>>],
    only: Option<&[String]>,
    max_shard_size: Option<u64>,
) -> Result<Vec<(String, Vec<u8>)>> {
    let mut json = json_files(plan, shards)?;
    if let (Some(index), Some(only)) = (&plan.checkpoint.index, only) {
        json.retain(|(name, _)| name != INDEX_FILE);
        // Every output file: what merge_index waits for.
        let all = all_file_names(plan, max_shard_size);
        let part = parts::IndexPart {
            metadata: parts::IndexPartMetadata {
                total_size: total_bytes(shards),
                shards: shards.iter().map(|f| f.name.clone()).collect(),
                all_shards: all,
                source_index_sha256: parts::digest(&index.value),
                dtype: plan.dtype.to_string(),
            },
            weight_map: weight_map(shards),
        };
        let name = format!("{}{PART_SUFFIX}", only[0].trim_end_matches(".safetensors"));
        let text = crate::json::file(&name, &part)?;
        json.insert(0, (name, text));
    }
    Ok(json)
}

/// The files of a shared output directory that one `--shards` run owns
/// (its shards and its part of the index); the rest every run writes alike.
fn owned(p: &Path) -> bool {
    let name = p.to_string_lossy();
    name.ends_with(".safetensors") || name.ends_with(PART_SUFFIX)
}

#[allow(clippy::too_many_arguments)]
fn write_into(
    staging: Staging,
    only: Option<&[String]>,
    max_shard_size: Option<u64>,
    plan: &Plan<'_>,
    backend: &dyn Backend,
    cancelled: &AtomicBool,
    mut progress: impl FnMut(Progress<'_>),
    note: &mut dyn FnMut(crate::Note<'_>),
) -> Result<Summary> {
    let ckpt = plan.checkpoint;
    let schedule = Schedule::of(plan, only, max_shard_size)?;
    let journal = staging.journal(|| job_key(plan, &schedule.shards))?;
    let done = schedule.done(Some(&journal))?;
    journal.tell_resumed(&done, note);
    // Everything this run writes, what an earlier run finished aside.
    let need = Need {
        what: "the dense checkpoint",
        at: staging.out().to_path_buf(),
        bytes: schedule.bytes(&done, |path, _| {
            std::fs::metadata(path).map_or(0, |m| m.len())
        }),
    };
    for line in space::check(staging.out(), &[need])? {
        note(crate::Note::Text(&line));
    }
    let mut tally = schedule.tally();
    let mut progress = |tensor: &str, bytes, done| progress(tally.step(tensor, bytes, done));
    // Each file is synced to disk on a thread of its own while the next is
    // decoded: syncing in turn would leave the decoder idle for every flush.
    std::thread::scope(|scope| -> Result<()> {
        let mut syncs = Vec::new();
        for (file, done) in schedule.shards.iter().zip(done) {
            if done {
                for t in &file.tensors {
                    progress(&t.name, t.byte_len() as u64, true);
                }
                continue;
            }
            let (path, w) = create(&staging, &file.name)?;
            let (w, len, digest) = write_shard(
                ckpt,
                &file.header,
                &file.tensors,
                backend,
                cancelled,
                &path,
                w,
                &mut progress,
            )?;
            let f = flush(&path, w)?;
            let (journal, name) = (&journal, &file.name);
            syncs.push(scope.spawn(move || {
                f.sync_all()
                    .map_err(|e| Error::io(&path, "cannot sync", e))?;
                journal.record(name, len, &digest)
            }));
        }
        for s in syncs {
            s.join()
                .unwrap_or_else(|_| Err(Error::bare(Rule::Internal, "a sync thread panicked")))?;
        }
        Ok(())
    })?;
    for (name, text) in &schedule.json {
        write_file(&staging, name, text)?;
    }
    for (path, name) in &schedule.copies {
        staging.copy_in(path, name)?;
    }
    check(cancelled)?;
    let mut summary = schedule.summary;
    summary.files = staging.commit(owned, &journal, &summary)?;
    Ok(summary)
}

/// A dense checkpoint written file after file from the parts a stream of
/// it hands over ([`Part`]), staged and committed as
/// [`OutputDir::write`] stages and commits: what a run over a checkpoint
/// read piece by piece (a Hub id's) writes.
pub(crate) struct PartWriter {
    staging: Staging,
    cancelled: Arc<AtomicBool>,
    /// The file being written.
    open: Option<(String, PathBuf, BufWriter<File>)>,
    /// The record of its finished files.
    journal: Arc<Journal>,
}

impl OutputDir {
    /// This directory, written part by part, for the job of key `key` (what
    /// a `--resume` run must share with the run it continues).
    pub(crate) fn parts(self, key: impl FnOnce() -> String) -> Result<PartWriter> {
        let journal = Arc::new(self.staging.journal(key)?);
        Ok(PartWriter {
            staging: self.staging,
            cancelled: self.cancelled,
            open: None,
            journal,
        })
    }
}

impl PartWriter {
    /// The run's record: the files an earlier run finished.
    pub(crate) fn journal(&self) -> Arc<Journal> {
        self.journal.clone()
    }

    /// The file `name`, created (and the one before it finished) when it is
    /// not the one being written.
    pub(crate) fn file(&mut self, name: &str) -> Result<&mut dyn Write> {
        check(&self.cancelled)?;
        if self.open.as_ref().is_none_or(|(n, ..)| n != name) {
            self.close()?;
            let (path, w) = create(&self.staging, name)?;
            self.open = Some((name.to_string(), path, w));
        }
        match &mut self.open {
            Some((_, _, w)) => Ok(w),
            None => Err(Error::bare(Rule::Internal, "no file open")),
        }
    }

    /// Appends `bytes` to file `name`.
    pub(crate) fn append(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let path = self.staging.out().join(name);
        self.file(name)?
            .write_all(bytes)
            .map_err(|e| Error::io(&path, "cannot write", e))
    }

    /// Appends `part` to file `name`; a stored part's bytes are `read`'s
    /// (bytes `range` of an input file, or all of it when `None`), a range
    /// a bounded piece at a time.
    pub(crate) fn put(
        &mut self,
        name: &str,
        part: Part,
        read: impl Fn(&str, Option<std::ops::Range<u64>>) -> Result<Vec<u8>>,
    ) -> Result<()> {
        const PIECE: u64 = 64 << 20;
        match part {
            Part::Bytes(bytes) => self.append(name, &bytes),
            Part::Stored { file, range } => {
                let mut at = range.start;
                while at < range.end {
                    let end = (at + PIECE).min(range.end);
                    self.append(name, &read(&file, Some(at..end))?)?;
                    at = end;
                }
                Ok(())
            }
            Part::File(file) => read(&file, None).and_then(|bytes| self.append(name, &bytes)),
        }
    }

    fn close(&mut self) -> Result<()> {
        let Some((name, path, w)) = self.open.take() else {
            return Ok(());
        };
        finish(&path, w)?;
        // Hashed read back: a Hub run's files come at the network's pace.
        self.journal.record_file(&name, &path)
    }

    /// Finishes the last file and moves everything into the output
    /// directory, with the record of a run that reported `summary`.
    pub(crate) fn commit(mut self, summary: &Summary) -> Result<Vec<PathBuf>> {
        self.close()?;
        check(&self.cancelled)?;
        self.staging.commit(owned, &self.journal, summary)
    }
}

/// A size as Hugging Face writes `max_shard_size`: bytes, or a number with
/// a unit, decimal (`KB`, `MB`, `GB`, `TB`: powers of 1000) or binary
/// (`KiB` … `TiB`: powers of 1024), in any case (`5GB`, `500MB`, `1.5GiB`).
pub fn parse_size(s: &str) -> Result<u64> {
    let bad = || {
        Error::bare(
            Rule::Argument,
            format!("size {s:?}: expected bytes or a number with KB, MB, GB, TB (or K, M, G, T), KiB, MiB, GiB or TiB, above 0"),
        )
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        // llama.cpp's `--split-max-size 5G` counts in powers of 1000 too.
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => return Err(bad()),
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    let bytes = (value * unit as f64).floor();
    if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(bad());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_read_as_hugging_face_reads_them() {
        for (s, want) in [
            ("5GB", 5_000_000_000),
            ("500MB", 500_000_000),
            ("2GiB", 2 << 30),
            ("1.5gib", 3 << 29),
            ("100kb", 100_000),
            ("4096", 4096),
            ("10 MiB", 10 << 20),
            ("5G", 5_000_000_000),
            ("5 GB", 5_000_000_000),
            ("5GiB", 5 << 30),
            ("2t", 2_000_000_000_000),
        ] {
            assert_eq!(parse_size(s).ok(), Some(want), "{s}");
        }
        for bad in ["", "0", "5XB", "-1GB", "GB", "1e3"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}

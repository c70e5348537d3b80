//! Writes a plan as a dense Hugging Face checkpoint.
//!
//! Shapes and dtypes are known from the plan, so each shard's header is
//! written first and tensors are streamed after it, decoded a bounded chunk of
//! rows at a time. Everything goes to a staging folder inside the output
//! directory and is renamed into place only when all of it succeeded; on any
//! failure the staging folder (and the output directory, if this run created
//! it) is removed; see `staging.rs` for how runs exclude each other and how an
//! interrupted run is undone.

mod header;
pub mod json;
mod parts;
mod staging;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender};
use std::sync::Arc;

pub use header::safetensors_header;
pub use parts::{merge_index, Merged, PART_SUFFIX};
pub use staging::interrupt;
use staging::{Mode, Staging};

use crate::backend::Backend;
use crate::checkpoint::{Checkpoint, INDEX_FILE};
use crate::error::{Error, Result, Rule};
use crate::numerics::OutDtype;
use crate::plan::{Output, Plan, Source};

/// Decoded bytes per piece; at most three pieces are in memory at once (one
/// being decoded, one queued, one being written), four when the backend
/// decodes ahead.
const CHUNK_BYTES: usize = 32 << 20;

/// What a finished `dequantize` wrote.
#[derive(Debug, Clone, serde::Serialize)]
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
    /// Input tensors used up by decoding or not part of a dense checkpoint
    /// (packs, scales, shapes, activation parameters).
    pub dropped: usize,
    /// Quantized modules written in the new format (`convert`).
    pub modules: usize,
    /// Tensor bytes written.
    pub tensor_bytes: u64,
    /// Files written.
    pub files: Vec<PathBuf>,
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

/// Bytes on their way to the file-writing thread.
enum Piece<'a> {
    /// Decoded (or computed) bytes; the buffer comes back for reuse.
    Owned(Vec<u8>),
    /// Stored bytes copied as they are, released from memory once written.
    Stored(&'a [u8]),
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
    pub(crate) fn of(shards: &[ShardFile<'_, '_>]) -> Tally {
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
        }
    }
}

/// One piece of a shard's tensor data, in file order: a whole tensor, a
/// bounded run of rows of a tensor decoded by rows, or several small
/// tensors decoded by rows, made together.
enum Item<'t, 'a> {
    Whole(&'t Output<'a>),
    Rows(&'t Output<'a>, std::ops::Range<usize>),
    Batch(Vec<&'t Output<'a>>),
}

/// Tensors decoded by rows below this size are batched into pieces of about
/// [`CHUNK_BYTES`]: a MoE release's thousands of small experts would
/// otherwise cost a round of thread wake-ups and a hand-over each.
const SMALL_BYTES: usize = CHUNK_BYTES / 8;

impl<'t, 'a> Item<'t, 'a> {
    /// The pieces of `tensors`, in order ([`row_pieces`]; small ones batched).
    fn all(tensors: &[&'t Output<'a>]) -> Vec<Item<'t, 'a>> {
        let mut items = Vec::new();
        let mut batch: Vec<&'t Output<'a>> = Vec::new();
        let mut batch_bytes = 0;
        let flush = |batch: &mut Vec<&'t Output<'a>>, items: &mut Vec<Item<'t, 'a>>| {
            match batch.len() {
                0 => {}
                1 => items.extend(Item::of(batch[0])),
                _ => items.push(Item::Batch(std::mem::take(batch))),
            }
            batch.clear();
        };
        for &t in tensors {
            let small = t.row_layout().is_some() && t.byte_len() <= SMALL_BYTES;
            if !small || batch_bytes + t.byte_len() > CHUNK_BYTES {
                flush(&mut batch, &mut items);
                batch_bytes = 0;
            }
            if small {
                batch.push(t);
                batch_bytes += t.byte_len();
            } else {
                items.extend(Item::of(t));
            }
        }
        flush(&mut batch, &mut items);
        items
    }

    /// The tensor's pieces ([`row_pieces`]).
    fn of(t: &'t Output<'a>) -> Vec<Item<'t, 'a>> {
        match row_pieces(t) {
            Some(pieces) => pieces.into_iter().map(|rows| Item::Rows(t, rows)).collect(),
            None => vec![Item::Whole(t)],
        }
    }

    /// Whether the piece is decoded into a buffer (and can be made ahead).
    fn decoded(&self) -> bool {
        !matches!(self, Item::Whole(_))
    }

    /// The tensors the piece writes to, with the bytes it writes to each and
    /// whether it finishes them.
    fn parts(&self) -> Vec<(&'t Output<'a>, usize, bool)> {
        match self {
            Item::Whole(t) => vec![(t, t.byte_len(), true)],
            Item::Rows(t, rows) => {
                let (total, row_bytes) = t.row_layout().unwrap_or((0, 0));
                vec![(t, rows.len() * row_bytes, rows.end == total)]
            }
            Item::Batch(ts) => ts.iter().map(|t| (*t, t.byte_len(), true)).collect(),
        }
    }

    /// The piece's bytes; a decoded piece goes into `buf`.
    fn make(&self, backend: &dyn Backend, mut buf: Vec<u8>) -> Result<Piece<'a>> {
        match self {
            Item::Whole(t) => Ok(match &t.source {
                Source::Copy(src) => Piece::Stored(src.stored()),
                _ => Piece::Owned(t.bytes(backend)?.into_owned()),
            }),
            Item::Rows(t, rows) => {
                let row_bytes = t.row_layout().map_or(0, |(_, b)| b);
                buf.resize(rows.len() * row_bytes, 0);
                t.decode_rows(backend, rows.clone(), &mut buf)?;
                Ok(Piece::Owned(buf))
            }
            Item::Batch(ts) => {
                buf.resize(ts.iter().map(|t| t.byte_len()).sum(), 0);
                let mut jobs = Vec::with_capacity(ts.len());
                let mut rest = &mut buf[..];
                for t in ts {
                    let (out, tail) = rest.split_at_mut(t.byte_len());
                    jobs.push((*t, out));
                    rest = tail;
                }
                let decode = |(t, out): (&Output<'a>, &mut [u8])| {
                    let rows = t.row_layout().map_or(0, |(total, _)| total);
                    t.decode_rows(backend, 0..rows, out)
                };
                // The CPU backend parallelises within a tensor, and small
                // tensors leave its threads idle: spread the batch over them.
                // A device takes its calls one at a time.
                #[cfg(not(target_arch = "wasm32"))]
                if !backend.decodes_ahead() {
                    use rayon::prelude::*;
                    jobs.into_par_iter().try_for_each(decode)?;
                    return Ok(Piece::Owned(buf));
                }
                jobs.into_iter().try_for_each(decode)?;
                Ok(Piece::Owned(buf))
            }
        }
    }
}

/// The runs of rows (of about [`CHUNK_BYTES`] each) a tensor decoded by rows
/// is made in, so that memory holds a few of them, not the tensor; `None`
/// for a tensor made whole.
pub fn row_pieces(t: &Output<'_>) -> Option<Vec<std::ops::Range<usize>>> {
    match t.row_layout() {
        Some((total, row_bytes)) if total > 0 && row_bytes > 0 => {
            let per = (CHUNK_BYTES / row_bytes).max(1);
            let starts = (0..total).step_by(per);
            Some(
                starts
                    .map(|start| start..(start + per).min(total))
                    .collect(),
            )
        }
        _ => None,
    }
}

/// Makes the pieces of `items` in order and hands each to the writing
/// thread (`tx`). When the backend runs calls at once
/// ([`Backend::decodes_ahead`]), a helper thread decodes the next piece while
/// this one is made, so the device never drains between pieces. Returns
/// false when the writing thread stopped taking pieces.
#[allow(clippy::too_many_arguments)]
fn send_pieces<'a>(
    ckpt: &Checkpoint,
    items: &[Item<'_, 'a>],
    backend: &dyn Backend,
    cancelled: &AtomicBool,
    tx: &SyncSender<Piece<'a>>,
    spare: &Receiver<Vec<u8>>,
    progress: &mut impl FnMut(&str, u64, bool),
) -> Result<bool> {
    std::thread::scope(|scope| {
        let (done_tx, done_rx) = sync_channel::<Result<Piece<'a>>>(1);
        // The helper's queue, when there is a helper (never in the browser,
        // which has no threads).
        #[cfg(not(target_arch = "wasm32"))]
        let ahead = backend.decodes_ahead().then(|| {
            let (ahead_tx, ahead_rx) = channel::<(usize, Vec<u8>)>();
            scope.spawn(move || {
                for (i, buf) in ahead_rx {
                    if done_tx.send(items[i].make(backend, buf)).is_err() {
                        break;
                    }
                }
            });
            ahead_tx
        });
        #[cfg(target_arch = "wasm32")]
        let ahead: Option<std::sync::mpsc::Sender<(usize, Vec<u8>)>> = {
            let _ = (scope, done_tx);
            None
        };
        let mut pending = None;
        for (i, item) in items.iter().enumerate() {
            check(cancelled)?;
            let piece = if pending == Some(i) {
                pending = None;
                done_rx
                    .recv()
                    // It sends a result before it ends, unless it panicked.
                    .map_err(|_| Error::bare(Rule::Internal, "the decoding thread stopped"))??
            } else {
                let next = items.get(i + 1).filter(|n| n.decoded());
                if let (Some(ahead), Some(_)) = (&ahead, next) {
                    let buf = spare.try_recv().unwrap_or_default();
                    if ahead.send((i + 1, buf)).is_ok() {
                        pending = Some(i + 1);
                    }
                }
                item.make(backend, spare.try_recv().unwrap_or_default())?
            };
            if tx.send(piece).is_err() {
                return Ok(false);
            }
            // Inputs leave memory as soon as the last piece that reads them
            // is made (copies once written, by the writing thread).
            let mut spent = Vec::new();
            for (t, bytes, done) in item.parts() {
                progress(&t.name, bytes as u64, done);
                match (item, done) {
                    (_, true) if !matches!(t.source, Source::Copy(_)) => {
                        spent.extend(t.inputs().iter().map(|i| i.stored()))
                    }
                    (Item::Rows(_, rows), false) => spent.extend(t.spent_inputs(rows.clone())),
                    _ => {}
                }
            }
            ckpt.release_all(spent);
        }
        Ok(true)
    })
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
        Ok(OutputDir {
            staging: Staging::new(out, Mode::Fresh)?,
            shards: None,
            max_shard_size: None,
            cancelled: Arc::default(),
        })
    }

    /// Claims `out` even when it holds files (`--force`): files of the same
    /// names are replaced when everything succeeded (and kept when anything
    /// failed); other files are left alone.
    pub fn force(out: &Path) -> Result<OutputDir> {
        Ok(OutputDir {
            staging: Staging::new(out, Mode::Force)?,
            shards: None,
            max_shard_size: None,
            cancelled: Arc::default(),
        })
    }

    /// Claims `out` for the output of input shards `shards` only (file names),
    /// so that several runs (one per machine) fill one directory: `out` may
    /// hold other runs' shards, the run writes a partial index
    /// (`<first shard>.index-part.json`) instead of the index, and
    /// [`merge_index`] joins the parts when all runs are done.
    pub fn for_shards(out: &Path, shards: Vec<String>) -> Result<OutputDir> {
        let tag = shards
            .first()
            .map(|f| f.trim_end_matches(".safetensors").to_string())
            .ok_or_else(|| Error::bare(Rule::Argument, "--shards: names no shard"))?;
        Ok(OutputDir {
            staging: Staging::new(out, Mode::Shared(&tag))?,
            shards: Some(shards),
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
    /// chunk written.
    pub fn write(
        self,
        plan: &Plan<'_>,
        backend: &dyn Backend,
        progress: impl FnMut(Progress<'_>),
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
        if let Some(only) = &self.shards {
            let known: Vec<&str> = plan
                .checkpoint
                .shards
                .iter()
                .map(|s| s.file_name.as_str())
                .collect();
            if let Some(bad) = only.iter().find(|f| !known.contains(&f.as_str())) {
                return Err(Error::bare(
                    Rule::Argument,
                    format!(
                        "--shards: {bad} is not a shard of this checkpoint ({})",
                        known.join(", ")
                    ),
                ));
            }
        }
        write_into(
            self.staging,
            self.shards.as_deref(),
            self.max_shard_size,
            plan,
            backend,
            &self.cancelled,
            progress,
        )
    }
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

/// One safetensors file of the dense output: its header, then its tensors'
/// bytes back to back.
pub struct ShardFile<'p, 'a> {
    /// File name (the input shard's, or `model-0000i-of-0000N.safetensors`).
    pub name: String,
    /// The header ([`safetensors_header`]).
    pub header: Vec<u8>,
    /// The tensors, in file order.
    pub tensors: Vec<&'p Output<'a>>,
}

/// How the dense output is split into files: one per input shard, or
/// pieces of at most `max` bytes each.
///
/// With a maximum, each input shard's tensors (in output order) fill files
/// greedily, a new file starting when the next tensor would take this one
/// past `max` (its header counted at an upper bound), so a file is larger
/// only when it holds one tensor that alone is. Files never mix input
/// shards: every `--shards` run derives the same layout from the headers
/// and writes the files of its own shards. They are named
/// `model-0000i-of-0000N.safetensors` (`model.safetensors` when there is one).
fn layout<'p, 'a>(
    plan: &'p Plan<'a>,
    max: Option<u64>,
) -> Vec<(String, usize, Vec<&'p Output<'a>>)> {
    let mut files = Vec::new();
    for (i, shard) in plan.checkpoint.shards.iter().enumerate() {
        let tensors: Vec<&Output<'_>> = plan.outputs.iter().filter(|o| o.shard == i).collect();
        if tensors.is_empty() {
            continue;
        }
        let Some(max) = max else {
            files.push((shard.file_name.clone(), i, tensors));
            continue;
        };
        let mut file: Vec<&Output<'_>> = Vec::new();
        let mut size = header::EMPTY_BOUND;
        for t in tensors {
            let cost = t.byte_len() as u64 + header::entry_bound(&t.name, t.dtype, &t.shape);
            if !file.is_empty() && size.saturating_add(cost) > max {
                files.push((String::new(), i, std::mem::take(&mut file)));
                size = header::EMPTY_BOUND;
            }
            file.push(t);
            size = size.saturating_add(cost);
        }
        files.push((String::new(), i, file));
    }
    if max.is_some() {
        let n = files.len();
        for (k, f) in files.iter_mut().enumerate() {
            f.0 = if n == 1 {
                "model.safetensors".into()
            } else {
                format!("model-{:05}-of-{n:05}.safetensors", k + 1)
            };
        }
    }
    files
}

/// The dense checkpoint's safetensors files (those of input shards `only`,
/// when given), in order: what every writer streams. `max_shard_size` splits
/// them as [`OutputDir::with_max_shard_size`] says.
pub fn shard_files<'p, 'a>(
    plan: &'p Plan<'a>,
    only: Option<&[String]>,
    max_shard_size: Option<u64>,
) -> Result<Vec<ShardFile<'p, 'a>>> {
    let mut files = Vec::new();
    for (name, input, tensors) in layout(plan, max_shard_size) {
        let shard = &plan.checkpoint.shards[input];
        if !wanted(only, &shard.file_name) {
            continue;
        }
        let header = safetensors_header(
            &shard.path,
            tensors
                .iter()
                .map(|t| (t.name.as_str(), t.dtype, t.shape.as_slice(), t.byte_len())),
        )?;
        files.push(ShardFile {
            name,
            header,
            tensors,
        });
    }
    Ok(files)
}

/// Every output file's name, whichever run writes it.
fn all_file_names(plan: &Plan<'_>, max_shard_size: Option<u64>) -> Vec<String> {
    layout(plan, max_shard_size)
        .into_iter()
        .map(|(name, _, _)| name)
        .collect()
}

/// The JSON files of the dense checkpoint beside its shards (the index when
/// the input has one or the output has several files, `config.json`), as
/// (file name, text).
pub fn json_files(plan: &Plan<'_>, shards: &[ShardFile<'_, '_>]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    if plan.checkpoint.index.is_some() || shards.len() > 1 {
        let index = parts::Index::new(total_bytes(shards), weight_map(shards));
        files.push((INDEX_FILE.to_string(), json_text(INDEX_FILE, &index)?));
    }
    if let Some(cfg) = &plan.config {
        files.push(("config.json".to_string(), json_text("config.json", cfg)?));
    }
    Ok(files)
}

/// JSON as Python's `json.dump(v, f, indent=2)` writes it.
fn json_text(name: &str, v: &impl serde::Serialize) -> Result<Vec<u8>> {
    json::text(v)
        .map_err(|e| Error::new(Rule::Io, Path::new(name), "cannot write JSON").caused_by(e))
}

fn total_bytes(shards: &[ShardFile<'_, '_>]) -> u64 {
    let tensors = shards.iter().flat_map(|f| &f.tensors);
    tensors.map(|t| t.byte_len() as u64).sum()
}

/// Tensor → shard file.
fn weight_map(shards: &[ShardFile<'_, '_>]) -> std::collections::BTreeMap<String, String> {
    let names = shards
        .iter()
        .flat_map(|f| f.tensors.iter().map(|t| (t.name.clone(), f.name.clone())));
    names.collect()
}

impl Summary {
    /// What writing `shards` of `plan` amounts to (`files` left empty).
    pub(crate) fn of(plan: &Plan<'_>, shards: &[ShardFile<'_, '_>]) -> Summary {
        let mut summary = Summary {
            dtype: plan.dtype,
            decoded: 0,
            copied: 0,
            cast: 0,
            converted: 0,
            dropped: plan.dropped.len(),
            modules: 0,
            tensor_bytes: total_bytes(shards),
            files: Vec::new(),
        };
        for t in shards.iter().flat_map(|f| &f.tensors) {
            match &t.source {
                s if s.is_decoded() => summary.decoded += 1,
                Source::Bytes(_) | Source::Rearrange(_) => summary.converted += 1,
                Source::Cast(..) => {
                    summary.copied += 1;
                    summary.cast += 1;
                }
                _ => summary.copied += 1,
            }
        }
        summary
    }
}

fn write_into(
    staging: Staging,
    only: Option<&[String]>,
    max_shard_size: Option<u64>,
    plan: &Plan<'_>,
    backend: &dyn Backend,
    cancelled: &AtomicBool,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<Summary> {
    let ckpt = plan.checkpoint;
    let shards = shard_files(plan, only, max_shard_size)?;
    let mut tally = Tally::of(&shards);
    let mut progress = |tensor: &str, bytes, done| progress(tally.step(tensor, bytes, done));
    // Each file is synced to disk on a thread of its own while the next is
    // decoded: syncing in turn would leave the decoder idle for every flush.
    std::thread::scope(|scope| -> Result<()> {
        let mut syncs = Vec::new();
        for file in &shards {
            let (path, mut w) = create(&staging, &file.name)?;
            w.write_all(&file.header)
                .map_err(|e| Error::io(&path, "cannot write", e))?;
            let w = write_shard(
                ckpt,
                &file.tensors,
                backend,
                cancelled,
                &path,
                w,
                &mut progress,
            )?;
            let f = flush(&path, w)?;
            syncs.push(
                scope.spawn(move || f.sync_all().map_err(|e| Error::io(&path, "cannot sync", e))),
            );
        }
        for s in syncs {
            s.join()
                .unwrap_or_else(|_| Err(Error::bare(Rule::Internal, "a sync thread panicked")))?;
        }
        Ok(())
    })?;
    let mut summary = Summary::of(plan, &shards);
    let mut json = json_files(plan, &shards)?;
    if let (Some(index), Some(only)) = (&ckpt.index, only) {
        // A --shards run writes its part of the index instead.
        json.retain(|(name, _)| name != INDEX_FILE);
        // Every output file: what merge_index waits for.
        let all = all_file_names(plan, max_shard_size);
        let part = parts::Part {
            metadata: parts::PartMetadata {
                total_size: summary.tensor_bytes,
                shards: shards.iter().map(|f| f.name.clone()).collect(),
                all_shards: all,
                source_index_sha256: parts::digest(&index.value),
                dtype: plan.dtype.to_string(),
            },
            weight_map: weight_map(&shards),
        };
        let name = format!("{}{PART_SUFFIX}", only[0].trim_end_matches(".safetensors"));
        let text = json_text(&name, &part)?;
        json.insert(0, (name, text));
    }
    for (name, text) in &json {
        write_file(&staging, name, text)?;
    }
    for (path, name) in &plan.side_files {
        staging.copy_in(path, name)?;
    }
    check(cancelled)?;
    // In a shared directory, these are this run's alone; the rest every part
    // writes alike.
    summary.files = staging.commit(|p| {
        let name = p.to_string_lossy();
        name.ends_with(".safetensors") || name.ends_with(PART_SUFFIX)
    })?;
    Ok(summary)
}

/// A size as Hugging Face writes `max_shard_size`: bytes, or a number with
/// a unit, decimal (`KB`, `MB`, `GB`, `TB`: powers of 1000) or binary
/// (`KiB` … `TiB`: powers of 1024), in any case (`5GB`, `500MB`, `1.5GiB`).
pub fn parse_size(s: &str) -> Result<u64> {
    let bad = || {
        Error::bare(
            Rule::Argument,
            format!("size {s:?}: expected bytes or a number with KB, MB, GB, TB, KiB, MiB, GiB or TiB, above 0"),
        )
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
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

/// Whether shard `file` is written when only the shards `only` are.
fn wanted(only: Option<&[String]>, file: &str) -> bool {
    only.is_none_or(|o| o.iter().any(|f| f == file))
}

/// Streams `tensors` into `w`: this thread decodes, a second one writes.
/// Inputs leave resident memory once used, so memory stays bounded by a few
/// chunks, not by the checkpoint.
fn write_shard(
    ckpt: &Checkpoint,
    tensors: &[&Output<'_>],
    backend: &dyn Backend,
    cancelled: &AtomicBool,
    path: &Path,
    mut w: BufWriter<File>,
    progress: &mut impl FnMut(&str, u64, bool),
) -> Result<BufWriter<File>> {
    std::thread::scope(|scope| {
        // Two chunks queued at most: one being written, one waiting.
        let (tx, rx) = sync_channel::<Piece<'_>>(1);
        let (spare_tx, spare) = channel::<Vec<u8>>();
        let writer = scope.spawn(move || -> std::io::Result<BufWriter<File>> {
            for piece in rx {
                match piece {
                    Piece::Owned(buf) => {
                        w.write_all(&buf)?;
                        let _ = spare_tx.send(buf);
                    }
                    Piece::Stored(bytes) => {
                        w.write_all(bytes)?;
                        ckpt.release(bytes);
                    }
                }
            }
            Ok(w)
        });
        let items = Item::all(tensors);
        let sent = send_pieces(ckpt, &items, backend, cancelled, &tx, &spare, progress);
        drop(tx);
        let written = writer.join();
        // A decode error comes first; a writing error explains a closed channel.
        sent?;
        written
            .map_err(|_| Error::new(Rule::Internal, path, "the writing thread panicked"))?
            .map_err(|e| Error::io(path, "cannot write", e))
    })
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
        ] {
            assert_eq!(parse_size(s).ok(), Some(want), "{s}");
        }
        for bad in ["", "0", "5XB", "-1GB", "GB", "1e3"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}

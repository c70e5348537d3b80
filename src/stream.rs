//! Dequantizing a checkpoint read piece by piece, without a filesystem,
//! threads or blocking: what a browser runs on the `File`s a user picked.
//!
//! Headers and sidecars are read first. Planning then notes every tensor
//! whose values it reads (global scales, `g_idx`, SVDQuant factors); those
//! are loaded and the plan is made again until it reads nothing new. The
//! dense files are then produced in order, a batch of tensors at a time:
//! the batch's stored inputs are loaded, planned with, decoded in bounded
//! runs of rows, and dropped. Copied tensors are never loaded at all: their
//! output is a range of an input file.

use std::collections::BTreeSet;
use std::future::Future;
use std::ops::Range;

use crate::backend::execute::Decoder;
use crate::backend::Cpu;
use crate::checkpoint::{Checkpoint, Listing, Wanted};
use crate::error::{Error, Result, Rule};
use crate::plan::{DtypeChoice, Plan, Source};
use crate::report::Report;
use crate::writer::{self, Summary};

/// The checkpoint's files, read on demand.
pub trait Files {
    /// Every file: name (relative to the checkpoint folder) and size.
    fn list(&self) -> Vec<(String, u64)>;

    /// Bytes `range` of file `name`.
    fn read(&self, name: &str, range: Range<u64>) -> impl Future<Output = Result<Vec<u8>>>;
}

/// A piece of a dense output file, in file order.
#[derive(Debug, PartialEq, Eq)]
pub enum Part {
    /// Bytes made here (a header, decoded rows, a JSON file).
    Bytes(Vec<u8>),
    /// A range of an input file, copied as it is.
    Stored {
        /// The input file.
        file: String,
        /// Which bytes of it.
        range: Range<u64>,
    },
    /// A whole input file (tokenizer, generation config, …).
    File(String),
}

/// Stored input bytes a batch loads at most (one tensor's alone may be more).
pub const BATCH_BYTES: usize = 256 << 20;

/// Opens the checkpoint in `files`: every header and sidecar is read, no
/// tensor yet.
pub async fn open(files: &impl Files) -> Result<Checkpoint> {
    let mut listing = Listing::default();
    for (name, len) in files.list() {
        let head = match Listing::wants(&name, len) {
            Wanted::Nothing => Vec::new(),
            Wanted::Whole => files.read(&name, 0..len).await?,
            Wanted::Header => {
                let first = files.read(&name, 0..len.min(8)).await?;
                files
                    .read(&name, 0..Listing::header_len(&first, len))
                    .await?
            }
        };
        listing.add(name, len, head);
    }
    Checkpoint::from_listing(listing)
}

/// Loads every tensor that planning in `dtype` reads, planning again until
/// it reads nothing new; returns their names.
pub async fn prepare(
    ckpt: &mut Checkpoint,
    files: &impl Files,
    dtype: DtypeChoice,
) -> Result<BTreeSet<String>> {
    let mut read = BTreeSet::new();
    loop {
        let planned = Plan::build(ckpt, dtype).map(|_| ());
        let misses = ckpt.take_misses();
        if misses.is_empty() {
            return planned.map(|_| read);
        }
        for name in misses {
            load(ckpt, files, &name).await?;
            read.insert(name);
        }
    }
}

async fn load(ckpt: &mut Checkpoint, files: &impl Files, name: &str) -> Result<()> {
    let (file, range) = ckpt
        .location(name)
        .map(|(f, r)| (f.to_string(), r))
        .ok_or_else(|| Error::bare(Rule::Io, format!("{name}: no such tensor")))?;
    let bytes = files.read(&file, range).await?;
    ckpt.load(name, bytes)
}

/// What `inspect --json` reports of the checkpoint in `files`.
pub async fn inspect(ckpt: &mut Checkpoint, files: &impl Files) -> Result<Report> {
    // A fault of the whole checkpoint is for the report to show, as the CLI does.
    let _ = prepare(ckpt, files, DtypeChoice::Auto).await;
    Ok(Report::new(&Plan::build(ckpt, DtypeChoice::Auto)?))
}

/// Where decoding runs.
#[derive(Clone, Copy)]
pub struct Run<'b> {
    /// The decoder to start with.
    pub decoder: Decoder<'b>,
    /// Whether a GPU failure hands over to the CPU, which gives the same
    /// bytes (what `--backend auto` does).
    pub fall_back: bool,
}

/// One tensor of the dense output, as the schedule keeps it.
struct Tensor {
    name: String,
    /// The input range it is copied from, for a copy.
    copy: Option<(String, Range<u64>)>,
    /// The stored tensors it is made from, and their sizes.
    inputs: Vec<(String, usize)>,
    bytes: u64,
}

/// One dense file, in the order the CLI's writer makes them.
enum OutFile {
    /// A safetensors shard: its header, then its tensors.
    Shard(String, Vec<u8>, Vec<Tensor>),
    /// A file made whole (the index, `config.json`).
    Bytes(String, Vec<u8>),
    /// An input file copied as it is (tokenizer, …).
    Copy(String),
}

/// The dense checkpoint of `ckpt` (opened by [`open`]), the same files the
/// CLI writes: `emit` receives each file's parts in order, file after file,
/// `progress` the tensor bytes done and in all with the tensor just made,
/// and `note` a GPU failure
/// the CPU took over from. A batch of tensors holds about `batch_bytes` of
/// stored inputs in memory ([`BATCH_BYTES`]), besides what planning reads.
#[allow(clippy::too_many_arguments)]
pub async fn dequantize(
    ckpt: &mut Checkpoint,
    files: &impl Files,
    dtype: DtypeChoice,
    run: Run<'_>,
    batch_bytes: usize,
    mut emit: impl FnMut(&str, Part),
    mut progress: impl FnMut(u64, u64, &str),
    mut note: impl FnMut(&Error),
) -> Result<Summary> {
    let keep = prepare(ckpt, files, dtype).await?;
    let (schedule, mut summary) = schedule(ckpt, dtype)?;
    let total = summary.tensor_bytes;
    let mut done = 0u64;
    let cpu = Cpu::new();
    let mut decoder = run.decoder;
    for file in schedule {
        let (name, header, tensors) = match file {
            OutFile::Shard(name, header, tensors) => (name, header, tensors),
            OutFile::Bytes(name, bytes) => {
                emit(&name, Part::Bytes(bytes));
                summary.files.push(name.into());
                continue;
            }
            OutFile::Copy(name) => {
                emit(&name, Part::File(name.clone()));
                summary.files.push(name.into());
                continue;
            }
        };
        emit(&name, Part::Bytes(header));
        for batch in batches(&tensors, batch_bytes) {
            let inputs: BTreeSet<&String> = batch
                .iter()
                .filter(|t| t.copy.is_none())
                .flat_map(|t| t.inputs.iter().map(|(name, _)| name))
                .filter(|name| !keep.contains(*name))
                .collect();
            for name in inputs {
                load(ckpt, files, name).await?;
            }
            let plan = Plan::build(ckpt, dtype)?;
            for t in batch {
                if let Some((file, range)) = &t.copy {
                    let (file, range) = (file.clone(), range.clone());
                    emit(&name, Part::Stored { file, range });
                } else {
                    let o = plan
                        .outputs
                        .binary_search_by(|o| o.name.as_str().cmp(&t.name))
                        .map(|i| &plan.outputs[i])
                        .map_err(|_| {
                            Error::bare(Rule::Io, format!("{}: not planned again", t.name))
                        })?;
                    // Runs of rows, or the whole tensor at once (`None`).
                    let pieces: Vec<Option<Range<usize>>> = match writer::row_pieces(o) {
                        Some(runs) => runs.into_iter().map(Some).collect(),
                        None => vec![None],
                    };
                    for rows in pieces {
                        let made = loop {
                            match make(o, decoder, rows.clone()).await {
                                Err(e) if e.rule == Rule::Gpu && run.fall_back => {
                                    if matches!(decoder, Decoder::Gpu(_)) {
                                        note(&e);
                                    }
                                    decoder = Decoder::Blocking(&cpu);
                                }
                                other => break other?,
                            }
                        };
                        emit(&name, Part::Bytes(made));
                    }
                }
                done += t.bytes;
                progress(done, total, &t.name);
            }
            drop(plan);
            ckpt.unload(|n| keep.contains(n));
        }
        summary.files.push(name.into());
    }
    Ok(summary)
}

/// Rows `rows` of `o`, or all of it made whole when `None`.
async fn make(
    o: &crate::plan::Output<'_>,
    decoder: Decoder<'_>,
    rows: Option<Range<usize>>,
) -> Result<Vec<u8>> {
    match rows {
        Some(rows) => {
            let row_bytes = o.row_layout().map_or(0, |(_, b)| b);
            let mut buf = vec![0u8; rows.len() * row_bytes];
            o.decode_rows_with(decoder, rows, &mut buf).await?;
            Ok(buf)
        }
        None => Ok(o.bytes_with(decoder).await?.into_owned()),
    }
}

/// The dense files of `ckpt`, in order, and what writing them amounts to.
fn schedule(ckpt: &Checkpoint, dtype: DtypeChoice) -> Result<(Vec<OutFile>, Summary)> {
    let plan = Plan::build(ckpt, dtype)?;
    plan.check()?;
    let shards = writer::shard_files(&plan, None, None)?;
    let summary = Summary::of(&plan, &shards);
    let mut files = Vec::new();
    for f in &shards {
        let tensors = f.tensors.iter().map(|o| Tensor {
            name: o.name.clone(),
            copy: match &o.source {
                Source::Copy(t) => ckpt.location(t.name).map(|(f, r)| (f.to_string(), r)),
                _ => None,
            },
            inputs: o
                .inputs()
                .iter()
                .map(|t| (t.name.to_string(), t.len()))
                .collect(),
            bytes: o.byte_len() as u64,
        });
        files.push(OutFile::Shard(
            f.name.clone(),
            f.header.clone(),
            tensors.collect(),
        ));
    }
    for (name, text) in writer::json_files(&plan, &shards)? {
        files.push(OutFile::Bytes(name, text));
    }
    for (_, name) in &plan.side_files {
        files.push(OutFile::Copy(name.clone()));
    }
    Ok((files, summary))
}

/// Runs of consecutive tensors whose stored inputs (copies aside) take at
/// most `budget` bytes; a run holds one tensor at least.
fn batches(tensors: &[Tensor], budget: usize) -> Vec<&[Tensor]> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (i, t) in tensors.iter().enumerate() {
        let size: usize = match t.copy {
            Some(_) => 0,
            None => t.inputs.iter().map(|(_, n)| n).sum(),
        };
        if i > start && bytes + size > budget {
            runs.push(&tensors[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < tensors.len() {
        runs.push(&tensors[start..]);
    }
    runs
}

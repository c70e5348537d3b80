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

use crate::backend::{select_async, Backend};
use crate::checkpoint::{Checkpoint, Listing, Wanted};
use crate::error::{Error, Result, Rule};
use crate::plan::{DtypeChoice, Plan, Source};
use crate::report::Report;
use crate::run::Dequantize;
use crate::writer::{self, Summary, Tally};

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
pub(crate) const BATCH_BYTES: usize = 256 << 20;

/// Opens the checkpoint in `files`: every header and sidecar is read, no
/// tensor yet.
async fn open(files: &impl Files) -> Result<Checkpoint> {
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

/// Loads every stored tensor whose values planning (as `run` plans) reads,
/// planning again until it needs nothing new; returns their names.
async fn prepare(
    ckpt: &mut Checkpoint,
    files: &impl Files,
    run: &Dequantize<'_>,
) -> Result<BTreeSet<String>> {
    let mut read = BTreeSet::new();
    loop {
        let needs = run.planned(ckpt)?.needs;
        if needs.is_empty() {
            return Ok(read);
        }
        for name in needs {
            load(ckpt, files, &name).await?;
            read.insert(name);
        }
    }
}

async fn load(ckpt: &mut Checkpoint, files: &impl Files, name: &str) -> Result<()> {
    let (file, range) = ckpt
        .location(name)
        .map(|(f, r)| (f.to_string(), r))
        .ok_or_else(|| Error::bare(Rule::Internal, format!("{name}: no such tensor")))?;
    let bytes = files.read(&file, range).await?;
    ckpt.load(name, bytes)
}

/// What `inspect --json` reports of the checkpoint in `files`.
pub async fn inspect(files: &impl Files) -> Result<Report> {
    let mut ckpt = open(files).await?;
    let run = Dequantize::new();
    // A fault of the whole checkpoint is for the report to show, as the CLI does.
    let _ = prepare(&mut ckpt, files, &run).await;
    Ok(Report::new(&Plan::build(&ckpt, DtypeChoice::Auto)?))
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

impl Dequantize<'_> {
    /// The dense checkpoint of the checkpoint in `files`: the files
    /// [`Dequantize::run`] writes, handed to `emit` as parts in file order,
    /// file after file. Nothing blocks: this is what a browser runs.
    /// `force` and `shards` concern a directory and do not apply. A batch
    /// of tensors holds about 256 MiB of stored inputs in memory, besides
    /// what planning reads.
    pub async fn stream(
        mut self,
        files: &impl Files,
        mut emit: impl FnMut(&str, Part),
    ) -> Result<Summary> {
        let mut ckpt = open(files).await?;
        let keep = prepare(&mut ckpt, files, &self).await?;
        let (backend, schedule, mut summary, mut tally) = {
            let plan = self.plan(&ckpt)?;
            let (backend, note) = select_async(self.options.backend).await?;
            self.start(&plan, backend.as_ref(), note);
            let (schedule, summary, tally) = schedule(&plan, self.max_shard_size)?;
            (backend, schedule, summary, tally)
        };
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
            for batch in batches(&tensors, self.batch_bytes.unwrap_or(BATCH_BYTES)) {
                let inputs: BTreeSet<&String> = batch
                    .iter()
                    .filter(|t| t.copy.is_none())
                    .flat_map(|t| t.inputs.iter().map(|(name, _)| name))
                    .filter(|name| !keep.contains(*name))
                    .collect();
                for name in inputs {
                    load(&mut ckpt, files, name).await?;
                }
                let plan = self.planned(&ckpt)?;
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
                                Error::bare(
                                    Rule::Internal,
                                    format!("{}: not planned again", t.name),
                                )
                            })?;
                        // Runs of rows, or the whole tensor at once (`None`).
                        let pieces: Vec<Option<Range<usize>>> = match writer::row_pieces(o) {
                            Some(runs) => runs.into_iter().map(Some).collect(),
                            None => vec![None],
                        };
                        for rows in pieces {
                            let made = make(o, backend.as_ref(), rows).await?;
                            Dequantize::fallback(self.note.as_mut(), backend.as_ref());
                            emit(&name, Part::Bytes(made));
                        }
                    }
                    (self.progress)(&tally.step(&t.name, t.bytes, true));
                }
                drop(plan);
                ckpt.unload(|n| keep.contains(n));
            }
            summary.files.push(name.into());
        }
        Ok(summary)
    }
}

/// Rows `rows` of `o`, or all of it made whole when `None`.
async fn make(
    o: &crate::plan::Output<'_>,
    backend: &dyn Backend,
    rows: Option<Range<usize>>,
) -> Result<Vec<u8>> {
    match rows {
        Some(rows) => {
            let row_bytes = o.row_layout().map_or(0, |(_, b)| b);
            let mut buf = vec![0u8; rows.len() * row_bytes];
            o.decode_rows_async(backend, rows, &mut buf).await?;
            Ok(buf)
        }
        None => Ok(o.bytes_async(backend).await?.into_owned()),
    }
}

/// The dense files of `plan`, in order, what writing them amounts to, and
/// the tally of their tensors.
fn schedule(
    plan: &Plan<'_>,
    max_shard_size: Option<u64>,
) -> Result<(Vec<OutFile>, Summary, Tally)> {
    let ckpt = plan.checkpoint;
    let shards = writer::shard_files(plan, None, max_shard_size)?;
    let summary = Summary::of(plan, &shards);
    let tally = Tally::of(&shards);
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
    for (name, text) in writer::json_files(plan, &shards)? {
        files.push(OutFile::Bytes(name, text));
    }
    for (_, name) in &plan.side_files {
        files.push(OutFile::Copy(name.clone()));
    }
    Ok((files, summary, tally))
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

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

use crate::backend::Backend;
use crate::checkpoint::{Checkpoint, Listing, Wanted};
use crate::error::{Error, Result, Rule};
use crate::hf::Names;
use crate::numerics::DtypeChoice;
use crate::plan::{Plan, Source};
use crate::report::Report;
use crate::report::Validation;
use crate::writer::{self, Summary, Tally};

/// The checkpoint's files, read on demand.
pub trait Files {
    /// Every file: name (relative to the checkpoint folder) and size.
    fn list(&self) -> Vec<(String, u64)>;

    /// Bytes `range` of file `name`.
    fn read(&self, name: &str, range: Range<u64>) -> impl Future<Output = Result<Vec<u8>>>;

    /// What reports call the checkpoint (a Hub repository's pinned id),
    /// when not `.`.
    fn name(&self) -> Option<String> {
        None
    }

    /// Planning is over, and `out_bytes` of dense files follow: the reads
    /// after this are the batches' inputs, file after file. Files fetched
    /// from afar may start coming whole, or the run be refused (no room).
    /// Returns lines worth telling (a free space that cannot be read).
    fn planned(&self, out_bytes: u64) -> Result<Vec<String>> {
        let _ = out_bytes;
        Ok(Vec::new())
    }

    /// Files `names` will not be read: the output files made from them
    /// were finished by an earlier run (`--resume`), or are another
    /// `--shards` job's.
    fn skip(&self, names: &std::collections::BTreeSet<String>) {
        let _ = names;
    }

    /// How far downloads of whole files are, for files fetched from afar.
    fn downloads(&self) -> Option<writer::Download> {
        None
    }
}

/// Files lent: the owner keeps them (and what they count) after a
/// [`Linears`](crate::Linears) over them is gone.
impl<F: Files> Files for &F {
    fn list(&self) -> Vec<(String, u64)> {
        (**self).list()
    }

    fn read(&self, name: &str, range: Range<u64>) -> impl Future<Output = Result<Vec<u8>>> {
        (**self).read(name, range)
    }

    fn name(&self) -> Option<String> {
        (**self).name()
    }

    fn planned(&self, out_bytes: u64) -> Result<Vec<String>> {
        (**self).planned(out_bytes)
    }

    fn skip(&self, names: &BTreeSet<String>) {
        (**self).skip(names)
    }

    fn downloads(&self) -> Option<writer::Download> {
        (**self).downloads()
    }
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
pub(crate) async fn open(files: &impl Files) -> Result<Checkpoint> {
    let mut ckpt = Checkpoint::from_listing(listing(files).await?)?;
    ckpt.name = files.name();
    Ok(ckpt)
}

/// Every file of `files`, with the headers and sidecars read.
pub(crate) async fn listing(files: &impl Files) -> Result<Listing> {
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
            Wanted::GgufHeader => {
                let mut head = Vec::new();
                while let Some(upto) = Listing::gguf_prefix(&name, len, &head)? {
                    let more = files.read(&name, head.len() as u64..upto).await?;
                    head.extend_from_slice(&more);
                }
                head
            }
        };
        listing.add(name, len, head);
    }
    Ok(listing)
}

/// Loads every stored tensor whose values planning (as `run` plans) reads,
/// planning again until it needs nothing new; returns their names.
pub(crate) async fn prepare(
    ckpt: &mut Checkpoint,
    files: &impl Files,
    needs: impl Fn(&Checkpoint) -> Result<Vec<String>>,
) -> Result<BTreeSet<String>> {
    let mut read = BTreeSet::new();
    loop {
        let needs = needs(ckpt)?;
        if needs.is_empty() {
            return Ok(read);
        }
        for name in needs {
            load(ckpt, files, &name).await?;
            read.insert(name);
        }
    }
}

pub(crate) async fn load(ckpt: &mut Checkpoint, files: &impl Files, name: &str) -> Result<()> {
    let (file, range) = ckpt
        .location(name)
        .map(|(f, r)| (f.to_string(), r))
        .ok_or_else(|| Error::bare(Rule::Internal, format!("{name}: no such tensor")))?;
    let bytes = files.read(&file, range).await?;
    ckpt.load(name, bytes)
}

/// What planning as `inspect` and `validate` plan reads.
fn auto_needs(ckpt: &Checkpoint) -> Result<Vec<String>> {
    Ok(Plan::build(ckpt, DtypeChoice::Auto, Names::Hub)?.needs)
}

/// What `inspect --json` reports of the checkpoint in `files`.
pub async fn inspect(files: &impl Files) -> Result<Report> {
    let mut ckpt = open(files).await?;
    // A fault of the whole checkpoint is for the report to show, as the CLI does.
    let _ = prepare(&mut ckpt, files, auto_needs).await;
    let mut report = Report::new(&Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub)?);
    if let Some(name) = files.name() {
        report.path = name;
    }
    Ok(report)
}

/// What `validate` finds in the checkpoint in `files`; a checkpoint that
/// cannot be read at all is one finding.
pub async fn validate(files: &impl Files) -> Validation {
    let found = async {
        let mut ckpt = open(files).await?;
        prepare(&mut ckpt, files, auto_needs).await?;
        Ok::<_, Error>(Validation::of(Plan::build(
            &ckpt,
            DtypeChoice::Auto,
            Names::Hub,
        )?))
    };
    found.await.unwrap_or_else(|e| Validation::from(&e))
}

/// One tensor of the dense output, as the schedule keeps it.
pub(crate) struct Tensor {
    pub(crate) name: String,
    /// The input range it is copied from, for a copy.
    pub(crate) copy: Option<(String, Range<u64>)>,
    /// The stored tensors it is made from, and their sizes.
    pub(crate) inputs: Vec<(String, usize)>,
    pub(crate) bytes: u64,
}

/// One dense file, in the order the CLI's writer makes them.
pub(crate) enum OutFile {
    /// A safetensors shard: its header, then its tensors.
    Shard(String, Vec<u8>, Vec<Tensor>),
    /// A file made whole (the index, `config.json`).
    Bytes(String, Vec<u8>),
    /// An input file copied as it is (tokenizer, …).
    Copy(String),
}

/// Rows `rows` of `o`, or all of it made whole when `None`.
pub(crate) async fn make(
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

/// The dense files of `plan` (of input shards `only`, when given: a
/// `--shards` run's, its part of the index instead of the index), in
/// order, what writing them amounts to, and the tally of their tensors.
pub(crate) fn schedule(
    plan: &Plan<'_>,
    only: Option<&[String]>,
    max_shard_size: Option<u64>,
) -> Result<(Vec<OutFile>, Summary, Tally)> {
    let ckpt = plan.checkpoint;
    writer::check_shards(plan, only)?;
    let shards = writer::shard_files(plan, only, max_shard_size)?;
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
    for (name, text) in writer::run_json_files(plan, &shards, only, max_shard_size)? {
        files.push(OutFile::Bytes(name, text));
    }
    for (_, name) in &plan.side_files {
        files.push(OutFile::Copy(name.clone()));
    }
    Ok((files, summary, tally))
}

/// Runs of consecutive tensors whose stored inputs (copies aside) take at
/// most `budget` bytes; a run holds one tensor at least.
pub(crate) fn batches(tensors: &[Tensor], budget: usize) -> Vec<&[Tensor]> {
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

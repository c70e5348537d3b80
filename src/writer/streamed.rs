//! The streamed writer: a run's files handed over part by part, in the
//! order of its [`Schedule`], with no filesystem, threads or blocking (what
//! a browser runs, and a Hub run as it downloads). Each safetensors file's
//! tensors are made a batch at a time: the batch's stored inputs are
//! loaded, planned with, decoded in bounded runs of rows, and dropped.
//! Copied tensors are never loaded at all: their part is a range of an
//! input file.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use super::{row_pieces, Download, Journal, Progress, Schedule, Summary, Tally};
use crate::backend::Backend;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result, Rule};
use crate::plan::{Output, Plan, Source};

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
const BATCH_BYTES: usize = 256 << 20;

/// What the streamed writer reads through: a checkpoint whose stored
/// tensors are loaded when a batch needs them, planned again over what is
/// loaded, and the files it is read from.
pub(crate) trait Inputs {
    /// The checkpoint, with what is loaded of it.
    fn checkpoint(&self) -> &Checkpoint;

    /// The plan over what is loaded, as the run plans.
    fn plan(&self) -> Result<Plan<'_>>;

    /// Loads stored tensor `name` (nothing when it stays loaded all along).
    async fn load(&mut self, name: &str) -> Result<()>;

    /// Drops what the last batch loaded.
    fn unload(&mut self);

    /// Every input file's size, by name.
    fn sizes(&self) -> BTreeMap<String, u64>;

    /// Input files `names` will not be read.
    fn skip(&self, names: &BTreeSet<String>);

    /// Planning is over and `out_bytes` follow; returns lines worth telling.
    fn planned(&self, out_bytes: u64) -> Result<Vec<String>>;

    /// How far downloads of whole files are, for files fetched from afar.
    fn downloads(&self) -> Option<Download>;
}

/// Whom the streamed writer tells what it makes.
pub(crate) struct Hooks<'h> {
    /// Takes each part of each file, in order.
    pub(crate) emit: &'h mut dyn FnMut(&str, Part),
    /// Hears of every tensor written.
    pub(crate) progress: &'h mut dyn FnMut(&Progress<'_>),
    /// Told what is worth a line.
    pub(crate) note: &'h mut dyn FnMut(crate::Note<'_>),
    /// Called after each piece the backend made.
    pub(crate) made: &'h mut dyn FnMut(),
}

/// One tensor of the dense output, as the streamed writer keeps it: the
/// plan it came from is made again batch by batch.
pub(crate) struct Tensor {
    name: String,
    /// The input range it is copied from, for a copy.
    copy: Option<(String, Range<u64>)>,
    /// The stored tensors it is made from, and their sizes.
    inputs: Vec<(String, usize)>,
    bytes: u64,
}

impl Tensor {
    fn of(ckpt: &Checkpoint, o: &Output<'_>) -> Tensor {
        Tensor {
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
        }
    }
}

/// A streamed run's files, planned and ready to be written.
pub(crate) struct Streamed {
    schedule: Schedule<Tensor>,
    tally: Tally,
    /// The input shards written (`--shards`), when not all.
    only: Option<Vec<String>>,
    /// Stored input bytes a batch loads at most.
    budget: usize,
}

impl Streamed {
    /// The files of `plan` ([`Schedule::of`]), stored input bytes
    /// `batch_bytes` a batch (256 MiB when not given).
    pub(crate) fn new(
        plan: &Plan<'_>,
        only: Option<&[String]>,
        max_shard_size: Option<u64>,
        batch_bytes: Option<usize>,
    ) -> Result<Streamed> {
        let schedule = Schedule::of(plan, only, max_shard_size)?;
        let tally = schedule.tally();
        Ok(Streamed {
            schedule: schedule.map(|o| Tensor::of(plan.checkpoint, o)),
            tally,
            only: only.map(<[String]>::to_vec),
            budget: batch_bytes.unwrap_or(BATCH_BYTES),
        })
    }

    /// Writes every file through `hooks`, reading `inputs` and decoding on
    /// `backend`: the safetensors files `journal` records as finished by
    /// an earlier run are skipped (their inputs not read), told as done.
    pub(crate) async fn write(
        self,
        inputs: &mut impl Inputs,
        backend: &dyn Backend,
        journal: Option<&Journal>,
        hooks: Hooks<'_>,
    ) -> Result<Summary> {
        let Hooks {
            emit,
            progress,
            note,
            made,
        } = hooks;
        let done = self.schedule.done(journal)?;
        if let Some(journal) = journal {
            journal.tell_resumed(&done, note);
        }
        self.skip_unread(inputs, &done);
        let sizes = inputs.sizes();
        let to_write = self
            .schedule
            .bytes(&done, |_, name| sizes.get(name).copied().unwrap_or(0));
        for line in inputs.planned(to_write)? {
            note(crate::Note::Text(&line));
        }
        let Schedule {
            shards,
            json,
            copies,
            mut summary,
        } = self.schedule;
        let (mut tally, budget) = (self.tally, self.budget);
        let mut tell = |t: &Tensor, download: Option<Download>| {
            let p = tally.step(&t.name, t.bytes, true);
            progress(&Progress { download, ..p });
        };
        for (file, done) in shards.into_iter().zip(done) {
            let name = file.name;
            if done {
                for t in &file.tensors {
                    tell(t, inputs.downloads());
                }
                summary.files.push(name.into());
                continue;
            }
            emit(&name, Part::Bytes(file.header));
            for batch in batches(&file.tensors, budget) {
                let stored: BTreeSet<&String> = batch
                    .iter()
                    .filter(|t| t.copy.is_none())
                    .flat_map(|t| t.inputs.iter().map(|(name, _)| name))
                    .collect();
                for input in stored {
                    inputs.load(input).await?;
                }
                let plan = inputs.plan()?;
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
                        let pieces: Vec<Option<Range<usize>>> = match row_pieces(o) {
                            Some(runs) => runs.into_iter().map(Some).collect(),
                            None => vec![None],
                        };
                        for rows in pieces {
                            let bytes = make(o, backend, rows).await?;
                            made();
                            emit(&name, Part::Bytes(bytes));
                        }
                    }
                    tell(t, inputs.downloads());
                }
                drop(plan);
                inputs.unload();
            }
            summary.files.push(name.into());
        }
        for (name, bytes) in json {
            emit(&name, Part::Bytes(bytes));
            summary.files.push(name.into());
        }
        for (_, name) in copies {
            emit(&name, Part::File(name.clone()));
            summary.files.push(name.into());
        }
        Ok(summary)
    }

    /// Tells `inputs` which input shards are not read: those whose output
    /// files are `done`, and other shards than a `--shards` run's, which
    /// are read only where they hold a companion (by range).
    fn skip_unread(&self, inputs: &impl Inputs, done: &[bool]) {
        let ckpt = inputs.checkpoint();
        let mut needed = BTreeSet::new();
        let shards = self.schedule.shards.iter().zip(done);
        for (file, _) in shards.filter(|(_, done)| !**done) {
            for t in &file.tensors {
                let copies = t.copy.iter().map(|(f, _)| f.as_str());
                let inputs = t
                    .inputs
                    .iter()
                    .filter_map(|(input, _)| ckpt.location(input).map(|(f, _)| f));
                needed.extend(copies.chain(inputs).map(str::to_string));
            }
        }
        if let Some(only) = &self.only {
            needed.retain(|f| only.contains(f));
        }
        let shards = ckpt.shards.iter().map(|s| &s.file_name);
        inputs.skip(&shards.filter(|f| !needed.contains(*f)).cloned().collect());
    }
}

/// Rows `rows` of `o`, or all of it made whole when `None`.
async fn make(
    o: &Output<'_>,
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

#[cfg(test)]
mod tests {
    use super::{batches, Tensor};

    /// A tensor made from stored inputs of `sizes` bytes, or a copy.
    fn tensor(sizes: &[usize], copy: bool) -> Tensor {
        Tensor {
            name: String::new(),
            copy: copy.then(|| (String::new(), 0..1)),
            inputs: sizes.iter().map(|&n| (String::new(), n)).collect(),
            bytes: 0,
        }
    }

    #[test]
    fn batches_stay_in_budget_unless_one_tensor_alone_is_over() {
        let tensors = [
            tensor(&[4, 4], false),
            tensor(&[2], false),
            tensor(&[100], true),
            tensor(&[20], false),
            tensor(&[1], false),
        ];
        let lens: Vec<usize> = batches(&tensors, 10).iter().map(|b| b.len()).collect();
        // Copies load nothing; a tensor over the budget is a batch alone.
        assert_eq!(lens, [3, 1, 1]);
        assert!(batches(&[], 10).is_empty());
    }
}

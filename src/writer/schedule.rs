//! What a run writes, file by file, in the one order both writers keep:
//! the safetensors files (each a header, then its tensors), the JSON files
//! beside them, then the input's files copied as they are. The local
//! writer walks it with the plan at hand; the streamed one keeps what it
//! needs of each tensor, since it plans again batch by batch.

use std::path::{Path, PathBuf};

use super::layout::{shard_files, ShardFile};
use super::{check_shards, run_json_files, Journal, Summary, Tally};
use crate::error::Result;
use crate::plan::{Output, Plan};

/// The dense output of a plan, in the order it is written; `T` is what a
/// shard file holds of each tensor.
pub(crate) struct Schedule<T> {
    /// The safetensors files, in order.
    pub(crate) shards: Vec<ShardFile<T>>,
    /// The JSON files beside them: (file name, text).
    pub(crate) json: Vec<(String, Vec<u8>)>,
    /// The input's files copied as they are: (path, file name).
    pub(crate) copies: Vec<(PathBuf, String)>,
    /// What writing it all amounts to (`files` left empty).
    pub(crate) summary: Summary,
}

impl<'p, 'a> Schedule<&'p Output<'a>> {
    /// The files of `plan` (of input shards `only`, when given: a
    /// `--shards` run's, its part of the index instead of the index), the
    /// safetensors ones split at `max_shard_size`. Refuses `only` names
    /// that are not the checkpoint's shards.
    pub(crate) fn of(
        plan: &'p Plan<'a>,
        only: Option<&[String]>,
        max_shard_size: Option<u64>,
    ) -> Result<Self> {
        check_shards(plan, only)?;
        let shards = shard_files(plan, only, max_shard_size)?;
        let json = run_json_files(plan, &shards, only, max_shard_size)?;
        Ok(Schedule {
            summary: Summary::of(plan, &shards),
            json,
            copies: plan.side_files.clone(),
            shards,
        })
    }
}

impl<T> Schedule<T> {
    /// The same schedule, each tensor made into what `f` makes of it.
    pub(crate) fn map<U>(self, mut f: impl FnMut(T) -> U) -> Schedule<U> {
        Schedule {
            shards: self.shards.into_iter().map(|s| s.map(&mut f)).collect(),
            json: self.json,
            copies: self.copies,
            summary: self.summary,
        }
    }

    /// Nothing written yet of its tensors.
    pub(crate) fn tally(&self) -> Tally {
        Tally::of(&self.shards)
    }

    /// Which safetensors files an earlier run finished, by `journal`'s
    /// record (none without one).
    pub(crate) fn done(&self, journal: Option<&Journal>) -> Result<Vec<bool>> {
        let done = |f: &ShardFile<T>| journal.map_or(Ok(false), |j| j.done(&f.name));
        self.shards.iter().map(done).collect()
    }

    /// Every byte written of it, the safetensors files `done` aside; a
    /// copied file's size is `copy_len`'s.
    pub(crate) fn bytes(&self, done: &[bool], copy_len: impl Fn(&Path, &str) -> u64) -> u64 {
        let shards = self.shards.iter().zip(done).filter(|(_, done)| !**done);
        let shards: u64 = shards.map(|(f, _)| f.header.len() as u64 + f.bytes).sum();
        let json = self.json.iter().map(|(_, text)| text.len() as u64);
        let copies = self.copies.iter().map(|(path, name)| copy_len(path, name));
        shards + json.chain(copies).sum::<u64>()
    }
}

//! The shards of a Hub checkpoint downloaded while the decoder reads
//! them ([`Fetcher`]), one ahead, and removed behind it with
//! `--delete-downloaded`.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::Remote;
use crate::error::{Error, Result, Rule};
use crate::writer::{self, Download, Fetched};

/// A Hub checkpoint read while its shards download, one ahead of the
/// decoder. Planning reads headers by range requests; once it is over
/// ([`Files::planned`](crate::stream::Files::planned)), a shard that a
/// batch reads is waited for whole and read from the cache, and (`delete`)
/// a shard this run downloaded is removed once the decoder has moved past
/// it. A later read of a removed shard (a scale stored beside another
/// module) is a range request, so correctness never rests on the order.
pub(crate) struct Fetcher<'r> {
    remote: &'r Remote,
    /// The shards, in the order the batches read them.
    order: Vec<(String, u64)>,
    delete: bool,
    out: PathBuf,
    state: Mutex<Fetch>,
    wake: std::sync::Condvar,
}

#[derive(Default)]
struct Fetch {
    decoding: bool,
    /// The shard the batches read now (an index into `order`).
    at: usize,
    /// How each shard's fetch ended.
    done: Vec<Option<Result<bool>>>,
    /// Shards the run will not read (`Files::skip`).
    skipped: Vec<bool>,
    /// Bytes the run downloads in all, once planned.
    to_download: u64,
    /// Bytes of this run's downloads now in the cache.
    held: u64,
    fetched: Fetched,
    stop: bool,
}

impl<'r> Fetcher<'r> {
    /// Fetches `remote`'s shards (file-name order, as the output is written)
    /// for a run writing into `out`.
    pub(crate) fn new(remote: &'r Remote, out: &Path, delete: bool) -> Result<Fetcher<'r>> {
        let listed = |name: &str| {
            remote
                .files
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, s)| *s)
        };
        let order = remote
            .shards()?
            .into_iter()
            .map(|name| {
                let size = match listed(&name) {
                    Some(size) => size,
                    None => remote.meta(&name)?.size,
                };
                Ok((name, size))
            })
            .collect::<Result<Vec<_>>>()?;
        let state = Fetch {
            done: (0..order.len()).map(|_| None).collect(),
            skipped: vec![false; order.len()],
            ..Fetch::default()
        };
        Ok(Fetcher {
            remote,
            order,
            delete,
            out: out.to_path_buf(),
            state: Mutex::new(state),
            wake: std::sync::Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Fetch> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Downloads the shards in order, at most one ahead of the batches
    /// (skipped ones not counted, nor fetched); returns when all are
    /// fetched or [`Fetcher::stop`] is called.
    pub(crate) fn download(&self) {
        for (i, (name, size)) in self.order.iter().enumerate() {
            {
                // Nothing is downloaded before planning found the
                // checkpoint sound, then at most one shard ahead.
                let ahead = |s: &Fetch| (s.at + 1..i).any(|k| !s.skipped[k]);
                let mut s = self.lock();
                while !s.stop && (!s.decoding || ahead(&s)) {
                    s = self.wake.wait(s).unwrap_or_else(|p| p.into_inner());
                }
                if s.stop {
                    return;
                }
                if s.skipped[i] {
                    s.done[i] = Some(Ok(false));
                    self.wake.notify_all();
                    continue;
                }
            }
            let result = self.remote.fetched(name).map(|(_, new)| new);
            let mut s = self.lock();
            match &result {
                Ok(true) => {
                    s.fetched.downloaded.push(name.clone());
                    s.held += size;
                    s.fetched.peak_bytes = s.fetched.peak_bytes.max(s.held);
                }
                Ok(false) => s.fetched.reused.push(name.clone()),
                Err(e) => {
                    // The run fails when the batches reach this shard, not
                    // before: the shard they decode now is still finished
                    // (and journaled, for `--resume`). No later shard is
                    // fetched; each fails with this error.
                    for d in &mut s.done[i..] {
                        *d = Some(Err(e.clone()));
                    }
                    self.wake.notify_all();
                    return;
                }
            }
            s.done[i] = Some(result);
            self.wake.notify_all();
        }
    }

    /// Whether the run is over (or failed).
    pub(crate) fn stopped(&self) -> bool {
        self.lock().stop
    }

    /// Ends [`Fetcher::download`] (the run is over, or failed).
    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.remote
            .stopped
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.wake.notify_all();
    }

    /// Ends the run: with `delete`, this run's remaining downloads are
    /// removed too. Returns what was fetched.
    pub(crate) fn finish(&self) -> Result<Fetched> {
        self.stop();
        if self.delete {
            self.remove_before(self.order.len())?;
        }
        Ok(self.lock().fetched.clone())
    }

    /// Removes this run's downloads of the shards before `i`.
    fn remove_before(&self, i: usize) -> Result<()> {
        let mut s = self.lock();
        for (name, size) in &self.order[..i.min(self.order.len())] {
            if s.fetched.downloaded.contains(name) && !s.fetched.deleted.contains(name) {
                self.remote.remove(name)?;
                s.fetched.deleted.push(name.clone());
                s.held = s.held.saturating_sub(*size);
            }
        }
        Ok(())
    }

    /// Waits for shard `i` when the batches read it, moving on to it.
    fn reach(&self, i: usize) -> Result<()> {
        let mut s = self.lock();
        if s.stop {
            // A download failed (its error), or the run did (it says why).
            let failed = s
                .done
                .iter()
                .flatten()
                .find_map(|d| d.as_ref().err().cloned());
            return Err(failed.unwrap_or_else(|| Error::bare(Rule::Cancelled, "the run stopped")));
        }
        if !s.decoding || i < s.at {
            return Ok(());
        }
        let moved = i > s.at;
        s.at = i;
        self.wake.notify_all();
        while s.done[i].is_none() && !s.stop {
            s = self.wake.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if let Some(Err(e)) = &s.done[i] {
            return Err(e.clone());
        }
        drop(s);
        if moved && self.delete {
            self.remove_before(i)?;
        }
        Ok(())
    }

    /// Bytes `range` of file `name`, once the batches may read it.
    pub(crate) fn read_now(&self, name: &str, range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        if let Some(i) = self.order.iter().position(|(n, _)| n == name) {
            self.reach(i)?;
        }
        self.remote.read(name, range)
    }

    /// File `name` whole, from the cache.
    pub(crate) fn whole(&self, name: &str) -> Result<Vec<u8>> {
        let path = self.remote.fetch(name)?;
        fs::read(&path).map_err(|e| Error::io(&path, "cannot read", e))
    }

    /// The sizes of the shards the run reads that the cache lacks.
    fn missing(&self) -> Vec<u64> {
        let skipped = self.lock().skipped.clone();
        self.order
            .iter()
            .zip(skipped)
            .filter(|((name, _), skip)| !skip && !self.remote.snapshot_file(name).is_file())
            .map(|((_, size), _)| *size)
            .collect()
    }

    /// How far the run's downloads are (none to tell before planning).
    pub(crate) fn downloads(&self) -> Option<Download> {
        let total_bytes = self.lock().to_download;
        let done = self
            .remote
            .received
            .load(std::sync::atomic::Ordering::Relaxed);
        (total_bytes > 0).then_some(Download {
            done_bytes: done.min(total_bytes),
            total_bytes,
        })
    }

    /// Refuses a run that cannot fit: the dense files on the output's
    /// file system and the shards still to download (two at a time with
    /// `delete`) in the cache's, each against its free space.
    fn check_space(&self, out_bytes: u64) -> Result<Vec<String>> {
        let missing = self.missing();
        self.lock().to_download = missing.iter().sum();
        let mut cache_bytes: u64 = missing.iter().sum();
        if self.delete {
            let mut sizes = missing.clone();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            cache_bytes = sizes.iter().take(2).sum();
        }
        let needs = [
            writer::Need {
                what: "the dense checkpoint",
                at: self.out.clone(),
                bytes: out_bytes,
            },
            writer::Need {
                what: "the downloads",
                at: self.remote.cache.root.clone(),
                bytes: cache_bytes,
            },
        ];
        writer::check_space(&self.out, &needs)
    }
}

impl crate::stream::Files for Fetcher<'_> {
    fn skip(&self, names: &std::collections::BTreeSet<String>) {
        let mut s = self.lock();
        for (i, (name, _)) in self.order.iter().enumerate() {
            s.skipped[i] |= names.contains(name);
        }
        self.wake.notify_all();
    }

    fn name(&self) -> Option<String> {
        crate::stream::Files::name(self.remote)
    }

    fn list(&self) -> Vec<(String, u64)> {
        crate::stream::Files::list(self.remote)
    }

    fn read(
        &self,
        name: &str,
        range: std::ops::Range<u64>,
    ) -> impl std::future::Future<Output = Result<Vec<u8>>> {
        std::future::ready(self.read_now(name, range))
    }

    fn downloads(&self) -> Option<Download> {
        Fetcher::downloads(self)
    }

    fn planned(&self, out_bytes: u64) -> Result<Vec<String>> {
        let notes = self.check_space(out_bytes)?;
        self.lock().decoding = true;
        self.wake.notify_all();
        Ok(notes)
    }
}

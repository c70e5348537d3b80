//! Which tensor bytes are in memory: those of a checkpoint handed over in
//! memory are loaded (and unloaded) tensor by tensor; the pages of a mapped
//! one are released once read.

use super::header::Storage;
use super::Checkpoint;
use crate::error::{Error, Result, Rule};

impl Checkpoint {
    /// Bytes of tensors loaded so far ([`Checkpoint::load`]).
    pub fn loaded_bytes(&self) -> usize {
        let partial = self.shards.iter().filter_map(|s| match &s.storage {
            Storage::Partial(loaded) => Some(loaded.values().map(Vec::len).sum::<usize>()),
            Storage::Mapped(_) => None,
        });
        partial.sum()
    }

    /// Adds the bytes of tensor `name` to a checkpoint handed over in memory
    /// ([`Checkpoint::from_listing`]); they must be exactly its stored bytes.
    pub fn load(&mut self, name: &str, bytes: Vec<u8>) -> Result<()> {
        let len = self.get(name).map(|t| t.len());
        let shard = self.lookup.get(name).map(|&s| &mut self.shards[s]);
        match (shard, len) {
            (Some(s), Some(len)) if len == bytes.len() => match &mut s.storage {
                Storage::Partial(loaded) => {
                    loaded.insert(name.to_string(), bytes);
                    Ok(())
                }
                Storage::Mapped(_) => Ok(()),
            },
            _ => Err(Error::tensor(
                Rule::Io,
                self.display_path(),
                name,
                format!("{} bytes handed over, not its stored bytes", bytes.len()),
            )),
        }
    }

    /// Drops the loaded bytes of every tensor but those `keep` names.
    pub fn unload(&mut self, keep: impl Fn(&str) -> bool) {
        for s in &mut self.shards {
            if let Storage::Partial(loaded) = &mut s.storage {
                loaded.retain(|name, _| keep(name));
            }
        }
    }

    /// The tensors whose bytes were asked for ([`TensorRef::data`](super::TensorRef::data)) but not
    /// loaded since the last call, sorted.
    pub fn take_misses(&self) -> Vec<String> {
        self.misses
            .lock()
            .map(|mut m| std::mem::take(&mut *m).into_iter().collect())
            .unwrap_or_default()
    }

    /// Drops the pages of `bytes` (a range of a shard) from this process's
    /// resident memory: they were read and will not be needed again soon.
    /// They stay in the OS page cache and are read back from the file if
    /// touched again, so this only bounds memory; bytes outside every shard
    /// are ignored.
    pub fn release(&self, bytes: &[u8]) {
        self.release_all([bytes]);
    }

    /// [`Checkpoint::release`] of many ranges: neighbouring ones in a shard
    /// (a batch's tensors lie side by side in the file) go in one call, as
    /// each call may interrupt every core.
    pub fn release_all<'b>(&self, ranges: impl IntoIterator<Item = &'b [u8]>) {
        #[cfg(unix)]
        {
            const GAP: usize = 1 << 16;
            // (shard, start, end) as offsets into the shard's map.
            let mut spans: Vec<(usize, usize, usize)> = Vec::new();
            for b in ranges {
                let at = b.as_ptr() as usize;
                let found = self
                    .shards
                    .iter()
                    .enumerate()
                    .find_map(|(i, s)| match &s.storage {
                        Storage::Mapped(map) => {
                            let base = map.as_ptr() as usize;
                            (at >= base && at + b.len() <= base + map.len())
                                .then(|| (i, at - base, at - base + b.len()))
                        }
                        _ => None,
                    });
                spans.extend(found.filter(|(_, lo, hi)| hi > lo));
            }
            spans.sort_unstable();
            let mut merged: Vec<(usize, usize, usize)> = Vec::new();
            for (i, lo, hi) in spans {
                match merged.last_mut() {
                    Some(last) if last.0 == i && lo <= last.2.saturating_add(GAP) => {
                        last.2 = last.2.max(hi)
                    }
                    _ => merged.push((i, lo, hi)),
                }
            }
            for (i, lo, hi) in merged {
                if let Storage::Mapped(map) = &self.shards[i].storage {
                    // SAFETY: the map is a read-only view of a file.
                    // MADV_DONTNEED on it only discards resident pages; a later
                    // read faults the same bytes back in from the file, so every
                    // `&[u8]` into the map keeps seeing the same contents.
                    let _ = unsafe {
                        map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo)
                    };
                }
            }
        }
        #[cfg(not(unix))]
        let _ = ranges;
    }
}

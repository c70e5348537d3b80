//! The decode → write pipeline of one shard file: this thread makes its
//! pieces (a helper decodes ahead when the backend can), a second one writes
//! them, and inputs leave memory once used.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender};

use super::check;
use crate::backend::Backend;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result, Rule};
use crate::plan::{Output, Source};

/// Decoded bytes per piece; at most four pieces are in memory at once (one
/// being decoded, one queued, one being written, one hashed), five when
/// the backend decodes ahead. Pieces of 8 MB rather than 32 keep the four
/// stages overlapping on a small model (docs/performance.md#writing-pieces)
/// and a fifth of the memory touched.
pub(crate) const PIECE_BYTES: usize = 8 << 20;

/// A piece's decoded bytes, starting on a cache line: the CPU's kernels
/// write whole lines of large outputs around the caches, which needs them
/// aligned (an allocator's large blocks start 16 bytes past one).
#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
}

impl Buffer {
    /// Bytes already made (none to align).
    fn made(bytes: Vec<u8>) -> Buffer {
        let len = bytes.len();
        Buffer {
            bytes,
            start: 0,
            len,
        }
    }

    /// Its `len` bytes for a new piece to be made in (what the last piece
    /// left, or zeros).
    fn take(&mut self, len: usize) -> &mut [u8] {
        self.bytes.resize(len + 64, 0);
        self.start = self.bytes.as_ptr().align_offset(64).min(64);
        self.len = len;
        &mut self.bytes[self.start..self.start + len]
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }
}

/// What a piece is made into: bytes on their way to the file-writing thread.
enum Made<'a> {
    /// Decoded (or computed) bytes; the buffer comes back for reuse.
    Owned(Buffer),
    /// Stored bytes copied as they are, released from memory once written.
    Stored(&'a [u8]),
}

/// One piece of a shard's tensor data, in file order: a whole tensor, a
/// bounded run of rows of a tensor decoded by rows, or several small
/// tensors decoded by rows, made together.
enum Piece<'t, 'a> {
    Whole(&'t Output<'a>),
    Rows(&'t Output<'a>, std::ops::Range<usize>),
    Batch(Vec<&'t Output<'a>>),
}

/// Tensors decoded by rows below this size are batched into pieces of about
/// [`PIECE_BYTES`]: a MoE release's thousands of small experts would
/// otherwise cost a round of thread wake-ups and a hand-over each.
const SMALL_BYTES: usize = PIECE_BYTES / 8;

impl<'t, 'a> Piece<'t, 'a> {
    /// The pieces of `tensors`, in order ([`row_pieces`]; small ones batched).
    fn all(tensors: &[&'t Output<'a>]) -> Vec<Piece<'t, 'a>> {
        let mut pieces = Vec::new();
        let mut batch: Vec<&'t Output<'a>> = Vec::new();
        let mut batch_bytes = 0;
        let flush = |batch: &mut Vec<&'t Output<'a>>, pieces: &mut Vec<Piece<'t, 'a>>| {
            match batch.len() {
                0 => {}
                1 => pieces.extend(Piece::of(batch[0])),
                _ => pieces.push(Piece::Batch(std::mem::take(batch))),
            }
            batch.clear();
        };
        for &t in tensors {
            let small = t.row_layout().is_some() && t.byte_len() <= SMALL_BYTES;
            if !small || batch_bytes + t.byte_len() > PIECE_BYTES {
                flush(&mut batch, &mut pieces);
                batch_bytes = 0;
            }
            if small {
                batch.push(t);
                batch_bytes += t.byte_len();
            } else {
                pieces.extend(Piece::of(t));
            }
        }
        flush(&mut batch, &mut pieces);
        pieces
    }

    /// The tensor's pieces ([`row_pieces`]).
    fn of(t: &'t Output<'a>) -> Vec<Piece<'t, 'a>> {
        match row_pieces(t) {
            Some(pieces) => pieces
                .into_iter()
                .map(|rows| Piece::Rows(t, rows))
                .collect(),
            None => vec![Piece::Whole(t)],
        }
    }

    /// Whether the piece is decoded into a buffer (and can be made ahead).
    fn decoded(&self) -> bool {
        !matches!(self, Piece::Whole(_))
    }

    /// The tensors the piece writes to, with the bytes it writes to each and
    /// whether it finishes them.
    fn parts(&self) -> Vec<(&'t Output<'a>, usize, bool)> {
        match self {
            Piece::Whole(t) => vec![(t, t.byte_len(), true)],
            Piece::Rows(t, rows) => {
                let (total, row_bytes) = t.row_layout().unwrap_or((0, 0));
                vec![(t, rows.len() * row_bytes, rows.end == total)]
            }
            Piece::Batch(ts) => ts.iter().map(|t| (*t, t.byte_len(), true)).collect(),
        }
    }

    /// The piece's bytes; a decoded piece goes into `buf`.
    fn make(&self, backend: &dyn Backend, mut buf: Buffer) -> Result<Made<'a>> {
        match self {
            Piece::Whole(t) => Ok(match &t.source {
                Source::Copy(src) => Made::Stored(src.stored()),
                _ => Made::Owned(Buffer::made(t.bytes(backend)?.into_owned())),
            }),
            Piece::Rows(t, rows) => {
                let row_bytes = t.row_layout().map_or(0, |(_, b)| b);
                t.decode_rows(backend, rows.clone(), buf.take(rows.len() * row_bytes))?;
                Ok(Made::Owned(buf))
            }
            Piece::Batch(ts) => {
                let mut jobs = Vec::with_capacity(ts.len());
                let mut rest = buf.take(ts.iter().map(|t| t.byte_len()).sum());
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
                    return Ok(Made::Owned(buf));
                }
                jobs.into_iter().try_for_each(decode)?;
                Ok(Made::Owned(buf))
            }
        }
    }
}

/// The runs of rows (of about [`PIECE_BYTES`] each) a tensor decoded by rows
/// is made in, so that memory holds a few of them, not the tensor; `None`
/// for a tensor made whole.
pub fn row_pieces(t: &Output<'_>) -> Option<Vec<std::ops::Range<usize>>> {
    match t.row_layout() {
        Some((total, row_bytes)) if total > 0 && row_bytes > 0 => {
            let per = (PIECE_BYTES / row_bytes)
                .max(1)
                .next_multiple_of(t.row_band());
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

/// Makes the pieces of `pieces` in order and hands each to the writing
/// thread (`tx`). When the backend runs calls at once
/// ([`Backend::decodes_ahead`]), a helper thread decodes the next piece while
/// this one is made, so the device never drains between pieces. Returns
/// false when the writing thread stopped taking pieces.
#[allow(clippy::too_many_arguments)]
fn send_pieces<'a>(
    ckpt: &Checkpoint,
    pieces: &[Piece<'_, 'a>],
    backend: &dyn Backend,
    cancelled: &AtomicBool,
    tx: &SyncSender<Made<'a>>,
    spare: &Receiver<Buffer>,
    progress: &mut impl FnMut(&str, u64, bool),
) -> Result<bool> {
    std::thread::scope(|scope| {
        let (done_tx, done_rx) = sync_channel::<Result<Made<'a>>>(1);
        // The helper's queue, when there is a helper (never in the browser,
        // which has no threads).
        #[cfg(not(target_arch = "wasm32"))]
        let ahead = backend.decodes_ahead().then(|| {
            let (ahead_tx, ahead_rx) = channel::<(usize, Buffer)>();
            scope.spawn(move || {
                for (i, buf) in ahead_rx {
                    if done_tx.send(pieces[i].make(backend, buf)).is_err() {
                        break;
                    }
                }
            });
            ahead_tx
        });
        #[cfg(target_arch = "wasm32")]
        let ahead: Option<std::sync::mpsc::Sender<(usize, Buffer)>> = {
            let _ = (scope, done_tx);
            None
        };
        let mut pending = None;
        for (i, item) in pieces.iter().enumerate() {
            check(cancelled)?;
            let piece = if pending == Some(i) {
                pending = None;
                done_rx
                    .recv()
                    // It sends a result before it ends, unless it panicked.
                    .map_err(|_| Error::bare(Rule::Internal, "the decoding thread stopped"))??
            } else {
                let next = pieces.get(i + 1).filter(|n| n.decoded());
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
                    (Piece::Rows(_, rows), false) => spent.extend(t.spent_inputs(rows.clone())),
                    _ => {}
                }
            }
            ckpt.release_all(spent);
        }
        Ok(true)
    })
}

/// Streams `header`, then `tensors`, into `w`: this thread decodes, a
/// second one writes and a third hashes what was written. Inputs leave
/// resident memory once used, so memory stays bounded by a few chunks, not
/// by the checkpoint. Returns `w`, the bytes written and their BLAKE3
/// digest.
///
/// BLAKE3, several times SHA-256's speed, on its own thread costs one more
/// chunk in memory and a small share of a small model's run
/// (docs/performance.md#the-run-records-digests). (Read back once the
/// file is synced instead, it would not overlap the writes of a one-file
/// output at all.)
#[allow(clippy::too_many_arguments)]
pub(super) fn write_shard<W: Write + Send>(
    ckpt: &Checkpoint,
    header: &[u8],
    tensors: &[&Output<'_>],
    backend: &dyn Backend,
    cancelled: &AtomicBool,
    path: &Path,
    mut w: W,
    progress: &mut impl FnMut(&str, u64, bool),
) -> Result<(W, u64, [u8; 32])> {
    std::thread::scope(|scope| {
        // Two chunks queued at most for the writer; the hasher takes each
        // from it by hand.
        let (tx, rx) = sync_channel::<Made<'_>>(1);
        let (hash_tx, hash_rx) = sync_channel::<Made<'_>>(0);
        let (spare_tx, spare) = channel::<Buffer>();
        let writer = scope.spawn(move || -> std::io::Result<(W, u64)> {
            w.write_all(header)?;
            let mut len = header.len() as u64;
            for piece in rx {
                let bytes = match &piece {
                    Made::Owned(buf) => buf.as_slice(),
                    Made::Stored(bytes) => bytes,
                };
                w.write_all(bytes)?;
                len += bytes.len() as u64;
                if hash_tx.send(piece).is_err() {
                    break;
                }
            }
            Ok((w, len))
        });
        let hasher = scope.spawn(move || {
            let mut hash = blake3::Hasher::new();
            hash.update(header);
            for piece in hash_rx {
                match piece {
                    Made::Owned(buf) => {
                        hash.update(buf.as_slice());
                        let _ = spare_tx.send(buf);
                    }
                    Made::Stored(bytes) => {
                        hash.update(bytes);
                        ckpt.release(bytes);
                    }
                }
            }
            *hash.finalize().as_bytes()
        });
        let pieces = Piece::all(tensors);
        let sent = send_pieces(ckpt, &pieces, backend, cancelled, &tx, &spare, progress);
        drop(tx);
        let written = writer.join();
        let digest = hasher.join();
        // A decode error comes first; a writing error explains a closed channel.
        sent?;
        let panicked =
            |what: &str| Error::new(Rule::Internal, path, format!("the {what} thread panicked"));
        let (w, len) = written
            .map_err(|_| panicked("writing"))?
            .map_err(|e| Error::io(path, "cannot write", e))?;
        Ok((w, len, digest.map_err(|_| panicked("hashing"))?))
    })
}

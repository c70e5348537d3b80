//! The reference backend: output rows spread over threads, decoded through
//! code tables wherever the job allows, else element by element with the
//! job's own accessor ([`DecodeJob::value`]):
//!
//! - [`rows`]: entries that hold over runs of an output row — straight rows,
//!   and GPTQ's and AutoAWQ's packs along the inputs and sparse byte codes
//!   gathered into straight rows first; where a table per entry would cost
//!   more than its values, values computed from consecutive-integer codes
//!   ([`direct`]);
//! - [`tiles`]: entries that change along an output row (GPT-OSS's experts,
//!   whose scale is per output column), and whatever else is transposed or
//!   strided, a tile at a time;
//! - [`simd`]: the vector kernels both use.
//!
//! Tables hold the encoded output of every code of one entry, computed with
//! exactly the operations `value` performs, so every way gives the same
//! bytes.

use std::ops::Range;

use rayon::prelude::*;

use super::Backend;
use crate::error::Result;
use crate::job::DecodeJob;

mod direct;
mod rows;
mod simd;
pub use simd::Kernels;
mod table;
mod tiles;

/// Output elements one thread task decodes at least (amortizes scheduling).
const TASK_ELEMENTS: usize = 1 << 16;

/// Outputs of one call at least this large are written around the caches
/// where the kernels can: they outgrow a core's share of the last-level
/// cache, so their lines would be evicted unread, and a store that skips
/// the caches does not read each line first.
const STREAM_BYTES: usize = 8 << 20;

/// The ways [`Cpu`] decodes a job, as [`way`] tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Output rows through tables, their codes read in place.
    Rows,
    /// Output rows through tables, their codes packed along the inputs
    /// (GPTQ's and AutoAWQ's words).
    PackedRows,
    /// Output rows computed from their codes without tables (GGUF's
    /// blocks, a scale per few codes; GPTQ's 8-bit codes with a zero point
    /// per 32).
    Direct,
    /// Tiles through tables.
    Tiles,
    /// Element by element ([`DecodeJob::value`]).
    Elements,
}

/// The way [`Cpu`] decodes `job`: what tests check random jobs reach.
pub fn way(job: &DecodeJob<'_>) -> Way {
    // The way does not depend on the instructions.
    let isa = simd::Isa::detect();
    if job.codebook.is_some() {
        return Way::Elements;
    }
    match (
        rows_of(job, isa),
        job.transposed || job.codes.word_bits != 32,
    ) {
        (Some(r), _) if r.is_direct() => Way::Direct,
        (Some(_), false) => Way::Rows,
        (Some(_), true) => Way::PackedRows,
        (None, _) if tiles::Tiles::of(job, isa).is_some() => Way::Tiles,
        (None, _) => Way::Elements,
    }
}

/// The rows `job` is decoded in, if any: rows whose values are computed
/// directly only because tables would not be taken give way to tiles.
fn rows_of(job: &DecodeJob<'_>, isa: simd::Isa) -> Option<rows::Rows> {
    rows::Rows::of(job, isa).filter(|r| !r.is_fallback() || tiles::Tiles::of(job, isa).is_none())
}

/// Multi-threaded CPU decoding.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cpu {
    /// The kernels it may run (the widest, but in tests).
    kernels: Kernels,
}

impl Cpu {
    /// The CPU backend (uses rayon's global pool).
    pub fn new() -> Cpu {
        Cpu::default()
    }

    /// The CPU backend running only `kernels` (all give the same bytes):
    /// tests check on this CPU the loops other CPUs run, each on its own
    /// value, so tests running at once keep their own kernels.
    #[cfg(feature = "testing")]
    pub fn with_kernels(kernels: Kernels) -> Cpu {
        Cpu { kernels }
    }
}

impl Backend for Cpu {
    fn name(&self) -> String {
        let threads = rayon::current_num_threads();
        format!("cpu ({})", crate::plural::plural(threads, "thread"))
    }

    fn decode_rows(&self, job: &DecodeJob<'_>, rows: Range<usize>, out: &mut [u8]) -> Result<()> {
        super::check_rows(job, &rows, out)?;
        let row_bytes = job.dims.cols * job.out.size();
        if row_bytes == 0 || rows.is_empty() {
            return Ok(());
        }
        // Read once for the whole call: every kernel of it agrees.
        let isa = simd::Isa::of(self.kernels);
        // Codebook jobs gather vectors: element by element.
        let coded = job.codebook.is_none();
        if let Some(plan) = rows_of(job, isa).filter(|_| coded) {
            let plan = plan.streaming(out.len() >= STREAM_BYTES);
            let rows_per_task = plan.rows_per_task(job.dims.cols, TASK_ELEMENTS);
            out.par_chunks_mut(rows_per_task * row_bytes)
                .enumerate()
                .for_each(|(task, chunk)| {
                    let first = rows.start + task * rows_per_task;
                    let last = first + chunk.len() / row_bytes;
                    plan.decode(job, first..last, chunk);
                    simd::fence();
                });
            return Ok(());
        }
        if let Some(tiles) = tiles::Tiles::of(job, isa).filter(|_| coded) {
            let rows_per_task = tiles.rows_per_task(job.dims.cols);
            out.par_chunks_mut(rows_per_task * row_bytes)
                .enumerate()
                .for_each_init(tiles::Scratch::default, |scratch, (task, chunk)| {
                    let first = rows.start + task * rows_per_task;
                    let last = first + chunk.len() / row_bytes;
                    tiles.decode(job, first..last, chunk, scratch);
                });
            return Ok(());
        }
        let rows_per_task = TASK_ELEMENTS.div_ceil(job.dims.cols);
        out.par_chunks_mut(rows_per_task * row_bytes)
            .enumerate()
            .for_each(|(task, chunk)| {
                let size = job.out.size();
                for (k, row_out) in chunk.chunks_exact_mut(row_bytes).enumerate() {
                    let flat = rows.start + task * rows_per_task + k;
                    let (slice, row) = (flat / job.dims.rows, flat % job.dims.rows);
                    for (col, o) in row_out.chunks_exact_mut(size).enumerate() {
                        job.out.encode(job.value(slice, row, col), o);
                    }
                }
            });
        Ok(())
    }
}

//! The reference backend: the job's own accessors, rows spread over threads.

use std::ops::Range;

use rayon::prelude::*;

use super::Backend;
use crate::error::Result;
use crate::job::DecodeJob;

/// Output elements one thread task decodes at least (amortizes scheduling).
const TASK_ELEMENTS: usize = 1 << 14;

/// Multi-threaded CPU decoding.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cpu;

impl Cpu {
    /// The CPU backend (uses rayon's global pool).
    pub fn new() -> Cpu {
        Cpu
    }
}

impl Backend for Cpu {
    fn name(&self) -> String {
        format!("cpu ({} threads)", rayon::current_num_threads())
    }

    fn decode_rows(&self, job: &DecodeJob<'_>, rows: Range<usize>, out: &mut [u8]) -> Result<()> {
        super::check_rows(job, &rows, out)?;
        let cols = job.dims.cols;
        let size = job.out.size();
        let row_bytes = cols * size;
        if row_bytes == 0 || rows.is_empty() {
            return Ok(());
        }
        let rows_per_task = TASK_ELEMENTS.div_ceil(cols);
        out.par_chunks_mut(rows_per_task * row_bytes)
            .enumerate()
            .for_each(|(task, chunk)| {
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

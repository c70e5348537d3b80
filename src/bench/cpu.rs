//! The CPU kernels' figures: every layout decoded from memory, against a
//! multi-threaded copy of the output bytes.

use rayon::prelude::*;

use super::cases::{case_name, Layout, Weight};
use super::report::Figure;
use super::timing::best_of_turns;
use crate::backend::{Backend, Cpu};
use crate::error::Result;
use crate::job::DecodeJob;
use crate::numerics::OutDtype;

/// A zeroed buffer of `len` bytes that starts on a cache line, as the
/// writer's do.
pub(super) fn line_aligned(len: usize) -> (Vec<u8>, usize) {
    let buf = vec![0u8; len + 64];
    let skew = (64 - buf.as_ptr() as usize % 64) % 64;
    (buf, skew)
}

/// CPU decode of every layout against a multi-threaded copy of the output
/// bytes; the layouts along the inputs also against the straight int4 job
/// of the same shape (and those with zero points against the straight one
/// with zero points: the cost of the transposition alone), in turns.
pub(crate) fn cpu_kernels(
    rows: usize,
    cols: usize,
    runs: usize,
    only: &str,
) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    // Their codes and scales need whole groups of 128 rows too.
    let along = if rows.is_multiple_of(128) {
        &Layout::ALONG_INPUTS[..]
    } else {
        &[]
    };
    let straight: Vec<Weight> = Layout::STRAIGHT
        .iter()
        .filter(|_| along.iter().any(|l| l.name().contains(only)))
        .map(|&l| Weight::random(l, rows, cols, 7))
        .collect();
    let cpu = Cpu::new();
    let decode =
        |job: &DecodeJob<'_>, dst: &mut [u8]| cpu.decode_rows(job, 0..job.dims.total_rows(), dst);
    for &layout in Layout::ALL
        .iter()
        .chain(along)
        .filter(|l| l.name().contains(only))
    {
        let w = Weight::random(layout, rows, cols, 7);
        for out in [OutDtype::Bf16, OutDtype::F32] {
            let job = w.job(out);
            let bytes = job.out_bytes();
            let src = vec![1u8; bytes];
            let (mut buf, skew) = line_aligned(bytes);
            let dst = &mut buf[skew..skew + bytes];
            let chunk = (bytes / rayon::current_num_threads().max(1) / 4).max(1 << 16);
            // Touch both buffers once so page faults are not timed.
            dst.par_chunks_mut(chunk).for_each(|d| d.fill(0));
            let copy = |dst: &mut [u8]| {
                dst.par_chunks_mut(chunk)
                    .zip(src.par_chunks(chunk))
                    .for_each(|(d, s)| d.copy_from_slice(s));
                Ok(())
            };
            // Both write the same buffer: one `dst` borrowed in turns.
            let dst = std::cell::RefCell::new(dst);
            let times = best_of_turns(
                runs,
                || decode(&job, &mut dst.borrow_mut()),
                || copy(&mut dst.borrow_mut()),
            )?;
            let memcpy = format!(
                "memcpy, {}",
                crate::plural::plural(rayon::current_num_threads(), "thread")
            );
            figures.push(Figure::timed(
                "cpu",
                (case_name(layout, out), memcpy),
                bytes as u64,
                times,
            ));
            let zero_points = matches!(layout, Layout::Gptq | Layout::Awq);
            for base in straight
                .iter()
                .filter(|_| along.contains(&layout))
                .filter(|b| b.layout == Layout::Int4 || zero_points)
            {
                let base_job = base.job(out);
                let times = best_of_turns(
                    runs,
                    || decode(&job, &mut dst.borrow_mut()),
                    || decode(&base_job, &mut dst.borrow_mut()),
                )?;
                let straight = format!("straight {}", case_name(base.layout, out));
                figures.push(Figure::timed(
                    "cpu",
                    (case_name(layout, out), straight),
                    bytes as u64,
                    times,
                ));
            }
        }
    }
    Ok(figures)
}

//! Backends execute [`DecodeJob`]s. The CPU backend is the reference; every
//! other backend must produce the same bytes.
//!
//! This file holds the trait alone; `cpu` and [`gpu`] implement it,
//! `select` chooses one (and falls back from the GPU to the CPU), and
//! [`execute`] runs whole output tensors on any of them.

mod cpu;
pub mod execute;
pub mod gpu;
mod select;

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;

pub use cpu::{way, Cpu, Kernels, Way};
#[cfg(feature = "testing")]
pub use select::Fallback;
pub use select::{select, select_async, BackendChoice, GpuApi};

use crate::error::{Error, Result, Rule};
use crate::job::DecodeJob;

/// A backend's decode, awaited.
pub type Decoding<'a> = Pin<Box<dyn Future<Output = Result<()>> + 'a>>;

/// Something that turns a [`DecodeJob`] into dense bytes.
pub trait Backend: wgpu::WasmNotSendSync {
    /// Name and device, for people (`cpu (16 threads)`).
    fn name(&self) -> String;

    /// `gpu` or `cpu`, for programs: the device that decodes (from here on).
    fn kind(&self) -> &'static str {
        match self.gpu() {
            Some(_) => "gpu",
            None => "cpu",
        }
    }

    /// Decodes rows `rows` (counted over all slices) of `job` into `out`,
    /// which holds exactly `rows.len() · cols · out.size()` bytes.
    fn decode_rows(&self, job: &DecodeJob<'_>, rows: Range<usize>, out: &mut [u8]) -> Result<()>;

    /// [`Backend::decode_rows`], awaited: the GPU decoder underneath runs
    /// its own asynchronous path (in a browser nothing may block); the CPU
    /// simply decodes.
    fn decode_rows_async<'a>(
        &'a self,
        job: &'a DecodeJob<'a>,
        rows: Range<usize>,
        out: &'a mut [u8],
    ) -> Decoding<'a> {
        match self.gpu() {
            Some(gpu) => Box::pin(gpu.decode_rows_async(job, rows, out)),
            None => Box::pin(std::future::ready(self.decode_rows(job, rows, out))),
        }
    }

    /// True when calls from two threads run at once and a caller gains by
    /// decoding the next piece while this one finishes (a GPU, which would
    /// otherwise drain between calls). The CPU backend already uses every
    /// core within one call.
    fn decodes_ahead(&self) -> bool {
        false
    }

    /// The GPU decoder underneath, for work beyond decoding rows (a buffer
    /// on the device, `bench`'s copy shader); `None` on the CPU.
    fn gpu(&self) -> Option<&gpu::GpuDecoder> {
        None
    }

    /// The GPU failure this backend handed over to the CPU after, told once
    /// ([`Fallback`]); `None` for every other backend.
    fn take_fallback(&self) -> Option<Error> {
        None
    }

    /// Decodes a whole tensor into a new buffer.
    fn decode(&self, job: &DecodeJob<'_>) -> Result<Vec<u8>> {
        let mut out = vec![0u8; job.out_bytes()];
        self.decode_rows(job, 0..job.dims.total_rows(), &mut out)?;
        Ok(out)
    }
}

/// Fails unless `rows` lies inside `job` and `out` holds exactly their bytes
/// (backends call it before decoding; callers of the library can get it wrong).
pub(crate) fn check_rows(job: &DecodeJob<'_>, rows: &Range<usize>, out: &[u8]) -> Result<()> {
    if job
        .codes
        .blocks
        .is_some_and(|b| !b.is_valid() || b.bits() != job.codes.bits)
    {
        let detail = "codes in blocks: planes of 1, 2, 4 or 8 bits in runs of a power of two, inside the block, as wide as the stream's fields";
        return Err(Error::bare(
            Rule::Argument,
            format!("decode_rows: {detail}"),
        ));
    }
    check_span(
        job.dims.total_rows(),
        job.dims.cols * job.out.size(),
        rows,
        out,
    )
}

/// Fails unless `rows` lies inside `0..total_rows` and `out` holds exactly
/// their bytes, `row_bytes` each.
pub(crate) fn check_span(
    total_rows: usize,
    row_bytes: usize,
    rows: &Range<usize>,
    out: &[u8],
) -> Result<()> {
    let needed = rows.len().checked_mul(row_bytes);
    if rows.start > rows.end || rows.end > total_rows || needed != Some(out.len()) {
        return Err(Error::bare(
            Rule::Argument,
            format!(
                "decode_rows: rows {rows:?} of {total_rows} into a {}-byte buffer",
                out.len(),
            ),
        ));
    }
    Ok(())
}

//! Splitting a [`DecodeJob`](crate::job::DecodeJob) into chunks of rows
//! that fit the device, and laying out what each chunk reads in one word
//! buffer (`src` in the shader).
//!
//! Pure host logic: no device needed, so it is unit-tested on any machine.
//! A concern a file: `protocol`, the numbers and structs the host and the
//! shader share; `kernels`, which kernel a job runs and its constants;
//! `chunks`, the chunks and their `src`.

mod chunks;
mod kernels;
mod protocol;

pub(super) use chunks::{plan, Chunk, Limits};
pub(super) use kernels::{Fast, Kernel, Tile};
pub(super) use protocol::{GridKind, LowRankMode, OutKind, Pack, Params, ZeroMode};

#[cfg(test)]
use crate::job::{DecodeJob, Dims, Fields, Grid, ValueKind, Values};
#[cfg(test)]
use crate::numerics::OutDtype;

/// A 4-bit job of `rows × cols` codes (each value `code − 8`), one bf16
/// scale per row: the unit tests' common input.
#[cfg(test)]
fn job(data: &[u8], scale: &[u8], rows: usize, cols: usize, out: OutDtype) -> DecodeJob<'static> {
    let data: &'static [u8] = Box::leak(data.to_vec().into_boxed_slice());
    let scale: &'static [u8] = Box::leak(scale.to_vec().into_boxed_slice());
    let words = (cols * 4).div_ceil(32);
    let codes =
        Fields::dense(data, 4, words as u64 * 32).with_slice_bits((rows * words) as u64 * 32);
    let scale = Values {
        data: scale.into(),
        kind: ValueKind::Bf16,
        grid: Grid {
            row_div: 1,
            col_div: cols,
            row_stride: 1,
            slice_stride: rows,
        },
    };
    let dims = Dims {
        slices: 1,
        rows,
        cols,
    };
    DecodeJob::new(
        dims,
        codes,
        (0..16).map(|v| v as f32 - 8.0).collect::<Vec<f32>>(),
        out,
    )
    .with_scale(scale)
}

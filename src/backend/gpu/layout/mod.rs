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
fn job(
    data: &[u8],
    scale: &[u8],
    rows: usize,
    cols: usize,
    out: OutDtype,
) -> DecodeJob<'static> {
    let data: &'static [u8] = Box::leak(data.to_vec().into_boxed_slice());
    let scale: &'static [u8] = Box::leak(scale.to_vec().into_boxed_slice());
    let words = (cols * 4).div_ceil(32);
    DecodeJob {
        dims: Dims {
            slices: 1,
            rows,
            cols,
        },
        codes: Fields {
            data: data.into(),
            bits: 4,
            per_word: 0,
            interleaved: false,
            lane_bits: words as u64 * 32,
            word_bits: 32,
            slice_bits: (rows * words) as u64 * 32,
            high_first: false,
            blocks: None,
        },
        code_values: (0..16).map(|v| v as f32 - 8.0).collect(),
        zero: None,
        scale: Some(Values {
            data: scale.into(),
            kind: ValueKind::Bf16,
            grid: Grid {
                row_div: 1,
                col_div: cols,
                row_stride: 1,
                slice_stride: rows,
            },
        }),
        g_idx: None,
        low_rank: None,
        post_scale: None,
        offset: None,
        product: Default::default(),
        sparse: None,
        transposed: false,
        out,
    }
}

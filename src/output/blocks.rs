//! Tensors of self-describing blocks (GGUF's): the scales and offsets of
//! each run of rows decoded (and the codes, where the job cannot read them
//! in the blocks) are first mapped on the host, from the stored blocks of
//! those rows alone, into the one job description, which any backend then
//! decodes. The map is the format's; memory holds the mapped job of one
//! run of rows, never the tensor's.
//!
//! A GGUF file's float tensors (F32, F16, BF16) are rows too, widened to
//! f32 on the host; and the rows written may be another order of the
//! stored ones (one expert of a stack, a head's rotary halves apart) and
//! their values moved by a constant, as transformers loads the file.

use std::borrow::Cow;
use std::ops::Range;

use crate::checkpoint::TensorRef;
use crate::error::{Result, Rule};
use crate::job::{DecodeJob, Dims};
use crate::numerics::OutDtype;

/// The map from the stored bytes of some whole rows to their job.
pub type MapBlocks = for<'b> fn(&'b [u8], Dims, OutDtype) -> Result<DecodeJob<'b>>;

/// A tensor stored as rows of blocks, or of floats.
#[derive(Debug, Clone)]
pub struct Blocks<'a> {
    /// The stored rows, `row_bytes` each.
    pub tensor: TensorRef<'a>,
    /// Rows (over all slices) and columns of the output.
    pub rows: usize,
    /// Columns of the output.
    pub cols: usize,
    /// Stored bytes of a row.
    pub row_bytes: usize,
    /// Output dtype.
    pub out: OutDtype,
    /// The format's map; `None` for a float tensor (its dtype says which).
    pub map: Option<MapBlocks>,
    /// Which stored row each output row is.
    pub order: RowOrder,
    /// Added to every value in f32, rounded, before the output rounding
    /// (Gemma's norms, stored as `w + 1`, loaded as `f32(w + 1) − 1`).
    pub shift: Option<f32>,
}

/// Where output row `r` is stored: row `first + r`, or, with `halves`, the
/// rows of each of `halves` heads taken even ones first, then odd ones:
/// transformers' reverse of llama.cpp's rotary permutation of Q and K
/// (`w.reshape(heads, rows/heads/2, 2, cols).swapaxes(1, 2)`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowOrder {
    /// The first stored row (an expert's in a stack).
    pub first: usize,
    /// Heads whose rows are un-interleaved.
    pub halves: Option<usize>,
}

impl RowOrder {
    /// The stored row of output row `r` of a tensor of `rows` rows.
    pub fn stored(&self, r: usize, rows: usize) -> usize {
        let r = match self.halves {
            Some(heads) if heads > 0 => {
                let per = rows / heads;
                let half = (per / 2).max(1);
                let (head, k) = (r / per.max(1), r % per.max(1));
                head * per + (k % half) * 2 + k / half
            }
            _ => r,
        };
        self.first + r
    }
}

impl<'a> Blocks<'a> {
    /// The stored bytes of output rows `rows`, when they lie together.
    pub fn stored(&self, rows: Range<usize>) -> Option<&'a [u8]> {
        if self.order.halves.is_some() {
            return None;
        }
        let (a, b) = (self.order.first + rows.start, self.order.first + rows.end);
        self.tensor
            .stored()
            .get(a * self.row_bytes..b * self.row_bytes)
    }

    /// The stored bytes of output rows `rows`, in output order: borrowed
    /// where they lie together, else gathered.
    pub fn rows_bytes(&self, rows: Range<usize>) -> Result<Cow<'a, [u8]>> {
        let data = self.tensor.data()?;
        let row = |r: usize| {
            let at = self.order.stored(r, self.rows) * self.row_bytes;
            data.get(at..at + self.row_bytes).ok_or_else(|| {
                self.tensor
                    .error(Rule::Internal, format!("row {r} past the tensor's"))
            })
        };
        if self.order.halves.is_none() {
            let (a, b) = (self.order.first + rows.start, self.order.first + rows.end);
            return match data.get(a * self.row_bytes..b * self.row_bytes) {
                Some(bytes) => Ok(Cow::Borrowed(bytes)),
                None => Err(self
                    .tensor
                    .error(Rule::Internal, format!("rows {rows:?} past the tensor's"))),
            };
        }
        let mut v = Vec::with_capacity(rows.len() * self.row_bytes);
        for r in rows {
            v.extend_from_slice(row(r)?);
        }
        Ok(Cow::Owned(v))
    }

    /// The job that decodes `bytes`, some whole rows of this tensor, into
    /// `out`; `None` for a float tensor.
    pub fn job<'b>(&self, bytes: &'b [u8], out: OutDtype) -> Option<Result<DecodeJob<'b>>> {
        let dims = Dims {
            slices: 1,
            rows: bytes.len() / self.row_bytes.max(1),
            cols: self.cols,
        };
        self.map.map(|map| map(bytes, dims, out))
    }
}

#[cfg(test)]
mod tests {
    use super::RowOrder;

    /// Output row `r` is the stored row numpy's
    /// `w.reshape(heads, per / 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)`
    /// puts there: written out index by index.
    #[test]
    fn halves_reverse_llama_cpps_permutation() {
        for (rows, heads) in [(8, 1), (16, 2), (24, 4), (64, 8)] {
            let per = rows / heads;
            let mut want = Vec::new();
            for h in 0..heads {
                for j in 0..2 {
                    for i in 0..per / 2 {
                        want.push(h * per + i * 2 + j);
                    }
                }
            }
            let order = RowOrder {
                first: 5,
                halves: Some(heads),
            };
            let got: Vec<usize> = (0..rows).map(|r| order.stored(r, rows) - 5).collect();
            assert_eq!(got, want, "{rows} rows, {heads} heads");
        }
        let plain = RowOrder {
            first: 3,
            halves: None,
        };
        assert_eq!(plain.stored(4, 10), 7);
    }
}

//! Tensors of self-describing blocks (GGUF's): the scales and offsets of
//! each run of rows decoded (and the codes, where the job cannot read them
//! in the blocks) are first mapped on the host, from the stored blocks of
//! those rows alone, into the one job description, which any backend then
//! decodes. The map is the format's; memory holds the mapped job of one
//! run of rows, never the tensor's.

use std::ops::Range;

use crate::checkpoint::TensorRef;
use crate::error::{Result, Rule};
use crate::job::{DecodeJob, Dims};
use crate::numerics::OutDtype;

/// The map from the stored bytes of some whole rows to their job.
pub type MapBlocks = for<'b> fn(&'b [u8], Dims, OutDtype) -> Result<DecodeJob<'b>>;

/// A tensor stored as rows of blocks.
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
    /// The format's map.
    pub map: MapBlocks,
}

impl<'a> Blocks<'a> {
    /// The stored bytes of rows `rows`.
    pub fn stored(&self, rows: Range<usize>) -> Option<&'a [u8]> {
        self.tensor.stored().get(rows.start * self.row_bytes..rows.end * self.row_bytes)
    }

    /// The job that decodes rows `rows` (counted from 0 in it).
    pub fn job(&self, rows: Range<usize>) -> Result<DecodeJob<'a>> {
        let data = self.tensor.data()?;
        let bytes = data
            .get(rows.start * self.row_bytes..rows.end * self.row_bytes)
            .ok_or_else(|| self.tensor.error(Rule::Internal, format!("rows {rows:?} past the tensor's")))?;
        let dims = Dims {
            slices: 1,
            rows: rows.len(),
            cols: self.cols,
        };
        (self.map)(bytes, dims, self.out)
    }
}

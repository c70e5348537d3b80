//! Codes kept only where a bitmask is set ([`Sparse`]).

use std::sync::Arc;

use super::Fields;

/// Codes kept only where a bitmask is set (compressed-tensors' sparse
/// formats): element (row, col) reads code 0 — which a sparse job's
/// `code_values` make +0.0 — where its bit is clear, else code
///
/// ```text
/// start(row, col div block) + (set bits of row before col, from the block's first column)
/// ```
///
/// of the job's codes (lane 0: the kept codes, row after row). 2-D jobs only.
#[derive(Debug, Clone)]
pub struct Sparse<'a> {
    /// One bit per element, lane = row, LSB first.
    pub mask: Fields<'a>,
    /// Columns per block.
    pub block: usize,
    /// Where each block's kept codes start.
    pub starts: Starts,
}

/// Where a sparse job's blocks start among its kept codes.
#[derive(Debug, Clone)]
pub enum Starts {
    /// `row·per_row + block·per_block`: a fixed count per block (2:4 keeps
    /// 2 of every 4 columns).
    Fixed {
        /// Kept codes per row.
        per_row: u64,
        /// Kept codes per block.
        per_block: u64,
    },
    /// One per (row, block), row-major (unstructured masks).
    Table {
        /// Blocks per row.
        blocks: usize,
        /// The starts.
        at: Arc<[u64]>,
    },
}

impl Sparse<'_> {
    /// Index among the kept codes of the first in block `b` of `row` (of
    /// the row itself for `b` = 0; past the table: `u64::MAX`).
    #[inline]
    pub fn start(&self, row: usize, b: usize) -> u64 {
        match &self.starts {
            Starts::Fixed { per_row, per_block } => row as u64 * per_row + b as u64 * per_block,
            Starts::Table { blocks, at } => at.get(row * blocks + b).copied().unwrap_or(u64::MAX),
        }
    }

    /// Every code of a `slices × rows × cols` job whose kept codes are
    /// `codes`, as [`DecodeJob::code`] reads them (0 where the bit is
    /// clear), as `width`-bit fields, each row's words one after another:
    /// a row at a time, the index counted on from each block's start
    /// rather than each element's bits counted again.
    pub(super) fn codes_whole(
        &self,
        codes: &Fields<'_>,
        (slices, rows, cols): (usize, usize, usize),
        width: u32,
    ) -> Option<Fields<'static>> {
        let per = (32 / width) as usize;
        let lane_words = cols.div_ceil(per);
        let mut words = vec![0u32; slices.checked_mul(rows)?.checked_mul(lane_words)?];
        for (i, row) in words.chunks_exact_mut(lane_words.max(1)).enumerate() {
            let (s, r) = (i / rows.max(1), i % rows.max(1));
            let mut at = 0;
            for col in 0..cols {
                if col % self.block == 0 {
                    at = self.start(r, col / self.block);
                }
                if self.mask.get(s, r, col) != 0 {
                    row[col / per] |= codes.get(s, 0, at as usize) << ((col % per) as u32 * width);
                    at += 1;
                }
            }
        }
        Some(Fields::of_words(&words, width, (rows, lane_words), false))
    }

    /// Index among the kept codes of element (row, col), whose bit is set.
    #[inline]
    pub fn index(&self, row: usize, col: usize) -> u64 {
        let b = col / self.block;
        let first = self.mask.lane_start(0, row).unwrap_or(0) + (b * self.block) as u64;
        self.start(row, b) + self.mask.ones(first, first + (col % self.block) as u64)
    }
}

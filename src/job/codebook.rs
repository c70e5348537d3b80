//! Vector codebooks ([`Codebook`]): an index picks a vector of values (a
//! tile of the stored matrix) from a table uploaded once, and the vectors of
//! several indices are summed, then scaled and offset.

use std::sync::Arc;

use super::{Bytes, DecodeJob};
use crate::numerics::OutDtype;

/// The most terms (summed codebooks) a region may have; the GPU kernel
/// reads them from a fixed-size header.
pub const MAX_TERMS: usize = 8;

/// Widest index field a term reads.
pub const MAX_INDEX_BITS: u32 = 24;

/// A job whose codes are indices of vectors in a table, the table shared
/// by every element: the value of stored element (row, col) in a column
/// region is
///
/// ```text
/// acc = table[at(term 0)]
/// acc = round_a(acc + table[at(term t)])      t = 1, 2, …  (Sum::Stepwise)
/// acc = bag_a(Σ_t table[at(term t)])          in f32, in term order (Sum::EmbeddingBag)
/// v   = round_a(acc · scale)   (with a scale)
/// v   = round_a(v + offset)    (with an offset)
/// ```
///
/// where the region's tile is `tile_rows × tile_cols` stored elements,
/// `(ti, tj)` the element's tile, `p` its place in the tile (row-major),
/// `len` the tile's elements, a term's
/// `at = base + ((tj div group) · book + index(ti, tj)) · len + p`, and
/// `round_a` rounds to [`Codebook::arith`] (no rounding without it) and
/// `bag_a` as [`Sum::EmbeddingBag`] says. The
/// output column `c` is stored column `col_map[c]` (identity without one);
/// scale and offset are the job's [`DecodeJob::scale`] and
/// [`DecodeJob::offset`], read at the output (row, column). This is
/// VPTQ's (vectors along the outputs, residual codebooks summed, outlier
/// columns a region of their own, `perm`, `weight_scale`/`weight_bias`)
/// and AQLM's (tiles of `out_group × in_group`, codebooks summed as
/// torch's `F.embedding_bag` sums them, a scale per output group).
#[derive(Debug, Clone)]
pub struct Codebook<'a> {
    /// Every codebook's values, each entry's `len` values one after
    /// another (f32: the stored 16-bit values widen exactly).
    pub table: Arc<[f32]>,
    /// Column regions of the stored matrix, left to right, covering it.
    pub regions: Vec<Region<'a>>,
    /// Stored column of each output column, when not the identity.
    pub col_map: Option<Arc<[u32]>>,
    /// The dtype the sums, the scale and the offset round to (the
    /// producer's arithmetic); `None` computes in f32.
    pub arith: Option<OutDtype>,
    /// How the terms' vectors are summed.
    pub sum: Sum,
}

/// How a [`Codebook`]'s terms are summed before the scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sum {
    /// Each partial sum rounded to [`Codebook::arith`] (torch adding
    /// tensors of the model's dtype, one codebook after another: VPTQ).
    #[default]
    Stepwise,
    /// Summed in f32 in term order, rounded once to [`Codebook::arith`]
    /// as torch's CPU `F.embedding_bag(mode="sum")` rounds its f32 sums
    /// (fbgemm's conversions): f16 to nearest even, bf16 to nearest with
    /// ties away from zero (`(bits + 0x8000) >> 16`; a NaN as
    /// [`OutDtype::round`] writes it). AQLM's `_dequantize_weight`.
    EmbeddingBag,
}

/// `x` rounded to bf16 with ties away from zero (fbgemm's f32 → bf16,
/// `(bits + 0x8000) >> 16`), as an f32 again; a NaN as
/// [`OutDtype::round`] rounds it.
#[inline]
pub fn bf16_ties_away(x: f32) -> f32 {
    if x.is_nan() {
        return OutDtype::Bf16.round(x);
    }
    f32::from_bits(x.to_bits().wrapping_add(0x8000) & 0xffff_0000)
}

/// Stored columns `start..start + cols`, read through their own tiles and
/// terms.
#[derive(Debug, Clone)]
pub struct Region<'a> {
    /// First stored column.
    pub start: usize,
    /// Columns.
    pub cols: usize,
    /// Stored rows a vector covers.
    pub tile_rows: usize,
    /// Stored columns a vector covers.
    pub tile_cols: usize,
    /// The codebooks summed, in order (1..=[`MAX_TERMS`]).
    pub terms: Vec<Term<'a>>,
}

/// One codebook's indices: a field of `bits` bits, LSB first, in a
/// little-endian byte stream, for tile (ti, tj) at bit
/// `at + ti · row_bits + (tj div group) · group_bits + (tj mod group) · field_bits`.
#[derive(Debug, Clone)]
pub struct Term<'a> {
    /// The index bytes.
    pub data: Bytes<'a>,
    /// Index width, 1..=[`MAX_INDEX_BITS`] (higher stored bits are dropped).
    pub bits: u32,
    /// Bit of tile (0, 0)'s index.
    pub at: u64,
    /// Bits from one tile row to the next.
    pub row_bits: u64,
    /// Tile columns sharing a codebook.
    pub group: usize,
    /// Bits from one group to the next.
    pub group_bits: u64,
    /// Bits from one tile column to the next within a group.
    pub field_bits: u64,
    /// The codebook's first value in the table.
    pub base: usize,
    /// Entries from one group's codebook to the next.
    pub book: usize,
    /// Entries of one codebook: an index at or past it is refused
    /// ([`Codebook::first_past`]).
    pub entries: usize,
}

impl Term<'_> {
    /// The index of tile (ti, tj); 0 for bits past the data (a checked job
    /// has none).
    #[inline]
    pub fn index(&self, ti: usize, tj: usize) -> u32 {
        let pos = self.at
            + ti as u64 * self.row_bits
            + (tj / self.group) as u64 * self.group_bits
            + (tj % self.group) as u64 * self.field_bits;
        let byte = (pos / 8) as usize;
        let mut w = [0u8; 8];
        let d: &[u8] = &self.data;
        if byte < d.len() {
            let n = (d.len() - byte).min(8);
            w[..n].copy_from_slice(&d[byte..byte + n]);
        }
        let x = u64::from_le_bytes(w) >> (pos % 8);
        (x & ((1u64 << self.bits) - 1)) as u32
    }

    /// Where value `p` of tile (ti, tj)'s vector (`len` values) lies in
    /// the table.
    #[inline]
    pub fn at(&self, ti: usize, tj: usize, len: usize, p: usize) -> usize {
        self.base + ((tj / self.group) * self.book + self.index(ti, tj) as usize) * len + p
    }

    /// One past the last bit tile `(tiles_r − 1, tiles_c − 1)` reads, or
    /// `None` on overflow.
    pub fn end_bit(&self, tiles_r: usize, tiles_c: usize) -> Option<u64> {
        if tiles_r == 0 || tiles_c == 0 {
            return Some(0);
        }
        let tj = tiles_c - 1;
        self.at
            .checked_add((tiles_r as u64 - 1).checked_mul(self.row_bits)?)?
            .checked_add(((tj / self.group.max(1)) as u64).checked_mul(self.group_bits)?)?
            .checked_add(((tj % self.group.max(1)) as u64).checked_mul(self.field_bits)?)?
            .checked_add(self.bits as u64)
    }
}

impl Region<'_> {
    /// Tiles down and across for `rows` stored rows.
    pub fn tiles(&self, rows: usize) -> (usize, usize) {
        (
            rows.div_ceil(self.tile_rows.max(1)),
            self.cols.div_ceil(self.tile_cols.max(1)),
        )
    }
}

/// Where a codebook job breaks its own geometry ([`Codebook::check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The description itself (regions, tiles, widths) is impossible.
    Geometry(String),
    /// Region `region`, term `term` reads past its data.
    Short { region: usize, term: usize },
    /// Region `region`, term `term` holds an index at or past its
    /// codebook at tile (ti, tj).
    Past {
        region: usize,
        term: usize,
        ti: usize,
        tj: usize,
        index: u32,
    },
}

impl<'a> Codebook<'a> {
    /// The region holding stored column `col`, and the column in it.
    #[inline]
    pub fn region(&self, col: usize) -> Option<(&Region<'a>, usize)> {
        self.regions
            .iter()
            .find(|r| col >= r.start && col < r.start + r.cols)
            .map(|r| (r, col - r.start))
    }

    /// `x` rounded to the arithmetic's dtype.
    #[inline]
    pub fn round(&self, x: f32) -> f32 {
        self.arith.map_or(x, |d| d.round(x))
    }

    /// [`Sum::EmbeddingBag`]'s one rounding of an f32 sum.
    #[inline]
    pub fn round_bag(&self, x: f32) -> f32 {
        match self.arith {
            Some(OutDtype::Bf16) => bf16_ties_away(x),
            _ => self.round(x),
        }
    }

    /// The sum of the terms' vectors at stored (row, col), before scale
    /// and offset.
    #[inline]
    pub fn sum(&self, row: usize, col: usize) -> f32 {
        let Some((r, lc)) = self.region(col) else {
            return 0.0;
        };
        let (tr, tc) = (r.tile_rows, r.tile_cols);
        let (ti, tj) = (row / tr, lc / tc);
        let p = (row % tr) * tc + lc % tc;
        let len = tr * tc;
        let mut acc = 0.0f32;
        let bag = self.sum == Sum::EmbeddingBag;
        for (k, t) in r.terms.iter().enumerate() {
            let x = self.table.get(t.at(ti, tj, len, p)).copied().unwrap_or(0.0);
            acc = match (k, bag) {
                (0, _) => x,
                (_, true) => acc + x,
                (_, false) => self.round(acc + x),
            };
        }
        match bag {
            true => self.round_bag(acc),
            false => acc,
        }
    }

    /// Checks the geometry against `rows × cols` stored elements and the
    /// stored lengths, and every index of a term whose codebook holds fewer
    /// than `2^bits` entries against it (its bytes must be loaded: a
    /// planner reads them first, [`TensorRef::data`](crate::checkpoint::TensorRef::data)).
    pub fn check(&self, rows: usize, cols: usize) -> Result<(), Fault> {
        let geo = |s: &str| Err(Fault::Geometry(s.to_string()));
        let mut next = 0usize;
        for r in &self.regions {
            if r.start != next || r.cols == 0 {
                return geo("column regions must cover the columns left to right");
            }
            next = r.start + r.cols;
            if r.tile_rows == 0
                || r.tile_cols == 0
                || r.terms.is_empty()
                || r.terms.len() > MAX_TERMS
            {
                return geo("a region needs a tile and 1..=8 terms");
            }
        }
        if next != cols {
            return geo("column regions must cover the columns left to right");
        }
        if let Some(m) = &self.col_map {
            if m.len() != cols || m.iter().any(|&c| c as usize >= cols) {
                return geo("the column map must name a stored column for every output column");
            }
        }
        for (ri, r) in self.regions.iter().enumerate() {
            let len = r.tile_rows * r.tile_cols;
            let (tiles_r, tiles_c) = r.tiles(rows);
            for (ti_, t) in r.terms.iter().enumerate() {
                if t.bits == 0 || t.bits > MAX_INDEX_BITS || t.group == 0 || t.entries == 0 {
                    return geo("a term needs 1..=24 index bits, a group and entries");
                }
                // One past the last value the last group's codebook holds.
                let groups = tiles_c.div_ceil(t.group);
                let last = (groups.saturating_sub(1))
                    .checked_mul(t.book)
                    .and_then(|e| e.checked_add(t.entries))
                    .and_then(|e| e.checked_mul(len))
                    .and_then(|e| e.checked_add(t.base));
                if last.is_none_or(|l| l > self.table.len()) {
                    return geo("a codebook lies past the table");
                }
                // The stored length (a streamed checkpoint's bytes may not
                // be loaded yet).
                let stored = match &t.data {
                    Bytes::Stored(tr) => tr.len(),
                    other => other.len(),
                };
                let end = t.end_bit(tiles_r, tiles_c);
                if end.is_none_or(|e| e.div_ceil(8) > stored as u64) {
                    return Err(Fault::Short {
                        region: ri,
                        term: ti_,
                    });
                }
                // Indices of `bits` bits cannot pass a codebook of 2^bits
                // entries or more: only smaller ones are read through.
                if (t.entries as u64) < 1u64 << t.bits {
                    for ti in 0..tiles_r {
                        for tj in 0..tiles_c {
                            let index = t.index(ti, tj);
                            if index as usize >= t.entries {
                                return Err(Fault::Past {
                                    region: ri,
                                    term: ti_,
                                    ti,
                                    tj,
                                    index,
                                });
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

impl DecodeJob<'_> {
    /// [`DecodeJob::value`] of a codebook job (see [`Codebook`]), at output
    /// (slice, row, col).
    pub(super) fn codebook_value(
        &self,
        cb: &Codebook<'_>,
        slice: usize,
        row: usize,
        col: usize,
    ) -> f32 {
        let stored = cb.col_map.as_ref().map_or(col, |m| m[col] as usize);
        let mut v = cb.sum(row, stored);
        if let Some(s) = &self.scale {
            v = cb.round(v * s.get(s.grid.index(slice, row, self.group(&s.grid, col))));
        }
        if let Some(o) = &self.offset {
            v = cb.round(v + o.get(o.grid.index(slice, row, self.group(&o.grid, col))));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fields that cross bytes and words read LSB first, the bits above
    /// `bits` dropped; tile positions follow row, group and field strides.
    #[test]
    fn indices_cross_words_and_drop_higher_bits() {
        // 10-bit fields: 0x3FF, 0x155, 0x2AA, 0x001 one after another.
        let fields = [0x3FFu64, 0x155, 0x2AA, 0x001];
        let mut bits = 0u64;
        for (k, f) in fields.iter().enumerate() {
            bits |= f << (10 * k);
        }
        let data = bits.to_le_bytes().to_vec();
        let t = Term {
            data: data.into(),
            bits: 10,
            at: 0,
            row_bits: 20,
            group: 1,
            group_bits: 10,
            field_bits: 10,
            base: 0,
            book: 0,
            entries: 1024,
        };
        assert_eq!(t.index(0, 0), 0x3FF);
        assert_eq!(t.index(0, 1), 0x155);
        assert_eq!(t.index(1, 0), 0x2AA);
        assert_eq!(t.index(1, 1), 0x001);
        // The high 4 bits of each field above a 6-bit index, as vptq's
        // residual mask drops them.
        let high = Term {
            bits: 6,
            at: 4,
            ..t.clone()
        };
        assert_eq!(high.index(0, 0), 0x3F);
        assert_eq!(high.index(0, 1), 0x155 >> 4);
        // Past the data: zero, never a panic.
        assert_eq!(t.index(100, 0), 0);
    }

    /// fbgemm's bf16 rounding: a tie goes away from zero (to even would
    /// go down here), other values to nearest.
    #[test]
    fn bf16_ties_away_from_zero() {
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
        let tie = 1.0 + 2f32.powi(-8);
        assert_eq!(bf16_ties_away(tie), 1.0 + 2f32.powi(-7));
        assert_eq!(bf16_ties_away(-tie), -(1.0 + 2f32.powi(-7)));
        assert_eq!(OutDtype::Bf16.round(tie), 1.0);
        assert_eq!(bf16_ties_away(1.0 + 2f32.powi(-9)), 1.0);
        assert_eq!(bf16_ties_away(f32::MAX), f32::INFINITY);
        assert!(bf16_ties_away(f32::NAN).is_nan());
    }
}

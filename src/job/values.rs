//! What a job looks up besides its codes: scales and plain zero points
//! read as f32 ([`Values`]) on a grid of row and column groups ([`Grid`]),
//! and the zero point's forms ([`ZeroPoint`]).

use std::sync::Arc;

use super::{div, Bytes, Dims, Fields};
use crate::numerics::OutDtype;

/// How the stored elements of a scale or plain zero-point tensor read as f32.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueKind {
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
    /// IEEE single.
    F32,
    /// Signed 8-bit integer.
    I8,
    /// Signed 32-bit integer.
    I32,
    /// One byte indexing a 256-entry table of f32 (e4m3 or e8m0 scales, with
    /// any per-tensor factor already folded in on the host).
    Table(Box<[f32; 256]>),
    /// One byte, quantized itself (bitsandbytes' double quant): see
    /// [`Nested`].
    Nested(Box<Nested>),
}

/// Scales stored as bytes quantized themselves: entry `i`, byte `b`, is
///
/// ```text
/// r( r(table[b] · outer[k]) + add[k] ),   k = (i div per_outer) mod cycle
/// ```
///
/// two operations rounded on their own, in that order, each to `round`
/// (`r`: f32, or a 16-bit dtype where the producer computes in one); `add[k]`
/// is `adds[k]` where the job has them, else `offset`, and the `mod cycle`
/// is left out where `cycle` is 0. bitsandbytes' `dequantize_blockwise` of
/// its absmax, then `+= offset`: f32, one outer factor per `per_outer`
/// entries, no cycle. SINQ's quantAux `x · s + m`: the bytes read as a
/// `[tile, cycle]` matrix, a factor and an addend a column (`per_outer` 1),
/// in the dtype of `s` and `m`.
#[derive(Debug, Clone, PartialEq)]
pub struct Nested {
    /// The value of each byte (`nested_quant_map`; the byte itself for SINQ).
    pub table: [f32; 256],
    /// One factor per `per_outer` entries (`nested_absmax`), or per column
    /// of the cycle.
    pub outer: Arc<[f32]>,
    /// Entries sharing one outer factor (`nested_blocksize`), at least 1.
    pub per_outer: usize,
    /// Added last where `adds` is empty (`nested_offset`).
    pub offset: f32,
    /// Outer factors before they repeat (0: they do not); nonzero, at most
    /// `outer.len()`.
    pub cycle: usize,
    /// One addend per outer factor, added in place of `offset` (empty:
    /// none); as long as `outer` where there are any.
    pub adds: Arc<[f32]>,
    /// The dtype each of the two operations rounds to (f32: none more).
    pub round: OutDtype,
}

impl Nested {
    /// bitsandbytes' form: `f32(table[b] · outer[i div per_outer]) + offset`
    /// in f32, no cycle, no addends.
    pub fn blockwise(
        table: [f32; 256],
        outer: Arc<[f32]>,
        per_outer: usize,
        offset: f32,
    ) -> Nested {
        Nested {
            table,
            outer,
            per_outer,
            offset,
            cycle: 0,
            adds: Vec::new().into(),
            round: OutDtype::F32,
        }
    }

    /// The outer factor's (and addend's) number for entry `i`.
    #[inline]
    pub fn outer_index(&self, i: usize) -> usize {
        let k = i / self.per_outer;
        match self.cycle {
            0 => k,
            c => k % c,
        }
    }

    /// Entry `i` whose byte is `b` (Rust never fuses the two operations).
    #[inline]
    pub fn get(&self, i: usize, b: u8) -> f32 {
        let k = self.outer_index(i);
        let add = match self.adds.is_empty() {
            true => self.offset,
            false => self.adds[k],
        };
        let r = self.round;
        r.round(r.round(self.table[b as usize] * self.outer[k]) + add)
    }
}

impl ValueKind {
    /// Bytes per stored element.
    pub fn size(&self) -> usize {
        match self {
            ValueKind::Bf16 | ValueKind::F16 => 2,
            ValueKind::F32 | ValueKind::I32 => 4,
            ValueKind::I8 | ValueKind::Table(_) | ValueKind::Nested(_) => 1,
        }
    }
}

/// Where a zero point or scale is stored ([`DecodeJob::zero_source`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A packed field's first bit ([`Fields::position`]).
    Field(u64),
    /// A value's index ([`Values::get`]).
    Value(usize),
}

/// Where element (slice, row, col) finds its scale or zero point:
/// `slice·slice_stride + (row div row_div)·row_stride + group(col)`, with
/// `group(col) = g_idx[col]` when the job has one, else `col div col_div`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    /// Rows sharing one entry (1 per row, BH per block, ≥ rows per tensor).
    pub row_div: usize,
    /// Columns sharing one entry (G per group, BW per block, ≥ cols per row/tensor).
    pub col_div: usize,
    /// Entries from one row group to the next.
    pub row_stride: usize,
    /// Entries from one slice to the next.
    pub slice_stride: usize,
}

impl Grid {
    /// Entry index of (slice, row, column group).
    #[inline]
    pub fn index(&self, slice: usize, row: usize, group: usize) -> usize {
        slice * self.slice_stride + div(row, self.row_div) * self.row_stride + group
    }
}

/// A tensor of scalars read on a [`Grid`].
#[derive(Debug, Clone)]
pub struct Values<'a> {
    /// The raw bytes.
    pub data: Bytes<'a>,
    /// How the bytes read.
    pub kind: ValueKind,
    /// Where each element's entry is.
    pub grid: Grid,
}

impl Values<'_> {
    /// Entry `i` as f32.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        let d = &self.data;
        match &self.kind {
            ValueKind::Bf16 => {
                f32::from_bits((u16::from_le_bytes([d[2 * i], d[2 * i + 1]]) as u32) << 16)
            }
            ValueKind::F16 => {
                crate::numerics::f16_to_f32(u16::from_le_bytes([d[2 * i], d[2 * i + 1]]))
            }
            ValueKind::F32 => {
                f32::from_le_bytes([d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]])
            }
            ValueKind::I8 => d[i] as i8 as f32,
            ValueKind::I32 => {
                i32::from_le_bytes([d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]]) as f32
            }
            ValueKind::Table(t) => t[d[i] as usize],
            ValueKind::Nested(n) => n.get(i, d[i]),
        }
    }

    /// Number of entries stored.
    pub fn len(&self) -> usize {
        self.data.len() / self.kind.size()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entries on the transposed grid, on the host, for a stored
    /// `dims`: entry (row group, column group) becomes (column group, row
    /// group). `None` for nested entries (whose outer factor
    /// follows the stored order) and where an entry lies past the data.
    pub(super) fn transposed(&self, Dims { slices, rows, cols }: Dims) -> Option<Values<'static>> {
        if matches!(self.kind, ValueKind::Nested(_)) {
            return None;
        }
        let g = self.grid;
        // Entries shared by every slice stay shared.
        let slices = if g.slice_stride == 0 { 1 } else { slices };
        let (row_groups, col_groups) = (rows.div_ceil(g.row_div), cols.div_ceil(g.col_div));
        let size = self.kind.size();
        // Each entry is copied once: no more than the data holds.
        let len = slices
            .checked_mul(row_groups)?
            .checked_mul(col_groups)?
            .checked_mul(size)?;
        let mut data = Vec::with_capacity(len.min(self.data.len()));
        for s in 0..slices {
            for c in 0..col_groups {
                for r in 0..row_groups {
                    let at = g.index(s, r * g.row_div, c).checked_mul(size)?;
                    data.extend_from_slice(self.data.get(at..at.checked_add(size)?)?);
                }
            }
        }
        let grid = Grid {
            row_div: g.col_div,
            col_div: g.row_div,
            row_stride: row_groups,
            slice_stride: if g.slice_stride == 0 {
                0
            } else {
                row_groups * col_groups
            },
        };
        Some(Values {
            data: Bytes::Owned(data.into()),
            kind: self.kind.clone(),
            grid,
        })
    }
}

/// The zero point subtracted from each code before scaling.
#[derive(Debug, Clone)]
pub enum ZeroPoint<'a> {
    /// b-bit fields packed along rows: lane = column group, index = row.
    /// Fields read through the job's `code_values`, as the weight codes do.
    Packed {
        /// The packed fields.
        fields: Fields<'a>,
    },
    /// b-bit fields packed along columns: lane = row group of the scale
    /// grid (`row div row_div`), index = column (AutoAWQ's `qzeros`).
    /// Fields read through the job's `code_values`.
    PackedAlongCols {
        /// The packed fields.
        fields: Fields<'a>,
    },
    /// One stored integer per grid entry.
    Plain(Values<'a>),
}

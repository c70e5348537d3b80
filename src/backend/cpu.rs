//! The reference backend: rows spread over threads, each row decoded from
//! per-group lookup tables when the job allows it, transposed and strided
//! jobs a tile at a time through the same kind of tables ([`tiles`]), else
//! element by element with the job's own accessor ([`DecodeJob::value`]).
//!
//! The tables hold the encoded output of every code of one column group of
//! one row, computed with exactly the operations `value` performs, so both
//! ways give the same bytes; the table way turns the inner loop into a
//! byte load, a shift and a copy, which the compiler unrolls.

use std::ops::Range;

use rayon::prelude::*;

use super::Backend;
use crate::error::Result;
use crate::job::{DecodeJob, Fields, ZeroPoint};
use crate::numerics::{self, OutDtype};

mod tiles;

/// Output elements one thread task decodes at least (amortizes scheduling).
const TASK_ELEMENTS: usize = 1 << 16;

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
        let row_bytes = job.dims.cols * job.out.size();
        if row_bytes == 0 || rows.is_empty() {
            return Ok(());
        }
        let plan = RowTables::of(job);
        if let Some(tiles) = plan.is_none().then(|| tiles::Tiles::of(job)).flatten() {
            let rows_per_task = tiles.rows_per_task(job.dims.cols);
            out.par_chunks_mut(rows_per_task * row_bytes)
                .enumerate()
                .for_each_init(tiles::Scratch::default, |scratch, (task, chunk)| {
                    let first = rows.start + task * rows_per_task;
                    let last = first + chunk.len() / row_bytes;
                    tiles.decode(job, first..last, chunk, scratch);
                });
            return Ok(());
        }
        let rows_per_task = TASK_ELEMENTS.div_ceil(job.dims.cols);
        out.par_chunks_mut(rows_per_task * row_bytes)
            .enumerate()
            .for_each(|(task, chunk)| {
                let mut tables = Vec::new();
                for (k, row_out) in chunk.chunks_exact_mut(row_bytes).enumerate() {
                    let flat = rows.start + task * rows_per_task + k;
                    let (slice, row) = (flat / job.dims.rows, flat % job.dims.rows);
                    match (&plan, job.out.size()) {
                        (Some(t), 2) => t.row::<2>(job, slice, row, row_out, &mut tables),
                        (Some(t), _) => t.row::<4>(job, slice, row, row_out, &mut tables),
                        (None, size) => {
                            for (col, o) in row_out.chunks_exact_mut(size).enumerate() {
                                job.out.encode(job.value(slice, row, col), o);
                            }
                        }
                    }
                }
            });
        Ok(())
    }
}

/// How a row is decoded through tables: its column groups and how codes are
/// read.
struct RowTables {
    /// Columns per group (the scale grid's), unless `g_idx` maps them.
    group_cols: usize,
    /// Groups per row.
    groups: usize,
    /// Codes sit LSB-first, `8 / bits` to a byte, each row starting on a byte.
    byte_packed: bool,
}

impl RowTables {
    /// Tables pay off when a row holds more elements than its tables.
    fn of(job: &DecodeJob<'_>) -> Option<RowTables> {
        // Transposed rows and zero points along columns change their scale
        // or zero point from column to column; strided words are read in
        // tiles of rows ([`tiles`]).
        if job.low_rank.is_some()
            || job.transposed
            || job.codes.word_bits != 32
            || matches!(job.zero, Some(ZeroPoint::PackedAlongCols { .. }))
        {
            return None;
        }
        let cols = job.dims.cols;
        let group_cols = job
            .scale
            .as_ref()
            .map_or(cols, |s| s.grid.col_div.min(cols))
            .max(1);
        // A plain zero point read on a different grid than the scale would
        // need a table per (scale group, zero group) pair.
        if let (Some(ZeroPoint::Plain(z)), Some(s)) = (&job.zero, &job.scale) {
            if z.grid.col_div.min(cols) != group_cols || z.grid.row_div != s.grid.row_div {
                return None;
            }
        }
        if matches!(job.zero, Some(ZeroPoint::Plain(_))) && job.scale.is_none() {
            return None;
        }
        let groups = match &job.g_idx {
            Some(g) => g.iter().max().map_or(1, |&m| m as usize + 1),
            None => cols.div_ceil(group_cols),
        };
        if groups.checked_mul(job.code_values.len())? * 2 > cols {
            return None;
        }
        let f: &Fields<'_> = &job.codes;
        let byte_packed = matches!(f.bits, 1 | 2 | 4 | 8)
            && (f.per_word == 0 || f.per_word * f.bits == 32 && !f.interleaved)
            && f.word_bits == 32
            && f.lane_bits.is_multiple_of(8)
            && f.slice_bits.is_multiple_of(8);
        Some(RowTables {
            group_cols,
            groups,
            byte_packed,
        })
    }

    /// Decodes one row through tables of `N`-byte outputs (`tables` is
    /// scratch space, reused from row to row).
    fn row<const N: usize>(
        &self,
        job: &DecodeJob<'_>,
        slice: usize,
        row: usize,
        out: &mut [u8],
        tables: &mut Vec<u64>,
    ) {
        let n = job.code_values.len();
        tables.clear();
        for g in 0..self.groups {
            // Without a scale there is one group, so g is also the packed
            // zero points' lane 0.
            let (zero, scale) = (job.zero_at(slice, row, g), job.scale_at(slice, row, g));
            // The operations are exactly `DecodeJob::value`'s: (q − z)·s,
            // then the post scale.
            let value = |c: f32| {
                let q = zero.map_or(c, |z| c - z);
                job.post(scale.map_or(q, |s| q * s))
            };
            if let Ok(codes) = <&[f32; 16]>::try_from(job.code_values.as_slice()) {
                // 4-bit codes: loops over fixed-size arrays the compiler
                // vectorizes (small groups build a table per 16 or 32 values).
                let mut v = [0f32; 16];
                for (v, &c) in v.iter_mut().zip(codes) {
                    *v = value(c);
                }
                let mut t = [0u64; 16];
                match job.out {
                    OutDtype::Bf16 => {
                        for (t, &v) in t.iter_mut().zip(&v) {
                            *t = numerics::f32_to_bf16(v) as u64;
                        }
                    }
                    OutDtype::F16 => {
                        for (t, &v) in t.iter_mut().zip(&v) {
                            *t = numerics::f32_to_f16(v) as u64;
                        }
                    }
                    OutDtype::F32 => {
                        for (t, &v) in t.iter_mut().zip(&v) {
                            *t = numerics::f32_bits(v) as u64;
                        }
                    }
                }
                tables.extend_from_slice(&t);
                continue;
            }
            let values = job.code_values.iter().map(|&c| value(c));
            match job.out {
                OutDtype::Bf16 => tables.extend(values.map(|v| numerics::f32_to_bf16(v) as u64)),
                OutDtype::F16 => tables.extend(values.map(|v| numerics::f32_to_f16(v) as u64)),
                OutDtype::F32 => tables.extend(values.map(|v| numerics::f32_bits(v) as u64)),
            }
        }
        let f = &job.codes;
        match (&job.g_idx, self.byte_packed, f.bits) {
            (None, true, 4) => self.packed_row::<N, 4>(job, slice, row, out, tables),
            (None, true, 8) => self.packed_row::<N, 8>(job, slice, row, out, tables),
            (None, true, 2) => self.packed_row::<N, 2>(job, slice, row, out, tables),
            (None, true, 1) => self.packed_row::<N, 1>(job, slice, row, out, tables),
            (g_idx, _, _) => {
                for (col, o) in out.chunks_exact_mut(N).enumerate() {
                    let g = match g_idx {
                        Some(gi) => gi[col] as usize,
                        None => col / self.group_cols,
                    };
                    let e = tables[g * n + f.get(slice, row, col) as usize];
                    o.copy_from_slice(&e.to_le_bytes()[..N]);
                }
            }
        }
    }

    /// The inner loop for codes packed whole into bytes.
    fn packed_row<const N: usize, const BITS: usize>(
        &self,
        job: &DecodeJob<'_>,
        slice: usize,
        row: usize,
        out: &mut [u8],
        tables: &[u64],
    ) {
        let f = &job.codes;
        let per_byte = 8 / BITS;
        let mask = (1u32 << BITS) - 1;
        // High-first bytes: slot k of a byte holds field per_byte − 1 − k.
        let slot_flip = if f.high_first { per_byte - 1 } else { 0 };
        let cols = out.len() / N;
        let start = ((slice as u64 * f.slice_bits + row as u64 * f.lane_bits) / 8) as usize;
        let bytes = &f.data[start..start + cols.div_ceil(per_byte)];
        let n = 1 << BITS;
        for (g, group_out) in out.chunks_mut(self.group_cols * N).enumerate() {
            let t = &tables[g * n..g * n + n];
            let first = g * self.group_cols;
            let mut done = 0;
            if let (4, true, Ok(t)) = (BITS, first.is_multiple_of(8), <&[u64; 16]>::try_from(t)) {
                let codes = &bytes[first / 2..];
                if N == 2 {
                    // 16 codes per shuffle where the CPU has one.
                    done = shuffle::nibbles_to_16bit(codes, t, group_out, f.high_first);
                }
                // Eight codes per little-endian u32: one load, eight lookups
                // assembled in registers, two (bf16/f16) or four (f32) stores.
                let words = codes[done / 2..].chunks_exact(4);
                let rest = &mut group_out[done * N..];
                for (w, o) in words.zip(rest.chunks_exact_mut(8 * N)) {
                    let mut x = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                    if f.high_first {
                        x = (x >> 4) & 0x0F0F_0F0F | (x & 0x0F0F_0F0F) << 4;
                    }
                    let at = |k: u32| t[((x >> (4 * k)) & 15) as usize];
                    if N == 2 {
                        let lo = at(0) | at(1) << 16 | at(2) << 32 | at(3) << 48;
                        let hi = at(4) | at(5) << 16 | at(6) << 32 | at(7) << 48;
                        o[..8].copy_from_slice(&lo.to_le_bytes());
                        o[8..16].copy_from_slice(&hi.to_le_bytes());
                    } else {
                        for k in 0..4 {
                            let v = at(2 * k) | at(2 * k + 1) << 32;
                            let k = k as usize;
                            o[8 * k..8 * k + 8].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                    done += 8;
                }
            }
            for (i, o) in group_out.chunks_exact_mut(N).enumerate().skip(done) {
                let col = first + i;
                let slot = (col % per_byte) ^ slot_flip;
                let code = (bytes[col / per_byte] as u32 >> (slot * BITS)) & mask;
                o.copy_from_slice(&t[code as usize].to_le_bytes()[..N]);
            }
        }
    }
}

/// Table lookups 16 at a time with a byte shuffle (x86-64 SSSE3), for 4-bit
/// codes and 16-bit outputs: the 16-entry table split into its low and high
/// bytes is one register each, `pshufb` looks up 16 codes at once, and the
/// two results interleave into 16 little-endian outputs. Same bytes as the
/// scalar loop; other CPUs use that loop.
mod shuffle {
    /// Decodes whole 16-code blocks of `codes` (two per byte, low nibble
    /// first, or high nibble first with `high_first`) through `table` into
    /// `out` (2 bytes per output); returns how many outputs were written (0
    /// when the CPU has no SSSE3).
    pub(super) fn nibbles_to_16bit(
        codes: &[u8],
        table: &[u64; 16],
        out: &mut [u8],
        high_first: bool,
    ) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("ssse3") {
                // SAFETY: the CPU has SSSE3 (checked just above).
                return unsafe { x86::nibbles_to_16bit(codes, table, out, high_first) };
            }
        }
        let _ = (codes, table, out, high_first);
        0
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        #[target_feature(enable = "ssse3")]
        pub(super) unsafe fn nibbles_to_16bit(
            codes: &[u8],
            table: &[u64; 16],
            out: &mut [u8],
            high_first: bool,
        ) -> usize {
            let lo: [u8; 16] = std::array::from_fn(|c| table[c] as u8);
            let hi: [u8; 16] = std::array::from_fn(|c| (table[c] >> 8) as u8);
            let blocks = (codes.len() / 8).min(out.len() / 32);
            // SAFETY: every load reads 8 bytes at 8·i < codes.len() - 7 and
            // every store writes 32 bytes at 32·i ≤ out.len() - 32, for
            // i < blocks; unaligned loads and stores are used throughout.
            unsafe {
                let t_lo = _mm_loadu_si128(lo.as_ptr().cast());
                let t_hi = _mm_loadu_si128(hi.as_ptr().cast());
                let nibble = _mm_set1_epi8(0x0F);
                for i in 0..blocks {
                    let b = _mm_loadl_epi64(codes.as_ptr().add(8 * i).cast());
                    let low = _mm_and_si128(b, nibble);
                    let high = _mm_and_si128(_mm_srli_epi16(b, 4), nibble);
                    // Codes in column order: low nibble of byte 0, its high
                    // nibble, low nibble of byte 1, … (high nibble first
                    // for high-first bytes).
                    let idx = if high_first {
                        _mm_unpacklo_epi8(high, low)
                    } else {
                        _mm_unpacklo_epi8(low, high)
                    };
                    let v_lo = _mm_shuffle_epi8(t_lo, idx);
                    let v_hi = _mm_shuffle_epi8(t_hi, idx);
                    let dst = out.as_mut_ptr().add(32 * i);
                    _mm_storeu_si128(dst.cast(), _mm_unpacklo_epi8(v_lo, v_hi));
                    _mm_storeu_si128(dst.add(16).cast(), _mm_unpackhi_epi8(v_lo, v_hi));
                }
            }
            blocks * 16
        }
    }
}

//! Splitting a [`DecodeJob`] into chunks of rows that fit the device, and
//! laying out what each chunk reads in one word buffer (`src` in the shader).

use std::borrow::Cow;
use std::ops::Range;

use super::kernels::Kernel;
use super::protocol::{
    code_offset, product_kind, GridKind, GridParams, LowRankMode, OutKind, Params, SparseMode,
    StreamParams, ZeroMode, NO_G_IDX, WORKGROUP,
};
use crate::error::{Error, Result, Rule};
use crate::job::{DecodeJob, Dims, Fields, Starts, ValueKind, Values, ZeroPoint};

/// Output bytes one chunk produces at most: big enough to keep the device
/// busy, small enough that a writer call (64 MiB) spans several chunks, so
/// upload, compute and readback of successive chunks overlap.
pub(in crate::backend::gpu) const OUT_CAP: u64 = 16 << 20;

/// Input bytes one chunk binds at most. Bit positions inside `src` must fit
/// a u32 (2^32 bits = 512 MiB), so this stays well below that.
pub(in crate::backend::gpu) const SRC_CAP: u64 = 256 << 20;

/// What the device allows.
#[derive(Debug, Clone, Copy)]
pub(in crate::backend::gpu) struct Limits {
    /// Largest storage binding (and buffer) in bytes.
    pub max_binding: u64,
    /// Alignment of a storage binding's offset.
    pub offset_align: u64,
    /// Invocations per workgroup.
    pub workgroup: u32,
    /// Largest workgroup count per dispatch dimension.
    pub max_groups_per_dim: u32,
    /// Output bytes a chunk aims at: [`OUT_CAP`] when decoding.
    pub chunk_out: u64,
}

impl Limits {
    /// Output bytes one chunk may produce: `chunk_out` within a binding,
    /// less room for a start inside a larger buffer, which a binding reaches
    /// from the aligned offset below it.
    fn out_cap(&self) -> u64 {
        self.max_binding
            .min(self.chunk_out)
            .saturating_sub(self.offset_align)
    }

    /// The limits of chunks that stay resident for products, which write
    /// y, never W: as many rows as their packs' binding holds, so that
    /// packs along the inputs (GPTQ, AutoAWQ), whose every chunk binds the
    /// words of all its inputs, are uploaded once, not once per chunk.
    pub(in crate::backend::gpu) fn resident(self) -> Limits {
        Limits {
            chunk_out: u64::MAX,
            ..self
        }
    }

    /// The limits of a wgpu device.
    pub(in crate::backend::gpu) fn of(l: &wgpu::Limits) -> Limits {
        Limits {
            // Whole words only: buffers and bindings are sized in u32s.
            max_binding: l.max_storage_buffer_binding_size.min(l.max_buffer_size) & !3,
            offset_align: (l.min_storage_buffer_offset_alignment as u64).max(4),
            workgroup: WORKGROUP
                .min(l.max_compute_invocations_per_workgroup)
                .min(l.max_compute_workgroup_size_x)
                .max(1),
            max_groups_per_dim: l.max_compute_workgroups_per_dimension.max(1),
            chunk_out: OUT_CAP,
        }
    }
}

/// One piece of `src`: bytes placed at a 4-byte aligned offset.
#[derive(Debug)]
pub(in crate::backend::gpu) struct Region<'a> {
    /// Byte offset in `src`.
    pub offset: u64,
    /// The bytes (a tensor range, or a table built on the host).
    pub bytes: Cow<'a, [u8]>,
}

/// One dispatch: rows `rows` of the job.
#[derive(Debug)]
pub(in crate::backend::gpu) struct Chunk<'a> {
    /// Flat rows (over all slices) this chunk decodes.
    pub rows: Range<usize>,
    /// The uniform block.
    pub params: Params,
    /// What to upload into `src`.
    pub regions: Vec<Region<'a>>,
    /// Bytes of `src` in use (multiple of 4).
    pub src_len: u64,
    /// Output bytes the chunk produces (elements · dtype size).
    pub out_len: u64,
    /// Output words the shader writes.
    pub out_words: u64,
    /// Workgroups in x and y.
    pub groups: (u32, u32),
    /// The kernel that decodes it.
    pub kernel: Kernel,
}

/// Builds `src` region by region.
#[derive(Default)]
struct Src<'a> {
    regions: Vec<Region<'a>>,
    len: u64,
}

impl<'a> Src<'a> {
    /// Appends `bytes`; returns their byte offset.
    fn push(&mut self, bytes: Cow<'a, [u8]>) -> u64 {
        let offset = self.len;
        self.len += (bytes.len() as u64).div_ceil(4) * 4;
        self.regions.push(Region { offset, bytes });
        offset
    }

    /// Appends f32 values; returns their word index.
    fn push_f32(&mut self, v: &[f32]) -> u32 {
        (self.push(Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect())) / 4) as u32
    }

    /// Appends bits `lo..hi` of `f` (widened to whole aligned words).
    fn push_fields(&mut self, f: &'a Fields<'_>, lo: u64, hi: u64) -> StreamParams {
        let start = (lo / 8) & !3;
        let end = hi.div_ceil(8).min(f.data.len() as u64).max(start);
        let offset = self.push(Cow::Borrowed(&f.data[start as usize..end as usize]));
        let (part_lanes, part_down, top) = f
            .parts
            .map_or((0, 0, 0), |p| (p.lanes as u32, p.down as u32, p.top as u32));
        StreamParams {
            bits: f.bits,
            per_word: f.per_word,
            // Wrapping on purpose: the shader's u32 arithmetic is mod 2^32 and
            // every position it ends up with is small (see SRC_CAP).
            lane_bits: f.lane_bits as u32,
            word_bits: f.word_bits as u32,
            slice_bits: f.slice_bits as u32,
            base: ((offset * 8).wrapping_sub(start * 8) as u32).wrapping_add(top),
            part_lanes,
            part_down,
            interleave: f.interleaved as u32,
            swap: f.swap_mask() as u32,
            ..StreamParams::in_blocks(f.blocks.as_ref())
        }
    }

    /// Appends entries `lo..hi` of `v` (widened to whole aligned words).
    fn push_values(&mut self, v: &'a Values<'_>, dims: Dims, lo: usize, hi: usize) -> GridParams {
        let size = v.kind.size() as u64;
        let start = (lo as u64 * size) & !3;
        let end = (hi as u64 * size).min(v.data.len() as u64).max(start);
        let offset = self.push(Cow::Borrowed(&v.data[start as usize..end as usize]));
        let kind = GridKind::of(v);
        let mut nested = (0, NO_G_IDX, OutKind::F32);
        let (table, outer, per_outer, add) = match &v.kind {
            ValueKind::Table(t) => (self.push_f32(&t[..]), 0, 0, 0.0),
            ValueKind::Nested(n) => {
                let per = n.per_outer.max(1);
                // The factors entries lo..hi read; all of them where they
                // cycle or come with addends (whose word index is then
                // never the sentinel).
                let whole = n.cycle != 0 || !n.adds.is_empty();
                let first = if whole { 0 } else { lo / per };
                let last = hi.div_ceil(per).min(n.outer.len());
                let last = if whole { n.outer.len() } else { last };
                let table = self.push_f32(&n.table[..]);
                let at = self.push_f32(n.outer.get(first..last.max(first)).unwrap_or(&[]));
                if !n.adds.is_empty() {
                    let adds = n.adds.get(first..last.max(first)).unwrap_or(&[]);
                    nested.1 = self.push_f32(adds).wrapping_sub(first as u32);
                }
                nested.0 = n.cycle as u32;
                nested.2 = OutKind::of(n.round);
                (table, at.wrapping_sub(first as u32), per as u32, n.offset)
            }
            _ => (0, 0, 0, 0.0),
        };
        GridParams {
            kind: kind as u32,
            size: size as u32,
            // Divisors at least the row/column count give quotient 0 either
            // way; clamping keeps them exact in u32.
            row_div: v.grid.row_div.min(dims.rows) as u32,
            col_div: v.grid.col_div.min(dims.cols) as u32,
            row_stride: v.grid.row_stride as u32,
            slice_stride: v.grid.slice_stride as u32,
            base: offset.wrapping_sub(start) as u32,
            table,
            outer,
            per_outer,
            offset: add,
            cycle: nested.0,
            adds: nested.1,
            round: nested.2 as u32,
            spare: 0,
            _pad: 0,
        }
    }
}

/// A sparse job's part of [`Params`].
#[derive(Default)]
struct SparseParams {
    mode: u32,
    block: u32,
    step: u32,
    per_block: u32,
    starts: u32,
    row0: u32,
}

fn too_big(detail: String) -> Error {
    Error::bare(Rule::Gpu, detail)
}

/// Grid entries rows `(s0, r0)..=(s1, r1)` read.
fn grid_range(
    v: &Values<'_>,
    cols: usize,
    (s0, r0): (usize, usize),
    (s1, r1): (usize, usize),
) -> (usize, usize) {
    let last_group = (cols - 1) / v.grid.col_div;
    let lo = v.grid.index(s0, r0, 0);
    let hi = v.grid.index(s1, r1, last_group) + 1;
    (lo.min(v.len()), hi.min(v.len()).max(lo.min(v.len())))
}

/// The chunk for flat rows `f0..f1`, or `None` when it exceeds the limits.
fn chunk<'a>(
    job: &'a DecodeJob<'_>,
    kernel: Kernel,
    f0: usize,
    f1: usize,
    limits: &Limits,
) -> Option<Chunk<'a>> {
    let d = job.dims;
    // The stored rows this chunk reads, first and last as (slice, row): a
    // transposed chunk reads every stored row of its slices.
    let sd = job.stored_dims();
    let (first, last) = if job.transposed {
        ((f0 / d.rows, 0), ((f1 - 1) / d.rows, sd.rows - 1))
    } else {
        (
            (f0 / d.rows, f0 % d.rows),
            ((f1 - 1) / d.rows, (f1 - 1) % d.rows),
        )
    };
    let mut src = Src::default();
    // Whole tables for the fast kernels, which load 16 or 256 entries
    // (codes in blocks are read as 4- or 8-bit fields).
    let table_len = match job.code_values.len() {
        n if n <= 16 => 16,
        n => n.max(256),
    };
    let mut table = job.code_values.to_vec();
    table.resize(table_len, 0.0);
    let code_table = src.push_f32(&table);
    let gidx = match &job.g_idx {
        Some(g) => {
            (src.push(Cow::Owned(g.iter().flat_map(|x| x.to_le_bytes()).collect())) / 4) as u32
        }
        None => NO_G_IDX,
    };
    let (codes, mask, sparse) = match &job.sparse {
        None => {
            // Lowest start to highest end: lanes sharing words (HQQ's
            // slices and parts) do not advance through the stream.
            let (lo, hi) = job.codes.span(first, last, sd.rows, sd.cols)?;
            let none = SparseParams {
                mode: SparseMode::None as u32,
                ..Default::default()
            };
            (
                src.push_fields(&job.codes, lo, hi),
                StreamParams::default(),
                none,
            )
        }
        Some(sp) => {
            // The kept codes of the chunk's rows, their bits of the mask
            // and (unstructured) their blocks' starts.
            let bits = job.codes.bits as u64;
            let (k0, k1) = (sp.start(first.1, 0), sp.start(last.1 + 1, 0));
            let codes = src.push_fields(&job.codes, k0.checked_mul(bits)?, k1.checked_mul(bits)?);
            let lo = sp.mask.lane_start(0, first.1)?;
            let hi = sp.mask.lane_end(0, last.1, sd.cols)?;
            let mask = src.push_fields(&sp.mask, lo, hi);
            let params = match &sp.starts {
                Starts::Fixed { per_row, per_block } => SparseParams {
                    mode: SparseMode::Fixed as u32,
                    block: sp.block as u32,
                    step: *per_row as u32,
                    per_block: *per_block as u32,
                    ..Default::default()
                },
                Starts::Table { blocks, at } => {
                    let rows = at.get(first.1 * blocks..(last.1 + 1) * blocks)?;
                    let words: Vec<u8> = rows
                        .iter()
                        .flat_map(|&k| (k as u32).to_le_bytes())
                        .collect();
                    SparseParams {
                        mode: SparseMode::Table as u32,
                        block: sp.block as u32,
                        step: *blocks as u32,
                        per_block: 0,
                        starts: (src.push(Cow::Owned(words)) / 4) as u32,
                        row0: first.1 as u32,
                    }
                }
            };
            (codes, mask, params)
        }
    };

    let zero_mode = ZeroMode::of_job(job);
    let (zero, zgrid) = match (&job.zero, &job.offset) {
        (None, Some(v)) => {
            let (lo, hi) = grid_range(v, sd.cols, first, last);
            (StreamParams::default(), src.push_values(v, sd, lo, hi))
        }
        // One grid for both: no format has both.
        (Some(_), Some(_)) => return None,
        (zero, None) => match zero {
            None => (StreamParams::default(), GridParams::default()),
            Some(ZeroPoint::Packed { fields }) => {
                // Lanes are column groups; the rows of this chunk are a word range
                // of every lane, so take whole words from the first to the last.
                let (w0, _) = fields.locate(first.1);
                let (w1, _) = fields.locate(last.1);
                let lo = fields.lane_start(first.0, 0)? + w0 * fields.word_bits;
                let hi = fields.lane_start(last.0, 0)? + (w1 + 2) * fields.word_bits;
                (src.push_fields(fields, lo, hi), GridParams::default())
            }
            Some(ZeroPoint::PackedAlongCols { fields }) => {
                let lo = fields.lane_start(first.0, job.zero_lane(first.1))?;
                let hi = fields.lane_end(last.0, job.zero_lane(last.1), sd.cols)?;
                (src.push_fields(fields, lo, hi), GridParams::default())
            }
            Some(ZeroPoint::Plain(v)) => {
                let (lo, hi) = grid_range(v, sd.cols, first, last);
                (StreamParams::default(), src.push_values(v, sd, lo, hi))
            }
        },
    };
    let (has_scale, sgrid) = match &job.scale {
        None => (0, GridParams::default()),
        Some(v) => {
            let (lo, hi) = grid_range(v, sd.cols, first, last);
            (1, src.push_values(v, sd, lo, hi))
        }
    };

    // The low-rank branch: this chunk's rows of `up`, all of `down` and of
    // the smoothing reciprocals.
    let lr_mode = LowRankMode::of(job.low_rank.as_ref());
    let (lr_rank, lr_up, lr_down, lr_smooth) = match &job.low_rank {
        None => (0, 0, 0, 0),
        Some(lr) => (
            lr.rank as u32,
            src.push_f32(lr.up.get(f0 * lr.rank..f1 * lr.rank)?),
            src.push_f32(&lr.down),
            src.push_f32(&lr.inv_smooth),
        ),
    };

    let elems = ((f1 - f0) * d.cols) as u64;
    let out_kind = OutKind::of(job.out);
    let out_words = if out_kind == OutKind::F32 {
        elems
    } else {
        elems.div_ceil(2)
    };
    let (groups, words_per_row) = match kernel {
        Kernel::Generic => (out_words.div_ceil(limits.workgroup as u64), 0),
        Kernel::Fast(k) => {
            let per_row = d.cols.div_ceil((32 / k.bits) as usize) as u64;
            let invocations = (f1 - f0) as u64 * per_row.div_ceil(k.words as u64);
            (invocations.div_ceil(limits.workgroup as u64), per_row)
        }
        Kernel::Tile(k) => {
            // One workgroup per tile; transposed tiles start on a code word.
            let (tr, tc) = k.size();
            let lead = k.lead(f0 % d.rows);
            let tiles =
                ((f1 - f0 + lead) as u64).div_ceil(tr as u64) * (d.cols as u64).div_ceil(tc as u64);
            (tiles, 0)
        }
    };
    let code_offset = code_offset(job);
    let x = groups.min(limits.max_groups_per_dim as u64).max(1);
    let y = groups.div_ceil(x).max(1);
    let src_cap = limits.max_binding.min(SRC_CAP);
    if src.len > src_cap || out_words * 4 > limits.out_cap() || y > limits.max_groups_per_dim as u64
    {
        return None;
    }
    let params = Params {
        rows: d.rows as u32,
        cols: d.cols as u32,
        first_row: f0 as u32,
        elems: elems as u32,
        out_kind: out_kind as u32,
        zero_mode: zero_mode as u32,
        has_scale,
        gidx,
        code_table,
        row_threads: x as u32 * limits.workgroup,
        lr_mode: lr_mode as u32,
        lr_rank,
        lr_up,
        lr_down,
        lr_smooth,
        zero_bits: 0,
        words_per_row: words_per_row as u32,
        fast_rows: (f1 - f0) as u32,
        code_offset,
        // The output's slice and row of f0 (a transposed chunk reads from
        // stored row 0 of its slices on).
        slice0: (f0 / d.rows) as u32,
        row0: (f0 % d.rows) as u32,
        out_base: 0,
        transposed: job.transposed as u32,
        post_scale: job.post_scale.unwrap_or(1.0),
        product: product_kind(job) as u32,
        sp_mode: sparse.mode,
        sp_block: sparse.block,
        sp_step: sparse.step,
        sp_per_block: sparse.per_block,
        sp_starts: sparse.starts,
        sp_row0: sparse.row0,
        lr_period: job
            .low_rank
            .as_ref()
            .map_or(1, |lr| lr.period.max(1) as u32),
        lr_row_div: job
            .low_rank
            .as_ref()
            .map_or(1, |lr| lr.row_div.max(1) as u32),
        pad0: 0,
        pad1: 0,
        pad2: 0,
        codes,
        zero,
        mask,
        zgrid,
        sgrid,
    };
    Some(Chunk {
        rows: f0..f1,
        params,
        regions: src.regions,
        src_len: src.len.max(4),
        out_len: elems * job.out.size() as u64,
        out_words,
        groups: (x as u32, y as u32),
        kernel,
    })
}

/// Splits rows `rows` of `job` into chunks that fit `limits`. Every chunk but
/// the last produces a multiple of 4 output bytes, so chunk outputs can be
/// copied back to back into one buffer.
pub(in crate::backend::gpu) fn plan<'a>(
    job: &'a DecodeJob<'_>,
    kernel: Kernel,
    rows: Range<usize>,
    limits: &Limits,
) -> Result<Vec<Chunk<'a>>> {
    let d = job.dims;
    if rows.is_empty() || d.cols == 0 {
        return Ok(Vec::new());
    }
    if u32::try_from(d.total_rows()).is_err() || d.cols >= 1 << 28 {
        return Err(too_big(format!(
            "{}x{} is beyond the GPU path's u32 indexing",
            d.total_rows(),
            d.cols
        )));
    }
    let row_out = (d.cols * job.out.size()) as u64;
    // Rows per chunk must keep chunk outputs word-aligned (rows are 2 or 4
    // bytes per element, so two rows always are).
    let unit = if row_out.is_multiple_of(4) { 1 } else { 2 };
    let fit = (limits.out_cap() / row_out) as usize;
    let mut per = (fit / unit * unit).max(unit);
    // Whole tiles, where they fit.
    if let Kernel::Tile(k) = kernel {
        let rows = k.size().0 as usize;
        if per >= rows {
            per = per / rows * rows;
        }
    }
    let mut chunks = Vec::new();
    let mut f = rows.start;
    while f < rows.end {
        let n = per.min(rows.end - f);
        match chunk(job, kernel, f, f + n, limits) {
            Some(c) => {
                chunks.push(c);
                f += n;
            }
            None if n > unit => per = (n / 2 / unit * unit).max(unit),
            None => {
                return Err(too_big(format!(
                    "{n} rows of {} columns do not fit this adapter's {} byte storage binding",
                    d.cols, limits.max_binding
                )))
            }
        }
    }
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::super::job;
    use super::*;
    use crate::numerics::OutDtype;

    /// A device of `max_binding` bytes a binding and `max_groups_per_dim`
    /// workgroups a dimension, the other limits common.
    fn limits(max_binding: u64, max_groups_per_dim: u32) -> Limits {
        Limits {
            max_binding,
            offset_align: 256,
            workgroup: WORKGROUP,
            max_groups_per_dim,
            chunk_out: OUT_CAP,
        }
    }

    #[test]
    fn chunks_cover_rows_within_limits() {
        let (rows, cols): (usize, usize) = (1000, 33);
        let data = vec![0u8; rows * (cols * 4).div_ceil(32) * 4];
        let scale = vec![0u8; rows * 2];
        let j = job(&data, &scale, rows, cols, OutDtype::Bf16);
        let chunks = plan(&j, Kernel::Generic, 0..rows, &limits(4096, 3)).unwrap();
        let mut next = 0;
        for c in &chunks {
            assert_eq!(c.rows.start, next);
            next = c.rows.end;
            assert!(c.src_len <= 4096 && c.out_words * 4 <= 4096 - 256);
            assert!(c.groups.0 <= 3 && c.groups.1 <= 3);
            if c.rows.end != rows {
                assert_eq!(c.out_len % 4, 0, "odd bf16 counts only in the last chunk");
            }
            for r in &c.regions {
                assert_eq!(r.offset % 4, 0);
            }
        }
        assert_eq!(next, rows);
        assert!(chunks.len() > 1);
    }

    #[test]
    fn a_row_too_wide_is_an_error_not_a_panic() {
        let (rows, cols) = (2, 4096);
        let data = vec![0u8; rows * cols / 2];
        let scale = vec![0u8; rows * 2];
        let j = job(&data, &scale, rows, cols, OutDtype::F32);
        let e = plan(&j, Kernel::Generic, 0..rows, &limits(1024, 65535)).unwrap_err();
        assert_eq!(e.rule, Rule::Gpu);
    }
}

//! Transposed and strided jobs that [`super::rows`] does not take —
//! GPT-OSS's experts, whose scale changes with every output column (a
//! stored row), codes of other widths — decoded a tile at a time: the
//! tile's codes are read in memory order (whole cache lines of stored
//! rows), each looked up in a code table of its entry.
//!
//! An entry (zero point and scale) is constant over blocks of stored rows
//! (`rows_per_key`) and of stored columns (`cols_per_key`, or g_idx's
//! groups); a tile builds one table per block it touches, from a stored
//! element of that block, with exactly the operations `DecodeJob::value`
//! performs, so the bytes are the element path's.

use super::simd;
use super::table::{ByScale, Shifted, Table16};
use crate::job::{gcd, DecodeJob, ZeroPoint};
use crate::numerics::{self, OutDtype};

/// Output elements one thread task decodes at least.
const TASK_ELEMENTS: usize = 1 << 16;

/// How a stored column's entry is found.
#[derive(Debug, Clone, Copy)]
enum ColKey {
    /// Columns `k·d .. (k+1)·d` share an entry (`usize::MAX`: all of them).
    Div(usize),
    /// Column `j` is in group `g_idx[j]`.
    GIdx,
}

/// How a tile's codes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// One field at a time (any layout).
    Fields,
    /// Transposed, 4-bit codes two to a byte, each stored row starting on a
    /// byte: a stored row's run of the tile is a run of bytes.
    Nibbles,
}

/// The tiled decoding of one job.
#[derive(Debug)]
pub(super) struct Tiles {
    /// Stored rows sharing an entry (`usize::MAX`: all of them).
    rows_per_key: usize,
    cols_per_key: ColKey,
    /// Output rows and columns of a tile.
    tile_rows: usize,
    tile_cols: usize,
    fill: Fill,
    /// The job's tables by scale byte, when it has so few.
    by_scale: Option<ByScale>,
    /// Those tables as shifts of one, where they are.
    shifted: Option<Shifted>,
    /// The instructions every kernel of the job may use, read once.
    isa: simd::Isa,
}

impl Tiles {
    /// The tiling of a transposed or strided job, when its entries span
    /// enough elements to pay for their tables (or its tables are by scale
    /// byte, [`ByScale`]); the kernels use the instructions of `isa`.
    pub(super) fn of(job: &DecodeJob<'_>, isa: simd::Isa) -> Option<Tiles> {
        let f = &job.codes;
        // Jobs with a post scale (LLM.int8) are straight rows; tiles are
        // not measured for them.
        if job.low_rank.is_some()
            || job.post_scale.is_some()
            || job.offset.is_some()
            || job.sparse.is_some()
            || f.blocks.is_some()
            || !(job.transposed || f.word_bits != 32)
        {
            return None;
        }
        let stored = job.stored_dims();
        // Stored rows sharing every component's entry: the gcd of their
        // row divisors (0 while no component depends on the row).
        let mut rows = 0;
        let mut cols = 0;
        if let Some(s) = &job.scale {
            rows = gcd(rows, s.grid.row_div);
            cols = gcd(cols, s.grid.col_div);
            if s.grid.row_div == 0 || s.grid.col_div == 0 {
                return None;
            }
        }
        let mut along_cols = false;
        match &job.zero {
            Some(ZeroPoint::Plain(z)) => {
                if z.grid.row_div == 0 || z.grid.col_div == 0 {
                    return None;
                }
                rows = gcd(rows, z.grid.row_div);
                cols = gcd(cols, z.grid.col_div);
            }
            // Lane = row, read on the scale's column groups.
            Some(ZeroPoint::Packed { .. }) => rows = 1,
            // Lane = the scale's row group, index = column.
            Some(ZeroPoint::PackedAlongCols { .. }) => along_cols = true,
            None => {}
        }
        let by_col = job.scale.is_some() || matches!(job.zero, Some(ZeroPoint::Plain(_)));
        let cols_per_key = if along_cols {
            ColKey::Div(1)
        } else if job.g_idx.is_some() && by_col {
            ColKey::GIdx
        } else if cols == 0 {
            ColKey::Div(usize::MAX)
        } else {
            ColKey::Div(cols)
        };
        let rows_per_key = if rows == 0 { usize::MAX } else { rows };
        // Elements per entry, at least twice a table.
        let key_cols = match cols_per_key {
            ColKey::Div(d) => d.min(stored.cols),
            ColKey::GIdx => {
                let groups = job
                    .g_idx
                    .as_ref()?
                    .iter()
                    .max()
                    .map_or(1, |&m| m as usize + 1);
                stored.cols / groups
            }
        };
        // Tables by scale byte cost nothing per entry.
        let by_scale = ByScale::of(isa, job);
        if by_scale.is_none()
            && rows_per_key.min(stored.rows).saturating_mul(key_cols) < 2 * job.code_values.len()
        {
            return None;
        }
        // High-first bytes are read field by field.
        let whole_bytes = f.lane_bits.is_multiple_of(8)
            && f.slice_bits.is_multiple_of(8)
            && !f.high_first
            && f.parts.is_none();
        let dense4 = f.bits == 4 && (f.per_word == 0 || f.per_word == 8 && !f.interleaved);
        let fill = if job.transposed && f.word_bits == 32 && whole_bytes && dense4 {
            Fill::Nibbles
        } else {
            Fill::Fields
        };
        // Transposed: 256 stored columns (128 bytes of 4-bit codes, a pair
        // of lines the hardware fetches together) of 128 stored rows. Strided: 64 rows' words (four cache lines) of 1024
        // columns (fewer pages at once than more rows), or 16 whole rows
        // when g_idx scatters the groups.
        let (tile_rows, tile_cols) = match (job.transposed, cols_per_key) {
            (true, _) => (256, 128),
            (false, ColKey::GIdx) => (16, job.dims.cols.max(1)),
            (false, ColKey::Div(_)) => (64, 1024),
        };
        let shifted = match (&by_scale, fill, cols_per_key) {
            (Some(by), Fill::Nibbles, ColKey::Div(d))
                if d.is_multiple_of(32) && f.lane_bits.is_multiple_of(8) =>
            {
                by.shifted(job.out.size())
            }
            _ => None,
        };
        // Shifted blocks: 256 columns, two blocks' runs of each row written
        // one after the other.
        let tile_cols = if shifted.is_some() { 256 } else { tile_cols };
        Some(Tiles {
            rows_per_key,
            cols_per_key,
            tile_rows,
            tile_cols,
            fill,
            by_scale,
            shifted,
            isa,
        })
    }

    /// Output rows one task decodes: whole tiles, at least `TASK_ELEMENTS`.
    pub(super) fn rows_per_task(&self, cols: usize) -> usize {
        TASK_ELEMENTS
            .div_ceil(cols.max(1))
            .next_multiple_of(self.tile_rows)
    }

    /// Decodes flat output rows `rows` into `out` (theirs exactly).
    pub(super) fn decode(
        &self,
        job: &DecodeJob<'_>,
        rows: std::ops::Range<usize>,
        out: &mut [u8],
        scratch: &mut Scratch,
    ) {
        let per_slice = job.dims.rows;
        let row_bytes = job.dims.cols * job.out.size();
        let mut flat = rows.start;
        while flat < rows.end {
            let (slice, r0) = (flat / per_slice, flat % per_slice);
            let band_end = ((r0 / self.tile_rows + 1) * self.tile_rows).min(per_slice);
            let r1 = band_end.min(r0 + rows.end - flat);
            let at = (flat - rows.start) * row_bytes;
            let band = &mut out[at..at + (r1 - r0) * row_bytes];
            // Shifted blocks write whole 64-byte registers: the first tile
            // ends where rows' lines start (when every row starts at the same
            // place in a line), so that no store splits a line.
            let size = job.out.size();
            let lead = match (
                &self.shifted,
                row_bytes % 64,
                (64 - band.as_ptr() as usize % 64) % 64,
            ) {
                (Some(_), 0, skew) if skew % size == 0 => skew / size,
                _ => 0,
            };
            let mut c0 = 0;
            while c0 < job.dims.cols {
                let c1 = if c0 == 0 && lead > 0 {
                    lead
                } else {
                    c0 + self.tile_cols
                }
                .min(job.dims.cols);
                match job.out.size() {
                    2 => self.tile::<2>(job, slice, r0..r1, c0..c1, band, scratch),
                    _ => self.tile::<4>(job, slice, r0..r1, c0..c1, band, scratch),
                }
                c0 = c1;
            }
            flat += r1 - r0;
        }
    }

    /// Decodes output rows `rows` × columns `cols` of `slice` into `band`
    /// (the rows' whole output).
    fn tile<const N: usize>(
        &self,
        job: &DecodeJob<'_>,
        slice: usize,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
        band: &mut [u8],
        s: &mut Scratch,
    ) {
        if let (Some(sh), Some(by), Some(scale)) = (&self.shifted, &self.by_scale, &job.scale) {
            // The scale byte of output row r and column ci of the tile:
            // each lane's first, then one per scale group of rows.
            s.lane_base.clear();
            s.lane_base
                .extend(cols.clone().map(|i| scale.grid.index(slice, i, 0)));
            s.row_off.clear();
            s.row_off
                .extend(rows.clone().map(|j| (j / scale.grid.col_div) as u32));
            let (base, group) = (&s.lane_base, &s.row_off);
            let byte = |r: usize, ci: usize| scale.data[base[ci] + group[r] as usize];
            let table = |r: usize, ci: usize| by.byte(byte(r, ci));
            self.shifted_blocks::<N>(
                job,
                slice,
                (&rows, &cols),
                (band, &mut s.codes),
                (sh, byte, table),
            );
            return;
        }
        let n = job.code_values.len();
        // Stored rows (lanes) and stored columns of the tile.
        let (lanes, index) = if job.transposed {
            (cols.clone(), rows.clone())
        } else {
            (rows.clone(), cols.clone())
        };
        // Lane keys: blocks of `rows_per_key`, numbered from the first.
        let key = |i: usize| i / self.rows_per_key;
        let (k0, k1) = (key(lanes.start), key(lanes.end - 1));
        let lane_keys = k1 - k0 + 1;
        s.lane_rep.clear();
        s.lane_rep
            .extend((k0..=k1).map(|k| k.saturating_mul(self.rows_per_key).max(lanes.start)));
        // Column keys.
        s.col_rep.clear();
        s.col_base.clear();
        match self.cols_per_key {
            ColKey::Div(d) => {
                let (g0, g1) = (index.start / d, (index.end - 1) / d);
                s.col_rep
                    .extend((g0..=g1).map(|g| Some(g.saturating_mul(d).max(index.start))));
                s.col_base
                    .extend(index.clone().map(|j| (j / d - g0) as u32));
            }
            ColKey::GIdx => {
                let g_idx = job.g_idx.as_deref().unwrap_or(&[]);
                let groups = &g_idx[index.clone()];
                let g0 = groups.iter().copied().min().unwrap_or(0);
                let g1 = groups.iter().copied().max().unwrap_or(0);
                s.col_rep.resize((g1 - g0) as usize + 1, None);
                for (j, &g) in index.clone().zip(groups) {
                    s.col_rep[(g - g0) as usize].get_or_insert(j);
                    s.col_base.push(g - g0);
                }
            }
        }
        // Transposed nibbles whose tables change from column to column but
        // hold down runs of stored columns (GPT-OSS's 32 inputs): decoded
        // in stored order, written transposed.
        let stored_order = matches!((self.fill, self.cols_per_key, n), (Fill::Nibbles, ColKey::Div(d), 16)
            if self.rows_per_key < 16 && d >= 16 && d.is_multiple_of(2) && rows.start.is_multiple_of(2));
        if let (true, Some(by), Some(scale), ColKey::Div(_)) =
            (stored_order, &self.by_scale, &job.scale, self.cols_per_key)
        {
            // Scale bytes: each lane's first, then one per d output rows
            // (the scale's column groups, which d divides).
            s.lane_base.clear();
            s.lane_base.extend(
                lanes
                    .clone()
                    .map(|i| job.scale_index(slice, i, 0).unwrap_or(0)),
            );
            let per = scale.grid.col_div.max(1);
            s.row_off.clear();
            s.row_off.extend(rows.clone().map(|j| (j / per) as u32));
            let (bytes, base, group) = (&scale.data[..], &s.lane_base, &s.row_off);
            let table = |r: usize, ci: usize| by.byte(bytes[base[ci] + group[r] as usize]);
            self.stored_order::<N>(job, slice, (&rows, &cols), band, table);
            return;
        }
        let col_keys = s.col_rep.len();
        // The tables, lane key major.
        s.tables.resize(lane_keys * col_keys * n, 0);
        for (ki, &i) in s.lane_rep.iter().enumerate() {
            for (kj, j) in s.col_rep.iter().enumerate() {
                if let Some(j) = *j {
                    let at = (ki * col_keys + kj) * n;
                    let t = &mut s.tables[at..at + n];
                    if let (Some(by), Ok(t)) = (&self.by_scale, <&mut [u32; 16]>::try_from(&mut *t))
                    {
                        *t = by.at(job, job.scale_index(slice, i, j).unwrap_or(0)).values;
                        continue;
                    }
                    let (zero, scale) = job.zero_and_scale(slice, i, j);
                    fill_table(job, zero, scale, t);
                }
            }
        }
        // Offsets of each output row and column into the tables.
        let (tr, tc) = (rows.len(), cols.len());
        s.row_off.clear();
        s.col_off.clear();
        let lane_off = |i: usize| ((key(i) - k0) * col_keys * n) as u32;
        let n32 = n as u32;
        if job.transposed {
            s.row_off.extend(s.col_base.iter().map(|&k| k * n32));
            s.col_off.extend(lanes.clone().map(lane_off));
        } else {
            s.row_off.extend(lanes.clone().map(lane_off));
            s.col_off.extend(s.col_base.iter().map(|&k| k * n32));
        }
        // Runs of columns sharing a table.
        s.runs.clear();
        let mut a = 0;
        for c in 1..=tc {
            if c == tc || s.col_off[c] != s.col_off[a] {
                s.runs.push((a, c));
                a = c;
            }
        }
        let row_bytes = job.dims.cols * N;
        if stored_order {
            s.t16.clear();
            s.t16.extend(s.tables.chunks_exact(16).map(|t| {
                let values: [u32; 16] = std::array::from_fn(|k| t[k]);
                Table16 {
                    values,
                    planes: simd::planes(self.isa, &values),
                }
            }));
            let (t16, row_off, col_off) = (&s.t16, &s.row_off, &s.col_off);
            let table = |r: usize, ci: usize| &t16[(row_off[r] + col_off[ci]) as usize / 16];
            self.stored_order::<N>(job, slice, (&rows, &cols), band, table);
            return;
        }
        s.codes.resize(tr * tc, 0);
        self.fill(job, slice, (&rows, &cols), &mut s.codes);
        for (ri, (&ro, codes)) in s.row_off.iter().zip(s.codes.chunks_exact(tc)).enumerate() {
            let at = ri * row_bytes + cols.start * N;
            let dst = &mut band[at..at + tc * N];
            for &(a, b) in &s.runs {
                let t = (ro + s.col_off[a]) as usize;
                let t = &s.tables[t..t + n];
                let (codes, dst) = (&codes[a..b], &mut dst[a * N..b * N]);
                for (o, &code) in dst.chunks_exact_mut(N).zip(codes) {
                    o.copy_from_slice(&t[code as usize].to_le_bytes()[..N]);
                }
            }
        }
    }

    /// Decodes a transposed tile of nibbles whose tables by scale byte are
    /// shifts of one ([`Shifted`]) in blocks of 32 rows (a scale group's,
    /// or part of one) × 128 columns through [`simd::shifted_block`], the
    /// rest (and blocks with a byte that is no shift) as
    /// [`Tiles::stored_order`] does.
    fn shifted_blocks<'t, const N: usize>(
        &self,
        job: &DecodeJob<'_>,
        slice: usize,
        (rows, cols): (&std::ops::Range<usize>, &std::ops::Range<usize>),
        (band, codes): (&mut [u8], &mut Vec<u8>),
        (sh, byte, table): (
            &Shifted,
            impl Fn(usize, usize) -> u8,
            impl Fn(usize, usize) -> &'t Table16,
        ),
    ) {
        let f = &job.codes;
        let row_bytes = job.dims.cols * N;
        let (tr, tc) = (rows.len(), cols.len());
        // Whole blocks: rows from the first multiple of 32, columns from the first.
        let r0 = (rows.start.next_multiple_of(32) - rows.start).min(tr);
        let r1 = r0 + (tr - r0) / 32 * 32;
        let c1 = tc / 128 * 128;
        // A part of the tile, decoded as `stored_order` does.
        let rest = |band: &mut [u8], (ra, rb): (usize, usize), (ca, cb): (usize, usize)| {
            if ra < rb && ca < cb {
                let (sub_rows, sub_cols) = (
                    rows.start + ra..rows.start + rb,
                    cols.start + ca..cols.start + cb,
                );
                let table = |r: usize, ci: usize| table(r + ra, ci + ca);
                self.stored_order::<N>(
                    job,
                    slice,
                    (&sub_rows, &sub_cols),
                    &mut band[ra * row_bytes..],
                    table,
                );
            }
        };
        rest(band, (0, r0), (0, tc));
        rest(band, (r1, tr), (0, tc));
        rest(band, (r0, r1), (c1, tc));
        let base = slice as u64 * f.slice_bits;
        let lane = (f.lane_bits / 8) as usize;
        // The next tile's lines of codes and scales: its columns a lane
        // apart, too far for the hardware to guess.
        let next = cols.end..(cols.end + tc).min(job.stored_dims().rows);
        let at = ((base + next.start as u64 * f.lane_bits) / 8) as usize + rows.start / 2;
        simd::prefetch_read(self.isa, &f.data, (0..next.len()).map(|k| at + k * lane));
        if let Some(scale) = &job.scale {
            let first = job.scale_index(slice, next.start, rows.start).unwrap_or(0);
            let step = job
                .scale_index(slice, next.start + 1, rows.start)
                .unwrap_or(0)
                .saturating_sub(first);
            simd::prefetch_read(
                self.isa,
                &scale.data,
                (0..next.len()).map(|k| first + k * step),
            );
        }
        // The blocks' codes, each column's run of bytes next to the next:
        // columns a power of two apart would share a few cache sets, and
        // each line is read by every block of rows.
        let run = (r1 - r0) / 2;
        if run == 0 || c1 == 0 {
            return;
        }
        let at = ((base + cols.start as u64 * f.lane_bits) / 8) as usize + (rows.start + r0) / 2;
        codes.resize(c1 * run, 0);
        for (k, dst) in codes.chunks_exact_mut(run).take(c1).enumerate() {
            let src = &f.data[at + k * lane..at + k * lane + run];
            // A whole pair of lines (tiles of 256 rows) as one fixed-size copy.
            match (
                <&mut [u8; 128]>::try_from(&mut *dst),
                <&[u8; 128]>::try_from(src),
            ) {
                (Ok(d), Ok(s)) => *d = *s,
                _ => dst.copy_from_slice(src),
            }
        }
        let mut shifts = [0u32; 128];
        for r in (r0..r1).step_by(32) {
            for c in (0..c1).step_by(128) {
                let mut all = true;
                for (k, s) in shifts.iter_mut().enumerate() {
                    let b = byte(r, c + k);
                    *s = sh.by_byte[b as usize];
                    all &= sh.exact[b as usize];
                }
                let first = c * run + (r - r0) / 2;
                let o = r * row_bytes + (cols.start + c) * N;
                // The next block's output lines, for writing.
                for e in r + 32..(r + 64).min(r1) {
                    let o = e * row_bytes + (cols.start + c) * N;
                    simd::prefetch_write(self.isa, band, o..o + 128 * N);
                }
                let done = all
                    && simd::shifted_block::<N>(
                        self.isa,
                        codes,
                        (first, run),
                        (&sh.base, &shifts),
                        &mut band[o..],
                        row_bytes,
                    );
                if !done {
                    rest(band, (r, r + 32), (c, c + 128));
                }
            }
        }
    }

    /// Decodes a transposed tile of nibbles whose tables change from output
    /// column to column (stored row to stored row) but hold down runs of 16
    /// output rows: blocks of 16 rows × a register's worth of columns, each
    /// column's codes looked up in its own table and the block written
    /// transposed ([`simd::transposed_block`]); element by element where a
    /// block does not fit.
    fn stored_order<'t, const N: usize>(
        &self,
        job: &DecodeJob<'_>,
        slice: usize,
        (rows, cols): (&std::ops::Range<usize>, &std::ops::Range<usize>),
        band: &mut [u8],
        table: impl Fn(usize, usize) -> &'t Table16,
    ) {
        let f = &job.codes;
        let data: &[u8] = &f.data;
        let base = slice as u64 * f.slice_bits;
        let (tr, tc) = (rows.len(), cols.len());
        let row_bytes = job.dims.cols * N;
        // Output rows sharing a stored column's entry.
        let d = match self.cols_per_key {
            ColKey::Div(d) => d,
            ColKey::GIdx => 1,
        };
        let lane_at = |ci: usize| ((base + (cols.start + ci) as u64 * f.lane_bits) / 8) as usize;
        let lanes = 16 / N;
        let element = |r: usize, ci: usize, band: &mut [u8]| {
            let j = rows.start + r;
            let code = (data[lane_at(ci) + j / 2] >> (4 * (j % 2))) & 15;
            let o = r * row_bytes + (cols.start + ci) * N;
            band[o..o + N].copy_from_slice(&table(r, ci).values[code as usize].to_le_bytes()[..N]);
        };
        let mut r = 0;
        while r < tr {
            let j = rows.start + r;
            if r + 16 > tr || !j.is_multiple_of(2) || j / d != (j + 15) / d {
                (0..tc).for_each(|ci| element(r, ci, band));
                r += 1;
                continue;
            }
            // The next block's output lines, for writing.
            for e in r + 16..(r + 32).min(tr) {
                let o = e * row_bytes + cols.start * N;
                simd::prefetch_write(self.isa, band, o..o + tc * N);
            }
            let mut ci = 0;
            while ci + lanes <= tc {
                let codes: [&[u8; 8]; 8] = std::array::from_fn(|q| {
                    let at = lane_at(ci + q.min(lanes - 1)) + j / 2;
                    <&[u8; 8]>::try_from(&data[at..at + 8])
                        .unwrap_or_else(|_| unreachable!("8 bytes"))
                });
                let planes: [&[[u8; 16]; 4]; 8] =
                    std::array::from_fn(|q| &table(r, ci + q.min(lanes - 1)).planes);
                let o = r * row_bytes + (cols.start + ci) * N;
                simd::transposed_block::<N>(
                    self.isa,
                    &codes[..lanes],
                    &planes[..lanes],
                    &mut band[o..],
                    row_bytes,
                );
                ci += lanes;
            }
            for r in r..r + 16 {
                (ci..tc).for_each(|ci| element(r, ci, band));
            }
            r += 16;
        }
    }

    /// Reads the codes of output `rows` × `cols` of `slice` into `codes`,
    /// row-major in output order.
    fn fill(
        &self,
        job: &DecodeJob<'_>,
        slice: usize,
        (rows, cols): (&std::ops::Range<usize>, &std::ops::Range<usize>),
        codes: &mut [u8],
    ) {
        let f = &job.codes;
        let tc = cols.len();
        let data: &[u8] = &f.data;
        let base = slice as u64 * f.slice_bits;
        match self.fill {
            Fill::Nibbles => {
                for (ci, i) in cols.clone().enumerate() {
                    let start = ((base + i as u64 * f.lane_bits) / 8) as usize;
                    let mut j = rows.start;
                    while j < rows.end {
                        let o = (j - rows.start) * tc + ci;
                        let b = data[start + j / 2];
                        if j % 2 == 1 || j + 1 == rows.end {
                            codes[o] = (b >> (4 * (j % 2))) & 15;
                            j += 1;
                        } else {
                            codes[o] = b & 15;
                            codes[o + tc] = b >> 4;
                            j += 2;
                        }
                    }
                }
            }
            Fill::Fields => {
                for (ri, r) in rows.clone().enumerate() {
                    for (ci, c) in cols.clone().enumerate() {
                        let (i, j) = if job.transposed { (c, r) } else { (r, c) };
                        codes[ri * tc + ci] = f.get(slice, i, j) as u8;
                    }
                }
            }
        }
    }
}

/// One task's reusable buffers.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// A stored row of each lane key, and a stored column of each column key.
    lane_rep: Vec<usize>,
    col_rep: Vec<Option<usize>>,
    /// Column key of each stored column of the tile, from the first.
    col_base: Vec<u32>,
    /// Table offsets of each output row and column.
    row_off: Vec<u32>,
    col_off: Vec<u32>,
    /// The encoded value of every code of every entry the tile touches.
    tables: Vec<u32>,
    /// The tile's codes, output row-major.
    codes: Vec<u8>,
    /// Runs of the tile's columns sharing a table.
    runs: Vec<(usize, usize)>,
    /// The tables of 4-bit codes, with their byte planes.
    t16: Vec<Table16>,
    /// Where each lane's scales start (tables by scale byte).
    lane_base: Vec<usize>,
}

/// The encoded outputs of every code under one entry: `(c − zero)·scale`
/// (then the post scale), exactly the operations `DecodeJob::value`
/// performs.
fn fill_table(job: &DecodeJob<'_>, zero: Option<f32>, scale: Option<f32>, t: &mut [u32]) {
    let value = |c: f32| {
        let q = zero.map_or(c, |z| c - z);
        job.post(job.scaled(q, scale))
    };
    if let (Ok(codes), Ok(t)) = (
        <&[f32; 16]>::try_from(&job.code_values[..]),
        <&mut [u32; 16]>::try_from(&mut *t),
    ) {
        // 4-bit codes: fixed-size loops the compiler vectorizes.
        let v: [f32; 16] = std::array::from_fn(|k| value(codes[k]));
        match job.out {
            OutDtype::Bf16 => *t = std::array::from_fn(|k| numerics::f32_to_bf16(v[k]) as u32),
            OutDtype::F16 => *t = std::array::from_fn(|k| numerics::f32_to_f16(v[k]) as u32),
            OutDtype::F32 => *t = std::array::from_fn(|k| numerics::f32_bits(v[k])),
        }
        return;
    }
    let values = t.iter_mut().zip(job.code_values.iter());
    match job.out {
        OutDtype::Bf16 => values.for_each(|(t, &c)| *t = numerics::f32_to_bf16(value(c)) as u32),
        OutDtype::F16 => values.for_each(|(t, &c)| *t = numerics::f32_to_f16(value(c)) as u32),
        OutDtype::F32 => values.for_each(|(t, &c)| *t = numerics::f32_bits(value(c))),
    }
}

//! Jobs whose codes run along the output's columns in memory — transposed
//! jobs (AutoAWQ GEMM, GPT-OSS experts: an output row is a stored column)
//! and strided ones (GPTQ: an output row's code words are a whole stored
//! row apart) — decoded a tile at a time: the tile's codes are read in
//! memory order (whole cache lines of stored rows) into a byte per code in
//! output order, and each is then looked up in a code table of its entry,
//! written out row by row.
//!
//! An entry (zero point and scale) is constant over blocks of stored rows
//! (`rows_per_key`) and of stored columns (`cols_per_key`, or g_idx's
//! groups); a tile builds one table per block it touches, from a stored
//! element of that block, with exactly the operations `DecodeJob::value`
//! performs, so the bytes are the element path's.

use crate::job::{DecodeJob, ZeroPoint};
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
    /// Transposed, 4-bit codes eight to a word in AutoAWQ's order.
    Interleaved,
    /// Not transposed, 4-bit codes eight to a word, a lane's words apart
    /// (GPTQ): the tile's rows' words for eight columns are adjacent.
    StridedWords,
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
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Tiles {
    /// The tiling of a transposed or strided job, when its entries span
    /// enough elements to pay for their tables.
    pub(super) fn of(job: &DecodeJob<'_>) -> Option<Tiles> {
        let f = &job.codes;
        // A post scale would need its own tables (and the memo below keys
        // tables by the scale alone); such jobs (LLM.int8) are straight.
        if job.low_rank.is_some()
            || job.post_scale.is_some()
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
                let groups = job.g_idx.as_ref()?.iter().max().map_or(1, |&m| m as usize + 1);
                stored.cols / groups
            }
        };
        if rows_per_key.min(stored.rows).saturating_mul(key_cols) < 2 * job.code_values.len() {
            return None;
        }
        // High-first bytes are read field by field.
        let whole_bytes =
            f.lane_bits.is_multiple_of(8) && f.slice_bits.is_multiple_of(8) && !f.high_first;
        let dense4 = f.bits == 4 && (f.per_word == 0 || f.per_word == 8 && !f.interleaved);
        let fill = if job.transposed && f.word_bits == 32 && whole_bytes && dense4 {
            Fill::Nibbles
        } else if job.transposed
            && f.word_bits == 32
            && whole_bytes
            && f.bits == 4
            && f.per_word == 8
            && f.interleaved
            && f.lane_bits.is_multiple_of(32)
        {
            Fill::Interleaved
        } else if !job.transposed && whole_bytes && dense4 && f.word_bits.is_multiple_of(8) {
            Fill::StridedWords
        } else {
            Fill::Fields
        };
        // Transposed: 128 stored columns (64 bytes of 4-bit codes) of 128
        // stored rows (an AutoAWQ table then serves 128 outputs, not 64).
        // Strided: 64 rows' words (four cache lines) of 1024 columns (fewer
        // pages at once than more rows), or 16 whole rows when g_idx
        // scatters the groups.
        let (tile_rows, tile_cols) = match (job.transposed, cols_per_key) {
            (true, _) => (128, 128),
            (false, ColKey::GIdx) => (16, job.dims.cols.max(1)),
            (false, ColKey::Div(_)) => (64, 1024),
        };
        Some(Tiles {
            rows_per_key,
            cols_per_key,
            tile_rows,
            tile_cols,
            fill,
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
            let mut c0 = 0;
            while c0 < job.dims.cols {
                let c1 = (c0 + self.tile_cols).min(job.dims.cols);
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
                s.col_base.extend(index.clone().map(|j| (j / d - g0) as u32));
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
        let col_keys = s.col_rep.len();
        // The tables, lane key major.
        s.tables.resize(lane_keys * col_keys * n, 0);
        // Without zero points a 4-bit table depends on the scale alone,
        // which takes few values in a tile of small blocks (GPT-OSS's e8m0
        // bytes: at most 256): tables remembered per scale, one slot per
        // exponent byte and checked against the whole scale.
        let memo = n == 16 && job.zero.is_none();
        if memo && s.memo.is_empty() {
            s.memo.resize(256, None);
        }
        for (ki, &i) in s.lane_rep.iter().enumerate() {
            for (kj, j) in s.col_rep.iter().enumerate() {
                if let Some(j) = *j {
                    let (zero, scale) = job.zero_and_scale(slice, i, j);
                    let at = (ki * col_keys + kj) * n;
                    let t = &mut s.tables[at..at + n];
                    if let (true, Some(scale), Ok(t)) = (memo, scale, <&mut [u32; 16]>::try_from(&mut *t)) {
                        let bits = scale.to_bits();
                        let slot = &mut s.memo[((bits >> 23) & 0xFF) as usize];
                        match slot {
                            Some((b, m)) if *b == bits => *t = *m,
                            _ => {
                                fill_table(job, zero, Some(scale), t);
                                *slot = Some((bits, *t));
                            }
                        }
                        continue;
                    }
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
        // Strided words whose eight columns share a table: straight from
        // the words, row by row of words, as the straight path decodes.
        if let (Fill::StridedWords, ColKey::Div(d), 16) = (self.fill, self.cols_per_key, n) {
            if d.is_multiple_of(8) && cols.start.is_multiple_of(8) {
                self.strided_words::<N>(job, slice, &rows, &cols, band, s);
                return;
            }
        }
        // Transposed nibbles whose tables change from column to column but
        // hold down runs of stored columns (GPT-OSS's 32 inputs): decoded
        // in stored order, the values then transposed.
        if let (Fill::Nibbles, ColKey::Div(d), 16) = (self.fill, self.cols_per_key, n) {
            if self.rows_per_key < 16 && d >= 16 && d.is_multiple_of(2) && rows.start.is_multiple_of(2) {
                self.stored_order::<N>(job, slice, &rows, &cols, band, s);
                return;
            }
        }
        s.codes.resize(tr * tc, 0);
        self.fill(job, slice, &rows, &cols, &mut s.codes);
        for (ri, (&ro, codes)) in s.row_off.iter().zip(s.codes.chunks_exact(tc)).enumerate() {
            let at = ri * row_bytes + cols.start * N;
            let dst = &mut band[at..at + tc * N];
            for &(a, b) in &s.runs {
                let t = (ro + s.col_off[a]) as usize;
                let t = &s.tables[t..t + n];
                let (codes, dst) = (&codes[a..b], &mut dst[a * N..b * N]);
                let mut done = 0;
                if let Ok(t) = <&[u32; 16]>::try_from(t) {
                    if N == 2 {
                        done = shuffle::bytes_to_16bit(codes, t, dst);
                    }
                    for (o, &code) in dst.chunks_exact_mut(N).zip(codes).skip(done) {
                        o.copy_from_slice(&t[(code & 15) as usize].to_le_bytes()[..N]);
                    }
                    continue;
                }
                for (o, &code) in dst.chunks_exact_mut(N).zip(codes) {
                    o.copy_from_slice(&t[code as usize].to_le_bytes()[..N]);
                }
            }
        }
    }

    /// Decodes a tile of 4-bit strided words whose eight columns share a
    /// table: for each word column, the tile's rows' words (adjacent in
    /// memory), eight lookups each assembled in registers.
    fn strided_words<const N: usize>(
        &self,
        job: &DecodeJob<'_>,
        slice: usize,
        rows: &std::ops::Range<usize>,
        cols: &std::ops::Range<usize>,
        band: &mut [u8],
        s: &mut Scratch,
    ) {
        let f = &job.codes;
        let data: &[u8] = &f.data;
        let base = slice as u64 * f.slice_bits;
        let row_bytes = job.dims.cols * N;
        let (w0, w1) = (cols.start / 8, cols.end / 8);
        let stride = (f.word_bits / 8) as usize;
        let first = ((base + rows.start as u64 * f.lane_bits) / 8) as usize + w0 * stride;
        let lane = (f.lane_bits / 8) as usize;
        // The last byte whole words read, checked once for the tile.
        let end = (w1 > w0).then(|| first + (rows.len() - 1) * lane + (w1 - 1 - w0) * stride + 4);
        if end.is_some_and(|e| e <= data.len()) {
            // The tile's words, gathered row by row: each row's then lie
            // as a straight row's nibbles do.
            let nw = w1 - w0;
            s.words.resize(rows.len() * nw * 4, 0);
            for w in 0..nw {
                let at = first + w * stride;
                for ri in 0..rows.len() {
                    let at = at + ri * lane;
                    let o = (ri * nw + w) * 4;
                    s.words[o..o + 4].copy_from_slice(&data[at..at + 4]);
                }
            }
            for (ri, &ro) in s.row_off.iter().enumerate() {
                let codes = &s.words[ri * nw * 4..(ri + 1) * nw * 4];
                let o = ri * row_bytes + cols.start * N;
                let dst = &mut band[o..o + 8 * nw * N];
                for &(a, b) in &s.runs {
                    let b = b.min(8 * nw);
                    if a >= b {
                        break;
                    }
                    let t = ro as usize + s.col_off[a] as usize;
                    let Ok(t) = <&[u32; 16]>::try_from(&s.tables[t..t + 16]) else {
                        continue;
                    };
                    let (codes, dst) = (&codes[a / 2..b / 2], &mut dst[a * N..b * N]);
                    let mut done = 0;
                    if N == 2 {
                        let t64: [u64; 16] = std::array::from_fn(|k| t[k] as u64);
                        done = super::shuffle::nibbles_to_16bit(codes, &t64, dst, false);
                    }
                    let words = codes[done / 2..].chunks_exact(4);
                    for (w, o) in words.zip(dst[done * N..].chunks_exact_mut(8 * N)) {
                        let x = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                        let at = |k: u32| t[((x >> (4 * k)) & 15) as usize] as u64;
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
                    }
                }
            }
        } else {
            // Near the end of the data: field by field.
            self.strided_fields::<N>(job, slice, rows, cols.start, w0 * 8..w1 * 8, band, s);
        }
        // The columns of a last partial word.
        let tail = (w1 * 8).max(cols.start)..cols.end;
        self.strided_fields::<N>(job, slice, rows, cols.start, tail, band, s);
    }

    /// Columns `cols` of the tile starting at column `tile_start`, for
    /// [`Tiles::strided_words`], a field at a time.
    #[allow(clippy::too_many_arguments)]
    fn strided_fields<const N: usize>(
        &self,
        job: &DecodeJob<'_>,
        slice: usize,
        rows: &std::ops::Range<usize>,
        tile_start: usize,
        cols: std::ops::Range<usize>,
        band: &mut [u8],
        s: &Scratch,
    ) {
        let row_bytes = job.dims.cols * N;
        for (ri, &ro) in s.row_off.iter().enumerate() {
            let r = rows.start + ri;
            for col in cols.clone() {
                let t = (ro + s.col_off[col - tile_start]) as usize;
                let e = s.tables[t + job.codes.get(slice, r, col) as usize];
                let o = ri * row_bytes + col * N;
                band[o..o + N].copy_from_slice(&e.to_le_bytes()[..N]);
            }
        }
    }

    /// Decodes a transposed tile of nibbles stored row by stored row, each
    /// run of stored columns sharing a table at once, into a tile of values
    /// it then writes transposed.
    fn stored_order<const N: usize>(
        &self,
        job: &DecodeJob<'_>,
        slice: usize,
        rows: &std::ops::Range<usize>,
        cols: &std::ops::Range<usize>,
        band: &mut [u8],
        s: &mut Scratch,
    ) {
        let f = &job.codes;
        let data: &[u8] = &f.data;
        let base = slice as u64 * f.slice_bits;
        let (tr, tc) = (rows.len(), cols.len());
        let row_bytes = job.dims.cols * N;
        // Runs of output rows (stored columns) sharing a table.
        s.runs.clear();
        let mut a = 0;
        for r in 1..=tr {
            if r == tr || s.row_off[r] != s.row_off[a] {
                s.runs.push((a, r));
                a = r;
            }
        }
        s.vals.resize(tc * tr * N, 0);
        for (ci, i) in cols.clone().enumerate() {
            let start = ((base + i as u64 * f.lane_bits) / 8) as usize + rows.start / 2;
            let codes = &data[start..start + tr.div_ceil(2)];
            let vals = &mut s.vals[ci * tr * N..(ci + 1) * tr * N];
            for &(a, b) in &s.runs {
                let t = (s.row_off[a] + s.col_off[ci]) as usize;
                let Ok(t) = <&[u32; 16]>::try_from(&s.tables[t..t + 16]) else {
                    continue;
                };
                let mut done = a;
                if N == 2 && a.is_multiple_of(2) {
                    let t64: [u64; 16] = std::array::from_fn(|k| t[k] as u64);
                    let out = &mut vals[a * N..b * N];
                    done += super::shuffle::nibbles_to_16bit(&codes[a / 2..b / 2], &t64, out, false);
                }
                if done.is_multiple_of(8) {
                    let words = codes[done / 2..b / 2].chunks_exact(4);
                    for (w, o) in words.zip(vals[done * N..b * N].chunks_exact_mut(8 * N)) {
                        let x = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                        for (k, o) in o.chunks_exact_mut(N).enumerate() {
                            let e = t[((x >> (4 * k)) & 15) as usize];
                            o.copy_from_slice(&e.to_le_bytes()[..N]);
                        }
                        done += 8;
                    }
                }
                for j in done..b {
                    let code = (codes[j / 2] >> (4 * (j % 2))) & 15;
                    vals[j * N..j * N + N].copy_from_slice(&t[code as usize].to_le_bytes()[..N]);
                }
            }
        }
        // The transpose, in cache: blocks of 8 × 8, then the edges.
        let (tr8, tc8) = if N == 2 {
            (tr / 8 * 8, tc / 8 * 8)
        } else {
            (0, 0)
        };
        for rb in (0..tr8).step_by(8) {
            for cb in (0..tc8).step_by(8) {
                let mut block = [[0u8; 32]; 8];
                for (ci, b) in block.iter_mut().enumerate() {
                    let v = ((cb + ci) * tr + rb) * N;
                    b[..8 * N].copy_from_slice(&s.vals[v..v + 8 * N]);
                }
                for ri in 0..8 {
                    let o = (rb + ri) * row_bytes + (cols.start + cb) * N;
                    let dst = &mut band[o..o + 8 * N];
                    for (o, b) in dst.chunks_exact_mut(N).zip(&block) {
                        o.copy_from_slice(&b[ri * N..ri * N + N]);
                    }
                }
            }
        }
        for ri in 0..tr {
            let o = ri * row_bytes + cols.start * N;
            let dst = &mut band[o..o + tc * N];
            let from = if ri < tr8 { tc8 } else { 0 };
            for (ci, o) in dst.chunks_exact_mut(N).enumerate().skip(from) {
                let v = (ci * tr + ri) * N;
                o.copy_from_slice(&s.vals[v..v + N]);
            }
        }
    }

    /// Reads the codes of output `rows` × `cols` of `slice` into `codes`,
    /// row-major in output order.
    fn fill(
        &self,
        job: &DecodeJob<'_>,
        slice: usize,
        rows: &std::ops::Range<usize>,
        cols: &std::ops::Range<usize>,
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
            Fill::Interleaved => {
                // Slot of element e in its word: e/2 + (e%2)·4.
                const SLOT: [u32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
                let lane_at = |i: usize| ((base + i as u64 * f.lane_bits) / 8) as usize;
                // Whole words of eight lanes at once: each word's codes
                // spread to a byte each, then the 8 × 8 bytes transposed.
                let (w0, w1) = (rows.start.div_ceil(8), rows.end / 8);
                let mut c8 = tc / 8 * 8;
                if c8 == 0 || w1 <= w0 || lane_at(cols.start + c8 - 1) + 4 * w1 > data.len() {
                    c8 = 0;
                }
                for cb in (0..c8).step_by(8) {
                    let starts: [usize; 8] = std::array::from_fn(|k| lane_at(cols.start + cb + k));
                    for w in w0..w1 {
                        let m: [u64; 8] = std::array::from_fn(|k| {
                            let at = starts[k] + 4 * w;
                            let x = &data[at..at + 4];
                            spread_awq(u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                        });
                        let t = transpose_8x8(m);
                        let o = (8 * w - rows.start) * tc + cb;
                        for (e, v) in t.iter().enumerate() {
                            codes[o + e * tc..o + e * tc + 8].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
                for (ci, i) in cols.clone().enumerate() {
                    let start = lane_at(i);
                    for w in rows.start / 8..(rows.end - 1) / 8 + 1 {
                        if ci < c8 && (w0..w1).contains(&w) {
                            continue;
                        }
                        let at = start + 4 * w;
                        let Some(x) = data.get(at..at + 4) else {
                            for j in (8 * w).max(rows.start)..(8 * w + 8).min(rows.end) {
                                codes[(j - rows.start) * tc + ci] = f.get(slice, i, j) as u8;
                            }
                            continue;
                        };
                        let x = u32::from_le_bytes([x[0], x[1], x[2], x[3]]);
                        if 8 * w >= rows.start && 8 * w + 8 <= rows.end {
                            let o = (8 * w - rows.start) * tc + ci;
                            for (e, &slot) in SLOT.iter().enumerate() {
                                codes[o + e * tc] = ((x >> (4 * slot)) & 15) as u8;
                            }
                            continue;
                        }
                        for (e, &slot) in SLOT.iter().enumerate() {
                            let j = 8 * w + e;
                            if (rows.start..rows.end).contains(&j) {
                                codes[(j - rows.start) * tc + ci] = ((x >> (4 * slot)) & 15) as u8;
                            }
                        }
                    }
                }
            }
            Fill::StridedWords => {
                let tr = rows.len();
                for w in cols.start / 8..(cols.end - 1) / 8 + 1 {
                    let whole = 8 * w >= cols.start && 8 * w + 8 <= cols.end;
                    for ri in 0..tr {
                        let r = rows.start + ri;
                        let at = ((base + r as u64 * f.lane_bits + w as u64 * f.word_bits) / 8)
                            as usize;
                        let o = ri * tc;
                        match data.get(at..at + 4) {
                            Some(x) if whole => {
                                let x = u32::from_le_bytes([x[0], x[1], x[2], x[3]]);
                                let o = o + 8 * w - cols.start;
                                for (k, c) in codes[o..o + 8].iter_mut().enumerate() {
                                    *c = ((x >> (4 * k)) & 15) as u8;
                                }
                            }
                            _ => {
                                for c in (8 * w).max(cols.start)..(8 * w + 8).min(cols.end) {
                                    codes[o + c - cols.start] = f.get(slice, r, c) as u8;
                                }
                            }
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

/// An AutoAWQ word's eight codes, a byte each in element order (element
/// `2j` in nibble `j`, element `2j + 1` in nibble `j + 4`).
fn spread_awq(x: u32) -> u64 {
    // Four nibbles to bytes 0, 2, 4 and 6.
    let spread = |a: u64| {
        let t = (a & 0xFF) | (a & 0xFF00) << 24;
        (t & 0x0000_000F_0000_000F) | (t & 0x0000_00F0_0000_00F0) << 12
    };
    spread((x & 0xFFFF) as u64) | spread((x >> 16) as u64) << 8
}

/// Transposes 8 × 8 bytes: byte `e` of `m[k]` becomes byte `k` of the
/// result's `e`.
fn transpose_8x8(mut m: [u64; 8]) -> [u64; 8] {
    for (shift, mask) in [
        (8, 0x00FF_00FF_00FF_00FFu64),
        (16, 0x0000_FFFF_0000_FFFF),
        (32, 0x0000_0000_FFFF_FFFF),
    ] {
        let step = shift / 8;
        for k in 0..8 {
            if k & step == 0 {
                let t = ((m[k] >> shift) ^ m[k + step]) & mask;
                m[k + step] ^= t;
                m[k] ^= t << shift;
            }
        }
    }
    m
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
    /// A strided tile's words, row by row.
    words: Vec<u8>,
    /// A transposed tile's encoded values, stored row by stored row.
    vals: Vec<u8>,
    /// Tables of scales without zero points, by the scale's exponent byte:
    /// the scale's bits and its table.
    memo: Vec<Option<(u32, [u32; 16])>>,
}

/// The encoded outputs of every code under one entry: `(c − zero)·scale`,
/// exactly the operations `DecodeJob::value` performs.
fn fill_table(job: &DecodeJob<'_>, zero: Option<f32>, scale: Option<f32>, t: &mut [u32]) {
    let value = |c: f32| {
        let q = zero.map_or(c, |z| c - z);
        scale.map_or(q, |s| q * s)
    };
    if let (Ok(codes), Ok(t)) = (
        <&[f32; 16]>::try_from(job.code_values.as_slice()),
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
    let values = t.iter_mut().zip(&job.code_values);
    match job.out {
        OutDtype::Bf16 => values.for_each(|(t, &c)| *t = numerics::f32_to_bf16(value(c)) as u32),
        OutDtype::F16 => values.for_each(|(t, &c)| *t = numerics::f32_to_f16(value(c)) as u32),
        OutDtype::F32 => values.for_each(|(t, &c)| *t = numerics::f32_bits(value(c))),
    }
}

/// Table lookups 16 at a time with a byte shuffle (x86-64 SSSE3), for codes
/// of one byte each below 16 and 16-bit outputs, as the straight path's
/// shuffle does for nibbles. Same bytes as the scalar loop.
mod shuffle {
    /// Decodes whole 16-code blocks of `codes` through `table` into `out`
    /// (2 bytes per output); returns how many outputs were written (0 when
    /// the CPU has no SSSE3).
    pub(super) fn bytes_to_16bit(codes: &[u8], table: &[u32; 16], out: &mut [u8]) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("ssse3") {
                // SAFETY: the CPU has SSSE3 (checked just above).
                return unsafe { x86::bytes_to_16bit(codes, table, out) };
            }
        }
        let _ = (codes, table, out);
        0
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        #[target_feature(enable = "ssse3")]
        pub(super) unsafe fn bytes_to_16bit(codes: &[u8], table: &[u32; 16], out: &mut [u8]) -> usize {
            let lo: [u8; 16] = std::array::from_fn(|c| table[c] as u8);
            let hi: [u8; 16] = std::array::from_fn(|c| (table[c] >> 8) as u8);
            let blocks = (codes.len() / 16).min(out.len() / 32);
            // SAFETY: every load reads 16 bytes at 16·i ≤ codes.len() - 16
            // and every store writes 32 bytes at 32·i ≤ out.len() - 32, for
            // i < blocks; unaligned loads and stores are used throughout.
            unsafe {
                let t_lo = _mm_loadu_si128(lo.as_ptr().cast());
                let t_hi = _mm_loadu_si128(hi.as_ptr().cast());
                // Codes are below 16; the mask keeps pshufb's index in range.
                let nibble = _mm_set1_epi8(0x0F);
                for i in 0..blocks {
                    let idx = _mm_and_si128(_mm_loadu_si128(codes.as_ptr().add(16 * i).cast()), nibble);
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

//! Jobs whose entries (zero point and scale) hold over runs of an output
//! row's columns, decoded a row at a time through one code table per run:
//! straight rows read in place, and rows packed along the input dimension
//! — GPTQ's strided words, AutoAWQ's transposed ones — and sparse rows (byte
//! codes kept where a bitmask is set) a band of rows at a time, gathered
//! into straight rows of codes that stay in cache and then decoded by the
//! same inner loop as straight rows.
//!
//! The tables hold the encoded output of every code of one entry, computed
//! with exactly the operations `DecodeJob::value` performs, so both ways
//! give the same bytes; the table way turns the inner loop into a lookup.

use std::ops::Range;

use super::direct::{self, Linear};
use super::simd;
use super::table::{ByScale, Table16};
use crate::job::{gcd, DecodeJob, Fields, InBlocks, Source, ValueKind, Values, ZeroPoint};
use crate::numerics::{self, OutDtype};

/// Bytes between gathered rows past their codes: rows a power of two
/// apart would fall into the same few cache sets.
const PAD: usize = 64;

/// Bytes of gathered codes a band of GPTQ's words fills at most: about a
/// core's L2 cache, so that the band's rows are read back from it.
const WORDS_BAND_BYTES: usize = 1 << 20;

/// How a row's codes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gather {
    /// In place: a row is a lane of the stored stream.
    InPlace,
    /// A row's 32-bit words are `word_bits` apart and hold whole fields
    /// (GPTQ): a band's words are copied into straight rows.
    Words,
    /// Transposed 4-bit AutoAWQ words: a band's codes are transposed into
    /// straight rows of nibbles.
    Awq,
    /// Slices of two rows whose codes share bytes, the first row's in the
    /// low nibbles (ModelOpt's INT4 AWQ): split into two straight rows.
    Pairs,
    /// Byte codes kept where a bitmask is set ([`crate::job::Sparse`]):
    /// scattered into straight rows, code 0 elsewhere.
    Sparse,
    /// Fields inside blocks (GGUF's): a row's blocks unpacked into a
    /// straight row of fields 1, 2, 4 or 8 bits wide, the fields' width
    /// rounded up.
    Blocks(InBlocks),
}

/// How a row is decoded through tables.
#[derive(Debug)]
pub(super) struct Rows {
    /// Output columns per entry, unless `g_idx` maps them.
    group_cols: usize,
    /// Entries per output row.
    groups: usize,
    gather: Gather,
    /// Codes are whole fields of 1, 2, 4 or 8 bits, each row starting on a
    /// byte.
    byte_packed: bool,
    /// The job's tables by scale byte, when it has so few.
    by_scale: Option<ByScale>,
    /// Rows sharing every entry (1 unless straight block scales).
    rows_per_entry: usize,
    /// Each value is the table's f32 product times its column's factor
    /// (the job's rank-0 low-rank smoothing), rounded once.
    smoothing: bool,
    /// Outputs go around the caches ([`Rows::streaming`]).
    stream: bool,
    /// Output rows gathered at once (1 in place).
    band: usize,
    /// The instructions every kernel of the job may use, read once: all
    /// its kernels fall back to the scalar loops together.
    isa: simd::Isa,
    /// Values computed from the codes without tables, where tables would
    /// not pay off ([`direct`]).
    direct: Option<Linear>,
    /// `direct` where tables would not be taken at all (else the job
    /// would go to tiles or element by element).
    fallback: bool,
}

/// One thread's reusable buffers: kept from task to task, as fresh ones
/// would fault their pages in again each time.
#[derive(Debug, Default)]
struct Scratch {
    /// A band's gathered rows of codes.
    codes: Vec<u8>,
    tables: Tables,
}

/// An entry's zero point and scale.
type Entry = (Option<f32>, Option<f32>);

/// The tables of the row being decoded, entry after entry.
#[derive(Debug, Default)]
struct Tables {
    /// The row's entries.
    entries: Vec<Entry>,
    /// Of 4-bit codes.
    t16: Vec<Table16>,
    /// Of other widths: 2^bits values each.
    values: Vec<u64>,
    /// The row's offsets, entry by entry, when the job has them.
    offsets: Vec<f32>,
    /// The row's scales and offsets as f32 bytes, where the job's are not
    /// f32 entries in a run already ([`f32_run`]), and its zero points.
    scales: Vec<u8>,
    offset_bytes: Vec<u8>,
    zeros: Vec<u8>,
    /// A row's codes of 1, 2 or 4 bits, a byte each (direct values).
    unpacked: Vec<u8>,
}

impl Rows {
    /// Tables pay off when a row holds more elements than its tables; the
    /// kernels use the instructions of `isa`.
    pub(super) fn of(job: &DecodeJob<'_>, isa: simd::Isa) -> Option<Rows> {
        let f: &Fields<'_> = &job.codes;
        // A rank-0 low-rank branch is a factor per column (ModelOpt's
        // pre-quant scale), applied to the f32 products of the tables.
        let smoothing = match &job.low_rank {
            None => false,
            Some(lr) => {
                let simple =
                    job.product_dtype().is_none() && job.post_scale.is_none() && !job.transposed;
                let nibbles = f.bits == 4 && job.code_values.len() == 16;
                if lr.rank != 0
                    || lr.period > 1
                    || !simple
                    || !nibbles
                    || lr.inv_smooth.len() != job.dims.cols
                {
                    return None;
                }
                true
            }
        };
        let whole = f.word_bits.is_multiple_of(32)
            && f.lane_bits.is_multiple_of(32)
            && f.slice_bits.is_multiple_of(8)
            && matches!(f.bits, 1 | 2 | 4 | 8)
            && !f.interleaved
            && (f.per_word == 0 || f.per_word * f.bits == 32);
        let gather = match (job.transposed, f.word_bits == 32) {
            // Lanes in parts (HQQ's 3-bit words) are read field by field,
            // in place.
            _ if f.parts.is_some() => {
                let plain = !job.transposed && job.sparse.is_none() && f.blocks.is_none();
                (plain && f.word_bits == 32).then_some(Gather::InPlace)?
            }
            _ if f.blocks.is_some() => {
                let b = f.blocks?;
                let whole = f.lane_bits.is_multiple_of(8) && f.slice_bits.is_multiple_of(8);
                let fits = b.len <= MAX_BLOCK as u32 && b.len.is_multiple_of(8);
                (whole && fits && !job.transposed && job.sparse.is_none())
                    .then_some(Gather::Blocks(b))?
            }
            _ if job.sparse.is_some() => {
                let bytes = f.bits == 8 && f.per_word == 0 && job.dims.slices == 1 && !f.high_first;
                (bytes && !job.transposed).then_some(Gather::Sparse)?
            }
            (false, true) => Gather::InPlace,
            // Gathered codes are read LSB first.
            (false, false) if whole && !f.high_first => Gather::Words,
            // ModelOpt's INT4 AWQ: a byte holds column c of two rows.
            (false, false)
                if f.bits == 4 && f.per_word == 1 && f.word_bits == 8 && f.lane_bits == 4 =>
            {
                let pairs = job.dims.rows == 2 && f.slice_bits == job.dims.cols as u64 * 8;
                (pairs && !f.high_first && job.g_idx.is_none()).then_some(Gather::Pairs)?
            }
            (true, true) if f.bits == 4 && f.per_word == 8 && f.interleaved => {
                let aligned = f.lane_bits.is_multiple_of(32) && f.slice_bits.is_multiple_of(8);
                (aligned && job.g_idx.is_none()).then_some(Gather::Awq)?
            }
            _ => return None,
        };
        let cols = job.dims.cols;
        // Output columns sharing an entry: a stored row group when
        // transposed, a stored column group when not.
        let along = |g: &crate::job::Grid| if job.transposed { g.row_div } else { g.col_div };
        let group_cols = job
            .scale
            .as_ref()
            .map_or(cols, |s| along(&s.grid).min(cols))
            .max(1);
        match (&job.zero, job.transposed) {
            (None, _) => {}
            (Some(ZeroPoint::Plain(_)), _) if job.scale.is_none() => return None,
            // A plain zero point on another grid than the scale's would need
            // a table per (scale entry, zero entry) pair.
            (Some(ZeroPoint::Plain(z)), _) => {
                let s = job.scale.as_ref()?;
                let same_rows = job.transposed || z.grid.row_div == s.grid.row_div;
                if along(&z.grid).min(cols) != group_cols || !same_rows {
                    return None;
                }
            }
            // Lane = the scale's column group, index = stored row.
            (Some(ZeroPoint::Packed { .. }), false) => {}
            // Lane = the scale's row group, index = stored column: an
            // output row when transposed.
            (Some(ZeroPoint::PackedAlongCols { .. }), true) => {}
            _ => return None,
        }
        // An offset per group (MLX's bias) goes into the tables of straight
        // rows whose offsets share the scale's entries.
        if let Some(o) = &job.offset {
            let s = job.scale.as_ref()?;
            let same = o.grid.col_div.min(cols) == group_cols && o.grid.row_div == s.grid.row_div;
            if !same || job.transposed || job.g_idx.is_some() || smoothing || job.zero.is_some() {
                return None;
            }
        }
        let groups = match &job.g_idx {
            Some(g) => g.iter().max().map_or(1, |&m| m as usize + 1),
            None => cols.div_ceil(group_cols),
        };
        // Straight rows whose entries hold over several rows (block scales)
        // share their tables: they are built once per row group.
        let rows_per_entry = match (&job.zero, &job.scale, gather) {
            (None | Some(ZeroPoint::Plain(_)), Some(s), Gather::InPlace) => {
                let z = match &job.zero {
                    Some(ZeroPoint::Plain(z)) => z.grid.row_div,
                    _ => s.grid.row_div,
                };
                gcd(s.grid.row_div, z).clamp(1, job.dims.rows.max(1))
            }
            _ => 1,
        };
        // Tables by scale byte cost nothing per entry.
        let by_scale = ByScale::of(isa, job)
            .filter(|_| !job.transposed && job.g_idx.is_none() && job.offset.is_none());
        let entries = groups.checked_mul(job.code_values.len())?;
        let byte_packed = matches!(f.bits, 1 | 2 | 4 | 8)
            && f.parts.is_none()
            && (f.per_word == 0 || f.per_word * f.bits == 32 && !f.interleaved)
            && f.lane_bits.is_multiple_of(8)
            && f.slice_bits.is_multiple_of(8);
        // Values straight from the codes ([`direct`]) where tables would
        // cost as much as the values: a scale (and zero point) per few
        // codes, when the codes are unpacked from blocks anyway (GGUF's),
        // or where tables would not be taken at all (GPTQ's 8-bit codes
        // with a zero point per 32) and the row's codes are whole fields
        // of 1, 2, 4 or 8 bits.
        let linear = Linear::of(&job.code_values).filter(|_| {
            let simple = job.g_idx.is_none() && !smoothing && job.post_scale.is_none();
            let plain =
                job.product_dtype().is_none() && job.scale.is_some() && job.low_rank.is_none();
            simple && plain && (gather != Gather::InPlace || byte_packed)
        });
        let tables_pay = by_scale.is_some() || entries * 4 <= cols.saturating_mul(rows_per_entry);
        let tables_taken = by_scale.is_some() || entries * 2 <= cols.saturating_mul(rows_per_entry);
        let (direct, fallback) = match gather {
            Gather::Blocks(_) if !tables_pay => (linear, !tables_taken),
            _ if !tables_taken => (linear, true),
            _ => (None, false),
        };
        if direct.is_none() && !tables_taken {
            return None;
        }
        Some(Rows {
            group_cols,
            groups,
            gather,
            byte_packed: byte_packed || gather != Gather::InPlace,
            by_scale: by_scale.filter(|_| !smoothing && direct.is_none()),
            direct,
            fallback,
            rows_per_entry,
            smoothing,
            stream: false,
            band: Rows::band_of(job, gather),
            isa,
        })
    }

    /// Whether values are computed without tables.
    pub(super) fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Whether values are computed without tables because tables would
    /// not be taken at all: tiles may still pay where rows do not.
    pub(super) fn is_fallback(&self) -> bool {
        self.fallback
    }

    /// Output rows gathered at once by `gather`.
    fn band_of(job: &DecodeJob<'_>, gather: Gather) -> usize {
        match gather {
            // A word row's run of the band is read whole: the longer, the
            // better memory serves runs a stored row apart. As many rows as
            // fill about an L2 cache with codes, up to 256 (1 KiB runs),
            // and still four bands a thread; in 16s, the vector gather's
            // blocks.
            Gather::Words => {
                let row =
                    (job.dims.cols as u64 * job.codes.bits as u64).div_ceil(32) as usize * 4 + PAD;
                let threads = 4 * rayon::current_num_threads().max(1);
                (WORDS_BAND_BYTES / row)
                    .min(256)
                    .min(job.dims.rows / threads)
                    / 16
                    * 16
            }
            .max(16),
            // One line of each input: 16 word columns.
            Gather::Awq => 128,
            Gather::Pairs | Gather::Sparse => 2,
            // A row's blocks are unpacked as they are read.
            Gather::Blocks(_) => 1,
            Gather::InPlace => 1,
        }
    }

    /// The same, writing its outputs around the caches where the vector
    /// kernels can (`simd::fence` orders them).
    pub(super) fn streaming(self, stream: bool) -> Rows {
        Rows { stream, ..self }
    }

    /// Output rows gathered at once.
    fn band(&self) -> usize {
        self.band
    }

    /// Output rows one task decodes: whole bands, at least `elements`.
    pub(super) fn rows_per_task(&self, cols: usize, elements: usize) -> usize {
        let rows = elements.div_ceil(cols.max(1));
        match self.gather {
            Gather::InPlace => rows,
            _ => rows.next_multiple_of(self.band()),
        }
    }

    /// Decodes flat output rows `rows` into `out` (theirs exactly).
    pub(super) fn decode(&self, job: &DecodeJob<'_>, rows: Range<usize>, out: &mut [u8]) {
        thread_local!(static SCRATCH: std::cell::RefCell<Scratch> = Default::default());
        SCRATCH.with_borrow_mut(|s| match job.out.size() {
            2 => self.decode_n::<2>(job, rows, out, s),
            _ => self.decode_n::<4>(job, rows, out, s),
        })
    }

    fn decode_n<const N: usize>(
        &self,
        job: &DecodeJob<'_>,
        rows: Range<usize>,
        out: &mut [u8],
        s: &mut Scratch,
    ) {
        let row_bytes = job.dims.cols * N;
        let per_slice = job.dims.rows;
        let mut flat = rows.start;
        while flat < rows.end {
            let (slice, r0) = (flat / per_slice, flat % per_slice);
            let r1 = match self.gather {
                Gather::InPlace => per_slice,
                _ => (r0 / self.band() + 1) * self.band(),
            }
            .min(per_slice)
            .min(r0 + rows.end - flat);
            let at = (flat - rows.start) * row_bytes;
            let band = &mut out[at..at + (r1 - r0) * row_bytes];
            let Scratch { codes, tables } = s;
            if self.gather == Gather::InPlace {
                let mut last = None;
                for (r, o) in (r0..r1).zip(band.chunks_exact_mut(row_bytes)) {
                    let key = Some(r / self.rows_per_entry);
                    let fresh = key != last;
                    last = key;
                    self.row::<N>(job, slice, r, (&job.codes, slice, r), o, (tables, fresh));
                }
            } else {
                let gathered = self.gather(job, slice, r0..r1, codes);
                for (k, o) in band.chunks_exact_mut(row_bytes).enumerate() {
                    self.row::<N>(job, slice, r0 + k, (&gathered, 0, k), o, (tables, true));
                }
            }
            flat += r1 - r0;
        }
    }

    /// Gathers the codes of output rows `rows` of `slice` into `buf` as
    /// straight rows (lane k = row `rows.start + k`).
    fn gather<'b>(
        &self,
        job: &DecodeJob<'_>,
        slice: usize,
        rows: Range<usize>,
        buf: &'b mut Vec<u8>,
    ) -> Fields<'b> {
        let f = &job.codes;
        let data: &[u8] = &f.data;
        let base = (slice as u64 * f.slice_bits / 8) as usize;
        let cols = job.dims.cols;
        let lanes = rows.len();
        match self.gather {
            Gather::Awq => {
                // Output row = stored column, in word column row / 8; lane =
                // input. The band's whole word columns are gathered.
                let row = cols.div_ceil(8) * 4 + PAD;
                let (c0, c1) = (rows.start / 8, rows.end.div_ceil(8));
                grow(buf, (c1 - c0) * 8 * row);
                let lane_bytes = (f.lane_bits / 8) as usize;
                let whole = cols / 8 * 8;
                simd::gather_awq(
                    self.isa,
                    data,
                    (base + 4 * c0, lane_bytes),
                    (c1 - c0, whole),
                    buf,
                    row,
                );
                // A band starts inside its first word column when a task
                // does; its rows start that far in.
                let first = rows.start - 8 * c0;
                // Inputs past the last whole eight, field by field.
                for k in (0..lanes).filter(|_| whole < cols) {
                    buf[(first + k) * row + whole / 2..][..(cols - whole).div_ceil(2)].fill(0);
                    for i in whole..cols {
                        let code = f.get(slice, i, rows.start + k) as u8;
                        buf[(first + k) * row + i / 2] |= code << (4 * (i % 2));
                    }
                }
                Fields::dense(&buf[first * row..], 4, row as u64 * 8)
            }
            Gather::Sparse => {
                let row = cols + PAD;
                grow(buf, lanes * row);
                if let Some(sp) = &job.sparse {
                    let mask: &[u8] = &sp.mask.data;
                    for (k, dst) in buf.chunks_mut(row).take(lanes).enumerate() {
                        let r = rows.start + k;
                        // Kept codes are read in order; the planner checked
                        // that the bitmask's counts are the starts.
                        let mut at = sp.start(r, 0) as usize;
                        let first = (sp.mask.lane_start(0, r).unwrap_or(0) / 8) as usize;
                        let bits = mask.get(first..).unwrap_or(&[]);
                        for (out, &m) in dst[..cols].chunks_mut(8).zip(bits) {
                            for (j, o) in out.iter_mut().enumerate() {
                                *o = if m >> j & 1 == 1 {
                                    at += 1;
                                    data.get(at - 1).copied().unwrap_or(0)
                                } else {
                                    0
                                };
                            }
                        }
                    }
                }
                Fields::dense(&buf[..], 8, row as u64 * 8)
            }
            Gather::Pairs => {
                // The slice's bytes, one per column: lane 0's codes in the
                // low nibbles, lane 1's in the high ones.
                let row = cols.div_ceil(2) + PAD;
                grow(buf, 2 * row);
                let (lo, hi) = buf.split_at_mut(row);
                simd::split_nibbles(
                    self.isa,
                    &data[base..base + cols],
                    &mut lo[..cols.div_ceil(2)],
                    &mut hi[..cols.div_ceil(2)],
                );
                Fields::dense(&buf[rows.start * row..], 4, row as u64 * 8)
            }
            Gather::Blocks(b) => {
                // Direct values read bytes.
                let width = if self.direct.is_some() {
                    8
                } else {
                    b.bits().next_power_of_two()
                };
                let len = b.len as usize;
                let row = (cols * width as usize).div_ceil(8) + PAD;
                grow(buf, lanes * row);
                let mut fields = [0u8; MAX_BLOCK];
                for (k, dst) in buf.chunks_mut(row).take(lanes).enumerate() {
                    let start = (f.lane_start(slice, rows.start + k).unwrap_or(0) / 8) as usize;
                    let blocks = data[start..].chunks(b.bytes as usize);
                    for (block, at) in blocks.zip((0..cols).step_by(len)) {
                        let n = len.min(cols - at);
                        if width == 8 {
                            b.unpack(block, &mut dst[at..at + n]);
                        } else {
                            b.unpack(block, &mut fields[..n]);
                            pack(&fields[..n], width, &mut dst[at * width as usize / 8..]);
                        }
                    }
                }
                Fields::dense(&buf[..], width, row as u64 * 8)
            }
            _ => {
                let words = (cols as u64 * f.bits as u64).div_ceil(32) as usize;
                let row = 4 * words + PAD;
                // Every word of every lane is written.
                grow(buf, lanes * row);
                let (lane, stride) = ((f.lane_bits / 8) as usize, (f.word_bits / 8) as usize);
                let first = base + rows.start * lane;
                if lane == 4 {
                    simd::gather_words(self.isa, data, (first, stride), (lanes, words), buf, row);
                } else {
                    for k in 0..lanes {
                        for w in 0..words {
                            let at = first + k * lane + w * stride;
                            buf[k * row + 4 * w..k * row + 4 * w + 4]
                                .copy_from_slice(&data[at..at + 4]);
                        }
                    }
                }
                Fields::new(&buf[..], f.bits, f.per_word, row as u64 * 8)
            }
        }
    }

    /// The zero point and scale of output row `row`'s entry `g`.
    fn entry(&self, job: &DecodeJob<'_>, slice: usize, row: usize, g: usize) -> Entry {
        if job.transposed {
            // Entry g spans stored rows g·group_cols …; the stored column is
            // the output row.
            job.zero_and_scale(slice, g * self.group_cols, row)
        } else {
            // Without a scale there is one group, so g is also the packed
            // zero points' lane 0.
            (job.zero_at(slice, row, g), job.scale_at(slice, row, g))
        }
    }

    /// Where entry g of output row `row` reads its zero point and scale
    /// (what [`Rows::entry`] reads).
    fn sources(
        &self,
        job: &DecodeJob<'_>,
        slice: usize,
        row: usize,
        g: usize,
    ) -> (Option<Source>, Option<usize>) {
        if job.transposed {
            let i = g * self.group_cols;
            (
                job.zero_source(slice, i, job.zero_group(row)),
                job.scale_index(slice, i, row),
            )
        } else {
            let s = job.scale.as_ref().map(|s| s.grid.index(slice, row, g));
            (job.zero_source(slice, row, g), s)
        }
    }

    /// Output row `row`'s entries, in order, into `out`: what
    /// [`Rows::entry`] gives, read as runs (entry g's zero point and scale
    /// are a fixed step past entry g − 1's) without its arithmetic per
    /// entry.
    fn entries(&self, job: &DecodeJob<'_>, slice: usize, row: usize, out: &mut Vec<Entry>) {
        let n = self.groups;
        out.clear();
        let (z0, s0) = self.sources(job, slice, row, 0);
        let (z1, s1) = if n > 1 {
            self.sources(job, slice, row, 1)
        } else {
            (z0, s0)
        };
        let zeros = match (&job.zero, z0, z1) {
            (None, ..) => Some(Run::None),
            (
                Some(ZeroPoint::Packed { fields } | ZeroPoint::PackedAlongCols { fields }),
                Some(Source::Field(a)),
                Some(Source::Field(b)),
            ) if fields.whole_fields() && b >= a => Some(Run::Fields(fields, a, b - a)),
            (Some(ZeroPoint::Plain(v)), Some(Source::Value(a)), Some(Source::Value(b)))
                if b >= a =>
            {
                Some(Run::Values(v, a, b - a))
            }
            _ => None,
        };
        let scales = match (&job.scale, s0, s1) {
            (None, ..) => Some(Run::None),
            (Some(v), Some(a), Some(b)) if b >= a => Some(Run::Values(v, a, b - a)),
            _ => None,
        };
        let (Some(zeros), Some(scales)) = (zeros, scales) else {
            out.extend((0..n).map(|g| self.entry(job, slice, row, g)));
            return;
        };
        out.resize(n, (None, None));
        zeros.read(job, n, &mut |g, z| out[g].0 = Some(z));
        scales.read(job, n, &mut |g, s| out[g].1 = Some(s));
        // The runs are the accessors' own steps (checked in tests' builds).
        let bits = |(z, s): Entry| (z.map(f32::to_bits), s.map(f32::to_bits));
        debug_assert_eq!(
            out.last().copied().map(bits),
            Some(bits(self.entry(job, slice, row, n - 1)))
        );
    }

    /// Decodes output row `row` of `slice`, whose codes are lane `lane` of
    /// `codes`' slice `cs`, through the tables of its entries (`s` is
    /// scratch space, reused from row to row: unless `fresh`, it holds them
    /// already, the previous row's).
    fn row<const N: usize>(
        &self,
        job: &DecodeJob<'_>,
        slice: usize,
        row: usize,
        (codes, cs, lane): (&Fields<'_>, usize, usize),
        out: &mut [u8],
        (s, fresh): (&mut Tables, bool),
    ) {
        if let Some(lin) = self.direct {
            self.direct_row::<N>(job, (slice, row), (codes, cs, lane), lin, out, (s, fresh));
            return;
        }
        let straight4 = job.g_idx.is_none() && self.byte_packed && codes.bits == 4;
        // Tables by scale byte need no entries.
        let by_scale =
            straight4 && job.code_values.len() == 16 && !self.smoothing && self.by_scale.is_some();
        if fresh && !by_scale {
            self.entries(job, slice, row, &mut s.entries);
            s.offsets.clear();
            if let Some(o) = &job.offset {
                s.offsets
                    .extend((0..self.groups).map(|g| o.get(o.grid.index(slice, row, g))));
            }
        }
        if let (true, 16) = (straight4, job.code_values.len()) {
            let (tables, entries) = (&mut s.t16, &s.entries);
            if let (true, Some(lr)) = (self.smoothing, &job.low_rank) {
                if fresh {
                    tables.clear();
                    Table16::products(self.isa, job, entries.iter().copied(), &mut |t| {
                        tables.push(t)
                    });
                }
                self.smoothed_row::<N>(job, codes, (cs, lane), out, (tables, &lr.inv_smooth));
            } else if let Some(by) = &self.by_scale {
                let grid = job.scale.as_ref().map(|v| v.grid);
                let index = |g| grid.map_or(0, |grid| grid.index(slice, row, g));
                self.nibble_row::<N>(codes, (cs, lane), out, |g| by.at(job, index(g)));
            } else if job.offset.is_some() {
                if fresh {
                    tables.clear();
                    for (&(zero, scale), &offset) in entries.iter().zip(&s.offsets) {
                        tables.push(Table16::with_offset(self.isa, job, zero, scale, offset));
                    }
                }
                self.nibble_row::<N>(codes, (cs, lane), out, |g| &tables[g]);
            } else {
                if fresh {
                    tables.clear();
                    Table16::extend(self.isa, job, entries.iter().copied(), &mut |t| {
                        tables.push(t)
                    });
                }
                self.nibble_row::<N>(codes, (cs, lane), out, |g| &tables[g]);
            }
            return;
        }
        let n = job.code_values.len();
        let tables = &mut s.values;
        if fresh {
            tables.clear();
        }
        for (g, &(zero, scale)) in s.entries.iter().enumerate().filter(|_| fresh) {
            let offset = s.offsets.get(g).copied();
            // The operations are exactly `DecodeJob::value`'s: (q − z)·s,
            // then the post scale, then the offset.
            let value = |c: f32| {
                let q = zero.map_or(c, |z| c - z);
                let v = job.post(job.scaled(q, scale));
                offset.map_or(v, |o| v + o)
            };
            if n == 16 {
                let table = match offset {
                    Some(o) => Table16::with_offset(self.isa, job, zero, scale, o),
                    None => Table16::new(self.isa, job, zero, scale),
                };
                tables.extend(table.values.map(u64::from));
                continue;
            }
            let values = job.code_values.iter().map(|&c| value(c));
            match job.out {
                OutDtype::Bf16 => tables.extend(values.map(|v| numerics::f32_to_bf16(v) as u64)),
                OutDtype::F16 => tables.extend(values.map(|v| numerics::f32_to_f16(v) as u64)),
                OutDtype::F32 => tables.extend(values.map(|v| numerics::f32_bits(v) as u64)),
            }
        }
        match (&job.g_idx, self.byte_packed, codes.bits) {
            (None, true, 8) => self.packed_row::<N, 8>(codes, cs, lane, out, (tables, n)),
            (None, true, 2) => self.packed_row::<N, 2>(codes, cs, lane, out, (tables, n)),
            (None, true, 1) => self.packed_row::<N, 1>(codes, cs, lane, out, (tables, n)),
            (g_idx, _, _) => {
                for (col, o) in out.chunks_exact_mut(N).enumerate() {
                    let g = match g_idx {
                        Some(gi) => gi[col] as usize,
                        None => col / self.group_cols,
                    };
                    let e = tables[g * n + codes.get(cs, lane, col) as usize];
                    o.copy_from_slice(&e.to_le_bytes()[..N]);
                }
            }
        }
    }

    /// [`Rows::row`] for direct values ([`direct`]): the row's codes read
    /// as bytes (1, 2 and 4 bits unpacked first), its entries as runs of
    /// f32s.
    fn direct_row<const N: usize>(
        &self,
        job: &DecodeJob<'_>,
        (slice, row): (usize, usize),
        (codes, cs, lane): (&Fields<'_>, usize, usize),
        lin: Linear,
        out: &mut [u8],
        (s, fresh): (&mut Tables, bool),
    ) {
        let cols = job.dims.cols;
        let start = (codes.lane_start(cs, lane).unwrap_or(0) / 8) as usize;
        let bytes = match codes.bits {
            8 => &codes.data[start..start + cols],
            bits => {
                let per_byte = (8 / bits) as usize;
                let src = &codes.data[start..start + cols.div_ceil(per_byte)];
                direct::unpack(src, bits, codes.high_first, cols, &mut s.unpacked);
                &s.unpacked[..cols]
            }
        };
        let Some(scale) = &job.scale else {
            // Direct values always have a scale (`Rows::of`).
            return;
        };
        let groups = match (self.gather, &job.zero) {
            // GGUF's: f32 scales one after another, read in place.
            (Gather::Blocks(_), None) => {
                let scales = f32_run(scale, slice, row, self.groups, &mut s.scales);
                let offsets = job
                    .offset
                    .as_ref()
                    .map(|o| f32_run(o, slice, row, self.groups, &mut s.offset_bytes));
                direct::Groups {
                    len: self.group_cols,
                    scales,
                    zeros: None,
                    offsets,
                }
            }
            _ => {
                if fresh {
                    self.entries(job, slice, row, &mut s.entries);
                    let f32s = |v: &mut Vec<u8>, x: &mut dyn Iterator<Item = f32>| {
                        v.clear();
                        v.extend(x.flat_map(f32::to_le_bytes));
                    };
                    let entries = &s.entries;
                    f32s(
                        &mut s.scales,
                        &mut entries.iter().map(|e| e.1.unwrap_or(1.0)),
                    );
                    f32s(
                        &mut s.zeros,
                        &mut entries.iter().map(|e| e.0.unwrap_or(0.0)),
                    );
                    let offsets = job
                        .offset
                        .as_ref()
                        .map(|o| (0..self.groups).map(move |g| o.get(o.grid.index(slice, row, g))));
                    f32s(&mut s.offset_bytes, &mut offsets.into_iter().flatten());
                }
                direct::Groups {
                    len: self.group_cols,
                    scales: &s.scales,
                    zeros: job.zero.as_ref().map(|_| &s.zeros[..]),
                    offsets: job.offset.as_ref().map(|_| &s.offset_bytes[..]),
                }
            }
        };
        direct::row::<N>(self.isa.wide(), (bytes, lin), groups, job.out, out);
    }

    /// The inner loop of a smoothed row: 4-bit codes two to a byte, entry
    /// g's f32 products in `tables[g]`, each product times its column's
    /// factor and rounded once (`DecodeJob::value` through a rank-0
    /// `LowRank::apply`).
    fn smoothed_row<const N: usize>(
        &self,
        job: &DecodeJob<'_>,
        f: &Fields<'_>,
        (slice, lane): (usize, usize),
        out: &mut [u8],
        (tables, factors): (&[Table16], &[f32]),
    ) {
        let cols = out.len() / N;
        let start = ((slice as u64 * f.slice_bits + lane as u64 * f.lane_bits) / 8) as usize;
        let bytes = &f.data[start..start + cols.div_ceil(2)];
        let hf = f.high_first;
        for ((g, group_out), t) in out.chunks_mut(self.group_cols * N).enumerate().zip(tables) {
            let first = g * self.group_cols;
            let n = group_out.len() / N;
            let done = if first.is_multiple_of(2) {
                let factors = (&factors[first..first + n], hf);
                simd::smoothed::<N>(
                    self.isa,
                    &bytes[first / 2..],
                    &t.planes,
                    factors,
                    group_out,
                    job.out,
                )
            } else {
                0
            };
            for (i, o) in group_out.chunks_exact_mut(N).enumerate().skip(done) {
                let col = first + i;
                let code = (bytes[col / 2] >> (((col % 2) ^ usize::from(hf)) * 4)) & 15;
                let v = f32::from_bits(t.values[code as usize]) * factors[col];
                job.out.encode(v, o);
            }
        }
    }

    /// The inner loop for 4-bit codes two to a byte, `table(g)` the table of
    /// entry g.
    fn nibble_row<'t, const N: usize>(
        &self,
        f: &Fields<'_>,
        (slice, lane): (usize, usize),
        out: &mut [u8],
        table: impl Fn(usize) -> &'t Table16,
    ) {
        let cols = out.len() / N;
        let start = ((slice as u64 * f.slice_bits + lane as u64 * f.lane_bits) / 8) as usize;
        let bytes = &f.data[start..start + cols.div_ceil(2)];
        // High-first bytes (bitsandbytes) hold the even column in the high nibble.
        let hf = f.high_first;
        for (g, group_out) in out.chunks_mut(self.group_cols * N).enumerate() {
            let t = table(g);
            let first = g * self.group_cols;
            let mut done = 0;
            if first.is_multiple_of(2) {
                let codes = &bytes[first / 2..];
                // 32 codes per load where the CPU has shuffles.
                done = simd::nibbles::<N>(
                    self.isa,
                    codes,
                    (&t.values, &t.planes),
                    group_out,
                    hf,
                    self.stream,
                );
                // Eight codes per little-endian u32: one load, eight lookups
                // assembled in registers, two (bf16/f16) or four (f32) stores.
                let words = codes[done / 2..].chunks_exact(4);
                let rest = &mut group_out[done * N..];
                for (w, o) in words.zip(rest.chunks_exact_mut(8 * N)) {
                    let mut x = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                    if hf {
                        x = (x >> 4) & 0x0F0F_0F0F | (x & 0x0F0F_0F0F) << 4;
                    }
                    let at = |k: u32| t.values[((x >> (4 * k)) & 15) as usize] as u64;
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
                let code = (bytes[col / 2] >> (((col % 2) ^ usize::from(hf)) * 4)) & 15;
                o.copy_from_slice(&t.values[code as usize].to_le_bytes()[..N]);
            }
        }
    }

    /// The inner loop for codes of 1, 2 or 8 bits packed whole into bytes,
    /// through tables of `n` values each (fewer than 2^BITS where codes
    /// unpacked from blocks were widened).
    fn packed_row<const N: usize, const BITS: usize>(
        &self,
        f: &Fields<'_>,
        slice: usize,
        lane: usize,
        out: &mut [u8],
        (tables, n): (&[u64], usize),
    ) {
        let per_byte = 8 / BITS;
        let mask = (1u32 << BITS) - 1;
        // High-first bytes: slot k of a byte holds field per_byte − 1 − k.
        let flip = if f.high_first { per_byte - 1 } else { 0 };
        let cols = out.len() / N;
        let start = ((slice as u64 * f.slice_bits + lane as u64 * f.lane_bits) / 8) as usize;
        let bytes = &f.data[start..start + cols.div_ceil(per_byte)];
        for (g, group_out) in out.chunks_mut(self.group_cols * N).enumerate() {
            let t = &tables[g * n..g * n + n];
            let first = g * self.group_cols;
            for (i, o) in group_out.chunks_exact_mut(N).enumerate() {
                let col = first + i;
                let code =
                    (bytes[col / per_byte] as u32 >> (((col % per_byte) ^ flip) * BITS)) & mask;
                o.copy_from_slice(&t[code as usize].to_le_bytes()[..N]);
            }
        }
    }
}

/// The f32 bytes of entries `0..groups` of output row `row`: the stored
/// ones where they are f32s one after another (GGUF's grids), else read
/// into `buf`.
fn f32_run<'v>(
    v: &'v Values<'_>,
    slice: usize,
    row: usize,
    groups: usize,
    buf: &'v mut Vec<u8>,
) -> &'v [u8] {
    let at = v.grid.index(slice, row, 0);
    let stored = matches!(v.kind, ValueKind::F32)
        .then(|| v.data.get(4 * at..4 * (at + groups)))
        .flatten();
    match stored {
        Some(b) => b,
        None => {
            buf.clear();
            buf.extend((0..groups).flat_map(|g| v.get(at + g).to_le_bytes()));
            buf
        }
    }
}

/// Fields in a block at most (GGUF's super-blocks).
const MAX_BLOCK: usize = 256;

/// Byte-wide fields (each below 2^width) packed `width` bits apart, LSB
/// first, into `out` (`fields.len()` a multiple of 8 but for a row's last).
fn pack(fields: &[u8], width: u32, out: &mut [u8]) {
    let per = (8 / width) as usize;
    for (o, f) in out.iter_mut().zip(fields.chunks(per)) {
        *o = f
            .iter()
            .enumerate()
            .fold(0, |b, (k, &x)| b | x << (k as u32 * width));
    }
}

/// Makes `buf` at least `len` bytes long; what it holds stays (the gathers
/// write every byte they read, so zeroing each band would only cost).
fn grow(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0);
    }
}

/// A run of zero points or scales, each a fixed step past the last.
#[derive(Debug, Clone, Copy)]
enum Run<'j, 'a> {
    /// None stored.
    None,
    /// Packed fields (of `code_values`) from bit `start`, `step` bits apart.
    Fields(&'j Fields<'a>, u64, u64),
    /// Values from index `start`, `step` apart.
    Values(&'j Values<'a>, usize, usize),
}

impl Run<'_, '_> {
    /// Gives `each` every entry g < n's value, as the job's accessors read it.
    fn read(self, job: &DecodeJob<'_>, n: usize, each: &mut impl FnMut(usize, f32)) {
        match self {
            Run::None => {}
            Run::Fields(f, start, step) => {
                for g in 0..n {
                    each(
                        g,
                        job.code_values[f.field_at(start + g as u64 * step) as usize],
                    );
                }
            }
            Run::Values(v, start, step) => {
                let d: &[u8] = &v.data;
                let at = |g: usize| start + g * step;
                // The kinds scales mostly are, without a match per entry.
                match v.kind {
                    ValueKind::F16 => (0..n).for_each(|g| {
                        let i = at(g);
                        each(
                            g,
                            numerics::f16_to_f32(u16::from_le_bytes([d[2 * i], d[2 * i + 1]])),
                        )
                    }),
                    ValueKind::Bf16 => (0..n).for_each(|g| {
                        let i = at(g);
                        each(
                            g,
                            numerics::bf16_to_f32(u16::from_le_bytes([d[2 * i], d[2 * i + 1]])),
                        )
                    }),
                    ValueKind::I8 => (0..n).for_each(|g| each(g, d[at(g)] as i8 as f32)),
                    ValueKind::F32 => (0..n).for_each(|g| {
                        let i = 4 * at(g);
                        each(g, f32::from_le_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]]))
                    }),
                    _ => (0..n).for_each(|g| each(g, v.get(at(g)))),
                }
            }
        }
    }
}

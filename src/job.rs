//! The format-free description of one dense output tensor.
//!
//! Every format maps onto the same description: a stream of b-bit codes, a
//! table giving each code's value, an optional zero point and scale looked up
//! on a (row group, column group) grid, and the output dtype. The value of
//! element (slice, row, col) is
//!
//! ```text
//! round_to_out( (code_values[code] − zero) · scale )
//! ```
//!
//! computed in f32. SVDQuant jobs add a low-rank branch and a smoothing
//! divisor ([`LowRank`]). Backends execute exactly this; the accessors below
//! are the reference semantics the CPU backend runs and the shaders mirror.
//!
//! Words, one per concept: a *job* describes one whole tensor; a *chunk* is a
//! range of a job's rows a backend decodes at once; a *lane* is one run of
//! fields in a stream; a *row group* and a *column group* are the rows and the
//! columns that share one scale or zero-point *entry* (a block's rows and
//! columns for block scales); an *element* is one output value.

use std::ops::{Deref, Range};
use std::sync::Arc;

use crate::checkpoint::TensorRef;
use crate::numerics::OutDtype;
/// The values of the formats' minifloat codes, for building `code_values`
/// and scale tables: E2M1 (FP4), FP8 E4M3 (fn), E8M0.
pub use crate::numerics::{e2m1, e4m3, e8m0};

/// Bytes a job reads: a stored tensor's, an app's own, or bytes the host
/// made while planning (unpacked tiles, folded scales), shared between the
/// jobs and chunks that read them.
#[derive(Debug, Clone)]
pub enum Bytes<'a> {
    /// A tensor's stored bytes, borrowed from the checkpoint (empty while a
    /// checkpoint handed over in memory has not loaded them).
    Stored(TensorRef<'a>),
    /// Bytes the caller holds.
    Borrowed(&'a [u8]),
    /// Bytes made on the host.
    Owned(Arc<[u8]>),
}

impl<'a> Bytes<'a> {
    /// The stored tensor these bytes are, if they are one.
    pub fn tensor(&self) -> Option<TensorRef<'a>> {
        match self {
            Bytes::Stored(t) => Some(*t),
            _ => None,
        }
    }
}

impl Deref for Bytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Stored(t) => t.stored(),
            Bytes::Borrowed(b) => b,
            Bytes::Owned(b) => b,
        }
    }
}

impl<'a> From<TensorRef<'a>> for Bytes<'a> {
    fn from(t: TensorRef<'a>) -> Self {
        Bytes::Stored(t)
    }
}

impl<'a> From<&'a [u8]> for Bytes<'a> {
    fn from(b: &'a [u8]) -> Self {
        Bytes::Borrowed(b)
    }
}

impl From<Vec<u8>> for Bytes<'_> {
    fn from(b: Vec<u8>) -> Self {
        Bytes::Owned(b.into())
    }
}

/// Logical size of a decode: `slices` independent `rows × cols` matrices
/// (3-D expert weights have one slice per expert; 2-D weights have one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Number of stacked matrices.
    pub slices: usize,
    /// Rows per matrix.
    pub rows: usize,
    /// Columns per matrix.
    pub cols: usize,
}

impl Dims {
    /// Rows of all slices together (the unit backends split work by).
    pub fn total_rows(&self) -> usize {
        self.slices * self.rows
    }

    /// Number of output elements.
    pub fn elements(&self) -> usize {
        self.slices * self.rows * self.cols
    }
}

/// b-bit unsigned fields in a little-endian, LSB-first byte stream.
///
/// A stream is a set of *lanes* (one per row for weight codes, one per column
/// group for zero points packed along rows). Inside a lane, field `i` starts
/// at bit `i·b` (dense, may cross 32-bit words) or, for the padded layout, at
/// bit `(i div per_word)·32 + (i mod per_word)·b` of the lane's 32-bit words.
/// The lane's 32-bit words need not be adjacent: `word_bits` apart.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    /// The raw bytes.
    pub data: Bytes<'a>,
    /// Field width, 1..=8.
    pub bits: u32,
    /// Fields per 32-bit word in the padded layout; 0 for the dense layout.
    pub per_word: u32,
    /// Padded words hold their even fields first, then the odd ones: field
    /// slot k of a word holds element `[0, 2, 4, 6, 1, 3, 5, 7][k]` for
    /// eight per word (AutoAWQ's order). Only with `per_word` even.
    pub interleaved: bool,
    /// Bits from the start of one lane to the next.
    pub lane_bits: u64,
    /// Bits from one 32-bit word of a lane to the next (32 when contiguous).
    pub word_bits: u64,
    /// Bits from one slice to the next.
    pub slice_bits: u64,
    /// Each byte holds its fields from the high bits down: of two 4-bit
    /// fields the first is the high nibble (bitsandbytes), the opposite of
    /// the LSB-first order. Only for the dense layout with `bits` 1, 2, 4 or
    /// 8, where no field crosses a byte: field `i`'s bit position is the
    /// LSB-first one with its offset in the byte mirrored, `pos ^ (8 − bits)`.
    pub high_first: bool,
}

/// A stream's layout is named by its constructor; its geometry beyond the
/// lane stride (slices, words apart, AutoAWQ's order) by the `with_…`
/// methods, whose defaults are one slice and contiguous words.
impl<'a> Fields<'a> {
    /// `bits`-wide fields in lanes `lane_bits` apart, `per_word` to a
    /// 32-bit word (0: the dense layout), for formats that tell the layout
    /// from the stored width.
    pub fn new(data: impl Into<Bytes<'a>>, bits: u32, per_word: u32, lane_bits: u64) -> Self {
        Fields {
            data: data.into(),
            bits,
            per_word,
            interleaved: false,
            lane_bits,
            word_bits: 32,
            slice_bits: 0,
            high_first: false,
        }
    }

    /// The dense layout: field `i` of a lane at bit `i·bits`.
    pub fn dense(data: impl Into<Bytes<'a>>, bits: u32, lane_bits: u64) -> Self {
        Self::new(data, bits, 0, lane_bits)
    }

    /// The padded layout: as many fields to a 32-bit word as fit whole.
    pub fn padded(data: impl Into<Bytes<'a>>, bits: u32, lane_bits: u64) -> Self {
        // Zero-width fields have nothing to pad; they read as dense.
        Self::new(data, bits, 32u32.checked_div(bits).unwrap_or(0), lane_bits)
    }

    /// Slices `slice_bits` apart (3-D weights).
    pub fn with_slice_bits(mut self, slice_bits: u64) -> Self {
        self.slice_bits = slice_bits;
        self
    }

    /// A lane's 32-bit words `word_bits` apart (zero points packed along
    /// rows, whose lanes share each row of words).
    pub fn with_word_bits(mut self, word_bits: u64) -> Self {
        self.word_bits = word_bits;
        self
    }

    /// Padded words in AutoAWQ's order, even fields first.
    pub fn interleaved(mut self) -> Self {
        self.interleaved = true;
        self
    }

    /// Bytes filled from their high bits down (bitsandbytes' nibble order:
    /// byte k holds field 2k in its high nibble).
    pub fn high_first(mut self) -> Self {
        self.high_first = true;
        self
    }
}

impl Fields<'static> {
    /// `lanes` lanes of `len` padded `bits`-wide fields for each of
    /// `slices` slices, field (slice, lane, i) being `field(slice, lane,
    /// i)`, on the host: each lane's words one after another, or
    /// (`side_by_side`) word w of every lane, then word w + 1 (zero points
    /// packed along rows, as compressed-tensors stores them and the fast
    /// kernels read them). `None` where the sizes overflow.
    fn in_lanes(
        (slices, lanes, len): (usize, usize, usize),
        bits: u32,
        side_by_side: bool,
        field: impl Fn(usize, usize, usize) -> u32,
    ) -> Option<Fields<'static>> {
        let per = (32 / bits) as usize;
        let lane_words = len.div_ceil(per);
        let slice_words = lanes.checked_mul(lane_words)?;
        let mut words = vec![0u32; slices.checked_mul(slice_words)?];
        for s in 0..slices {
            for l in 0..lanes {
                for i in 0..len {
                    let w = i / per;
                    let at = s * slice_words + if side_by_side { w * lanes + l } else { l * lane_words + w };
                    words[at] |= field(s, l, i) << ((i % per) as u32 * bits);
                }
            }
        }
        Some(Fields::of_words(&words, bits, (lanes, lane_words), side_by_side))
    }

    /// Padded `bits`-wide fields held in `words`: `lanes` lanes of
    /// `lane_words` words a slice, each lane's words one after another or
    /// (`side_by_side`) word w of every lane, then word w + 1.
    fn of_words(words: &[u32], bits: u32, (lanes, lane_words): (usize, usize), side_by_side: bool) -> Fields<'static> {
        let (lane_bits, word_bits) = match side_by_side {
            true => (32, lanes as u64 * 32),
            false => (lane_words as u64 * 32, 32),
        };
        let bytes: Arc<[u8]> = bytemuck::cast_slice::<u32, u8>(words).into();
        // Where the width divides 32, padded fields are dense ones: named
        // dense, the layout the fast kernels take.
        let per_word = if 32 % bits == 0 { 0 } else { 32 / bits };
        let fields = Fields::new(Bytes::Owned(bytes), bits, per_word, lane_bits);
        fields.with_word_bits(word_bits).with_slice_bits((lanes * lane_words) as u64 * 32)
    }
}

impl Fields<'_> {
    /// The same `slices × lanes × len` fields, `width` bits wide (this
    /// width or more), with each lane's words one after another, as
    /// [`Fields::in_lanes`] writes them: whole words copied where each
    /// holds its lane's next fields in plain order at the same width
    /// (GPTQ's `qweight`, whose words are strided), the last one's fields
    /// past `len` cleared; else field by field. `None` past the data.
    fn in_lane_order(&self, (slices, lanes, len): (usize, usize, usize), width: u32) -> Option<Fields<'static>> {
        let words_whole = width == self.bits
            && self.per_word == 0
            && 32 % self.bits == 0
            && !self.high_first
            && [self.lane_bits, self.word_bits, self.slice_bits].iter().all(|b| b % 32 == 0);
        if !words_whole {
            return Fields::in_lanes((slices, lanes, len), width, false, |s, l, i| self.get(s, l, i));
        }
        let per = (32 / self.bits) as usize;
        let lane_words = len.div_ceil(per);
        let tail = match len % per {
            0 => u32::MAX,
            r => (1 << (r as u32 * self.bits)) - 1,
        };
        let total = slices.checked_mul(lanes)?.checked_mul(lane_words)?;
        let mut words = Vec::with_capacity(total.min(self.data.len() / 4));
        for s in 0..slices {
            for l in 0..lanes {
                for w in 0..lane_words {
                    let word = self.word(s, l, w)?;
                    words.push(if w + 1 == lane_words { word & tail } else { word });
                }
            }
        }
        Some(Fields::of_words(&words, self.bits, (lanes, lane_words), false))
    }

    /// [`Fields::in_lane_order`] for the stored `slices × rows × cols`
    /// fields of a transposed job: lane = stored column, of `rows` fields.
    /// AutoAWQ's words (eight 4-bit fields in its order, whole words, rows
    /// a multiple of 8) are transposed 8 × 8 at a time; else field by field.
    fn transposed_in_lane_order(&self, Dims { slices, rows, cols }: Dims) -> Option<Fields<'static>> {
        let awq = self.bits == 4
            && self.per_word == 8
            && self.interleaved
            && !self.high_first
            && self.word_bits == 32
            && [self.lane_bits, self.slice_bits].iter().all(|b| b % 32 == 0)
            && rows.is_multiple_of(8);
        let lane_words = rows / 8;
        let total = slices.checked_mul(cols)?.checked_mul(lane_words)?;
        if !awq || total > self.data.len() / 4 {
            return Fields::in_lanes((slices, cols, rows), self.bits, false, |s, c, r| self.get(s, r, c));
        }
        let mut words = vec![0u32; total];
        for s in 0..slices {
            for c in 0..cols.div_ceil(8) {
                for k in 0..lane_words {
                    let mut block = [0u32; 8];
                    for (j, w) in block.iter_mut().enumerate() {
                        *w = self.word(s, 8 * k + j, c)?;
                    }
                    // Stored column 8c + e is output lane 8c + e.
                    for (e, w) in awq_transposed(block).into_iter().enumerate().take(cols - 8 * c) {
                        words[(s * cols + 8 * c + e) * lane_words + k] = w;
                    }
                }
            }
        }
        Some(Fields::of_words(&words, 4, (cols, lane_words), false))
    }

    /// Word `w` of `lane` in `slice` whole (a lane's words start on a byte
    /// here), `None` past the data.
    fn word(&self, slice: usize, lane: usize, w: usize) -> Option<u32> {
        let at = usize::try_from(self.bit(slice, lane, (w as u64, 0)) / 8).ok()?;
        let b = self.data.get(at..at.checked_add(4)?)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// What a bit position is XORed with to find its field in the byte
    /// (`8 − bits` for [`Fields::high_first`] streams, else 0).
    #[inline]
    pub fn swap_mask(&self) -> u64 {
        if self.high_first {
            8u64.saturating_sub(self.bits as u64) & 7
        } else {
            0
        }
    }

    /// Bit position inside a lane's words: (word, offset in word).
    #[inline]
    pub(crate) fn locate(&self, i: usize) -> (u64, u32) {
        let i = i as u64;
        let b = self.bits as u64;
        if self.per_word == 0 {
            ((i * b) / 32, ((i * b) % 32) as u32)
        } else {
            let pw = self.per_word as u64;
            let m = rem(i, pw);
            let slot = if self.interleaved {
                m / 2 + (m % 2) * (pw / 2)
            } else {
                m
            };
            (div(i, pw), (slot * b) as u32)
        }
    }

    /// Reads `n` (≤ 8, or 16 from a byte's first bit) bits starting at
    /// absolute bit `pos`.
    #[inline]
    fn read_bits(&self, pos: u64, n: u32) -> u32 {
        let byte = (pos / 8) as usize;
        let shift = (pos % 8) as u32;
        let lo = self.data[byte] as u32;
        let hi = if shift + n > 8 {
            self.data[byte + 1] as u32
        } else {
            0
        };
        ((lo | hi << 8) >> shift) & ((1 << n) - 1)
    }

    /// First bit of `lane` in `slice`.
    pub fn lane_start(&self, slice: usize, lane: usize) -> Option<u64> {
        (slice as u64)
            .checked_mul(self.slice_bits)?
            .checked_add((lane as u64).checked_mul(self.lane_bits)?)
    }

    /// One past the last bit that fields `0..len` of `lane` in `slice` touch.
    pub fn lane_end(&self, slice: usize, lane: usize, len: usize) -> Option<u64> {
        if len == 0 {
            return self.lane_start(slice, lane);
        }
        let (w, off) = self.locate(len - 1);
        // An interleaved word's last element need not sit in its last slot.
        let end_in_word = if self.interleaved {
            32
        } else {
            off as u64 + self.bits as u64
        };
        let end = if end_in_word > 32 {
            (w + 1).checked_mul(self.word_bits)? + (end_in_word - 32)
        } else {
            w.checked_mul(self.word_bits)? + end_in_word
        };
        let end = self.lane_start(slice, lane)?.checked_add(end)?;
        // A high-first field may sit at the top of its byte.
        if self.high_first {
            end.checked_next_multiple_of(8)
        } else {
            Some(end)
        }
    }

    /// The last bit (exclusive) any field of a `slices × lanes × len` stream
    /// touches; planners check it against `data.len()` before a job exists.
    pub fn extent_bits(&self, slices: usize, lanes: usize, len: usize) -> Option<u64> {
        if slices == 0 || lanes == 0 || len == 0 {
            return Some(0);
        }
        self.lane_end(slices - 1, lanes - 1, len)
    }

    /// Whether no field crosses a word: each is read whole at its
    /// [`Fields::position`].
    pub(crate) fn whole_fields(&self) -> bool {
        self.per_word != 0 || 32 % self.bits == 0
    }

    /// The first bit of the field of `lane`, index `i`, in `slice`, for
    /// [`Fields::field_at`] (fields that cross no word: `whole_fields`).
    #[inline]
    pub(crate) fn position(&self, slice: usize, lane: usize, i: usize) -> u64 {
        self.bit(slice, lane, self.locate(i))
    }

    /// The bit at offset `off` of word `w` of `lane` in `slice`.
    #[inline]
    fn bit(&self, slice: usize, lane: usize, (w, off): (u64, u32)) -> u64 {
        slice as u64 * self.slice_bits + lane as u64 * self.lane_bits + w * self.word_bits + off as u64
    }

    /// The field at bit `pos` of a [`Fields::position`]: what `get` reads.
    #[inline]
    pub(crate) fn field_at(&self, pos: u64) -> u32 {
        self.read_bits(pos ^ self.swap_mask(), self.bits)
    }

    /// The set bits at positions `lo..hi` of the stream (a bitmask's count).
    #[inline]
    pub fn ones(&self, lo: u64, hi: u64) -> u64 {
        let mut n = 0;
        let mut pos = lo;
        while pos < hi {
            let k = (hi - pos).min(8 - pos % 8) as u32;
            n += self.read_bits(pos, k).count_ones() as u64;
            pos += k as u64;
        }
        n
    }

    /// The field of `lane`, index `i`, in `slice`.
    #[inline]
    pub fn get(&self, slice: usize, lane: usize, i: usize) -> u32 {
        let (w, off) = self.locate(i);
        let lo_n = (32 - off).min(self.bits);
        let lo = self.read_bits(self.bit(slice, lane, (w, off)) ^ self.swap_mask(), lo_n);
        if lo_n == self.bits {
            lo
        } else {
            let hi = self.read_bits(self.bit(slice, lane, (w + 1, 0)), self.bits - lo_n);
            lo | hi << lo_n
        }
    }
}

/// `x / d`, by a shift when `d` is a power of two: the divisors of the
/// accessors (fields per word, rows and columns per entry) mostly are, and
/// a division costs tens of cycles where a table is built per entry.
#[inline]
fn div<T: Divisor>(x: T, d: T) -> T {
    if d.is_pow2() {
        x.shr(d)
    } else {
        x / d
    }
}

/// `x % d`, by a mask when `d` is a power of two.
#[inline]
fn rem<T: Divisor>(x: T, d: T) -> T {
    if d.is_pow2() {
        x.mask(d)
    } else {
        x % d
    }
}

/// The unsigned integers [`div`] and [`rem`] take.
trait Divisor: Copy + std::ops::Div<Output = Self> + std::ops::Rem<Output = Self> {
    fn is_pow2(self) -> bool;
    fn shr(self, d: Self) -> Self;
    fn mask(self, d: Self) -> Self;
}

macro_rules! divisor {
    ($($t:ty),*) => {$(
        impl Divisor for $t {
            #[inline]
            fn is_pow2(self) -> bool {
                self.is_power_of_two()
            }
            #[inline]
            fn shr(self, d: Self) -> Self {
                self >> d.trailing_zeros()
            }
            #[inline]
            fn mask(self, d: Self) -> Self {
                self & (d - 1)
            }
        }
    )*};
}
divisor!(u64, usize);

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

/// Scales stored as bytes quantized blockwise: entry `i` is
/// `f32(table[byte[i]] · outer[i div per_outer]) + offset`, two f32
/// operations rounded on their own, in that order (bitsandbytes'
/// `dequantize_blockwise` of its absmax, then `+= offset`).
#[derive(Debug, Clone, PartialEq)]
pub struct Nested {
    /// The value of each byte (`nested_quant_map`).
    pub table: [f32; 256],
    /// One factor per `per_outer` entries (`nested_absmax`).
    pub outer: Arc<[f32]>,
    /// Entries sharing one outer factor (`nested_blocksize`), at least 1.
    pub per_outer: usize,
    /// Added last (`nested_offset`).
    pub offset: f32,
}

impl Nested {
    /// Entry `i` whose byte is `b` (Rust never fuses the two operations).
    #[inline]
    pub fn get(&self, i: usize, b: u8) -> f32 {
        self.table[b as usize] * self.outer[i / self.per_outer] + self.offset
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

/// Greatest common divisor (`a` where `b` is 0): of rows or columns per
/// grid entry.
pub(crate) fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Slot of element `e` in an AutoAWQ word ([`Fields::interleaved`]):
/// `e/2 + (e%2)·4`.
pub(crate) const AWQ_SLOT: [u32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// Eight AutoAWQ words, word `k` holding elements 0..8 of lane `k`, as
/// eight plain ones, word `e` holding element `e` of lanes 0..8, low nibble
/// first: an 8 × 8 block of 4-bit codes transposed.
pub(crate) fn awq_transposed(words: [u32; 8]) -> [u32; 8] {
    transpose_8x8(words.map(spread_awq)).map(pack_nibbles)
}

/// An AutoAWQ word's eight codes, a byte each in element order.
fn spread_awq(x: u32) -> u64 {
    AWQ_SLOT
        .iter()
        .enumerate()
        .fold(0, |v, (e, &slot)| v | (((x >> (4 * slot)) & 15) as u64) << (8 * e))
}

/// Eight byte-wide codes (each below 16) packed two to a byte, low first.
fn pack_nibbles(v: u64) -> u32 {
    let t = (v | v >> 4) & 0x00FF_00FF_00FF_00FF;
    let t = (t | t >> 8) & 0x0000_FFFF_0000_FFFF;
    (t | t >> 16) as u32
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
    fn transposed(&self, Dims { slices, rows, cols }: Dims) -> Option<Values<'static>> {
        if matches!(self.kind, ValueKind::Nested(_)) {
            return None;
        }
        let g = self.grid;
        // Entries shared by every slice stay shared.
        let slices = if g.slice_stride == 0 { 1 } else { slices };
        let (row_groups, col_groups) = (rows.div_ceil(g.row_div), cols.div_ceil(g.col_div));
        let size = self.kind.size();
        // Each entry is copied once: no more than the data holds.
        let len = slices.checked_mul(row_groups)?.checked_mul(col_groups)?.checked_mul(size)?;
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
            slice_stride: if g.slice_stride == 0 { 0 } else { row_groups * col_groups },
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
    fn codes_whole(&self, codes: &Fields<'_>, (slices, rows, cols): (usize, usize, usize), width: u32) -> Option<Fields<'static>> {
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

/// The arithmetic the scaled value `(q − zero) · scale` is computed in,
/// before any post scale and the final rounding to the output dtype. A
/// producer whose dequantizer multiplies two tensors of a 16-bit dtype rounds
/// both operands and the product to that dtype; this names it, so that every
/// backend performs the same operations (planners choose it, backends never
/// branch on the format). With a dtype `d`:
///
/// ```text
/// round_out( round_d( round_d(q − zero) · round_d(scale) ) )
/// ```
///
/// The f32 product of two values of 8 (bf16) or 11 (f16) significant bits is
/// exact, so rounding it once to `d` is `d`'s own correctly rounded multiply
/// (what torch computes for two bf16 or f16 tensors). Jobs with a low-rank
/// branch always compute in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Product {
    /// In f32 (the numerics contract's default).
    #[default]
    F32,
    /// In the output dtype: the scale is rounded to it first (ModelOpt's
    /// `FP8QTensor.dequantize`: `weight.to(dtype) * scale.to(dtype)`). An f32
    /// output makes this the f32 product.
    OutDtype,
    /// In bf16 whatever the output, then cast (compressed-tensors'
    /// `mxfp8-quantized`: a bf16 `2^(e−127)` scale times bf16 codes; an f16
    /// or f32 output is that bf16 value cast).
    Bf16,
}

/// Everything needed to produce one dense tensor.
#[derive(Debug, Clone)]
pub struct DecodeJob<'a> {
    /// Logical size.
    pub dims: Dims,
    /// The weight codes: lane = row, index = column.
    pub codes: Fields<'a>,
    /// Value of each code (length 2^bits): integer codes with their offset
    /// removed, E2M1 or E4M3 values.
    pub code_values: Arc<[f32]>,
    /// Zero point, when the scheme is asymmetric.
    pub zero: Option<ZeroPoint<'a>>,
    /// Scale, when there is one.
    pub scale: Option<Values<'a>>,
    /// Activation-order group of each column, replacing `col div col_div`.
    pub g_idx: Option<Vec<u32>>,
    /// SVDQuant's low-rank branch and smoothing, when the job has them.
    pub low_rank: Option<LowRank>,
    /// A constant the value is multiplied by last, rounded on its own:
    /// `f32(f32(q · s) · post_scale)` (LLM.int8's `1/127`, applied after its
    /// per-row scale, as bitsandbytes computes it).
    pub post_scale: Option<f32>,
    /// The arithmetic of the scaled value (see [`Product`]).
    pub product: Product,
    /// Output dtype.
    pub out: OutDtype,
    /// The codes are kept only where a bitmask is set ([`Sparse`]).
    pub sparse: Option<Sparse<'a>>,
    /// The output is the stored matrix transposed: element (slice, row, col)
    /// is stored element (slice, col, row). `dims` are the output's; codes,
    /// zero point and scale are addressed in the stored orientation
    /// ([`DecodeJob::stored_dims`]). AutoAWQ stores `[in, out]`, GPT-OSS's
    /// experts `[E, out, in]` of a dense `[E, in, out]`.
    pub transposed: bool,
}

/// SVDQuant's low-rank branch `up · downᵀ` and per-column smoothing, in one
/// of two orders (`q·s` is the scaled code, `lr = Σ_j up[row,j]·down[col,j]`
/// summed in order j = 0, 1, …):
///
/// ```text
/// smooth_first = false (logical):         (q·s + lr) · inv_smooth[col]
/// smooth_first = true  (nunchaku_packed): (q·s) · inv_smooth[col] + lr
/// ```
///
/// Every operation rounds on its own, as in the reference: no fused
/// multiply-add (the shader keeps its compiler from contracting, see
/// `opaque` in decode.wgsl). The smoothing divisor is applied as a
/// host-computed reciprocal because WGSL division is not correctly rounded.
#[derive(Debug, Clone)]
pub struct LowRank {
    /// Rank r; 0: no branch, the smoothing alone.
    pub rank: usize,
    /// `[rows, r]`, row-major.
    pub up: Arc<[f32]>,
    /// `[cols, r]`, row-major.
    pub down: Arc<[f32]>,
    /// `1 / smooth_factor`, one per column.
    pub inv_smooth: Arc<[f32]>,
    /// Smoothing applies to the residual only (the packed layout's
    /// `proj_down` is stored already divided by the smoothing factor).
    pub smooth_first: bool,
}

impl LowRank {
    /// `Σ_j up[row, j] · down[col, j]`, in order.
    #[inline]
    pub fn sum(&self, row: usize, col: usize) -> f32 {
        let r = self.rank;
        let up = &self.up[row * r..row * r + r];
        let down = &self.down[col * r..col * r + r];
        up.iter().zip(down).fold(0.0f32, |acc, (u, d)| acc + u * d)
    }

    /// The dense value of scaled code `q·s` at (row, col).
    #[inline]
    pub fn apply(&self, q: f32, s: f32, row: usize, col: usize) -> f32 {
        let rs = self.inv_smooth[col];
        // Rank 0 is the smoothing alone (ModelOpt's pre-quant scale): nothing
        // is added, not even an empty sum's +0.0, which turns −0.0 into +0.0.
        if self.rank == 0 {
            return q * s * rs;
        }
        let lr = self.sum(row, col);
        if self.smooth_first {
            q * s * rs + lr
        } else {
            (q * s + lr) * rs
        }
    }
}

/// A job starts as codes read through `code_values`; the `with_…` methods
/// add what the format has besides. [`DecodeJob::transpose`] makes a job
/// built in the stored orientation write the transpose.
impl<'a> DecodeJob<'a> {
    /// The job writing `code_values[code]` of each of `codes` as `out`:
    /// no zero point, scale, g_idx or low-rank branch, not transposed.
    pub fn new(dims: Dims, codes: Fields<'a>, code_values: impl Into<Arc<[f32]>>, out: OutDtype) -> Self {
        DecodeJob {
            dims,
            codes,
            code_values: code_values.into(),
            zero: None,
            scale: None,
            g_idx: None,
            low_rank: None,
            post_scale: None,
            product: Product::F32,
            out,
            sparse: None,
            transposed: false,
        }
    }

    /// Reads the codes through a bitmask (see [`Sparse`]): `codes` then holds
    /// the kept codes alone, in lane 0.
    pub fn with_sparse(mut self, sparse: Sparse<'a>) -> Self {
        self.sparse = Some(sparse);
        self
    }

    /// Computes the scaled value in `product`'s arithmetic (see [`Product`]).
    pub fn with_product(mut self, product: Product) -> Self {
        self.product = product;
        self
    }

    /// Multiplies every value by `factor` last (see [`DecodeJob::post_scale`]).
    pub fn with_post_scale(mut self, factor: f32) -> Self {
        self.post_scale = Some(factor);
        self
    }

    /// Scales the codes' values by `scale`.
    pub fn with_scale(mut self, scale: Values<'a>) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Subtracts `zero` (when there is one: asymmetric schemes) before scaling.
    pub fn with_zero(mut self, zero: impl Into<Option<ZeroPoint<'a>>>) -> Self {
        self.zero = zero.into();
        self
    }

    /// Reads each column's group from `g_idx` (when there is one:
    /// activation order).
    pub fn with_g_idx(mut self, g_idx: impl Into<Option<Vec<u32>>>) -> Self {
        self.g_idx = g_idx.into();
        self
    }

    /// Adds SVDQuant's low-rank branch and smoothing.
    pub fn with_low_rank(mut self, low_rank: LowRank) -> Self {
        self.low_rank = Some(low_rank);
        self
    }
}

impl<'a> DecodeJob<'a> {
    /// Column group of `col` on `grid`.
    #[inline]
    fn group(&self, grid: &Grid, col: usize) -> usize {
        match &self.g_idx {
            Some(g) => g[col] as usize,
            None => div(col, grid.col_div),
        }
    }

    /// The job writing the transpose of what it wrote (`dims` swap).
    pub fn transpose(mut self) -> Self {
        std::mem::swap(&mut self.dims.rows, &mut self.dims.cols);
        self.transposed = !self.transposed;
        self
    }

    /// The same weight with its packs rewritten in output order, a row's
    /// 4- or 8-bit codes one word after another: what products read. A
    /// transposed job's codes (AutoAWQ's `[in, out]`) become a straight
    /// job's, its scales and plain zero points move to the transposed grid,
    /// and zero points packed along columns become packed along rows, in
    /// plain field order. A straight job keeps the rest: its rows' words
    /// strided (GPTQ's `[in/8, out]`) or its rows' fields interleaved
    /// (ModelOpt INT4-AWQ's two rows a byte) are put one after another, at
    /// the same size; a sparse job's codes are written whole, the pruned
    /// ones 0 as [`DecodeJob::code`] reads them (compressed-tensors' 2:4
    /// FP8: a byte a weight, against about 0.56 stored); and narrower codes
    /// (and packed zero points) are widened to 4 bits (int3: a third more
    /// than stored), their table padded. `None` where the job is already
    /// in output order or has what this does not rewrite (g_idx, a
    /// transposed bitmask or low-rank branch, nested scales, zero points
    /// packed along rows, codes wider than 8 bits).
    pub(crate) fn in_output_order(&self) -> Option<DecodeJob<'a>> {
        let c = &self.codes;
        let width = match c.bits {
            1..=4 => 4,
            5..=8 => 8,
            _ => return None,
        };
        if self.g_idx.is_some() {
            return None;
        }
        if !self.transposed {
            if c.bits == width && c.per_word == 0 && c.word_bits == 32 && self.sparse.is_none() {
                return None;
            }
            let Dims { slices, rows, cols } = self.dims;
            let codes = match &self.sparse {
                Some(sp) => sp.codes_whole(c, (slices, rows, cols), width)?,
                None => c.in_lane_order((slices, rows, cols), width)?,
            };
            let zero = match &self.zero {
                // Lanes: the scale's column groups (one without), side by side.
                Some(ZeroPoint::Packed { fields }) if fields.bits != width => {
                    let groups = self.scale.as_ref().map_or(1, |v| cols.div_ceil(v.grid.col_div));
                    let fields = Fields::in_lanes((slices, groups, rows), width, true, |s, g, r| fields.get(s, g, r))?;
                    Some(ZeroPoint::Packed { fields })
                }
                zero => zero.clone(),
            };
            // Entries no code reads, as `first + c`: a table `c − offset`
            // goes on as one, so that kernels still compute it.
            let cv = &self.code_values;
            let first = cv.first().copied().unwrap_or(0.0);
            let code_values: Vec<f32> = (0..cv.len().max(1 << width))
                .map(|c| cv.get(c).copied().unwrap_or(first + c as f32))
                .collect();
            return Some(DecodeJob {
                codes,
                zero,
                code_values: code_values.into(),
                sparse: None,
                ..self.clone()
            });
        }
        if self.sparse.is_some() || self.low_rank.is_some() || c.bits != width {
            return None;
        }
        // Stored rows are the inputs, stored columns the outputs.
        let stored = self.stored_dims();
        let Dims { slices, rows: ins, cols: outs } = stored;
        let codes = self.codes.transposed_in_lane_order(stored)?;
        let scale = match &self.scale {
            Some(v) => Some(v.transposed(stored)?),
            None => None,
        };
        let zero = match &self.zero {
            None => None,
            Some(ZeroPoint::Plain(v)) => Some(ZeroPoint::Plain(v.transposed(stored)?)),
            Some(ZeroPoint::PackedAlongCols { fields }) => {
                // Lane: the stored row group, now the column group of both.
                let lanes = self.scale.as_ref().map_or(1, |s| ins.div_ceil(s.grid.row_div));
                let fields = Fields::in_lanes((slices, lanes, outs), fields.bits, true, |s, g, o| fields.get(s, g, o))?;
                Some(ZeroPoint::Packed { fields })
            }
            Some(ZeroPoint::Packed { .. }) => return None,
        };
        Some(DecodeJob {
            dims: self.dims,
            codes,
            code_values: self.code_values.clone(),
            zero,
            scale,
            g_idx: None,
            low_rank: None,
            post_scale: self.post_scale,
            product: self.product,
            out: self.out,
            sparse: None,
            transposed: false,
        })
    }

    /// The same weight read as `n` rows of `k` inputs, for a job whose rows
    /// are another view of the same row-major elements (bitsandbytes' 4-bit
    /// packs, whose blocks cross the weight's rows, are decoded as rows of
    /// whole blocks): its stream of codes cut into rows of `k`, and its
    /// scales, each serving a run of elements, repeated for every row and
    /// group of `gcd(k, run)` inputs as the f32 values they are. `None`
    /// where the job is no such view (its rows W's own already, a stack,
    /// codes not one stream, zero points, runs that are not regular, sizes
    /// that overflow), or where those groups would split code words.
    pub(crate) fn in_rows(&self, n: usize, k: usize) -> Option<DecodeJob<'a>> {
        let Dims { slices, rows, cols } = self.dims;
        let c = &self.codes;
        let stream = c.per_word == 0 && c.word_bits == 32 && c.lane_bits == (cols as u64).checked_mul(c.bits as u64)?;
        let plain = self.zero.is_none() && self.g_idx.is_none() && self.sparse.is_none() && self.low_rank.is_none();
        let view = (rows, cols) != (n, k) && rows.checked_mul(cols)? == n.checked_mul(k)?;
        if slices != 1 || !view || !stream || !plain || self.transposed || k == 0 {
            return None;
        }
        let codes = Fields {
            lane_bits: k as u64 * c.bits as u64,
            ..c.clone()
        };
        let scale = match &self.scale {
            None => None,
            Some(v) => {
                // The elements one entry serves, one after another.
                let g = v.grid;
                let run = match g.col_div >= cols {
                    true => g.row_div.checked_mul(cols)?,
                    false if cols.is_multiple_of(g.col_div) => g.col_div,
                    false => return None,
                };
                // Groups of whole code words (or rows of one group), as
                // products read them: else a scale for each few codes.
                let group = gcd(k, run);
                if group < k && !group.is_multiple_of((32 / c.bits.max(1)) as usize) {
                    return None;
                }
                let groups = k / group;
                let mut values = Vec::with_capacity(n.checked_mul(groups)?.checked_mul(4)?);
                for r in 0..n {
                    for j in 0..groups {
                        let at = r * k + j * group;
                        let s = v.get(self.scale_index(0, at / cols, at % cols)?);
                        values.extend_from_slice(&s.to_le_bytes());
                    }
                }
                let grid = Grid { row_div: 1, col_div: group, row_stride: groups, slice_stride: 0 };
                Some(Values { data: Bytes::Owned(values.into()), kind: ValueKind::F32, grid })
            }
        };
        Some(DecodeJob {
            dims: Dims { slices: 1, rows: n, cols: k },
            codes,
            scale,
            ..self.clone()
        })
    }

    /// The dimensions codes, zero point and scale are addressed in.
    pub fn stored_dims(&self) -> Dims {
        let d = self.dims;
        if self.transposed {
            Dims {
                rows: d.cols,
                cols: d.rows,
                ..d
            }
        } else {
            d
        }
    }

    /// The f32 value of output element (slice, row, col), before the final
    /// rounding.
    #[inline]
    pub fn value(&self, slice: usize, row: usize, col: usize) -> f32 {
        let (row, col) = if self.transposed {
            (col, row)
        } else {
            (row, col)
        };
        let (q, s) = self.code_and_scale(slice, row, col);
        let v = match &self.low_rank {
            Some(lr) => lr.apply(q, s.unwrap_or(1.0), row, col),
            None => self.scaled(q, s),
        };
        self.post(v)
    }

    /// The dtype the scaled value is computed in when it is not f32 (see
    /// [`Product`]).
    #[inline]
    pub fn product_dtype(&self) -> Option<OutDtype> {
        match (self.product, self.out) {
            (Product::F32, _) | (Product::OutDtype, OutDtype::F32) => None,
            (Product::OutDtype, d) => Some(d),
            (Product::Bf16, _) => Some(OutDtype::Bf16),
        }
    }

    /// `q · s` (`q` alone without a scale) in the job's [`Product`]
    /// arithmetic: what every backend's value and table builders compute
    /// from a code's value less its zero point and its entry's scale.
    #[inline]
    pub fn scaled(&self, q: f32, s: Option<f32>) -> f32 {
        match self.product_dtype() {
            None => s.map_or(q, |s| q * s),
            Some(d) => {
                let q = d.round(q);
                s.map_or(q, |s| d.round(q * d.round(s)))
            }
        }
    }

    /// `v` times the job's [`DecodeJob::post_scale`], when it has one.
    #[inline]
    pub fn post(&self, v: f32) -> f32 {
        match self.post_scale {
            Some(f) => v * f,
            None => v,
        }
    }

    /// The weight an SVDQuant activation shift multiplies at (row, col): the
    /// whole value, except in the packed order, whose low-rank branch sees
    /// the unshifted input, where it is the smoothed residual alone.
    pub fn shifted_weight(&self, row: usize, col: usize) -> f32 {
        match &self.low_rank {
            Some(lr) if lr.smooth_first => {
                let (q, s) = self.code_and_scale(0, row, col);
                q * s.unwrap_or(1.0) * lr.inv_smooth[col]
            }
            _ => self.value(0, row, col),
        }
    }

    /// The code's value less its zero point, and the scale, of one stored
    /// element.
    #[inline]
    fn code_and_scale(&self, slice: usize, row: usize, col: usize) -> (f32, Option<f32>) {
        let mut v = self.code_values[self.code(slice, row, col) as usize];
        let (zero, s) = self.zero_and_scale(slice, row, col);
        if let Some(z) = zero {
            v -= z;
        }
        (v, s)
    }

    /// The code of one stored element: its field, or through the bitmask of
    /// a sparse job (code 0 where the bit is clear).
    #[inline]
    pub fn code(&self, slice: usize, row: usize, col: usize) -> u32 {
        match &self.sparse {
            None => self.codes.get(slice, row, col),
            Some(sp) if sp.mask.get(slice, row, col) == 0 => 0,
            Some(sp) => self.codes.get(slice, 0, sp.index(row, col) as usize),
        }
    }

    /// The first bit of the codes of stored (slice, row), for the ranges
    /// backends upload and writers release.
    pub fn codes_start(&self, slice: usize, row: usize) -> Option<u64> {
        match &self.sparse {
            None => self.codes.lane_start(slice, row),
            Some(sp) => sp.start(row, 0).checked_mul(self.codes.bits as u64),
        }
    }

    /// The zero point and the scale of one stored element (what a backend's
    /// code table for that element's entries is built from).
    #[inline]
    pub(crate) fn zero_and_scale(
        &self,
        slice: usize,
        row: usize,
        col: usize,
    ) -> (Option<f32>, Option<f32>) {
        let z = self.zero_at(slice, row, self.zero_group(col));
        let s = self
            .scale
            .as_ref()
            .zip(self.scale_index(slice, row, col))
            .map(|(s, i)| s.get(i));
        (z, s)
    }

    /// Where the scale of one stored element is stored.
    #[inline]
    pub(crate) fn scale_index(&self, slice: usize, row: usize, col: usize) -> Option<usize> {
        let s = self.scale.as_ref()?;
        Some(s.grid.index(slice, row, self.group(&s.grid, col)))
    }

    /// Column group of `col` on the grid the zero point is read on: its own
    /// for plain zero points, the scale's for packed ones (lane 0 without a
    /// scale).
    #[inline]
    pub(crate) fn zero_group(&self, col: usize) -> usize {
        match (&self.zero, &self.scale) {
            (Some(ZeroPoint::Plain(z)), _) => self.group(&z.grid, col),
            (Some(ZeroPoint::PackedAlongCols { .. }), _) => col,
            (_, Some(s)) => self.group(&s.grid, col),
            (_, None) => 0,
        }
    }

    /// The zero point of stored (slice, row) in column group `g` of its grid
    /// (the column itself for zero points packed along columns).
    #[inline]
    pub fn zero_at(&self, slice: usize, row: usize, g: usize) -> Option<f32> {
        self.zero.as_ref().map(|z| match z {
            ZeroPoint::Packed { fields } => self.code_values[fields.get(slice, g, row) as usize],
            ZeroPoint::PackedAlongCols { fields } => {
                self.code_values[fields.get(slice, self.zero_lane(row), g) as usize]
            }
            ZeroPoint::Plain(v) => v.get(v.grid.index(slice, row, g)),
        })
    }

    /// Where `zero_at(slice, row, g)` reads its zero point.
    #[inline]
    pub(crate) fn zero_source(&self, slice: usize, row: usize, g: usize) -> Option<Source> {
        self.zero.as_ref().map(|z| match z {
            ZeroPoint::Packed { fields } => Source::Field(fields.position(slice, g, row)),
            ZeroPoint::PackedAlongCols { fields } => Source::Field(fields.position(slice, self.zero_lane(row), g)),
            ZeroPoint::Plain(v) => Source::Value(v.grid.index(slice, row, g)),
        })
    }

    /// The lane of stored `row` in zero points packed along columns: its row
    /// group on the scale grid (lane 0 without a scale).
    #[inline]
    pub fn zero_lane(&self, row: usize) -> usize {
        self.scale.as_ref().map_or(0, |s| div(row, s.grid.row_div))
    }

    /// The scale of (slice, row) in column group `g`.
    #[inline]
    pub fn scale_at(&self, slice: usize, row: usize, g: usize) -> Option<f32> {
        self.scale
            .as_ref()
            .map(|s| s.get(s.grid.index(slice, row, g)))
    }

    /// Output bytes of the whole tensor.
    pub fn out_bytes(&self) -> usize {
        self.dims.elements() * self.out.size()
    }

    /// Whether `f` holds for every entry of `v` (a scale or zero-point
    /// grid) that rows `rows` read: a transposed job's all, else each row's
    /// (an expert's, not its whole stack's). False when the grid is shorter
    /// than they need.
    pub(crate) fn entries_read(
        &self,
        v: &Values<'_>,
        rows: Range<usize>,
        mut f: impl FnMut(f32) -> bool,
    ) -> bool {
        let d = self.dims;
        let mut all = |r: Range<usize>| r.end <= v.len() && r.into_iter().all(|i| f(v.get(i)));
        if self.transposed || d.rows == 0 {
            return all(0..v.len());
        }
        let groups = d.cols.div_ceil(v.grid.col_div.max(1));
        rows.into_iter().all(|flat| {
            let at = v.grid.index(flat / d.rows, flat % d.rows, 0);
            all(at..at + groups)
        })
    }

    /// Whether decoding rows `rows` keeps every f32 operand and result of
    /// its arithmetic normal (or zero, infinite, NaN): GPUs may flush
    /// subnormals to zero (WGSL allows it; NVIDIA's Vulkan driver does, and
    /// an H200 decoded such values as zeros), so the GPU decodes a job only
    /// where this holds, and the CPU the others. Conservative: it bounds
    /// each step's smallest nonzero magnitude from the smallest inputs.
    pub fn stays_normal(&self, rows: Range<usize>) -> bool {
        self.smallest_value(rows)
            .is_some_and(|w| w >= SAFE_PRODUCT)
    }

    /// [`tiniest`] of the entries of `v` that rows `rows` read, each also
    /// shown to `each`; `None` when one is subnormal or the grid is short.
    fn tiniest_read(&self, v: &Values<'_>, rows: Range<usize>, mut each: impl FnMut(f32)) -> Option<f64> {
        let mut min = f64::INFINITY;
        let normal = self.entries_read(v, rows, |x| {
            each(x);
            tiniest([x]).map(|t| min = min.min(t)).is_some()
        });
        normal.then_some(min)
    }

    /// A lower bound on the magnitude of each nonzero value the job
    /// computes (its last product), or `None` where an input or an
    /// intermediate step may be subnormal.
    fn smallest_value(&self, rows: Range<usize>) -> Option<f64> {
        let integral = |v: f32| !v.is_finite() || v.fract() == 0.0;
        let codes = tiniest(self.code_values.iter().copied())?;
        let mut integers = self.code_values.iter().all(|&c| integral(c));
        // The code's value less its zero point: integers differ by 1 at
        // least, others by their smaller one's last bit.
        let mut w = match &self.zero {
            None => codes,
            Some(ZeroPoint::Plain(z)) => {
                let zeros = self.tiniest_read(z, rows.clone(), |v| integers &= integral(v))?;
                difference(integers, codes.min(zeros))?
            }
            Some(_) => difference(integers, codes)?,
        };
        if let Some(s) = &self.scale {
            if let ValueKind::Nested(n) = &s.kind {
                // f32(table · outer) + offset: the product and the offset
                // are summands.
                let product = tiniest(n.table)? * tiniest(n.outer.iter().copied())?;
                let offset = tiniest([n.offset])?;
                if product.min(offset) < SUMMAND {
                    return None;
                }
            }
            w *= self.tiniest_read(s, rows, |_| ())?;
            if w < SAFE_PRODUCT {
                return None;
            }
        }
        if let Some(lr) = &self.low_rank {
            let inv = tiniest(lr.inv_smooth.iter().copied())?;
            let branch = match lr.rank {
                0 => f64::INFINITY,
                _ => tiniest(lr.up.iter().copied())? * tiniest(lr.down.iter().copied())?,
            };
            // (q·s + lr)·inv or (q·s)·inv + lr: each summand large enough
            // that a nonzero sum is normal; the sum's last bit the bound.
            let (summands, after) = match lr.smooth_first {
                false => (w.min(branch), inv),
                true => ((w * inv).min(branch), 1.0),
            };
            if summands < SUMMAND {
                return None;
            }
            w = summands * ULP * after;
        }
        if let Some(p) = self.post_scale {
            w *= tiniest([p])?;
        }
        Some(w)
    }
}

/// 2^-24: an f32's last bit, relative to its value (at least).
const ULP: f64 = 1.0 / (1u64 << 24) as f64;

/// Values at least this large: a nonzero sum of two is at least the
/// smaller one's last bit, 2^-126, the smallest normal f32.
const SUMMAND: f64 = (f32::MIN_POSITIVE as f64) / ULP;

/// A product's bound at least this large is normal even after its factors
/// are rounded to bf16 or f16 first ([`Product`]): twice the smallest
/// normal.
const SAFE_PRODUCT: f64 = 2.0 * f32::MIN_POSITIVE as f64;

/// The smallest magnitude of `values` that is not zero (infinity when
/// there is none; infinities and NaN count as none), or `None` when one is
/// subnormal.
fn tiniest(values: impl IntoIterator<Item = f32>) -> Option<f64> {
    values.into_iter().try_fold(f64::INFINITY, |min, v| {
        let a = v.abs();
        match a {
            _ if a == 0.0 || !a.is_finite() => Some(min),
            _ if a < f32::MIN_POSITIVE => None,
            _ => Some(min.min(a as f64)),
        }
    })
}

/// A bound on a nonzero difference of values at least `smallest` (each
/// normal): 1 for integers, else the smaller one's last bit, which must be
/// normal itself.
fn difference(integers: bool, smallest: f64) -> Option<f64> {
    match integers {
        true => Some(smallest.min(1.0)),
        false if smallest >= SUMMAND => Some(smallest * ULP),
        false => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packs `codes` (each < 2^b) the way compressed-tensors ≥ 0.18 does: field i at bit i·b.
    fn pack_dense(codes: &[u32], b: u32) -> Vec<u8> {
        let words = (codes.len() * b as usize).div_ceil(32);
        let mut w = vec![0u32; words];
        for (i, &c) in codes.iter().enumerate() {
            let bit = i * b as usize;
            w[bit / 32] |= c << (bit % 32);
            if bit % 32 + b as usize > 32 {
                w[bit / 32 + 1] |= c >> (32 - bit % 32);
            }
        }
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Packs the 0.17 way: 32 div b fields per word, none crossing.
    fn pack_padded(codes: &[u32], b: u32) -> Vec<u8> {
        let pw = (32 / b) as usize;
        let mut w = vec![0u32; codes.len().div_ceil(pw)];
        for (i, &c) in codes.iter().enumerate() {
            w[i / pw] |= c << ((i % pw) as u32 * b);
        }
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn codes(n: usize, b: u32, seed: u32) -> Vec<u32> {
        let mut rng = fastrand::Rng::with_seed(seed.into());
        (0..n).map(|_| rng.u32(..1 << b)).collect()
    }

    /// Every element of `a` and `b`, bit for bit.
    fn same_values(a: &DecodeJob<'_>, b: &DecodeJob<'_>, what: &str) {
        assert_eq!(a.dims, b.dims, "{what}");
        let d = a.dims;
        for s in 0..d.slices {
            for r in 0..d.rows {
                for c in 0..d.cols {
                    let (x, y) = (a.value(s, r, c), b.value(s, r, c));
                    assert_eq!(x.to_bits(), y.to_bits(), "{what}: ({s}, {r}, {c})");
                }
            }
        }
    }

    #[test]
    fn packs_in_output_order_decode_as_stored() {
        let mut rng = fastrand::Rng::with_seed(0x0A17);
        let mut bytes = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.u8(..)).collect() };
        // AutoAWQ's shape: stored [2, 40 in, 24 out], 4-bit words in its
        // order, f16 scales and packed zero points per 8 inputs (5 groups).
        let stored = Dims { slices: 2, rows: 40, cols: 24 };
        let grid = Grid { row_div: 8, col_div: 1, row_stride: 24, slice_stride: 5 * 24 };
        // f16 scales from random bits, finite and nonzero: 0x3000..0x37ff.
        let scales: Vec<u8> = bytes(2 * 2 * 5 * 24).chunks(2).flat_map(|b| [b[0], 0x30 | (b[1] & 7)]).collect();
        let awq = DecodeJob::new(stored, Fields::padded(bytes(2 * 40 * 12), 4, 96).with_slice_bits(40 * 96).interleaved(), (0..16).map(|c| c as f32 - 8.0).collect::<Vec<_>>(), OutDtype::Bf16)
            .with_scale(Values { data: scales.into(), kind: ValueKind::F16, grid })
            .with_zero(ZeroPoint::PackedAlongCols { fields: Fields::padded(bytes(2 * 5 * 12), 4, 96).with_slice_bits(5 * 96).interleaved() })
            .transpose();
        let repacked = awq.in_output_order().unwrap();
        assert!(!repacked.transposed && matches!(repacked.zero, Some(ZeroPoint::Packed { .. })));
        same_values(&awq, &repacked, "4-bit, packed zero points");
        // Blocks transposed 8 × 8 are the fields rewritten one by one, with
        // the last word column whole and half full.
        for outs in [24, 20] {
            let f = Fields::padded(bytes(2 * 40 * 12), 4, 96).with_slice_bits(40 * 96).interleaved();
            let blocks = f.transposed_in_lane_order(Dims { slices: 2, rows: 40, cols: outs }).unwrap();
            let by_field = Fields::in_lanes((2, outs, 40), 4, false, |s, c, r| f.get(s, r, c)).unwrap();
            assert_eq!(&blocks.data[..], &by_field.data[..], "{outs} outputs");
        }
        // 8-bit codes, table scales shared by the slices, plain zero points
        // on their own grid (3 stored columns a group).
        let stored = Dims { slices: 2, rows: 6, cols: 9 };
        let mut table = Box::new([0f32; 256]);
        for (i, t) in table.iter_mut().enumerate() {
            *t = crate::numerics::e4m3(i as u8) / 3.0;
        }
        let job = DecodeJob::new(stored, Fields::padded(bytes(2 * 6 * 12), 8, 96).with_slice_bits(6 * 96), (0..=255u8).map(|c| c as i8 as f32).collect::<Vec<_>>(), OutDtype::F32)
            .with_scale(Values { data: bytes(3 * 9).into(), kind: ValueKind::Table(table), grid: Grid { row_div: 2, col_div: 1, row_stride: 9, slice_stride: 0 } })
            .with_zero(ZeroPoint::Plain(Values { data: bytes(2 * 6 * 3).into(), kind: ValueKind::I8, grid: Grid { row_div: 1, col_div: 3, row_stride: 3, slice_stride: 18 } }))
            .transpose();
        same_values(&job, &job.in_output_order().unwrap(), "8-bit, plain zero points");
        // GPTQ's shape: 2 slices of 12 outputs by 44 inputs, stored [in/8,
        // out] (a row's words 12 words apart, the last half full), with f16
        // scales and plain zero points per 8 inputs, left where they are.
        let (rows, cols, words) = (12, 44, 6);
        let grid = Grid { row_div: 1, col_div: 8, row_stride: words, slice_stride: rows * words };
        let scales: Vec<u8> = bytes(2 * 2 * rows * words).chunks(2).flat_map(|b| [b[0], 0x30 | (b[1] & 7)]).collect();
        let codes = Fields::dense(bytes(2 * words * rows * 4), 4, 32).with_word_bits(32 * rows as u64).with_slice_bits((words * rows * 32) as u64);
        let gptq = DecodeJob::new(Dims { slices: 2, rows, cols }, codes.clone(), (0..16).map(|c| c as f32).collect::<Vec<_>>(), OutDtype::F16)
            .with_scale(Values { data: scales.into(), kind: ValueKind::F16, grid })
            .with_zero(ZeroPoint::Plain(Values { data: bytes(2 * rows * words).into(), kind: ValueKind::I8, grid }));
        let repacked = gptq.in_output_order().unwrap();
        assert!(repacked.codes.word_bits == 32 && repacked.codes.lane_bits == words as u64 * 32);
        same_values(&gptq, &repacked, "4-bit, strided words");
        // Whole words copied are the fields written one by one, tail too.
        let by_field = Fields::in_lanes((2, rows, cols), 4, false, |s, l, i| codes.get(s, l, i)).unwrap();
        assert_eq!(&repacked.codes.data[..], &by_field.data[..]);
        // A straight job's padded fields become a stream; one in a stream
        // already, and nested scales, are left as they are.
        let straight = job.clone().transpose();
        let stream = straight.in_output_order().unwrap();
        same_values(&straight, &stream, "8-bit, padded");
        assert!(stream.in_output_order().is_none());
        let nested = Nested { table: [1.0; 256], outer: vec![2.0; 4].into(), per_outer: 8, offset: 0.0 };
        let mut job = job;
        job.scale.as_mut().unwrap().kind = ValueKind::Nested(Box::new(nested));
        assert!(job.in_output_order().is_none());
    }

    #[test]
    fn narrow_codes_and_zero_points_are_widened_as_they_decode() {
        let mut rng = fastrand::Rng::with_seed(0x0A19);
        let mut bytes = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.u8(..)).collect() };
        // 2 slices of 6 rows by 40 columns, bf16 scales per 8 columns (5
        // groups), zero points packed along rows, lanes (groups) side by side.
        let (slices, rows, cols, groups) = (2, 6, 40, 5);
        let grid = Grid { row_div: 1, col_div: 8, row_stride: groups, slice_stride: rows * groups };
        let scales: Vec<u8> = bytes(2 * slices * rows * groups).chunks(2).flat_map(|b| [b[0], 0x3c]).collect();
        for bits in [2u32, 3, 6] {
            let codes = Fields::dense(bytes(slices * rows * cols), bits, (cols as u64) * bits as u64)
                .with_slice_bits(rows as u64 * cols as u64 * bits as u64);
            let values: Vec<f32> = (0..1 << bits).map(|c| c as f32 - 3.0).collect();
            let words = rows.div_ceil((32 / bits) as usize);
            let zero = Fields::padded(bytes(slices * words * groups * 4), bits, 32)
                .with_word_bits(groups as u64 * 32)
                .with_slice_bits((words * groups) as u64 * 32);
            let job = DecodeJob::new(Dims { slices, rows, cols }, codes, values, OutDtype::Bf16)
                .with_scale(Values { data: scales.clone().into(), kind: ValueKind::Bf16, grid })
                .with_zero(ZeroPoint::Packed { fields: zero });
            let wide = job.in_output_order().unwrap();
            let width = if bits <= 4 { 4 } else { 8 };
            assert_eq!(wide.codes.bits, width);
            // The table goes on as `c − 3` where no code reads it.
            assert!(wide.code_values.iter().zip(0..1 << width).all(|(&v, c)| v == c as f32 - 3.0));
            assert!(matches!(&wide.zero, Some(ZeroPoint::Packed { fields }) if fields.bits == width && fields.lane_bits == 32));
            same_values(&job, &wide, &format!("{bits}-bit codes and zero points"));
        }
    }

    #[test]
    fn a_view_of_the_elements_is_read_in_the_weights_rows() {
        let mut rng = fastrand::Rng::with_seed(0x0A18);
        let mut bytes = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.u8(..)).collect() };
        // bitsandbytes' views of a 6 × 40 weight in blocks of 16: rows of
        // whole blocks (3 × 80), and blocks of rows (rows of 8, 2 a block).
        let nf4: Vec<f32> = crate::formats::bnb::NF4.to_vec();
        let scales: Vec<u8> = bytes(15 * 4).chunks(4).flat_map(|b| [b[0], b[1], b[2], 0x3c]).collect();
        for (rows, cols, grid) in [
            (3, 80, Grid { row_div: 1, col_div: 16, row_stride: 5, slice_stride: 0 }),
            (30, 8, Grid { row_div: 2, col_div: 8, row_stride: 1, slice_stride: 0 }),
        ] {
            let codes = Fields::dense(bytes(120), 4, cols as u64 * 4).high_first();
            let view = DecodeJob::new(Dims { slices: 1, rows, cols }, codes, nf4.clone(), OutDtype::Bf16)
                .with_scale(Values { data: scales.clone().into(), kind: ValueKind::F32, grid });
            let weight = view.in_rows(6, 40).unwrap();
            assert_eq!(weight.dims, Dims { slices: 1, rows: 6, cols: 40 });
            for at in 0..240 {
                let (x, y) = (view.value(0, at / cols, at % cols), weight.value(0, at / 40, at % 40));
                assert_eq!(x.to_bits(), y.to_bits(), "{rows} x {cols}: element {at}");
            }
            // The weight's rows split groups of 16 at 40: groups of 8.
            assert_eq!(weight.scale.as_ref().unwrap().grid.col_div, 8);
            // 7 × 40 is another weight; rows of 20 would split a word of
            // codes between two blocks' scales.
            assert!(view.in_rows(5, 48).is_some() && view.in_rows(7, 40).is_none());
            assert!(view.in_rows(12, 20).is_none());
        }
    }

    #[test]
    fn dense_stream_every_width() {
        for b in 1..=8u32 {
            let cols = 37; // not a multiple of 32/b for any b > 1: tail words are partial
            let rows = 3;
            let all: Vec<Vec<u32>> = (0..rows).map(|r| codes(cols, b, 7 + r as u32)).collect();
            let words_per_row = (cols * b as usize).div_ceil(32);
            let data: Vec<u8> = all.iter().flat_map(|c| pack_dense(c, b)).collect();
            let f = Fields::dense(&data[..], b, words_per_row as u64 * 32);
            assert_eq!(
                f.extent_bits(1, rows, cols),
                Some(((rows - 1) * words_per_row * 32 + cols * b as usize) as u64)
            );
            for (r, row) in all.iter().enumerate() {
                for (c, &want) in row.iter().enumerate() {
                    assert_eq!(f.get(0, r, c), want, "b={b} r={r} c={c}");
                }
            }
        }
    }

    #[test]
    fn padded_stream_every_width() {
        for b in 1..=8u32 {
            let cols = 37;
            let pw = 32 / b;
            let row = codes(cols, b, 99);
            let data = pack_padded(&row, b);
            let f = Fields::padded(&data[..], b, data.len() as u64 * 8);
            assert_eq!(f.per_word, pw);
            for (c, &want) in row.iter().enumerate() {
                assert_eq!(f.get(0, 0, c), want, "b={b} c={c}");
            }
        }
    }

    /// Hand-packed 3-bit words: fields 10 and 21 straddle word boundaries.
    #[test]
    fn word_crossing_fields_by_hand() {
        // Fields 0..=11 with values 0..=7,0..=3 at 3 bits. Field 10 = value 2 (0b010)
        // occupies bits 30..33: bit 30-31 = 0b10 in word 0, bit 32 = 0b0 in word 1.
        let vals: Vec<u32> = (0..12).map(|i| i % 8).collect();
        let mut w0 = 0u32;
        let mut w1 = 0u32;
        for (i, &v) in vals.iter().enumerate() {
            let bit = i * 3;
            if bit + 3 <= 32 {
                w0 |= v << bit;
            } else if bit >= 32 {
                w1 |= v << (bit - 32);
            } else {
                w0 |= v << bit; // low bits; the high ones fall off
                w1 |= v >> (32 - bit);
            }
        }
        assert_eq!(w0 >> 30, 0b10);
        let data: Vec<u8> = [w0, w1].iter().flat_map(|x| x.to_le_bytes()).collect();
        let f = Fields::dense(&data[..], 3, 64);
        for (i, &v) in vals.iter().enumerate() {
            assert_eq!(f.get(0, 0, i), v, "field {i}");
        }
    }

    /// Zero points are packed along rows: lane = column group, words `groups` apart.
    #[test]
    fn strided_lanes_cross_words() {
        for b in 1..=8u32 {
            let rows = 23;
            let groups = 3;
            let cols_codes: Vec<Vec<u32>> =
                (0..groups).map(|g| codes(rows, b, 5 + g as u32)).collect();
            let packed: Vec<Vec<u32>> = cols_codes
                .iter()
                .map(|c| {
                    pack_dense(c, b)
                        .chunks(4)
                        .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                        .collect()
                })
                .collect();
            let zrows = packed[0].len();
            // Row-major [zrows, groups] int32.
            let mut data = Vec::new();
            for w in 0..zrows {
                for p in &packed {
                    data.extend_from_slice(&p[w].to_le_bytes());
                }
            }
            let f = Fields::dense(&data[..], b, 32).with_word_bits(32 * groups as u64);
            assert!(f.extent_bits(1, groups, rows).unwrap() <= data.len() as u64 * 8);
            for (g, col) in cols_codes.iter().enumerate() {
                for (r, &want) in col.iter().enumerate() {
                    assert_eq!(f.get(0, g, r), want, "b={b} g={g} r={r}");
                }
            }
        }
    }

    /// AutoAWQ's word order by hand: field k of a word holds column
    /// `[0, 2, 4, 6, 1, 3, 5, 7][k]`, so columns 0..8 = 0..8 pack to
    /// 0x7531_6420.
    #[test]
    fn interleaved_words_read_autoawq_order() {
        let data = 0x7531_6420u32.to_le_bytes();
        let f = Fields::padded(&data[..], 4, 32).interleaved();
        let cols: Vec<u32> = (0..8).map(|c| f.get(0, 0, c)).collect();
        assert_eq!(cols, (0..8).collect::<Vec<u32>>());
        assert_eq!(
            f.extent_bits(1, 1, 3),
            Some(32),
            "a partial word is read whole"
        );
    }

    /// A transposed job's element (row, col) is the stored (col, row), with
    /// the stored element's scale.
    #[test]
    fn transposed_job_reads_the_stored_element() {
        // Stored 2x3 bytes (codes = values), scales per stored row.
        let codes = [1u8, 2, 3, 4, 5, 6];
        let scales: Vec<u8> = [1.0f32, 10.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let dims = Dims {
            slices: 1,
            rows: 2,
            cols: 3,
        };
        let codes = Fields::dense(&codes[..], 8, 24).with_slice_bits(48);
        let scale = Values {
            data: (&scales[..]).into(),
            kind: ValueKind::F32,
            grid: Grid {
                row_div: 1,
                col_div: 3,
                row_stride: 1,
                slice_stride: 2,
            },
        };
        let code_values = (0..256).map(|c| c as f32).collect::<Vec<f32>>();
        let job = DecodeJob::new(dims, codes, code_values, OutDtype::F32)
            .with_scale(scale)
            .transpose();
        assert_eq!(job.dims.rows, 3);
        assert_eq!(job.stored_dims().rows, 2);
        let got: Vec<f32> = (0..3)
            .flat_map(|r| (0..2).map(move |c| (r, c)))
            .map(|(r, c)| job.value(0, r, c))
            .collect();
        assert_eq!(got, [1.0, 40.0, 2.0, 50.0, 3.0, 60.0]);
    }

    /// `stays_normal`, step by step: subnormal inputs, products near the
    /// smallest normal, a post scale, zero points that are not integers,
    /// and only the scales of the rows asked about.
    #[test]
    fn stays_normal_bounds_every_step() {
        let dims = Dims {
            slices: 1,
            rows: 2,
            cols: 3,
        };
        let codes = [1u8, 2, 3, 4, 5, 6];
        let f32s = |v: &[f32]| v.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
        let grid = Grid {
            row_div: 1,
            col_div: 3,
            row_stride: 1,
            slice_stride: 2,
        };
        let tiny = f32::MIN_POSITIVE;
        let check = |code_values: &[f32], scales: &[f32], zeros: Option<&[f32]>, post: Option<f32>| {
            let (scales, zeros) = (f32s(scales), zeros.map(f32s));
            let values = |data: &[u8]| Values {
                data: data.to_vec().into(),
                kind: ValueKind::F32,
                grid,
            };
            let mut job = DecodeJob::new(
                dims,
                Fields::dense(&codes[..], 8, 24).with_slice_bits(48),
                code_values.to_vec(),
                OutDtype::F32,
            )
            .with_scale(values(&scales))
            .with_zero(zeros.as_deref().map(|z| ZeroPoint::Plain(values(z))));
            job.post_scale = post;
            (job.stays_normal(0..2), job.stays_normal(0..1))
        };
        let ints: Vec<f32> = (0..256).map(|c| c as f32 - 128.0).collect();
        assert_eq!(check(&ints, &[1.0, 2.0], None, None), (true, true));
        // A subnormal scale, in the second row only.
        assert_eq!(check(&ints, &[1.0, tiny / 2.0], None, None), (false, true));
        // Codes of 1 at least times 2^-125 stay normal; times 2^-126, too close.
        assert_eq!(check(&ints, &[1.0, 2.0 * tiny], None, None), (true, true));
        assert_eq!(check(&ints, &[1.0, tiny], None, None), (false, true));
        // A post scale takes the product below.
        assert_eq!(check(&ints, &[1.0, 2.0], None, Some(tiny)), (false, false));
        assert_eq!(check(&ints, &[1.0, 2.0], None, Some(0.5)), (true, true));
        // Integer zero points: differences of 1 at least.
        let zeros = [3.0, 7.0];
        assert_eq!(check(&ints, &[1.0, 1e-32], Some(&zeros), None), (true, true));
        // Others: the difference is bounded by the smaller one's last bit.
        let zeros = [3.5, 7.0];
        assert_eq!(check(&ints, &[1.0, 1e-32], Some(&zeros), None), (false, true));
        assert_eq!(check(&ints, &[1.0, 1.0], Some(&zeros), None), (true, true));
        // A subnormal code value.
        let mut subnormal = ints.clone();
        subnormal[7] = tiny / 4.0;
        assert_eq!(check(&subnormal, &[1.0, 1.0], None, None), (false, false));
    }
}

//! The code streams a job reads: b-bit fields in lanes of little-endian
//! words ([`Fields`]).

use std::sync::Arc;

use super::{Bytes, Dims};

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
    /// the LSB-first order. Only where no field crosses a byte: the dense
    /// layout with `bits` 1, 2, 4 or 8, or fields a byte apart (one to a
    /// word, `word_bits` 8) in slices `bits` apart (HQQ's packs: slice k in
    /// the byte's k-th field from the top). A field's bit position is the
    /// LSB-first one with its offset in the byte mirrored, `pos ^ (8 − bits)`.
    pub high_first: bool,
    /// The fields lie inside blocks that hold other things too (GGUF's,
    /// whose blocks carry their own scales): see [`InBlocks`]. The layout
    /// fields above then only give where lanes and slices start.
    pub blocks: Option<InBlocks>,
    /// The lanes come in parts that share their words, each part in its
    /// own fields of them (see [`Parts`]); `None`: lane `j` starts
    /// `j·lane_bits` in.
    pub parts: Option<Parts>,
}

/// Lanes in parts of `lanes` lanes that share the same words, each part at
/// its own bits of them, from the top down: lane `j` is lane `j mod lanes`
/// of part `k = j div lanes`, which starts at bit `top − k·down` of the
/// lane's words (hqq's `3bit_32`: the grouped weight's rows in ten parts of
/// `lanes` rows, part k in bits `27 − 3k .. 30 − 3k` of each int32; the last
/// part may hold fewer lanes, or none). Parts past `top / down` do not
/// exist: [`Fields::lane_start`] is `None` there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts {
    /// Lanes a part (at least 1).
    pub lanes: usize,
    /// The first part's offset in bits.
    pub top: u64,
    /// Bits from one part down to the next.
    pub down: u64,
}

impl Parts {
    /// Lane `lane`'s offset from lane 0 of part 0's start shifted by `top`:
    /// `(lane mod lanes)·lane_bits + top − (lane div lanes)·down`.
    #[inline]
    fn offset(&self, lane: usize, lane_bits: u64) -> Option<u64> {
        let (k, j) = (div(lane, self.lanes.max(1)), rem(lane, self.lanes.max(1)));
        (j as u64)
            .checked_mul(lane_bits)?
            .checked_add(self.top.checked_sub((k as u64).checked_mul(self.down)?)?)
    }
}

/// Fields inside a lane's blocks: a lane is a run of blocks `bytes` long,
/// each holding `len` fields; field `e` of a block is its `low` plane's
/// field `e`, plus its `high` plane's (where there is one) above the low
/// plane's bits. The stream's `bits` are both planes' together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InBlocks {
    /// Fields per block.
    pub len: u32,
    /// Bytes per block.
    pub bytes: u32,
    /// The low bits of each field.
    pub low: Plane,
    /// The high bits, stored apart (GGUF's Q5 and Q6 types).
    pub high: Option<Plane>,
}

/// One plane of a block's fields: `bits`-wide fields (1, 2, 4 or 8) from
/// byte `at` of the block on, in runs of `span` bytes. With `k = 8 / bits`
/// fields to a byte, field `e` lies in byte `at + (e / (k·span))·span +
/// e mod span`, from bit `(e / span mod k)·bits`: `k·span` fields fill
/// `span` bytes a slot at a time (a span of 1 is the dense LSB-first order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plane {
    /// The plane's first byte in its block.
    pub at: u32,
    /// Field width: 1, 2, 4 or 8.
    pub bits: u32,
    /// Bytes of a run (a power of two).
    pub span: u32,
}

impl Plane {
    /// Field `e`'s byte in the block and its shift in that byte.
    #[inline]
    pub fn locate(&self, e: usize) -> (usize, u32) {
        let (k, span) = ((8 / self.bits) as usize, self.span as usize);
        let run = div(e, span);
        (
            self.at as usize + div(run, k) * span + rem(e, span),
            rem(run, k) as u32 * self.bits,
        )
    }

    /// One past the last byte the plane's `len` fields touch in a block.
    fn end(&self, len: usize) -> usize {
        let per_run = (8 / self.bits) as usize * self.span as usize;
        self.at as usize + len.div_ceil(per_run) * self.span as usize
    }

    /// Field `e` of the block at `block`.
    #[inline]
    fn get(&self, block: &[u8], e: usize) -> u32 {
        let (byte, shift) = self.locate(e);
        (block[byte] as u32 >> shift) & ((1 << self.bits) - 1)
    }
}

impl InBlocks {
    /// Whether the geometry is one the accessors and kernels take: planes
    /// of 1, 2, 4 or 8 bits in runs of a power of two, inside the block.
    pub fn is_valid(&self) -> bool {
        let plane = |p: &Plane| {
            matches!(p.bits, 1 | 2 | 4 | 8)
                && p.span.is_power_of_two()
                && p.end(self.len as usize) <= self.bytes as usize
        };
        self.len > 0 && plane(&self.low) && self.high.as_ref().is_none_or(plane)
    }

    /// Bits of a field, both planes together.
    pub fn bits(&self) -> u32 {
        self.low.bits + self.high.map_or(0, |h| h.bits)
    }

    /// The first `out.len()` fields of block `block`, a byte each: what
    /// [`InBlocks::get`] reads, a run of a plane at a time.
    pub fn unpack(&self, block: &[u8], out: &mut [u8]) {
        for (p, up) in [(Some(self.low), 0), (self.high, self.low.bits)] {
            let Some(p) = p else { continue };
            let mask = ((1u32 << p.bits) - 1) as u8;
            let span = p.span as usize;
            for (r, run) in out.chunks_mut(span).enumerate() {
                // A run's fields are bytes side by side, at one shift.
                let (at, shift) = p.locate(r * span);
                let n = run.len();
                let fields = block[at..at + n]
                    .iter()
                    .map(|&b| ((b >> shift) & mask) << up);
                // The low plane sets each byte, the high one adds to it.
                if up == 0 {
                    run.iter_mut().zip(fields).for_each(|(o, f)| *o = f);
                } else {
                    run.iter_mut().zip(fields).for_each(|(o, f)| *o |= f);
                }
            }
        }
    }

    /// Field `e` of the block `block`.
    #[inline]
    pub fn get(&self, block: &[u8], e: usize) -> u32 {
        let lo = self.low.get(block, e);
        match &self.high {
            Some(h) => lo | h.get(block, e) << self.low.bits,
            None => lo,
        }
    }
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
            blocks: None,
            parts: None,
        }
    }

    /// Fields inside blocks (see [`InBlocks`], whose geometry the caller
    /// checked), lanes `lane_bits` apart (a multiple of 8).
    pub fn in_blocks(data: impl Into<Bytes<'a>>, blocks: InBlocks, lane_bits: u64) -> Self {
        Fields {
            blocks: Some(blocks),
            ..Self::dense(data, blocks.bits(), lane_bits)
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

    /// Lanes in parts sharing their words (see [`Parts`]).
    pub fn with_parts(mut self, parts: Parts) -> Self {
        self.parts = Some(parts);
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
    pub(super) fn in_lanes(
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
                    let at = s * slice_words
                        + if side_by_side {
                            w * lanes + l
                        } else {
                            l * lane_words + w
                        };
                    words[at] |= field(s, l, i) << ((i % per) as u32 * bits);
                }
            }
        }
        Some(Fields::of_words(
            &words,
            bits,
            (lanes, lane_words),
            side_by_side,
        ))
    }

    /// Padded `bits`-wide fields held in `words`: `lanes` lanes of
    /// `lane_words` words a slice, each lane's words one after another or
    /// (`side_by_side`) word w of every lane, then word w + 1.
    pub(super) fn of_words(
        words: &[u32],
        bits: u32,
        (lanes, lane_words): (usize, usize),
        side_by_side: bool,
    ) -> Fields<'static> {
        let (lane_bits, word_bits) = match side_by_side {
            true => (32, lanes as u64 * 32),
            false => (lane_words as u64 * 32, 32),
        };
        let bytes: Arc<[u8]> = bytemuck::cast_slice::<u32, u8>(words).into();
        // Where the width divides 32, padded fields are dense ones: named
        // dense, the layout the fast kernels take.
        let per_word = if 32 % bits == 0 { 0 } else { 32 / bits };
        let fields = Fields::new(Bytes::Owned(bytes), bits, per_word, lane_bits);
        fields
            .with_word_bits(word_bits)
            .with_slice_bits((lanes * lane_words) as u64 * 32)
    }
}

impl Fields<'_> {
    /// The same `slices × lanes × len` fields, `width` bits wide (this
    /// width or more), with each lane's words one after another, as
    /// [`Fields::in_lanes`] writes them: whole words copied where each
    /// holds its lane's next fields in plain order at the same width
    /// (GPTQ's `qweight`, whose words are strided), the last one's fields
    /// past `len` cleared; else field by field. `None` past the data.
    pub(super) fn in_lane_order(
        &self,
        (slices, lanes, len): (usize, usize, usize),
        width: u32,
    ) -> Option<Fields<'static>> {
        let words_whole = width == self.bits
            && self.blocks.is_none()
            && self.parts.is_none()
            && self.per_word == 0
            && 32 % self.bits == 0
            && !self.high_first
            && [self.lane_bits, self.word_bits, self.slice_bits]
                .iter()
                .all(|b| b % 32 == 0);
        if !words_whole {
            return Fields::in_lanes((slices, lanes, len), width, false, |s, l, i| {
                self.get(s, l, i)
            });
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
                    words.push(if w + 1 == lane_words {
                        word & tail
                    } else {
                        word
                    });
                }
            }
        }
        Some(Fields::of_words(
            &words,
            self.bits,
            (lanes, lane_words),
            false,
        ))
    }

    /// [`Fields::in_lane_order`] for the stored `slices × rows × cols`
    /// fields of a transposed job: lane = stored column, of `rows` fields.
    /// AutoAWQ's words (eight 4-bit fields in its order, whole words, rows
    /// a multiple of 8) are transposed 8 × 8 at a time; else field by field.
    pub(super) fn transposed_in_lane_order(
        &self,
        Dims { slices, rows, cols }: Dims,
    ) -> Option<Fields<'static>> {
        let awq = self.bits == 4
            && self.blocks.is_none()
            && self.parts.is_none()
            && self.per_word == 8
            && self.interleaved
            && !self.high_first
            && self.word_bits == 32
            && [self.lane_bits, self.slice_bits]
                .iter()
                .all(|b| b % 32 == 0)
            && rows.is_multiple_of(8);
        let lane_words = rows / 8;
        let total = slices.checked_mul(cols)?.checked_mul(lane_words)?;
        if !awq || total > self.data.len() / 4 {
            return Fields::in_lanes((slices, cols, rows), self.bits, false, |s, c, r| {
                self.get(s, r, c)
            });
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
                    for (e, w) in awq_transposed(block)
                        .into_iter()
                        .enumerate()
                        .take(cols - 8 * c)
                    {
                        words[(s * cols + 8 * c + e) * lane_words + k] = w;
                    }
                }
            }
        }
        Some(Fields::of_words(&words, 4, (cols, lane_words), false))
    }

    /// Word `w` of `lane` in `slice` whole (a lane's words start on a byte
    /// here), `None` past the data.
    pub(super) fn word(&self, slice: usize, lane: usize, w: usize) -> Option<u32> {
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
    pub(super) fn read_bits(&self, pos: u64, n: u32) -> u32 {
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
        let lane = match &self.parts {
            None => (lane as u64).checked_mul(self.lane_bits)?,
            Some(p) => p.offset(lane, self.lane_bits)?,
        };
        (slice as u64)
            .checked_mul(self.slice_bits)?
            .checked_add(lane)
    }

    /// One past the last bit that fields `0..len` of `lane` in `slice` touch.
    pub fn lane_end(&self, slice: usize, lane: usize, len: usize) -> Option<u64> {
        if len == 0 {
            return self.lane_start(slice, lane);
        }
        if let Some(b) = &self.blocks {
            let blocks = (len as u64).div_ceil(b.len as u64);
            return self
                .lane_start(slice, lane)?
                .checked_add(blocks.checked_mul(b.bytes as u64 * 8)?);
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
        let last = (slices - 1, lanes - 1);
        Some(self.span((0, 0), last, lanes, len)?.1)
    }

    /// The bits fields `0..len` of the lanes from `first` to `last`
    /// (inclusive, as (slice, lane) of slices of `lanes` lanes) touch, from
    /// the first to one past the last: where lanes do not advance through
    /// the stream (slices or [`Parts`] sharing words, HQQ's packs), the
    /// lowest start and highest end of each run of lanes that does.
    pub fn span(
        &self,
        first: (usize, usize),
        last: (usize, usize),
        lanes: usize,
        len: usize,
    ) -> Option<(u64, u64)> {
        let (mut lo, mut hi) = (u64::MAX, 0);
        for s in first.0..=last.0 {
            let a = if s == first.0 { first.1 } else { 0 };
            let b = if s == last.0 {
                last.1
            } else {
                lanes.checked_sub(1)?
            };
            // Runs of lanes inside one part.
            let per = self.parts.map_or(usize::MAX, |p| p.lanes.max(1));
            let mut j = a;
            while j <= b {
                let end = b.min((j / per).saturating_add(1).saturating_mul(per) - 1);
                lo = lo.min(self.lane_start(s, j)?);
                hi = hi.max(self.lane_end(s, end, len)?);
                j = end + 1;
            }
        }
        Some((lo.min(hi), hi))
    }

    /// Whether the lanes of `slices` slices of `rows` lanes follow one
    /// another through the stream (each starting past the one before):
    /// what a reader that releases bytes behind it needs.
    pub fn in_order(&self, slices: usize, rows: usize) -> bool {
        self.parts.is_none()
            && (slices <= 1 || self.slice_bits >= self.lane_bits.saturating_mul(rows as u64))
    }

    /// Whether no field crosses a word: each is read whole at its
    /// [`Fields::position`].
    pub(crate) fn whole_fields(&self) -> bool {
        self.blocks.is_none() && (self.per_word != 0 || 32 % self.bits == 0)
    }

    /// The first bit of the field of `lane`, index `i`, in `slice`, for
    /// [`Fields::field_at`] (fields that cross no word: `whole_fields`).
    #[inline]
    pub(crate) fn position(&self, slice: usize, lane: usize, i: usize) -> u64 {
        self.bit(slice, lane, self.locate(i))
    }

    /// The bit at offset `off` of word `w` of `lane` in `slice`.
    #[inline]
    pub(super) fn bit(&self, slice: usize, lane: usize, (w, off): (u64, u32)) -> u64 {
        let lane = match &self.parts {
            None => lane as u64 * self.lane_bits,
            Some(p) => {
                let per = p.lanes.max(1);
                let (k, j) = (div(lane, per), rem(lane, per));
                (j as u64 * self.lane_bits + p.top).wrapping_sub(k as u64 * p.down)
            }
        };
        slice as u64 * self.slice_bits + lane + w * self.word_bits + off as u64
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
        if let Some(b) = &self.blocks {
            let (n, e) = (div(i, b.len as usize), rem(i, b.len as usize));
            let start = (self.bit(slice, lane, (0, 0)) / 8) as usize + n * b.bytes as usize;
            return b.get(&self.data[start..start + b.bytes as usize], e);
        }
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
pub(super) fn div<T: Divisor>(x: T, d: T) -> T {
    if d.is_pow2() {
        x.shr(d)
    } else {
        x / d
    }
}

/// `x % d`, by a mask when `d` is a power of two.
#[inline]
pub(super) fn rem<T: Divisor>(x: T, d: T) -> T {
    if d.is_pow2() {
        x.mask(d)
    } else {
        x % d
    }
}

/// The unsigned integers [`div`] and [`rem`] take.
pub(super) trait Divisor:
    Copy + std::ops::Div<Output = Self> + std::ops::Rem<Output = Self>
{
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
    AWQ_SLOT.iter().enumerate().fold(0, |v, (e, &slot)| {
        v | (((x >> (4 * slot)) & 15) as u64) << (8 * e)
    })
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

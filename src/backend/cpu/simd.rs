//! The CPU's vector kernels (x86-64: SSE2, SSSE3, and AVX2 or AVX-512 where the CPU has them),
//! each next to the scalar loop it equals byte for byte and that other CPUs
//! run: table lookups of 4-bit codes, and the transposes that turn packs
//! along the input dimension into straight rows.
//!
//! Every load and store goes through a bounds-checked slice of exactly the
//! bytes it touches; the only unsafety is the CPU feature.

use crate::numerics::OutDtype;

/// Word rows ahead whose lines [`gather_words`] fetches.
#[cfg(target_arch = "x86_64")]
const WORDS_AHEAD: usize = 8;

/// Which of the CPU's kernels a decoding may run: all give the same bytes,
/// so this is the tests' choice, to check on this CPU the kernels that
/// others run. A value, not a process-wide switch, so that tests running
/// at once cannot change each other's kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub enum Kernels {
    /// The widest this CPU has (AVX-512 or AVX2, else SSSE3 and SSE2).
    #[default]
    Widest,
    /// SSSE3 and SSE2 only, never AVX2 or AVX-512.
    Narrow,
    /// None: the scalar loops other CPUs (aarch64, wasm32) run.
    Scalar,
}

/// The instructions the kernels may use, read once per job from the CPU's
/// features and the chosen [`Kernels`], then passed to every kernel: a
/// kernel that falls back to the scalar loop does so by this answer alone,
/// so all the kernels of one job agree (tables as many as their entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct Isa {
    /// SSE2 (part of x86-64).
    sse2: bool,
    ssse3: bool,
    /// F16C, where SSSE3 (the f16 tables and products).
    f16c: bool,
    avx2: bool,
    /// AVX-512 F, BW and VBMI.
    avx512: bool,
}

impl Isa {
    /// This CPU's, as `kernels` allow.
    pub(super) fn of(kernels: Kernels) -> Isa {
        let vectors = cfg!(target_arch = "x86_64") && kernels != Kernels::Scalar;
        let wide = vectors && kernels == Kernels::Widest;
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let ssse3 = vectors && has!("ssse3");
            Isa {
                sse2: vectors,
                ssse3,
                f16c: ssse3 && has!("f16c"),
                avx2: wide && has!("avx2"),
                avx512: ssse3 && wide && has!("avx512f") && has!("avx512bw") && has!("avx512vbmi"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = wide;
            Isa::SCALAR
        }
    }

    /// This CPU's widest.
    pub(super) fn detect() -> Isa {
        Isa::of(Kernels::Widest)
    }

    /// No vector instructions: the scalar loops.
    #[cfg_attr(target_arch = "x86_64", allow(dead_code))]
    const SCALAR: Isa = Isa {
        sse2: false,
        ssse3: false,
        f16c: false,
        avx2: false,
        avx512: false,
    };

    /// The same without F16C: its f16 tables and products fall back to the
    /// scalar loops, as on a CPU with SSSE3 but not F16C.
    #[cfg(test)]
    pub(super) fn without_f16c(self) -> Isa {
        Isa {
            f16c: false,
            avx512: false,
            ..self
        }
    }

    /// Whether loops the compiler vectorizes may use AVX2 (`super::direct`).
    pub(super) fn wide(self) -> bool {
        self.avx2
    }

    /// Whether the SSSE3 kernels that round to `out` run (f16 needs F16C).
    #[cfg(target_arch = "x86_64")]
    fn rounds_to(self, out: OutDtype) -> bool {
        self.ssse3 && (out != OutDtype::F16 || self.f16c)
    }
}

/// A 16-entry code table split into byte planes: plane `b` holds byte `b`
/// of each little-endian entry (what `pshufb` looks up 16 codes in).
pub(super) fn planes(isa: Isa, table: &[u32; 16]) -> [[u8; 16]; 4] {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.ssse3 {
            // SAFETY: the CPU has SSSE3 (what Isa::of found).
            return unsafe { x86::planes(table) };
        }
    }
    let _ = isa;
    std::array::from_fn(|b| std::array::from_fn(|c| (table[c] >> (8 * b)) as u8))
}

/// The tables of 16 code values `codes` under each entry (zero, scale):
/// `(c − zero)·scale·post` in f32, rounded once to `out`, given to `each`
/// in order as encoded output bits and byte planes; false, having given
/// none, where `isa` lacks the instructions (f16 needs F16C), and the
/// caller's scalar loop gives the same bytes.
pub(super) fn tables16(
    isa: Isa,
    codes: &[f32; 16],
    entries: &[(f32, f32)],
    (post, out): (f32, OutDtype),
    each: &mut impl FnMut([u32; 16], [[u8; 16]; 4]),
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx512 {
            // SAFETY: the CPU has AVX-512 F, BW and VBMI (what Isa::of found).
            unsafe { x86::tables16_avx512(codes, entries, (post, out), each) };
            return true;
        }
        if isa.rounds_to(out) {
            // SAFETY: the CPU has SSSE3, and F16C where the output is f16
            // (checked just above).
            unsafe { x86::tables16(codes, entries, (post, out), each) };
            return true;
        }
    }
    let _ = (isa, codes, entries, post, out, each);
    false
}

/// Decodes whole 16-code blocks of `codes` (two per byte, low nibble first,
/// or high first) through a table of f32 products (its byte `planes`),
/// each times its column's factor in `factors`, rounded once to `out` (N
/// bytes each); returns how many outputs were written (0 where the CPU
/// lacks the instructions: f16 needs F16C), with the instructions of `isa`.
pub(super) fn smoothed<const N: usize>(
    isa: Isa,
    codes: &[u8],
    planes: &[[u8; 16]; 4],
    factors: (&[f32], bool),
    dst: &mut [u8],
    out: OutDtype,
) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.rounds_to(out) {
            // SAFETY: the CPU has SSSE3, and F16C where the output is f16
            // (what Isa::of found).
            return unsafe { x86::smoothed::<N>(codes, planes, factors, dst, out) };
        }
    }
    let _ = (isa, codes, planes, factors, dst, out);
    0
}

/// Decodes whole 32-code blocks of `codes` (two per byte, low nibble first,
/// or high nibble first with `high_first`: bitsandbytes), and a last block
/// of 16, through the table `values` (its byte `planes` for SSSE3) into
/// `out` (N bytes per output), with the instructions of `isa`; returns how
/// many outputs were written (0 without SSSE3). With `stream`, aligned
/// lines go around the caches ([`fence`] orders them).
pub(super) fn nibbles<const N: usize>(
    isa: Isa,
    codes: &[u8],
    (values, planes): (&[u32; 16], &[[u8; 16]; 4]),
    out: &mut [u8],
    high_first: bool,
    stream: bool,
) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        // The AVX-512 kernel's setup pays off over a few registers of
        // outputs, not over one (NVFP4's and MXFP4's groups of 16 and 32).
        if isa.avx512 && out.len() >= 256 {
            // SAFETY: the CPU has AVX-512 F, BW and VBMI (what Isa::of
            // found).
            return unsafe { x86::nibbles_avx512::<N>(codes, values, out, high_first, stream) };
        }
        if isa.ssse3 {
            // SAFETY: the CPU has SSSE3 (what Isa::of found).
            return unsafe { x86::nibbles::<N>(codes, planes, out, high_first, stream) };
        }
    }
    let _ = (isa, codes, values, planes, out, high_first, stream);
    0
}

/// Orders this thread's streaming stores before its later stores (a task's
/// output handed on): they are weakly ordered, even against a release.
pub(super) fn fence() {
    // SAFETY: SSE is part of x86-64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Decodes a block of 32 output rows × 128 output columns of a transposed
/// pack of 4-bit codes (GPT-OSS's experts): output column `o`'s codes of
/// the 32 rows are the 16 bytes at `first + o·lane` of `src`, low nibble
/// first, and its values those of `base` with `shifts[o]` added to every
/// value of nonzero magnitude (a table whose scale is a power of two: the
/// caller checked that each column's own table is exactly that), written
/// to row `r` at `out[r·row_bytes ..]`, N bytes each; false, having
/// written nothing, where `isa` has neither AVX-512 (F, BW, VBMI) nor AVX2.
pub(super) fn shifted_block<const N: usize>(
    isa: Isa,
    src: &[u8],
    (first, lane): (usize, usize),
    (base, shifts): (&[u32; 16], &[u32; 128]),
    out: &mut [u8],
    row_bytes: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx512 {
            // SAFETY: the CPU has AVX-512 F, BW and VBMI (what Isa::of found).
            unsafe { x86::shifted_block::<N>(src, (first, lane), (base, shifts), out, row_bytes) };
            return true;
        }
        if isa.avx2 {
            // SAFETY: the CPU has AVX2 (what Isa::of found).
            unsafe { x86::shifted_block_avx2::<N>(src, (first, lane), (base, shifts), out, row_bytes) };
            return true;
        }
    }
    let _ = (isa, src, first, lane, base, shifts, out, row_bytes);
    false
}

/// Gathers `lanes` rows of `words` 32-bit words each, word `w` of lane `k`
/// at byte `first + w·stride + 4k` of `src` (lanes adjacent, words a stride
/// apart: GPTQ's `qweight`), into `dst`, lane `k`'s words at `k·row`.
pub(super) fn gather_words(
    isa: Isa,
    src: &[u8],
    (first, stride): (usize, usize),
    (lanes, words): (usize, usize),
    dst: &mut [u8],
    row: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx512 && lanes.is_multiple_of(16) && words.is_multiple_of(16) {
            // SAFETY: the CPU has AVX-512 F (what Isa::of found).
            unsafe { x86::gather_words_avx512(src, (first, stride), (lanes, words), dst, row) };
            return;
        }
    }
    let (k4, w4) = if isa.sse2 { (lanes / 4 * 4, words / 4 * 4) } else { (0, 0) };
    #[cfg(target_arch = "x86_64")]
    {
        for w in (0..w4).step_by(4) {
            // The lanes' lines of words a few steps on: a stride apart, too
            // far for the hardware to guess.
            for q in WORDS_AHEAD..WORDS_AHEAD + 4 {
                let at = first + (w + q) * stride;
                for l in (0..4 * k4).step_by(64).chain((4 * k4).checked_sub(1)) {
                    // SAFETY: SSE2 is part of x86-64.
                    unsafe { x86::prefetch::<false>(src, at + l) };
                }
            }
            for k in (0..k4).step_by(4) {
                let at = |q: usize| first + (w + q) * stride + 4 * k;
                let rows: [&[u8; 16]; 4] = std::array::from_fn(|q| slice16(src, at(q)));
                // SAFETY: SSE2 is part of x86-64.
                let out = unsafe { x86::transpose_4x4(rows) };
                for (j, v) in out.iter().enumerate() {
                    let o = (k + j) * row + 4 * w;
                    dst[o..o + 16].copy_from_slice(v);
                }
            }
        }
    }
    // What the blocks left: the last lanes of every word, the last words
    // of the others.
    let rest = (0..words).flat_map(|w| (k4..lanes).map(move |k| (w, k)));
    for (w, k) in rest.chain((w4..words).flat_map(|w| (0..k4).map(move |k| (w, k)))) {
        let at = first + w * stride + 4 * k;
        dst[k * row + 4 * w..k * row + 4 * w + 4].copy_from_slice(&src[at..at + 4]);
    }
}

/// Gathers AutoAWQ codes into straight nibble rows: input `i`'s word
/// holding outputs `8·c .. 8·c + 8` is at byte `first + i·lane + 4·c` of
/// `src`, for `c < columns`; output `8·c + e`'s codes of inputs
/// `0..inputs` go to `dst` at `(8·c + e)·row`, two to a byte, low nibble
/// first. `inputs` is a multiple of 8.
pub(super) fn gather_awq(
    isa: Isa,
    src: &[u8],
    (first, lane): (usize, usize),
    (columns, inputs): (usize, usize),
    dst: &mut [u8],
    row: usize,
) {
    let c4 = if isa.sse2 { columns / 4 * 4 } else { 0 };
    // SAFETY: SSE2 is part of x86-64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        x86::gather_awq(src, (first, lane), (c4, inputs), dst, row)
    };
    for c in c4..columns {
        for i in (0..inputs).step_by(8) {
            let words: [u32; 8] = std::array::from_fn(|j| {
                let a = first + (i + j) * lane + 4 * c;
                u32::from_le_bytes([src[a], src[a + 1], src[a + 2], src[a + 3]])
            });
            for (e, w) in crate::job::awq_transposed(words).iter().enumerate() {
                let k = 8 * c + e;
                dst[k * row + i / 2..k * row + i / 2 + 4].copy_from_slice(&w.to_le_bytes());
            }
        }
    }
}

/// Splits bytes holding two 4-bit codes each into two rows of codes two to a
/// byte (low nibble first): the low nibbles of `src` into `lo`, the high
/// ones into `hi` (each `src.len().div_ceil(2)` bytes).
pub(super) fn split_nibbles(isa: Isa, src: &[u8], lo: &mut [u8], hi: &mut [u8]) {
    // SAFETY: the CPU has SSSE3 (what Isa::of found).
    #[cfg(target_arch = "x86_64")]
    let done = if isa.ssse3 { unsafe { x86::split_nibbles(src, lo, hi) } } else { 0 };
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        let _ = isa;
        0
    };
    for (k, pair) in src[done..].chunks(2).enumerate() {
        let (a, b) = (pair[0], pair.get(1).copied().unwrap_or(0));
        lo[done / 2 + k] = a & 15 | b << 4;
        hi[done / 2 + k] = a >> 4 | b & 0xF0;
    }
}

/// Hints the CPU to fetch the cache lines of `data[range]` for writing
/// (nothing on other CPUs): for outputs written a few bytes per row across
/// many rows, too many streams for the hardware to fetch ahead.
pub(super) fn prefetch_write(isa: Isa, data: &[u8], range: std::ops::Range<usize>) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.sse2 {
            for at in range.step_by(64) {
                // SAFETY: SSE2 is part of x86-64.
                unsafe { x86::prefetch::<true>(data, at) };
            }
            return;
        }
    }
    let _ = (isa, data, range);
}

/// Hints the CPU to fetch the cache line at each of `at` in `data` for
/// reading (nothing on other CPUs): lines a stride apart, too far for the
/// hardware to guess.
pub(super) fn prefetch_read(isa: Isa, data: &[u8], at: impl Iterator<Item = usize>) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.sse2 {
            for at in at {
                // SAFETY: SSE2 is part of x86-64.
                unsafe { x86::prefetch::<false>(data, at) };
            }
            return;
        }
    }
    let _ = (isa, data, at);
}

/// Decodes a block of codes stored along the output's columns and writes it
/// transposed: lane `q < lanes` (an output column) has 16 codes (two to a
/// byte, low nibble first) at `codes[q]`, its table's byte planes at
/// `planes[q]` (N of them used); output row `e < 16`'s `lanes` values go to `out` at
/// `e·row_bytes` (N bytes each). `lanes` is at most 8 (N = 2) or 4 (N = 4).
pub(super) fn transposed_block<const N: usize>(
    isa: Isa,
    codes: &[&[u8; 8]],
    planes: &[&[[u8; 16]; 4]],
    out: &mut [u8],
    row_bytes: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if codes.len() == 16 / N && isa.ssse3 {
            // SAFETY: the CPU has SSSE3 (what Isa::of found).
            unsafe { x86::transposed_block::<N>(codes, planes, out, row_bytes) };
            return;
        }
    }
    let _ = isa;
    for (q, (c, p)) in codes.iter().zip(planes).enumerate() {
        for e in 0..16 {
            let code = ((c[e / 2] >> (4 * (e % 2))) & 15) as usize;
            for (b, plane) in p.iter().take(N).enumerate() {
                out[e * row_bytes + q * N + b] = plane[code];
            }
        }
    }
}

/// The first 8 bytes of `src`.
#[cfg(target_arch = "x86_64")]
#[inline]
fn slice8(src: &[u8]) -> &[u8; 8] {
    src.first_chunk().unwrap_or_else(|| unreachable!("8 bytes"))
}

/// The 16 bytes at `at`.
#[cfg(target_arch = "x86_64")]
#[inline]
fn slice16(src: &[u8], at: usize) -> &[u8; 16] {
    let s = &src[at..at + 16];
    s.try_into().unwrap_or_else(|_| unreachable!("a 16-byte slice"))
}

#[cfg(target_arch = "x86_64")]
// The loops index several arrays of registers by the same lane.
#[allow(clippy::needless_range_loop)]
mod x86 {
    use std::arch::x86_64::*;

    /// 16 bytes as a register.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn load(b: &[u8; 16]) -> __m128i {
        // SAFETY: reads exactly the 16 bytes of `b` (unaligned load).
        unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
    }

    /// 64 bytes as a register.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load64(b: &[u8; 64]) -> __m512i {
        // SAFETY: reads exactly the 64 bytes of `b` (unaligned load).
        unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
    }

    /// Stores a register in exactly the 64 bytes of `o`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn store64(o: &mut [u8], v: __m512i) {
        let o = &mut o[..64];
        // SAFETY: writes exactly the 64 bytes of `o` (unaligned store).
        unsafe { _mm512_storeu_si512(o.as_mut_ptr().cast(), v) };
    }

    /// The 64 bytes of `src` at `at`.
    #[inline]
    fn slice64(src: &[u8], at: usize) -> &[u8; 64] {
        src[at..at + 64].try_into().unwrap_or_else(|_| unreachable!("64 bytes"))
    }

    /// 16 u32 as a register.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load_u32s(v: &[u32]) -> __m512i {
        let v: &[u32; 16] = v[..16].try_into().unwrap_or_else(|_| unreachable!("16 words"));
        // SAFETY: reads exactly the 64 bytes of `v` (unaligned load).
        unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
    }

    /// A register as 16 bytes.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn bytes(v: __m128i) -> [u8; 16] {
        let mut b = [0u8; 16];
        // SAFETY: writes exactly the 16 bytes of `b` (unaligned store).
        unsafe { _mm_storeu_si128(b.as_mut_ptr().cast(), v) };
        b
    }

    /// Transposes 4 × 4 words: word `k` of `rows[q]` becomes word `q` of
    /// the result's `k`.
    #[target_feature(enable = "sse2")]
    pub(super) fn transpose_4x4(rows: [&[u8; 16]; 4]) -> [[u8; 16]; 4] {
        transpose_4x4_32(rows.map(|b| load(b))).map(|v| bytes(v))
    }

    /// Stores a register at `dst[at..at + 16]`.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn store(dst: &mut [u8], at: usize, v: __m128i) {
        let d = &mut dst[at..at + 16];
        // SAFETY: writes exactly the 16 bytes of `d` (unaligned store).
        unsafe { _mm_storeu_si128(d.as_mut_ptr().cast(), v) };
    }

    /// Transposes 4 × 4 words: word `k` of `r[q]` becomes word `q` of the
    /// result's `k`.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn transpose_4x4_32(r: [__m128i; 4]) -> [__m128i; 4] {
        let (ab0, cd0) = (_mm_unpacklo_epi32(r[0], r[1]), _mm_unpacklo_epi32(r[2], r[3]));
        let (ab1, cd1) = (_mm_unpackhi_epi32(r[0], r[1]), _mm_unpackhi_epi32(r[2], r[3]));
        [
            _mm_unpacklo_epi64(ab0, cd0),
            _mm_unpackhi_epi64(ab0, cd0),
            _mm_unpacklo_epi64(ab1, cd1),
            _mm_unpackhi_epi64(ab1, cd1),
        ]
    }

    /// Eight inputs' words of four AutoAWQ word columns (32 outputs) to
    /// each output's eight codes as one word: from the low nibbles
    /// (register q lane l: column q's element [0, 4, 1, 5][l]) and from the
    /// high ones (element [2, 6, 3, 7][l]).
    #[inline]
    #[target_feature(enable = "sse2")]
    fn awq_8x32(r: [__m128i; 8]) -> [[__m128i; 4]; 2] {
        let (lo, hi) = (_mm_set1_epi8(0x0F), _mm_set1_epi8(0xF0u8 as i8));
        // Byte b of p[m]: inputs 2m and 2m + 1 of a low-nibble output, low first.
        let p: [__m128i; 4] = std::array::from_fn(|m| {
            let (a, b) = (r[2 * m], r[2 * m + 1]);
            _mm_or_si128(_mm_and_si128(a, lo), _mm_and_si128(_mm_slli_epi16(b, 4), hi))
        });
        let q: [__m128i; 4] = std::array::from_fn(|m| {
            let (a, b) = (r[2 * m], r[2 * m + 1]);
            _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), lo), _mm_and_si128(b, hi))
        });
        [bytes_to_words(p), bytes_to_words(q)]
    }

    /// Byte b of each of four registers as word b: (p0[b], p1[b], p2[b],
    /// p3[b]), little-endian, words 0..16 across the four results.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn bytes_to_words(p: [__m128i; 4]) -> [__m128i; 4] {
        let (ab0, cd0) = (_mm_unpacklo_epi8(p[0], p[1]), _mm_unpacklo_epi8(p[2], p[3]));
        let (ab1, cd1) = (_mm_unpackhi_epi8(p[0], p[1]), _mm_unpackhi_epi8(p[2], p[3]));
        [
            _mm_unpacklo_epi16(ab0, cd0),
            _mm_unpackhi_epi16(ab0, cd0),
            _mm_unpacklo_epi16(ab1, cd1),
            _mm_unpackhi_epi16(ab1, cd1),
        ]
    }

    /// `super::gather_awq` for `columns` a multiple of 4: blocks of 32
    /// inputs × 32 outputs (each output's 16 bytes stored at once), then
    /// blocks of 8 inputs.
    #[target_feature(enable = "sse2")]
    pub(super) fn gather_awq(
        src: &[u8],
        (first, lane): (usize, usize),
        (columns, inputs): (usize, usize),
        dst: &mut [u8],
        row: usize,
    ) {
        const ELEMENT: [[usize; 4]; 2] = [[0, 4, 1, 5], [2, 6, 3, 7]];
        let block = |c: usize, i: usize| {
            awq_8x32(std::array::from_fn(|j| load(super::slice16(src, first + (i + j) * lane + 4 * c))))
        };
        let i32 = inputs / 32 * 32;

        // Inputs outer: each input's bytes of the band (whole cache lines)
        // are read together.
        for i in (0..i32).step_by(32) {
            // The lines of the inputs two blocks on (a lane apart).
            for j in 64..96 {
                let at = first + (i + j) * lane;
                for l in (0..4 * columns).step_by(64).chain((4 * columns).checked_sub(1)) {
                    prefetch::<false>(src, at + l);
                }
            }
            for c in (0..columns).step_by(4) {
                let b: [[[__m128i; 4]; 2]; 4] = std::array::from_fn(|k| block(c, i + 8 * k));
                for (half, element) in ELEMENT.iter().enumerate() {
                    for q in 0..4 {
                        let t = transpose_4x4_32(std::array::from_fn(|k| b[k][half][q]));
                        for (v, e) in t.into_iter().zip(element) {
                            store(dst, (8 * (c + q) + e) * row + i / 2, v);
                        }
                    }
                }
            }
        }
        for c in (0..columns).step_by(4) {
            for i in (i32..inputs).step_by(8) {
                let b = block(c, i);
                for (half, element) in ELEMENT.iter().enumerate() {
                    for q in 0..4 {
                        let w = bytes(b[half][q]);
                        for (l, e) in element.iter().enumerate() {
                            let at = (8 * (c + q) + e) * row + i / 2;
                            dst[at..at + 4].copy_from_slice(&w[4 * l..4 * l + 4]);
                        }
                    }
                }
            }
        }
    }

    /// See `super::split_nibbles`: 16 bytes at a time; returns how many.
    #[target_feature(enable = "ssse3")]
    pub(super) fn split_nibbles(src: &[u8], lo: &mut [u8], hi: &mut [u8]) -> usize {
        let (nibble, pack) = (_mm_set1_epi8(0x0F), _mm_set1_epi16(0x1001));
        let blocks = src.len() / 16;
        for (k, c) in src.chunks_exact(16).enumerate() {
            let v = load(super::slice16(c, 0));
            // Each pair of bytes' nibbles as one byte: a + 16·b.
            let l = _mm_maddubs_epi16(_mm_and_si128(v, nibble), pack);
            let h = _mm_maddubs_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), nibble), pack);
            let b = bytes(_mm_packus_epi16(l, h));
            lo[8 * k..8 * k + 8].copy_from_slice(&b[..8]);
            hi[8 * k..8 * k + 8].copy_from_slice(&b[8..]);
        }
        16 * blocks
    }

    /// The table planes as registers.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn tables(planes: &[[u8; 16]; 4]) -> [__m128i; 4] {
        std::array::from_fn(|b| load(&planes[b]))
    }

    /// The outputs of the 16 codes `idx` through the table planes `t`, in
    /// order: N·16 bytes, in the first N registers.
    #[inline]
    #[target_feature(enable = "ssse3")]
    fn lookup<const N: usize>(t: &[__m128i; 4], idx: __m128i) -> [__m128i; 4] {
        let (a, b) = (_mm_shuffle_epi8(t[0], idx), _mm_shuffle_epi8(t[1], idx));
        if N == 2 {
            let zero = _mm_setzero_si128();
            return [_mm_unpacklo_epi8(a, b), _mm_unpackhi_epi8(a, b), zero, zero];
        }
        let (c, d) = (_mm_shuffle_epi8(t[2], idx), _mm_shuffle_epi8(t[3], idx));
        bytes_to_words([a, b, c, d])
    }

    /// Decodes 32 codes (16 bytes, low nibble first, or high first)
    /// through the table registers `t` into the 32·N bytes of `o`, around
    /// the caches with `stream` where aligned.
    #[inline]
    #[target_feature(enable = "ssse3")]
    fn segment<const N: usize>(v: __m128i, t: &[__m128i; 4], high_first: bool, o: &mut [u8], stream: bool) {
        let nibble = _mm_set1_epi8(0x0F);
        let (mut lo, mut hi) = (_mm_and_si128(v, nibble), _mm_and_si128(_mm_srli_epi16(v, 4), nibble));
        if high_first {
            (lo, hi) = (hi, lo);
        }
        // One bounds check for the segment's bytes.
        let o = &mut o[..32 * N];
        let stream = stream && (o.as_ptr() as usize).is_multiple_of(16);
        for (h, idx) in [_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)].into_iter().enumerate() {
            for (k, v) in lookup::<N>(t, idx).into_iter().take(N).enumerate() {
                let at = 16 * (N * h + k);
                // SAFETY: h < 2 and k < N, so at + 16 ≤ 32·N = o.len()
                // (unaligned store, or aligned: o is, and at is a multiple
                // of 16).
                unsafe {
                    let p = o.as_mut_ptr().add(at).cast();
                    if stream {
                        _mm_stream_si128(p, v)
                    } else {
                        _mm_storeu_si128(p, v)
                    }
                };
            }
        }
    }

    /// Hints the CPU to fetch the cache line at `at` bytes into `data`
    /// (for reading, or for writing); anywhere is fine: a prefetch reads
    /// and writes nothing.
    #[inline]
    #[target_feature(enable = "sse2")]
    pub(super) fn prefetch<const WRITE: bool>(data: &[u8], at: usize) {
        let p = data.as_ptr().wrapping_add(at).cast();
        if WRITE {
            _mm_prefetch::<_MM_HINT_ET0>(p);
        } else {
            _mm_prefetch::<_MM_HINT_T1>(p);
        }
    }

    /// See `super::planes`: each register of four entries sorted by byte,
    /// then the 4 × 4 words transposed.
    #[target_feature(enable = "ssse3")]
    pub(super) fn planes(table: &[u32; 16]) -> [[u8; 16]; 4] {
        let by_byte = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        let r: [__m128i; 4] = std::array::from_fn(|q| {
            let mut b = [0u8; 16];
            for (b, t) in b.chunks_exact_mut(4).zip(&table[4 * q..4 * q + 4]) {
                b.copy_from_slice(&t.to_le_bytes());
            }
            _mm_shuffle_epi8(load(&b), by_byte)
        });
        transpose_4x4_32(r).map(|v| bytes(v))
    }

    /// See `super::tables16`: four codes a register, encoded as
    /// `numerics` does it (round to nearest even; NaN as the canonical
    /// 0x7FC0 / 0x7E00 / 0x7FC0_0000).
    #[target_feature(enable = "ssse3")]
    pub(super) fn tables16(
        codes: &[f32; 16],
        entries: &[(f32, f32)],
        (post, out): (f32, super::OutDtype),
        each: &mut impl FnMut([u32; 16], [[u8; 16]; 4]),
    ) {
        let c: [__m128; 4] = std::array::from_fn(|q| {
            let c: &[f32; 4] = codes[4 * q..4 * q + 4].try_into().unwrap_or_else(|_| unreachable!("4 codes"));
            // SAFETY: reads exactly the 16 bytes of `c` (unaligned load).
            unsafe { _mm_loadu_ps(c.as_ptr()) }
        });
        let f = _mm_set1_ps(post);
        let by_byte = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        for &(zero, scale) in entries {
            let (z, s) = (_mm_set1_ps(zero), _mm_set1_ps(scale));
            // SAFETY: the caller checked F16C where the output is f16.
            let r: [__m128i; 4] =
                std::array::from_fn(|q| unsafe { encode(_mm_mul_ps(_mm_mul_ps(_mm_sub_ps(c[q], z), s), f), out) });
            let mut values = [0u32; 16];
            for (q, v) in r.iter().enumerate() {
                let b = bytes(*v);
                for (t, w) in values[4 * q..4 * q + 4].iter_mut().zip(b.chunks_exact(4)) {
                    *t = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                }
            }
            each(values, transpose_4x4_32(r.map(|v| _mm_shuffle_epi8(v, by_byte))).map(|v| bytes(v)));
        }
    }

    /// See `super::gather_words`, for lanes and words multiples of 16:
    /// blocks of 16 word rows × 16 lanes (a line each way), transposed in
    /// registers.
    #[target_feature(enable = "avx512f")]
    pub(super) fn gather_words_avx512(
        src: &[u8],
        (first, stride): (usize, usize),
        (lanes, words): (usize, usize),
        dst: &mut [u8],
        row: usize,
    ) {
        if lanes == 0 || words == 0 {
            return;
        }
        // One bounds check each for the last word row's line and the last
        // lane's words.
        let src = &src[..first + (words - 1) * stride + 4 * lanes];
        let dst = &mut dst[..(lanes - 1) * row + 4 * words];
        // No prefetches: runs of a band's lanes are long enough for the
        // hardware's (fetching them 16 word rows ahead was slower).
        for w in (0..words).step_by(16) {
            for k in (0..lanes).step_by(16) {
                let r: [__m512i; 16] = std::array::from_fn(|i| load64(slice64(src, first + (w + i) * stride + 4 * k)));
                let t: [__m512i; 16] = std::array::from_fn(|i| {
                    let (x, y) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
                    if i % 2 == 0 {
                        _mm512_unpacklo_epi32(x, y)
                    } else {
                        _mm512_unpackhi_epi32(x, y)
                    }
                });
                let u: [__m512i; 16] = std::array::from_fn(|i| {
                    // Pairs (t[4m], t[4m + 2]) and (t[4m + 1], t[4m + 3]).
                    let m = i / 4;
                    let (x, y) = match i % 4 {
                        0 | 1 => (t[4 * m], t[4 * m + 2]),
                        _ => (t[4 * m + 1], t[4 * m + 3]),
                    };
                    if i % 2 == 0 {
                        _mm512_unpacklo_epi64(x, y)
                    } else {
                        _mm512_unpackhi_epi64(x, y)
                    }
                });
                // u[4m + c], 128-bit lane l: lane 4l + c's words w + 4m ..
                // w + 4m + 4; v pairs word quads 0, 1 and 2, 3.
                let v: [__m512i; 16] = std::array::from_fn(|i| {
                    let (c, hi, half) = (i % 4, (i / 4) % 2 == 1, i / 8);
                    let (x, y) = (u[8 * half + c], u[8 * half + 4 + c]);
                    if hi {
                        _mm512_shuffle_i32x4::<0xDD>(x, y)
                    } else {
                        _mm512_shuffle_i32x4::<0x88>(x, y)
                    }
                });
                for j in 0..16 {
                    // v[c + 4·odd] and v[8 + c + 4·odd] hold lanes c + 4·odd
                    // and 8 + c + 4·odd, in their even and odd 128-bit lanes.
                    let (c, odd, top) = (j % 4, (j / 4) % 2 == 1, j / 8 == 1);
                    let (x, y) = (v[c + 4 * usize::from(odd)], v[8 + c + 4 * usize::from(odd)]);
                    let out = if top { _mm512_shuffle_i32x4::<0xDD>(x, y) } else { _mm512_shuffle_i32x4::<0x88>(x, y) };
                    store64(&mut dst[(k + j) * row + 4 * w..], out);
                }
            }
        }
    }

    /// See `super::tables16`: one table a register, its byte planes one
    /// byte permutation.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    pub(super) fn tables16_avx512(
        codes: &[f32; 16],
        entries: &[(f32, f32)],
        (post, out): (f32, super::OutDtype),
        each: &mut impl FnMut([u32; 16], [[u8; 16]; 4]),
    ) {
        // SAFETY: reads exactly the 64 bytes of `codes` (unaligned load).
        let c = unsafe { _mm512_loadu_ps(codes.as_ptr()) };
        let f = _mm512_set1_ps(post);
        // Byte 16·b + k of the planes is byte b of entry k.
        let by_plane = _mm512_set_epi8(
            63, 59, 55, 51, 47, 43, 39, 35, 31, 27, 23, 19, 15, 11, 7, 3, //
            62, 58, 54, 50, 46, 42, 38, 34, 30, 26, 22, 18, 14, 10, 6, 2, //
            61, 57, 53, 49, 45, 41, 37, 33, 29, 25, 21, 17, 13, 9, 5, 1, //
            60, 56, 52, 48, 44, 40, 36, 32, 28, 24, 20, 16, 12, 8, 4, 0,
        );
        let (one, round) = (_mm512_set1_epi32(1), _mm512_set1_epi32(0x7FFF));
        for &(zero, scale) in entries {
            let (z, s) = (_mm512_set1_ps(zero), _mm512_set1_ps(scale));
            let v = _mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(c, z), s), f);
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            let (bits, canonical) = match out {
                super::OutDtype::Bf16 => {
                    let b = _mm512_castps_si512(v);
                    let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), one);
                    (_mm512_srli_epi32::<16>(_mm512_add_epi32(_mm512_add_epi32(b, round), odd)), 0x7FC0)
                }
                super::OutDtype::F16 => {
                    let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
                    (_mm512_cvtepu16_epi32(h), 0x7E00)
                }
                super::OutDtype::F32 => (_mm512_castps_si512(v), 0x7FC0_0000),
            };
            let bits = _mm512_mask_blend_epi32(nan, bits, _mm512_set1_epi32(canonical));
            let mut values = [0u32; 16];
            let mut planes = [[0u8; 16]; 4];
            // SAFETY: each writes exactly the 64 bytes of its array
            // (unaligned stores).
            unsafe {
                _mm512_storeu_si512(values.as_mut_ptr().cast(), bits);
                _mm512_storeu_si512(planes.as_mut_ptr().cast(), _mm512_permutexvar_epi8(by_plane, bits));
            }
            each(values, planes);
        }
    }

    /// Four f32 encoded as `numerics` does it, each in a 32-bit lane: round
    /// to nearest even; NaN as the canonical 0x7FC0 / 0x7E00 / 0x7FC0_0000.
    ///
    /// # Safety
    /// The CPU has F16C where `out` is f16.
    #[inline]
    #[target_feature(enable = "ssse3")]
    unsafe fn encode(v: __m128, out: super::OutDtype) -> __m128i {
        let nan = _mm_castps_si128(_mm_cmpunord_ps(v, v));
        let (bits, canonical) = match out {
            super::OutDtype::Bf16 => {
                let b = _mm_castps_si128(v);
                let odd = _mm_and_si128(_mm_srli_epi32(b, 16), _mm_set1_epi32(1));
                let up = _mm_add_epi32(_mm_add_epi32(b, _mm_set1_epi32(0x7FFF)), odd);
                (_mm_srli_epi32(up, 16), 0x7FC0)
            }
            // SAFETY: the caller has F16C (this function's contract).
            super::OutDtype::F16 => (unsafe { half_bits(v) }, 0x7E00),
            super::OutDtype::F32 => (_mm_castps_si128(v), 0x7FC0_0000),
        };
        _mm_or_si128(_mm_andnot_si128(nan, bits), _mm_and_si128(nan, _mm_set1_epi32(canonical)))
    }

    /// See `super::smoothed`: 16 codes a step.
    ///
    /// # Safety
    /// The CPU has F16C where `out` is f16.
    #[target_feature(enable = "ssse3")]
    pub(super) unsafe fn smoothed<const N: usize>(
        codes: &[u8],
        planes: &[[u8; 16]; 4],
        (factors, high_first): (&[f32], bool),
        dst: &mut [u8],
        out: super::OutDtype,
    ) -> usize {
        let t = tables(planes);
        // The low 16 bits of each 32-bit lane, packed into the low half.
        let low16 = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
        let blocks = (codes.len() / 8).min(factors.len() / 16).min(dst.len() / (16 * N));
        let steps = codes.chunks_exact(8).zip(factors.chunks_exact(16)).zip(dst.chunks_exact_mut(16 * N));
        for ((c, f), o) in steps.take(blocks) {
            let c: &[u8; 8] = c.try_into().unwrap_or_else(|_| unreachable!("8 bytes"));
            let products = lookup::<4>(&t, indices(c, high_first));
            let o = &mut o[..16 * N];
            for (q, p) in products.into_iter().enumerate() {
                let f: &[f32; 4] = f[4 * q..4 * q + 4].try_into().unwrap_or_else(|_| unreachable!("4 factors"));
                // SAFETY: reads exactly the 16 bytes of `f` (unaligned load).
                let f = unsafe { _mm_loadu_ps(f.as_ptr()) };
                // SAFETY: the caller has F16C where `out` is f16.
                let v = unsafe { encode(_mm_mul_ps(_mm_castsi128_ps(p), f), out) };
                if N == 2 {
                    let b = bytes(_mm_shuffle_epi8(v, low16));
                    o[8 * q..8 * q + 8].copy_from_slice(&b[..8]);
                } else {
                    store(o, 16 * q, v);
                }
            }
        }
        16 * blocks
    }

    /// f32 → IEEE half bits, round to nearest even, each in a 32-bit lane.
    #[inline]
    #[target_feature(enable = "sse2,f16c")]
    fn half_bits(v: __m128) -> __m128i {
        let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        _mm_unpacklo_epi16(h, _mm_setzero_si128())
    }

    /// The 16 codes of 8 bytes as pshufb indices, in order: each byte's
    /// low nibble first, or its high one first (`high_first`).
    #[inline]
    #[target_feature(enable = "ssse3")]
    fn indices(codes: &[u8; 8], high_first: bool) -> __m128i {
        // SAFETY: reads exactly the 8 bytes of `codes`.
        let b = unsafe { _mm_loadl_epi64(codes.as_ptr().cast()) };
        let nibble = _mm_set1_epi8(0x0F);
        let low = _mm_and_si128(b, nibble);
        let high = _mm_and_si128(_mm_srli_epi16(b, 4), nibble);
        if high_first {
            _mm_unpacklo_epi8(high, low)
        } else {
            _mm_unpacklo_epi8(low, high)
        }
    }

    /// See `super::nibbles`.
    #[target_feature(enable = "ssse3")]
    pub(super) fn nibbles<const N: usize>(
        codes: &[u8],
        planes: &[[u8; 16]; 4],
        out: &mut [u8],
        high_first: bool,
        stream: bool,
    ) -> usize {
        let t = tables(planes);
        // A half block: 16 codes through one shuffle (groups of 16: NVFP4).
        let half = |c: &[u8], o: &mut [u8]| match (c.first_chunk::<8>(), o.get_mut(..16 * N)) {
            (Some(c), Some(o)) => {
                for (k, v) in lookup::<N>(&t, indices(c, high_first)).into_iter().take(N).enumerate() {
                    // SAFETY: k < N, so 16·k + 16 ≤ 16·N = o.len() (unaligned store).
                    unsafe { _mm_storeu_si128(o.as_mut_ptr().add(16 * k).cast(), v) };
                }
                16
            }
            _ => 0,
        };
        if out.len() < 32 * N {
            return half(codes, out);
        }
        let blocks = (codes.len() / 16).min(out.len() / (32 * N));
        for (c, o) in codes.chunks_exact(16).zip(out.chunks_exact_mut(32 * N)).take(blocks) {
            // The lines 512 outputs on, fetched for writing: the hardware
            // fetches them too, but later.
            for l in (0..32 * N).step_by(64).filter(|_| !stream) {
                prefetch::<true>(o, 512 * N + l);
            }
            segment::<N>(load(super::slice16(c, 0)), &t, high_first, o, stream);
        }
        blocks * 32 + half(&codes[16 * blocks..], &mut out[32 * N * blocks..])
    }

    /// See `super::nibbles`: a register of outputs at a time (32 codes to
    /// bf16/f16, 16 to f32), each code's field picked out of its 64-bit lane
    /// by one `vpmultishiftqb` and looked up in the table held in one
    /// register (`vpermw`, `vpermd`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    pub(super) fn nibbles_avx512<const N: usize>(
        codes: &[u8],
        values: &[u32; 16],
        out: &mut [u8],
        high_first: bool,
        stream: bool,
    ) -> usize {
        let t = load_u32s(values);
        // 16-bit outputs: the 16 values twice, as an index's bit 4 (the
        // next code's lowest bit) picks the same value.
        let table = if N == 2 {
            let w = _mm512_cvtepi32_epi16(t);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w), w)
        } else {
            t
        };
        let ctrl = load64(&MULTISHIFT[usize::from(N == 4)][usize::from(high_first)]);
        let halves = _mm512_set_epi64(1, 1, 1, 1, 0, 0, 0, 0);
        let lookup = |src: __m512i| {
            let idx = _mm512_multishift_epi64_epi8(ctrl, src);
            if N == 2 {
                _mm512_permutexvar_epi16(idx, table)
            } else {
                _mm512_permutexvar_epi32(idx, table)
            }
        };
        let word = |c: &[u8]| _mm512_set1_epi64(i64::from_le_bytes(*super::slice8(c)));
        // Code bytes per register.
        let per = 32 / N;
        let regs = (codes.len() / per).min(out.len() / 64);
        for (c, o) in codes.chunks_exact(per).zip(out.chunks_exact_mut(64)).take(regs) {
            let src = if N == 2 {
                _mm512_permutexvar_epi64(halves, _mm512_castsi128_si512(load(super::slice16(c, 0))))
            } else {
                word(c)
            };
            put64(o, lookup(src), stream);
        }
        // A last 16 codes to 16-bit outputs: half a register.
        let (rest, tail) = (&codes[regs * per..], &mut out[regs * 64..]);
        if N == 2 && rest.len() >= 8 && tail.len() >= 32 {
            let o = &mut tail[..32];
            // SAFETY: writes exactly the 32 bytes of `o` (unaligned store).
            unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), _mm512_castsi512_si256(lookup(word(rest)))) };
            return regs * 32 + 16;
        }
        regs * 32 * 2 / N
    }

    /// The `vpmultishiftqb` controls of [`nibbles_avx512`], for 16-bit and
    /// 32-bit outputs, low or high nibble first: byte 2k (16-bit) or 4k
    /// (32-bit) of 64-bit lane m is the bit offset of its code in the lane's
    /// word of codes (16-bit: lanes 0–3 read a block's first 8 bytes, 4–7
    /// its second; 32-bit: all read one), the others are not looked at.
    const MULTISHIFT: [[[u8; 64]; 2]; 2] = {
        let mut c = [[[0u8; 64]; 2]; 2];
        let mut p = 0;
        while p < 64 {
            let (m, b) = (p / 8, p % 8);
            if b % 2 == 0 {
                c[0][0][p] = (16 * (m % 4) + 2 * b) as u8;
                c[0][1][p] = c[0][0][p] ^ 4;
            }
            if b % 4 == 0 {
                c[1][0][p] = (8 * m + b) as u8;
                c[1][1][p] = c[1][0][p] ^ 4;
            }
            p += 1;
        }
        c
    };

    /// Stores a register in exactly the 64 bytes of `o`; with `stream`,
    /// around the caches where `o` is aligned.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn put64(o: &mut [u8], v: __m512i, stream: bool) {
        let o = &mut o[..64];
        // SAFETY: writes exactly the 64 bytes of `o` (unaligned store, or
        // an aligned one where o is aligned).
        unsafe {
            if stream && (o.as_ptr() as usize).is_multiple_of(64) {
                _mm512_stream_si512(o.as_mut_ptr().cast(), v)
            } else {
                _mm512_storeu_si512(o.as_mut_ptr().cast(), v)
            }
        };
    }

    /// See `super::shifted_block`: the 128 columns' 16 bytes transposed
    /// into each row's 128 codes (a byte each), then looked up in `base`
    /// and shifted, a row's 128·N bytes written at once.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    pub(super) fn shifted_block<const N: usize>(
        src: &[u8],
        (first, lane): (usize, usize),
        (base, shifts): (&[u32; 16], &[u32; 128]),
        out: &mut [u8],
        row_bytes: usize,
    ) {
        // One bounds check each for the last column's bytes and last row.
        let src = &src[..first + 127 * lane + 16];
        let out = &mut out[..31 * row_bytes + 128 * N];
        let column = |o: usize| load(super::slice16(src, first + o * lane));
        // Register j: columns 4j .. 4j + 4, one per 128-bit lane, each
        // reordered byte-major (byte 4b + l: byte b of the lane's column l).
        let major: [u8; 64] = std::array::from_fn(|p| (16 * (p % 4) + p / 4) as u8);
        let major = load64(&major);
        // w[m][q], lane l: byte 4l + q of columns 16m .. 16m + 16.
        let w: [[__m512i; 4]; 8] = std::array::from_fn(|m| {
            let a: [__m512i; 4] = std::array::from_fn(|j| {
                let o = 16 * m + 4 * j;
                let v = _mm512_castsi128_si512(column(o));
                let v = _mm512_inserti32x4::<1>(v, column(o + 1));
                let v = _mm512_inserti32x4::<2>(v, column(o + 2));
                _mm512_permutexvar_epi8(major, _mm512_inserti32x4::<3>(v, column(o + 3)))
            });
            let (ab0, cd0) = (_mm512_unpacklo_epi32(a[0], a[1]), _mm512_unpacklo_epi32(a[2], a[3]));
            let (ab1, cd1) = (_mm512_unpackhi_epi32(a[0], a[1]), _mm512_unpackhi_epi32(a[2], a[3]));
            [
                _mm512_unpacklo_epi64(ab0, cd0),
                _mm512_unpackhi_epi64(ab0, cd0),
                _mm512_unpacklo_epi64(ab1, cd1),
                _mm512_unpackhi_epi64(ab1, cd1),
            ]
        });
        // bytes[b][h]: byte b of columns 64h .. 64h + 64 (lanes transposed).
        let mut bytes = [[_mm512_setzero_si512(); 2]; 16];
        for q in 0..4 {
            for h in 0..2 {
                let x: [__m512i; 4] = std::array::from_fn(|t| w[4 * h + t][q]);
                let t0 = _mm512_shuffle_i64x2::<0x44>(x[0], x[1]);
                let t1 = _mm512_shuffle_i64x2::<0xEE>(x[0], x[1]);
                let t2 = _mm512_shuffle_i64x2::<0x44>(x[2], x[3]);
                let t3 = _mm512_shuffle_i64x2::<0xEE>(x[2], x[3]);
                bytes[q][h] = _mm512_shuffle_i64x2::<0x88>(t0, t2);
                bytes[4 + q][h] = _mm512_shuffle_i64x2::<0xDD>(t0, t2);
                bytes[8 + q][h] = _mm512_shuffle_i64x2::<0x88>(t1, t3);
                bytes[12 + q][h] = _mm512_shuffle_i64x2::<0xDD>(t1, t3);
            }
        }
        let nibble = _mm512_set1_epi8(0x0F);
        // The table, the shifts (a register per 64 bytes of a row's output)
        // and the magnitude bits, in N-byte lanes.
        let (table, shift, mag) = if N == 2 {
            let table = _mm512_zextsi256_si512(_mm512_cvtepi32_epi16(load_u32s(base)));
            let shift: [__m512i; 8] = std::array::from_fn(|k| {
                if k >= 4 {
                    return _mm512_setzero_si512();
                }
                let (a, b) = (load_u32s(&shifts[32 * k..]), load_u32s(&shifts[32 * k + 16..]));
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(a)), _mm512_cvtepi32_epi16(b))
            });
            (table, shift, _mm512_set1_epi16(0x7FFF))
        } else {
            let shift: [__m512i; 8] = std::array::from_fn(|k| load_u32s(&shifts[16 * k..]));
            (load_u32s(base), shift, _mm512_set1_epi32(0x7FFF_FFFF))
        };
        for row in 0..32 {
            let o = &mut out[row * row_bytes..][..128 * N];
            // Byte b holds rows 2b (low nibbles) and 2b + 1 (high ones).
            for (half, &v) in bytes[row / 2].iter().enumerate() {
                let codes = if row % 2 == 0 { v } else { _mm512_srli_epi16::<4>(v) };
                let codes = _mm512_and_si512(codes, nibble);
                // Each 64 codes' outputs, 64 bytes at a time.
                if N == 2 {
                    let parts = [_mm512_castsi512_si256(codes), _mm512_extracti64x4_epi64::<1>(codes)];
                    for (p, c) in parts.into_iter().enumerate() {
                        let k = 2 * half + p;
                        let v = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(c), table);
                        let v = _mm512_mask_add_epi16(v, _mm512_test_epi16_mask(v, mag), v, shift[k]);
                        store64(&mut o[64 * k..], v);
                    }
                } else {
                    let parts = [
                        _mm512_extracti32x4_epi32::<0>(codes),
                        _mm512_extracti32x4_epi32::<1>(codes),
                        _mm512_extracti32x4_epi32::<2>(codes),
                        _mm512_extracti32x4_epi32::<3>(codes),
                    ];
                    for (p, c) in parts.into_iter().enumerate() {
                        let k = 4 * half + p;
                        let v = _mm512_permutexvar_epi32(_mm512_cvtepu8_epi32(c), table);
                        let v = _mm512_mask_add_epi32(v, _mm512_test_epi32_mask(v, mag), v, shift[k]);
                        store64(&mut o[64 * k..], v);
                    }
                }
            }
        }
    }

    /// See `super::shifted_block`, for CPUs with AVX2 but not AVX-512:
    /// columns 16 at a time, their 16 bytes transposed (two columns a
    /// register, one per 128-bit lane), so that a register holds byte b and
    /// b + 1 of the 16 columns, which are four rows' codes; each row's 16
    /// values looked up in `base`'s byte planes and shifted.
    #[target_feature(enable = "avx2")]
    pub(super) fn shifted_block_avx2<const N: usize>(
        src: &[u8],
        (first, lane): (usize, usize),
        (base, shifts): (&[u32; 16], &[u32; 128]),
        out: &mut [u8],
        row_bytes: usize,
    ) {
        // One bounds check each for the last column's bytes and last row.
        let src = &src[..first + 127 * lane + 16];
        let out = &mut out[..31 * row_bytes + 128 * N];
        let column = |o: usize| load(super::slice16(src, first + o * lane));
        // AVX2 implies SSSE3: the byte planes by shuffles.
        let planes = planes(base);
        let plane: [__m256i; 4] = std::array::from_fn(|b| _mm256_broadcastsi128_si256(load(&planes[b])));
        let nibble = _mm256_set1_epi8(0x0F);
        let zero = _mm256_setzero_si256();
        // A value of nonzero magnitude gets its column's shift.
        let shifted = |v: __m256i, s: __m256i| {
            if N == 2 {
                let is_zero = _mm256_cmpeq_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7FFF)), zero);
                _mm256_add_epi16(v, _mm256_andnot_si256(is_zero, s))
            } else {
                let is_zero = _mm256_cmpeq_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7FFF_FFFF)), zero);
                _mm256_add_epi32(v, _mm256_andnot_si256(is_zero, s))
            }
        };
        let mut store = |r: usize, c: usize, v: __m256i| {
            let o = &mut out[r * row_bytes + c * N..][..32];
            // SAFETY: writes exactly the 32 bytes of `o` (unaligned store).
            unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), v) };
        };
        // The shifts as N-byte lanes, as the values are.
        let mut shift_bytes = [0u8; 512];
        for (d, s) in shift_bytes.chunks_exact_mut(N).zip(shifts) {
            d.copy_from_slice(&s.to_le_bytes()[..N]);
        }
        for m in 0..8 {
            let c0 = 16 * m;
            // Each 16 bytes of the columns' shifts, in both lanes (N of
            // them used).
            let shift: [__m256i; 4] = std::array::from_fn(|k| {
                _mm256_broadcastsi128_si256(load(super::slice16(&shift_bytes, c0 * N + 16 * k)))
            });
            // y[l]: column c0 + l in lane 0, c0 + 8 + l in lane 1.
            let y: [__m256i; 8] = std::array::from_fn(|l| _mm256_set_m128i(column(c0 + 8 + l), column(c0 + l)));
            // a[2k]: bytes 0..8 of columns 2k, 2k + 1 interleaved; a[2k + 1]: bytes 8..16.
            let a: [__m256i; 8] = std::array::from_fn(|i| {
                let (x, z) = (y[i / 2 * 2], y[i / 2 * 2 + 1]);
                if i % 2 == 0 {
                    _mm256_unpacklo_epi8(x, z)
                } else {
                    _mm256_unpackhi_epi8(x, z)
                }
            });
            // b[q][h][s]: columns 4q .. 4q + 4, bytes 8h + 4s .. 8h + 4s + 4.
            let b: [[[__m256i; 2]; 2]; 2] = std::array::from_fn(|q| {
                std::array::from_fn(|h| {
                    let (x, z) = (a[4 * q + h], a[4 * q + 2 + h]);
                    [_mm256_unpacklo_epi16(x, z), _mm256_unpackhi_epi16(x, z)]
                })
            });
            for h in 0..2 {
                for s in 0..2 {
                    let (x, z) = (b[0][h][s], b[1][h][s]);
                    for (t, c) in [_mm256_unpacklo_epi32(x, z), _mm256_unpackhi_epi32(x, z)].into_iter().enumerate() {
                        // Bytes bt, bt + 1 of a lane's 8 columns; then byte
                        // bt of all 16 in lane 0, bt + 1 in lane 1.
                        let bt = 8 * h + 4 * s + 2 * t;
                        let z = _mm256_permute4x64_epi64::<0xD8>(c);
                        let lo = _mm256_and_si256(z, nibble);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(z), nibble);
                        // Rows 2bt, 2bt + 2 (low nibbles), 2bt + 1, 2bt + 3.
                        for (codes, r) in [(lo, 2 * bt), (hi, 2 * bt + 1)] {
                            let p: [__m256i; 4] = std::array::from_fn(|k| {
                                if k < N {
                                    _mm256_shuffle_epi8(plane[k], codes)
                                } else {
                                    zero
                                }
                            });
                            if N == 2 {
                                let v0 = shifted(_mm256_unpacklo_epi8(p[0], p[1]), shift[0]);
                                let v1 = shifted(_mm256_unpackhi_epi8(p[0], p[1]), shift[1]);
                                store(r, c0, _mm256_permute2x128_si256::<0x20>(v0, v1));
                                store(r + 2, c0, _mm256_permute2x128_si256::<0x31>(v0, v1));
                            } else {
                                let (w01, w23) = (_mm256_unpacklo_epi8(p[0], p[1]), _mm256_unpacklo_epi8(p[2], p[3]));
                                let (x01, x23) = (_mm256_unpackhi_epi8(p[0], p[1]), _mm256_unpackhi_epi8(p[2], p[3]));
                                let d = [
                                    shifted(_mm256_unpacklo_epi16(w01, w23), shift[0]),
                                    shifted(_mm256_unpackhi_epi16(w01, w23), shift[1]),
                                    shifted(_mm256_unpacklo_epi16(x01, x23), shift[2]),
                                    shifted(_mm256_unpackhi_epi16(x01, x23), shift[3]),
                                ];
                                store(r, c0, _mm256_permute2x128_si256::<0x20>(d[0], d[1]));
                                store(r, c0 + 8, _mm256_permute2x128_si256::<0x20>(d[2], d[3]));
                                store(r + 2, c0, _mm256_permute2x128_si256::<0x31>(d[0], d[1]));
                                store(r + 2, c0 + 8, _mm256_permute2x128_si256::<0x31>(d[2], d[3]));
                            }
                        }
                    }
                }
            }
        }
    }

    /// See `super::transposed_block`: 8 lanes of 2-byte or 4 of 4-byte
    /// outputs.
    #[target_feature(enable = "ssse3")]
    pub(super) fn transposed_block<const N: usize>(
        codes: &[&[u8; 8]],
        planes: &[&[[u8; 16]; 4]],
        out: &mut [u8],
        row_bytes: usize,
    ) {
        // One bounds check for the block's last row; every row then lies in.
        let end = 15 * row_bytes + 16;
        let out = &mut out[..end];
        let mut store = |e: usize, v: __m128i| {
            if e < 16 {
                // SAFETY: e < 16, so e·row_bytes + 16 ≤ end = out.len()
                // (unaligned store).
                unsafe { _mm_storeu_si128(out.as_mut_ptr().add(e * row_bytes).cast(), v) };
            }
        };
        // Per lane, its 16 rows' values: rows 0..8 and 8..16 (N = 2), or
        // rows 4k..4k + 4 (N = 4).
        let v: [[__m128i; 4]; 8] = std::array::from_fn(|q| match (codes.get(q), planes.get(q)) {
            (Some(c), Some(p)) if q < 16 / N => lookup::<N>(&tables(p), indices(c, false)),
            _ => [_mm_setzero_si128(); 4],
        });
        if N == 2 {
            for half in 0..2 {
                let r: [__m128i; 8] = std::array::from_fn(|q| v[q][half]);
                for (e, row) in transpose_8x8_16(r).into_iter().enumerate() {
                    store(8 * half + e, row);
                }
            }
        } else {
            for k in 0..4 {
                let rows = transpose_4x4_32([v[0][k], v[1][k], v[2][k], v[3][k]]);
                for (e, row) in rows.into_iter().enumerate() {
                    store(4 * k + e, row);
                }
            }
        }
    }

    /// Transposes 8 × 8 16-bit values: value `e` of `r[q]` becomes value
    /// `q` of the result's `e`.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn transpose_8x8_16(r: [__m128i; 8]) -> [__m128i; 8] {
        let a: [__m128i; 8] = std::array::from_fn(|k| {
            let (x, y) = (r[k / 2 * 2], r[k / 2 * 2 + 1]);
            if k % 2 == 0 {
                _mm_unpacklo_epi16(x, y)
            } else {
                _mm_unpackhi_epi16(x, y)
            }
        });
        // a[0], a[2], a[4], a[6]: values 0..4 of row pairs; a[odd]: 4..8.
        let b = |x: __m128i, y: __m128i| (_mm_unpacklo_epi32(x, y), _mm_unpackhi_epi32(x, y));
        let (b0, b1) = b(a[0], a[2]);
        let (b2, b3) = b(a[1], a[3]);
        let (b4, b5) = b(a[4], a[6]);
        let (b6, b7) = b(a[5], a[7]);
        [
            _mm_unpacklo_epi64(b0, b4),
            _mm_unpackhi_epi64(b0, b4),
            _mm_unpacklo_epi64(b1, b5),
            _mm_unpackhi_epi64(b1, b5),
            _mm_unpacklo_epi64(b2, b6),
            _mm_unpackhi_epi64(b2, b6),
            _mm_unpacklo_epi64(b3, b7),
            _mm_unpackhi_epi64(b3, b7),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn awq_gather_equals_the_field_order() {
        // 9 word columns (two SSE2 groups and a scalar rest) of 48 inputs (a
        // block of 32 and one of 8, twice), and whole groups only.
        for (columns, inputs) in [(9, 48), (16, 64), (32, 96)] {
            let mut rng = fastrand::Rng::with_seed(3);
            let src: Vec<u8> = (0..columns * 4 * inputs).map(|_| rng.u8(..)).collect();
            let row = inputs / 2;
            let mut dst = vec![0u8; 8 * columns * row];
            gather_awq(Isa::detect(), &src, (0, columns * 4), (columns, inputs), &mut dst, row);
            for o in 0..8 * columns {
                for i in 0..inputs {
                    let a = i * columns * 4 + o / 8 * 4;
                    let word = u32::from_le_bytes([src[a], src[a + 1], src[a + 2], src[a + 3]]);
                    let want = (word >> (4 * crate::job::AWQ_SLOT[o % 8])) & 15;
                    let got = (dst[o * row + i / 2] >> (4 * (i % 2))) & 15;
                    assert_eq!(got as u32, want, "output {o}, input {i} of {columns} x {inputs}");
                }
            }
        }
    }

    #[test]
    fn vector_tables_equal_the_scalar_encoding() {
        use crate::numerics;
        // Ties, subnormals, overflow to infinity, signed zeros and NaNs.
        let special = [
            0.0,
            -0.0,
            1.0 + f32::EPSILON,
            f32::from_bits(0x3F80_8000),
            f32::from_bits(0x3F81_8000),
            65520.0,
            65519.99,
            6.0e-8,
            1.0e-40,
            f32::INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MAX,
            -7.0,
            8.0,
            -1.5,
        ];
        let mut rng = fastrand::Rng::with_seed(11);
        let mut codes: Vec<[f32; 16]> = vec![special];
        codes.extend((0..8).map(|_| std::array::from_fn(|_| f32::from_bits(rng.u32(..)))));
        let entries: Vec<(f32, f32)> = [(0.0, 1.0), (-0.0, -1.0), (8.0, 0.5), (f32::NAN, 1.0), (1.0, f32::INFINITY)]
            .into_iter()
            .chain((0..40).map(|_| (f32::from_bits(rng.u32(..)), f32::from_bits(rng.u32(..)))))
            .collect();
        // The AVX-512 kernel where the CPU has it, then the SSSE3 one.
        let outs = [OutDtype::Bf16, OutDtype::F16, OutDtype::F32];
        for (kernels, out) in [Kernels::Widest, Kernels::Narrow].into_iter().flat_map(|k| outs.map(|o| (k, o))) {
            let isa = Isa::of(kernels);
            for c in &codes {
                for post in [1.0, 1.0 / 127.0] {
                    let mut got = Vec::new();
                    if !tables16(isa, c, &entries, (post, out), &mut |v, p| got.push((v, p))) {
                        continue;
                    }
                    assert_eq!(got.len(), entries.len());
                    for (&(z, s), (values, p)) in entries.iter().zip(&got) {
                        let want: [u32; 16] = std::array::from_fn(|k| {
                            let v = (c[k] - z) * s * post;
                            match out {
                                OutDtype::Bf16 => numerics::f32_to_bf16(v) as u32,
                                OutDtype::F16 => numerics::f32_to_f16(v) as u32,
                                OutDtype::F32 => numerics::f32_bits(v),
                            }
                        });
                        assert_eq!(values, &want, "{out} codes {c:?} entry ({z}, {s}) post {post}");
                        assert_eq!(p, &planes(Isa::SCALAR, &want), "{out} planes");
                    }
                }
            }
        }
    }

    fn shifted_equals_the_lookup<const N: usize>() {
        let mut rng = fastrand::Rng::with_seed(17);
        let mag = if N == 2 { 0x7FFF } else { 0x7FFF_FFFF };
        let wrap = if N == 2 { 0xFFFF } else { u32::MAX };
        for (lane, row_bytes) in [(16, 128 * N), (64, 128 * N + 64), (2048, 4096 * N)] {
            let src: Vec<u8> = (0..127 * lane + 16 + 5).map(|_| rng.u8(..)).collect();
            // Zeros of both signs among the values, and shifts that wrap.
            let mut base: [u32; 16] = std::array::from_fn(|_| rng.u32(..) & wrap);
            base[0] = 0;
            base[8] = if N == 2 { 0x8000 } else { 0x8000_0000 };
            let shifts: [u32; 128] = std::array::from_fn(|_| rng.u32(..) & wrap);
            let first = 5;
            // The kernel this CPU runs, and the AVX2 one where it has that
            // too (an AVX-512 CPU runs the other).
            let mut outs = vec![vec![0u8; 31 * row_bytes + 128 * N]];
            if !shifted_block::<N>(Isa::detect(), &src, (first, lane), (&base, &shifts), &mut outs[0], row_bytes) {
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                let mut out = vec![0u8; 31 * row_bytes + 128 * N];
                // SAFETY: the CPU has AVX2 (checked just above).
                unsafe { x86::shifted_block_avx2::<N>(&src, (first, lane), (&base, &shifts), &mut out, row_bytes) };
                outs.push(out);
            }
            for (out, r) in outs.iter().flat_map(|o| (0..32).map(move |r| (o, r))) {
                for o in 0..128 {
                    let code = (src[first + o * lane + r / 2] >> (4 * (r % 2))) & 15;
                    let v = base[code as usize];
                    let want = if v & mag == 0 { v } else { v.wrapping_add(shifts[o]) & wrap };
                    let at = r * row_bytes + o * N;
                    assert_eq!(&out[at..at + N], &want.to_le_bytes()[..N], "row {r} column {o} lane {lane}");
                }
            }
        }
    }

    #[test]
    fn shifted_blocks_equal_the_lookup() {
        shifted_equals_the_lookup::<2>();
        shifted_equals_the_lookup::<4>();
    }

    /// Each nibble kernel this CPU has, by name: the dispatcher's choice,
    /// and each of the AVX-512 and SSSE3 ones on its own.
    #[allow(clippy::type_complexity)]
    fn nibble_kernels<const N: usize>() -> Vec<(&'static str, fn(&[u8], (&[u32; 16], &[[u8; 16]; 4]), &mut [u8], bool, bool) -> usize)> {
        let mut kernels: Vec<(&'static str, fn(&[u8], (&[u32; 16], &[[u8; 16]; 4]), &mut [u8], bool, bool) -> usize)> =
            vec![("dispatched", |c, t, o, hf, st| nibbles::<N>(Isa::detect(), c, t, o, hf, st))];
        let isa = Isa::detect();
        #[cfg(target_arch = "x86_64")]
        if isa.avx512 {
            // SAFETY: the CPU has AVX-512 F, BW and VBMI (checked just above).
            kernels.push(("avx512", |c, (v, _), o, hf, st| unsafe { x86::nibbles_avx512::<N>(c, v, o, hf, st) }));
        }
        #[cfg(target_arch = "x86_64")]
        if isa.ssse3 {
            // SAFETY: the CPU has SSSE3 (checked just above).
            kernels.push(("ssse3", |c, (_, p), o, hf, st| unsafe { x86::nibbles::<N>(c, p, o, hf, st) }));
        }
        kernels
    }

    fn nibbles_equal_the_lookup<const N: usize>() {
        let mut rng = fastrand::Rng::with_seed(13);
        let v: [u32; 16] = std::array::from_fn(|_| rng.u32(..) >> (32 - 8 * N));
        let p = planes(Isa::SCALAR, &v);
        // Whole blocks, a last half block, and bytes past both.
        for bytes in [8, 16, 24, 40, 43, 64, 72, 200] {
            let codes: Vec<u8> = (0..bytes).map(|_| rng.u8(..)).collect();
            for ((name, kernel), high_first) in nibble_kernels::<N>().into_iter().flat_map(|k| [(k, false), (k, true)]) {
                // Streamed into a line-aligned buffer, and 16 bytes past one.
                for (stream, skew) in [(false, 0), (true, 0), (true, 16)] {
                    let mut buf = vec![0u8; 2 * bytes * N + 128];
                    let at = (64 - buf.as_ptr() as usize % 64) % 64 + skew;
                    let out = &mut buf[at..at + 2 * bytes * N];
                    let done = kernel(&codes, (&v, &p), out, high_first, stream);
                    fence();
                    if Isa::detect().ssse3 {
                        assert_eq!(done, 2 * bytes / 32 * 32 + (2 * bytes % 32) / 16 * 16, "{name}");
                    }
                    for i in 0..done {
                        let shift = 4 * ((i % 2) ^ usize::from(high_first));
                        let code = ((codes[i / 2] >> shift) & 15) as usize;
                        let want = &v[code].to_le_bytes()[..N];
                        let what = format!("{name}: {bytes} bytes, high first {high_first}, stream {stream}, skew {skew}, code {i}");
                        assert_eq!(&out[i * N..i * N + N], want, "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn nibble_blocks_equal_the_lookup() {
        nibbles_equal_the_lookup::<2>();
        nibbles_equal_the_lookup::<4>();
    }

    #[test]
    fn split_nibbles_equal_the_field_order() {
        let mut rng = fastrand::Rng::with_seed(17);
        for len in [1usize, 15, 16, 33, 48] {
            let src: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            for vectors in [true, false] {
                let isa = if vectors { Isa::detect() } else { Isa::SCALAR };
                let (mut lo, mut hi) = (vec![0u8; len.div_ceil(2)], vec![0u8; len.div_ceil(2)]);
                split_nibbles(isa, &src, &mut lo, &mut hi);
                for (c, &b) in src.iter().enumerate() {
                    let at = |row: &[u8]| (row[c / 2] >> (4 * (c % 2))) & 15;
                    assert_eq!((at(&lo), at(&hi)), (b & 15, b >> 4), "{len} bytes, column {c}, vectors {vectors}");
                }
            }
        }
    }

    #[test]
    fn planes_hold_each_byte_of_each_entry() {
        let table: [u32; 16] = std::array::from_fn(|c| 0x0403_0201u32.wrapping_mul(c as u32 + 7) ^ 0xA5A5_5A5A);
        let p = planes(Isa::detect(), &table);
        for (c, t) in table.iter().enumerate() {
            for (b, plane) in p.iter().enumerate() {
                assert_eq!(plane[c], (t >> (8 * b)) as u8, "entry {c}, byte {b}");
            }
        }
    }

    #[test]
    fn word_gather_equals_the_scalar_copy() {
        // Blocks of 4 (SSE2) with remainders, and of 16 (AVX-512), whose
        // rows' lines are a stride apart.
        for (lanes, words, stride) in [(7, 6, 40), (32, 48, 200), (16, 16, 64)] {
            let src: Vec<u8> = (0..words * stride + 64).map(|b| (b * 7 + b / 251) as u8).collect();
            let row = 4 * words + 4;
            let mut dst = vec![0u8; lanes * row];
            gather_words(Isa::detect(), &src, (8, stride), (lanes, words), &mut dst, row);
            for k in 0..lanes {
                for w in 0..words {
                    let at = 8 + w * stride + 4 * k;
                    assert_eq!(&dst[k * row + 4 * w..][..4], &src[at..at + 4], "lane {k}, word {w} of {lanes} x {words}");
                }
            }
        }
    }

    fn transposed_equals_scalar<const N: usize>(lanes: usize) {
        let mut rng = fastrand::Rng::with_seed(5);
        let codes: Vec<[u8; 8]> = (0..lanes).map(|_| std::array::from_fn(|_| rng.u8(..))).collect();
        let planes: Vec<[[u8; 16]; 4]> =
            (0..lanes).map(|_| std::array::from_fn(|_| std::array::from_fn(|_| rng.u8(..)))).collect();
        // Rows wider than the block, whose other bytes must stay as they are.
        let row_bytes = lanes * N + 6;
        let c: Vec<&[u8; 8]> = codes.iter().collect();
        let p: Vec<&[[u8; 16]; 4]> = planes.iter().collect();
        for vectors in [true, false] {
            let isa = if vectors { Isa::detect() } else { Isa::SCALAR };
            let mut out = vec![0x5Au8; 15 * row_bytes + lanes * N];
            transposed_block::<N>(isa, &c, &p, &mut out, row_bytes);
            for (i, &b) in out.iter().enumerate() {
                let (e, at) = (i / row_bytes, i % row_bytes);
                let want = if at < lanes * N {
                    let (q, byte) = (at / N, at % N);
                    let code = ((codes[q][e / 2] >> (4 * (e % 2))) & 15) as usize;
                    planes[q][byte][code]
                } else {
                    0x5A
                };
                assert_eq!(b, want, "vectors {vectors}, row {e}, byte {at}");
            }
        }
    }

    #[test]
    fn transposed_blocks_equal_the_scalar_lookup() {
        transposed_equals_scalar::<2>(8);
        transposed_equals_scalar::<4>(4);
        transposed_equals_scalar::<2>(3);
        transposed_equals_scalar::<4>(1);
    }
}

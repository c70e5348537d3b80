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
            unsafe {
                x86::shifted_block_avx2::<N>(src, (first, lane), (base, shifts), out, row_bytes)
            };
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
    let (k4, w4) = if isa.sse2 {
        (lanes / 4 * 4, words / 4 * 4)
    } else {
        (0, 0)
    };
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
    let done = if isa.ssse3 {
        unsafe { x86::split_nibbles(src, lo, hi) }
    } else {
        0
    };
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
    s.try_into()
        .unwrap_or_else(|_| unreachable!("a 16-byte slice"))
}

#[cfg(target_arch = "x86_64")]
// The loops index several arrays of registers by the same lane.
#[allow(clippy::needless_range_loop)]
mod x86;

#[cfg(test)]
mod tests;

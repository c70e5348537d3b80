//! The x86-64 kernels behind `simd`'s portable entry points, each built for
//! the instructions its `target_feature` names (the caller checked the CPU
//! has them): here the register loads, stores, transposes and prefetches
//! they share; in [`gather`] those that move codes without decoding them, in
//! [`tables`] the table lookups, in [`transposed`] the decodes of packs
//! stored along the output's columns.

use std::arch::x86_64::*;

/// Interleaves four registers `p` in two steps, as a 4 × 4 transpose of
/// their elements does: `p[0]` with `p[1]` and `p[2]` with `p[3]` by the
/// narrow `unpack` pair (`lo`, `hi`), then those results by the pair twice
/// as wide (`lo2`, `hi2`). A macro, not a function, as its kernels differ
/// only in these intrinsics (register width and element size).
macro_rules! interleave4 {
    ($p:expr, $lo:ident, $hi:ident, $lo2:ident, $hi2:ident) => {{
        let p = $p;
        let (ab0, cd0) = ($lo(p[0], p[1]), $lo(p[2], p[3]));
        let (ab1, cd1) = ($hi(p[0], p[1]), $hi(p[2], p[3]));
        [
            $lo2(ab0, cd0),
            $hi2(ab0, cd0),
            $lo2(ab1, cd1),
            $hi2(ab1, cd1),
        ]
    }};
}

mod gather;
mod tables;
mod transposed;

pub(super) use gather::{gather_awq, gather_words_avx512, split_nibbles, transpose_4x4};
pub(super) use tables::{nibbles, nibbles_avx512, planes, smoothed, tables16, tables16_avx512};
pub(super) use transposed::{shifted_block, shifted_block_avx2, transposed_block};

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
    src[at..at + 64]
        .try_into()
        .unwrap_or_else(|_| unreachable!("64 bytes"))
}

/// 16 u32 as a register.
#[inline]
#[target_feature(enable = "avx512f")]
fn load_u32s(v: &[u32]) -> __m512i {
    let v: &[u32; 16] = v[..16]
        .try_into()
        .unwrap_or_else(|_| unreachable!("16 words"));
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
    interleave4!(
        r,
        _mm_unpacklo_epi32,
        _mm_unpackhi_epi32,
        _mm_unpacklo_epi64,
        _mm_unpackhi_epi64
    )
}

/// Byte b of each of four registers as word b: (p0[b], p1[b], p2[b],
/// p3[b]), little-endian, words 0..16 across the four results.
#[inline]
#[target_feature(enable = "sse2")]
fn bytes_to_words(p: [__m128i; 4]) -> [__m128i; 4] {
    interleave4!(
        p,
        _mm_unpacklo_epi8,
        _mm_unpackhi_epi8,
        _mm_unpacklo_epi16,
        _mm_unpackhi_epi16
    )
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

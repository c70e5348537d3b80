//! The x86-64 kernels that move 4-bit codes without decoding them: the
//! gathers and transposes that turn GPTQ's and AutoAWQ's packs along the
//! input dimension into straight rows, and the split of bytes into their
//! low and high nibbles.

use std::arch::x86_64::*;

use super::{
    bytes, bytes_to_words, load, load64, prefetch, slice64, store, store64, transpose_4x4_32,
};
use crate::backend::cpu::simd::slice16;

/// Transposes 4 × 4 words: word `k` of `rows[q]` becomes word `q` of
/// the result's `k`.
#[target_feature(enable = "sse2")]
pub(in crate::backend::cpu::simd) fn transpose_4x4(rows: [&[u8; 16]; 4]) -> [[u8; 16]; 4] {
    transpose_4x4_32(rows.map(|b| load(b))).map(|v| bytes(v))
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
        _mm_or_si128(
            _mm_and_si128(a, lo),
            _mm_and_si128(_mm_slli_epi16(b, 4), hi),
        )
    });
    let q: [__m128i; 4] = std::array::from_fn(|m| {
        let (a, b) = (r[2 * m], r[2 * m + 1]);
        _mm_or_si128(
            _mm_and_si128(_mm_srli_epi16(a, 4), lo),
            _mm_and_si128(b, hi),
        )
    });
    [bytes_to_words(p), bytes_to_words(q)]
}

/// `simd::gather_awq` for `columns` a multiple of 4: blocks of 32
/// inputs × 32 outputs (each output's 16 bytes stored at once), then
/// blocks of 8 inputs.
#[target_feature(enable = "sse2")]
pub(in crate::backend::cpu::simd) fn gather_awq(
    src: &[u8],
    (first, lane): (usize, usize),
    (columns, inputs): (usize, usize),
    dst: &mut [u8],
    row: usize,
) {
    const ELEMENT: [[usize; 4]; 2] = [[0, 4, 1, 5], [2, 6, 3, 7]];
    let block = |c: usize, i: usize| {
        awq_8x32(std::array::from_fn(|j| {
            load(slice16(src, first + (i + j) * lane + 4 * c))
        }))
    };
    let i32 = inputs / 32 * 32;

    // Inputs outer: each input's bytes of the band (whole cache lines)
    // are read together.
    for i in (0..i32).step_by(32) {
        // The lines of the inputs two blocks on (a lane apart).
        for j in 64..96 {
            let at = first + (i + j) * lane;
            for l in (0..4 * columns)
                .step_by(64)
                .chain((4 * columns).checked_sub(1))
            {
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

/// See `simd::split_nibbles`: 16 bytes at a time; returns how many.
#[target_feature(enable = "ssse3")]
pub(in crate::backend::cpu::simd) fn split_nibbles(
    src: &[u8],
    lo: &mut [u8],
    hi: &mut [u8],
) -> usize {
    let (nibble, pack) = (_mm_set1_epi8(0x0F), _mm_set1_epi16(0x1001));
    let blocks = src.len() / 16;
    for (k, c) in src.chunks_exact(16).enumerate() {
        let v = load(slice16(c, 0));
        // Each pair of bytes' nibbles as one byte: a + 16·b.
        let l = _mm_maddubs_epi16(_mm_and_si128(v, nibble), pack);
        let h = _mm_maddubs_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), nibble), pack);
        let b = bytes(_mm_packus_epi16(l, h));
        lo[8 * k..8 * k + 8].copy_from_slice(&b[..8]);
        hi[8 * k..8 * k + 8].copy_from_slice(&b[8..]);
    }
    16 * blocks
}

/// See `simd::gather_words`, for lanes and words multiples of 16:
/// blocks of 16 word rows × 16 lanes (a line each way), transposed in
/// registers.
#[target_feature(enable = "avx512f")]
pub(in crate::backend::cpu::simd) fn gather_words_avx512(
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
            let r: [__m512i; 16] =
                std::array::from_fn(|i| load64(slice64(src, first + (w + i) * stride + 4 * k)));
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
                let out = if top {
                    _mm512_shuffle_i32x4::<0xDD>(x, y)
                } else {
                    _mm512_shuffle_i32x4::<0x88>(x, y)
                };
                store64(&mut dst[(k + j) * row + 4 * w..], out);
            }
        }
    }
}

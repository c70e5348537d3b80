//! The x86-64 kernels for packs stored along the output's columns: each
//! decodes a block of codes through its columns' tables and writes it
//! transposed, as output rows.

use std::arch::x86_64::*;

use super::tables::{indices, lookup, planes, tables};
use super::{load, load64, load_u32s, store64, transpose_4x4_32};
use crate::backend::cpu::simd::slice16;

/// See `simd::shifted_block`: the 128 columns' 16 bytes transposed
/// into each row's 128 codes (a byte each), then looked up in `base`
/// and shifted, a row's 128·N bytes written at once.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
pub(in crate::backend::cpu::simd) fn shifted_block<const N: usize>(
    src: &[u8],
    (first, lane): (usize, usize),
    (base, shifts): (&[u32; 16], &[u32; 128]),
    out: &mut [u8],
    row_bytes: usize,
) {
    // One bounds check each for the last column's bytes and last row.
    let src = &src[..first + 127 * lane + 16];
    let out = &mut out[..31 * row_bytes + 128 * N];
    let column = |o: usize| load(slice16(src, first + o * lane));
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
        interleave4!(
            a,
            _mm512_unpacklo_epi32,
            _mm512_unpackhi_epi32,
            _mm512_unpacklo_epi64,
            _mm512_unpackhi_epi64
        )
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
            let (a, b) = (
                load_u32s(&shifts[32 * k..]),
                load_u32s(&shifts[32 * k + 16..]),
            );
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm512_cvtepi32_epi16(a)),
                _mm512_cvtepi32_epi16(b),
            )
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
            let codes = if row % 2 == 0 {
                v
            } else {
                _mm512_srli_epi16::<4>(v)
            };
            let codes = _mm512_and_si512(codes, nibble);
            // Each 64 codes' outputs, 64 bytes at a time.
            if N == 2 {
                let parts = [
                    _mm512_castsi512_si256(codes),
                    _mm512_extracti64x4_epi64::<1>(codes),
                ];
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

/// See `simd::shifted_block`, for CPUs with AVX2 but not AVX-512:
/// columns 16 at a time, their 16 bytes transposed (two columns a
/// register, one per 128-bit lane), so that a register holds byte b and
/// b + 1 of the 16 columns, which are four rows' codes; each row's 16
/// values looked up in `base`'s byte planes and shifted.
#[target_feature(enable = "avx2")]
pub(in crate::backend::cpu::simd) fn shifted_block_avx2<const N: usize>(
    src: &[u8],
    (first, lane): (usize, usize),
    (base, shifts): (&[u32; 16], &[u32; 128]),
    out: &mut [u8],
    row_bytes: usize,
) {
    // One bounds check each for the last column's bytes and last row.
    let src = &src[..first + 127 * lane + 16];
    let out = &mut out[..31 * row_bytes + 128 * N];
    let column = |o: usize| load(slice16(src, first + o * lane));
    // AVX2 implies SSSE3: the byte planes by shuffles.
    let planes = planes(base);
    let plane: [__m256i; 4] =
        std::array::from_fn(|b| _mm256_broadcastsi128_si256(load(&planes[b])));
    let nibble = _mm256_set1_epi8(0x0F);
    let zero = _mm256_setzero_si256();
    // A value of nonzero magnitude gets its column's shift.
    let shifted = |v: __m256i, s: __m256i| {
        if N == 2 {
            let is_zero = _mm256_cmpeq_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7FFF)), zero);
            _mm256_add_epi16(v, _mm256_andnot_si256(is_zero, s))
        } else {
            let is_zero =
                _mm256_cmpeq_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7FFF_FFFF)), zero);
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
            _mm256_broadcastsi128_si256(load(slice16(&shift_bytes, c0 * N + 16 * k)))
        });
        // y[l]: column c0 + l in lane 0, c0 + 8 + l in lane 1.
        let y: [__m256i; 8] =
            std::array::from_fn(|l| _mm256_set_m128i(column(c0 + 8 + l), column(c0 + l)));
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
                for (t, c) in [_mm256_unpacklo_epi32(x, z), _mm256_unpackhi_epi32(x, z)]
                    .into_iter()
                    .enumerate()
                {
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
                            let (w01, w23) = (
                                _mm256_unpacklo_epi8(p[0], p[1]),
                                _mm256_unpacklo_epi8(p[2], p[3]),
                            );
                            let (x01, x23) = (
                                _mm256_unpackhi_epi8(p[0], p[1]),
                                _mm256_unpackhi_epi8(p[2], p[3]),
                            );
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

/// See `simd::transposed_block`: 8 lanes of 2-byte or 4 of 4-byte
/// outputs.
#[target_feature(enable = "ssse3")]
pub(in crate::backend::cpu::simd) fn transposed_block<const N: usize>(
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

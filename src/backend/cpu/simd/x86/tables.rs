//! The x86-64 table kernels: 4-bit codes looked up in 16-entry tables
//! (`pshufb` on byte planes; `vpermw`/`vpermd` on AVX-512), and the tables
//! themselves built and rounded to the output type as `numerics` does it.

use std::arch::x86_64::*;

use super::{bytes, bytes_to_words, load, load64, load_u32s, prefetch, store, transpose_4x4_32};
use crate::backend::cpu::simd::{slice16, slice8};
use crate::numerics::OutDtype;

/// The table planes as registers.
#[inline]
#[target_feature(enable = "sse2")]
pub(super) fn tables(planes: &[[u8; 16]; 4]) -> [__m128i; 4] {
    std::array::from_fn(|b| load(&planes[b]))
}

/// The outputs of the 16 codes `idx` through the table planes `t`, in
/// order: N·16 bytes, in the first N registers.
#[inline]
#[target_feature(enable = "ssse3")]
pub(super) fn lookup<const N: usize>(t: &[__m128i; 4], idx: __m128i) -> [__m128i; 4] {
    let (a, b) = (_mm_shuffle_epi8(t[0], idx), _mm_shuffle_epi8(t[1], idx));
    if N == 2 {
        let zero = _mm_setzero_si128();
        return [_mm_unpacklo_epi8(a, b), _mm_unpackhi_epi8(a, b), zero, zero];
    }
    let (c, d) = (_mm_shuffle_epi8(t[2], idx), _mm_shuffle_epi8(t[3], idx));
    bytes_to_words([a, b, c, d])
}

/// The 16 codes of 8 bytes as pshufb indices, in order: each byte's
/// low nibble first, or its high one first (`high_first`).
#[inline]
#[target_feature(enable = "ssse3")]
pub(super) fn indices(codes: &[u8; 8], high_first: bool) -> __m128i {
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

/// Decodes 32 codes (16 bytes, low nibble first, or high first)
/// through the table registers `t` into the 32·N bytes of `o`, around
/// the caches with `stream` where aligned.
#[inline]
#[target_feature(enable = "ssse3")]
fn segment<const N: usize>(
    v: __m128i,
    t: &[__m128i; 4],
    high_first: bool,
    o: &mut [u8],
    stream: bool,
) {
    let nibble = _mm_set1_epi8(0x0F);
    let (mut lo, mut hi) = (
        _mm_and_si128(v, nibble),
        _mm_and_si128(_mm_srli_epi16(v, 4), nibble),
    );
    if high_first {
        (lo, hi) = (hi, lo);
    }
    // One bounds check for the segment's bytes.
    let o = &mut o[..32 * N];
    let stream = stream && (o.as_ptr() as usize).is_multiple_of(16);
    for (h, idx) in [_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)]
        .into_iter()
        .enumerate()
    {
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

/// See `simd::planes`: each register of four entries sorted by byte,
/// then the 4 × 4 words transposed.
#[target_feature(enable = "ssse3")]
pub(in crate::backend::cpu::simd) fn planes(table: &[u32; 16]) -> [[u8; 16]; 4] {
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

/// See `simd::tables16`: four codes a register, encoded as
/// `numerics` does it (round to nearest even; NaN as the canonical
/// 0x7FC0 / 0x7E00 / 0x7FC0_0000).
#[target_feature(enable = "ssse3")]
pub(in crate::backend::cpu::simd) fn tables16(
    codes: &[f32; 16],
    entries: &[(f32, f32)],
    (post, out): (f32, OutDtype),
    each: &mut impl FnMut([u32; 16], [[u8; 16]; 4]),
) {
    let c: [__m128; 4] = std::array::from_fn(|q| {
        let c: &[f32; 4] = codes[4 * q..4 * q + 4]
            .try_into()
            .unwrap_or_else(|_| unreachable!("4 codes"));
        // SAFETY: reads exactly the 16 bytes of `c` (unaligned load).
        unsafe { _mm_loadu_ps(c.as_ptr()) }
    });
    let f = _mm_set1_ps(post);
    let by_byte = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for &(zero, scale) in entries {
        let (z, s) = (_mm_set1_ps(zero), _mm_set1_ps(scale));
        // SAFETY: the caller checked F16C where the output is f16.
        let r: [__m128i; 4] = std::array::from_fn(|q| unsafe {
            encode(_mm_mul_ps(_mm_mul_ps(_mm_sub_ps(c[q], z), s), f), out)
        });
        let mut values = [0u32; 16];
        for (q, v) in r.iter().enumerate() {
            let b = bytes(*v);
            for (t, w) in values[4 * q..4 * q + 4].iter_mut().zip(b.chunks_exact(4)) {
                *t = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            }
        }
        each(
            values,
            transpose_4x4_32(r.map(|v| _mm_shuffle_epi8(v, by_byte))).map(|v| bytes(v)),
        );
    }
}

/// See `simd::tables16`: one table a register, its byte planes one
/// byte permutation.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
pub(in crate::backend::cpu::simd) fn tables16_avx512(
    codes: &[f32; 16],
    entries: &[(f32, f32)],
    (post, out): (f32, OutDtype),
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
            OutDtype::Bf16 => {
                let b = _mm512_castps_si512(v);
                let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), one);
                (
                    _mm512_srli_epi32::<16>(_mm512_add_epi32(_mm512_add_epi32(b, round), odd)),
                    0x7FC0,
                )
            }
            OutDtype::F16 => {
                let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
                (_mm512_cvtepu16_epi32(h), 0x7E00)
            }
            OutDtype::F32 => (_mm512_castps_si512(v), 0x7FC0_0000),
        };
        let bits = _mm512_mask_blend_epi32(nan, bits, _mm512_set1_epi32(canonical));
        let mut values = [0u32; 16];
        let mut planes = [[0u8; 16]; 4];
        // SAFETY: each writes exactly the 64 bytes of its array
        // (unaligned stores).
        unsafe {
            _mm512_storeu_si512(values.as_mut_ptr().cast(), bits);
            _mm512_storeu_si512(
                planes.as_mut_ptr().cast(),
                _mm512_permutexvar_epi8(by_plane, bits),
            );
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
unsafe fn encode(v: __m128, out: OutDtype) -> __m128i {
    let nan = _mm_castps_si128(_mm_cmpunord_ps(v, v));
    let (bits, canonical) = match out {
        OutDtype::Bf16 => {
            let b = _mm_castps_si128(v);
            let odd = _mm_and_si128(_mm_srli_epi32(b, 16), _mm_set1_epi32(1));
            let up = _mm_add_epi32(_mm_add_epi32(b, _mm_set1_epi32(0x7FFF)), odd);
            (_mm_srli_epi32(up, 16), 0x7FC0)
        }
        // SAFETY: the caller has F16C (this function's contract).
        OutDtype::F16 => (unsafe { half_bits(v) }, 0x7E00),
        OutDtype::F32 => (_mm_castps_si128(v), 0x7FC0_0000),
    };
    _mm_or_si128(
        _mm_andnot_si128(nan, bits),
        _mm_and_si128(nan, _mm_set1_epi32(canonical)),
    )
}

/// f32 → IEEE half bits, round to nearest even, each in a 32-bit lane.
#[inline]
#[target_feature(enable = "sse2,f16c")]
fn half_bits(v: __m128) -> __m128i {
    let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
    _mm_unpacklo_epi16(h, _mm_setzero_si128())
}

/// See `simd::smoothed`: 16 codes a step.
///
/// # Safety
/// The CPU has F16C where `out` is f16.
#[target_feature(enable = "ssse3")]
pub(in crate::backend::cpu::simd) unsafe fn smoothed<const N: usize>(
    codes: &[u8],
    planes: &[[u8; 16]; 4],
    (factors, high_first): (&[f32], bool),
    dst: &mut [u8],
    out: OutDtype,
) -> usize {
    let t = tables(planes);
    // The low 16 bits of each 32-bit lane, packed into the low half.
    let low16 = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    let blocks = (codes.len() / 8)
        .min(factors.len() / 16)
        .min(dst.len() / (16 * N));
    let steps = codes
        .chunks_exact(8)
        .zip(factors.chunks_exact(16))
        .zip(dst.chunks_exact_mut(16 * N));
    for ((c, f), o) in steps.take(blocks) {
        let c: &[u8; 8] = c.try_into().unwrap_or_else(|_| unreachable!("8 bytes"));
        let products = lookup::<4>(&t, indices(c, high_first));
        let o = &mut o[..16 * N];
        for (q, p) in products.into_iter().enumerate() {
            let f: &[f32; 4] = f[4 * q..4 * q + 4]
                .try_into()
                .unwrap_or_else(|_| unreachable!("4 factors"));
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

/// See `simd::nibbles`.
#[target_feature(enable = "ssse3")]
pub(in crate::backend::cpu::simd) fn nibbles<const N: usize>(
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
            for (k, v) in lookup::<N>(&t, indices(c, high_first))
                .into_iter()
                .take(N)
                .enumerate()
            {
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
    for (c, o) in codes
        .chunks_exact(16)
        .zip(out.chunks_exact_mut(32 * N))
        .take(blocks)
    {
        // The lines 512 outputs on, fetched for writing: the hardware
        // fetches them too, but later.
        for l in (0..32 * N).step_by(64).filter(|_| !stream) {
            prefetch::<true>(o, 512 * N + l);
        }
        segment::<N>(load(slice16(c, 0)), &t, high_first, o, stream);
    }
    blocks * 32 + half(&codes[16 * blocks..], &mut out[32 * N * blocks..])
}

/// See `simd::nibbles`: a register of outputs at a time (32 codes to
/// bf16/f16, 16 to f32), each code's field picked out of its 64-bit lane
/// by one `vpmultishiftqb` and looked up in the table held in one
/// register (`vpermw`, `vpermd`).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
pub(in crate::backend::cpu::simd) fn nibbles_avx512<const N: usize>(
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
    let word = |c: &[u8]| _mm512_set1_epi64(i64::from_le_bytes(*slice8(c)));
    // Code bytes per register.
    let per = 32 / N;
    let regs = (codes.len() / per).min(out.len() / 64);
    for (c, o) in codes
        .chunks_exact(per)
        .zip(out.chunks_exact_mut(64))
        .take(regs)
    {
        let src = if N == 2 {
            _mm512_permutexvar_epi64(halves, _mm512_castsi128_si512(load(slice16(c, 0))))
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
        unsafe {
            _mm256_storeu_si256(
                o.as_mut_ptr().cast(),
                _mm512_castsi512_si256(lookup(word(rest))),
            )
        };
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

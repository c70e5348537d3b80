//! Rows of Q4_K and Q8_0 blocks times one row of x with AVX-512: the
//! values [`super::Rows`]' portable loop decodes and the sums it adds, bit
//! for bit, in fewer instructions.
//!
//! Every value is `f32(scale · q) + offset` (Q8_0: `d · q`) rounded to the
//! output dtype, multiplied by x and added into lane `i mod 64` of the
//! products' lanes ([`dot_lanes`](crate::numerics::dot_lanes)): four
//! registers, lanes `16l ..` in register `l`. A block whose f16 scales are
//! finite gives only finite values, which round without a NaN check (no
//! value is an f32 subnormal either: each is 0 or at least 2⁻²⁴, the
//! smallest f16 scale); another block's NaNs become the canonical one, as
//! the decoders write them.

use std::arch::x86_64::*;

use crate::numerics::{OutDtype, LANES};

/// Whether this CPU has what the kernels here are built for.
pub(super) fn available() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("f16c")
}

/// A Q4_K row (blocks of 144 bytes) times `x`, in the lanes. Each
/// sub-block's 16 values (its scale and offset applied to the codes 0 to
/// 15, rounded) are one register, which each nibble picks from
/// (`vpermps` reads an index's low 4 bits).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) fn q4_k_row(row: &[u8], x: &[f32], out: OutDtype) -> [f32; LANES] {
    let codes = _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    );
    let mut acc = [_mm512_setzero_ps(); LANES / 16];
    let (blocks, _) = row.as_chunks::<144>();
    let (xs, _) = x.as_chunks::<256>();
    for (b, x) in blocks.iter().zip(xs) {
        let (scales, offsets, finite) = q4_k_scales(b);
        for (c, x) in x.as_chunks::<64>().0.iter().enumerate() {
            // Sub-blocks 2c (the low nibbles of bytes 32c ..) and 2c + 1
            // (their high nibbles).
            let table = |j: usize| {
                let t = _mm512_mul_ps(_mm512_set1_ps(scales[j]), codes);
                round(_mm512_add_ps(t, _mm512_set1_ps(offsets[j])), out, finite)
            };
            let (low, high) = (table(2 * c), table(2 * c + 1));
            let qs = &b[16 + 32 * c..48 + 32 * c];
            let q = [load_u8(&qs[..16]), load_u8(&qs[16..])];
            let w = [
                _mm512_permutexvar_ps(q[0], low),
                _mm512_permutexvar_ps(q[1], low),
                _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(q[0]), high),
                _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(q[1]), high),
            ];
            for (l, (acc, w)) in acc.iter_mut().zip(w).enumerate() {
                *acc = _mm512_add_ps(*acc, _mm512_mul_ps(w, load(&x[16 * l..16 * l + 16])));
            }
        }
    }
    lanes(acc)
}

/// A Q8_0 row (blocks of 34 bytes) times `x`, in the lanes: block `i`'s
/// 32 values go into lanes `32 (i mod 2) ..`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) fn q8_0_row(row: &[u8], x: &[f32], out: OutDtype) -> [f32; LANES] {
    let mut acc = [_mm512_setzero_ps(); LANES / 16];
    let (blocks, _) = row.as_chunks::<34>();
    let (xs, _) = x.as_chunks::<32>();
    for (i, (b, x)) in blocks.iter().zip(xs).enumerate() {
        let (d, finite) = f16_pair([b[0], b[1], 0, 0]);
        let d = _mm512_set1_ps(d[0]);
        for h in 0..2 {
            let q = &b[2 + 16 * h..18 + 16 * h];
            // SAFETY: a load of exactly the slice's 16 bytes.
            let q = _mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(q.as_ptr().cast()) });
            let w = round(_mm512_mul_ps(d, _mm512_cvtepi32_ps(q)), out, finite);
            let l = 2 * (i % 2) + h;
            acc[l] = _mm512_add_ps(acc[l], _mm512_mul_ps(w, load(&x[16 * h..16 * h + 16])));
        }
    }
    lanes(acc)
}

/// A Q4_K block's eight scales `d · sc` and offsets `−(dmin · m)` (the
/// map's), and whether they are finite.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn q4_k_scales(b: &[u8; 144]) -> ([f32; 8], [f32; 8], bool) {
    // gguf-py's get_scale_min on three words at once: six bits of each
    // byte of the first two, then the third's nibbles with the first
    // two's top bits.
    let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let (a, m, c) = (word(4), word(8), word(12));
    let sc = [a & 0x3F3F_3F3F, (c & 0x0F0F_0F0F) | ((a >> 2) & 0x3030_3030)];
    let mn = [m & 0x3F3F_3F3F, ((c >> 4) & 0x0F0F_0F0F) | ((m >> 2) & 0x3030_3030)];
    let bytes = |w: [u32; 2]| {
        let v = _mm_cvtsi64_si128((w[0] as u64 | (w[1] as u64) << 32) as i64);
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
    };
    let (d, finite) = f16_pair([b[0], b[1], b[2], b[3]]);
    let (mut scales, mut offsets) = ([0f32; 8], [0f32; 8]);
    let s = _mm256_mul_ps(_mm256_set1_ps(d[0]), bytes(sc));
    let o = _mm256_mul_ps(_mm256_set1_ps(d[1]), bytes(mn));
    // SAFETY: stores of exactly the arrays' 8 values.
    unsafe {
        _mm256_storeu_ps(scales.as_mut_ptr(), s);
        _mm256_storeu_ps(offsets.as_mut_ptr(), _mm256_xor_ps(o, _mm256_set1_ps(-0.0)));
    }
    (scales, offsets, finite)
}

/// Two little-endian f16s widened (exactly, as `half` widens them), and
/// whether both are finite.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn f16_pair(b: [u8; 4]) -> ([f32; 2], bool) {
    let bits = u32::from_le_bytes(b);
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    let finite = bits & 0x7C00 != 0x7C00 && bits & 0x7C00_0000 != 0x7C00_0000;
    ([_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v))], finite)
}

/// `v` rounded to `out` and widened, as `OutDtype::round_all` rounds
/// (bf16: to nearest even on the bits; f16: `half`'s rounding, which is
/// this instruction's), its NaNs the canonical one unless `finite` says
/// there are none.
#[inline(always)]
fn round(v: __m512, out: OutDtype, finite: bool) -> __m512 {
    // SAFETY: every caller is built with avx512f and f16c.
    unsafe {
        let r = match out {
            OutDtype::F32 => v,
            OutDtype::Bf16 => {
                let b = _mm512_castps_si512(v);
                let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
                let r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), odd);
                _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(-0x1_0000)))
            }
            OutDtype::F16 => _mm512_cvtph_ps(_mm512_cvtps_ph::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(v)),
        };
        if finite {
            return r;
        }
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        _mm512_mask_mov_ps(r, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC0_0000)))
    }
}

/// 16 bytes widened to 16 indices.
#[inline(always)]
fn load_u8(b: &[u8]) -> __m512i {
    assert_eq!(b.len(), 16);
    // SAFETY: a load of exactly the slice's 16 bytes; avx512f as above.
    unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(b.as_ptr().cast())) }
}

/// 16 values of x.
#[inline(always)]
fn load(x: &[f32]) -> __m512 {
    assert_eq!(x.len(), 16);
    // SAFETY: a load of exactly the slice's 16 values; avx512f as above.
    unsafe { _mm512_loadu_ps(x.as_ptr()) }
}

/// The registers' lanes in order.
#[inline(always)]
fn lanes(acc: [__m512; LANES / 16]) -> [f32; LANES] {
    let mut lanes = [0f32; LANES];
    for (l, a) in lanes.chunks_exact_mut(16).zip(acc) {
        // SAFETY: a store of exactly the slice's 16 values.
        unsafe { _mm512_storeu_ps(l.as_mut_ptr(), a) };
    }
    lanes
}

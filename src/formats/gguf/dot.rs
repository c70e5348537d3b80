//! Products with rows of GGUF blocks that never write W (the CPU's
//! `matmul_cpu` for the common types, Q4_K and Q8_0): each block's scales
//! and offsets computed as the map computes them, its values as the decode
//! kernels compute them (`f32(scale · q) + offset`, rounded once to the
//! output dtype, widened), then multiplied by x and summed in the CPU
//! products' lanes ([`dot_lanes`]). So a result has the bits of the product
//! with the decoded rows. Rows are split among rayon's threads.

use rayon::prelude::*;

use super::{f16, k_scales, Block};
use crate::error::{Error, Result, Rule};
use crate::gguf::GgmlType;
use crate::numerics::{dot_lanes, lanes_sum, OutDtype, LANES};

/// Whether [`rows_times`] multiplies blocks of `ty`.
pub(crate) fn multiplies(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q8_0)
}

/// `t[j·m + r] = Σ_i W[j, i] · x[r, i]` for rows `bytes` of blocks of
/// type `ty` (whole rows of `cols` values, in output order) as decoded to
/// `out`, and the `m` rows of `x` (`[m, cols]`): `[rows, m]`.
pub(crate) fn rows_times(
    ty: GgmlType,
    bytes: &[u8],
    (cols, out): (usize, OutDtype),
    x: &[f32],
    m: usize,
) -> Result<Vec<f32>> {
    let (block, block_bytes) = (ty.block().0 as usize, ty.block().1 as usize);
    let internal = |d: &str| Error::bare(Rule::Internal, format!("gguf product: {d}"));
    if !multiplies(ty) || cols == 0 || !cols.is_multiple_of(block) {
        return Err(internal("a type or width it does not multiply"));
    }
    let row_bytes = cols / block * block_bytes;
    if !bytes.len().is_multiple_of(row_bytes) || x.len() != m * cols {
        return Err(internal("rows that are not whole rows of blocks"));
    }
    let rows = bytes.len() / row_bytes;
    let mut t = vec![0f32; rows * m];
    if m == 0 {
        return Ok(t);
    }
    // Runs of rows a task: several a thread, so that threads slowed by
    // others on a shared machine are waited for less.
    let per = (rows / (rayon::current_num_threads() * 8)).clamp(1, 256);
    let job = Rows {
        ty,
        cols,
        out,
        x,
        m,
    };
    t.par_chunks_mut(per * m)
        .zip(bytes.par_chunks(per * row_bytes))
        .for_each(|(t, bytes)| job.run(bytes, t));
    Ok(t)
}

/// What every run of rows of one product shares.
struct Rows<'a> {
    ty: GgmlType,
    cols: usize,
    out: OutDtype,
    x: &'a [f32],
    m: usize,
}

impl Rows<'_> {
    /// Rows `bytes` times x into `t` (`[rows, m]`), with the widest
    /// vectors this CPU has (all give the same bits: the same operations
    /// in the same order).
    fn run(&self, bytes: &[u8], t: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") {
                // SAFETY: the CPU has the features the function is built for.
                return unsafe { self.avx512(bytes, t) };
            }
            if has!("avx2") {
                // SAFETY: as above.
                return unsafe { self.avx2(bytes, t) };
            }
        }
        self.any(bytes, t)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn avx512(&self, bytes: &[u8], t: &mut [f32]) {
        match (self.ty, self.m, self.x.get(..self.cols)) {
            (GgmlType::Q4_K, 1, Some(x)) if self.cols.is_multiple_of(256) => {
                let row_bytes = self.cols / 256 * 144;
                for (row, t) in bytes.chunks_exact(row_bytes).zip(t) {
                    *t = lanes_sum(q4_k_row_avx512(row, x, self.out));
                }
            }
            _ => self.any(bytes, t),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn avx2(&self, bytes: &[u8], t: &mut [f32]) {
        self.any(bytes, t)
    }

    #[inline(always)]
    fn any(&self, bytes: &[u8], t: &mut [f32]) {
        match self.ty {
            GgmlType::Q4_K => self.rows::<256, Q4K>(bytes, t),
            _ => self.rows::<32, Q80>(bytes, t),
        }
    }

    /// Each row of `bytes` (blocks of `B` values decoded by `D`) times
    /// every row of x, into its `m` values of `t`. Everything it calls is
    /// inlined, so that it is built with the vectors of its caller.
    #[inline(always)]
    fn rows<const B: usize, D: Decode<B>>(&self, bytes: &[u8], t: &mut [f32]) {
        let (cols, m, out) = (self.cols, self.m, self.out);
        let row_bytes = cols / B * D::BYTES;
        // Spans of blocks are decoded and rounded, then multiplied: SPAN
        // values each, and what is left at a row's end.
        let span_bytes = SPAN / B * D::BYTES;
        let mut w = [0f32; SPAN];
        let mut many = vec![[0f32; LANES]; m];
        for (row, t) in bytes.chunks_exact(row_bytes).zip(t.chunks_exact_mut(m)) {
            let spans = row.chunks_exact(span_bytes);
            let (tail, at) = (spans.remainder(), cols / SPAN * SPAN);
            if let ([t], Some(x)) = (&mut *t, self.x.get(..cols)) {
                // One row of x: its sums stay in registers.
                let (xs, _) = x.as_chunks::<SPAN>();
                let mut acc = [0f32; LANES];
                for (span, x) in spans.zip(xs) {
                    decode::<B, D>(span, &mut w, out);
                    dot_span(&mut acc, &w, x);
                }
                if !tail.is_empty() {
                    let len = decode::<B, D>(tail, &mut w, out);
                    let mut a = acc;
                    dot_lanes(&mut a, &w[..len], &x[at..at + len]);
                    acc = a;
                }
                *t = lanes_sum(acc);
                continue;
            }
            many.iter_mut().for_each(|a| *a = [0.0; LANES]);
            for (i, span) in spans.chain([tail]).enumerate() {
                let len = decode::<B, D>(span, &mut w, out);
                for (a, x) in many.iter_mut().zip(self.x.chunks_exact(cols)) {
                    dot_lanes(a, &w[..len], &x[i * SPAN..i * SPAN + len]);
                }
            }
            for (t, a) in t.iter_mut().zip(&many) {
                *t = lanes_sum(*a);
            }
        }
    }
}

/// The values of `span`'s blocks, rounded to `out`, into `w`: how many.
#[inline(always)]
fn decode<const B: usize, D: Decode<B>>(span: &[u8], w: &mut [f32; SPAN], out: OutDtype) -> usize {
    let (blocks, _) = w.as_chunks_mut::<B>();
    for (b, w) in span.chunks_exact(D::BYTES).zip(blocks) {
        D::decode(b, w);
    }
    let len = span.len() / D::BYTES * B;
    match len == SPAN {
        true => out.round_all(w),
        false => out.round_all(&mut w[..len]),
    }
    len
}

/// [`dot_lanes`] of a whole span, its bounds known to the compiler.
#[inline(always)]
fn dot_span(acc: &mut [f32; LANES], w: &[f32; SPAN], x: &[f32; SPAN]) {
    for (w, x) in w.as_chunks::<LANES>().0.iter().zip(x.as_chunks::<LANES>().0) {
        for l in 0..LANES {
            acc[l] += w[l] * x[l];
        }
    }
}

/// Values a span of blocks holds, at most (Q4_K's block; eight Q8_0's).
const SPAN: usize = 256;

/// A block's values as the decoders compute them, before the output
/// rounding.
trait Decode<const B: usize> {
    /// Bytes a block.
    const BYTES: usize;
    fn decode(b: &[u8], w: &mut [f32; B]);
}

struct Q4K;
struct Q80;

impl Decode<256> for Q4K {
    const BYTES: usize = 144;

    /// A Q4_K block's 256 values: sub-block j's 32 are `d · sc[j]` times
    /// their nibbles plus `−(dmin · m[j])`; in each 64, 32 bytes' low
    /// nibbles, then their high ones.
    #[inline(always)]
    fn decode(b: &[u8], w: &mut [f32; 256]) {
        q4_k(b, w)
    }
}

impl Decode<32> for Q80 {
    const BYTES: usize = 34;

    /// A Q8_0 block's 32 values: `d` times each signed byte.
    #[inline(always)]
    fn decode(b: &[u8], w: &mut [f32; 32]) {
        let d = f16(b, 0);
        for (w, &q) in w.iter_mut().zip(&b[2..34]) {
            *w = d * q as i8 as f32;
        }
    }
}

/// A Q4_K row times one row of x `x`, in the lanes ([`dot_lanes`]), with
/// AVX-512: each sub-block's 16 values (its scale and offset applied to
/// the codes 0 to 15, rounded) are one register, which each nibble picks
/// from (`vpermps`), multiplied by x and added into the lane it is summed
/// in: the values and sums [`q4_k`] and [`dot_lanes`] give.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn q4_k_row_avx512(row: &[u8], x: &[f32], out: OutDtype) -> [f32; LANES] {
    use std::arch::x86_64::*;
    const CODES: [f32; 16] = [
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    ];
    // The lanes, 16 a register: values 64c + 16l go into register l.
    let mut acc = [_mm512_setzero_ps(); LANES / 16];
    for (b, x) in row.chunks_exact(144).zip(x.chunks_exact(256)) {
        let (scales, offsets) = q4_k_scales(b);
        for (c, (qs, x)) in b[16..144].chunks_exact(32).zip(x.chunks_exact(64)).enumerate() {
            for half in 0..2 {
                let j = 2 * c + half;
                // SAFETY: loads and stores of exactly the slices' bytes;
                // the CPU has the features this function is built for.
                unsafe {
                    let codes = _mm512_loadu_ps(CODES.as_ptr());
                    let table = _mm512_mul_ps(_mm512_set1_ps(scales[j]), codes);
                    let table = _mm512_add_ps(table, _mm512_set1_ps(offsets[j]));
                    let table = match out {
                        OutDtype::F32 => table,
                        OutDtype::Bf16 => bf16_avx512(table),
                        OutDtype::F16 => {
                            let mut t = [0f32; 16];
                            _mm512_storeu_ps(t.as_mut_ptr(), table);
                            out.round_all(&mut t);
                            _mm512_loadu_ps(t.as_ptr())
                        }
                    };
                    for g in 0..2 {
                        let bytes = &qs[16 * g..16 * g + 16];
                        let codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(bytes.as_ptr().cast()));
                        // vpermps reads an index's low 4 bits: the low nibble.
                        let codes = match half {
                            0 => codes,
                            _ => _mm512_srli_epi32::<4>(codes),
                        };
                        let w = _mm512_permutexvar_ps(codes, table);
                        let l = 2 * half + g;
                        let x = &x[16 * l..16 * l + 16];
                        acc[l] = _mm512_add_ps(acc[l], _mm512_mul_ps(w, _mm512_loadu_ps(x.as_ptr())));
                    }
                }
            }
        }
    }
    let mut lanes = [0f32; LANES];
    for (l, a) in lanes.chunks_exact_mut(16).zip(acc) {
        // SAFETY: a store of exactly the slice's 16 values.
        unsafe { _mm512_storeu_ps(l.as_mut_ptr(), a) };
    }
    lanes
}

/// `v` rounded to bf16 and widened: `numerics::f32_to_bf16`'s integer
/// rounding to nearest even, its NaN the canonical one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn bf16_avx512(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let b = _mm512_castps_si512(v);
    let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), odd);
    let r = _mm512_and_si512(r, _mm512_set1_epi32(0xFFFF_0000u32 as i32));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    _mm512_castsi512_ps(_mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0_0000)))
}

/// A Q4_K block's eight scales and offsets, as the map computes them.
#[inline(always)]
fn q4_k_scales(b: &[u8]) -> ([f32; 8], [f32; 8]) {
    let (mut scales, mut offsets) = ([0f32; 8], [0f32; 8]);
    let mut block = Block {
        codes: &mut [],
        scales: &mut scales,
        offsets: &mut offsets,
    };
    k_scales(b, &mut block);
    (scales, offsets)
}

#[inline(always)]
fn q4_k(b: &[u8], w: &mut [f32; 256]) {
    let (scales, offsets) = q4_k_scales(b);
    for (c, (qs, w)) in b[16..144].chunks_exact(32).zip(w.chunks_exact_mut(64)).enumerate() {
        let (low, high) = w.split_at_mut(32);
        let (s0, o0, s1, o1) = (scales[2 * c], offsets[2 * c], scales[2 * c + 1], offsets[2 * c + 1]);
        for ((q, l), h) in qs.iter().zip(low).zip(high) {
            *l = s0 * (q & 0x0F) as f32 + o0;
            *h = s1 * (q >> 4) as f32 + o1;
        }
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, Cpu};

    /// Random rows of `ty` whose f16 scales (`d`, and `dmin` where there
    /// is one) are finite, about 0.01 to 1.
    fn blocks(ty: GgmlType, rows: usize, cols: usize, rng: &mut fastrand::Rng) -> Vec<u8> {
        let (block, size) = (ty.block().0 as usize, ty.block().1 as usize);
        let mut v = vec![0u8; rows * cols / block * size];
        rng.fill(&mut v);
        let scales: &[usize] = if ty == GgmlType::Q4_K { &[0, 2] } else { &[0] };
        for b in v.chunks_exact_mut(size) {
            for &at in scales {
                let d = half::f16::from_f32(0.01 + rng.f32()).to_bits().to_le_bytes();
                b[at..at + 2].copy_from_slice(&d);
            }
        }
        v
    }

    /// The products in the blocks have the bits of the rows the CPU
    /// decodes (through the map, as `dequantize` writes them) multiplied
    /// in the same lanes: W is the written one, value for value.
    #[test]
    fn products_in_blocks_have_the_decoded_rows_bits() {
        let mut rng = fastrand::Rng::with_seed(0x65);
        let cpu = Cpu::new();
        for ty in [GgmlType::Q4_K, GgmlType::Q8_0] {
            let map = super::super::map_of(ty).unwrap();
            for (rows, cols, m) in [(7, 512, 1), (3, 768, 5), (40, 256, 2)] {
                let bytes = blocks(ty, rows, cols, &mut rng);
                let x: Vec<f32> = (0..m * cols).map(|_| rng.f32() * 4.0 - 2.0).collect();
                for out in [OutDtype::Bf16, OutDtype::F16, OutDtype::F32] {
                    let got = rows_times(ty, &bytes, (cols, out), &x, m).unwrap();
                    let dims = crate::job::Dims { slices: 1, rows, cols };
                    let job = map(&bytes, dims, out).unwrap();
                    let mut dense = vec![0u8; rows * cols * out.size()];
                    cpu.decode_rows(&job, 0..rows, &mut dense).unwrap();
                    let (size, read) = crate::numerics::float_reader(out.safetensors()).unwrap();
                    let w: Vec<f32> = dense.chunks_exact(size).map(read).collect();
                    for (j, wj) in w.chunks_exact(cols).enumerate() {
                        for (r, xr) in x.chunks_exact(cols).enumerate() {
                            let mut acc = [0f32; LANES];
                            dot_lanes(&mut acc, wj, xr);
                            let want = lanes_sum(acc);
                            assert_eq!(got[j * m + r].to_bits(), want.to_bits(), "{ty} {out} [{rows}, {cols}] m={m}: row {j}, x {r}");
                        }
                    }
                }
            }
        }
    }
}

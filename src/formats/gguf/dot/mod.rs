//! Products with rows of GGUF blocks that never write W (the CPU's
//! `matmul_cpu` for the common types, Q4_K and Q8_0): each block's scales
//! and offsets computed as the map computes them, its values as the decode
//! kernels compute them (`f32(scale · q) + offset`, rounded once to the
//! output dtype, widened), then multiplied by x and summed in the CPU
//! products' lanes ([`dot_lanes`]). So a result has the bits of the product
//! with the decoded rows. Rows are split among rayon's threads.

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
mod avx512;

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
            if self.m == 1 && avx512::available() {
                return self.avx512(bytes, t);
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has the features the function is built for.
                return unsafe { self.avx2(bytes, t) };
            }
        }
        self.any(bytes, t)
    }

    /// [`Rows::run`] for one row of x, a row of W at a time.
    #[cfg(target_arch = "x86_64")]
    fn avx512(&self, bytes: &[u8], t: &mut [f32]) {
        let (block, block_bytes) = (self.ty.block().0 as usize, self.ty.block().1 as usize);
        let x = &self.x[..self.cols];
        for (row, t) in bytes.chunks_exact(self.cols / block * block_bytes).zip(t) {
            // SAFETY: `avx512::available()` said the CPU has the features
            // the kernels are built for.
            *t = lanes_sum(unsafe {
                match self.ty {
                    GgmlType::Q4_K => avx512::q4_k_row(row, x, self.out),
                    _ => avx512::q8_0_row(row, x, self.out),
                }
            });
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
    /// is one) are about 0.01 to 1, but in one block of 17, an edge:
    /// subnormal, the largest, zero, infinite or NaN (0x7FFF's payload
    /// carries out of a rounding that does not look for NaNs).
    fn blocks(ty: GgmlType, rows: usize, cols: usize, rng: &mut fastrand::Rng) -> Vec<u8> {
        const EDGES: [u16; 7] = [0x0001, 0x03FF, 0x7BFF, 0x8000, 0x7C00, 0xFE01, 0x7FFF];
        let (block, size) = (ty.block().0 as usize, ty.block().1 as usize);
        let mut v = vec![0u8; rows * cols / block * size];
        rng.fill(&mut v);
        let scales: &[usize] = if ty == GgmlType::Q4_K { &[0, 2] } else { &[0] };
        for (i, b) in v.chunks_exact_mut(size).enumerate() {
            for &at in scales {
                let d = match i % 17 {
                    5 => EDGES[rng.usize(..EDGES.len())],
                    _ => half::f16::from_f32(0.01 + rng.f32()).to_bits(),
                };
                b[at..at + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
        v
    }

    /// The products in the blocks have the bits of the rows the CPU
    /// decodes (through the map, as `dequantize` writes them) multiplied
    /// in the same lanes: W is the written one, value for value. (A NaN
    /// is any NaN: which one a sum of two gives is the compiler's choice
    /// of operand order.)
    #[test]
    fn products_in_blocks_have_the_decoded_rows_bits() {
        let mut rng = fastrand::Rng::with_seed(0x65);
        let cpu = Cpu::new();
        let shapes: [&[(usize, usize, usize)]; 2] = [
            &[(7, 512, 1), (40, 256, 1), (3, 768, 5), (40, 256, 2)],
            &[(7, 512, 1), (9, 96, 1), (5, 32, 1), (3, 768, 5), (40, 256, 2)],
        ];
        for (ty, shapes) in [GgmlType::Q4_K, GgmlType::Q8_0].into_iter().zip(shapes) {
            let map = super::super::map_of(ty).unwrap();
            for &(rows, cols, m) in shapes {
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
                            let (got, want) = (got[j * m + r], lanes_sum(acc));
                            let same = got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan();
                            assert!(same, "{ty} {out} [{rows}, {cols}] m={m}: row {j}, x {r}: {got} for {want}");
                        }
                    }
                }
            }
        }
    }
}

//! Values computed straight from byte codes, for jobs whose tables would
//! cost as much as their values (GGUF's: a scale per 16 or 32 codes;
//! GPTQ's and AWQ's 8-bit codes with a zero point per 32): codes that
//! stand for consecutive integers are converted, their group's zero point
//! subtracted, multiplied by their group's scale, the offset added, and
//! rounded to the output, with exactly the operations of
//! `DecodeJob::value`. Plain loops over a few
//! registers' worth of values, which the compiler turns into vector
//! instructions (AVX2 where the CPU has it).

use crate::numerics::{self, OutDtype};

/// Codes that stand for consecutive integers: code `k` is `(k ^ xor) −
/// sub` (`k − c`, or with `xor` 0x80 and `sub` 128 a two's-complement
/// byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Linear {
    xor: u8,
    sub: i32,
}

impl Linear {
    /// The rule `values` follow, bit for bit, if they follow one.
    pub(super) fn of(values: &[f32]) -> Option<Linear> {
        if values.is_empty() || values.len() > 256 {
            return None;
        }
        let follows = |l: Linear| {
            values
                .iter()
                .enumerate()
                .all(|(k, v)| v.to_bits() == l.value(k as u8).to_bits())
        };
        let signed = Linear {
            xor: 0x80,
            sub: 128,
        };
        if values.len() == 256 && follows(signed) {
            return Some(signed);
        }
        let first = -values[0];
        let sub = first as i32;
        (sub as f32 == first && sub.unsigned_abs() < 1 << 16)
            .then_some(Linear { xor: 0, sub })
            .filter(|&l| follows(l))
    }

    /// Code `k`'s value.
    #[inline(always)]
    fn value(self, k: u8) -> f32 {
        ((k ^ self.xor) as i32 - self.sub) as f32
    }
}

/// The `cols` fields of `bits` (1, 2 or 4) packed whole into `src`, LSB
/// first (the highest first where `high_first`), a byte each into `out`.
pub(super) fn unpack(src: &[u8], bits: u32, high_first: bool, cols: usize, out: &mut Vec<u8>) {
    let per_byte = (8 / bits) as usize;
    let mask = (1u8 << bits) - 1;
    let len = cols.next_multiple_of(per_byte);
    if out.len() < len {
        out.resize(len, 0);
    }
    for (&b, o) in src.iter().zip(out.chunks_exact_mut(per_byte)) {
        for (k, o) in o.iter_mut().enumerate() {
            let slot = if high_first { per_byte - 1 - k } else { k };
            *o = b >> (slot as u32 * bits) & mask;
        }
    }
}

/// A row's groups: each a little-endian f32 per group.
#[derive(Debug, Clone, Copy)]
pub(super) struct Groups<'a> {
    /// Codes per group.
    pub len: usize,
    pub scales: &'a [u8],
    /// Subtracted from the code's value before the scale multiplies it.
    pub zeros: Option<&'a [u8]>,
    /// Added to the scaled value.
    pub offsets: Option<&'a [u8]>,
}

/// Decodes a row of byte codes into `out` (`N` bytes a value): with AVX2
/// where `wide`.
pub(super) fn row<const N: usize>(
    wide: bool,
    codes: (&[u8], Linear),
    groups: Groups<'_>,
    dtype: OutDtype,
    out: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: `wide` is the CPU's AVX2 (simd::Isa::wide).
        return unsafe { row_avx2::<N>(codes, groups, dtype, out) };
    }
    let _ = wide;
    row_any::<N>(codes, groups, dtype, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn row_avx2<const N: usize>(
    codes: (&[u8], Linear),
    groups: Groups<'_>,
    dtype: OutDtype,
    out: &mut [u8],
) {
    row_any::<N>(codes, groups, dtype, out)
}

/// Values a pass computes at once.
const LANES: usize = 16;

#[inline(always)]
fn row_any<const N: usize>(
    codes: (&[u8], Linear),
    groups: Groups<'_>,
    dtype: OutDtype,
    out: &mut [u8],
) {
    // The output dtype matched once a row, the loops below made for each.
    match dtype {
        OutDtype::Bf16 => row_as::<N, u16>(codes, groups, out, numerics::f32_to_bf16),
        OutDtype::F16 => row_as::<N, u16>(codes, groups, out, numerics::f32_to_f16),
        OutDtype::F32 => row_as::<N, u32>(codes, groups, out, numerics::f32_bits),
    }
}

/// [`row_any`] with `round` giving each value's encoding (`N` bytes).
#[inline(always)]
fn row_as<const N: usize, T: bytemuck::Pod>(
    (codes, lin): (&[u8], Linear),
    groups: Groups<'_>,
    out: &mut [u8],
    round: impl Fn(f32) -> T,
) {
    let f32_at = |b: &[u8], g: usize| {
        f32::from_le_bytes([b[4 * g], b[4 * g + 1], b[4 * g + 2], b[4 * g + 3]])
    };
    // A pass's `LANES · N` bytes: a copy of a size the compiler knows.
    // Plain loops: iterator adapters are functions of their own, which
    // the caller's AVX2 would not reach.
    let encode = |v: &[f32; LANES], out: &mut [u8]| {
        let mut e = [T::zeroed(); LANES];
        for (e, &x) in e.iter_mut().zip(v) {
            *e = round(x);
        }
        out.copy_from_slice(bytemuck::bytes_of(&e));
    };
    let Groups {
        len: group,
        scales,
        zeros,
        offsets,
    } = groups;
    let entry = |g: usize| {
        (
            zeros.map(|z| f32_at(z, g)),
            f32_at(scales, g),
            offsets.map(|b| f32_at(b, g)),
        )
    };
    // Groups of whole passes (GGUF's 16 and 32).
    if group.is_multiple_of(LANES) && codes.len().is_multiple_of(LANES) {
        let (whole, _) = codes.as_chunks::<LANES>();
        let groups = whole
            .chunks(group / LANES)
            .zip(out.chunks_mut(group * N))
            .enumerate();
        for (g, (passes, out)) in groups {
            let (z, s, b) = entry(g);
            for (c, o) in passes.iter().zip(out.chunks_exact_mut(LANES * N)) {
                encode(&values(lin, c, z, s, b), o);
            }
        }
        return;
    }
    // Else a group at a time, its last few values in a pass of their own.
    for (g, (c, o)) in codes
        .chunks(group)
        .zip(out.chunks_mut(group * N))
        .enumerate()
    {
        let (z, s, b) = entry(g);
        for (c, o) in c.chunks(LANES).zip(o.chunks_mut(LANES * N)) {
            let mut pass = [0u8; LANES];
            pass[..c.len()].copy_from_slice(c);
            let mut whole = [0u8; LANES * 4];
            encode(&values(lin, &pass, z, s, b), &mut whole[..LANES * N]);
            o.copy_from_slice(&whole[..o.len()]);
        }
    }
}

/// The values of a pass: `f32((value − z) · s)` (`value · s` without a
/// zero point), plus `b` where there is one: `DecodeJob::value`'s
/// operations in its order. Loops of a fixed length, which the compiler
/// turns into vectors.
#[inline(always)]
fn values(lin: Linear, c: &[u8; LANES], z: Option<f32>, s: f32, b: Option<f32>) -> [f32; LANES] {
    let mut v = [0f32; LANES];
    match z {
        Some(z) => {
            for (x, &k) in v.iter_mut().zip(c) {
                *x = (lin.value(k) - z) * s;
            }
        }
        None => {
            for (x, &k) in v.iter_mut().zip(c) {
                *x = lin.value(k) * s;
            }
        }
    }
    if let Some(b) = b {
        for x in v.iter_mut() {
            *x += b;
        }
    }
    v
}

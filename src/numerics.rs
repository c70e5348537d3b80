//! Number formats: the small float codes the packs store, and the one rounding
//! step from f32 to the output dtype.
//!
//! Every conversion here is integer bit manipulation, so the GPU shaders can do
//! exactly the same thing and produce the same bytes.

use crate::error::{Error, Result, Rule};

/// E2M1 (FP4) magnitudes for codes 0..8; bit 3 is the sign.
const E2M1_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The value of a 4-bit E2M1 code. Code 0b1000 is −0.
pub fn e2m1(code: u8) -> f32 {
    let m = E2M1_MAGNITUDES[(code & 7) as usize];
    if code & 8 != 0 {
        -m
    } else {
        m
    }
}

/// The value of an FP8 E4M3 (fn) byte: bias 7, no infinities, 0x7F/0xFF are NaN.
pub fn e4m3(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = (byte >> 3) & 0xF;
    let man = (byte & 7) as f32;
    if exp == 0xF && byte & 7 == 7 {
        return f32::NAN;
    }
    if exp == 0 {
        // Subnormal: m/8 · 2^-6, exact in f32.
        sign * man * (1.0 / 512.0)
    } else {
        sign * (1.0 + man / 8.0) * f32::from_bits(((exp as u32) + 127 - 7) << 23)
    }
}

/// The value of an E8M0 scale byte: 2^(e−127); 0xFF is NaN.
pub fn e8m0(byte: u8) -> f32 {
    match byte {
        0xFF => f32::NAN,
        // 2^-127 is an f32 subnormal.
        0 => f32::from_bits(1 << 22),
        e => f32::from_bits((e as u32) << 23),
    }
}

/// The dtype of a dense output tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutDtype {
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
    /// IEEE single.
    F32,
}

impl OutDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            OutDtype::Bf16 | OutDtype::F16 => 2,
            OutDtype::F32 => 4,
        }
    }

    /// The safetensors dtype written for it.
    pub fn safetensors(self) -> safetensors::Dtype {
        match self {
            OutDtype::Bf16 => safetensors::Dtype::BF16,
            OutDtype::F16 => safetensors::Dtype::F16,
            OutDtype::F32 => safetensors::Dtype::F32,
        }
    }

    /// The name `config.json` uses for it (`torch_dtype`).
    pub fn torch_name(self) -> &'static str {
        match self {
            OutDtype::Bf16 => "bfloat16",
            OutDtype::F16 => "float16",
            OutDtype::F32 => "float32",
        }
    }

    /// Parses a torch or short dtype name (`bfloat16`, `torch.float16`, `f32`, …).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.trim_start_matches("torch.") {
            "bfloat16" | "bf16" => Some(OutDtype::Bf16),
            "float16" | "half" | "f16" | "fp16" => Some(OutDtype::F16),
            "float32" | "float" | "f32" | "fp32" => Some(OutDtype::F32),
            _ => None,
        }
    }

    /// `x` rounded to this dtype, as an f32 again (exact: every bf16 and f16
    /// value is one); f32 leaves it alone. Integer bit operations, as the
    /// shaders' `to_bf16` / `to_f16`.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            OutDtype::Bf16 => bf16_to_f32(f32_to_bf16(x)),
            OutDtype::F16 => f16_to_f32(f32_to_f16(x)),
            OutDtype::F32 => x,
        }
    }

    /// [`OutDtype::round`] of each of `v`, the dtype matched once (so the
    /// loop vectorizes; always inlined, so that a kernel built for wider
    /// vectors rounds with them).
    #[inline(always)]
    pub fn round_all(self, v: &mut [f32]) {
        match self {
            // A bf16 widens by a shift (its NaN is canonical already).
            OutDtype::Bf16 => v
                .iter_mut()
                .for_each(|x| *x = f32::from_bits(u32::from(f32_to_bf16(*x)) << 16)),
            OutDtype::F16 => v.iter_mut().for_each(|x| *x = f16_to_f32(f32_to_f16(*x))),
            OutDtype::F32 => {}
        }
    }

    /// Rounds `x` once to this dtype and writes its little-endian bytes
    /// (a value from f64 arithmetic, such as a rotation folded in).
    pub fn encode_f64(self, x: f64, out: &mut [u8]) {
        match self {
            OutDtype::F32 => self.encode(x as f32, out),
            // Rounded to odd at f32's precision, then to nearest: one
            // correct rounding (f32 keeps more than two bits beyond either).
            _ => self.encode(f64_to_f32_odd(x), out),
        }
    }

    /// Rounds `x` once to this dtype and appends its little-endian bytes.
    #[inline]
    pub fn encode(self, x: f32, out: &mut [u8]) {
        match self {
            OutDtype::Bf16 => out.copy_from_slice(&f32_to_bf16(x).to_le_bytes()),
            OutDtype::F16 => out.copy_from_slice(&f32_to_f16(x).to_le_bytes()),
            OutDtype::F32 => out.copy_from_slice(&f32_bits(x).to_le_bytes()),
        }
    }
}

/// The output dtype the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DtypeChoice {
    /// The checkpoint's own dtype (`torch_dtype`/`dtype`), else its scales' dtype.
    #[default]
    Auto,
    /// This dtype.
    Fixed(OutDtype),
}

impl std::str::FromStr for DtypeChoice {
    type Err = Error;
    /// `auto`, or an output dtype's name (`bf16`, `f16`, `f32`, or torch's
    /// and the usual others: `bfloat16`, `float16`, `fp16`, `half`,
    /// `float32`, `fp32`), in any case.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DtypeChoice::Auto),
            name => OutDtype::from_name(name)
                .map(DtypeChoice::Fixed)
                .ok_or_else(|| {
                    Error::bare(
                        Rule::Argument,
                        format!("{s:?} is not one of auto, bf16, f16, f32 (or bfloat16, float16, fp16, half, float32, fp32)"),
                    )
                }),
        }
    }
}

/// `x` rounded to f32 toward zero, with the last bit set when that was
/// inexact ("round to odd"): rounding the result again to nearest at a
/// precision at least two bits narrower is the correct rounding of `x`.
pub fn f64_to_f32_odd(x: f64) -> f32 {
    let f = x as f32;
    if f as f64 == x || x.is_nan() {
        return f;
    }
    let mut bits = f.to_bits();
    // Rounded away from zero (overflow to infinity included): one step back.
    if (f as f64).abs() > x.abs() {
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

impl std::fmt::Display for OutDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OutDtype::Bf16 => "bf16",
            OutDtype::F16 => "f16",
            OutDtype::F32 => "f32",
        })
    }
}

/// f32 bits as written; every NaN becomes the canonical quiet NaN 0x7FC0_0000,
/// since the sign and payload of a NaN product differ between CPUs and GPUs.
#[inline]
pub(crate) fn f32_bits(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        0x7FC0_0000
    } else {
        b
    }
}

/// f32 → bfloat16 bits, round to nearest even; NaN becomes the canonical 0x7FC0
/// (as PyTorch does).
#[inline]
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    // Round to nearest even on the bits, as the shaders do
    // (shaders/decode/numbers.wgsl's bf16_carry); without a branch, so
    // loops of it vectorize.
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        0x7FC0
    } else {
        rounded
    }
}

/// bfloat16 bits → f32 (exact).
#[inline]
pub(crate) fn bf16_to_f32(h: u16) -> f32 {
    half::bf16::from_bits(h).to_f32()
}

/// f32 → IEEE half bits, round to nearest even, overflow to ±inf; NaN becomes
/// the canonical 0x7E00 (the sign of a NaN product is not portable).
#[inline]
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7E00;
    }
    half::f16::from_f32(x).to_bits()
}

/// IEEE half bits → f32 (exact).
#[inline]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

/// Whether stored tensors of `dtype` are floating point values that
/// [`cast`] converts (fp8 is a quantized storage, not a model dtype).
pub(crate) fn is_castable(dtype: safetensors::Dtype) -> bool {
    use safetensors::Dtype::*;
    matches!(dtype, BF16 | F16 | F32 | F64)
}

/// Reads one little-endian element, widening it exactly to f32.
pub(crate) type ReadFloat = fn(&[u8]) -> f32;

/// How to read one little-endian element of a 16- or 32-bit float dtype
/// (its size, and the exact widening to f32); `None` for other dtypes.
pub(crate) fn float_reader(dtype: safetensors::Dtype) -> Option<(usize, ReadFloat)> {
    use safetensors::Dtype;
    match dtype {
        Dtype::BF16 => Some((2, |b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))),
        Dtype::F16 => Some((2, |b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))),
        Dtype::F32 => Some((4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        _ => None,
    }
}

/// Converts little-endian `from` values in `src` to `to` in `out`, each
/// rounded once to nearest even, NaN canonical as in every decoded output.
/// `out` holds exactly as many elements as `src`; `from` is
/// [`is_castable`].
pub(crate) fn cast(from: safetensors::Dtype, src: &[u8], to: OutDtype, out: &mut [u8]) {
    let outs = out.chunks_exact_mut(to.size());
    if let Some((size, read)) = float_reader(from) {
        src.chunks_exact(size)
            .zip(outs)
            .for_each(|(c, o)| to.encode(read(c), o));
        return;
    }
    if from != safetensors::Dtype::F64 {
        return;
    }
    // Straight from f64: going through f32 would round twice.
    for (c, o) in src.chunks_exact(8).zip(outs) {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        let x = f64::from_le_bytes(b);
        if x.is_nan() {
            to.encode(f32::NAN, o);
            continue;
        }
        match to {
            OutDtype::Bf16 => o.copy_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
            OutDtype::F16 => o.copy_from_slice(&half::f16::from_f64(x).to_le_bytes()),
            OutDtype::F32 => o.copy_from_slice(&(x as f32).to_le_bytes()),
        }
    }
}

/// Lanes the CPU's products sum in: element `i` of a row of W times x is
/// added into lane `i % LANES`, each lane in order, and the lanes are then
/// summed in halves ([`lanes_sum`]). A fixed order, the same on every CPU
/// and with every kernel (each product rounded, then added: no fused
/// multiply-add), and one that vectorizes: 64 lanes are four chains of
/// sums of 16 (AVX-512), so that one add need not wait for the last.
pub(crate) const LANES: usize = 64;

/// `acc[i % LANES] += w[i] · x[i]` for each `i` in order; `w` and `x` are
/// as long, and start at a multiple of [`LANES`] of their row.
#[inline(always)]
pub(crate) fn dot_lanes(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    let (ws, w_rest) = w.as_chunks::<LANES>();
    let (xs, x_rest) = x.as_chunks::<LANES>();
    for (w, x) in ws.iter().zip(xs) {
        for l in 0..LANES {
            acc[l] += w[l] * x[l];
        }
    }
    for ((a, w), x) in acc.iter_mut().zip(w_rest).zip(x_rest) {
        *a += w * x;
    }
}

/// The sum of `acc`'s lanes: its halves added lane by lane until one is
/// left.
#[inline(always)]
pub(crate) fn lanes_sum(mut acc: [f32; LANES]) -> f32 {
    let mut half = LANES;
    while half > 1 {
        half /= 2;
        for l in 0..half {
            acc[l] += acc[l + half];
        }
    }
    acc[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f64 values rounded once to bf16 and f16 are the nearest of each
    /// dtype (ties to even), checked against both neighbours, on values
    /// just around the midpoints where rounding through f32 to nearest
    /// would round twice.
    #[test]
    fn f64_rounds_once_to_16_bits() {
        let mut rng = fastrand::Rng::with_seed(0xF64);
        for dtype in [OutDtype::Bf16, OutDtype::F16] {
            let (size, read) = float_reader(dtype.safetensors()).unwrap_or_else(|| unreachable!());
            assert_eq!(size, 2);
            let value = |bits: u16| read(&bits.to_le_bytes()) as f64;
            for _ in 0..20_000 {
                // A finite 16-bit value, a midpoint to the next, nudged by a
                // few f64 ulps (below f32's precision) or not at all.
                let b = rng.u16(..) & 0x7fff;
                let (lo, hi) = (value(b), value(b + 1));
                if !hi.is_finite() || !lo.is_finite() || lo == 0.0 {
                    continue;
                }
                let mid = (lo + hi) / 2.0;
                let x = match rng.u8(..3) {
                    0 => mid,
                    1 => f64::from_bits(mid.to_bits() + rng.u64(1..1 << 20)),
                    _ => f64::from_bits(mid.to_bits() - rng.u64(1..1 << 20)),
                };
                let x = if rng.bool() { -x } else { x };
                let mut out = [0u8; 2];
                dtype.encode_f64(x, &mut out);
                let got = u16::from_le_bytes(out);
                let want = match x.abs().partial_cmp(&mid) {
                    Some(std::cmp::Ordering::Less) => b,
                    Some(std::cmp::Ordering::Greater) => b + 1,
                    _ if b.is_multiple_of(2) => b,
                    _ => b + 1,
                } | if x < 0.0 { 0x8000 } else { 0 };
                assert_eq!(got, want, "{dtype} of {x:e}: {got:#06x}, want {want:#06x}");
            }
        }
    }

    #[test]
    fn e2m1_all_codes() {
        let want: [f32; 16] = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
        ];
        for (code, w) in want.iter().enumerate() {
            assert_eq!(e2m1(code as u8).to_bits(), w.to_bits(), "code {code:#06b}");
        }
    }

    /// Reference E4M3 decoding written differently: from the format's definition
    /// with powi, checked on all 256 bytes.
    #[test]
    fn e4m3_all_bytes() {
        for b in 0..=255u8 {
            let s = if b >> 7 == 1 { -1.0f64 } else { 1.0 };
            let e = ((b >> 3) & 15) as i32;
            let m = (b & 7) as f64;
            let got = e4m3(b);
            if e == 15 && m == 7.0 {
                assert!(got.is_nan(), "{b:#04x}");
                continue;
            }
            let want = if e == 0 {
                s * m / 8.0 * 2f64.powi(-6)
            } else {
                s * (1.0 + m / 8.0) * 2f64.powi(e - 7)
            };
            assert_eq!(got.to_bits(), (want as f32).to_bits(), "{b:#04x}");
        }
        assert_eq!(e4m3(0x7E), 448.0);
        assert_eq!(e4m3(0x01), 2f32.powi(-9));
        assert_eq!(e4m3(0x80).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn e8m0_all_bytes() {
        for b in 0..=254u8 {
            let want = 2f64.powi(b as i32 - 127) as f32;
            assert_eq!(e8m0(b).to_bits(), want.to_bits(), "{b}");
        }
        assert!(e8m0(255).is_nan());
    }

    /// Round to nearest even at the ties and carries both widths have, and
    /// one canonical NaN whatever the sign and payload.
    #[test]
    fn rounding_ties_go_to_even_and_nan_is_canonical() {
        // bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even (1) wins.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7F80, "rounds up to inf");
        // f16: 65520 is the tie between 65504 and 65536 (inf).
        assert_eq!(f32_to_f16(65520.0), 0x7C00);
        assert_eq!(f32_to_f16(65519.99), 0x7BFF);
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0, "the tie at 2^-25 goes to 0");
        assert_eq!(f32_to_f16(f32::from_bits(0x3300_0001)), 1);
        for nan in [0x7FC0_0000u32, 0xFFC0_0001, 0x7F80_0001, 0xFFFF_FFFF] {
            let x = f32::from_bits(nan);
            assert_eq!(f32_to_bf16(x), 0x7FC0);
            assert_eq!(f32_to_f16(x), 0x7E00);
            assert_eq!(f32_bits(x), 0x7FC0_0000);
        }
    }

    /// Every 16-bit value widens exactly: back to 16 bits is the identity.
    /// The branch-free bf16 rounding is `half`'s, on a sweep of every
    /// exponent with the mantissa patterns that decide rounding.
    #[test]
    fn bf16_rounding_is_halfs() {
        for hi in 0..=u16::MAX {
            for lo in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
                let x = f32::from_bits((hi as u32) << 16 | lo);
                let want = if x.is_nan() {
                    0x7FC0
                } else {
                    half::bf16::from_f32(x).to_bits()
                };
                assert_eq!(f32_to_bf16(x), want, "{:#010x}", x.to_bits());
            }
        }
    }

    #[test]
    fn sixteen_bit_values_round_trip_through_f32() {
        for h in 0..=u16::MAX {
            let (b, f) = (bf16_to_f32(h), f16_to_f32(h));
            if !b.is_nan() {
                assert_eq!(f32_to_bf16(b), h, "bf16 {h:#06x}");
            }
            if !f.is_nan() {
                assert_eq!(f32_to_f16(f), h, "f16 {h:#06x}");
            }
        }
    }
}

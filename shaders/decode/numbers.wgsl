// The numbers' encodings, bit for bit as src/numerics.rs computes them:
// f16 bits widened to f32, and f32 rounded to the output dtypes (to
// nearest, ties to even, with integer operations). Uses no binding, so
// every module that writes outputs puts it in: the decode module and the
// codebook kernel's (src/backend/gpu/shader.rs).

// IEEE half bits -> f32, exact (job::f16_to_f32). Without branches, which
// llvmpipe would run all of for every lane: a subnormal m · 2^-24 is exact
// in f32, and infinities and NaNs keep their payload.
fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    let normal = ((e + 112u) << 23u) | (m << 13u);
    let special = select(normal, 0x7f800000u | (m << 13u), e == 0x1fu);
    let sub = bitcast<u32>(f32(m) * 5.9604644775390625e-8);
    return bitcast<f32>(sign | select(special, sub, e == 0u));
}

// numerics::f32_bits: NaN payloads and signs are not portable, so one NaN.
fn to_f32(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fc00000u;
    }
    return b;
}

// numerics::f32_to_bf16.
fn to_bf16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fc0u;
    }
    return bf16_carry(b) >> 16u;
}

// The f32 bits `b` (not NaN's) rounded to bf16's, to nearest, ties to even,
// in place: the carry into bf16's last bit, the bits below it dropped.
fn bf16_carry(b: u32) -> u32 {
    return (b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u;
}

// numerics::f32_to_f16.
fn to_f16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return 0x7e00u;
    }
    if (a >= 0x47800000u) {
        return sign | 0x7c00u;
    }
    if (a < 0x38800000u) {
        if (a <= 0x33000000u) {
            return sign;
        }
        let e = a >> 23u;
        let m = (a & 0x7fffffu) | 0x800000u;
        let shift = 126u - e;
        var q = m >> shift;
        let rem = m & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u) == 1u)) {
            q = q + 1u;
        }
        return sign | q;
    }
    var v = (((a >> 23u) - 112u) << 10u) | ((a & 0x7fffffu) >> 13u);
    let rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (v & 1u) == 1u)) {
        v = v + 1u;
    }
    return sign | v;
}

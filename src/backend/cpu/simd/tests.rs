//! The vector kernels against the scalar loops they equal, byte for byte.

use super::*;

#[test]
fn awq_gather_equals_the_field_order() {
    // 9 word columns (two SSE2 groups and a scalar rest) of 48 inputs (a
    // block of 32 and one of 8, twice), and whole groups only.
    for (columns, inputs) in [(9, 48), (16, 64), (32, 96)] {
        let mut rng = fastrand::Rng::with_seed(3);
        let src: Vec<u8> = (0..columns * 4 * inputs).map(|_| rng.u8(..)).collect();
        let row = inputs / 2;
        let mut dst = vec![0u8; 8 * columns * row];
        gather_awq(
            Isa::detect(),
            &src,
            (0, columns * 4),
            (columns, inputs),
            &mut dst,
            row,
        );
        for o in 0..8 * columns {
            for i in 0..inputs {
                let a = i * columns * 4 + o / 8 * 4;
                let word = u32::from_le_bytes([src[a], src[a + 1], src[a + 2], src[a + 3]]);
                let want = (word >> (4 * crate::job::AWQ_SLOT[o % 8])) & 15;
                let got = (dst[o * row + i / 2] >> (4 * (i % 2))) & 15;
                assert_eq!(
                    got as u32, want,
                    "output {o}, input {i} of {columns} x {inputs}"
                );
            }
        }
    }
}

#[test]
fn vector_tables_equal_the_scalar_encoding() {
    use crate::numerics;
    // Ties, subnormals, overflow to infinity, signed zeros and NaNs.
    let special = [
        0.0,
        -0.0,
        1.0 + f32::EPSILON,
        f32::from_bits(0x3F80_8000),
        f32::from_bits(0x3F81_8000),
        65520.0,
        65519.99,
        6.0e-8,
        1.0e-40,
        f32::INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MAX,
        -7.0,
        8.0,
        -1.5,
    ];
    let mut rng = fastrand::Rng::with_seed(11);
    let mut codes: Vec<[f32; 16]> = vec![special];
    codes.extend((0..8).map(|_| std::array::from_fn(|_| f32::from_bits(rng.u32(..)))));
    let entries: Vec<(f32, f32)> = [
        (0.0, 1.0),
        (-0.0, -1.0),
        (8.0, 0.5),
        (f32::NAN, 1.0),
        (1.0, f32::INFINITY),
    ]
    .into_iter()
    .chain((0..40).map(|_| (f32::from_bits(rng.u32(..)), f32::from_bits(rng.u32(..)))))
    .collect();
    // The AVX-512 kernel where the CPU has it, then the SSSE3 one.
    let outs = [OutDtype::Bf16, OutDtype::F16, OutDtype::F32];
    for (kernels, out) in [Kernels::Widest, Kernels::Narrow]
        .into_iter()
        .flat_map(|k| outs.map(|o| (k, o)))
    {
        let isa = Isa::of(kernels);
        for c in &codes {
            for post in [1.0, 1.0 / 127.0] {
                let mut got = Vec::new();
                if !tables16(isa, c, &entries, (post, out), &mut |v, p| got.push((v, p))) {
                    continue;
                }
                assert_eq!(got.len(), entries.len());
                for (&(z, s), (values, p)) in entries.iter().zip(&got) {
                    let want: [u32; 16] = std::array::from_fn(|k| {
                        let v = (c[k] - z) * s * post;
                        match out {
                            OutDtype::Bf16 => numerics::f32_to_bf16(v) as u32,
                            OutDtype::F16 => numerics::f32_to_f16(v) as u32,
                            OutDtype::F32 => numerics::f32_bits(v),
                        }
                    });
                    assert_eq!(
                        values, &want,
                        "{out} codes {c:?} entry ({z}, {s}) post {post}"
                    );
                    assert_eq!(p, &planes(Isa::SCALAR, &want), "{out} planes");
                }
            }
        }
    }
}

fn shifted_equals_the_lookup<const N: usize>() {
    let mut rng = fastrand::Rng::with_seed(17);
    let mag = if N == 2 { 0x7FFF } else { 0x7FFF_FFFF };
    let wrap = if N == 2 { 0xFFFF } else { u32::MAX };
    for (lane, row_bytes) in [(16, 128 * N), (64, 128 * N + 64), (2048, 4096 * N)] {
        let src: Vec<u8> = (0..127 * lane + 16 + 5).map(|_| rng.u8(..)).collect();
        // Zeros of both signs among the values, and shifts that wrap.
        let mut base: [u32; 16] = std::array::from_fn(|_| rng.u32(..) & wrap);
        base[0] = 0;
        base[8] = if N == 2 { 0x8000 } else { 0x8000_0000 };
        let shifts: [u32; 128] = std::array::from_fn(|_| rng.u32(..) & wrap);
        let first = 5;
        // The kernel this CPU runs, and the AVX2 one where it has that
        // too (an AVX-512 CPU runs the other).
        let mut outs = vec![vec![0u8; 31 * row_bytes + 128 * N]];
        if !shifted_block::<N>(
            Isa::detect(),
            &src,
            (first, lane),
            (&base, &shifts),
            &mut outs[0],
            row_bytes,
        ) {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut out = vec![0u8; 31 * row_bytes + 128 * N];
            // SAFETY: the CPU has AVX2 (checked just above).
            unsafe {
                x86::shifted_block_avx2::<N>(
                    &src,
                    (first, lane),
                    (&base, &shifts),
                    &mut out,
                    row_bytes,
                )
            };
            outs.push(out);
        }
        for (out, r) in outs.iter().flat_map(|o| (0..32).map(move |r| (o, r))) {
            for o in 0..128 {
                let code = (src[first + o * lane + r / 2] >> (4 * (r % 2))) & 15;
                let v = base[code as usize];
                let want = if v & mag == 0 {
                    v
                } else {
                    v.wrapping_add(shifts[o]) & wrap
                };
                let at = r * row_bytes + o * N;
                assert_eq!(
                    &out[at..at + N],
                    &want.to_le_bytes()[..N],
                    "row {r} column {o} lane {lane}"
                );
            }
        }
    }
}

#[test]
fn shifted_blocks_equal_the_lookup() {
    shifted_equals_the_lookup::<2>();
    shifted_equals_the_lookup::<4>();
}

/// Each nibble kernel this CPU has, by name: the dispatcher's choice,
/// and each of the AVX-512 and SSSE3 ones on its own.
#[allow(clippy::type_complexity)]
fn nibble_kernels<const N: usize>() -> Vec<(
    &'static str,
    fn(&[u8], (&[u32; 16], &[[u8; 16]; 4]), &mut [u8], bool, bool) -> usize,
)> {
    let mut kernels: Vec<(
        &'static str,
        fn(&[u8], (&[u32; 16], &[[u8; 16]; 4]), &mut [u8], bool, bool) -> usize,
    )> = vec![("dispatched", |c, t, o, hf, st| {
        nibbles::<N>(Isa::detect(), c, t, o, hf, st)
    })];
    let isa = Isa::detect();
    #[cfg(target_arch = "x86_64")]
    if isa.avx512 {
        // SAFETY: the CPU has AVX-512 F, BW and VBMI (checked just above).
        kernels.push(("avx512", |c, (v, _), o, hf, st| unsafe {
            x86::nibbles_avx512::<N>(c, v, o, hf, st)
        }));
    }
    #[cfg(target_arch = "x86_64")]
    if isa.ssse3 {
        // SAFETY: the CPU has SSSE3 (checked just above).
        kernels.push(("ssse3", |c, (_, p), o, hf, st| unsafe {
            x86::nibbles::<N>(c, p, o, hf, st)
        }));
    }
    kernels
}

fn nibbles_equal_the_lookup<const N: usize>() {
    let mut rng = fastrand::Rng::with_seed(13);
    let v: [u32; 16] = std::array::from_fn(|_| rng.u32(..) >> (32 - 8 * N));
    let p = planes(Isa::SCALAR, &v);
    // Whole blocks, a last half block, and bytes past both.
    for bytes in [8, 16, 24, 40, 43, 64, 72, 200] {
        let codes: Vec<u8> = (0..bytes).map(|_| rng.u8(..)).collect();
        for ((name, kernel), high_first) in nibble_kernels::<N>()
            .into_iter()
            .flat_map(|k| [(k, false), (k, true)])
        {
            // Streamed into a line-aligned buffer, and 16 bytes past one.
            for (stream, skew) in [(false, 0), (true, 0), (true, 16)] {
                let mut buf = vec![0u8; 2 * bytes * N + 128];
                let at = (64 - buf.as_ptr() as usize % 64) % 64 + skew;
                let out = &mut buf[at..at + 2 * bytes * N];
                let done = kernel(&codes, (&v, &p), out, high_first, stream);
                fence();
                if Isa::detect().ssse3 {
                    assert_eq!(
                        done,
                        2 * bytes / 32 * 32 + (2 * bytes % 32) / 16 * 16,
                        "{name}"
                    );
                }
                for i in 0..done {
                    let shift = 4 * ((i % 2) ^ usize::from(high_first));
                    let code = ((codes[i / 2] >> shift) & 15) as usize;
                    let want = &v[code].to_le_bytes()[..N];
                    let what = format!("{name}: {bytes} bytes, high first {high_first}, stream {stream}, skew {skew}, code {i}");
                    assert_eq!(&out[i * N..i * N + N], want, "{what}");
                }
            }
        }
    }
}

#[test]
fn nibble_blocks_equal_the_lookup() {
    nibbles_equal_the_lookup::<2>();
    nibbles_equal_the_lookup::<4>();
}

#[test]
fn split_nibbles_equal_the_field_order() {
    let mut rng = fastrand::Rng::with_seed(17);
    for len in [1usize, 15, 16, 33, 48] {
        let src: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        for vectors in [true, false] {
            let isa = if vectors { Isa::detect() } else { Isa::SCALAR };
            let (mut lo, mut hi) = (vec![0u8; len.div_ceil(2)], vec![0u8; len.div_ceil(2)]);
            split_nibbles(isa, &src, &mut lo, &mut hi);
            for (c, &b) in src.iter().enumerate() {
                let at = |row: &[u8]| (row[c / 2] >> (4 * (c % 2))) & 15;
                assert_eq!(
                    (at(&lo), at(&hi)),
                    (b & 15, b >> 4),
                    "{len} bytes, column {c}, vectors {vectors}"
                );
            }
        }
    }
}

#[test]
fn planes_hold_each_byte_of_each_entry() {
    let table: [u32; 16] =
        std::array::from_fn(|c| 0x0403_0201u32.wrapping_mul(c as u32 + 7) ^ 0xA5A5_5A5A);
    let p = planes(Isa::detect(), &table);
    for (c, t) in table.iter().enumerate() {
        for (b, plane) in p.iter().enumerate() {
            assert_eq!(plane[c], (t >> (8 * b)) as u8, "entry {c}, byte {b}");
        }
    }
}

#[test]
fn word_gather_equals_the_scalar_copy() {
    // Blocks of 4 (SSE2) with remainders, and of 16 (AVX-512), whose
    // rows' lines are a stride apart.
    for (lanes, words, stride) in [(7, 6, 40), (32, 48, 200), (16, 16, 64)] {
        let src: Vec<u8> = (0..words * stride + 64)
            .map(|b| (b * 7 + b / 251) as u8)
            .collect();
        let row = 4 * words + 4;
        let mut dst = vec![0u8; lanes * row];
        gather_words(
            Isa::detect(),
            &src,
            (8, stride),
            (lanes, words),
            &mut dst,
            row,
        );
        for k in 0..lanes {
            for w in 0..words {
                let at = 8 + w * stride + 4 * k;
                assert_eq!(
                    &dst[k * row + 4 * w..][..4],
                    &src[at..at + 4],
                    "lane {k}, word {w} of {lanes} x {words}"
                );
            }
        }
    }
}

fn transposed_equals_scalar<const N: usize>(lanes: usize) {
    let mut rng = fastrand::Rng::with_seed(5);
    let codes: Vec<[u8; 8]> = (0..lanes)
        .map(|_| std::array::from_fn(|_| rng.u8(..)))
        .collect();
    let planes: Vec<[[u8; 16]; 4]> = (0..lanes)
        .map(|_| std::array::from_fn(|_| std::array::from_fn(|_| rng.u8(..))))
        .collect();
    // Rows wider than the block, whose other bytes must stay as they are.
    let row_bytes = lanes * N + 6;
    let c: Vec<&[u8; 8]> = codes.iter().collect();
    let p: Vec<&[[u8; 16]; 4]> = planes.iter().collect();
    for vectors in [true, false] {
        let isa = if vectors { Isa::detect() } else { Isa::SCALAR };
        let mut out = vec![0x5Au8; 15 * row_bytes + lanes * N];
        transposed_block::<N>(isa, &c, &p, &mut out, row_bytes);
        for (i, &b) in out.iter().enumerate() {
            let (e, at) = (i / row_bytes, i % row_bytes);
            let want = if at < lanes * N {
                let (q, byte) = (at / N, at % N);
                let code = ((codes[q][e / 2] >> (4 * (e % 2))) & 15) as usize;
                planes[q][byte][code]
            } else {
                0x5A
            };
            assert_eq!(b, want, "vectors {vectors}, row {e}, byte {at}");
        }
    }
}

#[test]
fn transposed_blocks_equal_the_scalar_lookup() {
    transposed_equals_scalar::<2>(8);
    transposed_equals_scalar::<4>(4);
    transposed_equals_scalar::<2>(3);
    transposed_equals_scalar::<4>(1);
}

//! Small checkpoints written the way each producer writes them, decoded, and
//! compared byte for byte with a reference computed from the producer's
//! side (tests/suite/common/producer.rs): our own `pack_to_int32` (dense and
//! 0.17.x padded), our own E4M3 / E2M1 / E8M0 readings from the format
//! definitions, the value `f32(q − zp) · f32(scale)` (or the FP4 nibble orders
//! of docs/formats.md's table), and one round-to-nearest-even step by the `half` crate.
//! Nothing here calls the crate's own decoding helpers.

use crate::common::producer::{
    check_output, decode_with, e2m1_ref, e4m3_byte, e4m3_ref, expect_decodes, pack_fields,
    words_for, ScaleScheme, Want, OUTS,
};
use crate::common::{ct_config, ct_config_groups, gpu_test, write_checkpoint, Rng, Tensor};
use serde_json::{json, Value};

/// E4M3 of a byte the generator made, which is never NaN.
fn e4m3_finite(b: u8) -> f32 {
    assert_ne!(b & 0x7F, 0x7F, "NaN byte generated");
    e4m3_ref(b)
}

/// Writes a compressed-tensors checkpoint, decodes it to every output dtype
/// and checks each result.
fn run_ct(ctx: &str, tensors: &[Tensor], qc: Value, wants: &[Want], copies: &[Tensor]) {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), tensors, qc);
    expect_decodes(ctx, dir.path(), wants, copies);
}

// ---------------------------------------------------------------------------
// Random inputs
// ---------------------------------------------------------------------------

fn range(rng: &mut Rng, lo: usize, hi: usize) -> usize {
    lo + rng.below((hi - lo + 1) as u64) as usize
}

/// A random positive f32 with exponent in `lo..=hi`.
fn f32_exp(rng: &mut Rng, lo: i32, hi: i32) -> f32 {
    let e = range(rng, (127 + lo) as usize, (127 + hi) as usize) as u32;
    f32::from_bits(e << 23 | rng.below(1 << 23) as u32)
}

fn random_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.below(256) as u8).collect()
}

/// A signed b-bit integer code.
fn int_code(rng: &mut Rng, b: u32) -> i32 {
    rng.below(1 << b) as i32 - (1 << (b - 1))
}

/// Columns that leave the last word of a row partly filled (cols not a
/// multiple of 32 div b) and, for groups, a partial last group.
fn ragged_cols(rng: &mut Rng, b: u32, group: Option<usize>) -> usize {
    let pw = (32 / b) as usize;
    loop {
        let c = range(rng, 1, 300);
        let group_ok = group.is_none_or(|g| c > g && !c.is_multiple_of(g));
        if !c.is_multiple_of(pw) && group_ok {
            return c;
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Sdt {
    Bf16,
    F16,
    F32,
}

const SDTS: [Sdt; 3] = [Sdt::Bf16, Sdt::F16, Sdt::F32];

impl Sdt {
    /// A scale exactly representable in this dtype (sometimes 0), over a wide
    /// range so f16 outputs see subnormals and overflow too.
    fn gen(self, rng: &mut Rng) -> f32 {
        if rng.below(64) == 0 {
            return 0.0;
        }
        match self {
            Sdt::Bf16 => f32::from_bits(f32_exp(rng, -32, 11).to_bits() & 0xFFFF_0000),
            Sdt::F16 => half::f16::from_bits(1 + rng.below(0x6000) as u16).to_f32(),
            Sdt::F32 => f32_exp(rng, -32, 11),
        }
    }

    fn tensor(self, name: String, shape: &[usize], v: &[f32]) -> Tensor {
        match self {
            Sdt::Bf16 => Tensor::bf16(name, shape, v),
            Sdt::F16 => Tensor::f16(name, shape, v),
            Sdt::F32 => Tensor::f32(name, shape, v),
        }
    }
}

// ---------------------------------------------------------------------------
// Producers
// ---------------------------------------------------------------------------

/// One pack-quantized module, as compressed-tensors writes it.
#[derive(Clone, Copy, Debug)]
struct PackSpec {
    bits: u32,
    legacy: bool,
    lay: ScaleScheme,
    sdt: Sdt,
    asym: bool,
    actorder: bool,
    experts: Option<usize>,
    rows: usize,
    cols: usize,
}

fn pack_module(rng: &mut Rng, module: &str, s: PackSpec) -> (Vec<Tensor>, Want) {
    let b = s.bits;
    let (rows, cols) = (s.rows, s.cols);
    let slices = s.experts.unwrap_or(1);
    let lead: Vec<usize> = s.experts.into_iter().collect();
    let offset = 1i32 << (b - 1);
    let q: Vec<i32> = (0..slices * rows * cols)
        .map(|_| int_code(rng, b))
        .collect();

    // weight_packed: each row of each slice packed on its own.
    let width = words_for(cols, b, s.legacy);
    let mut words = Vec::with_capacity(slices * rows * width);
    for row in q.chunks(cols) {
        let fields: Vec<u32> = row.iter().map(|&v| (v + offset) as u32).collect();
        let w = pack_fields(&fields, b, s.legacy);
        assert_eq!(w.len(), width);
        words.extend(w);
    }
    let mut tensors = vec![
        Tensor::u32_words(
            format!("{module}.weight_packed"),
            &[lead.clone(), vec![rows, width]].concat(),
            &words,
        ),
        Tensor::i64(
            format!("{module}.weight_shape"),
            &[lead.len() + 2],
            &lead
                .iter()
                .chain([&rows, &cols])
                .map(|&x| x as i64)
                .collect::<Vec<_>>(),
        ),
    ];

    // Activation order: columns in a random order, G at a time per group.
    let mut gidx = Vec::new();
    if s.actorder {
        let ScaleScheme::Group(g) = s.lay else {
            panic!("actorder needs groups")
        };
        let mut perm: Vec<usize> = (0..cols).collect();
        for i in (1..cols).rev() {
            perm.swap(i, range(rng, 0, i));
        }
        gidx = vec![0; cols];
        for (i, &c) in perm.iter().enumerate() {
            gidx[c] = i / g;
        }
        let v: Vec<i32> = gidx.iter().map(|&x| x as i32).collect();
        tensors.push(Tensor::i32(format!("{module}.weight_g_idx"), &[cols], &v));
    }

    let n = s.lay.entries(slices, rows, cols);
    let scales: Vec<f32> = (0..n).map(|_| s.sdt.gen(rng)).collect();
    tensors.push(s.sdt.tensor(
        format!("{module}.weight_scale"),
        &s.lay.shape(s.experts, rows, cols),
        &scales,
    ));

    // Zero points: [slices, rows, ng] integers, packed along rows per group column.
    let mut zp = vec![0i32; n];
    if s.asym {
        let ng = s.lay.ncols(cols);
        assert!(matches!(
            s.lay,
            ScaleScheme::Group(_) | ScaleScheme::Channel
        ));
        zp = (0..n).map(|_| int_code(rng, b)).collect();
        let zrows = words_for(rows, b, s.legacy);
        let mut zw = vec![0u32; slices * zrows * ng];
        for sl in 0..slices {
            for g in 0..ng {
                let fields: Vec<u32> = (0..rows)
                    .map(|r| (zp[sl * rows * ng + r * ng + g] + offset) as u32)
                    .collect();
                for (w, word) in pack_fields(&fields, b, s.legacy).into_iter().enumerate() {
                    zw[sl * zrows * ng + w * ng + g] = word;
                }
            }
        }
        tensors.push(Tensor::u32_words(
            format!("{module}.weight_zero_point"),
            &[lead.clone(), vec![zrows, ng]].concat(),
            &zw,
        ));
    }

    let mut vals = Vec::with_capacity(q.len());
    for sl in 0..slices {
        for r in 0..rows {
            for c in 0..cols {
                let i = s.lay.index(rows, cols, sl, r, c, &gidx);
                let qv = q[(sl * rows + r) * cols + c];
                vals.push((qv - zp[i]) as f32 * scales[i]);
            }
        }
    }
    (
        tensors,
        Want::weight(module, [lead, vec![rows, cols]].concat(), vals),
    )
}

/// One int-quantized (I8) or float-quantized (F8_E4M3) module.
fn byte_module(
    rng: &mut Rng,
    module: &str,
    float: bool,
    lay: ScaleScheme,
    sdt: Sdt,
    asym: bool,
    (rows, cols): (usize, usize),
) -> (Vec<Tensor>, Want) {
    let bytes: Vec<u8> = (0..rows * cols)
        .map(|_| {
            if float {
                e4m3_byte(rng)
            } else {
                rng.below(256) as u8
            }
        })
        .collect();
    let w_of = |b: u8| {
        if float {
            e4m3_finite(b)
        } else {
            b as i8 as f32
        }
    };
    let dtype = if float { "F8_E4M3" } else { "I8" };
    let mut tensors = vec![Tensor::u8(
        format!("{module}.weight"),
        dtype,
        &[rows, cols],
        &bytes,
    )];
    let n = lay.entries(1, rows, cols);
    let shape = lay.shape(None, rows, cols);
    let scales: Vec<f32> = (0..n).map(|_| sdt.gen(rng)).collect();
    tensors.push(sdt.tensor(format!("{module}.weight_scale"), &shape, &scales));
    let mut zp = vec![0i32; n];
    if asym {
        zp = (0..n).map(|_| int_code(rng, 8)).collect();
        let zb: Vec<u8> = zp.iter().map(|&z| z as i8 as u8).collect();
        tensors.push(Tensor::u8(
            format!("{module}.weight_zero_point"),
            "I8",
            &shape,
            &zb,
        ));
    }
    let mut vals = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let i = lay.index(rows, cols, 0, r, c, &[]);
            let b = bytes[r * cols + c];
            let v = if float {
                w_of(b) * scales[i]
            } else {
                (b as i8 as i32 - zp[i]) as f32 * scales[i]
            };
            vals.push(v);
        }
    }
    (tensors, Want::weight(module, vec![rows, cols], vals))
}

/// Random FP4 codes for `[lead.., rows, cols]`, packed two per byte, element
/// 2i in the low nibble.
fn fp4_codes(rng: &mut Rng, n: usize) -> (Vec<u8>, Vec<u8>) {
    assert_eq!(n % 2, 0);
    let codes: Vec<u8> = (0..n).map(|_| rng.below(16) as u8).collect();
    let packed = codes.chunks(2).map(|p| p[0] | p[1] << 4).collect();
    (codes, packed)
}

/// One nvfp4-pack-quantized (compressed-tensors) module.
fn nvfp4_ct_module(
    rng: &mut Rng,
    module: &str,
    experts: Option<usize>,
    rows: usize,
    cols: usize,
) -> (Vec<Tensor>, Want) {
    let slices = experts.unwrap_or(1);
    let lead: Vec<usize> = experts.into_iter().collect();
    let ng = cols.div_ceil(16);
    let (codes, packed) = fp4_codes(rng, slices * rows * cols);
    let sc: Vec<u8> = (0..slices * rows * ng).map(|_| e4m3_byte(rng)).collect();
    let global = f32_exp(rng, 0, 14);
    let tensors = vec![
        Tensor::u8(
            format!("{module}.weight_packed"),
            "U8",
            &[lead.clone(), vec![rows, cols / 2]].concat(),
            &packed,
        ),
        Tensor::u8(
            format!("{module}.weight_scale"),
            "F8_E4M3",
            &[lead.clone(), vec![rows, ng]].concat(),
            &sc,
        ),
        Tensor::f32(format!("{module}.weight_global_scale"), &[1], &[global]),
        Tensor::f32(
            format!("{module}.input_global_scale"),
            &[1],
            &[f32_exp(rng, 0, 14)],
        ),
    ];
    let mut vals = Vec::with_capacity(codes.len());
    for (i, &code) in codes.iter().enumerate() {
        let (row, c) = (i / cols, i % cols);
        let s_eff = e4m3_finite(sc[row * ng + c / 16]) / global;
        vals.push(e2m1_ref(code) * s_eff);
    }
    (
        tensors,
        Want::weight(module, [lead, vec![rows, cols]].concat(), vals),
    )
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

/// pack-quantized int, 1..=8 bits, dense (0.19.0) and padded (0.17.1) rows,
/// tensor / channel / group scales stored BF16, F16 and F32, decoded to bf16,
/// f16 and f32.
#[test]
fn pack_quantized_every_width_layout_strategy_and_dtype() {
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
    for bits in 1..=8u32 {
        for version in ["0.19.0", "0.17.1"] {
            let legacy = version == "0.17.1";
            for strat in 0..3 {
                let lay = match strat {
                    0 => ScaleScheme::Tensor,
                    1 => ScaleScheme::Channel,
                    _ => ScaleScheme::Group([8, 16, 32, 128][rng.below(4) as usize]),
                };
                let mut tensors = Vec::new();
                let mut wants = Vec::new();
                for (k, sdt) in SDTS.into_iter().enumerate() {
                    let cols = if k == 0 {
                        ragged_cols(&mut rng, bits, lay.group_size())
                    } else {
                        range(&mut rng, 1, 300)
                    };
                    let spec = PackSpec {
                        bits,
                        legacy,
                        lay,
                        sdt,
                        asym: false,
                        actorder: false,
                        experts: None,
                        rows: range(&mut rng, 3, 40),
                        cols,
                    };
                    let (t, w) =
                        pack_module(&mut rng, &format!("model.layers.{k}.mlp.down_proj"), spec);
                    tensors.extend(t);
                    wants.push(w);
                }
                let qc = ct_config(
                    "pack-quantized",
                    lay.weights(bits, "int", true, false),
                    version,
                );
                run_ct(
                    &format!("int{bits} {version} {lay:?}"),
                    &tensors,
                    qc,
                    &wants,
                    &[],
                );
            }
        }
    }
}

/// Asymmetric pack-quantized (group and channel): zero points packed along
/// rows as int32 `[ceil(rows·b/32), n_groups]` (padded in 0.17.1).
#[test]
fn pack_quantized_asymmetric_packed_zero_points() {
    let mut rng = Rng::new(0xD1B5_4A32_D192_ED03);
    for bits in 1..=8u32 {
        for version in ["0.19.0", "0.17.1"] {
            let legacy = version == "0.17.1";
            for lay in [
                ScaleScheme::Channel,
                ScaleScheme::Group([8, 16, 32, 64][rng.below(4) as usize]),
            ] {
                let mut tensors = Vec::new();
                let mut wants = Vec::new();
                for k in 0..2 {
                    // Rows that leave the zero-point lanes' last word partial.
                    let rows = loop {
                        let r = range(&mut rng, 3, 40);
                        if !(r * bits as usize).is_multiple_of(32) {
                            break r;
                        }
                    };
                    let spec = PackSpec {
                        bits,
                        legacy,
                        lay,
                        sdt: SDTS[rng.below(3) as usize],
                        asym: true,
                        actorder: false,
                        experts: None,
                        rows,
                        cols: if k == 0 {
                            ragged_cols(&mut rng, bits, lay.group_size())
                        } else {
                            range(&mut rng, 1, 300)
                        },
                    };
                    let (t, w) =
                        pack_module(&mut rng, &format!("model.layers.{k}.mlp.up_proj"), spec);
                    tensors.extend(t);
                    wants.push(w);
                }
                let qc = ct_config(
                    "pack-quantized",
                    lay.weights(bits, "int", false, false),
                    version,
                );
                run_ct(
                    &format!("asym int{bits} {version} {lay:?}"),
                    &tensors,
                    qc,
                    &wants,
                    &[],
                );
            }
        }
    }
}

/// Activation order: `weight_g_idx` assigns columns to groups; scales and zero
/// points are looked up with `g_idx[c]`.
#[test]
fn pack_quantized_actorder_g_idx() {
    let mut rng = Rng::new(0x2545_F491_4F6C_DD1D);
    for bits in [2u32, 3, 4, 6, 8] {
        for asym in [false, true] {
            for version in ["0.19.0", "0.17.1"] {
                let g = [8, 16, 32][rng.below(3) as usize];
                let lay = ScaleScheme::Group(g);
                let mut tensors = Vec::new();
                let mut wants = Vec::new();
                for k in 0..2 {
                    let spec = PackSpec {
                        bits,
                        legacy: version == "0.17.1",
                        lay,
                        sdt: SDTS[rng.below(3) as usize],
                        asym,
                        actorder: true,
                        experts: None,
                        rows: range(&mut rng, 3, 40),
                        cols: ragged_cols(&mut rng, bits, Some(g)),
                    };
                    let (t, w) = pack_module(
                        &mut rng,
                        &format!("model.layers.{k}.self_attn.o_proj"),
                        spec,
                    );
                    tensors.extend(t);
                    wants.push(w);
                }
                let qc = ct_config(
                    "pack-quantized",
                    lay.weights(bits, "int", !asym, true),
                    version,
                );
                run_ct(
                    &format!("actorder int{bits} asym={asym} {version} g{g}"),
                    &tensors,
                    qc,
                    &wants,
                    &[],
                );
            }
        }
    }
}

/// 3-D expert weights `[E, rows, cols]`: packed per 2-D slice, scales
/// `[E, rows, n_groups]`, zero points `[E, zrows, n_groups]`.
#[test]
fn pack_quantized_3d_experts() {
    let mut rng = Rng::new(0x6A09_E667_F3BC_C908);
    for bits in [2u32, 3, 4, 5, 8] {
        for version in ["0.19.0", "0.17.1"] {
            for (lay, asym) in [
                (ScaleScheme::Channel, false),
                (ScaleScheme::Channel, true),
                (ScaleScheme::Group(16), false),
                (ScaleScheme::Group(32), true),
                (ScaleScheme::Tensor, false),
            ] {
                let spec = PackSpec {
                    bits,
                    legacy: version == "0.17.1",
                    lay,
                    sdt: SDTS[rng.below(3) as usize],
                    asym,
                    actorder: false,
                    experts: Some(range(&mut rng, 2, 4)),
                    rows: range(&mut rng, 3, 20),
                    cols: ragged_cols(&mut rng, bits, lay.group_size()),
                };
                let (tensors, want) =
                    pack_module(&mut rng, "model.layers.0.mlp.experts.gate_up_proj", spec);
                let qc = ct_config(
                    "pack-quantized",
                    lay.weights(bits, "int", !asym, false),
                    version,
                );
                run_ct(
                    &format!("3-D int{bits} {version} {lay:?} asym={asym} {spec:?}"),
                    &tensors,
                    qc,
                    &[want],
                    &[],
                );
            }
        }
    }
}

/// int-quantized (I8) and float-quantized (F8_E4M3) weights with tensor,
/// channel, group and block scales; int8 also asymmetric with I8 zero points.
#[test]
fn int8_and_fp8_weights_every_strategy() {
    let mut rng = Rng::new(0xBB67_AE85_84CA_A73B);
    for float in [false, true] {
        for asym in [false, true] {
            if float && asym {
                continue;
            }
            for strat in 0..4 {
                let lay = match strat {
                    0 => ScaleScheme::Tensor,
                    1 => ScaleScheme::Channel,
                    2 => ScaleScheme::Group([8, 16, 32, 128][rng.below(4) as usize]),
                    _ => ScaleScheme::Block(
                        [2, 4, 8, 16][rng.below(4) as usize],
                        [4, 8, 16, 32][rng.below(4) as usize],
                    ),
                };
                let mut tensors = Vec::new();
                let mut wants = Vec::new();
                for (k, sdt) in SDTS.into_iter().enumerate() {
                    // Partial last group / block in both directions.
                    let (rows, cols) = loop {
                        let r = range(&mut rng, 3, 40);
                        let c = range(&mut rng, 1, 300);
                        let ok = match lay {
                            ScaleScheme::Group(g) => k > 0 || (c > g && !c.is_multiple_of(g)),
                            ScaleScheme::Block(bh, bw) => {
                                k > 0
                                    || (r > bh
                                        && !r.is_multiple_of(bh)
                                        && c > bw
                                        && !c.is_multiple_of(bw))
                            }
                            _ => true,
                        };
                        if ok {
                            break (r, c);
                        }
                    };
                    let (t, w) = byte_module(
                        &mut rng,
                        &format!("model.layers.{k}.self_attn.q_proj"),
                        float,
                        lay,
                        sdt,
                        asym,
                        (rows, cols),
                    );
                    tensors.extend(t);
                    wants.push(w);
                }
                let (format, kind) = if float {
                    ("float-quantized", "float")
                } else {
                    ("int-quantized", "int")
                };
                let qc = ct_config(format, lay.weights(8, kind, !asym, false), "0.19.0");
                run_ct(
                    &format!("{format} asym={asym} {lay:?}"),
                    &tensors,
                    qc,
                    &wants,
                    &[],
                );
            }
        }
    }
}

/// nvfp4-pack-quantized: `e2m1 · (f32(e4m3) / global)`, 2-D and 3-D; the
/// input global scale is dropped.
#[test]
fn nvfp4_compressed_tensors_2d_and_3d() {
    let mut rng = Rng::new(0x3C6E_F372_FE94_F82B);
    let weights = json!({"num_bits": 4, "type": "float", "strategy": "tensor_group",
        "group_size": 16, "symmetric": true, "dynamic": false});
    for case in 0..6 {
        let mut tensors = Vec::new();
        let mut wants = Vec::new();
        for (k, experts) in [None, Some(range(&mut rng, 2, 4))].into_iter().enumerate() {
            // Mostly whole groups; one module per case with a half last group.
            let cols = if k == 0 && case % 2 == 1 {
                16 * range(&mut rng, 1, 8) + 8
            } else {
                16 * range(&mut rng, 1, 12)
            };
            let rows = range(&mut rng, 3, 40);
            let (t, w) = nvfp4_ct_module(
                &mut rng,
                &format!("model.layers.{k}.mlp.gate_proj"),
                experts,
                rows,
                cols,
            );
            tensors.extend(t);
            wants.push(w);
        }
        let qc = ct_config("nvfp4-pack-quantized", weights.clone(), "0.19.0");
        run_ct(&format!("nvfp4 case {case}"), &tensors, qc, &wants, &[]);
    }
}

/// mxfp4-pack-quantized: `e2m1 · 2^(e−127)`, one U8 exponent per 32 columns.
#[test]
fn mxfp4_compressed_tensors() {
    let mut rng = Rng::new(0xA54F_F53A_5F1D_36F1);
    let weights = json!({"num_bits": 4, "type": "float", "strategy": "group",
        "group_size": 32, "symmetric": true, "dynamic": false, "scale_dtype": "torch.uint8"});
    for case in 0..4 {
        let mut tensors = Vec::new();
        let mut wants = Vec::new();
        for k in 0..3 {
            let rows = range(&mut rng, 3, 40);
            // Even columns; k == 0 has a partial last group.
            let cols = if k == 0 {
                32 * range(&mut rng, 0, 8) + 2 * range(&mut rng, 1, 15)
            } else {
                32 * range(&mut rng, 1, 9)
            };
            let module = format!("model.layers.{k}.self_attn.v_proj");
            let ng = cols.div_ceil(32);
            let (codes, packed) = fp4_codes(&mut rng, rows * cols);
            let ex: Vec<u8> = (0..rows * ng)
                .map(|_| range(&mut rng, 110, 140) as u8)
                .collect();
            tensors.push(Tensor::u8(
                format!("{module}.weight_packed"),
                "U8",
                &[rows, cols / 2],
                &packed,
            ));
            tensors.push(Tensor::u8(
                format!("{module}.weight_scale"),
                "U8",
                &[rows, ng],
                &ex,
            ));
            let vals = codes
                .iter()
                .enumerate()
                .map(|(i, &code)| {
                    let (r, c) = (i / cols, i % cols);
                    e2m1_ref(code) * 2f32.powi(ex[r * ng + c / 32] as i32 - 127)
                })
                .collect();
            wants.push(Want::weight(&module, vec![rows, cols], vals));
        }
        let qc = ct_config("mxfp4-pack-quantized", weights.clone(), "0.19.0");
        run_ct(&format!("mxfp4 case {case}"), &tensors, qc, &wants, &[]);
    }
}

/// ModelOpt NVFP4 export: `e2m1 · (f32(e4m3) · weight_scale_2)`; input scales
/// dropped, the BF16 lm_head and norms copied unchanged; NVFP4_AWQ's
/// pre-quant scale multiplies its module's columns.
#[test]
fn modelopt_nvfp4_export() {
    let mut rng = Rng::new(0x510E_527F_ADE6_82D1);
    for case in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let mut tensors = Vec::new();
        let mut wants = Vec::new();
        for module in [
            "model.layers.0.mlp.down_proj",
            "model.layers.0.self_attn.q_proj",
            "model.layers.1.mlp.gate_proj",
        ] {
            let rows = range(&mut rng, 3, 40);
            let cols = 16 * range(&mut rng, 1, 12);
            let ng = cols / 16;
            let (codes, packed) = fp4_codes(&mut rng, rows * cols);
            let sc: Vec<u8> = (0..rows * ng).map(|_| e4m3_byte(&mut rng)).collect();
            let s2 = f32_exp(&mut rng, -14, -4);
            tensors.push(Tensor::u8(
                format!("{module}.weight"),
                "U8",
                &[rows, cols / 2],
                &packed,
            ));
            tensors.push(Tensor::u8(
                format!("{module}.weight_scale"),
                "F8_E4M3",
                &[rows, ng],
                &sc,
            ));
            tensors.push(Tensor::f32(format!("{module}.weight_scale_2"), &[], &[s2]));
            tensors.push(Tensor::f32(
                format!("{module}.input_scale"),
                &[],
                &[f32_exp(&mut rng, -10, 0)],
            ));
            // NVFP4_AWQ: the down projection kept its pre-quant scale.
            let factors: Option<Vec<f32>> = (case == 2 && module.ends_with("down_proj"))
                .then(|| (0..cols).map(|_| f32_exp(&mut rng, -3, 3)).collect());
            if let Some(f) = &factors {
                tensors.push(Tensor::f32(format!("{module}.pre_quant_scale"), &[cols], f));
            }
            let vals = codes
                .iter()
                .enumerate()
                .map(|(i, &code)| {
                    let (r, c) = (i / cols, i % cols);
                    let s_eff = e4m3_finite(sc[r * ng + c / 16]) * s2;
                    let v = e2m1_ref(code) * s_eff;
                    factors.as_ref().map_or(v, |f| v * f[c])
                })
                .collect();
            wants.push(Want::weight(module, vec![rows, cols], vals));
        }
        let dense = [
            Tensor::new(
                "lm_head.weight",
                "BF16",
                &[24, 32],
                random_bytes(&mut rng, 24 * 32 * 2),
            ),
            Tensor::new(
                "model.norm.weight",
                "BF16",
                &[32],
                random_bytes(&mut rng, 64),
            ),
            Tensor::new(
                "model.layers.0.input_layernorm.weight",
                "F32",
                &[32],
                random_bytes(&mut rng, 128),
            ),
        ];
        let copies = dense.clone();
        tensors.extend(dense);
        write_checkpoint(dir.path(), &tensors, Value::Null);
        let hf = json!({
            "producer": {"name": "modelopt", "version": "0.47.0"},
            "quantization": {"quant_algo": if case == 2 { "NVFP4_AWQ" } else { "NVFP4" }, "group_size": 16, "exclude_modules": ["lm_head"]},
        });
        std::fs::write(
            dir.path().join("hf_quant_config.json"),
            serde_json::to_vec_pretty(&hf).unwrap(),
        )
        .unwrap();
        expect_decodes(
            &format!("modelopt case {case}"),
            dir.path(),
            &wants,
            &copies,
        );
        gpu_test(|_| {
            for out in OUTS {
                let got = decode_with(dir.path(), out, wgpu_dequant::BackendChoice::Gpu);
                check_output(
                    &format!("modelopt case {case} -> {out} (GPU)"),
                    &got,
                    out,
                    &wants,
                    &copies,
                );
            }
        });
    }
}

/// Two config groups with different formats in one checkpoint: int4
/// pack-quantized MLPs and FP8 channel attention; lm_head (ignored) and norms
/// copied with their dtype; no quantization parameters in the output.
#[test]
fn mixed_precision_checkpoint() {
    let mut rng = Rng::new(0x1F83_D9AB_FB41_BD6B);
    let hidden = 48;
    let inter = 72;
    let mut tensors = Vec::new();
    let mut wants = Vec::new();
    let mut dense = Vec::new();
    for layer in 0..2 {
        let p = format!("model.layers.{layer}");
        for (name, rows, cols) in [
            ("gate_proj", inter, hidden),
            ("up_proj", inter, hidden),
            ("down_proj", hidden, inter),
        ] {
            let spec = PackSpec {
                bits: 4,
                legacy: false,
                lay: ScaleScheme::Group(32),
                sdt: Sdt::Bf16,
                asym: false,
                actorder: false,
                experts: None,
                rows,
                cols,
            };
            let (t, w) = pack_module(&mut rng, &format!("{p}.mlp.{name}"), spec);
            tensors.extend(t);
            wants.push(w);
        }
        for (name, rows) in [
            ("q_proj", 48),
            ("k_proj", 16),
            ("v_proj", 16),
            ("o_proj", 48),
        ] {
            let module = format!("{p}.self_attn.{name}");
            let (t, w) = byte_module(
                &mut rng,
                &module,
                true,
                ScaleScheme::Channel,
                Sdt::Bf16,
                false,
                (rows, hidden),
            );
            tensors.extend(t);
            tensors.push(Tensor::f32(
                format!("{module}.input_scale"),
                &[1],
                &[f32_exp(&mut rng, -8, 0)],
            ));
            wants.push(w);
        }
        tensors.push(Tensor::f32(format!("{p}.self_attn.k_scale"), &[], &[0.5]));
        tensors.push(Tensor::f32(format!("{p}.self_attn.v_scale"), &[], &[0.25]));
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            dense.push(Tensor::new(
                format!("{p}.{norm}.weight"),
                "BF16",
                &[hidden],
                random_bytes(&mut rng, hidden * 2),
            ));
        }
    }
    dense.push(Tensor::new(
        "lm_head.weight",
        "BF16",
        &[40, hidden],
        random_bytes(&mut rng, 40 * hidden * 2),
    ));
    dense.push(Tensor::new(
        "model.embed_tokens.weight",
        "BF16",
        &[40, hidden],
        random_bytes(&mut rng, 40 * hidden * 2),
    ));
    dense.push(Tensor::new(
        "model.norm.weight",
        "F32",
        &[hidden],
        random_bytes(&mut rng, hidden * 4),
    ));
    let copies = dense.clone();
    tensors.extend(dense);
    let qc = ct_config_groups(
        "mixed-precision",
        "0.19.0",
        json!({
            "group_0": {
                "format": "pack-quantized",
                "targets": ["re:.*mlp.*"],
                "weights": ScaleScheme::Group(32).weights(4, "int", true, false),
            },
            "group_1": {
                "format": "float-quantized",
                "targets": ["re:.*self_attn.*"],
                "weights": ScaleScheme::Channel.weights(8, "float", true, false),
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor",
                    "symmetric": true, "dynamic": false},
            },
        }),
    );
    run_ct("mixed-precision", &tensors, qc, &wants, &copies);
}

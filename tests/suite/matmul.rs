//! Products with packed weights: `y = x·Wᵀ (+ bias)` on the GPU straight
//! from the packs (`Model::upload_packed`, `GpuDecoder::matmul`) and on the
//! CPU (`Model::matmul_cpu`), for every quantized Linear of the fixtures
//! the GPU multiplies, against an f64 product of the very dense weight
//! `dequantize` writes: within `K·2⁻²⁴·Σ|w·x|` (plus the bias's rounding),
//! the same bits from run to run.

use std::path::Path;

use crate::common::{fixtures, gpu_test, Rng};
use wgpu_dequant::{BackendChoice, DtypeChoice, GpuDecoder, Model, Rule};

/// Rows of x tried: one (a token), a few, past a workgroup's 8, and 64.
const MS: [usize; 4] = [1, 3, 17, 64];

/// x: `m` rows of `k` values of mixed signs and magnitudes.
pub(crate) fn random_x(rng: &mut Rng, m: usize, k: usize, scale: f32) -> Vec<f32> {
    (0..m * k)
        .map(|_| {
            let u = rng.below(1 << 20) as f32 / (1 << 20) as f32 - 0.5;
            u * scale * (1 + rng.below(4)) as f32
        })
        .collect()
}

/// The f64 product of `w` (`[n, k]`) with `x` (`[m, k]`), plus `bias`, and
/// the bound each f32 result must keep to: `K·2⁻²⁴·Σ|w·x|`, and half an
/// ulp of the result for the bias's addition.
pub(crate) fn reference(
    w: &[f32],
    x: &[f32],
    bias: Option<&[f32]>,
    (m, n, k): (usize, usize, usize),
) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(m * n);
    for xm in x.chunks_exact(k) {
        for (j, wj) in w.chunks_exact(k).enumerate() {
            let (mut dot, mut abs) = (0f64, 0f64);
            for (a, b) in wj.iter().zip(xm) {
                dot += *a as f64 * *b as f64;
                abs += (*a as f64 * *b as f64).abs();
            }
            let b = bias.map_or(0.0, |b| b[j] as f64);
            let y = dot + b;
            out.push((
                y,
                k as f64 * abs * 2f64.powi(-24) + y.abs() * 2f64.powi(-24) + f64::MIN_POSITIVE,
            ));
        }
    }
    out
}

/// Asserts every value of `got` within its bound of `want`.
pub(crate) fn assert_within(got: &[f32], want: &[(f64, f64)], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, (y, bound))) in got.iter().zip(want).enumerate() {
        let err = (*g as f64 - y).abs();
        assert!(
            err <= *bound,
            "{what}: y[{i}] = {g}, f64 {y}, error {err:e} above the bound {bound:e}"
        );
    }
}

/// Three decoders on `adapter`: its own geometry (on llvmpipe, x shared
/// across a subgroup's lanes), the same without subgroups, and a GPU's.
fn decoders(adapter: &wgpu::Adapter) -> [GpuDecoder; 3] {
    [
        GpuDecoder::open(adapter).unwrap(),
        GpuDecoder::open(adapter).unwrap().without_subgroups(),
        GpuDecoder::open(adapter).unwrap().gpu_geometry(),
    ]
}

/// The quantized Linears of `model` (not stacks of experts): their
/// weights' names.
pub(crate) fn linears(model: &Model) -> Vec<String> {
    model
        .quantized()
        .filter(|t| t.shape.len() == 2)
        .map(|t| t.name)
        .collect()
}

/// Checks every Linear of the model at `dir` on one of the decoders in
/// turn (the adapter's own geometry, the same without subgroups, and a
/// GPU's: a model's Linears meet all three, and the decoders' kernels are
/// the same for every fixture of a layout, so one each keeps CI short),
/// with one row of x and one of the other counts in turn (a model's
/// Linears meet them all).
fn check_model(dir: &Path, decoders: &[GpuDecoder], rng: &mut Rng) -> usize {
    let model = Model::open(dir, DtypeChoice::Auto).unwrap();
    let names = linears(&model);
    for (i, name) in names.iter().enumerate() {
        let info = model.info(name).unwrap();
        let (n, k) = (info.shape[0], info.shape[1]);
        let w = model.decode_f32(name, BackendChoice::Cpu).unwrap();
        let bias_name = name.replace(".weight", ".bias");
        let bias = model.decode_f32(&bias_name, BackendChoice::Cpu).ok();
        let (d, decoder) = (i % decoders.len(), &decoders[i % decoders.len()]);
        // Refused on the GPU in one line (the CPU multiplies them): HQQ's
        // groups along axis 0, columns of the reshaped weight (a scale for
        // each element of a row), and an odd number of columns in a 16-bit
        // dtype (Gemma's fixture, whose rows end in padding fields: the fast
        // kernels write 16-bit values in pairs), and SINQ's int32 packs
        // (the grouped weight's rows, read in its own view).
        let hqq_axis0 = hqq_axis0(dir, name);
        let packed = match model.upload_packed(name, decoder) {
            Err(e) if hqq_axis0 || k % 2 == 1 || sinq_words(dir, name) => {
                let line = e.to_string();
                assert!(
                    e.rule == Rule::Argument
                        && line.contains(name.as_str())
                        && !line.contains('\n'),
                    "{line}"
                );
                None
            }
            first => {
                assert!(!hqq_axis0, "{name}: HQQ's axis 0 taken by the GPU");
                Some(first.unwrap())
            }
        };
        // Packs, not dense bf16 (a tiny Linear's are mostly its buffers'
        // fixed parts: its parameters, a bias, alignment; about 2.5 KiB,
        // which an 8-bit 32×64 Linear's 2 KiB of codes (AutoRound's MXFP8
        // k_proj) takes past 4 KiB).
        if let Some(p) = &packed {
            let bytes = p.gpu_bytes();
            assert!(
                bytes > 0 && bytes < (n * k * 2).max(8192) as u64,
                "{name}: {bytes} bytes on the GPU"
            );
        }
        for m in [MS[0], MS[1 + i % (MS.len() - 1)]] {
            let what = format!("{} {name} m={m}", dir.display());
            let x = random_x(rng, m, k, 1.0);
            let want = reference(&w, &x, bias.as_deref(), (m, n, k));
            if let Some(packed) = &packed {
                let what = format!("{what} on GPU decoder {d}");
                let gpu = decoder.matmul(packed, &x, m).unwrap();
                assert_within(&gpu, &want, &what);
                let again = decoder.matmul(packed, &x, m).unwrap();
                assert!(
                    gpu.iter()
                        .zip(&again)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: not the same bits twice"
                );
            }
            let cpu = model.matmul_cpu(name, &x, m).unwrap();
            assert_within(&cpu, &want, &format!("{what} on the CPU"));
        }
    }
    names.len()
}

/// The products of every quantized Linear of the checkpoint at `dir`,
/// one row of x and 5: within the bound on the CPU, and on the GPU where
/// it takes the weight, which it must unless the weight's rows split its
/// words of codes between groups (bitsandbytes' blocks across rows of a
/// width off 8); else a one-line error naming the weight.
pub(crate) fn products_keep_to_the_bound(ctx: &str, dir: &Path) {
    products_keep_to_the_bound_but(ctx, dir, |_, k| !k.is_multiple_of(8));
}

/// For the formats whose weights the GPU does not multiply packed
/// (codebooks: VPTQ, AQLM): every quantized Linear of the checkpoint at
/// `dir` has 7 of them, whose products on the CPU (`Model::matmul_cpu`),
/// one row of x and 5, keep to the bound around the dense weight, and
/// `upload_packed` refuses each in one line naming it (`ARG-001`).
pub(crate) fn cpu_products_keep_to_the_bound_gpu_refuses(dir: &Path, seed: u64) {
    let model = Model::open(dir, DtypeChoice::Auto).unwrap();
    let mut rng = Rng::new(seed);
    let names = linears(&model);
    assert_eq!(names.len(), 7);
    for name in &names {
        let info = model.info(name).unwrap();
        let (n, k) = (info.shape[0], info.shape[1]);
        let w = model.decode_f32(name, BackendChoice::Cpu).unwrap();
        for m in [1, 5] {
            let x = random_x(&mut rng, m, k, 1.0);
            let want = reference(&w, &x, None, (m, n, k));
            let got = model.matmul_cpu(name, &x, m).unwrap();
            assert_within(&got, &want, &format!("{name} m={m} on the CPU"));
        }
    }
    gpu_test(|adapter| {
        let decoder = GpuDecoder::open(&adapter).unwrap();
        for name in &names {
            let Err(e) = model.upload_packed(name, &decoder) else {
                panic!("{name}: multiplied packed on the GPU");
            };
            let line = e.to_string();
            assert!(
                e.rule == Rule::Argument && line.contains(name.as_str()) && !line.contains('\n'),
                "{line}"
            );
        }
    });
}

/// Whether weight `name` of the HQQ checkpoint at `dir` is grouped along
/// axis 0 (its `axis` meta tensor 0): the GPU's products refuse it.
pub(crate) fn hqq_axis0(dir: &Path, name: &str) -> bool {
    if !dir.to_string_lossy().contains("hqq") {
        return false;
    }
    let axis = format!("{}.axis", name.trim_end_matches(".weight"));
    crate::common::read_dir_tensors(dir)
        .get(&axis)
        .is_some_and(|(_, _, data)| data.iter().all(|&b| b == 0))
}

/// Whether weight `name` of the SINQ checkpoint at `dir` is packed in
/// int32 words (`3bit_32`, `5bit_32`, `6bit_32`), decoded as the grouped
/// `[out·in/G, G]` rows whose parts end inside the weight's rows: the
/// GPU's products refuse it.
pub(crate) fn sinq_words(dir: &Path, name: &str) -> bool {
    let Ok(bytes) = std::fs::read(dir.join("model.safetensors.index.json.meta.json")) else {
        return false;
    };
    let side: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    side[name.trim_end_matches(".weight")]["meta"]["packing"]
        .as_str()
        .is_some_and(|p| p.ends_with("_32"))
}

/// [`products_keep_to_the_bound`], the GPU refusing (with a one-line
/// error naming it) only the weights `refusable(name, k)` allows.
pub(crate) fn products_keep_to_the_bound_but(
    ctx: &str,
    dir: &Path,
    refusable: impl Fn(&str, usize) -> bool,
) {
    gpu_test(|adapter| {
        let decoder = GpuDecoder::open(&adapter).unwrap();
        let model = Model::open(dir, DtypeChoice::Auto).unwrap();
        let mut rng = Rng::new(0x5EED_6E3F_0000_0005);
        for name in linears(&model) {
            let info = model.info(&name).unwrap();
            let (n, k) = (info.shape[0], info.shape[1]);
            let w = model.decode_f32(&name, BackendChoice::Cpu).unwrap();
            let packed = match model.upload_packed(&name, &decoder) {
                Ok(packed) => Some(packed),
                Err(e) => {
                    let line = e.to_string();
                    assert!(refusable(&name, k), "{ctx} {name} [{n}, {k}]: {line}");
                    assert!(
                        e.rule == Rule::Argument && line.contains(&name) && !line.contains('\n'),
                        "{line}"
                    );
                    None
                }
            };
            for m in [1, 5] {
                let x = random_x(&mut rng, m, k, 1.0);
                let want = reference(&w, &x, None, (m, n, k));
                let what = format!("{ctx} {name} [{n}, {k}] m={m}");
                assert_within(
                    &model.matmul_cpu(&name, &x, m).unwrap(),
                    &want,
                    &format!("{what} on the CPU"),
                );
                if let Some(packed) = &packed {
                    assert_within(
                        &decoder.matmul(packed, &x, m).unwrap(),
                        &want,
                        &format!("{what} on the GPU"),
                    );
                }
            }
        }
    });
}

#[test]
fn matmul_of_every_fixture_linear_keeps_to_the_bound() {
    gpu_test(|adapter| {
        let decoders = decoders(&adapter);
        let mut rng = Rng::new(0x5EED_6E3F_0000_0001);
        let mut multiplied = 0;
        for dir in std::fs::read_dir(fixtures()).unwrap() {
            let dir = dir.unwrap().path();
            // Vector codebooks are refused packed on the GPU (tests/suite/vptq.rs,
            // tests/suite/aqlm.rs).
            if dir.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with("vptq") || n.starts_with("aqlm")
            }) {
                continue;
            }
            multiplied += check_model(&dir.join("model"), &decoders, &mut rng);
        }
        // 245 Linears of 35 fixtures today and SVDQuant's 32 modules of
        // its 2 (none where the weights are stacks of experts or
        // transforms).
        assert!(multiplied >= 277, "{multiplied} Linears multiplied");
    });
}

/// Values near f32's largest: x scaled so that the sums reach about 10³⁷
/// stay finite and within the bound; a weight the GPU does not multiply
/// (a copied tensor, a stack of experts whole) and an x of the wrong length are
/// one-line errors.
#[test]
fn matmul_near_overflow_and_refusals() {
    gpu_test(|adapter| {
        let decoder = GpuDecoder::open(&adapter).unwrap();
        let model = Model::open(fixtures().join("w4a16-g128/model"), DtypeChoice::Auto).unwrap();
        let name = linears(&model).into_iter().next().unwrap();
        let info = model.info(&name).unwrap();
        let (n, k) = (info.shape[0], info.shape[1]);
        let w = model.decode_f32(&name, BackendChoice::Cpu).unwrap();
        let packed = model.upload_packed(&name, &decoder).unwrap();
        let mut rng = Rng::new(0x5EED_6E3F_0000_0002);
        let x = random_x(&mut rng, 2, k, 1e36);
        let want = reference(&w, &x, None, (2, n, k));
        let gpu = decoder.matmul(&packed, &x, 2).unwrap();
        assert!(gpu.iter().all(|v| v.is_finite()), "overflowed");
        assert!(
            want.iter().any(|(y, _)| y.abs() > 1e36),
            "not near overflow"
        );
        assert_within(&gpu, &want, "near overflow on the GPU");
        assert_within(
            &model.matmul_cpu(&name, &x, 2).unwrap(),
            &want,
            "near overflow on the CPU",
        );

        let e = model
            .upload_packed("model.embed_tokens.weight", &decoder)
            .unwrap_err();
        assert_eq!(e.rule, Rule::Argument, "{e}");
        assert!(e.to_string().contains("not a quantized weight"), "{e}");
        // A stack of experts as a whole: one line naming the tensor.
        let moe = Model::open(fixtures().join("gpt-oss-mxfp4/model"), DtypeChoice::Auto).unwrap();
        let t = moe.quantized().find(|t| t.shape.len() == 3).unwrap();
        let e = moe.upload_packed(&t.name, &decoder).unwrap_err();
        assert_eq!(e.rule, Rule::Argument, "{e}");
        assert!(
            e.to_string().contains(&t.name) && !e.to_string().contains('\n'),
            "{e}"
        );
        let e = decoder.matmul(&packed, &x[..k], 2).unwrap_err();
        assert_eq!(e.rule, Rule::Argument, "{e}");
        // m times k past usize: refused, not wrapped (nor a debug panic).
        for m in [usize::MAX, usize::MAX / k + 1] {
            let e = decoder.matmul(&packed, &x[..k], m).unwrap_err();
            assert_eq!(e.rule, Rule::Argument, "{e}");
            let e = model.matmul_cpu(&name, &x[..k], m).unwrap_err();
            assert_eq!(e.rule, Rule::Argument, "{e}");
        }
        let e = model.matmul_cpu(&name, &x[..k + 1], 1).unwrap_err();
        assert_eq!(e.rule, Rule::Argument, "{e}");

        // An app's buffers that the product cannot bind: without STORAGE,
        // or x and y one buffer. An error of the call, not a validation
        // error of the app's device (which panics by default).
        use wgpu::BufferUsages as U;
        let buffer = |usage: U| {
            decoder.device().create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: (8 * n.max(k)) as u64,
                usage,
                mapped_at_creation: false,
            })
        };
        let (good, plain) = (
            buffer(U::STORAGE | U::COPY_SRC),
            buffer(U::COPY_SRC | U::COPY_DST),
        );
        let other = buffer(U::STORAGE);
        for (x, y, rule) in [
            (&plain, &good, "x"),
            (&good, &plain, "y"),
            (&good, &good, "one buffer"),
        ] {
            let mut encoder = decoder.device().create_command_encoder(&Default::default());
            let e = decoder
                .record_matmul(&mut encoder, &packed, x, y, 1)
                .unwrap_err();
            assert_eq!(e.rule, Rule::Argument, "{e}");
            assert!(
                e.to_string().contains(rule) && !e.to_string().contains('\n'),
                "{e}"
            );
        }
        let mut encoder = decoder.device().create_command_encoder(&Default::default());
        decoder
            .record_matmul(&mut encoder, &packed, &good, &other, 1)
            .unwrap();
    });
}

/// A Linear whose inputs are no multiple of a workgroup's words (1000
/// inputs: 125 words, more than a GPU row's 64 invocations take at once,
/// in groups of 40, which a step of 64 words does not keep in place: a
/// group stepped one column too late or early is caught), whose outputs
/// are no multiple of a workgroup's rows (37), with a bias: within the
/// bound on both sides.
#[test]
fn matmul_of_odd_shapes_with_a_bias() {
    use crate::common::producer::pack_fields;
    use crate::common::{ct_config, write_checkpoint, Tensor};
    gpu_test(|adapter| {
        let decoders = decoders(&adapter);
        let tmp = tempfile::tempdir().unwrap();
        let (n, k, g) = (37usize, 1000usize, 40usize);
        let mut rng = Rng::new(0x5EED_6E3F_0000_0003);
        let m = "model.layers.0.mlp.down_proj";
        let words: Vec<u8> = (0..n)
            .flat_map(|_| {
                let fields: Vec<u32> = (0..k).map(|_| rng.below(16) as u32).collect();
                pack_fields(&fields, 4, false)
            })
            .flat_map(u32::to_le_bytes)
            .collect();
        let bf16 = |rng: &mut Rng, count: usize, top: u16| -> Vec<u8> {
            (0..count)
                .flat_map(|_| {
                    ((top + rng.below(0x80) as u16) | ((rng.below(2) as u16) << 15)).to_le_bytes()
                })
                .collect()
        };
        let shape: Vec<u8> = [n as i64, k as i64]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let tensors = [
            Tensor::new(format!("{m}.weight_packed"), "I32", &[n, k / 8], words),
            Tensor::new(
                format!("{m}.weight_scale"),
                "BF16",
                &[n, k / g],
                bf16(&mut rng, n * k / g, 0x3C00),
            ),
            Tensor::new(format!("{m}.weight_shape"), "I64", &[2], shape),
            Tensor::new(format!("{m}.bias"), "BF16", &[n], bf16(&mut rng, n, 0x3F00)),
        ];
        let weights = serde_json::json!({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": g});
        let dir = tmp.path().join("odd");
        write_checkpoint(
            &dir,
            &tensors,
            ct_config("pack-quantized", weights, "0.19.0"),
        );
        let model = Model::open(&dir, DtypeChoice::Auto).unwrap();
        let name = format!("{m}.weight");
        let w = model.decode_f32(&name, BackendChoice::Cpu).unwrap();
        let bias = model
            .decode_f32(&format!("{m}.bias"), BackendChoice::Cpu)
            .unwrap();
        let packs = decoders
            .each_ref()
            .map(|d| (d, model.upload_packed(&name, d).unwrap()));
        for rows in [1, 9, 64] {
            let x = random_x(&mut rng, rows, k, 3.0);
            let want = reference(&w, &x, Some(&bias), (rows, n, k));
            for (i, (decoder, packed)) in packs.iter().enumerate() {
                assert_within(
                    &decoder.matmul(packed, &x, rows).unwrap(),
                    &want,
                    &format!("m={rows} on GPU decoder {i}"),
                );
            }
            assert_within(
                &model.matmul_cpu(&name, &x, rows).unwrap(),
                &want,
                &format!("m={rows} on the CPU"),
            );
        }
    });
}

/// The bench's dense baseline (`gemv_dense`: on a GPU's geometry four
/// words a load where rows hold runs of 8 values, else a word a load)
/// multiplies by the whole weight it is given: within the bound of an f64
/// product of the same bf16 values, so that its timings are of a product.
#[test]
fn dense_baseline_keeps_to_the_bound() {
    gpu_test(|adapter| {
        let decoders = decoders(&adapter);
        let mut rng = Rng::new(0x5EED_DE45_0000_0001);
        // 1000 inputs: runs of 8 values; 998: not.
        for (n, k) in [(37usize, 1000usize), (5, 998)] {
            let bits: Vec<u16> = (0..n * k)
                .map(|_| 0x3c00 | rng.below(0x200) as u16 | ((rng.below(2) as u16) << 15))
                .collect();
            let w: Vec<f32> = bits
                .iter()
                .map(|&b| f32::from_bits((b as u32) << 16))
                .collect();
            let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
            for (i, decoder) in decoders.iter().enumerate() {
                let dense = decoder.upload_dense_bf16((n, k), &bytes).unwrap();
                for m in [1, 3, 17] {
                    let x = random_x(&mut rng, m, k, 1.0);
                    assert_within(
                        &decoder.matmul(&dense, &x, m).unwrap(),
                        &reference(&w, &x, None, (m, n, k)),
                        &format!("dense {n}x{k}, m={m} on GPU decoder {i}"),
                    );
                }
            }
        }
    });
}

/// Packs along the inputs (GPTQ's strided words, AutoAWQ's transposed
/// ones, both rewritten in output order at upload) of a Linear whose dense
/// weight spans several decode chunks (4096 outputs of 2304 inputs: 18 MiB
/// in bf16): resident once, within an eighth of their stored bytes (GPTQ's
/// zero points are unpacked, an i32 each), not once per chunk, and
/// multiplied within the bound.
#[test]
fn packs_along_the_inputs_are_resident_once() {
    use crate::common::{write_json, write_safetensors, Tensor};
    gpu_test(|adapter| {
        let decoder = GpuDecoder::open(&adapter).unwrap();
        let mut rng = Rng::new(0x5EED_6E3F_0000_0005);
        let (n, k, g) = (4096usize, 2304usize, 128usize);
        let m = "model.layers.0.mlp.down_proj";
        let mut words =
            |count: usize| -> Vec<u32> { (0..count).map(|_| rng.next() as u32).collect() };
        let scales: Vec<f32> = (0..k / g * n).map(|i| (1 + i % 7) as f32 / 256.0).collect();
        let gptq = vec![
            Tensor::u32_words(format!("{m}.qweight"), &[k / 8, n], &words(k / 8 * n)),
            Tensor::u32_words(
                format!("{m}.qzeros"),
                &[k / g, n / 8],
                &vec![0x7777_7777; k / g * n / 8],
            ),
            Tensor::f16(format!("{m}.scales"), &[k / g, n], &scales),
            Tensor::i32(
                format!("{m}.g_idx"),
                &[k],
                &(0..k).map(|i| (i / g) as i32).collect::<Vec<_>>(),
            ),
        ];
        let awq = vec![
            Tensor::u32_words(format!("{m}.qweight"), &[k, n / 8], &words(k * n / 8)),
            Tensor::u32_words(
                format!("{m}.qzeros"),
                &[k / g, n / 8],
                &words(k / g * n / 8),
            ),
            Tensor::f16(format!("{m}.scales"), &[k / g, n], &scales),
        ];
        let configs = [
            serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": g, "sym": true,
                               "desc_act": false, "checkpoint_format": "gptq"}),
            serde_json::json!({"quant_method": "awq", "bits": 4, "group_size": g,
                               "zero_point": true, "version": "gemm"}),
        ];
        for (tensors, config) in [gptq, awq].iter().zip(configs) {
            let tmp = tempfile::tempdir().unwrap();
            write_safetensors(&tmp.path().join("model.safetensors"), tensors);
            write_json(
                &tmp.path().join("config.json"),
                &serde_json::json!({"architectures": ["LlamaForCausalLM"],
                                    "torch_dtype": "float16", "quantization_config": config}),
            );
            let what = config["quant_method"].to_string();
            let model = Model::open(tmp.path(), DtypeChoice::Auto).unwrap();
            let name = format!("{m}.weight");
            let packed = model.upload_packed(&name, &decoder).unwrap();
            let stored: u64 = tensors.iter().map(|t| t.data.len() as u64).sum();
            assert!(
                packed.gpu_bytes() <= stored + stored / 8,
                "{what}: {} bytes on the GPU for {stored} stored",
                packed.gpu_bytes()
            );
            let w = model.decode_f32(&name, BackendChoice::Cpu).unwrap();
            let x = random_x(&mut rng, 2, k, 1.0);
            let want = reference(&w, &x, None, (2, n, k));
            assert_within(&decoder.matmul(&packed, &x, 2).unwrap(), &want, &what);
        }
    });
}

/// 3-D stacks of experts, one expert a product, as the model computes it:
/// GPT-OSS's (dense `[E, in, out]`, `x·W[e] + b[e]`) and a
/// compressed-tensors int4 stack (dense `[E, out, in]`, `x·W[e]ᵀ`, outputs
/// and inputs off the workgroup's and group's widths), on both geometries
/// and the CPU within the bound; a stack taken whole, an expert past the
/// last and an expert of a 2-D weight are one-line errors.
#[test]
fn matmul_of_experts_one_at_a_time() {
    use crate::common::producer::pack_fields;
    use crate::common::{ct_config, write_checkpoint, Tensor};
    gpu_test(|adapter| {
        let decoders = decoders(&adapter);
        let mut rng = Rng::new(0x5EED_6E3F_0000_0006);
        let tmp = tempfile::tempdir().unwrap();
        let (e, n, k, g) = (3usize, 37usize, 200usize, 40usize);
        let m = "model.layers.0.mlp.experts.gate_up_proj";
        let words: Vec<u8> = (0..e * n)
            .flat_map(|_| {
                let fields: Vec<u32> = (0..k).map(|_| rng.below(16) as u32).collect();
                pack_fields(&fields, 4, false)
            })
            .flat_map(u32::to_le_bytes)
            .collect();
        let scales: Vec<u8> = (0..e * n * k / g)
            .flat_map(|_| (0x3C00 + rng.below(0x80) as u16).to_le_bytes())
            .collect();
        let shape: Vec<u8> = [e as i64, n as i64, k as i64]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let tensors = [
            Tensor::new(format!("{m}.weight_packed"), "I32", &[e, n, k / 8], words),
            Tensor::new(format!("{m}.weight_scale"), "BF16", &[e, n, k / g], scales),
            Tensor::new(format!("{m}.weight_shape"), "I64", &[3], shape),
        ];
        let weights = serde_json::json!({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": g});
        let dir = tmp.path().join("stack");
        write_checkpoint(
            &dir,
            &tensors,
            ct_config("pack-quantized", weights, "0.19.0"),
        );
        let cases = [(fixtures().join("gpt-oss-mxfp4/model"), true), (dir, false)];
        for (dir, transposed) in cases {
            let model = Model::open(&dir, DtypeChoice::Auto).unwrap();
            let stacks: Vec<_> = model.quantized().filter(|t| t.shape.len() == 3).collect();
            assert!(!stacks.is_empty(), "{}: no stack", dir.display());
            for t in stacks {
                let (experts, rows, cols) = (t.shape[0], t.shape[1], t.shape[2]);
                let (n, k) = if transposed {
                    (cols, rows)
                } else {
                    (rows, cols)
                };
                let dense = model.decode_f32(&t.name, BackendChoice::Cpu).unwrap();
                let bias = model
                    .decode_f32(&format!("{}_bias", t.name), BackendChoice::Cpu)
                    .ok();
                for x in 0..experts {
                    let w = &dense[x * rows * cols..(x + 1) * rows * cols];
                    // W[e] with rows the outputs.
                    let w: Vec<f32> = match transposed {
                        true => (0..n * k).map(|i| w[(i % k) * n + i / k]).collect(),
                        false => w.to_vec(),
                    };
                    let b = bias.as_ref().map(|b| &b[x * n..(x + 1) * n]);
                    let packs = decoders
                        .each_ref()
                        .map(|d| model.upload_expert(&t.name, x, d).unwrap());
                    for rows_x in [1, 5] {
                        let what = format!("{} expert {x} m={rows_x}", t.name);
                        let xs = random_x(&mut rng, rows_x, k, 1.0);
                        let want = reference(&w, &xs, b, (rows_x, n, k));
                        for (i, (d, packed)) in decoders.iter().zip(&packs).enumerate() {
                            assert_eq!((packed.n, packed.k), (n, k), "{what}");
                            let got = d.matmul(packed, &xs, rows_x).unwrap();
                            assert_within(&got, &want, &format!("{what} on GPU decoder {i}"));
                        }
                        let cpu = model.matmul_cpu_expert(&t.name, x, &xs, rows_x).unwrap();
                        assert_within(&cpu, &want, &format!("{what} on the CPU"));
                    }
                }
                for e in [
                    model.upload_packed(&t.name, &decoders[0]).unwrap_err(),
                    model
                        .upload_expert(&t.name, experts, &decoders[0])
                        .unwrap_err(),
                    model
                        .matmul_cpu_expert(&t.name, experts, &[0.0; 1], 1)
                        .unwrap_err(),
                ] {
                    assert_eq!(e.rule, Rule::Argument, "{e}");
                    assert!(
                        e.to_string().contains(&t.name) && !e.to_string().contains('\n'),
                        "{e}"
                    );
                }
            }
        }
        let model = Model::open(fixtures().join("w4a16-g128/model"), DtypeChoice::Auto).unwrap();
        let name = model.quantized().next().unwrap().name;
        let e = model.upload_expert(&name, 0, &decoders[0]).unwrap_err();
        assert!(e.to_string().contains("not a stack of experts"), "{e}");
    });
}

/// `examples/matvec.rs` on the sample: a line per quantized Linear, each
/// with its largest GPU-to-CPU difference, and success (it fails when a
/// result leaves the bound).
#[test]
fn matvec_example_multiplies_every_quantized_linear_of_the_sample() {
    gpu_test(|_| {
        let o = std::process::Command::new(crate::common::example("matvec"))
            .output()
            .unwrap();
        crate::common::cli::ok(&o, "matvec example");
        let out = crate::common::cli::stdout(&o);
        let sample = Model::open(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-w4a16"),
            DtypeChoice::Auto,
        )
        .unwrap();
        let names: Vec<String> = sample.quantized().map(|t| t.name).collect();
        assert!(names.len() >= 7, "{names:?}");
        for name in &names {
            let line = out
                .lines()
                .find(|l| l.starts_with(name.as_str()))
                .unwrap_or_else(|| panic!("no line for {name}: {out}"));
            assert!(line.contains("max |gpu - cpu| = "), "{line}");
        }
    });
}

/// `stream::Linears` over files read piece by piece (what the browser
/// runs): the Model's Linears, the same bits from the same packs on the
/// GPU and on the CPU, and each Linear read alone: its own stored tensors
/// and no other's, the few planning reads once at the start.
#[test]
fn linears_read_piece_by_piece_multiply_as_the_model_does() {
    use crate::stream::DirFiles;
    use wgpu_dequant::Linears;
    gpu_test(|adapter| {
        let decoder = GpuDecoder::open(&adapter).unwrap();
        let mut rng = Rng::new(0x5EED_6E3F_0000_0004);
        // A GGUF file's tensors are stored under other names than their
        // Linears': its reads are bounded by the tensor's own bytes below.
        for (cases, f) in [
            ("tests/fixtures", "sharded-nvfp4a16"),
            ("tests/fixtures", "gptq-w4-g128-actorder"),
            ("tests/gguf", "gguf-q4_k-llama"),
        ] {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(cases)
                .join(f)
                .join("model");
            let gguf = cases == "tests/gguf";
            let model = Model::open(&dir, DtypeChoice::Auto).unwrap();
            let stored = wgpu_dequant::Checkpoint::open(&dir).unwrap();
            let files = DirFiles::new(&dir);
            let linears = pollster::block_on(Linears::open(&files, DtypeChoice::Auto)).unwrap();
            let names: Vec<String> = model.quantized().map(|t| t.name).collect();
            let listed: Vec<String> = linears.quantized().iter().map(|t| t.name.clone()).collect();
            assert_eq!(listed, names, "{f}");
            for name in &names {
                let module = name.strip_suffix(".weight").unwrap();
                let own: u64 = stored
                    .names()
                    .into_iter()
                    .filter(|t| t.strip_prefix(module).is_some_and(|r| r.starts_with('.')))
                    .map(|t| stored.get(t).unwrap().len() as u64)
                    .sum();
                let info = model.info(name).unwrap();
                // GGUF's biggest block: Q6_K's 210 bytes for 256 weights.
                let own = match gguf {
                    true => (info.shape.iter().product::<usize>() * 210 / 256) as u64,
                    false => own,
                };
                let before: u64 = files.read.borrow().values().sum();
                let packed = pollster::block_on(linears.upload_packed(name, &decoder)).unwrap();
                let read = files.read.borrow().values().sum::<u64>() - before;
                assert!(
                    read > 0 && read <= own,
                    "{f} {name}: read {read} bytes, its tensors hold {own}"
                );
                let k = packed.k;
                let x = random_x(&mut rng, 3, k, 1.0);
                let want = decoder
                    .matmul(&model.upload_packed(name, &decoder).unwrap(), &x, 3)
                    .unwrap();
                let got = decoder.matmul(&packed, &x, 3).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{f} {name}: on the GPU");
                let cpu = pollster::block_on(linears.matmul_cpu(name, &x, 3)).unwrap();
                assert_eq!(
                    bits(&cpu),
                    bits(&model.matmul_cpu(name, &x, 3).unwrap()),
                    "{f} {name}: on the CPU"
                );
            }
            let float = if gguf {
                "model.norm.weight"
            } else {
                "lm_head.weight"
            };
            let e = pollster::block_on(linears.upload_packed(float, &decoder)).unwrap_err();
            assert_eq!(e.rule, Rule::Argument, "{e}");
        }
    });
}

/// GGUF's cases with quantized Linears under transformers' names: the
/// fixtures (Q8_0, Q4_K, IQ2_XXS), `hf-llama`, whose quantized Q and K
/// rows `dequantize` writes in another order than they are stored, and
/// `hf-qwen3moe`, whose experts are each a Linear of rows of a stack.
const GGUF_CASES: [&str; 5] = [
    "gguf-q4_k-llama",
    "gguf-q8_0-qwen2",
    "gguf-iq2_xxs-llama",
    "hf-llama",
    "hf-qwen3moe",
];

/// `gguf-types`' and `gguf-q1q2`'s tensors of every quantized type (`[6, 512]` each) as the
/// down projections of a llama model's layers, `blk.{i}.ffn_down.weight`,
/// in a GGUF file written into `dir`: their types, in layer order.
fn gguf_types_as_linears(dir: &Path) -> Vec<String> {
    let mut w = crate::gguf::Writer {
        kvs: vec![],
        tensors: vec![],
        data: vec![],
        version: 3,
    };
    w.kv("general.architecture", 8, crate::gguf::string("llama"));
    w.kv("general.alignment", 4, 32u32.to_le_bytes().to_vec());
    let mut names = Vec::new();
    // Bonsai's Q1_0 and Q2_0 are in a fixture of their own.
    for fixture in ["gguf-types", "gguf-q1q2"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/gguf")
            .join(fixture);
        let model = wgpu_dequant::gguf::Model::open(dir.join("model/model.gguf")).unwrap();
        let file = model.files[0].bytes();
        for t in model.tensors.iter().filter(|t| t.ty.block().0 > 1) {
            let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
            let name = format!("blk.{}.ffn_down.weight", names.len());
            w.tensor(&name, &shape, t.ty as u32, w.data.len() as u64);
            let at = t.offset as usize;
            w.data.extend(&file[at..at + t.size as usize]);
            w.data.resize(w.data.len().next_multiple_of(32), 0);
            names.push(t.ty.to_string());
        }
    }
    w.kv(
        "llama.block_count",
        4,
        (names.len() as u32).to_le_bytes().to_vec(),
    );
    w.write(&dir.join("model.gguf"));
    names
}

/// Every GGUF type in the product API: `Model::quantized` lists each
/// quantized tensor (not the float ones), and the products with it (and
/// its bias, qwen2's) for one row of x and 5, on the CPU and on the GPU
/// (a CPU adapter's geometry and a GPU's), equal x·Wᵀ of the weight
/// `Model::decode_f32` gives, within the bound.
#[test]
fn gguf_weights_multiply_as_dequantize_writes_them() {
    let tmp = tempfile::tempdir().unwrap();
    let types = gguf_types_as_linears(tmp.path());
    let mut dirs: Vec<std::path::PathBuf> = GGUF_CASES
        .iter()
        .map(|case| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/gguf")
                .join(case)
                .join("model")
        })
        .collect();
    dirs.push(tmp.path().to_path_buf());
    // Each case's Linears, their dense weights and one x per row count.
    type Weight = (Vec<f32>, Option<Vec<f32>>);
    type Case = (Model, Vec<(String, Weight, Vec<(usize, Vec<f32>)>)>);
    let mut rng = Rng::new(0x5EED_6E3F_0000_0009);
    let cases: Vec<Case> = dirs
        .iter()
        .map(|dir| {
            let model = Model::open(dir, DtypeChoice::Auto).unwrap();
            let names = linears(&model);
            assert!(!names.is_empty(), "{}: no quantized weight", dir.display());
            let linears = names
                .into_iter()
                .map(|name| {
                    let w = model.decode_f32(&name, BackendChoice::Cpu).unwrap();
                    let bias = name.replace(".weight", ".bias");
                    let bias = model.decode_f32(&bias, BackendChoice::Cpu).ok();
                    let k = model.info(&name).unwrap().shape[1];
                    let xs = [1, 5].map(|m| (m, random_x(&mut rng, m, k, 1.0)));
                    (name, (w, bias), xs.to_vec())
                })
                .collect();
            (model, linears)
        })
        .collect();
    // gguf-types' down projections: one of each type, listed by name.
    let (_, linears) = &cases[cases.len() - 1];
    let mut want: Vec<String> = (0..types.len())
        .map(|i| format!("model.layers.{i}.mlp.down_proj.weight"))
        .collect();
    want.sort();
    let got: Vec<&String> = linears.iter().map(|(name, _, _)| name).collect();
    assert_eq!(got, want.iter().collect::<Vec<_>>(), "{types:?}");
    // Where W holds infinities (gguf-types' MXFP4 rows with e8m0 scales of
    // 2^125), an output is NaN or infinite as the f64 one is.
    let assert_within = |got: &[f32], want: &[(f64, f64)], what: &str| {
        let finite: Vec<bool> = want.iter().map(|(y, _)| y.is_finite()).collect();
        for ((g, (y, _)), _) in got.iter().zip(want).zip(&finite).filter(|(_, f)| !**f) {
            assert!(
                (g.is_nan() && y.is_nan()) || *g as f64 == *y,
                "{what}: {g}, f64 {y}"
            );
        }
        let keep = |i: &usize| finite[*i];
        let got: Vec<f32> = (0..got.len()).filter(keep).map(|i| got[i]).collect();
        let want: Vec<(f64, f64)> = (0..want.len()).filter(keep).map(|i| want[i]).collect();
        assert_within(&got, &want, what);
    };
    let check = |decoders: &[GpuDecoder]| {
        for (model, linears) in &cases {
            for (name, (w, bias), xs) in linears {
                let info = model.info(name).unwrap();
                let (n, k) = (info.shape[0], info.shape[1]);
                let packs: Vec<_> = decoders
                    .iter()
                    .map(|d| model.upload_packed(name, d).unwrap())
                    .collect();
                for (m, x) in xs {
                    let want = reference(w, x, bias.as_deref(), (*m, n, k));
                    let what = format!("{} {name} [{n}, {k}] m={m}", model.format());
                    for (d, (decoder, packed)) in decoders.iter().zip(&packs).enumerate() {
                        let got = decoder.matmul(packed, x, *m).unwrap();
                        assert_within(&got, &want, &format!("{what} on GPU decoder {d}"));
                    }
                    if decoders.is_empty() {
                        let got = model.matmul_cpu(name, x, *m).unwrap();
                        assert_within(&got, &want, &format!("{what} on the CPU"));
                    }
                }
            }
        }
    };
    check(&[]);
    // The adapter's own geometry and a GPU's: the two ways the products
    // read a row's words (without subgroups reads them as the first does).
    gpu_test(|adapter| {
        let [own, _, gpu] = decoders(&adapter);
        check(&[own, gpu]);
    });
}

mod experts;
mod products;

/// SVDQuant's modules whole: every Linear of both fixtures (fused targets'
/// modules, bands of two targets' rows, two targets' inputs side by side,
/// a bias with an activation shift folded in) multiplied with its low-rank
/// branch and smoothing, on the CPU and the GPU, within the bound of
/// `x·Wᵀ + bias` for the W and bias `dequantize` writes.
#[test]
fn svdquant_products_include_the_low_rank_branch() {
    gpu_test(|adapter| {
        let decoders = decoders(&adapter);
        let mut rng = Rng::new(0x5EED_6E3F_0000_0006);
        for fixture in ["svdq-fp4-g16-packed", "svdq-int4-g64-logical"] {
            let dir = fixtures().join(fixture).join("model");
            let model = Model::open(&dir, DtypeChoice::Auto).unwrap();
            let names = linears(&model);
            // 8 modules in each of 2 blocks, every one of them a product.
            assert_eq!(names.len(), 16, "{fixture}: {names:?}");
            for name in &names {
                let info = model.info(name).unwrap();
                let (n, k) = (info.shape[0], info.shape[1]);
                let w = model.decode_f32(name, BackendChoice::Cpu).unwrap();
                let bias = model
                    .decode_f32(&name.replace(".weight", ".bias"), BackendChoice::Cpu)
                    .ok();
                let packs: Vec<_> = decoders
                    .iter()
                    .map(|d| model.upload_packed(name, d).unwrap())
                    .collect();
                for m in [1, 5] {
                    let x = random_x(&mut rng, m, k, 1.0);
                    let want = reference(&w, &x, bias.as_deref(), (m, n, k));
                    let what = format!("{fixture} {name} [{n}, {k}] m={m}");
                    let cpu = model.matmul_cpu(name, &x, m).unwrap();
                    assert_within(&cpu, &want, &format!("{what} on the CPU"));
                    for (d, (decoder, packed)) in decoders.iter().zip(&packs).enumerate() {
                        let gpu = decoder.matmul(packed, &x, m).unwrap();
                        assert_within(&gpu, &want, &format!("{what} on GPU decoder {d}"));
                    }
                }
            }
        }
    });
}

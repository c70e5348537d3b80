//! Every reference checkpoint decodes to the bytes its producer's own
//! dequantizer returns (compared through the recorded SHA-256 digests).

use std::path::Path;

use crate::common::producer::Tensors;
use crate::common::{auto_digests, check_case, fixtures, gpu_test, CASES};
use serde_json::Value;
use wgpu_dequant::{dequantize, BackendChoice, DtypeChoice, Options, OutDtype};

#[test]
fn every_fixture_default_dtype_matches_bf16_reference() {
    for case in CASES {
        check_case(
            case,
            DtypeChoice::Auto,
            BackendChoice::Cpu,
            auto_digests(case),
            false,
        );
    }
}

#[test]
fn every_fixture_f32_matches_reference() {
    for case in CASES {
        if [
            "modelopt",
            "bnb-",
            "quark",
            "ct-transform",
            "deepseek-v4",
            "hqq",
            "sinq",
            "aqlm",
        ]
        .iter()
        .any(|p| case.starts_with(p))
        {
            // ModelOpt's, bitsandbytes', Quark's and transformers' FP8
            // (DeepSeek-V4, whose F32 copies stay F32) f32 references are
            // the f32 products themselves; a folded rotation's is the fold
            // rounded once to f32, whose own rounding to bf16 may differ
            // from the fold rounded once to bf16; HQQ computes in the output
            // dtype, its bf16 rounding each step; SINQ's f32 is its f32
            // product; AQLM's f32 is the model loaded in f32.
            check_case(
                case,
                DtypeChoice::Fixed(OutDtype::F32),
                BackendChoice::Cpu,
                "expected-f32.digests.json",
                false,
            );
        } else {
            check_case(
                case,
                DtypeChoice::Fixed(OutDtype::F32),
                BackendChoice::Cpu,
                auto_digests(case),
                true,
            );
        }
    }
}

/// DeepSeek-style FP8 decoded straight to f16 is what compressed-tensors'
/// `FP8BlockDequantizer(dtype=float16)` writes, on each backend (its
/// copies stay bf16; ours are cast, and checked against the copied input).
#[test]
fn fp8_block_f16_matches_reference_on_cpu() {
    fp8_block_f16_matches_reference(BackendChoice::Cpu);
}

#[test]
fn fp8_block_f16_matches_reference_on_gpu() {
    gpu_test(|_| fp8_block_f16_matches_reference(BackendChoice::Gpu));
}

fn fp8_block_f16_matches_reference(backend: BackendChoice) {
    check_case(
        "fp8-block-bf16",
        DtypeChoice::Fixed(OutDtype::F16),
        backend,
        "expected-f16.digests.json",
        false,
    );
}

/// ModelOpt FP8 decoded to f16 is what `FP8QTensor.dequantize(dtype=float16)`
/// writes: the scale rounded to f16, the product in f16 (copies cast).
#[test]
fn modelopt_fp8_f16_matches_reference_on_cpu() {
    modelopt_fp8_f16_matches_reference(BackendChoice::Cpu);
}

#[test]
fn modelopt_fp8_f16_matches_reference_on_gpu() {
    gpu_test(|_| modelopt_fp8_f16_matches_reference(BackendChoice::Gpu));
}

fn modelopt_fp8_f16_matches_reference(backend: BackendChoice) {
    check_case(
        "modelopt-fp8",
        DtypeChoice::Fixed(OutDtype::F16),
        backend,
        "expected-f16.digests.json",
        false,
    );
}

/// The FP8 family's fixtures in f32 on the GPU: ModelOpt's reference is the
/// f32 product; compressed-tensors' mxfp8 is its bf16 product widened.
#[test]
fn fp8_family_f32_matches_reference_on_gpu() {
    gpu_test(|_| {
        let cases = [
            "modelopt-fp8",
            "modelopt-int4-awq",
            "modelopt-w4a8-awq",
            "quark-fp8-per-channel",
            "quark-mxfp4",
        ];
        for case in cases {
            check_case(
                case,
                DtypeChoice::Fixed(OutDtype::F32),
                BackendChoice::Gpu,
                "expected-f32.digests.json",
                false,
            );
        }
        check_case(
            "ct-mxfp8",
            DtypeChoice::Fixed(OutDtype::F32),
            BackendChoice::Gpu,
            "expected-f32.digests.json",
            false,
        );
    });
}

const GPTQ: [&str; 2] = ["gptq-w4-g128", "gptq-w4-g128-actorder"];

/// transformers + bitsandbytes' own checkpoints: the two shared fixtures
/// (their references written by transformers' `dequantize()`, checked
/// against bitsandbytes' kernels) and two made by tests/bnb/make_fixture.py
/// (FP4, blocks crossing rows, bf16 quant storage, an f16 model; references
/// computed from the stored tensors with the kernels' arithmetic).
const BNB: [&str; 4] = [
    "bnb-nf4-dq-bf16",
    "bnb-int8-bf16",
    "bnb-fp4-bf16",
    "bnb-fp4-dq-bf16storage-f16",
];

/// Each decodes to its references in the model's dtype and in f32 (the
/// exact products), on each backend.
#[test]
fn bnb_fixtures_match_every_reference_on_cpu() {
    bnb_fixtures_match_every_reference(BackendChoice::Cpu);
}

#[test]
fn bnb_fixtures_match_every_reference_on_gpu() {
    gpu_test(|_| bnb_fixtures_match_every_reference(BackendChoice::Gpu));
}

fn bnb_fixtures_match_every_reference(backend: BackendChoice) {
    for case in BNB {
        for (dtype, digests) in [
            (DtypeChoice::Auto, auto_digests(case)),
            (
                DtypeChoice::Fixed(OutDtype::F32),
                "expected-f32.digests.json",
            ),
        ] {
            check_case(case, dtype, backend, digests, false);
        }
    }
}

/// GPTQModel's f16 checkpoints decode to its references in f16 (the
/// model's), bf16 and f32, on each backend: the f32 products rounded once.
#[test]
fn gptq_fixtures_match_every_reference_on_cpu() {
    gptq_fixtures_match_every_reference(BackendChoice::Cpu);
}

#[test]
fn gptq_fixtures_match_every_reference_on_gpu() {
    gpu_test(|_| gptq_fixtures_match_every_reference(BackendChoice::Gpu));
}

fn gptq_fixtures_match_every_reference(backend: BackendChoice) {
    for case in GPTQ {
        for (dtype, digests) in [
            (OutDtype::F16, "expected-f16.digests.json"),
            (OutDtype::Bf16, "expected-bf16.digests.json"),
            (OutDtype::F32, "expected-f32.digests.json"),
        ] {
            check_case(case, DtypeChoice::Fixed(dtype), backend, digests, false);
        }
    }
}

#[test]
fn sharded_output_keeps_shard_names_and_index() {
    let out = tempfile::tempdir().unwrap();
    let out = out.path().join("dense");
    let src = fixtures().join("sharded-nvfp4a16/model");
    dequantize(&src, &out, &Options::default()).unwrap();
    let index: Value =
        serde_json::from_slice(&std::fs::read(out.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    assert_eq!(
        map["model.layers.0.mlp.down_proj.weight"],
        "model-00002-of-00002.safetensors"
    );
    assert_eq!(
        map["model.layers.0.mlp.gate_proj.weight"],
        "model-00001-of-00002.safetensors"
    );
    assert!(!map
        .keys()
        .any(|k| k.contains("weight_packed") || k.contains("scale")));
    let total: u64 = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    .iter()
    .map(|f| {
        crate::common::read_tensors(&out.join(f))
            .values()
            .map(|t| t.2.len() as u64)
            .sum::<u64>()
    })
    .sum();
    assert_eq!(index["metadata"]["total_size"].as_u64(), Some(total));
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert!(cfg.get("quantization_config").is_none());
    assert_eq!(cfg["dtype"], "bfloat16", "the rest of config.json is kept");
    assert!(out.join("README.md").is_file(), "a model card is written");
    assert!(
        !out.join("recipe.yaml").exists(),
        "a recipe describes the quantization: not copied"
    );
    assert!(!Path::new(&out.join(".wgpu-dequant-partial")).exists());
}

/// f32 values of a little-endian F32 tensor.
fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Every tensor of `expected` is in `got` with its shape, within `1e-5` of
/// the tensor's largest magnitude (the low-rank product makes bit-exactness
/// depend on summation order: docs/formats.md#svdquant).
fn within_tolerance(case: &str, got: &Tensors, expected: &Tensors) {
    for (name, (dtype, shape, bytes)) in expected {
        let Some((gd, gs, gb)) = got.get(name) else {
            panic!("{case}: {name} missing from the output");
        };
        assert_eq!((gd, gs), (dtype, shape), "{case}: {name}");
        let (want, have) = (f32s(bytes), f32s(gb));
        let max = want
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()))
            .max(f32::MIN_POSITIVE);
        let worst = want
            .iter()
            .zip(&have)
            .map(|(a, b)| (a - b).abs() / max)
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-5,
            "{case}: {name} differs by {worst:e} of its largest magnitude"
        );
    }
}

const SVDQUANT: [&str; 2] = ["svdq-int4-g64-logical", "svdq-fp4-g16-packed"];

#[test]
fn svdquant_fixtures_match_dense_reference_on_cpu() {
    for case in SVDQUANT {
        let dir = fixtures().join(case);
        let expected =
            crate::common::read_tensors(&dir.join("expected-dense-f32/model.safetensors"));
        let cpu = crate::common::producer::decode_with(
            &dir.join("model"),
            OutDtype::F32,
            BackendChoice::Cpu,
        );
        within_tolerance(case, &cpu, &expected);
        let norms: Vec<&String> = cpu.keys().filter(|k| !expected.contains_key(*k)).collect();
        assert!(
            norms.iter().all(|k| k.contains(".norm.")),
            "{case}: only the unquantized norms are extra: {norms:?}"
        );
    }
}

/// The GPU gives the CPU's bytes on the SVDQuant fixtures, which match the
/// dense reference on the CPU (above).
#[test]
fn svdquant_fixtures_on_gpu_give_the_cpus_bytes() {
    gpu_test(|_| {
        for case in SVDQUANT {
            let dir = fixtures().join(case);
            for out in [OutDtype::F32, OutDtype::Bf16] {
                let gpu = crate::common::producer::decode_with(
                    &dir.join("model"),
                    out,
                    BackendChoice::Gpu,
                );
                let cpu = crate::common::producer::decode_with(
                    &dir.join("model"),
                    out,
                    BackendChoice::Cpu,
                );
                assert!(gpu == cpu, "{case} {out}: GPU bytes differ from the CPU's");
            }
        }
    });
}

#[test]
fn svdquant_default_dtype_is_the_models() {
    let dir = fixtures().join("svdq-int4-g64-logical/model");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    dequantize(
        &dir,
        &out,
        &Options {
            backend: BackendChoice::Cpu,
            ..Options::default()
        },
    )
    .unwrap();
    let got = crate::common::read_dir_tensors(&out);
    assert_eq!(got["blocks.0.attn.to_q.weight"].0, "BF16");
    assert_eq!(
        got["blocks.0.norm.weight"].0, "F32",
        "copied tensors keep their dtype"
    );
    assert!(
        !out.join("model.config.yaml").exists(),
        "the quantization sidecar is not copied"
    );
}

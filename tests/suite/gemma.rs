//! Gemma's own quantization (`quant_method: "gemma"`): the fixture that
//! tests/gemma/make_fixture.py built in the layout transformers'
//! `QuantizedLinear`/`QuantizedEmbedding` load (checked through
//! transformers' own loader) decodes to the digests of their own
//! dequantization (`_dequantize_weights(dtype)`, the embedding's `weight`)
//! in bf16, f16 and f32, on each backend; held-out checkpoints packed here (int4 low nibble
//! first minus 8, int2 bits 1:0 first minus 2, int8; padding fields at the
//! end of a row; per-row f32 scales, an embedding's scales per block) decode
//! to `q · s` rounded once; `module_quant_configs` is resolved as one
//! alternation searched in the name (leftmost match wins); the dropped
//! activation and KV-cache scales are named in warnings and `--strict`
//! refuses them; malformed checkpoints are refused by rule with nothing
//! written.

use std::path::Path;

use serde_json::{json, Value};
use wgpu_dequant::{BackendChoice, Dequantize, DtypeChoice, OutDtype, Rule};

use crate::common::cli::{self, error_line, run};
use crate::common::producer::{expect_decodes, gpu_gives_the_cpus_bytes, Want};
use crate::common::{
    check_digests, gpu_test, refused_by_rule, tensor_named as tensor, write_model, Rng, Tensor,
};

const CASE: &str = "gemma-w4-int2-int8-bf16";

#[test]
fn fixture_matches_transformers_on_cpu() {
    fixture_matches_transformers(BackendChoice::Cpu);
}

#[test]
fn fixture_matches_transformers_on_gpu() {
    gpu_test(|_| fixture_matches_transformers(BackendChoice::Gpu));
}

fn fixture_matches_transformers(backend: BackendChoice) {
    check_digests(
        CASE,
        backend,
        &[
            (DtypeChoice::Auto, "expected-bf16.digests.json"),
            (
                DtypeChoice::Fixed(OutDtype::F16),
                "expected-f16.digests.json",
            ),
            (
                DtypeChoice::Fixed(OutDtype::F32),
                "expected-f32.digests.json",
            ),
        ],
    );
}

/// The held-out model: hidden 10, q_proj 8x10, k_proj 4x10, o_proj 10x8,
/// down_proj 10x6, a vocabulary of 5.
fn config(qc: Value) -> Value {
    json!({
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "torch_dtype": "bfloat16",
        "hidden_size": 10,
        "intermediate_size": 6,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 4,
        "vocab_size": 5,
        "tie_word_embeddings": false,
        "quantization_config": qc,
    })
}

/// Keys chosen so that the leftmost match decides, not the key's order:
/// `k_proj` starts before `proj$` in `…k_proj`, `layers\.1\.mlp` before
/// `proj$` in `…layers.1.mlp.down_proj`.
fn gemma() -> Value {
    json!({
        "quant_method": "gemma",
        "num_bits": 4,
        "quantize_embeddings": true,
        "module_quant_configs": {
            "proj$": {"num_bits": 2},
            "k_proj": {"num_bits": 8},
            "layers\\.1\\.mlp": {"num_bits": 8},
        },
        "modules_to_not_convert": ["lm_head"],
    })
}

/// Module, rows, columns, bits (as the keys above resolve them), and for an
/// embedding its blocks a row.
const MODULES: [(&str, usize, usize, u32, Option<usize>); 5] = [
    ("model.layers.0.self_attn.q_proj", 8, 10, 2, None),
    ("model.layers.0.self_attn.k_proj", 4, 10, 8, None),
    ("model.layers.0.self_attn.o_proj", 10, 8, 2, None),
    ("model.layers.1.mlp.down_proj", 10, 6, 8, None),
    ("model.embed_tokens", 5, 10, 4, Some(2)),
];

/// Scales exact in bf16 and f16, so that the product rounds once.
const SCALES: [f32; 4] = [0.8359375, 1.703125, 0.0390625, 2.90625];

/// `8 / bits` fields a byte, the first in the low bits, a row's padding
/// fields filled with `pad`.
fn pack(codes: &[u32], rows: usize, cols: usize, bits: u32, pad: u32) -> Vec<u8> {
    let per = (8 / bits) as usize;
    let width = cols.div_ceil(per);
    let mut out = vec![0u8; rows * width];
    for r in 0..rows {
        for j in 0..width * per {
            let c = if j < cols { codes[r * cols + j] } else { pad };
            out[r * width + j / per] |= (c << (bits as usize * (j % per))) as u8;
        }
    }
    out
}

fn held_out(dir: &Path) -> (Vec<Want>, Vec<Tensor>) {
    held_out_with(dir, |_, _| {})
}

/// A held-out checkpoint, its tensors and config.json changed by `edit`
/// before they are written; the values each backend must give, before
/// rounding, and the tensors copied.
fn held_out_with(
    dir: &Path,
    edit: impl FnOnce(&mut Vec<Tensor>, &mut Value),
) -> (Vec<Want>, Vec<Tensor>) {
    let mut rng = Rng::new(0x6e33a);
    let mut tensors = vec![
        Tensor::bf16("model.norm.weight", &[10], &[1.5; 10]),
        Tensor::bf16("lm_head.weight", &[5, 10], &[0.25; 50]),
    ];
    let mut wants = Vec::new();
    for (i, (m, rows, cols, bits, blocks)) in MODULES.into_iter().enumerate() {
        let off = 1i64 << (bits - 1);
        let codes: Vec<u32> = (0..rows * cols)
            .map(|_| rng.below(1 << bits) as u32)
            .collect();
        let groups = blocks.unwrap_or(1);
        let scales: Vec<f32> = (0..rows * groups)
            .map(|j| SCALES[(i + j) % SCALES.len()])
            .collect();
        let vals = codes
            .iter()
            .enumerate()
            .map(|(j, &c)| {
                let (r, col) = (j / cols, j % cols);
                let q = if bits == 8 {
                    f32::from(c as u8 as i8)
                } else {
                    (i64::from(c) - off) as f32
                };
                q * scales[r * groups + col / (cols / groups)]
            })
            .collect();
        let (codes_name, scale_name) = match blocks {
            Some(_) => ("embedding_quantized", "embedding_scale"),
            None => ("weight", "weight_scale"),
        };
        let stored = if bits == 8 {
            Tensor::u8(
                format!("{m}.{codes_name}"),
                "I8",
                &[rows, cols],
                &codes.iter().map(|&c| c as u8).collect::<Vec<_>>(),
            )
        } else {
            let per = (8 / bits) as usize;
            Tensor::u8(
                format!("{m}.{codes_name}"),
                "U8",
                &[rows, cols.div_ceil(per)],
                &pack(&codes, rows, cols, bits, (1 << bits) - 1),
            )
        };
        tensors.push(stored);
        tensors.push(Tensor::f32(
            format!("{m}.{scale_name}"),
            &[rows, groups],
            &scales,
        ));
        if blocks.is_none() {
            let a = if i == 0 { 0.0625 } else { 0.0 };
            tensors.push(Tensor::f32(
                format!("{m}.input_activation_scale"),
                &[],
                &[a],
            ));
            tensors.push(Tensor::f32(
                format!("{m}.output_activation_scale"),
                &[],
                &[0.0],
            ));
        }
        wants.push(Want::weight(m, vec![rows, cols], vals));
    }
    tensors.push(Tensor::f32(
        "model.layers.0.self_attn.k_cache_scale",
        &[],
        &[0.5],
    ));
    let mut cfg = config(gemma());
    edit(&mut tensors, &mut cfg);
    write_model(dir, &tensors, &cfg);
    let copies = tensors
        .iter()
        .filter(|t| t.name.ends_with("norm.weight") || t.name == "lm_head.weight")
        .cloned()
        .collect();
    (wants, copies)
}

#[test]
fn held_out_int2_int4_int8_with_overrides_and_padding() {
    let tmp = tempfile::tempdir().unwrap();
    let (wants, copies) = held_out(tmp.path());
    expect_decodes("gemma held-out", tmp.path(), &wants, &copies);
}

#[test]
fn held_out_gpu_gives_the_cpus_bytes() {
    gpu_test(|_| {
        let tmp = tempfile::tempdir().unwrap();
        held_out(tmp.path());
        gpu_gives_the_cpus_bytes("gemma held-out", tmp.path());
    });
}

/// The dropped scales reach the library's summary by name, the CLI's
/// `warning:` lines, and `--strict` refuses them, writing nothing.
#[test]
fn dropped_activation_and_kv_cache_scales_are_named_strict_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let input = crate::common::fixtures().join(CASE).join("model");
    let summary = Dequantize::new()
        .backend(BackendChoice::Cpu)
        .run(&input, tmp.path().join("lib"))
        .unwrap();
    let details: Vec<&str> = summary.warnings.iter().map(|w| w.detail.as_str()).collect();
    assert!(summary.warnings.iter().all(|w| w.rule == Rule::Unstated));
    assert!(
        details
            .iter()
            .any(|d| d.contains("4 calibrated activation scales")
                && d.contains("model.layers.0.self_attn.q_proj.input_activation_scale")
                && d.contains("model.layers.0.self_attn.o_proj.output_activation_scale")
                && !d.contains("up_proj")),
        "{details:?}"
    );
    assert!(
        details.iter().any(|d| d.contains("4 KV-cache scales")
            && d.contains("model.layers.1.self_attn.v_cache_scale")),
        "{details:?}"
    );
    // The embedding's f32 embed_scale √63 is no bf16 value.
    assert!(
        details.iter().any(|d| d.contains("embed_scale")),
        "{details:?}"
    );
    assert_eq!(summary.warnings.len(), 3, "{details:?}");

    let o = run(&[
        "dequantize",
        input.to_str().unwrap(),
        "-o",
        tmp.path().join("cli").to_str().unwrap(),
        "-q",
    ]);
    cli::ok(&o, "dequantize");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.lines().any(|l| l.starts_with("warning: ")
            && l.contains("[HF-002]")
            && l.contains("k_cache_scale")),
        "{err}"
    );

    let strict = tmp.path().join("strict");
    let o = run(&[
        "dequantize",
        input.to_str().unwrap(),
        "-o",
        strict.to_str().unwrap(),
        "--strict",
    ]);
    error_line(&o, "--strict", "HF-002", &["quantization_config"]);
    assert!(!strict.exists());
}

/// Uncalibrated (zero) activation scales are dropped without a word: they
/// change nothing; the held-out's one calibrated scale and its KV-cache
/// scale are named.
#[test]
fn held_out_warnings_name_only_what_changes_the_model() {
    let tmp = tempfile::tempdir().unwrap();
    held_out(tmp.path());
    let summary = Dequantize::new()
        .backend(BackendChoice::Cpu)
        .dtype(DtypeChoice::Fixed(OutDtype::F32))
        .run(tmp.path(), tmp.path().join("out"))
        .unwrap();
    let details: Vec<&str> = summary.warnings.iter().map(|w| w.detail.as_str()).collect();
    assert_eq!(details.len(), 2, "{details:?}");
    assert!(details[0].contains(
        "1 calibrated activation scales dropped (model.layers.0.self_attn.q_proj.input_activation_scale)"
    ));
    assert!(details[1].contains("model.layers.0.self_attn.k_cache_scale"));
}

/// A valid held-out checkpoint broken one way: refused with `rule`, the
/// message naming `tensor`, nothing written.
fn refused(edit: impl FnOnce(&mut Vec<Tensor>, &mut Value), rule: Rule, tensor: &str) {
    refused_by_rule(
        |dir| {
            held_out_with(dir, edit);
        },
        rule,
        tensor,
    );
}

#[test]
fn malformed_checkpoints_are_refused_by_rule() {
    let q = "model.layers.0.self_attn.q_proj";
    let k = "model.layers.0.self_attn.k_proj";
    let e = "model.embed_tokens";
    let (qw, qs) = (format!("{q}.weight"), format!("{q}.weight_scale"));
    let kw = format!("{k}.weight");
    let es = format!("{e}.embedding_scale");
    // k_proj is int8 by the config; stored as uint8 packs.
    refused(|t, _| tensor(t, &kw).dtype = "U8", Rule::TensorDtype, &kw);
    // A scale per row stored flat ([out]): QuantizedLinear holds [out, 1].
    refused(
        |t, _| *tensor(t, &qs) = Tensor::f32(&qs, &[8], &[1.0; 8]),
        Rule::TensorShape,
        &qs,
    );
    // No weight_scale.
    refused(|t, _| t.retain(|x| x.name != qs), Rule::MissingTensor, &qs);
    // A scale stored as an integer.
    refused(
        |t, _| *tensor(t, &qs) = Tensor::u8(&qs, "U8", &[8, 1], &[1; 8]),
        Rule::TensorDtype,
        &qs,
    );
    // Three embedding blocks do not divide 10 columns.
    refused(
        |t, _| *tensor(t, &es) = Tensor::f32(&es, &[5, 3], &[1.0; 15]),
        Rule::TensorShape,
        &es,
    );
    // q_proj's packs one byte a row too wide for config.json's 10 inputs.
    refused(
        |t, _| *tensor(t, &qw) = Tensor::u8(&qw, "U8", &[8, 4], &[0; 32]),
        Rule::TensorShape,
        &qw,
    );
    // Truncated data: the header says one row more than the bytes hold.
    refused(
        |t, _| tensor(t, &qw).shape = vec![9, 3],
        Rule::Container,
        "",
    );
    // Widths the layers do not store, keys they do not take.
    refused(
        |_, c| c["quantization_config"]["num_bits"] = json!(3),
        Rule::Unsupported,
        "",
    );
    refused(
        |_, c| {
            c["quantization_config"]["module_quant_configs"]["k_proj"] =
                json!({"num_bits": 8, "group_size": 32})
        },
        Rule::Unsupported,
        "",
    );
    refused(
        |_, c| c["quantization_config"]["module_quant_configs"] = json!({"(": {"num_bits": 8}}),
        Rule::Config,
        "",
    );
}

/// Products straight from the packs (`Model::matmul_cpu`, and the GPU's
/// `matmul`) keep to the bound around the dense weight.
#[test]
fn products_of_packed_gemma_weights() {
    crate::matmul::products_keep_to_the_bound(
        CASE,
        &crate::common::fixtures().join(CASE).join("model"),
    );
    let tmp = tempfile::tempdir().unwrap();
    held_out(tmp.path());
    crate::matmul::products_keep_to_the_bound("gemma held-out", tmp.path());
}

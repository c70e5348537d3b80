//! BitNet b1.58 (`quant_method: "bitnet"`): the fixture that
//! tests/bitnet/make_fixture.py wrote with transformers' own `pack_weights`
//! decodes to the digests of transformers' `unpack_weights(weight) /
//! weight_scale`, on each backend; held-out checkpoints packed here the way
//! `pack_weights` packs (output row `i·P + j` in bits `2i..2i+2` of stored
//! row `j`, code = value + 1) decode to `f32(v / s)` (BitLinear) and
//! `f32(v · s)` (AutoBitLinear offline) rounded once; the run says the
//! activations' run-time quantization is not in the dense model, and
//! `--strict` refuses it; malformed checkpoints are refused by rule with
//! nothing written.

use std::path::Path;

use serde_json::{json, Value};
use wgpu_dequant::{BackendChoice, Dequantize, DtypeChoice, OutDtype, Rule};

use crate::common::cli::{self, error_line, run};
use crate::common::producer::{expect_decodes, gpu_gives_the_cpus_bytes, Want};
use crate::common::{
    check_digests, gpu_test, refused_by_rule, tensor_named as tensor, write_model, Rng, Tensor,
};

const CASE: &str = "bitnet-b158-bf16";

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
                DtypeChoice::Fixed(OutDtype::F32),
                "expected-f32.digests.json",
            ),
        ],
    );
}

/// The sizes of the held-out model: q_proj 8x8, k_proj 4x8 (one stored
/// row), down_proj 8x12.
fn config(qc: Value) -> Value {
    json!({
        "architectures": ["BitNetForCausalLM"],
        "model_type": "bitnet",
        "torch_dtype": "bfloat16",
        "hidden_size": 8,
        "intermediate_size": 12,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "quantization_config": qc,
    })
}

fn bitlinear() -> Value {
    json!({"quant_method": "bitnet", "linear_class": "bitlinear", "quantization_mode": "offline"})
}

const MODULES: [(&str, usize, usize); 3] = [
    ("model.layers.0.self_attn.q_proj", 8, 8),
    ("model.layers.0.self_attn.k_proj", 4, 8),
    ("model.layers.0.mlp.down_proj", 8, 12),
];

/// transformers' `pack_weights` for codes (value + 1) of an `[out, in]`
/// weight, `out` a multiple of 4.
fn pack(codes: &[u8], out: usize, cols: usize) -> Vec<u8> {
    let p = out / 4;
    let mut packed = vec![0u8; p * cols];
    for r in 0..out {
        for c in 0..cols {
            packed[(r % p) * cols + c] |= codes[r * cols + c] << (2 * (r / p));
        }
    }
    packed
}

/// A held-out checkpoint: each module's packed codes (a code 3 among them,
/// which `unpack_weights` reads as 2) and a bf16 scale that is no power of
/// two; returns the values each backend must give, before rounding.
fn held_out(dir: &Path, auto: bool) -> (Vec<Want>, Vec<Tensor>) {
    held_out_with(dir, auto, |_, _| {})
}

/// [`held_out`], its tensors and config.json changed by `edit` before they
/// are written.
fn held_out_with(
    dir: &Path,
    auto: bool,
    edit: impl FnOnce(&mut Vec<Tensor>, &mut Value),
) -> (Vec<Want>, Vec<Tensor>) {
    let mut rng = Rng::new(0xb17e7);
    let mut tensors = vec![Tensor::bf16("model.norm.weight", &[8], &[1.5; 8])];
    let mut wants = Vec::new();
    for (i, (m, out, cols)) in MODULES.into_iter().enumerate() {
        let mut codes: Vec<u8> = (0..out * cols).map(|_| rng.below(3) as u8).collect();
        codes[i] = 3;
        let s = [1.703125f32, 0.8359375, 2.90625][i];
        tensors.push(Tensor::u8(
            format!("{m}.weight"),
            "U8",
            &[out / 4, cols],
            &pack(&codes, out, cols),
        ));
        tensors.push(Tensor::bf16(format!("{m}.weight_scale"), &[1], &[s]));
        let vals = codes
            .iter()
            .map(|&c| {
                let v = c as f32 - 1.0;
                if auto {
                    v * s
                } else {
                    v / s
                }
            })
            .collect();
        wants.push(Want::weight(m, vec![out, cols], vals));
    }
    let qc = if auto {
        json!({"quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "offline"})
    } else {
        bitlinear()
    };
    let mut cfg = config(qc);
    edit(&mut tensors, &mut cfg);
    write_model(dir, &tensors, &cfg);
    (wants, vec![tensors.swap_remove(0)])
}

#[test]
fn held_out_bitlinear_divides_and_autobitlinear_multiplies() {
    for auto in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let (wants, copies) = held_out(tmp.path(), auto);
        expect_decodes(
            &format!("autobitlinear {auto}"),
            tmp.path(),
            &wants,
            &copies,
        );
    }
}

#[test]
fn held_out_gpu_gives_the_cpus_bytes() {
    gpu_test(|_| {
        for auto in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            held_out(tmp.path(), auto);
            gpu_gives_the_cpus_bytes(&format!("autobitlinear {auto}"), tmp.path());
        }
    });
}

/// The finding reaches the library's summary, the CLI's `warning:` line,
/// and `--strict` refuses it, writing nothing.
#[test]
fn activation_quantization_is_a_finding_strict_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let input = crate::common::fixtures().join(CASE).join("model");
    let summary = Dequantize::new()
        .backend(BackendChoice::Cpu)
        .run(&input, tmp.path().join("lib"))
        .unwrap();
    assert_eq!(summary.warnings.len(), 1, "{:?}", summary.warnings);
    let w = &summary.warnings[0];
    assert_eq!(w.rule, Rule::Unstated);
    assert!(
        w.detail.contains("int8 per token at run time"),
        "{}",
        w.detail
    );

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
            && l.contains("run time")),
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
    error_line(
        &o,
        "--strict",
        "HF-002",
        &["quantization_config", "run time"],
    );
    assert!(!strict.exists());
}

/// A valid held-out checkpoint broken one way: refused with `rule`, the
/// message naming `tensor`, nothing written.
fn refused(edit: impl FnOnce(&mut Vec<Tensor>, &mut Value), rule: Rule, tensor: &str) {
    refused_by_rule(
        |dir| {
            held_out_with(dir, false, edit);
        },
        rule,
        tensor,
    );
}

const K: &str = "model.layers.0.self_attn.k_proj";

#[test]
fn malformed_checkpoints_are_refused_by_rule() {
    let w = format!("{K}.weight");
    let s = format!("{K}.weight_scale");
    // Packed codes stored as int8.
    refused(|t, _| tensor(t, &w).dtype = "I8", Rule::TensorDtype, &w);
    // Packed rows that do not hold the config's k_proj (4 rows: one stored).
    refused(
        |_, c| c["num_key_value_heads"] = json!(2),
        Rule::TensorShape,
        &w,
    );
    // No weight_scale.
    refused(|t, _| t.retain(|x| x.name != s), Rule::MissingTensor, &s);
    // A scale per row, not per tensor.
    refused(
        |t, _| *tensor(t, &s) = Tensor::bf16(&s, &[4], &[1.0; 4]),
        Rule::TensorShape,
        &s,
    );
    // A zero scale: every weight infinite.
    refused(
        |t, _| *tensor(t, &s) = Tensor::bf16(&s, &[1], &[0.0]),
        Rule::TensorValue,
        &s,
    );
    // A scale stored as an integer.
    refused(
        |t, _| *tensor(t, &s) = Tensor::u8(&s, "U8", &[1], &[1]),
        Rule::TensorDtype,
        &s,
    );
    // Truncated data: the header says one row more than the bytes hold.
    refused(
        |t, c| {
            let x = tensor(t, &w);
            x.shape = vec![2, 8];
            c["num_key_value_heads"] = json!(2);
        },
        Rule::Container,
        "",
    );
    // Online mode stores no packs; use_rms_norm needs a norm a dense Linear lacks.
    refused(
        |_, c| c["quantization_config"]["quantization_mode"] = json!("online"),
        Rule::Unsupported,
        "",
    );
    refused(
        |_, c| c["quantization_config"]["use_rms_norm"] = json!(true),
        Rule::Unsupported,
        "",
    );
}

/// Products straight from the packs (`Model::matmul_cpu`, and the GPU's
/// `matmul`) keep to the bound around the dense weight, for the fixture and
/// both held-out kinds.
#[test]
fn products_of_packed_ternary_weights() {
    crate::matmul::products_keep_to_the_bound(
        CASE,
        &crate::common::fixtures().join(CASE).join("model"),
    );
    for auto in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        held_out(tmp.path(), auto);
        crate::matmul::products_keep_to_the_bound(&format!("autobitlinear {auto}"), tmp.path());
    }
}

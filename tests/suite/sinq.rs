//! SINQ (`quant_method: "sinq"`): the fixture tests/sinq/make_fixture.py
//! wrote with sinq 0.2.0 itself (the plain `sinq` method: 4-bit groups of
//! 32, 64 and 128, 2-bit and 1-bit, each with its Sinkhorn `scale2`)
//! decodes to the digests of `SINQLinear.dequantize()` in each output
//! dtype, on each backend; the output loads in transformers with no missing
//! or unexpected keys (the meta tensors, the sidecar and the rotary
//! buffers dropped); malformed checkpoints and the variants not decoded
//! yet are refused by rule with nothing written.

use std::path::Path;

use serde_json::{json, Value};
use wgpu_dequant::{BackendChoice, DtypeChoice, OutDtype, Rule};

use crate::common::producer::{decode_with, OUTS};
use crate::common::{
    check_case, copy_dir, dequantize_err, fixtures, gpu_test, read_dir_tensors, write_json,
    write_safetensors, Tensor,
};

const CASE: &str = "sinq-mixed-bf16";
const SHARD: &str = "model-00001-of-00001.safetensors";
const SIDECAR: &str = "model.safetensors.index.json.meta.json";

#[test]
fn fixture_matches_sinq_on_cpu() {
    fixture_matches_sinq(BackendChoice::Cpu);
}

#[test]
fn fixture_matches_sinq_on_gpu() {
    gpu_test(|_| fixture_matches_sinq(BackendChoice::Gpu));
}

fn fixture_matches_sinq(backend: BackendChoice) {
    check_case(
        CASE,
        DtypeChoice::Auto,
        backend,
        "expected-bf16.digests.json",
        false,
    );
    for (out, name) in [
        (OutDtype::Bf16, "bf16"),
        (OutDtype::F16, "f16"),
        (OutDtype::F32, "f32"),
    ] {
        let digests = format!("expected-{name}.digests.json");
        check_case(CASE, DtypeChoice::Fixed(out), backend, &digests, false);
    }
}

#[test]
fn gpu_gives_the_cpus_bytes() {
    gpu_test(|_| {
        let model = fixtures().join(CASE).join("model");
        for out in OUTS {
            let cpu = decode_with(&model, out, BackendChoice::Cpu);
            let gpu = decode_with(&model, out, BackendChoice::Gpu);
            assert!(gpu == cpu, "{out}: GPU bytes differ");
        }
    });
}

/// The dense output holds each Linear's `weight` under transformers' names
/// and none of the meta tensors or rotary buffers; config.json loses its
/// `quantization_config` and the sidecar is not copied.
#[test]
fn output_has_hf_names_and_no_meta() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    let input = fixtures().join(CASE).join("model");
    wgpu_dequant::dequantize(&input, &out, &crate::common::CPU_AUTO).unwrap();
    let got = read_dir_tensors(&out);
    for (name, (dtype, _, _)) in &got {
        assert!(name.ends_with(".weight"), "{name}");
        assert_eq!(dtype, "BF16", "{name}");
    }
    assert_eq!(got.len(), 7 + 3 + 2, "{:?}", got.keys());
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert!(cfg.get("quantization_config").is_none());
    assert!(!out.join(SIDECAR).exists());
}

/// The fixture copied, its tensors, sidecar and config.json changed by
/// `edit` (the index rewritten to the tensors left).
fn broken(dir: &Path, edit: impl FnOnce(&mut Vec<Tensor>, &mut Value, &mut Value)) {
    copy_dir(&fixtures().join(CASE).join("model"), dir);
    let mut tensors: Vec<Tensor> = read_dir_tensors(dir)
        .into_iter()
        .map(|(n, (dtype, shape, data))| {
            let dtype: &'static str = match dtype.as_str() {
                "BF16" => "BF16",
                "F16" => "F16",
                "F32" => "F32",
                "U8" => "U8",
                "I32" => "I32",
                other => panic!("{other}"),
            };
            Tensor::new(n, dtype, &shape, data)
        })
        .collect();
    let read = |name: &str| -> Value {
        serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap()
    };
    let mut cfg = read("config.json");
    let mut side = read(SIDECAR);
    edit(&mut tensors, &mut side, &mut cfg);
    write_safetensors(&dir.join(SHARD), &tensors);
    let map: serde_json::Map<String, Value> = tensors
        .iter()
        .map(|t| (t.name.clone(), json!(SHARD)))
        .collect();
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"metadata": {}, "weight_map": map}),
    );
    write_json(&dir.join("config.json"), &cfg);
    if side.is_null() {
        std::fs::remove_file(dir.join(SIDECAR)).unwrap();
    } else {
        write_json(&dir.join(SIDECAR), &side);
    }
}

/// The fixture broken one way: refused with `rule`, the one-line message
/// naming `what`, nothing written.
fn refused(edit: impl FnOnce(&mut Vec<Tensor>, &mut Value, &mut Value), rule: Rule, what: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    broken(&dir, edit);
    let e = dequantize_err(&dir);
    assert_eq!(e.rule, rule, "{e}");
    let line = e.to_string();
    assert!(!line.contains('\n') && line.contains(what), "{line}");
}

const Q: &str = "model.layers.0.self_attn.q_proj";
const K: &str = "model.layers.0.self_attn.k_proj";

fn tensor<'a>(tensors: &'a mut [Tensor], name: &str) -> &'a mut Tensor {
    tensors.iter_mut().find(|t| t.name == name).unwrap()
}

#[test]
fn malformed_checkpoints_are_refused_by_rule() {
    let w = format!("{Q}.W_q");
    let zero = format!("{Q}.meta.zero");
    let scale = format!("{K}.meta.scale");
    let scale2 = format!("{Q}.meta.scale2");
    // Packed codes stored as int32 (the same bytes).
    refused(
        |t, _, _| {
            let x = tensor(t, &w);
            x.dtype = "I32";
            x.shape = vec![32, 16];
        },
        Rule::TensorDtype,
        &w,
    );
    // Packed codes that do not hold the weight: half the rows.
    refused(
        |t, _, _| {
            let x = tensor(t, &w);
            x.shape = vec![16, 64];
            x.data.truncate(16 * 64);
        },
        Rule::TensorShape,
        &w,
    );
    // No zero point.
    refused(
        |t, _, _| t.retain(|x| x.name != zero),
        Rule::MissingTensor,
        &zero,
    );
    // A zero point stored as an integer.
    refused(
        |t, _, _| *tensor(t, &zero) = Tensor::i32(&zero, &[64, 1], &[7; 64]),
        Rule::TensorDtype,
        &zero,
    );
    // A scale a column where there is one a group.
    refused(
        |t, _, _| *tensor(t, &scale) = Tensor::f16(&scale, &[1, 64], &[1.0; 64]),
        Rule::TensorShape,
        &scale,
    );
    // scale2 for half the columns.
    refused(
        |t, _, _| *tensor(t, &scale2) = Tensor::f16(&scale2, &[1, 32], &[1.0; 32]),
        Rule::TensorShape,
        &scale2,
    );
    // A packing sinq does not write.
    refused(
        |_, s, _| s[Q]["meta"]["packing"] = json!("5bit_u8"),
        Rule::Config,
        Q,
    );
    // A group size the codes do not have.
    refused(
        |_, s, _| s[Q]["meta"]["group_size"] = json!(32),
        Rule::Config,
        Q,
    );
    // A shape that is not [out, in].
    refused(
        |_, s, _| s[Q]["meta"]["shape"] = json!([64]),
        Rule::Config,
        Q,
    );
    // No sidecar.
    refused(|_, s, _| *s = Value::Null, Rule::Config, SIDECAR);
}

/// The variants not decoded yet: refused as unsupported (CFG-002), naming
/// what they are.
#[test]
fn variants_not_decoded_yet_are_refused() {
    let scale = format!("{Q}.meta.scale");
    for (method, what) in [
        ("sinq_quantAux", "quantAux"),
        ("sinq_nf4", "NF3/NF4"),
        ("sinq_nf3", "NF3/NF4"),
    ] {
        refused(
            |_, s, _| s[Q]["meta"]["method"] = json!(method),
            Rule::Unsupported,
            what,
        );
    }
    for packing in ["3bit_32", "8bit_u8", "6bit_32"] {
        refused(
            |_, s, _| s[Q]["meta"]["packing"] = json!(packing),
            Rule::Unsupported,
            packing,
        );
    }
    // quantAux's scales: {x, s, m} tensors.
    refused(
        |t, _, _| {
            t.retain(|x| x.name != scale);
            let x = format!("{scale}.x");
            t.push(Tensor::u8(&x, "U8", &[64, 1], &[1; 64]));
        },
        Rule::Unsupported,
        "quantAux",
    );
    // The blocked (2D tiling) path's 3-D scales.
    refused(
        |t, _, _| *tensor(t, &scale) = Tensor::f16(&scale, &[4, 16, 1], &[1.0; 64]),
        Rule::Unsupported,
        &scale,
    );
    refused(
        |_, _, c| c["quantization_config"]["tiling_mode"] = json!("2D"),
        Rule::Unsupported,
        "2D",
    );
}

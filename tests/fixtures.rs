//! Every reference checkpoint decodes to the bytes its producer's own
//! dequantizer returns (compared through the recorded SHA-256 digests).

mod common;

use std::path::Path;

use common::{check_case, fixtures, CASES};
use serde_json::Value;
use wgpu_dequant::{dequantize, BackendChoice, DtypeChoice, Options, OutDtype};

#[test]
fn every_fixture_default_dtype_matches_bf16_reference() {
    for case in CASES {
        check_case(
            case,
            DtypeChoice::Auto,
            BackendChoice::Cpu,
            "expected-bf16.digests.json",
            false,
        );
    }
}

#[test]
fn every_fixture_f32_matches_reference() {
    for case in CASES {
        if case.starts_with("modelopt") {
            // ModelOpt's f32 reference is the f32 product itself.
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
                "expected-bf16.digests.json",
                true,
            );
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
        common::read_tensors(&out.join(f))
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
    assert!(out.join("recipe.yaml").is_file(), "side files are copied");
    assert!(!Path::new(&out.join(".wgpu-dequant-partial")).exists());
}

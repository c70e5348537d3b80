//! Every reference checkpoint decodes to the bytes its producer's own
//! dequantizer returns (compared through the recorded SHA-256 digests).

mod common;

use std::path::Path;

use common::{fixtures, read_dir_tensors, sha256_hex};
use serde_json::Value;
use wgpu_dequant::{dequantize, BackendChoice, DtypeChoice, Options, OutDtype};

const CASES: &[&str] = &[
    "fp8-dynamic",
    "legacy-w3a16-g16",
    "modelopt-nvfp4",
    "mxfp4a16",
    "nvfp4a16",
    "sharded-nvfp4a16",
    "w3a16-g16",
    "w4a16-asym-g128",
    "w4a16-g128",
    "w8a16-g128",
];

/// ModelOpt's E2M1 table maps code 0b1000 to +0; ours (and the format) say −0.
fn plus_zero(dtype: &str, bytes: &[u8]) -> Vec<u8> {
    match dtype {
        "BF16" => bytes
            .chunks(2)
            .flat_map(|c| if c == [0, 0x80] { [0, 0] } else { [c[0], c[1]] })
            .collect(),
        "F32" => bytes
            .chunks(4)
            .flat_map(|c| {
                if c == [0, 0, 0, 0x80] {
                    [0; 4]
                } else {
                    [c[0], c[1], c[2], c[3]]
                }
            })
            .collect(),
        _ => bytes.to_vec(),
    }
}

fn bf16_of_f32(bytes: &[u8]) -> Vec<u8> {
    bytes
        .chunks(4)
        .flat_map(|c| {
            half::bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .to_bits()
                .to_le_bytes()
        })
        .collect()
}

/// Decodes `case` with `dtype` and compares every tensor with `digests`.
/// `widen` rounds our f32 outputs to bf16 first (compressed-tensors' f32
/// references are its bf16 results widened).
pub fn check_case(
    case: &str,
    dtype: DtypeChoice,
    backend: BackendChoice,
    digests: &str,
    widen: bool,
) {
    let dir = fixtures().join(case);
    let out = tempfile::tempdir().unwrap();
    let out = out.path().join("dense");
    dequantize(&dir.join("model"), &out, &Options { dtype, backend })
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    let got = read_dir_tensors(&out);
    let want: serde_json::Map<String, Value> =
        serde_json::from_slice(&std::fs::read(dir.join(digests)).unwrap()).unwrap();
    assert_eq!(got.len(), want.len(), "{case}: tensor count");
    let modelopt = case.starts_with("modelopt");
    for (name, w) in &want {
        let (dt, shape, bytes) = got
            .get(name)
            .unwrap_or_else(|| panic!("{case}: missing {name}"));
        let want_shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
        assert_eq!(shape, &want_shape, "{case}: {name} shape");
        let (dt, bytes) = if widen && dt == "F32" {
            ("BF16".to_string(), bf16_of_f32(bytes))
        } else {
            (dt.clone(), bytes.clone())
        };
        let bytes = if modelopt {
            plus_zero(&dt, &bytes)
        } else {
            bytes
        };
        assert_eq!(dt, w["dtype"].as_str().unwrap(), "{case}: {name} dtype");
        assert_eq!(
            sha256_hex(&bytes),
            w["sha256"].as_str().unwrap(),
            "{case}: {name} bytes"
        );
    }
}

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

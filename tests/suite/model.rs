//! The API an app meets: `Model` opens and plans a checkpoint, lists its
//! dense tensors and decodes any one of them, to bytes, to `f32` values or
//! into a buffer on the app's own GPU device; `examples/tensor.rs` prints one
//! tensor's digest that way.

use std::path::Path;
use std::process::Command;

use crate::common::cli::{ok, stdout};
use crate::common::{auto_digests, fixtures, gpu_test, plus_zero, sha256_hex, CASES};
use serde_json::Value;
use wgpu_dequant::{wgpu, BackendChoice, DtypeChoice, GpuDecoder, Model, Rule};

const SVDQUANT: &[&str] = &["svdq-fp4-g16-packed", "svdq-int4-g64-logical"];

fn model(case: &str) -> Model {
    Model::open(fixtures().join(case).join("model"), DtypeChoice::Auto)
        .unwrap_or_else(|e| panic!("{case}: {e}"))
}

fn digests(case: &str) -> serde_json::Map<String, Value> {
    let path = fixtures().join(case).join(auto_digests(case));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn every_tensor_decodes_to_its_producers_bytes() {
    for case in CASES {
        let m = model(case);
        let want = digests(case);
        let names: Vec<String> = m.tensors().map(|t| t.name).collect();
        assert_eq!(
            names,
            want.keys().cloned().collect::<Vec<_>>(),
            "{case}: tensors"
        );
        for t in m.tensors() {
            let w = &want[&t.name];
            assert_eq!(format!("{:?}", t.dtype), w["dtype"], "{case}: {}", t.name);
            assert_eq!(serde_json::to_value(&t.shape).unwrap(), w["shape"]);
            let bytes = m.decode(&t.name, BackendChoice::Cpu).unwrap();
            assert_eq!(bytes.len(), t.bytes);
            // ModelOpt's NVFP4 reference writes +0 where the format says
            // -0 (its FP8 keeps -0).
            let bytes = if case.starts_with("modelopt") && case.contains("nvfp4") {
                plus_zero(&format!("{:?}", t.dtype), &bytes)
            } else {
                bytes
            };
            assert_eq!(sha256_hex(&bytes), w["sha256"], "{case}: {}", t.name);
        }
    }
}

#[test]
fn decode_f32_reads_the_decoded_values() {
    let m = model("w4a16-g128");
    let name = "model.layers.0.mlp.down_proj.weight";
    let bytes = m.decode(name, BackendChoice::Cpu).unwrap();
    let values = m.decode_f32(name, BackendChoice::Cpu).unwrap();
    assert_eq!(values.len() * 2, bytes.len());
    for (v, b) in values.iter().zip(bytes.chunks_exact(2)) {
        assert_eq!(
            v.to_bits(),
            (u32::from(u16::from_le_bytes([b[0], b[1]]))) << 16
        );
    }
    // A fixed f32 plan hands back the same values, widened: no rounding.
    let wide = Model::open(
        fixtures().join("w4a16-g128/model"),
        DtypeChoice::Fixed(wgpu_dequant::OutDtype::F32),
    )
    .unwrap();
    let embed = "model.embed_tokens.weight";
    assert_eq!(wide.info(embed).unwrap().dtype, safetensors::Dtype::F32);
    assert_eq!(
        wide.decode_f32(embed, BackendChoice::Cpu).unwrap(),
        m.decode_f32(embed, BackendChoice::Cpu).unwrap()
    );
}

#[test]
fn asking_for_what_is_not_there_is_an_argument_error() {
    let m = model("w4a16-g128");
    assert!(m.info("nope").is_err());
    let e = m.decode("nope", BackendChoice::Cpu).unwrap_err();
    assert_eq!(e.rule, Rule::Argument, "{e}");
    assert!(e.to_string().contains("nope"), "{e}");
    // Quantization tensors are consumed: not part of the dense checkpoint.
    let packed = "model.layers.0.mlp.down_proj.weight_packed";
    assert_eq!(
        m.decode(packed, BackendChoice::Cpu).unwrap_err().rule,
        Rule::Argument
    );
}

#[test]
fn a_broken_checkpoint_does_not_open() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    crate::common::copy_dir(&fixtures().join("sharded-nvfp4a16/model"), &model);
    let shard = model.join(crate::common::SHARD2);
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    let e = Model::open(&model, DtypeChoice::Auto)
        .err()
        .expect("opened");
    assert_eq!(e.rule, Rule::Container, "{e}");
}

#[test]
fn gpu_buffers_hold_the_cpu_bytes_for_every_kind_of_tensor() {
    gpu_test(|adapter| {
        let (device, queue) =
            pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor::default())).unwrap();
        let decoder = GpuDecoder::new(&device, &queue);
        for case in CASES.iter().chain(SVDQUANT) {
            let m = model(case);
            let mut sources = std::collections::HashSet::new();
            for t in m.tensors() {
                let buffer = m.decode_to_buffer(&t.name, &decoder).unwrap();
                assert_eq!(buffer.size(), (t.bytes.div_ceil(4).max(1) * 4) as u64);
                assert!(buffer.usage().contains(wgpu::BufferUsages::STORAGE));
                let got = decoder.read_back(&buffer).unwrap();
                let want = m.decode(&t.name, BackendChoice::Cpu).unwrap();
                assert!(
                    got[..t.bytes] == want[..] && got[t.bytes..].iter().all(|&b| b == 0),
                    "{case}: {} differs between the GPU buffer and the CPU",
                    t.name
                );
                let o = m.plan().outputs.iter().find(|o| o.name == t.name).unwrap();
                sources.insert(std::mem::discriminant(&o.source));
            }
            if SVDQUANT.contains(case) {
                assert!(sources.len() >= 2, "{case}: weights and biases assembled");
            }
        }
    });
}

fn run_example(ckpt: &Path, name: &str, gpu: bool) -> String {
    let mut cmd = Command::new(crate::common::example("tensor"));
    cmd.arg(ckpt).arg(name);
    if gpu {
        cmd.arg("--gpu-buffer");
    }
    let o = cmd.output().expect("cargo test builds the examples");
    ok(&o, &format!("tensor {} {name}", ckpt.display()));
    stdout(&o)
}

/// The `tensor` example's line for each of a few tensors is the tensor's
/// name, dtype, shape and the digest of the CPU's bytes; with `gpu_buffer`,
/// decoded into a GPU buffer (`--gpu-buffer`) and read back.
fn tensor_example_prints(gpu_buffer: bool) {
    let cases = [
        ("w4a16-g128", "model.layers.0.mlp.down_proj.weight"),
        ("w4a16-g128", "model.embed_tokens.weight"),
        ("nvfp4a16", "model.layers.0.self_attn.q_proj.weight"),
        ("svdq-int4-g64-logical", ""),
        ("svdq-fp4-g16-packed", ""),
    ];
    for (case, name) in cases {
        let ckpt = fixtures().join(case).join("model");
        let m = model(case);
        // SVDQuant: an assembled weight and a bias.
        let names: Vec<String> = if name.is_empty() {
            let pick = |suffix: &str| {
                m.tensors()
                    .map(|t| t.name)
                    .find(|n| {
                        n.ends_with(suffix)
                            && m.plan()
                                .outputs
                                .iter()
                                .any(|o| &o.name == n && o.scheme.is_some())
                    })
                    .unwrap_or_else(|| panic!("{case}: no decoded {suffix}"))
            };
            vec![pick(".weight"), pick(".bias")]
        } else {
            vec![name.to_string()]
        };
        for name in names {
            let info = m.info(&name).unwrap();
            let shape: Vec<String> = info.shape.iter().map(usize::to_string).collect();
            let want = format!(
                "{name} {:?} [{}] {}\n",
                info.dtype,
                shape.join(","),
                sha256_hex(&m.decode(&name, BackendChoice::Cpu).unwrap())
            );
            let flag = if gpu_buffer { " --gpu-buffer" } else { "" };
            assert_eq!(run_example(&ckpt, &name, gpu_buffer), want, "{case}{flag}");
        }
    }
}

#[test]
fn tensor_example_prints_name_dtype_shape_and_digest() {
    tensor_example_prints(false);
}

#[test]
fn tensor_example_gpu_buffer_prints_the_same_lines() {
    gpu_test(|_| tensor_example_prints(true));
}

#[test]
fn decode_into_fills_a_callers_buffer_with_decodes_bytes() {
    for case in CASES.iter().chain(SVDQUANT) {
        let m = model(case);
        for t in m.tensors() {
            let want = m.decode(&t.name, BackendChoice::Cpu).unwrap();
            let mut got = vec![0xA5u8; t.bytes];
            m.decode_into(&t.name, BackendChoice::Cpu, &mut got)
                .unwrap();
            assert!(got == want, "{case} {}: decode_into differs", t.name);
            let mut short = vec![0u8; t.bytes.saturating_sub(1)];
            if t.bytes > 0 {
                let e = m
                    .decode_into(&t.name, BackendChoice::Cpu, &mut short)
                    .unwrap_err();
                assert_eq!(e.rule, Rule::Argument, "{e}");
            }
        }
    }
}

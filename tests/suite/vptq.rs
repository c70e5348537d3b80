//! VPTQ (`quant_method: "vptq"`): the fixtures that tests/vptq/make_fixture.py
//! wrote (f16 and bf16) (indices packed by vptq 0.0.5.post1's `pack_index`, every module
//! loaded into vptq's own `VQuantLinear`) decodes to the digests of vptq's
//! `dequant` in f16, and that result cast to bf16 and f32, on each backend;
//! its layers cover residual codebooks wider than the main index (masked
//! to index_bits as vptq's unpack does), several groups, padding, outlier
//! columns, perm and weight_scale/weight_bias. Malformed checkpoints are
//! refused by rule with nothing written.

use serde_json::{json, Value};
use wgpu_dequant::{BackendChoice, DtypeChoice, OutDtype, Rule};

use crate::common::producer::{decode_with, OUTS};
use crate::common::{
    check_case, fixture_model, fixtures, gpu_test, refused_by_rule, tensor_named, write_model,
    Tensor,
};

const CASE: &str = "vptq-llama-f16";

#[test]
fn fixture_matches_vptq_on_cpu() {
    fixture_matches_vptq(BackendChoice::Cpu);
}

#[test]
fn fixture_matches_vptq_on_gpu() {
    gpu_test(|_| fixture_matches_vptq(BackendChoice::Gpu));
}

/// Both fixtures (the same draws in f16 and in bf16, every step rounded
/// in that dtype) in their own dtype and the two others.
fn fixture_matches_vptq(backend: BackendChoice) {
    for (case, own) in [(CASE, "f16"), ("vptq-llama-bf16", "bf16")] {
        check_case(
            case,
            DtypeChoice::Auto,
            backend,
            &format!("expected-{own}.digests.json"),
            false,
        );
        for out in [OutDtype::Bf16, OutDtype::F16, OutDtype::F32] {
            let digests = format!("expected-{out}.digests.json");
            check_case(case, DtypeChoice::Fixed(out), backend, &digests, false);
        }
    }
}

/// The f16 fixture's tensors and config.json.
fn fixture() -> (Vec<Tensor>, Value) {
    fixture_model(CASE)
}

/// The fixture broken one way: refused with `rule`, the message naming
/// `tensor`, nothing written.
fn refused(edit: impl FnOnce(&mut Vec<Tensor>, &mut Value), rule: Rule, tensor: &str) {
    let (mut tensors, mut cfg) = fixture();
    edit(&mut tensors, &mut cfg);
    refused_by_rule(|dir| write_model(dir, &tensors, &cfg), rule, tensor);
}

const Q: &str = "model.layers.0.self_attn.q_proj";
const K: &str = "model.layers.0.self_attn.k_proj";

fn layer<'a>(cfg: &'a mut Value, module: &str) -> &'a mut Value {
    &mut cfg["quantization_config"]["config_for_layers"][module]
}

#[test]
fn malformed_checkpoints_are_refused_by_rule() {
    let oi = format!("{K}.outlier_indices");
    // An outlier index past its codebook (4 entries).
    refused(
        |t, _| {
            let x = tensor_named(t, &oi);
            x.data[6..8].copy_from_slice(&4u16.to_le_bytes());
        },
        Rule::TensorValue,
        &oi,
    );
    // Outlier indices stored as uint8 bytes.
    refused(
        |t, _| tensor_named(t, &oi).dtype = "U8",
        Rule::Container,
        "",
    );
    // Packed indices stored as int16 (the unpacked layout transformers never loads).
    let idx = format!("{Q}.indices");
    refused(
        |t, _| tensor_named(t, &idx).dtype = "I16",
        Rule::Container,
        "",
    );
    refused(
        |t, _| {
            let x = tensor_named(t, &idx);
            x.dtype = "I16";
            x.shape[2] *= 2;
        },
        Rule::TensorDtype,
        &idx,
    );
    // A codebook size that does not match the stored codebook (32 for 16).
    let c = format!("{Q}.centroids.weight");
    refused(
        |_, cfg| layer(cfg, Q)["num_centroids"] = json!([-1, 32]),
        Rule::TensorShape,
        &c,
    );
    // A codebook size that is no power of two.
    refused(
        |_, cfg| layer(cfg, Q)["num_centroids"] = json!([-1, 12]),
        Rule::Unsupported,
        "num_centroids",
    );
    // No residual codebook where the config has one.
    let rc = format!("{Q}.res_centroids.weight");
    refused(|t, _| t.retain(|x| x.name != rc), Rule::MissingTensor, &rc);
    // perm naming a column twice.
    let perm = format!("{Q}.perm");
    refused(
        |t, _| {
            let x = tensor_named(t, &perm);
            let first = [x.data[0], x.data[1]];
            x.data[2..4].copy_from_slice(&first);
        },
        Rule::TensorValue,
        &perm,
    );
    // weight_scale in f32 beside f16 centroids (vptq computes in one dtype).
    let ws = format!("{Q}.weight_scale");
    refused(
        |t, _| *tensor_named(t, &ws) = Tensor::f32(&ws, &[64], &[1.0; 64]),
        Rule::TensorDtype,
        &ws,
    );
    // in_features that the outliers and groups do not make.
    refused(
        |_, cfg| layer(cfg, K)["in_features"] = json!(72),
        Rule::Config,
        "in_features",
    );
    // A module that stores VPTQ tensors the config does not name.
    refused(
        |_, cfg| {
            cfg["quantization_config"]["config_for_layers"]
                .as_object_mut()
                .unwrap()
                .remove(Q);
        },
        Rule::Disagree,
        &idx,
    );
    // shared_layer_config, which transformers and vptq look up differently.
    refused(
        |_, cfg| cfg["quantization_config"]["shared_layer_config"] = json!({"q_proj": {}}),
        Rule::Unsupported,
        "shared_layer_config",
    );
    // Indices as fp16 (fine-tuning) and unpacked indices.
    refused(
        |_, cfg| layer(cfg, Q)["indices_as_float"] = json!(true),
        Rule::Unsupported,
        "indices_as_float",
    );
    refused(
        |_, cfg| layer(cfg, Q)["is_indice_packed"] = json!(false),
        Rule::Config,
        "is_indice_packed",
    );
}

/// A held-out change of the fixture: the perm dropped (config and tensor)
/// decodes on both backends to the same bytes, which differ from the
/// fixture's own by the permutation alone.
#[test]
fn held_out_without_perm_gives_the_same_columns_unpermuted() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut tensors, mut cfg) = fixture();
    let perm = format!("{Q}.perm");
    let p: Vec<usize> = tensor_named(&mut tensors, &perm)
        .data
        .chunks(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
        .collect();
    tensors.retain(|t| t.name != perm);
    // Without perm, weight_scale/bias apply to stored columns: move them there.
    for n in ["weight_scale", "weight_bias"] {
        let x = tensor_named(&mut tensors, &format!("{Q}.{n}"));
        let old = x.data.clone();
        for (s, &c) in p.iter().enumerate() {
            x.data[2 * s..2 * s + 2].copy_from_slice(&old[2 * c..2 * c + 2]);
        }
    }
    layer(&mut cfg, Q)["enable_perm"] = json!(false);
    write_model(tmp.path(), &tensors, &cfg);
    let name = format!("{Q}.weight");
    let fixture = fixtures().join(CASE).join("model");
    for out in OUTS {
        let plain = decode_with(tmp.path(), out, BackendChoice::Cpu);
        let permuted = decode_with(&fixture, out, BackendChoice::Cpu);
        let (a, b) = (&plain[&name].2, &permuted[&name].2);
        let size = out.size();
        let cols = 64;
        for r in 0..64 {
            for (s, &c) in p.iter().enumerate() {
                let at = |col: usize| (r * cols + col) * size;
                assert_eq!(
                    a[at(s)..at(s) + size],
                    b[at(c)..at(c) + size],
                    "{out}: row {r}, stored column {s} is weight column {c}"
                );
            }
        }
    }
    gpu_test(|_| {
        for out in OUTS {
            let cpu = decode_with(tmp.path(), out, BackendChoice::Cpu);
            let gpu = decode_with(tmp.path(), out, BackendChoice::Gpu);
            assert!(gpu == cpu, "{out}: GPU bytes differ");
        }
    });
}

/// Products with the weights on the CPU (`Model::matmul_cpu`) keep to
/// the bound around the dense weight; the GPU refuses to multiply them
/// packed, in one line naming the weight (`ARG-001`).
#[test]
fn products_of_vptq_weights() {
    let dir = fixtures().join(CASE).join("model");
    crate::matmul::cpu_products_keep_to_the_bound_gpu_refuses(&dir, 0x5EED_7017);
}

/// On a device whose bindings hold less than a weight's output, the
/// codebook kernel decodes it in several dispatches, each from an aligned
/// offset, folded into 2-D when a dimension holds few workgroups, with the
/// CPU's bytes; a table too large for a binding is a one-line GPU-001
/// error (which `--backend auto` hands over to the CPU).
#[test]
fn codebook_kernel_splits_outputs_and_hands_over_what_does_not_fit() {
    use wgpu_dequant::backend::gpu::Gpu;
    use wgpu_dequant::Model;
    gpu_test(|adapter| {
        let model = Model::open(fixtures().join(CASE).join("model"), DtypeChoice::Auto).unwrap();
        let name = format!("{Q}.weight");
        let gpu = Gpu::open(&adapter).unwrap().with_limits(6 << 10, 2);
        let before = gpu.decoder().dispatches();
        let got = model.decode_on(&name, &gpu).unwrap();
        let want = model.decode(&name, BackendChoice::Cpu).unwrap();
        assert!(got == want, "GPU and CPU differ");
        let after = gpu.decoder().dispatches();
        assert!(
            after.codebook == before.codebook + 1 && after.cpu == before.cpu,
            "{after:?}"
        );
        let small = Gpu::open(&adapter).unwrap().with_limits(1 << 10, 1 << 16);
        let e = model.decode_on(&name, &small).unwrap_err();
        let line = e.to_string();
        assert!(e.rule == Rule::Gpu && !line.contains('\n'), "{line}");
    });
}

/// On a device that may flush f32 subnormals (any but a CPU adapter), the
/// fixtures' values (none under 2^-50, so no sum or product subnormal)
/// still take the codebook kernel, f16 and bf16 alike; a table holding a
/// value under 2^-50 goes to the CPU.
#[test]
fn flushing_devices_take_codebooks_whose_values_stay_normal() {
    use wgpu_dequant::backend::gpu::GpuDecoder;
    use wgpu_dequant::Model;
    gpu_test(|adapter| {
        let decoder = GpuDecoder::open(&adapter).unwrap().flushing_subnormals();
        for case in [CASE, "vptq-llama-bf16"] {
            let model =
                Model::open(fixtures().join(case).join("model"), DtypeChoice::Auto).unwrap();
            let before = decoder.dispatches();
            let name = format!("{Q}.weight");
            let got = model.decode_on(&name, &decoder).unwrap();
            assert!(
                got == model.decode(&name, BackendChoice::Cpu).unwrap(),
                "{case}"
            );
            let after = decoder.dispatches();
            assert!(
                after.codebook == before.codebook + 1 && after.cpu == before.cpu,
                "{case}: {after:?}"
            );
        }
        // A centroid of 2^-60 in the bf16 model.
        let tmp = tempfile::tempdir().unwrap();
        let (mut tensors, cfg) = fixture_model("vptq-llama-bf16");
        let c = tensor_named(&mut tensors, &format!("{Q}.centroids.weight"));
        c.data[0..2].copy_from_slice(&(((2f32.powi(-60)).to_bits() >> 16) as u16).to_le_bytes());
        write_model(tmp.path(), &tensors, &cfg);
        let model = Model::open(tmp.path(), DtypeChoice::Auto).unwrap();
        let before = decoder.dispatches();
        let name = format!("{Q}.weight");
        let got = model.decode_on(&name, &decoder).unwrap();
        assert!(got == model.decode(&name, BackendChoice::Cpu).unwrap());
        let after = decoder.dispatches();
        assert!(
            after.codebook == before.codebook && after.cpu == before.cpu + 1,
            "{after:?}"
        );
    });
}

//! compressed-tensors' `transform_config`: online rotations folded into the
//! dense weights (`W = Bᵀ·Wq·Aᵀ`), against the fixture's expected bytes and
//! against the fold summed here by hand; and the refusals.

use std::path::Path;

use serde_json::{json, Value};
use wgpu_dequant::{BackendChoice, Checkpoint, DtypeChoice, Names, OutDtype, Plan, Rule};

use crate::common::cli::{ok, run, stdout};
use crate::common::producer::{check_output, decode_with, Want};
use crate::common::{check_case, fixtures, gpu_test, write_checkpoint, Rng, Tensor};

const CASE: &str = "ct-transform-quip-w4a16";
const Q: &str = "model.layers.0.self_attn.q_proj";
const K: &str = "model.layers.0.self_attn.k_proj";
const NORM: &str = "model.norm.weight";

/// The fixture in f32: the fold rounded once to f32 (not its bf16 widened).
#[test]
fn quip_fixture_f32_is_the_fold_rounded_once_on_cpu() {
    check_case(
        CASE,
        DtypeChoice::Fixed(OutDtype::F32),
        BackendChoice::Cpu,
        "expected-f32.digests.json",
        false,
    );
}

#[test]
fn quip_fixture_f32_is_the_fold_rounded_once_on_gpu() {
    gpu_test(|_| {
        check_case(
            CASE,
            DtypeChoice::Fixed(OutDtype::F32),
            BackendChoice::Gpu,
            "expected-f32.digests.json",
            false,
        );
        check_case(
            CASE,
            DtypeChoice::Auto,
            BackendChoice::Gpu,
            "expected-bf16.digests.json",
            false,
        );
    });
}

/// `inspect` says which rotations were fused and which folded, per module.
#[test]
fn inspect_names_fused_and_folded_rotations() {
    let model = fixtures().join(CASE).join("model");
    let o = run(&["inspect", model.to_str().unwrap()]);
    ok(&o, "inspect");
    let text = stdout(&o);
    assert!(
        text.contains("weight_output (fused in the stored weights)"),
        "{text}"
    );
    assert!(text.contains("input (online, folded in)"), "{text}");
    assert!(
        text.contains("output inverse (online, folded in)"),
        "{text}"
    );
    assert!(
        !text.contains("v_input.weight"),
        "the matrices are not written: {text}"
    );
    let folded = text
        .lines()
        .filter(|l| l.contains("rotations folded"))
        .count();
    assert_eq!(folded, 7, "every quantized Linear: {text}");
}

/// A ±1 matrix `n × n`.
fn signs(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n * n)
        .map(|_| if rng.below(2) == 0 { 1.0 } else { -1.0 })
        .collect()
}

/// Two int8 Linears, `q` (8 × 12) storing the matrices and `k` (4 × 8)
/// sharing them, with power-of-two scales: every sum is exact.
struct Model {
    tensors: Vec<Tensor>,
    /// Wq of each module, row-major.
    wq: Vec<(String, usize, usize, Vec<f64>)>,
    t_in: Vec<f64>,
    t_out: Vec<f64>,
    /// `q`'s bias.
    bias: Vec<f32>,
}

const N: usize = 4;

fn model(seed: u64) -> Model {
    let mut rng = Rng::new(seed);
    let (t_in, t_out) = (signs(&mut rng, N), signs(&mut rng, N));
    let mut tensors = Vec::new();
    let mut wq = Vec::new();
    for (m, rows, cols) in [(Q, 8, 12), (K, 4, 8)] {
        let codes: Vec<u8> = (0..rows * cols).map(|_| rng.below(256) as u8).collect();
        let scale: Vec<f32> = (0..rows)
            .map(|r| [0.5f32, 0.0625, 2.0, 1.0][r % 4])
            .collect();
        let w = (0..rows * cols)
            .map(|i| codes[i] as i8 as f64 * scale[i / cols] as f64)
            .collect();
        tensors.push(Tensor::u8(
            format!("{m}.weight"),
            "I8",
            &[rows, cols],
            &codes,
        ));
        tensors.push(Tensor::f32(format!("{m}.weight_scale"), &[rows, 1], &scale));
        wq.push((m.to_string(), rows, cols, w));
    }
    let f64s = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    tensors.push(Tensor::new(
        format!("{Q}.v_input.weight"),
        "F64",
        &[N, N],
        f64s(&t_in),
    ));
    tensors.push(Tensor::new(
        format!("{Q}.u_output.weight"),
        "F64",
        &[N, N],
        f64s(&t_out),
    ));
    tensors.push(Tensor::bf16(NORM, &[8], &[1.0; 8]));
    let bias: Vec<f32> = (0..8).map(|r| r as f32 * 0.25 - 1.0).collect();
    tensors.push(Tensor::bf16(format!("{Q}.bias"), &[8], &bias));
    Model {
        tensors,
        wq,
        t_in,
        t_out,
        bias,
    }
}

/// QuIP's two schemes: `v` on the input (online, not inverse; fused inverse
/// on the weight), `u` on the output (online inverse; fused on the weight).
fn transform_config(head_dim: usize) -> Value {
    let apply = |location: &str, inverse: bool| json!({"targets": ["Linear"], "location": location, "inverse": inverse, "ignore": ["lm_head"]});
    json!({"config_groups": {
        "u": {"type": "random-hadamard", "head_dim": head_dim, "apply": [apply("weight_output", false), apply("output", true)]},
        "v": {"type": "random-hadamard", "head_dim": head_dim, "apply": [apply("input", false), apply("weight_input", true)]},
    }})
}

fn config(tc: Value) -> Value {
    json!({
        "quant_method": "compressed-tensors", "format": "int-quantized", "version": "0.20.0",
        "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"format": "int-quantized", "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": true}}},
        "transform_config": tc,
    })
}

/// `Bᵀ·Wq·Aᵀ` with `A = T_in/√n`, `B = T_outᵀ/√n` (inverse), block
/// diagonal, term by term: `W[r, c] = Σ_a Σ_b T_out[r', a]·Wq[a, b]·T_in[c', b] / n`.
fn fold_by_hand(m: &Model, rows: usize, cols: usize, wq: &[f64]) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let (rb, cb) = (r / N * N, c / N * N);
            let mut s = 0.0f64;
            for a in 0..N {
                for b in 0..N {
                    // B = T_outᵀ/√n: Bᵀ[r, a] = T_out[r, a] within the block.
                    let bt = m.t_out[(r - rb) * N + a];
                    let at = m.t_in[(c - cb) * N + b];
                    s += bt * wq[(rb + a) * cols + cb + b] * at;
                }
            }
            out.push((s / N as f64) as f32);
        }
    }
    out
}

/// The weights folded, and `q`'s bias rotated as its outputs are:
/// `b'[r] = Σ_a Bᵀ[r, a]·b[a] = Σ_a T_out[r, a]·b[a] / √n`.
fn wants(m: &Model) -> Vec<Want> {
    let mut w: Vec<Want> =
        m.wq.iter()
            .map(|(name, rows, cols, w)| Want {
                name: format!("{name}.weight"),
                shape: vec![*rows, *cols],
                vals: fold_by_hand(m, *rows, *cols, w),
            })
            .collect();
    let bias = (0..8)
        .map(|r| {
            let rb = r / N * N;
            let s: f64 = (0..N)
                .map(|a| m.t_out[(r - rb) * N + a] * m.bias[rb + a] as f64)
                .sum();
            (s / 2.0) as f32
        })
        .collect();
    w.push(Want {
        name: format!("{Q}.bias"),
        shape: vec![8],
        vals: bias,
    });
    w
}

fn fold_matches_by_hand(backend: BackendChoice) {
    let m = model(0x7F01D);
    let tmp = tempfile::tempdir().unwrap();
    write_checkpoint(tmp.path(), &m.tensors, config(transform_config(N)));
    let norm = m.tensors.iter().find(|t| t.name == NORM).unwrap().clone();
    for out in [OutDtype::Bf16, OutDtype::F32] {
        let got = decode_with(tmp.path(), out, backend);
        check_output(
            &format!("fold -> {out} on {backend:?}"),
            &got,
            out,
            &wants(&m),
            std::slice::from_ref(&norm),
        );
    }
}

#[test]
fn fold_matches_the_sum_by_hand_on_cpu() {
    fold_matches_by_hand(BackendChoice::Cpu);
}

#[test]
fn fold_matches_the_sum_by_hand_on_gpu() {
    gpu_test(|_| fold_matches_by_hand(BackendChoice::Gpu));
}

/// Without `head_dim` each module's rotation spans it, and a matrix is
/// shared by size: a module whose size no stored matrix has is refused.
#[test]
fn full_size_rotations_need_a_matrix_of_each_size() {
    let m = model(3);
    let tmp = tempfile::tempdir().unwrap();
    let mut tc = transform_config(N);
    for s in ["u", "v"] {
        tc["config_groups"][s]
            .as_object_mut()
            .unwrap()
            .remove("head_dim");
    }
    write_checkpoint(tmp.path(), &m.tensors, config(tc));
    let ckpt = Checkpoint::open(tmp.path()).unwrap();
    let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
    assert_eq!(plan.errors.len(), 2, "{:?}", plan.errors);
    for e in &plan.errors {
        assert_eq!(e.rule, Rule::MissingTensor, "{e}");
        assert!(
            e.to_string()
                .contains("no *.v_input.weight of shape [12, 12]")
                || e.to_string().contains("[8, 8]"),
            "{e}"
        );
    }
}

/// The planning error, or the first module error.
fn refusal(dir: &Path) -> wgpu_dequant::Error {
    let ckpt = Checkpoint::open(dir).unwrap();
    match Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub) {
        Err(e) => e,
        Ok(plan) => plan.errors.first().cloned().expect("refused"),
    }
}

#[test]
fn transforms_that_cannot_be_folded_are_refused() {
    type Edit = fn(&mut Value, &mut Vec<Tensor>);
    let cases: Vec<(&str, Edit, Rule, &str)> = vec![
        (
            "an unknown type",
            |tc, _| tc["config_groups"]["u"]["type"] = json!("random-matrix"),
            Rule::Unsupported,
            "random-matrix",
        ),
        (
            "an unknown location",
            |tc, _| tc["config_groups"]["v"]["apply"][0]["location"] = json!("attn_output"),
            Rule::Unsupported,
            "attn_output",
        ),
        (
            "q_attn without k_cache",
            |tc, _| tc["config_groups"]["u"]["apply"][0]["location"] = json!("q_attn"),
            Rule::Unsupported,
            "q_attn alone",
        ),
        (
            "randomized",
            |tc, _| tc["config_groups"]["v"]["randomize"] = json!(true),
            Rule::Unsupported,
            "randomized",
        ),
        (
            "a block that does not divide",
            |tc, _| tc["config_groups"]["v"]["head_dim"] = json!(5),
            Rule::TensorShape,
            "block 5",
        ),
        (
            "a matrix entry that is not ±1",
            |_, ts| {
                let t = ts
                    .iter_mut()
                    .find(|t| t.name.ends_with("v_input.weight"))
                    .unwrap();
                t.data[..8].copy_from_slice(&0.5f64.to_le_bytes());
            },
            Rule::TensorValue,
            "±1",
        ),
        (
            "the matrix missing",
            |_, ts| ts.retain(|t| !t.name.ends_with("u_output.weight")),
            Rule::MissingTensor,
            "u_output",
        ),
        (
            "two online rotations on one side",
            |tc, _| {
                let extra = tc["config_groups"]["v"]["apply"][0].clone();
                tc["config_groups"]["v"]["apply"]
                    .as_array_mut()
                    .unwrap()
                    .push(extra);
            },
            Rule::Unsupported,
            "more than one",
        ),
    ];
    for (what, edit, rule, needle) in cases {
        let mut m = model(11);
        let mut tc = transform_config(N);
        edit(&mut tc, &mut m.tensors);
        let tmp = tempfile::tempdir().unwrap();
        write_checkpoint(tmp.path(), &m.tensors, config(tc));
        let e = refusal(tmp.path());
        assert_eq!(e.rule, rule, "{what}: {e}");
        assert!(e.to_string().contains(needle), "{what}: {e}");
    }
}

/// A Linear the quantization leaves dense but a runtime rotates would be
/// copied unrotated: refused. With the transform ignoring it too, it is
/// copied as it is.
#[test]
fn a_dense_linear_rotated_online_is_refused() {
    for (ignored_by_transform, refused) in [(false, true), (true, false)] {
        let mut m = model(5);
        m.tensors
            .push(Tensor::bf16("lm_head.weight", &[4, 4], &[1.0; 16]));
        let mut tc = transform_config(N);
        if !ignored_by_transform {
            for s in ["u", "v"] {
                for a in tc["config_groups"][s]["apply"].as_array_mut().unwrap() {
                    a["ignore"] = json!([]);
                }
            }
        }
        let tmp = tempfile::tempdir().unwrap();
        write_checkpoint(tmp.path(), &m.tensors, config(tc));
        let ckpt = Checkpoint::open(tmp.path()).unwrap();
        let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
        let e = plan
            .errors
            .iter()
            .find(|e| e.tensor.as_deref() == Some("lm_head.weight"));
        assert_eq!(e.is_some(), refused, "{:?}", plan.errors);
    }
}

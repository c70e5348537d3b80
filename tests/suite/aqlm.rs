//! AQLM (`quant_method: "aqlm"`): the fixtures tests/aqlm/make_fixture.py
//! wrote (codes, codebooks and scales in aqlm 1.1.7's `QuantizedLinear`
//! layout, loaded by transformers 5.25's AQLM loader) decode to the digests
//! of aqlm's `_dequantize_weight` on the model loaded in each output dtype
//! (bf16, f16, f32), on each backend: 1x16 (int16 codes, half of them at
//! or past 32768, stored negative), 2x8 (int8 codes past 127, out_group 2)
//! and 4x6 (more than two codebooks: the sum in f32, rounded once).
//! Malformed checkpoints are refused by rule with nothing written.

use serde_json::{json, Value};
use wgpu_dequant::{BackendChoice, DtypeChoice, OutDtype, Rule};

use crate::common::{
    check_case, fixture_model, fixtures, gpu_test, refused_by_rule, tensor_named, write_model,
    Tensor,
};

const CASES: [(&str, &str); 3] = [
    ("aqlm-1x16-f16", "f16"),
    ("aqlm-2x8-bf16", "bf16"),
    ("aqlm-4x6-f16", "f16"),
];

#[test]
fn fixtures_match_aqlm_on_cpu() {
    fixtures_match_aqlm(BackendChoice::Cpu);
}

#[test]
fn fixtures_match_aqlm_on_gpu() {
    gpu_test(|_| fixtures_match_aqlm(BackendChoice::Gpu));
}

/// Each fixture in its own dtype and in each of bf16, f16, f32 (aqlm's
/// weight with the model loaded in that dtype).
fn fixtures_match_aqlm(backend: BackendChoice) {
    for (case, own) in CASES {
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

/// Fixture `case` broken one way: refused with `rule`, the one-line
/// message naming `what`, nothing written.
fn refused(case: &str, edit: impl FnOnce(&mut Vec<Tensor>, &mut Value), rule: Rule, what: &str) {
    let (mut tensors, mut cfg) = fixture_model(case);
    edit(&mut tensors, &mut cfg);
    refused_by_rule(|dir| write_model(dir, &tensors, &cfg), rule, what);
}

fn qc(cfg: &mut Value) -> &mut Value {
    &mut cfg["quantization_config"]
}

const Q: &str = "model.layers.0.self_attn.q_proj";
const X16: &str = "aqlm-1x16-f16";
const X8: &str = "aqlm-2x8-bf16";

#[test]
fn malformed_checkpoints_are_refused_by_rule() {
    let codes = format!("{Q}.codes");
    let books = format!("{Q}.codebooks");
    let scales = format!("{Q}.scales");
    // int16 codes with 8-bit codebooks (aqlm's get_int_dtype: int8), the
    // bytes reshaped to stay whole.
    refused(
        X8,
        |t, _| {
            let x = tensor_named(t, &codes);
            x.dtype = "I16";
            x.shape[2] /= 2;
        },
        Rule::TensorDtype,
        &codes,
    );
    // A codebook other than the codes reach: nbits_per_codebook 15 says
    // 32768 entries, 65536 are stored (every code of nbits bits lies
    // inside a codebook of 2^nbits, which the shape makes sure of: no
    // code can be past it).
    refused(
        X16,
        |_, cfg| qc(cfg)["nbits_per_codebook"] = json!(15),
        Rule::TensorShape,
        &books,
    );
    // The codebooks cut to half their entries, the config unchanged: the
    // codes would reach past them.
    refused(
        X8,
        |t, _| {
            let x = tensor_named(t, &books);
            x.shape[1] /= 2;
            let n = x.data.len() / 2;
            x.data.truncate(n);
        },
        Rule::TensorShape,
        &books,
    );
    // num_codebooks disagreeing with the codes' last dimension.
    refused(
        X8,
        |_, cfg| qc(cfg)["num_codebooks"] = json!(1),
        Rule::TensorShape,
        ".codes",
    );
    // in_group_size disagreeing with the codebooks' tiles.
    refused(
        X8,
        |_, cfg| qc(cfg)["in_group_size"] = json!(8),
        Rule::TensorShape,
        ".codebooks",
    );
    // scales of the wrong shape.
    refused(
        X8,
        |t, _| {
            let x = tensor_named(t, &scales);
            let n = x.shape[0];
            x.shape = vec![1, n, 1, 1];
        },
        Rule::TensorShape,
        &scales,
    );
    // scales in f32 beside bf16 codebooks.
    refused(
        X8,
        |t, _| {
            let x = tensor_named(t, &scales);
            let n = x.shape[0];
            *x = Tensor::f32(&scales, &[n, 1, 1, 1], &vec![1.0; n]);
        },
        Rule::TensorDtype,
        &scales,
    );
    // Integer codebooks.
    refused(
        X8,
        |t, _| tensor_named(t, &books).dtype = "I16",
        Rule::TensorDtype,
        &books,
    );
    // Truncated codes: fewer bytes than the header's shape.
    refused(
        X16,
        |t, _| {
            let x = tensor_named(t, &codes);
            x.data.truncate(x.data.len() - 2);
        },
        Rule::Container,
        "",
    );
    // A missing scales tensor.
    refused(
        X8,
        |t, _| t.retain(|x| x.name != scales),
        Rule::MissingTensor,
        &scales,
    );
    // Bad config values.
    refused(
        X8,
        |_, cfg| qc(cfg)["num_codebooks"] = json!(0),
        Rule::Config,
        "num_codebooks",
    );
    refused(
        X8,
        |_, cfg| qc(cfg)["num_codebooks"] = json!(9),
        Rule::Unsupported,
        "num_codebooks",
    );
    refused(
        X8,
        |_, cfg| qc(cfg)["nbits_per_codebook"] = json!(17),
        Rule::Unsupported,
        "nbits_per_codebook",
    );
    refused(
        X8,
        |_, cfg| qc(cfg)["in_group_size"] = json!("8"),
        Rule::Config,
        "in_group_size",
    );
    // A module the config keeps dense that stores codes.
    refused(
        X8,
        |_, cfg| {
            qc(cfg)["linear_weights_not_to_quantize"] = json!([format!("{Q}.weight")]);
        },
        Rule::Disagree,
        &codes,
    );
}

/// The largest codes (stored negative) pick the codebook's last entries:
/// the 1x16 fixture's first code is 65535 (stored -1), its second 32768
/// (stored -32768), and the f32 weight's first elements are those entries
/// times the first scale.
#[test]
fn negative_codes_read_as_unsigned() {
    use wgpu_dequant::Model;
    let (mut tensors, _) = fixture_model(X16);
    let codes = tensor_named(&mut tensors, &format!("{Q}.codes"))
        .data
        .clone();
    assert_eq!(i16::from_le_bytes([codes[0], codes[1]]), -1);
    assert_eq!(i16::from_le_bytes([codes[2], codes[3]]), i16::MIN);
    let books = tensor_named(&mut tensors, &format!("{Q}.codebooks"))
        .data
        .clone();
    let scales = tensor_named(&mut tensors, &format!("{Q}.scales"))
        .data
        .clone();
    let f16 = |b: &[u8], i: usize| half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
    let model = Model::open(fixtures().join(X16).join("model"), DtypeChoice::Auto).unwrap();
    let w = model
        .decode_f32(&format!("{Q}.weight"), BackendChoice::Cpu)
        .unwrap();
    let s = f16(&scales, 0);
    for (col, code) in [(0, 65535), (1, 32768)] {
        let want = half::f16::from_f32(f16(&books, code) * s).to_f32();
        assert_eq!(w[col], want, "column {col}");
    }
}

/// Products with the weights on the CPU (`Model::matmul_cpu`) keep to
/// the bound around the dense weight; the GPU refuses to multiply them
/// packed, in one line naming the weight (`ARG-001`).
#[test]
fn products_of_aqlm_weights() {
    let dir = fixtures().join(X8).join("model");
    crate::matmul::cpu_products_keep_to_the_bound_gpu_refuses(&dir, 0x5EED_A017);
}

/// Every fixture's quantized weights take the codebook kernel on the GPU
/// (none handed to the CPU), with the CPU's bytes.
#[test]
fn gpu_takes_the_codebook_kernel() {
    use wgpu_dequant::backend::gpu::GpuDecoder;
    use wgpu_dequant::Model;
    gpu_test(|adapter| {
        let decoder = GpuDecoder::open(&adapter).unwrap();
        for (case, _) in CASES {
            let model =
                Model::open(fixtures().join(case).join("model"), DtypeChoice::Auto).unwrap();
            let name = format!("{Q}.weight");
            let before = decoder.dispatches();
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
    });
}

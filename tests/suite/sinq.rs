//! SINQ (`quant_method: "sinq"`): the fixture tests/sinq/make_fixture.py
//! wrote with sinq 0.2.0 itself (the plain `sinq` method: 4-bit groups of
//! 32, 64 and 128, 2-bit and 1-bit, each with its Sinkhorn `scale2`; and
//! the other packings, NF4, NF3 and quantAux fixtures)
//! decodes to the digests of `SINQLinear.dequantize()` in each output
//! dtype, on each backend; the output loads in transformers with no missing
//! or unexpected keys (the meta tensors, the sidecar and the rotary
//! buffers dropped); malformed checkpoints and the variants not decoded
//! yet are refused by rule with nothing written.

use std::path::Path;

use serde_json::{json, Value};
use wgpu_dequant::{BackendChoice, DtypeChoice, OutDtype, Rule};

use crate::common::{
    auto_digests, check_case, copy_dir, dequantize_err, fixtures, gpu_test, read_dir_tensors,
    tensors_of, write_json, write_safetensors, Tensor,
};

const CASE: &str = "sinq-mixed-bf16";
const AUX: &str = "sinq-aux-bf16";
const AUX2: &str = "sinq-aux-2bit-f16";
const NF4: &str = "sinq-nf4-bf16";
const BITS: &str = "sinq-bits-f16";
const TILED: &str = "sinq-2d-bf16";
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
    matches_in_each_dtype(CASE, backend);
}

/// `case` decodes to sinq's digests in its own dtype and in each output
/// dtype.
fn matches_in_each_dtype(case: &str, backend: BackendChoice) {
    // The model's own dtype (config.json's) by default.
    check_case(case, DtypeChoice::Auto, backend, auto_digests(case), false);
    for (out, name) in [
        (OutDtype::Bf16, "bf16"),
        (OutDtype::F16, "f16"),
        (OutDtype::F32, "f32"),
    ] {
        let digests = format!("expected-{name}.digests.json");
        check_case(case, DtypeChoice::Fixed(out), backend, &digests, false);
    }
}

#[test]
fn gpu_gives_the_cpus_bytes() {
    gpu_test(|_| {
        for case in [CASE, AUX, AUX2, NF4, BITS, TILED] {
            crate::common::producer::gpu_gives_the_cpus_bytes(
                case,
                &fixtures().join(case).join("model"),
            );
        }
    });
}

/// transformers' `SinqConfig(method="sinq")` (sinq's `sinq_quantAux`:
/// scales and zeros stored 8-bit as `{x, s, m}`), 4-bit groups of 64 in
/// bf16 and 2-bit groups of 32 in f16, as transformers saves it.
#[test]
fn quant_aux_fixtures_match_sinq_on_cpu() {
    for case in [AUX, AUX2] {
        matches_in_each_dtype(case, BackendChoice::Cpu);
    }
}

#[test]
fn quant_aux_fixtures_match_sinq_on_gpu() {
    gpu_test(|_| {
        for case in [AUX, AUX2] {
            matches_in_each_dtype(case, BackendChoice::Gpu);
        }
    });
}

/// sinq's NF4 codebook methods (`sinq_nf4`, and `sinq_nf4_quantAux` with
/// 8-bit scales and zeros), groups of 32, 64 and 128: computed in the
/// scales' f16 and returned so, then cast.
#[test]
fn nf4_fixture_matches_sinq_on_cpu() {
    matches_in_each_dtype(NF4, BackendChoice::Cpu);
}

#[test]
fn nf4_fixture_matches_sinq_on_gpu() {
    gpu_test(|_| matches_in_each_dtype(NF4, BackendChoice::Gpu));
}

/// The int32 packings (`3bit_32`, `5bit_32`, `6bit_32`: the grouped rows
/// padded to 10, 6 and 5 parts, groups smaller than a row so that parts end
/// inside one), `8bit_u8`, and the NF3 codebook methods (`sinq_nf3`,
/// `sinq_nf3_quantAux`), plain and quantAux scales, in an f16 model.
#[test]
fn bits_fixture_matches_sinq_on_cpu() {
    matches_in_each_dtype(BITS, BackendChoice::Cpu);
}

#[test]
fn bits_fixture_matches_sinq_on_gpu() {
    gpu_test(|_| matches_in_each_dtype(BITS, BackendChoice::Gpu));
}

/// The blocked 2D tiling (`tiling_mode: "2D"`: square tiles of G, scale
/// and zero `[tiles, G, 1]`, scale2 `[tiles, 1, G]`) in the byte packings:
/// plain, quantAux and NF4 methods, 8, 4, 2 and 1 bit.
#[test]
fn tiled_fixture_matches_sinq_on_cpu() {
    matches_in_each_dtype(TILED, BackendChoice::Cpu);
}

#[test]
fn tiled_fixture_matches_sinq_on_gpu() {
    gpu_test(|_| matches_in_each_dtype(TILED, BackendChoice::Gpu));
}

/// 2D checkpoints broken one way each: refused by rule, nothing written.
#[test]
fn malformed_2d_is_refused_by_rule() {
    let scale = format!("{Q}.meta.scale");
    let scale2 = format!("{Q}.meta.scale2");
    // q_proj: [64, 64] in tiles of 32, four tiles. The scale for one
    // column of tiles.
    refused_in(
        TILED,
        |t, _, _| *tensor(t, &scale) = Tensor::f16(&scale, &[2, 32, 1], &[1.0; 64]),
        Rule::TensorShape,
        &scale,
    );
    // scale2 as 1D's one factor a column.
    refused_in(
        TILED,
        |t, _, _| *tensor(t, &scale2) = Tensor::f16(&scale2, &[1, 64], &[1.0; 64]),
        Rule::TensorShape,
        &scale2,
    );
    // The zero still 1D's [R, 1] beside a 3-D scale.
    let zero = format!("{Q}.meta.zero");
    refused_in(
        TILED,
        |t, _, _| *tensor(t, &zero) = Tensor::f16(&zero, &[128, 1], &[1.0; 128]),
        Rule::TensorShape,
        &zero,
    );
    // quantAux: a sidecar zero.shape that is not [tiles, G, 1].
    refused_in(
        TILED,
        |_, s, _| s[K]["meta"]["zero.shape"] = json!([128, 1]),
        Rule::Config,
        "zero.shape",
    );
    // Tiles of 64 on a weight 32 rows tall (k_proj's codes read as groups
    // of 64: a 2D tile that does not divide the weight).
    let kw = format!("{K}.W_q");
    refused_in(
        TILED,
        |t, _, _| {
            let x = tensor(t, &kw);
            x.shape = vec![8, 64];
        },
        Rule::Config,
        "2D",
    );
}

/// The int32 packings and NF3 broken one way each: refused by rule,
/// nothing written.
#[test]
fn malformed_int32_packings_are_refused_by_rule() {
    // q_proj: 3bit_32, [64, 64] in groups of 32: 128 rows, 13 rows of words.
    let w = format!("{Q}.W_q");
    let kw = format!("{K}.W_q");
    // One row of words short (the padded parts' count).
    refused_in(
        BITS,
        |t, _, _| {
            let x = tensor(t, &w);
            x.shape = vec![12, 32];
            x.data.truncate(12 * 32 * 4);
        },
        Rule::TensorShape,
        &w,
    );
    // The words stored as bytes.
    refused_in(
        BITS,
        |t, _, _| {
            let x = tensor(t, &w);
            x.dtype = "U8";
            x.shape = vec![13, 128];
        },
        Rule::TensorDtype,
        &w,
    );
    // 5bit_32's words read as 6bit_32 (5 parts: 26 rows of words, not 22).
    refused_in(
        BITS,
        |_, s, _| {
            s[K]["meta"]["packing"] = json!("6bit_32");
            s[K]["meta"]["nbits"] = json!(6);
        },
        Rule::TensorShape,
        &kw,
    );
    // Words in groups of 8 where sinq made groups of 16.
    refused_in(
        BITS,
        |t, _, _| {
            let x = tensor(t, &kw);
            x.shape = vec![22, 8];
            x.data.truncate(22 * 8 * 4);
        },
        Rule::TensorShape,
        &kw,
    );
    // A packing name sinq does not write.
    refused_in(
        BITS,
        |_, s, _| s[Q]["meta"]["packing"] = json!("3bit_u8"),
        Rule::Config,
        Q,
    );
    // NF3 codes in a 5-bit packing.
    refused_in(
        BITS,
        |_, s, _| s[K]["meta"]["method"] = json!("sinq_nf3"),
        Rule::Config,
        "NF3",
    );
    // 8bit_u8's bytes under a 4-bit packing: half the codes.
    let dw = "model.layers.0.mlp.down_proj";
    refused_in(
        BITS,
        |_, s, _| s[dw]["meta"]["packing"] = json!("4bit_u8"),
        Rule::TensorShape,
        &format!("{dw}.W_q"),
    );
}

/// NF4 codes in a packing other than 4 bits: refused.
#[test]
fn nf4_in_other_packings_is_refused() {
    refused_in(
        NF4,
        |t, s, _| {
            s[Q]["meta"]["packing"] = json!("2bit_u8");
            s[Q]["meta"]["nbits"] = json!(2);
            let w = tensor(t, &format!("{Q}.W_q"));
            w.shape = vec![16, 64];
            w.data.truncate(16 * 64);
        },
        Rule::Config,
        "NF4",
    );
}

/// The quantAux output holds the Linear weights and none of the `x`, `s`,
/// `m` tensors.
#[test]
fn quant_aux_output_has_hf_names_and_no_meta() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    let input = fixtures().join(AUX).join("model");
    wgpu_dequant::dequantize(&input, &out, &crate::common::CPU_AUTO).unwrap();
    let got = read_dir_tensors(&out);
    for (name, (dtype, _, _)) in &got {
        assert!(name.ends_with(".weight"), "{name}");
        assert_eq!(dtype, "BF16", "{name}");
    }
    assert_eq!(got.len(), 7 + 3 + 2, "{:?}", got.keys());
    assert!(!out.join(SIDECAR).exists());
}

/// The dense output holds each Linear's `weight` under transformers' names
/// and none of the meta tensors or rotary buffers; config.json loses its
/// `quantization_config` and the sidecar is not copied.
#[test]
fn output_has_hf_names_and_no_meta() {
    for (case, want) in [(CASE, "BF16"), (BITS, "F16")] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("dense");
        let input = fixtures().join(case).join("model");
        wgpu_dequant::dequantize(&input, &out, &crate::common::CPU_AUTO).unwrap();
        let got = read_dir_tensors(&out);
        for (name, (dtype, _, _)) in &got {
            assert!(name.ends_with(".weight"), "{case} {name}");
            assert_eq!(dtype, want, "{case} {name}");
        }
        assert_eq!(got.len(), 7 + 3 + 2, "{case} {:?}", got.keys());
        let cfg: Value =
            serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
        assert!(cfg.get("quantization_config").is_none());
        assert!(!out.join(SIDECAR).exists());
    }
}

/// The fixture copied, its tensors, sidecar and config.json changed by
/// `edit` (the index rewritten to the tensors left).
fn broken(case: &str, dir: &Path, edit: impl FnOnce(&mut Vec<Tensor>, &mut Value, &mut Value)) {
    copy_dir(&fixtures().join(case).join("model"), dir);
    let mut tensors = tensors_of(read_dir_tensors(dir));
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
    refused_in(CASE, edit, rule, what)
}

/// [`refused`], fixture `case` broken.
fn refused_in(
    case: &str,
    edit: impl FnOnce(&mut Vec<Tensor>, &mut Value, &mut Value),
    rule: Rule,
    what: &str,
) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    broken(case, &dir, edit);
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

/// The variant not decoded yet (SINQ's blocked 2D tiling with an int32
/// packing): refused as unsupported (CFG-002), naming what it is.
#[test]
fn variants_not_decoded_yet_are_refused() {
    let scale = format!("{Q}.meta.scale");
    // The blocked (2D tiling) path's 3-D scales with an int32 packing
    // (q_proj: 3bit_32, [64, 64] in tiles of 32).
    refused_in(
        BITS,
        |t, _, _| *tensor(t, &scale) = Tensor::f16(&scale, &[4, 32, 1], &[1.0; 128]),
        Rule::Unsupported,
        "2D",
    );
    // A tiling sinq does not make.
    refused(
        |_, _, c| c["quantization_config"]["tiling_mode"] = json!("3D"),
        Rule::Config,
        "3D",
    );
}

/// quantAux checkpoints broken one way each: refused by rule, nothing
/// written.
#[test]
fn malformed_quant_aux_is_refused_by_rule() {
    let sx = format!("{Q}.meta.scale.x");
    let ss = format!("{Q}.meta.scale.s");
    let sm = format!("{Q}.meta.scale.m");
    let zx = format!("{Q}.meta.zero.x");
    let zs = format!("{Q}.meta.zero.s");
    // The scale bytes stored as int8.
    refused_in(
        AUX,
        |t, _, _| tensor(t, &sx).dtype = "I8",
        Rule::TensorDtype,
        &sx,
    );
    // The scale bytes truncated: half the groups.
    refused_in(
        AUX,
        |t, _, _| {
            let x = tensor(t, &sx);
            x.shape = vec![16, 2];
            x.data.truncate(32);
        },
        Rule::TensorShape,
        &sx,
    );
    // A factor for one column of two.
    refused_in(
        AUX,
        |t, _, _| *tensor(t, &ss) = Tensor::f16(&ss, &[1, 1], &[1.0]),
        Rule::TensorShape,
        &ss,
    );
    // The minimum stored as an integer.
    refused_in(
        AUX,
        |t, _, _| *tensor(t, &sm) = Tensor::i32(&sm, &[1, 2], &[0, 0]),
        Rule::TensorDtype,
        &sm,
    );
    // The minimum in another float dtype than the factor.
    refused_in(
        AUX,
        |t, _, _| *tensor(t, &sm) = Tensor::f32(&sm, &[1, 2], &[0.0, 0.0]),
        Rule::TensorDtype,
        &sm,
    );
    // No factor for the zero points.
    refused_in(
        AUX,
        |t, _, _| t.retain(|x| x.name != zs),
        Rule::MissingTensor,
        &zs,
    );
    // No zero point at all.
    refused_in(
        AUX,
        |t, _, _| t.retain(|x| !x.name.starts_with(&format!("{Q}.meta.zero"))),
        Rule::MissingTensor,
        &format!("{Q}.meta.zero"),
    );
    // Zero-point bytes for a different number of groups.
    refused_in(
        AUX,
        |t, _, _| *tensor(t, &zx) = Tensor::u8(&zx, "U8", &[32, 1], &[1; 32]),
        Rule::TensorShape,
        &zx,
    );
    // 8-bit scales under a method that does not name quantAux: sinq would
    // not read them.
    refused_in(
        AUX,
        |_, s, _| s[Q]["meta"]["method"] = json!("sinq"),
        Rule::Config,
        &sx,
    );
    // Both a plain and an 8-bit scale.
    refused_in(
        AUX,
        |t, _, _| {
            let plain = format!("{Q}.meta.scale");
            t.push(Tensor::f16(&plain, &[64, 1], &[1.0; 64]));
        },
        Rule::Config,
        &sx,
    );
    // A zero shape in the sidecar that is not one a group.
    refused_in(
        AUX,
        |_, s, _| s[Q]["meta"]["zero.shape"] = json!([1, 64]),
        Rule::Config,
        "zero.shape",
    );
    // The blocked (2D) tiling's 3-D scale shape in the sidecar, the zero
    // left 1D's.
    refused_in(
        AUX,
        |_, s, _| s[Q]["meta"]["scale.shape"] = json!([1, 64, 1]),
        Rule::Config,
        "zero.shape",
    );
}

/// Products straight from the packs (`Model::matmul_cpu`, and the GPU's
/// `matmul`) keep to the bound around the dense weight, for the plain,
/// quantAux and NF4 fixtures alike.
#[test]
fn products_of_packed_sinq_weights() {
    for case in [CASE, AUX, AUX2, NF4, TILED] {
        crate::matmul::products_keep_to_the_bound(case, &fixtures().join(case).join("model"));
    }
    // The int32 packings decode the grouped [R, G] rows (groups smaller
    // than a row here), which the GPU's products do not read as the
    // weight's rows: refused there in one line, kept to the bound on the
    // CPU.
    let dir = fixtures().join(BITS).join("model");
    crate::matmul::products_keep_to_the_bound_but(BITS, &dir, |name, _| {
        crate::matmul::sinq_words(&dir, name)
    });
}

//! Config variants producers write (or leave behind) that must decode exactly
//! like their canonical spelling, the ones that must be refused, and a few
//! API and GPU edge cases. Positive cases compare with a reference computed
//! from the producer's side (tests/suite/common/producer.rs: our own packing, E4M3
//! reading and one rounding step by the `half` crate), or with the same
//! tensors decoded under the canonical config.

use std::path::Path;

use crate::common::producer::{
    check_output, decode, decode_with, e4m3_byte, e4m3_ref, expect_decodes, out_size, pack_fields,
    words_for, ScaleScheme, Tensors, Want, OUTS,
};
use crate::common::{
    caught, copy_dir, ct_config, ct_config_groups, dequantize_err, fixtures, gpu_test,
    hf_quant_config, read_dir_tensors, write_checkpoint, write_json, Rng, Tensor, CPU_AUTO,
};
use serde_json::{json, Value};
use wgpu_dequant::backend::{Backend, Cpu};
use wgpu_dequant::plan::Source;
use wgpu_dequant::Format;
use wgpu_dequant::{
    dequantize, BackendChoice, Checkpoint, DtypeChoice, Error, Names, OutDtype, Plan, Rule,
};

const NORM: &str = "model.norm.weight";
const M: &str = "model.layers.0.mlp.down_proj";

fn module_param(param: &str) -> String {
    format!("{M}.{param}")
}

// ---------------------------------------------------------------------------
// Producers
// ---------------------------------------------------------------------------

/// A bf16-exact scale of moderate magnitude (no subnormal products anywhere).
fn bf16_scale(rng: &mut Rng) -> f32 {
    let e = 127 - 6 + rng.below(10) as u32;
    let sign = if rng.below(8) == 0 { 1u32 << 31 } else { 0 };
    f32::from_bits(sign | e << 23 | (rng.below(128) as u32) << 16)
}

/// BF16 scales of a `[rows, cols]` weight on `lay`: the tensor
/// `{module}.weight_scale` and its values.
fn bf16_scales(
    rng: &mut Rng,
    module: &str,
    lay: ScaleScheme,
    (rows, cols): (usize, usize),
) -> (Tensor, Vec<f32>) {
    let shape = lay.shape(None, rows, cols);
    let n = shape.iter().product::<usize>();
    let scales: Vec<f32> = (0..n).map(|_| bf16_scale(rng)).collect();
    let t = Tensor::bf16(format!("{module}.weight_scale"), &shape, &scales);
    (t, scales)
}

/// The exact values `w(i) · scale` of a `[rows, cols]` weight on `lay`.
fn scaled(
    lay: ScaleScheme,
    (rows, cols): (usize, usize),
    scales: &[f32],
    w: impl Fn(usize) -> f32,
) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| {
            let (r, c) = (i / cols, i % cols);
            w(i) * scales[lay.index(rows, cols, 0, r, c, &[])]
        })
        .collect()
}

/// One symmetric pack-quantized module (dense packing, BF16 scales).
fn pack_module(
    rng: &mut Rng,
    module: &str,
    bits: u32,
    lay: ScaleScheme,
    (rows, cols): (usize, usize),
) -> (Vec<Tensor>, Want) {
    let offset = 1i32 << (bits - 1);
    let q: Vec<i32> = (0..rows * cols)
        .map(|_| rng.below(1 << bits) as i32 - offset)
        .collect();
    let mut words = Vec::new();
    for row in q.chunks(cols) {
        let fields: Vec<u32> = row.iter().map(|&v| (v + offset) as u32).collect();
        words.extend(pack_fields(&fields, bits, false));
    }
    let width = words_for(cols, bits, false);
    assert_eq!(words.len(), rows * width);
    let (scale, scales) = bf16_scales(rng, module, lay, (rows, cols));
    let tensors = vec![
        Tensor::u32_words(format!("{module}.weight_packed"), &[rows, width], &words),
        Tensor::i64(
            format!("{module}.weight_shape"),
            &[2],
            &[rows as i64, cols as i64],
        ),
        scale,
    ];
    let vals = scaled(lay, (rows, cols), &scales, |i| q[i] as f32);
    (tensors, Want::weight(module, vec![rows, cols], vals))
}

/// One int8 (I8) or fp8 (F8_E4M3) module with BF16 scales; `bytes` are the
/// weight bytes (random when `None`; random fp8 bytes are never NaN).
fn byte_module(
    rng: &mut Rng,
    module: &str,
    float: bool,
    lay: ScaleScheme,
    (rows, cols): (usize, usize),
    bytes: Option<Vec<u8>>,
) -> (Vec<Tensor>, Want) {
    let bytes = bytes.unwrap_or_else(|| {
        (0..rows * cols)
            .map(|_| {
                if float {
                    e4m3_byte(rng)
                } else {
                    rng.below(256) as u8
                }
            })
            .collect()
    });
    assert_eq!(bytes.len(), rows * cols);
    let (scale, scales) = bf16_scales(rng, module, lay, (rows, cols));
    let tensors = vec![
        Tensor::u8(
            format!("{module}.weight"),
            if float { "F8_E4M3" } else { "I8" },
            &[rows, cols],
            &bytes,
        ),
        scale,
    ];
    let vals = scaled(lay, (rows, cols), &scales, |i| {
        if float {
            e4m3_ref(bytes[i])
        } else {
            bytes[i] as i8 as f32
        }
    });
    (tensors, Want::weight(module, vec![rows, cols], vals))
}

/// A BF16 tensor that every checkpoint carries unquantized.
fn norm() -> Tensor {
    Tensor::bf16(
        NORM,
        &[16],
        &(0..16).map(|i| i as f32 * 0.25).collect::<Vec<_>>(),
    )
}

// ---------------------------------------------------------------------------
// Running the library
// ---------------------------------------------------------------------------

/// Opens, plans and checks `path`; the error it is refused with. Fails the
/// test when it is accepted or when the library panics.
fn refuse(path: &Path) -> Error {
    let r = caught(|| -> Result<usize, Error> {
        let ckpt = Checkpoint::open(path)?;
        let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub)?;
        plan.check()?;
        Ok(plan.outputs.len())
    });
    match r {
        Err(p) => panic!("the library panicked on {}: {}", path.display(), p),
        Ok(Ok(n)) => panic!("{} was accepted ({n} outputs)", path.display()),
        Ok(Err(e)) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "message is not one line: {msg:?}");
            assert!(msg.contains(&format!("[{}]", e.rule.id())), "{msg}");
            e
        }
    }
}

/// Refused by plan and by `dequantize` with `rule`, naming `tensor`.
fn expect_refused(path: &Path, rule: Rule, tensor: Option<&str>) -> Error {
    let e = refuse(path);
    assert_eq!(e.rule, rule, "wrong rule for {}: {e}", path.display());
    assert_eq!(e.tensor.as_deref(), tensor, "tensor named by: {e}");
    let d = dequantize_err(path);
    assert_eq!(d.rule, rule, "dequantize: {d}");
    assert_eq!(d.tensor, e.tensor, "dequantize: {d}");
    e
}

fn format_of(dir: &Path) -> Format {
    let ckpt = Checkpoint::open(dir).unwrap_or_else(|e| panic!("{e}"));
    let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap_or_else(|e| panic!("{e}"));
    plan.format.clone()
}

// ---------------------------------------------------------------------------
// 1. A leftover ModelOpt sidecar beside a compressed-tensors config.json
// ---------------------------------------------------------------------------

#[test]
fn compressed_tensors_config_wins_over_leftover_hf_quant_config() {
    let orig = fixtures().join("nvfp4a16/model");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    copy_dir(&orig, &dir);
    std::fs::copy(
        fixtures().join("modelopt-nvfp4/model/hf_quant_config.json"),
        dir.join("hf_quant_config.json"),
    )
    .unwrap();
    assert!(
        matches!(format_of(&dir), Format::CompressedTensors(_)),
        "{:?}",
        format_of(&dir)
    );
    for out in OUTS {
        let want = decode(&orig, out);
        let got = decode(&dir, out);
        assert!(!want.is_empty());
        assert_eq!(
            got, want,
            "{out}: leftover hf_quant_config.json changed the output"
        );
    }
}

// ---------------------------------------------------------------------------
// 2. A dense checkpoint that stores a weight_scale
// ---------------------------------------------------------------------------

#[test]
fn dense_checkpoint_with_stray_weight_scale_is_config_error() {
    for with_config in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ckpt");
        let tensors = vec![
            norm(),
            Tensor::bf16(module_param("weight"), &[4, 8], &[0.5; 32]),
            Tensor::bf16(module_param("weight_scale"), &[4, 1], &[2.0; 4]),
        ];
        write_checkpoint(&dir, &tensors, Value::Null);
        if !with_config {
            std::fs::remove_file(dir.join("config.json")).unwrap();
        }
        let ckpt = Checkpoint::open(&dir).unwrap();
        let plan = match caught(|| Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub)) {
            Err(p) => panic!("Plan::build panicked: {p}"),
            Ok(r) => r.unwrap_or_else(|e| panic!("config={with_config}: Plan::build failed: {e}")),
        };
        assert!(
            matches!(plan.format, Format::Dense),
            "config={with_config}: {:?}",
            plan.format
        );
        assert_eq!(
            plan.errors.len(),
            1,
            "config={with_config}: {:?}",
            plan.errors
        );
        let e = &plan.errors[0];
        assert_eq!(e.rule, Rule::Config, "config={with_config}: {e}");
        assert_eq!(
            e.tensor.as_deref(),
            Some(module_param("weight_scale").as_str()),
            "config={with_config}: {e}"
        );
        let checked = plan.check().expect_err("plan has an error");
        assert_eq!(checked.rule, Rule::Config);
        drop(plan);
        drop(ckpt);
        let d = dequantize_err(&dir);
        assert_eq!(d.rule, Rule::Config, "config={with_config}: {d}");
        assert_eq!(
            d.tensor.as_deref(),
            Some(module_param("weight_scale").as_str()),
            "{d}"
        );
    }
}

// ---------------------------------------------------------------------------
// 3.–5. compressed-tensors spellings of the same scheme
// ---------------------------------------------------------------------------

/// Writes `tensors` under `weights` (pack-quantized) and checks the outputs
/// against `wants`; returns the outputs.
fn pack_variant(ctx: &str, tensors: &[Tensor], weights: Value, wants: &[Want]) -> Vec<Tensors> {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    write_checkpoint(
        &dir,
        tensors,
        ct_config("pack-quantized", weights, "0.19.0"),
    );
    expect_decodes(ctx, &dir, wants, &[norm()])
}

/// One int4 module on `lay` plus the norm: (tensors, wants).
fn int4_ckpt(seed: u64, lay: ScaleScheme) -> (Vec<Tensor>, Vec<Want>) {
    let mut rng = Rng::new(seed);
    let (mut t, w) = pack_module(&mut rng, M, 4, lay, (7, 69));
    t.push(norm());
    (t, vec![w])
}

#[test]
fn group_size_minus_one_with_channel_strategy_is_channel() {
    let (tensors, wants) = int4_ckpt(0x9E37_79B9_7F4A_7C15, ScaleScheme::Channel);
    let mut null = ScaleScheme::Channel.weights(4, "int", true, false);
    null["group_size"] = Value::Null;
    let base = pack_variant("group_size null", &tensors, null, &wants);
    let mut minus = ScaleScheme::Channel.weights(4, "int", true, false);
    minus["group_size"] = json!(-1);
    let got = pack_variant("group_size -1", &tensors, minus, &wants);
    assert_eq!(got, base, "group_size -1 decodes unlike group_size null");
}

#[test]
fn missing_or_null_strategy_is_inferred() {
    for (k, (lay, group_size)) in [
        (ScaleScheme::Group(32), json!(32)),
        (ScaleScheme::Channel, json!(-1)),
        (ScaleScheme::Tensor, Value::Null),
    ]
    .into_iter()
    .enumerate()
    {
        let (tensors, wants) = int4_ckpt(0xD1B5_4A32_D192_ED03 + k as u64, lay);
        let mut explicit = lay.weights(4, "int", true, false);
        explicit["group_size"] = group_size.clone();
        let base = pack_variant(&format!("{lay:?} explicit"), &tensors, explicit, &wants);
        for how in ["missing", "null", "missing, no group_size key"] {
            let mut w = lay.weights(4, "int", true, false);
            w["group_size"] = group_size.clone();
            let obj = w.as_object_mut().unwrap();
            match how {
                "null" => {
                    obj.insert("strategy".into(), Value::Null);
                }
                "missing" => {
                    obj.remove("strategy");
                }
                _ => {
                    if !group_size.is_null() {
                        continue;
                    }
                    obj.remove("strategy");
                    obj.remove("group_size");
                }
            }
            let got = pack_variant(&format!("{lay:?} strategy {how}"), &tensors, w, &wants);
            assert_eq!(got, base, "{lay:?}: strategy {how} decodes unlike explicit");
        }
    }
}

#[test]
fn upper_case_strategy_and_type_decode_like_lower_case() {
    let lay = ScaleScheme::Group(16);
    let (tensors, wants) = int4_ckpt(0x2545_F491_4F6C_DD1D, lay);
    let base = pack_variant(
        "lower",
        &tensors,
        lay.weights(4, "int", true, false),
        &wants,
    );
    let mut upper = lay.weights(4, "INT", true, false);
    upper["strategy"] = json!("GROUP");
    let got = pack_variant("upper", &tensors, upper, &wants);
    assert_eq!(got, base);
    // And int8 (int-quantized) with "CHANNEL" / "INT".
    let mut rng = Rng::new(0x6A09_E667_F3BC_C908);
    let (mut t, w) = byte_module(&mut rng, M, false, ScaleScheme::Channel, (5, 33), None);
    t.push(norm());
    let tmp = tempfile::tempdir().unwrap();
    let mut weights = ScaleScheme::Channel.weights(8, "INT", true, false);
    weights["strategy"] = json!("CHANNEL");
    write_checkpoint(
        tmp.path(),
        &t,
        ct_config("int-quantized", weights, "0.19.0"),
    );
    expect_decodes("int8 CHANNEL/INT", tmp.path(), &[w], &[norm()]);
}

// ---------------------------------------------------------------------------
// 6.–7. Which config group a module belongs to
// ---------------------------------------------------------------------------

#[test]
fn regex_negative_lookahead_selects_per_group() {
    let mut rng = Rng::new(0xBB67_AE85_84CA_A73B);
    let mut tensors = vec![norm()];
    let mut wants = Vec::new();
    for name in ["q_proj", "o_proj"] {
        let (t, w) = pack_module(
            &mut rng,
            &format!("model.layers.0.self_attn.{name}"),
            4,
            ScaleScheme::Group(16),
            (6, 40),
        );
        tensors.extend(t);
        wants.push(w);
    }
    for name in ["gate_proj", "down_proj"] {
        let (t, w) = pack_module(
            &mut rng,
            &format!("model.layers.0.mlp.{name}"),
            8,
            ScaleScheme::Channel,
            (5, 40),
        );
        tensors.extend(t);
        wants.push(w);
    }
    // group_0 first: a look-ahead that failed to exclude the MLPs would tie
    // with group_1 and win by file order.
    let qc = ct_config_groups(
        "pack-quantized",
        "0.19.0",
        json!({
            "group_0": {
                "format": "pack-quantized",
                "targets": ["re:^(?!.*mlp).*proj$"],
                "weights": ScaleScheme::Group(16).weights(4, "int", true, false),
            },
            "group_1": {
                "format": "pack-quantized",
                "targets": ["re:.*mlp.*"],
                "weights": ScaleScheme::Channel.weights(8, "int", true, false),
            },
        }),
    );
    let tmp = tempfile::tempdir().unwrap();
    write_checkpoint(tmp.path(), &tensors, qc);
    expect_decodes("look-ahead", tmp.path(), &wants, &[norm()]);
}

#[test]
fn two_linear_groups_pick_by_stored_form() {
    let mut rng = Rng::new(0x3C6E_F372_FE94_F82B);
    let mut tensors = vec![norm()];
    let (t, w_pack) = pack_module(
        &mut rng,
        "model.layers.0.mlp.down_proj",
        4,
        ScaleScheme::Group(16),
        (6, 48),
    );
    tensors.extend(t);
    let (t, w_fp8) = byte_module(
        &mut rng,
        "model.layers.0.self_attn.q_proj",
        true,
        ScaleScheme::Channel,
        (5, 24),
        None,
    );
    tensors.extend(t);
    let wants = [w_pack, w_fp8];
    let pack = json!({
        "format": "pack-quantized",
        "targets": ["Linear"],
        "weights": ScaleScheme::Group(16).weights(4, "int", true, false),
    });
    let float = json!({
        "format": "float-quantized",
        "targets": ["Linear"],
        "weights": ScaleScheme::Channel.weights(8, "float", true, false),
    });
    // Both file orders: neither group may win just by coming first.
    for (first, second) in [(&pack, &float), (&float, &pack)] {
        let groups = json!({"group_0": first, "group_1": second});
        let qc = ct_config_groups("mixed-precision", "0.19.0", groups);
        let tmp = tempfile::tempdir().unwrap();
        write_checkpoint(tmp.path(), &tensors, qc);
        expect_decodes(
            &format!("group_0 = {}", first["format"]),
            tmp.path(),
            &wants,
            &[norm()],
        );
    }
}

// ---------------------------------------------------------------------------
// 8. transform_config
// ---------------------------------------------------------------------------

/// A transform type that is not a ±1 Hadamard matrix is refused for the
/// whole checkpoint; a config that rotates nothing online decodes as stored.
#[test]
fn unfoldable_transform_config_is_unsupported_and_empty_is_accepted() {
    let (tensors, wants) = int4_ckpt(0xA54F_F53A_5F1D_36F1, ScaleScheme::Group(16));
    let with = |tc: Value| {
        let tmp = tempfile::tempdir().unwrap();
        let mut qc = ct_config(
            "pack-quantized",
            ScaleScheme::Group(16).weights(4, "int", true, false),
            "0.19.0",
        );
        qc["transform_config"] = tc;
        write_checkpoint(tmp.path(), &tensors, qc);
        tmp
    };
    let tmp = with(json!({"config_groups": {"u": {"type": "random-matrix"}}}));
    // A whole-checkpoint fault: Plan::build itself refuses.
    let ckpt = Checkpoint::open(tmp.path()).unwrap();
    match Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub) {
        Ok(_) => panic!("a random-matrix transform_config was planned"),
        Err(e) => assert_eq!(e.rule, Rule::Unsupported, "{e}"),
    }
    drop(ckpt);
    expect_refused(tmp.path(), Rule::Unsupported, None);
    let fused_only = json!({"config_groups": {"u": {"type": "hadamard", "apply": [
        {"targets": ["Linear"], "location": "weight_input"}]}}});
    for tc in [
        json!({}),
        Value::Null,
        json!({"config_groups": {}}),
        fused_only,
    ] {
        let tmp = with(tc.clone());
        expect_decodes(
            &format!("transform_config {tc}"),
            tmp.path(),
            &wants,
            &[norm()],
        );
    }
}

// ---------------------------------------------------------------------------
// 9. ModelOpt config spellings
// ---------------------------------------------------------------------------

#[test]
fn modelopt_config_spellings_decode_like_the_fixture() {
    let orig = fixtures().join("modelopt-nvfp4/model");
    let mut base_cfg: Value =
        serde_json::from_slice(&std::fs::read(orig.join("config.json")).unwrap()).unwrap();
    base_cfg
        .as_object_mut()
        .unwrap()
        .remove("quantization_config");
    let baseline: Vec<Tensors> = OUTS.iter().map(|&o| decode(&orig, o)).collect();
    assert!(baseline[0].keys().any(|k| k.ends_with("proj.weight")));

    let nested = |algo: &str| {
        json!({"quant_method": "modelopt", "quantization": {
            "quant_algo": algo, "group_size": 16, "exclude_modules": ["lm_head"]}})
    };
    let flat = |algo: &str, group: usize| {
        json!({"quant_method": "modelopt", "quant_algo": algo, "group_size": group,
            "exclude_modules": ["lm_head"]})
    };
    // (name, config.json quantization_config, hf_quant_config.json)
    let variants: Vec<(&str, Value, Option<Value>)> = vec![
        ("(a) nested in config.json", nested("NVFP4"), None),
        (
            "(b) nvfp4 in hf_quant_config",
            Value::Null,
            Some(hf_quant_config("nvfp4")),
        ),
        ("(b) nvfp4 nested in config.json", nested("nvfp4"), None),
        ("(b) nvfp4 flat in config.json", flat("nvfp4", 16), None),
        (
            "(c) W4A16_NVFP4 in hf_quant_config",
            Value::Null,
            Some(hf_quant_config("W4A16_NVFP4")),
        ),
        (
            "(c) W4A16_NVFP4 nested in config.json",
            nested("W4A16_NVFP4"),
            None,
        ),
        ("(c) W4A16_NVFP4 flat", flat("W4A16_NVFP4", 16), None),
        ("(d) flat with group_size", flat("NVFP4", 16), None),
    ];
    // The fixture's tensors under config.json's quantization_config `qc`
    // (none when `Value::Null`).
    let with_config = |dir: &Path, qc: Value| {
        std::fs::copy(
            orig.join("model.safetensors"),
            dir.join("model.safetensors"),
        )
        .unwrap();
        let mut cfg = base_cfg.clone();
        if !qc.is_null() {
            cfg["quantization_config"] = qc;
        }
        write_json(&dir.join("config.json"), &cfg);
    };
    for (what, qc, hfq) in variants {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        with_config(dir, qc);
        if let Some(h) = &hfq {
            write_json(&dir.join("hf_quant_config.json"), h);
        }
        match format_of(dir) {
            Format::Modelopt(c) => assert_eq!(c.group_size, 16, "{what}"),
            other => panic!("{what}: detected as {other:?}"),
        }
        for (k, &out) in OUTS.iter().enumerate() {
            let got = decode(dir, out);
            assert_eq!(
                got, baseline[k],
                "{what} -> {out}: differs from the fixture"
            );
        }
    }

    // The flat group_size is read, not assumed: 32 does not fit the scales.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    with_config(dir, flat("NVFP4", 32));
    let e = refuse(dir);
    assert_eq!(e.rule, Rule::TensorShape, "{e}");
}

// ---------------------------------------------------------------------------
// 10. A zero dimension beside huge ones
// ---------------------------------------------------------------------------

#[test]
fn zero_dimension_beside_huge_dimensions_is_refused_without_panic() {
    let pack = ct_config(
        "pack-quantized",
        ScaleScheme::Group(16).weights(4, "int", true, false),
        "0.19.0",
    );
    let nvfp4 = ct_config(
        "nvfp4-pack-quantized",
        json!({"num_bits": 4, "type": "float", "strategy": "tensor_group",
            "group_size": 16, "symmetric": true, "dynamic": false}),
        "0.19.0",
    );
    let int8 = ct_config(
        "int-quantized",
        ScaleScheme::Channel.weights(8, "int", true, false),
        "0.19.0",
    );
    let empty = |name: String, dtype: &'static str, shape: &[usize]| {
        Tensor::new(name, dtype, shape, vec![])
    };
    // (what, tensors, quantization_config (Null: ModelOpt sidecar), rule, tensor)
    let cases: Vec<(&str, Vec<Tensor>, Value, Rule, String)> = vec![
        (
            "pack weight_shape [0, 2^40], weight_packed [0, 2^35]",
            vec![
                empty(module_param("weight_packed"), "I32", &[0, 1 << 35]),
                Tensor::i64(module_param("weight_shape"), &[2], &[0, 1 << 40]),
                empty(module_param("weight_scale"), "BF16", &[0, 1 << 36]),
            ],
            pack.clone(),
            Rule::TensorValue,
            module_param("weight_shape"),
        ),
        (
            "pack weight_shape [4, 16], weight_packed [0, 2^35]",
            vec![
                empty(module_param("weight_packed"), "I32", &[0, 1 << 35]),
                Tensor::i64(module_param("weight_shape"), &[2], &[4, 16]),
                Tensor::bf16(module_param("weight_scale"), &[4, 1], &[1.0; 4]),
            ],
            pack.clone(),
            Rule::TensorShape,
            module_param("weight_packed"),
        ),
        (
            "3-D pack weight_shape [2^40, 2^40, 0], weight_packed [2^40, 0, 2^20]",
            vec![
                empty(module_param("weight_packed"), "I32", &[1 << 40, 0, 1 << 20]),
                Tensor::i64(module_param("weight_shape"), &[3], &[1 << 40, 1 << 40, 0]),
                empty(module_param("weight_scale"), "BF16", &[1 << 40, 0, 1 << 36]),
            ],
            pack,
            Rule::TensorValue,
            module_param("weight_shape"),
        ),
        (
            "modelopt weight U8 [0, 2^40]",
            vec![
                empty(module_param("weight"), "U8", &[0, 1 << 40]),
                empty(module_param("weight_scale"), "F8_E4M3", &[0, 1 << 36]),
                Tensor::f32(module_param("weight_scale_2"), &[], &[0.5]),
            ],
            Value::Null,
            Rule::TensorShape,
            module_param("weight"),
        ),
        (
            "modelopt weight U8 [2^40, 0]",
            vec![
                empty(module_param("weight"), "U8", &[1 << 40, 0]),
                empty(module_param("weight_scale"), "F8_E4M3", &[1 << 40, 0]),
                Tensor::f32(module_param("weight_scale_2"), &[], &[0.5]),
            ],
            Value::Null,
            Rule::TensorShape,
            module_param("weight"),
        ),
        (
            "nvfp4 weight_packed [2^40, 0]",
            vec![
                empty(module_param("weight_packed"), "U8", &[1 << 40, 0]),
                empty(module_param("weight_scale"), "F8_E4M3", &[1 << 40, 0]),
                Tensor::f32(module_param("weight_global_scale"), &[1], &[2.0]),
            ],
            nvfp4.clone(),
            Rule::TensorShape,
            module_param("weight_packed"),
        ),
        (
            "nvfp4 weight_packed [0, 2^40, 2^40]",
            vec![
                empty(module_param("weight_packed"), "U8", &[0, 1 << 40, 1 << 40]),
                empty(
                    module_param("weight_scale"),
                    "F8_E4M3",
                    &[0, 1 << 40, 1 << 36],
                ),
                Tensor::f32(module_param("weight_global_scale"), &[1], &[2.0]),
            ],
            nvfp4,
            Rule::TensorShape,
            module_param("weight_packed"),
        ),
        (
            "int8 weight [2^40, 0]",
            vec![
                empty(module_param("weight"), "I8", &[1 << 40, 0]),
                empty(module_param("weight_scale"), "BF16", &[0, 1]),
            ],
            int8,
            Rule::TensorShape,
            module_param("weight"),
        ),
    ];
    for (what, mut tensors, qc, rule, tensor) in cases {
        tensors.push(norm());
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ckpt");
        let modelopt = qc.is_null();
        write_checkpoint(&dir, &tensors, qc);
        if modelopt {
            write_json(
                &dir.join("hf_quant_config.json"),
                &json!({"producer": {"name": "modelopt", "version": "0.47.0"},
                    "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                        "exclude_modules": ["lm_head"]}}),
            );
        }
        let e = refuse(&dir);
        eprintln!("{what}: {e}");
        assert_eq!(e.rule, rule, "{what}: {e}");
        assert_eq!(e.tensor.as_deref(), Some(tensor.as_str()), "{what}: {e}");
        let d = dequantize_err(&dir);
        assert_eq!(d.rule, rule, "{what}: dequantize: {d}");
    }

    // A dense tensor with a zero dimension beside a huge one is copied (it
    // holds no bytes) or refused, never a panic.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("dense-in");
    write_checkpoint(
        &dir,
        &[
            norm(),
            empty("model.empty.weight".into(), "BF16", &[0, 1 << 40]),
        ],
        Value::Null,
    );
    let out = tmp.path().join("dense-out");
    match caught(|| dequantize(&dir, &out, &CPU_AUTO)) {
        Err(p) => panic!("dense [0, 2^40]: dequantize panicked: {p}"),
        Ok(Err(e)) => assert!(!out.exists(), "failed ({e}) but left output"),
        Ok(Ok(_)) => {
            let got = read_dir_tensors(&out);
            assert_eq!(
                got["model.empty.weight"],
                ("BF16".to_string(), vec![0, 1 << 40], vec![])
            );
        }
    }
}

// ---------------------------------------------------------------------------
// 11. Backend::decode_rows arguments
// ---------------------------------------------------------------------------

#[test]
#[allow(clippy::reversed_empty_ranges)]
fn cpu_decode_rows_with_bad_rows_or_buffer_is_argument_error() {
    let ckpt = Checkpoint::open(fixtures().join("w4a16-g128/model")).unwrap();
    let plan = Plan::build(&ckpt, DtypeChoice::Fixed(OutDtype::Bf16), Names::Hub).unwrap();
    let job = plan
        .outputs
        .iter()
        .find_map(|o| match &o.source {
            Source::Decode(job) => Some(job),
            _ => None,
        })
        .expect("the fixture has a decoded module");
    let cpu = Cpu::new();
    let total = job.dims.total_rows();
    let rb = job.dims.cols * job.out.size();
    assert!(total > 4);

    // Good calls first: a sub-range equals that part of the whole tensor.
    let whole = cpu.decode(job).unwrap();
    let mut part = vec![0u8; 2 * rb];
    cpu.decode_rows(job, 1..3, &mut part).unwrap();
    assert_eq!(part, whole[rb..3 * rb]);
    cpu.decode_rows(job, total..total, &mut []).unwrap();

    let cases: Vec<(&str, std::ops::Range<usize>, usize)> = vec![
        ("one row past the end", 0..total + 1, (total + 1) * rb),
        ("starting at the end", total..total + 1, rb),
        ("far beyond the end", total + 10..total + 12, 2 * rb),
        ("start after end", 3..2, 0),
        ("buffer one byte short", 0..2, 2 * rb - 1),
        ("buffer one byte long", 0..2, 2 * rb + 1),
        ("empty buffer for two rows", 0..2, 0),
        ("whole tensor, buffer of one row", 0..total, rb),
        ("rows up to usize::MAX", 0..usize::MAX, 0),
        (
            "rows usize::MAX - 1..usize::MAX",
            usize::MAX - 1..usize::MAX,
            rb,
        ),
    ];
    // Every case is tried; the failures are reported together.
    let mut failures = Vec::new();
    for (what, rows, len) in cases {
        let mut out = vec![0u8; len];
        let r = caught(|| cpu.decode_rows(job, rows.clone(), &mut out));
        let call = format!("{what}: decode_rows({rows:?}, {len}-byte buffer)");
        match r {
            Err(p) => failures.push(format!("{call} panicked: {p}")),
            Ok(Ok(())) => failures.push(format!("{call} was accepted")),
            Ok(Err(e)) if e.rule != Rule::Argument => {
                failures.push(format!("{call}: rule {:?}, not Argument: {e}", e.rule))
            }
            Ok(Err(e)) => assert!(!e.to_string().contains('\n'), "{e}"),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------
// 12. GPU equals CPU on huge grid divisors and NaN codes
// ---------------------------------------------------------------------------

/// Decodes `dir` on both backends to every dtype; both must equal each other
/// and the reference. Returns the GPU outputs.
fn gpu_equals_cpu(ctx: &str, dir: &Path, wants: &[Want], copies: &[Tensor]) -> Vec<Tensors> {
    OUTS.iter()
        .map(|&out| {
            let gpu = decode_with(dir, out, BackendChoice::Gpu);
            let cpu = decode_with(dir, out, BackendChoice::Cpu);
            check_output(&format!("{ctx} -> {out} (cpu)"), &cpu, out, wants, copies);
            check_output(&format!("{ctx} -> {out} (gpu)"), &gpu, out, wants, copies);
            assert_eq!(gpu, cpu, "{ctx} -> {out}: GPU and CPU differ");
            gpu
        })
        .collect()
}

#[test]
fn gpu_equals_cpu_on_huge_divisors_and_nan_codes() {
    gpu_test(|_| {
        let mut rng = Rng::new(0x510E_527F_ADE6_82D1);

        // Block rows and group columns beyond u32.
        for lay in [
            ScaleScheme::Block(4_294_967_297, 8),
            ScaleScheme::Group(4_294_967_300),
        ] {
            let mut tensors = vec![norm()];
            let mut wants = Vec::new();
            for (k, dims) in [(6, 37), (3, 8)].into_iter().enumerate() {
                let (t, w) = byte_module(
                    &mut rng,
                    &format!("model.layers.{k}.self_attn.q_proj"),
                    false,
                    lay,
                    dims,
                    None,
                );
                tensors.extend(t);
                wants.push(w);
            }
            let tmp = tempfile::tempdir().unwrap();
            write_checkpoint(
                tmp.path(),
                &tensors,
                ct_config(
                    "int-quantized",
                    lay.weights(8, "int", true, false),
                    "0.19.0",
                ),
            );
            gpu_equals_cpu(&format!("int8 {lay:?}"), tmp.path(), &wants, &[norm()]);
        }

        // FP8 NaN codes (0x7F, 0xFF) among ordinary ones.
        let (rows, cols) = (4, 20);
        let bytes: Vec<u8> = (0..rows * cols)
            .map(|i| match i % 5 {
                0 => 0x7F,
                3 => 0xFF,
                _ => e4m3_byte(&mut rng),
            })
            .collect();
        let (mut tensors, want) = byte_module(
            &mut rng,
            M,
            true,
            ScaleScheme::Channel,
            (rows, cols),
            Some(bytes.clone()),
        );
        tensors.push(norm());
        let tmp = tempfile::tempdir().unwrap();
        write_checkpoint(
            tmp.path(),
            &tensors,
            ct_config(
                "float-quantized",
                ScaleScheme::Channel.weights(8, "float", true, false),
                "0.19.0",
            ),
        );
        let outs = gpu_equals_cpu("fp8 NaN codes", tmp.path(), &[want], &[norm()]);
        for (out, got) in OUTS.iter().zip(&outs) {
            let data = &got[&module_param("weight")].2;
            let size = out_size(*out);
            for (i, &b) in bytes.iter().enumerate() {
                if b & 0x7F == 0x7F {
                    let e = &data[i * size..(i + 1) * size];
                    let bits = match out {
                        OutDtype::F32 => u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
                        _ => u16::from_le_bytes([e[0], e[1]]) as u32,
                    };
                    let canonical = match out {
                        OutDtype::Bf16 => 0x7FC0,
                        OutDtype::F16 => 0x7E00,
                        OutDtype::F32 => 0x7FC0_0000,
                    };
                    assert_eq!(
                        bits, canonical,
                        "{out}: element {i} (byte {b:#04x}) is {bits:#x}, not the canonical NaN"
                    );
                }
            }
        }
    });
}

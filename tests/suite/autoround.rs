//! AutoRound's integer exports (`quant_method: "auto-round"`), made by
//! AutoRound 0.16.1 itself (tests/autoround/make_fixture.py: RTN on the CPU)
//! with an `extra_config`: one module at 8 bits group 64 by name, the k/v
//! projections at 3 bits group 16 by a regex key (AWQ: 4 bits group 16),
//! one module left dense (bits 16) and a quantized `lm_head` (not in the
//! AWQ export: AutoRound's layer-by-layer AWQ packing leaves it dense);
//! the reference bytes are AutoRound's own dequantization of what it wrote.
//!
//! - `autoround-gptq-mix`: `auto_round:auto_gptq` (symmetric; z − 1 stored,
//!   `qlinear_torch_zp`)
//! - `autoround-asym-mix`: `auto_round` (asymmetric; z stored,
//!   `qlinear_torch`)
//! - `autoround-awq-mix`: `auto_round:auto_awq` (AWQ GEMM packing,
//!   `dequantize_gemm`)
//! - `autoround-w567-gptq`: `auto_round:auto_gptq` at 4 bits with modules at
//!   5, 6 and 7 bits (`auto_round.utils.bit_packing`'s stream, fields
//!   straddling words; `qlinear_torch_zp`)
//! - `autoround-w567-asym`: `auto_round` at 5 bits with modules at 6 and 7
//!   (`qlinear_torch`)
//! - `autoround-gptqmodel-mix`: `auto_round:gptqmodel` (GPTQ's layout with
//!   `g_idx`, zero points stored as they are; `qlinear_torch`) at 4 bits
//!   with modules at 8, 5 and 3 bits

use serde_json::{json, Value};
use wgpu_dequant::{BackendChoice, DtypeChoice, OutDtype, Rule};

use crate::common::{
    check_case, copy_dir, dequantize_err, fixtures, gpu_test, read_tensors, tensors_of, write_json,
    write_safetensors, Tensor,
};

const CASES: [&str; 6] = [
    "autoround-gptq-mix",
    "autoround-asym-mix",
    "autoround-awq-mix",
    "autoround-w567-gptq",
    "autoround-w567-asym",
    "autoround-gptqmodel-mix",
];

fn matches_autoround(case: &str, backend: BackendChoice) {
    for (dtype, digests) in [
        (OutDtype::F16, "expected-f16.digests.json"),
        (OutDtype::F32, "expected-f32.digests.json"),
        (OutDtype::Bf16, "expected-bf16.digests.json"),
    ] {
        check_case(case, DtypeChoice::Fixed(dtype), backend, digests, false);
    }
}

#[test]
fn autoround_matches_its_dequantizer_on_cpu() {
    for case in CASES {
        matches_autoround(case, BackendChoice::Cpu);
    }
}

#[test]
fn autoround_matches_its_dequantizer_on_gpu() {
    gpu_test(|_| {
        for case in CASES {
            matches_autoround(case, BackendChoice::Gpu);
        }
    });
}

/// The scheme of every module is AutoRound's loader's (plan.json, from its
/// `get_layer_config`); inspect names the packing and the rules.
#[test]
fn autoround_schemes_per_module() {
    for (case, name, packing) in [
        ("autoround-gptq-mix", "auto-round (auto_gptq packing)", "v1"),
        (
            "autoround-asym-mix",
            "auto-round (auto_round packing)",
            "v2",
        ),
        ("autoround-awq-mix", "auto-round (auto_awq packing)", ""),
        (
            "autoround-w567-gptq",
            "auto-round (auto_gptq packing)",
            "v1",
        ),
        (
            "autoround-w567-asym",
            "auto-round (auto_round packing)",
            "v2",
        ),
        (
            "autoround-gptqmodel-mix",
            "auto-round (gptqmodel packing)",
            "v2",
        ),
    ] {
        let dir = fixtures().join(case).join("model");
        let ckpt = wgpu_dequant::Checkpoint::open(&dir).unwrap();
        let plan =
            wgpu_dequant::Plan::build(&ckpt, DtypeChoice::Auto, wgpu_dequant::Names::Hub).unwrap();
        let lines = plan.format.report_lines().join("; ");
        assert!(lines.contains("extra_config: "), "{case}: {lines}");
        let plan_json: Value = serde_json::from_slice(
            &std::fs::read(fixtures().join(case).join("plan.json")).unwrap(),
        )
        .unwrap();
        for (module, scheme) in plan_json.as_object().unwrap() {
            let out = plan
                .outputs
                .iter()
                .find(|o| o.name == format!("{module}.weight"))
                .unwrap_or_else(|| panic!("{case}: {module}"));
            let scheme = scheme.as_str().unwrap();
            if scheme == "dense" {
                assert_eq!(out.scheme, None, "{case}: {module}");
                continue;
            }
            // "4-bit group 32 sym" -> "int4 group 32 sym"
            let (bits, rest) = scheme.split_once("-bit ").unwrap();
            let want = format!("{name} int{bits} {rest}");
            let got = out.scheme.as_deref().unwrap_or_default();
            assert!(
                got.starts_with(&want) && got.ends_with(packing),
                "{case}: {module}: {got} (want {want} {packing})"
            );
        }
    }
}

/// The AWQ export's `lm_head`, quantized by `extra_config` but stored
/// dense by auto-round 0.16.1, is copied with a CFG-004 warning (AutoRound's
/// loader would look for its `qweight`); the other exports warn of nothing.
#[test]
fn autoround_dense_lm_head_against_its_config_warns() {
    for case in CASES {
        let dir = fixtures().join(case).join("model");
        let ckpt = wgpu_dequant::Checkpoint::open(&dir).unwrap();
        let plan =
            wgpu_dequant::Plan::build(&ckpt, DtypeChoice::Auto, wgpu_dequant::Names::Hub).unwrap();
        let subjects: Vec<&str> = plan.warnings.iter().map(|w| w.subject.as_str()).collect();
        if case.contains("awq") {
            assert_eq!(subjects, ["lm_head"], "{case}");
            assert_eq!(plan.warnings[0].rule, Rule::Disagree, "{case}");
        } else {
            assert!(subjects.is_empty(), "{case}: {subjects:?}");
        }
    }
}

/// The regex key alone (AutoRound's export also lists the modules it
/// matched by name) gives the same bytes: `re.search` anywhere in the name.
#[test]
fn autoround_regex_key_alone() {
    for case in ["autoround-gptq-mix", "autoround-awq-mix"] {
        let tmp = tempfile::tempdir().unwrap();
        copy_dir(&fixtures().join(case).join("model"), tmp.path());
        let path = tmp.path().join("config.json");
        let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let extra = cfg["quantization_config"]["extra_config"]
            .as_object_mut()
            .unwrap();
        let before = extra.len();
        extra.retain(|k, _| !(k.contains("k_proj") || k.contains("v_proj")) || k.starts_with(".*"));
        assert_eq!(extra.len(), before - 4, "{case}");
        write_json(&path, &cfg);
        let want =
            crate::common::producer::decode(&fixtures().join(case).join("model"), OutDtype::F16);
        let got = crate::common::producer::decode(tmp.path(), OutDtype::F16);
        assert!(got == want, "{case}");
    }
}

/// Malformed AutoRound configs over the fixtures' tensors: each refused by
/// its rule, nothing written.
#[test]
fn autoround_malformed_refused() {
    type Edit = (
        &'static str,
        &'static str,
        Rule,
        Option<&'static str>,
        fn(&mut Value),
    );
    let cases: [Edit; 16] = [
        (
            "autoround-w567-gptq",
            "k_proj packed at 7 bits, the config says 6",
            Rule::TensorShape,
            Some("model.layers.0.self_attn.k_proj.qweight"),
            |q| {
                q["extra_config"]["model.layers.0.self_attn.k_proj"]["bits"] = json!(6);
            },
        ),
        (
            "autoround-w567-gptq",
            "lm_head packed at 5 bits, the config says 7",
            Rule::TensorShape,
            Some("lm_head.qweight"),
            |q| {
                q["extra_config"]["lm_head"]["bits"] = json!(7);
            },
        ),
        (
            "autoround-w567-asym",
            "base bits 9",
            Rule::Unsupported,
            None,
            |q| {
                q["bits"] = json!(9);
            },
        ),
        (
            "autoround-w567-asym",
            "packed at 5 bits, the config says 6",
            Rule::TensorShape,
            None,
            |q| {
                q["bits"] = json!(6);
            },
        ),
        (
            "autoround-w567-asym",
            "5-bit scales in groups of 32, the config says 64",
            Rule::TensorShape,
            Some("model.layers.0.mlp.gate_proj.scales"),
            |q| {
                q["group_size"] = json!(64);
            },
        ),
        (
            "autoround-w567-asym",
            "auto_awq packing at 5 bits",
            Rule::Unsupported,
            None,
            |q| {
                q["packing_format"] = json!("auto_round:auto_awq");
            },
        ),
        (
            "autoround-w567-gptq",
            "extra_config bits 0",
            Rule::Unsupported,
            None,
            |q| {
                q["extra_config"]["model.layers.0.mlp.down_proj"]["bits"] = json!(0);
            },
        ),
        (
            "autoround-gptq-mix",
            "an extra_config key that is not a regex",
            Rule::Config,
            None,
            |q| {
                q["extra_config"]["model.layers.(0"] = json!({"bits": 8});
            },
        ),
        (
            "autoround-gptq-mix",
            "extra_config bits 1",
            Rule::Unsupported,
            None,
            |q| {
                q["extra_config"]["model.layers.0.mlp.down_proj"]["bits"] = json!(1);
            },
        ),
        (
            "autoround-gptq-mix",
            "extra_config group_size 0",
            Rule::Config,
            None,
            |q| {
                q["extra_config"]["model.layers.0.mlp.down_proj"]["group_size"] = json!(0);
            },
        ),
        (
            "autoround-gptq-mix",
            "an fp data_type",
            Rule::Unsupported,
            None,
            |q| {
                q["extra_config"]["model.layers.0.mlp.down_proj"]["data_type"] = json!("nv_fp");
            },
        ),
        (
            "autoround-asym-mix",
            "activations quantized",
            Rule::Unsupported,
            None,
            |q| {
                q["act_bits"] = json!(8);
            },
        ),
        (
            "autoround-gptq-mix",
            "a bits-16 module stored packed",
            Rule::Config,
            Some("model.layers.0.mlp.up_proj.qweight"),
            |q| {
                q["extra_config"]["model.layers.0.mlp.up_proj"] = json!({"bits": 16});
            },
        ),
        (
            "autoround-gptq-mix",
            "packed at 8 bits, the config says 4 (the codes read as 256 inputs)",
            Rule::TensorShape,
            Some("model.layers.0.mlp.down_proj.scales"),
            |q| {
                q["extra_config"]["model.layers.0.mlp.down_proj"] = json!({"group_size": 64});
            },
        ),
        (
            "autoround-awq-mix",
            "scales in groups of 64, the config says 32",
            Rule::TensorShape,
            Some("model.layers.0.mlp.down_proj.scales"),
            |q| {
                q["extra_config"]
                    .as_object_mut()
                    .unwrap()
                    .remove("model.layers.0.mlp.down_proj");
            },
        ),
        (
            "autoround-awq-mix",
            "AWQ packing at 8 bits",
            Rule::Unsupported,
            Some("model.layers.0.mlp.down_proj.qweight"),
            |q| {
                q["extra_config"]["model.layers.0.mlp.down_proj"]["bits"] = json!(8);
            },
        ),
    ];
    for (case, what, rule, tensor, edit) in cases {
        let tmp = tempfile::tempdir().unwrap();
        copy_dir(&fixtures().join(case).join("model"), tmp.path());
        let path = tmp.path().join("config.json");
        let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(&mut cfg["quantization_config"]);
        write_json(&path, &cfg);
        let e = dequantize_err(tmp.path());
        assert_eq!(e.rule, rule, "{case}: {what}: {e}");
        if let Some(t) = tensor {
            assert_eq!(e.tensor.as_deref(), Some(t), "{case}: {what}: {e}");
        }
        assert!(!e.to_string().contains('\n'), "{what}: {e}");
    }
}

/// AutoRound's FP exports (`packing_format: "auto_round:llm_compressor"`),
/// made by auto-round 0.16.1 itself (tests/autoround/make_fp_fixture.py);
/// the reference bytes are its `NVFP4QuantLinear` / `MXFP4QuantLinear` /
/// `MXFP8QuantLinear` / `NVFP4E5M3QuantLinear` `dequant_weight_online()` of
/// what it wrote.
const FP_CASES: [(&str, &str); 4] = [
    (
        "autoround-nvfp4-bf16",
        "(llm_compressor packing) nvfp4 fp4 e4m3-scale/global group 16",
    ),
    (
        "autoround-mxfp4-bf16",
        "(llm_compressor packing) mxfp4 fp4 e8m0-scale group 32",
    ),
    (
        "autoround-mxfp8-bf16",
        "(llm_compressor packing) mxfp8 fp8 e8m0-scale group 32",
    ),
    (
        "autoround-nvfp4e5m3-bf16",
        "(llm_compressor_nvfp4_e5m3 packing) nvfp4_v2 fp4 e5m3-scale group 16",
    ),
];
const NVFP4: &str = "autoround-nvfp4-bf16";
/// An MXFP4 export with an `extra_config`: layer 0's down_proj in MXFP8,
/// the k/v projections (regex key) in NVFP4, layer 1's o_proj dense
/// (`bits` and `act_bits` 16).
const FP_MIX: &str = "autoround-mxfp4-mix";

#[test]
fn autoround_fp_matches_its_dequantizer_on_cpu() {
    for case in FP_CASES.map(|c| c.0).into_iter().chain([FP_MIX]) {
        matches_autoround(case, BackendChoice::Cpu);
    }
}

#[test]
fn autoround_fp_matches_its_dequantizer_on_gpu() {
    gpu_test(|_| {
        for case in FP_CASES.map(|c| c.0).into_iter().chain([FP_MIX]) {
            matches_autoround(case, BackendChoice::Gpu);
        }
    });
}

/// Every quantized module has the export's scheme, named with its packing;
/// nothing is warned of.
#[test]
fn autoround_fp_scheme() {
    for (case, scheme) in FP_CASES {
        let dir = fixtures().join(case).join("model");
        let ckpt = wgpu_dequant::Checkpoint::open(&dir).unwrap();
        let plan =
            wgpu_dequant::Plan::build(&ckpt, DtypeChoice::Auto, wgpu_dequant::Names::Hub).unwrap();
        let plan_json: Value = serde_json::from_slice(
            &std::fs::read(fixtures().join(case).join("plan.json")).unwrap(),
        )
        .unwrap();
        let modules = plan_json.as_object().unwrap();
        assert_eq!(modules.len(), 14, "{case}");
        let want = format!("auto-round {scheme}");
        for module in modules.keys() {
            let out = plan
                .outputs
                .iter()
                .find(|o| o.name == format!("{module}.weight"))
                .unwrap_or_else(|| panic!("{case}: {module}"));
            assert_eq!(
                out.scheme.as_deref(),
                Some(want.as_str()),
                "{case}: {module}"
            );
        }
        assert!(plan.warnings.is_empty(), "{case}: {:?}", plan.warnings);
    }
}

/// Malformed FP exports, and the FP exports not decoded: each refused
/// by its rule, nothing written.
#[test]
fn autoround_fp_malformed_refused() {
    type Edit = (
        &'static str,
        &'static str,
        Rule,
        Option<&'static str>,
        fn(&mut Value),
    );
    let cases: [Edit; 20] = [
        (
            "autoround-mxfp4-bf16",
            "mx_fp at 8 bits over MXFP4's packs",
            Rule::MissingTensor,
            None,
            |q| {
                q["bits"] = json!(8);
            },
        ),
        (
            "autoround-mxfp8-bf16",
            "mx_fp at 4 bits over MXFP8's weights",
            Rule::MissingTensor,
            None,
            |q| {
                q["bits"] = json!(4);
            },
        ),
        (
            NVFP4,
            "MXFP6 (mx_fp at 6 bits)",
            Rule::Unsupported,
            None,
            |q| {
                q["data_type"] = json!("mx_fp");
                q["bits"] = json!(6);
                q["group_size"] = json!(32);
            },
        ),
        (
            NVFP4,
            "mx_fp in groups of 16 over NVFP4 tensors",
            Rule::Unsupported,
            None,
            |q| {
                q["data_type"] = json!("mx_fp");
            },
        ),
        (
            NVFP4,
            "nvfp4_v2 over NVFP4's E4M3 scales",
            Rule::TensorDtype,
            None,
            |q| {
                q["data_type"] = json!("nvfp4_v2");
                q["packing_format"] = json!("auto_round:llm_compressor_nvfp4_e5m3");
            },
        ),
        (
            NVFP4,
            "nvfp4_v2 in auto_round:llm_compressor packing",
            Rule::Config,
            None,
            |q| {
                q["data_type"] = json!("nvfp4_v2");
            },
        ),
        (
            "autoround-nvfp4e5m3-bf16",
            "nvfp4_v2 in groups of 32",
            Rule::Unsupported,
            None,
            |q| {
                q["group_size"] = json!(32);
            },
        ),
        (NVFP4, "nv_fp at 8 bits", Rule::Unsupported, None, |q| {
            q["bits"] = json!(8);
        }),
        (
            NVFP4,
            "nv_fp in groups of 32",
            Rule::Unsupported,
            None,
            |q| {
                q["group_size"] = json!(32);
            },
        ),
        (
            NVFP4,
            "an int module in the FP export's extra_config",
            Rule::Unsupported,
            None,
            |q| {
                q["extra_config"] = json!({"lm_head": {"bits": 4, "data_type": "int"}});
            },
        ),
        (
            FP_MIX,
            "k_proj int4 in the FP export (IntQuantLinear)",
            Rule::Unsupported,
            None,
            |q| {
                q["extra_config"]["model.layers.0.self_attn.k_proj"]["data_type"] = json!("int");
            },
        ),
        (
            FP_MIX,
            "down_proj said MXFP4, stored MXFP8",
            Rule::MissingTensor,
            None,
            |q| {
                q["extra_config"]["model.layers.0.mlp.down_proj"]["bits"] = json!(4);
            },
        ),
        (
            FP_MIX,
            "nv_fp in groups of 32 by the regex key",
            Rule::Unsupported,
            None,
            |q| {
                q["extra_config"][".*self_attn\\.[kv]_proj.*"]["group_size"] = json!(32);
            },
        ),
        (
            FP_MIX,
            "a packed module said dense (bits 16)",
            Rule::Config,
            Some("model.layers.0.self_attn.q_proj.weight_packed"),
            |q| {
                q["extra_config"]["model.layers.0.self_attn.q_proj"] = json!({"bits": 16});
            },
        ),
        (
            FP_MIX,
            "k_proj said MXFP4 over NVFP4's E4M3 scales",
            Rule::TensorDtype,
            Some("model.layers.0.self_attn.k_proj.weight_scale"),
            |q| {
                q["extra_config"]["model.layers.0.self_attn.k_proj"] =
                    json!({"data_type": "mx_fp", "group_size": 32});
            },
        ),
        (
            FP_MIX,
            "an entry with super_bits",
            Rule::Unsupported,
            None,
            |q| {
                q["extra_config"]["model.layers.0.mlp.down_proj"]["super_bits"] = json!(6);
            },
        ),
        (
            FP_MIX,
            "an nvfp4_v2 entry in llm_compressor packing",
            Rule::Config,
            None,
            |q| {
                q["extra_config"]["model.layers.0.self_attn.k_proj"]["data_type"] =
                    json!("nvfp4_v2");
            },
        ),
        (
            NVFP4,
            "an int data_type in llm_compressor packing",
            Rule::Unsupported,
            None,
            |q| {
                q["data_type"] = json!("int");
            },
        ),
        (NVFP4, "a group_size of 0", Rule::Config, None, |q| {
            q["group_size"] = json!(0);
        }),
        (NVFP4, "asymmetric nv_fp", Rule::Unsupported, None, |q| {
            q["sym"] = json!(false);
        }),
    ];
    for (case, what, rule, tensor, edit) in cases {
        let tmp = tempfile::tempdir().unwrap();
        copy_dir(&fixtures().join(case).join("model"), tmp.path());
        let path = tmp.path().join("config.json");
        let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(&mut cfg["quantization_config"]);
        write_json(&path, &cfg);
        let e = dequantize_err(tmp.path());
        assert_eq!(e.rule, rule, "{case}: {what}: {e}");
        if let Some(t) = tensor {
            assert_eq!(e.tensor.as_deref(), Some(t), "{what}: {e}");
        }
        assert!(!e.to_string().contains('\n'), "{what}: {e}");
    }
}

/// The `auto_round:gptqmodel` export's tensors broken one at a time (its
/// `g_idx` and packs): each refused by its rule, nothing written.
#[test]
fn autoround_gptqmodel_malformed_refused() {
    const CASE: &str = "autoround-gptqmodel-mix";
    const K: &str = "model.layers.0.self_attn.k_proj";
    type Edit = (&'static str, Rule, fn(&mut Vec<Tensor>));
    let cases: [Edit; 6] = [
        ("g_idx one short", Rule::TensorShape, |ts| {
            let t = ts
                .iter_mut()
                .find(|t| t.name == format!("{K}.g_idx"))
                .unwrap();
            t.shape = vec![63];
            t.data.truncate(63 * 4);
        }),
        ("g_idx past the groups", Rule::TensorValue, |ts| {
            let t = ts
                .iter_mut()
                .find(|t| t.name == format!("{K}.g_idx"))
                .unwrap();
            t.data[..4].copy_from_slice(&4i32.to_le_bytes());
        }),
        ("g_idx negative", Rule::TensorValue, |ts| {
            let t = ts
                .iter_mut()
                .find(|t| t.name == format!("{K}.g_idx"))
                .unwrap();
            t.data[8..12].copy_from_slice(&(-1i32).to_le_bytes());
        }),
        ("g_idx as f32", Rule::TensorDtype, |ts| {
            let t = ts
                .iter_mut()
                .find(|t| t.name == format!("{K}.g_idx"))
                .unwrap();
            t.dtype = "F32";
        }),
        ("qzeros a word short", Rule::TensorShape, |ts| {
            let t = ts
                .iter_mut()
                .find(|t| t.name == format!("{K}.qzeros"))
                .unwrap();
            let (g, w) = (t.shape[0], t.shape[1]);
            let data: Vec<u8> = t
                .data
                .chunks_exact(w * 4)
                .flat_map(|r| r[..(w - 1) * 4].to_vec())
                .collect();
            t.shape = vec![g, w - 1];
            t.data = data;
        }),
        ("5-bit qweight a row short", Rule::TensorShape, |ts| {
            let t = ts
                .iter_mut()
                .find(|t| t.name == format!("{K}.qweight"))
                .unwrap();
            let (r, c) = (t.shape[0], t.shape[1]);
            t.shape = vec![r - 1, c];
            t.data.truncate((r - 1) * c * 4);
        }),
    ];
    for (what, rule, edit) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let model = fixtures().join(CASE).join("model");
        copy_dir(&model, tmp.path());
        let file = tmp.path().join("model.safetensors");
        let mut ts = tensors_of(read_tensors(&file));
        edit(&mut ts);
        write_safetensors(&file, &ts);
        let e = dequantize_err(tmp.path());
        assert_eq!(e.rule, rule, "{what}: {e}");
        assert!(e.to_string().contains(K), "{what}: {e}");
        assert!(!e.to_string().contains('\n'), "{what}: {e}");
    }
}

/// The mixed FP export: each module has the scheme AutoRound's loader gave
/// it (plan.json: its QuantLinear class), layer 1's o_proj is copied as
/// stored, nothing is warned of.
#[test]
fn autoround_fp_extra_config_schemes() {
    let dir = fixtures().join(FP_MIX).join("model");
    let ckpt = wgpu_dequant::Checkpoint::open(&dir).unwrap();
    let plan =
        wgpu_dequant::Plan::build(&ckpt, DtypeChoice::Auto, wgpu_dequant::Names::Hub).unwrap();
    let plan_json: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join(FP_MIX).join("plan.json")).unwrap())
            .unwrap();
    let modules = plan_json.as_object().unwrap();
    assert_eq!(modules.len(), 13);
    for (module, class) in modules {
        let want = match class.as_str().unwrap() {
            "MXFP4QuantLinear" => FP_CASES[1].1,
            "MXFP8QuantLinear" => FP_CASES[2].1,
            "NVFP4QuantLinear" => FP_CASES[0].1,
            other => panic!("{other}"),
        };
        let out = plan
            .outputs
            .iter()
            .find(|o| o.name == format!("{module}.weight"))
            .unwrap_or_else(|| panic!("{module}"));
        assert_eq!(
            out.scheme.as_deref(),
            Some(format!("auto-round {want}").as_str()),
            "{module}"
        );
    }
    let dense = plan
        .outputs
        .iter()
        .find(|o| o.name == "model.layers.1.self_attn.o_proj.weight")
        .unwrap();
    assert_eq!(dense.scheme, None);
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
}

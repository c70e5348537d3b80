//! `convert --to compressed-tensors` (rule CT-005): a ModelOpt NVFP4 export
//! renamed the way compressed-tensors' `ModelOptNvfp4Converter` does it,
//! checked against expectations computed here from the input tensors, and
//! read back by `inspect` and `dequantize`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::cli::{ok, read_json, run, stderr};
use crate::common::producer::{compare_bytes, e2m1_ref, e4m3_ref, encode, Tensors};
use crate::common::{
    copy_dir, fixtures, gpu_test, read_dir_tensors, read_tensors, safetensors_bytes, snapshot,
    write_checkpoint, write_json, write_safetensors, Tensor, SHARD1, SHARD2,
};
use serde_json::{json, Value};
use wgpu_dequant::convert::{self, ConvertTo};
use wgpu_dequant::{backend, writer, Checkpoint, OutDtype, Rule};

const INDEX: &str = "model.safetensors.index.json";

/// Unquantized tensors of the ModelOpt fixture: copied, never renamed.
const DENSE: &[&str] = &[
    "lm_head.weight",
    "model.embed_tokens.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.norm.weight",
];

fn modelopt_fixture() -> PathBuf {
    fixtures().join("modelopt-nvfp4/model")
}

// ---------------------------------------------------------------------------
// Running the binary
// ---------------------------------------------------------------------------

fn convert_cli(input: &Path, out: &Path) -> Output {
    run(&[
        "convert",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--to",
        "compressed-tensors",
    ])
}

/// Asserts the command failed with the rule's exit code (3 for a fault of
/// the input, 1 for the output location) and one `error:` line naming
/// `[rule]` and each of `names`; nothing panicked.
fn refused(o: &Output, what: &str, rule: &str, names: &[&str]) {
    let err = stderr(o);
    let code = if rule == "OUT-001" { 1 } else { 3 };
    assert_eq!(
        o.status.code(),
        Some(code),
        "{what}: exit status {}; stderr:\n{err}",
        o.status
    );
    assert!(!err.contains("panicked"), "{what} panicked:\n{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: stderr is not one line:\n{err}");
    assert!(lines[0].starts_with("error: "), "{what}: {err}");
    assert!(
        lines[0].contains(&format!("[{rule}]")),
        "{what}: stderr does not name [{rule}]: {err}"
    );
    for n in names {
        assert!(
            lines[0].contains(n),
            "{what}: stderr does not name {n}: {err}"
        );
    }
}

/// Names of the entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    snapshot(dir).into_iter().map(|(n, _)| n).collect()
}

/// `convert::plan` through the library must fail with `rule`, and writing
/// must never have started: `out` is not created.
fn library_refuses(input: &Path, rule: Rule) -> String {
    let ckpt = Checkpoint::open(input).unwrap_or_else(|e| panic!("open: {e}"));
    match convert::plan(&ckpt, ConvertTo::CompressedTensors) {
        Ok(p) => panic!(
            "convert::plan accepted {}: {} outputs",
            input.display(),
            p.outputs.len()
        ),
        Err(e) => {
            assert_eq!(e.rule, rule, "library error: {e}");
            e.to_string()
        }
    }
}

// ---------------------------------------------------------------------------
// Expectations, computed from the ModelOpt tensors
// ---------------------------------------------------------------------------

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `1 / x` for every f32, in f32 (as torch's `1 / tensor`).
fn reciprocal_bytes(bytes: &[u8]) -> Vec<u8> {
    f32s(bytes)
        .into_iter()
        .flat_map(|x| (1.0f32 / x).to_le_bytes())
        .collect()
}

/// NVFP4 modules of a ModelOpt tensor set: a U8 `weight` beside `weight_scale`
/// and `weight_scale_2`.
fn nvfp4_modules(src: &Tensors) -> BTreeSet<String> {
    src.iter()
        .filter(|(_, (dt, _, _))| dt == "U8")
        .filter_map(|(n, _)| n.strip_suffix(".weight"))
        .filter(|m| {
            src.contains_key(&format!("{m}.weight_scale"))
                && src.contains_key(&format!("{m}.weight_scale_2"))
        })
        .map(str::to_string)
        .collect()
}

/// The name a ModelOpt tensor has after conversion.
fn renamed(name: &str, modules: &BTreeSet<String>) -> String {
    let (module, param) = name.rsplit_once('.').unwrap();
    if !modules.contains(module) {
        return name.to_string();
    }
    match param {
        "weight" => format!("{module}.weight_packed"),
        "weight_scale_2" => format!("{module}.weight_global_scale"),
        "input_scale" => format!("{module}.input_global_scale"),
        _ => name.to_string(),
    }
}

/// The compressed-tensors tensors a ModelOpt tensor set converts to.
fn expected_conversion(src: &Tensors) -> Tensors {
    let modules = nvfp4_modules(src);
    src.iter()
        .map(|(name, (dt, shape, bytes))| {
            let new = renamed(name, &modules);
            let inverted = new.ends_with("_global_scale");
            let bytes = if inverted {
                assert_eq!(dt, "F32", "fixture: {name}");
                reciprocal_bytes(bytes)
            } else {
                bytes.clone()
            };
            (new, (dt.clone(), shape.clone(), bytes))
        })
        .collect()
}

/// Asserts `got` holds exactly `want`, each tensor's dtype, shape and bytes.
fn assert_tensors(ctx: &str, got: &Tensors, want: &Tensors) {
    let g: BTreeSet<&String> = got.keys().collect();
    let w: BTreeSet<&String> = want.keys().collect();
    assert_eq!(g, w, "{ctx}: tensor names");
    for (name, (dt, shape, bytes)) in want {
        let (gdt, gshape, gbytes) = &got[name];
        assert_eq!(gdt, dt, "{ctx}: {name} dtype");
        assert_eq!(gshape, shape, "{ctx}: {name} shape");
        let elem = if dt == "F32" { 4 } else { 1 };
        compare_bytes(ctx, name, elem, gbytes, bytes, None);
    }
}

/// `fixture` converted by the binary into `tmp/ct`.
fn converted_fixture(tmp: &Path) -> PathBuf {
    let out = tmp.join("ct");
    ok(
        &convert_cli(&modelopt_fixture(), &out),
        "convert modelopt-nvfp4",
    );
    out
}

// ---------------------------------------------------------------------------
// 1. Tensors
// ---------------------------------------------------------------------------

#[test]
fn fixture_converts_to_exactly_the_renamed_and_inverted_tensors() {
    let src = read_tensors(&modelopt_fixture().join("model.safetensors"));
    let modules = nvfp4_modules(&src);
    assert_eq!(modules.len(), 7, "fixture modules: {modules:?}");

    let tmp = tempfile::tempdir().unwrap();
    let out = converted_fixture(tmp.path());
    let got = read_dir_tensors(&out);
    assert_tensors("convert modelopt-nvfp4", &got, &expected_conversion(&src));

    // The same, spelled out for each module.
    for m in &modules {
        let n = |p: &str| format!("{m}.{p}");
        let packed = &got[&n("weight_packed")];
        assert_eq!(packed, &src[&n("weight")], "{m}: weight_packed");
        assert_eq!(packed.0, "U8");
        assert_eq!(got[&n("weight_scale")], src[&n("weight_scale")], "{m}");
        assert_eq!(got[&n("weight_scale")].0, "F8_E4M3");
        for (ct, mo) in [
            ("weight_global_scale", "weight_scale_2"),
            ("input_global_scale", "input_scale"),
        ] {
            let (dt, shape, bytes) = &got[&n(ct)];
            assert_eq!(dt, "F32", "{m}.{ct}");
            assert_eq!(shape, &Vec::<usize>::new(), "{m}.{ct}: scalar shape");
            let (x, y) = (f32s(&src[&n(mo)].2)[0], f32s(bytes)[0]);
            assert_eq!(
                y.to_bits(),
                (1.0f32 / x).to_bits(),
                "{m}.{ct}: 1/{x} = {y}?"
            );
            assert_ne!(x, 1.0, "fixture {m}.{mo} is 1: the check proves nothing");
            assert!(((x as f64) * (y as f64) - 1.0).abs() < 1e-6, "{m}.{ct}");
        }
        for gone in ["weight", "weight_scale_2", "input_scale"] {
            assert!(!got.contains_key(&n(gone)), "{m}.{gone} left in the output");
        }
    }
    for name in DENSE {
        assert_eq!(src[*name].0, "BF16", "fixture {name}");
        assert_eq!(
            got.get(*name),
            Some(&src[*name]),
            "{name} not copied unchanged"
        );
    }
    assert!(
        got.keys()
            .all(|n| !n.ends_with(".weight") || DENSE.contains(&n.as_str())),
        "a .weight beyond the dense ones: {:?}",
        got.keys().collect::<Vec<_>>()
    );
    assert_eq!(entries(&out), ["config.json", "model.safetensors"]);
}

#[test]
fn library_convert_writes_the_same_files_as_the_binary() {
    let tmp = tempfile::tempdir().unwrap();
    let cli = converted_fixture(tmp.path());
    let lib = tmp.path().join("lib");
    let ckpt = Checkpoint::open(modelopt_fixture()).unwrap();
    let plan = convert::plan(&ckpt, ConvertTo::CompressedTensors).unwrap();
    let summary = writer::write(&plan, &backend::Cpu::new(), &lib, |_| {}).unwrap();
    assert_eq!(summary.decoded, 0, "{summary:?}");
    assert_eq!(
        summary.converted, 14,
        "7 weight + 7 input scales: {summary:?}"
    );
    assert_eq!(snapshot(&lib), snapshot(&cli));
}

// ---------------------------------------------------------------------------
// 2. config.json and side files
// ---------------------------------------------------------------------------

#[test]
fn config_is_compressed_tensors_nvfp4_and_side_files_are_copied() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    copy_dir(&modelopt_fixture(), &model);
    let tokenizer = br#"{"version": "1.0", "model": {"type": "BPE"}}"#;
    let generation = br#"{"bos_token_id": 1, "eos_token_id": 2}"#;
    std::fs::write(model.join("tokenizer.json"), tokenizer).unwrap();
    std::fs::write(model.join("generation_config.json"), generation).unwrap();
    let out = tmp.path().join("ct");
    ok(&convert_cli(&model, &out), "convert");

    assert_eq!(
        entries(&out),
        [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json"
        ],
        "hf_quant_config.json must not be copied; other side files must"
    );
    assert_eq!(
        std::fs::read(out.join("tokenizer.json")).unwrap(),
        tokenizer
    );
    assert_eq!(
        std::fs::read(out.join("generation_config.json")).unwrap(),
        generation
    );

    let src = read_json(&model.join("config.json"));
    let got = read_json(&out.join("config.json"));
    let want =
        read_json(&fixtures().join("nvfp4a16/model/config.json"))["quantization_config"].clone();
    let qc = &got["quantization_config"];
    for key in ["quant_method", "format", "quantization_status"] {
        assert_eq!(qc[key], want[key], "quantization_config.{key}");
        assert!(!qc[key].is_null(), "{key}");
    }
    let groups = qc["config_groups"].as_object().expect("config_groups");
    let want_group = want["config_groups"]["group_0"].clone();
    assert_eq!(groups.len(), 1, "{qc:#}");
    for (name, g) in groups {
        assert_eq!(g["format"], want_group["format"], "{name}.format");
        assert_eq!(g["targets"], json!(["Linear"]), "{name}.targets");
        assert_eq!(g["targets"], want_group["targets"], "{name}.targets");
        for key in [
            "num_bits",
            "type",
            "strategy",
            "group_size",
            "symmetric",
            "dynamic",
            "scale_dtype",
        ] {
            assert_eq!(
                g["weights"][key], want_group["weights"][key],
                "{name}.weights.{key}"
            );
            assert!(!g["weights"][key].is_null(), "{name}.weights.{key}");
        }
        // The fixture carries input_scale: NVFP4 activations, as
        // compressed-tensors' NVFP4 preset (dynamic "local").
        let a = &g["input_activations"];
        assert_eq!(a["num_bits"], 4, "{name}.input_activations: {a}");
        assert_eq!(a["type"], "float", "{a}");
        assert_eq!(a["strategy"], "tensor_group", "{a}");
        assert_eq!(a["group_size"], 16, "{a}");
        assert_eq!(a["dynamic"], "local", "{a}");
    }
    let excludes =
        read_json(&model.join("hf_quant_config.json"))["quantization"]["exclude_modules"].clone();
    assert_eq!(excludes, json!(["lm_head", "model.embed_tokens"]));
    assert_eq!(qc["ignore"], excludes, "ignore");
    for key in ["quant_algo", "producer"] {
        assert!(qc.get(key).is_none(), "ModelOpt key {key} left: {qc:#}");
    }

    // Every other key of config.json is kept as it was.
    let (src, got) = (src.as_object().unwrap(), got.as_object().unwrap());
    let keys = |m: &serde_json::Map<String, Value>| -> BTreeSet<String> {
        m.keys()
            .filter(|k| *k != "quantization_config")
            .cloned()
            .collect()
    };
    assert_eq!(keys(got), keys(src), "config.json keys");
    assert!(src.contains_key("num_hidden_layers"));
    for k in keys(src) {
        assert_eq!(got[&k], src[&k], "config.json {k}");
    }
}

// ---------------------------------------------------------------------------
// 3. The converted checkpoint reads back
// ---------------------------------------------------------------------------

/// The bf16 bytes compressed-tensors decodes `module` of a converted
/// checkpoint to: e2m1(code) · (e4m3(scale) / global_scale), low nibble
/// first, rounded to bf16. The converter stores the global scale 0-dim, and
/// torch then keeps the bf16 scale's dtype for the quotient, so it is rounded
/// to bf16 too (what compressed-tensors 0.20's `CompressedTensorsDequantizer`
/// writes for this checkpoint, checked byte for byte outside the test suite).
/// Returns (shape, bytes, exact values).
fn ct_reference(ct: &Tensors, module: &str) -> (Vec<usize>, Vec<u8>, Vec<f32>) {
    let (pdt, pshape, packed) = &ct[&format!("{module}.weight_packed")];
    let (sdt, sshape, scales) = &ct[&format!("{module}.weight_scale")];
    let (gdt, gshape, global) = &ct[&format!("{module}.weight_global_scale")];
    assert_eq!(
        (pdt.as_str(), sdt.as_str(), gdt.as_str()),
        ("U8", "F8_E4M3", "F32")
    );
    let global = f32s(global)[0];
    let (rows, width) = (pshape[0], pshape[1]);
    let cols = width * 2;
    let groups = sshape[1];
    assert_eq!(sshape, &vec![rows, cols / 16], "{module} scale shape");
    let mut vals = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let byte = packed[r * width + c / 2];
            let code = if c % 2 == 0 { byte & 0xF } else { byte >> 4 };
            let mut scale = e4m3_ref(scales[r * groups + c / 16]) / global;
            if gshape.is_empty() {
                // torch: a bf16 scale over a 0-dim f32 global stays bf16.
                let b = encode(OutDtype::Bf16, &[scale]);
                scale = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
            vals.push(e2m1_ref(code) * scale);
        }
    }
    (vec![rows, cols], encode(OutDtype::Bf16, &vals), vals)
}

/// Dequantizes the converted fixture with `backend` and checks every tensor
/// against the compressed-tensors reference.
fn check_dequantized(backend: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let ct_dir = converted_fixture(tmp.path());
    let ct = read_dir_tensors(&ct_dir);
    let src = read_tensors(&modelopt_fixture().join("model.safetensors"));
    let modules = nvfp4_modules(&src);

    let dense = tmp.path().join("dense");
    let o = run(&[
        "dequantize",
        ct_dir.to_str().unwrap(),
        "-o",
        dense.to_str().unwrap(),
        "--dtype",
        "bf16",
        "--backend",
        backend,
    ]);
    ok(&o, &format!("dequantize converted --backend {backend}"));
    let got = read_dir_tensors(&dense);

    let want_names: BTreeSet<String> = modules
        .iter()
        .map(|m| format!("{m}.weight"))
        .chain(DENSE.iter().map(|s| s.to_string()))
        .collect();
    assert_eq!(
        got.keys().cloned().collect::<BTreeSet<_>>(),
        want_names,
        "{backend}: dense tensor names"
    );
    for m in &modules {
        let name = format!("{m}.weight");
        let (shape, bytes, vals) = ct_reference(&ct, m);
        let (dt, gshape, gbytes) = &got[&name];
        assert_eq!(dt, "BF16", "{backend}: {name}");
        assert_eq!(gshape, &shape, "{backend}: {name} shape");
        assert!(vals.iter().any(|v| *v != 0.0), "{name}: all zero");
        compare_bytes(backend, &name, 2, gbytes, &bytes, Some(&vals));
    }
    for name in DENSE {
        assert_eq!(got[*name], src[*name], "{backend}: {name} copied");
    }
}

#[test]
fn converted_checkpoint_inspects_as_compressed_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let ct_dir = converted_fixture(tmp.path());
    let src = read_tensors(&modelopt_fixture().join("model.safetensors"));
    let modules = nvfp4_modules(&src);

    let o = run(&["inspect", ct_dir.to_str().unwrap(), "--json"]);
    ok(&o, "inspect --json converted");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["format"]["kind"], "compressed-tensors", "{}", v["format"]);
    assert_eq!(v["errors"], json!([]), "inspect errors");
    let tensors: BTreeMap<String, &Value> = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap().to_string(), t))
        .collect();
    assert_eq!(
        tensors.len(),
        modules.len() + DENSE.len(),
        "{:?}",
        tensors.keys()
    );
    for m in &modules {
        let t = tensors[&format!("{m}.weight")];
        let packed = &src[&format!("{m}.weight")].1;
        assert_eq!(t["action"], "decode", "{m}: {t}");
        assert_eq!(t["shape"], json!([packed[0], packed[1] * 2]), "{m}: {t}");
    }
    for name in DENSE {
        assert_eq!(tensors[*name]["action"], "copy", "{name}");
    }

    let o = run(&["validate", ct_dir.to_str().unwrap()]);
    ok(&o, "validate converted");
}

#[test]
fn converted_checkpoint_dequantizes_on_cpu_to_compressed_tensors_values() {
    check_dequantized("cpu");
}

#[test]
fn converted_checkpoint_dequantizes_on_gpu_to_compressed_tensors_values() {
    gpu_test(|_| {
        check_dequantized("gpu");
    });
}

// ---------------------------------------------------------------------------
// 4. Refusals
// ---------------------------------------------------------------------------

/// A copy of the ModelOpt fixture at `tmp/model` whose tensors are the
/// fixture's plus `extra`; `quant` edits hf_quant_config.json.
fn modelopt_with(tmp: &Path, extra: &[Tensor], quant: impl FnOnce(&mut Value)) -> PathBuf {
    let model = tmp.join("model");
    copy_dir(&modelopt_fixture(), &model);
    let mut tensors: Vec<Tensor> = read_tensors(&model.join("model.safetensors"))
        .into_iter()
        .map(|(n, (dt, shape, data))| Tensor {
            name: n,
            dtype: dtype_static(&dt),
            shape,
            data,
        })
        .collect();
    tensors.extend_from_slice(extra);
    write_safetensors(&model.join("model.safetensors"), &tensors);
    let mut hq = read_json(&model.join("hf_quant_config.json"));
    quant(&mut hq);
    write_json(&model.join("hf_quant_config.json"), &hq);
    model
}

fn dtype_static(dt: &str) -> &'static str {
    match dt {
        "BF16" => "BF16",
        "F32" => "F32",
        "U8" => "U8",
        "F8_E4M3" => "F8_E4M3",
        other => panic!("fixture dtype {other}"),
    }
}

/// Converting `input` must fail with `rule` (library and binary), naming
/// `names`, and leave no output directory.
fn convert_refused(input: &Path, rule: Rule, names: &[&str]) {
    let msg = library_refuses(input, rule);
    for n in names {
        assert!(msg.contains(n), "library error does not name {n}: {msg}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("nested/ct");
    let o = convert_cli(input, &out);
    refused(
        &o,
        &format!("convert {}", input.display()),
        rule.id(),
        names,
    );
    assert!(!out.exists(), "failed convert left {}", out.display());
    assert!(
        !tmp.path().join("nested").exists(),
        "failed convert left the parent it created"
    );
}

#[test]
fn compressed_tensors_input_is_refused() {
    convert_refused(
        &fixtures().join("nvfp4a16/model"),
        Rule::Ct005,
        &["compressed-tensors"],
    );
}

#[test]
fn orphan_input_scale_on_bf16_module_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let model = modelopt_with(
        tmp.path(),
        &[Tensor::f32("lm_head.input_scale", &[], &[0.25])],
        |_| {},
    );
    // The same checkpoint dequantizes (the scale is an activation parameter):
    // only conversion has nowhere to put it.
    dequantize_ok(&model, "with orphan input_scale");
    convert_refused(&model, Rule::Ct005, &["lm_head.input_scale"]);
}

#[test]
fn kv_cache_scale_without_kv_cache_quant_algo_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let k = "model.layers.0.self_attn.k_proj.k_scale";
    let model = modelopt_with(tmp.path(), &[Tensor::f32(k, &[], &[0.0625])], |hq| {
        assert_eq!(hq["quantization"]["kv_cache_quant_algo"], Value::Null);
    });
    convert_refused(&model, Rule::Ct005, &[k]);
}

#[test]
fn non_empty_output_directory_is_refused_and_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ct");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), b"mine").unwrap();
    let before = snapshot(&out);

    let o = convert_cli(&modelopt_fixture(), &out);
    refused(&o, "convert into non-empty dir", "OUT-001", &[]);
    assert_eq!(snapshot(&out), before, "output directory changed");

    let ckpt = Checkpoint::open(modelopt_fixture()).unwrap();
    let plan = convert::plan(&ckpt, ConvertTo::CompressedTensors).unwrap();
    let e = writer::write(&plan, &backend::Cpu::new(), &out, |_| {}).unwrap_err();
    assert_eq!(e.rule, Rule::Output, "{e}");
    assert_eq!(snapshot(&out), before, "output directory changed");
}

#[test]
fn unknown_target_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ct");
    let model = modelopt_fixture();
    for to in [Some("gguf"), Some("modelopt"), None] {
        let mut args = vec![
            "convert",
            model.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ];
        if let Some(to) = to {
            args.extend(["--to", to]);
        }
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "--to {to:?}: {}", stderr(&o));
        if let Some(to) = to {
            assert!(stderr(&o).contains(to), "--to {to}: {}", stderr(&o));
        }
        assert!(!out.exists(), "--to {to:?} created the output");
    }
    let e = "gguf".parse::<ConvertTo>().unwrap_err();
    assert_eq!(e.rule, Rule::Argument, "{e}");
    assert_eq!(
        "compressed-tensors".parse::<ConvertTo>().unwrap(),
        ConvertTo::CompressedTensors
    );
}

// ---------------------------------------------------------------------------
// 5. Exclude globs
// ---------------------------------------------------------------------------

#[test]
fn exclude_globs_become_anchored_regex_ignore_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    let q = "model.layers.0.self_attn.q_proj";
    let gate = "model.layers.0.mlp.gate.weight";
    // 4 × 32 NVFP4: packed [4, 16], e4m3 scales [4, 2] (0x38 = 1.0).
    let packed: Vec<u8> = (0..64u32).map(|i| (i * 37 % 256) as u8).collect();
    let tensors = vec![
        Tensor::bf16("lm_head.weight", &[2, 32], &[0.5; 64]),
        Tensor::bf16(gate, &[2, 32], &[0.25; 64]),
        Tensor::u8(format!("{q}.weight"), "U8", &[4, 16], &packed),
        Tensor::u8(
            format!("{q}.weight_scale"),
            "F8_E4M3",
            &[4, 2],
            &[0x38, 0x40, 0x30, 0x38, 0x48, 0x38, 0x38, 0x28],
        ),
        Tensor::f32(format!("{q}.weight_scale_2"), &[], &[0.5]),
    ];
    write_checkpoint(&model, &tensors, Value::Null);
    write_json(
        &model.join("hf_quant_config.json"),
        &json!({
            "producer": {"name": "modelopt", "version": "0.47.0"},
            "quantization": {
                "quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
                "exclude_modules": ["lm_head", "*mlp.gate", "model.layers.?.mlp.shared_expert_gate"],
            },
        }),
    );
    let out = tmp.path().join("ct");
    ok(&convert_cli(&model, &out), "convert synthetic");

    let qc = read_json(&out.join("config.json"))["quantization_config"].clone();
    assert_eq!(
        qc["ignore"],
        json!([
            "lm_head",
            r"re:.*mlp\.gate$",
            r"re:model\.layers\..\.mlp\.shared_expert_gate$"
        ]),
        "{qc:#}"
    );
    // No input_scale: weight-only NVFP4.
    assert_eq!(
        qc["config_groups"]["group_0"]["input_activations"],
        Value::Null
    );

    let got = read_dir_tensors(&out);
    let src = read_tensors(&model.join("model.safetensors"));
    assert_tensors("synthetic", &got, &expected_conversion(&src));
    assert_eq!(
        got[&format!("{q}.weight_global_scale")].2,
        2.0f32.to_le_bytes()
    );
    assert_eq!(got[gate], src[gate], "router gate copied unchanged");

    // The crate reads its own ignore entries back.
    let o = run(&["inspect", out.to_str().unwrap(), "--json"]);
    ok(&o, "inspect synthetic");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["errors"], json!([]), "{v:#}");
    assert_eq!(v["format"]["ignore"], qc["ignore"]);
}

// ---------------------------------------------------------------------------
// 6. Sharded checkpoints
// ---------------------------------------------------------------------------

#[test]
fn sharded_checkpoint_keeps_shards_and_renames_the_index() {
    let src = read_tensors(&modelopt_fixture().join("model.safetensors"));
    let names: Vec<&String> = src.keys().collect();
    // Split in sorted order at 13: up_proj's weight and input_scale land in
    // shard 1, its weight_scale and weight_scale_2 in shard 2.
    let split = 13;
    let shard_of = |n: &str| {
        if names.iter().position(|x| *x == n).unwrap() < split {
            SHARD1
        } else {
            SHARD2
        }
    };
    let up = "model.layers.0.mlp.up_proj";
    assert_ne!(
        shard_of(&format!("{up}.weight")),
        shard_of(&format!("{up}.weight_scale_2")),
        "test setup: no module crosses shards"
    );

    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for f in ["config.json", "hf_quant_config.json"] {
        std::fs::copy(modelopt_fixture().join(f), model.join(f)).unwrap();
    }
    let mut weight_map = serde_json::Map::new();
    let mut total = 0;
    for shard in [SHARD1, SHARD2] {
        let tensors: Vec<Tensor> = src
            .iter()
            .filter(|(n, _)| shard_of(n) == shard)
            .map(|(n, (dt, shape, data))| Tensor {
                name: n.clone(),
                dtype: dtype_static(dt),
                shape: shape.clone(),
                data: data.clone(),
            })
            .collect();
        for t in &tensors {
            weight_map.insert(t.name.clone(), shard.into());
            total += t.data.len();
        }
        std::fs::write(model.join(shard), safetensors_bytes(&tensors, None)).unwrap();
    }
    write_json(
        &model.join(INDEX),
        &json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
    );

    let out = tmp.path().join("ct");
    ok(&convert_cli(&model, &out), "convert sharded");
    assert_eq!(entries(&out), ["config.json", SHARD1, SHARD2, INDEX]);

    let modules = nvfp4_modules(&src);
    let want = expected_conversion(&src);
    let mut all = Tensors::new();
    for shard in [SHARD1, SHARD2] {
        let got = read_tensors(&out.join(shard));
        let want_names: BTreeSet<String> = src
            .keys()
            .filter(|n| shard_of(n) == shard)
            .map(|n| renamed(n, &modules))
            .collect();
        assert_eq!(
            got.keys().cloned().collect::<BTreeSet<_>>(),
            want_names,
            "{shard}: tensor names"
        );
        all.extend(got);
    }
    assert_tensors("convert sharded", &all, &want);

    let index = read_json(&out.join(INDEX));
    let want_map: serde_json::Map<String, Value> = src
        .keys()
        .map(|n| (renamed(n, &modules), json!(shard_of(n))))
        .collect();
    assert_eq!(index["weight_map"], Value::Object(want_map), "weight_map");
    let bytes: usize = want.values().map(|(_, _, b)| b.len()).sum();
    assert_eq!(index["metadata"]["total_size"], json!(bytes), "total_size");

    // The converted shards read back like the single-file conversion.
    let single = converted_fixture(&tmp.path().join("single"));
    assert_eq!(read_dir_tensors(&single), all);
}

// ---------------------------------------------------------------------------
// AutoAWQ GEMM
// ---------------------------------------------------------------------------

/// The AutoAWQ fixture converts to exactly what compressed-tensors'
/// `AutoAWQConverter` wrote: every tensor's bytes and the config's bytes.
#[test]
fn autoawq_converts_to_what_compressed_tensors_writes() {
    let case = fixtures().join("awq-gemm-w4-g128");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ct");
    ok(&convert_cli(&case.join("model"), &out), "convert awq");
    let got = read_dir_tensors(&out);
    let want: BTreeMap<String, Value> = serde_json::from_slice(
        &std::fs::read(case.join("expected-ct/model.digests.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "tensor names"
    );
    for (name, w) in &want {
        let (dt, shape, bytes) = &got[name];
        assert_eq!(dt, w["dtype"].as_str().unwrap(), "{name}");
        assert_eq!(serde_json::to_value(shape).unwrap(), w["shape"], "{name}");
        assert_eq!(
            crate::common::sha256_hex(bytes),
            w["sha256"],
            "{name} bytes"
        );
    }
    assert_eq!(
        std::fs::read(out.join("config.json")).unwrap(),
        std::fs::read(case.join("expected-ct/config.json")).unwrap(),
        "config.json bytes"
    );
}

/// The converted checkpoint decodes, as compressed-tensors, to the bytes
/// the AutoAWQ checkpoint decodes to (on the GPU too, in the next test).
#[test]
fn converted_autoawq_dequantizes_to_the_same_bytes() {
    converted_autoawq_same_bytes("cpu");
}

#[test]
fn converted_autoawq_dequantizes_to_the_same_bytes_on_gpu() {
    gpu_test(|_| converted_autoawq_same_bytes("gpu"));
}

/// Converts the AutoAWQ fixture and dequantizes both with `backend`.
fn converted_autoawq_same_bytes(backend: &str) {
    let case = fixtures().join("awq-gemm-w4-g128");
    let tmp = tempfile::tempdir().unwrap();
    let ct = tmp.path().join("ct");
    ok(&convert_cli(&case.join("model"), &ct), "convert awq");
    let dense = |from: &Path, name: &str| {
        let out = tmp.path().join(format!("{name}-{backend}"));
        let o = run(&[
            "dequantize",
            from.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--backend",
            backend,
            "--quiet",
        ]);
        ok(&o, name);
        read_dir_tensors(&out)
    };
    assert!(
        dense(&ct, "from-ct") == dense(&case.join("model"), "from-awq"),
        "{backend}: the conversion changed a value"
    );
}

/// A module compressed-tensors' converter ignores may not hold AWQ tensors.
#[test]
fn autoawq_weight_in_an_ignored_module_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    copy_dir(&fixtures().join("awq-gemm-w4-g128/model"), &model);
    let cfg = model.join("config.json");
    let mut v = read_json(&cfg);
    v["quantization_config"]["modules_to_not_convert"] = json!(["mlp.down_proj"]);
    write_json(&cfg, &v);
    let e = library_refuses(&model, Rule::Ct005);
    assert!(e.contains("down_proj.qweight"), "{e}");
}

/// NVFP4_AWQ keeps pre-quant scales that compressed-tensors' NVFP4 has no
/// place for: the converted model would run without them. It dequantizes.
#[test]
fn nvfp4_awq_pre_quant_scales_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let tensors = read_tensors(&modelopt_fixture().join("model.safetensors"));
    let (name, (_, shape, _)) = tensors
        .iter()
        .find(|(n, (dt, _, _))| n.ends_with("down_proj.weight") && dt == "U8")
        .expect("an NVFP4 down_proj");
    let pqs = name.replace(".weight", ".pre_quant_scale");
    let cols = 2 * shape[1];
    let model = modelopt_with(
        tmp.path(),
        &[Tensor::bf16(&pqs, &[cols], &vec![0.5; cols])],
        |hq| {
            hq["quantization"]["quant_algo"] = json!("NVFP4_AWQ");
        },
    );
    convert_refused(&model, Rule::Ct005, &[&pqs]);
    dequantize_ok(&model, "NVFP4_AWQ");
}

/// `dequantize` of `model` on the CPU succeeds (into a folder beside it).
fn dequantize_ok(model: &Path, what: &str) {
    let dense = model.with_file_name("dense");
    let o = run(&[
        "dequantize",
        model.to_str().unwrap(),
        "-o",
        dense.to_str().unwrap(),
        "--backend",
        "cpu",
    ]);
    ok(&o, &format!("dequantize {what}"));
}

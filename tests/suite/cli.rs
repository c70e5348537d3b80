//! The `wgpu-dequant` binary: `inspect`, `validate` and `dequantize` on the
//! reference checkpoints and on broken copies of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::cli::{failed, ok, read_json, run, stderr, stdout};
use crate::common::fixture_models;
use crate::common::{
    auto_digests, copy_dir, fixtures, gpu_test, read_dir_tensors, read_tensors, snapshot,
    write_safetensors, Tensor, SHARD2,
};
use serde_json::Value;

fn run_path(cmd: &str, path: &Path, rest: &[&str]) -> Output {
    let mut args = vec![cmd, path.to_str().unwrap()];
    args.extend_from_slice(rest);
    run(&args)
}

/// `dequantize INPUT -o OUT [EXTRA..] --backend cpu`.
fn dequantize_cpu(input: &Path, out: &Path, extra: &[&str]) -> Output {
    let out = out.to_str().unwrap();
    run_path(
        "dequantize",
        input,
        &[&["-o", out], extra, &["--backend", "cpu"]].concat(),
    )
}

/// Asserts stderr is exactly one line, `error: …`, naming each of `names`.
fn one_error_line(o: &Output, names: &[&str]) -> String {
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "stderr is not exactly one line:\n{err}");
    let line = lines[0];
    assert!(line.starts_with("error: "), "stderr: {line}");
    for n in names {
        assert!(line.contains(n), "stderr does not name {n}: {line}");
    }
    line.to_string()
}

/// The expected outputs of a fixture: name → (dtype, shape), from its
/// recorded bf16 digests (SVDQuant: its dense reference, in the model's
/// bf16, and the input tensors no target owns).
fn expected_outputs(model: &Path) -> BTreeMap<String, (String, Vec<usize>)> {
    if format_name(model) == "svdquant" {
        let prefixes = target_prefixes(model);
        let dense = read_tensors(
            &model
                .parent()
                .unwrap()
                .join("expected-dense-f32/model.safetensors"),
        );
        let kept = read_dir_tensors(model)
            .into_iter()
            .filter(|(n, _)| !prefixes.iter().any(|p| n.starts_with(p)))
            .map(|(n, (d, s, _))| (n, (d, s)));
        return dense
            .into_iter()
            .map(|(n, (_, s, _))| (n, ("BF16".to_string(), s)))
            .chain(kept)
            .collect();
    }
    let digests: serde_json::Map<String, Value> = serde_json::from_slice(
        &std::fs::read(model.parent().unwrap().join(auto_digests(case_of(model)))).unwrap(),
    )
    .unwrap();
    digests
        .into_iter()
        .map(|(name, d)| {
            (
                name,
                (
                    d["dtype"].as_str().unwrap().to_string(),
                    serde_json::from_value(d["shape"].clone()).unwrap(),
                ),
            )
        })
        .collect()
}

/// `<export_name>.` of every SVDQuant target (empty for other formats).
fn target_prefixes(model: &Path) -> Vec<String> {
    let sidecar = model.join("model.config.yaml");
    if !sidecar.is_file() {
        return Vec::new();
    }
    read_json(&sidecar)["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| format!("{}.", t["export_name"].as_str().unwrap()))
        .collect()
}

/// The fixture case a model directory belongs to.
fn case_of(model: &Path) -> &str {
    model
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .unwrap()
}

/// The format's name as `inspect` should report it.
fn format_name(model: &Path) -> &'static str {
    let config = match model.join("config.json").is_file() {
        true => read_json(&model.join("config.json")),
        false => Value::Null,
    };
    if config.get("quantization").is_some()
        && config["quantization_config"]["quant_method"].is_null()
    {
        "mlx"
    } else if model.join("model.config.yaml").is_file() {
        "svdquant"
    } else if model.join("hf_quant_config.json").is_file() {
        "modelopt"
    } else {
        match config["quantization_config"]["quant_method"].as_str() {
            Some("fp8") => "fp8-block",
            Some("awq") => "awq",
            Some("gptq" | "auto-round" | "auto_round") => "gptq",
            Some("mxfp4") => "gpt-oss",
            Some("bitsandbytes") => "bitsandbytes",
            Some("bitnet") => "bitnet",
            Some("hqq") => "hqq",
            Some("gemma") => "gemma",
            Some("sinq") => "sinq",
            Some("vptq") => "vptq",
            Some("aqlm") => "aqlm",
            Some("quark") => "quark",
            _ => "compressed-tensors",
        }
    }
}

/// A copy of fixture `case`'s checkpoint at `tmp/model`.
fn fixture_copy(tmp: &Path, case: &str) -> PathBuf {
    let model = tmp.join("model");
    copy_dir(&fixtures().join(case).join("model"), &model);
    model
}

/// Cuts `file` to half its length.
fn truncate_to_half(file: &Path) {
    let len = std::fs::metadata(file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
}

// ---------------------------------------------------------------------------
// inspect
// ---------------------------------------------------------------------------

#[test]
fn inspect_text_names_format_and_every_output_tensor() {
    for (case, model) in fixture_models() {
        let o = run_path("inspect", &model, &[]);
        ok(&o, &format!("inspect {case}"));
        let text = stdout(&o);
        // AutoRound's exports are read by the GPTQ format module; the
        // text names the producer and its packing.
        let named = match format_name(&model) {
            "gptq" if case.starts_with("autoround") => "auto-round (",
            name => name,
        };
        assert!(text.contains(named), "{case}: format not named:\n{text}");
        for (name, (_, shape)) in expected_outputs(&model) {
            let line = text
                .lines()
                .find(|l| l.split_whitespace().any(|w| w == name))
                .unwrap_or_else(|| panic!("{case}: {name} not listed:\n{text}"));
            assert!(
                line.contains(&format!("{shape:?}")),
                "{case}: {name} listed without shape {shape:?}: {line}"
            );
        }
    }
}

#[test]
fn inspect_json_lists_logical_shapes_and_actions() {
    for (case, model) in fixture_models() {
        let o = run_path("inspect", &model, &["--json"]);
        ok(&o, &format!("inspect --json {case}"));
        let v: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{case}: inspect --json is not JSON: {e}\n{}", stdout(&o)));
        assert_eq!(
            v["format"]["kind"],
            format_name(&model),
            "{case}: {}",
            v["format"]
        );
        let input = read_dir_tensors(&model);
        let want = expected_outputs(&model);
        let tensors = v["tensors"].as_array().expect("tensors is a list");
        let mut got = BTreeMap::new();
        for t in tensors {
            let name = t["name"].as_str().expect("name").to_string();
            let shape: Vec<usize> = serde_json::from_value(t["shape"].clone()).expect("shape");
            let action = t["action"].as_str().expect("action").to_string();
            assert!(
                got.insert(name.clone(), (shape, action)).is_none(),
                "{case}: {name} twice"
            );
        }
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{case}: output tensors"
        );
        for (name, (dtype, shape)) in &want {
            let (got_shape, action) = &got[name];
            assert_eq!(got_shape, shape, "{case}: {name} logical shape");
            // Copied iff the input stores it already as it is output.
            let stored_as_is = input
                .get(name)
                .is_some_and(|(d, s, _)| d == dtype && s == shape)
                && !target_prefixes(&model).iter().any(|p| name.starts_with(p));
            // SVDQuant biases are computed on the host (activation shifts).
            let want_action = match (stored_as_is, format_name(&model)) {
                (true, _) => "copy",
                (false, "svdquant") if name.ends_with(".bias") => "compute",
                // MLX's GPT-OSS biases in transformers' layout: gate's and
                // up's interleaved, down's renamed.
                (false, "mlx") if name.ends_with("gate_up_proj_bias") => "compute",
                (false, "mlx") if name.ends_with("down_proj_bias") => "copy",
                (false, _) => "decode",
            };
            assert_eq!(action, want_action, "{case}: {name} action");
        }
        assert!(
            v["errors"].as_array().is_some_and(|e| e.is_empty()),
            "{case}: {}",
            v["errors"]
        );
    }
}

#[test]
fn inspect_json_w4a16_down_proj_is_logical_shape() {
    let model = fixtures().join("w4a16-g128/model");
    let o = run_path("inspect", &model, &["--json"]);
    ok(&o, "inspect --json w4a16-g128");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let t = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "model.layers.0.mlp.down_proj.weight")
        .expect("down_proj.weight is an output");
    assert_eq!(t["shape"], serde_json::json!([256, 768]));
    assert_eq!(t["action"], "decode");
    let lm = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "lm_head.weight")
        .expect("lm_head.weight is an output");
    assert_eq!(lm["action"], "copy");
}

#[test]
fn inspect_of_a_broken_checkpoint_fails_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture_copy(tmp.path(), "w4a16-g128");
    truncate_to_half(&model.join("model.safetensors"));
    let o = run_path("inspect", &model, &[]);
    failed(&o, "inspect of a truncated checkpoint");
    one_error_line(&o, &["model.safetensors", "ST-001"]);
    assert_eq!(o.status.code(), Some(3));
}

// ---------------------------------------------------------------------------
// validate
// ---------------------------------------------------------------------------

#[test]
fn validate_passes_every_fixture() {
    for (case, model) in fixture_models() {
        let o = run_path("validate", &model, &[]);
        ok(&o, &format!("validate {case}"));
        assert!(stdout(&o).contains("ok"), "{case}: {}", stdout(&o));
        let o = run_path("validate", &model, &["--json"]);
        ok(&o, &format!("validate --json {case}"));
        let v: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{case}: validate --json: {e}\n{}", stdout(&o)));
        assert_eq!(v["errors"], serde_json::json!([]), "{case}");
        assert!(v["warnings"].is_array(), "{case}: {v}");
    }
}

#[test]
fn validate_fails_a_truncated_checkpoint_naming_the_rule() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture_copy(tmp.path(), "w4a16-g128");
    let file = model.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 10]).unwrap();

    let o = run_path("validate", &model, &[]);
    failed(&o, "validate of a truncated checkpoint");
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert!(all.contains("ST-001"), "no rule id:\n{all}");
    assert!(all.contains("model.safetensors"), "no file:\n{all}");

    let o = run_path("validate", &model, &["--json"]);
    failed(&o, "validate --json of a truncated checkpoint");
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("validate --json: {e}\n{}", stdout(&o)));
    let errors = v["errors"].as_array().expect("errors is a list");
    assert_eq!(errors.len(), 1, "{v}");
    assert_eq!(errors[0]["rule"], "ST-001");
    assert!(errors[0]["file"]
        .as_str()
        .is_some_and(|f| f.ends_with("model.safetensors")));
}

#[test]
fn validate_fails_a_module_fault_naming_the_rule_and_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let model = sharded_with_bad_scale(tmp.path());

    let o = run_path("validate", &model, &[]);
    failed(&o, "validate with a bad scale shape");
    let out = stdout(&o);
    assert!(out.contains("TEN-003"), "{out}");
    assert!(out.contains(DOWN_SCALE), "{out}");

    let o = run_path("validate", &model, &["--json"]);
    failed(&o, "validate --json with a bad scale shape");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let errors = v["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{v}");
    assert_eq!(errors[0]["rule"], "TEN-003");
    assert_eq!(errors[0]["tensor"], DOWN_SCALE);
    assert!(errors[0]["file"].as_str().unwrap().ends_with(SHARD2));
}

#[test]
fn inspect_and_validate_agree_on_findings_and_their_form() {
    let tmp = tempfile::tempdir().unwrap();
    let model = sharded_with_bad_scale(tmp.path());
    // A module fault: inspect still reports, and exits as validate does.
    let inspect = run_path("inspect", &model, &[]);
    let validate = run_path("validate", &model, &[]);
    assert_eq!(inspect.status.code(), Some(3), "{}", stderr(&inspect));
    assert_eq!(validate.status.code(), Some(3));
    assert!(stdout(&inspect).contains("TEN-003"), "{}", stdout(&inspect));
    let lines: Vec<String> = stdout(&validate).lines().map(str::to_string).collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("error: ") && l.contains("TEN-003")),
        "validate prints findings as `error: …`: {lines:?}"
    );
    // A whole-checkpoint fault: --json still prints JSON, of validate's shape.
    let tmp = tempfile::tempdir().unwrap();
    let broken = fixture_copy(tmp.path(), "w4a16-g128");
    truncate_to_half(&broken.join("model.safetensors"));
    for cmd in ["inspect", "validate"] {
        let o = run_path(cmd, &broken, &["--json"]);
        assert_eq!(o.status.code(), Some(3), "{cmd} --json");
        let v: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{cmd} --json printed no JSON ({e}): {}", stdout(&o)));
        assert_eq!(v["errors"][0]["rule"], "ST-001", "{cmd}: {v}");
    }
}

#[test]
fn help_says_what_the_exit_status_is() {
    let o = run(&["validate", "--help"]);
    ok(&o, "validate --help");
    assert!(stdout(&o).contains("3 with findings"), "{}", stdout(&o));
    assert!(!stdout(&o).contains("1 with findings"), "{}", stdout(&o));
}

#[test]
fn bench_refuses_arguments_that_measure_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let nowhere = tmp.path().join("nonexistent/x");
    for args in [
        vec!["bench", "--runs", "0"],
        vec!["bench", "--e2e-gb", "0"],
        vec!["bench", "--e2e-gb", "-1"],
        vec![
            "bench",
            "--e2e-gb",
            "0.01",
            "--dir",
            nowhere.to_str().unwrap(),
        ],
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{args:?} measured something");
    }
    assert!(
        !tmp.path().join("nonexistent").exists(),
        "bench created --dir"
    );
}

/// `WGPU_DEQUANT_WORKGROUP_SIZE` changes how the GPU runs, never the bytes;
/// a value that is not a size is an argument error naming the variable.
#[test]
fn workgroup_size_override_keeps_the_bytes() {
    gpu_test(|_| {
        let tmp = tempfile::tempdir().unwrap();
        let model = fixtures().join("nvfp4a16").join("model");
        let run_with = |size: &str, out: &str| {
            std::process::Command::new(crate::common::bin())
                .env("WGPU_DEQUANT_WORKGROUP_SIZE", size)
                .args(["dequantize", "--backend", "gpu", "-q", "-o"])
                .arg(tmp.path().join(out))
                .arg(&model)
                .output()
                .unwrap()
        };
        let o = run_with("lots", "bad");
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("WGPU_DEQUANT_WORKGROUP_SIZE"),
            "{}",
            stderr(&o)
        );
        assert!(!tmp.path().join("bad").exists());
        for size in ["32", "64", "1024"] {
            ok(&run_with(size, size), size);
        }
        ok(
            &run(&[
                "dequantize",
                "--backend",
                "cpu",
                "-q",
                "-o",
                tmp.path().join("cpu").to_str().unwrap(),
                model.to_str().unwrap(),
            ]),
            "cpu",
        );
        let want = read_dir_tensors(&tmp.path().join("cpu"));
        for size in ["32", "64", "1024"] {
            assert!(
                read_dir_tensors(&tmp.path().join(size)) == want,
                "workgroup {size}"
            );
        }
    });
}

/// `bench --backend cpu --only`: a pack along the inputs is measured
/// against the straight int4 job of its shape, and one with zero points
/// (AutoAWQ, GPTQ) also against the straight one with zero points.
#[test]
fn bench_cpu_compares_packs_along_the_inputs_with_straight_ones() {
    for (only, with_zeros) in [("autoawq", true), ("gptq", true), ("gpt-oss", false)] {
        let o = run(&[
            "bench",
            "--backend",
            "cpu",
            "--json",
            "--rows",
            "128",
            "--cols",
            "128",
            "--runs",
            "1",
            "--only",
            only,
        ]);
        ok(&o, "bench --backend cpu");
        let lines: Vec<Value> = stdout(&o)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        for dtype in ["bf16", "f32"] {
            let baselines: Vec<&str> = lines
                .iter()
                .filter(|l| {
                    l["case"]
                        .as_str()
                        .is_some_and(|c| c.starts_with(only) && c.ends_with(dtype))
                })
                .filter_map(|l| l["baseline"].as_str())
                .filter(|b| b.starts_with("straight"))
                .collect();
            let mut want = vec![format!("straight int4 g128 -> {dtype}")];
            if with_zeros {
                want.push(format!("straight int4 g128 asym -> {dtype}"));
            }
            assert_eq!(baselines, want, "{only} -> {dtype}: {lines:?}");
        }
    }
}

/// `bench --only gguf`: Q4_K and Q6_K, mapped and decoded as `dequantize`
/// does, each against the straight int4 job of its shape, in bf16 and f32.
#[test]
fn bench_gguf_measures_q4_k_and_q6_k_against_int4() {
    let o = run(&[
        "bench",
        "--backend",
        "cpu",
        "--json",
        "--rows",
        "16",
        "--cols",
        "256",
        "--runs",
        "1",
        "--only",
        "gguf",
    ]);
    ok(&o, "bench --only gguf");
    let lines: Vec<Value> = stdout(&o)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for ty in ["Q4_K", "Q6_K"] {
        for dtype in ["bf16", "f32"] {
            let line = lines
                .iter()
                .find(|l| {
                    l["case"]
                        .as_str()
                        .is_some_and(|c| c.starts_with(&format!("gguf {ty} → {dtype}")))
                })
                .unwrap_or_else(|| panic!("{ty} {dtype}: {lines:?}"));
            assert_eq!(line["baseline"], format!("straight int4 g128 -> {dtype}"));
            assert!(line["ratio"].as_f64().is_some_and(|r| r > 0.0), "{line}");
        }
    }
}

/// `bench --backend gpu --json`: one object per line with the agreed keys,
/// every format to bf16 and f32 against the copy shader, the GPU alone, and
/// every case on a fast kernel.
#[test]
fn bench_json_lines_cover_every_fast_kernel_case() {
    gpu_test(|_| {
        let o = run(&[
            "bench",
            "--backend",
            "gpu",
            "--json",
            "--rows",
            "16",
            "--cols",
            "256",
            "--runs",
            "1",
        ]);
        ok(&o, "bench --json");
        let lines: Vec<Value> = stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        for format in ["int4", "nvfp4", "mxfp4", "int8"] {
            for dtype in ["bf16", "f32"] {
                assert!(
                    lines.iter().any(|l| {
                        let case = l["case"].as_str().unwrap_or("");
                        let shader = l["baseline"].as_str().unwrap_or("").contains("shader");
                        case.contains(format) && case.contains(dtype) && shader
                    }),
                    "no {format} -> {dtype} case in {lines:?}"
                );
            }
        }
        for l in &lines {
            let keys: Vec<&str> = l.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(
                keys,
                [
                    "backend",
                    "case",
                    "gbps",
                    "baseline",
                    "baseline_gbps",
                    "ratio",
                    "device"
                ]
            );
            assert_eq!(l["backend"], "gpu", "{l}");
            let case = l["case"].as_str().unwrap();
            assert!(
                case.contains("fast kernel") || case.contains("resident"),
                "{l}"
            );
            let (g, b, r) = (
                l["gbps"].as_f64(),
                l["baseline_gbps"].as_f64(),
                l["ratio"].as_f64(),
            );
            assert!(g > Some(0.0) && b > Some(0.0) && r > Some(0.0), "{l}");
        }
    });
}

/// `bench --gemv --json`: for every fast format (and GGUF's common
/// types) and every M, one line
/// against the read kernel and one against the dense bf16 product, with
/// `m`, ratios that are the baseline's time over ours, a one-workgroup
/// dispatch's time measured beside them, and the device; and the routed
/// experts' line.
#[test]
fn bench_gemv_lines_have_both_baselines_for_every_m() {
    gpu_test(|_| {
        let o = run(&[
            "bench",
            "--backend",
            "gpu",
            "--gemv",
            "--gemv-shape",
            "8x256",
            "--json",
            "--runs",
            "1",
        ]);
        ok(&o, "bench --gemv --json");
        let lines: Vec<Value> = stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        for format in [
            "int4 g128",
            "nvfp4",
            "mxfp4",
            "int8",
            "gptq",
            "autoawq",
            "gpt-oss",
            "gguf Q4_0",
            "gguf Q4_K",
            "gguf Q5_K",
            "gguf Q6_K",
            "gguf Q8_0",
            "gguf IQ4_XS",
            "gguf IQ2_XXS",
        ] {
            for m in [1, 4, 16, 64] {
                let baselines: Vec<&str> = lines
                    .iter()
                    .filter(|l| {
                        l["case"].as_str().is_some_and(|c| c.starts_with(format)) && l["m"] == m
                    })
                    .filter_map(|l| l["baseline"].as_str())
                    .collect();
                assert!(
                    baselines.iter().any(|b| b.contains("read"))
                        && baselines.iter().any(|b| b.contains("dense")),
                    "{format} m={m}: {baselines:?}"
                );
            }
        }
        // Routed experts: 8 rows over 4 of 32 experts of the last shape, in one call.
        assert!(
            lines.iter().any(|l| l["case"]
                .as_str()
                .is_some_and(|c| c.starts_with("routed experts: 8 rows over 4 of 32"))
                && l["baseline"] == "the 4 experts one by one"
                && l["m"] == 8),
            "no routed experts' line"
        );
        for l in &lines {
            let keys: Vec<&str> = l.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(
                keys,
                [
                    "backend",
                    "case",
                    "gbps",
                    "baseline",
                    "baseline_gbps",
                    "ratio",
                    "m",
                    "dispatch_us",
                    "device"
                ]
            );
            assert!(l["case"].as_str().unwrap().ends_with("8x256"), "{l}");
            assert!(l["device"].as_str().unwrap().starts_with("gpu ("), "{l}");
            let (g, b, r) = (
                l["gbps"].as_f64(),
                l["baseline_gbps"].as_f64(),
                l["ratio"].as_f64(),
            );
            assert!(g > Some(0.0) && b > Some(0.0) && r > Some(0.0), "{l}");
            assert!(l["dispatch_us"].as_f64() > Some(0.0), "{l}");
        }
    });
}

/// The sample run as a newcomer meets it: no `XDG_RUNTIME_DIR`, nothing set
/// for the GPU. Every line on stderr is the tool's own.
#[test]
fn a_fresh_environment_gets_only_the_tools_own_lines() {
    fresh_environment_run(&["auto", "cpu"]);
}

/// [`a_fresh_environment_gets_only_the_tools_own_lines`] with `--backend gpu`.
#[test]
fn a_fresh_environment_gets_only_the_tools_own_lines_on_the_gpu() {
    gpu_test(|_| fresh_environment_run(&["gpu"]));
}

/// The sample decoded with each of `backends` in a fresh environment: every
/// stderr line is the tool's own, the last one `wrote ...`.
fn fresh_environment_run(backends: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-w4a16");
    for &backend in backends {
        let out = tmp.path().join(backend);
        let o = std::process::Command::new(crate::common::bin())
            .args([
                "dequantize",
                sample.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ])
            .args(["--backend", backend])
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("NODEVICE_SELECT")
            .env_remove("WGPU_DEQUANT_BACKEND")
            .output()
            .unwrap();
        ok(&o, backend);
        let err = stderr(&o);
        let own = |l: &str| {
            l.starts_with("note: ")
                || l.starts_with("wrote ")
                || l.starts_with(sample.to_str().unwrap())
        };
        assert!(
            err.lines().all(own),
            "--backend {backend}: a line the tool did not write:\n{err}"
        );
        assert!(
            err.lines().last().is_some_and(|l| l.starts_with("wrote ")),
            "{err}"
        );
    }
}

// ---------------------------------------------------------------------------
// dequantize
// ---------------------------------------------------------------------------

fn config_without_quantization(out: &Path) {
    if !out.join("config.json").exists() {
        // SVDQuant exports have no config.json; their sidecar must not be copied.
        assert!(!out.join("model.config.yaml").exists());
        return;
    }
    let cfg = read_json(&out.join("config.json"));
    assert!(cfg.is_object(), "{cfg}");
    assert!(
        cfg.get("quantization_config").is_none() && cfg.get("quantization").is_none(),
        "config.json keeps quantization_config or quantization"
    );
}

#[test]
fn dequantize_every_fixture_on_cpu() {
    for (case, model) in fixture_models() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("dense");
        let o = dequantize_cpu(&model, &out, &[]);
        ok(&o, &format!("dequantize {case}"));
        let index = model.join("model.safetensors.index.json");
        if index.is_file() {
            // The input's shard names (mlx-lm writes an index for one shard).
            let map = read_json(&index)["weight_map"].clone();
            let shards: std::collections::BTreeSet<&str> = map
                .as_object()
                .unwrap()
                .values()
                .filter_map(Value::as_str)
                .collect();
            for f in shards.into_iter().chain(["model.safetensors.index.json"]) {
                assert!(out.join(f).is_file(), "{case}: no {f}");
            }
        } else {
            assert!(out.join("model.safetensors").is_file(), "{case}");
        }
        config_without_quantization(&out);
        assert!(!out.join("hf_quant_config.json").exists(), "{case}");
        assert!(!out.join(".wgpu-dequant-partial").exists(), "{case}");
        let got = read_dir_tensors(&out);
        let want = expected_outputs(&model);
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{case}"
        );
        for (name, (dtype, shape)) in &want {
            assert_eq!(&got[name].0, dtype, "{case}: {name}");
            assert_eq!(&got[name].1, shape, "{case}: {name}");
        }
    }
}

#[test]
fn dequantize_w4a16_writes_model_and_config() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    let model = fixtures().join("w4a16-g128/model");
    let o = dequantize_cpu(&model, &out, &[]);
    ok(&o, "dequantize w4a16-g128");
    assert!(out.join("model.safetensors").is_file());
    config_without_quantization(&out);
    let t = read_tensors(&out.join("model.safetensors"));
    let down = &t["model.layers.0.mlp.down_proj.weight"];
    assert_eq!(
        (down.0.as_str(), down.1.as_slice()),
        ("BF16", &[256, 768][..])
    );
    assert!(!t.keys().any(|k| k.ends_with("weight_packed")
        || k.ends_with("weight_scale")
        || k.ends_with("weight_shape")));
}

/// The value of element `i` of a stored float tensor, widened exactly.
fn stored_value(dtype: &str, bytes: &[u8], i: usize) -> f64 {
    match dtype {
        "BF16" => half::bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f64(),
        "F16" => half::f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f64(),
        "F32" => f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()) as f64,
        other => panic!("not a float dtype: {other}"),
    }
}

#[test]
fn dtype_applies_to_every_float_tensor_and_to_the_config() {
    let model = fixtures().join("w4a16-g128/model");
    let input = read_dir_tensors(&model);
    let tmp = tempfile::tempdir().unwrap();
    let bf16 = tmp.path().join("bf16");
    ok(&dequantize_cpu(&model, &bf16, &[]), "dequantize");
    let reference = read_tensors(&bf16.join("model.safetensors"));
    for (flag, dtype, torch) in [("f32", "F32", "float32"), ("f16", "F16", "float16")] {
        let out = tmp.path().join(flag);
        ok(&dequantize_cpu(&model, &out, &["--dtype", flag]), flag);
        let got = read_tensors(&out.join("model.safetensors"));
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            reference.keys().collect::<Vec<_>>()
        );
        let mut copied = 0;
        for (name, (d, shape, bytes)) in &got {
            assert_eq!(d, dtype, "--dtype {flag}: {name}");
            assert_eq!(shape, &reference[name].1, "{name}");
            if let Some((d_in, _, stored)) = input.get(name) {
                // Copied: the stored value, rounded once to the dtype.
                copied += 1;
                let n = bytes.len() / if dtype == "F32" { 4 } else { 2 };
                for i in 0..n {
                    let want = stored_value(d_in, stored, i);
                    let have = stored_value(dtype, bytes, i);
                    let rounded = if dtype == "F32" {
                        want as f32 as f64
                    } else {
                        half::f16::from_f64(want).to_f64()
                    };
                    assert_eq!(have.to_bits(), rounded.to_bits(), "{name}[{i}]");
                }
            }
        }
        assert_eq!(copied, 5, "embeddings, norms and lm_head are copied");
        let cfg = read_json(&out.join("config.json"));
        // transformers 4.56+ writes `dtype`, older versions `torch_dtype`.
        assert_eq!(cfg["dtype"], torch, "config.json says {torch}");
        assert!(cfg.get("quantization_config").is_none());
    }
    // f32 output rounded back to bf16 is the bf16 output.
    let f32_out = read_tensors(&tmp.path().join("f32/model.safetensors"));
    for (name, (_, _, want)) in &reference {
        let got: Vec<u8> = f32_out[name]
            .2
            .chunks_exact(4)
            .flat_map(|c| {
                half::bf16::from_f32(f32::from_le_bytes(c.try_into().unwrap())).to_le_bytes()
            })
            .collect();
        assert!(
            &got == want,
            "{name}: f32 output does not round to the bf16 output"
        );
    }
}

#[test]
fn dtype_converts_a_dense_checkpoint_and_says_nothing_was_decoded() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("dense-in");
    std::fs::create_dir(&model).unwrap();
    let values = [1.0f32, -2.5, 0.1, 65504.0, 1e-8, f32::INFINITY];
    write_safetensors(
        &model.join("model.safetensors"),
        &[
            Tensor::f32("a.weight", &[2, 3], &values),
            Tensor::i64("position_ids", &[2], &[0, 1]),
            Tensor::new(
                "pi",
                "F64",
                &[1],
                std::f64::consts::PI.to_le_bytes().to_vec(),
            ),
        ],
    );
    crate::common::write_json(
        &model.join("config.json"),
        &serde_json::json!({"torch_dtype": "float32", "text_config": {"dtype": "float32"}}),
    );
    let out = tmp.path().join("out");
    let o = dequantize_cpu(&model, &out, &["--dtype", "bf16"]);
    ok(&o, "dequantize a dense checkpoint to bf16");
    assert!(
        stderr(&o).contains("nothing to decode"),
        "a dense input should be said to have nothing to decode:\n{}",
        stderr(&o)
    );
    let got = read_tensors(&out.join("model.safetensors"));
    assert_eq!(got["a.weight"].0, "BF16");
    let want: Vec<u8> = values
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    assert_eq!(
        got["a.weight"].2, want,
        "each value rounded once to nearest even"
    );
    assert_eq!(
        got["position_ids"].0, "I64",
        "integer tensors stay as they are"
    );
    assert_eq!(
        got["pi"].2,
        half::bf16::from_f64(std::f64::consts::PI)
            .to_le_bytes()
            .to_vec(),
        "F64 is rounded straight to bf16"
    );
    let cfg = read_json(&out.join("config.json"));
    assert_eq!(cfg["torch_dtype"], "bfloat16");
    assert_eq!(cfg["text_config"]["dtype"], "bfloat16");
}

#[test]
fn dequantize_of_a_single_file() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    let file = fixtures().join("w4a16-g128/model/model.safetensors");
    let o = dequantize_cpu(&file, &out, &[]);
    ok(&o, "dequantize of a .safetensors file");
    let got = read_tensors(&out.join("model.safetensors"));
    let want = expected_outputs(&fixtures().join("w4a16-g128/model"));
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    assert_eq!(got["model.layers.0.mlp.down_proj.weight"].1, vec![256, 768]);
    config_without_quantization(&out);
}

#[test]
fn dequantize_into_non_empty_directory_refuses_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), b"precious").unwrap();
    std::fs::write(out.join("model.safetensors"), b"not mine").unwrap();
    let before = snapshot(&out);
    let model = fixtures().join("w4a16-g128/model");
    let o = dequantize_cpu(&model, &out, &[]);
    failed(&o, "dequantize into a non-empty directory");
    let err = stderr(&o);
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains("OUT-001"), "{err}");
    assert!(errors[0].contains(out.to_str().unwrap()), "{err}");
    assert_eq!(snapshot(&out), before, "output directory changed");
}

#[test]
fn dequantize_refusal_of_non_empty_directory_is_one_stderr_line() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), b"precious").unwrap();
    let model = fixtures().join("w4a16-g128/model");
    let o = dequantize_cpu(&model, &out, &[]);
    failed(&o, "dequantize into a non-empty directory");
    one_error_line(&o, &["OUT-001", out.to_str().unwrap()]);
}

#[test]
fn dequantize_with_a_corrupt_second_shard_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture_copy(tmp.path(), "sharded-nvfp4a16");
    let second = model.join(SHARD2);
    truncate_to_half(&second);
    let out = tmp.path().join("dense");
    let o = dequantize_cpu(&model, &out, &[]);
    failed(&o, "dequantize with a truncated second shard");
    one_error_line(&o, &[second.to_str().unwrap(), "ST-001"]);
    assert!(!out.exists(), "{} was left behind", out.display());
}

/// The down projection's e4m3 scale, stored in the second shard.
const DOWN_SCALE: &str = "model.layers.0.mlp.down_proj.weight_scale";

/// Rewrites `file` with tensor `name`'s shape transposed (same bytes, so the
/// container stays valid, but the groups are on the wrong axis).
fn break_scale_shape(file: &Path, name: &str) {
    let bytes = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(usize, Tensor)> = st
        .iter()
        .map(|(n, v)| {
            let dtype: &'static str = Box::leak(format!("{:?}", v.dtype()).into_boxed_str());
            let mut shape = v.shape().to_vec();
            if n == name {
                assert_eq!(shape.len(), 2);
                assert_ne!(shape[0], shape[1]);
                shape.reverse();
            }
            let offset = v.data().as_ptr() as usize - bytes.as_ptr() as usize;
            (offset, Tensor::new(n, dtype, &shape, v.data().to_vec()))
        })
        .collect();
    assert!(tensors.iter().any(|(_, t)| t.name == name), "no {name}");
    tensors.sort_by_key(|(o, _)| *o);
    let tensors: Vec<Tensor> = tensors.into_iter().map(|(_, t)| t).collect();
    write_safetensors(file, &tensors);
}

/// A copy of the sharded fixture at `tmp/model` whose second shard has
/// DOWN_SCALE transposed.
fn sharded_with_bad_scale(tmp: &Path) -> PathBuf {
    let model = fixture_copy(tmp, "sharded-nvfp4a16");
    break_scale_shape(&model.join(SHARD2), DOWN_SCALE);
    model
}

#[test]
fn dequantize_with_a_bad_module_in_the_second_shard_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let model = sharded_with_bad_scale(tmp.path());
    // The first shard and the container of the second are still valid.
    let o = run_path("inspect", &model, &["--json"]);
    assert_eq!(o.status.code(), Some(3), "inspect reports the fault");
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["errors"][0]["rule"], "TEN-003", "{report}");
    assert!(report["tensors"].as_array().is_some_and(|t| !t.is_empty()));
    let out = tmp.path().join("dense");
    let o = dequantize_cpu(&model, &out, &[]);
    failed(&o, "dequantize with a bad scale shape in the second shard");
    one_error_line(&o, &[SHARD2, DOWN_SCALE, "TEN-003"]);
    assert!(!out.exists(), "{} was left behind", out.display());
}

#[test]
fn dequantize_failure_into_an_existing_empty_directory_leaves_it_empty() {
    let tmp = tempfile::tempdir().unwrap();
    let model = sharded_with_bad_scale(tmp.path());
    let out = tmp.path().join("dense");
    std::fs::create_dir(&out).unwrap();
    let o = dequantize_cpu(&model, &out, &[]);
    failed(&o, "dequantize with a bad scale shape");
    assert!(out.is_dir(), "a directory the user made is kept");
    assert_eq!(snapshot(&out), vec![], "nothing is left inside it");
}

#[test]
fn dequantize_of_a_checkpoint_of_symlinks_copies_side_files() {
    // The Hugging Face hub cache stores every file of a snapshot as a
    // symlink to a blob (repo/snapshots/<rev>/f -> ../../blobs/<hash>); side
    // files must still be copied.
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("models--org--name");
    let model = repo.join("snapshots").join("0123abcd");
    let blobs = repo.join("blobs");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::create_dir_all(&blobs).unwrap();
    let src = fixtures().join("w4a16-g128/model");
    for (i, e) in std::fs::read_dir(&src).unwrap().enumerate() {
        let p = e.unwrap().path();
        let blob = format!("blob{i:04}");
        std::fs::copy(&p, blobs.join(&blob)).unwrap();
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(&blob),
            model.join(p.file_name().unwrap()),
        )
        .unwrap();
    }
    // A side file the dense model keeps, linked as the others.
    let generation = br#"{"do_sample": false}"#;
    std::fs::write(blobs.join("blob-generation"), generation).unwrap();
    std::os::unix::fs::symlink(
        Path::new("../../blobs/blob-generation"),
        model.join("generation_config.json"),
    )
    .unwrap();
    let out = tmp.path().join("dense");
    let o = dequantize_cpu(&model, &out, &[]);
    ok(&o, "dequantize of a symlinked checkpoint");
    config_without_quantization(&out);
    assert!(out.join("model.safetensors").is_file());
    assert!(
        out.join("generation_config.json").is_file(),
        "generation_config.json (a symlinked side file) was not copied; output has {:?}",
        snapshot(&out).into_iter().map(|e| e.0).collect::<Vec<_>>()
    );
    assert_eq!(
        std::fs::read(out.join("generation_config.json")).unwrap(),
        generation
    );
    assert!(
        !out.join("recipe.yaml").exists(),
        "the quantization recipe was copied"
    );
}

/// A side file whose copy fails after every shard was written: its staged
/// path is longer than PATH_MAX while the shards' are not. Returns the
/// checkpoint and the side file's name.
fn checkpoint_failing_late(tmp: &Path) -> (PathBuf, String) {
    let model = fixture_copy(tmp, "sharded-nvfp4a16");
    let side = format!("{}.txt", "s".repeat(200));
    std::fs::write(model.join(&side), b"side file").unwrap();
    (model, side)
}

/// An output path `len` bytes long under `base` (components of 200 bytes).
fn long_path(base: &Path, len: usize) -> PathBuf {
    let mut p = base.to_path_buf();
    while p.as_os_str().len() + 201 < len {
        p.push("d".repeat(200));
    }
    let rest = len - p.as_os_str().len() - 1;
    p.push("e".repeat(rest));
    assert_eq!(p.as_os_str().len(), len);
    p
}

// staging = OUT/.wgpu-dequant-partial (22 more bytes); shards need 33 more,
// the side file 205: with OUT 3950 bytes long, shards fit in PATH_MAX (4096)
// and the side file does not.
const LATE_OUT_LEN: usize = 3950;

#[test]
fn dequantize_failing_after_the_shards_are_written_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, side) = checkpoint_failing_late(tmp.path());
    let out = long_path(&tmp.path().join("out"), LATE_OUT_LEN);
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let o = dequantize_cpu(&model, &out, &[]);
    failed(&o, "dequantize whose side file cannot be copied");
    let err = stderr(&o);
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains("IO-001") && errors[0].contains(&side),
        "{err}"
    );
    assert!(!out.exists(), "the output directory was left behind");
    assert!(
        std::fs::read_dir(out.parent().unwrap())
            .unwrap()
            .next()
            .is_none(),
        "something was left beside the output directory"
    );
}

#[test]
fn dequantize_failing_late_removes_the_parents_it_created() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, _) = checkpoint_failing_late(tmp.path());
    let top = tmp.path().join("out");
    let out = long_path(&top, LATE_OUT_LEN);
    let o = dequantize_cpu(&model, &out, &[]);
    failed(&o, "dequantize whose side file cannot be copied");
    assert!(!out.exists(), "the output directory was left behind");
    assert!(
        !top.exists(),
        "directories created for the output were left behind under {}",
        top.display()
    );
}

/// `inspect` and `validate` into a reader that stops early (`| head`): the
/// process ends quietly (by SIGPIPE, as `cat` does), never with a panic.
#[cfg(unix)]
#[test]
fn printing_into_a_closed_pipe_ends_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("many");
    std::fs::create_dir_all(&model).unwrap();
    let tensors: Vec<Tensor> = (0..4000)
        .map(|i| Tensor::f16(format!("model.layers.{i}.mlp.weight"), &[2], &[1.0, 2.0]))
        .collect();
    write_safetensors(&model.join("model.safetensors"), &tensors);
    for args in [
        &["inspect"][..],
        &["inspect", "--json"],
        &["validate", "--json"],
    ] {
        let mut child = Command::new(crate::common::bin())
            .args(args)
            .arg(&model)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 16];
        child.stdout.take().unwrap().read_exact(&mut first).unwrap();
        // The reader is gone: the rest of the report meets a closed pipe.
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            o.status.success() || o.status.signal() == Some(13),
            "{args:?}: {}: {err}",
            o.status
        );
    }
}

mod habits;
mod hints;
mod inspect;
mod json;
mod plurals;

//! Every run writes the user's model or says why: rope scaling carried into
//! config.json as transformers reads it, warnings on every path that does
//! the work (`--strict` refuses them, writing nothing), and files that
//! cannot be right refused by rule before anything is written. The GGUF
//! files come from tests/gguf/make_configs.py (gguf-py, as llama.cpp's
//! converter states each scaling); tests/gguf/check_configs.py checks the
//! same outputs in transformers itself.

use std::path::{Path, PathBuf};

use serde_json::Value;
use wgpu_dequant::{BackendChoice, Dequantize};

use crate::common::cli::{self, error_line, read_json, run, stderr, stdout};

fn case(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/gguf/configs/{name}.gguf"))
}

fn expected() -> Value {
    read_json(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf/configs/expected.json"))
}

/// The config.json the library writes for case `name`, and its warnings.
fn config(name: &str) -> (Value, Vec<wgpu_dequant::Warning>) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let summary = Dequantize::new()
        .backend(BackendChoice::Cpu)
        .run(case(name), &out)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    (read_json(&out.join("config.json")), summary.warnings)
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// transformers 5.25's `_compute_llama3_parameters`, written out again here
/// from its source (modeling_rope_utils.py), for one inverse frequency.
fn transformers_llama3(inv: f64, rope: &Value) -> f64 {
    let f = |k: &str| rope[k].as_f64().unwrap_or_else(|| panic!("{k} in {rope}"));
    let (factor, low, high) = (f("factor"), f("low_freq_factor"), f("high_freq_factor"));
    let old = f("original_max_position_embeddings");
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    let wavelen = 2.0 * std::f64::consts::PI / inv;
    let scaled = if wavelen > low_wavelen {
        inv / factor
    } else {
        inv
    };
    let smooth = (old / wavelen - low) / (high - low);
    let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
    // `~(wavelen < high) * ~(wavelen > low)`: no NaN here, so >= and <=.
    if wavelen >= high_wavelen && wavelen <= low_wavelen {
        smoothed
    } else {
        scaled
    }
}

/// Llama 3.2's `rope_freqs` (factor 32, low 1, high 4, 8192, theta 500000)
/// give llama3 rope_parameters under which transformers' inverse
/// frequencies are llama.cpp's θ^(-2i/d) / rope_freqs[i], within 1e-5; the
/// factor tensor is not written.
#[test]
fn llama3_rope_freqs_become_rope_parameters() {
    let e = &expected()["llama3"];
    let (c, warnings) = config("llama3");
    assert!(warnings.is_empty(), "{warnings:?}");
    let rope = &c["rope_parameters"];
    assert_eq!(rope["rope_type"], "llama3", "{rope}");
    assert_eq!(rope["rope_theta"].as_f64(), e["theta"].as_f64(), "{rope}");
    let d = e["rotary"].as_u64().unwrap() as f64;
    let want = floats(&e["inv_freq"]);
    for (i, w) in want.iter().enumerate() {
        let inv = 1.0 / e["theta"].as_f64().unwrap().powf(2.0 * i as f64 / d);
        let ours = transformers_llama3(inv, rope);
        assert!(
            (ours - w).abs() <= 1e-5 * w,
            "dimension {i}: {ours} vs llama.cpp's {w}"
        );
    }
}

/// Phi-3's factor lists become longrope's, value for value, with the
/// original context (beside rope_parameters too, where Phi3Config reads it
/// first) and the file's attention factor.
#[test]
fn phi3_factor_tensors_become_longrope() {
    let e = &expected()["phi3"];
    let (c, warnings) = config("phi3");
    assert!(warnings.is_empty(), "{warnings:?}");
    let rope = &c["rope_parameters"];
    assert_eq!(rope["rope_type"], "longrope", "{rope}");
    assert_eq!(rope["long_factor"], e["long_factor"]);
    assert_eq!(rope["short_factor"], e["short_factor"]);
    assert_eq!(rope["original_max_position_embeddings"], e["original"]);
    assert_eq!(c["original_max_position_embeddings"], e["original"]);
    assert_eq!(rope["attention_factor"], e["attention_factor"]);
}

/// Scaling stated by keys: YaRN (Qwen2.5), and Gemma 3's linear factor on
/// its full-attention layers only.
#[test]
fn scaling_keys_become_rope_parameters() {
    for name in ["yarn", "gemma3"] {
        let e = &expected()[name];
        let (c, warnings) = config(name);
        assert!(warnings.is_empty(), "{name}: {warnings:?}");
        let mut rope = &c["rope_parameters"];
        if let Some(layers) = e["layers"].as_str() {
            assert_eq!(
                rope["sliding_attention"]["rope_type"], "default",
                "{name}: {rope}"
            );
            rope = &rope[layers];
        }
        for (k, v) in e["rope"].as_object().unwrap() {
            assert_eq!(&rope[k], v, "{name}: {k} in {rope}");
        }
    }
}

/// Factors that no llama3 parameters reproduce (a linear ramp) keep the
/// default, with a warning that says so.
#[test]
fn rope_freqs_off_llama3s_curve_are_a_warning() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf/hf-llama/model");
    let v = wgpu_dequant::validate(&dir);
    assert!(v.errors.is_empty(), "{:?}", v.errors);
    let w = v.warnings.iter().find(|w| w.subject == "rope_freqs.weight");
    let w = w.unwrap_or_else(|| panic!("{:?}", v.warnings));
    assert_eq!(w.rule.id(), "HF-002");
    assert!(w.detail.contains("rope_type default"), "{w}");
}

/// A tensor transformers' model has no place for: a `warning:` line naming
/// it, the same in `--json`; `--strict` refuses before anything is written.
#[test]
fn warnings_reach_dequantize_and_strict_refuses_them() {
    let tmp = tempfile::tempdir().unwrap();
    let input = case("unplaced");
    let input = input.to_str().unwrap();
    let out = tmp.path().join("out");
    let o = run(&[
        "dequantize",
        input,
        "-o",
        out.to_str().unwrap(),
        "--json",
        "-q",
    ]);
    cli::ok(&o, "dequantize");
    // With --json, stderr tells the warning as an event.
    let err = stderr(&o);
    let told: Vec<Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .filter(|v: &Value| v["event"] == "warning")
        .collect();
    assert_eq!(told.len(), 1, "{err}");
    let line = told[0]["message"].as_str().unwrap();
    for part in ["unplaced.gguf: ", "blk.0.attn_sinks.weight: ", "[HF-001]"] {
        assert!(line.contains(part), "{part}: {line}");
    }
    let summary: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let w = &summary["warnings"][0];
    assert_eq!(
        (&w["rule"], &w["tensor"]),
        (&"HF-001".into(), &"blk.0.attn_sinks.weight".into())
    );
    assert_eq!(w["message"], line);
    // Without --json, the same message as a `warning:` line.
    let o = run(&[
        "dequantize",
        input,
        "-o",
        tmp.path().join("prose").to_str().unwrap(),
        "-q",
    ]);
    cli::ok(&o, "dequantize");
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("warning: ")).collect();
    assert_eq!(lines, [format!("warning: {line}")], "{err}");

    // Nothing written: neither a new OUT nor into an existing, empty one.
    let strict = tmp.path().join("strict");
    let o = run(&[
        "dequantize",
        input,
        "-o",
        strict.to_str().unwrap(),
        "--strict",
    ]);
    error_line(
        &o,
        "--strict",
        "HF-001",
        &["blk.0.attn_sinks.weight", "--strict"],
    );
    assert_eq!(o.status.code(), Some(3));
    assert!(!strict.exists());
    std::fs::create_dir(&strict).unwrap();
    let o = run(&[
        "dequantize",
        input,
        "-o",
        strict.to_str().unwrap(),
        "--strict",
    ]);
    error_line(&o, "--strict into an empty OUT", "HF-001", &[]);
    assert_eq!(std::fs::read_dir(&strict).unwrap().count(), 0);

    // The library: the note callback is told, strict refuses.
    let mut told = Vec::new();
    let lib = tmp.path().join("lib");
    Dequantize::new()
        .backend(BackendChoice::Cpu)
        .on_note(|n| {
            if let wgpu_dequant::Note::Warning(w) = n {
                told.push(w.message());
            }
        })
        .run(case("unplaced"), &lib)
        .unwrap();
    assert_eq!(told, [w["message"].as_str().unwrap()]);
    let e = Dequantize::new()
        .strict(true)
        .run(case("unplaced"), tmp.path().join("lib-strict"))
        .unwrap_err();
    assert_eq!(e.rule.id(), "HF-001", "{e}");
}

/// Well-typed metadata that no model has: refused by key, exit 3, nothing
/// written.
#[test]
fn impossible_gguf_metadata_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, key) in [
        ("nan-epsilon", "llama.attention.layer_norm_rms_epsilon"),
        ("huge-block-count", "llama.block_count"),
        ("string-theta", "llama.rope.freq_base"),
    ] {
        let out = tmp.path().join(name);
        let input = case(name);
        let o = run(&[
            "dequantize",
            input.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        error_line(&o, name, "GGUF-004", &[key, &format!("{name}.gguf")]);
        assert_eq!(o.status.code(), Some(3), "{name}");
        assert!(!out.exists(), "{name}");
    }
}

/// A quantized weights file without the config.json that says how to
/// decode it (a common download) is refused, naming config.json, instead
/// of its packed codes being "copied" as dense weights.
#[test]
fn weights_without_their_config_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for (fixture, what) in [("mlx-affine-4bit-g64", "MLX"), ("gptq-w4-g128", "qweight")] {
        let model = crate::common::fixtures().join(fixture).join("model");
        let dir = tmp.path().join(fixture);
        std::fs::create_dir(&dir).unwrap();
        for f in std::fs::read_dir(&model).unwrap() {
            let f = f.unwrap().path();
            if f.extension().is_some_and(|e| e == "safetensors") {
                std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
            }
        }
        for input in [dir.clone(), dir.join("model.safetensors")] {
            let out = tmp.path().join("out");
            let o = run(&[
                "dequantize",
                input.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ]);
            let line = error_line(&o, fixture, "CFG-003", &["config.json", what]);
            assert!(line.contains("is missing"), "{line}");
            assert_eq!(o.status.code(), Some(3));
            assert!(!out.exists());
        }
    }
}

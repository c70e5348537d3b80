//! `inspect` as a planner: totals (parameters, bytes, the files a run
//! writes), each tensor's source type and structured scheme, the compact
//! listing, several paths, and one JSON shape for success and failure.

use std::path::{Path, PathBuf};

use crate::common::cli::{failed, ok, run, stdout};
use crate::common::{read_dir_tensors, write_checkpoint, Tensor};
use serde_json::Value;

fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-w4a16")
}

fn gguf() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf/gguf-q4_k-llama/model")
}

fn json(o: &std::process::Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON: {e}\n{}", stdout(o)))
}

fn positive(v: &Value, key: &str) -> u64 {
    let n = v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key}: {}", v[key]));
    assert!(n > 0, "{key} is 0");
    n
}

#[test]
fn totals_and_files_are_what_dequantize_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = run(&[
        "inspect",
        sample().to_str().unwrap(),
        "--json",
        "-o",
        out.to_str().unwrap(),
    ]);
    ok(&o, "inspect --json");
    assert!(!out.exists(), "inspect -o writes nothing");
    let v = json(&o);
    assert_eq!(v["ok"], true);
    let parameters = positive(&v, "parameters");
    let input = positive(&v, "input_bytes");
    let output = positive(&v, "output_bytes");
    positive(&v, "free_bytes");
    assert_eq!(v["architecture"], "LlamaForCausalLM");
    let file_len = std::fs::metadata(sample().join("model.safetensors"))
        .unwrap()
        .len();
    assert_eq!(input, file_len);
    let mut files: Vec<String> = v["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    let o = run(&[
        "dequantize",
        sample().to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--backend",
        "cpu",
        "-q",
    ]);
    ok(&o, "dequantize");
    // The run's own record lives in a hidden folder; the files are the rest.
    let mut written: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    files.sort();
    written.sort();
    assert_eq!(files, written);
    let tensors = read_dir_tensors(&out);
    let elements: u64 = tensors
        .values()
        .map(|(_, shape, _)| shape.iter().map(|&d| d as u64).product::<u64>())
        .sum();
    assert_eq!(parameters, elements);
    let bytes: u64 = tensors.values().map(|(_, _, b)| b.len() as u64).sum();
    assert_eq!(output, bytes);
    // Per tensor: structured scheme fields where it is decoded.
    let rows = v["tensors"].as_array().unwrap();
    let down = rows
        .iter()
        .find(|t| t["name"] == "model.layers.0.mlp.down_proj.weight")
        .expect("down_proj");
    assert_eq!(down["action"], "decode");
    assert_eq!(down["source_dtype"], "I32");
    assert_eq!(down["scheme"], "compressed-tensors");
    assert_eq!(down["bits"], 4);
    assert_eq!(down["group_size"], 128);
    assert_eq!(down["bytes"], 256 * 768 * 2);
    let sources = down["sources"].as_array().unwrap();
    assert!(
        sources.contains(&Value::from("model.layers.0.mlp.down_proj.weight_packed")),
        "{sources:?}"
    );
    assert!(down["scheme_text"].is_string());
}

#[test]
fn planning_flags_change_the_plan_as_they_change_the_run() {
    let s = sample();
    let s = s.to_str().unwrap();
    let auto = json(&run(&["inspect", s, "--json"]));
    let f32 = json(&run(&["inspect", s, "--json", "--dtype", "float32"]));
    assert_eq!(f32["parameters"], auto["parameters"]);
    assert_eq!(
        f32["output_bytes"].as_u64().unwrap(),
        2 * auto["output_bytes"].as_u64().unwrap()
    );
    let split = json(&run(&["inspect", s, "--json", "--max-shard-size", "500kB"]));
    let files = split["files"].as_array().unwrap();
    assert!(
        files.iter().any(|f| f == "model.safetensors.index.json")
            && files
                .iter()
                .any(|f| f.as_str().unwrap().starts_with("model-00001-of-")),
        "{files:?}"
    );
}

#[test]
fn gguf_metadata_values_are_json_values_and_text_shows_source_types() {
    let g = gguf();
    let o = run(&["inspect", g.to_str().unwrap(), "--json"]);
    ok(&o, "inspect --json");
    let v = json(&o);
    let meta = &v["format"]["metadata"];
    assert_eq!(meta["general.architecture"], "llama");
    assert_eq!(meta["llama.block_count"], 2);
    assert!(
        meta["tokenizer.ggml.merges"].is_array(),
        "{}",
        meta["tokenizer.ggml.merges"]
    );
    // 320 tokens: more than a report gives whole.
    assert_eq!(meta["tokenizer.ggml.tokens"]["length"], 320);
    let embed = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "model.embed_tokens.weight")
        .expect("embed_tokens");
    assert_eq!(embed["source_dtype"], "F16");
    let head = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "lm_head.weight")
        .expect("lm_head");
    assert_eq!(
        (&head["source_dtype"], &head["scheme"], &head["bits"]),
        (&Value::from("Q4_K"), &Value::from("q4_k"), &Value::from(4))
    );
    assert!(v["files"]
        .as_array()
        .unwrap()
        .contains(&Value::from("tokenizer.json")));
    let o = run(&["inspect", g.to_str().unwrap()]);
    ok(&o, "inspect");
    let text = stdout(&o);
    for label in ["parameters  ", "reads  ", "writes  ", "free  ", "class  "] {
        assert!(text.contains(label), "no {label:?} line:\n{text}");
    }
    let embed = text
        .lines()
        .find(|l| l.contains("model.embed_tokens.weight"))
        .expect("embed line");
    assert!(embed.contains("F16 -> BF16"), "{embed}");
}

#[test]
fn a_moe_listing_folds_its_repeats() {
    let tmp = tempfile::tempdir().unwrap();
    let mut tensors = Vec::new();
    for layer in 0..4 {
        for expert in 0..16 {
            for proj in ["gate_proj", "up_proj", "down_proj"] {
                let name = format!("model.layers.{layer}.mlp.experts.{expert}.{proj}.weight");
                tensors.push(Tensor::new(name, "BF16", &[2, 2], vec![0; 8]));
            }
        }
        let name = format!("model.layers.{layer}.input_layernorm.weight");
        tensors.push(Tensor::new(name, "BF16", &[2], vec![0; 4]));
    }
    write_checkpoint(tmp.path(), &tensors, Value::Null);
    let p = tmp.path().to_str().unwrap();
    let short = run(&["inspect", p]);
    ok(&short, "inspect");
    let all = run(&["inspect", p, "--tensors"]);
    ok(&all, "inspect --tensors");
    let (short, all) = (stdout(&short), stdout(&all));
    assert!(short.lines().count() + 150 < all.lines().count(), "{short}");
    let line = short
        .lines()
        .find(|l| l.contains("model.layers.*.mlp.experts.*.down_proj.weight"))
        .unwrap_or_else(|| panic!("no pattern line:\n{short}"));
    assert!(line.contains("x 64"), "{line}");
    // JSON lists every tensor whatever the listing.
    let v = json(&run(&["inspect", p, "--json"]));
    assert_eq!(v["tensors"].as_array().unwrap().len(), tensors.len());
}

#[test]
fn several_paths_and_failures_share_one_shape() {
    let s = sample();
    let g = gguf();
    let o = run(&[
        "inspect",
        s.to_str().unwrap(),
        g.to_str().unwrap(),
        "--json",
    ]);
    ok(&o, "inspect A B --json");
    let v = json(&o);
    let both = v.as_array().expect("an array for two paths");
    assert_eq!(both.len(), 2);
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&both[0]), keys(&both[1]));
    // Text: one report after another, a blank line between.
    let o = run(&["inspect", s.to_str().unwrap(), g.to_str().unwrap()]);
    ok(&o, "inspect A B");
    let text = stdout(&o);
    assert_eq!(text.matches("checkpoint  ").count(), 2, "{text}");
    assert!(text.contains("\n\ncheckpoint  "), "{text}");

    let tmp = tempfile::tempdir().unwrap();
    let corrupt = tmp.path().join("model.safetensors");
    std::fs::write(&corrupt, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a header").unwrap();
    let missing = tmp.path().join("missing");
    for bad in [&corrupt, &missing] {
        let o = run(&["inspect", bad.to_str().unwrap(), "--json"]);
        failed(&o, "inspect of a bad path");
        let f = json(&o);
        assert_eq!(keys(&f), keys(&both[0]), "{f}");
        assert_eq!(f["ok"], false);
        assert!(f["format"].is_null() && f["parameters"].is_null(), "{f}");
        assert_eq!(f["tensors"], serde_json::json!([]));
        assert!(!f["errors"].as_array().unwrap().is_empty(), "{f}");
    }
    // The exit status is the first non-zero of the reports'.
    let o = run(&[
        "inspect",
        s.to_str().unwrap(),
        missing.to_str().unwrap(),
        "--json",
    ]);
    let v = json(&o);
    assert_eq!(v.as_array().map(Vec::len), Some(2));
    assert_eq!(o.status.code(), Some(1));
}

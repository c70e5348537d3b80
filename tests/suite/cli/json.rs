//! `dequantize --json` as a program follows it: the summary on stdout
//! (backend, seconds, format, warnings, quantization tensors used up apart
//! from model tensors not written), and stderr nothing but JSON lines.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::cli::{ok, run, stderr, stdout};
use crate::common::read_dir_tensors;
use serde_json::Value;

/// The sample the README decodes.
fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-w4a16")
}

/// A GGUF model of the GGUF tests (`tests/gguf/NAME`).
fn gguf(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/gguf")
        .join(name)
}

/// `dequantize INPUT -o OUT --backend cpu EXTRA…`.
fn dequantize(input: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["dequantize", input.to_str().unwrap()];
    args.extend_from_slice(&["-o", out.to_str().unwrap(), "--backend", "cpu"]);
    args.extend_from_slice(extra);
    run(&args)
}

/// Every line of stderr, each a JSON object with its `event`.
fn events(o: &Output) -> Vec<Value> {
    let err = stderr(o);
    err.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("stderr line is not JSON ({e}): {l}\n{err}"));
            assert!(v["event"].is_string(), "no event: {l}");
            v
        })
        .collect()
}

/// The summary a `--json` run printed.
fn summary(o: &Output) -> Value {
    serde_json::from_str(&stdout(o))
        .unwrap_or_else(|e| panic!("stdout is not the summary ({e}):\n{}", stdout(o)))
}

#[test]
fn the_summary_names_backend_format_seconds_and_what_was_used_up() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = dequantize(&sample(), &out, &["--json"]);
    ok(&o, "dequantize --json");
    let s = summary(&o);
    assert_eq!(s["backend"], "cpu", "{s}");
    assert!(
        s["backend_detail"]
            .as_str()
            .is_some_and(|b| b.starts_with("cpu")),
        "{s}"
    );
    assert!(s["seconds"].as_f64().is_some_and(|t| t >= 0.0), "{s}");
    assert_eq!(s["format"], "compressed-tensors", "{s}");
    assert!(
        s["format_detail"]
            .as_str()
            .is_some_and(|f| f.contains("compressed-tensors")),
        "{s}"
    );
    assert_eq!(s["warnings"], serde_json::json!([]), "{s}");
    // Every input tensor is copied or used up by a decoded module.
    let inputs = read_dir_tensors(&sample()).len() as u64;
    let (consumed, copied) = (s["consumed"].as_u64(), s["copied"].as_u64());
    assert_eq!(
        consumed.zip(copied).map(|(u, c)| u + c),
        Some(inputs),
        "{s}"
    );
    assert!(consumed.is_some_and(|u| u > 0), "{s}");
    assert_eq!(s["dropped"], 0, "{s}");

    let told = events(&o);
    let start = told.iter().find(|e| e["event"] == "start").expect("start");
    assert_eq!(
        (&start["format"], &start["backend"]),
        (&s["format"], &s["backend"])
    );
    let progress: Vec<&Value> = told.iter().filter(|e| e["event"] == "progress").collect();
    let last = progress.last().expect("a progress event");
    assert_eq!(last["done_bytes"], last["total_bytes"], "{last}");
    assert_eq!(last["done_bytes"], s["tensor_bytes"], "{last}");
    assert_eq!(last["done_tensors"], last["total_tensors"], "{last}");
    assert!(last["tensor"].is_string(), "{last}");
}

/// A GGUF model's rope factors are used up (config.json states them), a
/// tensor transformers' model has no place for is not written: the
/// summary counts them apart.
#[test]
fn a_gguf_splits_what_was_used_up_from_what_was_not_written() {
    let tmp = tempfile::tempdir().unwrap();
    let o = dequantize(
        &gguf("hf-llama/model"),
        &tmp.path().join("llama"),
        &["--json"],
    );
    ok(&o, "dequantize --json hf-llama");
    let s = summary(&o);
    assert_eq!(s["format"], "gguf", "{s}");
    assert_eq!(
        (&s["consumed"], &s["dropped"]),
        (&1.into(), &0.into()),
        "{s}"
    );

    let o = dequantize(
        &gguf("configs/unplaced.gguf"),
        &tmp.path().join("unplaced"),
        &["--json"],
    );
    ok(&o, "dequantize --json unplaced");
    let s = summary(&o);
    assert_eq!(
        (&s["consumed"], &s["dropped"]),
        (&0.into(), &1.into()),
        "{s}"
    );
    assert_eq!(s["warnings"][0]["rule"], "HF-001", "{s}");
    let warned = events(&o)
        .into_iter()
        .filter(|e| e["event"] == "warning")
        .count();
    assert_eq!(warned, 1);

    let o = run(&["inspect", gguf("configs/unplaced.gguf").to_str().unwrap()]);
    assert!(
        stdout(&o).contains("1 model tensor not written"),
        "{}",
        stdout(&o)
    );
}

/// A failure with `--json`: stdout has `{"errors": [...]}` as before,
/// stderr the error as an event, not prose.
#[test]
fn a_failure_is_an_error_event() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), b"mine").unwrap();
    let o = dequantize(&sample(), &out, &["--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(summary(&o)["errors"][0]["rule"], "OUT-001");
    let told = events(&o);
    let error = told.last().expect("an error event");
    assert_eq!(
        (&error["event"], &error["rule"]),
        (&"error".into(), &"OUT-001".into())
    );
}

/// A `--resume` run says at its start what it keeps and what it writes.
#[test]
fn a_resume_run_says_what_it_keeps() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = dequantize(&sample(), &out, &["--resume"]);
    ok(&o, "dequantize --resume");
    let want = format!(
        "resuming {}: 0 finished files kept (checked against their BLAKE3 digests), 1 to write",
        out.display()
    );
    assert!(stderr(&o).lines().any(|l| l == want), "{}", stderr(&o));
}

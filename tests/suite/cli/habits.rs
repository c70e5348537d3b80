//! The spellings people bring from other tools (transformers' dtypes,
//! llama.cpp's sizes, `cuda`), and what a command line of its kind offers
//! beside its commands: completions, a man page, the formats list, a
//! `--version` naming the build, `--threads`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::bin;
use crate::common::cli::{failed, ok, run, stderr, stdout};
use serde_json::{json, Value};

/// The sample the README decodes.
fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-w4a16")
}

/// `wgpu-dequant GLOBAL… dequantize SAMPLE -o OUT --backend cpu EXTRA…`.
fn dequantize_sample(global: &[&str], out: &Path, extra: &[&str]) -> Output {
    let input = sample();
    let mut args = global.to_vec();
    args.extend_from_slice(&["dequantize", input.to_str().unwrap()]);
    args.extend_from_slice(&["-o", out.to_str().unwrap(), "--backend", "cpu"]);
    args.extend_from_slice(extra);
    run(&args)
}

/// `dequantize` of the sample on the CPU into `tmp/name`, quietly, with
/// `extra`; the bytes of its model.safetensors.
fn decode(tmp: &Path, name: &str, extra: &[&str]) -> Vec<u8> {
    let out = tmp.join(name);
    let o = dequantize_sample(&[], &out, &[&["-q"], extra].concat());
    ok(&o, &format!("dequantize {extra:?}"));
    std::fs::read(out.join("model.safetensors")).unwrap()
}

#[test]
fn dtype_spellings_give_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    for (dtype, others) in [
        ("bf16", &["BF16", "bfloat16"][..]),
        ("f16", &["float16", "fp16", "Half"][..]),
        ("f32", &["float32", "FP32"][..]),
    ] {
        let want = decode(tmp.path(), dtype, &["--dtype", dtype]);
        for other in others {
            let got = decode(tmp.path(), other, &["--dtype", other]);
            assert!(got == want, "--dtype {other} differs from --dtype {dtype}");
        }
    }
}

#[test]
fn a_wrong_dtype_gets_the_list_not_a_similar_value() {
    let o = run(&["dequantize", "x", "-o", "y", "--dtype", "int4"]);
    failed(&o, "--dtype int4");
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("bfloat16") && err.contains("bf16"), "{err}");
    assert!(!err.contains("similar value"), "{err}");
}

#[test]
fn llama_cpp_sizes_are_read() {
    let tmp = tempfile::tempdir().unwrap();
    let want = decode(tmp.path(), "plain", &[]);
    for size in ["5G", "5 GB", "5GiB"] {
        let got = decode(tmp.path(), size, &["--max-shard-size", size]);
        assert!(got == want, "--max-shard-size {size} changed the bytes");
    }
}

#[test]
fn cuda_and_rocm_point_to_the_gpu_backend() {
    for name in ["cuda", "ROCm"] {
        let o = run(&["dequantize", "x", "-o", "y", "--backend", name]);
        failed(&o, name);
        assert_eq!(o.status.code(), Some(2));
        let err = stderr(&o);
        assert!(
            err.contains(&format!("--backend \"{name}\"")) && err.contains("Vulkan: use gpu"),
            "{err}"
        );
        assert!(!err.contains("similar value"), "{err}");
    }
}

/// `dequantize` with `WGPU_DEQUANT_BACKEND` set to `value`.
fn with_backend_variable(value: &str) -> Output {
    Command::new(bin())
        .args(["dequantize", "x", "-o", "y"])
        .env("WGPU_DEQUANT_BACKEND", value)
        .output()
        .unwrap()
}

#[test]
fn a_bad_backend_variable_is_named_as_the_variable() {
    for value in ["cuda", "fast"] {
        let o = with_backend_variable(value);
        failed(&o, value);
        assert_eq!(o.status.code(), Some(2));
        let err = stderr(&o);
        assert!(
            err.contains(&format!("WGPU_DEQUANT_BACKEND=\"{value}\"")),
            "{err}"
        );
        assert!(!err.contains("--backend:"), "{err}");
    }
}

#[test]
fn a_graphics_api_backend_decodes_the_same_or_says_there_is_none() {
    let tmp = tempfile::tempdir().unwrap();
    let want = decode(tmp.path(), "cpu", &[]);
    for api in ["vulkan", "Metal", "dx12", "gl"] {
        let out = tmp.path().join(api);
        let o = run(&[
            "dequantize",
            sample().to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--backend",
            api,
            "-q",
        ]);
        if o.status.success() {
            let got = std::fs::read(out.join("model.safetensors")).unwrap();
            assert!(got == want, "--backend {api} differs from the CPU");
        } else {
            assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
            let err = stderr(&o);
            let name = api.to_ascii_lowercase();
            assert!(err.contains(&format!("no {name} adapter")), "{err}");
        }
    }
}

#[test]
fn a_positional_output_points_to_the_flag() {
    let o = run(&["dequantize", "in-dir", "out-dir"]);
    failed(&o, "dequantize IN OUT");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("-o out-dir"), "{}", stderr(&o));
}

#[test]
fn completions_cover_every_shell() {
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let o = run(&["completions", shell]);
        ok(&o, shell);
        assert!(stdout(&o).contains("dequantize"), "{shell}");
    }
}

#[test]
fn the_man_page_is_roff() {
    let o = run(&["man"]);
    ok(&o, "man");
    let text = stdout(&o);
    assert!(
        text.starts_with(".TH") || text.starts_with(".ie"),
        "{}",
        &text[..80.min(text.len())]
    );
    assert!(text.contains("dequantize"));
}

#[test]
fn formats_lists_formats_types_and_architectures() {
    let o = run(&["formats"]);
    ok(&o, "formats");
    let text = stdout(&o);
    for name in [
        "gguf",
        "mlx",
        "gptq",
        "bitsandbytes",
        "qwen3moe",
        "gemma3",
        "Q4_K",
    ] {
        assert!(text.contains(name), "formats does not name {name}:\n{text}");
    }
    let o = run(&["formats", "--json"]);
    ok(&o, "formats --json");
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let names = |key: &str, field: &str| -> Vec<String> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e[field].as_str().unwrap().to_string())
            .collect()
    };
    let formats = names("formats", "name");
    for f in [
        "gguf",
        "mlx",
        "gptq",
        "bitsandbytes",
        "bitnet",
        "hqq",
        "gemma",
        "sinq",
        "vptq",
        "aqlm",
        "compressed-tensors",
    ] {
        assert!(formats.iter().any(|n| n == f), "{f}: {formats:?}");
    }
    let archs = names("gguf_architectures", "gguf");
    assert!(archs.iter().any(|a| a == "qwen3moe") && archs.iter().any(|a| a == "gemma3"));
    let q4k = v["gguf_types"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "Q4_K")
        .unwrap();
    assert_eq!(q4k["support"], "decoded");
    assert_eq!(q4k["bits_per_weight"], 4.5);
    // Bonsai's types, under llama.cpp's numbers.
    for (name, id, bits) in [("Q1_0", 41, 1.125), ("Q2_0", 42, 2.25)] {
        let t = v["gguf_types"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap();
        assert_eq!(
            (&t["id"], &t["support"], &t["bits_per_weight"]),
            (&json!(id), &json!("decoded"), &json!(bits))
        );
    }
}

#[test]
fn version_names_the_commit_and_wgpu() {
    let o = run(&["--version"]);
    ok(&o, "--version");
    let text = stdout(&o);
    assert!(
        text.starts_with(concat!("wgpu-dequant ", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(text.contains("\ncommit "), "{text}");
    assert!(text.contains("\nwgpu 30."), "{text}");
    assert!(text.contains("features: cli"), "{text}");
}

#[test]
fn one_thread_decodes_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let want = decode(tmp.path(), "all", &[]);
    assert!(decode(tmp.path(), "one", &["--threads", "1"]) == want);
    let o = dequantize_sample(&["--threads", "1"], &tmp.path().join("said"), &[]);
    ok(&o, "--threads 1");
    assert!(stderr(&o).contains("cpu (1 thread)"), "{}", stderr(&o));
    let o = run(&["--threads", "0", "formats"]);
    failed(&o, "--threads 0");
}

#[test]
fn counts_of_one_are_singular() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(&["validate", sample().to_str().unwrap()]);
    ok(&o, "validate");
    assert!(!stdout(&o).contains("(1 warnings)"));
    let o = dequantize_sample(&[], &tmp.path().join("out"), &[]);
    ok(&o, "dequantize");
    let err = stderr(&o);
    for wrong in ["1 tensors", "1 threads", "1 shards", "1 files"] {
        assert!(!err.contains(&format!(" {wrong}")), "{err}");
    }
}

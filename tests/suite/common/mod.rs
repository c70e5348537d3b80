//! Helpers shared by the integration tests: write small safetensors
//! checkpoints by hand, read outputs back, hash bytes, run the library
//! without letting a panic through. `producer` holds the producer-side
//! references the synthetic checkpoints are checked against.
#![allow(dead_code)]

pub mod cli;
pub mod hub;
pub mod jobs;
pub mod producer;
pub mod stall;

use std::collections::BTreeMap;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use wgpu_dequant::{dequantize, BackendChoice, DtypeChoice, Error, Options, Rule};

/// One stored tensor: name, safetensors dtype string, shape, raw bytes.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl Tensor {
    pub fn new(
        name: impl Into<String>,
        dtype: &'static str,
        shape: &[usize],
        data: Vec<u8>,
    ) -> Tensor {
        Tensor {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            data,
        }
    }
    pub fn i32(name: impl Into<String>, shape: &[usize], v: &[i32]) -> Tensor {
        Tensor::new(name, "I32", shape, le_bytes(v, i32::to_le_bytes))
    }
    /// Words stored as I32 (compressed-tensors' packed int32 tensors).
    pub fn u32_words(name: impl Into<String>, shape: &[usize], v: &[u32]) -> Tensor {
        Tensor::new(name, "I32", shape, le_bytes(v, u32::to_le_bytes))
    }
    pub fn i64(name: impl Into<String>, shape: &[usize], v: &[i64]) -> Tensor {
        Tensor::new(name, "I64", shape, le_bytes(v, i64::to_le_bytes))
    }
    pub fn f32(name: impl Into<String>, shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::new(name, "F32", shape, le_bytes(v, f32::to_le_bytes))
    }
    /// bf16 tensor from f32 values (truncated: callers pass bf16-exact values).
    pub fn bf16(name: impl Into<String>, shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::new(
            name,
            "BF16",
            shape,
            le_bytes(v, |x| ((x.to_bits() >> 16) as u16).to_le_bytes()),
        )
    }
    pub fn f16(name: impl Into<String>, shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::new(
            name,
            "F16",
            shape,
            le_bytes(v, |x| half::f16::from_f32(x).to_bits().to_le_bytes()),
        )
    }
    pub fn u8(name: impl Into<String>, dtype: &'static str, shape: &[usize], v: &[u8]) -> Tensor {
        Tensor::new(name, dtype, shape, v.to_vec())
    }
}

/// The little-endian bytes of every value, laid end to end.
fn le_bytes<X: Copy, const N: usize>(v: &[X], bytes: impl Fn(X) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| bytes(x)).collect()
}

/// Serialises tensors (in the given order) as a safetensors file.
pub fn safetensors_bytes(
    tensors: &[Tensor],
    metadata: Option<&BTreeMap<String, String>>,
) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if let Some(m) = metadata {
        header.insert("__metadata__".into(), json!(m));
    }
    let mut off = 0;
    for t in tensors {
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + t.data.len()]}),
        );
        off += t.data.len();
    }
    let data: Vec<u8> = tensors
        .iter()
        .flat_map(|t| t.data.iter().copied())
        .collect();
    raw_safetensors(&Value::Object(header), &data)
}

/// A safetensors file with a hand-written header (padded to 8) and `data`.
pub fn raw_safetensors(header: &Value, data: &[u8]) -> Vec<u8> {
    raw_safetensors_text(header.to_string().as_bytes(), data)
}

/// A safetensors file with header bytes `header`, which need not be JSON
/// (padded to 8 with spaces), and `data`.
pub fn raw_safetensors_text(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut h = header.to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

/// Writes `first` as SHARD1 and `second` as SHARD2 of a checkpoint in
/// `dir`, with the index naming each tensor's shard.
pub fn write_two_shards(dir: &Path, first: &[Tensor], second: &[Tensor]) {
    write_safetensors(&dir.join(SHARD1), first);
    write_safetensors(&dir.join(SHARD2), second);
    let map: serde_json::Map<String, serde_json::Value> = first
        .iter()
        .map(|t| (t.name.clone(), serde_json::json!(SHARD1)))
        .chain(
            second
                .iter()
                .map(|t| (t.name.clone(), serde_json::json!(SHARD2))),
        )
        .collect();
    write_json(
        &dir.join("model.safetensors.index.json"),
        &serde_json::json!({"metadata": {}, "weight_map": map}),
    );
}

pub fn write_safetensors(path: &Path, tensors: &[Tensor]) {
    std::fs::write(path, safetensors_bytes(tensors, None)).unwrap();
}

pub fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

/// A checkpoint directory (made when missing) with `model.safetensors`
/// holding `tensors` and `config` as its `config.json`.
pub fn write_model(dir: &Path, tensors: &[Tensor], config: &Value) {
    std::fs::create_dir_all(dir).unwrap();
    write_safetensors(&dir.join("model.safetensors"), tensors);
    write_json(&dir.join("config.json"), config);
}

/// A checkpoint directory with `model.safetensors` and a `config.json`
/// whose `quantization_config` is `qc` (none when `Value::Null`).
pub fn write_checkpoint(dir: &Path, tensors: &[Tensor], qc: Value) {
    let mut cfg = json!({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"});
    if !qc.is_null() {
        cfg["quantization_config"] = qc;
    }
    write_model(dir, tensors, &cfg);
}

/// Tensors as [`read_tensors`] or [`read_dir_tensors`] read them, to break
/// and write again.
pub fn tensors_of(read: BTreeMap<String, (String, Vec<usize>, Vec<u8>)>) -> Vec<Tensor> {
    read.into_iter()
        .map(|(name, (dtype, shape, data))| {
            let dtype: &'static str = match dtype.as_str() {
                "F16" => "F16",
                "BF16" => "BF16",
                "F32" => "F32",
                "I8" => "I8",
                "U8" => "U8",
                "I16" => "I16",
                "I32" => "I32",
                "I64" => "I64",
                other => panic!("{name}: dtype {other}"),
            };
            Tensor::new(name, dtype, &shape, data)
        })
        .collect()
}

/// Fixture `case`'s one-file model (`<case>/model/model.safetensors` and
/// its `config.json`), to break and write again ([`write_model`]).
pub fn fixture_model(case: &str) -> (Vec<Tensor>, Value) {
    let dir = fixtures().join(case).join("model");
    let tensors = tensors_of(read_tensors(&dir.join("model.safetensors")));
    let cfg = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    (tensors, cfg)
}

/// The tensor called `name` among `tensors`, to break it in place.
pub fn tensor_named<'a>(tensors: &'a mut [Tensor], name: &str) -> &'a mut Tensor {
    tensors
        .iter_mut()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor {name}"))
}

/// A malformed checkpoint, which `write` puts in a fresh directory:
/// refused with `rule`, the one-line message naming `needle`, nothing
/// written.
pub fn refused_by_rule(write: impl FnOnce(&Path), rule: Rule, needle: &str) {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path());
    let e = dequantize_err(tmp.path());
    assert_eq!(e.rule, rule, "{e}");
    let line = e.to_string();
    assert!(!line.contains('\n') && line.contains(needle), "{line}");
}

/// A compressed-tensors quantization_config with `groups` as its
/// config_groups.
pub fn ct_config_groups(format: &str, version: &str, groups: Value) -> Value {
    json!({
        "quant_method": "compressed-tensors",
        "format": format,
        "version": version,
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": groups,
    })
}

/// A compressed-tensors quantization_config with one group.
pub fn ct_config(format: &str, weights: Value, version: &str) -> Value {
    ct_config_groups(
        format,
        version,
        json!({"group_0": {"format": format, "targets": ["Linear"], "weights": weights}}),
    )
}

/// ModelOpt's `hf_quant_config.json` for `algo`.
pub fn hf_quant_config(algo: &str) -> Value {
    json!({
        "producer": {"name": "modelopt", "version": "0.47.0"},
        "quantization": {
            "quant_algo": algo, "kv_cache_quant_algo": null, "group_size": 16,
            "exclude_modules": ["lm_head"],
        },
    })
}

/// Every tensor of a safetensors file: name → (dtype, shape, bytes).
pub fn read_tensors(path: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.iter()
        .map(|(n, v)| {
            (
                n.to_string(),
                (
                    format!("{:?}", v.dtype()),
                    v.shape().to_vec(),
                    v.data().to_vec(),
                ),
            )
        })
        .collect()
}

/// Every tensor of every `.safetensors` file in `dir`.
pub fn read_dir_tensors(dir: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let mut all = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            all.extend(read_tensors(&p));
        }
    }
    all
}

pub fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_wgpu-dequant"))
}

/// Example `name`, built beside the tests (`cargo test` builds the
/// examples; `cargo test --test suite` alone does not, so it is built then).
pub fn example(name: &str) -> PathBuf {
    // target/<profile>/deps/<this test> → target/<profile>/examples/<name>
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let example = dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !example.exists() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let built = std::process::Command::new(cargo)
            .args(["build", "--quiet", "--example", name])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(built.success(), "cannot build the {name} example");
    }
    example
}

/// Shard names of a two-shard checkpoint.
pub const SHARD1: &str = "model-00001-of-00002.safetensors";
pub const SHARD2: &str = "model-00002-of-00002.safetensors";

/// Copies the files (not subdirectories) of `from` into `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
        }
    }
}

/// Whether `name`, an entry of an output directory, is the folder that
/// holds the record a finished run leaves (what a `--resume` of the same
/// job reads: `.cache/huggingface/wgpu-dequant-done*.json`, which
/// `hf upload` never uploads), not part of the dense checkpoint.
pub fn is_record(name: &str) -> bool {
    name == ".cache"
}

/// Every entry of `dir` but a finished run's record ([`is_record`]),
/// sorted: (name, bytes), `<dir>` for directories.
pub fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| !is_record(&e.as_ref().unwrap().file_name().to_string_lossy()))
        .map(|e| {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = if p.is_file() {
                std::fs::read(&p).unwrap()
            } else {
                b"<dir>".to_vec()
            };
            (name, bytes)
        })
        .collect();
    v.sort();
    v
}

/// Options for the CPU backend with the default output dtype.
pub const CPU_AUTO: Options = Options {
    dtype: DtypeChoice::Auto,
    backend: BackendChoice::Cpu,
};

/// Runs `f`, catching a panic as its message, so a test can say what
/// panicked instead of unwinding.
pub fn caught<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| panic_text(&*p))
}

/// The message of a caught panic.
pub fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(non-string panic)".into())
}

/// `dequantize(path)` on the CPU into a fresh directory; the error, checked
/// to leave no output directory behind. Fails the test when it is accepted or
/// when the library panics.
pub fn dequantize_err(path: &Path) -> Error {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    let e = match caught(|| dequantize(path, &out, &CPU_AUTO)) {
        Err(p) => panic!("dequantize panicked on {}: {}", path.display(), p),
        Ok(Ok(s)) => panic!("dequantize accepted broken {}: {s:?}", path.display()),
        Ok(Err(e)) => e,
    };
    assert!(
        !out.exists(),
        "dequantize failed ({e}) but left {} behind",
        out.display()
    );
    e
}

/// How every GPU test gets its adapter: `gpu_test(|adapter| { ... })` runs
/// the test with the first adapter wgpu finds. Without one the test fails
/// when `WGPU_DEQUANT_REQUIRE_GPU=1` (set by CI); otherwise it is counted as
/// not run, and when the test binary exits one line on stderr says how many
/// GPU tests did not run and what makes them run (see [`not_run_notice`]).
pub fn gpu_test(test: impl FnOnce(wgpu::Adapter)) {
    match wgpu_dequant::backend::gpu::find_adapter() {
        Some(adapter) => test(adapter),
        None if std::env::var("WGPU_DEQUANT_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("WGPU_DEQUANT_REQUIRE_GPU=1 but no GPU adapter was found (install mesa-vulkan-drivers)")
        }
        None => {
            static NOTICE: Once = Once::new();
            NOTICE.call_once(|| {
                // SAFETY: `not_run_notice` is a plain function that stays
                // valid until the process ends; registering has no other
                // precondition.
                let registered = unsafe { libc::atexit(not_run_notice) } == 0;
                assert!(registered, "cannot register the GPU tests' exit notice");
            });
            NOT_RUN.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// GPU tests that found no adapter and did not run.
static NOT_RUN: AtomicUsize = AtomicUsize::new(0);

/// Run when the test binary exits, after libtest's summary: one line, once
/// per run, with the count of GPU tests that did not run. libtest captures
/// `print!`/`eprint!` of passing tests, so the line is written to the stderr
/// handle itself (which it does not capture), and `cargo test` shows it.
extern "C" fn not_run_notice() {
    let n = NOT_RUN.load(Ordering::SeqCst);
    let (tests, run) = if n == 1 {
        ("test", "it")
    } else {
        ("tests", "them")
    };
    let line = format!(
        "{n} GPU {tests} did not run: no GPU adapter found. To run {run}: apt-get install \
         mesa-vulkan-drivers (or your platform's Vulkan, Metal or DX12 driver); \
         WGPU_DEQUANT_REQUIRE_GPU=1 makes this a failure.\n"
    );
    // Nothing to do about a closed stderr at exit.
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// The tests' random numbers: `fastrand`, seeded, so every run is the same.
pub struct Rng(fastrand::Rng);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }
    pub fn next(&mut self) -> u64 {
        self.0.u64(..)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.u64(..n)
    }

    /// `text` with one to three bytes overwritten: digits, quotes and JSON
    /// structure as often as any other byte (what config fuzzing mutates).
    pub fn mutate(&mut self, text: &[u8]) -> Vec<u8> {
        const PICKS: &[u8] = b"0123456789-.,:\"{}[]e ";
        let mut t = text.to_vec();
        for _ in 0..1 + self.below(3) {
            let at = self.below(t.len() as u64) as usize;
            t[at] = if self.below(2) == 0 {
                PICKS[self.below(PICKS.len() as u64) as usize]
            } else {
                self.below(256) as u8
            };
        }
        t
    }
}

/// The reference checkpoints in tests/fixtures.
pub const CASES: &[&str] = &[
    "aqlm-1x16-f16",
    "aqlm-2x8-bf16",
    "aqlm-4x6-f16",
    "autoround-asym-mix",
    "autoround-awq-mix",
    "autoround-gptq-mix",
    "autoround-gptqmodel-mix",
    "autoround-mxfp4-bf16",
    "autoround-mxfp4-mix",
    "autoround-mxfp8-bf16",
    "autoround-nvfp4-bf16",
    "autoround-nvfp4e5m3-bf16",
    "autoround-w567-asym",
    "autoround-w567-gptq",
    "awq-gemm-w4-g128",
    "bitnet-b158-bf16",
    "bnb-fp4-bf16",
    "bnb-fp4-dq-bf16storage-f16",
    "bnb-int8-bf16",
    "bnb-nf4-dq-bf16",
    "ct-mxfp8",
    "ct-sparse-bitmask-fp8",
    "ct-sparse24-fp8",
    "ct-sparse24-int8-asym",
    "ct-transform-quip-noblock",
    "ct-transform-quip-w4a16",
    "ct-transform-spinquant-r3",
    "deepseek-v4-fp8-fp4",
    "fp8-block-bf16",
    "fp8-dynamic",
    "gemma-w4-int2-int8-bf16",
    "gpt-oss-mxfp4",
    "gptq-dynamic-mix",
    "gptq-w4-g128",
    "gptq-w4-g128-actorder",
    "hqq-3bit-bf16",
    "hqq-3bit-g64-f16",
    "hqq-4bit-g64-f16",
    "hqq-mixed-bf16",
    "legacy-w3a16-g16",
    "mixtral-w4a16",
    "modelopt-fp8",
    "modelopt-int4-awq",
    "modelopt-nvfp4",
    "modelopt-w4a8-awq",
    "mxfp4a16",
    "nvfp4a16",
    "quark-fp8-per-channel",
    "quark-mixed-exclude",
    "quark-mxfp4",
    "sharded-nvfp4a16",
    "sinq-2d-bf16",
    "sinq-aux-2bit-f16",
    "sinq-aux-bf16",
    "sinq-bits-f16",
    "sinq-mixed-bf16",
    "sinq-nf4-bf16",
    "vptq-llama-bf16",
    "vptq-llama-f16",
    "w3a16-g16",
    "w4a16-asym-g128",
    "w4a16-g128",
    "w8a16-g128",
];

/// ModelOpt's E2M1 table maps code 0b1000 to +0; ours (and the format) say −0.
pub fn plus_zero(dtype: &str, bytes: &[u8]) -> Vec<u8> {
    match dtype {
        "BF16" => bytes
            .chunks(2)
            .flat_map(|c| if c == [0, 0x80] { [0, 0] } else { [c[0], c[1]] })
            .collect(),
        "F32" => bytes
            .chunks(4)
            .flat_map(|c| {
                if c == [0, 0, 0, 0x80] {
                    [0; 4]
                } else {
                    [c[0], c[1], c[2], c[3]]
                }
            })
            .collect(),
        _ => bytes.to_vec(),
    }
}

pub fn bf16_of_f32(bytes: &[u8]) -> Vec<u8> {
    bytes
        .chunks(4)
        .flat_map(|c| {
            half::bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .to_bits()
                .to_le_bytes()
        })
        .collect()
}

/// The digests of `case` in the model's own dtype: `expected-bf16` (under
/// the architecture's hub names where they differ: `expected-bf16-native`),
/// or `expected-f16` for f16 models (AutoAWQ, GPTQ: config.json's
/// `dtype`/`torch_dtype` says `float16`).
pub fn auto_digests(case: &str) -> &'static str {
    let has = |f: &str| fixtures().join(case).join(f).is_file();
    let config: Value = std::fs::read(fixtures().join(case).join("model/config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let f16_model = ["dtype", "torch_dtype"]
        .iter()
        .any(|k| config[*k] == "float16");
    if has("expected-bf16-native.digests.json") {
        "expected-bf16-native.digests.json"
    } else if f16_model && has("expected-f16.digests.json") {
        "expected-f16.digests.json"
    } else if has("expected-bf16.digests.json") {
        "expected-bf16.digests.json"
    } else {
        "expected-f16.digests.json"
    }
}

pub fn f16_of_f32(bytes: &[u8]) -> Vec<u8> {
    bytes
        .chunks(4)
        .flat_map(|c| {
            half::f16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .to_bits()
                .to_le_bytes()
        })
        .collect()
}

fn f16_of_bf16(bytes: &[u8]) -> Vec<u8> {
    bytes
        .chunks(2)
        .flat_map(|c| {
            half::f16::from_f32(half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .to_bits()
                .to_le_bytes()
        })
        .collect()
}

/// Decodes `case` with `dtype` and compares every tensor with `digests`.
/// `widen` rounds our f32 outputs to bf16 first (compressed-tensors' f32
/// references are its bf16 results widened).
pub fn check_case(
    case: &str,
    dtype: DtypeChoice,
    backend: BackendChoice,
    digests: &str,
    widen: bool,
) {
    let dir = fixtures().join(case);
    let out = tempfile::tempdir().unwrap();
    let out = out.path().join("dense");
    dequantize(dir.join("model"), &out, &Options { dtype, backend })
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    let got = read_dir_tensors(&out);
    let want: serde_json::Map<String, Value> =
        serde_json::from_slice(&std::fs::read(dir.join(digests)).unwrap()).unwrap();
    assert_eq!(got.len(), want.len(), "{case}: tensor count");
    // ModelOpt NVFP4 (E2M1 code 0b1000 is +0 there); FP8 keeps its −0.
    let modelopt = case.starts_with("modelopt") && case.contains("nvfp4");
    for (name, w) in &want {
        let (dt, shape, bytes) = got
            .get(name)
            .unwrap_or_else(|| panic!("{case}: missing {name}"));
        let want_shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
        assert_eq!(shape, &want_shape, "{case}: {name} shape");
        // Under a fixed f32, copies are widened exactly; the reference keeps
        // them stored (bf16), and narrowing them back must give its bytes.
        let (dt, bytes) = if dt == "F32" && (widen && w["dtype"] != "F16" || w["dtype"] == "BF16") {
            ("BF16".to_string(), bf16_of_f32(bytes))
        } else if dt == "F32" && w["dtype"] == "F16" {
            ("F16".to_string(), f16_of_f32(bytes))
        } else if dt == "F16" && w["dtype"] == "BF16" {
            // A reference that converts the quantized weights alone keeps
            // copies in bf16; ours are those copies cast to f16.
            let input = read_dir_tensors(&dir.join("model"));
            let (_, _, stored) = &input[name];
            assert_eq!(sha256_hex(stored), w["sha256"], "{case}: {name} is a copy");
            assert_eq!(bytes, &f16_of_bf16(stored), "{case}: {name} cast to f16");
            continue;
        } else {
            (dt.clone(), bytes.clone())
        };
        let bytes = if modelopt {
            plus_zero(&dt, &bytes)
        } else {
            bytes
        };
        assert_eq!(dt, w["dtype"].as_str().unwrap(), "{case}: {name} dtype");
        assert_eq!(
            sha256_hex(&bytes),
            w["sha256"].as_str().unwrap(),
            "{case}: {name} bytes"
        );
    }
}

/// [`check_case`] (not widened) for each dtype choice and its digests file.
pub fn check_digests(case: &str, backend: BackendChoice, runs: &[(DtypeChoice, &str)]) {
    for &(dtype, digests) in runs {
        check_case(case, dtype, backend, digests, false);
    }
}

/// Every fixture checkpoint directory, tests/fixtures/*/model.
pub fn fixture_models() -> Vec<(String, PathBuf)> {
    let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(fixtures())
        .unwrap()
        .filter_map(|e| {
            let case = e.unwrap().path();
            let model = case.join("model");
            model.is_dir().then(|| {
                (
                    case.file_name().unwrap().to_string_lossy().into_owned(),
                    model,
                )
            })
        })
        .collect();
    v.sort();
    assert!(v.len() >= 10, "fixtures: {v:?}");
    v
}

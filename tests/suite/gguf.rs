//! GGUF files: the container as gguf-py 0.19's writer makes it (the
//! fixtures in `tests/gguf/`), split files joined, every block type decoded
//! as gguf-py computes it on both backends, `inspect`/`validate` of them,
//! and malformed files refused with a GGUF-00x rule in one line, never a
//! panic.

use std::path::{Path, PathBuf};
use std::process::Command;

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::common::{bin, gpu_test, read_dir_tensors, sha256_hex, Rng};
use wgpu_dequant::gguf::{GgmlType, Model};
use wgpu_dequant::numerics::OutDtype;
use wgpu_dequant::{BackendChoice, DtypeChoice, Rule};

const CASES: &[&str] = &["gguf-q8_0-qwen2", "gguf-q4_k-llama", "gguf-iq2_xxs-llama"];

fn case(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/gguf")
        .join(name)
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Every tensor of the fixtures: the names and row-major shapes of
/// gguf-py's own dequantized output, the types the writer was given, sizes
/// of whole blocks, and the F32 tensors' bytes (stored as they decode).
#[test]
fn fixtures_read_as_gguf_py_wrote_them() {
    for name in CASES {
        let dir = case(name);
        let model = Model::open(dir.join("model/model.gguf")).unwrap();
        let want = json(&dir.join("expected-gguf-f32.digests.json"));
        let want = want.as_object().unwrap();
        let checks = json(&dir.join("checks.json"));
        let mut names: Vec<&str> = model.tensors.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            want.keys().map(String::as_str).collect::<Vec<_>>(),
            "{name}"
        );
        for t in &model.tensors {
            let w = &want[&t.name];
            let shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
            assert_eq!(t.shape, shape, "{name} {}", t.name);
            let ty = match (&checks["types"], t.name.as_str()) {
                (Value::Object(types), n) => types[n].as_str().unwrap().to_string(),
                (_, "token_embd.weight") => checks["embedding"].as_str().unwrap().to_string(),
                (_, _) if t.shape.len() == 1 => checks["norms"].as_str().unwrap().to_string(),
                _ => checks["linear_type"].as_str().unwrap().to_string(),
            };
            assert_eq!(t.ty.name(), ty, "{name} {}", t.name);
            let row = *t.shape.last().unwrap() as u64;
            let rows = t.shape.iter().product::<usize>() as u64 / row;
            assert_eq!(
                t.size,
                t.ty.row_bytes(row).unwrap() * rows,
                "{name} {}",
                t.name
            );
            assert_eq!(model.bytes(t).len() as u64, t.size);
            if t.ty == GgmlType::F32 {
                assert_eq!(sha256_hex(model.bytes(t)), w["sha256"], "{name} {}", t.name);
            }
        }
        assert!(model
            .architecture()
            .is_some_and(|a| *name.split('-').next_back().unwrap() == *a));
    }
}

/// A GGUF file written by hand: metadata (key, type, value bytes) and
/// tensors (name, row-major shape, type id, offset), data after them.
pub(crate) struct Writer {
    pub(crate) kvs: Vec<(String, u32, Vec<u8>)>,
    pub(crate) tensors: Vec<(String, Vec<u64>, u32, u64)>,
    pub(crate) data: Vec<u8>,
    pub(crate) version: u32,
}

pub(crate) fn string(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend(s.as_bytes());
    v
}

impl Writer {
    /// Two F32 tensors, aligned, and two metadata keys.
    pub(crate) fn valid() -> Writer {
        let mut w = Writer {
            kvs: vec![],
            tensors: vec![],
            data: vec![],
            version: 3,
        };
        w.kv("general.architecture", 8, string("llama"));
        w.kv("general.alignment", 4, 32u32.to_le_bytes().to_vec());
        w.tensor("a.weight", &[2, 8], 0, 0);
        w.tensor("b.weight", &[4], 0, 64);
        w.data = (0..96u8).collect();
        w
    }

    pub(crate) fn kv(&mut self, key: &str, ty: u32, value: Vec<u8>) {
        self.kvs.push((key.into(), ty, value));
    }

    pub(crate) fn tensor(&mut self, name: &str, shape: &[u64], ty: u32, offset: u64) {
        self.tensors.push((name.into(), shape.to_vec(), ty, offset));
    }

    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kvs {
            b.extend(string(k));
            b.extend(ty.to_le_bytes());
            b.extend(v);
        }
        for (name, shape, ty, offset) in &self.tensors {
            b.extend(string(name));
            b.extend((shape.len() as u32).to_le_bytes());
            for d in shape.iter().rev() {
                b.extend(d.to_le_bytes());
            }
            b.extend(ty.to_le_bytes());
            b.extend(offset.to_le_bytes());
        }
        b.resize(b.len().next_multiple_of(32), 0);
        b.extend(&self.data);
        b
    }

    pub(crate) fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.bytes()).unwrap();
        path.to_path_buf()
    }
}

/// Malformed files, each refused with GGUF-001 (the header) or GGUF-002 (a
/// tensor, named)
/// is at fault) in one line; gguf-py's reader takes several of them.
#[test]
fn malformed_files_are_refused_with_gguf_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let ok = Writer::valid().write(&tmp.path().join("ok.gguf"));
    let model = Model::open(&ok).unwrap();
    assert_eq!(model.tensors[0].shape, [2, 8]);
    assert_eq!(
        model.bytes(&model.tensors[1]),
        &(64..80u8).collect::<Vec<_>>()[..]
    );
    type Change = Box<dyn Fn(&mut Writer, &mut Vec<u8>)>;
    let cases: Vec<(&str, Change, &str)> = vec![
        ("bad magic", Box::new(|_, b| b[0] = b'X'), "magic"),
        (
            "big-endian",
            Box::new(|_, b| b[4..8].copy_from_slice(&3u32.to_be_bytes())),
            "big-endian",
        ),
        ("version 1", Box::new(|w, _| w.version = 1), "version 1"),
        ("version 9", Box::new(|w, _| w.version = 9), "version 9"),
        (
            "truncated header",
            Box::new(|_, b| b.truncate(100)),
            "needs",
        ),
        (
            "a count past the file",
            Box::new(|_, b| b[8..16].copy_from_slice(&u64::MAX.to_le_bytes())),
            "needs",
        ),
        (
            "5 dimensions",
            Box::new(|w, _| w.tensors[0].1 = vec![1, 1, 1, 2, 8]),
            "5 dimensions",
        ),
        (
            "no dimensions",
            Box::new(|w, _| w.tensors[0].1 = vec![]),
            "0 dimensions",
        ),
        (
            "a name with a line break, and 5 dimensions",
            Box::new(|w, _| {
                w.tensors[0].0 = "a\nb".into();
                w.tensors[0].1 = vec![1, 1, 1, 2, 8];
            }),
            "a\\nb: [GGUF-002]",
        ),
        (
            "dimensions whose product overflows",
            Box::new(|w, _| w.tensors[0].1 = vec![1 << 62, 1 << 62, 32]),
            "too many",
        ),
        (
            "a zero dimension",
            Box::new(|w, _| w.tensors[0].1 = vec![0, 8]),
            "zero",
        ),
        (
            "an unknown type",
            Box::new(|w, _| w.tensors[0].2 = 4),
            "type 4",
        ),
        (
            "not whole blocks",
            Box::new(|w, _| w.tensors[0].2 = 8),
            "whole blocks",
        ),
        (
            "a misaligned offset",
            Box::new(|w, _| w.tensors[1].3 = 48),
            "alignment",
        ),
        (
            "overlapping tensors",
            Box::new(|w, _| w.tensors[1].3 = 32),
            "overlaps",
        ),
        (
            "data past the end",
            Box::new(|w, _| w.tensors[1].3 = 96),
            "past the end",
        ),
        (
            "a tensor twice",
            Box::new(|w, _| w.tensors[1].0 = "a.weight".into()),
            "twice",
        ),
        (
            "a key twice",
            Box::new(|w, _| w.kvs[1].0 = "general.architecture".into()),
            "twice",
        ),
        (
            "an alignment of 3",
            Box::new(|w, _| w.kvs[1].2 = 3u32.to_le_bytes().to_vec()),
            "alignment",
        ),
        (
            "a bool of 2",
            Box::new(|w, _| w.kv("x", 7, vec![2])),
            "bool",
        ),
        (
            "an unknown value type",
            Box::new(|w, _| w.kv("x", 13, vec![])),
            "value type 13",
        ),
        (
            "arrays nested deep",
            Box::new(|w, _| {
                let mut v = 0u32.to_le_bytes().to_vec();
                v.extend(1u64.to_le_bytes());
                v.push(7);
                for _ in 0..5 {
                    let mut outer = 9u32.to_le_bytes().to_vec();
                    outer.extend(1u64.to_le_bytes());
                    outer.extend(v);
                    v = outer;
                }
                w.kv("x", 9, v);
            }),
            "nested",
        ),
    ];
    for (what, change, says) in cases {
        // Each change applied to the writer, then to the bytes it writes.
        let mut w = Writer::valid();
        change(&mut w, &mut vec![0u8; 4096]);
        let mut bytes = w.bytes();
        change(&mut Writer::valid(), &mut bytes);
        let path = tmp.path().join(format!("{}.gguf", what.replace(' ', "-")));
        std::fs::write(&path, &bytes).unwrap();
        match Model::open(&path) {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => {
                assert!(
                    matches!(e.rule, Rule::Gguf | Rule::GgufTensor),
                    "{what}: {e}"
                );
                // A tensor's fault names it; the header's names none.
                assert_eq!(
                    e.rule == Rule::GgufTensor,
                    e.tensor.is_some(),
                    "{what}: {e}"
                );
                let line = e.to_string();
                assert!(
                    line.contains(says) && !line.contains('\n'),
                    "{what}: {line}"
                );
                assert!(
                    line.contains(e.rule.id()) && line.contains(&*path.to_string_lossy()),
                    "{line}"
                );
            }
        }
    }
}

/// The fixtures' headers with random bytes overwritten: each read or
/// refused in one line, never a panic.
#[test]
fn mutated_headers_never_panic() {
    let mut rng = Rng::new(0x6767);
    let tmp = tempfile::tempdir().unwrap();
    let (mut read, mut refused) = (0, 0);
    for name in CASES {
        let valid = std::fs::read(case(name).join("model/model.gguf")).unwrap();
        // The header (metadata and tensor infos) is what the reader parses.
        let header = Model::open(case(name).join("model/model.gguf"))
            .unwrap()
            .files[0]
            .data_start as usize;
        for i in 0..150 {
            let mut b = valid.clone();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(header as u64) as usize;
                b[at] = rng.next() as u8;
            }
            if i % 10 == 0 {
                b.truncate(rng.below(valid.len() as u64) as usize);
            }
            let path = tmp.path().join("m.gguf");
            std::fs::write(&path, &b).unwrap();
            let out = crate::common::caught(|| Model::open(&path).map(|m| m.tensors.len()));
            match out {
                Err(p) => panic!("{name}: panicked: {p}"),
                Ok(Err(e)) => {
                    assert!(!e.to_string().contains('\n'), "{e}");
                    refused += 1;
                }
                Ok(Ok(_)) => read += 1,
            }
        }
    }
    assert!(read > 10 && refused > 100, "read {read}, refused {refused}");
}

/// A model split in two (`split.*` keys, as gguf-py's writer names and
/// numbers the parts) is read joined from its first part; a part that
/// lies about its number, a missing part and a wrong tensor total are
/// refused.
#[test]
fn split_files_are_joined() {
    let tmp = tempfile::tempdir().unwrap();
    let split = |w: &mut Writer, no: u16, tensors: i32| {
        w.kv("split.no", 2, no.to_le_bytes().to_vec());
        w.kv("split.count", 2, 2u16.to_le_bytes().to_vec());
        w.kv("split.tensors.count", 5, tensors.to_le_bytes().to_vec());
    };
    let parts = |first_no: u16, second_no: u16, total: i32| {
        let mut a = Writer::valid();
        split(&mut a, first_no, total);
        a.tensors.truncate(1);
        let mut b = Writer::valid();
        split(&mut b, second_no, total);
        b.tensors.remove(0);
        b.tensors[0].3 = 0;
        let first = a.write(&tmp.path().join("m-00001-of-00002.gguf"));
        b.write(&tmp.path().join("m-00002-of-00002.gguf"));
        first
    };
    let first = parts(0, 1, 2);
    let model = Model::open(&first).unwrap();
    assert_eq!(model.files.len(), 2);
    let names: Vec<&str> = model.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a.weight", "b.weight"]);
    assert_eq!(
        model.bytes(&model.tensors[1]),
        &(0..16u8).collect::<Vec<_>>()[..]
    );
    assert_eq!(wgpu_dequant::gguf::find(tmp.path()), Some(first.clone()));
    // Any part opens the whole model, from its first.
    let second = Model::open(tmp.path().join("m-00002-of-00002.gguf")).unwrap();
    assert_eq!(second.files.len(), 2);
    assert_eq!(second.tensors.len(), 2);
    let ckpt = wgpu_dequant::Checkpoint::open(tmp.path().join("m-00002-of-00002.gguf")).unwrap();
    assert_eq!(ckpt.shards.len(), 2);
    assert_eq!(ckpt.shards[0].path, first);
    for (what, (a, b, total), says) in [
        ("a part's number", (0, 0, 2), "split.no"),
        ("the tensor total", (0, 1, 3), "split.tensors.count"),
    ] {
        let first = parts(a, b, total);
        let e = Model::open(&first).unwrap_err();
        assert_eq!(e.rule, Rule::GgufSplit, "{what}: {e}");
        assert!(e.to_string().contains(says), "{what}: {e}");
    }
    let first = parts(0, 1, 2);
    std::fs::remove_file(tmp.path().join("m-00002-of-00002.gguf")).unwrap();
    let e = Model::open(&first).unwrap_err();
    assert!(e.to_string().contains("m-00002-of-00002.gguf"), "{e}");
    // A later part without its first names the first.
    parts(0, 1, 2);
    std::fs::remove_file(&first).unwrap();
    let e = Model::open(tmp.path().join("m-00002-of-00002.gguf")).unwrap_err();
    assert!(e.to_string().contains("m-00001-of-00002.gguf"), "{e}");
    let e = Model::open(
        tmp.path()
            .join("m-00001-of-00002.gguf")
            .with_file_name("x.gguf"),
    )
    .unwrap_err();
    assert_eq!(e.rule, Rule::Io);
}

/// The dense tensors `dir` decodes to, as `dtype`, on `backend`, under
/// GGUF's names or transformers': name → (dtype, shape, SHA-256); and the
/// folder written.
fn decoded(
    dir: &Path,
    dtype: OutDtype,
    backend: BackendChoice,
    keep_names: bool,
) -> (BTreeMap<String, Value>, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    wgpu_dequant::Dequantize::new()
        .dtype(DtypeChoice::Fixed(dtype))
        .backend(backend)
        .keep_names(keep_names)
        .run(dir, &out)
        .unwrap();
    let tensors = read_dir_tensors(&out)
        .into_iter()
        .map(|(n, (dt, shape, bytes))| {
            (
                n,
                json!({"dtype": dt, "shape": shape, "sha256": sha256_hex(&bytes)}),
            )
        })
        .collect();
    (tensors, tmp)
}

/// `got` holds exactly `want`'s tensors, each with its digest.
fn same_tensors(got: &BTreeMap<String, Value>, want: &Value, what: &str) {
    let want = want.as_object().unwrap();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}"
    );
    for (t, w) in want {
        assert_eq!(&got[t], w, "{what} {t}");
    }
}

/// Every block type gguf-py decodes (the fixtures' Q8_0, Q4_K and
/// IQ2_XXS, and `gguf-types`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
/// Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4, NVFP4, IQ2_XXS,
/// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M with scales of every
/// kind of magnitude, made by `tests/gguf/make_types.py`, whole
/// and split in three by gguf-py's writer, and `gguf-q1q2`: Bonsai's Q1_0
/// and Q2_0, made by `tests/gguf/make_q1q2.py` with llama.cpp's gguf-py) gives
/// gguf-py's `dequantize` in f32 and that rounded once to bf16 and f16,
/// under GGUF's names, byte for byte, on the CPU and the GPU.
#[test]
fn block_types_give_gguf_pys_values() {
    let check = |backend: BackendChoice| {
        // The split model holds gguf-types' tensors, four to a part.
        for (name, expected) in [
            ("gguf-q8_0-qwen2", "gguf-q8_0-qwen2"),
            ("gguf-q4_k-llama", "gguf-q4_k-llama"),
            ("gguf-iq2_xxs-llama", "gguf-iq2_xxs-llama"),
            ("gguf-types", "gguf-types"),
            ("gguf-types-split", "gguf-types"),
            ("gguf-q1q2", "gguf-q1q2"),
        ] {
            for (dtype, file) in [
                (OutDtype::F32, "expected-gguf-f32.digests.json"),
                (OutDtype::Bf16, "expected-gguf-bf16.digests.json"),
                (OutDtype::F16, "expected-gguf-f16.digests.json"),
            ] {
                let want = json(&case(expected).join(file));
                let (got, _) = decoded(&case(name).join("model"), dtype, backend, true);
                same_tensors(&got, &want, &format!("{name} {dtype} on {backend:?}"));
            }
        }
    };
    check(BackendChoice::Cpu);
    gpu_test(|_| check(BackendChoice::Gpu));
}

/// The public fixtures and one case per architecture (`tests/gguf/hf-*`,
/// made by `tests/gguf/make_hf.py`: llama with F16 and quantized Q and K,
/// llama with a SentencePiece vocabulary and tied embeddings, qwen2 with
/// biases, qwen3, qwen3moe and qwen2moe with stacked (and shared)
/// experts, phi3's fused projections, gemma2, gemma3 and nemotron with
/// their norms stored as w+1, starcoder2's and stablelm's biases, falcon's
/// own names, and bonsai: a qwen3 of Bonsai's Q1_0 and Q2_0 weights) give,
/// by default, what transformers 5.25 saves of them:
/// every tensor under its name and layout, byte for byte in bf16 and f16
/// (and f32, gguf-py's own values, where the fixtures have them) on the
/// CPU and the GPU, and the same `config.json`, `generation_config.json`
/// and tokenizer files.
#[test]
fn gguf_models_take_transformers_form() {
    let cases = [
        ("gguf-q4_k-llama", "expected-bf16-meta"),
        ("gguf-q8_0-qwen2", "expected-bf16-meta"),
        ("gguf-iq2_xxs-llama", "expected-bf16-meta"),
        ("hf-llama", "expected-meta"),
        ("hf-llama-spm", "expected-meta"),
        ("hf-qwen3", "expected-meta"),
        ("hf-qwen3moe", "expected-meta"),
        ("hf-qwen2moe", "expected-meta"),
        ("hf-phi3", "expected-meta"),
        ("hf-gemma2", "expected-meta"),
        ("hf-gemma3", "expected-meta"),
        ("hf-starcoder2", "expected-meta"),
        ("hf-stablelm", "expected-meta"),
        ("hf-falcon", "expected-meta"),
        ("hf-nemotron", "expected-meta"),
        ("hf-bonsai", "expected-meta"),
    ];
    let check = |backend: BackendChoice| {
        for (name, meta) in cases {
            for (dtype, torch) in [
                (OutDtype::Bf16, "bfloat16"),
                (OutDtype::F16, "float16"),
                (OutDtype::F32, "float32"),
            ] {
                let file = case(name).join(format!("expected-{dtype}.digests.json"));
                if !file.exists() {
                    continue;
                }
                let what = format!("{name} {dtype} on {backend:?}");
                let (got, tmp) = decoded(&case(name).join("model"), dtype, backend, false);
                same_tensors(&got, &json(&file), &what);
                let out = tmp.path().join("dense");
                // transformers' own files: the configs byte for byte (the
                // f16 run's names its dtype), the tokenizer's as JSON values
                // (serde and Python space them differently), our model card
                // (`upload::`), nothing else.
                let meta = case(name).join(meta);
                let mut want: Vec<String> = files_in(&meta);
                want.extend(["model.safetensors", ".cache", "README.md"].map(String::from));
                want.sort();
                assert_eq!(files_in(&out), want, "{what}");
                for file in files_in(&meta) {
                    let (got, mut expected) = (read(&out.join(&file)), read(&meta.join(&file)));
                    if file == "config.json" {
                        let text = String::from_utf8(expected).unwrap();
                        expected = text
                            .replace("\"bfloat16\"", &format!("\"{torch}\""))
                            .into_bytes();
                    }
                    if file.starts_with("tokenizer") {
                        let as_json = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap();
                        assert_eq!(as_json(&got), as_json(&expected), "{what} {file}");
                    } else {
                        assert_eq!(got, expected, "{what} {file}");
                    }
                }
            }
        }
    };
    check(BackendChoice::Cpu);
    gpu_test(|_| check(BackendChoice::Gpu));
}

/// The names of the files in `dir`, sorted.
fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// An architecture with no Hugging Face layout here is refused with
/// CFG-002 naming it (nothing written); `--keep-names` writes its tensors
/// under their GGUF names.
#[test]
fn other_architectures_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = Writer::valid();
    w.kvs[0] = ("general.architecture".into(), 8, string("rwkv7"));
    let dir = tmp.path().join("in");
    std::fs::create_dir(&dir).unwrap();
    w.write(&dir.join("model.gguf"));
    let run = |keep| {
        wgpu_dequant::Dequantize::new()
            .backend(BackendChoice::Cpu)
            .keep_names(keep)
            .run(&dir, tmp.path().join(format!("o-{keep}")))
    };
    let e = run(false).unwrap_err();
    assert_eq!(e.rule, Rule::Unsupported, "{e}");
    assert!(
        e.to_string().contains("\"rwkv7\"") && e.to_string().contains("--keep-names"),
        "{e}"
    );
    assert!(!tmp.path().join("o-false").exists());
    run(true).unwrap();
    let names: Vec<String> = read_dir_tensors(&tmp.path().join("o-true"))
        .into_keys()
        .collect();
    assert_eq!(names, ["a.weight", "b.weight"]);
    assert!(!tmp.path().join("o-true/config.json").exists());
}

/// Q8_1 (which gguf-py lists but cannot dequantize) is refused with
/// CFG-002 naming the tensor and the type; `validate` finds it; nothing
/// is written.
#[test]
fn q8_1_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = Writer::valid();
    // One row of 32: a block of 40 bytes, after the F32 tensors.
    w.tensor("q.weight", &[1, 32], 9, 96);
    w.data.resize(96 + 40, 0);
    let dir = tmp.path().join("in");
    std::fs::create_dir(&dir).unwrap();
    w.write(&dir.join("model.gguf"));
    let e = wgpu_dequant::Dequantize::new()
        .backend(BackendChoice::Cpu)
        .run(&dir, tmp.path().join("o"))
        .unwrap_err();
    assert_eq!(e.rule, Rule::Unsupported, "{e}");
    assert!(
        e.to_string().contains("Q8_1") && e.tensor.as_deref() == Some("q.weight"),
        "{e}"
    );
    assert_eq!(wgpu_dequant::validate(&dir).errors.len(), 1);
    assert!(!tmp.path().join("o").exists());
}

/// The command line: `inspect` (text and JSON) and `validate` of a GGUF
/// file or its folder, `dequantize` of one; a malformed file's `validate`
/// finds GGUF-002.
#[test]
fn the_cli_reads_gguf() {
    let dir = case("gguf-q4_k-llama").join("model");
    let o = Command::new(bin())
        .args(["inspect", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    for line in [
        "gguf v3 llama (5 F32, 1 F16, 15 Q4_K)",
        "Q4_K: 15 tensors, 709632 bytes",
        "F16: 1 tensor, ",
        "tokenizer.ggml.tokens = [320 items",
        "names       21 tensors get the names transformers loads (e.g. blk.0.attn_k.weight -> model.layers.0.self_attn.k_proj.weight)",
        "model.layers.1.mlp.down_proj.weight",
    ] {
        assert!(text.contains(line), "{line} not in {text}");
    }
    let o = Command::new(bin())
        .args([
            "inspect",
            "--json",
            dir.join("model.gguf").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["tensors"].as_array().unwrap().len(), 21);
    let o = Command::new(bin())
        .args(["validate", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("o");
    let o = Command::new(bin())
        .args([
            "dequantize",
            dir.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "-q",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for file in ["model.safetensors", "config.json", "generation_config.json"] {
        assert!(out.join(file).is_file(), "{file}");
    }
    let mut bad = std::fs::read(dir.join("model.gguf")).unwrap();
    bad.truncate(bad.len() - 1);
    let path = tmp.path().join("bad.gguf");
    std::fs::write(&path, bad).unwrap();
    let o = Command::new(bin())
        .args(["validate", path.to_str().unwrap()])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(3), "{out}");
    assert!(
        out.contains("GGUF-002") && out.contains("past the end"),
        "{out}"
    );
}

/// A folder of two GGUF models (and a projector, which is none) is
/// refused with one line naming both, unless `--gguf-file` names one; a
/// folder of one model and a projector opens that model.
#[test]
fn a_folder_of_several_models_needs_gguf_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("two");
    std::fs::create_dir_all(&dir).unwrap();
    let model = case("gguf-q4_k-llama").join("model/model.gguf");
    std::fs::copy(&model, dir.join("Tiny-Q4_K_M.gguf")).unwrap();
    std::fs::copy(
        case("gguf-q8_0-qwen2").join("model/model.gguf"),
        dir.join("Tiny-Q8_0.gguf"),
    )
    .unwrap();
    std::fs::copy(&model, dir.join("mmproj-Tiny-f16.gguf")).unwrap();
    let d = dir.to_str().unwrap();
    let o = crate::common::cli::run(&["inspect", d]);
    let line = crate::common::cli::error_line(
        &o,
        "inspect",
        "ARG-001",
        &["Tiny-Q4_K_M.gguf", "Tiny-Q8_0.gguf", "--gguf-file"],
    );
    assert!(!line.contains("mmproj"), "{line}");
    // validate prints its findings on stdout.
    let o = crate::common::cli::run(&["validate", d]);
    crate::common::cli::failed(&o, "validate");
    let out = crate::common::cli::stdout(&o);
    assert!(
        out.contains("[ARG-001]") && out.contains("Tiny-Q8_0.gguf"),
        "{out}"
    );
    let refused = tmp.path().join("refused");
    let o = crate::common::cli::run(&["dequantize", d, "-o", refused.to_str().unwrap()]);
    crate::common::cli::error_line(&o, "dequantize", "ARG-001", &["Tiny-Q8_0.gguf"]);
    assert!(!refused.exists());

    let dense = |input: &str, out: &Path, extra: &[&str]| {
        let mut args = vec!["dequantize", input, "-o", out.to_str().unwrap()];
        args.extend(["--backend", "cpu", "--quiet"]);
        args.extend(extra);
        let o = crate::common::cli::run(&args);
        crate::common::cli::ok(&o, "dequantize");
        crate::common::snapshot(out)
    };
    let picked = dense(
        d,
        &tmp.path().join("picked"),
        &["--gguf-file", "Tiny-Q4_K_M.gguf"],
    );
    let local = dense(model.to_str().unwrap(), &tmp.path().join("local"), &[]);
    assert_eq!(picked, local);
    let o = crate::common::cli::run(&["inspect", d, "--gguf-file", "nope.gguf"]);
    crate::common::cli::error_line(&o, "--gguf-file nope.gguf", "ARG-001", &["nope.gguf"]);
    let o = crate::common::cli::run(&["inspect", model.to_str().unwrap(), "--gguf-file", "x.gguf"]);
    crate::common::cli::error_line(&o, "--gguf-file on a file", "ARG-001", &["--gguf-file"]);

    std::fs::remove_file(dir.join("Tiny-Q8_0.gguf")).unwrap();
    let o = crate::common::cli::run(&["inspect", d]);
    crate::common::cli::ok(&o, "one model and a projector");
}

/// A tensor transformers does not load (llama 3's `rope_freqs`, a name
/// no architecture row knows) is not written, as transformers drops it,
/// and a warning names it (here: its factors are no llama3 scaling, so the
/// config cannot state them either); `--keep-names` writes it.
#[test]
fn tensors_transformers_drops_are_named() {
    let dir = case("hf-llama").join("model");
    let v = wgpu_dequant::validate(&dir);
    assert!(v.errors.is_empty(), "{:?}", v.errors);
    assert!(
        v.warnings.iter().any(|w| w.subject == "rope_freqs.weight"),
        "{:?}",
        v.warnings
    );
    let (hf, _) = decoded(&dir, OutDtype::Bf16, BackendChoice::Cpu, false);
    let (kept, _) = decoded(&dir, OutDtype::Bf16, BackendChoice::Cpu, true);
    assert!(!hf.contains_key("rope_freqs.weight") && kept.contains_key("rope_freqs.weight"));
}

/// Bonsai's types (Q1_0, ggml type 41; Q2_0, type 42) malformed, or a
/// fork's layout under those numbers, each refused by GGUF-002 naming the
/// tensor, with nothing written; the well-formed file decodes.
#[test]
fn malformed_q1_0_and_q2_0_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // Tensors (name, row-major shape, type, offset) and data bytes.
    type Layout = (Vec<(&'static str, Vec<u64>, u32, u64)>, usize);
    // Q1_0 [4, 1024] is 4 · 8 · 18 = 576 bytes; Q2_0 [4, 2048] is
    // 4 · 32 · 18 = 2304; PrismML's 128-element Q2_0 (34 bytes a block)
    // would be 4 · 16 · 34 = 2176.
    let cases: Vec<(&str, Layout, &str)> = vec![
        (
            "well formed",
            (
                vec![
                    ("q1.weight", vec![4, 1024], 41, 0),
                    ("q2.weight", vec![4, 2048], 42, 576),
                ],
                576 + 2304,
            ),
            "",
        ),
        (
            "truncated Q1_0 data",
            (vec![("q1.weight", vec![4, 1024], 41, 0)], 500),
            "past the end",
        ),
        (
            "a Q1_0 row of 96",
            (vec![("q1.weight", vec![4, 96], 41, 0)], 64),
            "not whole blocks of 128",
        ),
        (
            "a Q2_0 row of 100",
            (vec![("q2.weight", vec![4, 100], 42, 0)], 96),
            "not whole blocks of 64",
        ),
        (
            "a fork's 128-element Q2_0 under 42, last",
            (vec![("q2.weight", vec![4, 2048], 42, 0)], 2176),
            "past the end",
        ),
        (
            "a fork's 128-element Q2_0 under 42, then a tensor",
            (
                vec![
                    ("q2.weight", vec![4, 2048], 42, 0),
                    ("f.weight", vec![64], 0, 2176),
                ],
                2176 + 256,
            ),
            "overlaps",
        ),
        (
            "2-bit bytes under 41, then a tensor",
            (
                vec![
                    ("q1.weight", vec![4, 1024], 41, 0),
                    ("f.weight", vec![8], 0, 1152),
                ],
                1152 + 32,
            ),
            "576 bytes follow",
        ),
        (
            "2-bit bytes under 41, last",
            (vec![("q1.weight", vec![4, 1024], 41, 0)], 1152),
            "576 bytes follow",
        ),
        (
            "PrismML's private 128-element Q2_0 id",
            (vec![("q2.weight", vec![4, 2048], 142, 0)], 2176),
            "type 142 is no ggml type",
        ),
    ];
    for (what, (tensors, len), says) in cases {
        let mut w = Writer {
            kvs: vec![],
            tensors: vec![],
            data: vec![],
            version: 3,
        };
        w.kv("general.architecture", 8, string("llama"));
        for (name, shape, ty, offset) in &tensors {
            w.tensor(name, shape, *ty, *offset);
        }
        let mut rng = Rng::new(0xB0_5A1);
        w.data = (0..len).map(|_| rng.below(256) as u8).collect();
        // Every f16 d a small normal number where the blocks lie.
        for (_, shape, ty, offset) in &tensors {
            let (block, bytes) = match ty {
                41 => (128, 18),
                42 => (64, 18),
                _ => continue,
            };
            let blocks = (shape.iter().product::<u64>() / block) as usize;
            for b in 0..blocks {
                let at = *offset as usize + b * bytes;
                if at + 2 <= w.data.len() {
                    w.data[at..at + 2].copy_from_slice(&0x2E66u16.to_le_bytes());
                }
            }
        }
        let dir = tmp.path().join(what.replace([' ', '\'', ','], "-"));
        std::fs::create_dir(&dir).unwrap();
        w.write(&dir.join("model.gguf"));
        let out = dir.join("out");
        let run = wgpu_dequant::Dequantize::new()
            .backend(BackendChoice::Cpu)
            .keep_names(true)
            .run(&dir, &out);
        if says.is_empty() {
            run.unwrap();
            assert!(out.join("model.safetensors").exists(), "{what}");
            continue;
        }
        let e = run.unwrap_err();
        let line = e.to_string();
        assert_eq!(e.rule, Rule::GgufTensor, "{what}: {line}");
        assert!(
            e.tensor.is_some() && line.contains(says) && !line.contains('\n'),
            "{what}: {line}"
        );
        assert!(!out.exists(), "{what}: wrote {}", out.display());
    }
}

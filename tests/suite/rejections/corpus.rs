//! Hostile input and faults: every way a checkpoint can be malformed is
//! refused cleanly (the exact rule, one line, the right exit status), and
//! nothing is lost (no output left behind, inputs byte-identical, a failed
//! `--force` run puts everything back).
//!
//! The corpus is generated here from copies of the reference checkpoints in
//! tests/fixtures: each case breaks one thing in a copy and is run through
//! the library (`Checkpoint::open`, `Plan::build`, `Report`, `dequantize`)
//! and the binary (`validate`, `inspect`, `dequantize`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::cli::{run, stderr, stdout};
use crate::common::fixture_models;
use crate::common::{
    bin, caught, copy_dir, dequantize_err, fixtures, gpu_test, safetensors_bytes, snapshot, Tensor,
    SHARD1, SHARD2,
};
use serde_json::{json, Map, Value};
use wgpu_dequant::backend::gpu::Gpu;
use wgpu_dequant::backend::{Backend, Cpu, Fallback};
use wgpu_dequant::report::Report;
use wgpu_dequant::{writer, BackendChoice, Checkpoint, DtypeChoice, Error, Names, Plan, Rule};

/// The module every fixture quantizes (and every module-level case breaks).
const DOWN: &str = "model.layers.0.mlp.down_proj";
const NORM: &str = "model.norm.weight";
const INDEX: &str = "model.safetensors.index.json";
const MODEL: &str = "model.safetensors";

fn down(param: &str) -> String {
    format!("{DOWN}.{param}")
}

// ---------------------------------------------------------------------------
// Editing safetensors files
// ---------------------------------------------------------------------------

/// A safetensors file split into its header (parsed, key order kept) and data.
fn split(bytes: &[u8]) -> (Map<String, Value>, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let Value::Object(header) = header else {
        panic!("header is not an object")
    };
    (header, bytes[8 + n..].to_vec())
}

/// A safetensors file with header text `header` (padded to 8) and `data`.
fn raw(header: &str, data: &[u8]) -> Vec<u8> {
    crate::common::raw_safetensors_text(header.as_bytes(), data)
}

fn edit_bytes(file: &Path, edit: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let bytes = std::fs::read(file).unwrap();
    std::fs::write(file, edit(bytes)).unwrap();
}

/// Rewrites `file` with its header changed by `edit` (data changed too, if
/// it wants); offsets are left as `edit` leaves them.
fn edit_header(file: &Path, edit: impl FnOnce(&mut Map<String, Value>, &mut Vec<u8>)) {
    edit_bytes(file, |b| {
        let (mut h, mut data) = split(&b);
        edit(&mut h, &mut data);
        raw(&Value::Object(h).to_string(), &data)
    });
}

/// Sets the header entry `name`'s `key` (`dtype`, `shape`, `data_offsets`).
fn set_entry(file: &Path, name: &str, key: &str, value: Value) {
    edit_header(file, |h, _| {
        let e = h
            .get_mut(name)
            .unwrap_or_else(|| panic!("no {name} in {}", file.display()));
        e[key] = value;
    });
}

/// Header entries that are tensors, in data order: (name, start, end).
fn entries_by_offset(h: &Map<String, Value>) -> Vec<(String, u64, u64)> {
    let mut v: Vec<(String, u64, u64)> = h
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, e)| {
            let o = &e["data_offsets"];
            (k.clone(), o[0].as_u64().unwrap(), o[1].as_u64().unwrap())
        })
        .collect();
    v.sort_by_key(|e| e.1);
    v
}

/// The safetensors dtype names, so tensors read back can be written again.
fn static_dtype(s: &str) -> &'static str {
    const ALL: &[&str] = &[
        "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "I16",
        "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64",
    ];
    ALL.iter()
        .copied()
        .find(|d| *d == s)
        .unwrap_or_else(|| panic!("dtype {s}"))
}

/// Rewrites `file` with its tensor list (in data order) changed by `edit`;
/// offsets are recomputed, `__metadata__` kept.
fn edit_tensors(file: &Path, edit: impl FnOnce(&mut Vec<Tensor>)) {
    let bytes = std::fs::read(file).unwrap();
    let (h, data) = split(&bytes);
    let meta: Option<BTreeMap<String, String>> = h
        .get("__metadata__")
        .map(|m| serde_json::from_value(m.clone()).unwrap());
    let mut tensors: Vec<Tensor> = entries_by_offset(&h)
        .into_iter()
        .map(|(name, a, b)| {
            let e = &h[&name];
            let shape: Vec<usize> = serde_json::from_value(e["shape"].clone()).unwrap();
            let dtype = static_dtype(e["dtype"].as_str().unwrap());
            let data = data[a as usize..b as usize].to_vec();
            Tensor::new(name, dtype, &shape, data)
        })
        .collect();
    edit(&mut tensors);
    std::fs::write(file, safetensors_bytes(&tensors, meta.as_ref())).unwrap();
}

fn tensor_mut<'t>(tensors: &'t mut [Tensor], name: &str) -> &'t mut Tensor {
    tensors
        .iter_mut()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor {name}"))
}

/// Replaces tensor `name` by one of `dtype`, `shape` and `len` bytes
/// (the old bytes, cut or repeated).
fn reshape_tensor(file: &Path, name: &str, dtype: &'static str, shape: &[usize], len: usize) {
    edit_tensors(file, |ts| {
        let t = tensor_mut(ts, name);
        let old = std::mem::take(&mut t.data);
        t.data = old.iter().copied().cycle().take(len).collect();
        t.dtype = dtype;
        t.shape = shape.to_vec();
    });
}

fn remove_tensor(file: &Path, name: &str) {
    edit_tensors(file, |ts| {
        let before = ts.len();
        ts.retain(|t| t.name != name);
        assert_eq!(ts.len() + 1, before, "no tensor {name}");
    });
}

/// Sets the values of an I64 tensor (`weight_shape`).
fn set_i64(file: &Path, name: &str, values: &[i64]) {
    edit_tensors(file, |ts| {
        let t = tensor_mut(ts, name);
        assert_eq!(t.dtype, "I64");
        t.data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        t.shape = vec![values.len()];
    });
}

// ---------------------------------------------------------------------------
// Editing JSON side files
// ---------------------------------------------------------------------------

fn edit_text(file: &Path, edit: impl FnOnce(String) -> String) {
    let text = std::fs::read_to_string(file).unwrap();
    std::fs::write(file, edit(text)).unwrap();
}

/// `text` with the first `from` replaced by `to` (which must be there).
fn replace_once(text: String, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} is not in the text");
    text.replacen(from, to, 1)
}

fn edit_json(file: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(file, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

fn weights_of(config: &mut Value) -> &mut Value {
    &mut config["quantization_config"]["config_groups"]["group_0"]["weights"]
}

// ---------------------------------------------------------------------------
// Snapshots
// ---------------------------------------------------------------------------

#[derive(Debug, PartialEq, Eq)]
enum Node {
    Dir,
    File(Vec<u8>),
    Link(PathBuf),
    /// A FIFO, socket or device: never read.
    Other,
}

/// Every entry under `root`, recursively, without following links: what a
/// run must leave exactly as it was.
fn tree(root: &Path) -> BTreeMap<PathBuf, Node> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Node>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.file_type().is_symlink() {
                out.insert(rel, Node::Link(std::fs::read_link(&p).unwrap()));
            } else if meta.is_dir() {
                out.insert(rel, Node::Dir);
                walk(root, &p, out);
            } else if meta.is_file() {
                out.insert(rel, Node::File(std::fs::read(&p).unwrap()));
            } else {
                out.insert(rel, Node::Other);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The entries of two trees that differ, for a readable failure.
fn tree_diff(a: &BTreeMap<PathBuf, Node>, b: &BTreeMap<PathBuf, Node>) -> Vec<String> {
    let mut d = Vec::new();
    for (k, v) in a {
        match b.get(k) {
            None => d.push(format!("{} removed", k.display())),
            Some(w) if w != v => d.push(format!("{} changed", k.display())),
            _ => {}
        }
    }
    for k in b.keys().filter(|k| !a.contains_key(*k)) {
        d.push(format!("{} added", k.display()));
    }
    d
}

// ---------------------------------------------------------------------------
// The corpus
// ---------------------------------------------------------------------------

/// Where a fault is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// `Checkpoint::open` refuses.
    Open,
    /// `Plan::build` refuses (a whole-checkpoint fault).
    Build,
    /// `Plan::build` succeeds with findings; `plan.check()` refuses.
    Plan,
    /// Only writing refuses (side files).
    Write,
}

/// A scratch copy of one fixture: `root/model` is the checkpoint, and
/// `root/outside` a directory beside it holding `secret.json`.
struct Env {
    root: PathBuf,
    model: PathBuf,
    outside: PathBuf,
}

impl Env {
    fn new(root: &Path, fixture: &str) -> Env {
        let model = root.join("model");
        copy_dir(&fixtures().join(fixture).join("model"), &model);
        let outside = root.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret.json"), b"{\"secret\": true}\n").unwrap();
        Env {
            root: root.to_path_buf(),
            model,
            outside,
        }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.model.join(name)
    }

    fn st(&self) -> PathBuf {
        self.file(MODEL)
    }

    fn config(&self) -> PathBuf {
        self.file("config.json")
    }
}

/// One malformed checkpoint: `make` breaks a copy of `fixture` and returns
/// the path to run on; it must be refused at `stage` with `rule`, the
/// message naming `needle`.
struct Case {
    name: &'static str,
    fixture: &'static str,
    stage: Stage,
    rule: Rule,
    needle: &'static str,
    make: fn(&Env) -> PathBuf,
}

const W4: &str = "w4a16-g128";
const ASYM: &str = "w4a16-asym-g128";
const W3: &str = "w3a16-g16";
const W8: &str = "w8a16-g128";
const NV: &str = "nvfp4a16";
const MX: &str = "mxfp4a16";
const FP8: &str = "fp8-dynamic";
const MO: &str = "modelopt-nvfp4";
const SHARDED: &str = "sharded-nvfp4a16";
const SVDQ_INT4: &str = "svdq-int4-g64-logical";
const SVDQ_FP4: &str = "svdq-fp4-g16-packed";
const FP8_BLOCK: &str = "fp8-block-bf16";
const AWQ: &str = "awq-gemm-w4-g128";
const GPT_OSS: &str = "gpt-oss-mxfp4";
const GPTQ: &str = "gptq-w4-g128";
const BNB4: &str = "bnb-nf4-dq-bf16";
const BNB8: &str = "bnb-int8-bf16";
const MO_FP8: &str = "modelopt-fp8";
const CT_MX8: &str = "ct-mxfp8";
const SPARSE: &str = "ct-sparse24-fp8";
const SPARSE_BITMASK: &str = "ct-sparse-bitmask-fp8";
const QUIP: &str = "ct-transform-quip-w4a16";
const GPT_OSS_UP: &str = "model.layers.0.mlp.experts.gate_up_proj";

fn case(
    name: &'static str,
    fixture: &'static str,
    stage: Stage,
    rule: Rule,
    needle: &'static str,
    make: fn(&Env) -> PathBuf,
) -> Case {
    Case {
        name,
        fixture,
        stage,
        rule,
        needle,
        make,
    }
}

/// Header length of a safetensors file.
fn header_len(b: &[u8]) -> usize {
    u64::from_le_bytes(b[..8].try_into().unwrap()) as usize
}

/// Container faults: a malformed safetensors file (ST-001).
fn container_cases() -> Vec<Case> {
    use Rule::Container as ST1;
    use Stage::Open;
    vec![
        case("empty file", W4, Open, ST1, MODEL, |e| {
            std::fs::write(e.st(), b"").unwrap();
            e.model.clone()
        }),
        case("cut inside the length prefix", W4, Open, ST1, MODEL, |e| {
            edit_bytes(&e.st(), |b| b[..5].to_vec());
            e.model.clone()
        }),
        case("cut in the header", W4, Open, ST1, MODEL, |e| {
            edit_bytes(&e.st(), |b| b[..8 + header_len(&b) / 2].to_vec());
            e.model.clone()
        }),
        case("cut right after the header", W4, Open, ST1, MODEL, |e| {
            edit_bytes(&e.st(), |b| b[..8 + header_len(&b)].to_vec());
            e.model.clone()
        }),
        case("cut in the data", W4, Open, ST1, MODEL, |e| {
            edit_bytes(&e.st(), |b| {
                let n = 8 + header_len(&b);
                b[..n + (b.len() - n) / 2].to_vec()
            });
            e.model.clone()
        }),
        case("one byte short", W4, Open, ST1, MODEL, |e| {
            edit_bytes(&e.st(), |b| b[..b.len() - 1].to_vec());
            e.model.clone()
        }),
        case("header length beyond the file", W4, Open, ST1, MODEL, |e| {
            edit_bytes(&e.st(), |mut b| {
                let n = (b.len() - 8 + 1) as u64;
                b[..8].copy_from_slice(&n.to_le_bytes());
                b
            });
            e.model.clone()
        }),
        case("header length u64::MAX", W4, Open, ST1, MODEL, |e| {
            edit_bytes(&e.st(), |mut b| {
                b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
                b
            });
            e.model.clone()
        }),
        case("header length 2^40", W4, Open, ST1, MODEL, |e| {
            edit_bytes(&e.st(), |mut b| {
                b[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
                b
            });
            e.model.clone()
        }),
        case("header length 0", W4, Open, ST1, MODEL, |e| {
            edit_bytes(&e.st(), |mut b| {
                b[..8].copy_from_slice(&0u64.to_le_bytes());
                b
            });
            e.model.clone()
        }),
        case("header JSON invalid", W4, Open, ST1, MODEL, |e| {
            edit_bytes(&e.st(), |mut b| {
                let n = header_len(&b);
                // An object that never closes, the length unchanged.
                b[8] = b'{';
                for x in &mut b[9..8 + n] {
                    *x = b'x';
                }
                b
            });
            e.model.clone()
        }),
        case("header not UTF-8", W4, Open, ST1, MODEL, |e| {
            edit_bytes(&e.st(), |mut b| {
                let n = header_len(&b);
                let at = b[8..8 + n]
                    .windows(7)
                    .position(|w| w == b"\"model.")
                    .unwrap();
                // Inside a tensor name: a lone continuation byte.
                b[8 + at + 1] = 0xff;
                b
            });
            e.model.clone()
        }),
        case(
            "header names a tensor twice",
            W4,
            Open,
            ST1,
            "header names model.norm.weight twice",
            |e| {
                edit_bytes(&e.st(), |b| {
                    let (h, data) = split(&b);
                    let entry = h[NORM].to_string();
                    let text = Value::Object(h).to_string();
                    // The same name first with its own entry, then as stored.
                    let dup = format!("{{{}:{entry},{}", json!(NORM), &text[1..]);
                    raw(&dup, &data)
                });
                e.model.clone()
            },
        ),
        case("header is a list", W4, Open, ST1, MODEL, |e| {
            edit_bytes(&e.st(), |b| {
                let (_, data) = split(&b);
                raw("[]", &data)
            });
            e.model.clone()
        }),
        case("data offsets beyond the file", W4, Open, ST1, MODEL, |e| {
            edit_header(&e.st(), |h, _| {
                let (last, a, b) = entries_by_offset(h).pop().unwrap();
                h[&last]["data_offsets"] = json!([a, b + 8]);
            });
            e.model.clone()
        }),
        case("data offsets past u64", W4, Open, ST1, MODEL, |e| {
            set_entry(&e.st(), NORM, "data_offsets", json!([0, u64::MAX]));
            e.model.clone()
        }),
        case("data offsets overlapping", W4, Open, ST1, MODEL, |e| {
            edit_header(&e.st(), |h, _| {
                let v = entries_by_offset(h);
                let (second, a, b) = &v[1];
                // The second tensor, same length, starts where the first does.
                let start = v[0].1;
                h[second]["data_offsets"] = json!([start, start + (b - a)]);
            });
            e.model.clone()
        }),
        case("data offsets reversed", W4, Open, ST1, MODEL, |e| {
            edit_header(&e.st(), |h, _| {
                let (first, a, b) = entries_by_offset(h)[0].clone();
                h[&first]["data_offsets"] = json!([b, a]);
            });
            e.model.clone()
        }),
        case("gap between data offsets", W4, Open, ST1, MODEL, |e| {
            edit_header(&e.st(), |h, data| {
                let v = entries_by_offset(h);
                // 8 bytes after the first tensor, every later one moved.
                let hole = v[0].2;
                for (name, a, b) in &v[1..] {
                    h[name]["data_offsets"] = json!([a + 8, b + 8]);
                }
                data.splice(hole as usize..hole as usize, [0u8; 8]);
            });
            e.model.clone()
        }),
        case(
            "trailing bytes after the last tensor",
            W4,
            Open,
            ST1,
            MODEL,
            |e| {
                edit_bytes(&e.st(), |mut b| {
                    b.extend_from_slice(&[0; 8]);
                    b
                });
                e.model.clone()
            },
        ),
        case("negative data offset", W4, Open, ST1, MODEL, |e| {
            set_entry(&e.st(), NORM, "data_offsets", json!([-8, 504]));
            e.model.clone()
        }),
        case("unknown dtype", W4, Open, ST1, MODEL, |e| {
            set_entry(&e.st(), NORM, "dtype", json!("Q4_K"));
            e.model.clone()
        }),
        case(
            "shape element count overflows usize",
            W4,
            Open,
            ST1,
            MODEL,
            |e| {
                set_entry(&e.st(), NORM, "shape", json!([1u64 << 62, 1u64 << 62, 16]));
                e.model.clone()
            },
        ),
        case(
            "shape disagrees with byte length",
            W4,
            Open,
            ST1,
            MODEL,
            |e| {
                set_entry(&e.st(), NORM, "shape", json!([255]));
                e.model.clone()
            },
        ),
        case("negative shape", W4, Open, ST1, MODEL, |e| {
            set_entry(&e.st(), NORM, "shape", json!([-256]));
            e.model.clone()
        }),
        case("header nested 10000 deep", W4, Open, ST1, MODEL, |e| {
            edit_bytes(&e.st(), |b| {
                let (_, data) = split(&b);
                let deep = format!("{{\"a\":{}{}}}", "[".repeat(10_000), "]".repeat(10_000));
                raw(&deep, &data)
            });
            e.model.clone()
        }),
        case("header metadata not strings", W4, Open, ST1, MODEL, |e| {
            edit_header(&e.st(), |h, _| {
                h.insert("__metadata__".into(), json!({"format": 1}));
            });
            e.model.clone()
        }),
        case(
            "lone model.safetensors is a FIFO",
            W4,
            Open,
            ST1,
            "no .safetensors or .gguf file",
            |e| {
                std::fs::remove_file(e.st()).unwrap();
                mkfifo(&e.st());
                e.model.clone()
            },
        ),
        case("second shard empty", SHARDED, Open, ST1, SHARD2, |e| {
            std::fs::write(e.file(SHARD2), b"").unwrap();
            e.model.clone()
        }),
        case(
            "second shard cut in the data",
            SHARDED,
            Open,
            ST1,
            SHARD2,
            |e| {
                edit_bytes(&e.file(SHARD2), |b| b[..b.len() - 100].to_vec());
                e.model.clone()
            },
        ),
        case(
            "svdquant file cut in the data",
            SVDQ_FP4,
            Open,
            ST1,
            MODEL,
            |e| {
                edit_bytes(&e.st(), |b| b[..b.len() - 100].to_vec());
                e.model.clone()
            },
        ),
        case(
            "single file named on the command line, cut",
            W4,
            Open,
            ST1,
            MODEL,
            |e| {
                edit_bytes(&e.st(), |b| b[..b.len() / 2].to_vec());
                e.st()
            },
        ),
    ]
}

/// compressed-tensors pack rules (CT-001, CT-004) and the config values
/// they read.
fn ct_cases() -> Vec<Case> {
    use Stage::{Build, Plan};
    vec![
        case("num_bits 0", W4, Plan, Rule::Ct001, "num_bits 0", |e| {
            edit_json(&e.config(), |v| weights_of(v)["num_bits"] = json!(0));
            e.model.clone()
        }),
        case("num_bits 9", W4, Plan, Rule::Ct001, "num_bits 9", |e| {
            edit_json(&e.config(), |v| weights_of(v)["num_bits"] = json!(9));
            e.model.clone()
        }),
        case("num_bits 32", W4, Plan, Rule::Ct001, "num_bits 32", |e| {
            edit_json(&e.config(), |v| weights_of(v)["num_bits"] = json!(32));
            e.model.clone()
        }),
        case(
            "num_bits negative",
            W4,
            Build,
            Rule::Config,
            "num_bits",
            |e| {
                edit_json(&e.config(), |v| weights_of(v)["num_bits"] = json!(-4));
                e.model.clone()
            },
        ),
        case(
            "num_bits fractional",
            W4,
            Build,
            Rule::Config,
            "num_bits",
            |e| {
                edit_json(&e.config(), |v| weights_of(v)["num_bits"] = json!(4.5));
                e.model.clone()
            },
        ),
        case(
            "num_bits a string",
            W4,
            Build,
            Rule::Config,
            "num_bits",
            |e| {
                edit_json(&e.config(), |v| weights_of(v)["num_bits"] = json!("4"));
                e.model.clone()
            },
        ),
        case("num_bits 2^40", W4, Build, Rule::Config, "num_bits", |e| {
            edit_json(&e.config(), |v| {
                weights_of(v)["num_bits"] = json!(1u64 << 40)
            });
            e.model.clone()
        }),
        case(
            "weight_packed stored as F32",
            W4,
            Plan,
            Rule::Ct001,
            "int32",
            |e| {
                set_entry(&e.st(), &down("weight_packed"), "dtype", json!("F32"));
                e.model.clone()
            },
        ),
        case(
            "weight_packed stored as U8",
            W4,
            Plan,
            Rule::Ct001,
            "int32",
            |e| {
                let p = down("weight_packed");
                set_entry(&e.st(), &p, "dtype", json!("U8"));
                set_entry(&e.st(), &p, "shape", json!([256, 384]));
                e.model.clone()
            },
        ),
        case(
            "weight_shape columns beyond the packed width",
            W4,
            Plan,
            Rule::Ct004,
            "neither",
            |e| {
                set_i64(&e.st(), &down("weight_shape"), &[256, 1000]);
                e.model.clone()
            },
        ),
        case(
            "weight_shape columns below the packed width",
            W4,
            Plan,
            Rule::Ct004,
            "neither",
            |e| {
                set_i64(&e.st(), &down("weight_shape"), &[256, 10]);
                e.model.clone()
            },
        ),
        case(
            "weight_shape rows disagree with the packed rows",
            W4,
            Plan,
            Rule::Ct004,
            "does not match weight_shape",
            |e| {
                set_i64(&e.st(), &down("weight_shape"), &[255, 768]);
                e.model.clone()
            },
        ),
        case(
            "weight_shape of rank 3 for a 2-D pack",
            W4,
            Plan,
            Rule::Ct004,
            "does not match weight_shape",
            |e| {
                set_i64(&e.st(), &down("weight_shape"), &[1, 256, 768]);
                e.model.clone()
            },
        ),
        case(
            "weight_shape negative",
            W4,
            Plan,
            Rule::TensorValue,
            "out of range",
            |e| {
                set_i64(&e.st(), &down("weight_shape"), &[-256, 768]);
                e.model.clone()
            },
        ),
        case(
            "weight_shape zero",
            W4,
            Plan,
            Rule::TensorValue,
            "out of range",
            |e| {
                set_i64(&e.st(), &down("weight_shape"), &[256, 0]);
                e.model.clone()
            },
        ),
        case(
            "weight_shape i64::MAX",
            W4,
            Plan,
            Rule::TensorValue,
            "out of range",
            |e| {
                set_i64(&e.st(), &down("weight_shape"), &[i64::MAX, i64::MAX]);
                e.model.clone()
            },
        ),
        case(
            "packed width fitting neither 3-bit layout",
            W3,
            Plan,
            Rule::Ct004,
            "neither",
            |e| {
                // 528 3-bit columns: 50 words dense, 53 padded.
                reshape_tensor(
                    &e.st(),
                    &down("weight_packed"),
                    "I32",
                    &[176, 51],
                    176 * 51 * 4,
                );
                e.model.clone()
            },
        ),
        case(
            "packed of rank 3",
            W4,
            Plan,
            Rule::Ct004,
            "does not match weight_shape",
            |e| {
                set_entry(
                    &e.st(),
                    &down("weight_packed"),
                    "shape",
                    json!([1, 256, 96]),
                );
                e.model.clone()
            },
        ),
    ]
}

/// Scales, zero points and global scales missing or misshaped, and FP4
/// tensors (compressed-tensors NVFP4 / MXFP4, ModelOpt) of the wrong shape
/// or dtype (TEN-001..003).
fn tensor_cases() -> Vec<Case> {
    use Rule::{MissingTensor as MISSING, TensorDtype as DTYPE, TensorShape as SHAPE};
    use Stage::Plan;
    vec![
        case(
            "weight_scale missing",
            W4,
            Plan,
            MISSING,
            "down_proj.weight_scale",
            |e| {
                remove_tensor(&e.st(), &down("weight_scale"));
                e.model.clone()
            },
        ),
        case(
            "weight_scale stored as I16",
            W4,
            Plan,
            DTYPE,
            "down_proj.weight_scale",
            |e| {
                set_entry(&e.st(), &down("weight_scale"), "dtype", json!("I16"));
                e.model.clone()
            },
        ),
        case(
            "weight_scale one group short",
            W4,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                reshape_tensor(
                    &e.st(),
                    &down("weight_scale"),
                    "BF16",
                    &[256, 5],
                    256 * 5 * 2,
                );
                e.model.clone()
            },
        ),
        case(
            "weight_scale transposed",
            W4,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                set_entry(&e.st(), &down("weight_scale"), "shape", json!([6, 256]));
                e.model.clone()
            },
        ),
        case(
            "weight_scale flattened",
            W4,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                set_entry(&e.st(), &down("weight_scale"), "shape", json!([1536]));
                e.model.clone()
            },
        ),
        case(
            "weight_zero_point missing",
            ASYM,
            Plan,
            MISSING,
            "down_proj.weight_zero_point",
            |e| {
                remove_tensor(&e.st(), &down("weight_zero_point"));
                e.model.clone()
            },
        ),
        case(
            "weight_zero_point stored as U32",
            ASYM,
            Plan,
            DTYPE,
            "down_proj.weight_zero_point",
            |e| {
                set_entry(&e.st(), &down("weight_zero_point"), "dtype", json!("U32"));
                e.model.clone()
            },
        ),
        case(
            "weight_zero_point one group short",
            ASYM,
            Plan,
            SHAPE,
            "down_proj.weight_zero_point",
            |e| {
                reshape_tensor(
                    &e.st(),
                    &down("weight_zero_point"),
                    "I32",
                    &[32, 5],
                    32 * 5 * 4,
                );
                e.model.clone()
            },
        ),
        case(
            "weight_global_scale missing",
            NV,
            Plan,
            MISSING,
            "down_proj.weight_global_scale",
            |e| {
                remove_tensor(&e.st(), &down("weight_global_scale"));
                e.model.clone()
            },
        ),
        case(
            "weight_global_scale with two values",
            NV,
            Plan,
            SHAPE,
            "down_proj.weight_global_scale",
            |e| {
                reshape_tensor(&e.st(), &down("weight_global_scale"), "F32", &[2], 8);
                e.model.clone()
            },
        ),
        case(
            "weight_global_scale stored as BF16",
            NV,
            Plan,
            DTYPE,
            "down_proj.weight_global_scale",
            |e| {
                let g = down("weight_global_scale");
                set_entry(&e.st(), &g, "dtype", json!("BF16"));
                set_entry(&e.st(), &g, "shape", json!([2]));
                e.model.clone()
            },
        ),
        case(
            "nvfp4 weight_scale stored as BF16",
            NV,
            Plan,
            DTYPE,
            "down_proj.weight_scale",
            |e| {
                let s = down("weight_scale");
                set_entry(&e.st(), &s, "dtype", json!("BF16"));
                set_entry(&e.st(), &s, "shape", json!([256, 22]));
                e.model.clone()
            },
        ),
        case(
            "nvfp4 weight_scale one group short",
            NV,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                reshape_tensor(
                    &e.st(),
                    &down("weight_scale"),
                    "F8_E4M3",
                    &[256, 43],
                    256 * 43,
                );
                e.model.clone()
            },
        ),
        case(
            "nvfp4 weight_scale missing",
            NV,
            Plan,
            MISSING,
            "down_proj.weight_scale",
            |e| {
                remove_tensor(&e.st(), &down("weight_scale"));
                e.model.clone()
            },
        ),
        case(
            "nvfp4 weight_packed stored as I16",
            NV,
            Plan,
            DTYPE,
            "down_proj.weight_packed",
            |e| {
                let p = down("weight_packed");
                set_entry(&e.st(), &p, "dtype", json!("I16"));
                set_entry(&e.st(), &p, "shape", json!([256, 176]));
                e.model.clone()
            },
        ),
        case(
            "nvfp4 weight_packed 1-D",
            NV,
            Plan,
            SHAPE,
            "down_proj.weight_packed",
            |e| {
                set_entry(&e.st(), &down("weight_packed"), "shape", json!([256 * 352]));
                e.model.clone()
            },
        ),
        case(
            "nvfp4 weight_packed one row short",
            NV,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                reshape_tensor(
                    &e.st(),
                    &down("weight_packed"),
                    "U8",
                    &[255, 352],
                    255 * 352,
                );
                e.model.clone()
            },
        ),
        case(
            "nvfp4 weight_shape disagrees with the packed width",
            NV,
            Plan,
            SHAPE,
            "down_proj.weight_packed",
            |e| {
                edit_tensors(&e.st(), |ts| {
                    ts.push(Tensor::i64(down("weight_shape"), &[2], &[256, 1000]))
                });
                e.model.clone()
            },
        ),
        case(
            "mxfp4 weight_scale stored as BF16",
            MX,
            Plan,
            DTYPE,
            "down_proj.weight_scale",
            |e| {
                let s = down("weight_scale");
                set_entry(&e.st(), &s, "dtype", json!("BF16"));
                set_entry(&e.st(), &s, "shape", json!([256, 11]));
                e.model.clone()
            },
        ),
        case(
            "fp8 weight stored as U8",
            FP8,
            Plan,
            DTYPE,
            "down_proj.weight",
            |e| {
                set_entry(&e.st(), &down("weight"), "dtype", json!("U8"));
                e.model.clone()
            },
        ),
        case(
            "modelopt weight stored as I8",
            MO,
            Plan,
            DTYPE,
            "down_proj.weight",
            |e| {
                set_entry(&e.st(), &down("weight"), "dtype", json!("I8"));
                e.model.clone()
            },
        ),
        case(
            "modelopt weight 1-D",
            MO,
            Plan,
            SHAPE,
            "down_proj.weight",
            |e| {
                set_entry(&e.st(), &down("weight"), "shape", json!([256 * 352]));
                e.model.clone()
            },
        ),
        case(
            "modelopt weight_scale stored as I8",
            MO,
            Plan,
            DTYPE,
            "down_proj.weight_scale",
            |e| {
                set_entry(&e.st(), &down("weight_scale"), "dtype", json!("I8"));
                e.model.clone()
            },
        ),
        case(
            "modelopt weight_scale one group short",
            MO,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                reshape_tensor(
                    &e.st(),
                    &down("weight_scale"),
                    "F8_E4M3",
                    &[256, 43],
                    256 * 43,
                );
                e.model.clone()
            },
        ),
        case(
            "modelopt weight_scale missing",
            MO,
            Plan,
            MISSING,
            "down_proj.weight_scale",
            |e| {
                remove_tensor(&e.st(), &down("weight_scale"));
                e.model.clone()
            },
        ),
        case(
            "modelopt weight_scale_2 with two values",
            MO,
            Plan,
            SHAPE,
            "down_proj.weight_scale_2",
            |e| {
                reshape_tensor(&e.st(), &down("weight_scale_2"), "F32", &[2], 8);
                e.model.clone()
            },
        ),
        case(
            "modelopt weight_scale_2 stored as I32",
            MO,
            Plan,
            DTYPE,
            "down_proj.weight_scale_2",
            |e| {
                set_entry(&e.st(), &down("weight_scale_2"), "dtype", json!("I32"));
                e.model.clone()
            },
        ),
    ]
}

/// Config files: unreadable, keys given twice, values contradicting the
/// tensors (CFG-001, and the tensor rule the contradiction breaks).
fn config_cases() -> Vec<Case> {
    use Rule::Config as CFG;
    use Stage::{Build, Open, Plan};
    vec![
        case("config.json not JSON", W4, Open, CFG, "config.json", |e| {
            std::fs::write(e.config(), b"{\"quantization_config\": ").unwrap();
            e.model.clone()
        }),
        case("config.json empty", W4, Open, CFG, "config.json", |e| {
            std::fs::write(e.config(), b"").unwrap();
            e.model.clone()
        }),
        case("config.json not UTF-8", W4, Open, CFG, "config.json", |e| {
            edit_bytes(&e.config(), |mut b| {
                let at = b.windows(6).position(|w| w == b"\"dtype").unwrap();
                b[at + 1] = 0xff;
                b
            });
            e.model.clone()
        }),
        case(
            "config.json gives a key twice",
            W4,
            Open,
            CFG,
            "vocab_size is given twice",
            |e| {
                edit_text(&e.config(), |t| {
                    replace_once(t, "\"vocab_size\"", "\"vocab_size\": 1, \"vocab_size\"")
                });
                e.model.clone()
            },
        ),
        case(
            "config.json gives num_bits twice",
            W4,
            Open,
            CFG,
            "quantization_config.config_groups.group_0.weights.num_bits is given twice",
            |e| {
                edit_text(&e.config(), |t| {
                    replace_once(t, "\"num_bits\": 4", "\"num_bits\": 8, \"num_bits\": 4")
                });
                e.model.clone()
            },
        ),
        case(
            "config.json nested 10000 deep",
            W4,
            Open,
            CFG,
            "config.json",
            |e| {
                let deep = format!("{{\"a\":{}{}}}", "[".repeat(10_000), "]".repeat(10_000));
                std::fs::write(e.config(), deep).unwrap();
                e.model.clone()
            },
        ),
        case("config.json a list", W4, Build, CFG, "weight_packed", |e| {
            std::fs::write(e.config(), b"[]").unwrap();
            e.model.clone()
        }),
        case(
            "hf_quant_config.json not JSON",
            MO,
            Open,
            CFG,
            "hf_quant_config.json",
            |e| {
                std::fs::write(e.file("hf_quant_config.json"), b"{\"quantization\": {").unwrap();
                e.model.clone()
            },
        ),
        case(
            "hf_quant_config.json gives quant_algo twice",
            MO,
            Open,
            CFG,
            "quantization.quant_algo is given twice",
            |e| {
                edit_text(&e.file("hf_quant_config.json"), |t| {
                    replace_once(
                        t,
                        "\"quant_algo\": \"NVFP4\"",
                        "\"quant_algo\": \"FP8\", \"quant_algo\": \"NVFP4\"",
                    )
                });
                e.model.clone()
            },
        ),
        case(
            "svdquant sidecar gives rank twice",
            SVDQ_INT4,
            Open,
            CFG,
            "rank is given twice",
            |e| {
                edit_text(&e.file("model.config.yaml"), |t| {
                    replace_once(t, "\"rank\": 16", "\"rank\": 8, \"rank\": 16")
                });
                e.model.clone()
            },
        ),
        case(
            "svdquant sidecar not JSON",
            SVDQ_FP4,
            Open,
            CFG,
            "model.config.yaml",
            |e| {
                edit_bytes(&e.file("model.config.yaml"), |b| b[..b.len() / 2].to_vec());
                e.model.clone()
            },
        ),
        case("group_size 0", W4, Build, CFG, "group_size", |e| {
            edit_json(&e.config(), |v| weights_of(v)["group_size"] = json!(0));
            e.model.clone()
        }),
        case(
            "group_size 64 against scales stored for 128",
            W4,
            Plan,
            Rule::TensorShape,
            "weight_scale",
            |e| {
                edit_json(&e.config(), |v| weights_of(v)["group_size"] = json!(64));
                e.model.clone()
            },
        ),
        case(
            "group_size 100 against scales stored for 128",
            W4,
            Plan,
            Rule::TensorShape,
            "weight_scale",
            |e| {
                edit_json(&e.config(), |v| weights_of(v)["group_size"] = json!(100));
                e.model.clone()
            },
        ),
        case(
            "strategy channel against group scales",
            W8,
            Plan,
            Rule::TensorShape,
            "weight_scale",
            |e| {
                edit_json(&e.config(), |v| {
                    weights_of(v)["strategy"] = json!("channel")
                });
                e.model.clone()
            },
        ),
        case(
            "num_bits 8 against a 4-bit pack",
            W4,
            Plan,
            Rule::Ct004,
            "weight_packed",
            |e| {
                edit_json(&e.config(), |v| weights_of(v)["num_bits"] = json!(8));
                e.model.clone()
            },
        ),
        case(
            "symmetric false without zero points",
            W4,
            Plan,
            Rule::MissingTensor,
            "weight_zero_point",
            |e| {
                edit_json(&e.config(), |v| weights_of(v)["symmetric"] = json!(false));
                e.model.clone()
            },
        ),
        case(
            "modelopt group_size 32 against scales stored for 16",
            MO,
            Plan,
            Rule::TensorShape,
            "weight_scale",
            |e| {
                edit_json(&e.file("hf_quant_config.json"), |v| {
                    v["quantization"]["group_size"] = json!(32)
                });
                e.model.clone()
            },
        ),
    ]
}

/// Moves `model/<name>` to `outside/<name>` and leaves a link to it.
fn link_outside(e: &Env, name: &str, absolute: bool) {
    let target = e.outside.join(name);
    std::fs::rename(e.file(name), &target).unwrap();
    let link = if absolute {
        target
    } else {
        Path::new("../outside").join(name)
    };
    std::os::unix::fs::symlink(link, e.file(name)).unwrap();
}

/// A named pipe at `path` (nothing ever writes to it: reading would block).
fn mkfifo(path: &Path) {
    let st = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(st.success(), "mkfifo {}", path.display());
}

/// Shard indexes (ST-002) and duplicate tensors (TEN-005), links leading
/// out of the checkpoint (ST-002 with an index, ST-001 without).
fn index_cases() -> Vec<Case> {
    use Rule::{Container as ST1, Index as ST2};
    use Stage::Open;
    vec![
        case(
            "index names a missing shard",
            SHARDED,
            Open,
            ST2,
            "does not exist",
            |e| {
                edit_json(&e.file(INDEX), |v| {
                    v["weight_map"]["ghost.weight"] = json!("model-00003-of-00003.safetensors")
                });
                e.model.clone()
            },
        ),
        case("index shard deleted", SHARDED, Open, ST2, SHARD2, |e| {
            std::fs::remove_file(e.file(SHARD2)).unwrap();
            e.model.clone()
        }),
        case(
            "index names ../x.safetensors",
            SHARDED,
            Open,
            ST2,
            "not a plain file name",
            |e| {
                std::fs::copy(e.file(SHARD2), e.root.join("x.safetensors")).unwrap();
                edit_json(&e.file(INDEX), |v| {
                    v["weight_map"][NORM] = json!("../x.safetensors")
                });
                e.model.clone()
            },
        ),
        case(
            "index names an absolute path",
            SHARDED,
            Open,
            ST2,
            "not a plain file name",
            |e| {
                let abs = e.outside.join("x.safetensors");
                std::fs::copy(e.file(SHARD2), &abs).unwrap();
                edit_json(&e.file(INDEX), |v| {
                    v["weight_map"][NORM] = json!(abs.to_str().unwrap())
                });
                e.model.clone()
            },
        ),
        case(
            "index shard is a link leading outside",
            SHARDED,
            Open,
            ST2,
            "outside the checkpoint",
            |e| {
                link_outside(e, SHARD2, false);
                e.model.clone()
            },
        ),
        case(
            "index shard is an absolute link leading outside",
            SHARDED,
            Open,
            ST2,
            "outside the checkpoint",
            |e| {
                link_outside(e, SHARD1, true);
                e.model.clone()
            },
        ),
        case(
            "shards without index, one a link leading outside",
            SHARDED,
            Open,
            ST1,
            "outside the checkpoint",
            |e| {
                std::fs::remove_file(e.file(INDEX)).unwrap();
                link_outside(e, SHARD2, false);
                e.model.clone()
            },
        ),
        case(
            "lone model.safetensors is a link leading outside",
            W4,
            Open,
            ST1,
            "outside the checkpoint",
            |e| {
                link_outside(e, MODEL, false);
                e.model.clone()
            },
        ),
        case(
            "index maps a tensor twice",
            SHARDED,
            Open,
            ST2,
            "weight_map.model.norm.weight is given twice",
            |e| {
                edit_text(&e.file(INDEX), |t| {
                    let at = format!("\"{NORM}\": \"");
                    replace_once(t, &at, &format!("\"{NORM}\": \"{SHARD1}\",\n    {at}"))
                });
                e.model.clone()
            },
        ),
        case(
            "index shard is a FIFO",
            SHARDED,
            Open,
            ST2,
            "does not exist",
            |e| {
                std::fs::remove_file(e.file(SHARD2)).unwrap();
                mkfifo(&e.file(SHARD2));
                e.model.clone()
            },
        ),
        case(
            "index too large to read",
            SHARDED,
            Open,
            ST2,
            "is not read",
            |e| {
                // Sparse: 65 MiB on paper.
                let f = std::fs::File::create(e.file(INDEX)).unwrap();
                f.set_len(65 << 20).unwrap();
                e.model.clone()
            },
        ),
        case("index not JSON", SHARDED, Open, ST2, INDEX, |e| {
            edit_bytes(&e.file(INDEX), |b| b[..b.len() / 2].to_vec());
            e.model.clone()
        }),
        case(
            "index maps a tensor to a number",
            SHARDED,
            Open,
            ST2,
            NORM,
            |e| {
                edit_json(&e.file(INDEX), |v| v["weight_map"][NORM] = json!(2));
                e.model.clone()
            },
        ),
        case("index maps no shard", SHARDED, Open, ST2, INDEX, |e| {
            edit_json(&e.file(INDEX), |v| v["weight_map"] = json!({}));
            e.model.clone()
        }),
        case(
            "tensor stored in two shards",
            SHARDED,
            Open,
            Rule::DuplicateTensor,
            NORM,
            |e| {
                let norm = {
                    let mut n = None;
                    edit_tensors(&e.file(SHARD2), |ts| {
                        n = Some(tensor_mut(ts, NORM).clone());
                    });
                    n.unwrap()
                };
                edit_tensors(&e.file(SHARD1), |ts| ts.push(norm));
                e.model.clone()
            },
        ),
    ]
}

/// Side files leading out of the checkpoint: a planning finding (ST-001),
/// so `validate` reports it and nothing is decoded.
fn side_file_cases() -> Vec<Case> {
    use Stage::Plan;
    vec![
        case(
            "side file is a link leading outside",
            W4,
            Plan,
            Rule::Container,
            "tokenizer.json",
            |e| {
                std::os::unix::fs::symlink(e.outside.join("secret.json"), e.file("tokenizer.json"))
                    .unwrap();
                e.model.clone()
            },
        ),
        case(
            "side file is a relative link leading outside",
            SHARDED,
            Plan,
            Rule::Container,
            "generation_config.json",
            |e| {
                std::fs::write(e.file("generation_config.json"), "{}").unwrap();
                link_outside(e, "generation_config.json", false);
                e.model.clone()
            },
        ),
        case(
            "Hugging Face cache side file leading out of blobs",
            W4,
            Plan,
            Rule::Container,
            "tokenizer.json",
            |e| {
                let snap = hf_cache(&e.root, &e.model);
                // Beside blobs, in the same repo folder: still not a blob.
                let refs = snap.parent().unwrap().parent().unwrap().join("refs");
                std::fs::create_dir_all(&refs).unwrap();
                std::fs::write(refs.join("main"), b"{\"rev\": 1}").unwrap();
                std::os::unix::fs::symlink("../../refs/main", snap.join("tokenizer.json")).unwrap();
                snap
            },
        ),
    ]
}

/// Lays out the files of `model` as a Hugging Face hub cache under `root`
/// (`models--org--name/snapshots/<rev>/f -> ../../blobs/<hash>`) and returns
/// the snapshot folder. The files leave `model`.
fn hf_cache(root: &Path, model: &Path) -> PathBuf {
    let repo = root.join("models--org--name");
    let snap = repo.join("snapshots").join("0123abcd");
    let blobs = repo.join("blobs");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(&blobs).unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(model)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for (i, p) in files.iter().enumerate() {
        let blob = format!("blob{i:04}");
        std::fs::rename(p, blobs.join(&blob)).unwrap();
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(&blob),
            snap.join(p.file_name().unwrap()),
        )
        .unwrap();
    }
    snap
}

/// DeepSeek-style FP8 and AutoAWQ: orphans, misshaped companions, and the
/// variants not decoded.
fn release_cases() -> Vec<Case> {
    use Rule::{
        Config as CFG, MissingTensor as MISSING, TensorDtype as DTYPE, TensorShape as SHAPE,
        Unsupported as UNSUPPORTED,
    };
    use Stage::{Build, Plan};
    fn qc(e: &Env, key: &str, v: Value) -> PathBuf {
        edit_json(&e.config(), |c| c["quantization_config"][key] = v);
        e.model.clone()
    }
    vec![
        case(
            "fp8 weight_scale_inv without its weight",
            FP8_BLOCK,
            Plan,
            MISSING,
            "down_proj.weight",
            |e| {
                remove_tensor(&e.st(), &down("weight"));
                e.model.clone()
            },
        ),
        case(
            "fp8 weight without weight_scale_inv",
            FP8_BLOCK,
            Plan,
            MISSING,
            "down_proj.weight_scale_inv",
            |e| {
                remove_tensor(&e.st(), &down("weight_scale_inv"));
                e.model.clone()
            },
        ),
        case(
            "fp8 weight_scale_inv one block short",
            FP8_BLOCK,
            Plan,
            SHAPE,
            "down_proj.weight_scale_inv",
            |e| {
                reshape_tensor(
                    &e.st(),
                    &down("weight_scale_inv"),
                    "F32",
                    &[3, 7],
                    3 * 7 * 4,
                );
                e.model.clone()
            },
        ),
        case("fp8 fmt e5m2", FP8_BLOCK, Build, UNSUPPORTED, "e5m2", |e| {
            qc(e, "fmt", json!("e5m2"))
        }),
        case(
            "fp8 weight_block_size of one number",
            FP8_BLOCK,
            Build,
            CFG,
            "weight_block_size",
            |e| qc(e, "weight_block_size", json!([128])),
        ),
        case("awq version gemv", AWQ, Build, UNSUPPORTED, "gemv", |e| {
            qc(e, "version", json!("gemv"))
        }),
        case("awq 8 bits", AWQ, Build, UNSUPPORTED, "bits 8", |e| {
            qc(e, "bits", json!(8))
        }),
        case(
            "awq qweight stored as F32",
            AWQ,
            Plan,
            DTYPE,
            "down_proj.qweight",
            |e| {
                set_entry(&e.st(), &down("qweight"), "dtype", json!("F32"));
                e.model.clone()
            },
        ),
        case(
            "awq qzeros one group short",
            AWQ,
            Plan,
            SHAPE,
            "down_proj.qzeros",
            |e| {
                reshape_tensor(&e.st(), &down("qzeros"), "I32", &[7, 48], 7 * 48 * 4);
                e.model.clone()
            },
        ),
        case(
            "gpt-oss blocks without scales",
            GPT_OSS,
            Plan,
            MISSING,
            "gate_up_proj_scales",
            |e| {
                remove_tensor(&e.st(), &format!("{GPT_OSS_UP}_scales"));
                e.model.clone()
            },
        ),
        case(
            "gpt-oss scales without blocks",
            GPT_OSS,
            Plan,
            MISSING,
            "gate_up_proj_blocks",
            |e| {
                remove_tensor(&e.st(), &format!("{GPT_OSS_UP}_blocks"));
                e.model.clone()
            },
        ),
        case(
            "gpt-oss scales one group short",
            GPT_OSS,
            Plan,
            SHAPE,
            "gate_up_proj_scales",
            |e| {
                reshape_tensor(
                    &e.st(),
                    &format!("{GPT_OSS_UP}_scales"),
                    "U8",
                    &[8, 128, 3],
                    8 * 128 * 3,
                );
                e.model.clone()
            },
        ),
        case(
            "gpt-oss blocks of 8 bytes",
            GPT_OSS,
            Plan,
            SHAPE,
            "gate_up_proj_blocks",
            |e| {
                set_entry(
                    &e.st(),
                    &format!("{GPT_OSS_UP}_blocks"),
                    "shape",
                    json!([8, 128, 8, 8]),
                );
                e.model.clone()
            },
        ),
        case(
            "awq scales missing",
            AWQ,
            Plan,
            MISSING,
            "down_proj.scales",
            |e| {
                remove_tensor(&e.st(), &down("scales"));
                e.model.clone()
            },
        ),
    ]
}

/// GPTQ and AutoRound: the layouts not decoded, and each tensor broken.
/// The fixture's down_proj is 256x768, 4 bits, groups of 128: qweight
/// [96, 256], qzeros [6, 32], scales [6, 256], g_idx [768].
fn gptq_cases() -> Vec<Case> {
    use Rule::{
        Config as CFG, MissingTensor as MISSING, TensorDtype as DTYPE, TensorShape as SHAPE,
        TensorValue as VALUE, Unsupported as UNSUPPORTED,
    };
    use Stage::{Build, Plan};
    fn qc(e: &Env, edits: &[(&str, Value)]) -> PathBuf {
        edit_json(&e.config(), |c| {
            for (k, v) in edits {
                c["quantization_config"][*k] = v.clone();
            }
        });
        e.model.clone()
    }
    fn format(e: &Env, f: &str) -> PathBuf {
        qc(e, &[("checkpoint_format", json!(f)), ("format", json!(f))])
    }
    vec![
        case(
            "gptq marlin format",
            GPTQ,
            Build,
            UNSUPPORTED,
            "marlin",
            |e| format(e, "marlin"),
        ),
        case(
            "gptq bitblas format",
            GPTQ,
            Build,
            UNSUPPORTED,
            "bitblas",
            |e| format(e, "bitblas"),
        ),
        case("gptq qqq format", GPTQ, Build, UNSUPPORTED, "qqq", |e| {
            format(e, "qqq")
        }),
        case(
            "gptq planar format",
            GPTQ,
            Build,
            UNSUPPORTED,
            "gptq_p",
            |e| format(e, "gptq_p"),
        ),
        case(
            "gptq unknown format",
            GPTQ,
            Build,
            UNSUPPORTED,
            "gptq_v9",
            |e| format(e, "gptq_v9"),
        ),
        case(
            "gptq format and checkpoint_format disagree",
            GPTQ,
            Build,
            CFG,
            "disagree",
            |e| qc(e, &[("format", json!("gptq_v2"))]),
        ),
        case("gptq 5 bits", GPTQ, Build, UNSUPPORTED, "bits 5", |e| {
            qc(e, &[("bits", json!(5))])
        }),
        case("gptq 1 bit", GPTQ, Build, UNSUPPORTED, "bits 1", |e| {
            qc(e, &[("bits", json!(1))])
        }),
        case("gptq group_size 0", GPTQ, Build, CFG, "group_size", |e| {
            qc(e, &[("group_size", json!(0))])
        }),
        case("gptq bits as text", GPTQ, Build, CFG, "bits", |e| {
            qc(e, &[("bits", json!("4"))])
        }),
        case(
            "gptq dynamic -: module stored packed",
            GPTQ,
            Plan,
            CFG,
            "down_proj.qweight",
            |e| qc(e, &[("dynamic", json!({"-:.*down_proj.*": {}}))]),
        ),
        case(
            "gptq dynamic key not a regex",
            GPTQ,
            Build,
            CFG,
            "not a regex",
            |e| qc(e, &[("dynamic", json!({"+:.*down_proj(": {"bits": 8}}))]),
        ),
        case(
            "gptq dynamic bits 5",
            GPTQ,
            Build,
            UNSUPPORTED,
            "bits 5",
            |e| qc(e, &[("dynamic", json!({"+:.*down_proj": {"bits": 5}}))]),
        ),
        case(
            "auto-round fp8 packing",
            GPTQ,
            Build,
            UNSUPPORTED,
            "auto_round:fp8",
            |e| {
                qc(
                    e,
                    &[
                        ("quant_method", json!("auto-round")),
                        ("packing_format", json!("auto_round:fp8")),
                    ],
                )
            },
        ),
        case(
            "gptq qweight stored as F32",
            GPTQ,
            Plan,
            DTYPE,
            "down_proj.qweight",
            |e| {
                set_entry(&e.st(), &down("qweight"), "dtype", json!("F32"));
                e.model.clone()
            },
        ),
        case(
            "gptq qweight one row short",
            GPTQ,
            Plan,
            SHAPE,
            "down_proj.qweight",
            |e| {
                reshape_tensor(&e.st(), &down("qweight"), "I32", &[95, 256], 95 * 256 * 4);
                e.model.clone()
            },
        ),
        case(
            "gptq g_idx one input short",
            GPTQ,
            Plan,
            SHAPE,
            "g_idx's length",
            |e| {
                reshape_tensor(&e.st(), &down("g_idx"), "I32", &[767], 767 * 4);
                e.model.clone()
            },
        ),
        case(
            "gptq g_idx names group 6 of 6",
            GPTQ,
            Plan,
            VALUE,
            "down_proj.g_idx",
            |e| {
                edit_tensors(&e.st(), |ts| {
                    tensor_mut(ts, &down("g_idx")).data[12..16].copy_from_slice(&6i32.to_le_bytes())
                });
                e.model.clone()
            },
        ),
        case(
            "gptq g_idx negative",
            GPTQ,
            Plan,
            VALUE,
            "down_proj.g_idx",
            |e| {
                edit_tensors(&e.st(), |ts| {
                    tensor_mut(ts, &down("g_idx")).data[..4].copy_from_slice(&(-1i32).to_le_bytes())
                });
                e.model.clone()
            },
        ),
        case(
            "gptq scales one group short",
            GPTQ,
            Plan,
            SHAPE,
            "down_proj.scales",
            |e| {
                reshape_tensor(&e.st(), &down("scales"), "F16", &[5, 256], 5 * 256 * 2);
                e.model.clone()
            },
        ),
        case(
            "gptq scales transposed",
            GPTQ,
            Plan,
            SHAPE,
            "down_proj.scales",
            |e| {
                set_entry(&e.st(), &down("scales"), "shape", json!([256, 6]));
                e.model.clone()
            },
        ),
        case(
            "gptq qzeros one word short",
            GPTQ,
            Plan,
            SHAPE,
            "down_proj.qzeros",
            |e| {
                reshape_tensor(&e.st(), &down("qzeros"), "I32", &[6, 31], 6 * 31 * 4);
                e.model.clone()
            },
        ),
        case(
            "gptq asym without qzeros",
            GPTQ,
            Plan,
            MISSING,
            "down_proj.qzeros",
            |e| {
                remove_tensor(&e.st(), &down("qzeros"));
                qc(e, &[("sym", json!(false))])
            },
        ),
    ]
}

/// The quant state of the 4-bit fixture's down_proj.
const BNB_STATE: &str = "model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4";

/// Replaces the bytes of the 4-bit fixture's down_proj quant state.
fn set_state(e: &Env, bytes: &[u8]) -> PathBuf {
    edit_tensors(&e.st(), |ts| {
        let t = tensor_mut(ts, BNB_STATE);
        t.data = bytes.to_vec();
        t.shape = vec![bytes.len()];
    });
    e.model.clone()
}

/// Edits the 4-bit fixture's down_proj quant state as JSON.
fn edit_state(e: &Env, edit: impl FnOnce(&mut Map<String, Value>)) -> PathBuf {
    let st = e.st();
    let bytes = std::fs::read(&st).unwrap();
    let (h, data) = split(&bytes);
    let [a, b]: [u64; 2] = serde_json::from_value(h[BNB_STATE]["data_offsets"].clone()).unwrap();
    let mut v: Map<String, Value> = serde_json::from_slice(&data[a as usize..b as usize]).unwrap();
    edit(&mut v);
    set_state(e, Value::Object(v).to_string().as_bytes())
}

fn bnb_cases() -> Vec<Case> {
    use Rule::{
        Config as CFG, MissingTensor as MISSING, TensorDtype as DTYPE, TensorShape as SHAPE,
        TensorValue as VALUE, Unsupported as UNSUPPORTED,
    };
    use Stage::{Build, Plan};
    fn qc(e: &Env, key: &str, v: Value) -> PathBuf {
        edit_json(&e.config(), |c| c["quantization_config"][key] = v);
        e.model.clone()
    }
    fn reshape(e: &Env, param: &str, dtype: &'static str, shape: &[usize], len: usize) -> PathBuf {
        reshape_tensor(&e.st(), &down(param), dtype, shape, len);
        e.model.clone()
    }
    fn remove(e: &Env, param: &str) -> PathBuf {
        remove_tensor(&e.st(), &down(param));
        e.model.clone()
    }
    vec![
        case(
            "bnb quant state not UTF-8",
            BNB4,
            Plan,
            VALUE,
            "not UTF-8",
            |e| set_state(e, b"{\"quant_type\": \"nf4\xff\"}"),
        ),
        case(
            "bnb quant state not JSON",
            BNB4,
            Plan,
            VALUE,
            "not JSON",
            |e| set_state(e, b"{\"quant_type\": nf4"),
        ),
        case(
            "bnb quant state a list",
            BNB4,
            Plan,
            VALUE,
            "not a JSON object",
            |e| set_state(e, b"[64]"),
        ),
        case(
            "bnb quant state key twice",
            BNB4,
            Plan,
            VALUE,
            "twice",
            |e| set_state(e, b"{\"blocksize\": 64, \"blocksize\": 64}"),
        ),
        case(
            "bnb quant state unknown key",
            BNB4,
            Plan,
            VALUE,
            "\"scale\"",
            |e| {
                edit_state(e, |s| {
                    s.insert("scale".into(), json!(1.0));
                })
            },
        ),
        case(
            "bnb quant state without blocksize",
            BNB4,
            Plan,
            VALUE,
            "blocksize",
            |e| {
                edit_state(e, |s| {
                    s.remove("blocksize");
                })
            },
        ),
        case(
            "bnb quant_type fp4 in an nf4 state",
            BNB4,
            Plan,
            VALUE,
            "quant_type",
            |e| {
                edit_state(e, |s| {
                    s.insert("quant_type".into(), json!("fp4"));
                })
            },
        ),
        case("bnb blocksize 0", BNB4, Plan, VALUE, "blocksize 0", |e| {
            edit_state(e, |s| {
                s.insert("blocksize".into(), json!(0));
            })
        }),
        case("bnb blocksize 96", BNB4, Plan, VALUE, "blocksize 96", |e| {
            edit_state(e, |s| {
                s.insert("blocksize".into(), json!(96));
            })
        }),
        case(
            "bnb blocksize as text",
            BNB4,
            Plan,
            VALUE,
            "blocksize",
            |e| {
                edit_state(e, |s| {
                    s.insert("blocksize".into(), json!("64"));
                })
            },
        ),
        case("bnb state dtype int8", BNB4, Plan, VALUE, "dtype", |e| {
            edit_state(e, |s| {
                s.insert("dtype".into(), json!("int8"));
            })
        }),
        case(
            "bnb nested_dtype float16",
            BNB4,
            Plan,
            VALUE,
            "nested_dtype",
            |e| {
                edit_state(e, |s| {
                    s.insert("nested_dtype".into(), json!("float16"));
                })
            },
        ),
        case(
            "bnb nested_offset missing",
            BNB4,
            Plan,
            VALUE,
            "nested_offset",
            |e| {
                edit_state(e, |s| {
                    s.remove("nested_offset");
                })
            },
        ),
        case(
            "bnb state shape one column more",
            BNB4,
            Plan,
            SHAPE,
            "down_proj.weight",
            |e| {
                edit_state(e, |s| {
                    s.insert("shape".into(), json!([320, 705]));
                })
            },
        ),
        case(
            "bnb state shape with a zero",
            BNB4,
            Plan,
            SHAPE,
            "shape",
            |e| {
                edit_state(e, |s| {
                    s.insert("shape".into(), json!([320, 0]));
                })
            },
        ),
        case(
            "bnb state shape negative",
            BNB4,
            Plan,
            SHAPE,
            "shape",
            |e| {
                edit_state(e, |s| {
                    s.insert("shape".into(), json!([-320, 704]));
                })
            },
        ),
        case(
            "bnb codes one byte short",
            BNB4,
            Plan,
            SHAPE,
            "down_proj.weight",
            |e| reshape(e, "weight", "U8", &[112639, 1], 112639),
        ),
        case(
            "bnb codes stored as BOOL",
            BNB4,
            Plan,
            DTYPE,
            "down_proj.weight",
            |e| reshape(e, "weight", "BOOL", &[112640, 1], 112640),
        ),
        case(
            "bnb absmax one block short",
            BNB4,
            Plan,
            SHAPE,
            "absmax",
            |e| reshape(e, "weight.absmax", "U8", &[3519], 3519),
        ),
        case(
            "bnb absmax one block long",
            BNB4,
            Plan,
            SHAPE,
            "absmax",
            |e| reshape(e, "weight.absmax", "U8", &[3521], 3521),
        ),
        case(
            "bnb nested absmax one short",
            BNB4,
            Plan,
            SHAPE,
            "nested_absmax",
            |e| reshape(e, "weight.nested_absmax", "F32", &[13], 13 * 4),
        ),
        case(
            "bnb nested absmax one long",
            BNB4,
            Plan,
            SHAPE,
            "nested_absmax",
            |e| reshape(e, "weight.nested_absmax", "F32", &[15], 15 * 4),
        ),
        case(
            "bnb nested quant map short",
            BNB4,
            Plan,
            SHAPE,
            "nested_quant_map",
            |e| reshape(e, "weight.nested_quant_map", "F32", &[255], 255 * 4),
        ),
        case(
            "bnb nested absmax as F16",
            BNB4,
            Plan,
            DTYPE,
            "nested_absmax",
            |e| reshape(e, "weight.nested_absmax", "F16", &[14], 14 * 2),
        ),
        case(
            "bnb without quant_map",
            BNB4,
            Plan,
            MISSING,
            "quant_map",
            |e| remove(e, "weight.quant_map"),
        ),
        case(
            "bnb without quant state",
            BNB4,
            Plan,
            MISSING,
            "quant_state",
            |e| remove(e, "weight.quant_state.bitsandbytes__nf4"),
        ),
        case(
            "bnb without nested absmax",
            BNB4,
            Plan,
            MISSING,
            "nested_absmax",
            |e| remove(e, "weight.nested_absmax"),
        ),
        case("bnb without absmax", BNB4, Plan, MISSING, "absmax", |e| {
            remove(e, "weight.absmax")
        }),
        case("bnb quant map of 8", BNB4, Plan, SHAPE, "quant_map", |e| {
            reshape(e, "weight.quant_map", "F32", &[8], 8 * 4)
        }),
        case(
            "int8 without SCB",
            BNB8,
            Plan,
            MISSING,
            "down_proj.SCB",
            |e| remove(e, "SCB"),
        ),
        case(
            "int8 SCB one row short",
            BNB8,
            Plan,
            SHAPE,
            "down_proj.SCB",
            |e| reshape(e, "SCB", "F32", &[319], 319 * 4),
        ),
        case(
            "int8 SCB as BF16",
            BNB8,
            Plan,
            DTYPE,
            "down_proj.SCB",
            |e| reshape(e, "SCB", "BF16", &[320], 320 * 2),
        ),
        case(
            "int8 weight_format 1",
            BNB8,
            Plan,
            VALUE,
            "weight_format",
            |e| {
                edit_tensors(&e.st(), |ts| {
                    tensor_mut(ts, &down("weight_format")).data = vec![1]
                });
                e.model.clone()
            },
        ),
        case(
            "int8 weight as U8 [out, in]",
            BNB8,
            Plan,
            DTYPE,
            "down_proj.weight",
            |e| {
                set_entry(&e.st(), &down("weight"), "dtype", json!("U8"));
                e.model.clone()
            },
        ),
        case(
            "int8 SCB without its weight",
            BNB8,
            Plan,
            MISSING,
            "down_proj.weight",
            |e| remove(e, "weight"),
        ),
        case("bnb quant type nf5", BNB4, Build, UNSUPPORTED, "nf5", |e| {
            qc(e, "bnb_4bit_quant_type", json!("nf5"))
        }),
        case("bnb 4 and 8 bits at once", BNB4, Build, CFG, "both", |e| {
            qc(e, "load_in_8bit", json!(true))
        }),
        case("bnb quant storage int3", BNB4, Build, CFG, "int3", |e| {
            qc(e, "bnb_4bit_quant_storage", json!("int3"))
        }),
        case(
            "bnb skip modules bad regex",
            BNB4,
            Build,
            CFG,
            "llm_int8_skip_modules",
            |e| qc(e, "llm_int8_skip_modules", json!(["lm_head", "(unclosed"])),
        ),
        case(
            "bnb skip modules not a list",
            BNB4,
            Build,
            CFG,
            "llm_int8_skip_modules",
            |e| qc(e, "llm_int8_skip_modules", json!("lm_head")),
        ),
    ]
}

/// Sets `hf_quant_config.json`'s `quant_algo`.
fn set_algo(e: &Env, algo: &str) {
    edit_json(&e.file("hf_quant_config.json"), |v| {
        v["quantization"]["quant_algo"] = json!(algo)
    });
}

/// fp8-dynamic's tensors (E4M3 weights, `[out, 1]` scales, widened to f32
/// as fbgemm stores them) under an fbgemm_fp8 config.
fn as_fbgemm(e: &Env) {
    edit_tensors(&e.st(), |ts| {
        for t in ts.iter_mut().filter(|t| t.name.ends_with(".weight_scale")) {
            assert_eq!(t.dtype, "BF16");
            t.data = t
                .data
                .chunks(2)
                .flat_map(|b| ((u16::from_le_bytes([b[0], b[1]]) as u32) << 16).to_le_bytes())
                .collect();
            t.dtype = "F32";
        }
    });
    as_fbgemm_config(e);
}

/// ct-mxfp8's tensors (E4M3 weights, E8M0 scales per 32) are ModelOpt
/// MXFP8's: the same files under ModelOpt's configs.
fn as_modelopt_mxfp8(e: &Env) {
    edit_json(&e.config(), |v| {
        v["quantization_config"] = json!({"quant_method": "modelopt", "quant_algo": "MXFP8"})
    });
    std::fs::write(
        e.file("hf_quant_config.json"),
        serde_json::to_vec(&json!({
            "producer": {"name": "modelopt", "version": "0.47.0"},
            "quantization": {"quant_algo": "MXFP8", "exclude_modules": ["lm_head"]},
        }))
        .unwrap(),
    )
    .unwrap();
}

/// fp8-dynamic's config replaced by an AMD Quark FP8 one with weight
/// `qscheme` (its BF16 `[out, 1]` scales are Quark's per-channel layout).
fn as_quark(e: &Env, qscheme: &str) {
    edit_json(&e.config(), |v| {
        v["quantization_config"] = json!({
            "quant_method": "quark",
            "export": {"weight_format": "real_quantized", "pack_method": "reorder"},
            "global_quant_config": {"weight": {"dtype": "fp8_e4m3", "qscheme": qscheme}},
            "layer_quant_config": {}, "exclude": ["lm_head"],
        })
    });
}

/// fp8-dynamic's config replaced by an fbgemm_fp8 one (its BF16 scales kept).
fn as_fbgemm_config(e: &Env) {
    edit_json(&e.config(), |v| {
        v["quantization_config"] = json!({
            "quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
            "modules_to_not_convert": ["lm_head"],
        })
    });
}

/// The rest of the FP8 and MX family (issue 26): ModelOpt FP8 / MXFP8 /
/// FP8_PB_WO / INT4 AWQ, compressed-tensors mxfp8-quantized, fbgemm_fp8.
fn fp8_family_cases() -> Vec<Case> {
    use Rule::{
        Config as CFG, MissingTensor as MISSING, TensorDtype as DTYPE, TensorShape as SHAPE,
        Unsupported as UNSUP,
    };
    use Stage::{Build, Plan};
    vec![
        case(
            "modelopt quant_algo unknown",
            MO_FP8,
            Build,
            UNSUP,
            "quant_algo",
            |e| {
                set_algo(e, "FP6_SOMETHING");
                e.model.clone()
            },
        ),
        case(
            "modelopt fp8 weight_scale missing",
            MO_FP8,
            Plan,
            MISSING,
            "down_proj.weight_scale",
            |e| {
                remove_tensor(&e.st(), &down("weight_scale"));
                e.model.clone()
            },
        ),
        case(
            "modelopt fp8 weight_scale as BF16",
            MO_FP8,
            Plan,
            DTYPE,
            "down_proj.weight_scale",
            |e| {
                reshape_tensor(&e.st(), &down("weight_scale"), "BF16", &[], 2);
                e.model.clone()
            },
        ),
        case(
            "modelopt fp8 per-tensor scale with one per row",
            MO_FP8,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                reshape_tensor(&e.st(), &down("weight_scale"), "F32", &[256], 256 * 4);
                e.model.clone()
            },
        ),
        case(
            "modelopt fp8 weight stored as U8",
            MO_FP8,
            Plan,
            DTYPE,
            "down_proj.weight",
            |e| {
                set_entry(&e.st(), &down("weight"), "dtype", json!("U8"));
                e.model.clone()
            },
        ),
        case(
            "modelopt per-channel scale per tensor",
            MO_FP8,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                set_algo(e, "FP8_PER_CHANNEL_PER_TOKEN");
                e.model.clone()
            },
        ),
        case(
            "modelopt per-channel scale one row short",
            MO_FP8,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                set_algo(e, "FP8_PER_CHANNEL_PER_TOKEN");
                reshape_tensor(&e.st(), &down("weight_scale"), "F32", &[255], 255 * 4);
                e.model.clone()
            },
        ),
        case(
            "modelopt fp8_pb_wo scale not of 128x128 blocks",
            MO_FP8,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                set_algo(e, "FP8_PB_WO");
                // down_proj is 256x512: [2, 1, 4, 1]; this is 64-column blocks.
                reshape_tensor(&e.st(), &down("weight_scale"), "F32", &[2, 1, 8, 1], 64);
                e.model.clone()
            },
        ),
        case(
            "modelopt mxfp8 scale width for 16 columns",
            CT_MX8,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                as_modelopt_mxfp8(e);
                // down_proj is 256x704: 22 scales per row, not 44.
                reshape_tensor(&e.st(), &down("weight_scale"), "U8", &[256, 44], 256 * 44);
                e.model.clone()
            },
        ),
        case(
            "modelopt mxfp8 scale as F32",
            MO_FP8,
            Plan,
            DTYPE,
            "down_proj.weight_scale",
            |e| {
                set_algo(e, "MXFP8");
                e.model.clone()
            },
        ),
        case(
            "modelopt int4 awq over fp8 weights",
            MO_FP8,
            Plan,
            DTYPE,
            "down_proj.weight",
            |e| {
                set_algo(e, "W4A16_AWQ");
                e.model.clone()
            },
        ),
        case(
            "ct mxfp8 scale one group short",
            CT_MX8,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                reshape_tensor(&e.st(), &down("weight_scale"), "U8", &[256, 21], 256 * 21);
                e.model.clone()
            },
        ),
        case(
            "ct mxfp8 scale as BF16",
            CT_MX8,
            Plan,
            DTYPE,
            "down_proj.weight_scale",
            |e| {
                reshape_tensor(&e.st(), &down("weight_scale"), "BF16", &[256, 22], 256 * 44);
                e.model.clone()
            },
        ),
        case("ct mxfp8 group_size 16", CT_MX8, Plan, CFG, "E8M0", |e| {
            edit_json(&e.config(), |v| weights_of(v)["group_size"] = json!(16));
            e.model.clone()
        }),
        case(
            "fbgemm weight_scale as BF16",
            FP8,
            Plan,
            DTYPE,
            "down_proj.weight_scale",
            |e| {
                as_fbgemm_config(e);
                e.model.clone()
            },
        ),
        case(
            "fbgemm weight_scale one row short",
            FP8,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                as_fbgemm(e);
                reshape_tensor(&e.st(), &down("weight_scale"), "F32", &[255, 1], 255 * 4);
                e.model.clone()
            },
        ),
        case(
            "fbgemm weight_scale missing",
            FP8,
            Plan,
            MISSING,
            "down_proj.weight_scale",
            |e| {
                as_fbgemm(e);
                remove_tensor(&e.st(), &down("weight_scale"));
                e.model.clone()
            },
        ),
        case(
            "quark fp8 per-channel scale one row short",
            FP8,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                as_quark(e, "per_channel");
                reshape_tensor(&e.st(), &down("weight_scale"), "BF16", &[255, 1], 255 * 2);
                e.model.clone()
            },
        ),
        case(
            "quark fp8 per_tensor against per-row scales",
            FP8,
            Plan,
            SHAPE,
            "down_proj.weight_scale",
            |e| {
                as_quark(e, "per_tensor");
                e.model.clone()
            },
        ),
        case(
            "quark fake_quantized export",
            FP8,
            Build,
            UNSUP,
            "weight_format",
            |e| {
                as_quark(e, "per_channel");
                edit_json(&e.config(), |v| {
                    v["quantization_config"]["export"]["weight_format"] = json!("fake_quantized")
                });
                e.model.clone()
            },
        ),
        case("quark weight dtype int4", FP8, Build, UNSUP, "int4", |e| {
            as_quark(e, "per_group");
            edit_json(&e.config(), |v| {
                v["quantization_config"]["global_quant_config"]["weight"]["dtype"] = json!("int4")
            });
            e.model.clone()
        }),
        case(
            "fbgemm activation_scale_ub negative",
            FP8,
            Build,
            CFG,
            "activation_scale_ub",
            |e| {
                edit_json(&e.config(), |v| {
                    v["quantization_config"] =
                        json!({"quant_method": "fbgemm_fp8", "activation_scale_ub": -1.0})
                });
                e.model.clone()
            },
        ),
    ]
}

/// compressed-tensors' sparse formats and transforms (issue 27): masks,
/// values, offsets and rotations that disagree.
fn sparse_and_transform_cases() -> Vec<Case> {
    use Stage::{Build, Plan};
    fn sparsity(e: &Env, format: &str) -> PathBuf {
        edit_json(&e.config(), |v| {
            v["quantization_config"]["sparsity_config"]["format"] = json!(format)
        });
        e.model.clone()
    }
    vec![
        case(
            "sparse: bitmask a byte short",
            SPARSE,
            Plan,
            Rule::TensorShape,
            "bitmask",
            |e| {
                reshape_tensor(&e.st(), &down("bitmask"), "U8", &[256, 95], 256 * 95);
                e.model.clone()
            },
        ),
        case(
            "sparse: bitmask a byte long",
            SPARSE,
            Plan,
            Rule::TensorShape,
            "bitmask",
            |e| {
                reshape_tensor(&e.st(), &down("bitmask"), "U8", &[256, 97], 256 * 97);
                e.model.clone()
            },
        ),
        case(
            "sparse: bitmask stored as I8",
            SPARSE,
            Plan,
            Rule::TensorDtype,
            "bitmask",
            |e| {
                set_entry(&e.st(), &down("bitmask"), "dtype", json!("I8"));
                e.model.clone()
            },
        ),
        case(
            "sparse: a value short per row",
            SPARSE,
            Plan,
            Rule::TensorShape,
            "compressed",
            |e| {
                reshape_tensor(
                    &e.st(),
                    &down("compressed"),
                    "F8_E4M3",
                    &[256, 383],
                    256 * 383,
                );
                e.model.clone()
            },
        ),
        case(
            "sparse: fp8 group over BF16 values",
            SPARSE,
            Plan,
            Rule::TensorDtype,
            "compressed",
            |e| {
                reshape_tensor(
                    &e.st(),
                    &down("compressed"),
                    "BF16",
                    &[256, 384],
                    256 * 384 * 2,
                );
                e.model.clone()
            },
        ),
        case(
            "sparse: a group keeping 3 of 4",
            SPARSE,
            Plan,
            Rule::Sparse,
            "keeps 3 of columns 0..4",
            |e| {
                edit_tensors(&e.st(), |ts| {
                    let t = tensor_mut(ts, &down("bitmask"));
                    t.data[0] = t.data[0] & 0xf0 | 0x07;
                });
                e.model.clone()
            },
        ),
        case(
            "sparse: shape wider than the mask",
            SPARSE,
            Plan,
            Rule::TensorShape,
            "bitmask",
            |e| {
                set_i64(&e.st(), &down("shape"), &[256, 776]);
                e.model.clone()
            },
        ),
        case(
            "sparse: shape of three values",
            SPARSE,
            Plan,
            Rule::TensorValue,
            "shape",
            |e| {
                set_i64(&e.st(), &down("shape"), &[1, 256, 768]);
                e.model.clone()
            },
        ),
        case(
            "sparse: shape missing",
            SPARSE,
            Plan,
            Rule::MissingTensor,
            "shape",
            |e| {
                remove_tensor(&e.st(), &down("shape"));
                e.model.clone()
            },
        ),
        case(
            "sparse: marlin-24",
            SPARSE,
            Build,
            Rule::Unsupported,
            "marlin-24",
            |e| sparsity(e, "marlin-24"),
        ),
        case(
            "sparse: unstructured named, 2:4 stored",
            SPARSE,
            Plan,
            Rule::MissingTensor,
            "row_offsets",
            |e| sparsity(e, "sparse-bitmask"),
        ),
        case(
            "sparse: a bitmask without a sparse format",
            SPARSE,
            Plan,
            Rule::Config,
            "sparsity_config",
            |e| sparsity(e, "dense"),
        ),
        case(
            "sparse: row_offsets that disagree",
            SPARSE_BITMASK,
            Plan,
            Rule::Sparse,
            "row_offsets",
            |e| {
                edit_tensors(&e.st(), |ts| {
                    let t = tensor_mut(ts, &down("row_offsets"));
                    t.data[8] = t.data[8].wrapping_add(1);
                });
                e.model.clone()
            },
        ),
        case(
            "sparse: more values than the mask keeps",
            SPARSE_BITMASK,
            Plan,
            Rule::Sparse,
            "keeps",
            |e| {
                edit_tensors(&e.st(), |ts| {
                    let t = tensor_mut(ts, &down("compressed"));
                    t.data.push(0x38);
                    t.shape[0] += 1;
                });
                e.model.clone()
            },
        ),
        case(
            "transform: random-matrix type",
            QUIP,
            Build,
            Rule::Unsupported,
            "random-matrix",
            |e| {
                edit_json(&e.config(), |v| {
                    v["quantization_config"]["transform_config"]["config_groups"]["u"]["type"] =
                        json!("random-matrix")
                });
                e.model.clone()
            },
        ),
        case(
            "transform: an unknown location",
            QUIP,
            Build,
            Rule::Unsupported,
            "attn_head",
            |e| {
                edit_json(&e.config(), |v| {
                    v["quantization_config"]["transform_config"]["config_groups"]["v"]["apply"][0]
                        ["location"] = json!("attn_head")
                });
                e.model.clone()
            },
        ),
        case(
            "transform: the stored matrix missing",
            QUIP,
            Plan,
            Rule::MissingTensor,
            "v_input",
            |e| {
                remove_tensor(&e.st(), "model.layers.0.self_attn.q_proj.v_input.weight");
                e.model.clone()
            },
        ),
        case(
            "transform: a matrix entry not ±1",
            QUIP,
            Plan,
            Rule::TensorValue,
            "±1",
            |e| {
                edit_tensors(&e.st(), |ts| {
                    let t = tensor_mut(ts, "model.layers.0.self_attn.q_proj.u_output.weight");
                    t.data[..8].copy_from_slice(&0.25f64.to_le_bytes());
                });
                e.model.clone()
            },
        ),
        case(
            "transform: a block that does not divide",
            QUIP,
            Plan,
            Rule::TensorShape,
            "block 100",
            |e| {
                edit_json(&e.config(), |v| {
                    v["quantization_config"]["transform_config"]["config_groups"]["v"]["head_dim"] =
                        json!(100)
                });
                e.model.clone()
            },
        ),
    ]
}

fn corpus() -> Vec<Case> {
    [
        sparse_and_transform_cases(),
        release_cases(),
        fp8_family_cases(),
        gptq_cases(),
        bnb_cases(),
        container_cases(),
        ct_cases(),
        tensor_cases(),
        config_cases(),
        index_cases(),
        side_file_cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

// ---------------------------------------------------------------------------
// Checking one case
// ---------------------------------------------------------------------------

/// Opens, plans and reports `path` through the library (as `inspect` does);
/// returns where it was refused and why (`None`: nothing refused).
fn library_fault(path: &Path) -> (Stage, Option<Error>, Vec<Rule>) {
    let ckpt = match Checkpoint::open(path) {
        Ok(c) => c,
        Err(e) => return (Stage::Open, Some(e), Vec::new()),
    };
    let plan = match Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub) {
        Ok(p) => p,
        Err(e) => return (Stage::Build, Some(e), Vec::new()),
    };
    let report = Report::new(&plan);
    let text = report.text();
    serde_json::to_string(&report).expect("the report serializes");
    let rules: Vec<Rule> = plan.errors.iter().map(|e| e.rule).collect();
    for e in &plan.errors {
        assert!(
            text.contains(&e.to_string()),
            "the report does not list {e}:\n{text}"
        );
    }
    match plan.check() {
        Ok(()) => (Stage::Write, None, rules),
        Err(e) => (Stage::Plan, Some(e), rules),
    }
}

fn one_line(msg: &str) {
    assert!(!msg.contains('\n'), "not one line: {msg:?}");
}

fn no_crash(o: &Output, what: &str) {
    let err = stderr(o);
    assert!(!err.contains("panicked"), "{what} panicked:\n{err}");
    assert!(
        o.status.code().is_some_and(|c| c != 101),
        "{what} crashed ({}):\n{err}",
        o.status
    );
}

/// Every check of one case; panics with what went wrong.
fn check_case(case: &Case) {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::new(tmp.path(), case.fixture);
    let path = (case.make)(&env);
    let p = path.to_str().unwrap();
    let before = tree(&env.root);
    let id = case.rule.id();
    let tag = format!("[{id}]");
    let code = i32::from(case.rule.exit_code());

    // Library: open, plan, report.
    let (stage, err, rules) =
        caught(|| library_fault(&path)).unwrap_or_else(|p| panic!("the library panicked: {p}"));
    assert_eq!(stage, case.stage, "refused at the wrong stage: {err:?}");
    if let Some(e) = &err {
        let msg = e.to_string();
        assert_eq!(e.rule, case.rule, "wrong rule: {msg}");
        one_line(&msg);
        assert!(msg.contains(&tag), "{msg}");
        assert!(
            msg.contains(case.needle),
            "does not name {:?}: {msg}",
            case.needle
        );
    }
    if stage == Stage::Plan {
        assert!(
            rules.iter().all(|r| *r == case.rule),
            "findings of other rules than {id}: {rules:?}"
        );
    }
    // Library: dequantize refuses the same way and leaves nothing.
    let d = dequantize_err(&path);
    assert_eq!(d.rule, case.rule, "dequantize: {d}");
    if let Some(e) = &err {
        // Not the whole message: when two tensors start at one offset, which
        // of them the container check names varies from run to run.
        assert_eq!(
            (&d.file, &d.tensor),
            (&e.file, &e.tensor),
            "dequantize and plan disagree: {d} / {e}"
        );
    } else {
        assert!(d.to_string().contains(case.needle), "{d}");
    }

    // Read piece by piece, as a browser does, a folder of plain files is
    // refused by the same rule (links and single files are a filesystem's).
    if path.is_dir() && !has_links(&path) {
        match crate::stream::streamed(&path, DtypeChoice::Auto, BackendChoice::Cpu, 1) {
            Ok(_) => panic!("streamed without a refusal"),
            Err(e) => {
                assert_eq!(e.rule, case.rule, "streamed: {e}");
                one_line(&e.to_string());
            }
        }
    }

    // validate: names the rule, exit status of the rule. (It does not look
    // at side files: see validate_reports_a_side_file_leading_outside.)
    if stage != Stage::Write {
        let o = run(&["validate", p]);
        no_crash(&o, "validate");
        let all = format!("{}{}", stdout(&o), stderr(&o));
        assert_eq!(o.status.code(), Some(code), "validate:\n{all}");
        assert!(all.contains(&tag), "validate does not name {id}:\n{all}");
        assert!(
            all.contains(case.needle),
            "validate: {:?}:\n{all}",
            case.needle
        );
        let o = run(&["validate", p, "--json"]);
        no_crash(&o, "validate --json");
        assert_eq!(o.status.code(), Some(code), "validate --json");
        let v: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("validate --json: {e}\n{}", stdout(&o)));
        assert_eq!(v["errors"][0]["rule"], id, "validate --json: {v}");
    }

    // inspect: never panics; refuses with one line, or lists the findings.
    for json in [false, true] {
        let mut args = vec!["inspect", p];
        if json {
            args.push("--json");
        }
        let o = run(&args);
        no_crash(&o, "inspect");
        match stage {
            Stage::Open | Stage::Build => {
                assert_eq!(o.status.code(), Some(code), "inspect: {}", stderr(&o));
                let err = stderr(&o);
                assert_eq!(err.lines().count(), 1, "inspect stderr:\n{err}");
                assert!(err.starts_with("error: ") && err.contains(&tag), "{err}");
                if json {
                    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
                    assert_eq!(v["errors"][0]["rule"], id, "inspect --json: {v}");
                }
            }
            Stage::Plan => {
                // The report is printed, and the status is validate's.
                assert_eq!(o.status.code(), Some(code), "inspect: {}", stderr(&o));
                if json {
                    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
                    assert_eq!(v["errors"][0]["rule"], id, "inspect --json");
                } else {
                    assert!(stdout(&o).contains(&tag), "inspect:\n{}", stdout(&o));
                }
            }
            Stage::Write => {
                assert_eq!(o.status.code(), Some(0), "inspect: {}", stderr(&o));
            }
        }
    }

    // dequantize: one error line with the rule, the rule's status, no output.
    let out_tmp = tempfile::tempdir().unwrap();
    let out = out_tmp.path().join("dense");
    let o = run(&[
        "dequantize",
        p,
        "-o",
        out.to_str().unwrap(),
        "--backend",
        "cpu",
    ]);
    no_crash(&o, "dequantize");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(code), "dequantize:\n{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "dequantize stderr:\n{err}");
    assert!(errors[0].contains(&tag), "{err}");
    assert!(errors[0].contains(case.needle), "{err}");
    if stage != Stage::Write {
        assert_eq!(err.lines().count(), 1, "dequantize stderr:\n{err}");
    }
    assert!(!out.exists(), "dequantize left {} behind", out.display());
    assert_eq!(snapshot(out_tmp.path()), vec![], "left beside the output");

    // The input, and everything beside it, is as it was.
    let after = tree(&env.root);
    let diff = tree_diff(&before, &after);
    assert!(diff.is_empty(), "the input changed: {diff:?}");
}

fn has_links(dir: &Path) -> bool {
    let entries = std::fs::read_dir(dir).unwrap();
    entries
        .map(|e| e.unwrap())
        .any(|e| e.file_type().unwrap().is_symlink())
}

/// Runs every case of `cases`, then fails listing each that failed.
fn run_cases(cases: Vec<Case>) {
    let mut failed = Vec::new();
    let n = cases.len();
    for case in &cases {
        if let Err(p) = caught(|| check_case(case)) {
            failed.push(format!("{} ({}): {p}", case.name, case.fixture));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {n} cases failed:\n{}",
        failed.len(),
        failed.join("\n\n")
    );
}

#[test]
fn corpus_names_are_unique() {
    let mut names: Vec<&str> = corpus().iter().map(|c| c.name).collect();
    names.sort();
    let n = names.len();
    names.dedup();
    assert_eq!(names.len(), n, "a case name is used twice");
}

#[test]
fn container_faults_are_st_001() {
    run_cases(container_cases());
}

#[test]
fn ct_rule_faults() {
    run_cases(ct_cases());
}

#[test]
fn missing_and_misshaped_tensors() {
    run_cases(tensor_cases());
}

#[test]
fn config_faults() {
    run_cases(config_cases());
}

#[test]
fn gptq_format_faults() {
    run_cases(gptq_cases());
}

#[test]
fn fp8_family_format_faults() {
    run_cases(fp8_family_cases());
}

#[test]
fn bnb_format_faults() {
    run_cases(bnb_cases());
}

#[test]
fn release_format_faults() {
    run_cases(release_cases());
}

#[test]
fn sparse_and_transform_faults() {
    run_cases(sparse_and_transform_cases());
}

#[test]
fn index_and_link_faults() {
    run_cases(index_cases());
}

#[test]
fn side_files_leading_outside_are_refused_before_writing() {
    run_cases(side_file_cases());
}

// ---------------------------------------------------------------------------
// Links the Hugging Face cache makes are not hostile
// ---------------------------------------------------------------------------

#[test]
fn hugging_face_cache_layout_of_a_sharded_checkpoint_is_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::new(tmp.path(), SHARDED);
    let snap = hf_cache(&env.root, &env.model);
    let before = tree(&env.root);
    let got = tmp.path().join("from-cache");
    let want = tmp.path().join("from-fixture");
    for (input, out) in [
        (&snap, &got),
        (&fixtures().join(SHARDED).join("model"), &want),
    ] {
        let o = run(&[
            "dequantize",
            input.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--backend",
            "cpu",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    // The model cards differ: one names the cache's repository.
    let dense = |dir: &Path| {
        let mut files = snapshot(dir);
        files.retain(|(name, _)| name != "README.md");
        files
    };
    assert_eq!(dense(&got), dense(&want), "the cache decodes differently");
    assert!(got.join("README.md").is_file(), "no model card");
    let mut after = tree(&env.root);
    for out in ["from-cache", "from-fixture"] {
        after.retain(|p, _| !p.starts_with(out));
    }
    assert_eq!(tree_diff(&before, &after), Vec::<String>::new());
}

// ---------------------------------------------------------------------------
// Failed writes
// ---------------------------------------------------------------------------

/// The binary run with `args` under a file-size limit of `blocks` × 512
/// bytes (SIGXFSZ ignored, so an oversized write fails with EFBIG instead).
fn limited(blocks: u32, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "trap '' XFSZ; ulimit -f {blocks}; exec \"$0\" \"$@\""
        ))
        .arg(bin())
        .args(args)
        .output()
        .unwrap()
}

/// The one `error:` line of `o`'s stderr.
fn error_line(o: &Output) -> String {
    let err = stderr(o);
    assert!(!err.contains("panicked"), "panicked:\n{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "not one error line:\n{err}");
    errors[0].to_string()
}

fn dequantize_args<'a>(input: &'a str, out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["dequantize", input, "-o", out, "--backend", "cpu"];
    v.extend_from_slice(extra);
    v
}

#[test]
fn write_failing_midway_is_io_001_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::new(tmp.path(), W4);
    let before = tree(&env.root);
    // The output shard is 1.9 MB; 1000 blocks are 512 000 bytes.
    let top = tmp.path().join("made");
    let out = top.join("for/dense");
    let o = limited(
        1000,
        &dequantize_args(env.model.to_str().unwrap(), out.to_str().unwrap(), &[]),
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let line = error_line(&o);
    assert!(line.contains("[IO-001]"), "{line}");
    assert!(
        line.contains(out.to_str().unwrap()) && line.contains(MODEL),
        "does not name the output file: {line}"
    );
    assert!(
        !top.exists(),
        "{} (made for the output) left",
        top.display()
    );
    let mut after = tree(&env.root);
    after.retain(|p, _| !p.starts_with("made"));
    assert_eq!(tree_diff(&before, &after), Vec::<String>::new());
}

// ---------------------------------------------------------------------------
// --force
// ---------------------------------------------------------------------------

/// An output directory holding files of the names `dequantize` writes and
/// files of its own.
fn occupied(out: &Path) {
    std::fs::create_dir_all(out.join("sub")).unwrap();
    std::fs::write(out.join("keep.txt"), b"precious").unwrap();
    std::fs::write(out.join("sub/deep.txt"), b"deep").unwrap();
    std::fs::write(out.join(MODEL), b"old weights").unwrap();
    std::fs::write(out.join("config.json"), b"{\"old\": true}").unwrap();
}

#[test]
fn force_replaces_files_of_the_same_names_and_keeps_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::new(tmp.path(), W4);
    let input = tree(&env.root);
    let m = env.model.to_str().unwrap();
    let outs = tempfile::tempdir().unwrap();
    let out = outs.path().join("out");
    occupied(&out);
    let before = tree(&out);
    let o_path = out.to_str().unwrap();

    // Without --force: refused, nothing touched.
    let o = run(&dequantize_args(m, o_path, &[]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let line = error_line(&o);
    assert!(
        line.contains("[OUT-001]") && line.contains(o_path),
        "{line}"
    );
    assert_eq!(tree_diff(&before, &tree(&out)), Vec::<String>::new());

    // With it: written; same names replaced, the rest kept.
    let o = run(&dequantize_args(m, o_path, &["--force"]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let fresh = outs.path().join("fresh");
    let o = run(&dequantize_args(m, fresh.to_str().unwrap(), &[]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut want = tree(&fresh);
    want.insert("keep.txt".into(), Node::File(b"precious".to_vec()));
    want.insert("sub".into(), Node::Dir);
    want.insert("sub/deep.txt".into(), Node::File(b"deep".to_vec()));
    assert_eq!(tree_diff(&want, &tree(&out)), Vec::<String>::new());
    assert_eq!(tree_diff(&input, &tree(&env.root)), Vec::<String>::new());
}

#[test]
fn failed_force_run_leaves_the_output_directory_as_it_was() {
    // (what, fixture, break the input, file-size limit in blocks, status,
    // what the error names)
    type Run = (
        &'static str,
        &'static str,
        fn(&Env),
        Option<u32>,
        i32,
        &'static str,
    );
    let runs: [Run; 6] = [
        // Output shard 1.9 MB, limit 512 000 bytes.
        ("write failing midway", W4, |_| {}, Some(1000), 1, MODEL),
        // Output shards 0.72 and 1.08 MB, limit 921 600 bytes: the first
        // is staged whole, the second fails.
        (
            "second shard failing midway",
            SHARDED,
            |_| {},
            Some(1800),
            1,
            SHARD2,
        ),
        (
            "side file failing after the shards are written",
            W4,
            |e| std::fs::write(e.file("tokenizer.json"), vec![b' '; 3 << 20]).unwrap(),
            Some(5000),
            1,
            "tokenizer.json",
        ),
        (
            "truncated input",
            W4,
            |e| edit_bytes(&e.st(), |b| b[..b.len() / 2].to_vec()),
            None,
            3,
            "[ST-001]",
        ),
        (
            "module fault",
            W4,
            |e| remove_tensor(&e.st(), &down("weight_scale")),
            None,
            3,
            "[TEN-001]",
        ),
        (
            "side file leading outside",
            W4,
            |e| {
                std::os::unix::fs::symlink(e.outside.join("secret.json"), e.file("tokenizer.json"))
                    .unwrap()
            },
            None,
            3,
            "[ST-001]",
        ),
    ];
    for (what, fixture, brk, blocks, status, names) in runs {
        let tmp = tempfile::tempdir().unwrap();
        let env = Env::new(tmp.path(), fixture);
        brk(&env);
        let input = tree(&env.root);
        let outs = tempfile::tempdir().unwrap();
        let out = outs.path().join("out");
        occupied(&out);
        // Files the sharded run writes too.
        std::fs::write(out.join(SHARD1), b"old first shard").unwrap();
        std::fs::write(out.join(INDEX), b"{\"old\": 1}").unwrap();
        std::fs::write(out.join("README.md"), b"old card").unwrap();
        let before = tree(&out);
        let args = dequantize_args(
            env.model.to_str().unwrap(),
            out.to_str().unwrap(),
            &["--force"],
        );
        let o = match blocks {
            Some(b) => limited(b, &args),
            None => run(&args),
        };
        assert_eq!(o.status.code(), Some(status), "{what}: {}", stderr(&o));
        let line = error_line(&o);
        if status == 1 {
            assert!(line.contains("[IO-001]"), "{what}: {line}");
        }
        assert!(
            line.contains(names),
            "{what}: does not name {names}: {line}"
        );
        assert_eq!(
            tree_diff(&before, &tree(&out)),
            Vec::<String>::new(),
            "{what}: the output directory changed ({line})"
        );
        assert_eq!(
            tree_diff(&input, &tree(&env.root)),
            Vec::<String>::new(),
            "{what}: the input changed"
        );
    }
}

#[test]
fn writing_into_the_input_directory_is_refused() {
    for fixture in [W4, SHARDED] {
        let tmp = tempfile::tempdir().unwrap();
        let env = Env::new(tmp.path(), fixture);
        let link = tmp.path().join("link-to-model");
        std::os::unix::fs::symlink(&env.model, &link).unwrap();
        let before = tree(&env.root);
        let m = env.model.to_str().unwrap().to_string();
        let st = env.st().to_str().unwrap().to_string();
        let dot = format!("{m}/.");
        let l = link.to_str().unwrap().to_string();
        let mut runs: Vec<(&str, &str, bool)> = vec![
            (&m, &m, false),
            (&m, &m, true),
            (&m, &dot, true),
            (&m, &l, true),
            (&l, &m, true),
        ];
        if fixture == W4 {
            // A single file names its directory as the checkpoint's.
            runs.push((&st, &m, true));
        }
        for (input, out, force) in runs {
            let extra: &[&str] = if force { &["--force"] } else { &[] };
            let o = run(&dequantize_args(input, out, extra));
            let what = format!("{fixture}: {input} -o {out} force {force}");
            assert_eq!(o.status.code(), Some(1), "{what}: {}", stderr(&o));
            let line = error_line(&o);
            assert!(line.contains("[OUT-001]"), "{what}: {line}");
            assert_eq!(
                tree_diff(&before, &tree(&env.root)),
                Vec::<String>::new(),
                "{what}: changed the input ({line})"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Exit statuses
// ---------------------------------------------------------------------------

#[test]
fn exit_status_is_0_2_3_or_1() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::new(tmp.path(), W4);
    let m = env.model.to_str().unwrap();
    let outs = tempfile::tempdir().unwrap();
    let out = |n: &str| outs.path().join(n).to_str().unwrap().to_string();
    let status = |args: &[&str]| -> (Option<i32>, String) {
        let o = run(args);
        no_crash(&o, &args.join(" "));
        (o.status.code(), stderr(&o))
    };

    // 0: success.
    let ok = out("ok");
    for args in [
        dequantize_args(m, &ok, &[]),
        vec!["inspect", m],
        vec!["inspect", m, "--json"],
        vec!["validate", m],
    ] {
        let (code, err) = status(&args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
    }

    // 2: usage errors; nothing is written.
    let usage = out("usage");
    let sharded = fixtures().join(SHARDED).join("model");
    let sharded = sharded.to_str().unwrap();
    for args in [
        dequantize_args(m, &usage, &["--bogus"]),
        dequantize_args(m, &usage, &["--dtype", "f8"]),
        dequantize_args(m, &usage, &["--backend", "tpu"]),
        vec!["dequantize", m],
        vec!["inspect"],
        vec!["frobnicate", m],
        dequantize_args(
            sharded,
            &usage,
            &["--shards", "model-00009-of-00009.safetensors"],
        ),
    ] {
        let (code, err) = status(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(!Path::new(&usage).exists(), "{args:?} left {usage}");
    }

    // 3: a fault of the input, whatever the command.
    edit_bytes(&env.st(), |b| b[..b.len() / 2].to_vec());
    let bad = out("bad");
    for args in [
        dequantize_args(m, &bad, &[]),
        vec!["inspect", m],
        vec!["validate", m],
        vec!["validate", m, "--json"],
    ] {
        let (code, err) = status(&args);
        assert_eq!(code, Some(3), "{args:?}: {err}");
        assert!(!Path::new(&bad).exists(), "{args:?} left {bad}");
    }

    // 1: the output location (OUT-001), or the GPU (GPU-001).
    let fixture = fixtures().join(W4).join("model");
    let fixture = fixture.to_str().unwrap();
    let full = out("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(Path::new(&full).join("x"), b"x").unwrap();
    let (code, err) = status(&dequantize_args(fixture, &full, &[]));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("[OUT-001]"), "{err}");

    let gpu = out("gpu");
    let o = Command::new(bin())
        .args(["dequantize", fixture, "-o", &gpu, "--backend", "gpu"])
        .env("WGPU_ADAPTER_NAME", "no adapter is called this")
        .output()
        .unwrap();
    no_crash(&o, "--backend gpu without an adapter");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(error_line(&o).contains("[GPU-001]"), "{}", stderr(&o));
    assert!(!Path::new(&gpu).exists(), "--backend gpu left {gpu}");
}

// ---------------------------------------------------------------------------
// GPU faults
// ---------------------------------------------------------------------------

#[test]
fn gpu_faults_hand_over_to_the_cpu_with_the_same_bytes() {
    gpu_test(|adapter| {
        let cpu = Cpu::new();
        // Limits too small for any row: every decode fails with GPU-001.
        let bare = Gpu::open(&adapter).unwrap().with_limits(4, 1);
        for (case, model) in fixture_models() {
            let ckpt = Checkpoint::open(&model).unwrap();
            let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
            let decoded: Vec<_> = plan
                .outputs
                .iter()
                .filter(|o| o.row_layout().is_some())
                .collect();
            assert!(!decoded.is_empty(), "{case}: nothing decoded");
            for o in &decoded {
                let before = bare.decoder().dispatches().cpu;
                match o.bytes(&bare) {
                    Err(e) => {
                        assert_eq!(e.rule, Rule::Gpu, "{case}: {}: {e}", o.name);
                        one_line(&e.to_string());
                    }
                    // Where the device may flush subnormals, a tensor that
                    // could meet one is decoded on the CPU, limits or not.
                    Ok(bytes) => {
                        let on_cpu = bare.decoder().dispatches().cpu > before;
                        assert!(on_cpu, "{case}: {}: the tiny-limit GPU decoded it", o.name);
                        assert!(bytes == o.bytes(&cpu).unwrap(), "{case}: {}", o.name);
                    }
                }
            }

            let gpu = Gpu::open(&adapter).unwrap().with_limits(4, 1);
            let fallback = Fallback::new(gpu);
            // What the fallback tells, taken each time as a run does.
            let told = || {
                std::iter::from_fn(|| fallback.take_fallback())
                    .map(|e| e.rule)
                    .collect::<Vec<Rule>>()
            };
            assert!(!fallback.fell_back(), "{case}");
            for o in &plan.outputs {
                let got = o
                    .bytes(&fallback)
                    .unwrap_or_else(|e| panic!("{case}: {}: {e}", o.name));
                let want = o.bytes(&cpu).unwrap();
                assert!(got == want, "{case}: {} differs from the CPU's", o.name);
            }
            assert!(fallback.fell_back(), "{case}");
            assert_eq!(told(), vec![Rule::Gpu], "{case}: told once");

            // Through the writer: the files the CPU writes.
            let tmp = tempfile::tempdir().unwrap();
            let (a, b) = (tmp.path().join("fallback"), tmp.path().join("cpu"));
            writer::write(&plan, &fallback, &a, |_| {}).unwrap();
            writer::write(&plan, &cpu, &b, |_| {}).unwrap();
            assert!(snapshot(&a) == snapshot(&b), "{case}: written files differ");
            assert_eq!(told(), vec![], "{case}: told once");
        }
    });
}

#[test]
fn gpu_fallback_counts_one_notice_across_threads() {
    gpu_test(|adapter| {
        let model = fixtures().join(W4).join("model");
        let ckpt = Checkpoint::open(&model).unwrap();
        let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
        let gpu = Gpu::open(&adapter).unwrap().with_limits(4, 1);
        let fallback = Fallback::new(gpu);
        let cpu = Cpu::new();
        std::thread::scope(|s| {
            for o in &plan.outputs {
                let (fallback, cpu) = (&fallback, &cpu);
                s.spawn(move || assert!(o.bytes(fallback).unwrap() == o.bytes(cpu).unwrap()));
            }
        });
        let told = std::iter::from_fn(|| fallback.take_fallback()).count();
        assert_eq!(told, 1);
    });
}

// ---------------------------------------------------------------------------
// Known faults of the implementation (kept out of the passing suite)
// ---------------------------------------------------------------------------

/// `validate` should report what `dequantize` refuses: a side file leading
/// out of the checkpoint is an input fault (ST-001, exit 3).
#[test]

fn validate_reports_a_side_file_leading_outside() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::new(tmp.path(), W4);
    std::os::unix::fs::symlink(env.outside.join("secret.json"), env.file("tokenizer.json"))
        .unwrap();
    let o = run(&["validate", env.model.to_str().unwrap()]);
    no_crash(&o, "validate");
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(3), "validate:\n{all}");
    assert!(
        all.contains("[ST-001]") && all.contains("tokenizer.json"),
        "{all}"
    );
}

/// config.json is read and written to the output (without its
/// quantization_config): a link leading out of the checkpoint must be
/// refused as side files are, not copied.
#[test]

fn config_json_leading_outside_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::new(tmp.path(), W4);
    link_outside(&env, "config.json", false);
    let before = tree(&env.root);
    let outs = tempfile::tempdir().unwrap();
    let out = outs.path().join("dense");
    let o = run(&dequantize_args(
        env.model.to_str().unwrap(),
        out.to_str().unwrap(),
        &[],
    ));
    no_crash(&o, "dequantize");
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(error_line(&o).contains("config.json"), "{}", stderr(&o));
    assert!(!out.exists(), "{} written", out.display());
    assert_eq!(tree_diff(&before, &tree(&env.root)), Vec::<String>::new());
}

/// `--force` replaces files of the same names; a directory of such a name
/// (and what it holds) must not be deleted.
#[test]

fn force_keeps_a_directory_named_like_an_output_file() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::new(tmp.path(), W4);
    let outs = tempfile::tempdir().unwrap();
    let out = outs.path().join("out");
    std::fs::create_dir_all(out.join("config.json/sub")).unwrap();
    std::fs::write(out.join("config.json/sub/keep.txt"), b"precious").unwrap();
    let before = tree(&out);
    let o = run(&dequantize_args(
        env.model.to_str().unwrap(),
        out.to_str().unwrap(),
        &["--force"],
    ));
    no_crash(&o, "dequantize --force");
    let kept = std::fs::read(out.join("config.json/sub/keep.txt")).ok();
    assert_eq!(
        kept.as_deref(),
        Some(&b"precious"[..]),
        "exit {:?}; the directory's file was lost; OUT before {:?}, after {:?}",
        o.status.code(),
        before.keys().collect::<Vec<_>>(),
        tree(&out).keys().collect::<Vec<_>>()
    );
}

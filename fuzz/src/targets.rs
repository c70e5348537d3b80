//! The body of every fuzz target, one function each: `fuzz/fuzz_targets/`
//! hands them libFuzzer's inputs, and `tests/suite/fuzz_corpus.rs` hands
//! them every file of `fuzz/regressions/<target>/` on a stable toolchain.

use wgpu_dequant::gguf::{MetaArray, MetaValue, Model, Strings};

use super::{bnb_checkpoint, checkpoint_dir, exercise, fixtures, one_line, scratch};

/// A target's body: one input, read or refused.
pub type Body = fn(&[u8]);

/// Every target: (name, body). The name is the fuzz binary's and the
/// folder's under `fuzz/regressions/`.
pub const ALL: &[(&str, Body)] = &[
    ("header", header),
    ("config", config),
    ("index", index),
    ("sidecar", sidecar),
    ("checkpoint", checkpoint),
    ("bnb_state", bnb_state),
    ("gguf", gguf),
    ("gguf_hf", gguf_hf),
    ("tokenizer", tokenizer),
    ("mlx", mlx),
];

/// Any bytes as `model.safetensors` (with a valid config beside it).
pub fn header(data: &[u8]) {
    let dir = checkpoint_dir(&[
        ("model.safetensors", data),
        ("config.json", fixtures::W4A16_ASYM_CONFIG),
    ]);
    exercise(&dir);
}

/// Any bytes as `config.json` (compressed-tensors, FP8 block, AutoAWQ,
/// GPTQ/AutoRound, GPT-OSS, bitsandbytes, compressed-tensors mxfp8,
/// fbgemm_fp8, AMD Quark, MLX) or `hf_quant_config.json` (ModelOpt NVFP4,
/// FP8, MXFP8, INT4 AWQ), beside a real checkpoint.
pub fn config(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let (weights, name) = match which % 17 {
        0 => (fixtures::W4A16_ASYM, "config.json"),
        1 => (fixtures::W3A16, "config.json"),
        2 => (fixtures::FP8_BLOCK, "config.json"),
        3 => (fixtures::AWQ, "config.json"),
        4 => (fixtures::GPT_OSS, "config.json"),
        5 => (fixtures::GPTQ, "config.json"),
        6 => (fixtures::BNB_NF4, "config.json"),
        7 => (fixtures::BNB_INT8, "config.json"),
        8 => (fixtures::CT_MXFP8, "config.json"),
        9 => (fixtures::FP8_DYNAMIC, "config.json"),
        10 => (fixtures::MODELOPT_FP8, "hf_quant_config.json"),
        11 => (fixtures::CT_MXFP8, "hf_quant_config.json"),
        12 => (fixtures::MODELOPT_INT4_AWQ, "hf_quant_config.json"),
        13 => (fixtures::QUARK_MIXED, "config.json"),
        14 => (fixtures::MLX_3BIT, "config.json"),
        15 => (fixtures::MLX_MXFP4, "config.json"),
        _ => (fixtures::MODELOPT, "hf_quant_config.json"),
    };
    exercise(&checkpoint_dir(&[
        ("model.safetensors", weights),
        (name, rest),
    ]));
}

/// Any bytes as `model.safetensors.index.json` beside two real shards.
pub fn index(data: &[u8]) {
    let dir = checkpoint_dir(&[
        ("model-00001-of-00002.safetensors", fixtures::SHARD1),
        ("model-00002-of-00002.safetensors", fixtures::SHARD2),
        ("config.json", fixtures::SHARDED_CONFIG),
        ("model.safetensors.index.json", data),
    ]);
    exercise(&dir);
}

/// Any bytes as an SVDQuant `model.config.yaml` beside a real export.
pub fn sidecar(data: &[u8]) {
    let dir = checkpoint_dir(&[
        ("model.safetensors", fixtures::SVDQ),
        ("model.config.yaml", data),
    ]);
    exercise(&dir);
}

/// Overwrites bytes of `files` as `edits` say, 6 bytes an edit: file,
/// offset (u32; even offsets fall in the first 4 KiB, where the headers
/// and configs are), value. The files stay close to valid, so deep paths
/// are reached.
fn edit(files: &mut [(&str, Vec<u8>)], edits: &[u8]) {
    if files.is_empty() {
        return;
    }
    for e in edits.chunks_exact(6) {
        let file = e[0] as usize % files.len();
        let bytes = &mut files[file].1;
        if bytes.is_empty() {
            continue;
        }
        let raw = u32::from_le_bytes([e[1], e[2], e[3], e[4]]) as usize;
        let at = if raw & 1 == 0 {
            (raw >> 1) % 4096.min(bytes.len())
        } else {
            (raw >> 1) % bytes.len()
        };
        bytes[at] = e[5];
    }
}

/// Writes `files` and exercises them.
fn exercise_files(files: &[(&str, Vec<u8>)]) {
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    exercise(&checkpoint_dir(&refs));
}

/// A whole small checkpoint, mutated: the first byte picks a real
/// checkpoint, the rest overwrites bytes of its files ([`edit`]).
pub fn checkpoint(data: &[u8]) {
    let Some((&which, edits)) = data.split_first() else {
        return;
    };
    let mut files: Vec<(&str, Vec<u8>)> = match which % 7 {
        0 => vec![
            ("model.safetensors", fixtures::W4A16_ASYM.to_vec()),
            ("config.json", fixtures::W4A16_ASYM_CONFIG.to_vec()),
        ],
        1 => vec![
            (
                "model-00001-of-00002.safetensors",
                fixtures::SHARD1.to_vec(),
            ),
            (
                "model-00002-of-00002.safetensors",
                fixtures::SHARD2.to_vec(),
            ),
            ("config.json", fixtures::SHARDED_CONFIG.to_vec()),
            (
                "model.safetensors.index.json",
                fixtures::SHARDED_INDEX.to_vec(),
            ),
        ],
        2 => vec![
            ("model.safetensors", fixtures::MODELOPT.to_vec()),
            ("hf_quant_config.json", fixtures::MODELOPT_HF.to_vec()),
        ],
        3 => vec![
            ("model.safetensors", fixtures::SVDQ.to_vec()),
            ("model.config.yaml", fixtures::SVDQ_SIDECAR.to_vec()),
        ],
        4 => vec![
            ("model.safetensors", fixtures::SPARSE_BITMASK.to_vec()),
            ("config.json", fixtures::SPARSE_BITMASK_CONFIG.to_vec()),
        ],
        5 => vec![
            ("model.safetensors", fixtures::QUIP.to_vec()),
            ("config.json", fixtures::QUIP_CONFIG.to_vec()),
        ],
        _ => vec![
            ("model.safetensors", fixtures::W3A16.to_vec()),
            ("config.json", fixtures::W3A16_CONFIG.to_vec()),
        ],
    };
    edit(&mut files, edits);
    exercise_files(&files);
}

/// An MLX checkpoint (config.json with `quantization`, its index and
/// weights), mutated: the first byte picks one of the MLX fixtures (affine
/// 3 and 4 bit, mxfp4, GPT-OSS mxfp4 experts, Qwen3 MoE), the rest
/// overwrites bytes of its files ([`edit`]).
pub fn mlx(data: &[u8]) {
    let Some((&which, edits)) = data.split_first() else {
        return;
    };
    let (weights, config, index) = match which % 5 {
        0 => (
            fixtures::MLX_3BIT,
            fixtures::MLX_3BIT_CONFIG,
            fixtures::MLX_3BIT_INDEX,
        ),
        1 => (
            fixtures::MLX_4BIT,
            fixtures::MLX_4BIT_CONFIG,
            fixtures::MLX_4BIT_INDEX,
        ),
        2 => (
            fixtures::MLX_MXFP4,
            fixtures::MLX_MXFP4_CONFIG,
            fixtures::MLX_MXFP4_INDEX,
        ),
        3 => (
            fixtures::MLX_GPT_OSS,
            fixtures::MLX_GPT_OSS_CONFIG,
            fixtures::MLX_GPT_OSS_INDEX,
        ),
        _ => (
            fixtures::MLX_MOE,
            fixtures::MLX_MOE_CONFIG,
            fixtures::MLX_MOE_INDEX,
        ),
    };
    let mut files = vec![
        ("config.json", config.to_vec()),
        ("model.safetensors", weights.to_vec()),
    ];
    // Bit 7 of the first byte: with the single-shard index beside them.
    if which & 0x80 != 0 {
        files.push(("model.safetensors.index.json", index.to_vec()));
    }
    edit(&mut files, edits);
    exercise_files(&files);
}

/// Any bytes as a bitsandbytes quant state (`<m>.weight.quant_state.bitsandbytes__nf4`,
/// UTF-8 JSON) of a small 4-bit module, plain or nested, given whole or as
/// byte edits of a valid state (so deep paths are reached): the state's
/// keys, block sizes, shape and nesting are checked against the tensors.
pub fn bnb_state(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let nested = mode & 1 == 1;
    let state: Vec<u8> = if mode & 2 == 0 {
        rest.to_vec()
    } else {
        // Edits of 3 bytes: offset (u16), value.
        let mut s = if nested {
            br#"{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4, 32], "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.125}"#.to_vec()
        } else {
            br#"{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4, 32]}"#
                .to_vec()
        };
        for e in rest.chunks_exact(3) {
            let at = u16::from_le_bytes([e[0], e[1]]) as usize % s.len();
            s[at] = e[2];
        }
        s
    };
    exercise(&bnb_checkpoint(&state, nested));
}

/// Any bytes as a `.gguf` file: read (every tensor's bytes touched) or
/// refused in one line.
pub fn gguf(data: &[u8]) {
    let path = scratch().join("model.gguf");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    match Model::open(&path) {
        Ok(model) => {
            let touched: usize = model.tensors.iter().map(|t| model.bytes(t).len()).sum();
            assert!(touched as u64 <= data.len() as u64);
        }
        Err(e) => one_line(&e),
    }
}

/// Any bytes as a `.gguf` file, planned as `dequantize` plans it: the
/// metadata made into transformers' `config.json` and
/// `generation_config.json`, the tokenizer metadata into `tokenizer.json`
/// and `tokenizer_config.json`, the tensors renamed and decoded.
pub fn gguf_hf(data: &[u8]) {
    let path = scratch().join("model.gguf");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    exercise(&path);
}

/// The tokenizer metadata keys [`tokenizer`] edits.
const TOKENIZER_KEYS: &[&str] = &[
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.ggml.remove_extra_whitespaces",
    "tokenizer.chat_template",
    "general.architecture",
];

/// A real GGUF file's tokenizer metadata, edited, planned as `dequantize`
/// plans it (the SentencePiece and BPE builders, the special tokens, the
/// chat template). The first byte picks one of the tokenizer fixtures;
/// then each edit is a key ([`TOKENIZER_KEYS`]), an action and its bytes:
/// remove the key, set it to a number, string or bool, or change, drop or
/// add an item of its array. The file is then written anew.
pub fn tokenizer(data: &[u8]) {
    let Some((&which, mut ops)) = data.split_first() else {
        return;
    };
    let fixture = fixtures::TOKENIZERS[which as usize % fixtures::TOKENIZERS.len()];
    let path = scratch().join("source.gguf");
    if std::fs::write(&path, fixture).is_err() {
        return;
    }
    let Ok(model) = Model::open(&path) else {
        panic!("tokenizer fixture {which} does not open");
    };
    // The fixtures hold the embedding only: a block count of 1 would refuse
    // the conversion before the tokenizer is made.
    let mut metadata: Vec<(String, MetaValue)> = model
        .metadata
        .iter()
        .filter(|(k, _)| !k.ends_with(".block_count") && !k.ends_with(".embedding_length"))
        .cloned()
        .collect();
    while let [key, action, rest @ ..] = ops {
        let key = TOKENIZER_KEYS[*key as usize % TOKENIZER_KEYS.len()];
        let mut rest = rest;
        let at = metadata.iter().position(|(k, _)| k == key);
        let old = at.map(|a| &metadata[a].1);
        let value = tokenizer_value(*action, &mut rest, old);
        ops = rest;
        match (at, value) {
            (_, Edit::Keep) | (None, Edit::Remove) => {}
            (Some(a), Edit::Remove) => {
                metadata.remove(a);
            }
            (Some(a), Edit::Set(v)) => metadata[a].1 = v,
            (None, Edit::Set(v)) => metadata.push((key.to_string(), v)),
        }
    }
    let tensors: Vec<(&str, &[usize], u32, &[u8])> = model
        .tensors
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.shape.as_slice(),
                t.ty as u32,
                model.bytes(t),
            )
        })
        .collect();
    let bytes = gguf_file(&metadata, &tensors);
    let path = path.with_file_name("model.gguf");
    if std::fs::write(&path, bytes).is_err() {
        return;
    }
    drop(model);
    exercise(&path);
}

/// What an edit of [`tokenizer`] does to its key.
enum Edit {
    Keep,
    Remove,
    Set(MetaValue),
}

/// The first `n` bytes of `rest` (fewer where it is shorter), taken off it.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = rest.split_at(n.min(rest.len()));
    *rest = tail;
    head
}

/// The edit `action` makes, its bytes taken off `rest`, of a key whose
/// value is `old`.
fn tokenizer_value(action: u8, rest: &mut &[u8], old: Option<&MetaValue>) -> Edit {
    let byte = |rest: &mut &[u8]| take(rest, 1).first().copied().unwrap_or(0);
    Edit::Set(match action % 9 {
        0 => return Edit::Remove,
        1 => MetaValue::U32(u32::from(byte(rest))),
        2 => {
            let b = take(rest, 8);
            let mut w = [0u8; 8];
            w[..b.len()].copy_from_slice(b);
            MetaValue::I64(i64::from_le_bytes(w))
        }
        3 => MetaValue::Bool(byte(rest) & 1 == 1),
        4 => {
            let n = usize::from(byte(rest));
            MetaValue::String(String::from_utf8_lossy(take(rest, n)).into_owned())
        }
        5 => MetaValue::F32(f32::from(byte(rest)) - 64.5),
        action => {
            // An array item: index (u16, past the end appends), then its
            // new value.
            let i = usize::from(u16::from_le_bytes([byte(rest), byte(rest)]));
            let n = byte(rest);
            let text = String::from_utf8_lossy(take(rest, usize::from(n % 16))).into_owned();
            let Some(MetaValue::Array(items)) = old else {
                return Edit::Keep;
            };
            MetaValue::Array(edit_array(items.clone(), i, action == 6, n, &text))
        }
    })
}

/// `items` with item `i` removed (`remove`) or set from `n` and `text`
/// (`i` past the end appends): strings become `text`, numbers `n`.
fn edit_array(items: MetaArray, i: usize, remove: bool, n: u8, text: &str) -> MetaArray {
    fn one<T: Clone>(mut v: Vec<T>, i: usize, remove: bool, new: T) -> Vec<T> {
        if remove {
            if i < v.len() {
                v.remove(i);
            }
        } else if i < v.len() {
            v[i] = new;
        } else {
            v.push(new);
        }
        v
    }
    match items {
        MetaArray::String(s) => {
            let v: Vec<String> = s.iter().map(str::to_string).collect();
            let v = one(v, i, remove, text.to_string());
            let mut s = Strings::with_capacity(v.len());
            v.iter().for_each(|t| s.push(t));
            MetaArray::String(s)
        }
        MetaArray::I32(v) => MetaArray::I32(one(v, i, remove, i32::from(n) - 8)),
        MetaArray::U32(v) => MetaArray::U32(one(v, i, remove, u32::from(n))),
        MetaArray::F32(v) => MetaArray::F32(one(v, i, remove, f32::from(n) - 128.0)),
        other => other,
    }
}

/// A GGUF version 3 file of `metadata` and `tensors` (name, row-major
/// shape, ggml type id, bytes), as gguf-py writes one (alignment 32).
pub fn gguf_file(
    metadata: &[(String, MetaValue)],
    tensors: &[(&str, &[usize], u32, &[u8])],
) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    fn value(out: &mut Vec<u8>, v: &MetaValue) {
        let (ty, bytes): (u32, Vec<u8>) = match v {
            MetaValue::U8(x) => (0, x.to_le_bytes().to_vec()),
            MetaValue::I8(x) => (1, x.to_le_bytes().to_vec()),
            MetaValue::U16(x) => (2, x.to_le_bytes().to_vec()),
            MetaValue::I16(x) => (3, x.to_le_bytes().to_vec()),
            MetaValue::U32(x) => (4, x.to_le_bytes().to_vec()),
            MetaValue::I32(x) => (5, x.to_le_bytes().to_vec()),
            MetaValue::F32(x) => (6, x.to_le_bytes().to_vec()),
            MetaValue::Bool(x) => (7, vec![u8::from(*x)]),
            MetaValue::String(s) => {
                let mut b = Vec::new();
                string(&mut b, s);
                (8, b)
            }
            MetaValue::U64(x) => (10, x.to_le_bytes().to_vec()),
            MetaValue::I64(x) => (11, x.to_le_bytes().to_vec()),
            MetaValue::F64(x) => (12, x.to_le_bytes().to_vec()),
            MetaValue::Array(items) => {
                let mut b = Vec::new();
                array(&mut b, items);
                (9, b)
            }
        };
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    fn array(out: &mut Vec<u8>, items: &MetaArray) {
        fn numbers<T, const N: usize>(out: &mut Vec<u8>, ty: u32, v: &[T], le: fn(&T) -> [u8; N]) {
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            v.iter().for_each(|x| out.extend_from_slice(&le(x)));
        }
        match items {
            MetaArray::U8(v) => numbers(out, 0, v, |x| x.to_le_bytes()),
            MetaArray::I8(v) => numbers(out, 1, v, |x| x.to_le_bytes()),
            MetaArray::U16(v) => numbers(out, 2, v, |x| x.to_le_bytes()),
            MetaArray::I16(v) => numbers(out, 3, v, |x| x.to_le_bytes()),
            MetaArray::U32(v) => numbers(out, 4, v, |x| x.to_le_bytes()),
            MetaArray::I32(v) => numbers(out, 5, v, |x| x.to_le_bytes()),
            MetaArray::F32(v) => numbers(out, 6, v, |x| x.to_le_bytes()),
            MetaArray::Bool(v) => numbers(out, 7, v, |x| [u8::from(*x)]),
            MetaArray::U64(v) => numbers(out, 10, v, |x| x.to_le_bytes()),
            MetaArray::I64(v) => numbers(out, 11, v, |x| x.to_le_bytes()),
            MetaArray::F64(v) => numbers(out, 12, v, |x| x.to_le_bytes()),
            MetaArray::String(s) => {
                out.extend_from_slice(&8u32.to_le_bytes());
                out.extend_from_slice(&(s.len() as u64).to_le_bytes());
                s.iter().for_each(|t| string(out, t));
            }
            MetaArray::Array(v) => {
                out.extend_from_slice(&9u32.to_le_bytes());
                out.extend_from_slice(&(v.len() as u64).to_le_bytes());
                v.iter().for_each(|a| array(out, a));
            }
        }
    }
    const ALIGN: usize = 32;
    let metadata: Vec<_> = metadata
        .iter()
        .filter(|(k, _)| k != "general.alignment")
        .collect();
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        string(&mut out, k);
        value(&mut out, v);
    }
    let mut offset = 0usize;
    for (name, shape, ty, bytes) in tensors {
        string(&mut out, name);
        out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        // GGUF stores the innermost dimension first.
        shape
            .iter()
            .rev()
            .for_each(|d| out.extend_from_slice(&(*d as u64).to_le_bytes()));
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        offset += bytes.len().div_ceil(ALIGN) * ALIGN;
    }
    out.resize(out.len().div_ceil(ALIGN) * ALIGN, 0);
    for (_, _, _, bytes) in tensors {
        out.extend_from_slice(bytes);
        out.resize(out.len().div_ceil(ALIGN) * ALIGN, 0);
    }
    out
}

//! Hostile inputs (issue 62, point 5): GGUF files, safetensors headers and
//! the JSON sidecars (`config.json`, `hf_quant_config.json`, the index).
//! Inputs that are large but well-formed are read in time linear in their
//! length, and counts or lengths a file cannot hold are refused by rule
//! (GGUF-001, ST-001, ST-002, CFG-001) before anything is sized by them. The tests assert results, never timings:
//! quadratic code would still pass them, only slowly (the benches and the
//! report time them).

use std::path::{Path, PathBuf};

use wgpu_dequant::gguf::{MetaArray, MetaValue, Model, Strings};
use wgpu_dequant::{Checkpoint, Rule};

/// A real model (SentencePiece llama: its merges are recovered from the
/// vocabulary) that the hostile files are made of.
fn base() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf/hf-llama-spm/model/model.gguf")
}

/// A GGUF file to write: metadata, tensor infos (name, row-major shape,
/// ggml type id, offset in the data section) and the data section.
struct Gguf {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<(String, Vec<u64>, u32, u64)>,
    data: Vec<u8>,
    alignment: u64,
}

impl Gguf {
    /// The file at `path`, as its reader reads it.
    fn read(path: &Path) -> Gguf {
        let model = Model::open(path).unwrap();
        let file = &model.files[0];
        let data = file.bytes()[file.data_start as usize..].to_vec();
        let tensors = model
            .tensors
            .iter()
            .map(|t| {
                let shape = t.shape.iter().map(|&d| d as u64).collect();
                (
                    t.name.clone(),
                    shape,
                    t.ty as u32,
                    t.offset - file.data_start,
                )
            })
            .collect();
        Gguf {
            metadata: model.metadata.clone(),
            tensors,
            data,
            alignment: file.alignment,
        }
    }

    /// Appends an F32 tensor of 8 elements, its data after the others'.
    fn f32_tensor(&mut self, name: String) {
        let at = self.data.len().next_multiple_of(self.alignment as usize);
        self.data.resize(at + 32, 0);
        self.tensors.push((name, vec![8], 0, at as u64));
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            string(&mut b, k);
            b.extend(type_of(v).to_le_bytes());
            value(&mut b, v);
        }
        for (name, shape, ty, offset) in &self.tensors {
            string(&mut b, name);
            b.extend((shape.len() as u32).to_le_bytes());
            for d in shape.iter().rev() {
                b.extend(d.to_le_bytes());
            }
            b.extend(ty.to_le_bytes());
            b.extend(offset.to_le_bytes());
        }
        b.resize(b.len().next_multiple_of(self.alignment as usize), 0);
        b.extend(&self.data);
        b
    }

    fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.bytes()).unwrap();
        path.to_path_buf()
    }
}

fn string(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

fn type_of(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn value(b: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => b.extend(x.to_le_bytes()),
        MetaValue::I8(x) => b.extend(x.to_le_bytes()),
        MetaValue::U16(x) => b.extend(x.to_le_bytes()),
        MetaValue::I16(x) => b.extend(x.to_le_bytes()),
        MetaValue::U32(x) => b.extend(x.to_le_bytes()),
        MetaValue::I32(x) => b.extend(x.to_le_bytes()),
        MetaValue::F32(x) => b.extend(x.to_le_bytes()),
        MetaValue::Bool(x) => b.push(u8::from(*x)),
        MetaValue::String(s) => string(b, s),
        MetaValue::Array(items) => array(b, items),
        MetaValue::U64(x) => b.extend(x.to_le_bytes()),
        MetaValue::I64(x) => b.extend(x.to_le_bytes()),
        MetaValue::F64(x) => b.extend(x.to_le_bytes()),
    }
}

/// An array: its item type, length and items.
fn array(b: &mut Vec<u8>, items: &MetaArray) {
    let ty = match items {
        MetaArray::U8(_) => 0u32,
        MetaArray::I8(_) => 1,
        MetaArray::U16(_) => 2,
        MetaArray::I16(_) => 3,
        MetaArray::U32(_) => 4,
        MetaArray::I32(_) => 5,
        MetaArray::F32(_) => 6,
        MetaArray::Bool(_) => 7,
        MetaArray::String(_) => 8,
        MetaArray::Array(_) => 9,
        MetaArray::U64(_) => 10,
        MetaArray::I64(_) => 11,
        MetaArray::F64(_) => 12,
    };
    b.extend(ty.to_le_bytes());
    b.extend((items.len() as u64).to_le_bytes());
    match items {
        MetaArray::Array(arrays) => arrays.iter().for_each(|a| array(b, a)),
        MetaArray::U8(bytes) => b.extend(bytes),
        _ => items.iter().for_each(|v| value(b, &v)),
    }
}

/// `inspect` of the file, which must succeed without rule errors.
fn inspect_ok(path: &Path) -> String {
    let report = wgpu_dequant::inspect(path).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.errors().is_empty(), "{}", report.text());
    report.text()
}

/// The error `inspect` refuses the file with: its rule and its one line.
fn refused(path: &Path) -> (Rule, String) {
    match wgpu_dequant::inspect(path) {
        Ok(report) => panic!("{} was read: {}", path.display(), report.text()),
        Err(e) => {
            let line = e.to_string();
            assert!(!line.contains('\n'), "{line}");
            (e.rule, line)
        }
    }
}

/// 200,000 distinct metadata keys (about 5 MB) are read, and a key given
/// twice among them is still found.
#[test]
fn many_metadata_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = Gguf::read(&base());
    let before = g.metadata.len();
    for i in 0..200_000u32 {
        g.metadata
            .push((format!("hostile.key.{i}"), MetaValue::U32(i)));
    }
    let path = g.write(&tmp.path().join("keys.gguf"));
    let model = Model::open(&path).unwrap();
    assert_eq!(model.metadata.len(), before + 200_000);
    assert_eq!(
        model.get("hostile.key.199999"),
        Some(&MetaValue::U32(199_999))
    );
    inspect_ok(&path);

    g.metadata
        .push(("hostile.key.123456".into(), MetaValue::U32(0)));
    let (rule, line) = refused(&g.write(&tmp.path().join("twice.gguf")));
    assert_eq!(rule, Rule::Gguf, "{line}");
    assert!(
        line.contains("metadata key hostile.key.123456 appears twice"),
        "{line}"
    );
}

/// 100,000 tensor infos are read, and a name given twice among them is
/// still found.
#[test]
fn many_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = Gguf::read(&base());
    let before = g.tensors.len();
    for i in 0..100_000u32 {
        g.f32_tensor(format!("hostile.{i}.weight"));
    }
    let path = g.write(&tmp.path().join("tensors.gguf"));
    let model = Model::open(&path).unwrap();
    assert_eq!(model.tensors.len(), before + 100_000);
    assert_eq!(model.tensors[before + 99_999].name, "hostile.99999.weight");
    // Planned: the extra tensors are named, whatever is made of them.
    let text = match wgpu_dequant::inspect(&path) {
        Ok(report) => report.text(),
        Err(e) => e.to_string(),
    };
    assert!(text.contains("hostile."), "{text}");

    g.f32_tensor("hostile.54321.weight".into());
    let (rule, line) = refused(&g.write(&tmp.path().join("twice.gguf")));
    assert_eq!(rule, Rule::GgufTensor, "{line}");
    assert!(line.contains("hostile.54321.weight"), "{line}");
    assert!(line.contains("appears twice"), "{line}");
}

/// A SentencePiece vocabulary holding one 600,000-character token: its
/// merges are recovered, and the tokenizer made, in linear time.
#[test]
fn a_long_token() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = Gguf::read(&base());
    let Some((_, MetaValue::Array(MetaArray::String(tokens)))) = g
        .metadata
        .iter_mut()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
    else {
        panic!("no tokens");
    };
    // The last token (a normal one) becomes "▁" followed by 599,999 "a"s.
    let long = format!("▁{}", "a".repeat(599_999));
    let last = tokens.len() - 1;
    *tokens = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| if i == last { long.as_str() } else { t })
        .collect::<Strings>();
    let path = g.write(&tmp.path().join("long.gguf"));
    inspect_ok(&path);
}

/// Counts and lengths past the file's end are refused by GGUF-001, in one
/// line, before anything is sized by them (a count of 2^60 would abort
/// the process if it were allocated).
#[test]
fn counts_past_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let g = Gguf::read(&base());
    let good = g.bytes();
    let at_kv = 24; // magic, version, tensor count, metadata count
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "tensor count",
            {
                let mut b = good.clone();
                b[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
                b
            },
            "the tensor count",
        ),
        (
            "metadata count",
            {
                let mut b = good.clone();
                b[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
                b
            },
            "the metadata count",
        ),
        (
            "array length",
            {
                // One metadata pair: an array of u64 that claims 2^60 items.
                let mut b = good[..at_kv].to_vec();
                b[8..16].copy_from_slice(&0u64.to_le_bytes());
                b[16..24].copy_from_slice(&1u64.to_le_bytes());
                string(&mut b, "hostile.array");
                b.extend(9u32.to_le_bytes());
                b.extend(10u32.to_le_bytes());
                b.extend((1u64 << 60).to_le_bytes());
                b.extend([0u8; 64]);
                b
            },
            "hostile.array: the array's length",
        ),
        (
            "string length",
            {
                let mut b = good[..at_kv].to_vec();
                b[8..16].copy_from_slice(&0u64.to_le_bytes());
                b[16..24].copy_from_slice(&1u64.to_le_bytes());
                b.extend(u64::MAX.to_le_bytes());
                b.extend([0u8; 64]);
                b
            },
            "a metadata key",
        ),
    ];
    for (what, bytes, says) in cases {
        let path = tmp.path().join(format!("{}.gguf", what.replace(' ', "-")));
        std::fs::write(&path, bytes).unwrap();
        let (rule, line) = refused(&path);
        assert_eq!(rule, Rule::Gguf, "{what}: {line}");
        assert!(line.contains(says), "{what}: {line}");
    }
}

/// A metadata array of 20 million bytes is held as the bytes it is (a
/// vector of values would take 32 bytes or more for each), and its items
/// read as the file has them.
#[test]
fn a_large_metadata_array() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = Gguf::read(&base());
    let n = 20_000_000;
    let bytes: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    g.metadata.push((
        "hostile.array".into(),
        MetaValue::Array(MetaArray::U8(bytes)),
    ));
    let path = g.write(&tmp.path().join("array.gguf"));
    let model = Model::open(&path).unwrap();
    let Some(MetaValue::Array(MetaArray::U8(got))) = model.get("hostile.array") else {
        panic!("{:?}", model.get("hostile.array").map(|v| v.to_string()));
    };
    assert_eq!(got.len(), n);
    assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    inspect_ok(&path);
}

/// A safetensors file of `tensors` (name, dtype, shape, bytes), in order,
/// its header text exactly as given around them (`extra` before the
/// tensors: `__metadata__` or a hostile entry).
fn safetensors(path: &Path, extra: &str, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) {
    let mut header = String::from("{");
    header.push_str(extra);
    let mut at = 0;
    let mut data = Vec::new();
    for (i, (name, dtype, shape, bytes)) in tensors.iter().enumerate() {
        if i > 0 || !extra.is_empty() {
            header.push(',');
        }
        let end = at + bytes.len();
        header.push_str(&format!(
            r#""{name}":{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[{at},{end}]}}"#
        ));
        data.extend_from_slice(bytes);
        at = end;
    }
    header.push('}');
    raw_safetensors(path, header.as_bytes(), &data);
}

/// A safetensors file of header `text` and `data`, its length as it is.
fn raw_safetensors(path: &Path, text: &[u8], data: &[u8]) {
    let mut b = (text.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(text);
    b.extend_from_slice(data);
    std::fs::write(path, b).unwrap();
}

/// `n` one-element F32 tensors `t.I.weight` (value I) in one header.
fn many_f32(n: usize) -> String {
    let mut header = String::with_capacity(n * 64);
    header.push('{');
    for i in 0..n {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            r#""t.{i}.weight":{{"dtype":"F32","shape":[1],"data_offsets":[{},{}]}}"#,
            4 * i,
            4 * i + 4
        ));
    }
    header.push('}');
    header
}

fn f32_data(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect()
}

const CONFIG: &str =
    r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32"}"#;

/// A header length the file cannot hold (2^63, u64::MAX, past the end,
/// over the reader's 100 MB) is refused by ST-001 in one line, before a
/// buffer is sized by it; the Hub's and the browser's range reads ask for
/// no more than the file and the reader's cap.
#[test]
fn safetensors_header_lengths() {
    let tmp = tempfile::tempdir().unwrap();
    for (what, len, says) in [
        ("2^63", 1u64 << 63, "header too large"),
        ("u64-max", u64::MAX, "header too large"),
        ("past-the-end", 1000, "invalid header length"),
        ("over-the-cap", 100_000_001, "header too large"),
    ] {
        let dir = tmp.path().join(what);
        std::fs::create_dir(&dir).unwrap();
        let mut b = len.to_le_bytes().to_vec();
        b.extend_from_slice(br#"{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#);
        b.extend_from_slice(&[0; 4]);
        std::fs::write(dir.join("model.safetensors"), &b).unwrap();
        let (rule, line) = refused(&dir);
        assert_eq!(rule, Rule::Container, "{what}: {line}");
        assert!(
            line.contains("[ST-001]") && line.contains(says),
            "{what}: {line}"
        );
        assert!(line.contains("model.safetensors"), "{what}: {line}");
        // What a range reader asks for: never past the file, never past the cap.
        let asked = wgpu_dequant::checkpoint::Listing::header_len(&b[..8], b.len() as u64);
        assert!(asked <= b.len() as u64, "{what}: {asked}");
        let mut listing = wgpu_dequant::checkpoint::Listing::default();
        listing.add(
            "model.safetensors",
            b.len() as u64,
            b[..asked as usize].to_vec(),
        );
        let e = match Checkpoint::from_listing(listing) {
            Ok(_) => panic!("{what}: read from a listing"),
            Err(e) => e,
        };
        assert_eq!(e.rule, Rule::Container, "{what}: {e}");
    }
}

/// 50,000 tensors in one header (about 3.5 MB) are read; a name given
/// twice among them is found and named (ST-001).
#[test]
fn many_safetensors_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 50_000;
    let header = many_f32(n);
    let dir = tmp.path().join("many");
    std::fs::create_dir(&dir).unwrap();
    raw_safetensors(
        &dir.join("model.safetensors"),
        header.as_bytes(),
        &f32_data(n),
    );
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    assert_eq!(ckpt.names().len(), n);
    let t = ckpt.get("t.49999.weight").unwrap();
    assert_eq!(t.data().unwrap(), &49_999f32.to_le_bytes());
    drop(ckpt);
    inspect_ok(&dir);

    // The same name again, at the end: the data still tiles the file.
    let twice = format!(
        r#"{},"t.12345.weight":{{"dtype":"F32","shape":[1],"data_offsets":[{},{}]}}}}"#,
        &header[..header.len() - 1],
        4 * n,
        4 * n + 4
    );
    raw_safetensors(
        &dir.join("model.safetensors"),
        twice.as_bytes(),
        &f32_data(n + 1),
    );
    let (rule, line) = refused(&dir);
    assert_eq!(rule, Rule::Container, "{line}");
    assert!(line.contains("header names t.12345.weight twice"), "{line}");
}

/// A 300,000-character name above a 300,000-dimension shape: the check for
/// repeated keys does not copy the name once per dimension (90 GB), the
/// report prints it (a column that wide once overflowed `format!`'s width
/// and panicked), and a name repeated deep in a header is named by its
/// place.
#[test]
fn a_long_name_above_a_long_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 300_000;
    let name = "k".repeat(n);
    let path = tmp.path().join("long.safetensors");
    safetensors(
        &path,
        "",
        &[
            (&name, "F32", vec![1; n], vec![0; 4]),
            ("t", "F32", vec![1], vec![0; 4]),
        ],
    );
    let ckpt = Checkpoint::open(&path).unwrap();
    assert_eq!(ckpt.get(&name).unwrap().shape.len(), n);
    drop(ckpt);
    // Its report line is as long as it is, the others not widened by it.
    let text = inspect_ok(&path);
    assert!(text.contains(&name), "no line names it");
    let widened = text
        .lines()
        .filter(|l| l.len() > 1000 && !l.contains(&name));
    assert_eq!(widened.count(), 0);

    // A key given twice inside `__metadata__`, after a long array.
    let extra = format!(r#""__metadata__":{{"format":"pt","{name}":"1","x":"2","x":"3"}}"#);
    safetensors(&path, &extra, &[("t", "F32", vec![1], vec![0; 4])]);
    let (rule, line) = refused(&path);
    assert_eq!(rule, Rule::Container, "{line}");
    assert!(line.contains("header names __metadata__.x twice"), "{line}");
}

/// An index of 100,000 entries naming 100,000 shards (none there) is
/// read in n log n and refused naming the first missing shard (ST-002);
/// one of 50,000 entries in the shard that stores them is read, and one
/// entry given twice is named.
#[test]
fn an_index_of_many_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("missing");
    std::fs::create_dir(&dir).unwrap();
    let map: serde_json::Map<String, serde_json::Value> = (0..100_000)
        .map(|i| {
            (
                format!("t.{i}.weight"),
                format!("s-{i:07}.safetensors").into(),
            )
        })
        .collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let (rule, line) = refused(&dir);
    assert_eq!(rule, Rule::Index, "{line}");
    assert!(
        line.contains("names shard s-0000000.safetensors, which does not exist"),
        "{line}"
    );

    let dir = tmp.path().join("one-shard");
    std::fs::create_dir(&dir).unwrap();
    let n = 50_000;
    let shard = "model-00001-of-00001.safetensors";
    raw_safetensors(&dir.join(shard), many_f32(n).as_bytes(), &f32_data(n));
    let map: serde_json::Map<String, serde_json::Value> = (0..n)
        .map(|i| (format!("t.{i}.weight"), shard.into()))
        .collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": map}).to_string();
    std::fs::write(dir.join("model.safetensors.index.json"), &index).unwrap();
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    assert_eq!(ckpt.names().len(), n);
    assert_eq!(ckpt.location("t.49999.weight").unwrap().0, shard);
    drop(ckpt);

    // One entry given twice, the second time last.
    let twice = format!(
        r#"{}, "t.7777.weight": "{shard}"}}}}"#,
        &index[..index.len() - 2]
    );
    std::fs::write(dir.join("model.safetensors.index.json"), twice).unwrap();
    let (rule, line) = refused(&dir);
    assert_eq!(rule, Rule::Index, "{line}");
    assert!(
        line.contains("weight_map.t.7777.weight is given twice"),
        "{line}"
    );
}

/// `config.json` and `hf_quant_config.json` that are nested a million
/// deep, hold a number past f64, repeat a key among 200,000, or are
/// larger than any config: refused by CFG-001 in one line, without a
/// stack overflow and without reading the oversized one.
#[test]
fn hostile_configs() {
    let tmp = tempfile::tempdir().unwrap();
    let deep = format!(
        r#"{{"model_type": "llama", "x": {}{}}}"#,
        "[".repeat(1_000_000),
        "]".repeat(1_000_000)
    );
    let mut keys: String = (0..200_000).map(|i| format!(r#""k{i}": {i}, "#)).collect();
    keys.insert(0, '{');
    let twice = format!(r#"{keys}"model_type": "llama", "k199999": 0}}"#);
    let cases = [
        ("deep", deep, "recursion limit exceeded"),
        (
            "number",
            r#"{"x": 1e400}"#.to_string(),
            "number out of range",
        ),
        ("twice", twice, "k199999 is given twice"),
    ];
    for file in ["config.json", "hf_quant_config.json"] {
        for (what, text, says) in &cases {
            let dir = tmp.path().join(format!("{file}-{what}"));
            std::fs::create_dir(&dir).unwrap();
            safetensors(
                &dir.join("model.safetensors"),
                "",
                &[("t", "F32", vec![1], vec![0; 4])],
            );
            if file != "config.json" {
                std::fs::write(dir.join("config.json"), CONFIG).unwrap();
            }
            std::fs::write(dir.join(file), text).unwrap();
            let (rule, line) = refused(&dir);
            assert_eq!(rule, Rule::Config, "{file} {what}: {line}");
            assert!(
                line.contains(file) && line.contains(says),
                "{file} {what}: {line}"
            );
        }
        // 64 MiB and a byte, sparse: refused from its size, never read.
        let dir = tmp.path().join(format!("{file}-large"));
        std::fs::create_dir(&dir).unwrap();
        safetensors(
            &dir.join("model.safetensors"),
            "",
            &[("t", "F32", vec![1], vec![0; 4])],
        );
        let f = std::fs::File::create(dir.join(file)).unwrap();
        f.set_len((64 << 20) + 1).unwrap();
        let (rule, line) = refused(&dir);
        assert_eq!(rule, Rule::Config, "{file} large: {line}");
        assert!(line.contains("is not read"), "{file} large: {line}");
    }
    // 200,000 distinct keys are read.
    let dir = tmp.path().join("keys");
    std::fs::create_dir(&dir).unwrap();
    safetensors(
        &dir.join("model.safetensors"),
        "",
        &[("t", "F32", vec![1], vec![0; 4])],
    );
    std::fs::write(
        dir.join("config.json"),
        format!(r#"{keys}"model_type": "llama"}}"#),
    )
    .unwrap();
    inspect_ok(&dir);
}

/// A compressed-tensors checkpoint of 10,000 int4 modules whose config
/// ignores 10,000 other names and one of them: the names are looked up,
/// not compared with each module in turn; the one listed is decoded and
/// named in a finding, as before.
#[test]
fn many_ignored_names() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 10_000;
    let mut tensors = Vec::new();
    for i in 0..n {
        let m = format!("model.layers.{i}.mlp.down_proj");
        tensors.push((
            format!("{m}.weight_packed"),
            "I32",
            vec![1, 1],
            vec![0x11; 4],
        ));
        tensors.push((
            format!("{m}.weight_scale"),
            "BF16",
            vec![1, 1],
            vec![0x80, 0x3f],
        ));
        let shape: Vec<u8> = [1i64, 8].iter().flat_map(|d| d.to_le_bytes()).collect();
        tensors.push((format!("{m}.weight_shape"), "I64", vec![2], shape));
    }
    let tensors: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone()))
        .collect();
    safetensors(&tmp.path().join("model.safetensors"), "", &tensors);
    let mut ignore: Vec<String> = (0..n).map(|i| format!("other.{i}")).collect();
    ignore.push("model.layers.4321.mlp.down_proj".into());
    ignore.push("re:^lm_head$".into());
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "symmetric": true,
                            "strategy": "group", "group_size": 128}
            }},
            "ignore": ignore
        }
    });
    std::fs::write(tmp.path().join("config.json"), config.to_string()).unwrap();
    let report = wgpu_dequant::inspect(tmp.path()).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.errors().is_empty(), "{}", report.text());
    let text = report.text();
    one_listed(&text, n, "decoded to bf16", "ignore");
}

/// `n` FP8 modules `model.layers.{i}.mlp.down_proj` (`[1, 4]` E4M3
/// weights, each with a `weight_scale` of `scale`'s dtype, shape and bytes)
/// as `dir/model.safetensors`.
fn fp8_modules(dir: &Path, n: usize, scale: (&str, Vec<usize>, Vec<u8>)) {
    let names: Vec<String> = (0..n)
        .flat_map(|i| {
            let m = format!("model.layers.{i}.mlp.down_proj");
            [format!("{m}.weight"), format!("{m}.weight_scale")]
        })
        .collect();
    let tensors: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = names
        .iter()
        .enumerate()
        .map(|(i, name)| match i % 2 {
            0 => (name.as_str(), "F8_E4M3", vec![1, 4], vec![0x38; 4]),
            _ => (name.as_str(), scale.0, scale.1.clone(), scale.2.clone()),
        })
        .collect();
    safetensors(&dir.join("model.safetensors"), "", &tensors);
}

/// `inspect`'s `text` says all `n` tensors are `decoded`, and names module
/// 4321 (and only it) in a finding that it is `listed in {list}`.
fn one_listed(text: &str, n: usize, decoded: &str, list: &str) {
    assert!(
        text.contains(&format!("output      {n} tensors: {n} {decoded}")),
        "{text}"
    );
    let listed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(&format!("listed in {list}")))
        .collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(
        listed[0].contains("model.layers.4321.mlp.down_proj"),
        "{listed:?}"
    );
}

/// A Quark FP8 checkpoint of 10,000 modules whose `exclude` lists 10,000
/// other names, a few globs and one module by the suffix after a dot: the
/// names are looked up and the globs compiled once (they were compiled
/// once per module and entry: 47 s at this size); the one listed is
/// decoded and named in a finding, as before.
#[test]
fn many_quark_excludes() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 10_000;
    fp8_modules(tmp.path(), n, ("BF16", vec![1], vec![0x80, 0x3f]));
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/quark-fp8-per-channel/model/config.json");
    let fixture: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
    let mut qc = fixture["quantization_config"].clone();
    let mut exclude: Vec<String> = (0..n).map(|i| format!("other.{i}")).collect();
    exclude.extend(["*.never", "lm_h?ad", "layers.4321.mlp.down_proj"].map(String::from));
    qc["exclude"] = exclude.into();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "torch_dtype": "bfloat16",
        "quantization_config": qc,
    });
    std::fs::write(tmp.path().join("config.json"), config.to_string()).unwrap();
    let text = inspect_ok(tmp.path());
    one_listed(&text, n, "decoded to bf16", "exclude");
}

/// A ModelOpt FP8 checkpoint of 10,000 modules whose `exclude_modules`
/// lists 10,000 other names, a glob and one of its modules: the plain
/// names are looked up, not matched as globs against each module; the one
/// listed is decoded and named in a finding, as before.
#[test]
fn many_modelopt_excludes() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 10_000;
    fp8_modules(
        tmp.path(),
        n,
        ("F32", vec![], 0.5f32.to_le_bytes().to_vec()),
    );
    let mut exclude: Vec<String> = (0..n).map(|i| format!("other.{i}")).collect();
    exclude.extend(["*never", "model.layers.4321.mlp.down_proj"].map(String::from));
    let hf_quant = serde_json::json!({
        "producer": {"name": "modelopt", "version": "0.47.0"},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": null,
                         "exclude_modules": exclude},
    });
    std::fs::write(
        tmp.path().join("hf_quant_config.json"),
        hf_quant.to_string(),
    )
    .unwrap();
    std::fs::write(tmp.path().join("config.json"), CONFIG).unwrap();
    let text = inspect_ok(tmp.path());
    one_listed(&text, n, "decoded", "exclude_modules");
}

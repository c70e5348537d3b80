//! Hostile GGUF files (issue 62, point 5): headers that are large but
//! well-formed are read in time linear in their length, and counts or
//! lengths a file cannot hold are refused by rule (GGUF-001) before
//! anything is sized by them. The tests assert results, never timings:
//! quadratic code would still pass them, only slowly (the benches and the
//! report time them).

use std::path::{Path, PathBuf};

use wgpu_dequant::gguf::{MetaArray, MetaValue, Model, Strings};
use wgpu_dequant::Rule;

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

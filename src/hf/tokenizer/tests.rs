//! Against transformers 5.25's own conversion: the cases
//! `tests/gguf/make_tokenizers.py` wrote to `tests/gguf/tokenizers/` and the
//! public fixtures' `expected-bf16-meta/`. A case's `expected/` is what
//! transformers saves of its in-memory tokenizer, its tokenizer class
//! replaced by `TokenizersBackend` where the saved class reloads into
//! another tokenizer (the script checks that the reload of `expected/`
//! encodes and decodes as the in-memory tokenizer does); its `ids.json`
//! holds the in-memory tokenizer's ids and decoded text for each text,
//! held-out ones included (special tokens, bytes outside the vocabulary,
//! long runs of whitespace, text not in NFC).
//!
//! Differences allowed: none. tokenizer.json and tokenizer_config.json equal
//! the references as JSON values (key order aside; `model_max_length`,
//! int(1e30), parses to the same f64 on both sides), chat_template.jinja
//! byte for byte. tokenizer_config.json's `is_local: true` and
//! `local_files_only: false` are what transformers records for a tokenizer
//! loaded from a local folder; they are written as the reference has them
//! (the dense output is a local folder too).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde_json::Value;

use super::hf_files;
use crate::error::Rule;
use crate::gguf::{MetaArray, MetaValue, Model};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn json(bytes: &[u8], what: &str) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn open(path: &Path) -> (Vec<(String, MetaValue)>, String) {
    let model = Model::open(path).unwrap_or_else(|e| panic!("{e}"));
    let arch = model.architecture().unwrap().to_owned();
    (model.metadata, arch)
}

/// Our files for `gguf` equal the reference folder's tokenizer files.
fn check_files(case: &str, gguf: &Path, expected: &Path) -> tokenizers::Tokenizer {
    let (metadata, arch) = open(gguf);
    let files = hf_files(&metadata, &arch).unwrap_or_else(|e| panic!("{case}: {e}"));
    let mut names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    let mut want: Vec<String> = std::fs::read_dir(expected)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tokenizer") || n == "chat_template.jinja")
        .collect();
    want.sort();
    assert_eq!(names, want, "{case}: files");
    let mut ours = None;
    for (name, bytes) in &files {
        let reference = std::fs::read(expected.join(name)).unwrap();
        if name.ends_with(".json") {
            let (a, b) = (json(bytes, name), json(&reference, name));
            if a != b {
                let field = match (&a, &b) {
                    (Value::Object(a), Value::Object(b)) => a
                        .iter()
                        .find(|(k, v)| b.get(*k) != Some(*v))
                        .map(|(k, _)| k.clone())
                        .or_else(|| b.keys().find(|k| !a.contains_key(*k)).cloned()),
                    _ => None,
                };
                panic!("{case}: {name} differs at {field:?}");
            }
        } else {
            assert_eq!(bytes, &reference, "{case}: {name}");
        }
        if name == "tokenizer.json" {
            let text = std::str::from_utf8(bytes).unwrap();
            ours = Some(tokenizers::Tokenizer::from_str(text).unwrap());
        }
    }
    ours.unwrap()
}

#[test]
fn cases_equal_transformers() {
    let dir = root().join("tests/gguf/tokenizers");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    cases.sort();
    // Each architecture converted, with each vocabulary kind.
    let mut covered: Vec<(String, String)> = Vec::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let source = json(
            &std::fs::read(case.join("source.json")).unwrap(),
            "source.json",
        );
        let kind = name.split('-').next().unwrap().to_owned();
        covered.push((kind, source["architecture"].as_str().unwrap().to_owned()));
    }
    for arch in [
        "llama",
        "qwen2",
        "qwen3",
        "qwen2moe",
        "qwen3moe",
        "phi3",
        "gemma2",
        "gemma3",
        "starcoder2",
        "stablelm",
        "falcon",
        "nemotron",
    ] {
        for kind in ["gpt2", "spm"] {
            let case = (kind.to_owned(), arch.to_owned());
            assert!(covered.contains(&case), "no {kind} case for {arch}");
        }
    }
    for case in cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let ours = check_files(&name, &case.join("model.gguf"), &case.join("expected"));
        let ids = json(&std::fs::read(case.join("ids.json")).unwrap(), "ids.json");
        let items = ids.as_array().unwrap();
        assert!(
            items.iter().any(|i| i["held_out"] == true),
            "{name}: no held-out texts"
        );
        for item in items {
            let text = item["text"].as_str().unwrap();
            let want: Vec<u32> = serde_json::from_value(item["ids"].clone()).unwrap();
            let got = ours
                .encode(text, true)
                .unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"));
            assert_eq!(got.get_ids(), want, "{name}: {text:?}");
            let decoded = ours
                .decode(&want, false)
                .unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"));
            assert_eq!(
                decoded,
                item["decoded"].as_str().unwrap(),
                "{name}: {text:?}"
            );
        }
    }
}

#[test]
fn public_fixtures_equal_transformers() {
    for case in ["gguf-q4_k-llama", "gguf-q8_0-qwen2", "gguf-iq2_xxs-llama"] {
        let gguf = root()
            .join("tests/gguf")
            .join(case)
            .join("model/model.gguf");
        let expected = [
            root().join("tests/fixtures").join(case),
            root().join("../shared/fixtures").join(case),
        ]
        .into_iter()
        .map(|d| d.join("expected-bf16-meta"))
        .find(|d| d.is_dir());
        let Some(expected) = expected else {
            eprintln!("{case}: no expected-bf16-meta here, skipped");
            continue;
        };
        check_files(case, &gguf, &expected);
    }
}

/// The spm-llama case's metadata, for the malformed variants below.
fn spm_llama() -> (Vec<(String, MetaValue)>, String) {
    open(&root().join("tests/gguf/tokenizers/spm-llama/model.gguf"))
}

fn set(meta: &mut Vec<(String, MetaValue)>, key: &str, value: MetaValue) {
    meta.retain(|(k, _)| k != key);
    meta.push((key.to_owned(), value));
}

fn refused(meta: &[(String, MetaValue)], arch: &str, rule: Rule, words: &str) {
    match hf_files(meta, arch) {
        Ok(_) => panic!("accepted: {words}"),
        Err(e) => {
            assert_eq!(e.rule, rule, "{e}");
            let line = e.to_string();
            assert!(line.contains(words), "{line}");
            assert!(!line.contains('\n'), "{line}");
        }
    }
}

#[test]
fn malformed_metadata_is_refused() {
    let (base, arch) = spm_llama();
    let s = |t: &str| MetaValue::String(t.to_owned());

    let mut m = base.clone();
    set(
        &mut m,
        "tokenizer.ggml.tokens",
        MetaValue::Array(MetaArray::U32(vec![3])),
    );
    refused(&m, &arch, Rule::Gguf, "tokenizer.ggml.tokens");
    set(&mut m, "tokenizer.ggml.tokens", s("a b c"));
    refused(&m, &arch, Rule::Gguf, "tokenizer.ggml.tokens");

    let mut m = base.clone();
    set(
        &mut m,
        "tokenizer.ggml.scores",
        MetaValue::Array(MetaArray::F32(vec![0.0; 3])),
    );
    refused(&m, &arch, Rule::Gguf, "tokenizer.ggml.scores has 3 items");
    set(
        &mut m,
        "tokenizer.ggml.scores",
        MetaValue::Array(MetaArray::String(["x"].into_iter().collect())),
    );
    refused(&m, &arch, Rule::Gguf, "tokenizer.ggml.scores");
    m.retain(|(k, _)| k != "tokenizer.ggml.scores");
    refused(&m, &arch, Rule::Gguf, "tokenizer.ggml.scores is missing");

    let mut m = base.clone();
    set(
        &mut m,
        "tokenizer.ggml.bos_token_id",
        MetaValue::U32(100_000),
    );
    refused(
        &m,
        &arch,
        Rule::Gguf,
        "tokenizer.ggml.bos_token_id is 100000",
    );
    set(&mut m, "tokenizer.ggml.bos_token_id", MetaValue::I32(-1));
    refused(&m, &arch, Rule::Gguf, "tokenizer.ggml.bos_token_id");

    let mut m = base.clone();
    set(
        &mut m,
        "tokenizer.ggml.token_type",
        MetaValue::Array(MetaArray::I32(vec![1])),
    );
    refused(
        &m,
        &arch,
        Rule::Gguf,
        "tokenizer.ggml.token_type has 1 items",
    );

    let mut m = base.clone();
    set(&mut m, "tokenizer.ggml.add_bos_token", MetaValue::U8(1));
    refused(&m, &arch, Rule::Gguf, "tokenizer.ggml.add_bos_token");

    // Merges that are not "a b", or name a token not in the vocabulary.
    let (gpt2, gpt2_arch) = open(&root().join("tests/gguf/tokenizers/gpt2-llama/model.gguf"));
    for merge in ["h", "h e x", "h  e", "h zzzz"] {
        let mut m = gpt2.clone();
        set(
            &mut m,
            "tokenizer.ggml.merges",
            MetaValue::Array(MetaArray::String([merge].into_iter().collect())),
        );
        refused(&m, &gpt2_arch, Rule::Gguf, "tokenizer.ggml.merges");
    }

    let mut m = base.clone();
    set(&mut m, "tokenizer.ggml.model", s("rwkv"));
    refused(
        &m,
        &arch,
        Rule::Unsupported,
        "tokenizer.ggml.model \"rwkv\" is not converted",
    );
    m.retain(|(k, _)| k != "tokenizer.ggml.model");
    refused(&m, &arch, Rule::Gguf, "tokenizer.ggml.model is missing");
    refused(&base, "mamba", Rule::Unsupported, "\"mamba\"");

    // No tokenizer metadata: no files.
    let plain: Vec<_> = base
        .iter()
        .filter(|(k, _)| !k.starts_with("tokenizer."))
        .cloned()
        .collect();
    assert!(hf_files(&plain, &arch).unwrap().is_empty());
}

/// The merges `merges_of` recovers by walking byte tries are those of
/// transformers' `generate_merges` loop (every split of every token looked
/// up, as this crate did before), here on small vocabularies that share
/// prefixes, suffixes, repeated and multi-byte tokens; and a token of
/// 600,000 characters gives its two merges.
#[test]
fn merges_walk_as_every_split_is_looked_up() {
    use super::builder::merges_of;
    use std::collections::HashMap;

    fn every_split(keys: &[String], scores: &[f64]) -> Vec<(String, String)> {
        let mut vocab: HashMap<&str, usize> = HashMap::new();
        let mut score: HashMap<&str, f64> = HashMap::new();
        let mut order: Vec<&str> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            if vocab.insert(k, i).is_none() {
                order.push(k);
            }
            score.insert(k, scores[i]);
        }
        let mut merges = Vec::new();
        for token in order {
            let chars = token.chars().count();
            let mut local = Vec::new();
            for (n, (at, _)) in token.char_indices().skip(1).enumerate() {
                let (left, right) = token.split_at(at);
                if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) {
                    local.push((l, r, left, right, score[token], n + 1, chars - n - 1));
                }
            }
            local.sort_by_key(|m| (m.0, m.1));
            merges.extend(local);
        }
        merges.sort_by(|a, b| {
            b.4.partial_cmp(&a.4)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(b.5.cmp(&a.5))
                .then(b.6.cmp(&a.6))
        });
        merges
            .into_iter()
            .map(|m| (m.2.to_owned(), m.3.to_owned()))
            .collect()
    }

    let alphabet = ["a", "b", "▁", "é", "ab", "ba", "▁a", "aé"];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for _ in 0..200 {
        let len = 1 + next(40);
        let keys: Vec<String> = (0..len)
            .map(|_| {
                (0..1 + next(4))
                    .map(|_| alphabet[next(alphabet.len())])
                    .collect()
            })
            .collect();
        let scores: Vec<f64> = (0..len).map(|_| next(5) as f64 - 2.0).collect();
        assert_eq!(
            merges_of(&keys, &scores),
            every_split(&keys, &scores),
            "{keys:?}"
        );
    }

    let long = "ab".repeat(300_000);
    let keys = vec![
        "a".to_owned(),
        "ab".to_owned(),
        long[2..].to_owned(),
        long.clone(),
    ];
    let merges = merges_of(&keys, &[0.0, -1.0, -2.0, -3.0]);
    // "ab" * 299,999 + "ab", then "ab" + "ab" * 299,999: the longer left first.
    let lens: Vec<(usize, usize)> = merges.iter().map(|(l, r)| (l.len(), r.len())).collect();
    assert_eq!(lens, [(599_998, 2), (2, 599_998)]);
    assert!(merges.iter().all(|(l, r)| format!("{l}{r}") == long));
}

//! The tokenizer transformers' GGUF builders make: the model (byte-level or
//! byte-fallback BPE, SentencePiece merges recovered from the vocabulary),
//! normalizer, pre-tokenizer and decoder.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::split::Split;
use tokenizers::{
    DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

use super::bad;
use super::meta::Meta;
use crate::error::{Error, Result, Rule};

/// The builder transformers picks from `tokenizer.ggml.model` and the architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Builder {
    /// `GPT2Tokenizer`.
    ByteLevel,
    /// `LlamaTokenizer`: Metaspace, prefix `▁` on the first fragment.
    Llama,
    /// `LlamaTokenizer` with a normalizer that prepends `▁` (phi3).
    Phi3,
    /// `GemmaTokenizer`: spaces replaced, merges by file position.
    Gemma,
}

impl Builder {
    /// The class's default special tokens, in `SPECIAL_TOKENS_ATTRIBUTES`
    /// order (bos, eos, unk, pad, mask), each once.
    pub(super) fn defaults(self) -> &'static [&'static str] {
        match self {
            Builder::ByteLevel => &["<|endoftext|>"],
            Builder::Llama | Builder::Phi3 => &["<s>", "</s>", "<unk>"],
            Builder::Gemma => &["<bos>", "<eos>", "<unk>", "<pad>", "<mask>"],
        }
    }

    pub(super) fn build(self, meta: &Meta, tokens: &[&str]) -> Result<Tokenizer> {
        // The vocabulary's spelling of each token.
        let keys: Vec<String> = match self {
            Builder::ByteLevel => {
                let alphabet = byte_alphabet();
                let bytes: Vec<char> = {
                    let mut v = vec!['\0'; 256];
                    for (&c, &b) in &alphabet {
                        v[b as usize] = c;
                    }
                    v
                };
                tokens
                    .iter()
                    .map(|t| {
                        if t.chars().all(|c| alphabet.contains_key(&c)) {
                            (*t).to_owned()
                        } else {
                            t.bytes().map(|b| bytes[b as usize]).collect()
                        }
                    })
                    .collect()
            }
            // An all-space token stored as spaces is looked up as `▁`s.
            Builder::Gemma => tokens
                .iter()
                .map(|t| {
                    if t.contains(' ') && t.chars().all(py_space) {
                        "▁".repeat(t.chars().count())
                    } else {
                        (*t).to_owned()
                    }
                })
                .collect(),
            Builder::Llama | Builder::Phi3 => tokens.iter().map(|t| (*t).to_owned()).collect(),
        };
        let merges = match meta.strings("tokenizer.ggml.merges")? {
            Some(merges) => merges
                .iter()
                .map(|m| match m.split(' ').collect::<Vec<_>>()[..] {
                    [a, b] => Ok((a.to_owned(), b.to_owned())),
                    _ => Err(bad(format!(
                        "tokenizer.ggml.merges holds {m:?}, not two tokens \"a b\""
                    ))),
                })
                .collect::<Result<Vec<_>>>()?,
            None if self == Builder::Gemma => {
                // Gemma's merges follow the file's order, not its scores.
                let scores: Vec<f64> = (0..keys.len()).map(|i| -(i as f64)).collect();
                merges_of(&keys, &scores)
            }
            None if self == Builder::ByteLevel => Vec::new(),
            None => {
                let scores = meta.floats("tokenizer.ggml.scores")?.ok_or_else(|| {
                    bad("tokenizer.ggml.scores is missing (and there are no merges)")
                })?;
                if scores.len() != keys.len() {
                    return Err(bad(format!(
                        "tokenizer.ggml.scores has {} items, tokenizer.ggml.tokens {}",
                        scores.len(),
                        keys.len()
                    )));
                }
                // The merges are ordered by score: NaN has no place in it.
                if let Some(i) = scores.iter().position(|s| s.is_nan()) {
                    return Err(bad(format!(
                        "tokenizer.ggml.scores item {i} is NaN; the merges are ordered by score"
                    )));
                }
                merges_of(&keys, &scores)
            }
        };
        // A dict: a token given twice keeps its last id.
        let mut vocab = Vocab::default();
        for (i, k) in keys.into_iter().enumerate() {
            let id = u32::try_from(i).map_err(|_| bad("tokenizer.ggml.tokens: too many tokens"))?;
            vocab.insert(k, id);
        }
        let bpe = BPE::builder().vocab_and_merges(vocab, merges);
        let bpe = match self {
            Builder::ByteLevel => bpe
                .continuing_subword_prefix(String::new())
                .end_of_word_suffix(String::new()),
            Builder::Llama | Builder::Phi3 => bpe.fuse_unk(true).byte_fallback(true),
            Builder::Gemma => bpe
                .fuse_unk(true)
                .byte_fallback(true)
                .unk_token("<unk>".into()),
        };
        let bpe = bpe
            .build()
            .map_err(|e| bad(format!("tokenizer.ggml.merges: {e}")))?;
        let mut tokenizer = Tokenizer::new(bpe);
        let replace = |from: &str, to: &str| {
            Replace::new(from, to).map_err(|e| Error::bare(Rule::Internal, e.to_string()))
        };
        let spm_decoders = |strip: bool| -> Result<DecoderWrapper> {
            let mut d: Vec<DecoderWrapper> = vec![
                replace("▁", " ")?.into(),
                ByteFallback::new().into(),
                Fuse::new().into(),
            ];
            if strip {
                d.push(Strip::new(' ', 1, 0).into());
            }
            Ok(DecoderSequence::new(d).into())
        };
        let (normalizer, pre, decoder): (
            Option<NormalizerWrapper>,
            Option<PreTokenizerWrapper>,
            DecoderWrapper,
        ) = match self {
            Builder::ByteLevel => (
                None,
                Some(ByteLevel::new(false, true, true).into()),
                ByteLevel::default().into(),
            ),
            Builder::Llama => (
                None,
                Some(Metaspace::new('▁', PrependScheme::First, false).into()),
                spm_decoders(true)?,
            ),
            Builder::Phi3 => (
                Some(
                    NormalizerSequence::new(vec![
                        Prepend::new("▁".into()).into(),
                        replace(" ", "▁")?.into(),
                    ])
                    .into(),
                ),
                None,
                spm_decoders(true)?,
            ),
            Builder::Gemma => (
                Some(replace(" ", "▁")?.into()),
                Some(
                    Split::new(" ", SplitDelimiterBehavior::MergedWithPrevious, false)
                        .map_err(|e| Error::bare(Rule::Internal, e.to_string()))?
                        .into(),
                ),
                spm_decoders(false)?,
            ),
        };
        tokenizer
            .with_normalizer(normalizer)
            .map_err(|e| Error::bare(Rule::Internal, e.to_string()))?;
        tokenizer.with_pre_tokenizer(pre);
        tokenizer.with_decoder(Some(decoder));
        Ok(tokenizer)
    }
}

/// Python's `str.isspace`: Unicode White_Space and the four separators
/// U+001C..U+001F.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// GPT-2's byte alphabet (`bytes_to_unicode`): char → byte.
pub(super) fn byte_alphabet() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, 33..=126 | 161..=172 | 174..=255);
        let c = if printable {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or('\0')
        };
        map.insert(c, b);
    }
    map
}

/// The merges a SentencePiece vocabulary implies (`generate_merges`): every
/// split of a token into two vocabulary pieces, best score first, then the
/// longer left piece, then the longer right piece; ties keep the order of the
/// tokens and, within a token, the order of the pieces' ids.
pub(super) fn merges_of(keys: &[String], scores: &[f64]) -> Vec<(String, String)> {
    // `{token: index}`: a token given twice keeps its last index; scores
    // likewise, in the order of first appearance.
    let mut vocab: HashMap<&str, usize> = HashMap::with_capacity(keys.len());
    let mut score: HashMap<&str, f64> = HashMap::with_capacity(keys.len());
    let mut order: Vec<&str> = Vec::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        if vocab.insert(k, i).is_none() {
            order.push(k);
        }
        score.insert(k, scores[i]);
    }
    struct Merge<'a> {
        left: &'a str,
        right: &'a str,
        score: f64,
        left_len: usize,
        right_len: usize,
    }
    // Which prefixes and suffixes of a token are themselves tokens, found by
    // walking two byte tries (of the tokens, and of the tokens reversed)
    // along it: linear in the vocabulary's total length, where looking up
    // every split's two halves would hash a token of n bytes n times.
    let prefixes = Trie::new(vocab.iter().map(|(k, &i)| (k.bytes(), i)));
    let suffixes = Trie::new(vocab.iter().map(|(k, &i)| (k.bytes().rev(), i)));
    let mut merges: Vec<Merge> = Vec::new();
    let mut local: Vec<(usize, usize, Merge)> = Vec::new();
    // For the token at hand: the id of its first `at` bytes, and of the rest.
    let (mut left_id, mut right_id) = (Vec::new(), Vec::new());
    for token in order {
        let s = score.get(token).copied().unwrap_or(0.0);
        let bytes = token.as_bytes();
        left_id.clear();
        left_id.resize(bytes.len() + 1, None);
        right_id.clear();
        right_id.resize(bytes.len() + 1, None);
        prefixes.walk(bytes.iter().copied(), |n, id| left_id[n] = Some(id));
        suffixes.walk(bytes.iter().rev().copied(), |n, id| {
            right_id[bytes.len() - n] = Some(id)
        });
        let chars = token.chars().count();
        for (n, (at, _)) in token.char_indices().skip(1).enumerate() {
            if let (Some(l), Some(r)) = (left_id[at], right_id[at]) {
                let (left, right) = token.split_at(at);
                let merge = Merge {
                    left,
                    right,
                    score: s,
                    left_len: n + 1,
                    right_len: chars - n - 1,
                };
                local.push((l, r, merge));
            }
        }
        local.sort_by_key(|&(l, r, _)| (l, r));
        merges.extend(local.drain(..).map(|(_, _, m)| m));
    }
    merges.sort_by(|a, b| {
        b.score
            .partial_cmp(&a.score)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(b.left_len.cmp(&a.left_len))
            .then(b.right_len.cmp(&a.right_len))
    });
    merges
        .into_iter()
        .map(|m| (m.left.to_owned(), m.right.to_owned()))
        .collect()
}

/// A byte trie of tokens: node 0 is the root, each edge one byte.
struct Trie {
    children: HashMap<(u32, u8), u32>,
    /// The token id that ends at each node, if one does.
    ends: Vec<Option<usize>>,
}

impl Trie {
    fn new<B: Iterator<Item = u8>>(tokens: impl Iterator<Item = (B, usize)>) -> Trie {
        let mut t = Trie {
            children: HashMap::new(),
            ends: vec![None],
        };
        for (bytes, id) in tokens {
            let mut node = 0u32;
            for b in bytes {
                let next = t.ends.len() as u32;
                node = *t.children.entry((node, b)).or_insert_with(|| next);
                if node == next {
                    t.ends.push(None);
                }
            }
            t.ends[node as usize] = Some(id);
        }
        t
    }

    /// Calls `found(n, id)` for each token `id` that the first `n` bytes
    /// of `bytes` spell, `n` ascending; stops where no token goes on.
    fn walk(&self, bytes: impl Iterator<Item = u8>, mut found: impl FnMut(usize, usize)) {
        let mut node = 0u32;
        for (i, b) in bytes.enumerate() {
            match self.children.get(&(node, b)) {
                Some(&next) => node = next,
                None => return,
            }
            if let Some(id) = self.ends[node as usize] {
                found(i + 1, id);
            }
        }
    }
}

/// The split regex a `tokenizer.ggml.pre` name stands for
/// (`GGUF_PRE_TOKENIZER_SPLITS`); `None` keeps the builder's pre-tokenizer.
pub(super) fn split_regex(pre: &str) -> Option<&'static str> {
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3,
        "tekken" => TEKKEN,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2,
        "qwen35" => QWEN35,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O,
        _ => return None,
    })
}

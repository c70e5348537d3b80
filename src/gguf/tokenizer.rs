//! A GGUF file's tokenizer metadata (`tokenizer.ggml.*`,
//! `tokenizer.chat_template`) as the Hugging Face tokenizer files
//! transformers 5.25 writes for the same file: `AutoTokenizer.from_pretrained(
//! dir, gguf_file=...)` then `save_pretrained`.
//!
//! transformers builds the tokenizer in steps, and which token gets which id
//! depends on their order (a token missing from the vocabulary is appended
//! where the added vocabulary says), so this replays the same steps on the
//! `tokenizers` crate's own types
//! (`transformers/integrations/gguf/gguf_tokenizer_mapping.py`):
//!
//! 1. the builder `tokenizer.ggml.model` and the architecture pick: byte-level
//!    BPE (`gpt2`: `GPT2Tokenizer`), SentencePiece as byte-fallback BPE
//!    (`llama`: `LlamaTokenizer`; gemma*: `GemmaTokenizer`; phi3: Llama's with
//!    a normalizer for the prefix space), its merges the file's or, for
//!    SentencePiece, every split of a token into two vocabulary pieces;
//! 2. that builder's default special tokens, added;
//! 3. control tokens (type 3) added as special, user-defined ones (type 4) as
//!    plain added tokens;
//! 4. the split regex `tokenizer.ggml.pre` names, when it names one;
//! 5. the class the architecture loads (`TokenizersBackend`,
//!    `Qwen2Tokenizer`, `GemmaTokenizer`) adds the file's bos/eos/unk/pad
//!    (and Gemma's `<mask>`) when not added yet, and sets the post-processor
//!    from `add_bos_token`/`add_eos_token`.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::{Template, TemplateProcessing};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
    Tokenizer,
};

use super::MetaValue;
use crate::error::{Error, Result, Rule};

#[cfg(test)]
mod tests;

/// llama.cpp's token types.
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// The Hugging Face tokenizer files transformers makes of a GGUF file's tokenizer metadata:
/// (file name, bytes), e.g. tokenizer.json, tokenizer_config.json and chat_template.jinja
/// when it has a chat template; empty when the file has no tokenizer metadata.
// The GGUF conversion writes these beside the dense weights; until it calls
// this, only the tests do.
#[allow(dead_code)]
pub(crate) fn hf_files(
    metadata: &[(String, MetaValue)],
    architecture: &str,
) -> Result<Vec<(String, Vec<u8>)>> {
    let meta = Meta(metadata);
    if !metadata
        .iter()
        .any(|(k, _)| k.starts_with("tokenizer.ggml."))
    {
        return Ok(Vec::new());
    }
    let model = meta
        .string("tokenizer.ggml.model")?
        .ok_or_else(|| bad("tokenizer.ggml.model is missing"))?;
    let builder = match (model, architecture) {
        ("gpt2", _) => Builder::ByteLevel,
        ("llama", "gemma" | "gemma2" | "gemma3") => Builder::Gemma,
        ("llama", "phi3") => Builder::Phi3,
        ("llama", _) => Builder::Llama,
        (other, _) => {
            return Err(Error::bare(
                Rule::Unsupported,
                format!("tokenizer.ggml.model {other:?} is not converted"),
            ))
        }
    };
    let class = Class::of(architecture)?;
    let tokens = meta
        .strings("tokenizer.ggml.tokens")?
        .ok_or_else(|| bad("tokenizer.ggml.tokens is missing"))?;
    let types = meta.ints("tokenizer.ggml.token_type")?.unwrap_or_default();
    if !types.is_empty() && types.len() != tokens.len() {
        return Err(bad(format!(
            "tokenizer.ggml.token_type has {} items, tokenizer.ggml.tokens {}",
            types.len(),
            tokens.len()
        )));
    }
    // The named special tokens, by the file's ids (`get_gguf_tokenizer`).
    let mut named = Vec::new();
    for (name, key) in [
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ] {
        let key = format!("tokenizer.ggml.{key}");
        let token = match meta.uint(&key)? {
            None => None,
            Some(id) => Some(
                *usize::try_from(id)
                    .ok()
                    .and_then(|i| tokens.get(i))
                    .ok_or_else(|| {
                        bad(format!("{key} is {id}, past the {} tokens", tokens.len()))
                    })?,
            ),
        };
        named.push((name, token));
    }
    let token_of = |name: &str| named.iter().find(|(n, _)| *n == name).and_then(|(_, t)| *t);
    // llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise.
    let add_bos = meta
        .bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(model == "llama");
    let add_eos = meta.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let explicit = model == "llama"
        || meta.get("tokenizer.ggml.add_bos_token").is_some()
        || meta.get("tokenizer.ggml.add_eos_token").is_some();

    let mut tokenizer = builder.build(&meta, &tokens)?;
    // The builder class's own defaults, added when it is made.
    add(
        &mut tokenizer,
        false,
        builder.defaults().iter().map(|t| special(t)),
    )?;
    // Control tokens; in a byte-level vocabulary only those spelled in its
    // byte alphabet (another is a llama.cpp mislabel).
    let alphabet = byte_alphabet();
    let control = tokens
        .iter()
        .zip(&types)
        .filter(|&(t, &ty)| {
            ty == CONTROL
                && (builder != Builder::ByteLevel || t.chars().all(|c| alphabet.contains_key(&c)))
        })
        .map(|(t, _)| special(t));
    add(&mut tokenizer, true, control.collect::<Vec<_>>())?;
    let vocab = tokenizer.get_vocab(true);
    let user_defined = tokens
        .iter()
        .zip(&types)
        .filter(|&(t, &ty)| ty == USER_DEFINED && vocab.contains_key(*t))
        .map(|(t, _)| AddedToken::from(*t, false).normalized(false));
    add(&mut tokenizer, false, user_defined.collect::<Vec<_>>())?;
    if let Some(split) = meta.string("tokenizer.ggml.pre")?.and_then(split_regex) {
        let split = Split::new(
            SplitPattern::Regex(split.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| bad(format!("tokenizer.ggml.pre: {e}")))?;
        tokenizer.with_pre_tokenizer(Some(PreTokenizerSequence::new(vec![
            split.into(),
            ByteLevel::new(false, true, false).into(),
        ])));
    }

    // The class the architecture loads: its named tokens, when not added yet.
    let mut outer: Vec<&str> = named.iter().filter_map(|(_, t)| *t).collect();
    if class == Class::Gemma {
        outer.push("<mask>");
    }
    let added = tokenizer.get_added_tokens_decoder();
    let mut missing: Vec<&str> = Vec::new();
    for t in &outer {
        if !added.values().any(|a| a.content == *t) && !missing.contains(t) {
            missing.push(t);
        }
    }
    add(&mut tokenizer, false, missing.iter().map(|t| special(t)))?;
    if class == Class::Qwen2 {
        // `Qwen2Tokenizer` adds its special tokens once more, as special.
        let mut all: Vec<&str> = Vec::new();
        for t in &outer {
            if !all.contains(t) {
                all.push(t);
            }
        }
        add(&mut tokenizer, false, all.iter().map(|t| special(t)))?;
    }
    // Without a flag in the file the builder's post-processor stays: it
    // adds nothing (add_bos_token and add_eos_token default to false).
    let bos = token_of("bos_token").filter(|_| explicit && add_bos);
    let eos = token_of("eos_token").filter(|_| explicit && add_eos);
    let post = post_processor(&tokenizer, bos, eos)?;
    tokenizer.with_post_processor(Some(post));

    let json = tokenizer
        .to_string(true)
        .map_err(|e| Error::bare(Rule::Internal, format!("tokenizer.json: {e}")))?;
    let mut files = vec![
        ("tokenizer.json".to_owned(), json.into_bytes()),
        (
            "tokenizer_config.json".to_owned(),
            tokenizer_config(class, &named).into_bytes(),
        ),
    ];
    if let Some(template) = meta.string("tokenizer.chat_template")? {
        files.push((
            "chat_template.jinja".to_owned(),
            template.as_bytes().to_vec(),
        ));
    }
    Ok(files)
}

/// A Rule::Gguf error about the tokenizer metadata.
fn bad(detail: impl Into<String>) -> Error {
    Error::bare(Rule::Gguf, detail)
}

/// A special token as transformers adds one (`AddedToken(t, special=True)`:
/// not normalized).
fn special(content: &str) -> AddedToken {
    AddedToken::from(content, true)
}

/// Adds `tokens` in one call, as transformers does (ids of new tokens are
/// handed out per call).
fn add(
    tokenizer: &mut Tokenizer,
    as_special: bool,
    tokens: impl IntoIterator<Item = AddedToken>,
) -> Result<()> {
    let tokens: Vec<AddedToken> = tokens.into_iter().collect();
    if tokens.is_empty() {
        return Ok(());
    }
    let added = if as_special {
        tokenizer.add_special_tokens(tokens)
    } else {
        tokenizer.add_tokens(tokens)
    };
    added
        .map(drop)
        .map_err(|e| bad(format!("cannot add the tokenizer's tokens: {e}")))
}

/// `update_post_processor`: bos before and eos after each sequence.
fn post_processor(
    tokenizer: &Tokenizer,
    bos: Option<&str>,
    eos: Option<&str>,
) -> Result<TemplateProcessing> {
    let id = |t: &str| {
        tokenizer
            .token_to_id(t)
            .ok_or_else(|| bad(format!("special token {t:?} is not in the vocabulary")))
    };
    let piece = |t: Option<&str>, ty: u8| t.map(|t| format!("{t}:{ty}"));
    let single: Vec<String> = [piece(bos, 0), Some("$A:0".into()), piece(eos, 0)]
        .into_iter()
        .flatten()
        .collect();
    let mut pair = single.clone();
    pair.extend(
        [piece(bos, 1), Some("$B:1".into()), piece(eos, 1)]
            .into_iter()
            .flatten(),
    );
    let mut specials = Vec::new();
    for t in [bos, eos].into_iter().flatten() {
        specials.push((t.to_owned(), id(t)?));
    }
    let template = |pieces: Vec<String>| {
        Template::try_from(pieces).map_err(|e| bad(format!("special token: {e}")))
    };
    TemplateProcessing::builder()
        .single(template(single)?)
        .pair(template(pair)?)
        .special_tokens(specials)
        .build()
        .map_err(|e| bad(format!("special token: {e}")))
}

/// The tokenizer class transformers loads for an architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// `TokenizersBackend`: the file's tokenizer as it is.
    Backend,
    /// `Qwen2Tokenizer`.
    Qwen2,
    /// `GemmaTokenizer`: a `<mask>` token besides the file's.
    Gemma,
}

impl Class {
    fn of(architecture: &str) -> Result<Class> {
        Ok(match architecture {
            "llama" | "phi3" => Class::Backend,
            "qwen2" | "qwen2moe" | "qwen3" | "qwen3moe" => Class::Qwen2,
            "gemma" | "gemma2" | "gemma3" => Class::Gemma,
            other => {
                return Err(Error::bare(
                    Rule::Unsupported,
                    format!("the tokenizer of general.architecture {other:?} is not converted"),
                ))
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            Class::Backend => "TokenizersBackend",
            Class::Qwen2 => "Qwen2Tokenizer",
            Class::Gemma => "GemmaTokenizer",
        }
    }
}

/// `tokenizer_config.json` as `save_pretrained` writes it: sorted keys, two
/// spaces. `is_local` and `local_files_only` are what transformers records
/// for a tokenizer loaded from a local folder, which the reference was.
fn tokenizer_config(class: Class, named: &[(&str, Option<&str>)]) -> String {
    let text = |t: Option<&str>| serde_json::to_string(&t).unwrap_or_else(|_| "null".into());
    let mut fields: Vec<(&str, String)> = vec![
        ("backend", text(Some("tokenizers"))),
        ("is_local", "true".into()),
        ("local_files_only", "false".into()),
        // int(1e30), as transformers writes VERY_LARGE_INTEGER.
        ("model_max_length", "1000000000000000019884624838656".into()),
        ("tokenizer_class", text(Some(class.name()))),
    ];
    fields.extend(named.iter().map(|&(n, t)| (n, text(t))));
    match class {
        Class::Qwen2 => fields.push(("add_prefix_space", "null".into())),
        Class::Gemma => fields.push(("mask_token", text(Some("<mask>")))),
        Class::Backend => {}
    }
    fields.sort_by(|a, b| a.0.cmp(b.0));
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("  {}: {v}", text(Some(k))))
        .collect();
    format!("{{\n{}\n}}\n", body.join(",\n"))
}

/// The builder transformers picks from `tokenizer.ggml.model` and the architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Builder {
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
    fn defaults(self) -> &'static [&'static str] {
        match self {
            Builder::ByteLevel => &["<|endoftext|>"],
            Builder::Llama | Builder::Phi3 => &["<s>", "</s>", "<unk>"],
            Builder::Gemma => &["<bos>", "<eos>", "<unk>", "<pad>", "<mask>"],
        }
    }

    fn build(self, meta: &Meta, tokens: &[&str]) -> Result<Tokenizer> {
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
fn byte_alphabet() -> HashMap<char, u8> {
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
fn merges_of(keys: &[String], scores: &[f64]) -> Vec<(String, String)> {
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
    let mut merges: Vec<Merge> = Vec::new();
    let mut local: Vec<(usize, usize, Merge)> = Vec::new();
    for token in order {
        let s = score.get(token).copied().unwrap_or(0.0);
        let chars = token.chars().count();
        for (n, (at, _)) in token.char_indices().skip(1).enumerate() {
            let (left, right) = token.split_at(at);
            if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) {
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

/// The split regex a `tokenizer.ggml.pre` name stands for
/// (`GGUF_PRE_TOKENIZER_SPLITS`); `None` keeps the builder's pre-tokenizer.
fn split_regex(pre: &str) -> Option<&'static str> {
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

/// Typed reads of the metadata; a value of the wrong type is a Rule::Gguf error.
struct Meta<'a>(&'a [(String, MetaValue)]);

impl<'a> Meta<'a> {
    fn get(&self, key: &str) -> Option<&'a MetaValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn wrong(key: &str, what: &str, v: &MetaValue) -> Error {
        bad(format!("{key} is {v}, not {what}"))
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| Self::wrong(key, "a string", v)))
            .transpose()
    }

    fn uint(&self, key: &str) -> Result<Option<u64>> {
        self.get(key)
            .map(|v| v.as_u64().ok_or_else(|| Self::wrong(key, "a token id", v)))
            .transpose()
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| match v {
                MetaValue::Bool(b) => Ok(*b),
                _ => Err(Self::wrong(key, "a bool", v)),
            })
            .transpose()
    }

    fn array(&self, key: &str, what: &str) -> Result<Option<&'a [MetaValue]>> {
        self.get(key)
            .map(|v| match v {
                MetaValue::Array(items) => Ok(items.as_slice()),
                _ => Err(Self::wrong(key, what, v)),
            })
            .transpose()
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        let what = "an array of strings";
        self.array(key, what)?
            .map(|items| {
                items
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .ok_or_else(|| bad(format!("{key} holds {v}, not {what}")))
                    })
                    .collect()
            })
            .transpose()
    }

    fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let what = "an array of integers";
        self.array(key, what)?
            .map(|items| {
                items
                    .iter()
                    .map(|v| match *v {
                        MetaValue::I8(x) => Ok(x.into()),
                        MetaValue::I16(x) => Ok(x.into()),
                        MetaValue::I32(x) => Ok(x.into()),
                        MetaValue::I64(x) => Ok(x),
                        MetaValue::U8(x) => Ok(x.into()),
                        MetaValue::U16(x) => Ok(x.into()),
                        MetaValue::U32(x) => Ok(x.into()),
                        _ => Err(bad(format!("{key} holds {v}, not {what}"))),
                    })
                    .collect()
            })
            .transpose()
    }

    fn floats(&self, key: &str) -> Result<Option<Vec<f64>>> {
        let what = "an array of numbers";
        self.array(key, what)?
            .map(|items| {
                items
                    .iter()
                    .map(|v| match *v {
                        MetaValue::F32(x) => Ok(x.into()),
                        MetaValue::F64(x) => Ok(x),
                        _ => Err(bad(format!("{key} holds {v}, not {what}"))),
                    })
                    .collect()
            })
            .transpose()
    }
}

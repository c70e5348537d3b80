//! A GGUF file's tokenizer metadata (`tokenizer.ggml.*`,
//! `tokenizer.chat_template`) as Hugging Face tokenizer files that load into
//! the tokenizer transformers 5.25 builds in memory for the same file
//! (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`): the files its
//! `save_pretrained` writes, except where those would load into another
//! tokenizer (step 6).
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
//!    `Qwen2Tokenizer`, `GemmaTokenizer`, `GPT2Tokenizer`) adds the file's bos/eos/unk/pad
//!    (and Gemma's `<mask>`) when not added yet, and sets the post-processor
//!    from `add_bos_token`/`add_eos_token`;
//! 6. `tokenizer_config.json` names that class only when loading
//!    tokenizer.json through it gives this tokenizer back (`names_class`),
//!    else `TokenizersBackend`, which takes tokenizer.json as it is. A byte-level
//!    gemma3 file saved by transformers names `GemmaTokenizer`, whose reload
//!    is SentencePiece-shaped and cannot encode ("Unk token `None` not found").

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::{Template, TemplateProcessing};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::error::{Error, Result, Rule};
use crate::gguf::MetaValue;

mod builder;
mod meta;

use builder::{byte_alphabet, split_regex, Builder};
use meta::Meta;

#[cfg(test)]
mod tests;

/// llama.cpp's token types.
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// The Hugging Face tokenizer files transformers makes of a GGUF file's tokenizer metadata:
/// (file name, bytes), e.g. tokenizer.json, tokenizer_config.json and chat_template.jinja
/// when it has a chat template; empty when the file has no tokenizer metadata.
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
    let split = meta.string("tokenizer.ggml.pre")?.and_then(split_regex);
    if let Some(split) = split {
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

    let keeps_class = names_class(class, architecture, builder, split.is_some());
    let json = tokenizer
        .to_string(true)
        .map_err(|e| Error::bare(Rule::Internal, format!("tokenizer.json: {e}")))?;
    let mut files = vec![
        ("tokenizer.json".to_owned(), json.into_bytes()),
        (
            "tokenizer_config.json".to_owned(),
            tokenizer_config(class, keeps_class, &named).into_bytes(),
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

/// Whether `tokenizer_config.json` names `class` rather than
/// `TokenizersBackend`: when the class reloads to the same tokenizer, or
/// when the name changes nothing because transformers picks the class by
/// model type whatever the file says (`MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`;
/// of ours only qwen2 gets a class other than `TokenizersBackend` so). A
/// qwen2 output then reloads with NFC, which the in-memory tokenizer lacks.
fn names_class(class: Class, architecture: &str, builder: Builder, split: bool) -> bool {
    class.reloads(builder, split) || architecture == "qwen2"
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
    /// `GPT2Tokenizer` (starcoder2): the file's tokenizer as it is, two
    /// more fields in its config.
    Gpt2,
}

impl Class {
    fn of(architecture: &str) -> Result<Class> {
        Ok(match architecture {
            // transformers maps no tokenizer class to llama and falcon, and
            // TokenizersBackend to the others.
            "llama" | "phi3" | "stablelm" | "falcon" | "nemotron" => Class::Backend,
            "starcoder2" => Class::Gpt2,
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

    /// Whether transformers, loading our tokenizer.json through this class,
    /// gets the tokenizer built here. A class with its own `__init__` takes
    /// only the vocabulary and merges from the file
    /// (`convert_to_native_format`) and makes its own normalizer,
    /// pre-tokenizer, decoder and unk around them.
    fn reloads(self, builder: Builder, split: bool) -> bool {
        match self {
            Class::Backend => true,
            // Gemma's SentencePiece, split on spaces: the Gemma builder's.
            Class::Gemma => builder == Builder::Gemma && !split,
            // Byte-level, split by GPT-2's regex: the byte-level builder's
            // when `tokenizer.ggml.pre` names no regex of its own.
            Class::Gpt2 => builder == Builder::ByteLevel && !split,
            // An NFC normalizer, which no GGUF builder has.
            Class::Qwen2 => false,
        }
    }

    /// The side the class pads on (`padding_side`), which a
    /// `TokenizersBackend` loaded in its place must be told.
    fn padding_side(self) -> &'static str {
        match self {
            Class::Gemma => "left",
            Class::Backend | Class::Qwen2 | Class::Gpt2 => "right",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Class::Backend => "TokenizersBackend",
            Class::Qwen2 => "Qwen2Tokenizer",
            Class::Gemma => "GemmaTokenizer",
            Class::Gpt2 => "GPT2Tokenizer",
        }
    }
}

/// `tokenizer_config.json` as `save_pretrained` writes it: sorted keys, two
/// spaces. `is_local` and `local_files_only` are what transformers records
/// for a tokenizer loaded from a local folder, which the reference was.
/// When the class does not reload to the same tokenizer the file names
/// `TokenizersBackend`, with the class's arguments and padding side.
fn tokenizer_config(class: Class, keeps_class: bool, named: &[(&str, Option<&str>)]) -> String {
    let text = |t: Option<&str>| serde_json::to_string(&t).unwrap_or_else(|_| "null".into());
    let mut fields: Vec<(&str, String)> = vec![
        ("backend", text(Some("tokenizers"))),
        ("is_local", "true".into()),
        ("local_files_only", "false".into()),
        // int(1e30), as transformers writes VERY_LARGE_INTEGER.
        ("model_max_length", "1000000000000000019884624838656".into()),
    ];
    let written = if keeps_class { class } else { Class::Backend };
    fields.push(("tokenizer_class", text(Some(written.name()))));
    if class.padding_side() != written.padding_side() {
        fields.push(("padding_side", text(Some(class.padding_side()))));
    }
    fields.extend(named.iter().map(|&(n, t)| (n, text(t))));
    match class {
        Class::Qwen2 => fields.push(("add_prefix_space", "null".into())),
        Class::Gemma => fields.push(("mask_token", text(Some("<mask>")))),
        Class::Gpt2 => {
            fields.push(("add_prefix_space", "false".into()));
            fields.push(("errors", text(Some("replace"))));
        }
        Class::Backend => {}
    }
    fields.sort_by(|a, b| a.0.cmp(b.0));
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("  {}: {v}", text(Some(k))))
        .collect();
    format!("{{\n{}\n}}\n", body.join(",\n"))
}

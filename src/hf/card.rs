//! What the dense output says of itself, so that `hf upload OUT` publishes
//! a model that transformers loads and the Hub describes rightly: no file
//! that describes the quantization is copied ([`QUANTIZATION_FILES`]), and
//! the model card is made, not copied ([`readme`]).
//!
//! The card's YAML front matter says `library_name: transformers`, names
//! the source as `base_model` where it is a Hub id, and keeps the source
//! card's `license` (with `license_name` and `license_link`), `language`,
//! `pipeline_tag` and `tags`, less the tags that name a format or a
//! quantization ([`is_format_tag`]). Its body is one line: what it was
//! made from and how. The source card's body is not kept: it describes the
//! quantized files (how to load them, their size, their evaluations).
//!
//! Front matter is read by a parser of the subset model cards use
//! (top-level `key: scalar`, `[a, b]` and `- item` lists, quoted or
//! plain); a key in any other form is left out. A full YAML crate would
//! be one more dependency for five keys, and `serde_yaml` is unmaintained.

use crate::checkpoint::Checkpoint;
use crate::numerics::OutDtype;

/// Files that describe how a checkpoint was quantized, never copied to the
/// dense output (a loader or the Hub could take it for quantized): the
/// producers' own records beside `config.json`'s `quantization_config`.
pub(crate) const QUANTIZATION_FILES: &[&str] = &[
    // llm-compressor's recipe.
    "recipe.yaml",
    "recipe.yml",
    // AutoGPTQ's and GPTQModel's (and older AutoAWQ's) quantize config.
    "quantize_config.json",
    // AutoAWQ's.
    "quant_config.json",
    // AutoRound's.
    "quantization_config.json",
    // NVIDIA ModelOpt's.
    "hf_quant_config.json",
    // optimum-quanto's map of quantized modules.
    "quanto_qmap.json",
    // SINQ's sidecar of its modules' non-tensor meta.
    crate::checkpoint::SINQ_META,
];

/// Tags that name a file format or a quantization, dropped from the card
/// (besides the patterns [`is_format_tag`] matches: `4-bit`, `int4`,
/// `w4a16`, `q4_k_m`, …).
const FORMAT_TAGS: &[&str] = &[
    "mlx",
    "mlx-my-repo",
    "gguf",
    "gguf-my-repo",
    "llama-cpp",
    "llama.cpp",
    "gptq",
    "auto-gptq",
    "autogptq",
    "gptqmodel",
    "awq",
    "autoawq",
    "auto-round",
    "autoround",
    "compressed-tensors",
    "llm-compressor",
    "llmcompressor",
    "modelopt",
    "nvidia-modelopt",
    "bitsandbytes",
    "bnb",
    "quark",
    "svdquant",
    "nunchaku",
    "fbgemm",
    "fbgemm_fp8",
    "hqq",
    "sinq",
    "exl2",
    "quanto",
    "nf4",
    "fp4",
    "e4m3",
    "e2m1",
    "quantized",
    "quantization",
];

/// Whether `tag` names a format or a quantization: one of [`FORMAT_TAGS`],
/// a bit width (`4-bit`, `8bit`), a number format (`int4`, `fp8`,
/// `nvfp4`, `mxfp4`), a scheme (`w4a16`) or a GGUF type (`q4_k_m`,
/// `iq2_xxs`, `q8_0`); case aside.
pub(crate) fn is_format_tag(tag: &str) -> bool {
    let t = tag.trim().to_ascii_lowercase();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let bits = t
        .strip_suffix("bits")
        .or_else(|| t.strip_suffix("bit"))
        .map(|s| s.strip_suffix('-').unwrap_or(s))
        .is_some_and(digits);
    let number = ["int", "uint", "fp", "nvfp", "mxfp", "mxint"]
        .iter()
        .any(|p| t.strip_prefix(p).is_some_and(digits));
    let scheme = t
        .strip_prefix('w')
        .and_then(|s| s.split_once('a'))
        .is_some_and(|(w, a)| digits(w) && digits(a));
    let ggml = t
        .strip_prefix('i')
        .unwrap_or(&t)
        .strip_prefix('q')
        .is_some_and(|s| {
            let mut parts = s.split('_');
            parts.next().is_some_and(digits)
                && parts.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric()))
        });
    FORMAT_TAGS.contains(&t.as_str()) || bits || number || scheme || ggml
}

/// A front matter value, as far as the card keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Scalar(String),
    List(Vec<String>),
}

/// The front matter of `card` (between a first line `---` and the next
/// `---`) as its top-level keys, in order; keys whose value is of another
/// form (a mapping, a block scalar) are left out.
fn front_matter(card: &str) -> Vec<(String, Value)> {
    let mut lines = card.lines();
    if lines.next().map(str::trim_end) != Some("---") {
        return Vec::new();
    }
    let front: Vec<&str> = lines.take_while(|l| l.trim_end() != "---").collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < front.len() {
        let line = front[i];
        i += 1;
        let top = !line.starts_with([' ', '\t', '-', '#']) && !line.trim().is_empty();
        let Some((key, rest)) = line.split_once(':').filter(|_| top) else {
            continue;
        };
        let key = unquote(key.trim());
        let rest = strip_comment(rest).trim();
        // What belongs to this key: indented lines, and `- item`s.
        let start = i;
        while i < front.len()
            && (front[i].starts_with([' ', '\t', '-', '#']) || front[i].trim().is_empty())
        {
            i += 1;
        }
        let value = if rest.is_empty() {
            let items: Option<Vec<String>> = front[start..i]
                .iter()
                .map(|l| l.trim())
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(|l| l.strip_prefix('-').and_then(|item| scalar(item.trim())))
                .collect();
            items.filter(|items| !items.is_empty()).map(Value::List)
        } else if let Some(flow) = rest.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            let items: Option<Vec<String>> = flow
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(scalar)
                .collect();
            items.map(Value::List)
        } else if start == i {
            scalar(rest).map(Value::Scalar)
        } else {
            None
        };
        if let Some(value) = value {
            out.push((key, value));
        }
    }
    out
}

/// `text` without a trailing ` # comment` (outside quotes).
fn strip_comment(text: &str) -> &str {
    let mut quote = None;
    let mut prev = ' ';
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if prev.is_whitespace() => return &text[..i],
            _ => {}
        }
        prev = c;
    }
    text
}

/// A plain or quoted scalar's text; `None` for anything else (a mapping,
/// a block scalar, an anchor or a tag).
fn scalar(text: &str) -> Option<String> {
    let text = strip_comment(text).trim();
    if text.starts_with('"') {
        return serde_json::from_str::<String>(text).ok();
    }
    if let Some(inner) = text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) {
        return Some(inner.replace("''", "'"));
    }
    let special = text.starts_with(['[', '{', '|', '>', '&', '*', '!', '%', '@', '`']);
    let mapping = text.contains(": ") || text.ends_with(':');
    (!text.is_empty() && !special && !mapping).then(|| text.to_string())
}

/// A key as written, its quotes aside.
fn unquote(key: &str) -> String {
    scalar(key).unwrap_or_else(|| key.to_string())
}

/// `s` as a YAML scalar: plain where YAML reads it back as this string,
/// else double-quoted (JSON's quoting, which YAML reads).
fn yaml_scalar(s: &str) -> String {
    let plain = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_./+".contains(&b))
        && s.starts_with(|c: char| c.is_ascii_alphabetic())
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "yes" | "no" | "on" | "off" | "null" | "y" | "n"
        );
    if plain {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
    }
}

/// The Hub repository a checkpoint came from: `ORG/NAME`, the commit, and
/// how the card names it (with the GGUF file picked in it).
#[derive(Debug, PartialEq, Eq)]
struct Hub {
    repo: String,
    commit: Option<String>,
    shown: String,
}

impl Hub {
    /// The repository `ckpt` was read from: a Hub run's pinned id, or the
    /// Hugging Face cache's snapshot folder it is
    /// (`…/models--ORG--NAME/snapshots/COMMIT`, as offline runs read it).
    /// `None` for any other folder: its name is no Hub id, and names the
    /// same model differently on every machine (and not at all in a
    /// browser), so the card does not name it.
    fn of(ckpt: &Checkpoint) -> Option<Hub> {
        // `ORG/NAME@COMMIT[/FILE.gguf]`.
        if let Some(name) = &ckpt.name {
            let (repo, rest) = name.split_once('@').unwrap_or((name, ""));
            let (commit, file) = rest.split_once('/').unwrap_or((rest, ""));
            return Some(Hub {
                repo: repo.to_string(),
                commit: (!commit.is_empty()).then(|| commit.to_string()),
                shown: match file {
                    "" => repo.to_string(),
                    file => format!("{repo} ({file})"),
                },
            });
        }
        let full = ckpt.dir.canonicalize().ok()?;
        let mut up = full.ancestors();
        let name =
            |p: Option<&std::path::Path>| Some(p?.file_name()?.to_string_lossy().into_owned());
        let (commit, snapshots, folder) = (name(up.next())?, name(up.next())?, name(up.next())?);
        let (org, model) = folder.strip_prefix("models--")?.split_once("--")?;
        let repo = format!("{org}/{model}");
        (snapshots == "snapshots" && crate::repo::RepoId::parse(&repo).is_some()).then(|| Hub {
            shown: repo.clone(),
            repo,
            commit: Some(commit),
        })
    }
}

/// The dense output's `README.md` for `ckpt` decoded to `dtype` from
/// its `format` (as the format describes itself): the source card's front
/// matter as the module says, and one line saying what it was made from
/// and how. Written for a checkpoint folder or a GGUF model, with or
/// without a card of its own (a published folder needs one to say what
/// library loads it and where it came from); not for a single
/// `.safetensors` file, whose output is not a model folder.
pub(crate) fn readme(ckpt: &Checkpoint, dtype: OutDtype, format: &str) -> Option<Vec<u8>> {
    if ckpt.single_file && ckpt.gguf.is_none() {
        return None;
    }
    let hub = Hub::of(ckpt);
    let mut front = front_matter(&ckpt.model_card().unwrap_or_default());
    if let Some(license) = ckpt
        .gguf
        .as_ref()
        .and_then(|g| g.get("general.license")?.as_str())
    {
        front.push(("license".into(), Value::Scalar(license.to_string())));
    }
    let get = |key: &str| front.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let mut text = String::from("---\n");
    let mut put = |key: &str, value: &Value| match value {
        Value::Scalar(s) => text += &format!("{key}: {}\n", yaml_scalar(s)),
        Value::List(items) if items.is_empty() => {}
        Value::List(items) => {
            text += &format!("{key}:\n");
            for item in items {
                text += &format!("- {}\n", yaml_scalar(item));
            }
        }
    };
    // The source on the Hub, else the base model its own card names (a
    // local folder's name is no Hub id, and the Hub refuses a card whose
    // `base_model` is not one).
    match (&hub, get("base_model")) {
        (Some(hub), _) => put("base_model", &Value::Scalar(hub.repo.clone())),
        (None, Some(base)) => put("base_model", base),
        (None, None) => {}
    }
    put("library_name", &Value::Scalar("transformers".into()));
    for key in [
        "license",
        "license_name",
        "license_link",
        "language",
        "pipeline_tag",
    ] {
        if let Some(value) = get(key) {
            put(key, value);
        }
    }
    if let Some(value) = get("tags") {
        let kept = match value {
            Value::Scalar(t) => vec![t.clone()],
            Value::List(tags) => tags.clone(),
        };
        put(
            "tags",
            &Value::List(kept.into_iter().filter(|t| !is_format_tag(t)).collect()),
        );
    }
    text += "---\n\n";
    let from = match &hub {
        Some(hub) => {
            let at = hub
                .commit
                .as_ref()
                .map(|c| format!(" at {c}"))
                .unwrap_or_default();
            format!("[{}](https://huggingface.co/{}){at}", hub.shown, hub.repo)
        }
        None => "a local checkpoint".to_string(),
    };
    text += &format!(
        "Dense {} weights made from {from} ({}) with wgpu-dequant {}.\n",
        dtype,
        format,
        env!("CARGO_PKG_VERSION")
    );
    Some(text.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_matter_keeps_the_subset_model_cards_use() {
        let card = "---\n\
            license: apache-2.0 # a comment\n\
            license_name: \"my: license\"\n\
            language:\n  - en\n  - 'fr'\n\
            tags: [mlx, chat]\n\
            model-index:\n- name: x\n  results: []\n\
            widget:\n  text: hi\n\
            base_model:\n- org/base\n\
            ---\n# Body\n---\nnot front matter: 1\n";
        assert_eq!(
            front_matter(card),
            vec![
                ("license".into(), Value::Scalar("apache-2.0".into())),
                ("license_name".into(), Value::Scalar("my: license".into())),
                (
                    "language".into(),
                    Value::List(vec!["en".into(), "fr".into()])
                ),
                (
                    "tags".into(),
                    Value::List(vec!["mlx".into(), "chat".into()])
                ),
                ("base_model".into(), Value::List(vec!["org/base".into()])),
            ]
        );
        assert!(front_matter("# no front matter\nlicense: mit\n").is_empty());
    }

    #[test]
    fn format_tags_are_told_from_the_others() {
        for tag in [
            "mlx",
            "GGUF",
            "gptq",
            "4-bit",
            "8bit",
            "int4",
            "fp8",
            "nvfp4",
            "mxfp4",
            "w4a16",
            "q4_k_m",
            "IQ2_XXS",
            "q8_0",
            "compressed-tensors",
            "modelopt",
            "bitsandbytes",
        ] {
            assert!(is_format_tag(tag), "{tag}");
        }
        for tag in [
            "chat",
            "llama",
            "text-generation",
            "qwen3",
            "conversational",
            "moe",
            "q",
            "int",
        ] {
            assert!(!is_format_tag(tag), "{tag}");
        }
    }

    #[test]
    fn scalars_are_written_as_yaml_reads_them_back() {
        assert_eq!(yaml_scalar("apache-2.0"), "apache-2.0");
        assert_eq!(yaml_scalar("org/name"), "org/name");
        assert_eq!(yaml_scalar("yes"), "\"yes\"");
        assert_eq!(yaml_scalar("2.0"), "\"2.0\"");
        assert_eq!(yaml_scalar("a: b"), "\"a: b\"");
    }
}

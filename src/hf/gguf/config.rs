//! `config.json` and `generation_config.json` from a GGUF file's metadata,
//! as transformers 5.25 builds and saves them: its config class's defaults
//! ([`defaults.json`](../defaults.json), written by
//! `tests/gguf/make_hf_defaults.py`), the fields the file states over them,
//! then the fields the class derives from those (`head_dim`, `layer_types`,
//! `rope_parameters`, Falcon's head counts).

use serde_json::{json, Map, Value};

use super::rope::{self, Factors};
use super::Arch;
use crate::error::Warning;
use crate::error::{Error, Result, Rule};
use crate::gguf::Gguf;
use crate::gguf::MetaValue;
use crate::numerics::OutDtype;

/// Config fields that hold a real number (the others hold counts).
const REAL: &[&str] = &[
    "rope_theta",
    "rms_norm_eps",
    "norm_epsilon",
    "layer_norm_eps",
    "norm_eps",
];

/// Counts that may be 0 (a window of 0 is none).
const MAY_BE_ZERO: &[&str] = &["sliding_window"];

/// The transformers version whose conventions the files follow
/// (`rope_parameters` is 5.x's).
const TRANSFORMERS: &str = "5.25.0";

/// Each model type's class defaults.
fn defaults(model_type: &str) -> Result<Map<String, Value>> {
    static TEXT: &str = include_str!("defaults.json");
    let all: Value = serde_json::from_str(TEXT)
        .map_err(|e| Error::bare(Rule::Internal, format!("defaults.json: {e}")))?;
    match all.get(model_type) {
        Some(Value::Object(m)) => Ok(m.clone()),
        _ => Err(Error::bare(
            Rule::Internal,
            format!("defaults.json has no {model_type}"),
        )),
    }
}

/// A metadata value as transformers' `_gguf_parse_value` reads it: numbers
/// (f32 widened), text, lists.
fn value(v: &MetaValue) -> Value {
    match v {
        MetaValue::U8(x) => json!(x),
        MetaValue::I8(x) => json!(x),
        MetaValue::U16(x) => json!(x),
        MetaValue::I16(x) => json!(x),
        MetaValue::U32(x) => json!(x),
        MetaValue::I32(x) => json!(x),
        MetaValue::U64(x) => json!(x),
        MetaValue::I64(x) => json!(x),
        MetaValue::F32(x) => json!(f64::from(*x)),
        MetaValue::F64(x) => json!(x),
        MetaValue::Bool(b) => json!(b),
        MetaValue::String(s) => json!(s),
        MetaValue::Array(items) => Value::Array(items.iter().map(|v| value(&v)).collect()),
    }
}

/// `config.json` of a GGUF model of architecture `arch`, written in `dtype`;
/// `tied` when the file has no `output.weight`; `factors` reads the rope
/// factor tensors. With it, the warnings of what the config cannot state.
pub(crate) fn config(
    gguf: &Gguf,
    arch: &Arch,
    tied: bool,
    dtype: OutDtype,
    factors: Factors<'_>,
) -> Result<(Value, Vec<Warning>)> {
    let mut c = defaults(arch.model_type)?;
    let mut set = |k: &str, v: Value| {
        c.insert(k.to_string(), v);
    };
    set("model_type", json!(arch.model_type));
    set("architectures", json!([arch.class]));
    set("dtype", json!(dtype.torch_name()));
    set("tie_word_embeddings", json!(tied));
    set("transformers_version", json!(TRANSFORMERS));
    if let Some(MetaValue::String(name)) = gguf.get("general.name") {
        // transformers renames the architecture inside every text it reads
        // (`tiny-qwen3moe` becomes `tiny-qwen3_moe`).
        let renamed = match arch.gguf {
            "qwen2moe" | "qwen3moe" => arch.model_type,
            other => other,
        };
        set(
            "_model_name_or_path",
            json!(name.replace(arch.gguf, renamed)),
        );
    }
    for (field, pieces, when_present) in arch.from_tensors {
        let present = gguf
            .tensors
            .keys()
            .any(|name| pieces.iter().any(|p| name.contains(p)));
        set(field, json!(present == *when_present));
    }
    if arch.model_type == "qwen3_moe" {
        // transformers' GGUF default: llama.cpp normalises the top-k weights.
        set("norm_topk_prob", json!(true));
    }
    let mut rope_theta = None;
    for (key, field) in arch.config {
        let full = format!("{}.{key}", arch.gguf);
        let Some(v) = gguf.get(&full) else {
            continue;
        };
        check_field(&full, field, v)?;
        match *field {
            "rope_theta" => rope_theta = Some(value(v)),
            // Qwen3MoeConfig's attribute for it.
            "num_experts" if arch.model_type == "qwen3_moe" => set("num_local_experts", value(v)),
            f => set(f, value(v)),
        }
    }
    for (key, field) in [
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("unknown_token_id", "unk_token_id"),
        ("padding_token_id", "pad_token_id"),
    ] {
        if let Some(v) = gguf.get(&format!("tokenizer.ggml.{key}")) {
            set(field, value(v));
        }
    }
    if gguf.get(&format!("{}.vocab_size", arch.gguf)).is_none() {
        if let Some(MetaValue::Array(tokens)) = gguf.get("tokenizer.ggml.tokens") {
            set("vocab_size", json!(tokens.len()));
        }
    }
    // First: derive() lays out one entry a layer, so the layer count must
    // be the tensors' before it is trusted.
    agree(gguf, arch)?;
    derive(&mut c, arch, rope_theta)?;
    let width = rotary(&c);
    let warnings = rope::scale(&mut c, gguf, arch, width, factors)?;
    // transformers writes its keys sorted.
    c.sort_keys();
    Ok((Value::Object(c), warnings))
}

/// Refuses a value that no model can have: a real number that is not
/// finite and positive, a count that is not a whole number (or is 0), a
/// value of another type.
fn check_field(key: &str, field: &str, v: &MetaValue) -> Result<()> {
    if REAL.contains(&field) {
        return rope::positive_value(key, v).map(|_| ());
    }
    match v.as_u64() {
        Some(0) if !MAY_BE_ZERO.contains(&field) => Err(Error::bare(
            Rule::GgufValue,
            format!("{key} is 0; a model has at least one"),
        )),
        Some(_) => Ok(()),
        None => Err(Error::bare(
            Rule::GgufValue,
            format!("{key} is {}, expected a whole number", rope::shown(v)),
        )),
    }
}

/// Refuses counts the file states that its tensors disagree with: the
/// layers, the embedding width, the MLP width, the experts, the K/V heads'
/// share of the heads.
fn agree(gguf: &Gguf, arch: &Arch) -> Result<()> {
    let key = |k: &str| format!("{}.{k}", arch.gguf);
    let count = |k: &str| gguf.get(&key(k)).and_then(MetaValue::as_u64);
    let disagree = |k: &str, stated: u64, found: String| {
        Err(Error::bare(
            Rule::GgufValue,
            format!("{} is {stated}, but {found}", key(k)),
        ))
    };
    let numbers: std::collections::BTreeSet<u64> = gguf
        .tensors
        .keys()
        .filter_map(|n| {
            n.strip_prefix("blk.")?
                .split_once('.')?
                .0
                .parse::<u64>()
                .ok()
        })
        .collect();
    let layers = numbers.last().map_or(0, |last| last + 1);
    // Every layer up to the last has tensors (a layer number far past the
    // others is no model's).
    if let Some(missing) = (0..).zip(&numbers).find(|&(i, &n)| i != n).map(|(i, _)| i) {
        return Err(Error::bare(
            Rule::GgufValue,
            format!(
                "the tensors make {layers} layers, but layer {missing} has none (no blk.{missing}.* tensor)"
            ),
        ));
    }
    if let Some(n) = count("block_count").filter(|&n| n != layers) {
        return disagree(
            "block_count",
            n,
            format!(
                "the tensors make {layers} layer{}",
                if layers == 1 { "" } else { "s" }
            ),
        );
    }
    let shape = |name: &str| gguf.tensors.get(name).map(|(_, s)| s.as_slice());
    if let (Some(h), Some(&[_, cols])) = (count("embedding_length"), shape("token_embd.weight")) {
        if h != cols as u64 {
            return disagree(
                "embedding_length",
                h,
                format!("token_embd.weight is {cols} wide"),
            );
        }
    }
    if let (Some(f), Some(&[_, cols])) =
        (count("feed_forward_length"), shape("blk.0.ffn_down.weight"))
    {
        if f != cols as u64 {
            return disagree(
                "feed_forward_length",
                f,
                format!("blk.0.ffn_down.weight is {cols} wide"),
            );
        }
    }
    if let (Some(e), Some(&[stack, ..])) =
        (count("expert_count"), shape("blk.0.ffn_up_exps.weight"))
    {
        if e != stack as u64 {
            return disagree(
                "expert_count",
                e,
                format!("blk.0.ffn_up_exps.weight stacks {stack}"),
            );
        }
    }
    if let (Some(q), Some(kv)) = (
        count("attention.head_count"),
        count("attention.head_count_kv"),
    ) {
        if q % kv != 0 {
            return disagree(
                "attention.head_count_kv",
                kv,
                format!("{q} attention heads do not share {kv} K/V heads evenly"),
            );
        }
    }
    Ok(())
}

/// The rotary width: `head_dim` (or the hidden size per head) times the
/// partial rotary factor.
fn rotary(c: &Map<String, Value>) -> usize {
    let count = |k: &str| c.get(k).and_then(Value::as_u64);
    let head_dim = match count("head_dim") {
        Some(d) => d,
        None => {
            count("hidden_size").unwrap_or(0) / count("num_attention_heads").unwrap_or(1).max(1)
        }
    };
    let rope = c.get("rope_parameters");
    let partial = rope
        .and_then(|r| r.get("full_attention").or(Some(r)))
        .and_then(|r| r.get("partial_rotary_factor"))
        .or(c.get("partial_rotary_factor"))
        .and_then(Value::as_f64)
        .unwrap_or(1.0);
    // As transformers: int(head_dim * partial_rotary_factor).
    (head_dim as f64 * partial) as usize
}

/// What the config class computes from the fields set.
fn derive(c: &mut Map<String, Value>, arch: &Arch, rope_theta: Option<Value>) -> Result<()> {
    let int = |c: &Map<String, Value>, k: &str| {
        c.get(k).and_then(Value::as_u64).ok_or_else(|| {
            Error::bare(
                Rule::Gguf,
                format!("{}: the config field {k} is not a whole number", arch.gguf),
            )
        })
    };
    let layers = int(c, "num_hidden_layers")?;
    if matches!(arch.model_type, "llama" | "nemotron") && !c.contains_key("head_dim") {
        let heads = int(c, "num_attention_heads")?.max(1);
        c.insert("head_dim".into(), json!(int(c, "hidden_size")? / heads));
    }
    if arch.model_type == "falcon" {
        // FalconConfig's own: the file's head_count_kv does not survive.
        let heads = int(c, "num_attention_heads")?;
        let flag = |k: &str| c.get(k).and_then(Value::as_bool).unwrap_or(false);
        let kv = if flag("new_decoder_architecture") || !flag("multi_query") {
            heads
        } else {
            1
        };
        // A file with more K/V heads (Falcon-40B's new decoder
        // architecture) gets a fused QKV that FalconForCausalLM cannot take:
        // transformers refuses it (a size mismatch), and so does this.
        if let Some(file) = c.get("num_key_value_heads").and_then(Value::as_u64) {
            if file != kv {
                return Err(Error::bare(
                    Rule::Unsupported,
                    format!(
                        "falcon: the file has {file} K/V heads; transformers 5.25 builds every falcon GGUF with {kv} (multi-query, as Falcon-7B) and cannot load it"
                    ),
                ));
            }
        }
        c.insert("num_kv_heads".into(), json!(heads));
        c.insert("num_key_value_heads".into(), json!(kv));
        c.insert("ffn_hidden_size".into(), json!(int(c, "hidden_size")? * 4));
    }
    // Which layers attend to a window: Gemma 2 every other one, Gemma 3 five
    // in six; the Qwen-style ones none (use_sliding_window is false).
    let every = match arch.model_type {
        "gemma2" => Some(2),
        "gemma3_text" => c.get("_sliding_window_pattern").and_then(Value::as_u64),
        _ => None,
    };
    if matches!(
        arch.model_type,
        "qwen2" | "qwen3" | "qwen2_moe" | "gemma2" | "gemma3_text"
    ) {
        let kinds: Vec<&str> = (1..=layers)
            .map(|i| match every {
                Some(n) if i % n.max(1) != 0 => "sliding_attention",
                _ => "full_attention",
            })
            .collect();
        c.insert("layer_types".into(), json!(kinds));
    }
    if let Some(theta) = rope_theta {
        if let Some(m) = rope::full_attention(c) {
            m.insert("rope_theta".into(), theta);
        }
    }
    Ok(())
}

/// `generation_config.json` as transformers derives it from the config
/// (`GenerationConfig.from_model_config`).
pub(crate) fn generation_config(config: &Value) -> Value {
    let mut g = Map::new();
    g.insert("_from_model_config".into(), json!(true));
    for k in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        if let Some(v) = config.get(k).filter(|v| !v.is_null()) {
            g.insert(k.into(), v.clone());
        }
    }
    g.insert("output_attentions".into(), json!(false));
    g.insert("output_hidden_states".into(), json!(false));
    g.insert("transformers_version".into(), json!(TRANSFORMERS));
    g.insert("use_cache".into(), json!(true));
    g.sort_keys();
    Value::Object(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;

    fn gguf(arch: &str, meta: &[(&str, MetaValue)], tensors: &[&str]) -> Gguf {
        let mut metadata = vec![(
            "general.architecture".to_owned(),
            MetaValue::String(arch.into()),
        )];
        metadata.extend(meta.iter().map(|(k, v)| (format!("{arch}.{k}"), v.clone())));
        Gguf {
            version: 3,
            metadata,
            // Two layers, as block_count says.
            tensors: tensors
                .iter()
                .chain(&["blk.0.attn_norm.weight", "blk.1.attn_norm.weight"])
                .map(|t| (t.to_string(), (GgmlType::F32, vec![4])))
                .collect(),
        }
    }

    fn row(name: &str) -> &'static Arch {
        super::super::ARCHS.iter().find(|a| a.gguf == name).unwrap()
    }

    /// The config of a `name` file with `meta` and `tensors`, written to
    /// bf16 with no rotary factors.
    fn config_of(
        name: &str,
        meta: &[(&str, MetaValue)],
        tensors: &[&str],
        tied: bool,
    ) -> Result<Value> {
        config(
            &gguf(name, meta, tensors),
            row(name),
            tied,
            OutDtype::Bf16,
            &|_| Ok(None),
        )
        .map(|(c, _)| c)
    }

    const SHAPE: [(&str, MetaValue); 3] = [
        ("block_count", MetaValue::U32(2)),
        ("embedding_length", MetaValue::U32(64)),
        ("attention.head_count", MetaValue::U32(4)),
    ];

    #[test]
    fn stablelm_reads_its_flags_off_the_tensors() {
        let cases = [
            (
                &["blk.0.attn_q.bias", "blk.0.ffn_norm.weight"][..],
                true,
                false,
            ),
            (
                &["blk.0.attn_q.weight", "blk.0.attn_norm.weight"][..],
                false,
                true,
            ),
        ];
        for (tensors, bias, parallel) in cases {
            let c = config_of("stablelm", &SHAPE, tensors, false).unwrap();
            assert_eq!(c["use_qkv_bias"], json!(bias), "{tensors:?}");
            assert_eq!(c["use_parallel_residual"], json!(parallel), "{tensors:?}");
        }
    }

    #[test]
    fn falcon_derives_its_head_counts_and_refuses_more_kv_heads() {
        let mut meta = SHAPE.to_vec();
        meta.push(("attention.head_count_kv", MetaValue::U32(1)));
        let c = config_of("falcon", &meta, &[], true).unwrap();
        assert_eq!(
            (
                &c["num_kv_heads"],
                &c["num_key_value_heads"],
                &c["ffn_hidden_size"]
            ),
            (&json!(4), &json!(1), &json!(256))
        );
        meta.pop();
        meta.push(("attention.head_count_kv", MetaValue::U32(2)));
        let e = config_of("falcon", &meta, &[], true).unwrap_err();
        assert_eq!(e.rule, Rule::Unsupported, "{e}");
        assert!(e.to_string().contains("2 K/V heads"), "{e}");
    }

    #[test]
    fn nemotron_derives_head_dim() {
        let c = config_of("nemotron", &SHAPE, &[], false).unwrap();
        assert_eq!(c["head_dim"], json!(16));
    }

    /// Layers the tensors do not have are refused (GGUF-004) before the
    /// config lays out an entry for each: a block count of four billion,
    /// and a layer number that far with none below it.
    #[test]
    fn layers_the_tensors_lack_are_refused_before_they_are_laid_out() {
        let huge = |n: u32| {
            [
                ("block_count", MetaValue::U32(n)),
                ("embedding_length", MetaValue::U32(64)),
                ("attention.head_count", MetaValue::U32(4)),
            ]
        };
        let cases = [
            (
                gguf("qwen2", &huge(u32::MAX), &[]),
                "is 4294967295, but the tensors make 2 layers",
            ),
            (
                gguf(
                    "qwen2",
                    &huge(4_000_000_001),
                    &["blk.4000000000.attn_norm.weight"],
                ),
                "layer 2 has none",
            ),
        ];
        for (g, want) in cases {
            let e = config(&g, row("qwen2"), false, OutDtype::Bf16, &|_| Ok(None)).unwrap_err();
            assert_eq!(e.rule, Rule::GgufValue, "{e}");
            assert!(e.to_string().contains(want), "{e}");
        }
    }

    /// Values no model has are refused by key (GGUF-004), not written.
    #[test]
    fn impossible_metadata_is_refused_by_key() {
        let cases = [
            (
                "attention.layer_norm_rms_epsilon",
                MetaValue::F32(f32::NAN),
                "NaN",
            ),
            (
                "attention.layer_norm_rms_epsilon",
                MetaValue::F32(-1e-5),
                "finite and positive",
            ),
            (
                "block_count",
                MetaValue::U64(1 << 62),
                "the tensors make 2 layers",
            ),
            (
                "rope.freq_base",
                MetaValue::String("abc".into()),
                "the string \"abc\"",
            ),
            (
                "rope.freq_base",
                MetaValue::F32(f32::INFINITY),
                "finite and positive",
            ),
            (
                "attention.head_count",
                MetaValue::F32(4.0),
                "a whole number",
            ),
            ("attention.head_count_kv", MetaValue::U32(3), "evenly"),
            ("attention.head_count", MetaValue::U32(0), "is 0"),
        ];
        for (key, value, why) in cases {
            let mut meta: Vec<(&str, MetaValue)> =
                SHAPE.iter().filter(|(k, _)| *k != key).cloned().collect();
            meta.push((key, value));
            let e = config_of("llama", &meta, &[], false).unwrap_err();
            assert_eq!(e.rule, Rule::GgufValue, "{key}: {e}");
            let text = e.to_string();
            assert!(
                text.contains(&format!("llama.{key}")) && text.contains(why),
                "{key}: {text}"
            );
        }
    }

    /// llama.cpp's Llama 3 factors become llama3 rope_parameters; the
    /// factor tensor's length must be the rotary width's half.
    #[test]
    fn rope_freqs_become_llama3_parameters() {
        let mut meta = SHAPE.to_vec();
        meta.push(("rope.freq_base", MetaValue::F32(500000.0)));
        // head_dim 16: 8 factors, the first four 1, the last two 32.
        let freqs = vec![1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 32.0, 32.0];
        let read = |name: &str| Ok((name == "rope_freqs.weight").then(|| freqs.clone()));
        let (c, warnings) = config(
            &gguf("llama", &meta, &[]),
            row("llama"),
            false,
            OutDtype::Bf16,
            &read,
        )
        .unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let rope = &c["rope_parameters"];
        assert_eq!(
            (&rope["rope_type"], &rope["factor"]),
            (&json!("llama3"), &json!(32.0)),
            "{rope}"
        );
        let short = |name: &str| Ok((name == "rope_freqs.weight").then(|| vec![1.0; 7]));
        let e = config(
            &gguf("llama", &meta, &[]),
            row("llama"),
            false,
            OutDtype::Bf16,
            &short,
        )
        .unwrap_err();
        assert_eq!(e.rule, Rule::GgufValue, "{e}");
    }
}

//! GPTQModel's per-module overrides, `quantization_config.dynamic`: an
//! ordered map from a pattern to the settings of the modules it matches.
//!
//! As GPTQModel resolves it (`dynamic_get`, 7.7): the module name is the
//! stored one, the tensor names without their last part
//! (`model.layers.1.mlp.down_proj`); a key is a regex, optionally prefixed
//! `+:` (overrides, the same as no prefix) or `-:` (the module is not
//! quantized: stored dense, copied); it is matched at the start of the name
//! only (Python's `re.match`: anchored at the start, not the end); the first
//! key in the file's order that matches decides and nothing merges. An
//! override replaces `bits`, `group_size`, `desc_act`, `sym` (and
//! `pack_dtype`) of the base config; other keys there steer quantization
//! and change nothing stored.
//!
//! GPTQModel compiles keys with PCRE2; here they are compiled by
//! `fancy-regex`, which reads the syntax these keys use (classes, groups,
//! alternation, `\d`/`\w`/`\.` escapes, counted repeats, inline flags,
//! lookaround and back-references). A key it cannot compile is refused.
//!
//! AutoRound's `extra_config` is read by the same rules (one resolver, two
//! readers): as AutoRound 0.16's loader resolves it (`get_layer_config`,
//! `_expand_regex_config`), a key that is the name of a stored module
//! decides that module and beats every regex; any other key is a Python
//! regex found anywhere in the name (`re.search`), the first in the file's
//! order deciding; a regex that matches a module inside the quantized blocks
//! (`block_name_to_quantize`) is not applied outside them (AutoRound prefers
//! in-block layers and falls back to the rest only when none matches). An
//! entry's `bits` above 8 (16) stores the module dense. Missing settings
//! come from the base config, as for `dynamic`.

use std::path::Path;

use fancy_regex::Regex;
use serde_json::{Map, Value};

use super::gptq::{AUTOROUND_BITS, BITS};
use crate::error::{Error, Result, Rule};

/// How a rule's key is matched against a module's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyMatch {
    /// GPTQModel: a regex matched at the start (`re.match`).
    Start,
    /// AutoRound: the key is a stored module's name and decides it alone.
    Exact,
    /// AutoRound: a regex found anywhere in the name (`re.search`).
    Search,
}

/// What kind of entry `settings` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// Integer settings (GPTQModel's `+:` or plain keys, AutoRound's
    /// integer exports).
    Int,
    /// GPTQModel's `-:` key: the module is stored dense.
    Dense,
    /// An entry of AutoRound's FP exports: FP data types and activation
    /// settings allowed.
    Fp,
}

/// One `dynamic` / `extra_config` entry.
#[derive(Debug, Clone)]
pub(crate) struct DynamicRule {
    /// The key as written (`-:model\.layers\.1\..*`).
    pub(crate) key: String,
    /// `-:` (GPTQModel) or bits above 8 (AutoRound): the matched modules are
    /// stored dense.
    pub(crate) dense: bool,
    how: KeyMatch,
    /// `None` for an exact key.
    pattern: Option<Regex>,
    /// AutoRound: the regex matches a module inside the quantized blocks,
    /// so it is not applied outside them.
    blocks_only: bool,
    pub(crate) bits: Option<u32>,
    /// `Some(None)`: -1, one group.
    pub(crate) group_size: Option<Option<usize>>,
    pub(crate) desc_act: Option<bool>,
    pub(crate) sym: Option<bool>,
    /// AutoRound's FP exports: the entry's `data_type` (lowercase).
    pub(crate) data_type: Option<String>,
}

/// A setting read as `T` (absent or null: not overridden).
fn get<T>(
    o: &Map<String, Value>,
    name: &str,
    read: fn(&Value) -> Option<T>,
    kind: &str,
) -> std::result::Result<Option<T>, String> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => read(v)
            .map(Some)
            .ok_or_else(|| format!("{name} {v} is not {kind}")),
    }
}

/// The settings of one entry, checked; `what` names the config key
/// (`dynamic`, `extra_config`). `dense` entries keep no settings.
fn settings(
    path: &Path,
    what: &str,
    key: &str,
    over: &Value,
    how: KeyMatch,
    pattern: Option<Regex>,
    entry: Entry,
) -> Result<DynamicRule> {
    let (gptqmodel_dense, fp) = (entry == Entry::Dense, entry == Entry::Fp);
    let bad = |e: String| Error::new(Rule::Config, path, format!("{what}: {key:?}: {e}"));
    let unsupported =
        |e: String| Error::new(Rule::Unsupported, path, format!("{what}: {key:?} {e}"));
    let Value::Object(o) = over else {
        return Err(Error::new(
            Rule::Config,
            path,
            format!("{what}: the overrides of {key:?} are not an object"),
        ));
    };
    let int = |name: &str| get(o, name, Value::as_i64, "an integer").map_err(bad);
    let flag = |name: &str| get(o, name, Value::as_bool, "a boolean").map_err(bad);
    let autoround = how != KeyMatch::Start;
    let raw_bits = int("bits")?;
    // AutoRound's `check_to_quantized`: a module is quantized at bits <= 8
    // (or act_bits <= 8, refused below).
    let dense = gptqmodel_dense || (autoround && raw_bits.is_some_and(|b| b > 8));
    let bits = match raw_bits {
        _ if dense => None,
        None => None,
        Some(b) => match u32::try_from(b) {
            Ok(b) if !autoround && BITS.contains(&b) => Some(b),
            Ok(b) if autoround && AUTOROUND_BITS.contains(&b) => Some(b),
            _ if autoround => {
                return Err(unsupported(format!(
                    "gives bits {b}; AutoRound's packings decode only 2 to 8"
                )))
            }
            _ => {
                return Err(unsupported(format!(
                    "gives bits {b}; GPTQ packing decodes only 2, 3, 4 and 8"
                )))
            }
        },
    };
    let group_size = match int("group_size")? {
        None => None,
        g => Some(super::group_size(g, path).map_err(|e| bad(e.to_string()))?),
    };
    match o.get("pack_dtype") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.trim_start_matches("torch.") == "int32" => {}
        Some(v) => {
            return Err(unsupported(format!(
                "gives pack_dtype {v}; only int32 is decoded"
            )))
        }
    }
    for name in [
        "format",
        "checkpoint_format",
        "fmt",
        "method",
        "quant_method",
    ] {
        if let Some(v) = o.get(name).filter(|v| !v.is_null()) {
            return Err(unsupported(format!(
                "gives {name} {v}; a per-module format is not decoded"
            )));
        }
    }
    let data_type = match o.get("data_type") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.to_ascii_lowercase()),
        Some(v) => return Err(bad(format!("data_type {v} is not a string"))),
    };
    match (autoround && !dense, fp) {
        (true, false) => autoround_scheme(o).map_err(unsupported)?,
        // An FP export's entries carry their activation settings (which a
        // dense checkpoint does not quantize); the weight's data type is
        // checked with the module's whole scheme.
        (true, true) => autoround_unsupported_keys(o).map_err(unsupported)?,
        _ => {}
    }
    Ok(DynamicRule {
        key: key.to_string(),
        dense,
        how,
        pattern,
        blocks_only: false,
        bits,
        group_size,
        desc_act: flag("desc_act")?,
        sym: flag("sym")?,
        data_type,
    })
}

/// AutoRound scheme settings this tool decodes: integer weights, no
/// activation quantization, no double quantization, no rotation. `o` is a
/// whole `quantization_config` or one `extra_config` entry.
pub(crate) fn autoround_scheme(o: &Map<String, Value>) -> std::result::Result<(), String> {
    match o.get("data_type") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "int" => {}
        Some(v) => {
            return Err(format!(
                "gives data_type {v}; only int weights are decoded in GPTQ/AWQ packing"
            ))
        }
    }
    match o.get("act_bits") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_i64().is_some_and(|b| b > 8) => {}
        Some(v) => {
            return Err(format!(
                "gives act_bits {v}; quantized activations (a different packing) are not decoded"
            ))
        }
    }
    autoround_unsupported_keys(o)
}

/// AutoRound settings never decoded, whatever the packing: double
/// quantization and rotations.
pub(crate) fn autoround_unsupported_keys(
    o: &Map<String, Value>,
) -> std::result::Result<(), String> {
    for name in ["super_bits", "super_group_size", "rotation_config"] {
        if let Some(v) = o.get(name).filter(|v| !v.is_null()) {
            return Err(format!("gives {name} {v}, which is not decoded"));
        }
    }
    Ok(())
}

/// Reads GPTQModel's `dynamic`; every key is checked whether or not it
/// matches a module.
pub(crate) fn parse(path: &Path, dynamic: &Value) -> Result<Vec<DynamicRule>> {
    let Value::Object(map) = dynamic else {
        return Err(Error::new(
            Rule::Config,
            path,
            "dynamic: expected an object from module pattern to overrides",
        ));
    };
    map.iter()
        .map(|(key, over)| {
            let (dense, raw) = match (key.strip_prefix("-:"), key.strip_prefix("+:")) {
                (Some(raw), _) => (true, raw),
                (None, Some(raw)) => (false, raw),
                (None, None) => (false, key.as_str()),
            };
            // Anchored at the start only, as `re.match` is.
            let pattern = Regex::new(&format!("^(?:{raw})")).map_err(|e| {
                Error::new(
                    Rule::Config,
                    path,
                    format!("dynamic: key {key:?} is not a regex this tool reads: {e}"),
                )
            })?;
            settings(
                path,
                "dynamic",
                key,
                over,
                KeyMatch::Start,
                Some(pattern),
                if dense { Entry::Dense } else { Entry::Int },
            )
        })
        .collect()
}

/// Reads AutoRound's `extra_config`. `modules` are the stored modules'
/// names (a key among them is exact); `blocks` the config's
/// `block_name_to_quantize` prefixes, when it names them. Exact keys come
/// first, then the regex keys in the file's order. `fp`: the config is an
/// FP export's (`auto_round:llm_compressor`), whose entries may name FP
/// data types and activation settings.
pub(crate) fn parse_extra_config(
    path: &Path,
    extra: &Value,
    modules: &[&str],
    blocks: Option<&[String]>,
    fp: bool,
) -> Result<Vec<DynamicRule>> {
    let Value::Object(map) = extra else {
        return Err(Error::new(
            Rule::Config,
            path,
            "extra_config: expected an object from module name or regex to settings",
        ));
    };
    let entry = if fp { Entry::Fp } else { Entry::Int };
    let in_block = |m: &str| blocks.is_none_or(|b| b.iter().any(|p| m.starts_with(p.as_str())));
    let mut exact = Vec::new();
    let mut regex = Vec::new();
    for (key, over) in map {
        if modules.contains(&key.as_str()) {
            exact.push(settings(
                path,
                "extra_config",
                key,
                over,
                KeyMatch::Exact,
                None,
                entry,
            )?);
            continue;
        }
        let pattern = Regex::new(key).map_err(|e| {
            Error::new(
                Rule::Config,
                path,
                format!("extra_config: key {key:?} is neither a stored module nor a regex this tool reads: {e}"),
            )
        })?;
        let mut rule = settings(
            path,
            "extra_config",
            key,
            over,
            KeyMatch::Search,
            Some(pattern),
            entry,
        )?;
        if blocks.is_some() {
            for m in modules.iter().filter(|m| in_block(m)) {
                if rule.hits(path, m)? {
                    rule.blocks_only = true;
                    break;
                }
            }
        }
        regex.push(rule);
    }
    exact.extend(regex);
    Ok(exact)
}

impl DynamicRule {
    /// AutoRound: the key is a stored module's name.
    pub(crate) fn is_exact(&self) -> bool {
        self.how == KeyMatch::Exact
    }

    /// Whether the key matches `module` (the block preference aside).
    fn hits(&self, path: &Path, module: &str) -> Result<bool> {
        match (&self.pattern, self.how) {
            (None, _) | (_, KeyMatch::Exact) => Ok(self.key == module),
            (Some(p), _) => p.is_match(module).map_err(|e| {
                Error::new(
                    Rule::Config,
                    path,
                    format!("key {:?} on module {module}: {e}", self.key),
                )
            }),
        }
    }
}

/// The rule that decides `module`: the first whose key matches. `in_block`:
/// the module is inside the quantized blocks (always, for GPTQModel).
pub(crate) fn decide<'r>(
    rules: &'r [DynamicRule],
    path: &Path,
    module: &str,
    in_block: bool,
) -> Result<Option<&'r DynamicRule>> {
    for r in rules {
        if r.blocks_only && !in_block {
            continue;
        }
        if r.hits(path, module)? {
            return Ok(Some(r));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(v: Value) -> Vec<DynamicRule> {
        parse(Path::new("config.json"), &v).unwrap()
    }

    fn key_for(rules: &[DynamicRule], m: &str) -> Option<String> {
        decide(rules, Path::new("config.json"), m, true)
            .unwrap()
            .map(|r| r.key.clone())
    }

    /// First match in file order; anchored at the start, not the end; `+:`
    /// and no prefix are the same; `-:` marks dense.
    #[test]
    fn first_match_from_the_start() {
        let r = rules(json!({
            "-:model\\.layers\\.1\\.self_attn\\.o_proj": {},
            "+:.*down_proj": {"bits": 8},
            "model\\.layers\\.1\\.": {"bits": 8, "group_size": 32},
            "layers\\.0": {"bits": 2},
        }));
        assert_eq!(
            key_for(&r, "model.layers.1.self_attn.o_proj").as_deref(),
            Some("-:model\\.layers\\.1\\.self_attn\\.o_proj")
        );
        assert!(r[0].dense && !r[1].dense && !r[2].dense);
        assert_eq!(
            key_for(&r, "model.layers.1.mlp.down_proj").as_deref(),
            Some("+:.*down_proj")
        );
        assert_eq!(
            key_for(&r, "model.layers.1.mlp.up_proj").as_deref(),
            Some("model\\.layers\\.1\\.")
        );
        // Not anchored at the start of the name: no match.
        assert_eq!(key_for(&r, "model.layers.0.mlp.up_proj"), None);
        assert_eq!(r[2].group_size, Some(Some(32)));
    }

    /// PCRE's lookahead, which keys use to leave modules out, reads as it
    /// does there.
    #[test]
    fn lookahead_keys() {
        let r = rules(json!({"(?!.*\\.layers\\.0\\.).*mlp": {"bits": 8}}));
        assert!(key_for(&r, "model.layers.1.mlp.up_proj").is_some());
        assert_eq!(key_for(&r, "model.layers.0.mlp.up_proj"), None);
    }

    /// AutoRound: a stored module's name beats every regex; regex keys are
    /// found anywhere in the name, the first in file order deciding; one
    /// that hits a module inside the blocks is not applied outside them;
    /// bits above 8 is dense.
    #[test]
    fn extra_config_exact_then_search() {
        let modules = [
            "model.layers.0.self_attn.k_proj",
            "model.layers.0.mlp.up_proj",
            "model.layers.0.mlp.down_proj",
            "lm_head",
        ];
        let blocks = ["model.layers".to_string()];
        let r = parse_extra_config(
            Path::new("config.json"),
            &json!({
                ".*proj.*": {"bits": 2},
                "k_proj": {"bits": 3},
                "model.layers.0.self_attn.k_proj": {"bits": 8},
                "mlp.(up|down)": {"bits": 16},
                "head": {"group_size": 64},
            }),
            &modules,
            Some(&blocks),
            false,
        )
        .unwrap();
        let at = |m: &str, in_block: bool| {
            decide(&r, Path::new("config.json"), m, in_block)
                .unwrap()
                .map(|r| r.key.clone())
        };
        assert_eq!(
            at("model.layers.0.self_attn.k_proj", true).as_deref(),
            Some("model.layers.0.self_attn.k_proj")
        );
        assert_eq!(
            at("model.layers.0.mlp.up_proj", true).as_deref(),
            Some(".*proj.*")
        );
        assert_eq!(
            at("model.layers.1.self_attn.k_proj", true).as_deref(),
            Some(".*proj.*")
        );
        // `.*proj.*` hits in-block modules: not applied outside the blocks.
        assert_eq!(at("visual.proj", false), None);
        assert_eq!(at("lm_head", false).as_deref(), Some("head"));
        let dense = r.iter().find(|r| r.key == "mlp.(up|down)").unwrap();
        assert!(dense.dense && dense.bits.is_none());
        let e = parse_extra_config(
            Path::new("config.json"),
            &json!({"lm_head": {"bits": 4, "data_type": "nv_fp"}}),
            &modules,
            None,
            false,
        )
        .unwrap_err();
        assert_eq!(e.rule, Rule::Unsupported, "{e}");
        let e = parse_extra_config(
            Path::new("config.json"),
            &json!({"lm_head": {"bits": 4, "act_bits": 8}}),
            &modules,
            None,
            false,
        )
        .unwrap_err();
        assert_eq!(e.rule, Rule::Unsupported, "{e}");
    }

    #[test]
    fn refused_keys_and_values() {
        let p = Path::new("config.json");
        for (v, rule) in [
            (json!({"model\\.layers\\.(": {}}), Rule::Config),
            (json!({".*": {"bits": 5}}), Rule::Unsupported),
            (json!({".*": {"bits": "4"}}), Rule::Config),
            (json!({".*": {"group_size": 0}}), Rule::Config),
            (json!({".*": {"pack_dtype": "int64"}}), Rule::Unsupported),
            (json!({".*": {"format": "marlin"}}), Rule::Unsupported),
            (json!({".*": 4}), Rule::Config),
            (json!([".*"]), Rule::Config),
        ] {
            let e = parse(p, &v).unwrap_err();
            assert_eq!(e.rule, rule, "{v}: {e}");
        }
    }
}

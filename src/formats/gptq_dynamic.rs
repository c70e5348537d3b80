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

use std::path::Path;

use fancy_regex::Regex;
use serde_json::Value;

use super::gptq::BITS;
use crate::error::{Error, Result, Rule};

/// One `dynamic` entry.
#[derive(Debug, Clone)]
pub(crate) struct DynamicRule {
    /// The key as written (`-:model\.layers\.1\..*`).
    pub(crate) key: String,
    /// `-:`: the matched modules are stored dense.
    pub(crate) dense: bool,
    pattern: Regex,
    pub(crate) bits: Option<u32>,
    /// `Some(None)`: -1, one group.
    pub(crate) group_size: Option<Option<usize>>,
    pub(crate) desc_act: Option<bool>,
    pub(crate) sym: Option<bool>,
}

/// Reads `dynamic`; every key is checked whether or not it matches a module.
pub(crate) fn parse(path: &Path, dynamic: &Value) -> Result<Vec<DynamicRule>> {
    let bad = |what: String| Error::new(Rule::Config, path, format!("dynamic: {what}"));
    let Value::Object(map) = dynamic else {
        return Err(bad(
            "expected an object from module pattern to overrides".into()
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
            let pattern = Regex::new(&format!("^(?:{raw})"))
                .map_err(|e| bad(format!("key {key:?} is not a regex this tool reads: {e}")))?;
            let Value::Object(o) = over else {
                return Err(bad(format!("the overrides of {key:?} are not an object")));
            };
            // A setting read as `T` (absent or null: not overridden).
            fn get<T>(
                o: &serde_json::Map<String, Value>,
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
            let int = |name: &str| {
                get(o, name, Value::as_i64, "an integer").map_err(|e| bad(format!("{key:?}: {e}")))
            };
            let flag = |name: &str| {
                get(o, name, Value::as_bool, "a boolean").map_err(|e| bad(format!("{key:?}: {e}")))
            };
            let bits = match int("bits")? {
                None => None,
                Some(b) => match u32::try_from(b) {
                    Ok(b) if BITS.contains(&b) => Some(b),
                    _ => {
                        return Err(Error::new(
                            Rule::Unsupported,
                            path,
                            format!(
                                "dynamic: {key:?} gives bits {b}; GPTQ decodes only 2, 3, 4 and 8"
                            ),
                        ))
                    }
                },
            };
            let group_size = match int("group_size")? {
                None => None,
                g => Some(super::group_size(g, path).map_err(|e| bad(format!("{key:?}: {e}")))?),
            };
            match o.get("pack_dtype") {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) if s.trim_start_matches("torch.") == "int32" => {}
                Some(v) => {
                    return Err(Error::new(
                        Rule::Unsupported,
                        path,
                        format!("dynamic: {key:?} gives pack_dtype {v}; only int32 is decoded"),
                    ))
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
                    return Err(Error::new(
                        Rule::Unsupported,
                        path,
                        format!(
                            "dynamic: {key:?} gives {name} {v}; a per-module format is not decoded"
                        ),
                    ));
                }
            }
            Ok(DynamicRule {
                key: key.clone(),
                dense,
                pattern,
                bits,
                group_size,
                desc_act: flag("desc_act")?,
                sym: flag("sym")?,
            })
        })
        .collect()
}

/// The rule that decides `module`: the first whose pattern matches.
pub(crate) fn decide<'r>(
    rules: &'r [DynamicRule],
    path: &Path,
    module: &str,
) -> Result<Option<&'r DynamicRule>> {
    for r in rules {
        let hit = r.pattern.is_match(module).map_err(|e| {
            Error::new(
                Rule::Config,
                path,
                format!("dynamic: key {:?} on module {module}: {e}", r.key),
            )
        })?;
        if hit {
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
        decide(rules, Path::new("config.json"), m)
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

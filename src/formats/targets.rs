//! Module selectors of quantization configs: compressed-tensors `targets` and
//! `ignore` (exact names, `re:` regexes, class names) and ModelOpt's
//! `exclude_modules` globs.

use std::collections::HashSet;

use fancy_regex::Regex;

/// One selector.
#[derive(Debug, Clone)]
pub enum Target {
    /// An exact module name.
    Name(String),
    /// `re:` + a pattern, matched from the start of the name (Python `re.match`;
    /// look-arounds and back-references work as in Python).
    Regex(String, Regex),
    /// A layer class such as `Linear`. Checkpoints do not record classes, so
    /// it selects every module whose tensors carry the format's parameters.
    Class(String),
    /// A shell-style glob, as in ModelOpt's `exclude_modules`.
    Glob(Glob),
}

impl serde::Serialize for Target {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.text())
    }
}

impl Target {
    /// Parses a compressed-tensors selector.
    pub fn parse(s: &str) -> Result<Target, String> {
        if let Some(p) = s.strip_prefix("re:") {
            let re = Regex::new(&format!("^(?:{p})")).map_err(|e| {
                let why = e.to_string();
                format!(
                    "bad regex {s:?}: {}",
                    why.lines().last().unwrap_or_default().trim()
                )
            })?;
            Ok(Target::Regex(s.to_string(), re))
        } else if s.chars().next().is_some_and(|c| c.is_ascii_uppercase()) && !s.contains('.') {
            Ok(Target::Class(s.to_string()))
        } else {
            Ok(Target::Name(s.to_string()))
        }
    }

    /// The selector as written.
    pub fn text(&self) -> &str {
        match self {
            Target::Name(s) | Target::Regex(s, _) | Target::Class(s) => s,
            Target::Glob(g) => g.text(),
        }
    }

    /// How specifically this selects `module`: 3 by name, 2 by regex or glob,
    /// 1 by class, `None` when it does not select it.
    pub fn rank(&self, module: &str) -> Option<u8> {
        match self {
            Target::Name(n) => (n == module).then_some(3),
            // A pattern that exhausts the backtracking budget selects nothing.
            Target::Regex(_, re) => re.is_match(module).unwrap_or(false).then_some(2),
            Target::Glob(g) => g.matches(module).then_some(2),
            Target::Class(_) => Some(1),
        }
    }
}

/// Selectors as a config lists them, its exact names hashed: matching a
/// module costs one lookup and one test per pattern or class, not one per
/// name (a hostile config may list a million names against as many
/// modules). It reads as the list ([`Deref`](std::ops::Deref)).
#[derive(Debug, Clone, Default)]
pub struct Targets {
    list: Vec<Target>,
    names: HashSet<String>,
    /// Where the patterns and classes are in `list`.
    others: Vec<usize>,
}

impl FromIterator<Target> for Targets {
    fn from_iter<I: IntoIterator<Item = Target>>(iter: I) -> Targets {
        let list: Vec<Target> = iter.into_iter().collect();
        let mut names = HashSet::new();
        let mut others = Vec::new();
        for (i, t) in list.iter().enumerate() {
            match t {
                Target::Name(n) => {
                    names.insert(n.clone());
                }
                // A glob without a wildcard names one module, as a name does.
                Target::Glob(g) if g.is_literal() => {
                    names.insert(g.text().to_string());
                }
                _ => others.push(i),
            }
        }
        Targets {
            list,
            names,
            others,
        }
    }
}

impl std::ops::Deref for Targets {
    type Target = [Target];
    fn deref(&self) -> &[Target] {
        &self.list
    }
}

impl serde::Serialize for Targets {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.list.serialize(s)
    }
}

impl Targets {
    /// The most specific selector's [`Target::rank`] of `module`, `None`
    /// when none selects it (a glob without a wildcard ranks as a name).
    pub fn rank(&self, module: &str) -> Option<u8> {
        if self.names.contains(module) {
            return Some(3);
        }
        self.others
            .iter()
            .filter_map(|&i| self.list[i].rank(module))
            .max()
    }

    /// Whether a name, regex or glob selects `module` (a class does not:
    /// a checkpoint does not record classes).
    pub fn names_module(&self, module: &str) -> bool {
        self.names.contains(module)
            || self.others.iter().any(|&i| {
                let t = &self.list[i];
                !matches!(t, Target::Class(_)) && t.rank(module).is_some()
            })
    }
}

/// A shell-style glob as Python's `fnmatch` reads it (ModelOpt's
/// `exclude_modules`, diffuse_compressor's patch patterns): `*` any run of
/// characters, dots included; `?` one; `[...]`/`[!...]` a class. A pattern
/// the glob crate refuses (an unclosed `[`) matches itself literally, as in
/// fnmatch.
#[derive(Debug, Clone)]
pub struct Glob(glob::Pattern);

impl Glob {
    /// Compiles `pattern`.
    pub fn new(pattern: &str) -> Glob {
        Glob(
            glob::Pattern::new(pattern)
                .or_else(|_| glob::Pattern::new(&glob::Pattern::escape(pattern)))
                .unwrap_or_default(),
        )
    }

    /// Whether the whole of `name` matches.
    pub fn matches(&self, name: &str) -> bool {
        self.0.matches(name)
    }

    /// The pattern as written.
    pub fn text(&self) -> &str {
        self.0.as_str()
    }

    /// Whether it has no wildcard (`*`, `?`, `[`): it matches its own text
    /// alone, so a lookup can stand for it.
    pub fn is_literal(&self) -> bool {
        !self.text().contains(['*', '?', '['])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors() {
        let m = "model.layers.0.mlp.down_proj";
        assert_eq!(Target::parse(m).unwrap().rank(m), Some(3));
        assert_eq!(Target::parse("re:.*mlp.*").unwrap().rank(m), Some(2));
        assert_eq!(
            Target::parse("re:mlp").unwrap().rank(m),
            None,
            "re.match anchors at the start"
        );
        assert_eq!(Target::parse("Linear").unwrap().rank(m), Some(1));
        assert_eq!(Target::parse("lm_head").unwrap().rank(m), None);
        assert!(Target::parse("re:(").is_err());
        let not_mlp = Target::parse("re:^(?!.*mlp).*proj$").unwrap();
        assert_eq!(not_mlp.rank(m), None);
        assert_eq!(not_mlp.rank("model.layers.0.self_attn.q_proj"), Some(2));
    }

    #[test]
    fn target_lists() {
        let list: Targets = [
            "lm_head",
            "re:.*mlp.*",
            "Linear",
            "model.layers.0.mlp.down_proj",
        ]
        .iter()
        .map(|s| Target::parse(s).unwrap())
        .collect();
        assert_eq!(list.len(), 4);
        assert_eq!(list.rank("model.layers.0.mlp.down_proj"), Some(3));
        assert_eq!(list.rank("model.layers.1.mlp.down_proj"), Some(2));
        assert_eq!(list.rank("model.layers.1.self_attn.q_proj"), Some(1));
        assert!(list.names_module("lm_head"));
        assert!(list.names_module("model.layers.1.mlp.up_proj"));
        assert!(
            !list.names_module("model.layers.1.self_attn.q_proj"),
            "a class names nothing"
        );
        let none: Targets = std::iter::empty().collect();
        assert_eq!(none.rank("lm_head"), None);
        assert!(!none.names_module("lm_head"));
    }

    #[test]
    fn globs() {
        let m = |p: &str, s: &str| Glob::new(p).matches(s);
        assert!(m("*lm_head*", "lm_head"));
        assert!(m("model.layers.*.mlp", "model.layers.12.mlp"));
        assert!(
            m("model.layers.*", "model.layers.1.mlp.down_proj"),
            "* crosses dots"
        );
        assert!(m("model.layers.?.mlp", "model.layers.1.mlp"));
        assert!(!m("model.layers.?.mlp", "model.layers.12.mlp"));
        assert!(!m("lm_head", "model.lm_head"));
        assert!(m("model.layers.[0-3].mlp", "model.layers.2.mlp"));
        assert!(!m("model.layers.[!0-3].mlp", "model.layers.2.mlp"));
        assert!(m("odd[name", "odd[name"), "an unclosed class is literal");
        // Linear time: no backtracking blow-up on many stars.
        assert!(!m(&"*a".repeat(40), &"a".repeat(39)));
    }
}

//! Module selectors of quantization configs: compressed-tensors `targets` and
//! `ignore` (exact names, `re:` regexes, class names) and ModelOpt's
//! `exclude_modules` globs.

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

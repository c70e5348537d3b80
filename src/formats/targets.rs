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
    /// A shell-style glob (`*`, `?`), as in ModelOpt's `exclude_modules`.
    Glob(String),
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
            Target::Name(s) | Target::Regex(s, _) | Target::Class(s) | Target::Glob(s) => s,
        }
    }

    /// How specifically this selects `module`: 3 by name, 2 by regex or glob,
    /// 1 by class, `None` when it does not select it.
    pub fn rank(&self, module: &str) -> Option<u8> {
        match self {
            Target::Name(n) => (n == module).then_some(3),
            // A pattern that exhausts the backtracking budget selects nothing.
            Target::Regex(_, re) => re.is_match(module).unwrap_or(false).then_some(2),
            Target::Glob(g) => glob_match(g.as_bytes(), module.as_bytes()).then_some(2),
            Target::Class(_) => Some(1),
        }
    }
}

/// `*` matches any run of characters (dots included, as fnmatch does), `?` one.
fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        if p < pat.len() && (pat[p] == b'?' || pat[p] == s[i]) {
            p += 1;
            i += 1;
        } else if p < pat.len() && pat[p] == b'*' {
            star = Some((p, i));
            p += 1;
        } else if let Some((sp, si)) = star {
            p = sp + 1;
            i = si + 1;
            star = Some((sp, si + 1));
        } else {
            return false;
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
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
        assert!(glob_match(b"*lm_head*", b"lm_head"));
        assert!(glob_match(b"model.layers.*.mlp", b"model.layers.12.mlp"));
        assert!(glob_match(b"model.layers.?.mlp", b"model.layers.1.mlp"));
        assert!(!glob_match(b"model.layers.?.mlp", b"model.layers.12.mlp"));
        assert!(!glob_match(b"lm_head", b"model.lm_head"));
    }
}

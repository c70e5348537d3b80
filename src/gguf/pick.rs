//! Which GGUF model a folder or a Hub repository means: its models (a
//! split one counted once, `mmproj*` projectors never), picked by file name
//! or by the quantization tag its file name carries, as `llama-server -hf
//! ORG/NAME:QUANT` and `ollama run hf.co/ORG/NAME:QUANT` read it.

use super::split_name;

/// The tag picked when a repository holds several models and none is
/// named: llama.cpp's and Ollama's default.
pub const DEFAULT_TAG: &str = "Q4_K_M";

/// One GGUF model among a folder's or repository's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its (first) file, a `/`-separated path from the top.
    pub first: String,
    /// All its files, in split order (the first alone when not split).
    pub parts: Vec<String>,
}

impl Candidate {
    /// How a list of candidates shows it: the file, and its parts' count.
    fn shown(&self) -> String {
        match self.parts.len() {
            1 => self.first.clone(),
            n => format!("{} ({n} parts)", self.first),
        }
    }
}

/// The GGUF models among `names` (`/`-separated paths), sorted: every
/// `.gguf` file but `mmproj*` ones (vision projectors), a split model as
/// its first part with every part it names (`NAME-0000i-of-0000N.gguf`
/// beside it); later parts whose first is missing are no model.
pub fn candidates<'n>(names: impl IntoIterator<Item = &'n str>) -> Vec<Candidate> {
    let mut found: Vec<Candidate> = names
        .into_iter()
        .filter(|n| n.ends_with(".gguf"))
        .filter_map(|name| {
            let (dir, base) = match name.rsplit_once('/') {
                Some((dir, base)) => (Some(dir), base),
                None => (None, name),
            };
            if base.to_ascii_lowercase().starts_with("mmproj") {
                return None;
            }
            let parts = match split_name(base) {
                Some((prefix, 1, n)) => (1..=n)
                    .map(|no| {
                        let file = format!("{prefix}-{no:05}-of-{n:05}.gguf");
                        dir.map_or(file.clone(), |d| format!("{d}/{file}"))
                    })
                    .collect(),
                Some(_) => return None,
                None => vec![name.to_string()],
            };
            Some(Candidate {
                first: name.to_string(),
                parts,
            })
        })
        .collect();
    found.sort_by(|a, b| a.first.cmp(&b.first));
    found
}

/// Whether file `path` carries quantization tag `tag` (case aside) as a
/// whole in its name or a folder's: preceded by the start, `-`, `.`, `_`
/// or `/` and followed by the end, `-`, `.` or `/` (a split's
/// `-0000i-of-0000N` and `.gguf` set aside), so that `Q4_K` is not found
/// in `…-Q4_K_M.gguf`, nor `Q4_K_M` in `…-IQ4_K_M.gguf`.
pub fn has_tag(path: &str, tag: &str) -> bool {
    let stem = path.strip_suffix(".gguf").unwrap_or(path);
    let base = stem.rsplit('/').next().unwrap_or(stem);
    let stem = match split_name(&format!("{base}.gguf")) {
        Some((prefix, _, _)) => &stem[..stem.len() - base.len() + prefix.len()],
        None => stem,
    };
    let (hay, tag) = (stem.to_ascii_lowercase(), tag.to_ascii_lowercase());
    if tag.is_empty() {
        return false;
    }
    hay.match_indices(&tag).any(|(i, _)| {
        let before = hay[..i].chars().next_back();
        let after = hay[i + tag.len()..].chars().next();
        before.is_none_or(|c| matches!(c, '-' | '.' | '_' | '/'))
            && after.is_none_or(|c| matches!(c, '-' | '.' | '/'))
    })
}

/// What picks one model: nothing (the only one, else [`DEFAULT_TAG`]'s
/// with `default_tag`), a quantization tag, or a file name.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pick<'a> {
    /// `ORG/NAME:QUANT`'s tag.
    pub tag: Option<&'a str>,
    /// `--gguf-file`: a model's (first) file, or any of its parts, by its
    /// path or, where no other has it, by its name alone.
    pub file: Option<&'a str>,
    /// With neither, several models, and one tagged [`DEFAULT_TAG`]: that
    /// one (a Hub repository, as llama.cpp and Ollama pick), not a refusal.
    pub default_tag: bool,
}

/// The model of `found` that `pick` names, or why none is (one line's
/// text: what was asked, and the models there are).
pub fn choose<'c>(found: &'c [Candidate], pick: Pick<'_>) -> Result<&'c Candidate, String> {
    let list = || {
        let shown: Vec<String> = found.iter().map(Candidate::shown).collect();
        match shown.len() {
            0 => "there is no GGUF model".to_string(),
            _ => format!("the GGUF models here: {}", shown.join(", ")),
        }
    };
    let one = |matched: Vec<&'c Candidate>, what: String| match matched.as_slice() {
        [one] => Ok(*one),
        [] => Err(format!("{what} names no GGUF model; {}", list())),
        many => {
            let shown: Vec<String> = many.iter().map(|c| c.shown()).collect();
            Err(format!(
                "{what} fits {} GGUF models: {}; name one with --gguf-file",
                many.len(),
                shown.join(", ")
            ))
        }
    };
    match (pick.tag, pick.file) {
        (Some(tag), Some(file)) => Err(format!(
            "the tag :{tag} and --gguf-file {file} both pick a model; give one"
        )),
        (Some(tag), None) => {
            let matched = found.iter().filter(|c| has_tag(&c.first, tag)).collect();
            one(matched, format!("the tag :{tag}"))
        }
        (None, Some(file)) => {
            let file = file.trim_start_matches("./");
            let exact: Vec<&Candidate> = found
                .iter()
                .filter(|c| c.parts.iter().any(|p| p == file))
                .collect();
            let matched = match exact.is_empty() {
                true => found
                    .iter()
                    .filter(|c| c.parts.iter().any(|p| p.rsplit('/').next() == Some(file)))
                    .collect(),
                false => exact,
            };
            one(matched, format!("--gguf-file {file}"))
        }
        (None, None) => match found {
            [one] => Ok(one),
            [] => Err(list()),
            _ => {
                let tagged: Vec<&Candidate> = found
                    .iter()
                    .filter(|c| has_tag(&c.first, DEFAULT_TAG))
                    .collect();
                match tagged.as_slice() {
                    [one] if pick.default_tag => Ok(*one),
                    _ => Err(format!(
                        "{} GGUF models here: {}; pick one with :QUANT or --gguf-file FILE",
                        found.len(),
                        found
                            .iter()
                            .map(Candidate::shown)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                }
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_whole_words_of_the_name() {
        for (name, tag, whole_word) in [
            ("Tiny-Q4_K_M.gguf", "q4_k_m", true),
            ("Tiny.Q4_K_M.gguf", "Q4_K_M", true),
            ("tiny_q8_0.gguf", "Q8_0", true),
            ("Tiny-Q4_K_M.gguf", "Q4_K", false),
            ("Tiny-IQ4_K_M.gguf", "Q4_K_M", false),
            ("Tiny-Q4_K_M.gguf", "Q5_K_M", false),
            ("Q6_K/Tiny-Q6_K-00001-of-00002.gguf", "Q6_K", true),
            ("Q6_K/model-00001-of-00002.gguf", "q6_k", true),
            ("Tiny-Q6_K-00001-of-00002.gguf", "00001", false),
            ("Model-UD-Q4_K_XL.gguf", "Q4_K_XL", true),
            ("Tiny-Q4_K_M.gguf", "", false),
        ] {
            assert_eq!(has_tag(name, tag), whole_word, "{name} {tag:?}");
        }
    }

    #[test]
    fn models_are_counted_once_and_picked() {
        let names = [
            "Tiny-Q4_K_M.gguf",
            "Tiny-Q8_0.gguf",
            "Tiny-IQ4_XS.gguf",
            "Q6_K/Tiny-Q6_K-00001-of-00002.gguf",
            "Q6_K/Tiny-Q6_K-00002-of-00002.gguf",
            "mmproj-Tiny-f16.gguf",
            "orphan-00002-of-00002.gguf",
            "README.md",
        ];
        let found = candidates(names);
        let firsts: Vec<&str> = found.iter().map(|c| c.first.as_str()).collect();
        assert_eq!(
            firsts,
            [
                "Q6_K/Tiny-Q6_K-00001-of-00002.gguf",
                "Tiny-IQ4_XS.gguf",
                "Tiny-Q4_K_M.gguf",
                "Tiny-Q8_0.gguf"
            ]
        );
        assert_eq!(found[0].parts.len(), 2);
        let tag = |t| Pick {
            tag: Some(t),
            ..Pick::default()
        };
        assert_eq!(
            choose(&found, tag("q6_k")).map(|c| &c.first),
            Ok(&found[0].first)
        );
        assert!(choose(&found, tag("Q4_K")).is_err_and(|e| e.contains("Tiny-Q8_0.gguf")));
        let file = Pick {
            file: Some("Tiny-Q6_K-00002-of-00002.gguf"),
            ..Pick::default()
        };
        assert_eq!(choose(&found, file).map(|c| &c.first), Ok(&found[0].first));
        assert!(choose(&found, Pick::default()).is_err());
        let default = Pick {
            default_tag: true,
            ..Pick::default()
        };
        assert_eq!(
            choose(&found, default).map(|c| &c.first),
            Ok(&found[2].first)
        );
    }
}

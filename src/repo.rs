//! A model repository on the Hugging Face Hub as every client names and
//! reads it, whatever fetches the bytes (the CLI's HTTP client and cache,
//! a browser's `fetch`): its id (`ORG/NAME`, or `ORG/NAME@REV` for a
//! branch, tag or commit), the revision answer that pins it to a commit and
//! lists its files, and the addresses of those files.

use serde_json::Value;

use crate::error::{Error, Result, Rule};

/// The branch a revision defaults to.
pub(crate) const MAIN: &str = "main";

/// The Hub's own address (`HF_ENDPOINT` names a mirror instead).
pub const ENDPOINT: &str = "https://huggingface.co";

/// A repository and the revision asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoId {
    /// `ORG/NAME`.
    pub repo: String,
    /// A branch, tag or commit (`main` unless named).
    pub revision: String,
}

impl RepoId {
    /// `ORG/NAME[@REV]` in the Hub's spelling; `None` for anything else
    /// (a path, a URL, a name with `..` in it).
    pub fn parse(text: &str) -> Option<RepoId> {
        let (repo, revision) = match text.split_once('@') {
            Some((repo, rev)) => (repo, rev),
            None => (text, MAIN),
        };
        let (org, name) = repo.split_once('/')?;
        let part = |s: &str| {
            (1..=96).contains(&s.len())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                && !s.starts_with(['.', '-'])
                && !s.contains("..")
        };
        let rev_ok = !revision.is_empty()
            && revision.len() <= 256
            && revision.bytes().all(|b| b.is_ascii_graphic())
            && !revision.starts_with('/')
            && revision
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        (part(org) && part(name) && rev_ok).then(|| RepoId {
            repo: repo.to_string(),
            revision: revision.to_string(),
        })
    }

    /// `ORG/NAME[@REV][:QUANT]` (or `ORG/NAME:QUANT@REV`): the id and the
    /// quantization tag of the GGUF file it picks, as `llama-server -hf`
    /// and Ollama's `hf.co/` names read it. A revision cannot hold `:` (git
    /// refuses it in a ref) and a tag holds no `@`, so either order is
    /// one reading. `None` for anything else, an empty or odd tag included.
    pub fn parse_tagged(text: &str) -> Option<(RepoId, Option<String>)> {
        let Some((head, tail)) = text.split_once(':') else {
            return RepoId::parse(text).map(|id| (id, None));
        };
        // `ORG/NAME:TAG@REV` → `ORG/NAME@REV` and `TAG`.
        let (tag, rev) = match tail.split_once('@') {
            Some((tag, rev)) if !head.contains('@') => (tag, Some(rev)),
            _ => (tail, None),
        };
        let tag_ok = (1..=64).contains(&tag.len())
            && tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !tag_ok {
            return None;
        }
        let id = match rev {
            Some(rev) => RepoId::parse(&format!("{head}@{rev}"))?,
            None => RepoId::parse(head)?,
        };
        Some((id, Some(tag.to_string())))
    }

    /// The repository's folder in the cache: `models--ORG--NAME`.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(crate) fn folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }

    /// Whether the revision is a full commit hash.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(crate) fn is_commit(&self) -> bool {
        is_commit(&self.revision)
    }

    /// The same repository at `revision` (an id's `@REV` wins over it).
    pub fn at(self, revision: Option<&str>) -> RepoId {
        match revision {
            Some(rev) if self.revision == MAIN => RepoId {
                revision: rev.to_string(),
                ..self
            },
            _ => self,
        }
    }

    /// The address of its revision answer at `endpoint`: the commit the
    /// revision is now, and its files with their sizes.
    pub fn revision_url(&self, endpoint: &str) -> String {
        let endpoint = endpoint.trim_end_matches('/');
        format!(
            "{endpoint}/api/models/{}/revision/{}?blobs=true",
            self.repo,
            escape(&self.revision)
        )
    }
}

/// A repository pinned to a commit: what its revision answer says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    /// The repository.
    pub id: RepoId,
    /// The commit the revision was when asked: every file comes from it.
    pub commit: String,
    /// Its top-level files and their sizes (where the Hub said).
    pub files: Vec<(String, Option<u64>)>,
    /// Its `.gguf` files in any folder (`Q4_K_M/NAME-00001-of-00002.gguf`),
    /// `/`-separated, and their sizes: GGUF repositories keep a model's
    /// parts in folders, and one model is picked of them.
    pub ggufs: Vec<(String, Option<u64>)>,
}

impl Revision {
    /// The revision answer `json` for `id`. Only top-level files are
    /// listed: a checkpoint is one folder, and a name with a folder in it
    /// could lead out of it.
    pub fn parse(id: RepoId, json: &[u8]) -> Result<Revision> {
        let shown = id.to_string();
        let bad = |what: &str| {
            Error::new(
                Rule::Hub,
                &shown,
                format!("the Hub's revision answer {what}"),
            )
        };
        let info: Value =
            serde_json::from_slice(json).map_err(|e| bad("is not JSON").caused_by(e))?;
        let commit = info
            .get("sha")
            .and_then(Value::as_str)
            .filter(|s| is_commit(s))
            .ok_or_else(|| bad("has no commit (\"sha\")"))?
            .to_string();
        let siblings = info
            .get("siblings")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("lists no files"))?;
        let files = siblings
            .iter()
            .filter_map(|s| {
                let name = s.get("rfilename")?.as_str()?;
                let plain =
                    !name.is_empty() && !name.contains(['/', '\\']) && name != "." && name != "..";
                let size = s.get("size").and_then(Value::as_u64);
                plain.then(|| (name.to_string(), size))
            })
            .collect();
        // Every folder of the path plain too: nothing leads out of the
        // snapshot, nor into a hidden folder.
        let ggufs = siblings
            .iter()
            .filter_map(|s| {
                let name = s.get("rfilename")?.as_str()?;
                let plain = name.len() <= 1024
                    && name.ends_with(".gguf")
                    && !name.contains('\\')
                    && name
                        .split('/')
                        .all(|c| !c.is_empty() && !c.starts_with('.') && !c.contains(':'));
                let size = s.get("size").and_then(Value::as_u64);
                plain.then(|| (name.to_string(), size))
            })
            .collect();
        Ok(Revision {
            id,
            commit,
            files,
            ggufs,
        })
    }

    /// `ORG/NAME@COMMIT`: the id of exactly what is read.
    pub fn pinned(&self) -> String {
        format!("{}@{}", self.id.repo, self.commit)
    }

    /// The address of `file` at the commit, at `endpoint` (the Hub answers
    /// large files with a redirect to where their bytes are).
    pub fn file_url(&self, endpoint: &str, file: &str) -> String {
        let endpoint = endpoint.trim_end_matches('/');
        format!(
            "{endpoint}/{}/resolve/{}/{}",
            self.id.repo,
            self.commit,
            escape_path(file)
        )
    }
}

/// A `/`-separated file path escaped for a URL, segment by segment.
pub(crate) fn escape_path(path: &str) -> String {
    path.split('/').map(escape).collect::<Vec<_>>().join("/")
}

/// `segment` escaped for a URL path.
pub(crate) fn escape(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether `s` is a full (40 hex digit) commit hash.
pub(crate) fn is_commit(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

impl std::fmt::Display for RepoId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.revision.as_str() {
            MAIN => f.write_str(&self.repo),
            rev => write!(f, "{}@{rev}", self.repo),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_escape_what_a_path_segment_cannot_hold() {
        let id = RepoId::parse("org/name@refs/pr/1").expect("an id");
        assert_eq!(
            id.revision_url("http://h/"),
            "http://h/api/models/org/name/revision/refs%2Fpr%2F1?blobs=true"
        );
        let rev = Revision::parse(id, br#"{"sha": "0123456789abcdef0123456789abcdef01234567", "siblings": [
            {"rfilename": "a b.json", "size": 3}, {"rfilename": "sub/x.bin"}, {"rfilename": ".."}]}"#)
        .expect("an answer");
        assert_eq!(rev.files, [("a b.json".to_string(), Some(3))]);
        assert_eq!(
            rev.file_url("http://h", "a b.json"),
            "http://h/org/name/resolve/0123456789abcdef0123456789abcdef01234567/a%20b.json"
        );
        let no_sha = Revision::parse(RepoId::parse("o/n").expect("an id"), br#"{"siblings": []}"#);
        assert!(no_sha.is_err_and(|e| e.rule == Rule::Hub));
    }

    #[test]
    fn ids_and_what_is_not_one() {
        let id = RepoId::parse("nvidia/Llama-3.1-8B-FP4").expect("an id");
        assert_eq!(
            (id.repo.as_str(), id.revision.as_str()),
            ("nvidia/Llama-3.1-8B-FP4", "main")
        );
        assert_eq!(id.folder(), "models--nvidia--Llama-3.1-8B-FP4");
        let id = RepoId::parse("org/name@refs/pr/3").expect("a revision with slashes");
        assert_eq!(id.revision, "refs/pr/3");
        assert_eq!(id.to_string(), "org/name@refs/pr/3");
        for not in [
            "name",
            "a/b/c",
            "/abs/path",
            "./x/y",
            "../x",
            "a/..",
            "a/b@",
            "a/b@x/../y",
            "a b/c",
            "a/.hidden",
            "-a/b",
        ] {
            assert_eq!(RepoId::parse(not), None, "{not}");
        }
        assert!(is_commit(&"a".repeat(40)) && !is_commit(&"A".repeat(40)) && !is_commit("main"));
    }

    #[test]
    fn tags_in_either_order_with_a_revision() {
        let tagged = |t: &str| RepoId::parse_tagged(t).map(|(id, tag)| (id.repo, id.revision, tag));
        let want = |rev: &str, tag: Option<&str>| {
            Some(("o/n".to_string(), rev.to_string(), tag.map(str::to_string)))
        };
        assert_eq!(tagged("o/n:Q4_K_M"), want("main", Some("Q4_K_M")));
        assert_eq!(tagged("o/n@v1:q8_0"), want("v1", Some("q8_0")));
        assert_eq!(
            tagged("o/n:Q8_0@refs/pr/2"),
            want("refs/pr/2", Some("Q8_0"))
        );
        assert_eq!(tagged("o/n"), want("main", None));
        for not in ["o/n:", "o/n:a b", "o/n:x:y", "o/n@a:b@c", "/abs:Q4", "o:Q4"] {
            assert_eq!(tagged(not), None, "{not}");
        }
        let rev = Revision::parse(
            RepoId::parse("o/n").expect("an id"),
            br#"{"sha": "0123456789abcdef0123456789abcdef01234567", "siblings": [
            {"rfilename": "Q6_K/m-00001-of-00002.gguf", "size": 3}, {"rfilename": "../x.gguf"},
            {"rfilename": ".cache/y.gguf"}, {"rfilename": "a.gguf"}]}"#,
        )
        .expect("an answer");
        let ggufs: Vec<&str> = rev.ggufs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(ggufs, ["Q6_K/m-00001-of-00002.gguf", "a.gguf"]);
        assert!(rev
            .file_url("http://h", "Q6_K/m 1.gguf")
            .ends_with("/Q6_K/m%201.gguf"));
    }
}

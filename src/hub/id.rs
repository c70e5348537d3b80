//! A model repository on the Hub, as users name it: `ORG/NAME`, or
//! `ORG/NAME@REV` for a branch, tag or commit.

/// The branch a revision defaults to.
pub(crate) const MAIN: &str = "main";

/// A repository and the revision asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RepoId {
    /// `ORG/NAME`.
    pub(crate) repo: String,
    /// A branch, tag or commit (`main` unless named).
    pub(crate) revision: String,
}

impl RepoId {
    /// `ORG/NAME[@REV]` in the Hub's spelling; `None` for anything else
    /// (a path, a URL, a name with `..` in it).
    pub(crate) fn parse(text: &str) -> Option<RepoId> {
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

    /// The repository's folder in the cache: `models--ORG--NAME`.
    pub(crate) fn folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }

    /// Whether the revision is a full commit hash.
    pub(crate) fn is_commit(&self) -> bool {
        is_commit(&self.revision)
    }
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
}

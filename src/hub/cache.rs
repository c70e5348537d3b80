//! The Hugging Face cache, laid out as `huggingface_hub` lays it out, so
//! that Python and this tool share every download:
//!
//! ```text
//! <cache>/models--ORG--NAME/blobs/<etag>                 the file's bytes
//! <cache>/models--ORG--NAME/blobs/<etag>.incomplete      while downloading
//! <cache>/models--ORG--NAME/snapshots/<commit>/<file>    → ../../blobs/<etag>
//! <cache>/models--ORG--NAME/refs/<revision>              the commit it names
//! <cache>/.locks/models--ORG--NAME/<etag>.lock           held while writing a blob
//! ```

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::repo::RepoId;

/// A cache root (`HF_HUB_CACHE`).
#[derive(Debug, Clone)]
pub(crate) struct Cache {
    pub(crate) root: PathBuf,
}

impl Cache {
    /// `HF_HUB_CACHE`, else `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`,
    /// else `~/.cache/huggingface/hub`, as `huggingface_hub` chooses.
    pub(crate) fn from_env() -> Cache {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let root = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .unwrap_or_else(|| home().join("hub"));
        Cache { root }
    }

    fn repo(&self, id: &RepoId) -> PathBuf {
        self.root.join(id.folder())
    }

    pub(crate) fn blob(&self, id: &RepoId, etag: &str) -> PathBuf {
        self.repo(id).join("blobs").join(etag)
    }

    pub(crate) fn snapshot(&self, id: &RepoId, commit: &str) -> PathBuf {
        self.repo(id).join("snapshots").join(commit)
    }

    /// The commit `revision` named when it was last resolved.
    pub(crate) fn read_ref(&self, id: &RepoId) -> Option<String> {
        let text = fs::read_to_string(self.repo(id).join("refs").join(&id.revision)).ok()?;
        let commit = text.trim();
        crate::repo::is_commit(commit).then(|| commit.to_string())
    }

    /// Records that `id`'s revision names `commit` (nothing for a commit).
    pub(crate) fn write_ref(&self, id: &RepoId, commit: &str) -> Result<()> {
        if id.revision == commit {
            return Ok(());
        }
        let path = self.repo(id).join("refs").join(&id.revision);
        create_parent(&path)?;
        fs::write(&path, commit).map_err(|e| Error::io(&path, "cannot write", e))
    }

    /// Holds the blob's lock (the one `huggingface_hub` takes) until dropped.
    pub(crate) fn lock(&self, id: &RepoId, etag: &str) -> Result<File> {
        let path = self
            .root
            .join(".locks")
            .join(id.folder())
            .join(format!("{etag}.lock"));
        create_parent(&path)?;
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(&path, "cannot create", e))?;
        file.lock()
            .map_err(|e| Error::io(&path, "cannot lock", e))?;
        Ok(file)
    }

    /// Points `snapshots/<commit>/<file>` at blob `etag`: a relative link,
    /// or a copy where the file system has none.
    pub(crate) fn link(
        &self,
        id: &RepoId,
        commit: &str,
        file: &str,
        etag: &str,
    ) -> Result<PathBuf> {
        let at = self.snapshot(id, commit).join(file);
        create_parent(&at)?;
        let _ = fs::remove_file(&at);
        #[cfg(unix)]
        let made = {
            // From a file in a folder of the snapshot, one more level up.
            let up = "../".repeat(file.matches('/').count());
            std::os::unix::fs::symlink(Path::new(&up).join("../../blobs").join(etag), &at)
        };
        #[cfg(not(unix))]
        let made = fs::copy(self.blob(id, etag), &at).map(|_| ());
        made.map_err(|e| Error::io(&at, "cannot link to the cache's blob", e))?;
        Ok(at)
    }
}

/// `HF_HOME`, else `XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
pub(crate) fn home() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HF_HOME").unwrap_or_else(|| {
        var("XDG_CACHE_HOME")
            .or_else(|| {
                var("HOME")
                    .or_else(|| var("USERPROFILE"))
                    .map(|h| h.join(".cache"))
            })
            .unwrap_or_else(|| PathBuf::from(".cache"))
            .join("huggingface")
    })
}

pub(crate) fn create_parent(path: &Path) -> Result<()> {
    match path.parent() {
        Some(dir) => fs::create_dir_all(dir).map_err(|e| Error::io(dir, "cannot create", e)),
        None => Ok(()),
    }
}

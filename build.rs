//! What `wgpu-dequant --version` names beyond the crate's version: the
//! commit it was built from (`unknown` outside a git checkout of this
//! crate, e.g. from the published package) and the wgpu version Cargo.lock
//! resolved (the manifest's requirement where no lock file is found).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=WGPU_DEQUANT_COMMIT={}", commit(&dir));
    println!(
        "cargo:rustc-env=WGPU_DEQUANT_WGPU_VERSION={}",
        wgpu_version(&dir)
    );
}

/// `git` in `dir`, its trimmed output; `None` when git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

/// The checkout's commit, when
/// `dir` is the top of a git work tree: a crate unpacked inside some other
/// repository is not that repository's commit.
fn commit(dir: &Path) -> String {
    let top = git(dir, &["rev-parse", "--show-toplevel"]).map(PathBuf::from);
    let same = match (
        top.and_then(|t| t.canonicalize().ok()),
        dir.canonicalize().ok(),
    ) {
        (Some(top), Some(dir)) => top == dir,
        _ => false,
    };
    if !same {
        return "unknown".to_string();
    }
    // Rebuilt when HEAD moves or its branch gets a new commit.
    if let Some(p) = git(dir, &["rev-parse", "--git-path", "HEAD"]) {
        println!("cargo:rerun-if-changed={}", dir.join(p).display());
    }
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        if let Some(p) = git(dir, &["rev-parse", "--git-path", &branch]) {
            println!("cargo:rerun-if-changed={}", dir.join(p).display());
        }
    }
    git(dir, &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_string())
}

/// wgpu's version in the nearest Cargo.lock above `dir`.
fn wgpu_version(dir: &Path) -> String {
    for lock in dir.ancestors().map(|d| d.join("Cargo.lock")) {
        let Ok(text) = std::fs::read_to_string(&lock) else {
            continue;
        };
        println!("cargo:rerun-if-changed={}", lock.display());
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() == "name = \"wgpu\"" {
                if let Some(v) = lines
                    .next()
                    .and_then(|l| l.trim().strip_prefix("version = "))
                {
                    return v.trim_matches('"').to_string();
                }
            }
        }
        break;
    }
    "30".to_string()
}

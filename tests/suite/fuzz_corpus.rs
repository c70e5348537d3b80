//! The fuzz targets' regression corpus, replayed on a stable toolchain:
//! every file of `fuzz/regressions/<target>/` (the targets' seeds and every
//! input the fuzzer ever found a fault with) goes through that target's
//! body, the same function the fuzz binary runs (`fuzz/src/targets.rs`),
//! and must be read or refused in one line, never panic.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

#[path = "../../fuzz/src/lib.rs"]
mod fuzz;

fn regressions() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions")
}

/// Every input in `fuzz/regressions/<name>/`, sorted.
fn inputs(name: &str) -> Vec<PathBuf> {
    let dir = regressions().join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Each target's inputs, a thread a target: none panics, and no target's
/// folder is empty (each holds its seeds at least).
#[test]
fn every_regression_input_is_read_or_refused() {
    let failures: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = fuzz::targets::ALL
            .iter()
            .map(|&(name, body)| {
                s.spawn(move || {
                    let files = inputs(name);
                    assert!(!files.is_empty(), "fuzz/regressions/{name}/ holds no input");
                    let mut failed = Vec::new();
                    for file in files {
                        let data = std::fs::read(&file).unwrap();
                        if catch_unwind(AssertUnwindSafe(|| body(&data))).is_err() {
                            failed.push(format!("{name}: {}", file.display()));
                        }
                    }
                    // This thread's scratch directory goes too.
                    let _ = std::fs::remove_dir_all(fuzz::scratch());
                    failed
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().unwrap()).collect()
    });
    assert!(
        failures.is_empty(),
        "inputs that panic:\n{}",
        failures.join("\n")
    );
}

/// Every folder under `fuzz/regressions/` is a target's, so no finding is
/// filed where nothing replays it.
#[test]
fn every_regression_folder_is_a_target() {
    for entry in std::fs::read_dir(regressions()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            fuzz::targets::ALL.iter().any(|(target, _)| *target == name),
            "fuzz/regressions/{name}/ is no target's"
        );
    }
}

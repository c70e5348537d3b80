//! Running the `wgpu-dequant` binary and reading what it printed.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use super::bin;

pub fn run(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin().display()))
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        o.status,
        stdout(o),
        stderr(o)
    );
}

pub fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn failed(o: &Output, what: &str) {
    assert!(
        !o.status.success(),
        "{what} succeeded but should not have:\nstdout:\n{}\nstderr:\n{}",
        stdout(o),
        stderr(o)
    );
    assert!(
        o.status.code().is_some(),
        "{what} was killed by a signal (a crash?): {}\nstderr:\n{}",
        o.status,
        stderr(o)
    );
    assert!(
        !stderr(o).contains("panicked"),
        "{what} panicked:\n{}",
        stderr(o)
    );
}

/// Asserts `o` failed cleanly with one `error: …` line carrying `rule` and
/// naming each of `names`; returns the line.
pub fn error_line(o: &Output, what: &str, rule: &str, names: &[&str]) -> String {
    failed(o, what);
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(lines.len(), 1, "{what}: not exactly one error line:\n{err}");
    assert!(!err.contains("panicked"), "{what} panicked:\n{err}");
    let line = lines[0];
    assert!(
        line.contains(&format!("[{rule}]")),
        "{what}: expected {rule}: {line}"
    );
    for n in names {
        assert!(line.contains(n), "{what}: error does not name {n}: {line}");
    }
    line.to_string()
}

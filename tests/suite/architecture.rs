//! The library's top-level modules form a DAG (checkpoint → formats → plan,
//! backends executing it, the writer writing it): a module never reaches
//! back, directly or through others, to one that depends on it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules its code names (`crate::x`).
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, files);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel.iter().next().unwrap().to_string_lossy();
        let top = top.trim_end_matches(".rs").to_string();
        // A module's unit tests in a file of their own (`mod tests;`
        // under `#[cfg(test)]`) may reach anywhere too.
        if top == "lib" || top == "bin" || file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        // Unit tests may reach anywhere; comments are not dependencies.
        let code = without_test_modules(&text);
        let entry = deps.entry(top.clone()).or_default();
        for line in code
            .lines()
            .map(str::trim_start)
            .filter(|l| !l.starts_with("//"))
        {
            for (i, _) in line.match_indices("crate::") {
                let name: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != top {
                    entry.insert(name);
                }
            }
        }
    }
    deps
}

/// `text` less every item under `#[cfg(test)]` (up to its matching brace).
fn without_test_modules(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let Some(open) = item.find('{') else {
            return out;
        };
        let mut depth = 0;
        let mut end = item.len();
        for (i, c) in item[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => continue,
            }
            if depth == 0 {
                end = open + i + 1;
                break;
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

#[test]
fn top_level_modules_form_a_dag() {
    let deps = dependencies();
    assert!(
        ["plan", "backend", "hf", "gguf"]
            .iter()
            .all(|m| deps.contains_key(*m)),
        "{deps:?}"
    );
    // Depth-first search for a path back to where it started.
    fn back_to(
        start: &str,
        at: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in deps.get(at).into_iter().flatten() {
            path.push(next.clone());
            if next == start
                || (seen.insert(next.clone()) && back_to(start, next, deps, path, seen))
            {
                return true;
            }
            path.pop();
        }
        false
    }
    for start in deps.keys() {
        let mut path = vec![start.clone()];
        if back_to(start, start, &deps, &mut path, &mut BTreeSet::new()) {
            panic!(
                "modules depend on each other in a cycle: {}",
                path.join(" -> ")
            );
        }
    }
}

#[test]
fn the_plan_is_data_and_formats_do_not_run_backends() {
    let deps = dependencies();
    for (module, forbidden) in [
        ("plan", "backend"),
        ("output", "backend"),
        ("formats", "backend"),
        ("formats", "plan"),
        ("formats", "writer"),
        ("backend", "writer"),
        ("backend", "plan"),
        // What transformers reads is a matter of names, configs and
        // layouts: it neither decodes nor knows a quantized format.
        ("hf", "formats"),
        ("hf", "backend"),
        ("hf", "plan"),
        // The GGUF container is read as bytes, as checkpoint/ reads
        // safetensors: its blocks are the formats', its model the wing's.
        ("gguf", "formats"),
        ("gguf", "backend"),
        ("gguf", "hf"),
        ("gguf", "plan"),
    ] {
        assert!(
            !deps[module].contains(forbidden),
            "{module} depends on {forbidden}: {:?}",
            deps[module]
        );
    }
}

/// The hosts (the command line, Python, C, the browser) are thin: they
/// name only the library's public surface, never the internals the
/// `testing` feature opens, and none of them chooses a backend, falls
/// back from the GPU or walks open → plan → write itself.
#[test]
fn hosts_call_the_core_and_reimplement_none_of_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The command line lives in the library (the `cli` feature, which the
    // binary and the Python package's console script run) and is held to
    // the same rule: `wgpu_dequant::` paths only, never `crate::`.
    let hosts = [
        "src/bin/wgpu-dequant",
        "src/cli",
        "bindings/python/src",
        "bindings/c/src",
        "web/src",
    ];
    // What the core does that no host may do on its own.
    let forbidden = [
        "Checkpoint::",
        "Plan::",
        "OutputDir",
        "Fallback",
        "find_adapter",
        "is_hardware",
        "select(",
        "select_async",
        "no_adapter_message",
        "Backend>",
        "dyn Backend",
        "Cpu::new",
        "Gpu::open",
        "decode_rows",
    ];
    let internals = [
        "backend",
        "checkpoint",
        "convert",
        "formats",
        "gguf",
        "hf",
        "job",
        "output",
        "plan",
        "report",
        "writer",
        "numerics",
    ];
    let mut files = Vec::new();
    for dir in hosts {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    assert!(files.len() >= 5, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let code: Vec<&str> = text
            .lines()
            .map(str::trim_start)
            .filter(|l| !l.starts_with("//"))
            .collect();
        let in_crate = file.starts_with(root.join("src"));
        for line in &code {
            assert!(
                !(in_crate && line.contains("crate::")),
                "{}: the command line reaches the library by its public paths: {line}",
                file.display()
            );
            for word in forbidden {
                assert!(
                    !line.contains(word),
                    "{}: `{word}` is the core's to do: {line}",
                    file.display()
                );
            }
            for (i, _) in line.match_indices("wgpu_dequant::") {
                let name: String = line[i + 14..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                // `wgpu_dequant::convert(…)` is the function; `::` after
                // the name is a path into the module of that name.
                let into_module = line[i + 14 + name.len()..].starts_with("::");
                assert!(
                    !(into_module && internals.contains(&name.as_str())),
                    "{}: reaches into wgpu_dequant::{name}: {line}",
                    file.display()
                );
            }
        }
    }
    // And none of them builds the library with its internals opened.
    for manifest in [
        "bindings/python/Cargo.toml",
        "bindings/c/Cargo.toml",
        "web/Cargo.toml",
    ] {
        let text = std::fs::read_to_string(root.join(manifest)).unwrap();
        assert!(!text.contains("testing"), "{manifest} turns on `testing`");
    }
}

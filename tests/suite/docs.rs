//! The README and the pages in docs/ stay true: every `wgpu-dequant`
//! command in a code block tagged `sh` runs and exits 0, every relative
//! link leads to a file (and a heading) that exists, and the README keeps
//! its fresh-clone commands and its length. (Their Rust blocks are
//! doctests, through `src/lib.rs`; their Python blocks run in
//! `bindings/python/tests/test_docs.py`.)
//!
//! A block tagged `sh` holds commands meant to be run as written; one
//! tagged `text` holds illustrative ones (placeholders such as `PATH`,
//! `ORG/NAME`, `OUT`). Of a `sh` block, this test runs the `wgpu-dequant`
//! commands, and the README's `cargo run --release -- ARGS` as
//! `wgpu-dequant ARGS` (the binary the suite built: a release build here
//! would take minutes). Commands of other tools (`cargo`, `pip`, `npm`,
//! `cc`, `python`, the repository's scripts) are CI's own steps or need
//! what CI does not have. A `wgpu-dequant` command is not run when one of
//! [`skip`]'s rules says so:
//!
//! - it reads from the Hugging Face Hub (its input is no path in the
//!   working directory: `ORG/NAME`, `ORG/NAME@REV`, `ORG/NAME:QUANT`), and
//!   the test has no network;
//! - it asks for a GPU (`--backend gpu`), which the GPU tests cover;
//! - it is `bench`: minutes of measurement, a GPU for `--gemv`, and a
//!   build with the `bench` feature.
//!
//! The rest run with `sh -c` in a fresh directory per page that holds a
//! copy of `assets/` and the example checkpoints the pages name
//! ([`EXAMPLES`]), with the built binary first on `PATH`, the CPU backend
//! by default (`WGPU_DEQUANT_BACKEND=cpu`: probing adapters would only add
//! time) and the Hub offline (`HF_HUB_OFFLINE=1`: a command the rules
//! missed fails instead of waiting on the network).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{bin, copy_dir};

/// The repository root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The README and every page in docs/, README first.
fn pages() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    let mut pages = vec![root().join("README.md")];
    pages.extend(docs);
    pages
}

/// The example checkpoints the pages name, each a copy of one in the
/// repository: the directory name a page uses → its source.
const EXAMPLES: &[(&str, &str)] = &[
    ("model-bnb-4bit", "tests/fixtures/bnb-nf4-dq-bf16/model"),
    (
        "flux-svdq-int4",
        "tests/fixtures/svdq-int4-g64-logical/model",
    ),
    (
        "llama-nvfp4-modelopt",
        "tests/fixtures/modelopt-nvfp4/model",
    ),
    ("model-w4a16", "assets/sample-w4a16"),
    ("assets/sample-w4a16", "assets/sample-w4a16"),
];

/// A fenced code block: where it starts (1-based line of its fence), the
/// first word of its info string, its lines.
struct Block {
    line: usize,
    lang: String,
    lines: Vec<String>,
}

/// The fenced blocks of `text` (fences of three or more backticks).
fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    // The open block and the backticks of its fence.
    let mut open: Option<(usize, Block)> = None;
    for (i, line) in text.lines().enumerate() {
        let ticks = line.len() - line.trim_start_matches('`').len();
        match &mut open {
            None if ticks >= 3 => {
                let lang = line[ticks..].split_whitespace().next().unwrap_or("");
                let block = Block {
                    line: i + 1,
                    lang: lang.to_string(),
                    lines: Vec::new(),
                };
                open = Some((ticks, block));
            }
            None => {}
            Some((n, _)) if ticks >= *n && line.trim_end() == &line[..ticks] => {
                out.extend(open.take().map(|(_, block)| block));
            }
            Some((_, block)) => block.lines.push(line.to_string()),
        }
    }
    assert!(open.is_none(), "a code block is not closed");
    out
}

/// The lines of `text` outside fenced blocks, with their 1-based numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<usize> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let ticks = line.len() - line.trim_start_matches('`').len();
        match fence {
            None if ticks >= 3 => fence = Some(ticks),
            None => out.push((i + 1, line)),
            Some(n) if ticks >= n && line.trim_end() == &line[..ticks] => fence = None,
            Some(_) => {}
        }
    }
    out
}

/// `line` without a trailing shell comment (a `#` that starts a word,
/// outside quotes).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return line[..i].trim_end(),
            _ => {}
        }
        prev = c;
    }
    line.trim_end()
}

/// The commands of a `sh` block: continuation lines joined, comments and
/// blank lines dropped.
fn commands(block: &Block) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in &block.lines {
        let line = strip_comment(line);
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let command = pending.trim().to_string();
        pending.clear();
        if !command.is_empty() {
            out.push(command);
        }
    }
    out
}

/// The words of a command as `sh` splits them (quotes removed; no
/// expansion).
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in command.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => out.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(word);
    out
}

/// The README's fresh-clone command, run as the suite's binary.
const CARGO_RUN: &str = "cargo run --release -- ";

/// A `sh` block's command as this test runs it: `wgpu-dequant ARGS`, or
/// `None` for another tool's command.
fn ours(command: &str) -> Option<String> {
    if let Some(args) = command.strip_prefix(CARGO_RUN) {
        return Some(format!("wgpu-dequant {args}"));
    }
    (words(command).first().map(String::as_str) == Some("wgpu-dequant"))
        .then(|| command.to_string())
}

/// Why `command` (a `wgpu-dequant` one) is not run in `dir`, or `None`.
fn skip(command: &str, dir: &Path) -> Option<&'static str> {
    let words = words(command);
    let sub = words.get(1).map(String::as_str).unwrap_or("");
    if sub == "bench" {
        return Some("bench: minutes of measurement, a GPU for --gemv, the bench feature");
    }
    if words
        .windows(2)
        .any(|w| w[0] == "--backend" && w[1] == "gpu")
    {
        return Some("--backend gpu: the GPU tests cover the GPU");
    }
    // The input: the first word after the subcommand that is no option.
    let input = words.iter().skip(2).find(|w| !w.starts_with('-'));
    if let Some(input) = input.filter(|_| sub != "merge-index") {
        let local = dir.join(input.trim_end_matches('/'));
        if !local.exists() {
            assert!(
                !["assets/", "tests/", "./", "/"]
                    .iter()
                    .any(|p| input.starts_with(p)),
                "{command}: {input} is a path, and not in the repository"
            );
            assert!(
                input.contains('/'),
                "{command}: {input} is neither a path here nor a Hub id; \
                 a placeholder belongs in a `text` block, an example checkpoint in EXAMPLES"
            );
            return Some("a Hub id: the test has no network");
        }
    }
    None
}

/// A fresh directory for one page's commands: `assets/` and the examples.
fn workdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, source) in EXAMPLES {
        copy_dir(&root().join(source), &dir.path().join(name));
    }
    std::fs::create_dir(dir.path().join("tmp")).unwrap();
    dir
}

/// Runs `command` with `sh -c` in `dir`, the suite's binary first on PATH.
fn run_in(dir: &Path, command: &str) -> std::process::Output {
    let bin_dir = bin().parent().unwrap().to_path_buf();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path =
        std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(&path))).unwrap();
    Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(dir)
        .env("PATH", path)
        .env("TMPDIR", dir.join("tmp"))
        .env("WGPU_DEQUANT_BACKEND", "cpu")
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HOME", dir.join("hf"))
        .env_remove("HF_ENDPOINT")
        .output()
        .unwrap()
}

#[test]
fn every_sh_command_runs() {
    let mut ran = Vec::new();
    let mut skipped = Vec::new();
    for page in pages() {
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        let text = std::fs::read_to_string(&page).unwrap();
        let mut dir = None;
        for block in blocks(&text).iter().filter(|b| b.lang == "sh") {
            for command in commands(block).iter().filter_map(|c| ours(c)) {
                let dir = dir.get_or_insert_with(workdir);
                let at = format!("{name}:{}: {command}", block.line);
                if let Some(why) = skip(&command, dir.path()) {
                    skipped.push(format!("{at}  ({why})"));
                    continue;
                }
                let out = run_in(dir.path(), &command);
                assert!(
                    out.status.success(),
                    "{at}\nexited {}\nstdout:\n{}\nstderr:\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                ran.push(at);
            }
        }
    }
    eprintln!("ran:\n  {}", ran.join("\n  "));
    eprintln!("skipped:\n  {}", skipped.join("\n  "));
    // The README's fresh-clone and everyday commands, a bitsandbytes and
    // an SVDQuant checkpoint, a conversion: a page that loses its blocks'
    // tags would lose them from this test too.
    assert!(
        ran.len() >= 7,
        "only {} commands ran:\n{}",
        ran.len(),
        ran.join("\n")
    );
}

#[test]
fn readme_keeps_the_fresh_clone_commands() {
    // CI runs the README's test command; a newcomer, both.
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let fresh = "```sh\n\
                 cargo run --release -- dequantize assets/sample-w4a16 -o \"$(mktemp -d)/dense\"\n\
                 cargo test\n\
                 ```\n";
    assert!(
        readme.contains(fresh),
        "README.md lost its fresh-clone block:\n{fresh}"
    );
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines; the rest belongs in docs/"
    );
}

/// GitHub's anchor for a heading: lower case, letters, digits, `-` and
/// `_` kept, spaces made `-`, the rest dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of `text`'s headings (a repeated one gets `-1`, `-2`, …).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(&line[hashes..]);
            let mut anchor = base.clone();
            let mut n = 0;
            while !out.insert(anchor.clone()) {
                n += 1;
                anchor = format!("{base}-{n}");
            }
        }
    }
    out
}

/// The targets of the Markdown links and images on `line`.
fn link_targets(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let tail = &rest[i + 2..];
        let end = tail.find(')').unwrap_or(tail.len());
        out.push(&tail[..end]);
        rest = &tail[end..];
    }
    out
}

#[test]
fn every_relative_link_leads_somewhere() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        for (n, line) in prose(&text) {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
                let file = match file {
                    "" => page.clone(),
                    f => page.parent().unwrap().join(f),
                };
                assert!(file.exists(), "{name}:{n}: {target}: no such file");
                if !anchor.is_empty() {
                    let text = std::fs::read_to_string(&file).unwrap();
                    assert!(
                        anchors(&text).contains(anchor),
                        "{name}:{n}: {target}: no such heading in {}",
                        file.display()
                    );
                }
            }
        }
        // Every page is one the README links to.
        if page.parent().unwrap().ends_with("docs") {
            let link = format!("](docs/{}", page.file_name().unwrap().to_str().unwrap());
            assert!(readme.contains(&link), "README.md does not link to {name}");
        }
    }
}

#[test]
fn the_rules_read_commands_as_sh_does() {
    // Comments go, quoted `#` and continuation lines stay.
    let block = Block {
        line: 1,
        lang: "sh".into(),
        lines: vec![
            "wgpu-dequant inspect a   # what it is".into(),
            "# a comment line".into(),
            "wgpu-dequant dequantize a \\".into(),
            "  -o \"b #1\"".into(),
        ],
    };
    assert_eq!(
        commands(&block),
        [
            "wgpu-dequant inspect a",
            "wgpu-dequant dequantize a    -o \"b #1\""
        ]
    );
    assert_eq!(
        words("wgpu-dequant dequantize a -o \"$(mktemp -d)/dense\""),
        [
            "wgpu-dequant",
            "dequantize",
            "a",
            "-o",
            "$(mktemp -d)/dense"
        ]
    );
    assert_eq!(
        ours("cargo run --release -- dequantize x -o y").as_deref(),
        Some("wgpu-dequant dequantize x -o y")
    );
    assert_eq!(ours("cargo test"), None);
    let dir = workdir();
    let why = |c: &str| skip(c, dir.path());
    assert_eq!(why("wgpu-dequant inspect assets/sample-w4a16"), None);
    assert_eq!(why("wgpu-dequant dequantize model-bnb-4bit/ -o out/"), None);
    assert!(why("wgpu-dequant dequantize org/name:Q4_K_M -o out").is_some());
    assert!(why("wgpu-dequant dequantize model-w4a16 -o o --backend gpu").is_some());
    assert!(why("wgpu-dequant bench --gemv").is_some());
    assert_eq!(slug("Where producers disagree"), "where-producers-disagree");
    assert_eq!(slug("The run record's digests"), "the-run-records-digests");
    assert_eq!(slug("`--backend auto`"), "--backend-auto");
}

/// The top-level folders a named repository path starts with.
const TOP: &[&str] = &[
    "src/",
    "shaders/",
    "tests/",
    "docs/",
    "scripts/",
    "web/",
    "bindings/",
    "assets/",
    "fuzz/",
    "benches/",
    "examples/",
];

/// Build outputs that comments name but a fresh clone lacks (the wasm
/// package `web/build.sh` writes).
const GENERATED: &[&str] = &["web/pkg"];

/// The files whose comments (Rust, WGSL, shell, Python) or whole text
/// (Markdown) may name repository paths: none under a build or package
/// folder, a fuzz corpus or a hidden folder.
fn commented_files(dir: &Path, out: &mut Vec<PathBuf>) {
    const SKIP: &[&str] = &[
        "target",
        "node_modules",
        "pkg",
        "corpus",
        "artifacts",
        "__pycache__",
    ];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap_or("");
        if path.is_dir() {
            if !name.starts_with('.') && !SKIP.contains(&name) {
                commented_files(&path, out);
            }
        } else if ["rs", "wgsl", "md", "sh", "py"]
            .iter()
            .any(|e| path.extension().is_some_and(|x| x == *e))
        {
            out.push(path);
        }
    }
}

/// The part of `line` that is comment in a file of extension `ext`: all of
/// a Markdown line, what follows `//` in Rust and WGSL (a `//` that starts
/// the line or follows a space: not a URL's), what follows `#` in shell
/// and Python.
fn comment<'a>(ext: &str, line: &'a str) -> &'a str {
    let marker = match ext {
        "md" => return line,
        "rs" | "wgsl" => "//",
        _ => "#",
    };
    let t = line.trim_start();
    if let Some(rest) = t.strip_prefix(marker) {
        return rest;
    }
    match line.find(&format!(" {marker}")) {
        Some(i) => &line[i + 1 + marker.len()..],
        None => "",
    }
}

/// The repository paths `text` names: each starts with one of [`TOP`] at
/// the start of a word (not after `/`, `.` or a letter), outside a URL, and
/// runs over letters, digits, `_ - . / *` and `{…}`; trailing punctuation
/// is dropped. A Markdown page's keeps its `#anchor`.
fn named_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    for (i, _) in text.char_indices() {
        if !TOP.iter().any(|t| text[i..].starts_with(t)) {
            continue;
        }
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || "_-./\\$".contains(c)) {
            continue;
        }
        // The whitespace-delimited word it is in: a URL's path is not ours.
        let word_start = text[..i].rfind(char::is_whitespace).map_or(0, |w| w + 1);
        if text[word_start..i].contains("://") {
            continue;
        }
        let mut end = i;
        let mut brace = false;
        while end < bytes.len() {
            let c = bytes[end] as char;
            match c {
                '{' => brace = true,
                '}' if brace => brace = false,
                c if brace || c.is_ascii_alphanumeric() || "_-./*".contains(c) => {}
                _ => break,
            }
            end += 1;
        }
        let mut path = text[i..end].trim_end_matches(['.', ',', ':', ';', '-']);
        if path.ends_with(".md") && text[i + path.len()..].starts_with('#') {
            let anchor = text[i + path.len() + 1..]
                .find(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
                .map_or(text.len(), |n| i + path.len() + 1 + n);
            path = text[i..anchor].trim_end_matches('-');
        }
        out.push(path.to_string());
    }
    out
}

/// `path` with each `{a,b}` alternative spelled out.
fn alternatives(path: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (path.find('{'), path.find('}')) else {
        return vec![path.to_string()];
    };
    let (head, tail) = (&path[..open], &path[close + 1..]);
    path[open + 1..close]
        .split(',')
        .flat_map(|alt| alternatives(&format!("{head}{alt}{tail}")))
        .collect()
}

/// Whether `segment` of a named path is a placeholder, not a name: `NAME`,
/// `ORG`, `<case>`, `{name}` (a format argument, one without a comma).
fn placeholder(segment: &str) -> bool {
    segment.contains('<')
        || (segment.contains('{') && !segment.contains(','))
        || (segment.chars().any(|c| c.is_ascii_uppercase())
            && segment
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
}

/// Whether `path` (a file, a folder or a glob; up to its first
/// placeholder) exists under `base`.
fn exists_under(base: &Path, path: &str) -> bool {
    let known: Vec<&str> = path
        .split('/')
        .take_while(|s| !placeholder(s))
        .filter(|s| !s.is_empty())
        .collect();
    alternatives(&known.join("/")).iter().all(|p| {
        if p.contains('*') {
            let pattern = base.join(p).display().to_string();
            glob::glob(&pattern).is_ok_and(|mut m| m.next().is_some())
        } else {
            base.join(p).exists()
        }
    })
}

#[test]
fn every_path_a_comment_names_exists() {
    let mut files = Vec::new();
    commented_files(root(), &mut files);
    let mut missing = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let ext = file.extension().unwrap().to_str().unwrap();
        let name = file.strip_prefix(root()).unwrap().display().to_string();
        for (n, line) in text.lines().enumerate() {
            for named in named_paths(comment(ext, line)) {
                let (path, anchor) = named.split_once('#').unwrap_or((&named, ""));
                if GENERATED.iter().any(|g| path.starts_with(g)) {
                    continue;
                }
                // From the root, or from a folder the file is in (a
                // crate's or a package's own `src/`, `tests/`).
                let base = file
                    .ancestors()
                    .skip(1)
                    .take_while(|a| a.starts_with(root()))
                    .find(|a| exists_under(a, path));
                let found = base.is_some_and(|b| {
                    anchor.is_empty()
                        || anchors(&std::fs::read_to_string(b.join(path)).unwrap()).contains(anchor)
                });
                if !found {
                    missing.push(format!("{name}:{}: {named}", n + 1));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "comments and docs name paths that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn named_paths_are_read_as_meant() {
    let line = "see src/job/mod.rs, shaders/decode/*.wgsl and https://x.org/src/a.rs; \
                tests/fixtures/NAME/ or crate/src/x, fuzz/regressions/{name}/, \
                docs/performance.md#gpu-products.";
    assert_eq!(
        named_paths(line),
        [
            "src/job/mod.rs",
            "shaders/decode/*.wgsl",
            "tests/fixtures/NAME/",
            "fuzz/regressions/{name}/",
            "docs/performance.md#gpu-products"
        ]
    );
    assert!(exists_under(root(), "shaders/decode/*.wgsl"));
    assert!(exists_under(root(), "tests/fixtures/NAME/"));
    assert!(exists_under(root(), "src/{job,hub}/mod.rs"));
    assert!(!exists_under(root(), "src/job.rs"));
    assert!(!exists_under(root(), "shaders/decode/*.nothing"));
    assert_eq!(comment("rs", "let x = 1; // a note"), " a note");
    assert_eq!(comment("rs", r#"let u = "https://h/src/a.rs";"#), "");
}

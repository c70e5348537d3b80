//! GGUF models on the Hub (`ORG/NAME:QUANT`, `ORG/NAME --gguf-file FILE`),
//! against the mock Hub: a repository of several quantizations, a split
//! one in a folder and a vision projector; only the picked model's files
//! are downloaded, its dense checkpoint is the local file's, `inspect`
//! reads headers by range requests alone, and every refusal is one line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::bin;
use crate::common::cli::{error_line, failed, ok, stdout};
use crate::common::hub::{Faults, MockHub};
use crate::hub::cli;

const REPO: &str = "org/Tiny-GGUF";
const SPLIT: usize = 2;

fn gguf_case(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/gguf")
        .join(name)
        .join("model")
}

/// The Q4_K fixture.
fn q4k() -> PathBuf {
    gguf_case("gguf-q4_k-llama").join("model.gguf")
}

/// The first part of the split fixture (hf-qwen3 in two parts).
fn split_first() -> PathBuf {
    gguf_case("hf-qwen3-split").join(format!("model-00001-of-{SPLIT:05}.gguf"))
}

/// A GGUF repository in `tmp/repo`: the Q4_K fixture under several
/// quantizations' names (each with its own trailing bytes, so that each
/// is its own blob), the split fixture in `Q6_K/`, a projector, a README.
fn repository(tmp: &Path) -> PathBuf {
    let dir = tmp.join("repo");
    std::fs::create_dir_all(dir.join("Q6_K")).unwrap();
    let bytes = std::fs::read(q4k()).unwrap();
    for (i, name) in [
        "Tiny-Q4_K_M.gguf",
        "Tiny-Q8_0.gguf",
        "Tiny-IQ4_XS.gguf",
        "mmproj-Tiny-f16.gguf",
    ]
    .iter()
    .enumerate()
    {
        let mut b = bytes.clone();
        b.extend(std::iter::repeat_n(0u8, 32 * i));
        std::fs::write(dir.join(name), b).unwrap();
    }
    for no in 1..=SPLIT {
        let from = gguf_case("hf-qwen3-split").join(format!("model-{no:05}-of-{SPLIT:05}.gguf"));
        let to = dir.join(format!("Q6_K/Tiny-Q6_K-{no:05}-of-{SPLIT:05}.gguf"));
        std::fs::copy(from, to).unwrap();
    }
    std::fs::write(dir.join("README.md"), "# Tiny GGUF\n").unwrap();
    dir
}

/// Every file of a folder and its bytes (a finished run's record aside,
/// and the model card, which names the source: a Hub run's and a local
/// run's differ there alone).
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !crate::common::is_record(&p.file_name().unwrap().to_string_lossy()))
        .filter(|p| p.file_name().is_some_and(|n| n != "README.md"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect()
}

/// The dense files of a local run of `input`.
fn local_run(input: &Path, out: &Path) -> BTreeMap<String, Vec<u8>> {
    let o = Command::new(bin())
        .args([
            "dequantize",
            input.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .args(["--backend", "cpu", "--quiet"])
        .output()
        .unwrap();
    ok(&o, "local dequantize");
    files(out)
}

/// `dequantize ID -o out --backend cpu --quiet` (and `extra`) from the mock.
fn dequantize(hub: &MockHub, cache: &Path, id: &str, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["dequantize", id, "-o", out.to_str().unwrap()];
    args.extend(["--backend", "cpu", "--quiet"]);
    args.extend(extra);
    cli(hub, cache, &args, &[])
}

/// The files the log shows were asked for by their resolve route, and the
/// blobs (SHA-256s) the CDN sent whole, not by range.
fn asked(hub: &MockHub, from: usize) -> (Vec<String>, Vec<String>) {
    let log = hub.log();
    let resolve = format!("/{REPO}/resolve/{}/", hub.commit);
    let files = log[from..]
        .iter()
        .filter_map(|h| h.path.strip_prefix(&resolve).map(str::to_string))
        .collect();
    let whole = log[from..]
        .iter()
        .filter(|h| h.method == "GET" && h.range.is_none())
        .filter_map(|h| h.path.strip_prefix("/cdn/").map(str::to_string))
        .collect();
    (files, whole)
}

fn snapshot(cache: &Path, hub: &MockHub) -> PathBuf {
    cache
        .join("models--org--Tiny-GGUF/snapshots")
        .join(&hub.commit)
}

#[test]
fn a_tag_downloads_its_file_alone_and_writes_the_local_files_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = MockHub::serve_tree(REPO, &repository(tmp.path()), Faults::default());
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("hub");
    let o = dequantize(&hub, &cache, &format!("{REPO}:Q4_K_M"), &out, &["--json"]);
    ok(&o, "dequantize ORG/NAME:Q4_K_M");
    let want = local_run(&q4k(), &tmp.path().join("local"));
    assert_eq!(files(&out), want, "the Hub run's files are the local run's");

    // Only that file was asked for and downloaded (once); nothing else.
    let (asked_files, whole) = asked(&hub, 0);
    assert!(
        asked_files.iter().all(|f| f == "Tiny-Q4_K_M.gguf"),
        "{asked_files:?}"
    );
    assert_eq!(whole, [hub.sha("Tiny-Q4_K_M.gguf")]);
    let summary: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(
        summary["fetched"]["downloaded"],
        serde_json::json!(["Tiny-Q4_K_M.gguf"]),
        "{summary}"
    );
    let cached = snapshot(&cache, &hub);
    assert_eq!(
        std::fs::read(cached.join("Tiny-Q4_K_M.gguf")).unwrap(),
        std::fs::read(q4k()).unwrap()
    );
    assert!(!cached.join("Tiny-Q8_0.gguf").exists());

    // The tag in any case, from the cache: nothing downloaded again.
    let before = hub.log().len();
    let lower = tmp.path().join("lower");
    let o = dequantize(&hub, &cache, &format!("{REPO}:q4_k_m"), &lower, &[]);
    ok(&o, "dequantize ORG/NAME:q4_k_m");
    assert_eq!(files(&lower), want);
    assert_eq!(asked(&hub, before).1, Vec::<String>::new());

    // --resume of the finished run: no file asked for at all.
    let before = hub.log().len();
    let o = dequantize(&hub, &cache, &format!("{REPO}:Q4_K_M"), &out, &["--resume"]);
    ok(&o, "--resume of a finished run");
    let (asked_files, whole) = asked(&hub, before);
    assert!(
        asked_files.is_empty() && whole.is_empty(),
        "{asked_files:?}"
    );
    assert!(hub.log()[before..]
        .iter()
        .all(|h| !h.path.starts_with("/cdn/")));

    // Offline, the tag picks among the snapshot's files: no request.
    let before = hub.log().len();
    let offline = [("HF_HUB_OFFLINE", "1")];
    let o = cli(
        &hub,
        &cache,
        &["inspect", &format!("{REPO}:Q4_K_M")],
        &offline,
    );
    ok(&o, "inspect offline");
    assert_eq!(hub.log().len(), before);
    let o = cli(
        &hub,
        &cache,
        &["inspect", &format!("{REPO}:Q8_0")],
        &offline,
    );
    let what = "offline, a model not in the cache";
    error_line(&o, what, "HUB-001", &["Q8_0", "Tiny-Q4_K_M.gguf"]);
}

#[test]
fn delete_downloaded_empties_the_cache_and_resume_still_downloads_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = MockHub::serve_tree(REPO, &repository(tmp.path()), Faults::default());
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("out");
    let id = format!("{REPO}@{}:Q8_0", hub.commit);
    let o = dequantize(&hub, &cache, &id, &out, &["--delete-downloaded", "--json"]);
    ok(&o, "dequantize --delete-downloaded");
    let summary: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(
        summary["fetched"]["deleted"],
        serde_json::json!(["Tiny-Q8_0.gguf"])
    );
    assert!(!snapshot(&cache, &hub).join("Tiny-Q8_0.gguf").exists());
    let blob = cache
        .join("models--org--Tiny-GGUF/blobs")
        .join(hub.sha("Tiny-Q8_0.gguf"));
    assert!(!blob.exists(), "the blob is removed too");
    assert!(out.join("model.safetensors").is_file());

    // The tag before the revision names the same job: nothing to do.
    let before = hub.log().len();
    let id = format!("{REPO}:Q8_0@{}", hub.commit);
    let o = dequantize(&hub, &cache, &id, &out, &["--resume"]);
    ok(&o, "--resume after --delete-downloaded");
    assert!(hub.log()[before..]
        .iter()
        .all(|h| !h.path.starts_with("/cdn/")));
}

#[test]
fn gguf_file_and_a_split_model_in_a_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = MockHub::serve_tree(REPO, &repository(tmp.path()), Faults::default());
    let cache = tmp.path().join("cache");

    let out = tmp.path().join("iq4");
    let o = dequantize(
        &hub,
        &cache,
        REPO,
        &out,
        &["--gguf-file", "Tiny-IQ4_XS.gguf"],
    );
    ok(&o, "dequantize --gguf-file");
    let (_, whole) = asked(&hub, 0);
    assert_eq!(whole, [hub.sha("Tiny-IQ4_XS.gguf")]);
    assert!(out.join("model.safetensors").is_file());

    // `:Q6_K` is the split model in `Q6_K/`: every part, nothing else.
    let before = hub.log().len();
    let out = tmp.path().join("q6k");
    let o = dequantize(&hub, &cache, &format!("{REPO}:Q6_K"), &out, &[]);
    ok(&o, "dequantize a split model in a folder");
    let mut whole = asked(&hub, before).1;
    whole.sort();
    let mut parts: Vec<String> = (1..=SPLIT)
        .map(|no| hub.sha(&format!("Q6_K/Tiny-Q6_K-{no:05}-of-{SPLIT:05}.gguf")))
        .collect();
    parts.sort();
    assert_eq!(whole, parts);
    assert_eq!(
        files(&out),
        local_run(&split_first(), &tmp.path().join("local-split"))
    );
    // In the cache as huggingface_hub lays out a folder: links one level up.
    let link = snapshot(&cache, &hub).join(format!("Q6_K/Tiny-Q6_K-00002-of-{SPLIT:05}.gguf"));
    let target = std::fs::read_link(&link).unwrap();
    assert!(target.starts_with("../../../blobs"), "{}", target.display());
    // Any part names it for --gguf-file.
    let o = cli(
        &hub,
        &cache,
        &[
            "inspect",
            REPO,
            "--gguf-file",
            "Tiny-Q6_K-00002-of-00002.gguf",
            "--json",
        ],
        &[],
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let path = report["path"].as_str().unwrap();
    assert!(
        path.ends_with("Q6_K/Tiny-Q6_K-00001-of-00002.gguf"),
        "{path}"
    );
}

#[test]
fn tags_that_fit_none_or_several_are_refused_naming_the_models() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = MockHub::serve_tree(REPO, &repository(tmp.path()), Faults::default());
    let cache = tmp.path().join("cache");
    for tag in ["Q4_K", "Q5_K_M"] {
        let out = tmp.path().join(tag);
        let o = dequantize(&hub, &cache, &format!("{REPO}:{tag}"), &out, &[]);
        let line = error_line(
            &o,
            tag,
            "HUB-001",
            &[
                tag,
                "Tiny-Q4_K_M.gguf",
                "Tiny-Q8_0.gguf",
                "Tiny-IQ4_XS.gguf",
                "Q6_K/",
            ],
        );
        assert!(!line.contains("mmproj"), "{line}");
        assert!(!out.exists(), "{tag}: nothing written");
    }
    let o = cli(
        &hub,
        &cache,
        &["inspect", REPO, "--gguf-file", "nope.gguf"],
        &[],
    );
    error_line(
        &o,
        "--gguf-file nope.gguf",
        "HUB-001",
        &["nope.gguf", "Tiny-Q8_0.gguf"],
    );
    let o = cli(
        &hub,
        &cache,
        &[
            "inspect",
            &format!("{REPO}:Q8_0"),
            "--gguf-file",
            "Tiny-Q8_0.gguf",
        ],
        &[],
    );
    error_line(&o, "a tag and --gguf-file", "HUB-001", &["--gguf-file"]);
    assert!(hub.log().iter().all(|h| !h.path.starts_with("/cdn/")));

    // No tag: the repository's Q4_K_M model, as llama.cpp and Ollama pick.
    let o = cli(&hub, &cache, &["inspect", REPO, "--json"], &[]);
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let path = report["path"].as_str().unwrap();
    assert!(path.ends_with("/Tiny-Q4_K_M.gguf"), "{path}");
}

#[test]
fn no_tag_without_a_q4_k_m_model_lists_them_and_one_model_is_taken() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = repository(tmp.path());
    std::fs::remove_file(dir.join("Tiny-Q4_K_M.gguf")).unwrap();
    let hub = MockHub::serve_tree(REPO, &dir, Faults::default());
    let cache = tmp.path().join("cache");
    let o = cli(&hub, &cache, &["inspect", REPO], &[]);
    error_line(
        &o,
        "several models",
        "HUB-001",
        &["Tiny-Q8_0.gguf", "--gguf-file"],
    );

    let one = tmp.path().join("one");
    std::fs::create_dir_all(&one).unwrap();
    std::fs::copy(q4k(), one.join("Tiny-Q8_0.gguf")).unwrap();
    std::fs::copy(q4k(), one.join("mmproj-Tiny-f16.gguf")).unwrap();
    let hub = MockHub::serve_tree(REPO, &one, Faults::default());
    let o = cli(&hub, &cache, &["inspect", REPO, "--json"], &[]);
    ok(&o, "inspect a repository of one model");
}

#[test]
fn inspect_reads_headers_by_range_requests_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = MockHub::serve_tree(REPO, &repository(tmp.path()), Faults::default());
    let cache = tmp.path().join("cache");
    let o = cli(
        &hub,
        &cache,
        &["inspect", &format!("{REPO}:Q4_K_M"), "--json"],
        &[],
    );
    ok(&o, "inspect ORG/NAME:Q4_K_M");
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let local = Command::new(bin())
        .args(["inspect", q4k().to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let mut local: serde_json::Value = serde_json::from_slice(&local.stdout).unwrap();
    local["path"] = report["path"].clone();
    // The disk's free space moves between two runs.
    local["free_bytes"] = report["free_bytes"].clone();
    assert_eq!(report, local, "the Hub header's report is the local file's");
    let cdn: Vec<_> = hub
        .log()
        .into_iter()
        .filter(|h| h.path.starts_with("/cdn/"))
        .collect();
    assert!(
        !cdn.is_empty() && cdn.iter().all(|h| h.range.is_some()),
        "{cdn:?}"
    );
    let read: usize = cdn.iter().map(|h| h.sent).sum();
    let size = std::fs::metadata(q4k()).unwrap().len() as usize;
    assert!(read * 8 < size, "{read} bytes read of {size}");
    assert!(!snapshot(&cache, &hub).join("Tiny-Q4_K_M.gguf").exists());

    // validate too, and the split model's two headers.
    let o = cli(&hub, &cache, &["validate", &format!("{REPO}:Q6_K")], &[]);
    ok(&o, "validate ORG/NAME:Q6_K");
    assert!(hub
        .log()
        .iter()
        .all(|h| !h.path.starts_with("/cdn/") || h.range.is_some()));
}

#[test]
fn bad_files_and_answers_are_one_line_never_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bad");
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = std::fs::read(q4k()).unwrap();
    std::fs::write(dir.join("Bad-Q2_K.gguf"), b"not a gguf file at all").unwrap();
    std::fs::write(dir.join("Cut-Q3_K_S.gguf"), &bytes[..bytes.len() / 2]).unwrap();
    let mut huge = bytes[..24].to_vec();
    huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // metadata count
    std::fs::write(dir.join("Huge-Q5_0.gguf"), huge).unwrap();
    std::fs::write(dir.join("Tiny-Q8_0.gguf"), &bytes).unwrap();
    let hub = MockHub::serve_tree(REPO, &dir, Faults::default());
    let cache = tmp.path().join("cache");
    for (tag, rule) in [
        ("Q2_K", "GGUF-001"),
        ("Q3_K_S", "GGUF-002"),
        ("Q5_0", "GGUF-001"),
    ] {
        let o = cli(&hub, &cache, &["inspect", &format!("{REPO}:{tag}")], &[]);
        error_line(&o, tag, rule, &[tag]);
        let out = tmp.path().join(tag);
        let o = dequantize(&hub, &cache, &format!("{REPO}:{tag}"), &out, &[]);
        failed(&o, tag);
    }
    // A download whose bytes are not the SHA-256 the Hub states.
    hub.set_faults(Faults {
        wrong_sha: Some("Tiny-Q8_0.gguf".into()),
        ..Faults::default()
    });
    let out = tmp.path().join("sha");
    let o = dequantize(&hub, &cache, &format!("{REPO}:Q8_0"), &out, &[]);
    error_line(&o, "a wrong SHA-256", "HUB-002", &["Tiny-Q8_0.gguf"]);
    // A Content-Length that is not what is left of the file.
    hub.set_faults(Faults {
        long_length: Some("Tiny-Q8_0.gguf".into()),
        ..Faults::default()
    });
    let o = dequantize(&hub, &cache, &format!("{REPO}:Q8_0"), &out, &[]);
    failed(&o, "a long Content-Length");
    // Odd tags are no Hub id: nothing is asked of the Hub for them.
    let before = hub.log().len();
    let o = cli(&hub, &cache, &["inspect", &format!("{REPO}:Q4 K")], &[]);
    failed(&o, "a tag with a space");
    assert_eq!(hub.log().len(), before);
}

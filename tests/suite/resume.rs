//! `dequantize --resume`: a run interrupted at any point (cancelled, or
//! killed with SIGKILL) and then resumed writes what one uninterrupted run
//! writes, byte for byte; the output files the first run finished are kept
//! (the same files, not rewritten), a finished file whose bytes changed is
//! written again, and a journal of another job keeps nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::common::cli::ok;
use crate::common::{bin, ct_config, write_json, write_safetensors, Rng, Tensor};
use wgpu_dequant::{BackendChoice, Dequantize, DtypeChoice, OutDtype, Rule};

const STAGING: &str = ".wgpu-dequant-partial";

/// A W4A16 group-128 checkpoint of `n` shards, each one Linear of
/// `rows × cols` (random codes, moderate scales), with its index.
pub(crate) fn checkpoint(dir: &Path, n: usize, (rows, cols): (usize, usize)) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = Rng::new(0x5EED_0A11_2E50_0001);
    let mut map = serde_json::Map::new();
    let mut shards = Vec::new();
    for i in 0..n {
        let m = format!("model.layers.{i}.mlp.down_proj");
        let packed: Vec<u8> = (0..rows * cols / 2).map(|_| rng.next() as u8).collect();
        let scale: Vec<u8> = (0..rows * cols / 128)
            .flat_map(|_| (0x3C00u16 + rng.below(0x200) as u16).to_le_bytes())
            .collect();
        let shape: Vec<u8> = [rows as i64, cols as i64]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let tensors = [
            Tensor::new(
                format!("{m}.weight_packed"),
                "I32",
                &[rows, cols / 8],
                packed,
            ),
            Tensor::new(
                format!("{m}.weight_scale"),
                "BF16",
                &[rows, cols / 128],
                scale,
            ),
            Tensor::new(format!("{m}.weight_shape"), "I64", &[2], shape),
        ];
        let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        write_safetensors(&dir.join(&file), &tensors);
        for t in &tensors {
            map.insert(t.name.clone(), json!(file));
        }
        shards.push(file);
    }
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"metadata": {}, "weight_map": map}),
    );
    let qc = ct_config(
        "pack-quantized",
        json!({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 128}),
        "0.19.0",
    );
    write_json(
        &dir.join("config.json"),
        &json!({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16", "quantization_config": qc}),
    );
    shards
}

/// Every file of a folder (not its subfolders, nor a finished run's
/// record) and its bytes.
pub(crate) fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

/// [`files`] but the model card, which names the source: a Hub run's and
/// a local run's differ there alone (`upload::` checks it).
pub(crate) fn but_card(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = files(dir);
    files.remove("README.md");
    files
}

/// Asserts that `got` holds `want`'s files and bytes, naming the ones that
/// differ.
pub(crate) fn assert_files(
    got: &BTreeMap<String, Vec<u8>>,
    want: &BTreeMap<String, Vec<u8>>,
    what: &str,
) {
    let names: std::collections::BTreeSet<&String> = got.keys().chain(want.keys()).collect();
    let differ: Vec<&&String> = names
        .iter()
        .filter(|n| got.get(**n) != want.get(**n))
        .collect();
    assert!(
        differ.is_empty(),
        "{what}: these files differ from one plain run's: {differ:?}"
    );
}

/// `wgpu-dequant dequantize INPUT -o OUT --backend cpu`, to add to.
fn dequantize(input: &Path, out: &Path) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("dequantize")
        .arg(input)
        .arg("-o")
        .arg(out)
        .args(["--backend", "cpu"]);
    cmd
}

/// The files a staging folder's journal lists as finished, sorted (its
/// lines after the first, each `{"name", "size", "blake3"}`).
pub(crate) fn journaled(staging: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(staging.join(".journal.json")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = text
        .lines()
        .skip(1)
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["name"].as_str().unwrap().to_string()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// When `p` was last written (a rename keeps it; writing again does not).
fn written(p: &Path) -> std::time::SystemTime {
    std::fs::metadata(p).unwrap().modified().unwrap()
}

/// The library run of `input` into `out` with `resume`, cancelled after
/// `cancel_after` output tensors (never with `None`).
fn run(
    input: &Path,
    out: &Path,
    resume: bool,
    max: Option<u64>,
    cancel_after: Option<usize>,
) -> wgpu_dequant::Result<()> {
    let canceller = wgpu_dequant::Canceller::default();
    let c = canceller.clone();
    let mut done = 0;
    let mut run = Dequantize::new()
        .backend(BackendChoice::Cpu)
        .resume(resume)
        .canceller(canceller)
        .on_progress(move |p| {
            done += usize::from(p.done);
            if Some(done) == cancel_after {
                c.cancel();
            }
        });
    if let Some(max) = max {
        run = run.max_shard_size(max);
    }
    run.run(input, out).map(|_| ())
}

/// Cancelled after every number of tensors in turn, with the input's
/// sharding and re-sharded, then resumed: the bytes of one plain run, the
/// files the interrupted run finished kept as they were.
#[test]
fn resumed_runs_equal_one_run_and_keep_what_was_finished() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    checkpoint(&input, 4, (64, 256));
    for max in [None, Some(20_000)] {
        let reference = tmp.path().join(format!("reference-{max:?}"));
        run(&input, &reference, false, max, None).unwrap();
        let want = files(&reference);
        for cancel_after in 1..=4 {
            let what = format!("max {max:?}, cancelled after {cancel_after}");
            let out = tmp.path().join(format!("out-{max:?}-{cancel_after}"));
            let e = run(&input, &out, true, max, Some(cancel_after)).unwrap_err();
            assert_eq!(e.rule, Rule::Cancelled, "{what}: {e}");
            // Nothing in the output but the staging folder, which keeps
            // what was finished.
            let staging = out.join(STAGING);
            assert_eq!(files(&out).len(), 0, "{what}");
            let kept = journaled(&staging);
            assert!(
                !kept.is_empty() || cancel_after == 1,
                "{what}: nothing journaled"
            );
            let stamps: Vec<_> = kept.iter().map(|f| written(&staging.join(f))).collect();
            run(&input, &out, true, max, None).unwrap();
            assert_files(&files(&out), &want, &what);
            assert!(!staging.exists(), "{what}: staging folder left");
            for (f, stamp) in kept.iter().zip(stamps) {
                assert_eq!(
                    written(&out.join(f)),
                    stamp,
                    "{what}: {f} was written again"
                );
            }
        }
    }
}

/// A finished file whose bytes changed since is written again; a journal
/// of another job (another dtype) keeps nothing; a staged file the journal
/// does not list never reaches the output; without `--resume` an earlier
/// run's staging folder is removed and everything written anew.
#[test]
fn resume_keeps_only_files_of_the_same_job_with_their_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let shards = checkpoint(&input, 3, (64, 256));
    let reference = tmp.path().join("reference");
    run(&input, &reference, false, None, None).unwrap();
    let want = files(&reference);
    let interrupted = |out: &Path| {
        run(&input, out, true, None, Some(2)).unwrap_err();
        let staging = out.join(STAGING);
        assert!(
            journaled(&staging).contains(&shards[0]),
            "{:?}",
            journaled(&staging)
        );
        staging
    };

    // A byte of a finished file flipped: written again.
    let out = tmp.path().join("flipped");
    let staging = interrupted(&out);
    let f = staging.join(&shards[0]);
    let mut bytes = std::fs::read(&f).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&f, bytes).unwrap();
    run(&input, &out, true, None, None).unwrap();
    assert_files(&files(&out), &want, "flipped byte");

    // Another dtype: the journal's key differs, nothing is kept.
    let out = tmp.path().join("f32");
    let staging = interrupted(&out);
    let f = staging.join(&shards[0]);
    let before = written(&f);
    let want_f32 = tmp.path().join("reference-f32");
    Dequantize::new()
        .backend(BackendChoice::Cpu)
        .dtype(DtypeChoice::Fixed(OutDtype::F32))
        .run(&input, &want_f32)
        .unwrap();
    Dequantize::new()
        .backend(BackendChoice::Cpu)
        .dtype(DtypeChoice::Fixed(OutDtype::F32))
        .resume(true)
        .run(&input, &out)
        .unwrap();
    assert_files(&files(&out), &files(&want_f32), "another dtype");
    assert_ne!(
        written(&out.join(&shards[0])),
        before,
        "another job's file was kept"
    );

    // A file the journal does not list (cut off while written, or another
    // job's) never reaches the output.
    let out = tmp.path().join("stray");
    let staging = interrupted(&out);
    std::fs::write(
        staging.join("model-00009-of-00009.safetensors"),
        b"half a file",
    )
    .unwrap();
    run(&input, &out, true, None, None).unwrap();
    assert_files(&files(&out), &want, "a stray file in the staging folder");

    // Without --resume: the staging folder goes, all is written.
    let out = tmp.path().join("plain");
    interrupted(&out);
    run(&input, &out, false, None, None).unwrap();
    assert_files(&files(&out), &want, "plain run after an interrupted one");
}

/// Runs `cmd` and kills it with SIGKILL the moment the journal in
/// `staging` lists `after` of its `total` files (stopped first, so that it
/// writes nothing more).
#[cfg(unix)]
fn kill_after(mut cmd: Command, staging: &Path, after: usize, total: usize, what: &str) {
    let mut child = cmd.spawn().unwrap();
    loop {
        if journaled(staging).len() >= after {
            let pid = child.id().to_string();
            Command::new("kill").args(["-STOP", &pid]).status().unwrap();
            Command::new("kill").args(["-KILL", &pid]).status().unwrap();
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{what}: the run ended ({status}) before {after} files were journaled");
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let _ = child.wait();
    assert!(journaled(staging).len() < total, "{what}: killed too late");
}

/// The command line killed with SIGKILL after one and after three of five
/// output files, then run again with `--resume`: the bytes of one plain run;
/// `--shards` jobs resume the same way.
#[cfg(unix)]
#[test]
fn resume_after_sigkill_equals_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let shards = checkpoint(&input, 5, (1024, 2048));
    let cli = |out: &Path, extra: &[&str]| {
        let mut cmd = dequantize(&input, out);
        cmd.args(["--quiet", "--resume"]).args(extra);
        cmd
    };
    let reference = tmp.path().join("reference");
    ok(&cli(&reference, &[]).output().unwrap(), "plain run");
    let want = files(&reference);
    let cases: [(&str, usize, Vec<String>); 3] = [
        ("after one file", 1, vec![]),
        ("after three files", 3, vec![]),
        (
            "a --shards job after one file",
            1,
            vec!["--shards".into(), shards[..3].join(",")],
        ),
    ];
    for (what, after, extra) in cases {
        let out = tmp.path().join(what.replace(' ', "-"));
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let staging: PathBuf = match extra.is_empty() {
            true => out.join(STAGING),
            false => out.join(format!(
                "{STAGING}-{}",
                shards[0].trim_end_matches(".safetensors")
            )),
        };
        kill_after(cli(&out, &extra), &staging, after, shards.len(), what);
        ok(&cli(&out, &extra).output().unwrap(), what);
        let got = files(&out);
        if extra.is_empty() {
            assert_files(&got, &want, what);
        } else {
            for f in &shards[..3] {
                assert_eq!(got.get(f), want.get(f), "{what}: {f}");
            }
        }
        assert!(!staging.exists(), "{what}: staging folder left");
    }
}

/// A Hub run with `--resume --delete-downloaded` that fails on its third
/// shard (a wrong checksum) keeps the two files it finished; resumed, it
/// writes what a local run writes, without downloading the shards those
/// two files were made from again.
#[test]
fn hub_runs_resume_without_downloading_what_was_finished() {
    use crate::common::hub::{Faults, MockHub};
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let shards = checkpoint(&input, 4, (64, 256));
    let reference = tmp.path().join("reference");
    run(&input, &reference, false, None, None).unwrap();
    let (repo, cache, out) = (
        "org/resume",
        tmp.path().join("cache"),
        tmp.path().join("out"),
    );
    let hub = MockHub::serve(
        repo,
        &input,
        Faults {
            wrong_sha: Some(shards[2].clone()),
            ..Faults::default()
        },
    );
    let args = [
        "dequantize",
        repo,
        "-o",
        out.to_str().unwrap(),
        "--backend",
        "cpu",
    ];
    let args = [&args[..], &["--quiet", "--resume", "--delete-downloaded"]].concat();
    let o = crate::hub::cli(&hub, &cache, &args, &[]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(journaled(&out.join(STAGING)), shards[..2].to_vec());
    hub.set_faults(Faults::default());
    let before = hub.log().len();
    ok(
        &crate::hub::cli(&hub, &cache, &args, &[]),
        "resumed from the Hub",
    );
    assert_files(&but_card(&out), &but_card(&reference), "from the Hub");
    let fetched: Vec<String> = hub.log()[before..]
        .iter()
        .filter(|h| h.method == "GET" && h.range.is_none() && h.sent > 0)
        .map(|h| h.path.clone())
        .collect();
    // The CDN serves a file by its SHA-256.
    let got = |f: &String| fetched.iter().any(|p| p.ends_with(&hub.sha(f)));
    for done in &shards[..2] {
        assert!(!got(done), "{done} fetched again: {fetched:?}");
    }
    assert!(got(&shards[2]) && got(&shards[3]), "{fetched:?}");
    // Finished: a second --resume reads no shard, not even a header.
    let before = hub.log().len();
    ok(
        &crate::hub::cli(&hub, &cache, &args, &[]),
        "resumed when finished",
    );
    let shas: Vec<String> = shards.iter().map(|f| hub.sha(f)).collect();
    let reads: Vec<_> = hub.log()[before..]
        .iter()
        .filter(|h| {
            h.method == "GET" && (h.range.is_some() || shas.iter().any(|s| h.path.ends_with(s)))
        })
        .map(|h| h.path.clone())
        .collect();
    assert!(reads.is_empty(), "read when finished: {reads:?}");
    assert_files(
        &but_card(&out),
        &but_card(&reference),
        "resumed when finished",
    );
}

/// A Hub run killed with SIGKILL after one and after three of five output
/// files (its shards coming in slowly), then run again with `--resume`:
/// the bytes of one local run.
#[cfg(unix)]
#[test]
fn hub_resume_after_sigkill_equals_one_run() {
    use crate::common::hub::{Faults, MockHub};
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let shards = checkpoint(&input, 5, (256, 512));
    let reference = tmp.path().join("reference");
    run(&input, &reference, false, None, None).unwrap();
    let want = but_card(&reference);
    let repo = "org/killed";
    let hub = MockHub::serve(
        repo,
        &input,
        Faults {
            slow: Some(std::time::Duration::from_millis(5)),
            ..Faults::default()
        },
    );
    for after in [1, 3] {
        let what = format!("from the Hub, killed after {after}");
        let (cache, out) = (
            tmp.path().join(format!("cache-{after}")),
            tmp.path().join(format!("out-{after}")),
        );
        let args = [
            "dequantize",
            repo,
            "-o",
            out.to_str().unwrap(),
            "--backend",
            "cpu",
            "--quiet",
            "--resume",
        ];
        let cmd = crate::hub::command(&hub, &cache, &args, &[]);
        kill_after(cmd, &out.join(STAGING), after, shards.len(), &what);
        ok(&crate::hub::cli(&hub, &cache, &args, &[]), &what);
        assert_files(&but_card(&out), &want, &what);
    }
}

/// The record a finished run leaves in `out`, as JSON.
fn record(out: &Path) -> serde_json::Value {
    let text =
        std::fs::read(out.join(".cache/huggingface/wgpu-dequant-done.json")).expect("no record");
    serde_json::from_slice(&text).unwrap()
}

/// Overwrites the tensor data of safetensors file `path` (not its header,
/// which a job's key covers) with other bytes, its size and modification
/// time kept: a run that read its tensors would write other bytes.
fn garble(path: &Path) {
    let when = written(path);
    let mut bytes = std::fs::read(path).unwrap();
    let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[header..].fill(0xA5);
    std::fs::write(path, bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(when)
        .unwrap();
}

/// A finished run leaves a record of its files (sizes and SHA-256); a
/// `--resume` of the same job into it then has nothing to do: it exits 0
/// saying so, reads no tensor of an input shard (their data is garbled,
/// their headers, sizes and dates kept)
/// and touches no file. A damaged output file is not taken for finished
/// (the run writes the output again); another job's record keeps the
/// refusal of a non-empty directory.
#[test]
fn a_finished_run_resumed_has_nothing_to_do_and_reads_no_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let shards = checkpoint(&input, 3, (64, 256));
    let out = tmp.path().join("out");
    run(&input, &out, false, None, None).unwrap();
    let want = files(&out);
    let r = record(&out);
    let listed: Vec<&String> = r["files"].as_object().unwrap().keys().collect();
    assert_eq!(listed, want.keys().collect::<Vec<_>>());
    for (name, bytes) in &want {
        let digest = blake3::hash(bytes).to_hex().to_string();
        assert_eq!(r["files"][name]["blake3"], digest, "{name}");
        assert_eq!(r["files"][name]["size"], bytes.len(), "{name}");
    }
    let cli = |extra: &[&str]| {
        dequantize(&input, &out)
            .arg("--resume")
            .args(extra)
            .output()
            .unwrap()
    };
    // A damaged file is written again, with the rest.
    let damaged = out.join(&shards[1]);
    let mut bytes = std::fs::read(&damaged).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&damaged, bytes).unwrap();
    let o = cli(&["--quiet"]);
    ok(&o, "resumed over a damaged file");
    assert_files(&files(&out), &want, "resumed over a damaged file");
    // Another job: refused as before.
    let o = cli(&["--dtype", "f32"]);
    crate::common::cli::error_line(&o, "another job", "OUT-001", &["not empty"]);
    assert_files(&files(&out), &want, "after another job's refusal");
    // Nothing to do, and no tensor read: the shards' data is garbled now.
    let stamps: Vec<_> = want.keys().map(|f| written(&out.join(f))).collect();
    for s in &shards {
        garble(&input.join(s));
    }
    let o = cli(&["--json"]);
    ok(&o, "resumed when finished");
    let err = crate::common::cli::stderr(&o);
    assert!(err.contains("nothing left to do"), "{err}");
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["already_done"], true, "{summary}");
    assert_eq!(summary["decoded"], 3, "{summary}");
    assert_files(&files(&out), &want, "resumed when finished");
    let now: Vec<_> = want.keys().map(|f| written(&out.join(f))).collect();
    assert_eq!(now, stamps, "files touched");
}

/// SIGKILL once exactly 1 and once exactly 3 files of the commit are in
/// the output (each rename stalled 0.3 s, so the count is certain when the
/// kill lands): a run without `--resume` refuses with a line saying
/// `--resume` finishes it, and `--resume` ends with the bytes of one
/// uninterrupted run.
#[cfg(target_os = "linux")]
#[test]
fn a_kill_after_one_or_three_renames_is_finished_by_resume() {
    use crate::common::cli::error_line;
    use crate::common::stall::{stalled, traced};
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    checkpoint(&input, 4, (256, 512));
    let reference = tmp.path().join("reference");
    run(&input, &reference, false, None, None).unwrap();
    let want = files(&reference);
    let cli = |out: &Path| {
        let mut cmd = dequantize(&input, out);
        cmd.arg("--quiet");
        cmd
    };
    // The files (not folders) the commit has moved into `out`.
    let moved = |out: &Path| {
        std::fs::read_dir(out).map_or(0, |d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .count()
        })
    };
    for k in [1, 3] {
        let what = format!("killed after {k} renames");
        let out = tmp.path().join(format!("killed-{k}"));
        let run = cli(&out);
        let mut strace = stalled("rename,renameat,renameat2", 300)
            .arg(run.get_program())
            .args(run.get_args())
            .spawn()
            .unwrap();
        let pid = traced(&mut strace, &std::fs::canonicalize(bin()).unwrap());
        let since = std::time::Instant::now();
        while moved(&out) < k {
            assert!(
                strace.try_wait().unwrap().is_none(),
                "{what}: the run ended first"
            );
            assert!(
                since.elapsed().as_secs() < 120,
                "{what}: the commit never began"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
        let _ = strace.wait();
        assert_eq!(moved(&out), k, "{what}: the kill came late");
        let o = cli(&out).output().unwrap();
        let line = error_line(&o, &format!("{what}, run again"), "OUT-001", &[]);
        assert!(
            line.contains("--resume"),
            "{what}: the refusal does not say --resume finishes it: {line}"
        );
        ok(&cli(&out).arg("--resume").output().unwrap(), &what);
        assert_files(&files(&out), &want, &what);
        assert!(!out.join(STAGING).exists(), "{what}: staging folder left");
    }
}

/// Killed during its commit (at whichever rename the kill lands) and
/// killed after the last one, before its staging folder was removed (made
/// by hand: the folder with its lock and journal, the lock held by no one):
/// `--resume` ends with one run's bytes and no staging folder; after the
/// last rename it has nothing to do.
#[cfg(unix)]
#[test]
fn resume_after_a_kill_in_the_commit_equals_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    checkpoint(&input, 6, (512, 1024));
    let reference = tmp.path().join("reference");
    run(&input, &reference, false, None, None).unwrap();
    let want = files(&reference);
    let cli = |out: &Path| {
        let mut cmd = dequantize(&input, out);
        cmd.args(["--quiet", "--resume"]);
        cmd
    };
    for k in 0..3 {
        let what = format!("killed in the commit, try {k}");
        let out = tmp.path().join(format!("commit-{k}"));
        let mut child = cli(&out).spawn().unwrap();
        loop {
            let moved = std::fs::read_dir(&out)
                .map(|d| {
                    d.flatten()
                        .any(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
                })
                .unwrap_or(false);
            if moved || child.try_wait().unwrap().is_some() {
                break;
            }
        }
        let pid = child.id().to_string();
        Command::new("kill").args(["-KILL", &pid]).status().unwrap();
        let _ = child.wait();
        ok(&cli(&out).output().unwrap(), &what);
        assert_files(&files(&out), &want, &what);
        assert!(!out.join(STAGING).exists(), "{what}: staging folder left");
    }
    let out = tmp.path().join("after-the-last-rename");
    run(&input, &out, false, None, None).unwrap();
    let staging = out.join(STAGING);
    std::fs::create_dir(&staging).unwrap();
    std::fs::write(staging.join(".lock"), "1\n").unwrap();
    std::fs::write(staging.join(".journal.json"), "{\"key\":\"\"}\n").unwrap();
    let o = cli(&out).arg("--json").output().unwrap();
    ok(&o, "after the last rename");
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["already_done"], true, "{summary}");
    assert_files(&files(&out), &want, "after the last rename");
    assert!(
        !staging.exists(),
        "after the last rename: staging folder left"
    );
}

//! Runs that are interrupted, killed, or that meet another run in the same
//! output directory. Each test catches a real `dequantize` process in the
//! middle of writing (frozen with SIGSTOP, so the moment is certain), then
//! sends it a signal or starts a second run, and checks what is left.
#![cfg(unix)]

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use wgpu_dequant::Names;

use crate::common::cli::{error_line, ok, stderr};
use crate::common::{bin, ct_config, sha256_hex, write_checkpoint, Rng, Tensor};

const STAGING: &str = ".wgpu-dequant-partial";

/// A checkpoint whose dense output (128 MB of bf16) takes long enough to
/// write that the run can be caught in the middle.
fn big_checkpoint(dir: &Path) -> PathBuf {
    let model = dir.join("model");
    let (rows, cols) = (4096, 8192);
    let mut rng = Rng::new(0x1e7e);
    let mut tensors = Vec::new();
    for i in 0..2 {
        let m = format!("model.layers.{i}.mlp.down_proj");
        let packed: Vec<u32> = (0..rows * cols / 8).map(|_| rng.next() as u32).collect();
        let scales = vec![0.0625f32; rows * cols / 128];
        tensors.push(Tensor::u32_words(
            format!("{m}.weight_packed"),
            &[rows, cols / 8],
            &packed,
        ));
        tensors.push(Tensor::bf16(
            format!("{m}.weight_scale"),
            &[rows, cols / 128],
            &scales,
        ));
        tensors.push(Tensor::i64(
            format!("{m}.weight_shape"),
            &[2],
            &[rows as i64, cols as i64],
        ));
    }
    let weights = serde_json::json!({"num_bits": 4, "type": "int", "strategy": "group",
        "group_size": 128, "symmetric": true, "dynamic": false});
    write_checkpoint(
        &model,
        &tensors,
        ct_config("pack-quantized", weights, "0.19.0"),
    );
    model
}

fn start(model: &Path, out: &Path, extra: &[&str]) -> Child {
    Command::new(bin())
        .arg("dequantize")
        .arg(model)
        .arg("-o")
        .arg(out)
        .args(["--backend", "cpu"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} failed");
}

/// Waits until `child` has written part of its shard into its staging folder
/// in `out`, then freezes it there (SIGSTOP).
fn freeze_mid_write(child: &mut Child, out: &Path) {
    let shard = out.join(STAGING).join("model.safetensors");
    let since = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before it could be caught writing");
        }
        let written = std::fs::metadata(&shard).map_or(0, |m| m.len());
        if written > 8 << 20 {
            signal(child, "STOP");
            wait_stopped(child);
            break;
        }
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "the run never started writing"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended before it was frozen"
    );
}

/// Waits until every thread of `child` has stopped: `kill` returns once the
/// signal is queued, and a thread may finish a write before it stops.
fn wait_stopped(child: &Child) {
    let tasks = PathBuf::from(format!("/proc/{}/task", child.id()));
    if !tasks.exists() {
        // No procfs (macOS): give the threads time to stop.
        std::thread::sleep(Duration::from_millis(500));
        return;
    }
    let since = Instant::now();
    let stopped = |stat: String| {
        // The state follows the parenthesised command name.
        stat.rsplit(") ")
            .next()
            .is_some_and(|rest| rest.starts_with(['T', 't']))
    };
    while !std::fs::read_dir(&tasks)
        .unwrap()
        .all(|t| std::fs::read_to_string(t.unwrap().path().join("stat")).is_ok_and(stopped))
    {
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "the run did not stop"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Every file under `dir` (relative path → SHA-256), links not followed.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, into: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if p.is_dir() {
                into.insert(format!("{rel}/"), String::new());
                walk(root, &p, into);
            } else {
                into.insert(rel, sha256_hex(&std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut files = BTreeMap::new();
    if dir.exists() {
        walk(dir, dir, &mut files);
    }
    files
}

/// The files an uninterrupted run writes for `model`.
fn reference(tmp: &Path, model: &Path) -> BTreeMap<String, String> {
    let out = tmp.join("reference");
    let o = start(model, &out, &["--quiet"]).wait_with_output().unwrap();
    ok(&o, "reference run");
    let files = tree(&out);
    std::fs::remove_dir_all(&out).unwrap();
    files
}

fn interrupted_run_leaves_nothing(sig: &str, number: i32) {
    let tmp = tempfile::tempdir().unwrap();
    let model = big_checkpoint(tmp.path());
    let parent = tmp.path().join("outputs");
    let out = parent.join("a/b/dense");
    let mut child = start(&model, &out, &[]);
    freeze_mid_write(&mut child, &out);
    signal(&child, sig);
    signal(&child, "CONT");
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.signal(),
        Some(number),
        "SIG{sig}: the run should end by the signal, as an uncaught one does ({}):\n{}",
        o.status,
        stderr(&o)
    );
    assert!(
        !parent.exists(),
        "SIG{sig} left {:?} behind",
        tree(&parent).keys().collect::<Vec<_>>()
    );
}

#[test]
fn sigint_mid_write_leaves_nothing() {
    interrupted_run_leaves_nothing("INT", 2);
}

#[test]
fn sigterm_mid_write_leaves_nothing() {
    interrupted_run_leaves_nothing("TERM", 15);
}

#[test]
fn sighup_mid_write_leaves_nothing() {
    interrupted_run_leaves_nothing("HUP", 1);
}

#[test]
fn interrupted_force_run_keeps_the_files_it_would_replace() {
    let tmp = tempfile::tempdir().unwrap();
    let model = big_checkpoint(tmp.path());
    let out = tmp.path().join("dense");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("model.safetensors"), b"the old weights").unwrap();
    std::fs::write(out.join("notes.txt"), b"unrelated").unwrap();
    let before = tree(&out);
    let mut child = start(&model, &out, &["--force"]);
    freeze_mid_write(&mut child, &out);
    signal(&child, "TERM");
    signal(&child, "CONT");
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.signal(), Some(15), "{}", stderr(&o));
    assert_eq!(tree(&out), before, "an interrupted --force run changed OUT");
}

#[test]
fn staging_left_by_a_killed_run_is_removed_by_the_next() {
    let tmp = tempfile::tempdir().unwrap();
    let model = big_checkpoint(tmp.path());
    let expected = reference(tmp.path(), &model);
    for extra in [&[][..], &["--force"][..]] {
        let out = tmp.path().join(format!("dense{}", extra.len()));
        let mut child = start(&model, &out, extra);
        freeze_mid_write(&mut child, &out);
        signal(&child, "KILL");
        child.wait().unwrap();
        assert!(
            out.join(STAGING).join("model.safetensors").exists(),
            "SIGKILL cannot be caught: its staging folder stays"
        );
        let o = start(&model, &out, extra).wait_with_output().unwrap();
        ok(&o, &format!("a run {extra:?} after a killed one"));
        assert_eq!(
            tree(&out),
            expected,
            "{extra:?}: the next run gives the whole output and nothing else"
        );
    }
}

#[test]
fn a_second_run_into_the_same_directory_refuses_and_harms_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let model = big_checkpoint(tmp.path());
    let expected = reference(tmp.path(), &model);
    for extra in [&[][..], &["--force"][..]] {
        let out = tmp.path().join(format!("dense{}", extra.len()));
        let mut first = start(&model, &out, extra);
        freeze_mid_write(&mut first, &out);
        let staged = tree(&out.join(STAGING));

        let second = start(&model, &out, extra).wait_with_output().unwrap();
        let line = error_line(
            &second,
            &format!("a second run {extra:?}"),
            "OUT-001",
            &[&first.id().to_string()],
        );
        assert!(line.contains("another wgpu-dequant run"), "{line}");
        assert_eq!(second.status.code(), Some(1), "{line}");
        assert_eq!(
            tree(&out.join(STAGING)),
            staged,
            "{extra:?}: the second run touched the first one's staging folder"
        );

        signal(&first, "CONT");
        let o = first.wait_with_output().unwrap();
        ok(&o, &format!("the first run {extra:?}"));
        assert_eq!(tree(&out), expected, "{extra:?}: the first run's output");
    }
}

/// An app cancels a write from its own thread (a Cancel button, Python's
/// Ctrl-C): the write stops before its next piece, fails with IO-001 and
/// leaves nothing; a write cancelled before it starts writes nothing at all.
#[test]
fn a_cancelled_write_fails_and_leaves_nothing() {
    use wgpu_dequant::backend::Cpu;
    use wgpu_dequant::writer::OutputDir;
    use wgpu_dequant::{Checkpoint, DtypeChoice, Plan, Rule};

    let ckpt = Checkpoint::open(crate::common::fixtures().join("w4a16-g128/model")).unwrap();
    let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for cancel_after in [0, 1, 3] {
        let out = tmp.path().join(format!("dense-{cancel_after}"));
        let dir = OutputDir::create(&out).unwrap();
        let canceller = dir.canceller();
        if cancel_after == 0 {
            std::thread::spawn({
                let c = canceller.clone();
                move || c.cancel()
            })
            .join()
            .unwrap();
        }
        let mut pieces = 0;
        let e = dir
            .write(&plan, &Cpu::new(), |_| {
                pieces += 1;
                if pieces == cancel_after {
                    canceller.cancel();
                }
            })
            .unwrap_err();
        assert_eq!(e.rule, Rule::Cancelled, "{e}");
        assert!(e.to_string().contains("cancelled"), "{e}");
        assert_eq!(pieces, cancel_after, "pieces written after the cancel");
        assert!(!out.exists(), "{} left behind", out.display());
    }
}

/// Signals at random moments of a whole run (start, decoding, syncing,
/// committing), TERM, INT and HUP in turn: every run either ends by its
/// signal, saying so in one line, and leaves nothing of its output, or
/// finished first and left the whole output.
#[test]
fn signals_at_random_moments_leave_nothing_or_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    crate::resume::checkpoint(&input, 4, (1024, 2048));
    let out = tmp.path().join("reference");
    let since = Instant::now();
    let o = start(&input, &out, &["--quiet"])
        .wait_with_output()
        .unwrap();
    let took = since.elapsed();
    ok(&o, "reference run");
    let want = tree(&out);
    let mut rng = Rng::new(0x5197_A150);
    let (mut ended, mut finished) = (0, 0);
    for trial in 0..12 {
        let (sig, number) = [("TERM", 15), ("INT", 2), ("HUP", 1)][trial % 3];
        let parent = tmp.path().join(format!("trial-{trial}"));
        let out = parent.join("dense");
        let at = took.mul_f64(rng.below(1200) as f64 / 1000.0);
        let child = start(&input, &out, &["--quiet"]);
        std::thread::sleep(at);
        signal(&child, sig);
        let o = child.wait_with_output().unwrap();
        let what = format!("trial {trial}: SIG{sig} at {at:?}");
        if o.status.success() {
            assert_eq!(tree(&out), want, "{what}: finished, but not whole");
            finished += 1;
            continue;
        }
        assert_eq!(
            o.status.signal(),
            Some(number),
            "{what}: {}\n{}",
            o.status,
            stderr(&o)
        );
        // A signal can only come before the handler is installed in the
        // first instants of the process, when nothing is written yet.
        let said = stderr(&o);
        let line = said.lines().last().unwrap_or_default();
        assert!(
            line.starts_with(&format!("interrupted by SIG{sig}"))
                || (said.is_empty() && !parent.exists()),
            "{what}: said {said:?}"
        );
        assert!(
            !parent.exists() || tree(&parent).is_empty(),
            "{what}: left {:?}",
            tree(&parent).keys().collect::<Vec<_>>()
        );
        ended += 1;
    }
    assert!(
        ended > 0,
        "no run was caught before it finished ({finished} finished)"
    );
}

/// Every line of `o`'s stderr as JSON (what a `--json` run tells).
fn events(o: &std::process::Output) -> Vec<serde_json::Value> {
    let err = stderr(o);
    let parse = |l: &str| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}\n{err}"));
    err.lines().map(parse).collect()
}

/// A `--resume` run stopped once a file is finished keeps its finished
/// files (and only those), says how many (with `--json`, as an event), and
/// the next `--resume` run says it keeps them and ends with the bytes of
/// one uninterrupted run.
#[test]
fn a_stopped_resume_run_keeps_what_it_finished() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    crate::resume::checkpoint(&input, 6, (1024, 2048));
    let want = reference(tmp.path(), &input);
    let out = tmp.path().join("dense");
    let mut child = start(&input, &out, &["--resume", "--json"]);
    let journal = out.join(STAGING).join(".journal.json");
    let since = Instant::now();
    while !std::fs::read_to_string(&journal).is_ok_and(|j| j.contains(".safetensors")) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before a file was finished"
        );
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "no file was ever finished"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    signal(&child, "STOP");
    wait_stopped(&child);
    signal(&child, "TERM");
    signal(&child, "CONT");
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.signal(), Some(15), "{}\n{}", o.status, stderr(&o));
    let listed = crate::resume::journaled(&out.join(STAGING));
    let kept: Vec<String> = std::fs::read_dir(out.join(STAGING))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    let mut kept_sorted = kept.clone();
    kept_sorted.sort();
    assert_eq!(
        kept_sorted, listed,
        "kept files other than the finished ones"
    );
    let s = if kept.len() == 1 { "" } else { "s" };
    let line = format!("kept {} finished file{s}", kept.len());
    let told = events(&o);
    let said = told.last().expect("an interruption event");
    assert_eq!(said["event"], "interrupted", "{said}");
    assert_eq!(said["signal"], "SIGTERM", "{said}");
    assert_eq!(said["kept"][0]["files"], kept.len(), "{said}");
    assert!(
        said["message"].as_str().is_some_and(|m| m.contains(&line)),
        "does not say {line:?}: {said}"
    );
    let o = start(&input, &out, &["--resume"])
        .wait_with_output()
        .unwrap();
    ok(&o, "the run resumed");
    let shards = want.keys().filter(|f| f.ends_with(".safetensors")).count();
    let line = format!(
        "resuming {}: {} finished file{s} kept (checked against their BLAKE3 digests), {} to write",
        out.display(),
        kept.len(),
        shards - kept.len()
    );
    assert!(
        stderr(&o).lines().any(|l| l == line),
        "does not say {line:?}: {}",
        stderr(&o)
    );
    assert_eq!(tree(&out), want);
}

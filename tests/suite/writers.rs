//! One writer per output directory, and `--resume` keyed on what the input
//! holds: two runs into one directory never both succeed, a run that finds
//! another's lock held refuses at once naming it, and an input rewritten
//! in place (same size, same modification time) is written anew.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::bin;
use crate::common::cli::error_line;
use crate::common::stall::stalled;
use crate::resume::{assert_files, checkpoint, files};
use wgpu_dequant::{BackendChoice, Dequantize, DtypeChoice, OutDtype, Rule};

const STAGING: &str = ".wgpu-dequant-partial";

fn cli(input: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("dequantize")
        .arg(input)
        .arg("-o")
        .arg(out)
        .args(["--backend", "cpu"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

fn lib_run(input: &Path, out: &Path, dtype: OutDtype, resume: bool) -> wgpu_dequant::Result<()> {
    Dequantize::new()
        .backend(BackendChoice::Cpu)
        .dtype(DtypeChoice::Fixed(dtype))
        .resume(resume)
        .run(input, out)
        .map(|_| ())
}

/// A staging folder whose lock a live process holds (this one, for the
/// test): a run into that directory, with or without `--resume`, refuses
/// with OUT-001 naming the pid the lock file gives, and leaves it alone.
#[test]
fn a_held_lock_makes_a_second_run_refuse_naming_its_pid() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    checkpoint(&input, 1, (64, 256));
    let out = tmp.path().join("out");
    std::fs::create_dir_all(out.join(STAGING)).unwrap();
    let mut lock = File::create(out.join(STAGING).join(".lock")).unwrap();
    lock.lock().unwrap();
    writeln!(lock, "4242").unwrap();
    for extra in [&[][..], &["--resume"][..], &["--force"][..]] {
        let what = format!("a run with {extra:?} into a held output");
        let o = cli(&input, &out, extra).output().unwrap();
        error_line(&o, &what, "OUT-001", &["pid 4242"]);
        let left: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, [STAGING], "{what}: touched the output");
        assert!(
            out.join(STAGING).join(".lock").exists(),
            "{what}: lock file removed"
        );
    }
}

/// Two runs of different dtypes started together into one fresh output,
/// five times, each directory listing stalled for 0.3 s (so both runs see
/// the output empty before either writes): exactly one succeeds, the other
/// refuses with OUT-001, and the output is the winner's own, byte for byte.
#[cfg(target_os = "linux")]
#[test]
fn two_runs_racing_into_one_output_never_both_succeed() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    checkpoint(&input, 3, (64, 256));
    let mut want = std::collections::BTreeMap::new();
    for (name, dtype) in [("bf16", OutDtype::Bf16), ("f32", OutDtype::F32)] {
        let reference = tmp.path().join(format!("reference-{name}"));
        lib_run(&input, &reference, dtype, false).unwrap();
        want.insert(name, files(&reference));
    }
    // The rounds run at once: the runs spend their time in the stalls.
    let rounds: Vec<_> = (0..5)
        .map(|round| {
            let out = tmp.path().join(format!("out-{round}"));
            let runs: Vec<_> = ["bf16", "f32"]
                .into_iter()
                .map(|d| {
                    let run = cli(&input, &out, &["--dtype", d]);
                    let mut stalled = stalled("getdents64", 300);
                    stalled
                        .arg(run.get_program())
                        .args(run.get_args())
                        .stdout(Stdio::null())
                        .stderr(Stdio::piped());
                    (d, stalled.spawn().unwrap())
                })
                .collect();
            (round, out, runs)
        })
        .collect();
    for (round, out, runs) in rounds {
        let done: Vec<_> = runs
            .into_iter()
            .map(|(d, c)| (d, c.wait_with_output().unwrap()))
            .collect();
        let winners: Vec<_> = done.iter().filter(|(_, o)| o.status.success()).collect();
        assert_eq!(
            winners.len(),
            1,
            "round {round}: {} runs succeeded",
            winners.len()
        );
        for (d, o) in done.iter().filter(|(_, o)| !o.status.success()) {
            error_line(o, &format!("round {round}: the {d} run"), "OUT-001", &[]);
        }
        let winner = winners[0].0;
        assert_files(
            &files(&out),
            &want[winner],
            &format!("round {round}: {winner} won"),
        );
        assert!(
            !out.join(STAGING).exists(),
            "round {round}: staging folder left"
        );
    }
}

/// An input shard rewritten in place with other tensors' bytes, its size
/// and modification time as before: `--resume` keeps nothing an earlier
/// run of the old bytes finished, and writes what a fresh run of the new
/// bytes writes.
#[test]
fn resume_keys_on_what_the_input_holds_not_its_dates() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let shards = checkpoint(&input, 3, (64, 256));
    let out = tmp.path().join("out");
    // Interrupted after the first file: the staging folder keeps it.
    let canceller = wgpu_dequant::Canceller::default();
    let (c, mut done) = (canceller.clone(), 0);
    let e = Dequantize::new()
        .backend(BackendChoice::Cpu)
        .dtype(DtypeChoice::Fixed(OutDtype::Bf16))
        .resume(true)
        .canceller(canceller)
        .on_progress(move |p| {
            done += usize::from(p.done);
            if done == 2 {
                c.cancel();
            }
        })
        .run(&input, &out)
        .unwrap_err();
    assert_eq!(e.rule, Rule::Cancelled, "{e}");
    let journal = std::fs::read_to_string(out.join(STAGING).join(".journal.json")).unwrap();
    assert!(journal.contains(&shards[0]), "nothing finished: {journal}");
    let old = tmp.path().join("old");
    lib_run(&input, &old, OutDtype::Bf16, false).unwrap();

    // The same tensors' bytes in another order, the codes inverted; the
    // header padded to its old length.
    let shard = input.join(&shards[0]);
    let bytes = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut names: Vec<&String> = header.as_object().unwrap().keys().collect();
    names.sort_by_key(|k| {
        header[*k]["data_offsets"][1].as_u64().unwrap()
            - header[*k]["data_offsets"][0].as_u64().unwrap()
    });
    let (mut new_header, mut new_data) = (serde_json::Map::new(), Vec::new());
    for name in names {
        let t = &header[name];
        let (a, b) = (
            t["data_offsets"][0].as_u64().unwrap() as usize,
            t["data_offsets"][1].as_u64().unwrap() as usize,
        );
        let mut piece = data[a..b].to_vec();
        if name.ends_with("weight_packed") {
            piece.iter_mut().for_each(|b| *b = !*b);
        }
        let at = new_data.len();
        new_data.extend_from_slice(&piece);
        new_header.insert(name.clone(), serde_json::json!({"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [at, new_data.len()]}));
    }
    let mut text = serde_json::Value::Object(new_header)
        .to_string()
        .into_bytes();
    assert!(text.len() <= n, "the new header is longer than the old");
    text.resize(n, b' ');
    let mut rewritten = bytes[..8].to_vec();
    rewritten.extend_from_slice(&text);
    rewritten.extend_from_slice(&new_data);
    assert_eq!(rewritten.len(), bytes.len());
    assert_ne!(rewritten, bytes);
    let modified = std::fs::metadata(&shard).unwrap().modified().unwrap();
    let mut f = File::options().write(true).open(&shard).unwrap();
    f.write_all(&rewritten).unwrap();
    f.set_modified(modified).unwrap();
    drop(f);
    let meta = std::fs::metadata(&shard).unwrap();
    assert_eq!(
        (meta.len(), meta.modified().unwrap()),
        (bytes.len() as u64, modified)
    );

    let fresh = tmp.path().join("fresh");
    lib_run(&input, &fresh, OutDtype::Bf16, false).unwrap();
    let want = files(&fresh);
    assert_ne!(
        want.get(&shards[0]),
        files(&old).get(&shards[0]),
        "the rewrite changed no output"
    );
    lib_run(&input, &out, OutDtype::Bf16, true).unwrap();
    assert_files(&files(&out), &want, "resumed after an in-place rewrite");
}

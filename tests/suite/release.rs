//! Release-scale runs: the free-space preflight every run makes before it
//! decodes anything, and `--part I/N` jobs that split a checkpoint's shards
//! between Slurm array tasks or Kubernetes Indexed Job pods.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::cli::{error_line, ok, stderr};
use crate::common::hub::{Faults, MockHub};
use crate::common::{bin, fixtures};
use crate::resume::{assert_files, but_card, checkpoint, files};
use wgpu_dequant::{BackendChoice, Dequantize, Rule};

/// A file system of `bytes`: a tmpfs mounted for the test when it runs as
/// root and may mount, else a folder whose free space the tool is told
/// (`WGPU_DEQUANT_FREE_SPACE`: what it has left of `bytes`).
struct SmallFs {
    dir: PathBuf,
    bytes: u64,
    mounted: bool,
    _tmp: tempfile::TempDir,
}

impl SmallFs {
    fn new(bytes: u64) -> SmallFs {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("small");
        std::fs::create_dir(&dir).unwrap();
        let root = unsafe { libc::geteuid() } == 0;
        let mounted = root
            && Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
                .arg(&dir)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        SmallFs {
            dir,
            bytes,
            mounted,
            _tmp: tmp,
        }
    }

    /// The environment a run writing here gets.
    fn env(&self) -> Vec<(&'static str, String)> {
        match self.mounted {
            true => vec![],
            false => {
                let used = crate::common::hub::folder_bytes(&self.dir);
                let left = self.bytes.saturating_sub(used).max(1);
                vec![("WGPU_DEQUANT_FREE_SPACE", left.to_string())]
            }
        }
    }

    /// `dequantize INPUT -o OUT --backend cpu --quiet EXTRA…` writing here.
    fn run(&self, input: &Path, out: &Path, extra: &[&str]) -> Output {
        let mut cmd = Command::new(bin());
        cmd.args([
            "dequantize",
            input.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .args(["--backend", "cpu", "--quiet"])
        .args(extra)
        .env_remove("WGPU_DEQUANT_FREE_SPACE");
        for (k, v) in self.env() {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    /// Every path under the file system (what a refused run must not leave).
    fn contents(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, into: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, into);
                }
                into.push(p);
            }
        }
        let mut v = Vec::new();
        walk(&self.dir, &mut v);
        v.sort();
        v
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// Asserts `o` is the preflight's refusal: exit 1, one `OUT-001` line with
/// both sizes (and, on a real mount, its mount point).
fn refused(o: &Output, fs: &SmallFs, what: &str) {
    assert_eq!(o.status.code(), Some(1), "{what}: {}", stderr(o));
    let line = error_line(o, what, "OUT-001", &[]);
    assert!(
        line.contains(" need") && line.matches(" MB").count() + line.matches(" kB").count() == 2,
        "{what}: both sizes in human units: {line}"
    );
    if fs.mounted {
        let mount = format!("mounted at {} has", fs.dir.display());
        assert!(
            line.contains(&mount),
            "{what}: names the mount point: {line}"
        );
    }
}

/// A 4-shard int4 checkpoint whose bf16 output is 2 MiB (512 KiB a shard)
/// against file systems of 1, 3 and 4 MiB: refused before anything is
/// written (with `--max-shard-size` too, where the first files would fit,
/// and with `--resume`), a run that fits is not, and a `--force` run over
/// an older output, where both would not fit together, is refused and the
/// old output stays.
#[test]
fn runs_that_cannot_fit_are_refused_before_decoding() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    checkpoint(&input, 4, (256, 1024));
    let fs = SmallFs::new(1 << 20);
    let out = fs.dir.join("out");
    for extra in [&[][..], &["--max-shard-size", "300kB"], &["--resume"]] {
        let what = format!("1 MiB, {extra:?}");
        refused(&fs.run(&input, &out, extra), &fs, &what);
        assert_eq!(fs.contents(), Vec::<PathBuf>::new(), "{what}: left behind");
    }
    // An output directory that existed stays, empty.
    std::fs::create_dir(&out).unwrap();
    refused(&fs.run(&input, &out, &[]), &fs, "into an empty folder");
    assert_eq!(fs.contents(), vec![out.clone()], "into an empty folder");
    // The library refuses the same way (told the free space only by the
    // file system: the environment is the whole test process's).
    if fs.mounted {
        let e = Dequantize::new()
            .backend(BackendChoice::Cpu)
            .run(&input, &out);
        assert_eq!(e.map(|_| ()).unwrap_err().rule, Rule::Output);
        assert_eq!(fs.contents(), vec![out.clone()], "the library");
    }
    drop(fs);

    let fs = SmallFs::new(4 << 20);
    let out = fs.dir.join("out");
    ok(&fs.run(&input, &out, &[]), "4 MiB");
    let reference = tmp.path().join("reference");
    Dequantize::new()
        .backend(BackendChoice::Cpu)
        .run(&input, &reference)
        .unwrap();
    assert_files(&files(&out), &files(&reference), "4 MiB");
    drop(fs);

    let fs = SmallFs::new(3 << 20);
    let out = fs.dir.join("out");
    ok(&fs.run(&input, &out, &["--dtype", "bf16"]), "3 MiB, first");
    let old = files(&out);
    let o = fs.run(&input, &out, &["--force", "--dtype", "f16"]);
    refused(&o, &fs, "3 MiB, --force over the first");
    assert_files(&files(&out), &old, "the old output after a refused --force");
    let staging: Vec<_> = fs
        .contents()
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("partial"))
        .collect();
    assert!(staging.is_empty(), "left behind: {staging:?}");
}

/// From the Hub, the dense files and the downloads are checked against
/// the free space before any shard is downloaded.
#[test]
fn hub_runs_that_cannot_fit_download_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    checkpoint(&input, 4, (256, 1024));
    let hub = MockHub::serve("org/big", &input, Faults::default());
    let fs = SmallFs::new(1 << 20);
    let out = fs.dir.join("out");
    let env: Vec<(&str, String)> = fs.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let args = [
        "dequantize",
        "org/big",
        "-o",
        out.to_str().unwrap(),
        "--backend",
        "cpu",
        "--quiet",
    ];
    let o = crate::hub::cli(&hub, &tmp.path().join("cache"), &args, &env);
    refused(&o, &fs, "from the Hub");
    assert_eq!(
        fs.contents(),
        Vec::<PathBuf>::new(),
        "from the Hub: left behind"
    );
    // The CDN serves a whole file by its SHA-256.
    let shas: Vec<String> = checkpoint_shards(&input)
        .iter()
        .map(|f| hub.sha(f))
        .collect();
    let whole = hub
        .log()
        .iter()
        .filter(|h| {
            h.method == "GET" && h.range.is_none() && shas.iter().any(|s| h.path.ends_with(s))
        })
        .count();
    assert_eq!(
        whole,
        0,
        "shards downloaded before the refusal: {:?}",
        hub.log()
    );
}

/// The shard files of a checkpoint folder.
fn checkpoint_shards(dir: &Path) -> Vec<String> {
    files(dir)
        .into_keys()
        .filter(|n| n.ends_with(".safetensors"))
        .collect()
}

/// Runs `--part I/N` for every I of `n` (the library when `lib`, the CLI
/// otherwise), then `merge-index`; asserts that the parts wrote disjoint
/// files, each part within `shard` bytes (the most one input shard writes)
/// of the mean, and returns the merged output's files.
fn parts(
    input: &Path,
    out: &Path,
    n: usize,
    lib: bool,
    extra: &[&str],
    shard: u64,
) -> BTreeMap<String, Vec<u8>> {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut sizes = Vec::new();
    for i in 0..n {
        let before = match out.exists() {
            true => files(out),
            false => BTreeMap::new(),
        };
        if lib {
            let mut run = Dequantize::new().backend(BackendChoice::Cpu).part(i, n);
            if let [_, size] = extra {
                run = run.max_shard_size(wgpu_dequant::parse_size(size).unwrap());
            }
            run.run(input, out).unwrap();
        } else {
            let o = Command::new(bin())
                .args([
                    "dequantize",
                    input.to_str().unwrap(),
                    "-o",
                    out.to_str().unwrap(),
                ])
                .args(["--backend", "cpu", "--quiet", "--part", &format!("{i}/{n}")])
                .args(extra)
                .output()
                .unwrap();
            ok(&o, &format!("part {i}/{n}"));
        }
        if !out.exists() {
            sizes.push(0);
            continue;
        }
        let new: Vec<(String, usize)> = files(out)
            .into_iter()
            .filter(|(name, bytes)| {
                name.ends_with(".safetensors") && before.get(name) != Some(bytes)
            })
            .map(|(name, bytes)| (name, bytes.len()))
            .collect();
        for (name, _) in &new {
            assert!(
                seen.insert(name.clone()),
                "part {i}/{n}: {name} written by two parts"
            );
        }
        sizes.push(new.iter().map(|(_, b)| *b as u64).sum::<u64>());
    }
    let o = Command::new(bin())
        .args(["merge-index", out.to_str().unwrap()])
        .output()
        .unwrap();
    ok(&o, &format!("merge-index after {n} parts"));
    let mean = sizes.iter().sum::<u64>() as f64 / n as f64;
    for (i, s) in sizes.iter().enumerate() {
        assert!(
            (*s as f64 - mean).abs() <= shard as f64,
            "part {i}/{n} writes {s} bytes, the mean is {mean}, a shard at most {shard}: {sizes:?}"
        );
    }
    files(out)
}

/// For N in {1, 2, 3, 7} (more parts than shards included), on the
/// one-file sample and a sharded fixture (CLI) and on five shards of
/// unequal sizes (library, and CLI with `--max-shard-size`): the parts write
/// disjoint files that, merged, are one uninterrupted run's.
#[test]
fn part_jobs_write_one_run_between_them() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = fixtures().join("sharded-nvfp4a16").join("model");
    let unequal = tmp.path().join("unequal");
    checkpoint(&unequal, 5, (64, 256));
    // Shards of 1, 2, 3, 4 and 5 times the bytes: rewrite them bigger.
    for (i, rows) in [(1usize, 128), (2, 192), (3, 256), (4, 320)] {
        let one = tmp.path().join(format!("one-{i}"));
        checkpoint(&one, 5, (rows, 256));
        let name = format!("model-{:05}-of-00005.safetensors", i + 1);
        std::fs::copy(one.join(&name), unequal.join(&name)).unwrap();
    }
    let sample = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/sample-w4a16");
    for (input, lib, extra) in [
        (&sample, false, &[][..]),
        (&fixture, false, &[][..]),
        (&unequal, true, &[][..]),
        (&unequal, false, &["--max-shard-size", "40kB"][..]),
    ] {
        let name = input.file_name().unwrap().to_string_lossy();
        let tag = format!("{name}-{lib}-{}", extra.len());
        let reference = tmp.path().join(format!("reference-{tag}"));
        let mut run = Dequantize::new().backend(BackendChoice::Cpu);
        if let [_, size] = extra {
            run = run.max_shard_size(wgpu_dequant::parse_size(size).unwrap());
        }
        run.run(input, &reference).unwrap();
        let want = files(&reference);
        // The most one input shard writes: its file in a run that keeps the
        // input's sharding (split, its files' headers are a little more).
        let whole = tmp.path().join(format!("whole-{tag}"));
        Dequantize::new()
            .backend(BackendChoice::Cpu)
            .run(input, &whole)
            .unwrap();
        let shard = checkpoint_shards(&whole)
            .iter()
            .map(|f| whole.join(f).metadata().unwrap().len())
            .max()
            .unwrap();
        let shard = shard + shard / 20 * u64::from(!extra.is_empty());
        for n in [1, 2, 3, 7] {
            let what = format!("{} in {n} parts (lib {lib}, {extra:?})", input.display());
            let out = tmp.path().join(format!("out-{n}-{tag}"));
            let got = parts(input, &out, n, lib, extra, shard);
            assert_files(&got, &want, &what);
        }
    }
}

/// `--part` jobs from the Hub download only their own shards; `--part`
/// and `--shards` together, and an I not below N, are refused.
#[test]
fn hub_part_jobs_download_their_own_shards_only() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let shards = checkpoint(&input, 4, (64, 256));
    let reference = tmp.path().join("reference");
    Dequantize::new()
        .backend(BackendChoice::Cpu)
        .run(&input, &reference)
        .unwrap();
    let hub = MockHub::serve("org/parts", &input, Faults::default());
    let out = tmp.path().join("out");
    let mut fetched_by = Vec::new();
    for i in 0..2 {
        let before = hub.log().len();
        let part = format!("{i}/2");
        let args = [
            "dequantize",
            "org/parts",
            "-o",
            out.to_str().unwrap(),
            "--backend",
            "cpu",
            "--quiet",
            "--part",
            &part,
        ];
        ok(
            &crate::hub::cli(&hub, &tmp.path().join("cache"), &args, &[]),
            &part,
        );
        let got: BTreeSet<String> = shards
            .iter()
            .filter(|f| {
                hub.log()[before..].iter().any(|h| {
                    h.method == "GET" && h.range.is_none() && h.path.ends_with(&hub.sha(f))
                })
            })
            .cloned()
            .collect();
        fetched_by.push(got);
    }
    assert!(fetched_by[0].is_disjoint(&fetched_by[1]), "{fetched_by:?}");
    assert_eq!(
        fetched_by[0].len() + fetched_by[1].len(),
        shards.len(),
        "{fetched_by:?}"
    );
    ok(
        &crate::common::cli::run(&["merge-index", out.to_str().unwrap()]),
        "merge-index",
    );
    assert_files(
        &but_card(&out),
        &but_card(&reference),
        "from the Hub in two parts",
    );

    for (args, what) in [
        (&["--part", "2/2"][..], "I not below N"),
        (
            &["--part", "0/2", "--shards", &shards[0]][..],
            "--part with --shards",
        ),
    ] {
        let o = Command::new(bin())
            .args([
                "dequantize",
                input.to_str().unwrap(),
                "-o",
                tmp.path().join("bad").to_str().unwrap(),
            ])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{what}: {}", stderr(&o));
    }
    let e = Dequantize::new()
        .part(3, 3)
        .run(&input, tmp.path().join("bad"))
        .unwrap_err();
    assert_eq!(e.rule, Rule::Argument);
}

//! Checkpoints named by Hub id, against a mock Hub on 127.0.0.1
//! (`common::hub`): the same bytes as a local run, the cache laid out as
//! `huggingface_hub` lays it out, headers alone read for `inspect`, and
//! every fault of the server a one-line error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::cli::{error_line, ok, stdout};
use crate::common::hub::folder_bytes;
use crate::common::hub::{Faults, MockHub};
use crate::common::{bin, copy_dir, fixtures, raw_safetensors, read_tensors, sha256_hex};

const REPO: &str = "org/sharded-nvfp4a16";

fn model() -> PathBuf {
    fixtures().join("sharded-nvfp4a16/model")
}

/// The CLI with the mock as its endpoint and `cache` as its cache; no
/// token and no offline switch from the caller's environment.
pub(crate) fn command(hub: &MockHub, cache: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HUB_CACHE", cache)
        .env("HF_HOME", cache.join("home"))
        .env_remove("HF_TOKEN")
        .env_remove("HUGGING_FACE_HUB_TOKEN")
        .env_remove("HF_HUB_OFFLINE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// [`command`], run to its end.
pub(crate) fn cli(hub: &MockHub, cache: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    command(hub, cache, args, env).output().unwrap()
}

/// `dequantize REPO -o out --backend cpu --quiet` from the mock.
fn dequantize_cpu(hub: &MockHub, cache: &Path, out: &str, env: &[(&str, &str)]) -> Output {
    cli(
        hub,
        cache,
        &["dequantize", REPO, "-o", out, "--backend", "cpu", "--quiet"],
        env,
    )
}

/// Every file of a folder and its bytes (a finished run's record aside,
/// and the model card, which names the source: a Hub run's and a local
/// run's differ there alone, as `upload::` checks).
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| !crate::common::is_record(&e.as_ref().unwrap().file_name().to_string_lossy()))
        .filter(|e| e.as_ref().unwrap().file_name() != "README.md")
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

fn local_run(tmp: &Path) -> BTreeMap<String, Vec<u8>> {
    let out = tmp.join("local");
    let o = Command::new(bin())
        .args([
            "dequantize",
            model().to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--backend",
            "cpu",
            "--quiet",
        ])
        .output()
        .unwrap();
    ok(&o, "local dequantize");
    files(&out)
}

#[test]
fn hub_dequantize_equals_the_local_run_and_fills_the_cache_as_python_does() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = MockHub::serve(REPO, &model(), Faults::default());
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("hub");
    let o = dequantize_cpu(&hub, &cache, out.to_str().unwrap(), &[]);
    ok(&o, "dequantize from the Hub");
    assert_eq!(
        files(&out),
        local_run(tmp.path()),
        "the Hub run's files are the local run's"
    );

    // huggingface_hub's layout: refs/main names the commit, every file of
    // the snapshot is a relative link to its blob, LFS blobs are named by
    // their SHA-256, no partial file is left.
    let repo = cache.join("models--org--sharded-nvfp4a16");
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        hub.commit
    );
    let snapshot = repo.join("snapshots").join(&hub.commit);
    for (name, bytes) in files(&model()) {
        let link =
            std::fs::read_link(snapshot.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            link.starts_with("../../blobs"),
            "{name} links to {}",
            link.display()
        );
        assert_eq!(
            std::fs::read(snapshot.join(&name)).unwrap(),
            bytes,
            "{name}"
        );
        if name.ends_with(".safetensors") {
            assert_eq!(link, Path::new("../../blobs").join(hub.sha(&name)));
        }
    }
    let blobs: Vec<String> = std::fs::read_dir(repo.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        blobs.iter().all(|b| !b.ends_with(".incomplete")),
        "{blobs:?}"
    );
    assert!(cache.join(".locks/models--org--sharded-nvfp4a16").is_dir());

    // A second run pins the commit again and downloads nothing.
    let before = hub.log().len();
    let again = tmp.path().join("again");
    let o = dequantize_cpu(&hub, &cache, again.to_str().unwrap(), &[]);
    ok(&o, "second dequantize");
    let later: Vec<String> = hub.log()[before..]
        .iter()
        .map(|h| format!("{} {}", h.method, h.path))
        .collect();
    assert_eq!(
        later,
        [format!("GET /api/models/{REPO}/revision/main?blobs=true")]
    );

    // Offline, the cache alone serves, with no request at all.
    let offline = tmp.path().join("offline");
    let before = hub.log().len();
    let o = dequantize_cpu(
        &hub,
        &cache,
        offline.to_str().unwrap(),
        &[("HF_HUB_OFFLINE", "1")],
    );
    ok(&o, "offline dequantize");
    assert_eq!(hub.log().len(), before, "offline runs ask nothing");
    assert_eq!(files(&offline), files(&out));
}

#[test]
fn hub_inspect_and_validate_read_headers_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = MockHub::serve(REPO, &model(), Faults::default());
    let cache = tmp.path().join("cache");
    let o = cli(&hub, &cache, &["inspect", REPO], &[]);
    ok(&o, "inspect from the Hub");
    let local = Command::new(bin())
        .args(["inspect", model().to_str().unwrap()])
        .output()
        .unwrap();
    ok(&local, "local inspect");
    // The same report, but for the first line, which names the pinned commit.
    let (first, rest) = stdout(&o)
        .split_once('\n')
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .unwrap();
    assert_eq!(
        first,
        format!("checkpoint  {REPO}@{} (2 shards)", hub.commit)
    );
    // The disk's free space moves between two runs.
    let steady = |text: &str| -> String {
        let lines = text.lines().filter(|l| !l.starts_with("free  "));
        lines.collect::<Vec<_>>().join("\n")
    };
    let local = stdout(&local);
    assert_eq!(steady(&rest), steady(local.split_once('\n').unwrap().1));
    let o = cli(&hub, &cache, &["validate", REPO], &[]);
    ok(&o, "validate from the Hub");
    let shards: usize = files(&model())
        .iter()
        .filter(|(n, _)| n.ends_with(".safetensors"))
        .map(|(_, b)| b.len())
        .sum();
    let read = hub.cdn_bytes();
    assert!(
        read * 10 < shards,
        "inspect and validate read {read} of {shards} shard bytes"
    );
    assert!(hub
        .log()
        .iter()
        .filter(|h| h.path.starts_with("/cdn/"))
        .all(|h| h.range.is_some()));
}

#[test]
fn hub_downloads_survive_cut_connections_and_mirrors_quirks() {
    let tmp = tempfile::tempdir().unwrap();
    let shard = "model-00002-of-00002.safetensors";
    let faults = Faults {
        absolute: true,
        no_content_range: true,
        cut: Some((shard.to_string(), 100_000)),
        ..Faults::default()
    };
    let hub = MockHub::serve(REPO, &model(), faults);
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("hub");
    let o = dequantize_cpu(&hub, &cache, out.to_str().unwrap(), &[]);
    ok(&o, "dequantize through a cut connection");
    assert_eq!(files(&out), local_run(tmp.path()));
    let gets: Vec<Option<String>> = hub
        .log()
        .iter()
        .filter(|h| h.method == "GET" && h.path == format!("/cdn/{}", hub.sha(shard)))
        .map(|h| h.range.clone())
        // Reads of its header are ranges with an end.
        .filter(|r| r.as_ref().is_none_or(|r| r.ends_with('-')))
        .collect();
    assert_eq!(
        gets,
        [None, Some("bytes=100000-".to_string())],
        "the download resumed where it was cut"
    );
}

#[test]
fn hub_faults_are_one_line_errors_and_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = MockHub::serve(REPO, &model(), Faults::default());
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("out");
    let o_arg = out.to_str().unwrap();
    let run = |args: &[&str], env: &[(&str, &str)]| cli(&hub, &cache, args, env);

    let o = run(&["dequantize", "org/missing", "-o", o_arg], &[]);
    error_line(
        &o,
        "unknown repository",
        "HUB-001",
        &["org/missing", "no repository"],
    );
    let o = run(&["inspect", REPO, "--revision", "v9"], &[]);
    error_line(
        &o,
        "unknown revision",
        "HUB-001",
        &["org/sharded-nvfp4a16@v9", "no such revision"],
    );
    let o = run(&["inspect", &format!("{REPO}@v9"), "--revision", "v8"], &[]);
    error_line(&o, "two revisions", "ARG-001", &["once"]);
    let o = run(&["validate", "org/missing"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("[HUB-001]"), "{}", stdout(&o));

    // A gated repository: refused without its token, served with it, and
    // the token is never shown.
    let token = "hf_secret_token_123";
    hub.set_faults(Faults {
        gated: Some(token.into()),
        ..Faults::default()
    });
    let o = run(&["inspect", REPO], &[]);
    error_line(&o, "gated without a token", "HUB-001", &["HF_TOKEN"]);
    let o = run(&["inspect", REPO], &[("HF_TOKEN", token)]);
    ok(&o, "gated with its token");
    assert!(!stdout(&o).contains(token) && !String::from_utf8_lossy(&o.stderr).contains(token));

    // A checksum that does not match: refused, no blob and no partial file
    // kept, no output written.
    let shard = "model-00001-of-00002.safetensors";
    hub.set_faults(Faults {
        wrong_sha: Some(shard.into()),
        ..Faults::default()
    });
    let o = run(&["dequantize", REPO, "-o", o_arg, "--backend", "cpu"], &[]);
    error_line(
        &o,
        "wrong checksum",
        "HUB-002",
        &[shard, "SHA-256", &hub.sha(shard)],
    );
    let blobs = cache.join("models--org--sharded-nvfp4a16/blobs");
    let kept: Vec<String> = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&hub.sha(shard)))
        .collect();
    assert!(kept.is_empty(), "{kept:?}");
    assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none());

    // Offline with nothing cached.
    let o = cli(
        &hub,
        &tmp.path().join("empty"),
        &["inspect", REPO],
        &[("HF_HUB_OFFLINE", "1")],
    );
    error_line(
        &o,
        "offline, nothing cached",
        "HUB-001",
        &["HF_HUB_OFFLINE"],
    );
}

/// `model`'s tensors split into `n` shards (by name, so some scales sit
/// in another shard than their packs) with an index, beside its configs.
fn split(model: &Path, n: usize, dir: &Path) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    let tensors = read_tensors(&model.join("model.safetensors"));
    let names: Vec<&String> = tensors.keys().collect();
    let per = names.len().div_ceil(n);
    let mut map = serde_json::Map::new();
    let mut shards = Vec::new();
    for (i, chunk) in names.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        let (mut header, mut data) = (serde_json::Map::new(), Vec::new());
        for name in chunk {
            let (dtype, shape, bytes) = &tensors[*name];
            header.insert((*name).clone(), serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()]}));
            data.extend_from_slice(bytes);
            map.insert((*name).clone(), serde_json::json!(file));
        }
        std::fs::write(
            dir.join(&file),
            raw_safetensors(&serde_json::Value::Object(header), &data),
        )
        .unwrap();
        shards.push(file);
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    for side in ["config.json", "recipe.yaml"] {
        std::fs::copy(model.join(side), dir.join(side)).unwrap();
    }
    shards
}

#[test]
fn hub_delete_downloaded_holds_two_shards_and_keeps_what_it_found() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("four");
    let shards = split(&fixtures().join("mixtral-w4a16/model"), 4, &src);
    let local = tmp.path().join("local");
    let o = Command::new(bin())
        .args([
            "dequantize",
            src.to_str().unwrap(),
            "-o",
            local.to_str().unwrap(),
            "--backend",
            "cpu",
            "--quiet",
        ])
        .output()
        .unwrap();
    ok(&o, "local dequantize of four shards");
    let cache = tmp.path().join("cache");
    let repo = "org/four";
    let hub = MockHub::serve(
        repo,
        &src,
        Faults {
            watch: Some(cache.clone()),
            ..Faults::default()
        },
    );

    // The third shard is in the cache already, as Python leaves it.
    let folder = cache.join("models--org--four");
    let found = &shards[2];
    let bytes = std::fs::read(src.join(found)).unwrap();
    std::fs::create_dir_all(folder.join("blobs")).unwrap();
    std::fs::create_dir_all(folder.join("snapshots").join(&hub.commit)).unwrap();
    std::fs::write(folder.join("blobs").join(sha256_hex(&bytes)), &bytes).unwrap();
    std::os::unix::fs::symlink(
        Path::new("../../blobs").join(sha256_hex(&bytes)),
        folder.join("snapshots").join(&hub.commit).join(found),
    )
    .unwrap();

    let out = tmp.path().join("hub");
    let o = cli(
        &hub,
        &cache,
        &[
            "dequantize",
            repo,
            "-o",
            out.to_str().unwrap(),
            "--backend",
            "cpu",
            "--quiet",
            "--delete-downloaded",
            "--json",
        ],
        &[],
    );
    ok(&o, "dequantize --delete-downloaded");
    assert_eq!(
        files(&out),
        files(&local),
        "the same files as the local run"
    );
    let summary: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let fetched = &summary["fetched"];
    let list = |k: &str| -> Vec<String> {
        fetched[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let others: Vec<String> = shards.iter().filter(|s| *s != found).cloned().collect();
    assert_eq!(list("downloaded"), others);
    assert_eq!(list("reused"), std::slice::from_ref(found));
    assert_eq!(list("deleted"), others);

    // At most two shards at once: by the run's own count, and measured on
    // disk at every request the mock answered.
    let mut sizes: Vec<u64> = shards
        .iter()
        .map(|s| std::fs::metadata(src.join(s)).unwrap().len())
        .collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let two = sizes[0] + sizes[1];
    let peak = fetched["peak_bytes"].as_u64().unwrap();
    assert!(
        peak >= sizes[3] && peak <= two,
        "held {peak} bytes of shards at once; two are {two}"
    );
    let measured = hub.peak() - bytes.len() as u64;
    assert!(
        measured <= two + 64 * 1024,
        "the cache held {measured} bytes besides the shard it had; two shards are {two}"
    );
    assert!(
        folder_bytes(&cache) < bytes.len() as u64 + 64 * 1024,
        "downloads left in the cache"
    );

    // What was there before is untouched; what the run downloaded is gone.
    let snapshot = folder.join("snapshots").join(&hub.commit);
    assert_eq!(std::fs::read(snapshot.join(found)).unwrap(), bytes);
    for s in &others {
        assert!(
            std::fs::symlink_metadata(snapshot.join(s)).is_err(),
            "{s} still linked"
        );
        let blob = folder.join("blobs").join(hub.sha(s));
        assert!(!blob.exists(), "{s}'s blob kept");
    }
    assert!(
        snapshot.join("config.json").is_file(),
        "small files stay cached"
    );
}

#[test]
fn hub_runs_refused_by_planning_download_no_shard() {
    // A config that is not JSON: refused from the headers' reads alone.
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("broken");
    crate::common::copy_dir(&model(), &src);
    std::fs::write(src.join("config.json"), b"{ not json").unwrap();
    let hub = MockHub::serve(REPO, &src, Faults::default());
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("out");
    let o = cli(
        &hub,
        &cache,
        &["dequantize", REPO, "-o", out.to_str().unwrap()],
        &[],
    );
    error_line(&o, "a broken config", "CFG-001", &["config.json"]);
    let whole: Vec<String> = hub
        .log()
        .iter()
        .filter(|h| {
            h.path.starts_with("/cdn/") && h.range.as_ref().is_none_or(|r| r.ends_with('-'))
        })
        .map(|h| h.path.clone())
        .collect();
    assert!(
        whole.is_empty(),
        "shards downloaded for a run that planning refused: {whole:?}"
    );
    assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none());
}

/// Hostile servers are hostile input: a redirect loop, a redirect to
/// another scheme, a `Content-Length` that promises more than comes, a
/// shard whose header length is absurd, an index naming a file the
/// repository lacks and one naming a file outside it are each one error
/// line with a rule id; nothing is written outside the cache and the
/// output, and nothing panics.
#[test]
fn hub_hostile_servers_are_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let shard = "model-00001-of-00002.safetensors";
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let check = |hub: &MockHub, what: &str, args: &[&str], rule: &str, names: &[&str]| {
        let cache = tmp.path().join(format!("cache-{}", what.replace(' ', "-")));
        let out = tmp.path().join(format!("out-{}", what.replace(' ', "-")));
        let args: Vec<&str> = args
            .iter()
            .map(|a| {
                if *a == "OUT" {
                    out.to_str().unwrap()
                } else {
                    a
                }
            })
            .collect();
        let o = cli(hub, &cache, &args, &[]);
        let line = error_line(&o, what, rule, names);
        assert!(
            !out.exists() || std::fs::read_dir(&out).unwrap().next().is_none(),
            "{what}: {line}"
        );
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "{what}: wrote outside"
        );
    };
    let dequantize = [
        "dequantize",
        REPO,
        "-o",
        "OUT",
        "--backend",
        "cpu",
        "--quiet",
    ];
    let serve = |dir: &Path, faults: Faults| MockHub::serve(REPO, dir, faults);

    let hub = serve(&model(), Faults::default());
    let resolve = format!("/{REPO}/resolve/main/{shard}");
    hub.set_faults(Faults {
        redirect_to: Some(resolve),
        ..Faults::default()
    });
    check(
        &hub,
        "redirect loop",
        &["inspect", REPO],
        "HUB-001",
        &["redirects"],
    );
    hub.set_faults(Faults {
        redirect_to: Some(format!("file://{}", outside.join("x").display())),
        ..Faults::default()
    });
    check(
        &hub,
        "file redirect",
        &["inspect", REPO],
        "HUB-001",
        &["file://"],
    );
    hub.set_faults(Faults {
        long_length: Some(shard.into()),
        ..Faults::default()
    });
    check(&hub, "lying length", &dequantize, "HUB-001", &[shard]);

    // A shard that says its header is 2^60 bytes long.
    let absurd = tmp.path().join("absurd");
    copy_dir(&model(), &absurd);
    let mut bytes = std::fs::read(absurd.join(shard)).unwrap();
    bytes[..8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    std::fs::write(absurd.join(shard), bytes).unwrap();
    let hub = serve(&absurd, Faults::default());
    check(
        &hub,
        "absurd header",
        &["inspect", REPO],
        "ST-001",
        &[shard],
    );

    // An index that names a file the repository does not have.
    let gone = tmp.path().join("gone");
    copy_dir(&model(), &gone);
    std::fs::remove_file(gone.join(shard)).unwrap();
    let hub = serve(&gone, Faults::default());
    check(
        &hub,
        "missing file",
        &["inspect", REPO],
        "ST-002",
        &[shard, "does not exist"],
    );

    // An index that names a file outside the repository.
    let escape = tmp.path().join("escape");
    copy_dir(&model(), &escape);
    let index = escape.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index)
        .unwrap()
        .replace(shard, "../outside/x.safetensors");
    std::fs::write(&index, text).unwrap();
    let hub = serve(&escape, Faults::default());
    check(
        &hub,
        "escaping index",
        &dequantize,
        "ST-002",
        &["../outside/x.safetensors"],
    );
}

/// `--shards` jobs on a Hub id (a fan-out across machines) each download
/// only their own shards whole, read a companion stored in another shard
/// by a range request for just its bytes, and with `merge-index` write
/// what the local run writes.
#[test]
fn hub_shards_jobs_download_only_their_own_shards() {
    let tmp = tempfile::tempdir().unwrap();
    // Split in five, the third shard's last pack has its scale in the
    // fourth: the first job's companion in the second job's shard.
    let src = tmp.path().join("five");
    let shards = split(&fixtures().join("mixtral-w4a16/model"), 5, &src);
    let local = tmp.path().join("local");
    let o = Command::new(bin())
        .args([
            "dequantize",
            src.to_str().unwrap(),
            "-o",
            local.to_str().unwrap(),
        ])
        .args(["--backend", "cpu", "--quiet"])
        .output()
        .unwrap();
    ok(&o, "local dequantize of five shards");
    let repo = "org/five";
    let hub = MockHub::serve(repo, &src, Faults::default());
    let out = tmp.path().join("fanned");
    for (job, mine) in [(0, &shards[..3]), (1, &shards[3..])] {
        // Each job on its own machine: its own cache.
        let cache = tmp.path().join(format!("cache-{job}"));
        let before = hub.log().len();
        let list = mine.join(",");
        let args = [
            "dequantize",
            repo,
            "-o",
            out.to_str().unwrap(),
            "--shards",
            &list,
        ];
        let o = cli(
            &hub,
            &cache,
            &[&args[..], &["--backend", "cpu", "--quiet"]].concat(),
            &[],
        );
        ok(&o, &format!("job {job}"));
        let hits = hub.log()[before..].to_vec();
        let cdn = |f: &String| -> Vec<&crate::common::hub::Hit> {
            hits.iter()
                .filter(|h| h.method == "GET" && h.path.ends_with(&hub.sha(f)))
                .collect()
        };
        for f in &shards {
            let whole = cdn(f).iter().any(|h| h.range.is_none());
            assert_eq!(
                whole,
                mine.contains(f),
                "job {job}: {f} downloaded whole: {whole}"
            );
        }
        // Planning reads headers by range; a companion is a range too.
        let other_bytes: usize = shards
            .iter()
            .filter(|f| !mine.contains(f))
            .flat_map(cdn)
            .map(|h| h.sent)
            .sum();
        let other_size: u64 = shards
            .iter()
            .filter(|f| !mine.contains(f))
            .map(|f| std::fs::metadata(src.join(f)).unwrap().len())
            .sum();
        assert!(
            (other_bytes as u64) < other_size,
            "job {job} read {other_bytes} bytes of others' {other_size}"
        );
    }
    let o = Command::new(bin())
        .args(["merge-index", out.to_str().unwrap()])
        .output()
        .unwrap();
    ok(&o, "merge-index");
    assert_eq!(
        files(&out),
        files(&local),
        "the fanned-out Hub jobs and merge-index"
    );
}

/// A Hub run tells how far its downloads are: `on_download` a few times a
/// second while shards come in slowly, and every progress report, up to
/// every byte of the shards the cache lacked. (Run in a child process of
/// this test binary, whose environment alone points at the mock.)
#[test]
fn hub_runs_report_their_downloads() {
    if let Ok(endpoint) = std::env::var("WGPU_DEQUANT_TEST_CHILD_ENDPOINT") {
        return downloads_reported(&endpoint);
    }
    let tmp = tempfile::tempdir().unwrap();
    let hub = MockHub::serve(
        REPO,
        &model(),
        Faults {
            slow: Some(std::time::Duration::from_millis(60)),
            ..Faults::default()
        },
    );
    let o = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hub::hub_runs_report_their_downloads",
            "--nocapture",
        ])
        .env("WGPU_DEQUANT_TEST_CHILD_ENDPOINT", &hub.endpoint)
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HUB_CACHE", tmp.path().join("cache"))
        .env("HF_HOME", tmp.path().join("home"))
        .env("WGPU_DEQUANT_TEST_CHILD_OUT", tmp.path().join("out"))
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .output()
        .unwrap();
    ok(&o, "the child test");
    assert!(stdout(&o).contains("1 passed"), "{}", stdout(&o));
}

/// The child's side of [`hub_runs_report_their_downloads`].
fn downloads_reported(_endpoint: &str) {
    use std::sync::Mutex;
    use wgpu_dequant::{BackendChoice, Dequantize, Download};
    let out = PathBuf::from(std::env::var("WGPU_DEQUANT_TEST_CHILD_OUT").unwrap());
    let shards: u64 = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    .iter()
    .map(|f| std::fs::metadata(model().join(f)).unwrap().len())
    .sum();
    let ticks: Mutex<Vec<Download>> = Mutex::new(Vec::new());
    let mut reported: Vec<Download> = Vec::new();
    Dequantize::new()
        .backend(BackendChoice::Cpu)
        .on_download(|d| ticks.lock().unwrap().push(*d))
        .on_progress(|p| reported.extend(p.download))
        .run(REPO, &out)
        .unwrap();
    let ticks = ticks.into_inner().unwrap();
    assert!(ticks.len() >= 2, "{ticks:?}");
    for d in ticks.iter().chain(&reported) {
        assert_eq!(d.total_bytes, shards, "{d:?}");
    }
    let done: Vec<u64> = ticks.iter().map(|d| d.done_bytes).collect();
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "{done:?}");
    assert!(done[0] < shards, "{done:?}");
    assert_eq!(
        reported.last().map(|d| d.done_bytes),
        Some(shards),
        "{reported:?}"
    );
}

/// A path that can only be meant as a path (`./`, `../`, `/`, `~`, a file
/// extension, or a first component that exists here) and names nothing is
/// a local error, and the Hub is never asked; an id with no local match
/// that the Hub cannot serve says both in one line.
#[test]
fn paths_that_name_nothing_fail_here_without_a_request() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = MockHub::serve(REPO, &model(), Faults::default());
    let cache = tmp.path().join("cache");
    std::fs::create_dir(tmp.path().join("gguf-q4_k-llama")).unwrap();
    let here = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = command(&hub, &cache, args, env);
        cmd.current_dir(tmp.path()).output().unwrap()
    };
    for path in [
        "gguf-q4_k-llama/modle",
        "./org/name",
        "../org/name",
        "/nonexistent/org/name",
        "~/org/name",
        "org/model.safetensors",
        "org/model.gguf",
    ] {
        let o = here(&["inspect", path], &[]);
        error_line(&o, path, "IO-001", &[path, "no such file or directory"]);
        let o = here(&["dequantize", path, "-o", "out"], &[]);
        error_line(&o, path, "IO-001", &[path, "no such file or directory"]);
        assert!(
            !tmp.path().join("out").exists(),
            "{path}: an output was made"
        );
    }
    let o = here(&["inspect", "gguf-q4_k-llama/modle"], &[]);
    error_line(&o, "mistyped", "IO-001", &["gguf-q4_k-llama exists here"]);
    assert!(hub.log().is_empty(), "the Hub was asked: {:?}", hub.log());

    // An id the Hub does not have, and one it cannot be asked about.
    let o = here(&["inspect", "org/missing"], &[]);
    error_line(
        &o,
        "unknown id",
        "HUB-001",
        &[
            "org/missing",
            "no such local path; the Hub: no repository org/missing",
        ],
    );
    let o = here(
        &["inspect", "org/missing"],
        &[("HF_ENDPOINT", "http://127.0.0.1:1")],
    );
    error_line(
        &o,
        "unreachable Hub",
        "IO-001",
        &["org/missing", "no such local path; the Hub: cannot reach"],
    );
}

//! What large checkpoints rely on: the CPU backend's table-driven rows give
//! the reference bytes; `dequantize --shards` runs fill one directory that
//! `merge-index` completes into exactly what one plain run writes, and refuse
//! what would clobber or mix outputs; progress events account for every byte
//! written; the CLI's progress output off a terminal; releasing input pages
//! never changes what the checkpoint reads.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::cli::{error_line, ok, read_json, run, stderr, stdout};
use crate::common::jobs::{for_random_jobs, normal, GridSizes, RandomJob};
use crate::common::producer::ScaleScheme;
use crate::common::{
    copy_dir, ct_config, fixtures, read_dir_tensors, read_tensors, snapshot, write_checkpoint,
    write_json, Rng, Tensor, SHARD1, SHARD2,
};
use serde_json::Value;
use wgpu_dequant::backend::{way, Backend, Cpu, Kernels, Way};
use wgpu_dequant::Checkpoint;

const INDEX_FILE: &str = "model.safetensors.index.json";
use wgpu_dequant::job::{
    DecodeJob, Dims, Fields, Grid, InBlocks, Plane, ValueKind, Values, ZeroPoint,
};
use wgpu_dequant::writer::{OutputDir, Summary, PART_SUFFIX};
use wgpu_dequant::{DtypeChoice, Names, OutDtype, Plan};

// ---------------------------------------------------------------------------
// 1. CPU table path = reference
// ---------------------------------------------------------------------------

/// Group sizes on both sides of 2^bits for every width (2 … 256 codes).
const TABLE_SIZES: GridSizes = GridSizes {
    groups: &[1, 2, 3, 5, 8, 16, 24, 32, 64, 128, 256, 512],
    block_rows: &[1, 2, 5, 16],
    block_cols: &[1, 4, 7, 8, 32, 64, 256],
};

/// Rows `rows` of `job` the reference way: every element through
/// `DecodeJob::value`, rounded by `OutDtype::encode`.
fn reference(job: &DecodeJob<'_>, rows: Range<usize>) -> Vec<u8> {
    let (cols, size) = (job.dims.cols, job.out.size());
    let mut out = vec![0u8; rows.len() * cols * size];
    for (k, flat) in rows.enumerate() {
        let (slice, row) = (flat / job.dims.rows, flat % job.dims.rows);
        for col in 0..cols {
            let at = (k * cols + col) * size;
            job.out
                .encode(job.value(slice, row, col), &mut out[at..at + size]);
        }
    }
    out
}

/// Asserts that the CPU backend decodes all of `job`'s rows, and `ranges`
/// random ranges of them (a task may start anywhere), as the reference does.
fn assert_cpu_equals_reference(
    cpu: Cpu,
    job: &DecodeJob<'_>,
    rng: &mut Rng,
    ranges: usize,
    what: &str,
) {
    let total = job.dims.total_rows();
    let want = reference(job, 0..total);
    let got = cpu_rows(cpu, job, 0..total);
    assert!(
        got == want,
        "{what}: {}",
        first_difference(&got, &want, job, 0)
    );
    let row_bytes = job.dims.cols * job.out.size();
    for _ in 0..ranges {
        let a = rng.below(total as u64 + 1) as usize;
        let b = a + rng.below((total - a) as u64 + 1) as usize;
        let skew = rng.below(64) as usize;
        let got = cpu_rows_at(cpu, job, a..b, skew);
        let want = &want[a * row_bytes..b * row_bytes];
        assert!(
            got == want,
            "rows {a}..{b}, {skew} bytes past a line: {what}: {}",
            first_difference(&got, want, job, a)
        );
    }
}

/// Whether the CPU backend decodes `job` through its tables in place.
fn takes_table_path(job: &DecodeJob<'_>) -> bool {
    way(job) == Way::Rows
}

/// Labels of the variants a table-path job exercises.
fn variants(job: &DecodeJob<'_>) -> Vec<String> {
    let bits = job.codes.bits;
    let mut v = vec![format!("bits {bits} {}", job.out)];
    let group_cols = job
        .scale
        .as_ref()
        .map_or(job.dims.cols, |s| s.grid.col_div.min(job.dims.cols));
    if job.scale.is_some() && group_cols < job.code_values.len() {
        v.push("group smaller than 2^bits".into());
    }
    if job.scale.is_some() && group_cols > job.code_values.len() {
        v.push("group larger than 2^bits".into());
    }
    if !job.dims.cols.is_multiple_of(2) {
        v.push("odd columns".into());
    }
    if job.dims.slices > 1 {
        v.push("3-D".into());
    }
    if job.g_idx.is_some() {
        v.push("g_idx".into());
    }
    if job.codes.per_word != 0 {
        v.push("padded".into());
    }
    if !job.codes.lane_bits.is_multiple_of(32) {
        v.push("byte-granular rows".into());
    }
    match &job.zero {
        Some(ZeroPoint::Packed { .. }) => v.push("packed zero".into()),
        Some(ZeroPoint::Plain(_)) => v.push("plain zero".into()),
        Some(ZeroPoint::PackedAlongCols { .. }) => v.push("zero along columns".into()),
        None => {}
    }
    if job.codes.high_first {
        v.push("high-first bytes".into());
    }
    if job.codes.parts.is_some() {
        v.push("lanes in parts".into());
    }
    if job.post_scale.is_some() {
        v.push("post scale".into());
    }
    match &job.scale {
        Some(s) if matches!(s.kind, ValueKind::Table(_)) => v.push("Table scale".into()),
        Some(s) if matches!(s.kind, ValueKind::Nested(_)) => v.push("Nested scale".into()),
        Some(s) if s.grid.row_div > 1 => v.push("block scale".into()),
        None => v.push("no scale".into()),
        _ => {}
    }
    // The 4-bit inner loop: eight codes per u32 load, bf16/f16 and f32.
    if bits == 4 && job.g_idx.is_none() && group_cols.is_multiple_of(8) && group_cols >= 8 {
        v.push(format!("4-bit words, {}-byte outputs", job.out.size()));
    }
    v
}

/// Decodes `rows` with the CPU backend into a buffer first filled with
/// garbage, so rows it never writes show.
fn cpu_rows(cpu: Cpu, job: &DecodeJob<'_>, rows: Range<usize>) -> Vec<u8> {
    cpu_rows_at(cpu, job, rows, 0)
}

/// [`cpu_rows`] decoded into a buffer `skew` bytes past a cache line:
/// kernels that align their stores to lines must give the same bytes at
/// any address.
fn cpu_rows_at(cpu: Cpu, job: &DecodeJob<'_>, rows: Range<usize>, skew: usize) -> Vec<u8> {
    let len = rows.len() * job.dims.cols * job.out.size();
    let mut buf = vec![0xA5u8; len + 128];
    let at = (64 - buf.as_ptr() as usize % 64) % 64 + skew % 64;
    cpu.decode_rows(job, rows.clone(), &mut buf[at..at + len])
        .unwrap_or_else(|e| panic!("decode_rows {rows:?}: {e}"));
    buf[at..at + len].to_vec()
}

fn first_difference(got: &[u8], want: &[u8], job: &DecodeJob<'_>, start_row: usize) -> String {
    let size = job.out.size();
    let cols = job.dims.cols;
    let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    let (row, col) = (start_row + i / size / cols, i / size % cols);
    let elem = |b: &[u8]| b[i / size * size..i / size * size + size].to_vec();
    format!(
        "first difference at row {row} (slice {}, row {}) col {col}: got {:02x?}, reference {:02x?}",
        row / job.dims.rows,
        row % job.dims.rows,
        elem(got),
        elem(want)
    )
}

#[test]
fn cpu_table_rows_equal_reference_on_random_jobs() {
    table_rows_equal_reference_on_random_jobs(Cpu::new());
}

/// [`cpu_table_rows_equal_reference_on_random_jobs`] on `cpu`'s kernels.
fn table_rows_equal_reference_on_random_jobs(cpu: Cpu) {
    // Variants of all jobs, and of those the tables decode.
    let seen: RefCell<BTreeMap<String, usize>> = RefCell::default();
    let seen_table: RefCell<BTreeMap<String, usize>> = RefCell::default();
    let table_jobs = Cell::new(0);
    let jobs = 640;
    // Wide rows too: 8-bit codes need 512 columns per group for tables.
    for_random_jobs(jobs, &[300, 1100, 2100], |d, rng| {
        let mut r = match rng.below(8) {
            0 => RandomJob::in_parts(rng, d, &TABLE_SIZES),
            _ => RandomJob::new(rng, d, &TABLE_SIZES),
        };
        // Straight rows here; transposed and strided jobs, and zero points
        // along columns, are the tests of 1b and 1c below.
        r.transposed = false;
        if matches!(r.zero, crate::common::jobs::ZeroSpec::AlongCols { .. }) {
            r.zero = crate::common::jobs::ZeroSpec::None;
        }
        let job = r.job();
        let table = takes_table_path(&job);
        table_jobs.set(table_jobs.get() + usize::from(table));
        for v in variants(&job) {
            if table {
                *seen_table.borrow_mut().entry(v.clone()).or_default() += 1;
            }
            *seen.borrow_mut().entry(v).or_default() += 1;
        }
        assert_cpu_equals_reference(cpu, &job, rng, 3, &r.describe());
    });
    let (seen, seen_table, table_jobs) =
        (seen.into_inner(), seen_table.into_inner(), table_jobs.get());
    // The comparison only means something if the tables were used, in
    // every variant; groups narrower than 2^bits never pay for tables (but
    // are decoded element-wise, and checked all the same).
    let mut needed: Vec<String> = Vec::new();
    for bits in 1..=8 {
        for out in [OutDtype::Bf16, OutDtype::F16, OutDtype::F32] {
            needed.push(format!("bits {bits} {out}"));
        }
    }
    needed.extend(
        [
            "group larger than 2^bits",
            "odd columns",
            "3-D",
            "g_idx",
            "padded",
            "byte-granular rows",
            "packed zero",
            "plain zero",
            "Table scale",
            "block scale",
            "no scale",
            "4-bit words, 2-byte outputs",
            "4-bit words, 4-byte outputs",
        ]
        .map(String::from),
    );
    let missing: Vec<&String> = needed
        .iter()
        .filter(|n| !seen_table.contains_key(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "{table_jobs} of {jobs} random jobs took the table path, but none of them covered {missing:?} (seen: {seen_table:?})"
    );
    assert!(
        seen.contains_key("group smaller than 2^bits"),
        "no random job had groups narrower than 2^bits: {seen:?}"
    );
    assert!(
        seen.contains_key("lanes in parts"),
        "no random job had its lanes in parts: {seen:?}"
    );
}

/// Tables on one side of the eligibility line and element-wise decoding on
/// the other give the same bytes as the reference: the same codes and
/// scales, decoded with more and fewer columns per scale group.
#[test]
fn cpu_rows_equal_reference_across_the_table_threshold() {
    let mut rng = Rng::new(0xC0FF_EE00_1234_5678);
    for bits in 1..=8u32 {
        let n = 1usize << bits;
        for cols in [2 * n - 1, 2 * n, 2 * n + 1, 4 * n + 3] {
            for out in [OutDtype::Bf16, OutDtype::F16, OutDtype::F32] {
                let d = Dims {
                    slices: 2,
                    rows: 5,
                    cols,
                };
                // Per-row scales (one group): tables exactly when cols ≥ 2^(bits+1).
                let mut r = RandomJob::new(
                    &mut rng,
                    d,
                    &GridSizes {
                        groups: &[1],
                        block_rows: &[1],
                        block_cols: &[1],
                    },
                );
                r.bits = bits;
                r.per_word = 0;
                r.padded = false;
                r.lane_bits = (cols * bits as usize).div_ceil(32) as u64 * 32;
                r.slice_bits = d.rows as u64 * r.lane_bits;
                r.codes = (0..(d.slices as u64 * r.slice_bits).div_ceil(8) as usize + 4)
                    .map(|_| rng.next() as u8)
                    .collect();
                r.code_values = (0..n).map(|c| c as f32 - (n / 2) as f32).collect();
                r.scale = Some((
                    wgpu_dequant::job::Grid {
                        row_div: 1,
                        col_div: cols,
                        row_stride: 1,
                        slice_stride: d.rows,
                    },
                    ValueKind::F32,
                ));
                r.scale_bytes = (0..d.total_rows())
                    .flat_map(|i| (0.375f32 + i as f32 * 1.25).to_le_bytes())
                    .collect();
                r.zero = crate::common::jobs::ZeroSpec::None;
                r.zero_bytes.clear();
                r.g_idx = None;
                r.interleaved = false;
                r.transposed = false;
                r.out = out;
                let job = r.job();
                assert_eq!(takes_table_path(&job), cols >= 2 * n, "{}", r.describe());
                let total = d.total_rows();
                let want = reference(&job, 0..total);
                let got = cpu_rows(Cpu::new(), &job, 0..total);
                assert!(
                    got == want,
                    "{}: {}",
                    r.describe(),
                    first_difference(&got, &want, &job, 0)
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// CLI helpers
// ---------------------------------------------------------------------------

fn sharded_model() -> PathBuf {
    fixtures().join("sharded-nvfp4a16/model")
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `dequantize INPUT -o OUT --backend cpu [EXTRA..]`.
fn dequantize_cpu(input: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "dequantize",
        path_str(input),
        "-o",
        path_str(out),
        "--backend",
        "cpu",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

/// `dequantize INPUT -o OUT --backend cpu --shards LIST`.
fn shards_run(input: &Path, out: &Path, list: &[&str]) -> Output {
    dequantize_cpu(input, out, &["--shards", &list.join(",")])
}

fn merge_index(dir: &Path) -> Output {
    run(&["merge-index", path_str(dir)])
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    snapshot(dir).into_iter().map(|(n, _)| n).collect()
}

/// Asserts `dir` holds exactly what `want` (a snapshot) holds, file by file.
fn assert_same_files(dir: &Path, want: &[(String, Vec<u8>)], what: &str) {
    let got = snapshot(dir);
    let got_names: Vec<&String> = got.iter().map(|(n, _)| n).collect();
    let want_names: Vec<&String> = want.iter().map(|(n, _)| n).collect();
    assert_eq!(got_names, want_names, "{what}: file set");
    for ((name, g), (_, w)) in got.iter().zip(want) {
        if g != w {
            let text = |b: &[u8]| {
                if name.ends_with(".json") {
                    String::from_utf8_lossy(b).into_owned()
                } else {
                    format!("{} bytes", b.len())
                }
            };
            panic!(
                "{what}: {name} differs:\n--- got\n{}\n--- want\n{}",
                text(g),
                text(w)
            );
        }
    }
}

/// No index parts, staging folders or other subdirectories are left in `dir`.
fn assert_no_leftovers(dir: &Path, what: &str) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(PART_SUFFIX), "{what}: {name} left behind");
        assert!(
            !name.starts_with(".wgpu-dequant") || crate::common::is_record(&name),
            "{what}: staging {name} left behind"
        );
        assert!(
            !e.path().is_dir() || crate::common::is_record(&name),
            "{what}: directory {name} left behind"
        );
    }
}

/// The name of the partial index a run whose first shard is `shard` writes.
fn part_name(shard: &str) -> String {
    format!("{}{PART_SUFFIX}", shard.trim_end_matches(".safetensors"))
}

// ---------------------------------------------------------------------------
// 2. --shards + merge-index
// ---------------------------------------------------------------------------

#[test]
fn shard_runs_then_merge_index_equal_one_plain_run() {
    let model = sharded_model();
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("plain");
    ok(&dequantize_cpu(&model, &plain, &[]), "plain dequantize");
    let want = snapshot(&plain);
    for n in [SHARD1, SHARD2, INDEX_FILE, "config.json", "README.md"] {
        assert!(
            want.iter().any(|(name, _)| name == n),
            "test setup: the plain run wrote no {n}: {:?}",
            names(&plain)
        );
    }
    let plain_file = |n: &str| want.iter().find(|(name, _)| name == n).unwrap().1.clone();

    // The second shard first, as another machine might finish first.
    let out = tmp.path().join("out");
    ok(&shards_run(&model, &out, &[SHARD2]), "--shards second");
    assert_eq!(
        names(&out),
        {
            let mut v = vec![
                "config.json".to_string(),
                SHARD2.to_string(),
                part_name(SHARD2),
                "README.md".to_string(),
            ];
            v.sort();
            v
        },
        "after --shards {SHARD2}"
    );
    assert!(
        std::fs::read(out.join(SHARD2)).unwrap() == plain_file(SHARD2),
        "--shards {SHARD2} wrote a different {SHARD2} than the plain run"
    );
    let before = snapshot(&out);
    let line = error_line(
        &merge_index(&out),
        "merge-index with a shard missing",
        "ST-002",
        &[SHARD1],
    );
    assert!(
        !line.contains(SHARD2),
        "merge-index names the shard that is there as missing: {line}"
    );
    assert_same_files(&out, &before, "a failed merge-index");

    // A path to the shard, as a shell completes it, names it too.
    let first = model.join(SHARD1);
    ok(
        &shards_run(&model, &out, &[path_str(&first)]),
        "--shards first, as a path",
    );
    ok(&merge_index(&out), "merge-index");
    assert_no_leftovers(&out, "merge-index");
    assert_same_files(
        &out,
        &want,
        "two --shards runs + merge-index vs one plain run",
    );
    let again = merge_index(&out);
    ok(&again, "merge-index a second time");
    assert!(
        stderr(&again).contains("already merged"),
        "{}",
        stderr(&again)
    );
    assert_same_files(&out, &want, "a second merge-index");

    // Both shards in one run, in either order.
    for (k, list) in [[SHARD1, SHARD2], [SHARD2, SHARD1]].iter().enumerate() {
        let out = tmp.path().join(format!("both-{k}"));
        ok(&shards_run(&model, &out, list), "--shards with both");
        assert!(
            names(&out).contains(&part_name(list[0])),
            "--shards {list:?} wrote no {}: {:?}",
            part_name(list[0]),
            names(&out)
        );
        ok(&merge_index(&out), "merge-index after one run of both");
        assert_no_leftovers(&out, "merge-index");
        assert_same_files(
            &out,
            &want,
            &format!("--shards {} + merge-index vs one plain run", list.join(",")),
        );
    }
}

// ---------------------------------------------------------------------------
// 3. Refusals: a shard already written, a name that is no shard
// ---------------------------------------------------------------------------

#[test]
fn shard_already_in_output_is_refused_and_left_alone() {
    let model = sharded_model();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    ok(&shards_run(&model, &out, &[SHARD1]), "--shards first");
    let before = snapshot(&out);

    let again = shards_run(&model, &out, &[SHARD1]);
    error_line(&again, "--shards first again", "OUT-001", &[SHARD1]);
    assert_same_files(&out, &before, "a refused second run of the same shard");

    // A run that would add a new shard but also rewrite an existing one
    // writes neither.
    let both = shards_run(&model, &out, &[SHARD2, SHARD1]);
    error_line(&both, "--shards second,first", "OUT-001", &[SHARD1]);
    assert_same_files(&out, &before, "a refused run of a new and an old shard");

    // After the merge too.
    ok(&shards_run(&model, &out, &[SHARD2]), "--shards second");
    ok(&merge_index(&out), "merge-index");
    let merged = snapshot(&out);
    let late = shards_run(&model, &out, &[SHARD2]);
    error_line(
        &late,
        "--shards second after merge-index",
        "OUT-001",
        &[SHARD2],
    );
    assert_same_files(&out, &merged, "a refused run after merge-index");
}

#[test]
fn shard_name_that_is_no_shard_creates_nothing() {
    let model = sharded_model();
    let tmp = tempfile::tempdir().unwrap();

    // Missing output directory (and parents): none of it may appear.
    let out = tmp.path().join("a/b/out");
    for list in [
        &["nope.safetensors"][..],
        &[SHARD1, "nope.safetensors"],
        &["model.safetensors.index.json"],
        &["config.json"],
    ] {
        let o = shards_run(&model, &out, list);
        error_line(
            &o,
            &format!("--shards {list:?}"),
            "ARG-001",
            &[list[list.len() - 1]],
        );
        assert!(
            !tmp.path().join("a").exists(),
            "--shards {list:?} failed but left {} behind",
            tmp.path().join("a").display()
        );
    }

    // An existing empty directory stays, and stays empty.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = shards_run(&model, &empty, &["nope.safetensors"]);
    error_line(
        &o,
        "--shards nope into an empty directory",
        "ARG-001",
        &["nope.safetensors"],
    );
    assert!(empty.is_dir(), "the existing output directory was removed");
    assert_eq!(
        names(&empty),
        Vec::<String>::new(),
        "left in an empty directory"
    );

    // A directory other runs wrote to is left as it was.
    let shared = tmp.path().join("shared");
    ok(&shards_run(&model, &shared, &[SHARD1]), "--shards first");
    let before = snapshot(&shared);
    let o = shards_run(&model, &shared, &["nope.safetensors"]);
    error_line(
        &o,
        "--shards nope into a shared directory",
        "ARG-001",
        &["nope.safetensors"],
    );
    assert_same_files(&shared, &before, "a refused --shards name");
}

// ---------------------------------------------------------------------------
// 4. merge-index refusals
// ---------------------------------------------------------------------------

/// A copy of the sharded fixture with its shards renamed (same tensors, a
/// different checkpoint as far as shard names go).
fn renamed_copy(to: &Path) -> [String; 2] {
    copy_dir(&sharded_model(), to);
    let new = [
        "other-00001-of-00002.safetensors",
        "other-00002-of-00002.safetensors",
    ];
    for (old, new) in [SHARD1, SHARD2].iter().zip(new) {
        std::fs::rename(to.join(old), to.join(new)).unwrap();
    }
    let mut index = read_json(&to.join(INDEX_FILE));
    for (_, file) in index["weight_map"].as_object_mut().unwrap() {
        let f = file.as_str().unwrap();
        *file = Value::from(if f == SHARD1 { new[0] } else { new[1] });
    }
    write_json(&to.join(INDEX_FILE), &index);
    new.map(String::from)
}

#[test]
fn merge_index_refuses_parts_of_different_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("other");
    let [_, other2] = renamed_copy(&other);
    let out = tmp.path().join("out");
    ok(
        &shards_run(&sharded_model(), &out, &[SHARD1]),
        "--shards first",
    );
    ok(
        &shards_run(&other, &out, &[&other2]),
        "--shards of the other checkpoint",
    );
    let before = snapshot(&out);
    let line = error_line(
        &merge_index(&out),
        "merge-index of two checkpoints' parts",
        "ST-002",
        &[],
    );
    assert!(
        line.contains(&part_name(SHARD1)) || line.contains(&part_name(&other2)),
        "the error names neither part: {line}"
    );
    assert_same_files(&out, &before, "a refused merge-index");
    assert!(!out.join(INDEX_FILE).exists());
}

#[test]
fn merge_index_refuses_a_tensor_mapped_by_two_parts() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    ok(
        &shards_run(&sharded_model(), &out, &[SHARD1]),
        "--shards first",
    );
    ok(
        &shards_run(&sharded_model(), &out, &[SHARD2]),
        "--shards second",
    );
    // The second part also claims a tensor of the first.
    let first = read_json(&out.join(part_name(SHARD1)));
    let taken = first["weight_map"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let path2 = out.join(part_name(SHARD2));
    let mut second = read_json(&path2);
    second["weight_map"][&taken] = Value::from(SHARD2);
    write_json(&path2, &second);
    let before = snapshot(&out);
    error_line(
        &merge_index(&out),
        "merge-index with a tensor in two parts",
        "ST-002",
        &[&taken],
    );
    assert_same_files(&out, &before, "a refused merge-index");
}

#[test]
fn shards_that_are_not_the_inputs_are_refused() {
    let model = sharded_model();
    let tmp = tempfile::tempdir().unwrap();
    // The same file name elsewhere is not this checkpoint's shard.
    let elsewhere = tmp.path().join("copy");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::copy(model.join(SHARD1), elsewhere.join(SHARD1)).unwrap();
    for arg in [
        path_str(&elsewhere.join(SHARD1)).to_string(),
        "model-00003-of-00002.safetensors".to_string(),
        path_str(&model.join("config.json")).to_string(),
    ] {
        let out = tmp.path().join("out");
        let o = shards_run(&model, &out, &[&arg]);
        error_line(&o, &format!("--shards {arg}"), "ARG-001", &[&arg]);
        assert_eq!(o.status.code(), Some(2));
        assert!(!out.exists(), "--shards {arg} left {}", out.display());
    }
}

#[test]
fn merge_index_without_parts_fails_unless_already_merged() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    error_line(
        &merge_index(&empty),
        "merge-index of an empty directory",
        "ST-002",
        &[PART_SUFFIX],
    );
    assert_eq!(names(&empty), Vec::<String>::new());

    // A finished plain output has an index but no parts.
    let plain = tmp.path().join("plain");
    ok(
        &dequantize_cpu(&sharded_model(), &plain, &[]),
        "plain dequantize",
    );
    let before = snapshot(&plain);
    let o = merge_index(&plain);
    ok(&o, "merge-index of a plain output");
    assert!(stderr(&o).contains("already merged"), "{}", stderr(&o));
    assert_same_files(&plain, &before, "merge-index of a plain output");

    let missing = tmp.path().join("missing");
    let o = merge_index(&missing);
    error_line(
        &o,
        "merge-index of a missing directory",
        "IO-001",
        &["missing"],
    );
    assert!(!missing.exists());
}

// ---------------------------------------------------------------------------
// 5. Progress events (library)
// ---------------------------------------------------------------------------

/// What `progress` heard: (tensor, bytes, done), in order.
type Events = Vec<(String, u64, bool)>;

/// Checks that `events` account for every tensor of the `shards` files in
/// `out` (and nothing else): their bytes sum to each tensor's size, and each
/// ends with its one `done`.
fn check_progress(out: &Path, shards: &[&str], events: &Events, summary: &Summary, what: &str) {
    let mut written: BTreeMap<String, u64> = BTreeMap::new();
    for s in shards {
        let path = out.join(s);
        assert!(path.is_file(), "{what}: {s} was not written");
        for (name, (_, _, data)) in read_tensors(&path) {
            written.insert(name, data.len() as u64);
        }
    }
    let total: u64 = written.values().sum();
    let heard: u64 = events.iter().map(|e| e.1).sum();
    assert_eq!(
        heard, total,
        "{what}: progress bytes vs tensor bytes in the shards written"
    );
    assert_eq!(summary.tensor_bytes, total, "{what}: Summary::tensor_bytes");
    for (name, &size) in &written {
        let mine: Vec<&(String, u64, bool)> = events.iter().filter(|e| &e.0 == name).collect();
        assert!(!mine.is_empty(), "{what}: no progress for {name}");
        let dones = mine.iter().filter(|e| e.2).count();
        assert_eq!(
            dones, 1,
            "{what}: {name} reported done {dones} times: {mine:?}"
        );
        assert!(
            mine.last().unwrap().2,
            "{what}: progress for {name} after its done: {mine:?}"
        );
        assert_eq!(
            mine.iter().map(|e| e.1).sum::<u64>(),
            size,
            "{what}: progress bytes of {name}"
        );
    }
    let strangers: BTreeSet<&String> = events
        .iter()
        .map(|e| &e.0)
        .filter(|n| !written.contains_key(*n))
        .collect();
    assert!(
        strangers.is_empty(),
        "{what}: progress for tensors not written: {strangers:?}"
    );
    let done_total = events.iter().filter(|e| e.2).count();
    assert_eq!(
        done_total,
        written.len(),
        "{what}: done events vs tensors written"
    );
}

#[test]
fn progress_accounts_for_every_byte_of_the_shards_written() {
    let ckpt = Checkpoint::open(sharded_model()).unwrap();
    let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let shared = tmp.path().join("shared");
    for (k, list) in [&[SHARD2][..], &[SHARD1], &[SHARD1, SHARD2]]
        .iter()
        .enumerate()
    {
        for out in [tmp.path().join(format!("alone-{k}")), shared.clone()] {
            if out == shared && k == 2 {
                continue; // both shards are in `shared` already
            }
            let mut events: Events = Vec::new();
            let summary = OutputDir::for_shards(&out, list.iter().map(|s| s.to_string()).collect())
                .unwrap()
                .write(&plan, &Cpu::new(), |p| {
                    events.push((p.tensor.to_string(), p.bytes, p.done))
                })
                .unwrap_or_else(|e| panic!("--shards {list:?} into {}: {e}", out.display()));
            check_progress(&out, list, &events, &summary, &format!("--shards {list:?}"));
            if out != shared {
                for s in [SHARD1, SHARD2] {
                    assert_eq!(
                        out.join(s).exists(),
                        list.contains(&s),
                        "--shards {list:?}: {s}"
                    );
                }
            }
        }
    }
    // Every tensor of the plan, once, through the plain writer.
    let out = tmp.path().join("plain");
    let mut events: Events = Vec::new();
    let summary = OutputDir::create(&out)
        .unwrap()
        .write(&plan, &Cpu::new(), |p| {
            events.push((p.tensor.to_string(), p.bytes, p.done))
        })
        .unwrap();
    check_progress(&out, &[SHARD1, SHARD2], &events, &summary, "plain write");
    assert_eq!(
        events.iter().filter(|e| e.2).count(),
        plan.outputs.len(),
        "done events vs the plan's outputs"
    );
}

/// A tensor decoded in several chunks reports each chunk, and `done` once,
/// with its last.
#[test]
fn progress_of_a_tensor_larger_than_one_chunk() {
    let (rows, cols) = (4400usize, 4096usize);
    let mut rng = Rng::new(0xB16_C0DE);
    let words: Vec<u32> = (0..rows * cols / 8).map(|_| rng.next() as u32).collect();
    let scales: Vec<f32> = (0..rows).map(|r| 0.5 + (r % 7) as f32 * 0.125).collect();
    let module = "model.layers.0.mlp.down_proj";
    let tensors = [
        Tensor::u32_words(format!("{module}.weight_packed"), &[rows, cols / 8], &words),
        Tensor::bf16(format!("{module}.weight_scale"), &[rows, 1], &scales),
        Tensor::i64(
            format!("{module}.weight_shape"),
            &[2],
            &[rows as i64, cols as i64],
        ),
        Tensor::bf16("model.norm.weight", &[cols], &vec![1.0; cols]),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    write_checkpoint(
        &input,
        &tensors,
        ct_config(
            "pack-quantized",
            ScaleScheme::Channel.weights(4, "int", true, false),
            "0.19.0",
        ),
    );
    let ckpt = Checkpoint::open(&input).unwrap();
    let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
    let out = tmp.path().join("out");
    let mut events: Events = Vec::new();
    let summary = OutputDir::create(&out)
        .unwrap()
        .write(&plan, &Cpu::new(), |p| {
            events.push((p.tensor.to_string(), p.bytes, p.done))
        })
        .unwrap();
    check_progress(
        &out,
        &["model.safetensors"],
        &events,
        &summary,
        "large tensor",
    );
    let weight = format!("{module}.weight");
    let chunks = events.iter().filter(|e| e.0 == weight).count();
    assert!(
        chunks >= 2,
        "test setup: {weight} ({} bytes) was written in {chunks} chunk(s)",
        rows * cols * 2
    );
}

// ---------------------------------------------------------------------------
// 6. CLI progress output off a terminal
// ---------------------------------------------------------------------------

#[test]
fn cli_progress_off_a_terminal_and_quiet() {
    let model = sharded_model();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("loud");
    // output() pipes stderr: not a terminal.
    let o = dequantize_cpu(&model, &out, &[]);
    ok(&o, "dequantize");
    let err = stderr(&o);
    assert!(
        !err.contains('\r') && !err.contains('\x1b'),
        "terminal control characters on a pipe: {err:?}"
    );
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines.len() >= 2,
        "expected a backend line and a wrote line:\n{err}"
    );
    assert!(
        lines[0].contains(path_str(&model)) && lines[0].contains("backend cpu"),
        "first line does not name the input and the backend: {}",
        lines[0]
    );
    let last = lines[lines.len() - 1];
    assert!(
        last.starts_with("wrote ") && last.contains(path_str(&out)),
        "last line is not the wrote line: {last}"
    );
    for l in &lines[1..lines.len() - 1] {
        assert!(l.starts_with("progress: "), "unexpected stderr line: {l}");
    }
    assert_eq!(stdout(&o), "", "dequantize printed to stdout");

    for (k, extra) in [&["--quiet"][..], &["-q"], &["--quiet", "--shards", SHARD1]]
        .iter()
        .enumerate()
    {
        let out = tmp.path().join(format!("quiet-{k}"));
        let o = dequantize_cpu(&model, &out, extra);
        ok(&o, &format!("dequantize {extra:?}"));
        assert_eq!(stderr(&o), "", "dequantize {extra:?} printed to stderr");
        assert_eq!(stdout(&o), "", "dequantize {extra:?} printed to stdout");
        assert!(
            out.join(SHARD1).is_file(),
            "dequantize {extra:?} wrote no {SHARD1}"
        );
    }
    // Quiet changes nothing written.
    assert_same_files(
        &tmp.path().join("quiet-0"),
        &snapshot(&out),
        "--quiet vs not",
    );
}

// ---------------------------------------------------------------------------
// 7. Releasing input pages
// ---------------------------------------------------------------------------

#[test]
fn release_leaves_bytes_readable_and_unchanged() {
    let model = sharded_model();
    let ckpt = Checkpoint::open(&model).unwrap();
    // What the files hold, read without the checkpoint.
    let mut stored = BTreeMap::new();
    for s in [SHARD1, SHARD2] {
        stored.extend(read_tensors(&model.join(s)));
    }
    let names: Vec<String> = ckpt.names().into_iter().map(String::from).collect();
    assert_eq!(names.len(), stored.len(), "test setup: tensor count");
    let mut rng = Rng::new(42);
    for name in &names {
        let t = ckpt.get(name).unwrap();
        let before = t.stored().to_vec();
        assert!(
            before == stored[name].2,
            "{name}: read differs from the file"
        );
        ckpt.release(t.stored());
        assert!(t.stored() == &before[..], "{name}: changed after release");
        // Ranges that start and end inside pages, shared with neighbours.
        if t.stored().len() > 2 {
            let a = rng.below(t.stored().len() as u64 / 2) as usize;
            let b = t.stored().len() - rng.below(t.stored().len() as u64 / 2) as usize;
            ckpt.release(&t.stored()[a..b]);
            assert!(
                t.stored() == &before[..],
                "{name}: changed after releasing {a}..{b}"
            );
        }
        ckpt.release(t.stored());
    }
    // Bytes outside every shard are left alone.
    let own = vec![7u8; 1 << 16];
    ckpt.release(&own);
    assert!(
        own.iter().all(|&b| b == 7),
        "release changed bytes outside the checkpoint"
    );

    // Everything reads back as stored, and decodes as a fresh checkpoint does.
    for name in &names {
        let t = ckpt.get(name).unwrap();
        assert!(
            t.stored() == &stored[name].2[..],
            "{name}: differs after all releases"
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
    wgpu_dequant::writer::write(&plan, &Cpu::new(), &tmp.path().join("released"), |_| {}).unwrap();
    let fresh = tmp.path().join("fresh");
    ok(&dequantize_cpu(&model, &fresh, &[]), "dequantize");
    assert!(
        read_dir_tensors(&tmp.path().join("released")) == read_dir_tensors(&fresh),
        "decoding a released checkpoint differs from a fresh one"
    );
}

// ---------------------------------------------------------------------------
// --max-shard-size
// ---------------------------------------------------------------------------

/// Safetensors files in `dir` with the number of tensors each holds.
fn shard_counts(dir: &Path) -> BTreeMap<String, usize> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, read_tensors(&p).len())
        })
        .collect()
}

/// Files of at most SIZE bytes (a tensor alone may be larger), named as
/// Hugging Face names them, with an index, holding the plain run's tensors.
#[test]
fn max_shard_size_splits_within_the_limit() {
    let model = sharded_model();
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("plain");
    ok(&dequantize_cpu(&model, &plain, &[]), "plain dequantize");
    let want = read_dir_tensors(&plain);
    const LIMIT: u64 = 300_000;
    let out = tmp.path().join("split");
    ok(
        &dequantize_cpu(&model, &out, &["--max-shard-size", "300KB"]),
        "--max-shard-size 300KB",
    );
    assert!(
        read_dir_tensors(&out) == want,
        "the split holds other tensors"
    );
    let files = shard_counts(&out);
    let n = files.len();
    let names: Vec<String> = (1..=n)
        .map(|i| format!("model-{i:05}-of-{n:05}.safetensors"))
        .collect();
    assert_eq!(files.keys().cloned().collect::<Vec<_>>(), names);
    let (mut shared, mut alone_over) = (0, 0);
    for (name, count) in &files {
        let len = std::fs::metadata(out.join(name)).unwrap().len();
        if len > LIMIT {
            assert_eq!(
                *count, 1,
                "{name}: {len} bytes over the limit with {count} tensors"
            );
            alone_over += 1;
        }
        shared += usize::from(*count > 1);
    }
    assert!(shared > 0 && alone_over > 0, "test setup: {files:?}");
    let index = read_json(&out.join(INDEX_FILE));
    let map = index["weight_map"].as_object().unwrap();
    assert_eq!(map.len(), want.len());
    for (tensor, file) in map {
        let file = file.as_str().unwrap();
        assert!(
            read_tensors(&out.join(file)).contains_key(tensor),
            "index maps {tensor} to {file}, which does not hold it"
        );
    }
    let total: u64 = want.values().map(|t| t.2.len() as u64).sum();
    assert_eq!(index["metadata"]["total_size"].as_u64(), Some(total));

    // A limit above the whole output: one file, model.safetensors, no index.
    let one = tmp.path().join("one");
    ok(
        &dequantize_cpu(&model, &one, &["--max-shard-size", "1GB"]),
        "1GB",
    );
    let files = shard_counts(&one);
    // Files never mix input shards: one per input shard.
    assert_eq!(files.len(), 2, "{files:?}");
    let tiny = tmp.path().join("tiny");
    ok(
        &dequantize_cpu(&model, &tiny, &["--max-shard-size", "1"]),
        "1 byte",
    );
    assert_eq!(shard_counts(&tiny).len(), want.len(), "a file per tensor");
}

/// A single-file checkpoint under a roomy limit stays one model.safetensors.
#[test]
fn max_shard_size_above_the_output_writes_one_file() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let model = fixtures().join("w4a16-g128/model");
    ok(
        &dequantize_cpu(&model, &out, &["--max-shard-size", "5GB"]),
        "5GB",
    );
    assert_eq!(
        names(&out),
        ["README.md", "config.json", "model.safetensors"]
    );
    let o = dequantize_cpu(
        &model,
        &tmp.path().join("bad"),
        &["--max-shard-size", "5XB"],
    );
    assert_eq!(o.status.code(), Some(2), "a bad SIZE is a usage error");
}

/// `--shards` runs with `--max-shard-size` on two machines, then
/// merge-index: the same files as one run with the same limit.
#[test]
fn max_shard_size_fans_out_and_merges() {
    let model = sharded_model();
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("plain");
    let limit = ["--max-shard-size", "400KB"];
    ok(&dequantize_cpu(&model, &plain, &limit), "plain split");
    let want = snapshot(&plain);
    assert!(
        shard_counts(&plain).len() > 2,
        "test setup: {:?}",
        names(&plain)
    );
    let out = tmp.path().join("out");
    for shard in [SHARD2, SHARD1] {
        let mut args = vec!["--shards", shard];
        args.extend_from_slice(&limit);
        ok(&dequantize_cpu(&model, &out, &args), shard);
    }
    ok(&merge_index(&out), "merge-index");
    assert_same_files(&out, &want, "split --shards runs + merge-index");
}

// ---------------------------------------------------------------------------
// 1b. CPU tiles (transposed and strided jobs) = reference
// ---------------------------------------------------------------------------

/// Grids whose entries span enough elements for the tiles' tables, and
/// some that do not (decoded element by element).
const TILE_SIZES: GridSizes = GridSizes {
    groups: &[3, 8, 32, 64, 128],
    block_rows: &[1, 16, 32, 128],
    block_cols: &[1, 7, 32, 64],
};

/// Whether the CPU backend decodes `job`, packed along its inputs, through
/// tables: in rows gathered from the words, or in tiles.
fn takes_tiles(job: &DecodeJob<'_>) -> bool {
    matches!(way(job), Way::PackedRows | Way::Tiles)
}

/// Rewrites `r`'s codes as GPTQ stores them: lane = stored row, 32 bits
/// wide, its words a whole row of words apart (`[words, rows]` int32).
fn strided(r: &mut RandomJob, rng: &mut Rng) -> u64 {
    let d = r.dims;
    let words = if r.per_word != 0 {
        d.cols.div_ceil(r.per_word as usize)
    } else {
        (d.cols * r.bits as usize).div_ceil(32)
    };
    r.lane_bits = 32;
    r.slice_bits = (words * d.rows) as u64 * 32;
    r.codes = (0..d.slices * words * d.rows * 4 + 4)
        .map(|_| rng.next() as u8)
        .collect();
    32 * d.rows as u64
}

#[test]
fn cpu_tiles_equal_reference_on_random_transposed_and_strided_jobs() {
    tiles_equal_reference_on_random_transposed_and_strided_jobs(Cpu::new());
}

/// [`cpu_tiles_equal_reference_on_random_transposed_and_strided_jobs`] on `cpu`'s kernels.
fn tiles_equal_reference_on_random_transposed_and_strided_jobs(cpu: Cpu) {
    let seen: RefCell<BTreeMap<String, usize>> = RefCell::default();
    let tiled = Cell::new(0);
    let jobs = 400;
    for_random_jobs(jobs, &[40, 300, 700], |d, rng| {
        let mut r = RandomJob::new(rng, d, &TILE_SIZES);
        // Mostly 4-bit codes, the tiles' fast reads.
        if rng.below(3) != 0 {
            r.bits = 4;
            r.per_word = if r.padded { 8 } else { 0 };
            r.interleaved = r.interleaved || r.padded && rng.below(2) == 0;
            r.code_values = (0..16).map(|c| c as f32 - 8.0).collect();
            let words = d.cols.div_ceil(8);
            r.lane_bits = if r.padded || rng.below(2) == 0 {
                words as u64 * 32
            } else {
                (d.cols * 4).div_ceil(8) as u64 * 8
            };
            r.slice_bits = d.rows as u64 * r.lane_bits;
            r.codes = (0..(d.slices as u64 * r.slice_bits).div_ceil(8) as usize + 4)
                .map(|_| rng.next() as u8)
                .collect();
            // Packed zero points now read 4-bit fields: room for them (lanes
            // laid out for narrower fields overlap, which changes nothing).
            let more = d.slices * d.rows * d.cols;
            r.zero_bytes.extend((0..more).map(|_| rng.next() as u8));
        }
        // Activation order as GPTQ writes it: each group's columns
        // scattered over the row.
        if let Some((g, _)) = &r.scale {
            if g.row_div == 1 && g.row_stride > 1 && g.col_div < d.cols && rng.below(3) == 0 {
                let mut groups: Vec<u32> = (0..d.cols).map(|j| (j / g.col_div) as u32).collect();
                for k in (1..groups.len()).rev() {
                    groups.swap(k, rng.below(k as u64 + 1) as usize);
                }
                r.g_idx = Some(groups);
            }
        }
        let is_strided = !r.interleaved && rng.below(3) != 0;
        let word_bits = if is_strided {
            r.transposed = false;
            strided(&mut r, rng)
        } else {
            r.transposed = true;
            32
        };
        let mut job = r.job();
        job.codes.word_bits = word_bits;
        let tiles = takes_tiles(&job);
        tiled.set(tiled.get() + usize::from(tiles));
        let mut v = vec![if is_strided { "strided" } else { "transposed" }.to_string()];
        v.push(format!("bits {} {}", job.codes.bits, job.out));
        if job.codes.interleaved {
            v.push("interleaved".into());
        }
        if job.g_idx.is_some() {
            v.push("g_idx".into());
        }
        if job.dims.slices > 1 {
            v.push("3-D".into());
        }
        match &job.zero {
            Some(ZeroPoint::Packed { .. }) => v.push("packed zero".into()),
            Some(ZeroPoint::Plain(_)) => v.push("plain zero".into()),
            Some(ZeroPoint::PackedAlongCols { .. }) => v.push("zero along columns".into()),
            None => {}
        }
        if !job.dims.rows.is_multiple_of(8) || !job.dims.cols.is_multiple_of(8) {
            v.push("partial words".into());
        }
        if tiles {
            for v in v {
                *seen.borrow_mut().entry(v).or_default() += 1;
            }
        }
        assert_cpu_equals_reference(cpu, &job, rng, 2, &r.describe());
    });
    let seen = seen.into_inner();
    let needed = [
        "strided",
        "transposed",
        "bits 4 bf16",
        "bits 4 f32",
        "bits 4 f16",
        "interleaved",
        "g_idx",
        "3-D",
        "plain zero",
        "packed zero",
        "zero along columns",
        "partial words",
    ];
    let missing: Vec<&str> = needed
        .into_iter()
        .filter(|n| !seen.contains_key(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {jobs} random jobs took the tiles, none of them {missing:?} (seen: {seen:?})",
        tiled.get()
    );
}

// ---------------------------------------------------------------------------
// 1c. CPU rows packed along the inputs (GPTQ, AutoAWQ) = reference
// ---------------------------------------------------------------------------

/// A GPTQ-packed (strided words) or AutoAWQ-packed (transposed, interleaved)
/// 4-bit job of `out × inputs` in groups of `group` inputs, f16 scales, with
/// or without zero points, and its storage.
fn packed_job<'a>(
    awq: bool,
    (out, inputs, group): (usize, usize, usize),
    storage: &'a (Vec<u8>, Vec<u8>, Vec<u8>),
    zero: bool,
    dtype: OutDtype,
) -> DecodeJob<'a> {
    use wgpu_dequant::job::{Fields, Grid, Values};
    let (codes, scales, zeros) = storage;
    let groups = inputs.div_ceil(group);
    let f16 = |data: &'a [u8], grid| Values {
        data: data.into(),
        kind: ValueKind::F16,
        grid,
    };
    if awq {
        // Stored [in, out/8] words; scales [G, out]; zero points [G, out/8].
        let stored = Dims {
            slices: 1,
            rows: inputs,
            cols: out,
        };
        let lane = out.div_ceil(8) as u64 * 32;
        let grid = Grid {
            row_div: group,
            col_div: 1,
            row_stride: out,
            slice_stride: 0,
        };
        let job = DecodeJob::new(
            stored,
            Fields::padded(codes.as_slice(), 4, lane).interleaved(),
            (0..16).map(|c| c as f32 - 8.0).collect::<Vec<f32>>(),
            dtype,
        )
        .with_scale(f16(scales, grid));
        let job = if zero {
            job.with_zero(ZeroPoint::PackedAlongCols {
                fields: Fields::padded(zeros.as_slice(), 4, lane).interleaved(),
            })
        } else {
            job
        };
        return job.transpose();
    }
    // [in/8, out] words, a whole row of words apart; scales and integer
    // zero points [out, G], as the GPTQ planner rearranges them.
    let grid = Grid {
        row_div: 1,
        col_div: group,
        row_stride: groups,
        slice_stride: 0,
    };
    let dims = Dims {
        slices: 1,
        rows: out,
        cols: inputs,
    };
    let codes = Fields::dense(codes.as_slice(), 4, 32).with_word_bits(32 * out as u64);
    let job = DecodeJob::new(
        dims,
        codes,
        (0..16).map(|c| c as f32).collect::<Vec<f32>>(),
        dtype,
    )
    .with_scale(f16(scales, grid));
    if zero {
        job.with_zero(ZeroPoint::Plain(Values {
            data: zeros.as_slice().into(),
            kind: ValueKind::I32,
            grid,
        }))
    } else {
        job
    }
}

/// GPTQ's words of `bits`-bit codes, [out, in] with zero points: integer
/// ones per group ([`packed_job`]'s geometry), or packed fields of codes.
fn gptq_words_job<'a>(
    bits: u32,
    (out, inputs, group): (usize, usize, usize),
    storage: &'a (Vec<u8>, Vec<u8>, Vec<u8>),
    packed_zero: bool,
    dtype: OutDtype,
) -> DecodeJob<'a> {
    use wgpu_dequant::job::{Fields, Grid, Values};
    let (codes, scales, zeros) = storage;
    let groups = inputs.div_ceil(group);
    let grid = Grid {
        row_div: 1,
        col_div: group,
        row_stride: groups,
        slice_stride: 0,
    };
    let dims = Dims {
        slices: 1,
        rows: out,
        cols: inputs,
    };
    let codes = Fields::dense(codes.as_slice(), bits, 32).with_word_bits(32 * out as u64);
    let job = DecodeJob::new(
        dims,
        codes,
        (0..1u32 << bits).map(|c| c as f32).collect::<Vec<f32>>(),
        dtype,
    )
    .with_scale(Values {
        data: scales.as_slice().into(),
        kind: ValueKind::F16,
        grid,
    });
    if packed_zero {
        // GPTQ's qzeros: lane = the scale's column group, field = output row.
        let lane = (out as u64 * bits as u64).next_multiple_of(32);
        job.with_zero(ZeroPoint::Packed {
            fields: Fields::dense(zeros.as_slice(), bits, lane),
        })
    } else {
        job.with_zero(ZeroPoint::Plain(Values {
            data: zeros.as_slice().into(),
            kind: ValueKind::I32,
            grid,
        }))
    }
}

/// Codes of 8, 4 and 2 bits in GPTQ's words with a zero point per group
/// too narrow for tables (8-bit codes in groups of 32: 256 values a
/// table), and AutoAWQ's 4-bit ones in groups of 16: their values
/// computed straight from the codes are `DecodeJob::value`'s, from band
/// edges and from the middle of a band, with every kernel set.
#[test]
fn cpu_direct_rows_with_zero_points_equal_reference() {
    let mut rng = Rng::new(0x5EED_D1EC_7000_0001);
    let bytes = |rng: &mut Rng, n: usize| (0..n).map(|_| rng.next() as u8).collect::<Vec<u8>>();
    let mut ways: BTreeMap<String, usize> = BTreeMap::new();
    for kernels in [Kernels::Widest, Kernels::Narrow, Kernels::Scalar] {
        let cpu = Cpu::with_kernels(kernels);
        let widths: [(u32, usize); 7] =
            [(8, 32), (8, 16), (8, 64), (8, 7), (4, 16), (4, 8), (2, 2)];
        for (bits, group) in widths {
            let shapes: [(usize, usize); 4] = [(48, 64), (40, 100), (96, 256), (33, 512)];
            for &(out, inputs) in &shapes {
                let groups = inputs.div_ceil(group);
                let words = (inputs * bits as usize).div_ceil(32) * out;
                let codes = bytes(&mut rng, 4 * words + 16);
                let scales: Vec<u8> = (0..groups * out)
                    .flat_map(|_| {
                        ((0x2C00u16 + rng.below(0x1000) as u16) | ((rng.below(2) as u16) << 15))
                            .to_le_bytes()
                    })
                    .collect();
                for packed_zero in [false, true] {
                    let zeros: Vec<u8> = if packed_zero {
                        bytes(
                            &mut rng,
                            groups * (out * bits as usize).div_ceil(32) * 4 + 16,
                        )
                    } else {
                        (0..groups * out)
                            .flat_map(|_| (rng.below(1 << bits) as i32).to_le_bytes())
                            .collect()
                    };
                    let storage = (codes.clone(), scales.clone(), zeros);
                    for dtype in [OutDtype::Bf16, OutDtype::F16, OutDtype::F32] {
                        let shape = (out, inputs, group.min(inputs));
                        let job = gptq_words_job(bits, shape, &storage, packed_zero, dtype);
                        let what = format!(
                            "{bits}-bit {out}x{inputs} g{group}, packed zero {packed_zero}, {dtype}, {kernels:?}"
                        );
                        let w = way(&job);
                        assert_eq!(w, Way::Direct, "{what}");
                        *ways.entry(format!("{bits}-bit {w:?}")).or_default() += 1;
                        assert_rows_equal_reference(cpu, &job, &what);
                    }
                }
            }
        }
        // AutoAWQ's transposed nibbles, groups of 16 and 8.
        let awq: [(usize, usize, usize); 3] = [(64, 128, 16), (40, 96, 8), (96, 48, 16)];
        for &(out, inputs, group) in &awq {
            let groups = inputs.div_ceil(group);
            let words = inputs.div_ceil(8) * out.next_multiple_of(8);
            let codes = bytes(&mut rng, 4 * words + 16);
            let scales: Vec<u8> = (0..groups * out.next_multiple_of(8))
                .flat_map(|_| (0x2C00u16 + rng.below(0x1000) as u16).to_le_bytes())
                .collect();
            let zeros = bytes(&mut rng, groups * out.div_ceil(8) * 4 + 16);
            let storage = (codes, scales, zeros);
            for dtype in [OutDtype::Bf16, OutDtype::F32] {
                let job = packed_job(true, (out, inputs, group), &storage, true, dtype);
                let what = format!("awq {out}x{inputs} g{group}, {dtype}, {kernels:?}");
                *ways.entry(format!("awq {:?}", way(&job))).or_default() += 1;
                assert_rows_equal_reference(cpu, &job, &what);
            }
        }
    }
    assert!(ways.keys().all(|w| !w.ends_with("Elements")), "{ways:?}");
}

/// `job`'s rows decoded by `cpu` whole, from row 1, in a short run and
/// from the middle to near the end are the reference's.
fn assert_rows_equal_reference(cpu: Cpu, job: &DecodeJob<'_>, what: &str) {
    let total = job.dims.total_rows();
    let want = reference(job, 0..total);
    let row_bytes = job.dims.cols * job.out.size();
    for (a, b) in [(0, total), (1, total), (8, total.min(72)), (33, total - 3)] {
        let (a, b) = (a.min(total), b.max(a.min(total)));
        let got = cpu_rows(cpu, job, a..b);
        let want = &want[a * row_bytes..b * row_bytes];
        assert!(
            got == want,
            "{what}, rows {a}..{b}: {}",
            first_difference(&got, want, job, a)
        );
    }
}

/// The vector kernels decode bands of 32 rows (AutoAWQ) or 4 (GPTQ) of
/// 32-input blocks straight from the words; other shapes are gathered into
/// straight rows first. Both, at band edges and from the middle of a band
/// (where a task starts), give the reference's bytes.
#[test]
fn cpu_packed_rows_equal_reference_on_gptq_and_autoawq_jobs() {
    packed_rows_equal_reference_on_gptq_and_autoawq_jobs(Cpu::new());
}

/// [`cpu_packed_rows_equal_reference_on_gptq_and_autoawq_jobs`] on `cpu`'s kernels.
fn packed_rows_equal_reference_on_gptq_and_autoawq_jobs(cpu: Cpu) {
    let mut rng = Rng::new(0x5EED_0A11_7A57_0001);
    let shapes: [(usize, usize, usize); 8] = [
        (32, 32, 32),
        (64, 128, 64),
        (96, 256, 128),
        (160, 96, 96),
        (128, 64, 4096),
        (40, 128, 128),
        (200, 144, 48),
        (36, 100, 50),
    ];
    for awq in [false, true] {
        for &(out, inputs, group) in &shapes {
            let groups = inputs.div_ceil(group);
            let words = inputs.div_ceil(8) * out.next_multiple_of(8);
            let bytes =
                |rng: &mut Rng, n: usize| (0..n).map(|_| rng.next() as u8).collect::<Vec<u8>>();
            let codes = bytes(&mut rng, 4 * words + 16);
            // Moderate finite f16 scales, signed.
            let scales: Vec<u8> = (0..groups * out.next_multiple_of(8))
                .flat_map(|_| {
                    ((0x2C00u16 + rng.below(0x1000) as u16) | ((rng.below(2) as u16) << 15))
                        .to_le_bytes()
                })
                .collect();
            let zeros: Vec<u8> = if awq {
                bytes(&mut rng, groups * out.div_ceil(8) * 4 + 16)
            } else {
                (0..groups * out)
                    .flat_map(|_| (rng.below(16) as i32).to_le_bytes())
                    .collect()
            };
            let storage = (codes, scales, zeros);
            for zero in [false, true] {
                for dtype in [OutDtype::Bf16, OutDtype::F16, OutDtype::F32] {
                    let job =
                        packed_job(awq, (out, inputs, group.min(inputs)), &storage, zero, dtype);
                    let what = format!("awq {awq}, {out}x{inputs} g{group}, zero {zero}, {dtype}");
                    assert_eq!(way(&job), Way::PackedRows, "{what}");
                    let total = job.dims.total_rows();
                    let want = reference(&job, 0..total);
                    let row_bytes = job.dims.cols * job.out.size();
                    for (a, b) in [(0, total), (1, total), (8, total.min(72)), (33, total - 3)] {
                        let (a, b) = (a.min(total), b.max(a.min(total)));
                        let got = cpu_rows(cpu, &job, a..b);
                        let want = &want[a * row_bytes..b * row_bytes];
                        assert!(
                            got == want,
                            "{what}, rows {a}..{b}: {}",
                            first_difference(&got, want, &job, a)
                        );
                    }
                }
            }
        }
    }
}

/// Outputs of one call large enough to go around the caches (8 MiB and
/// more, into a buffer on a cache line) hold the bytes the same rows give
/// decoded in small calls, which write through the caches; so does a large
/// call into a buffer 16 bytes past a line: straight int4 rows, GPTQ's and
/// AutoAWQ's packs, in groups of 128 and of 24.
#[test]
fn cpu_streamed_outputs_equal_cached_ones() {
    streamed_outputs_equal_cached_ones(1024, 4096, 128);
    streamed_outputs_equal_cached_ones(712, 6000, 24);
}

fn streamed_outputs_equal_cached_ones(out: usize, inputs: usize, group: usize) {
    let mut rng = Rng::new(0x5EED_0A11_7A57_0002);
    let bytes = |rng: &mut Rng, n: usize| (0..n).map(|_| rng.next() as u8).collect::<Vec<u8>>();
    let codes = bytes(&mut rng, out * inputs / 2);
    let scales: Vec<u8> = (0..inputs / group * out)
        .flat_map(|_| (0x2C00u16 + rng.below(0x1000) as u16).to_le_bytes())
        .collect();
    let gptq_zeros: Vec<u8> = (0..inputs / group * out)
        .flat_map(|_| (rng.below(16) as i32).to_le_bytes())
        .collect();
    let awq_zeros = bytes(&mut rng, inputs / group * out / 2);
    let gptq = (codes.clone(), scales.clone(), gptq_zeros);
    let awq = (codes.clone(), scales.clone(), awq_zeros);
    let straight = |dtype| {
        let dims = Dims {
            slices: 1,
            rows: out,
            cols: inputs,
        };
        let grid = Grid {
            row_div: 1,
            col_div: group,
            row_stride: inputs / group,
            slice_stride: 0,
        };
        DecodeJob::new(
            dims,
            Fields::dense(codes.as_slice(), 4, inputs as u64 * 4),
            (0..16).map(|c| c as f32 - 8.0).collect::<Vec<f32>>(),
            dtype,
        )
        .with_scale(Values {
            data: scales.as_slice().into(),
            kind: ValueKind::F16,
            grid,
        })
    };
    let jobs = [
        ("straight int4", straight(OutDtype::Bf16)),
        (
            "gptq",
            packed_job(false, (out, inputs, group), &gptq, true, OutDtype::Bf16),
        ),
        (
            "autoawq",
            packed_job(true, (out, inputs, group), &awq, true, OutDtype::F32),
        ),
    ];
    for (what, job) in &jobs {
        let total = job.dims.total_rows();
        let what = format!("{what} {out}x{inputs} g{group}");
        assert!(
            job.out_bytes() >= 8 << 20,
            "{what}: {} bytes are not streamed",
            job.out_bytes()
        );
        let cached: Vec<u8> = (0..total)
            .step_by(64)
            .flat_map(|r| cpu_rows(Cpu::new(), job, r..(r + 64).min(total)))
            .collect();
        for skew in [0, 16] {
            let got = cpu_rows_at(Cpu::new(), job, 0..total, skew);
            assert!(
                got == cached,
                "{what}, skew {skew}: {}",
                first_difference(&got, &cached, job, 0)
            );
        }
    }
}

/// Rows smoothed by a factor per column (a rank-0 low-rank branch:
/// ModelOpt's pre-quant scale) give the reference's bytes through the
/// product tables: straight int4 rows with and without zero points, and
/// ModelOpt's INT4 AWQ bytes of two rows, in every dtype; factors include a
/// negative one, a subnormal one and ones that overflow f16.
#[test]
fn cpu_smoothed_rows_equal_reference() {
    smoothed_rows_equal_reference(Cpu::new());
}

/// [`cpu_smoothed_rows_equal_reference`] on `cpu`'s kernels.
fn smoothed_rows_equal_reference(cpu: Cpu) {
    use std::sync::Arc;
    use wgpu_dequant::job::{Fields, Grid, LowRank, Values};
    let mut rng = Rng::new(0x5EED_0A11_7A57_0002);
    for &(rows, cols, group) in &[
        (6usize, 64usize, 32usize),
        (8, 256, 128),
        (10, 96, 48),
        (4, 150, 64),
    ] {
        let groups = cols.div_ceil(group);
        let codes: Vec<u8> = (0..rows * cols / 2 + 16)
            .map(|_| rng.next() as u8)
            .collect();
        let scales: Vec<u8> = (0..rows * groups)
            .flat_map(|i| if i == 1 { 0.0f32 } else { normal(&mut rng, 4) }.to_le_bytes())
            .collect();
        let factors: Arc<[f32]> = (0..cols)
            .map(|c| match c {
                0 => -1.5,
                1 => f32::from_bits(3),
                2 => 1.0e5,
                _ => normal(&mut rng, 2),
            })
            .collect();
        let grid = Grid {
            row_div: 1,
            col_div: group,
            row_stride: groups,
            slice_stride: 2 * groups,
        };
        let int4: Vec<f32> = (0..16)
            .map(|c| if c < 8 { c } else { c - 16 } as f32)
            .collect();
        for (pairs, zero) in [(false, false), (false, true), (true, false)] {
            for dtype in [OutDtype::Bf16, OutDtype::F16, OutDtype::F32] {
                let (dims, fields) = if pairs {
                    let f = Fields::new(&codes[..], 4, 1, 4)
                        .with_word_bits(8)
                        .with_slice_bits(cols as u64 * 8);
                    (
                        Dims {
                            slices: rows / 2,
                            rows: 2,
                            cols,
                        },
                        f,
                    )
                } else {
                    (
                        Dims {
                            slices: 1,
                            rows,
                            cols,
                        },
                        Fields::dense(&codes[..], 4, cols as u64 * 4),
                    )
                };
                let grid = if pairs {
                    grid
                } else {
                    Grid {
                        slice_stride: 0,
                        ..grid
                    }
                };
                let mut job = DecodeJob::new(dims, fields, int4.clone(), dtype)
                    .with_scale(Values {
                        data: scales.as_slice().into(),
                        kind: ValueKind::F32,
                        grid,
                    })
                    .with_low_rank(LowRank {
                        period: 1,
                        row_div: 1,
                        rank: 0,
                        up: Vec::new().into(),
                        down: Vec::new().into(),
                        inv_smooth: factors.clone(),
                        smooth_first: true,
                        in_product: false,
                    });
                if zero {
                    let z = Values {
                        data: scales.as_slice().into(),
                        kind: ValueKind::F32,
                        grid,
                    };
                    job = job.with_zero(ZeroPoint::Plain(z));
                }
                let what = format!("{rows}x{cols} g{group}, pairs {pairs}, zero {zero}, {dtype}");
                let want = if pairs { Way::PackedRows } else { Way::Rows };
                assert_eq!(way(&job), want, "{what}");
                assert_cpu_equals_reference(cpu, &job, &mut rng, 4, &what);
            }
        }
    }
}

/// GPT-OSS's experts (MXFP4 packs along the inputs, an e8m0 scale per
/// output column and 32 rows): the AVX-512 blocks, whose tables are one
/// table shifted by each scale's exponent, and the SSSE3 tiles, give the
/// reference's bytes, on shapes whose blocks do not fill the tensor and
/// with scales whose tables are no shift (blocks holding one are decoded
/// the other way).
#[test]
fn cpu_mxfp4_experts_equal_reference_in_shifted_blocks_and_tiles() {
    let mut rng = Rng::new(0x6f55);
    let e2m1: Vec<f32> = (0..16).map(wgpu_dequant::numerics::e2m1).collect();
    let mut e8m0 = Box::new([0f32; 256]);
    for (b, v) in e8m0.iter_mut().enumerate() {
        *v = wgpu_dequant::numerics::e8m0(b as u8);
    }
    // (experts, stored rows = output columns, inputs = output rows)
    for (slices, outs, ins) in [(2, 128, 64), (1, 300, 96), (1, 512, 256), (3, 256, 160)] {
        let codes: Vec<u8> = (0..slices * outs * ins / 2)
            .map(|_| rng.next() as u8)
            .collect();
        for extreme in [false, true] {
            // Trained experts' scales, and now and then one whose products
            // are subnormal, overflow or NaN.
            let scales: Vec<u8> = (0..slices * outs * ins / 32)
                .map(|_| match rng.below(40) {
                    0 if extreme => [0, 1, 2, 150, 200, 253, 254, 255][rng.below(8) as usize],
                    _ => 116 + rng.below(12) as u8,
                })
                .collect();
            for out in [OutDtype::Bf16, OutDtype::F16, OutDtype::F32] {
                let grid = Grid {
                    row_div: 1,
                    col_div: 32,
                    row_stride: ins / 32,
                    slice_stride: outs * ins / 32,
                };
                let dims = Dims {
                    slices,
                    rows: ins,
                    cols: outs,
                };
                let mut fields = Fields::dense(codes.as_slice(), 4, ins as u64 * 4);
                fields.slice_bits = (outs * ins * 4) as u64;
                let scale = Values {
                    data: scales.as_slice().into(),
                    kind: ValueKind::Table(e8m0.clone()),
                    grid,
                };
                let job = DecodeJob::new(dims, fields, e2m1.clone(), out)
                    .with_scale(scale)
                    .transpose();
                assert_eq!(way(&job), Way::Tiles);
                // The widest kernels (AVX-512's or AVX2's shifted blocks),
                // and the SSSE3 ones this CPU runs without them.
                for kernels in [Kernels::Widest, Kernels::Narrow] {
                    let cpu = Cpu::with_kernels(kernels);
                    let what = format!(
                        "{slices}x{outs}x{ins} {out}, extreme scales {extreme}, {kernels:?} kernels"
                    );
                    assert_cpu_equals_reference(cpu, &job, &mut Rng::new(3), 3, &what);
                    // Blocks start on the output's lines, wherever it is.
                    let total = job.dims.total_rows();
                    let want = reference(&job, 0..total);
                    for skew in [2, 16, 48] {
                        let got = cpu_rows_at(cpu, &job, 0..total, skew);
                        assert!(got == want, "{what}, {skew} bytes past a line");
                    }
                }
            }
        }
    }
}

/// The scalar loops that other CPUs run (aarch64, wasm32) give the same
/// bytes: the random and packed-row checks again on a backend whose
/// kernels are the scalar loops (its own choice: tests running meanwhile
/// keep theirs).
#[test]
fn cpu_scalar_loops_equal_reference() {
    let scalar = Cpu::with_kernels(Kernels::Scalar);
    table_rows_equal_reference_on_random_jobs(scalar);
    tiles_equal_reference_on_random_transposed_and_strided_jobs(scalar);
    packed_rows_equal_reference_on_gptq_and_autoawq_jobs(scalar);
    smoothed_rows_equal_reference(scalar);
}

/// Codes inside blocks (GGUF's geometry, at random): the CPU's unpacked
/// rows, through tables or computed directly, are `DecodeJob::value`.
#[test]
fn cpu_blocked_fields_equal_reference_on_random_jobs() {
    let ways: RefCell<BTreeMap<String, usize>> = RefCell::default();
    for_random_jobs(400, &[40, 300, 1100], |d, rng| {
        let r = RandomJob::aimed_at_blocks(rng, d);
        let job = r.job();
        *ways
            .borrow_mut()
            .entry(format!("{:?}", way(&job)))
            .or_default() += 1;
        assert_cpu_equals_reference(Cpu::new(), &job, rng, 3, &r.describe());
    });
    let ways = ways.into_inner();
    for w in [Way::Rows, Way::Direct, Way::Elements] {
        assert!(
            ways.contains_key(&format!("{w:?}")),
            "no random blocked job went {w:?}: {ways:?}"
        );
    }
}

/// A block geometry whose planes leave the block is refused before a byte
/// is read, by both backends' checks.
#[test]
fn blocked_fields_outside_their_blocks_are_refused() {
    let data = [0u8; 64];
    let low = Plane {
        at: 4,
        bits: 4,
        span: 16,
    };
    for (bytes, bits, ok) in [(20, 4, true), (16, 4, false), (20, 8, false)] {
        let blocks = InBlocks {
            len: 32,
            bytes,
            low,
            high: None,
        };
        let codes = Fields {
            bits,
            ..Fields::in_blocks(&data[..], blocks, bytes as u64 * 8)
        };
        let d = Dims {
            slices: 1,
            rows: 1,
            cols: 32,
        };
        let job = DecodeJob::new(
            d,
            codes,
            (0..1 << bits).map(|c| c as f32).collect::<Vec<_>>(),
            OutDtype::F32,
        );
        match Cpu::new().decode(&job) {
            Ok(v) => assert!(ok && v.len() == 128, "{bytes} bytes, {bits} bits"),
            Err(e) => assert!(
                !ok && e.rule == wgpu_dequant::Rule::Argument,
                "{bytes} bytes, {bits} bits: {e}"
            ),
        }
    }
}

//! The checkpoint read piece by piece (`stream`, what the browser runs)
//! gives the files the CLI's writer gives, byte for byte, reads only what
//! it needs, and refuses what the CLI refuses with the same rule.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::common::{fixtures, gpu_test, snapshot, CASES};
use wgpu_dequant::plan::Source;
use wgpu_dequant::stream::{self, Part};
use wgpu_dequant::{dequantize, BackendChoice, Dequantize, DtypeChoice, Error, Options, OutDtype};

/// What a batch loads at most by default (`Dequantize::stream`'s doc).
const BATCH_BYTES: usize = 256 << 20;

/// A directory's files read through [`stream::Files`], counting what is read.
pub struct DirFiles {
    dir: PathBuf,
    /// Bytes read of each file.
    pub read: RefCell<BTreeMap<String, u64>>,
}

impl DirFiles {
    pub fn new(dir: &Path) -> DirFiles {
        DirFiles {
            dir: dir.to_path_buf(),
            read: RefCell::default(),
        }
    }
}

impl stream::Files for DirFiles {
    fn list(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .map(|p| {
                let len = p.metadata().unwrap().len();
                (p.file_name().unwrap().to_string_lossy().into_owned(), len)
            })
            .collect();
        v.sort();
        v
    }

    async fn read(&self, name: &str, range: Range<u64>) -> wgpu_dequant::Result<Vec<u8>> {
        let bytes = std::fs::read(self.dir.join(name)).unwrap();
        *self.read.borrow_mut().entry(name.to_string()).or_default() += range.end - range.start;
        Ok(bytes[range.start as usize..range.end as usize].to_vec())
    }
}

/// Files by name: (name, bytes), sorted.
type Snapshot = Vec<(String, Vec<u8>)>;

/// The files `Dequantize::stream` makes of `dir`, assembled: (name, bytes), sorted.
pub fn streamed(
    dir: &Path,
    dtype: DtypeChoice,
    backend: BackendChoice,
    batch: usize,
) -> Result<(Snapshot, DirFiles), Error> {
    let files = DirFiles::new(dir);
    let mut out: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut last = (0, 0);
    pollster::block_on(async {
        let emit = |name: &str, part: Part| {
            let bytes = match part {
                Part::Bytes(b) => b,
                Part::Stored { file, range } => {
                    let all = std::fs::read(dir.join(file)).unwrap();
                    all[range.start as usize..range.end as usize].to_vec()
                }
                Part::File(file) => std::fs::read(dir.join(file)).unwrap(),
            };
            out.entry(name.to_string()).or_default().extend(bytes);
        };
        let progress = |p: &wgpu_dequant::Progress<'_>| {
            let (done, total) = (p.done_bytes, p.total_bytes);
            assert!(
                done <= total && done >= last.0,
                "progress {done}/{total} after {last:?}"
            );
            last = (done, total);
        };
        let summary = Dequantize::new()
            .dtype(dtype)
            .backend(backend)
            .batch_bytes(batch)
            .on_progress(progress)
            .stream(&files, emit)
            .await?;
        assert_eq!(last.0, last.1, "progress did not reach the total");
        assert_eq!(summary.tensor_bytes, last.1);
        Ok::<_, Error>(())
    })?;
    Ok((out.into_iter().collect(), files))
}

fn cli_files(dir: &Path, dtype: DtypeChoice) -> Vec<(String, Vec<u8>)> {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    let opts = Options {
        dtype,
        backend: BackendChoice::Cpu,
    };
    dequantize(dir, &out, &opts).unwrap();
    snapshot(&out)
}

const ALL: &[&str] = &[
    "svdq-int4-g64-logical",
    "svdq-fp4-g16-packed",
    "mlx-affine-4bit-g64",
    "mlx-3bit-g64",
    "mlx-mxfp4",
    "mlx-qwen3-moe-4bit",
];

fn every_case() -> impl Iterator<Item = &'static str> {
    CASES.iter().chain(ALL).copied()
}

#[test]
fn every_fixture_streams_to_the_clis_files() {
    for case in every_case() {
        let dir = fixtures().join(case).join("model");
        for dtype in [DtypeChoice::Auto, DtypeChoice::Fixed(OutDtype::F32)] {
            let want = cli_files(&dir, dtype);
            // One batch, and a batch per tensor.
            for batch in [BATCH_BYTES, 1] {
                let (got, _) = streamed(&dir, dtype, BackendChoice::Cpu, batch)
                    .unwrap_or_else(|e| panic!("{case}: {e}"));
                let names =
                    |v: &[(String, Vec<u8>)]| v.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
                assert_eq!(names(&got), names(&want), "{case} {dtype:?}: files differ");
                assert!(got == want, "{case} {dtype:?} batch {batch}: bytes differ");
            }
        }
    }
}

#[test]
fn streaming_reads_each_byte_once_and_copies_without_reading() {
    for case in every_case() {
        let dir = fixtures().join(case).join("model");
        // One batch: a tensor two outputs read (an SVDQuant weight and the
        // bias it shifts) is read once.
        let (_, files) =
            streamed(&dir, DtypeChoice::Auto, BackendChoice::Cpu, BATCH_BYTES).unwrap();
        let read = files.read.borrow();
        let ckpt = wgpu_dequant::Checkpoint::open(&dir).unwrap();
        let plan =
            wgpu_dequant::Plan::build(&ckpt, DtypeChoice::Auto, wgpu_dequant::Names::Hub).unwrap();
        for (i, shard) in ckpt.shards.iter().enumerate() {
            let len = shard.path.metadata().unwrap().len();
            let copied: u64 = plan
                .outputs
                .iter()
                .filter_map(|o| match &o.source {
                    Source::Copy(t) if t.shard == i => Some(t.len() as u64),
                    _ => None,
                })
                .sum();
            let got = read.get(&shard.file_name).copied().unwrap_or(0);
            // The first 8 bytes and the header are read once each while opening.
            assert!(
                got <= len - copied + 8,
                "{case}: {} read {got} bytes of {len}, {copied} of them copies",
                shard.file_name
            );
        }
    }
}

#[test]
fn gpu_decoder_awaited_streams_the_cpus_files() {
    gpu_test(|adapter| {
        let _ = adapter;
        for case in every_case() {
            let dir = fixtures().join(case).join("model");
            let dtype = DtypeChoice::Fixed(OutDtype::Bf16);
            let (want, _) = streamed(&dir, dtype, BackendChoice::Cpu, BATCH_BYTES).unwrap();
            let (got, _) = streamed(&dir, dtype, BackendChoice::Gpu, BATCH_BYTES).unwrap();
            assert!(got == want, "{case}: the GPU streams other bytes");
        }
    });
}

/// GGUF files handed over piece by piece (what a browser picks): their
/// headers read as a prefix growing until it parses, each tensor's bytes
/// when its batch is decoded; the files the CLI writes of them (the
/// transformers form: weights, configs, tokenizer), byte for byte, in one
/// batch and a batch per tensor, a split model joined; in one batch every
/// stored byte is read at most once beyond the header's prefix (a batch
/// per tensor reads a stack of experts for each expert's tensor).
#[test]
fn gguf_files_stream_to_the_clis_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf");
    for case in [
        "hf-llama",
        "hf-gemma3",
        "hf-qwen3moe",
        "gguf-q8_0-qwen2",
        "gguf-types-split",
    ] {
        let dir = root.join(case).join("model");
        let dtype = DtypeChoice::Fixed(OutDtype::Bf16);
        let want = cli_files(&dir, dtype);
        for batch in [BATCH_BYTES, 1] {
            let (got, files) = streamed(&dir, dtype, BackendChoice::Cpu, batch)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            let names = |v: &[(String, Vec<u8>)]| v.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
            assert_eq!(names(&got), names(&want), "{case}: files differ");
            assert!(got == want, "{case} batch {batch}: bytes differ");
            if batch != BATCH_BYTES {
                continue;
            }
            for (file, read) in files.read.borrow().iter() {
                let len = dir.join(file).metadata().unwrap().len();
                // The header's prefix (a 64 KiB read at least) and the data once.
                assert!(
                    *read <= len + len.min(64 << 10),
                    "{case}: {file} read {read} of {len} bytes"
                );
            }
        }
    }
}

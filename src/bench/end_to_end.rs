//! `bench --e2e-gb`: `dequantize` of a generated checkpoint on disk,
//! against writing (and syncing) the same number of bytes to a file.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use super::report::Figure;
use crate::backend::BackendChoice;
use crate::error::{Error, Result, Rule};
use crate::writer::safetensors_header;
use safetensors::Dtype;

/// The generated checkpoints `bench --e2e-gb` dequantizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// 4096x8192 int4 group-128 weights in one file.
    Square,
    /// A MoE release: 256x1024 int4 group-32 experts over 8 shards, each
    /// module's scale in the next shard (as Kimi-K2-style releases split them).
    Moe,
    /// One int4 group-32 weight of 32768 columns holding all the bytes.
    OneTensor,
}

impl Shape {
    /// (tensors, rows, cols, group, shards) of about `gb` GB of bf16 output.
    fn layout(self, gb: f64) -> (usize, usize, usize, usize, usize) {
        let count = |per_tensor: usize| ((gb * 1e9 / per_tensor as f64).ceil() as usize).max(1);
        match self {
            Shape::Square => (count(4096 * 8192 * 2), 4096, 8192, 128, 1),
            Shape::Moe => (count(256 * 1024 * 2).max(8), 256, 1024, 32, 8),
            Shape::OneTensor => (1, count(32768 * 2).next_multiple_of(8), 32768, 32, 1),
        }
    }
}

/// Writes a compressed-tensors int4 checkpoint of `tensors` weights of
/// `rows × cols` in groups of `group` into `dir`: `config.json` and one
/// `model.safetensors`, or `shards` files and an index, with each module's
/// scale and shape in the shard after its codes.
pub(crate) fn write_checkpoint(
    dir: &Path,
    (tensors, rows, cols, group, shards): (usize, usize, usize, usize, usize),
) -> Result<()> {
    let io = |p: &Path, e| Error::io(p, "cannot write", e);
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let (packed_len, scale_len) = (rows * cols / 2, rows * cols / group * 2);
    let (packed_shape, scale_shape, shape_shape) = ([rows, cols / 8], [rows, cols / group], [2]);
    let file = |k: usize| {
        if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{shards:05}.safetensors", k + 1)
        }
    };
    // (name, shard, what): 0 codes, 1 scale, 2 shape.
    let mut entries = Vec::new();
    for i in 0..tensors {
        let m = format!("model.layers.{i}.mlp.down_proj");
        let k = i * shards / tensors;
        entries.push((format!("{m}.weight_packed"), k, 0));
        entries.push((format!("{m}.weight_scale"), (k + 1) % shards, 1));
        entries.push((format!("{m}.weight_shape"), (k + 1) % shards, 2));
    }
    let mut rng = fastrand::Rng::with_seed(11);
    let mut weight_map = serde_json::Map::new();
    for k in 0..shards {
        let path = dir.join(file(k));
        let mine: Vec<&(String, usize, u8)> = entries.iter().filter(|e| e.1 == k).collect();
        let header = safetensors_header(
            &path,
            mine.iter().map(|(n, _, what)| match what {
                0 => (n.as_str(), Dtype::I32, &packed_shape[..], packed_len),
                1 => (n.as_str(), Dtype::BF16, &scale_shape[..], scale_len),
                _ => (n.as_str(), Dtype::I64, &shape_shape[..], 16),
            }),
        )?;
        let mut f = std::io::BufWriter::new(File::create(&path).map_err(|e| io(&path, e))?);
        f.write_all(&header).map_err(|e| io(&path, e))?;
        let mut block = vec![0u8; packed_len.min(64 << 20)];
        for (name, _, what) in mine {
            weight_map.insert(name.clone(), file(k).into());
            match what {
                0 => {
                    let mut left = packed_len;
                    while left > 0 {
                        let n = left.min(block.len());
                        rng.fill(&mut block[..n]);
                        f.write_all(&block[..n]).map_err(|e| io(&path, e))?;
                        left -= n;
                    }
                }
                // Scales as moderate finite bf16 numbers (0x3c..).
                1 => {
                    let scales: Vec<u8> = (0..scale_len)
                        .map(|j| if j % 2 == 1 { 0x3c } else { rng.u8(..) })
                        .collect();
                    f.write_all(&scales).map_err(|e| io(&path, e))?;
                }
                _ => {
                    for v in [rows as i64, cols as i64] {
                        f.write_all(&v.to_le_bytes()).map_err(|e| io(&path, e))?;
                    }
                }
            }
        }
        f.flush().map_err(|e| io(&path, e))?;
    }
    if shards > 1 {
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        let ipath = dir.join("model.safetensors.index.json");
        std::fs::write(&ipath, index.to_string()).map_err(|e| io(&ipath, e))?;
    }
    let config = serde_json::json!({
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "version": "0.19.0",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                            "group_size": group, "symmetric": true, "dynamic": false}
            }}
        }
    });
    let cpath = dir.join("config.json");
    std::fs::write(&cpath, config.to_string()).map_err(|e| io(&cpath, e))
}

/// Writing `bytes` to a new file in `dir` and syncing it, as the writer
/// does: the end-to-end baseline.
pub(crate) fn file_write(dir: &Path, bytes: u64) -> Result<f64> {
    let path = dir.join("baseline.bin");
    let block = vec![0x5Au8; 64 << 20];
    let t = Instant::now();
    let mut f = std::io::BufWriter::with_capacity(
        1 << 20,
        File::create(&path).map_err(|e| Error::io(&path, "cannot create", e))?,
    );
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])
            .map_err(|e| Error::io(&path, "cannot write", e))?;
        left -= n as u64;
    }
    let file = f
        .into_inner()
        .map_err(|e| Error::io(&path, "cannot write", e.into_error()))?;
    file.sync_all()
        .map_err(|e| Error::io(&path, "cannot sync", e))?;
    let s = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    Ok(s)
}

/// Peak resident memory of this process since the last [`reset_peak_rss`],
/// in bytes (Linux; `None` elsewhere).
pub(crate) fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Starts a new peak-RSS measurement (Linux: `/proc/self/clear_refs`).
pub(crate) fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// End-to-end figures of `dequantize` on a generated checkpoint.
#[derive(Debug, Clone)]
pub struct EndToEnd {
    /// `dequantize` against writing the same bytes.
    pub figure: Figure,
    /// Input checkpoint bytes.
    pub input_bytes: u64,
    /// Peak RSS during `dequantize`, when known.
    pub peak_rss: Option<u64>,
}

/// Generates an int4 checkpoint of `shape` with about `gb` GB of bf16 output
/// in `dir` and times `dequantize` of it with `backend` against writing the
/// same number of bytes to a file, best of `runs` each.
pub(crate) fn end_to_end(
    dir: &Path,
    gb: f64,
    shape: Shape,
    runs: usize,
    backend: BackendChoice,
) -> Result<EndToEnd> {
    let layout = shape.layout(gb);
    let (tensors, rows, cols, group, shards) = layout;
    let ckpt = dir.join("bench-e2e");
    let out = dir.join("bench-e2e-dense");
    let _ = std::fs::remove_dir_all(&ckpt);
    let _ = std::fs::remove_dir_all(&out);
    write_checkpoint(&ckpt, layout)?;
    let mut input_bytes = 0;
    for e in std::fs::read_dir(&ckpt).map_err(|e| Error::io(&ckpt, "cannot read", e))? {
        let e = e.map_err(|e| Error::io(&ckpt, "cannot read", e))?;
        input_bytes += e.metadata().map_or(0, |m| m.len());
    }
    let bytes = (tensors * rows * cols * 2) as u64;
    let options = crate::Options {
        backend,
        ..Default::default()
    };
    // Alternating runs, the best of each kept: the disk's speed drifts, and
    // both sides get the same chances.
    let (mut seconds, mut baseline, mut peak) = (f64::MAX, f64::MAX, None);
    let mut done = Ok(());
    for _ in 0..runs.max(1) {
        baseline = baseline.min(file_write(dir, bytes)?);
        reset_peak_rss();
        let t = Instant::now();
        done = crate::dequantize(&ckpt, &out, &options).map(|_| ());
        seconds = seconds.min(t.elapsed().as_secs_f64());
        peak = peak.max(peak_rss());
        let _ = std::fs::remove_dir_all(&out);
        if done.is_err() {
            break;
        }
    }
    let _ = std::fs::remove_dir_all(&ckpt);
    done?;
    Ok(EndToEnd {
        figure: Figure::timed(
            if backend == BackendChoice::Gpu {
                "gpu"
            } else {
                "cpu"
            },
            (
                format!(
                    "dequantize {tensors} x {rows}x{cols} int4 g{group}{} -> bf16",
                    if shards > 1 {
                        format!(", {shards} shards")
                    } else {
                        String::new()
                    }
                ),
                "writing the same bytes".into(),
            ),
            bytes,
            (seconds, baseline),
        ),
        input_bytes,
        peak_rss: peak,
    })
}

impl std::str::FromStr for Shape {
    type Err = Error;
    fn from_str(s: &str) -> Result<Shape> {
        match s {
            "square" => Ok(Shape::Square),
            "moe" => Ok(Shape::Moe),
            "one-tensor" => Ok(Shape::OneTensor),
            _ => Err(Error::bare(
                Rule::Argument,
                format!("--e2e-shape: {s:?} is not one of square, moe, one-tensor"),
            )),
        }
    }
}

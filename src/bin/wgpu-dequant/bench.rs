//! `wgpu-dequant bench`: decode speed as a ratio against a baseline measured
//! in the same run on the same number of bytes.
//!
//! - CPU kernel: int4 group-128 → bf16 of an in-memory tensor, against a
//!   multi-threaded `memcpy` of the output bytes.
//! - GPU kernel: the same job decoded into a GPU buffer (upload included,
//!   no readback), against a buffer-to-buffer copy of the output bytes.
//! - End to end: `dequantize` of a generated checkpoint on disk, against
//!   writing (and syncing) the same number of bytes to a file.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use safetensors::Dtype;
use wgpu_dequant::backend::{gpu::GpuDecoder, Backend, Cpu};
use wgpu_dequant::job::{DecodeJob, Dims, Fields, Grid, ValueKind, Values};
use wgpu_dequant::writer::safetensors_header;
use wgpu_dequant::OutDtype;
use wgpu_dequant::{BackendChoice, Error, Result, Rule};

/// One measurement and its baseline.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Figure {
    /// What was measured.
    pub what: String,
    /// The baseline it is compared with.
    pub baseline: String,
    /// Output bytes per run.
    pub bytes: u64,
    /// Best time of the measured operation, seconds.
    pub seconds: f64,
    /// Best time of the baseline, seconds.
    pub baseline_seconds: f64,
}

impl Figure {
    /// Output GB/s of the measured operation.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e9
    }

    /// Output GB/s of the baseline.
    pub fn baseline_gbps(&self) -> f64 {
        self.bytes as f64 / self.baseline_seconds / 1e9
    }

    /// Measured speed as a fraction of the baseline's.
    pub fn ratio(&self) -> f64 {
        self.baseline_seconds / self.seconds
    }
}

impl std::fmt::Display for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<34} {:>8.2} GB/s   {:<30} {:>8.2} GB/s   ratio {:.2}",
            self.what,
            self.gbps(),
            self.baseline,
            self.baseline_gbps(),
            self.ratio()
        )
    }
}

/// Best wall time of `runs` calls of `f`.
fn best(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut best = Duration::MAX;
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
    }
    Ok(best.as_secs_f64())
}

/// Random int4 codes (as compressed-tensors packs them into int32 words)
/// and bf16 group-128 scales for a `rows × cols` weight.
pub struct Int4Weight {
    /// `weight_packed` bytes, row-major `[rows, cols/8]` int32.
    pub packed: Vec<u8>,
    /// `weight_scale` bytes, bf16 `[rows, cols/128]`.
    pub scale: Vec<u8>,
    pub rows: usize,
    /// A multiple of 128.
    pub cols: usize,
}

impl Int4Weight {
    /// A random weight.
    pub fn random(rows: usize, cols: usize, seed: u64) -> Int4Weight {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut packed = vec![0u8; rows * cols / 2];
        rng.fill(&mut packed);
        let scale = (0..rows * cols / 128)
            .flat_map(|_| {
                let s = 1e-3 + rng.u32(..1000) as f32 * 1e-5;
                half::bf16::from_f32(s).to_bits().to_le_bytes()
            })
            .collect();
        Int4Weight {
            packed,
            scale,
            rows,
            cols,
        }
    }

    /// The decode job of this weight (symmetric int4, group 128).
    pub fn job(&self, out: OutDtype) -> DecodeJob<'_> {
        let groups = self.cols / 128;
        DecodeJob {
            dims: Dims {
                slices: 1,
                rows: self.rows,
                cols: self.cols,
            },
            codes: Fields {
                data: self.packed.as_slice().into(),
                bits: 4,
                per_word: 0,
                lane_bits: self.cols as u64 * 4,
                word_bits: 32,
                slice_bits: 0,
            },
            code_values: (0..16).map(|c| c as f32 - 8.0).collect(),
            zero: None,
            scale: Some(Values {
                data: self.scale.as_slice().into(),
                kind: ValueKind::Bf16,
                grid: Grid {
                    row_div: 1,
                    col_div: 128,
                    row_stride: groups,
                    slice_stride: 0,
                },
            }),
            g_idx: None,
            low_rank: None,
            out,
        }
    }
}

/// CPU decode of an int4 g128 `rows × cols` weight to bf16 against a
/// multi-threaded copy of the output bytes.
pub fn cpu_kernel(rows: usize, cols: usize, runs: usize) -> Result<Figure> {
    let w = Int4Weight::random(rows, cols, 7);
    let job = w.job(OutDtype::Bf16);
    let bytes = job.out_bytes();
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let chunk = (bytes / rayon::current_num_threads().max(1) / 4).max(1 << 16);
    // Touch both buffers once so page faults are not timed.
    dst.par_chunks_mut(chunk).for_each(|d| d.fill(0));
    let copy = best(runs, || {
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        Ok(())
    })?;
    let cpu = Cpu::new();
    let decode = best(runs, || cpu.decode_rows(&job, 0..rows, &mut dst))?;
    Ok(Figure {
        what: format!("cpu decode int4 g128 -> bf16 ({rows}x{cols})"),
        baseline: format!("memcpy, {} threads", rayon::current_num_threads()),
        bytes: bytes as u64,
        seconds: decode,
        baseline_seconds: copy,
    })
}

/// GPU decode of the same job into a GPU buffer against a buffer copy of
/// the output bytes on the device.
pub fn gpu_kernel(decoder: &GpuDecoder, rows: usize, cols: usize, runs: usize) -> Result<Figure> {
    let w = Int4Weight::random(rows, cols, 7);
    let job = w.job(OutDtype::Bf16);
    let bytes = job.out_bytes() as u64;
    let device = decoder.device();
    let queue = decoder.queue();
    let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let a = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("bench copy src"),
        size: bytes,
        usage,
        mapped_at_creation: false,
    });
    let b = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("bench copy dst"),
        size: bytes,
        usage,
        mapped_at_creation: false,
    });
    let wait = || {
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| Error::bare(Rule::Gpu, "bench: poll").caused_by(e))
    };
    let copy = best(runs, || {
        let mut enc = device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&a, 0, &b, 0, bytes);
        queue.submit([enc.finish()]);
        wait()
    })?;
    let decode = best(runs, || {
        let buf = decoder.decode_to_buffer(&job)?;
        wait()?;
        buf.destroy();
        Ok(())
    })?;
    Ok(Figure {
        what: format!("gpu decode int4 g128 -> bf16 ({rows}x{cols})"),
        baseline: "buffer-to-buffer copy".into(),
        bytes,
        seconds: decode,
        baseline_seconds: copy,
    })
}

/// Writes a compressed-tensors int4 g128 checkpoint of `tensors` weights of
/// `rows × cols` into `dir` (a `config.json` and one `model.safetensors`).
pub fn write_checkpoint(dir: &Path, tensors: usize, rows: usize, cols: usize) -> Result<()> {
    let io = |p: &Path, e| Error::io(p, "cannot write", e);
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let path = dir.join("model.safetensors");
    let (packed_len, scale_len) = (rows * cols / 2, rows * cols / 128 * 2);
    let (packed_shape, scale_shape, shape_shape) = ([rows, cols / 8], [rows, cols / 128], [2]);
    let names: Vec<[String; 3]> = (0..tensors)
        .map(|i| {
            let m = format!("model.layers.{i}.mlp.down_proj");
            [
                format!("{m}.weight_packed"),
                format!("{m}.weight_scale"),
                format!("{m}.weight_shape"),
            ]
        })
        .collect();
    let header = safetensors_header(
        &path,
        names.iter().flat_map(|[p, s, w]| {
            [
                (p.as_str(), Dtype::I32, &packed_shape[..], packed_len),
                (s.as_str(), Dtype::BF16, &scale_shape[..], scale_len),
                (w.as_str(), Dtype::I64, &shape_shape[..], 16),
            ]
        }),
    )?;
    let mut f = std::io::BufWriter::new(File::create(&path).map_err(|e| io(&path, e))?);
    f.write_all(&header).map_err(|e| io(&path, e))?;
    // Tensors in header order.
    for i in 0..tensors {
        let w = Int4Weight::random(rows, cols, 11 + i as u64);
        let mut shape = Vec::new();
        for v in [rows as i64, cols as i64] {
            shape.extend_from_slice(&v.to_le_bytes());
        }
        for part in [&w.packed, &w.scale, &shape] {
            f.write_all(part).map_err(|e| io(&path, e))?;
        }
    }
    f.flush().map_err(|e| io(&path, e))?;
    let config = serde_json::json!({
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "version": "0.19.0",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                            "group_size": 128, "symmetric": true, "dynamic": false}
            }}
        }
    });
    let cpath = dir.join("config.json");
    std::fs::write(&cpath, config.to_string()).map_err(|e| io(&cpath, e))
}

/// Writing `bytes` to a new file in `dir` and syncing it, as the writer
/// does: the end-to-end baseline.
pub fn file_write(dir: &Path, bytes: u64) -> Result<f64> {
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
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Starts a new peak-RSS measurement (Linux: `/proc/self/clear_refs`).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// End-to-end figures of `dequantize` on a generated checkpoint.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EndToEnd {
    /// `dequantize` against writing the same bytes.
    pub figure: Figure,
    /// Input checkpoint bytes.
    pub input_bytes: u64,
    /// Peak RSS during `dequantize`, when known.
    pub peak_rss: Option<u64>,
}

/// Generates an int4 g128 checkpoint of about `gb` GB of bf16 output in
/// `dir` and times `dequantize` of it with `backend` against writing the same
/// number of bytes to a file.
pub fn end_to_end(dir: &Path, gb: f64, backend: BackendChoice) -> Result<EndToEnd> {
    let (rows, cols) = (4096, 8192);
    let per_tensor = (rows * cols * 2) as f64;
    let tensors = ((gb * 1e9 / per_tensor).ceil() as usize).max(1);
    let ckpt = dir.join("bench-int4-g128");
    let out = dir.join("bench-int4-g128-dense");
    let _ = std::fs::remove_dir_all(&ckpt);
    let _ = std::fs::remove_dir_all(&out);
    write_checkpoint(&ckpt, tensors, rows, cols)?;
    let input_bytes = std::fs::metadata(ckpt.join("model.safetensors"))
        .map_err(|e| Error::io(&ckpt, "cannot read", e))?
        .len();
    let bytes = (tensors * rows * cols * 2) as u64;
    let baseline = file_write(dir, bytes)?;
    reset_peak_rss();
    let t = Instant::now();
    let options = wgpu_dequant::Options {
        backend,
        ..Default::default()
    };
    let done = wgpu_dequant::dequantize(&ckpt, &out, &options);
    let seconds = t.elapsed().as_secs_f64();
    let peak = peak_rss();
    let _ = std::fs::remove_dir_all(&out);
    // Before and after: the disk may still be flushing the generated input.
    let baseline = baseline.min(file_write(dir, bytes)?);
    let _ = std::fs::remove_dir_all(&ckpt);
    done?;
    Ok(EndToEnd {
        figure: Figure {
            what: format!("dequantize {tensors} x {rows}x{cols} int4 -> bf16"),
            baseline: "writing the same bytes".into(),
            bytes,
            seconds,
            baseline_seconds: baseline,
        },
        input_bytes,
        peak_rss: peak,
    })
}

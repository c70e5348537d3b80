//! `wgpu-dequant bench`: decode speed as a ratio against a baseline measured
//! in the same run on the same number of bytes.
//!
//! - CPU kernels: each format's layout (`Layout`) decoded to bf16 and f32
//!   from memory, against a multi-threaded `memcpy` of the output bytes.
//! - GPU kernels: the same jobs decoded into a GPU buffer (upload included,
//!   no readback), against a copy shader with the fast kernel's dispatch
//!   geometry that uploads and reads the same input and writes as many
//!   output bytes.
//! - GGUF (`gguf`): mapped and decoded a piece at a time as `dequantize`
//!   does; on the CPU Q4_K and Q6_K against the straight int4 job of the
//!   same shape, on the GPU the common types against the copy shader of the
//!   same pieces.
//! - Products (`--gemv`): on the GPU, each layout's product with packed
//!   weights against a read kernel over the same bytes and the dense bf16
//!   product; on the CPU, `Model::matmul_cpu` at m = 1 with Q4_K and Q8_0
//!   weights against a multi-threaded read of the same packed bytes.
//! - End to end: `dequantize` of a generated checkpoint on disk, against
//!   writing (and syncing) the same number of bytes to a file.
//!
//! Here [`run`] and what it is told; the cases measured in `cases`, the
//! runners by what they measure (`cpu`, `gpu`, `gguf`, `gemv`, `gemv_cpu`,
//! `end_to_end`), how times are taken in `timing`, and the [`Figure`]s
//! they report in `report`.

mod cases;
mod cpu;
mod end_to_end;
mod experts;
mod gemv;
mod gemv_cpu;
mod gguf;
mod gpu;
mod report;
mod timing;

use crate::backend::{select, BackendChoice};
use crate::error::{Error, Result, Rule};
use cpu::cpu_kernels;
use end_to_end::end_to_end;
pub use end_to_end::{EndToEnd, Shape};
use gemv::gpu_gemv;
pub use gemv::{GEMV_MS, GEMV_SHAPES};
use gpu::gpu_kernels;
pub use report::Figure;

/// What `bench` measures.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Rows of the kernel benchmarks' weight.
    pub rows: usize,
    /// Its columns (a multiple of 128).
    pub cols: usize,
    /// Runs of each measurement; the best is kept.
    pub runs: usize,
    /// Also `dequantize` a generated checkpoint of this many GB of bf16
    /// output, of this shape, in this existing directory.
    pub e2e: Option<(f64, Shape, std::path::PathBuf)>,
    /// `cpu`, `gpu` (any adapter), or `auto` (the CPU, and the GPU
    /// `dequantize --backend auto` would run on, if any).
    pub backend: BackendChoice,
    /// Only the kernel cases whose name contains this ("" for all).
    pub only: String,
    /// Products with packed weights (`--gemv`) instead of decoding.
    pub gemv: Option<Gemv>,
}

/// What `bench --gemv` measures.
#[derive(Debug, Clone)]
pub struct Gemv {
    /// `[out, in]` shapes ([`GEMV_SHAPES`] by default).
    pub shapes: Vec<(usize, usize)>,
    /// Rows of x ([`GEMV_MS`] by default).
    pub ms: Vec<usize>,
}

/// What `bench` reports, in order.
pub enum Line {
    /// A measurement against its baseline.
    Figure(Figure),
    /// An end-to-end measurement, with its input size and peak memory.
    EndToEnd(EndToEnd, &'static str),
    /// A remark for people (what was not measured, on which adapter).
    Say(String),
}

/// Runs the benchmarks `settings` asks for, telling `show` each result.
pub fn run(settings: &Settings, mut show: impl FnMut(Line)) -> Result<()> {
    let Settings {
        rows,
        cols,
        runs,
        backend,
        ..
    } = *settings;
    if rows == 0 || cols == 0 || !cols.is_multiple_of(128) {
        return Err(Error::bare(
            Rule::Argument,
            "--cols: rows must be positive and cols a positive multiple of 128",
        ));
    }
    if let Some((_, _, dir)) = &settings.e2e {
        if !dir.is_dir() {
            return Err(Error::new(
                Rule::Argument,
                dir,
                "--dir is not an existing directory",
            ));
        }
    }
    // The GPU measured: the one `--backend` selects (under `auto`, only a
    // GPU `dequantize` would run on).
    let gpu = match backend {
        BackendChoice::Cpu => None,
        choice => {
            let (b, note) = select(choice)?;
            if b.gpu().is_none() {
                let why = note.unwrap_or_default();
                show(Line::Say(format!(
                    "gpu: not measured: {why} (--backend gpu measures any adapter)"
                )));
                None
            } else {
                Some(b)
            }
        }
    };
    if let Some(gemv) = &settings.gemv {
        if backend != BackendChoice::Gpu {
            gemv_cpu::cpu_gemv(&gemv.shapes, runs, &settings.only)?
                .into_iter()
                .for_each(|f| show(Line::Figure(f)));
        }
        // Where no GPU was found, `gpu: not measured` said so already.
        if let Some((b, decoder)) = gpu.as_ref().and_then(|b| Some((b, b.gpu()?))) {
            show(Line::Say(b.name()));
            gpu_gemv(
                decoder,
                (&gemv.shapes, &gemv.ms),
                (runs, &settings.only),
                |f| show(Line::Figure(f)),
            )?;
        }
        return Ok(());
    }
    if backend != BackendChoice::Gpu {
        cpu_kernels(rows, cols, runs, &settings.only)?
            .into_iter()
            .for_each(|f| show(Line::Figure(f)));
        if cols.is_multiple_of(256) {
            gguf::cpu(rows, cols, runs, &settings.only)?
                .into_iter()
                .for_each(|f| show(Line::Figure(f)));
        }
    }
    if let Some((b, decoder)) = gpu.as_ref().and_then(|b| Some((b, b.gpu()?))) {
        show(Line::Say(b.name()));
        gpu_kernels(decoder, rows, cols, runs, &settings.only)?
            .into_iter()
            .for_each(|f| show(Line::Figure(f)));
    }
    if let Some((gb, shape, dir)) = &settings.e2e {
        let mut backends = Vec::new();
        if backend != BackendChoice::Gpu {
            backends.push((BackendChoice::Cpu, "cpu"));
        }
        if gpu.is_some() {
            backends.push((BackendChoice::Gpu, "gpu"));
        }
        for (b, label) in backends {
            show(Line::EndToEnd(
                end_to_end(dir, *gb, *shape, runs, b)?,
                label,
            ));
        }
    }
    Ok(())
}

//! `wgpu-dequant bench`: decoding and products timed against baselines
//! measured in the same run (built with the `bench` feature; the figures
//! are in docs/performance.md).

use std::path::PathBuf;

use wgpu_dequant::bench;
use wgpu_dequant::{BackendChoice, Error, Rule};

use super::args::{backend_or_env, backends};
use super::meter::megabytes;

/// `bench`'s arguments.
#[derive(clap::Args)]
pub(super) struct Args {
    /// Rows of the benchmark weights.
    #[arg(long, default_value_t = 8192)]
    rows: usize,
    /// Columns of the benchmark weight (a multiple of 128).
    #[arg(long, default_value_t = 8192)]
    cols: usize,
    /// Runs of each measurement; the best is kept.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Also time `dequantize` end to end on a generated checkpoint of
    /// this many GB of bf16 output.
    #[arg(long, value_parser = positive_gb)]
    e2e_gb: Option<f64>,
    /// The end-to-end checkpoint: square 4096x8192 g128 weights, a MoE
    /// release's many small experts over 8 shards, or one huge tensor.
    #[arg(long, default_value = "square", value_parser = parse_shape)]
    e2e_shape: bench::Shape,
    /// An existing directory where the end-to-end checkpoint is generated
    /// (and removed after).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// What to measure: cpu, gpu (any adapter), or auto (the CPU, and a
    /// hardware GPU when there is one).
    /// Default: the WGPU_DEQUANT_BACKEND variable, else auto.
    #[arg(long, value_name = "BACKEND", value_parser = backends())]
    backend: Option<BackendChoice>,
    /// Only the kernel cases whose name contains this text, e.g.
    /// `gptq` (the straight int4 cases, with and without zero points, stay
    /// as the baselines of the input-packed ones).
    #[arg(long, default_value = "")]
    only: String,
    /// One JSON object per figure and line: backend, case, gbps,
    /// baseline, baseline_gbps, ratio (and m for --gemv).
    #[arg(long)]
    json: bool,
    /// Products with packed weights on the GPU (y = x·Wᵀ for 1 to 64
    /// rows of x) against a read kernel of the same bytes and a dense
    /// bf16 product, instead of decoding; and routed experts (8 rows over
    /// 4 of 32 experts in one call) against those experts one by one; on
    /// the CPU, matmul_cpu at m = 1 with GGUF Q4_K and Q8_0 weights against
    /// a multi-threaded read of the same packed bytes.
    #[arg(long)]
    gemv: bool,
    /// The `[out, in]` shapes --gemv multiplies by, e.g. `4096x14336`
    /// (repeatable; default: 4096x4096, 4096x14336, 14336x4096, 2048x768).
    #[arg(long, value_parser = parse_gemv_shape)]
    gemv_shape: Vec<(usize, usize)>,
    /// The rows of x --gemv multiplies with (repeatable; default: 1, 4,
    /// 16, 64).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65536))]
    gemv_m: Vec<u32>,
}

/// Runs `bench` with its arguments.
pub(super) fn run(args: Args) -> Result<u8, Error> {
    let Args {
        rows,
        cols,
        runs,
        e2e_gb,
        e2e_shape,
        dir,
        backend,
        only,
        json,
        gemv,
        gemv_shape,
        gemv_m,
    } = args;
    let backend = match backend_or_env(backend)? {
        BackendChoice::GpuApi(api) => {
            let detail = format!(
                "bench: --backend {}: the benchmarks take auto, gpu or cpu (WGPU_BACKEND={} picks the API)",
                api.name(),
                api.name()
            );
            return Err(Error::bare(Rule::Argument, detail));
        }
        choice => choice,
    };
    show(
        &bench::Settings {
            rows,
            cols,
            runs: runs as usize,
            e2e: e2e_gb.map(|gb| (gb, e2e_shape, dir)),
            backend,
            only,
            gemv: gemv.then(|| bench::Gemv {
                shapes: match gemv_shape.is_empty() {
                    true => bench::GEMV_SHAPES.to_vec(),
                    false => gemv_shape,
                },
                ms: match gemv_m.is_empty() {
                    true => bench::GEMV_MS.to_vec(),
                    false => gemv_m.into_iter().map(|m| m as usize).collect(),
                },
            }),
        },
        json,
    )
}

fn show(settings: &bench::Settings, json: bool) -> Result<u8, Error> {
    // The device the GPU figures were measured on (the line that precedes
    // them), named in each of their JSON lines.
    let mut device: Option<String> = None;
    bench::run(settings, |line| match line {
        bench::Line::Figure(f) if json => {
            let mut v = f.json();
            if let (Some(d), "gpu") = (&device, f.backend) {
                v["device"] = d.as_str().into();
            }
            println!("{v}")
        }
        bench::Line::Figure(f) => println!("{f}"),
        bench::Line::EndToEnd(e, _) if json => println!("{}", e.figure.json()),
        bench::Line::EndToEnd(e, label) => println!(
            "{} [{label}; input {}; peak RSS {}]",
            e.figure,
            megabytes(e.input_bytes as f64),
            e.peak_rss.map_or("n/a".into(), |r| megabytes(r as f64))
        ),
        bench::Line::Say(text) if json => {
            if text.starts_with("gpu (") {
                device = Some(text);
            }
        }
        bench::Line::Say(text) => println!("{text}"),
    })?;
    Ok(0)
}

fn positive_gb(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(gb) if gb > 0.0 && gb.is_finite() => Ok(gb),
        _ => Err(format!("{s:?} is not a positive number of GB")),
    }
}

fn parse_shape(s: &str) -> Result<bench::Shape, String> {
    s.parse().map_err(|e: Error| e.detail)
}

fn parse_gemv_shape(s: &str) -> Result<(usize, usize), String> {
    let dims = s
        .split_once('x')
        .and_then(|(n, k)| Some((n.parse().ok()?, k.parse().ok()?)));
    match dims {
        Some((n, k)) if n > 0 && k > 0 && k % 2 == 0 => Ok((n, k)),
        _ => Err(format!(
            "{s:?} is not OUTxIN with positive sizes and an even IN"
        )),
    }
}

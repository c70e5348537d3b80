//! The `wgpu-dequant` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use wgpu_dequant::convert::{self, ConvertTo};
use wgpu_dequant::report::{Finding, Report};
use wgpu_dequant::{
    backend, writer, BackendChoice, Checkpoint, DtypeChoice, Error, OutDtype, Plan,
};

/// Decode quantized safetensors checkpoints (compressed-tensors, ModelOpt NVFP4) to dense weights.
#[derive(Parser)]
#[command(name = "wgpu-dequant", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the format, schemes, every output tensor and rule findings.
    Inspect {
        /// Checkpoint directory or .safetensors file.
        path: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write a dense Hugging Face checkpoint.
    Dequantize {
        /// Checkpoint directory or .safetensors file.
        path: PathBuf,
        /// Output directory (must not exist, or be empty).
        #[arg(short, long)]
        output: PathBuf,
        /// Dtype of decoded tensors (auto: the checkpoint's own).
        #[arg(long, value_enum, default_value_t = DtypeArg::Auto)]
        dtype: DtypeArg,
        /// Where to decode.
        #[arg(long, value_enum, default_value_t = BackendArg::Auto, env = "WGPU_DEQUANT_BACKEND")]
        backend: BackendArg,
        /// Print nothing but errors.
        #[arg(short, long)]
        quiet: bool,
        /// Write into OUT even when it holds files: those of the same names are
        /// replaced once everything succeeded, others are left alone.
        #[arg(long)]
        force: bool,
        /// Only these input shards (file names, comma-separated): OUT may hold
        /// other runs' shards, and a partial index is written for merge-index.
        #[arg(long, value_delimiter = ',')]
        shards: Option<Vec<String>>,
    },
    /// Join the partial indexes of `dequantize --shards` runs into model.safetensors.index.json.
    MergeIndex {
        /// The output directory the runs wrote into.
        dir: PathBuf,
    },
    /// Rename a ModelOpt NVFP4 checkpoint's tensors to compressed-tensors names (CT-005).
    Convert {
        /// ModelOpt checkpoint directory or .safetensors file.
        path: PathBuf,
        /// Output directory (must not exist, or be empty).
        #[arg(short, long)]
        output: PathBuf,
        /// Target format.
        #[arg(long, value_enum)]
        to: ConvertArg,
        /// Print nothing but errors.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Measure decode speed against memcpy / buffer copy / file writes of the same bytes.
    Bench {
        /// Rows of the benchmark weight (int4, group 128).
        #[arg(long, default_value_t = 8192)]
        rows: usize,
        /// Columns of the benchmark weight (a multiple of 128).
        #[arg(long, default_value_t = 8192)]
        cols: usize,
        /// Runs of each measurement; the best is kept.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Also time `dequantize` end to end on a generated checkpoint of
        /// this many GB of bf16 output.
        #[arg(long)]
        e2e_gb: Option<f64>,
        /// Where the end-to-end checkpoint is generated (and removed after).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Backends to measure.
        #[arg(long, value_enum, default_value_t = BackendArg::Auto, env = "WGPU_DEQUANT_BACKEND")]
        backend: BackendArg,
    },
    /// Check every rule; exit 0 when clean, 1 with findings.
    Validate {
        /// Checkpoint directory or .safetensors file.
        path: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum DtypeArg {
    Auto,
    Bf16,
    F16,
    F32,
}

#[derive(Clone, Copy, ValueEnum)]
enum ConvertArg {
    CompressedTensors,
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendArg {
    Auto,
    Gpu,
    Cpu,
}

impl From<BackendArg> for BackendChoice {
    fn from(b: BackendArg) -> BackendChoice {
        match b {
            BackendArg::Auto => BackendChoice::Auto,
            BackendArg::Gpu => BackendChoice::Gpu,
            BackendArg::Cpu => BackendChoice::Cpu,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect { path, json } => inspect(&path, json),
        Command::Validate { path, json } => validate(&path, json),
        Command::Dequantize {
            path,
            output,
            dtype,
            backend,
            quiet,
            force,
            shards,
        } => dequantize(&path, &output, dtype, backend, quiet, force, shards),
        Command::MergeIndex { dir } => writer::merge_index(&dir).map(|p| {
            eprintln!("wrote {}", p.display());
            ExitCode::SUCCESS
        }),
        Command::Bench {
            rows,
            cols,
            runs,
            e2e_gb,
            dir,
            backend,
        } => bench(rows, cols, runs, e2e_gb, &dir, backend),
        Command::Convert {
            path,
            output,
            to: ConvertArg::CompressedTensors,
            quiet,
        } => convert(&path, &output, ConvertTo::CompressedTensors, quiet),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.rule.exit_code())
        }
    }
}

fn print_json(v: &impl serde::Serialize) -> Result<(), Error> {
    let text = serde_json::to_string_pretty(v)
        .map_err(|e| Error::new(wgpu_dequant::Rule::Io, "stdout", e.to_string()))?;
    println!("{text}");
    Ok(())
}

fn inspect(path: &Path, json: bool) -> Result<ExitCode, Error> {
    let ckpt = Checkpoint::open(path)?;
    let plan = Plan::build(&ckpt, DtypeChoice::Auto)?;
    let report = Report::new(&plan);
    if json {
        print_json(&report)?;
    } else {
        print!("{}", report.text());
    }
    Ok(ExitCode::SUCCESS)
}

fn validate(path: &Path, json: bool) -> Result<ExitCode, Error> {
    let (errors, warnings) = match Checkpoint::open(path).and_then(|c| {
        let plan = Plan::build(&c, DtypeChoice::Auto)?;
        Ok((
            plan.errors.iter().map(Finding::from).collect::<Vec<_>>(),
            plan.warnings,
        ))
    }) {
        Ok(found) => found,
        Err(e) => (vec![Finding::from(&e)], Vec::new()),
    };
    if json {
        print_json(&serde_json::json!({ "errors": errors, "warnings": warnings }))?;
    } else {
        for e in &errors {
            println!("error   {}", e.message);
        }
        for w in &warnings {
            println!("warning {}: {}", w.subject, w.detail);
        }
        if errors.is_empty() {
            println!("ok: {} ({} warnings)", path.display(), warnings.len());
        }
    }
    // Findings are faults of the input: the exit status an error has.
    Ok(match errors.first() {
        None => ExitCode::SUCCESS,
        Some(e) => ExitCode::from(e.exit_code),
    })
}

fn dequantize(
    path: &Path,
    out: &Path,
    dtype: DtypeArg,
    backend: BackendArg,
    quiet: bool,
    force: bool,
    shards: Option<Vec<String>>,
) -> Result<ExitCode, Error> {
    let started = Instant::now();
    let ckpt = Checkpoint::open(path)?;
    let dtype = match dtype {
        DtypeArg::Auto => DtypeChoice::Auto,
        DtypeArg::Bf16 => DtypeChoice::Fixed(OutDtype::Bf16),
        DtypeArg::F16 => DtypeChoice::Fixed(OutDtype::F16),
        DtypeArg::F32 => DtypeChoice::Fixed(OutDtype::F32),
    };
    let plan = Plan::build(&ckpt, dtype)?;
    plan.check()?;
    let choice = BackendChoice::from(backend);
    let target = match shards {
        Some(list) => writer::OutputDir::for_shards(out, list)?,
        None if force => writer::OutputDir::force(out)?,
        None => writer::OutputDir::create(out)?,
    };
    let (backend, note) = backend::select_notifying(choice, move |e| {
        if !quiet {
            eprintln!("note: {e}; decoding on the CPU from here (same bytes)");
        }
    })?;
    if !quiet {
        if let Some(note) = note {
            eprintln!("note: {note}");
        }
        eprintln!(
            "{}: {}; backend {}",
            path.display(),
            plan.format.describe(),
            backend.name()
        );
    }
    let selected = target.outputs(&plan);
    let total: u64 = selected.iter().map(|o| o.byte_len() as u64).sum();
    let mut meter = Meter::new(total, selected.len(), quiet);
    let summary = target.write(&plan, backend.as_ref(), |p| meter.update(p));
    meter.finish();
    let summary = summary?;
    if !quiet {
        eprintln!(
            "wrote {}: {} decoded to {}, {} copied, {} dropped, {:.1} MB in {:.2} s",
            out.display(),
            summary.decoded,
            plan.dtype,
            summary.copied,
            summary.dropped,
            summary.tensor_bytes as f64 / 1e6,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn convert(path: &Path, out: &Path, to: ConvertTo, quiet: bool) -> Result<ExitCode, Error> {
    let ckpt = Checkpoint::open(path)?;
    let plan = convert::plan(&ckpt, to)?;
    let target = writer::OutputDir::create(out)?;
    // Conversion only renames and inverts scales: nothing is decoded.
    let summary = target.write(&plan, &backend::Cpu::new(), |_| {})?;
    if !quiet {
        eprintln!(
            "wrote {}: {} scales inverted, {} tensors copied ({} renamed to compressed-tensors names)",
            out.display(),
            summary.converted,
            summary.copied,
            plan.outputs
                .iter()
                .filter(|o| o.name.ends_with(".weight_packed"))
                .count(),
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn bench(
    rows: usize,
    cols: usize,
    runs: usize,
    e2e_gb: Option<f64>,
    dir: &Path,
    backend: BackendArg,
) -> Result<ExitCode, Error> {
    if rows == 0 || cols == 0 || !cols.is_multiple_of(128) {
        return Err(Error::new(
            wgpu_dequant::Rule::Argument,
            "--cols",
            "rows must be positive and cols a positive multiple of 128",
        ));
    }
    let choice = BackendChoice::from(backend);
    println!("{}", wgpu_dequant::bench::cpu_kernel(rows, cols, runs)?);
    if choice != BackendChoice::Cpu {
        match wgpu_dequant::gpu::find_adapter() {
            Some(adapter) => {
                let decoder = wgpu_dequant::gpu::GpuDecoder::open(&adapter)?;
                println!("gpu: {}", adapter.get_info().name);
                println!(
                    "{}",
                    wgpu_dequant::bench::gpu_kernel(&decoder, rows, cols, runs)?
                );
            }
            None if choice == BackendChoice::Gpu => {
                return Err(Error::new(
                    wgpu_dequant::Rule::Gpu,
                    "--backend",
                    "gpu: no GPU adapter found",
                ))
            }
            None => println!("gpu: no adapter found, not measured"),
        }
    }
    if let Some(gb) = e2e_gb {
        let backends: &[BackendChoice] = match choice {
            BackendChoice::Auto => &[BackendChoice::Cpu, BackendChoice::Gpu],
            _ => std::slice::from_ref(&choice),
        };
        for &b in backends {
            if b == BackendChoice::Gpu && wgpu_dequant::gpu::find_adapter().is_none() {
                continue;
            }
            let e = wgpu_dequant::bench::end_to_end(dir, gb, b)?;
            println!(
                "{} [{:?}; input {:.2} GB; peak RSS {}]",
                e.figure,
                b,
                e.input_bytes as f64 / 1e9,
                e.peak_rss
                    .map_or("n/a".into(), |r| format!("{:.0} MB", r as f64 / 1e6))
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Progress for long runs: a bar on a terminal, a plain line every few
/// seconds otherwise, nothing with `--quiet`.
struct Meter {
    bar: Option<indicatif::ProgressBar>,
    plain: bool,
    total: u64,
    tensors: usize,
    done_bytes: u64,
    done_tensors: usize,
    started: Instant,
    last_line: Instant,
}

impl Meter {
    fn new(total: u64, tensors: usize, quiet: bool) -> Meter {
        use std::io::IsTerminal;
        let terminal = std::io::stderr().is_terminal();
        let bar = (!quiet && terminal).then(|| {
            let bar = indicatif::ProgressBar::new(total);
            let style = indicatif::ProgressStyle::with_template(
                "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        });
        Meter {
            bar,
            plain: !quiet && !terminal,
            total,
            tensors,
            done_bytes: 0,
            done_tensors: 0,
            started: Instant::now(),
            last_line: Instant::now(),
        }
    }

    fn update(&mut self, p: writer::Progress<'_>) {
        self.done_bytes += p.bytes;
        self.done_tensors += usize::from(p.done);
        let tensors = format!("{}/{} tensors", self.done_tensors, self.tensors);
        if let Some(bar) = &self.bar {
            bar.set_position(self.done_bytes);
            bar.set_message(tensors);
        } else if self.plain && self.last_line.elapsed().as_secs_f64() >= 5.0 {
            self.last_line = Instant::now();
            let secs = self.started.elapsed().as_secs_f64();
            let rate = self.done_bytes as f64 / secs.max(1e-9);
            let left = self.total.saturating_sub(self.done_bytes) as f64 / rate.max(1.0);
            eprintln!(
                "progress: {:.0}% ({:.2} of {:.2} GB, {tensors}, {:.2} GB/s, {:.0} s left)",
                100.0 * self.done_bytes as f64 / self.total.max(1) as f64,
                self.done_bytes as f64 / 1e9,
                self.total as f64 / 1e9,
                rate / 1e9,
                left
            );
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

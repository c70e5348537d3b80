//! The `wgpu-dequant` command line.

mod bench;
mod signals;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use wgpu_dequant::convert::{self, ConvertTo};
use wgpu_dequant::report::{Finding, Report};
use wgpu_dequant::{
    backend, writer, BackendChoice, Checkpoint, DtypeChoice, Error, OutDtype, Plan, Rule,
};

/// Decode quantized safetensors checkpoints (compressed-tensors, ModelOpt
/// NVFP4, SVDQuant) to dense weights.
#[derive(Parser)]
#[command(
    name = "wgpu-dequant",
    version,
    about,
    after_help = "Exit status: 0 done, 1 output/I-O/GPU failure, 2 bad arguments, 3 invalid input. \
                  An interrupted run (Ctrl-C, SIGTERM, SIGHUP) removes what it wrote and ends by that signal."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the format, schemes, every output tensor and rule findings
    /// (exit 0 when clean, 3 with findings, as validate).
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
        /// Output directory (must not exist, or be empty). Another run writing
        /// there makes this one refuse; what a killed run left is removed.
        #[arg(short, long)]
        output: PathBuf,
        /// Dtype of every floating point tensor, decoded or copied, and of
        /// config.json (auto: the checkpoint's own; copies keep theirs).
        #[arg(long, value_enum, default_value_t = DtypeArg::Auto)]
        dtype: DtypeArg,
        /// Where to decode (auto: a hardware GPU when there is one, else the CPU).
        #[arg(long, value_enum, default_value_t = BackendArg::Auto, env = "WGPU_DEQUANT_BACKEND")]
        backend: BackendArg,
        /// Print nothing but errors.
        #[arg(short, long)]
        quiet: bool,
        /// Write into OUT even when it holds files: those of the same names are
        /// replaced once everything succeeded, others are left alone.
        #[arg(long)]
        force: bool,
        /// Only these input shards (file names or paths, comma-separated): OUT
        /// may hold other runs' shards, and a partial index is written for
        /// merge-index.
        #[arg(long, value_delimiter = ',')]
        shards: Option<Vec<String>>,
        /// Split the output into model-0000i-of-0000N.safetensors files of at
        /// most SIZE each (5GB, 500MB, 2GiB, or bytes), unless one tensor
        /// alone is larger; without it, the input's sharding is kept.
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        max_shard_size: Option<u64>,
        /// Keep the stored tensor names, even where the architecture's own
        /// checkpoints name them differently (Mixtral-style MoE experts).
        #[arg(long)]
        keep_names: bool,
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
    /// Measure decode speed against memcpy / a copy shader / file writes of the same bytes.
    Bench {
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
        #[arg(long, value_enum, default_value_t = bench::Shape::Square)]
        e2e_shape: bench::Shape,
        /// An existing directory where the end-to-end checkpoint is generated
        /// (and removed after).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// What to measure: cpu, gpu (any adapter), or auto (the CPU, and a
        /// hardware GPU when there is one).
        #[arg(long, value_enum, default_value_t = BackendArg::Auto, env = "WGPU_DEQUANT_BACKEND")]
        backend: BackendArg,
        /// One JSON object per figure and line: backend, case, gbps,
        /// baseline, baseline_gbps, ratio.
        #[arg(long)]
        json: bool,
    },
    /// Check every rule; exit 0 when clean, 3 with findings.
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

fn positive_gb(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(gb) if gb > 0.0 && gb.is_finite() => Ok(gb),
        _ => Err(format!("{s:?} is not a positive number of GB")),
    }
}

fn main() -> ExitCode {
    quiet_window_system_probe();
    let cli = Cli::parse();
    if let Err(e) = signals::install() {
        eprintln!("note: cannot listen for interruptions ({e}); an interrupted run leaves its staging folder for the next run to remove");
    }
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
            max_shard_size,
            keep_names,
        } => dequantize(
            &path,
            dtype,
            backend,
            quiet,
            Target {
                out: &output,
                force,
                shards,
                max_shard_size,
                keep_names,
            },
        ),
        Command::MergeIndex { dir } => merge_index(&dir),
        Command::Bench {
            rows,
            cols,
            runs,
            e2e_gb,
            e2e_shape,
            dir,
            backend,
            json,
        } => bench(
            rows,
            cols,
            runs as usize,
            e2e_gb.map(|gb| (gb, e2e_shape)),
            &dir,
            backend,
            json,
        ),
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

/// Mesa's Vulkan device-select layer, loaded into every Vulkan process,
/// connects to the Wayland and X servers whenever an adapter is probed, and
/// libwayland prints `error: XDG_RUNTIME_DIR is invalid…` on a machine
/// without a session. This tool never presents to a window and chooses its
/// adapter itself (power preference, `WGPU_ADAPTER_NAME`), so the layer has
/// nothing to do for it: it is turned off for this process through its own
/// documented switch, which also saves about two seconds of probing. Whoever
/// configured the layer (`NODEVICE_SELECT`, `MESA_VK_DEVICE_SELECT`) keeps it.
fn quiet_window_system_probe() {
    #[cfg(all(unix, not(target_vendor = "apple")))]
    if std::env::var_os("NODEVICE_SELECT").is_none()
        && std::env::var_os("MESA_VK_DEVICE_SELECT").is_none()
    {
        // Before any other thread exists: nothing reads the environment concurrently.
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

fn print_json(v: &impl serde::Serialize) -> Result<(), Error> {
    let text = serde_json::to_string_pretty(v)
        .map_err(|e| Error::bare(Rule::Io, "cannot print JSON").caused_by(e))?;
    println!("{text}");
    Ok(())
}

/// The exit status for a report's findings: 0 when clean, else the first
/// finding's (3 for every input rule).
fn findings_status(errors: &[Finding]) -> ExitCode {
    match errors.first() {
        None => ExitCode::SUCCESS,
        Some(e) => ExitCode::from(e.exit_code),
    }
}

/// With `--json`, a failure is a JSON object on stdout too (`{"errors":
/// [finding]}`, as `validate --json` prints), beside the usual stderr line.
fn json_failure(json: bool, result: Result<ExitCode, Error>) -> Result<ExitCode, Error> {
    match result {
        Err(e) if json => {
            print_json(&serde_json::json!({ "errors": [Finding::from(&e)], "warnings": [] }))?;
            Err(e)
        }
        other => other,
    }
}

fn inspect(path: &Path, json: bool) -> Result<ExitCode, Error> {
    json_failure(
        json,
        (|| {
            let ckpt = Checkpoint::open(path)?;
            let plan = Plan::build(&ckpt, DtypeChoice::Auto)?;
            let report = Report::new(&plan);
            if json {
                print_json(&report)?;
            } else {
                print!("{}", report.text());
            }
            Ok(findings_status(&report.errors))
        })(),
    )
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
            println!("error: {}", e.message);
        }
        for w in &warnings {
            println!("warning: {}: {}", w.subject, w.detail);
        }
        if errors.is_empty() {
            println!("ok: {} ({} warnings)", path.display(), warnings.len());
        }
    }
    Ok(findings_status(&errors))
}

/// Where and how `dequantize` writes.
struct Target<'a> {
    out: &'a Path,
    force: bool,
    shards: Option<Vec<String>>,
    max_shard_size: Option<u64>,
    keep_names: bool,
}

fn dequantize(
    path: &Path,
    dtype: DtypeArg,
    backend: BackendArg,
    quiet: bool,
    Target {
        out,
        force,
        shards,
        max_shard_size,
        keep_names,
    }: Target<'_>,
) -> Result<ExitCode, Error> {
    let started = Instant::now();
    let ckpt = Checkpoint::open(path)?;
    let dtype = match dtype {
        DtypeArg::Auto => DtypeChoice::Auto,
        DtypeArg::Bf16 => DtypeChoice::Fixed(OutDtype::Bf16),
        DtypeArg::F16 => DtypeChoice::Fixed(OutDtype::F16),
        DtypeArg::F32 => DtypeChoice::Fixed(OutDtype::F32),
    };
    let mut plan = Plan::build(&ckpt, dtype)?;
    if keep_names {
        plan.keep_stored_names()?;
    }
    plan.check()?;
    let choice = BackendChoice::from(backend);
    let target = match shards {
        Some(list) => {
            let names = list
                .iter()
                .map(|s| ckpt.shard_file_name(s).map(str::to_string))
                .collect::<Result<Vec<_>, _>>()?;
            writer::OutputDir::for_shards(out, names)?
        }
        None if force => writer::OutputDir::force(out)?,
        None => writer::OutputDir::create(out)?,
    };
    let target = match max_shard_size {
        Some(max) => target.with_max_shard_size(max),
        None => target,
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
        if plan.decoded() == 0 {
            eprintln!(
                "note: nothing to decode (no quantized module); the tensors are copied{}",
                match plan.dtype_choice {
                    DtypeChoice::Fixed(d) => format!(" as {d}"),
                    DtypeChoice::Auto => " as they are".to_string(),
                }
            );
        }
    }
    let selected = target.outputs(&plan);
    let total: u64 = selected.iter().map(|o| o.byte_len() as u64).sum();
    let mut meter = Meter::new(total, selected.len(), quiet);
    let summary = target.write(&plan, backend.as_ref(), |p| meter.update(p));
    meter.finish();
    let summary = summary?;
    if !quiet {
        let secs = started.elapsed().as_secs_f64();
        let cast = if summary.cast > 0 {
            format!(" ({} cast to {})", summary.cast, plan.dtype)
        } else {
            String::new()
        };
        eprintln!(
            "wrote {}: {} tensors decoded to {} (from {} packs and scales), {} copied{cast}; {} in {:.2} s ({}/s)",
            out.display(),
            summary.decoded,
            plan.dtype,
            summary.dropped,
            summary.copied,
            megabytes(summary.tensor_bytes as f64),
            secs,
            megabytes(summary.tensor_bytes as f64 / secs.max(1e-9)),
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn merge_index(dir: &Path) -> Result<ExitCode, Error> {
    match writer::merge_index(dir)? {
        writer::Merged::Wrote(p) => eprintln!("wrote {}", p.display()),
        writer::Merged::Already(p) => eprintln!("{} is already merged; nothing to do", p.display()),
    }
    Ok(ExitCode::SUCCESS)
}

fn convert(path: &Path, out: &Path, to: ConvertTo, quiet: bool) -> Result<ExitCode, Error> {
    let ckpt = Checkpoint::open(path)?;
    let plan = convert::plan(&ckpt, to)?;
    let target = writer::OutputDir::create(out)?;
    // Conversion renames, inverts scales and repacks on the host: nothing
    // is decoded.
    let summary = target.write(&plan, &backend::Cpu::new(), |_| {})?;
    if !quiet {
        eprintln!(
            "wrote {}: {} quantized modules as compressed-tensors ({} tensors computed, {} copied)",
            out.display(),
            plan.outputs
                .iter()
                .filter(|o| o.name.ends_with(".weight_packed"))
                .count(),
            summary.converted,
            summary.copied,
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn bench(
    rows: usize,
    cols: usize,
    runs: usize,
    e2e: Option<(f64, bench::Shape)>,
    dir: &Path,
    backend: BackendArg,
    json: bool,
) -> Result<ExitCode, Error> {
    let show = |f: &bench::Figure| {
        if json {
            println!("{}", f.json());
        } else {
            println!("{f}");
        }
    };
    let say = |line: String| {
        if !json {
            println!("{line}");
        }
    };
    if rows == 0 || cols == 0 || !cols.is_multiple_of(128) {
        return Err(Error::bare(
            Rule::Argument,
            "--cols: rows must be positive and cols a positive multiple of 128",
        ));
    }
    if e2e.is_some() && !dir.is_dir() {
        return Err(Error::new(
            Rule::Argument,
            dir,
            "--dir is not an existing directory",
        ));
    }
    // What runs: `gpu` measures the GPU alone (any adapter); `auto` the CPU
    // and a hardware GPU, as `dequantize --backend auto` would use.
    let choice = BackendChoice::from(backend);
    let gpu = match choice {
        BackendChoice::Cpu => None,
        BackendChoice::Gpu => {
            Some(wgpu_dequant::backend::gpu::find_adapter().ok_or_else(|| {
                Error::bare(
                    Rule::Gpu,
                    format!(
                        "--backend: gpu: {}",
                        wgpu_dequant::backend::gpu::no_adapter_message(true)
                    ),
                )
            })?)
        }
        BackendChoice::Auto => {
            match wgpu_dequant::backend::gpu::find_adapter() {
                Some(a) if wgpu_dequant::backend::gpu::is_hardware(&a) => Some(a),
                Some(a) => {
                    say(format!("gpu: only a software adapter ({}); not measured (--backend gpu measures it)", a.get_info().name));
                    None
                }
                None => {
                    say("gpu: no adapter found; not measured".into());
                    None
                }
            }
        }
    };
    if choice != BackendChoice::Gpu {
        bench::cpu_kernels(rows, cols, runs)?.iter().for_each(show);
    }
    if let Some(adapter) = &gpu {
        let decoder = wgpu_dequant::backend::gpu::GpuDecoder::open(adapter)?;
        say(format!("gpu: {}", adapter.get_info().name));
        bench::gpu_kernels(&decoder, rows, cols, runs)?
            .iter()
            .for_each(show);
    }
    if let Some((gb, shape)) = e2e {
        let mut backends = Vec::new();
        if choice != BackendChoice::Gpu {
            backends.push((BackendChoice::Cpu, "cpu"));
        }
        if gpu.is_some() {
            backends.push((BackendChoice::Gpu, "gpu"));
        }
        for (b, label) in backends {
            let e = bench::end_to_end(dir, gb, shape, runs, b)?;
            if json {
                show(&e.figure);
                continue;
            }
            println!(
                "{} [{label}; input {}; peak RSS {}]",
                e.figure,
                megabytes(e.input_bytes as f64),
                e.peak_rss.map_or("n/a".into(), |r| megabytes(r as f64))
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Bytes for people, in decimal units as everywhere in this tool's output.
fn megabytes(bytes: f64) -> String {
    if bytes >= 1e9 {
        format!("{:.2} GB", bytes / 1e9)
    } else {
        format!("{:.1} MB", bytes / 1e6)
    }
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
            // Decimal units, as in the summary; the bar takes what width is left.
            let style = indicatif::ProgressStyle::with_template(
                "{wide_bar} {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} eta {eta} {msg}",
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
                "progress: {:.0}% ({} of {}, {tensors}, {}/s, {:.0} s left)",
                100.0 * self.done_bytes as f64 / self.total.max(1) as f64,
                megabytes(self.done_bytes as f64),
                megabytes(self.total as f64),
                megabytes(rate),
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

/// `--max-shard-size`: a byte count with Hugging Face's units (`5GB` is
/// 5·10⁹ bytes, `5GiB` 5·2³⁰).
fn parse_size(s: &str) -> Result<u64, String> {
    writer::parse_size(s).map_err(|e| e.detail)
}

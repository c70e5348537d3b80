//! The `wgpu-dequant` command line.

#[cfg_attr(not(feature = "bench"), path = "no_bench.rs")]
mod bench;
mod signals;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use wgpu_dequant::{
    BackendChoice, ConvertTo, Dequantize, Download, DtypeChoice, Error, Merged, Note, OutDtype,
    Progress, Rule, Validation,
};

/// Decode quantized safetensors checkpoints (compressed-tensors, ModelOpt
/// NVFP4, FP8, AutoAWQ, GPTQ, bitsandbytes, GPT-OSS, SVDQuant) to dense
/// weights.
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
        #[command(flatten)]
        path: Source,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write a dense Hugging Face checkpoint.
    Dequantize {
        #[command(flatten)]
        path: Source,
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
        /// Print nothing but warnings and errors.
        #[arg(short, long)]
        quiet: bool,
        /// Refuse, writing nothing, when the dense model would not be exactly
        /// the checkpoint's: any warning (a tensor dropped, a config value
        /// guessed or changed) becomes an error (exit 3).
        #[arg(long)]
        strict: bool,
        /// Write into OUT even when it holds files: those of the same names are
        /// replaced once everything succeeded, others are left alone.
        #[arg(long)]
        force: bool,
        /// Only these input shards (file names or paths, comma-separated): OUT
        /// may hold other runs' shards, and a partial index is written for
        /// merge-index.
        #[arg(long, value_delimiter = ',')]
        shards: Option<Vec<String>>,
        /// Only the input shards that fall to job I of N (0 <= I < N, as
        /// SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX count): every job
        /// derives the same assignment from the headers, balanced by the
        /// bytes each shard writes, and runs as --shards does with its own.
        #[arg(long, value_name = "I/N", value_parser = parse_part, conflicts_with = "shards")]
        part: Option<(usize, usize)>,
        /// Split the output into model-0000i-of-0000N.safetensors files of at
        /// most SIZE each (5GB, 500MB, 2GiB, or bytes), unless one tensor
        /// alone is larger; without it, the input's sharding is kept.
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        max_shard_size: Option<u64>,
        /// Keep the stored tensor names, even where the architecture's own
        /// checkpoints name them differently (Mixtral-style MoE experts).
        #[arg(long)]
        keep_names: bool,
        /// A Hub id's shards this run downloads are removed from the cache
        /// once written out: the cache holds about two shards at a time.
        #[arg(long)]
        delete_downloaded: bool,
        /// Continue an interrupted run into the same OUT: the output files it
        /// finished (their bytes checked against the SHA-256 recorded when
        /// they were written) are kept, the rest is written; if this run is
        /// interrupted too, what it finished stays for the next --resume.
        #[arg(long)]
        resume: bool,
        /// Print the summary as JSON on stdout (files written, tensors, and
        /// for a Hub id what was downloaded, reused and removed).
        #[arg(long)]
        json: bool,
    },
    /// Join the partial indexes of `dequantize --shards` runs into model.safetensors.index.json.
    MergeIndex {
        /// The output directory the runs wrote into.
        dir: PathBuf,
    },
    /// Rename a ModelOpt NVFP4 checkpoint's tensors to compressed-tensors names (CT-005).
    Convert {
        /// ModelOpt checkpoint directory or .safetensors file, or a Hub id.
        #[command(flatten)]
        path: Source,
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
    #[cfg_attr(not(feature = "bench"), command(hide = true))]
    Bench(bench::Args),
    /// Check every rule; exit 0 when clean, 3 with findings.
    Validate {
        #[command(flatten)]
        path: Source,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// The checkpoint a command reads.
#[derive(clap::Args)]
struct Source {
    /// Checkpoint directory, .safetensors or .gguf file, or a Hugging Face
    /// Hub id (ORG/NAME or ORG/NAME@REV, fetched into the Hugging Face
    /// cache; ORG/NAME:QUANT or ORG/NAME@REV:QUANT picks the GGUF file
    /// tagged QUANT, e.g. :Q4_K_M) when no such path exists.
    #[arg(value_name = "PATH")]
    path: PathBuf,
    /// The Hub id's branch, tag or commit (default: main).
    #[arg(long, value_name = "REV")]
    revision: Option<String>,
    /// The GGUF model to read where the folder or Hub repository holds
    /// several: its file name, or its path in the repository (any part of a
    /// split model names it).
    #[arg(long, value_name = "FILE")]
    gguf_file: Option<String>,
}

impl Source {
    /// The path, with the revision joined to a Hub id as ORG/NAME@REV.
    fn resolved(&self) -> Result<PathBuf, Error> {
        let Some(rev) = &self.revision else {
            return Ok(self.path.clone());
        };
        let text = self.path.to_string_lossy();
        if self.path.exists() {
            let detail = format!("--revision is for Hub ids, and {text} is a local path");
            return Err(Error::bare(Rule::Argument, detail));
        }
        if text.contains('@') {
            let detail = format!("{text} names a revision already; give it once");
            return Err(Error::bare(Rule::Argument, detail));
        }
        Ok(PathBuf::from(format!("{text}@{rev}")))
    }
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

impl From<DtypeArg> for DtypeChoice {
    fn from(d: DtypeArg) -> DtypeChoice {
        match d {
            DtypeArg::Auto => DtypeChoice::Auto,
            DtypeArg::Bf16 => DtypeChoice::Fixed(OutDtype::Bf16),
            DtypeArg::F16 => DtypeChoice::Fixed(OutDtype::F16),
            DtypeArg::F32 => DtypeChoice::Fixed(OutDtype::F32),
        }
    }
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
    quiet_window_system_probe();
    if let Err(e) = signals::install() {
        eprintln!("note: cannot listen for interruptions ({e}); an interrupted run leaves its staging folder for the next run to remove");
    }
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Inspect { .. } | Command::Validate { .. }
    ) {
        signals::quiet_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Inspect { path, json } => path
            .resolved()
            .and_then(|p| inspect(&p, path.gguf_file.as_deref(), json)),
        Command::Validate { path, json } => path
            .resolved()
            .and_then(|p| validate(&p, path.gguf_file.as_deref(), json)),
        Command::Dequantize {
            path,
            output,
            dtype,
            backend,
            quiet,
            strict,
            force,
            shards,
            part,
            max_shard_size,
            keep_names,
            delete_downloaded,
            resume,
            json,
        } => {
            let mut run = Dequantize::new()
                .dtype(dtype.into())
                .backend(backend.into())
                .force(force)
                .strict(strict)
                .keep_names(keep_names)
                .delete_downloaded(delete_downloaded)
                .resume(resume);
            if let Some(shards) = shards {
                run = run.shards(shards);
            }
            if let Some((index, count)) = part {
                run = run.part(index, count);
            }
            if let Some(max) = max_shard_size {
                run = run.max_shard_size(max);
            }
            if let Some(file) = &path.gguf_file {
                run = run.gguf_file(file);
            }
            let done = path
                .resolved()
                .and_then(|p| dequantize(&p, &output, run, quiet, json));
            json_failure(json, done)
        }
        Command::MergeIndex { dir } => merge_index(&dir),
        Command::Bench(args) => bench::run(args),
        Command::Convert {
            path,
            output,
            to: ConvertArg::CompressedTensors,
            quiet,
        } => match &path.gguf_file {
            Some(file) => Err(Error::bare(
                Rule::Argument,
                format!("--gguf-file {file}: convert reads safetensors checkpoints (ModelOpt, AutoAWQ), not GGUF"),
            )),
            None => path
                .resolved()
                .and_then(|p| convert(&p, &output, ConvertTo::CompressedTensors, quiet)),
        },
    };
    signals::settle();
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

/// With `--json`, a failure is a JSON object on stdout too (`{"errors":
/// [finding]}`, as `validate --json` prints), beside the usual stderr line.
fn json_failure(json: bool, result: Result<ExitCode, Error>) -> Result<ExitCode, Error> {
    match result {
        Err(e) if json => {
            print_json(&Validation::from(&e))?;
            Err(e)
        }
        other => other,
    }
}

/// A run reading the GGUF model `--gguf-file` names, if any.
fn with_gguf_file(gguf_file: Option<&str>) -> Dequantize<'static> {
    let run = Dequantize::new();
    match gguf_file {
        Some(file) => run.gguf_file(file),
        None => run,
    }
}

fn inspect(path: &Path, gguf_file: Option<&str>, json: bool) -> Result<ExitCode, Error> {
    json_failure(
        json,
        with_gguf_file(gguf_file).inspect(path).and_then(|report| {
            if json {
                print_json(&report)?;
            } else {
                print!("{}", report.text());
            }
            Ok(ExitCode::from(report.exit_code()))
        }),
    )
}

fn validate(path: &Path, gguf_file: Option<&str>, json: bool) -> Result<ExitCode, Error> {
    let found = with_gguf_file(gguf_file).validate(path);
    if json {
        print_json(&found)?;
    } else {
        for e in &found.errors {
            println!("error: {}", e.message);
        }
        for w in &found.warnings {
            println!("warning: {w}");
        }
        if found.errors.is_empty() {
            println!("ok: {} ({} warnings)", path.display(), found.warnings.len());
        }
    }
    Ok(ExitCode::from(found.exit_code()))
}

fn dequantize(
    path: &Path,
    out: &Path,
    run: Dequantize<'_>,
    quiet: bool,
    json: bool,
) -> Result<ExitCode, Error> {
    let started = Instant::now();
    let meter = Meter::new(quiet);
    let summary = run
        .on_note(|note| match note {
            Note::Warning(w) => meter.println(&format!("warning: {w}")),
            _ if quiet => {}
            Note::Start { format, backend } => {
                meter.println(&format!("{}: {format}; backend {backend}", path.display()))
            }
            Note::Text(text) => meter.println(&format!("note: {text}")),
            _ => {}
        })
        .on_progress(|p| meter.update(p))
        .on_download(|d| meter.downloaded(d))
        .run(path, out);
    meter.finish();
    let summary = summary?;
    if json {
        print_json(&summary)?;
    }
    if !quiet && summary.already_done {
        eprintln!(
            "{} already holds this job's {} files, of the bytes its record lists; nothing left to do",
            out.display(),
            summary.files.len()
        );
    } else if !quiet {
        let secs = started.elapsed().as_secs_f64();
        let cast = if summary.cast > 0 {
            format!(" ({} cast to {})", summary.cast, summary.dtype)
        } else {
            String::new()
        };
        eprintln!(
            "wrote {}: {} tensors decoded to {} (from {} packs and scales), {} copied{cast}; {} in {:.2} s ({}/s)",
            out.display(),
            summary.decoded,
            summary.dtype,
            summary.dropped,
            summary.copied,
            megabytes(summary.tensor_bytes as f64),
            secs,
            megabytes(summary.tensor_bytes as f64 / secs.max(1e-9)),
        );
        if let Some(f) = &summary.fetched {
            eprintln!(
                "from the Hub: {} shards downloaded, {} found in the cache, {} removed again (at most {} held at once)",
                f.downloaded.len(),
                f.reused.len(),
                f.deleted.len(),
                megabytes(f.peak_bytes as f64),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn merge_index(dir: &Path) -> Result<ExitCode, Error> {
    match wgpu_dequant::merge_index(dir)? {
        Merged::Wrote(p) => eprintln!("wrote {}", p.display()),
        Merged::Already(p) => eprintln!("{} is already merged; nothing to do", p.display()),
    }
    Ok(ExitCode::SUCCESS)
}

fn convert(path: &Path, out: &Path, to: ConvertTo, quiet: bool) -> Result<ExitCode, Error> {
    let summary = wgpu_dequant::convert(path, out, to)?;
    for w in &summary.warnings {
        eprintln!("warning: {w}");
    }
    if !quiet {
        eprintln!(
            "wrote {}: {} quantized modules as compressed-tensors ({} tensors computed, {} copied)",
            out.display(),
            summary.modules,
            summary.converted,
            summary.copied,
        );
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
/// seconds otherwise, nothing with `--quiet`; the decoding's bytes, and a
/// Hub run's downloads beside them (told from another thread).
struct Meter {
    bar: Option<indicatif::ProgressBar>,
    plain: bool,
    started: Instant,
    seen: std::sync::Mutex<Seen>,
}

/// What the meter was last told.
struct Seen {
    last_line: Instant,
    /// Bytes written, of how many; tensors written, of how many.
    decode: (u64, u64, usize, usize),
    download: Option<Download>,
    /// When the first downloaded bytes were seen (the rate's start).
    download_started: Option<Instant>,
}

impl Meter {
    fn new(quiet: bool) -> Meter {
        use std::io::IsTerminal;
        let terminal = std::io::stderr().is_terminal();
        let bar = (!quiet && terminal).then(|| {
            let bar = indicatif::ProgressBar::new(0);
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
            started: Instant::now(),
            seen: std::sync::Mutex::new(Seen {
                last_line: Instant::now(),
                decode: (0, 0, 0, 0),
                download: None,
                download_started: None,
            }),
        }
    }

    /// A line above the bar (or just a line).
    fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }

    fn update(&self, p: &Progress<'_>) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.decode = (p.done_bytes, p.total_bytes, p.done_tensors, p.total_tensors);
        if let Some(d) = p.download {
            self.note_download(&mut seen, d);
        }
        self.show(&mut seen);
    }

    fn downloaded(&self, d: &Download) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        self.note_download(&mut seen, *d);
        self.show(&mut seen);
    }

    fn note_download(&self, seen: &mut Seen, d: Download) {
        if d.done_bytes > 0 && seen.download_started.is_none() {
            seen.download_started = Some(Instant::now());
        }
        seen.download = Some(d);
    }

    /// The downloads' part of a line: bytes, rate and time left.
    fn download_text(seen: &Seen) -> Option<String> {
        let d = seen.download.filter(|d| d.total_bytes > 0)?;
        let secs = seen
            .download_started
            .map_or(0.0, |t| t.elapsed().as_secs_f64());
        let rate = d.done_bytes as f64 / secs.max(1e-9);
        let left = d.total_bytes.saturating_sub(d.done_bytes);
        let eta = if left == 0 {
            "done".to_string()
        } else if rate > 0.0 && secs > 0.0 {
            format!("{:.0} s left", left as f64 / rate)
        } else {
            "starting".to_string()
        };
        Some(format!(
            "download {} of {} at {}/s, {eta}",
            megabytes(d.done_bytes as f64),
            megabytes(d.total_bytes as f64),
            megabytes(if secs > 0.0 { rate } else { 0.0 }),
        ))
    }

    fn show(&self, seen: &mut Seen) {
        let (done, total, done_tensors, total_tensors) = seen.decode;
        let tensors = format!("{done_tensors}/{total_tensors} tensors");
        let download = Meter::download_text(seen);
        if let Some(bar) = &self.bar {
            bar.set_length(total);
            bar.set_position(done);
            bar.set_message(match download {
                Some(d) => format!("{tensors}; {d}"),
                None => tensors,
            });
        } else if self.plain && seen.last_line.elapsed().as_secs_f64() >= 5.0 {
            seen.last_line = Instant::now();
            let secs = self.started.elapsed().as_secs_f64();
            let rate = done as f64 / secs.max(1e-9);
            let left = total.saturating_sub(done) as f64 / rate.max(1.0);
            let download = download.map_or(String::new(), |d| format!("; {d}"));
            eprintln!(
                "progress: {:.0}% ({} of {}, {tensors}, {}/s, {:.0} s left){download}",
                100.0 * done as f64 / total.max(1) as f64,
                megabytes(done as f64),
                megabytes(total as f64),
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
    wgpu_dequant::parse_size(s).map_err(|e| e.detail)
}

/// `--e2e-shape`.
/// `--part I/N`: job I (from 0) of N.
fn parse_part(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{s:?}: expected I/N with 0 <= I < N (job I of N, from 0)");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let (i, n): (usize, usize) = (
        i.trim().parse().map_err(|_| bad())?,
        n.trim().parse().map_err(|_| bad())?,
    );
    if i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

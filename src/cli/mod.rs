//! The `wgpu-dequant` command line (the `cli` feature). The binary
//! (src/bin/wgpu-dequant/main.rs) and the Python package's `wgpu-dequant`
//! console script run `main` with their arguments. Like the other hosts it
//! reaches the library only by its public paths (`wgpu_dequant::…`).

mod args;
#[cfg_attr(not(feature = "bench"), path = "no_bench.rs")]
mod bench;
mod dequantize;
mod describe;
mod events;
mod inspect;
mod meter;
mod signals;

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use wgpu_dequant::{
    BackendChoice, ConvertTo, Dequantize, DtypeChoice, Error, Merged, Rule, Validation,
};

use args::{backend_or_env, parse_part, parse_size};

/// Decode quantized checkpoints (GGUF, MLX, compressed-tensors, ModelOpt,
/// FP8, AutoAWQ, GPTQ, bitsandbytes, GPT-OSS, SVDQuant) to dense weights.
#[derive(Parser)]
#[command(
    name = "wgpu-dequant",
    version,
    long_version = describe::long_version(),
    about,
    after_help = "Exit status: 0 done, 1 output/I-O/GPU failure, 2 bad arguments, 3 invalid input. \
                  An interrupted run (Ctrl-C, SIGTERM, SIGHUP) removes what it wrote and ends by that signal."
)]
struct Cli {
    /// Threads for the CPU's work (default: one per core; the
    /// RAYON_NUM_THREADS variable sets it too).
    #[arg(long, global = true, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Plan without writing: the format, totals (parameters, bytes read
    /// and written, files, free space, transformers class), each output
    /// tensor and its source, and rule findings (exit 0 when clean, 3 with
    /// findings, as validate; with several PATHs, the first non-zero).
    Inspect(inspect::Args),
    /// Write a dense Hugging Face checkpoint.
    Dequantize {
        #[command(flatten)]
        path: Source,
        /// Output directory (must not exist, or be empty). Another run writing
        /// there makes this one refuse; what a killed run left is removed.
        #[arg(short, long)]
        output: PathBuf,
        /// Dtype of every floating point tensor, decoded or copied, and of
        /// config.json (auto: the checkpoint's own, as config.json or its
        /// scales give it; bf16 for GGUF and where none is named; copies
        /// keep theirs). Any case; bfloat16, float16, fp16, half, float32
        /// and fp32 too.
        #[arg(long, value_name = "DTYPE", value_parser = args::dtypes(), default_value = "auto")]
        dtype: DtypeChoice,
        /// Where to decode: auto (a hardware GPU when there is one, else the
        /// CPU), gpu, cpu, or the GPU through one API only (vulkan, metal,
        /// dx12, gl). NVIDIA and AMD cards are reached through Vulkan.
        /// Default: the WGPU_DEQUANT_BACKEND variable, else auto.
        #[arg(long, value_name = "BACKEND", value_parser = args::backends())]
        backend: Option<BackendChoice>,
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
        /// most SIZE each (5GB, 5G, 500MB, 2GiB, or bytes), unless one tensor
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
        /// finished (their bytes checked against the BLAKE3 digests recorded
        /// when they were written) are kept, the rest is written; if this run is
        /// interrupted too, what it finished stays for the next --resume.
        #[arg(long)]
        resume: bool,
        /// Print the summary as JSON on stdout (files written, tensors, the
        /// format, backend, seconds and warnings, and for a Hub id what was
        /// downloaded, reused and removed); what stderr tells (progress,
        /// warnings, notes, an interruption, an error) is then one JSON
        /// object a line.
        #[arg(long)]
        json: bool,
    },
    /// Join the partial indexes of `dequantize --shards` or `--part` runs
    /// into model.safetensors.index.json.
    MergeIndex {
        /// The output directory the runs wrote into.
        dir: PathBuf,
    },
    /// Write a checkpoint as compressed-tensors: ModelOpt NVFP4's tensors
    /// renamed (CT-005), AutoAWQ's repacked.
    Convert {
        /// ModelOpt or AutoAWQ checkpoint directory or .safetensors file, or
        /// a Hub id.
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
    /// List the formats read (bit widths and modes), the GGUF tensor types
    /// and the GGUF architectures written under transformers' names.
    Formats {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell's completion script (e.g. `wgpu-dequant completions
    /// bash > ~/.local/share/bash-completion/completions/wgpu-dequant`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff: `wgpu-dequant man | man -l -`).
    Man,
}

/// The checkpoint a command reads.
#[derive(clap::Args)]
struct Source {
    /// Checkpoint directory, .safetensors or .gguf file (any part of a
    /// split one), or a Hugging Face Hub id (ORG/NAME or ORG/NAME@REV,
    /// fetched into the Hugging Face cache; ORG/NAME:QUANT or
    /// ORG/NAME@REV:QUANT picks the GGUF file tagged QUANT, e.g. :Q4_K_M,
    /// and DIR:QUANT a local folder's) when no such path exists.
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
        resolve(&self.path, self.revision.as_deref())
    }
}

/// `path`, with the revision `rev` joined to a Hub id as ORG/NAME@REV.
fn resolve(path: &Path, rev: Option<&str>) -> Result<PathBuf, Error> {
    let Some(rev) = rev else {
        return Ok(path.to_path_buf());
    };
    let text = path.to_string_lossy();
    if path.exists() {
        let detail = format!("--revision is for Hub ids, and {text} is a local path");
        return Err(Error::bare(Rule::Argument, detail));
    }
    if text.contains('@') {
        let detail = format!("{text} names a revision already; give it once");
        return Err(Error::bare(Rule::Argument, detail));
    }
    Ok(PathBuf::from(format!("{text}@{rev}")))
}

#[derive(Clone, Copy, ValueEnum)]
enum ConvertArg {
    CompressedTensors,
}

/// Runs the command line `args` (the program's name first, as
/// `std::env::args_os` gives them) and returns its exit status: 0 done, 1
/// output, I/O or GPU failure, 2 bad arguments, 3 invalid input. An
/// interruption (Ctrl-C, SIGTERM, SIGHUP) undoes the run and ends the
/// process by that signal instead.
pub fn main<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    quiet_window_system_probe();
    if let Err(e) = signals::install() {
        eprintln!("note: cannot listen for interruptions ({e}); an interrupted run leaves its staging folder for the next run to remove");
    }
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let code = match Cli::try_parse_from(&args) {
        Ok(cli) => run(cli),
        Err(e) => {
            let e = args::point_to_output_flag(e, &args);
            // Help and --version go to stdout, refusals to stderr.
            let _ = e.print();
            u8::try_from(e.exit_code()).unwrap_or(2)
        }
    };
    // A Rust program's stdout is flushed when its `main` returns; a host
    // that runs this as a library call (Python) would lose the tail.
    let _ = std::io::stdout().flush();
    code
}

/// Runs a parsed command line; its exit status.
fn run(cli: Cli) -> u8 {
    if let Some(n) = cli.threads {
        if let Err(e) = rayon::ThreadPoolBuilder::new()
            .num_threads(n.into())
            .build_global()
        {
            eprintln!("note: --threads {n}: {e}; the threads already started are used");
        }
    }
    if matches!(
        cli.command,
        Command::Inspect(_)
            | Command::Validate { .. }
            | Command::Formats { .. }
            | Command::Completions { .. }
            | Command::Man
    ) {
        signals::quiet_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(args),
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
            let run = backend_or_env(backend).map(|backend| {
                let mut run = Dequantize::new()
                    .dtype(dtype)
                    .backend(backend)
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
                run
            });
            let done = run.and_then(|run| {
                path.resolved()
                    .and_then(|p| dequantize::dequantize(&p, &output, run, quiet, json))
            });
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
        Command::Formats { json } => describe::formats(json),
        Command::Completions { shell } => describe::completions(shell),
        Command::Man => describe::man(),
    };
    signals::settle();
    match result {
        Ok(code) => code,
        Err(e) => {
            if !events::error(&e) {
                eprintln!("error: {e}");
            }
            e.rule.exit_code()
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
fn json_failure(json: bool, result: Result<u8, Error>) -> Result<u8, Error> {
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

fn validate(path: &Path, gguf_file: Option<&str>, json: bool) -> Result<u8, Error> {
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
            let warnings = plural(found.warnings.len(), "warning");
            println!("ok: {} ({warnings})", path.display());
        }
    }
    Ok(found.exit_code())
}

fn merge_index(dir: &Path) -> Result<u8, Error> {
    match wgpu_dequant::merge_index(dir)? {
        Merged::Wrote(p) => eprintln!("wrote {}", p.display()),
        Merged::Already(p) => eprintln!("{} is already merged; nothing to do", p.display()),
    }
    Ok(0)
}

fn convert(path: &Path, out: &Path, to: ConvertTo, quiet: bool) -> Result<u8, Error> {
    let summary = wgpu_dequant::convert(path, out, to)?;
    for w in &summary.warnings {
        eprintln!("warning: {w}");
    }
    if !quiet {
        eprintln!(
            "wrote {}: {} as compressed-tensors ({} computed, {} copied)",
            out.display(),
            plural(summary.modules, "quantized module"),
            plural(summary.converted, "tensor"),
            summary.copied,
        );
    }
    Ok(0)
}

/// `n word`, with the word's plural `-s` unless `n` is 1.
fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

//! `wgpu-dequant inspect`: the plan of one or more checkpoints, as a
//! `dequantize` with the same settings would make it, for people or as
//! JSON.

use std::path::PathBuf;

use wgpu_dequant::{Dequantize, DtypeChoice, Error, Report};

use super::args::{self, parse_size};
use super::{print_json, resolve};

/// What `inspect` is given.
#[derive(clap::Args)]
pub(super) struct Args {
    /// Checkpoint directories, .safetensors or .gguf files, or Hugging Face
    /// Hub ids (as dequantize reads PATH); several are reported one after
    /// another (with --json, as an array of reports).
    #[arg(value_name = "PATH", required = true)]
    paths: Vec<PathBuf>,
    /// The Hub ids' branch, tag or commit (default: main).
    #[arg(long, value_name = "REV")]
    revision: Option<String>,
    /// The GGUF model to read where a folder or Hub repository holds
    /// several (as dequantize's --gguf-file).
    #[arg(long, value_name = "FILE")]
    gguf_file: Option<String>,
    /// Print JSON instead of text: one report, or an array of them for
    /// several paths; a checkpoint that cannot be read is a report too,
    /// with `ok` false and its error.
    #[arg(long)]
    json: bool,
    /// List every output tensor; beyond 60 the text folds them into one
    /// line per module pattern (model.layers.*.mlp.down_proj.weight x 32).
    #[arg(long)]
    tensors: bool,
    /// Plan for this dtype, as dequantize's --dtype does (sizes, listing).
    #[arg(long, value_name = "DTYPE", value_parser = args::dtypes(), default_value = "auto")]
    dtype: DtypeChoice,
    /// Plan the output split as dequantize's --max-shard-size splits it.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_shard_size: Option<u64>,
    /// Plan with the stored tensor names, as dequantize's --keep-names.
    #[arg(long)]
    keep_names: bool,
    /// Where the output would go, for its free space (nothing is written
    /// there; default: the current directory).
    #[arg(short, long, value_name = "OUT")]
    output: Option<PathBuf>,
}

/// Runs `inspect`; the exit status is the first non-zero of the reports'.
pub(super) fn run(a: Args) -> Result<u8, Error> {
    let mut planner = Dequantize::new().dtype(a.dtype).keep_names(a.keep_names);
    if let Some(max) = a.max_shard_size {
        planner = planner.max_shard_size(max);
    }
    if let Some(file) = &a.gguf_file {
        planner = planner.gguf_file(file);
    }
    let out = a.output.clone().unwrap_or_else(|| PathBuf::from("."));
    let mut code = 0;
    let mut reports = Vec::new();
    for (i, path) in a.paths.iter().enumerate() {
        let planned =
            resolve(path, a.revision.as_deref()).and_then(|p| planner.inspect_for(&p, &out));
        if !a.json && i > 0 {
            println!();
        }
        let report = match planned {
            Ok(report) if a.json => report,
            Ok(report) => {
                print!("{}", report.text_with(a.tensors));
                report
            }
            // One checkpoint says its error as every command does.
            Err(e) if a.paths.len() == 1 && !a.json => return Err(e),
            Err(e) => {
                eprintln!("error: {e}");
                Report::failed(path, &e)
            }
        };
        if code == 0 {
            code = report.exit_code();
        }
        if a.json {
            reports.push(report);
        }
    }
    if a.json {
        match reports.as_slice() {
            [one] => print_json(one)?,
            all => print_json(&all)?,
        }
    }
    Ok(code)
}

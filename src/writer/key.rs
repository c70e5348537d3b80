//! The key of a job: what a `--resume` run must share with the run it
//! continues, and a finished run's record with the run that finds it. It
//! covers this tool's version, the input files and every choice that
//! shapes the output.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::ShardFile;
use crate::plan::Plan;

/// `text`'s SHA-256, in hex.
pub(crate) fn hex_sha256(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A stamp of one input file: its path, size and modification time.
fn stamp(path: &Path) -> String {
    let meta = std::fs::metadata(path).ok();
    let modified = meta.as_ref().and_then(|m| m.modified().ok());
    let since = modified.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    format!(
        "{}\0{}\0{}\0",
        path.display(),
        meta.map_or(0, |m| m.len()),
        since.map_or(0, |d| d.as_nanos())
    )
}

/// The stamps of a local checkpoint's files, read without opening one: the
/// regular files of its folder (a `.safetensors` file's own folder, the file
/// named), sorted.
pub(crate) fn input_stamps(input: &Path) -> String {
    let input = input.canonicalize().unwrap_or_else(|_| input.to_path_buf());
    let dir = match input.is_dir() {
        true => input.as_path(),
        false => input.parent().unwrap_or(Path::new(".")),
    };
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    files.sort();
    let mut text = format!("{}\0", input.display());
    for f in files {
        text.push_str(&stamp(&f));
    }
    text
}

/// The key of the job that writes `shards` of `plan` (what a `--resume`
/// run must share with the run it continues): this tool's version, the
/// input files (names, sizes and modification times) and every output
/// file's name and header.
pub(super) fn job_key(plan: &Plan<'_>, shards: &[ShardFile<'_, '_>]) -> String {
    let ckpt = plan.checkpoint;
    let mut h = Sha256::new();
    h.update(env!("CARGO_PKG_VERSION"));
    let jsons = [&ckpt.index, &ckpt.config, &ckpt.hf_quant_config, &ckpt.svdquant_config];
    let inputs = ckpt.shards.iter().map(|s| s.path.as_path());
    let inputs = inputs.chain(jsons.into_iter().flatten().map(|j| j.path.as_path()));
    for path in inputs.chain(plan.side_files.iter().map(|(p, _)| p.as_path())) {
        h.update(stamp(path));
    }
    for file in shards {
        h.update(&file.name);
        h.update([0]);
        h.update(&file.header);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}


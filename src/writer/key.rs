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

/// Files up to this size are hashed whole in a job's key.
const WHOLE: u64 = 64 << 20;

/// What of a larger file is hashed when its header's end is not known (a
/// GGUF file's metadata and tensor infos, as a rule well within it).
const PREFIX: u64 = 64 << 20;

/// A stamp of one input file, read from what it holds, not its dates: its
/// path, size and the BLAKE3 of its header (a `.safetensors` file's length
/// and JSON header, which name every tensor's dtype, shape and offsets: its
/// tensors' bytes are not read), of any other file whole when small
/// (configs, tokenizers), or else of its first [`PREFIX`] bytes (a GGUF
/// file's metadata and tensor infos). A file that
/// cannot be read stamps as such, and differs from any that can.
fn stamp(path: &Path) -> String {
    let (len, digest) = match content(path) {
        Ok((len, digest)) => (len.to_string(), digest),
        Err(e) => ("-".to_string(), e.kind().to_string()),
    };
    format!("{}\0{len}\0{digest}\0", path.display())
}

/// The size of file `path` and the BLAKE3 of what [`stamp`] covers.
fn content(path: &Path) -> std::io::Result<(u64, String)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let is_safetensors = path.extension().is_some_and(|e| e == "safetensors");
    let take = match len {
        n if is_safetensors && n >= 8 => {
            let mut n = [0u8; 8];
            f.read_exact(&mut n)?;
            // Its header, however long it claims to be, within the file.
            8 + u64::from_le_bytes(n).min(len - 8)
        }
        n if n <= WHOLE => n,
        _ => PREFIX,
    };
    let mut h = blake3::Hasher::new();
    let mut f = std::fs::File::open(path)?.take(take);
    std::io::copy(&mut f, &mut h)?;
    Ok((len, h.finalize().to_hex().to_string()))
}

/// The stamps of a local checkpoint's files ([`stamp`]: sizes and header
/// digests): the regular files of its folder (a `.safetensors` file's own folder, the file
/// named), sorted.
pub(crate) fn input_stamps(input: &Path) -> String {
    let input = input.canonicalize().unwrap_or_else(|_| input.to_path_buf());
    let dir = match input.is_dir() {
        true => input.as_path(),
        false => input.parent().unwrap_or(Path::new(".")),
    };
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
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
/// input files (names, sizes and header digests) and every output
/// file's name and header.
pub(super) fn job_key<T>(plan: &Plan<'_>, shards: &[ShardFile<T>]) -> String {
    let ckpt = plan.checkpoint;
    let mut h = Sha256::new();
    h.update(env!("CARGO_PKG_VERSION"));
    let jsons = [
        &ckpt.index,
        &ckpt.config,
        &ckpt.hf_quant_config,
        &ckpt.svdquant_config,
        &ckpt.sinq_meta,
    ];
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

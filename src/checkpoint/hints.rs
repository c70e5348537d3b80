//! What a path that is not a checkpoint is told instead of a parse error:
//! a PyTorch pickle, one of a checkpoint's other files, a folder without
//! weights.

use std::path::Path;

use super::is_weights;
use crate::error::{Error, Rule};

/// The extensions of PyTorch's pickled weights (`torch.save`), which are
/// never read: unpickling runs whatever code the file holds.
const PICKLES: &[&str] = &["bin", "pt", "pth"];

/// Whether file `name` is PyTorch pickled weights, by its extension.
pub(super) fn is_pickle(name: &str) -> bool {
    Path::new(name)
        .extension()
        .is_some_and(|x| PICKLES.iter().any(|p| x.eq_ignore_ascii_case(p)))
}

/// The refusal of pickle `path`, saying how to get safetensors instead.
pub(super) fn pickle(path: &Path) -> Error {
    Error::new(
        Rule::Unsupported,
        path,
        "is a PyTorch pickle, which is not read (it can run code); \
         re-save it with save_pretrained(safe_serialization=True)",
    )
}

/// The refusal of folder `dir`, whose files `names` hold no safetensors
/// and no GGUF model: a pickle among them is named, else the formats read.
pub(super) fn no_weights(dir: &Path, names: &[String]) -> Error {
    match names.iter().find(|n| is_pickle(n)) {
        Some(name) => pickle(&dir.join(name)),
        None => Error::new(
            Rule::Container,
            dir,
            "no .safetensors or .gguf file in this directory",
        ),
    }
}

/// What file `path` (in folder `dir`), refused as safetensors with `e`,
/// is told: when `dir` holds weights and `path` is none (`config.json`,
/// `tokenizer.json`, the model card), to pass the folder; else `e`.
pub(super) fn not_weights(path: &Path, dir: &Path, e: Error) -> Error {
    let named = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let Some(name) = named.filter(|n| !is_weights(n)) else {
        return e;
    };
    if e.rule != Rule::Container || e.file.as_deref() != Some(path) {
        return e;
    }
    let weights = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|f| {
            let other = f.file_name().to_string_lossy().into_owned();
            other != name && is_weights(&other)
        });
    match weights {
        true => Error::new(
            Rule::Argument,
            path,
            format!(
                "is one of the files of the checkpoint in {0}, not its weights; pass the folder {0}",
                dir.display()
            ),
        ),
        false => e,
    }
}

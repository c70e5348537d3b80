//! A checkpoint: safetensors shards and sidecar configs, either a directory
//! on disk (memory-mapped) or files handed over in memory with only some
//! tensors' bytes read (a browser reads its files slice by slice).

mod gguf;
mod header;
mod hints;
pub(crate) mod json;
mod listing;
mod memory;
mod origin;
mod tensor;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;

pub use gguf::Gguf;
use header::Storage;
pub use header::{parse_header, Shard};
pub use listing::{Listing, Wanted};
pub use origin::JsonFile;
use origin::Origin;
pub use tensor::TensorRef;

use crate::error::{Error, Result, Rule};

/// The shard index file name Hugging Face uses.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// A checkpoint: a directory (single file or shards + index, sidecars) or a
/// single `.safetensors` file.
pub struct Checkpoint {
    /// The directory holding the checkpoint (`.` for files handed over in memory).
    pub dir: PathBuf,
    files: Origin,
    /// True when the user named a single `.safetensors` file.
    pub single_file: bool,
    /// Shards in index order (or file-name order).
    pub shards: Vec<Shard>,
    /// The shard index, when the checkpoint has one.
    pub index: Option<JsonFile>,
    /// `config.json`, when present.
    pub config: Option<JsonFile>,
    /// `hf_quant_config.json` (ModelOpt), when present.
    pub hf_quant_config: Option<JsonFile>,
    /// `<stem>.config.yaml` beside the first shard (diffuse_compressor's
    /// SVDQuant sidecar, JSON text), when present.
    pub svdquant_config: Option<JsonFile>,
    /// `model.safetensors.index.json.meta.json` (SINQ's sidecar of each
    /// quantized module's non-tensor meta), when present.
    pub sinq_meta: Option<JsonFile>,
    /// Tensor name → index of the shard that stores it.
    lookup: BTreeMap<String, usize>,
    /// Tensors whose bytes were asked for but not loaded.
    misses: Mutex<BTreeSet<String>>,
    /// A GGUF model's metadata and ggml types.
    pub gguf: Option<Gguf>,
    /// What the checkpoint is called where it was read from, when that is
    /// not its folder: a Hub repository's pinned id (`ORG/NAME@COMMIT`,
    /// with the GGUF file picked in it).
    pub name: Option<String>,
}

/// Sidecar JSON files larger than this are refused rather than read: real
/// configs and indexes are kilobytes to a few megabytes.
const MAX_JSON_BYTES: u64 = 64 << 20;

/// SINQ's sidecar: the non-tensor meta of its quantized modules.
pub(crate) const SINQ_META: &str = "model.safetensors.index.json.meta.json";

/// The model card's name: read whole (when at most [`MAX_CARD_BYTES`]),
/// never copied as it is ([`Checkpoint::model_card`]).
pub(crate) const CARD: &str = "README.md";

/// Model cards larger than this are not read (real ones are a few kB).
const MAX_CARD_BYTES: u64 = 1 << 20;

impl Checkpoint {
    /// Opens a checkpoint directory or a single `.safetensors` file and
    /// validates every shard header and the index; its index file opens
    /// its folder. A PyTorch pickle, or another file of a checkpoint
    /// (`config.json`), is refused with a line saying what to pass.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, "cannot open", e))?;
        // A folder of several GGUF models is refused, naming them.
        if let Some(file) = crate::gguf::find_in(path, None)? {
            return Checkpoint::from_gguf(&file);
        }
        if meta.is_dir() {
            return Checkpoint::build(Origin::Disk(path.to_path_buf()), None);
        }
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        // The index lists the checkpoint's shards: it means its folder.
        if path.file_name() == Some(INDEX_FILE.as_ref()) {
            return Checkpoint::build(Origin::Disk(parent.to_path_buf()), None);
        }
        if path.to_str().is_some_and(hints::is_pickle) {
            return Err(hints::pickle(path));
        }
        Checkpoint::build(Origin::Disk(parent.to_path_buf()), Some(path))
            .map_err(|e| hints::not_weights(path, parent, e))
    }

    /// Opens a checkpoint whose files were handed over in memory, by the
    /// same rules as a directory. No tensor's bytes are there yet: planning
    /// notes the ones it reads ([`Checkpoint::take_misses`]), and
    /// [`Checkpoint::load`] adds them.
    pub fn from_listing(listing: Listing) -> Result<Checkpoint> {
        if let Some(gguf) = Checkpoint::from_gguf_listing(listing.clone())? {
            return Ok(gguf);
        }
        Checkpoint::build(Origin::Listed(listing), None)
    }

    fn build(files: Origin, single: Option<&Path>) -> Result<Checkpoint> {
        let dir = match &files {
            Origin::Disk(dir) => dir.clone(),
            Origin::Listed(_) => PathBuf::from("."),
        };
        let config = files.read_json("config.json", Rule::Config)?;
        let hf_quant_config = files.read_json("hf_quant_config.json", Rule::Config)?;

        let mut index = None;
        let shard_paths: Vec<PathBuf> = if let Some(path) = single {
            vec![path.to_path_buf()]
        } else if let Some(idx) = files.read_json(INDEX_FILE, Rule::Index)? {
            let names = index_files(&idx)?;
            if names.is_empty() {
                return Err(Error::new(
                    Rule::Index,
                    &idx.path,
                    "weight_map names no shard",
                ));
            }
            if let Some(missing) = names.iter().find(|f| !files.is_file(f)) {
                return Err(Error::new(
                    Rule::Index,
                    &idx.path,
                    format!("names shard {missing}, which does not exist"),
                ));
            }
            index = Some(idx);
            names.iter().map(|f| files.path(f)).collect()
        } else if files.is_file("model.safetensors") {
            vec![files.path("model.safetensors")]
        } else {
            let names = files.names()?;
            let found: Vec<PathBuf> = names
                .iter()
                .filter(|n| Path::new(n).extension().is_some_and(|x| x == "safetensors"))
                .map(|n| files.path(n))
                .collect();
            if found.is_empty() {
                return Err(hints::no_weights(&dir, &names));
            }
            found
        };

        if single.is_none() {
            for p in &shard_paths {
                if !files.inside(p) {
                    let rule = if index.is_some() {
                        Rule::Index
                    } else {
                        Rule::Container
                    };
                    return Err(Error::new(
                        rule,
                        p,
                        "a link leading outside the checkpoint directory; not read",
                    ));
                }
            }
        }
        let shards = shard_paths
            .iter()
            .map(|p| files.open_shard(p))
            .collect::<Result<Vec<_>>>()?;
        let mut lookup = BTreeMap::new();
        for (i, shard) in shards.iter().enumerate() {
            for name in shard.names() {
                if let Some(prev) = lookup.insert(name.clone(), i) {
                    return Err(Error::tensor(
                        Rule::DuplicateTensor,
                        &shard.path,
                        name,
                        format!("also stored in {}", shards[prev].file_name),
                    ));
                }
            }
        }
        let svdquant_config = match shards.first().and_then(|s| s.path.file_stem()) {
            Some(stem) => {
                let name = format!("{}.config.yaml", stem.to_string_lossy());
                files.read_json(&name, Rule::Config)?
            }
            None => None,
        };
        let sinq_meta = files.read_json(SINQ_META, Rule::Config)?;
        let ckpt = Checkpoint {
            dir,
            files,
            single_file: single.is_some(),
            shards,
            index,
            config,
            hf_quant_config,
            svdquant_config,
            sinq_meta,
            lookup,
            misses: Mutex::default(),
            gguf: None,
            name: None,
        };
        ckpt.check_index()?;
        Ok(ckpt)
    }

    /// Every name the index maps must be stored in the shard it names.
    fn check_index(&self) -> Result<()> {
        let Some(idx) = &self.index else {
            return Ok(());
        };
        let map = idx.value.get("weight_map").and_then(Value::as_object);
        for (name, file) in map.into_iter().flatten() {
            let file = file.as_str().unwrap_or_default();
            match self.lookup.get(name) {
                Some(&s) if self.shards[s].file_name == file => {}
                Some(&s) => {
                    return Err(Error::tensor(
                        Rule::Index,
                        &idx.path,
                        name,
                        format!(
                            "index says {file}, but it is stored in {}",
                            self.shards[s].file_name
                        ),
                    ))
                }
                None => {
                    return Err(Error::tensor(
                        Rule::Index,
                        &idx.path,
                        name,
                        format!("index says {file}, but no shard stores it"),
                    ))
                }
            }
        }
        Ok(())
    }

    /// The tensor called `name`, if any shard stores it.
    pub fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        let (name, &shard) = self.lookup.get_key_value(name)?;
        let s = &self.shards[shard];
        let info = s.table.get(name)?;
        let (a, b) = info.range;
        let (bytes, misses) = match &s.storage {
            // parse_header checked that the offsets tile the file exactly.
            Storage::Mapped(map) => (map.get(s.data_start + a..s.data_start + b)?, None),
            Storage::Partial(loaded) => match loaded.get(name) {
                Some(bytes) => (bytes.as_slice(), None),
                None => (&[][..], Some(&self.misses)),
            },
        };
        Some(TensorRef {
            name,
            shard,
            file: &s.path,
            dtype: info.dtype,
            shape: &info.shape,
            bytes,
            len: b - a,
            misses,
        })
    }

    /// Which shard file stores tensor `name`, and where in it.
    pub fn location(&self, name: &str) -> Option<(&str, std::ops::Range<u64>)> {
        let s = &self.shards[*self.lookup.get(name)?];
        // A GGUF model's shards are named for the dense files they become.
        let file = match self.gguf {
            Some(_) => s.path.to_str()?,
            None => &s.file_name,
        };
        Some((file, s.range(name)?))
    }

    /// The checkpoint's other regular files (tokenizer, generation config, …),
    /// to be copied: weights in any format, the index, config.json, the
    /// quantization sidecars (`skip`) and the record of the run that wrote
    /// this checkpoint (when this tool did) are not. Fails on a link leading
    /// out of the checkpoint directory.
    pub fn side_files(&self, skip: &[String]) -> Result<Vec<(PathBuf, String)>> {
        const SKIP: &[&str] = &[INDEX_FILE, "config.json"];
        let mut files = Vec::new();
        for name in self.files.names()? {
            let weights = is_weights(&name);
            let ours = name.starts_with(".wgpu-dequant");
            if weights || ours || SKIP.contains(&name.as_str()) || skip.contains(&name) {
                continue;
            }
            let path = self.files.path(&name);
            if !self.files.inside(&path) {
                return Err(Error::new(
                    Rule::Container,
                    &path,
                    "a link leading outside the checkpoint directory; not copied",
                ));
            }
            files.push((path, name));
        }
        Ok(files)
    }

    /// The model card beside the checkpoint ([`CARD`], UTF-8, at most 1
    /// MiB); `None` when there is none or it cannot be read, and for a
    /// GGUF file or a single `.safetensors` file, whose folder's card may
    /// be another model's.
    pub(crate) fn model_card(&self) -> Option<String> {
        if self.single_file || self.gguf.is_some() {
            return None;
        }
        let bytes = self.files.read_small(CARD, MAX_CARD_BYTES)?;
        String::from_utf8(bytes).ok()
    }

    /// The file name of the shard `arg` names: a shard's file name, or a path
    /// to one of this checkpoint's shard files (as shells complete it).
    /// Anything else is ARG-001.
    pub fn shard_file_name(&self, arg: &str) -> Result<&str> {
        if let Some(s) = self.shards.iter().find(|s| s.file_name == arg) {
            return Ok(&s.file_name);
        }
        let path = Path::new(arg);
        let named = path.file_name().map(|n| n.to_string_lossy());
        self.shards
            .iter()
            .find(|s| {
                named.as_deref() == Some(s.file_name.as_str())
                    && same_file::is_same_file(path, &s.path).unwrap_or(false)
            })
            .map(|s| s.file_name.as_str())
            .ok_or_else(|| {
                let known: Vec<&str> = self.shards.iter().map(|s| s.file_name.as_str()).collect();
                Error::bare(
                    Rule::Argument,
                    format!(
                        "--shards: {arg} is not a shard of this checkpoint ({})",
                        known.join(", ")
                    ),
                )
            })
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.lookup.keys().map(String::as_str).collect()
    }

    /// The path rejections should name when a fault concerns the whole checkpoint.
    pub fn display_path(&self) -> &Path {
        match (self.single_file, self.shards.first()) {
            (true, Some(s)) => &s.path,
            _ => &self.dir,
        }
    }
}

/// Whether file `name` holds weights in some format (safetensors, PyTorch,
/// GGUF, …): what a dense checkpoint does not copy as a side file.
pub fn is_weights(name: &str) -> bool {
    const WEIGHTS: &[&str] = &[
        "safetensors",
        "bin",
        "pt",
        "pth",
        "ckpt",
        "gguf",
        "h5",
        "msgpack",
        "onnx",
    ];
    Path::new(name)
        .extension()
        .is_some_and(|x| WEIGHTS.iter().any(|w| x.eq_ignore_ascii_case(w)))
}

/// Whether `path` (in checkpoint directory `dir`) resolves inside it, or
/// inside the `blobs` folder of a Hugging Face cache when `dir` is one of its
/// `snapshots/<revision>` folders (whose files are all links there). A link
/// anywhere else could make a checkpoint read (or copy) any file.
pub fn inside(dir: &Path, path: &Path) -> bool {
    let (Ok(root), Ok(target)) = (dir.canonicalize(), path.canonicalize()) else {
        return false;
    };
    if target.starts_with(&root) {
        return true;
    }
    let snapshots = root
        .parent()
        .filter(|p| p.file_name() == Some("snapshots".as_ref()));
    snapshots
        .and_then(Path::parent)
        .is_some_and(|repo| target.starts_with(repo.join("blobs")))
}

/// Shard file names listed by an index, sorted and without repeats; each must
/// be a plain file name (an index cannot point outside its directory).
fn index_files(idx: &JsonFile) -> Result<Vec<String>> {
    let map = idx
        .value
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::new(Rule::Index, &idx.path, "no \"weight_map\" object"))?;
    // A set: an index of n entries naming n shards is read in n log n.
    let mut files: BTreeSet<&str> = BTreeSet::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| {
            Error::tensor(Rule::Index, &idx.path, name, "shard name is not a string")
        })?;
        let plain = Path::new(file)
            .file_name()
            .is_some_and(|f| f == std::ffi::OsStr::new(file));
        if !plain || file == ".." {
            return Err(Error::tensor(
                Rule::Index,
                &idx.path,
                name,
                format!("shard name {file:?} is not a plain file name"),
            ));
        }
        files.insert(file);
    }
    Ok(files.into_iter().map(str::to_string).collect())
}

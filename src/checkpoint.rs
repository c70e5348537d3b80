//! A checkpoint on disk: memory-mapped safetensors shards and sidecar configs.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::error::{Error, Result, Rule};

/// The shard index file name Hugging Face uses.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One memory-mapped `.safetensors` file whose header has been validated.
pub struct Shard {
    /// Path of the file.
    pub path: PathBuf,
    /// File name (what an index and the output use).
    pub file_name: String,
    map: Mmap,
    data_start: usize,
    metadata: Metadata,
}

impl Shard {
    fn open(path: &Path) -> Result<Shard> {
        let file = File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
        // SAFETY: the map is read-only; as with every mmap-based reader, a file
        // truncated by another process while we run is outside our contract.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, "cannot map", e))?;
        // A name given twice would be read as one (the last); look first.
        let header = map
            .get(..8)
            .and_then(|b| usize::try_from(u64::from_le_bytes(b.try_into().ok()?)).ok())
            .and_then(|n| map.get(8..8usize.checked_add(n)?));
        if let Some(key) = header.and_then(crate::json::duplicate_key) {
            return Err(Error::new(
                Rule::Container,
                path,
                format!("header names {key} twice"),
            ));
        }
        let (n, metadata) = SafeTensors::read_metadata(&map)
            .map_err(|e| Error::new(Rule::Container, path, "invalid safetensors").caused_by(e))?;
        let file_name = path
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Shard {
            path: path.to_path_buf(),
            file_name,
            map,
            data_start: 8 + n,
            metadata,
        })
    }

    /// Tensor names in file order.
    pub fn names(&self) -> Vec<String> {
        self.metadata.offset_keys()
    }

    /// The free-form `__metadata__` of the header.
    pub fn header_metadata(&self) -> Option<&HashMap<String, String>> {
        self.metadata.metadata().as_ref()
    }
}

/// A tensor inside a shard. `data` is exactly the bytes the header describes.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Index of the shard that holds it.
    pub shard: usize,
    /// Path of that shard.
    pub file: &'a Path,
    /// Stored dtype.
    pub dtype: Dtype,
    /// Stored shape.
    pub shape: &'a [usize],
    /// Stored bytes.
    pub data: &'a [u8],
}

impl TensorRef<'_> {
    /// Number of elements.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The values of an integer tensor (I8, I16, I32, I64, U8…U32) widened to
    /// i64; empty for other dtypes (callers check the dtype first).
    pub fn ints(&self) -> Vec<i64> {
        let d = self.data;
        match self.dtype {
            Dtype::I64 => d
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
            Dtype::I32 => d
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            Dtype::U32 => d
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            Dtype::I16 => d
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as i64)
                .collect(),
            Dtype::U16 => d
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as i64)
                .collect(),
            Dtype::I8 => d.iter().map(|&b| b as i8 as i64).collect(),
            Dtype::U8 => d.iter().map(|&b| b as i64).collect(),
            _ => Vec::new(),
        }
    }

    /// The values of a float tensor (BF16, F16, F32) as f32, exactly; a
    /// TEN-002 error for other dtypes.
    pub fn floats(&self) -> Result<Vec<f32>> {
        let (size, read) = crate::numerics::float_reader(self.dtype).ok_or_else(|| {
            self.error(
                Rule::TensorDtype,
                format!("dtype {:?}, expected BF16, F16 or F32", self.dtype),
            )
        })?;
        Ok(self.data.chunks_exact(size).map(read).collect())
    }

    /// An error about this tensor.
    pub fn error(&self, rule: Rule, detail: impl Into<String>) -> Error {
        Error::tensor(rule, self.file, self.name, detail)
    }
}

/// A JSON sidecar file and its parsed contents.
#[derive(Debug, Clone)]
pub struct JsonFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// What it holds.
    pub value: Value,
}

/// A checkpoint: a directory (single file or shards + index, sidecars) or a
/// single `.safetensors` file.
pub struct Checkpoint {
    /// The directory holding the checkpoint.
    pub dir: PathBuf,
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
    /// Tensor name → index of the shard that stores it.
    lookup: BTreeMap<String, usize>,
}

/// Sidecar JSON files larger than this are refused rather than read: real
/// configs and indexes are kilobytes to a few megabytes.
const MAX_JSON_BYTES: u64 = 64 << 20;

/// Reads a JSON sidecar; `rule` is the one its faults break (ST-002 for the
/// index, CFG-001 for configs).
fn read_json(path: &Path, rule: Rule) -> Result<Option<JsonFile>> {
    if !path.is_file() {
        return Ok(None);
    }
    let len = std::fs::metadata(path)
        .map_err(|e| Error::io(path, "cannot read", e))?
        .len();
    if len > MAX_JSON_BYTES {
        return Err(Error::new(
            rule,
            path,
            format!("{len} bytes; a config or index over {MAX_JSON_BYTES} bytes is not read"),
        ));
    }
    if let Some(dir) = path.parent() {
        if !inside(dir, path) {
            return Err(Error::new(
                rule,
                path,
                "a link leading outside the checkpoint directory; not read",
            ));
        }
    }
    let text = std::fs::read(path).map_err(|e| Error::io(path, "cannot read", e))?;
    let value = serde_json::from_slice(&text)
        .map_err(|e| Error::new(rule, path, "invalid JSON").caused_by(e))?;
    if let Some(key) = crate::json::duplicate_key(&text) {
        return Err(Error::new(rule, path, format!("{key} is given twice")));
    }
    Ok(Some(JsonFile {
        path: path.to_path_buf(),
        value,
    }))
}

impl Checkpoint {
    /// Opens a checkpoint directory or a single `.safetensors` file and
    /// validates every shard header and the index.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, "cannot open", e))?;
        let (dir, single_file) = if meta.is_dir() {
            (path.to_path_buf(), false)
        } else {
            let parent = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            (parent.to_path_buf(), true)
        };
        let config = read_json(&dir.join("config.json"), Rule::Config)?;
        let hf_quant_config = read_json(&dir.join("hf_quant_config.json"), Rule::Config)?;

        let mut index = None;
        let shard_paths: Vec<PathBuf> = if single_file {
            vec![path.to_path_buf()]
        } else if let Some(idx) = read_json(&dir.join(INDEX_FILE), Rule::Index)? {
            let files = index_files(&idx)?;
            if files.is_empty() {
                return Err(Error::new(
                    Rule::Index,
                    &idx.path,
                    "weight_map names no shard",
                ));
            }
            if let Some(missing) = files.iter().find(|f| !dir.join(f).is_file()) {
                return Err(Error::new(
                    Rule::Index,
                    &idx.path,
                    format!("names shard {missing}, which does not exist"),
                ));
            }
            index = Some(idx);
            files.into_iter().map(|f| dir.join(f)).collect()
        } else if dir.join("model.safetensors").is_file() {
            vec![dir.join("model.safetensors")]
        } else {
            let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map_err(|e| Error::io(&dir, "cannot list", e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(Error::new(
                    Rule::Container,
                    &dir,
                    "no .safetensors file in this directory",
                ));
            }
            found
        };

        if !single_file {
            for p in &shard_paths {
                if !inside(&dir, p) {
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
            .map(|p| Shard::open(p))
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
                let mut name = stem.to_os_string();
                name.push(".config.yaml");
                read_json(&dir.join(name), Rule::Config)?
            }
            None => None,
        };
        let ckpt = Checkpoint {
            dir,
            single_file,
            shards,
            index,
            config,
            hf_quant_config,
            svdquant_config,
            lookup,
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
        let info = s.metadata.info(name)?;
        let (a, b) = info.data_offsets;
        // read_metadata checked that the offsets tile the file exactly.
        let data = s.map.get(s.data_start + a..s.data_start + b)?;
        Some(TensorRef {
            name,
            shard,
            file: &s.path,
            dtype: info.dtype,
            shape: &info.shape,
            data,
        })
    }

    /// Drops the pages of `bytes` (a range of a shard) from this process's
    /// resident memory: they were read and will not be needed again soon.
    /// They stay in the OS page cache and are read back from the file if
    /// touched again, so this only bounds memory; bytes outside every shard
    /// are ignored.
    pub fn release(&self, bytes: &[u8]) {
        #[cfg(unix)]
        for s in &self.shards {
            let base = s.map.as_ptr() as usize;
            let at = bytes.as_ptr() as usize;
            if at >= base && at + bytes.len() <= base + s.map.len() && !bytes.is_empty() {
                // SAFETY: the map is a read-only view of a file. MADV_DONTNEED
                // on it only discards resident pages; a later read faults the
                // same bytes back in from the file, so every `&[u8]` into the
                // map keeps seeing the same contents.
                let _ = unsafe {
                    s.map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        at - base,
                        bytes.len(),
                    )
                };
                return;
            }
        }
        #[cfg(not(unix))]
        let _ = bytes;
    }

    /// The checkpoint's other regular files (tokenizer, generation config, …),
    /// to be copied: weights in any format, the index, config.json and the
    /// quantization sidecars (`skip`) are not. Fails on a link leading out of the
    /// checkpoint directory.
    pub fn side_files(&self, skip: &[String]) -> Result<Vec<(PathBuf, String)>> {
        const SKIP: &[&str] = &[INDEX_FILE, "config.json"];
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
        let entries =
            std::fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, "cannot list", e))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&self.dir, "cannot list", e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            // is_file follows symlinks: Hugging Face cache snapshots are all links.
            let is_file = path.is_file();
            let weights = Path::new(&name)
                .extension()
                .is_some_and(|x| WEIGHTS.iter().any(|w| x.eq_ignore_ascii_case(w)));
            if !is_file || weights || SKIP.contains(&name.as_str()) || skip.contains(&name) {
                continue;
            }
            if !inside(&self.dir, &path) {
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
    let mut files: Vec<String> = Vec::new();
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
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
    }
    files.sort();
    Ok(files)
}

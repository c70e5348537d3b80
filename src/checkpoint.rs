//! A checkpoint: safetensors shards and sidecar configs, either a directory
//! on disk (memory-mapped) or files handed over in memory with only some
//! tensors' bytes read (a browser reads its files slice by slice).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensorError};
use serde_json::Value;

use crate::error::{Context, Error, Result, ResultExt, Rule};

/// The shard index file name Hugging Face uses.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The largest safetensors header read, as the `safetensors` crate allows.
const MAX_HEADER: usize = 100_000_000;

/// Where a shard's tensor bytes are.
enum Storage {
    /// The whole file, memory-mapped.
    Mapped(Mmap),
    /// The tensors read so far, by name ([`Checkpoint::load`]).
    Partial(HashMap<String, Vec<u8>>),
}

/// One `.safetensors` file whose header has been validated.
pub struct Shard {
    /// Path of the file.
    pub path: PathBuf,
    /// File name (what an index and the output use).
    pub file_name: String,
    storage: Storage,
    data_start: usize,
    metadata: Metadata,
}

/// The header of a safetensors file of `file_len` bytes, from its first
/// bytes (at least the header's): where the tensor data starts, and the
/// validated metadata, whose offsets must tile the rest of the file.
pub fn parse_header(path: &Path, head: &[u8], file_len: u64) -> Result<(usize, Metadata)> {
    let invalid =
        |e: SafeTensorError| Error::new(Rule::Container, path, "invalid safetensors").caused_by(e);
    let n = head
        .get(..8)
        .and_then(|b| usize::try_from(u64::from_le_bytes(b.try_into().ok()?)).ok())
        .ok_or_else(|| invalid(SafeTensorError::HeaderTooSmall))?;
    if n > MAX_HEADER {
        return Err(invalid(SafeTensorError::HeaderTooLarge));
    }
    let text = head
        .get(8..8 + n)
        .ok_or_else(|| invalid(SafeTensorError::InvalidHeaderLength))?;
    // A name given twice would be read as one (the last); look first.
    if let Some(key) = crate::json::duplicate_key(text) {
        return Err(Error::new(
            Rule::Container,
            path,
            format!("header names {key} twice"),
        ));
    }
    let text = std::str::from_utf8(text).map_err(|e| invalid(SafeTensorError::InvalidHeader(e)))?;
    // Deserializing validates the offsets: contiguous, sized by dtype and shape.
    let metadata: Metadata = serde_json::from_str(text)
        .map_err(|e| invalid(SafeTensorError::InvalidHeaderDeserialization(e)))?;
    let end = metadata
        .tensors()
        .values()
        .map(|t| t.data_offsets.1)
        .max()
        .unwrap_or(0);
    if (8 + n) as u64 + end as u64 != file_len {
        return Err(invalid(SafeTensorError::MetadataIncompleteBuffer));
    }
    Ok((8 + n, metadata))
}

impl Shard {
    fn open(path: &Path) -> Result<Shard> {
        let file = File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
        // SAFETY: the map is read-only; as with every mmap-based reader, a file
        // truncated by another process while we run is outside our contract.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, "cannot map", e))?;
        let (data_start, metadata) = parse_header(path, &map, map.len() as u64)?;
        Ok(Shard::new(path, Storage::Mapped(map), data_start, metadata))
    }

    fn new(path: &Path, storage: Storage, data_start: usize, metadata: Metadata) -> Shard {
        let file_name = path
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Shard {
            path: path.to_path_buf(),
            file_name,
            storage,
            data_start,
            metadata,
        }
    }

    /// Tensor names in file order.
    pub fn names(&self) -> Vec<String> {
        self.metadata.offset_keys()
    }

    /// The free-form `__metadata__` of the header.
    pub fn header_metadata(&self) -> Option<&HashMap<String, String>> {
        self.metadata.metadata().as_ref()
    }

    /// Where tensor `name`'s bytes lie in the file.
    pub fn range(&self, name: &str) -> Option<std::ops::Range<u64>> {
        let (a, b) = self.metadata.info(name)?.data_offsets;
        Some((self.data_start + a) as u64..(self.data_start + b) as u64)
    }
}

/// A tensor inside a shard.
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
    /// The stored bytes: exactly the header's range, or empty when they have
    /// not been read ([`Checkpoint::load`]).
    bytes: &'a [u8],
    /// Byte length, from the header.
    len: usize,
    /// Where a read of bytes that are not there is noted.
    misses: Option<&'a Mutex<BTreeSet<String>>>,
}

impl<'a> TensorRef<'a> {
    /// A tensor made of bytes at hand, for unit tests.
    #[cfg(test)]
    pub(crate) fn of_bytes(
        name: &'a str,
        dtype: Dtype,
        shape: &'a [usize],
        bytes: &'a [u8],
    ) -> Self {
        TensorRef {
            name,
            shard: 0,
            file: Path::new("x"),
            dtype,
            shape,
            bytes,
            len: bytes.len(),
            misses: None,
        }
    }

    /// Number of elements.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size of the stored bytes, from the header (known before they are read).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the tensor stores no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether its bytes are at hand (always, for a checkpoint on disk).
    pub fn is_loaded(&self) -> bool {
        self.misses.is_none()
    }

    /// The stored bytes, to be read now. Of a partly read checkpoint, bytes
    /// that are not there yet are an error, and are noted so that the caller
    /// can read them and plan again ([`Checkpoint::take_misses`]).
    pub fn data(&self) -> Result<&'a [u8]> {
        match self.misses {
            None => Ok(self.bytes),
            Some(misses) => {
                if let Ok(mut m) = misses.lock() {
                    m.insert(self.name.to_string());
                }
                Err(self.error(Rule::Io, "bytes not read yet"))
            }
        }
    }

    /// The stored bytes to be read later, when the tensor is written or
    /// decoded: empty while they are not loaded, and not noted as a miss.
    pub fn stored(&self) -> &'a [u8] {
        self.bytes
    }

    /// The values of an integer tensor (I8, I16, I32, I64, U8…U32) widened to
    /// i64; empty for other dtypes (callers check the dtype first).
    pub fn ints(&self) -> Result<Vec<i64>> {
        let d = self.data()?;
        Ok(match self.dtype {
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
        })
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
        Ok(self.data()?.chunks_exact(size).map(read).collect())
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

/// The files of a checkpoint handed over in memory (a browser's `File`s):
/// each file's size, and the first bytes of those read while opening it
/// (sidecars whole, `.safetensors` headers; see [`Listing::wants`]).
#[derive(Debug, Clone, Default)]
pub struct Listing {
    files: BTreeMap<String, (u64, Vec<u8>)>,
}

/// How much of a file [`Checkpoint::from_listing`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// Nothing: the file is copied or ignored.
    Nothing,
    /// All of it (a JSON or YAML sidecar of a readable size).
    Whole,
    /// Its safetensors header: the first 8 bytes say how long it is
    /// ([`Listing::header_len`]).
    Header,
}

impl Listing {
    /// Adds file `name` of `len` bytes, of which `head` are its first.
    pub fn add(&mut self, name: impl Into<String>, len: u64, head: Vec<u8>) {
        self.files.insert(name.into(), (len, head));
    }

    /// How much of file `name` (`len` bytes) to read before opening.
    pub fn wants(name: &str, len: u64) -> Wanted {
        let ext = Path::new(name).extension().and_then(|x| x.to_str());
        match ext {
            Some("safetensors") => Wanted::Header,
            Some("json" | "yaml") if len <= MAX_JSON_BYTES => Wanted::Whole,
            _ => Wanted::Nothing,
        }
    }

    /// From a safetensors file's first 8 bytes, how many bytes its header
    /// takes (those 8 included), capped at `len` and at what the reader accepts.
    pub fn header_len(first: &[u8], len: u64) -> u64 {
        let n = first
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes);
        n.min(MAX_HEADER as u64).saturating_add(8).min(len)
    }
}

/// Where the checkpoint's files are.
enum Files {
    /// In this directory on disk.
    Disk(PathBuf),
    /// Handed over in memory.
    Listed(Listing),
}

impl Files {
    fn path(&self, name: &str) -> PathBuf {
        match self {
            Files::Disk(dir) => dir.join(name),
            Files::Listed(_) => PathBuf::from(name),
        }
    }

    fn is_file(&self, name: &str) -> bool {
        match self {
            Files::Disk(dir) => dir.join(name).is_file(),
            Files::Listed(l) => l.files.contains_key(name),
        }
    }

    /// Names of the regular files (links followed: Hugging Face cache
    /// snapshots are all links), sorted.
    fn names(&self) -> Result<Vec<String>> {
        match self {
            Files::Disk(dir) => {
                let entries: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)
                    .and_then(|d| d.collect())
                    .map_err(|e| Error::io(dir, "cannot list", e))?;
                let mut names: Vec<String> = entries
                    .iter()
                    .filter(|e| e.path().is_file())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                Ok(names)
            }
            Files::Listed(l) => Ok(l.files.keys().cloned().collect()),
        }
    }

    /// Whether `path` resolves inside the checkpoint ([`inside`]); files
    /// handed over in memory are what they are.
    fn inside(&self, path: &Path) -> bool {
        match self {
            Files::Disk(dir) => inside(dir, path),
            Files::Listed(_) => true,
        }
    }

    /// Reads JSON sidecar `name`; `rule` is the one its faults break (ST-002
    /// for the index, CFG-001 for configs).
    fn read_json(&self, name: &str, rule: Rule) -> Result<Option<JsonFile>> {
        if !self.is_file(name) {
            return Ok(None);
        }
        let path = self.path(name);
        let too_big = |len: u64| {
            Error::new(
                rule,
                &path,
                format!("{len} bytes; a config or index over {MAX_JSON_BYTES} bytes is not read"),
            )
        };
        let text = match self {
            Files::Disk(dir) => {
                let len = std::fs::metadata(&path)
                    .map_err(|e| Error::io(&path, "cannot read", e))?
                    .len();
                if len > MAX_JSON_BYTES {
                    return Err(too_big(len));
                }
                if !inside(dir, &path) {
                    return Err(Error::new(
                        rule,
                        &path,
                        "a link leading outside the checkpoint directory; not read",
                    ));
                }
                std::fs::read(&path).map_err(|e| Error::io(&path, "cannot read", e))?
            }
            Files::Listed(l) => match l.files.get(name) {
                Some((len, _)) if *len > MAX_JSON_BYTES => return Err(too_big(*len)),
                Some((len, head)) if head.len() as u64 == *len => head.clone(),
                _ => return Err(Error::new(rule, &path, "was not read")),
            },
        };
        let value = serde_json::from_slice(&text)
            .context(rule, "invalid JSON")
            .with_file(&path)?;
        if let Some(key) = crate::json::duplicate_key(&text) {
            return Err(Error::new(rule, &path, format!("{key} is given twice")));
        }
        Ok(Some(JsonFile { path, value }))
    }

    fn open_shard(&self, path: &Path) -> Result<Shard> {
        match self {
            Files::Disk(_) => Shard::open(path),
            Files::Listed(l) => {
                let name = path.to_string_lossy();
                let (len, head) = l
                    .files
                    .get(name.as_ref())
                    .ok_or_else(|| Error::new(Rule::Container, path, "was not handed over"))?;
                let (data_start, metadata) = parse_header(path, head, *len)?;
                let storage = Storage::Partial(HashMap::new());
                Ok(Shard::new(path, storage, data_start, metadata))
            }
        }
    }
}

/// A checkpoint: a directory (single file or shards + index, sidecars) or a
/// single `.safetensors` file.
pub struct Checkpoint {
    /// The directory holding the checkpoint (`.` for files handed over in memory).
    pub dir: PathBuf,
    files: Files,
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
    /// Tensors whose bytes were asked for but not loaded.
    misses: Mutex<BTreeSet<String>>,
}

/// Sidecar JSON files larger than this are refused rather than read: real
/// configs and indexes are kilobytes to a few megabytes.
const MAX_JSON_BYTES: u64 = 64 << 20;

impl Checkpoint {
    /// Opens a checkpoint directory or a single `.safetensors` file and
    /// validates every shard header and the index.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, "cannot open", e))?;
        if meta.is_dir() {
            return Checkpoint::build(Files::Disk(path.to_path_buf()), None);
        }
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        Checkpoint::build(Files::Disk(parent.to_path_buf()), Some(path))
    }

    /// Opens a checkpoint whose files were handed over in memory, by the
    /// same rules as a directory. No tensor's bytes are there yet: planning
    /// notes the ones it reads ([`Checkpoint::take_misses`]), and
    /// [`Checkpoint::load`] adds them.
    pub fn from_listing(listing: Listing) -> Result<Checkpoint> {
        Checkpoint::build(Files::Listed(listing), None)
    }

    fn build(files: Files, single: Option<&Path>) -> Result<Checkpoint> {
        let dir = match &files {
            Files::Disk(dir) => dir.clone(),
            Files::Listed(_) => PathBuf::from("."),
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
            let found: Vec<PathBuf> = files
                .names()?
                .iter()
                .filter(|n| Path::new(n).extension().is_some_and(|x| x == "safetensors"))
                .map(|n| files.path(n))
                .collect();
            if found.is_empty() {
                return Err(Error::new(
                    Rule::Container,
                    &dir,
                    "no .safetensors file in this directory",
                ));
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
        let ckpt = Checkpoint {
            dir,
            files,
            single_file: single.is_some(),
            shards,
            index,
            config,
            hf_quant_config,
            svdquant_config,
            lookup,
            misses: Mutex::default(),
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
        Some((&s.file_name, s.range(name)?))
    }

    /// Bytes of tensors loaded so far ([`Checkpoint::load`]).
    pub fn loaded_bytes(&self) -> usize {
        let partial = self.shards.iter().filter_map(|s| match &s.storage {
            Storage::Partial(loaded) => Some(loaded.values().map(Vec::len).sum::<usize>()),
            Storage::Mapped(_) => None,
        });
        partial.sum()
    }

    /// Adds the bytes of tensor `name` to a checkpoint handed over in memory
    /// ([`Checkpoint::from_listing`]); they must be exactly its stored bytes.
    pub fn load(&mut self, name: &str, bytes: Vec<u8>) -> Result<()> {
        let len = self.get(name).map(|t| t.len());
        let shard = self.lookup.get(name).map(|&s| &mut self.shards[s]);
        match (shard, len) {
            (Some(s), Some(len)) if len == bytes.len() => match &mut s.storage {
                Storage::Partial(loaded) => {
                    loaded.insert(name.to_string(), bytes);
                    Ok(())
                }
                Storage::Mapped(_) => Ok(()),
            },
            _ => Err(Error::tensor(
                Rule::Io,
                self.display_path(),
                name,
                format!("{} bytes handed over, not its stored bytes", bytes.len()),
            )),
        }
    }

    /// Drops the loaded bytes of every tensor but those `keep` names.
    pub fn unload(&mut self, keep: impl Fn(&str) -> bool) {
        for s in &mut self.shards {
            if let Storage::Partial(loaded) = &mut s.storage {
                loaded.retain(|name, _| keep(name));
            }
        }
    }

    /// The tensors whose bytes were asked for ([`TensorRef::data`]) but not
    /// loaded since the last call, sorted.
    pub fn take_misses(&self) -> Vec<String> {
        self.misses
            .lock()
            .map(|mut m| std::mem::take(&mut *m).into_iter().collect())
            .unwrap_or_default()
    }

    /// Drops the pages of `bytes` (a range of a shard) from this process's
    /// resident memory: they were read and will not be needed again soon.
    /// They stay in the OS page cache and are read back from the file if
    /// touched again, so this only bounds memory; bytes outside every shard
    /// are ignored.
    pub fn release(&self, bytes: &[u8]) {
        self.release_all([bytes]);
    }

    /// [`Checkpoint::release`] of many ranges: neighbouring ones in a shard
    /// (a batch's tensors lie side by side in the file) go in one call, as
    /// each call may interrupt every core.
    pub fn release_all<'b>(&self, ranges: impl IntoIterator<Item = &'b [u8]>) {
        #[cfg(unix)]
        {
            const GAP: usize = 1 << 16;
            // (shard, start, end) as offsets into the shard's map.
            let mut spans: Vec<(usize, usize, usize)> = Vec::new();
            for b in ranges {
                let at = b.as_ptr() as usize;
                let found = self
                    .shards
                    .iter()
                    .enumerate()
                    .find_map(|(i, s)| match &s.storage {
                        Storage::Mapped(map) => {
                            let base = map.as_ptr() as usize;
                            (at >= base && at + b.len() <= base + map.len())
                                .then(|| (i, at - base, at - base + b.len()))
                        }
                        _ => None,
                    });
                spans.extend(found.filter(|(_, lo, hi)| hi > lo));
            }
            spans.sort_unstable();
            let mut merged: Vec<(usize, usize, usize)> = Vec::new();
            for (i, lo, hi) in spans {
                match merged.last_mut() {
                    Some(last) if last.0 == i && lo <= last.2.saturating_add(GAP) => {
                        last.2 = last.2.max(hi)
                    }
                    _ => merged.push((i, lo, hi)),
                }
            }
            for (i, lo, hi) in merged {
                if let Storage::Mapped(map) = &self.shards[i].storage {
                    // SAFETY: the map is a read-only view of a file.
                    // MADV_DONTNEED on it only discards resident pages; a later
                    // read faults the same bytes back in from the file, so every
                    // `&[u8]` into the map keeps seeing the same contents.
                    let _ = unsafe {
                        map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo)
                    };
                }
            }
        }
        #[cfg(not(unix))]
        let _ = ranges;
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
        let mut files = Vec::new();
        for name in self.files.names()? {
            let weights = Path::new(&name)
                .extension()
                .is_some_and(|x| WEIGHTS.iter().any(|w| x.eq_ignore_ascii_case(w)));
            if weights || SKIP.contains(&name.as_str()) || skip.contains(&name) {
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

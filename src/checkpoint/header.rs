//! The safetensors container: a shard's header, validated, and where its
//! tensor bytes are (mapped, or read so far).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::SafeTensorError;

use crate::error::{Error, Result, Rule};

/// The largest safetensors header read, as the `safetensors` crate allows.
pub(super) const MAX_HEADER: usize = 100_000_000;

/// Where a shard's tensor bytes are.
pub(super) enum Storage {
    /// The whole file, memory-mapped.
    Mapped(Mmap),
    /// The tensors read so far, by name ([`Checkpoint::load`](super::Checkpoint::load)).
    Partial(HashMap<String, Vec<u8>>),
}

/// One `.safetensors` file whose header has been validated (or a GGUF
/// file, its tensors read as safetensors would store them).
pub struct Shard {
    /// Path of the file.
    pub path: PathBuf,
    /// File name (what an index and the output use).
    pub file_name: String,
    pub(super) storage: Storage,
    pub(super) data_start: usize,
    pub(super) table: Table,
}

/// A shard's tensors: dtype, shape and byte range from the data start,
/// in file order, and the header's free-form metadata.
pub(super) struct Table {
    names: Vec<String>,
    entries: HashMap<String, Entry>,
    metadata: Option<HashMap<String, String>>,
}

/// One tensor of a [`Table`].
pub(super) struct Entry {
    pub(super) dtype: safetensors::Dtype,
    pub(super) shape: Vec<usize>,
    /// Its bytes, from the shard's data start.
    pub(super) range: (usize, usize),
}

impl Table {
    /// The table of a validated safetensors header.
    fn of(metadata: Metadata) -> Table {
        let names = metadata.offset_keys();
        let entries = names
            .iter()
            .filter_map(|n| {
                let i = metadata.info(n)?;
                let entry = Entry {
                    dtype: i.dtype,
                    shape: i.shape.clone(),
                    range: i.data_offsets,
                };
                Some((n.clone(), entry))
            })
            .collect();
        Table {
            names,
            entries,
            metadata: metadata.metadata().clone(),
        }
    }

    /// A table of `tensors` (name, entry), in file order; ranges checked by
    /// the caller.
    pub(super) fn new(tensors: Vec<(String, Entry)>) -> Table {
        Table {
            names: tensors.iter().map(|(n, _)| n.clone()).collect(),
            entries: tensors.into_iter().collect(),
            metadata: None,
        }
    }

    pub(super) fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }
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
    if let Some(key) = super::json::duplicate_key(text) {
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
    pub(super) fn open(path: &Path) -> Result<Shard> {
        let file = File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
        // SAFETY: the map is read-only; as with every mmap-based reader, a file
        // truncated by another process while we run is outside our contract.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, "cannot map", e))?;
        let (data_start, metadata) = parse_header(path, &map, map.len() as u64)?;
        Ok(Shard::new(path, Storage::Mapped(map), data_start, metadata))
    }

    pub(super) fn new(
        path: &Path,
        storage: Storage,
        data_start: usize,
        metadata: Metadata,
    ) -> Shard {
        Shard::new_table(path, storage, data_start, Table::of(metadata))
    }

    /// A shard of the tensors of `table`.
    pub(super) fn new_table(
        path: &Path,
        storage: Storage,
        data_start: usize,
        table: Table,
    ) -> Shard {
        let file_name = path
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Shard {
            path: path.to_path_buf(),
            file_name,
            storage,
            data_start,
            table,
        }
    }

    /// Tensor names in file order.
    pub fn names(&self) -> Vec<String> {
        self.table.names.clone()
    }

    /// The free-form `__metadata__` of the header.
    pub fn header_metadata(&self) -> Option<&HashMap<String, String>> {
        self.table.metadata.as_ref()
    }

    /// The file's bytes up to the end of its last tensor: its size, as its
    /// header tells it (the same whether the file is mapped or read piece
    /// by piece; a GGUF file's padding after its last tensor aside).
    pub fn stored_len(&self) -> u64 {
        let end = self.table.entries.values().map(|e| e.range.1).max();
        (self.data_start + end.unwrap_or(0)) as u64
    }

    /// Where tensor `name`'s bytes lie in the file.
    pub fn range(&self, name: &str) -> Option<std::ops::Range<u64>> {
        let (a, b) = self.table.get(name)?.range;
        Some((self.data_start + a) as u64..(self.data_start + b) as u64)
    }
}

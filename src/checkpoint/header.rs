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

/// One `.safetensors` file whose header has been validated.
pub struct Shard {
    /// Path of the file.
    pub path: PathBuf,
    /// File name (what an index and the output use).
    pub file_name: String,
    pub(super) storage: Storage,
    pub(super) data_start: usize,
    pub(super) metadata: Metadata,
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

    pub(super) fn new(path: &Path, storage: Storage, data_start: usize, metadata: Metadata) -> Shard {
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

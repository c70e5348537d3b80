//! The files of a checkpoint handed over in memory (a browser reads its
//! files slice by slice): what to read of each before opening.

use std::collections::BTreeMap;
use std::path::Path;

use super::header::MAX_HEADER;
use super::MAX_JSON_BYTES;

/// each file's size, and the first bytes of those read while opening it
/// (sidecars whole, `.safetensors` headers; see [`Listing::wants`]).
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub(super) files: BTreeMap<String, (u64, Vec<u8>)>,
}

/// How much of a file [`Checkpoint::from_listing`](super::Checkpoint::from_listing) reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// Nothing: the file is copied or ignored.
    Nothing,
    /// All of it (a JSON or YAML sidecar, or the model card, of a
    /// readable size).
    Whole,
    /// Its safetensors header: the first 8 bytes say how long it is
    /// ([`Listing::header_len`]).
    Header,
    /// Its GGUF header: a prefix growing until it parses
    /// ([`Listing::gguf_prefix`]).
    GgufHeader,
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
            Some("gguf") => Wanted::GgufHeader,
            Some("json" | "yaml") if len <= MAX_JSON_BYTES => Wanted::Whole,
            Some("md") if name == super::CARD && len <= super::MAX_CARD_BYTES => Wanted::Whole,
            _ => Wanted::Nothing,
        }
    }

    /// How many bytes of GGUF file `name` (`len` bytes) to have read next,
    /// when its first `head` bytes do not hold its whole header yet;
    /// `None` once they do.
    pub fn gguf_prefix(name: &str, len: u64, head: &[u8]) -> crate::error::Result<Option<u64>> {
        let path = Path::new(name);
        if !head.is_empty() && crate::gguf::parse_prefix(head, len, path)?.is_some() {
            return Ok(None);
        }
        crate::gguf::header_prefix(head.len() as u64, len, path).map(Some)
    }

    /// The size and first bytes read of file `name`.
    pub(crate) fn get(&self, name: &str) -> Option<(u64, &[u8])> {
        self.files
            .get(name)
            .map(|(len, head)| (*len, head.as_slice()))
    }

    /// Every file's name.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
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

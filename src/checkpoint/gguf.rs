//! A GGUF model as a checkpoint: each of its files a shard, each tensor
//! stored as safetensors would hold it (F32, F16, BF16 and the integer
//! types as themselves, row-major; a quantized one as U8
//! `[..., row bytes]`), its ggml type and logical shape kept beside.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use safetensors::Dtype;

use super::header::{Entry, Shard, Storage, Table};
use super::origin::Origin;
use super::{Checkpoint, Listing};
use crate::error::{Error, Result, Rule};
use crate::gguf::{GgmlType, Headers, MetaValue, Model, Tensor};

pub use crate::gguf::Gguf;

/// The safetensors dtype a ggml type is stored as itself in, if any.
fn plain(ty: GgmlType) -> Option<Dtype> {
    Some(match ty {
        GgmlType::F32 => Dtype::F32,
        GgmlType::F16 => Dtype::F16,
        GgmlType::BF16 => Dtype::BF16,
        GgmlType::F64 => Dtype::F64,
        GgmlType::I8 => Dtype::I8,
        GgmlType::I16 => Dtype::I16,
        GgmlType::I32 => Dtype::I32,
        GgmlType::I64 => Dtype::I64,
        _ => return None,
    })
}

impl Checkpoint {
    /// Opens the GGUF model at `path` (a split one from any of its parts).
    pub(super) fn from_gguf(path: &Path) -> Result<Checkpoint> {
        let model = Model::open(path)?;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let version = model.files.first().map_or(0, |f| f.version);
        let files = model
            .files
            .into_iter()
            .map(|f| (f.path.clone(), Storage::Mapped(f.into_map())))
            .collect();
        Ok(Checkpoint::of_gguf(
            Origin::Disk(dir.clone()),
            dir,
            files,
            version,
            model.metadata,
            &model.tensors,
        ))
    }

    /// The GGUF model whose headers alone were read (a browser's `File`s, a
    /// Hub repository's files by range requests), its files those of
    /// `origin`: planning and `inspect` need no tensor bytes; none is
    /// loaded until [`Checkpoint::load`] adds it.
    fn of_gguf_headers(headers: Headers, origin: Origin) -> Checkpoint {
        let version = headers.files.first().map_or(0, |f| f.version);
        let files = headers
            .files
            .iter()
            .map(|f| (f.path.clone(), Storage::Partial(Default::default())))
            .collect();
        Checkpoint::of_gguf(
            origin,
            PathBuf::from("."),
            files,
            version,
            headers.metadata,
            &headers.tensors,
        )
    }

    /// The GGUF model among files handed over in memory, when they hold
    /// one and no safetensors: its headers are the listing's
    /// ([`Wanted::GgufHeader`](super::Wanted::GgufHeader)); several
    /// models are refused, listed.
    pub(super) fn from_gguf_listing(listing: Listing) -> Result<Option<Checkpoint>> {
        if listing.names().any(|n| n.ends_with(".safetensors")) {
            return Ok(None);
        }
        let found = crate::gguf::pick::candidates(listing.names());
        if found.is_empty() {
            return Ok(None);
        }
        let pick = crate::gguf::pick::Pick::default();
        let model = crate::gguf::pick::choose(&found, pick)
            .map_err(|why| Error::bare(Rule::Argument, why))?;
        let headers = Headers::read(Path::new(&model.first), |p| {
            let name = p.to_string_lossy();
            let (len, head) = listing
                .get(&name)
                .ok_or_else(|| Error::new(Rule::GgufSplit, p, "is not among the files given"))?;
            crate::gguf::parse_prefix(head, len, p)?
                .ok_or_else(|| Error::new(Rule::Gguf, p, "its header was not read whole"))
        })?;
        Ok(Some(Checkpoint::of_gguf_headers(
            headers,
            Origin::Listed(listing),
        )))
    }

    /// A GGUF model's checkpoint: its `files` (path, bytes) in split order.
    fn of_gguf(
        origin: Origin,
        dir: PathBuf,
        files: Vec<(PathBuf, Storage)>,
        version: u32,
        metadata: Vec<(String, MetaValue)>,
        all: &[Tensor],
    ) -> Checkpoint {
        let (mut tensors, mut lookup) = (BTreeMap::new(), BTreeMap::new());
        let mut tables: Vec<Vec<(String, Entry)>> = files.iter().map(|_| Vec::new()).collect();
        for t in all {
            let (dtype, shape) = match plain(t.ty) {
                Some(d) => (d, t.shape.clone()),
                None => {
                    let mut shape = t.shape.clone();
                    let rows: usize = shape.iter().rev().skip(1).product();
                    if let Some(last) = shape.last_mut() {
                        *last = (t.size as usize) / rows.max(1);
                    }
                    (Dtype::U8, shape)
                }
            };
            let (a, b) = (t.offset as usize, (t.offset + t.size) as usize);
            tables[t.file].push((
                t.name.clone(),
                Entry {
                    dtype,
                    shape,
                    range: (a, b),
                },
            ));
            tensors.insert(t.name.clone(), (t.ty, t.shape.clone()));
            lookup.insert(t.name.clone(), t.file);
        }
        let count = files.len();
        let shards = files
            .into_iter()
            .zip(tables)
            .enumerate()
            .map(|(i, ((path, storage), mut table))| {
                table.sort_by_key(|(_, e)| e.range.0);
                // Offsets are from the start of the file.
                let mut shard = Shard::new_table(&path, storage, 0, Table::new(table));
                // What the dense checkpoint's file is called.
                shard.file_name = match count {
                    1 => "model.safetensors".to_string(),
                    n => format!("model-{:05}-of-{n:05}.safetensors", i + 1),
                };
                shard
            })
            .collect();
        Checkpoint {
            dir,
            files: origin,
            single_file: true,
            shards,
            index: None,
            config: None,
            hf_quant_config: None,
            svdquant_config: None,
            sinq_meta: None,
            lookup,
            misses: Mutex::new(BTreeSet::new()),
            gguf: Some(Gguf {
                version,
                metadata,
                tensors,
            }),
            name: None,
        }
    }
}

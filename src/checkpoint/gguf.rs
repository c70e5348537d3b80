//! A GGUF model as a checkpoint: each of its files a shard, each tensor
//! stored as safetensors would hold it (F32, F16, BF16 and the integer
//! types as themselves, row-major; a quantized one as U8
//! `[..., row bytes]`), its ggml type and logical shape kept beside.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;

use safetensors::Dtype;

use super::header::{Entry, Shard, Storage, Table};
use super::origin::Origin;
use super::Checkpoint;
use crate::error::Result;
use crate::gguf::{GgmlType, MetaValue, Model};

/// What a GGUF model holds besides its tensors' bytes.
#[derive(Debug)]
pub struct Gguf {
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Its metadata (the first file's).
    pub metadata: Vec<(String, MetaValue)>,
    /// Each tensor's ggml type and logical shape (row-major).
    pub tensors: BTreeMap<String, (GgmlType, Vec<usize>)>,
}

impl Gguf {
    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

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
    /// Opens the GGUF model at `path` (a split one from its first part).
    pub(super) fn from_gguf(path: &Path) -> Result<Checkpoint> {
        let model = Model::open(path)?;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let (mut tensors, mut lookup) = (BTreeMap::new(), BTreeMap::new());
        let mut tables: Vec<Vec<(String, Entry)>> = model.files.iter().map(|_| Vec::new()).collect();
        for t in &model.tensors {
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
            tables[t.file].push((t.name.clone(), Entry { dtype, shape, range: (a, b) }));
            tensors.insert(t.name.clone(), (t.ty, t.shape.clone()));
            lookup.insert(t.name.clone(), t.file);
        }
        let metadata = model.metadata;
        let version = model.files.first().map_or(0, |f| f.version);
        let count = model.files.len();
        let shards = model
            .files
            .into_iter()
            .zip(tables)
            .enumerate()
            .map(|(i, (f, mut table))| {
                table.sort_by_key(|(_, e)| e.range.0);
                let path = f.path.clone();
                // Offsets are from the start of the file.
                let mut shard = Shard::new_table(&path, Storage::Mapped(f.into_map()), 0, Table::new(table));
                // What the dense checkpoint's file is called.
                shard.file_name = match count {
                    1 => "model.safetensors".to_string(),
                    n => format!("model-{:05}-of-{n:05}.safetensors", i + 1),
                };
                shard
            })
            .collect();
        Ok(Checkpoint {
            dir: dir.clone(),
            files: Origin::Disk(dir),
            single_file: true,
            shards,
            index: None,
            config: None,
            hf_quant_config: None,
            svdquant_config: None,
            lookup,
            misses: Mutex::new(BTreeSet::new()),
            gguf: Some(Gguf {
                version,
                metadata,
                tensors,
            }),
        })
    }
}

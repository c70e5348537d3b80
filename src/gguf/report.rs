//! What `inspect` shows of a GGUF model.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{GgmlType, Model, Tensor};

/// Tensors and bytes of one type.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TypeCount {
    /// The type.
    #[serde(rename = "type")]
    pub ty: GgmlType,
    /// How many tensors have it.
    pub tensors: usize,
    /// Their stored bytes.
    pub bytes: u64,
}

/// `inspect` of a GGUF model.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Its files.
    pub files: Vec<String>,
    /// GGUF version.
    pub version: u32,
    /// `general.architecture`.
    pub architecture: Option<String>,
    /// Every metadata key with its value, shortened (a list: its length
    /// and first items).
    pub metadata: Vec<(String, String)>,
    /// Tensors and bytes per type, by type.
    pub types: Vec<TypeCount>,
    /// Every tensor.
    pub tensors: Vec<Tensor>,
}

impl Report {
    /// The report of `model`.
    pub fn new(model: &Model) -> Report {
        let mut types: BTreeMap<GgmlType, (usize, u64)> = BTreeMap::new();
        for t in &model.tensors {
            let e = types.entry(t.ty).or_default();
            e.0 += 1;
            e.1 += t.size;
        }
        Report {
            files: model
                .files
                .iter()
                .map(|f| f.path.display().to_string())
                .collect(),
            version: model.files.first().map_or(0, |f| f.version),
            architecture: model.architecture().map(str::to_string),
            metadata: model
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect(),
            types: types
                .into_iter()
                .map(|(ty, (tensors, bytes))| TypeCount { ty, tensors, bytes })
                .collect(),
            tensors: model.tensors.clone(),
        }
    }

    /// For people.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let files = self.files.len();
        let _ = writeln!(
            s,
            "{}: GGUF v{}, architecture {}, {} tensors in {files} file{}",
            self.files.first().map_or("", String::as_str),
            self.version,
            self.architecture.as_deref().unwrap_or("(none)"),
            self.tensors.len(),
            if files == 1 { "" } else { "s" }
        );
        for t in &self.types {
            let _ = writeln!(
                s,
                "  {:<8} {:>5} tensors {:>14} bytes",
                t.ty.name(),
                t.tensors,
                t.bytes
            );
        }
        let _ = writeln!(s, "metadata:");
        for (k, v) in &self.metadata {
            let _ = writeln!(s, "  {k} = {v}");
        }
        let _ = writeln!(s, "tensors:");
        for t in &self.tensors {
            let _ = writeln!(s, "  {} {:?} {}", t.name, t.shape, t.ty.name());
        }
        s
    }
}

//! The safetensors header of a file whose tensors are streamed after it.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype;

use crate::error::{Error, Result, Rule};

/// The header of a safetensors file holding `tensors` (name, dtype, shape,
/// byte length) back to back in this order: its length as a little-endian
/// u64, then the JSON (the `safetensors` crate's own metadata types, with
/// `__metadata__: {"format": "pt"}`), padded with spaces to 8 bytes. The
/// tensor data follows it, so it can be streamed. `path` names the file in
/// errors.
pub fn safetensors_header<'t>(
    path: &Path,
    tensors: impl IntoIterator<Item = (&'t str, Dtype, &'t [usize], usize)>,
) -> Result<Vec<u8>> {
    let mut offset = 0usize;
    let infos = tensors
        .into_iter()
        .map(|(name, dtype, shape, len)| {
            let end = offset + len;
            let info = TensorInfo {
                dtype,
                shape: shape.to_vec(),
                data_offsets: (offset, end),
            };
            offset = end;
            (name.to_string(), info)
        })
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let bad = || Error::new(Rule::Io, path, "cannot make the header");
    let metadata = Metadata::new(Some(meta), infos).map_err(|e| bad().caused_by(e))?;
    let mut text = serde_json::to_vec(&metadata).map_err(|e| bad().caused_by(e))?;
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    Ok(out)
}

//! The safetensors header of a file whose tensors are streamed after it.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype;

use crate::error::{Context, Result, ResultExt, Rule};

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
    // The offsets and lengths are the writer's own: a header that cannot be
    // made is a bug of ours, not a fault of the input or the disk.
    let bad = "cannot make the header";
    let metadata = Metadata::new(Some(meta), infos)
        .context(Rule::Internal, bad)
        .with_file(path)?;
    let mut text = serde_json::to_vec(&metadata)
        .context(Rule::Internal, bad)
        .with_file(path)?;
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    Ok(out)
}

/// Bytes of a header with no tensors, at most: the length, the metadata,
/// the padding.
pub(super) const EMPTY_BOUND: u64 = 64;

/// Bytes one tensor's entry adds to a header, at most (its name, dtype and
/// shape as written, offsets of up to 20 digits, the punctuation).
pub(super) fn entry_bound(name: &str, dtype: Dtype, shape: &[usize]) -> u64 {
    let name = serde_json::to_string(name).map_or(6 * name.len() + 2, |s| s.len());
    let shape: usize = shape.iter().map(|d| d.to_string().len() + 1).sum();
    (name + format!("{dtype:?}").len() + shape + 2 * 20 + 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bounds hold for real headers, long names and numbers included.
    #[test]
    fn bounds_cover_the_header() {
        let names: Vec<String> = (0..50)
            .map(|i| format!("model.layers.{i}.mlp.experts.{}.down_proj.weight", i * 997))
            .collect();
        let shape = [69632usize, 32768];
        let len = 69632 * 32768 * 2;
        let header = safetensors_header(
            Path::new("x"),
            names
                .iter()
                .map(|n| (n.as_str(), Dtype::BF16, &shape[..], len)),
        )
        .unwrap();
        let bound: u64 = EMPTY_BOUND
            + names
                .iter()
                .map(|n| entry_bound(n, Dtype::BF16, &shape))
                .sum::<u64>();
        assert!((header.len() as u64) <= bound, "{} > {bound}", header.len());
        let empty = safetensors_header(Path::new("x"), std::iter::empty()).unwrap();
        assert!(empty.len() as u64 <= EMPTY_BOUND);
    }
}

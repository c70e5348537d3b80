//! Stored tensors rearranged on the host when written, for conversions that
//! keep values but change their layout (AutoAWQ → compressed-tensors, MLX's
//! GPT-OSS biases → transformers'). Made one tensor at a time, so a
//! conversion holds no more than the tensor it writes.

use crate::checkpoint::TensorRef;
use crate::error::{Result, Rule};
use crate::job::Fields;
use crate::numerics::OutDtype;

/// How a tensor's bytes are made from stored ones.
#[derive(Debug)]
pub enum Rearrange<'a> {
    /// A stored 2-D tensor transposed, element size kept.
    Transpose(TensorRef<'a>),
    /// Fields of a stored stream packed anew ([`Repack`]).
    Repack(Repack<'a>),
    /// Floating point tensors of one shape with their last dimension's
    /// elements taken in turn (`[a0, b0, a1, b1, …]`), in dtype `to`.
    Interleave {
        /// The tensors, in turn.
        parts: Vec<TensorRef<'a>>,
        /// The result's dtype (each part's values cast to it).
        to: OutDtype,
    },
}

/// The b-bit fields of a stored stream, read as the matrix
/// `m[r][c] = fields.get(0, c, r)` (`rows × cols`, the transpose of the
/// stored lanes), packed LSB-first into little-endian int32 words as
/// compressed-tensors' `pack_to_int32` does: along each row
/// (`[rows, ⌈cols·b/32⌉]`), or down each column (`[⌈rows·b/32⌉, cols]`).
#[derive(Debug)]
pub struct Repack<'a> {
    /// The stored fields.
    pub fields: Fields<'a>,
    /// Rows of `m`.
    pub rows: usize,
    /// Columns of `m`.
    pub cols: usize,
    /// Pack down columns (`packed_dim=0`) instead of along rows.
    pub down_columns: bool,
}

impl Repack<'_> {
    /// Shape of the packed words.
    fn shape(&self) -> Vec<usize> {
        let words = |n: usize| (n * self.fields.bits as usize).div_ceil(32);
        if self.down_columns {
            vec![words(self.rows), self.cols]
        } else {
            vec![self.rows, words(self.cols)]
        }
    }

    /// The packed words' bytes.
    fn bytes(&self) -> Vec<u8> {
        let shape = self.shape();
        let mut words = vec![0u32; shape[0] * shape[1]];
        let b = self.fields.bits as usize;
        for c in 0..self.cols {
            for r in 0..self.rows {
                let v = self.fields.get(0, c, r);
                // A packed lane's first word, its field index, and the
                // distance from one of its words to the next.
                let (first, i, step) = if self.down_columns {
                    (c, r, shape[1])
                } else {
                    (r * shape[1], c, 1)
                };
                let bit = i * b;
                let at = first + (bit / 32) * step;
                words[at] |= v << (bit % 32);
                if bit % 32 + b > 32 {
                    words[at + step] |= v >> (32 - bit % 32);
                }
            }
        }
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }
}

impl<'a> Rearrange<'a> {
    /// Shape of the result.
    pub fn shape(&self) -> Vec<usize> {
        match self {
            Rearrange::Transpose(t) => t.shape.iter().rev().copied().collect(),
            Rearrange::Interleave { parts, .. } => {
                let mut shape = parts.first().map_or_else(Vec::new, |t| t.shape.to_vec());
                if let Some(last) = shape.last_mut() {
                    *last *= parts.len();
                }
                shape
            }
            Rearrange::Repack(p) => p.shape(),
        }
    }

    /// Size of the result in bytes.
    pub fn byte_len(&self) -> usize {
        match self {
            Rearrange::Transpose(t) => t.len(),
            Rearrange::Repack(_) => self.shape().iter().product::<usize>() * 4,
            Rearrange::Interleave { to, .. } => self.shape().iter().product::<usize>() * to.size(),
        }
    }

    /// The stored tensors it reads.
    pub fn inputs(&self) -> Vec<TensorRef<'a>> {
        match self {
            Rearrange::Transpose(t) => vec![*t],
            Rearrange::Repack(p) => p.fields.data.tensor().into_iter().collect(),
            Rearrange::Interleave { parts, .. } => parts.clone(),
        }
    }

    /// The result's bytes.
    pub fn bytes(&self) -> Result<Vec<u8>> {
        match self {
            Rearrange::Transpose(t) => {
                let data = t.data()?;
                let (rows, cols) = match *t.shape {
                    [r, c] => (r, c),
                    _ => (1, t.elements()),
                };
                let size = data.len() / (rows * cols).max(1);
                let mut out = vec![0u8; data.len()];
                for (r, row) in data.chunks_exact(cols * size).enumerate() {
                    for (c, v) in row.chunks_exact(size).enumerate() {
                        let at = (c * rows + r) * size;
                        out[at..at + size].copy_from_slice(v);
                    }
                }
                Ok(out)
            }
            Rearrange::Repack(p) => Ok(p.bytes()),
            Rearrange::Interleave { parts, to } => {
                let size = to.size();
                let n = parts.len();
                let mut out = vec![0u8; self.byte_len()];
                for (k, t) in parts.iter().enumerate() {
                    let data = t.data()?;
                    let values = match t.dtype == to.safetensors() {
                        true => data.to_vec(),
                        false if crate::numerics::is_castable(t.dtype) => {
                            let mut v = vec![0u8; t.elements() * size];
                            crate::numerics::cast(t.dtype, data, *to, &mut v);
                            v
                        }
                        false => {
                            return Err(t.error(
                                Rule::TensorDtype,
                                format!("dtype {}, not a float", t.dtype),
                            ))
                        }
                    };
                    // Element c of part k is element c·n + k.
                    for (v, o) in values
                        .chunks_exact(size)
                        .zip(out[k * size..].chunks_mut(n * size))
                    {
                        o[..size].copy_from_slice(v);
                    }
                }
                Ok(out)
            }
        }
    }
}

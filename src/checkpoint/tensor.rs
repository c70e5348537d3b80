//! A tensor inside a shard: its stored dtype, shape and bytes, read as
//! integers or floats.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

use safetensors::Dtype;

use crate::error::{Error, Result, Rule};

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
    /// not been read ([`Checkpoint::load`](super::Checkpoint::load)).
    pub(super) bytes: &'a [u8],
    /// Byte length, from the header.
    pub(super) len: usize,
    /// Where a read of bytes that are not there is noted.
    pub(super) misses: Option<&'a Mutex<BTreeSet<String>>>,
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
    /// can read them and plan again
    /// ([`Checkpoint::take_misses`](super::Checkpoint::take_misses)).
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

//! compressed-tensors' sparse formats: `sparse-24-bitmask` (2:4) and
//! `sparse-bitmask` (unstructured). A module stores its kept values
//! (`compressed`), a bitmask of where they go (`bitmask`, one bit per
//! element, LSB first, rows padded to bytes) and its dense `shape`; the
//! unstructured one adds `row_offsets`. The dense weight is the values
//! scattered over the set bits in row-major order (+0 elsewhere), then
//! dequantized as the module's config group says: a sparse job
//! ([`Sparse`]) reads code 0 where a bit is clear, so a missing element is
//! what the stored zero dequantizes to.

use std::sync::{Arc, OnceLock};

use safetensors::Dtype;

use super::{expect_dtype, expect_shape, require};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Result, Rule};
use crate::job::{Dims, Fields, Sparse, Starts};
use crate::numerics;

/// Which sparse layout a config names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Layout {
    /// `sparse-24-bitmask`: 2 of every 4 columns kept, `compressed`
    /// `[rows, cols/2]`.
    TwoFour,
    /// `sparse-bitmask`: any columns kept, `compressed` 1-D, `row_offsets`.
    Bitmask,
}

impl Layout {
    /// The layout of a `sparsity_config.format`; `None` for `dense`. Other
    /// formats (`marlin-24`: Marlin tiles and a `meta` tensor that no
    /// dequantizer reads) are refused by the caller.
    pub fn of(format: &str) -> Option<Option<Layout>> {
        match format {
            "dense" => Some(None),
            "sparse-24-bitmask" => Some(Some(Layout::TwoFour)),
            "sparse-bitmask" => Some(Some(Layout::Bitmask)),
            _ => None,
        }
    }

    /// The config's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Layout::TwoFour => "sparse-24-bitmask",
            Layout::Bitmask => "sparse-bitmask",
        }
    }
}

/// Columns per block of an unstructured mask's table of starts.
const BLOCK: usize = 256;

/// Tensors of a sparse module besides its quantization parameters.
pub const PARAMS: &[&str] = &["compressed", "bitmask", "shape", "row_offsets"];

/// A sparse module's values, where they go, and its dense dims.
pub struct Stored<'c> {
    /// The kept values (`compressed`).
    pub values: TensorRef<'c>,
    /// The job's bitmask and starts.
    pub sparse: Sparse<'c>,
    /// The dense shape.
    pub dims: Dims,
    /// Kept values over elements.
    pub kept: f64,
}

/// Reads and checks module `module`'s sparse tensors, in `layout`.
pub fn read<'c>(ckpt: &'c Checkpoint, module: &str, layout: Layout) -> Result<Stored<'c>> {
    let values = require(ckpt, module, "compressed")?;
    let mask = require(ckpt, module, "bitmask")?;
    let shape_t = require(ckpt, module, "shape")?;
    expect_dtype(&shape_t, &[Dtype::I64, Dtype::I32])?;
    expect_dtype(&mask, &[Dtype::U8])?;
    let shape = shape_t.ints()?;
    let (rows, cols) = match (&shape[..], shape_t.elements()) {
        (&[r, c], 2) if (1..=1 << 40).contains(&r) && (1..=1 << 40).contains(&c) => {
            (r as usize, c as usize)
        }
        _ => {
            return Err(shape_t.error(
                Rule::TensorValue,
                format!("holds {shape:?}; a sparse weight's shape is two positive integers"),
            ))
        }
    };
    let row_bytes = cols.div_ceil(8);
    expect_shape(
        &mask,
        &[rows, row_bytes],
        format_args!("a [{rows}, {cols}] weight's bitmask is [{rows}, {row_bytes}] (one bit per column, rows padded to bytes)"),
    )?;
    let bits = mask.data()?;
    let (sparse, kept) = match layout {
        Layout::TwoFour => {
            if !cols.is_multiple_of(4) || values.shape != [rows, cols / 2] {
                return Err(values.error(
                    Rule::TensorShape,
                    format!(
                        "shape {:?}; a [{rows}, {cols}] weight kept 2 of every 4 columns is [{rows}, {}]",
                        values.shape,
                        cols / 2
                    ),
                ));
            }
            for r in 0..rows {
                let row = &bits[r * row_bytes..(r + 1) * row_bytes];
                for g in 0..cols / 4 {
                    let n = (row[g / 2] >> (4 * (g % 2)) & 15).count_ones();
                    if n != 2 {
                        return Err(mask.error(
                            Rule::Sparse,
                            format!("row {r} keeps {n} of columns {}..{}; 2:4 keeps exactly 2 of every 4", 4 * g, 4 * g + 4),
                        ));
                    }
                }
            }
            let starts = Starts::Fixed {
                per_row: cols as u64 / 2,
                per_block: 2,
            };
            (sparse(mask, row_bytes, 4, starts), 0.5)
        }
        Layout::Bitmask => {
            let offsets_t = require(ckpt, module, "row_offsets")?;
            expect_dtype(&offsets_t, &[Dtype::I64, Dtype::I32])?;
            if offsets_t.shape != [rows] {
                return Err(offsets_t.error(
                    Rule::TensorShape,
                    format!(
                        "shape {:?}, expected [{rows}] (one offset per row)",
                        offsets_t.shape
                    ),
                ));
            }
            let offsets = offsets_t.ints()?;
            let blocks = cols.div_ceil(BLOCK);
            let mut at = Vec::with_capacity(rows * blocks + 1);
            let mut total = 0u64;
            for (r, &offset) in offsets.iter().enumerate() {
                if offset != total as i64 {
                    return Err(offsets_t.error(
                        Rule::Sparse,
                        format!("row_offsets[{r}] = {offset}, but the bitmask keeps {total} values before row {r}"),
                    ));
                }
                let row = &bits[r * row_bytes..(r + 1) * row_bytes];
                for b in 0..blocks {
                    at.push(total);
                    let (c0, c1) = (b * BLOCK, ((b + 1) * BLOCK).min(cols));
                    total += row_ones(&row[c0 / 8..c1.div_ceil(8)], c1 - c0);
                }
            }
            at.push(total);
            if values.shape != [total as usize] {
                return Err(values.error(
                    Rule::Sparse,
                    format!("shape {:?}; the bitmask keeps {total} values", values.shape),
                ));
            }
            let starts = Starts::Table {
                blocks,
                at: at.into(),
            };
            (
                sparse(mask, row_bytes, BLOCK, starts),
                total as f64 / (rows * cols) as f64,
            )
        }
    };
    Ok(Stored {
        values,
        sparse,
        dims: Dims {
            slices: 1,
            rows,
            cols,
        },
        kept,
    })
}

fn sparse(mask: TensorRef<'_>, row_bytes: usize, block: usize, starts: Starts) -> Sparse<'_> {
    Sparse {
        mask: Fields::dense(mask, 1, row_bytes as u64 * 8),
        block,
        starts,
    }
}

/// Set bits among the first `cols` of a row's mask bytes (padding bits are
/// not read: compressed-tensors unpacks `cols` bits a row).
fn row_ones(row: &[u8], cols: usize) -> u64 {
    let whole = cols / 8;
    let mut n: u64 = row[..whole].iter().map(|b| b.count_ones() as u64).sum();
    if !cols.is_multiple_of(8) {
        n += (row[whole] & ((1u8 << (cols % 8)) - 1)).count_ones() as u64;
    }
    n
}

/// The codes and code values of stored values that are not quantized:
/// each 16-bit float is its own code.
pub fn float_codes(values: &TensorRef<'_>) -> Option<Arc<[f32]>> {
    static BF16: OnceLock<Arc<[f32]>> = OnceLock::new();
    static F16: OnceLock<Arc<[f32]>> = OnceLock::new();
    let (cell, read): (_, fn(u16) -> f32) = match values.dtype {
        Dtype::BF16 => (&BF16, numerics::bf16_to_f32),
        Dtype::F16 => (&F16, numerics::f16_to_f32),
        _ => return None,
    };
    Some(
        cell.get_or_init(|| (0..=u16::MAX).map(read).collect())
            .clone(),
    )
}

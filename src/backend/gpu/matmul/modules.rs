//! Linears put together from several jobs' products (SVDQuant's modules,
//! which `dequantize` assembles from rows and columns of its targets):
//! bands of outputs one below the other, and blocks of inputs whose sums
//! each part adds to those of the blocks before it.

use super::{PackedLinear, Part, NO_BIAS};
use crate::error::{Error, Result, Rule};

/// How the blocks of a module lie in its W.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Join {
    /// One below the other: bands of its outputs.
    Rows,
    /// Side by side: blocks of its inputs.
    Inputs,
}

impl PackedLinear {
    /// One Linear of `bands`, their outputs one below the other (rows of
    /// several targets, a split_linear_output patch undone): each band's
    /// parts write its rows of y, none of them summed with another's.
    pub(crate) fn bands(bands: Vec<PackedLinear>, what: &str) -> Result<PackedLinear> {
        PackedLinear::joined(bands, Join::Rows, what)
    }

    /// One Linear of `blocks`, each of some of its inputs, side by side
    /// (inputs split between targets, a split_linear patch undone): each
    /// block's sums added to those of the blocks before it, in order, then
    /// the last one's bias (only it may have one).
    pub(crate) fn columns(blocks: Vec<PackedLinear>, what: &str) -> Result<PackedLinear> {
        PackedLinear::joined(blocks, Join::Inputs, what)
    }

    fn joined(blocks: Vec<PackedLinear>, join: Join, what: &str) -> Result<PackedLinear> {
        let (n, k) = blocks.first().map_or((0, 0), |b| (b.n, b.k));
        let last = blocks.len().saturating_sub(1);
        let fits = |(i, b): (usize, &PackedLinear)| {
            b.experts == 0
                && match join {
                    Join::Rows => b.k == k,
                    Join::Inputs => {
                        b.n == n && (i == last || b.parts.iter().all(|p| p.bias == NO_BIAS))
                    }
                }
        };
        if !blocks.iter().enumerate().all(fits) {
            let detail = "its blocks do not fit together as one Linear".to_string();
            return Err(Error::new(Rule::Argument, what, detail));
        }
        let (mut at, mut bytes, mut parts) = (0, 0, Vec::new());
        for (i, block) in blocks.into_iter().enumerate() {
            let off = u32::try_from(at)
                .map_err(|_| Error::new(Rule::Argument, what, "too large".to_string()))?;
            parts.extend(block.parts.into_iter().map(|p| match join {
                // y's column of a part's row `first_row + r` is
                // `first_row + r - row0`: moved down by the rows above.
                Join::Rows => Part {
                    row0: p.row0.wrapping_sub(off),
                    ..p
                },
                Join::Inputs => Part {
                    x0: p.x0 + off,
                    acc: p.acc || i > 0,
                    ..p
                },
            }));
            at += match join {
                Join::Rows => block.n,
                Join::Inputs => block.k,
            };
            bytes += block.bytes;
        }
        let (n, k) = match join {
            Join::Rows => (at, k),
            Join::Inputs => (n, at),
        };
        Ok(PackedLinear {
            n,
            k,
            experts: 0,
            parts,
            stack: Vec::new(),
            bytes,
        })
    }
}

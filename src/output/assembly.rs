//! Dense tensors put together from rows of several decode jobs.
//!
//! SVDQuant checkpoints store what the quantizer saw, not the original model:
//! fused targets hold several modules' rows, and structural patches split a
//! module into children that own row or column ranges. Undoing that is pure
//! bookkeeping over [`Stack`]s: bands of rows, each band a list of parts side
//! by side. For a weight the parts are column blocks ([`Piece`]s of decode
//! jobs), or columns taken in turn; for a bias they are terms that add up
//! ([`BiasTerm`]s).

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use crate::job::DecodeJob;
use crate::numerics::OutDtype;

/// Something that covers consecutive rows and can start further down.
pub trait Rows: Clone {
    /// The same thing, `n` rows further down.
    fn skip(&self, n: usize) -> Self;
}

/// `rows` rows whose parts sit side by side.
#[derive(Debug, Clone)]
pub struct Band<T> {
    /// How many rows the band covers.
    pub rows: usize,
    /// Parts, left to right (or terms of a sum).
    pub parts: Vec<T>,
}

/// Bands of rows, top to bottom.
#[derive(Debug, Clone)]
pub struct Stack<T> {
    /// The bands.
    pub bands: Vec<Band<T>>,
}

impl<T: Rows> Stack<T> {
    /// One band of `rows` rows made of `parts`.
    pub fn band(rows: usize, parts: Vec<T>) -> Stack<T> {
        Stack {
            bands: vec![Band { rows, parts }],
        }
    }

    /// Total height.
    pub fn rows(&self) -> usize {
        self.bands.iter().map(|b| b.rows).sum()
    }

    /// True when no band has a part.
    pub fn is_empty(&self) -> bool {
        self.bands.iter().all(|b| b.parts.is_empty())
    }

    /// Rows `range` of this stack.
    pub fn slice(&self, range: Range<usize>) -> Stack<T> {
        let mut bands = Vec::new();
        let mut top = 0;
        for b in &self.bands {
            let (lo, hi) = (range.start.max(top), range.end.min(top + b.rows));
            if lo < hi {
                bands.push(Band {
                    rows: hi - lo,
                    parts: b.parts.iter().map(|p| p.skip(lo - top)).collect(),
                });
            }
            top += b.rows;
        }
        Stack { bands }
    }

    /// `stacks` one below the other.
    pub fn vcat(stacks: Vec<Stack<T>>) -> Stack<T> {
        Stack {
            bands: stacks.into_iter().flat_map(|s| s.bands).collect(),
        }
    }

    /// `stacks` side by side; `None` unless all have the same height.
    pub fn hcat(stacks: Vec<Stack<T>>) -> Option<Stack<T>> {
        let rows = stacks.first().map_or(0, Stack::rows);
        if stacks.iter().any(|s| s.rows() != rows) {
            return None;
        }
        // Cut every stack at every band boundary of any of them.
        let mut cuts: Vec<usize> = stacks
            .iter()
            .flat_map(|s| {
                s.bands.iter().scan(0, |top, b| {
                    *top += b.rows;
                    Some(*top)
                })
            })
            .collect();
        cuts.push(0);
        cuts.sort_unstable();
        cuts.dedup();
        let bands = cuts
            .windows(2)
            .map(|w| Band {
                rows: w[1] - w[0],
                parts: stacks
                    .iter()
                    .flat_map(|s| s.slice(w[0]..w[1]).bands.into_iter().flat_map(|b| b.parts))
                    .collect(),
            })
            .collect();
        Some(Stack { bands })
    }
}

/// Consecutive rows of one job, from `row` down.
#[derive(Debug, Clone)]
pub struct Piece<'a> {
    /// The job (shared by every tensor that reads it).
    pub job: Arc<DecodeJob<'a>>,
    /// First row.
    pub row: usize,
}

impl Rows for Piece<'_> {
    fn skip(&self, n: usize) -> Self {
        Piece {
            job: self.job.clone(),
            row: self.row + n,
        }
    }
}

/// A weight made of pieces of jobs: columns of a band's pieces are
/// concatenated, bands are stacked.
#[derive(Debug, Clone)]
pub struct Assembly<'a> {
    /// The pieces.
    pub stack: Stack<Piece<'a>>,
    /// Columns of every row.
    pub cols: usize,
    /// Output dtype (every job's).
    pub out: OutDtype,
    /// A band's parts (of one width) interleaved column by column,
    /// `[a0, b0, a1, b1, …]` (GPT-OSS's fused gate and up projections),
    /// not side by side.
    pub interleaved: bool,
}

/// One term of a bias.
#[derive(Debug, Clone)]
pub enum BiasTerm<'a> {
    /// Stored values (in logical order) from element `at` down.
    Stored {
        /// The values.
        values: Arc<[f32]>,
        /// First element.
        at: usize,
    },
    /// The activation-shift correction `shift · Σ_k W[row, k]`, with the
    /// weight a shift multiplies ([`DecodeJob::shifted_weight`]).
    Shift {
        /// Rows of the shifted job.
        piece: Piece<'a>,
        /// The shift added to every input feature.
        shift: f32,
    },
}

impl Rows for BiasTerm<'_> {
    fn skip(&self, n: usize) -> Self {
        match self {
            BiasTerm::Stored { values, at } => BiasTerm::Stored {
                values: values.clone(),
                at: at + n,
            },
            BiasTerm::Shift { piece, shift } => BiasTerm::Shift {
                piece: piece.skip(n),
                shift: *shift,
            },
        }
    }
}

impl BiasTerm<'_> {
    /// The term's value at row `i` of its band.
    fn value(&self, i: usize) -> f32 {
        match self {
            BiasTerm::Stored { values, at } => values[at + i],
            BiasTerm::Shift { piece, shift } => {
                let row = piece.row + i;
                let sum: f64 = (0..piece.job.dims.cols)
                    .map(|k| piece.job.shifted_weight(row, k) as f64)
                    .sum();
                (sum * *shift as f64) as f32
            }
        }
    }
}

/// A bias: each band's terms add up (in order, in f32).
#[derive(Debug, Clone)]
pub struct BiasSum<'a> {
    /// The terms.
    pub stack: Stack<BiasTerm<'a>>,
    /// Output dtype.
    pub out: OutDtype,
}

impl BiasSum<'_> {
    /// The bias in the output dtype. Computed on the host with the reference
    /// accessors, so every backend writes the same bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let values: Vec<f32> = self
            .stack
            .bands
            .iter()
            .flat_map(|b| {
                (0..b.rows)
                    .into_par_iter()
                    .map(|i| b.parts.iter().fold(0.0f32, |acc, t| acc + t.value(i)))
                    .collect::<Vec<f32>>()
            })
            .collect();
        let size = self.out.size();
        let mut out = vec![0u8; values.len() * size];
        for (v, o) in values.iter().zip(out.chunks_exact_mut(size)) {
            self.out.encode(*v, o);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct R(&'static str, usize);
    impl Rows for R {
        fn skip(&self, n: usize) -> Self {
            R(self.0, self.1 + n)
        }
    }

    #[test]
    fn hcat_cuts_at_every_boundary() {
        let a = Stack::vcat(vec![
            Stack::band(2, vec![R("a", 0)]),
            Stack::band(3, vec![R("b", 0)]),
        ]);
        let c = Stack::band(5, vec![R("c", 10)]);
        let s = Stack::hcat(vec![a, c]).unwrap();
        let got: Vec<(usize, Vec<R>)> = s.bands.iter().map(|b| (b.rows, b.parts.clone())).collect();
        assert_eq!(
            got,
            vec![
                (2, vec![R("a", 0), R("c", 10)]),
                (3, vec![R("b", 0), R("c", 12)]),
            ]
        );
        assert!(Stack::hcat(vec![
            Stack::band(2, vec![R("a", 0)]),
            Stack::band(3, vec![R("b", 0)])
        ])
        .is_none());
    }

    #[test]
    fn slice_skips_into_bands() {
        let s = Stack::vcat(vec![
            Stack::band(4, vec![R("a", 0)]),
            Stack::band(4, vec![R("b", 5)]),
        ]);
        let got: Vec<(usize, Vec<R>)> = s
            .slice(3..6)
            .bands
            .iter()
            .map(|b| (b.rows, b.parts.clone()))
            .collect();
        assert_eq!(got, vec![(1, vec![R("a", 3)]), (2, vec![R("b", 5)])]);
    }
}

//! A Linear whose activations a runtime rotates (compressed-tensors'
//! online transforms), as the plain weight that computes the same:
//! `x·A` in, `y·B` out make `W = Bᵀ · Wq · Aᵀ` of the decoded `Wq`.
//!
//! `A` and `B` are `T/√n` (`Tᵀ` when inverse) with `T` a ±1 matrix,
//! block-diagonal with blocks of `n`. The fold sums `±Wq` exactly in f64
//! (the sums of a row of blocks need far fewer bits than f64 has), divides
//! once by `√(n_in · n_out)` and rounds once to the output dtype. `B` mixes
//! the rows of one block, so rows are folded a block at a time.

use std::sync::Arc;

use rayon::prelude::*;

use crate::job::DecodeJob;
use crate::numerics::{self, OutDtype};

/// One rotation: block size and `T`.
#[derive(Debug, Clone)]
pub struct Rotation {
    /// Block size.
    pub n: usize,
    /// `T`, row-major `n × n`, entries ±1.
    pub matrix: Arc<[f64]>,
    /// The block is `Tᵀ`.
    pub inverse: bool,
}

impl Rotation {
    /// Entry (a, b) of the block, `T[a, b]` or `T[b, a]`.
    #[inline]
    fn at(&self, a: usize, b: usize) -> f64 {
        if self.inverse {
            self.matrix[b * self.n + a]
        } else {
            self.matrix[a * self.n + b]
        }
    }
}

/// A decoded weight with its rotations folded in.
#[derive(Debug)]
pub struct Fold<'a> {
    /// Decodes `Wq` in the model's dtype (what the runtime multiplies).
    pub job: DecodeJob<'a>,
    /// Rotates the input (`A`, over columns).
    pub input: Option<Rotation>,
    /// Rotates the output (`B`, over rows).
    pub output: Option<Rotation>,
    /// The dtype written.
    pub out: OutDtype,
}

impl Fold<'_> {
    /// Rows and columns of the weight.
    pub fn dims(&self) -> (usize, usize) {
        (self.job.dims.rows, self.job.dims.cols)
    }

    /// Rows folded together (the output rotation's block).
    pub fn band(&self) -> usize {
        self.output.as_ref().map_or(1, |r| r.n)
    }

    /// Folds whole bands of decoded rows `wq` (the job's output bytes of
    /// `wq.len() / row bytes` rows from a band's first) into `out`, in
    /// [`Fold::out`].
    pub fn fold(&self, wq: &[u8], out: &mut [u8]) {
        let (_, cols) = self.dims();
        let size = self.job.out.size();
        let read = numerics::float_reader(self.job.out.safetensors()).map(|(_, r)| r);
        let Some(read) = read else { return };
        let rows = wq.len() / (cols * size).max(1);
        // Wq · Aᵀ, row by row: y[j·n + a] = Σ_b w[j·n + b] · A[a, b].
        let mut y: Vec<f64> = wq.chunks_exact(size).map(|c| read(c) as f64).collect();
        if let Some(a) = &self.input {
            let n = a.n;
            // Column b of the block, contiguous: y_blk += w[b] · A[:, b].
            let by_col: Vec<f64> = (0..n * n).map(|k| a.at(k % n, k / n)).collect();
            y.par_chunks_mut(cols).for_each(|row| {
                let mut acc = vec![0.0f64; n];
                for blk in row.chunks_exact_mut(n) {
                    acc.fill(0.0);
                    for (b, &w) in blk.iter().enumerate() {
                        for (s, &t) in acc.iter_mut().zip(&by_col[b * n..b * n + n]) {
                            *s += w * t;
                        }
                    }
                    blk.copy_from_slice(&acc);
                }
            });
        }
        // Bᵀ · Y, a band of n rows at a time: z[a] = Σ_b B[b, a] · y[b].
        let z = match &self.output {
            None => y,
            Some(b) => {
                let n = b.n;
                let mut z = vec![0.0f64; rows * cols];
                z.par_chunks_mut(n * cols).zip(y.par_chunks(n * cols)).for_each(|(zb, yb)| {
                    for (a, zr) in zb.chunks_exact_mut(cols).enumerate() {
                        for (k, yr) in yb.chunks_exact(cols).enumerate() {
                            let t = b.at(k, a);
                            zr.iter_mut().zip(yr).for_each(|(s, &v)| *s += t * v);
                        }
                    }
                });
                z
            }
        };
        let norm = (self.input.as_ref().map_or(1, |r| r.n) as f64 * self.band() as f64).sqrt();
        let o = self.out.size();
        out.par_chunks_mut(o * cols)
            .zip(z.par_chunks(cols))
            .for_each(|(dst, src)| {
                for (d, &v) in dst.chunks_exact_mut(o).zip(src) {
                    self.out.encode_f64(v / norm, d);
                }
            });
    }
}

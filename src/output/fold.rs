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

impl Rotation {
    /// `Bᵀ · v / √n` of a vector of its rows (a bias under an output
    /// rotation: `(x·Wᵀ + b)·B = x·(Bᵀ·W)ᵀ + Bᵀ·b`), each value rounded once
    /// to `out`.
    pub fn fold_bias(&self, v: &[f32], out: OutDtype) -> Vec<u8> {
        let n = self.n;
        let norm = (n as f64).sqrt();
        let mut bytes = vec![0u8; v.len() * out.size()];
        for (blk, dst) in v
            .chunks_exact(n)
            .zip(bytes.chunks_exact_mut(n * out.size()))
        {
            for (a, d) in dst.chunks_exact_mut(out.size()).enumerate() {
                let s: f64 = blk
                    .iter()
                    .enumerate()
                    .map(|(k, &x)| self.at(k, a) * x as f64)
                    .sum();
                out.encode_f64(s / norm, d);
            }
        }
        bytes
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
    /// [`Fold::out`], a band at a time on each thread (its f64 rows are all
    /// the memory it takes).
    pub fn fold(&self, wq: &[u8], out: &mut [u8]) {
        let (_, cols) = self.dims();
        let size = self.job.out.size();
        let Some((_, read)) = numerics::float_reader(self.job.out.safetensors()) else {
            return;
        };
        // Bands of the output rotation, else of a few rows.
        let band = if self.output.is_some() {
            self.band()
        } else {
            16
        };
        // Column b of the input block, contiguous: y_blk += w[b] · A[:, b].
        let by_col: Option<Vec<f64>> = self
            .input
            .as_ref()
            .map(|a| (0..a.n * a.n).map(|k| a.at(k % a.n, k / a.n)).collect());
        let norm = (self.input.as_ref().map_or(1, |r| r.n) as f64 * self.band() as f64).sqrt();
        let o = self.out.size();
        out.par_chunks_mut(band * cols * o)
            .zip(wq.par_chunks(band * cols * size))
            .for_each(|(dst, src)| {
                let mut y: Vec<f64> = src.chunks_exact(size).map(|c| read(c) as f64).collect();
                // Wq · Aᵀ, row by row: y[j·n + a] = Σ_b w[j·n + b] · A[a, b].
                if let (Some(a), Some(by_col)) = (&self.input, &by_col) {
                    let n = a.n;
                    let mut acc = vec![0.0f64; n];
                    for blk in y.chunks_exact_mut(n) {
                        acc.fill(0.0);
                        for (b, &w) in blk.iter().enumerate() {
                            for (s, &t) in acc.iter_mut().zip(&by_col[b * n..b * n + n]) {
                                *s += w * t;
                            }
                        }
                        blk.copy_from_slice(&acc);
                    }
                }
                // Bᵀ · Y over the band's rows: z[a] = Σ_b B[b, a] · y[b].
                let z = match &self.output {
                    None => y,
                    Some(b) => {
                        let mut z = vec![0.0f64; y.len()];
                        for (a, zr) in z.chunks_exact_mut(cols).enumerate() {
                            for (k, yr) in y.chunks_exact(cols).enumerate() {
                                let t = b.at(k, a);
                                zr.iter_mut().zip(yr).for_each(|(s, &v)| *s += t * v);
                            }
                        }
                        z
                    }
                };
                for (d, &v) in dst.chunks_exact_mut(o).zip(&z) {
                    self.out.encode_f64(v / norm, d);
                }
            });
    }
}

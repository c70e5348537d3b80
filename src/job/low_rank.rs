//! SVDQuant's low-rank branch and smoothing ([`LowRank`]).

use std::sync::Arc;

/// SVDQuant's low-rank branch `up · downᵀ` and per-column smoothing, in one
/// of two orders (`q·s` is the scaled code, `lr = Σ_j up[row,j]·down[col,j]`
/// summed in order j = 0, 1, …):
///
/// ```text
/// smooth_first = false (logical):         (q·s + lr) · inv_smooth[col]
/// smooth_first = true  (nunchaku_packed): (q·s) · inv_smooth[col] + lr
/// ```
///
/// Every operation rounds on its own, as in the reference: no fused
/// multiply-add (the shader keeps its compiler from contracting, see
/// `opaque` in shaders/decode/generic.wgsl). The smoothing divisor is applied as a
/// host-computed reciprocal because WGSL division is not correctly rounded.
#[derive(Debug, Clone)]
pub struct LowRank {
    /// Rank r; 0: no branch, the smoothing alone.
    pub rank: usize,
    /// `[rows, r]`, row-major.
    pub up: Arc<[f32]>,
    /// `[cols, r]`, row-major.
    pub down: Arc<[f32]>,
    /// `1 / smooth_factor`, one per column; with a [`LowRank::period`]
    /// above 1, `period` rows of them (`period · cols` values).
    pub inv_smooth: Arc<[f32]>,
    /// Rows of factors before they repeat: row `r` (over slices) of the
    /// output's column `c` takes `inv_smooth[(r div row_div mod period) ·
    /// cols + c]`. 1 (a factor a column) unless the job reads the weight in
    /// another view of its elements (SINQ's int32 packs decode the grouped
    /// `[out·in/G, G]` rows, each weight row `in/G` of them, so `scale2`,
    /// a factor a weight column, repeats every `in/G` rows) or the factors
    /// change down the rows (SINQ's 2D tiles: a row of factors for each
    /// `G` rows). Rank 0 only.
    pub period: usize,
    /// Rows sharing one row of factors (at least 1; see
    /// [`LowRank::period`]).
    pub row_div: usize,
    /// Smoothing applies to the residual only (the packed layout's
    /// `proj_down` is stored already divided by the smoothing factor).
    pub smooth_first: bool,
    /// Rank 0 only: with a 16-bit [`super::Product`], the smoothing
    /// multiplies in that dtype too, `d(d(q·s) · d(inv_smooth))` (SINQ's
    /// `scale2` in an f16 compute dtype); otherwise the f32 `q·s·inv_smooth`.
    pub in_product: bool,
}

impl LowRank {
    /// `Σ_j up[row, j] · down[col, j]`, in order.
    #[inline]
    pub fn sum(&self, row: usize, col: usize) -> f32 {
        let r = self.rank;
        let up = &self.up[row * r..row * r + r];
        let down = &self.down[col * r..col * r + r];
        up.iter().zip(down).fold(0.0f32, |acc, (u, d)| acc + u * d)
    }

    /// The smoothing reciprocal of (row, col) (see [`LowRank::period`]).
    #[inline]
    pub fn factor(&self, row: usize, col: usize) -> f32 {
        match self.period {
            0 | 1 => self.inv_smooth[col],
            p => {
                let r = row / self.row_div.max(1) % p;
                self.inv_smooth[r * (self.inv_smooth.len() / p) + col]
            }
        }
    }

    /// The dense value of scaled code `q·s` at (row, col).
    #[inline]
    pub fn apply(&self, q: f32, s: f32, row: usize, col: usize) -> f32 {
        let rs = self.factor(row, col);
        // Rank 0 is the smoothing alone (ModelOpt's pre-quant scale): nothing
        // is added, not even an empty sum's +0.0, which turns −0.0 into +0.0.
        if self.rank == 0 {
            return q * s * rs;
        }
        let lr = self.sum(row, col);
        if self.smooth_first {
            q * s * rs + lr
        } else {
            (q * s + lr) * rs
        }
    }
}

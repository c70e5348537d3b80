//! Which rows a GPU may decode: a job's arithmetic bounded from its
//! smallest inputs, so that no step can meet a subnormal that a GPU would
//! flush to zero.

use std::ops::Range;

use super::{DecodeJob, ValueKind, Values, ZeroPoint};

impl DecodeJob<'_> {
    /// Whether `f` holds for every entry of `v` (a scale or zero-point
    /// grid) that rows `rows` read: a transposed job's all, else each row's
    /// (an expert's, not its whole stack's). False when the grid is shorter
    /// than they need.
    pub(crate) fn entries_read(
        &self,
        v: &Values<'_>,
        rows: Range<usize>,
        mut f: impl FnMut(f32) -> bool,
    ) -> bool {
        let d = self.dims;
        let mut all = |r: Range<usize>| r.end <= v.len() && r.into_iter().all(|i| f(v.get(i)));
        if self.transposed || d.rows == 0 {
            return all(0..v.len());
        }
        let groups = d.cols.div_ceil(v.grid.col_div.max(1));
        rows.into_iter().all(|flat| {
            let at = v.grid.index(flat / d.rows, flat % d.rows, 0);
            all(at..at + groups)
        })
    }

    /// Whether decoding rows `rows` keeps every f32 operand and result of
    /// its arithmetic normal (or zero, infinite, NaN): GPUs may flush
    /// subnormals to zero (WGSL allows it; NVIDIA's Vulkan driver does, and
    /// an H200 decoded such values as zeros), so the GPU decodes a job only
    /// where this holds, and the CPU the others. Conservative: it bounds
    /// each step's smallest nonzero magnitude from the smallest inputs.
    pub fn stays_normal(&self, rows: Range<usize>) -> bool {
        self.smallest_value(rows).is_some_and(|w| w >= SAFE_PRODUCT)
    }

    /// [`tiniest`] of the entries of `v` that rows `rows` read, each also
    /// shown to `each`; `None` when one is subnormal or the grid is short.
    fn tiniest_read(
        &self,
        v: &Values<'_>,
        rows: Range<usize>,
        mut each: impl FnMut(f32),
    ) -> Option<f64> {
        let mut min = f64::INFINITY;
        let normal = self.entries_read(v, rows, |x| {
            each(x);
            tiniest([x]).map(|t| min = min.min(t)).is_some()
        });
        normal.then_some(min)
    }

    /// A lower bound on the magnitude of each nonzero value the job
    /// computes (its last product), or `None` where an input or an
    /// intermediate step may be subnormal.
    fn smallest_value(&self, rows: Range<usize>) -> Option<f64> {
        let integral = |v: f32| !v.is_finite() || v.fract() == 0.0;
        let codes = tiniest(self.code_values.iter().copied())?;
        let mut integers = self.code_values.iter().all(|&c| integral(c));
        // The code's value less its zero point: integers differ by 1 at
        // least, others by their smaller one's last bit.
        let mut w = match &self.zero {
            None => codes,
            Some(ZeroPoint::Plain(z)) => {
                let zeros = self.tiniest_read(z, rows.clone(), |v| integers &= integral(v))?;
                difference(integers, codes.min(zeros))?
            }
            Some(_) => difference(integers, codes)?,
        };
        if let Some(s) = &self.scale {
            if let ValueKind::Nested(n) = &s.kind {
                // r(table · outer) + offset (or addend): the product and
                // the offset are summands.
                let product = tiniest(n.table)? * tiniest(n.outer.iter().copied())?;
                let offset = match n.adds.is_empty() {
                    true => tiniest([n.offset])?,
                    false => tiniest(n.adds.iter().copied())?,
                };
                if product.min(offset) < SUMMAND {
                    return None;
                }
            }
            w *= self.tiniest_read(s, rows.clone(), |_| ())?;
            if w < SAFE_PRODUCT {
                return None;
            }
        }
        if let Some(lr) = &self.low_rank {
            let inv = tiniest(lr.inv_smooth.iter().copied())?;
            let branch = match lr.rank {
                0 => f64::INFINITY,
                _ => tiniest(lr.up.iter().copied())? * tiniest(lr.down.iter().copied())?,
            };
            // (q·s + lr)·inv or (q·s)·inv + lr: each summand large enough
            // that a nonzero sum is normal; the sum's last bit the bound.
            let (summands, after) = match lr.smooth_first {
                false => (w.min(branch), inv),
                true => ((w * inv).min(branch), 1.0),
            };
            if summands < SUMMAND {
                return None;
            }
            w = summands * ULP * after;
        }
        if let Some(p) = self.post_scale {
            w *= tiniest([p])?;
        }
        if let Some(o) = &self.offset {
            // v + offset: both summands large enough that a nonzero sum is
            // normal; the sum's last bit the bound.
            let summands = w.min(self.tiniest_read(o, rows, |_| ())?);
            if summands < SUMMAND {
                return None;
            }
            w = summands * ULP;
        }
        Some(w)
    }
}

/// 2^-24: an f32's last bit, relative to its value (at least).
const ULP: f64 = 1.0 / (1u64 << 24) as f64;

/// Values at least this large: a nonzero sum of two is at least the
/// smaller one's last bit, 2^-126, the smallest normal f32.
const SUMMAND: f64 = (f32::MIN_POSITIVE as f64) / ULP;

/// A product's bound at least this large is normal even after its factors
/// are rounded to bf16 or f16 first ([`Product`]): twice the smallest
/// normal.
const SAFE_PRODUCT: f64 = 2.0 * f32::MIN_POSITIVE as f64;

/// The smallest magnitude of `values` that is not zero (infinity when
/// there is none; infinities and NaN count as none), or `None` when one is
/// subnormal.
fn tiniest(values: impl IntoIterator<Item = f32>) -> Option<f64> {
    values.into_iter().try_fold(f64::INFINITY, |min, v| {
        let a = v.abs();
        match a {
            _ if a == 0.0 || !a.is_finite() => Some(min),
            _ if a < f32::MIN_POSITIVE => None,
            _ => Some(min.min(a as f64)),
        }
    })
}

/// A bound on a nonzero difference of values at least `smallest` (each
/// normal): 1 for integers, else the smaller one's last bit, which must be
/// normal itself.
fn difference(integers: bool, smallest: f64) -> Option<f64> {
    match integers {
        true => Some(smallest.min(1.0)),
        false if smallest >= SUMMAND => Some(smallest * ULP),
        false => None,
    }
}

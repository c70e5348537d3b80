//! The CPU's products with GGUF weights of the types multiplied in their
//! blocks ([`crate::formats::gguf::dot`]: Q4_K, Q8_0): no job mapped, no
//! row of W written; each result the one the decoded rows give.

use super::held::Held;
use super::{bias, output, refuse};
use crate::error::Result;
use crate::formats::gguf::dot;
use crate::gguf::GgmlType;
use crate::output::blocks::Blocks;
use crate::plan::Plan;

/// A 2-D weight of GGUF blocks that [`dot`] multiplies.
pub(super) struct InBlocks<'p, 'c> {
    blocks: &'p Blocks<'c>,
    ty: GgmlType,
    /// W's `[n, k]`.
    pub(super) shape: (usize, usize),
}

impl<'p, 'c> InBlocks<'p, 'c> {
    /// Weight `weight` (held as `held`) as one, where it is: not one
    /// expert of a stack, nor a GGUF type of another kind.
    pub(super) fn of(
        plan: &Plan<'c>,
        held: &Held<'p, 'c>,
        (weight, expert): (&str, Option<usize>),
    ) -> Option<InBlocks<'p, 'c>> {
        let Held::Blocks(blocks) = *held else {
            return None;
        };
        let gguf = plan.checkpoint.gguf.as_ref()?;
        let ty = gguf.tensors.get(blocks.tensor.name)?.0;
        let shape = &output(plan, weight).ok()?.shape;
        match *shape.as_slice() {
            [n, k]
                if expert.is_none()
                    && dot::multiplies(ty)
                    && (blocks.rows, blocks.cols) == (n, k) =>
            {
                Some(InBlocks {
                    blocks,
                    ty,
                    shape: (n, k),
                })
            }
            _ => None,
        }
    }

    /// `y = x·Wᵀ (+ bias)` for the `m` rows of `x` (`[m, k]`), W weight
    /// `weight` of `plan` ([`super::Model::matmul_cpu`]).
    pub(super) fn product(
        &self,
        plan: &Plan<'_>,
        weight: &str,
        x: &[f32],
        m: usize,
    ) -> Result<Vec<f32>> {
        let (n, k) = self.shape;
        if m.checked_mul(k) != Some(x.len()) {
            let detail = format!("x holds {} values, not {m} rows of {k}", x.len());
            return Err(refuse(plan, weight, detail));
        }
        let bias = bias(plan, weight, n, 0..n)?;
        let rows = self.blocks.rows_bytes(0..n)?;
        // `[n, m]`, into y's `[m, n]`, the bias added as the other
        // products add it.
        let t = dot::rows_times(self.ty, &rows, (k, self.blocks.out), x, m)?;
        let mut y = vec![0f32; m * n];
        for (j, tj) in t.chunks_exact(m.max(1)).enumerate() {
            for (r, &dot) in tj.iter().enumerate() {
                y[r * n + j] = dot + bias.as_ref().map_or(0.0, |b| b[j]);
            }
        }
        Ok(y)
    }
}

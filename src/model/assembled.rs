//! Products with SVDQuant's modules, whose dense weights `dequantize` puts
//! together from rows of its targets' jobs ([`Assembly`]): each value of W
//! decoded as the writer decodes it (the residual code scaled, its rank-r
//! low-rank dot added, the smoothing applied, then rounded to the output
//! dtype), so that the products keep to the bound against the very W it
//! writes.

use super::{bias, dense_product, output, refuse, Dense};
use crate::backend::gpu::{GpuDecoder, PackedLinear};
use crate::backend::Cpu;
use crate::error::Result;
use crate::output::assembly::Assembly;
use crate::plan::Plan;

/// Refuses an expert of an SVDQuant module, which is one Linear.
pub(super) fn one(plan: &Plan<'_>, (weight, expert): (&str, Option<usize>)) -> Result<()> {
    match expert {
        None => Ok(()),
        Some(_) => Err(refuse(plan, weight, "is not a stack of experts")),
    }
}

/// `y = x·Wᵀ (+ bias)` on the CPU for SVDQuant module `weight` of `plan`
/// (assembled as `a`): W's rows decoded by the writer's own assembly, a
/// block at a time ([`super::Model::matmul_cpu`]).
pub(super) fn matmul_cpu(
    plan: &Plan<'_>,
    weight: &str,
    a: &Assembly<'_>,
    x: &[f32],
    m: usize,
) -> Result<Vec<f32>> {
    let (n, k) = (a.stack.rows(), a.cols);
    let o = output(plan, weight)?;
    let cpu = Cpu::new();
    let dense = Dense {
        shape: (n, k),
        rows: 0..n,
        row_bytes: k * a.out.size(),
        out: a.out,
        bias: bias(plan, weight, n, 0..n)?,
    };
    dense_product(
        plan,
        weight,
        dense,
        |r, out| o.decode_rows(&cpu, r, out),
        x,
        m,
    )
}

/// SVDQuant module `weight` of `plan` (assembled as `a`) resident on
/// `decoder`'s device as its targets' packs are stored (codes, scales,
/// low-rank factors, smoothing), each band of rows a part of one Linear,
/// a band's blocks of inputs (a split_linear patch undone) summed in turn.
pub(super) async fn upload(
    plan: &Plan<'_>,
    weight: &str,
    a: &Assembly<'_>,
    decoder: &GpuDecoder,
) -> Result<PackedLinear> {
    let n = a.stack.rows();
    let bias = bias(plan, weight, n, 0..n)?;
    let mut bands = Vec::with_capacity(a.stack.bands.len());
    let mut top = 0;
    for band in &a.stack.bands {
        if band.parts.iter().map(|p| p.job.dims.cols).sum::<usize>() != a.cols {
            return Err(refuse(
                plan,
                weight,
                "a band of rows not as wide as the weight",
            ));
        }
        let b = bias.as_ref().map(|b| &b[top..top + band.rows]);
        let last = band.parts.len().saturating_sub(1);
        let mut blocks = Vec::with_capacity(band.parts.len());
        for (i, p) in band.parts.iter().enumerate() {
            // The bias once, with the last block of inputs.
            let b = b.filter(|_| i == last);
            let rows = p.row..p.row + band.rows;
            blocks.push(decoder.upload_linear_async(&p.job, rows, b, weight).await?);
        }
        bands.push(PackedLinear::columns(blocks, weight)?);
        top += band.rows;
    }
    PackedLinear::bands(bands, weight)
}

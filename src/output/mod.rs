//! What each tensor of the dense output is and where its bytes come from:
//! data only, known before anything is decoded. The backends execute it
//! ([`crate::backend::execute`]).

pub mod assembly;
pub mod blocks;
pub mod fold;
pub mod rearrange;

use crate::checkpoint::TensorRef;
use crate::job::{Bytes, DecodeJob, ZeroPoint};
use crate::numerics::OutDtype;
use assembly::{Assembly, BiasSum, BiasTerm};
use blocks::Blocks;
use fold::Fold;
use rearrange::Rearrange;
use safetensors::Dtype;

/// Where an output tensor's bytes come from.
#[derive(Debug)]
pub enum Source<'a> {
    /// A tensor copied as it is stored.
    Copy(TensorRef<'a>),
    /// A floating point tensor copied in another dtype (`--dtype`).
    Cast(TensorRef<'a>, OutDtype),
    /// A quantized module decoded to dense.
    Decode(Box<DecodeJob<'a>>),
    /// Bytes computed on the host while planning (converted scales).
    Bytes(Vec<u8>),
    /// A dense weight put together from rows of several jobs (SVDQuant).
    Assemble(Assembly<'a>),
    /// A bias computed on the host when written (SVDQuant activation shifts).
    Bias(BiasSum<'a>),
    /// A stored tensor rearranged on the host when written (conversions).
    Rearrange(Rearrange<'a>),
    /// A decoded weight with the rotations its runtime applies folded in.
    Fold(Box<Fold<'a>>),
    /// Rows of self-describing blocks, mapped to a job a run at a time (GGUF).
    Blocks(Blocks<'a>),
}

/// One tensor of the dense output.
#[derive(Debug)]
pub struct Output<'a> {
    /// Output tensor name.
    pub name: String,
    /// Index of the input shard whose output file receives it.
    pub shard: usize,
    /// Output shape.
    pub shape: Vec<usize>,
    /// Output dtype.
    pub dtype: Dtype,
    /// Where the bytes come from.
    pub source: Source<'a>,
    /// The scheme it was decoded with, for people (`None` for copies).
    pub scheme: Option<String>,
}

/// Rows (along the first dimension; a scalar is one row) and output bytes
/// per row of `t` cast to `to`.
pub fn cast_layout(t: &TensorRef<'_>, to: OutDtype) -> (usize, usize) {
    let (rows, cols) = match t.shape.split_first() {
        Some((&rows, rest)) => (rows, rest.iter().product()),
        None => (1, 1),
    };
    (rows, cols * to.size())
}

impl Source<'_> {
    /// Whether the tensor comes out of a quantized module (a decoded job, an
    /// assembled weight, or a bias that folds one in): what every count of
    /// "decoded" counts.
    pub fn is_decoded(&self) -> bool {
        matches!(
            self,
            Source::Decode(_)
                | Source::Assemble(_)
                | Source::Bias(_)
                | Source::Fold(_)
                | Source::Blocks(_)
        )
    }
}

impl<'a> Output<'a> {
    /// Size of the output tensor in bytes.
    pub fn byte_len(&self) -> usize {
        match &self.source {
            Source::Copy(t) => t.len(),
            Source::Cast(t, to) => t.elements() * to.size(),
            Source::Decode(job) => job.out_bytes(),
            Source::Bytes(b) => b.len(),
            Source::Assemble(a) => a.stack.rows() * a.cols * a.out.size(),
            Source::Bias(b) => b.stack.rows() * b.out.size(),
            Source::Rearrange(r) => r.byte_len(),
            Source::Fold(f) => f.dims().0 * f.dims().1 * f.out.size(),
            Source::Blocks(b) => b.rows * b.cols * b.out.size(),
        }
    }

    /// Rows and bytes per row of a tensor that is decoded row by row (and so
    /// can be streamed in bounded chunks); `None` for tensors made whole.
    pub fn row_layout(&self) -> Option<(usize, usize)> {
        match &self.source {
            Source::Decode(job) => Some((job.dims.total_rows(), job.dims.cols * job.out.size())),
            Source::Assemble(a) => Some((a.stack.rows(), a.cols * a.out.size())),
            Source::Cast(t, to) => Some(cast_layout(t, *to)),
            Source::Fold(f) => Some((f.dims().0, f.dims().1 * f.out.size())),
            Source::Blocks(b) => Some((b.rows, b.cols * b.out.size())),
            _ => None,
        }
    }

    /// Rows decoded together: a piece of rows (see [`Output::row_layout`])
    /// is best a multiple of them (a fold's output rotation mixes them).
    pub fn row_band(&self) -> usize {
        match &self.source {
            Source::Fold(f) => f.band(),
            _ => 1,
        }
    }

    /// The stored tensors this tensor is made from (scales and tables made
    /// on the host are not listed).
    pub fn inputs(&self) -> Vec<TensorRef<'a>> {
        fn of_job<'a>(job: &DecodeJob<'a>, v: &mut Vec<TensorRef<'a>>) {
            let mut add = |b: &Bytes<'a>| v.extend(b.tensor());
            add(&job.codes.data);
            if let Some(sp) = &job.sparse {
                add(&sp.mask.data);
            }
            if let Some(s) = &job.scale {
                add(&s.data);
            }
            if let Some(o) = &job.offset {
                add(&o.data);
            }
            match &job.zero {
                Some(ZeroPoint::Packed { fields } | ZeroPoint::PackedAlongCols { fields }) => {
                    add(&fields.data)
                }
                Some(ZeroPoint::Plain(z)) => add(&z.data),
                None => {}
            }
            // A codebook's indices (its table is made on the host); terms
            // that share a tensor (VPTQ's main and residual) list it once.
            for r in job.codebook.iter().flat_map(|c| &c.regions) {
                for t in r.terms.iter().filter_map(|t| t.data.tensor()) {
                    if !v.iter().any(|x| x.name == t.name) {
                        v.push(t);
                    }
                }
            }
        }
        let mut v = Vec::new();
        match &self.source {
            Source::Copy(t) | Source::Cast(t, _) => v.push(*t),
            Source::Decode(job) => of_job(job, &mut v),
            Source::Fold(f) => of_job(&f.job, &mut v),
            Source::Assemble(a) => {
                for band in &a.stack.bands {
                    for p in &band.parts {
                        of_job(&p.job, &mut v);
                    }
                }
            }
            Source::Bias(b) => {
                for band in &b.stack.bands {
                    for term in &band.parts {
                        if let BiasTerm::Shift { piece, .. } = term {
                            of_job(&piece.job, &mut v);
                        }
                    }
                }
            }
            Source::Rearrange(r) => v.extend(r.inputs()),
            Source::Blocks(b) => v.push(b.tensor),
            Source::Bytes(_) => {}
        }
        v
    }
}

impl<'a> Output<'a> {
    /// The stored bytes rows `rows` of a tensor decoded by rows were the last
    /// to read, when they are known: the part of its codes (or of a cast
    /// tensor) between the first byte `rows.start` reads and the first byte
    /// `rows.end` reads. A writer releases them from memory once the rows
    /// are written, so one huge tensor never stays resident whole. Scales
    /// and zero points (a small fraction) are released with the tensor.
    pub fn spent_inputs(&self, rows: std::ops::Range<usize>) -> Option<&'a [u8]> {
        let (data, lo, hi) = match &self.source {
            Source::Decode(job) => {
                let t = job.codes.data.tensor()?;
                // Lanes that share bytes (HQQ's parts and slices) are
                // released with the tensor.
                let stored = job.stored_dims();
                if !job.codes.in_order(stored.slices, stored.rows) {
                    return None;
                }
                let total = job.dims.total_rows();
                // The byte where the codes of flat output row `r` start; a
                // transposed job reads whole stored slices.
                let start = |r: usize| -> Option<usize> {
                    if r >= total {
                        return Some(t.len());
                    }
                    let (slice, row) = (r / job.dims.rows, r % job.dims.rows);
                    let bit = if job.transposed {
                        job.codes.lane_start(slice, 0)?
                    } else {
                        job.codes_start(slice, row)?
                    };
                    Some((bit / 8) as usize)
                };
                (t.stored(), start(rows.start)?, start(rows.end)?)
            }
            Source::Blocks(b) => return b.stored(rows),
            Source::Cast(t, _) => {
                let (total, _) = cast_layout(t, OutDtype::F32);
                let per_row = t.len() / total.max(1);
                (t.stored(), rows.start * per_row, rows.end * per_row)
            }
            _ => return None,
        };
        data.get(lo.min(hi)..hi.min(data.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Dims, Fields};

    /// Pieces of rows release their codes exactly once, in order, and
    /// together all of them; a transposed job only whole slices.
    #[test]
    fn spent_inputs_partition_the_codes() {
        let data = vec![7u8; 3 * 10 * 16];
        let shape = [3, 10, 32];
        for transposed in [false, true] {
            let t = TensorRef::of_bytes("w", Dtype::U8, &shape, &data);
            let dims = Dims {
                slices: 3,
                rows: 10,
                cols: 32,
            };
            let codes = Fields::dense(t, 4, 16 * 8).with_slice_bits(10 * 16 * 8);
            let mut job = DecodeJob::new(dims, codes, vec![0.0; 16], OutDtype::Bf16);
            if transposed {
                job = job.transpose();
            }
            let total = job.dims.total_rows();
            let out = Output {
                name: "w".into(),
                shard: 0,
                shape: vec![],
                dtype: Dtype::BF16,
                source: Source::Decode(Box::new(job)),
                scheme: None,
            };
            let mut next = data.as_ptr() as usize;
            for start in (0..total).step_by(7) {
                let rows = start..(start + 7).min(total);
                let spent = out.spent_inputs(rows.clone()).unwrap_or_default();
                if !spent.is_empty() {
                    assert_eq!(spent.as_ptr() as usize, next, "{rows:?}");
                    if transposed {
                        assert_eq!((next - data.as_ptr() as usize) % 160, 0, "whole slices");
                    }
                }
                next += spent.len();
            }
            assert_eq!(
                next,
                data.as_ptr() as usize + data.len(),
                "transposed {transposed}"
            );
        }
    }
}

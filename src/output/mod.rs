//! What each tensor of the dense output is and where its bytes come from:
//! data only, known before anything is decoded. The backends execute it
//! ([`crate::backend::execute`]).

pub mod assembly;
pub mod rearrange;

use crate::checkpoint::TensorRef;
use crate::job::{Bytes, DecodeJob, ZeroPoint};
use crate::numerics::OutDtype;
use assembly::{Assembly, BiasSum, BiasTerm};
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
            Source::Decode(_) | Source::Assemble(_) | Source::Bias(_)
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
        }
    }

    /// Rows and bytes per row of a tensor that is decoded row by row (and so
    /// can be streamed in bounded chunks); `None` for tensors made whole.
    pub fn row_layout(&self) -> Option<(usize, usize)> {
        match &self.source {
            Source::Decode(job) => Some((job.dims.total_rows(), job.dims.cols * job.out.size())),
            Source::Assemble(a) => Some((a.stack.rows(), a.cols * a.out.size())),
            Source::Cast(t, to) => Some(cast_layout(t, *to)),
            _ => None,
        }
    }

    /// The stored tensors this tensor is made from (scales and tables made
    /// on the host are not listed).
    pub fn inputs(&self) -> Vec<TensorRef<'a>> {
        fn of_job<'a>(job: &DecodeJob<'a>, v: &mut Vec<TensorRef<'a>>) {
            let mut add = |b: &Bytes<'a>| {
                if let Bytes::Stored(t) = b {
                    v.push(*t);
                }
            };
            add(&job.codes.data);
            if let Some(s) = &job.scale {
                add(&s.data);
            }
            match &job.zero {
                Some(ZeroPoint::Packed { fields } | ZeroPoint::PackedAlongCols { fields }) => {
                    add(&fields.data)
                }
                Some(ZeroPoint::Plain(z)) => add(&z.data),
                None => {}
            }
        }
        let mut v = Vec::new();
        match &self.source {
            Source::Copy(t) | Source::Cast(t, _) => v.push(*t),
            Source::Decode(job) => of_job(job, &mut v),
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
            Source::Rearrange(r) => v.extend(r.input()),
            Source::Bytes(_) => {}
        }
        v
    }
}

/// A rule finding that does not stop decoding.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Warning {
    /// The tensor or module concerned.
    pub subject: String,
    /// What was noticed.
    pub detail: String,
}

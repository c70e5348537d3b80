//! The quantized weights products take, as the plan holds them: a job
//! decoding packs, or a tensor of self-describing blocks (GGUF's), whose
//! rows are mapped into one job of the whole tensor here, with the map
//! `dequantize` uses, so that W is what it writes.

use std::borrow::Cow;

use crate::error::Result;
use crate::job::DecodeJob;
use crate::output::blocks::Blocks;
use crate::output::Source;

/// A quantized weight of a plan.
pub(super) enum Held<'p, 'c> {
    /// Packs the plan decodes with this job.
    Job(&'p DecodeJob<'c>),
    /// Rows of ggml blocks of a quantized type: not the float tensors
    /// (F32, F16, BF16: copies), nor rows whose values move by a constant
    /// (norms stored as `w + 1`), which no Linear holds.
    Blocks(&'p Blocks<'c>),
}

impl<'p, 'c> Held<'p, 'c> {
    /// The quantized weight `source` decodes, if it is one.
    pub(super) fn of(source: &'p Source<'c>) -> Option<Held<'p, 'c>> {
        match source {
            Source::Decode(job) => Some(Held::Job(job)),
            Source::Blocks(b) if b.map.is_some() && b.shift.is_none() => Some(Held::Blocks(b)),
            _ => None,
        }
    }

    /// The stored bytes its job reads besides the plan's: a tensor of
    /// blocks' rows in output order (gathered where they are another
    /// order of the stored ones: Q and K's rotary halves), as the writer
    /// reads them.
    pub(super) fn rows(&self) -> Result<Option<Cow<'c, [u8]>>> {
        match self {
            Held::Job(_) => Ok(None),
            Held::Blocks(b) => b.rows_bytes(0..b.rows).map(Some),
        }
    }

    /// Its job over every row: the plan's, or the one its blocks `rows`
    /// ([`Held::rows`]) map to.
    pub(super) fn job<'a>(&'a self, rows: Option<&'a [u8]>) -> Result<Cow<'a, DecodeJob<'a>>> {
        match (self, rows) {
            (Held::Job(job), _) => Ok(Cow::Borrowed(*job)),
            (Held::Blocks(b), Some(rows)) => match b.job(rows, b.out) {
                Some(job) => job.map(Cow::Owned),
                None => Err(b.tensor.error(
                    crate::error::Rule::Internal,
                    "a float tensor taken for blocks",
                )),
            },
            (Held::Blocks(b), None) => Err(b
                .tensor
                .error(crate::error::Rule::Internal, "its rows not read")),
        }
    }
}

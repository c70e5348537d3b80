//! The quantized weights products take, as the plan holds them: a job
//! decoding packs, or a tensor of self-describing blocks (GGUF's), whose
//! rows are mapped into one job of the whole tensor here, with the map
//! `dequantize` uses, so that W is what it writes; or SVDQuant's weights,
//! put together from rows and columns of its targets' jobs.

use std::borrow::Cow;

use crate::error::Result;
use crate::job::DecodeJob;
use crate::output::assembly::Assembly;
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
    /// SVDQuant's modules: bands of rows of its targets' jobs (each with
    /// its low-rank branch), a band's jobs side by side where a patch split
    /// the module's inputs. Not the other assembled weights (mlx-lm's
    /// experts, reached through their stacks; GPT-OSS's interleaved ones).
    Assembled(&'p Assembly<'c>),
}

impl<'p, 'c> Held<'p, 'c> {
    /// The quantized weight `source` decodes, if it is one.
    pub(super) fn of(source: &'p Source<'c>) -> Option<Held<'p, 'c>> {
        match source {
            Source::Decode(job) => Some(Held::Job(job)),
            Source::Blocks(b) if b.map.is_some() && b.shift.is_none() => Some(Held::Blocks(b)),
            Source::Assemble(a) if !a.interleaved && svdquant(a) => Some(Held::Assembled(a)),
            _ => None,
        }
    }

    /// The stored bytes its job reads besides the plan's: a tensor of
    /// blocks' rows in output order (gathered where they are another
    /// order of the stored ones: Q and K's rotary halves), as the writer
    /// reads them.
    pub(super) fn rows(&self) -> Result<Option<Cow<'c, [u8]>>> {
        match self {
            Held::Job(_) | Held::Assembled(_) => Ok(None),
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
            (Held::Assembled(_), _) => Err(crate::error::Error::bare(
                crate::error::Rule::Internal,
                "an assembled weight has no one job",
            )),
        }
    }
}

/// Whether every job of `a` has SVDQuant's low-rank branch.
fn svdquant(a: &Assembly<'_>) -> bool {
    let mut jobs = a.stack.bands.iter().flat_map(|b| &b.parts);
    !a.stack.is_empty() && jobs.all(|p| p.job.low_rank.is_some() && !p.job.transposed)
}

//! Code tables of 4-bit jobs: the encoded output of each of the 16 codes
//! under one entry, computed with exactly the operations
//! `DecodeJob::value` performs (`(c − zero)·scale` in the job's `Product`
//! arithmetic, then the post scale,
//! rounded once), and
//! their byte planes for the vector lookups.
//!
//! Jobs without zero points whose scale is a byte through a 256-entry table
//! (e8m0, e4m3: MXFP4, NVFP4, GPT-OSS) have at most 256 different tables:
//! [`ByScale`] builds them once per job, and an entry's table is then the
//! scale byte itself, however small the entries.

use super::simd::{self, Isa};
use crate::job::{DecodeJob, ValueKind};
use crate::numerics::{self, OutDtype};

/// One entry's table.
#[derive(Debug, Clone, Copy)]
pub(super) struct Table16 {
    /// The encoded output of each code (16 or 32 bits).
    pub(super) values: [u32; 16],
    /// Byte `b` of each value in plane `b` ([`simd::planes`]).
    pub(super) planes: [[u8; 16]; 4],
}

impl Table16 {
    /// The table of `job`'s 16 codes under (`zero`, `scale`), with the
    /// instructions of `isa`.
    pub(super) fn new(
        isa: Isa,
        job: &DecodeJob<'_>,
        zero: Option<f32>,
        scale: Option<f32>,
    ) -> Table16 {
        let mut table = None;
        Table16::extend(isa, job, [(zero, scale)], &mut |t| table = Some(t));
        table.unwrap_or_else(|| {
            Table16::scalar(isa, job, zero, scale, (job.post_scale, job.out), None)
        })
    }

    /// The table of `job`'s 16 codes under (`zero`, `scale`), its offset
    /// `offset` added last (the vector kernel does not add one).
    pub(super) fn with_offset(
        isa: Isa,
        job: &DecodeJob<'_>,
        zero: Option<f32>,
        scale: Option<f32>,
        offset: f32,
    ) -> Table16 {
        Table16::scalar(
            isa,
            job,
            zero,
            scale,
            (job.post_scale, job.out),
            Some(offset),
        )
    }

    /// The tables of `entries` (zero point, scale), given to `each` in
    /// order: a batch at a time by the vector kernel where `isa` runs it,
    /// else one by one; one table per entry either way.
    pub(super) fn extend(
        isa: Isa,
        job: &DecodeJob<'_>,
        entries: impl IntoIterator<Item = (Option<f32>, Option<f32>)>,
        each: &mut impl FnMut(Table16),
    ) {
        Table16::extend_as(isa, job, (job.post_scale, job.out), entries, each)
    }

    /// The tables of the f32 products `(c − zero)·scale` themselves, for
    /// jobs that multiply them by a factor per column before rounding (the
    /// smoothing of a rank-0 [`crate::job::LowRank`]); no 16-bit product,
    /// no post scale.
    pub(super) fn products(
        isa: Isa,
        job: &DecodeJob<'_>,
        entries: impl IntoIterator<Item = (Option<f32>, Option<f32>)>,
        each: &mut impl FnMut(Table16),
    ) {
        Table16::extend_as(isa, job, (None, OutDtype::F32), entries, each)
    }

    /// `extend` with its post scale and output dtype `how`.
    fn extend_as(
        isa: Isa,
        job: &DecodeJob<'_>,
        (post, out): (Option<f32>, OutDtype),
        entries: impl IntoIterator<Item = (Option<f32>, Option<f32>)>,
        each: &mut impl FnMut(Table16),
    ) {
        let mut entries = entries.into_iter();
        let how = (post.unwrap_or(1.0), out);
        let codes = job
            .code_values
            .first_chunk::<16>()
            .filter(|_| job.product_dtype().is_none());
        if let Some(codes) = codes {
            let mut batch = [(None, None); 16];
            loop {
                let mut n = 0;
                // The batch first: zip takes from it first, and leaves the
                // entries past a full batch where they are.
                for (b, e) in batch.iter_mut().zip(entries.by_ref()) {
                    *b = e;
                    n += 1;
                }
                if n == 0 {
                    return;
                }
                if !Table16::vector_batch(isa, codes, &batch[..n], how, each) {
                    // Nothing given (f16 without F16C): this batch's tables
                    // one by one too, so that every entry has its table.
                    for &(zero, scale) in &batch[..n] {
                        each(Table16::scalar(isa, job, zero, scale, (post, out), None));
                    }
                    break;
                }
            }
        }
        for (zero, scale) in entries {
            each(Table16::scalar(isa, job, zero, scale, (post, out), None));
        }
    }

    /// The tables of `batch` by the vector kernel, given to `each`; false,
    /// having given none, where `isa` does not run it.
    fn vector_batch(
        isa: Isa,
        codes: &[f32; 16],
        batch: &[(Option<f32>, Option<f32>)],
        how: (f32, OutDtype),
        each: &mut impl FnMut(Table16),
    ) -> bool {
        // Without a 16-bit product, a missing zero point, scale or post
        // scale is the same as 0 or 1: x − 0 and x · 1 are x exactly.
        let mut plain = [(0.0, 1.0); 16];
        for (p, &(z, s)) in plain.iter_mut().zip(batch) {
            *p = (z.unwrap_or(0.0), s.unwrap_or(1.0));
        }
        let n = batch.len().min(16);
        simd::tables16(isa, codes, &plain[..n], how, &mut |values, planes| {
            each(Table16 { values, planes })
        })
    }

    /// `new` without the vector kernel, with the post scale and output
    /// dtype `how`, and `offset` added last when there is one.
    fn scalar(
        isa: Isa,
        job: &DecodeJob<'_>,
        zero: Option<f32>,
        scale: Option<f32>,
        how: (Option<f32>, OutDtype),
        offset: Option<f32>,
    ) -> Table16 {
        let mut v: [f32; 16] =
            std::array::from_fn(|k| job.code_values.get(k).copied().unwrap_or(0.0));
        // Each step its own loop, without a branch inside: each vectorizes.
        if let Some(z) = zero {
            v.iter_mut().for_each(|v| *v -= z);
        }
        match (job.product_dtype(), scale) {
            (None, Some(s)) => v.iter_mut().for_each(|v| *v *= s),
            (None, None) => {}
            // A 16-bit product (job::Product): `DecodeJob::scaled`'s
            // operations, a step at a time over the table.
            (Some(d), s) => {
                d.round_all(&mut v);
                if let Some(s) = s {
                    let s = d.round(s);
                    v.iter_mut().for_each(|v| *v *= s);
                    d.round_all(&mut v);
                }
            }
        }
        if let Some(f) = how.0 {
            v.iter_mut().for_each(|v| *v *= f);
        }
        if let Some(o) = offset {
            v.iter_mut().for_each(|v| *v += o);
        }
        let mut values = [0u32; 16];
        let pairs = values.iter_mut().zip(&v);
        match how.1 {
            OutDtype::Bf16 => pairs.for_each(|(t, &v)| *t = numerics::f32_to_bf16(v) as u32),
            OutDtype::F16 => pairs.for_each(|(t, &v)| *t = numerics::f32_to_f16(v) as u32),
            OutDtype::F32 => pairs.for_each(|(t, &v)| *t = numerics::f32_bits(v)),
        }
        Table16 {
            values,
            planes: simd::planes(isa, &values),
        }
    }
}

/// The 256 tables of a 4-bit job without zero points whose scale is a
/// byte through a table, by scale byte.
#[derive(Debug)]
pub(super) struct ByScale {
    tables: Vec<Table16>,
}

impl ByScale {
    /// The tables, when `job` is such a job.
    pub(super) fn of(isa: Isa, job: &DecodeJob<'_>) -> Option<ByScale> {
        let scale = job.scale.as_ref()?;
        let ValueKind::Table(t) = &scale.kind else {
            return None;
        };
        if job.zero.is_some() || job.code_values.len() != 16 || job.low_rank.is_some() {
            return None;
        }
        Some(ByScale {
            tables: t
                .iter()
                .map(|&s| Table16::new(isa, job, None, Some(s)))
                .collect(),
        })
    }

    /// The table of the entry whose scale is stored at `index`.
    #[inline]
    pub(super) fn at<'t>(&'t self, job: &DecodeJob<'_>, index: usize) -> &'t Table16 {
        self.byte(job.scale.as_ref().map_or(0, |s| s.data[index]))
    }

    /// The table of scale byte `b`.
    #[inline]
    pub(super) fn byte(&self, b: u8) -> &Table16 {
        &self.tables[b as usize]
    }
}

/// Tables by scale byte that are all one table shifted: each value of
/// nonzero magnitude plus the byte's own shift, the zeros as they are (a
/// scale that is a power of two, its products normal: e8m0's MXFP4), which
/// [`simd::shifted_block`] decodes without a table per column.
#[derive(Debug)]
pub(super) struct Shifted {
    /// The table the others are shifts of (scale byte 127's, e8m0's 1).
    pub(super) base: [u32; 16],
    /// Each byte's shift, and whether its table is exactly that.
    pub(super) by_byte: [u32; 256],
    pub(super) exact: [bool; 256],
}

impl ByScale {
    /// The shifts of these tables of N-byte outputs, where any is one.
    pub(super) fn shifted(&self, n: usize) -> Option<Shifted> {
        let (mag, wrap) = if n == 2 {
            (0x7FFF, 0xFFFF)
        } else {
            (0x7FFF_FFFF, u32::MAX)
        };
        let base = self.tables[127].values;
        let c = base.iter().position(|&v| v & mag != 0)?;
        let by_byte: [u32; 256] =
            std::array::from_fn(|b| self.tables[b].values[c].wrapping_sub(base[c]) & wrap);
        let exact = std::array::from_fn(|b| {
            let t = &self.tables[b].values;
            (0..16).all(|k| {
                let want = if base[k] & mag == 0 {
                    base[k]
                } else {
                    base[k].wrapping_add(by_byte[b]) & wrap
                };
                t[k] == want
            })
        });
        Some(Shifted {
            base,
            by_byte,
            exact,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Dims, Fields};

    /// The tables of `entries` under `isa`, as `Rows` gathers a row's.
    fn tables(
        isa: Isa,
        job: &DecodeJob<'_>,
        entries: &[(Option<f32>, Option<f32>)],
    ) -> Vec<[u32; 16]> {
        let mut got = Vec::new();
        Table16::extend(isa, job, entries.iter().copied(), &mut |t| {
            got.push(t.values)
        });
        got
    }

    /// Every entry gets its own table, whichever kernels `isa` allows and
    /// whether or not the vector one declines a batch (f16 without F16C):
    /// a table list one short would decode a group through another's.
    #[test]
    fn every_entry_has_its_table_under_every_isa() {
        let codes: Vec<f32> = (0..16).map(|c| c as f32 - 8.0).collect();
        // More entries than one batch of the vector kernel, not a multiple.
        let entries: Vec<_> = (0..37)
            .map(|k| (Some(k as f32 / 4.0), Some(0.5 + k as f32 / 64.0)))
            .collect();
        for out in [OutDtype::Bf16, OutDtype::F16, OutDtype::F32] {
            let dims = Dims {
                slices: 1,
                rows: 1,
                cols: 32,
            };
            let job = DecodeJob::new(
                dims,
                Fields::dense(&[0u8; 16][..], 4, 128),
                codes.clone(),
                out,
            );
            let want = tables(Isa::of(simd::Kernels::Scalar), &job, &entries);
            assert_eq!(want.len(), entries.len(), "{out}");
            for isa in [
                Isa::detect(),
                Isa::of(simd::Kernels::Narrow),
                Isa::detect().without_f16c(),
            ] {
                assert_eq!(tables(isa, &job, &entries), want, "{out} {isa:?}");
            }
        }
    }
}

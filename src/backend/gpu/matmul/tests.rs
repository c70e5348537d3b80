//! Which products skip rounding, and which round by the carry alone.

use super::*;
use crate::job::{Dims, Fields, Grid, ValueKind, Values};
use crate::numerics::{e2m1, e4m3, e8m0, OutDtype};

/// A 4 × 64 job of zero `bits`-bit codes valued `values`, scaled per 32
/// columns by `scale` (its kind and stored bytes) when given.
fn job(
    bits: u32,
    values: Vec<f32>,
    scale: Option<(ValueKind, Vec<u8>)>,
    out: OutDtype,
) -> DecodeJob<'static> {
    let codes = Fields::dense(
        vec![0u8; 4 * 64 * bits as usize / 8],
        bits,
        64 * u64::from(bits),
    );
    let dims = Dims {
        slices: 1,
        rows: 4,
        cols: 64,
    };
    let job = DecodeJob::new(dims, codes, values, out);
    match scale {
        None => job,
        Some((kind, data)) => job.with_scale(Values {
            data: data.into(),
            kind,
            grid: Grid {
                row_div: 1,
                col_div: 32,
                row_stride: 2,
                slice_stride: 0,
            },
        }),
    }
}

/// The fast kernel `job` runs on.
fn fast(job: &DecodeJob<'_>) -> Weights {
    match fast_kernel(job) {
        Some(Kernel::Fast(k)) => Weights::Packed(k),
        other => panic!("not a fast job: {other:?}"),
    }
}

/// Whether the products skip rounding a job of `bits`-bit codes valued
/// `values`, scaled by bytes read as `scale`.
fn exact_job(bits: u32, values: Vec<f32>, scale: Option<ValueKind>, out: OutDtype) -> bool {
    let scale = scale.map(|kind| {
        let bytes = match kind {
            ValueKind::Bf16 => 16,
            _ => 8,
        };
        (kind, vec![0u8; bytes])
    });
    let job = job(bits, values, scale, out);
    exact(&job, fast(&job))
}

fn e8m0_table() -> ValueKind {
    ValueKind::Table(Box::new(std::array::from_fn(|b| e8m0(b as u8))))
}

#[test]
fn rounding_is_skipped_only_where_bf16_holds_every_value() {
    let fp4 = || (0..16).map(e2m1).collect::<Vec<f32>>();
    let fp8 = || (0..=255).map(e4m3).collect::<Vec<f32>>();
    // MXFP4: 2 significant bits times a power of two, 2^-128 at least.
    assert!(exact_job(4, fp4(), Some(e8m0_table()), OutDtype::Bf16));
    assert!(exact_job(8, fp8(), None, OutDtype::Bf16));
    // f16's range is narrower; a bf16 scale brings 8 bits of its own.
    assert!(!exact_job(4, fp4(), Some(e8m0_table()), OutDtype::F16));
    assert!(!exact_job(4, fp4(), Some(ValueKind::Bf16), OutDtype::Bf16));
    // E4M3's subnormals (2^-9) times 2^-127 are below bf16's smallest.
    assert!(!exact_job(8, fp8(), Some(e8m0_table()), OutDtype::Bf16));
    // Nine significant bits.
    let wide = (0..16)
        .map(|c| if c == 1 { 257.0 } else { c as f32 })
        .collect();
    assert!(!exact_job(4, wide, None, OutDtype::Bf16));
}

#[test]
fn rounding_by_the_carry_only_where_w_has_no_nan() {
    let int4 = || (0..16).map(|c| c as f32 - 8.0).collect::<Vec<f32>>();
    let bf16_scaled = |bits, values, scales: &[u16], out| {
        let data = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        job(bits, values, Some((ValueKind::Bf16, data)), out)
    };
    let rounding = |job: &DecodeJob<'_>| Rounding::of(job, fast(job), 0..job.dims.total_rows());
    let finite = [0x3c00u16; 8];
    let int4_job = |scales: &[u16], out| bf16_scaled(4, int4(), scales, out);
    assert_eq!(
        rounding(&int4_job(&finite, OutDtype::Bf16)),
        Rounding::Carry
    );
    // One stored scale NaN, or infinite (times a zero code: NaN).
    for bad in [0x7fc1, 0x7f80] {
        let mut scales = finite;
        scales[5] = bad;
        assert_eq!(rounding(&int4_job(&scales, OutDtype::Bf16)), Rounding::Full);
    }
    // E4M3's NaN codes; f16's own rounding.
    let fp8 = (0..=255).map(e4m3).collect::<Vec<f32>>();
    assert_eq!(
        rounding(&bf16_scaled(8, fp8, &[0; 8], OutDtype::Bf16)),
        Rounding::Full
    );
    assert_eq!(rounding(&int4_job(&finite, OutDtype::F16)), Rounding::Full);
}

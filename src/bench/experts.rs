//! `bench --gemv`'s routed experts: 8 rows of x over 4 of a stack's 32
//! experts in one call ([`GpuDecoder::record_matmul_experts`]) against the
//! 4 experts multiplied one by one, each with its rows of x gathered by
//! hand beforehand (what an app does without the call).

use super::cases::{Layout, Weight};
use super::gemv::Batch;
use super::report::Figure;
use super::timing::best_in_turns;
use crate::backend::gpu::{GpuDecoder, PackedLinear, Product};
use crate::error::Result;
use crate::numerics::OutDtype;

/// Experts in the stack.
const EXPERTS: usize = 32;

/// The experts of 8 rows of x: 4 of the 32, some rows to the same one.
const IDS: [u32; 8] = [3, 19, 3, 7, 28, 19, 3, 7];

/// Times the experts call against the experts it touches one by one,
/// experts `[n, k]` (`bench --gemv`'s last shape: by default a MoE
/// expert's projection).
pub(super) fn gpu_experts(
    decoder: &GpuDecoder,
    (n, k): (usize, usize),
    (runs, only): (usize, &str),
    mut show: impl FnMut(Figure),
) -> Result<()> {
    let layout = Layout::Mxfp4;
    let what = format!(
        "routed experts: {} rows over 4 of {EXPERTS}, {} {n}x{k}",
        IDS.len(),
        layout.name()
    );
    if !what.contains(only) {
        return Ok(());
    }
    let device = decoder.device();
    let w = Weight::random(layout, EXPERTS * n, k, 13);
    let job = w.job(OutDtype::Bf16);
    let upload = |e: usize| {
        pollster::block_on(decoder.upload_linear_async(&job, e * n..(e + 1) * n, None, &what))
    };
    let stack = PackedLinear::stack((0..EXPERTS).map(upload).collect::<Result<_>>()?, &what)?;
    let buffer = |values: &[f32], len: usize| {
        let b = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-dequant bench experts"),
            size: (4 * len).max(4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        decoder
            .queue()
            .write_buffer(&b, 0, bytemuck::cast_slice(values));
        b
    };
    let m = IDS.len();
    let mut rng = fastrand::Rng::with_seed(17);
    let xs: Vec<f32> = (0..m * k).map(|_| rng.f32() - 0.5).collect();
    let (x, y) = (buffer(&xs, m * k), buffer(&[], m * n));
    // The experts touched, each with its rows of x gathered by hand.
    let mut touched: Vec<u32> = IDS.to_vec();
    touched.sort_unstable();
    touched.dedup();
    let mut alone = Vec::new();
    for &e in &touched {
        let rows: Vec<usize> = (0..m).filter(|&r| IDS[r] == e).collect();
        let xe: Vec<f32> = rows
            .iter()
            .flat_map(|&r| &xs[r * k..(r + 1) * k])
            .copied()
            .collect();
        let ye = buffer(&[], rows.len() * n);
        alone.push((
            upload(e as usize)?,
            buffer(&xe, xe.len()),
            ye,
            rows.len() as u32,
        ));
    }
    let bytes = alone.iter().map(|(w, ..)| w.gpu_bytes()).sum::<u64>() + (4 * m * k) as u64;
    let record = |encoder: &mut wgpu::CommandEncoder, _| {
        decoder.record_matmul_experts(encoder, &stack, &x, &IDS, &y)
    };
    let mut ours = Batch::with(decoder, Box::new(record))?;
    let record = |encoder: &mut wgpu::CommandEncoder, _| {
        alone
            .iter()
            .try_for_each(|(w, xe, ye, me)| decoder.record_matmul(encoder, w, xe, ye, *me))
    };
    let mut apart = Batch::with(decoder, Box::new(record))?;
    let (w, xe, ye, me) = &alone[0];
    let io = (xe, ye, *me);
    let mut empty = Batch::of(decoder, std::slice::from_ref(w), Product::Overhead, io)?;
    let [ours, apart, empty] = best_in_turns(
        runs,
        [&mut || ours.seconds(), &mut || apart.seconds(), &mut || {
            empty.seconds()
        }],
    )?;
    show(Figure {
        backend: "gpu",
        what,
        baseline: "the 4 experts one by one".to_string(),
        bytes,
        seconds: ours,
        baseline_seconds: apart,
        m: Some(m),
        baseline_bytes: Some(bytes),
        dispatch_seconds: Some(empty),
    });
    Ok(())
}

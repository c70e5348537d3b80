//! `bench --gemv`: products with packed weights against the read kernel
//! and the dense product, timed in batches of many products.

use std::time::{Duration, Instant};

use super::cases::{Layout, Weight};
use super::report::Figure;
use super::timing::best_in_turns;
use crate::backend::gpu::{GpuDecoder, PackedLinear};
use crate::error::{Error, Result, Rule};
use crate::formats::gguf::map_of;
use crate::gguf::GgmlType;
use crate::job::Dims;
use crate::numerics::OutDtype;

/// The weights `bench --gemv` multiplies by, `[out, in]`: a square and an
/// MLP's two projections of a 7B-class model, and a MoE expert.
pub const GEMV_SHAPES: [(usize, usize); 4] =
    [(4096, 4096), (4096, 14336), (14336, 4096), (2048, 768)];

/// Rows of x `bench --gemv` multiplies with: a token, and batches.
pub const GEMV_MS: [usize; 4] = [1, 4, 16, 64];

/// GGUF's types that apps ship, in `bench --gemv`.
const GGUF_TYPES: [GgmlType; 7] = [
    GgmlType::Q4_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
];

/// Products with packed weights (`gemv`, bf16 model weights) of every
/// layout the GPU multiplies by (and GGUF's common types), per shape and rows of x, against the read
/// kernel (the same packed bytes and x read with the same geometry, summed
/// as numbers) and against the product with the same weight dense in bf16
/// (what an app does without packed products). GB/s count the bytes each
/// kernel reads: packs (or the dense weight) and x. The three are timed in
/// turns, each in [`Batch`]es: on a fast device, of many products over
/// copies of the weights.
pub(crate) fn gpu_gemv(
    decoder: &GpuDecoder,
    (shapes, ms): (&[(usize, usize)], &[usize]),
    (runs, only): (usize, &str),
    mut show: impl FnMut(Figure),
) -> Result<()> {
    use crate::backend::gpu::Product;
    let device = decoder.device();
    let buffer = |bytes: u64, usage: wgpu::BufferUsages| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-dequant bench gemv"),
            size: bytes.max(4),
            usage: wgpu::BufferUsages::STORAGE | usage,
            mapped_at_creation: false,
        })
    };
    for &(n, k) in shapes {
        let mut rng = fastrand::Rng::with_seed(11);
        let dense: Vec<u8> = (0..n * k)
            .flat_map(|_| (0x3c00u16 | rng.u16(..0x200)).to_le_bytes())
            .collect();
        let mut x_of = |m: usize| {
            let x = buffer((4 * m * k) as u64, wgpu::BufferUsages::COPY_DST);
            let xs: Vec<f32> = (0..m * k).map(|_| rng.f32() - 0.5).collect();
            decoder
                .queue()
                .write_buffer(&x, 0, bytemuck::cast_slice(&xs));
            (x, buffer((4 * m * n) as u64, wgpu::BufferUsages::empty()))
        };
        let upload_dense = || decoder.upload_dense_bf16((n, k), &dense);
        let first = upload_dense()?;
        // A device whose dense product takes less than a batch is fast:
        // there the products are batched, over copies of the weights.
        let fast = {
            let (x, y) = x_of(1);
            let one = std::slice::from_ref(&first);
            let batch = Batch::of(decoder, one, Product::Decoded, (&x, &y, 1))?;
            batch.reps > 1
        };
        let dense = copies(first, fast, upload_dense)?;
        // Our product, the read kernel and the dense one, in turns, at each m.
        let mut measure = |name: &str, packed: &[PackedLinear]| -> Result<()> {
            let bytes = packed[0].gpu_bytes();
            for &m in ms {
                let (x, y) = x_of(m);
                let io = (&x, &y, m as u32);
                let mut ours = Batch::of(decoder, packed, Product::Decoded, io)?;
                let mut read = Batch::of(decoder, packed, Product::Read, io)?;
                let mut plain = Batch::of(decoder, &dense, Product::Decoded, io)?;
                let mut empty = Batch::of(decoder, packed, Product::Overhead, io)?;
                let [ours, read, plain, empty] = best_in_turns(
                    runs,
                    [
                        &mut || ours.seconds(),
                        &mut || read.seconds(),
                        &mut || plain.seconds(),
                        &mut || empty.seconds(),
                    ],
                )?;
                let x_bytes = (4 * m * k) as u64;
                let what = format!("{name} {n}x{k}");
                let figure = |baseline: &str, seconds, baseline_bytes| Figure {
                    backend: "gpu",
                    what: what.clone(),
                    baseline: baseline.to_string(),
                    bytes: bytes + x_bytes,
                    seconds: ours,
                    baseline_seconds: seconds,
                    m: Some(m),
                    baseline_bytes: Some(baseline_bytes),
                    dispatch_seconds: Some(empty),
                };
                show(figure(
                    "read kernel, same bytes and geometry",
                    read,
                    bytes + x_bytes,
                ));
                show(figure(
                    "dense bf16 gemv",
                    plain,
                    (2 * n * k) as u64 + x_bytes,
                ));
            }
            Ok(())
        };
        for layout in Layout::ALL
            .into_iter()
            .chain(Layout::ALONG_INPUTS)
            .filter(|l| l.name().contains(only))
        {
            // GPT-OSS's experts multiply as stored, `[out, in]` (Model::upload_expert):
            // its dense `[in, out]` transposed back.
            let gpt_oss = layout == Layout::GptOss;
            let (w, name) = match gpt_oss {
                true => (
                    Weight::random(layout, k, n, 7),
                    "gpt-oss mxfp4 experts (as stored)",
                ),
                false => (Weight::random(layout, n, k, 7), layout.name()),
            };
            let job = match gpt_oss {
                true => w.job(OutDtype::Bf16).transpose(),
                false => w.job(OutDtype::Bf16),
            };
            let upload = || pollster::block_on(decoder.upload_linear_async(&job, 0..n, None, name));
            measure(name, &copies(upload()?, fast, upload)?)?;
        }
        // GGUF's types, the whole tensor mapped as Model::upload_packed maps
        // it: scales on the host, codes read in the blocks (or mapped).
        for ty in GGUF_TYPES {
            let name = format!("gguf {ty}");
            if !name.contains(only) || !k.is_multiple_of(ty.block().0 as usize) {
                continue;
            }
            let data = super::gguf::blocks(ty, n, k);
            let map = map_of(ty).ok_or_else(|| Error::bare(Rule::Internal, "bench: no map"))?;
            let dims = Dims {
                slices: 1,
                rows: n,
                cols: k,
            };
            let job = map(&data, dims, OutDtype::Bf16)?;
            let upload =
                || pollster::block_on(decoder.upload_linear_async(&job, 0..n, None, &name));
            measure(&name, &copies(upload()?, fast, upload)?)?;
        }
    }
    match shapes.last() {
        Some(&shape) => super::experts::gpu_experts(decoder, shape, (runs, only), show),
        None => Ok(()),
    }
}

/// About how long a timed batch of products runs: on a real GPU one
/// product takes microseconds, less than a submission and its wait.
const BATCH: Duration = Duration::from_millis(5);

/// Bytes of weights a batch cycles through, at least: more than a GPU's
/// last-level cache (50 MB on an H100 or H200, 256 MB of Infinity Cache on
/// an MI300X), so that each product reads its weights from memory, as a
/// model's layers do one token after another.
const COLD: u64 = 512 << 20;

/// Copies of a weight a batch cycles through, at most.
const MAX_COPIES: u64 = 1024;

/// Bytes under which even [`MAX_COPIES`] copies stay in a GPU's last-level
/// cache (50 MB on an H100): there the copies cannot make a batch cold,
/// only slow to set up (a tiny shape took 1024 uploads per format), so a
/// batch cycles through one.
const WARM: u64 = 64 << 20;

/// `first` and, on a `fast` device, as many more copies from `upload` as
/// make [`COLD`] bytes (at most [`MAX_COPIES`] in all, and none where even
/// those would fit in a cache: [`WARM`]).
fn copies(
    first: crate::backend::gpu::PackedLinear,
    fast: bool,
    mut upload: impl FnMut() -> Result<crate::backend::gpu::PackedLinear>,
) -> Result<Vec<crate::backend::gpu::PackedLinear>> {
    let bytes = first.gpu_bytes().max(1);
    let count = COLD.div_ceil(bytes).min(MAX_COPIES);
    let count = match fast && count * bytes >= WARM {
        true => count,
        false => 1,
    };
    let mut all = vec![first];
    for _ in 1..count {
        all.push(upload()?);
    }
    Ok(all)
}

/// One kernel's timed batch: `reps` products recorded by `record` (the
/// i-th of them, cycling through copies of the weights), recorded before
/// the clock starts and submitted at once.
pub(super) struct Batch<'a> {
    decoder: &'a GpuDecoder,
    record: Record<'a>,
    reps: usize,
}

/// Records the i-th product of a batch into an encoder.
type Record<'a> = Box<dyn Fn(&mut wgpu::CommandEncoder, usize) -> Result<()> + 'a>;

impl<'a> Batch<'a> {
    /// The batch of products with `weights` read as `product`, one after
    /// another ([`Batch::with`]).
    pub(super) fn of(
        decoder: &'a GpuDecoder,
        weights: &'a [crate::backend::gpu::PackedLinear],
        product: crate::backend::gpu::Product,
        io: (&'a wgpu::Buffer, &'a wgpu::Buffer, u32),
    ) -> Result<Batch<'a>> {
        let record = move |encoder: &mut wgpu::CommandEncoder, i: usize| {
            decoder.record_product(encoder, &weights[i % weights.len()], io, product)
        };
        Batch::with(decoder, Box::new(record))
    }

    /// The batch of what `record` records that takes about [`BATCH`] or
    /// more (at least one, at most 4096), sized after a first run: a
    /// batch's time is the products' and one submission's.
    pub(super) fn with(decoder: &'a GpuDecoder, record: Record<'a>) -> Result<Batch<'a>> {
        let mut batch = Batch {
            decoder,
            record,
            reps: 1,
        };
        batch.seconds()?;
        loop {
            let total = batch.seconds()? * batch.reps as f64;
            if total >= BATCH.as_secs_f64() / 2.0 || batch.reps >= 4096 {
                return Ok(batch);
            }
            let more = batch.reps as f64 * BATCH.as_secs_f64() / total;
            batch.reps = (more.ceil() as usize).clamp(batch.reps + 1, 4096);
        }
    }

    /// Seconds a product takes: the batch's time over its products.
    pub(super) fn seconds(&mut self) -> Result<f64> {
        let d = self.decoder;
        let mut encoder = d.device().create_command_encoder(&Default::default());
        for i in 0..self.reps {
            (self.record)(&mut encoder, i)?;
        }
        let commands = encoder.finish();
        let t = Instant::now();
        d.queue().submit([commands]);
        d.device()
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::bare(Rule::Gpu, "bench: poll").caused_by(e))?;
        Ok(t.elapsed().as_secs_f64() / self.reps as f64)
    }
}

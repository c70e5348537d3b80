//! The GPU backend: the decode kernels of `shaders/decode/` run through
//! wgpu (Vulkan, Metal, DX12), executing the same [`DecodeJob`]s as the CPU
//! backend.
//!
//! One device; one bind group layout, the shader's inputs and output; a
//! pipeline per kernel variant, built on first use; two slots of reusable
//! buffers so the upload and dispatch of one chunk overlap the readback of
//! the previous one. This file holds the decoder; `adapter` finds the
//! device, `shader` builds the kernels' module, `layout` plans the chunks
//! and `matmul` multiplies with packed weights.

mod adapter;
mod codebook;
mod layout;
mod matmul;
mod shader;

pub use adapter::{
    find_adapter, find_adapter_async, find_adapter_on_async, is_hardware, no_adapter_message,
};
pub use matmul::PackedLinear;
pub(crate) use matmul::{rows_by_expert, Product};

use futures::channel::oneshot;
use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::Backend;
use crate::error::{Error, Result, Rule};
use crate::job::DecodeJob;
use layout::{Chunk, Fast, Kernel, Limits, Tile};
use shader::{bind_group_layout, DST, PARAMS, SRC};

fn gpu_err(detail: impl Into<String>) -> Error {
    Error::bare(Rule::Gpu, detail)
}

/// An error a device reported in an error scope, kept as the cause so a
/// caller can downcast it. In a browser wgpu's errors are neither `Send`
/// nor `Sync`, which a cause must be, so there its message stands in.
fn device_error(e: wgpu::Error) -> Error {
    #[cfg(not(target_arch = "wasm32"))]
    let cause = e;
    #[cfg(target_arch = "wasm32")]
    let cause = e.to_string();
    gpu_err("device error").caused_by(cause)
}

/// Buffers reused from chunk to chunk.
struct Slot {
    params: wgpu::Buffer,
    src: Option<wgpu::Buffer>,
    out: Option<wgpu::Buffer>,
    readback: Option<wgpu::Buffer>,
}

/// Returns `buf` if it holds `size` bytes, else a new, larger one.
fn ensure(
    device: &wgpu::Device,
    buf: &mut Option<wgpu::Buffer>,
    label: &str,
    size: u64,
    usage: wgpu::BufferUsages,
    cap: u64,
) -> wgpu::Buffer {
    match buf {
        Some(b) if b.size() >= size => b.clone(),
        _ => {
            // Grow generously so a run of similar tensors reuses one buffer.
            let size = (size.next_power_of_two()).min(cap).max(size);
            let b = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: false,
            });
            *buf = Some(b.clone());
            b
        }
    }
}

/// The first `len` bytes of a buffer, copied into `staging` by a submitted
/// command and being mapped for reading ([`GpuDecoder::start_readback`]).
struct Readback {
    staging: wgpu::Buffer,
    len: u64,
    submission: wgpu::SubmissionIndex,
    mapped: oneshot::Receiver<Result<(), wgpu::BufferAsyncError>>,
}

/// The usage of every buffer the decoder hands to an app: a storage buffer
/// that can be copied from and written to.
pub const OUTPUT_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// How many chunks each kernel has decoded ([`GpuDecoder::dispatches`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dispatches {
    /// Chunks run by a fast kernel (one code word per invocation).
    pub fast: u64,
    /// Chunks run by the generic kernel (one output word per invocation).
    pub generic: u64,
    /// Chunks run by the tile kernel (codes packed along the input
    /// dimension, one output tile per workgroup).
    pub tiled: u64,
    /// Calls decoded on the CPU instead, where a subnormal could be
    /// flushed ([`DecodeJob::stays_normal`]), or a codebook job the
    /// codebook kernel does not take.
    pub cpu: u64,
    /// Calls run by the codebook kernel ([`crate::job::Codebook`]).
    pub codebook: u64,
}

/// Decodes on a wgpu device: the app's own ([`GpuDecoder::new`]), or one
/// it opens on an adapter. `Model::decode_to_buffer` leaves a dense tensor
/// in a new buffer on that device.
///
/// Such a buffer holds the tensor's little-endian elements in row-major
/// order, as a safetensors file would (16-bit elements two to a 32-bit
/// word, the first in the low half); its size is the tensor's byte length
/// rounded up to a multiple of 4, the padding zero. Its usage is `STORAGE |
/// COPY_SRC | COPY_DST`: bind it as a storage buffer, or copy from it.
pub struct GpuDecoder {
    device: wgpu::Device,
    queue: wgpu::Queue,
    module: wgpu::ShaderModule,
    bind_group_layout: wgpu::BindGroupLayout,
    /// Of every pipeline: the bind group layout alone.
    pipeline_layout: wgpu::PipelineLayout,
    pipelines: std::sync::Mutex<HashMap<Kernel, wgpu::ComputePipeline>>,
    fast: bool,
    /// The device may flush subnormal f32 operands and results to zero
    /// ([`flushes_subnormals`]): jobs that could compute one are decoded on
    /// the CPU.
    flushes: bool,
    dispatched: [AtomicU64; 5],
    limits: Limits,
    /// Idle pairs of slots; each call takes one, so calls from several
    /// threads run at once and keep the queue full between them.
    slots: std::sync::Mutex<Vec<[Slot; 2]>>,
    /// The products with packed weights' layouts and pipelines.
    gemv: matmul::Pipelines,
    /// The codebook kernel, built on first use.
    codebook: codebook::Kernel,
}

/// Whether a device may flush subnormal f32 operands and results to zero.
/// WGSL allows it, and most do: NVIDIA's Vulkan driver (an H200 decoded
/// such values as zeros), Direct3D's rules (WARP too), and SwiftShader,
/// Chromium's fallback adapter. Only llvmpipe, the software Vulkan the
/// tests run on, is known to keep them, so that its runs take the GPU
/// kernels through subnormal values.
fn flushes_subnormals(info: &wgpu::AdapterInfo) -> bool {
    let llvmpipe = info.device_type == wgpu::DeviceType::Cpu
        && info.backend != wgpu::Backend::BrowserWebGpu
        && (info.name.contains("llvmpipe") || info.driver.contains("llvmpipe"));
    !llvmpipe
}

impl GpuDecoder {
    /// A decoder on `device`. Chunks are planned within the device's own
    /// limits; device errors are caught in error scopes around each call, so
    /// the app's own error handler is left alone.
    pub fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> GpuDecoder {
        let module = shader::module(device);
        let bind_group_layout = bind_group_layout(device);
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("wgpu-dequant pipeline layout"),
            bind_group_layouts: &[Some(&bind_group_layout)],
            immediate_size: 0,
        });
        GpuDecoder {
            limits: Limits::of(&device.limits()),
            device: device.clone(),
            queue: queue.clone(),
            module,
            bind_group_layout,
            pipeline_layout,
            pipelines: Default::default(),
            fast: true,
            flushes: flushes_subnormals(&device.adapter_info()),
            dispatched: Default::default(),
            slots: Default::default(),
            gemv: matmul::Pipelines::new(device),
            codebook: codebook::Kernel::new(),
        }
    }

    /// Opens `adapter` with its own limits and builds a decoder on it.
    pub async fn open_async(adapter: &wgpu::Adapter) -> Result<GpuDecoder> {
        let desc = wgpu::DeviceDescriptor {
            label: Some("wgpu-dequant"),
            required_limits: adapter.limits(),
            // The products share reads of x across a subgroup's lanes
            // (not in browsers: matmul::subgroups).
            required_features: match cfg!(target_arch = "wasm32") {
                true => wgpu::Features::empty(),
                false => adapter.features() & wgpu::Features::SUBGROUP,
            },
            ..Default::default()
        };
        let (device, queue) = adapter.request_device(&desc).await.map_err(|e| {
            gpu_err(format!("cannot open {}", adapter.get_info().name)).caused_by(e)
        })?;
        Ok(GpuDecoder::new(&device, &queue))
    }

    /// The adapter `BackendChoice::Gpu` opens (in a browser, WebGPU's):
    /// wgpu's `WGPU_BACKEND` picks the API, `WGPU_ADAPTER_NAME` (a substring)
    /// the adapter, `WGPU_POWER_PREF` the default. `None` when there is none.
    pub async fn adapter() -> Option<wgpu::Adapter> {
        find_adapter_async().await
    }

    /// The decoder `choice` runs products on, as decoding chooses its
    /// backend: `None` for `Cpu`, and for `Auto` without a hardware GPU
    /// (or one that does not open); an error for `Gpu` or a graphics API
    /// that reaches no adapter. For hosts that take a backend by name.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn for_backend(choice: super::BackendChoice) -> Result<Option<GpuDecoder>> {
        pollster::block_on(super::select::select_decoder(choice))
    }

    /// [`GpuDecoder::open_async`], blocking.
    pub fn open(adapter: &wgpu::Adapter) -> Result<GpuDecoder> {
        pollster::block_on(GpuDecoder::open_async(adapter))
    }

    /// Decodes every job with the generic kernel: the reference the fast
    /// kernels are tested against.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn generic_only(mut self) -> GpuDecoder {
        self.fast = false;
        self
    }

    /// Decodes as on a device that flushes subnormals, whatever the
    /// adapter, so that tests see which jobs go to the CPU.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn flushing_subnormals(mut self) -> GpuDecoder {
        self.flushes = true;
        self
    }

    /// Whether rows `rows` of `job` are decoded on the CPU, where the
    /// device could flush a subnormal to zero.
    fn on_cpu(&self, job: &DecodeJob<'_>, rows: Range<usize>) -> bool {
        let cpu = self.flushes && !job.stays_normal(rows);
        if cpu {
            self.dispatched[3].fetch_add(1, Ordering::Relaxed);
        }
        cpu
    }

    /// Multiplies with a GPU's geometry whatever the adapter, so that tests
    /// run it on CPU adapters too.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn gpu_geometry(mut self) -> GpuDecoder {
        self.gemv = self.gemv.gpu_geometry();
        self
    }

    /// Multiplies as on a device without subgroups.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn without_subgroups(mut self) -> GpuDecoder {
        self.gemv = self.gemv.without_subgroups(&self.device);
        self
    }

    /// Chunks decoded so far, by kernel.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn dispatches(&self) -> Dispatches {
        Dispatches {
            fast: self.dispatched[0].load(Ordering::Relaxed),
            generic: self.dispatched[1].load(Ordering::Relaxed),
            tiled: self.dispatched[2].load(Ordering::Relaxed),
            cpu: self.dispatched[3].load(Ordering::Relaxed),
            codebook: self.dispatched[4].load(Ordering::Relaxed),
        }
    }

    fn kernel(&self, job: &DecodeJob<'_>) -> Kernel {
        if !self.fast {
            return Kernel::Generic;
        }
        fast_kernel(job).unwrap_or(Kernel::Generic)
    }

    /// The chunks of `rows` of `job` for `kernel`, or for the generic kernel
    /// when a decoding fast kernel's do not fit (a row of tiles may need more
    /// workgroups than a dispatch dimension holds on a cramped device).
    fn plan<'a>(
        &self,
        job: &'a DecodeJob<'_>,
        kernel: Kernel,
        rows: Range<usize>,
    ) -> Result<Vec<Chunk<'a>>> {
        let copy = matches!(kernel, Kernel::Fast(Fast { copy: true, .. }))
            || matches!(kernel, Kernel::Tile(Tile { copy: true, .. }));
        match layout::plan(job, kernel, rows.clone(), &self.limits) {
            Err(_) if kernel != Kernel::Generic && !copy => {
                layout::plan(job, Kernel::Generic, rows, &self.limits)
            }
            planned => planned,
        }
    }

    /// The pipeline of `kernel`, built the first time it is asked for.
    fn pipeline(&self, kernel: Kernel) -> wgpu::ComputePipeline {
        let mut cache = self
            .pipelines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        cache
            .entry(kernel)
            .or_insert_with(|| {
                let mut constants = match kernel {
                    Kernel::Generic => Vec::new(),
                    Kernel::Fast(k) => k.constants(),
                    Kernel::Tile(k) => k.constants(),
                };
                constants.push(("WG", self.limits.workgroup as f64));
                self.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(&kernel.label()),
                        layout: Some(&self.pipeline_layout),
                        module: &self.module,
                        entry_point: Some(kernel.entry_point()),
                        compilation_options: wgpu::PipelineCompilationOptions {
                            constants: &constants,
                            ..Default::default()
                        },
                        cache: None,
                    })
            })
            .clone()
    }

    /// An idle pair of slots, or a new one.
    fn take_slots(&self) -> [Slot; 2] {
        let idle = self
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        idle.unwrap_or_else(|| {
            [(); 2].map(|_| Slot {
                params: self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("wgpu-dequant params"),
                    size: std::mem::size_of::<layout::Params>() as u64,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                src: None,
                out: None,
                readback: None,
            })
        })
    }

    fn give_back(&self, slots: [Slot; 2]) {
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(slots);
    }

    /// Runs `work` inside error scopes, so validation, out-of-memory and
    /// internal errors of this device come back as an error of this call.
    async fn scoped<T>(&self, work: impl Future<Output = Result<T>>) -> Result<T> {
        let scopes = [
            self.device.push_error_scope(wgpu::ErrorFilter::Validation),
            self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory),
            self.device.push_error_scope(wgpu::ErrorFilter::Internal),
        ];
        let result = work.await;
        let mut fault = None;
        for scope in scopes.into_iter().rev() {
            if let Some(e) = scope.pop().await {
                fault.get_or_insert(e);
            }
        }
        match (result, fault) {
            (_, Some(e)) => Err(device_error(e)),
            (r, None) => r,
        }
    }

    /// Uploads the chunk's inputs and records its dispatch into `encoder`.
    /// The output goes to the slot's own buffer (returned), or with `into`
    /// straight to byte `offset` of `dest`.
    fn encode(
        &self,
        slot: &mut Slot,
        chunk: &Chunk<'_>,
        encoder: &mut wgpu::CommandEncoder,
        into: Option<(&wgpu::Buffer, u64)>,
    ) -> wgpu::Buffer {
        use wgpu::BufferUsages as U;
        let cap = self.limits.max_binding;
        let src = ensure(
            &self.device,
            &mut slot.src,
            "wgpu-dequant src (codes, zero points, scales, tables)",
            chunk.src_len,
            U::STORAGE | U::COPY_DST,
            cap,
        );
        let (out, bind_at, params) = match into {
            None => {
                let out = ensure(
                    &self.device,
                    &mut slot.out,
                    "wgpu-dequant chunk output",
                    chunk.out_words * 4,
                    U::STORAGE | U::COPY_SRC,
                    cap,
                );
                (out, 0, chunk.params)
            }
            Some((dest, offset)) => {
                // Bindings start at aligned offsets; the shader skips the rest.
                let at = offset / self.limits.offset_align * self.limits.offset_align;
                let words = ((offset - at) / 4) as u32;
                (dest.clone(), at, chunk.params.at_word(words))
            }
        };
        let out_size = (out.size() - bind_at).min(cap);
        self.queue
            .write_buffer(&slot.params, 0, bytemuck::bytes_of(&params));
        for r in &chunk.regions {
            self.write_padded(&src, r.offset, &r.bytes);
        }
        let pipeline = self.pipeline(chunk.kernel);
        let counter = match chunk.kernel {
            Kernel::Fast(k) if !k.copy => Some(0),
            Kernel::Fast(_) => None,
            Kernel::Generic => Some(1),
            Kernel::Tile(k) if !k.copy => Some(2),
            Kernel::Tile(_) => None,
        };
        if let Some(i) = counter {
            self.dispatched[i].fetch_add(1, Ordering::Relaxed);
        }
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("wgpu-dequant chunk bindings"),
            layout: &self.bind_group_layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: PARAMS,
                    resource: slot.params.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: SRC,
                    resource: src.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: DST,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &out,
                        offset: bind_at,
                        size: std::num::NonZeroU64::new(out_size),
                    }),
                },
            ],
        });
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&chunk.kernel.label()),
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(chunk.groups.0, chunk.groups.1, 1);
        drop(pass);
        out
    }

    /// Waits (natively, by polling the device) until `submission` is done.
    /// In a browser the page's event loop drives the device, and awaiting
    /// the work's own future is all there is to do.
    fn wait(&self, submission: wgpu::SubmissionIndex) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(submission),
                timeout: None,
            })
            .map_err(|e| gpu_err("poll").caused_by(e))?;
        #[cfg(target_arch = "wasm32")]
        let _ = submission;
        Ok(())
    }

    fn encoder(&self, label: &str) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
    }

    /// Writes `bytes` at byte `offset` (a multiple of 4) of `buffer`. Queue
    /// writes take whole words, so a partial last word is padded with zeros.
    fn write_padded(&self, buffer: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        let whole = bytes.len() / 4 * 4;
        if whole > 0 {
            self.queue.write_buffer(buffer, offset, &bytes[..whole]);
        }
        if whole < bytes.len() {
            let mut tail = [0u8; 4];
            tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            self.queue
                .write_buffer(buffer, offset + whole as u64, &tail);
        }
    }

    /// Finishes `encoder` with a copy of the first `len` bytes (a multiple
    /// of 4) of `from` into `staging`, submits it, and starts mapping them;
    /// [`GpuDecoder::finish_readback`] collects the bytes.
    fn start_readback(
        &self,
        mut encoder: wgpu::CommandEncoder,
        from: &wgpu::Buffer,
        staging: wgpu::Buffer,
        len: u64,
    ) -> Readback {
        encoder.copy_buffer_to_buffer(from, 0, &staging, 0, len);
        let submission = self.queue.submit([encoder.finish()]);
        let (tx, mapped) = oneshot::channel();
        staging
            .slice(..len)
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        Readback {
            staging,
            len,
            submission,
            mapped,
        }
    }

    /// Waits for `r` and copies its first `out.len()` bytes into `out`.
    async fn finish_readback(&self, r: Readback, out: &mut [u8]) -> Result<()> {
        self.wait(r.submission)?;
        r.mapped
            .await
            .map_err(|_| gpu_err("readback never completed"))?
            .map_err(|e| gpu_err("readback").caused_by(e))?;
        {
            let view = r
                .staging
                .slice(..r.len)
                .get_mapped_range()
                .map_err(|e| gpu_err("readback").caused_by(e))?;
            let bytes = view
                .get(..out.len())
                .ok_or_else(|| gpu_err("readback shorter than its destination"))?;
            out.copy_from_slice(bytes);
        }
        r.staging.unmap();
        Ok(())
    }

    /// Decodes `rows` of `job` into `out` (host memory), as the CPU backend
    /// does. Chunk k+1 is uploaded and dispatched before chunk k is read back.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) async fn decode_rows_async(
        &self,
        job: &DecodeJob<'_>,
        rows: Range<usize>,
        out: &mut [u8],
    ) -> Result<()> {
        crate::backend::check_rows(job, &rows, out)?;
        if let Some(cb) = &job.codebook {
            return match self.codebook_buffer(job, cb, rows.clone()).await? {
                Some(buffer) => {
                    let bytes = self.read_back_async(&buffer).await?;
                    let got = bytes
                        .get(..out.len())
                        .ok_or_else(|| gpu_err("readback shorter than its destination"))?;
                    out.copy_from_slice(got);
                    Ok(())
                }
                None => {
                    self.dispatched[3].fetch_add(1, Ordering::Relaxed);
                    crate::backend::Cpu::new().decode_rows(job, rows, out)
                }
            };
        }
        if self.on_cpu(job, rows.clone()) {
            return crate::backend::Cpu::new().decode_rows(job, rows, out);
        }
        let chunks = self.plan(job, self.kernel(job), rows.clone())?;
        let mut slots = self.take_slots();
        let result = self
            .scoped(self.run_chunks(job, &chunks, rows.start, &mut slots, out))
            .await;
        if result.is_err() {
            // A failed call may leave a readback mapped or pending: start afresh.
            for slot in slots.iter_mut() {
                slot.readback = None;
            }
        }
        self.give_back(slots);
        result
    }

    /// [`GpuDecoder::decode_rows_async`], blocking.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn decode_rows(
        &self,
        job: &DecodeJob<'_>,
        rows: Range<usize>,
        out: &mut [u8],
    ) -> Result<()> {
        pollster::block_on(self.decode_rows_async(job, rows, out))
    }

    async fn run_chunks(
        &self,
        job: &DecodeJob<'_>,
        chunks: &[Chunk<'_>],
        first_row: usize,
        slots: &mut [Slot; 2],
        out: &mut [u8],
    ) -> Result<()> {
        let row_bytes = job.dims.cols * job.out.size();
        // Where a chunk's bytes go in `out`.
        let place = |c: &Chunk<'_>| {
            let at = (c.rows.start - first_row) * row_bytes;
            at..at + c.out_len as usize
        };
        let mut in_flight: [Option<Readback>; 2] = [None, None];
        for (k, chunk) in chunks.iter().enumerate() {
            let s = k % 2;
            if let Some(r) = in_flight[s].take() {
                self.finish_readback(r, &mut out[place(&chunks[k - 2])])
                    .await?;
            }
            let slot = &mut slots[s];
            let mut encoder = self.encoder("wgpu-dequant chunk");
            let gpu_out = self.encode(slot, chunk, &mut encoder, None);
            let bytes = chunk.out_len.div_ceil(4) * 4;
            let rb = ensure(
                &self.device,
                &mut slot.readback,
                "wgpu-dequant readback",
                bytes,
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                u64::MAX,
            );
            in_flight[s] = Some(self.start_readback(encoder, &gpu_out, rb, bytes));
        }
        // The last two chunks, oldest first.
        let n = chunks.len();
        for k in n.saturating_sub(2)..n {
            if let Some(r) = in_flight[k % 2].take() {
                self.finish_readback(r, &mut out[place(&chunks[k])]).await?;
            }
        }
        Ok(())
    }

    /// A new output buffer of `bytes` bytes (rounded up to a whole word), or
    /// an error when the device allows no buffer that large (WebGPU's
    /// default is 256 MiB) instead of a device error the app never asked for.
    fn output_buffer(&self, bytes: u64) -> Result<wgpu::Buffer> {
        let size = bytes.div_ceil(4).max(1) * 4;
        let max = self.device.limits().max_buffer_size;
        if size > max {
            return Err(gpu_err(format!(
                "{bytes} bytes do not fit one buffer on this device (at most {max})"
            )));
        }
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-dequant output"),
            size,
            usage: OUTPUT_USAGE,
            mapped_at_creation: false,
        }))
    }

    /// `bytes` in a new buffer, laid out as decoded tensors are (see
    /// [`GpuDecoder`]).
    pub fn upload(&self, bytes: &[u8]) -> Result<wgpu::Buffer> {
        pollster::block_on(self.upload_async(bytes))
    }

    /// [`GpuDecoder::upload`], awaited.
    async fn upload_async(&self, bytes: &[u8]) -> Result<wgpu::Buffer> {
        let dest = self.output_buffer(bytes.len() as u64)?;
        self.scoped(async {
            self.write_padded(&dest, 0, bytes);
            self.queue.submit([]);
            Ok(dest)
        })
        .await
    }

    /// Decodes the whole tensor into a new buffer on this device and returns
    /// it without reading it back.
    ///
    /// The buffer holds the tensor's little-endian elements in row-major
    /// order, as a safetensors file would (16-bit elements two to a 32-bit
    /// word, the first in the low half); its size is the tensor's byte length
    /// rounded up to a multiple of 4, the padding zero. Its usage is
    /// [`OUTPUT_USAGE`]: bind it as a storage buffer, or copy from it.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) async fn decode_to_buffer_async(&self, job: &DecodeJob<'_>) -> Result<wgpu::Buffer> {
        if let Some(cb) = &job.codebook {
            if let Some(buffer) = self
                .codebook_buffer(job, cb, 0..job.dims.total_rows())
                .await?
            {
                return Ok(buffer);
            }
            self.dispatched[3].fetch_add(1, Ordering::Relaxed);
            let bytes = crate::backend::Cpu::new().decode(job)?;
            return self.upload_async(&bytes).await;
        }
        if self.on_cpu(job, 0..job.dims.total_rows()) {
            let bytes = crate::backend::Cpu::new().decode(job)?;
            return self.upload_async(&bytes).await;
        }
        self.to_buffer(job, self.kernel(job)).await
    }

    /// What `bench` compares the fast kernels with: `job`'s chunks run with
    /// the fast kernel's dispatch geometry, each invocation reading its code
    /// word and writing as many output words as decoding would, nothing
    /// else. `None` for a job no fast kernel takes.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) async fn copy_baseline_async(
        &self,
        job: &DecodeJob<'_>,
    ) -> Option<Result<wgpu::Buffer>> {
        let copy = match fast_kernel(job)? {
            Kernel::Fast(k) => Kernel::Fast(Fast { copy: true, ..k }),
            Kernel::Tile(k) => Kernel::Tile(Tile { copy: true, ..k }),
            Kernel::Generic => return None,
        };
        Some(self.to_buffer(job, copy).await)
    }

    async fn to_buffer(&self, job: &DecodeJob<'_>, kernel: Kernel) -> Result<wgpu::Buffer> {
        let dest = self.output_buffer(job.out_bytes() as u64)?;
        let chunks = self.plan(job, kernel, 0..job.dims.total_rows())?;
        let row_bytes = (job.dims.cols * job.out.size()) as u64;
        let mut slots = self.take_slots();
        let result = self
            .scoped(async {
                let mut previous: Option<wgpu::SubmissionIndex> = None;
                for (k, chunk) in chunks.iter().enumerate() {
                    let slot = &mut slots[k % 2];
                    let mut encoder = self.encoder("wgpu-dequant chunk");
                    // Chunks before the last end on a word boundary (layout::plan).
                    let at = chunk.rows.start as u64 * row_bytes;
                    self.encode(slot, chunk, &mut encoder, Some((&dest, at)));
                    let sub = self.queue.submit([encoder.finish()]);
                    // Queue order keeps reused buffers safe; waiting for the chunk
                    // before this one only bounds how many uploads are staged.
                    if let Some(prev) = previous.replace(sub) {
                        self.wait(prev)?;
                    }
                }
                Ok(dest)
            })
            .await;
        // Queue order keeps the slots safe for the next call even before
        // this one's last chunk has run.
        self.give_back(slots);
        result
    }

    /// [`GpuDecoder::decode_to_buffer_async`], blocking.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn decode_to_buffer(&self, job: &DecodeJob<'_>) -> Result<wgpu::Buffer> {
        pollster::block_on(self.decode_to_buffer_async(job))
    }

    /// [`GpuDecoder::copy_baseline_async`], blocking.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn copy_baseline(&self, job: &DecodeJob<'_>) -> Option<Result<wgpu::Buffer>> {
        pollster::block_on(self.copy_baseline_async(job))
    }

    /// The bytes of `buffer`, a buffer of this decoder's device that can be
    /// copied from (every buffer the decoder hands out can), read back to
    /// host memory: all `buffer.size()` of them, padding included.
    pub async fn read_back_async(&self, buffer: &wgpu::Buffer) -> Result<Vec<u8>> {
        let size = buffer.size();
        // A buffer slice is never empty, so there is nothing to map.
        if size == 0 {
            return Ok(Vec::new());
        }
        self.scoped(async {
            let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgpu-dequant readback"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let encoder = self.encoder("wgpu-dequant read_back");
            let readback = self.start_readback(encoder, buffer, staging, size);
            let mut bytes = vec![0u8; size as usize];
            self.finish_readback(readback, &mut bytes).await?;
            Ok(bytes)
        })
        .await
    }

    /// [`GpuDecoder::read_back_async`], blocking.
    pub fn read_back(&self, buffer: &wgpu::Buffer) -> Result<Vec<u8>> {
        pollster::block_on(self.read_back_async(buffer))
    }

    /// Lowers the limits chunks are planned against (never above the
    /// device's). Small limits force many chunks and 2-D dispatch grids,
    /// which is how the tests exercise chunking on small tensors.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn with_limits(mut self, max_binding: u64, max_groups_per_dim: u32) -> GpuDecoder {
        self.limits.max_binding = self.limits.max_binding.min(max_binding.max(4) & !3);
        self.limits.max_groups_per_dim = self
            .limits
            .max_groups_per_dim
            .min(max_groups_per_dim.max(1));
        self
    }

    /// Runs `size` invocations per workgroup instead of 256 (within the
    /// device's limits): for adapters that prefer smaller or larger groups.
    /// Every size gives the same bytes.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn with_workgroup_size(mut self, size: u32) -> GpuDecoder {
        let l = self.device.limits();
        self.limits.workgroup = size
            .min(l.max_compute_invocations_per_workgroup)
            .min(l.max_compute_workgroup_size_x)
            .max(1);
        // Pipelines built so far have the old size.
        self.pipelines = Default::default();
        self
    }

    /// The device the decoder runs on.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The queue the decoder submits to.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }
}

/// The fast kernel that takes `job`: the straight one, or the tile kernel
/// for codes packed along the input dimension; `None` for the generic one.
fn fast_kernel(job: &DecodeJob<'_>) -> Option<Kernel> {
    if job.codebook.is_some() {
        return None;
    }
    Fast::for_job(job)
        .map(Kernel::Fast)
        .or_else(|| Tile::for_job(job).map(Kernel::Tile))
}

/// The GPU backend used by the command line: an adapter and a decoder on it.
pub struct Gpu {
    info: wgpu::AdapterInfo,
    decoder: GpuDecoder,
}

impl Gpu {
    /// Opens `adapter`. `WGPU_DEQUANT_WORKGROUP_SIZE`, when set, replaces
    /// the workgroup size ([`GpuDecoder::with_workgroup_size`]).
    pub fn open(adapter: &wgpu::Adapter) -> Result<Gpu> {
        pollster::block_on(Gpu::open_async(adapter))
    }

    /// [`Gpu::open`], awaited.
    pub async fn open_async(adapter: &wgpu::Adapter) -> Result<Gpu> {
        const VAR: &str = "WGPU_DEQUANT_WORKGROUP_SIZE";
        let mut decoder = GpuDecoder::open_async(adapter).await?;
        if let Ok(v) = std::env::var(VAR) {
            let size = v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=1024).contains(n));
            let size = size.ok_or_else(|| {
                Error::bare(
                    Rule::Argument,
                    format!("{VAR}={v:?} is not a whole number from 1 to 1024"),
                )
            })?;
            decoder = decoder.with_workgroup_size(size);
        }
        Ok(Gpu {
            info: adapter.get_info(),
            decoder,
        })
    }

    /// The decoder, for GPU-resident decoding.
    pub fn decoder(&self) -> &GpuDecoder {
        &self.decoder
    }

    /// Lowers the limits chunks are planned against ([`GpuDecoder::with_limits`]).
    pub fn with_limits(self, max_binding: u64, max_groups_per_dim: u32) -> Gpu {
        Gpu {
            info: self.info,
            decoder: self.decoder.with_limits(max_binding, max_groups_per_dim),
        }
    }
}

/// The decoder on its own, as a backend (an app's device: no adapter name).
impl Backend for GpuDecoder {
    fn name(&self) -> String {
        "gpu (the app's device)".into()
    }

    fn decode_rows(&self, job: &DecodeJob<'_>, rows: Range<usize>, out: &mut [u8]) -> Result<()> {
        GpuDecoder::decode_rows(self, job, rows, out)
    }

    fn decodes_ahead(&self) -> bool {
        true
    }

    fn gpu(&self) -> Option<&GpuDecoder> {
        Some(self)
    }
}

impl Backend for Gpu {
    fn name(&self) -> String {
        format!("gpu ({}, {:?})", self.info.name, self.info.backend)
    }

    fn decode_rows(&self, job: &DecodeJob<'_>, rows: Range<usize>, out: &mut [u8]) -> Result<()> {
        self.decoder.decode_rows(job, rows, out)
    }

    /// On hardware only: a software adapter computes on the CPU cores the
    /// rest of the pipeline uses, so it has no idle time to fill (measured
    /// on llvmpipe: no gain, half again the memory).
    fn decodes_ahead(&self) -> bool {
        self.info.device_type != wgpu::DeviceType::Cpu
    }

    fn gpu(&self) -> Option<&GpuDecoder> {
        Some(&self.decoder)
    }
}

#[cfg(test)]
mod flush_tests {
    use wgpu::{AdapterInfo, Backend, DeviceType};

    use super::flushes_subnormals;

    fn info(device_type: DeviceType, backend: Backend, name: &str) -> AdapterInfo {
        AdapterInfo {
            name: name.into(),
            ..AdapterInfo::new(device_type, backend)
        }
    }

    #[test]
    fn only_llvmpipe_keeps_subnormals() {
        let llvmpipe = "llvmpipe (LLVM 19.1.7, 256 bits)";
        assert!(!flushes_subnormals(&info(
            DeviceType::Cpu,
            Backend::Vulkan,
            llvmpipe
        )));
        // Chromium's fallback adapter (SwiftShader) is a CPU adapter too.
        assert!(flushes_subnormals(&info(
            DeviceType::Cpu,
            Backend::BrowserWebGpu,
            ""
        )));
        assert!(flushes_subnormals(&info(
            DeviceType::Cpu,
            Backend::BrowserWebGpu,
            llvmpipe
        )));
        assert!(flushes_subnormals(&info(
            DeviceType::Cpu,
            Backend::Dx12,
            "Microsoft Basic Render Driver"
        )));
        assert!(flushes_subnormals(&info(
            DeviceType::Cpu,
            Backend::Vulkan,
            "SwiftShader Device"
        )));
        assert!(flushes_subnormals(&info(
            DeviceType::DiscreteGpu,
            Backend::Vulkan,
            "NVIDIA H100"
        )));
    }
}

//! Products with packed weights: a quantized Linear's packs resident on the
//! device as stored (the fast kernel's `src`, chunk by chunk), and
//! `y = x·Wᵀ (+ bias)` computed from them by matmul.wgsl's kernels, which
//! decode each word with the fast kernels' own code (decode.wgsl, the
//! same module). W is never dense, on the host or the device.

use super::layout::{self, Fast, Kernel, Tile};
use super::{fast_kernel, gpu_err, GpuDecoder, DST, PARAMS, SRC};
use crate::error::{Error, Result, Rule};
use crate::job::DecodeJob;

/// `gemv`'s bindings past the decode kernels' three: x, its parameters,
/// and x again, read four values at a time.
const XS: u32 = 3;
const GEMV: u32 = 4;
const XS4: u32 = 5;

const MATMUL: &str = include_str!("../../../shaders/matmul.wgsl");
const SUBGROUPS: &str = include_str!("../../../shaders/subgroups.wgsl");
const NO_SUBGROUPS: &str = include_str!("../../../shaders/no_subgroups.wgsl");

/// Values of W an invocation of `gemv` decodes a step (straight and
/// strided packs): a word of each of its rows, 2 rows of 4-bit codes or 4
/// of 8-bit ones; transposed packs take a word's rows. On llvmpipe more
/// ran up to 4x slower: the loops over them and their decoded values no
/// longer unrolled, and the arrays indexed in them went to memory.
const GEMV_VALUES: u32 = 16;

/// The workgroup size of the products on CPU adapters.
const CPU_WG: u32 = 64;

/// How the products spread over a device: chosen once per adapter kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    /// The workgroup size `gemv` is built with, whatever the decoder's.
    wg: u32,
    /// Invocations that share a block of rows of W, reading its words in
    /// turn (the dense baseline: a row).
    lanes: u32,
    /// Rows of x a workgroup multiplies at once, at most.
    max_mt: u32,
    /// x read once for a subgroup's lanes (matmul.wgsl's SHARE_X).
    share_x: bool,
}

impl Geometry {
    /// On a GPU, 64 invocations read a block's words side by side and add
    /// up their sums at the end; 8 rows of x share each decoded word. On a
    /// CPU adapter (llvmpipe, SwiftShader, WARP), whose invocations are a
    /// core's vector lanes, an invocation takes its rows whole: the
    /// workgroup's sums across invocations cost more there than they save
    /// (on llvmpipe, 2-5x the time). There, with subgroups, the lanes
    /// share their reads of x; without, past 4 rows of x the loops over
    /// them no longer unroll (with, past 8).
    fn of(device: wgpu::DeviceType, subgroups: bool) -> Geometry {
        match device {
            wgpu::DeviceType::Cpu => Geometry {
                wg: CPU_WG,
                lanes: 1,
                max_mt: if subgroups { 8 } else { 4 },
                share_x: subgroups,
            },
            _ => Geometry {
                wg: 256,
                lanes: 64,
                max_mt: 8,
                share_x: false,
            },
        }
    }

    /// Rows of W an invocation takes.
    fn block_rows(self, weights: Weights) -> u32 {
        match weights {
            Weights::Tiled(t) if t.pack == layout::Pack::Transposed => 32 / t.bits,
            Weights::Tiled(t) => GEMV_VALUES * t.bits / 32,
            Weights::Packed(f) => GEMV_VALUES * f.bits / 32,
            Weights::DenseBf16 => 1,
        }
    }

    /// Rows of W a workgroup takes.
    fn rows(self, weights: Weights) -> u32 {
        self.block_rows(weights) * self.wg / self.lanes
    }

    /// Rows of x a workgroup takes at most: as many as its accumulators
    /// (64 a invocation) hold.
    fn max_mt(self, weights: Weights) -> u32 {
        let max = match weights {
            // Transposed blocks of rows past 4 rows of x: 3x slower on llvmpipe.
            Weights::Tiled(t) if t.pack == layout::Pack::Transposed && self.lanes == 1 => self.max_mt.min(4),
            _ => self.max_mt,
        };
        max.min(64 / self.block_rows(weights))
    }
}

/// `gemv`'s own uniform block (matmul.wgsl's `Gemv`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct GemvParams {
    m: u32,
    n: u32,
    bias: u32,
    /// W's first row in its job (an expert's in a stack): y's column 0.
    row0: u32,
}

/// What `bias` holds when there is none (decode.wgsl's `NO_G_IDX`).
const NO_BIAS: u32 = u32::MAX;

/// The five bindings of `gemv`: the decode kernels' three (W's chunk in
/// `src`, y as `dst`), x, and the product's own parameters.
pub(super) fn bind_group_layout(device: &wgpu::Device) -> wgpu::BindGroupLayout {
    let buffer = |binding, ty, min_size: u64| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: false,
            min_binding_size: std::num::NonZeroU64::new(min_size),
        },
        count: None,
    };
    let storage = |read_only| wgpu::BufferBindingType::Storage { read_only };
    let params = std::mem::size_of::<layout::Params>() as u64;
    let gemv = std::mem::size_of::<GemvParams>() as u64;
    device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("wgpu-dequant gemv bindings"),
        entries: &[
            // The chunk's layout::Params, as the fast kernel reads them.
            buffer(PARAMS, wgpu::BufferBindingType::Uniform, params),
            // The chunk's packs (and tables, and its rows' f32 bias after them).
            buffer(SRC, storage(true), 4),
            // y: [m, n] f32, the app's.
            buffer(DST, storage(false), 4),
            // x: [m, k] f32, the app's.
            buffer(XS, storage(true), 4),
            buffer(GEMV, wgpu::BufferBindingType::Uniform, gemv),
            // x again, as vec4s.
            buffer(XS4, storage(true), 16),
        ],
    })
}

/// How a part's weights are stored, and so which entry multiplies by them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Weights {
    /// Packs the fast kernel decodes: `gemv`.
    Packed(Fast),
    /// Packs along the inputs, which the tile kernel decodes: `gemv_t`.
    Tiled(Tile),
    /// Dense bf16, two to a word (the bench's baseline): `gemv_dense`.
    DenseBf16,
}

/// What a product reads its weights as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Product {
    /// Decoded: the product itself.
    Decoded,
    /// The packed words summed as numbers (the bench's read baseline).
    Read,
}

/// One chunk of rows of a packed Linear: its parameters and packs.
#[derive(Debug)]
struct Part {
    weights: Weights,
    params: wgpu::Buffer,
    src: wgpu::Buffer,
    /// Word index of its rows' bias in `src`, or [`NO_BIAS`].
    bias: u32,
    /// Its rows of W.
    rows: u32,
    /// Rows of W its dispatch covers: a transposed chunk's from the word
    /// holding its first.
    span: u32,
    /// Its rows' codes start on words (straight packs).
    aligned: bool,
}

/// A quantized Linear's weights resident on a GPU device as they are
/// stored (codes, scales, zero points, tables), ready for
/// [`GpuDecoder::record_matmul`]: `y = x·Wᵀ (+ bias)` for the dense weight
/// W that `dequantize` writes, which is never made.
#[derive(Debug)]
pub struct PackedLinear {
    /// Output features: W's rows, y's row length.
    pub n: usize,
    /// Input features: W's columns, x's row length.
    pub k: usize,
    /// Its first row in its job (an expert's in a stack).
    row0: u32,
    parts: Vec<Part>,
    bytes: u64,
}

impl PackedLinear {
    /// Bytes it holds on the device.
    pub fn gpu_bytes(&self) -> u64 {
        self.bytes
    }
}

impl GpuDecoder {
    /// Uploads the packs of rows `rows` of `job` (counted over all slices:
    /// a 2-D weight's, or an expert's of a stack; a job a fast kernel
    /// decodes) and their `bias`, one chunk at a time, read from where they
    /// are stored.
    pub(crate) async fn upload_linear_async(
        &self,
        job: &DecodeJob<'_>,
        rows: std::ops::Range<usize>,
        bias: Option<&[f32]>,
        what: &str,
    ) -> Result<PackedLinear> {
        let refuse = |detail: &str| Err(Error::new(Rule::Argument, what, detail.to_string()));
        let (kernel, weights) = match fast_kernel(job) {
            Some(Kernel::Fast(k)) if k.low_rank == layout::LowRankMode::None => (Kernel::Fast(k), Weights::Packed(k)),
            Some(Kernel::Tile(t)) => (Kernel::Tile(t), Weights::Tiled(t)),
            _ => return refuse("its packs are not ones the GPU multiplies by (yet): it takes 4- and 8-bit packs the fast kernels decode"),
        };
        if rows.end > job.dims.total_rows() || rows.start > rows.end {
            return refuse("rows past the weight's");
        }
        let (n, k) = (rows.len(), job.dims.cols);
        if bias.is_some_and(|b| b.len() != n) {
            return refuse("its bias has not one value per output");
        }
        let row0 = u32::try_from(rows.start).map_err(|_| Error::new(Rule::Argument, what, "too many rows".to_string()))?;
        let chunks = layout::plan(job, kernel, rows, &self.limits.resident())?;
        self.scoped(async {
            let mut parts = Vec::with_capacity(chunks.len());
            let mut bytes = 0;
            for chunk in &chunks {
                let rows = &chunk.rows;
                let bias = bias.map(|b| &b[rows.start - row0 as usize..rows.end - row0 as usize]);
                let bias_at = chunk.src_len;
                let size = bias_at + bias.map_or(0, |b| 4 * b.len() as u64);
                let src = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("wgpu-dequant packed weights"),
                    size: size.max(4),
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                for r in &chunk.regions {
                    self.write_padded(&src, r.offset, &r.bytes);
                }
                if let Some(b) = bias {
                    self.queue.write_buffer(&src, bias_at, bytemuck::cast_slice(b));
                }
                let params = self.uniform("wgpu-dequant packed weights' params", bytemuck::bytes_of(&chunk.params));
                bytes += src.size() + params.size();
                parts.push(Part {
                    weights,
                    params,
                    src,
                    bias: if bias.is_some() { (bias_at / 4) as u32 } else { NO_BIAS },
                    rows: rows.len() as u32,
                    span: rows.len() as u32 + lead(weights, chunk.params.row0()),
                    aligned: chunk.params.lanes_aligned(),
                });
            }
            self.queue.submit([]);
            Ok(PackedLinear { n, k, row0, parts, bytes })
        })
        .await
    }

    /// A dense `n × k` bf16 weight (`bytes`, row-major; `k` even) for
    /// [`GpuDecoder::record_product`]: the bench's baseline, the path an app
    /// has without packed products.
    pub(crate) fn upload_dense_bf16(&self, (n, k): (usize, usize), bytes: &[u8]) -> Result<PackedLinear> {
        if !k.is_multiple_of(2) || bytes.len() != 2 * n * k {
            return Err(Error::bare(Rule::Argument, format!("dense bf16: {} bytes for {n} x {k}", bytes.len())));
        }
        let src = self.storage("wgpu-dequant dense bf16 weights", bytes.len() as u64, wgpu::BufferUsages::COPY_DST);
        self.write_padded(&src, 0, bytes);
        let params = layout::Params::dense_bf16(n as u32, k as u32);
        let params = self.uniform("wgpu-dequant dense params", bytemuck::bytes_of(&params));
        let bytes = src.size() + params.size();
        let part = Part {
            weights: Weights::DenseBf16,
            params,
            src,
            bias: NO_BIAS,
            rows: n as u32,
            span: n as u32,
            aligned: true,
        };
        Ok(PackedLinear { n, k, row0: 0, parts: vec![part], bytes })
    }

    /// A uniform buffer holding `bytes`.
    fn uniform(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        let b = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.len() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.queue.write_buffer(&b, 0, bytes);
        b
    }

    /// The pipeline multiplying by `weights` read as `product`, taking `mt`
    /// rows of x at once, reading x as vec4s (`x4`), with rows whose codes
    /// start on words (`aligned`).
    fn gemv_pipeline(&self, weights: Weights, product: Product, mt: u32, (x4, aligned): (bool, bool)) -> wgpu::ComputePipeline {
        let mut cache = self.gemv.pipelines.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .entry((weights, product, mt, x4, aligned))
            .or_insert_with(|| {
                let (mut constants, entry, label) = match weights {
                    Weights::Packed(k) => (k.constants().to_vec(), "gemv", Kernel::Fast(k).label()),
                    Weights::Tiled(t) => (t.constants().to_vec(), "gemv_t", Kernel::Tile(t).label()),
                    Weights::DenseBf16 => (Vec::new(), "gemv_dense", "dense bf16".to_string()),
                };
                let flag = |b: bool| if b { 1.0 } else { 0.0 };
                let g = self.gemv.geometry;
                let rb = g.block_rows(weights);
                constants.extend([
                    ("WG", g.wg as f64),
                    ("GEMV_ROWS", g.rows(weights) as f64),
                    ("MT", mt as f64),
                    ("SHARE_X", flag(g.share_x)),
                ]);
                if entry != "gemv_dense" {
                    constants.extend([
                        ("READ", flag(product == Product::Read)),
                        ("RB", rb as f64),
                        ("X4", flag(x4)),
                    ]);
                }
                if entry == "gemv" {
                    constants.push(("ALIGNED", flag(aligned)));
                }
                self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&format!("wgpu-dequant {entry} {product:?}, {mt} rows of x ({label})")),
                    layout: Some(&self.gemv.pipeline_layout),
                    module: &self.gemv.module,
                    entry_point: Some(entry),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants: &constants,
                        ..Default::default()
                    },
                    cache: None,
                })
            })
            .clone()
    }

    /// Records `y = x·Wᵀ (+ bias)` into `encoder`, for the `m` rows of `x`
    /// (`[m, w.k]` f32, row-major) into `y` (`[m, w.n]` f32): buffers of
    /// this decoder's device with `STORAGE` usage. Each weight is decoded
    /// once per 8 rows of x (4 on a CPU adapter without subgroups, and for
    /// transposed packs on any CPU adapter); the sums are f32, in a fixed
    /// order, so a result is the same from run to run on one device.
    pub fn record_matmul(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        w: &PackedLinear,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        m: u32,
    ) -> Result<()> {
        self.record_product(encoder, w, (x, y, m), Product::Decoded)
    }

    /// [`GpuDecoder::record_matmul`] reading the weights as `product`.
    pub(crate) fn record_product(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        w: &PackedLinear,
        (x, y, m): (&wgpu::Buffer, &wgpu::Buffer, u32),
        product: Product,
    ) -> Result<()> {
        let (n, k) = (w.n as u64, w.k as u64);
        if m == 0 {
            return Ok(());
        }
        if x.size() < 4 * m as u64 * k || y.size() < 4 * m as u64 * n {
            return Err(Error::bare(
                Rule::Argument,
                format!("matmul: x holds {} bytes and y {}, for {m} rows of {k} inputs and {n} outputs", x.size(), y.size()),
            ));
        }
        let max = self.limits.max_groups_per_dim;
        for part in &w.parts {
            let mt = m.min(self.gemv.geometry.max_mt(part.weights));
            let m_groups = m.div_ceil(mt);
            let row_groups = part.span.div_ceil(self.gemv.geometry.rows(part.weights));
            if row_groups > max || m_groups > max {
                return Err(gpu_err(format!("matmul: {} rows and {m} rows of x exceed this device's {max} workgroups a dimension", part.rows)));
            }
            let gemv = GemvParams {
                m,
                n: w.n as u32,
                bias: part.bias,
                row0: w.row0,
            };
            let gemv = self.uniform("wgpu-dequant gemv params", bytemuck::bytes_of(&gemv));
            fn entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
                wgpu::BindGroupEntry {
                    binding,
                    resource: buffer.as_entire_binding(),
                }
            }
            let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("wgpu-dequant gemv bindings"),
                layout: &self.gemv.bind_group_layout,
                entries: &[
                    entry(PARAMS, &part.params),
                    entry(SRC, &part.src),
                    entry(DST, y),
                    entry(XS, x),
                    entry(GEMV, &gemv),
                    entry(XS4, if x.size() >= 16 { x } else { &self.gemv.small_x }),
                ],
            });
            let x4 = x4(part.weights, w.k) && x.size() >= 16;
            let pipeline = self.gemv_pipeline(part.weights, product, mt, (x4, part.aligned));
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("wgpu-dequant gemv"),
                timestamp_writes: None,
            });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(row_groups, m_groups, 1);
        }
        Ok(())
    }

    /// `y = x·Wᵀ (+ bias)` for the `m` rows of `x` (`[m, w.k]`), read back:
    /// [`GpuDecoder::record_matmul`] for tests and simple apps.
    pub async fn matmul_async(&self, w: &PackedLinear, x: &[f32], m: usize) -> Result<Vec<f32>> {
        if x.len() != m * w.k {
            return Err(Error::bare(
                Rule::Argument,
                format!("matmul: x holds {} values, not {m} rows of {}", x.len(), w.k),
            ));
        }
        if m == 0 || w.n == 0 {
            return Ok(Vec::new());
        }
        let m32 = u32::try_from(m).map_err(|_| Error::bare(Rule::Argument, "matmul: too many rows of x"))?;
        self.scoped(async {
            let xs = self.storage("wgpu-dequant matmul x", (4 * x.len()) as u64, wgpu::BufferUsages::COPY_DST);
            self.queue.write_buffer(&xs, 0, bytemuck::cast_slice(x));
            let ys = self.storage("wgpu-dequant matmul y", (4 * m * w.n) as u64, wgpu::BufferUsages::COPY_SRC);
            let mut encoder = self.encoder("wgpu-dequant matmul");
            self.record_matmul(&mut encoder, w, &xs, &ys, m32)?;
            self.queue.submit([encoder.finish()]);
            let bytes = self.read_back_async(&ys).await?;
            Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
        })
        .await
    }

    /// [`GpuDecoder::matmul_async`], blocking.
    pub fn matmul(&self, w: &PackedLinear, x: &[f32], m: usize) -> Result<Vec<f32>> {
        pollster::block_on(self.matmul_async(w, x, m))
    }

    /// A storage buffer of `size` bytes, with `usage` too.
    fn storage(&self, label: &str, size: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.max(4),
            usage: wgpu::BufferUsages::STORAGE | usage,
            mapped_at_creation: false,
        })
    }
}

/// Rows a chunk's dispatch covers before its first: those of the first
/// row's code word (transposed packs).
fn lead(weights: Weights, row0: u32) -> u32 {
    match weights {
        Weights::Tiled(t) => t.lead(row0 as usize) as u32,
        _ => 0,
    }
}

/// Whether the kernel reads x four values at a time (xs4): straight and
/// strided packs whose rows of `k` hold whole code words (and so x's rows
/// whole vec4s). Transposed packs read one input at a time: taking four
/// (four words, their 32 values) ran 3x slower on llvmpipe, the loops no
/// longer unrolled.
fn x4(weights: Weights, k: usize) -> bool {
    match weights {
        Weights::Packed(f) => k.is_multiple_of((32 / f.bits) as usize),
        Weights::Tiled(t) if t.pack == layout::Pack::Strided => k.is_multiple_of((32 / t.bits) as usize),
        Weights::Tiled(_) | Weights::DenseBf16 => false,
    }
}

/// The pipelines of the products, by weights, reading, rows of x, x4 and
/// aligned rows.
type Cache = std::collections::HashMap<(Weights, Product, u32, bool, bool), wgpu::ComputePipeline>;

/// `gemv`'s layouts and pipelines, made with the decoder.
pub(super) struct Pipelines {
    bind_group_layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    pipelines: std::sync::Mutex<Cache>,
    /// Bound as xs4 when x is too small to (x4 is off then).
    small_x: wgpu::Buffer,
    /// decode.wgsl, matmul.wgsl and the entry points.
    module: wgpu::ShaderModule,
    geometry: Geometry,
}

impl Pipelines {
    pub(super) fn new(device: &wgpu::Device) -> Pipelines {
        let subgroups = subgroups(device);
        let bind_group_layout = bind_group_layout(device);
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("wgpu-dequant gemv pipeline layout"),
            bind_group_layouts: &[Some(&bind_group_layout)],
            immediate_size: 0,
        });
        let small_x = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-dequant gemv small x"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Pipelines {
            bind_group_layout,
            pipeline_layout,
            pipelines: Default::default(),
            small_x,
            module: module(device, subgroups),
            geometry: Geometry::of(device.adapter_info().device_type, subgroups),
        }
    }

    /// The same with a GPU's geometry, whatever the adapter.
    pub(super) fn gpu_geometry(self) -> Pipelines {
        Pipelines {
            geometry: Geometry::of(wgpu::DeviceType::DiscreteGpu, false),
            pipelines: Default::default(),
            ..self
        }
    }

    /// The same as on a device without subgroups.
    pub(super) fn without_subgroups(self, device: &wgpu::Device) -> Pipelines {
        Pipelines {
            module: module(device, false),
            geometry: Geometry::of(device.adapter_info().device_type, false),
            pipelines: Default::default(),
            ..self
        }
    }
}

/// Whether the products use `device`'s subgroups: where it has them and
/// they fit in a CPU adapter's workgroup (whose invocations read x for the
/// words of whole subgroups), but not in browsers, whose WGSL would need
/// an `enable` that naga refuses.
fn subgroups(device: &wgpu::Device) -> bool {
    !cfg!(target_arch = "wasm32")
        && device.features().contains(wgpu::Features::SUBGROUP)
        && device.adapter_info().subgroup_max_size <= CPU_WG
}

/// The products' module: decode.wgsl, matmul.wgsl and the entry points
/// with (`subgroups`) or without subgroups.
fn module(device: &wgpu::Device, subgroups: bool) -> wgpu::ShaderModule {
    let entries = if subgroups { SUBGROUPS } else { NO_SUBGROUPS };
    device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("wgpu-dequant matmul.wgsl"),
        source: wgpu::ShaderSource::Wgsl([super::SHADER, MATMUL, entries].concat().into()),
    })
}

//! Products with packed weights: a quantized Linear's packs resident on the
//! device as stored (the fast kernel's `src`, chunk by chunk), and
//! `y = x·Wᵀ (+ bias)` computed from them by the kernels of
//! shaders/matmul/, which decode each word with the fast kernels' own code
//! (shaders/decode/, the same module). W is never dense, on the host or the
//! device.

use super::layout::{self, Fast, Kernel, Tile};
use super::shader::{buffer, DST, PARAMS, SHADER, SRC};
use super::{fast_kernel, gpu_err, GpuDecoder};
use crate::error::{Error, Result, Rule};
use crate::job::{DecodeJob, Values, ZeroPoint};

mod experts;
mod modules;
pub(crate) use experts::rows_by_expert;

/// `gemv`'s bindings past the decode kernels' three: x, its parameters,
/// and x again, read four values at a time.
const XS: u32 = 3;
const GEMV: u32 = 4;
const XS4: u32 = 5;
const SRC4: u32 = 6;

/// The products' own source: the fragments of shaders/matmul/ in their
/// order (gemv.wgsl says what each holds), composed here and nowhere else
/// and appended to the decode module's; `concat!` keeps it one
/// `&'static str`, on the web too.
const MATMUL: &str = concat!(
    include_str!("../../../../shaders/matmul/gemv.wgsl"),
    include_str!("../../../../shaders/matmul/rows.wgsl"),
    include_str!("../../../../shaders/matmul/others.wgsl"),
);
const SUBGROUPS: &str = include_str!("../../../../shaders/subgroups.wgsl");
const NO_SUBGROUPS: &str = include_str!("../../../../shaders/no_subgroups.wgsl");

/// Values of W an invocation of `gemv_t` decodes a step (strided packs
/// with act order): a word of each of its rows, 2 rows of 4-bit codes or
/// 4 of 8-bit ones. On llvmpipe twice as many ran no faster (measured
/// with each row's decode a call of its own, shaders/matmul/gemv.wgsl's
/// add_words); straight packs there take [`PACKED_ROWS`].
const GEMV_VALUES: u32 = 16;

/// Rows of W an invocation of `gemv` takes with straight packs (on CPU
/// adapters), whatever their bits: each value of x a subgroup shares is
/// then taken from its lane for 4 rows, not 2 (4-bit codes), which made
/// GGUF's 4-bit types faster on llvmpipe at m = 1 and m = 16
/// (docs/performance.md#gpu-products); 8-bit codes took 4 already.
const PACKED_ROWS: u32 = 4;

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
    /// x read once for a subgroup's lanes (gemv.wgsl's SHARE_X).
    share_x: bool,
    /// Words an invocation takes in turn, reading x (with `share_x`) and
    /// the scales once for them all (gemv.wgsl's XRUN).
    xrun: u32,
    /// Packs multiplied a row per `lanes` invocations (gemv.wgsl's
    /// gemv_rows), not a block of rows.
    whole_rows: bool,
    /// Words an invocation of `gemv_rows` fetches before it decodes them
    /// (gemv.wgsl's UNROLL).
    unroll: u32,
    /// Words a load of the dense baseline's W brings where its rows hold
    /// whole runs of them (gemv.wgsl's WIDE).
    wide: u32,
}

impl Geometry {
    /// On a GPU, 64 invocations read a row's words side by side and add up
    /// their sums at the end, as the dense product does; 8 rows of x share
    /// each decoded word (blocks of 2-4 rows, with their arrays of values
    /// per row and word, ran far slower on an H200). With one row of x, an
    /// invocation fetches two words before it decodes them. The dense
    /// baseline reads four words a load; the packs read a word a load (four
    /// words a load, whose x a lane then reads 128 bytes from its
    /// neighbour's, ran them slower at m = 1). On a
    /// CPU adapter (llvmpipe, SwiftShader, WARP), whose invocations are a
    /// core's vector lanes, an invocation takes its rows whole: the
    /// workgroup's sums across invocations cost more there than they save,
    /// and it takes its words in runs of a
    /// subgroup's size (or 8). There, with subgroups (`subgroup`: their
    /// size), the lanes share their reads of x, and 16 rows of x share a
    /// decode (faster than 8); without, past 4 rows of x the loops
    /// over them no longer unroll. The measurements behind each choice:
    /// docs/performance.md#gpu-products.
    fn of(device: wgpu::DeviceType, subgroup: Option<u32>) -> Geometry {
        match device {
            wgpu::DeviceType::Cpu => Geometry {
                wg: CPU_WG,
                lanes: 1,
                max_mt: if subgroup.is_some() { 16 } else { 4 },
                share_x: subgroup.is_some(),
                xrun: subgroup.unwrap_or(8),
                whole_rows: false,
                unroll: 1,
                wide: 1,
            },
            _ => Geometry {
                wg: 256,
                lanes: 64,
                max_mt: 8,
                share_x: false,
                xrun: 1,
                whole_rows: true,
                unroll: 2,
                wide: 4,
            },
        }
    }

    /// Words between scale reloads (gemv.wgsl's RELOAD) for groups of
    /// `group_words` words: at most a run's; 0 for rows of one group
    /// (`group_words` 0), whose scales are read once.
    fn reload(self, group_words: u32) -> u32 {
        match group_words {
            0 => 0,
            g => crate::job::gcd(self.xrun as usize, g as usize) as u32,
        }
    }

    /// Rows of W an invocation takes.
    fn block_rows(self, weights: Weights) -> u32 {
        match weights {
            Weights::Tiled(t) => GEMV_VALUES * t.bits / 32,
            Weights::Packed(_) if self.whole_rows => 1,
            Weights::Packed(_) => PACKED_ROWS,
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
        self.max_mt.min(64 / self.block_rows(weights))
    }
}

/// `gemv`'s own uniform block (gemv.wgsl's `Gemv`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct GemvParams {
    m: u32,
    n: u32,
    bias: u32,
    /// W's first row in its job (an expert's in a stack): y's column 0.
    row0: u32,
    /// x's row length (the Linear's inputs).
    x_stride: u32,
    /// x's column of W's column 0.
    x0: u32,
    /// 1: y's values are added to, not written ([`Part::acc`]).
    acc: u32,
    pad: u32,
}

/// What `bias` holds when there is none (`NO_G_IDX` in shaders/decode/protocol.wgsl).
const NO_BIAS: u32 = u32::MAX;

/// The five bindings of `gemv`: the decode kernels' three (W's chunk in
/// `src`, y as `dst`), x, and the product's own parameters.
pub(super) fn bind_group_layout(device: &wgpu::Device) -> wgpu::BindGroupLayout {
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
            // The chunk's packs again, as vec4s.
            buffer(SRC4, storage(true), 16),
        ],
    })
}

/// How a part's weights are stored, and so which entry multiplies by them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Weights {
    /// Packs the fast kernel decodes: `gemv`.
    Packed(Fast),
    /// GPTQ's strided packs with act order (g_idx), which the tile kernel
    /// decodes: `gemv_t`.
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
    /// One workgroup that does nothing, with the product's bindings: what
    /// a dispatch costs whatever it does (the bench reports it beside each
    /// product's time).
    Overhead,
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
    /// The row of its job that is y's column 0 (an expert's first row in
    /// a stack; wrapping, for a band of rows below others: SVDQuant's).
    row0: u32,
    /// Its columns of W, and x's column of its first (a block of an
    /// SVDQuant module's inputs; else 0, of all of them).
    cols: u32,
    x0: u32,
    /// Its sums are added to y's values, which an earlier part wrote (the
    /// inputs before its own), before its bias.
    acc: bool,
    /// Its rows' codes start on words (straight packs).
    aligned: bool,
    /// Code words per scale and zero-point group along a row, as
    /// [`layout::Params::group_words`].
    group_words: u32,
    /// How its values are rounded to the output dtype.
    rounding: Rounding,
}

/// How the products round a value of W to the output dtype before they
/// use it (gemv.wgsl's ROUNDING).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Rounding {
    /// Not at all: the dtype holds every value exactly ([`exact`]).
    None = 0,
    /// To bf16 by the carry alone: W has no NaN ([`nan_free`]), whose bits
    /// the carry would change. Faster on llvmpipe at m = 1
    /// (docs/performance.md#gpu-products).
    Carry = 1,
    /// As `dequantize` does, NaN included.
    Full = 2,
}

impl Rounding {
    /// The rounding of rows `rows` of `job` (counted over all slices).
    fn of(job: &DecodeJob<'_>, weights: Weights, rows: std::ops::Range<usize>) -> Rounding {
        if exact(job, weights) {
            Rounding::None
        } else if job.out == crate::numerics::OutDtype::Bf16 && nan_free(job, rows) {
            Rounding::Carry
        } else {
            Rounding::Full
        }
    }
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
    /// Experts it holds, each `[n, k]` ([`Model::upload_experts`],
    /// [`GpuDecoder::record_matmul_experts`]); 0 for one Linear.
    ///
    /// [`Model::upload_experts`]: crate::Model::upload_experts
    pub experts: usize,
    parts: Vec<Part>,
    /// Its experts, when it holds them (and no parts of its own).
    stack: Vec<PackedLinear>,
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
        if job.codebook.is_some() {
            return refuse("vector codebooks (VPTQ, AQLM) are not multiplied packed on the GPU (yet): decode the weight, or multiply on the CPU (Model::matmul_cpu)");
        }
        // Transposed packs (AutoAWQ's) and strided ones (GPTQ's, but with
        // act order) are rewritten once, here, so that their products read
        // a row's words one after another as the straight ones do, at the
        // same size.
        let repacked = job.in_output_order();
        let job = repacked.as_ref().unwrap_or(job);
        // A low-rank branch (SVDQuant's; of rank 0, ModelOpt's
        // pre_quant_scale) is decoded as the fast kernel decodes it: each
        // value with its rank-r dot, then rounded as dequantize writes it.
        let (kernel, weights) = match fast_kernel(job) {
            Some(Kernel::Fast(k)) => (Kernel::Fast(k), Weights::Packed(k)),
            Some(Kernel::Tile(t)) if t.pack == layout::Pack::Strided => (Kernel::Tile(t), Weights::Tiled(t)),
            _ => return refuse("its packs are not ones the GPU multiplies by (yet): codes of 1 to 8 bits that the fast kernels decode, once rewritten in rows"),
        };
        if rows.end > job.dims.total_rows() || rows.start > rows.end {
            return refuse("rows past the weight's");
        }
        let (n, k) = (rows.len(), job.dims.cols);
        if bias.is_some_and(|b| b.len() != n) {
            return refuse("its bias has not one value per output");
        }
        let row0 = u32::try_from(rows.start)
            .map_err(|_| Error::new(Rule::Argument, what, "too many rows".to_string()))?;
        let rounding = Rounding::of(job, weights, rows.clone());
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
                    self.queue
                        .write_buffer(&src, bias_at, bytemuck::cast_slice(b));
                }
                let params = self.uniform(
                    "wgpu-dequant packed weights' params",
                    bytemuck::bytes_of(&chunk.params),
                );
                bytes += src.size() + params.size();
                parts.push(Part {
                    weights,
                    params,
                    src,
                    bias: if bias.is_some() {
                        (bias_at / 4) as u32
                    } else {
                        NO_BIAS
                    },
                    rows: rows.len() as u32,
                    row0,
                    cols: k as u32,
                    x0: 0,
                    acc: false,
                    aligned: chunk.params.lanes_aligned(),
                    group_words: chunk.params.group_words(),
                    rounding,
                });
            }
            self.queue.submit([]);
            Ok(PackedLinear {
                n,
                k,
                experts: 0,
                parts,
                stack: Vec::new(),
                bytes,
            })
        })
        .await
    }

    /// A dense `n × k` bf16 weight (`bytes`, row-major; `k` even) for
    /// [`GpuDecoder::record_product`]: the bench's baseline, the path an app
    /// has without packed products.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn upload_dense_bf16(
        &self,
        (n, k): (usize, usize),
        bytes: &[u8],
    ) -> Result<PackedLinear> {
        if !k.is_multiple_of(2) || bytes.len() != 2 * n * k {
            return Err(Error::bare(
                Rule::Argument,
                format!("dense bf16: {} bytes for {n} x {k}", bytes.len()),
            ));
        }
        let src = self.storage(
            "wgpu-dequant dense bf16 weights",
            bytes.len() as u64,
            wgpu::BufferUsages::COPY_DST,
        );
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
            row0: 0,
            cols: k as u32,
            x0: 0,
            acc: false,
            aligned: true,
            group_words: 0,
            rounding: Rounding::Full,
        };
        Ok(PackedLinear {
            n,
            k,
            experts: 0,
            parts: vec![part],
            stack: Vec::new(),
            bytes,
        })
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

    /// The pipeline of `variant`.
    fn gemv_pipeline(&self, variant: Variant) -> wgpu::ComputePipeline {
        let Variant {
            weights,
            product,
            mt,
            x4,
            aligned,
            reload,
            rounding,
            wide,
        } = variant;
        let mut cache = self
            .gemv
            .pipelines
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        cache
            .entry(variant)
            .or_insert_with(|| {
                let (mut constants, entry, label) = match weights {
                    Weights::Packed(k) => {
                        let entry = if self.gemv.geometry.whole_rows {
                            "gemv_rows"
                        } else {
                            "gemv"
                        };
                        (k.constants(), entry, Kernel::Fast(k).label())
                    }
                    Weights::Tiled(t) => (t.constants(), "gemv_t", Kernel::Tile(t).label()),
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
                    ("XRUN", g.xrun as f64),
                    ("WIDE", wide as f64),
                    ("UNROLL", g.unroll as f64),
                ]);
                // The same module and constants, so the same bindings.
                let entry = if product == Product::Overhead {
                    "gemv_empty"
                } else {
                    entry
                };
                if entry != "gemv_dense" {
                    constants.extend([
                        ("READ", flag(product == Product::Read)),
                        ("RB", rb as f64),
                        ("X4", flag(x4)),
                        ("RELOAD", reload as f64),
                        ("ROUNDING", rounding as u32 as f64),
                    ]);
                }
                if entry == "gemv" || entry == "gemv_rows" {
                    constants.push(("ALIGNED", flag(aligned)));
                }
                self.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(&format!(
                            "wgpu-dequant {entry} {product:?}, {mt} rows of x ({label})"
                        )),
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
    /// (`[m, w.k]` f32, row-major) into `y` (`[m, w.n]` f32): two buffers
    /// of this decoder's device with `STORAGE` usage (refused otherwise,
    /// except another device's, which only wgpu can tell). Each weight is decoded
    /// once per 8 rows of x on a GPU, 16 on a CPU adapter with subgroups (4
    /// without); the sums are f32, in a fixed order, so a result is the
    /// same from run to run on one device.
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
        io: (&wgpu::Buffer, &wgpu::Buffer, u32),
        product: Product,
    ) -> Result<()> {
        self.record_product_at(encoder, w, io, product, 0)
    }

    /// [`GpuDecoder::record_product`] for the `m` rows of x from row
    /// `first` on, into y's rows from `first` on (an expert's rows among
    /// all experts' rows, gathered in expert order).
    fn record_product_at(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        w: &PackedLinear,
        (x, y, m): (&wgpu::Buffer, &wgpu::Buffer, u32),
        product: Product,
        first: u32,
    ) -> Result<()> {
        if w.experts > 0 {
            return Err(Error::bare(
                Rule::Argument,
                format!(
                    "matmul: a stack of {} experts: record_matmul_experts multiplies by it",
                    w.experts
                ),
            ));
        }
        check_io(w, (x, y, first + m))?;
        if m == 0 {
            return Ok(());
        }
        let max = self.limits.max_groups_per_dim;
        // Rows of x and y before `first`: x's words before its first row
        // (x0), y's (row0, which write_y subtracts, so wrapping).
        let (x_skip, y_skip) = (first * w.k as u32, first.wrapping_mul(w.n as u32));
        for part in &w.parts {
            let mt = m.min(self.gemv.geometry.max_mt(part.weights));
            let m_groups = m.div_ceil(mt);
            let row_groups = part.rows.div_ceil(self.gemv.geometry.rows(part.weights));
            if row_groups > max || m_groups > max {
                return Err(gpu_err(format!("matmul: {} rows and {m} rows of x exceed this device's {max} workgroups a dimension", part.rows)));
            }
            let gemv = GemvParams {
                m,
                n: w.n as u32,
                bias: part.bias,
                row0: part.row0.wrapping_sub(y_skip),
                x_stride: w.k as u32,
                x0: part.x0 + x_skip,
                acc: part.acc as u32,
                pad: 0,
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
                    entry(XS4, if x.size() >= 16 { x } else { &self.gemv.small }),
                    entry(
                        SRC4,
                        if part.src.size() >= 16 {
                            &part.src
                        } else {
                            &self.gemv.small
                        },
                    ),
                ],
            });
            // x4 reads vec4s: every row of x, and its part, on 16 bytes.
            let x4 = x4(part.weights, part.cols as usize)
                && w.k.is_multiple_of(4)
                && (part.x0 + x_skip).is_multiple_of(4)
                && x.size() >= 16;
            // The dense baseline's rows in runs of 8 values on 16 bytes.
            let wide = match part.weights {
                Weights::DenseBf16 if part.cols.is_multiple_of(8) && part.src.size() >= 16 => {
                    self.gemv.geometry.wide
                }
                _ => 1,
            };
            let variant = Variant {
                weights: part.weights,
                product,
                mt,
                x4,
                aligned: part.aligned,
                reload: self.gemv.geometry.reload(part.group_words),
                rounding: part.rounding,
                wide,
            };
            let pipeline = self.gemv_pipeline(variant);
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("wgpu-dequant gemv"),
                timestamp_writes: None,
            });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            match product {
                Product::Overhead => pass.dispatch_workgroups(1, 1, 1),
                _ => pass.dispatch_workgroups(row_groups, m_groups, 1),
            }
        }
        Ok(())
    }

    /// `y = x·Wᵀ (+ bias)` for the `m` rows of `x` (`[m, w.k]`), read back:
    /// [`GpuDecoder::record_matmul`] for tests and simple apps.
    pub async fn matmul_async(&self, w: &PackedLinear, x: &[f32], m: usize) -> Result<Vec<f32>> {
        self.read_back_product(w, x, m, |encoder, xs, ys, m| {
            self.record_matmul(encoder, w, xs, ys, m)
        })
        .await
    }

    /// The product `record` records for the `m` rows of `x`, `[m, w.k]`
    /// into `[m, w.n]`, submitted and read back.
    async fn read_back_product(
        &self,
        w: &PackedLinear,
        x: &[f32],
        m: usize,
        record: impl FnOnce(&mut wgpu::CommandEncoder, &wgpu::Buffer, &wgpu::Buffer, u32) -> Result<()>,
    ) -> Result<Vec<f32>> {
        if w.k == 0 || m.checked_mul(w.k) != Some(x.len()) {
            return Err(Error::bare(
                Rule::Argument,
                format!(
                    "matmul: x holds {} values, not {m} rows of {}",
                    x.len(),
                    w.k
                ),
            ));
        }
        if m == 0 || w.n == 0 {
            return Ok(Vec::new());
        }
        let m32 = u32::try_from(m)
            .map_err(|_| Error::bare(Rule::Argument, "matmul: too many rows of x"))?;
        self.scoped(async {
            let xs = self.storage(
                "wgpu-dequant matmul x",
                (4 * x.len()) as u64,
                wgpu::BufferUsages::COPY_DST,
            );
            self.queue.write_buffer(&xs, 0, bytemuck::cast_slice(x));
            let ys = self.storage(
                "wgpu-dequant matmul y",
                (4 * m * w.n) as u64,
                wgpu::BufferUsages::COPY_SRC,
            );
            let mut encoder = self.encoder("wgpu-dequant matmul");
            record(&mut encoder, &xs, &ys, m32)?;
            self.queue.submit([encoder.finish()]);
            let bytes = self.read_back_async(&ys).await?;
            Ok(bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
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

/// Refuses, as binding would, buffers `x` and `y` that cannot hold `m`
/// rows of `w`'s inputs and outputs: the app's device would take it as a
/// validation error, which panics by default.
fn check_io(w: &PackedLinear, (x, y, m): (&wgpu::Buffer, &wgpu::Buffer, u32)) -> Result<()> {
    let (n, k) = (w.n as u64, w.k as u64);
    for (buffer, name) in [(x, "x"), (y, "y")] {
        if !buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
            return Err(Error::bare(
                Rule::Argument,
                format!("matmul: {name} is bound as storage, and its buffer lacks BufferUsages::STORAGE"),
            ));
        }
    }
    if x == y {
        return Err(Error::bare(
            Rule::Argument,
            "matmul: x and y are one buffer; y is written while x is read",
        ));
    }
    if x.size() < 4 * m as u64 * k || y.size() < 4 * m as u64 * n {
        return Err(Error::bare(
            Rule::Argument,
            format!(
                "matmul: x holds {} bytes and y {}, for {m} rows of {k} inputs and {n} outputs",
                x.size(),
                y.size()
            ),
        ));
    }
    Ok(())
}

/// Whether every value of `job`'s W is an f32 its bf16 output holds
/// exactly, so that the products skip rounding it ([`Rounding::None`]):
/// no zero points, post scale or product dtype, scales powers of two
/// (e8m0: 2^-127 at least) or none, and codes of 8 significant bits at
/// most whose lowest is 2^-6 or more (a value's lowest bit then 2^-133 or
/// more, bf16's smallest). MXFP4's E2M1 codes and e8m0 scales are.
fn exact(job: &DecodeJob<'_>, weights: Weights) -> bool {
    let (out, skind, plain) = match weights {
        Weights::Packed(f) => {
            let plain =
                f.zero == layout::ZeroMode::None && !f.post && f.product == layout::OutKind::F32;
            (
                f.out,
                f.scaled.then_some(f.skind),
                plain && f.low_rank == layout::LowRankMode::None,
            )
        }
        Weights::Tiled(t) => (
            t.out,
            t.scaled.then_some(t.skind),
            t.zero == layout::ZeroMode::None,
        ),
        Weights::DenseBf16 => return false,
    };
    // The exponent of the lowest bit a scale may bring.
    let scale_low = match skind {
        None => 0,
        Some(layout::GridKind::E8m0) => -127,
        Some(_) => return false,
    };
    let fits = |v: f32| {
        let b = v.to_bits() & 0x7fff_ffff;
        let (exp, mantissa) = ((b >> 23) as i32, b & 0x7f_ffff);
        // Zero, and NaN or infinite (rounding keeps them so).
        if b == 0 || exp == 255 {
            return true;
        }
        let significand = if exp == 0 {
            mantissa
        } else {
            mantissa | 0x80_0000
        };
        let low = significand.trailing_zeros();
        let bits = 32 - significand.leading_zeros() - low;
        bits <= 8 && exp.max(1) - 150 + low as i32 + scale_low >= -133
    };
    out == layout::OutKind::Bf16 && plain && job.code_values.iter().all(|&v| fits(v))
}

/// Whether no value of rows `rows` of `job`'s W is NaN: its code values,
/// scales, zero points and offsets are finite (every stored entry those rows read
/// checked), and a post scale and the factors per input (a rank-0
/// low-rank branch) finite and nonzero, so that no difference or product
/// of them is.
fn nan_free(job: &DecodeJob<'_>, rows: std::ops::Range<usize>) -> bool {
    let finite = |v: &Values<'_>| job.entries_read(v, rows.clone(), f32::is_finite);
    job.code_values.iter().all(|v| v.is_finite())
        && job.scale.as_ref().is_none_or(finite)
        && match &job.zero {
            Some(ZeroPoint::Plain(z)) => finite(z),
            _ => true,
        }
        && job.offset.as_ref().is_none_or(finite)
        && job.post_scale.is_none_or(|p| p.is_finite() && p != 0.0)
        && job.low_rank.as_ref().is_none_or(|lr| {
            lr.rank == 0 && lr.inv_smooth.iter().all(|f| f.is_finite() && *f != 0.0)
        })
}

/// Whether the kernel reads x four values at a time (xs4): straight and
/// strided packs whose rows of `k` hold whole code words (and so x's rows
/// whole vec4s).
fn x4(weights: Weights, k: usize) -> bool {
    match weights {
        Weights::Packed(f) => k.is_multiple_of((32 / f.bits) as usize),
        Weights::Tiled(t) => k.is_multiple_of((32 / t.bits) as usize),
        Weights::DenseBf16 => false,
    }
}

/// What a product's pipeline is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Variant {
    weights: Weights,
    /// What it reads the weights as.
    product: Product,
    /// Rows of x a workgroup takes.
    mt: u32,
    /// x read four values at a time.
    x4: bool,
    /// Rows whose codes start on words.
    aligned: bool,
    /// Words between scale reloads in a run ([`Geometry::reload`]).
    reload: u32,
    /// How values are rounded.
    rounding: Rounding,
    /// Words a load of the dense baseline's W brings.
    wide: u32,
}

/// The products' pipelines.
type Cache = std::collections::HashMap<Variant, wgpu::ComputePipeline>;

/// `gemv`'s layouts and pipelines, made with the decoder.
pub(super) struct Pipelines {
    bind_group_layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    pipelines: std::sync::Mutex<Cache>,
    /// Bound as xs4 or src4 where x or the weights are too small to be
    /// (x4 is off then, and WIDE 1).
    small: wgpu::Buffer,
    /// The decode module, shaders/matmul/ and the entry points.
    module: wgpu::ShaderModule,
    geometry: Geometry,
    /// The routed experts' copies of rows, made on first use.
    gather: std::sync::OnceLock<experts::Gather>,
}

impl Pipelines {
    pub(super) fn new(device: &wgpu::Device) -> Pipelines {
        let subgroup = subgroup(device);
        let bind_group_layout = bind_group_layout(device);
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("wgpu-dequant gemv pipeline layout"),
            bind_group_layouts: &[Some(&bind_group_layout)],
            immediate_size: 0,
        });
        let small = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-dequant gemv small binding"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Pipelines {
            bind_group_layout,
            pipeline_layout,
            pipelines: Default::default(),
            small,
            module: module(device, subgroup.is_some()),
            geometry: Geometry::of(device.adapter_info().device_type, subgroup),
            gather: Default::default(),
        }
    }

    /// The same with a GPU's geometry, whatever the adapter.
    pub(super) fn gpu_geometry(self) -> Pipelines {
        Pipelines {
            geometry: Geometry::of(wgpu::DeviceType::DiscreteGpu, None),
            pipelines: Default::default(),
            ..self
        }
    }

    /// The same as on a device without subgroups.
    pub(super) fn without_subgroups(self, device: &wgpu::Device) -> Pipelines {
        Pipelines {
            module: module(device, false),
            geometry: Geometry::of(device.adapter_info().device_type, None),
            pipelines: Default::default(),
            ..self
        }
    }
}

/// The size of `device`'s subgroups, where the products use them: where
/// it has them, of one size (a run of words is a subgroup's) that fits in
/// a CPU adapter's workgroup, but not in browsers, whose WGSL would need
/// an `enable` that naga refuses.
fn subgroup(device: &wgpu::Device) -> Option<u32> {
    let info = device.adapter_info();
    let fits = info.subgroup_min_size == info.subgroup_max_size
        && (1..=CPU_WG).contains(&info.subgroup_max_size);
    (!cfg!(target_arch = "wasm32") && device.features().contains(wgpu::Features::SUBGROUP) && fits)
        .then_some(info.subgroup_max_size)
}

/// The products' module: the decode module (shader.rs), shaders/matmul/
/// and the entry points with (`subgroups`) or without subgroups.
fn module(device: &wgpu::Device, subgroups: bool) -> wgpu::ShaderModule {
    let entries = if subgroups { SUBGROUPS } else { NO_SUBGROUPS };
    device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("wgpu-dequant shaders/matmul"),
        source: wgpu::ShaderSource::Wgsl([SHADER, MATMUL, entries].concat().into()),
    })
}

#[cfg(test)]
mod tests;

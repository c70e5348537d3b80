//! `wgpu-dequant bench`: decode speed as a ratio against a baseline measured
//! in the same run on the same number of bytes.
//!
//! - CPU kernels: each format's layout (`Layout`) decoded to bf16 and f32
//!   from memory, against a multi-threaded `memcpy` of the output bytes.
//! - GPU kernels: the same jobs decoded into a GPU buffer (upload included,
//!   no readback), against a copy shader with the fast kernel's dispatch
//!   geometry that uploads and reads the same input and writes as many
//!   output bytes.
//! - GGUF (`gguf`): mapped and decoded a piece at a time as `dequantize`
//!   does; on the CPU Q4_K and Q6_K against the straight int4 job of the
//!   same shape, on the GPU the common types against the copy shader of the
//!   same pieces.
//! - End to end: `dequantize` of a generated checkpoint on disk, against
//!   writing (and syncing) the same number of bytes to a file.

mod gguf;

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::backend::{gpu::GpuDecoder, select, Backend, BackendChoice, Cpu};
use crate::error::{Error, Result, Rule};
use crate::job::{e2m1, e4m3, e8m0, DecodeJob, Dims, Fields, Grid, ValueKind, Values, ZeroPoint};
use crate::numerics::OutDtype;
use crate::writer::safetensors_header;
use safetensors::Dtype;

/// One measurement and its baseline.
#[derive(Debug, Clone)]
pub struct Figure {
    /// `cpu` or `gpu`.
    pub backend: &'static str,
    /// What was measured.
    pub what: String,
    /// The baseline it is compared with.
    pub baseline: String,
    /// Output bytes per run.
    pub bytes: u64,
    /// Best time of the measured operation, seconds.
    pub seconds: f64,
    /// Best time of the baseline, seconds.
    pub baseline_seconds: f64,
    /// Rows of x of a product (`bench --gemv`).
    pub m: Option<usize>,
    /// Bytes the baseline handles, when not `bytes` (a product's baseline
    /// reads other bytes).
    pub baseline_bytes: Option<u64>,
    /// An empty dispatch's time (one workgroup that does nothing, bound as
    /// the product), measured in the same turns: the fixed cost every
    /// dispatch pays, whatever it reads.
    pub dispatch_seconds: Option<f64>,
}

impl Figure {
    /// GB/s of the measured operation (output bytes; bytes read by a product).
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e9
    }

    /// GB/s of the baseline.
    pub fn baseline_gbps(&self) -> f64 {
        self.baseline_bytes.unwrap_or(self.bytes) as f64 / self.baseline_seconds / 1e9
    }

    /// Measured speed as a fraction of the baseline's.
    pub fn ratio(&self) -> f64 {
        self.baseline_seconds / self.seconds
    }
}

impl Figure {
    /// The line `bench --json` prints.
    pub fn json(&self) -> serde_json::Value {
        let mut line = serde_json::json!({
            "backend": self.backend,
            "case": self.what,
            "gbps": self.gbps(),
            "baseline": self.baseline,
            "baseline_gbps": self.baseline_gbps(),
            "ratio": self.ratio(),
        });
        if let Some(m) = self.m {
            line["m"] = m.into();
        }
        if let Some(d) = self.dispatch_seconds {
            line["dispatch_us"] = (d * 1e6).into();
        }
        line
    }
}

impl std::fmt::Display for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.m {
            Some(m) => format!("{} m={m}", self.what),
            None => self.what.clone(),
        };
        write!(
            f,
            "{} {:<40} {:>8.2} GB/s   {:<31} {:>8.2} GB/s   ratio {:.2}",
            self.backend,
            what,
            self.gbps(),
            self.baseline,
            self.baseline_gbps(),
            self.ratio()
        )?;
        match self.dispatch_seconds {
            Some(d) => write!(f, "   (a dispatch: {:.1} µs)", d * 1e6),
            None => Ok(()),
        }
    }
}

/// Best wall time of `runs` calls of `f`.
fn best(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut best = Duration::MAX;
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
    }
    Ok(best.as_secs_f64())
}

/// The layouts the kernels are measured on: the storage, code tables and
/// scale layout of each format, over random bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// pack-quantized int4, bf16 group-128 scales.
    Int4,
    /// The same with packed int4 zero points.
    Int4Asym,
    /// NVFP4: E2M1 codes, one e4m3 byte per 16 columns.
    Nvfp4,
    /// MXFP4: E2M1 codes, one e8m0 byte per 32 columns.
    Mxfp4,
    /// int8 with bf16 per-channel scales.
    Int8,
    /// FP8 E4M3 with f32 128×128 block scales (DeepSeek style).
    Fp8Block,
    /// GPTQ int4 g128: `qweight` int32 `[in/8, out]`, an output row's words
    /// a stored row apart; f16 scales and plain zero points on `[out, G]`.
    Gptq,
    /// AutoAWQ GEMM int4 g128: `[in, out/8]` int32 in AutoAWQ's word order,
    /// zero points packed along columns, f16 scales `[in/g, out]`; the
    /// output is the transpose.
    Awq,
    /// GPT-OSS experts: MXFP4 `[out, in/32, 16]` bytes, e8m0 scales per 32
    /// inputs; the output is the transpose, `[in, out]`.
    GptOss,
    /// bitsandbytes NF4 with double quant: high-nibble-first codes over
    /// the flattened tensor, one absmax byte per 64 elements read through a
    /// 256-entry table times one f32 per 256 blocks, plus an offset.
    BnbNf4,
    /// bitsandbytes LLM.int8: int8 codes, f32 `SCB` per row, then the
    /// post scale `1/127`.
    BnbInt8,
    /// MLX affine int4 g64: unsigned codes, bf16 scales and biases per 64
    /// columns, `bf16(bf16(s·q) + b)`.
    MlxAffine,
}

impl Layout {
    /// Every layout, in report order.
    pub(crate) const ALL: [Layout; 9] = [
        Layout::Int4,
        Layout::Int4Asym,
        Layout::Nvfp4,
        Layout::Mxfp4,
        Layout::Int8,
        Layout::Fp8Block,
        Layout::BnbNf4,
        Layout::BnbInt8,
        Layout::MlxAffine,
    ];

    /// The layouts whose codes run along the input dimension (the CPU's
    /// tiled path), each measured against the straight int4 layout too.
    pub(crate) const ALONG_INPUTS: [Layout; 3] = [Layout::Gptq, Layout::Awq, Layout::GptOss];
    /// Their baselines: straight int4 g128, without and with zero points.
    pub(crate) const STRAIGHT: [Layout; 2] = [Layout::Int4, Layout::Int4Asym];

    /// Bits per code.
    fn bits(self) -> u32 {
        match self {
            Layout::Int8 | Layout::Fp8Block | Layout::BnbInt8 => 8,
            _ => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Layout::Int4 => "int4 g128",
            Layout::Int4Asym => "int4 g128 asym",
            Layout::Nvfp4 => "nvfp4 g16",
            Layout::Mxfp4 => "mxfp4 g32",
            Layout::Int8 => "int8 channel",
            Layout::Fp8Block => "fp8 block128",
            Layout::Gptq => "gptq int4 g128 (strided)",
            Layout::Awq => "autoawq int4 g128 (transposed)",
            Layout::GptOss => "gpt-oss mxfp4 (transposed)",
            Layout::BnbNf4 => "bnb nf4 b64 double quant",
            Layout::BnbInt8 => "bnb llm.int8 (post scale)",
            Layout::MlxAffine => "mlx affine int4 g64 (bias)",
        }
    }
}

/// Random storage of one layout, `rows × cols`.
pub(crate) struct Weight {
    layout: Layout,
    rows: usize,
    cols: usize,
    codes: Vec<u8>,
    scale: Vec<u8>,
    zero: Vec<u8>,
}

/// A scale table: `f` of every byte.
fn table(f: impl Fn(u8) -> f32) -> ValueKind {
    let mut t = Box::new([0f32; 256]);
    for (b, v) in t.iter_mut().enumerate() {
        *v = f(b as u8);
    }
    ValueKind::Table(t)
}

impl Weight {
    /// Random storage; `cols` (and for [`Layout::ALONG_INPUTS`] `rows`) a
    /// multiple of 128.
    pub(crate) fn random(layout: Layout, rows: usize, cols: usize, seed: u64) -> Weight {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut bytes = |n: usize| {
            let mut v = vec![0u8; n];
            rng.fill(&mut v);
            v
        };
        let codes = bytes(rows * cols * layout.bits() as usize / 8);
        let scale = match layout {
            Layout::Int4 | Layout::Int4Asym | Layout::Gptq | Layout::Awq => {
                bytes(rows * cols / 128 * 2)
            }
            Layout::Nvfp4 => bytes(rows * cols / 16),
            Layout::Mxfp4 | Layout::GptOss => bytes(rows * cols / 32),
            Layout::Int8 => bytes(rows * 2),
            Layout::Fp8Block => bytes(rows.div_ceil(128) * cols / 128 * 4),
            Layout::BnbNf4 => bytes(rows * cols / 64),
            Layout::BnbInt8 => bytes(rows * 4),
            Layout::MlxAffine => bytes(rows * cols / 64 * 2),
        };
        // Scales as moderate finite numbers: bf16 0x3c00.., f32 0x3c....
        let mut scale = scale;
        match layout {
            Layout::Int4 | Layout::Int4Asym | Layout::Int8 | Layout::MlxAffine => {
                for c in scale.chunks_mut(2) {
                    c[1] = 0x3c;
                }
            }
            // f16 0x2c..: about 1/16.
            Layout::Gptq | Layout::Awq => {
                for c in scale.chunks_mut(2) {
                    c[1] = 0x2c;
                }
            }
            Layout::Fp8Block | Layout::BnbInt8 => {
                for c in scale.chunks_mut(4) {
                    c[3] = 0x3c;
                }
            }
            // e8m0 2^-11 .. 1, as trained experts' are (2^-6 .. 2^-4 in the
            // fixture's).
            Layout::GptOss => {
                for b in &mut scale {
                    *b = 116 + *b % 12;
                }
            }
            _ => {}
        }
        let zero = match layout {
            Layout::Int4Asym => bytes(rows / 8 * cols / 128 * 4),
            // One 4-bit zero point per row and group, as GPTQ's are after
            // the host rearranges them.
            Layout::Gptq => bytes(rows * cols / 128).iter().map(|b| b & 15).collect(),
            // AutoAWQ's qzeros: [in/g, out/8] int32.
            Layout::Awq => bytes(cols / 128 * rows / 2),
            // MLX's biases, bf16 of either sign about 1/64.
            Layout::MlxAffine => bytes(rows * cols / 64 * 2)
                .chunks(2)
                .flat_map(|c| [c[0], 0x3c | (c[1] & 0x80)])
                .collect(),
            _ => Vec::new(),
        };
        Weight {
            layout,
            rows,
            cols,
            codes,
            scale,
            zero,
        }
    }

    /// The job that decodes it to `out`.
    pub(crate) fn job(&self, out: OutDtype) -> DecodeJob<'_> {
        let (rows, cols) = (self.rows, self.cols);
        if Layout::ALONG_INPUTS.contains(&self.layout) {
            return self.along_inputs_job(out);
        }
        let bits = self.layout.bits();
        let grid = |row_div: usize, col_div: usize| Grid {
            row_div,
            col_div,
            row_stride: cols.div_ceil(col_div),
            slice_stride: 0,
        };
        let (kind, grid) = match self.layout {
            Layout::Int4 | Layout::Int4Asym => (ValueKind::Bf16, grid(1, 128)),
            Layout::MlxAffine => (ValueKind::Bf16, grid(1, 64)),
            // e4m3 over a global scale, as NVFP4 folds them.
            Layout::Nvfp4 => (table(|b| e4m3(b) / 448.0), grid(1, 16)),
            Layout::Mxfp4 => (table(e8m0), grid(1, 32)),
            Layout::Int8 => (ValueKind::Bf16, grid(1, cols)),
            Layout::Fp8Block => (ValueKind::F32, grid(128, 128)),
            Layout::BnbNf4 => {
                let mut table = [0f32; 256];
                for (i, v) in table.iter_mut().enumerate() {
                    *v = (i as f32 - 127.5) / 128.0;
                }
                let nested = crate::job::Nested {
                    table,
                    outer: vec![0.0625f32; (rows * cols / 64).div_ceil(256)].into(),
                    per_outer: 256,
                    offset: 0.125,
                };
                (ValueKind::Nested(Box::new(nested)), grid(1, 64))
            }
            Layout::BnbInt8 => (ValueKind::F32, grid(1, cols)),
            _ => (ValueKind::Bf16, grid(1, cols)),
        };
        let code_values: Vec<f32> = match self.layout {
            Layout::Int4 | Layout::Int4Asym => (0..16).map(|c| c as f32 - 8.0).collect(),
            Layout::MlxAffine => (0..16).map(|c| c as f32).collect(),
            Layout::Int8 | Layout::BnbInt8 => (0..=255u8).map(|c| c as i8 as f32).collect(),
            Layout::Nvfp4 | Layout::Mxfp4 => (0..16).map(e2m1).collect(),
            Layout::BnbNf4 => crate::formats::bnb::NF4.to_vec(),
            _ => (0..=255).map(e4m3).collect(),
        };
        let zero = (self.layout == Layout::Int4Asym).then(|| ZeroPoint::Packed {
            fields: Fields {
                data: self.zero.as_slice().into(),
                bits: 4,
                per_word: 0,
                interleaved: false,
                lane_bits: 32,
                word_bits: 32 * (cols / 128) as u64,
                slice_bits: 0,
                high_first: false,
                blocks: None,
            },
        });
        DecodeJob {
            dims: Dims {
                slices: 1,
                rows,
                cols,
            },
            codes: Fields {
                data: self.codes.as_slice().into(),
                bits,
                per_word: 0,
                interleaved: false,
                lane_bits: (cols * bits as usize) as u64,
                word_bits: 32,
                slice_bits: 0,
                high_first: self.layout == Layout::BnbNf4,
                blocks: None,
            },
            code_values: code_values.into(),
            zero,
            scale: Some(Values {
                data: self.scale.as_slice().into(),
                kind,
                grid,
            }),
            g_idx: None,
            low_rank: None,
            post_scale: (self.layout == Layout::BnbInt8).then_some(crate::formats::bnb::INT8_POST),
            // On the scale's grid.
            offset: (self.layout == Layout::MlxAffine).then(|| Values {
                data: self.zero.as_slice().into(),
                kind: ValueKind::Bf16,
                grid,
            }),
            product: match self.layout {
                Layout::MlxAffine => crate::job::Product::OutDtype,
                _ => Default::default(),
            },
            sparse: None,
            transposed: false,
            out,
        }
    }
}

impl Weight {
    /// The job of a layout whose codes run along the inputs: output
    /// `[rows, cols]` = `[out, in]` (`[in, out]` for GPT-OSS's experts).
    fn along_inputs_job(&self, out: OutDtype) -> DecodeJob<'_> {
        let (rows, cols) = (self.rows, self.cols);
        let int4: Vec<f32> = (0..16).map(|c| c as f32 - 8.0).collect();
        fn values(data: &[u8], kind: ValueKind, grid: Grid) -> Values<'_> {
            Values {
                data: data.into(),
                kind,
                grid,
            }
        }
        match self.layout {
            Layout::Gptq => {
                // Lane = output row, its words `rows` words apart.
                let codes =
                    Fields::dense(self.codes.as_slice(), 4, 32).with_word_bits(32 * rows as u64);
                let grid = Grid {
                    row_div: 1,
                    col_div: 128,
                    row_stride: cols / 128,
                    slice_stride: 0,
                };
                // GPTQ's unsigned codes, less their zero points.
                let unsigned = (0..16).map(|c| c as f32).collect::<Vec<f32>>();
                DecodeJob::new(dims(1, rows, cols), codes, unsigned, out)
                    .with_scale(values(&self.scale, ValueKind::F16, grid))
                    .with_zero(ZeroPoint::Plain(values(&self.zero, ValueKind::I8, grid)))
            }
            Layout::Awq => {
                // Stored [in, out]: `cols` rows of `rows` columns.
                let lane_bits = rows as u64 * 4;
                let codes = Fields::padded(self.codes.as_slice(), 4, lane_bits).interleaved();
                let zeros = Fields::padded(self.zero.as_slice(), 4, lane_bits).interleaved();
                let grid = Grid {
                    row_div: 128,
                    col_div: 1,
                    row_stride: rows,
                    slice_stride: 0,
                };
                DecodeJob::new(dims(1, cols, rows), codes, int4, out)
                    .with_scale(values(&self.scale, ValueKind::F16, grid))
                    .with_zero(ZeroPoint::PackedAlongCols { fields: zeros })
                    .transpose()
            }
            _ => {
                // Stored [out, in]: `cols` rows of `rows` columns.
                let codes = Fields::dense(self.codes.as_slice(), 4, rows as u64 * 4);
                let grid = Grid {
                    row_div: 1,
                    col_div: 32,
                    row_stride: rows / 32,
                    slice_stride: 0,
                };
                DecodeJob::new(
                    dims(1, cols, rows),
                    codes,
                    (0..16).map(e2m1).collect::<Vec<f32>>(),
                    out,
                )
                .with_scale(values(&self.scale, table(e8m0), grid))
                .transpose()
            }
        }
    }
}

fn dims(slices: usize, rows: usize, cols: usize) -> Dims {
    Dims { slices, rows, cols }
}

/// One kernel measurement: `case` names the layout and output dtype.
fn case_name(layout: Layout, out: OutDtype) -> String {
    format!("{} -> {out}", layout.name())
}

/// Best wall times of `runs` calls each of `a` and `b`, taken in turns, so
/// that a drift in the machine's speed (a shared host) hits both alike.
fn best_of_turns(
    runs: usize,
    mut a: impl FnMut() -> Result<()>,
    mut b: impl FnMut() -> Result<()>,
) -> Result<(f64, f64)> {
    let [ta, tb] = best_in_turns(runs, [&mut || best(1, &mut a), &mut || best(1, &mut b)])?;
    Ok((ta, tb))
}

/// The least of `runs` timings (in seconds) by each of `fs`, taken in
/// turns, so that a slow spell of a shared machine slows them all alike.
fn best_in_turns<const N: usize>(
    runs: usize,
    mut fs: [&mut dyn FnMut() -> Result<f64>; N],
) -> Result<[f64; N]> {
    let mut times = [f64::MAX; N];
    for _ in 0..runs.max(1) {
        for (t, f) in times.iter_mut().zip(fs.iter_mut()) {
            *t = t.min(f()?);
        }
    }
    Ok(times)
}

/// A zeroed buffer of `len` bytes that starts on a cache line, as the
/// writer's do.
fn line_aligned(len: usize) -> (Vec<u8>, usize) {
    let buf = vec![0u8; len + 64];
    let skew = (64 - buf.as_ptr() as usize % 64) % 64;
    (buf, skew)
}

/// CPU decode of every layout against a multi-threaded copy of the output
/// bytes; the layouts along the inputs also against the straight int4 job
/// of the same shape (and those with zero points against the straight one
/// with zero points: the cost of the transposition alone), in turns.
pub(crate) fn cpu_kernels(
    rows: usize,
    cols: usize,
    runs: usize,
    only: &str,
) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    // Their codes and scales need whole groups of 128 rows too.
    let along = if rows.is_multiple_of(128) {
        &Layout::ALONG_INPUTS[..]
    } else {
        &[]
    };
    let straight: Vec<Weight> = Layout::STRAIGHT
        .iter()
        .filter(|_| along.iter().any(|l| l.name().contains(only)))
        .map(|&l| Weight::random(l, rows, cols, 7))
        .collect();
    let cpu = Cpu::new();
    let decode =
        |job: &DecodeJob<'_>, dst: &mut [u8]| cpu.decode_rows(job, 0..job.dims.total_rows(), dst);
    for &layout in Layout::ALL
        .iter()
        .chain(along)
        .filter(|l| l.name().contains(only))
    {
        let w = Weight::random(layout, rows, cols, 7);
        for out in [OutDtype::Bf16, OutDtype::F32] {
            let job = w.job(out);
            let bytes = job.out_bytes();
            let src = vec![1u8; bytes];
            let (mut buf, skew) = line_aligned(bytes);
            let dst = &mut buf[skew..skew + bytes];
            let chunk = (bytes / rayon::current_num_threads().max(1) / 4).max(1 << 16);
            // Touch both buffers once so page faults are not timed.
            dst.par_chunks_mut(chunk).for_each(|d| d.fill(0));
            let copy = |dst: &mut [u8]| {
                dst.par_chunks_mut(chunk)
                    .zip(src.par_chunks(chunk))
                    .for_each(|(d, s)| d.copy_from_slice(s));
                Ok(())
            };
            // Both write the same buffer: one `dst` borrowed in turns.
            let dst = std::cell::RefCell::new(dst);
            let (t, copy) = best_of_turns(
                runs,
                || decode(&job, &mut dst.borrow_mut()),
                || copy(&mut dst.borrow_mut()),
            )?;
            figures.push(Figure {
                backend: "cpu",
                what: case_name(layout, out),
                baseline: format!("memcpy, {} threads", rayon::current_num_threads()),
                bytes: bytes as u64,
                seconds: t,
                baseline_seconds: copy,
                m: None,
                baseline_bytes: None,
                dispatch_seconds: None,
            });
            let zero_points = matches!(layout, Layout::Gptq | Layout::Awq);
            for base in straight
                .iter()
                .filter(|_| along.contains(&layout))
                .filter(|b| b.layout == Layout::Int4 || zero_points)
            {
                let base_job = base.job(out);
                let (t, s) = best_of_turns(
                    runs,
                    || decode(&job, &mut dst.borrow_mut()),
                    || decode(&base_job, &mut dst.borrow_mut()),
                )?;
                figures.push(Figure {
                    backend: "cpu",
                    what: case_name(layout, out),
                    baseline: format!("straight {}", case_name(base.layout, out)),
                    bytes: bytes as u64,
                    seconds: t,
                    baseline_seconds: s,
                    m: None,
                    baseline_bytes: None,
                    dispatch_seconds: None,
                });
            }
        }
    }
    Ok(figures)
}

/// One run of the copy shader of `job`'s fast-kernel geometry (`job`
/// named `name`), waited for.
fn copy_once(
    decoder: &GpuDecoder,
    job: &DecodeJob<'_>,
    name: &str,
    wait: &dyn Fn() -> Result<()>,
) -> Result<()> {
    let buf = decoder
        .copy_baseline(job)
        .ok_or_else(|| Error::bare(Rule::Gpu, format!("bench: no fast kernel for {name}")))??;
    wait()?;
    buf.destroy();
    Ok(())
}

/// `job` decoded into a GPU buffer (upload included) against the copy
/// shader of the same geometry, best of `runs` each, taken in turns; the
/// figure names the kernel that ran.
fn against_copy(
    decoder: &GpuDecoder,
    job: &DecodeJob<'_>,
    name: &str,
    runs: usize,
    wait: &dyn Fn() -> Result<()>,
) -> Result<Figure> {
    let before = decoder.dispatches();
    let (decode, copy) = best_of_turns(
        runs,
        || {
            let buf = decoder.decode_to_buffer(job)?;
            wait()?;
            buf.destroy();
            Ok(())
        },
        || copy_once(decoder, job, name, wait),
    )?;
    let kernel = kernel_name(before, decoder.dispatches());
    Ok(Figure {
        backend: "gpu",
        what: format!("{name} ({kernel})"),
        baseline: "copy shader, same geometry".into(),
        bytes: job.out_bytes() as u64,
        seconds: decode,
        baseline_seconds: copy,
        m: None,
        baseline_bytes: None,
        dispatch_seconds: None,
    })
}

/// GPU decode of every layout into a GPU buffer (upload included) against
/// the copy shader with the fast kernel's geometry, which uploads the same
/// bytes, reads each code word and writes as many output words.
pub(crate) fn gpu_kernels(
    decoder: &GpuDecoder,
    rows: usize,
    cols: usize,
    runs: usize,
    only: &str,
) -> Result<Vec<Figure>> {
    let wait = || {
        decoder
            .device()
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| Error::bare(Rule::Gpu, "bench: poll").caused_by(e))
    };
    let mut figures = Vec::new();
    for layout in Layout::ALL.into_iter().filter(|l| l.name().contains(only)) {
        let w = Weight::random(layout, rows, cols, 7);
        for out in [OutDtype::Bf16, OutDtype::F32] {
            let job = w.job(out);
            let figure = against_copy(decoder, &job, &case_name(layout, out), runs, &wait)?;
            let decode = figure.seconds;
            figures.push(figure);
            // A model decoded into GPU memory should cost about its upload.
            if out == OutDtype::Bf16 && matches!(layout, Layout::Int4 | Layout::Nvfp4) {
                let input = job.codes.data.len() + job.scale.as_ref().map_or(0, |s| s.data.len());
                let codes = &job.codes.data[..];
                let upload = best(runs, || {
                    let buf = decoder.upload(codes)?;
                    wait()?;
                    buf.destroy();
                    Ok(())
                })?;
                figures.push(Figure {
                    backend: "gpu",
                    what: format!("{}, resident, per input byte", case_name(layout, out)),
                    baseline: "upload of the codes".into(),
                    bytes: input as u64,
                    seconds: decode,
                    baseline_seconds: upload,
                    m: None,
                    baseline_bytes: None,
                    dispatch_seconds: None,
                });
            }
        }
    }
    figures.extend(gpu_input_packed(decoder, rows, cols, runs, only, &wait)?);
    if cols.is_multiple_of(256) {
        figures.extend(gguf::gpu(decoder, (rows, cols), runs, only, &wait)?);
    }
    Ok(figures)
}

/// The weights `bench --gemv` multiplies by, `[out, in]`: a square and an
/// MLP's two projections of a 7B-class model, and a MoE expert.
pub const GEMV_SHAPES: [(usize, usize); 4] =
    [(4096, 4096), (4096, 14336), (14336, 4096), (2048, 768)];

/// Rows of x `bench --gemv` multiplies with: a token, and batches.
pub const GEMV_MS: [usize; 4] = [1, 4, 16, 64];

/// Products with packed weights (`gemv`, bf16 model weights) of every
/// layout the GPU multiplies by, per shape and rows of x, against the read
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
            Batch::of(decoder, one, Product::Decoded, (&x, &y, 1))?.reps > 1
        };
        let dense = copies(first, fast, upload_dense)?;
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
            let packed = copies(upload()?, fast, upload)?;
            let bytes = packed[0].gpu_bytes();
            for &m in ms {
                let (x, y) = x_of(m);
                let io = (&x, &y, m as u32);
                let mut ours = Batch::of(decoder, &packed, Product::Decoded, io)?;
                let mut read = Batch::of(decoder, &packed, Product::Read, io)?;
                let mut plain = Batch::of(decoder, &dense, Product::Decoded, io)?;
                let mut empty = Batch::of(decoder, &packed, Product::Overhead, io)?;
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
        }
    }
    Ok(())
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

/// One kernel's timed batch: `reps` products, cycling through copies of
/// the weights, recorded before the clock starts and submitted at once.
struct Batch<'a> {
    decoder: &'a GpuDecoder,
    weights: &'a [crate::backend::gpu::PackedLinear],
    product: crate::backend::gpu::Product,
    io: (&'a wgpu::Buffer, &'a wgpu::Buffer, u32),
    reps: usize,
}

impl<'a> Batch<'a> {
    /// The batch that takes about [`BATCH`] or more (at least one product,
    /// at most 4096), sized after a first run: a batch's time is the
    /// products' and one submission's.
    fn of(
        decoder: &'a GpuDecoder,
        weights: &'a [crate::backend::gpu::PackedLinear],
        product: crate::backend::gpu::Product,
        io: (&'a wgpu::Buffer, &'a wgpu::Buffer, u32),
    ) -> Result<Batch<'a>> {
        let mut batch = Batch {
            decoder,
            weights,
            product,
            io,
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
    fn seconds(&mut self) -> Result<f64> {
        let d = self.decoder;
        let mut encoder = d.device().create_command_encoder(&Default::default());
        for w in self.weights.iter().cycle().take(self.reps) {
            d.record_product(&mut encoder, w, self.io, self.product)?;
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

/// Which kernel ran between two [`GpuDecoder::dispatches`] readings.
fn kernel_name(
    before: crate::backend::gpu::Dispatches,
    after: crate::backend::gpu::Dispatches,
) -> &'static str {
    if after.generic > before.generic {
        "generic kernel"
    } else if after.tiled > before.tiled {
        "tile kernel"
    } else {
        "fast kernel"
    }
}

/// The layouts whose codes are packed along the input dimension (the GPU's
/// tile kernel), each an `[out, in]` = `rows × cols` output over random
/// storage. Apart from [`Layout`]: no CPU figures of their own yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InputPacked {
    /// AutoAWQ GEMM: int32 `[in, out/8]` in AutoAWQ's word order, packed
    /// zero points `[in/128, out/8]`, f16 scales `[in/128, out]`; the
    /// output is the transpose.
    AwqGemm,
    /// GPT-OSS MXFP4 experts: 4 experts of blocks `[out, in/32, 16]` with
    /// e8m0 scales `[out, in/32]`, each written transposed `[in, out]`:
    /// `rows / 4` inputs of `cols` outputs each.
    GptOss,
    /// GPTQ int4 group 128: int32 `[in/8, out]` packed down the input rows,
    /// f16 scales as a plain `[out, in/128]` grid, symmetric.
    Gptq,
}

impl InputPacked {
    /// Every such layout, in report order.
    pub(crate) const ALL: [InputPacked; 3] =
        [InputPacked::AwqGemm, InputPacked::GptOss, InputPacked::Gptq];

    fn name(self) -> &'static str {
        match self {
            InputPacked::AwqGemm => "autoawq gemm int4 g128",
            InputPacked::GptOss => "gpt-oss mxfp4 experts",
            InputPacked::Gptq => "gptq int4 g128",
        }
    }

    /// Random storage for a `rows × cols` output (`rows` a multiple of 128,
    /// `cols` of 128): (codes, scales, zero points).
    fn storage(self, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut bytes = |n: usize| {
            let mut v = vec![0u8; n];
            rng.fill(&mut v);
            v
        };
        let codes = bytes(rows * cols / 2);
        let (mut scale, zero) = match self {
            InputPacked::AwqGemm => (bytes(cols / 128 * rows * 2), bytes(cols / 128 * rows / 2)),
            InputPacked::GptOss => (bytes(rows * cols / 32), Vec::new()),
            InputPacked::Gptq => (bytes(rows * cols / 128 * 2), Vec::new()),
        };
        // f16 scales as moderate finite numbers (0x30.. is about 1/8).
        if self != InputPacked::GptOss {
            for c in scale.chunks_mut(2) {
                c[1] = 0x30;
            }
        }
        (codes, scale, zero)
    }

    /// The job over [`InputPacked::storage`] writing `out`.
    fn job<'a>(
        self,
        (rows, cols): (usize, usize),
        (codes, scale, zero): &'a (Vec<u8>, Vec<u8>, Vec<u8>),
        out: OutDtype,
    ) -> DecodeJob<'a> {
        let int4 = (0..16).map(|c| c as f32 - 8.0).collect::<Vec<f32>>();
        match self {
            InputPacked::AwqGemm => {
                // Stored [in, out]: `cols` rows of `rows` columns.
                let stored = Dims {
                    slices: 1,
                    rows: cols,
                    cols: rows,
                };
                let lane = (rows / 8) as u64 * 32;
                let scale = Values {
                    data: scale.as_slice().into(),
                    kind: ValueKind::F16,
                    grid: Grid {
                        row_div: 128,
                        col_div: 1,
                        row_stride: rows,
                        slice_stride: 0,
                    },
                };
                let zero = ZeroPoint::PackedAlongCols {
                    fields: Fields::padded(zero.as_slice(), 4, lane).interleaved(),
                };
                let codes = Fields::padded(codes.as_slice(), 4, lane).interleaved();
                DecodeJob::new(stored, codes, int4, out)
                    .with_scale(scale)
                    .with_zero(zero)
                    .transpose()
            }
            InputPacked::GptOss => {
                // Stored [E, out, in]: 4 slices of `cols` rows of `rows / 4`.
                let inputs = rows / 4;
                let stored = Dims {
                    slices: 4,
                    rows: cols,
                    cols: inputs,
                };
                let codes = Fields::dense(codes.as_slice(), 4, inputs as u64 * 4)
                    .with_slice_bits((cols * inputs) as u64 * 4);
                let scale = Values {
                    data: scale.as_slice().into(),
                    kind: table(e8m0),
                    grid: Grid {
                        row_div: 1,
                        col_div: 32,
                        row_stride: inputs / 32,
                        slice_stride: cols * inputs / 32,
                    },
                };
                DecodeJob::new(stored, codes, (0..16).map(e2m1).collect::<Vec<f32>>(), out)
                    .with_scale(scale)
                    .transpose()
            }
            InputPacked::Gptq => {
                let dims = Dims {
                    slices: 1,
                    rows,
                    cols,
                };
                let codes = Fields::dense(codes.as_slice(), 4, 32).with_word_bits(32 * rows as u64);
                let scale = Values {
                    data: scale.as_slice().into(),
                    kind: ValueKind::F16,
                    grid: Grid {
                        row_div: 1,
                        col_div: 128,
                        row_stride: cols / 128,
                        slice_stride: 0,
                    },
                };
                DecodeJob::new(dims, codes, int4, out).with_scale(scale)
            }
        }
    }
}

/// GPU decode of the [`InputPacked`] layouts into a GPU buffer against the
/// copy shader of the same dispatch; none when `rows` is not a multiple of
/// 128.
fn gpu_input_packed(
    decoder: &GpuDecoder,
    rows: usize,
    cols: usize,
    runs: usize,
    only: &str,
    wait: &dyn Fn() -> Result<()>,
) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    if !rows.is_multiple_of(128) {
        return Ok(figures);
    }
    for layout in InputPacked::ALL
        .into_iter()
        .filter(|l| l.name().contains(only))
    {
        let storage = layout.storage(rows, cols);
        for out in [OutDtype::Bf16, OutDtype::F32] {
            let job = layout.job((rows, cols), &storage, out);
            let name = format!("{} -> {out}", layout.name());
            figures.push(against_copy(decoder, &job, &name, runs, &wait)?);
        }
    }
    Ok(figures)
}

/// The generated checkpoints `bench --e2e-gb` dequantizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// 4096x8192 int4 group-128 weights in one file.
    Square,
    /// A MoE release: 256x1024 int4 group-32 experts over 8 shards, each
    /// module's scale in the next shard (as Kimi-K2-style releases split them).
    Moe,
    /// One int4 group-32 weight of 32768 columns holding all the bytes.
    OneTensor,
}

impl Shape {
    /// (tensors, rows, cols, group, shards) of about `gb` GB of bf16 output.
    fn layout(self, gb: f64) -> (usize, usize, usize, usize, usize) {
        let count = |per_tensor: usize| ((gb * 1e9 / per_tensor as f64).ceil() as usize).max(1);
        match self {
            Shape::Square => (count(4096 * 8192 * 2), 4096, 8192, 128, 1),
            Shape::Moe => (count(256 * 1024 * 2).max(8), 256, 1024, 32, 8),
            Shape::OneTensor => (1, count(32768 * 2).next_multiple_of(8), 32768, 32, 1),
        }
    }
}

/// Writes a compressed-tensors int4 checkpoint of `tensors` weights of
/// `rows × cols` in groups of `group` into `dir`: `config.json` and one
/// `model.safetensors`, or `shards` files and an index, with each module's
/// scale and shape in the shard after its codes.
pub(crate) fn write_checkpoint(
    dir: &Path,
    (tensors, rows, cols, group, shards): (usize, usize, usize, usize, usize),
) -> Result<()> {
    let io = |p: &Path, e| Error::io(p, "cannot write", e);
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let (packed_len, scale_len) = (rows * cols / 2, rows * cols / group * 2);
    let (packed_shape, scale_shape, shape_shape) = ([rows, cols / 8], [rows, cols / group], [2]);
    let file = |k: usize| {
        if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{shards:05}.safetensors", k + 1)
        }
    };
    // (name, shard, what): 0 codes, 1 scale, 2 shape.
    let mut entries = Vec::new();
    for i in 0..tensors {
        let m = format!("model.layers.{i}.mlp.down_proj");
        let k = i * shards / tensors;
        entries.push((format!("{m}.weight_packed"), k, 0));
        entries.push((format!("{m}.weight_scale"), (k + 1) % shards, 1));
        entries.push((format!("{m}.weight_shape"), (k + 1) % shards, 2));
    }
    let mut rng = fastrand::Rng::with_seed(11);
    let mut weight_map = serde_json::Map::new();
    for k in 0..shards {
        let path = dir.join(file(k));
        let mine: Vec<&(String, usize, u8)> = entries.iter().filter(|e| e.1 == k).collect();
        let header = safetensors_header(
            &path,
            mine.iter().map(|(n, _, what)| match what {
                0 => (n.as_str(), Dtype::I32, &packed_shape[..], packed_len),
                1 => (n.as_str(), Dtype::BF16, &scale_shape[..], scale_len),
                _ => (n.as_str(), Dtype::I64, &shape_shape[..], 16),
            }),
        )?;
        let mut f = std::io::BufWriter::new(File::create(&path).map_err(|e| io(&path, e))?);
        f.write_all(&header).map_err(|e| io(&path, e))?;
        let mut block = vec![0u8; packed_len.min(64 << 20)];
        for (name, _, what) in mine {
            weight_map.insert(name.clone(), file(k).into());
            match what {
                0 => {
                    let mut left = packed_len;
                    while left > 0 {
                        let n = left.min(block.len());
                        rng.fill(&mut block[..n]);
                        f.write_all(&block[..n]).map_err(|e| io(&path, e))?;
                        left -= n;
                    }
                }
                // Scales as moderate finite bf16 numbers (0x3c..).
                1 => {
                    let scales: Vec<u8> = (0..scale_len)
                        .map(|j| if j % 2 == 1 { 0x3c } else { rng.u8(..) })
                        .collect();
                    f.write_all(&scales).map_err(|e| io(&path, e))?;
                }
                _ => {
                    for v in [rows as i64, cols as i64] {
                        f.write_all(&v.to_le_bytes()).map_err(|e| io(&path, e))?;
                    }
                }
            }
        }
        f.flush().map_err(|e| io(&path, e))?;
    }
    if shards > 1 {
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        let ipath = dir.join("model.safetensors.index.json");
        std::fs::write(&ipath, index.to_string()).map_err(|e| io(&ipath, e))?;
    }
    let config = serde_json::json!({
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "version": "0.19.0",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                            "group_size": group, "symmetric": true, "dynamic": false}
            }}
        }
    });
    let cpath = dir.join("config.json");
    std::fs::write(&cpath, config.to_string()).map_err(|e| io(&cpath, e))
}

/// Writing `bytes` to a new file in `dir` and syncing it, as the writer
/// does: the end-to-end baseline.
pub(crate) fn file_write(dir: &Path, bytes: u64) -> Result<f64> {
    let path = dir.join("baseline.bin");
    let block = vec![0x5Au8; 64 << 20];
    let t = Instant::now();
    let mut f = std::io::BufWriter::with_capacity(
        1 << 20,
        File::create(&path).map_err(|e| Error::io(&path, "cannot create", e))?,
    );
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])
            .map_err(|e| Error::io(&path, "cannot write", e))?;
        left -= n as u64;
    }
    let file = f
        .into_inner()
        .map_err(|e| Error::io(&path, "cannot write", e.into_error()))?;
    file.sync_all()
        .map_err(|e| Error::io(&path, "cannot sync", e))?;
    let s = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    Ok(s)
}

/// Peak resident memory of this process since the last [`reset_peak_rss`],
/// in bytes (Linux; `None` elsewhere).
pub(crate) fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Starts a new peak-RSS measurement (Linux: `/proc/self/clear_refs`).
pub(crate) fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// End-to-end figures of `dequantize` on a generated checkpoint.
#[derive(Debug, Clone)]
pub struct EndToEnd {
    /// `dequantize` against writing the same bytes.
    pub figure: Figure,
    /// Input checkpoint bytes.
    pub input_bytes: u64,
    /// Peak RSS during `dequantize`, when known.
    pub peak_rss: Option<u64>,
}

/// Generates an int4 checkpoint of `shape` with about `gb` GB of bf16 output
/// in `dir` and times `dequantize` of it with `backend` against writing the
/// same number of bytes to a file, best of `runs` each.
pub(crate) fn end_to_end(
    dir: &Path,
    gb: f64,
    shape: Shape,
    runs: usize,
    backend: BackendChoice,
) -> Result<EndToEnd> {
    let layout = shape.layout(gb);
    let (tensors, rows, cols, group, shards) = layout;
    let ckpt = dir.join("bench-e2e");
    let out = dir.join("bench-e2e-dense");
    let _ = std::fs::remove_dir_all(&ckpt);
    let _ = std::fs::remove_dir_all(&out);
    write_checkpoint(&ckpt, layout)?;
    let mut input_bytes = 0;
    for e in std::fs::read_dir(&ckpt).map_err(|e| Error::io(&ckpt, "cannot read", e))? {
        let e = e.map_err(|e| Error::io(&ckpt, "cannot read", e))?;
        input_bytes += e.metadata().map_or(0, |m| m.len());
    }
    let bytes = (tensors * rows * cols * 2) as u64;
    let options = crate::Options {
        backend,
        ..Default::default()
    };
    // Alternating runs, the best of each kept: the disk's speed drifts, and
    // both sides get the same chances.
    let (mut seconds, mut baseline, mut peak) = (f64::MAX, f64::MAX, None);
    let mut done = Ok(());
    for _ in 0..runs.max(1) {
        baseline = baseline.min(file_write(dir, bytes)?);
        reset_peak_rss();
        let t = Instant::now();
        done = crate::dequantize(&ckpt, &out, &options).map(|_| ());
        seconds = seconds.min(t.elapsed().as_secs_f64());
        peak = peak.max(peak_rss());
        let _ = std::fs::remove_dir_all(&out);
        if done.is_err() {
            break;
        }
    }
    let _ = std::fs::remove_dir_all(&ckpt);
    done?;
    Ok(EndToEnd {
        figure: Figure {
            backend: if backend == BackendChoice::Gpu {
                "gpu"
            } else {
                "cpu"
            },
            what: format!(
                "dequantize {tensors} x {rows}x{cols} int4 g{group}{} -> bf16",
                if shards > 1 {
                    format!(", {shards} shards")
                } else {
                    String::new()
                }
            ),
            baseline: "writing the same bytes".into(),
            bytes,
            seconds,
            baseline_seconds: baseline,
            m: None,
            baseline_bytes: None,
            dispatch_seconds: None,
        },
        input_bytes,
        peak_rss: peak,
    })
}

impl std::str::FromStr for Shape {
    type Err = Error;
    fn from_str(s: &str) -> Result<Shape> {
        match s {
            "square" => Ok(Shape::Square),
            "moe" => Ok(Shape::Moe),
            "one-tensor" => Ok(Shape::OneTensor),
            _ => Err(Error::bare(
                Rule::Argument,
                format!("--e2e-shape: {s:?} is not one of square, moe, one-tensor"),
            )),
        }
    }
}

/// What `bench` measures.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Rows of the kernel benchmarks' weight.
    pub rows: usize,
    /// Its columns (a multiple of 128).
    pub cols: usize,
    /// Runs of each measurement; the best is kept.
    pub runs: usize,
    /// Also `dequantize` a generated checkpoint of this many GB of bf16
    /// output, of this shape, in this existing directory.
    pub e2e: Option<(f64, Shape, std::path::PathBuf)>,
    /// `cpu`, `gpu` (any adapter), or `auto` (the CPU, and the GPU
    /// `dequantize --backend auto` would run on, if any).
    pub backend: BackendChoice,
    /// Only the kernel cases whose name contains this ("" for all).
    pub only: String,
    /// Products with packed weights (`--gemv`) instead of decoding.
    pub gemv: Option<Gemv>,
}

/// What `bench --gemv` measures.
#[derive(Debug, Clone)]
pub struct Gemv {
    /// `[out, in]` shapes ([`GEMV_SHAPES`] by default).
    pub shapes: Vec<(usize, usize)>,
    /// Rows of x ([`GEMV_MS`] by default).
    pub ms: Vec<usize>,
}

/// What `bench` reports, in order.
pub enum Line {
    /// A measurement against its baseline.
    Figure(Figure),
    /// An end-to-end measurement, with its input size and peak memory.
    EndToEnd(EndToEnd, &'static str),
    /// A remark for people (what was not measured, on which adapter).
    Say(String),
}

/// Runs the benchmarks `settings` asks for, telling `show` each result.
pub fn run(settings: &Settings, mut show: impl FnMut(Line)) -> Result<()> {
    let Settings {
        rows,
        cols,
        runs,
        backend,
        ..
    } = *settings;
    if rows == 0 || cols == 0 || !cols.is_multiple_of(128) {
        return Err(Error::bare(
            Rule::Argument,
            "--cols: rows must be positive and cols a positive multiple of 128",
        ));
    }
    if let Some((_, _, dir)) = &settings.e2e {
        if !dir.is_dir() {
            return Err(Error::new(
                Rule::Argument,
                dir,
                "--dir is not an existing directory",
            ));
        }
    }
    // The GPU measured: the one `--backend` selects (under `auto`, only a
    // GPU `dequantize` would run on).
    let gpu = match backend {
        BackendChoice::Cpu => None,
        choice => {
            let (b, note) = select(choice)?;
            if b.gpu().is_none() {
                let why = note.unwrap_or_default();
                show(Line::Say(format!(
                    "gpu: not measured: {why} (--backend gpu measures any adapter)"
                )));
                None
            } else {
                Some(b)
            }
        }
    };
    if let Some(gemv) = &settings.gemv {
        match gpu.as_ref().and_then(|b| Some((b, b.gpu()?))) {
            Some((b, decoder)) => {
                show(Line::Say(b.name()));
                gpu_gemv(
                    decoder,
                    (&gemv.shapes, &gemv.ms),
                    (runs, &settings.only),
                    |f| show(Line::Figure(f)),
                )?;
            }
            None => show(Line::Say(
                "gemv: not measured: products run on a GPU (--backend gpu measures any adapter)"
                    .into(),
            )),
        }
        return Ok(());
    }
    if backend != BackendChoice::Gpu {
        cpu_kernels(rows, cols, runs, &settings.only)?
            .into_iter()
            .for_each(|f| show(Line::Figure(f)));
        if cols.is_multiple_of(256) {
            gguf::cpu(rows, cols, runs, &settings.only)?
                .into_iter()
                .for_each(|f| show(Line::Figure(f)));
        }
    }
    if let Some((b, decoder)) = gpu.as_ref().and_then(|b| Some((b, b.gpu()?))) {
        show(Line::Say(b.name()));
        gpu_kernels(decoder, rows, cols, runs, &settings.only)?
            .into_iter()
            .for_each(|f| show(Line::Figure(f)));
    }
    if let Some((gb, shape, dir)) = &settings.e2e {
        let mut backends = Vec::new();
        if backend != BackendChoice::Gpu {
            backends.push((BackendChoice::Cpu, "cpu"));
        }
        if gpu.is_some() {
            backends.push((BackendChoice::Gpu, "gpu"));
        }
        for (b, label) in backends {
            show(Line::EndToEnd(
                end_to_end(dir, *gb, *shape, runs, b)?,
                label,
            ));
        }
    }
    Ok(())
}

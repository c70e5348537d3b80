//! The cases the kernels are measured on: each format's layout over random
//! storage, and the decode job that reads it.

use crate::job::{e2m1, e4m3, e8m0, DecodeJob, Dims, Fields, Grid, ValueKind, Values, ZeroPoint};
use crate::numerics::OutDtype;

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

    pub(super) fn name(self) -> &'static str {
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
    pub(super) layout: Layout,
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
                let nested = crate::job::Nested::blockwise(
                    table,
                    vec![0.0625f32; (rows * cols / 64).div_ceil(256)].into(),
                    256,
                    0.125,
                );
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
            fields: Fields::dense(self.zero.as_slice(), 4, 32)
                .with_word_bits(32 * (cols / 128) as u64),
        });
        let codes = Fields::dense(self.codes.as_slice(), bits, (cols * bits as usize) as u64);
        // bitsandbytes' bytes hold their first code in the high nibble.
        let codes = if self.layout == Layout::BnbNf4 {
            codes.high_first()
        } else {
            codes
        };
        DecodeJob {
            dims: Dims {
                slices: 1,
                rows,
                cols,
            },
            codes,
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
            codebook: None,
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
pub(super) fn case_name(layout: Layout, out: OutDtype) -> String {
    format!("{} -> {out}", layout.name())
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

    pub(super) fn name(self) -> &'static str {
        match self {
            InputPacked::AwqGemm => "autoawq gemm int4 g128",
            InputPacked::GptOss => "gpt-oss mxfp4 experts",
            InputPacked::Gptq => "gptq int4 g128",
        }
    }

    /// Random storage for a `rows × cols` output (`rows` a multiple of 128,
    /// `cols` of 128): (codes, scales, zero points).
    pub(super) fn storage(self, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
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
    pub(super) fn job<'a>(
        self,
        (rows, cols): (usize, usize),
        (codes, scale, zero): &'a (Vec<u8>, Vec<u8>, Vec<u8>),
        out: OutDtype,
    ) -> DecodeJob<'a> {
        let int4 = (0..16).map(|c| c as f32 - 8.0).collect::<Vec<f32>>();
        // The stored scales of `kind` on the grid `(row_div, col_div)`,
        // `(row_stride, slice_stride)`.
        let scales = |kind, (row_div, col_div), (row_stride, slice_stride)| Values {
            data: scale.as_slice().into(),
            kind,
            grid: Grid {
                row_div,
                col_div,
                row_stride,
                slice_stride,
            },
        };
        match self {
            InputPacked::AwqGemm => {
                // Stored [in, out]: `cols` rows of `rows` columns.
                let stored = Dims {
                    slices: 1,
                    rows: cols,
                    cols: rows,
                };
                let lane = (rows / 8) as u64 * 32;
                let scale = scales(ValueKind::F16, (128, 1), (rows, 0));
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
                let scale = scales(table(e8m0), (1, 32), (inputs / 32, cols * inputs / 32));
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
                let scale = scales(ValueKind::F16, (1, 128), (cols / 128, 0));
                DecodeJob::new(dims, codes, int4, out).with_scale(scale)
            }
        }
    }
}

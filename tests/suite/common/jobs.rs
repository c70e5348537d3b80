//! Random [`DecodeJob`]s over random storage: every num_bits, dense and
//! padded layouts, int32-packed and byte-granular rows, scale kinds (Table
//! included) on tensor / row / group / block grids, packed and plain zero
//! points (along rows or columns), g_idx, 3-D, AutoAWQ's interleaved words,
//! transposed outputs, every output dtype. Backends are checked against each
//! other (or against `DecodeJob::value`) on them.
#![allow(dead_code)]

use wgpu_dequant::job::{
    e2m1, e4m3, DecodeJob, Dims, Fields, Grid, InBlocks, Nested, Parts, Plane, Product, ValueKind,
    Values, ZeroPoint,
};
use wgpu_dequant::OutDtype;

use super::Rng;

/// Group and block sizes the random grids draw from.
#[derive(Clone, Copy, Debug)]
pub struct GridSizes {
    /// Columns per group of group-wise grids.
    pub groups: &'static [usize],
    /// Rows per block of block-wise grids.
    pub block_rows: &'static [usize],
    /// Columns per block of block-wise grids.
    pub block_cols: &'static [usize],
}

/// The sizes the GPU tests have always used.
pub const GRID_SIZES: GridSizes = GridSizes {
    groups: &[1, 3, 8, 16, 32, 128],
    block_rows: &[1, 2, 5, 16],
    block_cols: &[1, 4, 7, 32],
};

/// Runs `check` on `cases` random jobs, each made from shapes and a seed
/// that proptest draws: when one fails, proptest shrinks its shape towards
/// one row and one column (and its seed towards 0) and reports the smallest
/// job that still fails. The draw is the same on every run. `max_cols` are
/// the column limits to draw from (wide rows for the CPU tables).
pub fn for_random_jobs(cases: u32, max_cols: &'static [usize], check: impl Fn(Dims, &mut Rng)) {
    use proptest::prelude::{any, Strategy};
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let dims =
        proptest::sample::select(max_cols).prop_flat_map(|max| (1..=3usize, 1..=40usize, 1..=max));
    let result = runner.run(&(dims, any::<u64>()), |((slices, rows, cols), seed)| {
        check(Dims { slices, rows, cols }, &mut Rng::new(seed));
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// A normal f32 of moderate magnitude (no subnormals: GPUs may flush them).
pub fn normal(rng: &mut Rng, spread: i32) -> f32 {
    let e = rng.below((2 * spread + 1) as u64) as i32 - spread;
    let m = 1.0 + rng.below(1 << 20) as f32 / (1 << 20) as f32;
    let s = if rng.below(2) == 0 { 1.0 } else { -1.0 };
    s * m * 2f32.powi(e)
}

/// Random values of `bits`-bit codes: offset or two's-complement integers,
/// the minifloats (E2M1 for FP4, E4M3 for FP8; NaN included), or normals.
pub fn code_values(rng: &mut Rng, bits: u32) -> Vec<f32> {
    let offset = 1i32 << (bits - 1);
    match rng.below(4) {
        0 => (0..1 << bits).map(|c| (c - offset) as f32).collect(),
        1 => (0..1 << bits)
            .map(|c| if c >= offset { c - 2 * offset } else { c } as f32)
            .collect(),
        2 if bits == 4 => (0..16).map(e2m1).collect(),
        2 => (0..=255).map(e4m3).collect(),
        _ => (0..1 << bits).map(|_| normal(rng, 6)).collect(),
    }
}

pub fn value_bytes(rng: &mut Rng, kind: &ValueKind, n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|_| -> Vec<u8> {
            match kind {
                ValueKind::Bf16 => ((normal(rng, 12).to_bits() >> 16) as u16)
                    .to_le_bytes()
                    .to_vec(),
                ValueKind::F16 => half::f16::from_f32(normal(rng, 12))
                    .to_bits()
                    .to_le_bytes()
                    .to_vec(),
                ValueKind::F32 => normal(rng, 12).to_le_bytes().to_vec(),
                ValueKind::I8 | ValueKind::Table(_) | ValueKind::Nested(_) => {
                    vec![rng.next() as u8]
                }
                ValueKind::I32 => (rng.below(300) as i32 - 150).to_le_bytes().to_vec(),
            }
        })
        .collect()
}

pub fn random_kind(rng: &mut Rng, allow_int: bool) -> ValueKind {
    match rng.below(if allow_int { 6 } else { 5 }) {
        0 => ValueKind::Bf16,
        1 => ValueKind::F16,
        2 => ValueKind::F32,
        3 => {
            let mut t = Box::new([0f32; 256]);
            // Half of them MX's e8m0 (2^(b - 127), 2^-127 subnormal, 255
            // NaN), which the fast kernels compute instead of reading.
            let e8m0 = rng.below(2) == 0;
            for (b, v) in t.iter_mut().enumerate() {
                *v = match b {
                    _ if !e8m0 => normal(rng, 10),
                    0 => f32::from_bits(1 << 22),
                    255 => f32::NAN,
                    _ => f32::from_bits((b as u32) << 23),
                };
            }
            ValueKind::Table(t)
        }
        // Scales quantized themselves (bitsandbytes' double quant): enough
        // outer factors for any grid the random jobs draw (< 2^18 entries).
        4 if !allow_int => {
            let mut table = [0f32; 256];
            for v in table.iter_mut() {
                *v = normal(rng, 6);
            }
            if rng.below(2) == 0 {
                // SINQ's quantAux: the bytes a [tile, cycle] matrix, a
                // factor and an addend a column, each step rounded to a
                // 16-bit dtype (or f32).
                let cycle = [1usize, 2, 7, 64][rng.below(4) as usize];
                let outer: Vec<f32> = (0..cycle).map(|_| normal(rng, 4)).collect();
                let adds: Vec<f32> = (0..cycle).map(|_| normal(rng, 6)).collect();
                let round = [OutDtype::F32, OutDtype::Bf16, OutDtype::F16][rng.below(3) as usize];
                for (b, v) in table.iter_mut().enumerate() {
                    *v = b as f32;
                }
                return ValueKind::Nested(Box::new(Nested {
                    table,
                    outer: outer.into(),
                    per_outer: 1,
                    offset: 0.0,
                    cycle,
                    adds: adds.into(),
                    round,
                }));
            }
            let per_outer = [64usize, 256][rng.below(2) as usize];
            let outer: Vec<f32> = (0..(1 << 18) / per_outer).map(|_| normal(rng, 4)).collect();
            ValueKind::Nested(Box::new(Nested::blockwise(
                table,
                outer.into(),
                per_outer,
                normal(rng, 6),
            )))
        }
        4 => ValueKind::I8,
        _ => ValueKind::I32,
    }
}

/// A random scale/zero grid for `dims`: (grid, entries, groups per row).
pub fn random_grid(rng: &mut Rng, d: Dims, sizes: &GridSizes) -> (Grid, usize, usize) {
    let pick = |rng: &mut Rng, from: &[usize]| from[rng.below(from.len() as u64) as usize];
    match rng.below(4) {
        0 => (
            Grid {
                row_div: 1,
                col_div: d.cols,
                row_stride: 0,
                slice_stride: 0,
            },
            1,
            1,
        ),
        1 => (
            Grid {
                row_div: 1,
                col_div: d.cols,
                row_stride: 1,
                slice_stride: d.rows,
            },
            d.slices * d.rows,
            1,
        ),
        2 => {
            let g = pick(rng, sizes.groups);
            let ng = d.cols.div_ceil(g);
            (
                Grid {
                    row_div: 1,
                    col_div: g,
                    row_stride: ng,
                    slice_stride: d.rows * ng,
                },
                d.slices * d.rows * ng,
                ng,
            )
        }
        _ => {
            let (bh, bw) = (pick(rng, sizes.block_rows), pick(rng, sizes.block_cols));
            let (nr, nc) = (d.rows.div_ceil(bh), d.cols.div_ceil(bw));
            (
                Grid {
                    row_div: bh,
                    col_div: bw,
                    row_stride: nc,
                    slice_stride: nr * nc,
                },
                d.slices * nr * nc,
                nc,
            )
        }
    }
}

/// Sizes whose groups hold whole 32-bit words of 4- or 8-bit codes: what the
/// GPU's fast kernels take.
pub const WHOLE_WORD_SIZES: GridSizes = GridSizes {
    groups: &[8, 16, 32, 64, 128],
    block_rows: &[1, 2, 5, 16],
    block_cols: &[8, 16, 32],
};

/// How a random job's zero point is stored.
#[derive(Debug, Clone)]
pub enum ZeroSpec {
    None,
    /// Packed along rows: `zrows` words per lane, one lane per group.
    Packed {
        zrows: usize,
        groups: usize,
    },
    /// One stored value per grid entry.
    Plain {
        kind: ValueKind,
        grid: Grid,
    },
    /// Packed along columns: `lanes` lanes (row groups) of `lane_bits`.
    AlongCols {
        lanes: usize,
        lane_bits: u64,
    },
}

/// The storage of one random job and everything needed to describe it;
/// [`RandomJob::job`] is the job, borrowing the storage.
pub struct RandomJob {
    pub dims: Dims,
    pub bits: u32,
    pub padded: bool,
    pub per_word: u32,
    pub interleaved: bool,
    pub transposed: bool,
    pub lane_bits: u64,
    /// Bits from one code word of a lane to the next (32: contiguous).
    pub word_bits: u64,
    pub slice_bits: u64,
    pub codes: Vec<u8>,
    pub code_values: Vec<f32>,
    pub scale: Option<(Grid, ValueKind)>,
    pub scale_bytes: Vec<u8>,
    /// 0: none, 1: packed, 2: plain.
    pub zero_mode: u64,
    pub zero: ZeroSpec,
    pub zero_bytes: Vec<u8>,
    pub g_idx: Option<Vec<u32>>,
    /// Bytes hold their fields from the high bits down (bitsandbytes).
    pub high_first: bool,
    /// A factor every value is multiplied by last (LLM.int8's 1/127).
    pub post_scale: Option<f32>,
    /// The plain zero point's values are the job's offset instead
    /// (`DecodeJob::offset`, added last).
    pub offset: bool,
    /// The arithmetic of the scaled value (ModelOpt FP8, compressed-tensors mxfp8).
    pub product: Product,
    pub out: OutDtype,
    /// The codes lie inside blocks (GGUF's).
    pub blocks: Option<InBlocks>,
    /// The lanes come in parts sharing their words (hqq's `3bit_32`).
    pub parts: Option<Parts>,
}

impl RandomJob {
    /// Random storage for a job of size `d`, drawing grids from `sizes`.
    pub fn new(rng: &mut Rng, d: Dims, sizes: &GridSizes) -> RandomJob {
        let bits = 1 + rng.below(8) as u32;
        // AutoAWQ's order interleaves the fields of padded words.
        let interleaved = rng.below(5) == 0 && (32 / bits).is_multiple_of(2);
        let padded = interleaved || rng.below(2) == 1 && 32 % bits != 0;
        let per_word = if padded { 32 / bits } else { 0 };
        // Int32-packed rows, or byte-granular rows (FP4 / int8 style, unaligned lanes).
        let lane_bits = if padded || rng.below(2) == 0 {
            let words = if padded {
                d.cols.div_ceil(per_word as usize)
            } else {
                (d.cols * bits as usize).div_ceil(32)
            };
            words as u64 * 32
        } else {
            (d.cols * bits as usize).div_ceil(8) as u64 * 8
        };
        let slice_bits = d.rows as u64 * lane_bits;
        let code_len = (d.slices as u64 * slice_bits).div_ceil(8) as usize + 4;
        let codes: Vec<u8> = (0..code_len).map(|_| rng.next() as u8).collect();
        let mut code_values: Vec<f32> = (0..1 << bits).map(|_| normal(rng, 6)).collect();
        code_values[0] = -0.0;
        if bits >= 3 && rng.below(4) == 0 {
            code_values[1] = f32::NAN;
        }

        let scale = if rng.below(6) == 0 {
            None
        } else {
            Some(random_grid(rng, d, sizes))
        };
        let scale_kind = random_kind(rng, false);
        let mut scale_bytes = Vec::new();
        if let Some((_, n, _)) = &scale {
            scale_bytes = value_bytes(rng, &scale_kind, *n);
        }
        let groups = scale.as_ref().map_or(1, |s| s.2);
        let zero_mode = rng.below(4);
        let mut zero_bytes = Vec::new();
        let zero = match zero_mode {
            1 => {
                // Packed along rows: lane = group, words `groups` apart.
                let zrows = if padded {
                    d.rows.div_ceil(per_word as usize)
                } else {
                    (d.rows * bits as usize).div_ceil(32)
                };
                zero_bytes = (0..d.slices * zrows * groups * 4)
                    .map(|_| rng.next() as u8)
                    .collect();
                ZeroSpec::Packed { zrows, groups }
            }
            2 => {
                // A plain zero point sits on the scale's grid (as in every format).
                let (grid, n, _) = match &scale {
                    Some(s) => *s,
                    None => random_grid(rng, d, sizes),
                };
                let kind = random_kind(rng, true);
                zero_bytes = value_bytes(rng, &kind, n);
                ZeroSpec::Plain { kind, grid }
            }
            3 => {
                // Packed along columns: lane = row group of the scale grid.
                let row_div = scale.as_ref().map_or(d.rows, |s| s.0.row_div);
                let lanes = d.rows.div_ceil(row_div.max(1));
                let words = if padded {
                    d.cols.div_ceil(per_word as usize)
                } else {
                    (d.cols * bits as usize).div_ceil(32)
                };
                let lane_bits = words as u64 * 32;
                zero_bytes = (0..d.slices * lanes * words * 4)
                    .map(|_| rng.next() as u8)
                    .collect();
                ZeroSpec::AlongCols { lanes, lane_bits }
            }
            _ => ZeroSpec::None,
        };
        let g_idx = match &scale {
            Some((g, _, ng))
                if g.row_div == 1 && g.row_stride > 1 && d.slices == 1 && rng.below(3) == 0 =>
            {
                Some(
                    (0..d.cols)
                        .map(|_| rng.below(*ng as u64) as u32)
                        .collect::<Vec<u32>>(),
                )
            }
            _ => None,
        };
        let out = [OutDtype::Bf16, OutDtype::F16, OutDtype::F32][rng.below(3) as usize];
        let high_first = !padded && 8 % bits == 0 && rng.below(3) == 0;
        let post_scale = (rng.below(5) == 0).then(|| normal(rng, 4));
        let product =
            [Product::F32, Product::F32, Product::OutDtype, Product::Bf16][rng.below(4) as usize];
        let offset = matches!(zero, ZeroSpec::Plain { .. }) && rng.below(3) == 0;
        RandomJob {
            dims: d,
            bits,
            padded,
            per_word,
            interleaved,
            transposed: rng.below(4) == 0,
            lane_bits,
            word_bits: 32,
            slice_bits,
            codes,
            code_values,
            scale: scale.map(|(grid, _, _)| (grid, scale_kind)),
            scale_bytes,
            zero_mode,
            zero,
            zero_bytes,
            g_idx,
            high_first,
            post_scale,
            offset,
            product,
            out,
            blocks: None,
            parts: None,
        }
    }

    /// A random job whose lanes come in parts that share their words
    /// ([`Parts`]: hqq's and sinq's `3bit_32`): one field a 32-bit word,
    /// part k at bit `top − k·down` of it, parts as far apart as their
    /// fields or further, the last holding fewer lanes or none; scales,
    /// plain zero points or an offset, g_idx and outputs as [`RandomJob::new`]
    /// draws them.
    pub fn in_parts(rng: &mut Rng, d: Dims, sizes: &GridSizes) -> RandomJob {
        let r = RandomJob::new(rng, d, sizes);
        let down = r.bits + rng.below(3) as u32;
        let count = 1 + rng.below(((32 - r.bits) / down + 1) as u64) as usize;
        let parts = Parts {
            lanes: d.rows.div_ceil(count) + rng.below(2) as usize,
            top: ((count - 1) * down as usize) as u64,
            down: down as u64,
        };
        let lane_bits = d.cols as u64 * 32;
        let slice_bits = parts.lanes as u64 * lane_bits;
        let code_len = (d.slices as u64 * slice_bits).div_ceil(8) as usize + 4;
        // Packed zero points follow the codes' layout, which this is not.
        let (zero, zero_mode) = match r.zero {
            ZeroSpec::Packed { .. } | ZeroSpec::AlongCols { .. } => (ZeroSpec::None, 0),
            zero => (zero, r.zero_mode),
        };
        RandomJob {
            padded: true,
            per_word: 1,
            interleaved: false,
            high_first: false,
            lane_bits,
            word_bits: 32,
            slice_bits,
            codes: (0..code_len).map(|_| rng.next() as u8).collect(),
            zero,
            zero_mode,
            parts: Some(parts),
            ..r
        }
    }

    /// A random job whose codes lie inside blocks ([`InBlocks`], GGUF's):
    /// blocks of 8 to 256 fields (or a length the CPU's gather does not
    /// take), one plane of 1, 2, 4 or 8 bits or two of them, in runs of any
    /// span, after a header and before a tail; lanes padded or not; offset
    /// or two's-complement integer code values (the CPU's direct values) or
    /// others; scales on any grid, plain zero points or an offset.
    pub fn aimed_at_blocks(rng: &mut Rng, d: Dims) -> RandomJob {
        let r = RandomJob::new(rng, d, &GRID_SIZES);
        let low_bits = [1u32, 2, 4, 8][rng.below(4) as usize];
        let high_bits = [0u32, 1, 2, 4][rng.below(4) as usize].min(8 - low_bits);
        let len = [8u32, 16, 32, 64, 256, 12][rng.below(6) as usize];
        let span = |rng: &mut Rng| 1u32 << rng.below(len.ilog2() as u64 + 1);
        // One past the last byte a plane's fields fill.
        let end = |p: &Plane| p.at + len.div_ceil(8 / p.bits * p.span) * p.span;
        let low = Plane {
            at: rng.below(5) as u32,
            bits: low_bits,
            span: span(rng),
        };
        let high = (high_bits > 0).then(|| Plane {
            at: end(&low) + rng.below(3) as u32,
            bits: high_bits,
            span: span(rng),
        });
        let bytes = high.as_ref().map_or(end(&low), end) + rng.below(4) as u32;
        let blocks = InBlocks {
            len,
            bytes,
            low,
            high,
        };
        let bits = blocks.bits();
        let lane_bytes = d.cols.div_ceil(len as usize) * bytes as usize + rng.below(3) as usize;
        let (lane_bits, slice_bits) = (lane_bytes as u64 * 8, (d.rows * lane_bytes) as u64 * 8);
        let code_len = d.slices * d.rows * lane_bytes + 4;
        let code_values = match rng.below(3) {
            0 => (0..1 << bits).map(|_| normal(rng, 6)).collect(),
            _ => code_values(rng, bits),
        };
        let (zero, offset) = match r.zero {
            ZeroSpec::Plain { .. } => (r.zero, rng.below(2) == 0),
            _ => (ZeroSpec::None, false),
        };
        RandomJob {
            bits,
            padded: false,
            per_word: 0,
            interleaved: false,
            transposed: false,
            lane_bits,
            word_bits: 32,
            slice_bits,
            codes: (0..code_len).map(|_| rng.next() as u8).collect(),
            code_values,
            zero_mode: if matches!(zero, ZeroSpec::None) { 0 } else { 2 },
            zero,
            offset,
            g_idx: None,
            high_first: false,
            blocks: Some(blocks),
            ..r
        }
    }

    /// A random job of the kinds the GPU's fast kernels take when
    /// [`RandomJob::fast_eligible`]: 4- or 8-bit codes in a dense stream
    /// (rows word-aligned, byte-aligned or neither), integer, two's
    /// complement or table code values, every scale and zero-point kind
    /// (or an offset) on grids of whole words, every output dtype, odd
    /// column counts included.
    pub fn aimed_at_fast_kernels(rng: &mut Rng, d: Dims) -> RandomJob {
        let mut r = RandomJob::new(rng, d, &WHOLE_WORD_SIZES);
        let bits = [4u32, 8][rng.below(2) as usize];
        let row_bits = d.cols as u64 * bits as u64;
        let lane_bits = match rng.below(3) {
            0 => row_bits.div_ceil(32) * 32,
            1 => row_bits.div_ceil(8) * 8,
            _ => row_bits,
        };
        let slice_bits = d.rows as u64 * lane_bits;
        let code_len = (d.slices as u64 * slice_bits).div_ceil(8) as usize + 4;
        let code_values = code_values(rng, bits);
        let groups = match &r.zero {
            ZeroSpec::Packed { groups, .. } => *groups,
            _ => 0,
        };
        if groups > 0 {
            let zrows = (d.rows * bits as usize).div_ceil(32);
            r.zero_bytes = (0..d.slices * zrows * groups * 4)
                .map(|_| rng.next() as u8)
                .collect();
            r.zero = ZeroSpec::Packed { zrows, groups };
        }
        if matches!(r.zero, ZeroSpec::AlongCols { .. }) {
            r.zero = ZeroSpec::None;
        }
        RandomJob {
            bits,
            padded: false,
            per_word: 0,
            interleaved: false,
            transposed: false,
            lane_bits,
            slice_bits,
            codes: (0..code_len).map(|_| rng.next() as u8).collect(),
            code_values,
            g_idx: None,
            high_first: rng.below(3) == 0,
            ..r
        }
    }

    /// A random job of the kinds the GPU's tile kernel takes when
    /// [`RandomJob::tile_eligible`]: 4- or 8-bit codes packed along the input
    /// dimension, either transposed (stored rows of whole words, dense or
    /// padded, AutoAWQ's order included; stored columns mostly whole words)
    /// or strided (lanes one word apart, a lane's words `rows` words apart,
    /// as GPTQ's `[in·b/32, out]`), with every scale kind on any grid, g_idx,
    /// zero points plain or packed along columns, and every output dtype.
    pub fn aimed_at_tile_kernel(rng: &mut Rng, d: Dims, sizes: &GridSizes) -> RandomJob {
        let bits = [4u32, 8][rng.below(2) as usize];
        let per = (32 / bits) as usize;
        let strided = rng.below(2) == 0;
        let mut d = d;
        if !strided && rng.below(4) != 0 {
            d.cols = d.cols.next_multiple_of(per);
        }
        let mut r = RandomJob::new(rng, d, sizes);
        // Now and then row groups of whole transposed runs (32 stored rows,
        // layout::Tile::geometry), whose words share their scale and zero
        // point lookups in the tile kernel, as AutoAWQ's groups of 128 do.
        if !strided && rng.below(3) == 0 {
            if let Some((grid, _)) = &mut r.scale {
                grid.row_div *= 32;
            }
            if let ZeroSpec::Plain { grid, .. } = &mut r.zero {
                grid.row_div *= 32;
            }
        }
        let padded = rng.below(2) == 0;
        let per_word = if padded { per as u32 } else { 0 };
        let interleaved = padded && rng.below(2) == 0;
        let words = d.cols.div_ceil(per);
        // Strided words of one lane `rows` words apart, or more (one row of
        // padding: a single row's words are still strided).
        let spaced = d.rows + usize::from(d.rows == 1 || rng.below(3) == 0);
        let (lane_bits, word_bits, slice_bits) = if strided {
            (32, 32 * spaced as u64, (spaced * words) as u64 * 32)
        } else {
            (words as u64 * 32, 32, (d.rows * words) as u64 * 32)
        };
        let code_len = (d.slices as u64 * slice_bits).div_ceil(8) as usize + 4;
        let code_values = code_values(rng, bits);
        let (zero, zero_bytes) = match r.zero {
            ZeroSpec::AlongCols { lanes, .. } => {
                let bytes = (0..d.slices * lanes * words * 4)
                    .map(|_| rng.next() as u8)
                    .collect();
                let lane_bits = words as u64 * 32;
                (ZeroSpec::AlongCols { lanes, lane_bits }, bytes)
            }
            ZeroSpec::Packed { .. } => (ZeroSpec::None, Vec::new()),
            zero => (zero, r.zero_bytes),
        };
        RandomJob {
            bits,
            padded,
            per_word,
            interleaved,
            transposed: !strided,
            lane_bits,
            word_bits,
            slice_bits,
            codes: (0..code_len).map(|_| rng.next() as u8).collect(),
            code_values,
            zero,
            zero_bytes,
            // None is a tile kernel job.
            high_first: false,
            post_scale: None,
            offset: false,
            product: Default::default(),
            ..r
        }
    }

    /// True when the GPU takes a job [`RandomJob::aimed_at_tile_kernel`]
    /// makes to the tile kernel: transposed ones whose stored columns are
    /// whole words, and (16-bit outputs) an even output column count.
    pub fn tile_eligible(&self) -> bool {
        let per = (32 / self.bits) as usize;
        let out_cols = if self.transposed {
            self.dims.rows
        } else {
            self.dims.cols
        };
        (!self.transposed || self.dims.cols.is_multiple_of(per))
            && (self.out == OutDtype::F32 || out_cols.is_multiple_of(2))
    }

    /// True when the GPU takes this job to a fast kernel: always for jobs
    /// [`RandomJob::aimed_at_fast_kernels`] makes, except 16-bit outputs of
    /// an odd number of columns (an output word would span two rows).
    pub fn fast_eligible(&self) -> bool {
        self.out == OutDtype::F32 || self.dims.cols.is_multiple_of(2)
    }

    /// The job over this storage (`dims` are the stored ones; a transposed
    /// job writes their transpose).
    pub fn job(&self) -> DecodeJob<'_> {
        let job = DecodeJob {
            dims: self.dims,
            codes: Fields {
                data: (&self.codes[..]).into(),
                bits: self.bits,
                per_word: self.per_word,
                interleaved: self.interleaved,
                lane_bits: self.lane_bits,
                word_bits: self.word_bits,
                slice_bits: self.slice_bits,
                high_first: self.high_first,
                blocks: self.blocks,
                parts: self.parts,
            },
            code_values: self.code_values.clone().into(),
            zero: match &self.zero {
                _ if self.offset => None,
                ZeroSpec::Packed { zrows, groups } => Some(ZeroPoint::Packed {
                    fields: Fields {
                        data: (&self.zero_bytes[..]).into(),
                        bits: self.bits,
                        per_word: self.per_word,
                        interleaved: self.interleaved,
                        lane_bits: 32,
                        word_bits: 32 * *groups as u64,
                        slice_bits: (zrows * groups) as u64 * 32,
                        high_first: false,
                        blocks: None,
                        parts: None,
                    },
                }),
                ZeroSpec::Plain { kind, grid } => Some(ZeroPoint::Plain(Values {
                    data: (&self.zero_bytes[..]).into(),
                    kind: kind.clone(),
                    grid: *grid,
                })),
                ZeroSpec::AlongCols { lanes, lane_bits } => Some(ZeroPoint::PackedAlongCols {
                    fields: Fields {
                        data: (&self.zero_bytes[..]).into(),
                        bits: self.bits,
                        per_word: self.per_word,
                        interleaved: self.interleaved,
                        lane_bits: *lane_bits,
                        word_bits: 32,
                        slice_bits: *lanes as u64 * lane_bits,
                        high_first: false,
                        blocks: None,
                        parts: None,
                    },
                }),
                ZeroSpec::None => None,
            },
            scale: self.scale.as_ref().map(|(grid, kind)| Values {
                data: (&self.scale_bytes[..]).into(),
                kind: kind.clone(),
                grid: *grid,
            }),
            g_idx: self.g_idx.clone(),
            low_rank: None,
            post_scale: self.post_scale,
            offset: match &self.zero {
                ZeroSpec::Plain { kind, grid } if self.offset => Some(Values {
                    data: (&self.zero_bytes[..]).into(),
                    kind: kind.clone(),
                    grid: *grid,
                }),
                _ => None,
            },
            product: self.product,
            sparse: None,
            transposed: false,
            out: self.out,
            codebook: None,
        };
        if self.transposed {
            job.transpose()
        } else {
            job
        }
    }

    /// One line for failure messages.
    pub fn describe(&self) -> String {
        let kind = |k: &ValueKind| match k {
            ValueKind::Table(_) => "Table".to_string(),
            ValueKind::Nested(_) => "Nested".to_string(),
            k => format!("{k:?}"),
        };
        format!(
            "{:?}{} bits {} padded {}{}{} lane_bits {} word_bits {} scale {:?} {} {} g_idx {} post {:?} product {:?} out {} blocks {:?} parts {:?}",
            self.dims,
            if self.transposed { " transposed" } else { "" },
            self.bits,
            self.padded,
            if self.interleaved { " interleaved" } else { "" },
            if self.high_first { " high-first" } else { "" },
            self.lane_bits,
            self.word_bits,
            self.scale.as_ref().map(|(g, k)| (g, kind(k))),
            if self.offset { "offset" } else { "zero" },
            match &self.zero {
                ZeroSpec::None => "none".to_string(),
                ZeroSpec::Packed { zrows, groups } => format!("packed {zrows}x{groups}"),
                ZeroSpec::Plain { kind: k, grid } => format!("plain {} {grid:?}", kind(k)),
                ZeroSpec::AlongCols { lanes, .. } => format!("along columns, {lanes} lanes"),
            },
            self.g_idx.is_some(),
            self.post_scale,
            self.product,
            self.out,
            self.blocks,
            self.parts
        )
    }
}

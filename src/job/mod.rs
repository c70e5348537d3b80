//! The format-free description of one dense output tensor.
//!
//! Every format maps onto the same description: a stream of b-bit codes, a
//! table giving each code's value, an optional zero point and scale looked up
//! on a (row group, column group) grid, and the output dtype. The value of
//! element (slice, row, col) is
//!
//! ```text
//! round_to_out( (code_values[code] − zero) · scale + offset )
//! ```
//!
//! computed in f32 (the offset, a value per group added last, is MLX's
//! affine bias; with a [`Product`] in the output dtype the product is
//! rounded to it before the offset is added, as MLX computes `T(T(s·q) + b)`). SVDQuant jobs add a low-rank branch and a smoothing
//! divisor ([`LowRank`]). Backends execute exactly this; the accessors below
//! are the reference semantics the CPU backend runs and the shaders mirror.
//!
//! Words, one per concept: a *job* describes one whole tensor; a *chunk* is a
//! range of a job's rows a backend decodes at once; a *lane* is one run of
//! fields in a stream; a *row group* and a *column group* are the rows and the
//! columns that share one scale or zero-point *entry* (a block's rows and
//! columns for block scales); an *element* is one output value.
//!
//! The pieces, one file each: the code streams (`fields`), the scales and
//! zero points on their grid (`values`), sparse bitmasks (`sparse`),
//! SVDQuant's branch (`low_rank`), and the bound that keeps subnormals off
//! a GPU (`normal`); the job itself and its reference semantics here.

use std::ops::Deref;
use std::sync::Arc;

use crate::checkpoint::TensorRef;
use crate::numerics::OutDtype;
/// The values of the formats' minifloat codes, for building `code_values`
/// and scale tables: E2M1 (FP4), FP8 E4M3 (fn), E8M0.
pub use crate::numerics::{e2m1, e4m3, e8m0};

mod codebook;
mod fields;
mod low_rank;
mod normal;
mod sparse;
mod values;

pub use codebook::{bf16_ties_away, Codebook, Fault, Region, Sum, Term, MAX_INDEX_BITS, MAX_TERMS};
use fields::div;
#[cfg(test)]
pub(crate) use fields::AWQ_SLOT;
pub(crate) use fields::{awq_transposed, gcd};
pub use fields::{Fields, InBlocks, Parts, Plane};
pub use low_rank::LowRank;
pub use sparse::{Sparse, Starts};
pub(crate) use values::Source;
pub use values::{Grid, Nested, ValueKind, Values, ZeroPoint};

/// Bytes a job reads: a stored tensor's, an app's own, or bytes the host
/// made while planning (unpacked tiles, folded scales), shared between the
/// jobs and chunks that read them.
#[derive(Debug, Clone)]
pub enum Bytes<'a> {
    /// A tensor's stored bytes, borrowed from the checkpoint (empty while a
    /// checkpoint handed over in memory has not loaded them).
    Stored(TensorRef<'a>),
    /// Bytes the caller holds.
    Borrowed(&'a [u8]),
    /// Bytes made on the host.
    Owned(Arc<[u8]>),
}

impl<'a> Bytes<'a> {
    /// The stored tensor these bytes are, if they are one.
    pub fn tensor(&self) -> Option<TensorRef<'a>> {
        match self {
            Bytes::Stored(t) => Some(*t),
            _ => None,
        }
    }
}

impl Deref for Bytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Stored(t) => t.stored(),
            Bytes::Borrowed(b) => b,
            Bytes::Owned(b) => b,
        }
    }
}

impl<'a> From<TensorRef<'a>> for Bytes<'a> {
    fn from(t: TensorRef<'a>) -> Self {
        Bytes::Stored(t)
    }
}

impl<'a> From<&'a [u8]> for Bytes<'a> {
    fn from(b: &'a [u8]) -> Self {
        Bytes::Borrowed(b)
    }
}

impl From<Vec<u8>> for Bytes<'_> {
    fn from(b: Vec<u8>) -> Self {
        Bytes::Owned(b.into())
    }
}

/// Logical size of a decode: `slices` independent `rows × cols` matrices
/// (3-D expert weights have one slice per expert; 2-D weights have one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Number of stacked matrices.
    pub slices: usize,
    /// Rows per matrix.
    pub rows: usize,
    /// Columns per matrix.
    pub cols: usize,
}

impl Dims {
    /// Rows of all slices together (the unit backends split work by).
    pub fn total_rows(&self) -> usize {
        self.slices * self.rows
    }

    /// Number of output elements.
    pub fn elements(&self) -> usize {
        self.slices * self.rows * self.cols
    }
}

/// The arithmetic the scaled value `(q − zero) · scale` is computed in,
/// before any post scale and the final rounding to the output dtype. A
/// producer whose dequantizer multiplies two tensors of a 16-bit dtype rounds
/// both operands and the product to that dtype; this names it, so that every
/// backend performs the same operations (planners choose it, backends never
/// branch on the format). With a dtype `d`:
///
/// ```text
/// round_out( round_d( round_d(q − zero) · round_d(scale) ) )
/// ```
///
/// The f32 product of two values of 8 (bf16) or 11 (f16) significant bits is
/// exact, so rounding it once to `d` is `d`'s own correctly rounded multiply
/// (what torch computes for two bf16 or f16 tensors). Jobs with a low-rank
/// branch always compute in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Product {
    /// In f32 (the numerics contract's default).
    #[default]
    F32,
    /// In the output dtype: the scale is rounded to it first (ModelOpt's
    /// `FP8QTensor.dequantize`: `weight.to(dtype) * scale.to(dtype)`). An f32
    /// output makes this the f32 product.
    OutDtype,
    /// In bf16 whatever the output, then cast (compressed-tensors'
    /// `mxfp8-quantized`: a bf16 `2^(e−127)` scale times bf16 codes; an f16
    /// or f32 output is that bf16 value cast).
    Bf16,
    /// In f16 whatever the output, then cast (SINQ's NF4 path: codebook
    /// values, zero, scale and `scale2` in the f16 of its scales, the f16
    /// result returned as is).
    F16,
}

/// Everything needed to produce one dense tensor.
#[derive(Debug, Clone)]
pub struct DecodeJob<'a> {
    /// Logical size.
    pub dims: Dims,
    /// The weight codes: lane = row, index = column.
    pub codes: Fields<'a>,
    /// Value of each code (length 2^bits): integer codes with their offset
    /// removed, E2M1 or E4M3 values.
    pub code_values: Arc<[f32]>,
    /// Zero point, when the scheme is asymmetric.
    pub zero: Option<ZeroPoint<'a>>,
    /// Scale, when there is one.
    pub scale: Option<Values<'a>>,
    /// Activation-order group of each column, replacing `col div col_div`.
    pub g_idx: Option<Vec<u32>>,
    /// SVDQuant's low-rank branch and smoothing, when the job has them.
    pub low_rank: Option<LowRank>,
    /// A constant the value is multiplied by, rounded on its own:
    /// `f32(f32(q · s) · post_scale)` (LLM.int8's `1/127`, applied after its
    /// per-row scale, as bitsandbytes computes it).
    pub post_scale: Option<f32>,
    /// A value per group added last, on its own grid: `f32(v + offset)`
    /// rounded once to the output (MLX's affine `scale · q + bias`). The
    /// product before it is rounded on its own: never a fused
    /// multiply-add, which would round once where MLX rounds twice.
    pub offset: Option<Values<'a>>,
    /// The arithmetic of the scaled value (see [`Product`]).
    pub product: Product,
    /// Output dtype.
    pub out: OutDtype,
    /// The codes are kept only where a bitmask is set ([`Sparse`]).
    pub sparse: Option<Sparse<'a>>,
    /// The output is the stored matrix transposed: element (slice, row, col)
    /// is stored element (slice, col, row). `dims` are the output's; codes,
    /// zero point and scale are addressed in the stored orientation
    /// ([`DecodeJob::stored_dims`]). AutoAWQ stores `[in, out]`, GPT-OSS's
    /// experts `[E, out, in]` of a dense `[E, in, out]`.
    pub transposed: bool,
    /// The values are vectors gathered from a codebook table ([`Codebook`]):
    /// `codes`, `code_values`, `zero` and the rest of the code path are
    /// not read; `scale` and `offset` are, in the codebook's arithmetic.
    pub codebook: Option<Codebook<'a>>,
}

/// A job starts as codes read through `code_values`; the `with_…` methods
/// add what the format has besides. [`DecodeJob::transpose`] makes a job
/// built in the stored orientation write the transpose.
impl<'a> DecodeJob<'a> {
    /// The job writing `code_values[code]` of each of `codes` as `out`:
    /// no zero point, scale, g_idx or low-rank branch, not transposed.
    pub fn new(
        dims: Dims,
        codes: Fields<'a>,
        code_values: impl Into<Arc<[f32]>>,
        out: OutDtype,
    ) -> Self {
        DecodeJob {
            dims,
            codes,
            code_values: code_values.into(),
            zero: None,
            scale: None,
            g_idx: None,
            low_rank: None,
            post_scale: None,
            offset: None,
            product: Product::F32,
            out,
            sparse: None,
            transposed: false,
            codebook: None,
        }
    }

    /// A job whose values are gathered from `codebook` (see [`Codebook`]):
    /// no codes are read.
    pub fn with_codebook(dims: Dims, codebook: Codebook<'a>, out: OutDtype) -> Self {
        let mut job = DecodeJob::new(dims, Fields::dense(Vec::new(), 1, 0), vec![0.0f32; 2], out);
        job.codebook = Some(codebook);
        job
    }

    /// Reads the codes through a bitmask (see [`Sparse`]): `codes` then holds
    /// the kept codes alone, in lane 0.
    pub fn with_sparse(mut self, sparse: Sparse<'a>) -> Self {
        self.sparse = Some(sparse);
        self
    }

    /// Adds `offset`'s entry last (see [`DecodeJob::offset`]).
    pub fn with_offset(mut self, offset: Values<'a>) -> Self {
        self.offset = Some(offset);
        self
    }

    /// Computes the scaled value in `product`'s arithmetic (see [`Product`]).
    pub fn with_product(mut self, product: Product) -> Self {
        self.product = product;
        self
    }

    /// Multiplies every value by `factor` last (see [`DecodeJob::post_scale`]).
    pub fn with_post_scale(mut self, factor: f32) -> Self {
        self.post_scale = Some(factor);
        self
    }

    /// Scales the codes' values by `scale`.
    pub fn with_scale(mut self, scale: Values<'a>) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Subtracts `zero` (when there is one: asymmetric schemes) before scaling.
    pub fn with_zero(mut self, zero: impl Into<Option<ZeroPoint<'a>>>) -> Self {
        self.zero = zero.into();
        self
    }

    /// Reads each column's group from `g_idx` (when there is one:
    /// activation order).
    pub fn with_g_idx(mut self, g_idx: impl Into<Option<Vec<u32>>>) -> Self {
        self.g_idx = g_idx.into();
        self
    }

    /// Adds SVDQuant's low-rank branch and smoothing.
    pub fn with_low_rank(mut self, low_rank: LowRank) -> Self {
        self.low_rank = Some(low_rank);
        self
    }
}

impl<'a> DecodeJob<'a> {
    /// Column group of `col` on `grid`.
    #[inline]
    fn group(&self, grid: &Grid, col: usize) -> usize {
        match &self.g_idx {
            Some(g) => g[col] as usize,
            None => div(col, grid.col_div),
        }
    }

    /// The job writing the transpose of what it wrote (`dims` swap).
    pub fn transpose(mut self) -> Self {
        std::mem::swap(&mut self.dims.rows, &mut self.dims.cols);
        self.transposed = !self.transposed;
        self
    }

    /// The same weight with its packs rewritten in output order, a row's
    /// 4- or 8-bit codes one word after another: what products read. A
    /// transposed job's codes (AutoAWQ's `[in, out]`) become a straight
    /// job's, its scales and plain zero points move to the transposed grid,
    /// and zero points packed along columns become packed along rows, in
    /// plain field order. A straight job keeps the rest: its rows' words
    /// strided (GPTQ's `[in/8, out]`) or its rows' fields interleaved
    /// (ModelOpt INT4-AWQ's two rows a byte) are put one after another, at
    /// the same size; a sparse job's codes are written whole, the pruned
    /// ones 0 as [`DecodeJob::code`] reads them (compressed-tensors' 2:4
    /// FP8: a byte a weight, against about 0.56 stored); and narrower codes
    /// (and packed zero points) are widened to 4 bits (int3: a third more
    /// than stored), their table padded. `None` where the job is already
    /// in output order or has what this does not rewrite (g_idx, a
    /// transposed bitmask or low-rank branch, nested scales, zero points
    /// packed along rows, codes wider than 8 bits).
    pub(crate) fn in_output_order(&self) -> Option<DecodeJob<'a>> {
        let c = &self.codes;
        let width = match c.bits {
            1..=4 => 4,
            5..=8 => 8,
            _ => return None,
        };
        if self.g_idx.is_some() || self.codebook.is_some() {
            return None;
        }
        if !self.transposed {
            if c.bits == width
                && c.blocks.is_none()
                && c.per_word == 0
                && c.word_bits == 32
                && self.sparse.is_none()
            {
                return None;
            }
            let Dims { slices, rows, cols } = self.dims;
            let codes = match &self.sparse {
                Some(sp) => sp.codes_whole(c, (slices, rows, cols), width)?,
                None => c.in_lane_order((slices, rows, cols), width)?,
            };
            let zero = match &self.zero {
                // Lanes: the scale's column groups (one without), side by side.
                Some(ZeroPoint::Packed { fields }) if fields.bits != width => {
                    let groups = self
                        .scale
                        .as_ref()
                        .map_or(1, |v| cols.div_ceil(v.grid.col_div));
                    let fields =
                        Fields::in_lanes((slices, groups, rows), width, true, |s, g, r| {
                            fields.get(s, g, r)
                        })?;
                    Some(ZeroPoint::Packed { fields })
                }
                zero => zero.clone(),
            };
            // Entries no code reads, as `first + c`: a table `c − offset`
            // goes on as one, so that kernels still compute it.
            let cv = &self.code_values;
            let first = cv.first().copied().unwrap_or(0.0);
            let code_values: Vec<f32> = (0..cv.len().max(1 << width))
                .map(|c| cv.get(c).copied().unwrap_or(first + c as f32))
                .collect();
            return Some(DecodeJob {
                codes,
                zero,
                code_values: code_values.into(),
                sparse: None,
                ..self.clone()
            });
        }
        if self.sparse.is_some() || self.low_rank.is_some() || c.bits != width {
            return None;
        }
        // Stored rows are the inputs, stored columns the outputs.
        let stored = self.stored_dims();
        let Dims {
            slices,
            rows: ins,
            cols: outs,
        } = stored;
        let codes = self.codes.transposed_in_lane_order(stored)?;
        let scale = match &self.scale {
            Some(v) => Some(v.transposed(stored)?),
            None => None,
        };
        let offset = match &self.offset {
            Some(v) => Some(v.transposed(stored)?),
            None => None,
        };
        let zero = match &self.zero {
            None => None,
            Some(ZeroPoint::Plain(v)) => Some(ZeroPoint::Plain(v.transposed(stored)?)),
            Some(ZeroPoint::PackedAlongCols { fields }) => {
                // Lane: the stored row group, now the column group of both.
                let lanes = self
                    .scale
                    .as_ref()
                    .map_or(1, |s| ins.div_ceil(s.grid.row_div));
                let fields =
                    Fields::in_lanes((slices, lanes, outs), fields.bits, true, |s, g, o| {
                        fields.get(s, g, o)
                    })?;
                Some(ZeroPoint::Packed { fields })
            }
            Some(ZeroPoint::Packed { .. }) => return None,
        };
        Some(DecodeJob {
            dims: self.dims,
            codes,
            code_values: self.code_values.clone(),
            zero,
            scale,
            g_idx: None,
            low_rank: None,
            post_scale: self.post_scale,
            offset,
            product: self.product,
            out: self.out,
            sparse: None,
            transposed: false,
            codebook: None,
        })
    }

    /// The same weight read as `n` rows of `k` inputs, for a job whose rows
    /// are another view of the same row-major elements (bitsandbytes' 4-bit
    /// packs, whose blocks cross the weight's rows, are decoded as rows of
    /// whole blocks; HQQ's rows of one group each, in slices): its stream of
    /// codes cut into rows of `k`, and its scales (and plain zero points on
    /// the scale's grid), each serving a run of elements, repeated for
    /// every row and group of `gcd(k, run)` inputs as the f32 values they
    /// are. Codes that are no one stream are first rewritten in output
    /// order ([`DecodeJob::in_output_order`]). `None` where the job is no
    /// such view (its rows W's own already, codes not one stream across
    /// its slices, zero points off the scale's grid, runs that are not
    /// regular, sizes that overflow), or where those groups would split
    /// code words.
    pub(crate) fn in_rows(&self, n: usize, k: usize) -> Option<DecodeJob<'a>> {
        let Dims { slices, rows, cols } = self.dims;
        let c = &self.codes;
        let lane_bits = (cols as u64).checked_mul(c.bits as u64)?;
        let stream = c.blocks.is_none()
            && c.parts.is_none()
            && c.per_word == 0
            && c.word_bits == 32
            && c.lane_bits == lane_bits
            && (slices == 1 || c.slice_bits == lane_bits.checked_mul(rows as u64)?);
        let zero_on_scale = match (&self.zero, &self.scale) {
            (None, _) => true,
            (Some(ZeroPoint::Plain(z)), Some(s)) => z.grid == s.grid,
            _ => false,
        };
        let plain = zero_on_scale
            && self.g_idx.is_none()
            && self.sparse.is_none()
            && self.low_rank.is_none();
        let total = slices.checked_mul(rows)?.checked_mul(cols)?;
        let view = (slices, rows, cols) != (1, n, k) && total == n.checked_mul(k)?;
        if !view || !plain || self.transposed || k == 0 || self.codebook.is_some() {
            return None;
        }
        if !stream {
            return self.in_output_order()?.in_rows(n, k);
        }
        let codes = Fields {
            lane_bits: k as u64 * c.bits as u64,
            slice_bits: 0,
            ..c.clone()
        };
        let (mut scale, mut zero) = (None, None);
        if let Some(v) = &self.scale {
            // The elements one entry serves, one after another.
            let g = v.grid;
            let run = match g.col_div >= cols {
                true => g.row_div.checked_mul(cols)?,
                false if cols.is_multiple_of(g.col_div) => g.col_div,
                false => return None,
            };
            // Groups of whole code words (or rows of one group), as
            // products read them: else a scale for each few codes.
            let group = gcd(k, run);
            if group < k && !group.is_multiple_of((32 / c.bits.max(1)) as usize) {
                return None;
            }
            let groups = k / group;
            let entries = n.checked_mul(groups)?.checked_mul(4)?;
            let (mut scales, mut zeros) = (Vec::with_capacity(entries), Vec::new());
            for r in 0..n {
                for j in 0..groups {
                    let at = r * k + j * group;
                    let (s, row, col) = (at / (rows * cols), at / cols % rows, at % cols);
                    let (z, v) = self.zero_and_scale(s, row, col);
                    scales.extend_from_slice(&v?.to_le_bytes());
                    if let Some(z) = z {
                        zeros.extend_from_slice(&z.to_le_bytes());
                    }
                }
            }
            let grid = Grid {
                row_div: 1,
                col_div: group,
                row_stride: groups,
                slice_stride: 0,
            };
            let values = |b: Vec<u8>| Values {
                data: Bytes::Owned(b.into()),
                kind: ValueKind::F32,
                grid,
            };
            zero = self.zero.as_ref().map(|_| ZeroPoint::Plain(values(zeros)));
            scale = Some(values(scales));
        }
        Some(DecodeJob {
            dims: Dims {
                slices: 1,
                rows: n,
                cols: k,
            },
            codes,
            scale,
            zero,
            ..self.clone()
        })
    }

    /// The dimensions codes, zero point and scale are addressed in.
    pub fn stored_dims(&self) -> Dims {
        let d = self.dims;
        if self.transposed {
            Dims {
                rows: d.cols,
                cols: d.rows,
                ..d
            }
        } else {
            d
        }
    }

    /// The f32 value of output element (slice, row, col), before the final
    /// rounding.
    #[inline]
    pub fn value(&self, slice: usize, row: usize, col: usize) -> f32 {
        if let Some(cb) = &self.codebook {
            return self.codebook_value(cb, slice, row, col);
        }
        let (row, col) = if self.transposed {
            (col, row)
        } else {
            (row, col)
        };
        let (q, s) = self.code_and_scale(slice, row, col);
        let v = match &self.low_rank {
            Some(lr) if lr.in_product && lr.rank == 0 => {
                // The factors of the row over slices (LowRank::period).
                let flat = slice * self.stored_dims().rows + row;
                match self.product_dtype() {
                    Some(d) => d.round(self.scaled(q, s) * d.round(lr.factor(flat, col))),
                    None => lr.apply(q, s.unwrap_or(1.0), flat, col),
                }
            }
            Some(lr) => lr.apply(q, s.unwrap_or(1.0), row, col),
            None => self.scaled(q, s),
        };
        let v = self.post(v);
        match &self.offset {
            Some(o) => v + o.get(o.grid.index(slice, row, self.group(&o.grid, col))),
            None => v,
        }
    }

    /// The dtype the scaled value is computed in when it is not f32 (see
    /// [`Product`]).
    #[inline]
    pub fn product_dtype(&self) -> Option<OutDtype> {
        match (self.product, self.out) {
            (Product::F32, _) | (Product::OutDtype, OutDtype::F32) => None,
            (Product::OutDtype, d) => Some(d),
            (Product::Bf16, _) => Some(OutDtype::Bf16),
            (Product::F16, _) => Some(OutDtype::F16),
        }
    }

    /// `q · s` (`q` alone without a scale) in the job's [`Product`]
    /// arithmetic: what every backend's value and table builders compute
    /// from a code's value less its zero point and its entry's scale.
    #[inline]
    pub fn scaled(&self, q: f32, s: Option<f32>) -> f32 {
        match self.product_dtype() {
            None => s.map_or(q, |s| q * s),
            Some(d) => {
                let q = d.round(q);
                s.map_or(q, |s| d.round(q * d.round(s)))
            }
        }
    }

    /// `v` times the job's [`DecodeJob::post_scale`], when it has one.
    #[inline]
    pub fn post(&self, v: f32) -> f32 {
        match self.post_scale {
            Some(f) => v * f,
            None => v,
        }
    }

    /// The weight an SVDQuant activation shift multiplies at (row, col): the
    /// whole value, except in the packed order, whose low-rank branch sees
    /// the unshifted input, where it is the smoothed residual alone.
    pub fn shifted_weight(&self, row: usize, col: usize) -> f32 {
        match &self.low_rank {
            Some(lr) if lr.smooth_first => {
                let (q, s) = self.code_and_scale(0, row, col);
                q * s.unwrap_or(1.0) * lr.factor(row, col)
            }
            _ => self.value(0, row, col),
        }
    }

    /// The code's value less its zero point, and the scale, of one stored
    /// element.
    #[inline]
    fn code_and_scale(&self, slice: usize, row: usize, col: usize) -> (f32, Option<f32>) {
        let mut v = self.code_values[self.code(slice, row, col) as usize];
        let (zero, s) = self.zero_and_scale(slice, row, col);
        if let Some(z) = zero {
            v -= z;
        }
        (v, s)
    }

    /// The code of one stored element: its field, or through the bitmask of
    /// a sparse job (code 0 where the bit is clear).
    #[inline]
    pub fn code(&self, slice: usize, row: usize, col: usize) -> u32 {
        match &self.sparse {
            None => self.codes.get(slice, row, col),
            Some(sp) if sp.mask.get(slice, row, col) == 0 => 0,
            Some(sp) => self.codes.get(slice, 0, sp.index(row, col) as usize),
        }
    }

    /// The first bit of the codes of stored (slice, row), for the ranges
    /// backends upload and writers release.
    pub fn codes_start(&self, slice: usize, row: usize) -> Option<u64> {
        match &self.sparse {
            None => self.codes.lane_start(slice, row),
            Some(sp) => sp.start(row, 0).checked_mul(self.codes.bits as u64),
        }
    }

    /// The zero point and the scale of one stored element (what a backend's
    /// code table for that element's entries is built from).
    #[inline]
    pub(crate) fn zero_and_scale(
        &self,
        slice: usize,
        row: usize,
        col: usize,
    ) -> (Option<f32>, Option<f32>) {
        let z = self.zero_at(slice, row, self.zero_group(col));
        let s = self
            .scale
            .as_ref()
            .zip(self.scale_index(slice, row, col))
            .map(|(s, i)| s.get(i));
        (z, s)
    }

    /// Where the scale of one stored element is stored.
    #[inline]
    pub(crate) fn scale_index(&self, slice: usize, row: usize, col: usize) -> Option<usize> {
        let s = self.scale.as_ref()?;
        Some(s.grid.index(slice, row, self.group(&s.grid, col)))
    }

    /// Column group of `col` on the grid the zero point is read on: its own
    /// for plain zero points, the scale's for packed ones (lane 0 without a
    /// scale).
    #[inline]
    pub(crate) fn zero_group(&self, col: usize) -> usize {
        match (&self.zero, &self.scale) {
            (Some(ZeroPoint::Plain(z)), _) => self.group(&z.grid, col),
            (Some(ZeroPoint::PackedAlongCols { .. }), _) => col,
            (_, Some(s)) => self.group(&s.grid, col),
            (_, None) => 0,
        }
    }

    /// The zero point of stored (slice, row) in column group `g` of its grid
    /// (the column itself for zero points packed along columns).
    #[inline]
    pub fn zero_at(&self, slice: usize, row: usize, g: usize) -> Option<f32> {
        self.zero.as_ref().map(|z| match z {
            ZeroPoint::Packed { fields } => self.code_values[fields.get(slice, g, row) as usize],
            ZeroPoint::PackedAlongCols { fields } => {
                self.code_values[fields.get(slice, self.zero_lane(row), g) as usize]
            }
            ZeroPoint::Plain(v) => v.get(v.grid.index(slice, row, g)),
        })
    }

    /// Where `zero_at(slice, row, g)` reads its zero point.
    #[inline]
    pub(crate) fn zero_source(&self, slice: usize, row: usize, g: usize) -> Option<Source> {
        self.zero.as_ref().map(|z| match z {
            ZeroPoint::Packed { fields } => Source::Field(fields.position(slice, g, row)),
            ZeroPoint::PackedAlongCols { fields } => {
                Source::Field(fields.position(slice, self.zero_lane(row), g))
            }
            ZeroPoint::Plain(v) => Source::Value(v.grid.index(slice, row, g)),
        })
    }

    /// The lane of stored `row` in zero points packed along columns: its row
    /// group on the scale grid (lane 0 without a scale).
    #[inline]
    pub fn zero_lane(&self, row: usize) -> usize {
        self.scale.as_ref().map_or(0, |s| div(row, s.grid.row_div))
    }

    /// The scale of (slice, row) in column group `g`.
    #[inline]
    pub fn scale_at(&self, slice: usize, row: usize, g: usize) -> Option<f32> {
        self.scale
            .as_ref()
            .map(|s| s.get(s.grid.index(slice, row, g)))
    }

    /// Output bytes of the whole tensor.
    pub fn out_bytes(&self) -> usize {
        self.dims.elements() * self.out.size()
    }
}

#[cfg(test)]
mod tests;

//! Splitting a [`DecodeJob`] into chunks of rows that fit the device, and
//! laying out what each chunk reads in one word buffer (`src` in the shader).
//!
//! Pure host logic: no device needed, so it is unit-tested on any machine.

use std::borrow::Cow;
use std::ops::Range;

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result, Rule};
use crate::job::{DecodeJob, Dims, Fields, InBlocks, LowRank, Plane, Starts, ValueKind, Values, ZeroPoint};
use crate::numerics::{self, OutDtype};

/// Output bytes one chunk produces at most: big enough to keep the device
/// busy, small enough that a writer call (64 MiB) spans several chunks, so
/// upload, compute and readback of successive chunks overlap.
pub(super) const OUT_CAP: u64 = 16 << 20;

/// Input bytes one chunk binds at most. Bit positions inside `src` must fit
/// a u32 (2^32 bits = 512 MiB), so this stays well below that.
pub(super) const SRC_CAP: u64 = 256 << 20;

/// Invocations per workgroup unless the decoder is told otherwise (`WG` in
/// decode.wgsl): a multiple of every GPU's SIMD width (32 or 64) that keeps
/// occupancy high on all of them.
pub(super) const WORKGROUP: u32 = 256;

/// A value the shader reads from `Params` or an override constant: a
/// `#[repr(u32)]` enum whose discriminants are the shader's numbers, each
/// variant naming the `const` of decode.wgsl it stands for, so that the
/// test `protocol_matches_the_shader_constants` can hold both to one number.
macro_rules! shader_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $value:literal as $wgsl:ident,)*
        }
    ) => {
        $(#[$meta])*
        #[repr(u32)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub(crate) enum $name {
            $($(#[$vmeta])* $variant = $value,)*
        }

        impl From<$name> for u32 {
            fn from(v: $name) -> u32 {
                v as u32
            }
        }

        #[cfg(test)]
        impl $name {
            /// Every value with the name of its constant in decode.wgsl.
            const WGSL: &'static [($name, &'static str)] =
                &[$(($name::$variant, stringify!($wgsl)),)*];
        }
    };
}

shader_enum! {
    /// How a grid entry is stored (`Grid::kind`).
    pub enum GridKind {
        Bf16 = 0 as GRID_BF16,
        F16 = 1 as GRID_F16,
        F32 = 2 as GRID_F32,
        I8 = 3 as GRID_I8,
        I32 = 4 as GRID_I32,
        /// One byte indexing a 256-entry f32 table placed in `src`.
        Table = 5 as GRID_TABLE,
        /// One byte indexing a table, times an outer factor, plus an
        /// offset ([`crate::job::Nested`]).
        Nested = 6 as GRID_NESTED,
        /// A [`GridKind::Table`] that is [`numerics::e8m0`]'s (MX scales),
        /// computed from the byte: one read instead of two. Only as the
        /// fast kernels' `SKIND`, `ZKIND` ([`GridKind::fast`]).
        E8m0 = 7 as GRID_E8M0,
    }
}

shader_enum! {
    /// The output dtype (`Params::out_kind`, `OUT`).
    pub enum OutKind {
        F32 = 0 as OUT_F32,
        Bf16 = 1 as OUT_BF16,
        F16 = 2 as OUT_F16,
    }
}

shader_enum! {
    /// Where zero points come from (`Params::zero_mode`, `ZERO`), as
    /// [`ZeroPoint`] says.
    pub enum ZeroMode {
        None = 0 as ZERO_NONE,
        Packed = 1 as ZERO_PACKED,
        Plain = 2 as ZERO_PLAIN,
        PackedAlongCols = 3 as ZERO_PACKED_ALONG_COLS,
        /// No zero point: the job's offset, on the zero point's grid
        /// ([`DecodeJob::offset`]; the generic and fast kernels).
        Offset = 4 as ZERO_OFFSET,
    }
}

shader_enum! {
    /// SVDQuant's low-rank branch and the order it is applied in
    /// (`Params::lr_mode`, `LOW_RANK`), as [`LowRank::apply`] computes it.
    pub enum LowRankMode {
        None = 0 as LOW_RANK_NONE,
        /// `(q·s + lr) · inv_smooth`.
        SmoothLast = 1 as LOW_RANK_SMOOTH_LAST,
        /// `(q·s) · inv_smooth + lr`.
        SmoothFirst = 2 as LOW_RANK_SMOOTH_FIRST,
    }
}

shader_enum! {
    /// How the fast kernel gets a code's value (`CODE`): from the job's
    /// table, or from a formula that gives the same table without reading it.
    pub enum CodeKind {
        Table = 0 as CODE_TABLE,
        /// `code − offset` (`Params::code_offset`, see `code_offset`).
        Offset = 1 as CODE_OFFSET,
        /// The code as a two's complement integer.
        TwosComplement = 2 as CODE_TWOS_COMPLEMENT,
        E2m1 = 3 as CODE_E2M1,
        E4m3 = 4 as CODE_E4M3,
    }
}

shader_enum! {
    /// How the tile kernel's code words lie against its output (`PACK`).
    pub enum Pack {
        /// A transposed job whose stored rows' words are contiguous: a word
        /// holds output rows of one output column (AutoAWQ, GPT-OSS).
        Transposed = 0 as PACK_TRANSPOSED,
        /// Lanes one word apart, each lane's words strided: a word holds
        /// columns of one output row, the next word the next row's (GPTQ).
        Strided = 1 as PACK_STRIDED,
    }
}

shader_enum! {
    /// Whether codes are read through a bitmask (`Params::sp_mode`), and
    /// where its blocks start, as [`Starts`] says.
    pub enum SparseMode {
        None = 0 as SPARSE_NONE,
        Fixed = 1 as SPARSE_FIXED,
        Table = 2 as SPARSE_TABLE,
    }
}

/// `Params::gidx` of a job without g_idx (`NO_G_IDX` in decode.wgsl).
pub(super) const NO_G_IDX: u32 = u32::MAX;

impl OutKind {
    fn of(out: OutDtype) -> OutKind {
        match out {
            OutDtype::F32 => OutKind::F32,
            OutDtype::Bf16 => OutKind::Bf16,
            OutDtype::F16 => OutKind::F16,
        }
    }
}

impl ZeroMode {
    /// The mode of `job`: its zero point's, or its offset's.
    fn of_job(job: &DecodeJob<'_>) -> ZeroMode {
        match &job.offset {
            Some(_) => ZeroMode::Offset,
            None => ZeroMode::of(job.zero.as_ref()),
        }
    }

    fn of(zero: Option<&ZeroPoint<'_>>) -> ZeroMode {
        match zero {
            None => ZeroMode::None,
            Some(ZeroPoint::Packed { .. }) => ZeroMode::Packed,
            Some(ZeroPoint::Plain(_)) => ZeroMode::Plain,
            Some(ZeroPoint::PackedAlongCols { .. }) => ZeroMode::PackedAlongCols,
        }
    }
}

impl LowRankMode {
    fn of(low_rank: Option<&LowRank>) -> LowRankMode {
        match low_rank {
            None => LowRankMode::None,
            Some(lr) if lr.smooth_first => LowRankMode::SmoothFirst,
            Some(_) => LowRankMode::SmoothLast,
        }
    }
}

/// Mirrors `Stream` in decode.wgsl.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Pod, Zeroable)]
pub(super) struct StreamParams {
    bits: u32,
    per_word: u32,
    lane_bits: u32,
    word_bits: u32,
    slice_bits: u32,
    base: u32,
    interleave: u32,
    /// XORed with a field's bit position ([`Fields::swap_mask`]: 4 for
    /// bitsandbytes' high-nibble-first bytes).
    swap: u32,
    /// Fields per block ([`crate::job::InBlocks`]); 0: not in blocks.
    block_len: u32,
    block_bits: u32,
    pad0: u32,
    pad1: u32,
    /// The low plane: its first byte in the block, bits, span, 0.
    low: [u32; 4],
    /// The high plane; bits 0: none.
    high: [u32; 4],
}

impl StreamParams {
    /// The block geometry of a stream (none: zeros).
    fn in_blocks(b: Option<&InBlocks>) -> StreamParams {
        let plane = |p: Option<Plane>| p.map_or([0; 4], |p| [p.at, p.bits, p.span, 0]);
        match b {
            None => StreamParams::default(),
            Some(b) => StreamParams {
                block_len: b.len,
                block_bits: b.bytes * 8,
                low: plane(Some(b.low)),
                high: plane(b.high),
                ..StreamParams::default()
            },
        }
    }
}

/// Mirrors `Grid` in decode.wgsl.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub(super) struct GridParams {
    /// [`GridKind`].
    kind: u32,
    size: u32,
    row_div: u32,
    col_div: u32,
    row_stride: u32,
    slice_stride: u32,
    base: u32,
    table: u32,
    /// [`GridKind::Nested`]: word index in `src` of the outer factor of
    /// entry 0 (wrapping: entry i reads word `outer + i / per_outer`).
    outer: u32,
    per_outer: u32,
    offset: f32,
    _pad: u32,
}

/// Mirrors `Params` in decode.wgsl.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub(super) struct Params {
    rows: u32,
    cols: u32,
    first_row: u32,
    elems: u32,
    /// [`OutKind`].
    out_kind: u32,
    /// [`ZeroMode`].
    zero_mode: u32,
    has_scale: u32,
    /// A word index, or [`NO_G_IDX`].
    gidx: u32,
    code_table: u32,
    /// Invocations per row of the dispatch grid.
    pub row_threads: u32,
    /// [`LowRankMode`].
    lr_mode: u32,
    lr_rank: u32,
    lr_up: u32,
    lr_down: u32,
    lr_smooth: u32,
    zero_bits: u32,
    words_per_row: u32,
    fast_rows: u32,
    code_offset: f32,
    slice0: u32,
    row0: u32,
    out_base: u32,
    transposed: u32,
    /// [`DecodeJob::post_scale`], 1.0 without one.
    post_scale: f32,
    /// The [`OutKind`] the scaled value is computed in
    /// ([`DecodeJob::product_dtype`]; `F32` when it is f32).
    product: u32,
    /// [`SparseMode`].
    sp_mode: u32,
    /// [`Sparse::block`].
    sp_block: u32,
    /// [`Starts::Fixed`]: kept codes per row; [`Starts::Table`]: blocks per row.
    sp_step: u32,
    /// [`Starts::Fixed`]: kept codes per block.
    sp_per_block: u32,
    /// [`Starts::Table`]: word index of the chunk's first row's starts.
    sp_starts: u32,
    /// [`Starts::Table`]: the stored row those are of.
    sp_row0: u32,
    /// Keep `codes` 16-byte aligned, as a uniform's structs must be.
    pad: u32,
    codes: StreamParams,
    zero: StreamParams,
    /// The bitmask of a sparse job.
    mask: StreamParams,
    zgrid: GridParams,
    sgrid: GridParams,
}

/// The kernel a chunk runs: `main` in decode.wgsl, or `fast` specialised by
/// its override constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kernel {
    /// Any job, one output word per invocation.
    Generic,
    /// One code word per invocation.
    Fast(Fast),
    /// Codes packed along the input dimension: a run of code words per
    /// invocation, one output tile per workgroup (`fast_t`).
    Tile(Tile),
}

/// The override constants of the tile kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Tile {
    /// `BITS`: 4 or 8.
    pub bits: u32,
    /// `CODE`.
    pub code: CodeKind,
    /// `OUT`.
    pub out: OutKind,
    /// `ZERO`: none, plain or packed along columns.
    pub zero: ZeroMode,
    /// `SCALED`.
    pub scaled: bool,
    /// `PACK`.
    pub pack: Pack,
    /// `INTERLEAVED`: AutoAWQ's word order.
    pub interleaved: bool,
    /// `WORD_GROUPS`: one scale and zero-point group per code word.
    pub word_groups: bool,
    /// `SHARED`: the words of an invocation's run share every scale and
    /// zero point code by code ([`Tile::for_job`] checks the grids).
    pub shared: bool,
    /// `GIDX`: groups come from the job's g_idx.
    pub gidx: bool,
    /// `SKIND`, `ZKIND`: how the scale and plain zero-point grids are
    /// stored (`Grid::kind`, fixed so the shader's switch folds away).
    pub skind: GridKind,
    pub zkind: GridKind,
    /// `COPY`: the bench baseline.
    pub copy: bool,
}

/// The override constants of the fast kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Fast {
    /// `BITS`: 4 or 8.
    pub bits: u32,
    /// `CODE`.
    pub code: CodeKind,
    /// `OUT`: as `Params::out_kind`.
    pub out: OutKind,
    /// `ZERO`: as `Params::zero_mode`.
    pub zero: ZeroMode,
    /// `SCALED`: as `Params::has_scale`.
    pub scaled: bool,
    /// `LOW_RANK`: as `Params::lr_mode`.
    pub low_rank: LowRankMode,
    /// `SKIND`, `ZKIND`: how the scale and plain zero-point grids are
    /// stored, as for [`Tile`].
    pub skind: GridKind,
    pub zkind: GridKind,
    /// `HIGH_FIRST`: the code bytes hold their fields from the high bits
    /// down ([`Fields::high_first`]).
    pub high_first: bool,
    /// `POST`: values are multiplied by `Params::post_scale` last.
    pub post: bool,
    /// `PRODUCT`: as `Params::product` ([`crate::job::Product`]).
    pub product: OutKind,
    /// `COPY`: the bench baseline (same reads and writes, no decoding).
    pub copy: bool,
    /// `BLOCKED`: the codes lie inside blocks ([`InBlocks`]).
    pub blocked: bool,
    /// `WORDS`: code words an invocation decodes in turn along its row,
    /// all in one scale and zero-point group ([`Fast::words_of`]).
    pub words: u32,
}

impl Kernel {
    /// Its entry point in decode.wgsl.
    pub(super) fn entry_point(&self) -> &'static str {
        match self {
            Kernel::Generic => "main",
            Kernel::Fast(_) => "fast",
            Kernel::Tile(_) => "fast_t",
        }
    }

    /// What a validation message names its pipeline and pass by.
    pub(super) fn label(&self) -> String {
        match self {
            Kernel::Generic => "wgpu-dequant main".into(),
            Kernel::Fast(k) => format!(
                "wgpu-dequant fast{} ({}-bit {:?} codes, {:?} out, zero {:?}, {}scaled, low rank {:?})",
                if k.copy { " copy baseline" } else { "" },
                k.bits,
                k.code,
                k.out,
                k.zero,
                if k.scaled { "" } else { "not " },
                k.low_rank,
            ),
            Kernel::Tile(k) => format!(
                "wgpu-dequant fast_t{} ({}-bit {:?} codes {:?}{}, {:?} out, zero {:?}, {}scaled{})",
                if k.copy { " copy baseline" } else { "" },
                k.bits,
                k.code,
                k.pack,
                if k.interleaved { " interleaved" } else { "" },
                k.out,
                k.zero,
                if k.scaled { "" } else { "not " },
                if k.word_groups { "" } else { ", groups per code" },
            ),
        }
    }
}

impl Fast {
    /// The constants as wgpu takes them.
    pub(super) fn constants(&self) -> [(&'static str, f64); 14] {
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        [
            ("WORDS", self.words as f64),
            ("BITS", self.bits as f64),
            ("CODE", self.code as u32 as f64),
            ("OUT", self.out as u32 as f64),
            ("ZERO", self.zero as u32 as f64),
            ("SCALED", flag(self.scaled)),
            ("LOW_RANK", self.low_rank as u32 as f64),
            ("SKIND", self.skind as u32 as f64),
            ("ZKIND", self.zkind as u32 as f64),
            ("HIGH_FIRST", flag(self.high_first)),
            ("POST", flag(self.post)),
            ("PRODUCT", self.product as u32 as f64),
            ("COPY", flag(self.copy)),
            ("BLOCKED", flag(self.blocked)),
        ]
    }

    /// The fast kernel for `job`, when it fits: a dense 4- or 8-bit code
    /// stream (or codes in blocks read as such: [`Fast::blocks_fit`]), no
    /// g_idx, scale and zero-point groups of whole code words, and (16-bit
    /// outputs) an even column count, so that no output word is shared by
    /// two invocations.
    pub(super) fn for_job(job: &DecodeJob<'_>) -> Option<Fast> {
        let c = &job.codes;
        let d = job.dims;
        // Codes in blocks are read as words of 4- or 8-bit fields.
        let bits = match (&c.blocks, c.bits) {
            (Some(b), 1..=4) if Fast::blocks_fit(job, b, 4) => 4,
            (Some(b), 5..=8) if Fast::blocks_fit(job, b, 8) => 8,
            (Some(_), _) => return None,
            (None, bits) => bits,
        };
        if !matches!(bits, 4 | 8)
            || c.per_word != 0
            || c.word_bits != 32
            || job.g_idx.is_some()
            || job.transposed
            || job.sparse.is_some()
            // An offset takes the zero point's grid (MLX's affine packs have none).
            || (job.offset.is_some() && job.zero.is_some())
        {
            return None;
        }
        // The kernel divides in f32 (div_small), exact below 2^24: a row
        // index plus a chunk's rows stays below that.
        if d.rows >= 1 << 23 || d.cols >= 1 << 23 {
            return None;
        }
        let per = (32 / bits) as usize;
        let whole_words =
            |v: &Values<'_>| v.grid.col_div >= d.cols || v.grid.col_div.is_multiple_of(per);
        if job.scale.iter().chain(&job.offset).any(|v| !whole_words(v)) {
            return None;
        }
        match &job.zero {
            Some(ZeroPoint::Plain(z)) if !whole_words(z) => return None,
            // The kernel reads packed zero points LSB first, and a chunk
            // takes its rows' words of every lane at once: lanes side by
            // side, one word each (`plan`).
            Some(ZeroPoint::Packed { fields })
                if fields.bits != c.bits || fields.high_first || fields.lane_bits != 32 =>
            {
                return None
            }
            Some(ZeroPoint::PackedAlongCols { .. }) => return None,
            _ => {}
        }
        let out = OutKind::of(job.out);
        if out != OutKind::F32 && !d.cols.is_multiple_of(2) {
            return None;
        }
        let code = CodeKind::of(job);
        // Two's complement of fewer bits than the word's fields.
        if code == CodeKind::TwosComplement && bits != c.bits {
            return None;
        }
        Some(Fast {
            bits,
            code,
            out,
            zero: ZeroMode::of_job(job),
            scaled: job.scale.is_some(),
            low_rank: LowRankMode::of(job.low_rank.as_ref()),
            skind: job.scale.as_ref().map_or(GridKind::Bf16, GridKind::fast),
            zkind: match (&job.zero, &job.offset) {
                (Some(ZeroPoint::Plain(z)), _) | (None, Some(z)) => GridKind::fast(z),
                _ => GridKind::Bf16,
            },
            high_first: c.high_first,
            post: job.post_scale.is_some(),
            product: product_kind(job),
            copy: false,
            blocked: c.blocks.is_some(),
            words: Fast::words_of(job, per),
        })
    }

    /// Code words an invocation of the fast kernel decodes: 4, 2 or 1, as
    /// many as every group of the job's scales, zero points and offsets
    /// holds whole (a run starts on a multiple of its columns), so that
    /// their lookups (an index in f32 arithmetic and a read each) are made
    /// once a run. On llvmpipe (`bench --backend gpu`, 4096²) that took
    /// GGUF's Q5_K, two lookups a word of 4 codes, from 0.61 of the copy
    /// shader to 0.82, and int4 g128 with zero points to bf16 from 0.61-0.68
    /// to 0.91.
    fn words_of(job: &DecodeJob<'_>, per: usize) -> u32 {
        let d = job.dims;
        let zero = match &job.zero {
            Some(ZeroPoint::Plain(z)) => Some(z),
            _ => None,
        };
        let grids = job.scale.iter().chain(&job.offset).chain(zero);
        [4, 2]
            .into_iter()
            .find(|&w| {
                grids
                    .clone()
                    .all(|v| v.grid.col_div >= d.cols || v.grid.col_div.is_multiple_of(w * per))
            })
            .unwrap_or(1) as u32
    }

    /// Whether the fast kernel reads `job`'s codes in blocks `b` as words
    /// of `bits`-wide fields: a block length that is a power of two and a
    /// multiple of a word's codes, planes whose runs hold whole words (or
    /// are dense), lanes on bytes, and no packed zero points.
    fn blocks_fit(job: &DecodeJob<'_>, b: &InBlocks, bits: u32) -> bool {
        let per = 32 / bits;
        let c = &job.codes;
        let plane = |p: &Plane| p.span == 1 || p.span.is_multiple_of(per);
        b.len.is_power_of_two()
            && b.len.is_multiple_of(per)
            && plane(&b.low)
            && b.high.as_ref().is_none_or(plane)
            && c.lane_bits.is_multiple_of(8)
            && c.slice_bits.is_multiple_of(8)
            && !c.high_first
            && matches!(job.zero, None | Some(ZeroPoint::Plain(_)))
    }
}

/// The [`OutKind`] a job's scaled value is computed in (`F32`: in f32).
fn product_kind(job: &DecodeJob<'_>) -> OutKind {
    job.product_dtype().map_or(OutKind::F32, OutKind::of)
}

/// The offset of [`CodeKind::Offset`]: what code 0 stands for, negated
/// (GPTQ's unsigned codes 0, a signed int4's 8, int3 widened to 4 bits 4).
/// Whole, from 0 to 2^bits, so that `code - offset` is an integer of at
/// most 8 bits' magnitude: exact in f32, bf16 and f16 (fast_scaled).
fn code_offset(job: &DecodeJob<'_>) -> f32 {
    let most = (1u32 << job.codes.bits.min(8)) as f32;
    match job.code_values.first().map(|v| -v) {
        Some(o) if (0.0..=most).contains(&o) => o.trunc(),
        _ => 0.0,
    }
}

impl CodeKind {
    /// Which formula gives `job`'s code table (4- or 8-bit codes; a NaN
    /// stands for any NaN: outputs write one canonical NaN).
    fn of(job: &DecodeJob<'_>) -> CodeKind {
        let c = &job.codes;
        let cv = &job.code_values;
        let table_is = |f: &dyn Fn(u8) -> f32| {
            cv.len() == 1 << c.bits
                && cv.iter().zip(0..=u8::MAX).all(|(&v, k)| {
                    let w = f(k);
                    v.to_bits() == w.to_bits() || (v.is_nan() && w.is_nan())
                })
        };
        let (offset, sign_shift) = (code_offset(job), 32 - c.bits);
        if table_is(&|k| k as f32 - offset) {
            CodeKind::Offset
        } else if table_is(&|k| ((k as i32) << sign_shift >> sign_shift) as f32) {
            CodeKind::TwosComplement
        } else if c.bits == 4 && table_is(&numerics::e2m1) {
            CodeKind::E2m1
        } else if c.bits == 8 && table_is(&numerics::e4m3) {
            CodeKind::E4m3
        } else {
            CodeKind::Table
        }
    }
}

impl GridKind {
    /// How `v`'s entries are stored.
    pub(super) fn of(v: &Values<'_>) -> GridKind {
        match &v.kind {
            ValueKind::Bf16 => GridKind::Bf16,
            ValueKind::F16 => GridKind::F16,
            ValueKind::F32 => GridKind::F32,
            ValueKind::I8 => GridKind::I8,
            ValueKind::I32 => GridKind::I32,
            ValueKind::Table(_) => GridKind::Table,
            ValueKind::Nested(_) => GridKind::Nested,
        }
    }

    /// How the fast and tile kernels read `v`'s entries: as stored, or by
    /// formula where a table is e8m0's (NaN for NaN).
    fn fast(v: &Values<'_>) -> GridKind {
        match &v.kind {
            ValueKind::Table(t)
                if t.iter().zip(0..=u8::MAX).all(|(&x, b)| {
                    let want = numerics::e8m0(b);
                    x.to_bits() == want.to_bits() || (x.is_nan() && want.is_nan())
                }) =>
            {
                GridKind::E8m0
            }
            _ => GridKind::of(v),
        }
    }
}

impl Tile {
    /// Rows before `row` (a row of its slice) in its code word, where a
    /// transposed tile starts; none for strided packs.
    pub(super) fn lead(&self, row: usize) -> usize {
        match self.pack {
            Pack::Transposed => row % (32 / self.bits) as usize,
            Pack::Strided => 0,
        }
    }

    /// Code words an invocation decodes, and its tile's runs along the
    /// words' other axis and along the run (`RUN`, `TILE_LANES`,
    /// `TILE_RUNS`).
    pub(super) fn runs(&self) -> (u32, u32, u32) {
        Self::geometry(self.pack)
    }

    /// [`Tile::runs`] of each [`Pack`]: 256 runs a tile, so that a
    /// workgroup of 256 takes a tile in one pass. Long runs spread an
    /// invocation's fixed costs (and AutoAWQ's 8 scale lookups) over more
    /// words: on llvmpipe runs of 32 transposed words (16 strided, 128
    /// 4-bit columns: GPTQ's usual group) ran 1.4x faster than runs of
    /// 8 (4), and 64 (32) no faster, while the tile shape mattered little
    /// once a SIMD batch's writes fill whole lines.
    fn geometry(pack: Pack) -> (u32, u32, u32) {
        match pack {
            Pack::Transposed => (32, 16, 16),
            Pack::Strided => (16, 16, 16),
        }
    }

    /// Output rows and columns of one tile.
    pub(super) fn size(&self) -> (u32, u32) {
        let (run, lanes, runs) = self.runs();
        let per = 32 / self.bits;
        match self.pack {
            Pack::Transposed => (lanes * per, runs * run),
            Pack::Strided => (lanes, runs * run * per),
        }
    }

    /// The constants as wgpu takes them.
    pub(super) fn constants(&self) -> [(&'static str, f64); 16] {
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        let (run, lanes, runs) = self.runs();
        [
            ("BITS", self.bits as f64),
            ("CODE", self.code as u32 as f64),
            ("OUT", self.out as u32 as f64),
            ("ZERO", self.zero as u32 as f64),
            ("SCALED", flag(self.scaled)),
            ("PACK", self.pack as u32 as f64),
            ("INTERLEAVED", flag(self.interleaved)),
            ("WORD_GROUPS", flag(self.word_groups)),
            ("SHARED", flag(self.shared)),
            ("GIDX", flag(self.gidx)),
            ("SKIND", self.skind as u32 as f64),
            ("ZKIND", self.zkind as u32 as f64),
            ("RUN", run as f64),
            ("TILE_LANES", lanes as f64),
            ("TILE_RUNS", runs as f64),
            ("COPY", flag(self.copy)),
        ]
    }

    /// The tile kernel for `job`, when it fits: 4- or 8-bit codes in whole
    /// aligned 32-bit words, either a transposed job whose stored rows'
    /// words are contiguous and whose output rows per slice are whole words
    /// ([`Pack::Transposed`]) or lanes one word apart with strided words
    /// ([`Pack::Strided`]); no low-rank branch; zero points plain or packed
    /// along columns in the codes' word layout; (16-bit outputs) an even
    /// column count. Groups of any size and g_idx are taken.
    pub(super) fn for_job(job: &DecodeJob<'_>) -> Option<Tile> {
        let c = &job.codes;
        let d = job.dims;
        // High-first bytes and post scales (bitsandbytes) are straight jobs
        // the fast kernel takes.
        if !matches!(c.bits, 4 | 8)
            || c.blocks.is_some()
            || job.low_rank.is_some()
            || job.sparse.is_some()
            || c.high_first
            || job.post_scale.is_some()
            || job.offset.is_some()
            // Tiles compute in f32 only (PRODUCT is the fast kernel's).
            || job.product_dtype().is_some()
        {
            return None;
        }
        let per = 32 / c.bits;
        // Whole aligned words of `per` fields each, in some order.
        let words = |f: &Fields<'_>| {
            f.bits == c.bits
                && (f.per_word == 0 || f.per_word == per)
                && [f.lane_bits, f.word_bits, f.slice_bits]
                    .iter()
                    .all(|b| b.is_multiple_of(32))
        };
        if !words(c) || d.rows >= 1 << 23 || d.cols >= 1 << 23 {
            return None;
        }
        let pack = if job.transposed && c.word_bits == 32 && d.rows.is_multiple_of(per as usize)
        {
            Pack::Transposed
        } else if !job.transposed && c.lane_bits == 32 && c.word_bits > 32 {
            Pack::Strided
        } else {
            return None;
        };
        match &job.zero {
            None | Some(ZeroPoint::Plain(_)) => {}
            Some(ZeroPoint::PackedAlongCols { fields })
                if words(fields) && fields.interleaved == c.interleaved => {}
            Some(_) => return None,
        }
        let out = OutKind::of(job.out);
        if out != OutKind::F32 && !d.cols.is_multiple_of(2) {
            return None;
        }
        let stored_cols = job.stored_dims().cols;
        let whole_words = |v: &Values<'_>| {
            v.grid.col_div >= stored_cols || v.grid.col_div.is_multiple_of(per as usize)
        };
        let word_groups = job.g_idx.is_none()
            && job.scale.as_ref().is_none_or(whole_words)
            && match &job.zero {
                Some(ZeroPoint::Plain(z)) => whole_words(z),
                _ => true,
            };
        // A run's words share their lookups when every grid they read puts
        // the run in one group: transposed runs are RUN stored rows (from a
        // multiple of RUN), whose zero points packed along columns sit in
        // the scale grid's row groups; strided runs are RUN · per stored
        // columns, each word with its own zero-point word.
        let stored_rows = job.stored_dims().rows.max(1);
        let run = Self::geometry(pack).0 as usize;
        let holds = |v: &Values<'_>| match pack {
            Pack::Transposed => {
                let rd = v.grid.row_div.max(1);
                rd.is_multiple_of(run) || rd >= stored_rows
            }
            Pack::Strided => {
                let cd = v.grid.col_div;
                cd.is_multiple_of(run * per as usize) || cd >= stored_cols
            }
        };
        let shared = (pack == Pack::Transposed || word_groups)
            && job.scale.as_ref().is_none_or(holds)
            && match &job.zero {
                Some(ZeroPoint::Plain(z)) => holds(z),
                Some(ZeroPoint::PackedAlongCols { .. }) => pack == Pack::Transposed,
                _ => true,
            };
        Some(Tile {
            bits: c.bits,
            code: CodeKind::of(job),
            out,
            zero: ZeroMode::of(job.zero.as_ref()),
            scaled: job.scale.is_some(),
            pack,
            interleaved: c.interleaved,
            word_groups,
            shared,
            gidx: job.g_idx.is_some(),
            skind: job.scale.as_ref().map_or(GridKind::Bf16, GridKind::fast),
            zkind: match &job.zero {
                Some(ZeroPoint::Plain(z)) => GridKind::fast(z),
                _ => GridKind::Bf16,
            },
            copy: false,
        })
    }
}

impl Params {
    /// The parameters of a dense `rows × cols` bf16 weight, two values to
    /// a word, for the products' dense baseline (matmul.wgsl's `gemv_dense`).
    pub(super) fn dense_bf16(rows: u32, cols: u32) -> Params {
        Params {
            cols,
            fast_rows: rows,
            words_per_row: cols / 2,
            ..bytemuck::Zeroable::zeroed()
        }
    }

    /// Code words per scale and zero-point group along a row: the greatest
    /// common divisor of the scale grid's and a plain zero-point grid's
    /// (packed zero points take the scale's groups); 0 where neither
    /// changes along a row. The kernels that use it take groups of whole
    /// words.
    pub(super) fn group_words(&self) -> u32 {
        let per = 32 / self.codes.bits.max(1);
        let scale = (self.has_scale != 0).then_some(self.sgrid.col_div);
        let grid = [ZeroMode::Plain as u32, ZeroMode::Offset as u32].contains(&self.zero_mode);
        let zero = grid.then_some(self.zgrid.col_div);
        let along_row = |d: &u32| *d < self.cols;
        scale.into_iter().chain(zero).filter(along_row).fold(0, |g, d| crate::job::gcd(g as usize, (d / per).max(1) as usize) as u32)
    }

    /// Whether every row's (lane's) codes start on a 32-bit word.
    pub(super) fn lanes_aligned(&self) -> bool {
        let c = &self.codes;
        (c.base | c.lane_bits | c.slice_bits).is_multiple_of(32)
    }

    /// The same chunk writing its output `words` words into the bound
    /// output buffer.
    pub(super) fn at_word(self, words: u32) -> Params {
        Params {
            out_base: words,
            ..self
        }
    }
}

/// What the device allows.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Largest storage binding (and buffer) in bytes.
    pub max_binding: u64,
    /// Alignment of a storage binding's offset.
    pub offset_align: u64,
    /// Invocations per workgroup.
    pub workgroup: u32,
    /// Largest workgroup count per dispatch dimension.
    pub max_groups_per_dim: u32,
    /// Output bytes a chunk aims at: [`OUT_CAP`] when decoding.
    pub chunk_out: u64,
}

impl Limits {
    /// Output bytes one chunk may produce: `chunk_out` within a binding,
    /// less room for a start inside a larger buffer, which a binding reaches
    /// from the aligned offset below it.
    fn out_cap(&self) -> u64 {
        self.max_binding
            .min(self.chunk_out)
            .saturating_sub(self.offset_align)
    }

    /// The limits of chunks that stay resident for products, which write
    /// y, never W: as many rows as their packs' binding holds, so that
    /// packs along the inputs (GPTQ, AutoAWQ), whose every chunk binds the
    /// words of all its inputs, are uploaded once, not once per chunk.
    pub(super) fn resident(self) -> Limits {
        Limits {
            chunk_out: u64::MAX,
            ..self
        }
    }

    /// The limits of a wgpu device.
    pub(super) fn of(l: &wgpu::Limits) -> Limits {
        Limits {
            // Whole words only: buffers and bindings are sized in u32s.
            max_binding: l.max_storage_buffer_binding_size.min(l.max_buffer_size) & !3,
            offset_align: (l.min_storage_buffer_offset_alignment as u64).max(4),
            workgroup: WORKGROUP
                .min(l.max_compute_invocations_per_workgroup)
                .min(l.max_compute_workgroup_size_x)
                .max(1),
            max_groups_per_dim: l.max_compute_workgroups_per_dimension.max(1),
            chunk_out: OUT_CAP,
        }
    }
}

/// One piece of `src`: bytes placed at a 4-byte aligned offset.
#[derive(Debug)]
pub(super) struct Region<'a> {
    /// Byte offset in `src`.
    pub offset: u64,
    /// The bytes (a tensor range, or a table built on the host).
    pub bytes: Cow<'a, [u8]>,
}

/// One dispatch: rows `rows` of the job.
#[derive(Debug)]
pub(super) struct Chunk<'a> {
    /// Flat rows (over all slices) this chunk decodes.
    pub rows: Range<usize>,
    /// The uniform block.
    pub params: Params,
    /// What to upload into `src`.
    pub regions: Vec<Region<'a>>,
    /// Bytes of `src` in use (multiple of 4).
    pub src_len: u64,
    /// Output bytes the chunk produces (elements · dtype size).
    pub out_len: u64,
    /// Output words the shader writes.
    pub out_words: u64,
    /// Workgroups in x and y.
    pub groups: (u32, u32),
    /// The kernel that decodes it.
    pub kernel: Kernel,
}

/// Builds `src` region by region.
#[derive(Default)]
struct Src<'a> {
    regions: Vec<Region<'a>>,
    len: u64,
}

impl<'a> Src<'a> {
    /// Appends `bytes`; returns their byte offset.
    fn push(&mut self, bytes: Cow<'a, [u8]>) -> u64 {
        let offset = self.len;
        self.len += (bytes.len() as u64).div_ceil(4) * 4;
        self.regions.push(Region { offset, bytes });
        offset
    }

    /// Appends f32 values; returns their word index.
    fn push_f32(&mut self, v: &[f32]) -> u32 {
        (self.push(Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect())) / 4) as u32
    }

    /// Appends bits `lo..hi` of `f` (widened to whole aligned words).
    fn push_fields(&mut self, f: &'a Fields<'_>, lo: u64, hi: u64) -> StreamParams {
        let start = (lo / 8) & !3;
        let end = hi.div_ceil(8).min(f.data.len() as u64).max(start);
        let offset = self.push(Cow::Borrowed(&f.data[start as usize..end as usize]));
        StreamParams {
            bits: f.bits,
            per_word: f.per_word,
            // Wrapping on purpose: the shader's u32 arithmetic is mod 2^32 and
            // every position it ends up with is small (see SRC_CAP).
            lane_bits: f.lane_bits as u32,
            word_bits: f.word_bits as u32,
            slice_bits: f.slice_bits as u32,
            base: (offset * 8).wrapping_sub(start * 8) as u32,
            interleave: f.interleaved as u32,
            swap: f.swap_mask() as u32,
            ..StreamParams::in_blocks(f.blocks.as_ref())
        }
    }

    /// Appends entries `lo..hi` of `v` (widened to whole aligned words).
    fn push_values(&mut self, v: &'a Values<'_>, dims: Dims, lo: usize, hi: usize) -> GridParams {
        let size = v.kind.size() as u64;
        let start = (lo as u64 * size) & !3;
        let end = (hi as u64 * size).min(v.data.len() as u64).max(start);
        let offset = self.push(Cow::Borrowed(&v.data[start as usize..end as usize]));
        let kind = GridKind::of(v);
        let (table, outer, per_outer, add) = match &v.kind {
            ValueKind::Table(t) => (self.push_f32(&t[..]), 0, 0, 0.0),
            ValueKind::Nested(n) => {
                let per = n.per_outer.max(1);
                let (first, last) = (lo / per, hi.div_ceil(per).min(n.outer.len()));
                let table = self.push_f32(&n.table[..]);
                let at = self.push_f32(n.outer.get(first..last.max(first)).unwrap_or(&[]));
                (table, at.wrapping_sub(first as u32), per as u32, n.offset)
            }
            _ => (0, 0, 0, 0.0),
        };
        GridParams {
            kind: kind as u32,
            size: size as u32,
            // Divisors at least the row/column count give quotient 0 either
            // way; clamping keeps them exact in u32.
            row_div: v.grid.row_div.min(dims.rows) as u32,
            col_div: v.grid.col_div.min(dims.cols) as u32,
            row_stride: v.grid.row_stride as u32,
            slice_stride: v.grid.slice_stride as u32,
            base: offset.wrapping_sub(start) as u32,
            table,
            outer,
            per_outer,
            offset: add,
            _pad: 0,
        }
    }
}

/// A sparse job's part of [`Params`].
#[derive(Default)]
struct SparseParams {
    mode: u32,
    block: u32,
    step: u32,
    per_block: u32,
    starts: u32,
    row0: u32,
}

fn too_big(detail: String) -> Error {
    Error::bare(Rule::Gpu, detail)
}

/// Grid entries rows `(s0, r0)..=(s1, r1)` read.
fn grid_range(
    v: &Values<'_>,
    cols: usize,
    (s0, r0): (usize, usize),
    (s1, r1): (usize, usize),
) -> (usize, usize) {
    let last_group = (cols - 1) / v.grid.col_div;
    let lo = v.grid.index(s0, r0, 0);
    let hi = v.grid.index(s1, r1, last_group) + 1;
    (lo.min(v.len()), hi.min(v.len()).max(lo.min(v.len())))
}

/// The chunk for flat rows `f0..f1`, or `None` when it exceeds the limits.
fn chunk<'a>(
    job: &'a DecodeJob<'_>,
    kernel: Kernel,
    f0: usize,
    f1: usize,
    limits: &Limits,
) -> Option<Chunk<'a>> {
    let d = job.dims;
    // The stored rows this chunk reads, first and last as (slice, row): a
    // transposed chunk reads every stored row of its slices.
    let sd = job.stored_dims();
    let (first, last) = if job.transposed {
        ((f0 / d.rows, 0), ((f1 - 1) / d.rows, sd.rows - 1))
    } else {
        (
            (f0 / d.rows, f0 % d.rows),
            ((f1 - 1) / d.rows, (f1 - 1) % d.rows),
        )
    };
    let mut src = Src::default();
    // Whole tables for the fast kernels, which load 16 or 256 entries
    // (codes in blocks are read as 4- or 8-bit fields).
    let table_len = match job.code_values.len() {
        n if n <= 16 => 16,
        n => n.max(256),
    };
    let mut table = job.code_values.to_vec();
    table.resize(table_len, 0.0);
    let code_table = src.push_f32(&table);
    let gidx = match &job.g_idx {
        Some(g) => {
            (src.push(Cow::Owned(g.iter().flat_map(|x| x.to_le_bytes()).collect())) / 4) as u32
        }
        None => NO_G_IDX,
    };
    let (codes, mask, sparse) = match &job.sparse {
        None => {
            let lo = job.codes.lane_start(first.0, first.1)?;
            let hi = job.codes.lane_end(last.0, last.1, sd.cols)?;
            let none = SparseParams {
                mode: SparseMode::None as u32,
                ..Default::default()
            };
            (src.push_fields(&job.codes, lo, hi), StreamParams::default(), none)
        }
        Some(sp) => {
            // The kept codes of the chunk's rows, their bits of the mask
            // and (unstructured) their blocks' starts.
            let bits = job.codes.bits as u64;
            let (k0, k1) = (sp.start(first.1, 0), sp.start(last.1 + 1, 0));
            let codes = src.push_fields(&job.codes, k0.checked_mul(bits)?, k1.checked_mul(bits)?);
            let lo = sp.mask.lane_start(0, first.1)?;
            let hi = sp.mask.lane_end(0, last.1, sd.cols)?;
            let mask = src.push_fields(&sp.mask, lo, hi);
            let params = match &sp.starts {
                Starts::Fixed { per_row, per_block } => SparseParams {
                    mode: SparseMode::Fixed as u32,
                    block: sp.block as u32,
                    step: *per_row as u32,
                    per_block: *per_block as u32,
                    ..Default::default()
                },
                Starts::Table { blocks, at } => {
                    let rows = at.get(first.1 * blocks..(last.1 + 1) * blocks)?;
                    let words: Vec<u8> = rows.iter().flat_map(|&k| (k as u32).to_le_bytes()).collect();
                    SparseParams {
                        mode: SparseMode::Table as u32,
                        block: sp.block as u32,
                        step: *blocks as u32,
                        per_block: 0,
                        starts: (src.push(Cow::Owned(words)) / 4) as u32,
                        row0: first.1 as u32,
                    }
                }
            };
            (codes, mask, params)
        }
    };

    let zero_mode = ZeroMode::of_job(job);
    let (zero, zgrid) = match (&job.zero, &job.offset) {
        (None, Some(v)) => {
            let (lo, hi) = grid_range(v, sd.cols, first, last);
            (StreamParams::default(), src.push_values(v, sd, lo, hi))
        }
        // One grid for both: no format has both.
        (Some(_), Some(_)) => return None,
        (zero, None) => match zero {
        None => (StreamParams::default(), GridParams::default()),
        Some(ZeroPoint::Packed { fields }) => {
            // Lanes are column groups; the rows of this chunk are a word range
            // of every lane, so take whole words from the first to the last.
            let (w0, _) = fields.locate(first.1);
            let (w1, _) = fields.locate(last.1);
            let lo = fields.lane_start(first.0, 0)? + w0 * fields.word_bits;
            let hi = fields.lane_start(last.0, 0)? + (w1 + 2) * fields.word_bits;
            (src.push_fields(fields, lo, hi), GridParams::default())
        }
        Some(ZeroPoint::PackedAlongCols { fields }) => {
            let lo = fields.lane_start(first.0, job.zero_lane(first.1))?;
            let hi = fields.lane_end(last.0, job.zero_lane(last.1), sd.cols)?;
            (src.push_fields(fields, lo, hi), GridParams::default())
        }
        Some(ZeroPoint::Plain(v)) => {
            let (lo, hi) = grid_range(v, sd.cols, first, last);
            (StreamParams::default(), src.push_values(v, sd, lo, hi))
        }
        },
    };
    let (has_scale, sgrid) = match &job.scale {
        None => (0, GridParams::default()),
        Some(v) => {
            let (lo, hi) = grid_range(v, sd.cols, first, last);
            (1, src.push_values(v, sd, lo, hi))
        }
    };

    // The low-rank branch: this chunk's rows of `up`, all of `down` and of
    // the smoothing reciprocals.
    let lr_mode = LowRankMode::of(job.low_rank.as_ref());
    let (lr_rank, lr_up, lr_down, lr_smooth) = match &job.low_rank {
        None => (0, 0, 0, 0),
        Some(lr) => (
            lr.rank as u32,
            src.push_f32(lr.up.get(f0 * lr.rank..f1 * lr.rank)?),
            src.push_f32(&lr.down),
            src.push_f32(&lr.inv_smooth),
        ),
    };

    let elems = ((f1 - f0) * d.cols) as u64;
    let out_kind = OutKind::of(job.out);
    let out_words = if out_kind == OutKind::F32 {
        elems
    } else {
        elems.div_ceil(2)
    };
    let (groups, words_per_row) = match kernel {
        Kernel::Generic => (out_words.div_ceil(limits.workgroup as u64), 0),
        Kernel::Fast(k) => {
            let per_row = d.cols.div_ceil((32 / k.bits) as usize) as u64;
            let invocations = (f1 - f0) as u64 * per_row.div_ceil(k.words as u64);
            (invocations.div_ceil(limits.workgroup as u64), per_row)
        }
        Kernel::Tile(k) => {
            // One workgroup per tile; transposed tiles start on a code word.
            let (tr, tc) = k.size();
            let lead = k.lead(f0 % d.rows);
            let tiles = ((f1 - f0 + lead) as u64).div_ceil(tr as u64)
                * (d.cols as u64).div_ceil(tc as u64);
            (tiles, 0)
        }
    };
    let code_offset = code_offset(job);
    let x = groups.min(limits.max_groups_per_dim as u64).max(1);
    let y = groups.div_ceil(x).max(1);
    let src_cap = limits.max_binding.min(SRC_CAP);
    if src.len > src_cap || out_words * 4 > limits.out_cap() || y > limits.max_groups_per_dim as u64
    {
        return None;
    }
    let params = Params {
        rows: d.rows as u32,
        cols: d.cols as u32,
        first_row: f0 as u32,
        elems: elems as u32,
        out_kind: out_kind as u32,
        zero_mode: zero_mode as u32,
        has_scale,
        gidx,
        code_table,
        row_threads: x as u32 * limits.workgroup,
        lr_mode: lr_mode as u32,
        lr_rank,
        lr_up,
        lr_down,
        lr_smooth,
        zero_bits: 0,
        words_per_row: words_per_row as u32,
        fast_rows: (f1 - f0) as u32,
        code_offset,
        // The output's slice and row of f0 (a transposed chunk reads from
        // stored row 0 of its slices on).
        slice0: (f0 / d.rows) as u32,
        row0: (f0 % d.rows) as u32,
        out_base: 0,
        transposed: job.transposed as u32,
        post_scale: job.post_scale.unwrap_or(1.0),
        product: product_kind(job) as u32,
        sp_mode: sparse.mode,
        sp_block: sparse.block,
        sp_step: sparse.step,
        sp_per_block: sparse.per_block,
        sp_starts: sparse.starts,
        sp_row0: sparse.row0,
        pad: 0,
        codes,
        zero,
        mask,
        zgrid,
        sgrid,
    };
    Some(Chunk {
        rows: f0..f1,
        params,
        regions: src.regions,
        src_len: src.len.max(4),
        out_len: elems * job.out.size() as u64,
        out_words,
        groups: (x as u32, y as u32),
        kernel,
    })
}

/// Splits rows `rows` of `job` into chunks that fit `limits`. Every chunk but
/// the last produces a multiple of 4 output bytes, so chunk outputs can be
/// copied back to back into one buffer.
pub(super) fn plan<'a>(
    job: &'a DecodeJob<'_>,
    kernel: Kernel,
    rows: Range<usize>,
    limits: &Limits,
) -> Result<Vec<Chunk<'a>>> {
    let d = job.dims;
    if rows.is_empty() || d.cols == 0 {
        return Ok(Vec::new());
    }
    if u32::try_from(d.total_rows()).is_err() || d.cols >= 1 << 28 {
        return Err(too_big(format!(
            "{}x{} is beyond the GPU path's u32 indexing",
            d.total_rows(),
            d.cols
        )));
    }
    let row_out = (d.cols * job.out.size()) as u64;
    // Rows per chunk must keep chunk outputs word-aligned (rows are 2 or 4
    // bytes per element, so two rows always are).
    let unit = if row_out.is_multiple_of(4) { 1 } else { 2 };
    let fit = (limits.out_cap() / row_out) as usize;
    let mut per = (fit / unit * unit).max(unit);
    // Whole tiles, where they fit.
    if let Kernel::Tile(k) = kernel {
        let rows = k.size().0 as usize;
        if per >= rows {
            per = per / rows * rows;
        }
    }
    let mut chunks = Vec::new();
    let mut f = rows.start;
    while f < rows.end {
        let n = per.min(rows.end - f);
        match chunk(job, kernel, f, f + n, limits) {
            Some(c) => {
                chunks.push(c);
                f += n;
            }
            None if n > unit => per = (n / 2 / unit * unit).max(unit),
            None => {
                return Err(too_big(format!(
                    "{n} rows of {} columns do not fit this adapter's {} byte storage binding",
                    d.cols, limits.max_binding
                )))
            }
        }
    }
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Grid;
    use std::collections::HashMap;

    fn shader() -> naga::Module {
        naga::front::wgsl::parse_str(super::super::shader::SHADER).expect("the decode module parses")
    }

    /// The shader's `Params` as naga reads it: every scalar member, nested
    /// structs flattened into dotted paths, with its byte offset.
    fn shader_params() -> (Vec<(String, u32)>, u32) {
        let module = shader();
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).expect("layout");
        let uniform = module
            .global_variables
            .iter()
            .find(|(_, g)| g.space == naga::AddressSpace::Uniform)
            .expect("one uniform")
            .1;
        fn flatten(
            module: &naga::Module,
            ty: naga::Handle<naga::Type>,
            path: &str,
            at: u32,
            out: &mut Vec<(String, u32)>,
        ) {
            match &module.types[ty].inner {
                naga::TypeInner::Struct { members, .. } => {
                    for m in members {
                        let name = m.name.clone().unwrap_or_default();
                        let path = if path.is_empty() {
                            name
                        } else {
                            format!("{path}.{name}")
                        };
                        flatten(module, m.ty, &path, at + m.offset, out);
                    }
                }
                _ => out.push((path.to_string(), at)),
            }
        }
        let mut members = Vec::new();
        flatten(&module, uniform.ty, "", 0, &mut members);
        (members, layouter[uniform.ty].size)
    }

    /// The host's `Params` is laid out exactly as the shader reads it: the
    /// same members, in the same order, at the same offsets, the same size.
    #[test]
    fn params_match_the_shader_uniform() {
        use std::mem::offset_of;
        /// (path, offset) of each named field of `$ty`, `$at` bytes in.
        macro_rules! fields {
            ($ty:ty, $prefix:expr, $at:expr; $($field:ident),* $(,)?) => {
                vec![$((
                    format!("{}{}", $prefix, stringify!($field)),
                    ($at + offset_of!($ty, $field)) as u32,
                )),*]
            };
        }
        let mut host = fields![Params, "", 0; rows, cols, first_row, elems, out_kind,
            zero_mode, has_scale, gidx, code_table, row_threads, lr_mode, lr_rank, lr_up,
            lr_down, lr_smooth, zero_bits, words_per_row, fast_rows, code_offset, slice0,
            row0, out_base, transposed, post_scale, product, sp_mode, sp_block, sp_step,
            sp_per_block, sp_starts, sp_row0, pad];
        for (name, at) in [
            ("codes.", offset_of!(Params, codes)),
            ("zero.", offset_of!(Params, zero)),
            ("mask.", offset_of!(Params, mask)),
        ] {
            host.extend(
                fields![StreamParams, name, at; bits, per_word, lane_bits, word_bits,
                slice_bits, base, interleave, swap, block_len, block_bits, pad0, pad1, low, high],
            );
        }
        for (name, at) in [
            ("zgrid.", offset_of!(Params, zgrid)),
            ("sgrid.", offset_of!(Params, sgrid)),
        ] {
            host.extend(
                fields![GridParams, name, at; kind, size, row_div, col_div, row_stride,
                slice_stride, base, table, outer, per_outer, offset],
            );
            let pad = (at + offset_of!(GridParams, _pad)) as u32;
            host.push((format!("{name}_pad1"), pad));
        }
        let (shader, size) = shader_params();
        assert_eq!(
            host, shader,
            "Params members and offsets, host vs decode.wgsl"
        );
        assert_eq!(std::mem::size_of::<Params>() as u32, size, "Params size");
    }

    /// Every value the host writes into `Params` or an override constant is
    /// the number of the decode.wgsl `const` its enum variant names, and
    /// every u32 `const` there is one of them: a value added, renumbered or
    /// renamed on one side only fails here, not as wrong bytes on a GPU.
    #[test]
    fn protocol_matches_the_shader_constants() {
        let module = shader();
        let shader: HashMap<String, u32> = module
            .constants
            .iter()
            .filter_map(|(_, c)| match module.global_expressions[c.init] {
                naga::Expression::Literal(naga::Literal::U32(v)) => Some((c.name.clone()?, v)),
                _ => None,
            })
            .collect();
        fn values<T: Copy + Into<u32>>(all: &[(T, &'static str)]) -> Vec<(&'static str, u32)> {
            all.iter().map(|&(v, name)| (name, v.into())).collect()
        }
        let host: Vec<(&str, u32)> = [
            values(GridKind::WGSL),
            values(OutKind::WGSL),
            values(ZeroMode::WGSL),
            values(LowRankMode::WGSL),
            values(CodeKind::WGSL),
            values(Pack::WGSL),
            values(SparseMode::WGSL),
            vec![("NO_G_IDX", NO_G_IDX)],
        ]
        .concat();
        for (name, value) in &host {
            assert_eq!(
                shader.get(*name),
                Some(value),
                "{name}: host vs decode.wgsl"
            );
        }
        let mut unmatched: Vec<&String> = shader
            .keys()
            .filter(|name| !host.iter().any(|(n, _)| n == name))
            .collect();
        unmatched.sort();
        assert!(
            unmatched.is_empty(),
            "decode.wgsl constants no host enum names: {unmatched:?}"
        );

        // The override constants the host sets, and the entry points it runs.
        let fast = Fast {
            bits: 4,
            code: CodeKind::Table,
            out: OutKind::Bf16,
            zero: ZeroMode::None,
            scaled: true,
            low_rank: LowRankMode::None,
            skind: GridKind::Bf16,
            zkind: GridKind::F32,
            high_first: true,
            post: true,
            product: OutKind::F16,
            copy: false,
            blocked: true,
            words: 4,
        };
        let tile = Tile {
            bits: 4,
            code: CodeKind::Offset,
            out: OutKind::Bf16,
            zero: ZeroMode::PackedAlongCols,
            scaled: true,
            pack: Pack::Transposed,
            interleaved: true,
            word_groups: false,
            shared: true,
            gidx: false,
            skind: GridKind::F16,
            zkind: GridKind::Bf16,
            copy: false,
        };
        let constants = fast.constants().into_iter().chain(tile.constants());
        for (name, _) in constants.chain([("WG", 0.0)]) {
            assert!(
                module
                    .overrides
                    .iter()
                    .any(|(_, o)| o.name.as_deref() == Some(name)),
                "decode.wgsl has no override {name}"
            );
        }
        for kernel in [Kernel::Generic, Kernel::Fast(fast), Kernel::Tile(tile)] {
            assert!(
                module.entry_points.iter().any(
                    |e| e.name == kernel.entry_point() && e.stage == naga::ShaderStage::Compute
                ),
                "decode.wgsl has no compute entry point {}",
                kernel.entry_point()
            );
        }
    }

    fn job(
        data: &[u8],
        scale: &[u8],
        rows: usize,
        cols: usize,
        out: OutDtype,
    ) -> DecodeJob<'static> {
        let data: &'static [u8] = Box::leak(data.to_vec().into_boxed_slice());
        let scale: &'static [u8] = Box::leak(scale.to_vec().into_boxed_slice());
        let words = (cols * 4).div_ceil(32);
        DecodeJob {
            dims: Dims {
                slices: 1,
                rows,
                cols,
            },
            codes: Fields {
                data: data.into(),
                bits: 4,
                per_word: 0,
                interleaved: false,
                lane_bits: words as u64 * 32,
                word_bits: 32,
                slice_bits: (rows * words) as u64 * 32,
                high_first: false,
                blocks: None,
            },
            code_values: (0..16).map(|v| v as f32 - 8.0).collect(),
            zero: None,
            scale: Some(Values {
                data: scale.into(),
                kind: ValueKind::Bf16,
                grid: Grid {
                    row_div: 1,
                    col_div: cols,
                    row_stride: 1,
                    slice_stride: rows,
                },
            }),
            g_idx: None,
            low_rank: None,
            post_scale: None,
            offset: None,
            product: Default::default(),
            sparse: None,
            transposed: false,
            out,
        }
    }

    #[test]
    fn chunks_cover_rows_within_limits() {
        let (rows, cols): (usize, usize) = (1000, 33);
        let data = vec![0u8; rows * (cols * 4).div_ceil(32) * 4];
        let scale = vec![0u8; rows * 2];
        let j = job(&data, &scale, rows, cols, OutDtype::Bf16);
        let limits = Limits {
            max_binding: 4096,
            offset_align: 256,
            workgroup: WORKGROUP,
            max_groups_per_dim: 3,
            chunk_out: OUT_CAP,
        };
        let chunks = plan(&j, Kernel::Generic, 0..rows, &limits).unwrap();
        let mut next = 0;
        for c in &chunks {
            assert_eq!(c.rows.start, next);
            next = c.rows.end;
            assert!(c.src_len <= 4096 && c.out_words * 4 <= 4096 - 256);
            assert!(c.groups.0 <= 3 && c.groups.1 <= 3);
            if c.rows.end != rows {
                assert_eq!(c.out_len % 4, 0, "odd bf16 counts only in the last chunk");
            }
            for r in &c.regions {
                assert_eq!(r.offset % 4, 0);
            }
        }
        assert_eq!(next, rows);
        assert!(chunks.len() > 1);
    }

    #[test]
    fn whole_offsets_are_computed_and_other_tables_read() {
        let mut j = job(&[0; 8], &[0; 2], 1, 8, OutDtype::F32);
        // GPTQ's unsigned codes, a signed int4's, int3's widened to 4 bits.
        for offset in [0.0, 8.0, 4.0] {
            j.code_values = (0..16).map(|c| c as f32 - offset).collect();
            assert_eq!((CodeKind::of(&j), code_offset(&j)), (CodeKind::Offset, offset));
        }
        j.code_values = (0..16).map(|c| c as f32 - 7.5).collect();
        assert_eq!(CodeKind::of(&j), CodeKind::Table);
        j.code_values = (0..16).map(|c| if c == 3 { 0.0 } else { c as f32 }).collect();
        assert_eq!(CodeKind::of(&j), CodeKind::Table);
        j.code_values = vec![f32::NAN; 16].into();
        assert_eq!((CodeKind::of(&j), code_offset(&j)), (CodeKind::Table, 0.0));
    }

    #[test]
    fn an_invocation_takes_as_many_words_as_every_group_holds_whole() {
        let (rows, cols) = (2, 300);
        let mut j = job(&[0; 600], &[0; 4], rows, cols, OutDtype::Bf16);
        let words = |j: &DecodeJob<'_>| Fast::for_job(j).map(|k| k.words);
        // One scale per row, then groups of 128, 16 and 8 4-bit codes.
        assert_eq!(words(&j), Some(4));
        for (g, want) in [(128, 4), (16, 2), (8, 1)] {
            let s = j.scale.as_mut().unwrap();
            s.grid = Grid {
                row_div: 1,
                col_div: g,
                row_stride: cols.div_ceil(g),
                slice_stride: rows * cols.div_ceil(g),
            };
            assert_eq!(words(&j), Some(want), "groups of {g}");
        }
        // The offset's groups count too.
        j.offset = j.scale.clone();
        j.scale.as_mut().unwrap().grid.col_div = 32;
        assert_eq!(words(&j), Some(1));
    }

    #[test]
    fn a_row_too_wide_is_an_error_not_a_panic() {
        let (rows, cols) = (2, 4096);
        let data = vec![0u8; rows * cols / 2];
        let scale = vec![0u8; rows * 2];
        let j = job(&data, &scale, rows, cols, OutDtype::F32);
        let limits = Limits {
            max_binding: 1024,
            offset_align: 256,
            workgroup: WORKGROUP,
            max_groups_per_dim: 65535,
            chunk_out: OUT_CAP,
        };
        let e = plan(&j, Kernel::Generic, 0..rows, &limits).unwrap_err();
        assert_eq!(e.rule, Rule::Gpu);
    }
}

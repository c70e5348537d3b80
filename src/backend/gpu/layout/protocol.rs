//! The host↔shader protocol: the numbers the host writes into `Params` and
//! the override constants, each a `#[repr(u32)]` enum that a test here
//! holds to the decode module's `const`s, and the `#[repr(C)]` structs
//! that mirror its uniform block (both in shaders/decode/protocol.wgsl),
//! with the rules that pick a job's values.

use bytemuck::{Pod, Zeroable};

use crate::job::{DecodeJob, InBlocks, LowRank, Plane, ValueKind, Values, ZeroPoint};
use crate::numerics::{self, OutDtype};

/// Invocations per workgroup unless the decoder is told otherwise (`WG` in
/// shaders/decode/protocol.wgsl): a multiple of every GPU's SIMD width (32
/// or 64) that keeps occupancy high on all of them.
pub(in crate::backend::gpu) const WORKGROUP: u32 = 256;

/// A value the shader reads from `Params` or an override constant: a
/// `#[repr(u32)]` enum whose discriminants are the shader's numbers, each
/// variant naming the `const` of shaders/decode/protocol.wgsl it stands for,
/// so that the test `protocol_matches_the_shader_constants` can hold both to
/// one number.
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
            /// Every value with the name of its constant in protocol.wgsl.
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
        /// Rank 0, `(q·s) · inv_smooth` in the job's product dtype
        /// ([`LowRank::in_product`]).
        SmoothInProduct = 3 as LOW_RANK_SMOOTH_IN_PRODUCT,
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
        /// A table of 4-bit codes whose values are integers of −128..=127
        /// (GGUF's IQ4 and IQ2 codes): read from bytes in registers, four
        /// selects fewer a value than `Table`'s f32 entries.
        SmallTable = 5 as CODE_SMALL_TABLE,
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
    /// where its blocks start, as [`Starts`](crate::job::Starts) says.
    pub enum SparseMode {
        None = 0 as SPARSE_NONE,
        Fixed = 1 as SPARSE_FIXED,
        Table = 2 as SPARSE_TABLE,
    }
}

/// `Params::gidx` of a job without g_idx (`NO_G_IDX` in protocol.wgsl).
pub(in crate::backend::gpu) const NO_G_IDX: u32 = u32::MAX;

impl OutKind {
    pub(super) fn of(out: OutDtype) -> OutKind {
        match out {
            OutDtype::F32 => OutKind::F32,
            OutDtype::Bf16 => OutKind::Bf16,
            OutDtype::F16 => OutKind::F16,
        }
    }
}

impl ZeroMode {
    /// The mode of `job`: its zero point's, or its offset's.
    pub(super) fn of_job(job: &DecodeJob<'_>) -> ZeroMode {
        match &job.offset {
            Some(_) => ZeroMode::Offset,
            None => ZeroMode::of(job.zero.as_ref()),
        }
    }

    pub(super) fn of(zero: Option<&ZeroPoint<'_>>) -> ZeroMode {
        match zero {
            None => ZeroMode::None,
            Some(ZeroPoint::Packed { .. }) => ZeroMode::Packed,
            Some(ZeroPoint::Plain(_)) => ZeroMode::Plain,
            Some(ZeroPoint::PackedAlongCols { .. }) => ZeroMode::PackedAlongCols,
        }
    }
}

impl LowRankMode {
    pub(super) fn of(low_rank: Option<&LowRank>) -> LowRankMode {
        match low_rank {
            None => LowRankMode::None,
            Some(lr) if lr.in_product && lr.rank == 0 => LowRankMode::SmoothInProduct,
            Some(lr) if lr.smooth_first => LowRankMode::SmoothFirst,
            Some(_) => LowRankMode::SmoothLast,
        }
    }
}

/// Mirrors `Stream` in shaders/decode/protocol.wgsl.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Pod, Zeroable)]
pub(in crate::backend::gpu) struct StreamParams {
    pub(super) bits: u32,
    pub(super) per_word: u32,
    pub(super) lane_bits: u32,
    pub(super) word_bits: u32,
    pub(super) slice_bits: u32,
    pub(super) base: u32,
    pub(super) interleave: u32,
    /// XORed with a field's bit position
    /// ([`Fields::swap_mask`](crate::job::Fields::swap_mask): 4 for
    /// bitsandbytes' high-nibble-first bytes).
    pub(super) swap: u32,
    /// Fields per block ([`crate::job::InBlocks`]); 0: not in blocks.
    pub(super) block_len: u32,
    pub(super) block_bits: u32,
    /// Lanes a part ([`crate::job::Parts`]); 0: no parts. The parts' `top`
    /// is in `base`.
    pub(super) part_lanes: u32,
    /// Bits from one part down to the next.
    pub(super) part_down: u32,
    /// The low plane: its first byte in the block, bits, span, 0.
    pub(super) low: [u32; 4],
    /// The high plane; bits 0: none.
    pub(super) high: [u32; 4],
}

impl StreamParams {
    /// The block geometry of a stream (none: zeros).
    pub(super) fn in_blocks(b: Option<&InBlocks>) -> StreamParams {
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

/// Mirrors `Grid` in shaders/decode/protocol.wgsl.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub(in crate::backend::gpu) struct GridParams {
    /// [`GridKind`].
    pub(super) kind: u32,
    pub(super) size: u32,
    pub(super) row_div: u32,
    pub(super) col_div: u32,
    pub(super) row_stride: u32,
    pub(super) slice_stride: u32,
    pub(super) base: u32,
    pub(super) table: u32,
    /// [`GridKind::Nested`]: word index in `src` of the outer factor of
    /// entry 0 (wrapping: entry i reads word `outer + i / per_outer`).
    pub(super) outer: u32,
    pub(super) per_outer: u32,
    pub(super) offset: f32,
    /// [`GridKind::Nested`]: outer factors before they repeat (0: never;
    /// [`crate::job::Nested::cycle`]).
    pub(super) cycle: u32,
    /// [`GridKind::Nested`]: word index in `src` of entry 0's addend
    /// (wrapping, as `outer`), or [`NO_G_IDX`] where `offset` is added.
    pub(super) adds: u32,
    /// [`GridKind::Nested`]: the [`OutKind`] each step rounds to.
    pub(super) round: u32,
    /// Keeps the grid 16-byte sized, as a uniform's structs must be.
    pub(super) spare: u32,
    pub(super) _pad: u32,
}

/// Mirrors `Params` in shaders/decode/protocol.wgsl.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub(in crate::backend::gpu) struct Params {
    pub(super) rows: u32,
    pub(super) cols: u32,
    pub(super) first_row: u32,
    pub(super) elems: u32,
    /// [`OutKind`].
    pub(super) out_kind: u32,
    /// [`ZeroMode`].
    pub(super) zero_mode: u32,
    pub(super) has_scale: u32,
    /// A word index, or [`NO_G_IDX`].
    pub(super) gidx: u32,
    pub(super) code_table: u32,
    /// Invocations per row of the dispatch grid.
    pub row_threads: u32,
    /// [`LowRankMode`].
    pub(super) lr_mode: u32,
    pub(super) lr_rank: u32,
    pub(super) lr_up: u32,
    pub(super) lr_down: u32,
    pub(super) lr_smooth: u32,
    pub(super) zero_bits: u32,
    pub(super) words_per_row: u32,
    pub(super) fast_rows: u32,
    pub(super) code_offset: f32,
    pub(super) slice0: u32,
    pub(super) row0: u32,
    pub(super) out_base: u32,
    pub(super) transposed: u32,
    /// [`DecodeJob::post_scale`], 1.0 without one.
    pub(super) post_scale: f32,
    /// The [`OutKind`] the scaled value is computed in
    /// ([`DecodeJob::product_dtype`]; `F32` when it is f32).
    pub(super) product: u32,
    /// [`SparseMode`].
    pub(super) sp_mode: u32,
    /// [`Sparse::block`](crate::job::Sparse::block).
    pub(super) sp_block: u32,
    /// [`Starts::Fixed`](crate::job::Starts::Fixed): kept codes per row;
    /// [`Starts::Table`](crate::job::Starts::Table): blocks per row.
    pub(super) sp_step: u32,
    /// [`Starts::Fixed`](crate::job::Starts::Fixed): kept codes per block.
    pub(super) sp_per_block: u32,
    /// [`Starts::Table`](crate::job::Starts::Table): word index of the
    /// chunk's first row's starts.
    pub(super) sp_starts: u32,
    /// [`Starts::Table`](crate::job::Starts::Table): the stored row those are of.
    pub(super) sp_row0: u32,
    /// [`LowRank::period`](crate::job::LowRank::period): rows of smoothing
    /// reciprocals before they repeat (1: one a column).
    pub(super) lr_period: u32,
    /// [`LowRank::row_div`](crate::job::LowRank::row_div): rows sharing
    /// one row of them.
    pub(super) lr_row_div: u32,
    /// Keep `codes` 16-byte aligned, as a uniform's structs must be.
    pub(super) pad0: u32,
    pub(super) pad1: u32,
    pub(super) pad2: u32,
    pub(super) codes: StreamParams,
    pub(super) zero: StreamParams,
    /// The bitmask of a sparse job.
    pub(super) mask: StreamParams,
    pub(super) zgrid: GridParams,
    pub(super) sgrid: GridParams,
}

/// The [`OutKind`] a job's scaled value is computed in (`F32`: in f32).
pub(super) fn product_kind(job: &DecodeJob<'_>) -> OutKind {
    job.product_dtype().map_or(OutKind::F32, OutKind::of)
}

/// The offset of [`CodeKind::Offset`]: what code 0 stands for, negated
/// (GPTQ's unsigned codes 0, a signed int4's 8, int3 widened to 4 bits 4).
/// Whole, from 0 to 2^bits, so that `code - offset` is an integer of at
/// most 8 bits' magnitude: exact in f32, bf16 and f16 (fast_scaled).
pub(super) fn code_offset(job: &DecodeJob<'_>) -> f32 {
    let most = (1u32 << job.codes.bits.min(8)) as f32;
    match job.code_values.first().map(|v| -v) {
        Some(o) if (0.0..=most).contains(&o) => o.trunc(),
        _ => 0.0,
    }
}

/// Whether `v` is an integer of −128..=127 whose bits an i8 gives back
/// (not −0.0).
fn small_integer(v: f32) -> bool {
    (-128.0..=127.0).contains(&v) && (v as i8 as f32).to_bits() == v.to_bits()
}

impl CodeKind {
    /// Which formula gives `job`'s code table (4- or 8-bit codes; a NaN
    /// stands for any NaN: outputs write one canonical NaN).
    pub(super) fn of(job: &DecodeJob<'_>) -> CodeKind {
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
        } else if c.bits <= 4 && cv.len() <= 16 && cv.iter().all(|&v| small_integer(v)) {
            CodeKind::SmallTable
        } else {
            CodeKind::Table
        }
    }
}

impl GridKind {
    /// How `v`'s entries are stored.
    pub(in crate::backend::gpu) fn of(v: &Values<'_>) -> GridKind {
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
    pub(super) fn fast(v: &Values<'_>) -> GridKind {
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

impl Params {
    /// The parameters of a dense `rows × cols` bf16 weight, two values to
    /// a word, for the products' dense baseline (`gemv_dense`, whose kernel
    /// is shaders/matmul/others.wgsl's `product_dense`).
    pub(in crate::backend::gpu) fn dense_bf16(rows: u32, cols: u32) -> Params {
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
    pub(in crate::backend::gpu) fn group_words(&self) -> u32 {
        // Codes in blocks are read as words of 4- or 8-bit fields, whatever
        // their own width (Fast::for_job).
        let bits = match (self.codes.block_len, self.codes.bits) {
            (0, bits) => bits,
            (_, 0..=4) => 4,
            _ => 8,
        };
        let per = 32 / bits.max(1);
        let scale = (self.has_scale != 0).then_some(self.sgrid.col_div);
        let grid = [ZeroMode::Plain as u32, ZeroMode::Offset as u32].contains(&self.zero_mode);
        let zero = grid.then_some(self.zgrid.col_div);
        let along_row = |d: &u32| *d < self.cols;
        scale
            .into_iter()
            .chain(zero)
            .filter(along_row)
            .fold(0, |g, d| {
                crate::job::gcd(g as usize, (d / per).max(1) as usize) as u32
            })
    }

    /// Whether every row's (lane's) codes start on a 32-bit word.
    pub(in crate::backend::gpu) fn lanes_aligned(&self) -> bool {
        let c = &self.codes;
        (c.base | c.lane_bits | c.slice_bits).is_multiple_of(32)
    }

    /// The same chunk writing its output `words` words into the bound
    /// output buffer.
    pub(in crate::backend::gpu) fn at_word(self, words: u32) -> Params {
        Params {
            out_base: words,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{job, Fast, Kernel, Tile};
    use super::*;
    use std::collections::HashMap;

    fn shader() -> naga::Module {
        naga::front::wgsl::parse_str(crate::backend::gpu::shader::SHADER)
            .expect("the decode module parses")
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
            sp_per_block, sp_starts, sp_row0, lr_period, lr_row_div, pad0, pad1, pad2];
        for (name, at) in [
            ("codes.", offset_of!(Params, codes)),
            ("zero.", offset_of!(Params, zero)),
            ("mask.", offset_of!(Params, mask)),
        ] {
            host.extend(
                fields![StreamParams, name, at; bits, per_word, lane_bits, word_bits,
                slice_bits, base, interleave, swap, block_len, block_bits, part_lanes, part_down, low, high],
            );
        }
        for (name, at) in [
            ("zgrid.", offset_of!(Params, zgrid)),
            ("sgrid.", offset_of!(Params, sgrid)),
        ] {
            host.extend(
                fields![GridParams, name, at; kind, size, row_div, col_div, row_stride,
                slice_stride, base, table, outer, per_outer, offset, cycle, adds, round, spare],
            );
            let pad = (at + offset_of!(GridParams, _pad)) as u32;
            host.push((format!("{name}_pad1"), pad));
        }
        let (shader, size) = shader_params();
        assert_eq!(
            host, shader,
            "Params members and offsets, host vs protocol.wgsl"
        );
        assert_eq!(std::mem::size_of::<Params>() as u32, size, "Params size");
    }

    /// Every value the host writes into `Params` or an override constant is
    /// the number of the decode module's `const` its enum variant names, and
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
                "{name}: host vs protocol.wgsl"
            );
        }
        let mut unmatched: Vec<&String> = shader
            .keys()
            .filter(|name| !host.iter().any(|(n, _)| n == name))
            .collect();
        unmatched.sort();
        assert!(
            unmatched.is_empty(),
            "decode module constants no host enum names: {unmatched:?}"
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
                "the decode module has no override {name}"
            );
        }
        for kernel in [Kernel::Generic, Kernel::Fast(fast), Kernel::Tile(tile)] {
            assert!(
                module.entry_points.iter().any(
                    |e| e.name == kernel.entry_point() && e.stage == naga::ShaderStage::Compute
                ),
                "the decode module has no compute entry point {}",
                kernel.entry_point()
            );
        }
    }

    #[test]
    fn whole_offsets_are_computed_and_other_tables_read() {
        let mut j = job(&[0; 8], &[0; 2], 1, 8, OutDtype::F32);
        // GPTQ's unsigned codes, a signed int4's, int3's widened to 4 bits.
        for offset in [0.0, 8.0, 4.0] {
            j.code_values = (0..16).map(|c| c as f32 - offset).collect();
            assert_eq!(
                (CodeKind::of(&j), code_offset(&j)),
                (CodeKind::Offset, offset)
            );
        }
        j.code_values = (0..16).map(|c| c as f32 - 7.5).collect();
        assert_eq!(CodeKind::of(&j), CodeKind::Table);
        // Other integers of an i8 (GGUF's IQ4 codes) are read from bytes;
        // −0.0, which a byte cannot give back, and 128 are not.
        j.code_values = (0..16)
            .map(|c| if c == 3 { 0.0 } else { c as f32 })
            .collect();
        assert_eq!(CodeKind::of(&j), CodeKind::SmallTable);
        let iq4 = [
            -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
        ];
        j.code_values = iq4.iter().map(|&v| v as f32).collect();
        assert_eq!(CodeKind::of(&j), CodeKind::SmallTable);
        for odd in [-0.0, 128.0, 1.5] {
            j.code_values = (0..16)
                .map(|c| if c == 5 { odd } else { 3.0 * c as f32 - 20.0 })
                .collect();
            assert_eq!(CodeKind::of(&j), CodeKind::Table, "{odd}");
        }
        j.code_values = vec![f32::NAN; 16].into();
        assert_eq!((CodeKind::of(&j), code_offset(&j)), (CodeKind::Table, 0.0));
    }
}

//! Which kernel a job runs (the generic `main`, the fast kernel, the tile
//! kernel), the host's rules for the jobs each takes, and the override
//! constants that specialise it (shaders/decode/fast.wgsl, tile.wgsl).

use super::protocol::{product_kind, CodeKind, GridKind, LowRankMode, OutKind, Pack, ZeroMode};
use crate::job::{DecodeJob, Fields, InBlocks, Plane, Values, ZeroPoint};

/// The kernel a chunk runs: `main` in shaders/decode/generic.wgsl, or `fast`
/// (fast.wgsl) or `fast_t` (tile.wgsl) specialised by its override
/// constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(in crate::backend::gpu) enum Kernel {
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
pub(in crate::backend::gpu) struct Tile {
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
pub(in crate::backend::gpu) struct Fast {
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

/// `BITS`, `CODE`, `OUT`, `ZERO` and `SCALED`: the constants both the fast
/// and the tile kernel have.
type Shared = (u32, CodeKind, OutKind, ZeroMode, bool);

/// [`Shared`] as wgpu takes them.
fn shared_constants((bits, code, out, zero, scaled): Shared) -> [(&'static str, f64); 5] {
    [
        ("BITS", bits as f64),
        ("CODE", code as u32 as f64),
        ("OUT", out as u32 as f64),
        ("ZERO", zero as u32 as f64),
        ("SCALED", flag(scaled)),
    ]
}

/// A flag as an override constant.
fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

impl Kernel {
    /// Its entry point in the decode module.
    pub(in crate::backend::gpu) fn entry_point(&self) -> &'static str {
        match self {
            Kernel::Generic => "main",
            Kernel::Fast(_) => "fast",
            Kernel::Tile(_) => "fast_t",
        }
    }

    /// What a validation message names its pipeline and pass by.
    pub(in crate::backend::gpu) fn label(&self) -> String {
        let baseline = |copy: bool| if copy { " copy baseline" } else { "" };
        // The constants both kernels have, `codes` after the code kind.
        let shared = |(bits, code, out, zero, scaled): Shared, codes: &str| {
            let not = if scaled { "" } else { "not " };
            format!("{bits}-bit {code:?} codes{codes}, {out:?} out, zero {zero:?}, {not}scaled")
        };
        match self {
            Kernel::Generic => "wgpu-dequant main".into(),
            Kernel::Fast(k) => format!(
                "wgpu-dequant fast{} ({}, low rank {:?})",
                baseline(k.copy),
                shared((k.bits, k.code, k.out, k.zero, k.scaled), ""),
                k.low_rank,
            ),
            Kernel::Tile(k) => {
                let pack = format!(
                    " {:?}{}",
                    k.pack,
                    if k.interleaved { " interleaved" } else { "" }
                );
                format!(
                    "wgpu-dequant fast_t{} ({}{})",
                    baseline(k.copy),
                    shared((k.bits, k.code, k.out, k.zero, k.scaled), &pack),
                    if k.word_groups {
                        ""
                    } else {
                        ", groups per code"
                    },
                )
            }
        }
    }
}

impl Fast {
    /// The constants as wgpu takes them.
    pub(in crate::backend::gpu) fn constants(&self) -> Vec<(&'static str, f64)> {
        let mut c = vec![("WORDS", self.words as f64)];
        c.extend(shared_constants((
            self.bits,
            self.code,
            self.out,
            self.zero,
            self.scaled,
        )));
        c.extend([
            ("LOW_RANK", self.low_rank as u32 as f64),
            ("SKIND", self.skind as u32 as f64),
            ("ZKIND", self.zkind as u32 as f64),
            ("HIGH_FIRST", flag(self.high_first)),
            ("POST", flag(self.post)),
            ("PRODUCT", self.product as u32 as f64),
            ("COPY", flag(self.copy)),
            ("BLOCKED", flag(self.blocked)),
        ]);
        c
    }

    /// The fast kernel for `job`, when it fits: a dense 4- or 8-bit code
    /// stream (or codes in blocks read as such: [`Fast::blocks_fit`]), no
    /// g_idx, scale and zero-point groups of whole code words, and (16-bit
    /// outputs) an even column count, so that no output word is shared by
    /// two invocations.
    pub(in crate::backend::gpu) fn for_job(job: &DecodeJob<'_>) -> Option<Fast> {
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
            || c.parts.is_some()
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
    /// once a run (what that gained on llvmpipe, GGUF's Q5_K with two
    /// lookups a word of 4 codes among others:
    /// docs/performance.md#gpu-decode-kernels).
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

impl Tile {
    /// Rows before `row` (a row of its slice) in its code word, where a
    /// transposed tile starts; none for strided packs.
    pub(in crate::backend::gpu) fn lead(&self, row: usize) -> usize {
        match self.pack {
            Pack::Transposed => row % (32 / self.bits) as usize,
            Pack::Strided => 0,
        }
    }

    /// Code words an invocation decodes, and its tile's runs along the
    /// words' other axis and along the run (`RUN`, `TILE_LANES`,
    /// `TILE_RUNS`).
    pub(in crate::backend::gpu) fn runs(&self) -> (u32, u32, u32) {
        Self::geometry(self.pack)
    }

    /// [`Tile::runs`] of each [`Pack`]: 256 runs a tile, so that a
    /// workgroup of 256 takes a tile in one pass. Long runs spread an
    /// invocation's fixed costs (and AutoAWQ's 8 scale lookups) over more
    /// words: on llvmpipe runs of 32 transposed words (16 strided, 128
    /// 4-bit columns: GPTQ's usual group) ran faster than runs of 8 (4),
    /// and 64 (32) no faster, while the tile shape mattered little once a
    /// SIMD batch's writes fill whole lines
    /// (docs/performance.md#gpu-decode-kernels).
    fn geometry(pack: Pack) -> (u32, u32, u32) {
        match pack {
            Pack::Transposed => (32, 16, 16),
            Pack::Strided => (16, 16, 16),
        }
    }

    /// Output rows and columns of one tile.
    pub(in crate::backend::gpu) fn size(&self) -> (u32, u32) {
        let (run, lanes, runs) = self.runs();
        let per = 32 / self.bits;
        match self.pack {
            Pack::Transposed => (lanes * per, runs * run),
            Pack::Strided => (lanes, runs * run * per),
        }
    }

    /// The constants as wgpu takes them.
    pub(in crate::backend::gpu) fn constants(&self) -> Vec<(&'static str, f64)> {
        let (run, lanes, runs) = self.runs();
        let mut c =
            shared_constants((self.bits, self.code, self.out, self.zero, self.scaled)).to_vec();
        c.extend([
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
        ]);
        c
    }

    /// The tile kernel for `job`, when it fits: 4- or 8-bit codes in whole
    /// aligned 32-bit words, either a transposed job whose stored rows'
    /// words are contiguous and whose output rows per slice are whole words
    /// ([`Pack::Transposed`]) or lanes one word apart with strided words
    /// ([`Pack::Strided`]); no low-rank branch; zero points plain or packed
    /// along columns in the codes' word layout; (16-bit outputs) an even
    /// column count. Groups of any size and g_idx are taken.
    pub(in crate::backend::gpu) fn for_job(job: &DecodeJob<'_>) -> Option<Tile> {
        let c = &job.codes;
        let d = job.dims;
        // High-first bytes and post scales (bitsandbytes) are straight jobs
        // the fast kernel takes.
        if !matches!(c.bits, 4 | 8)
            || c.blocks.is_some()
            || c.parts.is_some()
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
        let pack = if job.transposed && c.word_bits == 32 && d.rows.is_multiple_of(per as usize) {
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

#[cfg(test)]
mod tests {
    use super::super::job;
    use super::*;
    use crate::job::Grid;
    use crate::numerics::OutDtype;

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
}

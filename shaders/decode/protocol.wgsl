// Decodes one chunk of rows of a DecodeJob (src/job/mod.rs) to dense f32, bf16 or f16.
// Three entry points share everything in these fragments: `main`, the
// generic kernel, one output word per invocation for any job; `fast`, one
// 32-bit word of 4- or 8-bit codes per invocation, specialised by override
// constants for the jobs nearly every checkpoint has; and `fast_t`, the same
// for codes packed along the input dimension (AutoAWQ, GPT-OSS, GPTQ), a run
// of code words per invocation and one tile of output per workgroup
// (src/backend/gpu/layout/kernels.rs picks).
//
// Everything the chunk needs sits in one word array `src`: the code-value and
// scale tables, g_idx, and the byte ranges of the code, zero-point and scale
// tensors this chunk touches. The host turns every absolute position into a
// position inside `src` with a wrapping u32 `base`, so u32 arithmetic that
// overflows on huge tensors still lands on the right word.
//
// Mirrors `DecodeJob::value` and `numerics::f32_to_{bf16,f16}` step for step;
// the CPU backend is the reference and every byte must match it.
//
// The module is these fragments of shaders/decode/, put together in this
// order by the host (src/backend/gpu/shader.rs):
// protocol.wgsl (this file: the values, structs and bindings the host
// writes), numbers.wgsl (f16 widened, f32 rounded to the output dtypes),
// reads.wgsl (fields and grid entries read from `src`),
// generic.wgsl (DecodeJob::value step by step and the generic kernel), fast.wgsl (the fast kernel) and tile.wgsl (the tile
// kernel). The products (shaders/matmul/) append themselves to the same
// module.

// The values the host writes into `Params` and the override constants. Each
// is the discriminant of a Rust enum in src/backend/gpu/layout/protocol.rs
// that names it the same way; a unit test there fails when the two disagree.

// Grid::kind: how a grid entry is stored.
const GRID_BF16: u32 = 0u;
const GRID_F16: u32 = 1u;
const GRID_F32: u32 = 2u;
const GRID_I8: u32 = 3u;
const GRID_I32: u32 = 4u;
const GRID_TABLE: u32 = 5u;   // one byte indexing a 256-entry f32 table
const GRID_NESTED: u32 = 6u;  // the same, times outer[k], plus offset or adds[k] (job::Nested)
const GRID_E8M0: u32 = 7u;    // a GRID_TABLE that is numerics::e8m0's: 2^(byte - 127) by formula

// Params::out_kind and OUT: the output dtype.
const OUT_F32: u32 = 0u;
const OUT_BF16: u32 = 1u;
const OUT_F16: u32 = 2u;

// Params::zero_mode and ZERO: where zero points come from.
const ZERO_NONE: u32 = 0u;
const ZERO_PACKED: u32 = 1u;             // fields packed along rows
const ZERO_PLAIN: u32 = 2u;              // one grid entry per group
const ZERO_PACKED_ALONG_COLS: u32 = 3u;  // fields packed along columns (AutoAWQ)
const ZERO_OFFSET: u32 = 4u;             // none; the zgrid holds an offset added last

// Params::lr_mode and LOW_RANK: SVDQuant's low-rank branch, in job order.
const LOW_RANK_NONE: u32 = 0u;
const LOW_RANK_SMOOTH_LAST: u32 = 1u;    // (q·s + lr) · rs
const LOW_RANK_SMOOTH_FIRST: u32 = 2u;   // (q·s) · rs + lr
const LOW_RANK_SMOOTH_IN_PRODUCT: u32 = 3u; // rank 0: d(d(q·s) · d(rs))

// CODE: the formula that gives a code's value (the job's table otherwise).
const CODE_TABLE: u32 = 0u;
const CODE_OFFSET: u32 = 1u;             // code - code_offset
const CODE_TWOS_COMPLEMENT: u32 = 2u;
const CODE_E2M1: u32 = 3u;               // numerics::e2m1
const CODE_E4M3: u32 = 4u;               // numerics::e4m3
const CODE_SMALL_TABLE: u32 = 5u;        // the table, of 4-bit codes, holds integers of -128..=127

// PACK: how the tile kernel's code words lie against its output.
const PACK_TRANSPOSED: u32 = 0u;  // transposed output: a word holds output rows
const PACK_STRIDED: u32 = 1u;     // lanes one word apart, a lane's words strided

// Params::sp_mode: codes read through a bitmask (job::Sparse), and where
// its blocks start among the kept codes (job::Starts).
const SPARSE_NONE: u32 = 0u;
const SPARSE_FIXED: u32 = 1u;   // row * sp_step + block * sp_per_block
const SPARSE_TABLE: u32 = 2u;   // src[sp_starts + (row - sp_row0) * sp_step + block]

// Params::gidx of a job without g_idx.
const NO_G_IDX: u32 = 0xffffffffu;

struct Stream {
    bits: u32,        // field width, 1..=8
    per_word: u32,    // 0: dense bit stream; else fields per 32-bit word (padded)
    lane_bits: u32,   // bits between lanes (mod 2^32)
    word_bits: u32,   // bits between the 32-bit words of one lane (mod 2^32)
    slice_bits: u32,  // bits between slices (mod 2^32)
    base: u32,        // added to every bit position (mod 2^32)
    interleave: u32,  // padded words hold even fields first, then odd (AutoAWQ)
    swap: u32,        // XORed with every field's bit position: 8 - bits for
                      // bytes filled from the high bits down (bitsandbytes), else 0
    // Fields inside blocks (job::InBlocks, GGUF's): a lane is blocks of
    // block_len fields, block_bits apart; a field is its low plane's plus
    // its high plane's above it. block_len 0: not in blocks.
    block_len: u32,
    block_bits: u32,
    // Lanes in parts sharing their words (job::Parts, hqq's 3bit_32): lane
    // j is lane j % part_lanes of part j / part_lanes, part_down bits below
    // the one before (the first part's top is in base). 0: no parts.
    part_lanes: u32,
    part_down: u32,
    low: vec4<u32>,   // the low plane: first byte in the block, bits, span (job::Plane), 0
    high: vec4<u32>,  // the high plane; bits 0: none
}

struct Grid {
    kind: u32,        // GRID_*
    size: u32,        // bytes per stored element
    row_div: u32,
    col_div: u32,
    row_stride: u32,
    slice_stride: u32,
    base: u32,        // added to every byte position (mod 2^32)
    table: u32,       // word index of the 256-entry table (GRID_TABLE, GRID_NESTED)
    outer: u32,       // GRID_NESTED: word index of entry 0's outer factor (mod 2^32)
    per_outer: u32,   // GRID_NESTED: entries per outer factor
    offset: f32,      // GRID_NESTED: added last, where adds is NO_G_IDX
    cycle: u32,       // GRID_NESTED: outer factors before they repeat, 0: never
    adds: u32,        // GRID_NESTED: word index of entry 0's addend (mod 2^32), or NO_G_IDX
    round: u32,       // GRID_NESTED: OUT_* each step rounds to
    spare: u32,       // the grid 16-byte sized (uniform layout)
    _pad1: u32,
}

struct Params {
    rows: u32,        // rows per slice
    cols: u32,
    first_row: u32,   // flat row (over slices) of element 0 of this chunk
    elems: u32,       // elements in this chunk
    out_kind: u32,    // OUT_*
    zero_mode: u32,   // ZERO_*
    has_scale: u32,
    gidx: u32,        // word index of g_idx in src, or NO_G_IDX
    code_table: u32,  // word index of the code-value table
    row_threads: u32, // invocations per row of the dispatch grid
    lr_mode: u32,     // LOW_RANK_*
    lr_rank: u32,
    lr_up: u32,       // word index of this chunk's rows of up [rows, rank]
    lr_down: u32,     // word index of down [cols, rank]
    lr_smooth: u32,   // word index of 1/smooth [cols], or [lr_period, cols]
    zero_bits: u32,   // always 0; see opaque()
    words_per_row: u32, // fast kernel: invocations per row (one code word each)
    fast_rows: u32,   // fast kernel: rows in this chunk
    code_offset: f32, // fast kernel, CODE_OFFSET: value = code - code_offset
    slice0: u32,      // fast kernel: slice and row of first_row
    row0: u32,
    out_base: u32,    // dst word where this chunk's output starts
    transposed: u32,  // 1: output (row, col) is stored (col, row)
    post_scale: f32,  // every value times this last (LLM.int8's 1/127); 1.0: none
    product: u32,     // OUT_BF16 / OUT_F16: the scaled value computed in that dtype (job::Product); OUT_F32: in f32
    sp_mode: u32,     // SPARSE_*
    sp_block: u32,    // columns per block of the bitmask
    sp_step: u32,     // SPARSE_FIXED: kept codes per row; SPARSE_TABLE: blocks per row
    sp_per_block: u32, // SPARSE_FIXED: kept codes per block
    sp_starts: u32,   // SPARSE_TABLE: word index of row sp_row0's block starts
    sp_row0: u32,
    lr_period: u32,   // rows of 1/smooth before they repeat (LowRank::period; 1: [cols])
    lr_row_div: u32,  // rows sharing one row of 1/smooth (LowRank::row_div)
    pad0: u32,        // the streams below start 16-byte aligned (uniform layout)
    pad1: u32,
    pad2: u32,
    codes: Stream,
    zero: Stream,
    mask: Stream,     // a sparse job's bitmask: 1-bit fields, lane = row
    zgrid: Grid,
    sgrid: Grid,
}

// Invocations per workgroup: 256 unless the host picks another for its
// adapter (GpuDecoder::with_workgroup_size).
override WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;


// Decodes one chunk of rows of a DecodeJob (src/job.rs) to dense f32, bf16 or f16.
// Three entry points share everything below: `main`, the generic kernel, one
// output word per invocation for any job; `fast`, one 32-bit word of 4- or
// 8-bit codes per invocation, specialised by override constants for the jobs
// nearly every checkpoint has; and `fast_t`, the same for codes packed along
// the input dimension (AutoAWQ, GPT-OSS, GPTQ), a run of code words per
// invocation and one tile of output per workgroup (src/backend/gpu/layout.rs
// picks).
//
// Everything the chunk needs sits in one word array `src`: the code-value and
// scale tables, g_idx, and the byte ranges of the code, zero-point and scale
// tensors this chunk touches. The host turns every absolute position into a
// position inside `src` with a wrapping u32 `base`, so u32 arithmetic that
// overflows on huge tensors still lands on the right word.
//
// Mirrors `DecodeJob::value` and `numerics::f32_to_{bf16,f16}` step for step;
// the CPU backend is the reference and every byte must match it.

// The values the host writes into `Params` and the override constants. Each
// is the discriminant of a Rust enum in src/backend/gpu/layout.rs that names
// it the same way; a unit test there fails when the two disagree.

// Grid::kind: how a grid entry is stored.
const GRID_BF16: u32 = 0u;
const GRID_F16: u32 = 1u;
const GRID_F32: u32 = 2u;
const GRID_I8: u32 = 3u;
const GRID_I32: u32 = 4u;
const GRID_TABLE: u32 = 5u;   // one byte indexing a 256-entry f32 table
const GRID_NESTED: u32 = 6u;  // the same, times outer[idx / per_outer], plus offset
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

// CODE: the formula that gives a code's value (the job's table otherwise).
const CODE_TABLE: u32 = 0u;
const CODE_OFFSET: u32 = 1u;             // code - code_offset
const CODE_TWOS_COMPLEMENT: u32 = 2u;
const CODE_E2M1: u32 = 3u;               // numerics::e2m1
const CODE_E4M3: u32 = 4u;               // numerics::e4m3

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
    pad0: u32,
    pad1: u32,
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
    offset: f32,      // GRID_NESTED: added last
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
    lr_smooth: u32,   // word index of 1/smooth [cols]
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
    pad: u32,         // the streams below start 16-byte aligned (uniform layout)
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

// `n` (<= 16) bits starting at bit `pos` of src.
fn bits_at(pos: u32, n: u32) -> u32 {
    let w = pos >> 5u;
    let sh = pos & 31u;
    var v = src[w] >> sh;
    if (sh + n > 32u) {
        v = v | (src[w + 1u] << (32u - sh));
    }
    return v & ((1u << n) - 1u);
}

// Field `e` of a plane (job::Plane: byte, bits, span) of the block at bit
// `start`.
fn plane_field(start: u32, pl: vec4<u32>, e: u32) -> u32 {
    let at = plane_locate(pl, e);
    return bits_at(start + at.x * 8u + at.y, pl.y);
}

// Field `e`'s byte in its block and its shift in that byte (Plane::locate):
// runs of span bytes, 8 / bits of them filling the same bytes, both powers
// of two (the host's rule).
fn plane_locate(pl: vec4<u32>, e: u32) -> vec2<u32> {
    let ls = countTrailingZeros(pl.z);
    let lk = 3u - countTrailingZeros(pl.y);
    let run = e >> ls;
    return vec2<u32>(pl.x + ((run >> lk) << ls) + (e & (pl.z - 1u)), (run & ((1u << lk) - 1u)) * pl.y);
}

// Field `i` of `lane` in `slice` (Fields::get).
fn field(st: Stream, slice: u32, lane: u32, i: u32) -> u32 {
    if (st.block_len != 0u) {
        let n = i / st.block_len;
        let e = i - n * st.block_len;
        let start = st.base + slice * st.slice_bits + lane * st.lane_bits + n * st.block_bits;
        var v = plane_field(start, st.low, e);
        if (st.high.y != 0u) {
            v = v | (plane_field(start, st.high, e) << st.low.y);
        }
        return v;
    }
    var w: u32;
    var off: u32;
    if (st.per_word == 0u) {
        let b = i * st.bits;
        w = b >> 5u;
        off = b & 31u;
    } else {
        w = i / st.per_word;
        var m = i % st.per_word;
        if (st.interleave != 0u) {
            m = (m >> 1u) + (m & 1u) * (st.per_word >> 1u);
        }
        off = m * st.bits;
    }
    let base = st.base + slice * st.slice_bits + lane * st.lane_bits;
    let lo_n = min(32u - off, st.bits);
    // High-first fields never cross a byte (the host's rule), so only the
    // first read is swapped; base is a multiple of 8, so XOR commutes with it.
    var v = bits_at((base + w * st.word_bits + off) ^ st.swap, lo_n);
    if (lo_n < st.bits) {
        v = v | (bits_at(base + (w + 1u) * st.word_bits, st.bits - lo_n) << lo_n);
    }
    return v;
}

// IEEE half bits -> f32, exact (job::f16_to_f32). Without branches, which
// llvmpipe would run all of for every lane: a subnormal m · 2^-24 is exact
// in f32, and infinities and NaNs keep their payload.
fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    let normal = ((e + 112u) << 23u) | (m << 13u);
    let special = select(normal, 0x7f800000u | (m << 13u), e == 0x1fu);
    let sub = bitcast<u32>(f32(m) * 5.9604644775390625e-8);
    return bitcast<f32>(sign | select(special, sub, e == 0u));
}

fn group_of(g: Grid, col: u32) -> u32 {
    if (p.gidx != NO_G_IDX) {
        return src[p.gidx + col];
    }
    return col / g.col_div;
}

// Entry (slice, row, group) of a grid (Values::get at Grid::index).
fn value(g: Grid, slice: u32, row: u32, group: u32) -> f32 {
    return value_at(g, slice * g.slice_stride + (row / g.row_div) * g.row_stride + group);
}

// Entry `idx` of a grid.
fn value_at(g: Grid, idx: u32) -> f32 {
    return value_as(g, idx, g.kind);
}

// Entry `idx` of a grid stored as `kind` (GRID_*): an override constant
// where the host knows it, so the switch folds away (llvmpipe otherwise
// runs every case).
fn value_as(g: Grid, idx: u32, kind: u32) -> f32 {
    let pos = idx * g.size + g.base;
    let word = src[pos >> 2u];
    switch kind {
        case GRID_BF16: {
            return bitcast<f32>(((word >> ((pos & 2u) * 8u)) & 0xffffu) << 16u);
        }
        case GRID_F16: {
            return f16_to_f32((word >> ((pos & 2u) * 8u)) & 0xffffu);
        }
        case GRID_F32: {
            return bitcast<f32>(word);
        }
        case GRID_I8: {
            let b = (word >> ((pos & 3u) * 8u)) & 0xffu;
            return f32(bitcast<i32>(b << 24u) >> 24u);
        }
        case GRID_I32: {
            return f32(bitcast<i32>(word));
        }
        case GRID_NESTED: {
            // job::Nested::get: two f32 operations, each rounded.
            let b = (word >> ((pos & 3u) * 8u)) & 0xffu;
            let t = bitcast<f32>(src[g.table + b]);
            return opaque(t * bitcast<f32>(src[g.outer + idx / g.per_outer])) + g.offset;
        }
        case GRID_E8M0: {
            // One load instead of two (SKIND, ZKIND only: the host checks the
            // table); 2^-127 is a subnormal, 255 NaN.
            let b = (word >> ((pos & 3u) * 8u)) & 0xffu;
            let bits = select(b << 23u, 0x00400000u, b == 0u);
            return bitcast<f32>(select(bits, 0x7fc00000u, b == 255u));
        }
        case GRID_TABLE, default: {
            let b = (word >> ((pos & 3u) * 8u)) & 0xffu;
            return bitcast<f32>(src[g.table + b]);
        }
    }
}

// A product rounded to f32 before it is added to anything. Compilers may
// fuse `a * b + c` into one fused multiply-add (one rounding instead of
// two), and `fma()` itself may or may not be fused; an OR with a uniform
// they cannot see is zero keeps every backend rounding where the CPU does.
fn opaque(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) | p.zero_bits);
}

// LowRank::apply: the low-rank branch summed in order, then the smoothing
// reciprocal in the job's order; every operation rounds on its own.
fn low_rank(q: f32, s: f32, flat: u32, col: u32) -> f32 {
    let rs = bitcast<f32>(src[p.lr_smooth + col]);
    let qs = opaque(q * s);
    // Rank 0: the smoothing alone, nothing added (LowRank::apply).
    if (p.lr_rank == 0u) {
        return qs * rs;
    }
    let u = p.lr_up + (flat - p.first_row) * p.lr_rank;
    let d = p.lr_down + col * p.lr_rank;
    var acc = 0.0;
    for (var j = 0u; j < p.lr_rank; j = j + 1u) {
        acc = acc + opaque(bitcast<f32>(src[u + j]) * bitcast<f32>(src[d + j]));
    }
    if (p.lr_mode == LOW_RANK_SMOOTH_LAST) {
        return (qs + acc) * rs;
    }
    return opaque(qs * rs) + acc;
}

// DecodeJob::value: the value below, then the post scale, then the offset.
fn decode(slice: u32, row: u32, col: u32, flat: u32) -> f32 {
    var v = decode_scaled(slice, row, col, flat);
    if (p.post_scale != 1.0) {
        // opaque: rounded before the post scale (see fast_value).
        v = opaque(v) * p.post_scale;
    }
    if (p.zero_mode == ZERO_OFFSET) {
        // opaque: the product rounded before the sum, never one fused
        // multiply-add.
        v = opaque(v) + value(p.zgrid, slice, row, group_of(p.zgrid, col));
    }
    return v;
}

// DecodeJob::code: the field, or through a sparse job's bitmask (code 0
// where the bit is clear, else the kept code at the block's start plus the
// bits set before it in the block).
fn code_of(slice: u32, row: u32, col: u32) -> u32 {
    if (p.sp_mode == SPARSE_NONE) {
        return field(p.codes, slice, row, col);
    }
    if (field(p.mask, 0u, row, col) == 0u) {
        return 0u;
    }
    let b = col / p.sp_block;
    var idx = row * p.sp_step + b * p.sp_per_block;
    if (p.sp_mode == SPARSE_TABLE) {
        idx = src[p.sp_starts + (row - p.sp_row0) * p.sp_step + b];
    }
    var pos = p.mask.base + row * p.mask.lane_bits + b * p.sp_block;
    var n = col - b * p.sp_block;
    while (n > 0u) {
        let k = min(n, 16u);
        idx = idx + countOneBits(bits_at(pos, k));
        pos = pos + k;
        n = n - k;
    }
    return field(p.codes, 0u, 0u, idx);
}

// DecodeJob::value before its post scale.
fn decode_scaled(slice: u32, row: u32, col: u32, flat: u32) -> f32 {
    var v = bitcast<f32>(src[p.code_table + code_of(slice, row, col)]);
    if (p.zero_mode == ZERO_PACKED) {
        var g = 0u;
        if (p.has_scale == 1u) {
            g = group_of(p.sgrid, col);
        }
        v = v - bitcast<f32>(src[p.code_table + field(p.zero, slice, g, row)]);
    } else if (p.zero_mode == ZERO_PACKED_ALONG_COLS) {
        // Lanes are the scale grid's row groups (Grid clamps row_div >= 1).
        let lane = select(0u, row / p.sgrid.row_div, p.has_scale == 1u);
        v = v - bitcast<f32>(src[p.code_table + field(p.zero, slice, lane, col)]);
    } else if (p.zero_mode == ZERO_PLAIN) {
        v = v - value(p.zgrid, slice, row, group_of(p.zgrid, col));
    }
    var s = 1.0;
    if (p.has_scale == 1u) {
        s = value(p.sgrid, slice, row, group_of(p.sgrid, col));
    }
    if (p.lr_mode != LOW_RANK_NONE) {
        return low_rank(v, s, flat, col);
    }
    return scaled(v, s, p.has_scale == 1u);
}

// `x` rounded to the product's dtype (OutDtype::round), as an f32 again.
fn in_product(x: f32) -> f32 {
    return in_product_as(x, p.product);
}

// in_product for a product dtype `kind` (OUT_*): an override constant
// where the host knows it, so that only its rounding is run.
fn in_product_as(x: f32, kind: u32) -> f32 {
    if (kind == OUT_BF16) {
        return bitcast<f32>(to_bf16(x) << 16u);
    }
    if (kind == OUT_F16) {
        return f16_to_f32(to_f16(x));
    }
    return x;
}

// DecodeJob::scaled: `v · s` (`v` without a scale) in the job's Product
// arithmetic: in f32, or both operands and the product rounded to a 16-bit
// dtype (their f32 product is exact, so that is the dtype's own multiply).
fn scaled(v: f32, s: f32, has_scale: bool) -> f32 {
    if (p.product == OUT_F32) {
        if (has_scale) {
            return v * s;
        }
        return v;
    }
    let q = in_product(v);
    if (has_scale) {
        return in_product(q * in_product(s));
    }
    return q;
}

// numerics::f32_bits: NaN payloads and signs are not portable, so one NaN.
fn to_f32(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fc00000u;
    }
    return b;
}

// numerics::f32_to_bf16.
fn to_bf16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fc0u;
    }
    return bf16_carry(b) >> 16u;
}

// The f32 bits `b` (not NaN's) rounded to bf16's, to nearest, ties to even,
// in place: the carry into bf16's last bit, the bits below it dropped.
fn bf16_carry(b: u32) -> u32 {
    return (b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u;
}

// numerics::f32_to_f16.
fn to_f16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return 0x7e00u;
    }
    if (a >= 0x47800000u) {
        return sign | 0x7c00u;
    }
    if (a < 0x38800000u) {
        if (a <= 0x33000000u) {
            return sign;
        }
        let e = a >> 23u;
        let m = (a & 0x7fffffu) | 0x800000u;
        let shift = 126u - e;
        var q = m >> shift;
        let rem = m & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u) == 1u)) {
            q = q + 1u;
        }
        return sign | q;
    }
    var v = (((a >> 23u) - 112u) << 10u) | ((a & 0x7fffffu) >> 13u);
    let rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (v & 1u) == 1u)) {
        v = v + 1u;
    }
    return sign | v;
}

fn element(e: u32) -> f32 {
    let flat = p.first_row + e / p.cols;
    if (p.transposed == 1u) {
        return decode(flat / p.rows, e % p.cols, flat % p.rows, flat);
    }
    return decode(flat / p.rows, flat % p.rows, e % p.cols, flat);
}

// One output word per invocation: one f32, or two 16-bit values.
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x + gid.y * p.row_threads;
    if (p.out_kind == OUT_F32) {
        if (t < p.elems) {
            dst[p.out_base + t] = to_f32(element(t));
        }
        return;
    }
    let e = t * 2u;
    if (e >= p.elems) {
        return;
    }
    var lo: u32;
    var hi = 0u;
    if (p.out_kind == OUT_BF16) {
        lo = to_bf16(element(e));
        if (e + 1u < p.elems) {
            hi = to_bf16(element(e + 1u));
        }
    } else {
        lo = to_f16(element(e));
        if (e + 1u < p.elems) {
            hi = to_f16(element(e + 1u));
        }
    }
    dst[p.out_base + t] = lo | (hi << 16u);
}

// ---------------------------------------------------------------------------
// The fast kernel. The host sends it only jobs whose codes are a dense 4- or
// 8-bit stream (rows may start mid-word), without g_idx, whose scale and zero
// point groups hold whole code words, with rows and columns below 2^23, and
// with an even column count for 16-bit outputs (so no output word straddles
// two invocations). Everything that varies per element is fixed by an
// override constant, so the loop over a word's codes compiles to
// straight-line code.

override BITS: u32 = 4u;             // 4 or 8
override CODE: u32 = CODE_TABLE;     // CODE_*
override OUT: u32 = OUT_BF16;        // OUT_*, as out_kind
override ZERO: u32 = ZERO_NONE;      // ZERO_*, as zero_mode
override SCALED: bool = true;        // as has_scale
override LOW_RANK: u32 = LOW_RANK_NONE; // LOW_RANK_*, as lr_mode
override HIGH_FIRST: bool = false;   // code bytes hold their fields high bits first (p.codes.swap)
override POST: bool = false;         // values times p.post_scale last
override PRODUCT: u32 = OUT_F32;     // as p.product (job::Product), fixed so its branch folds away
override COPY: bool = false;  // bench baseline: the same reads and writes, no decoding
// Codes inside blocks (p.codes.block_len...; job::InBlocks, GGUF's), read
// where they lie: the host's rules are a block length that is a power of
// two and a multiple of PER, and planes whose runs (spans) are a multiple
// of PER or 1 (dense), so that a word's PER codes are PER bytes at one
// shift of each plane, or PER fields in a row.
override BLOCKED: bool = false;

// The fast kernels read an entry of the zero-point grid per group: a plain
// zero point, subtracted from the code, or an offset, added last.
fn zero_grid() -> bool {
    return ZERO == ZERO_PLAIN || ZERO == ZERO_OFFSET;
}
override PER: u32 = 32u / BITS; // codes per word (derived; the host never sets it)

// The code table, loaded once per workgroup (CODE_TABLE).
var<workgroup> codes_table: array<f32, 256>;
// A 4-bit table's 16 entries again, in each invocation's registers.
var<private> codes16: array<vec4<f32>, 4>;

// Loads a CODE_TABLE job's table (every entry point that decodes words
// calls it first, from uniform control flow).
fn load_codes(li: u32) {
    if (CODE == CODE_TABLE && !COPY) {
        for (var i = li; i < (1u << BITS); i = i + WG) {
            codes_table[i] = bitcast<f32>(src[p.code_table + i]);
        }
        workgroupBarrier();
        if (BITS == 4u) {
            for (var i = 0u; i < 4u; i = i + 1u) {
                let t = 4u * i;
                codes16[i] = vec4<f32>(codes_table[t], codes_table[t + 1u], codes_table[t + 2u], codes_table[t + 3u]);
            }
        }
    }
}

// n / d for n, d below 2^24 (the host's rule for the fast kernel) without
// an integer division, which few SIMD units have: the f32 quotient is
// within one of the true one, and one step corrects it.
fn div_small(n: u32, d: u32) -> u32 {
    var q = u32(f32(n) / f32(d));
    let r = i32(n) - i32(q * d);
    if (r < 0) {
        q = q - 1u;
    } else if (r >= i32(d)) {
        q = q + 1u;
    }
    return q;
}

// `n` (below 2^23) as an f32 without an int-to-float conversion: placed
// under the mantissa of 2^23 and 2^23 taken away again, exact (Marlin's and
// vLLM's magic bias). A GPU converts a quarter to an eighth as many ints a
// clock as it multiplies floats; one conversion per weight would cap a
// product well below memory speed.
fn small_f32(n: u32) -> f32 {
    return bitcast<f32>(0x4B000000u | n) - 8388608.0;
}

fn code_value(c: u32) -> f32 {
    if (CODE == CODE_OFFSET) {
        // Two roundings-free steps: f32(c) exactly, then the one subtraction.
        return small_f32(c) - p.code_offset;
    }
    if (CODE == CODE_TWOS_COMPLEMENT) {
        if (BITS <= 16u) {
            // Offset binary: the sign bit flipped is the value plus 2^(BITS-1).
            let half = 1u << (BITS - 1u);
            return small_f32((c & ((half << 1u) - 1u)) ^ half) - small_f32(half);
        }
        return f32(bitcast<i32>(c << (32u - BITS)) >> (32u - BITS));
    }
    // The minifloats: the magnitude's bits moved under f32's and its
    // exponent bias added (a carry from the mantissa field is the exponent
    // rising), the subnormals as exact f32 arithmetic on placed bits.
    if (CODE == CODE_E2M1) {
        let m = c & 7u;
        let mag = select((m << 22u) + (126u << 23u), select(0u, 0x3F000000u, m == 1u), m < 2u);
        return bitcast<f32>(((c & 8u) << 28u) | mag);
    }
    if (CODE == CODE_E4M3) {
        let m = c & 0x7fu;
        var mag = select((m << 20u) + (120u << 23u), bitcast<u32>(small_f32(m) * 0.001953125), m < 8u);
        mag = select(mag, 0x7fc00000u, m == 0x7fu);
        return bitcast<f32>(((c & 0x80u) << 24u) | mag);
    }
    if (BITS == 4u) {
        // By selects over registers: CPU adapters read workgroup memory at
        // each invocation's own address one invocation at a time.
        let b0 = (c & 1u) != 0u;
        let b1 = (c & 2u) != 0u;
        let q0 = select(select(codes16[0].x, codes16[0].y, b0), select(codes16[0].z, codes16[0].w, b0), b1);
        let q1 = select(select(codes16[1].x, codes16[1].y, b0), select(codes16[1].z, codes16[1].w, b0), b1);
        let q2 = select(select(codes16[2].x, codes16[2].y, b0), select(codes16[2].z, codes16[2].w, b0), b1);
        let q3 = select(select(codes16[3].x, codes16[3].y, b0), select(codes16[3].z, codes16[3].w, b0), b1);
        let b2 = (c & 4u) != 0u;
        return select(select(q0, q1, b2), select(q2, q3, b2), (c & 8u) != 0u);
    }
    return codes_table[c];
}

// DecodeJob::value of code `c` whose zero point `z` and scale `s` are known.
fn fast_value(c: u32, z: f32, s: f32, flat: u32, col: u32) -> f32 {
    var v = fast_scaled(c, z, s, flat, col);
    if (POST) {
        // opaque: `(q · s) · post`, not `q · (s · post)`, which a compiler
        // may hoist (NVIDIA's did: 0 · 1.7e38 · 4.31 came out NaN, not 0).
        v = opaque(v) * p.post_scale;
    }
    if (ZERO == ZERO_OFFSET) {
        // opaque: the product rounded before the sum, never one fused
        // multiply-add (as decode()).
        v = opaque(v) + z;
    }
    return v;
}

// fast_value before the post scale.
fn fast_scaled(c: u32, z: f32, s: f32, flat: u32, col: u32) -> f32 {
    var v = code_value(c);
    if (ZERO != ZERO_NONE && ZERO != ZERO_OFFSET) {
        v = v - z;
    }
    if (LOW_RANK != LOW_RANK_NONE) {
        return low_rank(v, s, flat, col);
    }
    if (PRODUCT != OUT_F32) {
        // scaled() with the dtype fixed (p.product equals PRODUCT). E2M1 and
        // E4M3 codes, and integer ones less an integer zero point (|v| ≤
        // 255), are 16-bit values already: rounding them changes nothing.
        let integers = (CODE == CODE_OFFSET || CODE == CODE_TWOS_COMPLEMENT) && ZERO != ZERO_PLAIN;
        var q = v;
        if (!integers && (CODE == CODE_TABLE || ZERO == ZERO_PLAIN || ZERO == ZERO_PACKED)) {
            q = in_product_as(v, PRODUCT);
        }
        if (SCALED) {
            return in_product_as(q * in_product_as(s, PRODUCT), PRODUCT);
        }
        return q;
    }
    if (SCALED) {
        return v * s;
    }
    return v;
}

// A raw code word of a high-first stream in LSB-first order: the fields of
// each byte mirrored (4-bit: nibbles swapped; 8-bit: as it is).
fn lsb_first(w: u32) -> u32 {
    if (!HIGH_FIRST || BITS == 8u) {
        return w;
    }
    return ((w >> 4u) & 0x0f0f0f0fu) | ((w & 0x0f0f0f0fu) << 4u);
}

fn encode_out(x: f32) -> u32 {
    if (OUT == OUT_F32) {
        return to_f32(x);
    }
    if (OUT == OUT_BF16) {
        return to_bf16(x);
    }
    return to_f16(x);
}

// Writes the `n` codes of `word` (col0 on) at output element `o`.
fn fast_store(word: u32, n: u32, z: f32, s: f32, flat: u32, col0: u32, o: u32) {
    let mask = (1u << BITS) - 1u;
    if (OUT == OUT_F32) {
        for (var i = 0u; i < n; i = i + 1u) {
            let c = (word >> (i * BITS)) & mask;
            dst[p.out_base + o + i] = encode_out(fast_value(c, z, s, flat, col0 + i));
        }
        return;
    }
    // n is even here (the host's rule for 16-bit outputs).
    for (var i = 0u; i < n; i = i + 2u) {
        let lo = encode_out(fast_value((word >> (i * BITS)) & mask, z, s, flat, col0 + i));
        let hi = encode_out(fast_value((word >> ((i + 1u) * BITS)) & mask, z, s, flat, col0 + i + 1u));
        dst[p.out_base + o / 2u + i / 2u] = lo | (hi << 16u);
    }
}

// The 32 bits from bit `pos` of src on.
fn word_at(pos: u32) -> u32 {
    let sh = pos & 31u;
    var w = src[pos >> 5u] >> sh;
    if (sh != 0u) {
        w = w | (src[(pos >> 5u) + 1u] << (32u - sh));
    }
    return w;
}

// Fields e0 .. e0 + PER of a plane (job::Plane: byte, bits, span) of the
// block from bit `start`, a byte each (PER 8: two words).
fn plane_bytes(start: u32, pl: vec4<u32>, e0: u32) -> vec2<u32> {
    let bits = pl.y;
    let m = (1u << bits) - 1u;
    if (pl.z == 1u) {
        // Dense: PER fields in a row.
        let v = word_at(start + pl.x * 8u + e0 * bits);
        var f = vec2<u32>(0u, 0u);
        for (var i = 0u; i < 4u; i = i + 1u) {
            f.x = f.x | (((v >> (i * bits)) & m) << (8u * i));
            if (PER == 8u) {
                f.y = f.y | (((v >> ((i + 4u) * bits)) & m) << (8u * i));
            }
        }
        return f;
    }
    // A run's fields are bytes side by side, at one shift.
    let at = plane_locate(pl, e0);
    let sh = at.y;
    let mask = m * 0x01010101u;
    let pos = start + at.x * 8u;
    var f = vec2<u32>((word_at(pos) >> sh) & mask, 0u);
    if (PER == 8u) {
        f.y = (word_at(pos + 32u) >> sh) & mask;
    }
    return f;
}

// Four fields below 16, a byte each, as four nibbles.
fn nibbles_of(x: u32) -> u32 {
    let t = (x | (x >> 4u)) & 0x00FF00FFu;
    return (t | (t >> 8u)) & 0x0000FFFFu;
}

// The PER codes from col0 on of a stream in blocks (BLOCKED), as a word
// of BITS-wide fields.
fn blocked_word(slice: u32, row: u32, col0: u32) -> u32 {
    let st = p.codes;
    let n = col0 >> countTrailingZeros(st.block_len);
    let e0 = col0 & (st.block_len - 1u);
    let start = st.base + slice * st.slice_bits + row * st.lane_bits + n * st.block_bits;
    var f = plane_bytes(start, st.low, e0);
    if (st.high.y != 0u) {
        f = f | (plane_bytes(start, st.high, e0) << vec2<u32>(st.low.y));
    }
    if (BITS == 8u) {
        return f.x;
    }
    return nibbles_of(f.x) | (nibbles_of(f.y) << 16u);
}

// Grid::index without an integer division.
fn fast_index(g: Grid, slice: u32, row: u32, group: u32) -> u32 {
    return grid_index(g, slice, div_small(row, g.row_div), group);
}

// Grid::index of row group `rg`.
fn grid_index(g: Grid, slice: u32, rg: u32, group: u32) -> u32 {
    return slice * g.slice_stride + rg * g.row_stride + group;
}

// Code words an invocation decodes in turn along its row, all in one scale
// (and zero-point) group: their lookups are made once (Fast::words).
override WORDS: u32 = 1u;

@compute @workgroup_size(WG)
fn fast(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    load_codes(li);
    let t = gid.x + gid.y * p.row_threads;
    // p.words_per_row counts words (the products read it so); an
    // invocation takes WORDS of them.
    let runs = (p.words_per_row + WORDS - 1u) / WORDS;
    let local = div_small(t, runs);
    if (local >= p.fast_rows) {
        return;
    }
    let first = (t - local * runs) * WORDS * PER;
    let flat = p.first_row + local;
    let k = div_small(p.row0 + local, p.rows);
    let slice = p.slice0 + k;
    let row = p.row0 + local - k * p.rows;

    // One scale and zero point for the whole run.
    var s = 1.0;
    var g = 0u;
    if (SCALED && !COPY) {
        g = div_small(first, p.sgrid.col_div);
        s = value_as(p.sgrid, fast_index(p.sgrid, slice, row, g), SKIND);
    }
    var z = 0.0;
    if (!COPY && ZERO == ZERO_PACKED) {
        // A field of a dense stream whose width divides 32 never crosses a word.
        let b = row * BITS;
        let zp = p.zero.base + slice * p.zero.slice_bits + g * p.zero.lane_bits
            + (b >> 5u) * p.zero.word_bits + (b & 31u);
        z = code_value((src[zp >> 5u] >> (zp & 31u)) & ((1u << BITS) - 1u));
    } else if (!COPY && zero_grid()) {
        let zg = div_small(first, p.zgrid.col_div);
        z = value_as(p.zgrid, fast_index(p.zgrid, slice, row, zg), ZKIND);
    }
    for (var w = 0u; w < WORDS; w = w + 1u) {
        let col0 = first + w * PER;
        if (col0 >= p.cols) {
            return;
        }
        fast_word(slice, row, col0, flat, local * p.cols + col0, z, s);
    }
}

// The codes of the word from col0 on, decoded with scale `s` and zero
// point `z` and written at output element `o` (COPY: the word written
// as often as decoding writes).
fn fast_word(slice: u32, row: u32, col0: u32, flat: u32, o: u32, z: f32, s: f32) {
    // The 32 bits of codes from col0 on.
    var word: u32;
    if (BLOCKED) {
        word = blocked_word(slice, row, col0);
    } else {
        let pos = p.codes.base + slice * p.codes.slice_bits + row * p.codes.lane_bits + col0 * BITS;
        let sh = pos & 31u;
        word = lsb_first(src[pos >> 5u]);
        if (sh != 0u) {
            word = (word >> sh) | (lsb_first(src[(pos >> 5u) + 1u]) << (32u - sh));
        }
    }
    let n = min(PER, p.cols - col0);
    if (COPY) {
        let words = select((n + 1u) / 2u, n, OUT == OUT_F32);
        let at = select(o / 2u, o, OUT == OUT_F32);
        for (var i = 0u; i < words; i = i + 1u) {
            dst[p.out_base + at + i] = word;
        }
        return;
    }
    // A whole word (nearly always) takes a loop of constant length.
    if (n == PER) {
        fast_store(word, PER, z, s, flat, col0, o);
    } else {
        fast_store(word, n, z, s, flat, col0, o);
    }
}

// ---------------------------------------------------------------------------
// The tile kernel: 4- or 8-bit codes packed along the input dimension, whose
// straight reading order writes the output column-wise. The host sends it
// jobs whose code words are whole aligned 32-bit words in one of two shapes:
//
// - PACK_TRANSPOSED (AutoAWQ GEMM, GPT-OSS experts): a transposed job whose
//   stored rows' words are contiguous (word_bits 32). A word holds PER output
//   rows of one output column; output rows per slice are a multiple of PER.
// - PACK_STRIDED (GPTQ): an untransposed job with lanes one word apart
//   (lane_bits 32) and each lane's words word_bits apart. A word holds PER
//   columns of one output row; consecutive words are consecutive rows.
//
// An invocation decodes a run of RUN code words and writes their outputs
// itself: the same word of RUN consecutive stored rows (transposed: a block
// of PER output rows by RUN columns), or RUN consecutive words of one lane
// (strided: RUN · PER columns of one output row). No workgroup memory and no
// barrier: llvmpipe runs both as ordinary memory and splits the shader at
// every barrier, which cost more than reading each word straight from `src`
// (neighbouring invocations read neighbouring words, so the caches see the
// same lines a transpose through workgroup memory would). The run's words
// share their scale and zero-point lookups where the host says so (SHARED),
// which is what makes AutoAWQ's scale per stored column affordable.
// A workgroup covers a tile of TILE_LANES runs along the words' other axis
// by TILE_RUNS runs, so that its writes fill whole cache lines of output.
// Zero points are plain or packed along columns (in the codes' own word
// layout); groups hold whole words (WORD_GROUPS: one scale per word) or not
// (one per code, g_idx included); no low-rank branch; 16-bit outputs have an
// even column count.

override PACK: u32 = PACK_TRANSPOSED;  // PACK_*
override INTERLEAVED: bool = false;    // AutoAWQ's word order (Fields::interleaved)
override WORD_GROUPS: bool = true;     // every scale/zero group holds whole code words
override RUN: u32 = 32u;               // code words per invocation, even
override TILE_LANES: u32 = 16u;        // runs per tile along the words' other axis
override TILE_RUNS: u32 = 16u;         // runs per tile along the run's axis
override TILE_WORDS: u32 = RUN * TILE_LANES * TILE_RUNS;
// The run's words share every scale and zero point code by code: the same
// stored columns of stored rows in one row group (transposed), or words of
// one lane in one column group (strided, WORD_GROUPS, no zero points packed
// along columns). The host checks the grids.
override SHARED: bool = false;
// How the fast and tile kernels' scale and plain zero-point grids are stored
// (GRID_*).
override SKIND: u32 = GRID_BF16;
override ZKIND: u32 = GRID_BF16;

// Slot of element m of a code word (Fields::locate).
fn slot_of(m: u32) -> u32 {
    if (INTERLEAVED) {
        return (m >> 1u) + (m & 1u) * (PER >> 1u);
    }
    return m;
}

// The tile kernel's groups come from g_idx (p.gidx): fixed by the host.
override GIDX: bool = false;

// The group of n, n + 1, .. in groups of d, and its place in it: quot_rem
// once, then step_group one at a time, so that a word's codes (or a run's
// stored rows) take one division instead of one each.
fn quot_rem(n: u32, d: u32) -> vec2<u32> {
    let q = div_small(n, d);
    return vec2<u32>(q, n - q * d);
}

fn step_group(at: vec2<u32>, d: u32) -> vec2<u32> {
    let i = at.y + 1u;
    return select(vec2<u32>(at.x, i), vec2<u32>(at.x + 1u, 0u), i == d);
}

// A stored row's row groups (quot_rem) on the scale and plain zero-point
// grids (zero points packed along columns take the scale grid's).
struct RowGroups {
    s: vec2<u32>,
    z: vec2<u32>,
}

fn row_groups(row: u32) -> RowGroups {
    var g: RowGroups;
    if (SCALED) {
        g.s = quot_rem(row, p.sgrid.row_div);
    }
    if (ZERO == ZERO_PLAIN) {
        g.z = quot_rem(row, p.zgrid.row_div);
    }
    return g;
}

// The row groups of the next stored row.
fn next_row(g: RowGroups) -> RowGroups {
    return RowGroups(step_group(g.s, p.sgrid.row_div), step_group(g.z, p.zgrid.row_div));
}

// The group of stored column col, `at` its quot_rem.
fn tile_group(col: u32, at: vec2<u32>) -> u32 {
    if (GIDX) {
        return src[p.gidx + col];
    }
    return at.x;
}

// The zero-point word of stored columns col0.. of a stored row (lane: its
// row group on the scale grid, 0 without one), packed along columns as the
// codes are.
fn tile_zero_word(slice: u32, rg: RowGroups, col0: u32) -> u32 {
    if (ZERO != ZERO_PACKED_ALONG_COLS) {
        return 0u;
    }
    let pos = p.zero.base + slice * p.zero.slice_bits + rg.s.x * p.zero.lane_bits
        + (col0 / PER) * p.zero.word_bits;
    return src[pos >> 5u];
}

// The scale and zero point of each code of one word: entry m is stored
// column col0 + m's.
struct WordValues {
    s: array<f32, 8>,
    z: array<f32, 8>,
}

// The values of the word of stored columns col0.. of the stored row in
// `slice` whose row groups are rg: one lookup each when groups hold whole
// words, else one per code.
fn word_values(slice: u32, rg: RowGroups, col0: u32) -> WordValues {
    var s = 1.0;
    var z = 0.0;
    if (WORD_GROUPS && SCALED) {
        let g = div_small(col0, p.sgrid.col_div);
        s = value_as(p.sgrid, grid_index(p.sgrid, slice, rg.s.x, g), SKIND);
    }
    if (WORD_GROUPS && ZERO == ZERO_PLAIN) {
        let g = div_small(col0, p.zgrid.col_div);
        z = value_as(p.zgrid, grid_index(p.zgrid, slice, rg.z.x, g), ZKIND);
    }
    let zword = tile_zero_word(slice, rg, col0);
    var sg = vec2<u32>();
    var zg = vec2<u32>();
    if (!WORD_GROUPS && SCALED) {
        sg = quot_rem(col0, p.sgrid.col_div);
    }
    if (!WORD_GROUPS && ZERO == ZERO_PLAIN) {
        zg = quot_rem(col0, p.zgrid.col_div);
    }
    var v: WordValues;
    for (var m = 0u; m < PER; m = m + 1u) {
        v.s[m] = s;
        v.z[m] = z;
        if (!WORD_GROUPS && SCALED) {
            let g = tile_group(col0 + m, sg);
            v.s[m] = value_as(p.sgrid, grid_index(p.sgrid, slice, rg.s.x, g), SKIND);
            sg = step_group(sg, p.sgrid.col_div);
        }
        if (!WORD_GROUPS && ZERO == ZERO_PLAIN) {
            let g = tile_group(col0 + m, zg);
            v.z[m] = value_as(p.zgrid, grid_index(p.zgrid, slice, rg.z.x, g), ZKIND);
            zg = step_group(zg, p.zgrid.col_div);
        }
        if (ZERO == ZERO_PACKED_ALONG_COLS) {
            v.z[m] = code_value((zword >> (slot_of(m) * BITS)) & ((1u << BITS) - 1u));
        }
    }
    return v;
}

// The encoded output (16-bit ones in the low half) of element m of `word`.
fn tile_out(word: u32, v: WordValues, m: u32) -> u32 {
    let c = (word >> (slot_of(m) * BITS)) & ((1u << BITS) - 1u);
    return encode_out(fast_value(c, v.z[m], v.s[m], 0u, 0u));
}

// Writes the codes of `word` (a strided tile's: one output row, columns col
// on) at output element o, those below p.cols (even for 16-bit outputs): one
// loop of constant length with a mask, since llvmpipe runs both paths of a
// separate one for partial words (GPTQ ran 1.4x faster without it).
fn tile_store_row(word: u32, v: WordValues, o: u32, col: u32) {
    for (var m = 0u; m < PER; m = m + select(2u, 1u, OUT == OUT_F32)) {
        if (col + m < p.cols) {
            if (OUT == OUT_F32) {
                dst[p.out_base + o + m] = tile_out(word, v, m);
            } else {
                dst[p.out_base + (o + m) / 2u] = tile_out(word, v, m) | (tile_out(word, v, m + 1u) << 16u);
            }
        }
    }
}

// A strided run: words col0 / PER .. of output row (lane) r, output columns
// col0 on.
fn tile_strided(r: u32, col0: u32) {
    let k = div_small(r, p.rows);
    let slice = p.slice0 + k;
    let row = r - k * p.rows;
    let pos = p.codes.base + slice * p.codes.slice_bits + row * p.codes.lane_bits
        + (col0 / PER) * p.codes.word_bits;
    let o = (r - p.row0) * p.cols + col0;
    let rg = row_groups(row);
    let first = word_values(slice, rg, col0);
    for (var j = 0u; j < RUN; j = j + 1u) {
        let c = col0 + j * PER;
        if (c < p.cols) {
            let word = src[(pos + j * p.codes.word_bits) >> 5u];
            var v = first;
            if (!SHARED) {
                v = word_values(slice, rg, c);
            }
            tile_store_row(word, v, o + j * PER, c);
        }
    }
}

// A transposed run: the code word of output rows r .. r + PER (those of the
// chunk, below end) in output columns col .. col + RUN, which are stored rows
// of `slice`.
fn tile_transposed(r: u32, col: u32, end: u32) {
    let k = div_small(r, p.rows);
    let slice = p.slice0 + k;
    let i0 = r - k * p.rows;
    let pos = p.codes.base + slice * p.codes.slice_bits + col * p.codes.lane_bits
        + (i0 / PER) * p.codes.word_bits;
    // Stored row col + j's groups, stepped along the run.
    var rg = row_groups(col);
    let first = word_values(slice, rg, i0);
    // Output word of row r + m: o0 + m · step, in wrapping arithmetic (r may
    // lie below p.row0; the rows written do not).
    if (OUT == OUT_F32) {
        let o0 = p.out_base + (r - p.row0) * p.cols + col;
        for (var j = 0u; j < RUN; j = j + 1u) {
            if (col + j < p.cols) {
                let w = src[(pos + j * p.codes.lane_bits) >> 5u];
                var v = first;
                if (!SHARED) {
                    v = word_values(slice, rg, i0);
                    rg = next_row(rg);
                }
                for (var m = 0u; m < PER; m = m + 1u) {
                    if (r + m >= p.row0 && r + m < end) {
                        dst[o0 + m * p.cols + j] = tile_out(w, v, m);
                    }
                }
            }
        }
        return;
    }
    // 16-bit outputs pair columns col + j, col + j + 1 (columns and col are
    // even).
    let half = p.cols / 2u;
    let o0 = p.out_base + (r - p.row0) * half + col / 2u;
    for (var j = 0u; j < RUN; j = j + 2u) {
        if (col + j < p.cols) {
            let w0 = src[(pos + j * p.codes.lane_bits) >> 5u];
            let w1 = src[(pos + (j + 1u) * p.codes.lane_bits) >> 5u];
            var v0 = first;
            var v1 = first;
            if (!SHARED) {
                v0 = word_values(slice, rg, i0);
                v1 = word_values(slice, next_row(rg), i0);
                rg = next_row(next_row(rg));
            }
            for (var m = 0u; m < PER; m = m + 1u) {
                if (r + m >= p.row0 && r + m < end) {
                    dst[o0 + m * half + j / 2u] = tile_out(w0, v0, m) | (tile_out(w1, v1, m) << 16u);
                }
            }
        }
    }
}

// The bench baseline: the tile's share of the chunk's code words read in
// order and written as many times as decoding writes output words, in order.
fn tile_copy(g: u32, li: u32) {
    var start = p.codes.base + p.slice0 * p.codes.slice_bits;
    if (PACK == PACK_STRIDED) {
        start = start + p.row0 * p.codes.lane_bits;
    }
    let words = (p.elems + PER - 1u) / PER;
    let per_out = select(PER / 2u, PER, OUT == OUT_F32);
    let out_words = select((p.elems + 1u) / 2u, p.elems, OUT == OUT_F32);
    for (var q = li; q < TILE_WORDS; q = q + WG) {
        let t = g * TILE_WORDS + q;
        if (t < words) {
            let word = src[(start >> 5u) + t];
            for (var i = 0u; i < per_out; i = i + 1u) {
                let o = t * per_out + i;
                if (o < out_words) {
                    dst[p.out_base + o] = word;
                }
            }
        }
    }
}

@compute @workgroup_size(WG)
fn fast_t(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    load_codes(li);
    let g = wid.x + wid.y * (p.row_threads / WG);
    if (COPY) {
        tile_copy(g, li);
        return;
    }
    // Rows count from the start of slice p.slice0; this chunk's are
    // row0..end. Transposed tiles start on a code word (PER rows).
    var tile_rows = TILE_LANES;
    var tile_cols = TILE_RUNS * RUN * PER;
    var first = p.row0;
    if (PACK == PACK_TRANSPOSED) {
        tile_rows = TILE_LANES * PER;
        tile_cols = TILE_RUNS * RUN;
        first = p.row0 - p.row0 % PER;
    }
    let col_tiles = (p.cols + tile_cols - 1u) / tile_cols;
    let rt = g / col_tiles;
    let c0 = (g - rt * col_tiles) * tile_cols;
    let t0 = first + rt * tile_rows;
    let end = p.row0 + p.fast_rows;
    // Consecutive invocations on consecutive runs: each SIMD batch of them
    // (llvmpipe's 8 lanes) writes whole cache lines of output rows, instead
    // of touching lines 4 KiB apart that other batches complete later.
    for (var q = li; q < TILE_LANES * TILE_RUNS; q = q + WG) {
        let a = q / TILE_RUNS;
        let b = q % TILE_RUNS;
        if (PACK == PACK_TRANSPOSED) {
            let r = t0 + a * PER;
            let col = c0 + b * RUN;
            if (r < end && col < p.cols) {
                tile_transposed(r, col, end);
            }
        } else {
            let r = t0 + a;
            let col0 = c0 + b * RUN * PER;
            if (r < end && col0 < p.cols) {
                tile_strided(r, col0);
            }
        }
    }
}


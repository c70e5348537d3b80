// The codebook kernel: DecodeJob's vector codebooks (src/job/codebook.rs,
// Codebook) decoded on the device, one output word per invocation. The
// module is numbers.wgsl (the encodings) then this file
// (src/backend/gpu/codebook.rs puts it together and lays out `src`).
//
// `src` holds, in words: a header (the H_* positions below), the regions
// (REGION_WORDS each, a term TERM_WORDS), the table as f32 bits, the
// column map, the scale's and the offset's entries as f32 bits, and each
// term's index bytes from a word boundary. Mirrors Codebook::sum and
// DecodeJob::codebook_value step for step; the CPU backend is the
// reference and every byte must match it.

struct CbParams {
    // First output row of this dispatch.
    first_row: u32,
    // Output words to write.
    words: u32,
    // Invocations per row of workgroups (a dispatch folded into 2-D).
    stride: u32,
    // Zero, which the compiler cannot see: keeps a product rounded before
    // a sum (no fused multiply-add).
    zero_bits: u32,
    // Output elements of this dispatch.
    elements: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> cp: CbParams;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

const NONE: u32 = 0xffffffffu;
const H_COLS: u32 = 0u;
const H_OUT: u32 = 1u;       // OUT_*: 0 f32, 1 bf16, 2 f16
const H_ARITH: u32 = 2u;     // the same numbers; 0: no rounding
const H_COLMAP: u32 = 3u;    // word of the column map, or NONE
const H_TABLE: u32 = 4u;     // word of the table
const H_REGIONS: u32 = 5u;   // regions
const H_SCALE: u32 = 6u;     // word of the scale's entries, or NONE; then row_div, row_stride, col_div
const H_OFFSET: u32 = 10u;   // the same for the offset
const H_SUM: u32 = 14u;      // Sum: 0 stepwise, 1 embedding bag
const H_REGION0: u32 = 16u;
const MAX_TERMS: u32 = 8u;
const TERM_WORDS: u32 = 10u;
const REGION_WORDS: u32 = 8u + MAX_TERMS * TERM_WORDS;

fn cb_opaque(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) | cp.zero_bits);
}

// Codebook::round: to the arithmetic's dtype.
fn cb_round(x: f32) -> f32 {
    let a = src[H_ARITH];
    if (a == 1u) {
        return bitcast<f32>(to_bf16(x) << 16u);
    }
    if (a == 2u) {
        return f16_to_f32(to_f16(x));
    }
    return cb_opaque(x);
}

// Codebook::round_bag: Sum::EmbeddingBag's one rounding, bf16 with ties
// away from zero (fbgemm's), else cb_round.
fn cb_round_bag(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    if (src[H_ARITH] == 1u && (b & 0x7fffffffu) <= 0x7f800000u) {
        return bitcast<f32>((b + 0x8000u) & 0xffff0000u);
    }
    return cb_round(x);
}

// `bits` bits (at most 24) from bit `pos` of the words from `data` on.
fn cb_bits(data: u32, pos: u32, bits: u32) -> u32 {
    let w = data + pos / 32u;
    let sh = pos % 32u;
    var v = src[w] >> sh;
    if (sh + bits > 32u) {
        v = v | (src[w + 1u] << (32u - sh));
    }
    return v & ((1u << bits) - 1u);
}

// An entry of the scale's or the offset's grid at output (row, col).
fn cb_grid(h: u32, row: u32, col: u32) -> f32 {
    let i = (row / src[h + 1u]) * src[h + 2u] + col / src[h + 3u];
    return bitcast<f32>(src[src[h] + i]);
}

// DecodeJob::codebook_value.
fn cb_value(row: u32, col: u32) -> f32 {
    var sc = col;
    if (src[H_COLMAP] != NONE) {
        sc = src[src[H_COLMAP] + col];
    }
    // The last region starting at or before the stored column.
    var rb = H_REGION0;
    for (var r = 1u; r < src[H_REGIONS]; r = r + 1u) {
        let b = H_REGION0 + r * REGION_WORDS;
        if (sc >= src[b]) {
            rb = b;
        }
    }
    let lc = sc - src[rb];
    let tr = src[rb + 2u];
    let tc = src[rb + 3u];
    let ti = row / tr;
    let tj = lc / tc;
    let len = tr * tc;
    let p = (row % tr) * tc + lc % tc;
    let table = src[H_TABLE];
    var acc = 0.0;
    let bag = src[H_SUM] == 1u;
    for (var t = 0u; t < src[rb + 4u]; t = t + 1u) {
        let tb = rb + 8u + t * TERM_WORDS;
        let group = src[tb + 4u];
        let g = tj / group;
        let pos = src[tb + 2u] + ti * src[tb + 3u] + g * src[tb + 5u] + (tj % group) * src[tb + 6u];
        let index = cb_bits(src[tb], pos, src[tb + 1u]);
        let x = bitcast<f32>(src[table + src[tb + 7u] + (g * src[tb + 8u] + index) * len + p]);
        if (t == 0u) {
            acc = x;
        } else if (bag) {
            acc = cb_opaque(acc + x);
        } else {
            acc = cb_round(acc + x);
        }
    }
    if (bag) {
        acc = cb_round_bag(acc);
    }
    if (src[H_SCALE] != NONE) {
        acc = cb_round(acc * cb_grid(H_SCALE, row, col));
    }
    if (src[H_OFFSET] != NONE) {
        acc = cb_round(acc + cb_grid(H_OFFSET, row, col));
    }
    return acc;
}

fn cb_element(e: u32) -> f32 {
    let cols = src[H_COLS];
    return cb_value(cp.first_row + e / cols, e % cols);
}

@compute @workgroup_size(64)
fn codebook(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = gid.x + gid.y * cp.stride;
    if (w >= cp.words) {
        return;
    }
    let out = src[H_OUT];
    if (out == 0u) {
        dst[w] = to_f32(cb_element(w));
        return;
    }
    // Two 16-bit elements a word, the first in the low half; past the
    // last element the high half stays zero.
    let n = cp.elements;
    var lo = 0u;
    var hi = 0u;
    if (out == 1u) {
        lo = to_bf16(cb_element(2u * w));
        if (2u * w + 1u < n) {
            hi = to_bf16(cb_element(2u * w + 1u));
        }
    } else {
        lo = to_f16(cb_element(2u * w));
        if (2u * w + 1u < n) {
            hi = to_f16(cb_element(2u * w + 1u));
        }
    }
    dst[w] = lo | (hi << 16u);
}

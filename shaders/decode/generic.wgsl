// DecodeJob::value step by step (low-rank branch, post scale, offsets,
// the product's rounding), the output dtypes' encodings, and the generic
// kernel `main`, which runs any job. Part of the decode module
// (protocol.wgsl says how it is put together).

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
    var at = p.lr_smooth + col;
    if (p.lr_period > 1u) {
        // LowRank::factor: the row's (over slices) row of factors, each
        // lr_row_div rows, repeating every lr_period of them (SINQ's
        // grouped rows, its 2D tiles).
        at = at + ((flat / p.lr_row_div) % p.lr_period) * p.cols;
    }
    let rs = bitcast<f32>(src[at]);
    let qs = opaque(q * s);
    // Rank 0: the smoothing alone, nothing added (LowRank::apply).
    if (p.lr_rank == 0u) {
        if (p.lr_mode == LOW_RANK_SMOOTH_IN_PRODUCT) {
            // LowRank::in_product: in the product's dtype (scaled()).
            return in_product(opaque(scaled(q, s, true)) * in_product(rs));
        }
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


// Reading `src`: bit fields of code streams (plain, in blocks' planes),
// f16 bits, and grid entries (scales, zero points) in each GRID_* storage.
// Part of the decode module (protocol.wgsl says how it is put together).

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
    var base = st.base + slice * st.slice_bits + lane * st.lane_bits;
    if (st.part_lanes != 0u) {
        let k = lane / st.part_lanes;
        base = st.base + slice * st.slice_bits + (lane - k * st.part_lanes) * st.lane_bits - k * st.part_down;
    }
    let lo_n = min(32u - off, st.bits);
    // High-first fields never cross a byte (the host's rule), so only the
    // first read is swapped; base is a multiple of 8, so XOR commutes with it.
    var v = bits_at((base + w * st.word_bits + off) ^ st.swap, lo_n);
    if (lo_n < st.bits) {
        v = v | (bits_at(base + (w + 1u) * st.word_bits, st.bits - lo_n) << lo_n);
    }
    return v;
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
            // job::Nested::get: two operations, each rounded (to f32, or
            // to round's 16-bit dtype).
            let b = (word >> ((pos & 3u) * 8u)) & 0xffu;
            let t = bitcast<f32>(src[g.table + b]);
            var k = idx / g.per_outer;
            if (g.cycle != 0u) {
                k = k % g.cycle;
            }
            var add = g.offset;
            if (g.adds != NO_G_IDX) {
                add = bitcast<f32>(src[g.adds + k]);
            }
            let prod = in_product_as(opaque(t * bitcast<f32>(src[g.outer + k])), g.round);
            return in_product_as(opaque(prod + add), g.round);
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


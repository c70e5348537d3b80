// A row's code words, its groups' scales and zero points, its values as W
// holds them, and the pairwise sums that finish a product and write y.
// Part of the matrix product kernels (gemv.wgsl says how they are put
// together).

// Where a column is in its scale group and plain zero-point group: each
// a quot_rem (rows of one group: 0).
struct GroupAt {
    s: vec2<u32>,
    z: vec2<u32>,
}

fn group_step(col: u32) -> GroupAt {
    var at: GroupAt;
    if (SCALED && RELOAD != 0u) {
        at.s = quot_rem(col, p.sgrid.col_div);
    }
    if (zero_grid() && RELOAD != 0u) {
        at.z = quot_rem(col, p.zgrid.col_div);
    }
    return at;
}

// `at` moved on by `by` columns' groups (group_step of the stride).
fn group_next(at: GroupAt, by: GroupAt) -> GroupAt {
    var next = at;
    if (SCALED && RELOAD != 0u) {
        next.s = carry(at.s, by.s, p.sgrid.col_div);
    }
    if (zero_grid() && RELOAD != 0u) {
        next.z = carry(at.z, by.z, p.zgrid.col_div);
    }
    return next;
}

fn carry(at: vec2<u32>, by: vec2<u32>, d: u32) -> vec2<u32> {
    let r = at.y + by.y;
    return select(vec2<u32>(at.x + by.x, r), vec2<u32>(at.x + by.x + 1u, r - d), r >= d);
}

// A code word of a row and its group's scale and zero point.
struct Fetched {
    word: u32,
    group: Group,
}

fn fetch(start: RowStart, w: u32, at: GroupAt) -> Fetched {
    return Fetched(code_word(start.at, w * PER), group_of_row(start.sat, start.zat, at.s.x, at.z.x));
}

// Adds a fetched word at col0 times x's values to the sum of its row
// (product_rows with one row of x; READ: the word as a number, times x's
// first value).
fn add_fetched(acc: ptr<function, array<f32, 16>>, f: Fetched, xo: array<u32, 16>, flat: u32, col0: u32) {
    if (READ) {
        let raw = (read_word(f.word) - f.group.z) * f.group.s;
        for (var t = 0u; t < MT; t = t + 1u) {
            (*acc)[t] = (*acc)[t] + raw * xs[xo[t] + col0];
        }
        return;
    }
    let v = word_values8(f.word, f.group, flat, col0);
    for (var t = 0u; t < MT; t = t + 1u) {
        let x = x_word(xo[t] + col0, col0);
        var a = (*acc)[t] + dot(v.lo, x[0]);
        if (PER == 8u) {
            a = a + dot(v.hi, x[1]);
        }
        (*acc)[t] = a;
    }
}

// A code word's values as W holds them, in vec4s (not an array).
struct Values8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// The values of a row's code word at col0, decoded with its group's scale
// and zero point (hi: zero for 8-bit codes).
fn word_values8(word: u32, group: Group, flat: u32, col0: u32) -> Values8 {
    var v: Values8;
    v.lo = vec4<f32>(word_value(word, 0u, group, flat, col0), word_value(word, 1u, group, flat, col0),
                     word_value(word, 2u, group, flat, col0), word_value(word, 3u, group, flat, col0));
    if (PER == 8u) {
        v.hi = vec4<f32>(word_value(word, 4u, group, flat, col0), word_value(word, 5u, group, flat, col0),
                         word_value(word, 6u, group, flat, col0), word_value(word, 7u, group, flat, col0));
    }
    return v;
}

// Value j of a row's code word at col0 as W holds it (zero past the row).
fn word_value(word: u32, j: u32, group: Group, flat: u32, col0: u32) -> f32 {
    let c = (word >> (slot_of(j) * BITS)) & ((1u << BITS) - 1u);
    let value = w_value(c, group.z, group.s, flat, col0 + j);
    if (X4) {
        return value;
    }
    return select(0.0, value, col0 + j < p.cols);
}

// Where a row of the chunk starts: its row over all slices, its code bits,
// scale and zero-point entries, less the column's part (rows past the
// chunk read its last one's).
struct RowStart {
    flat: u32,
    at: u32,
    sat: u32,
    zat: u32,
}

fn row_start(local: u32) -> RowStart {
    let r = min(local, p.fast_rows - 1u);
    let k = div_small(p.row0 + r, p.rows);
    let slice = p.slice0 + k;
    let row = p.row0 + r - k * p.rows;
    var start: RowStart;
    start.flat = p.first_row + r;
    start.at = p.codes.base + slice * p.codes.slice_bits + row * p.codes.lane_bits;
    if (SCALED) {
        start.sat = fast_index(p.sgrid, slice, row, 0u);
    }
    if (ZERO == ZERO_PACKED) {
        let b = row * BITS;
        start.zat = p.zero.base + slice * p.zero.slice_bits + (b >> 5u) * p.zero.word_bits + (b & 31u);
    } else if (zero_grid()) {
        start.zat = fast_index(p.zgrid, slice, row, 0u);
    }
    return start;
}

// The code word at col0 of the row whose codes start at bit `at` of src:
// BITS-wide fields LSB first, read in the blocks where they lie (BLOCKED,
// GGUF's) as the fast kernel reads them.
fn code_word(at: u32, col0: u32) -> u32 {
    if (BLOCKED) {
        return blocked_word_at(at, col0);
    }
    return row_word(at + col0 * BITS);
}

// READ: a code word as a number, from all of its bits (its low half
// alone would let the compiler drop the reads that bring only the high
// one: half a word of codes in blocks, GGUF's nibbles).
fn read_word(word: u32) -> f32 {
    return f32((word ^ (word >> 16u)) & 0xffffu);
}

// The code word whose first field is at bit `pos` of src, LSB first.
fn row_word(pos: u32) -> u32 {
    var word = lsb_first(src[pos >> 5u]);
    if (!ALIGNED) {
        let sh = pos & 31u;
        if (sh != 0u) {
            word = (word >> sh) | (lsb_first(src[(pos >> 5u) + 1u]) << (32u - sh));
        }
    }
    return word;
}

// A row's scale (1 without) and zero point in a group.
struct Group {
    s: f32,
    z: f32,
}

// The group of column col0 of a row whose first scale and zero-point
// entries are sat and zat.
fn group_entry(sat: u32, zat: u32, col0: u32) -> Group {
    var gs = 0u;
    if (SCALED) {
        gs = div_small(col0, p.sgrid.col_div);
    }
    var gz = 0u;
    if (zero_grid()) {
        gz = div_small(col0, p.zgrid.col_div);
    }
    return group_of_row(sat, zat, gs, gz);
}

// The scale (group gs) and zero point (packed: group gs; plain: gz) of a
// row whose first entries are sat and zat.
fn group_of_row(sat: u32, zat: u32, gs: u32, gz: u32) -> Group {
    var group = Group(1.0, 0.0);
    if (SCALED) {
        group.s = value_as(p.sgrid, sat + gs, SKIND);
    }
    // Packed zero points take the scale's groups (one a row without).
    if (ZERO == ZERO_PACKED) {
        let zp = zat + gs * p.zero.lane_bits;
        group.z = code_value((src[zp >> 5u] >> (zp & 31u)) & ((1u << BITS) - 1u));
    } else if (zero_grid()) {
        group.z = value_as(p.zgrid, zat + gz, ZKIND);
    }
    return group;
}

// The scales (s) and zero points (z) of the RB rows' group of column col0
// (sat, zat: each row's first entries).
fn group_values(s: ptr<function, array<f32, 8>>, z: ptr<function, array<f32, 8>>,
                sat: array<u32, 8>, zat: array<u32, 8>, col0: u32) {
    for (var r = 0u; r < RB; r = r + 1u) {
        let group = group_entry(sat[r], zat[r], col0);
        (*s)[r] = group.s;
        (*z)[r] = group.z;
    }
}

// Adds up each row's partial sums pairwise over its `lanes` invocations (a
// fixed order) and writes y, with the bias: rows local0 + r of the chunk,
// 8 / RB rows of x a pass.
fn gemv_sum(acc: array<f32, 64>, li: u32, lane: u32, lanes: u32, local0: u32, m0: u32) {
    let tp = 8u / RB;
    let per = RB * tp;
    for (var t0 = 0u; t0 < MT; t0 = t0 + tp) {
        for (var r = 0u; r < RB; r = r + 1u) {
            for (var u = 0u; u < tp; u = u + 1u) {
                sums[li * per + r * tp + u] = acc[r * MT + min(t0 + u, MT - 1u)];
            }
        }
        workgroupBarrier();
        sum_pairwise(li, lane, lanes, per);
        if (lane == 0u) {
            for (var r = 0u; r < RB; r = r + 1u) {
                let local = local0 + r;
                for (var u = 0u; u < tp; u = u + 1u) {
                    let m = m0 + t0 + u;
                    if (local < p.fast_rows && t0 + u < MT && m < gm.m) {
                        write_y(sums[li * per + r * tp + u], local, m);
                    }
                }
            }
        }
        workgroupBarrier();
    }
}

// Adds up each row's partial sums pairwise (a fixed order) and writes y,
// with the bias (gemv_dense: a row an invocation).
fn gemv_finish(acc: array<f32, 16>, li: u32, lane: u32, local: u32, m0: u32, per_row: u32) {
    for (var t = 0u; t < MT; t = t + 1u) {
        sums[li * MT + t] = acc[t];
    }
    workgroupBarrier();
    sum_pairwise(li, lane, per_row, MT);
    if (lane == 0u && local < p.fast_rows) {
        for (var t = 0u; t < MT; t = t + 1u) {
            let m = m0 + t;
            if (m < gm.m) {
                write_y(sums[li * MT + t], local, m);
            }
        }
    }
}

// Adds each invocation's `per` partial sums (at sums[li · per ..]) to those
// of the invocation `half` on, halving over `lanes` invocations: a fixed
// order, each pass ended by a barrier (so called in uniform control flow).
fn sum_pairwise(li: u32, lane: u32, lanes: u32, per: u32) {
    for (var half = lanes / 2u; half > 0u; half = half / 2u) {
        if (lane < half) {
            for (var j = 0u; j < per; j = j + 1u) {
                sums[li * per + j] = sums[li * per + j] + sums[(li + half) * per + j];
            }
        }
        workgroupBarrier();
    }
}

// Writes y of row `local` of the chunk and row m of x, with the bias:
// added to the sums of the inputs before W's (gm.acc), which an earlier
// dispatch wrote there.
fn write_y(sum: f32, local: u32, m: u32) {
    let at = p.out_base + m * gm.n + p.first_row + local - gm.row0;
    var y = sum;
    if (gm.acc != 0u) {
        y = bitcast<f32>(dst[at]) + y;
    }
    if (gm.bias != NO_G_IDX) {
        y = y + bitcast<f32>(src[gm.bias + local]);
    }
    dst[at] = bitcast<u32>(y);
}

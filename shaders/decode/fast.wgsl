// Part of the decode module (protocol.wgsl says how it is put together).
//
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
// CODE_SMALL_TABLE: the 16 entries plus 128, a byte each, in registers.
var<private> codes8: vec4<u32>;

// Loads a CODE_TABLE job's table (every entry point that decodes words
// calls it first, from uniform control flow).
fn load_codes(li: u32) {
    if ((CODE == CODE_TABLE || CODE == CODE_SMALL_TABLE) && !COPY) {
        for (var i = li; i < (1u << BITS); i = i + WG) {
            codes_table[i] = bitcast<f32>(src[p.code_table + i]);
        }
        workgroupBarrier();
        if (BITS == 4u) {
            for (var i = 0u; i < 4u; i = i + 1u) {
                let t = 4u * i;
                codes16[i] = vec4<f32>(codes_table[t], codes_table[t + 1u], codes_table[t + 2u], codes_table[t + 3u]);
                // Entries past a shorter table are never read.
                var bytes = 0u;
                for (var k = 0u; k < 4u; k = k + 1u) {
                    bytes = bytes | ((u32(i32(codes_table[t + k]) + 128) & 0xffu) << (8u * k));
                }
                codes8[i] = bytes;
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
    if (CODE == CODE_SMALL_TABLE && BITS == 4u) {
        // The entry's word by three selects, its byte by a shift, and the
        // byte (the value plus 128) placed under the mantissa of 2^23 as
        // small_f32 does: exact.
        let high = (c & 4u) != 0u;
        let q = select(select(codes8.x, codes8.y, high), select(codes8.z, codes8.w, high), (c & 8u) != 0u);
        return bitcast<f32>(0x4B000000u | ((q >> ((c & 3u) << 3u)) & 0xffu)) - 8388736.0;
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
        if (!integers && (CODE == CODE_TABLE || CODE == CODE_SMALL_TABLE || ZERO == ZERO_PLAIN || ZERO == ZERO_PACKED)) {
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
    return blocked_word_at(st.base + slice * st.slice_bits + row * st.lane_bits, col0);
}

// blocked_word of the row whose blocks start at bit `at` of src (the
// products' RowStart::at).
fn blocked_word_at(at: u32, col0: u32) -> u32 {
    let st = p.codes;
    let n = col0 >> countTrailingZeros(st.block_len);
    let e0 = col0 & (st.block_len - 1u);
    let start = at + n * st.block_bits;
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


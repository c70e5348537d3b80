// The matrix product kernels. Their module is the decode module
// (shaders/decode/), these fragments of shaders/matmul/ in this order, then
// the entry points of subgroups.wgsl or no_subgroups.wgsl, put together by
// the host (src/backend/gpu/matmul/mod.rs): gemv.wgsl (this file: the products'
// bindings and constants, reads of x, and the packed kernels behind `gemv`
// and `gemv_rows`), rows.wgsl (a row's words, groups and values, and the
// sums that finish a product) and others.wgsl (the dense baseline, `gemv_t`
// for act-order packs, and the empty dispatch).
//
// y = x·Wᵀ (+ bias), W read from the packs the fast kernel decodes (same Params, same word and scale lookups, same
// fast_value), never written out dense. W is the dense weight dequantize
// writes: each value rounded to the output dtype (OUT), widened back to f32.
// x is [m, cols] and y [m, n] row-major f32; the bias, when there is one,
// is f32 in src after the chunk's inputs.
//
// A workgroup takes GEMV_ROWS rows of W and MT rows of x: the WG /
// GEMV_ROWS invocations of a row read its code words in turn (neighbouring
// invocations, neighbouring words), decode each once and multiply it with
// the MT rows of x, summing in f32 in word order; the row's partial sums
// are then added pairwise in workgroup memory, in a fixed order, so a
// result is the same from run to run.

struct Gemv {
    m: u32,       // rows of x and y
    n: u32,       // y's row length (W's rows, every chunk's)
    bias: u32,    // word index in src of this chunk's first row's bias, or NO_G_IDX
    row0: u32,    // W's first row in its job (an expert's in a stack): y's column 0
    x_stride: u32,  // x's row length: the Linear's inputs, of which W's columns are some
    x0: u32,      // x's column of W's column 0 (a block of an SVDQuant module's inputs)
    acc: u32,     // 1: y += the sums (the module's later blocks of inputs), then the bias
    pad: u32,
}

@group(0) @binding(3) var<storage, read> xs: array<f32>;
@group(0) @binding(4) var<uniform> gm: Gemv;

override GEMV_ROWS: u32 = 4u;  // rows of W per workgroup
override RB: u32 = 1u;         // of them per invocation: 1, 2, 4 or 8
override MT: u32 = 1u;         // rows of x per workgroup, 1..=16
// The bench's baseline: the same reads of words, scales, zero points and
// x, each word summed as a number instead of decoded.
override READ: bool = false;
// x's rows hold whole vec4s and W's rows whole code words (gemv, gemv_t
// strided): x is read four values at a time (xs4, x's buffer again),
// which llvmpipe runs as one load, not four.
override X4: bool = false;
// gemv: every row's codes start on a word of src (no second word to shift in).
override ALIGNED: bool = false;
// gemv_dense: words a load of W brings, 1 or 4 (src4: src's buffer again,
// as vec4s), where every row starts on 16 bytes and holds whole vec4s.
override WIDE: u32 = 1u;
// gemv_rows with one row of x: words an invocation fetches before it
// decodes them, 1 or 2.
override UNROLL: u32 = 1u;
// How a value of W is rounded to OUT (the host's Rounding): not at all,
// where OUT holds every value exactly (the host checks the codes and
// scales: E2M1 codes times e8m0 scales, to bf16); to bf16 by the carry
// alone, where no value is NaN; or as dequantize does.
override ROUNDING: u32 = 2u;
const ROUND_NONE = 0u;
const ROUND_CARRY = 1u;
// x read once for a subgroup's lanes: lane j reads the values of the j-th
// word (or input) of each run of a subgroup's size, and every lane takes
// them from it in turn (shuffle4, shuffle1). For CPU adapters, whose
// invocations are a core's vector lanes, with an invocation a block of
// rows (lanes = 1): llvmpipe runs a load of each invocation's own address
// one invocation at a time, and the loads of x were most of a product's
// time there (with it: 4 rows of x cost what 1 did).
override SHARE_X: bool = false;
// Words an invocation takes in a row before the next invocation's (the
// next run's): SHARE_X's subgroup size, or on a CPU adapter 8; 1 on GPUs,
// where neighbouring invocations read neighbouring words. x (SHARE_X) is
// read at a run's start and the scales at each RELOAD words' start, each
// outside the loop over the words they serve: llvmpipe runs a load inside
// an `if` (a word that starts a group, or a subgroup's run) at every
// word, lanes masked or not.
override XRUN: u32 = 1u;
// Words between the scale and zero-point reloads: groups' and XRUN's
// greatest common divisor (in words), fixed by the host; 0 where a row is
// one group (read once).
override RELOAD: u32 = 1u;
// The words each reload serves.
override STEP: u32 = select(RELOAD, XRUN, RELOAD == 0u);

// An invocation's place in its subgroup (no_subgroups.wgsl: a subgroup of one).
struct Subgroup {
    lane: u32,
    size: u32,
}

@group(0) @binding(5) var<storage, read> xs4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> src4: array<vec4<u32>>;

var<workgroup> sums: array<f32, 2048>;  // partial sums, 8 per invocation a pass

// `v` as dequantize writes it (rounded to OUT), widened back.
fn as_written(v: f32) -> f32 {
    if (OUT == OUT_BF16) {
        if (ROUNDING == ROUND_CARRY) {
            return bitcast<f32>(bf16_carry(bitcast<u32>(v)));
        }
        return bitcast<f32>(to_bf16(v) << 16u);
    }
    if (OUT == OUT_F16) {
        return f16_to_f32(to_f16(v));
    }
    return v;
}

// fast_value as dequantize writes it: already in OUT's dtype when the
// product is computed in it (and nothing scales it after).
fn w_value(c: u32, z: f32, s: f32, flat: u32, col: u32) -> f32 {
    let v = fast_value(c, z, s, flat, col);
    if (OUT == OUT_F32 || ROUNDING == ROUND_NONE || (PRODUCT == OUT && !POST && ZERO != ZERO_OFFSET)) {
        return v;
    }
    return as_written(v);
}

// Word index of x[m, 0] for each of the MT rows of x from m0 (the last row
// of x again past it: computed, never written).
fn x_rows(m0: u32) -> array<u32, 16> {
    var xo: array<u32, 16>;
    for (var t = 0u; t < MT; t = t + 1u) {
        xo[t] = min(m0 + t, gm.m - 1u) * gm.x_stride + gm.x0;
    }
    return xo;
}

// x[.., at + i] for i < PER (row offset included in `at`) as two vec4s,
// zero from column `cols` on (X4: there is none) and past PER.
fn x_word(at: u32, col0: u32) -> array<vec4<f32>, 2> {
    var x: array<vec4<f32>, 2>;
    if (X4) {
        x[0] = xs4[at >> 2u];
        if (PER == 8u) {
            x[1] = xs4[(at >> 2u) + 1u];
        }
        return x;
    }
    for (var i = 0u; i < PER; i = i + 1u) {
        x[i / 4u][i % 4u] = select(0.0, xs[at + i], col0 + i < p.cols);
    }
    return x;
}

// SHARE_X: x's values for the run of words from w0, for the rows of x at
// xo: lane j reads word w0 + j's (the last word again past the row's),
// and word w0 + k's are then taken from lane k (XRUN is the subgroup's
// size).
fn x_shared(xl: ptr<function, array<vec4<f32>, 32>>, xo: array<u32, 16>, w0: u32, words: u32, sg: Subgroup) {
    let col0 = min(w0 + sg.lane, words - 1u) * PER;
    for (var t = 0u; t < MT; t = t + 1u) {
        let x = x_word(xo[t] + col0, col0);
        (*xl)[2u * t] = x[0];
        (*xl)[2u * t + 1u] = x[1];
    }
}

// x's values of the word at col0 for the MT rows of x, two vec4s a row
// (READ: the first value only); i: the word's place in its run (SHARE_X).
fn word_x(xo: array<u32, 16>, col0: u32, xl: ptr<function, array<vec4<f32>, 32>>, i: u32) -> array<vec4<f32>, 32> {
    var xw: array<vec4<f32>, 32>;
    for (var t = 0u; t < MT; t = t + 1u) {
        if (READ) {
            if (SHARE_X) {
                xw[2u * t].x = shuffle1((*xl)[2u * t].x, i);
            } else {
                xw[2u * t].x = xs[xo[t] + col0];
            }
            continue;
        }
        if (SHARE_X) {
            xw[2u * t] = shuffle4((*xl)[2u * t], i);
            if (PER == 8u) {
                xw[2u * t + 1u] = shuffle4((*xl)[2u * t + 1u], i);
            }
        } else {
            let x = x_word(xo[t] + col0, col0);
            xw[2u * t] = x[0];
            xw[2u * t + 1u] = x[1];
        }
    }
    return xw;
}

// Adds row r's code word at col0, decoded with its values `wv`, times x's
// values `xw`, to the MT sums of the row (READ: the word as a number,
// times x's first value). Called once per row with r a constant
// (add_words): llvmpipe keeps the arrays indexed by r in registers only
// where the loop over r unrolls, and with the decode inside, it did not;
// a call per row made the straight and strided products faster there
// (docs/performance.md#gpu-products).
fn add_word(acc: ptr<function, array<f32, 64>>, xw: ptr<function, array<vec4<f32>, 32>>, r: u32,
            word: u32, wv: WordValues, flat: u32, col0: u32) {
    if (READ) {
        let raw = (read_word(word) - wv.z[0]) * wv.s[0];
        for (var t = 0u; t < MT; t = t + 1u) {
            (*acc)[r * MT + t] = (*acc)[r * MT + t] + raw * (*xw)[2u * t].x;
        }
        return;
    }
    var v: array<vec4<f32>, 2>;
    for (var j = 0u; j < PER; j = j + 1u) {
        v[j / 4u][j % 4u] = word_value(word, j, Group(wv.s[j], wv.z[j]), flat, col0);
    }
    for (var t = 0u; t < MT; t = t + 1u) {
        var a = (*acc)[r * MT + t] + dot(v[0], (*xw)[2u * t]);
        if (PER == 8u) {
            a = a + dot(v[1], (*xw)[2u * t + 1u]);
        }
        (*acc)[r * MT + t] = a;
    }
}

// add_word for the RB rows' words, each call with its row a constant.
fn add_words(acc: ptr<function, array<f32, 64>>, xw: ptr<function, array<vec4<f32>, 32>>,
             words: array<u32, 8>, wvs: ptr<function, array<WordValues, 8>>, flat: array<u32, 8>, col0: u32) {
    add_word(acc, xw, 0u, words[0], (*wvs)[0], flat[0], col0);
    if (RB > 1u) {
        add_word(acc, xw, 1u, words[1], (*wvs)[1], flat[1], col0);
    }
    if (RB > 2u) {
        add_word(acc, xw, 2u, words[2], (*wvs)[2], flat[2], col0);
        add_word(acc, xw, 3u, words[3], (*wvs)[3], flat[3], col0);
    }
    if (RB > 4u) {
        add_word(acc, xw, 4u, words[4], (*wvs)[4], flat[4], col0);
        add_word(acc, xw, 5u, words[5], (*wvs)[5], flat[5], col0);
        add_word(acc, xw, 6u, words[6], (*wvs)[6], flat[6], col0);
        add_word(acc, xw, 7u, words[7], (*wvs)[7], flat[7], col0);
    }
}

// A workgroup takes GEMV_ROWS rows of W and MT rows of x; an invocation
// takes RB consecutive rows, and the WG · RB / GEMV_ROWS invocations of a
// block of rows read its code words in turn (neighbouring invocations,
// neighbouring words). Each word of the RB rows is decoded once, each
// value of x read once for all RB rows (SHARE_X: for a subgroup's), each
// scale and zero point once per group, and the sums are f32, in word
// order.
fn product(wid: vec3<u32>, li: u32, sg: Subgroup) {
    load_codes(li);
    let lanes = WG * RB / GEMV_ROWS;
    let lane = li % lanes;
    let local0 = wid.x * GEMV_ROWS + (li / lanes) * RB;
    let m0 = wid.y * MT;
    let xo = x_rows(m0);
    var at: array<u32, 8>;
    var sat: array<u32, 8>;
    var zat: array<u32, 8>;
    var flat: array<u32, 8>;
    for (var r = 0u; r < RB; r = r + 1u) {
        let start = row_start(local0 + r);
        at[r] = start.at;
        sat[r] = start.sat;
        zat[r] = start.zat;
        flat[r] = start.flat;
    }
    var acc: array<f32, 64>;  // [r · MT + t]
    var xl: array<vec4<f32>, 32>;
    var s: array<f32, 8>;  // the rows' scales and zero points
    var z: array<f32, 8>;
    if (RELOAD == 0u) {
        group_values(&s, &z, sat, zat, 0u);
    }
    let words = p.words_per_row;
    for (var w0 = lane * XRUN; w0 < words; w0 = w0 + lanes * XRUN) {
        if (SHARE_X) {
            x_shared(&xl, xo, w0, words, sg);
        }
        let end = min(w0 + XRUN, words);
        for (var g0 = w0; g0 < end; g0 = g0 + STEP) {
            if (RELOAD != 0u) {
                group_values(&s, &z, sat, zat, g0 * PER);
            }
            var wvs: array<WordValues, 8>;
            for (var r = 0u; r < RB; r = r + 1u) {
                for (var j = 0u; j < PER; j = j + 1u) {
                    wvs[r].s[j] = select(1.0, s[r], SCALED);
                    wvs[r].z[j] = z[r];
                }
            }
            for (var w = g0; w < min(g0 + STEP, end); w = w + 1u) {
                let col0 = w * PER;
                var xw = word_x(xo, col0, &xl, w - w0);
                var words: array<u32, 8>;
                for (var r = 0u; r < RB; r = r + 1u) {
                    words[r] = code_word(at[r], col0);
                }
                add_words(&acc, &xw, words, &wvs, flat, col0);
            }
        }
    }
    gemv_sum(acc, li, lane, lanes, local0, m0);
}

// On GPUs: product_dense's geometry and order with the packs' words: a
// workgroup takes GEMV_ROWS rows of W and MT rows of x, and the WG /
// GEMV_ROWS invocations of a row read its code words in turn (neighbouring
// invocations, neighbouring words), each decoded once for the MT rows of
// x, with the row's scale and zero point of the word's group; the sums
// are f32, in word order, then pairwise (gemv_finish). Nothing but x's
// values and the sums is kept per row of x: product's blocks of rows, with
// their arrays of values per row and word, ran a GPU (an H200) far below
// the dense product's speed per byte. RB is 1.
//
// The two loops below are the fastest of the forms an H200 ran
// (docs/performance.md#gpu-products), which differ by the rows of x:
// - one row (a token): an invocation fetches UNROLL words and their groups'
//   entries before it decodes the first, so that their loads wait
//   together; the groups are stepped, not divided; a word's values go into
//   vec4s by eight calls (faster than an array and a loop);
// - more rows: the word's values through a loop and an array (4-bit codes;
//   8-bit ones by eight calls) and the sums in this function, passed to
//   none (faster than by eight calls, or with add_fetched).
fn product_rows(wid: vec3<u32>, li: u32) {
    load_codes(li);
    let per_row = WG / GEMV_ROWS;
    let lane = li % per_row;
    let local = wid.x * GEMV_ROWS + li / per_row;
    let start = row_start(local);
    let xo = x_rows(wid.y * MT);
    var acc: array<f32, 16>;
    let words = p.words_per_row;
    if (MT == 1u) {
        var at = group_step(lane * PER);
        let by = group_step(per_row * PER);
        for (var w0 = lane; w0 < words; w0 = w0 + per_row * UNROLL) {
            let w1 = w0 + per_row;
            let next = group_next(at, by);
            let first = fetch(start, w0, at);
            var second: Fetched;
            if (UNROLL == 2u) {
                // Past the row: its last word again, not added.
                second = fetch(start, min(w1, words - 1u), next);
            }
            add_fetched(&acc, first, xo, start.flat, w0 * PER);
            if (UNROLL == 2u && w1 < words) {
                add_fetched(&acc, second, xo, start.flat, w1 * PER);
            }
            at = next;
            if (UNROLL == 2u) {
                at = group_next(next, by);
            }
        }
    } else {
        var group = group_entry(start.sat, start.zat, 0u);
        for (var w = lane; w < words; w = w + per_row) {
            let col0 = w * PER;
            if (RELOAD != 0u) {
                group = group_entry(start.sat, start.zat, col0);
            }
            let word = code_word(start.at, col0);
            if (READ) {
                let raw = (read_word(word) - group.z) * group.s;
                for (var t = 0u; t < MT; t = t + 1u) {
                    acc[t] = acc[t] + raw * xs[xo[t] + col0];
                }
                continue;
            }
            var v: Values8;
            if (PER == 4u) {
                v = word_values8(word, group, start.flat, col0);
            } else {
                var a: array<vec4<f32>, 2>;
                for (var j = 0u; j < PER; j = j + 1u) {
                    a[j / 4u][j % 4u] = word_value(word, j, group, start.flat, col0);
                }
                v = Values8(a[0], a[1]);
            }
            for (var t = 0u; t < MT; t = t + 1u) {
                let x = x_word(xo[t] + col0, col0);
                var a = acc[t] + dot(v.lo, x[0]);
                if (PER == 8u) {
                    a = a + dot(v.hi, x[1]);
                }
                acc[t] = a;
            }
        }
    }
    gemv_finish(acc, li, lane, local, wid.y * MT, per_row);
}

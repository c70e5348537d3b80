// The other products: the dense baseline, gemv for act-order packs
// (`gemv_t`), and the bench's empty dispatch. Part of the matrix product
// kernels (gemv.wgsl says how they are put together).

// The bench's other baseline, the path an app has without packed products:
// the same product with a dense bf16 W (two to a word in src, rows
// p.words_per_row words apart), in gemv's geometry and order.
fn product_dense(wid: vec3<u32>, li: u32, sg: Subgroup) {
    let per_row = WG / GEMV_ROWS;
    let lane = li % per_row;
    let local = wid.x * GEMV_ROWS + li / per_row;
    // Rows past the chunk read its last one's (SHARE_X: every lane runs).
    let row = min(local, p.fast_rows - 1u);
    let m0 = wid.y * MT;
    let xo = x_rows(m0);
    var acc: array<f32, 16>;
    var xl: array<vec4<f32>, 32>;
    let words = p.words_per_row;
    if (WIDE == 4u) {
        // Eight values a load, x's four at a time.
        for (var q = lane; q < words / 4u; q = q + per_row) {
            let run = src4[row * (words / 4u) + q];
            let w0 = vec4<f32>(bitcast<f32>(run.x << 16u), bitcast<f32>(run.x & 0xffff0000u),
                               bitcast<f32>(run.y << 16u), bitcast<f32>(run.y & 0xffff0000u));
            let w1 = vec4<f32>(bitcast<f32>(run.z << 16u), bitcast<f32>(run.z & 0xffff0000u),
                               bitcast<f32>(run.w << 16u), bitcast<f32>(run.w & 0xffff0000u));
            for (var t = 0u; t < MT; t = t + 1u) {
                let at = (xo[t] >> 2u) + 2u * q;
                acc[t] = acc[t] + dot(w0, xs4[at]) + dot(w1, xs4[at + 1u]);
            }
        }
        gemv_finish(acc, li, lane, local, m0, per_row);
        return;
    }
    for (var w0 = lane * XRUN; w0 < words; w0 = w0 + per_row * XRUN) {
        if (SHARE_X) {
            let at = 2u * min(w0 + sg.lane, words - 1u);
            for (var t = 0u; t < MT; t = t + 1u) {
                xl[t] = vec4<f32>(xs[xo[t] + at], xs[xo[t] + at + 1u], 0.0, 0.0);
            }
        }
        for (var w = w0; w < min(w0 + XRUN, words); w = w + 1u) {
            let k = w - w0;
            let word = src[row * words + w];
            let lo = bitcast<f32>(word << 16u);
            let hi = bitcast<f32>(word & 0xffff0000u);
            for (var t = 0u; t < MT; t = t + 1u) {
                var x: vec2<f32>;
                if (SHARE_X) {
                    x = vec2<f32>(shuffle1(xl[t].x, k), shuffle1(xl[t].y, k));
                } else {
                    x = vec2<f32>(xs[xo[t] + 2u * w], xs[xo[t] + 2u * w + 1u]);
                }
                acc[t] = acc[t] + lo * x.x + hi * x.y;
            }
        }
    }
    gemv_finish(acc, li, lane, local, m0, per_row);
}

// gemv for GPTQ's strided packs with act order (g_idx), which the tile
// kernel decodes: read as stored with the tile kernel's lookups
// (word_values, a group per column), the same sums in f32 and finish as
// gemv; an invocation takes RB rows' words in turn, as gemv does. (Other
// strided packs, and AutoAWQ's transposed ones, are rewritten for gemv at
// upload: DecodeJob::in_output_order.)
fn product_t(wid: vec3<u32>, li: u32, sg: Subgroup) {
    load_codes(li);
    let lanes = WG * RB / GEMV_ROWS;
    let lane = li % lanes;
    let m0 = wid.y * MT;
    let xo = x_rows(m0);
    var acc: array<f32, 64>;  // [r · MT + t]
    var xl: array<vec4<f32>, 32>;
    let local0 = wid.x * GEMV_ROWS + (li / lanes) * RB;
    var at: array<u32, 8>;
    var slices: array<u32, 8>;
    var rgs: array<RowGroups, 8>;
    for (var r = 0u; r < RB; r = r + 1u) {
        let local = min(local0 + r, p.fast_rows - 1u);
        let k = div_small(p.row0 + local, p.rows);
        slices[r] = p.slice0 + k;
        let row = p.row0 + local - k * p.rows;
        rgs[r] = row_groups(row);
        at[r] = p.codes.base + slices[r] * p.codes.slice_bits + row * p.codes.lane_bits;
    }
    // Groups of whole words without g_idx: each row's scale and zero
    // point looked up once per group (at most per run), as gemv does;
    // else per word.
    let step = select(1u, STEP, WORD_GROUPS && ZERO != ZERO_PACKED_ALONG_COLS);
    var wvs: array<WordValues, 8>;
    let words = (p.cols + PER - 1u) / PER;
    for (var w0 = lane * XRUN; w0 < words; w0 = w0 + lanes * XRUN) {
        if (SHARE_X) {
            x_shared(&xl, xo, w0, words, sg);
        }
        let end = min(w0 + XRUN, words);
        for (var g0 = w0; g0 < end; g0 = g0 + step) {
            for (var r = 0u; r < RB; r = r + 1u) {
                wvs[r] = word_values(slices[r], rgs[r], g0 * PER);
            }
            for (var w = g0; w < min(g0 + step, end); w = w + 1u) {
                let col0 = w * PER;
                var xw = word_x(xo, col0, &xl, w - w0);
                var words: array<u32, 8>;
                for (var r = 0u; r < RB; r = r + 1u) {
                    words[r] = src[(at[r] + w * p.codes.word_bits) >> 5u];
                }
                add_words(&acc, &xw, words, &wvs, array<u32, 8>(), col0);
            }
        }
    }
    gemv_sum(acc, li, lane, lanes, local0, m0);
}

// The bench's empty dispatch (Product::Overhead): one workgroup, bound as
// the products are, that does nothing; what a dispatch costs by itself.
@compute @workgroup_size(1)
fn gemv_empty() {}

// Part of the decode module (protocol.wgsl says how it is put together).
//
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
// separate one for partial words (GPTQ ran faster without it:
// docs/performance.md#gpu-decode-kernels).
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


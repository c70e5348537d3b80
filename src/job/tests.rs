//! The job's reference semantics: streams of every width, packs in output
//! order, transposition, the normal-range bound.

use super::*;

/// Packs `codes` (each < 2^b) the way compressed-tensors ≥ 0.18 does: field i at bit i·b.
fn pack_dense(codes: &[u32], b: u32) -> Vec<u8> {
    let words = (codes.len() * b as usize).div_ceil(32);
    let mut w = vec![0u32; words];
    for (i, &c) in codes.iter().enumerate() {
        let bit = i * b as usize;
        w[bit / 32] |= c << (bit % 32);
        if bit % 32 + b as usize > 32 {
            w[bit / 32 + 1] |= c >> (32 - bit % 32);
        }
    }
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Packs the 0.17 way: 32 div b fields per word, none crossing.
fn pack_padded(codes: &[u32], b: u32) -> Vec<u8> {
    let pw = (32 / b) as usize;
    let mut w = vec![0u32; codes.len().div_ceil(pw)];
    for (i, &c) in codes.iter().enumerate() {
        w[i / pw] |= c << ((i % pw) as u32 * b);
    }
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn codes(n: usize, b: u32, seed: u32) -> Vec<u32> {
    let mut rng = fastrand::Rng::with_seed(seed.into());
    (0..n).map(|_| rng.u32(..1 << b)).collect()
}

/// Every element of `a` and `b`, bit for bit.
fn same_values(a: &DecodeJob<'_>, b: &DecodeJob<'_>, what: &str) {
    assert_eq!(a.dims, b.dims, "{what}");
    let d = a.dims;
    for s in 0..d.slices {
        for r in 0..d.rows {
            for c in 0..d.cols {
                let (x, y) = (a.value(s, r, c), b.value(s, r, c));
                assert_eq!(x.to_bits(), y.to_bits(), "{what}: ({s}, {r}, {c})");
            }
        }
    }
}

#[test]
fn packs_in_output_order_decode_as_stored() {
    let mut rng = fastrand::Rng::with_seed(0x0A17);
    let mut bytes = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.u8(..)).collect() };
    // AutoAWQ's shape: stored [2, 40 in, 24 out], 4-bit words in its
    // order, f16 scales and packed zero points per 8 inputs (5 groups).
    let stored = Dims {
        slices: 2,
        rows: 40,
        cols: 24,
    };
    let grid = Grid {
        row_div: 8,
        col_div: 1,
        row_stride: 24,
        slice_stride: 5 * 24,
    };
    // f16 scales from random bits, finite and nonzero: 0x3000..0x37ff.
    let scales: Vec<u8> = bytes(2 * 2 * 5 * 24)
        .chunks(2)
        .flat_map(|b| [b[0], 0x30 | (b[1] & 7)])
        .collect();
    let awq = DecodeJob::new(
        stored,
        Fields::padded(bytes(2 * 40 * 12), 4, 96)
            .with_slice_bits(40 * 96)
            .interleaved(),
        (0..16).map(|c| c as f32 - 8.0).collect::<Vec<_>>(),
        OutDtype::Bf16,
    )
    .with_scale(Values {
        data: scales.into(),
        kind: ValueKind::F16,
        grid,
    })
    .with_zero(ZeroPoint::PackedAlongCols {
        fields: Fields::padded(bytes(2 * 5 * 12), 4, 96)
            .with_slice_bits(5 * 96)
            .interleaved(),
    })
    .transpose();
    let repacked = awq.in_output_order().unwrap();
    assert!(!repacked.transposed && matches!(repacked.zero, Some(ZeroPoint::Packed { .. })));
    same_values(&awq, &repacked, "4-bit, packed zero points");
    // Blocks transposed 8 × 8 are the fields rewritten one by one, with
    // the last word column whole and half full.
    for outs in [24, 20] {
        let f = Fields::padded(bytes(2 * 40 * 12), 4, 96)
            .with_slice_bits(40 * 96)
            .interleaved();
        let blocks = f
            .transposed_in_lane_order(Dims {
                slices: 2,
                rows: 40,
                cols: outs,
            })
            .unwrap();
        let by_field = Fields::in_lanes((2, outs, 40), 4, false, |s, c, r| f.get(s, r, c)).unwrap();
        assert_eq!(&blocks.data[..], &by_field.data[..], "{outs} outputs");
    }
    // 8-bit codes, table scales shared by the slices, plain zero points
    // on their own grid (3 stored columns a group).
    let stored = Dims {
        slices: 2,
        rows: 6,
        cols: 9,
    };
    let mut table = Box::new([0f32; 256]);
    for (i, t) in table.iter_mut().enumerate() {
        *t = crate::numerics::e4m3(i as u8) / 3.0;
    }
    let job = DecodeJob::new(
        stored,
        Fields::padded(bytes(2 * 6 * 12), 8, 96).with_slice_bits(6 * 96),
        (0..=255u8).map(|c| c as i8 as f32).collect::<Vec<_>>(),
        OutDtype::F32,
    )
    .with_scale(Values {
        data: bytes(3 * 9).into(),
        kind: ValueKind::Table(table),
        grid: Grid {
            row_div: 2,
            col_div: 1,
            row_stride: 9,
            slice_stride: 0,
        },
    })
    .with_zero(ZeroPoint::Plain(Values {
        data: bytes(2 * 6 * 3).into(),
        kind: ValueKind::I8,
        grid: Grid {
            row_div: 1,
            col_div: 3,
            row_stride: 3,
            slice_stride: 18,
        },
    }))
    .transpose();
    same_values(
        &job,
        &job.in_output_order().unwrap(),
        "8-bit, plain zero points",
    );
    // GPTQ's shape: 2 slices of 12 outputs by 44 inputs, stored [in/8,
    // out] (a row's words 12 words apart, the last half full), with f16
    // scales and plain zero points per 8 inputs, left where they are.
    let (rows, cols, words) = (12, 44, 6);
    let grid = Grid {
        row_div: 1,
        col_div: 8,
        row_stride: words,
        slice_stride: rows * words,
    };
    let scales: Vec<u8> = bytes(2 * 2 * rows * words)
        .chunks(2)
        .flat_map(|b| [b[0], 0x30 | (b[1] & 7)])
        .collect();
    let codes = Fields::dense(bytes(2 * words * rows * 4), 4, 32)
        .with_word_bits(32 * rows as u64)
        .with_slice_bits((words * rows * 32) as u64);
    let gptq = DecodeJob::new(
        Dims {
            slices: 2,
            rows,
            cols,
        },
        codes.clone(),
        (0..16).map(|c| c as f32).collect::<Vec<_>>(),
        OutDtype::F16,
    )
    .with_scale(Values {
        data: scales.into(),
        kind: ValueKind::F16,
        grid,
    })
    .with_zero(ZeroPoint::Plain(Values {
        data: bytes(2 * rows * words).into(),
        kind: ValueKind::I8,
        grid,
    }));
    let repacked = gptq.in_output_order().unwrap();
    assert!(repacked.codes.word_bits == 32 && repacked.codes.lane_bits == words as u64 * 32);
    same_values(&gptq, &repacked, "4-bit, strided words");
    // Whole words copied are the fields written one by one, tail too.
    let by_field =
        Fields::in_lanes((2, rows, cols), 4, false, |s, l, i| codes.get(s, l, i)).unwrap();
    assert_eq!(&repacked.codes.data[..], &by_field.data[..]);
    // A straight job's padded fields become a stream; one in a stream
    // already, and nested scales, are left as they are.
    let straight = job.clone().transpose();
    let stream = straight.in_output_order().unwrap();
    same_values(&straight, &stream, "8-bit, padded");
    assert!(stream.in_output_order().is_none());
    let nested = Nested::blockwise([1.0; 256], vec![2.0; 4].into(), 8, 0.0);
    let mut job = job;
    job.scale.as_mut().unwrap().kind = ValueKind::Nested(Box::new(nested));
    assert!(job.in_output_order().is_none());
}

#[test]
fn narrow_codes_and_zero_points_are_widened_as_they_decode() {
    let mut rng = fastrand::Rng::with_seed(0x0A19);
    let mut bytes = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.u8(..)).collect() };
    // 2 slices of 6 rows by 40 columns, bf16 scales per 8 columns (5
    // groups), zero points packed along rows, lanes (groups) side by side.
    let (slices, rows, cols, groups) = (2, 6, 40, 5);
    let grid = Grid {
        row_div: 1,
        col_div: 8,
        row_stride: groups,
        slice_stride: rows * groups,
    };
    let scales: Vec<u8> = bytes(2 * slices * rows * groups)
        .chunks(2)
        .flat_map(|b| [b[0], 0x3c])
        .collect();
    for bits in [2u32, 3, 6] {
        let codes = Fields::dense(
            bytes(slices * rows * cols),
            bits,
            (cols as u64) * bits as u64,
        )
        .with_slice_bits(rows as u64 * cols as u64 * bits as u64);
        let values: Vec<f32> = (0..1 << bits).map(|c| c as f32 - 3.0).collect();
        let words = rows.div_ceil((32 / bits) as usize);
        let zero = Fields::padded(bytes(slices * words * groups * 4), bits, 32)
            .with_word_bits(groups as u64 * 32)
            .with_slice_bits((words * groups) as u64 * 32);
        let job = DecodeJob::new(Dims { slices, rows, cols }, codes, values, OutDtype::Bf16)
            .with_scale(Values {
                data: scales.clone().into(),
                kind: ValueKind::Bf16,
                grid,
            })
            .with_zero(ZeroPoint::Packed { fields: zero });
        let wide = job.in_output_order().unwrap();
        let width = if bits <= 4 { 4 } else { 8 };
        assert_eq!(wide.codes.bits, width);
        // The table goes on as `c − 3` where no code reads it.
        assert!(wide
            .code_values
            .iter()
            .zip(0..1 << width)
            .all(|(&v, c)| v == c as f32 - 3.0));
        assert!(
            matches!(&wide.zero, Some(ZeroPoint::Packed { fields }) if fields.bits == width && fields.lane_bits == 32)
        );
        same_values(&job, &wide, &format!("{bits}-bit codes and zero points"));
    }
}

#[test]
fn a_view_of_the_elements_is_read_in_the_weights_rows() {
    let mut rng = fastrand::Rng::with_seed(0x0A18);
    let mut bytes = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.u8(..)).collect() };
    // bitsandbytes' views of a 6 × 40 weight in blocks of 16: rows of
    // whole blocks (3 × 80), and blocks of rows (rows of 8, 2 a block).
    let nf4: Vec<f32> = crate::formats::bnb::NF4.to_vec();
    let scales: Vec<u8> = bytes(15 * 4)
        .chunks(4)
        .flat_map(|b| [b[0], b[1], b[2], 0x3c])
        .collect();
    for (rows, cols, grid) in [
        (
            3,
            80,
            Grid {
                row_div: 1,
                col_div: 16,
                row_stride: 5,
                slice_stride: 0,
            },
        ),
        (
            30,
            8,
            Grid {
                row_div: 2,
                col_div: 8,
                row_stride: 1,
                slice_stride: 0,
            },
        ),
    ] {
        let codes = Fields::dense(bytes(120), 4, cols as u64 * 4).high_first();
        let view = DecodeJob::new(
            Dims {
                slices: 1,
                rows,
                cols,
            },
            codes,
            nf4.clone(),
            OutDtype::Bf16,
        )
        .with_scale(Values {
            data: scales.clone().into(),
            kind: ValueKind::F32,
            grid,
        });
        let weight = view.in_rows(6, 40).unwrap();
        assert_eq!(
            weight.dims,
            Dims {
                slices: 1,
                rows: 6,
                cols: 40
            }
        );
        for at in 0..240 {
            let (x, y) = (
                view.value(0, at / cols, at % cols),
                weight.value(0, at / 40, at % 40),
            );
            assert_eq!(x.to_bits(), y.to_bits(), "{rows} x {cols}: element {at}");
        }
        // The weight's rows split groups of 16 at 40: groups of 8.
        assert_eq!(weight.scale.as_ref().unwrap().grid.col_div, 8);
        // 7 × 40 is another weight; rows of 20 would split a word of
        // codes between two blocks' scales.
        assert!(view.in_rows(5, 48).is_some() && view.in_rows(7, 40).is_none());
        assert!(view.in_rows(12, 20).is_none());
    }
}

/// HQQ's packs: P = 8/b rows of a `[R, C]` view a byte, part k in the
/// byte's high bits first, slices of R/P lanes, a scale and a float zero
/// point per view row. Read as `n` rows of `k` (their codes rewritten in
/// output order, scales and zeros repeated per row), every element is the
/// same, in the product arithmetic too.
#[test]
fn a_view_in_slices_with_zero_points_is_read_in_the_weights_rows() {
    for b in [1u32, 2, 4] {
        let p = (8 / b) as usize;
        let (step, c) = (3, 16);
        let r = p * step;
        let q = codes(r * c, b, 11 + b);
        let mut packed = vec![0u8; step * c];
        for (i, &v) in q.iter().enumerate() {
            let (row, col) = (i / c, i % c);
            let part = (row / step) as u32;
            packed[(row % step) * c + col] |= (v as u8) << (8 - (part + 1) * b);
        }
        let fields = Fields::new(packed, b, 1, c as u64 * 8)
            .with_word_bits(8)
            .with_slice_bits(b as u64)
            .high_first();
        let grid = Grid {
            row_div: 1,
            col_div: c,
            row_stride: 1,
            slice_stride: step,
        };
        let f32s = |f: &dyn Fn(usize) -> f32| -> Bytes<'static> {
            (0..r)
                .flat_map(|i| f(i).to_le_bytes())
                .collect::<Vec<u8>>()
                .into()
        };
        let values = |data| Values {
            data,
            kind: ValueKind::F32,
            grid,
        };
        let dims = Dims {
            slices: p,
            rows: step,
            cols: c,
        };
        let table: Vec<f32> = (0..1u32 << b).map(|v| v as f32).collect();
        let view = DecodeJob::new(dims, fields, table, OutDtype::Bf16)
            .with_scale(values(f32s(&|i| 0.013671875 * (i + 1) as f32)))
            .with_zero(ZeroPoint::Plain(values(f32s(&|i| 0.75 + i as f32 / 8.0))))
            .with_product(Product::OutDtype);
        for (v, &stored) in q.iter().enumerate() {
            assert_eq!(
                view.code(v / c / step, v / c % step, v % c),
                stored,
                "b={b} {v}"
            );
        }
        let (n, k) = (r * c / 48, 48);
        let weight = view.in_rows(n, k).unwrap();
        assert_eq!(
            weight.dims,
            Dims {
                slices: 1,
                rows: n,
                cols: k
            }
        );
        for at in 0..r * c {
            let (row, col) = (at / c, at % c);
            let x = view.value(row / step, row % step, col);
            let y = weight.value(0, at / k, at % k);
            assert_eq!(x.to_bits(), y.to_bits(), "b={b}: element {at}");
        }
        // Rows of 8 would split a group's code words between two rows'
        // scales no more than 16 do: both read; 40 is no view of 96·p.
        assert!(view.in_rows(r * c / 8, 8).is_some());
        assert!(view.in_rows(5, 40).is_none());
    }
}

#[test]
fn dense_stream_every_width() {
    for b in 1..=8u32 {
        let cols = 37; // not a multiple of 32/b for any b > 1: tail words are partial
        let rows = 3;
        let all: Vec<Vec<u32>> = (0..rows).map(|r| codes(cols, b, 7 + r as u32)).collect();
        let words_per_row = (cols * b as usize).div_ceil(32);
        let data: Vec<u8> = all.iter().flat_map(|c| pack_dense(c, b)).collect();
        let f = Fields::dense(&data[..], b, words_per_row as u64 * 32);
        assert_eq!(
            f.extent_bits(1, rows, cols),
            Some(((rows - 1) * words_per_row * 32 + cols * b as usize) as u64)
        );
        for (r, row) in all.iter().enumerate() {
            for (c, &want) in row.iter().enumerate() {
                assert_eq!(f.get(0, r, c), want, "b={b} r={r} c={c}");
            }
        }
    }
}

#[test]
fn padded_stream_every_width() {
    for b in 1..=8u32 {
        let cols = 37;
        let pw = 32 / b;
        let row = codes(cols, b, 99);
        let data = pack_padded(&row, b);
        let f = Fields::padded(&data[..], b, data.len() as u64 * 8);
        assert_eq!(f.per_word, pw);
        for (c, &want) in row.iter().enumerate() {
            assert_eq!(f.get(0, 0, c), want, "b={b} c={c}");
        }
    }
}

/// Hand-packed 3-bit words: fields 10 and 21 straddle word boundaries.
#[test]
fn word_crossing_fields_by_hand() {
    // Fields 0..=11 with values 0..=7,0..=3 at 3 bits. Field 10 = value 2 (0b010)
    // occupies bits 30..33: bit 30-31 = 0b10 in word 0, bit 32 = 0b0 in word 1.
    let vals: Vec<u32> = (0..12).map(|i| i % 8).collect();
    let mut w0 = 0u32;
    let mut w1 = 0u32;
    for (i, &v) in vals.iter().enumerate() {
        let bit = i * 3;
        if bit + 3 <= 32 {
            w0 |= v << bit;
        } else if bit >= 32 {
            w1 |= v << (bit - 32);
        } else {
            w0 |= v << bit; // low bits; the high ones fall off
            w1 |= v >> (32 - bit);
        }
    }
    assert_eq!(w0 >> 30, 0b10);
    let data: Vec<u8> = [w0, w1].iter().flat_map(|x| x.to_le_bytes()).collect();
    let f = Fields::dense(&data[..], 3, 64);
    for (i, &v) in vals.iter().enumerate() {
        assert_eq!(f.get(0, 0, i), v, "field {i}");
    }
}

/// Zero points are packed along rows: lane = column group, words `groups` apart.
#[test]
fn strided_lanes_cross_words() {
    for b in 1..=8u32 {
        let rows = 23;
        let groups = 3;
        let cols_codes: Vec<Vec<u32>> = (0..groups).map(|g| codes(rows, b, 5 + g as u32)).collect();
        let packed: Vec<Vec<u32>> = cols_codes
            .iter()
            .map(|c| {
                pack_dense(c, b)
                    .chunks(4)
                    .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                    .collect()
            })
            .collect();
        let zrows = packed[0].len();
        // Row-major [zrows, groups] int32.
        let mut data = Vec::new();
        for w in 0..zrows {
            for p in &packed {
                data.extend_from_slice(&p[w].to_le_bytes());
            }
        }
        let f = Fields::dense(&data[..], b, 32).with_word_bits(32 * groups as u64);
        assert!(f.extent_bits(1, groups, rows).unwrap() <= data.len() as u64 * 8);
        for (g, col) in cols_codes.iter().enumerate() {
            for (r, &want) in col.iter().enumerate() {
                assert_eq!(f.get(0, g, r), want, "b={b} g={g} r={r}");
            }
        }
    }
}

/// AutoAWQ's word order by hand: field k of a word holds column
/// `[0, 2, 4, 6, 1, 3, 5, 7][k]`, so columns 0..8 = 0..8 pack to
/// 0x7531_6420.
#[test]
fn interleaved_words_read_autoawq_order() {
    let data = 0x7531_6420u32.to_le_bytes();
    let f = Fields::padded(&data[..], 4, 32).interleaved();
    let cols: Vec<u32> = (0..8).map(|c| f.get(0, 0, c)).collect();
    assert_eq!(cols, (0..8).collect::<Vec<u32>>());
    assert_eq!(
        f.extent_bits(1, 1, 3),
        Some(32),
        "a partial word is read whole"
    );
}

/// A transposed job's element (row, col) is the stored (col, row), with
/// the stored element's scale.
#[test]
fn transposed_job_reads_the_stored_element() {
    // Stored 2x3 bytes (codes = values), scales per stored row.
    let codes = [1u8, 2, 3, 4, 5, 6];
    let scales: Vec<u8> = [1.0f32, 10.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let dims = Dims {
        slices: 1,
        rows: 2,
        cols: 3,
    };
    let codes = Fields::dense(&codes[..], 8, 24).with_slice_bits(48);
    let scale = Values {
        data: (&scales[..]).into(),
        kind: ValueKind::F32,
        grid: Grid {
            row_div: 1,
            col_div: 3,
            row_stride: 1,
            slice_stride: 2,
        },
    };
    let code_values = (0..256).map(|c| c as f32).collect::<Vec<f32>>();
    let job = DecodeJob::new(dims, codes, code_values, OutDtype::F32)
        .with_scale(scale)
        .transpose();
    assert_eq!(job.dims.rows, 3);
    assert_eq!(job.stored_dims().rows, 2);
    let got: Vec<f32> = (0..3)
        .flat_map(|r| (0..2).map(move |c| (r, c)))
        .map(|(r, c)| job.value(0, r, c))
        .collect();
    assert_eq!(got, [1.0, 40.0, 2.0, 50.0, 3.0, 60.0]);
}

/// `stays_normal`, step by step: subnormal inputs, products near the
/// smallest normal, a post scale, zero points that are not integers,
/// and only the scales of the rows asked about.
#[test]
fn stays_normal_bounds_every_step() {
    let dims = Dims {
        slices: 1,
        rows: 2,
        cols: 3,
    };
    let codes = [1u8, 2, 3, 4, 5, 6];
    let f32s = |v: &[f32]| v.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let grid = Grid {
        row_div: 1,
        col_div: 3,
        row_stride: 1,
        slice_stride: 2,
    };
    let tiny = f32::MIN_POSITIVE;
    let check = |code_values: &[f32], scales: &[f32], zeros: Option<&[f32]>, post: Option<f32>| {
        let (scales, zeros) = (f32s(scales), zeros.map(f32s));
        let values = |data: &[u8]| Values {
            data: data.to_vec().into(),
            kind: ValueKind::F32,
            grid,
        };
        let mut job = DecodeJob::new(
            dims,
            Fields::dense(&codes[..], 8, 24).with_slice_bits(48),
            code_values.to_vec(),
            OutDtype::F32,
        )
        .with_scale(values(&scales))
        .with_zero(zeros.as_deref().map(|z| ZeroPoint::Plain(values(z))));
        job.post_scale = post;
        (job.stays_normal(0..2), job.stays_normal(0..1))
    };
    let ints: Vec<f32> = (0..256).map(|c| c as f32 - 128.0).collect();
    assert_eq!(check(&ints, &[1.0, 2.0], None, None), (true, true));
    // A subnormal scale, in the second row only.
    assert_eq!(check(&ints, &[1.0, tiny / 2.0], None, None), (false, true));
    // Codes of 1 at least times 2^-125 stay normal; times 2^-126, too close.
    assert_eq!(check(&ints, &[1.0, 2.0 * tiny], None, None), (true, true));
    assert_eq!(check(&ints, &[1.0, tiny], None, None), (false, true));
    // A post scale takes the product below.
    assert_eq!(check(&ints, &[1.0, 2.0], None, Some(tiny)), (false, false));
    assert_eq!(check(&ints, &[1.0, 2.0], None, Some(0.5)), (true, true));
    // Integer zero points: differences of 1 at least.
    let zeros = [3.0, 7.0];
    assert_eq!(
        check(&ints, &[1.0, 1e-32], Some(&zeros), None),
        (true, true)
    );
    // Others: the difference is bounded by the smaller one's last bit.
    let zeros = [3.5, 7.0];
    assert_eq!(
        check(&ints, &[1.0, 1e-32], Some(&zeros), None),
        (false, true)
    );
    assert_eq!(check(&ints, &[1.0, 1.0], Some(&zeros), None), (true, true));
    // A subnormal code value.
    let mut subnormal = ints.clone();
    subnormal[7] = tiny / 4.0;
    assert_eq!(check(&subnormal, &[1.0, 1.0], None, None), (false, false));
}

/// HQQ's `3bit_32`: R rows (no multiple of ten) padded to ten parts of
/// S = ⌈R/10⌉, part k in bits 27 − 3k .. 30 − 3k of each int32, read in
/// place as lanes in parts ([`Parts`]): every code where hqq puts it, the
/// extent and each run's span the words the lanes read, the padding
/// parts' words past the last lane never needed; read as `n` rows of `k`
/// (codes rewritten in output order), every element the same.
#[test]
fn lanes_in_parts_read_hqqs_3bit_words() {
    for (r, c) in [(23usize, 5usize), (64, 16), (8, 3), (30, 4)] {
        let step = r.div_ceil(10);
        let q = codes(r * c, 3, r as u32);
        let mut words = vec![0u32; step * c];
        for (i, &v) in q.iter().enumerate() {
            let (row, col) = (i / c, i % c);
            let part = (row / step) as u32;
            words[(row % step) * c + col] |= v << (27 - 3 * part);
        }
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let parts = Parts {
            lanes: step,
            top: 27,
            down: 3,
        };
        let fields = Fields::new(bytes, 3, 1, c as u64 * 32).with_parts(parts);
        for (i, &v) in q.iter().enumerate() {
            assert_eq!(fields.get(0, i / c, i % c), v, "{r}x{c}: code {i}");
        }
        // The highest end: part 0's last lane (its field at bit 27 of the
        // last word it reads), the lowest start part 0's first lane's.
        let last = (step - 1) * c * 32 + (c - 1) * 32 + 30;
        assert_eq!(fields.extent_bits(1, r, c), Some(last as u64));
        // The last part holding rows, alone: its lanes' words, from bit
        // 27 − 3k of its first lane's.
        let k = (r - 1) / step;
        let (lo, hi) = fields.span((0, k * step), (0, r - 1), r, c).unwrap();
        assert_eq!(lo, (27 - 3 * k) as u64);
        let end = ((r - 1) % step * c + c - 1) * 32 + 30 - 3 * k;
        assert_eq!(hi, end as u64);
        assert!(!fields.in_order(1, r));
        let grid = Grid {
            row_div: 1,
            col_div: c,
            row_stride: 1,
            slice_stride: 0,
        };
        let scale: Vec<u8> = (0..r)
            .flat_map(|i| (0.125 * (i + 1) as f32).to_le_bytes())
            .collect();
        let zero: Vec<u8> = (0..r)
            .flat_map(|i| (1.5 + i as f32 / 4.0).to_le_bytes())
            .collect();
        let values = |b: Vec<u8>| Values {
            data: b.into(),
            kind: ValueKind::F32,
            grid,
        };
        let dims = Dims {
            slices: 1,
            rows: r,
            cols: c,
        };
        let table: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let job = DecodeJob::new(dims, fields, table, OutDtype::Bf16)
            .with_scale(values(scale))
            .with_zero(ZeroPoint::Plain(values(zero)));
        for (i, &v) in q.iter().enumerate() {
            let (row, col) = (i / c, i % c);
            let want = (v as f32 - (1.5 + row as f32 / 4.0)) * (0.125 * (row + 1) as f32);
            assert_eq!(job.value(0, row, col), want, "{r}x{c}: element {i}");
        }
        let rewritten = job.in_output_order().unwrap();
        assert!(rewritten.codes.parts.is_none());
        for i in 0..r * c {
            let (x, y) = (job.value(0, i / c, i % c), rewritten.value(0, i / c, i % c));
            assert_eq!(x.to_bits(), y.to_bits(), "{r}x{c}: element {i}");
        }
    }
}

/// A rank-0 smoothing with a period (SINQ's `scale2` over the grouped
/// rows): row `r`'s column `c` takes factor `(r mod period)·cols + c`, and
/// a period of 1 is one factor a column.
#[test]
fn smoothing_factors_repeat_every_period_rows() {
    let lr = |period: usize, inv: Vec<f32>| LowRank {
        rank: 0,
        up: Vec::new().into(),
        down: Vec::new().into(),
        inv_smooth: inv.into(),
        smooth_first: true,
        in_product: true,
        period,
        row_div: 1,
    };
    // [out 3, in 4] in groups of 2: the grouped [6, 2] rows, 2 a weight row.
    let grouped = lr(2, vec![1.0, 2.0, 3.0, 4.0]);
    for r in 0..6 {
        for c in 0..2 {
            let col = (r % 2) * 2 + c;
            assert_eq!(grouped.factor(r, c), (col + 1) as f32, "({r}, {c})");
        }
    }
    let plain = lr(1, vec![5.0, 6.0]);
    assert_eq!((plain.factor(7, 0), plain.factor(7, 1)), (5.0, 6.0));
    // 2D tiles of 2 on a [4, 2] weight: a row of factors each 2 rows.
    let tiled = LowRank {
        row_div: 2,
        ..lr(2, vec![1.0, 2.0, 3.0, 4.0])
    };
    let got: Vec<f32> = (0..4)
        .flat_map(|r| [tiled.factor(r, 0), tiled.factor(r, 1)])
        .collect();
    assert_eq!(got, [1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]);
}

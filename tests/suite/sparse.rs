//! compressed-tensors' sparse formats on synthetic checkpoints: the kept
//! values scattered over the bitmask here, by hand, then dequantized as the
//! module's group says, against what each backend writes; and the
//! refusals of masks, values and offsets that disagree.

use std::path::Path;

use serde_json::{json, Value};
use wgpu_dequant::{BackendChoice, Checkpoint, DtypeChoice, Names, OutDtype, Plan, Rule};

use crate::common::producer::{check_output, decode_with, e4m3_byte, e4m3_ref, Want};
use crate::common::{gpu_test, write_checkpoint, Rng, Tensor};

const M: &str = "model.layers.0.mlp.down_proj";
const NORM: &str = "model.norm.weight";

/// How a test weight's values are stored.
#[derive(Clone, Copy, Debug)]
enum Values {
    /// FP8 E4M3, one BF16 scale per row.
    Fp8Channel,
    /// FP8 E4M3, one F32 scale for the tensor.
    Fp8Tensor,
    /// INT8, one F32 scale per row.
    Int8Channel,
    /// INT8 with an I8 zero point and an F32 scale per row.
    Int8Asym,
    /// BF16, not quantized.
    Bf16,
}

/// The sparse layouts.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    TwoFour,
    Bitmask,
}

/// A sparse weight: which elements are kept, their codes (the dense
/// pattern's, row-major), and the module's stored tensors.
struct Weight {
    tensors: Vec<Tensor>,
    want: Want,
}

/// Row `r`'s keep pattern: 2 of every 4 (2:4), or about half at random, with
/// row 1 empty and row 2 full (unstructured).
fn keep(layout: Layout, rng: &mut Rng, rows: usize, cols: usize) -> Vec<bool> {
    let mut k = vec![false; rows * cols];
    for r in 0..rows {
        let row = &mut k[r * cols..(r + 1) * cols];
        match layout {
            Layout::TwoFour => {
                for g in row.chunks_mut(4) {
                    let a = rng.below(4) as usize;
                    let b = (a + 1 + rng.below(3) as usize) % 4;
                    g[a] = true;
                    g[b] = true;
                }
            }
            Layout::Bitmask => {
                for (c, x) in row.iter_mut().enumerate() {
                    *x = match r {
                        1 => false,
                        2 => true,
                        _ => rng.below(2) == 0 || c == 0,
                    };
                }
            }
        }
    }
    k
}

/// Bit c of row r at byte `r·ceil(cols/8) + c/8`, LSB first.
fn pack_mask(keep: &[bool], rows: usize, cols: usize) -> Vec<u8> {
    let per = cols.div_ceil(8);
    let mut out = vec![0u8; rows * per];
    for r in 0..rows {
        for c in 0..cols {
            if keep[r * cols + c] {
                out[r * per + c / 8] |= 1 << (c % 8);
            }
        }
    }
    out
}

fn weight(values: Values, layout: Layout, rows: usize, cols: usize, seed: u64) -> Weight {
    let mut rng = Rng::new(seed);
    let keep = keep(layout, &mut rng, rows, cols);
    let scale: Vec<f32> = (0..rows)
        .map(|r| [0.5f32, -0.0625, 3.0, 0.015625][r % 4] * (1.0 + r as f32 / 64.0))
        .collect();
    let zero: Vec<i8> = (0..rows).map(|r| (r as i8 % 5) - 2).collect();
    // The kept codes in order, and each element's value (a pruned element
    // holds code 0, which dequantizes like any other code).
    let mut kept: Vec<u8> = Vec::new();
    let mut vals = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let (lo, hi) = match values {
                Values::Fp8Channel | Values::Fp8Tensor => (e4m3_byte(&mut rng), 0),
                Values::Bf16 => {
                    let v = (rng.below(2000) as f32 - 1000.0) / 256.0;
                    let b = half::bf16::from_f32(v).to_bits();
                    (b as u8, (b >> 8) as u8)
                }
                _ => (rng.below(256) as u8, 0),
            };
            let k = keep[r * cols + c];
            let (lo, hi) = if k { (lo, hi) } else { (0, 0) };
            if k {
                kept.push(lo);
                if matches!(values, Values::Bf16) {
                    kept.push(hi);
                }
            }
            vals.push(match values {
                Values::Fp8Channel => e4m3_ref(lo) * half::bf16::from_f32(scale[r]).to_f32(),
                Values::Fp8Tensor => e4m3_ref(lo) * scale[0],
                Values::Int8Channel => lo as i8 as f32 * scale[r],
                Values::Int8Asym => (lo as i8 as f32 - zero[r] as f32) * scale[r],
                Values::Bf16 => half::bf16::from_bits(lo as u16 | (hi as u16) << 8).to_f32(),
            });
        }
    }
    let name = |p: &str| format!("{M}.{p}");
    let n = kept.len() / if matches!(values, Values::Bf16) { 2 } else { 1 };
    let (dtype, shape) = match (values, layout) {
        (Values::Bf16, Layout::TwoFour) => ("BF16", vec![rows, cols / 2]),
        (Values::Bf16, Layout::Bitmask) => ("BF16", vec![n]),
        (Values::Fp8Channel | Values::Fp8Tensor, Layout::TwoFour) => {
            ("F8_E4M3", vec![rows, cols / 2])
        }
        (Values::Fp8Channel | Values::Fp8Tensor, Layout::Bitmask) => ("F8_E4M3", vec![n]),
        (_, Layout::TwoFour) => ("I8", vec![rows, cols / 2]),
        (_, Layout::Bitmask) => ("I8", vec![n]),
    };
    let mut tensors = vec![
        Tensor::new(name("compressed"), dtype, &shape, kept),
        Tensor::u8(
            name("bitmask"),
            "U8",
            &[rows, cols.div_ceil(8)],
            &pack_mask(&keep, rows, cols),
        ),
    ];
    match layout {
        Layout::TwoFour => tensors.push(Tensor::i64(
            name("shape"),
            &[2, 1],
            &[rows as i64, cols as i64],
        )),
        Layout::Bitmask => {
            tensors.push(Tensor::i64(
                name("shape"),
                &[2],
                &[rows as i64, cols as i64],
            ));
            let mut offsets = Vec::new();
            let mut total = 0;
            for r in 0..rows {
                offsets.push(total);
                total += keep[r * cols..(r + 1) * cols]
                    .iter()
                    .filter(|&&k| k)
                    .count() as i64;
            }
            tensors.push(Tensor::i64(name("row_offsets"), &[rows], &offsets));
        }
    }
    match values {
        Values::Fp8Channel => tensors.push(Tensor::bf16(
            name("weight_scale"),
            &[rows, 1],
            &scale
                .iter()
                .map(|&s| half::bf16::from_f32(s).to_f32())
                .collect::<Vec<_>>(),
        )),
        Values::Fp8Tensor => tensors.push(Tensor::f32(name("weight_scale"), &[1], &scale[..1])),
        Values::Int8Channel => tensors.push(Tensor::f32(name("weight_scale"), &[rows, 1], &scale)),
        Values::Int8Asym => {
            tensors.push(Tensor::f32(name("weight_scale"), &[rows, 1], &scale));
            let z: Vec<u8> = zero.iter().map(|&z| z as u8).collect();
            tensors.push(Tensor::u8(name("weight_zero_point"), "I8", &[rows, 1], &z));
        }
        Values::Bf16 => {}
    }
    Weight {
        tensors,
        want: Want {
            name: format!("{M}.weight"),
            shape: vec![rows, cols],
            vals,
        },
    }
}

/// The quantization_config of a checkpoint of `values` stored in `layout`.
fn config(values: Values, layout: Layout) -> Value {
    let format = match layout {
        Layout::TwoFour => "sparse-24-bitmask",
        Layout::Bitmask => "sparse-bitmask",
    };
    let weights = |kind: &str, strategy: &str, symmetric: bool| json!({"num_bits": 8, "type": kind, "strategy": strategy, "symmetric": symmetric, "dynamic": false});
    let (qformat, w) = match values {
        Values::Fp8Channel => ("float-quantized", Some(weights("float", "channel", true))),
        Values::Fp8Tensor => ("float-quantized", Some(weights("float", "tensor", true))),
        Values::Int8Channel => ("int-quantized", Some(weights("int", "channel", true))),
        Values::Int8Asym => ("int-quantized", Some(weights("int", "channel", false))),
        Values::Bf16 => ("dense", None),
    };
    let groups = match w {
        Some(w) => json!({"group_0": {"format": qformat, "targets": ["Linear"], "weights": w}}),
        None => json!({}),
    };
    json!({
        "quant_method": "compressed-tensors",
        "format": qformat,
        "version": "0.14.0.1",
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": groups,
        "sparsity_config": {"format": format, "sparsity_structure": if layout == Layout::TwoFour { "2:4" } else { "unstructured" }, "targets": ["Linear"], "ignore": ["lm_head"]},
    })
}

fn write(dir: &Path, w: &Weight, qc: Value) -> Tensor {
    let norm = Tensor::bf16(NORM, &[8], &[1.0; 8]);
    let mut tensors = w.tensors.clone();
    tensors.push(norm.clone());
    write_checkpoint(dir, &tensors, qc);
    norm
}

/// Every value type in both layouts, with rows and columns that leave a
/// partial mask byte (20, 21 columns) or none (24), on each backend.
fn sparse_weights_decode(backend: BackendChoice) {
    let cases = [
        (Values::Fp8Channel, Layout::TwoFour, 20),
        (Values::Fp8Tensor, Layout::TwoFour, 24),
        (Values::Int8Channel, Layout::TwoFour, 24),
        (Values::Int8Asym, Layout::TwoFour, 20),
        (Values::Bf16, Layout::TwoFour, 20),
        (Values::Fp8Channel, Layout::Bitmask, 21),
        (Values::Fp8Tensor, Layout::Bitmask, 600),
        (Values::Int8Asym, Layout::Bitmask, 21),
        (Values::Bf16, Layout::Bitmask, 300),
    ];
    for (k, (values, layout, cols)) in cases.into_iter().enumerate() {
        let tmp = tempfile::tempdir().unwrap();
        let w = weight(values, layout, 7, cols, 0x5A_0000 + k as u64);
        let norm = write(tmp.path(), &w, config(values, layout));
        for out in [OutDtype::Bf16, OutDtype::F32] {
            let got = decode_with(tmp.path(), out, backend);
            let ctx = format!("{values:?} {layout:?} {cols} cols -> {out} on {backend:?}");
            check_output(
                &ctx,
                &got,
                out,
                std::slice::from_ref(&w.want),
                std::slice::from_ref(&norm),
            );
        }
    }
}

#[test]
fn sparse_weights_decode_on_cpu() {
    sparse_weights_decode(BackendChoice::Cpu);
}

#[test]
fn sparse_weights_decode_on_gpu() {
    gpu_test(|_| sparse_weights_decode(BackendChoice::Gpu));
}

/// A config naming a sparse format over modules stored as plain packs
/// (compressed-tensors quantized first and found nothing to sparsify):
/// what is stored is decoded.
#[test]
fn sparse_config_over_plain_weights_decodes_what_is_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let w = weight(Values::Int8Channel, Layout::TwoFour, 4, 8, 9);
    // The same module stored dense: its scattered codes as `weight`.
    let mut rng = Rng::new(1);
    let codes: Vec<u8> = (0..32).map(|_| rng.below(256) as u8).collect();
    let scale = [0.25f32, 0.5, 1.0, 2.0];
    let tensors = vec![
        Tensor::u8(format!("{M}.weight"), "I8", &[4, 8], &codes),
        Tensor::f32(format!("{M}.weight_scale"), &[4, 1], &scale),
    ];
    let vals = (0..32)
        .map(|i| codes[i] as i8 as f32 * scale[i / 8])
        .collect();
    let dense = Weight {
        tensors,
        want: Want {
            name: w.want.name.clone(),
            shape: vec![4, 8],
            vals,
        },
    };
    let norm = write(
        tmp.path(),
        &dense,
        config(Values::Int8Channel, Layout::TwoFour),
    );
    let got = decode_with(tmp.path(), OutDtype::F32, BackendChoice::Cpu);
    check_output(
        "plain weight under a sparse config",
        &got,
        OutDtype::F32,
        &[dense.want],
        &[norm],
    );
}

/// The module's stored tensor `p`.
fn param<'t>(ts: &'t mut [Tensor], p: &str) -> &'t mut Tensor {
    let name = format!("{M}.{p}");
    ts.iter_mut().find(|t| t.name == name).unwrap()
}

/// The planning error of `module`'s only fault.
fn refusal(dir: &Path) -> wgpu_dequant::Error {
    let ckpt = Checkpoint::open(dir).unwrap();
    let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
    assert_eq!(plan.errors.len(), 1, "{:?}", plan.errors);
    plan.errors[0].clone()
}

/// Masks, values and offsets that disagree are refused, naming the tensor
/// and the rule; none is decoded.
#[test]
fn disagreeing_sparse_tensors_are_refused() {
    type Edit = fn(&mut Vec<Tensor>);
    let cases: Vec<(&str, Layout, Edit, Rule, &str)> = vec![
        (
            "row_offsets off by one",
            Layout::Bitmask,
            |ts| {
                let t = param(ts, "row_offsets");
                t.data[8] ^= 1;
            },
            Rule::Sparse,
            "row_offsets",
        ),
        (
            "row_offsets of the wrong length",
            Layout::Bitmask,
            |ts| {
                let t = param(ts, "row_offsets");
                t.data.truncate(8 * 6);
                t.shape = vec![6];
            },
            Rule::TensorShape,
            "row_offsets",
        ),
        (
            "one value more than the mask keeps",
            Layout::Bitmask,
            |ts| {
                let t = param(ts, "compressed");
                t.data.push(0);
                t.shape[0] += 1;
            },
            Rule::Sparse,
            "compressed",
        ),
        (
            "a mask bit set past the value count",
            Layout::Bitmask,
            |ts| {
                let t = param(ts, "bitmask");
                // Row 1 keeps nothing; now it keeps column 0.
                let per = t.shape[1];
                t.data[per] |= 1;
            },
            Rule::Sparse,
            "row_offsets",
        ),
        (
            "2:4 with 3 of 4 kept",
            Layout::TwoFour,
            |ts| {
                let t = param(ts, "bitmask");
                t.data[0] |= 0x0f;
            },
            Rule::Sparse,
            "2 of every 4",
        ),
        (
            "2:4 columns not in fours",
            Layout::TwoFour,
            |ts| {
                let t = param(ts, "shape");
                t.data[8..16].copy_from_slice(&22i64.to_le_bytes());
                let t = param(ts, "bitmask");
                assert_eq!(t.shape[1], 3, "22 and 24 columns take 3 bytes");
            },
            Rule::TensorShape,
            "2 of every 4",
        ),
        (
            "a mask a byte short",
            Layout::TwoFour,
            |ts| {
                let t = param(ts, "bitmask");
                t.shape[1] -= 1;
                let n = t.shape.iter().product();
                t.data.truncate(n);
            },
            Rule::TensorShape,
            "bitmask",
        ),
        (
            "a shape of three values",
            Layout::TwoFour,
            |ts| {
                let t = param(ts, "shape");
                t.data.extend_from_slice(&1i64.to_le_bytes());
                t.shape = vec![3, 1];
            },
            Rule::TensorValue,
            "shape",
        ),
    ];
    for (what, layout, edit, rule, needle) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = weight(Values::Fp8Channel, layout, 7, 24, 3);
        edit(&mut w.tensors);
        write(tmp.path(), &w, config(Values::Fp8Channel, layout));
        let e = refusal(tmp.path());
        assert_eq!(e.rule, rule, "{what}: {e}");
        assert!(e.to_string().contains(needle), "{what}: {e}");
        assert!(e.to_string().contains(M), "{what} names the module: {e}");
    }
}

/// `marlin-24` (Marlin tiles with a `meta` tensor) has no dequantizer
/// anywhere: refused by name; an unknown sparse format too.
#[test]
fn marlin_24_and_unknown_sparse_formats_are_refused() {
    for format in ["marlin-24", "sparse-16-bitmask"] {
        let tmp = tempfile::tempdir().unwrap();
        let w = weight(Values::Fp8Channel, Layout::TwoFour, 4, 8, 5);
        let mut qc = config(Values::Fp8Channel, Layout::TwoFour);
        qc["sparsity_config"]["format"] = json!(format);
        write(tmp.path(), &w, qc);
        let ckpt = Checkpoint::open(tmp.path()).unwrap();
        let e = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub)
            .err()
            .expect("refused");
        assert_eq!(e.rule, Rule::Unsupported, "{e}");
        assert!(e.to_string().contains(format), "{e}");
    }
}

/// The fixtures' sparse modules in chunks of a few rows each (a 4 KiB
/// binding): every chunk's kept codes, mask bits and block starts are its
/// own, and the bytes are the CPU's.
#[test]
fn sparse_modules_in_many_chunks_equal_cpu() {
    use wgpu_dequant::backend::gpu::Gpu;
    use wgpu_dequant::Model;
    gpu_test(|adapter| {
        let gpu = Gpu::open(&adapter).unwrap().with_limits(4 << 10, 2);
        for case in [
            "ct-sparse24-fp8",
            "ct-sparse-bitmask-fp8",
            "ct-sparse24-int8-asym",
        ] {
            let dir = crate::common::fixtures().join(case).join("model");
            let model = Model::open(&dir, DtypeChoice::Auto).unwrap();
            let before = gpu.decoder().dispatches().generic;
            for t in model.tensors().filter(|t| t.name.contains("proj")) {
                let got = model.decode_on(&t.name, &gpu).unwrap();
                let want = model.decode(&t.name, BackendChoice::Cpu).unwrap();
                assert!(got == want, "{case} {}: GPU and CPU differ", t.name);
            }
            let chunks = gpu.decoder().dispatches().generic - before;
            assert!(chunks > 7 * 8, "{case}: {chunks} chunks for 7 modules");
        }
    });
}

/// Masks, offsets and shapes with random bytes overwritten are refused or
/// decoded, never a panic, and a refusal is one line naming the module.
#[test]
fn mutated_sparse_tensors_never_panic() {
    let mut rng = Rng::new(27);
    let dir = tempfile::tempdir().unwrap();
    let (mut refused, mut decoded) = (0, 0);
    for case in 0..300 {
        let layout = if case % 2 == 0 {
            Layout::Bitmask
        } else {
            Layout::TwoFour
        };
        let mut w = weight(
            Values::Fp8Channel,
            layout,
            7,
            21 + 3 * (case % 2),
            case as u64,
        );
        let p = ["bitmask", "row_offsets", "shape", "compressed"][rng.below(4) as usize];
        if let Some(t) = w.tensors.iter_mut().find(|t| t.name == format!("{M}.{p}")) {
            t.data = rng.mutate(&t.data);
            let size = if p == "row_offsets" || p == "shape" {
                8
            } else {
                1
            };
            t.data.truncate(t.data.len() / size * size);
            // The shape follows the bytes (the container checks they agree).
            let n = t.data.len() / size;
            if t.shape.len() == 1 || n % t.shape[1..].iter().product::<usize>().max(1) != 0 {
                t.shape = vec![n];
            } else {
                t.shape[0] = n / t.shape[1..].iter().product::<usize>().max(1);
            }
        }
        write(dir.path(), &w, config(Values::Fp8Channel, layout));
        let out = crate::common::caught(|| -> Result<(), wgpu_dequant::Error> {
            let ckpt = Checkpoint::open(dir.path())?;
            let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub)?;
            plan.check()?;
            let model = wgpu_dequant::Model::open(dir.path(), DtypeChoice::Auto)?;
            model.decode(&format!("{M}.weight"), BackendChoice::Cpu)?;
            Ok(())
        });
        match out {
            Err(panic) => panic!("case {case} ({p}): panicked: {panic}"),
            Ok(Err(e)) => {
                let msg = e.to_string();
                assert!(!msg.contains('\n'), "{msg}");
                assert!(msg.contains("down_proj"), "{msg}");
                refused += 1;
            }
            Ok(Ok(())) => decoded += 1,
        }
    }
    assert!(
        refused > 100 && decoded > 0,
        "refused {refused}, decoded {decoded}"
    );
}

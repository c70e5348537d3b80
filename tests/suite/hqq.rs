//! HQQ (`quant_method: "hqq"`): the fixtures tests/hqq/make_fixture.py
//! wrote with hqq 0.2.8's own `HQQLinear` (every packing, 3-bit's with
//! row counts no multiple of ten, both axes, groups 8 to 128,
//! `view_as_float`) decode to the digests of
//! `HQQLinear.dequantize()` with the compute dtype of each output, on each
//! backend; the output loads in transformers with no missing or unexpected
//! keys (the meta tensors consumed); malformed checkpoints are refused by
//! rule with nothing written.

use std::path::Path;

use serde_json::{json, Value};
use wgpu_dequant::{BackendChoice, DtypeChoice, OutDtype, Rule};

use crate::common::{
    check_case, copy_dir, dequantize_err, fixtures, gpu_test, read_dir_tensors, tensors_of,
    write_json, write_safetensors, Tensor,
};

const MIXED: &str = "hqq-mixed-bf16";
const F16: &str = "hqq-4bit-g64-f16";
/// Every Linear 3-bit (`3bit_32`), both axes, groups 8 to 128.
const THREE: &str = "hqq-3bit-bf16";
/// 3-bit, `view_as_float` in f16.
const THREE_F16: &str = "hqq-3bit-g64-f16";
const ALL: [&str; 4] = [MIXED, F16, THREE, THREE_F16];

#[test]
fn fixtures_match_hqq_on_cpu() {
    fixtures_match_hqq(BackendChoice::Cpu);
}

#[test]
fn fixtures_match_hqq_on_gpu() {
    gpu_test(|_| fixtures_match_hqq(BackendChoice::Gpu));
}

fn fixtures_match_hqq(backend: BackendChoice) {
    let all = &[OutDtype::Bf16, OutDtype::F16, OutDtype::F32][..];
    let half = &[OutDtype::F16, OutDtype::F32][..];
    for (case, outs) in [(MIXED, all), (F16, half), (THREE, all), (THREE_F16, half)] {
        check_case(case, DtypeChoice::Auto, backend, auto(case), false);
        for &out in outs {
            let digests = format!("expected-{}.digests.json", name(out));
            check_case(case, DtypeChoice::Fixed(out), backend, &digests, false);
        }
    }
}

fn auto(case: &str) -> &'static str {
    if case == F16 || case == THREE_F16 {
        "expected-f16.digests.json"
    } else {
        "expected-bf16.digests.json"
    }
}

fn name(out: OutDtype) -> &'static str {
    match out {
        OutDtype::Bf16 => "bf16",
        OutDtype::F16 => "f16",
        OutDtype::F32 => "f32",
    }
}

#[test]
fn gpu_gives_the_cpus_bytes() {
    gpu_test(|_| {
        for case in ALL {
            crate::common::producer::gpu_gives_the_cpus_bytes(
                case,
                &fixtures().join(case).join("model"),
            );
        }
    });
}

/// The dense output holds each Linear's `weight` and none of the meta
/// tensors, under transformers' names; config.json loses its
/// `quantization_config`.
#[test]
fn output_has_hf_names_and_no_meta() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    let input = fixtures().join(MIXED).join("model");
    wgpu_dequant::dequantize(&input, &out, &crate::common::CPU_AUTO).unwrap();
    let got = read_dir_tensors(&out);
    for (name, (dtype, _, _)) in &got {
        let last = name.rsplit('.').next().unwrap();
        assert!(matches!(last, "weight"), "{name}");
        assert_eq!(dtype, "BF16", "{name}");
    }
    assert_eq!(got.len(), 7 + 3 + 2, "{:?}", got.keys());
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert!(cfg.get("quantization_config").is_none());
}

/// The fixture `case` copied, its tensors and config.json changed by `edit`.
fn broken(case: &str, dir: &Path, edit: impl FnOnce(&mut Vec<Tensor>, &mut Value)) {
    copy_dir(&fixtures().join(case).join("model"), dir);
    let mut tensors = tensors_of(read_dir_tensors(dir));
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    edit(&mut tensors, &mut cfg);
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    write_json(&dir.join("config.json"), &cfg);
}

/// The mixed fixture broken one way: refused with `rule`, the one-line
/// message naming `tensor`, nothing written.
fn refused(edit: impl FnOnce(&mut Vec<Tensor>, &mut Value), rule: Rule, tensor: &str) {
    refused_in(MIXED, edit, rule, tensor)
}

/// Fixture `case` broken one way: refused with `rule`, the one-line message
/// naming `tensor`, nothing written.
fn refused_in(
    case: &str,
    edit: impl FnOnce(&mut Vec<Tensor>, &mut Value),
    rule: Rule,
    tensor: &str,
) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    broken(case, &dir, edit);
    let e = dequantize_err(&dir);
    assert_eq!(e.rule, rule, "{e}");
    let line = e.to_string();
    assert!(!line.contains('\n') && line.contains(tensor), "{line}");
}

const Q: &str = "model.layers.0.self_attn.q_proj";
const K: &str = "model.layers.0.self_attn.k_proj";

fn tensor<'a>(tensors: &'a mut [Tensor], name: &str) -> &'a mut Tensor {
    tensors.iter_mut().find(|t| t.name == name).unwrap()
}

fn text(name: &str, s: &str) -> Tensor {
    Tensor::u8(name, "U8", &[s.len()], s.as_bytes())
}

#[test]
fn malformed_checkpoints_are_refused_by_rule() {
    let w = format!("{Q}.W_q");
    let zero = format!("{Q}.zero");
    let scale = format!("{K}.scale");
    let packing = format!("{Q}.packing");
    let axis = format!("{Q}.axis");
    let group = format!("{K}.group_size");
    // Packed codes stored as int32 (the same bytes).
    refused(
        |t, _| {
            let x = tensor(t, &w);
            x.dtype = "I32";
            x.shape = vec![32, 16];
        },
        Rule::TensorDtype,
        &w,
    );
    // Packed codes that do not hold the weight: half the rows.
    refused(
        |t, _| {
            let x = tensor(t, &w);
            x.shape = vec![16, 64];
            x.data.truncate(16 * 64);
        },
        Rule::TensorShape,
        &w,
    );
    // No zero point.
    refused(
        |t, _| t.retain(|x| x.name != zero),
        Rule::MissingTensor,
        &zero,
    );
    // A scale per row where axis 0 groups columns.
    refused(
        |t, _| *tensor(t, &scale) = Tensor::bf16(&scale, &[64, 1], &[1.0; 64]),
        Rule::TensorShape,
        &scale,
    );
    // A zero point stored as an integer.
    refused(
        |t, _| *tensor(t, &zero) = Tensor::i32(&zero, &[64, 1], &[7; 64]),
        Rule::TensorDtype,
        &zero,
    );
    // A packing hqq does not write, and its 3-bit one over uint8 packs
    // (3bit_32 packs int32 words).
    refused(
        |t, _| *tensor(t, &packing) = text(&packing, "5bit_u8"),
        Rule::TensorValue,
        &packing,
    );
    refused(
        |t, _| *tensor(t, &packing) = text(&packing, "3bit_32"),
        Rule::TensorDtype,
        &w,
    );
    // An axis hqq has not.
    refused(
        |t, _| *tensor(t, &axis) = Tensor::i32(&axis, &[], &[2]),
        Rule::TensorValue,
        &axis,
    );
    // A group size that does not divide the weight.
    refused(
        |t, _| *tensor(t, &group) = Tensor::i32(&group, &[], &[48]),
        Rule::TensorValue,
        &group,
    );
    // Quantized zero points (deprecated in hqq, never serialized).
    let qz = format!("{K}.quant_zero");
    refused(
        |t, _| *tensor(t, &qz) = Tensor::u8(&qz, "U8", &[], &[1]),
        Rule::Unsupported,
        &qz,
    );
    // quant_config with quantized scales.
    refused(
        |_, c| {
            c["quantization_config"]["quant_config"]["self_attn.q_proj"]["scale_quant_params"] =
                json!({"nbits": 8})
        },
        Rule::Unsupported,
        "",
    );
}

/// Products straight from the packs (`Model::matmul_cpu`, and the GPU's
/// `matmul`) keep to the bound around the dense weight; the GPU refuses
/// the weights grouped along axis 0 (k_proj, gate_proj of the mixed
/// fixture; k_proj, o_proj, up_proj of the 3-bit one), whose groups are
/// columns of the reshaped weight: a scale for each element of a row.
#[test]
fn products_of_packed_hqq_weights() {
    for case in ALL {
        let dir = fixtures().join(case).join("model");
        crate::matmul::products_keep_to_the_bound_but(case, &dir, |name, _| {
            crate::matmul::hqq_axis0(&dir, name)
        });
    }
}

/// 3-bit (`3bit_32`) packs broken one way each: q_proj's `[7, 64]` int32
/// words (64 rows of the grouped weight in ten parts of 7), k_proj's
/// `[4, 64]` (32 rows, grouped along axis 0).
#[test]
fn malformed_3bit_checkpoints_are_refused_by_rule() {
    let w = format!("{Q}.W_q");
    let kw = format!("{K}.W_q");
    let shape = format!("{Q}.shape");
    let vaf = format!("{Q}.view_as_float");
    let kscale = format!("{K}.scale");
    // Packed rows too few: six rows of words where 64 rows need seven.
    refused_in(
        THREE,
        |t, _| {
            let x = tensor(t, &w);
            x.shape = vec![6, 64];
            x.data.truncate(6 * 64 * 4);
        },
        Rule::TensorShape,
        &w,
    );
    // The int32 words stored as uint8 (the same bytes).
    refused_in(
        THREE,
        |t, _| {
            let x = tensor(t, &w);
            x.dtype = "U8";
            x.shape = vec![7, 256];
        },
        Rule::TensorDtype,
        &w,
    );
    // The meta shape disagreeing with the packs: [32, 64] makes 32 rows of
    // 64, four rows of words, not seven.
    refused_in(
        THREE,
        |t, _| *tensor(t, &shape) = Tensor::i64(&shape, &[2], &[32, 64]),
        Rule::TensorShape,
        &w,
    );
    // Truncated words: each row one word short.
    refused_in(
        THREE,
        |t, _| {
            let x = tensor(t, &kw);
            x.shape = vec![4, 63];
            x.data.truncate(4 * 63 * 4);
        },
        Rule::TensorShape,
        &kw,
    );
    // view_as_float set over int32 words (hqq stores them as floats then).
    refused_in(
        THREE,
        |t, _| *tensor(t, &vaf) = Tensor::u8(&vaf, "U8", &[], &[1]),
        Rule::TensorDtype,
        &w,
    );
    // Float words the wrong size: the f16 view of [7, 64] words is
    // [7, 128], not [7, 64].
    refused_in(
        THREE_F16,
        |t, _| {
            let x = tensor(t, &w);
            x.shape = vec![7, 64];
            x.data.truncate(7 * 64 * 2);
        },
        Rule::TensorShape,
        &w,
    );
    // A scale per row where axis 0 groups columns.
    refused_in(
        THREE,
        |t, _| *tensor(t, &kscale) = Tensor::bf16(&kscale, &[32, 1], &[1.0; 32]),
        Rule::TensorShape,
        &kscale,
    );
}

/// A 3-bit checkpoint cut short is refused before anything is written.
#[test]
fn truncated_3bit_checkpoint_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    copy_dir(&fixtures().join(THREE).join("model"), &dir);
    let file = dir.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 1000]).unwrap();
    let e = dequantize_err(&dir);
    let line = e.to_string();
    assert!(
        !line.contains('\n') && line.contains("model.safetensors"),
        "{line}"
    );
}

/// HQQ's layouts whose lanes share words — `3bit_32`'s rows in ten parts of
/// an int32 (1003 rows: parts of 101, the last of 94) and `4bit_u8`'s two
/// slices of a byte — decoded on a GPU with tiny limits, so that chunks
/// (and a writer's row range) start and end inside parts and slices: each
/// chunk binds the words all its rows read, and gives the CPU's bytes.
#[test]
fn shared_words_in_small_chunks_give_the_cpus_bytes() {
    use wgpu_dequant::backend::gpu::GpuDecoder;
    use wgpu_dequant::backend::{Backend, Cpu};
    use wgpu_dequant::job::{DecodeJob, Dims, Fields, Grid, Parts, ValueKind, Values, ZeroPoint};
    gpu_test(|adapter| {
        let cramped = GpuDecoder::open(&adapter).unwrap().with_limits(4 << 10, 2);
        let mut rng = crate::common::Rng::new(0x3B17_0032);
        let (r, c) = (1003usize, 37usize);
        let step = r.div_ceil(10);
        let grid = Grid {
            row_div: 1,
            col_div: c,
            row_stride: 1,
            slice_stride: 0,
        };
        let f32s = |n: usize, rng: &mut crate::common::Rng| -> Vec<u8> {
            (0..n)
                .map(|_| (rng.next() as u32 % 1000) as f32 / 256.0)
                .flat_map(f32::to_le_bytes)
                .collect()
        };
        let words: Vec<u8> = (0..step * c)
            .flat_map(|_| (rng.next() as u32 & 0x3fff_ffff).to_le_bytes())
            .collect();
        let bytes: Vec<u8> = (0..r / 2 * c).map(|_| rng.next() as u8).collect();
        let (scale, zero) = (f32s(r, &mut rng), f32s(r, &mut rng));
        let values = |b: &[u8], grid: Grid| Values {
            data: b.to_vec().into(),
            kind: ValueKind::F32,
            grid,
        };
        let parts = Parts {
            lanes: step,
            top: 27,
            down: 3,
        };
        let three = DecodeJob::new(
            Dims {
                slices: 1,
                rows: r,
                cols: c,
            },
            Fields::new(&words[..], 3, 1, c as u64 * 32).with_parts(parts),
            (0..8).map(|q| q as f32).collect::<Vec<_>>(),
            OutDtype::F32,
        );
        let half = r / 2;
        let four = DecodeJob::new(
            Dims {
                slices: 2,
                rows: half,
                cols: c,
            },
            Fields::new(&bytes[..], 4, 1, c as u64 * 8)
                .with_word_bits(8)
                .with_slice_bits(4)
                .high_first(),
            (0..16).map(|q| q as f32).collect::<Vec<_>>(),
            OutDtype::F32,
        );
        let slices_grid = Grid {
            slice_stride: half,
            ..grid
        };
        for (job, grid) in [(three, grid), (four, slices_grid)] {
            let job = job
                .with_scale(values(&scale, grid))
                .with_zero(ZeroPoint::Plain(values(&zero, grid)));
            let d = job.dims;
            let want = Cpu::new().decode(&job).unwrap();
            let row_bytes = d.cols * 4;
            for rows in [0..d.total_rows(), 5..d.total_rows() - 3] {
                let mut got = vec![0u8; rows.len() * row_bytes];
                cramped.decode_rows(&job, rows.clone(), &mut got).unwrap();
                assert!(
                    got[..] == want[rows.start * row_bytes..rows.end * row_bytes],
                    "{d:?} rows {rows:?}: GPU bytes differ"
                );
            }
        }
        let ran = cramped.dispatches();
        assert!(ran.fast == 0 && ran.generic > 4, "ran {ran:?}");
    });
}

//! DeepSeek-V4 native checkpoints (issue 66): FP8 E4M3 Linears with
//! F8_E8M0 `.scale` blocks, FP4 routed experts (I8 nibbles, one E8M0 scale
//! per 32 codes), copies under the stored names transformers' DeepSeek-V4
//! loader renames itself.
//!
//! - `deepseek-v4-fp8-fp4`: built by tests/deepseek_v4/make_fixture.py, the
//!   digests transformers' `Fp8Dequantize._dequantize_one` returns, on the
//!   CPU and the GPU, in bf16 and f32; V4.1's placement of `expert_dtype`
//!   (inside `quantization_config`) gives the same bytes.
//! - Scale bytes 0x00, 0xFE and 0xFF on checkpoints written here: 2^-127,
//!   2^127 (products past f32's range are inf) and NaN (as torch's
//!   `float8_e8m0fnu` reads it; written as the canonical NaN).
//! - Products with the packs, and malformed variants refused by rule.

use std::path::Path;

use serde_json::{json, Value};
use wgpu_dequant::{
    dequantize, BackendChoice, Checkpoint, DtypeChoice, Error, Model, Names, Options, OutDtype,
    Plan, Rule,
};

use crate::common::producer::e4m3_ref;
use crate::common::{
    caught, check_digests, copy_dir, dequantize_err, fixtures, gpu_test, read_dir_tensors,
    write_json, write_model, Rng, Tensor,
};

const CASE: &str = "deepseek-v4-fp8-fp4";

fn fixture_matches_transformers(backend: BackendChoice) {
    check_digests(
        CASE,
        backend,
        &[
            (DtypeChoice::Auto, "expected-bf16.digests.json"),
            (
                DtypeChoice::Fixed(OutDtype::F32),
                "expected-f32.digests.json",
            ),
        ],
    );
}

#[test]
fn fixture_matches_transformers_on_cpu() {
    fixture_matches_transformers(BackendChoice::Cpu);
}

#[test]
fn fixture_matches_transformers_on_gpu() {
    gpu_test(|_| fixture_matches_transformers(BackendChoice::Gpu));
}

fn decode_dir(dir: &Path) -> crate::common::producer::Tensors {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    let options = Options {
        dtype: DtypeChoice::Auto,
        backend: BackendChoice::Cpu,
    };
    dequantize(dir, &out, &options).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    read_dir_tensors(&out)
}

/// V4.1 moves `expert_dtype` into `quantization_config`: the same bytes;
/// and the dense config.json keeps neither.
#[test]
fn expert_dtype_is_read_from_either_place() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("v41");
    copy_dir(&fixtures().join(CASE).join("model"), &dir);
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let top = cfg.as_object_mut().unwrap().remove("expert_dtype").unwrap();
    cfg["quantization_config"]["expert_dtype"] = top;
    write_json(&dir.join("config.json"), &cfg);
    let want = decode_dir(&fixtures().join(CASE).join("model"));
    assert_eq!(decode_dir(&dir), want);

    let out = tmp.path().join("dense");
    let options = Options {
        dtype: DtypeChoice::Auto,
        backend: BackendChoice::Cpu,
    };
    dequantize(fixtures().join(CASE).join("model"), &out, &options).unwrap();
    let written: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert!(written.get("quantization_config").is_none(), "{written}");
    assert!(written.get("expert_dtype").is_none(), "{written}");
    assert_eq!(written["model_type"], "deepseek_v4");
}

// ---------------------------------------------------------------------------
// Checkpoints written here
// ---------------------------------------------------------------------------

/// An FP8 Linear with one 128×128 block (a 40×64 weight: partial both ways).
const FP8: &str = "layers.0.attn.wq_a";
/// An FP8 Linear whose scale grid is 32×32 blocks (V4.1).
const FP8_32: &str = "layers.0.attn.wo_a";
/// An FP4 routed expert, 16×64.
const FP4: &str = "layers.0.ffn.experts.0.w1";
const NORM: &str = "layers.0.attn_norm.weight";

const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

fn e2m1(code: u8) -> f32 {
    let v = E2M1[(code & 7) as usize];
    if code & 8 != 0 {
        -v
    } else {
        v
    }
}

/// torch's `float8_e8m0fnu` read as f32: 2^(b−127), 0xFF NaN.
fn e8m0(b: u8) -> f32 {
    if b == 0xFF {
        f32::NAN
    } else {
        2f64.powi(b as i32 - 127) as f32
    }
}

/// A small V4 checkpoint: tensors and their exact f32 values.
struct Ckpt {
    tensors: Vec<Tensor>,
    /// (module, shape, exact values) of each decoded weight.
    wants: Vec<(String, Vec<usize>, Vec<f32>)>,
}

/// E4M3 codes (no NaN byte) and E2M1 nibbles at random; scale bytes near
/// 127, with `planted` ones written over the first of each scale tensor.
fn ckpt(planted: &[u8]) -> Ckpt {
    let mut rng = Rng::new(0xDEE9_5EE4);
    let mut tensors = vec![Tensor::bf16(NORM, &[64], &[1.0; 64])];
    let mut wants = Vec::new();
    let scales = |rng: &mut Rng, n: usize| -> Vec<u8> {
        let mut s: Vec<u8> = (0..n).map(|_| 118 + rng.below(12) as u8).collect();
        for (i, &b) in planted.iter().enumerate().take(n) {
            s[i] = b;
        }
        s
    };
    let fp8 = [
        (FP8, 40usize, 64usize, 128usize, 128usize),
        (FP8_32, 64, 96, 32, 32),
    ];
    for (m, rows, cols, bh, bw) in fp8 {
        let codes: Vec<u8> = (0..rows * cols)
            .map(|_| crate::common::producer::e4m3_byte(&mut rng))
            .collect();
        let (nr, nc) = (rows.div_ceil(bh), cols.div_ceil(bw));
        let s = scales(&mut rng, nr * nc);
        let vals = (0..rows * cols)
            .map(|i| {
                let (r, c) = (i / cols, i % cols);
                e4m3_ref(codes[i]) * e8m0(s[(r / bh) * nc + c / bw])
            })
            .collect();
        tensors.push(Tensor::u8(
            format!("{m}.weight"),
            "F8_E4M3",
            &[rows, cols],
            &codes,
        ));
        tensors.push(Tensor::u8(format!("{m}.scale"), "F8_E8M0", &[nr, nc], &s));
        wants.push((m.to_string(), vec![rows, cols], vals));
    }
    let (rows, cols) = (16, 64);
    let codes: Vec<u8> = (0..rows * cols).map(|_| rng.below(16) as u8).collect();
    let packed: Vec<u8> = codes.chunks(2).map(|p| p[0] | (p[1] << 4)).collect();
    let s = scales(&mut rng, rows * cols / 32);
    let vals = (0..rows * cols)
        .map(|i| e2m1(codes[i]) * e8m0(s[(i / cols) * (cols / 32) + (i % cols) / 32]))
        .collect();
    tensors.push(Tensor::u8(
        format!("{FP4}.weight"),
        "I8",
        &[rows, cols / 2],
        &packed,
    ));
    tensors.push(Tensor::u8(
        format!("{FP4}.scale"),
        "F8_E8M0",
        &[rows, cols / 32],
        &s,
    ));
    wants.push((FP4.to_string(), vec![rows, cols], vals));
    Ckpt { tensors, wants }
}

/// V4-Flash's config.json (expert_dtype at the top level).
fn config() -> Value {
    json!({
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "torch_dtype": "bfloat16",
        "expert_dtype": "fp4",
        "quantization_config": {
            "quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
            "weight_block_size": [128, 128], "activation_scheme": "dynamic",
        },
    })
}

/// bf16 bits of `x`, rounded once, NaN canonical (0x7FC0) as every output.
fn bf16_bits(x: f32) -> u16 {
    if x.is_nan() {
        0x7FC0
    } else {
        half::bf16::from_f32(x).to_bits()
    }
}

fn check_values(planted: &[u8], backend: BackendChoice) {
    let c = ckpt(planted);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("v4");
    write_model(&dir, &c.tensors, &config());
    for out in [OutDtype::Bf16, OutDtype::F32] {
        let got = crate::common::producer::decode_with(&dir, out, backend);
        assert_eq!(got.len(), 4, "three decoded, one copied");
        for (m, shape, vals) in &c.wants {
            let (dt, s, bytes) = &got[&format!("{m}.weight")];
            assert_eq!(s, shape, "{m}");
            let want: Vec<u8> = match out {
                OutDtype::Bf16 => vals
                    .iter()
                    .flat_map(|&v| bf16_bits(v).to_le_bytes())
                    .collect(),
                _ => vals
                    .iter()
                    .flat_map(|&v| if v.is_nan() { f32::NAN } else { v }.to_le_bytes())
                    .collect(),
            };
            assert_eq!(dt, if out == OutDtype::F32 { "F32" } else { "BF16" });
            assert!(
                bytes == &want,
                "{m} -> {out} ({backend:?}, planted {planted:x?}): bytes differ"
            );
        }
    }
}

/// Scale bytes at the ends of E8M0: 0x00 (2^-127: subnormal products),
/// 0xFE (2^127: products past f32's range are ±inf) and 0xFF (NaN, as
/// torch reads `float8_e8m0fnu`; every element of its block is NaN).
#[test]
fn e8m0_extremes_on_cpu() {
    for planted in [&[][..], &[0x00, 0xFE, 0xFF]] {
        check_values(planted, BackendChoice::Cpu);
    }
}

#[test]
fn e8m0_extremes_on_gpu() {
    gpu_test(|_| {
        for planted in [&[][..], &[0x00, 0xFE, 0xFF]] {
            check_values(planted, BackendChoice::Gpu);
        }
    });
}

/// The decoded weights are quantized Linears of the product API: the CPU
/// product is the dense weight's f32 sum in the order docs/apps.md states
/// (element j into lane j mod 64, the lanes added in halves), and the
/// GPU's keeps to the bound every fixture's does.
#[test]
fn products_with_the_packs() {
    let c = ckpt(&[]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("v4");
    write_model(&dir, &c.tensors, &config());
    let model = Model::open(&dir, DtypeChoice::Auto).unwrap();
    let mut quantized: Vec<String> = model.quantized().map(|t| t.name).collect();
    quantized.sort();
    let mut want: Vec<String> = c.wants.iter().map(|w| format!("{}.weight", w.0)).collect();
    want.sort();
    assert_eq!(quantized, want);
    let mut rng = Rng::new(7);
    for name in &want {
        let info = model.info(name).unwrap();
        let (n, k) = (info.shape[0], info.shape[1]);
        let w = model.decode_f32(name, BackendChoice::Cpu).unwrap();
        let x: Vec<f32> = (0..2 * k)
            .map(|_| rng.below(1 << 12) as f32 / 4096.0 - 0.5)
            .collect();
        let got = model.matmul_cpu(name, &x, 2).unwrap();
        for (i, g) in got.iter().enumerate() {
            let (row, col) = (i / n, i % n);
            let mut lanes = [0f32; 64];
            for j in 0..k {
                lanes[j % 64] += x[row * k + j] * w[col * k + j];
            }
            let mut half = 64;
            while half > 1 {
                half /= 2;
                for l in 0..half {
                    lanes[l] += lanes[l + half];
                }
            }
            let sum = lanes[0];
            assert_eq!(g.to_bits(), sum.to_bits(), "{name} [{row}, {col}]");
        }
    }
    crate::matmul::products_keep_to_the_bound("deepseek-v4", &dir);
}

// ---------------------------------------------------------------------------
// Malformed variants: each refused by rule, naming the file and tensor,
// with nothing written
// ---------------------------------------------------------------------------

/// Writes the valid checkpoint with `tensors` changed by `edit` and the
/// config by `edit_config`; asserts that planning and `dequantize` refuse
/// it by `rule`, naming `tensor`, on one line, with no output left.
fn refused(
    what: &str,
    edit: impl FnOnce(&mut Vec<Tensor>),
    edit_config: impl FnOnce(&mut Value),
    rule: Rule,
    tensor: Option<&str>,
) {
    let mut c = ckpt(&[]);
    edit(&mut c.tensors);
    let mut cfg = config();
    edit_config(&mut cfg);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bad");
    write_model(&dir, &c.tensors, &cfg);
    let planned = caught(|| -> Result<(), Error> {
        let ckpt = Checkpoint::open(&dir)?;
        let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub)?;
        plan.check()
    });
    let e = match planned {
        Err(p) => panic!("{what}: panicked: {p}"),
        Ok(Ok(())) => panic!("{what}: accepted"),
        Ok(Err(e)) => e,
    };
    assert_eq!(e.rule, rule, "{what}: {e}");
    assert_eq!(e.tensor.as_deref(), tensor, "{what}: {e}");
    let line = e.to_string();
    assert!(
        !line.contains('\n') && line.contains(&format!("[{}]", rule.id())),
        "{line}"
    );
    let d = dequantize_err(&dir);
    assert_eq!((d.rule, d.tensor), (e.rule, e.tensor), "{what}: dequantize");
}

fn set(tensors: &mut [Tensor], t: Tensor) {
    let at = tensors.iter().position(|x| x.name == t.name).unwrap();
    tensors[at] = t;
}

#[test]
fn unknown_expert_dtype_is_refused() {
    refused(
        "expert_dtype fp6",
        |_| {},
        |c| c["expert_dtype"] = json!("fp6"),
        Rule::Unsupported,
        None,
    );
    refused(
        "expert_dtype a number",
        |_| {},
        |c| c["expert_dtype"] = json!(4),
        Rule::Config,
        None,
    );
    refused(
        "scale_fmt e5m2",
        |_| {},
        |c| c["quantization_config"]["scale_fmt"] = json!("e5m2"),
        Rule::Unsupported,
        None,
    );
}

#[test]
fn fp4_experts_without_expert_dtype_fp4_are_refused() {
    let w = format!("{FP4}.weight");
    refused(
        "no expert_dtype",
        |_| {},
        |c| {
            c.as_object_mut().unwrap().remove("expert_dtype");
        },
        Rule::TensorDtype,
        Some(&w),
    );
    refused(
        "expert_dtype fp8",
        |_| {},
        |c| c["expert_dtype"] = json!("fp8"),
        Rule::TensorDtype,
        Some(&w),
    );
}

#[test]
fn scale_grids_that_disagree_with_the_weight_are_refused() {
    // 40 rows fit neither one 128-row block nor an exact division by 3.
    let s = format!("{FP8}.scale");
    refused(
        "fp8 grid [3, 1]",
        |t| set(t, Tensor::u8(&s, "F8_E8M0", &[3, 1], &[127; 3])),
        |_| {},
        Rule::TensorShape,
        Some(&s),
    );
    // The runtime takes one scale per 32 codes of an expert row, not 16.
    let s = format!("{FP4}.scale");
    refused(
        "fp4 group 16",
        |t| set(t, Tensor::u8(&s, "F8_E8M0", &[16, 4], &[127; 64])),
        |_| {},
        Rule::TensorShape,
        Some(&s),
    );
    // Rows of 60 FP4 values: not whole groups of 32.
    let w = format!("{FP4}.weight");
    refused(
        "fp4 rows not whole groups",
        |t| set(t, Tensor::u8(&w, "I8", &[16, 30], &[0; 480])),
        |_| {},
        Rule::TensorShape,
        Some(&w),
    );
}

#[test]
fn wrong_dtypes_are_refused() {
    let s = format!("{FP8}.scale");
    refused(
        "scale stored as U8",
        |t| set(t, Tensor::u8(&s, "U8", &[1, 1], &[127])),
        |_| {},
        Rule::TensorDtype,
        Some(&s),
    );
    let w = format!("{FP8}.weight");
    refused(
        "bf16 weight beside an E8M0 scale",
        |t| set(t, Tensor::bf16(&w, &[40, 64], &[0.5; 40 * 64])),
        |_| {},
        Rule::TensorDtype,
        Some(&w),
    );
}

#[test]
fn missing_scales_are_refused() {
    let s = format!("{FP4}.scale");
    refused(
        "expert without its scale",
        |t| t.retain(|x| x.name != s),
        |_| {},
        Rule::MissingTensor,
        Some(&s),
    );
}

/// A file shorter than its header says: the container's rule, nothing
/// written.
#[test]
fn truncated_data_is_refused() {
    let c = ckpt(&[]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cut");
    write_model(&dir, &c.tensors, &config());
    let file = dir.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
    let e = dequantize_err(&dir);
    assert_eq!(e.rule, Rule::Container, "{e}");
}

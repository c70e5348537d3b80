//! The rest of the FP8 and MX family (issue 26), written here the way each
//! producer stores it and compared byte for byte, on the CPU and the GPU and
//! in every output dtype, with the producer's arithmetic computed here by
//! the `half` crate:
//!
//! - ModelOpt `FP8` (per tensor, q/k/v scales apart), `FP8_PER_CHANNEL_PER_TOKEN`
//!   and `FP8_PB_WO` (128×128 blocks): `FP8QTensor.dequantize` multiplies in
//!   the output dtype, `d(q · d(s))`; f32 outputs are the f32 product.
//! - ModelOpt `MXFP8`: `q · 2^(e−127)` in f32, rounded once.
//! - compressed-tensors `mxfp8-quantized`: the scale a bf16 `2^(e−127)`, the
//!   product rounded to bf16, then cast (an f16 output is that bf16 cast).
//! - fbgemm_fp8: `q · s[row]` in f32, rounded once.
//!
//! Codes include −0.0 (0x80), +0, the smallest subnormals and the largest
//! normals; a tiny scale makes products underflow the 16-bit dtypes.

use std::path::Path;

use serde_json::{json, Value};
use wgpu_dequant::{BackendChoice, Checkpoint, DtypeChoice, Names, OutDtype, Plan};

use crate::common::producer::{check_output, decode_with, e4m3_byte, e4m3_ref, Want, OUTS};
use crate::common::{gpu_test, hf_quant_config, write_checkpoint, write_json, Rng, Tensor};

/// `x` rounded to `d` (RNE, by `half`), as an f32 again.
fn round(d: OutDtype, x: f32) -> f32 {
    match d {
        OutDtype::Bf16 => half::bf16::from_f32(x).to_f32(),
        OutDtype::F16 => half::f16::from_f32(x).to_f32(),
        OutDtype::F32 => x,
    }
}

/// `rows × cols` E4M3 bytes with −0, +0, the smallest subnormals and the
/// largest normal planted in the first row.
fn codes(rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    let mut c: Vec<u8> = (0..rows * cols).map(|_| e4m3_byte(rng)).collect();
    for (i, b) in [0x80u8, 0x00, 0x01, 0x81, 0x7E, 0xFE]
        .into_iter()
        .enumerate()
    {
        c[i.min(rows * cols - 1)] = b;
    }
    c
}

/// A scale of a few binades around 2^-8, not a power of two.
fn scale(rng: &mut Rng) -> f32 {
    let m = 1.0 + rng.below(1 << 20) as f32 / (1 << 20) as f32;
    m * 2f32.powi(rng.below(8) as i32 - 12)
}

/// The arithmetic of a module's value.
#[derive(Clone, Copy)]
enum Arith {
    /// `round_out(q · s)`: the f32 product rounded once.
    F32,
    /// `round_out(q · round_out(s))`: in the output dtype (ModelOpt FP8).
    Out,
    /// `round_out(round_bf16(q · s))`: in bf16, then cast (CT mxfp8).
    Bf16,
}

fn value(a: Arith, out: OutDtype, q: f32, s: f32) -> f32 {
    match a {
        Arith::F32 => q * s,
        Arith::Out => round(out, q * round(out, s)),
        Arith::Bf16 => round(OutDtype::Bf16, q * round(OutDtype::Bf16, s)),
    }
}

/// One FP8 module: its codes, dims and the scale of each element.
struct Module {
    name: String,
    rows: usize,
    cols: usize,
    codes: Vec<u8>,
    /// Scale of element (r, c).
    scale_of: Box<dyn Fn(usize, usize) -> f32>,
}

impl Module {
    fn want(&self, a: Arith, out: OutDtype) -> Want {
        let vals = (0..self.rows * self.cols)
            .map(|i| {
                let (r, c) = (i / self.cols, i % self.cols);
                value(a, out, e4m3_ref(self.codes[i]), (self.scale_of)(r, c))
            })
            .collect();
        Want::weight(&self.name, vec![self.rows, self.cols], vals)
    }

    fn weight(&self) -> Tensor {
        Tensor::u8(
            format!("{}.weight", self.name),
            "F8_E4M3",
            &[self.rows, self.cols],
            &self.codes,
        )
    }
}

/// Decodes `dir` in every output dtype on `backend` and compares.
fn check_all(
    ctx: &str,
    dir: &Path,
    a: Arith,
    modules: &[Module],
    copies: &[Tensor],
    backend: BackendChoice,
) {
    for out in OUTS {
        let got = decode_with(dir, out, backend);
        let wants: Vec<Want> = modules.iter().map(|m| m.want(a, out)).collect();
        check_output(
            &format!("{ctx} -> {out} ({backend:?})"),
            &got,
            out,
            &wants,
            copies,
        );
    }
}

/// Both backends (the GPU's on its adapter).
fn check_both(ctx: &str, dir: &Path, a: Arith, modules: &[Module], copies: &[Tensor]) {
    check_all(ctx, dir, a, modules, copies, BackendChoice::Cpu);
    gpu_test(|_| check_all(ctx, dir, a, modules, copies, BackendChoice::Gpu));
}

/// The scheme `inspect` shows for `module`.
fn scheme(dir: &Path, module: &str) -> String {
    let ckpt = Checkpoint::open(dir).unwrap();
    let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
    assert!(plan.errors.is_empty(), "{:?}", plan.errors);
    let name = format!("{module}.weight");
    plan.outputs
        .iter()
        .find(|o| o.name == name)
        .and_then(|o| o.scheme.clone())
        .unwrap_or_else(|| panic!("no {name}"))
}

const ATTN: &str = "model.layers.0.self_attn";

/// The copies every synthetic model has beside its FP8 modules.
fn copies(rng: &mut Rng) -> Vec<Tensor> {
    let head: Vec<f32> = (0..64 * 32).map(|_| scale(rng) * 256.0).collect();
    vec![
        Tensor::bf16("lm_head.weight", &[64, 32], &head),
        Tensor::bf16("model.norm.weight", &[32], &head[..32]),
    ]
}

/// A ModelOpt checkpoint: `config.json` (torch dtype `dtype`, ModelOpt's
/// own `quantization_config`) and `hf_quant_config.json` for `algo` with
/// an FP8 KV cache.
fn modelopt_dir(dir: &Path, tensors: &[Tensor], algo: &str, dtype: &str) {
    write_checkpoint(dir, tensors, Value::Null);
    write_json(
        &dir.join("config.json"),
        &json!({
            "architectures": ["LlamaForCausalLM"], "torch_dtype": dtype,
            "quantization_config": {"quant_method": "modelopt", "quant_algo": algo,
                "kv_cache_quant_algo": "FP8", "ignore": ["lm_head"]},
        }),
    );
    let mut hq = hf_quant_config(algo);
    hq["quantization"]["kv_cache_quant_algo"] = json!("FP8");
    write_json(&dir.join("hf_quant_config.json"), &hq);
}

/// ModelOpt FP8 per tensor, q/k/v with scales of their own, an FP8 KV
/// cache (`k_scale`, `v_scale`) and `input_scale`s (all dropped), an f16
/// model and a bf16 one; one module's scale is tiny (products below the
/// 16-bit dtypes' normals).
#[test]
fn modelopt_fp8_per_tensor_multiplies_in_the_output_dtype() {
    for dtype in ["float16", "bfloat16"] {
        let mut rng = Rng::new(26);
        let tmp = tempfile::tempdir().unwrap();
        let mut tensors = copies(&mut rng);
        let copies = tensors.clone();
        let mut modules = Vec::new();
        for (p, rows) in [("q_proj", 32), ("k_proj", 16), ("v_proj", 16)] {
            let name = format!("{ATTN}.{p}");
            let s = if p == "v_proj" {
                3.0e-6
            } else {
                scale(&mut rng)
            };
            let m = Module {
                name: name.clone(),
                rows,
                cols: 32,
                codes: codes(&mut rng, rows, 32),
                scale_of: Box::new(move |_, _| s),
            };
            tensors.push(m.weight());
            tensors.push(Tensor::f32(format!("{name}.weight_scale"), &[], &[s]));
            tensors.push(Tensor::f32(format!("{name}.input_scale"), &[], &[0.02]));
            modules.push(m);
        }
        tensors.push(Tensor::f32(format!("{ATTN}.k_proj.k_scale"), &[], &[0.5]));
        tensors.push(Tensor::f32(format!("{ATTN}.v_proj.v_scale"), &[], &[0.25]));
        modelopt_dir(tmp.path(), &tensors, "FP8", dtype);
        assert_eq!(
            scheme(tmp.path(), &format!("{ATTN}.k_proj")),
            "modelopt FP8 per-tensor"
        );
        check_both(
            &format!("modelopt FP8 {dtype}"),
            tmp.path(),
            Arith::Out,
            &modules,
            &copies,
        );
    }
}

/// The f32 product rounded once is not what ModelOpt writes: a scale whose
/// bf16 rounding moves a product across a rounding boundary tells them apart.
#[test]
fn modelopt_fp8_is_not_the_f32_product_rounded_once() {
    // q = 1.125 (0x39), s = 1 + 15·2^-12: bf16(s) = 1, so ModelOpt writes
    // 1.125, while bf16(q · s) = 1.1328125.
    let (q, s) = (e4m3_ref(0x39), 1.0 + 15.0 * 2f32.powi(-12));
    let ours = value(Arith::Out, OutDtype::Bf16, q, s);
    let f32_once = round(OutDtype::Bf16, q * s);
    assert_ne!(ours.to_bits(), f32_once.to_bits());
    let tmp = tempfile::tempdir().unwrap();
    let name = format!("{ATTN}.o_proj");
    let m = Module {
        name: name.clone(),
        rows: 2,
        cols: 4,
        codes: vec![0x39; 8],
        scale_of: Box::new(move |_, _| s),
    };
    let tensors = [
        m.weight(),
        Tensor::f32(format!("{name}.weight_scale"), &[], &[s]),
    ];
    modelopt_dir(tmp.path(), &tensors, "FP8", "bfloat16");
    check_both("modelopt FP8 boundary", tmp.path(), Arith::Out, &[m], &[]);
}

/// FP8_PER_CHANNEL_PER_TOKEN: one f32 scale per row (`[out]`), an f16 model.
#[test]
fn modelopt_fp8_per_channel() {
    let mut rng = Rng::new(27);
    let tmp = tempfile::tempdir().unwrap();
    let mut tensors = copies(&mut rng);
    let copies = tensors.clone();
    let (rows, cols) = (48, 40);
    let mut scales: Vec<f32> = (0..rows).map(|_| scale(&mut rng)).collect();
    scales[1] = 1.0e-7;
    let name = "model.layers.0.mlp.down_proj".to_string();
    let s = scales.clone();
    let m = Module {
        name: name.clone(),
        rows,
        cols,
        codes: codes(&mut rng, rows, cols),
        scale_of: Box::new(move |r, _| s[r]),
    };
    tensors.push(m.weight());
    tensors.push(Tensor::f32(
        format!("{name}.weight_scale"),
        &[rows],
        &scales,
    ));
    tensors.push(Tensor::f32(format!("{name}.input_scale"), &[], &[0.1]));
    modelopt_dir(tmp.path(), &tensors, "FP8_PER_CHANNEL_PER_TOKEN", "float16");
    assert_eq!(
        scheme(tmp.path(), &name),
        "modelopt FP8_PER_CHANNEL_PER_TOKEN per-channel"
    );
    check_both(
        "modelopt per-channel",
        tmp.path(),
        Arith::Out,
        &[m],
        &copies,
    );
}

/// FP8_PB_WO: 128×128 blocks with partial edges (200×300: 2×3 blocks),
/// scale `[2, 1, 3, 1]`, one block's scale tiny.
#[test]
fn modelopt_fp8_blocks_with_partial_edges() {
    let mut rng = Rng::new(28);
    let tmp = tempfile::tempdir().unwrap();
    let (rows, cols) = (200, 300);
    let mut scales: Vec<f32> = (0..6).map(|_| scale(&mut rng)).collect();
    scales[5] = 2.0e-7;
    let name = "model.layers.0.mlp.up_proj".to_string();
    let s = scales.clone();
    let m = Module {
        name: name.clone(),
        rows,
        cols,
        codes: codes(&mut rng, rows, cols),
        scale_of: Box::new(move |r, c| s[(r / 128) * 3 + c / 128]),
    };
    let tensors = [
        m.weight(),
        Tensor::f32(format!("{name}.weight_scale"), &[2, 1, 3, 1], &scales),
    ];
    modelopt_dir(tmp.path(), &tensors, "FP8_PB_WO", "bfloat16");
    assert_eq!(
        scheme(tmp.path(), &name),
        "modelopt FP8_PB_WO block 128x128"
    );
    check_both("modelopt fp8_pb_wo", tmp.path(), Arith::Out, &[m], &[]);
}

/// E8M0 bytes for `n` groups: around 2^0, with 0 (2^-127) and 254 planted.
fn e8m0_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    let mut e: Vec<u8> = (0..n).map(|_| 118 + rng.below(16) as u8).collect();
    e[0] = 0;
    if n > 1 {
        e[1] = 254;
    }
    e
}

fn e8m0_ref(e: u8) -> f32 {
    2f64.powi(e as i32 - 127) as f32
}

/// An MX module `name` of `rows × cols` FP8 codes with random E8M0 scales
/// per 32 columns, and its two stored tensors.
fn mx_module(rng: &mut Rng, name: &str, rows: usize, cols: usize) -> (Module, [Tensor; 2]) {
    let e = e8m0_bytes(rng, rows * cols / 32);
    let scale = Tensor::u8(format!("{name}.weight_scale"), "U8", &[rows, cols / 32], &e);
    let m = Module {
        name: name.to_string(),
        rows,
        cols,
        codes: codes(rng, rows, cols),
        scale_of: Box::new(move |r, c| e8m0_ref(e[r * (cols / 32) + c / 32])),
    };
    let tensors = [m.weight(), scale];
    (m, tensors)
}

/// ModelOpt MXFP8: E8M0 per 32 columns, the f32 product rounded once.
#[test]
fn modelopt_mxfp8() {
    let mut rng = Rng::new(29);
    let tmp = tempfile::tempdir().unwrap();
    let name = "model.layers.0.mlp.gate_proj".to_string();
    let (m, tensors) = mx_module(&mut rng, &name, 24, 96);
    modelopt_dir(tmp.path(), &tensors, "MXFP8", "bfloat16");
    assert_eq!(scheme(tmp.path(), &name), "modelopt MXFP8 e8m0 group 32");
    check_both("modelopt mxfp8", tmp.path(), Arith::F32, &[m], &[]);
}

/// One ModelOpt INT4 AWQ module: `rows × cols` signed codes packed two
/// rows a byte, f32 scales per row and `group` columns (one group all
/// zero, so that negative codes give −0.0), and a bf16 pre-quant scale
/// when `pre_quant` (one factor negative, one tiny).
fn int4_awq_module(
    rng: &mut Rng,
    name: &str,
    (rows, cols, group): (usize, usize, usize),
    pre_quant: bool,
) -> (Want, Vec<Tensor>) {
    let codes: Vec<u8> = (0..rows * cols).map(|_| rng.below(16) as u8).collect();
    let groups = cols.div_ceil(group);
    let mut scales: Vec<f32> = (0..rows * groups).map(|_| scale(rng)).collect();
    let zeroed = groups.min(scales.len() - 1);
    scales[zeroed] = 0.0;
    // Stored as bf16: the factors are bf16 values.
    let factors: Vec<f32> = (0..cols)
        .map(|c| match c {
            0 => -1.5,
            1 => 2f32.powi(-130),
            _ => half::bf16::from_f32(0.5 + rng.below(1000) as f32 / 500.0).to_f32(),
        })
        .collect();
    let packed: Vec<u8> = (0..rows / 2 * cols)
        .map(|i| {
            let (r, c) = (i / cols, i % cols);
            codes[2 * r * cols + c] | codes[(2 * r + 1) * cols + c] << 4
        })
        .collect();
    let vals = (0..rows * cols)
        .map(|i| {
            let (r, c) = (i / cols, i % cols);
            let q = (codes[i] as i32 - if codes[i] < 8 { 0 } else { 16 }) as f32;
            let v = q * scales[r * groups + c / group];
            if pre_quant {
                v * factors[c]
            } else {
                v
            }
        })
        .collect();
    let mut tensors = vec![
        Tensor::u8(format!("{name}.weight"), "U8", &[rows / 2, cols], &packed),
        Tensor::f32(format!("{name}.weight_scale"), &[rows, groups], &scales),
    ];
    if pre_quant {
        tensors.push(Tensor::bf16(
            format!("{name}.pre_quant_scale"),
            &[cols],
            &factors,
        ));
    }
    (Want::weight(name, vec![rows, cols], vals), tensors)
}

/// ModelOpt W4A16_AWQ and W4A8_AWQ: the dense weight is `(q·s)·pre_quant`
/// in f32, rounded once, on the modules that kept a pre-quant scale;
/// W4A8's `weight_scale_2` and `input_scale` belong to its activations.
#[test]
fn modelopt_int4_awq_folds_the_pre_quant_scale() {
    for (algo, group) in [("W4A16_AWQ", 128), ("W4A8_AWQ", 64)] {
        let mut rng = Rng::new(31);
        let tmp = tempfile::tempdir().unwrap();
        let o = format!("{ATTN}.o_proj");
        let q = format!("{ATTN}.q_proj");
        let (want_o, mut tensors) = int4_awq_module(&mut rng, &o, (24, 320, group), true);
        let (want_q, more) = int4_awq_module(&mut rng, &q, (16, 256, group), false);
        tensors.extend(more);
        if algo == "W4A8_AWQ" {
            for m in [&o, &q] {
                tensors.push(Tensor::f32(format!("{m}.weight_scale_2"), &[], &[0.25]));
                tensors.push(Tensor::f32(format!("{m}.input_scale"), &[], &[0.5]));
            }
        }
        let copies = copies(&mut rng);
        tensors.extend(copies.iter().cloned());
        modelopt_dir(tmp.path(), &tensors, algo, "bfloat16");
        let mut hq = hf_quant_config(algo);
        hq["quantization"]["group_size"] = json!(group);
        write_json(&tmp.path().join("hf_quant_config.json"), &hq);
        assert_eq!(
            scheme(tmp.path(), &o),
            format!("modelopt {algo} int4 group {group}")
        );
        let wants = [want_o, want_q];
        let check = |backend| {
            for out in OUTS {
                let got = decode_with(tmp.path(), out, backend);
                check_output(
                    &format!("{algo} -> {out} ({backend:?})"),
                    &got,
                    out,
                    &wants,
                    &copies,
                );
            }
        };
        check(BackendChoice::Cpu);
        gpu_test(|_| check(BackendChoice::Gpu));
    }
}

/// compressed-tensors mxfp8-quantized in an f16 model: the bf16 product,
/// then cast (2^-127 times small codes rounds in bf16 first).
#[test]
fn ct_mxfp8_multiplies_in_bf16() {
    for dtype in ["float16", "bfloat16"] {
        let mut rng = Rng::new(30);
        let tmp = tempfile::tempdir().unwrap();
        let name = "model.layers.0.mlp.down_proj".to_string();
        let (m, tensors) = mx_module(&mut rng, &name, 16, 64);
        let weights = json!({"num_bits": 8, "type": "float", "strategy": "group",
            "group_size": 32, "symmetric": true, "dynamic": false, "scale_dtype": "torch.uint8"});
        write_checkpoint(
            tmp.path(),
            &tensors,
            crate::common::ct_config("mxfp8-quantized", weights, "0.20.0"),
        );
        let mut cfg: Value =
            serde_json::from_slice(&std::fs::read(tmp.path().join("config.json")).unwrap())
                .unwrap();
        cfg["torch_dtype"] = json!(dtype);
        write_json(&tmp.path().join("config.json"), &cfg);
        assert_eq!(
            scheme(tmp.path(), &name),
            "mxfp8-quantized fp8 e4m3 e8m0-scale (bf16 product) group 32"
        );
        check_both(
            &format!("ct mxfp8 {dtype}"),
            tmp.path(),
            Arith::Bf16,
            &[m],
            &[],
        );
    }
}

/// fbgemm_fp8: `[out, 1]` f32 scales, the f32 product rounded once;
/// `input_scale_ub` dropped, `modules_to_not_convert` copied.
#[test]
fn fbgemm_fp8_per_row() {
    let mut rng = Rng::new(31);
    let tmp = tempfile::tempdir().unwrap();
    let mut tensors = copies(&mut rng);
    let copies = tensors.clone();
    let (rows, cols) = (40, 24);
    let mut scales: Vec<f32> = (0..rows).map(|_| scale(&mut rng)).collect();
    scales[0] = 1.0e-30;
    let name = "model.layers.0.mlp.down_proj".to_string();
    let s = scales.clone();
    let m = Module {
        name: name.clone(),
        rows,
        cols,
        codes: codes(&mut rng, rows, cols),
        scale_of: Box::new(move |r, _| s[r]),
    };
    tensors.push(m.weight());
    tensors.push(Tensor::f32(
        format!("{name}.weight_scale"),
        &[rows, 1],
        &scales,
    ));
    tensors.push(Tensor::f32(
        format!("{name}.input_scale_ub"),
        &[1],
        &[1200.0],
    ));
    write_checkpoint(
        tmp.path(),
        &tensors,
        json!({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
            "modules_to_not_convert": ["lm_head"]}),
    );
    assert_eq!(scheme(tmp.path(), &name), "fbgemm_fp8 fp8 e4m3 per-channel");
    check_both("fbgemm", tmp.path(), Arith::F32, &[m], &copies);
}

/// A Quark `quantization_config` whose global weight scheme is `weight`.
fn quark_config(weight: Value, layers: Value) -> Value {
    json!({
        "quant_method": "quark", "quant_mode": "eager_mode", "version": "0.9",
        "export": {"weight_format": "real_quantized", "pack_method": "reorder"},
        "global_quant_config": {
            "weight": weight,
            "input_tensors": {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": false},
            "output_tensors": null, "bias": null,
        },
        "layer_quant_config": layers, "exclude": ["lm_head"],
    })
}

fn quark_fp8(qscheme: &str) -> Value {
    json!({"dtype": "fp8_e4m3", "qscheme": qscheme, "ch_axis": 0, "group_size": null,
        "is_dynamic": false, "scale_type": "float"})
}

fn quark_mxfp4() -> Value {
    json!({"dtype": "fp4", "qscheme": "per_group", "ch_axis": -1, "group_size": 32,
        "is_dynamic": false, "scale_format": "e8m0", "scale_calculation_mode": "even"})
}

/// AMD Quark: FP8 per tensor globally (bf16 scales, the model's dtype, with
/// `input_scale` and a KV `output_scale` dropped), one module per channel
/// and one MXFP4 through `layer_quant_config`, lm_head excluded (copied);
/// Quark's dequantizer computes in f32 and casts once.
#[test]
fn quark_fp8_and_mxfp4() {
    let mut rng = Rng::new(32);
    let tmp = tempfile::tempdir().unwrap();
    let mut tensors = copies(&mut rng);
    let copies = tensors.clone();
    // bf16 scales, as Quark stores them in a bf16 model.
    let bf = |x: f32| half::bf16::from_f32(x).to_f32();
    let q = format!("{ATTN}.q_proj");
    let s_q = bf(scale(&mut rng));
    let mq = Module {
        name: q.clone(),
        rows: 32,
        cols: 32,
        codes: codes(&mut rng, 32, 32),
        scale_of: Box::new(move |_, _| s_q),
    };
    tensors.push(mq.weight());
    tensors.push(Tensor::bf16(format!("{q}.weight_scale"), &[], &[s_q]));
    tensors.push(Tensor::bf16(format!("{q}.input_scale"), &[], &[0.03]));
    let k = format!("{ATTN}.k_proj");
    let s_k: Vec<f32> = (0..16).map(|_| bf(scale(&mut rng))).collect();
    let s_k2 = s_k.clone();
    let mk = Module {
        name: k.clone(),
        rows: 16,
        cols: 32,
        codes: codes(&mut rng, 16, 32),
        scale_of: Box::new(move |r, _| s_k2[r]),
    };
    tensors.push(mk.weight());
    tensors.push(Tensor::bf16(format!("{k}.weight_scale"), &[16, 1], &s_k));
    tensors.push(Tensor::bf16(format!("{k}.output_scale"), &[], &[0.5]));
    // MXFP4: nibbles low first, E8M0 per 32 (−0 planted: code 8).
    let d = "model.layers.0.mlp.down_proj".to_string();
    let (rows, cols) = (8, 64);
    let mut nib: Vec<u8> = (0..rows * cols).map(|_| rng.below(16) as u8).collect();
    nib[0] = 8;
    let packed: Vec<u8> = nib.chunks(2).map(|p| p[0] | p[1] << 4).collect();
    let e = e8m0_bytes(&mut rng, rows * cols / 32);
    tensors.push(Tensor::u8(
        format!("{d}.weight"),
        "U8",
        &[rows, cols / 2],
        &packed,
    ));
    tensors.push(Tensor::u8(
        format!("{d}.weight_scale"),
        "U8",
        &[rows, cols / 32],
        &e,
    ));
    write_checkpoint(
        tmp.path(),
        &tensors,
        quark_config(
            quark_fp8("per_tensor"),
            json!({"*k_proj": {"weight": quark_fp8("per_channel")},
                "*mlp.down_proj": {"weight": quark_mxfp4()}}),
        ),
    );
    assert_eq!(scheme(tmp.path(), &q), "quark fp8 per-tensor");
    assert_eq!(scheme(tmp.path(), &k), "quark fp8 per-channel");
    assert_eq!(scheme(tmp.path(), &d), "quark mxfp4 (e8m0 group 32)");
    let fp4 = |c: u8| crate::common::producer::e2m1_ref(c);
    let mx_vals: Vec<f32> = (0..rows * cols)
        .map(|i| fp4(nib[i]) * e8m0_ref(e[(i / cols) * (cols / 32) + (i % cols) / 32]))
        .collect();
    let run = |backend: BackendChoice| {
        for out in OUTS {
            let got = decode_with(tmp.path(), out, backend);
            let wants = vec![
                mq.want(Arith::F32, out),
                mk.want(Arith::F32, out),
                Want::weight(&d, vec![rows, cols], mx_vals.clone()),
            ];
            check_output(
                &format!("quark -> {out} ({backend:?})"),
                &got,
                out,
                &wants,
                &copies,
            );
        }
    };
    run(BackendChoice::Cpu);
    gpu_test(|_| run(BackendChoice::Gpu));
}

/// fp8-dynamic's tensors (E4M3, bf16 scales per row) under a Quark
/// per-channel config decode to compressed-tensors' reference bytes: both
/// are the f32 product rounded once.
#[test]
fn quark_per_channel_over_the_fp8_dynamic_fixture() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    crate::common::copy_dir(&crate::common::fixtures().join("fp8-dynamic/model"), &dir);
    let path = dir.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    cfg["quantization_config"] = quark_config(quark_fp8("per_channel"), json!({}));
    write_json(&path, &cfg);
    let want: serde_json::Map<String, Value> = serde_json::from_slice(
        &std::fs::read(crate::common::fixtures().join("fp8-dynamic/expected-bf16.digests.json"))
            .unwrap(),
    )
    .unwrap();
    let got = decode_with(&dir, OutDtype::Bf16, BackendChoice::Cpu);
    assert_eq!(got.len(), want.len());
    for (name, w) in &want {
        let (_, _, bytes) = &got[name];
        assert_eq!(
            crate::common::sha256_hex(bytes),
            w["sha256"].as_str().unwrap(),
            "{name}"
        );
    }
}

/// Quark configs this tool does not decode are refused by rule: fake
/// quantized exports and other dtypes (CFG-002), MXFP4 groups other than 32
/// (CFG-001); scales that do not fit are TEN-003.
#[test]
fn quark_faults_are_refused_by_rule() {
    use wgpu_dequant::Rule;
    let mut rng = Rng::new(33);
    let d = "model.layers.0.mlp.down_proj";
    let tensors = vec![
        Tensor::u8(format!("{d}.weight"), "U8", &[8, 32], &vec![0x21; 256]),
        Tensor::u8(
            format!("{d}.weight_scale"),
            "U8",
            &[8, 2],
            &e8m0_bytes(&mut rng, 16),
        ),
    ];
    let build = |qc: Value| {
        let tmp = tempfile::tempdir().unwrap();
        write_checkpoint(tmp.path(), &tensors, qc);
        let ckpt = Checkpoint::open(tmp.path()).unwrap();
        match Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub) {
            Err(e) => Some(e.rule),
            Ok(plan) => plan.errors.first().map(|e| e.rule),
        }
    };
    let mut fake = quark_config(quark_mxfp4(), json!({}));
    fake["export"]["weight_format"] = json!("fake_quantized");
    assert_eq!(build(fake), Some(Rule::Unsupported));
    let mut int8 = quark_mxfp4();
    int8["dtype"] = json!("int8");
    assert_eq!(
        build(quark_config(int8, json!({}))),
        Some(Rule::Unsupported)
    );
    let mut g16 = quark_mxfp4();
    g16["group_size"] = json!(16);
    assert_eq!(build(quark_config(g16, json!({}))), Some(Rule::Config));
    // The scale is stored for 64 columns: 2 per row; per tensor needs 1.
    assert_eq!(
        build(quark_config(
            quark_fp8("per_tensor"),
            json!({"*down_proj": {"weight": quark_mxfp4()}})
        )),
        None
    );
    let wide = vec![
        tensors[0].clone(),
        Tensor::u8(format!("{d}.weight_scale"), "U8", &[8, 4], &[127; 32]),
    ];
    let tmp = tempfile::tempdir().unwrap();
    write_checkpoint(tmp.path(), &wide, quark_config(quark_mxfp4(), json!({})));
    let ckpt = Checkpoint::open(tmp.path()).unwrap();
    let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
    assert_eq!(plan.errors.first().map(|e| e.rule), Some(Rule::TensorShape));
    assert!(
        plan.errors[0].to_string().contains("weight_scale"),
        "{}",
        plan.errors[0]
    );
}

/// Misshaped INT4 AWQ modules are refused with the tensor and the rule: a
/// scale for other rows or groups, a pre-quant scale of the wrong length, a
/// float weight, a missing scale.
#[test]
fn modelopt_int4_awq_faults_are_refused_by_rule() {
    use wgpu_dequant::Rule;
    let mut rng = Rng::new(35);
    let m = "model.layers.0.mlp.down_proj";
    let (_, good) = int4_awq_module(&mut rng, m, (8, 256, 128), true);
    let refused = |tensors: &[Tensor]| {
        let tmp = tempfile::tempdir().unwrap();
        modelopt_dir(tmp.path(), tensors, "W4A16_AWQ", "bfloat16");
        let mut hq = hf_quant_config("W4A16_AWQ");
        hq["quantization"]["group_size"] = json!(128);
        write_json(&tmp.path().join("hf_quant_config.json"), &hq);
        let ckpt = Checkpoint::open(tmp.path()).unwrap();
        let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
        plan.errors.first().map(|e| (e.rule, e.to_string()))
    };
    assert_eq!(refused(&good), None);
    let swap = |k: usize, t: Tensor| {
        let mut v = good.clone();
        v[k] = t;
        v
    };
    let cases = [
        (
            swap(
                1,
                Tensor::f32(format!("{m}.weight_scale"), &[8, 4], &[1.0; 32]),
            ),
            Rule::TensorShape,
            "weight_scale",
        ),
        (
            swap(
                1,
                Tensor::f32(format!("{m}.weight_scale"), &[6, 2], &[1.0; 12]),
            ),
            Rule::TensorShape,
            "weight_scale",
        ),
        (
            swap(
                2,
                Tensor::bf16(format!("{m}.pre_quant_scale"), &[128], &[1.0; 128]),
            ),
            Rule::TensorShape,
            "pre_quant_scale",
        ),
        (
            swap(
                0,
                Tensor::f32(format!("{m}.weight"), &[4, 256], &[0.0; 1024]),
            ),
            Rule::TensorDtype,
            "weight",
        ),
        (
            vec![good[0].clone(), good[2].clone()],
            Rule::MissingTensor,
            "weight_scale",
        ),
    ];
    for (tensors, rule, tensor) in cases {
        let (got, line) = refused(&tensors).unwrap_or_else(|| panic!("{tensor}: accepted"));
        assert_eq!(got, rule, "{line}");
        assert!(line.contains(&format!("{m}.{tensor}")), "{line}");
    }
}

/// The fuzz target `config` in small, on every run, over the producers' own
/// files: ModelOpt's INT4 AWQ `hf_quant_config.json` and Quark's
/// `config.json` with random bytes overwritten are refused in one line or
/// decoded, never a panic.
#[test]
fn mutated_modelopt_and_quark_configs_never_panic() {
    use crate::common::{caught, copy_dir, fixtures};
    use wgpu_dequant::{BackendChoice, Model};
    let mut rng = Rng::new(37);
    for (case, file) in [
        ("modelopt-int4-awq", "hf_quant_config.json"),
        ("quark-mixed-exclude", "config.json"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        copy_dir(&fixtures().join(case).join("model"), tmp.path());
        let valid = std::fs::read(tmp.path().join(file)).unwrap();
        let (mut refused, mut decoded) = (0, 0);
        for _ in 0..150 {
            let text = rng.mutate(&valid);
            std::fs::write(tmp.path().join(file), &text).unwrap();
            let out = caught(|| -> Result<(), wgpu_dequant::Error> {
                let model = Model::open(tmp.path(), DtypeChoice::Auto)?;
                for t in model.tensors() {
                    model.decode(&t.name, BackendChoice::Cpu)?;
                }
                Ok(())
            });
            match out {
                Err(p) => panic!(
                    "{case} {file} {:?}: panicked: {p}",
                    String::from_utf8_lossy(&text)
                ),
                Ok(Err(e)) => {
                    assert!(!e.to_string().contains('\n'), "{e}");
                    refused += 1;
                }
                Ok(Ok(())) => decoded += 1,
            }
        }
        assert!(
            refused > 10 && decoded > 10,
            "{case}: refused {refused}, decoded {decoded}"
        );
    }
}

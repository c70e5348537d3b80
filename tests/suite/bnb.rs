//! Small bitsandbytes checkpoints written the way bitsandbytes 0.50 and
//! transformers 5 save them, decoded and compared byte for byte with the
//! values computed here as bitsandbytes' CUDA and scalar kernels compute
//! them (rounded once by the `half` crate):
//!
//! - 4-bit: the row-major flattened tensor in blocks of `blocksize` flat
//!   elements (crossing rows, the last one partial), byte k holding element
//!   2k in its high nibble; value `LUT[code] · absmax[e div bs]` in f32 with
//!   the kernels' NF4/FP4 tables; nested absmax
//!   `f32(nested_quant_map[u8] · nested_absmax[i div 256]) + offset`;
//!   codes stored as `bnb_4bit_quant_storage` (bytes reinterpreted,
//!   `[(n + 1) div (2·size), 1]`).
//! - LLM.int8: `f32(f32(q) · SCB[row]) · f32(1/127)`.
//!
//! The tables are written out here from bitsandbytes' `kernels.cu`, not
//! taken from the crate.

use std::path::Path;

use serde_json::{json, Value};
use wgpu_dequant::{BackendChoice, Checkpoint, DtypeChoice, Names, OutDtype, Plan};

use crate::common::producer::{check_output, decode, expect_decodes, gpu_equals_cpu, Want};
use crate::common::{
    gpu_test, read_dir_tensors, write_json, write_safetensors, write_two_shards, Rng, Tensor,
};

/// `dDequantizeNF4`, its literals as bitsandbytes writes them.
#[allow(clippy::excessive_precision)]
const NF4: [f32; 16] = [
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
];

/// `dDequantizeFP4Tree`: the magnitude by bits 0–2, the sign by bit 3
/// (its literals as bitsandbytes writes them).
#[allow(clippy::excessive_precision)]
fn fp4(code: u8) -> f32 {
    const MAG: [f32; 8] = [
        0.0,
        5.208333333e-03,
        0.66666667,
        1.0,
        0.33333333,
        0.5,
        0.16666667,
        0.25,
    ];
    let m = MAG[(code & 7) as usize];
    if code & 8 != 0 {
        -m
    } else {
        m
    }
}

/// The `quant_map` bitsandbytes stores for FP4 (`get_4bit_type("fp4")`:
/// +0.0 at code 8, unlike its kernels).
fn fp4_map() -> Vec<f32> {
    let data = [
        0.0f32, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, 0.0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0,
        -3.0,
    ];
    data.iter().map(|x| x / 12.0).collect()
}

/// One 4-bit module as a test writes it.
#[derive(Clone, Copy)]
struct Spec {
    fp4: bool,
    blocksize: usize,
    nested: bool,
    /// The safetensors dtype the codes are stored as.
    storage: &'static str,
    /// The quant state's `dtype`.
    dtype: &'static str,
    shape: [usize; 2],
}

const BASE: Spec = Spec {
    fp4: false,
    blocksize: 64,
    nested: true,
    storage: "U8",
    dtype: "bfloat16",
    shape: [64, 96],
};

fn storage_size(dtype: &str) -> usize {
    match dtype {
        "U8" | "I8" => 1,
        "BF16" | "F16" => 2,
        _ => 4,
    }
}

/// A positive f32 of moderate magnitude.
fn positive(rng: &mut Rng) -> f32 {
    let e = rng.below(8) as i32 - 6;
    (1.0 + rng.below(1 << 20) as f32 / (1 << 20) as f32) * 2f32.powi(e)
}

/// The stored tensors of 4-bit `module` and the weight they decode to.
fn module(rng: &mut Rng, module: &str, s: Spec) -> (Vec<Tensor>, Want) {
    let n = s.shape[0] * s.shape[1];
    let bs = s.blocksize;
    let blocks = n.div_ceil(bs);
    let codes: Vec<u8> = (0..n).map(|_| rng.below(16) as u8).collect();
    // Element 2k in the high nibble of byte k.
    let mut packed: Vec<u8> = codes
        .chunks(2)
        .map(|c| c[0] << 4 | c.get(1).copied().unwrap_or(0))
        .collect();
    let size = storage_size(s.storage);
    let rows = (n + 1) / (2 * size);
    assert!(rows * size >= packed.len(), "test bug: storage too small");
    packed.resize(rows * size, 0);
    let map: Vec<f32> = if s.fp4 { fp4_map() } else { NF4.to_vec() };
    let w = format!("{module}.weight");
    let mut tensors = vec![
        Tensor::u8(&w, s.storage, &[rows, 1], &packed),
        Tensor::f32(format!("{w}.quant_map"), &[16], &map),
    ];
    let mut state = json!({
        "quant_type": if s.fp4 { "fp4" } else { "nf4" },
        "blocksize": bs, "dtype": s.dtype, "shape": s.shape,
    });
    let absmax: Vec<f32> = if s.nested {
        let qm: Vec<f32> = (0..256).map(|i| (i as f32 - 127.5) / 128.0).collect();
        let outer: Vec<f32> = (0..blocks.div_ceil(256)).map(|_| positive(rng)).collect();
        let a: Vec<u8> = (0..blocks).map(|_| 140 + rng.below(116) as u8).collect();
        let offset = 0.130_334_883_928_298_95f64;
        state["nested_blocksize"] = json!(256);
        state["nested_dtype"] = json!("float32");
        state["nested_offset"] = json!(offset);
        tensors.push(Tensor::u8(format!("{w}.absmax"), "U8", &[blocks], &a));
        tensors.push(Tensor::f32(
            format!("{w}.nested_absmax"),
            &[outer.len()],
            &outer,
        ));
        tensors.push(Tensor::f32(format!("{w}.nested_quant_map"), &[256], &qm));
        a.iter()
            .enumerate()
            .map(|(i, &c)| qm[c as usize] * outer[i / 256] + offset as f32)
            .collect()
    } else {
        let a: Vec<f32> = (0..blocks).map(|_| positive(rng)).collect();
        tensors.push(Tensor::f32(format!("{w}.absmax"), &[blocks], &a));
        a
    };
    let text = state.to_string().into_bytes();
    let kind = if s.fp4 { "fp4" } else { "nf4" };
    tensors.push(Tensor::u8(
        format!("{w}.quant_state.bitsandbytes__{kind}"),
        "U8",
        &[text.len()],
        &text,
    ));
    let vals = codes
        .iter()
        .enumerate()
        .map(|(e, &c)| {
            let lut = if s.fp4 { fp4(c) } else { NF4[c as usize] };
            lut * absmax[e / bs]
        })
        .collect();
    (tensors, Want::weight(module, s.shape.to_vec(), vals))
}

/// The stored tensors of LLM.int8 `module` `[out, in]`.
fn int8_module(rng: &mut Rng, module: &str, out: usize, inputs: usize) -> (Vec<Tensor>, Want) {
    let q: Vec<i8> = (0..out * inputs)
        .map(|_| rng.below(256) as u8 as i8)
        .collect();
    let scb: Vec<f32> = (0..out).map(|_| positive(rng) * 8.0).collect();
    let bytes: Vec<u8> = q.iter().map(|&x| x as u8).collect();
    let tensors = vec![
        Tensor::u8(format!("{module}.weight"), "I8", &[out, inputs], &bytes),
        Tensor::f32(format!("{module}.SCB"), &[out], &scb),
        Tensor::u8(format!("{module}.weight_format"), "U8", &[], &[0]),
    ];
    let c = 7.874015718698502e-3f64 as f32;
    let vals = (0..out * inputs)
        .map(|i| q[i] as f32 * scb[i / inputs] * c)
        .collect();
    (tensors, Want::weight(module, vec![out, inputs], vals))
}

fn quant_config(four_bit: bool, s: Spec, skip: Value) -> Value {
    json!({
        "quant_method": "bitsandbytes",
        "_load_in_4bit": four_bit, "_load_in_8bit": !four_bit,
        "load_in_4bit": four_bit, "load_in_8bit": !four_bit,
        "bnb_4bit_compute_dtype": s.dtype,
        "bnb_4bit_quant_storage": match s.storage {
            "U8" => "uint8", "I8" => "int8", "BF16" => "bfloat16", "F16" => "float16",
            _ => "float32",
        },
        "bnb_4bit_quant_type": if s.fp4 { "fp4" } else { "nf4" },
        "bnb_4bit_use_double_quant": s.nested,
        "llm_int8_enable_fp32_cpu_offload": false,
        "llm_int8_has_fp16_weight": false,
        "llm_int8_skip_modules": skip,
        "llm_int8_threshold": 6.0,
    })
}

fn write_config(dir: &Path, qc: Value, dtype: &str) {
    write_json(
        &dir.join("config.json"),
        &json!({"architectures": ["LlamaForCausalLM"], "dtype": dtype,
                "quantization_config": qc}),
    );
}

/// Writes one checkpoint of `s` (two 4-bit modules and a norm), decodes it
/// to every dtype on the CPU, checks the GPU's bytes against the CPU's,
/// and multiplies by both modules.
fn run(ctx: &str, s: Spec, seed: u64) {
    let mut rng = Rng::new(seed);
    let (mut tensors, a) = module(&mut rng, "model.layers.0.mlp.up_proj", s);
    let (more, b) = module(
        &mut rng,
        "model.layers.0.self_attn.q_proj",
        Spec {
            shape: [s.shape[1], s.shape[0]],
            ..s
        },
    );
    tensors.extend(more);
    let norm = Tensor::bf16("model.norm.weight", &[4], &[1.0, -0.5, 0.25, 2.0]);
    tensors.push(norm.clone());
    let dir = tempfile::tempdir().unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    write_config(dir.path(), quant_config(true, s, Value::Null), s.dtype);
    let cpu = expect_decodes(ctx, dir.path(), &[a, b], &[norm]);
    gpu_test(|_| gpu_equals_cpu(ctx, dir.path(), &cpu));
    crate::matmul::products_keep_to_the_bound(ctx, dir.path());
}

#[test]
fn bnb_nf4_nested_blocks_cross_rows() {
    // 96 columns in blocks of 64: every other block spans two rows.
    run("nf4 nested 64x96", BASE, 1);
}

#[test]
fn bnb_fp4_plain_and_nested_block_128() {
    let s = Spec {
        fp4: true,
        blocksize: 128,
        nested: false,
        shape: [48, 200],
        ..BASE
    };
    run("fp4 b128 plain", s, 2);
    run("fp4 b128 nested", Spec { nested: true, ..s }, 3);
    // Blocks along the rows, as most real models have them.
    run(
        "fp4 b64 256 wide",
        Spec {
            blocksize: 64,
            shape: [32, 256],
            ..s
        },
        4,
    );
}

#[test]
fn bnb_partial_last_block_and_odd_element_count() {
    // 300 elements in blocks of 64: the last block holds 44.
    run(
        "partial block",
        Spec {
            shape: [10, 30],
            ..BASE
        },
        5,
    );
    // 63 elements: one partial block, the last byte's low nibble unused.
    run(
        "odd count",
        Spec {
            shape: [7, 9],
            nested: false,
            ..BASE
        },
        6,
    );
    // More than 256 blocks: the nested absmax has several entries, the last
    // block partial.
    run(
        "many blocks",
        Spec {
            shape: [130, 257],
            blocksize: 32,
            ..BASE
        },
        7,
    );
}

#[test]
fn bnb_every_block_size() {
    for (k, bs) in [32usize, 64, 128, 256, 512, 1024, 2048, 4096]
        .into_iter()
        .enumerate()
    {
        let s = Spec {
            blocksize: bs,
            shape: [24, 176],
            nested: k % 2 == 0,
            fp4: k % 3 == 0,
            ..BASE
        };
        run(&format!("block {bs}"), s, 10 + k as u64);
    }
}

#[test]
fn bnb_quant_storage_dtypes() {
    for (k, storage) in ["I8", "BF16", "F16", "F32"].into_iter().enumerate() {
        let s = Spec {
            storage,
            shape: [32, 64],
            ..BASE
        };
        run(&format!("storage {storage}"), s, 20 + k as u64);
    }
}

/// An f16 model (its quant states say float16) decodes to f16 by default,
/// each value the f32 product rounded once.
#[test]
fn bnb_f16_model_defaults_to_f16() {
    let s = Spec {
        dtype: "float16",
        fp4: true,
        ..BASE
    };
    let mut rng = Rng::new(30);
    let (tensors, want) = module(&mut rng, "model.layers.0.mlp.down_proj", s);
    let dir = tempfile::tempdir().unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    write_config(dir.path(), quant_config(true, s, Value::Null), "float16");
    let out = tempfile::tempdir().unwrap();
    let dense = out.path().join("dense");
    wgpu_dequant::dequantize(
        dir.path(),
        &dense,
        &wgpu_dequant::Options {
            dtype: DtypeChoice::Auto,
            backend: BackendChoice::Cpu,
        },
    )
    .unwrap();
    let got = read_dir_tensors(&dense);
    check_output("f16 model", &got, OutDtype::F16, &[want], &[]);
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(dense.join("config.json")).unwrap()).unwrap();
    assert!(cfg.get("quantization_config").is_none());
    assert_eq!(cfg["dtype"], "float16");
    // Without a dtype in config.json, the quant state's is the default.
    write_json(
        &dir.path().join("config.json"),
        &json!({"quantization_config": quant_config(true, s, Value::Null)}),
    );
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
    assert_eq!(plan.dtype, OutDtype::F16);
}

/// LLM.int8 modules, with one the config skips stored dense beside them.
#[test]
fn bnb_int8_and_skipped_modules() {
    let mut rng = Rng::new(40);
    let (mut tensors, a) = int8_module(&mut rng, "model.layers.0.mlp.up_proj", 48, 40);
    let (more, b) = int8_module(&mut rng, "model.layers.0.self_attn.o_proj", 40, 40);
    tensors.extend(more);
    let dense = Tensor::bf16(
        "model.layers.0.mlp.down_proj.weight",
        &[2, 2],
        &[1.0, 2.0, -3.0, 0.5],
    );
    let head = Tensor::bf16("lm_head.weight", &[2, 2], &[0.25, 2.0, -1.0, 4.0]);
    tensors.push(dense.clone());
    tensors.push(head.clone());
    let dir = tempfile::tempdir().unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    let skip = json!(["lm_head", "mlp.down_proj"]);
    write_config(dir.path(), quant_config(false, BASE, skip), "bfloat16");
    let cpu = expect_decodes("int8", dir.path(), &[a, b], &[dense, head]);
    gpu_test(|_| gpu_equals_cpu("int8", dir.path(), &cpu));
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    assert_eq!(plan.format.describe(), "bitsandbytes LLM.int8");
}

/// A module the skip list names but that is stored quantized is decoded,
/// with a warning; the skip patterns match as transformers matches them
/// (prefix to a module boundary, regex, suffix).
#[test]
fn bnb_skip_list_matches_as_transformers_does() {
    let mut rng = Rng::new(50);
    let (tensors, want) = module(&mut rng, "model.layers.1.mlp.gate_proj", BASE);
    let dir = tempfile::tempdir().unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    for (skip, warned) in [
        (json!(["lm_head"]), false),
        (json!(["model.layers.1"]), true),
        (json!(["model.layers.11"]), false),
        (json!(["model.layers.1.mlp.gate"]), false),
        (json!([r"model\.layers\.\d+\.mlp"]), true),
        (json!(["gate_proj"]), true),
    ] {
        write_config(
            dir.path(),
            quant_config(true, BASE, skip.clone()),
            "bfloat16",
        );
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).unwrap();
        assert_eq!(
            !plan.warnings.is_empty(),
            warned,
            "{skip}: {:?}",
            plan.warnings
        );
        assert!(plan.errors.is_empty(), "{skip}: {:?}", plan.errors);
        // inspect's line per module: quant type, block size, nesting, storage.
        let scheme = plan.outputs[0].scheme.as_deref().unwrap_or_default();
        assert_eq!(
            scheme,
            "bitsandbytes nf4 block 64, nested absmax (block 256), storage U8, dtype bfloat16"
        );
    }
    let got = decode(dir.path(), OutDtype::Bf16);
    check_output("skipped but quantized", &got, OutDtype::Bf16, &[want], &[]);
}

/// A module's tensors in two shards (the codes in the first, absmax, maps
/// and state in the second) decode as from one file.
#[test]
fn bnb_module_split_across_shards() {
    let mut rng = Rng::new(60);
    let (tensors, want) = module(&mut rng, "model.layers.0.mlp.gate_proj", BASE);
    let dir = tempfile::tempdir().unwrap();
    let (first, second): (Vec<Tensor>, Vec<Tensor>) = tensors
        .into_iter()
        .partition(|t| t.name.ends_with("weight"));
    write_two_shards(dir.path(), &first, &second);
    write_config(
        dir.path(),
        quant_config(true, BASE, Value::Null),
        "bfloat16",
    );
    let got = decode(dir.path(), OutDtype::Bf16);
    check_output("sharded", &got, OutDtype::Bf16, &[want], &[]);
}

/// The kernels' tables: NF4's is the `quant_map` the fixture stores, FP4's
/// differs from the stored one only in the sign of code 8's zero.
#[test]
fn bnb_tables_are_the_kernels() {
    let dir = crate::common::fixtures().join("bnb-nf4-dq-bf16/model");
    let t = read_dir_tensors(&dir);
    let (_, _, bytes) = &t["model.layers.0.mlp.down_proj.weight.quant_map"];
    let stored: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let ours: Vec<u32> = NF4.iter().map(|v| v.to_bits()).collect();
    assert_eq!(stored, ours);
    for c in 0..16u8 {
        let (k, m) = (fp4(c), fp4_map()[c as usize]);
        assert!(k == m, "code {c}: {k} vs {m}");
        assert_eq!(k.to_bits() == m.to_bits(), c != 8, "code {c}");
    }
}

/// The fuzz target `bnb_state` in small, on every run: a valid quant state
/// with random bytes overwritten (and random bytes as a whole state) is
/// refused or decoded, never a panic, and a refusal is one line naming the
/// module's tensor.
#[test]
fn bnb_mutated_quant_states_never_panic() {
    let mut rng = Rng::new(70);
    let s = Spec {
        shape: [4, 40],
        ..BASE
    };
    let (tensors, _) = module(&mut rng, "model.layers.0.mlp.up_proj", s);
    let state_name = "model.layers.0.mlp.up_proj.weight.quant_state.bitsandbytes__nf4";
    let valid = tensors
        .iter()
        .find(|t| t.name == state_name)
        .unwrap()
        .data
        .clone();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), quant_config(true, s, Value::Null), "bfloat16");
    let (mut refused, mut decoded) = (0, 0);
    for case in 0..400 {
        let state: Vec<u8> = if case % 10 == 0 {
            (0..rng.below(64)).map(|_| rng.below(256) as u8).collect()
        } else {
            rng.mutate(&valid)
        };
        let mut ts = tensors.clone();
        let t = ts.iter_mut().find(|t| t.name == state_name).unwrap();
        t.shape = vec![state.len()];
        t.data = state.clone();
        write_safetensors(&dir.path().join("model.safetensors"), &ts);
        let out = crate::common::caught(|| -> Result<(), wgpu_dequant::Error> {
            let ckpt = Checkpoint::open(dir.path())?;
            let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub)?;
            plan.check()?;
            let model = wgpu_dequant::Model::open(dir.path(), DtypeChoice::Auto)?;
            model.decode("model.layers.0.mlp.up_proj.weight", BackendChoice::Cpu)?;
            Ok(())
        });
        match out {
            Err(p) => panic!("state {:?}: panicked: {p}", String::from_utf8_lossy(&state)),
            Ok(Err(e)) => {
                let msg = e.to_string();
                assert!(!msg.contains('\n'), "{msg}");
                assert!(msg.contains("up_proj"), "{msg}");
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

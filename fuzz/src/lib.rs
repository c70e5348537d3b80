//! What every fuzz target does with the checkpoint it built: open it, plan
//! it, report it as `inspect` does, and decode its small tensors on the CPU.
//! Refusals are fine when they are one line; a panic, an out-of-bounds read
//! or a huge allocation is what the fuzzer looks for.
//!
//! The targets' bodies are [`targets`]: the fuzz binaries call them, and so
//! does the stable test that replays `fuzz/regressions/` (`tests/suite/fuzz_corpus.rs`
//! includes this file as a module).

pub mod targets;

use std::path::{Path, PathBuf};

use wgpu_dequant::backend::Cpu;
use wgpu_dequant::report::Report;
use wgpu_dequant::{Checkpoint, DtypeChoice, Names, Plan};

/// Tensors larger than this are planned but not decoded (keeps runs fast).
const DECODE_LIMIT: usize = 1 << 22;

/// A scratch directory for this process and thread, emptied before each case.
pub fn scratch() -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let thread = format!("{:?}", std::thread::current().id());
    let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
    let dir = base.join(format!("wgpu-dequant-fuzz-{}-{thread}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// Writes `files` (name, bytes) into a fresh scratch directory.
pub fn checkpoint_dir(files: &[(&str, &[u8])]) -> PathBuf {
    let dir = scratch();
    for (name, bytes) in files {
        let _ = std::fs::write(dir.join(name), bytes);
    }
    dir
}

/// A refusal must be one line (the codebase's rule for every error).
pub fn one_line(e: &wgpu_dequant::Error) {
    let text = e.to_string();
    assert!(
        !text.contains('\n'),
        "a refusal of more than one line: {text:?}"
    );
}

/// Open, plan, report, decode: everything `inspect` and `dequantize` do
/// short of writing. The files made from a GGUF file's metadata
/// (`config.json`, `tokenizer.json`, …) must be JSON where they are named so.
pub fn exercise(path: &Path) {
    let ckpt = match Checkpoint::open(path) {
        Ok(ckpt) => ckpt,
        Err(e) => return one_line(&e),
    };
    let plan = match Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub) {
        Ok(plan) => plan,
        Err(e) => return one_line(&e),
    };
    let report = Report::new(&plan);
    let _ = report.text();
    let _ = plan.check();
    plan.errors.iter().for_each(one_line);
    if !plan.errors.is_empty() {
        return;
    }
    for (name, bytes) in &plan.generated {
        if name.ends_with(".json") {
            let parsed = serde_json::from_slice::<serde_json::Value>(bytes);
            assert!(parsed.is_ok(), "{name} is not JSON: {parsed:?}");
        }
    }
    let cpu = Cpu::new();
    for out in &plan.outputs {
        if out.byte_len() <= DECODE_LIMIT {
            if let Err(e) = out.bytes(&cpu) {
                one_line(&e);
            }
        }
    }
}

/// A bitsandbytes 4-bit checkpoint of one `[4, 32]` NF4 module (two
/// blocks of 64), plain or with nested absmax, whose quant state is `state`.
pub fn bnb_checkpoint(state: &[u8], nested: bool) -> PathBuf {
    let m = "model.layers.0.mlp.down_proj.weight";
    let f32s = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let codes: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
    let map: Vec<f32> = (0..16).map(|i| i as f32 / 7.5 - 1.0).collect();
    let mut tensors: Vec<(String, &str, Vec<usize>, Vec<u8>)> = vec![
        (m.to_string(), "U8", vec![64, 1], codes),
        (format!("{m}.quant_map"), "F32", vec![16], f32s(&map)),
    ];
    if nested {
        let qm: Vec<f32> = (0..256).map(|i| i as f32 / 256.0).collect();
        tensors.push((format!("{m}.absmax"), "U8", vec![2], vec![17, 250]));
        tensors.push((format!("{m}.nested_absmax"), "F32", vec![1], f32s(&[0.5])));
        tensors.push((format!("{m}.nested_quant_map"), "F32", vec![256], f32s(&qm)));
    } else {
        tensors.push((format!("{m}.absmax"), "F32", vec![2], f32s(&[0.25, 3.0])));
    }
    tensors.push((
        format!("{m}.quant_state.bitsandbytes__nf4"),
        "U8",
        vec![state.len()],
        state.to_vec(),
    ));
    let mut header = String::from("{");
    let mut data = Vec::new();
    for (i, (name, dtype, shape, bytes)) in tensors.iter().enumerate() {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header.push_str(&format!(
            "{}\"{name}\": {{\"dtype\": \"{dtype}\", \"shape\": [{}], \"data_offsets\": [{}, {}]}}",
            if i == 0 { "" } else { ", " },
            dims.join(", "),
            data.len(),
            data.len() + bytes.len()
        ));
        data.extend_from_slice(bytes);
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut st = (header.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(header.as_bytes());
    st.extend_from_slice(&data);
    let config = format!(
        "{{\"dtype\": \"bfloat16\", \"quantization_config\": {{\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true, \"bnb_4bit_quant_type\": \"nf4\", \"bnb_4bit_use_double_quant\": {nested}}}}}"
    );
    checkpoint_dir(&[
        ("model.safetensors", &st),
        ("config.json", config.as_bytes()),
    ])
}

/// Fixture files the targets start from.
pub mod fixtures {
    macro_rules! fixture {
        ($case:literal, $file:literal) => {
            // Relative to this file, so that the replay test (another
            // crate) includes the same bytes.
            include_bytes!(concat!("../../tests/fixtures/", $case, "/model/", $file))
        };
    }
    /// compressed-tensors int4 asymmetric group 128.
    pub const W4A16_ASYM: &[u8] = fixture!("w4a16-asym-g128", "model.safetensors");
    /// Its config.json.
    pub const W4A16_ASYM_CONFIG: &[u8] = fixture!("w4a16-asym-g128", "config.json");
    /// Two-shard NVFP4 checkpoint.
    pub const SHARD1: &[u8] = fixture!("sharded-nvfp4a16", "model-00001-of-00002.safetensors");
    /// Its second shard.
    pub const SHARD2: &[u8] = fixture!("sharded-nvfp4a16", "model-00002-of-00002.safetensors");
    /// Its config.json.
    pub const SHARDED_CONFIG: &[u8] = fixture!("sharded-nvfp4a16", "config.json");
    /// Its index.
    pub const SHARDED_INDEX: &[u8] = fixture!("sharded-nvfp4a16", "model.safetensors.index.json");
    /// ModelOpt NVFP4.
    pub const MODELOPT: &[u8] = fixture!("modelopt-nvfp4", "model.safetensors");
    /// Its hf_quant_config.json.
    pub const MODELOPT_HF: &[u8] = fixture!("modelopt-nvfp4", "hf_quant_config.json");
    /// SVDQuant fp4, Nunchaku-packed.
    pub const SVDQ: &[u8] = fixture!("svdq-fp4-g16-packed", "model.safetensors");
    /// Its sidecar.
    pub const SVDQ_SIDECAR: &[u8] = fixture!("svdq-fp4-g16-packed", "model.config.yaml");
    /// int3, fields crossing words.
    pub const W3A16: &[u8] = fixture!("w3a16-g16", "model.safetensors");
    /// Its config.json.
    pub const W3A16_CONFIG: &[u8] = fixture!("w3a16-g16", "config.json");
    /// DeepSeek-style FP8 with 128x128 block scales.
    pub const FP8_BLOCK: &[u8] = fixture!("fp8-block-bf16", "model.safetensors");
    /// AutoAWQ GEMM int4 group 128.
    pub const AWQ: &[u8] = fixture!("awq-gemm-w4-g128", "model.safetensors");
    /// GPTQModel GPTQ v1 int4 group 128, desc_act (g_idx permuted).
    pub const GPTQ: &[u8] = fixture!("gptq-w4-g128-actorder", "model.safetensors");
    /// GPT-OSS's native MXFP4 experts.
    pub const GPT_OSS: &[u8] = fixture!("gpt-oss-mxfp4", "model.safetensors");
    /// bitsandbytes NF4 with nested absmax (transformers 5.24 + bitsandbytes 0.50.2).
    pub const BNB_NF4: &[u8] = fixture!("bnb-nf4-dq-bf16", "model.safetensors");
    /// bitsandbytes LLM.int8.
    pub const BNB_INT8: &[u8] = fixture!("bnb-int8-bf16", "model.safetensors");
    /// ModelOpt FP8 per tensor (issue 26).
    pub const MODELOPT_FP8: &[u8] = fixture!("modelopt-fp8", "model.safetensors");
    /// compressed-tensors mxfp8-quantized (E8M0 scales per 32): also ModelOpt
    /// MXFP8's layout.
    pub const CT_MXFP8: &[u8] = fixture!("ct-mxfp8", "model.safetensors");
    /// fp8-dynamic's E4M3 weights with `[out, 1]` scales (fbgemm_fp8's layout).
    pub const FP8_DYNAMIC: &[u8] = fixture!("fp8-dynamic", "model.safetensors");
    /// ModelOpt 0.47's own W4A16_AWQ export (codes two rows a byte,
    /// pre-quant scales).
    pub const MODELOPT_INT4_AWQ: &[u8] = fixture!("modelopt-int4-awq", "model.safetensors");
    /// AMD Quark 0.13's own FP8 export with an MXFP4 layer override.
    pub const QUARK_MIXED: &[u8] = fixture!("quark-mixed-exclude", "model.safetensors");
    /// MLX affine 3-bit group 64 (codes crossing words, biases).
    pub const MLX_3BIT: &[u8] = fixture!("mlx-3bit-g64", "model.safetensors");
    /// MLX mxfp4.
    pub const MLX_MXFP4: &[u8] = fixture!("mlx-mxfp4", "model.safetensors");
    /// compressed-tensors 0.14's unstructured sparse-bitmask over FP8
    /// (issue 27): masks, row offsets and kept values that must agree.
    pub const SPARSE_BITMASK: &[u8] = fixture!("ct-sparse-bitmask-fp8", "model.safetensors");
    pub const SPARSE_BITMASK_CONFIG: &[u8] = fixture!("ct-sparse-bitmask-fp8", "config.json");
    /// llmcompressor's QuIP rotations over W4A16 (issue 27): stored ±1
    /// matrices folded into each Linear.
    pub const QUIP: &[u8] = fixture!("ct-transform-quip-w4a16", "model.safetensors");
    pub const QUIP_CONFIG: &[u8] = fixture!("ct-transform-quip-w4a16", "config.json");
    /// MLX affine 3-bit group 64's config.json and index.
    pub const MLX_3BIT_CONFIG: &[u8] = fixture!("mlx-3bit-g64", "config.json");
    pub const MLX_3BIT_INDEX: &[u8] = fixture!("mlx-3bit-g64", "model.safetensors.index.json");
    /// MLX affine 4-bit group 64.
    pub const MLX_4BIT: &[u8] = fixture!("mlx-affine-4bit-g64", "model.safetensors");
    pub const MLX_4BIT_CONFIG: &[u8] = fixture!("mlx-affine-4bit-g64", "config.json");
    pub const MLX_4BIT_INDEX: &[u8] =
        fixture!("mlx-affine-4bit-g64", "model.safetensors.index.json");
    /// MLX mxfp4's config.json and index.
    pub const MLX_MXFP4_CONFIG: &[u8] = fixture!("mlx-mxfp4", "config.json");
    pub const MLX_MXFP4_INDEX: &[u8] = fixture!("mlx-mxfp4", "model.safetensors.index.json");
    /// MLX's GPT-OSS with mxfp4 experts.
    pub const MLX_GPT_OSS: &[u8] = fixture!("mlx-gpt-oss-mxfp4", "model.safetensors");
    pub const MLX_GPT_OSS_CONFIG: &[u8] = fixture!("mlx-gpt-oss-mxfp4", "config.json");
    pub const MLX_GPT_OSS_INDEX: &[u8] =
        fixture!("mlx-gpt-oss-mxfp4", "model.safetensors.index.json");
    /// MLX's Qwen3 MoE, affine 4-bit.
    pub const MLX_MOE: &[u8] = fixture!("mlx-qwen3-moe-4bit", "model.safetensors");
    pub const MLX_MOE_CONFIG: &[u8] = fixture!("mlx-qwen3-moe-4bit", "config.json");
    pub const MLX_MOE_INDEX: &[u8] = fixture!("mlx-qwen3-moe-4bit", "model.safetensors.index.json");

    macro_rules! tokenizer {
        ($case:literal) => {
            include_bytes!(concat!(
                "../../tests/gguf/tokenizers/",
                $case,
                "/model.gguf"
            ))
        };
    }
    /// Small GGUF models with a real tokenizer each (gguf-py from
    /// transformers' own tokenizers): SentencePiece and BPE vocabularies
    /// under the architectures whose builders differ.
    pub const TOKENIZERS: &[&[u8]] = &[
        tokenizer!("spm-llama"),
        tokenizer!("spm-llama-eos"),
        tokenizer!("spm-gemma2"),
        tokenizer!("spm-gemma3"),
        tokenizer!("spm-phi3"),
        tokenizer!("spm-qwen2"),
        tokenizer!("spm-nemotron"),
        tokenizer!("spm-falcon"),
        tokenizer!("gpt2-llama"),
        tokenizer!("gpt2-llama3"),
        tokenizer!("gpt2-llama-bpe"),
        tokenizer!("gpt2-qwen2"),
        tokenizer!("gpt2-gemma2"),
        tokenizer!("gpt2-phi3"),
        tokenizer!("gpt2-falcon"),
        tokenizer!("gpt2-starcoder2-flags"),
        tokenizer!("gpt2-starcoder2-split"),
        tokenizer!("gpt2-stablelm"),
    ];
}

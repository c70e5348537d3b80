//! Any bytes as `config.json` (compressed-tensors, FP8 block, AutoAWQ, GPTQ/AutoRound, GPT-OSS,
//! bitsandbytes, compressed-tensors mxfp8, fbgemm_fp8, AMD Quark, MLX) or
//! `hf_quant_config.json` (ModelOpt NVFP4, FP8, MXFP8, INT4 AWQ), beside a real checkpoint.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wgpu_dequant_fuzz::{checkpoint_dir, exercise, fixtures};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let dir = match which % 17 {
        0 => checkpoint_dir(&[("model.safetensors", fixtures::W4A16_ASYM), ("config.json", rest)]),
        1 => checkpoint_dir(&[("model.safetensors", fixtures::W3A16), ("config.json", rest)]),
        2 => checkpoint_dir(&[("model.safetensors", fixtures::FP8_BLOCK), ("config.json", rest)]),
        3 => checkpoint_dir(&[("model.safetensors", fixtures::AWQ), ("config.json", rest)]),
        4 => checkpoint_dir(&[("model.safetensors", fixtures::GPT_OSS), ("config.json", rest)]),
        5 => checkpoint_dir(&[("model.safetensors", fixtures::GPTQ), ("config.json", rest)]),
        6 => checkpoint_dir(&[("model.safetensors", fixtures::BNB_NF4), ("config.json", rest)]),
        7 => checkpoint_dir(&[("model.safetensors", fixtures::BNB_INT8), ("config.json", rest)]),
        8 => checkpoint_dir(&[("model.safetensors", fixtures::CT_MXFP8), ("config.json", rest)]),
        9 => checkpoint_dir(&[("model.safetensors", fixtures::FP8_DYNAMIC), ("config.json", rest)]),
        10 => checkpoint_dir(&[("model.safetensors", fixtures::MODELOPT_FP8), ("hf_quant_config.json", rest)]),
        11 => checkpoint_dir(&[("model.safetensors", fixtures::CT_MXFP8), ("hf_quant_config.json", rest)]),
        12 => checkpoint_dir(&[("model.safetensors", fixtures::MODELOPT_INT4_AWQ), ("hf_quant_config.json", rest)]),
        13 => checkpoint_dir(&[("model.safetensors", fixtures::QUARK_MIXED), ("config.json", rest)]),
        14 => checkpoint_dir(&[("model.safetensors", fixtures::MLX_3BIT), ("config.json", rest)]),
        15 => checkpoint_dir(&[("model.safetensors", fixtures::MLX_MXFP4), ("config.json", rest)]),
        _ => checkpoint_dir(&[("model.safetensors", fixtures::MODELOPT), ("hf_quant_config.json", rest)]),
    };
    exercise(&dir);
});

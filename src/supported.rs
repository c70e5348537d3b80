//! What this build reads, for `wgpu-dequant formats` and for apps that
//! want to say so: the checkpoint formats with their bit widths and modes,
//! ggml's tensor types and which of them are decoded, and the GGUF
//! architectures given a Hugging Face layout. The GGUF lists come from the
//! tables the decoder itself runs on.

use serde::Serialize;

use crate::formats::{awq, gptq, mlx};
use crate::gguf::GgmlType;

/// Everything [`supported`] lists.
#[derive(Debug, Clone, Serialize)]
pub struct Supported {
    /// The checkpoint formats.
    pub formats: Vec<FormatSupport>,
    /// ggml's tensor types, in GGUF's numbering.
    pub gguf_types: Vec<GgufTypeSupport>,
    /// The GGUF architectures written under transformers' names (others
    /// need `--keep-names`).
    pub gguf_architectures: Vec<GgufArchitecture>,
}

/// One checkpoint format.
#[derive(Debug, Clone, Serialize)]
pub struct FormatSupport {
    /// Its name, as `inspect --json`'s `format.kind` gives it.
    pub name: &'static str,
    /// Who writes it.
    pub producers: &'static str,
    /// The code widths decoded, in bits.
    pub bits: Vec<u32>,
    /// Its schemes (value kinds and scale layouts).
    pub modes: Vec<String>,
}

/// One ggml tensor type.
#[derive(Debug, Clone, Serialize)]
pub struct GgufTypeSupport {
    /// gguf-py's name (`Q4_K`).
    pub name: &'static str,
    /// Its number in a GGUF file.
    pub id: u32,
    /// Elements per block.
    pub block: u32,
    /// Bytes per block.
    pub block_bytes: u32,
    /// Stored bits per weight.
    pub bits_per_weight: f64,
    /// `decoded`, `dense` (a plain number type, copied or cast) or
    /// `not decoded`.
    pub support: &'static str,
}

/// One GGUF architecture with a Hugging Face layout.
#[derive(Debug, Clone, Serialize)]
pub struct GgufArchitecture {
    /// `general.architecture`.
    pub gguf: &'static str,
    /// transformers' `model_type`.
    pub model_type: &'static str,
    /// transformers' model class.
    pub class: &'static str,
}

/// What this build reads.
pub fn supported() -> Supported {
    Supported {
        formats: formats(),
        gguf_types: gguf_types(),
        gguf_architectures: crate::hf::gguf::ARCHS
            .iter()
            .map(|a| GgufArchitecture {
                gguf: a.gguf,
                model_type: a.model_type,
                class: a.class,
            })
            .collect(),
    }
}

/// ggml numbers its types below this (gguf-py 0.19 uses up to 41).
const GGML_IDS: u32 = 64;

fn gguf_types() -> Vec<GgufTypeSupport> {
    (0..GGML_IDS)
        .filter_map(GgmlType::from_id)
        .map(|ty| {
            let (block, block_bytes) = ty.block();
            let support = if block <= 1 {
                "dense"
            } else if crate::formats::gguf::map_of(ty).is_some() {
                "decoded"
            } else {
                "not decoded"
            };
            GgufTypeSupport {
                name: ty.name(),
                id: ty as u32,
                block,
                block_bytes,
                bits_per_weight: f64::from(block_bytes) * 8.0 / f64::from(block),
                support,
            }
        })
        .collect()
}

fn formats() -> Vec<FormatSupport> {
    // MLX's modes by the names its config.json gives them.
    let mlx_modes: Vec<String> = [
        mlx::Mode::Affine,
        mlx::Mode::Mxfp4,
        mlx::Mode::Nvfp4,
        mlx::Mode::Mxfp8,
    ]
    .iter()
    .filter_map(|m| serde_json::to_value(m).ok()?.as_str().map(str::to_string))
    .collect();
    let row = |name, producers, bits: &[u32], modes: &[&str]| FormatSupport {
        name,
        producers,
        bits: bits.to_vec(),
        modes: modes.iter().map(|m| m.to_string()).collect(),
    };
    vec![
        row(
            "compressed-tensors",
            "llm-compressor, vLLM's releases",
            &[1, 2, 3, 4, 5, 6, 7, 8],
            &[
                "pack-quantized (int, sym/asym, actorder)",
                "nvfp4-pack-quantized",
                "mxfp4-pack-quantized",
                "int-quantized",
                "float-quantized (fp8)",
                "mxfp8-quantized",
                "sparse-24-bitmask",
                "sparse-bitmask",
                "transforms (QuIP, SpinQuant)",
            ],
        ),
        row(
            "modelopt",
            "NVIDIA ModelOpt",
            &[4, 8],
            &[
                "nvfp4",
                "nvfp4-awq",
                "int4-awq",
                "fp8",
                "fp8-per-channel",
                "fp8-block",
                "mxfp8",
            ],
        ),
        row("quark", "AMD Quark", &[4, 8], &["fp8", "mxfp4"]),
        row("fbgemm-fp8", "fbgemm", &[8], &["fp8 per row"]),
        row(
            "fp8-block",
            "DeepSeek-style FP8",
            &[8],
            &["fp8 block scales"],
        ),
        row("awq", "AutoAWQ", &[awq::BITS], &["gemm"]),
        row(
            "gptq",
            "GPTQModel, AutoGPTQ, AutoRound",
            &gptq::BITS,
            &["gptq (v1)", "gptq_v2", "auto-round (gptq-packed)"],
        ),
        row("gpt-oss", "OpenAI GPT-OSS", &[4], &["mxfp4"]),
        row(
            "bitsandbytes",
            "bitsandbytes (QLoRA, unsloth -bnb-4bit)",
            &[4, 8],
            &["nf4", "fp4", "llm.int8"],
        ),
        row("svdquant", "diffuse_compressor", &[4], &["int4", "fp4"]),
        FormatSupport {
            modes: mlx_modes,
            ..row("mlx", "mlx-lm", &[2, 3, 4, 5, 6, 8], &[])
        },
        row(
            "gguf",
            "llama.cpp, gguf-py",
            &[1, 2, 3, 4, 5, 6, 8],
            &["ggml block types (see gguf_types)"],
        ),
    ]
}

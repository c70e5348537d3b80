//! The integration tests, in one crate so that wgpu and the library link
//! once. Every GPU test gets its adapter through `common::gpu_test`. Without
//! an adapter those tests do not run: they pass, and when the run ends one
//! line on stderr (shown by `cargo test`) says how many did not run and how
//! to install a driver. `WGPU_DEQUANT_REQUIRE_GPU=1` (set by CI) makes each
//! of them fail instead.

mod common;

mod aqlm;
mod architecture;
mod autoround;
mod bitnet;
mod bnb;
mod cli;
mod config_variants;
mod convert;
mod deepseek_v4;
mod docs;
mod findings;
mod fixtures;
mod fp8_family;
mod fuzz_corpus;
mod gemma;
mod gguf;
mod gptq;
mod gpu;
mod hostile;
mod hqq;
mod hub;
mod hub_gguf;
mod interruption;
mod matmul;
mod mlx;
mod model;
mod moe;
mod rejections;
mod release;
mod resume;
mod scale;
mod sinq;
mod sparse;
mod stream;
mod svdquant;
mod synthetic;
mod transform;
mod upload;
mod vptq;
mod writers;

//! The integration tests, in one crate so that wgpu and the library link
//! once. Without a GPU adapter the GPU tests pass and say so, unless
//! `WGPU_DEQUANT_REQUIRE_GPU=1` (set by CI) makes a missing adapter a
//! failure.

mod common;

mod architecture;
mod cli;
mod config_variants;
mod convert;
mod fixtures;
mod gpu;
mod interruption;
mod model;
mod moe;
mod rejections;
mod scale;
mod stream;
mod svdquant;
mod synthetic;

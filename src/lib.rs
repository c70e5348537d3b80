//! Decode quantized checkpoints to dense bf16 / f16 / f32, byte-identical
//! to each producer's own dequantizer, on the CPU or on any GPU wgpu
//! reaches, with the same bytes: safetensors from compressed-tensors,
//! ModelOpt, Quark, fbgemm, DeepSeek-style FP8, AutoAWQ, GPTQ, bitsandbytes
//! (NF4/FP4, LLM.int8), GPT-OSS and SVDQuant, MLX checkpoints, and GGUF
//! files (as the Hugging Face model transformers makes of them).
//!
//! A whole checkpoint to a dense one on disk ([`Dequantize`] takes every
//! setting of the command line, a progress callback and a canceller):
//!
//! ```no_run
//! use wgpu_dequant::{dequantize, Options};
//! let summary = dequantize("model-w4a16", "model-dense", &Options::default())?;
//! println!("{} tensors decoded", summary.decoded);
//! # Ok::<(), wgpu_dequant::Error>(())
//! ```
//!
//! Or tensor by tensor, in an app: [`Model`] opens and plans a checkpoint,
//! lists its dense tensors and decodes any of them to bytes, to `f32`, or
//! into a [`wgpu::Buffer`] on the app's own device ([`GpuDecoder`]):
//!
//! ```no_run
//! use wgpu_dequant::{BackendChoice, DtypeChoice, Model};
//! let model = Model::open("model-w4a16", DtypeChoice::Auto)?;
//! let name = "model.layers.0.mlp.down_proj.weight";
//! let info = model.info(name)?;
//! let bytes: Vec<u8> = model.decode(name, BackendChoice::Cpu)?; // little-endian info.dtype
//! # Ok::<(), wgpu_dequant::Error>(())
//! ```
//!
//! [`inspect`], [`validate`] and [`convert`] are the other commands;
//! [`stream`] runs the same in a browser, over files read piece by piece.
//!
//! Inside, data flows one way: the checkpoint (memory-mapped shards and
//! sidecar configs) → formats → the plan (what each output tensor is made
//! of: a format-free decode job, a copy, an assembly) → a backend (CPU or
//! GPU) → the streaming writer.
#![deny(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

// The command line (`cli`) reaches the library by its public paths, as the
// other hosts do.
#[cfg(feature = "cli")]
extern crate self as wgpu_dequant;

/// Declares modules that only the integration tests, the fuzz targets and
/// the benchmarks reach into: public with the non-default `testing` feature
/// (hidden from the docs), private otherwise. Their items are `pub` for
/// that feature's sake, so the reachability lints do not apply without it.
macro_rules! internal {
    ($($(#[$attr:meta])* mod $name:ident;)*) => {$(
        $(#[$attr])*
        #[cfg(feature = "testing")]
        #[doc(hidden)]
        pub mod $name;
        $(#[$attr])*
        #[cfg(not(feature = "testing"))]
        #[allow(unreachable_pub, unnameable_types, dead_code, unused_imports)]
        mod $name;
    )*};
}

internal! {
    mod backend;
    mod checkpoint;
    mod convert;
    mod formats;
    mod gguf;
    mod hf;
    mod job;
    mod numerics;
    mod output;
    mod plan;
    mod report;
    mod writer;
}

// rustfmt does not look inside macros: these declarations, which are never
// compiled, show it the internal modules' files so that `cargo fmt` formats
// them too.
#[cfg(rustfmt)]
#[path = "."]
mod formatted {
    mod backend;
    mod checkpoint;
    mod convert;
    mod formats;
    mod gguf;
    mod hf;
    mod job;
    mod numerics;
    mod output;
    mod plan;
    mod report;
    mod writer;
}

/// The benchmarks `wgpu-dequant bench` runs (the `bench` feature).
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench;
/// The `wgpu-dequant` command line (the `cli` feature, on by default): the
/// binary and the Python package's console script both run [`cli::main`].
#[cfg(feature = "cli")]
pub mod cli;
mod error;
#[cfg(not(target_arch = "wasm32"))]
mod hub;
mod json;
mod model;
mod plural;
pub mod repo;
mod run;
pub mod stream;
mod supported;

pub use backend::gpu::{GpuDecoder, PackedLinear};
pub use backend::{BackendChoice, GpuApi};
pub use convert::ConvertTo;
pub use error::{Cause, Error, Result, Rule};
#[cfg(not(target_arch = "wasm32"))]
pub use model::Products;
pub use model::{Linears, Model, TensorInfo};
pub use numerics::{DtypeChoice, OutDtype};
pub use plan::Warning;
pub use report::{Finding, Report, Validation};
pub use run::{convert, dequantize, inspect, validate, Dequantize, Note, Options};
pub use supported::Supported;
/// The wgpu this crate is built with, for apps that hand it their device.
pub use wgpu;
pub use writer::{
    interrupt, merge_index, parse_size, Canceller, Download, Fetched, Interrupted, Merged,
    Progress, Summary,
};

#[cfg(feature = "testing")]
#[doc(hidden)]
pub use {
    backend::Backend, checkpoint::Checkpoint, formats::Format, hf::Names, job::DecodeJob,
    plan::Plan,
};

/// The README's Rust blocks, compiled and run as doctests so that they stay
/// true (`no_run` ones compiled only); docs/ pages with Rust blocks below.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// docs/apps.md's Rust blocks, as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/apps.md")]
struct AppsDoctests;

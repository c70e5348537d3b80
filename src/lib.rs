//! Decode quantized weight packs stored in safetensors checkpoints
//! (compressed-tensors, NVIDIA ModelOpt NVFP4, DeepSeek-style FP8, AutoAWQ,
//! GPT-OSS MXFP4, SVDQuant) to dense bf16 / f16 / f32, on the CPU or on any
//! GPU wgpu reaches, with the same bytes.
//!
//! A whole checkpoint to a dense one on disk:
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
//! into a [`wgpu::Buffer`] on the app's own device
//! ([`backend::gpu::GpuDecoder`]):
//!
//! ```no_run
//! use wgpu_dequant::{backend::Cpu, DtypeChoice, Model};
//! let model = Model::open("model-w4a16", DtypeChoice::Auto)?;
//! let name = "model.layers.0.mlp.down_proj.weight";
//! let info = model.tensor(name).expect("a tensor of the dense checkpoint");
//! let bytes: Vec<u8> = model.decode(name, &Cpu::new())?; // little-endian info.dtype
//! # Ok::<(), wgpu_dequant::Error>(())
//! ```
//!
//! Data flows one way: [`Checkpoint`] (memory-mapped shards and sidecar
//! configs) → formats → [`Plan`] (what each output tensor is made of:
//! a format-free [`DecodeJob`], a copy, an assembly) → a [`Backend`] → the
//! streaming [`writer`].
#![deny(missing_docs)]

pub mod backend;
mod checkpoint;
pub mod convert;
mod error;
mod formats;
pub mod job;
mod json;
mod model;
pub mod names;
mod numerics;
mod output;
pub mod plan;
pub mod report;
pub mod stream;
pub mod writer;

use std::path::Path;

pub use backend::{Backend, BackendChoice};
pub use checkpoint::Checkpoint;
pub use error::{Error, Result, Rule};
pub use formats::Format;
pub use job::DecodeJob;
pub use model::{Model, TensorInfo};
pub use numerics::OutDtype;
pub use plan::{DtypeChoice, Plan};
/// The wgpu this crate is built with, for apps that hand it their device.
pub use wgpu;
pub use writer::Summary;

/// What `dequantize` should do.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Output dtype of decoded tensors.
    pub dtype: DtypeChoice,
    /// Which backend decodes.
    pub backend: BackendChoice,
}

/// Dequantizes the checkpoint at `input` into a dense checkpoint in `output`
/// (a new or empty directory). Nothing is left in `output` when it fails.
pub fn dequantize(
    input: impl AsRef<Path>,
    output: impl AsRef<Path>,
    options: &Options,
) -> Result<Summary> {
    let ckpt = Checkpoint::open(input)?;
    let plan = Plan::build(&ckpt, options.dtype)?;
    let (backend, _) = backend::select(options.backend)?;
    writer::write(&plan, backend.as_ref(), output.as_ref(), |_| {})
}

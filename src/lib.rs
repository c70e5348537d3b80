//! Decode quantized weight packs stored in safetensors checkpoints to dense
//! bf16 / f16 / f32.
//!
//! Data flows one way: [`Checkpoint`] (memory-mapped shards and sidecar
//! configs) → [`Plan`] (one format-free [`DecodeJob`] per quantized module,
//! plus the tensors to copy) → a [`backend::Backend`] → the streaming
//! [`writer`].
//!
//! ```no_run
//! use wgpu_dequant::{dequantize, Options};
//! let summary = dequantize("model-w4a16".as_ref(), "model-dense".as_ref(), &Options::default())?;
//! println!("{} tensors decoded", summary.decoded);
//! # Ok::<(), wgpu_dequant::Error>(())
//! ```
#![deny(missing_docs)]

pub mod backend;
pub mod bench;
pub mod checkpoint;
pub mod convert;
pub mod error;
pub mod formats;
pub mod job;
mod json;
pub mod numerics;
pub mod output;
pub mod plan;
pub mod report;
pub mod writer;

use std::path::Path;

pub use backend::{Backend, BackendChoice};
pub use checkpoint::Checkpoint;
pub use error::{Error, Result, Rule};
pub use job::DecodeJob;
pub use numerics::OutDtype;
pub use plan::{DtypeChoice, Plan};
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
pub fn dequantize(input: &Path, output: &Path, options: &Options) -> Result<Summary> {
    let ckpt = Checkpoint::open(input)?;
    let plan = Plan::build(&ckpt, options.dtype)?;
    let (backend, _) = backend::select(options.backend)?;
    writer::write(&plan, backend.as_ref(), output, |_| {})
}

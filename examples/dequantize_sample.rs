//! Opens the sample checkpoint in `assets/`, decodes every tensor on the CPU
//! and prints one line per tensor: name, shape, dtype and a SHA-256 prefix.
//!
//! ```sh
//! cargo run --release --example dequantize_sample [PATH]
//! ```

use sha2::{Digest, Sha256};
use wgpu_dequant::{backend, BackendChoice, Checkpoint, DtypeChoice, Plan};

fn main() -> Result<(), wgpu_dequant::Error> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/assets/sample-w4a16").to_string());
    let ckpt = Checkpoint::open(&path)?;
    let plan = Plan::build(&ckpt, DtypeChoice::Auto)?;
    plan.check()?;
    let (backend, _) = backend::select(BackendChoice::Cpu)?;
    println!("{path}: {}", plan.format.describe());
    for out in &plan.outputs {
        let bytes = out.bytes(backend.as_ref())?;
        let digest: String = Sha256::digest(&bytes)[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        println!(
            "{:<48} {:<12} {:<5} {digest}",
            out.name,
            format!("{:?}", out.shape),
            format!("{:?}", out.dtype)
        );
    }
    Ok(())
}

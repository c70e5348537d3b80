//! Opens the sample checkpoint in `assets/`, decodes every tensor on the CPU
//! and prints one line per tensor: name, shape, dtype and a SHA-256 prefix.
//!
//! ```sh
//! cargo run --release --example dequantize_sample [PATH]
//! ```

use sha2::{Digest, Sha256};
use wgpu_dequant::backend::Cpu;
use wgpu_dequant::{DtypeChoice, Model};

fn main() -> Result<(), wgpu_dequant::Error> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/assets/sample-w4a16").to_string());
    let model = Model::open(&path, DtypeChoice::Auto)?;
    println!("{path}: {}", model.plan().format.describe());
    let cpu = Cpu::new();
    for t in model.tensors() {
        let bytes = model.decode(&t.name, &cpu)?;
        let digest: String = Sha256::digest(&bytes)[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        println!(
            "{:<48} {:<12} {:<5} {digest}",
            t.name,
            format!("{:?}", t.shape),
            format!("{:?}", t.dtype)
        );
    }
    Ok(())
}

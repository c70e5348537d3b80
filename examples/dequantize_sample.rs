//! Opens the sample checkpoint in `assets/`, decodes every tensor on the CPU
//! and prints one line per tensor: name, shape, dtype and a SHA-256 prefix.
//!
//! ```sh
//! cargo run --release --example dequantize_sample [PATH]
//! ```

use sha2::{Digest, Sha256};
use wgpu_dequant::{BackendChoice, DtypeChoice, Model};

fn main() -> Result<(), wgpu_dequant::Error> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/assets/sample-w4a16").to_string());
    let model = Model::open(&path, DtypeChoice::Auto)?;
    println!("{path}: {}", model.format());
    for t in model.tensors() {
        let bytes = model.decode(&t.name, BackendChoice::Cpu)?;
        let digest: String = Sha256::digest(&bytes)[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        println!(
            "{:<48} {:<12} {:<5} {digest}",
            t.name,
            format!("{:?}", t.shape),
            t.dtype.to_string()
        );
    }
    Ok(())
}

//! For apps that run a model on the user's GPU with its weights kept packed:
//! multiply a vector by every quantized Linear of the sample checkpoint
//! straight from its packs (the dense weight is never made), and print the
//! largest difference to the CPU reference, which must stay within the
//! bound the crate guarantees (docs/apps.md, "Products with packed weights").
//!
//! ```sh
//! cargo run --release --example matvec [PATH]
//! ```

use std::error::Error;

use wgpu_dequant::{wgpu, BackendChoice, DtypeChoice, GpuDecoder, Model};

fn main() -> Result<(), Box<dyn Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/assets/sample-w4a16").to_string());

    // The app's own device: any adapter, default limits.
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter =
        pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))?;
    let (device, queue) =
        pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor::default()))?;
    println!("adapter: {}", adapter.get_info().name);

    let decoder = GpuDecoder::new(&device, &queue);
    let model = Model::open(&path, DtypeChoice::Auto)?;
    let mut outside = 0;
    for t in model.quantized() {
        let [n, k] = t.shape[..] else { continue };
        let x: Vec<f32> = (0..k)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();

        // The Linear's packs on the GPU, and y = x·Wᵀ (+ bias) from them.
        let packed = model.upload_packed(&t.name, &decoder)?;
        let gpu = decoder.matmul(&packed, &x, 1)?;
        let cpu = model.matmul_cpu(&t.name, &x, 1)?;

        // Each result within K·2⁻²⁴·Σ|w·x| of the exact product, so the two
        // within twice that of each other.
        let w = model.decode_f32(&t.name, BackendChoice::Cpu)?;
        let mut worst = 0f64;
        for (j, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
            let row = &w[j * k..(j + 1) * k];
            let abs: f64 = row
                .iter()
                .zip(&x)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let bound = 2.0 * k as f64 * abs * 2f64.powi(-24) + (*c as f64).abs() * 2f64.powi(-23);
            let diff = (*g as f64 - *c as f64).abs();
            worst = worst.max(diff);
            outside += usize::from(diff > bound);
        }
        println!(
            "{:<44} {n:>5} x {k:<5} {:>8} bytes on the GPU ({:.2} bits a weight)  max |gpu - cpu| = {worst:.3e}",
            t.name,
            packed.gpu_bytes(),
            packed.gpu_bytes() as f64 * 8.0 / (n * k) as f64,
        );
    }
    if outside > 0 {
        return Err(format!("{outside} results outside the bound").into());
    }
    Ok(())
}

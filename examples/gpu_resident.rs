//! For apps that already drive a GPU with wgpu: decode each tensor of the
//! sample checkpoint into a `wgpu::Buffer` that stays on the device,
//! then (for this demo only) read it back and check it against the CPU path.
//!
//! ```sh
//! cargo run --release --example gpu_resident [PATH]
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
    let mut mismatches = 0;
    for t in model.tensors() {
        // The dense tensor, resident on the GPU: bind it in your own pipelines.
        let buffer = model.decode_to_buffer(&t.name, &decoder)?;

        let got = decoder.read_back(&buffer)?;
        let want = model.decode(&t.name, BackendChoice::Cpu)?;
        let same = got.get(..want.len()) == Some(&want[..]);
        mismatches += usize::from(!same);
        println!(
            "{:<44} {:>9} bytes on the GPU  {}",
            t.name,
            t.bytes,
            if same { "== cpu" } else { "DIFFERS from cpu" }
        );
    }
    if mismatches > 0 {
        return Err(format!("{mismatches} tensors differ between GPU and CPU").into());
    }
    Ok(())
}

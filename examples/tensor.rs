//! Decodes one tensor of a checkpoint and prints `NAME DTYPE SHAPE SHA256`
//! of its dense bytes, in the checkpoint's own dtype. Other tools call it:
//! the line's format stays.
//!
//! ```sh
//! cargo run --release --example tensor -- CKPT NAME [--gpu-buffer]
//! ```
//!
//! With `--gpu-buffer` the tensor is decoded into a `wgpu::Buffer` on a
//! device this example creates itself, as an app with its own device would,
//! then read back.

use std::error::Error;

use sha2::{Digest, Sha256};
use wgpu_dequant::{wgpu, BackendChoice, DtypeChoice, GpuDecoder, Model};

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let gpu = args.iter().any(|a| a == "--gpu-buffer");
    let [ckpt, name] = args
        .iter()
        .filter(|a| *a != "--gpu-buffer")
        .collect::<Vec<_>>()[..]
    else {
        return Err("usage: tensor CKPT NAME [--gpu-buffer]".into());
    };
    let model = Model::open(ckpt, DtypeChoice::Auto)?;
    let info = model.info(name)?;
    let bytes = if gpu {
        let (device, queue) = own_device()?;
        let decoder = GpuDecoder::new(&device, &queue);
        let buffer = model.decode_to_buffer(name, &decoder)?;
        let mut bytes = decoder.read_back(&buffer)?;
        bytes.truncate(info.bytes); // the buffer is padded to whole words
        bytes
    } else {
        model.decode(name, BackendChoice::Cpu)?
    };
    let shape: Vec<String> = info.shape.iter().map(usize::to_string).collect();
    let digest: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!("{name} {} [{}] {digest}", info.dtype, shape.join(","));
    Ok(())
}

/// A device of the app's own: any adapter wgpu finds, with its limits.
fn own_device() -> Result<(wgpu::Device, wgpu::Queue), Box<dyn Error>> {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter =
        pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))?;
    let desc = wgpu::DeviceDescriptor {
        required_limits: adapter.limits(),
        ..Default::default()
    };
    Ok(pollster::block_on(adapter.request_device(&desc))?)
}

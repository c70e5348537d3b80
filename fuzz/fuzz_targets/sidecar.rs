//! Any bytes as an SVDQuant `model.config.yaml` beside a real export.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wgpu_dequant_fuzz::{checkpoint_dir, exercise, fixtures};

fuzz_target!(|data: &[u8]| {
    let dir = checkpoint_dir(&[("model.safetensors", fixtures::SVDQ), ("model.config.yaml", data)]);
    exercise(&dir);
});

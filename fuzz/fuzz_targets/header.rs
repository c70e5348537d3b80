//! Any bytes as `model.safetensors` (with a valid config beside it).
#![no_main]
use libfuzzer_sys::fuzz_target;
use wgpu_dequant_fuzz::{checkpoint_dir, exercise, fixtures};

fuzz_target!(|data: &[u8]| {
    let dir = checkpoint_dir(&[
        ("model.safetensors", data),
        ("config.json", fixtures::W4A16_ASYM_CONFIG),
    ]);
    exercise(&dir);
});

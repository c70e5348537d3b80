//! Any bytes as `model.safetensors.index.json` beside two real shards.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wgpu_dequant_fuzz::{checkpoint_dir, exercise, fixtures};

fuzz_target!(|data: &[u8]| {
    let dir = checkpoint_dir(&[
        ("model-00001-of-00002.safetensors", fixtures::SHARD1),
        ("model-00002-of-00002.safetensors", fixtures::SHARD2),
        ("config.json", fixtures::SHARDED_CONFIG),
        ("model.safetensors.index.json", data),
    ]);
    exercise(&dir);
});

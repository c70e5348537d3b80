//! A whole small checkpoint, mutated: the input picks a real checkpoint and
//! overwrites bytes of its files (header, data, configs) at chosen offsets,
//! so the checkpoint stays close to valid and deep paths are reached.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wgpu_dequant_fuzz::{checkpoint_dir, exercise, fixtures};

fuzz_target!(|data: &[u8]| {
    let Some((&which, edits)) = data.split_first() else {
        return;
    };
    let mut files: Vec<(&str, Vec<u8>)> = match which % 6 {
        0 => vec![
            ("model.safetensors", fixtures::W4A16_ASYM.to_vec()),
            ("config.json", fixtures::W4A16_ASYM_CONFIG.to_vec()),
        ],
        1 => vec![
            ("model-00001-of-00002.safetensors", fixtures::SHARD1.to_vec()),
            ("model-00002-of-00002.safetensors", fixtures::SHARD2.to_vec()),
            ("config.json", fixtures::SHARDED_CONFIG.to_vec()),
            ("model.safetensors.index.json", fixtures::SHARDED_INDEX.to_vec()),
        ],
        2 => vec![
            ("model.safetensors", fixtures::MODELOPT.to_vec()),
            ("hf_quant_config.json", fixtures::MODELOPT_HF.to_vec()),
        ],
        3 => vec![
            ("model.safetensors", fixtures::SVDQ.to_vec()),
            ("model.config.yaml", fixtures::SVDQ_SIDECAR.to_vec()),
        ],
        4 => vec![
            ("model.safetensors", fixtures::SPARSE_BITMASK.to_vec()),
            ("config.json", fixtures::SPARSE_BITMASK_CONFIG.to_vec()),
        ],
        _ => vec![
            ("model.safetensors", fixtures::QUIP.to_vec()),
            ("config.json", fixtures::QUIP_CONFIG.to_vec()),
        ],
    };
    // Edits of 6 bytes: file, offset (u32, biased towards headers), value.
    for e in edits.chunks_exact(6) {
        let file = e[0] as usize % files.len();
        let bytes = &mut files[file].1;
        if bytes.is_empty() {
            continue;
        }
        let raw = u32::from_le_bytes([e[1], e[2], e[3], e[4]]) as usize;
        let at = if raw & 1 == 0 { (raw >> 1) % 4096.min(bytes.len()) } else { (raw >> 1) % bytes.len() };
        bytes[at] = e[5];
    }
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    let dir = checkpoint_dir(&refs);
    exercise(&dir);
});

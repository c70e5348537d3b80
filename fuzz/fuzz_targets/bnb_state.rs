//! Any bytes as a bitsandbytes quant state (`<m>.weight.quant_state.bitsandbytes__nf4`,
//! UTF-8 JSON) of a small 4-bit module, plain or nested, given whole or as
//! byte edits of a valid state (so deep paths are reached): the state's
//! keys, block sizes, shape and nesting are checked against the tensors.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wgpu_dequant_fuzz::{bnb_checkpoint, exercise};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let nested = mode & 1 == 1;
    let state: Vec<u8> = if mode & 2 == 0 {
        rest.to_vec()
    } else {
        // Edits of 3 bytes: offset (u16), value.
        let mut s = if nested {
            br#"{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4, 32], "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.125}"#.to_vec()
        } else {
            br#"{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4, 32]}"#.to_vec()
        };
        for e in rest.chunks_exact(3) {
            let at = u16::from_le_bytes([e[0], e[1]]) as usize % s.len();
            s[at] = e[2];
        }
        s
    };
    exercise(&bnb_checkpoint(&state, nested));
});

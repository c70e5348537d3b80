//! The `bnb_state` target: [`wgpu_dequant_fuzz::targets::bnb_state`].
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| wgpu_dequant_fuzz::targets::bnb_state(data));

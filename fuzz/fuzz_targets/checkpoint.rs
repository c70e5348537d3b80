//! The `checkpoint` target: [`wgpu_dequant_fuzz::targets::checkpoint`].
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| wgpu_dequant_fuzz::targets::checkpoint(data));

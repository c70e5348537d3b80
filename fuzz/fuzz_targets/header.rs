//! The `header` target: [`wgpu_dequant_fuzz::targets::header`].
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| wgpu_dequant_fuzz::targets::header(data));

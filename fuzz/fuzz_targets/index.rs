//! The `index` target: [`wgpu_dequant_fuzz::targets::index`].
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| wgpu_dequant_fuzz::targets::index(data));

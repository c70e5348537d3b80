//! The `config` target: [`wgpu_dequant_fuzz::targets::config`].
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| wgpu_dequant_fuzz::targets::config(data));

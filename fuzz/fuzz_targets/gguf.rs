//! The `gguf` target: [`wgpu_dequant_fuzz::targets::gguf`].
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| wgpu_dequant_fuzz::targets::gguf(data));

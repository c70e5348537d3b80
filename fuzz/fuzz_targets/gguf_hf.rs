//! The `gguf_hf` target: [`wgpu_dequant_fuzz::targets::gguf_hf`].
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| wgpu_dequant_fuzz::targets::gguf_hf(data));

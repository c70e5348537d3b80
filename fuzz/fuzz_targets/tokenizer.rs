//! The `tokenizer` target: [`wgpu_dequant_fuzz::targets::tokenizer`].
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| wgpu_dequant_fuzz::targets::tokenizer(data));

//! The `sidecar` target: [`wgpu_dequant_fuzz::targets::sidecar`].
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| wgpu_dequant_fuzz::targets::sidecar(data));

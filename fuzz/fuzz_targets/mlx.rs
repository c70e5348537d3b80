//! The `mlx` target: [`wgpu_dequant_fuzz::targets::mlx`].
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| wgpu_dequant_fuzz::targets::mlx(data));

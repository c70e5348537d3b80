//! Any bytes as a `.gguf` file: read (every tensor's bytes touched) or
//! refused in one line.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wgpu_dequant::gguf::Model;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile_dir();
    let path = dir.join("model.gguf");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    match Model::open(&path) {
        Ok(model) => {
            let touched: usize = model.tensors.iter().map(|t| model.bytes(t).len()).sum();
            assert!(touched as u64 <= data.len() as u64);
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
    }
});

/// A folder of this process's own.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("wgpu-dequant-fuzz-gguf-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

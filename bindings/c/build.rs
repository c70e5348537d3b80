//! Writes include/wgpu_dequant.h from the `extern "C"` items of src/.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let config = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml"))
        .unwrap_or_else(|e| panic!("cbindgen.toml: {e}"));
    match cbindgen::generate_with_config(&dir, config) {
        Ok(header) => {
            header.write_to_file(format!("{dir}/include/wgpu_dequant.h"));
        }
        Err(e) => panic!("cbindgen: {e}"),
    }
}

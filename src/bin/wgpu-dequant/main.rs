//! The `wgpu-dequant` binary: the command line is the library's `cli`
//! module, which the Python package's console script runs as well.

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(wgpu_dequant::cli::main(std::env::args_os()))
}

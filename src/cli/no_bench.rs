//! `wgpu-dequant bench` in a build without the `bench` feature: the
//! benchmarks are a developer's tool, outside the library's API; the
//! command says how to get them.

use wgpu_dequant::{Error, Rule};

/// Whatever was passed to `bench`.
#[derive(clap::Args)]
pub(super) struct Args {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    _args: Vec<String>,
}

/// Says that this build has no benchmarks.
pub(super) fn run(_: Args) -> Result<u8, Error> {
    Err(Error::bare(
        Rule::Argument,
        "bench: this build has no benchmarks; build with `--features bench` (cargo install --path . --features bench)",
    ))
}

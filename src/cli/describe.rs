//! The tool describing itself: `--version` with its build, shell
//! completions and the man page (both from the clap definition), and
//! `formats`, the library's lists of what it reads.

use std::io::Write;
use std::sync::OnceLock;

use clap::CommandFactory;
use wgpu_dequant::{Error, Rule};

use super::{print_json, Cli};

/// `--version`'s text: the version, the commit it was built from, the wgpu
/// it runs on with the graphics APIs compiled in, and the crate features.
pub(super) fn long_version() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let apis: Vec<String> = wgpu_dequant::wgpu::Instance::enabled_backend_features()
            .iter_names()
            .map(|(name, _)| name.to_ascii_lowercase())
            .collect();
        let features: Vec<&str> = [
            ("cli", cfg!(feature = "cli")),
            ("bench", cfg!(feature = "bench")),
            ("testing", cfg!(feature = "testing")),
        ]
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect();
        format!(
            "{}\ncommit {}\nwgpu {} ({})\nfeatures: {}",
            env!("CARGO_PKG_VERSION"),
            env!("WGPU_DEQUANT_COMMIT"),
            env!("WGPU_DEQUANT_WGPU_VERSION"),
            apis.join(", "),
            features.join(", "),
        )
    })
}

/// `completions SHELL`: the script that completes this command in `shell`.
pub(super) fn completions(shell: clap_complete::Shell) -> Result<u8, Error> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "wgpu-dequant", &mut out);
    write_out(&out)
}

/// `man`: the man page, in roff.
pub(super) fn man() -> Result<u8, Error> {
    let mut out = Vec::new();
    clap_mangen::Man::new(Cli::command())
        .render(&mut out)
        .map_err(|e| Error::bare(Rule::Io, "cannot render the man page").caused_by(e))?;
    write_out(&out)
}

fn write_out(bytes: &[u8]) -> Result<u8, Error> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| Error::bare(Rule::Io, "cannot write to stdout").caused_by(e))?;
    Ok(0)
}

/// `formats`: the checkpoint formats with their bit widths and modes, the
/// GGUF tensor types and the GGUF architectures.
pub(super) fn formats(json: bool) -> Result<u8, Error> {
    let all = wgpu_dequant::Supported::new();
    if json {
        print_json(&all)?;
    } else {
        print!("{}", all.text());
    }
    Ok(0)
}

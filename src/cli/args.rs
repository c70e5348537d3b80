//! The values people type, read as the library reads them: the dtype and
//! backend spellings (any case, torch's and the usual others), sizes, jobs
//! of a split run, and the backend an environment variable names.

use std::ffi::OsStr;
use std::marker::PhantomData;
use std::str::FromStr;

use clap::builder::{PossibleValue, TypedValueParser};
use clap::error::ErrorKind;
use wgpu_dequant::{BackendChoice, DtypeChoice, Error, Rule};

/// The variable that gives `--backend` when the flag is absent.
pub(super) const BACKEND_VAR: &str = "WGPU_DEQUANT_BACKEND";

/// A value the library's own `FromStr` reads; help and completions list
/// `names`, the canonical spellings. A refusal is the library's one line,
/// with no "similar value" guess (`BF16` is not a typo of `f16`).
#[derive(Clone)]
pub(super) struct Spelled<T> {
    names: &'static [&'static str],
    value: PhantomData<fn() -> T>,
}

impl<T> TypedValueParser for Spelled<T>
where
    T: FromStr<Err = Error> + Clone + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        value.to_string_lossy().parse().map_err(|e: Error| {
            // The library's refusal starts with the value; the flag goes first.
            let flag = arg.and_then(clap::Arg::get_long).unwrap_or("value");
            let message = format!("--{flag} {}\n", e.detail);
            clap::Error::raw(ErrorKind::InvalidValue, message).with_cmd(cmd)
        })
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(self.names.iter().map(|n| PossibleValue::new(*n))))
    }
}

/// `--dtype`.
pub(super) fn dtypes() -> Spelled<DtypeChoice> {
    Spelled {
        names: &["auto", "bf16", "f16", "f32"],
        value: PhantomData,
    }
}

/// `--backend`.
pub(super) fn backends() -> Spelled<BackendChoice> {
    Spelled {
        names: &["auto", "gpu", "cpu", "vulkan", "metal", "dx12", "gl"],
        value: PhantomData,
    }
}

/// The backend `--backend` gave, else [`BACKEND_VAR`]'s, else auto; a bad
/// value of the variable is told as the variable's, not the flag's.
pub(super) fn backend_or_env(flag: Option<BackendChoice>) -> Result<BackendChoice, Error> {
    if let Some(choice) = flag {
        return Ok(choice);
    }
    let Some(value) = std::env::var_os(BACKEND_VAR) else {
        return Ok(BackendChoice::Auto);
    };
    value.to_string_lossy().parse().map_err(|e: Error| {
        let detail = format!("{BACKEND_VAR}={}; change or unset the variable", e.detail);
        Error::bare(Rule::Argument, detail)
    })
}

/// `--max-shard-size`: the library's sizes (`5GB`, `5GiB`, `5G`, `5 GB`).
pub(super) fn parse_size(s: &str) -> Result<u64, String> {
    wgpu_dequant::parse_size(s).map_err(|e| e.detail)
}

/// `--part I/N`: job I (from 0) of N.
pub(super) fn parse_part(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{s:?}: expected I/N with 0 <= I < N (job I of N, from 0)");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let (i, n): (usize, usize) = (
        i.trim().parse().map_err(|_| bad())?,
        n.trim().parse().map_err(|_| bad())?,
    );
    if i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

/// clap's refusal of a second positional after `dequantize IN` or
/// `convert IN`: the output is named with `-o`, so the tip says that
/// instead of clap's `-- OUT`.
pub(super) fn point_to_output_flag(mut e: clap::Error, args: &[std::ffi::OsString]) -> clap::Error {
    use clap::error::{ContextKind, ContextValue};
    if e.kind() != ErrorKind::UnknownArgument {
        return e;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return e;
    };
    let writes = args.iter().any(|a| a == "dequantize" || a == "convert");
    if arg.starts_with('-') || !writes {
        return e;
    }
    let tip = format!("the output directory is named with -o: use -o {arg}");
    e.insert(
        ContextKind::Suggested,
        ContextValue::StyledStrs(vec![tip.into()]),
    );
    e
}

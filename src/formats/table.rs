//! What the format table expands to: [`Format`](super::Format), its
//! dispatch to each format's module, and the `quant_method` values the
//! refusal of an unknown one lists. A new format is its module plus one
//! line in the table.

use std::path::Path;

use serde_json::Value;

use super::from_value;
use crate::checkpoint::Checkpoint;
use crate::error::Result;

/// What a format's module says it reads (`wgpu-dequant formats`).
#[derive(Debug, serde::Serialize)]
pub struct Support {
    /// Its name, as `inspect --json`'s `format.kind` gives it.
    pub name: &'static str,
    /// Who writes it.
    pub producers: &'static str,
    /// The code widths decoded, in bits.
    pub bits: &'static [u32],
    /// Its schemes (value kinds and scale layouts).
    pub modes: &'static [&'static str],
}

/// A `quantization_config` that names its format by `quant_method`: what
/// a format's `Config::parse` reads.
#[derive(Clone, Copy)]
pub struct QuantConfig<'a> {
    /// The config.json it is in.
    pub path: &'a Path,
    /// The object itself.
    pub value: &'a Value,
    /// Its `quant_method`, lowercased (one format may answer to several).
    pub method: &'a str,
    /// The checkpoint, for a format with a sidecar of its own (ModelOpt).
    pub ckpt: &'a Checkpoint,
}

impl QuantConfig<'_> {
    /// The object read into its serde type (a mismatch names the key's path).
    pub fn read<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        from_value(self.path, self.value)
    }
}

/// Declares the format modules, [`Format`](super::Format) and every match
/// on it from one table: a line a format, `Variant(module)`, then, for a
/// format config.json's `quantization_config` names, `by` and its
/// `quant_method` values (after `|`, a spelling the refusal does not list).
///
/// Each format module holds `SUPPORT`, its [`Support`], a `Config` with `format_line(&self) -> String`
/// (inspect's format line) and `report_lines(&self) -> Vec<String>`, and
/// `plan(&Config, &Checkpoint, OutDtype) -> Modules`; one named by
/// `quant_method` also `Config::parse(&QuantConfig) -> Result<Config>`.
macro_rules! formats {
    ($(
        $(#[$attr:meta])*
        $variant:ident($module:ident) $(by $($method:literal $(| $alias:literal)*),+)?
    ),+ $(,)?) => {
        $(pub mod $module;)+

        /// What kind of checkpoint this is.
        #[derive(Debug, Clone, serde::Serialize)]
        #[serde(tag = "kind", rename_all = "kebab-case")]
        pub enum Format {
            $($(#[$attr])* $variant($module::Config),)+
            /// No quantization: every tensor is copied.
            Dense,
        }

        /// What each format reads, in the table's order.
        pub const SUPPORT: &[&Support] = &[$(&$module::SUPPORT,)+];

        /// The `quant_method` values the refusal of an unknown one lists.
        const QUANT_METHODS: &[&str] = &[$($($($method,)+)?)+];

        impl Format {
            /// Its name, as [`Support::name`] gives it (`dense` for none).
            pub fn kind(&self) -> &'static str {
                match self {
                    $(Format::$variant(_) => $module::SUPPORT.name,)+
                    Format::Dense => "dense",
                }
            }

            /// One line for people.
            pub fn describe(&self) -> String {
                match self {
                    $(Format::$variant(c) => c.format_line(),)+
                    Format::Dense => "dense (no quantization config)".into(),
                }
            }

            /// The lines `inspect` shows under the format line, without
            /// indentation: what the config says, a line per setting,
            /// group, target or patch.
            pub fn report_lines(&self) -> Vec<String> {
                match self {
                    $(Format::$variant(c) => c.report_lines(),)+
                    Format::Dense => Vec::new(),
                }
            }

            /// The format's own plan of its quantized modules; `None` for a
            /// dense checkpoint, which has none.
            fn plan<'c>(&self, ckpt: &'c Checkpoint, dtype: OutDtype) -> Option<Modules<'c>> {
                match self {
                    $(Format::$variant(c) => Some($module::plan(c, ckpt, dtype)),)+
                    Format::Dense => None,
                }
            }

            /// The format whose `quant_method` `q` has, parsed; `None` when
            /// no format has it.
            fn by_quant_method(q: &QuantConfig<'_>) -> Option<Result<Format>> {
                match q.method {
                    $($(
                        $($method $(| $alias)*)|+ => Some($module::Config::parse(q).map(Format::$variant)),
                    )?)+
                    _ => None,
                }
            }
        }
    };
}

//! What this build reads, for `wgpu-dequant formats` and for apps that
//! want to say so: the checkpoint formats with their bit widths and modes,
//! ggml's tensor types and which of them are decoded, and the GGUF
//! architectures given a Hugging Face layout. The GGUF lists come from the
//! tables the decoder itself runs on.

use std::fmt::Write;

use serde::Serialize;

use crate::formats::{self, Support};
use crate::gguf::GgmlType;

/// What this build reads: `wgpu-dequant formats` prints it as
/// [`Supported::text`], `--json` as its serde form.
#[derive(Debug, Serialize)]
pub struct Supported {
    /// The checkpoint formats, as each format's module states it.
    formats: &'static [&'static Support],
    /// ggml's tensor types, in GGUF's numbering.
    gguf_types: Vec<GgufType>,
    /// The GGUF architectures written under transformers' names (others
    /// need `--keep-names`).
    gguf_architectures: Vec<GgufArchitecture>,
}

/// One ggml tensor type.
#[derive(Debug, Serialize)]
struct GgufType {
    /// gguf-py's name (`Q4_K`).
    name: &'static str,
    /// Its number in a GGUF file.
    id: u32,
    /// Elements per block.
    block: u32,
    /// Bytes per block.
    block_bytes: u32,
    /// Stored bits per weight.
    bits_per_weight: f64,
    /// `decoded`, `dense` (a plain number type, copied or cast) or
    /// `not decoded`.
    support: &'static str,
}

/// One GGUF architecture with a Hugging Face layout.
#[derive(Debug, Serialize)]
struct GgufArchitecture {
    /// `general.architecture`.
    gguf: &'static str,
    /// transformers' `model_type`.
    model_type: &'static str,
    /// transformers' model class.
    class: &'static str,
}

/// ggml numbers its types below this (llama.cpp uses up to 42).
const GGML_IDS: u32 = 64;

impl Supported {
    /// What this build reads, from the tables the decoder itself runs on.
    pub fn new() -> Supported {
        let gguf_types = (0..GGML_IDS)
            .filter_map(GgmlType::from_id)
            .map(|ty| {
                let (block, block_bytes) = ty.block();
                let support = if block <= 1 {
                    "dense"
                } else if formats::gguf::map_of(ty).is_some() {
                    "decoded"
                } else {
                    "not decoded"
                };
                GgufType {
                    name: ty.name(),
                    id: ty as u32,
                    block,
                    block_bytes,
                    bits_per_weight: f64::from(block_bytes) * 8.0 / f64::from(block),
                    support,
                }
            })
            .collect();
        let gguf_architectures = crate::hf::gguf::ARCHS
            .iter()
            .map(|a| GgufArchitecture {
                gguf: a.gguf,
                model_type: a.model_type,
                class: a.class,
            })
            .collect();
        Supported {
            formats: formats::SUPPORT,
            gguf_types,
            gguf_architectures,
        }
    }

    /// The lists as aligned text.
    pub fn text(&self) -> String {
        let mut s = String::from("formats (code bits; modes; producers):\n");
        for f in self.formats {
            let bits: Vec<String> = f.bits.iter().map(u32::to_string).collect();
            let _ = writeln!(
                s,
                "  {:<19} {} bits; {}",
                f.name,
                bits.join(", "),
                f.producers
            );
            let _ = writeln!(s, "  {:<19} {}", "", f.modes.join(", "));
        }
        s += "gguf types (bits per weight):\n";
        for t in &self.gguf_types {
            let _ = writeln!(
                s,
                "  {:<8} {:>6.3}  {}",
                t.name, t.bits_per_weight, t.support
            );
        }
        s += "gguf architectures (transformers class):\n";
        for a in &self.gguf_architectures {
            let _ = writeln!(s, "  {:<12} {}", a.gguf, a.class);
        }
        s
    }
}

impl Default for Supported {
    fn default() -> Self {
        Supported::new()
    }
}

#[cfg(test)]
mod tests {
    use crate::formats::{mlx, SUPPORT};

    #[test]
    fn mlx_modes_are_the_names_its_config_gives_them() {
        let named: Vec<String> = [
            mlx::Mode::Affine,
            mlx::Mode::Mxfp4,
            mlx::Mode::Nvfp4,
            mlx::Mode::Mxfp8,
        ]
        .iter()
        .filter_map(|m| Some(serde_json::to_value(m).ok()?.as_str()?.to_string()))
        .collect();
        let listed = SUPPORT.iter().find(|f| f.name == "mlx").map(|f| f.modes);
        assert_eq!(
            listed.map(|m| m.to_vec()),
            Some(named.iter().map(String::as_str).collect())
        );
    }
}

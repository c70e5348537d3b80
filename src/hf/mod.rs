//! The dense checkpoint as transformers loads it: the names its loaders
//! know ([`names`], [`experts`]), the `config.json` it reads ([`config`]),
//! the model card the Hub shows ([`card`]), and a GGUF model in Hugging
//! Face form ([`gguf`]: tensors, config and generation config from the
//! metadata, [`tokenizer`] files from its vocabulary).
//!
//! The plan asks for it once, under the [`Names`] the user chose: under
//! stored names nothing here runs, so nothing has to be undone.

pub(crate) mod card;
pub(crate) mod config;
pub(crate) mod experts;
pub(crate) mod gguf;
pub(crate) mod names;
pub(crate) mod tokenizer;

/// Under which names the dense checkpoint is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Names {
    /// The names, layouts and files transformers loads (the default).
    #[default]
    Hub,
    /// Every tensor under its stored name, as stored (`--keep-names`).
    Stored,
}

//! The plan: what each output tensor is and where its bytes come from, known
//! before anything is decoded.

use std::collections::HashSet;
use std::path::PathBuf;

use crate::checkpoint::Checkpoint;
pub use crate::error::Warning;
use crate::error::{Error, Result, Rule};
use crate::formats::{self, Format};
use crate::hf::{self, experts, Names};
use crate::numerics::{DtypeChoice, OutDtype};
pub use crate::output::{Output, Source};

/// Everything `dequantize` will do, in output order.
pub struct Plan<'a> {
    /// The checkpoint planned from.
    pub checkpoint: &'a Checkpoint,
    /// What was asked for: `Auto` keeps copied tensors as stored.
    pub dtype_choice: DtypeChoice,
    /// The detected format and its configuration.
    pub format: Format,
    /// Output dtype of decoded tensors.
    pub dtype: OutDtype,
    /// Output tensors, sorted by name.
    pub outputs: Vec<Output<'a>>,
    /// Quantization tensors used up (packs, scales, zeros, shapes,
    /// activation scales; a GGUF's rope factors, which config.json states),
    /// sorted.
    pub consumed: Vec<String>,
    /// Model tensors not written (a GGUF's tensors transformers' model has
    /// no place for: HF-001), sorted.
    pub dropped: Vec<String>,
    /// Modules that cannot be decoded, with the rule each breaks.
    pub errors: Vec<Error>,
    /// Findings that do not stop decoding.
    pub warnings: Vec<Warning>,
    /// The `config.json` to write, when the input has one.
    pub config: Option<serde_json::Value>,
    /// The input's other files copied to the output (tokenizer, generation
    /// config, …): (path, file name). Quantization sidecars are not among them.
    pub side_files: Vec<(PathBuf, String)>,
    /// Outputs the report lists as written under the name transformers
    /// loads rather than the stored one, as (stored, written).
    pub renamed: Vec<(String, String)>,
    /// Files made from the input rather than copied (the model card; a GGUF
    /// model's config, generation config and tokenizer): (file name, bytes).
    pub generated: Vec<(String, Vec<u8>)>,
    /// Stored tensors whose values planning reads but whose bytes are not at
    /// hand yet (a checkpoint read piece by piece, `stream`): load them and
    /// plan again. Until this is empty the plan is incomplete.
    pub needs: Vec<String>,
}

impl<'a> Plan<'a> {
    /// Plans the dense output of `ckpt` in `dtype` under `names`. Faults
    /// that concern the whole checkpoint (an unreadable config) are
    /// returned as `Err`; faults of one module are collected in
    /// [`Plan::errors`] so `validate` can list them all.
    pub fn build(ckpt: &'a Checkpoint, dtype: DtypeChoice, names: Names) -> Result<Plan<'a>> {
        let format = formats::detect(ckpt)?;
        let dtype_choice = dtype;
        let dtype = match dtype {
            DtypeChoice::Fixed(d) => d,
            DtypeChoice::Auto => formats::default_dtype(ckpt, &format),
        };
        let mut plan = Plan {
            checkpoint: ckpt,
            dtype_choice,
            format,
            dtype,
            outputs: Vec::new(),
            consumed: Vec::new(),
            dropped: Vec::new(),
            errors: Vec::new(),
            warnings: Vec::new(),
            config: ckpt
                .config
                .as_ref()
                .map(|c| hf::config::dense_config(&c.value, dtype_choice)),
            side_files: Vec::new(),
            renamed: Vec::new(),
            generated: Vec::new(),
            needs: Vec::new(),
        };
        let found = formats::plan_modules(ckpt, &plan.format, dtype);
        let consumed = found.consumed;
        plan.outputs = found.outputs;
        plan.errors = found.errors;
        plan.warnings = found.warnings;

        let produced: HashSet<String> = plan.outputs.iter().map(|o| o.name.clone()).collect();
        for name in ckpt.names() {
            if produced.contains(name) {
                // Decoded in place: int8/fp8 modules keep the name `<m>.weight`.
                continue;
            }
            if consumed.contains(name) {
                plan.consumed.push(name.to_string());
                continue;
            }
            let last = name.rsplit('.').next().unwrap_or(name);
            if formats::WEIGHT_QUANT_PARAMS.contains(&last) {
                plan.errors.push(Error::tensor(
                    Rule::Config,
                    ckpt.display_path(),
                    name,
                    format!(
                        "a quantization parameter, but its module is not decoded under {}",
                        plan.format.describe()
                    ),
                ));
                continue;
            }
            if let Some(t) = ckpt.get(name) {
                // A fixed --dtype means the whole checkpoint, copies included.
                let (dtype, source) = match dtype_choice {
                    DtypeChoice::Fixed(to)
                        if crate::numerics::is_castable(t.dtype) && t.dtype != to.safetensors() =>
                    {
                        (to.safetensors(), Source::Cast(t, to))
                    }
                    _ => (t.dtype, Source::Copy(t)),
                };
                plan.outputs.push(Output {
                    name: name.to_string(),
                    shard: t.shard,
                    shape: t.shape.to_vec(),
                    dtype,
                    source,
                    scheme: None,
                });
            }
        }
        if names == Names::Hub {
            plan.hub_form();
        }
        plan.sort_outputs()?;
        // Files that describe the quantization, and the model card (made
        // anew: `card`), are not copied; a side file linking out of the
        // checkpoint would be: a finding.
        if !ckpt.single_file {
            let sidecars: Vec<String> = hf::card::QUANTIZATION_FILES
                .iter()
                .chain([&crate::checkpoint::CARD])
                .map(|n| n.to_string())
                .chain(
                    ckpt.svdquant_config
                        .as_ref()
                        .and_then(|f| f.path.file_name().map(|n| n.to_string_lossy().into_owned())),
                )
                .collect();
            match ckpt.side_files(&sidecars) {
                Ok(files) => plan.side_files = files,
                Err(e) => plan.errors.push(e),
            }
        }
        // A GGUF model under its stored names is no model transformers
        // loads: it gets no card saying so.
        let card = if names == Names::Hub || ckpt.gguf.is_none() {
            hf::card::readme(ckpt, plan.dtype, &plan.format.describe())
        } else {
            None
        };
        if let Some(text) = card {
            plan.generated
                .push((crate::checkpoint::CARD.to_string(), text));
        }
        plan.needs = ckpt.take_misses();
        let file = ckpt.display_path();
        for w in &mut plan.warnings {
            w.file.get_or_insert_with(|| file.to_path_buf());
        }
        Ok(plan)
    }

    /// Puts the outputs in the form transformers loads ([`hf`]): stacks
    /// of experts one tensor per expert, MLX's GPT-OSS experts in
    /// transformers' layout, Mixtral-style experts under their hub names; a
    /// GGUF model as a whole.
    fn hub_form(&mut self) {
        if let Some(gguf) = &self.checkpoint.gguf {
            return self.gguf_form(gguf);
        }
        experts::unstack(&mut self.outputs);
        let model_type = self
            .checkpoint
            .config
            .as_ref()
            .and_then(|c| hf::names::model_type(&c.value))
            .unwrap_or_default()
            .to_string();
        if model_type == "gpt_oss" {
            experts::fuse_gpt_oss(&mut self.outputs);
        }
        for o in &mut self.outputs {
            if let Some(hub) = hf::names::hub_name(&model_type, &o.name) {
                self.renamed.push((o.name.clone(), hub.clone()));
                o.name = hub;
            }
        }
    }

    /// A GGUF model as transformers loads it ([`hf::gguf`]); an
    /// architecture it cannot load is a finding, which `--keep-names`
    /// clears.
    fn gguf_form(&mut self, gguf: &'a crate::checkpoint::Gguf) {
        let stored = std::mem::take(&mut self.outputs);
        match hf::gguf::convert(self.checkpoint, gguf, &stored, self.dtype) {
            Ok(c) => {
                self.outputs = c.outputs;
                self.warnings.extend(c.warnings);
                if let Some(first) = c.unplaced.first() {
                    // transformers drops them too; a reader should know.
                    let n = c.unplaced.len();
                    self.warnings.push(Warning::new(
                        Rule::Unplaced,
                        first.clone(),
                        format!(
                            "{n} GGUF tensor{} that transformers' model has no place for, not written as it does not load them ({}); --keep-names writes every tensor",
                            if n == 1 { "" } else { "s" },
                            c.unplaced.join(", ")
                        ),
                    ));
                }
                self.consumed.extend(c.consumed);
                self.consumed.sort();
                self.dropped.extend(c.unplaced);
                self.dropped.sort();
                self.renamed = c.renamed;
                self.generated = c.files;
            }
            Err(e) => self.errors.push(e),
        }
    }

    /// Sorts the outputs by name; a name given twice is an error.
    fn sort_outputs(&mut self) -> Result<()> {
        self.outputs.sort_by(|a, b| a.name.cmp(&b.name));
        match self.outputs.windows(2).find(|w| w[0].name == w[1].name) {
            Some(w) => Err(Error::tensor(
                Rule::Config,
                self.checkpoint.display_path(),
                &w[0].name,
                "two tensors would be written under this name (one of them renamed to its hub name; --keep-names keeps stored names)",
            )),
            None => Ok(()),
        }
    }

    /// Number of decoded tensors ([`Source::is_decoded`]).
    pub fn decoded(&self) -> usize {
        self.outputs
            .iter()
            .filter(|o| o.source.is_decoded())
            .count()
    }

    /// Fails with the first warning as `--strict` refuses it; the count of
    /// the others goes into its detail.
    pub fn check_warnings(&self) -> Result<()> {
        let Some(first) = self.warnings.first() else {
            return Ok(());
        };
        let mut e = first.refusal();
        if self.warnings.len() > 1 {
            e.detail += &format!(" (and {} more warnings)", self.warnings.len() - 1);
        }
        Err(e)
    }

    /// Fails with the first module error, if any, its cause kept; the
    /// count of the others goes into its detail.
    pub fn check(&self) -> Result<()> {
        let Some(first) = self.errors.first() else {
            return Ok(());
        };
        let mut e = first.clone();
        if self.errors.len() > 1 {
            e.detail += &format!(
                " (and {} more findings; run `validate`)",
                self.errors.len() - 1
            );
        }
        Err(e)
    }
}

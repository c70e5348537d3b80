//! The runs every host calls: dequantize a checkpoint into a directory (or,
//! in a browser, into files handed back piece by piece: `stream`), inspect
//! it, validate it, convert it. Each is one sequence (open → plan → check →
//! select a backend → claim the output → write with progress) written
//! here once; the command line, Python, C and the browser only translate
//! their arguments and show what they are told.

use std::path::Path;

use crate::backend::{self, Backend, BackendChoice};
use crate::checkpoint::Checkpoint;
use crate::convert::ConvertTo;
use crate::error::{Error, Result};
use crate::plan::{DtypeChoice, Plan, Warning};
use crate::report::{Finding, Report};
use crate::writer::{Canceller, OutputDir, Progress, Summary};

/// The two choices every run makes: the output dtype and the backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Output dtype of decoded tensors.
    pub dtype: DtypeChoice,
    /// Which backend decodes.
    pub backend: BackendChoice,
}

/// What a run tells people while it works, besides its progress.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Note<'a> {
    /// Decoding starts: the checkpoint's format and the backend that runs.
    Start {
        /// [`Model::format`](crate::Model::format)'s words.
        format: &'a str,
        /// The backend, for people (`gpu (NVIDIA H200, Vulkan) (CPU if it fails)`).
        backend: &'a str,
    },
    /// Worth a line: the backend differs from the one asked for, the GPU
    /// failed and the CPU took over (same bytes), there is nothing to decode.
    Text(&'a str),
}

/// A dequantize run, configured step by step, then [`run`](Dequantize::run)
/// (or, over files read piece by piece, `stream`).
///
/// ```no_run
/// use wgpu_dequant::{BackendChoice, Dequantize, DtypeChoice, OutDtype};
/// let summary = Dequantize::new()
///     .dtype(DtypeChoice::Fixed(OutDtype::Bf16))
///     .backend(BackendChoice::Auto)
///     .max_shard_size(5_000_000_000)
///     .on_progress(|p| eprint!("\r{}/{} bytes", p.done_bytes, p.total_bytes))
///     .run("model-w4a16", "model-dense")?;
/// # Ok::<(), wgpu_dequant::Error>(())
/// ```
pub struct Dequantize<'a> {
    pub(crate) options: Options,
    force: bool,
    shards: Option<Vec<String>>,
    pub(crate) max_shard_size: Option<u64>,
    keep_names: bool,
    pub(crate) progress: Box<dyn FnMut(&Progress<'_>) + 'a>,
    pub(crate) note: Box<dyn FnMut(Note<'_>) + 'a>,
    canceller: Canceller,
    /// Stored input bytes a `stream` batch loads at most, when not its own.
    pub(crate) batch_bytes: Option<usize>,
}

impl Default for Dequantize<'_> {
    fn default() -> Self {
        Dequantize::new()
    }
}

impl<'a> Dequantize<'a> {
    /// A run with the defaults: the checkpoint's own dtype, `--backend
    /// auto`, a new or empty output directory, the input's sharding and
    /// names, nothing reported.
    pub fn new() -> Self {
        Dequantize {
            options: Options::default(),
            force: false,
            shards: None,
            max_shard_size: None,
            keep_names: false,
            progress: Box::new(|_| {}),
            note: Box::new(|_| {}),
            canceller: Canceller::default(),
            batch_bytes: None,
        }
    }

    /// Dtype and backend at once.
    pub fn options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    /// Dtype of every floating point tensor, decoded or copied (`Auto`: the
    /// checkpoint's own for decoded ones; copies keep theirs).
    pub fn dtype(mut self, dtype: DtypeChoice) -> Self {
        self.options.dtype = dtype;
        self
    }

    /// Where to decode.
    pub fn backend(mut self, backend: BackendChoice) -> Self {
        self.options.backend = backend;
        self
    }

    /// Write into an output directory that holds files: those of the same
    /// names are replaced once everything succeeded, others are left alone.
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// Only these input shards (file names, or paths to them): the output
    /// directory may hold other runs' shards, and a partial index is written
    /// for [`merge_index`](crate::merge_index).
    pub fn shards(mut self, shards: Vec<String>) -> Self {
        self.shards = Some(shards);
        self
    }

    /// Split the output into `model-0000i-of-0000N.safetensors` files of at
    /// most `bytes` each ([`parse_size`](crate::parse_size) reads `5GB`),
    /// unless one tensor alone is larger.
    pub fn max_shard_size(mut self, bytes: u64) -> Self {
        self.max_shard_size = Some(bytes);
        self
    }

    /// Keep the stored tensor names, even where the architecture's own
    /// checkpoints name them differently (Mixtral-style MoE experts).
    pub fn keep_names(mut self, keep: bool) -> Self {
        self.keep_names = keep;
        self
    }

    /// Called after every piece written (about 32 MiB).
    pub fn on_progress(mut self, progress: impl FnMut(&Progress<'_>) + 'a) -> Self {
        self.progress = Box::new(progress);
        self
    }

    /// Called with what the run has to tell people.
    pub fn on_note(mut self, note: impl FnMut(Note<'_>) + 'a) -> Self {
        self.note = Box::new(note);
        self
    }

    /// Stops when `canceller` is cancelled (from another thread: a Cancel
    /// button, Ctrl-C): the run fails with CANCEL-001 before its next piece
    /// and leaves nothing behind.
    pub fn canceller(mut self, canceller: Canceller) -> Self {
        self.canceller = canceller;
        self
    }

    /// Stored input bytes a `stream` batch loads at most (the tests make
    /// it small to cross batch boundaries on small checkpoints).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn batch_bytes(mut self, bytes: usize) -> Self {
        self.batch_bytes = Some(bytes);
        self
    }

    /// Plans the dense form of `ckpt` as configured, its faults listed.
    pub(crate) fn planned<'c>(&self, ckpt: &'c Checkpoint) -> Result<Plan<'c>> {
        let mut plan = Plan::build(ckpt, self.options.dtype)?;
        if self.keep_names {
            plan.keep_stored_names()?;
        }
        Ok(plan)
    }

    /// [`Dequantize::planned`], failing on the first fault of any module.
    pub(crate) fn plan<'c>(&self, ckpt: &'c Checkpoint) -> Result<Plan<'c>> {
        let plan = self.planned(ckpt)?;
        plan.check()?;
        Ok(plan)
    }

    /// Tells what starts: the backend's note, the format and backend, and
    /// whether anything is decoded at all.
    pub(crate) fn start(&mut self, plan: &Plan<'_>, backend: &dyn Backend, note: Option<String>) {
        if let Some(note) = note {
            (self.note)(Note::Text(&note));
        }
        let format = plan.format.describe();
        (self.note)(Note::Start {
            format: &format,
            backend: &backend.name(),
        });
        if plan.decoded() == 0 {
            let how = match plan.dtype_choice {
                DtypeChoice::Fixed(d) => format!(" as {d}"),
                DtypeChoice::Auto => " as they are".to_string(),
            };
            let text =
                format!("nothing to decode (no quantized module); the tensors are copied{how}");
            (self.note)(Note::Text(&text));
        }
    }

    /// Tells of a GPU failure the CPU took over from, once.
    pub(crate) fn fallback(note: &mut dyn FnMut(Note<'_>), backend: &dyn Backend) {
        if let Some(e) = backend.take_fallback() {
            note(Note::Text(&format!(
                "{e}; decoding on the CPU from here (same bytes)"
            )));
        }
    }

    /// Dequantizes the checkpoint at `input` (a directory or one
    /// `.safetensors` file) into the dense checkpoint in `output`. Nothing is
    /// left in `output` when it fails or is cancelled.
    pub fn run(mut self, input: impl AsRef<Path>, output: impl AsRef<Path>) -> Result<Summary> {
        let ckpt = Checkpoint::open(input)?;
        let plan = self.plan(&ckpt)?;
        let out = output.as_ref();
        let dir = match self.shards.take() {
            Some(list) => {
                let names = list
                    .iter()
                    .map(|s| ckpt.shard_file_name(s).map(str::to_string))
                    .collect::<Result<Vec<_>>>()?;
                OutputDir::for_shards(out, names)?
            }
            None if self.force => OutputDir::force(out)?,
            None => OutputDir::create(out)?,
        };
        let dir = match self.max_shard_size {
            Some(max) => dir.with_max_shard_size(max),
            None => dir,
        };
        let dir = dir.cancelled_by(&self.canceller);
        let (backend, note) = backend::select(self.options.backend)?;
        self.start(&plan, backend.as_ref(), note);
        let (progress, note) = (&mut self.progress, &mut self.note);
        let summary = dir.write(&plan, backend.as_ref(), |p| {
            Dequantize::fallback(note.as_mut(), backend.as_ref());
            progress(&p);
        });
        Dequantize::fallback(note.as_mut(), backend.as_ref());
        summary
    }
}

/// Dequantizes the checkpoint at `input` into a dense checkpoint in `output`
/// (a new or empty directory): [`Dequantize`] with `options` and nothing
/// else. Nothing is left in `output` when it fails.
pub fn dequantize(
    input: impl AsRef<Path>,
    output: impl AsRef<Path>,
    options: &Options,
) -> Result<Summary> {
    Dequantize::new().options(*options).run(input, output)
}

/// What `inspect` shows of the checkpoint at `path`: its format, every dense
/// tensor and every rule finding. Fails only when the checkpoint cannot be
/// read or planned at all.
pub fn inspect(path: impl AsRef<Path>) -> Result<Report> {
    let ckpt = Checkpoint::open(path)?;
    Ok(Report::new(&Plan::build(&ckpt, DtypeChoice::Auto)?))
}

/// Every rule finding of a checkpoint (`validate`): what stops decoding and
/// what does not. Serializes as `validate --json` prints it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Validation {
    /// Rule violations; decoding refuses while there are any.
    pub errors: Vec<Finding>,
    /// Findings that do not stop decoding.
    pub warnings: Vec<Warning>,
}

impl Validation {
    /// The exit status for these findings: 0 when clean, else the first one's.
    pub fn exit_code(&self) -> u8 {
        self.errors.first().map_or(0, |e| e.exit_code)
    }
}

impl From<&Error> for Validation {
    /// A fault of the whole checkpoint, as the one finding.
    fn from(e: &Error) -> Self {
        Validation {
            errors: vec![Finding::from(e)],
            warnings: Vec::new(),
        }
    }
}

/// Checks every rule the checkpoint at `path` must follow; a checkpoint that
/// cannot be read at all is one finding.
pub fn validate(path: impl AsRef<Path>) -> Validation {
    let found = Checkpoint::open(path).and_then(|ckpt| {
        let plan = Plan::build(&ckpt, DtypeChoice::Auto)?;
        Ok(Validation {
            errors: plan.errors.iter().map(Finding::from).collect(),
            warnings: plan.warnings,
        })
    });
    found.unwrap_or_else(|e| Validation::from(&e))
}

/// Rewrites the checkpoint at `input` in format `to` into `output` (a new or
/// empty directory), tensor for tensor what that format's own converter
/// writes (rule CT-005). Nothing is decoded.
pub fn convert(
    input: impl AsRef<Path>,
    output: impl AsRef<Path>,
    to: ConvertTo,
) -> Result<Summary> {
    let ckpt = Checkpoint::open(input)?;
    let plan = crate::convert::plan(&ckpt, to)?;
    let dir = OutputDir::create(output.as_ref())?;
    // Renaming, inverted scales and repacking are made on the host.
    let mut summary = dir.write(&plan, &backend::Cpu::new(), |_| {})?;
    summary.modules = plan
        .outputs
        .iter()
        .filter(|o| o.name.ends_with(".weight_packed"))
        .count();
    Ok(summary)
}

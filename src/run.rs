//! The runs every host calls: dequantize a checkpoint into a directory (or,
//! in a browser, into files handed back piece by piece: `stream`), inspect
//! it, validate it, convert it. Each is one sequence (open → plan → check →
//! select a backend → claim the output → write with progress) written
//! here once; the command line, Python, C and the browser only translate
//! their arguments and show what they are told.

use std::path::Path;

use crate::backend::{self, select_async, Backend, BackendChoice};
use crate::checkpoint::Checkpoint;
use crate::convert::ConvertTo;
use crate::error::Rule;
use crate::error::{Error, Result};
use crate::hf::Names;
use crate::numerics::DtypeChoice;
use crate::plan::Plan;
use crate::report::{Report, Validation};
use crate::stream::{open, prepare, Files, Part, Reading};
use crate::writer::{self, Canceller, Hooks, OutputDir, Progress, Streamed, Summary};

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
        /// The format's name, as [`Summary::format`] gives it (`gptq`).
        format_kind: &'a str,
        /// `gpu` or `cpu`, as [`Summary::backend`] gives it.
        backend_kind: &'a str,
    },
    /// Worth a line: the backend differs from the one asked for, the GPU
    /// failed and the CPU took over (same bytes), there is nothing to decode.
    Text(&'a str),
    /// A finding of the plan: something dropped, guessed or changed on the
    /// way to the dense model (told before anything is written;
    /// [`Dequantize::strict`] refuses it instead).
    Warning(&'a crate::Warning),
    /// A [`Dequantize::resume`] run starts: `kept` output files an earlier
    /// run finished are kept (their bytes checked against the BLAKE3
    /// digests recorded when they were written), `left` are written.
    Resumed {
        /// Finished files kept.
        kept: usize,
        /// Files still to write.
        left: usize,
    },
}

/// What [`Dequantize::on_download`] calls, from the downloading side.
type DownloadCallback<'a> = Box<dyn Fn(&writer::Download) + Send + Sync + 'a>;

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
    /// Job `.0` of `.1` (`--part`).
    part: Option<(usize, usize)>,
    pub(crate) max_shard_size: Option<u64>,
    keep_names: bool,
    strict: bool,
    pub(crate) progress: Box<dyn FnMut(&Progress<'_>) + 'a>,
    pub(crate) note: Box<dyn FnMut(Note<'_>) + 'a>,
    canceller: Canceller,
    delete_downloaded: bool,
    resume: bool,
    /// Told how far a Hub run's downloads are, a few times a second.
    download: Option<DownloadCallback<'a>>,
    /// Output files an earlier run finished (`resume`), which `stream`
    /// skips.
    finished: Option<std::sync::Arc<writer::Journal>>,
    /// Stored input bytes a `stream` batch loads at most, when not its own.
    pub(crate) batch_bytes: Option<usize>,
    /// The GGUF model of a folder or Hub repository that holds several.
    gguf_file: Option<String>,
}

impl Default for Dequantize<'_> {
    fn default() -> Self {
        Dequantize::new()
    }
}

/// Builder methods that each set one field of the run:
/// `name(arg: Type) => field = value;`, after the method's docs.
macro_rules! setters {
    ($($(#[$attr:meta])* $name:ident($($arg:ident: $ty:ty),+) => $($field:ident).+ = $value:expr;)*) => {$(
        $(#[$attr])*
        pub fn $name(mut self, $($arg: $ty),+) -> Self {
            self.$($field).+ = $value;
            self
        }
    )*};
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
            part: None,
            max_shard_size: None,
            keep_names: false,
            strict: false,
            progress: Box::new(|_| {}),
            note: Box::new(|_| {}),
            canceller: Canceller::default(),
            delete_downloaded: false,
            resume: false,
            download: None,
            finished: None,
            batch_bytes: None,
            gguf_file: None,
        }
    }

    setters! {
        /// The GGUF model to read where the input (a folder, a Hub repository)
        /// holds several (`--gguf-file`): its file's name, or its path in the
        /// repository (`Q4_K_M/NAME-00001-of-00002.gguf`); any part of a split
        /// model names it. A Hub id's `:QUANT` tag picks by quantization instead.
        gguf_file(file: impl Into<String>) => gguf_file = Some(file.into());

        /// Dtype and backend at once.
        options(options: Options) => options = options;

        /// Dtype of every floating point tensor, decoded or copied (`Auto`: the
        /// checkpoint's own for decoded ones; copies keep theirs).
        dtype(dtype: DtypeChoice) => options.dtype = dtype;

        /// Where to decode.
        backend(backend: BackendChoice) => options.backend = backend;

        /// Write into an output directory that holds files: those of the same
        /// names are replaced once everything succeeded, others are left alone.
        force(force: bool) => force = force;

        /// Only these input shards (file names, or paths to them): the output
        /// directory may hold other runs' shards, and a partial index is written
        /// for [`merge_index`](crate::merge_index).
        shards(shards: Vec<String>) => shards = Some(shards);

        /// Only the input shards that fall to job `index` of `count` (`--part
        /// I/N`; `index` from 0, as `SLURM_ARRAY_TASK_ID` and a Kubernetes
        /// Indexed Job's `JOB_COMPLETION_INDEX` count): every job derives the
        /// same assignment from the headers alone, balanced by the bytes each
        /// shard writes, and runs as [`Dequantize::shards`] does with its own.
        /// A job that no shard falls to (more jobs than shards) writes nothing.
        part(index: usize, count: usize) => part = Some((index, count));

        /// Split the output into `model-0000i-of-0000N.safetensors` files of at
        /// most `bytes` each ([`parse_size`](crate::parse_size) reads `5GB`),
        /// unless one tensor alone is larger.
        max_shard_size(bytes: u64) => max_shard_size = Some(bytes);

        /// Keep the stored tensor names, even where the architecture's own
        /// checkpoints name them differently (Mixtral-style MoE experts).
        keep_names(keep: bool) => keep_names = keep;

        /// Refuse the run, before anything is written, when the plan has a
        /// warning (`--strict`): the dense model would not be exactly the
        /// checkpoint's (a tensor dropped, a config value guessed or changed).
        strict(strict: bool) => strict = strict;

        /// Called after every piece written (about 32 MiB).
        on_progress(progress: impl FnMut(&Progress<'_>) + 'a) => progress = Box::new(progress);

        /// Called a few times a second, from another thread, while a Hub run
        /// downloads shards (the decoding may be waiting for them, so that
        /// [`Dequantize::on_progress`] is not called meanwhile); every progress
        /// report carries the same figures too.
        on_download(download: impl Fn(&writer::Download) + Send + Sync + 'a) => download = Some(Box::new(download));

        /// Called with what the run has to tell people.
        on_note(note: impl FnMut(Note<'_>) + 'a) => note = Box::new(note);

        /// Stops when `canceller` is cancelled (from another thread: a Cancel
        /// button, Ctrl-C): the run fails with CANCEL-001 before its next piece
        /// and leaves nothing behind.
        canceller(canceller: Canceller) => canceller = canceller;

        /// A Hub checkpoint's shards that this run downloads are removed from
        /// the cache again as soon as every tensor that reads them is written,
        /// so that the cache holds about two shards at a time (shards that were
        /// there already, or that another snapshot links to, are kept).
        delete_downloaded(delete: bool) => delete_downloaded = delete;

        /// Continue an interrupted run of the same job into the same output:
        /// the output files it finished (whose bytes still have the BLAKE3
        /// digest recorded when they were written) are kept, the rest is written, and
        /// the result is what an uninterrupted run writes. If this run fails or
        /// is interrupted too, the files it finished stay for the next one (in
        /// the output's staging folder), instead of being removed. When the
        /// output already holds the finished run of the same job (its record
        /// lists every file, of those bytes), nothing is read or written and
        /// the summary says so ([`Summary::already_done`]).
        resume(resume: bool) => resume = resume;

        /// Stored input bytes a `stream` batch loads at most (the tests make
        /// it small to cross batch boundaries on small checkpoints).
        #[cfg(feature = "testing")]
        #[doc(hidden)]
        batch_bytes(bytes: usize) => batch_bytes = Some(bytes);
    }

    /// Plans the dense form of `ckpt` as configured, its faults listed.
    pub(crate) fn planned<'c>(&self, ckpt: &'c Checkpoint) -> Result<Plan<'c>> {
        let names = if self.keep_names {
            Names::Stored
        } else {
            Names::Hub
        };
        Plan::build(ckpt, self.options.dtype, names)
    }

    /// [`inspect`] with this run's settings: the plan a [`Dequantize::run`]
    /// makes (its dtype, names, [`Dequantize::gguf_file`] and
    /// [`Dequantize::max_shard_size`]), with the free space of the current
    /// directory's file system. A Hub model's headers alone are read.
    pub fn inspect(&self, path: impl AsRef<Path>) -> Result<Report> {
        self.inspect_for(path, ".")
    }

    /// [`Dequantize::inspect`] for a run that would write into `out`
    /// (which need not exist, and is not touched): the report's free space
    /// is that of the file system of its nearest existing folder.
    pub fn inspect_for(&self, path: impl AsRef<Path>, out: impl AsRef<Path>) -> Result<Report> {
        let out = Some(out.as_ref());
        let path = match input(path.as_ref(), self.gguf_file.as_deref())? {
            Input::Local(path) => path,
            #[cfg(not(target_arch = "wasm32"))]
            Input::Hub(remote) => {
                return pollster::block_on(crate::stream::inspect_planned(&*remote, self, out))
            }
        };
        let ckpt = Checkpoint::open(path)?;
        Ok(self.report(&self.planned(&ckpt)?, out))
    }

    /// The report of `plan`, planned by this run.
    pub(crate) fn report(&self, plan: &Plan<'_>, out: Option<&Path>) -> Report {
        Report::planned(plan, self.max_shard_size, out)
    }

    /// [`validate`] with this run's [`Dequantize::gguf_file`]: a Hub GGUF
    /// model's headers alone are read, by range requests.
    pub fn validate(&self, path: impl AsRef<Path>) -> Validation {
        let path = match input(path.as_ref(), self.gguf_file.as_deref()) {
            Ok(Input::Local(path)) => path,
            #[cfg(not(target_arch = "wasm32"))]
            Ok(Input::Hub(remote)) => return pollster::block_on(crate::stream::validate(&*remote)),
            Err(e) => return Validation::from(&e),
        };
        let found = Checkpoint::open(path).and_then(|ckpt| {
            Ok(Validation::of(Plan::build(
                &ckpt,
                DtypeChoice::Auto,
                Names::Hub,
            )?))
        });
        found.unwrap_or_else(|e| Validation::from(&e))
    }

    /// [`Dequantize::planned`], failing on the first fault of any module
    /// (with [`Dequantize::strict`], on the first warning too).
    pub(crate) fn plan<'c>(&self, ckpt: &'c Checkpoint) -> Result<Plan<'c>> {
        let plan = self.planned(ckpt)?;
        plan.check()?;
        if self.strict {
            plan.check_warnings()?;
        }
        Ok(plan)
    }

    /// Tells what starts: the backend's note, the format and backend, and
    /// whether anything is decoded at all.
    pub(crate) fn start(&mut self, plan: &Plan<'_>, backend: &dyn Backend, note: Option<String>) {
        if let Some(note) = note {
            (self.note)(Note::Text(&note));
        }
        for w in &plan.warnings {
            (self.note)(Note::Warning(w));
        }
        let format = plan.format.describe();
        (self.note)(Note::Start {
            format: &format,
            backend: &backend.name(),
            format_kind: plan.format.kind(),
            backend_kind: backend.kind(),
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
    pub fn run(self, input: impl AsRef<Path>, output: impl AsRef<Path>) -> Result<Summary> {
        #[cfg(not(target_arch = "wasm32"))]
        let started = std::time::Instant::now();
        let summary = match self::input(input.as_ref(), self.gguf_file.as_deref())? {
            Input::Local(path) => {
                let key = self.key(&writer::input_stamps(&path))?;
                self.run_local(&path, output.as_ref(), key)
            }
            #[cfg(not(target_arch = "wasm32"))]
            Input::Hub(remote) => self.run_hub(&remote, output.as_ref()),
        };
        #[cfg(not(target_arch = "wasm32"))]
        let summary = summary.map(|s| Summary {
            seconds: started.elapsed().as_secs_f64(),
            ..s
        });
        summary
    }

    /// [`Dequantize::run`] of the local checkpoint at `input`, as the job
    /// `key` names (its input files' stamps, or a Hub commit and files).
    fn run_local(mut self, input: &Path, out: &Path, key: String) -> Result<Summary> {
        let tag = self.tag()?;
        if let Some(summary) = self.finished(out, tag.as_deref(), &key)? {
            return Ok(summary);
        }
        let ckpt = Checkpoint::open(input)?;
        let plan = self.plan(&ckpt)?;
        let shards = match (self.shards.take(), self.part) {
            (Some(list), _) => Some(
                list.iter()
                    .map(|s| ckpt.shard_file_name(s).map(str::to_string))
                    .collect::<Result<Vec<_>>>()?,
            ),
            (None, Some(_)) => match self.own_part(&plan)? {
                mine if mine.is_empty() => return Ok(writer::Summary::of(&plan, &[])),
                mine => Some(mine),
            },
            (None, None) => None,
        };
        let dir = self.target(out, shards, tag.as_deref(), key).claim()?;
        let (backend, note) = backend::select(self.options.backend)?;
        self.start(&plan, backend.as_ref(), note);
        // Both callbacks tell notes, one at a time.
        let (progress, note) = (&mut self.progress, std::cell::RefCell::new(&mut self.note));
        let summary = dir.write_noting(
            &plan,
            backend.as_ref(),
            |p| {
                Dequantize::fallback(note.borrow_mut().as_mut(), backend.as_ref());
                progress(&p);
            },
            &mut |told| (note.borrow_mut())(told),
        );
        Dequantize::fallback(self.note.as_mut(), backend.as_ref());
        summary.map(|s| ran_on(s, backend.as_ref()))
    }

    /// The key of this run's job over the input `input` describes (stamps
    /// of its files, a Hub commit): what `--resume` runs and finished runs'
    /// records must share.
    fn key(&self, input: &str) -> Result<String> {
        self.check_part()?;
        let o = &self.options;
        let shards = self.shards.as_ref().map(|list| {
            let names = list
                .iter()
                .map(|s| Path::new(s).file_name().map(|n| n.to_string_lossy()));
            names.collect::<Vec<_>>()
        });
        let choices = (
            o.dtype,
            self.max_shard_size,
            self.keep_names,
            shards,
            self.part,
        );
        let text = format!("{} {input} {choices:?}", env!("CARGO_PKG_VERSION"));
        Ok(writer::hex_sha256(&text))
    }

    /// Refuses a `--part` that names no job, or comes with `--shards`.
    fn check_part(&self) -> Result<()> {
        match self.part {
            Some(_) if self.shards.is_some() => Err(Error::bare(
                Rule::Argument,
                "--shards and --part: give one (--part derives the shards)",
            )),
            Some((index, count)) if index >= count => Err(Error::bare(
                Rule::Argument,
                format!("--part {index}/{count}: I must be at least 0 and below N"),
            )),
            _ => Ok(()),
        }
    }

    /// The tag of a job that shares its output directory with others
    /// (`--shards`: its first shard; `--part I/N`: `part-I-of-N`).
    fn tag(&self) -> Result<Option<String>> {
        match (&self.shards, self.part) {
            (Some(list), _) => {
                let names: Vec<String> = list
                    .iter()
                    .map(|s| {
                        Path::new(s)
                            .file_name()
                            .map_or(s.clone(), |n| n.to_string_lossy().into_owned())
                    })
                    .collect();
                writer::share_tag(&names).map(Some)
            }
            (None, Some((index, count))) => Ok(Some(format!("part-{index}-of-{count}"))),
            (None, None) => Ok(None),
        }
    }

    /// Where and how this run writes into `out`: the input shards
    /// `shards` (all when `None`), for the job of tag `tag` and key `key`.
    fn target<'t>(
        &'t self,
        out: &'t Path,
        shards: Option<Vec<String>>,
        tag: Option<&'t str>,
        key: String,
    ) -> writer::Target<'t> {
        writer::Target {
            out,
            force: self.force,
            shards,
            tag,
            resume: self.resume,
            key,
            max_shard_size: self.max_shard_size,
            canceller: &self.canceller,
        }
    }

    /// With `--resume`, the summary of the same job's finished run in
    /// `out`; nothing is read of the input.
    fn finished(&self, out: &Path, tag: Option<&str>, key: &str) -> Result<Option<Summary>> {
        match self.resume {
            true => writer::finished(out, tag, key),
            false => Ok(None),
        }
    }

    /// The input shards of this `--part` job (none, told as a note, when
    /// none falls to it).
    fn own_part(&mut self, plan: &Plan<'_>) -> Result<Vec<String>> {
        self.check_part()?;
        let Some((index, count)) = self.part else {
            return Ok(Vec::new());
        };
        let mine = writer::part_shards(plan, self.max_shard_size, index, count)?;
        if mine.is_empty() {
            let text = format!(
                "part {index}/{count}: no input shard falls to this job ({} in {}); nothing to write",
                crate::plural::plural(plan.checkpoint.shards.len(), "shard"),
                crate::plural::plural(count, "part")
            );
            (self.note)(Note::Text(&text));
        }
        Ok(mine)
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl Dequantize<'_> {
    /// Dequantizes a Hub checkpoint as it downloads: the stream of its
    /// dense files, read through a [`Fetcher`](crate::hub::Fetcher)
    /// (shards one ahead of the decoder), written part by part.
    fn run_hub(mut self, remote: &crate::hub::Remote, out: &Path) -> Result<Summary> {
        // Shards by name (a path's last part): the stream checks them.
        if let Some(list) = &mut self.shards {
            for s in list.iter_mut() {
                if let Some(name) = Path::new(s.as_str()).file_name() {
                    *s = name.to_string_lossy().into_owned();
                }
            }
        }
        // The pinned commit is the input (and the GGUF model picked in it).
        let picked = remote.gguf().map(|parts| format!(" {}", parts.join(" ")));
        let key = self.key(&format!(
            "{}{}",
            remote.pinned(),
            picked.unwrap_or_default()
        ))?;
        let tag = self.tag()?;
        if let Some(summary) = self.finished(out, tag.as_deref(), &key)? {
            return Ok(summary);
        }
        let mut w = self
            .target(out, self.shards.clone(), tag.as_deref(), key)
            .parts()?;
        self.finished = Some(w.journal());
        let fetcher =
            crate::hub::Fetcher::new(remote, out, std::mem::take(&mut self.delete_downloaded))?;
        let mut failed = None;
        let tick = self.download.take();
        let summary = std::thread::scope(|scope| {
            // Stops the downloads however the decoding ends, a panic
            // included: the scope would wait for their threads forever.
            let stopping = Stopping(&fetcher);
            scope.spawn(|| fetcher.download());
            if let Some(tick) = &tick {
                scope.spawn(|| {
                    while !fetcher.stopped() {
                        std::thread::sleep(std::time::Duration::from_millis(200));
                        if let Some(d) = fetcher.downloads() {
                            tick(&d);
                        }
                    }
                });
            }
            let summary = pollster::block_on(self.stream(&fetcher, |name, part| {
                if failed.is_some() {
                    return;
                }
                let written = w.put(name, part, |file, range| match range {
                    Some(range) => fetcher.read_now(file, range),
                    None => fetcher.whole(file),
                });
                if let Err(e) = written {
                    fetcher.stop();
                    failed = Some(e);
                }
            }));
            drop(stopping);
            summary
        });
        if let Some(e) = failed {
            return Err(e);
        }
        let mut summary = summary?;
        summary.files = w.commit(&summary)?;
        summary.fetched = Some(fetcher.finish()?);
        Ok(summary)
    }
}

/// `summary`, naming `backend` as the one that decoded.
fn ran_on(summary: Summary, backend: &dyn Backend) -> Summary {
    Summary {
        backend: backend.kind().to_string(),
        backend_detail: backend.name(),
        ..summary
    }
}

/// Stops a [`Fetcher`](crate::hub::Fetcher) when dropped.
#[cfg(not(target_arch = "wasm32"))]
struct Stopping<'f, 'r>(&'f crate::hub::Fetcher<'r>);

#[cfg(not(target_arch = "wasm32"))]
impl Drop for Stopping<'_, '_> {
    fn drop(&mut self) {
        self.0.stop();
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
/// read or planned at all. [`Dequantize::inspect`] takes a `--gguf-file`.
pub fn inspect(path: impl AsRef<Path>) -> Result<Report> {
    Dequantize::new().inspect(path)
}

/// What a path argument names: a local path, or (natively) a Hub id.
enum Input {
    Local(std::path::PathBuf),
    #[cfg(not(target_arch = "wasm32"))]
    Hub(Box<crate::hub::Remote>),
}

/// `path` (with `gguf_file` picking a folder's GGUF model), or the Hub id
/// it names.
fn input(path: &Path, gguf_file: Option<&str>) -> Result<Input> {
    #[cfg(not(target_arch = "wasm32"))]
    return Ok(match crate::hub::input(path, gguf_file)? {
        crate::hub::Input::Local(path) => Input::Local(path),
        crate::hub::Input::Hub(remote) => Input::Hub(remote),
    });
    #[cfg(target_arch = "wasm32")]
    Ok(Input::Local(match gguf_file {
        Some(file) => crate::gguf::find_in(path, Some(file))?.unwrap_or_else(|| path.to_path_buf()),
        None => path.to_path_buf(),
    }))
}

/// `path`, or the snapshot folder of the Hub id it names once the files a
/// run needs are in the cache.
pub(crate) fn local(path: &Path) -> Result<std::path::PathBuf> {
    #[cfg(not(target_arch = "wasm32"))]
    return crate::hub::local(path, None);
    #[cfg(target_arch = "wasm32")]
    Ok(path.to_path_buf())
}

/// Checks every rule the checkpoint at `path` must follow; a checkpoint that
/// cannot be read at all is one finding. [`Dequantize::validate`] takes a
/// `--gguf-file`.
pub fn validate(path: impl AsRef<Path>) -> Validation {
    Dequantize::new().validate(path)
}

/// Rewrites the checkpoint at `input` in format `to` into `output` (a new or
/// empty directory), tensor for tensor what that format's own converter
/// writes (rule CT-005). Nothing is decoded.
pub fn convert(
    input: impl AsRef<Path>,
    output: impl AsRef<Path>,
    to: ConvertTo,
) -> Result<Summary> {
    let ckpt = Checkpoint::open(local(input.as_ref())?)?;
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

impl Dequantize<'_> {
    /// The dense checkpoint of the checkpoint in `files`: the files
    /// [`Dequantize::run`] writes, handed to `emit` as parts in file order,
    /// file after file. Nothing blocks: this is what a browser runs.
    /// `force` concerns a directory and does not apply; with `shards`, the
    /// files of those input shards (and their part of the index) are made,
    /// and other shards are read only where they hold a companion. A batch
    /// of tensors holds about 256 MiB of stored inputs in memory, besides
    /// what planning reads.
    pub async fn stream(
        mut self,
        files: &impl Files,
        mut emit: impl FnMut(&str, Part),
    ) -> Result<Summary> {
        let mut ckpt = open(files).await?;
        let keep = prepare(&mut ckpt, files, |c| Ok(self.planned(c)?.needs)).await?;
        let (backend, streamed) = {
            let plan = self.plan(&ckpt)?;
            if self.part.is_some() {
                let mine = self.own_part(&plan)?;
                if mine.is_empty() {
                    files.skip(&ckpt.shards.iter().map(|s| s.file_name.clone()).collect());
                    return Ok(Summary::of(&plan, &[]));
                }
                self.shards = Some(mine);
            }
            let (backend, note) = select_async(self.options.backend).await?;
            self.start(&plan, backend.as_ref(), note);
            let only = self.shards.as_deref();
            let streamed = Streamed::new(&plan, only, self.max_shard_size, self.batch_bytes)?;
            (backend, streamed)
        };
        // The callbacks leave `self`, which plans every batch again; both
        // tell notes, one at a time.
        let mut progress = std::mem::replace(&mut self.progress, Box::new(|_| {}));
        let note = std::cell::RefCell::new(std::mem::replace(&mut self.note, Box::new(|_| {})));
        let mut inputs = Reading::new(ckpt, files, keep, |c| self.planned(c));
        let hooks = Hooks {
            emit: &mut emit,
            progress: &mut *progress,
            note: &mut |told| (note.borrow_mut())(told),
            made: &mut || Dequantize::fallback(note.borrow_mut().as_mut(), backend.as_ref()),
        };
        let summary = streamed
            .write(
                &mut inputs,
                backend.as_ref(),
                self.finished.as_deref(),
                hooks,
            )
            .await;
        summary.map(|s| ran_on(s, backend.as_ref()))
    }
}

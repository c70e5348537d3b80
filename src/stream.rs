//! Dequantizing a checkpoint read piece by piece, without a filesystem,
//! threads or blocking: what a browser runs on the `File`s a user picked.
//!
//! Headers and sidecars are read first. Planning then notes every tensor
//! whose values it reads (global scales, `g_idx`, SVDQuant factors); those
//! are loaded and the plan is made again until it reads nothing new. The
//! streamed writer then produces the dense files in order, loading each
//! batch's stored inputs through a `Reading` and dropping them after.

use std::collections::BTreeSet;
use std::future::Future;
use std::ops::Range;

use crate::checkpoint::{Checkpoint, Listing, Wanted};
use crate::error::{Error, Result, Rule};
use crate::hf::Names;
use crate::numerics::DtypeChoice;
use crate::plan::Plan;
use crate::report::Report;
use crate::report::Validation;
use crate::writer;

/// The checkpoint's files, read on demand.
pub trait Files {
    /// Every file: name (relative to the checkpoint folder) and size.
    fn list(&self) -> Vec<(String, u64)>;

    /// Bytes `range` of file `name`.
    fn read(&self, name: &str, range: Range<u64>) -> impl Future<Output = Result<Vec<u8>>>;

    /// What reports call the checkpoint (a Hub repository's pinned id),
    /// when not `.`.
    fn name(&self) -> Option<String> {
        None
    }

    /// Planning is over, and `out_bytes` of dense files follow: the reads
    /// after this are the batches' inputs, file after file. Files fetched
    /// from afar may start coming whole, or the run be refused (no room).
    /// Returns lines worth telling (a free space that cannot be read).
    fn planned(&self, out_bytes: u64) -> Result<Vec<String>> {
        let _ = out_bytes;
        Ok(Vec::new())
    }

    /// Files `names` will not be read: the output files made from them
    /// were finished by an earlier run (`--resume`), or are another
    /// `--shards` job's.
    fn skip(&self, names: &std::collections::BTreeSet<String>) {
        let _ = names;
    }

    /// How far downloads of whole files are, for files fetched from afar.
    fn downloads(&self) -> Option<writer::Download> {
        None
    }
}

/// Files lent: the owner keeps them (and what they count) after a
/// [`Linears`](crate::Linears) over them is gone.
impl<F: Files> Files for &F {
    fn list(&self) -> Vec<(String, u64)> {
        (**self).list()
    }

    fn read(&self, name: &str, range: Range<u64>) -> impl Future<Output = Result<Vec<u8>>> {
        (**self).read(name, range)
    }

    fn name(&self) -> Option<String> {
        (**self).name()
    }

    fn planned(&self, out_bytes: u64) -> Result<Vec<String>> {
        (**self).planned(out_bytes)
    }

    fn skip(&self, names: &BTreeSet<String>) {
        (**self).skip(names)
    }

    fn downloads(&self) -> Option<writer::Download> {
        (**self).downloads()
    }
}

pub use crate::writer::Part;

/// Opens the checkpoint in `files`: every header and sidecar is read, no
/// tensor yet.
pub(crate) async fn open(files: &impl Files) -> Result<Checkpoint> {
    let mut ckpt = Checkpoint::from_listing(listing(files).await?)?;
    ckpt.name = files.name();
    Ok(ckpt)
}

/// Every file of `files`, with the headers and sidecars read.
pub(crate) async fn listing(files: &impl Files) -> Result<Listing> {
    let mut listing = Listing::default();
    for (name, len) in files.list() {
        let head = match Listing::wants(&name, len) {
            Wanted::Nothing => Vec::new(),
            Wanted::Whole => files.read(&name, 0..len).await?,
            Wanted::Header => {
                let first = files.read(&name, 0..len.min(8)).await?;
                files
                    .read(&name, 0..Listing::header_len(&first, len))
                    .await?
            }
            Wanted::GgufHeader => {
                let mut head = Vec::new();
                while let Some(upto) = Listing::gguf_prefix(&name, len, &head)? {
                    let more = files.read(&name, head.len() as u64..upto).await?;
                    head.extend_from_slice(&more);
                }
                head
            }
        };
        listing.add(name, len, head);
    }
    Ok(listing)
}

/// Loads every stored tensor whose values planning (as `run` plans) reads,
/// planning again until it needs nothing new; returns their names.
pub(crate) async fn prepare(
    ckpt: &mut Checkpoint,
    files: &impl Files,
    needs: impl Fn(&Checkpoint) -> Result<Vec<String>>,
) -> Result<BTreeSet<String>> {
    let mut read = BTreeSet::new();
    loop {
        let needs = needs(ckpt)?;
        if needs.is_empty() {
            return Ok(read);
        }
        for name in needs {
            load(ckpt, files, &name).await?;
            read.insert(name);
        }
    }
}

pub(crate) async fn load(ckpt: &mut Checkpoint, files: &impl Files, name: &str) -> Result<()> {
    let (file, range) = ckpt
        .location(name)
        .map(|(f, r)| (f.to_string(), r))
        .ok_or_else(|| Error::bare(Rule::Internal, format!("{name}: no such tensor")))?;
    let bytes = files.read(&file, range).await?;
    ckpt.load(name, bytes)
}

/// What planning as `inspect` and `validate` plan reads.
fn auto_needs(ckpt: &Checkpoint) -> Result<Vec<String>> {
    Ok(Plan::build(ckpt, DtypeChoice::Auto, Names::Hub)?.needs)
}

/// What `inspect --json` reports of the checkpoint in `files`.
pub async fn inspect(files: &impl Files) -> Result<Report> {
    inspect_planned(files, &crate::Dequantize::new(), None).await
}

/// [`inspect`] as `run` plans, with the free space where `out` would be.
pub(crate) async fn inspect_planned(
    files: &impl Files,
    run: &crate::Dequantize<'_>,
    out: Option<&std::path::Path>,
) -> Result<Report> {
    let mut ckpt = open(files).await?;
    // A fault of the whole checkpoint is for the report to show, as the CLI does.
    let _ = prepare(&mut ckpt, files, |c| Ok(run.planned(c)?.needs)).await;
    let mut report = run.report(&run.planned(&ckpt)?, out);
    if let Some(name) = files.name() {
        report.path = name;
    }
    Ok(report)
}

/// What `validate` finds in the checkpoint in `files`; a checkpoint that
/// cannot be read at all is one finding.
pub async fn validate(files: &impl Files) -> Validation {
    let found = async {
        let mut ckpt = open(files).await?;
        prepare(&mut ckpt, files, auto_needs).await?;
        Ok::<_, Error>(Validation::of(Plan::build(
            &ckpt,
            DtypeChoice::Auto,
            Names::Hub,
        )?))
    };
    found.await.unwrap_or_else(|e| Validation::from(&e))
}

/// A checkpoint read from `files` piece by piece, for the streamed writer:
/// the tensors planning reads stay loaded (`keep`), a batch's inputs are
/// loaded for it and dropped after it, and `plan` plans as the run does.
pub(crate) struct Reading<'f, F, P> {
    ckpt: Checkpoint,
    files: &'f F,
    keep: BTreeSet<String>,
    plan: P,
}

impl<'f, F, P> Reading<'f, F, P>
where
    F: Files,
    P: for<'c> Fn(&'c Checkpoint) -> Result<Plan<'c>>,
{
    /// `ckpt`, opened from `files`, with `keep` loaded (what [`prepare`]
    /// returned), planned by `plan`.
    pub(crate) fn new(ckpt: Checkpoint, files: &'f F, keep: BTreeSet<String>, plan: P) -> Self {
        Reading {
            ckpt,
            files,
            keep,
            plan,
        }
    }
}

impl<F, P> writer::Inputs for Reading<'_, F, P>
where
    F: Files,
    P: for<'c> Fn(&'c Checkpoint) -> Result<Plan<'c>>,
{
    fn checkpoint(&self) -> &Checkpoint {
        &self.ckpt
    }

    fn plan(&self) -> Result<Plan<'_>> {
        (self.plan)(&self.ckpt)
    }

    async fn load(&mut self, name: &str) -> Result<()> {
        if self.keep.contains(name) {
            return Ok(());
        }
        load(&mut self.ckpt, self.files, name).await
    }

    fn unload(&mut self) {
        let keep = &self.keep;
        self.ckpt.unload(|n| keep.contains(n));
    }

    fn sizes(&self) -> std::collections::BTreeMap<String, u64> {
        self.files.list().into_iter().collect()
    }

    fn skip(&self, names: &BTreeSet<String>) {
        self.files.skip(names)
    }

    fn planned(&self, out_bytes: u64) -> Result<Vec<String>> {
        self.files.planned(out_bytes)
    }

    fn downloads(&self) -> Option<writer::Download> {
        self.files.downloads()
    }
}

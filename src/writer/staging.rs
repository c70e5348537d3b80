//! The staging folder a run writes into before anything reaches the output
//! directory, and the rules that keep runs from hurting each other:
//!
//! - A staging folder holds a `.lock` file that its run keeps locked (an OS
//!   advisory lock, released by the kernel when the process dies, however it
//!   dies). A second run into the same place finds the lock held and refuses;
//!   a staging folder whose lock nobody holds was left by a killed run and is
//!   removed by whichever run finds it.
//! - Everything the run puts in the output directory is recorded in a state
//!   shared with [`interrupt`], so a signal handler can undo the run from
//!   another thread: the same rollback a failed run does when it is dropped.
//! - Only files are ever replaced (`--force`), and only once everything is
//!   written; the replaced files wait in the staging folder until then.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::error::{Error, Result, Rule};

/// Name of the staging folder inside the output directory; every folder this
/// tool leaves there for itself starts with it.
pub(crate) const STAGING: &str = ".wgpu-dequant-partial";

/// The lock file inside a staging folder.
const LOCK: &str = ".lock";

/// Where `--force` keeps the files it replaces until the commit is done.
const REPLACED: &str = ".replaced";

/// How long a staging folder without its lock file is taken for one being set
/// up by another run (the lock follows its folder within microseconds).
const SETUP_GRACE: Duration = Duration::from_millis(500);

/// How an output directory may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode<'t> {
    /// It must not exist or be empty (stale staging folders aside).
    Fresh,
    /// It may hold anything; files of the same name are replaced.
    Force,
    /// It may hold other `--shards` runs' parts (tagged by this run's name).
    Shared(&'t str),
}

/// What a run has done to the output directory so far: enough to undo it.
#[derive(Debug, Default)]
struct State {
    /// The output directory.
    out: PathBuf,
    /// Directories this run created, deepest first.
    created: Vec<PathBuf>,
    /// The staging folder, once it exists.
    dir: Option<PathBuf>,
    /// Held while the run lives; dropped before the folder is removed.
    lock: Option<File>,
    /// Files already moved into the output directory.
    moved: Vec<PathBuf>,
    /// Files set aside to be replaced: (backup, original).
    replaced: Vec<(PathBuf, PathBuf)>,
    /// Committed, or rolled back: nothing more may happen.
    finished: bool,
    /// A `--resume` run: a rollback keeps the staging folder (the files
    /// it finished, for the next `--resume` run) and what it moved.
    keep: bool,
}

/// Removes from staging folder `dir` the files its journal does not list
/// as finished (one cut off mid-write) and returns how many it lists: what
/// a stopped `--resume` run keeps for the next.
fn keep_finished(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let listed = super::journal::listed(dir);
    let mut kept = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == LOCK || name == REPLACED || name.starts_with(super::journal::JOURNAL) {
            continue;
        }
        match listed.contains(&name) {
            true => kept += 1,
            false => {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
    kept
}

impl State {
    fn check_open(&self, what: &Path) -> Result<()> {
        if self.finished {
            // Only a signal ([`interrupt`]) finishes a run that is still
            // writing: the user stopped it, nothing failed.
            return Err(Error::new(Rule::Cancelled, what, "the run was interrupted"));
        }
        Ok(())
    }

    /// Undoes everything this run did in the output directory; a
    /// `--resume` run keeps the files it or an earlier run finished (and
    /// removes the one it was writing), putting back only the files it was
    /// replacing.
    fn rollback(&mut self) -> Undo {
        if std::mem::replace(&mut self.finished, true) {
            return Undo::Over;
        }
        // With nothing finished, a `--resume` run leaves nothing, as any
        // other run.
        let finished = match (&self.dir, self.keep) {
            (Some(dir), true) => keep_finished(dir),
            _ => 0,
        };
        if finished > 0 {
            for (backup, original) in &self.replaced {
                let _ = fs::rename(backup, original);
            }
            self.lock = None;
            return Undo::Kept(finished);
        }
        for f in &self.moved {
            let _ = fs::remove_file(f);
        }
        for (backup, original) in &self.replaced {
            let _ = fs::rename(backup, original);
        }
        if let Some(dir) = &self.dir {
            // Moved aside while still locked, as a commit does.
            let gone = dir.with_file_name(format!(
                "{STAGING}.stale-{}-{}",
                std::process::id(),
                unique()
            ));
            let gone = if fs::rename(dir, &gone).is_ok() {
                gone
            } else {
                dir.clone()
            };
            self.lock = None;
            let _ = fs::remove_dir_all(gone);
        }
        self.lock = None;
        // Only empty directories go: never anything this run did not make.
        for d in &self.created {
            let _ = fs::remove_dir(d);
        }
        Undo::Removed
    }
}

/// What a rollback did.
enum Undo {
    /// The run was over already (committed, or undone before).
    Over,
    /// Everything the run wrote is gone.
    Removed,
    /// A `--resume` run's staging folder stays, with this many finished files.
    Kept(usize),
}

/// Every run in progress in this process, for [`interrupt`].
static ACTIVE: Mutex<Vec<Weak<Mutex<State>>>> = Mutex::new(Vec::new());
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// How many runs of this process have committed.
static COMMITTED: AtomicUsize = AtomicUsize::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A run's leave to write into its staging folder, for what writes there
/// besides [`Staging`] itself (the journal): refused once the run is
/// committed or undone, so nothing is written into a folder being removed.
#[derive(Debug, Clone)]
pub(super) struct Gate(Arc<Mutex<State>>);

impl Gate {
    /// Runs `write` (a write into the staging folder at `what`) unless the
    /// run is over, holding the run's state meanwhile: a rollback waits for
    /// it, and no write starts once a rollback has begun.
    pub(super) fn write<T>(&self, what: &Path, write: impl FnOnce() -> Result<T>) -> Result<T> {
        let state = lock(&self.0);
        state.check_open(what)?;
        write()
    }
}

/// What [`interrupt`] did to the runs in progress.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Interrupted {
    /// Output directories from which everything the run wrote was removed.
    pub removed: Vec<PathBuf>,
    /// `--resume` runs: each output directory, with how many finished
    /// files its staging folder keeps for the next `--resume` run.
    pub kept: Vec<(PathBuf, usize)>,
    /// Runs of this process that had committed before the interruption
    /// (their outputs are whole and stay).
    pub committed: usize,
}

/// Undoes every write in progress in this process (staging folders, files
/// already moved, files set aside by `--force`, directories created) and
/// refuses any later one. For signal handlers: the process should exit
/// right after. A write that already committed stays.
pub fn interrupt() -> Interrupted {
    let runs: Vec<Arc<Mutex<State>>> = {
        let mut active = lock(&ACTIVE);
        INTERRUPTED.store(true, Ordering::SeqCst);
        active.retain(|w| w.strong_count() > 0);
        active.iter().filter_map(Weak::upgrade).collect()
    };
    let mut done = Interrupted::default();
    for run in runs {
        // Waits for a commit under way: a run is undone whole or not at all.
        let mut state = lock(&run);
        match state.rollback() {
            Undo::Removed => done.removed.push(state.out.clone()),
            Undo::Kept(files) => done.kept.push((state.out.clone(), files)),
            Undo::Over => {}
        }
    }
    done.committed = COMMITTED.load(Ordering::SeqCst);
    done
}

/// A staging folder claimed for one run. Dropping it before
/// [`Staging::commit`] undoes the run.
pub(super) struct Staging {
    state: Arc<Mutex<State>>,
    out: PathBuf,
    dir: PathBuf,
    /// The output directory is shared with other `--shards` runs.
    shared: bool,
    /// Files of the same names are replaced (`--force`).
    force: bool,
    /// The output directory must hold nothing else ([`Mode::Fresh`]).
    fresh: bool,
    /// An earlier run's staging folder is taken over, not removed
    /// (`--resume`).
    resume: bool,
    /// The job's key, when known before the run plans ([`Staging::journal`]).
    key: Option<String>,
    /// The name of the finished run's record in the output directory.
    record: String,
}

impl Staging {
    /// Claims a staging folder in `out` as `mode` allows, creating `out` (and
    /// its missing parents) when needed; with `resume`, the one an earlier
    /// run left (interrupted, killed) is taken over with what it holds, and
    /// kept if this run fails too. `key` is the job's when known already:
    /// then a `--resume` run may also find the files of a finished run of
    /// the same job in `out` (its record lists them), and write them again.
    pub(super) fn new(
        out: &Path,
        mode: Mode<'_>,
        resume: bool,
        key: Option<String>,
    ) -> Result<Staging> {
        let state = Arc::new(Mutex::new(State {
            out: out.to_path_buf(),
            keep: resume,
            ..State::default()
        }));
        {
            let mut active = lock(&ACTIVE);
            if INTERRUPTED.load(Ordering::SeqCst) {
                return Err(Error::new(Rule::Cancelled, out, "the run was interrupted"));
            }
            active.push(Arc::downgrade(&state));
        }
        let (dir, record) = match mode {
            Mode::Shared(tag) => (
                out.join(format!("{STAGING}-{tag}")),
                super::journal::record_name(Some(tag)),
            ),
            _ => (out.join(STAGING), super::journal::record_name(None)),
        };
        let staging = Staging {
            state,
            out: out.to_path_buf(),
            dir,
            shared: matches!(mode, Mode::Shared(_)),
            force: mode == Mode::Force,
            fresh: mode == Mode::Fresh,
            resume,
            key,
            record,
        };
        match fs::metadata(out) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => staging.create_out()?,
            Err(e) => return Err(Error::io(out, "cannot use as output directory", e)),
        }
        // The lock first, then what `out` holds, checked under it: a run
        // that checked before claiming could find `out` empty while another
        // run was about to commit into it.
        staging.claim()?;
        if staging.fresh {
            staging.require_empty(true)?;
        }
        Ok(staging)
    }

    /// The output directory.
    pub(super) fn out(&self) -> &Path {
        &self.out
    }

    /// Fails unless `out` holds nothing but what killed runs left (with
    /// `resume`: its staging folder, the files that folder's journal lists,
    /// which a run killed while committing had moved, and the files a
    /// finished run of the same job recorded, with its record).
    /// With `clear`, other staging folders that killed runs left are
    /// removed (and live runs' refused); without (right before commit),
    /// any other staging folder is foreign too.
    fn require_empty(&self, clear: bool) -> Result<()> {
        let entries = fs::read_dir(&self.out)
            .map_err(|e| Error::io(&self.out, "cannot use as output directory", e))?;
        let finished = match (&self.key, self.resume) {
            (Some(key), true) => super::journal::Finished::read(&self.out, &self.record)
                .filter(|f| f.is_of(key))
                .map(|f| (f, key)),
            _ => None,
        };
        // The folder that holds the record (`.cache`).
        let record_top = Path::new(&self.record)
            .components()
            .next()
            .map(|c| c.as_os_str());
        // Read once: `out` may hold thousands of files.
        let listed = match self.resume {
            true => super::journal::listed(&self.dir),
            false => Default::default(),
        };
        let journaled = |name: &std::ffi::OsStr| {
            let recorded = finished.as_ref().is_some_and(|(f, key)| {
                Some(name) == record_top || f.lists(key, &name.to_string_lossy())
            });
            self.resume && (recorded || listed.contains(name.to_string_lossy().as_ref()))
        };
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&self.out, "cannot list", e))?;
            let name = entry.file_name();
            // The record's folder, made by a commit killed before the
            // record was in it.
            let left = Some(name.as_os_str()) == record_top && only_folders(&entry.path());
            if entry.path() == self.dir || journaled(&name) || left {
                continue;
            }
            // Another run setting up or clearing a folder of its own:
            // nothing it will commit.
            let transient = [".new-", ".stale-"].map(|t| format!("{STAGING}{t}"));
            if !clear
                && transient
                    .iter()
                    .any(|t| name.to_string_lossy().starts_with(t.as_str()))
            {
                continue;
            }
            if !clear {
                return Err(Error::new(
                    Rule::Output,
                    entry.path(),
                    "appeared in the output directory while this run wrote; refusing to commit beside it",
                ));
            }
            if !name.to_string_lossy().starts_with(STAGING) {
                return Err(Error::new(
                    Rule::Output,
                    &self.out,
                    "output directory is not empty; refusing to write into it (--force replaces files of the same names)",
                ));
            }
            self.clear_stale(&entry.path())?;
        }
        Ok(())
    }

    /// Creates `out` and its missing parents, recording each first so that an
    /// interruption at any point removes them.
    fn create_out(&self) -> Result<()> {
        let mut state = lock(&self.state);
        state.check_open(&self.out)?;
        let mut p = self.out.as_path();
        while !p.exists() {
            state.created.push(p.to_path_buf());
            match p.parent() {
                Some(q) if !q.as_os_str().is_empty() => p = q,
                _ => break,
            }
        }
        fs::create_dir_all(&self.out)
            .map_err(|e| Error::io(&self.out, "cannot create output directory", e))
    }

    /// Creates the staging folder with its lock held, taking over one that a
    /// killed run left behind.
    fn claim(&self) -> Result<()> {
        loop {
            {
                let mut state = lock(&self.state);
                state.check_open(&self.dir)?;
                // Set up aside and renamed into place whole: the folder
                // never shows without its lock held, or another run could
                // take it for a killed run's and remove it.
                let new =
                    self.out
                        .join(format!("{STAGING}.new-{}-{}", std::process::id(), unique()));
                fs::create_dir(&new).map_err(|e| match self.out.is_dir() {
                    true => Error::io(&new, "cannot create staging folder", e),
                    // A file where the output directory should be: it is
                    // the fault, not the folder that cannot go inside it.
                    false => Error::io(&self.out, "cannot write a checkpoint into it", e),
                })?;
                let path = new.join(LOCK);
                let set_up = File::create(&path).and_then(|mut file| {
                    file.lock()?;
                    // Who holds it, for the message a second run prints.
                    writeln!(file, "{}", std::process::id())?;
                    Ok(file)
                });
                let file = match set_up {
                    Ok(file) => file,
                    Err(e) => {
                        let _ = fs::remove_dir_all(&new);
                        return Err(Error::io(&path, "cannot create", e));
                    }
                };
                match fs::rename(&new, &self.dir) {
                    Ok(()) => {
                        state.dir = Some(self.dir.clone());
                        state.lock = Some(file);
                        return Ok(());
                    }
                    Err(e) => {
                        drop(file);
                        let _ = fs::remove_dir_all(&new);
                        if !self.dir.exists() {
                            return Err(Error::io(&self.dir, "cannot create staging folder", e));
                        }
                    }
                }
                if self.resume {
                    return self.adopt(&mut state);
                }
            }
            self.clear_stale(&self.dir)?;
        }
    }

    /// Takes over the staging folder an earlier run left, unless a live run
    /// holds it: its lock, and the files a killed `--force` commit had set
    /// aside put back.
    fn adopt(&self, state: &mut State) -> Result<()> {
        let path = self.dir.join(LOCK);
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io(&path, "cannot open", e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(self.busy(&file)),
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, "cannot lock", e)),
        }
        file.set_len(0)
            .map_err(|e| Error::io(&path, "cannot write", e))?;
        let _ = writeln!(file, "{}", std::process::id());
        restore_replaced(&self.dir, &self.out);
        let _ = fs::remove_dir_all(self.dir.join(REPLACED));
        state.dir = Some(self.dir.clone());
        state.lock = Some(file);
        Ok(())
    }

    /// The refusal of a staging folder whose lock `file` a live run holds.
    fn busy(&self, file: &File) -> Error {
        let mut pid = String::new();
        let _ = (&*file).read_to_string(&mut pid);
        let pid = pid.trim();
        let who = if pid.is_empty() {
            "another wgpu-dequant run".to_string()
        } else {
            format!("another wgpu-dequant run (pid {pid})")
        };
        Error::new(
            Rule::Output,
            &self.out,
            format!("{who} is writing here; wait for it to finish or choose another directory"),
        )
    }

    /// Removes `path`, a folder this tool left in the output directory, unless
    /// a live run owns it: then refuses, naming it.
    fn clear_stale(&self, path: &Path) -> Result<()> {
        let lock_path = path.join(LOCK);
        let since = Instant::now();
        let held = loop {
            match File::options().read(true).write(true).open(&lock_path) {
                Ok(f) => break Some(f),
                // A folder being set up gets its lock file at once; one without
                // it after that was left by a run killed at that moment, by an
                // older version, or is a takeover's leftover.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if !path.exists() {
                        return Ok(());
                    }
                    if since.elapsed() > SETUP_GRACE || !is_staging_name(path) {
                        break None;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(Error::io(&lock_path, "cannot open", e)),
            }
        };
        if let Some(file) = &held {
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => return Err(self.busy(file)),
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(Error::io(&lock_path, "cannot lock", e))
                }
            }
            // The lock is ours: its owner is gone. Make sure the folder still
            // holds this very lock file (another run may have taken it over
            // and started afresh in between), then move it out of the way
            // while holding the lock, so no one else takes it over too.
            if !same_file(file, &lock_path) {
                return Ok(());
            }
        }
        if self.fresh && !self.resume {
            self.refuse_unfinished_commit(path)?;
        }
        let aside = self.out.join(format!(
            "{STAGING}.stale-{}-{}",
            std::process::id(),
            unique()
        ));
        match fs::rename(path, &aside) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(path, "cannot remove stale staging folder", e)),
        }
        drop(held);
        restore_replaced(&aside, &self.out);
        fs::remove_dir_all(&aside)
            .map_err(|e| Error::io(&aside, "cannot remove stale staging folder", e))
    }

    /// Refuses to remove `stale`, the staging folder of a run killed while
    /// it committed (files its journal lists are in the output directory
    /// already): only `--resume` can finish that output, and it needs the
    /// folder.
    fn refuse_unfinished_commit(&self, stale: &Path) -> Result<()> {
        let listed = super::journal::listed(stale);
        let moved = listed
            .iter()
            .filter(|name| self.out.join(name).is_file())
            .count();
        if moved == 0 {
            return Ok(());
        }
        let s = if moved == 1 { "" } else { "s" };
        Err(Error::new(
            Rule::Output,
            &self.out,
            format!(
                "holds {moved} file{s} of a run stopped while it moved its output into place; \
                 run again with --resume to finish it (or --force to start over)"
            ),
        ))
    }

    /// The run's journal, for the job of key `key` (unless the staging
    /// folder was given one): for a `--resume` run, what an earlier run of
    /// that job finished.
    pub(super) fn journal(&self, key: impl FnOnce() -> String) -> Result<super::Journal> {
        let key = self.key.clone().unwrap_or_else(key);
        let gate = Gate(self.state.clone());
        let journal = super::Journal::open(&self.dir, &key, self.resume, gate);
        // What the journal does not list is another job's, or was cut off
        // mid-write: it would be committed with the rest.
        let entries =
            fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, "cannot list", e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&self.dir, "cannot list", e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let ours =
                name == LOCK || name == REPLACED || name.starts_with(super::journal::JOURNAL);
            if !ours && !journal.lists(&name) {
                let path = entry.path();
                fs::remove_file(&path).map_err(|e| Error::io(&path, "cannot remove", e))?;
            }
        }
        Ok(journal)
    }

    /// Creates file `name` in the staging folder.
    pub(super) fn create(&self, name: &str) -> Result<(PathBuf, File)> {
        let path = self.dir.join(name);
        let state = lock(&self.state);
        state.check_open(&path)?;
        let f = File::create(&path).map_err(|e| Error::io(&path, "cannot create", e))?;
        Ok((path, f))
    }

    /// Copies file `from` into the staging folder as `name`.
    pub(super) fn copy_in(&self, from: &Path, name: &str) -> Result<()> {
        let state = lock(&self.state);
        state.check_open(from)?;
        fs::copy(from, self.dir.join(name)).map_err(|e| Error::io(from, "cannot copy", e))?;
        Ok(())
    }

    /// Moves every staged file into the output directory and returns their
    /// paths, sorted; last, the record of the finished run (what `journal`
    /// lists, and `summary`). In a shared directory, weights and index parts
    /// must be new, and the files every part writes alike (config.json, side
    /// files) are kept when present. Holds the state for the whole move, so
    /// an interruption undoes all of it or none.
    pub(super) fn commit(
        self,
        owned: impl Fn(&Path) -> bool,
        journal: &super::Journal,
        summary: &super::Summary,
    ) -> Result<Vec<PathBuf>> {
        let record_to = self.out.join(&self.record);
        let owned = |p: &Path| owned(p) || p == record_to;
        let mut staged = Vec::new();
        let entries =
            fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, "cannot list", e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&self.dir, "cannot list", e))?;
            let name = entry.file_name();
            if name != LOCK
                && name != REPLACED
                && !name.to_string_lossy().starts_with(super::journal::JOURNAL)
            {
                staged.push((entry.path(), self.out.join(name)));
            }
        }
        // Every file is journaled before anything moves (config, tokenizer
        // and side files too, not only weights), so a run killed at any
        // rename leaves an output that `--resume` recognizes as its own.
        // Through the journal's own leave to write (the state is not held
        // yet): an interruption meanwhile refuses the rest.
        for (from, _) in &staged {
            let name = from.file_name().unwrap_or_default().to_string_lossy();
            if !journal.lists(&name) {
                journal.record_file(&name, from)?;
            }
        }
        let mut state = lock(&self.state);
        state.check_open(&self.dir)?;
        if self.fresh {
            // Once more, under the lock: a run that ignores it (or a
            // `--shards` job, with a staging folder of its own) may have
            // written here since this run claimed `out`.
            self.require_empty(false)?;
        }
        if self.shared {
            if let Some((_, to)) = staged.iter().find(|(_, to)| owned(to) && to.exists()) {
                return Err(Error::new(
                    Rule::Output,
                    to,
                    "already written by another run; refusing to replace it",
                ));
            }
            staged.retain(|(_, to)| owned(to) || !to.exists());
        }
        // The record goes last: once it is in place, so is everything else.
        staged.sort();
        let paths: Vec<PathBuf> = staged.iter().map(|(from, _)| from.clone()).collect();
        let record = self.dir.join(record_to.file_name().unwrap_or_default());
        let mut f = File::create(&record).map_err(|e| Error::io(&record, "cannot create", e))?;
        f.write_all(&journal.finished(&paths, summary)?)
            .and_then(|()| f.sync_all())
            .map_err(|e| Error::io(&record, "cannot write", e))?;
        self.create_record_dir(&mut state)?;
        staged.push((record, record_to.clone()));
        if let Some((_, to)) = staged.iter().find(|(_, to)| to.is_dir()) {
            return Err(Error::new(
                Rule::Output,
                to,
                "is a directory; only files are ever replaced",
            ));
        }
        if self.force {
            // Set what is replaced aside, to be put back if anything fails.
            let aside = self.dir.join(REPLACED);
            for (_, to) in staged.iter().filter(|(_, to)| to.exists()) {
                if state.replaced.is_empty() {
                    fs::create_dir(&aside).map_err(|e| Error::io(&aside, "cannot create", e))?;
                }
                let backup = aside.join(to.file_name().unwrap_or_default());
                fs::rename(to, &backup).map_err(|e| Error::io(to, "cannot set aside", e))?;
                state.replaced.push((backup, to.clone()));
            }
        }
        for (from, to) in staged {
            fs::rename(&from, &to).map_err(|e| Error::io(&to, "cannot move into place", e))?;
            state.moved.push(to);
        }
        // Moved aside while still locked: once the lock is let go, another
        // run may claim a staging folder of this name.
        let gone = self.out.join(format!(
            "{STAGING}.stale-{}-{}",
            std::process::id(),
            unique()
        ));
        fs::rename(&self.dir, &gone).map_err(|e| Error::io(&self.dir, "cannot remove", e))?;
        state.lock = None;
        state.finished = true;
        COMMITTED.fetch_add(1, Ordering::SeqCst);
        fs::remove_dir_all(&gone).map_err(|e| Error::io(&gone, "cannot remove", e))?;
        let mut moved = std::mem::take(&mut state.moved);
        moved.pop();
        Ok(moved)
    }
}

impl Staging {
    /// Creates the folder of the record ([`RECORD_DIR`](super::journal::RECORD_DIR))
    /// in the output directory, recording what it creates so that undoing
    /// the run removes it (when empty).
    fn create_record_dir(&self, state: &mut State) -> Result<()> {
        let dir = self.out.join(super::journal::RECORD_DIR);
        let mut missing = Vec::new();
        let mut p = dir.as_path();
        while p.starts_with(&self.out) && p != self.out && !p.exists() {
            missing.push(p.to_path_buf());
            match p.parent() {
                Some(q) => p = q,
                None => break,
            }
        }
        // Deepest first, before the output directory and its parents.
        for (i, d) in missing.into_iter().enumerate() {
            state.created.insert(i, d);
        }
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "cannot create", e))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        lock(&self.state).rollback();
        lock(&ACTIVE).retain(|w| w.strong_count() > 0 && !w.ptr_eq(&Arc::downgrade(&self.state)));
    }
}

/// Whether `dir` holds nothing but empty folders.
fn only_folders(dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    entries
        .flatten()
        .all(|e| e.file_type().is_ok_and(|t| t.is_dir()) && only_folders(&e.path()))
}

/// Whether `path` is a staging folder's own name (not a takeover's leftover).
fn is_staging_name(path: &Path) -> bool {
    path.file_name().is_some_and(|n| {
        !n.to_string_lossy()
            .starts_with(&format!("{STAGING}.stale-"))
    })
}

/// Whether the open `file` is the file at `path`.
fn same_file(file: &File, path: &Path) -> bool {
    let (Ok(held), Ok(there)) = (
        file.try_clone().and_then(same_file::Handle::from_file),
        same_file::Handle::from_path(path),
    ) else {
        return false;
    };
    held == there
}

/// A number no other call in this process returns.
fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Puts back the files a killed `--force` run had set aside in `stale`, so an
/// interrupted replacement leaves the originals.
fn restore_replaced(stale: &Path, out: &Path) {
    let Ok(entries) = fs::read_dir(stale.join(REPLACED)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let to = match super::journal::is_record_file(&name.to_string_lossy()) {
            true => out.join(super::journal::RECORD_DIR).join(name),
            false => out.join(name),
        };
        let _ = fs::rename(entry.path(), to);
    }
}

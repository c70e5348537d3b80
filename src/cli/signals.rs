//! Interruption: Ctrl-C, a kill or a closed terminal undoes the run in
//! progress ([`wgpu_dequant::interrupt`]) before the process ends, so
//! nothing half-written is left behind. Each platform has its own way of
//! being told; what is done is the same: one line saying what was undone,
//! then the process ends as the signal would have ended it.

use std::sync::atomic::{AtomicU8, Ordering};

use wgpu_dequant::Interrupted;

/// Where the handling of an interruption stands, for [`settle`].
static STAGE: AtomicU8 = AtomicU8::new(CALM);
const CALM: u8 = 0;
/// Told, and undoing the run.
const UNDOING: u8 = 1;
/// The run had committed: the process ends as it would have.
const FINISHED: u8 = 2;

/// Starts listening; returns an error message when the platform refuses.
pub(super) fn install() -> Result<(), String> {
    platform::install()
}

/// For the commands that only print (`inspect`, `validate`): a reader that
/// goes away (`| head`) ends the process quietly, as it ends `cat`, instead
/// of a panic on the failed print. Rust starts with SIGPIPE ignored; a run
/// that writes an output keeps it so (its own error path undoes the run).
pub(super) fn quiet_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: called before any thread that prints exists; setting a
    // signal's disposition to its default touches no Rust state.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Called by the main thread before it reports how the run ended: once an
/// interruption was told, the run's own ending (a CANCEL-001 its workers
/// met, or a success that raced it) must not come first. Waits for the
/// handler; returns only when the run committed before the interruption
/// (its output stays, and so does its exit status). Otherwise the handler
/// ends the process.
pub(super) fn settle() {
    loop {
        match STAGE.load(Ordering::SeqCst) {
            CALM | FINISHED => return,
            _ => std::thread::park_timeout(std::time::Duration::from_millis(50)),
        }
    }
}

/// What the handler does once told, on every platform: undo, then say
/// which in one line. Returns whether the process should end by the
/// interruption (false: the run committed first and ends as it would).
fn undo(signal: &str) -> bool {
    STAGE.store(UNDOING, Ordering::SeqCst);
    let undone = wgpu_dequant::interrupt();
    if undone.removed.is_empty() && undone.kept.is_empty() && undone.committed > 0 {
        STAGE.store(FINISHED, Ordering::SeqCst);
        return false;
    }
    let line = told(signal, &undone);
    match super::events::on() {
        true => super::events::interrupted(signal, &undone, &line),
        false => eprintln!("{line}"),
    }
    true
}

/// The line an interrupted run ends with.
fn told(signal: &str, undone: &Interrupted) -> String {
    let mut said = Vec::new();
    for out in &undone.removed {
        said.push(format!("removed what this run wrote in {}", out.display()));
    }
    for (out, files) in &undone.kept {
        let s = if *files == 1 { "" } else { "s" };
        said.push(format!(
            "kept {files} finished file{s} in {}; run again with --resume to finish",
            out.display()
        ));
    }
    match said.is_empty() {
        true => format!("interrupted by {signal}: nothing was written"),
        false => format!("interrupted by {signal}: {}", said.join("; ")),
    }
}

#[cfg(unix)]
mod platform {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    use signal_hook::iterator::Signals;

    pub(super) fn install() -> Result<(), String> {
        let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP]).map_err(|e| e.to_string())?;
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                if let Some(signal) = signals.forever().next() {
                    let name = match signal {
                        SIGINT => "SIGINT",
                        SIGTERM => "SIGTERM",
                        _ => "SIGHUP",
                    };
                    if !super::undo(name) {
                        return;
                    }
                    // Die of the signal itself, as an uncaught one would: the
                    // parent sees it, and shells report 128 + its number.
                    let _ = signal_hook::low_level::emulate_default_handler(signal);
                    std::process::exit(128 + signal);
                }
            })
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

#[cfg(windows)]
mod platform {
    /// What a console process ended by Ctrl-C exits with (STATUS_CONTROL_C_EXIT).
    const CONTROL_C_EXIT: i32 = 0xC000_013A_u32 as i32;

    pub(super) fn install() -> Result<(), String> {
        // Ctrl-C, Ctrl-Break and the console window closing.
        ctrlc::set_handler(|| {
            if super::undo("Ctrl-C") {
                std::process::exit(CONTROL_C_EXIT);
            }
        })
        .map_err(|e| e.to_string())
    }
}

#[cfg(not(any(unix, windows)))]
mod platform {
    /// No signals to listen to here (e.g. WASI): a killed run is cleaned up
    /// by the next one, which finds its staging folder unlocked.
    pub(super) fn install() -> Result<(), String> {
        Ok(())
    }
}

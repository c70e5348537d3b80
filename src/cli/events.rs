//! `dequantize --json`'s stderr: one JSON object a line, each with its
//! `event` (`start`, `progress`, `download`, `warning`, `note`, `resumed`,
//! `interrupted`, `error`), so that a program can follow the run without
//! reading prose. stdout keeps the summary alone.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use wgpu_dequant::{Download, Error, Finding, Interrupted, Progress};

/// Set once a `--json` run starts: the interruption's line and the error's
/// become events too.
static ON: AtomicBool = AtomicBool::new(false);

/// Progress and downloads are told at most this often, and once at the end.
const EVERY: Duration = Duration::from_millis(250);

/// From here on, what the process tells on stderr is events.
pub(super) fn switch_on() {
    ON.store(true, Ordering::SeqCst);
}

/// Whether stderr carries events.
pub(super) fn on() -> bool {
    ON.load(Ordering::SeqCst)
}

/// Writes `event` (an object) as one line, whole: lines from other threads
/// (the signal handler's, the downloads') never interleave with it.
pub(super) fn emit(event: &str, fields: Value) {
    let mut object = serde_json::Map::new();
    object.insert("event".into(), event.into());
    if let Value::Object(map) = fields {
        object.extend(map);
    }
    let mut line = Value::Object(object).to_string();
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// An error as an event, when events are on; whether it was told.
pub(super) fn error(e: &Error) -> bool {
    if on() {
        emit("error", json!(Finding::from(e)));
    }
    on()
}

/// An interruption as an event: what was removed and kept, and the line a
/// person would have read (`message`).
pub(super) fn interrupted(signal: &str, undone: &Interrupted, message: &str) {
    let kept: Vec<Value> = (undone.kept.iter())
        .map(|(out, files)| json!({"out": out.display().to_string(), "files": files}))
        .collect();
    let removed: Vec<String> = (undone.removed.iter())
        .map(|out| out.display().to_string())
        .collect();
    emit(
        "interrupted",
        json!({"signal": signal, "removed": removed, "kept": kept, "message": message}),
    );
}

/// The throttled events: progress of the writing and of a Hub run's
/// downloads, each told at most every [`EVERY`], the last state of each
/// told at [`Throttled::finish`] if it was held back.
#[derive(Default)]
pub(super) struct Throttled {
    progress: Mutex<Held>,
    download: Mutex<Held>,
}

/// One kind of throttled event: when it was last told, the newest one
/// held back since, and the last one offered.
#[derive(Default)]
struct Held {
    told: Option<Instant>,
    pending: Option<Value>,
    last: Option<Value>,
}

impl Held {
    /// Tells `fields` now, or holds it until the next one or the end
    /// (`last`: now); the same figures again are not told twice.
    fn offer(&mut self, event: &str, fields: Value, last: bool) {
        if self.last.as_ref() == Some(&fields) {
            return;
        }
        self.last = Some(fields.clone());
        if last || self.told.is_none_or(|t| t.elapsed() >= EVERY) {
            self.told = Some(Instant::now());
            self.pending = None;
            emit(event, fields);
        } else {
            self.pending = Some(fields);
        }
    }

    fn flush(&mut self, event: &str) {
        if let Some(fields) = self.pending.take() {
            emit(event, fields);
        }
    }
}

fn lock(held: &Mutex<Held>) -> std::sync::MutexGuard<'_, Held> {
    held.lock().unwrap_or_else(|e| e.into_inner())
}

impl Throttled {
    pub(super) fn progress(&self, p: &Progress<'_>) {
        let fields = json!({
            "done_bytes": p.done_bytes,
            "total_bytes": p.total_bytes,
            "done_tensors": p.done_tensors,
            "total_tensors": p.total_tensors,
            "tensor": p.tensor,
        });
        let last = p.done_bytes == p.total_bytes && p.done_tensors == p.total_tensors;
        lock(&self.progress).offer("progress", fields, last);
        if let Some(d) = p.download {
            self.download(&d);
        }
    }

    pub(super) fn download(&self, d: &Download) {
        let fields = json!({"done_bytes": d.done_bytes, "total_bytes": d.total_bytes});
        let last = d.done_bytes == d.total_bytes;
        lock(&self.download).offer("download", fields, last);
    }

    /// Tells what was held back.
    pub(super) fn finish(&self) {
        lock(&self.download).flush("download");
        lock(&self.progress).flush("progress");
    }
}

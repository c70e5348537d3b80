//! `dequantize`: the run, what it tells while it works (prose, or with
//! `--json` events on stderr: `events.rs`) and its summary.

use std::path::Path;

use serde_json::json;
use wgpu_dequant::{Dequantize, Error, Note, Summary};

use super::meter::{megabytes, Meter};
use super::{events, plural, print_json};

/// Runs `run` from `path` into `out`; with `json` the summary goes to
/// stdout and everything else to stderr as events.
pub(super) fn dequantize(
    path: &Path,
    out: &Path,
    run: Dequantize<'_>,
    quiet: bool,
    json: bool,
) -> Result<u8, Error> {
    if json {
        events::switch_on();
    }
    let meter = Meter::new(quiet, json);
    let summary = run
        .on_note(|note| tell(note, path, out, quiet, json, &meter))
        .on_progress(|p| meter.update(p))
        .on_download(|d| meter.downloaded(d))
        .run(path, out);
    meter.finish();
    let summary = summary?;
    if summary.already_done && !quiet {
        let line = format!(
            "{} already holds this job's {}, of the bytes its record lists; nothing left to do",
            out.display(),
            plural(summary.files.len(), "file")
        );
        match json {
            true => events::emit("note", json!({ "text": line })),
            false => eprintln!("{line}"),
        }
    } else if !quiet && !json {
        said(&summary, out);
    }
    if json {
        print_json(&summary)?;
    }
    Ok(0)
}

/// Tells `note` as a line, or with `json` as an event; with `quiet`,
/// warnings alone.
fn tell(note: Note<'_>, path: &Path, out: &Path, quiet: bool, json: bool, meter: &Meter) {
    match note {
        Note::Warning(w) if json => events::emit("warning", json!(w)),
        Note::Warning(w) => meter.println(&format!("warning: {w}")),
        _ if quiet => {}
        Note::Start {
            format_kind,
            format,
            backend_kind,
            backend,
            ..
        } if json => events::emit(
            "start",
            json!({"format": format_kind, "format_detail": format,
                   "backend": backend_kind, "backend_detail": backend}),
        ),
        Note::Start {
            format, backend, ..
        } => meter.println(&format!("{}: {format}; backend {backend}", path.display())),
        Note::Text(text) if json => events::emit("note", json!({"text": text})),
        Note::Text(text) => meter.println(&format!("note: {text}")),
        Note::Resumed { kept, left } if json => events::emit(
            "resumed",
            json!({"out": out.display().to_string(), "kept": kept, "left": left}),
        ),
        Note::Resumed { kept, left } => meter.println(&format!(
            "resuming {}: {} kept (checked against their BLAKE3 digests), {left} to write",
            out.display(),
            plural(kept, "finished file"),
        )),
        // `Note` is non-exhaustive: notes added later print nothing here.
        #[allow(unreachable_patterns)]
        _ => {}
    }
}

/// The lines a finished run ends with.
fn said(summary: &Summary, out: &Path) {
    let secs = summary.seconds;
    let cast = if summary.cast > 0 {
        format!(
            " ({} cast to {})",
            plural(summary.cast, "tensor"),
            summary.dtype
        )
    } else {
        String::new()
    };
    eprintln!(
        "wrote {}: {} decoded to {} (from {} of packs and scales), {} copied{cast}; {} in {:.2} s ({}/s)",
        out.display(),
        plural(summary.decoded, "tensor"),
        summary.dtype,
        plural(summary.consumed, "tensor"),
        summary.copied,
        megabytes(summary.tensor_bytes as f64),
        secs,
        megabytes(summary.tensor_bytes as f64 / secs.max(1e-9)),
    );
    if let Some(f) = &summary.fetched {
        eprintln!(
            "from the Hub: {} downloaded, {} found in the cache, {} removed again (at most {} held at once)",
            plural(f.downloaded.len(), "shard"),
            f.reused.len(),
            f.deleted.len(),
            megabytes(f.peak_bytes as f64),
        );
    }
}

//! Progress for long runs and the byte counts people read.

use std::time::Instant;

use wgpu_dequant::{Download, Progress};

use super::events::Throttled;
use super::plural;

/// Bytes for people, in decimal units as everywhere in this tool's output.
pub(super) fn megabytes(bytes: f64) -> String {
    if bytes >= 1e9 {
        format!("{:.2} GB", bytes / 1e9)
    } else {
        format!("{:.1} MB", bytes / 1e6)
    }
}

/// Progress for long runs: a bar on a terminal, a plain line every few
/// seconds otherwise, JSON lines with `--json` (`events.rs`), nothing with
/// `--quiet`; the decoding's bytes, and a Hub run's downloads beside them
/// (told from another thread).
pub(super) struct Meter {
    events: Option<Throttled>,
    bar: Option<indicatif::ProgressBar>,
    plain: bool,
    started: Instant,
    seen: std::sync::Mutex<Seen>,
}

/// What the meter was last told.
struct Seen {
    last_line: Instant,
    /// Bytes written, of how many; tensors written, of how many.
    decode: (u64, u64, usize, usize),
    download: Option<Download>,
    /// When the first downloaded bytes were seen (the rate's start).
    download_started: Option<Instant>,
}

impl Meter {
    pub(super) fn new(quiet: bool, json: bool) -> Meter {
        use std::io::IsTerminal;
        let terminal = std::io::stderr().is_terminal();
        // Prose (a bar, plain lines) unless quiet or told in JSON.
        let prose = !quiet && !json;
        let bar = (prose && terminal).then(|| {
            let bar = indicatif::ProgressBar::new(0);
            // Decimal units, as in the summary; the bar takes what width is left.
            let style = indicatif::ProgressStyle::with_template(
                "{wide_bar} {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} eta {eta} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        });
        Meter {
            events: (json && !quiet).then(Throttled::default),
            bar,
            plain: prose && !terminal,
            started: Instant::now(),
            seen: std::sync::Mutex::new(Seen {
                last_line: Instant::now(),
                decode: (0, 0, 0, 0),
                download: None,
                download_started: None,
            }),
        }
    }

    /// A line above the bar (or just a line).
    pub(super) fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }

    pub(super) fn update(&self, p: &Progress<'_>) {
        if let Some(events) = &self.events {
            return events.progress(p);
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.decode = (p.done_bytes, p.total_bytes, p.done_tensors, p.total_tensors);
        if let Some(d) = p.download {
            self.note_download(&mut seen, d);
        }
        self.show(&mut seen);
    }

    pub(super) fn downloaded(&self, d: &Download) {
        if let Some(events) = &self.events {
            return events.download(d);
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        self.note_download(&mut seen, *d);
        self.show(&mut seen);
    }

    fn note_download(&self, seen: &mut Seen, d: Download) {
        if d.done_bytes > 0 && seen.download_started.is_none() {
            seen.download_started = Some(Instant::now());
        }
        seen.download = Some(d);
    }

    /// The downloads' part of a line: bytes, rate and time left.
    fn download_text(seen: &Seen) -> Option<String> {
        let d = seen.download.filter(|d| d.total_bytes > 0)?;
        let secs = seen
            .download_started
            .map_or(0.0, |t| t.elapsed().as_secs_f64());
        let rate = d.done_bytes as f64 / secs.max(1e-9);
        let left = d.total_bytes.saturating_sub(d.done_bytes);
        let eta = if left == 0 {
            "done".to_string()
        } else if rate > 0.0 && secs > 0.0 {
            format!("{:.0} s left", left as f64 / rate)
        } else {
            "starting".to_string()
        };
        Some(format!(
            "download {} of {} at {}/s, {eta}",
            megabytes(d.done_bytes as f64),
            megabytes(d.total_bytes as f64),
            megabytes(if secs > 0.0 { rate } else { 0.0 }),
        ))
    }

    fn show(&self, seen: &mut Seen) {
        let (done, total, done_tensors, total_tensors) = seen.decode;
        let tensors = format!("{done_tensors}/{}", plural(total_tensors, "tensor"));
        let download = Meter::download_text(seen);
        if let Some(bar) = &self.bar {
            bar.set_length(total);
            bar.set_position(done);
            bar.set_message(match download {
                Some(d) => format!("{tensors}; {d}"),
                None => tensors,
            });
        } else if self.plain && seen.last_line.elapsed().as_secs_f64() >= 5.0 {
            seen.last_line = Instant::now();
            let secs = self.started.elapsed().as_secs_f64();
            let rate = done as f64 / secs.max(1e-9);
            let left = total.saturating_sub(done) as f64 / rate.max(1.0);
            let download = download.map_or(String::new(), |d| format!("; {d}"));
            eprintln!(
                "progress: {:.0}% ({} of {}, {tensors}, {}/s, {:.0} s left){download}",
                100.0 * done as f64 / total.max(1) as f64,
                megabytes(done as f64),
                megabytes(total as f64),
                megabytes(rate),
                left
            );
        }
    }

    pub(super) fn finish(&self) {
        if let Some(events) = &self.events {
            events.finish();
        }
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

//! `inspect`'s totals block: how many parameters, how many bytes read and
//! written, which files, how much room where the output would go, and
//! which transformers class loads it.

use std::fmt::Write as _;

use super::Report;
use crate::plural::plural;
use crate::writer::human;

/// File names shown before the rest is counted.
const FILES_SHOWN: usize = 8;

/// Writes the totals of `r` into `s`, a line each, aligned with the
/// report's other lines; a failed report has none.
pub(super) fn write(s: &mut String, r: &Report) {
    if let Some(n) = r.parameters {
        let short = match n {
            0..1_000 => String::new(),
            _ => format!(" ({})", count(n)),
        };
        let _ = writeln!(s, "parameters  {n}{short}");
    }
    if let Some(bytes) = r.input_bytes {
        let n = r.shards.len();
        let _ = writeln!(s, "reads       {} ({})", human(bytes), plural(n, "file"));
    }
    if let (Some(bytes), Some(files)) = (r.output_bytes, &r.files) {
        let mut names = files.iter().take(FILES_SHOWN).cloned().collect::<Vec<_>>();
        if files.len() > FILES_SHOWN {
            names.push(format!("and {} more", files.len() - FILES_SHOWN));
        }
        let _ = writeln!(
            s,
            "writes      {} of tensors; {}: {}",
            human(bytes),
            plural(files.len(), "file"),
            names.join(", ")
        );
    }
    if r.free_bytes.is_some() || r.output_bytes.is_some() {
        let free = match r.free_bytes {
            Some(free) => format!("{} where the output would go", human(free)),
            None => "not known where the output would go".to_string(),
        };
        let _ = writeln!(s, "free        {free}");
    }
    if let Some(class) = &r.architecture {
        let _ = writeln!(s, "class       {class} (transformers)");
    }
}

/// A count for people, in decimal units (`1.24 B`).
fn count(n: u64) -> String {
    let x = n as f64;
    match n {
        0..1_000_000 => format!("{:.1} K", x / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} M", x / 1e6),
        _ => format!("{:.2} B", x / 1e9),
    }
}

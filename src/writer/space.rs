//! The free-space preflight every run makes before it decodes anything:
//! what it will write (and, from the Hub, download) on each file system,
//! against what that file system has free, so that a run that cannot fit
//! is refused at once instead of hours in.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result, Rule};

/// Caps the free space the preflight assumes on every file system it checks:
/// for quotas that the file system's own figure does not show.
pub const FREE_SPACE_VAR: &str = "WGPU_DEQUANT_FREE_SPACE";

/// Bytes a run puts under a path.
#[derive(Debug, Clone)]
pub(crate) struct Need {
    /// What they are, for people: "the dense checkpoint", "the downloads".
    pub(crate) what: &'static str,
    /// Where they go (it need not exist yet).
    pub(crate) at: PathBuf,
    pub(crate) bytes: u64,
}

/// Refuses (`OUT-001`) when the needs on one file system add up to more
/// than it has free, naming what, both sizes and the file system's mount
/// point; `refused` names the file the error is about. Returns a line for
/// each file system whose free space cannot be read (the run goes on).
pub(crate) fn check(refused: &Path, needs: &[Need]) -> Result<Vec<String>> {
    check_with(refused, needs, cap()?, available)
}

/// [`check`] with the cap and the file systems' free space given.
fn check_with(
    refused: &Path,
    needs: &[Need],
    cap: Option<u64>,
    available: impl Fn(&Path) -> Option<u64>,
) -> Result<Vec<String>> {
    // (an existing folder on the file system, its needs)
    let mut systems: Vec<(PathBuf, Vec<&Need>)> = Vec::new();
    for need in needs.iter().filter(|n| n.bytes > 0) {
        let Some(at) = existing(&need.at) else {
            continue;
        };
        match systems.iter_mut().find(|(p, _)| same_device(p, &at)) {
            Some((_, group)) => group.push(need),
            None => systems.push((at, vec![need])),
        }
    }
    let mut notes = Vec::new();
    for (at, group) in systems {
        let bytes: u64 = group.iter().map(|n| n.bytes).sum();
        let what: Vec<&str> = group.iter().map(|n| n.what).collect();
        let what = what.join(" and ");
        let mount = mount_point(&at);
        let (free, capped) = match (available(&at), cap) {
            (Some(free), Some(cap)) => (free.min(cap), cap < free),
            (Some(free), None) => (free, false),
            (None, Some(cap)) => (cap, true),
            (None, None) => {
                notes.push(format!(
                    "the free space of the file system at {} cannot be read; not checked that {what} ({}) fit",
                    mount.display(),
                    human(bytes)
                ));
                continue;
            }
        };
        if bytes > free {
            let verb = if group.len() > 1 { "need" } else { "needs" };
            return Err(Error::new(
                Rule::Output,
                refused,
                format!(
                    "{what} {verb} {}, and the file system mounted at {} has {} free{}; nothing was written",
                    human(bytes),
                    mount.display(),
                    human(free),
                    if capped { format!(" (as {FREE_SPACE_VAR} says)") } else { String::new() }
                ),
            ));
        }
    }
    Ok(notes)
}

/// The free space a run writing into `out` would be checked against: that
/// of the file system of `out`'s nearest existing ancestor, as [`check`]
/// reads it (capped by [`FREE_SPACE_VAR`], a bad value of which is left to
/// the run to refuse). `None` when it cannot be read.
pub(crate) fn free(out: &Path) -> Option<u64> {
    let at = existing(out)?;
    let cap = cap().ok().flatten();
    match (available(&at), cap) {
        (Some(free), Some(cap)) => Some(free.min(cap)),
        (free, cap) => free.or(cap),
    }
}

/// The cap [`FREE_SPACE_VAR`] sets, if any.
fn cap() -> Result<Option<u64>> {
    match std::env::var(FREE_SPACE_VAR) {
        Ok(v) => super::parse_size(&v)
            .map(Some)
            .map_err(|e| Error::bare(Rule::Argument, format!("{FREE_SPACE_VAR}: {}", e.detail))),
        Err(_) => Ok(None),
    }
}

/// `p` or its nearest existing ancestor (what a run will create lies on
/// that one's file system).
fn existing(p: &Path) -> Option<PathBuf> {
    let p = std::path::absolute(p).ok()?;
    p.ancestors().find(|a| a.exists()).map(Path::to_path_buf)
}

/// Free bytes for an unprivileged writer of the file system holding `p`.
#[cfg(not(target_arch = "wasm32"))]
fn available(p: &Path) -> Option<u64> {
    fs4::available_space(p).ok()
}

#[cfg(target_arch = "wasm32")]
fn available(_: &Path) -> Option<u64> {
    None
}

/// The mount point of the file system holding the existing path `p`: its
/// highest ancestor on the same device.
fn mount_point(p: &Path) -> PathBuf {
    let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let mut top = p.as_path();
    for a in p.ancestors().skip(1) {
        if !same_device(a, top) {
            break;
        }
        top = a;
    }
    top.to_path_buf()
}

/// Whether two existing paths lie on one file system.
#[cfg(unix)]
pub(crate) fn same_device(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    matches!((std::fs::metadata(a), std::fs::metadata(b)), (Ok(x), Ok(y)) if x.dev() == y.dev())
}

/// Whether two existing paths lie on one file system (the same drive).
#[cfg(not(unix))]
pub(crate) fn same_device(a: &Path, b: &Path) -> bool {
    a.components().next() == b.components().next()
}

/// Bytes for people, in the decimal units of the tool's other lines.
pub(crate) fn human(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..1_000 => format!("{bytes} B"),
        1_000..1_000_000 => format!("{:.1} kB", b / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} MB", b / 1e6),
        1_000_000_000..1_000_000_000_000 => format!("{:.2} GB", b / 1e9),
        _ => format!("{:.2} TB", b / 1e12),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_decimal_units() {
        assert_eq!(human(999), "999 B");
        assert_eq!(human(64_000_000), "64.0 MB");
        assert_eq!(human(536_870_912), "536.9 MB");
        assert_eq!(human(1_500_000_000), "1.50 GB");
        assert_eq!(human(700_000_000_000_000), "700.00 TB");
    }

    fn need(bytes: u64) -> Need {
        Need {
            what: "the dense checkpoint",
            at: std::env::temp_dir().join("out"),
            bytes,
        }
    }

    #[test]
    fn a_free_space_that_cannot_be_read_is_one_note_and_no_refusal() {
        let out = Path::new("out");
        let notes = check_with(out, &[need(u64::MAX)], None, |_| None).unwrap();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("cannot be read"), "{notes:?}");
        // A cap stands in for it.
        let e = check_with(out, &[need(2_000_000)], Some(1_000_000), |_| None).unwrap_err();
        assert!(
            e.to_string().contains("2.0 MB") && e.to_string().contains("1.0 MB"),
            "{e}"
        );
        // Nothing to write checks nothing.
        assert!(check_with(out, &[need(0)], None, |_| None)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn needs_on_one_file_system_add_up() {
        let out = Path::new("out");
        let two = [
            need(600),
            Need {
                what: "the downloads",
                ..need(600)
            },
        ];
        let e = check_with(out, &two, None, |_| Some(1000)).unwrap_err();
        assert!(
            e.to_string()
                .contains("the dense checkpoint and the downloads need 1.2 kB"),
            "{e}"
        );
        assert!(check_with(out, &two[..1], None, |_| Some(1000))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn the_mount_point_is_the_highest_folder_on_the_device() {
        let tmp = std::env::temp_dir();
        let m = mount_point(&tmp);
        assert!(same_device(&m, &tmp));
        assert!(m.parent().is_none_or(|p| !same_device(p, &m)));
    }
}

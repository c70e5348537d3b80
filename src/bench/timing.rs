//! How a figure's times are taken: the best of several runs, and runs of
//! the measured operation and its baseline in turns, so that a slow spell
//! of a shared machine slows both alike.

use std::time::{Duration, Instant};

use crate::error::Result;

/// Best wall time of `runs` calls of `f`.
pub(super) fn best(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut best = Duration::MAX;
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
    }
    Ok(best.as_secs_f64())
}

/// Best wall times of `runs` calls each of `a` and `b`, taken in turns, so
/// that a drift in the machine's speed (a shared host) hits both alike.
pub(super) fn best_of_turns(
    runs: usize,
    mut a: impl FnMut() -> Result<()>,
    mut b: impl FnMut() -> Result<()>,
) -> Result<(f64, f64)> {
    let [ta, tb] = best_in_turns(runs, [&mut || best(1, &mut a), &mut || best(1, &mut b)])?;
    Ok((ta, tb))
}

/// The least of `runs` timings (in seconds) by each of `fs`, taken in
/// turns, so that a slow spell of a shared machine slows them all alike.
pub(super) fn best_in_turns<const N: usize>(
    runs: usize,
    mut fs: [&mut dyn FnMut() -> Result<f64>; N],
) -> Result<[f64; N]> {
    let mut times = [f64::MAX; N];
    for _ in 0..runs.max(1) {
        for (t, f) in times.iter_mut().zip(fs.iter_mut()) {
            *t = t.min(f()?);
        }
    }
    Ok(times)
}

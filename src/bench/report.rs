//! The figures `bench` reports: a measurement, its baseline and their
//! ratio, as a line for people or for `--json`.

/// One measurement and its baseline.
#[derive(Debug, Clone)]
pub struct Figure {
    /// `cpu` or `gpu`.
    pub backend: &'static str,
    /// What was measured.
    pub what: String,
    /// The baseline it is compared with.
    pub baseline: String,
    /// Output bytes per run.
    pub bytes: u64,
    /// Best time of the measured operation, seconds.
    pub seconds: f64,
    /// Best time of the baseline, seconds.
    pub baseline_seconds: f64,
    /// Rows of x of a product (`bench --gemv`).
    pub m: Option<usize>,
    /// Bytes the baseline handles, when not `bytes` (a product's baseline
    /// reads other bytes).
    pub baseline_bytes: Option<u64>,
    /// An empty dispatch's time (one workgroup that does nothing, bound as
    /// the product), measured in the same turns: the fixed cost every
    /// dispatch pays, whatever it reads.
    pub dispatch_seconds: Option<f64>,
}

impl Figure {
    /// A decode timed against its baseline over the same `bytes`:
    /// `(seconds, baseline_seconds)` as `best_of_turns` gives them (no
    /// product, no dispatch time).
    pub(super) fn timed(
        backend: &'static str,
        (what, baseline): (String, String),
        bytes: u64,
        (seconds, baseline_seconds): (f64, f64),
    ) -> Figure {
        Figure {
            backend,
            what,
            baseline,
            bytes,
            seconds,
            baseline_seconds,
            m: None,
            baseline_bytes: None,
            dispatch_seconds: None,
        }
    }

    /// GB/s of the measured operation (output bytes; bytes read by a product).
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e9
    }

    /// GB/s of the baseline.
    pub fn baseline_gbps(&self) -> f64 {
        self.baseline_bytes.unwrap_or(self.bytes) as f64 / self.baseline_seconds / 1e9
    }

    /// Measured speed as a fraction of the baseline's.
    pub fn ratio(&self) -> f64 {
        self.baseline_seconds / self.seconds
    }
}

impl Figure {
    /// The line `bench --json` prints.
    pub fn json(&self) -> serde_json::Value {
        let mut line = serde_json::json!({
            "backend": self.backend,
            "case": self.what,
            "gbps": self.gbps(),
            "baseline": self.baseline,
            "baseline_gbps": self.baseline_gbps(),
            "ratio": self.ratio(),
        });
        if let Some(m) = self.m {
            line["m"] = m.into();
        }
        if let Some(d) = self.dispatch_seconds {
            line["dispatch_us"] = (d * 1e6).into();
        }
        line
    }
}

impl std::fmt::Display for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.m {
            Some(m) => format!("{} m={m}", self.what),
            None => self.what.clone(),
        };
        write!(
            f,
            "{} {:<40} {:>8.2} GB/s   {:<31} {:>8.2} GB/s   ratio {:.2}",
            self.backend,
            what,
            self.gbps(),
            self.baseline,
            self.baseline_gbps(),
            self.ratio()
        )?;
        match self.dispatch_seconds {
            Some(d) => write!(f, "   (a dispatch: {:.1} µs)", d * 1e6),
            None => Ok(()),
        }
    }
}

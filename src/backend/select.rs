//! Choosing a backend: a hardware GPU when there is one, else the CPU, and
//! a GPU that hands over to the CPU when it fails.

use super::gpu::{self, Gpu};
use super::{Backend, Cpu};
use crate::error::{Error, Result, Rule};
use crate::job::DecodeJob;
use std::ops::Range;

/// A GPU backend that hands over to the CPU when the GPU fails: a device
/// error, a lost device, a failed allocation or a tensor beyond the
/// adapter's limits (GPU-001) is reported once through `notify`, and that
/// call and every later one run on the CPU, which gives the same bytes.
/// What `--backend auto` runs on a hardware GPU.
pub struct Fallback<B> {
    gpu: B,
    cpu: Cpu,
    failed: std::sync::atomic::AtomicBool,
    notify: Box<dyn Fn(&Error) + Send + Sync>,
}

impl<B: Backend> Fallback<B> {
    /// `gpu`, falling back to the CPU; `notify` hears of the fallback once.
    pub fn new(gpu: B, notify: impl Fn(&Error) + Send + Sync + 'static) -> Fallback<B> {
        Fallback {
            gpu,
            cpu: Cpu::new(),
            failed: false.into(),
            notify: Box::new(notify),
        }
    }

    /// Whether the GPU failed and the CPU took over.
    pub fn fell_back(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl<B: Backend> Backend for Fallback<B> {
    fn name(&self) -> String {
        if self.fell_back() {
            format!("{} after the GPU failed", self.cpu.name())
        } else {
            format!("{} (CPU if it fails)", self.gpu.name())
        }
    }

    fn decode_rows(&self, job: &DecodeJob<'_>, rows: Range<usize>, out: &mut [u8]) -> Result<()> {
        use std::sync::atomic::Ordering;
        if !self.failed.load(Ordering::Relaxed) {
            match self.gpu.decode_rows(job, rows.clone(), out) {
                Err(e) if e.rule == Rule::Gpu => {
                    if !self.failed.swap(true, Ordering::Relaxed) {
                        (self.notify)(&e);
                    }
                }
                other => return other,
            }
        }
        self.cpu.decode_rows(job, rows, out)
    }

    fn decodes_ahead(&self) -> bool {
        !self.fell_back() && self.gpu.decodes_ahead()
    }
}

/// Which backend to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// A hardware GPU when there is one, else the CPU.
    #[default]
    Auto,
    /// The GPU; an error when no adapter is found.
    Gpu,
    /// The CPU.
    Cpu,
}

impl std::str::FromStr for BackendChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(BackendChoice::Auto),
            "gpu" => Ok(BackendChoice::Gpu),
            "cpu" => Ok(BackendChoice::Cpu),
            _ => Err(Error::bare(
                Rule::Argument,
                format!("--backend: {s:?} is not one of auto, gpu, cpu"),
            )),
        }
    }
}

/// The backend `choice` asks for. Returns it with a note for people when the
/// choice fell back to something else. Under `auto`, a GPU that fails while
/// decoding hands over to the CPU silently; [`select_notifying`] says so.
pub fn select(choice: BackendChoice) -> Result<(Box<dyn Backend>, Option<String>)> {
    select_notifying(choice, |_| {})
}

/// [`select`], with `notify` told when an `auto` GPU fails and the CPU takes
/// over.
pub fn select_notifying(
    choice: BackendChoice,
    notify: impl Fn(&Error) + Send + Sync + 'static,
) -> Result<(Box<dyn Backend>, Option<String>)> {
    match choice {
        BackendChoice::Cpu => Ok((Box::new(Cpu::new()), None)),
        BackendChoice::Gpu => match gpu::find_adapter() {
            Some(adapter) => Ok((Box::new(Gpu::open(&adapter)?), None)),
            None => Err(Error::bare(
                Rule::Gpu,
                format!("--backend gpu: {}", gpu::no_adapter_message(true)),
            )),
        },
        BackendChoice::Auto => match gpu::find_adapter() {
            Some(adapter) if gpu::is_hardware(&adapter) => match Gpu::open(&adapter) {
                Ok(g) => Ok((Box::new(Fallback::new(g, notify)), None)),
                Err(e) => Ok((
                    Box::new(Cpu::new()),
                    Some(format!("{e}; decoding on the CPU")),
                )),
            },
            Some(adapter) => Ok((
                Box::new(Cpu::new()),
                Some(format!(
                    "only a software adapter ({}) found; the CPU path is faster, decoding there",
                    adapter.get_info().name
                )),
            )),
            None => Ok((
                Box::new(Cpu::new()),
                Some(format!(
                    "{}; decoding on the CPU",
                    gpu::no_adapter_message(false)
                )),
            )),
        },
    }
}

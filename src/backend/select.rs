//! Choosing a backend: a hardware GPU when there is one, else the CPU, and
//! a GPU that hands over to the CPU when it fails. Every host (the command
//! line, the browser, Python, C) gets its backend here.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::gpu::{self, Gpu};
use super::{Backend, Cpu, Decoding};
use crate::error::{Error, Result, Rule};
use crate::job::DecodeJob;

/// A GPU backend that hands over to the CPU when the GPU fails: after a
/// device error, a lost device, a failed allocation or a tensor beyond the
/// adapter's limits (GPU-001), that call and every later one run on the
/// CPU, which gives the same bytes. The failure is kept for
/// [`Backend::take_fallback`] to tell once. What `--backend auto` runs on a
/// hardware GPU.
pub struct Fallback<B> {
    gpu: B,
    cpu: Cpu,
    failed: AtomicBool,
    failure: Mutex<Option<Error>>,
}

impl<B: Backend> Fallback<B> {
    /// `gpu`, falling back to the CPU.
    pub fn new(gpu: B) -> Fallback<B> {
        Fallback {
            gpu,
            cpu: Cpu::new(),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
        }
    }

    /// Whether the GPU failed and the CPU took over.
    pub fn fell_back(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Whether `result` of the GPU is a GPU failure to hand over after;
    /// the first one is kept for [`Backend::take_fallback`].
    fn hand_over(&self, result: &Result<()>) -> bool {
        match result {
            Err(e) if e.rule == Rule::Gpu => {
                if !self.failed.swap(true, Ordering::Relaxed) {
                    let mut failure = self.failure.lock().unwrap_or_else(|p| p.into_inner());
                    *failure = Some(e.clone());
                }
                true
            }
            _ => false,
        }
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
        if !self.fell_back() {
            let result = self.gpu.decode_rows(job, rows.clone(), out);
            if !self.hand_over(&result) {
                return result;
            }
        }
        self.cpu.decode_rows(job, rows, out)
    }

    fn decode_rows_async<'a>(
        &'a self,
        job: &'a DecodeJob<'a>,
        rows: Range<usize>,
        out: &'a mut [u8],
    ) -> Decoding<'a> {
        Box::pin(async move {
            if !self.fell_back() {
                let result = self.gpu.decode_rows_async(job, rows.clone(), out).await;
                if !self.hand_over(&result) {
                    return result;
                }
            }
            self.cpu.decode_rows(job, rows, out)
        })
    }

    fn decodes_ahead(&self) -> bool {
        !self.fell_back() && self.gpu.decodes_ahead()
    }

    fn gpu(&self) -> Option<&gpu::GpuDecoder> {
        self.gpu.gpu()
    }

    fn take_fallback(&self) -> Option<Error> {
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// Which backend to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BackendChoice {
    /// A hardware GPU when there is one, else the CPU; a GPU that fails
    /// hands over to the CPU (same bytes).
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

impl std::fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Gpu => "gpu",
            BackendChoice::Cpu => "cpu",
        })
    }
}

/// The backend `choice` asks for, with a note for people when `auto` chose
/// the CPU instead of a GPU. Under `auto` a hardware GPU comes wrapped in a
/// [`Fallback`].
pub fn select(choice: BackendChoice) -> Result<(Box<dyn Backend>, Option<String>)> {
    pollster::block_on(select_async(choice))
}

/// [`select`], awaited (in a browser: WebGPU's adapter).
pub async fn select_async(choice: BackendChoice) -> Result<(Box<dyn Backend>, Option<String>)> {
    if choice == BackendChoice::Cpu {
        return Ok((Box::new(Cpu::new()), None));
    }
    let adapter = gpu::find_adapter_async().await;
    if choice == BackendChoice::Gpu {
        return match adapter {
            Some(adapter) => Ok((Box::new(Gpu::open_async(&adapter).await?), None)),
            None => Err(Error::bare(
                Rule::Gpu,
                format!("--backend gpu: {}", gpu::no_adapter_message(true)),
            )),
        };
    }
    let cpu = |note: String| -> (Box<dyn Backend>, Option<String>) {
        (Box::new(Cpu::new()), Some(note))
    };
    // In a browser the CPU path has one thread: any WebGPU adapter, a
    // software one too, decodes faster.
    let worth_it = |a: &wgpu::Adapter| gpu::is_hardware(a) || cfg!(target_arch = "wasm32");
    Ok(match adapter {
        Some(adapter) if worth_it(&adapter) => match Gpu::open_async(&adapter).await {
            Ok(g) => (Box::new(Fallback::new(g)), None),
            Err(e) => cpu(format!("{e}; decoding on the CPU")),
        },
        Some(adapter) => cpu(format!(
            "only a software adapter ({}) found; the CPU path is faster, decoding there",
            adapter.get_info().name
        )),
        None => cpu(format!(
            "{}; decoding on the CPU",
            gpu::no_adapter_message(false)
        )),
    })
}

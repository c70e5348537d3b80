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

    fn kind(&self) -> &'static str {
        match self.fell_back() {
            true => self.cpu.kind(),
            false => self.gpu.kind(),
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
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
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
    /// The GPU through this graphics API only (`gpu` with one of wgpu's
    /// backends); an error when it reaches no adapter.
    GpuApi(GpuApi),
}

/// A graphics API wgpu drives a GPU through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuApi {
    /// Vulkan (Linux, Windows, Android; NVIDIA and AMD cards among others).
    Vulkan,
    /// Metal (macOS, iOS).
    Metal,
    /// Direct3D 12 (Windows).
    Dx12,
    /// OpenGL / OpenGL ES (where wgpu is built with it).
    Gl,
}

impl GpuApi {
    /// Every API, in the order their names are listed.
    pub const ALL: [GpuApi; 4] = [GpuApi::Vulkan, GpuApi::Metal, GpuApi::Dx12, GpuApi::Gl];

    /// The name `--backend` takes (`vulkan`, `metal`, `dx12`, `gl`).
    pub fn name(self) -> &'static str {
        match self {
            GpuApi::Vulkan => "vulkan",
            GpuApi::Metal => "metal",
            GpuApi::Dx12 => "dx12",
            GpuApi::Gl => "gl",
        }
    }

    /// wgpu's backend set of this API alone.
    pub fn backends(self) -> wgpu::Backends {
        match self {
            GpuApi::Vulkan => wgpu::Backends::VULKAN,
            GpuApi::Metal => wgpu::Backends::METAL,
            GpuApi::Dx12 => wgpu::Backends::DX12,
            GpuApi::Gl => wgpu::Backends::GL,
        }
    }
}

impl std::str::FromStr for BackendChoice {
    type Err = Error;
    /// `auto`, `gpu`, `cpu` or a graphics API's name, in any case; CUDA and
    /// ROCm are told that the GPU path reaches their cards through Vulkan.
    fn from_str(s: &str) -> Result<Self> {
        let name = s.trim().to_ascii_lowercase();
        match name.as_str() {
            "auto" => Ok(BackendChoice::Auto),
            "gpu" => Ok(BackendChoice::Gpu),
            "cpu" => Ok(BackendChoice::Cpu),
            "cuda" | "rocm" | "hip" => Err(Error::bare(
                Rule::Argument,
                format!(
                    "{s:?}: there is no {} backend; the GPU path reaches NVIDIA and AMD cards through Vulkan: use gpu",
                    if name == "cuda" { "CUDA" } else { "ROCm" }
                ),
            )),
            _ => match GpuApi::ALL.into_iter().find(|api| api.name() == name) {
                Some(api) => Ok(BackendChoice::GpuApi(api)),
                None => Err(Error::bare(
                    Rule::Argument,
                    format!("{s:?} is not one of auto, gpu, cpu, vulkan, metal, dx12, gl"),
                )),
            },
        }
    }
}

impl std::fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Gpu => "gpu",
            BackendChoice::Cpu => "cpu",
            BackendChoice::GpuApi(api) => api.name(),
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
    let cpu = |note| -> (Box<dyn Backend>, Option<String>) { (Box::new(Cpu::new()), note) };
    Ok(match choose(choice).await? {
        Chosen::Cpu(note) => cpu(note),
        Chosen::Gpu(adapter) => (Box::new(Gpu::open_async(&adapter).await?), None),
        Chosen::GpuOrCpu(adapter) => match Gpu::open_async(&adapter).await {
            Ok(g) => (Box::new(Fallback::new(g)), None),
            Err(e) => cpu(Some(format!("{e}; decoding on the CPU"))),
        },
    })
}

/// The GPU decoder `choice` asks for, or `None` where it runs on the CPU:
/// for products ([`GpuDecoder::for_backend`](gpu::GpuDecoder::for_backend)),
/// with the adapter decoding would take.
pub(crate) async fn select_decoder(choice: BackendChoice) -> Result<Option<gpu::GpuDecoder>> {
    Ok(match choose(choice).await? {
        Chosen::Cpu(_) => None,
        Chosen::Gpu(adapter) => Some(gpu::GpuDecoder::open_async(&adapter).await?),
        Chosen::GpuOrCpu(adapter) => gpu::GpuDecoder::open_async(&adapter).await.ok(),
    })
}

/// Where `choice` runs.
enum Chosen {
    /// On the CPU, with a note for people when a GPU was passed over.
    Cpu(Option<String>),
    /// On this adapter's GPU, as asked.
    Gpu(wgpu::Adapter),
    /// On this hardware GPU, the CPU taking over when it cannot open or fails.
    GpuOrCpu(wgpu::Adapter),
}

/// The adapter `choice` takes, if any.
async fn choose(choice: BackendChoice) -> Result<Chosen> {
    if choice == BackendChoice::Cpu {
        return Ok(Chosen::Cpu(None));
    }
    let api = match choice {
        BackendChoice::GpuApi(api) => Some(api),
        _ => None,
    };
    let adapter = gpu::find_adapter_on_async(api.map(GpuApi::backends)).await;
    if choice == BackendChoice::Gpu || api.is_some() {
        return match adapter {
            Some(adapter) => Ok(Chosen::Gpu(adapter)),
            None if api.is_some() => Err(Error::bare(
                Rule::Gpu,
                format!(
                    "--backend {choice}: no {choice} adapter found (--backend gpu takes any API's)"
                ),
            )),
            None => Err(Error::bare(
                Rule::Gpu,
                format!("--backend gpu: {}", gpu::no_adapter_message(true)),
            )),
        };
    }
    // In a browser the CPU path has one thread: any WebGPU adapter, a
    // software one too, decodes faster.
    let worth_it = |a: &wgpu::Adapter| gpu::is_hardware(a) || cfg!(target_arch = "wasm32");
    Ok(match adapter {
        Some(adapter) if worth_it(&adapter) => Chosen::GpuOrCpu(adapter),
        Some(adapter) => Chosen::Cpu(Some(format!(
            "only a software adapter ({}) found; the CPU path is faster, decoding there",
            adapter.get_info().name
        ))),
        None => Chosen::Cpu(Some(format!(
            "{}; decoding on the CPU",
            gpu::no_adapter_message(false)
        ))),
    })
}

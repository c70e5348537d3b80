//! A checkpoint opened and planned in one value an app can keep: list the
//! tensors of its dense form and decode any of them, to bytes, to `f32`
//! values, or into a GPU buffer on the app's own device; multiply by its
//! quantized Linears' packs. [`Linears`] does the latter over files read
//! piece by piece (a browser's).

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};

use safetensors::Dtype;

use crate::backend::gpu::{GpuDecoder, PackedLinear};
use crate::backend::{Backend, BackendChoice, Cpu};
use crate::checkpoint::{Checkpoint, Listing};
use crate::error::{Error, Result, Rule};
use crate::hf::Names;
use crate::job::DecodeJob;
use crate::numerics::{dot_lanes, lanes_sum, DtypeChoice, LANES};
use crate::output::Output;
use crate::plan::Plan;
use crate::stream::{listing, load, prepare, Files};
use rayon::prelude::*;

mod assembled;
mod experts;
mod held;
mod in_blocks;
#[cfg(not(target_arch = "wasm32"))]
mod products;

use held::Held;
use in_blocks::InBlocks;
#[cfg(not(target_arch = "wasm32"))]
pub use products::Products;

self_cell::self_cell!(
    /// The checkpoint and the plan that borrows its mapped bytes.
    struct Cell {
        owner: Checkpoint,
        #[covariant]
        dependent: Plan,
    }
);

/// A quantized checkpoint ready to decode, tensor by tensor.
///
/// ```no_run
/// use wgpu_dequant::{BackendChoice, DtypeChoice, Model};
/// let model = Model::open("model-w4a16", DtypeChoice::Auto)?;
/// for t in model.tensors() {
///     println!("{} {} {:?}", t.name, t.dtype, t.shape);
/// }
/// let name = "model.layers.0.mlp.down_proj.weight";
/// let w: Vec<f32> = model.decode_f32(name, BackendChoice::Cpu)?;
/// # Ok::<(), wgpu_dequant::Error>(())
/// ```
///
/// Backends are opened on first use and kept: a GPU device is opened once
/// for every tensor decoded on it.
pub struct Model {
    cell: Cell,
    backends: Mutex<HashMap<BackendChoice, Arc<dyn Backend>>>,
}

/// One tensor of the dense output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name in the dense checkpoint (`<module>.weight` for a decoded one).
    pub name: String,
    /// Element type of the decoded bytes.
    pub dtype: Dtype,
    /// Its shape in the dense checkpoint.
    pub shape: Vec<usize>,
    /// Size of the decoded bytes.
    pub bytes: usize,
}

impl TensorInfo {
    fn of(o: &Output<'_>) -> TensorInfo {
        TensorInfo {
            name: o.name.clone(),
            dtype: o.dtype,
            shape: o.shape.clone(),
            bytes: o.byte_len(),
        }
    }
}

impl Model {
    /// Opens the checkpoint at `path` (a directory or one `.safetensors`
    /// file) and plans its dense form in `dtype`. Fails on the first thing
    /// wrong with it (`validate` lists them all).
    pub fn open(path: impl AsRef<Path>, dtype: DtypeChoice) -> Result<Model> {
        let ckpt = Checkpoint::open(crate::run::local(path.as_ref())?)?;
        let cell = Cell::try_new(ckpt, |ckpt| {
            let plan = Plan::build(ckpt, dtype, Names::Hub)?;
            plan.check()?;
            Ok::<_, Error>(plan)
        })?;
        Ok(Model {
            cell,
            backends: Mutex::default(),
        })
    }

    /// The plan: every output and where its bytes come from.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    fn plan(&self) -> &Plan<'_> {
        self.cell.borrow_dependent()
    }

    /// The checkpoint's format and schemes, in a few words.
    pub fn format(&self) -> String {
        self.plan().format.describe()
    }

    /// The backend `choice` asks for, opened the first time it is asked for.
    fn backend(&self, choice: BackendChoice) -> Result<Arc<dyn Backend>> {
        let mut open = self.backends.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = open.get(&choice) {
            return Ok(b.clone());
        }
        let (b, _) = crate::backend::select(choice)?;
        let b: Arc<dyn Backend> = Arc::from(b);
        open.insert(choice, b.clone());
        Ok(b)
    }

    /// What the dense checkpoint drops, guesses or changes: the findings a
    /// `dequantize` run tells (and `--strict` refuses).
    pub fn warnings(&self) -> &[crate::Warning] {
        &self.plan().warnings
    }

    /// The tensors of the dense checkpoint, sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = TensorInfo> + '_ {
        self.plan().outputs.iter().map(TensorInfo::of)
    }

    /// The quantized weights among [`Model::tensors`]: those decoded from
    /// packs or from GGUF's blocks of a quantized type, which
    /// [`Model::upload_packed`] and [`Model::matmul_cpu`] take.
    pub fn quantized(&self) -> impl Iterator<Item = TensorInfo> + '_ {
        quantized(self.plan())
    }

    /// The dense tensor called `name` (ARG-001 when there is none).
    pub fn info(&self, name: &str) -> Result<TensorInfo> {
        self.output(name).map(TensorInfo::of)
    }

    fn output(&self, name: &str) -> Result<&Output<'_>> {
        output(self.plan(), name)
    }

    /// The little-endian bytes of tensor `name`, in its [`TensorInfo::dtype`],
    /// decoded on `backend` when it is quantized.
    pub fn decode(&self, name: &str, backend: BackendChoice) -> Result<Vec<u8>> {
        self.bytes_on(name, self.backend(backend)?.as_ref())
    }

    fn bytes_on(&self, name: &str, backend: &dyn Backend) -> Result<Vec<u8>> {
        Ok(self.output(name)?.bytes(backend)?.into_owned())
    }

    /// [`Model::decode`] on a backend the tests made (a GPU with lowered
    /// limits, counting its dispatches).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn decode_on(&self, name: &str, backend: &dyn Backend) -> Result<Vec<u8>> {
        self.bytes_on(name, backend)
    }

    /// [`Model::decode`] into `out`, which holds exactly
    /// [`TensorInfo::bytes`] bytes (a buffer the caller owns: a C array, a
    /// Python `bytearray`), without a copy for tensors decoded by rows.
    pub fn decode_into(&self, name: &str, backend: BackendChoice, out: &mut [u8]) -> Result<()> {
        let backend = self.backend(backend)?;
        let backend = backend.as_ref();
        let o = self.output(name)?;
        if out.len() != o.byte_len() {
            let detail = format!("{} bytes, into a {}-byte buffer", o.byte_len(), out.len());
            return Err(refuse(self.plan(), name, detail));
        }
        match o.row_layout() {
            Some((rows, _)) => o.decode_rows(backend, 0..rows, out),
            None => {
                out.copy_from_slice(&o.bytes(backend)?);
                Ok(())
            }
        }
    }

    /// The values of floating point tensor `name`, widened exactly to `f32`
    /// (the bytes [`Model::decode`] gives, read as numbers).
    pub fn decode_f32(&self, name: &str, backend: BackendChoice) -> Result<Vec<f32>> {
        values_f32(self.plan(), name, self.backend(backend)?.as_ref())
    }

    /// Tensor `name` in a new buffer on `decoder`'s device, decoded there
    /// when it is quantized; see [`GpuDecoder`] for the buffer's layout and
    /// usage flags.
    pub fn decode_to_buffer(&self, name: &str, decoder: &GpuDecoder) -> Result<wgpu::Buffer> {
        self.output(name)?.to_buffer(decoder)
    }

    /// Quantized weight `weight` (a dense tensor's name, `<module>.weight`)
    /// resident on `decoder`'s device as its packs are stored, with its
    /// Linear's bias when the checkpoint has one, for
    /// [`GpuDecoder::record_matmul`]: the dense weight is never made. Its
    /// bytes are read from the checkpoint a chunk at a time.
    pub fn upload_packed(&self, weight: &str, decoder: &GpuDecoder) -> Result<PackedLinear> {
        pollster::block_on(self.upload_packed_async(weight, decoder))
    }

    /// [`Model::upload_packed`], awaited (in a browser).
    pub async fn upload_packed_async(
        &self,
        weight: &str,
        decoder: &GpuDecoder,
    ) -> Result<PackedLinear> {
        upload(self.plan(), (weight, None), decoder).await
    }

    /// Expert `expert` of the 3-D stack of experts `weight` (`[E, …]`)
    /// resident on `decoder`'s device as its packs are stored, with its
    /// bias (`<weight>_bias[expert]`) when the checkpoint has one: the
    /// product the model computes with it, whose inputs are the ones its
    /// codes are packed along. That is `x·W[e]` for GPT-OSS's stacks, which
    /// `dequantize` writes `[E, in, out]`, and `x·W[e]ᵀ` for `[E, out, in]`
    /// ones; [`PackedLinear`]'s `k` and `n` say which.
    pub fn upload_expert(
        &self,
        weight: &str,
        expert: usize,
        decoder: &GpuDecoder,
    ) -> Result<PackedLinear> {
        pollster::block_on(upload(self.plan(), (weight, Some(expert)), decoder))
    }

    /// `y = x·Wᵀ (+ bias)` on the CPU for the `m` rows of `x` (`[m, k]`,
    /// row-major, k the weight's columns): W is quantized weight `weight`
    /// as [`Model::decode`] writes it, widened to f32; each output an f32
    /// sum in a fixed order, the same on every CPU. What [`GpuDecoder::matmul`] computes, for apps
    /// without an adapter and for tests.
    pub fn matmul_cpu(&self, weight: &str, x: &[f32], m: usize) -> Result<Vec<f32>> {
        matmul_cpu(self.plan(), (weight, None), x, m)
    }

    /// The product with expert `expert` of stack `weight` on the CPU
    /// ([`Model::upload_expert`], [`Model::matmul_cpu`]).
    pub fn matmul_cpu_expert(
        &self,
        weight: &str,
        expert: usize,
        x: &[f32],
        m: usize,
    ) -> Result<Vec<f32>> {
        matmul_cpu(self.plan(), (weight, Some(expert)), x, m)
    }

    /// Every stack of experts, sorted by name, with its experts' names in
    /// expert order: a 3-D stack (GPT-OSS's `[E, in, out]`) by its dense
    /// name, its experts `NAME[e]` (one tensor holds them all:
    /// [`Model::upload_expert`] takes `(NAME, e)`); weights stored an
    /// expert each (`<block>.experts.<e>.<rest>`: Mixtral's, Qwen-MoE's,
    /// mlx-lm's `switch_mlp` and GGUF's `*_exps` cut into their experts)
    /// as `<block>.experts.*.<rest>`, their own names in order.
    pub fn expert_stacks(&self) -> Vec<(String, Vec<String>)> {
        experts::stacks(self.plan())
    }

    /// Every expert of stack `stack` (a name [`Model::expert_stacks`]
    /// gives) resident on `decoder`'s device as its packs are stored, for
    /// [`GpuDecoder::record_matmul_experts`]: `experts` of them, each as
    /// [`Model::upload_expert`] or [`Model::upload_packed`] uploads it.
    pub fn upload_experts(&self, stack: &str, decoder: &GpuDecoder) -> Result<PackedLinear> {
        pollster::block_on(experts::upload(self.plan(), stack, decoder))
    }

    /// `y[r] = x[r]·W[ids[r]]ᵀ (+ bias)` on the CPU for the `m` rows of
    /// `x` (`[m, k]`), `W[e]` expert `e` of stack `stack`: each row's result
    /// the one [`Model::matmul_cpu_expert`] (or [`Model::matmul_cpu`], for
    /// experts stored apart) gives it alone. What
    /// [`GpuDecoder::matmul_experts`] computes.
    pub fn matmul_cpu_experts(
        &self,
        stack: &str,
        x: &[f32],
        m: usize,
        ids: &[u32],
    ) -> Result<Vec<f32>> {
        experts::matmul_cpu(self.plan(), stack, x, m, ids)
    }
}

/// The quantized Linears of a checkpoint read piece by piece (a browser's
/// `File`s, a Hub repository), for products with packed weights: what
/// [`Model::upload_packed_async`] and [`Model::matmul_cpu`] do, each call
/// reading the stored tensors of its one weight and dropping them after.
pub struct Linears<F> {
    files: F,
    /// The headers and sidecars, read once.
    listing: Listing,
    /// The stored tensors planning reads (global scales, `g_idx`, …).
    kept: Vec<(String, Vec<u8>)>,
    dtype: DtypeChoice,
    quantized: Vec<TensorInfo>,
    /// Its stacks of experts ([`Model::expert_stacks`]).
    stacks: Vec<(String, Vec<String>)>,
}

impl<F: Files> Linears<F> {
    /// Opens the checkpoint in `files` and plans its dense form in
    /// `dtype`; fails on the first thing wrong with it, as
    /// [`Model::open`] does.
    pub async fn open(files: F, dtype: DtypeChoice) -> Result<Linears<F>> {
        let listing = listing(&files).await?;
        let mut ckpt = Checkpoint::from_listing(listing.clone())?;
        let needs = |c: &Checkpoint| Ok(Plan::build(c, dtype, Names::Hub)?.needs);
        let kept = prepare(&mut ckpt, &files, needs).await?;
        let plan = Plan::build(&ckpt, dtype, Names::Hub)?;
        plan.check()?;
        let quantized = quantized(&plan).collect();
        let stacks = experts::stacks(&plan);
        let kept = kept
            .into_iter()
            .map(|name| {
                let t = ckpt.get(&name).map(|t| t.data().map(<[u8]>::to_vec));
                let bytes = t.unwrap_or_else(|| {
                    Err(Error::bare(Rule::Internal, format!("{name}: not loaded")))
                })?;
                Ok((name, bytes))
            })
            .collect::<Result<_>>()?;
        Ok(Linears {
            files,
            listing,
            kept,
            dtype,
            quantized,
            stacks,
        })
    }

    /// The quantized weights, sorted by name: those decoded from packs or
    /// GGUF blocks ([`Model::quantized`]).
    pub fn quantized(&self) -> &[TensorInfo] {
        &self.quantized
    }

    /// The checkpoint with the stored tensors of `weight` (and of its bias)
    /// loaded, and those planning reads.
    async fn with(&self, weight: &str) -> Result<Checkpoint> {
        self.loaded(|plan| {
            held(plan, weight)?;
            Ok(vec![weight.to_string()])
        })
        .await
    }

    /// The checkpoint with the stored tensors of the weights `weights`
    /// names in its plan (and of their biases) loaded, and those planning
    /// reads.
    async fn loaded(
        &self,
        weights: impl FnOnce(&Plan<'_>) -> Result<Vec<String>>,
    ) -> Result<Checkpoint> {
        let mut ckpt = Checkpoint::from_listing(self.listing.clone())?;
        for (name, bytes) in &self.kept {
            ckpt.load(name, bytes.clone())?;
        }
        let inputs: BTreeSet<String> = {
            let plan = Plan::build(&ckpt, self.dtype, Names::Hub)?;
            let weights = weights(&plan)?;
            let outputs = weights.iter().flat_map(|w| [w.clone(), bias_name(w)]);
            let outputs = outputs.filter_map(|name| output(&plan, &name).ok());
            let inputs = outputs.flat_map(|o| o.inputs());
            inputs.map(|t| t.name.to_string()).collect()
        };
        for name in inputs
            .iter()
            .filter(|n| !self.kept.iter().any(|(k, _)| k == *n))
        {
            load(&mut ckpt, &self.files, name).await?;
        }
        Ok(ckpt)
    }

    /// Quantized weight `weight` resident on `decoder`'s device as its
    /// packs are stored ([`Model::upload_packed_async`]).
    pub async fn upload_packed(&self, weight: &str, decoder: &GpuDecoder) -> Result<PackedLinear> {
        self.upload((weight, None), decoder).await
    }

    /// Expert `expert` of stack `weight` resident on `decoder`'s device
    /// ([`Model::upload_expert`]).
    pub async fn upload_expert(
        &self,
        weight: &str,
        expert: usize,
        decoder: &GpuDecoder,
    ) -> Result<PackedLinear> {
        self.upload((weight, Some(expert)), decoder).await
    }

    async fn upload(
        &self,
        weight: (&str, Option<usize>),
        decoder: &GpuDecoder,
    ) -> Result<PackedLinear> {
        let ckpt = self.with(weight.0).await?;
        upload(
            &Plan::build(&ckpt, self.dtype, Names::Hub)?,
            weight,
            decoder,
        )
        .await
    }

    /// `y = x·Wᵀ (+ bias)` on the CPU ([`Model::matmul_cpu`]).
    pub async fn matmul_cpu(&self, weight: &str, x: &[f32], m: usize) -> Result<Vec<f32>> {
        self.cpu((weight, None), x, m).await
    }

    /// The product with expert `expert` of stack `weight` on the CPU
    /// ([`Model::matmul_cpu_expert`]).
    pub async fn matmul_cpu_expert(
        &self,
        weight: &str,
        expert: usize,
        x: &[f32],
        m: usize,
    ) -> Result<Vec<f32>> {
        self.cpu((weight, Some(expert)), x, m).await
    }

    async fn cpu(&self, weight: (&str, Option<usize>), x: &[f32], m: usize) -> Result<Vec<f32>> {
        let ckpt = self.with(weight.0).await?;
        matmul_cpu(&Plan::build(&ckpt, self.dtype, Names::Hub)?, weight, x, m)
    }

    /// Every stack of experts, sorted by name, with its experts' names in
    /// expert order ([`Model::expert_stacks`]).
    pub fn expert_stacks(&self) -> &[(String, Vec<String>)] {
        &self.stacks
    }

    /// Every expert of stack `stack` resident on `decoder`'s device
    /// ([`Model::upload_experts`]), its stored tensors read for the call.
    pub async fn upload_experts(&self, stack: &str, decoder: &GpuDecoder) -> Result<PackedLinear> {
        let ckpt = self.loaded(|p| experts::weights(p, stack, None)).await?;
        let plan = Plan::build(&ckpt, self.dtype, Names::Hub)?;
        experts::upload(&plan, stack, decoder).await
    }

    /// `y[r] = x[r]·W[ids[r]]ᵀ (+ bias)` on the CPU
    /// ([`Model::matmul_cpu_experts`]): of experts stored apart, only those
    /// `ids` name are read.
    pub async fn matmul_cpu_experts(
        &self,
        stack: &str,
        x: &[f32],
        m: usize,
        ids: &[u32],
    ) -> Result<Vec<f32>> {
        let ckpt = self
            .loaded(|p| experts::weights(p, stack, Some(ids)))
            .await?;
        let plan = Plan::build(&ckpt, self.dtype, Names::Hub)?;
        experts::matmul_cpu(&plan, stack, x, m, ids)
    }
}

/// The outputs of `plan` decoded from packs or blocks ([`Held`]).
fn quantized<'p>(plan: &'p Plan<'_>) -> impl Iterator<Item = TensorInfo> + 'p {
    let outputs = plan.outputs.iter();
    outputs
        .filter(|o| Held::of(&o.source).is_some())
        .map(TensorInfo::of)
}

/// Output `name` of `plan` (ARG-001 when there is none).
fn output<'p, 'c>(plan: &'p Plan<'c>, name: &str) -> Result<&'p Output<'c>> {
    let outputs = &plan.outputs;
    outputs
        .binary_search_by(|o| o.name.as_str().cmp(name))
        .map(|i| &outputs[i])
        .map_err(|_| refuse(plan, name, "no tensor of that name in the dense checkpoint"))
}

fn refuse(plan: &Plan<'_>, name: &str, detail: impl Into<String>) -> Error {
    Error::tensor(Rule::Argument, plan.checkpoint.display_path(), name, detail)
}

/// The values of floating point output `name`, widened exactly to `f32`.
fn values_f32(plan: &Plan<'_>, name: &str, backend: &dyn Backend) -> Result<Vec<f32>> {
    let o = output(plan, name)?;
    let (size, read) = crate::numerics::float_reader(o.dtype).ok_or_else(|| {
        let detail = format!(
            "is {}, not bf16, f16 or f32: use decode for its bytes",
            o.dtype
        );
        refuse(plan, name, detail)
    })?;
    let bytes = o.bytes(backend)?;
    Ok(bytes.chunks_exact(size).map(read).collect())
}

/// Quantized weight `weight` of `plan`.
fn held<'p, 'c>(plan: &'p Plan<'c>, weight: &str) -> Result<Held<'p, 'c>> {
    Held::of(&output(plan, weight)?.source)
        .ok_or_else(|| refuse(plan, weight, "is not a quantized weight"))
}

/// The name of the bias of weight `name`: `<module>.bias` for a Linear's
/// `<module>.weight`, `<name>_bias` for a stack of experts (GPT-OSS's).
fn bias_name(name: &str) -> String {
    match name.strip_suffix(".weight") {
        Some(module) => format!("{module}.bias"),
        None => format!("{name}_bias"),
    }
}

/// What a product with quantized weight `weight` (expert `expert` of a 3-D
/// stack) reads: the job in the orientation whose rows are the product's
/// outputs and whose columns its inputs, the rows of it that are W, W's
/// `[n, k]`, and its bias widened to f32. The rows are W's own, or (where
/// no rewrite reads them so) another view of its row-major elements.
struct Linear<'p, 'c> {
    job: Cow<'p, DecodeJob<'c>>,
    rows: Range<usize>,
    shape: (usize, usize),
    bias: Option<Vec<f32>>,
}

/// The product with weight `weight` of `plan`, or with expert `expert` of
/// it, whose job is `job` ([`Held::job`]): a stack's experts are taken as
/// stored, rows their outputs (GPT-OSS stores `[E, out, in]` of a dense
/// `[E, in, out]`).
fn linear<'p, 'c>(
    plan: &Plan<'c>,
    (weight, expert): (&str, Option<usize>),
    job: &'p DecodeJob<'c>,
) -> Result<Linear<'p, 'c>> {
    let shape = &output(plan, weight)?.shape;
    let stack = shape.len() == 3;
    let (job, rows, (n, k)) = match (stack, expert) {
        (false, None) => {
            let all = (job.dims.total_rows(), job.dims.cols);
            let (n, k) = match *shape.as_slice() {
                [n, k] => (n, k),
                _ => all,
            };
            // A job decoding another view of the weight's elements
            // (bitsandbytes' rows of whole blocks), read in the weight's
            // own rows where it can be.
            match job.in_rows(n, k) {
                Some(rows) => (Cow::Owned(rows), 0..n, (n, k)),
                None => (Cow::Borrowed(job), 0..all.0, (n, k)),
            }
        }
        (true, Some(e)) if e < job.dims.slices => {
            let job = match job.transposed {
                true => Cow::Owned(job.clone().transpose()),
                false => Cow::Borrowed(job),
            };
            let (r, k) = (job.dims.rows, job.dims.cols);
            (job, e * r..(e + 1) * r, (r, k))
        }
        (true, Some(e)) => {
            let detail = format!("has {} experts, not {}", job.dims.slices, e + 1);
            return Err(refuse(plan, weight, detail));
        }
        (true, None) => {
            let detail = "is a stack of experts: multiply by one of them (upload_expert) or by them all (upload_experts)";
            return Err(refuse(plan, weight, detail));
        }
        (false, Some(_)) => return Err(refuse(plan, weight, "is not a stack of experts")),
    };
    // W's outputs among the bias's: an expert's of a stack's, or all.
    let (outputs, ours) = match stack {
        true => (job.dims.total_rows(), rows.clone()),
        false => (n, 0..n),
    };
    Ok(Linear {
        job,
        rows,
        shape: (n, k),
        bias: bias(plan, weight, outputs, ours)?,
    })
}

/// Values `ours` of the bias of weight `weight` of `plan`, which holds one
/// value for each of `outputs` outputs; `None` where it has no bias.
fn bias(
    plan: &Plan<'_>,
    weight: &str,
    outputs: usize,
    ours: Range<usize>,
) -> Result<Option<Vec<f32>>> {
    let name = bias_name(weight);
    match output(plan, &name) {
        Ok(b) if b.shape.iter().product::<usize>() == outputs => {
            Ok(Some(values_f32(plan, &name, &Cpu::new())?[ours].to_vec()))
        }
        Ok(_) => Err(refuse(
            plan,
            weight,
            "its bias has not one value per output",
        )),
        Err(_) => Ok(None),
    }
}

/// Uploads the product with `weight` (or one expert of it) of `plan`.
async fn upload(
    plan: &Plan<'_>,
    weight: (&str, Option<usize>),
    decoder: &GpuDecoder,
) -> Result<PackedLinear> {
    let held = held(plan, weight.0)?;
    if let Held::Assembled(a) = held {
        assembled::one(plan, weight)?;
        return assembled::upload(plan, weight.0, a, decoder).await;
    }
    let rows = held.rows()?;
    let job = held.job(rows.as_deref())?;
    upload_linear(plan, linear(plan, weight, &job)?, weight.0, decoder).await
}

/// Uploads product `w` (of weight `what` of `plan`).
async fn upload_linear(
    plan: &Plan<'_>,
    w: Linear<'_, '_>,
    what: &str,
    decoder: &GpuDecoder,
) -> Result<PackedLinear> {
    let (n, k) = w.shape;
    if (w.rows.len(), w.job.dims.cols) != (n, k) {
        let (r, c) = (w.rows.len(), w.job.dims.cols);
        let detail = format!(
            "is decoded as {r} rows of {c}, which the GPU cannot read as its {n} rows of {k}"
        );
        return Err(refuse(plan, what, detail));
    }
    decoder
        .upload_linear_async(&w.job, w.rows, w.bias.as_deref(), what)
        .await
}

/// Bytes of f32 weights [`matmul_cpu`] decodes at a time.
const CPU_ROWS_BYTES: usize = 1 << 20;

/// `y = x·Wᵀ (+ bias)` on the CPU for quantized weight `weight` of `plan`
/// (or one expert of it): W is decoded as `dequantize` writes it, a block
/// of rows at a time (GGUF's common types: a block at a time, in their
/// blocks), widened to f32, and each output summed in the CPU products'
/// lanes ([`Model::matmul_cpu`]).
fn matmul_cpu(
    plan: &Plan<'_>,
    weight: (&str, Option<usize>),
    x: &[f32],
    m: usize,
) -> Result<Vec<f32>> {
    let held = held(plan, weight.0)?;
    if let Held::Assembled(a) = held {
        assembled::one(plan, weight)?;
        return assembled::matmul_cpu(plan, weight.0, a, x, m);
    }
    if let Some(w) = InBlocks::of(plan, &held, weight) {
        return w.product(plan, weight.0, x, m);
    }
    let stored = held.rows()?;
    let job = held.job(stored.as_deref())?;
    product_cpu(plan, linear(plan, weight, &job)?, weight.0, x, m)
}

/// Product `w` (of weight `what` of `plan`) on the CPU ([`matmul_cpu`]).
fn product_cpu(
    plan: &Plan<'_>,
    w: Linear<'_, '_>,
    what: &str,
    x: &[f32],
    m: usize,
) -> Result<Vec<f32>> {
    let Linear {
        job,
        rows,
        shape,
        bias,
    } = w;
    let cpu = Cpu::new();
    let dense = Dense {
        shape,
        rows,
        row_bytes: job.dims.cols * job.out.size(),
        out: job.out,
        bias,
    };
    dense_product(
        plan,
        what,
        dense,
        |r, out| cpu.decode_rows(&job, r, out),
        x,
        m,
    )
}

/// A weight [`dense_product`] multiplies by: W `[n, k]` (`shape`), rows
/// `rows` of what its decoder writes (W's own rows, or another view of
/// its row-major elements), `row_bytes` each in dtype `out`.
struct Dense {
    shape: (usize, usize),
    rows: Range<usize>,
    row_bytes: usize,
    out: crate::numerics::OutDtype,
    bias: Option<Vec<f32>>,
}

/// `y = x·Wᵀ (+ bias)` on the CPU for weight `w` (of weight `what` of
/// `plan`), its rows decoded by `decode` a block at a time as `dequantize`
/// writes them, widened to f32, each output summed in the CPU products'
/// lanes (`numerics::dot_lanes`).
fn dense_product(
    plan: &Plan<'_>,
    what: &str,
    w: Dense,
    mut decode: impl FnMut(Range<usize>, &mut [u8]) -> Result<()>,
    x: &[f32],
    m: usize,
) -> Result<Vec<f32>> {
    let Dense {
        shape: (n, k),
        rows,
        row_bytes,
        out,
        bias,
    } = w;
    if k == 0 || m.checked_mul(k) != Some(x.len()) {
        let detail = format!("x holds {} values, not {m} rows of {k}", x.len());
        return Err(refuse(plan, what, detail));
    }
    let (size, read) = crate::numerics::float_reader(out.safetensors())
        .ok_or_else(|| Error::bare(Rule::Internal, "a decoded dtype without a reader"))?;
    // W is decoded a block of rows at a time, about CPU_ROWS_BYTES of f32s
    // (a view of its elements whole: its rows are not W's).
    let per = match rows.len() == n {
        true => (CPU_ROWS_BYTES / (4 * k)).clamp(1, n.max(1)),
        false => rows.len().max(1),
    };
    let mut y = vec![0f32; m * n];
    if m == 0 {
        return Ok(y);
    }
    let (mut bytes, mut w, mut t) = (Vec::new(), Vec::new(), Vec::new());
    let mut j0 = 0;
    for start in rows.clone().step_by(per) {
        let end = (start + per).min(rows.end);
        bytes.resize((end - start) * row_bytes, 0);
        decode(start..end, &mut bytes)?;
        w.resize(bytes.len() / size, 0f32);
        w.par_chunks_mut(k)
            .zip(bytes.par_chunks(k * size))
            .for_each(|(w, b)| {
                w.iter_mut()
                    .zip(b.chunks_exact(size))
                    .for_each(|(w, b)| *w = read(b))
            });
        // Each row of this block times every row of x, `[rows, m]`, on
        // rayon's threads, summed in the CPU products' lanes.
        t.resize(w.len() / k * m, 0f32);
        t.par_chunks_mut(m)
            .zip(w.par_chunks(k))
            .for_each(|(t, wj)| {
                for (t, xm) in t.iter_mut().zip(x.chunks_exact(k)) {
                    let mut acc = [0f32; LANES];
                    dot_lanes(&mut acc, wj, xm);
                    *t = lanes_sum(acc);
                }
            });
        for (j, tj) in (j0..).zip(t.chunks_exact(m)) {
            for (ym, &dot) in y.chunks_exact_mut(n.max(1)).zip(tj) {
                ym[j] = dot + bias.as_ref().map_or(0.0, |b| b[j]);
            }
        }
        j0 += w.len() / k;
    }
    Ok(y)
}

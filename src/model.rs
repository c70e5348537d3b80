//! A checkpoint opened and planned in one value an app can keep: list the
//! tensors of its dense form and decode any of them, to bytes, to `f32`
//! values, or into a GPU buffer on the app's own device.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use safetensors::Dtype;

use crate::backend::gpu::{GpuDecoder, PackedLinear};
use crate::backend::{Backend, BackendChoice};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result, Rule};
use crate::output::{Output, Source};
use crate::plan::{DtypeChoice, Plan};

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
            let plan = Plan::build(ckpt, dtype)?;
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

    /// The tensors of the dense checkpoint, sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = TensorInfo> + '_ {
        self.plan().outputs.iter().map(TensorInfo::of)
    }

    /// The quantized weights among [`Model::tensors`]: those decoded from
    /// packs, which [`Model::upload_packed`] and [`Model::matmul_cpu`] take.
    pub fn quantized(&self) -> impl Iterator<Item = TensorInfo> + '_ {
        let outputs = self.plan().outputs.iter();
        outputs
            .filter(|o| matches!(o.source, Source::Decode(_)))
            .map(TensorInfo::of)
    }

    /// The dense tensor called `name` (ARG-001 when there is none).
    pub fn info(&self, name: &str) -> Result<TensorInfo> {
        self.output(name).map(TensorInfo::of)
    }

    fn output(&self, name: &str) -> Result<&Output<'_>> {
        let outputs = &self.plan().outputs;
        outputs
            .binary_search_by(|o| o.name.as_str().cmp(name))
            .map(|i| &outputs[i])
            .map_err(|_| {
                Error::tensor(
                    Rule::Argument,
                    self.cell.borrow_owner().display_path(),
                    name,
                    "no tensor of that name in the dense checkpoint",
                )
            })
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
            return Err(Error::tensor(
                Rule::Argument,
                self.cell.borrow_owner().display_path(),
                name,
                format!("{} bytes, into a {}-byte buffer", o.byte_len(), out.len()),
            ));
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
        let o = self.output(name)?;
        let (size, read) = crate::numerics::float_reader(o.dtype).ok_or_else(|| {
            Error::tensor(
                Rule::Argument,
                self.cell.borrow_owner().display_path(),
                name,
                format!(
                    "is {}, not bf16, f16 or f32: use decode for its bytes",
                    o.dtype
                ),
            )
        })?;
        let bytes = o.bytes(self.backend(backend)?.as_ref())?;
        Ok(bytes.chunks_exact(size).map(read).collect())
    }

    /// Tensor `name` in a new buffer on `decoder`'s device, decoded there
    /// when it is quantized; see [`GpuDecoder`] for the buffer's layout and
    /// usage flags.
    pub fn decode_to_buffer(&self, name: &str, decoder: &GpuDecoder) -> Result<wgpu::Buffer> {
        self.output(name)?.to_buffer(decoder)
    }

    /// The job decoding quantized weight `weight`, and its Linear's bias
    /// (`<module>.bias`, when the checkpoint has one) widened to f32.
    fn linear(&self, weight: &str) -> Result<(&crate::job::DecodeJob<'_>, Option<Vec<f32>>)> {
        let Source::Decode(job) = &self.output(weight)?.source else {
            return Err(Error::tensor(
                Rule::Argument,
                self.cell.borrow_owner().display_path(),
                weight,
                "is not a quantized weight",
            ));
        };
        let bias = match weight.strip_suffix(".weight").map(|m| format!("{m}.bias")) {
            Some(b) if self.output(&b).is_ok() => Some(self.decode_f32(&b, BackendChoice::Cpu)?),
            _ => None,
        };
        Ok((job, bias))
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
        let (job, bias) = self.linear(weight)?;
        decoder
            .upload_linear_async(job, bias.as_deref(), weight)
            .await
    }

    /// `y = x·Wᵀ (+ bias)` on the CPU for the `m` rows of `x` (`[m, k]`,
    /// row-major, k the weight's columns): W is quantized weight `weight`
    /// as [`Model::decode`] writes it, widened to f32; each output a
    /// sequential f32 sum. What [`GpuDecoder::matmul`] computes, for apps
    /// without an adapter and for tests.
    pub fn matmul_cpu(&self, weight: &str, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let (_, bias) = self.linear(weight)?;
        let info = self.info(weight)?;
        let (n, k) = match info.shape[..] {
            [n, k] => (n, k),
            _ => {
                return Err(Error::tensor(
                    Rule::Argument,
                    self.cell.borrow_owner().display_path(),
                    weight,
                    "is not a 2-D weight",
                ))
            }
        };
        if x.len() != m * k {
            let detail = format!("x holds {} values, not {m} rows of {k}", x.len());
            return Err(Error::tensor(
                Rule::Argument,
                self.cell.borrow_owner().display_path(),
                weight,
                detail,
            ));
        }
        let w = self.decode_f32(weight, BackendChoice::Cpu)?;
        let mut y = vec![0f32; m * n];
        for (xm, ym) in x.chunks_exact(k.max(1)).zip(y.chunks_exact_mut(n.max(1))) {
            for (j, (yj, wj)) in ym.iter_mut().zip(w.chunks_exact(k.max(1))).enumerate() {
                let dot = wj.iter().zip(xm).fold(0f32, |acc, (a, b)| acc + a * b);
                *yj = dot + bias.as_ref().map_or(0.0, |b| b[j]);
            }
        }
        Ok(y)
    }
}

//! Products with packed weights (`open_linears`): a checkpoint's quantized
//! Linears multiplied straight from their packs, on the GPU through
//! `GpuDecoder::matmul` with each weight uploaded once, or on the CPU
//! through `Model::matmul_cpu`; rows of x routed to experts of one stack
//! (`matmul_experts`) through `GpuDecoder::matmul_experts`, the stack
//! uploaded once, or `Model::matmul_cpu_experts`. The Python half checks
//! and converts arrays.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use wgpu_dequant::{
    BackendChoice, DtypeChoice, Error, GpuDecoder, Model, PackedLinear, Result, Rule,
};

use crate::py_err;

/// The products with the quantized weights of one checkpoint.
#[pyclass(name = "Linears", module = "wgpu_dequant._native", frozen)]
pub(crate) struct NativeLinears {
    model: Model,
    /// The checkpoint as given, for errors that name it.
    path: String,
    quantized: Vec<String>,
    gpu: Option<GpuDecoder>,
    /// Each weight (or expert) uploaded once.
    packed: Mutex<Uploads>,
    /// Each stack of experts uploaded once, whole.
    stacks: Mutex<HashMap<String, Arc<PackedLinear>>>,
}

/// The weights uploaded, by name and expert.
type Uploads = HashMap<(String, Option<usize>), Arc<PackedLinear>>;

/// Little-endian f32 bytes as values.
fn floats(x: &[u8]) -> Vec<f32> {
    x.chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// `y` as little-endian f32 bytes, for Python.
fn byte_array<'py>(py: Python<'py>, y: &[f32]) -> PyResult<Bound<'py, PyByteArray>> {
    PyByteArray::new_with(py, 4 * y.len(), |buf| {
        for (b, v) in buf.chunks_exact_mut(4).zip(y) {
            b.copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    })
}

impl NativeLinears {
    /// Weight `name` (expert `expert` of it) on `gpu`, uploaded the first
    /// time it is used.
    fn packed(
        &self,
        gpu: &GpuDecoder,
        name: &str,
        expert: Option<usize>,
    ) -> Result<Arc<PackedLinear>> {
        let key = (name.to_string(), expert);
        let cached = self.uploads().get(&key).cloned();
        if let Some(p) = cached {
            return Ok(p);
        }
        let w = match expert {
            None => self.model.upload_packed(name, gpu)?,
            Some(e) => self.model.upload_expert(name, e, gpu)?,
        };
        Ok(self.uploads().entry(key).or_insert(Arc::new(w)).clone())
    }

    fn uploads(&self) -> MutexGuard<'_, Uploads> {
        self.packed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every expert of `stack` on `gpu`, uploaded the first time it is used.
    fn packed_stack(&self, gpu: &GpuDecoder, stack: &str) -> Result<Arc<PackedLinear>> {
        let lock = || self.stacks.lock().unwrap_or_else(|p| p.into_inner());
        let cached = lock().get(stack).cloned();
        if let Some(p) = cached {
            return Ok(p);
        }
        let w = Arc::new(self.model.upload_experts(stack, gpu)?);
        Ok(lock().entry(stack.to_string()).or_insert(w).clone())
    }

    /// `y[r] = x[r]·W[ids[r]]ᵀ (+ bias)` for the `m` rows of `x` (`k`
    /// values each), W[e] expert `e` of `stack`: `(y, n)`.
    fn routed(
        &self,
        stack: &str,
        x: &[f32],
        (m, k): (usize, usize),
        ids: &[u32],
    ) -> Result<(Vec<f32>, usize)> {
        let refuse = |detail: String| Error::tensor(Rule::Argument, &self.path, stack, detail);
        if ids.len() != m {
            return Err(refuse(format!(
                "{} expert ids for {m} rows of x",
                ids.len()
            )));
        }
        let Some(gpu) = &self.gpu else {
            // Its width from one row of zeros when x has none.
            let (zeros, one) = (vec![0.0; k], [0]);
            let (x1, m1, ids1) = match m {
                0 => (&zeros[..], 1, &one[..]),
                _ => (x, m, ids),
            };
            let y = self.model.matmul_cpu_experts(stack, x1, m1, ids1)?;
            let n = y.len() / m1;
            return Ok((if m == 0 { Vec::new() } else { y }, n));
        };
        let w = self.packed_stack(gpu, stack)?;
        if k != w.k {
            return Err(refuse(format!("x has rows of {k} values, not {}", w.k)));
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= w.experts) {
            let detail = format!("has {} experts, not {}", w.experts, id as u64 + 1);
            return Err(refuse(detail));
        }
        match m {
            0 => Ok((Vec::new(), w.n)),
            _ => Ok((gpu.matmul_experts(&w, x, m, ids)?, w.n)),
        }
    }

    /// `x·Wᵀ (+ bias)` for the `m` rows of `x`.
    fn product(&self, name: &str, expert: Option<usize>, x: &[f32], m: usize) -> Result<Vec<f32>> {
        self.whole_stack(name, expert)?;
        if let Some(gpu) = &self.gpu {
            let w = self.packed(gpu, name, expert)?;
            if m.checked_mul(w.k) != Some(x.len()) {
                let detail = format!("x holds {} values, not {m} rows of {}", x.len(), w.k);
                return Err(Error::tensor(Rule::Argument, &self.path, name, detail));
            }
            return gpu.matmul(&w, x, m);
        }
        match expert {
            None => self.model.matmul_cpu(name, x, m),
            Some(e) => self.model.matmul_cpu_expert(name, e, x, m),
        }
    }

    /// A stack of experts needs `expert=`: said in the package's terms.
    fn whole_stack(&self, name: &str, expert: Option<usize>) -> Result<()> {
        match self.model.info(name)?.shape[..] {
            [e, _, _] if expert.is_none() => {
                let detail = format!(
                    "is a stack of {e} experts: pass expert= (0 to {})",
                    e.max(1) - 1
                );
                Err(Error::tensor(Rule::Argument, &self.path, name, detail))
            }
            _ => Ok(()),
        }
    }

    /// `(n, k)` of the product: the uploaded weight's, a 2-D weight's
    /// shape, or found by multiplying one row of zeros on the CPU (an
    /// expert's inputs are the ones its codes are packed along, its dense
    /// rows or its columns).
    fn product_dims(&self, name: &str, expert: Option<usize>) -> Result<(usize, usize)> {
        self.whole_stack(name, expert)?;
        if let Some(gpu) = &self.gpu {
            let w = self.packed(gpu, name, expert)?;
            return Ok((w.n, w.k));
        }
        let shape = self.model.info(name)?.shape;
        let quantized = self
            .quantized
            .binary_search_by(|q| q.as_str().cmp(name))
            .is_ok();
        if let (&[n, k], true, None) = (shape.as_slice(), quantized, expert) {
            return Ok((n, k));
        }
        let widths = match shape[..] {
            [_, a, b] => vec![a, b],
            _ => vec![shape.iter().skip(1).product()],
        };
        let mut last = None;
        for k in widths {
            match self.product(name, expert, &vec![0.0; k], 1) {
                Ok(y) => return Ok((y.len(), k)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::bare(Rule::Internal, "no width to try")))
    }
}

#[pymethods]
impl NativeLinears {
    #[new]
    fn new(py: Python<'_>, path: &str, dtype: &str, backend: &str) -> PyResult<Self> {
        let dtype: DtypeChoice = dtype.parse().map_err(py_err)?;
        let choice: BackendChoice = backend.parse().map_err(py_err)?;
        let (model, gpu) = py
            .detach(|| {
                Ok::<_, Error>((Model::open(path, dtype)?, GpuDecoder::for_backend(choice)?))
            })
            .map_err(py_err)?;
        Ok(NativeLinears {
            quantized: model.quantized().map(|t| t.name).collect(),
            model,
            path: path.to_string(),
            gpu,
            packed: Mutex::default(),
            stacks: Mutex::default(),
        })
    }

    /// The plan's warnings, each the CLI's line after `warning: `.
    fn warnings(&self) -> Vec<String> {
        self.model.warnings().iter().map(|w| w.message()).collect()
    }

    /// The quantized weights' names, sorted.
    fn quantized(&self) -> Vec<String> {
        self.quantized.clone()
    }

    /// "gpu" or "cpu": where the products run.
    #[getter]
    fn backend(&self) -> &'static str {
        match self.gpu {
            Some(_) => "gpu",
            None => "cpu",
        }
    }

    /// The GPU adapter's name, `None` on the CPU.
    #[getter]
    fn adapter(&self) -> Option<String> {
        self.gpu.as_ref().map(|g| g.device().adapter_info().name)
    }

    /// `(n, k)` of the product with `name` (expert `expert` of it).
    #[pyo3(signature = (name, expert = None))]
    fn dims(&self, py: Python<'_>, name: &str, expert: Option<usize>) -> PyResult<(usize, usize)> {
        py.detach(|| self.product_dims(name, expert))
            .map_err(py_err)
    }

    /// `y = x·Wᵀ (+ bias)` for `m` rows of `k` f32 values (little-endian
    /// bytes), with the GIL released: `(y's bytes, n)`.
    #[pyo3(signature = (name, expert, x, m, k))]
    fn matmul<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        expert: Option<usize>,
        x: &[u8],
        m: usize,
        k: usize,
    ) -> PyResult<(Bound<'py, PyByteArray>, usize)> {
        let run = || {
            if m.checked_mul(k).and_then(|v| v.checked_mul(4)) != Some(x.len()) {
                let detail = format!("x holds {} bytes, not {m} rows of {k} f32s", x.len());
                return Err(Error::bare(Rule::Argument, detail));
            }
            if m == 0 {
                let (n, want) = self.product_dims(name, expert)?;
                if want != k {
                    let detail = format!("x has rows of {k} values, not {want}");
                    return Err(Error::tensor(Rule::Argument, &self.path, name, detail));
                }
                return Ok((Vec::new(), n));
            }
            let y = self.product(name, expert, &floats(x), m)?;
            let n = y.len() / m;
            Ok((y, n))
        };
        let (y, n) = py.detach(run).map_err(py_err)?;
        Ok((byte_array(py, &y)?, n))
    }

    /// Every stack of experts, sorted by name, with its experts' names in
    /// expert order (`Model::expert_stacks`).
    fn expert_stacks(&self) -> Vec<(String, Vec<String>)> {
        self.model.expert_stacks()
    }

    /// `y[r] = x[r]·W[ids[r]]ᵀ (+ bias)` for `m` rows of `k` f32 values
    /// (little-endian bytes), W[e] expert `e` of `stack`, with the GIL
    /// released: `(y's bytes, n)`.
    fn matmul_experts<'py>(
        &self,
        py: Python<'py>,
        stack: &str,
        x: &[u8],
        m: usize,
        k: usize,
        ids: Vec<u32>,
    ) -> PyResult<(Bound<'py, PyByteArray>, usize)> {
        let run = || {
            if m.checked_mul(k).and_then(|v| v.checked_mul(4)) != Some(x.len()) {
                let detail = format!("x holds {} bytes, not {m} rows of {k} f32s", x.len());
                return Err(Error::tensor(Rule::Argument, &self.path, stack, detail));
            }
            self.routed(stack, &floats(x), (m, k), &ids)
        };
        let (y, n) = py.detach(run).map_err(py_err)?;
        Ok((byte_array(py, &y)?, n))
    }
}

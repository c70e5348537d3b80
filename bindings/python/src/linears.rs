//! Products with packed weights (`open_linears`): a checkpoint's quantized
//! Linears multiplied straight from their packs through the crate's
//! `Products` (on the GPU each weight, and each stack of experts routed
//! to, uploaded once; or on the CPU), with the GIL released. The Python
//! half checks and converts arrays.

use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use wgpu_dequant::{BackendChoice, DtypeChoice, Error, Products, Result, Rule};

use crate::py_err;

/// The products with the quantized weights of one checkpoint: the crate's
/// `Products`.
#[pyclass(name = "Linears", module = "wgpu_dequant._native", frozen)]
pub(crate) struct NativeLinears {
    products: Products,
    /// The checkpoint as given, for errors that name it.
    path: String,
}

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
    /// A stack of experts needs `expert=`: said in the package's terms
    /// (the crate's `Products` refuses it too, naming an index).
    fn whole_stack(&self, name: &str, expert: Option<usize>) -> Result<()> {
        match self.products.model().info(name)?.shape[..] {
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

    /// [`Products::dims`], a whole stack refused in the package's terms.
    fn product_dims(&self, name: &str, expert: Option<usize>) -> Result<(usize, usize)> {
        self.whole_stack(name, expert)?;
        self.products.dims(name, expert)
    }
}

#[pymethods]
impl NativeLinears {
    #[new]
    fn new(py: Python<'_>, path: &str, dtype: &str, backend: &str) -> PyResult<Self> {
        let dtype: DtypeChoice = dtype.parse().map_err(py_err)?;
        let choice: BackendChoice = backend.parse().map_err(py_err)?;
        let products = py
            .detach(|| Products::open(path, dtype, choice))
            .map_err(py_err)?;
        Ok(NativeLinears {
            products,
            path: path.to_string(),
        })
    }

    /// The plan's warnings, each the CLI's line after `warning: `.
    fn warnings(&self) -> Vec<String> {
        self.products
            .model()
            .warnings()
            .iter()
            .map(|w| w.message())
            .collect()
    }

    /// The quantized weights' names, sorted.
    fn quantized(&self) -> Vec<String> {
        self.products.quantized().to_vec()
    }

    /// "gpu" or "cpu": where the products run.
    #[getter]
    fn backend(&self) -> &'static str {
        match self.products.gpu() {
            Some(_) => "gpu",
            None => "cpu",
        }
    }

    /// The GPU adapter's name, `None` on the CPU.
    #[getter]
    fn adapter(&self) -> Option<String> {
        self.products.gpu().map(|g| g.device().adapter_info().name)
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
            self.whole_stack(name, expert)?;
            let y = self.products.matmul(name, expert, &floats(x), m)?;
            let n = y.len() / m;
            Ok((y, n))
        };
        let (y, n) = py.detach(run).map_err(py_err)?;
        Ok((byte_array(py, &y)?, n))
    }

    /// Every stack of experts, sorted by name, with its experts' names in
    /// expert order (`Model::expert_stacks`).
    fn expert_stacks(&self) -> Vec<(String, Vec<String>)> {
        self.products.model().expert_stacks()
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
            self.products
                .matmul_experts(stack, &floats(x), (m, k), &ids)
        };
        let (y, n) = py.detach(run).map_err(py_err)?;
        Ok((byte_array(py, &y)?, n))
    }
}

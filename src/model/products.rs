//! A checkpoint's quantized Linears with a backend to multiply them on:
//! what the C and Python packages hold behind a handle. Each weight (an
//! expert of a stack, or a stack of experts whole) is uploaded once, the
//! first time it is multiplied on the GPU; on the CPU nothing is held.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use super::Model;
use crate::backend::gpu::{GpuDecoder, PackedLinear};
use crate::backend::BackendChoice;
use crate::error::{Error, Result, Rule};
use crate::numerics::DtypeChoice;

/// Products with the quantized weights of one checkpoint, on the GPU
/// ([`GpuDecoder::matmul`], [`GpuDecoder::matmul_experts`]) or the CPU
/// ([`Model::matmul_cpu`], [`Model::matmul_cpu_experts`]).
pub struct Products {
    model: Model,
    /// The checkpoint as given, for errors that name it.
    path: String,
    /// [`Model::quantized`]'s names, sorted.
    quantized: Vec<String>,
    gpu: Option<GpuDecoder>,
    /// The weights uploaded, by name and expert.
    packed: Mutex<HashMap<(String, Option<usize>), Uploaded>>,
    /// The stacks of experts uploaded whole, by name.
    stacks: Mutex<HashMap<String, Uploaded>>,
}

/// A weight on the GPU, shared with the products that run on it.
type Uploaded = Arc<PackedLinear>;

impl Products {
    /// The checkpoint at `path` planned with `dtype`, multiplied on
    /// `backend` ([`GpuDecoder::for_backend`]: `Auto` takes a hardware GPU
    /// when there is one, else the CPU).
    pub fn open(
        path: impl AsRef<Path>,
        dtype: DtypeChoice,
        backend: BackendChoice,
    ) -> Result<Products> {
        let model = Model::open(&path, dtype)?;
        let mut quantized: Vec<String> = model.quantized().map(|t| t.name).collect();
        quantized.sort();
        Ok(Products {
            gpu: GpuDecoder::for_backend(backend)?,
            model,
            path: path.as_ref().display().to_string(),
            quantized,
            packed: Mutex::default(),
            stacks: Mutex::default(),
        })
    }

    /// The planned checkpoint.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The quantized weights' names, sorted.
    pub fn quantized(&self) -> &[String] {
        &self.quantized
    }

    /// The GPU the products run on; `None`: the CPU.
    pub fn gpu(&self) -> Option<&GpuDecoder> {
        self.gpu.as_ref()
    }

    /// `y = x·Wᵀ (+ bias)` for the `m` rows of `x`, W weight `name` (or
    /// expert `expert` of stack `name`).
    pub fn matmul(
        &self,
        name: &str,
        expert: Option<usize>,
        x: &[f32],
        m: usize,
    ) -> Result<Vec<f32>> {
        self.whole_stack(name, expert)?;
        let Some(gpu) = &self.gpu else {
            return match expert {
                None => self.model.matmul_cpu(name, x, m),
                Some(e) => self.model.matmul_cpu_expert(name, e, x, m),
            };
        };
        let w = self.packed(gpu, name, expert)?;
        if m.checked_mul(w.k) != Some(x.len()) {
            let detail = format!("x holds {} values, not {m} rows of {}", x.len(), w.k);
            return Err(self.refuse(name, detail));
        }
        gpu.matmul(&w, x, m)
    }

    /// `y[r] = x[r]·W[ids[r]]ᵀ (+ bias)` for the `m` rows of `x` (`k`
    /// values each), `W[e]` expert `e` of stack `stack` ([`Model::expert_stacks`]):
    /// `(y, n)`, n known for no rows too.
    pub fn matmul_experts(
        &self,
        stack: &str,
        x: &[f32],
        (m, k): (usize, usize),
        ids: &[u32],
    ) -> Result<(Vec<f32>, usize)> {
        if ids.len() != m || m.checked_mul(k) != Some(x.len()) {
            let detail = format!(
                "{} expert ids and {} values of x for {m} rows of {k}",
                ids.len(),
                x.len()
            );
            return Err(self.refuse(stack, detail));
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
            return Err(self.refuse(stack, format!("x has rows of {k} values, not {}", w.k)));
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= w.experts) {
            let detail = format!("has {} experts, not {}", w.experts, id as u64 + 1);
            return Err(self.refuse(stack, detail));
        }
        match m {
            0 => Ok((Vec::new(), w.n)),
            _ => Ok((gpu.matmul_experts(&w, x, m, ids)?, w.n)),
        }
    }

    /// `(n, k)` of the product with `name` (expert `expert` of it): the
    /// uploaded weight's, a 2-D weight's shape, or found by multiplying
    /// one row of zeros on the CPU (an expert's inputs are the ones its
    /// codes are packed along, its dense rows or its columns).
    pub fn dims(&self, name: &str, expert: Option<usize>) -> Result<(usize, usize)> {
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
            match self.matmul(name, expert, &vec![0.0; k], 1) {
                Ok(y) => return Ok((y.len(), k)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::bare(Rule::Internal, "no width to try")))
    }

    /// A stack of experts is multiplied an expert at a time.
    fn whole_stack(&self, name: &str, expert: Option<usize>) -> Result<()> {
        match self.model.info(name)?.shape[..] {
            [e, _, _] if expert.is_none() => Err(self.refuse(
                name,
                format!(
                    "is a stack of {e} experts: pass an expert's index (0 to {})",
                    e.max(1) - 1
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Weight `name` (expert `expert` of it) on `gpu`, uploaded the first
    /// time it is used.
    fn packed(
        &self,
        gpu: &GpuDecoder,
        name: &str,
        expert: Option<usize>,
    ) -> Result<Arc<PackedLinear>> {
        let lock = || self.packed.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (name.to_string(), expert);
        if let Some(p) = lock().get(&key).cloned() {
            return Ok(p);
        }
        let w = Arc::new(match expert {
            None => self.model.upload_packed(name, gpu)?,
            Some(e) => self.model.upload_expert(name, e, gpu)?,
        });
        Ok(lock().entry(key).or_insert(w).clone())
    }

    /// Every expert of `stack` on `gpu`, uploaded the first time it is used.
    fn packed_stack(&self, gpu: &GpuDecoder, stack: &str) -> Result<Arc<PackedLinear>> {
        let lock = || self.stacks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = lock().get(stack).cloned() {
            return Ok(p);
        }
        let w = Arc::new(self.model.upload_experts(stack, gpu)?);
        Ok(lock().entry(stack.to_string()).or_insert(w).clone())
    }

    /// An argument refused, naming the checkpoint and `what`.
    fn refuse(&self, what: &str, detail: String) -> Error {
        Error::tensor(Rule::Argument, &self.path, what, detail)
    }
}

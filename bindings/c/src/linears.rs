//! Products with packed weights (`wdq_linears_*`): a checkpoint's quantized
//! Linears multiplied straight from their packs, on the GPU through
//! `GpuDecoder::matmul` with each weight uploaded once, or on the CPU
//! through `Model::matmul_cpu`; rows routed to the experts of one stack
//! through `GpuDecoder::matmul_experts` (the stack uploaded once) or
//! `Model::matmul_cpu_experts`.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CString};
use std::sync::{Arc, Mutex, MutexGuard};

use wgpu_dequant::{
    BackendChoice, DtypeChoice, Error, GpuDecoder, Model, PackedLinear, Result, Rule,
};

use crate::{argument, call, text};

/// A checkpoint's quantized Linears, for products with their packed
/// weights ([`wdq_linears_open`] … [`wdq_linears_close`]).
pub struct WdqLinears {
    model: Model,
    /// The checkpoint as given, for errors that name it.
    path: String,
    names: Vec<CString>,
    gpu: Option<GpuDecoder>,
    /// Each weight (or expert) uploaded once.
    packed: Mutex<Uploads>,
    /// The stacks of experts (`Model::expert_stacks`): name, experts.
    stacks: Vec<(CString, usize)>,
    /// Each stack of experts uploaded once, whole.
    packed_stacks: Mutex<HashMap<String, Arc<PackedLinear>>>,
}

/// The weights uploaded, by name and expert.
type Uploads = HashMap<(String, Option<usize>), Arc<PackedLinear>>;

impl WdqLinears {
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
        let lock = || self.packed_stacks.lock().unwrap_or_else(|p| p.into_inner());
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

    /// A stack of experts needs an expert's index.
    fn whole_stack(&self, name: &str, expert: Option<usize>) -> Result<()> {
        match self.model.info(name)?.shape[..] {
            [e, _, _] if expert.is_none() => {
                let detail = format!("is a stack of {e} experts: pass an expert's index");
                Err(Error::tensor(Rule::Argument, &self.path, name, detail))
            }
            _ => Ok(()),
        }
    }

    /// `(n, k)` of the product: the uploaded weight's, a 2-D weight's
    /// shape, or found by multiplying one row of zeros on the CPU (an
    /// expert's inputs are the ones its codes are packed along, its dense
    /// rows or its columns).
    fn dims(&self, name: &str, expert: Option<usize>) -> Result<(usize, usize)> {
        self.whole_stack(name, expert)?;
        if let Some(gpu) = &self.gpu {
            let w = self.packed(gpu, name, expert)?;
            return Ok((w.n, w.k));
        }
        let shape = self.model.info(name)?.shape;
        let quantized = self.names.iter().any(|n| n.as_bytes() == name.as_bytes());
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

/// `expert` as the library takes it: -1 is none.
fn expert_index(expert: i64) -> Result<Option<usize>> {
    match expert {
        -1 => Ok(None),
        e => usize::try_from(e)
            .map(Some)
            .map_err(|_| argument(format!("expert {e}: an index, or -1 for none"))),
    }
}

/// Opens and plans the checkpoint at `path` for products with its
/// quantized weights on `backend`: "gpu" or a graphics API's name
/// ("vulkan", "metal", "dx12", "gl"; status 1 without an adapter), "cpu",
/// or "auto" (a hardware GPU when there is one, the CPU otherwise). `*out` receives it (free it with [`wdq_linears_close`]).
///
/// # Safety
/// Strings are NULL or NUL-terminated; `out` is NULL or writable; `err` is
/// NULL or holds `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn wdq_linears_open(
    path: *const c_char,
    dtype: *const c_char,
    backend: *const c_char,
    out: *mut *mut WdqLinears,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    call(err, err_len, || {
        if out.is_null() {
            return Err(argument("out is NULL".into()));
        }
        *out = std::ptr::null_mut();
        let path = text(path, "path")?;
        let dtype: DtypeChoice = text(dtype, "dtype")?.parse()?;
        let choice: BackendChoice = text(backend, "backend")?.parse()?;
        let model = Model::open(path, dtype)?;
        let names = model
            .quantized()
            .map(|t| CString::new(t.name).map_err(|_| argument("a tensor name holds NUL".into())))
            .collect::<Result<Vec<_>>>()?;
        let stacks = model
            .expert_stacks()
            .into_iter()
            .map(|(s, experts)| {
                let s = CString::new(s).map_err(|_| argument("a stack name holds NUL".into()))?;
                Ok((s, experts.len()))
            })
            .collect::<Result<Vec<_>>>()?;
        let l = WdqLinears {
            model,
            path: path.to_string(),
            names,
            gpu: GpuDecoder::for_backend(choice)?,
            packed: Mutex::default(),
            stacks,
            packed_stacks: Mutex::default(),
        };
        *out = Box::into_raw(Box::new(l));
        Ok(())
    })
}

/// Number of quantized weights (0 for NULL).
///
/// # Safety
/// `l` is NULL or from [`wdq_linears_open`] and not closed.
#[no_mangle]
pub unsafe extern "C" fn wdq_linears_count(l: *const WdqLinears) -> usize {
    l.as_ref().map_or(0, |l| l.names.len())
}

/// Name of quantized weight `i` (sorted by name; a dense checkpoint's
/// name), valid until [`wdq_linears_close`]; NULL for NULL or an `i` out
/// of range.
///
/// # Safety
/// `l` is NULL or from [`wdq_linears_open`] and not closed.
#[no_mangle]
pub unsafe extern "C" fn wdq_linears_name(l: *const WdqLinears, i: usize) -> *const c_char {
    match l.as_ref().and_then(|l| l.names.get(i)) {
        Some(name) => name.as_ptr(),
        None => std::ptr::null(),
    }
}

/// Where the products run: "gpu" or "cpu" (NULL for NULL).
///
/// # Safety
/// `l` is NULL or from [`wdq_linears_open`] and not closed.
#[no_mangle]
pub unsafe extern "C" fn wdq_linears_backend(l: *const WdqLinears) -> *const c_char {
    match l.as_ref().map(|l| l.gpu.is_some()) {
        Some(true) => c"gpu".as_ptr(),
        Some(false) => c"cpu".as_ptr(),
        None => std::ptr::null(),
    }
}

/// `*n` and `*k` of the product with weight `name` (expert `expert` of a
/// 3-D stack, -1 for none): y's and x's row lengths.
///
/// # Safety
/// `l` is NULL or from [`wdq_linears_open`] and not closed; `name` is NULL
/// or NUL-terminated; `n` and `k` are NULL or writable; `err` is NULL or
/// holds `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn wdq_linears_dims(
    l: *const WdqLinears,
    name: *const c_char,
    expert: i64,
    n: *mut usize,
    k: *mut usize,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    call(err, err_len, || {
        let l = l
            .as_ref()
            .ok_or_else(|| argument("linears is NULL".into()))?;
        let (n, k) = match (n.as_mut(), k.as_mut()) {
            (Some(n), Some(k)) => (n, k),
            _ => return Err(argument("n or k is NULL".into())),
        };
        (*n, *k) = l.dims(text(name, "name")?, expert_index(expert)?)?;
        Ok(())
    })
}

/// `y = x·Wᵀ (+ bias)` for quantized weight `name` (expert `expert` of a
/// 3-D stack, multiplied as the model does; -1 for none): `x` holds `m`
/// rows of `k` floats, `y` receives `m` rows of `n`; `k` and `n` must be
/// the weight's ([`wdq_linears_dims`]). W is the dense weight
/// `wdq_decode` gives in the dtype opened, widened to
/// float.
///
/// # Safety
/// `l` is NULL or from [`wdq_linears_open`] and not closed; `name` is NULL
/// or NUL-terminated; `x` is NULL or holds `m * k` floats, `y` NULL or
/// `m * n` writable ones; `err` is NULL or holds `err_len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn wdq_linears_matmul(
    l: *const WdqLinears,
    name: *const c_char,
    expert: i64,
    x: *const f32,
    m: usize,
    k: usize,
    y: *mut f32,
    n: usize,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    call(err, err_len, || {
        let l = l
            .as_ref()
            .ok_or_else(|| argument("linears is NULL".into()))?;
        let name = text(name, "name")?;
        let expert = expert_index(expert)?;
        if x.is_null() || y.is_null() {
            return Err(argument("x or y is NULL".into()));
        }
        let (x_len, y_len) = match (m.checked_mul(k), m.checked_mul(n)) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(argument(format!("{m} rows of {k} or {n} overflow"))),
        };
        let (want_n, want_k) = match m {
            0 => l.dims(name, expert)?,
            _ => (n, k),
        };
        let y_all = match m {
            0 => Vec::new(),
            // SAFETY: the caller hands `m * k` floats at `x`.
            _ => l.product(name, expert, std::slice::from_raw_parts(x, x_len), m)?,
        };
        let got_n = y_all.len().checked_div(m).unwrap_or(want_n);
        if (k, n) != (want_k, got_n) {
            let detail = format!(
                "x has rows of {k} values and y of {n}; the product takes {want_k} and gives {got_n}"
            );
            return Err(Error::tensor(Rule::Argument, &l.path, name, detail));
        }
        // SAFETY: the caller hands `m * n` writable floats at `y`, and
        // `y_all` holds that many.
        std::slice::from_raw_parts_mut(y, y_len).copy_from_slice(&y_all);
        Ok(())
    })
}

/// Number of stacks of experts (0 for NULL): a 3-D stack (GPT-OSS's) by
/// its dense name, experts stored one weight each (Mixtral's, Qwen-MoE's,
/// mlx-lm's, GGUF's `*_exps`) as `<block>.experts.*.<rest>`.
///
/// # Safety
/// `l` is NULL or from [`wdq_linears_open`] and not closed.
#[no_mangle]
pub unsafe extern "C" fn wdq_linears_stack_count(l: *const WdqLinears) -> usize {
    l.as_ref().map_or(0, |l| l.stacks.len())
}

/// Name of stack of experts `i` (sorted by name), valid until
/// [`wdq_linears_close`]; NULL for NULL or an `i` out of range.
///
/// # Safety
/// `l` is NULL or from [`wdq_linears_open`] and not closed.
#[no_mangle]
pub unsafe extern "C" fn wdq_linears_stack_name(l: *const WdqLinears, i: usize) -> *const c_char {
    match l.as_ref().and_then(|l| l.stacks.get(i)) {
        Some((name, _)) => name.as_ptr(),
        None => std::ptr::null(),
    }
}

/// Number of experts of stack `i` (0 for NULL or an `i` out of range):
/// expert `e` is expert `e` of a 3-D stack ([`wdq_linears_matmul`]'s
/// `expert`), or the weight named with `.experts.<e>.` for `.experts.*.`.
///
/// # Safety
/// `l` is NULL or from [`wdq_linears_open`] and not closed.
#[no_mangle]
pub unsafe extern "C" fn wdq_linears_stack_experts(l: *const WdqLinears, i: usize) -> usize {
    l.as_ref()
        .and_then(|l| l.stacks.get(i))
        .map_or(0, |(_, experts)| *experts)
}

/// `y[r] = x[r]·W[ids[r]]ᵀ (+ bias)` for the `m` rows of `x` (`k` floats
/// each), W[e] expert `e` of stack `stack` ([`wdq_linears_stack_name`]):
/// `ids` holds `m` expert indices, `y` receives `m` rows of `n`. Each row
/// is exactly what its expert's own [`wdq_linears_matmul`] gives it. On
/// the GPU the stack is uploaded whole the first time it is used.
///
/// # Safety
/// `l` is NULL or from [`wdq_linears_open`] and not closed; `stack` is NULL
/// or NUL-terminated; `x` is NULL or holds `m * k` floats, `ids` NULL or
/// `m` indices, `y` NULL or `m * n` writable floats; `err` is NULL or holds
/// `err_len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn wdq_linears_matmul_experts(
    l: *const WdqLinears,
    stack: *const c_char,
    x: *const f32,
    m: usize,
    k: usize,
    ids: *const u32,
    y: *mut f32,
    n: usize,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    call(err, err_len, || {
        let l = l
            .as_ref()
            .ok_or_else(|| argument("linears is NULL".into()))?;
        let stack = text(stack, "stack")?;
        if x.is_null() || y.is_null() || ids.is_null() {
            return Err(argument("x, ids or y is NULL".into()));
        }
        let (x_len, y_len) = match (m.checked_mul(k), m.checked_mul(n)) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(argument(format!("{m} rows of {k} or {n} overflow"))),
        };
        // SAFETY: the caller hands `m * k` floats at `x` and `m` ids.
        let (x, ids) = (
            std::slice::from_raw_parts(x, x_len),
            std::slice::from_raw_parts(ids, m),
        );
        let (y_all, got_n) = l.routed(stack, x, (m, k), ids)?;
        if got_n != n {
            let detail = format!("y has rows of {n} values; the product gives {got_n}");
            return Err(Error::tensor(Rule::Argument, &l.path, stack, detail));
        }
        // SAFETY: the caller hands `m * n` writable floats at `y`, and
        // `y_all` holds that many.
        std::slice::from_raw_parts_mut(y, y_len).copy_from_slice(&y_all);
        Ok(())
    })
}

/// Frees what [`wdq_linears_open`] made (the GPU's copies of the weights
/// with it); NULL is ignored.
///
/// # Safety
/// `l` is NULL or from [`wdq_linears_open`] and not closed before.
#[no_mangle]
pub unsafe extern "C" fn wdq_linears_close(l: *mut WdqLinears) {
    if !l.is_null() {
        drop(Box::from_raw(l));
    }
}

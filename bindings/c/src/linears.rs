//! Products with packed weights (`wdq_linears_*`): a checkpoint's quantized
//! Linears multiplied straight from their packs through the crate's
//! `Products` (on the GPU each weight, and each stack of experts routed
//! to, uploaded once; or on the CPU), its arguments checked as C hands
//! them.

use std::ffi::{c_char, c_int, CString};

use wgpu_dequant::{BackendChoice, DtypeChoice, Error, Products, Result, Rule};

use crate::{argument, call, text};

/// A checkpoint's quantized Linears, for products with their packed
/// weights ([`wdq_linears_open`] … [`wdq_linears_close`]).
pub struct WdqLinears {
    // The crate's products, with their names as C strings.
    products: Products,
    /// The checkpoint as given, for errors that name it.
    path: String,
    names: Vec<CString>,
    /// The stacks of experts (`Model::expert_stacks`): name, experts.
    stacks: Vec<(CString, usize)>,
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
        let products = Products::open(path, dtype, choice)?;
        let names = products
            .quantized()
            .iter()
            .map(|t| {
                CString::new(t.as_str()).map_err(|_| argument("a tensor name holds NUL".into()))
            })
            .collect::<Result<Vec<_>>>()?;
        let stacks = products
            .model()
            .expert_stacks()
            .into_iter()
            .map(|(s, experts)| {
                let s = CString::new(s).map_err(|_| argument("a stack name holds NUL".into()))?;
                Ok((s, experts.len()))
            })
            .collect::<Result<Vec<_>>>()?;
        let l = WdqLinears {
            products,
            path: path.to_string(),
            names,
            stacks,
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
    match l.as_ref().map(|l| l.products.gpu().is_some()) {
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
        (*n, *k) = l
            .products
            .dims(text(name, "name")?, expert_index(expert)?)?;
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
            0 => l.products.dims(name, expert)?,
            _ => (n, k),
        };
        let y_all = match m {
            0 => Vec::new(),
            // SAFETY: the caller hands `m * k` floats at `x`.
            _ => l
                .products
                .matmul(name, expert, std::slice::from_raw_parts(x, x_len), m)?,
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
        let (y_all, got_n) = l.products.matmul_experts(stack, x, (m, k), ids)?;
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

//! wgpu-dequant's C ABI: a thin layer over the library's public API
//! (`dequantize`, `Model`, products with packed weights in `linears`), with
//! no decoding of its own. No panic crosses
//! the boundary; null pointers and short buffers are errors.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use wgpu_dequant::{BackendChoice, Dequantize, DtypeChoice, Error, Model, Note, Result, Rule};

mod linears;

/// An opened and planned checkpoint ([`wdq_open`] … [`wdq_close`]).
pub struct WdqCheckpoint {
    model: Model,
    names: Vec<CString>,
}

/// What [`wdq_tensor_info`] tells of one tensor of the dense checkpoint.
#[repr(C)]
pub struct WdqTensorInfo {
    /// The safetensors dtype name ("BF16", "F16", "F32", …), NUL-terminated.
    pub dtype: [c_char; 8],
    /// Number of dimensions (at most 8).
    pub ndim: usize,
    /// The first `ndim` entries are the shape.
    pub shape: [usize; 8],
    /// Size of the decoded bytes.
    pub nbytes: usize,
}

/// Writes `msg` into `err` (NUL-terminated, cut to `err_len` bytes at a
/// character boundary); nothing when `err` is null or `err_len` is 0.
fn write_err(err: *mut c_char, err_len: usize, msg: &str) {
    if err.is_null() || err_len == 0 {
        return;
    }
    let mut n = msg.len().min(err_len - 1);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: the caller hands `err_len` writable bytes at `err`.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), err.cast::<u8>(), n);
        *err.add(n) = 0;
    }
}

/// Runs `f`, turning its error (or a panic) into the CLI's exit status and
/// message.
fn call(err: *mut c_char, err_len: usize, f: impl FnOnce() -> Result<()>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            write_err(err, err_len, "");
            0
        }
        Ok(Err(e)) => {
            write_err(err, err_len, &e.to_string());
            c_int::from(e.rule.exit_code())
        }
        Err(_) => {
            write_err(err, err_len, "internal error: wgpu-dequant panicked");
            1
        }
    }
}

fn argument(detail: String) -> Error {
    Error::bare(Rule::Argument, detail)
}

/// The UTF-8 string at `p`, which must not be null.
///
/// SAFETY: `p` is null or points to a NUL-terminated string that outlives 'a.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(argument(format!("{what} is NULL")));
    }
    CStr::from_ptr(p)
        .to_str()
        .map_err(|_| argument(format!("{what} is not UTF-8")))
}

/// Decodes the checkpoint at `input` into a dense one in `output` (a new or
/// empty directory), as `wgpu-dequant dequantize` does.
///
/// # Safety
/// Strings are NULL or NUL-terminated; `err` is NULL or holds `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn wdq_dequantize(
    input: *const c_char,
    output: *const c_char,
    dtype: *const c_char,
    backend: *const c_char,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    wdq_dequantize_run(
        input,
        output,
        dtype,
        backend,
        std::ptr::null(),
        err,
        err_len,
    )
}

/// The settings of [`wdq_dequantize_run`] beyond dtype and backend; all
/// zero is a plain run.
#[repr(C)]
pub struct WdqRun {
    /// Non-zero: write into an output that holds files (`--force`).
    pub force: c_int,
    /// Non-zero: continue an interrupted run, or find a finished one
    /// (`--resume`).
    pub resume: c_int,
    /// Job `part_index` of `part_count` (`--part I/N`); `part_count` 0: all
    /// shards.
    pub part_index: usize,
    /// See `part_index`.
    pub part_count: usize,
    /// Output files of at most this many bytes (`--max-shard-size`); 0:
    /// the input's sharding.
    pub max_shard_size: u64,
}

/// [`wdq_dequantize`] with the settings of release-scale runs: `run` NULL
/// is all zero. Returns 0 also when `--resume` finds the job finished.
/// The run's warnings (what it dropped, guessed or changed) go to stderr as
/// the CLI prints them; [`wdq_dequantize_warned`] hands them over instead.
///
/// # Safety
/// Strings are NULL or NUL-terminated; `run` is NULL or readable; `err` is
/// NULL or holds `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn wdq_dequantize_run(
    input: *const c_char,
    output: *const c_char,
    dtype: *const c_char,
    backend: *const c_char,
    run: *const WdqRun,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    wdq_dequantize_warned(
        input,
        output,
        dtype,
        backend,
        run,
        0,
        None,
        std::ptr::null_mut(),
        err,
        err_len,
    )
}

/// Called with each warning of a run, before anything is written: the
/// CLI's line after `warning: ` and the rule id (both NUL-terminated, valid
/// during the call), and the caller's `user` pointer.
pub type WdqWarningFn =
    Option<unsafe extern "C" fn(message: *const c_char, rule: *const c_char, user: *mut c_void)>;

/// [`wdq_dequantize_run`], with each warning handed to `on_warning` (NULL:
/// printed to stderr), and `strict` non-zero refusing a run that has any
/// (`--strict`: exit status 3, nothing written).
///
/// # Safety
/// As [`wdq_dequantize_run`]; `on_warning` is NULL or safe to call with
/// `user` from the calling thread.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn wdq_dequantize_warned(
    input: *const c_char,
    output: *const c_char,
    dtype: *const c_char,
    backend: *const c_char,
    run: *const WdqRun,
    strict: c_int,
    on_warning: WdqWarningFn,
    user: *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    call(err, err_len, || {
        let input = text(input, "input")?;
        let output = text(output, "output")?;
        let warn = move |w: &wgpu_dequant::Warning| match on_warning {
            Some(f) => {
                let message = CString::new(w.message().replace('\0', " "));
                let rule = CString::new(w.rule.id());
                if let (Ok(message), Ok(rule)) = (message, rule) {
                    // SAFETY: the caller vouches for `f` and `user`; the
                    // strings live until the call returns.
                    unsafe { f(message.as_ptr(), rule.as_ptr(), user) };
                }
            }
            None => eprintln!("warning: {w}"),
        };
        let mut job = Dequantize::new()
            .dtype(text(dtype, "dtype")?.parse()?)
            .backend(text(backend, "backend")?.parse()?)
            .strict(strict != 0)
            .on_note(move |note| {
                if let Note::Warning(w) = note {
                    warn(w);
                }
            });
        if let Some(run) = run.as_ref() {
            job = job.force(run.force != 0).resume(run.resume != 0);
            if run.part_count > 0 {
                job = job.part(run.part_index, run.part_count);
            }
            if run.max_shard_size > 0 {
                job = job.max_shard_size(run.max_shard_size);
            }
        }
        job.run(input, output).map(|_| ())
    })
}

/// Opens and plans the checkpoint at `path`; `*out` receives it (free it
/// with [`wdq_close`]).
///
/// # Safety
/// Strings are NULL or NUL-terminated; `out` is NULL or writable; `err` is
/// NULL or holds `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn wdq_open(
    path: *const c_char,
    dtype: *const c_char,
    out: *mut *mut WdqCheckpoint,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    call(err, err_len, || {
        if out.is_null() {
            return Err(argument("out is NULL".into()));
        }
        *out = std::ptr::null_mut();
        let dtype: DtypeChoice = text(dtype, "dtype")?.parse()?;
        let model = Model::open(text(path, "path")?, dtype)?;
        let names = model
            .tensors()
            .map(|t| CString::new(t.name).map_err(|_| argument("a tensor name holds NUL".into())))
            .collect::<Result<Vec<_>>>()?;
        let c = WdqCheckpoint { model, names };
        *out = Box::into_raw(Box::new(c));
        Ok(())
    })
}

/// Number of tensors of the dense checkpoint (0 for NULL).
///
/// # Safety
/// `c` is NULL or from [`wdq_open`] and not closed.
#[no_mangle]
pub unsafe extern "C" fn wdq_tensor_count(c: *const WdqCheckpoint) -> usize {
    c.as_ref().map_or(0, |c| c.names.len())
}

/// Name of tensor `i` (sorted by name), valid until [`wdq_close`]; NULL for
/// NULL or an `i` out of range.
///
/// # Safety
/// `c` is NULL or from [`wdq_open`] and not closed.
#[no_mangle]
pub unsafe extern "C" fn wdq_tensor_name(c: *const WdqCheckpoint, i: usize) -> *const c_char {
    match c.as_ref().and_then(|c| c.names.get(i)) {
        Some(name) => name.as_ptr(),
        None => std::ptr::null(),
    }
}

/// The dtype, shape and size of tensor `name`.
///
/// # Safety
/// `c` is NULL or from [`wdq_open`] and not closed; `name` is NULL or
/// NUL-terminated; `out` is NULL or writable; `err` is NULL or holds
/// `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn wdq_tensor_info(
    c: *const WdqCheckpoint,
    name: *const c_char,
    out: *mut WdqTensorInfo,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    call(err, err_len, || {
        let c = c
            .as_ref()
            .ok_or_else(|| argument("checkpoint is NULL".into()))?;
        let out = out.as_mut().ok_or_else(|| argument("out is NULL".into()))?;
        let name = text(name, "name")?;
        let t = c.model.info(name)?;
        if t.shape.len() > out.shape.len() {
            return Err(argument(format!(
                "{name}: {} dimensions, more than 8",
                t.shape.len()
            )));
        }
        let dtype = t.dtype.to_string();
        out.dtype = [0; 8];
        for (d, b) in out.dtype.iter_mut().zip(dtype.bytes().take(7)) {
            *d = b as c_char;
        }
        out.ndim = t.shape.len();
        out.shape = [0; 8];
        out.shape[..t.shape.len()].copy_from_slice(&t.shape);
        out.nbytes = t.bytes;
        Ok(())
    })
}

/// Decodes tensor `name` into `dst`, which holds `dst_len` bytes (at least
/// its `nbytes`): little-endian elements, row-major.
///
/// # Safety
/// `c` is NULL or from [`wdq_open`] and not closed; strings are NULL or
/// NUL-terminated; `dst` is NULL or holds `dst_len` writable bytes; `err` is
/// NULL or holds `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn wdq_decode(
    c: *const WdqCheckpoint,
    name: *const c_char,
    backend: *const c_char,
    dst: *mut c_void,
    dst_len: usize,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    call(err, err_len, || {
        let c = c
            .as_ref()
            .ok_or_else(|| argument("checkpoint is NULL".into()))?;
        let name = text(name, "name")?;
        let choice: BackendChoice = text(backend, "backend")?.parse()?;
        if dst.is_null() {
            return Err(argument("dst is NULL".into()));
        }
        let t = c.model.info(name)?;
        if dst_len < t.bytes {
            return Err(argument(format!(
                "{name}: dst holds {dst_len} bytes, the tensor {}",
                t.bytes
            )));
        }
        // SAFETY: the caller hands `dst_len` ≥ `t.bytes` writable bytes.
        let dst = std::slice::from_raw_parts_mut(dst.cast::<u8>(), t.bytes);
        c.model.decode_into(name, choice, dst)
    })
}

/// Frees a checkpoint from [`wdq_open`]; NULL is ignored.
///
/// # Safety
/// `c` is NULL or from [`wdq_open`] and not closed before.
#[no_mangle]
pub unsafe extern "C" fn wdq_close(c: *mut WdqCheckpoint) {
    if !c.is_null() {
        drop(Box::from_raw(c));
    }
}

//! The native half of the `wgpu_dequant` Python package: a thin layer over
//! the library's public API (`Model`, `Dequantize`, `inspect`, products
//! with packed weights in `linears`). Decoding
//! runs with the GIL released; the Python half (`python/wgpu_dequant`) turns
//! bytes into torch or numpy tensors and draws progress.

use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use wgpu_dequant::{BackendChoice, Canceller, Dequantize, DtypeChoice, Error, Model, Progress};

mod linears;

pyo3::create_exception!(
    _native,
    DequantError,
    PyValueError,
    "A checkpoint or an argument wgpu-dequant refuses: the message is the CLI's one line, `rule` its rule id."
);

fn py_err(e: Error) -> PyErr {
    Python::attach(|py| {
        let err = DequantError::new_err(e.to_string());
        let _ = err.value(py).setattr("rule", e.rule.id());
        err
    })
}

/// An opened and planned checkpoint, decoded tensor by tensor.
#[pyclass(name = "Checkpoint", module = "wgpu_dequant._native", frozen)]
struct NativeCheckpoint {
    model: Model,
}

#[pymethods]
impl NativeCheckpoint {
    #[new]
    fn new(py: Python<'_>, path: &str, dtype: &str) -> PyResult<Self> {
        let dtype: DtypeChoice = dtype.parse().map_err(py_err)?;
        let model = py.detach(|| Model::open(path, dtype)).map_err(py_err)?;
        Ok(NativeCheckpoint { model })
    }

    /// The plan's warnings, each the CLI's line after `warning: `.
    fn warnings(&self) -> Vec<String> {
        self.model.warnings().iter().map(|w| w.message()).collect()
    }

    /// The dense checkpoint's tensor names, sorted.
    fn keys(&self) -> Vec<String> {
        self.model.tensors().map(|t| t.name).collect()
    }

    /// `(dtype, shape, nbytes)` of tensor `name`; dtype is the safetensors
    /// name ("BF16", "F32", …).
    fn info(&self, name: &str) -> PyResult<(String, Vec<usize>, usize)> {
        let t = self.model.info(name).map_err(py_err)?;
        Ok((t.dtype.to_string(), t.shape, t.bytes))
    }

    /// The decoded bytes of tensor `name` in a new `bytearray`, decoded by
    /// `backend` with the GIL released.
    fn decode<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        backend: &str,
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let (_, _, nbytes) = self.info(name)?;
        let choice: BackendChoice = backend.parse().map_err(py_err)?;
        let mut failed = None;
        let array = PyByteArray::new_with(py, nbytes, |buf| {
            // The bytearray is new and no Python code can reach it yet, so
            // filling it without the GIL races with nothing.
            let result = py.detach(|| self.model.decode_into(name, choice, buf));
            if let Err(e) = result {
                failed = Some(e);
            }
            Ok(())
        })?;
        match failed {
            Some(e) => Err(py_err(e)),
            None => Ok(array),
        }
    }
}

/// Writes the dense checkpoint of `path` into `out`, as the CLI does;
/// returns the summary as JSON. `progress`, when not None, is called with
/// `(done_bytes, total_bytes, tensor)` after every piece. Ctrl-C cancels the
/// run and leaves nothing (with `resume`: what it finished, for the next
/// resumed run).
/// `part` is job `(I, N)` (`--part I/N`), `shards` the input shards to
/// write (`--shards`), `max_shard_size` a size as `--max-shard-size` reads
/// it. `strict` refuses the run, writing nothing, when the plan has a
/// warning; otherwise the warnings are in the summary's `warnings`.
#[pyfunction]
#[pyo3(signature = (path, out, dtype, backend, force, progress, resume = false, part = None, shards = None, max_shard_size = None, strict = false))]
#[allow(clippy::too_many_arguments)]
fn dequantize(
    py: Python<'_>,
    path: &str,
    out: &str,
    dtype: &str,
    backend: &str,
    force: bool,
    progress: Option<Py<PyAny>>,
    resume: bool,
    part: Option<(usize, usize)>,
    shards: Option<Vec<String>>,
    max_shard_size: Option<String>,
    strict: bool,
) -> PyResult<String> {
    let dtype: DtypeChoice = dtype.parse().map_err(py_err)?;
    let choice: BackendChoice = backend.parse().map_err(py_err)?;
    let max_shard_size = max_shard_size
        .map(|s| wgpu_dequant::parse_size(&s))
        .transpose()
        .map_err(py_err)?;
    let canceller = Canceller::default();
    let cancel = canceller.clone();
    let run = move || {
        let on_progress = move |p: &Progress<'_>| {
            if let Some(f) = &progress {
                // A callback that raises is the caller's to see, not a reason
                // to stop decoding.
                Python::attach(|py| {
                    if let Err(e) = f.call1(py, (p.done_bytes, p.total_bytes, p.tensor)) {
                        e.print(py);
                    }
                });
            }
        };
        let mut run = Dequantize::new()
            .dtype(dtype)
            .backend(choice)
            .force(force)
            .resume(resume)
            .strict(strict)
            .canceller(cancel)
            .on_progress(on_progress);
        if let Some((index, count)) = part {
            run = run.part(index, count);
        }
        if let Some(shards) = shards {
            run = run.shards(shards);
        }
        if let Some(max) = max_shard_size {
            run = run.max_shard_size(max);
        }
        run.run(path, out)
    };
    let (done_tx, done_rx) = channel();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let _ = done_tx.send(run());
        });
        // Wait with the GIL released, waking to let Python see Ctrl-C.
        let mut done_rx = done_rx;
        loop {
            let (rx, received) = py.detach(move || {
                let r = done_rx.recv_timeout(Duration::from_millis(50));
                (done_rx, r)
            });
            done_rx = rx;
            match received {
                Ok(result) => {
                    let summary = result.map_err(py_err)?;
                    return serde_json::to_string(&summary)
                        .map_err(|e| PyValueError::new_err(e.to_string()));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(PyValueError::new_err("the writing thread stopped"));
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(interrupt) = py.check_signals() {
                        canceller.cancel();
                        let _ = py.detach(move || done_rx.recv());
                        return Err(interrupt);
                    }
                }
            }
        }
    })
}

/// What `inspect --json` prints, as JSON text.
#[pyfunction]
fn inspect(py: Python<'_>, path: &str) -> PyResult<String> {
    let report = py.detach(|| wgpu_dequant::inspect(path)).map_err(py_err)?;
    serde_json::to_string(&report).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Joins the partial indexes of `part`/`shards` runs into `out`'s index
/// (`merge-index`); returns the index's path.
#[pyfunction]
fn merge_index(path: &str) -> PyResult<String> {
    let merged = wgpu_dequant::merge_index(std::path::Path::new(path)).map_err(py_err)?;
    let (wgpu_dequant::Merged::Wrote(p) | wgpu_dequant::Merged::Already(p)) = merged;
    Ok(p.to_string_lossy().into_owned())
}

/// The `wgpu-dequant` command line, run in this process on `args` (the
/// program's name first): the console script `pip install` puts on PATH.
/// Returns the exit status; an interruption ends the process by its
/// signal, as the binary's does. The GIL is released meanwhile, so that the
/// CLI's own signal handling, not Python's, answers Ctrl-C.
#[pyfunction]
fn cli_main(py: Python<'_>, args: Vec<std::ffi::OsString>) -> u8 {
    py.detach(|| wgpu_dequant::cli::main(args))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeCheckpoint>()?;
    m.add_class::<linears::NativeLinears>()?;
    m.add_function(wrap_pyfunction!(dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(merge_index, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add("DequantError", m.py().get_type::<DequantError>())?;
    Ok(())
}

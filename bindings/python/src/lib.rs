//! The native half of the `wgpu_dequant` Python package: a thin layer over
//! the library's public API (`Model`, the writer, the report). Decoding runs
//! with the GIL released; the Python half (`python/wgpu_dequant`) turns
//! bytes into torch or numpy tensors.

use std::collections::HashMap;
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use wgpu_dequant::backend::{self, Backend};
use wgpu_dequant::report::Report;
use wgpu_dequant::writer::{self, OutputDir};
use wgpu_dequant::{BackendChoice, Checkpoint, DtypeChoice, Error, Model, Plan};

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
    /// Backends opened so far, by name: a GPU device is opened once.
    backends: Mutex<HashMap<String, Box<dyn Backend>>>,
}

#[pymethods]
impl NativeCheckpoint {
    #[new]
    fn new(py: Python<'_>, path: &str, dtype: &str) -> PyResult<Self> {
        let dtype: DtypeChoice = dtype.parse().map_err(py_err)?;
        let model = py.detach(|| Model::open(path, dtype)).map_err(py_err)?;
        Ok(NativeCheckpoint {
            model,
            backends: Mutex::default(),
        })
    }

    /// The dense checkpoint's tensor names, sorted.
    fn keys(&self) -> Vec<String> {
        self.model.tensors().map(|t| t.name).collect()
    }

    /// `(dtype, shape, nbytes)` of tensor `name`; dtype is the safetensors
    /// name ("BF16", "F32", …).
    fn info(&self, name: &str) -> PyResult<(String, Vec<usize>, usize)> {
        let t = self.model.tensor(name).ok_or_else(|| {
            py_err(Error::bare(
                wgpu_dequant::Rule::Argument,
                format!("{name}: no tensor of that name in the dense checkpoint"),
            ))
        })?;
        Ok((format!("{:?}", t.dtype), t.shape, t.bytes))
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
            let result = py.detach(|| {
                let mut backends = self.backends.lock().map_err(|_| {
                    Error::bare(wgpu_dequant::Rule::Io, "a decode panicked earlier")
                })?;
                let b = match backends.entry(backend.to_ascii_lowercase()) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(backend::select(choice)?.0)
                    }
                };
                self.model.decode_into(name, b.as_ref(), buf)
            });
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
/// returns the summary as JSON. Ctrl-C cancels it and leaves nothing.
#[pyfunction]
#[pyo3(signature = (path, out, dtype, backend, force, progress))]
fn dequantize(
    py: Python<'_>,
    path: &str,
    out: &str,
    dtype: &str,
    backend: &str,
    force: bool,
    progress: bool,
) -> PyResult<String> {
    let dtype: DtypeChoice = dtype.parse().map_err(py_err)?;
    let choice: BackendChoice = backend.parse().map_err(py_err)?;
    let dir = if force {
        OutputDir::force(out.as_ref())
    } else {
        OutputDir::create(out.as_ref())
    }
    .map_err(py_err)?;
    let canceller = dir.canceller();
    let (done_tx, done_rx) = channel();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let run = || -> wgpu_dequant::Result<writer::Summary> {
                let ckpt = Checkpoint::open(path)?;
                let plan = Plan::build(&ckpt, dtype)?;
                plan.check()?;
                let (b, _) = backend::select(choice)?;
                let total: u64 = dir.outputs(&plan).iter().map(|o| o.byte_len() as u64).sum();
                let mut done = 0u64;
                let summary = dir.write(&plan, b.as_ref(), |p| {
                    done += p.bytes;
                    if progress {
                        // The CLI's bar, in plain characters.
                        let filled = (done * 40).checked_div(total).unwrap_or(40) as usize;
                        eprint!(
                            "\r[{}{}] {:.1}/{:.1} MB",
                            "#".repeat(filled),
                            "-".repeat(40 - filled),
                            done as f64 / 1e6,
                            total as f64 / 1e6
                        );
                    }
                });
                if progress {
                    eprintln!();
                }
                summary
            };
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
    let report = py
        .detach(|| {
            let ckpt = Checkpoint::open(path)?;
            let plan = Plan::build(&ckpt, DtypeChoice::Auto)?;
            Ok::<_, Error>(Report::new(&plan))
        })
        .map_err(py_err)?;
    serde_json::to_string(&report).map_err(|e| PyValueError::new_err(e.to_string()))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeCheckpoint>()?;
    m.add_function(wrap_pyfunction!(dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add("DequantError", m.py().get_type::<DequantError>())?;
    Ok(())
}

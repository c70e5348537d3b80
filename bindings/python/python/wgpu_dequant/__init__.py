"""Decode quantized safetensors checkpoints (compressed-tensors, ModelOpt
NVFP4, FP8, AutoAWQ, GPTQ, bitsandbytes, GPT-OSS, SVDQuant) to dense bf16 /
f16 / f32 tensors, on any GPU wgpu reaches or on the CPU, with the same bytes
as the ``wgpu-dequant`` CLI. ``load_file("model-bnb-4bit")`` gives a
bitsandbytes checkpoint's dense tensors without torch, transformers or
bitsandbytes.

Shaped like ``safetensors``' own API::

    import wgpu_dequant as wdq
    sd = wdq.load_file("ckpt", dtype="auto", backend="auto", framework="pt")
    with wdq.safe_open("ckpt", framework="pt") as f:
        w = f.get_tensor(f.keys()[0])
    summary = wdq.dequantize("ckpt", "out")
    report = wdq.inspect("ckpt")
    lin = wdq.open_linears("ckpt")             # products with the packed weights
    y = lin.matmul(lin.quantized()[0], x)      # x·Wᵀ (+ bias), W never made dense

A path that does not exist but reads ``ORG/NAME`` (or ``ORG/NAME@REV``, or
with ``revision=``) is a Hugging Face Hub repository, fetched into the
Hugging Face cache (``inspect`` reads only its headers).
"""

import json
import os
import warnings

from . import _native
from ._native import DequantError

__all__ = ["DequantError", "Linears", "WgpuDequantWarning", "dequantize", "inspect", "load_file",
           "merge_index", "open_linears", "safe_open"]


class WgpuDequantWarning(UserWarning):
    """Something a run dropped, guessed or changed on the way to the dense
    model; the message is the CLI's ``warning:`` line (with its rule id)."""

_TORCH = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
          "I8": "int8", "U8": "uint8", "I16": "int16", "I32": "int32", "I64": "int64",
          "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
_NUMPY = {"F16": "<f2", "F32": "<f4", "F64": "<f8", "I8": "i1", "U8": "u1",
          "I16": "<i2", "U16": "<u2", "I32": "<i4", "U32": "<u4", "I64": "<i8", "U64": "<u8",
          "BOOL": "?"}


def _refuse(detail):
    """A DequantError for a bad argument, as the library makes them."""
    err = DequantError(f"[ARG-001] {detail}")
    err.rule = "ARG-001"
    return err


def _source(path, revision):
    """``path`` as the library takes it: a Hub id's revision joined as ``@REV``."""
    path = os.fspath(path)
    if revision is None:
        return str(path)
    if os.path.exists(path):
        raise _refuse(f"revision= is for Hub ids, and {path} is a local path")
    if "@" in str(path):
        raise _refuse(f"{path} names a revision already; give it once")
    return f"{path}@{revision}"


def _tensor(buf, dtype, shape, framework):
    """The bytes of one tensor as a ``framework`` tensor, without a copy."""
    if framework in ("pt", "torch"):
        import torch

        t = getattr(torch, _TORCH.get(dtype, ""), None)
        if t is None:
            raise _refuse(f"dtype {dtype} has no torch equivalent")
        if len(buf) == 0:
            return torch.empty(shape, dtype=t)
        return torch.frombuffer(buf, dtype=t).reshape(shape)
    if framework in ("np", "numpy"):
        import numpy as np

        if dtype == "BF16" or dtype.startswith("F8"):
            try:
                import ml_dtypes
            except ImportError:
                raise _refuse(
                    f'numpy has no {dtype.lower()}: pip install ml_dtypes, or ask for dtype="f32"'
                ) from None
            np_dtype = {"BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
                        "F8_E5M2": ml_dtypes.float8_e5m2}[dtype]
        else:
            np_dtype = np.dtype(_NUMPY[dtype])
        return np.frombuffer(buf, dtype=np_dtype).reshape(shape)
    raise _refuse(f'framework {framework!r}: "pt" or "np"')


class safe_open:
    """A checkpoint opened and planned once; ``get_tensor`` decodes just the
    tensor asked for. Use as a context manager, as ``safetensors.safe_open``."""

    def __init__(self, path, framework="pt", dtype="auto", backend="auto", revision=None):
        self._checkpoint = _native.Checkpoint(_source(path, revision), dtype)
        for message in self._checkpoint.warnings():
            warnings.warn(message, WgpuDequantWarning, stacklevel=2)
        self._framework = framework
        self._backend = backend

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._checkpoint = None
        return False

    def keys(self):
        """The dense checkpoint's tensor names, sorted."""
        return self._checkpoint.keys()

    def get_tensor(self, name):
        """Tensor ``name`` of the dense checkpoint, decoded now."""
        dtype, shape, _ = self._checkpoint.info(name)
        buf = self._checkpoint.decode(name, self._backend)
        return _tensor(buf, dtype, shape, self._framework)


def load_file(path, dtype="auto", backend="auto", framework="pt", revision=None):
    """Every tensor of the dense form of checkpoint ``path``: name -> tensor."""
    with safe_open(path, framework=framework, dtype=dtype, backend=backend, revision=revision) as f:
        return {name: f.get_tensor(name) for name in f.keys()}


class _Bar:
    """``progress=True``: tqdm's bar when tqdm is installed, else a line on
    stderr that rewrites itself."""

    def __init__(self):
        try:
            from tqdm import tqdm
        except ImportError:
            self._tqdm = None
        else:
            self._tqdm = tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1000)

    def __call__(self, done, total, tensor):
        if self._tqdm is not None:
            self._tqdm.total = total
            self._tqdm.update(done - self._tqdm.n)
            return
        import sys

        print(f"\r{done / 1e6:.1f}/{total / 1e6:.1f} MB", end="", file=sys.stderr, flush=True)

    def close(self):
        if self._tqdm is not None:
            self._tqdm.close()
        else:
            import sys

            print(file=sys.stderr)


def dequantize(path, out, dtype="auto", backend="auto", force=False, progress=False, revision=None,
               resume=False, part=None, shards=None, max_shard_size=None, strict=False):
    """Writes the dense checkpoint of ``path`` into ``out`` as the CLI does and
    returns its summary. Ctrl-C stops it and leaves nothing behind.

    ``resume``: continue an interrupted run into the same ``out`` (the files it
    finished are kept); what this run finishes stays for the next one if it
    is interrupted too (``--resume``). When ``out`` holds this job's finished
    run already, nothing is done and the summary's ``already_done`` is True.

    ``part``: job ``(I, N)`` or ``"I/N"`` of N (``--part``), ``shards``: only
    these input shards (``--shards``); ``merge_index(out)`` joins the jobs.
    ``max_shard_size``: bytes, or a size such as ``"5GB"``.

    ``progress``: ``True`` for a bar (tqdm's, when installed), or a callable
    ``progress(done_bytes, total_bytes, tensor)`` called after every piece.

    What the run dropped, guessed or changed on the way to the dense model
    (a tensor the model has no place for, a config value it cannot state) is
    a ``WgpuDequantWarning`` through :mod:`warnings` and listed in the
    summary's ``warnings``; ``strict=True`` refuses such a run instead,
    writing nothing (``DequantError``)."""
    if isinstance(part, str):
        index, _, count = part.partition("/")
        if not (index.strip().isdigit() and count.strip().isdigit()):
            raise _refuse(f"part={part!r}: expected 'I/N' or (I, N)")
        part = (int(index), int(count))
    if part is not None:
        part = tuple(part)
        if len(part) != 2 or not all(isinstance(v, int) and v >= 0 for v in part):
            raise _refuse(f"part={part!r}: expected 'I/N' or (I, N)")
    if shards is not None:
        shards = [os.fspath(s) for s in shards]
    if max_shard_size is not None:
        max_shard_size = str(max_shard_size)
    bar = _Bar() if progress is True else None
    callback = bar or (progress if callable(progress) else None)
    try:
        text = _native.dequantize(_source(path, revision), str(out), dtype, backend, force, callback,
                                  resume, part, shards, max_shard_size, bool(strict))
    finally:
        if bar is not None:
            bar.close()
    summary = json.loads(text)
    for w in summary.get("warnings", []):
        warnings.warn(w["message"], WgpuDequantWarning, stacklevel=2)
    return summary


def merge_index(out):
    """Joins the partial indexes that ``part``/``shards`` runs wrote into ``out``
    into ``model.safetensors.index.json`` once every shard is there (the CLI's
    ``merge-index``); returns the index's path."""
    return _native.merge_index(os.fspath(out))


def inspect(path, revision=None):
    """The report ``wgpu-dequant inspect --json`` prints, as a dict."""
    return json.loads(_native.inspect(_source(path, revision)))


# Last: the products' module reads the helpers above.
from ._linears import Linears, open_linears  # noqa: E402

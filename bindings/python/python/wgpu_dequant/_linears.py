"""Products with packed weights: ``open_linears(path)`` multiplies by a
checkpoint's quantized Linears straight from their packs (``x·Wᵀ + bias``),
the dense weight never made."""

import operator
import warnings

from . import WgpuDequantWarning, _native, _refuse, _source


class Linears:
    """The quantized Linears of one checkpoint, for products ``x·Wᵀ (+ bias)``
    straight from their packs; from :func:`open_linears`.

    ``backend`` is where they run (``"gpu"`` or ``"cpu"``), ``adapter`` the
    GPU's name (``None`` on the CPU). On the GPU each weight is uploaded
    packed the first time it is used and kept while this object lives."""

    def __init__(self, native):
        self._native = native

    @property
    def backend(self):
        return self._native.backend

    @property
    def adapter(self):
        return self._native.adapter

    def __repr__(self):
        where = self.backend if self.adapter is None else f"gpu: {self.adapter}"
        return f"<wgpu_dequant.Linears: {len(self.quantized())} quantized weights, on {where}>"

    def quantized(self):
        """The names of the quantized weights (dense checkpoint names), sorted."""
        return self._native.quantized()

    def matmul(self, name, x, expert=None):
        """``y = x·Wᵀ (+ bias)`` for quantized weight ``name``: ``x`` a float32
        NumPy array ``[m, k]`` (or ``[k]``, giving ``[n]``) or a torch tensor on
        the CPU (returned as one). ``expert``: expert ``e`` of a 3-D stack of
        experts, multiplied as the model does (GPT-OSS's ``[E, in, out]``
        stacks: ``x·W[e] + bias[e]``). W is the dense weight ``load_file``
        gives, widened to f32; the GIL is released while it runs."""
        if expert is not None:
            if isinstance(expert, bool):
                raise _refuse(f"{name}: expert={expert!r}: an expert's index")
            expert = operator.index(expert)
            if expert < 0:
                raise _refuse(f"{name}: expert={expert}: an expert's index is 0 or more")
        torch, values = _values(x)
        if values is None or values.ndim not in (1, 2):
            _, k = self._native.dims(name, expert)
            raise _refuse(f"{name}: x is {_describe(x)}; expected float32 [m, {k}] or [{k}]"
                          " (a NumPy array, or a torch tensor on the CPU)")
        import numpy as np

        rows = values.reshape(1, -1) if values.ndim == 1 else values
        m, k = rows.shape
        data = np.ascontiguousarray(rows, dtype="<f4").tobytes()
        buf, n = self._native.matmul(name, expert, data, m, k)
        y = np.frombuffer(buf, dtype="<f4").reshape((m, n) if values.ndim == 2 else (n,))
        return torch.from_numpy(y) if torch is not None else y

    def expert_stacks(self):
        """Every stack of experts: a dict from its name to its experts' names
        in expert order. A 3-D stack (GPT-OSS's ``[E, in, out]``) by its dense
        name, its experts ``NAME[e]`` (``matmul(NAME, x, expert=e)``); experts
        stored one weight each (Mixtral's, Qwen-MoE's, mlx-lm's, GGUF's
        ``*_exps``) as ``<block>.experts.*.<rest>``, their own names in order."""
        return dict(self._native.expert_stacks())

    def matmul_experts(self, stack, x, ids):
        """``y[r] = x[r]·W[ids[r]]ᵀ (+ bias)``, ``W[e]`` expert ``e`` of stack
        ``stack`` (a name :meth:`expert_stacks` gives): ``x`` a float32 ``[m, k]``
        NumPy array or torch tensor on the CPU (returned as one), ``ids`` ``m``
        expert indices (a sequence of ints, a NumPy array or a torch tensor).
        Each row's result is the one its expert's own ``matmul`` gives it; on the
        GPU the stack is uploaded whole the first time it is used."""
        import numpy as np

        torch, values = _values(x)
        if values is None or values.ndim != 2:
            raise _refuse(f"{stack}: x is {_describe(x)}; expected float32 [m, k]"
                          " (a NumPy array, or a torch tensor on the CPU)")
        m, k = values.shape
        try:
            routes = np.asarray(ids.detach().cpu() if hasattr(ids, "detach") else ids)
        except (TypeError, ValueError):
            routes = None
        if routes is not None and routes.ndim == 1 and routes.size == 0:
            routes = routes.astype(np.int64)  # [] is float64 to NumPy
        if routes is None or routes.dtype.kind not in "iu" or routes.ndim != 1:
            raise _refuse(f"{stack}: ids are {_describe(ids)}; expected {m} expert indices (ints)")
        if len(routes) != m:
            raise _refuse(f"{stack}: {len(routes)} expert ids for {m} rows of x")
        if m and (routes.min() < 0 or routes.max() >= 2**32):
            raise _refuse(f"{stack}: expert id {int(routes.min() if routes.min() < 0 else routes.max())}"
                          " is not an expert's index")
        data = np.ascontiguousarray(values, dtype="<f4").tobytes()
        buf, n = self._native.matmul_experts(stack, data, m, k, [int(e) for e in routes])
        y = np.frombuffer(buf, dtype="<f4").reshape(m, n)
        return torch.from_numpy(y) if torch is not None else y


def _values(x):
    """``(torch, array)``: x's values as a float32 NumPy array (torch is the
    module when x is a tensor), or ``(torch, None)`` when x is not float32."""
    if type(x).__module__.split(".")[0] == "torch":
        import torch

        if isinstance(x, torch.Tensor):
            if x.device.type != "cpu" or x.dtype != torch.float32:
                return torch, None
            return torch, x.detach().contiguous().numpy()
    import numpy as np

    if isinstance(x, np.ndarray) and x.dtype == np.float32:
        return None, x
    return None, None


def _describe(x):
    """What x is, in a few words: its type, dtype, shape and device."""
    dtype, shape, device = getattr(x, "dtype", None), getattr(x, "shape", None), getattr(x, "device", None)
    words = [type(x).__name__]
    if dtype is not None:
        words.append(str(dtype))
    if shape is not None:
        words.append(str(list(shape)))
    if device is not None and str(device) != "cpu":
        words.append(f"on {device}")
    return " ".join(words)


def open_linears(path, backend="auto", revision=None, dtype="auto"):
    """The quantized Linears of checkpoint ``path`` (a local path or a Hub id),
    for products with their packed weights: ``backend`` ``"gpu"`` (an error
    without an adapter), ``"cpu"``, or ``"auto"`` (a hardware GPU when there
    is one, the CPU otherwise, as ``load_file`` decodes).
    ``dtype`` is W's, as ``load_file`` gives it (``"auto"``: the model's)."""
    native = _native.Linears(_source(path, revision), dtype, backend)
    for message in native.warnings():
        warnings.warn(message, WgpuDequantWarning, stacklevel=2)
    return Linears(native)

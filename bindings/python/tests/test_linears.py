"""Products with packed weights through ``open_linears``: on the CPU and on the
GPU, ``matmul(name, x)`` equals ``x·Wᵀ (+ bias)`` of the weight ``load_file``
gives, in float64, within the bound docs/apps.md states:
``K·2⁻²⁴·Σ|w·x|`` per output (plus half an ulp for the bias).

The GPU tests run on the adapter wgpu finds (llvmpipe will do); without one
they are skipped, unless ``WGPU_DEQUANT_REQUIRE_GPU=1`` (as CI sets it),
which makes that a failure."""

import os
import re
from pathlib import Path

import pytest

import wgpu_dequant as wdq

np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "assets" / "sample-w4a16"
CASES = {
    "sample-w4a16": SAMPLE,
    **{name: ROOT / "tests" / "fixtures" / name / "model"
       for name in ["gptq-w4-g128", "awq-gemm-w4-g128", "bnb-nf4-dq-bf16", "nvfp4a16",
                    "mlx-affine-4bit-g64"]},
}
GPT_OSS = ROOT / "tests" / "fixtures" / "gpt-oss-mxfp4" / "model"


def linears(path, backend, dtype="auto"):
    """``open_linears`` on ``backend``; on "gpu" without an adapter, a skip
    (a failure under WGPU_DEQUANT_REQUIRE_GPU=1)."""
    try:
        return wdq.open_linears(path, backend=backend, dtype=dtype)
    except wdq.DequantError as e:
        if backend != "gpu" or e.rule != "GPU-001" or os.environ.get("WGPU_DEQUANT_REQUIRE_GPU") == "1":
            raise
        pytest.skip(f"no GPU adapter: {e}")


def dense(path, dtype):
    """The dense checkpoint ``load_file`` gives, in float64."""
    return {name: np.asarray(t, dtype=np.float64)
            for name, t in wdq.load_file(path, dtype=dtype, backend="cpu", framework="np").items()}


def within_bound(y, x, w, bias=None):
    """Whether ``y`` (``[m, n]``) is within the bound of ``x·w + bias`` for
    ``x`` ``[m, k]``, ``w`` ``[k, n]`` and ``bias`` ``[n]`` (float64): the
    rows failing it, empty when none does."""
    x = x.astype(np.float64)
    want = x @ w + (0.0 if bias is None else bias)
    k = w.shape[0]
    bound = k * 2.0**-24 * (np.abs(x) @ np.abs(w)) + np.abs(want) * 2.0**-24
    bad = np.abs(y.astype(np.float64) - want) > bound
    return [(int(i), int(j), float(y[i, j]), float(want[i, j])) for i, j in zip(*np.nonzero(bad))][:5]


def inputs(m, k, seed):
    """``m`` rows of ``k`` float32 values, the same from run to run."""
    return np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", ["f32", "auto"])
def test_matmul_is_the_dense_product(case, backend, dtype):
    """Every quantized weight, m = 1 and 5: W is what load_file writes in
    the same dtype (widened to f32), the bias the Linear's own."""
    lin = linears(CASES[case], backend, dtype)
    assert lin.backend == backend
    sd = dense(CASES[case], dtype)
    names = lin.quantized()
    assert names and names == sorted(names)
    for i, name in enumerate(names):
        w = sd[name]
        bias = sd.get(name[: -len(".weight")] + ".bias")
        n, k = w.shape
        for m in (1, 5):
            x = inputs(m, k, seed=i * 10 + m)
            y = lin.matmul(name, x)
            assert y.dtype == np.float32 and y.shape == (m, n), name
            assert not within_bound(y, x, w.T, bias), f"{case} {name} m={m}: outside the bound"


GGUF_TYPES = ROOT / "tests" / "gguf" / "gguf-types" / "model" / "model.gguf"


def gguf_types_as_linears(path):
    """``gguf-types``' tensors of every quantized ggml type (``[6, 512]``
    each) as the down projections of a llama model's layers,
    ``blk.{i}.ffn_down.weight``, in a GGUF file written to ``path``: the
    same tensor infos and data section, renamed. Their types' ids, in layer
    order."""
    import struct

    b = GGUF_TYPES.read_bytes()
    at = 4 + 4

    def take(fmt):
        nonlocal at
        v = struct.unpack_from("<" + fmt, b, at)
        at += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal at
        n = take("Q")
        at += n
        return b[at - n:at].decode()

    sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def skip(ty):
        if ty == 8:
            string()
        elif ty == 9:
            item, count = take("I"), take("Q")
            for _ in range(count):
                skip(item)
        else:
            take(sizes[ty])

    tensors, kvs = take("Q"), take("Q")
    for _ in range(kvs):
        string()
        skip(take("I"))
    infos = []
    for _ in range(tensors):
        name, dims = string(), take("I")
        shape = [take("Q") for _ in range(dims)]
        infos.append((name, shape, take("I"), take("Q")))
    data = b[(at + 31) // 32 * 32:]
    # F32, F16 and BF16 are copies, not Linears.
    quantized = [t for t in infos if t[2] not in (0, 1, 30)]

    def s(text):
        return struct.pack("<Q", len(text)) + text.encode()

    out = b"GGUF" + struct.pack("<IQQ", 3, len(quantized), 3)
    out += s("general.architecture") + struct.pack("<I", 8) + s("llama")
    out += s("general.alignment") + struct.pack("<II", 4, 32)
    out += s("llama.block_count") + struct.pack("<II", 4, len(quantized))
    for i, (_, shape, ty, offset) in enumerate(quantized):
        out += s(f"blk.{i}.ffn_down.weight") + struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<Q", d) for d in shape) + struct.pack("<IQ", ty, offset)
    out += bytes(-len(out) % 32) + data
    path.write_bytes(out)
    return [t[2] for t in quantized]


@pytest.mark.parametrize("backend,dtype", [("cpu", "f32"), ("cpu", "auto"), ("gpu", "f32")])
def test_matmul_by_every_gguf_type(tmp_path, backend, dtype):
    """One weight of each of GGUF's quantized types, m = 1 and 5: x·Wᵀ of
    the weight load_file writes in the same dtype, within the bound; where
    W holds infinities (MXFP4's largest scales), an output is NaN or
    infinite exactly where the float64 one is. The GPU compiles a kernel
    per kind of type and row count (seconds each on llvmpipe): f32 only."""
    path = tmp_path / "model.gguf"
    types = gguf_types_as_linears(path)
    assert len(types) >= 23
    lin = linears(path, backend, dtype)
    sd = dense(path, dtype)
    names = lin.quantized()
    assert names == sorted(f"model.layers.{i}.mlp.down_proj.weight" for i in range(len(types)))
    for name in names:
        i = int(name.split(".")[2])
        w = sd[name]
        n, k = w.shape
        for m in (1, 5):
            x = inputs(m, k, seed=300 + 10 * i + m)
            y = lin.matmul(name, x)
            assert y.dtype == np.float32 and y.shape == (m, n), name
            with np.errstate(invalid="ignore", over="ignore"):
                want = x.astype(np.float64) @ w.T
            odd = ~np.isfinite(want)
            assert np.array_equal(y[odd], want[odd], equal_nan=True), f"{name} m={m}"
            keep = ~odd.any(axis=0)
            bad = within_bound(y[:, keep], x, w[keep].T)
            assert not bad, f"{name} (type {types[i]}, {dtype}) m={m} on the {backend}: {bad}"


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_matmul_by_gpt_oss_experts(backend):
    """Each expert of GPT-OSS's stacks (``[E, in, out]`` dense): ``x·W[e] +
    bias[e]``; a stack without ``expert=`` is refused, naming it."""
    lin = linears(GPT_OSS, backend, "f32")
    sd = dense(GPT_OSS, "f32")
    stacks = lin.quantized()
    assert stacks
    for s, name in enumerate(stacks):
        w = sd[name]
        experts, k, n = w.shape
        for e in range(experts):
            for m in (1, 5):
                x = inputs(m, k, seed=100 * s + 10 * e + m)
                y = lin.matmul(name, x, expert=e)
                assert y.shape == (m, n)
                assert not within_bound(y, x, w[e], sd[name + "_bias"][e]), f"{name}[{e}] m={m}"
        with pytest.raises(wdq.DequantError, match=rf"{name}: .*stack of {experts} experts.*expert=") as err:
            lin.matmul(name, inputs(1, k, 0))
        assert err.value.rule == "ARG-001"
        with pytest.raises(wdq.DequantError, match=rf"{name}: .*{experts} experts, not {experts + 1}"):
            lin.matmul(name, inputs(1, k, 0), expert=experts)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_matmul_takes_vectors_empty_batches_and_gives_the_same_bits(backend):
    """A vector ``[k]`` gives ``[n]``, the first row of the batch's product;
    ``m = 0`` gives ``[0, n]``; the same call gives the same bits again."""
    lin = linears(SAMPLE, backend)
    name = lin.quantized()[0]
    n, k = wdq.load_file(SAMPLE, dtype="f32", framework="np")[name].shape
    x = inputs(3, k, seed=7)
    y = lin.matmul(name, x)
    assert y.tobytes() == lin.matmul(name, x).tobytes()
    v = lin.matmul(name, x[0])
    assert v.shape == (n,)
    assert not within_bound(v.reshape(1, n), x[:1], dense(SAMPLE, "auto")[name].T)
    assert lin.matmul(name, np.zeros((0, k), np.float32)).shape == (0, n)
    assert lin.matmul(name, np.asfortranarray(x)).tobytes() == y.tobytes()  # any layout


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_matmul_refuses_wrong_inputs_naming_the_weight_and_k(backend):
    lin = linears(SAMPLE, backend)
    name = lin.quantized()[0]
    k = wdq.load_file(SAMPLE, dtype="f32", framework="np")[name].shape[1]
    wrong = [
        inputs(2, k, 0).astype(np.float64),      # dtype
        inputs(2, k, 0).astype(np.float16),
        inputs(2, k - 1, 0),                     # rows of another width
        inputs(1, k + 3, 0)[0],
        np.zeros((0, k + 1), np.float32),
        inputs(2, k, 0).reshape(1, 2, k),        # ndim
        np.float32(1.0).reshape(()),
        [0.0] * k,                               # not an array
    ]
    for x in wrong:
        with pytest.raises(ValueError, match=rf"{name}: .*\b{k}\b") as err:
            lin.matmul(name, x)
        assert isinstance(err.value, wdq.DequantError) and err.value.rule == "ARG-001", repr(x)[:60]
    x = inputs(1, k, 0)
    for bad in ("model.nope.weight", "model.norm.weight"):
        with pytest.raises(wdq.DequantError, match=bad) as err:
            lin.matmul(bad, x)
        assert err.value.rule == "ARG-001"
    with pytest.raises(wdq.DequantError, match="not a stack of experts"):
        lin.matmul(name, x, expert=0)
    with pytest.raises(wdq.DequantError, match="expert"):
        lin.matmul(name, x, expert=-1)


def test_open_linears_refuses_what_it_cannot_run():
    with pytest.raises(wdq.DequantError) as err:
        wdq.open_linears(SAMPLE, backend="tpu")
    assert err.value.rule == "ARG-001" and "auto, gpu, cpu" in str(err.value)
    with pytest.raises(wdq.DequantError) as err:
        wdq.open_linears(ROOT / "no-such-checkpoint")
    assert err.value.rule
    lin = wdq.open_linears(SAMPLE)
    assert lin.backend in ("gpu", "cpu") and (lin.adapter is None) == (lin.backend == "cpu")
    assert "quantized weights" in repr(lin)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_matmul_takes_and_gives_torch_tensors(backend):
    torch = pytest.importorskip("torch")
    lin = linears(SAMPLE, backend)
    name = lin.quantized()[1]
    w = dense(SAMPLE, "auto")[name]
    x = torch.from_numpy(inputs(5, w.shape[1], seed=3))
    y = lin.matmul(name, x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and tuple(y.shape) == (5, w.shape[0])
    assert y.numpy().tobytes() == lin.matmul(name, x.numpy()).tobytes()
    assert not within_bound(y.numpy(), x.numpy(), w.T)
    with pytest.raises(wdq.DequantError, match=rf"{name}: .*torch.float64.*\b{w.shape[1]}\b"):
        lin.matmul(name, x.double())


QWEN3MOE_GGUF = ROOT / "tests" / "gguf" / "hf-qwen3moe" / "model" / "model.gguf"


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("path", [QWEN3MOE_GGUF, GPT_OSS], ids=["gguf-qwen3moe", "gpt-oss"])
def test_matmul_experts_gives_each_row_its_experts_own_product(path, backend):
    """Rows routed to mixed experts of one stack: each row the bits its
    expert's own ``matmul`` gives it (``expert=e`` of a 3-D stack, the
    expert's own weight else); wrong ids are refused naming the stack."""
    lin = linears(path, backend)
    sd = wdq.load_file(path, dtype="f32", backend="cpu", framework="np")
    stacks = lin.expert_stacks()
    layer0 = sorted(s for s in stacks if ".layers.0." in s)
    assert layer0 and list(stacks) == sorted(stacks)
    for s, stack in enumerate(layer0):
        names = stacks[stack]
        three_d = names[0] == f"{stack}[0]"
        assert names == ([f"{stack}[{e}]" for e in range(len(names))] if three_d
                         else [stack.replace(".*.", f".{e}.") for e in range(len(names))])
        k = sd[stack].shape[1] if three_d else sd[names[0]].shape[1]
        ids = [e % len(names) for e in (3, 1, 3, 0, 1, 2, 3, 0)]
        x = inputs(len(ids), k, seed=200 + s)
        y = lin.matmul_experts(stack, x, np.array(ids, dtype=np.int64))
        assert y.dtype == np.float32 and y.shape[0] == len(ids), stack
        for r, e in enumerate(ids):
            alone = lin.matmul(stack, x[r], expert=e) if three_d else lin.matmul(names[e], x[r])
            assert y[r].tobytes() == alone.tobytes(), f"{stack} row {r} expert {e}"
        assert lin.matmul_experts(stack, x, ids).tobytes() == y.tobytes()  # a list too
        assert lin.matmul_experts(stack, x[:0], []).shape == (0, y.shape[1])
        for bad in (ids[1:], [len(names)] * len(ids), [-1] * len(ids), [0.5] * len(ids)):
            with pytest.raises(wdq.DequantError, match=rf"{re.escape(stack)}: ") as err:
                lin.matmul_experts(stack, x, bad)
            assert err.value.rule == "ARG-001", bad
        with pytest.raises(wdq.DequantError, match=re.escape(stack)) as err:
            lin.matmul_experts(stack, inputs(len(ids), k + 1, 0), ids)
        assert err.value.rule == "ARG-001"
    with pytest.raises(wdq.DequantError, match="no stack of experts") as err:
        lin.matmul_experts("model.layers.0.mlp.nothing.*.w", inputs(1, 4, 0), [0])
    assert err.value.rule == "ARG-001"


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_matmul_experts_takes_torch(backend):
    torch = pytest.importorskip("torch")
    lin = linears(QWEN3MOE_GGUF, backend)
    stack, names = next(iter(lin.expert_stacks().items()))
    k = wdq.load_file(QWEN3MOE_GGUF, dtype="f32", framework="np")[names[0]].shape[1]
    x = inputs(4, k, seed=5)
    ids = [1, 0, 1, 2]
    y = lin.matmul_experts(stack, torch.from_numpy(x), torch.tensor(ids))
    assert isinstance(y, torch.Tensor)
    assert y.numpy().tobytes() == lin.matmul_experts(stack, x, ids).tobytes()

"""The Python package gives the CLI's bytes on every fixture, and its
refusals carry the CLI's rule ids. The CLI is WGPU_DEQUANT_BIN, else
target/debug/wgpu-dequant (cargo build)."""

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import wgpu_dequant as wdq

ROOT = Path(__file__).resolve().parents[3]
CLI = os.environ.get("WGPU_DEQUANT_BIN", str(ROOT / "target" / "debug" / "wgpu-dequant"))
FIXTURES = sorted(p for p in (ROOT / "tests" / "fixtures").glob("*/model") if p.is_dir())
SAMPLE = ROOT / "assets" / "sample-w4a16"


def read_safetensors(path):
    """name -> (dtype, shape, bytes) of a safetensors file."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n :]
    return {
        name: (info["dtype"], info["shape"], body[info["data_offsets"][0] : info["data_offsets"][1]])
        for name, info in header.items()
    }


def cli_dense(model, out, dtype="auto"):
    """The CLI's dense checkpoint of `model` in `out`: file name -> bytes (the
    run's record, in `out/.cache/huggingface/`, aside)."""
    subprocess.run([CLI, "dequantize", str(model), "-o", str(out), "--backend", "cpu", "--dtype", dtype, "-q"], check=True)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def cli_tensors(files, out):
    tensors = {}
    for name in files:
        if name.endswith(".safetensors"):
            tensors.update(read_safetensors(out / name))
    return tensors


@pytest.mark.parametrize("model", FIXTURES, ids=lambda p: p.parent.name)
@pytest.mark.parametrize("dtype", ["auto", "f32"])
def test_load_file_gives_the_clis_tensors(model, dtype, tmp_path):
    np = pytest.importorskip("numpy")
    out = tmp_path / "dense"
    want = cli_tensors(cli_dense(model, out, dtype), out)
    got = wdq.load_file(model, dtype=dtype, backend="cpu", framework="np")
    assert sorted(got) == sorted(want)
    for name, (st_dtype, shape, data) in want.items():
        t = got[name]
        assert list(t.shape) == shape, name
        assert np.ascontiguousarray(t).tobytes() == data, f"{name}: bytes differ"


@pytest.mark.parametrize("model", FIXTURES, ids=lambda p: p.parent.name)
def test_safe_open_decodes_one_tensor_on_any_backend(model, tmp_path):
    out = tmp_path / "dense"
    want = cli_tensors(cli_dense(model, out), out)
    with wdq.safe_open(model, framework="np", backend="auto") as f:
        keys = f.keys()
        assert keys == sorted(want)
        name = keys[len(keys) // 2]
        assert f.get_tensor(name).tobytes() == want[name][2]


@pytest.mark.parametrize("model", FIXTURES, ids=lambda p: p.parent.name)
def test_dequantize_writes_the_clis_files(model, tmp_path):
    want = cli_dense(model, tmp_path / "cli")
    summary = wdq.dequantize(model, tmp_path / "py", backend="cpu")
    got = {p.name: p.read_bytes() for p in sorted((tmp_path / "py").iterdir()) if p.is_file()}
    assert got == want
    assert summary["decoded"] > 0 or "fp8" in str(model)


def test_dequantize_with_resume_writes_the_clis_files(tmp_path):
    """resume=True reaches the run (what it keeps of an interrupted one is
    the Rust suite's to check): into a new folder it writes the CLI's files,
    a finished output of the same job has nothing left to do, and another
    job's is refused (OUT-001)."""
    model = FIXTURES[0]
    want = cli_dense(model, tmp_path / "cli")
    out = tmp_path / "py"
    assert not wdq.dequantize(model, out, backend="cpu", resume=True).get("already_done")
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()} == want
    assert wdq.dequantize(model, out, backend="cpu", resume=True)["already_done"] is True
    with pytest.raises(wdq.DequantError) as e:
        wdq.dequantize(model, out, dtype="f32", backend="cpu", resume=True)
    assert e.value.rule == "OUT-001"


@pytest.mark.parametrize("n", [1, 2, 3])
def test_part_jobs_merged_write_the_clis_files(n, tmp_path):
    """part=(I, N) jobs and merge_index write what one CLI run writes (each
    job's record of its files aside)."""
    model = ROOT / "tests" / "fixtures" / "sharded-nvfp4a16" / "model"
    want = cli_dense(model, tmp_path / "cli")
    out = tmp_path / "py"
    for i in range(n):
        wdq.dequantize(model, out, backend="cpu", part=f"{i}/{n}" if i % 2 else (i, n))
    assert wdq.merge_index(out).endswith("model.safetensors.index.json")
    got = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}
    assert got == want
    with pytest.raises(wdq.DequantError) as e:
        wdq.dequantize(model, tmp_path / "bad", part="2/2")
    assert e.value.rule == "ARG-001"


@pytest.mark.parametrize("case", ["bnb-nf4-dq-bf16", "bnb-int8-bf16"])
@pytest.mark.parametrize("dtype", ["auto", "f32"])
def test_bnb_load_file_gives_the_transformers_dequantize_bytes(case, dtype):
    """load_file on a bitsandbytes checkpoint replaces transformers +
    bitsandbytes + torch (load, dequantize(), save_pretrained): its tensors
    are the reference's bytes (the decoded ones the exact f32 products)."""
    import hashlib

    np = pytest.importorskip("numpy")
    fixture = ROOT / "tests" / "fixtures" / case
    digests = json.loads((fixture / f"expected-{'bf16' if dtype == 'auto' else 'f32'}.digests.json").read_text())
    got = wdq.load_file(fixture / "model", dtype=dtype, backend="auto", framework="np")
    assert sorted(got) == sorted(digests)
    for name, want in digests.items():
        data = np.ascontiguousarray(got[name]).tobytes()
        if want["dtype"] == "BF16" and dtype == "f32":
            # Copied tensors widened exactly; the reference keeps them stored.
            data = (np.frombuffer(data, dtype=np.uint32) >> 16).astype(np.uint16).tobytes()
        assert list(got[name].shape) == want["shape"], name
        assert hashlib.sha256(data).hexdigest() == want["sha256"], name


@pytest.mark.parametrize("case", ["hf-llama", "hf-gemma3", "hf-qwen3moe"])
def test_gguf_files_load_as_transformers_saves_them(case):
    """load_file and safe_open on a .gguf file give its tensors under the
    names transformers loads, with transformers' own bf16 bytes (llama's Q/K
    rows un-interleaved, Gemma's norms moved back, experts split)."""
    np = pytest.importorskip("numpy")
    folder = ROOT / "tests" / "gguf" / case
    digests = json.loads((folder / "expected-bf16.digests.json").read_text())
    gguf = folder / "model" / "model.gguf"
    got = wdq.load_file(gguf, dtype="bf16", backend="cpu", framework="np")
    assert sorted(got) == sorted(digests)
    for name, want in digests.items():
        assert list(got[name].shape) == want["shape"], name
        data = np.ascontiguousarray(got[name]).tobytes()
        assert hashlib.sha256(data).hexdigest() == want["sha256"], name
    with wdq.safe_open(gguf, framework="np", backend="auto", dtype="bf16") as f:
        assert f.keys() == sorted(digests)
        name = "model.layers.0.input_layernorm.weight"
        assert hashlib.sha256(f.get_tensor(name).tobytes()).hexdigest() == digests[name]["sha256"]


def test_inspect_is_the_clis_report():
    want = json.loads(subprocess.run([CLI, "inspect", str(SAMPLE), "--json"], capture_output=True, check=True).stdout)
    got = wdq.inspect(SAMPLE)
    # The disk's free space moves between two runs.
    assert isinstance(got.pop("free_bytes"), int) and isinstance(want.pop("free_bytes"), int)
    assert got == want


def test_refusals_carry_the_clis_rule(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(SAMPLE, broken)
    st = broken / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-1])
    cli = subprocess.run([CLI, "inspect", str(broken)], capture_output=True, text=True)
    for call in (lambda: wdq.load_file(broken), lambda: wdq.inspect(broken), lambda: wdq.dequantize(broken, tmp_path / "o")):
        with pytest.raises(wdq.DequantError) as e:
            call()
        assert isinstance(e.value, ValueError)
        assert e.value.rule == "ST-001"
        assert cli.stderr.strip() == f"error: {e.value}"
    assert not (tmp_path / "o").exists(), "a refused dequantize left its output"
    with pytest.raises(wdq.DequantError) as e:
        wdq.load_file(SAMPLE, dtype="f64")
    assert e.value.rule == "ARG-001" and "f64" in str(e.value)
    with pytest.raises(wdq.DequantError) as e:
        wdq.load_file(SAMPLE, backend="tpu")
    assert e.value.rule == "ARG-001"
    with pytest.raises(wdq.DequantError) as e:
        with wdq.safe_open(SAMPLE, framework="np") as f:
            f.get_tensor("no.such.tensor")
    assert e.value.rule == "ARG-001"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(wdq.DequantError) as e:
        wdq.dequantize(SAMPLE, tmp_path / "full")
    assert e.value.rule == "OUT-001"
    assert wdq.dequantize(SAMPLE, tmp_path / "full", force=True)["decoded"] == 7


def test_hub_ids_read_the_cache_python_shares(tmp_path, monkeypatch):
    """A Hub id is read from a Hugging Face cache laid out as huggingface_hub
    lays it out (offline here: no request is made)."""
    model = ROOT / "tests" / "fixtures" / "sharded-nvfp4a16" / "model"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--name"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "v1").write_text(commit)
    snapshot, blobs = repo / "snapshots" / commit, repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for f in model.iterdir():
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, blobs / digest)
        (snapshot / f.name).symlink_to(Path("../../blobs") / digest)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    want = wdq.load_file(model, framework="np")
    for got in (wdq.load_file("org/name", revision="v1", framework="np"), wdq.load_file("org/name@v1", framework="np")):
        assert sorted(got) == sorted(want)
        assert all(got[k].tobytes() == want[k].tobytes() for k in want)
    assert wdq.inspect("org/name@v1")["tensors"] == wdq.inspect(model)["tensors"]
    for call in (lambda: wdq.inspect(model, revision="v1"), lambda: wdq.inspect("org/name@v1", revision="v2")):
        with pytest.raises(wdq.DequantError) as e:
            call()
        assert e.value.rule == "ARG-001"
    with pytest.raises(wdq.DequantError) as e:
        wdq.load_file("org/name", revision="v2")
    assert e.value.rule == "HUB-001" and "HF_HUB_OFFLINE" in str(e.value)


def test_torch_tensors_are_bf16_with_the_clis_bytes(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    out = tmp_path / "dense"
    want = cli_tensors(cli_dense(SAMPLE, out), out)
    got = wdq.load_file(SAMPLE, framework="pt")
    for name, (_, shape, data) in want.items():
        assert got[name].dtype == torch.bfloat16
        assert list(got[name].shape) == shape
        assert got[name].contiguous().view(torch.uint8).numpy().tobytes() == data


def test_transformers_loads_the_dense_state_dict():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("torch", reason="torch is not installed")
    config = transformers.AutoConfig.from_pretrained(SAMPLE)
    model = transformers.AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(wdq.load_file(SAMPLE, framework="pt"), strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)


def write_big_checkpoint(model, layers=6, rows=2048, cols=8192):
    """An int4 asymmetric group-128 checkpoint (the sample's config) whose
    dense output (200 MB) takes a while to write."""
    model.mkdir()
    shutil.copy(SAMPLE / "config.json", model / "config.json")
    tensors = []
    for i in range(layers):
        m = f"model.layers.{i}.mlp.down_proj"
        tensors += [
            (f"{m}.weight_packed", "I32", [rows, cols // 8], os.urandom(rows * cols // 2)),
            (f"{m}.weight_scale", "BF16", [rows, cols // 128], b"\x80\x3c" * (rows * cols // 128)),
            (f"{m}.weight_shape", "I64", [2], rows.to_bytes(8, "little") + cols.to_bytes(8, "little")),
            (f"{m}.weight_zero_point", "I32", [rows // 8, cols // 128], b"\x88" * (rows * cols // 128 // 2)),
        ]
    header, offset, body = {}, 0, []
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        body.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(model / "model.safetensors", "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for data in body:
            f.write(data)


def test_ctrl_c_stops_dequantize_and_leaves_nothing(tmp_path):
    import _thread
    import signal
    import threading

    write_big_checkpoint(tmp_path / "big")
    out = tmp_path / "dense"
    pieces = []

    def ctrl_c_after_the_first_piece(done, total, tensor):
        # Ctrl-C while the run is under way, however fast the machine: the
        # main thread sees it within its 50 ms wait, and this piece is not
        # done before then.
        pieces.append((done, total))
        if len(pieces) == 1:
            _thread.interrupt_main()
            threading.Event().wait(0.5)

    # A Python started with SIGINT ignored (a shell's background job) keeps
    # ignoring it; Ctrl-C is Python's to see here, as in a terminal.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            wdq.dequantize(tmp_path / "big", out, backend="cpu", progress=ctrl_c_after_the_first_piece)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert pieces[-1][0] < pieces[-1][1], f"the run was not stopped: {pieces[-1]}"
    assert not out.exists(), "an interrupted dequantize left its output"
    # The next run is not refused: the interruption was this run's alone.
    assert wdq.dequantize(tmp_path / "big", out, backend="cpu", progress=True)["decoded"] == 6


def test_numpy_bf16_without_ml_dtypes_says_what_to_do(monkeypatch):
    pytest.importorskip("numpy")
    monkeypatch.setitem(__import__("sys").modules, "ml_dtypes", None)  # import fails
    with pytest.raises(wdq.DequantError) as e:
        wdq.load_file(SAMPLE, framework="np")
    assert e.value.rule == "ARG-001"
    assert "ml_dtypes" in str(e.value) and 'dtype="f32"' in str(e.value)
    # f32 needs nothing beyond numpy.
    sd = wdq.load_file(SAMPLE, framework="np", dtype="f32")
    assert all(t.dtype.name == "float32" for t in sd.values())


def test_progress_callable_hears_every_piece_up_to_the_total(tmp_path):
    heard = []
    summary = wdq.dequantize(SAMPLE, tmp_path / "dense", backend="cpu",
                             progress=lambda done, total, tensor: heard.append((done, total, tensor)))
    assert heard, "the callable was never called"
    assert [d for d, _, _ in heard] == sorted(d for d, _, _ in heard)
    assert heard[-1][0] == heard[-1][1] == summary["tensor_bytes"]
    assert all(isinstance(t, str) and t for _, _, t in heard)
    # The summary is `dequantize --json`'s: what ran, how long, on what.
    assert (summary["format"], summary["backend"]) == ("compressed-tensors", "cpu")
    assert summary["seconds"] >= 0 and summary["consumed"] > 0 and summary["dropped"] == 0


def test_warnings_are_python_warnings_and_strict_refuses(tmp_path):
    # A GGUF file with a tensor transformers' model has no place for (HF-001).
    gguf = ROOT / "tests" / "gguf" / "configs" / "unplaced.gguf"
    with pytest.warns(wdq.WgpuDequantWarning, match=r"\[HF-001\].*blk\.0\.attn_sinks\.weight"):
        summary = wdq.dequantize(gguf, tmp_path / "out", backend="cpu")
    assert [w["rule"] for w in summary["warnings"]] == ["HF-001"]
    # The tensor is a model tensor not written, not a quantization one used up.
    assert (summary["dropped"], summary["consumed"]) == (1, 0)
    with pytest.raises(wdq.DequantError) as e:
        wdq.dequantize(gguf, tmp_path / "strict", backend="cpu", strict=True)
    assert e.value.rule == "HF-001" and "--strict" in str(e.value)
    assert not (tmp_path / "strict").exists()


def test_safe_open_warns_as_dequantize_does():
    gguf = ROOT / "tests" / "gguf" / "configs" / "unplaced.gguf"
    with pytest.warns(wdq.WgpuDequantWarning, match=r"\[HF-001\]"):
        with wdq.safe_open(gguf, framework="np") as f:
            assert "blk.0.attn_sinks.weight" not in f.keys()

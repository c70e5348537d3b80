"""The ``wgpu-dequant`` command the wheel installs is the Rust command line:
the same bytes as the binary (WGPU_DEQUANT_BIN, else
target/debug/wgpu-dequant), the same exit statuses, the same texts."""

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = os.environ.get("WGPU_DEQUANT_BIN", str(ROOT / "target" / "debug" / "wgpu-dequant"))
SAMPLE = ROOT / "assets" / "sample-w4a16"
# The console script sits beside the interpreter of the venv it was installed into.
COMMAND = str(Path(sys.executable).parent / ("wgpu-dequant.exe" if os.name == "nt" else "wgpu-dequant"))


def run(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True)


def files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_the_command_is_installed():
    assert Path(COMMAND).is_file(), COMMAND


def test_the_command_decodes_the_sample_to_the_binarys_bytes(tmp_path):
    for exe, out in [(COMMAND, tmp_path / "pip"), (BIN, tmp_path / "bin")]:
        done = run(exe, "dequantize", str(SAMPLE), "-o", str(out), "--backend", "cpu", "-q")
        assert done.returncode == 0, done.stderr
    got, want = files(tmp_path / "pip"), files(tmp_path / "bin")
    assert got.keys() == want.keys()
    assert got["model.safetensors"] == want["model.safetensors"]
    assert got["config.json"] == want["config.json"]


def test_the_command_exits_and_says_as_the_binary_does(tmp_path):
    for args in [
        ["dequantize", str(SAMPLE), "out-dir"],  # a usage error: 2
        ["dequantize", str(SAMPLE), "-o", str(tmp_path / "x"), "--backend", "cuda"],  # ARG: 2
        ["inspect", str(tmp_path / "missing")],  # no such path: 1
        ["validate", str(SAMPLE)],  # clean: 0
    ]:
        got, want = run(COMMAND, *args), run(BIN, *args)
        assert got.returncode == want.returncode, (args, got.stderr, want.stderr)
        assert got.stderr == want.stderr, args
        assert got.stdout == want.stdout, args


def test_help_and_version_name_the_command():
    done = run(COMMAND, "--help")
    assert done.returncode == 0
    assert done.stdout.startswith("Decode quantized checkpoints")
    assert "Usage: wgpu-dequant" in done.stdout
    version = run(COMMAND, "--version").stdout
    assert version.startswith("wgpu-dequant ") and "\ncommit " in version and "\nwgpu " in version


def big_checkpoint(folder):
    """A compressed-tensors int4 checkpoint whose dense output (128 MB of
    bf16) takes long enough to write that a run can be caught in the middle."""
    rows, cols = 4096, 8192
    tensors, data = {}, bytearray()
    for i in range(2):
        m = f"model.layers.{i}.mlp.down_proj"
        for name, dtype, shape, raw in [
            (f"{m}.weight_packed", "I32", [rows, cols // 8], os.urandom(rows * cols // 2)),
            (f"{m}.weight_scale", "BF16", [rows, cols // 128], b"\x80\x3d" * (rows * cols // 128)),
            (f"{m}.weight_shape", "I64", [2], struct.pack("<2q", rows, cols)),
        ]:
            tensors[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
    header = json.dumps(tensors).encode()
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + data)
    weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
               "symmetric": True, "dynamic": False}
    config = {"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
              "quantization_config": {
                  "quant_method": "compressed-tensors", "format": "pack-quantized",
                  "version": "0.19.0", "quantization_status": "compressed", "ignore": ["lm_head"],
                  "config_groups": {"group_0": {"format": "pack-quantized", "targets": ["Linear"],
                                                "weights": weights}}}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_ctrl_c_undoes_the_run_and_ends_by_the_signal(tmp_path):
    model, out = big_checkpoint(tmp_path / "model"), tmp_path / "out"
    child = subprocess.Popen([COMMAND, "dequantize", str(model), "-o", str(out), "--backend", "cpu"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Frozen once its staging folder holds a file, so that the moment is certain.
    staging = out / ".wgpu-dequant-partial"
    deadline = time.monotonic() + 120
    while not (staging.is_dir() and any(staging.iterdir())):
        assert child.poll() is None, child.stderr.read()
        assert time.monotonic() < deadline, "the run never started writing"
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGSTOP)
    os.kill(child.pid, signal.SIGINT)
    os.kill(child.pid, signal.SIGCONT)
    err = child.communicate(timeout=120)[1]
    assert child.returncode == -signal.SIGINT, err
    assert "interrupted by SIGINT: removed what this run wrote" in err, err
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())

"""Writes a small real bitsandbytes checkpoint into tests/fixtures/NAME: a
one-layer Llama (hidden 96, so 4-bit blocks of 64 cross rows; MLP 160,
whose 160 inputs are the case bitsandbytes' AVX-512 CPU path gets wrong)
with random weights, quantized by transformers + bitsandbytes themselves
and saved by `save_pretrained`, and the digests of its dense output as
bitsandbytes' CUDA (and scalar CPU) kernels compute it, from the stored
tensors, here in numpy (not with wgpu-dequant, and not with bitsandbytes'
CPU dispatch, which differs on AVX-512 machines):

    python tests/bnb/make_fixture.py NAME --quant-type fp4 --storage bfloat16 --dtype float16 [--double-quant]

Needs torch, transformers, bitsandbytes and numpy.
"""

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

GENERATE = """
import sys, torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
dense, out, quant, storage, dtype, dq = sys.argv[1:7]
storage, dtype = getattr(torch, storage), getattr(torch, dtype)
torch.manual_seed(1)
cfg = LlamaConfig(hidden_size=96, num_attention_heads=2, num_key_value_heads=1,
                  intermediate_size=160, vocab_size=64, num_hidden_layers=1)
LlamaForCausalLM(cfg).to(dtype).save_pretrained(dense)
q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant, bnb_4bit_use_double_quant=dq == "1",
                       bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=storage)
m = AutoModelForCausalLM.from_pretrained(dense, quantization_config=q, device_map="cpu", dtype=dtype)
m.save_pretrained(out)
"""

# kernels.cu: dDequantizeNF4, dDequantizeFP4Tree (bit 3 the sign: code 8 is -0.0).
NF4 = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], np.float32)
_MAG = np.array([0.0, 5.208333333e-03, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25], np.float32)
FP4 = np.concatenate([_MAG, -_MAG]).astype(np.float32)


def read(path: Path):
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n :]
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0] : v["data_offsets"][1]]) for k, v in header.items()}


def dense(src):
    """name -> (dtype, shape, exact f32 values) of every decoded weight."""
    out = {}
    for k, (_, _, blob) in src.items():
        if ".quant_state.bitsandbytes__" not in k:
            continue
        st = json.loads(blob)
        w = k.split(".quant_state")[0]
        n, bs = int(np.prod(st["shape"])), st["blocksize"]
        b = np.frombuffer(src[w][2], np.uint8)
        codes = np.empty(2 * len(b), np.uint8)
        codes[0::2], codes[1::2] = b >> 4, b & 15  # element 2k in the high nibble
        codes = codes[:n]
        if "nested_offset" in st:
            a = np.frombuffer(src[w + ".absmax"][2], np.uint8)
            outer = np.frombuffer(src[w + ".nested_absmax"][2], np.float32)
            qm = np.frombuffer(src[w + ".nested_quant_map"][2], np.float32)
            absmax = (qm[a] * outer[np.arange(len(a)) // st["nested_blocksize"]]).astype(np.float32)
            absmax = absmax + np.float32(st["nested_offset"])
        else:
            absmax = np.frombuffer(src[w + ".absmax"][2], np.float32)
        lut = NF4 if st["quant_type"] == "nf4" else FP4
        out[w] = (st["shape"], (lut[codes] * absmax[np.arange(n) // bs]).astype(np.float32))
    return out


def rounded(v: np.ndarray, dtype: str) -> bytes:
    if dtype == "F32":
        return v.tobytes()
    if dtype == "F16":
        return v.astype(np.float16).tobytes()
    u = v.view(np.uint32).astype(np.uint64)  # round to nearest even (no NaN here)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def digests(src, decoded, dtype):
    quant = (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", "bitsandbytes__nf4", "bitsandbytes__fp4")
    d = {}
    for k, (dt, shape, blob) in src.items():
        if k.endswith(quant):
            continue
        if k in decoded:
            shape, vals = decoded[k]
            dt, blob = dtype, rounded(vals, dtype)
        d[k] = {"dtype": dt, "shape": shape, "sha256": hashlib.sha256(blob).hexdigest()}
    return dict(sorted(d.items()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("--quant-type", default="nf4")
    ap.add_argument("--storage", default="uint8")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--double-quant", action="store_true")
    args = ap.parse_args()
    case = ROOT / "tests" / "fixtures" / args.name
    shutil.rmtree(case, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-c", GENERATE, str(Path(tmp) / "dense"), str(case / "model"),
               args.quant_type, args.storage, args.dtype, "1" if args.double_quant else "0"]
        subprocess.run(cmd, check=True)
    src = read(case / "model" / "model.safetensors")
    decoded = dense(src)
    model_dtype = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[args.dtype]
    for dt in sorted({model_dtype, "F32"}):
        (case / f"expected-{dt.lower()}.digests.json").write_text(json.dumps(digests(src, decoded, dt), indent=1) + "\n")
    print(f"{case}: {len(decoded)} decoded modules")


if __name__ == "__main__":
    main()

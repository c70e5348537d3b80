"""Writes tests/gguf/gguf-types: a GGUF file with one tensor of every block
type this tool decodes (and gguf-types-split: the same tensors split by
gguf-py's writer, four to a part) (random block bytes, f16 scale fields of spread
magnitudes: small, zero, negative, subnormal, large; never NaN or Inf),
written by gguf-py's GGUFWriter, and the digests of gguf-py's own
`gguf.quants.dequantize` of each tensor in f32, and rounded once to bf16 and
f16 (nearest even). Needs `pip install gguf==0.19.0 numpy`.

    python tests/gguf/make_types.py
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

OUT = Path(__file__).resolve().parent / "gguf-types"
# Byte offsets of each type's f16 scale fields inside a block.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0], T.TQ1_0: [52], T.TQ2_0: [64],
    T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0], T.IQ1_S: [0],
    # IQ1_M's f16 is the top nibbles of its four u16 scales: any bytes.
    T.IQ1_M: [],
    # Byte scales: MXFP4's e8m0 exponent (around 2^0, with 0, 1 and 254),
    # NVFP4's four ue4m3 bytes (any byte).
    T.MXFP4: [], T.NVFP4: [],
}
ROWS, COLS = 6, 512


def scales(rng, n):
    v = rng.uniform(-0.05, 0.05, n).astype(np.float16)
    pick = rng.integers(0, 20, n)
    v[pick == 0] = 0
    v[pick == 1] = np.float16(3e-6)  # subnormal
    v[pick == 2] = rng.uniform(2, 8, (pick == 2).sum()).astype(np.float16)
    v[pick == 3] = -v[pick == 3]
    return v


def bf16_bits(x):
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    rng = np.random.default_rng(51)
    OUT.joinpath("model").mkdir(parents=True, exist_ok=True)
    split = OUT.parent / "gguf-types-split" / "model"
    split.mkdir(parents=True, exist_ok=True)
    for old in split.glob("*.gguf"):
        old.unlink()
    writers = [
        gguf.GGUFWriter(str(OUT / "model" / "model.gguf"), "llama"),
        gguf.GGUFWriter(str(split / "model.gguf"), "llama", split_max_tensors=4),
    ]
    expected = {}
    tensors = []
    for qtype, fields in F16_FIELDS.items():
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        n = ROWS * COLS // block
        blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
        for at in fields:
            blocks[:, at:at + 2] = scales(rng, n).view(np.uint8).reshape(n, 2)
        if qtype == T.MXFP4:
            blocks[:, 0] = rng.choice([0, 1, 254] + list(range(110, 140)), n)
        data = blocks.reshape(ROWS, COLS // block * size)
        name = f"{qtype.name.lower()}.weight"
        tensors.append((name, data, qtype))
        expected[name] = gguf.quants.dequantize(data, qtype).reshape(ROWS, COLS).astype(np.float32)
    for name, qtype, arr in [
        ("f32.weight", T.F32, rng.standard_normal((3, 40)).astype(np.float32)),
        ("f16.weight", T.F16, rng.standard_normal((3, 40)).astype(np.float16)),
    ]:
        tensors.append((name, arr, qtype))
        expected[name] = arr.astype(np.float32)
    for w in writers:
        w.add_name("gguf-types")
        for name, data, qtype in tensors:
            w.add_tensor(name, data, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    for dtype in ("f32", "bf16", "f16"):
        digests = {}
        for name, v in sorted(expected.items()):
            if dtype == "f32":
                raw, st = v.tobytes(), "F32"
            elif dtype == "f16":
                raw, st = v.astype(np.float16).tobytes(), "F16"
            else:
                raw, st = bf16_bits(v).tobytes(), "BF16"
            digests[name] = {"dtype": st, "shape": list(v.shape), "sha256": hashlib.sha256(raw).hexdigest()}
        OUT.joinpath(f"expected-gguf-{dtype}.digests.json").write_text(json.dumps(digests, indent=1) + "\n")


if __name__ == "__main__":
    main()

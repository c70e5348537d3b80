"""Writes tests/gguf/gguf-q1q2: a GGUF file with a tensor of each of
PrismML's Bonsai block types, Q1_0 (ggml type 41: 128 elements, an f16 d
and 128 sign bits) and Q2_0 (type 42: 64 elements, an f16 d and 2-bit
codes for -1, 0, +1, +2), random block bytes with f16 scales of spread
magnitudes as `make_types.py` makes them (never NaN or Inf), and the
digests of gguf-py's `gguf.quants.dequantize` of each in f32, and rounded
once to bf16 and f16 (nearest even).

gguf-py 0.19 on PyPI numbers Q1_0 but cannot dequantize it, and has no
Q2_0: run it with llama.cpp's gguf-py (which has both) first on the path,

    PYTHONPATH=/path/to/llama.cpp/gguf-py python tests/gguf/make_q1q2.py
"""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_types import bf16_bits, scales  # noqa: E402

T = gguf.GGMLQuantizationType
OUT = Path(__file__).resolve().parent / "gguf-q1q2"
ROWS, COLS = 6, 512


def main():
    for name in ("Q1_0", "Q2_0"):
        if name not in T.__members__:
            sys.exit(f"this gguf-py ({gguf.__file__}) has no {name}: put llama.cpp's gguf-py on PYTHONPATH")
    # The numbers and sizes the files carry: llama.cpp's, which forks reuse for other layouts.
    assert (T.Q1_0.value, gguf.GGML_QUANT_SIZES[T.Q1_0]) == (41, (128, 18))
    assert (T.Q2_0.value, gguf.GGML_QUANT_SIZES[T.Q2_0]) == (42, (64, 18))
    rng = np.random.default_rng(66)
    OUT.joinpath("model").mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(OUT / "model" / "model.gguf"), "llama")
    w.add_name("gguf-q1q2")
    expected = {}
    for qtype in (T.Q1_0, T.Q2_0):
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        n = ROWS * COLS // block
        blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
        blocks[:, 0:2] = scales(rng, n).view(np.uint8).reshape(n, 2)
        data = blocks.reshape(ROWS, COLS // block * size)
        name = f"{qtype.name.lower()}.weight"
        w.add_tensor(name, data, raw_dtype=qtype)
        expected[name] = gguf.quants.dequantize(data, qtype).reshape(ROWS, COLS).astype(np.float32)
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

"""Writes a four-layer Llama GGUF file of ~111 MB dense bf16 (hidden 1024,
16 heads / 4 KV heads, FFN 2304, vocabulary 8192; every Linear, the
embedding and the head Q4_K, norms F32; random Q4_K blocks with f16 scales
around 1e-2, the public fixture's tokenizer): the model docs/performance.md's
GGUF speed figure is measured on. Needs `pip install gguf==0.19.0 numpy`.

    python tests/gguf/make_release_model.py OUT_DIR
"""

import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

FIXTURE = Path(__file__).resolve().parent / "gguf-q4_k-llama" / "model" / "model.gguf"
HIDDEN, HEADS, KV, FFN, LAYERS, VOCAB = 1024, 16, 4, 2304, 4, 8192


def q4_k(rng, rows, cols):
    """Random Q4_K blocks: 144 bytes per 256 values, f16 d and dmin ~1e-2."""
    blocks = rng.integers(0, 256, (rows, cols // 256, 144), dtype=np.uint8)
    scales = rng.uniform(0.002, 0.02, (rows, cols // 256, 2)).astype(np.float16)
    blocks[:, :, :4] = scales.view(np.uint8).reshape(rows, cols // 256, 4)
    return blocks.reshape(rows, cols // 256 * 144)


def main(out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(out / "model.gguf"), "llama")
    w.add_name("release-llama")
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    reader = gguf.GGUFReader(str(FIXTURE))
    for field in reader.fields.values():
        if field.name.startswith("tokenizer."):
            value = field.contents()
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(field.name, value, vtype, sub_type=sub)

    def linear(name, rows, cols):
        w.add_tensor(name, q4_k(rng, rows, cols), raw_dtype=T.Q4_K)

    def norm(name):
        w.add_tensor(name, rng.uniform(0.8, 1.2, HIDDEN).astype(np.float32))

    linear("token_embd.weight", VOCAB, HIDDEN)
    kv = HIDDEN // HEADS * KV
    for i in range(LAYERS):
        norm(f"blk.{i}.attn_norm.weight")
        linear(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN)
        linear(f"blk.{i}.attn_k.weight", kv, HIDDEN)
        linear(f"blk.{i}.attn_v.weight", kv, HIDDEN)
        linear(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        norm(f"blk.{i}.ffn_norm.weight")
        linear(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        linear(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        linear(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    norm("output_norm.weight")
    linear("output.weight", VOCAB, HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out / "model.gguf")


if __name__ == "__main__":
    main(sys.argv[1])

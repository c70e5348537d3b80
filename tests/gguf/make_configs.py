"""Writes tests/gguf/configs/: small GGUF models whose rope scaling is stated
the ways llama.cpp's convert_hf_to_gguf.py states it, and what the scaling is.

  llama3.gguf   llama, theta 500000, rope_freqs.weight made as the converter's
                LlamaModel.generate_extra_tensors makes it from Llama 3.2's
                rope_scaling (factor 32, low_freq_factor 1, high_freq_factor 4,
                original_max_position_embeddings 8192)
  phi3.gguf     phi3 (Phi-3-mini-128k style): rope_factors_long/short.weight,
                phi3.rope.scaling.original_context_length 4096, context_length
                131072, phi3.rope.scaling.attn_factor as Phi3MiniModel computes it
  yarn.gguf     qwen2: rope.scaling.type yarn, factor 4, original_context_length
                32768 (Qwen2.5's long-context recipe)
  gemma3.gguf   gemma3: rope.scaling.type linear, factor 8 (Gemma 3 4B and up)
  unplaced.gguf llama without scaling, with one tensor transformers' model has
                no place for (blk.0.attn_sinks.weight)
  nan-epsilon.gguf, huge-block-count.gguf (2^62), string-theta.gguf ("abc"):
                llama files with metadata no model has

expected.json: per file, theta, the rotary width and what the model computes:
  "inv_freq"   llama.cpp's inverse frequencies for llama3, theta^(-2i/d) / rope_freqs[i]
  "long_factor", "short_factor", "original", "attention_factor" for phi3
  "rope" for the key-stated scalings: the transformers rope_parameters they are

The weights are random F16 (their values do not matter here). Needs gguf and
numpy (tests/gguf/make_hf.py's helpers write the hyperparameters and tokenizer).

    python tests/gguf/make_configs.py
"""

import json
import math
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

import make_hf

OUT = make_hf.HERE / "configs"
SMALL = dict(layers=1, hidden=64, ffn=64, heads=1, kv=1, head_dim=64, vocab=320, tied=False, tok="gpt2")


def llama3_freqs(theta, dim, factor, low, high, context):
    """convert_hf_to_gguf.py, LlamaModel.generate_extra_tensors."""
    freqs = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    low_wavelen, high_wavelen = context / low, context / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write(name, arch, extra_kv, extra_tensors):
    c = dict(SMALL, arch=arch)
    w = gguf.GGUFWriter(str(OUT / f"{name}.gguf"), arch)
    make_hf.write_hparams(w, name, c)
    for k, (v, ty) in make_hf.gpt2_tokenizer_kv().items():
        make_hf.add_kv(w, k, v, ty)
    for key, value in extra_kv:
        # the writer keeps the first value of a key: drop write_hparams' one
        w.kv_data[0].pop(key, None)
        if isinstance(value, np.uint64):
            w.add_uint64(key, int(value))
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_float32(key, value)
    rng = np.random.default_rng(61)
    for tname, data in extra_tensors:
        w.add_tensor(tname, data)
    for tname, shape, _, kind in make_hf.case_tensors(c):
        if kind in ("norm", "bias", "w1d") or len(shape) == 1:
            w.add_tensor(tname, (1 + rng.normal(0, 0.1, shape)).astype(np.float32))
        else:
            w.add_tensor(tname, rng.normal(0, 0.05, shape).astype(np.float16), raw_dtype=T.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    OUT.mkdir(exist_ok=True)
    expected = {}

    theta, dim = 500000.0, SMALL["head_dim"]
    freqs = llama3_freqs(theta, dim, 32.0, 1.0, 4.0, 8192)
    write("llama3", "llama", [("llama.rope.freq_base", theta), ("llama.context_length", 131072)],
          [("rope_freqs.weight", freqs)])
    base = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    expected["llama3"] = {"theta": theta, "rotary": dim,
                          "inv_freq": (base / freqs.astype(np.float64)).tolist()}

    rng = np.random.default_rng(3)
    long = np.sort(rng.uniform(1.0, 60.0, dim // 2)).astype(np.float32)
    short = rng.uniform(1.0, 1.2, dim // 2).astype(np.float32)
    original, context = 4096, 131072
    attn = math.sqrt(1 + math.log(context / original) / math.log(original))  # Phi3MiniModel
    write("phi3", "phi3",
          [("phi3.context_length", context), ("phi3.rope.scaling.original_context_length", original),
           ("phi3.rope.scaling.attn_factor", attn),
           # Phi3Config's default pad id (32000) is past this vocabulary: as make_hf.py's phi3
           ("tokenizer.ggml.padding_token_id", 317)],
          [("rope_factors_long.weight", long), ("rope_factors_short.weight", short)])
    expected["phi3"] = {"theta": 10000.0, "rotary": dim, "long_factor": long.tolist(),
                        "short_factor": short.tolist(), "original": original,
                        "attention_factor": float(np.float32(attn))}

    write("yarn", "qwen2",
          [("qwen2.context_length", 131072), ("qwen2.rope.scaling.type", "yarn"),
           ("qwen2.rope.scaling.factor", 4.0), ("qwen2.rope.scaling.original_context_length", 32768)],
          # Qwen2's attention has Q/K/V biases (make_hf.py has no qwen2 case to take them from)
          [(f"blk.0.attn_{x}.bias", np.zeros(SMALL["head_dim"], np.float32)) for x in "qkv"])
    expected["yarn"] = {"rope": {"rope_type": "yarn", "factor": 4.0,
                                 "original_max_position_embeddings": 32768}}

    write("gemma3", "gemma3",
          [("gemma3.rope.scaling.type", "linear"), ("gemma3.rope.scaling.factor", 8.0)], [])
    expected["gemma3"] = {"rope": {"rope_type": "linear", "factor": 8.0}, "layers": "full_attention"}

    write("unplaced", "llama", [], [("blk.0.attn_sinks.weight", np.ones(SMALL["heads"], np.float32))])

    # Well-typed files with values no model has (refused with GGUF-004, key named).
    write("nan-epsilon", "llama", [("llama.attention.layer_norm_rms_epsilon", float("nan"))], [])
    write("huge-block-count", "llama", [("llama.block_count", np.uint64(1 << 62))], [])
    write("string-theta", "llama", [("llama.rope.freq_base", "abc")], [])

    (OUT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()

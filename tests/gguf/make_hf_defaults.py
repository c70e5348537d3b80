"""Writes src/hf/gguf/defaults.json: for each transformers model type a GGUF
file converts to, the config.json fields transformers 5.25 writes for a
config of that type built with nothing set (its class defaults), less the
ones src/hf/gguf/config.rs derives from the file (layer_types, llama's and
nemotron's head_dim, falcon's head counts and ffn_hidden_size) and the
version. Needs `pip install transformers==5.25.0`.

    python tests/gguf/make_hf_defaults.py
"""

import json
from pathlib import Path

from transformers import AutoConfig

OUT = Path(__file__).resolve().parents[2] / "src/hf/gguf/defaults.json"
TYPES = ["llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "phi3", "gemma2", "gemma3_text", "starcoder2",
         "stablelm", "falcon", "nemotron"]
DERIVED = {"transformers_version", "layer_types"}

defaults = {}
for t in TYPES:
    d = AutoConfig.for_model(t).to_diff_dict()
    if t in ("llama", "nemotron"):
        d.pop("head_dim")  # hidden_size / num_attention_heads
    if t == "falcon":
        # num_attention_heads, 1 (multi_query), 4 * hidden_size
        for k in ("num_kv_heads", "num_key_value_heads", "ffn_hidden_size"):
            d.pop(k)
    defaults[t] = {k: v for k, v in sorted(d.items()) if k not in DERIVED}
OUT.write_text(json.dumps(defaults, indent=1, sort_keys=True) + "\n")
print(f"wrote {OUT}")

"""Writes tests/fixtures/gemma-w4-int2-int8-bf16: a tiny Gemma 3 text model in
Gemma's own pre-quantized layout (`quant_method: "gemma"`, transformers'
`GemmaQuantizationConfig` / `integrations/gemma_quant.py`), and the reference
digests.

transformers has no writer for this format (`GemmaQuantizer` only loads:
`requires_calibration = True`), so the checkpoint is built here the way
`QuantizedLinear` / `QuantizedEmbedding` hold it, and then loaded back
through transformers' own loader (`AutoModelForCausalLM.from_pretrained`),
which must report no missing, unexpected or mismatched keys and must put
every stored tensor where it was meant to go. The reference is what the
loaded modules' own dequantization returns:

- every `QuantizedLinear`: `_dequantize_weights(dtype)` (what `forward` uses
  for an input of the model's dtype): `int.to(dtype) * weight_scale.to(dtype)`;
- the `QuantizedEmbedding`: its `weight` property (the table without
  `embed_scale`), `int.to(out) * repeat_interleave(scale, block).to(out)`.

The model loaded in bf16 gives expected-bf16, in f16 expected-f16, in f32
expected-f32.
Tensors that are not quantized keep their stored bf16 in both.

The layout written (any producer of this format must write the same for the
loader to take it):
- `num_bits` 4 by default; `module_quant_configs` gives `mlp.down_proj` 2
  bits and `k_proj`/`v_proj` 8 bits (re.search over the module name, the
  pattern matching leftmost winning);
- int4: uint8 `[out, ceil(in/2)]`, low nibble first, code − 8; int2: uint8
  `[out, ceil(in/4)]`, bits 1:0 first, code − 2; int8: int8 `[out, in]`;
  `weight_scale` f32 `[out, 1]`. hidden_size 63 and intermediate 90 leave
  a padding field at the end of each row, filled here with non-zero codes
  (the loader drops them: `[..., :in_features]`);
- the embedding (`quantize_embeddings`): `embedding_quantized` int4 uint8
  `[vocab, 32]`, `embedding_scale` f32 `[vocab, 3]` (three blocks of 21);
- SRQ activation scales (`input_activation_scale`, `output_activation_scale`,
  f32 scalars; some calibrated, some 0) and KV-cache scales
  (`self_attn.k_cache_scale`, `v_cache_scale`), which a dense model drops.

Run with /work/venv's python:
    python tests/gemma/make_fixture.py
"""

import hashlib
import json
import os
import re
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig
from transformers.integrations.gemma_quant import QuantizedEmbedding, QuantizedLinear

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "gemma-w4-int2-int8-bf16")

QUANT = {
    "quant_method": "gemma",
    "num_bits": 4,
    "quantize_embeddings": True,
    "module_quant_configs": {
        r"mlp\.down_proj": {"num_bits": 2},
        r"self_attn\.[kv]_proj": {"num_bits": 8},
    },
    # The output projection stays bf16 (with no list at all, transformers
    # would also skip the last module and every tied one).
    "modules_to_not_convert": ["lm_head"],
}
EMBED_BLOCKS = 3


def digest(t):
    t = t.contiguous()
    raw = t.view(torch.uint8) if t.dtype != torch.uint8 else t
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def entry(t):
    name = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}[t.dtype]
    return {"dtype": name, "shape": list(t.shape), "sha256": digest(t)}


def bits_of(name):
    """replace_with_quant_layers' resolution: one alternation, re.search."""
    pats = list(QUANT["module_quant_configs"])
    m = re.compile("|".join(f"(?P<g{i}>{p})" for i, p in enumerate(pats))).search(name)
    if m is None:
        return QUANT["num_bits"]
    g = next(k for k, v in m.groupdict().items() if v is not None)
    return QUANT["module_quant_configs"][pats[int(g[1:])]].get("num_bits", QUANT["num_bits"])


def converted(name):
    """transformers' should_convert_module over modules_to_not_convert."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    return not any(
        re.match(rf"(?:{k}){boundary}", name) or name.endswith(k) for k in QUANT["modules_to_not_convert"]
    )


def quantize(w, bits, groups=1):
    """Symmetric absmax codes of `w` [rows, cols] in `groups` column blocks:
    (codes as signed ints, f32 scale [rows, groups])."""
    lo, hi = {2: (-2, 1), 4: (-8, 7), 8: (-128, 127)}[bits]
    rows, cols = w.shape
    wb = w.float().reshape(rows, groups, cols // groups)
    scale = (wb.abs().amax(dim=-1) / max(-lo, hi)).clamp(min=1e-8)
    q = (wb / scale[..., None]).round().clamp(lo, hi).to(torch.int8).reshape(rows, cols)
    return q, scale.to(torch.float32)


def pack(q, bits, pad_code):
    """Codes q (signed) packed as the loader unpacks them: `8 / bits` fields
    a byte, the first in the low bits; the row's padding fields hold
    `pad_code`."""
    if bits == 8:
        return q.contiguous()
    per = 8 // bits
    off = {2: 2, 4: 8}[bits]
    rows, cols = q.shape
    width = -(-cols // per)
    codes = torch.full((rows, width * per), pad_code, dtype=torch.int32)
    codes[:, :cols] = q.to(torch.int32) + off
    codes = codes.reshape(rows, width, per)
    packed = torch.zeros(rows, width, dtype=torch.int32)
    for k in range(per):
        packed |= codes[..., k] << (bits * k)
    return packed.to(torch.uint8)


def main():
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=256,
        hidden_size=63,
        intermediate_size=90,
        num_hidden_layers=2,
        num_attention_heads=7,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        sliding_window=32,
        # Untied: transformers cannot load a tied Gemma whose embedding is
        # quantized (tie_weights looks for `embed_tokens.weight`, which
        # QuantizedEmbedding has only as a property).
        tie_word_embeddings=False,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    model = Gemma3ForCausalLM(config).to(torch.bfloat16)
    state = {}
    for name, t in model.state_dict().items():
        module = name.rsplit(".", 1)[0]
        sub = model.get_submodule(module)
        if isinstance(sub, torch.nn.Linear) and name.endswith(".weight") and converted(module):
            bits = bits_of(module)
            q, s = quantize(t, bits)
            state[name] = pack(q, bits, pad_code=(3 if bits == 2 else 15))
            state[f"{module}.weight_scale"] = s  # [out, 1] f32
            # SRQ scales, stored for every quantized Linear (the loader
            # reports any it lacks as missing): 0 is uncalibrated (a no-op),
            # layer 0's q_proj and o_proj are calibrated.
            calibrated = module in ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj")
            state[f"{module}.input_activation_scale"] = torch.tensor(0.0625 if calibrated else 0.0)
            state[f"{module}.output_activation_scale"] = torch.tensor(0.03125 if calibrated else 0.0)
        elif isinstance(sub, torch.nn.Embedding):
            q, s = quantize(t, 4, EMBED_BLOCKS)
            state[f"{module}.embedding_quantized"] = pack(q, 4, pad_code=9)
            state[f"{module}.embedding_scale"] = s  # [vocab, blocks] f32
        else:
            state[name] = t.contiguous()
    # KV-cache scales (transformers ignores them on load).
    for layer in range(config.num_hidden_layers):
        a = f"model.layers.{layer}.self_attn"
        state[f"{a}.k_cache_scale"] = torch.tensor(0.5, dtype=torch.float32)
        state[f"{a}.v_cache_scale"] = torch.tensor(0.25, dtype=torch.float32)

    os.makedirs(os.path.join(OUT, "model"), exist_ok=True)
    save_file(state, os.path.join(OUT, "model", "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg["architectures"] = ["Gemma3ForCausalLM"]
    cfg["torch_dtype"] = "bfloat16"
    cfg.pop("dtype", None)
    cfg["quantization_config"] = QUANT
    with open(os.path.join(OUT, "model", "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)

    # The reference: transformers' loader, then each module's own dequantization.
    digests = {}
    for out, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)):
        loaded, info = AutoModelForCausalLM.from_pretrained(
            os.path.join(OUT, "model"), dtype=dtype, output_loading_info=True
        )
        assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
        lin = {n: m for n, m in loaded.named_modules() if isinstance(m, QuantizedLinear)}
        emb = {n: m for n, m in loaded.named_modules() if isinstance(m, QuantizedEmbedding)}
        assert len(lin) == 7 * config.num_hidden_layers and list(emb) == ["model.embed_tokens"], (lin, emb)
        want = {}
        for name, t in state.items():
            module, param = name.rsplit(".", 1)
            if module in lin:
                m = lin[module]
                if param == "weight":
                    assert m.num_bits == bits_of(module)
                    assert torch.equal(m.weight, t), name
                    assert m.weight_scale.dtype == torch.float32
                    assert torch.equal(m.weight_scale, state[f"{module}.weight_scale"])
                    w = m._dequantize_weights(dtype)
                    assert w.dtype == dtype and w.shape == (m.out_features, m.in_features)
                    if dtype == torch.float32:
                        assert torch.equal(w, m._dequantize_weights())
                    want[name] = entry(w)
                else:
                    assert torch.equal(getattr(m, param), t), name
            elif module in emb:
                m = emb[module]
                assert torch.equal(getattr(m, param), t), name
                if param == "embedding_quantized":
                    w = m.weight
                    assert w.dtype == dtype and w.shape == (config.vocab_size, config.hidden_size)
                    want[f"{module}.weight"] = entry(w)
            elif param.endswith("cache_scale"):
                continue
            else:
                want[name] = entry(t)  # copies keep their stored bf16
        digests[out] = (want, loaded)
        with open(os.path.join(OUT, f"expected-{out}.digests.json"), "w") as f:
            json.dump(want, f, indent=1, sort_keys=True)

    # What a dense model does differently (the warnings the tool gives):
    loaded = digests["bf16"][1]
    e = loaded.model.embed_tokens
    ids = torch.arange(config.vocab_size)
    quantized = e(ids)
    dense = e.weight[ids] * torch.tensor(e.scalar_embed_scale).to(torch.bfloat16)
    print(
        "embed_scale", e.scalar_embed_scale, "bf16", float(torch.tensor(e.scalar_embed_scale).to(torch.bfloat16)),
        "rows differing from a dense Gemma3TextScaledWordEmbedding:",
        int((quantized != dense).any(dim=-1).sum()), file=sys.stderr,
    )
    assert type(loaded.lm_head) is torch.nn.Linear
    print("wrote", OUT, "with transformers", transformers.__version__, file=sys.stderr)


if __name__ == "__main__":
    main()

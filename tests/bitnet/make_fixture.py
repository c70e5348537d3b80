"""Writes tests/fixtures/bitnet-b158-bf16: a tiny BitNet b1.58 checkpoint laid
out as microsoft/bitnet-b1.58-2B-4T is (`quant_method: bitnet`, BitLinear,
offline: `weight` uint8 [out/4, in] four ternary rows a byte by transformers'
`pack_weights`, `weight_scale` bf16 [1]), and the reference digests: what
transformers' own loader puts in each BitLinear, `unpack_weights(weight) /
weight_scale` (the division `post_quant_process` applies to the product),
in bf16 as BitLinear computes it and in f32.

Run with /work/venv's python, accelerate on PYTHONPATH (the quantizer asks
for it), TORCHDYNAMO_DISABLE=1 (`unpack_weights` is `torch.compile`d; the
same ops run eagerly):
    TORCHDYNAMO_DISABLE=1 PYTHONPATH=/tmp/bitnet-pip python tests/bitnet/make_fixture.py
"""

import hashlib
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, BitNetConfig, BitNetForCausalLM
from transformers.integrations.bitnet import BitLinear, pack_weights, unpack_weights

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "bitnet-b158-bf16")


def digest(t):
    t = t.contiguous()
    raw = t.view(torch.uint8) if t.dtype != torch.uint8 else t
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def entry(t):
    name = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}[t.dtype]
    return {"dtype": name, "shape": list(t.shape), "sha256": digest(t)}


def main():
    torch.manual_seed(0)
    config = BitNetConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = BitNetForCausalLM(config).to(torch.bfloat16)
    state = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied, as the 2B-4T model's
        module = name.rsplit(".", 1)[0]
        sub = model.get_submodule(module)
        if isinstance(sub, torch.nn.Linear) and name.endswith(".weight"):
            # The 2B-4T recipe (and WeightQuant): absmean scale, ternary codes.
            w = t.float()
            scale = 1.0 / w.abs().mean().clamp(min=1e-5)
            q = (w * scale).round().clamp(-1, 1)
            state[name] = pack_weights(q.clone())
            state[f"{module}.weight_scale"] = scale.reshape(1).to(torch.bfloat16)
        else:
            state[name] = t.contiguous()
    os.makedirs(os.path.join(OUT, "model"), exist_ok=True)
    save_file(state, os.path.join(OUT, "model", "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg["architectures"] = ["BitNetForCausalLM"]
    cfg["torch_dtype"] = "bfloat16"
    cfg.pop("dtype", None)
    cfg["quantization_config"] = {
        "linear_class": "bitlinear",
        "quant_method": "bitnet",
        "quantization_mode": "offline",
        "use_rms_norm": False,
    }
    with open(os.path.join(OUT, "model", "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)

    # The reference: transformers' loader, then each BitLinear's weight.
    loaded = AutoModelForCausalLM.from_pretrained(os.path.join(OUT, "model"), dtype=torch.bfloat16)
    bits = {n: m for n, m in loaded.named_modules() if isinstance(m, BitLinear)}
    assert len(bits) == 7 * config.num_hidden_layers, sorted(bits)
    for out, dtype in (("bf16", torch.bfloat16), ("f32", torch.float32)):
        want = {}
        for name, t in state.items():
            module = name.rsplit(".", 1)[0]
            if name.endswith(".weight_scale"):
                continue
            if module in bits:
                m = bits[module]
                assert torch.equal(m.weight, t) and torch.equal(m.weight_scale, state[f"{module}.weight_scale"])
                w = unpack_weights(m.weight, dtype=dtype) / m.weight_scale.to(dtype)
                assert w.dtype == dtype
                want[name] = entry(w)
            else:
                want[name] = entry(t)  # copies keep their stored bf16
        with open(os.path.join(OUT, f"expected-{out}.digests.json"), "w") as f:
            json.dump(want, f, indent=1, sort_keys=True)
    print("wrote", OUT, file=sys.stderr)


if __name__ == "__main__":
    main()

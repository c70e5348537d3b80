"""Writes tests/fixtures/hqq-*: tiny Llama checkpoints quantized by hqq 0.2.8
itself on the CPU, laid out as transformers' HQQ integration saved them
(transformers 4.x `save_pretrained` of a model loaded with `HqqConfig`: each
quantized Linear's `HQQLinear.state_dict()`, meta encoded as tensors by
`encode_safetensor_type`, under the module's prefix; config.json's
`quantization_config` is `{"quant_config", "quant_method": "hqq",
"skip_modules"}`), and the reference digests: each Linear loaded back into a
fresh `HQQLinear` with the compute dtype of the output (what transformers'
loader does: `HQQLinear(None, None, compute_dtype=<load dtype>)` then
`load_state_dict`) and its `dequantize()`, in that dtype.

transformers 5.x cannot write or load HQQ checkpoints ("QuantizationMethod.HQQ
is not available yet"), and 4.x quantizes on a GPU only; HQQLinear on the CPU
writes the same tensors.

    /work/pyenv/hqq/bin/python tests/hqq/make_fixture.py
(hqq==0.2.8 installed with DISABLE_CUDA=1, torch and transformers from /work/venv.)
"""

import hashlib
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
import hqq
from hqq.core.quantize import BaseQuantizeConfig, HQQLinear

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")

NAMES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}


def digest(t):
    t = t.contiguous()
    raw = t.view(torch.uint8) if t.dtype != torch.uint8 else t
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def entry(t):
    return {"dtype": NAMES[t.dtype], "shape": list(t.shape), "sha256": digest(t)}


def tag(name):
    # transformers' name_to_linear_tag: model.layers.0.self_attn.q_proj -> self_attn.q_proj
    return ".".join(n for n in name.split(".") if n not in ("model", "layers") and not n.isnumeric())


def make(case, dtype, quant_config, dynamic, outs, layers=1):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).to(dtype)
    state, layers_state = {}, {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name == "lm_head":
            continue
        qc = quant_config[tag(name)] if dynamic else quant_config
        q = HQQLinear(module, quant_config=qc, compute_dtype=dtype, device="cpu", del_orig=False)
        sd = {k: v.contiguous() for k, v in q.state_dict().items()}
        layers_state[name] = sd
        for k, v in sd.items():
            state[f"{name}.{k}"] = v
    for name, t in model.state_dict().items():
        module = name.rsplit(".", 1)[0]
        if module not in layers_state:
            state[name] = t.contiguous()
    out = os.path.join(FIXTURES, case)
    os.makedirs(os.path.join(out, "model"), exist_ok=True)
    save_file(state, os.path.join(out, "model", "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    cfg.pop("dtype", None)
    cfg["quantization_config"] = {
        "quant_config": quant_config,
        "quant_method": "hqq",
        "skip_modules": ["lm_head"],
    }
    with open(os.path.join(out, "model", "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)

    for label, d in outs:
        want = {}
        for name, t in state.items():
            module = name.rsplit(".", 1)[0]
            if module in layers_state:
                continue
            want[name] = entry(t)
        for module, sd in layers_state.items():
            # transformers 4.x's loader: a fresh layer in the load dtype.
            fresh = HQQLinear(None, quant_config=None, compute_dtype=d, device="cpu", initialize=False)
            fresh.load_state_dict({k: v.clone() for k, v in sd.items()})
            w = fresh.dequantize()
            assert w.dtype == d, (w.dtype, d)
            want[f"{module}.weight"] = entry(w)
        with open(os.path.join(out, f"expected-{label}.digests.json"), "w") as f:
            json.dump(want, f, indent=1, sort_keys=True)
    print("wrote", out, "with hqq", hqq.__version__ if hasattr(hqq, "__version__") else "0.2.8", file=sys.stderr)


def main():
    only = set(sys.argv[1:])
    global make
    full = make
    make = lambda case, *a, **kw: (not only or case in only) and full(case, *a, **kw)
    q = lambda **kw: BaseQuantizeConfig(**kw)
    # One model, every packing hqq writes but 3-bit, both axes, several groups.
    mixed = {
        "self_attn.q_proj": q(nbits=4, group_size=64, axis=1),
        "self_attn.k_proj": q(nbits=4, group_size=32, axis=0),
        "self_attn.v_proj": q(nbits=8, group_size=64, axis=1),
        "self_attn.o_proj": q(nbits=2, group_size=32, axis=1),
        "mlp.gate_proj": q(nbits=2, group_size=16, axis=0),
        "mlp.up_proj": q(nbits=1, group_size=64, axis=1),
        "mlp.down_proj": q(nbits=4, group_size=128, axis=1),
    }
    make("hqq-mixed-bf16", torch.bfloat16, mixed, True,
         [("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)])
    # HqqConfig(nbits=4, group_size=64, view_as_float=True): W_q stored as f16 bytes.
    make("hqq-4bit-g64-f16", torch.float16, q(nbits=4, group_size=64, view_as_float=True), False,
         [("f16", torch.float16), ("f32", torch.float32)])
    # 3bit_32: ten rows of the grouped weight an int32, padded to a multiple
    # of ten rows. Row counts R (numel / group for axis 1, group for axis 0)
    # that are no multiple of ten, so the last part holding rows is partial
    # (R = 64: parts of 7, the tenth holds one row; R = 128: parts of 13, the
    # tenth holds 11) or the last parts are padding alone (R = 32, 16, 8).
    three = {
        "self_attn.q_proj": q(nbits=3, group_size=64, axis=1),
        "self_attn.k_proj": q(nbits=3, group_size=32, axis=0),
        "self_attn.v_proj": q(nbits=3, group_size=16, axis=1),
        "self_attn.o_proj": q(nbits=3, group_size=64, axis=0),
        "mlp.gate_proj": q(nbits=3, group_size=128, axis=1),
        "mlp.up_proj": q(nbits=3, group_size=8, axis=0),
        "mlp.down_proj": q(nbits=3, group_size=64, axis=1),
    }
    make("hqq-3bit-bf16", torch.bfloat16, three, True,
         [("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)])
    # HqqConfig(nbits=3, group_size=64, view_as_float=True): the int32 words as f16 pairs.
    make("hqq-3bit-g64-f16", torch.float16, q(nbits=3, group_size=64, view_as_float=True), False,
         [("f16", torch.float16), ("f32", torch.float32)])


if __name__ == "__main__":
    main()

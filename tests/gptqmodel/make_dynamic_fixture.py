"""Builds tests/fixtures/gptq-dynamic-mix: a tiny Llama quantized with a
GPTQModel `dynamic` config (4-bit group 128 by default, 8-bit group 32 and a
desc_act module by rule, one module left dense by a `-:` rule), packed by
GPTQModel 7.7.0's own `TorchLinear.pack_block`, written as its v1 export
(`convert_gptq_v2_to_v1_format_module`), and the reference bytes from its own
runtime path: `convert_gptq_v1_to_v2_format_module`, then
`TorchLinear.dequantize_weight`. Which rule applies to which module is
GPTQModel's `dynamic_get`.

GPTQModel is imported from its wheel's source with its runtime-only
dependencies stubbed (no GPU, no extensions):

    pip install --target /tmp/gptqm gptqmodel==7.7.0 --no-deps
    python tests/gptqmodel/make_dynamic_fixture.py --gptqmodel-src /tmp/gptqm

Its `pcre` module (PCRE2) is stood in for by Python's `re`: the keys here use
the syntax both share.
"""

import argparse
import hashlib
import importlib.machinery
import json
import re
import shutil
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, HEADS, KV_HEADS, MLP, VOCAB, LAYERS = 128, 4, 2, 256, 64, 2
BASE = {"bits": 4, "group_size": 128, "sym": True, "desc_act": False}
# Order matters: the first rule that matches decides (layer 1's o_proj is
# caught by the `-:` rule before the layer-1 rule below it).
DYNAMIC = {
    r"-:model\.layers\.1\.self_attn\.o_proj": {},
    r"+:.*\.mlp\.down_proj": {"bits": 8, "group_size": 32},
    r"model\.layers\.1\..*_proj": {"bits": 8, "group_size": 32},
    r"^model\.layers\.0\.self_attn\.v_proj$": {"group_size": 32, "desc_act": True},
}


class _Any:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Any()

    def __getattr__(self, n):
        return _Any()

    def __iter__(self):
        return iter(())

    def __mro_entries__(self, bases):
        return (object,)

    def __bool__(self):
        return False

    def __or__(self, o):
        return _Any()

    def __ror__(self, o):
        return _Any()

    def __getitem__(self, k):
        return _Any()


class _Stub(types.ModuleType):
    def __getattr__(self, n):
        if n.startswith("__"):
            raise AttributeError(n)
        return _Any()


def import_gptqmodel(src: str):
    sys.path.insert(0, src)
    pcre = types.ModuleType("pcre")
    pcre.__dict__.update(re.__dict__)
    pcre.Flag = types.SimpleNamespace(
        MULTILINE=re.M, CASELESS=re.I, IGNORECASE=re.I, DOTALL=re.S, VERBOSE=re.X, UNICODE=re.U)
    sys.modules["pcre"] = pcre
    for _ in range(60):
        try:
            from gptqmodel.nn_modules.qlinear.torch import TorchLinear
            from gptqmodel.quantization.config import dynamic_get
            from gptqmodel.utils.model import (
                convert_gptq_v1_to_v2_format_module, convert_gptq_v2_to_v1_format_module)
            return TorchLinear, dynamic_get, convert_gptq_v1_to_v2_format_module, convert_gptq_v2_to_v1_format_module
        except ModuleNotFoundError as e:
            parts = e.name.split(".")
            for i in range(1, len(parts) + 1):
                n = ".".join(parts[:i])
                if n not in sys.modules:
                    m = _Stub(n)
                    m.__path__ = []
                    m.__spec__ = importlib.machinery.ModuleSpec(n, None)
                    sys.modules[n] = m
            for k in list(sys.modules):
                if k.startswith("gptqmodel"):
                    del sys.modules[k]
    raise RuntimeError("gptqmodel would not import")


def digests(tensors: dict) -> dict:
    out = {}
    for k in sorted(tensors):
        t = tensors[k].contiguous()
        dt = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}[t.dtype]
        raw = t.view(torch.uint8).numpy().tobytes()
        out[k] = {"dtype": dt, "shape": list(t.shape), "sha256": hashlib.sha256(raw).hexdigest()}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gptqmodel-src", default="/tmp/gptqm")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "fixtures/gptq-dynamic-mix"))
    args = ap.parse_args()
    TorchLinear, dynamic_get, v1_to_v2, v2_to_v1 = import_gptqmodel(args.gptqmodel_src)
    gen = torch.Generator().manual_seed(66)
    head = HIDDEN // HEADS

    dense = {
        "model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02,
        "lm_head.weight": torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02,
        "model.norm.weight": 1 + torch.randn(HIDDEN, generator=gen) * 0.1,
    }
    linears = {}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        dense[f"{p}.input_layernorm.weight"] = 1 + torch.randn(HIDDEN, generator=gen) * 0.1
        dense[f"{p}.post_attention_layernorm.weight"] = 1 + torch.randn(HIDDEN, generator=gen) * 0.1
        for n, o, k in [("self_attn.q_proj", HIDDEN, HIDDEN), ("self_attn.k_proj", KV_HEADS * head, HIDDEN),
                        ("self_attn.v_proj", KV_HEADS * head, HIDDEN), ("self_attn.o_proj", HIDDEN, HIDDEN),
                        ("mlp.gate_proj", MLP, HIDDEN), ("mlp.up_proj", MLP, HIDDEN), ("mlp.down_proj", HIDDEN, MLP)]:
            linears[f"{p}.{n}"] = (o, k)

    stored = {k: v.half() for k, v in dense.items()}
    ref16 = dict(stored)
    # Copies stay as stored (f16) in both references; a fixed f32 output
    # widens them exactly.
    ref32 = dict(stored)
    plan = {}
    for name, (out_f, in_f) in linears.items():
        over = dynamic_get(DYNAMIC, name)
        if over is False:
            w = (torch.randn(out_f, in_f, generator=gen) * 0.05).half()
            stored[f"{name}.weight"] = w
            ref16[f"{name}.weight"] = w
            ref32[f"{name}.weight"] = w
            plan[name] = "dense (-:)"
            continue
        c = dict(BASE, **(over or {}))
        bits, gs = c["bits"], c["group_size"]
        groups = in_f // gs
        top = 1 << bits
        # Codes, f16 scales and (symmetric) zero points; the Linear holds the
        # values they make, which pack_block quantizes back to these codes.
        q = torch.randint(0, top, (out_f, in_f), generator=gen)
        scales = (torch.rand(out_f, groups, generator=gen) * 0.01 + 1e-3).half().float()
        scales[torch.rand(out_f, groups, generator=gen) < 0.25] *= -1
        zeros = torch.full((out_f, groups), top // 2, dtype=torch.int64)
        g_idx = torch.arange(in_f) // gs
        if c["desc_act"]:
            perm = torch.randperm(in_f, generator=gen)
            g_idx = torch.empty(in_f, dtype=torch.int64)
            g_idx[perm] = torch.arange(in_f) // gs
        lin = torch.nn.Linear(in_f, out_f, bias=False)
        lin.weight.data = (q - zeros[:, g_idx]).float() * scales[:, g_idx]
        m = TorchLinear(bits=bits, group_size=gs, sym=c["sym"], desc_act=c["desc_act"],
                        in_features=in_f, out_features=out_f, bias=False, pack_dtype=torch.int32)
        m.pack_block(lin, scales, zeros, g_idx.int())
        # GPTQModel's save path writes GPTQ v1 (z - 1).
        v2_to_v1(m, types.SimpleNamespace(bits=bits, pack_dtype=torch.int32))
        for t in ["qweight", "qzeros", "scales", "g_idx"]:
            stored[f"{name}.{t}"] = getattr(m, t).detach().clone().contiguous()
        # The runtime: v1 -> v2, then dequantize_weight ([in, out], in the
        # scales' dtype: f16; with the scales widened: the exact f32 product).
        v1_to_v2(m, bits, torch.int32)
        w16 = m.dequantize_weight().T.contiguous()
        assert w16.dtype == torch.float16
        m.scales = m.scales.float()
        w32 = m.dequantize_weight().T.contiguous()
        assert torch.equal(w32, lin.weight.data), name
        ref16[f"{name}.weight"] = w16
        ref32[f"{name}.weight"] = w32
        plan[name] = f"{bits}-bit group {gs}" + (" desc_act" if c["desc_act"] else "")

    out = Path(args.out)
    if (out / "model").exists():
        shutil.rmtree(out / "model")
    (out / "model").mkdir(parents=True)
    save_file(stored, out / "model/model.safetensors", metadata={"format": "pt"})
    qc = dict(BASE, quant_method="gptq", checkpoint_format="gptq", pack_dtype="int32",
              dynamic=DYNAMIC, meta={"quantizer": ["gptqmodel:7.7.0"]})
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": MLP, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": LAYERS, "vocab_size": VOCAB, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "torch_dtype": "float16",
        "quantization_config": qc,
    }
    (out / "model/config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for name, ref in [("f16", ref16), ("f32", ref32)]:
        (out / f"expected-{name}.digests.json").write_text(json.dumps(digests(ref), indent=1) + "\n")
    (out / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    print(json.dumps(plan, indent=1))


if __name__ == "__main__":
    main()

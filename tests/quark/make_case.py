"""Quantize + export a tiny random Llama with AMD Quark (CPU). Usage: python make_case.py <case>"""
import json
import os
import sys
import shutil
import traceback

import torch

torch.set_num_threads(1)
torch.manual_seed(0)

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from quark.torch import LLMTemplate, ModelQuantizer, export_safetensors  # noqa: E402

ROOT = os.environ.get("FIXTURE_ROOT", "quark-fixture")
case = sys.argv[1]
out = os.path.join(ROOT, case)
os.makedirs(out, exist_ok=True)


def tiny_model():
    cfg = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"],
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    # make weights less uniform: scale rows/cols a bit so per-channel / per-group scales differ
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() == 2 and "embed" not in n:
                r = torch.exp(torch.randn(p.shape[0], 1) * 0.5)
                p.mul_(r.to(p.dtype))
    return m


template = LLMTemplate.get("llama")
if case == "fp8_per_tensor":
    qcfg = template.get_config(scheme="fp8")
elif case == "fp8_per_channel":
    qcfg = template.get_config(scheme="ptpc_fp8")
elif case == "mxfp4":
    qcfg = template.get_config(scheme="mxfp4")
elif case == "mxfp4_weight_only":
    qcfg = template.get_config(scheme="mxfp4_weight_only")
elif case == "mixed_exclude":
    # global fp8 per-tensor; MLP down_proj -> mxfp4 by name pattern; exclude lm_head and o_proj
    qcfg = template.get_config(
        scheme="fp8",
        layer_config={"*down_proj": "mxfp4_weight_only"},
        exclude_layers=["lm_head", "*o_proj"],
    )
else:
    raise SystemExit("unknown case")

model = tiny_model()
orig_sd = {k: v.clone() for k, v in model.state_dict().items()}
calib = [torch.randint(0, 512, (1, 32)) for _ in range(4)]
dl = torch.utils.data.DataLoader(calib, batch_size=None)

quantizer = ModelQuantizer(qcfg)
model = quantizer.quantize_model(model, dl)

# Quark's own fake-quant weights (before freeze): QuantLinear.get_quant_weight / _weight_quantizer
ref = {}
for name, mod in model.named_modules():
    wq = getattr(mod, "_weight_quantizer", None)
    if wq is not None and hasattr(mod, "weight"):
        with torch.no_grad():
            qw = mod.get_quant_weight(mod.weight)
            # same QDQ applied to an f32 copy of the weight (to probe internal precision)
            try:
                qw32 = wq(mod.weight.float())
                ref[name + ".weight#f32in"] = qw32.detach().clone()
            except Exception as e:
                print("f32 QDQ failed", name, e)
        ref[name + ".weight"] = qw.detach().clone()
        ref[name + ".weight#type"] = type(mod).__name__

qscales = {}
for n, m in model.named_modules():
    wq = getattr(m, "_weight_quantizer", None)
    if wq is not None and getattr(wq, "scale", None) is not None:
        qscales[n + ".weight"] = wq.scale.detach().clone()
model = quantizer.freeze(model)
frozen = {}
for name, mod in model.named_modules():
    if name + ".weight" in ref:
        frozen[name + ".weight"] = mod.weight.detach().clone()

mdir = os.path.join(out, "model")
if os.path.exists(mdir):
    shutil.rmtree(mdir)
with torch.no_grad():
    export_safetensors(model, mdir, custom_mode="quark", weight_format="real_quantized", pack_method="reorder")

torch.save(
    {"ref_qdq": {k: v for k, v in ref.items() if not k.endswith("#type")},
     "scale": qscales,
     "frozen": frozen, "orig": orig_sd,
     "types": {k: v for k, v in ref.items() if k.endswith("#type")}},
    os.path.join(out, "quark_reference.pt"),
)
print("DONE", case, sorted(ref.keys()))

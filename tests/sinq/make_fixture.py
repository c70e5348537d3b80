"""Writes tests/fixtures/sinq-*: a tiny Llama quantized by sinq 0.2.0 itself
on the CPU (`AutoSINQHFModel.quantize_model`, the plain SINQ method `sinq`:
Sinkhorn-normalized dual scales, f16 scale/zero/scale2, tiling 1D) and saved by sinq's own writer
(`save_quantized_safetensors`: sharded safetensors with `<m>.W_q`,
`<m>.meta.scale`, `<m>.meta.zero`, `<m>.meta.scale2`, and the non-tensor meta
in `model.safetensors.index.json.meta.json`), and the reference digests: the
weights read back by sinq's own loader (`load_weights_safetensors`), each
quantized Linear rebuilt as a `SINQLinear` (`load_state_dict`) and its
`dequantize()` on the CPU. That computes in the sidecar's `compute_dtype`
(the dtype the model was quantized in); the other outputs are the same call
with `meta["compute_dtype"]` set to that dtype.

config.json gets the `quantization_config` transformers' `SinqConfig` writes
(`quant_method: sinq`, nbits, group_size, tiling_mode, method), `method` the
one used (sinq's own API; transformers' `method: "sinq"` is the 8-bit
quantized-scale `sinq_quantAux`).

tests/fixtures/sinq-nf4-bf16: the same model through sinq's own API with
the NF4 codebook methods (`sinq_nf4`, `sinq_nf4_quantAux`); sinq's NF path
returns its scales' f16 whatever the compute dtype, so each output's
reference is that tensor cast.

tests/fixtures/sinq-aux-*: the same tiny Llama quantized the way transformers
does it (`from_pretrained(dense, quantization_config=SinqConfig(...))` on the
CPU, `save_pretrained`, which sinq's hf_io routes to the same writer):
`method: "sinq"` becomes `sinq_quantAux`, whose scales and zeros are stored
8-bit (`meta.scale.x` uint8 `[32, R/32]` with `.s`, `.m` f16 `[1, R/32]`;
`meta.zero.x` uint8 `[R, 1]` with `.s`, `.m` f16 `[1, 1]`). config.json is
transformers' own. References: `sinq.sinqlinear_hf.SINQLinear` (the class
transformers uses) rebuilt from sinq's loader, `dequantize()` on the CPU in
each output dtype; in the model's own dtype it equals what the quantized
model computed before it was saved.

tests/fixtures/sinq-bits-f16: the int32 packings 3bit_32, 5bit_32, 6bit_32,
8bit_u8 and the NF3 codebook methods (sinq_nf3, sinq_nf3_quantAux) on an f16
model; tests/fixtures/sinq-2d-bf16: the blocked 2D tiling in the byte
packings (plain, quantAux, NF4). sinq 0.2.0's loader drops an 8-bit layer's
packing and its dequantize then fails; the references put it back.

    SINQ_AUTO_PATCH=0 /work/pyenv/sinq/bin/python tests/sinq/make_fixture.py
(SINQ_CASES=sinq-bits-f16,sinq-2d-bf16 to write those fixtures alone.)
(sinq==0.2.0 from PyPI with termcolor, without its datasets/torchvision
extras, which the plain method never uses; torch and transformers from /work/venv.)
"""

import copy
import hashlib
import json
import os
import shutil
import sys

import types

import torch

# sinq.awq imports `datasets` for A-SINQ's calibration data only; the plain
# method never calls it.
sys.modules.setdefault("datasets", types.SimpleNamespace(load_dataset=None))
from transformers import LlamaConfig, LlamaForCausalLM
from sinq.patch_model import AutoSINQHFModel
from sinq.sinqlinear import SINQLinear, sinq_base_quant_config

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
NAMES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}


def digest(t):
    t = t.contiguous()
    raw = t.view(torch.uint8) if t.dtype != torch.uint8 else t
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def entry(t):
    return {"dtype": NAMES[t.dtype], "shape": list(t.shape), "sha256": digest(t)}


def wanted(case):
    """SINQ_CASES=a,b: write only those fixtures (all by default)."""
    only = os.environ.get("SINQ_CASES")
    return not only or case in only.split(",")


def make(case, dtype, quant_config, outs):
    if not wanted(case):
        return
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )
    model = LlamaForCausalLM(config).to(dtype)
    AutoSINQHFModel.quantize_model(model, tokenizer=None, quant_config=quant_config,
                                   compute_dtype=dtype, device="cpu")
    out = os.path.join(FIXTURES, case)
    shutil.rmtree(out, ignore_errors=True)
    model_dir = os.path.join(out, "model")
    AutoSINQHFModel.save_quantized_safetensors(model, None, model_dir, write_tokenizer=False)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    wq = quant_config["self_attn.q_proj"]["weight_quant_params"]
    cfg["quantization_config"] = {
        "quant_method": "sinq", "nbits": wq["nbits"], "group_size": wq["group_size"],
        "tiling_mode": wq["tiling_mode"], "method": wq["method"],
        "modules_to_not_convert": ["lm_head"],
    }
    # sinq's writer leaves config.dtype unset (the model was cast after it
    # was made); transformers' save_pretrained writes it.
    cfg["dtype"] = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)

    weights = AutoSINQHFModel.load_weights_safetensors(model_dir, map_location="cpu")
    for label, d in outs:
        want = {}
        for leaf, sd in sorted(weights.items()):
            if "W_q" not in sd:
                if leaf.endswith("rotary_emb"):
                    # Non-persistent buffers sinq's writer saves; transformers
                    # recomputes them (the output drops them).
                    continue
                for k, t in sd.items():
                    # An f16 model's copies loaded in bf16 (what a bf16
                    # output holds).
                    if t.dtype == torch.float16 and d == torch.bfloat16:
                        t = t.to(d)
                    want[f"{leaf}.{k}"] = entry(t)
                continue
            state = copy.deepcopy(sd)
            state["meta"]["compute_dtype"] = d
            m = SINQLinear(None, None, compute_dtype=d, device="cpu")
            m.load_state_dict(state)
            if "packing" not in m.meta:
                # sinq 0.2.0's load_state_dict drops the packing of a W_q
                # with one element per weight element (8bit_u8), and its
                # dequantize then fails (KeyError); put it back: unpacking
                # 8bit_u8 is the cast the unpacked path does.
                m.meta["packing"] = sd["meta"]["packing"]
            w = m.dequantize()
            method = state["meta"]["method"].lower()
            if "nf4" in method or "nf3" in method:
                # The NF path returns the scales' dtype (f16) whatever the
                # compute dtype: the output in d is that tensor cast.
                assert w.dtype == torch.float16, w.dtype
                w = w.to(d)
            assert w.dtype == d, (w.dtype, d)
            want[f"{leaf}.weight"] = entry(w)
        with open(os.path.join(out, f"expected-{label}.digests.json"), "w") as f:
            json.dump(want, f, indent=1, sort_keys=True)
    print("wrote", out, file=sys.stderr)


def make_transformers(case, dtype, sinq_config, outs):
    """A tiny Llama quantized the way transformers does it: the dense model
    saved, loaded back with `SinqConfig` (quantized on the CPU by
    sinq.sinqlinear_hf.SINQLinear as the weights load) and saved with
    `save_pretrained` (which sinq's hf_io patches onto sinq's own writer)."""
    if not wanted(case):
        return
    import tempfile
    from transformers import AutoModelForCausalLM, SinqConfig
    from sinq.sinqlinear_hf import SINQLinear as HFSINQLinear

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )
    out = os.path.join(FIXTURES, case)
    shutil.rmtree(out, ignore_errors=True)
    model_dir = os.path.join(out, "model")
    with tempfile.TemporaryDirectory() as dense:
        LlamaForCausalLM(config).to(dtype).save_pretrained(dense)
        model = AutoModelForCausalLM.from_pretrained(
            dense, quantization_config=SinqConfig(**sinq_config), dtype=dtype, device_map="cpu")
    live = {name: m.dequantize() for name, m in model.named_modules()
            if isinstance(m, HFSINQLinear)}
    model.save_pretrained(model_dir)

    weights = AutoSINQHFModel.load_weights_safetensors(model_dir, map_location="cpu")
    for label, d in outs:
        want = {}
        for leaf, sd in sorted(weights.items()):
            if "W_q" not in sd:
                if leaf.endswith("rotary_emb"):
                    continue
                for k, t in sd.items():
                    # An f16 model's copies loaded in bf16 (what a bf16
                    # output holds); a bf16 model's stay bf16 in each.
                    if t.dtype == torch.float16 and d == torch.bfloat16:
                        t = t.to(d)
                    want[f"{leaf}.{k}"] = entry(t)
                continue
            state = copy.deepcopy(sd)
            assert "quantAux" in state["meta"]["method"], state["meta"]["method"]
            state["meta"]["compute_dtype"] = d
            m = HFSINQLinear(quant_config=None, compute_dtype=d, device="cpu")
            m.load_state_dict(state)
            w = m.dequantize()
            assert w.dtype == d, (w.dtype, d)
            if d == dtype:
                # What the model transformers quantized computes, before it
                # was saved: the same bytes.
                assert torch.equal(live[leaf].view(torch.uint8), w.view(torch.uint8)), leaf
            want[f"{leaf}.weight"] = entry(w)
        with open(os.path.join(out, f"expected-{label}.digests.json"), "w") as f:
            json.dump(want, f, indent=1, sort_keys=True)
    print("wrote", out, file=sys.stderr)


def main():
    def q(**kw):
        # sinq_base_quant_config maps method "sinq" to "sinq_quantAux"
        # (8-bit scales); the plain SINQ method (Sinkhorn scale2, f16 scales)
        # is "sinq" itself, set after it.
        c = sinq_base_quant_config(**kw)
        c["weight_quant_params"]["method"] = "sinq"
        return c

    mixed = {
        "self_attn.q_proj": q(nbits=4, group_size=64),
        "self_attn.k_proj": q(nbits=4, group_size=32),
        "self_attn.v_proj": q(nbits=1, group_size=64),
        "self_attn.o_proj": q(nbits=2, group_size=64),
        "mlp.gate_proj": q(nbits=4, group_size=64),
        "mlp.up_proj": q(nbits=2, group_size=32),
        "mlp.down_proj": q(nbits=4, group_size=128),
    }
    # quantize_model reads quant_config["weight_quant_params"]["method"]
    # (for AWQ) even when the config is one per layer tag.
    mixed["weight_quant_params"] = {"method": "sinq"}
    make("sinq-mixed-bf16", torch.bfloat16, mixed,
         [("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)])
    # NF4 codebooks (sinq's own API; SinqConfig has no such method), plain
    # and with quantAux scales and zeros.
    def nf(method, **kw):
        c = sinq_base_quant_config(**kw)
        c["weight_quant_params"]["method"] = method
        return c

    nf4 = {
        "self_attn.q_proj": nf("sinq_nf4", nbits=4, group_size=64),
        "self_attn.k_proj": nf("sinq_nf4_quantAux", nbits=4, group_size=32),
        "self_attn.v_proj": nf("sinq_nf4", nbits=4, group_size=32),
        "self_attn.o_proj": nf("sinq_nf4_quantAux", nbits=4, group_size=64),
        "mlp.gate_proj": nf("sinq_nf4", nbits=4, group_size=128),
        "mlp.up_proj": nf("sinq_nf4_quantAux", nbits=4, group_size=64),
        "mlp.down_proj": nf("sinq_nf4", nbits=4, group_size=64),
    }
    nf4["weight_quant_params"] = {"method": "sinq_nf4"}
    make("sinq-nf4-bf16", torch.bfloat16, nf4,
         [("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)])
    # The other packings (3bit_32, 5bit_32 and 6bit_32 pad the grouped
    # rows to a multiple of 10, 6 and 5 ints; groups smaller than a row so
    # that a part ends inside one) and 8bit_u8, and the NF3 codebook, plain
    # and quantAux; an f16 model.
    bits = {
        "self_attn.q_proj": nf("sinq", nbits=3, group_size=32),
        "self_attn.k_proj": nf("sinq", nbits=5, group_size=16),
        "self_attn.v_proj": nf("sinq", nbits=6, group_size=32),
        "self_attn.o_proj": nf("sinq_quantAux", nbits=3, group_size=64),
        "mlp.gate_proj": nf("sinq_nf3", nbits=3, group_size=32),
        "mlp.up_proj": nf("sinq_nf3_quantAux", nbits=3, group_size=64),
        "mlp.down_proj": nf("sinq", nbits=8, group_size=64),
    }
    bits["weight_quant_params"] = {"method": "sinq"}
    make("sinq-bits-f16", torch.float16, bits,
         [("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)])
    # The blocked 2D tiling (square tiles of G: 3-D scales, zeros and
    # scale2) in the byte packings, plain, quantAux and NF4.
    def tiled(method, **kw):
        c = nf(method, tiling_mode="2D", **kw)
        return c

    two_d = {
        "self_attn.q_proj": tiled("sinq", nbits=4, group_size=32),
        "self_attn.k_proj": tiled("sinq_quantAux", nbits=2, group_size=16),
        "self_attn.v_proj": tiled("sinq_nf4", nbits=4, group_size=32),
        "self_attn.o_proj": tiled("sinq", nbits=8, group_size=64),
        "mlp.gate_proj": tiled("sinq", nbits=1, group_size=32),
        "mlp.up_proj": tiled("sinq_nf4_quantAux", nbits=4, group_size=64),
        "mlp.down_proj": tiled("sinq_quantAux", nbits=4, group_size=64),
    }
    two_d["weight_quant_params"] = {"method": "sinq"}
    make("sinq-2d-bf16", torch.bfloat16, two_d,
         [("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)])
    # transformers' SinqConfig (method "sinq", which sinq maps to
    # sinq_quantAux: 8-bit scales and zeros), as most Hub SINQ models are.
    outs = [("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)]
    make_transformers("sinq-aux-bf16", torch.bfloat16,
                      dict(nbits=4, group_size=64, modules_to_not_convert=["lm_head"]), outs)
    make_transformers("sinq-aux-2bit-f16", torch.float16,
                      dict(nbits=2, group_size=32, modules_to_not_convert=["lm_head"]), outs)


if __name__ == "__main__":
    main()

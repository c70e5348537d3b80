"""Builds tests/fixtures/autoround-*: a tiny random Llama quantized by
AutoRound itself (RTN, iters=0, on the CPU) with a per-layer `layer_config`
(one module at 8 bits group 64, regex-keyed k/v projections at 3 bits group
16 (at 4 bits group 16 in the AWQ export, whose packing holds 4..7 bits),
one module left dense (bits 16) and a quantized lm_head), exported by
AutoRound's own `quantize_and_save` in three packings:

- autoround-gptq-mix:  format "auto_round", sym    -> packing_format
  "auto_round:auto_gptq" (qlinear_torch_zp: zero points stored z - 1)
- autoround-asym-mix:  format "auto_round", asym   -> packing_format
  "auto_round" (qlinear_torch: zero points stored as they are)
- autoround-awq-mix:   format "auto_round:auto_awq", asym (WQLinear_GEMM)
- autoround-w567-gptq: format "auto_round", sym, 4 bits with 5/6/7-bit modules
  (auto_round.utils.bit_packing's stream, fields straddling int32 words)
- autoround-w567-asym: format "auto_round", asym, 5 bits with 6/7-bit modules
- autoround-gptqmodel-mix: format "auto_round:gptqmodel" -> qlinear_torch with
  g_idx (zero points stored as they are); its reference is qlinear_torch
  without g_idx (see `reference`)

The reference bytes are AutoRound's own dequantization of what it wrote:
each layer's scheme from `auto_round.inference.convert_model.get_layer_config`
(the loader's resolution of `extra_config`), the GPTQ packings decoded by
the matching `auto_round_extension.torch` QuantLinear's `forward` (the
weight matrix it builds is captured at its `torch.matmul`), the AWQ packing
by `auto_round.export.export_to_awq.utils.dequantize_gemm`. f16: as those
compute it with the stored f16 scales; f32: the same with the scales
widened to f32 (the exact product); bf16: that exact product rounded once
to bf16 (AutoRound's own bf16 forward rounds twice, through f16).

    python -m venv ... && pip install auto-round==0.16.1 (+ datasets)
    python tests/autoround/make_fixture.py
"""

import hashlib
import json
import shutil
import sys
import tempfile
import types
from pathlib import Path

import torch
from safetensors.torch import load_file

import auto_round
from auto_round import AutoRound
from auto_round.export.export_to_awq.utils import dequantize_gemm
from auto_round.inference.convert_model import get_layer_config
from auto_round_extension.torch import qlinear_torch, qlinear_torch_zp
from transformers import LlamaConfig, LlamaForCausalLM

HIDDEN, HEADS, KV_HEADS, MLP, VOCAB, LAYERS = 64, 4, 2, 128, 64, 2
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

CASES = {
    "autoround-gptq-mix": dict(fmt="auto_round", sym=True, kv_bits=3),
    "autoround-asym-mix": dict(fmt="auto_round", sym=False, kv_bits=3),
    # Packed layer by layer as it quantizes (AutoRound's AWQ `pack_layer`,
    # `WQLinear_GEMM.from_linear`): 0.16.1's packing at save time passes
    # WQLinear_GEMM arguments it does not take.
    "autoround-awq-mix": dict(fmt="auto_round:auto_awq", sym=False, kv_bits=4, low_cpu_mem_usage=True),
    # 5/6/7 bits (auto_round.utils.bit_packing's bit stream, fields
    # straddling int32 words). Symmetric (auto_gptq packing): 0.16.1's
    # AutoGPTQFormat refuses a 5-bit base scheme, so base 4 bits with
    # down_proj 6, k/v 7, lm_head 5; asymmetric: base 5 bits.
    "autoround-w567-gptq": dict(fmt="auto_round", sym=True, kv_bits=7, down_bits=6, head_bits=5),
    "autoround-w567-asym": dict(fmt="auto_round", sym=False, bits=5, kv_bits=7, down_bits=6, head_bits=6),
    # packing_format "auto_round:gptqmodel": qlinear_torch with g_idx (zero
    # points stored as they are), at 4 bits with 8-, 5- and 3-bit modules.
    "autoround-gptqmodel-mix": dict(fmt="auto_round:gptqmodel", sym=True, kv_bits=5, head_bits=3),
}


def layer_config(case):
    cfg = {
        # One module by name with its own bits and group size.
        "model.layers.0.mlp.down_proj": {"bits": case.get("down_bits", 8), "group_size": 64},
        # A module left dense.
        "model.layers.1.self_attn.o_proj": {"bits": 16},
        # A regex key: the k and v projections of every layer.
        "self_attn.[kv]_proj": {"bits": case["kv_bits"], "group_size": 16},
        # The lm_head quantized (outside the blocks).
        "lm_head": {"bits": case.get("head_bits", 4), "group_size": 32},
    }
    if case["fmt"].endswith("auto_awq"):
        # WQLinear_GEMM packs 4..7 bits only.
        cfg["model.layers.0.mlp.down_proj"] = {"bits": 4, "group_size": 64}
    return cfg


def digests(tensors):
    out = {}
    for k in sorted(tensors):
        t = tensors[k].contiguous()
        dt = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}[t.dtype]
        raw = t.view(torch.uint8).numpy().tobytes()
        out[k] = {"dtype": dt, "shape": list(t.shape), "sha256": hashlib.sha256(raw).hexdigest()}
    return out


def captured_weight(layer, dtype):
    """The [in, out] weight AutoRound's QuantLinear.forward builds."""
    seen = {}
    real = torch.matmul

    def spy(x, w):
        seen["w"] = w
        return real(x, w)

    torch.matmul = spy
    try:
        layer.forward(torch.zeros(1, layer.infeatures, dtype=dtype))
    finally:
        torch.matmul = real
    return seen["w"]


def reference(name, st, scheme, packing, out_f, in_f):
    bits, gs = scheme.bits, scheme.group_size
    qw, qz, sc = st[f"{name}.qweight"], st[f"{name}.qzeros"], st[f"{name}.scales"]
    if packing == "auto_round:auto_awq":
        g = gs if gs != -1 else in_f
        assert qw.shape == (in_f, out_f * bits // 32) and sc.shape == (in_f // g, out_f), name
        w16 = dequantize_gemm(qw, qz, sc, bits, g).T.contiguous()
        w32 = dequantize_gemm(qw, qz, sc.float(), bits, g).T.contiguous()
        return w16, w32
    mod = {"auto_round:auto_gptq": qlinear_torch_zp, "auto_round": qlinear_torch,
           "auto_round:gptqmodel": qlinear_torch}[packing]
    if packing == "auto_round:gptqmodel":
        # The stored g_idx is the plain grid (i // group_size), the only one
        # AutoRound's loader takes ("non-dummy g_idx ... not yet supported");
        # its CPU backend (auto_round:torch) is qlinear_torch, built without
        # g_idx: qlinear_torch's g_idx branch of `forward` slices the [in,
        # out] weight's columns by `in` and breaks where out > in.
        g = gs if gs != -1 else in_f
        assert torch.equal(st[f"{name}.g_idx"], torch.arange(in_f, dtype=torch.int32) // g), name
    layer = mod.QuantLinear(bits, gs, in_f, out_f, bias=False)
    for t, v in [("qweight", qw), ("qzeros", qz), ("scales", sc)]:
        assert getattr(layer, t).shape == v.shape, (name, t, v.shape)
    layer.qweight, layer.qzeros, layer.scales = qw.clone(), qz.clone(), sc.clone()
    w16 = captured_weight(layer, torch.float16).T.contiguous()
    layer.scales = sc.float()
    w32 = captured_weight(layer, torch.float32).T.contiguous()
    return w16, w32


def tiny_tokenizer():
    """A word-level tokenizer over VOCAB tokens (AutoRound wants one; RTN
    reads no text)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB - 1)}
    vocab["<unk>"] = VOCAB - 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def make(name, case):
    torch.manual_seed(66)
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=MLP, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, num_hidden_layers=LAYERS, vocab_size=VOCAB,
                      max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.float16)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn_like(p, dtype=torch.float32).half() * 0.05)
    shapes = {n: tuple(m.weight.shape) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    ar = AutoRound(model, tokenizer=tiny_tokenizer(), bits=case.get("bits", 4), group_size=32, sym=case["sym"], iters=0,
                   layer_config=layer_config(case), device_map="cpu", disable_opt_rtn=True,
                   low_cpu_mem_usage=case.get("low_cpu_mem_usage", False))
    tmp = Path(tempfile.mkdtemp())
    ar.quantize_and_save(str(tmp / "q"), format=case["fmt"])
    # AutoRound writes into a subfolder named after the scheme (q/w4g32).
    saved = next((tmp / "q").rglob("config.json")).parent
    qconf = json.loads((saved / "config.json").read_text())["quantization_config"]
    st = {}
    for f in sorted(saved.glob("*.safetensors")):
        st.update(load_file(f))

    # The loader's resolution of extra_config, on a fresh dense model.
    fresh = LlamaForCausalLM(cfg)
    schemes = get_layer_config(fresh, types.SimpleNamespace(**qconf))
    packing = qconf["packing_format"]
    ref16 = {k: v for k, v in st.items() if k.rsplit(".", 1)[-1] not in ("qweight", "qzeros", "scales", "g_idx")}
    ref32 = dict(ref16)
    ref_bf = dict(ref16)
    plan = {}
    for mod_name, (out_f, in_f) in sorted(shapes.items()):
        if f"{mod_name}.qweight" not in st:
            assert f"{mod_name}.weight" in st, mod_name
            plan[mod_name] = "dense"
            continue
        s = schemes[mod_name]
        w16, w32 = reference(mod_name, st, s, packing, out_f, in_f)
        assert w16.dtype == torch.float16 and w32.dtype == torch.float32
        ref16[f"{mod_name}.weight"] = w16
        ref32[f"{mod_name}.weight"] = w32
        ref_bf[f"{mod_name}.weight"] = w32.bfloat16()
        plan[mod_name] = f"{s.bits}-bit group {s.group_size} {'sym' if s.sym else 'asym'}"

    out = FIXTURES / name
    if out.exists():
        shutil.rmtree(out)
    (out / "model").mkdir(parents=True)
    for f in saved.iterdir():
        if f.suffix in (".json", ".safetensors") and f.name != "generation_config.json":
            shutil.copy(f, out / "model" / f.name)
    for tag, ref in [("f16", ref16), ("f32", ref32), ("bf16", ref_bf)]:
        (out / f"expected-{tag}.digests.json").write_text(json.dumps(digests(ref), indent=1) + "\n")
    (out / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    print(name, packing, json.dumps(qconf.get("extra_config"), indent=None))
    print(json.dumps(plan, indent=1))
    shutil.rmtree(tmp)


def main():
    print("auto-round", auto_round.__version__, "torch", torch.__version__, file=sys.stderr)
    only = sys.argv[1:]
    for name, case in CASES.items():
        if not only or name in only:
            make(name, case)


if __name__ == "__main__":
    main()

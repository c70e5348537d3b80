"""Builds tests/fixtures/autoround-{nvfp4,mxfp4,mxfp8}-bf16: a tiny random
bf16 Llama quantized by AutoRound itself with its NVFP4, MXFP4 and MXFP8
schemes (RTN, iters=0, on the
CPU; a few lines of text as calibration data, which the static activation
global scale needs), exported by AutoRound's own `quantize_and_save` in its
`auto_round` format: packing_format "auto_round:llm_compressor",
`weight_packed` (E2M1 nibbles), `weight_scale` (E4M3, group 16),
`weight_global_scale` and `input_global_scale` (f32 [1]); MXFP4:
`weight_packed`, `weight_scale` (E8M0 bytes, group 32); MXFP8: `weight`
(E4M3), `weight_scale` (E8M0 bytes, group 32).

autoround-mxfp4-mix: MXFP4 with a `layer_config` (MIX_LAYERS): a module in
MXFP8, the k/v projections in NVFP4, one module dense; written into the
config's `extra_config`.

The reference bytes are AutoRound's own dequantization of what it wrote:
the checkpoint loaded back by transformers with AutoRound's quantizer (its
`NVFP4QuantLinear`, `MXFP4QuantLinear`, `MXFP8QuantLinear`), each module's
`dequant_weight_online()` (f32: NVFP4 `(q * (1/g)) * s`, MX `q * 2^(e-127)`); bf16 and f16: that f32 value rounded once (what its
forward's `.to(input dtype)` does).

    python -m venv ... && pip install auto-round==0.16.1
    python tests/autoround/make_fp_fixture.py
"""

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

import auto_round
from auto_round import AutoRound
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixture import HEADS, HIDDEN, KV_HEADS, LAYERS, MLP, VOCAB, digests, tiny_tokenizer  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = {
    "autoround-nvfp4-bf16": ("NVFP4", "NVFP4QuantLinear"),
    "autoround-mxfp4-bf16": ("MXFP4", "MXFP4QuantLinear"),
    "autoround-mxfp8-bf16": ("MXFP8", "MXFP8QuantLinear"),
    "autoround-nvfp4e5m3-bf16": ("NVFP4_E5M3", "NVFP4E5M3QuantLinear"),
    # MXFP4 with an `extra_config`: down_proj of layer 0 in MXFP8, the k/v
    # projections (regex key) in NVFP4, layer 1's o_proj left dense.
    "autoround-mxfp4-mix": ("MXFP4", None),
}

MIX_LAYERS = {
    "model.layers.0.mlp.down_proj": {"bits": 8, "data_type": "mx_fp", "group_size": 32, "act_bits": 8},
    "self_attn.[kv]_proj": {"bits": 4, "data_type": "nv_fp", "group_size": 16, "act_bits": 4,
                            "act_data_type": "nv_fp4_with_static_gs", "act_group_size": 16},
    "model.layers.1.self_attn.o_proj": {"bits": 16, "act_bits": 16},
}


def make(name, scheme, qlinear):
    torch.manual_seed(66)
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=MLP, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, num_hidden_layers=LAYERS, vocab_size=VOCAB,
                      max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn_like(p, dtype=torch.float32) * 0.05)
    text = [" ".join(f"t{(i * 7 + j) % 60}" for j in range(40)) for i in range(8)]
    extra = dict(layer_config=MIX_LAYERS) if qlinear is None else {}
    ar = AutoRound(model, tokenizer=tiny_tokenizer(), scheme=scheme, iters=0, device_map="cpu",
                   disable_opt_rtn=True, dataset=text, seqlen=16, nsamples=4, batch_size=1, **extra)
    tmp = Path(tempfile.mkdtemp())
    ar.quantize_and_save(str(tmp / "q"), format="auto_round")
    saved = next((tmp / "q").rglob("config.json")).parent
    qconf = json.loads((saved / "config.json").read_text())["quantization_config"]
    st = {}
    for f in sorted(saved.glob("*.safetensors")):
        st.update(load_file(f))

    loaded = AutoModelForCausalLM.from_pretrained(str(saved), device_map="cpu")
    drop = ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")
    packed = {k.rsplit(".", 1)[0] for k in st if k.endswith(".weight_scale")}
    ref = {k: v for k, v in st.items()
           if k.rsplit(".", 1)[-1] not in drop and not (k.endswith(".weight") and k[:-7] in packed)}
    # Tensors stored dense (bf16) are cast to the output dtype.
    ref32 = {k: v.float() for k, v in ref.items()}
    ref16 = {k: v.half() for k, v in ref.items()}
    ref_bf = dict(ref)
    plan = {}
    for mod_name, mod in loaded.named_modules():
        if not hasattr(mod, "dequant_weight_online"):
            continue
        assert qlinear is None or type(mod).__name__ == qlinear, (mod_name, type(mod))
        assert f"{mod_name}.weight_scale" in st, mod_name
        w = mod.dequant_weight_online()
        assert w.dtype == torch.float32
        ref32[f"{mod_name}.weight"] = w.contiguous()
        ref16[f"{mod_name}.weight"] = w.half().contiguous()
        ref_bf[f"{mod_name}.weight"] = w.bfloat16().contiguous()
        plan[mod_name] = type(mod).__name__
    assert len(plan) == 7 * LAYERS - (qlinear is None), plan

    out = FIXTURES / name
    if out.exists():
        shutil.rmtree(out)
    (out / "model").mkdir(parents=True)
    for f in saved.iterdir():
        if f.suffix in (".json", ".safetensors") and f.name != "generation_config.json":
            shutil.copy(f, out / "model" / f.name)
    for tag, r in [("f16", ref16), ("f32", ref32), ("bf16", ref_bf)]:
        (out / f"expected-{tag}.digests.json").write_text(json.dumps(digests(r), indent=1) + "\n")
    (out / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    print(name, json.dumps(qconf))
    shutil.rmtree(tmp)


def main():
    print("auto-round", auto_round.__version__, "torch", torch.__version__, file=sys.stderr)
    only = sys.argv[1:]
    for name, (scheme, qlinear) in CASES.items():
        if not only or name in only:
            make(name, scheme, qlinear)


if __name__ == "__main__":
    main()

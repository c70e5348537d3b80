"""Writes tests/fixtures/deepseek-v4-fp8-fp4: a tiny DeepSeek-V4 checkpoint in
the layout deepseek-ai/DeepSeek-V4-Flash ships (no public tool writes it: it is
built here as transformers' DeepSeek-V4 loader reads it), and the digests of
its dense weights as transformers' own dequantizer returns them.

    python tests/deepseek_v4/make_fixture.py [--out tests/fixtures/deepseek-v4-fp8-fp4]

Layout (native DeepSeek names, no `model.` prefix):
- attention, compressor and shared-expert Linears: `<m>.weight` F8_E4M3
  `[out, in]` and `<m>.scale` F8_E8M0 over 128x128 blocks (edge blocks
  partial: `wkv` has 160 rows), except `attn.wo_a`, whose scale grid is
  32x32 (as V4.1 ships);
- routed experts `layers.L.ffn.experts.E.w{1,2,3}.weight` I8 `[out, in/2]`
  (two E2M1 codes a byte, low nibble first) and `.scale` F8_E8M0
  `[out, in/32]`;
- everything else BF16 (embeddings, norms, router) or F32 (sinks, the
  hyper-connection tensors, the router bias), copied; `gate.tid2eid` I64.
- config.json: transformers' DeepseekV4Config with V4-Flash's
  `quantization_config` (`quant_method: fp8`, `fmt: e4m3`,
  `scale_fmt: ue8m0`, `weight_block_size: [128, 128]`) and `expert_dtype:
  fp4` at the top level.

Planted scale bytes: 0x00 (2^-127, subnormal products) in one expert and one
FP8 block. 0xFE (products past f32's range) and 0xFF (NaN) are tested on
checkpoints the Rust tests write (tests/suite/deepseek_v4.rs): the fixtures'
Linears also feed the product tests, whose sums must stay finite.

References: `Fp8Dequantize._dequantize_one` (transformers 5.25,
integrations/finegrained_fp8.py), which derives each tensor's block from its
scale grid, for bf16 and f32. Where a weight's rows or columns are not a
multiple of its block (`wkv`), that derivation is not the producer's grid
(160 rows over 2 scale rows gives 80-row blocks); the reference there is the
same function on the weight zero-padded to whole blocks, cropped back, which
is what DeepSeek's own kernels compute (`checks.json` counts how many
elements the unpadded call gets wrong). The dense checkpoint is then loaded
with `AutoModelForCausalLM.from_pretrained` and must report no missing,
unexpected or mismatched keys; the quantized one is loaded the same way with
`FineGrainedFP8Config(dequantize=True)` and its weights compared with the
reference.

Needs torch and transformers >= 5.25 (models/deepseek_v4).
"""

import argparse
import hashlib
import json
import shutil
import struct
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.integrations.finegrained_fp8 import Fp8Dequantize

ROOT = Path(__file__).resolve().parents[2]
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E8M0 = torch.float8_e8m0fnu


def config() -> DeepseekV4Config:
    return DeepseekV4Config(
        vocab_size=64, hidden_size=128, moe_intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, head_dim=160, q_lora_rank=64, n_routed_experts=2,
        num_experts_per_tok=1, o_groups=2, o_lora_rank=32, index_n_heads=2, index_head_dim=32,
        index_topk=4, num_nextn_predict_layers=0, hc_mult=2,
        mlp_layer_types=["moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
    )


def native(name: str) -> str:
    """The name DeepSeek's own checkpoints use for what save_pretrained writes."""
    name = name.removeprefix("model.")
    for a, b in [("embed_tokens.weight", "embed.weight"), ("hc_head.hc_fn", "hc_head_fn"),
                 ("hc_head.hc_base", "hc_head_base"), ("hc_head.hc_scale", "hc_head_scale")]:
        if name == a:
            return b
    return name


def e8m0_exponent(amax: torch.Tensor, top: float) -> torch.Tensor:
    """The UE8M0 byte of the power of two that brings amax to <= top."""
    e = torch.ceil(torch.log2(torch.clamp(amax, min=1e-30) / top))
    return (e + 127).clamp(1, 254).to(torch.uint8)


def quantize_fp8(w: torch.Tensor, bh: int, bw: int):
    rows, cols = w.shape
    nr, nc = -(-rows // bh), -(-cols // bw)
    pad = torch.zeros(nr * bh, nc * bw)
    pad[:rows, :cols] = w.float()
    blocks = pad.reshape(nr, bh, nc, bw)
    amax = blocks.abs().amax(dim=(1, 3))
    byte = e8m0_exponent(amax, 448.0)
    scale = byte.view(E8M0).float()
    q = (blocks / scale[:, None, :, None]).reshape(nr * bh, nc * bw)[:rows, :cols]
    return q.to(torch.float8_e4m3fn), byte


def quantize_fp4(w: torch.Tensor):
    rows, cols = w.shape
    g = w.float().reshape(rows, cols // 32, 32)
    byte = e8m0_exponent(g.abs().amax(dim=2), 6.0)
    x = g / byte.view(E8M0).float()[:, :, None]
    idx = (x.abs()[..., None] - E2M1).abs().argmin(dim=-1)
    codes = (idx | ((x < 0).long() << 3)).reshape(rows, cols).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.view(torch.int8), byte


def reference(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype, block) -> torch.Tensor:
    """transformers' dequantizer; on whole blocks of `block` where the
    weight has a partial one (padded, then cropped)."""
    deq = Fp8Dequantize(None)
    rows, cols = q.shape
    if q.dtype == torch.int8 or (rows % block[0] == 0 and cols % block[1] == 0):
        return deq._dequantize_one(q, s, output_dtype=dtype)
    nr, nc = s.shape
    padded = torch.zeros(nr * block[0], nc * block[1], dtype=q.dtype)
    padded[:rows, :cols] = q
    return deq._dequantize_one(padded, s, output_dtype=dtype)[:rows, :cols].contiguous()


def digests(tensors: dict) -> dict:
    out = {}
    for k in sorted(tensors):
        t = tensors[k].contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.int64 else t.numpy().tobytes()
        dt = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int64: "I64", torch.float16: "F16"}[t.dtype]
        out[k] = {"dtype": dt, "shape": list(t.shape), "sha256": hashlib.sha256(raw).hexdigest()}
    return out


def dense_load_ok(dir_: Path) -> None:
    _, info = AutoModelForCausalLM.from_pretrained(dir_, output_loading_info=True, dtype="auto")
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"}
    assert not bad and not info.get("error_msgs"), f"{dir_}: {bad or info['error_msgs']}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "tests/fixtures/deepseek-v4-fp8-fp4"))
    args = ap.parse_args()
    out = Path(args.out)
    torch.manual_seed(4)
    cfg = config()
    tmp = Path(tempfile.mkdtemp())
    DeepseekV4ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp / "init")
    state = {native(k): v for k, v in load_file(tmp / "init/model.safetensors").items()}
    # Random weights of a realistic spread (the init is all-equal for some).
    gen = torch.Generator().manual_seed(5)
    for k, v in state.items():
        if v.is_floating_point():
            state[k] = (torch.randn(v.shape, generator=gen) * 0.05).to(torch.bfloat16)
    f32_kept = [k for k in state if k.endswith(("attn_sink",)) or "hc_" in k]
    for k in f32_kept:
        state[k] = state[k].float()
    state["layers.0.ffn.gate.bias"] = torch.randn(2, generator=gen).float()
    # Rows past the first 128 of a partial-block weight at another scale, so
    # that transformers' derived blocks (not 128 rows) give other values.
    for k, w in state.items():
        if k.endswith(".weight") and w.dim() == 2 and ".attn." in k and w.shape[0] % 128 and w.shape[0] > 128:
            state[k] = torch.cat([w[:128], w[128:] * 8])

    stored, ref_bf16, ref_f32, checks = {}, {}, {}, {"transformers": __import__("transformers").__version__,
                                                      "torch": torch.__version__, "tensors": {}}
    for k, w in state.items():
        module = k.removesuffix(".weight")
        is_expert = ".ffn.experts." in k
        is_fp8 = k.endswith(".weight") and w.dim() == 2 and (".attn." in k or ".shared_experts." in k) \
            and "norm" not in k
        if not (is_expert or is_fp8):
            stored[k] = w
            ref_bf16[k] = w
            ref_f32[k] = w
            continue
        if is_expert:
            q, byte = quantize_fp4(w)
            block = (1, 32)
            if k == "layers.0.ffn.experts.1.w2.weight":
                byte[0, 0] = 0x00
        else:
            block = (32, 32) if k.endswith("wo_a.weight") else (128, 128)
            q, byte = quantize_fp8(w, *block)
            if k == "layers.0.attn.wq_b.weight":
                byte[-1, -1] = 0x00
        s = byte.view(E8M0)
        stored[k], stored[f"{module}.scale"] = q, s
        ref_bf16[k] = reference(q, s, torch.bfloat16, block)
        ref_f32[k] = reference(q, s, torch.float32, block)
        assert torch.equal(ref_f32[k].to(torch.bfloat16).view(torch.int16), ref_bf16[k].view(torch.int16)) \
            or ref_bf16[k].isnan().any(), f"{k}: one rounding"
        entry = {"kind": "fp4" if is_expert else "fp8", "block": list(block), "scale_grid": list(s.shape)}
        if q.dtype != torch.int8 and (q.shape[0] % block[0] or q.shape[1] % block[1]):
            try:
                plain = Fp8Dequantize(None)._dequantize_one(q, s, output_dtype=torch.float32)
                entry["unpadded_transformers_differs"] = int((plain != ref_f32[k]).sum())
            except ValueError as e:
                entry["unpadded_transformers_raises"] = str(e)
        checks["tensors"][k] = entry

    if (out / "model").exists():
        shutil.rmtree(out / "model")  # NOTES.md beside it stays
    (out / "model").mkdir(parents=True)
    save_file(stored, out / "model/model.safetensors", metadata={"format": "pt"})
    cfg_json = json.loads((tmp / "init/config.json").read_text())
    cfg_json.pop("transformers_version", None)
    cfg_json["expert_dtype"] = "fp4"
    cfg_json["quantization_config"] = {
        "quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128], "activation_scheme": "dynamic",
    }
    (out / "model/config.json").write_text(json.dumps(cfg_json, indent=2) + "\n")

    # The dense references load in transformers with every key in place.
    dense_cfg = {k: v for k, v in cfg_json.items() if k not in ("quantization_config", "expert_dtype")}
    for name, ref in [("bf16", ref_bf16), ("f32", ref_f32)]:
        d = tmp / f"expected-{name}"
        d.mkdir()
        save_file({k: v.contiguous() for k, v in ref.items()}, d / "model.safetensors", metadata={"format": "pt"})
        (d / "config.json").write_text(json.dumps(dense_cfg, indent=2))
        dense_load_ok(d)
        (out / f"expected-{name}.digests.json").write_text(json.dumps(digests(ref), indent=1) + "\n")

    # transformers' own loader, dequantizing the quantized checkpoint on the CPU
    # (needs accelerate). It raises on the weights whose grid it cannot divide:
    # those are left out of the copy it loads (and reported missing).
    raises = [k for k, v in checks["tensors"].items() if "unpadded_transformers_raises" in v]
    loadable = tmp / "loadable"
    shutil.copytree(out / "model", loadable)
    kept = {k: v for k, v in stored.items() if k not in raises and k.removesuffix(".scale") + ".weight" not in raises}
    save_file(kept, loadable / "model.safetensors", metadata={"format": "pt"})
    try:
        from transformers import FineGrainedFP8Config
        m, info = AutoModelForCausalLM.from_pretrained(
            loadable, output_loading_info=True, dtype=torch.float32,
            quantization_config=FineGrainedFP8Config(dequantize=True))
        dense = AutoModelForCausalLM.from_pretrained(tmp / "expected-f32", dtype=torch.float32)
        got, want = m.state_dict(), dense.state_dict()
        missing = set(info["missing_keys"])
        differ = sorted(k for k in want if k not in missing and not torch.equal(
            got[k].view(torch.int32) if got[k].dtype == torch.float32 else got[k],
            want[k].view(torch.int32) if want[k].dtype == torch.float32 else want[k]))
        checks["from_pretrained_dequantize"] = {
            "loading_info": {k: sorted(map(str, v)) for k, v in info.items()},
            "left_out": raises,
            "tensors_compared": len(want) - len(missing),
            "tensors_differing_from_reference": differ,
        }
    except Exception as e:  # recorded, not fatal: the per-tensor reference stands
        checks["from_pretrained_dequantize"] = {"error": f"{type(e).__name__}: {e}"[:500]}
    (out / "checks.json").write_text(json.dumps(checks, indent=1) + "\n")
    shutil.rmtree(tmp)
    print(json.dumps(checks, indent=1)[:3000])


if __name__ == "__main__":
    main()

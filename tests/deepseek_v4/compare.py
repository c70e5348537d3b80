"""wgpu-dequant against transformers' own DeepSeek-V4 dequantizing loader on
the same checkpoint in DeepSeek-V4-Flash's layout: time, peak memory, and
the bytes of every tensor.

Needs torch, transformers >= 5.25 (models/deepseek_v4) and accelerate. Not
part of CI (torch alone is several GB):

    python tests/deepseek_v4/compare.py --tool target/release/wgpu-dequant [--dir /tmp] [--runs 3]

The checkpoint is generated as tests/deepseek_v4/make_fixture.py writes its
fixture (the same quantizers, the same native names), only larger: three
`moe` layers of hidden 1024, 8 heads of head_dim 128, q/o LoRA ranks 256,
16 routed experts of 256 and one shared expert, vocabulary 4096; 108 MB of
bf16 output. FP8 E4M3 attention, compressor and shared-expert Linears with
F8_E8M0 128x128 block scales (`attn.wo_a`: 32x32, as V4.1 ships), routed
experts I8 (two E2M1 codes a byte) with F8_E8M0 scales per 32, BF16/F32
copies; config.json with V4-Flash's `quantization_config` and `expert_dtype:
fp4`. Every Linear here is whole blocks, so transformers' derived block
(from the scale grid) is the producer's grid and the loader takes every
tensor (see make_fixture.py for the partial-block case, where it does not).

The producer's path, in its own process: `from_pretrained(DIR,
quantization_config=FineGrainedFP8Config(dequantize=True),
dtype=torch.bfloat16)` then `save_pretrained(OUT)` (which writes the native
names back, under `model.`). Both tools run in turns, --runs times each,
timed with GNU time's wall clock and peak RSS; the ranges are printed.
"""

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "common"))
from timing import in_turns, ranges, ratios, read_dir  # noqa: E402

GENERATE = r"""
import importlib.util, json, sys, tempfile, shutil
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
spec = importlib.util.spec_from_file_location("mf", sys.argv[1])
mf = importlib.util.module_from_spec(spec); spec.loader.exec_module(mf)
out = Path(sys.argv[2]); layers = int(sys.argv[3]); experts = int(sys.argv[4])
cfg = DeepseekV4Config(
    vocab_size=4096, hidden_size=1024, moe_intermediate_size=256, num_hidden_layers=layers,
    num_attention_heads=8, head_dim=128, q_lora_rank=256, n_routed_experts=experts,
    num_experts_per_tok=2, o_groups=2, o_lora_rank=256, index_n_heads=2, index_head_dim=128,
    index_topk=4, num_nextn_predict_layers=0, hc_mult=2, mlp_layer_types=["moe"] * layers,
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16})
torch.manual_seed(4)
tmp = Path(tempfile.mkdtemp())
DeepseekV4ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp / "init")
state = {mf.native(k): v for k, v in load_file(tmp / "init/model.safetensors").items()}
gen = torch.Generator().manual_seed(5)
stored = {}
for k, v in state.items():
    if v.is_floating_point():
        v = (torch.randn(v.shape, generator=gen) * 0.05).to(torch.bfloat16)
        if k.endswith("attn_sink") or "hc_" in k or k.endswith("ffn.gate.bias"):
            v = v.float()
    is_expert = ".ffn.experts." in k
    is_fp8 = k.endswith(".weight") and v.dim() == 2 and (".attn." in k or ".shared_experts." in k) \
        and "norm" not in k
    if is_expert:
        q, byte = mf.quantize_fp4(v)
    elif is_fp8:
        q, byte = mf.quantize_fp8(v, *((32, 32) if k.endswith("wo_a.weight") else (128, 128)))
    else:
        stored[k] = v
        continue
    stored[k], stored[k.removesuffix(".weight") + ".scale"] = q, byte.view(mf.E8M0)
out.mkdir(parents=True)
save_file(stored, out / "model.safetensors", metadata={"format": "pt"})
c = json.loads((tmp / "init/config.json").read_text())
c.pop("transformers_version", None)
c["expert_dtype"] = "fp4"
c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
(out / "config.json").write_text(json.dumps(c, indent=2) + "\n")
shutil.rmtree(tmp)
"""

# The producer's own path: its loader dequantizes (FP8 blocks and the FP4
# experts) while it loads, then save_pretrained writes the dense model.
TRANSFORMERS = """
import time; T0 = time.perf_counter()
import sys, torch
from transformers import AutoModelForCausalLM, FineGrainedFP8Config
T1 = time.perf_counter()
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16,
                                         quantization_config=FineGrainedFP8Config(dequantize=True))
T2 = time.perf_counter()
m.save_pretrained(sys.argv[2])
T3 = time.perf_counter()
print(f"phases: import {T1 - T0:.2f} from_pretrained {T2 - T1:.2f} save_pretrained {T3 - T2:.2f}", file=sys.stderr)
"""


def native(name: str) -> str:
    """make_fixture.native (the same renames), without importing torch here."""
    name = name.removeprefix("model.")
    for a, b in [("embed_tokens.weight", "embed.weight"), ("hc_head.hc_fn", "hc_head_fn"),
                 ("hc_head.hc_base", "hc_head_base"), ("hc_head.hc_scale", "hc_head_scale")]:
        if name == a:
            return b
    return name


def widen(bf16: bytes) -> bytes:
    """bf16 bytes as the f32 bytes of the same values (little-endian)."""
    out = bytearray(len(bf16) * 2)
    out[2::4], out[3::4] = bf16[0::2], bf16[1::2]
    return bytes(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True, help="the wgpu-dequant binary")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--backend", default="cpu", help="wgpu-dequant's --backend")
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoint and outputs")
    args = ap.parse_args()
    work = Path(args.dir) / "dsv4-compare"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ckpt = work / "model"
    subprocess.run([sys.executable, "-c", GENERATE, str(HERE / "make_fixture.py"), str(ckpt),
                    str(args.layers), str(args.experts)], check=True)

    def command(who, out):
        if who == "ours":
            return [args.tool, "dequantize", str(ckpt), "-o", str(out), "--backend", args.backend, "--quiet"]
        return [sys.executable, "-c", TRANSFORMERS, str(ckpt), str(out)]

    runs = in_turns(work, ["ours", "transformers"], args.runs, command, tail=3000)
    ours = read_dir(work / "ours")
    theirs = {native(k): v for k, v in read_dir(work / "transformers").items()}
    differ = [n for n in sorted(theirs) if n not in ours or ours[n] != theirs[n]]
    # transformers keeps some modules in f32 (norms, the compressor's ape):
    # it widens the stored bf16 copies; the same values when ours, widened, match.
    widened = [n for n in differ if n in ours and (ours[n][0], theirs[n][0]) == ("BF16", "F32")
               and ours[n][1] == theirs[n][1] and widen(ours[n][2]) == theirs[n][2]]
    differ = [n for n in differ if n not in widened]
    missing = sorted(set(ours) - set(theirs))
    size = sum(len(t[2]) for t in ours.values()) / 1e6
    inp = sum(f.stat().st_size for f in ckpt.glob("*.safetensors")) / 1e6
    print(f"checkpoint: {args.layers} layers, {args.experts} FP4 experts a layer, {inp:.0f} MB in, "
          f"{size:.0f} MB of output; {args.runs} runs each, in turns")
    print(f"wgpu-dequant ({args.backend}): {ranges(runs['ours'])}")
    print(f"transformers (from_pretrained FineGrainedFP8Config(dequantize=True), save_pretrained): "
          f"{ranges(runs['transformers'])}")
    print(ratios(runs["ours"], runs["transformers"]))
    print(f"tensors: {len(theirs)}; differing or missing: {differ or 'none'}; only ours: {missing or 'none'}")
    print(f"bf16 copies transformers writes widened to f32 (the same values): {len(widened)} "
          f"({', '.join(sorted({n.split('.')[-2] + '.' + n.split('.')[-1] for n in widened}))})")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if not differ and not missing else 1)


if __name__ == "__main__":
    main()

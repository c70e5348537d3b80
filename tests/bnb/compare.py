"""wgpu-dequant against the path bitsandbytes users take today to get a
dense model back (transformers + bitsandbytes + torch: load the 4-bit
checkpoint, `model.dequantize()`, `save_pretrained`) on the same
checkpoint: time, peak memory, and the bytes of every tensor.

Needs torch, transformers and bitsandbytes (CPU is enough). Not part of CI
(torch alone is several GB):

    python tests/bnb/compare.py --tool target/release/wgpu-dequant [--dir /tmp] [--runs 3]

The checkpoint is generated: a four-layer TinyLlama-shaped model (hidden
2048, 32 heads / 4 KV heads, MLP 5632, vocabulary 1280, bf16: 363 MB
dense) made with random weights and quantized by transformers +
bitsandbytes themselves (NF4, double quant, block 64), as `save_pretrained`
writes it. Both tools then run in their own process, timed (best of
--runs) with GNU time's wall clock and peak RSS.
"""

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from timing import in_turns, read_dir  # noqa: E402

HIDDEN, HEADS, KV_HEADS, MLP, VOCAB, LAYERS = 2048, 32, 4, 5632, 1280, 4

GENERATE = """
import sys, torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
dense, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=%d, num_attention_heads=%d, num_key_value_heads=%d,
                  intermediate_size=%d, vocab_size=%d, num_hidden_layers=%d,
                  tie_word_embeddings=False)
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(dense)
q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                       bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
m = AutoModelForCausalLM.from_pretrained(dense, quantization_config=q, device_map="cpu",
                                         dtype=torch.bfloat16)
m.save_pretrained(out)
""" % (HIDDEN, HEADS, KV_HEADS, MLP, VOCAB, LAYERS)

# What a user runs today (no forward pass: on avx512_bf16 CPUs one repacks
# the weights and dequantize() then returns wrong values).
TRANSFORMERS = """
import sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], device_map="cpu", dtype=torch.bfloat16)
m.dequantize()
m.save_pretrained(sys.argv[2])
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True, help="the wgpu-dequant binary")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--backend", default="cpu", help="wgpu-dequant's --backend")
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoint and outputs")
    args = ap.parse_args()
    work = Path(args.dir) / "bnb-compare"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ckpt = work / "model"
    subprocess.run([sys.executable, "-c", GENERATE, str(work / "dense"), str(ckpt)], check=True)
    shutil.rmtree(work / "dense")

    def command(who, out):
        if who == "ours":
            return [args.tool, "dequantize", str(ckpt), "-o", str(out), "--backend", args.backend, "--quiet"]
        return [sys.executable, "-c", TRANSFORMERS, str(ckpt), str(out)]

    runs = in_turns(work, ["ours", "transformers"], args.runs, command, say=False)
    best = {who: (min((s for s, _ in t), default=1e9), max((m for _, m in t), default=0.0))
            for who, t in runs.items()}
    ours, theirs = read_dir(work / "ours"), read_dir(work / "transformers")
    differ = [n for n in sorted(theirs) if n not in ours or ours[n] != theirs[n]]
    extra = sorted(set(ours) - set(theirs))
    size = sum(len(t[2]) for t in ours.values()) / 1e6
    cfg = json.loads((work / "ours" / "config.json").read_text())
    (s1, m1), (s2, m2) = best["ours"], best["transformers"]
    print(f"checkpoint: {LAYERS} layers, NF4 double quant, {size:.0f} MB of bf16 output; best of {args.runs}")
    print(f"wgpu-dequant ({args.backend}): {s1:.2f} s, peak RSS {m1:.0f} MB")
    print(f"transformers + bitsandbytes (load, dequantize(), save_pretrained): {s2:.2f} s, peak RSS {m2:.0f} MB")
    print(f"{s2 / s1:.1f}x faster, {m1 / m2:.2f} of the memory")
    print(f"tensors: {len(theirs)}; differing or missing: {differ or 'none'}; extra: {extra or 'none'}")
    print(f"config.json: quantization_config {'kept' if 'quantization_config' in cfg else 'dropped'}, dtype {cfg.get('dtype', cfg.get('torch_dtype'))}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if not differ and not extra else 1)


if __name__ == "__main__":
    main()

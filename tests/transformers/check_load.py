"""Loads a dense checkpoint written by wgpu-dequant in transformers.

Fails unless transformers reports no missing, unexpected or mismatched
keys; with --reference, also unless the logits on a fixed input equal the
reference checkpoint's bit for bit. Needs torch and transformers (not part
of CI: see docs/formats.md, "MoE releases").

    python tests/transformers/check_load.py DENSE [--reference REF]
"""

import argparse
import sys

import torch
from transformers import AutoModelForCausalLM


def load(path):
    model, info = AutoModelForCausalLM.from_pretrained(
        path, output_loading_info=True, dtype="auto"
    )
    return model.eval(), info


def logits(model):
    vocab = model.config.vocab_size
    ids = (torch.arange(24) * 37 % vocab).unsqueeze(0)
    with torch.no_grad():
        return model(input_ids=ids).logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dense")
    ap.add_argument("--reference")
    args = ap.parse_args()
    model, info = load(args.dense)
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"}
    if bad or info.get("error_msgs"):
        print(f"{args.dense}: transformers reports {bad or info['error_msgs']}")
        return 1
    print(f"{args.dense}: {type(model).__name__}, no missing or unexpected keys")
    if args.reference:
        ref, _ = load(args.reference)
        a, b = logits(model), logits(ref)
        if not torch.equal(a, b):
            print(f"logits differ from {args.reference}: max |diff| {(a - b).abs().max()}")
            return 1
        print(f"logits equal {args.reference}'s ({tuple(a.shape)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""wgpu-dequant against GPTQModel's own `dequantize_model` on the same GPTQ
checkpoint: time, peak memory, and the bytes of every tensor.

Needs torch, safetensors, numpy and GPTQModel (its source tree is enough:
pass --gptqmodel-src DIR, or have `gptqmodel` installed). Not part of CI
(torch alone is several GB):

    python tests/gptqmodel/compare.py --tool target/release/wgpu-dequant [--dir /tmp]

The checkpoint is generated: a four-layer Qwen2.5-0.5B-shaped model (hidden
896, 14 heads / 2 KV heads, MLP 4864, vocabulary 151936, tied embeddings),
GPTQ v1 4-bit group 128 symmetric, f16, as GPTQModel writes it.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file, load_file

HIDDEN, HEADS, KV_HEADS, MLP, VOCAB, LAYERS, GROUP = 896, 14, 2, 4864, 151936, 4, 128


def linear(rng, tensors, name, out_f, in_f):
    groups = in_f // GROUP
    tensors[f"{name}.qweight"] = rng.integers(-2**31, 2**31, (in_f // 8, out_f), dtype=np.int64).astype(np.int32)
    # Symmetric v1: every stored zero is 8 - 1.
    tensors[f"{name}.qzeros"] = np.full((groups, out_f // 8), 0x77777777, dtype=np.int32)
    tensors[f"{name}.scales"] = (rng.random((groups, out_f), dtype=np.float32) * 0.01 + 1e-4).astype(np.float16)
    tensors[f"{name}.g_idx"] = (np.arange(in_f) // GROUP).astype(np.int32)


def write_checkpoint(path: Path):
    rng = np.random.default_rng(0)
    t = {}
    head = HIDDEN // HEADS
    t["model.embed_tokens.weight"] = (rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32) * 0.02).astype(np.float16)
    t["model.norm.weight"] = np.ones(HIDDEN, dtype=np.float16)
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        for n, o in [("q_proj", HIDDEN), ("k_proj", KV_HEADS * head), ("v_proj", KV_HEADS * head), ("o_proj", HIDDEN)]:
            linear(rng, t, f"{p}.self_attn.{n}", o, HIDDEN)
        for n in ["q_proj", "k_proj", "v_proj"]:
            o = HIDDEN if n == "q_proj" else KV_HEADS * head
            t[f"{p}.self_attn.{n}.bias"] = np.zeros(o, dtype=np.float16)
        linear(rng, t, f"{p}.mlp.gate_proj", MLP, HIDDEN)
        linear(rng, t, f"{p}.mlp.up_proj", MLP, HIDDEN)
        linear(rng, t, f"{p}.mlp.down_proj", HIDDEN, MLP)
        t[f"{p}.input_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float16)
        t[f"{p}.post_attention_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float16)
    path.mkdir(parents=True)
    save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": HIDDEN,
        "intermediate_size": MLP, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": LAYERS, "vocab_size": VOCAB, "tie_word_embeddings": True,
        "torch_dtype": "float16",
        "quantization_config": {"bits": 4, "group_size": GROUP, "desc_act": False, "sym": True,
                                "quant_method": "gptq", "checkpoint_format": "gptq", "format": "gptq",
                                "pack_dtype": "int32", "lm_head": False},
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))


def timed(cmd, env=None):
    """Seconds and peak RSS (MB) of `cmd`, through GNU time."""
    out = subprocess.run(["/usr/bin/time", "-f", "%e %M", *cmd], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"{cmd[0]} failed:\n{out.stdout}\n{out.stderr}")
    secs, kb = out.stderr.strip().splitlines()[-1].split()
    return float(secs), int(kb) / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True, help="the wgpu-dequant binary")
    ap.add_argument("--gptqmodel-src", help="GPTQModel's source tree (the folder holding gptqmodel/)")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    work = Path(args.dir) / "gptq-compare"
    shutil.rmtree(work, ignore_errors=True)
    ckpt = work / "model"
    write_checkpoint(ckpt)
    env = dict(os.environ)
    if args.gptqmodel_src:
        env["PYTHONPATH"] = args.gptqmodel_src + os.pathsep + env.get("PYTHONPATH", "")
    producer = ("import sys, torch; from gptqmodel.utils.model_dequant import dequantize_model; "
                "dequantize_model(sys.argv[1], sys.argv[2], target_dtype=torch.float16)")
    best = {"ours": (1e9, 0), "gptqmodel": (1e9, 0)}
    for _ in range(args.runs):
        for who in best:
            out = work / who
            shutil.rmtree(out, ignore_errors=True)
            if who == "ours":
                cmd = [args.tool, "dequantize", str(ckpt), "-o", str(out), "--backend", "cpu", "--quiet"]
            else:
                cmd = [sys.executable, "-c", producer, str(ckpt), str(out)]
            s, m = timed(cmd, env)
            best[who] = (min(best[who][0], s), max(best[who][1], m))
    ours, theirs = load_file(str(work / "ours" / "model.safetensors")), load_file(str(work / "gptqmodel" / "model.safetensors"))
    names = sorted(theirs)
    same = sorted(ours) == names and all(ours[n].tobytes() == theirs[n].tobytes() for n in names)
    size = sum(a.nbytes for a in ours.values()) / 1e6
    (s1, m1), (s2, m2) = best["ours"], best["gptqmodel"]
    print(f"checkpoint: {LAYERS} layers, {size:.0f} MB of f16 output; best of {args.runs}")
    print(f"wgpu-dequant (CPU): {s1:.2f} s, peak RSS {m1:.0f} MB")
    print(f"GPTQModel dequantize_model: {s2:.2f} s, peak RSS {m2:.0f} MB")
    print(f"{s2 / s1:.1f}x faster, {m1 / m2:.2f} of the memory; same bytes: {same}")
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()

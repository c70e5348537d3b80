"""wgpu-dequant against GPTQModel's own `dequantize_model` on the same GPTQ
checkpoint: time, peak memory, and the bytes of every tensor.

Needs torch, safetensors, numpy and GPTQModel (its wheel's source is
enough: pass --gptqmodel-src DIR, or have `gptqmodel` installed). Not part of CI
(torch alone is several GB):

    python tests/gptqmodel/compare.py --tool target/release/wgpu-dequant [--dir /tmp]
    python tests/gptqmodel/compare.py --tool target/release/wgpu-dequant --dynamic \
        --gptqmodel-src /tmp/gptqm [--runs 5]

The checkpoint is generated: a four-layer Qwen2.5-0.5B-shaped model (hidden
896, 14 heads / 2 KV heads, MLP 4864, vocabulary 151936, tied embeddings),
GPTQ v1 4-bit group 128 symmetric, f16, as GPTQModel writes it.

--dynamic: three such layers with a vocabulary of 8192 (104 MB of f16
output) under a GPTQModel `dynamic` config: 4-bit group 128 by default,
8-bit group 32 for every `down_proj` and every Linear of layer 1, group 32
with desc_act (a permuted g_idx) for layer 0's `v_proj`, and layer 1's
`o_proj` left dense by a `-:` rule (stored f16 `.weight`). Which rule
applies to which module is GPTQModel's own `dynamic_get`. GPTQModel 7.7's
`dequantize_model` reads one `bits` for the whole checkpoint (it never reads
`dynamic`), so the producer's path timed here is its runtime's, per module:
`TorchLinear` holding the stored tensors, `convert_gptq_v1_to_v2_format_module`,
`dequantize_weight()` (as tests/gptqmodel/make_dynamic_fixture.py takes the
fixture's references), then `save_file`. `dequantize_model` is run once on
the same checkpoint and what it does is printed.

GPTQModel is imported from its wheel's source with its runtime-only
dependencies stubbed, as make_dynamic_fixture.py does:

    pip install --target /tmp/gptqm gptqmodel==7.7.0 --no-deps
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "common"))
from timing import in_turns, ranges, ratios  # noqa: E402

HIDDEN, HEADS, KV_HEADS, MLP, VOCAB, LAYERS, GROUP = 896, 14, 2, 4864, 151936, 4, 128
# --dynamic: a smaller model (~100 MB of f16 output) and GPTQModel rules. The
# first rule that matches decides (layer 1's o_proj is caught by the `-:`
# rule before the layer-1 rule below it).
DYN_VOCAB, DYN_LAYERS = 8192, 3
DYNAMIC = {
    r"-:model\.layers\.1\.self_attn\.o_proj": {},
    r"+:.*\.mlp\.down_proj": {"bits": 8, "group_size": 32},
    r"model\.layers\.1\..*_proj": {"bits": 8, "group_size": 32},
    r"^model\.layers\.0\.self_attn\.v_proj$": {"group_size": 32, "desc_act": True},
}

# Imports GPTQModel from its wheel's source (argv[1]) with what it imports
# but does not need here stubbed (make_dynamic_fixture.import_gptqmodel).
# The modules to stub are found once (dynamic_rule) and passed in
# GPTQM_STUBS, so that the timed runs import GPTQModel once, as an install
# with its dependencies would, not once per module found missing.
IMPORT = """
import time; T0 = time.perf_counter()
import importlib.machinery, importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("mdf", sys.argv[1])
mdf = importlib.util.module_from_spec(spec); spec.loader.exec_module(mdf)
for n in json.loads(os.environ.get("GPTQM_STUBS", "[]")):
    if n not in sys.modules:
        m = mdf._Stub(n); m.__path__ = []; m.__spec__ = importlib.machinery.ModuleSpec(n, None)
        sys.modules[n] = m
TorchLinear, dynamic_get, v1_to_v2, _ = mdf.import_gptqmodel(sys.argv[2])
T1 = time.perf_counter()
"""

# GPTQModel's runtime, module by module: the rule dynamic_get picks, a
# TorchLinear holding the stored tensors, v1 -> v2, dequantize_weight().
RUNTIME = IMPORT + """
import json, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
src, out = Path(sys.argv[3]), Path(sys.argv[4])
cfg = json.loads((src / "config.json").read_text())
qc = cfg.pop("quantization_config")
base = {k: qc[k] for k in ("bits", "group_size", "sym", "desc_act")}
stored = load_file(src / "model.safetensors")
modules = sorted(k[: -len(".qweight")] for k in stored if k.endswith(".qweight"))
parts = {m + "." + p for m in modules for p in ("qweight", "qzeros", "scales", "g_idx")}
dense = {k: v for k, v in stored.items() if k not in parts}
with torch.inference_mode():
    for name in modules:
        c = dict(base, **(dynamic_get(qc.get("dynamic") or {}, name) or {}))
        in_f, out_f = stored[name + ".g_idx"].shape[0], stored[name + ".scales"].shape[1]
        m = TorchLinear(bits=c["bits"], group_size=c["group_size"], sym=c["sym"], desc_act=c["desc_act"],
                        in_features=in_f, out_features=out_f, bias=False, pack_dtype=torch.int32)
        for p in ("qweight", "qzeros", "scales", "g_idx"):
            setattr(m, p, stored[name + "." + p])
        v1_to_v2(m, c["bits"], torch.int32)
        dense[name + ".weight"] = m.dequantize_weight().T.contiguous()
T2 = time.perf_counter()
out.mkdir(parents=True)
save_file(dense, out / "model.safetensors", metadata={"format": "pt"})
cfg["torch_dtype"] = "float16"
(out / "config.json").write_text(json.dumps(cfg, indent=2))
T3 = time.perf_counter()
print(f"phases: import {T1 - T0:.2f} read+decode {T2 - T1:.2f} save {T3 - T2:.2f}", file=sys.stderr)
"""

# GPTQModel's checkpoint-level dequantizer (what the non-dynamic run times).
DEQUANTIZE_MODEL = """
import sys, torch
from gptqmodel.utils.model_dequant import dequantize_model
dequantize_model(sys.argv[1], sys.argv[2], target_dtype=torch.float16)
"""
# dequantize_model's own imports, stubbed where missing (IMPORT first).
IMPORT_DEQUANTIZE_MODEL = """
for _ in range(60):
    try:
        from gptqmodel.utils.model_dequant import dequantize_model
        break
    except ModuleNotFoundError as e:
        n = e.name
        for i in range(1, len(n.split(".")) + 1):
            k = ".".join(n.split(".")[:i])
            if k not in sys.modules:
                s = mdf._Stub(k); s.__path__ = []
                s.__spec__ = importlib.machinery.ModuleSpec(k, None)
                sys.modules[k] = s
        for k in [k for k in sys.modules if k.startswith("gptqmodel.utils.model_dequant")]:
            del sys.modules[k]
"""
DEQUANTIZE_MODEL_STUBBED = IMPORT + IMPORT_DEQUANTIZE_MODEL + """
import torch
dequantize_model(sys.argv[3], sys.argv[4], target_dtype=torch.float16)
"""


def pack(codes: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """GPTQ's int32 packing along `axis` (0: qweight's rows, 1: qzeros' columns),
    lowest bits first."""
    per = 32 // bits
    c = np.moveaxis(codes.astype(np.uint32), axis, 0)
    c = c.reshape(c.shape[0] // per, per, *c.shape[1:])
    word = np.zeros(c.shape[:1] + c.shape[2:], dtype=np.uint32)
    for j in range(per):
        word |= c[:, j] << np.uint32(bits * j)
    return np.moveaxis(word, 0, axis).view(np.int32)


def linear(rng, tensors, name, out_f, in_f, bits=4, group=GROUP, desc_act=False):
    groups = in_f // group
    tensors[f"{name}.qweight"] = rng.integers(-2**31, 2**31, (in_f * bits // 32, out_f), dtype=np.int64).astype(np.int32)
    # Symmetric v1: every stored zero is 2^(bits-1) - 1.
    tensors[f"{name}.qzeros"] = pack(np.full((groups, out_f), (1 << (bits - 1)) - 1), bits, 1)
    tensors[f"{name}.scales"] = (rng.random((groups, out_f), dtype=np.float32) * 0.01 + 1e-4).astype(np.float16)
    g_idx = np.arange(in_f) // group
    if desc_act:
        g_idx = g_idx[rng.permutation(in_f)]
    tensors[f"{name}.g_idx"] = g_idx.astype(np.int32)


def write_checkpoint(path: Path, rule=None):
    """`rule(module) -> None (dense) or (bits, group, desc_act)`: the dynamic
    plan; without one, every Linear is 4-bit group 128."""
    rng = np.random.default_rng(0)
    vocab, layers = (DYN_VOCAB, DYN_LAYERS) if rule else (VOCAB, LAYERS)
    t = {}
    head = HIDDEN // HEADS
    t["model.embed_tokens.weight"] = (rng.standard_normal((vocab, HIDDEN), dtype=np.float32) * 0.02).astype(np.float16)
    t["model.norm.weight"] = np.ones(HIDDEN, dtype=np.float16)
    plan = {}
    for i in range(layers):
        p = f"model.layers.{i}"
        mods = [(f"self_attn.{n}", o, HIDDEN) for n, o in
                [("q_proj", HIDDEN), ("k_proj", KV_HEADS * head), ("v_proj", KV_HEADS * head), ("o_proj", HIDDEN)]]
        mods += [("mlp.gate_proj", MLP, HIDDEN), ("mlp.up_proj", MLP, HIDDEN), ("mlp.down_proj", HIDDEN, MLP)]
        for n, o, k in mods:
            how = rule(f"{p}.{n}") if rule else (4, GROUP, False)
            plan[f"{p}.{n}"] = how
            if how is None:
                t[f"{p}.{n}.weight"] = (rng.standard_normal((o, k), dtype=np.float32) * 0.05).astype(np.float16)
            else:
                linear(rng, t, f"{p}.{n}", o, k, *how)
        for n in ["q_proj", "k_proj", "v_proj"]:
            o = HIDDEN if n == "q_proj" else KV_HEADS * head
            t[f"{p}.self_attn.{n}.bias"] = np.zeros(o, dtype=np.float16)
        t[f"{p}.input_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float16)
        t[f"{p}.post_attention_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float16)
    path.mkdir(parents=True)
    save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})
    qc = {"bits": 4, "group_size": GROUP, "desc_act": False, "sym": True,
          "quant_method": "gptq", "checkpoint_format": "gptq", "format": "gptq",
          "pack_dtype": "int32", "lm_head": False}
    if rule:
        qc["dynamic"] = DYNAMIC
        qc["meta"] = {"quantizer": ["gptqmodel:7.7.0"]}
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": HIDDEN,
        "intermediate_size": MLP, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": layers, "vocab_size": vocab, "tie_word_embeddings": True,
        "torch_dtype": "float16", "quantization_config": qc,
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return plan


def dynamic_rule(src: str):
    """GPTQModel's own dynamic_get, run in a child process (it needs torch):
    module -> (bits, group, desc_act) or None for `-:`. Sets GPTQM_STUBS
    (what the timed runs stub) on the way."""
    names = [f"model.layers.{i}.{n}" for i in range(DYN_LAYERS) for n in
             ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]]
    got = json.loads(find_stubs(src, DYNAMIC, names))
    base = {"bits": 4, "group_size": GROUP, "desc_act": False}

    def rule(name):
        o = got[name]
        if o is False:
            return None
        c = dict(base, **(o or {}))
        return c["bits"], c["group_size"], c["desc_act"]
    return rule


def find_stubs(src: str, dynamic=None, names=()):
    """Imports GPTQModel from `src` in a child process, stubbing what is
    missing, and sets GPTQM_STUBS to the modules it stubbed; returns
    dynamic_get's answer for `names` under `dynamic` (JSON)."""
    code = IMPORT + IMPORT_DEQUANTIZE_MODEL + """
dyn, names = json.loads(sys.argv[3]), json.loads(sys.argv[4])
print(json.dumps({n: dynamic_get(dyn, n) for n in names}))
print(json.dumps(sorted(k for k, v in sys.modules.items() if isinstance(v, mdf._Stub))))
"""
    out = subprocess.run([sys.executable, "-c", code, str(HERE / "make_dynamic_fixture.py"), src,
                          json.dumps(dynamic or {}), json.dumps(list(names))],
                         capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    os.environ["GPTQM_STUBS"] = lines[-1]
    return lines[-2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True, help="the wgpu-dequant binary")
    ap.add_argument("--gptqmodel-src", help="GPTQModel's source tree (the folder holding gptqmodel/)")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dynamic", action="store_true",
                    help="a GPTQModel `dynamic` checkpoint, against GPTQModel's runtime dequantizer")
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoint and outputs")
    args = ap.parse_args()
    if args.dynamic and not args.gptqmodel_src:
        sys.exit("--dynamic needs --gptqmodel-src (pip install --target DIR gptqmodel==7.7.0 --no-deps)")
    work = Path(args.dir) / "gptq-compare"
    shutil.rmtree(work, ignore_errors=True)
    ckpt = work / "model"
    plan = write_checkpoint(ckpt, dynamic_rule(args.gptqmodel_src) if args.dynamic else None)
    if args.gptqmodel_src and not args.dynamic:
        find_stubs(args.gptqmodel_src)
    env = dict(os.environ)
    theirs_name = "GPTQModel runtime (TorchLinear.dequantize_weight)" if args.dynamic else "GPTQModel dequantize_model"

    def command(who, out):
        if who == "ours":
            return [args.tool, "dequantize", str(ckpt), "-o", str(out), "--backend", "cpu", "--quiet"]
        if args.dynamic:
            return [sys.executable, "-c", RUNTIME, str(HERE / "make_dynamic_fixture.py"),
                    args.gptqmodel_src, str(ckpt), str(out)]
        if args.gptqmodel_src:
            return [sys.executable, "-c", DEQUANTIZE_MODEL_STUBBED, str(HERE / "make_dynamic_fixture.py"),
                    args.gptqmodel_src, str(ckpt), str(out)]
        return [sys.executable, "-c", DEQUANTIZE_MODEL, str(ckpt), str(out)]

    runs = in_turns(work, ["ours", "gptqmodel"], args.runs, command, env)
    ours, theirs = load_file(str(work / "ours" / "model.safetensors")), load_file(str(work / "gptqmodel" / "model.safetensors"))
    names = sorted(theirs)
    differ = [n for n in names if n not in ours or ours[n].dtype != theirs[n].dtype
              or ours[n].tobytes() != theirs[n].tobytes()]
    extra = sorted(set(ours) - set(theirs))
    size = sum(a.nbytes for a in ours.values()) / 1e6
    layers = DYN_LAYERS if args.dynamic else LAYERS
    if args.dynamic:
        kinds = {}
        for how in plan.values():
            k = "dense (-:)" if how is None else f"{how[0]}-bit g{how[1]}" + (" desc_act" if how[2] else "")
            kinds[k] = kinds.get(k, 0) + 1
        print(f"dynamic plan (GPTQModel's dynamic_get): {kinds}")
    print(f"checkpoint: {layers} layers, {size:.0f} MB of f16 output; {args.runs} runs each, in turns")
    print(f"wgpu-dequant (CPU): {ranges(runs['ours'])}")
    print(f"{theirs_name}: {ranges(runs['gptqmodel'])}")
    print(ratios(runs["ours"], runs["gptqmodel"]))
    print(f"tensors: {len(names)}; differing or missing: {differ or 'none'}; extra: {extra or 'none'}")
    if args.dynamic:
        # What GPTQModel's checkpoint-level dequantizer makes of the same checkpoint.
        out = work / "dequantize_model"
        r = subprocess.run([sys.executable, "-c", DEQUANTIZE_MODEL_STUBBED, str(HERE / "make_dynamic_fixture.py"),
                            args.gptqmodel_src, str(ckpt), str(out)], capture_output=True, text=True)
        if r.returncode != 0:
            last = [ln for ln in r.stderr.strip().splitlines() if ln.strip()][-1]
            print(f"GPTQModel dequantize_model on the same checkpoint: fails ({last[:300]})")
        else:
            dm = {}
            for f in sorted(out.glob("*.safetensors")):
                dm.update(load_file(str(f)))
            bad = [n for n in names if n not in dm or dm[n].shape != theirs[n].shape
                   or dm[n].tobytes() != theirs[n].tobytes()]
            print(f"GPTQModel dequantize_model on the same checkpoint: {len(bad)} tensors differ from "
                  f"its runtime's ({bad[:6]}{' …' if len(bad) > 6 else ''})")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if not differ and not extra else 1)


if __name__ == "__main__":
    main()

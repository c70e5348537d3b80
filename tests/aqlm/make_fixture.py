"""Writes tests/fixtures/aqlm-* : tiny Llamas whose Linears are AQLM
`QuantizedLinear`s (`quant_method: aqlm`, the layout of ISTA-DASLab's
`*-AQLM-*-hf` checkpoints), and the reference digests.

aqlm 1.1.7 has no quantizer of its own in the wheel (AQ's beam search lives
in the AQLM repository's scripts, GPU-minded), so the tensors are drawn at
random in exactly the layout `aqlm.QuantizedLinear`'s state dict has:
`codes` [out/og, in/ig, M] in `aqlm.utils.get_int_dtype(nbits)`, written by
`aqlm.utils.pack_int_data` (codes >= 2^(nbits-1) stored negative),
`codebooks` [M, 2^nbits, og, ig] and `scales` [out/og, 1, 1, 1] in the model
dtype. The model is then loaded by transformers' own AQLM loader
(`AutoModelForCausalLM.from_pretrained`, which builds every Linear as
`aqlm.QuantizedLinear` through `replace_with_aqlm_linear`) once for each
output dtype d (bf16, f16, f32), and the reference weight of each module is
what aqlm's CPU dequantizing kernel (`dequantize_gemm`) feeds F.linear:
`_dequantize_weight(unpack_int_data(codes, log2 K), codebooks, scales)`
computed from the loaded module's own parameters (codebooks and scales
cast to d by the loader).

Cases:
- aqlm-1x16-f16: 1 codebook of 2^16 (int16 codes, half of them >= 32768,
  stored negative), in_group 1, out_group 1 (a 2^16 codebook of larger
  tiles would not fit a small fixture), q_proj quantized,
  the others in linear_weights_not_to_quantize.
- aqlm-2x8-bf16: 2 codebooks of 256 (int8 codes, >= 128 stored negative),
  in_group 4, out_group 2, every Linear quantized.
- aqlm-4x6-f16: 4 codebooks of 64 (int8 codes, >= 32 stored negative),
  in_group 2, out_group 1: more than two codebooks, where the order of the
  sum shows (F.embedding_bag sums in f32 and rounds once).

    /work/pyenv/aqlm/bin/python tests/aqlm/make_fixture.py
"""

import hashlib
import json
import os
import sys
import warnings

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import aqlm
from aqlm import QuantizedLinear
from aqlm.utils import _dequantize_weight, get_int_dtype, pack_int_data, unpack_int_data

warnings.filterwarnings("ignore", category=FutureWarning)

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
LINEARS = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
]

# name: (M codebooks, nbits, in_group, out_group, dtype, quantized Linears, hidden, intermediate)
CASES = {
    "aqlm-1x16-f16": (1, 16, 1, 1, torch.float16, ["self_attn.q_proj"], 32, 64),
    "aqlm-2x8-bf16": (2, 8, 4, 2, torch.bfloat16, LINEARS, 64, 128),
    "aqlm-4x6-f16": (4, 6, 2, 1, torch.float16, LINEARS, 32, 64),
}


def digest(t):
    t = t.contiguous()
    raw = t.view(torch.uint8) if t.dtype != torch.uint8 else t
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def entry(t):
    name = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}[t.dtype]
    return {"dtype": name, "shape": list(t.shape), "sha256": digest(t)}


def write(case, spec):
    m, nbits, ig, og, dtype, quantized, hidden, inter = spec
    out_dir = os.path.join(FIXTURES, case)
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).to(dtype)
    k = 2**nbits
    state = {}
    for name, t in model.state_dict().items():
        module = name.rsplit(".", 1)[0]
        tail = module.split(".", 3)[-1] if module.startswith("model.layers.") else None
        if tail not in quantized:
            state[name] = t.contiguous()
            continue
        lin = model.get_submodule(module)
        out_f, in_f = lin.out_features, lin.in_features
        q = QuantizedLinear(in_f, out_f, ig, og, m, nbits, bias=False, dtype=dtype)
        sd = {}
        # Entries of every magnitude (a wide spread makes the sum's
        # rounding and its order show), scales near 1.
        spread = torch.logspace(-3, 0, k).view(1, k, 1, 1)
        sd["codebooks"] = (torch.randn(m, k, og, ig, generator=g) * spread).to(dtype)
        codes = torch.randint(0, k, (out_f // og, in_f // ig, m), generator=g, dtype=torch.int64)
        # The largest codes in the first tiles, so the sign is exercised early.
        codes.view(-1)[: min(4, codes.numel())] = torch.tensor([k - 1, k // 2, k // 2 - 1, 0])[: min(4, codes.numel())]
        sd["codes"] = pack_int_data(codes.clone(), nbits)
        assert sd["codes"].dtype == get_int_dtype(nbits)
        assert torch.equal(unpack_int_data(sd["codes"], nbits), codes)
        sd["scales"] = (torch.rand(out_f // og, 1, 1, 1, generator=g) * 1.5 + 0.25).to(dtype)
        q.load_state_dict(sd, strict=True, assign=True)
        for key, t2 in q.state_dict().items():
            assert key in sd and t2.dtype == sd[key].dtype and t2.shape == sd[key].shape, key
        for key, p in sd.items():
            state[f"{module}.{key}"] = p.contiguous()
    os.makedirs(os.path.join(out_dir, "model"), exist_ok=True)
    save_file(state, os.path.join(out_dir, "model", "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = {torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    cfg.pop("dtype", None)
    # transformers 5.25 matches the list against module names (a suffix, or
    # a regex from the start): ISTA-DASLab's "lm_head.weight" entries would
    # not keep lm_head dense, so module names are listed beside them.
    skip = ["model.embed_tokens.weight", "lm_head.weight", "lm_head"]
    skip += [f"model.layers.0.{t}" for t in LINEARS if t not in quantized]
    cfg["quantization_config"] = {
        "quant_method": "aqlm",
        "in_group_size": ig,
        "out_group_size": og,
        "num_codebooks": m,
        "nbits_per_codebook": nbits,
        "linear_weights_not_to_quantize": skip,
    }
    with open(os.path.join(out_dir, "model", "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    for out, d in (("f16", torch.float16), ("bf16", torch.bfloat16), ("f32", torch.float32)):
        loaded = AutoModelForCausalLM.from_pretrained(os.path.join(out_dir, "model"), dtype=d)
        want = {}
        seen = 0
        for mod_name, mod in loaded.named_modules():
            if isinstance(mod, QuantizedLinear):
                assert mod.codebooks.dtype == d and mod.scales.dtype == d, mod_name
                w = _dequantize_weight(
                    unpack_int_data(mod.codes.data, mod.codebooks.shape[1].bit_length() - 1),
                    mod.codebooks.data,
                    mod.scales.data,
                )
                assert w.dtype == d
                want[f"{mod_name}.weight"] = entry(w)
                seen += 1
        assert seen == len(quantized), (seen, quantized)
        for name, t in state.items():
            module = name.rsplit(".", 1)[0]
            if name.endswith((".codes", ".codebooks", ".scales")):
                continue
            want[name] = entry(t.to(d))
        with open(os.path.join(out_dir, f"expected-{out}.digests.json"), "w") as f:
            json.dump(want, f, indent=1, sort_keys=True)
    print("wrote", out_dir, file=sys.stderr)


def main():
    print("aqlm", aqlm.__version__ if hasattr(aqlm, "__version__") else "1.1.7", "torch", torch.__version__, file=sys.stderr)
    for case, spec in CASES.items():
        write(case, spec)


if __name__ == "__main__":
    main()

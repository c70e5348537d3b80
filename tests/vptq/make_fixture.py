"""Writes tests/fixtures/vptq-llama-f16 (and -bf16, the same draws in bf16): a tiny Llama whose seven Linears are
VPTQ `VQuantLinear`s laid out as the VPTQ-community checkpoints are
(`quant_method: vptq`, `config_for_layers`, indices packed into int32 by
vptq's own `pack_index`), and the reference digests: each layer's weight as
vptq 0.0.5.post1's `vptq.ops.quant_gemm.dequant` computes it (the torch path
`quant_gemm` takes without CUDA kernels), in the centroids' dtype, and that
value cast to the other dtypes.

The layers cover: residual codebooks with res_bits > index_bits (vptq's
`unpack_index_tensor` masks the residual index with index_bits), res_bits <
and == index_bits, several groups (codebooks along the inputs), padding
(out_features not a multiple of the vector length), outlier columns with
their own codebook and vector length, perm and weight_scale/weight_bias.

Each module's tensors are loaded into vptq's own VQuantLinear (built as
transformers' `replace_with_vptq_linear` builds it: is_indice_packed=True,
enable_proxy_error=False) with strict=True, so names, shapes and dtypes are
what the loader expects; the reference is then computed from the module's
own parameters.

vptq 0.0.5.post1's wheel (manylinux, CPU-only here: its CUDA library fails
to load and it says so) was installed with --no-deps beside /work/venv's
torch/transformers, plus accelerate; `sentence_transformers` (imported by
vptq.utils.pack for model conversion only) is stubbed below.
    /work/pyenv/vptq/bin/python tests/vptq/make_fixture.py
"""

import hashlib
import json
import math
import os
import sys
import types

# vptq.utils.pack imports SentenceTransformer for its conversion tool only.
_st = types.ModuleType("sentence_transformers")
_sts = types.ModuleType("sentence_transformers.SentenceTransformer")
_sts.SentenceTransformer = object
_st.SentenceTransformer = _sts
sys.modules.setdefault("sentence_transformers", _st)
sys.modules.setdefault("sentence_transformers.SentenceTransformer", _sts)

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from vptq.layers.vqlinear import VQuantLinear  # noqa: E402
from vptq.ops.quant_gemm import dequant  # noqa: E402
from vptq.utils.pack import pack_index  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")

# (module, v, K, res K, group_num, outlier_size, outlier v, outlier K, perm, norm)
LAYERS = {
    "self_attn.q_proj": (4, 16, 64, 2, 0, -1, -1, True, True),  # res 6 bits > index 4
    "self_attn.k_proj": (3, 8, -1, 1, 8, 2, 4, True, False),  # padding 1, outliers
    "self_attn.v_proj": (8, 256, 16, 1, 0, -1, -1, False, True),  # res 4 < index 8
    "self_attn.o_proj": (2, 32, 32, 4, 0, -1, -1, True, True),  # res 5 == index 5
    "mlp.gate_proj": (4, 64, 256, 1, 16, 4, 8, True, True),  # res 8 > 6, outliers
    "mlp.up_proj": (5, 32, -1, 2, 4, 3, 4, False, False),  # padding 2, outlier padding 2
    "mlp.down_proj": (4, 128, 512, 2, 0, -1, -1, True, True),  # res 9 > 7
}


def digest(t):
    t = t.contiguous()
    raw = t.view(torch.uint8) if t.dtype != torch.uint8 else t
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def entry(t):
    name = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}[t.dtype]
    return {"dtype": name, "shape": list(t.shape), "sha256": digest(t)}


def pack_bits(idx, ib, ridx, rb):
    """pack_index's packing (merged = res << index_bits | index, total_bits
    per field LSB first, each row padded to whole int32 words)."""
    total = ib + rb
    merged = (ridx << ib) | idx
    wf = torch.arange(0, total).view(1, 1, 1, -1)
    out = torch.bitwise_and(torch.bitwise_right_shift(merged.unsqueeze(-1), wf), 1)
    out = out.reshape(*merged.shape[:-1], -1)
    pad = (32 - out.shape[-1] % 32) % 32
    out = torch.nn.functional.pad(out, (0, pad)).reshape(*merged.shape[:-1], -1, 32)
    wf1 = torch.arange(0, 32).view(1, 1, 1, -1)
    return torch.bitwise_left_shift(out, wf1).sum(dim=-1).to(torch.uint32).view(torch.int32)


def layer(name, lin, spec, g, dtype):
    v, k, rk, groups, osz, ov, ok, perm, norm = spec
    out_f, in_f = lin.out_features, lin.in_features
    gs = (in_f - osz) // groups
    assert gs * groups + osz == in_f
    conf = {
        "bias": False,
        "enable_norm": norm,
        "enable_perm": perm,
        "group_num": groups,
        "group_size": gs,
        "in_features": in_f,
        "indices_as_float": False,
        "is_indice_packed": True,
        "num_centroids": [ok, k],
        "num_res_centroids": [-1, rk],
        "out_features": out_f,
        "outlier_size": osz,
        "vector_lens": [ov, v],
    }
    m = VQuantLinear(
        in_f,
        out_f,
        vector_lens=conf["vector_lens"],
        num_centroids=conf["num_centroids"],
        num_res_centroids=conf["num_res_centroids"],
        group_num=groups,
        group_size=gs,
        outlier_size=osz,
        indices_as_float=False,
        enable_norm=norm,
        enable_perm=perm,
        is_indice_packed=True,
        enable_proxy_error=False,
        bias=False,
        dtype=dtype,
    )
    n_idx = (out_f + (-out_f) % v) // v
    sd = {}
    sd["centroids.weight"] = (torch.randn(groups, k * v, generator=g) * 0.05).to(dtype)
    idx = torch.randint(0, k, (groups, n_idx, gs), generator=g, dtype=torch.int64)
    ib = int(math.log2(k))
    if rk > 0:
        rb = int(math.log2(rk))
        sd["res_centroids.weight"] = (torch.randn(groups, rk * v, generator=g) * 0.01).to(dtype)
        ridx = torch.randint(0, rk, (groups, n_idx, gs), generator=g, dtype=torch.int64)
        if rb <= ib:
            packed = pack_index(
                idx.to(torch.uint16).view(torch.int16),
                ib,
                ridx.to(torch.uint16).view(torch.int16),
                rb,
                index_dtype=torch.uint16,
            )
        else:
            # pack_index asserts that unpack_index_tensor gives the residual
            # back, which it does not above index_bits: the same packing
            # without that check, residual indices over the whole res range.
            packed = pack_bits(idx, ib, ridx, rb)
    else:
        packed = pack_index(idx.to(torch.uint16).view(torch.int16), ib, index_dtype=torch.uint16)
    sd["indices"] = packed
    if osz > 0:
        o_n = (out_f + (-out_f) % ov) // ov
        sd["outlier_centroids.weight"] = (torch.randn(1, ok * ov, generator=g) * 0.2).to(dtype)
        sd["outlier_indices"] = torch.randint(0, ok, (1, o_n, osz), generator=g).to(torch.int16)
    if perm:
        sd["perm"] = torch.randperm(in_f, generator=g).to(torch.int16)
    if norm:
        sd["weight_scale"] = (1.0 + 0.3 * torch.randn(in_f, generator=g)).to(dtype)
        sd["weight_bias"] = (0.01 * torch.randn(in_f, generator=g)).to(dtype)
    m.load_state_dict(sd, strict=True, assign=True)
    for key, t in m.state_dict().items():
        assert key in sd and t.dtype == sd[key].dtype and t.shape == sd[key].shape, key
    # What quant_gemm hands dequant on the torch path.
    c = m.centroids.weight.view(groups, k, v)
    rc = m.res_centroids.weight.view(groups, rk, v) if rk > 0 else None
    oc = m.outlier_centroids.weight.view(1, ok, ov) if osz > 0 else None
    w = dequant(
        indices=m.indices,
        centroids=c,
        outlier_indices=m.outlier_indices,
        outlier_centroids=oc,
        res_indices=m.res_indices,
        res_centroids=rc,
        perm=getattr(m, "perm", None),
        weight_scale=m.weight_scale,
        weight_bias=m.weight_bias,
        is_indice_packed=True,
        enable_outlier=m.enable_outlier,
        enable_residual=m.enable_residual,
        enable_perm=perm,
        enable_norm=norm,
        num_centroids=k,
        num_outlier_centroids=ok,
        num_res_centroids=rk,
        padding=m.padding,
        outlier_padding=m.outlier_padding,
        num_codebooks=groups,
        group_size=gs,
        outlier_size=osz,
        vector_len=v,
        outlier_vector_len=ov,
        vector_quant_dim="out",
    )
    assert w.dtype == dtype and tuple(w.shape) == (out_f, in_f), (w.dtype, w.shape)
    return conf, sd, w


def main():
    # vptq-llama-f16, and the same draws in bf16 (every step rounded in bf16).
    write(torch.float16, "f16", "float16")
    write(torch.bfloat16, "bf16", "bfloat16")


def write(dtype, short, torch_name):
    out_dir = os.path.join(FIXTURES, f"vptq-llama-{short}")
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).to(dtype)
    state, layers, weights = {}, {}, {}
    for name, t in model.state_dict().items():
        module = name.rsplit(".", 1)[0]
        tail = module.split(".", 3)[-1] if module.startswith("model.layers.") else None
        if tail in LAYERS:
            conf, sd, w = layer(module, model.get_submodule(module), LAYERS[tail], g, dtype)
            layers[module] = conf
            weights[name] = w
            for key, p in sd.items():
                state[f"{module}.{key}"] = p.contiguous()
        else:
            state[name] = t.contiguous()
    os.makedirs(os.path.join(out_dir, "model"), exist_ok=True)
    save_file(state, os.path.join(out_dir, "model", "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = torch_name
    cfg.pop("dtype", None)
    cfg["quantization_config"] = {
        "quant_method": "vptq",
        "config_for_layers": layers,
        "shared_layer_config": {},
    }
    with open(os.path.join(out_dir, "model", "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    for out, dtype in (("f16", torch.float16), ("bf16", torch.bfloat16), ("f32", torch.float32)):
        want = {}
        for name, t in model.state_dict().items():
            # Copies are cast to the output dtype as the tool writes them.
            want[name] = entry((weights[name] if name in weights else state[name]).to(dtype))
        with open(os.path.join(out_dir, f"expected-{out}.digests.json"), "w") as f:
            json.dump(want, f, indent=1, sort_keys=True)
    print("wrote", out_dir, file=sys.stderr)


if __name__ == "__main__":
    main()

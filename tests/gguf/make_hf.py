"""Writes tests/gguf/hf-<case>/ for the cases in CASES: a small random GGUF file per architecture
(llama, llama-spm, qwen3, qwen3moe, qwen2moe, phi3, gemma2, gemma3, starcoder2, stablelm,
falcon, nemotron, and bonsai: a qwen3 of Q1_0 and Q2_0 weights) and what transformers makes of it,
plus tests/gguf/hf-names.json (GGUF tensor name -> transformers name, per architecture, and the GGUF
tensors transformers drops).

Per case:
  model/model.gguf                 gguf-py GGUFWriter: general.*, the architecture's hyperparameters as
                                   llama.cpp's convert_hf_to_gguf writes them, tokenizer metadata, random
                                   tensors in a Q4_K_M-like mixture (types per tensor in checks.json).
                                   Q8_0/Q4_0/TQ1_0/TQ2_0 come from gguf.quants.quantize of random f32;
                                   gguf-py 0.19 has no quantizer for the K-quants, so those are random
                                   block bytes with f16 scale fields of a sane magnitude (like the public
                                   fixtures).
  expected-bf16.digests.json       transformers 5.25: AutoModelForCausalLM.from_pretrained(dir/model,
  expected-f16.digests.json        gguf_file='model.gguf', dtype=...), quantizer removed,
                                   save_pretrained; {name: {dtype, shape, sha256 of the raw LE bytes}}
                                   read from the saved safetensors.
  expected-meta/                   every non-weight file of the bf16 save (config, generation config,
                                   tokenizer files, chat template).
  expected-gguf-f32.digests.json   gguf-py dequantize -> f32 under GGUF names, row-major (dims reversed).
  encodings.json                   {text: ids} of the saved tokenizer, add_special_tokens=True.
  logits.json                      logits (f32 compute) of the bf16 save loaded in float32, token ids 1..16.
  checks.json                      types per tensor, producer versions, loading info, verification.

Run (needs transformers 5.25, torch, gguf==0.19.0, numpy, safetensors):

    /tmp/tfenv/bin/python tests/gguf/make_hf.py            # all cases
    /tmp/tfenv/bin/python tests/gguf/make_hf.py llama phi3 # some cases (hf-names.json keeps the others)
    PYTHONPATH=/path/to/llama.cpp/gguf-py /tmp/tfenv/bin/python tests/gguf/make_hf.py bonsai
"""

import hashlib
import io
import json
import logging
import re
import shutil
import struct
import sys
import tempfile
from contextlib import redirect_stderr
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

HERE = Path(__file__).resolve().parent
FIXTURE_TOKENIZER = Path("/work/shared/fixtures/gguf-q4_k-llama/model/model.gguf")
SEED = 20250
LOGIT_IDS = [list(range(1, 17))]
TEXTS = [
    "",
    "Hello world",
    "the quick brown fox jumps over the lazy dog.",
    " leading space",
    "   three leading spaces",
    "multiple   spaces\tand\ttabs\n\nnewlines\n",
    "trailing spaces   ",
    "Unicode: café naïve façade Ünïcödé",
    "CJK: 日本語のテキスト 中文 한국어",
    "emoji: 😀👍🏽 🇺🇳",
    "<|im_start|>user\nhi there<|im_end|>",
    "<|endoftext|>text after<|endoftext|>",
    "<start_of_turn>user\nhi there<end_of_turn>\n<start_of_turn>model\n",
    "<s>hi</s> <unk>",
    "<bos>hello<eos>",
    "digits 12345 67.89",
]

# ---------------------------------------------------------------- random tensors

# f16 scale fields (byte offset, typical magnitude) per block type, for the random-block types.
SCALE_FIELDS = {
    T.Q2_K: [(80, 5e-3), (82, 7e-3)],
    T.Q3_K: [(108, 1.2e-3)],
    T.Q4_K: [(0, 2e-4), (2, 1.4e-3)],
    T.Q5_K: [(0, 1e-4), (2, 1.5e-3)],
    T.Q6_K: [(208, 4e-5)],
}
# Bonsai's Q1_0 and Q2_0 (ggml types 41, 42; only llama.cpp's gguf-py has Q2_0 and dequantizes them):
# random signs and codes, f16 d in front.
if "Q2_0" in T.__members__:
    SCALE_FIELDS |= {T.Q1_0: [(0, 2e-2)], T.Q2_0: [(0, 2e-2)]}


def rows_f32(rng, shape, std=0.05):
    return rng.normal(0.0, std, shape).astype(np.float32)


def make_quant(rng, shape, qtype):
    """(raw array as GGUFWriter takes it, how it was made)."""
    if qtype == T.F32:
        return rows_f32(rng, shape), "random f32"
    if qtype == T.F16:
        return rows_f32(rng, shape).astype(np.float16), "random f16"
    if qtype in SCALE_FIELDS:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        n = int(np.prod(shape)) // block
        blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
        for at, mag in SCALE_FIELDS[qtype]:
            v = (mag * rng.uniform(0.5, 1.5, n)).astype(np.float16)
            v[rng.integers(0, 25, n) == 0] = 0  # a few zero scales
            blocks[:, at:at + 2] = v.view(np.uint8).reshape(n, 2)
        return blocks.reshape(*shape[:-1], shape[-1] // block * size), "random block bytes (no gguf-py quantizer)"
    return gguf.quants.quantize(rows_f32(rng, shape), qtype), "gguf.quants.quantize(random f32)"


# ---------------------------------------------------------------- tokenizers

def gpt2_tokenizer_kv():
    """The tokenizer.* keys of the public llama fixture (byte-level BPE, 320 tokens)."""
    r = gguf.GGUFReader(str(FIXTURE_TOKENIZER))
    kv = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer."):
            kv[k] = (f.contents(), f.types)
    return kv


WORDS = ("the quick brown fox jumps over lazy dog hello world hi there user model text after leading space "
         "three spaces multiple and tabs newlines trailing unicode cafe digits a an in on of to is it be this "
         "that with for as at by from are was were you he she they we our your their not but or if then so "
         "do does did have has had can will would should could may might must say said make made go went "
         "time year people way day man thing woman life child work part place case point number group "
         "problem fact good new first last long great little own other old right big high different small "
         "large next early young important few public bad same able").split()


def spm_pieces(n_pieces):
    """Word pieces, each reachable by merging two shorter pieces; best (earliest) first."""
    chars = sorted(set("".join(WORDS)) | set("0123456789.,:!?'-"))
    pieces = ["\u2581"] + chars + ["\u2581" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    seen = set(pieces)
    for w in WORDS:
        for word in ("\u2581" + w, w):
            for end in range(2, len(word) + 1):
                p = word[:end]
                if p not in seen:
                    seen.add(p)
                    pieces.append(p)
    pieces = pieces[:n_pieces]
    assert len(pieces) == n_pieces, len(pieces)
    return pieces


def spm_tokenizer_kv(style, vocab):
    """SentencePiece-style metadata (tokenizer.ggml.model "llama")."""
    S = gguf.GGUFValueType
    if style == "gemma":
        head = [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 2), ("<mask>", 4),
                ("<start_of_turn>", 3), ("<end_of_turn>", 3)]
        ids = dict(bos=2, eos=1, unk=3, pad=0)
        # all-space tokens, stored as spaces like gemma's GGUFs; transformers respells them as ▁
        extra = [("  ", 1), ("   ", 1), ("\n", 1), ("\n\n", 1)]
        template = ("{{ bos_token }}{% for message in messages %}<start_of_turn>{{ 'model' if message['role'] == "
                    "'assistant' else message['role'] }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
                    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
        add_space_prefix = False
    else:
        head = [("<unk>", 2), ("<s>", 3), ("</s>", 3)]
        ids = dict(bos=1, eos=2, unk=0)
        extra = []
        template = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}[INST] "
                    "{{ message['content'] }} [/INST]{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}"
                    "{% endfor %}")
        add_space_prefix = True
    tokens, types, scores = [], [], []
    for t, ty in head:
        tokens.append(t); types.append(ty); scores.append(0.0)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>"); types.append(6); scores.append(0.0)
    for t, ty in extra:
        tokens.append(t); types.append(ty); scores.append(-1.0)
    pieces = spm_pieces(vocab - len(tokens))
    for i, p in enumerate(pieces):
        tokens.append(p); types.append(1); scores.append(-float(i + 2))
    kv = {
        "tokenizer.ggml.model": ("llama", [S.STRING]),
        "tokenizer.ggml.tokens": (tokens, [S.ARRAY, S.STRING]),
        "tokenizer.ggml.scores": (scores, [S.ARRAY, S.FLOAT32]),
        "tokenizer.ggml.token_type": (types, [S.ARRAY, S.INT32]),
        "tokenizer.ggml.bos_token_id": (ids["bos"], [S.UINT32]),
        "tokenizer.ggml.eos_token_id": (ids["eos"], [S.UINT32]),
        "tokenizer.ggml.unknown_token_id": (ids["unk"], [S.UINT32]),
        "tokenizer.ggml.add_bos_token": (True, [S.BOOL]),
        "tokenizer.ggml.add_eos_token": (False, [S.BOOL]),
        "tokenizer.ggml.add_space_prefix": (add_space_prefix, [S.BOOL]),
        "tokenizer.chat_template": (template, [S.STRING]),
    }
    if "pad" in ids:
        kv["tokenizer.ggml.padding_token_id"] = (ids["pad"], [S.UINT32])
    assert len(tokens) == vocab
    return kv


def add_kv(w, key, value, types):
    S = gguf.GGUFValueType
    if types[0] == S.ARRAY:
        w.add_key_value(key, list(value), S.ARRAY, sub_type=types[1])
    else:
        w.add_key_value(key, value, types[0])


# ---------------------------------------------------------------- cases

# Hyperparameters, and which tensors each block has with (row-major shape, type).
# "hf" names the transformers dtype expectations; "tok" the tokenizer metadata.
CASES = {
    "llama": dict(arch="llama", layers=2, hidden=256, ffn=512, heads=4, kv=2, head_dim=64, vocab=320, tied=False,
                  tok="gpt2", rope_freqs=True),
    "llama-spm": dict(arch="llama", layers=2, hidden=256, ffn=256, heads=4, kv=2, head_dim=64, vocab=512, tied=True,
                      tok="llama"),
    "qwen3": dict(arch="qwen3", layers=2, hidden=256, ffn=256, heads=2, kv=1, head_dim=128, vocab=320, tied=True,
                  tok="gpt2"),
    "qwen3moe": dict(arch="qwen3moe", layers=1, hidden=256, ffn=256, heads=4, kv=2, head_dim=64, vocab=320,
                     tied=False, tok="gpt2", experts=4, experts_used=2, expert_ffn=768),
    "qwen2moe": dict(arch="qwen2moe", layers=1, hidden=256, ffn=256, heads=4, kv=2, head_dim=64, vocab=320,
                     tied=False, tok="gpt2", experts=2, experts_used=1, expert_ffn=1408, shared_ffn=5632),
    "phi3": dict(arch="phi3", layers=2, hidden=256, ffn=256, heads=4, kv=2, head_dim=64, vocab=320, tied=False,
                 tok="gpt2"),
    "gemma2": dict(arch="gemma2", layers=2, hidden=256, ffn=256, heads=4, kv=2, head_dim=64, vocab=512, tied=True,
                   tok="gemma"),
    "gemma3": dict(arch="gemma3", layers=2, hidden=256, ffn=256, heads=4, kv=2, head_dim=64, vocab=512, tied=True,
                   tok="gemma"),
    "starcoder2": dict(arch="starcoder2", layers=1, hidden=256, ffn=512, heads=4, kv=2, head_dim=64, vocab=320,
                       tied=True, tok="gpt2"),
    "stablelm": dict(arch="stablelm", layers=1, hidden=256, ffn=512, heads=4, kv=2, head_dim=64, vocab=320,
                     tied=False, tok="gpt2"),
    "falcon": dict(arch="falcon", layers=1, hidden=256, ffn=1024, heads=4, kv=1, head_dim=64, vocab=320,
                   tied=False, tok="gpt2"),
    "nemotron": dict(arch="nemotron", layers=1, hidden=256, ffn=512, heads=4, kv=2, head_dim=64, vocab=512,
                     tied=False, tok="llama"),
    # PrismML's Bonsai (a qwen3): Q1_0 (1-bit) weights and embeddings, Q2_0 (ternary) down projections.
    # Needs llama.cpp's gguf-py first on PYTHONPATH.
    "bonsai": dict(arch="qwen3", layers=2, hidden=256, ffn=384, heads=2, kv=1, head_dim=128, vocab=320, tied=True,
                   tok="gpt2", bonsai=True),
}

# Where each architecture's tensors go in transformers (gguf-py's TensorNameMap restricted to the model's
# state_dict): the layer prefix, the tensors outside the layers, and a layer's.
LLAMA_LAYER = {"attn_norm": "input_layernorm", "attn_output": "self_attn.o_proj",
               "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
               "attn_v": "self_attn.v_proj", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
               "ffn_gate_inp": "mlp.gate", "ffn_norm": "post_attention_layernorm"}
MODEL_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYOUT = {
    "starcoder2": ("model.layers.{}.", MODEL_TOP, dict(LLAMA_LAYER, ffn_up="mlp.c_fc", ffn_down="mlp.c_proj")),
    "falcon": ("transformer.h.{}.",
               {"token_embd": "transformer.word_embeddings", "output_norm": "transformer.ln_f", "output": "lm_head"},
               {"attn_norm": "input_layernorm", "attn_qkv": "self_attention.query_key_value",
                "attn_output": "self_attention.dense", "ffn_up": "mlp.dense_h_to_4h",
                "ffn_down": "mlp.dense_4h_to_h"}),
}

# What was found running transformers 5.25 on these files (also written into each checks.json as "notes";
# the loading logs, config and verification in checks.json are measured on every run).
COMMON_NOTES = [
    "legacy loader (these architectures are not in integrations/gguf GGUF_ARCHS): every tensor goes through "
    "gguf-py dequantize to f32, the arch's TensorProcessor, then torch .to(dtype); the warning 'weights packed "
    "is fastest in float32' is printed anyway and does not apply",
    "every saved tensor is in the requested dtype (F32 norms, biases and the MoE router included)",
    "save_pretrained refuses a gguf-quantized model; model.hf_quantizer.remove_quantization_config(model) "
    "then save_pretrained works",
    "no output.weight -> tie_word_embeddings true and no lm_head.weight saved",
    "general.name -> config _model_name_or_path, with the architecture string replaced by transformers' "
    "model_type inside it (tiny-qwen3moe -> tiny-qwen3_moe)",
    "f32 metadata floats are widened to f64 in config.json (1e-6 -> 9.999999974752427e-07)",
    "tokenizer.ggml.{bos,eos,unknown,padding}_token_id -> config {bos,eos,unk,pad}_token_id",
]
NOTES = {
    "llama": ["attn_q/attn_k rows reverse-permuted: w.reshape(n, rows/n/2, 2, cols).swapaxes(1,2), n = head_count "
              "for q, head_count_kv for k", "rope_freqs.weight is dropped (not in LlamaForCausalLM's "
              "state_dict; no rope scaling is read from the file either)",
              "head_dim from llama.rope.dimension_count; vocab_size from llama.vocab_size"],
    "llama-spm": ["same tensor rules as llama", "tokenizer.chat_template is saved as chat_template.jinja",
                  "tokenizer.ggml.add_space_prefix is read (add_prefix_space) but has no effect: true and false give the "
                  "same ids for every text in TEXTS (checked by hand); U+2581 is prepended to the first fragment only, "
                  "not when the text starts with a space"],
    "qwen3": ["no permute", "attention.key_length is NOT read: head_dim is Qwen3Config's default 128 (the file's 128 matches)"],
    "qwen3moe": ["head_dim IS read from qwen3moe.attention.key_length", "expert_feed_forward_length is not read: "
                 "moe_intermediate_size stays Qwen3MoeConfig's 768, the experts' width here", "expert_count -> "
                 "config num_local_experts (Qwen3MoeConfig's name), expert_used_count -> num_experts_per_tok",
                 "norm_topk_prob forced true (GGUF_CONFIG_DEFAULTS_MAPPING)", "ffn_{gate,up,down}_exps [E,rows,cols] "
                 "saved per expert as model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight = stacked[E]",
                 "ffn_gate_inp -> mlp.gate.weight",
                 "the info log lists every qwen3moe.* key as 'not considered' (it looks them up under the renamed "
                 "prefix qwen3_moe.*), yet they are read: see config.json"],
    "qwen2moe": ["expert_feed_forward_length and expert_shared_feed_forward_length are not read: "
                 "moe_intermediate_size 1408 and shared_expert_intermediate_size 5632 are Qwen2MoeConfig's defaults, "
                 "so the file's experts must be exactly that wide", "expert_count -> num_experts",
                 "ffn_gate_inp_shexp (1-D [hidden] in GGUF) -> mlp.shared_expert_gate.weight reshaped to [1, hidden]",
                 "ffn_{gate,up,down}_shexp -> mlp.shared_expert.{gate,up,down}_proj", "q/k/v biases are required "
                 "(qkv_bias true by default)", "experts saved per expert like qwen3moe",
                 "1408 columns fit no 256-wide block: ffn_down_exps is Q4_0",
                 "the info log lists every qwen2moe.* key as 'not considered' (looked up as qwen2_moe.*), yet they "
                 "are read: see config.json"],
    "phi3": ["attn_qkv -> self_attn.qkv_proj, ffn_up (gate rows then up rows) -> mlp.gate_up_proj, unchanged",
             "Phi3Config's default pad_token_id is 32000: a file without tokenizer.ggml.padding_token_id and a vocab "
             "<= 32000 fails to load (nn.Embedding: 'Padding_idx must be within num_embeddings'); this file has one",
             "phi3.sliding_window and rope.dimension_count are not read; original_max_position_embeddings is the "
             "default 4096"],
    "gemma2": ["every *norm.weight (incl. output_norm) is stored w+1; transformers subtracts 1 in f32 then casts",
               "ffn_norm -> pre_feedforward_layernorm, post_attention_norm -> post_attention_layernorm, "
               "post_ffw_norm -> post_feedforward_layernorm, attn_norm -> input_layernorm",
               "head_dim from attention.key_length, sliding_window read; attn/final_logit_softcapping and "
               "query_pre_attn_scalar are NOT read (Gemma2Config defaults 50.0/30.0/256)",
               "SentencePiece: all-space tokens respelled as U+2581 runs, merges rebuilt by file position"],
    "starcoder2": ["LayerNorm weights and biases, biases on q/k/v/o and on mlp.c_fc (ffn_up) / mlp.c_proj (ffn_down)",
                   "only the common keys and attention.layer_norm_epsilon (-> norm_epsilon) are read: no rope.freq_base "
                   "(rope_theta stays 10000), no vocab_size key (vocab_size from the token count)",
                   "tokenizer: GPT2Tokenizer (tokenizer_config gets add_prefix_space false, errors replace)"],
    "stablelm": ["use_qkv_bias = any attn_{q,k,v}.bias tensor; use_parallel_residual = no ffn_norm tensor (here: "
                 "qkv biases, ffn_norm present -> true, false)", "LayerNorm weights and biases",
                 "rope.dimension_count and rope.freq_base are not read: partial_rotary_factor 0.25, rope_theta 10000; "
                 "attention.layer_norm_epsilon -> layer_norm_eps"],
    "falcon": ["tie_word_embeddings is forced true (falcon is in the loader's exceptions), output.weight or not",
               "names under transformer.*: word_embeddings, h.N.input_layernorm, self_attention.query_key_value "
               "(attn_qkv unchanged), self_attention.dense, mlp.dense_h_to_4h/dense_4h_to_h, ln_f",
               "FalconConfig derives num_kv_heads = num_attention_heads, num_key_value_heads = 1 (multi_query, not "
               "new_decoder_architecture: the file's head_count_kv is overwritten) and ffn_hidden_size = 4 * hidden; "
               "intermediate_size is kept as an extra field", "attention.layer_norm_epsilon is not read",
               "a file with head_count_kv 2 (Falcon-40B's layout) fails to load: query_key_value [512, 256] vs the "
               "model's [384, 256], RuntimeError (ignore_mismatched_sizes False); checked by hand",
               "saved: lm_head.weight (from output.weight) besides word_embeddings although tie_word_embeddings is "
               "true; reloading warns and does not tie them"],
    "nemotron": ["every *norm.weight (not the biases) stored w+1 (layernorm1p): transformers subtracts 1 in f32",
                 "LayerNorm weights and biases; mlp up_proj/down_proj only", "head_dim = hidden / heads (derived); "
                 "attention.layer_norm_epsilon not read (norm_eps reads layer_norm_rms_epsilon)",
                 "tokenizer: SentencePiece, TokenizersBackend"],
    "gemma3": ["as gemma2, plus attn_q_norm/attn_k_norm -> self_attn.q_norm/k_norm, also w+1 -> minus 1",
               "config model_type gemma3_text, architectures Gemma3ForCausalLM",
               "rope.freq_base -> rope_parameters.full_attention.rope_theta only; sliding_attention keeps 10000",
               "layer_types from the default pattern 6 (here both layers sliding_attention); "
               "final_logit_softcapping null"],
}


def case_tensors(c):
    """[(gguf name, row-major shape, type, kind)] where kind is 'norm', 'bias', 'w'."""
    H, F, V = c["hidden"], c["ffn"], c["vocab"]
    q, kv = c["heads"] * c["head_dim"], c["kv"] * c["head_dim"]
    arch = c["arch"]
    out = [("token_embd.weight", (V, H), T.Q6_K, "w")]
    if c.get("rope_freqs"):
        out.append(("rope_freqs.weight", (c["head_dim"] // 2,), T.F32, "freqs"))
    layer_norm = arch in ("starcoder2", "stablelm", "falcon", "nemotron")  # LayerNorm: a bias too
    for i in range(c["layers"]):
        b = f"blk.{i}."
        out.append((b + "attn_norm.weight", (H,), T.F32, "norm"))
        if layer_norm:
            out.append((b + "attn_norm.bias", (H,), T.F32, "bias"))
        if arch == "falcon":
            out += [(b + "attn_qkv.weight", (q + 2 * kv, H), T.Q4_K, "w"),
                    (b + "attn_output.weight", (H, q), T.Q5_K, "w"),
                    (b + "ffn_up.weight", (F, H), T.Q4_K, "w"), (b + "ffn_down.weight", (H, F), T.Q6_K, "w")]
            continue
        if arch == "phi3":
            out.append((b + "attn_qkv.weight", (q + 2 * kv, H), T.Q4_K, "w"))
        else:
            qt = T.F16 if (c is CASES["llama"] and i == 0) else T.Q4_K
            kt = T.F16 if (c is CASES["llama"] and i == 1) else T.Q4_K
            if c is CASES["llama-spm"] and i == 1:
                qt = kt = T.Q8_0
            out += [(b + "attn_q.weight", (q, H), qt, "w"), (b + "attn_k.weight", (kv, H), kt, "w"),
                    (b + "attn_v.weight", (kv, H), T.Q6_K, "w")]
            if arch in ("qwen2moe", "starcoder2", "stablelm"):
                out += [(b + "attn_q.bias", (q,), T.F32, "bias"), (b + "attn_k.bias", (kv,), T.F32, "bias"),
                        (b + "attn_v.bias", (kv,), T.F32, "bias")]
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            out += [(b + "attn_q_norm.weight", (c["head_dim"],), T.F32, "norm"),
                    (b + "attn_k_norm.weight", (c["head_dim"],), T.F32, "norm")]
        out.append((b + "attn_output.weight", (H, q), T.Q8_0 if arch == "qwen3" else T.Q4_K, "w"))
        if arch == "starcoder2":
            out.append((b + "attn_output.bias", (H,), T.F32, "bias"))
        if arch in ("gemma2", "gemma3"):
            out.append((b + "post_attention_norm.weight", (H,), T.F32, "norm"))
        out.append((b + "ffn_norm.weight", (H,), T.F32, "norm"))
        if layer_norm:
            out.append((b + "ffn_norm.bias", (H,), T.F32, "bias"))
        if arch in ("gemma2", "gemma3"):
            out.append((b + "post_ffw_norm.weight", (H,), T.F32, "norm"))
        if arch == "phi3":
            out += [(b + "ffn_up.weight", (2 * F, H), T.Q4_K, "w"), (b + "ffn_down.weight", (H, F), T.Q6_K, "w")]
        elif arch == "qwen3moe":
            E, EF = c["experts"], c["expert_ffn"]
            out += [(b + "ffn_gate_inp.weight", (E, H), T.F32, "w"),
                    (b + "ffn_gate_exps.weight", (E, EF, H), T.Q2_K, "w"),
                    (b + "ffn_up_exps.weight", (E, EF, H), T.Q2_K, "w"),
                    (b + "ffn_down_exps.weight", (E, H, EF), T.Q3_K, "w")]
        elif arch == "qwen2moe":
            E, EF, SF = c["experts"], c["expert_ffn"], c["shared_ffn"]
            out += [(b + "ffn_gate_inp.weight", (E, H), T.F32, "w"),
                    (b + "ffn_gate_exps.weight", (E, EF, H), T.TQ1_0, "w"),
                    (b + "ffn_up_exps.weight", (E, EF, H), T.TQ2_0, "w"),
                    # 1408 columns: no 256-wide block fits, so a 32-wide type
                    (b + "ffn_down_exps.weight", (E, H, EF), T.Q4_0, "w"),
                    (b + "ffn_gate_inp_shexp.weight", (H,), T.F32, "w1d"),
                    (b + "ffn_gate_shexp.weight", (SF, H), T.TQ1_0, "w"),
                    (b + "ffn_up_shexp.weight", (SF, H), T.TQ1_0, "w"),
                    (b + "ffn_down_shexp.weight", (H, SF), T.TQ1_0, "w")]
        elif arch in ("starcoder2", "nemotron"):
            out += [(b + "ffn_up.weight", (F, H), T.Q5_K, "w"), (b + "ffn_down.weight", (H, F), T.Q6_K, "w")]
            if arch == "starcoder2":
                out += [(b + "ffn_up.bias", (F,), T.F32, "bias"), (b + "ffn_down.bias", (H,), T.F32, "bias")]
        else:
            gt = T.Q8_0 if (c is CASES["llama"] and i == 1) else T.Q4_K
            out += [(b + "ffn_gate.weight", (F, H), gt, "w"), (b + "ffn_up.weight", (F, H), T.Q4_K, "w"),
                    (b + "ffn_down.weight", (H, F), T.Q6_K, "w")]
    out.append(("output_norm.weight", (H,), T.F32, "norm"))
    if layer_norm:
        out.append(("output_norm.bias", (H,), T.F32, "bias"))
    if not c["tied"]:
        out.append(("output.weight", (V, H), T.Q6_K, "w"))
    if c.get("bonsai"):
        out = [(n, s, (T.Q2_0 if "ffn_down" in n else T.Q1_0) if k == "w" else t, k) for n, s, t, k in out]
    return out


def write_hparams(w, name, c):
    a = c["arch"]
    w.add_name(f"tiny-{name}")
    w.add_context_length(512)
    w.add_embedding_length(c["hidden"])
    w.add_block_count(c["layers"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv"])
    # gemma3 files state the global layers' base (1e6); llama.cpp hardcodes 10000 for the sliding ones
    if a not in ("stablelm", "falcon"):
        w.add_rope_freq_base(10000.0 if a in ("llama", "phi3", "gemma2") else 1000000.0)
    if a in ("starcoder2", "stablelm", "falcon", "nemotron"):
        # LayerNorm models: llama.cpp writes layer_norm_epsilon
        w.add_layer_norm_eps(1e-5 if a != "nemotron" else 1e-6)
    else:
        w.add_layer_norm_rms_eps(1e-6 if a in ("gemma2", "gemma3", "qwen3", "qwen3moe", "qwen2moe") else 1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    if a == "stablelm":
        w.add_rope_dimension_count(c["head_dim"] // 4)
        w.add_parallel_residual(False)
    if a == "nemotron":
        w.add_rope_dimension_count(c["head_dim"] // 2)
        w.add_vocab_size(c["vocab"])
    if a in ("llama", "phi3"):
        w.add_rope_dimension_count(c["head_dim"])
    if a == "llama":
        w.add_vocab_size(c["vocab"])
    if a in ("qwen3", "qwen3moe", "gemma2", "gemma3"):
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
    if a in ("qwen3moe", "qwen2moe"):
        w.add_expert_count(c["experts"])
        w.add_expert_used_count(c["experts_used"])
        w.add_expert_feed_forward_length(c["expert_ffn"])
    if a == "qwen2moe":
        w.add_expert_shared_feed_forward_length(c["shared_ffn"])
    if a == "phi3":
        w.add_sliding_window(512)
    if a == "gemma2":
        w.add_attn_logit_softcapping(50.0)
        w.add_final_logit_softcapping(30.0)
        w.add_sliding_window(128)
    if a == "gemma3":
        w.add_sliding_window(128)


def build_gguf(name, c, rng, path):
    w = gguf.GGUFWriter(str(path), c["arch"])
    write_hparams(w, name, c)
    tok = gpt2_tokenizer_kv() if c["tok"] == "gpt2" else spm_tokenizer_kv(c["tok"], c["vocab"])
    if name == "phi3":
        # Phi3Config's default pad_token_id is 32000: without an id in the file, nn.Embedding refuses a
        # 320-token vocabulary (see checks.json). convert_hf_to_gguf writes it from Phi-3's tokenizer.
        tok["tokenizer.ggml.padding_token_id"] = (317, [gguf.GGUFValueType.UINT32])
    for k, (v, ty) in tok.items():
        add_kv(w, k, v, ty)
    types, how, ref = {}, {}, {}
    for tname, shape, qtype, kind in case_tensors(c):
        if kind == "norm":
            base = 1.0  # gemma stores w+1: w around 0 -> stored around 1 as well
            data, made = (base + rng.normal(0, 0.1, shape)).astype(np.float32), "random f32 around 1"
        elif kind == "freqs":
            data, made = np.linspace(1.0, 8.0, shape[0]).astype(np.float32), "f32 ramp 1..8"
        elif kind in ("bias", "w1d"):
            data, made = rows_f32(rng, shape, 0.1), "random f32"
        else:
            data, made = make_quant(rng, shape, qtype)
        w.add_tensor(tname, data, raw_dtype=qtype)
        types[tname], how[tname] = qtype.name, made
        deq = gguf.quants.dequantize(data, qtype).astype(np.float32)
        ref[tname] = deq.reshape(shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return types, how, ref


# ---------------------------------------------------------------- transformers side

def bf16_bits(x):
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def round_to(x, dtype):
    return bf16_bits(x) if dtype == "bf16" else x.astype(np.float16)


def safetensors_raw(folder):
    """{name: (dtype, shape, raw bytes)} from every *.safetensors in folder."""
    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        buf = f.read_bytes()
        n = struct.unpack("<Q", buf[:8])[0]
        header = json.loads(buf[8:8 + n])
        base = 8 + n
        for k, v in header.items():
            if k == "__metadata__":
                continue
            s, e = v["data_offsets"]
            out[k] = (v["dtype"], v["shape"], buf[base + s:base + e])
    return out


def digest_map(raw):
    return {k: {"dtype": d, "shape": list(s), "sha256": hashlib.sha256(b).hexdigest()}
            for k, (d, s, b) in sorted(raw.items())}


class LogCapture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def load_and_save(model_dir, dtype_name, out_dir):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype_name]
    cap = LogCapture()
    tlog = transformers.utils.logging.get_logger("transformers")
    tlog.addHandler(cap)
    old = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_info()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(model_dir), gguf_file="model.gguf", dtype=dtype, output_loading_info=True)
    finally:
        tlog.removeHandler(cap)
        transformers.utils.logging.set_verbosity(old)
    note = None
    try:
        model.save_pretrained(str(out_dir))
    except Exception as e:  # 5.25 refuses a gguf-quantized model
        note = f"save_pretrained refused ({str(e)[:100]}); hf_quantizer.remove_quantization_config then save"
        model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(str(out_dir))
    params = {n: str(p.dtype) for n, p in model.state_dict().items()}
    info = {k: sorted(map(str, v)) if isinstance(v, (set, list)) else str(v) for k, v in info.items()}
    logs = [l for l in cap.lines if any(w in l.lower() for w in (
        "gguf", "missing", "not considered", "not parsed", "unexpected", "newly initialized", "tied"))]
    return model, info, note, params, logs


def hf_expected(arch, c, ref):
    """{hf name: (f32 array, gguf source name)} by the mapping rules."""
    out = {}
    pre = "model.layers.{}."

    def put(hf, g, arr=None):
        out[hf] = (ref[g] if arr is None else arr, g)

    pre, top, layer = LAYOUT.get(arch, (pre, MODEL_TOP, None))
    for g, h in top.items():
        for suf in (".weight", ".bias"):
            if g + suf in ref:
                put(h + suf, g + suf)
    gemma = arch in ("gemma2", "gemma3")
    plus_one = gemma or arch == "nemotron"
    for i in range(c["layers"]):
        p, b = pre.format(i), f"blk.{i}."
        if layer is not None:
            for g, h in layer.items():
                for suf in (".weight", ".bias"):
                    if b + g + suf in ref:
                        put(p + h + suf, b + g + suf)
            continue
        simple = {"attn_norm": "input_layernorm", "attn_output": "self_attn.o_proj",
                  "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
                  "attn_v": "self_attn.v_proj", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                  "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
                  "ffn_gate_inp": "mlp.gate"}
        if gemma:
            simple.update({"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                           "post_ffw_norm": "post_feedforward_layernorm"})
        else:
            simple["ffn_norm"] = "post_attention_layernorm"
        if arch == "phi3":
            simple.update({"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"})
        if arch == "qwen2moe":
            simple.update({"ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
                           "ffn_down_shexp": "mlp.shared_expert.down_proj"})
        for g, h in simple.items():
            for suf in (".weight", ".bias"):
                if b + g + suf in ref:
                    put(p + h + suf, b + g + suf)
        if arch == "llama":
            for g, n in (("attn_q", c["heads"]), ("attn_k", c["kv"])):
                wt = ref[b + g + ".weight"]
                r = wt.reshape(n, wt.shape[0] // n // 2, 2, wt.shape[1]).swapaxes(1, 2).reshape(wt.shape)
                put(p + "self_attn." + g[-1] + "_proj.weight", b + g + ".weight", r)
        if arch == "qwen2moe":
            put(p + "mlp.shared_expert_gate.weight", b + "ffn_gate_inp_shexp.weight",
                ref[b + "ffn_gate_inp_shexp.weight"][None, :])
        if arch in ("qwen3moe", "qwen2moe"):
            for w in ("gate", "up", "down"):
                g = b + f"ffn_{w}_exps.weight"
                for e in range(c["experts"]):
                    put(p + f"mlp.experts.{e}.{w}_proj.weight", g, ref[g][e])
        if plus_one:
            for hf, (arr, g) in list(out.items()):
                if hf.startswith(p) and g.endswith("norm.weight"):
                    out[hf] = (arr - np.float32(1), g)
    if plus_one:
        out["model.norm.weight"] = (ref["output_norm.weight"] - np.float32(1), "output_norm.weight")
    return out


def probe_phi3_without_pad():
    """Load the phi3 case's shape with no tokenizer.ggml.padding_token_id; return what happened."""
    from transformers import AutoModelForCausalLM
    with tempfile.TemporaryDirectory() as tmp:
        build_gguf("phi3-nopad", CASES["phi3"], np.random.default_rng(0), Path(tmp) / "model.gguf")
        try:
            with redirect_stderr(io.StringIO()):
                AutoModelForCausalLM.from_pretrained(tmp, gguf_file="model.gguf")
            return "loaded"
        except Exception as e:
            return f"{type(e).__name__}: {e}"


def name_pattern(n):
    n = re.sub(r"^blk\.\d+\.", "blk.N.", n)
    n = re.sub(r"layers\.\d+\.", "layers.N.", n)
    n = re.sub(r"^transformer\.h\.\d+\.", "transformer.h.N.", n)
    return re.sub(r"experts\.\d+\.", "experts.E.", n)


def run_case(name, c, rng, vers):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = HERE / f"hf-{name}"
    if d.exists():
        shutil.rmtree(d)
    (d / "model").mkdir(parents=True)
    gpath = d / "model" / "model.gguf"
    types, how, ref = build_gguf(name, c, rng, gpath)
    checks = {"case": "hf", "arch": c["arch"], "layers": c["layers"], "hyperparameters": c,
              "types": types, "made": sorted(set(how.values())), "gguf_file": "model.gguf",
              "gguf_bytes": gpath.stat().st_size, "producers": vers}
    gguf_dig = {}
    for n, v in sorted(ref.items()):
        gguf_dig[n] = {"dtype": "F32", "shape": list(v.shape), "sha256": hashlib.sha256(v.tobytes()).hexdigest()}
    (d / "expected-gguf-f32.digests.json").write_text(json.dumps(gguf_dig, indent=1) + "\n")

    expected = hf_expected(c["arch"], c, ref)
    names_table, surprises = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for dt in ("bf16", "f16"):
            out = Path(tmp) / dt
            with redirect_stderr(io.StringIO()):
                model, info, note, params, logs = load_and_save(d / "model", dt, out)
            raw = safetensors_raw(out)
            (d / f"expected-{dt}.digests.json").write_text(json.dumps(digest_map(raw), indent=1) + "\n")
            want_st = {"bf16": "BF16", "f16": "F16"}[dt]
            mism, missing_ref, extra = [], [], []
            for hf, (dtype, shape, b) in raw.items():
                if dtype != want_st:
                    surprises.append(f"{dt}: {hf} saved as {dtype}")
                if hf not in expected:
                    extra.append(hf)
                    continue
                arr, g = expected[hf]
                if list(arr.shape) != list(shape) or round_to(arr, dt).tobytes() != b:
                    mism.append(hf)
                names_table[name_pattern(g)] = name_pattern(hf)
            missing_ref = sorted(set(expected) - set(raw))
            res = {"save_note": note, "loading_info": info, "logs": logs,
                   "dtypes_in_memory": sorted(set(params.values())),
                   "equals_f32_reference_rounded": not mism and not extra and not missing_ref,
                   "mismatch": sorted(mism), "only_in_transformers": sorted(extra),
                   "expected_but_not_saved": missing_ref}
            if dt == "bf16":
                meta = d / "expected-meta"
                meta.mkdir()
                tok = AutoTokenizer.from_pretrained(str(d / "model"), gguf_file="model.gguf")
                tok.save_pretrained(str(out))
                for f in sorted(out.iterdir()):
                    if f.suffix != ".safetensors" and not f.name.endswith(".index.json"):
                        shutil.copy(f, meta / f.name)
                res["saved_files"] = sorted(f.name for f in out.iterdir())
                # reload the saved folder
                with redirect_stderr(io.StringIO()):
                    m2, info2 = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True,
                                                                     dtype=torch.float32)
                res["reload_loading_info"] = {k: sorted(map(str, v)) if isinstance(v, (set, list)) else str(v)
                                              for k, v in info2.items()}
                m2.eval()
                with torch.no_grad():
                    lg = m2(torch.tensor(LOGIT_IDS)).logits[0].float().numpy()
                (d / "logits.json").write_text(json.dumps({
                    "token_ids": LOGIT_IDS, "compute": "float32",
                    "weights": "expected-bf16 (transformers save_pretrained of the bf16 load) loaded with dtype=float32",
                    "max_abs": float(np.abs(lg).max()), "finite": bool(np.isfinite(lg).all()),
                    "logits": [[float(str(np.float32(x))) for x in row] for row in lg]}) + "\n")
                tok2 = AutoTokenizer.from_pretrained(str(out))
                enc = {t: tok2(t, add_special_tokens=True)["input_ids"] for t in TEXTS}
                enc_gguf = {t: tok(t, add_special_tokens=True)["input_ids"] for t in TEXTS}
                (d / "encodings.json").write_text(json.dumps(enc, indent=1, ensure_ascii=False) + "\n")
                res["encodings_saved_equal_gguf_loaded"] = enc == enc_gguf
                cfg = json.loads((out / "config.json").read_text())
                res["config_model_type"] = cfg.get("model_type")
                res["config_dtype"] = cfg.get("dtype")
            checks[f"expected_{dt}"] = res
            del model
    checks["dropped_gguf_tensors"] = sorted(set(ref) - {g for _, g in expected.values()})
    checks["notes"] = COMMON_NOTES + NOTES.get(name, [])
    if name == "phi3":
        checks["phi3_without_padding_token_id"] = probe_phi3_without_pad()
    if name == "bonsai":
        checks["notes"].append(take_qwen3_tokenizer_config(d))
    checks["surprises"] = surprises
    (d / "checks.json").write_text(json.dumps(checks, indent=1, default=str) + "\n")
    total = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    return names_table, checks, total


def take_qwen3_tokenizer_config(d):
    """bonsai's tokenizer is hf-qwen3's (the same metadata): where this environment's save differs from
    hf-qwen3's fixture in tokenizer_class alone (tokenizers' drift, not the weights'), hf-qwen3's file is
    kept, so that every qwen3 fixture names one class."""
    theirs = HERE / "hf-qwen3" / "expected-meta" / "tokenizer_config.json"
    ours = d / "expected-meta" / "tokenizer_config.json"
    a, b = json.loads(theirs.read_text()), json.loads(ours.read_text())
    diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    assert diff in ([], ["tokenizer_class"]), diff
    assert (HERE / "hf-qwen3" / "expected-meta" / "tokenizer.json").read_bytes() == \
        (d / "expected-meta" / "tokenizer.json").read_bytes()
    shutil.copy(theirs, ours)
    return f"tokenizer_config.json is hf-qwen3's (this save named tokenizer_class {b.get('tokenizer_class')!r}, " \
           f"hf-qwen3's {a.get('tokenizer_class')!r}; tokenizer.json is the same bytes)"


def main():
    import torch
    import transformers
    wanted = sys.argv[1:] or list(CASES)
    vers = {"gguf-py": getattr(gguf, "__version__", None) or _pkg_version("gguf"),
            "transformers": transformers.__version__, "torch": torch.__version__, "numpy": np.__version__,
            "accelerate": _pkg_version("accelerate")}
    if "Q2_0" in T.__members__:
        vers["gguf-py"] = f"{vers['gguf-py']}, Q1_0 and Q2_0 from {gguf.__file__}"
    names_path = HERE / "hf-names.json"
    table = json.loads(names_path.read_text()) if names_path.exists() else {}
    for name in wanted:
        c = CASES[name]
        rng = np.random.default_rng([SEED, list(CASES).index(name)])
        names, checks, total = run_case(name, c, rng, vers)
        entry = table.setdefault(c["arch"], {"names": {}, "dropped": []})
        entry["names"].update(dict(sorted(names.items())))
        entry["dropped"] = sorted(set(entry["dropped"]) | {name_pattern(n) for n in checks["dropped_gguf_tensors"]})
        ok = all(checks[f"expected_{dt}"]["equals_f32_reference_rounded"] for dt in ("bf16", "f16"))
        print(f"hf-{name}: gguf {checks['gguf_bytes']} B, folder {total} B, equal={ok}, "
              f"missing={checks['expected_bf16']['reload_loading_info'].get('missing_keys')}, "
              f"unexpected={checks['expected_bf16']['reload_loading_info'].get('unexpected_keys')}, "
              f"surprises={len(checks['surprises'])}")
    names_path.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")


def _pkg_version(p):
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(p)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()

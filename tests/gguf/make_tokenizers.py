"""Writes tests/gguf/tokenizers/<case>/: a tokenizer-only GGUF file
(`model.gguf`: the tokenizer metadata, the few architecture keys transformers
needs to make a config, and one tiny F32 tensor), what transformers makes of
its tokenizer (`AutoTokenizer.from_pretrained(dir, gguf_file=...)` then
`save_pretrained`: every file it writes, under `expected/`), and the ids it
encodes a fixed set of texts to, special tokens added, with what it decodes
them to (`ids.json`; the held-out texts are marked).

The in-memory tokenizer is the reference, not the saved files: a class with
its own `__init__` (GemmaTokenizer, Qwen2Tokenizer, GPT2Tokenizer) reloads
only the vocabulary and merges of tokenizer.json and rebuilds the rest its
own way, so for some files its reload encodes differently or fails (a
byte-level gemma3 file: "Unk token `None` not found"). Each case reloads the
saved files the way a user of the dense output does (beside the file's
config.json) and compares ids, decoded text and padding side with the
in-memory tokenizer; where they differ, `expected/tokenizer_config.json`
names TokenizersBackend (which takes tokenizer.json as it is) and keeps the
class's padding side, and that reload must then agree. Only a model type
for which transformers loads its own class whatever the file says
(`MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`: qwen2) may still differ: its
saved files stay, and `source.json` says on which texts the reload differs
(Qwen2Tokenizer's NFC; all of them for a SentencePiece vocabulary).

Cases: byte-level BPE (`tokenizer.ggml.model` "gpt2", the tokenizer of
tests/gguf/gguf-q4_k-llama) under each architecture that reads it, with the
pre-tokenizer names that pick a split regex; SentencePiece ("llama": scores,
token types, byte pieces, no merges) for llama (with a chat template) and phi3;
Gemma's SentencePiece for gemma2 and gemma3; starcoder2 (GPT2Tokenizer), stablelm,
falcon and nemotron; and every other pairing of a vocabulary kind with an
architecture's tokenizer class: byte-level BPE under gemma2, gemma3 (some
byte symbols missing from its vocabulary) and nemotron, GPT2Tokenizer with a
split regex, SentencePiece under qwen2, qwen3, qwen2moe, qwen3moe,
starcoder2, stablelm and falcon: each architecture with each vocabulary
kind. Needs transformers 5.25, torch, gguf-py (e.g. a venv at /work/venv):

    /work/venv/bin/python tests/gguf/make_tokenizers.py
"""

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import gguf
import transformers
from transformers import AutoConfig, AutoTokenizer, TokenizersBackend
from transformers.models.auto.tokenization_auto import MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS

HERE = Path(__file__).resolve().parent
OUT = HERE / "tokenizers"
FIXTURE = HERE / "gguf-q4_k-llama" / "model" / "model.gguf"

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

TEXTS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "    ",
    "a  b   c\t\td\n\ne\r\nf \n g",
    "\n\n\nnewlines\n",
    "tabs\there\t\t\tand\tthere",
    "héllo naïve café — déjà vu",
    "你好，世界！这是中文。",
    "emoji 😀🎉👍🏽 and ❤️",
    "don't I'LL we've 12345 3.14159 x=y+z",
    "<s>Hello</s> <unk>",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text<|endoftext|>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>x<eos> <pad><mask>",
    "<think>reasoning</think> answer",
    "the theory there then",
    "▁already▁metaspace ▁",
    "  ",
    " ",
]

# Not looked at while writing the converter: special tokens glued to text and
# to each other, characters and control bytes outside every vocabulary here,
# long runs of whitespace, text that is not in NFC.
HELD_OUT = [
    "a" + " " * 40 + "b",
    "\n" * 25 + "x" + "\r\n" * 6,
    "\t" * 9 + " \t " * 5 + "end",
    " " * 33,
    "    indented\n        code  \n\t\treturn",
    "cafe\u0301 n\u0303 A\u030a \u1e9b\u0323",
    "\u00df \u03c8 \U0001f980 \u2126 \u0436 \u2744 \U0001d518 \ufffd",
    "\x00\x01\x02\x7f\x1b[0m \x08",
    "<|im_end|><|im_start|>x<|endoftext|><|endoftext|>",
    "<s><s></s> <unk>x<unk>",
    "<bos><eos><pad><mask><unk> <start_of_turn><end_of_turn>",
    "<think>\n\n</think>\n\n",
    "text<|im_start|>  spaced  <|im_end|>  ",
    "\u2581\u2581\u2581 \u2581 \u2581\u2581",
    "<0x41><0x0A> [multimodal] <unused0>",
    "12345678 000 3.0e-12",
]

LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ ' ' + message['content'] + eos_token }}"
    "{% endif %}{% endfor %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n"
    "{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# Word pieces of the SentencePiece vocabularies, best first (scores fall).
PIECES = (
    "▁ e t a o n i s r h l d ▁t he ▁the in er ▁a an re on ▁s en ▁w at or ▁o it is ou ▁c ed es ing ▁b "
    "▁f ▁p ▁m ▁th ▁d ▁h ar ▁i le ▁to ▁and ▁of ▁in al ll ▁theory ▁there ▁then ▁there ▁Hello ▁world "
    "H W T q u c k b r o w f x j m p v y z g . , ' ! ? ▁q ▁qu ick ▁quick ▁bro wn ▁brown ▁fox ▁ju mp "
    "s ▁jumps ▁over ▁la zy ▁lazy ▁dog ▁dog. ▁lead ing ▁leading ▁space ▁spaces ▁three ▁tra il "
    "▁trail ▁trailing 1 2 3 4 5 12 123 ▁1 ▁12 é ï ▁h é llo ▁na ▁café ▁déjà ▁vu 你 好 你好 世 界 世界 "
    "中 文 中文 这 是 ！ ， 。 😀 🎉 ▁em oji ▁emoji ▁don 't ▁I 'LL ▁we 've ▁x = + tab tabs ▁here "
    "new lines newlines ▁rea son reason ▁answer ▁user ▁model ▁hi user model ▁▁ ▁▁▁▁ ▁▁▁"
).split(" ")


def fixture_tokenizer():
    """The byte-level BPE tokenizer metadata of the public llama fixture."""
    r = gguf.GGUFReader(str(FIXTURE))
    get = lambda k: r.fields[k].contents()  # noqa: E731
    return {
        "tokens": get("tokenizer.ggml.tokens"),
        "types": get("tokenizer.ggml.token_type"),
        "merges": get("tokenizer.ggml.merges"),
    }


def spm_vocab(specials, extra, gemma=False):
    """(tokens, scores, types): specials, byte pieces, word pieces."""
    tokens, scores, types = [], [], []
    for tok, ty in specials:
        tokens.append(tok)
        scores.append(0.0 if not gemma else -1000.0)
        types.append(ty)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(BYTE)
    seen = set(tokens)
    score = -1.0
    for p in PIECES + extra:
        if p in seen or not p:
            continue
        seen.add(p)
        tokens.append(p)
        # Mostly falling scores, a few out of file order (which gemma ignores).
        s = score + (5.0 if len(tokens) % 17 == 0 else 0.0)
        scores.append(s)
        types.append(NORMAL)
        score -= 1.0
    return tokens, scores, types


def arch_keys(w, arch, vocab):
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(vocab)
    if arch in ("qwen3moe", "qwen2moe"):
        w.add_expert_count(4)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(32)
    if arch in ("gemma2", "gemma3"):
        w.add_key_length(16)
        w.add_value_length(16)


def write_case(name, arch, tok):
    d = OUT / name
    shutil.rmtree(d, ignore_errors=True)
    (d / "expected").mkdir(parents=True)
    path = d / "model.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tok-{name}")
    arch_keys(w, arch, len(tok["tokens"]))
    w.add_tokenizer_model(tok["model"])
    if "pre" in tok:
        w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    if "scores" in tok:
        w.add_token_scores(tok["scores"])
    w.add_token_types(tok["types"])
    if "merges" in tok:
        w.add_token_merges(tok["merges"])
    for key, value in tok["ids"].items():
        w.add_uint32(f"tokenizer.ggml.{key}", value)
    for key, value in tok.get("flags", {}).items():
        w.add_bool(f"tokenizer.ggml.{key}", value)
    if "chat_template" in tok:
        w.add_chat_template(tok["chat_template"])
    w.add_tensor("token_embd.weight", np.zeros((2, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    t = AutoTokenizer.from_pretrained(str(d), gguf_file="model.gguf")
    t.save_pretrained(str(d / "expected"))
    ids = []
    for text in TEXTS + HELD_OUT:
        item = {"text": text, "ids": t(text, add_special_tokens=True)["input_ids"]}
        item["decoded"] = t.decode(item["ids"])
        if text in HELD_OUT:
            item["held_out"] = True
        ids.append(item)
    # One text a line: the file stays small and its diffs readable.
    lines = ",\n".join(json.dumps(item, ensure_ascii=False) for item in ids)
    (d / "ids.json").write_text(f"[\n{lines}\n]\n")
    info = {"architecture": arch, "class": type(t).__name__, "transformers": transformers.__version__}
    info.update(check_reload(d, t))
    (d / "source.json").write_text(json.dumps(info, indent=1) + "\n")
    size = path.stat().st_size
    assert size < 100_000, (name, size)
    print(name, type(t).__name__, len(tok["tokens"]), "tokens", size, "bytes")


def reloaded(d):
    """What a user of the dense output gets: AutoTokenizer on the expected
    files beside the config.json transformers makes of the file."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(d / "expected", tmp, dirs_exist_ok=True)
        AutoConfig.from_pretrained(str(d), gguf_file="model.gguf").save_pretrained(tmp)
        return AutoTokenizer.from_pretrained(tmp)


def differences(t, d):
    """Where the reload of `d/expected` differs from the in-memory tokenizer `t`."""
    try:
        r = reloaded(d)
    except Exception as e:  # a reload that fails differs everywhere
        return [f"load: {e}"]
    out = [] if r.padding_side == t.padding_side else ["padding_side"]
    for text in TEXTS + HELD_OUT:
        want = t(text, add_special_tokens=True)["input_ids"]
        try:
            got = r(text, add_special_tokens=True)["input_ids"]
        except Exception as e:
            got = str(e)
        same = got == want and all(
            r.decode(want, skip_special_tokens=skip) == t.decode(want, skip_special_tokens=skip)
            for skip in (False, True)
        )
        if not same:
            out.append(text)
    return out


def check_reload(d, t):
    """Names TokenizersBackend in expected/tokenizer_config.json where the
    saved class reloads to another tokenizer (see the module's notes)."""
    first = differences(t, d)
    if not first:
        return {"written_class": type(t).__name__}
    path = d / "expected" / "tokenizer_config.json"
    saved = path.read_text()
    config = json.loads(saved)
    config["tokenizer_class"] = "TokenizersBackend"
    if type(t).padding_side != TokenizersBackend.padding_side:
        config["padding_side"] = type(t).padding_side
    path.write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    still = differences(t, d)
    if not still:
        return {"written_class": "TokenizersBackend", "saved_class_reload_differs_on": first}
    # Only where transformers picks the class by model type whatever the file
    # says; the class named then changes nothing, so the saved file stays.
    model_type = AutoConfig.from_pretrained(str(d), gguf_file="model.gguf").model_type
    assert model_type in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, (d.name, still)
    path.write_text(saved)
    return {"written_class": type(t).__name__, "reload_differs_on": still}


def main():
    bpe = fixture_tokenizer()
    base = {"model": "gpt2", "tokens": bpe["tokens"], "types": bpe["types"], "merges": bpe["merges"]}
    eot = bpe["tokens"].index("<|endoftext|>")
    write_case("gpt2-llama", "llama",
               dict(base, pre="gpt-2", ids={"bos_token_id": eot, "eos_token_id": eot},
                    flags={"add_bos_token": False}))
    write_case("gpt2-llama-bpe", "llama",
               dict(base, pre="llama-bpe", ids={"bos_token_id": eot, "eos_token_id": eot},
                    flags={"add_bos_token": True}))
    # Qwen's files: a user-defined <think>, </think>, and a control token
    # spelled outside the byte alphabet (a llama.cpp mislabel, not added).
    qwen = dict(base,
                tokens=base["tokens"] + ["<think>", "</think>", "<|bad control|>"],
                types=base["types"] + [USER_DEFINED, USER_DEFINED, CONTROL])
    im_end = bpe["tokens"].index("<|im_end|>")
    for arch in ("qwen2", "qwen3", "qwen3moe", "qwen2moe"):
        write_case(f"gpt2-{arch}", arch,
                   dict(qwen, pre="qwen2", chat_template="{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                        "{{ m['content'] }}<|im_end|>\n{% endfor %}",
                        ids={"bos_token_id": eot, "eos_token_id": im_end, "padding_token_id": eot},
                        flags={"add_bos_token": False}))
    # Llama 3's names: no <|endoftext|> in the vocabulary, which the byte-level
    # builder's defaults then add as a new token.
    l3 = dict(base, tokens=base["tokens"][:317] + ["<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>"])
    write_case("gpt2-llama3", "llama",
               dict(l3, pre="llama-bpe", ids={"bos_token_id": 317, "eos_token_id": 318},
                    flags={"add_bos_token": True, "add_eos_token": True}))
    write_case("gpt2-phi3", "phi3",
               dict(base, pre="gpt-2", ids={"bos_token_id": eot, "eos_token_id": eot, "padding_token_id": eot}))
    # starcoder2 loads GPT2Tokenizer, stablelm and falcon TokenizersBackend.
    write_case("gpt2-starcoder2", "starcoder2",
               dict(base, pre="starcoder", ids={"bos_token_id": eot, "eos_token_id": eot}))
    write_case("gpt2-starcoder2-flags", "starcoder2",
               dict(base, pre="gpt-2", ids={"bos_token_id": eot, "eos_token_id": eot, "padding_token_id": eot},
                    flags={"add_bos_token": True, "add_eos_token": True}))
    write_case("gpt2-stablelm", "stablelm",
               dict(base, pre="stablelm2", ids={"bos_token_id": eot, "eos_token_id": eot},
                    flags={"add_bos_token": False}))
    write_case("gpt2-falcon", "falcon",
               dict(base, pre="falcon", ids={"bos_token_id": eot, "eos_token_id": eot}))
    write_case("gpt2-nemotron", "nemotron",
               dict(base, pre="gpt-2", ids={"bos_token_id": eot, "eos_token_id": eot}))
    # GPT2Tokenizer's reload splits with GPT-2's regex, not llama3's; merges
    # of digits show it ("12345": 123|45 against 1234|5).
    digits = dict(base, tokens=base["tokens"] + ["12", "123", "1234"], types=base["types"] + [NORMAL] * 3,
                  merges=base["merges"] + ["1 2", "12 3", "123 4"])
    write_case("gpt2-starcoder2-split", "starcoder2",
               dict(digits, pre="llama-bpe", ids={"bos_token_id": eot, "eos_token_id": eot}))
    # Byte-level BPE under Gemma's class (GemmaTokenizer's reload is
    # SentencePiece-shaped). gemma3's vocabulary lacks the byte symbols of
    # 0x00..0x08, has Gemma's named tokens, and adds BOS.
    write_case("gpt2-gemma2", "gemma2",
               dict(base, pre="gpt-2", ids={"bos_token_id": eot, "eos_token_id": eot}))
    g_tokens = base["tokens"][9:] + ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
    g_types = base["types"][9:] + [CONTROL, CONTROL, USER_DEFINED, USER_DEFINED]
    write_case("gpt2-gemma3", "gemma3",
               dict(base, pre="gpt-2", tokens=g_tokens, types=g_types,
                    ids={"bos_token_id": g_tokens.index("<bos>"), "eos_token_id": g_tokens.index("<eos>"),
                         "padding_token_id": g_tokens.index("<|endoftext|>")},
                    flags={"add_bos_token": True}, chat_template=GEMMA_TEMPLATE))

    # SentencePiece, llama's specials; <0x..> bytes; a user-defined piece.
    tokens, scores, types = spm_vocab(
        [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)], ["<think>", "</think>"])
    types[tokens.index("<think>")] = USER_DEFINED
    types[tokens.index("</think>")] = USER_DEFINED
    spm = {"model": "llama", "pre": "default", "tokens": tokens, "scores": scores, "types": types,
           "ids": {"bos_token_id": 1, "eos_token_id": 2, "unknown_token_id": 0}}
    write_case("spm-llama", "llama", dict(spm, chat_template=LLAMA_TEMPLATE,
                                           flags={"add_space_prefix": True}))
    write_case("spm-llama-eos", "llama", dict(spm, flags={"add_bos_token": False, "add_eos_token": True},
                                               ids=dict(spm["ids"], padding_token_id=0)))
    write_case("spm-nemotron", "nemotron", dict(spm, ids=dict(spm["ids"], padding_token_id=0)))
    write_case("spm-phi3", "phi3", dict(spm, chat_template=LLAMA_TEMPLATE,
                                         ids=dict(spm["ids"], padding_token_id=2)))
    # SentencePiece under the byte-level classes (Qwen2Tokenizer,
    # GPT2Tokenizer) and the other TokenizersBackend architectures.
    for arch in ("qwen2", "qwen3", "qwen2moe", "qwen3moe", "starcoder2", "stablelm", "falcon"):
        write_case(f"spm-{arch}", arch, spm)

    # Gemma: <pad> <eos> <bos> <unk>, turn tokens, spaces stored as spaces.
    tokens, scores, types = spm_vocab(
        [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", UNKNOWN),
         ("<mask>", USER_DEFINED), ("[multimodal]", USER_DEFINED),
         ("<start_of_turn>", USER_DEFINED), ("<end_of_turn>", USER_DEFINED)],
        ["  ", "   ", "    ", "\n", "\n\n", "\t", "<unused0>"], gemma=True)
    types[tokens.index("<unused0>")] = CONTROL
    gem = {"model": "llama", "pre": "default", "tokens": tokens, "scores": scores, "types": types,
           "ids": {"bos_token_id": 2, "eos_token_id": 1, "unknown_token_id": 3, "padding_token_id": 0},
           "flags": {"add_bos_token": True, "add_eos_token": False}, "chat_template": GEMMA_TEMPLATE}
    write_case("spm-gemma3", "gemma3", gem)
    # No <mask>, which GemmaTokenizer then adds as a new token.
    nomask = [t if t != "<mask>" else "<mask_other>" for t in tokens]
    write_case("spm-gemma2", "gemma2", dict(gem, tokens=nomask, flags={}))


if __name__ == "__main__":
    main()

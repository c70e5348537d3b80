"""Checks the dense models wgpu-dequant writes from tests/gguf/configs/ in
transformers itself: each loads with no missing or unexpected keys, and its
rotary embedding computes what llama.cpp computes from the GGUF file.

  llama3   LlamaRotaryEmbedding.inv_freq == theta^(-2i/d) / rope_freqs[i], within 1e-5 relative
  phi3     Phi3's rotary embedding starts from the short factors
           (inv_freq == 1 / (short[i] * theta^(2i/d))) and switches to the long
           ones past original_max_position_embeddings; the lists are the file's
  yarn,    rope_parameters hold what expected.json says (and transformers
  gemma3   accepts them)

Needs torch and transformers 5.25 (not part of CI; run by hand after changing
src/hf/gguf/rope.rs):

    cargo build && python tests/gguf/check_configs.py target/debug/wgpu-dequant
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

HERE = Path(__file__).resolve().parent / "configs"


def dense(tool, case, out):
    subprocess.run([tool, "dequantize", str(HERE / f"{case}.gguf"), "-o", str(out), "-q"], check=True)
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True, dtype="auto")
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"}
    assert not bad and not info.get("error_msgs"), f"{case}: {info}"
    return model


def close(ours, want, what):
    rel = ((ours.double() - want).abs() / want.abs()).max().item()
    assert rel <= 1e-5, f"{what}: {rel:.3g} relative"
    return rel


def main():
    tool = sys.argv[1]
    expected = json.loads((HERE / "expected.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        e = expected["llama3"]
        m = dense(tool, "llama3", Path(tmp) / "llama3")
        want = torch.tensor(e["inv_freq"], dtype=torch.float64)
        print("llama3 inv_freq vs llama.cpp:", close(m.model.rotary_emb.inv_freq, want, "llama3"))

        e = expected["phi3"]
        m = dense(tool, "phi3", Path(tmp) / "phi3")
        rp = m.config.rope_parameters
        assert rp["long_factor"] == e["long_factor"] and rp["short_factor"] == e["short_factor"], "phi3 lists"
        assert m.config.original_max_position_embeddings == e["original"], "phi3 original"
        d = e["rotary"]
        base = e["theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        short = 1.0 / (torch.tensor(e["short_factor"], dtype=torch.float64) * base)
        long = 1.0 / (torch.tensor(e["long_factor"], dtype=torch.float64) * base)
        print("phi3 start (short):", close(m.model.rotary_emb.inv_freq, short, "phi3 short"))
        inv, attn = ROPE_INIT_FUNCTIONS["longrope"](m.config, None, seq_len=e["original"] + 1)
        print("phi3 past the original (long):", close(inv, long, "phi3 long"), "attention factor", attn)
        assert abs(attn - e["attention_factor"]) <= 1e-6, f"attention factor {attn}"

        for case in ("yarn", "gemma3"):
            e = expected[case]
            m = dense(tool, case, Path(tmp) / case)
            rp = m.config.rope_parameters
            rp = rp.get(e["layers"], rp) if "layers" in e else rp
            for k, v in e["rope"].items():
                assert rp.get(k) == v, f"{case}: {k} is {rp.get(k)}, expected {v}"
            print(case, "rope_parameters:", {k: rp[k] for k in e["rope"]})
    print("ok")


if __name__ == "__main__":
    main()

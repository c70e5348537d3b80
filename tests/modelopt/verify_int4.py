import sys, os, json, torch, warnings
warnings.filterwarnings("ignore")
torch.set_num_threads(1)
from safetensors.torch import load_file, save_file
name = sys.argv[1]; d = os.path.join(os.environ.get("FIXTURE_ROOT", "modelopt-fixture"), name)
st = load_file(f"{d}/model/model.safetensors")
S = torch.load(f"{d}/state.pt", weights_only=False)
hq = json.load(open(f"{d}/model/hf_quant_config.json"))["quantization"]
G = hq["group_size"]
def unpack(p):  # p uint8 (out/2, in) -> int8 codes (out, in)
    lo = (p & 0x0F).to(torch.int16); hi = (p >> 4).to(torch.int16)
    lo = torch.where(lo >= 8, lo - 16, lo); hi = torch.where(hi >= 8, hi - 16, hi)
    out = torch.empty(p.shape[0] * 2, p.shape[1], dtype=torch.int16)
    out[0::2] = lo; out[1::2] = hi   # row 2r = low nibble, row 2r+1 = high nibble
    return out.to(torch.int8)
def bits_eq(a, b): return torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a.view(torch.int32), b.view(torch.int16) if b.dtype == torch.bfloat16 else b.view(torch.int32))
exp32, exp16, report = {}, {}, {}
drop = ("input_scale", "weight_scale_2", "k_scale", "v_scale", "output_scale")
for k, t in st.items():
    if k.endswith(".weight") and t.dtype == torch.uint8:
        m = k[:-len(".weight")]
        code = unpack(t).float()
        sc = st[m + ".weight_scale"]
        assert sc.shape == (code.shape[0], code.shape[1] // G), sc.shape
        deq = code * sc.float().repeat_interleave(G, dim=1)          # f32
        pqs = st.get(m + ".pre_quant_scale")
        dense = deq * pqs.float()[None, :] if pqs is not None else deq
        post, pre = S["post"][m], S["pre"][m]
        r = {}
        # 1) codes/scales vs ModelOpt fake-quant after its export-time resmoothing (state actually exported)
        ref = post["wfq0"] if post.get("wfq0") is not None else post["wfq"]   # int4 stage only for W4A8
        r["deq_vs_fakequant_int4_f32_maxabs"] = (deq - ref.float()).abs().max().item()
        r["deq_bf16_bitexact_vs_fakequant"] = bits_eq(deq.to(torch.bfloat16), ref.to(torch.bfloat16))
        scf = sc.float().repeat_interleave(G, dim=1)
        fq_code = ref.float() / scf
        mism = deq.to(torch.bfloat16) != ref.to(torch.bfloat16)
        r["n_elems"] = deq.numel(); r["n_bf16_mismatch_vs_fakequant"] = int(mism.sum())
        if mism.any():
            r["mismatch_code_step_minmax"] = [(fq_code - code)[mism].abs().min().item(), (fq_code - code)[mism].abs().max().item()]
            x = post["w"].float()[mism] / scf[mism]
            r["mismatch_|w/scale - trunc|_minmax(ties~0.5)"] = [(x - x.trunc()).abs().min().item(), (x - x.trunc()).abs().max().item()]
        r["nonmismatch_bf16(deq)==fakequant_bf16"] = bool((deq.to(torch.bfloat16) == ref.to(torch.bfloat16))[~mism].all())
        r["nonmismatch_f32_maxabs(deq - fakequant)"] = (deq - ref.float())[~mism].abs().max().item()
        if post.get("wfq0") is not None:
            r["deq_vs_full_seq_fakequant(int4+fp8)_maxabs"] = (deq - post["wfq"].float()).abs().max().item()
            r["deq_bf16_bitexact_vs_full_seq_fakequant"] = bits_eq(deq.to(torch.bfloat16), post["wfq"].to(torch.bfloat16))
        # exported pre_quant_scale vs ModelOpt's
        if pqs is not None:
            r["pqs_export_vs_modelopt_maxabs"] = (pqs.float() - post["pqs"].float()).abs().max().item()
            r["dense_with_pqs_vs_fakequant*pqs_f32_maxabs"] = (dense - ref.float() * post["pqs"].float()[None]).abs().max().item()
        r["pqs_in_export"] = pqs is not None
        r["modelopt_post_resmooth_has_pqs"] = post["pqs"] is not None
        # effective weight before resmoothing/fold (pre-export model): W_fq * pqs
        eff_pre = pre["wfq"].float() * (pre["pqs"].float()[None] if pre["pqs"] is not None else 1)
        r["dense_vs_preexport_effective_W*pqs_maxabs"] = (dense - eff_pre).abs().max().item()
        r["code_min_max"] = (int(code.min()), int(code.max()))
        # also check codes equal round(w/scale) from the resmoothed weight
        wpost = post["w"].float()
        rc = (post["w"].to(torch.bfloat16).float() / sc.repeat_interleave(G, 1)).round().clamp(-8, 7)
        r["codes_eq_round(w/scale)"] = torch.equal(rc, code)
        report[m] = r
        exp32[k] = dense.contiguous()
        exp16[k] = dense.to(torch.bfloat16).contiguous()
    elif any(k.endswith(s) for s in drop) or k.endswith(".weight_scale") or k.endswith(".pre_quant_scale"):
        continue
    else:
        exp32[k] = t.clone(); exp16[k] = t.clone()
for k in ("expected-f32", "expected-bf16"): os.makedirs(f"{d}/{k}", exist_ok=True)
save_file(exp32, f"{d}/expected-f32/model.safetensors", metadata={"format": "pt"})
save_file(exp16, f"{d}/expected-bf16/model.safetensors", metadata={"format": "pt"})
# norms: exported layernorm == ModelOpt's folded norm?
for n, v in S["norms_post"].items():
    report[n] = dict(export_eq_modelopt_folded=torch.equal(st[n], v), changed_vs_prequant=not torch.equal(st[n], S["norms_pre"][n]),
                     export_vs_orig_times_avgpqs="see README")
# end-to-end logits with a plain dense Llama
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig.from_pretrained(f"{d}/model"); cfg.quantization_config = None
if hasattr(cfg, "quantization_config"): del cfg.quantization_config
for tag, sd in (("bf16", exp16),):
    mdl = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    missing = mdl.load_state_dict(sd, strict=True)
    with torch.no_grad(): lg = mdl(S["calib"][0]).logits.float()
    report["logits_dense_bf16_vs_modelopt_fakequant_post_resmooth_maxabs"] = (lg - S["logits_post"]).abs().max().item()
    report["logits_dense_bf16_vs_modelopt_fakequant_pre_export_maxabs"] = (lg - S["logits_pre"]).abs().max().item()
    report["logits_scale_maxabs"] = S["logits_post"].abs().max().item()
json.dump(report, open(f"{d}/verify_report.json", "w"), indent=1)
print(json.dumps(report, indent=1))

import sys, os, json, copy, time, torch, warnings
warnings.filterwarnings("ignore")
torch.set_num_threads(1)
torch.manual_seed(0)
from transformers import LlamaConfig, LlamaForCausalLM
import modelopt, modelopt.torch.quantization as mtq
if os.environ.get("NVFP4_CPU_SHIM"): import nvfp4_cpu_shim
from modelopt.torch.export import export_hf_checkpoint
from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers

name, cfgname = sys.argv[1], sys.argv[2]
out = os.path.join(os.environ.get("FIXTURE_ROOT", "modelopt-fixture"), name)
cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=512, max_position_embeddings=128, torch_dtype="bfloat16",
                  tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
# make weights less uniform so AWQ scales are non-trivial
with torch.no_grad():
    for n, p in model.named_parameters():
        if "norm" in n: p.copy_((1 + 0.3 * torch.randn_like(p.float())).to(p.dtype))
    # a few outlier input channels
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and "lm_head" not in n:
            idx = torch.randperm(m.in_features)[:4]
            m.weight[:, idx] *= 8
g = torch.Generator().manual_seed(1)
calib = [torch.randint(0, 512, (1, 16), generator=g) for _ in range(2)]
def loop(m):
    for x in calib: m(x)
t = time.time()
qcfg = getattr(mtq, cfgname)
model = mtq.quantize(model, qcfg, loop)
print("quantize s", time.time() - t)
mtq.print_quant_summary(model) if hasattr(mtq, "print_quant_summary") else None
lin = {n: m for n, m in model.named_modules() if hasattr(m, "weight_quantizer")}
pre = {}
with torch.no_grad():
    for n, m in lin.items():
        pqs = getattr(m.input_quantizer, "pre_quant_scale", None)
        pre[n] = dict(w=m.weight.detach().clone(), wfq=m.weight_quantizer(m.weight).detach().clone(),
                      pqs=None if pqs is None else pqs.detach().clone(), wq=repr(m.weight_quantizer), iq=repr(m.input_quantizer))
norms_pre = {n: p.detach().clone() for n, p in model.named_parameters() if "norm" in n}
# post-resmooth fake-quant state on a copy
cp = copy.deepcopy(model)
with torch.no_grad():
    requantize_resmooth_fused_llm_layers(cp)
    post = {}
    for n, m in cp.named_modules():
        if hasattr(m, "weight_quantizer"):
            pqs = getattr(m.input_quantizer, "_pre_quant_scale", None)
            wq = m.weight_quantizer
            post[n] = dict(w=m.weight.detach().clone(), wfq=wq(m.weight).detach().clone(),
                           wfq0=(wq[0](m.weight).detach().clone() if hasattr(wq, "__getitem__") else None),
                           pqs=None if pqs is None else pqs.detach().clone(), wq=repr(m.weight_quantizer))
    logits_post = cp(calib[0]).logits.float()
    logits_pre = model(calib[0]).logits.float()
    norms_post = {n: p.detach().clone() for n, p in cp.named_parameters() if "norm" in n}
torch.save(dict(pre=pre, post=post, norms_pre=norms_pre, norms_post=norms_post, calib=calib), f"{out}_state.pt") if False else None
os.makedirs(out, exist_ok=True)
torch.save(dict(pre=pre, post=post, norms_pre=norms_pre, norms_post=norms_post, calib=calib, logits_pre=logits_pre, logits_post=logits_post), f"{out}/state.pt")
t = time.time()
with torch.no_grad():
    export_hf_checkpoint(model, export_dir=f"{out}/model")
print("export s", time.time() - t, "modelopt", modelopt.__version__)

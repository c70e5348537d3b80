import sys, torch
torch.set_num_threads(1)
from quark.torch import import_model_from_safetensors
from safetensors.torch import load_file
case = sys.argv[1]
m = import_model_from_safetensors(None, f"{case}/model", device="cpu")
import importlib.util
spec = importlib.util.spec_from_file_location("dec", "decode_lib.py"); dec = importlib.util.module_from_spec(spec); spec.loader.exec_module(dec)
sd = load_file(f"{case}/model/model.safetensors")
D = {p: dec.decode(sd, p) for p in [k[:-13] for k in sd if k.endswith(".weight_scale")]}
R = torch.load(f"{case}/quark_reference.pt")
for n, mod in m.named_modules():
    if n + ".weight" in R["frozen"]:
        w = mod.weight
        wq = getattr(mod, "_weight_quantizer", None)
        deq = None
        for attempt in ("get_quant_weight", ):
            try:
                deq = mod._get_qweight(w)
            except Exception as e:
                print("  get_quant_weight failed", e)
        fr = R["frozen"][n + ".weight"]
        print(n, type(mod).__name__, "weight", w.dtype, tuple(w.shape), "wq", type(wq).__name__,
              "| weight==frozen bits:", w.dtype == fr.dtype and torch.equal(w.view(torch.int16), fr.view(torch.int16)),
              "| importer deq dtype", None if deq is None else deq.dtype, "bf16(deq)==frozen bits:", None if deq is None else torch.equal(deq.to(fr.dtype).view(torch.int16), fr.view(torch.int16)),
              "| deq==my f32 decode:", torch.equal(deq.float(), D[n]) if n in D else None)

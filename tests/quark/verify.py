import json, sys, torch
torch.set_num_threads(1)
from safetensors.torch import load_file
import decode_lib
case = sys.argv[1]
sd = load_file(f"{case}/model/model.safetensors")

R = torch.load(f"{case}/quark_reference.pt")
def bits_eq(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))

def decode(prefix):
    return decode_lib.decode(sd, prefix)

for k in sorted(R["frozen"]):
    p = k[:-len(".weight")]
    if p + ".weight_scale" not in sd:
        print(k, "NOT quantized in export", sd[k].dtype); continue
    d32 = decode(p)
    d16 = d32.to(torch.bfloat16)
    fr = R["frozen"][k]; rq = R["ref_qdq"][k]; r32 = R["ref_qdq"].get(k + "#f32in")
    qs = R["scale"].get(k)
    print(f"{k}: code {tuple(sd[p+'.weight'].shape)} {sd[p+'.weight'].dtype} scale {tuple(sd[p+'.weight_scale'].shape)} {sd[p+'.weight_scale'].dtype}; quantizer.scale {None if qs is None else (tuple(qs.shape), qs.dtype)}")
    print(f"   bf16(decode_f32) vs frozen: bitexact={bits_eq(d16, fr)} maxabs={(d16.float()-fr.float()).abs().max().item():.3g}"
          f" | vs QDQ(bf16 w): {bits_eq(d16, rq)}"
          + ("" if r32 is None else f" | f32 decode vs QDQ(f32 w) maxabs={(d32-r32.float()).abs().max().item():.3g} dtype {r32.dtype}"))

import os, sys, json, torch
torch.set_num_threads(1)
from safetensors.torch import load_file, save_file
from decode_lib import decode, FP4
ACT = ("input_scale", "output_scale", "input_zero_point", "output_zero_point")
for case in sys.argv[1:]:
    sd = load_file(f"{case}/model/model.safetensors")
    R = torch.load(f"{case}/quark_reference.pt")
    qp = [k[:-len(".weight_scale")] for k in sd if k.endswith(".weight_scale")]
    o16, o32 = {}, {}
    for k, v in sd.items():
        p, _, leaf = k.rpartition(".")
        if leaf in ACT: continue
        if p in qp:
            if leaf == "weight":
                d = decode(sd, p)
                o32[k] = d.contiguous(); o16[k] = d.to(torch.bfloat16).contiguous()
                assert torch.equal(o16[k].view(torch.int16), R["frozen"][k].view(torch.int16)), k
            elif leaf == "weight_scale":
                continue
            else:
                raise SystemExit(f"unexpected tensor {k}")
        else:
            o16[k] = v; o32[k] = v
    # sanity: other nibble order would NOT match
    for p in qp:
        w = sd[p + ".weight"]
        if w.dtype == torch.uint8:
            sw = ((w & 0xF) << 4) | (w >> 4)
            alt = decode({p + ".weight": sw, p + ".weight_scale": sd[p + ".weight_scale"]}, p)
            assert not torch.equal(alt, o32[p + ".weight"])
            s = sd[p + ".weight_scale"]
            print(f"  {p}: e8m0 bytes min {int(s.min())} max {int(s.max())}")
    for n, o in (("expected-bf16", o16), ("expected-f32", o32)):
        os.makedirs(f"{case}/{n}", exist_ok=True)
        save_file(o, f"{case}/{n}/model.safetensors", metadata={"format": "pt"})
    print(case, "quantized:", len(qp), "tensors out:", len(o16), "dropped:", [k for k in sd if k.rpartition('.')[2] in ACT][:2], "...")

import torch
FP4 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)

def decode(sd, prefix):
    """Dense f32 weight from Quark real_quantized tensors (verified layout)."""
    w = sd[prefix + ".weight"]; s = sd[prefix + ".weight_scale"]
    if w.dtype == torch.float8_e4m3fn:
        sf = s.float()
        if sf.dim() == 1:
            sf = sf[:, None]
        return w.float() * sf
    if w.dtype == torch.uint8:  # OCP MXFP4, 2 codes / byte along input dim, low nibble = even column
        lo = FP4[(w & 0xF).long()]; hi = FP4[(w >> 4).long()]
        codes = torch.stack([lo, hi], -1).reshape(w.shape[0], w.shape[1] * 2)
        assert s.dtype == torch.uint8
        sc = torch.exp2(s.float() - 127)
        return (codes.reshape(w.shape[0], -1, 32) * sc[..., None]).reshape(codes.shape)
    raise ValueError(w.dtype)

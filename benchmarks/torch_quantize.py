"""A torch implementation of blockscale's dynamic block-scaled quantize (same semantics, D2).

Only needs torch; ``torch.compile`` it for a fused baseline. Returns ``(data uint8/e4m3 bytes
[M, K/2 | K], scales 5-D uint8)`` for K a multiple of the block and M any.
"""

from __future__ import annotations

import torch

_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _e2m1(y: torch.Tensor) -> torch.Tensor:
    """f32 -> E2M1 codes (RNE, satfinite, sign kept) by threshold counting."""
    a = y.abs()
    code = torch.zeros_like(a, dtype=torch.int32)
    for i, t in enumerate(_MIDS):  # ties go to the even code
        code += (a > t).int() if i % 2 == 0 else (a >= t).int()
    return code | (torch.signbit(y).int() << 3)


def _e4m3(y: torch.Tensor) -> torch.Tensor:
    return y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)


def _e8m0_up(s: torch.Tensor) -> torch.Tensor:
    bits = s.view(torch.int32)
    exp = (bits >> 23) & 0xFF
    man = bits & 0x7FFFFF
    b = torch.where(exp == 0, (man > (1 << 22)).int(), exp + (man != 0).int())
    return b.clamp(0, 254)


def quantize(x: torch.Tensor, fmt: str, tensor_sf: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 ``[M, K]`` -> (data, 5-D scales) as ``blockscale.reference`` ("up" E8M0)."""
    m, k = x.shape
    bs = 16 if fmt == "nvfp4" else 32
    j = k // bs
    xf = x.float().view(m, j, bs)
    amax = xf.abs().amax(dim=2)
    nonfinite = ~torch.isfinite(xf).all(dim=2)
    amax = torch.where(nonfinite, torch.zeros_like(amax), amax)
    if fmt == "nvfp4":
        s = tensor_sf * (amax * (1.0 / 6.0))
        sb = _e4m3(s).int()
        sd = sb.to(torch.uint8).view(torch.float8_e4m3fn).float()
        recip = torch.where(sd == 0, torch.zeros_like(sd), 1.0 / (sd * (1.0 / tensor_sf)))
        nan_byte = 0x7F
    else:
        rec = (1.0 / 6.0) if fmt == "mxfp4" else (1.0 / 448.0)
        sb = _e8m0_up((amax * torch.tensor(rec, dtype=torch.float32)).contiguous())
        sd = torch.where(sb == 0, torch.full_like(amax, 2.0 ** -127),
                         (sb << 23).view(torch.float32))
        recip = 1.0 / sd
        nan_byte = 0xFF
    sb = torch.where(nonfinite, torch.full_like(sb, nan_byte), sb)
    y = torch.where(nonfinite[:, :, None], torch.zeros_like(xf), xf * recip[:, :, None])
    y = y.view(m, k)
    if fmt == "mxfp8":
        data = _e4m3(y)
    else:
        c = _e2m1(y)
        data = (c[:, 0::2] | (c[:, 1::2] << 4)).to(torch.uint8)
    rows = -(-m // 128) * 128
    jp = -(-j // 4) * 4
    sp = torch.zeros((rows, jp), dtype=torch.uint8, device=x.device)
    sp[:m, :j] = sb.to(torch.uint8)
    s5 = sp.view(rows // 128, 4, 32, jp // 4, 4).permute(0, 3, 2, 1, 4).contiguous()
    return data, s5

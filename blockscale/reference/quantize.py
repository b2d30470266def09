"""Reference dense quantize, dequantize and scale interleave (SEMANTICS §2-§3, D1-D7, D9)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from blockscale import formats as F
from blockscale.formats import Format, ScaleRounding
from blockscale.layouts import (
    ROW_MAJOR,
    TCGEN_5D,
    ScaleLayout,
    deinterleave,
    interleave,
    scale_shape,
)
from blockscale.reference import _checks as C


def quantize_rows(xf: np.ndarray, fmt: Format, tensor_sf: np.ndarray | float = 1.0,
                  rounding: ScaleRounding | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Quantize float32 rows ``[M, K]`` block by block: the D2 chain, shared by every op.

    ``tensor_sf`` is a scalar or a float32 ``[M]`` vector (one per row; NVFP4 only). Returns
    ``(data [M, K/2 | K], scales [M, ceil(K/block)])``; data in ``fmt.elem_dtype``, scales as
    row-major ``fmt.scale_dtype``. Assumes validated inputs (``rounding`` resolved).
    """
    m, k = xf.shape
    bs = fmt.block_size
    j = fmt.kblocks(k)
    xp = xf if k == j * bs else np.pad(xf, ((0, 0), (0, j * bs - k)))  # pad slots: amax-neutral
    xb = xp.reshape(m, j, bs)
    with np.errstate(invalid="ignore"):
        amax = np.abs(xb).max(axis=2)  # NaN propagates; +Inf stays
    finite = np.isfinite(amax)
    amax = np.where(finite, amax, np.float32(0))
    if fmt.is_mx:
        sbytes = F.e8m0_scale_from_amax(amax, fmt, rounding)
        recip = np.float32(1) / F.decode_e8m0(sbytes)  # sd >= 2^-127, never 0 (D1)
    else:
        tsf = np.asarray(tensor_sf, dtype=np.float32).reshape(-1, 1) if np.ndim(tensor_sf) \
            else np.float32(tensor_sf)
        sbytes = F.nvfp4_scale_from_amax(amax, tsf)
        sd = F.decode_e4m3(sbytes)
        with np.errstate(divide="ignore"):
            recip = np.float32(1) / (sd * (np.float32(1) / tsf))
        recip = np.where(sd == 0, np.float32(0), recip).astype(np.float32)  # D1
    sbytes = np.where(finite, sbytes, np.uint8(F.E4M3_NAN if not fmt.is_mx else F.E8M0_NAN))
    with np.errstate(invalid="ignore", over="ignore"):
        y = xb * recip[:, :, None].astype(np.float32)
    y = np.where(finite[:, :, None], y, np.float32(0)).reshape(m, j * bs)[:, :k]  # D5
    if fmt.is_fp4:
        data = F.pack_fp4(F.encode_e2m1(y))
    else:
        data = F.encode_e4m3(y).view(ml_dtypes.float8_e4m3fn)
    return data, sbytes.astype(np.uint8).view(fmt.scale_dtype)


def quantize_dynamic_block_scaled(x: np.ndarray, fmt: Format | str, *, tensor_sf: float = 1.0,
                                  scale_rounding: ScaleRounding | None = None,
                                  scale_layout: ScaleLayout | str = TCGEN_5D
                                  ) -> tuple[np.ndarray, np.ndarray]:
    """Quantize a bf16 ``[M, K]`` matrix to ``fmt`` with one scale per block (SEMANTICS §2.1).

    Args:
        x: bfloat16 (or float32) ``[M, K]``; FP4 formats need K even, MXFP8 any K (D7).
        fmt: NVFP4, MXFP4 or MXFP8 (or its name).
        tensor_sf: NVFP4 per-tensor encode scale (``1/input_scale``); must be 1.0 for MX (D9).
        scale_rounding: E8M0 rounding for MX formats ("up" default, "even", "floor"; D4);
            must be None for NVFP4.
        scale_layout: ``TCGEN_5D`` (default, zero-padded 5-D) or ``ROW_MAJOR`` ``[M, J]``.

    Returns:
        ``(data, scales)``: data ``[M, K/2]`` uint8 (FP4, low nibble first) or ``[M, K]``
        float8_e4m3fn; scales in ``fmt.scale_dtype``.
    """
    fmt = C.fmt_arg(fmt)
    xf = C.float_input(x)
    fmt.check_k(xf.shape[1], "x.shape[1]")
    tsf = C.positive_scalar(tensor_sf, "tensor_sf")
    C.mx_tensor_sf(fmt, tsf)
    rounding = fmt.resolve_scale_rounding(scale_rounding)
    layout = ScaleLayout.parse(scale_layout)
    data, scales = quantize_rows(xf, fmt, tsf, rounding)
    return data, (interleave(scales) if layout is TCGEN_5D else scales)


def decode_elements(data: np.ndarray, fmt: Format) -> np.ndarray:
    """Stored data ``[..., K/2 | K]`` -> float32 element values ``[..., K]``."""
    if fmt.is_fp4:
        return F.decode_e2m1(F.unpack_fp4(data))
    return F.decode_e4m3(data)


def decode_scales(scales_2d: np.ndarray, fmt: Format) -> np.ndarray:
    """Row-major scales -> float32 (NVFP4: sign bit ignored, D3; NaN bytes -> NaN)."""
    b = scales_2d.view(np.uint8)
    return F.decode_e8m0(b) if fmt.is_mx else F.decode_e4m3(b & 0x7F)


def dequantize_rows(data: np.ndarray, scales_2d: np.ndarray, fmt: Format, k: int,
                    tensor_sf: float = 1.0) -> np.ndarray:
    """float32 ``[M, k]`` = element * (scale * (1/tensor_sf)), all float32."""
    vals = decode_elements(data, fmt)
    sd = decode_scales(scales_2d, fmt) * (np.float32(1) / np.float32(tensor_sf))
    per_elem = np.repeat(sd, fmt.block_size, axis=1)[:, :k]
    return vals * per_elem


def dequantize_block_scaled(data: np.ndarray, scales: np.ndarray, fmt: Format | str, *, k: int,
                            tensor_sf: float = 1.0,
                            scale_layout: ScaleLayout | str = TCGEN_5D) -> np.ndarray:
    """Decode quantized data to float32 ``[M, k]``: ``elem * scale * (1/tensor_sf)``.

    Blocks with a NaN scale byte decode to NaN (D5). NVFP4 scale sign bits are ignored (D3).
    """
    fmt = C.fmt_arg(fmt)
    data = C.data_arg(data, fmt, "data")
    k = C.k_arg(fmt, k, data.shape[1])
    tsf = C.positive_scalar(tensor_sf, "tensor_sf")
    C.mx_tensor_sf(fmt, tsf)
    layout = ScaleLayout.parse(scale_layout)
    m, j = data.shape[0], fmt.kblocks(k)
    C.scales_arg(scales, fmt, "scales", scale_shape(layout, m, j))
    s2 = deinterleave(scales, m, j) if layout is TCGEN_5D else scales
    return dequantize_rows(data, s2, fmt, k, tsf)


def block_scales_interleave(scales_2d: np.ndarray) -> np.ndarray:
    """``[R, J]`` scales -> 5-D ``[ceil(R/128), ceil(J/4), 32, 4, 4]`` (SEMANTICS §3).

    Accepts float8_e4m3fn or float8_e8m0fnu (or uint8); padding bytes are zero.
    """
    return interleave(scales_2d)


def block_scales_deinterleave(scales_5d: np.ndarray, rows: int, kblocks: int) -> np.ndarray:
    """5-D scales -> ``[rows, kblocks]`` (inverse of :func:`block_scales_interleave`)."""
    return deinterleave(scales_5d, rows, kblocks)


def quantize_mxfp4_amd(x: np.ndarray, *, scale_rounding: ScaleRounding = "even"
                       ) -> tuple[np.ndarray, np.ndarray]:
    """MAX's AMD MXFP4 quantizer (§2.4): row-major ``[M, K/32]`` E8M0 scales, "even" rounding.

    K must be a multiple of 32 (§9.14). Returns ``(data [M, K/2] uint8, scales [M, K/32])``.
    """
    xf = C.float_input(x)
    if xf.shape[1] % 32:
        raise ValueError(f"x.shape[1] must be a multiple of 32 for quantize_mxfp4_amd, "
                         f"got {xf.shape[1]}")
    rounding = F.MXFP4.resolve_scale_rounding(scale_rounding)
    return quantize_rows(xf, F.MXFP4, 1.0, rounding)


__all__ = [
    "ROW_MAJOR",
    "TCGEN_5D",
    "block_scales_deinterleave",
    "block_scales_interleave",
    "decode_elements",
    "decode_scales",
    "dequantize_block_scaled",
    "dequantize_rows",
    "quantize_dynamic_block_scaled",
    "quantize_mxfp4_amd",
    "quantize_rows",
]

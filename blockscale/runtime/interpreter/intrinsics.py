"""Models of the target conversion intrinsics, from their ISA definitions (vectorized numpy).

Each function takes and returns numpy arrays (any matching shapes) and is the single definition
the interpreter uses for the op named in its docstring. Element codecs come from
:mod:`blockscale.formats` (the numeric definitions shared with the reference).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from blockscale import formats


def _relu(x: np.ndarray) -> np.ndarray:
    """The ``.relu`` modifier: negative values (and -0) become +0; NaN is kept."""
    return np.where((x < 0) | ((x == 0) & np.signbit(x)), np.float32(0), x).astype(np.float32)


def cvt_f32x2_to_e2m1x2(a: np.ndarray, b: np.ndarray, relu: bool = False) -> np.ndarray:
    """``cvt.rn.satfinite{.relu}.e2m1x2.f32 d, a, b`` (op ``nvvm.convert.f32x2.to.f4x2``).

    Each input rounds to E2M1 to nearest even, saturating to ±6; the result byte holds ``a``
    in the upper nibble and ``b`` in the lower nibble (PTX: "a -> upper half, b -> lower").
    Returned as ``int8`` (the op's ``i8`` result).
    """
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    if relu:
        a, b = _relu(a), _relu(b)
    hi = formats.encode_e2m1(a).astype(np.uint8)
    lo = formats.encode_e2m1(b).astype(np.uint8)
    return ((hi << 4) | lo).view(np.int8)


def f32_to_ue8m0(x: np.ndarray, rounding: str, satfinite: bool) -> np.ndarray:
    """One lane of ``cvt.{rp|rz}{.satfinite}.ue8m0x2.f32``: float32 -> UE8M0 byte (uint8).

    ``rp`` rounds the power of two toward +Inf (:func:`formats.encode_e8m0_up`), ``rz`` toward
    zero (2^floor(log2 x)). NaN gives 0xFF. Without ``.satfinite`` a result above 2^127 and
    +Inf give 0xFF (NaN: E8M0 has no Inf); with it they clamp to 0xFE. Zero and values below
    2^-127 give 0x00 (the smallest code). E8M0 is unsigned: negative inputs are converted by
    magnitude [inferred: the PTX text defines the conversion for the unsigned format only].
    """
    x = np.abs(np.asarray(x, np.float32))
    finite = np.where(np.isfinite(x), x, np.float32(0))
    bits = finite.view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int32)
    if rounding == "rp":
        out = formats.encode_e8m0_up(finite).astype(np.int32)
        # encode_e8m0_up clamps to 0xFE: recover the overflow (exp 0xFE with a mantissa).
        over = (exp == 0xFE) & ((bits & 0x7FFFFF) != 0)
    elif rounding == "rz":
        out = exp.copy()  # subnormals (exp 0) are below 2^-126: code 0 = 2^-127 (rz)
        over = np.zeros(x.shape, bool)
    else:
        raise NotImplementedError(f"ue8m0 conversion: rounding {rounding!r} (only rp, rz)")
    inf = np.isinf(x)
    if satfinite:
        out = np.where(inf, 0xFE, out)
    else:
        out = np.where(over | inf, 0xFF, out)
    out = np.where(np.isnan(x), 0xFF, out)
    return out.astype(np.uint8)


def cvt_f32x2_to_ue8m0x2(a: np.ndarray, b: np.ndarray, rounding: str = "rp",
                         satfinite: bool = False) -> np.ndarray:
    """``cvt.rp{.satfinite}.ue8m0x2.f32 d, a, b`` (op ``nvvm.convert.f32x2.to.f8x2`` with
    ``dstTy = f8E8M0FNU``): ``a`` in the upper byte, ``b`` in the lower. Returns ``int16``."""
    hi = f32_to_ue8m0(a, rounding, satfinite).astype(np.uint16)
    lo = f32_to_ue8m0(b, rounding, satfinite).astype(np.uint16)
    return ((hi << 8) | lo).view(np.int16)


def cvt_f32x2_to_e4m3x2(a: np.ndarray, b: np.ndarray, relu: bool = False) -> np.ndarray:
    """``cvt.rn.satfinite{.relu}.e4m3x2.f32 d, a, b`` (``nvvm.convert.f32x2.to.f8x2`` with
    ``dstTy = f8E4M3FN``): RNE, saturating to ±448, NaN -> 0x7F; ``a`` in the upper byte."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    if relu:
        a, b = _relu(a), _relu(b)
    hi = formats.encode_e4m3(a).astype(np.uint16)
    lo = formats.encode_e4m3(b).astype(np.uint16)
    return ((hi << 8) | lo).view(np.int16)


def scale_exponent(scale: np.ndarray) -> np.ndarray:
    """floor(log2 |scale|) of a float32 scale (int64), exact also for subnormal scales.

    The ``v_cvt_scalef32_*`` instructions use only the scale's exponent (an E8M0 scale decoded
    to float32 is an exact power of two, 2^-127 included).
    """
    s = np.abs(np.asarray(scale, np.float32)).astype(np.float64)
    _, e = np.frexp(np.where((s > 0) & np.isfinite(s), s, 1.0))
    return (e - 1).astype(np.int64)


def _scaled_e2m1(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """E2M1 codes of ``x / 2^floor(log2 scale)``: the division by a power of two is done
    exactly in float64, then one RNE + saturation to ±6 (a zero/NaN/Inf scale gives NaN -> +6
    per :func:`formats.encode_e2m1`; undefined in the ISA)."""
    x64 = np.asarray(x).astype(np.float64)
    y = np.ldexp(x64, -scale_exponent(scale))
    s = np.asarray(scale, np.float32)
    bad = ~np.isfinite(s) | (s == 0)
    with np.errstate(over="ignore"):
        y32 = np.where(bad, np.float32(np.nan), y.astype(np.float32))
    return formats.encode_e2m1(y32).astype(np.uint32)


def _replace_byte(old: np.ndarray, byte: np.ndarray, sel: int) -> np.ndarray:
    old_u = np.asarray(old).astype(np.int64).astype(np.uint32)
    shift = np.uint32(8 * sel)
    keep = old_u & ~np.uint32(0xFF << (8 * sel))
    return (keep | (byte.astype(np.uint32) << shift)).view(np.int32)


def cvt_scalef32_pk_fp4_f32(old: np.ndarray, src0: np.ndarray, src1: np.ndarray,
                            scale: np.ndarray, byte_sel: int) -> np.ndarray:
    """``v_cvt_scalef32_pk_fp4_f32`` (op ``rocdl.cvt.scalef32.pk.fp4.f32``).

    ``src0`` and ``src1`` are divided by the scale's power of two, rounded to E2M1 (RNE,
    saturating to ±6), and packed into one byte (``src0`` in the low nibble); the byte
    replaces byte ``byte_sel`` (0..3) of ``old`` (int32), the other bytes are kept.
    """
    if not 0 <= int(byte_sel) <= 3:
        raise ValueError(f"cvt.scalef32.pk.fp4: byte_sel must be 0..3, got {byte_sel}")
    byte = _scaled_e2m1(src0, scale) | (_scaled_e2m1(src1, scale) << 4)
    return _replace_byte(old, byte, int(byte_sel))


def cvt_scalef32_pk_fp4_bf16(old: np.ndarray, src: np.ndarray, scale: np.ndarray,
                             byte_sel: int) -> np.ndarray:
    """``v_cvt_scalef32_pk_fp4_bf16`` (op ``rocdl.cvt.scalef32.pk.fp4.bf16``): as
    :func:`cvt_scalef32_pk_fp4_f32` with the two inputs taken from ``src[..., 0]`` (low nibble)
    and ``src[..., 1]`` of a ``vector<2xbf16>`` (widened to float32 exactly)."""
    src = np.asarray(src)
    f = src.astype(np.float32)
    return cvt_scalef32_pk_fp4_f32(old, f[..., 0], f[..., 1], scale, byte_sel)


def cvt_scalef32_pk_f32_fp4(src: np.ndarray, scale: np.ndarray, byte_sel: int) -> np.ndarray:
    """``v_cvt_scalef32_pk_f32_fp4`` (op ``rocdl.cvt.scalef32.pk.f32.fp4``): the two E2M1
    codes of byte ``byte_sel`` of ``src`` (low nibble first) times 2^floor(log2 scale), as
    ``vector<2xf32>`` (shape ``[..., 2]``)."""
    word = np.asarray(src).astype(np.int64).astype(np.uint32)
    byte = (word >> np.uint32(8 * int(byte_sel))) & np.uint32(0xFF)
    lo = formats.decode_e2m1(byte & 0xF).astype(np.float64)
    hi = formats.decode_e2m1(byte >> 4).astype(np.float64)
    e = scale_exponent(scale)
    out = np.stack([np.ldexp(lo, e), np.ldexp(hi, e)], axis=-1)
    return out.astype(np.float32)


def cvt_scalef32_pk_bf16_fp4(src: np.ndarray, scale: np.ndarray, byte_sel: int) -> np.ndarray:
    """``v_cvt_scalef32_pk_bf16_fp4``: as :func:`cvt_scalef32_pk_f32_fp4`, rounded (RNE) to
    ``vector<2xbf16>``."""
    return cvt_scalef32_pk_f32_fp4(src, scale, byte_sel).astype(ml_dtypes.bfloat16)

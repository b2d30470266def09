"""Block-scaled formats (NVFP4, MXFP4, MXFP8) and their bit-exact numpy codecs.

The codecs here are the ISA definitions that the reference and the interpreter share
(SEMANTICS.md §1.1-§1.2, Decisions D2-D6). Every function is vectorized over numpy arrays and
returns new arrays; scalars are accepted and give 0-d arrays.

Byte conventions:

* E2M1 (FP4) codes are ``uint8`` values 0..15 (bit 3 = sign). FP4 tensors are stored packed,
  two codes per ``uint8`` byte, element ``2j`` in the low nibble of byte ``j`` (:func:`pack_fp4`).
  So a format's ``elem_dtype`` is ``np.uint8`` for FP4 and the logical K is twice the bytes.
* E4M3FN bytes: bias 7, max 448, ``0x7F``/``0xFF`` NaN, no Inf.
* E8M0 bytes: value ``2**(b - 127)``; ``0x00`` is 2**-127 (not zero), ``0xFF`` is NaN.

ml_dtypes is used where its rounding is the required one (E4M3 RNE for finite in-range
values, and E2M1 RNE); what it lacks (saturation, the NaN byte, E8M0 round-up) is written here.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

import ml_dtypes
import numpy as np

ScaleRounding = Literal["up", "even", "floor"]
"""E8M0 block-scale rounding (D4): "up" = 2^ceil(log2 s) (NVIDIA, cvt.rp.ue8m0),
"even" = MAX's AMD mode (amax rounded half-up to one mantissa bit, exponent - emax_elem),
"floor" = OCP MX v1.0 (floor(log2 amax) - emax_elem)."""

SCALE_ROUNDINGS: tuple[str, ...] = get_args(ScaleRounding)

E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_NAN = 0x7F
E8M0_NAN = 0xFF

#: Decoded value of E2M1 codes 0..15 (code 8 is -0.0).
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)

#: float32 nearest to 1/6 and to 1/448 (D2).
RECIP_E2M1_MAX = np.float32(1.0) / np.float32(6.0)
RECIP_E4M3_MAX = np.float32(1.0) / np.float32(448.0)


@dataclasses.dataclass(frozen=True)
class Format:
    """A block-scaled format.

    Attributes:
        name: "nvfp4", "mxfp4" or "mxfp8".
        block_size: elements per scale (16 for NVFP4, 32 for MX).
        elem_dtype: storage dtype of the data: ``np.uint8`` (packed FP4 pairs) or
            ``ml_dtypes.float8_e4m3fn``.
        scale_dtype: ``float8_e4m3fn`` (NVFP4) or ``float8_e8m0fnu`` (MX).
        elem_max: largest element magnitude (6 or 448).
        elem_emax: exponent of the largest element (2 for E2M1, 8 for E4M3), used by the
            "even" and "floor" E8M0 roundings.
        default_scale_rounding: "up" for MX formats; None for NVFP4, whose E4M3 block scale is
            always round-to-nearest-even (D3) and takes no ``scale_rounding``.
    """

    name: str
    block_size: int
    elem_dtype: np.dtype
    scale_dtype: np.dtype
    elem_max: float
    elem_emax: int
    default_scale_rounding: ScaleRounding | None

    @property
    def is_fp4(self) -> bool:
        """True when elements are E2M1 packed two per byte."""
        return self.elem_dtype == np.dtype(np.uint8)

    @property
    def is_mx(self) -> bool:
        """True for the E8M0-scaled formats (MXFP4, MXFP8)."""
        return self.scale_dtype == np.dtype(ml_dtypes.float8_e8m0fnu)

    @property
    def scale_recip(self) -> np.float32:
        """f32(1/elem_max), the factor of D2."""
        return RECIP_E2M1_MAX if self.is_fp4 else RECIP_E4M3_MAX

    def kblocks(self, k: int) -> int:
        """Number of scale blocks along a logical K (the last one may be partial, D7)."""
        return -(-k // self.block_size)

    def data_cols(self, k: int) -> int:
        """Columns of the stored data for logical K (K/2 bytes for FP4)."""
        return k // 2 if self.is_fp4 else k

    def check_k(self, k: int, arg: str = "k") -> None:
        """Raise ValueError when K is not valid for this format (D7: FP4 needs even K)."""
        if not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"{arg} must be a non-negative int, got {k!r}")
        if self.is_fp4 and k % 2:
            raise ValueError(f"{arg} must be even for {self.name} (two FP4 per byte), got {k}")

    def resolve_scale_rounding(self, rounding: str | None) -> ScaleRounding | None:
        """Validate ``rounding`` for this format; None gives the default."""
        if not self.is_mx:
            if rounding is not None:
                raise ValueError(f"scale_rounding must be None for {self.name} (its E4M3 scale "
                                 f"is always round-to-nearest-even), got {rounding!r}")
            return None
        if rounding is None:
            return self.default_scale_rounding
        if rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"scale_rounding must be one of {SCALE_ROUNDINGS}, got {rounding!r}")
        return rounding  # type: ignore[return-value]

    @staticmethod
    def from_name(name: str | Format) -> Format:
        """The format called ``name`` ("nvfp4", "mxfp4", "mxfp8", any case)."""
        if isinstance(name, Format):
            return name
        if not isinstance(name, str):
            raise TypeError(f"fmt: format name must be a str or Format, got {type(name).__name__}")
        fmt = _BY_NAME.get(name.lower())
        if fmt is None:
            raise ValueError(f"fmt: unknown format {name!r}; expected one of {sorted(_BY_NAME)}")
        return fmt

    def __repr__(self) -> str:
        return f"Format({self.name})"


NVFP4 = Format("nvfp4", 16, np.dtype(np.uint8), np.dtype(ml_dtypes.float8_e4m3fn), 6.0, 2, None)
MXFP4 = Format("mxfp4", 32, np.dtype(np.uint8), np.dtype(ml_dtypes.float8_e8m0fnu), 6.0, 2, "up")
MXFP8 = Format("mxfp8", 32, np.dtype(ml_dtypes.float8_e4m3fn),
               np.dtype(ml_dtypes.float8_e8m0fnu), 448.0, 8, "up")
_BY_NAME = {f.name: f for f in (NVFP4, MXFP4, MXFP8)}
FORMATS: tuple[Format, ...] = (NVFP4, MXFP4, MXFP8)


class FormatSpec:
    """Base of the kernel specs (frozen dataclasses) that name their format in a field
    ``fmt``: ``spec.format`` is that :class:`Format`. Adds no dataclass field."""

    @property
    def format(self) -> Format:
        return Format.from_name(self.fmt)  # type: ignore[attr-defined]


def _f32(x: np.ndarray | float) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _bytes(b: np.ndarray | int) -> np.ndarray:
    b = np.asarray(b)
    if b.dtype.itemsize == 1 and b.dtype.kind != "b":
        return b.view(np.uint8)
    return b.astype(np.uint8)


# ---- E2M1 -----------------------------------------------------------------------------------

def encode_e2m1(x: np.ndarray | float) -> np.ndarray:
    """float32 -> E2M1 codes (uint8 0..15), as ``cvt.rn.satfinite.e2m1x2.f32``.

    Round to nearest, ties to the even code; |x| > 6 (and ±Inf) saturate to ±6; the sign is
    kept, so -0.0 and tiny negatives give 0x8 (D6). NaN gives 0x7 (+6), the PTX satfinite
    result; the quantizers never feed NaN here (D5 zeroes non-finite blocks).
    """
    x = _f32(x)
    # ml_dtypes rounds RNE to float4_e2m1fn (tested against the tie table); it has no
    # saturation we rely on, so clip to ±6 first (every |x| >= 6 rounds to 6 when saturating).
    codes = np.clip(x, -E2M1_MAX, E2M1_MAX).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    return np.where(np.isnan(x), np.uint8(0x7), codes).astype(np.uint8)


def decode_e2m1(codes: np.ndarray | int) -> np.ndarray:
    """E2M1 codes (low 4 bits of each byte) -> float32."""
    return E2M1_VALUES[_bytes(codes) & 0xF]


def pack_fp4(codes: np.ndarray) -> np.ndarray:
    """Pack E2M1 codes ``[..., K]`` (K even) into bytes ``[..., K/2]``: element 2j -> low nibble."""
    codes = _bytes(codes)
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(f"codes must have an even last dimension, got shape {codes.shape}")
    return ((codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)).astype(np.uint8)


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    """Unpack bytes ``[..., K/2]`` into E2M1 codes ``[..., K]`` (low nibble first)."""
    packed = _bytes(packed)
    if packed.ndim == 0:
        raise ValueError("packed must have at least one dimension, got a scalar")
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    return out


# ---- E4M3FN ---------------------------------------------------------------------------------

def encode_e4m3(x: np.ndarray | float) -> np.ndarray:
    """float32 -> E4M3FN bytes: RNE, saturating to ±448 (0x7E/0xFE), ±Inf -> ±448, NaN -> 0x7F.

    ml_dtypes rounds finite values RNE but turns overflow into NaN, so values are clipped to
    ±448 first (every |x| >= 448 rounds to 448 under saturation).
    """
    x = _f32(x)
    b = np.clip(x, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return np.where(np.isnan(x), np.uint8(E4M3_NAN), b).astype(np.uint8)


def decode_e4m3(b: np.ndarray | int) -> np.ndarray:
    """E4M3FN bytes -> float32 (0x7F/0xFF -> NaN). Exact."""
    return _bytes(b).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


# ---- E8M0 -----------------------------------------------------------------------------------

def encode_e8m0_up(x: np.ndarray | float) -> np.ndarray:
    """float32 -> E8M0 bytes rounding toward +Inf (``cvt.rp.ue8m0x2.f32``): 2^ceil(log2 x).

    NaN and +Inf give 0xFF, 0 gives 0x00; finite results are clamped to [0, 254] (so
    x <= 2^-127 gives 0x00 and x > 2^127 gives 0xFE). ml_dtypes rounds to nearest, so this is
    done on the float32 bits. Negative inputs raise ValueError (scales are non-negative).
    """
    x = _f32(x)
    if np.any(x < 0):
        raise ValueError("x must be non-negative for E8M0, got negative values")
    bits = x.view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int32)
    man = bits & 0x7FFFFF
    # Normal: 2^(e-127) * (1 + m) rounds up to 2^(e-127+1) when m != 0.
    biased = exp + (man != 0)
    # Subnormal (exp 0): m * 2^-149 <= 2^-127 iff m <= 2^22.
    biased = np.where(exp == 0, (man > (1 << 22)).astype(np.int32), biased)
    out = np.clip(biased, 0, 254).astype(np.uint8)
    return np.where(~np.isfinite(x), np.uint8(E8M0_NAN), out).astype(np.uint8)


def decode_e8m0(b: np.ndarray | int) -> np.ndarray:
    """E8M0 bytes -> float32: 2^(b-127); 0x00 -> 2^-127 (a subnormal), 0xFF -> NaN."""
    b = _bytes(b)
    v = np.ldexp(np.float32(1.0), np.minimum(b, 254).astype(np.int32) - 127).astype(np.float32)
    return np.where(b == E8M0_NAN, np.float32(np.nan), v).astype(np.float32)


def e8m0_scale_from_amax(amax: np.ndarray | float, fmt: Format,
                         rounding: ScaleRounding | None = None) -> np.ndarray:
    """E8M0 block-scale byte for block maxima ``amax`` (float32, >= 0), per D2/D4/D5.

    * "up": ``encode_e8m0_up(amax * f32(1/elem_max))`` in float32;
    * "even": the float32 bits of amax plus ``1 << 21`` (round to one mantissa bit, half up),
      biased exponent minus ``elem_emax``;
    * "floor": ``floor(log2 amax) - elem_emax``, biased.

    The byte is clamped to [0, 254]; amax 0 gives 0x00; NaN or Inf amax gives 0xFF (D5).
    """
    if not isinstance(fmt, Format) or not fmt.is_mx:
        raise ValueError(f"fmt must be an MX format (mxfp4, mxfp8), got {fmt!r}")
    rounding = fmt.resolve_scale_rounding(rounding)
    a = _f32(amax)
    if np.any(a < 0):
        raise ValueError("amax must be non-negative, got negative values")
    finite = np.isfinite(a)
    af = np.where(finite, a, np.float32(0))
    if rounding == "up":
        out = encode_e8m0_up(af * fmt.scale_recip)
    else:
        bits = af.view(np.uint32).astype(np.int64)
        if rounding == "even":
            exp = ((bits + (1 << 21)) >> 23) & 0x1FF
        else:  # floor: floor(log2 amax) + 127, also for subnormal amax
            exp = np.where(bits >= (1 << 23), bits >> 23,
                           127 + np.frexp(af.astype(np.float64))[1] - 1)
        out = np.where(af == 0, 0, np.clip(exp - fmt.elem_emax, 0, 254)).astype(np.uint8)
    return np.where(finite, out, np.uint8(E8M0_NAN)).astype(np.uint8)


def nvfp4_scale_from_amax(amax: np.ndarray | float,
                          tensor_sf: np.ndarray | float = 1.0) -> np.ndarray:
    """NVFP4 E4M3 block-scale byte: ``encode_e4m3(tensor_sf * (amax * f32(1/6)))`` (D2, D3).

    NaN or Inf amax gives 0x7F (D5).
    """
    a = _f32(amax)
    finite = np.isfinite(a)
    s = _f32(tensor_sf) * (np.where(finite, a, np.float32(0)) * RECIP_E2M1_MAX)
    return np.where(finite, encode_e4m3(s), np.uint8(E4M3_NAN)).astype(np.uint8)

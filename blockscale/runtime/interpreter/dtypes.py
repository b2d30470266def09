"""MLIR types -> numpy dtypes, and the bit-level float conversions the interpreter uses.

Representation of interpreter values (see ``frame.py``):

* signless integers ``iN`` are signed numpy integers of the same width (``i1`` is ``bool``),
  ``index`` is ``int64``; unsigned ops view them as ``uintN``;
* floats are their numpy / ml_dtypes type (``bf16`` -> ``ml_dtypes.bfloat16``, ``f8E4M3FN`` ->
  ``float8_e4m3fn``, ...). float32 arithmetic stays in float32.

This module imports nothing from mlir: the caller passes the type's string spelling
(``str(ir.Type)``), which keeps the mapping cheap and cacheable.
"""

from __future__ import annotations

import functools
import re

import ml_dtypes
import numpy as np

_FLOATS: dict[str, np.dtype] = {
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f8E4M3FN": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "f8E8M0FNU": np.dtype(ml_dtypes.float8_e8m0fnu),
    "f4E2M1FN": np.dtype(ml_dtypes.float4_e2m1fn),
}
_INTS = {1: np.dtype(np.bool_), 8: np.dtype(np.int8), 16: np.dtype(np.int16),
         32: np.dtype(np.int32), 64: np.dtype(np.int64)}
_UNSIGNED = {np.dtype(np.int8): np.dtype(np.uint8), np.dtype(np.int16): np.dtype(np.uint16),
             np.dtype(np.int32): np.dtype(np.uint32), np.dtype(np.int64): np.dtype(np.uint64),
             np.dtype(np.bool_): np.dtype(np.bool_)}


@functools.cache
def scalar_dtype(type_str: str) -> np.dtype:
    """numpy dtype of a scalar MLIR type spelled ``type_str`` ("i32", "index", "bf16", ...)."""
    if type_str == "index":
        return np.dtype(np.int64)
    if type_str in _FLOATS:
        return _FLOATS[type_str]
    m = re.fullmatch(r"i(\d+)", type_str)
    if m and int(m.group(1)) in _INTS:
        return _INTS[int(m.group(1))]
    raise NotImplementedError(f"interpreter: unsupported scalar type {type_str}")


@functools.cache
def parse_vector(type_str: str) -> tuple[tuple[int, ...], np.dtype] | None:
    """``vector<4x2xf32>`` -> ((4, 2), float32); None when ``type_str`` is not a vector."""
    m = re.fullmatch(r"vector<((?:\d+x)+)([^>]+)>", type_str)
    if not m:
        return None
    shape = tuple(int(d) for d in m.group(1).rstrip("x").split("x"))
    return shape, scalar_dtype(m.group(2))


@functools.cache
def value_dtype(type_str: str) -> tuple[tuple[int, ...], np.dtype]:
    """(per-thread shape, dtype) of a scalar or vector MLIR type."""
    vec = parse_vector(type_str)
    if vec is not None:
        return vec
    return (), scalar_dtype(type_str)


def unsigned(dtype: np.dtype) -> np.dtype:
    """The unsigned integer dtype of the same width (for ui ops)."""
    return _UNSIGNED[np.dtype(dtype)]


def is_float(dtype: np.dtype) -> bool:
    """True for numpy and ml_dtypes floating types."""
    return np.dtype(dtype) in _FLOATS.values()


def bit_width(dtype: np.dtype) -> int:
    """Width in bits of an interpreter dtype (i1 -> 1, f4E2M1FN -> 4)."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return 1
    if dt == np.dtype(ml_dtypes.float4_e2m1fn):
        return 4
    return dt.itemsize * 8


def bits_dtype(dtype: np.dtype) -> np.dtype:
    """The signed integer dtype holding the raw bits of ``dtype`` (same itemsize)."""
    return {1: np.dtype(np.int8), 2: np.dtype(np.int16), 4: np.dtype(np.int32),
            8: np.dtype(np.int64)}[np.dtype(dtype).itemsize]


def convert_float(x: np.ndarray, dst: np.dtype) -> np.ndarray:
    """Float -> float conversion with IEEE round-to-nearest-even (arith.extf / arith.truncf).

    ml_dtypes casts round to nearest even directly from the source type (no double rounding)
    and give NaN where the destination has no Inf; float32 -> float16 is numpy's RNE.
    """
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(dst)


def int_to_float(x: np.ndarray, dst: np.dtype, is_unsigned: bool) -> np.ndarray:
    """sitofp / uitofp with round-to-nearest-even.

    numpy converts int64 -> float32 with one rounding; narrow targets go through float64, which
    is exact for every integer of up to 53 bits, so the final cast is the only rounding for
    i32 and narrower sources.
    """
    src = x.view(unsigned(x.dtype)) if is_unsigned else x
    dst = np.dtype(dst)
    if dst in (np.dtype(np.float32), np.dtype(np.float64)):
        return src.astype(dst)
    return convert_float(src.astype(np.float64), dst)


def float_to_int(x: np.ndarray, dst: np.dtype, is_unsigned: bool) -> np.ndarray:
    """fptosi / fptoui: truncation toward zero. Out-of-range values are poison in MLIR; here
    they saturate (as the PTX ``cvt.rzi`` does) and NaN gives 0, so results stay deterministic."""
    dst = np.dtype(dst)
    tgt = unsigned(dst) if is_unsigned else dst
    f = np.asarray(x).astype(np.float64)
    if tgt == np.bool_:
        return np.trunc(np.nan_to_num(f)) != 0
    info = np.iinfo(tgt)
    f = np.nan_to_num(np.trunc(f), nan=0.0)
    f = np.clip(f, float(info.min), float(info.max))
    # float(info.max) may round up to 2**64 / 2**63: clamp in the integer domain.
    out = np.where(f >= float(info.max), info.max, f.astype(tgt) if f.size else f).astype(tgt)
    return out.view(dst)

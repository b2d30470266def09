"""Warp-level MMA and byte-permute intrinsics: ``nvvm.mma.sync``, ``nvvm.prmt``,
``nvvm.convert.f8x2.to.f16x2`` and ``llvm.extractvalue`` (of MMA result structs).

``nvvm.mma.sync`` (``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32``) is
modeled from the PTX ISA fragment layouts (``blockscale/compiler/arch/mma.py`` restates them):
the lanes of each warp are gathered into A [16x16], B [16x8] and C [16x8], ``D = A @ B + C``
is computed and scattered back. Every lane of a warp must be active (``.aligned``); a partial
warp raises. Numerics (the ISA leaves the order and internal precision of the sum
unspecified; products of bf16/f16 values are exact): the 16 products and c are summed in
float64 (exact whenever the terms span fewer than ~37 binades, e.g. all FP4-derived operands)
and rounded once to f32 with RNE ("exact sum, then one rounding").

An MMA result struct ``!llvm.struct<(f32, f32, f32, f32)>`` is represented as an array
``[T, 4]`` float32; ``llvm.extractvalue`` reads one column.
"""

from __future__ import annotations

import re
from typing import Any

import ml_dtypes
import numpy as np

from .compiler import Compiler, handles, type_str
from .frame import Frame


def _shape_of(op: Any) -> tuple[int, int, int]:
    m = re.search(r"m\s*=\s*(\d+),\s*n\s*=\s*(\d+),\s*k\s*=\s*(\d+)", str(op.attributes["shape"]))
    if m is None:
        raise NotImplementedError(f"interpreter: nvvm.mma.sync shape {op.attributes['shape']}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def _pairs(x: np.ndarray, elem: np.dtype) -> np.ndarray:
    """Per-thread 32-bit registers (i32 [T] or vector<2xT> [T, 2]) -> [T, 2] float64."""
    x = np.ascontiguousarray(x)
    if x.ndim == 1:  # i32 holding two 16-bit elements, element 0 in the low half
        x = x.astype(np.int32).view(np.uint16).reshape(-1, 2).view(elem)
    return x.astype(np.float64)


def _warps(f: Frame, what: str) -> np.ndarray:
    """Thread indices of the batch as [W, 32] (whole warps, all active), else raise."""
    ws = f.warp_size
    if ws != 32 or f.nthreads % 32:
        raise NotImplementedError(f"interpreter: {what} needs warps of 32 and a block of whole "
                                  f"warps, got warp {ws}, block of {f.nthreads}")
    if f.mask is not None:
        per_warp = f.mask.reshape(-1, 32)
        partial = per_warp.any(axis=1) & ~per_warp.all(axis=1)
        if partial.any():
            w = int(np.argmax(partial))
            raise RuntimeError(f"{what}: executed by {int(per_warp[w].sum())} of 32 lanes of "
                               f"warp {w % (f.nthreads // 32)} of "
                               f"{f.describe_block(w * 32 // f.nthreads)} (.aligned needs all)")
    return np.arange(f.T).reshape(-1, 32)


def mma_m16n8k16(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The m16n8k16 MMA of warps: ``a`` [W, 32, 4, 2], ``b`` [W, 32, 2, 2] (float64 element
    pairs per lane and register), ``c`` [W, 32, 4] float32 -> D [W, 32, 4] float32.

    Fragment maps (g = lane >> 2, t = lane % 4): A reg r holds rows g + 8 (r & 1),
    columns 2t + 8 (r >> 1) + {0, 1}; B reg r holds rows 2t + 8 r + {0, 1}, column g;
    C element i holds row g + 8 (i >> 1), column 2t + (i & 1).
    """
    w = a.shape[0]
    lane = np.arange(32)
    g, t = lane >> 2, lane & 3
    am = np.zeros((w, 16, 16))
    bm = np.zeros((w, 16, 8))
    cm = np.zeros((w, 16, 8))
    for r in range(4):
        for h in range(2):
            am[:, g + 8 * (r & 1), 2 * t + 8 * (r >> 1) + h] = a[:, :, r, h]
    for r in range(2):
        for h in range(2):
            bm[:, 2 * t + 8 * r + h, g] = b[:, :, r, h]
    for i in range(4):
        cm[:, g + 8 * (i >> 1), 2 * t + (i & 1)] = c[:, :, i]
    with np.errstate(all="ignore"):
        d = (np.einsum("wmk,wkn->wmn", am, bm) + cm).astype(np.float32)
    out = np.empty((w, 32, 4), np.float32)
    for i in range(4):
        out[:, :, i] = d[:, g + 8 * (i >> 1), 2 * t + (i & 1)]
    return out


@handles("nvvm.mma.sync")
def _mma_sync(op: Any, c: Compiler):
    shape = _shape_of(op)
    res_t = type_str(op.results[0])
    if shape != (16, 8, 16) or res_t != "!llvm.struct<(f32, f32, f32, f32)>":
        raise NotImplementedError(f"interpreter: nvvm.mma.sync of shape {shape} -> {res_t} "
                                  "(only m16n8k16 with f32 accumulators is modeled)")
    if "layoutA" in op.attributes and "row" not in str(op.attributes["layoutA"]) or \
            "layoutB" in op.attributes and "col" not in str(op.attributes["layoutB"]):
        raise NotImplementedError("interpreter: nvvm.mma.sync layouts other than row.col")
    ptx_a = str(op.attributes["multiplicandAPtxType"]) \
        if "multiplicandAPtxType" in op.attributes else ""
    a_type = type_str(op.operands[0])
    if "bf16" in ptx_a:
        elem = np.dtype(ml_dtypes.bfloat16)
    elif a_type == "vector<2xf16>" or "f16" in ptx_a:
        elem = np.dtype(np.float16)
    else:
        raise NotImplementedError(f"interpreter: nvvm.mma.sync with A {a_type} {ptx_a}")
    slots = c.slots(op.operands)
    if len(slots) != 10:
        raise NotImplementedError(f"interpreter: nvvm.mma.sync with {len(slots)} operands")
    a_s, b_s, c_s = slots[:4], slots[4:6], slots[6:]
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        idx = _warps(f, "nvvm.mma.sync")
        w = idx.shape[0]
        a = np.stack([_pairs(f.full(f.vals[s]), elem) for s in a_s], axis=1)
        b = np.stack([_pairs(f.full(f.vals[s]), elem) for s in b_s], axis=1)
        cc = np.stack([f.full(f.vals[s]).astype(np.float32) for s in c_s], axis=1)
        d = mma_m16n8k16(a.reshape(w, 32, 4, 2), b.reshape(w, 32, 2, 2),
                         cc.reshape(w, 32, 4))
        f.vals[out] = d.reshape(f.T, 4)
    return run


@handles("llvm.extractvalue")
def _extractvalue(op: Any, c: Compiler):
    src = c.slot(op.operands[0])
    out = c.slot(op.results[0])
    text = str(op.attributes["position"])  # "array<i64: 0>"
    pos = [int(x) for x in re.findall(r"-?\d+", text.split(":", 1)[-1])]
    if len(pos) != 1 or not type_str(op.operands[0]).startswith("!llvm.struct<(f32"):
        raise NotImplementedError(f"interpreter: llvm.extractvalue {pos} of "
                                  f"{type_str(op.operands[0])} (only MMA f32 structs)")
    p = pos[0]

    def run(f: Frame) -> None:
        f.vals[out] = np.ascontiguousarray(f.vals[src][:, p])
    return run


def prmt(lo: np.ndarray, hi: np.ndarray, selector: np.ndarray) -> np.ndarray:
    """``prmt.b32 d, lo, hi, sel`` (default mode): result byte i is byte ``sel[4i+2:4i]`` of
    the pool {hi, lo} (bytes 0-3 from lo), replaced by its sign bit replicated when
    ``sel[4i+3]`` is set. int32 arrays in and out."""
    lo_u = np.asarray(lo).astype(np.int64) & 0xFFFFFFFF
    hi_u = np.asarray(hi).astype(np.int64) & 0xFFFFFFFF
    pool = lo_u | (hi_u << 32)
    sel = np.asarray(selector).astype(np.int64) & 0xFFFF
    out = np.zeros(np.broadcast(lo_u, hi_u, sel).shape, np.int64)
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = (pool >> (8 * (nib & 7))) & 0xFF
        byte = np.where(nib & 8, np.where(byte & 0x80, 0xFF, 0), byte)
        out |= byte << (8 * i)
    return out.astype(np.uint32).view(np.int32)


@handles("nvvm.prmt")
def _prmt(op: Any, c: Compiler):
    mode = str(op.attributes["mode"])
    if "default" not in mode:
        raise NotImplementedError(f"interpreter: nvvm.prmt mode {mode}")
    slots = c.slots(op.operands)
    if len(slots) != 3:
        raise NotImplementedError("interpreter: nvvm.prmt without the hi operand")
    lo_s, hi_s, sel_s = slots
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        f.vals[out] = prmt(f.vals[lo_s], f.vals[hi_s], f.vals[sel_s])
    return run


@handles("nvvm.convert.f8x2.to.f16x2")
def _cvt_f8x2_f16x2(op: Any, c: Compiler):
    src = c.slot(op.operands[0])
    out = c.slot(op.results[0])
    src_ty = str(op.attributes["srcType"]) if "srcType" in op.attributes else ""
    relu = "relu" in op.attributes and str(op.attributes["relu"]) in ("true", "unit")
    if "E4M3FN" not in src_ty or relu:
        raise NotImplementedError(f"interpreter: nvvm.convert.f8x2.to.f16x2 from {src_ty}")

    def run(f: Frame) -> None:
        b = np.ascontiguousarray(f.vals[src]).astype(np.int8).view(ml_dtypes.float8_e4m3fn)
        f.vals[out] = b.astype(np.float16)  # exact; NaN codes give NaN
    return run

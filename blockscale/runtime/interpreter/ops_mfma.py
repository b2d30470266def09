"""AMD matrix-core ops: ``rocdl.mfma.scale.f32.{16x16x128,32x32x64}.f8f6f4`` (CDNA4) and
``rocdl.mfma.f32.16x16x16bf16.1k`` (CDNA3/CDNA4), modeled from the ISA's operand layouts.

The layouts (restated in ``blockscale/compiler/arch/mfma.py``; sources there), lane
``l = G' g + r`` with ``G'`` = 16 (16x16 shapes) or 32 (32x32x64):

* bf16 16x16x16: A lane (g, r) element t is A[r, 4 g + t]; B lane (g, r) element t is
  B[4 g + t, r]; D element e is D[4 g + e, r].
* scaled f8f6f4, G = K / 32 lane groups: FP4 nibble i of lane (g, r) is A[r, 32 g + i]
  (nibble 2j = low nibble of byte j of the little-endian registers); an 8-bit element in
  byte b is A[r, 16 G (b // 16) + 16 g + b % 16] (two 16-byte runs, half a K-step apart);
  B alike with its column r. The scale of row r, K-block g is byte ``opsel`` of
  lane (g, r)'s scale register, decoded as E8M0 (2^(byte - 127); 0xFF is NaN, so the
  products of that block are NaN). D element e is D[4 g + e, r] (16x16) or
  D[8 (e // 4) + 4 g + e % 4, r] (32x32).

Numerics (the ISA does not specify the internal order or precision): every product
``a * sa * b * sb`` is formed exactly in float64 (FP8 x FP8 products have <= 8 significant
bits; E8M0 scales are powers of two), the products and C are summed in float64 (exact while
the terms span fewer than ~38 binades) and rounded once to float32 with RNE: "exact sum, one
rounding", as for ``nvvm.mma.sync`` (ops_mma). Every lane of a wavefront must be active
(or none: a wavefront that branched around the MFMA).
FP6 operands (format codes 2, 3) raise NotImplementedError.
"""

from __future__ import annotations

import re
from typing import Any

import ml_dtypes
import numpy as np

from blockscale import formats

from .compiler import Compiler, handles, type_str
from .frame import Frame

WAVE = 64


def _waves(f: Frame, what: str) -> int:
    """Number of wavefronts in the batch; each must be fully active or fully inactive (a
    wavefront that branched around the MFMA: its results are unused), else raise."""
    if f.warp_size != WAVE or f.nthreads % WAVE:
        raise NotImplementedError(f"interpreter: {what} needs wavefronts of 64 and a block of "
                                  f"whole wavefronts, got warp {f.warp_size}, block of "
                                  f"{f.nthreads}")
    if f.mask is not None:
        per = f.mask.reshape(-1, WAVE)
        partial = ~per.all(axis=1) & per.any(axis=1)
        if partial.any():
            w = int(np.argmax(partial))
            raise RuntimeError(f"{what}: executed by {int(per[w].sum())} of 64 lanes of "
                               f"wavefront {w % (f.nthreads // WAVE)} of "
                               f"{f.describe_block(w * WAVE // f.nthreads)} (MFMA needs all)")
    return f.T // WAVE


def _elements(regs: np.ndarray, code: int, count: int) -> np.ndarray:
    """[..., nregs] uint32 registers -> the first ``count`` elements as float64 (format
    ``code``: 0 E4M3, 1 E5M2, 4 E2M1; elements in little-endian order)."""
    raw = np.ascontiguousarray(regs.astype(np.uint32)).view(np.uint8)
    if code == 4:
        nib = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(raw.shape[:-1] + (-1,))
        return formats.decode_e2m1(nib[..., :count]).astype(np.float64)
    if code == 0:
        return raw[..., :count].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    if code == 1:
        return raw[..., :count].view(ml_dtypes.float8_e5m2).astype(np.float64)
    raise NotImplementedError(f"interpreter: f8f6f4 MFMA element format code {code} "
                              "(only 0 E4M3, 1 E5M2, 4 E2M1 are modeled)")


def _k_of(code: int, groups: int, g: np.ndarray, e: np.ndarray) -> np.ndarray:
    """K index of element e of lane group g (see the module docstring)."""
    if code == 4:
        return 32 * g + e
    return 16 * groups * (e // 16) + 16 * g + e % 16


def _operand(regs: np.ndarray, code: int, rows: int, k: int) -> np.ndarray:
    """[W, 64, nregs] registers -> the [W, rows, k] matrix (A, or B transposed)."""
    groups = WAVE // rows
    vals = _elements(regs, code, 32)  # [W, 64, 32]
    lane = np.arange(WAVE)
    g, r = lane // rows, lane % rows
    e = np.arange(32)
    kk = _k_of(code, groups, g[:, None], e[None, :])  # [64, 32]
    out = np.zeros((regs.shape[0], rows, k))
    out[:, np.broadcast_to(r[:, None], kk.shape), kk] = vals
    return out


def _scales(reg: np.ndarray, opsel: int, rows: int) -> np.ndarray:
    """[W, 64] scale registers -> [W, rows, groups] decoded E8M0 (float64, 0xFF -> NaN)."""
    byte = (reg.astype(np.int64) >> (8 * opsel)) & 0xFF
    val = formats.decode_e8m0(byte.astype(np.uint8)).astype(np.float64)
    groups = WAVE // rows
    return val.reshape(-1, groups, rows).transpose(0, 2, 1)


def _d_rows(rows: int, n_acc: int) -> np.ndarray:
    """[64, n_acc] output row of element e of each lane (16x16 or 32x32 D layout)."""
    g = (np.arange(WAVE) // rows)[:, None]
    e = np.arange(n_acc)[None, :]
    if rows == 16:
        return 4 * g + e
    return 8 * (e // 4) + 4 * g + e % 4


def _gather_c(c: np.ndarray, rows: int) -> np.ndarray:
    """[W, 64, n_acc] accumulator registers -> [W, rows, rows] matrix."""
    rr = _d_rows(rows, c.shape[-1])
    cc = np.broadcast_to((np.arange(WAVE) % rows)[:, None], rr.shape)
    out = np.zeros((c.shape[0], rows, rows))
    out[:, rr, cc] = c
    return out


def _scatter_d(d: np.ndarray, rows: int, n_acc: int) -> np.ndarray:
    rr = _d_rows(rows, n_acc)
    cc = np.broadcast_to((np.arange(WAVE) % rows)[:, None], rr.shape)
    return d[:, rr, cc].astype(np.float32)


def mfma_scale(a: np.ndarray, b: np.ndarray, c: np.ndarray, cbsz: int, blgp: int,
               opsel_a: int, scale_a: np.ndarray, opsel_b: int, scale_b: np.ndarray
               ) -> np.ndarray:
    """The scaled f8f6f4 MFMA of whole wavefronts: ``a``/``b`` [W, 64, nregs] registers,
    ``c`` [W, 64, 4] (16x16x128) or [W, 64, 16] (32x32x64), scales [W, 64] -> D like ``c``."""
    n_acc = c.shape[-1]
    rows, k = {4: (16, 128), 16: (32, 64)}[n_acc]
    for name, v in (("opsel_a", opsel_a), ("opsel_b", opsel_b)):
        if not 0 <= v <= 3:
            raise ValueError(f"mfma.scale: {name} must be 0..3, got {v}")
    am = _operand(a, cbsz, rows, k) * np.repeat(_scales(scale_a, opsel_a, rows), 32, axis=2)
    bm = _operand(b, blgp, rows, k) * np.repeat(_scales(scale_b, opsel_b, rows), 32, axis=2)
    with np.errstate(all="ignore"):
        d = np.einsum("wmk,wnk->wmn", am, bm) + _gather_c(c.astype(np.float64), rows)
    return _scatter_d(d, rows, n_acc)


def mfma_bf16_16x16x16(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``v_mfma_f32_16x16x16_bf16`` of whole wavefronts: ``a``/``b`` [W, 64, 4] int16 (bf16
    bits), ``c`` [W, 64, 4] float32 -> D [W, 64, 4] float32."""
    lane = np.arange(WAVE)
    g, r = lane // 16, lane % 16
    kk = 4 * g[:, None] + np.arange(4)[None, :]
    rr = np.broadcast_to(r[:, None], kk.shape)
    mats = []
    for x in (a, b):
        vals = np.ascontiguousarray(x.astype(np.int16)).view(ml_dtypes.bfloat16)
        m = np.zeros((x.shape[0], 16, 16))
        m[:, rr, kk] = vals.astype(np.float64)
        mats.append(m)
    with np.errstate(all="ignore"):
        d = np.einsum("wmk,wnk->wmn", mats[0], mats[1]) + _gather_c(c.astype(np.float64), 16)
    return _scatter_d(d, 16, 4)


def _uniform_int(f: Frame, slot: int, what: str) -> int:
    v = np.asarray(f.vals[slot]).reshape(-1)
    if v.size == 0 or not np.all(v == v[0]):
        raise RuntimeError(f"{what} must be a wave-uniform immediate")
    return int(v[0])


def _regs(f: Frame, slot: int, w: int) -> np.ndarray:
    x = np.asarray(f.full(f.vals[slot]))
    return x.reshape(w, WAVE, -1)


@handles("rocdl.mfma.scale.f32.16x16x128.f8f6f4", "rocdl.mfma.scale.f32.32x32x64.f8f6f4")
def _mfma_scale(op: Any, c: Compiler):
    name = op.operation.name
    slots = c.slots(op.operands)
    if len(slots) != 9:
        raise NotImplementedError(f"interpreter: {name} with {len(slots)} operands (expected "
                                  "a, b, c, cbsz, blgp, opsel_a, scale_a, opsel_b, scale_b)")
    a_s, b_s, c_s, cbsz_s, blgp_s, osa_s, sa_s, osb_s, sb_s = slots
    out = c.slot(op.results[0])
    n_acc = 4 if "16x16x128" in name else 16
    if not re.fullmatch(rf"vector<{n_acc}xf32>", type_str(op.results[0])):
        raise NotImplementedError(f"interpreter: {name} -> {type_str(op.results[0])}")

    def run(f: Frame) -> None:
        w = _waves(f, name)
        imm = [_uniform_int(f, s, f"{name} operand {i}")
               for i, s in ((3, cbsz_s), (4, blgp_s), (5, osa_s), (7, osb_s))]
        cbsz, blgp, osa, osb = imm
        d = mfma_scale(_regs(f, a_s, w), _regs(f, b_s, w), _regs(f, c_s, w), cbsz, blgp, osa,
                       np.asarray(f.full(f.vals[sa_s])).reshape(w, WAVE), osb,
                       np.asarray(f.full(f.vals[sb_s])).reshape(w, WAVE))
        f.vals[out] = d.reshape(f.T, n_acc)
    return run


@handles("rocdl.mfma.f32.16x16x16bf16.1k")
def _mfma_bf16(op: Any, c: Compiler):
    name = op.operation.name
    slots = c.slots(op.operands)
    if len(slots) != 6:
        raise NotImplementedError(f"interpreter: {name} with {len(slots)} operands")
    a_s, b_s, c_s = slots[:3]
    imm_s = slots[3:]
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        w = _waves(f, name)
        if any(_uniform_int(f, s, f"{name} cbsz/abid/blgp") for s in imm_s):
            raise NotImplementedError(f"interpreter: {name} with broadcast controls "
                                      "(cbsz/abid/blgp != 0)")
        d = mfma_bf16_16x16x16(_regs(f, a_s, w), _regs(f, b_s, w), _regs(f, c_s, w))
        f.vals[out] = d.reshape(f.T, 4)
    return run

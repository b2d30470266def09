"""Shared helpers of the quantize tests (interpreter and GPU; not a test module, no MLIR)."""

from __future__ import annotations

import ml_dtypes
import numpy as np


def assert_same_bytes(got, want, what: str = "") -> None:
    """``got`` and ``want`` have the same shape and the same bytes (bit-exact, NaN payloads
    included); the message names the first differing byte."""
    where = f"{what}: " if what else ""
    g, w = np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8)
    assert g.shape == w.shape, f"{where}shape {g.shape} != {w.shape}"
    bad = np.argwhere(g != w)
    assert bad.size == 0, (f"{where}{len(bad)} of {g.size} bytes differ, first at "
                           f"{tuple(bad[0])}: {g[tuple(bad[0])]:#04x} vs {w[tuple(bad[0])]:#04x}")


def uniform_bf16(m: int, k: int, seed: int, scale: float = 1.0) -> np.ndarray:
    """bf16 ``[m, k]`` of uniform(-1, 1) * scale values (seeded)."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (m, k)) * scale).astype(np.float32).astype(ml_dtypes.bfloat16)


def group_offsets(counts) -> tuple[np.ndarray, np.ndarray]:
    """``(expert_start, scales_offsets)`` int32 for groups of ``counts`` rows, each group's
    scale rows starting on its own 128-row tile."""
    counts = np.asarray(counts)
    es = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    aligned = np.concatenate([[0], np.cumsum(-(-counts // 128))])
    return es, (aligned[:-1] - es[:-1] // 128).astype(np.int32)


def e2m1_grid_codes_numpy(v: np.ndarray, domain: str) -> np.ndarray:
    """numpy model of ``convert._e2m1x8_grid_codes`` per element for f32 values ``v >= 0`` of
    ``domain`` (``"u" = |y| / 8`` or ``"y" = |y|``): ``t = fma(v, v, bias)`` (v * v + bias is
    exact in f64, so one rounding to f32 is the fma), ``T = bits(t) & 0x7F800000``, ``s =
    fma(T, magic, v)`` (T * magic exact in f64: one rounding), the code as the low byte of
    ``bits(s) + (bits(s) >> 22)``; asserts the pair formula's high-nibble byte agrees."""
    from blockscale.compiler.arch import convert as C

    bias, magic = C._E2M1_GRID[domain]
    v = np.asarray(v, np.float32).astype(np.float64)
    t = (v * v + bias).astype(np.float32)
    tb = (t.view(np.uint32) & np.uint32(0x7F800000)).view(np.float32).astype(np.float64)
    sb = (tb * magic + v).astype(np.float32).view(np.uint32).astype(np.uint64)
    code = (sb + (sb >> 22)) & 0xFF  # the low element of a pair
    assert np.array_equal(((sb << 4) + (sb >> 18)) & 0xFF, code << 4)  # the high element
    return code

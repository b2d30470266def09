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

"""Quantize test inputs shared by the interpreter and GPU tests (numpy + ml_dtypes only, so
GPU machines without MLIR can import them)."""

from __future__ import annotations

import ml_dtypes
import numpy as np


def _bf16(a) -> np.ndarray:
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16)


def _edge_input(m: int, k: int, seed: int) -> np.ndarray:
    """Random data with tie values, a near-zero row, NaN / Inf blocks and -0 sprinkled in."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32) * 3
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.0, 448.0, 464.0],
                    np.float32)
    x.flat[rng.integers(0, x.size, x.size // 8)] = rng.choice(ties, x.size // 8)
    x[1, :] = np.tile(np.array([0.0] + [1e-38] * 15, np.float32), -(-k // 16))[:k]
    if m > 4 and k > 40:
        x[2, 3] = np.nan
        x[3, 35] = np.inf
        x[4, 0] = -np.inf
    return _bf16(x)


def _all_bf16_blocks(shift: int, top: float) -> np.ndarray:
    """Every bf16 magnitude up to ``top`` (both signs, -0 included), 31 per 32-element block
    after a block maximum ``top``, all times 2^shift: the E8M0 scale is 2^shift times that
    of ``top`` and the products x * recip run over every bf16 value of their range (top 6,
    "up": [0, 6]; top 7.97: "up" [0, 4), "even" / "floor" [0, 8), incl. saturation)."""
    mags = np.arange(0, 0x4100, dtype=np.uint16)
    vals = np.concatenate([mags, mags | 0x8000]).view(ml_dtypes.bfloat16).astype(np.float32)
    vals = vals[np.abs(vals) <= top]
    blocks = -(-vals.size // 31)
    body = np.zeros(blocks * 31, np.float32)
    body[:vals.size] = vals
    x = np.concatenate([np.full((blocks, 1), top, np.float32), body.reshape(blocks, 31)], 1)
    rows = -(-blocks // 16)
    x = np.concatenate([x, np.zeros((rows * 16 - blocks, 32), np.float32)]).reshape(rows, 512)
    return (x.astype(np.float64) * 2.0 ** shift).astype(np.float32).astype(ml_dtypes.bfloat16)


def nvfp4_tie_blocks(m: int, k: int, tensor_sf: float, seed: int) -> np.ndarray:
    """f32 ``[m, k]`` (bf16-exact) of NVFP4 blocks whose ``y = x * recip`` land exactly on
    E2M1 ties and grid points: each 16-element block holds its amax ``A`` (a bf16 near
    2^127, so a tiny ``tensor_sf`` gives a reciprocal near or below 2^-126) and signed
    ``t * sd / tensor_sf`` for ties ``t`` (``sd`` the block's decoded E4M3 scale; few
    significant bits: bf16-exact when ``tensor_sf`` is a power of two), plus zeros."""
    from blockscale import formats as F

    rng = np.random.default_rng(seed)
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 3.0, 6.0, 0.0],
                    np.float32)
    x = np.zeros((m, k), np.float32)
    for r in range(m):
        for c in range(0, k, 16):
            a = _bf16(np.ldexp(rng.uniform(1, 2), int(rng.integers(120, 128)))).astype(
                np.float32)
            sd = F.decode_e4m3(F.nvfp4_scale_from_amax(a, tensor_sf)).astype(np.float64)
            vals = rng.choice(ties, 16) * sd / np.float64(tensor_sf)
            vals = np.where(vals <= a, vals, a) * rng.choice([-1.0, 1.0], 16)
            vals[int(rng.integers(0, 16))] = a
            x[r, c:c + 16] = vals[:min(16, k - c)]
    return _bf16(x).astype(np.float32)

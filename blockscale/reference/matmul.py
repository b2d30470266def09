"""Reference block-scaled matmuls: dense (§4), grouped MoE (§5), fused SwiGLU (§6), AMD (§4.5).

Accumulation. The kernels accumulate in fp32 in an order of their own. The reference
dequantizes every element exactly (an E2M1/E4M3 value times its decoded scale is exact in
float32) and by default sums the products in float64 (``accumulation="exact"``), then rounds
the sum once to float32: this is *not* fp32 accumulation, it is the exact result up to float64
rounding. A kernel's fp32 sum of the same K products differs from it by at most
``K * 2**-24 * sum_k |a_k * b_k|`` (first-order bound for any summation order), plus the final
output rounding. ``accumulation="float32"`` instead adds the products one K index at a time in
float32 (one rounding per add), a concrete fp32 model for tests that want one.
After the sum, alpha / expert scales are applied in float32, then the cast to the output dtype.
"""

from __future__ import annotations

from typing import Literal

import ml_dtypes
import numpy as np

from blockscale.activations import GatedActivation
from blockscale.formats import MXFP4, Format
from blockscale.layouts import SF_ATOM_ROWS, deinterleave, scale_shape
from blockscale.reference import _checks as C
from blockscale.reference.grouped import fused_silu_quantize, to_bf16_f32
from blockscale.reference.quantize import dequantize_rows

Accumulation = Literal["exact", "float32"]
_OUT_DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float32": np.dtype(np.float32)}


def _out_dtype(out_dtype: object) -> np.dtype:
    key = out_dtype if isinstance(out_dtype, str) else np.dtype(out_dtype).name  # type: ignore
    if key not in _OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {list(_OUT_DTYPES)}, got {out_dtype!r}")
    return _OUT_DTYPES[key]


def _dot(a: np.ndarray, b: np.ndarray, accumulation: Accumulation) -> np.ndarray:
    """float32 ``a [M, K] @ b [N, K].T`` -> float32 ``[M, N]`` (see the module docstring)."""
    if accumulation == "exact":
        return (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float32)
    if accumulation != "float32":
        raise ValueError(f"accumulation must be 'exact' or 'float32', got {accumulation!r}")
    acc = np.zeros((a.shape[0], b.shape[0]), dtype=np.float32)
    for kk in range(a.shape[1]):
        acc += np.multiply.outer(a[:, kk], b[:, kk])  # each product exact in float32
    return acc


def _operand(data: np.ndarray, scales_5d: np.ndarray, fmt: Format, k: int, arg: str,
             sarg: str) -> np.ndarray:
    """Validate a K-major operand with 5-D scales and dequantize it to float32 ``[rows, k]``."""
    data = C.data_arg(data, fmt, arg)
    if data.shape[1] != fmt.data_cols(k):
        raise ValueError(f"{arg}.shape[1] must be {fmt.data_cols(k)} for k={k}, "
                         f"got {data.shape[1]}")
    rows, j = data.shape[0], fmt.kblocks(k)
    C.scales_arg(scales_5d, fmt, sarg, scale_shape("tcgen5d", rows, j))
    return dequantize_rows(data, deinterleave(scales_5d, rows, j), fmt, k)


def naive_block_scaled_matmul(a: np.ndarray, b: np.ndarray, sfa: np.ndarray, sfb: np.ndarray,
                              fmt: Format | str, *, k: int, alpha: float = 1.0,
                              out_dtype: str = "bfloat16",
                              accumulation: Accumulation = "exact") -> np.ndarray:
    """``C[m, n] = alpha * sum_k dec(A[m,k]) dec(B[n,k]) |sA(m,k//SFV)| |sB(n,k//SFV)|`` (§4.1).

    Args:
        a: ``[M, K/2]`` uint8 (FP4) or ``[M, K]`` float8_e4m3fn (MXFP8), K-major.
        b: ``[N, K/2 | K]``, K-major ("transpose_b").
        sfa, sfb: 5-D scales of A over (M, K) and of B over (N, K).
        fmt: the format of both operands.
        k: the logical K.
        alpha: float32 factor on the accumulator (e.g. ``weight_scale_2 * input_scale``).
        out_dtype: "bfloat16" or "float32".
        accumulation: "exact" (float64 sum) or "float32" (sequential fp32 adds).
    """
    fmt = C.fmt_arg(fmt)
    if not isinstance(a, np.ndarray):
        raise TypeError(f"a must be a numpy array, got {type(a).__name__}")
    k = C.k_arg(fmt, k, a.shape[1] if a.ndim == 2 else -1)
    al = C.finite_scalar(alpha, "alpha")
    dt = _out_dtype(out_dtype)
    av = _operand(a, sfa, fmt, k, "a", "sfa")
    bv = _operand(b, sfb, fmt, k, "b", "sfb")
    return (_dot(av, bv, accumulation) * al).astype(dt)


def _grouped_acc(a: np.ndarray, w: np.ndarray, sfa: np.ndarray, sfb: np.ndarray,
                 expert_start: np.ndarray, a_scale_offsets: np.ndarray, expert_ids: np.ndarray,
                 expert_scales: np.ndarray | None, fmt: Format, k: int,
                 a_row_scales: np.ndarray | None, accumulation: Accumulation
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """float32 ``acc * expert_scale[e] (* a_row_scales[m])`` per row, zeros for inactive rows.

    Returns ``(out [T, N] float32, active_rows bool [T], expert_start, expert_ids)``.
    """
    a = C.data_arg(a, fmt, "a")
    w = C.data_arg(w, fmt, "w", ndim=3)
    k = C.k_arg(fmt, k, a.shape[1])
    if w.shape[2] != a.shape[1]:
        raise ValueError(f"w.shape[2] must be {a.shape[1]} (as a), got {w.shape[2]}")
    t, (e_count, n) = a.shape[0], w.shape[:2]
    j = fmt.kblocks(k)
    es, ids = C.groups(expert_start, expert_ids, t, num_experts=e_count)
    offs = C.int_vector(a_scale_offsets, "a_scale_offsets", len(ids))
    d1 = scale_shape("tcgen5d", 1, j)[1]
    sfa = C.array(sfa, "sfa", ndim=5, dtypes=(fmt.scale_dtype,))
    if sfa.shape[1:] != (d1, 32, 4, 4):
        raise ValueError(f"sfa must have shape (*, {d1}, 32, 4, 4), got {sfa.shape}")
    C.scales_arg(sfb, fmt, "sfb", (e_count, *scale_shape("tcgen5d", n, j)))
    if expert_scales is None:
        if not fmt.is_mx:
            raise ValueError("NVFP4 requires expert_scales (one per expert), got None")
        esc = np.ones(e_count, dtype=np.float32)
    else:
        esc = C.per_expert_vector(expert_scales, "expert_scales", positive=False)
        if esc.shape[0] != e_count:
            raise ValueError(f"expert_scales must have length {e_count}, got {esc.shape[0]}")
    row_sc = None
    if a_row_scales is not None:
        if fmt.is_mx:
            raise ValueError(f"a_row_scales is NVFP4 only, got fmt={fmt.name}")
        row_sc = C.array(a_row_scales, "a_row_scales", ndim=1)
        if row_sc.shape[0] != t:
            raise ValueError(f"a_row_scales must have length {t}, got {row_sc.shape[0]}")
        row_sc = row_sc.astype(np.float32)
    sfa_rows = deinterleave(sfa, sfa.shape[0] * SF_ATOM_ROWS, j)
    out = np.zeros((t, n), dtype=np.float32)
    active = np.zeros(t, dtype=bool)
    for g in range(len(ids)):
        s, e_, ex = int(es[g]), int(es[g + 1]), int(ids[g])
        if s == e_ or ex < 0:
            continue  # D8: id -1 / empty groups give zero rows
        r0 = (s // SF_ATOM_ROWS + int(offs[g])) * SF_ATOM_ROWS
        if r0 < 0 or r0 + (e_ - s) > sfa_rows.shape[0]:
            raise ValueError(f"a_scale_offsets[{g}] puts group {g}'s scale rows at "
                             f"[{r0}, {r0 + e_ - s}), outside sfa's {sfa_rows.shape[0]} rows")
        av = dequantize_rows(a[s:e_], sfa_rows[r0:r0 + (e_ - s)], fmt, k)
        bv = dequantize_rows(w[ex], deinterleave(sfb[ex], n, j), fmt, k)
        acc = _dot(av, bv, accumulation) * esc[ex]
        if row_sc is not None:
            acc = acc * row_sc[s:e_, None]
        out[s:e_] = acc
        active[s:e_] = True
    return out, active, es, ids


def grouped_matmul_block_scaled(a: np.ndarray, w: np.ndarray, sfa: np.ndarray, sfb: np.ndarray,
                                expert_start: np.ndarray, a_scale_offsets: np.ndarray,
                                expert_ids: np.ndarray, expert_scales: np.ndarray | None,
                                fmt: Format | str, *, k: int,
                                a_row_scales: np.ndarray | None = None,
                                accumulation: Accumulation = "exact") -> np.ndarray:
    """Grouped (MoE) block-scaled matmul (§5, D8), bfloat16 ``[T, N]``.

    Row m of group g (expert ``e = expert_ids[g]``) is ``bf16(acc * expert_scales[e]
    (* a_row_scales[m]))`` in float32, in that order (D10); A scales at 5-D row
    ``(expert_start[g]//128 + a_scale_offsets[g])*128 + (m - expert_start[g])``; weights
    ``w [E, N, K/2 | K]`` with 6-D scales ``sfb [E, ceil(N/128), ceil(J/4), 32, 4, 4]``.
    Rows of groups with id -1 are zero. ``expert_scales`` may be None for MX formats only.
    """
    fmt = C.fmt_arg(fmt)
    out, *_ = _grouped_acc(a, w, sfa, sfb, expert_start, a_scale_offsets, expert_ids,
                           expert_scales, fmt, k, a_row_scales, accumulation)
    return out.astype(ml_dtypes.bfloat16)


def sigma_permute_rows(w: np.ndarray) -> np.ndarray:
    """Concat ``[..., 2D, X]`` (gate rows then up rows) -> σ-interleaved rows
    ``(gate 0, up 0, gate 1, up 1, ...)`` (§6: row 2i = gate i, row 2i+1 = up i)."""
    two_d = w.shape[-2]
    if two_d % 2:
        raise ValueError(f"rows (axis -2) must be even, got {two_d}")
    d = two_d // 2
    order = np.stack([np.arange(d), np.arange(d) + d], axis=1).reshape(-1)
    return w[..., order, :]


def sigma_unpermute_rows(w: np.ndarray) -> np.ndarray:
    """Inverse of :func:`sigma_permute_rows`."""
    return np.concatenate([w[..., 0::2, :], w[..., 1::2, :]], axis=-2)


def grouped_matmul_swiglu(a: np.ndarray, w: np.ndarray, sfa: np.ndarray, sfb: np.ndarray,
                          expert_start: np.ndarray, a_scale_offsets: np.ndarray,
                          expert_ids: np.ndarray, expert_scales: np.ndarray | None,
                          input_scales: np.ndarray | None, fmt: Format | str, *, k: int,
                          activation: GatedActivation | str | None = GatedActivation.SILU,
                          a_row_scales: np.ndarray | None = None,
                          accumulation: Accumulation = "exact") -> tuple[np.ndarray, np.ndarray]:
    """Fused grouped matmul + gated activation + quantize (§6, D10).

    ``w`` (and ``sfb``) are σ-permuted: weight row 2i is gate i, row 2i+1 is up i, so
    ``w [E, 2D, K/2 | K]``. Per row: ``g, u = bf16(acc * expert_scale (* a_row_scale))``,
    ``z = activation(g, u)`` (float32, sigmoid with :func:`blockscale.activations.exp_f32`,
    not ``np.exp``), then NVFP4/MX quantize with ``1/input_scales[e]`` (expert id,
    D8) into scales of ``sfa.shape[0]`` row tiles placed with ``a_scale_offsets``.
    Byte-identical to :func:`grouped_matmul_block_scaled` on the un-permuted weights followed
    by :func:`fused_silu_quantize`.

    Returns ``(data [T, D/2 | D], scales [sfa.shape[0], ceil(ceil(D/SFV)/4), 32, 4, 4])``.
    """
    fmt = C.fmt_arg(fmt)
    acc, _, es, ids = _grouped_acc(a, w, sfa, sfb, expert_start, a_scale_offsets, expert_ids,
                                   expert_scales, fmt, k, a_row_scales, accumulation)
    if acc.shape[1] % 2:
        raise ValueError(f"w.shape[1] (2D) must be even, got {acc.shape[1]}")
    gate_up = to_bf16_f32(acc)
    concat = np.concatenate([gate_up[:, 0::2], gate_up[:, 1::2]], axis=1)
    return fused_silu_quantize(concat.astype(ml_dtypes.bfloat16), fmt, es, a_scale_offsets, ids,
                               input_scales, activation=activation,
                               num_scale_tiles=sfa.shape[0])


def _amd_operand(data: np.ndarray, scales: np.ndarray, k: int, arg: str, sarg: str,
                 lead: tuple[int, ...] = ()) -> np.ndarray:
    data = C.data_arg(data, MXFP4, arg, ndim=len(lead) + 2)
    rows = data.shape[-2]
    C.scales_arg(scales, MXFP4, sarg, (*data.shape[:-2], rows, k // 32))
    flat = data.reshape(-1, data.shape[-1])
    return dequantize_rows(flat, scales.reshape(-1, k // 32), MXFP4, k).reshape(
        *data.shape[:-1], k)


def _amd_k(b: np.ndarray) -> int:
    if not isinstance(b, np.ndarray) or b.ndim < 2:
        raise TypeError("b must be a numpy array with at least 2 dimensions")
    k = 2 * b.shape[-1]
    if k % 32:
        raise ValueError(f"K = 2 * b.shape[-1] must be a multiple of 32, got {k}")
    return k


def matmul_dynamic_block_scaled_mxfp4(a: np.ndarray, b: np.ndarray, a_scales: np.ndarray,
                                      b_scales: np.ndarray, *, out_dtype: str = "bfloat16",
                                      accumulation: Accumulation = "exact") -> np.ndarray:
    """AMD MXFP4 matmul with row-major scales (§4.5): ``a [M, K/2]``, ``b [N, K/2]``,
    ``a_scales [M, K/32]``, ``b_scales [N, K/32]`` (E8M0) -> ``[M, N]``; no alpha; K%32 == 0."""
    k = _amd_k(b)
    dt = _out_dtype(out_dtype)
    av = _amd_operand(a, a_scales, k, "a", "a_scales")
    bv = _amd_operand(b, b_scales, k, "b", "b_scales")
    return _dot(av, bv, accumulation).astype(dt)


def grouped_matmul_block_scaled_mxfp4(a: np.ndarray, b: np.ndarray, a_scales: np.ndarray,
                                      b_scales: np.ndarray, row_offsets: np.ndarray,
                                      expert_ids: np.ndarray, *, out_dtype: str = "bfloat16",
                                      accumulation: Accumulation = "exact") -> np.ndarray:
    """AMD grouped MXFP4 matmul (§4.5): ``a [M, K/2]``, ``b [E, N, K/2]``, row-major scales
    ``a_scales [M, K/32]``, ``b_scales [E, N, K/32]``; group g's rows
    ``[row_offsets[g], row_offsets[g+1])`` use expert ``expert_ids[g]``. Rows outside every
    group or of id -1 are 0."""
    k = _amd_k(b)
    dt = _out_dtype(out_dtype)
    av = _amd_operand(a, a_scales, k, "a", "a_scales")
    bv = _amd_operand(b, b_scales, k, "b", "b_scales", lead=(b.shape[0],))
    es, ids = C.groups(row_offsets, expert_ids, av.shape[0], num_experts=b.shape[0],
                       exact_total=False)
    out = np.zeros((av.shape[0], b.shape[1]), dtype=np.float32)
    for g in range(len(ids)):
        s, e_ = int(es[g]), int(es[g + 1])
        if s < e_ and ids[g] >= 0:
            out[s:e_] = _dot(av[s:e_], bv[ids[g]], accumulation)
    return out.astype(dt)


__all__ = [
    "grouped_matmul_block_scaled",
    "grouped_matmul_block_scaled_mxfp4",
    "grouped_matmul_swiglu",
    "matmul_dynamic_block_scaled_mxfp4",
    "naive_block_scaled_matmul",
    "sigma_permute_rows",
    "sigma_unpermute_rows",
]

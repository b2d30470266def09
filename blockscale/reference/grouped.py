"""Reference MoE ops: grouped quantize, fused SiLU quantize, moe_create_indices (§2.5, §7).

Grouped scale outputs use the padded, expert-relative 5-D placement of §2.5: group ``g``'s
scale rows start at 5-D row ``tile0(g) * 128`` with ``tile0(g) = expert_start[g] // 128 +
scales_offsets[g]``; every byte not owned by a row of an active group is zero (D7, D8).
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np

from blockscale.activations import GatedActivation
from blockscale.formats import Format
from blockscale.layouts import SF_ATOM_ROWS, interleave
from blockscale.reference import _checks as C
from blockscale.reference.quantize import quantize_rows


def group_tile_starts(expert_start: np.ndarray, scales_offsets: np.ndarray) -> np.ndarray:
    """``tile0(g) = expert_start[g] // 128 + scales_offsets[g]`` (int64, D12)."""
    return expert_start[:-1] // SF_ATOM_ROWS + scales_offsets


def _check_tiles(es: np.ndarray, ids: np.ndarray, tile0: np.ndarray, num_tiles: int,
                 arg: str) -> None:
    """Every active group's tiles lie inside the buffer and no two active groups overlap."""
    counts = np.diff(es)
    spans = []
    for g in range(len(counts)):
        if counts[g] == 0 or ids[g] < 0:
            continue
        first, n = int(tile0[g]), -(-int(counts[g]) // SF_ATOM_ROWS)
        if first < 0 or first + n > num_tiles:
            raise ValueError(f"{arg}[{g}] places group {g} at scale tiles [{first}, {first + n}), "
                             f"outside the {num_tiles} tiles of the output")
        spans.append((first, first + n, g))
    spans.sort()
    for (_, end, g0), (start, _, g1) in itertools.pairwise(spans):
        if start < end:
            raise ValueError(f"{arg} makes the scale tiles of groups {g0} and {g1} overlap")


def _quantize_groups(rows_f32: np.ndarray, fmt: Format, es: np.ndarray, ids: np.ndarray,
                     tile0: np.ndarray, num_tiles: int, tsf_by_expert: np.ndarray | None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Quantize each active group with its expert's tensor scale into zeroed outputs."""
    t, k = rows_f32.shape
    j = fmt.kblocks(k)
    data = np.zeros((t, fmt.data_cols(k)), dtype=fmt.elem_dtype)
    scales = np.zeros((num_tiles * SF_ATOM_ROWS, j), dtype=np.uint8)
    for g in range(len(ids)):
        s, e = int(es[g]), int(es[g + 1])
        if s == e or ids[g] < 0:
            continue  # D8: unused group -> zero rows and zero tiles
        tsf = np.float32(1.0) if tsf_by_expert is None else tsf_by_expert[ids[g]]
        d, sc = quantize_rows(rows_f32[s:e], fmt, tsf, fmt.default_scale_rounding)
        data[s:e] = d
        r0 = int(tile0[g]) * SF_ATOM_ROWS
        scales[r0:r0 + (e - s)] = sc.view(np.uint8)
    return data, interleave(scales.view(fmt.scale_dtype))


def _expert_tensor_sf(fmt: Format, values: object, ids: np.ndarray, arg: str,
                      invert: bool) -> np.ndarray | None:
    """Per-expert tensor scales for NVFP4 (required, D9); MX takes none or all ones."""
    if values is None:
        if not fmt.is_mx:
            raise ValueError(f"NVFP4 requires {arg} (one per expert), got None")
        return None
    v = C.per_expert_vector(values, arg)
    if fmt.is_mx:
        if np.any(v != 1):
            raise ValueError(f"{arg} must be None or 1.0 for {fmt.name} (D9), got {v.tolist()[:8]}")
        return None
    if np.any(ids >= v.shape[0]):
        raise ValueError(f"expert_ids must be < len({arg})={v.shape[0]}, got {ids.tolist()}")
    return (np.float32(1) / v).astype(np.float32) if invert else v


def grouped_quantize_dynamic_scaled(x: np.ndarray, fmt: Format | str, expert_start: np.ndarray,
                                    scales_offsets: np.ndarray, expert_ids: np.ndarray,
                                    tensor_sf: np.ndarray | None, *,
                                    indices: np.ndarray | None = None, indices_divisor: int = 1
                                    ) -> tuple[np.ndarray, np.ndarray]:
    """Quantize rows sorted by expert, one tensor scale per expert (§2.5, D7, D8, D9, D11).

    Args:
        x: bfloat16 ``[T_in, K]``.
        fmt: the format; MX formats use the default "up" E8M0 rounding.
        expert_start: ``[G+1]`` row prefix sums over ``num_rows`` (0 first, ``num_rows`` last).
        scales_offsets: ``[G]`` per-group scale-tile corrections (see the module docstring).
        expert_ids: ``[G]`` expert of each group, -1 for an unused group (zero output).
        tensor_sf: ``[E]`` float32 NVFP4 encode scales indexed by expert id (required for NVFP4);
            None (or ones) for MX formats.
        indices: optional ``[num_rows]``: permuted row i reads ``x[indices[i] // indices_divisor]``.
        indices_divisor: positive int divisor of ``indices``.

    Returns:
        ``(data [num_rows, K/2 | K], scales [ceil(num_rows/128) + min(G, num_rows), ceil(J/4),
        32, 4, 4])``; every byte not written by an active group's row is zero.
    """
    fmt = C.fmt_arg(fmt)
    xf = C.float_input(x)
    fmt.check_k(xf.shape[1], "x.shape[1]")
    if indices is not None:
        idx = C.int_vector(indices, "indices")
        if isinstance(indices_divisor, bool) or not isinstance(indices_divisor, (int, np.integer)) \
                or indices_divisor < 1:
            raise ValueError(f"indices_divisor must be a positive int, got {indices_divisor!r}")
        src = idx // int(indices_divisor)
        if np.any(idx < 0) or np.any(src >= xf.shape[0]):
            raise ValueError(f"indices // indices_divisor must be in [0, {xf.shape[0]}), got "
                             f"range [{idx.min() if idx.size else 0}, "
                             f"{src.max() if src.size else 0}]")
        xf = xf[src]
    elif indices_divisor != 1:
        raise ValueError(f"indices_divisor must be 1 without indices, got {indices_divisor!r}")
    num_rows = xf.shape[0]
    es, ids = C.groups(expert_start, expert_ids, num_rows)
    offs = C.int_vector(scales_offsets, "scales_offsets", len(ids))
    tsf = _expert_tensor_sf(fmt, tensor_sf, ids, "tensor_sf", invert=False)
    num_tiles = -(-num_rows // SF_ATOM_ROWS) + min(len(ids), num_rows)
    tile0 = group_tile_starts(es, offs)
    _check_tiles(es, ids, tile0, num_tiles, "scales_offsets")
    return _quantize_groups(xf, fmt, es, ids, tile0, num_tiles, tsf)


def fused_silu_quantize(gate_up: np.ndarray, fmt: Format | str, expert_start: np.ndarray,
                        scales_offsets: np.ndarray, expert_ids: np.ndarray,
                        input_scales: np.ndarray | None, *,
                        activation: GatedActivation | str | None = GatedActivation.SILU,
                        num_scale_tiles: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Gated activation then grouped quantize (§7.5, D8, D10).

    Args:
        gate_up: bfloat16 ``[T, 2D]`` in concat layout: gate = columns ``[0, D)``, up = ``[D, 2D)``.
        fmt: the output format (D even for FP4).
        expert_start, scales_offsets, expert_ids: as in :func:`grouped_quantize_dynamic_scaled`.
        input_scales: ``[E]`` NVFP4 activation scales indexed by expert id, *not* inverted
            (the encode scale is ``f32(1 / input_scales[e])``); required for NVFP4, None for MX.
        activation: ``GatedActivation.SILU`` (default) or ``SWIGLU_OAI``, in float32 with
            ``sigmoid(v) = 1 / (1 + exp_f32(-v))``: :func:`blockscale.activations.exp_f32` is
            blockscale's own float32 exp (a fixed IEEE mul/add sequence, < 1 ulp), the one the
            kernels emit, not ``np.exp`` (docs/internals.md, "Decision: exp").
        num_scale_tiles: row tiles of the scale output; default ``ceil(T/128) + G`` (§7.5).

    Returns:
        ``(data [T, D/2 | D], scales [num_scale_tiles, ceil(ceil(D/block)/4), 32, 4, 4])``.
    """
    fmt = C.fmt_arg(fmt)
    act = GatedActivation.parse(activation)
    gu = C.float_input(gate_up, "gate_up")
    if gu.shape[1] % 2:
        raise ValueError(f"gate_up.shape[1] must be even (gate then up), got {gu.shape[1]}")
    d = gu.shape[1] // 2
    fmt.check_k(d, "gate_up.shape[1] // 2")
    t = gu.shape[0]
    es, ids = C.groups(expert_start, expert_ids, t)
    offs = C.int_vector(scales_offsets, "scales_offsets", len(ids))
    tsf = _expert_tensor_sf(fmt, input_scales, ids, "input_scales", invert=True)
    if num_scale_tiles is None:
        num_scale_tiles = -(-t // SF_ATOM_ROWS) + len(ids)
    tile0 = group_tile_starts(es, offs)
    _check_tiles(es, ids, tile0, num_scale_tiles, "scales_offsets")
    z = act(gu[:, :d], gu[:, d:])
    return _quantize_groups(z, fmt, es, ids, tile0, num_scale_tiles, tsf)


def moe_create_indices(topk_ids: np.ndarray, num_experts: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                  np.ndarray]:
    """Bucket routed tokens by expert (§7.10), deterministically: by expert, then token.

    Args:
        topk_ids: ``[T*k]`` (or ``[T, k]``, flattened) expert ids in ``[0, num_experts)``.
        num_experts: E.

    Returns:
        ``(token_order [T*k], expert_start [E+1], restore_order [T*k], expert_ids [E],
        usage_stats [2], scales_offset [E])`` where ``token_order[i]`` is the flat topk index
        of permuted row i (so ``x[token_order // k]`` gathers tokens), ``restore_order`` its
        inverse, ``expert_ids`` lists the active experts ascending then -1 for unused slots,
        ``expert_start`` the row prefix sums over the slots, ``usage_stats = [max rows per
        expert, active experts]`` and ``scales_offset[g] = sum_{h<g} ceil(n_h/128) -
        expert_start[g] // 128``. All int32 except usage_stats and scales_offset (uint32).
    """
    if isinstance(num_experts, bool) or not isinstance(num_experts, (int, np.integer)) \
            or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    ids = np.asarray(topk_ids)
    if ids.size and ids.dtype.kind not in "iu":
        raise TypeError(f"topk_ids must be an integer array, got dtype {ids.dtype}")
    ids = ids.reshape(-1).astype(np.int64)
    if np.any((ids < 0) | (ids >= num_experts)):
        raise ValueError(f"topk_ids must be in [0, {num_experts}), got range "
                         f"[{ids.min()}, {ids.max()}]")
    token_order = np.argsort(ids, kind="stable")
    restore_order = np.empty_like(token_order)
    restore_order[token_order] = np.arange(ids.size)
    counts = np.bincount(ids, minlength=num_experts)
    active = np.flatnonzero(counts)
    expert_ids = np.full(num_experts, -1, dtype=np.int64)
    expert_ids[:active.size] = active
    slot_counts = np.zeros(num_experts, dtype=np.int64)
    slot_counts[:active.size] = counts[active]
    expert_start = np.concatenate([[0], np.cumsum(slot_counts)])
    tiles = -(-slot_counts // SF_ATOM_ROWS)
    aligned_tile0 = np.concatenate([[0], np.cumsum(tiles)[:-1]])
    scales_offset = aligned_tile0 - expert_start[:-1] // SF_ATOM_ROWS
    usage = np.array([counts.max(initial=0), active.size])
    return (token_order.astype(np.int32), expert_start.astype(np.int32),
            restore_order.astype(np.int32), expert_ids.astype(np.int32),
            usage.astype(np.uint32), scales_offset.astype(np.uint32))


def to_bf16_f32(v: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (RNE) and widen back to float32."""
    return v.astype(ml_dtypes.bfloat16).astype(np.float32)

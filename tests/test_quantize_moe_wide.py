"""Grouped and fused-SiLU quantize with 16-element chunks and the per-tile NVFP4 reciprocal
table, in the interpreter on all four targets, byte for byte against blockscale.reference.

The paths under test: aligned grouped / fused kernels quantize 16 elements per thread (a half
padding last chunk re-reads a valid sub-chunk of its scale block; rows of an unused expert are
quantized, then stored as zeros), and on CUDA targets the NVFP4 reciprocals of a tile's expert
come from a shared table refilled per tile (also with several tiles per block). Inputs carry
E2M1 / E4M3 tie values, NaN / Inf / -0, near-zero blocks and a tensor scale that makes the
reciprocal +inf (x = ±0 -> NaN code 0x7).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _quantize_helpers import assert_same_bytes, group_offsets
from _quantize_inputs import nvfp4_tie_blocks

from blockscale.reference import grouped as RG

pytest.importorskip("mlir")

from blockscale.ops import quantize_grouped as QG  # noqa: E402
from blockscale.ops import quantize_silu as QS  # noqa: E402

pytestmark = pytest.mark.interp
TARGETS = ("sm_90a", "sm_100a", "gfx942", "gfx950")


def _edges(m: int, k: int, seed: int) -> np.ndarray:
    """Ties, NaN / Inf, -0, a near-zero row (with -0) and a row of exact E2M1 midpoints."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32) * 3
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.0, 448.0, 464.0, -2.5],
                    np.float32)
    x.flat[rng.integers(0, x.size, x.size // 6)] = rng.choice(ties, x.size // 6)
    row = np.tile(np.array([0.0, -0.0] + [1e-38] * 6 + [-1e-38] * 8, np.float32), -(-k // 16))
    x[1, :] = row[:k]
    x[3, :] = np.resize(np.array([6.0, 0.25, 0.75, -1.25, 1.75, -2.5, 3.5, 5.0]), k)
    x[5, 3], x[6, k - 1], x[7, 8] = np.nan, np.inf, -np.inf
    x[140, :] = row[:k]  # near zero in the second group (an unused expert)
    return x.astype(ml_dtypes.bfloat16)


def _force_tile_loop(monkeypatch, whole_tiles: bool = False) -> None:
    """One tile per block step: every block loops over all tiles (tile_iters = n_tiles);
    ``whole_tiles``: one block part per tile, so a block visits all row groups of a tile (the
    ones past the tile's rows only write zero scale bytes)."""
    plan = QG.launch_plan

    def one_tile_per_step(spec, m, k, n_tiles):
        grid, sc = plan(spec, m, k, n_tiles)
        sc = dict(sc, tiles_per_step=1, tile_iters=n_tiles)
        if whole_tiles:
            sc["split_log2"] = 0
        return (grid[0], 1 << sc["split_log2"], 1), sc

    monkeypatch.setattr(QG, "launch_plan", one_tile_per_step)


# K = 72: the last 16-element chunk is half padding; group 1 (id -1) holds real data;
# tensor scale 1e38 on the near-zero row's expert: sd * (1/tsf) underflows, recip = +inf.
COUNTS, IDS, TSF = [130, 20, 60], [2, -1, 0], [0.43, 3.0, 1e38]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_grouped_wide_edges(fmt, target):
    es, offs = group_offsets(COUNTS)
    ids = np.asarray(IDS, np.int32)
    x = _edges(int(es[-1]), 72, 11)
    tsf = np.asarray(TSF, np.float32) if fmt == "nvfp4" else None
    d, s = QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, device="interp",
                                              target=target)
    rd, rs = RG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf)
    assert_same_bytes(d, rd, f"grouped {fmt} {target} data")
    assert_same_bytes(s, rs, f"grouped {fmt} {target} scales")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_fused_wide_edges(activation, target):
    es, offs = group_offsets(COUNTS)
    ids = np.asarray(IDS, np.int32)
    gu = _edges(int(es[-1]), 144, 12)  # D = 72
    gu[9, :72] = -100.0  # sigmoid(-100) is tiny: near-zero products
    isc = np.asarray([2.0, 0.5, 1e-38], np.float32)
    d, s = QS.fused_silu_quantize(gu, "nvfp4", es, offs, ids, isc, activation=activation,
                                  device="interp", target=target)
    rd, rs = RG.fused_silu_quantize(gu, "nvfp4", es, offs, ids, isc, activation=activation)
    assert_same_bytes(d, rd, f"silu {activation} {target} data")
    assert_same_bytes(s, rs, f"silu {activation} {target} scales")


@pytest.mark.parametrize("target", TARGETS)
def test_tiny_tensor_scales(target):
    """Per-expert tensor scales 2^-118 / 2^-100 with blocks of E2M1 ties near the bf16
    maximum (grouped: the inputs; fused SiLU: the activations): NVFP4 reciprocals below
    2^-96, the fast E2M1 path's rare branch (bf16 words moved by 2^24 for grouped, the
    software form for fused)."""
    es, offs = group_offsets(COUNTS)
    ids = np.asarray(IDS, np.int32)
    tsf = np.asarray([2.0 ** -118, 0.5, 2.0 ** -100], np.float32)
    v = np.zeros((int(es[-1]), 64), np.float32)  # tie blocks for each group's tensor scale
    for g, i in enumerate(IDS):
        rows = slice(int(es[g]), int(es[g + 1]))
        v[rows] = nvfp4_tie_blocks(es[g + 1] - es[g], 64, tsf[max(i, 0)], 16 + g)
    x = v.astype(ml_dtypes.bfloat16)
    rd, rs = RG.grouped_quantize_dynamic_scaled(x, "nvfp4", es, offs, ids, tsf)
    # the default schedule, and on sm_90a the 64-register bulk kernel (FMUL.SAT packing)
    for schedule in (None, "wide_bulk2_x2") if target == "sm_90a" else (None,):
        d, s = QG.grouped_quantize_dynamic_scaled(x, "nvfp4", es, offs, ids, tsf,
                                                  device="interp", target=target,
                                                  schedule=schedule)
        assert_same_bytes(d, rd, f"grouped {target} {schedule} data")
        assert_same_bytes(s, rs, f"grouped {target} {schedule} scales")
    # silu(2^60) = 2^60 exactly: the activations are the tie blocks
    gu = np.concatenate([np.full_like(v, 2.0 ** 60), v * 2.0 ** -60], axis=1)
    gu = gu.astype(ml_dtypes.bfloat16)
    d, s = QS.fused_silu_quantize(gu, "nvfp4", es, offs, ids, tsf, device="interp",
                                  target=target)
    rd, rs = RG.fused_silu_quantize(gu, "nvfp4", es, offs, ids, tsf)
    assert_same_bytes(d, rd, f"silu {target} data")
    assert_same_bytes(s, rs, f"silu {target} scales")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_tile_loop_refills_recip_table(fmt, monkeypatch):
    """Several tiles per block (sm_90a): the shared reciprocal table is refilled per tile."""
    _force_tile_loop(monkeypatch)
    es, offs = group_offsets(COUNTS)
    ids = np.asarray(IDS, np.int32)
    x = _edges(int(es[-1]), 64, 13)
    tsf = np.asarray(TSF, np.float32) if fmt == "nvfp4" else None
    d, s = QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, device="interp",
                                              target="sm_90a")
    rd, rs = RG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)
    gu = _edges(int(es[-1]), 128, 14)
    isc = np.asarray([2.0, 0.5, 1e-38], np.float32) if fmt == "nvfp4" else None
    d, s = QS.fused_silu_quantize(gu, fmt, es, offs, ids, isc, device="interp", target="sm_90a")
    rd, rs = RG.fused_silu_quantize(gu, fmt, es, offs, ids, isc)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
def test_owner_scan_ignores_empty_group_offsets(target, monkeypatch):
    """Group vectors as a device array would reach the kernel (search_offsets passes those
    unchanged): empty groups with arbitrary, out-of-order offsets own nothing, and the warp
    scan still finds each tile's owner (a binary search over tile0 would not)."""
    monkeypatch.setattr(QG, "search_offsets", lambda es, offs: offs)
    counts = [100, 0, 160, 0, 30]
    es, offs = group_offsets(counts)
    offs[1], offs[3] = 7, -3  # tile0 = [0, 7, 1, -1, 3]
    ids = np.array([0, 1, -1, 2, 1], np.int32)
    x = _edges(int(es[-1]), 64, 15)
    tsf = np.array([0.43, 2.0, 1e38], np.float32)
    d, s = QG.grouped_quantize_dynamic_scaled(x, "nvfp4", es, offs, ids, tsf, device="interp",
                                              target=target)
    rd, rs = RG.grouped_quantize_dynamic_scaled(x, "nvfp4", es, offs, ids, tsf)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_padding_row_groups_only_write_scales(fmt, target, monkeypatch):
    """Whole tiles per block: row groups past a tile's rows (partial last tiles of 2, 20 and
    60 rows, an unused expert, spare tiles) skip the data path and write zero scale bytes."""
    _force_tile_loop(monkeypatch, whole_tiles=True)
    es, offs = group_offsets(COUNTS)
    ids = np.asarray(IDS, np.int32)
    x = _edges(int(es[-1]), 72, 16)
    tsf = np.asarray(TSF, np.float32) if fmt == "nvfp4" else None
    d, s = QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, device="interp",
                                              target=target)
    rd, rs = RG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)
    gu = _edges(int(es[-1]), 144, 17)
    isc = np.asarray([2.0, 0.5, 1e-38], np.float32) if fmt == "nvfp4" else None
    d, s = QS.fused_silu_quantize(gu, fmt, es, offs, ids, isc, device="interp", target=target)
    rd, rs = RG.fused_silu_quantize(gu, fmt, es, offs, ids, isc)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)

"""The grouped phase 1 (ops/matmul_grouped_p1.py, issue #10): routed packed FP4 rows -> the bf16
workspace of per-(group, 128-row tile) tiles that the grouped pdq kernel's ``a_source=
"workspace"`` bulk-copies.

* interp: the workspace is, per used group g and row tile i, tile ``start // 128 +
  a_scale_offsets[g] + i`` holding the tile's rows dequantized exactly (E2M1 x |E4M3|, MXFP4
  x 2^(e - 127 - 2)) in the stage-ordered layout (chunk c of row r at c 2048 + r 16), zeros
  past the group's end and past K; tiles of unused groups untouched; misplaced tiles refused.
* lower: SASS (16-byte loads and stores, no spills).
* gpu: the same tiles on the H200 (gpt-oss K=2880, unused / empty / multi-tile groups; the
  matmul on the workspace: tests/test_matmul_grouped_pdq.py).
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from test_matmul_grouped import make_grouped_case
from test_matmul_grouped_wgmma import CASES

from blockscale.formats import MXFP4, NVFP4, decode_e2m1, decode_e4m3, decode_e8m0
from blockscale.ops import matmul_grouped_p1 as G1


def expected_tiles(case: dict, row_scales: np.ndarray, fmt, k: int) -> dict[int, np.ndarray]:
    """{workspace tile: float64 [128, k_pad]} of every used group's row tiles."""
    x = case["hidden"]
    t = x.shape[0]
    codes = np.stack([x & 0xF, x >> 4], axis=-1).reshape(t, k)
    if fmt.is_mx:
        sc = decode_e8m0(row_scales.view(np.uint8)).astype(np.float64) * 2.0 ** -2
    else:
        sc = np.abs(decode_e4m3(row_scales.view(np.uint8)).astype(np.float64))
    vals = decode_e2m1(codes).astype(np.float64) * np.repeat(sc, fmt.block_size, axis=1)[:, :k]
    kp = G1.k_padded(k)
    es, offs, ids = (case[x].astype(np.int64) for x in ("expert_start", "a_scale_offsets",
                                                        "expert_ids"))
    out = {}
    for g in range(len(ids)):
        s, e = es[g], es[g + 1]
        if ids[g] < 0 or s == e:
            continue
        for i in range(-(-(e - s) // 128)):
            tile = np.zeros((128, kp))
            rows = vals[s + 128 * i:min(e, s + 128 * (i + 1))]
            tile[:rows.shape[0], :k] = rows
            out[int(s // 128 + offs[g] + i)] = tile
    return out


def workspace_tiles(ws: np.ndarray, k: int) -> np.ndarray:
    """The flat workspace as bf16 [tiles, 128, k_pad] (undoing the stage order; tiles of
    unused groups are not written: compare the checked ones as float64)."""
    kp = G1.k_padded(k)
    w = np.asarray(ws).view(ml_dtypes.bfloat16).reshape(-1, kp // 8, 128, 8)
    return w.transpose(0, 2, 1, 3).reshape(-1, 128, kp)


@pytest.mark.interp
@pytest.mark.parametrize("pieces", G1.PIECES)
@pytest.mark.parametrize("case_id", [0, 1, 3])
@pytest.mark.parametrize("fmt", [NVFP4, MXFP4], ids=lambda f: f.name)
def test_interp_workspace(fmt, case_id, pieces):
    """Unused groups, empty groups, groups over several tiles ending mid-tile, K % 64 == 32."""
    counts, ids, e_count, n, k = CASES[case_id]
    rng = np.random.default_rng(40 + case_id)
    case, row_scales, _ = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
    ws = G1.dequantize_grouped_a(case["hidden"], case["a_scales"], case["expert_start"],
                                 case["a_scale_offsets"], case["expert_ids"], fmt, k=k,
                                 pieces=pieces, device="interp")
    assert ws.dtype == np.uint8 and ws.size == case["a_scales"].shape[0] * G1.tile_bytes(k)
    got = workspace_tiles(ws, k)
    want = expected_tiles(case, row_scales, fmt, k)
    for w, tile in want.items():
        np.testing.assert_array_equal(got[w].astype(np.float64), tile, err_msg=f"tile {w}")
    # every tile of a used group is written (zeros included): the same bytes as the pdq
    # producer's; no other tile exists in these cases except unused groups' (not written)
    used = set(want)
    assert used <= set(range(got.shape[0]))


@pytest.mark.interp
def test_interp_many_groups():
    """70 groups (three 32-group chunks of the scan), a 2-tile group in the last chunk."""
    counts, ids, e_count, n, k = CASES[4]
    case, row_scales, _ = make_grouped_case(np.random.default_rng(3), NVFP4, counts, ids,
                                            e_count, n, k)
    ws = G1.dequantize_grouped_a(case["hidden"], case["a_scales"], case["expert_start"],
                                 case["a_scale_offsets"], case["expert_ids"], NVFP4, k=k,
                                 device="interp")
    got = workspace_tiles(ws, k)
    for w, tile in expected_tiles(case, row_scales, NVFP4, k).items():
        np.testing.assert_array_equal(got[w].astype(np.float64), tile, err_msg=f"tile {w}")


@pytest.mark.interp
def test_checks():
    case, _, _ = make_grouped_case(np.random.default_rng(0), NVFP4, [130, 4], [0, 1], 2, 16,
                                   64)
    args = (case["hidden"], case["a_scales"], case["expert_start"])
    with pytest.raises(ValueError, match="disjoint"):  # group 1's tile on group 0's second
        G1.dequantize_grouped_a(*args, np.array([0, 0], np.uint32), case["expert_ids"],
                                NVFP4, device="interp")
    with pytest.raises(ValueError, match=r"in \[0, 3\)"):
        G1.dequantize_grouped_a(*args, np.array([0, 5], np.uint32), case["expert_ids"],
                                NVFP4, device="interp")
    # an unused group's tiles are not checked (not written)
    G1.dequantize_grouped_a(*args, np.array([0, 0], np.uint32), np.array([0, -1], np.int32),
                            NVFP4, device="interp")
    with pytest.raises(ValueError, match="k % 32"):
        G1.dequantize_grouped_a(*args, case["a_scale_offsets"], case["expert_ids"], NVFP4,
                                k=48, device="interp")
    with pytest.raises(ValueError, match="fmt|format"):
        G1.GroupedP1Spec("fp6")
    with pytest.raises(ValueError, match="NVFP4 only"):
        G1.GroupedP1Spec("mxfp8", dtype="f16")
    with pytest.raises(ValueError, match="pieces"):
        G1.GroupedP1Spec("nvfp4", pieces=3)
    assert G1.grid(4096 * 4, 2880, 128) == (12, 256, 1)  # 45 pieces: 23 pairs x 128 rows
    assert [s.kernel_name for s in G1.bundle_specs("sm_90a")] == [
        "bs_grouped_p1_nvfp4_t128_p1", "bs_grouped_p1_nvfp4_t128_p2",
        "bs_grouped_p1_mxfp4_t128_p1", "bs_grouped_p1_mxfp4_t128_p2",
        "bs_grouped_p1_mxfp8_t128_p1", "bs_grouped_p1_mxfp8_t128_p2",
        "bs_grouped_p1_nvfp4_t128_p2_f16", "bs_grouped_p1_nvfp4_t128_p2_f16_kp"]
    assert G1.bundle_specs("gfx942") == []


@pytest.mark.lower
@pytest.mark.parametrize("spec", G1.bundle_specs("sm_90a"), ids=lambda s: s.kernel_name)
def test_kernel_sass(spec):
    """16-byte loads of the packed rows (one a half, MXFP8 two), four 16-byte stores per half,
    no local memory."""
    kernel = G1.kernel(spec)
    sass = kernel.asm["sass"]
    assert len(re.findall(r"STG\.E\.128", sass)) == 8 * spec.pieces
    per_half = 2 if spec.fmt == "mxfp8" else 1
    assert len(re.findall(r"LDG\.E\.128", sass)) == 2 * per_half * spec.pieces
    assert kernel.meta["spill_stores"] == 0 and kernel.meta["spill_loads"] == 0


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("pieces", G1.PIECES)
@pytest.mark.parametrize("fmt", [NVFP4, MXFP4], ids=lambda f: f.name)
def test_gpu_workspace(fmt, pieces):
    """The workspace tiles on the GPU: exact dequantization, zeros past the group ends and
    K (K = 2880: the last k64 piece half past K)."""
    counts, ids = [300, 0, 77, 1, 129, 256, 40], [3, -1, 0, 1, 2, -1, 4]
    case, row_scales, _ = make_grouped_case(np.random.default_rng(8), fmt, counts, ids, 5, 16,
                                            2880)
    ws = G1.dequantize_grouped_a(case["hidden"], case["a_scales"], case["expert_start"],
                                 case["a_scale_offsets"], case["expert_ids"], fmt, k=2880,
                                 pieces=pieces, device="cuda")
    got = workspace_tiles(np.asarray(ws), 2880)
    for w, tile in expected_tiles(case, row_scales, fmt, 2880).items():
        np.testing.assert_array_equal(got[w].astype(np.float64), tile, err_msg=f"tile {w}")

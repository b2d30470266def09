"""The decode kernel's "mma_c8t1" variant (FP4, grouped: a pass a row on the
block-diagonal step of blockscale/ops/_decode_solo_ir.py) run by the numpy interpreter:
within the fp32 bound of test_matmul_common (bf16 outputs, expert and row scales), the same
bits from run to run, on groups of one row and of 2..9 rows (a pass a row), id -1 groups
(D8 zeros), K whose last step holds 1, 2, 10 and 16 chunks (1..4 live sets of 8 blocks), N
tails, NVFP4 and MXFP4; NaN scales (D5); the dispatch (its kernel where every group holds
one row and the variant is the default, else "mma_c8t"); its sm_90a SASS (the step loop:
16 / 8 fold FFMAs (NVFP4 / MXFP4) instead of 128 / 64, no spill)."""

from __future__ import annotations

import collections

import ml_dtypes
import numpy as np
import pytest
from test_matmul_common import assert_bf16_consistent, f32_error_bound
from test_matmul_decode import dispatched_within_bound, spy_launches
from test_matmul_decode_lower import _step_loop
from test_matmul_grouped import exact_grouped, make_grouped_case

from blockscale import layouts
from blockscale.formats import MXFP4, NVFP4
from blockscale.ops import matmul_decode

VARIANT = "mma_c8t1"
# (counts, expert ids, experts, N, K): K = 2880 (last step 10 chunks: 3 live sets), 32 (one
# step of 1 chunk), 544 (2 chunks), 1024 (full steps), 1088 (2 chunks; a 9-row group: an
# 8-row pass, then a solo pass)
CASES = [([1, 1, 1, 1], [3, 0, 2, 1], 4, 70, 2880),
         ([0, 3, 1, 2, 1], [-1, 2, -1, 0, 1], 3, 40, 32),
         ([1, 2, 1], [1, 0, -1], 2, 64, 544),
         ([1, 1], [0, 1], 2, 33, 1024),
         ([9, 1, 4], [0, 1, 1], 2, 36, 1088)]


def _run(case, esc, k, rows, variant=VARIANT, fmt=NVFP4):
    return matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=fmt, k=k,
                                               a_row_scales=rows, device="interp",
                                               variant=variant)


def _case(case_id, seed, fmt=NVFP4):
    counts, ids, e_count, n, k = CASES[case_id]
    rng = np.random.default_rng(seed)
    case, row_scales, w_scales = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
    esc = (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)
    t = case["hidden"].shape[0]
    rows = rng.uniform(0.5, 2, t).astype(ml_dtypes.bfloat16) if fmt is NVFP4 else None
    return case, row_scales, w_scales, esc, k, rows


@pytest.mark.interp
@pytest.mark.parametrize("fmt", [NVFP4, MXFP4], ids=lambda f: f.name)
@pytest.mark.parametrize("case_id", range(len(CASES)))
def test_grouped_solo_within_bound(case_id, fmt):
    case, row_scales, w_scales, esc, k, rows = _case(case_id, 80 + case_id, fmt)
    got = _run(case, esc, k, rows, fmt=fmt)
    t, n = case["hidden"].shape[0], case["weight"].shape[1]
    assert got.shape == (t, n) and got.dtype == ml_dtypes.bfloat16
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, fmt, k, esc, rows)
    assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, fmt, k, n_mul=2))
    again = _run(case, esc, k, rows, fmt=fmt)
    assert np.array_equal(got.view(np.uint16), again.view(np.uint16))
    es = case["expert_start"].astype(np.int64)
    for g, e in enumerate(CASES[case_id][1]):
        if e < 0:
            assert not got[es[g]:es[g + 1]].view(np.uint16).any()  # D8: zero rows


@pytest.mark.interp
@pytest.mark.parametrize("fmt", [NVFP4, MXFP4], ids=lambda f: f.name)
def test_grouped_solo_nan_scales(fmt):
    """D5: a NaN weight scale (E4M3 0x7F, E8M0 0xFF) gives a NaN column for the rows of its
    expert's groups only, a NaN activation scale (0xFF; NVFP4: the sign bit ignored, D3) a
    NaN row; whatever the group's size; every other output unchanged."""
    case, row_scales, w_scales, esc, k, rows = _case(4, 7, fmt)
    base = _run(case, esc, k, rows, fmt=fmt)
    es = case["expert_start"].astype(np.int64)
    ws = w_scales[1].copy()
    ws.view(np.uint8)[5, 20] = 0x7F if fmt is NVFP4 else 0xFF  # expert 1 (groups 1, 2)
    case["b_scales"] = case["b_scales"].copy()
    case["b_scales"][1] = layouts.interleave(ws)
    rs = row_scales.copy()
    rs.view(np.uint8)[es[1], 3] = 0xFF  # the one-row group's row
    rs.view(np.uint8)[2, 30] = 0xFF  # a row of the 9-row group
    case["a_scales"] = _padded_act_scales(case, rs)
    got = _run(case, esc, k, rows, fmt=fmt).astype(np.float32)
    nan = np.zeros(got.shape, bool)
    nan[es[1]:es[3], 5] = True
    nan[[es[1], 2]] = True
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan], base.astype(np.float32)[~nan])


def _padded_act_scales(case, row_scales):
    """The 5-D A scales of ``row_scales`` in the case's per-group padded tiles."""
    es = case["expert_start"].astype(np.int64)
    tile0 = case["a_scale_offsets"].astype(np.int64) + es[:-1] // 128
    rows = np.zeros((case["a_scales"].shape[0] * 128, row_scales.shape[1]), np.uint8)
    for g in range(len(es) - 1):
        r0 = int(tile0[g]) * 128
        rows[r0:r0 + es[g + 1] - es[g]] = row_scales.view(np.uint8)[es[g]:es[g + 1]]
    return layouts.interleave(rows.view(row_scales.dtype))


@pytest.mark.interp
def test_dispatch_solo_variant(monkeypatch):
    """The grouped dispatch runs "mma_c8t1" where every group holds one row (a host
    ``expert_start``) and the variant is the default, "mma_c8t" where one holds two (or a
    variant is named: BLOCKSCALE_DECODE_VARIANT), for NVFP4 and MXFP4; the spec refuses the
    dense mode, naming the variant."""
    launched = spy_launches(monkeypatch, lambda spec: spec.variant, matmul_decode)
    monkeypatch.delenv(matmul_decode.VARIANT_ENV, raising=False)
    rng = np.random.default_rng(5)
    for fmt, counts, ids, env, want in ((NVFP4, [1, 0, 1], [0, 1, -1], None, VARIANT),
                                        (MXFP4, [1, 1], [1, 0], None, VARIANT),
                                        (NVFP4, [1, 2], [0, 1], None, "mma_c8t"),
                                        (NVFP4, [1, 1], [1, 0], "mma_c8t", "mma_c8t")):
        if env:
            monkeypatch.setenv(matmul_decode.VARIANT_ENV, env)
        launched.clear()
        dispatched_within_bound(rng, fmt, counts, ids, 40, 544)
        assert launched == [want]
    assert not matmul_decode.one_row_groups(object(), np.zeros(1, np.int32))  # (device side)
    monkeypatch.setenv(matmul_decode.VARIANT_ENV, VARIANT)
    assert matmul_decode.dispatch_variant(NVFP4, grouped=True) == VARIANT
    assert matmul_decode.dispatch_variant(MXFP4, grouped=True) == VARIANT
    with pytest.raises(ValueError, match="mma_c8t1.*grouped"):
        matmul_decode.DecodeSpec("nvfp4", "dense", "float32", variant=VARIANT)
    specs = [s for s in matmul_decode.bundle_specs("sm_90a") if s.variant == VARIANT]
    assert {(s.fmt, s.mode, s.row_scales) for s in specs} == {("nvfp4", "grouped", False),
                                                             ("nvfp4", "grouped", True),
                                                             ("mxfp4", "grouped", False)}


@pytest.mark.interp
@pytest.mark.parametrize("fmt", [NVFP4, MXFP4], ids=lambda f: f.name)
def test_fused_swiglu_equals_chained_on_one_row_groups(fmt, monkeypatch):
    """Where every group holds one row the chained path's matmul is "mma_c8t1" (not the
    portable kernel's bits), so grouped_matmul_swiglu runs that kernel on the σ-permuted
    weights with its un-permuting ``sigma_out`` store, then fused_silu_quantize: byte-equal
    to grouped_matmul_block_scaled followed by fused_silu_quantize (NVFP4 with row scales)."""
    from test_matmul_swiglu import swiglu_case

    from blockscale import ops

    launched = spy_launches(monkeypatch, lambda spec: getattr(spec, "variant", ""),
                            matmul_decode)
    monkeypatch.delenv(matmul_decode.VARIANT_ENV, raising=False)
    counts, ids, d, k = [1, 0, 1, 1], [1, -1, 0, 1], 40, 544
    case = swiglu_case(fmt, counts, ids, 2, d, k, seed=3)
    grp = (case["expert_start"], case["a_scale_offsets"], case["expert_ids"])
    esc = np.array([1.25, 0.625], np.float32)
    isc = None if fmt.is_mx else np.array([0.4, 0.7], np.float32)
    rows = None if fmt.is_mx else np.array([1.5, 0.75, 2.0], ml_dtypes.bfloat16)
    data, scales = ops.grouped_matmul_swiglu(
        case["hidden"], case["w_sigma"], case["a_scales"], case["sfb_sigma"], *grp, esc, isc,
        fmt, k=k, a_row_scales=rows, device="interp", target="sm_90a")
    assert launched == [VARIANT]
    gate_up = ops.grouped_matmul_block_scaled(
        case["hidden"], case["weight"], case["a_scales"], case["b_scales"], *grp, esc, fmt,
        k=k, a_row_scales=rows, device="interp", target="sm_90a")
    assert launched == [VARIANT, VARIANT]
    c_data, c_scales = ops.fused_silu_quantize(gate_up, fmt, *grp, isc,
                                               num_scale_tiles=case["a_scales"].shape[0],
                                               device="interp", target="sm_90a")
    assert np.array_equal(np.asarray(data).view(np.uint8), np.asarray(c_data).view(np.uint8))
    assert np.array_equal(np.asarray(scales).view(np.uint8),
                          np.asarray(c_scales).view(np.uint8))


@pytest.mark.lower
@pytest.mark.parametrize(("fmt", "folds"), [("nvfp4", 16), ("mxfp4", 8)])
def test_solo_step_loop_sass(fmt, folds):
    """The step loop: 32 HMMAs, one FFMA fold a set and accumulator (NVFP4 16, MXFP4 8;
    the "mma_c8t" loops 128 / 64), <= 700 instructions ("mma_c8t": 809 / 921), no spill
    anywhere at 128 registers."""
    kernel = matmul_decode.kernel(matmul_decode.DecodeSpec(fmt, "grouped", "bfloat16",
                                                           False, "sm_90a", VARIANT))
    loop = _step_loop(kernel.asm["sass"])
    ops = collections.Counter(o.split(".")[0] for o in loop)
    assert ops["HMMA"] == 32 and ops["FFMA"] == folds and len(loop) <= 700, (ops, len(loop))
    assert kernel.meta["registers"] <= 128 and kernel.meta["spill_stores"] == 0, kernel.meta

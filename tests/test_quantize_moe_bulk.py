"""The bulk-ring wide schedules of grouped and fused-SiLU quantize (``schedule="wide_bulk2"``
/ ``"wide_bulk3"`` / ``"wide_bulk4"`` and their ``_lut`` forms, sm_90a:
blockscale/ops/_quantize_wide_ir.py ``_BulkRing``) in the interpreter, byte for byte against
blockscale.reference: MAX's grouped cases for the three formats (SILU and SWIGLU_OAI for the
fused op), the rows tests' edge cases, gathers and empty groups, with one resident wave and
with one block per SM (NUM_SMS = 1: each block's ring wraps many times, so both mbarrier
parities and the refill of every stage run), a K = 4096 row (one row a row group, the span
copies of 8 KB), and the plan / spec facts (shared bytes, blocks per SM, register caps)."""

from __future__ import annotations

import numpy as np
import pytest
from _quantize_helpers import e2m1_grid_codes_numpy, group_offsets
from test_quantize_moe_rows import (
    COUNTS,
    IDS,
    _edges,
    _grouped,
    check_gather_and_empty_groups,
)
from test_quantize_moe_stream import MAX_CASES, check_fused_formats, check_nvfp4_many_groups

pytest.importorskip("mlir")

from blockscale.ops import quantize_grouped as QG
from blockscale.ops import quantize_silu as QS

pytestmark = pytest.mark.interp
BULK = ["wide_bulk2", "wide_bulk3", "wide_bulk4"]


@pytest.fixture(params=[132, 1], ids=["wave", "few_blocks"])
def sms(request, monkeypatch):
    monkeypatch.setattr(QG, "NUM_SMS", request.param)
    if request.param == 1:  # one block: its ring wraps (both parities, every stage refilled)
        monkeypatch.setattr(QG, "BULK_MAX_BLOCKS", 1)
    return request.param


@pytest.mark.parametrize("schedule", BULK)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_grouped_bulk_max_cases(fmt, schedule):
    """MAX's grouped cases (K = 32 .. 72: chunks past K, half-valid chunks, one-lane rows)."""
    for counts, ids, k in MAX_CASES:
        _grouped(fmt, "sm_90a", schedule, counts, ids, k, k)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_grouped_bulk_edges(fmt, sms):
    """Ties, NaN / Inf / -0, near-zero rows, unused experts; the ring wraps (few blocks)."""
    _grouped(fmt, "sm_90a", "wide_bulk3", COUNTS, IDS, 72, 11)


@pytest.mark.parametrize("schedule", ["wide_bulk2", "wide_bulk4"])
def test_grouped_bulk_gather_and_empty_groups(schedule, sms):
    check_gather_and_empty_groups(schedule, "sm_90a")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_grouped_bulk_long_rows(fmt, monkeypatch):
    """K = 4096 (8 KB span copies, one row a row group) over group changes, two blocks."""
    monkeypatch.setattr(QG, "NUM_SMS", 1)
    monkeypatch.setattr(QG, "BULK_MAX_BLOCKS", 1)
    _grouped(fmt, "sm_90a", "wide_bulk2", [1, 0, 0, 9, 0], [0, 1, 2, 3, 4], 4096, 7,
             np.asarray([0.3, 1.0, 2.0, 40.0, 1.0], np.float32) if fmt == "nvfp4" else None)


@pytest.mark.parametrize("counts", [[5, 0, 11, 3, 8], [2, 3]], ids=["periods4", "partial"])
@pytest.mark.parametrize("op", ["grouped", "fused", "fused_wide1"])
def test_nvfp4_scale_stage_periods(op, counts, monkeypatch):
    """NVFP4 wide_bulk2 (the scale bytes staged in shared memory, written a period later,
    quantize_grouped.stages_scales): 4096 columns (2 rows a row group: periods of 4 visits),
    one block over 27 rows: 14 row groups = 4 periods, both record sets reused, the last
    period partial (2 visits, its last row past M), rows of an unused expert, group changes
    inside periods; over 5 rows: one partial period (3 visits; the set's other slots never
    written). ``fused_wide1``: one row a row group, periods of 8 visits (27 rows: 8, 8, 8, 3)."""
    monkeypatch.setattr(QG, "NUM_SMS", 1)
    monkeypatch.setattr(QG, "BULK_MAX_BLOCKS", 1)
    ids = [0, 3, -1, 2, 1][:len(counts)]
    if op == "grouped":
        _grouped("nvfp4", "sm_90a", "wide_bulk2", counts, ids, 4096, 21,
                 np.asarray([0.3, 1.0, 2.0, 40.0], np.float32))
    else:
        es, offs = group_offsets(counts)
        gu = _edges(int(es[-1]), 2 * 4096, 22)
        check_fused_formats(gu, es, offs, ids, "wide1_bulk2_lut" if op == "fused_wide1"
                            else "wide_bulk2_lut", "silu", 4, "stage", fmts=("nvfp4",))


@pytest.mark.parametrize("schedule", ["wide_bulk2_lut", "wide1_bulk2_lut"])
def test_fused_bulk_long_rows_mx(schedule, monkeypatch):
    """D = 4096 (>= 8 chunk lanes a row: the lanes that read their ring halves swapped,
    ``_BulkRing.swap``, hold distinct halves) for the MX formats, one block."""
    monkeypatch.setattr(QG, "NUM_SMS", 1)
    monkeypatch.setattr(QG, "BULK_MAX_BLOCKS", 1)
    es, offs = group_offsets([2, 3])
    gu = _edges(int(es[-1]), 2 * 4096, 23)
    check_fused_formats(gu, es, offs, [1, 0], schedule, "silu", 2, "long",
                        fmts=("mxfp4", "mxfp8"))


def test_grouped_bulk_nvfp4_blocks_over_many_groups(monkeypatch):
    """NVFP4 rows of many groups (each its own tensor scale) past the reciprocal table."""
    monkeypatch.setattr(QG, "NUM_SMS", 1)
    monkeypatch.setattr(QG, "BULK_MAX_BLOCKS", 1)
    check_nvfp4_many_groups("wide_bulk3")


def _fused(schedule: str, activation: str, counts, ids, d: int, seed: int) -> None:
    es, offs = group_offsets(counts)
    gu = _edges(int(es[-1]), 2 * d, seed)
    check_fused_formats(gu, es, offs, ids, schedule, activation, max(3, len(ids)), str(counts))


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("schedule", ["wide_bulk2_lut", "wide_bulk2", "wide_bulk2_lut_x2",
                                      "wide1_bulk2_lut", "wide1_bulk2_lut_x4"])
def test_fused_bulk_max_cases(schedule, activation):
    for counts, ids, d in MAX_CASES:
        _fused(schedule, activation, counts, ids, d, d)


@pytest.mark.parametrize("schedule", ["wide_bulk3_lut", "wide1_bulk2_lut"])
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_fused_bulk_edges(activation, schedule, sms):
    _fused(schedule, activation, COUNTS, IDS, 72, 12)


def test_bulk_schedule_choice_and_plan():
    from blockscale.ops.quantize import QuantizeSpec

    base = QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "grouped",
                        name="grouped_quantize_dynamic_scaled")
    b3 = QG.with_schedule(base, "wide_bulk3")
    assert (b3.wide, b3.bulk, b3.unroll) == (2, 3, 1)
    assert b3.kernel_name.endswith("_wide2_bulk3")
    assert b3.dynamic_shared_bytes == 3 * (16384 + 8)  # stages and their mbarriers
    assert QG.bulk_blocks_per_sm(b3) == 4 and QG.wide_register_cap(b3) == 64
    b4 = QG.with_schedule(base, "wide_bulk4")
    assert QG.bulk_blocks_per_sm(b4) == 3 and QG.wide_register_cap(b4) == 80
    grid, sc = QG.wide_plan(b4, 8192, 4096, 128)
    assert grid == (1, 396, 1) and sc["cb_log2"] == 8  # 132 SMs x 3 blocks
    amd = QuantizeSpec("nvfp4", "gfx942", None, "tcgen5d", True, "grouped")
    assert QG.with_schedule(amd, "wide_bulk3") is amd  # no ring off sm_90a: the tile kernel
    silu = QuantizeSpec("mxfp4", "sm_90a", "up", "tcgen5d", True, "silu")
    f2 = QG.with_schedule(silu, "wide_bulk2_lut")
    assert f2.lut and f2.bulk == 2 and f2.stage_bytes == 32768
    assert f2.dynamic_shared_bytes == 2 * (32768 + 8) + 8  # + the sigmoid table's mbarrier
    assert QG.bulk_blocks_per_sm(f2) == 2 and QG.wide_register_cap(f2) == 128
    # NVFP4's staged scale bytes (10 KB, two ring stages only) cost no resident block
    x2 = QG.with_schedule(base, "wide_bulk2_x2")
    n2 = QG.with_schedule(QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "silu"),
                          "wide_bulk2_lut")
    assert QG.scale_stage_bytes(x2) == QG.scale_stage_bytes(n2) == 10240
    assert QG.scale_stage_bytes(b3) == 0 and QG.scale_stage_bytes(f2) == 0
    assert QG.bulk_blocks_per_sm(x2) == 4 and QG.bulk_blocks_per_sm(n2) == 2
    with pytest.raises(ValueError, match="bulk"):
        QG.MoeQuantizeSpec("mxfp4", "sm_90a", "up", "tcgen5d", True, "grouped", wide=4, bulk=2)
    # the fused op: NVFP4 / MXFP8 on one chunk a visit (3 blocks an SM, run CI), from 2^26
    # output elements on several waves (runs CF, CI, CL); MXFP4 on two chunks, one wave
    big = QG.LARGE_GROUPED_ELEMENTS
    assert [QS.silu_default(f, big) for f in ("nvfp4", "mxfp4", "mxfp8")] == [
        "wide1_bulk2_lut_x2", "wide_bulk2_lut", "wide1_bulk2_lut_x4"]  # MXFP8: 4 waves, run CL
    assert [QS.silu_default(f, big - 1) for f in ("nvfp4", "mxfp4", "mxfp8")] == [
        "wide1_bulk2_lut", QS.DEFAULT_SILU_SCHEDULE, "wide1_bulk2_lut"]
    n1 = QG.with_schedule(QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "silu"),
                          "wide1_bulk2_lut")
    assert (n1.wide, n1.bulk, n1.stage_bytes) == (1, 2, 16384)
    assert QG.scale_stage_bytes(n1) == 2 * 8 * 256 + 2 * 128 * 8
    assert QG.bulk_blocks_per_sm(n1) == 3 and QG.wide_register_cap(n1) == 80
    assert QG.wide_plan(n1, 16384, 4096, 192)[0] == (1, 396, 1)  # 1 row a visit, 132 x 3
    l2 = QG.with_schedule(silu, "wide_bulk2_lut_x2")
    assert l2.waves == 2 and l2.bulk == 2 and l2.lut
    assert QG.wide_plan(l2, 16384, 4096, 192)[0][1] == 2 * QG.wide_plan(f2, 16384, 4096, 192)[0][1]
    names = {s.kernel_name for s in QG.bundle_specs("sm_90a") + QS.bundle_specs("sm_90a")}
    assert {"grouped_quantize_dynamic_scaled_nvfp4_rn_5d_v_wide2_bulk2",
            "grouped_quantize_dynamic_scaled_mxfp8_up_5d_v_gather_wide2_bulk4",
            "fused_silu_quantize_mxfp4_up_5d_v_silu_wide2_bulk2_lut"} <= names


def test_fused_amax_keeps_subnormals():
    """The fused wide kernels' chunk max is ``max.NaN.f32`` without ``.ftz`` (a flushed
    subnormal product would give a block of tiny values a zero scale; the interpreter runs
    the MLIR, before this lowering)."""
    from blockscale.ops import quantize as Q
    from blockscale.ops.quantize import QuantizeSpec

    ptx = Q.kernel(QG.with_schedule(QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True,
                                                 "silu", False, "silu", 1.702, 7.0,
                                                 name="fused_silu_quantize"),
                                    "wide_bulk2_lut")).asm["ptx"]
    assert "max.NaN.f32" in ptx and ".ftz" not in ptx


def _e2m1_unsat_model(a: np.ndarray) -> np.ndarray:
    """The code of ``convert.e2m1x8_pack_unsat`` (``_quantize_wide_ir._pack_fp4_unsat``)
    for f32 ``a >= 0``."""
    return e2m1_grid_codes_numpy(a, "y")


def test_e2m1_unsat_exhaustive():
    """The unsaturated E2M1 rounding of the NVFP4 fast path equals the reference (encode_e2m1:
    RNE, saturating to 6) on every f32 in [0, 7) that matters: all 2^21 values of (6, 7)
    (where saturation would act), every f32 within 4096 ulps of each tie (0.25 .. 5) and of
    the grid switches (2, sqrt(20)); at 7 itself it would not (hence the < 7 bound)."""
    from blockscale.formats import encode_e2m1
    from blockscale.ops import _quantize_wide_ir as WI

    lo, hi = np.float32(6.0).view(np.uint32), np.float32(WI.E2M1_UNSAT_BOUND).view(np.uint32)
    parts = [np.arange(lo, hi, dtype=np.uint32).view(np.float32)]
    for c in (0.25, 0.75, 1.25, 1.75, 2.0, 2.5, 3.5, np.sqrt(20.0), 4.0, 5.0, 6.0):
        b = np.float32(c).view(np.uint32).astype(np.int64)
        parts.append(np.arange(b - 4096, b + 4097).astype(np.uint32).view(np.float32))
    parts.append(np.array([0.0, 1e-45, 1e-38, 0.5, 1.0, 1.5, 3.0], np.float32))
    a = np.concatenate(parts)
    np.testing.assert_array_equal(_e2m1_unsat_model(a), encode_e2m1(a) & 7)
    assert int(_e2m1_unsat_model(np.array([7.0], np.float32))[0]) == 8  # not a code: bound



def test_patched_register_cap_gets_its_own_kernel_key(monkeypatch):
    """The tests above patch BULK_MAX_BLOCKS (register cap 64 -> 128): the kernel key holds the
    cap (``MoeQuantizeSpec.build_facts``), so their kernels never stand in, from the kernel
    cache, for the unpatched ones the ops and bundles launch (a 128-register kernel where the
    plan counts 4 blocks an SM)."""
    from blockscale.ops import _core
    from blockscale.ops.quantize import QuantizeSpec

    spec = QG.with_schedule(QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "grouped",
                                         name="grouped_quantize_dynamic_scaled"), "wide_bulk2")
    key = _core.kernel_key(spec)
    assert spec.build_facts() == {"maxnreg": 64}
    monkeypatch.setattr(QG, "BULK_MAX_BLOCKS", 1)
    assert spec.build_facts() == {"maxnreg": 128} and _core.kernel_key(spec) != key
    monkeypatch.undo()
    assert _core.kernel_key(spec) == key

"""The "_x2" schedule of grouped quantize (``schedule="wide_bulk2_x2"``, the MXFP8 default:
the bulk kernel launched with 2 resident waves of blocks, each block walking a shorter
contiguous share of the row groups) in the interpreter, byte for byte against
blockscale.reference: edge values, MAX's grouped cases, gathers and empty groups, NVFP4 rows
over many groups, with one resident wave and with one SM (NUM_SMS = 1: the waves decide how
many blocks share the rows), and the plan / spec facts (grid, kernel names, bundle entries,
bad and removed waves: the other "_x2" / "_x4" forms were removed in session 6; the bulk
kernels' "_x3" / "_x4" came back in session 13, run CL, as the large MX defaults)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from _quantize_helpers import group_offsets
from test_quantize_moe_rows import COUNTS, IDS, _grouped, check_gather_and_empty_groups
from test_quantize_moe_stream import MAX_CASES, check_nvfp4_many_groups

pytest.importorskip("mlir")

from blockscale.ops import quantize_grouped as QG
from blockscale.ops import quantize_silu as QS
from blockscale.ops.quantize import QuantizeSpec

pytestmark = pytest.mark.interp
SCHEDULE = "wide_bulk2_x2"


@pytest.fixture(params=[132, 1], ids=["wave", "few_blocks"])
def sms(request, monkeypatch):
    monkeypatch.setattr(QG, "NUM_SMS", request.param)
    return request.param


@pytest.mark.parametrize("schedule", [SCHEDULE, "wide_bulk2_x3", "wide_bulk2_x4"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_grouped_waves_edges(fmt, schedule, sms):
    """Ties, NaN / Inf / -0, near-zero rows, an unused expert, K = 72 (a half-valid chunk)."""
    _grouped(fmt, "sm_90a", schedule, COUNTS, IDS, 72, 11)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_grouped_waves_max_cases(fmt, monkeypatch):
    """MAX's grouped cases (empty groups, expert id -1, K = 32 .. 72) on one SM."""
    monkeypatch.setattr(QG, "NUM_SMS", 1)
    for counts, ids, k in MAX_CASES:
        _grouped(fmt, "sm_90a", SCHEDULE, counts, ids, k, k)


def test_grouped_waves_gather_and_empty_groups(sms):
    check_gather_and_empty_groups(SCHEDULE, "sm_90a")


def test_grouped_waves_nvfp4_many_groups(monkeypatch):
    """NVFP4 blocks starting inside many small groups, each with its own tensor scale."""
    monkeypatch.setattr(QG, "NUM_SMS", 1)
    check_nvfp4_many_groups(SCHEDULE)


def test_waves_plan_and_names():
    base = QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "grouped",
                        name="grouped_quantize_dynamic_scaled")
    one = QG.with_schedule(base, "wide_bulk2")
    s = QG.with_schedule(base, SCHEDULE)
    assert s.waves == 2 and s.bulk == 2 and s.kernel_name.endswith("_wide2_bulk2_x2")
    assert s == dataclasses.replace(one, waves=2)  # the same kernel fields otherwise
    assert one.waves == 1 and not one.kernel_name.endswith("_x1")
    # K = 4096: 2 rows a step, 4096 row groups; 2 waves of 132 SMs x bulk blocks per SM
    per_sm = QG.bulk_blocks_per_sm(s)
    assert QG.wide_plan(s, 8192, 4096, 128)[0] == (1, 2 * 132 * per_sm, 1)
    assert QG.wide_plan(one, 8192, 4096, 128)[0] == (1, 132 * per_sm, 1)
    assert QG.wide_plan(s, 10, 4096, 65)[0] == (1, 5, 1)  # no more blocks than row groups
    silu = QuantizeSpec("mxfp4", "sm_90a", "up", "tcgen5d", True, "silu")
    assert QG.with_schedule(silu, SCHEDULE).waves == 2  # the fused op: the same kernel, no table
    unaligned = QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", False, "grouped")
    assert QG.with_schedule(unaligned, SCHEDULE) is unaligned  # the tile kernel
    names = {s.kernel_name for s in QG.bundle_specs("sm_90a") + QS.bundle_specs("sm_90a")}
    assert {f"grouped_quantize_dynamic_scaled_{f}_5d_v_wide2_bulk2_x2"
            for f in ("nvfp4_rn", "mxfp4_up", "mxfp8_up")} <= names
    assert not any(n.endswith(("_plut", "_plut_x2")) for n in names)
    # more waves (session 13, run CL): grouped MXFP4 x3 / MXFP8 x4, fused MXFP8 x4 defaults
    assert {n for n in names if n.endswith(("_x3", "_x4"))} == {
        f"grouped_quantize_dynamic_scaled_{f}_5d_v_wide2_bulk2_x{w}"
        for f in ("nvfp4_rn", "mxfp4_up", "mxfp8_up") for w in (3, 4)} | {
        "grouped_quantize_dynamic_scaled_mxfp4_up_5d_v_gather_wide2_bulk2_x3",  # the defaults'
        "grouped_quantize_dynamic_scaled_mxfp8_up_5d_v_gather_wide2_bulk2_x4"} | {  # gathers
        f"fused_silu_quantize_{f}_5d_v_{a}_wide1_bulk2_lut_x4"
        for f in ("nvfp4_rn", "mxfp4_up", "mxfp8_up") for a in ("silu", "swiglu_oai")}
    assert QG.wide_plan(QG.with_schedule(base, "wide_bulk2_x4"), 8192, 4096, 128)[0] == (
        1, 4 * 132 * per_sm, 1)
    # the fused two-wave table kernels (session 12; one chunk a visit: session 13): bundled,
    # on the table kernel's names
    assert {n for n in names if n.endswith("_lut_x2")} == {
        f"fused_silu_quantize_{f}_5d_v_{a}_wide{w}_bulk2_lut_x2"
        for f in ("nvfp4_rn", "mxfp4_up", "mxfp8_up") for a in ("silu", "swiglu_oai")
        for w in (1, 2)}
    with pytest.raises(ValueError, match="fused op's"):  # one chunk a visit: fused only
        QG.with_schedule(base, "wide1_bulk2_lut_x2")
    with pytest.raises(ValueError, match="1: fused bulk kernels"):
        QG.MoeQuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "silu", wide=1)
    with pytest.raises(ValueError, match="waves must be one of"):
        QG.MoeQuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "grouped", wide=2, waves=5)
    with pytest.raises(ValueError, match="wide schedules only"):
        QG.MoeQuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "grouped", stream=True,
                           waves=2)
    for removed in ("wide_x2", "wide_x4", "wide4_x2", "wide4_x4", "wide_bulk2_lut_x4", "wide_plut", "wide_bulk2_plut", "wide_bulk2_plut_x2"):
        with pytest.raises(ValueError, match="schedule"):
            QG.with_schedule(base, removed)


def test_grouped_default_by_format(monkeypatch):
    """Per-format default schedules: an entry of DEFAULT_GROUPED_SCHEDULE_BY_FORMAT wins for
    its format only (the op's schedule=None on sm_90a)."""
    import ml_dtypes

    monkeypatch.setattr(QG, "DEFAULT_GROUPED_SCHEDULE_BY_FORMAT", {"mxfp8": "wide_bulk2_x2"})
    assert QG.grouped_default("mxfp8") == "wide_bulk2_x2"
    assert QG.grouped_default("nvfp4") == QG.DEFAULT_GROUPED_SCHEDULE
    seen = []
    monkeypatch.setattr(QG, "run_grouped", lambda spec, *a, **k: seen.append(spec))
    es, offs = group_offsets([3, 2])
    x = np.ones((5, 64), ml_dtypes.bfloat16)
    for fmt in ("mxfp8", "mxfp4"):
        QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, np.array([0, 1], np.int32), None,
                                           device="interp", target="sm_90a")
    assert seen[0].bulk == 2 and seen[0].waves == 2
    assert seen[1].wide == 2 and seen[1].bulk == 0 and seen[1].waves == 1


def test_grouped_default_by_size(monkeypatch):
    """From LARGE_GROUPED_ELEMENTS input elements (rows x K, the gathered rows with indices)
    on, every format runs the bulk kernel on several waves (LARGE_GROUPED_SCHEDULE, or its
    LARGE_GROUPED_SCHEDULE_BY_FORMAT entry); below, its per-format default."""
    import ml_dtypes

    big = QG.LARGE_GROUPED_ELEMENTS
    assert [QG.grouped_default(f, big) for f in ("nvfp4", "mxfp4", "mxfp8")] == [
        QG.LARGE_GROUPED_SCHEDULE, "wide_bulk2_x3", "wide_bulk2_x4"]
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        assert QG.grouped_default(fmt, big - 1) == QG.grouped_default(fmt)
    assert QG.grouped_default("nvfp4") != QG.LARGE_GROUPED_SCHEDULE  # the rule changes something
    seen = []
    monkeypatch.setattr(QG, "run_grouped", lambda spec, *a, **k: seen.append(spec))
    monkeypatch.setattr(QG, "LARGE_GROUPED_ELEMENTS", 6 * 64)
    es, offs = group_offsets([4, 2])
    x = np.ones((3, 64), ml_dtypes.bfloat16)
    ids = np.array([0, 1], np.int32)
    tsf = np.ones(2, np.float32)
    QG.grouped_quantize_dynamic_scaled(x, "nvfp4", es, offs, ids, tsf,
                                       indices=np.arange(6, dtype=np.int32), indices_divisor=2,
                                       device="interp", target="sm_90a")
    QG.grouped_quantize_dynamic_scaled(x, "nvfp4", *group_offsets([2, 1]), ids, tsf,
                                       device="interp", target="sm_90a")
    assert seen[0] == QG.with_schedule(seen[0], QG.LARGE_GROUPED_SCHEDULE, 2)  # 6 rows x 64
    assert seen[1] == QG.with_schedule(seen[1], QG.grouped_default("nvfp4"), 2)  # 3 rows


def test_bundle_holds_every_default_form():
    """The GPU machine has no compiler: each per-format default schedule must be bundled in
    every form the op launches (aligned or not, with or without a gather) — run W found the
    gathered MXFP8 default missing."""
    from blockscale.ops.quantize import QuantizeSpec

    bundled = set(QG.bundle_specs("sm_90a"))
    for fmt, elements in itertools.product(("nvfp4", "mxfp4", "mxfp8"),
                                           (0, QG.LARGE_GROUPED_ELEMENTS)):
        for aligned in (True, False):
            for gather in (False, True):
                spec = QG.with_schedule(QuantizeSpec(fmt, "sm_90a", None, "tcgen5d", aligned,
                                                     "grouped", gather=gather,
                                                     name="grouped_quantize_dynamic_scaled"),
                                        QG.grouped_default(fmt, elements))
                assert spec in bundled, spec

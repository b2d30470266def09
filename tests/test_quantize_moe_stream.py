"""The stream and wide schedules of grouped and fused-SiLU quantize (``schedule="stream"`` /
``"stream2"`` / ``"stream_lut"`` / ``"stream2_lut"``, blockscale/ops/_quantize_stream_ir.py;
``"wide"`` / ``"wide4"`` / ``"wide_lut"``, blockscale/ops/_quantize_wide_ir.py) in the
interpreter, byte for byte against blockscale.reference: the rows schedules' edge
cases (ties, NaN / Inf / -0, near zero, unused experts, empty groups, gathers, MAX's
[0,3,1,2] / [-1,2,-1,0] groups, K not a multiple of 16), with one resident wave and with one
block per SM (NUM_SMS = 1: each block walks many row groups across group changes and many
padding units across tiles)."""

from __future__ import annotations

import numpy as np
import pytest
from _quantize_helpers import assert_same_bytes, group_offsets
from test_quantize_moe_rows import (
    COUNTS,
    IDS,
    TARGETS,
    _edges,
    _grouped,
    check_gather_and_empty_groups,
)

from blockscale.reference import grouped as RG

pytest.importorskip("mlir")

from blockscale.ops import quantize_grouped as QG
from blockscale.ops import quantize_silu as QS

pytestmark = pytest.mark.interp


@pytest.fixture(params=[132, 1], ids=["wave", "few_blocks"])
def sms(request, monkeypatch):
    monkeypatch.setattr(QG, "NUM_SMS", request.param)
    return request.param


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("schedule", ["stream", "stream2", "wide", "wide4", "wide_deep"])
def test_grouped_stream_edges(schedule, fmt, target, sms):
    _grouped(fmt, target, schedule, COUNTS, IDS, 72, 11)


@pytest.mark.parametrize("case", [([256, 128, 256], [0, 1, 2], 64),
                                  ([100, 200, 50], [2, 0, 1], 72),
                                  ([13, 999], [1, 0], 40),
                                  ([0, 3, 1, 2], [-1, 2, -1, 0], 32),
                                  ([1, 0, 0, 300, 0], [0, 1, 2, 3, 4], 4096)])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_grouped_stream_cases(fmt, case):
    """The rows tests' grouped cases plus a MAX-sized row (K = 4096: one row per block
    iteration, 64 / 32 atoms per tile), alternating schedules and targets."""
    counts, ids, k = case
    i = len(counts) + len(fmt)
    _grouped(fmt, TARGETS[i % 4], ("stream", "stream2")[i % 2], counts, ids, k, k)


@pytest.mark.parametrize("schedule", ["stream", "stream2", "wide", "wide4", "wide_deep"])
def test_grouped_stream_gather_and_empty_groups(schedule, sms):
    check_gather_and_empty_groups(schedule, "sm_90a")


def check_fused_formats(gu, es, offs, ids, schedule: str, activation: str, isc_len: int,
                        what: str, target: str = "sm_90a",
                        fmts: tuple[str, ...] = ("nvfp4", "mxfp4", "mxfp8")) -> None:
    """``fused_silu_quantize`` of ``gu`` (groups ``es`` / ``offs`` / ``ids``) with
    ``schedule`` in the interpreter == blockscale.reference's, byte for byte, for NVFP4
    (input scales 2, 0.5, 1e-38 repeated to ``isc_len``), MXFP4 and MXFP8 (or ``fmts``);
    ``what`` names the case in a failure."""
    ids32 = np.asarray(ids, np.int32)
    for fmt in fmts:
        isc = (np.resize(np.asarray([2.0, 0.5, 1e-38], np.float32), isc_len)
               if fmt == "nvfp4" else None)
        dd, ss = QS.fused_silu_quantize(gu, fmt, es, offs, ids32, isc, activation=activation,
                                        device="interp", target=target, schedule=schedule)
        rd, rs = RG.fused_silu_quantize(gu, fmt, es, offs, ids32, isc, activation=activation)
        assert_same_bytes(dd, rd, f"{schedule} {fmt} {activation} {what} data")
        assert_same_bytes(ss, rs, f"{schedule} {fmt} {activation} {what} scales")


@pytest.mark.parametrize("target", ["sm_90a", "gfx950"])
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("schedule", ["stream", "stream2", "stream_lut", "stream2_lut", "wide",
                                      "wide_lut"])
def test_fused_stream_edges(schedule, activation, target, sms):
    es, offs = group_offsets(COUNTS)
    gu = _edges(int(es[-1]), 144, 12)  # D = 72
    gu[9, :72] = -100.0
    check_fused_formats(gu, es, offs, IDS, schedule, activation, 3, target, target)


def test_fused_stream_spare_tiles():
    """MAX's groups with num_scale_tiles beyond the groups' tiles (spare tiles zeroed)."""
    es, offs = group_offsets([0, 3, 1, 2])
    ids = np.array([-1, 2, -1, 0], np.int32)
    gu = _edges(int(es[-1]), 64, 21)
    d, s = QS.fused_silu_quantize(gu, "mxfp4", es, offs, ids, None, num_scale_tiles=7,
                                  device="interp", target="sm_90a", schedule="stream_lut")
    rd, rs = RG.fused_silu_quantize(gu, "mxfp4", es, offs, ids, None, num_scale_tiles=7)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


def test_stream_schedule_choice_and_plan():
    from blockscale.ops.quantize import QuantizeSpec

    base = QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "grouped",
                        name="grouped_quantize_dynamic_scaled")
    s2 = QG.with_schedule(base, "stream2", 300)  # no group limit: no shared tables
    assert isinstance(s2, QG.MoeQuantizeSpec) and s2.stream and s2.unroll == 2
    assert s2.kernel_name.endswith("_stream2")
    assert QG.with_schedule(base, "stream").unroll == 1
    unaligned = QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", False, "grouped")
    assert QG.with_schedule(unaligned, "stream") is unaligned  # the tile kernel
    silu = QuantizeSpec("mxfp4", "sm_90a", "up", "tcgen5d", True, "silu")
    lut = QG.with_schedule(silu, "stream2_lut")
    assert lut.lut and lut.stream and lut.unroll == 2
    assert lut.kernel_name.endswith("_stream2_lut")
    grid, sc = QG.stream_plan(QG.with_schedule(base, "stream"), 8192, 4096, 128)
    assert grid == (1, 792, 1) and sc["cb_log2"] == 8  # 132 SMs x 6 blocks (40 regs)
    grid, _ = QG.stream_plan(QG.with_schedule(base, "stream2"), 8192, 4096, 128)
    assert grid == (1, 660, 1)  # 5 blocks (48 regs)
    grid, _ = QG.stream_plan(QG.with_schedule(base, "stream"), 100, 4096, 65)
    assert grid == (1, 100, 1)  # no more blocks than row groups
    names = {s.kernel_name for s in QG.bundle_specs("sm_90a") + QS.bundle_specs("sm_90a")}
    assert {"grouped_quantize_dynamic_scaled_nvfp4_rn_5d_v_stream1",
            "grouped_quantize_dynamic_scaled_mxfp8_up_5d_v_gather_stream2",
            "fused_silu_quantize_mxfp4_up_5d_v_silu_stream2_lut"} <= names


def check_nvfp4_many_groups(schedule: str, k: int = 64) -> None:
    """Grouped NVFP4 quantize with ``schedule`` == the reference (``_grouped``) on 10 small
    groups (two empty, expert id -1 at 3), each with its own tensor scale."""
    counts = [5, 11, 0, 3, 30, 1, 17, 9, 0, 24]
    ids = list(range(len(counts)))
    ids[3] = -1
    tsf = np.geomspace(0.05, 40.0, len(counts)).astype(np.float32)
    _grouped("nvfp4", "sm_90a", schedule, counts, ids, k, 3, tsf)


@pytest.mark.parametrize("k", [64, 4096])
@pytest.mark.parametrize("schedule", ["stream", "stream2", "wide", "wide4", "wide_deep"])
def test_grouped_stream_nvfp4_blocks_over_many_groups(schedule, k, monkeypatch):
    """NVFP4 blocks whose rows span many groups (few resident blocks, small groups, each
    with its own tensor scale): the carried group state is re-found at every change; a
    64-row row group (K = 64) spans several groups within one block iteration."""
    monkeypatch.setattr(QG, "NUM_SMS", 1)
    check_nvfp4_many_groups(schedule, k)


#: MAX's grouped cases (counts, expert ids, K)
MAX_CASES = [([256, 128, 256], [0, 1, 2], 64), ([100, 200, 50], [2, 0, 1], 72),
             ([13, 999], [1, 0], 40), ([0, 3, 1, 2], [-1, 2, -1, 0], 32)]


@pytest.mark.parametrize("schedule", ["wide", "wide4", "wide_deep"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_grouped_wide_max_cases(fmt, schedule):
    """The wide schedules on MAX's grouped cases (K = 32 .. 72: 1-5 chunks a row, so a
    thread's chunks past K, a half-valid last chunk and one-lane rows all occur)."""
    for counts, ids, k in MAX_CASES:
        _grouped(fmt, "sm_90a", schedule, counts, ids, k, k)


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("schedule", ["wide", "wide_lut"])
def test_fused_wide_max_cases(schedule, activation):
    for counts, ids, d in MAX_CASES:
        es, offs = group_offsets(counts)
        gu = _edges(int(es[-1]), 2 * d, d)
        check_fused_formats(gu, es, offs, ids, schedule, activation, 3, str(counts))


def test_wide_schedule_choice_and_plan():
    from blockscale.ops.quantize import QuantizeSpec

    base = QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "grouped",
                        name="grouped_quantize_dynamic_scaled")
    w = QG.with_schedule(base, "wide")
    assert w.wide == 2 and not w.stream and w.kernel_name.endswith("_wide2")
    assert QG.with_schedule(base, "wide4_lut").wide == 4  # grouped: no table
    assert not QG.with_schedule(base, "wide4_lut").lut
    unaligned = QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", False, "grouped")
    assert QG.with_schedule(unaligned, "wide") is unaligned  # the tile kernel
    silu = QuantizeSpec("mxfp4", "sm_90a", "up", "tcgen5d", True, "silu")
    lut = QG.with_schedule(silu, "wide_lut")
    assert lut.lut and lut.wide == 2 and lut.kernel_name.endswith("_wide2_lut")
    # K = 4096 NVFP4: 256 chunks a row, 2 a thread: 2 rows per block step; 64 registers:
    # 4 blocks per SM
    grid, sc = QG.wide_plan(w, 8192, 4096, 128)
    assert grid == (1, 528, 1) and sc["cb_log2"] == 8
    grid, _ = QG.wide_plan(QG.with_schedule(base, "wide4"), 8192, 4096, 128)
    assert grid == (1, 264, 1)  # 128 registers: 2 blocks per SM
    grid, _ = QG.wide_plan(w, 10, 4096, 65)
    assert grid == (1, 5, 1)  # no more blocks than row groups
    names = {s.kernel_name for s in QG.bundle_specs("sm_90a") + QS.bundle_specs("sm_90a")}
    deep = QG.with_schedule(base, "wide_deep")
    assert deep.wide == 2 and deep.unroll == 2 and deep.kernel_name.endswith("_wided2")
    grid, _ = QG.wide_plan(deep, 8192, 4096, 128)
    assert grid == (1, 396, 1)  # 80 registers: 3 blocks per SM
    assert {"grouped_quantize_dynamic_scaled_nvfp4_rn_5d_v_wide2",
            "grouped_quantize_dynamic_scaled_mxfp4_up_5d_v_wided2",
            "grouped_quantize_dynamic_scaled_mxfp8_up_5d_v_gather_wide4",
            "fused_silu_quantize_mxfp4_up_5d_v_silu_wide2_lut"} <= names


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_fused_wide_lut_every_gate(activation):
    """Every bf16 bit pattern as a gate through the wide_lut kernel (its batched table fill:
    every entry read back), byte for byte against the reference."""
    import ml_dtypes

    gate = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256).view(ml_dtypes.bfloat16)
    up = (np.random.default_rng(7).standard_normal((256, 256)) * 2).astype(ml_dtypes.bfloat16)
    gu = np.concatenate([gate, up], axis=1)
    es, offs = group_offsets([120, 136])
    ids = np.array([1, 0], np.int32)
    isc = np.array([0.7, 3.0], np.float32)
    d, s = QS.fused_silu_quantize(gu, "nvfp4", es, offs, ids, isc, activation=activation,
                                  device="interp", target="sm_90a", schedule="wide_lut")
    rd, rs = RG.fused_silu_quantize(gu, "nvfp4", es, offs, ids, isc, activation=activation)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
def test_grouped_wide_many_groups(target, sms):
    """More groups than one step of the first-group count (warp x 4 entries: its loop runs),
    many empty, each block's rows crossing several groups (NUM_SMS = 1)."""
    rng = np.random.default_rng(9)
    counts = rng.integers(0, 4, 300)
    counts[rng.integers(0, 300, 60)] = 0
    ids = rng.integers(-1, 8, 300)
    _grouped("nvfp4", target, "wide_deep", counts.tolist(), ids.tolist(), 32, 9,
             np.geomspace(0.1, 10.0, 8).astype(np.float32))

"""The rows schedules of grouped and fused-SiLU quantize (``schedule="rows"`` / ``"rows2"`` /
``"rows_lut"`` / ``"rows2_lut"``, blockscale/ops/quantize_moe_ir.py) in the interpreter on all four targets, byte for byte
against blockscale.reference: edge values (ties, NaN / Inf / -0, near zero, recip = +inf),
unused experts (id -1), empty groups, partial chunks (K = 72, 30), gathers, and few resident
blocks (NUM_SMS = 1) so each block walks many units across group changes (the shared
reciprocal table is refilled) and padding units (partial last tiles, spare tiles)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _quantize_helpers import assert_same_bytes, group_offsets

from blockscale.activations import GatedActivation, exp_f32
from blockscale.reference import grouped as RG

pytest.importorskip("mlir")

from blockscale.ops import quantize_grouped as QG  # noqa: E402
from blockscale.ops import quantize_silu as QS  # noqa: E402

pytestmark = pytest.mark.interp
TARGETS = ("sm_90a", "sm_100a", "gfx942", "gfx950")
COUNTS, IDS, TSF = [130, 20, 60], [2, -1, 0], [0.43, 3.0, 1e38]


def _edges(m: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32) * 3
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.0, 448.0, 464.0, -2.5],
                    np.float32)
    x.flat[rng.integers(0, x.size, x.size // 6)] = rng.choice(ties, x.size // 6)
    row = np.tile(np.array([0.0, -0.0] + [1e-38] * 6 + [-1e-38] * 8, np.float32), -(-k // 16))
    x[1 % m, :] = row[:k]
    x[5 % m, 3], x[6 % m, k - 1], x[7 % m, 8] = np.nan, np.inf, -np.inf
    if m > 140:
        x[140, :] = row[:k]  # near zero in the second group (an unused expert)
    return x.astype(ml_dtypes.bfloat16)


@pytest.fixture(params=[132, 1], ids=["wave", "few_blocks"])
def sms(request, monkeypatch):
    monkeypatch.setattr(QG, "NUM_SMS", request.param)
    return request.param


def _grouped(fmt, target, schedule, counts, ids, k, seed, tsf=None, **kw):
    es, offs = group_offsets(counts)
    ids = np.asarray(ids, np.int32)
    x = _edges(max(int(es[-1]), 8) if "indices" in kw else int(es[-1]), k, seed)
    if fmt == "nvfp4" and tsf is None:
        tsf = np.resize(np.asarray(TSF, np.float32), max(3, int(ids.max()) + 1))
    if fmt != "nvfp4":
        tsf = None
    d, s = QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, device="interp",
                                              target=target, schedule=schedule, **kw)
    rd, rs = RG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, **kw)
    assert_same_bytes(d, rd, f"grouped {fmt} {target} {schedule} data")
    assert_same_bytes(s, rs, f"grouped {fmt} {target} {schedule} scales")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("schedule", ["rows", "rows2"])
def test_grouped_rows_edges(schedule, fmt, target, sms):
    _grouped(fmt, target, schedule, COUNTS, IDS, 72, 11)


@pytest.mark.parametrize("case", [([256, 128, 256], [0, 1, 2], 64),
                                  ([100, 200, 50], [2, 0, 1], 72),
                                  ([13, 999], [1, 0], 40),
                                  ([0, 3, 1, 2], [-1, 2, -1, 0], 30)])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_grouped_rows_cases(fmt, case):
    """The tile kernel's grouped cases (incl. MAX's [0,3,1,2] / [-1,2,-1,0]), each on one
    target (rotating) and one schedule."""
    counts, ids, k = case
    i = (len(counts) + len(fmt)) % 4
    _grouped(fmt, TARGETS[i], ("rows", "rows2")[i % 2], counts, ids, k, k)


def check_gather_and_empty_groups(schedule: str, target: str) -> None:
    """A gather (indices, indices_divisor 2), then empty groups with arbitrary offsets (as
    device arrays would pass them) and spare tiles: byte-identical to the reference."""
    rng = np.random.default_rng(5)
    idx = rng.integers(0, 2 * 81, 160).astype(np.int32)
    es, offs = group_offsets([100, 60])
    x = _edges(81, 64, 4)
    tsf = np.array([1.0, 0.5], np.float32)
    ids = np.array([0, 1], np.int32)
    d, s = QG.grouped_quantize_dynamic_scaled(x, "nvfp4", es, offs, ids, tsf, indices=idx,
                                              indices_divisor=2, device="interp",
                                              target=target, schedule=schedule)
    rd, rs = RG.grouped_quantize_dynamic_scaled(x, "nvfp4", es, offs, ids, tsf, indices=idx,
                                                indices_divisor=2)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)
    QG_search = QG.search_offsets
    try:
        QG.search_offsets = lambda e, o: o
        counts = [100, 0, 160, 0, 30]
        es, offs = group_offsets(counts)
        offs[1], offs[3] = 7, -3
        ids = np.array([0, 1, -1, 2, 1], np.int32)
        x = _edges(int(es[-1]), 64, 15)
        tsf = np.array([0.43, 2.0, 1e38], np.float32)
        d, s = QG.grouped_quantize_dynamic_scaled(x, "nvfp4", es, offs, ids, tsf,
                                                  device="interp", target=target,
                                                  schedule=schedule)
        rd, rs = RG.grouped_quantize_dynamic_scaled(x, "nvfp4", es, offs, ids, tsf)
        assert_same_bytes(d, rd)
        assert_same_bytes(s, rs)
    finally:
        QG.search_offsets = QG_search


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
@pytest.mark.parametrize("schedule", ["rows", "rows2"])
def test_grouped_rows_gather_and_empty_groups(schedule, target, sms):
    check_gather_and_empty_groups(schedule, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("schedule", ["rows", "rows2", "rows_lut", "rows2_lut"])
def test_fused_rows_edges(schedule, activation, target, sms):
    es, offs = group_offsets(COUNTS)
    ids = np.asarray(IDS, np.int32)
    gu = _edges(int(es[-1]), 144, 12)  # D = 72
    gu[9, :72] = -100.0
    for fmt in ("nvfp4", "mxfp8") if target in ("sm_90a", "gfx942") else ("nvfp4",):
        isc = np.asarray([2.0, 0.5, 1e-38], np.float32) if fmt == "nvfp4" else None
        d, s = QS.fused_silu_quantize(gu, fmt, es, offs, ids, isc, activation=activation,
                                      device="interp", target=target, schedule=schedule)
        rd, rs = RG.fused_silu_quantize(gu, fmt, es, offs, ids, isc, activation=activation)
        assert_same_bytes(d, rd, f"silu {fmt} {activation} {target} data")
        assert_same_bytes(s, rs, f"silu {fmt} {activation} {target} scales")


@pytest.mark.parametrize("schedule", ["rows", "rows_lut"])
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_fused_rows_unaligned_and_spare_tiles(fmt, schedule):
    """D = 30 (scalar path), num_scale_tiles beyond the groups' tiles (spare tiles)."""
    es, offs = group_offsets([0, 3, 1, 2])
    ids = np.array([-1, 2, -1, 0], np.int32)
    gu = _edges(int(es[-1]), 60, 21)
    d, s = QS.fused_silu_quantize(gu, fmt, es, offs, ids, None, num_scale_tiles=7,
                                  device="interp", target="gfx950", schedule=schedule)
    rd, rs = RG.fused_silu_quantize(gu, fmt, es, offs, ids, None, num_scale_tiles=7)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


def test_schedule_choice_and_fallback():
    from blockscale.ops.quantize import QuantizeSpec

    base = QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "grouped",
                        name="grouped_quantize_dynamic_scaled")
    assert QG.with_schedule(base, "tiles") is base
    rows2 = QG.with_schedule(base, "rows2", 64)
    assert isinstance(rows2, QG.MoeQuantizeSpec) and rows2.unroll == 2
    assert rows2.kernel_name.endswith("_rows2")
    assert QG.with_schedule(base, "rows", 257) is base  # > MAX_GROUPS: the tile kernel
    with pytest.raises(ValueError, match="schedule"):
        QG.with_schedule(base, "diagonal")
    with pytest.raises(ValueError, match="unroll"):
        QG.MoeQuantizeSpec("nvfp4", mode="grouped", unroll=3)
    with pytest.raises(ValueError, match="mode"):
        QG.MoeQuantizeSpec("nvfp4", mode="dense")
    grid, sc = QG.rows_plan(rows2, 8192, 4096, 128, 64)
    assert grid == (1, 528, 1) and sc["split_log2"] == 0  # 132 SMs x 4 blocks (64 regs)
    names = {s.kernel_name for s in QG.bundle_specs("sm_90a") + QS.bundle_specs("sm_90a")}
    assert {"grouped_quantize_dynamic_scaled_nvfp4_rn_5d_v_rows1",
            "fused_silu_quantize_mxfp4_up_5d_v_silu_rows2"} <= names


ACTS = [GatedActivation.SILU, GatedActivation.SWIGLU_OAI,
        GatedActivation.swiglu_oai(1.0, 10.0)]


@pytest.mark.parametrize("act", ACTS, ids=["silu", "oai", "oai_1_10"])
def test_sigmoid_lut_every_gate(act):
    """The table gives D10's sigmoid bits for all 65536 bf16 gates (NaN gates excepted: their
    products are NaN whatever the entry)."""
    table, lo, width = QS.sigmoid_lut(act.kind, float(act.alpha), float(act.limit))
    assert table.dtype == np.float32 and table.shape == (2 * width,)
    assert 2 * width <= QS.MAX_LUT
    b = np.arange(1 << 16, dtype=np.uint32)
    g = (b << 16).view(np.float32)
    one = np.float32(1)
    with np.errstate(all="ignore"):
        v = g if act.kind == "silu" else np.float32(act.alpha) * np.minimum(g, np.float32(
            act.limit))
        want = one / (one + exp_f32(-v))
    idx = (b >> 15) * width + np.clip(b & 0x7FFF, lo, lo + width - 1) - lo
    got = table[idx]
    finite = ~np.isnan(g)
    assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("act", ACTS[:2], ids=["silu", "oai"])
def test_fused_lut_every_gate_through_the_kernel(act, target):
    """Every bf16 bit pattern as a gate (NaN, Inf, subnormals, both zeros) through the rows_lut
    kernel, byte for byte against the reference."""
    gate = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256).view(ml_dtypes.bfloat16)
    rng = np.random.default_rng(7)
    up = (rng.standard_normal((256, 256)) * 2).astype(ml_dtypes.bfloat16)
    gu = np.concatenate([gate, up], axis=1)
    es, offs = group_offsets([120, 136])
    ids = np.array([1, 0], np.int32)
    isc = np.array([0.7, 3.0], np.float32)
    d, s = QS.fused_silu_quantize(gu, "nvfp4", es, offs, ids, isc, activation=act,
                                  device="interp", target=target, schedule="rows_lut")
    rd, rs = RG.fused_silu_quantize(gu, "nvfp4", es, offs, ids, isc, activation=act)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


def test_fused_lut_kernel_reads_the_table(monkeypatch):
    """A perturbed table entry changes the output: the kernel's sigmoid is the table's."""
    table, lo, width = QS.sigmoid_lut("silu", 1.0, float("inf"))
    bad = table.copy()
    mag = 0x3F80 - lo  # gate +1.0
    bad[mag] = np.float32(0.25)
    monkeypatch.setattr(QS, "sigmoid_lut", lambda *a: (bad, lo, width))
    es, offs = group_offsets([16])
    gu = np.ones((16, 64), ml_dtypes.bfloat16)
    d, _ = QS.fused_silu_quantize(gu, "mxfp8", es, offs, np.array([0], np.int32), None,
                                  device="interp", target="sm_90a", schedule="rows_lut")
    rd, _ = RG.fused_silu_quantize(gu, "mxfp8", es, offs, np.array([0], np.int32), None)
    assert not np.array_equal(np.asarray(d).view(np.uint8), rd.view(np.uint8))


def test_lut_buffer_one_device_copy_per_device():
    """Device-array calls get one cached device copy of the table per device; host calls the
    numpy table."""

    class Dev:
        copies = 0

        def to_device(self, a):
            Dev.copies += 1
            return ("dev", a)

    key = ("silu", 1.0, float("inf"))
    d1, d2 = Dev(), Dev()
    assert isinstance(QS._lut_buffer(d1, key, True), np.ndarray)
    a = QS._lut_buffer(d1, key, False)
    assert QS._lut_buffer(d1, key, False) is a and Dev.copies == 1
    QS._lut_buffer(d2, key, False)
    assert Dev.copies == 2

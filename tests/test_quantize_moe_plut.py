"""The fused op's "*_plut" schedules (``schedule="wide_plut"`` / ``"wide_bulk2_plut"``: the
wide / bulk kernels whose shared table holds SILU's first product ``fl(g * sigmoid(g))``,
blockscale/ops/_quantize_wide_ir.py ``_silu_product``) in the interpreter, byte for byte
against blockscale.reference: every bf16 gate (in the table's window: the table path; NaN,
Inf, +-0, |g| >= 89, tiny gates: the exp_f32 path of their chunk), the rows tests' edge rows
and MAX's grouped cases for the three formats, SWIGLU_OAI (which runs the sigmoid table),
one resident wave and one SM; the table itself and the spec / name facts."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _quantize_helpers import assert_same_bytes, group_offsets
from test_quantize_moe_rows import COUNTS, IDS, _edges
from test_quantize_moe_stream import MAX_CASES

from blockscale.reference import grouped as RG

pytest.importorskip("mlir")

from blockscale.ops import quantize_grouped as QG
from blockscale.ops import quantize_silu as QS
from blockscale.ops.quantize import QuantizeSpec

pytestmark = pytest.mark.interp
PLUT = ["wide_plut", "wide_bulk2_plut"]


@pytest.fixture(params=[132, 1], ids=["wave", "few_blocks"])
def sms(request, monkeypatch):
    monkeypatch.setattr(QG, "NUM_SMS", request.param)
    return request.param


def _fused(gu, fmt, counts, ids, schedule, activation, isc=None):
    es, offs = group_offsets(counts)
    ids = np.asarray(ids, np.int32)
    if fmt == "nvfp4" and isc is None:
        isc = np.resize(np.asarray([2.0, 0.5, 1e-38], np.float32), len(ids))
    if fmt != "nvfp4":
        isc = None
    d, s = QS.fused_silu_quantize(gu, fmt, es, offs, ids, isc, activation=activation,
                                  device="interp", target="sm_90a", schedule=schedule)
    rd, rs = RG.fused_silu_quantize(gu, fmt, es, offs, ids, isc, activation=activation)
    assert_same_bytes(d, rd, f"{schedule} {fmt} {activation} {counts} data")
    assert_same_bytes(s, rs, f"{schedule} {fmt} {activation} {counts} scales")


@pytest.mark.parametrize("schedule", PLUT)
def test_plut_every_gate(schedule):
    """All 65536 bf16 gates, 16 consecutive bit patterns a chunk (chunks wholly inside the
    window, straddling its ends, all NaN / Inf, +-0 and tiny gates)."""
    gate = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256).view(ml_dtypes.bfloat16)
    up = (np.random.default_rng(7).standard_normal((256, 256)) * 2).astype(ml_dtypes.bfloat16)
    _fused(np.concatenate([gate, up], axis=1), "nvfp4", [120, 136], [1, 0], schedule, "silu",
           np.array([0.7, 3.0], np.float32))


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("schedule", PLUT)
def test_plut_edges(schedule, activation, sms):
    """Ties, NaN / Inf / -0, near-zero rows, an unused expert, D = 72 (a half-valid chunk),
    a row of gates -100 (sigmoid ~0), three formats."""
    es, _ = group_offsets(COUNTS)
    gu = _edges(int(es[-1]), 144, 12)
    gu[9, :72] = -100.0
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        _fused(gu, fmt, COUNTS, IDS, schedule, activation)


@pytest.mark.parametrize("schedule", PLUT)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_plut_max_cases(fmt, schedule):
    """MAX's grouped cases (empty groups, expert id -1, D = 32 .. 72), gates in the window
    (typical data: the table path), one SM."""
    for counts, ids, d in MAX_CASES:
        m = sum(counts)
        rng = np.random.default_rng(d)
        gu = (rng.standard_normal((m, 2 * d)) * 3).astype(ml_dtypes.bfloat16)
        _fused(gu, fmt, counts, ids, schedule, "silu")


def test_silu_lut_is_the_first_product():
    table, lo, width = QS.silu_lut()
    sig, slo, swidth = QS.sigmoid_lut("silu", 1.0, float("inf"))
    neg = QS.SILU_LUT_NEG
    assert (lo, width) == (slo, swidth) and table.shape == (neg + width,)
    assert width <= neg and not table[width:neg].any()
    mags = np.arange(lo, lo + width, dtype=np.uint32)
    for sign in (0, 1):
        g = ((mags | (sign << 15)) << 16).view(np.float32)
        want = (g.astype(np.float64) * sig[sign * width:(sign + 1) * width]).astype(np.float32)
        got = table[sign * neg:sign * neg + width]
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_plut_spec_and_names():
    silu = QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "silu", False, "silu", 1.702,
                        7.0, name="fused_silu_quantize")
    p = QG.with_schedule(silu, "wide_bulk2_plut")
    assert p.product and p.lut and p.bulk == 2 and p.kernel_name.endswith("_bulk2_plut")
    oai = QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "silu", False, "swiglu_oai",
                       1.702, 7.0, name="fused_silu_quantize")
    o = QG.with_schedule(oai, "wide_plut")
    assert o.lut and not o.product and o.kernel_name.endswith("_wide2_lut")
    grouped = QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "grouped")
    g = QG.with_schedule(grouped, "wide_bulk2_plut")
    assert not g.lut and not g.product and g.bulk == 2
    names = {s.kernel_name for s in QS.bundle_specs("sm_90a")}
    assert {"fused_silu_quantize_mxfp8_up_5d_v_silu_wide2_bulk2_plut",
            "fused_silu_quantize_nvfp4_rn_5d_v_silu_wide2_plut"} <= names
    with pytest.raises(ValueError, match="product needs"):
        QG.MoeQuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "silu", False,
                           "swiglu_oai", 1.702, 7.0, lut=True, wide=2, product=True)


@pytest.mark.parametrize("schedule", ["wide_bulk2_plut", "wide_bulk2_lut"])
def test_fused_amax_keeps_subnormals(schedule):
    """The fused wide kernels' chunk max is ``max.NaN.f32`` without ``.ftz`` (a flushed
    subnormal product would give a block of tiny values a zero scale; the interpreter runs
    the MLIR, before this lowering)."""
    from blockscale.ops import quantize as Q

    ptx = Q.kernel(QG.with_schedule(QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True,
                                                 "silu", False, "silu", 1.702, 7.0,
                                                 name="fused_silu_quantize"),
                                    schedule)).asm["ptx"]
    assert "max.NaN.f32" in ptx and ".ftz" not in ptx

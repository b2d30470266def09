"""The grouped and fused quantize ops' default schedule (``schedule=None``): the measured one
on sm_90a (DEFAULT_GROUPED_SCHEDULE / DEFAULT_SILU_SCHEDULE), DEFAULT_SCHEDULE elsewhere,
an explicit schedule always as given; chosen by ``quantize_grouped.default_schedule``. The
launch is intercepted (``run_grouped``): only the spec the op would run is checked."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from blockscale.ops import quantize_grouped as QG
from blockscale.ops import quantize_silu as QS
from blockscale.ops.quantize import QuantizeSpec


def test_default_schedule():
    f = QG.default_schedule
    assert f(None, "sm_90a", "stream2", ("sm_90a",)) == "stream2"
    assert f(None, "gfx942", "stream2", ("sm_90a",)) is None
    assert f("rows", "sm_90a", "stream2", ("sm_90a",)) == "rows"
    assert f("tiles", "gfx950", "stream2", ("sm_90a", "gfx950")) == "tiles"


def _capture(monkeypatch, module) -> list:
    specs: list = []

    def run_grouped(spec, *args, **kw):
        specs.append(spec)
        return "launched"

    monkeypatch.setattr(module, "run_grouped", run_grouped)
    return specs


GROUPS = (np.array([0, 3, 5], np.int32), np.array([0, 1], np.int32),
          np.array([1, 0], np.int32))


@pytest.mark.parametrize("target,schedule,want", [
    ("sm_90a", None, QG.grouped_default("mxfp8")), ("sm_100a", None, QG.DEFAULT_SCHEDULE),
    ("gfx942", None, QG.DEFAULT_SCHEDULE), ("sm_90a", "rows", "rows"),
    ("gfx942", "stream", "stream")])
def test_grouped_op_schedule(target, schedule, want, monkeypatch):
    specs = _capture(monkeypatch, QG)
    x = np.ones((5, 64), ml_dtypes.bfloat16)
    QG.grouped_quantize_dynamic_scaled(x, "mxfp8", *GROUPS, None, device="interp",
                                       target=target, schedule=schedule)
    base = QuantizeSpec("mxfp8", target, None, "tcgen5d", True, "grouped",
                        name="grouped_quantize_dynamic_scaled")
    assert specs == [QG.with_schedule(base, want, 2)]


@pytest.mark.parametrize("target,schedule,want", [
    ("sm_90a", None, QS.silu_default("mxfp8")), ("sm_100a", None, QG.DEFAULT_SCHEDULE),
    ("sm_90a", "rows2", "rows2")])
def test_fused_op_schedule(target, schedule, want, monkeypatch):
    specs = _capture(monkeypatch, QS)
    monkeypatch.setattr(QS, "_lut_buffer", lambda *a, **k: None)  # (the table's upload)
    gate_up = np.ones((5, 128), ml_dtypes.bfloat16)
    QS.fused_silu_quantize(gate_up, "mxfp8", *GROUPS, None, device="interp", target=target,
                           schedule=schedule)
    (spec,) = specs

    def spec_on(sch):
        return QS._spec(QS.Format.from_name("mxfp8"), target, QS.GatedActivation.parse(None),
                        True, sch, 2)

    assert spec == spec_on(want)
    assert spec != spec_on("rows" if want == QG.DEFAULT_SCHEDULE else QG.DEFAULT_SCHEDULE)

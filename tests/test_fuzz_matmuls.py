"""Smoke test of the tiled-matmul fuzz cases (benchmarks/fuzz_matmuls.py) on the interpreter:
a few cases of each op pass, and a wrong kernel output is reported as a mismatch."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import fuzz_matmuls as F

pytestmark = pytest.mark.interp


@pytest.mark.parametrize("op", list(F.OPS))
def test_cases_pass_on_interp(op):
    rng = np.random.default_rng([0, 7])
    for _ in range(2):
        ok, detail, _ = F.OPS[op](rng, "interp", "sm_90a")
        assert ok, detail


def test_wrong_output_is_a_mismatch(monkeypatch):
    from blockscale.ops import matmul as MM

    real = MM.block_scaled_matmul

    def one_wrong_output(*args, **kwargs):
        out = np.array(real(*args, **kwargs))
        out.flat[0] = out.flat[0] * 1.5 + 1  # far outside the bound of any case here
        return out

    monkeypatch.setattr(MM, "block_scaled_matmul", one_wrong_output)
    rng = np.random.default_rng([0, 7])
    results = [F.case_dense(rng, "interp", "sm_90a") for _ in range(4)]
    assert not any(ok for ok, _, _ in results), results


def test_fused_swiglu_differing_from_chained_is_a_mismatch(monkeypatch):
    from blockscale.ops import matmul_swiglu as SW

    real = SW.grouped_matmul_swiglu

    def one_scale_byte_off(*args, **kwargs):
        data, scales = (np.array(x) for x in real(*args, **kwargs))
        scales.view(np.uint8).flat[0] ^= 1
        return data, scales

    monkeypatch.setattr(SW, "grouped_matmul_swiglu", one_scale_byte_off)
    ok, detail, _ = F.case_swiglu(np.random.default_rng([0, 7]), "interp", "sm_90a")
    assert not ok and "fused vs chained scales: 1 of" in detail, detail

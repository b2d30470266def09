"""The NVFP4 TMA quantize kernel (blockscale.ops.quantize_async) without a GPU.

* interpreter: the kernel's sm_90a and sm_100a IR, run by the numpy interpreter (TMA box
  loads with zero fill and 128-byte swizzle, mbarrier phases), byte-identical to the
  reference on MAX's async shapes, near-zero blocks, NaN/Inf and E2M1 tie values;
* lowering: PTX has the bulk tensor copy, the mbarrier protocol and IEEE division; SASS has
  UTMALDG / SYNCS; the shared tile is 1024-byte aligned; nothing spills;
* the op entry points: dispatch (TMA on CUDA targets, the generic kernel elsewhere and for
  K % 64 != 0), and the bundle lists the TMA spec.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from _quantize_helpers import assert_same_bytes, uniform_bf16

from blockscale import reference as ref
from blockscale.ops import quantize as Q
from blockscale.ops import quantize_async as QA
from blockscale.runtime import get_device

TARGETS = ("sm_90a", "sm_100a")


def _run(x: np.ndarray, tsf: float, target: str) -> tuple[np.ndarray, np.ndarray]:
    """The TMA kernel itself (not the dispatcher) on the interpreter."""
    return QA.quantize_fp4_async(x, tsf, get_device("interp"), target)


def _check(x: np.ndarray, tsf: float, target: str) -> None:
    d, s = _run(x, tsf, target)
    rd, rs = ref.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=tsf)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


# ---- interpreter == reference ----------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("m,k,tsf", [(256, 704, 1.0), (129, 2944, 0.43), (13, 2176, 0.5),
                                     (999, 576, 1.0), (1, 64, 2.0)])
def test_interp_matches_reference(target, m, k, tsf):
    _check(uniform_bf16(m, k, m * 7 + k), tsf, target)


@pytest.mark.parametrize("target", TARGETS)
def test_interp_near_zero_blocks(target):
    """MAX's near-zero test: blocks [0, 1e-38 x 15] (E4M3 scale underflows to 0 -> D1)."""
    x = np.tile(np.array([0.0] + [1e-38] * 15, np.float32), (129, 2944 // 16))
    xb = x.astype(ml_dtypes.bfloat16)
    for tsf in (1.0, 0.43):
        _check(xb, tsf, target)
        d, s = _run(xb, tsf, target)
        assert not d.view(np.uint8).any() and not s.view(np.uint8).any()


@pytest.mark.parametrize("target", TARGETS)
def test_interp_nan_inf_and_signed_zero(target):
    x = uniform_bf16(130, 128, 5, 4.0).astype(np.float32)
    x[0, 3] = np.nan
    x[1, 20] = np.inf
    x[2, 47] = -np.inf
    x[129, 64] = np.nan  # a row of the second 128-row tile
    x[3, :16] = -0.0
    x[4, 16:32] = np.float32(-1e-30)
    xb = x.astype(ml_dtypes.bfloat16)
    _check(xb, 1.0, target)
    d, s = _run(xb, 1.0, target)
    assert s.view(np.uint8)[0, 0, 0, 0, 0] == 0x7F  # D5: NaN scale, zero codes
    assert not d[0, :8].any()
    assert (d[4, 8:16] == 0x88).all()  # D6: tiny negatives keep their sign


@pytest.mark.parametrize("target", TARGETS)
def test_interp_e2m1_ties_and_saturation(target):
    """Every E2M1 rounding boundary (ties to even), with the block max fixed at 6."""
    vals = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.75, -1.25,
                     -1.75, -2.5, -3.5, -5.0, 6.0], np.float32)
    x = np.tile(vals, (128, 8))
    x[1::2] *= np.float32(1.5)
    _check(x.astype(ml_dtypes.bfloat16), 1.0, target)
    _check(x.astype(ml_dtypes.bfloat16), 0.5, target)


@pytest.mark.parametrize("target", TARGETS)
def test_interp_large_values_and_tensor_scale(target):
    _check(uniform_bf16(200, 320, 9, 3e4), 1 / 3e3, target)
    _check(uniform_bf16(64, 192, 10, 1e-3), 1e3, target)


# ---- the op entry points -----------------------------------------------------------------------


def test_entry_uses_tma_kernel_on_cuda_targets(monkeypatch):
    calls = []
    real = QA.quantize_fp4_async

    def spy(x, tsf, dev, tgt):
        calls.append(tgt)
        return real(x, tsf, dev, tgt)

    monkeypatch.setattr(QA, "quantize_fp4_async", spy)
    x = uniform_bf16(130, 192, 3)
    for tgt in TARGETS:
        d, s = Q.quantize_dynamic_scaled_fp4_async(x, tensor_sf=0.5, device="interp",
                                                   target=tgt)
        rd, rs = ref.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=0.5)
        assert_same_bytes(d, rd)
        assert_same_bytes(s, rs)
    # the dispatcher keeps the generic kernel (measured faster on the H200), any K
    d, s = Q.quantize_dynamic_block_scaled(x, "nvfp4", device="interp", target="sm_90a")
    assert calls == ["sm_90a", "sm_100a"]
    d, s = Q.quantize_dynamic_block_scaled(uniform_bf16(8, 96, 1), "nvfp4", device="interp",
                                           target="sm_90a")
    assert calls == ["sm_90a", "sm_100a"]
    rd, rs = ref.quantize_dynamic_block_scaled(uniform_bf16(8, 96, 1), "nvfp4")
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


def test_entry_generic_fallback_off_cuda_and_empty(monkeypatch):
    monkeypatch.setattr(QA, "quantize_fp4_async", lambda *a: pytest.fail("TMA kernel used"))
    x = uniform_bf16(4, 128, 2)
    d, s = Q.quantize_dynamic_scaled_fp4_async(x, device="interp", target="gfx950")
    rd, rs = ref.quantize_dynamic_block_scaled(x, "nvfp4")
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)
    d, s = Q.quantize_dynamic_scaled_fp4_async(np.zeros((0, 128), ml_dtypes.bfloat16),
                                               device="interp")
    assert d.shape == (0, 64) and s.shape[0] == 0


def test_entry_rejects_k_not_multiple_of_64():
    with pytest.raises(ValueError, match="multiple of 64"):
        Q.quantize_dynamic_scaled_fp4_async(uniform_bf16(4, 96, 0), device="interp")


def test_spec_and_plan():
    assert QA.AsyncQuantizeSpec("sm_100a").target == "sm_100a"
    with pytest.raises(ValueError, match="TMA"):
        QA.AsyncQuantizeSpec("gfx950")
    grid, values = QA.launch_plan(129, 2944)
    assert grid == (46, 2, 1) and values == {"x_map": (2944, 129), "m": 129, "k": 2944}
    with pytest.raises(ValueError):
        QA.launch_plan(4, 96)
    for tgt in TARGETS:
        specs = Q.bundle_specs(tgt)
        assert QA.AsyncQuantizeSpec(tgt) in specs
        assert not any(getattr(sp, "name", "") == "quantize_dynamic_scaled_fp4_async"
                       for sp in specs)
    assert QA.AsyncQuantizeSpec not in {type(sp) for sp in Q.bundle_specs("gfx950")}


# ---- lowering ----------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=TARGETS)
def compiled(request):
    return QA.kernel(request.param)


def test_ptx_has_tma_and_mbarrier(compiled):
    ptx = compiled.asm["ptx"]
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.tile"
                     r"\.mbarrier::complete_tx::bytes", ptx)
    for needle in ("mbarrier.init.shared.b64", "fence.mbarrier_init.release.cluster",
                   "mbarrier.arrive.expect_tx.shared.b64", "mbarrier.try_wait.parity.shared.b64",
                   "ld.shared.v4", "st.global.v4", "bar.sync"):
        assert needle in ptx, needle
    # 1 / x is correctly rounded (rcp.rn.f32 == div.rn.f32 of 1), never an approximation
    assert "rcp.rn.f32" in ptx or "div.rn.f32" in ptx
    assert not re.search(r"rcp\.approx|div\.approx|div\.full", ptx)
    assert re.search(r"\.shared \.align 1024 \.b8 __wg_\w+\[16384\]", ptx)
    if compiled.target.name == "sm_100a":
        assert "cvt.rn.satfinite.e2m1x2.f32" in ptx


def test_sass_has_utmaldg_and_syncs(compiled):
    sass = compiled.asm["sass"]
    assert "UTMALDG.2D" in sass
    assert "SYNCS.ARRIVE.TRANS64" in sass and "SYNCS.PHASECHK.TRANS64" in sass
    assert compiled.meta["spill_stores"] == 0 and compiled.meta["spill_loads"] == 0
    assert compiled.meta["static_shared_bytes"] >= 16384 + 512
    assert compiled.meta["registers"] <= 48  # 8 blocks of 160 threads per SM


def test_kernel_names():
    from blockscale import ops

    k = ops.quantize_dynamic_scaled_async_fp4_kernel()
    assert k.name == QA.AsyncQuantizeSpec.kernel_name
    assert Q.quantize_dynamic_scaled_fp4_async_kernel("sm_100a").name == k.name

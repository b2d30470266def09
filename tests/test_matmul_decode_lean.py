"""The lean dense decode variants (``variant="mma_leanb_t<T>_n<NT>"``, K <= 3072, and
``"..._k7168"``, K <= 7168; NVFP4, M <= T; blockscale/ops/_decode_lean_ir.py) run by the
numpy interpreter: within the fp32 bound of test_matmul_common (f32 and bf16 outputs, alpha),
the same bits from run to run, NaN scales (D5), every unit split of K over the 16 warps
(warps without units, one to seven units each: the K caps), N tails, token rows past M (not
copied), the dispatch's picks, and clear errors for what the variants do not take.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    assert_f32_within_bound,
    exact_dense,
    f32_error_bound,
)
from test_matmul_decode_psk import _case
from test_matmul_decode_shot import dense_dispatch_launch

from blockscale import layouts
from blockscale.formats import MXFP4, NVFP4
from blockscale.ops import matmul_decode

pytestmark = pytest.mark.interp

# (M, N, K, variant): one unit (warps 0-14 idle), 3 units, 9 units, 16 / 45 units (one / two
# or three a warp), the K cap (48 units: three a warp), N tails of every n-tile count, M = 1 /
# 2 / 3 / 8 / 9 / 16; the long rows (_k7168): their K cap (112 units: seven a warp), one past
# the short cap (49 units), K = 4096 (four a warp), K = 64 (one unit)
CASES = [(1, 5, 64, "mma_leanb_t8_n2"), (3, 40, 192, "mma_leanb_t8_n4"),
         (8, 21, 576, "mma_leanb_t8_n3"), (9, 48, 1024, "mma_leanb_t16_n6"),
         (16, 33, 3072, "mma_leanb_t16_n5"), (2, 70, 2880, "mma_leanb_t8_n8"),
         (16, 16, 640, "mma_leanb_t16_n2"), (1, 40, 7168, "mma_leanb_t8_n5_k7168"),
         (16, 20, 3136, "mma_leanb_t16_n2_k7168"), (9, 30, 4096, "mma_leanb_t16_n4_k7168"),
         (3, 9, 64, "mma_leanb_t8_n3_k7168")]


def _run(a, b, sfa, sfb, k, variant, alpha=1.0, out="float32"):
    return matmul_decode.block_scaled_matmul_decode(
        a, b, layouts.interleave(sfa), layouts.interleave(sfb), NVFP4, k=k, alpha=alpha,
        out_dtype=out, device="interp", variant=variant)


@pytest.mark.parametrize(("m", "n", "k", "variant"), CASES,
                         ids=lambda x: x if isinstance(x, str) else str(x))
def test_dense_lean_within_bound(m, n, k, variant):
    """16 warps: one, two or three units a warp, or none; token rows past M not copied."""
    a, b, sfa, sfb = _case(NVFP4, m, n, k, seed=m + n + k)
    got = _run(a, b, sfa, sfb, k, variant, alpha=0.375)
    assert got.dtype == np.float32 and got.shape == (m, n)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, NVFP4, k, 0.375)
    assert_f32_within_bound(got, exact, f32_error_bound(abs_sum, NVFP4, k, n_mul=1))
    again = _run(a, b, sfa, sfb, k, variant, alpha=0.375)
    assert np.array_equal(got.view(np.uint32), again.view(np.uint32))


@pytest.mark.parametrize("variant", ["mma_leanb_t8_n3", "mma_leanb_t16_n3",
                                     "mma_leanb_t16_n3_k7168"])
def test_dense_lean_bf16_and_nan_scales(variant):
    """bf16 output within the bound (alpha 1.5); a NaN weight scale (0x7F) gives a NaN
    column, a NaN activation scale a NaN row, whichever warp's units they fall in."""
    m, n, k = 5, 24, 2880
    a, b, sfa, sfb = _case(NVFP4, m, n, k, seed=7)
    got = _run(a, b, sfa, sfb, k, variant, 1.5, "bfloat16")
    exact, abs_sum = exact_dense(a, b, sfa, sfb, NVFP4, k, 1.5)
    assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, NVFP4, k, n_mul=2))
    sfb.view(np.uint8)[17, k // 16 - 1] = 0x7F  # the last warp's last unit
    sfa.view(np.uint8)[1, 2] = 0xFF  # warp 0's first unit (the sign bit ignored: D3)
    got = _run(a, b, sfa, sfb, k, variant)
    nan = np.isnan(got)
    assert nan[:, 17].all() and nan[1].all() and nan.sum() == m + n - 1


def test_dense_lean_rejects_what_it_does_not_take():
    """K not a multiple of 64 or past the shared rows' cap, M past the M-tile rows, MXFP4
    and the grouped mode: ValueError naming the argument, the limit and the value."""
    a, b, sfa, sfb = _case(NVFP4, 1, 8, 96, seed=3)
    with pytest.raises(ValueError, match=r"k must be a multiple of 64 and <= 3072 for "
                                         r"variant 'mma_leanb_t8_n2', got 96"):
        _run(a, b, sfa, sfb, 96, "mma_leanb_t8_n2")
    a, b, sfa, sfb = _case(NVFP4, 1, 8, 3136, seed=3)
    with pytest.raises(ValueError, match=r"<= 3072 .*got 3136"):
        _run(a, b, sfa, sfb, 3136, "mma_leanb_t16_n2")
    a, b, sfa, sfb = _case(NVFP4, 1, 8, 7232, seed=3)
    with pytest.raises(ValueError, match=r"<= 7168 for variant 'mma_leanb_t8_n2_k7168', got "
                                         r"7232"):
        _run(a, b, sfa, sfb, 7232, "mma_leanb_t8_n2_k7168")
    a, b, sfa, sfb = _case(NVFP4, 9, 8, 128, seed=3)
    with pytest.raises(ValueError, match=r"m must be <= 8 for variant 'mma_leanb_t8_n2', got 9"):
        _run(a, b, sfa, sfb, 128, "mma_leanb_t8_n2")
    with pytest.raises(ValueError, match="dense mode and nvfp4 only"):
        matmul_decode.DecodeSpec(MXFP4.name, "dense", variant="mma_leanb_t8_n2")
    with pytest.raises(ValueError, match="dense mode and nvfp4 only"):
        matmul_decode.DecodeSpec(NVFP4.name, "grouped", variant="mma_leanb_t8_n2")
    assert matmul_decode.lean_shape("mma_leanb_t16_n5") == (16, 5)
    assert matmul_decode.lean_shape("mma_leanb_t16_n5_k7168") == (16, 5)
    assert matmul_decode.lean_kcap("mma_leanb_t16_n5_k7168") == 7168
    assert matmul_decode.lean_kcap("mma_leanb_t16_n5") == 3072
    assert "mma_lean_t8_n3" not in matmul_decode.VARIANTS  # (the register form: removed)
    assert matmul_decode.VARIANT_COLS["mma_leanb_t16_n5"] == 40


@pytest.mark.parametrize(("env", "fmt", "m", "n", "k", "want"), [
    (None, NVFP4, 16, 5760, 2880, "mma_leanb_t16_n6"), (None, NVFP4, 1, 5760, 2944,
                                                         "mma_leanb_t8_n6"),
    (None, NVFP4, 9, 4096, 2048, "mma_leanb_t16_n4"),
    (None, NVFP4, 1, 40, 64, "mma_leanb_t8_n2"), (None, NVFP4, 2, 9000, 128, "mma_leanb_t8_n8"),
    (None, NVFP4, 1, 4096, 7168, "mma_leanb_t8_n4_k7168"),
    (None, NVFP4, 16, 4096, 3136, "mma_leanb_t16_n4_k7168"),
    (None, NVFP4, 1, 40, 3136, "mma_leanb_t8_n2_k7168"),
    (None, MXFP4, 1, 40, 1024, "mma_shot"),
    ("mma_leanb_t8_n3", NVFP4, 5, 40, 128, "mma_leanb_t8_n3"),
    ("mma_leanb_t8_n3", NVFP4, 12, 40, 128, "mma_shot16"),
    ("mma_leanb_t8_n3", NVFP4, 1, 40, 3136, "mma_shot7k"),
    ("mma_leanb_t8_n3_k7168", NVFP4, 1, 40, 3136, "mma_leanb_t8_n3_k7168")],
    ids=lambda x: getattr(x, "name", x if isinstance(x, str) else str(x)))
def test_dispatch_picks_lean(monkeypatch, env, fmt, m, n, k, want):
    """The dense dispatch's lean picks (:func:`matmul_decode.lean_variant`; a named lean
    variant where its M-tile holds M and its rows K, else the one-shot pick) and the kernels
    they launch."""
    if n > 100:  # the pick only (no interpreter run at this size)
        assert matmul_decode.lean_variant(m, n, k) == want
        return
    assert dense_dispatch_launch(monkeypatch, env, fmt, m, n, k) == want


def test_grouped_dispatch_never_lean(monkeypatch):
    """BLOCKSCALE_DECODE_VARIANT naming the dense-only lean kernels: the grouped dispatch
    keeps its default."""
    for v in ("mma_lean", "mma_leanb_t16_n4"):
        monkeypatch.setenv(matmul_decode.VARIANT_ENV, v)
        assert matmul_decode.dispatch_variant(NVFP4, grouped=True) == \
            matmul_decode.GROUPED_DEFAULT_VARIANT
    assert matmul_decode.lean_variant(17, 64, 64) is None
    assert matmul_decode.lean_variant(1, 64, 96) is None
    assert matmul_decode.lean_variant(3, 64, 3072) == "mma_leanb_t8_n2"
    assert matmul_decode.lean_variant(1, 64, 7232) is None  # past the long rows
    assert matmul_decode.lean_variant(1, 5760, 7168) is None  # > 132 CTAs at NT <= 5


@pytest.mark.lower
@pytest.mark.parametrize("variant", ["mma_leanb_t16_n6", "mma_leanb_t8_n4",
                                     "mma_leanb_t16_n5_k7168", "mma_leanb_t8_n4_k7168"])
def test_lean_sass(variant):
    """sm_90a SASS: the rows by ``cp.async.bulk`` (UBLKCP) completing on
    mbarriers (SYNCS), one ``LDS.64`` a row a unit (8 bytes a lane), 4 HMMAs a unit and
    n-tile, no spill at the 128-register cap (16 warps on one SM), no static shared memory
    (the rows, the mbarriers and the partials in the dynamic bytes)."""
    tokens, nt = matmul_decode.lean_shape(variant)
    upw = -(-matmul_decode.lean_kcap(variant) // 64 // matmul_decode.LEAN_WARPS)
    spec = matmul_decode.DecodeSpec("nvfp4", "dense", "bfloat16", variant=variant)
    kernel = matmul_decode.kernel(spec)
    ops = [m.group(1) for line in kernel.asm["sass"].splitlines()
           if (m := re.match(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line))]
    assert ops.count("HMMA.16816.F32") == 4 * nt * upw
    assert ops.count("LDS.64") == (nt + tokens // 8) * upw
    assert "UBLKCP.S.G" in ops and any(o.startswith("SYNCS.PHASECHK") for o in ops)
    meta = kernel.meta
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0, meta
    assert 0 < meta["registers"] <= 128 and meta["static_shared_bytes"] == 0
    assert meta["dynamic_shared_bytes"] == spec.dynamic_shared_bytes <= 227 * 1024

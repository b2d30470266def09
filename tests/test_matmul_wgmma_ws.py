"""The TMA-fed, warp-specialized K loop of the sm_90a wgmma matmul (``pipeline="ws"``).

* interp: the kernel IR (TMA boxes with zero fill, 32-byte swizzle, the mbarrier ring and the
  wgmmas modeled by runtime/interpreter/ops_tma.py and ops_wgmma.py) against the float64
  value with the fp32 bound of test_matmul_common.py, and bit for bit against the
  register-fed kernel of the same variant (same operands, same wgmma order); M/N/K tails
  and more K-steps than ring stages (the ring wraps, the parities flip).
* ir: the spec validation, and the MLIR of every other bundled wgmma kernel does not
  depend on the new pipeline.
* lower: HGMMA + UTMALDG + SYNCS (mbarrier) in the sm_90a SASS, no spills.
* gpu: the bound on an H100/H200 (``make gpu-bundle`` collects the ws specs)::

      BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_matmul_wgmma_ws.py
"""

from __future__ import annotations

import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    assert_f32_within_bound,
    exact_dense,
    f32_error_bound,
    random_dense_case,
)

from blockscale.formats import NVFP4
from blockscale.ops import _wgmma_ws, matmul_wgmma


def _run(a, b, sfa5, sfb5, alpha, out_dtype, tiles, dequant, pipeline, device):
    return matmul_wgmma.block_scaled_matmul_wgmma(
        a, b, sfa5, sfb5, NVFP4, alpha=alpha, out_dtype=out_dtype, tiles=tiles,
        dequant=dequant, kstep=64, scaling="fold", pipeline=pipeline, device=device)


def _check(m, n, k, tiles, dequant, out_dtype, device="interp", identical=True):
    rng = np.random.default_rng(m * 131 + n * 7 + k)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, NVFP4, k, 0.375, None)
    bound = f32_error_bound(abs_sum, NVFP4, k, n_mul=1)
    got = _run(a, b, sfa5, sfb5, 0.375, out_dtype, tiles, dequant, "ws", device)
    assert got.shape == (m, n)
    if out_dtype == "float32":
        assert_f32_within_bound(got, exact, bound)
    else:
        assert_bf16_consistent(got, exact, bound)
    if identical:
        ref = _run(a, b, sfa5, sfb5, 0.375, out_dtype, tiles, dequant, "early", device)
        assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))


@pytest.mark.interp
@pytest.mark.parametrize("dequant", matmul_wgmma.DEQUANT)
@pytest.mark.parametrize("mnk", [(128, 128, 64), (70, 130, 96), (130, 72, 320), (1, 5, 32)],
                         ids=lambda s: "x".join(map(str, s)))
def test_interp_ws_128x128(mnk, dequant):
    """Small and tail shapes; K = 320: five steps through a four-stage ring."""
    m, n, k = mnk
    _check(m, n, k, (128, 128), dequant, "float32" if (m + n) % 2 else "bfloat16")


@pytest.mark.interp
@pytest.mark.slow
def test_interp_ws_128x256_tails():
    """128 x 256 tiles (two B scale atoms per stage; the second past N is zero filled)."""
    _check(130, 200, 352, (128, 256), "shift", "float32")

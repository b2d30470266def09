"""The lean dense decode variants (``matmul_decode.lean_variant``'s picks, NVFP4, M <= 16;
K <= 3072 and the ``_k7168`` rows) on an NVIDIA H100/H200: the fp32 bound at the dense decode
shapes (f32 with alpha, bf16), the same bits from run to run (fixed warp order), NaN scales.
Needs the bundle::

    BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_matmul_decode_lean_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    assert_f32_within_bound,
    f32_error_bound,
    random_dense_case,
)
from test_matmul_decode_psk_gpu import _dense

from blockscale import layouts
from blockscale.formats import NVFP4
from blockscale.ops import matmul_decode

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]


@pytest.mark.parametrize("nk", [(5760, 2944), (5760, 2880), (4096, 2048), (2880, 3072),
                                (40, 64), (4096, 7168), (2048, 7168), (1000, 3136)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", [1, 8, 9, 16])
def test_dense_lean_within_bound_gpu(m, nk):
    n, k = nk
    variant = matmul_decode.lean_variant(m, n, k)
    assert variant is not None
    args, cols, exact, abs_sum = _dense(NVFP4, m, n, k, seed=m + n + k)

    def run(out="float32", alpha=0.5):
        return matmul_decode.block_scaled_matmul_decode(*args, NVFP4, k=k, alpha=alpha,
                                                        out_dtype=out, device="cuda",
                                                        variant=variant)
    out = run()
    assert out.shape == (m, n) and not np.isnan(out).any()
    assert_f32_within_bound(out[:, cols], 0.5 * exact,
                            f32_error_bound(0.5 * abs_sum, NVFP4, k, n_mul=1))
    for _ in range(3):  # deterministic
        assert np.array_equal(run().view(np.uint32), out.view(np.uint32))
    got = run("bfloat16", 1.5)
    assert_bf16_consistent(got[:, cols], 1.5 * exact,
                           f32_error_bound(1.5 * abs_sum, NVFP4, k, n_mul=2))


def test_dense_lean_nan_scales_gpu():
    """A NaN weight scale gives a NaN column, a NaN activation scale a NaN row (D5)."""
    m, n, k = 16, 5760, 2880
    a, b, sfa, sfb, _sfa5, _sfb5 = random_dense_case(np.random.default_rng(5), NVFP4, m, n, k)
    sfb.view(np.uint8)[4000, k // 16 - 1] = 0x7F
    sfa.view(np.uint8)[3, 0] = 0x7F
    out = matmul_decode.block_scaled_matmul_decode(
        a, b, layouts.interleave(sfa), layouts.interleave(sfb), NVFP4, k=k,
        out_dtype="float32", device="cuda",
        variant=matmul_decode.lean_variant(m, n, k))
    nan = np.isnan(out)
    assert nan[:, 4000].all() and nan[3].all() and nan.sum() == m + n - 1

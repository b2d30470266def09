"""The sm_90a tensor-core block-scaled matmul on an NVIDIA H100/H200 (MAX's shapes).

Run on the GPU machine with the bundle (``make gpu-bundle`` collects
``matmul_sm90.bundle_specs`` and ``matmul_grouped_sm90.bundle_specs``)::

    BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_matmul_fast_gpu.py

Checks: f32 outputs within the fp32-accumulation bound of test_matmul_common.py, bf16 outputs
consistent with the exact value, and for FP4 bit equality with the portable kernel (the design
keeps FP4 block sums exact, so any difference is a bug, e.g. a tensor core that does not sum
16 exact products exactly).
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
from test_matmul_grouped import GPU_CASES, check_grouped_on_gpu

from blockscale.formats import FORMATS
from blockscale.ops import matmul, matmul_sm90

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]

DENSE = [  # (M, N, K, alpha): MAX's SM100 FP4 GEMM test shapes, decode M values, a big one
    (1, 576, 7168, 0.5),
    (777, 2560, 8192, 0.225),
    (8192, 5760, 2944, 1.0),
] + [(m, 2048, 1024, 1.0) for m in (1, 17, 127, 129, 255)]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("shape", DENSE, ids=lambda s: "x".join(map(str, s)))
def test_dense_fast_gpu(fmt, shape, monkeypatch):
    # MXFP8 at M >= 512: the mma.sync kernel this test checks, not the two-phase MXFP8
    # kernels (their own bound: tests/test_matmul_twophase_mx8.py)
    monkeypatch.setenv("BLOCKSCALE_SM90_TWOPHASE_MX8", "0")
    m, n, k, alpha = shape
    rng = np.random.default_rng(m * 31 + n + k)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    rows = np.unique(np.concatenate([np.arange(min(m, 64)), np.arange(max(0, m - 64), m),
                                     rng.integers(0, m, 64)]))
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, alpha, rows)
    bound = f32_error_bound(abs_sum, fmt, k, n_mul=1)
    out32 = matmul_sm90.block_scaled_matmul_sm90(a, b, sfa5, sfb5, fmt, k=k, alpha=alpha,
                                                 out_dtype="float32", device="cuda")
    assert_f32_within_bound(out32[rows], exact, bound)
    out16 = matmul.block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=alpha,
                                       device="cuda", target="sm_90a")  # dispatch: fast path
    assert_bf16_consistent(out16[rows], exact, bound)
    if fmt.is_fp4:
        naive = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=alpha,
                                                 out_dtype="float32", device="cuda",
                                                 target="sm_90a")
        assert np.array_equal(out32.view(np.uint32), naive.view(np.uint32))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("case_id", range(len(GPU_CASES)))
def test_grouped_fast_gpu(fmt, case_id):
    check_grouped_on_gpu(fmt, case_id)

"""Regressions found by the H200 fuzzer (benchmarks/fuzz_gpu.py), reproduced in the interpreter."""

import ml_dtypes
import numpy as np
import pytest

from blockscale import ops
from blockscale import reference as ref

TARGETS = ("sm_90a", "sm_100a", "gfx942", "gfx950")


@pytest.mark.interp
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("m,k,tsf", [(129, 16, 768.0), (257, 8, 3.0), (256, 16, 0.001)])
def test_row_major_nvfp4_single_block_rows(target, m, k, tsf):
    """Row-major NVFP4 with one 16-element chunk per row: a block of 256 threads used to span
    two 128-row tiles (1032 wrong bytes at M=129, K=16 on the H200, commit 7109a01)."""
    x = np.random.default_rng(m + k).standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    data, scales = ops.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=tsf,
                                                     scale_layout="row_major", device="interp",
                                                     target=target)
    want_d, want_s = ref.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=tsf,
                                                       scale_layout="row_major")
    assert np.array_equal(data.view(np.uint8), want_d.view(np.uint8))
    assert np.array_equal(scales.view(np.uint8), want_s.view(np.uint8))

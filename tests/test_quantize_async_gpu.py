"""The NVFP4 TMA quantize kernel on an NVIDIA GPU (sm_90a), byte for byte against the reference.

MAX's async shapes (SEMANTICS §8) plus 8192^2 and 16384^2. Kernels come from the bundle
(``make gpu-bundle``) or are compiled here. Run with
``pytest -m gpu tests/test_quantize_async_gpu.py``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _quantize_helpers import assert_same_bytes, uniform_bf16

from blockscale import reference as ref
from blockscale.ops import quantize as Q
from blockscale.ops import quantize_async as QA

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]


def _check(x, tsf):
    d, s = Q.quantize_dynamic_scaled_fp4_async(x, tensor_sf=tsf, device="cuda")
    rd, rs = ref.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=tsf)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


def test_the_entry_runs_the_tma_kernel(monkeypatch):
    used = []
    real = QA.quantize_fp4_async
    monkeypatch.setattr(QA, "quantize_fp4_async", lambda *a: used.append(a[3]) or real(*a))
    _check(uniform_bf16(256, 704, 1), 1.0)
    assert used == ["sm_90a"]


@pytest.mark.parametrize("m,k,tsf", [(256, 704, 1.0), (999, 576, 1.0), (129, 2944, 1.0),
                                     (3456, 2944, 0.43), (13, 2176, 0.5), (1, 64, 1.0)])
def test_max_async_shapes(m, k, tsf):
    _check(uniform_bf16(m, k, m + k), tsf)


@pytest.mark.parametrize("m,k", [(8192, 8192), (16384, 16384)])
def test_large(m, k):
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, k), dtype=np.float32).astype(ml_dtypes.bfloat16)
    _check(x, 0.5)


def test_near_zero_nan_inf():
    x = np.tile(np.array([0.0] + [1e-38] * 15, np.float32), (129, 2944 // 16))
    x[5, 17] = np.nan
    x[7, 100] = np.inf
    x[128, 2000] = -np.inf
    _check(x.astype(ml_dtypes.bfloat16), 0.43)


def test_device_arrays_in_and_out():
    from blockscale import runtime

    dev = runtime.get_device("cuda")
    x = uniform_bf16(300, 1024, 3)
    d, s = Q.quantize_dynamic_scaled_fp4_async(dev.to_device(x), tensor_sf=0.5, device=dev)
    rd, rs = ref.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=0.5)
    assert_same_bytes(dev.to_host(d), rd)
    assert_same_bytes(dev.to_host(s), rs)
    # the same buffer again (cached tensor map), then another shape over fresh buffers
    d2, _ = Q.quantize_dynamic_scaled_fp4_async(dev.to_device(x), tensor_sf=0.5, device=dev)
    assert_same_bytes(dev.to_host(d2), rd)
    _check(uniform_bf16(64, 64, 4), 2.0)


def test_dispatcher_matches_generic_kernel():
    x = uniform_bf16(777, 4096, 5)
    d1, s1 = Q.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=0.43, device="cuda")
    d2, s2 = Q.quantize_dynamic_scaled_fp4fp8(x, "nvfp4", tensor_sf=0.43, device="cuda")
    assert_same_bytes(d1, d2)
    assert_same_bytes(s1, s2)

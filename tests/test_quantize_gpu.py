"""Quantize kernels on an NVIDIA GPU (sm_90a), byte for byte against the reference.

Full MAX shapes (SEMANTICS §8). Kernels come from the bundle (``make gpu-bundle``) or are
compiled here. Run with ``pytest -m gpu tests/test_quantize_gpu.py``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _quantize_helpers import assert_same_bytes, group_offsets, uniform_bf16

from blockscale import reference as ref
from blockscale.ops import quantize as Q
from blockscale.ops import quantize_grouped as QG
from blockscale.ops import quantize_silu as QS
from blockscale.reference import grouped as RG

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]


@pytest.mark.parametrize("m,k,tsf", [(256, 128, 1.0), (258, 136, 1.0), (258, 184, 1.0),
                                     (1000, 8200, 0.43), (2048, 16392, 0.5), (129, 2944, 0.43),
                                     (3456, 2944, 0.43), (13, 2176, 0.5), (999, 576, 1.0)])
def test_nvfp4_max_shapes(m, k, tsf):
    x = uniform_bf16(m, k, m + k)
    d, s = Q.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=tsf, device="cuda")
    rd, rs = ref.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=tsf)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("m,k", [(1, 128), (258, 128), (999, 576), (999, 15936), (1000, 8200)])
def test_mx_max_shapes(fmt, m, k):
    x = uniform_bf16(m, k, k, 32.0)
    for rounding in ("up", "even", "floor") if (m, k) == (258, 128) else ("up",):
        d, s = Q.quantize_dynamic_block_scaled(x, fmt, scale_rounding=rounding, device="cuda")
        rd, rs = ref.quantize_dynamic_block_scaled(x, fmt, scale_rounding=rounding)
        assert_same_bytes(d, rd)
        assert_same_bytes(s, rs)


def test_near_zero_and_nonfinite():
    x = np.tile(np.array([0.0] + [1e-38] * 15, np.float32), (129, 2944 // 16))
    x[5, 17] = np.nan
    x[7, 100] = np.inf
    xb = x.astype(ml_dtypes.bfloat16)
    for fmt, tsf in (("nvfp4", 0.43), ("mxfp4", 1.0), ("mxfp8", 1.0)):
        d, s = Q.quantize_dynamic_block_scaled(xb, fmt, tensor_sf=tsf, device="cuda")
        rd, rs = ref.quantize_dynamic_block_scaled(xb, fmt, tensor_sf=tsf)
        assert_same_bytes(d, rd)
        assert_same_bytes(s, rs)


@pytest.mark.parametrize("counts,ids,k", [([256, 128, 256], [0, 1, 2], 704),
                                          ([100, 200, 50], [0, 1, 2], 704),
                                          ([13, 999], [0, 1], 704),
                                          ([256, 128, 256], [0, 1, 2], 2944),
                                          ([100, 60], [0, 1], 352),
                                          ([0, 3, 1, 2], [-1, 2, -1, 0], 2048)])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_grouped_max_cases(fmt, counts, ids, k):
    es, offs = group_offsets(counts)
    ids = np.asarray(ids, np.int32)
    x = uniform_bf16(int(es[-1]), k, k)
    tsf = np.array([0.43, 1.0, 0.5], np.float32) if fmt == "nvfp4" else None
    d, s = QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, device="cuda")
    rd, rs = RG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_fused_silu_nvfp4(activation):
    """Byte-exact: the sigmoid's exp is blockscale's exp_f32 on the GPU and in the reference
    (D10; it used to be the device expf, which differed from numpy's in the last ulp)."""
    es, offs = group_offsets([64, 64])
    gu = uniform_bf16(128, 256, 3, 4.0)
    isc = np.array([0.5, 0.5], np.float32)
    ids = np.array([0, 1], np.int32)
    d, s = QS.fused_silu_quantize(gu, "nvfp4", es, offs, ids, isc, activation=activation,
                                  device="cuda")
    rd, rs = RG.fused_silu_quantize(gu, "nvfp4", es, offs, ids, isc, activation=activation)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)

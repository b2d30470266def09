"""The pipelined dense quantize variants on an NVIDIA GPU (sm_90a), byte for byte against the
reference: every ``pipeline`` depth and format, the ``bf16x2`` MXFP4 variant on every bf16
product value at extreme scales (bf16 subnormal inputs and outputs on the hardware), ragged
M, K % 32 == 16 and full-size shapes whose blocks loop over many row groups. Kernels come
from the bundle (``make gpu-bundle``) or are compiled here. Run with
``pytest -m gpu tests/test_quantize_pipeline_gpu.py``.
"""

from __future__ import annotations

import pytest
from _quantize_helpers import assert_same_bytes, uniform_bf16
from _quantize_inputs import _all_bf16_blocks, _edge_input

from blockscale import reference as ref
from blockscale.ops import quantize as Q

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]


def _check(x, fmt, pipeline, bf16x2=False, rounding=None, tsf=1.0):
    d, s = Q.quantize_dense_variant(x, fmt, pipeline=pipeline, bf16x2=bf16x2, tensor_sf=tsf,
                                    scale_rounding=rounding, device="cuda")
    rd, rs = ref.quantize_dynamic_block_scaled(x, fmt, tensor_sf=tsf, scale_rounding=rounding)
    assert_same_bytes(d, rd, f"{fmt} p{pipeline} data")
    assert_same_bytes(s, rs, f"{fmt} p{pipeline} scales")


@pytest.mark.parametrize("pipeline", [1, 2, 3])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("m,k", [(258, 144), (1000, 8208), (4099, 4096), (33, 2064)])
def test_pipelined_shapes(fmt, pipeline, m, k):
    tsf = 0.43 if fmt == "nvfp4" else 1.0
    _check(uniform_bf16(m, k, m + k, 8.0), fmt, pipeline, tsf=tsf)
    _check(_edge_input(m, k, m + k), fmt, pipeline, tsf=tsf)


@pytest.mark.parametrize("pipeline", [1, 2, 3])
def test_bf16x2_shapes(pipeline):
    for m, k in ((258, 144), (4099, 4096), (33, 2064)):
        _check(_edge_input(m, k, m + k), "mxfp4", pipeline, bf16x2=True, rounding="up")


@pytest.mark.parametrize("top", [6.0, 7.96875])
@pytest.mark.parametrize("shift", [0, -126, -133, 120, 124])
def test_bf16x2_every_product(shift, top):
    """bf16 subnormal products and reciprocals on the hardware (mul/fma.rn.bf16x2 must keep
    subnormals: the E2M1 code bits are r * 2^-126, a subnormal for r < 1)."""
    x = _all_bf16_blocks(shift, top)
    for rounding in ("up", "even", "floor"):
        _check(x, "mxfp4", 2, bf16x2=True, rounding=rounding)

"""The two-phase pair with a fused epilogue, through the dense dispatch (M >= MIN_M, lowered
here to a small case): byte-identical in the interpreter to the wgmma "fold" kernel (same bf16
operands, same k16 wgmma order, same epilogue code) with the same epilogue."""

from __future__ import annotations

import numpy as np
import pytest
from test_matmul_common import random_dense_case

from blockscale.formats import MXFP4, NVFP4
from blockscale.ops import matmul, matmul_wgmma
from blockscale.ops import matmul_epilogue as ep
from blockscale.ops import matmul_twophase as TP


@pytest.mark.interp
@pytest.mark.parametrize("fmt", [NVFP4, MXFP4], ids=lambda f: f.name)
def test_dispatch_with_fused_epilogue(fmt, monkeypatch):
    rng = np.random.default_rng(9)
    m, n, k = 130, 264, 96
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    epi = ep.chain(ep.bias(), ep.relu())
    monkeypatch.setattr(TP, "MIN_M", 100)
    launched = []
    real = TP._run
    monkeypatch.setattr(TP, "_run", lambda spec, *args: launched.append(spec) or real(spec, *args))
    got = matmul.block_scaled_matmul_with_epilogue(
        a, b, sfa5, sfb5, fmt, alpha=0.5, out_dtype="bfloat16", epilogue=epi,
        epilogue_inputs={"bias": bias}, device="interp", target="sm_90a")
    assert len(launched) == 1 and launched[0].epilogue is not None
    want = matmul_wgmma.block_scaled_matmul_wgmma(
        a, b, sfa5, sfb5, fmt, alpha=0.5, out_dtype="bfloat16", epilogue=epi,
        epilogue_inputs={"bias": bias}, tiles=(128, 256), dequant="lut", kstep=64,
        scaling="fold", device="interp")
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert (got.astype(np.float32) >= 0).all()

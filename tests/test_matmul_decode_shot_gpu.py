"""The one-shot decode variants ("mma_shot", "mma_shot7k", "mma_shot16" for M = 16: what
matmul_decode.shot_variant picks; "mma_shot6", "mma_shot32") on an NVIDIA H100/H200: the fp32
bound at the dense decode shapes and the MoE gate_up shapes at T in {1, 16}, the same bits
from run to run (fixed warp order), and the dispatch switch. Needs the bundle::

    BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_matmul_decode_shot_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest
from test_matmul_common import assert_f32_within_bound, f32_error_bound
from test_matmul_decode_gpu import MODELS, _columns, _moe_case, check_moe_output
from test_matmul_decode_psk_gpu import _dense, check_dispatch_runs

from blockscale.formats import FORMATS
from blockscale.ops import matmul_decode

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]

FP4 = FORMATS[:2]


@pytest.mark.parametrize("variant", ["auto", "mma_shot6", "mma_shot32"])
@pytest.mark.parametrize("nk", [(5760, 2944), (5760, 2880), (4096, 7168)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_dense_shot_within_bound_gpu(fmt, m, nk, variant):
    """"auto": :func:`matmul_decode.shot_variant`'s pick (mma_shot, mma_shot16, mma_shot7k)."""
    n, k = nk
    if variant == "auto":
        variant = matmul_decode.shot_variant(k, m)
    elif k > matmul_decode.SHOT_KCAP[variant]:
        pytest.skip(f"{variant} holds K <= {matmul_decode.SHOT_KCAP[variant]}")
    args, cols, exact, abs_sum = _dense(fmt, m, n, k, seed=m + n + k)

    def run():
        return matmul_decode.block_scaled_matmul_decode(*args, fmt, k=k, alpha=0.5,
                                                        out_dtype="float32", device="cuda",
                                                        variant=variant)
    out = run()
    assert_f32_within_bound(out[:, cols], 0.5 * exact,
                            f32_error_bound(0.5 * abs_sum, fmt, k, n_mul=1))
    for _ in range(3):  # deterministic
        assert np.array_equal(run().view(np.uint32), out.view(np.uint32))


@pytest.mark.parametrize(("model", "variant"), [("gpt-oss-120b", "mma_shot"),
                                              ("gpt-oss-120b", "mma_shot32"),
                                              ("deepseek-v3", "mma_shot7k")])
@pytest.mark.parametrize("tokens", [1, 16])
@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_moe_shot_gpu(fmt, tokens, model, variant):
    """gate_up of gpt-oss-120b ("mma_shot", "mma_shot32") / DeepSeek-V3 ("mma_shot7k")
    within the bound, the same bits on a second call."""
    experts, top_k, k, n = MODELS[model]
    rng = np.random.default_rng(tokens + k)
    case, a2d, w2d, esc = _moe_case(rng, fmt, experts, top_k, k, n, tokens)
    out = matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=fmt, k=k,
                                              device="cuda", variant=variant)
    check_moe_output(out, case, a2d, w2d, esc, fmt, k, _columns(rng, n))
    again = matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=fmt, k=k,
                                                device="cuda", variant=variant)
    assert np.array_equal(np.asarray(again).view(np.uint16), np.asarray(out).view(np.uint16))


def test_dispatch_switch_gpu(monkeypatch):
    """BLOCKSCALE_DECODE_VARIANT=mma_shot: the dense dispatch at M=1 N=5760 K=2944 runs the
    one-shot kernel (the direct call's bits)."""
    monkeypatch.setenv(matmul_decode.VARIANT_ENV, "mma_shot")
    check_dispatch_runs("mma_shot", 2944)

"""The split-K prmt decode variant ("mma_psk") on an NVIDIA H100/H200: the fp32 bound at the
dense decode shapes and gpt-oss-120b gate_up T=1, bit-identical results from the host path
(fresh counters) and the device path (the cached per-stream counters, no memset) over
repeated calls queued on two streams at once, the counters left at zero, and the dispatch
switch (``BLOCKSCALE_DECODE_SPLIT_K``). Needs the bundle::

    BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_matmul_decode_psk_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest
from test_matmul_common import (
    assert_f32_within_bound,
    dequantize_exact,
    f32_error_bound,
    random_dense_case,
)
from test_matmul_decode_gpu import MODELS, _columns, _moe_case, check_moe_output

from blockscale.formats import FORMATS
from blockscale.ops import matmul, matmul_decode

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]

FP4 = FORMATS[:2]


def _dense(fmt, m, n, k, seed):
    rng = np.random.default_rng(seed)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    cols = _columns(rng, n)
    ad = dequantize_exact(a, sfa, fmt, k)
    bd = dequantize_exact(b[cols], sfb[cols], fmt, k)
    return (a, b, sfa5, sfb5), cols, ad @ bd.T, np.abs(ad) @ np.abs(bd).T


@pytest.mark.parametrize("nk", [(5760, 2880), (4096, 7168)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_dense_psk_within_bound_gpu(fmt, m, nk):
    n, k = nk
    args, cols, exact, abs_sum = _dense(fmt, m, n, k, seed=m + n)
    assert matmul_decode.split_k_p(-(-n // 64), k) > 1
    out = matmul_decode.block_scaled_matmul_decode(*args, fmt, k=k, alpha=0.5,
                                                   out_dtype="float32", device="cuda",
                                                   variant="mma_psk")
    assert_f32_within_bound(out[:, cols], 0.5 * exact,
                            f32_error_bound(0.5 * abs_sum, fmt, k, n_mul=1))


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_cached_counters_two_streams_gpu(fmt):
    """Device inputs on two streams, three calls each queued before any result is read:
    every result equals the host path's (fresh zeroed counters) bit for bit; each stream
    has its own counter buffer, zeroed once and all zero afterwards."""
    from blockscale import runtime

    dev = runtime.get_device("cuda")
    m, n, k = 1, 5760, 2880
    args, _cols, _exact, _abs = _dense(fmt, m, n, k, seed=3)
    want = matmul_decode.block_scaled_matmul_decode(*args, fmt, k=k, out_dtype="float32",
                                                    device="cuda", variant="mma_psk")
    streams = [dev.create_stream(), dev.create_stream()]
    on = [[dev.to_device(x, s) for x in args] for s in streams]
    outs = [matmul_decode.block_scaled_matmul_decode(*on[i % 2], fmt, k=k,
                                                     out_dtype="float32", device=dev,
                                                     variant="mma_psk") for i in range(6)]
    for i, out in enumerate(outs):
        assert out.stream == streams[i % 2].handle
        assert np.array_equal(dev.to_host(out).view(np.uint32), want.view(np.uint32)), i
    bufs = [matmul_decode._COUNTERS[(id(dev), s.handle)][1] for s in streams]
    assert bufs[0] is not bufs[1]
    for s, buf in zip(streams, bufs):
        dev.stream_synchronize(s.handle)
        assert not dev.to_host(buf, s).any()


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_moe_psk_t1_gpu(fmt):
    """gpt-oss-120b gate_up at T=1 (4 experts, 2 splits) within the bound."""
    experts, top_k, k, n = MODELS["gpt-oss-120b"]
    rng = np.random.default_rng(77)
    case, a2d, w2d, esc = _moe_case(rng, fmt, experts, top_k, k, n, 1)
    out = matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=fmt, k=k,
                                              device="cuda", variant="mma_psk")
    check_moe_output(out, case, a2d, w2d, esc, fmt, k, _columns(rng, n))


def check_dispatch_runs(variant, k):
    """The dense dispatch at M=1 N=5760 (FP4, float32 out) gives the bits of ``variant``
    called directly, within the fp32 bound (the caller sets the dispatch's env)."""
    fmt, m, n = FP4[0], 1, 5760
    args, cols, exact, abs_sum = _dense(fmt, m, n, k, seed=5)
    got = matmul.block_scaled_matmul(*args, fmt, k=k, device="cuda", target="sm_90a",
                                     out_dtype="float32")
    want = matmul_decode.block_scaled_matmul_decode(*args, fmt, k=k, out_dtype="float32",
                                                    device="cuda", variant=variant)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert_f32_within_bound(got[:, cols], exact, f32_error_bound(abs_sum, fmt, k, n_mul=1))


def test_dispatch_switch_gpu(monkeypatch):
    """BLOCKSCALE_DECODE_SPLIT_K=1000: the dense dispatch at M=1 N=5760 K=2880 (90 CTAs)
    runs mma_psk (the direct call's bits), within the bound."""
    monkeypatch.setenv(matmul_decode.VARIANT_ENV, "mma_p")
    monkeypatch.setenv(matmul_decode.SPLIT_K_ENV, "1000")
    check_dispatch_runs("mma_psk", 2880)

"""The split-K decode variant (``variant="mma_sk"``, FP4; _decode_mma_ir.emit_decode_mma_split_k)
run by the numpy interpreter.

Split z of S sums K steps ``[z * ceil(steps / S), ..)`` exactly as the "mma" kernel does (so
its fp32 partial is the "mma" kernel's result on that K slice, bit for bit); the last CTA
adds the partials in split order 0..S-1 and then applies alpha / expert scale / row scale.
Dense float32 outputs are therefore compared bit for bit with that model (the "mma" kernel
on each K slice with alpha 1, summed in order in numpy, times alpha): a different fp32 order
than "mma"'s one chain (each output still goes through at most kblocks fp32 roundings, so
the fp32 bound of test_matmul_common holds; bf16 outputs are checked consistent with it).
Scales span many binades so that the partial sums round: the tests assert that the reversed
order gives other bits, and that the result does not depend on which CTA reduces.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    assert_f32_within_bound,
    exact_dense,
    f32_error_bound,
    random_data,
)
from test_matmul_decode import GROUPED, _grouped_case
from test_matmul_grouped import exact_grouped

from blockscale import layouts
from blockscale.formats import MXFP4, NVFP4
from blockscale.ops import matmul_decode

pytestmark = pytest.mark.interp

FP4 = (NVFP4, MXFP4)
STEP = 512  # FP4 elements per K step (_decode_mma_ir.STEP_BYTES * 2)
# (M, N, K): 5 splits with a K tail; 3 with a tail and an N tail; 2 n-tiles; two row passes
DENSE = [(1, 70, 2080), (3, 130, 1056), (9, 33, 1536), (17, 20, 1536)]


def _wide_scales(rng, fmt, rows, k):
    """Block scales over ~30 binades (so fp32 sums of partials round)."""
    j = fmt.kblocks(k)
    if fmt.is_mx:
        return rng.integers(112, 143, size=(rows, j), dtype=np.uint8).view(
            ml_dtypes.float8_e8m0fnu)
    b = rng.integers(0x08, 0x7F, size=(rows, j), dtype=np.uint8)
    return b.view(ml_dtypes.float8_e4m3fn)


def _case(fmt, m, n, k, seed):
    rng = np.random.default_rng(seed)
    return (random_data(rng, fmt, m, k), random_data(rng, fmt, n, k),
            _wide_scales(rng, fmt, m, k), _wide_scales(rng, fmt, n, k))


def _run(fmt, a, b, sfa, sfb, k, variant, alpha=1.0, out="float32"):
    return matmul_decode.block_scaled_matmul_decode(
        a, b, layouts.interleave(sfa), layouts.interleave(sfb), fmt, k=k, alpha=alpha,
        out_dtype=out, device="interp", variant=variant)


def _partials(fmt, a, b, sfa, sfb, k, splits, variant="mma"):
    """The ``variant`` kernel's fp32 result on each split's K slice (alpha 1)."""
    steps = -(-k // STEP)
    per = -(-steps // splits)
    out = []
    for z in range(splits):
        lo, hi = z * per * STEP, min((z + 1) * per * STEP, k)
        jl, jh = lo // fmt.block_size, -(-hi // fmt.block_size)
        out.append(_run(fmt, np.ascontiguousarray(a[:, lo // 2:hi // 2]),
                        np.ascontiguousarray(b[:, lo // 2:hi // 2]),
                        np.ascontiguousarray(sfa[:, jl:jh]),
                        np.ascontiguousarray(sfb[:, jl:jh]), hi - lo, variant))
    return out


def _ordered_sum(parts, order):
    s = parts[order[0]].copy()
    for z in order[1:]:
        s = s + parts[z]  # float32 adds, one rounding each
    return s


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("mnk", DENSE, ids=lambda s: "x".join(map(str, s)))
def test_dense_sk_bit_exact_split_order_model(fmt, mnk):
    m, n, k = mnk
    a, b, sfa, sfb = _case(fmt, m, n, k, seed=sum(mnk))
    splits = matmul_decode.split_k(-(-n // 64), k)
    assert splits == min(-(-k // STEP), 5)
    alpha = 0.375
    got = _run(fmt, a, b, sfa, sfb, k, "mma_sk", alpha)
    parts = _partials(fmt, a, b, sfa, sfb, k, splits)
    want = _ordered_sum(parts, list(range(splits))) * np.float32(alpha)
    assert got.dtype == np.float32 and got.shape == (m, n)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, alpha)
    assert_f32_within_bound(got, exact, f32_error_bound(abs_sum, fmt, k, n_mul=1))


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("seed_count", [1, 2])
def test_result_independent_of_reducing_cta(fmt, seed_count, monkeypatch):
    """Seeding the tile counters makes split 2 - seed (not the last one) the CTA that sums
    (the interpreter runs the grid's CTAs in lock step: every partial is stored before the
    counters move); the bits are the same, the reversed order's are not, and the reducing
    CTA leaves the counters at 0."""
    m, n, k = 4, 100, 1536  # 3 splits of one step
    a, b, sfa, sfb = _case(fmt, m, n, k, seed=7)
    base = _run(fmt, a, b, sfa, sfb, k, "mma_sk")
    parts = _partials(fmt, a, b, sfa, sfb, k, 3)
    fwd, rev = _ordered_sum(parts, [0, 1, 2]), _ordered_sum(parts, [2, 1, 0])
    assert np.array_equal(base.view(np.uint32), fwd.view(np.uint32))
    assert not np.array_equal(fwd.view(np.uint32), rev.view(np.uint32))  # order matters
    real = matmul_decode._with_split_k
    seen = {}

    def seeded(spec, grid3, rows, nn, kk, buffers, host, device):
        g3, bufs = real(spec, grid3, rows, nn, kk, buffers, host, device)
        assert g3[2] == 3
        launch = device.launch

        def spy(kernel, grid, args, *rest):  # the launched counters (the last argument)
            seen["counters"] = args[-1]
            return launch(kernel, grid, args, *rest)

        monkeypatch.setattr(device, "launch", spy)
        cnt = np.full(g3[0] * g3[1], seed_count, np.int32)
        return g3, {**bufs, "counters": cnt}

    monkeypatch.setattr(matmul_decode, "_with_split_k", seeded)
    got = _run(fmt, a, b, sfa, sfb, k, "mma_sk")
    assert np.array_equal(got.view(np.uint32), base.view(np.uint32))
    assert list(np.asarray(seen["counters"])) == [0, 0]


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_dense_sk_bf16_consistent(fmt):
    m, n, k = 2, 90, 2560
    a, b, sfa, sfb = _case(fmt, m, n, k, seed=11)
    got = _run(fmt, a, b, sfa, sfb, k, "mma_sk", 1.5, "bfloat16")
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, 1.5)
    assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, fmt, k, n_mul=2))


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("case_id", range(len(GROUPED)))
def test_grouped_sk_within_bound(case_id, fmt):
    rng = np.random.default_rng(80 + case_id)
    case, row_scales, w_scales, esc, k = _grouped_case(fmt, case_id, rng)
    t = case["hidden"].shape[0]
    rows = rng.uniform(0.5, 2, t).astype(ml_dtypes.bfloat16) if fmt is NVFP4 else None
    got = matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=fmt, k=k,
                                              a_row_scales=rows, device="interp",
                                              variant="mma_sk")
    assert got.shape == (t, case["weight"].shape[1]) and got.dtype == ml_dtypes.bfloat16
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, fmt, k, esc, rows)
    assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, fmt, k,
                                                       n_mul=3 if rows is not None else 2))
    es = case["expert_start"].astype(np.int64)
    for g, e in enumerate(GROUPED[case_id][1]):
        if e < 0:
            assert not got[es[g]:es[g + 1]].view(np.uint16).any()  # D8: zero rows


def test_split_k_choice():
    sk = matmul_decode.split_k
    assert sk(90, 2944) == 6  # dense M=1 N=5760: 540 CTAs
    assert sk(360, 2880) == 2  # gpt-oss gate_up T=1, 4 experts: 720 CTAs
    assert sk(600, 4096) == 1
    assert sk(1, 64) == 1
    for ctas in (1, 7, 90, 200):
        for k in (512, 2080, 2944, 7168, 18432):
            s = sk(ctas, k)
            steps = -(-k // STEP)
            per = -(-steps // s)
            assert 1 <= s <= steps and (s - 1) * per < steps  # no empty split
    spec = matmul_decode.DecodeSpec("nvfp4", "dense", variant="mma_sk")
    assert spec.kernel_name.endswith("_mma_sk") and spec.cols == 64
    assert [x.name for x in spec.args()][-2:] == ["workspace", "counters"]
    with pytest.raises(ValueError, match="FP4"):
        matmul_decode.DecodeSpec("mxfp8", variant="mma_sk")

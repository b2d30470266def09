"""The decode kernels (blockscale/ops/matmul_decode.py) on an NVIDIA H100/H200 at MoE decode
shapes: gpt-oss-120b gate_up (E=128, top-4, K=2880, N=5760) and DeepSeek-V3 (E=256, top-8,
K=7168, N=4096), T in {1, 16} tokens with uniform random routing, through the normal dispatch
(``grouped_matmul_block_scaled`` picks the decode kernel: every group has <= 16 rows), and the
dense matmul at M in {1, 16}. Sampled output columns (the CTA slice edges included) of every
row are checked against the float64 value on exactly dequantized operands with the fp32
bound of test_matmul_common.py. Needs the bundle (``make gpu-bundle`` collects
``matmul_decode.bundle_specs``)::

    BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_matmul_decode_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    assert_f32_within_bound,
    dequantize_exact,
    f32_error_bound,
    random_data,
    random_dense_case,
    random_scales_2d,
)

from blockscale import layouts
from blockscale import reference as ref
from blockscale.formats import FORMATS, MXFP8, Format
from blockscale.ops import matmul, matmul_decode, matmul_grouped

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]

MODELS = {"gpt-oss-120b": (128, 4, 2880, 5760), "deepseek-v3": (256, 8, 7168, 4096)}


def _columns(rng: np.random.Generator, n: int) -> np.ndarray:
    """First and last CTA slices' edges plus random columns."""
    edge = [0, 1, 31, 32, 33, n - 33, n - 32, n - 1]
    return np.unique(np.concatenate([edge, rng.integers(0, n, 48)]))


def _moe_case(rng: np.random.Generator, fmt: Format, experts: int, top_k: int, k: int,
              n: int, tokens: int):
    ids = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k].astype(np.int32)
    _order, es, _restore, eids, _stats, offs = ref.moe_create_indices(ids.reshape(-1), experts)
    es, eids = es.astype(np.int64), eids.astype(np.int32)
    offs = offs.astype(np.int64)
    rows = int(es[-1])
    active = sorted({int(e) for e in eids if e >= 0})
    w = np.zeros((experts, n, fmt.data_cols(k)), dtype=fmt.elem_dtype)
    j = fmt.kblocks(k)
    w2d = np.zeros((experts, n, j), dtype=np.uint8)
    for e in active:  # only the experts the routing reads hold data
        w[e] = random_data(rng, fmt, n, k)
        w2d[e] = random_scales_2d(rng, fmt, n, k).view(np.uint8)
    w2d = w2d.view(fmt.scale_dtype)
    sfb6 = np.stack([layouts.interleave(w2d[e]) for e in range(experts)])
    a = random_data(rng, fmt, rows, k)
    a2d = random_scales_2d(rng, fmt, rows, k)
    tile0 = es[:-1] // 128 + offs
    g_of = np.repeat(np.arange(len(eids)), np.diff(es))
    srow = tile0[g_of] * 128 + (np.arange(rows) - es[g_of])
    tiles = int(max(srow.max() // 128 + 1 if rows else 1, 1))
    padded = np.zeros((tiles * 128, j), dtype=np.uint8)
    padded[srow] = a2d.view(np.uint8)
    sfa5 = layouts.interleave(padded.view(fmt.scale_dtype))
    esc = rng.uniform(0.5, 2.0, experts).astype(np.float32)
    case = {"hidden": a, "weight": w, "a_scales": sfa5, "b_scales": sfb6,
            "expert_start": es.astype(np.uint32), "a_scale_offsets": offs.astype(np.uint32),
            "expert_ids": eids}
    return case, a2d, w2d, esc


def check_moe_output(out, case, a2d, w2d, esc, fmt: Format, k: int, cols: np.ndarray) -> None:
    """A grouped decode result on columns ``cols``: groups of expert id -1 are zeros (D8),
    the others bf16-consistent with the exact product within the stated bound."""
    es, eids = case["expert_start"].astype(np.int64), case["expert_ids"]
    ad = dequantize_exact(case["hidden"], a2d, fmt, k)
    for g, e in enumerate(eids):
        s, t = es[g], es[g + 1]
        if s == t:
            continue
        if e < 0:
            assert not out[s:t].view(np.uint16).any()
            continue
        wd = dequantize_exact(case["weight"][e][cols], w2d[e][cols], fmt, k)
        exact = (ad[s:t] @ wd.T) * float(esc[e])
        abs_sum = (np.abs(ad[s:t]) @ np.abs(wd).T) * float(esc[e])
        assert_bf16_consistent(out[s:t][:, cols], exact,
                               f32_error_bound(abs_sum, fmt, k, n_mul=1))


@pytest.mark.parametrize("tokens", [1, 16])
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_moe_decode_gpu(fmt, model, tokens):
    experts, top_k, k, n = MODELS[model]
    if fmt is MXFP8 and model == "deepseek-v3" and tokens > 1:
        pytest.skip("host memory/time: MXFP8 DeepSeek-V3 covered at T=1")
    rng = np.random.default_rng(tokens * 7 + k)
    case, a2d, w2d, esc = _moe_case(rng, fmt, experts, top_k, k, n, tokens)
    assert matmul_decode.max_group_rows(case["expert_start"], 0) <= matmul_decode.MAX_ROWS
    out = matmul_grouped.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=fmt, k=k,
                                                     device="cuda", target="sm_90a")
    check_moe_output(out, case, a2d, w2d, esc, fmt, k, _columns(rng, n))


@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("nk", [(5760, 2880), (4096, 7168), (576, 7168)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_dense_decode_gpu(fmt, nk, m):
    n, k = nk
    rng = np.random.default_rng(m + n + k)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    cols = _columns(rng, n)
    ad, bd = dequantize_exact(a, sfa, fmt, k), dequantize_exact(b[cols], sfb[cols], fmt, k)
    exact, abs_sum = (ad @ bd.T) * 0.5, (np.abs(ad) @ np.abs(bd).T) * 0.5
    bound = f32_error_bound(abs_sum, fmt, k, n_mul=1)
    out32 = matmul_decode.block_scaled_matmul_decode(a, b, sfa5, sfb5, fmt, k=k, alpha=0.5,
                                                     out_dtype="float32", device="cuda")
    assert_f32_within_bound(out32[:, cols], exact, bound)
    out16 = matmul.block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=0.5, device="cuda",
                                       target="sm_90a")  # dispatch: the decode kernel
    assert_bf16_consistent(out16[:, cols], exact, bound)


@pytest.mark.parametrize("tokens", [1, 16])
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("fmt", FORMATS[:2], ids=lambda f: f.name)
def test_moe_decode_solo_gpu(fmt, model, tokens):
    """"mma_c8t1" (FP4, a pass a row on a block-diagonal B; the dispatch's pick where every
    group holds one row, as at T = 1) at both MoE shapes, within the bound."""
    experts, top_k, k, n = MODELS[model]
    rng = np.random.default_rng(tokens * 13 + k)
    case, a2d, w2d, esc = _moe_case(rng, fmt, experts, top_k, k, n, tokens)
    out = matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=fmt, k=k,
                                              device="cuda", variant="mma_c8t1")
    check_moe_output(out, case, a2d, w2d, esc, fmt, k, _columns(rng, n))


#: (format, variant) of the tensor-core decode kernels: FP4's and MXFP8's
MMA_CASES = [(f, v) for f in FORMATS[:2]
             for v in ("mma", "mma2", "mma_p", "mma_p5", "mma_c", "mma_c8", "mma_c85", "mma_c86",
                       "mma_c8t", "mma_c8s2", "mma_c8s4", "mma_c8d2", "mma_c8w", "mma_c8r",
                       "mma_c8r4")] + [(MXFP8, v) for v in matmul_decode.MX8_VARIANTS]


@pytest.mark.parametrize("tokens", [1, 16, 128])
@pytest.mark.parametrize("fmt,variant", MMA_CASES, ids=lambda x: getattr(x, "name", x))
def test_moe_decode_mma_gpu(fmt, tokens, variant):
    """The tensor-core variants (FP4, MXFP8) at gpt-oss-120b gate_up, T up to 128 (groups <=
    16 rows)."""
    experts, top_k, k, n = MODELS["gpt-oss-120b"]
    rng = np.random.default_rng(tokens * 11 + 1)
    case, a2d, w2d, esc = _moe_case(rng, fmt, experts, top_k, k, n, tokens)
    if matmul_decode.max_group_rows(case["expert_start"], 0) > matmul_decode.MAX_ROWS:
        pytest.skip("a group of > 16 rows in this routing")
    out = matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=fmt, k=k,
                                              device="cuda", variant=variant)
    check_moe_output(out, case, a2d, w2d, esc, fmt, k, _columns(rng, n))


@pytest.mark.parametrize("variant", ["mma", "mma2", "mma_p", "mma_c", "mma_c8", "mma_c8t",
                                     "mma_c8s2", "mma_c8s4", "mma_c8d2"])
@pytest.mark.parametrize("m", [1, 9, 16])
@pytest.mark.parametrize("fmt", FORMATS[:2], ids=lambda f: f.name)
def test_dense_decode_mma_bit_identical_gpu(fmt, m, variant):
    """The mma variant equals the portable kernel bit for bit on the GPU too (exact f16
    tensor-core block sums, subnormal f16 operands included; every code present)."""
    n, k = 576, 7168
    rng = np.random.default_rng(m + 100)
    a, b, _sfa, _sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    b.view(np.uint8)[:] = np.resize(np.arange(256, dtype=np.uint8), b.shape)
    _assert_equals_portable(a, b, sfa5, sfb5, fmt, k, variant)


def _assert_equals_portable(a, b, sfa5, sfb5, fmt, k, variant):
    """The decode ``variant``'s f32 output (alpha 0.5) equals the portable kernel's bit for
    bit on the GPU."""
    got = matmul_decode.block_scaled_matmul_decode(a, b, sfa5, sfb5, fmt, k=k, alpha=0.5,
                                                   out_dtype="float32", device="cuda",
                                                   variant=variant)
    want = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=0.5,
                                            out_dtype="float32", device="cuda")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("variant", ["mma_c8t", "mma_c8s2", "mma_c8s4"])
@pytest.mark.parametrize("k", [2880, 1088])
@pytest.mark.parametrize("fmt", FORMATS[:2], ids=lambda f: f.name)
def test_dense_decode_tail_bit_identical_gpu(fmt, k, variant):
    """"mma_c8t" (last K step peeled, its unit pairs past the row end skipped: 10 / 2 of 16
    here) and the sliced "mma_c8s*" (N = 640: 10 slices, a CTA of 4 with 2 left) equal the
    portable kernel bit for bit."""
    m, n = 5, 640
    rng = np.random.default_rng(k)
    a, b, _sfa, _sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    _assert_equals_portable(a, b, sfa5, sfb5, fmt, k, variant)


@pytest.mark.parametrize("variant", matmul_decode.STREAM_VARIANTS)
@pytest.mark.parametrize("ctas", [None, 7])
@pytest.mark.parametrize("tokens", [1, 16, 128])
@pytest.mark.parametrize("fmt", FORMATS[:2], ids=lambda f: f.name)
def test_moe_decode_stream_equals_tail_gpu(fmt, tokens, ctas, variant, monkeypatch):
    """The persistent variants ("mma_c8w", the TMA rings "mma_c8r" / "mma_c8r4"; one wave of
    CTAs, or 7 CTAs walking every unit) equal "mma_c8t" byte for byte at gpt-oss-120b
    gate_up (the same sums in the same order), with a host and a device ``expert_start``
    (every group, passes from T: idle units), and a group of expert id -1 written as
    zeros."""
    experts, top_k, k, n = MODELS["gpt-oss-120b"]
    rng = np.random.default_rng(tokens * 13 + 5)
    case, a2d, w2d, esc = _moe_case(rng, fmt, experts, top_k, k, n, tokens)
    if matmul_decode.max_group_rows(case["expert_start"], 0) > matmul_decode.MAX_ROWS:
        pytest.skip("a group of > 16 rows in this routing")
    live = np.nonzero(np.diff(case["expert_start"].astype(np.int64)) > 0)[0]
    case["expert_ids"] = case["expert_ids"].copy()
    case["expert_ids"][live[-1]] = -1  # D8: zeros
    monkeypatch.setattr(matmul_decode, "STREAM_CTAS", ctas)
    want = matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=fmt, k=k,
                                               device="cuda", variant="mma_c8t")
    got = matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=fmt, k=k,
                                              device="cuda", variant=variant)
    assert np.array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    from blockscale import runtime
    dev = runtime.get_device("cuda")
    on_dev = {name: dev.to_device(v.astype(np.int32) if name in ("expert_start",
                                                                 "a_scale_offsets") else v)
              for name, v in case.items()}
    again = matmul_decode.grouped_matmul_decode(**on_dev, expert_scales=esc, fmt=fmt, k=k,
                                                device="cuda", variant=variant)
    assert np.array_equal(dev.to_host(again).view(np.uint16),
                          np.asarray(want).view(np.uint16))
    check_moe_output(np.asarray(got), case, a2d, w2d, esc, fmt, k, _columns(rng, n))

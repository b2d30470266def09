"""The sm_90a tensor-core block-scaled matmul (dense and grouped), run by the numpy interpreter.

The interpreter executes the kernel's IR with ``nvvm.mma.sync`` modeled from the PTX fragment
layouts (exact products, exact sum, one f32 rounding). Outputs are checked against the float64
value on exactly dequantized operands with the fp32 bound of test_matmul_common.py, and, for
the FP4 formats, for bit equality with the portable kernel (the design keeps every FP4 block
sum exact and applies the scales in the same fp32 order; see blockscale/ops/_mma_ir.py).
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
    random_dense_case,
)
from test_matmul_grouped import exact_grouped, make_grouped_case

from blockscale.formats import FORMATS, MXFP8, NVFP4
from blockscale.ops import matmul, matmul_grouped, matmul_grouped_sm90, matmul_sm90

pytest.importorskip("mlir")

from blockscale.runtime.interpreter import ops_mma

pytestmark = pytest.mark.interp

SHAPES = [(1, 64, 64), (17, 72, 128), (129, 136, 256), (64, 64, 1024)]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("mnk", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_dense_matches_exact_and_portable(fmt, mnk):
    m, n, k = mnk
    rng = np.random.default_rng(sum(mnk) + len(fmt.name))
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, 0.225)
    bound = f32_error_bound(abs_sum, fmt, k, n_mul=1)
    out_dtype = "float32" if (m + n) % 2 else "bfloat16"  # both dtypes over the shapes
    got = matmul_sm90.block_scaled_matmul_sm90(a, b, sfa5, sfb5, fmt, k=k, alpha=0.225,
                                               out_dtype=out_dtype, device="interp")
    assert got.shape == (m, n)
    if out_dtype == "float32":
        assert_f32_within_bound(got, exact, bound)
    else:
        assert_bf16_consistent(got, exact, bound)
    if fmt.is_fp4:  # bit-identical to the portable kernel
        naive = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=0.225,
                                                 out_dtype=out_dtype, device="interp")
        assert np.array_equal(got.view(np.uint8), naive.view(np.uint8))


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tiles", [(64, 128), (64, 64)])
def test_tiles_and_out_dtypes(tiles, out_dtype):
    fmt, (m, n, k) = NVFP4, (70, 130, 96)  # K = 1.5 steps: a partial last K-step
    rng = np.random.default_rng(3)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, 2.0)
    got = matmul_sm90.block_scaled_matmul_sm90(a, b, sfa5, sfb5, fmt, k=k, alpha=2.0,
                                               out_dtype=out_dtype, tiles=tiles,
                                               device="interp")
    bound = f32_error_bound(abs_sum, fmt, k, n_mul=1)
    if out_dtype == "float32":
        assert_f32_within_bound(got, exact, bound)
    else:
        assert_bf16_consistent(got, exact, bound)


def test_mxfp8_partial_block_and_nan():
    """K % 32 == 16 (a half MXFP8 block, zero-filled) and an E4M3 NaN element -> NaN row."""
    fmt, (m, n, k) = MXFP8, (5, 9, 48)
    rng = np.random.default_rng(4)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, 1.0)
    got = matmul_sm90.block_scaled_matmul_sm90(a, b, sfa5, sfb5, fmt, k=k,
                                               out_dtype="float32", device="interp")
    assert_f32_within_bound(got, exact, f32_error_bound(abs_sum, fmt, k, n_mul=1))
    a_nan = a.copy()
    a_nan.view(np.uint8)[2, 7] = 0x7F
    got = matmul_sm90.block_scaled_matmul_sm90(a_nan, b, sfa5, sfb5, fmt, k=k,
                                               out_dtype="float32", device="interp")
    assert np.isnan(got[2]).all() and not np.isnan(np.delete(got, 2, axis=0)).any()


def test_dispatch_uses_fast_path_only_when_aligned():
    assert matmul_sm90.fast_path in matmul.FAST_PATHS
    assert matmul_sm90.fast_path("sm_90a", NVFP4, 4, 8, 64, "bfloat16", None) is not None
    assert matmul_sm90.fast_path("sm_90a", NVFP4, 4, 8, 48, "bfloat16", None) is None
    assert matmul_sm90.fast_path("sm_100a", NVFP4, 4, 8, 64, "bfloat16", None) is None
    assert matmul_sm90.fast_path("sm_90a", MXFP8, 4, 8, 48, "bfloat16", None) is not None
    assert matmul_grouped_sm90.fast_path in matmul_grouped.FAST_PATHS


def test_dispatch_with_fused_epilogue_is_bit_exact():
    from blockscale.ops import matmul_epilogue as ep

    rng = np.random.default_rng(5)
    m, n, k = 19, 23, 128
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    got = matmul.block_scaled_matmul_with_epilogue(
        a, b, sfa5, sfb5, NVFP4, alpha=0.5, out_dtype="float32",
        epilogue=ep.chain(ep.bias(), ep.relu()), epilogue_inputs={"bias": bias},
        device="interp")
    base = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, alpha=0.5,
                                            out_dtype="float32", device="interp")
    assert np.array_equal(got, np.maximum(base + bias[None, :], np.float32(0)))


GROUPED = [  # (counts, expert ids, num experts, N, K)
    ([0, 3, 1, 2], [-1, 2, -1, 0], 3, 40, 128),
    ([65, 70, 5], [0, 1, 2], 3, 72, 64),
]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("case_id", range(len(GROUPED)))
def test_grouped_matches_exact_and_portable(fmt, case_id):
    counts, ids, e_count, n, k = GROUPED[case_id]
    rng = np.random.default_rng(case_id + 10)
    case, row_scales, w_scales = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
    esc = (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)
    rows = rng.uniform(0.5, 2, sum(counts)).astype(ml_dtypes.bfloat16) if fmt is NVFP4 \
        else None
    got = matmul_grouped.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=fmt, k=k,
                                                     a_row_scales=rows, device="interp")
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, fmt, k, esc, rows)
    assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, fmt, k,
                                                       n_mul=2 if rows is not None else 1))
    es = case["expert_start"].astype(np.int64)
    for g, e in enumerate(ids):
        if e < 0:
            assert not got[es[g]:es[g + 1]].view(np.uint16).any()  # D8: zero rows
    if fmt.is_fp4:
        import os

        os.environ[matmul_sm90.ENV_SWITCH] = "0"
        try:
            portable = matmul_grouped.grouped_matmul_block_scaled(
                **case, expert_scales=esc, fmt=fmt, k=k, a_row_scales=rows, device="interp")
        finally:
            del os.environ[matmul_sm90.ENV_SWITCH]
        assert np.array_equal(got.view(np.uint16), portable.view(np.uint16))


# ---- the interpreter's MMA model ------------------------------------------------------------

def test_mma_model_matches_matmul_on_fragment_layout():
    """Scatter random A/B/C through the documented lane maps; D must be A @ B + C."""
    rng = np.random.default_rng(6)
    am = rng.integers(-8, 8, (2, 16, 16)).astype(np.float64)
    bm = rng.integers(-8, 8, (2, 16, 8)).astype(np.float64)
    cm = rng.integers(-8, 8, (2, 16, 8)).astype(np.float32)
    lane = np.arange(32)
    g, t = lane >> 2, lane & 3
    a = np.stack([np.stack([am[:, g + 8 * (r & 1), 2 * t + 8 * (r >> 1) + h]
                            for h in range(2)], -1) for r in range(4)], 2)
    b = np.stack([np.stack([bm[:, 2 * t + 8 * r + h, g] for h in range(2)], -1)
                  for r in range(2)], 2)
    c = np.stack([cm[:, g + 8 * (i >> 1), 2 * t + (i & 1)] for i in range(4)], -1)
    d = ops_mma.mma_m16n8k16(a, b, c)
    want = am @ bm + cm
    for i in range(4):
        assert np.array_equal(d[:, :, i], want[:, g + 8 * (i >> 1), 2 * t + (i & 1)])


def test_prmt_model():
    lo, hi = np.array([0x33221100], np.int32), np.array([0x77665544 - 2**32], np.int64)
    assert ops_mma.prmt(lo, hi, np.array([0x5140]))[0] == 0x55114400
    assert ops_mma.prmt(lo, hi, np.array([0x3210]))[0] == 0x33221100
    assert int(ops_mma.prmt(lo, hi, np.array([0x7654]))[0]) & 0xFFFFFFFF == 0x77665544
    assert ops_mma.prmt(lo, hi, np.array([0x0004]))[0] == 0x00000044
    # sign-replicate (selector bit 3): byte 0 = 0x80 -> 0xFF; the other selectors pick byte 0
    got = int(ops_mma.prmt(np.array([0x80]), np.array([0]), np.array([0x0008]))[0])
    assert got & 0xFFFFFFFF == 0x808080FF

"""The decode (few rows) block-scaled matmul kernels (blockscale/ops/matmul_decode.py), run by
the numpy interpreter: grouped (MoE) and dense, NVFP4 / MXFP4 / MXFP8, on sm_90a and (the IR
is portable to 32-lane targets) sm_100a.

Outputs are checked against the float64 value on exactly dequantized operands with the fp32
bound of test_matmul_common.py (bf16: consistent with the exact value within that bound);
unused groups (id -1) must be exact zeros (D8). Cases: MAX's [0,3,1,2] / [-1,2,-1,0], one
row per group, [2,2,2,2], one 16-row group (4 passes of 4 rows), K tails (K not a multiple of
128 or of the 1024-element window), several windows, N not a multiple of the CTA's 32 columns.
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
from blockscale.ops import matmul, matmul_decode, matmul_grouped, matmul_grouped_sm90

pytestmark = pytest.mark.interp

GROUPED = [  # (counts, expert ids, num experts, N, K)
    ([0, 3, 1, 2], [-1, 2, -1, 0], 3, 40, 128),
    ([1, 1, 1, 1], [3, 0, 2, 1], 4, 33, 96),
    ([2, 2, 2, 2], [2, 2, 2, 2], 3, 24, 160),
    ([16], [1], 2, 32, 64),
    ([3, 0, 5], [0, 1, 1], 2, 36, 1088),  # two windows (FP4: 1024 elements), tail of 64
]


def _grouped_case(fmt, case_id, rng):
    counts, ids, e_count, n, k = GROUPED[case_id]
    case, row_scales, w_scales = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
    esc = (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)
    return case, row_scales, w_scales, esc, k


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("case_id", range(len(GROUPED)))
def test_grouped_decode_within_bound(case_id, fmt, target):
    rng = np.random.default_rng(40 + case_id)
    case, row_scales, w_scales, esc, k = _grouped_case(fmt, case_id, rng)
    t = case["hidden"].shape[0]
    rows = rng.uniform(0.5, 2, t).astype(ml_dtypes.bfloat16) if fmt is NVFP4 else None
    got = matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=fmt, k=k,
                                              a_row_scales=rows, device="interp",
                                              target=target)
    assert got.shape == (t, case["weight"].shape[1]) and got.dtype == ml_dtypes.bfloat16
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, fmt, k, esc, rows)
    assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, fmt, k,
                                                       n_mul=2 if rows is not None else 1))
    es = case["expert_start"].astype(np.int64)
    for g, e in enumerate(GROUPED[case_id][1]):
        if e < 0:
            assert not got[es[g]:es[g + 1]].view(np.uint16).any()  # D8: zero rows


DENSE = [(1, 40, 64), (1, 70, 2080), (5, 33, 160), (16, 32, 96)]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("mnk", DENSE, ids=lambda s: "x".join(map(str, s)))
def test_dense_decode_within_bound(fmt, mnk):
    m, n, k = mnk
    rng = np.random.default_rng(sum(mnk))
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, 0.375)
    bound = f32_error_bound(abs_sum, fmt, k, n_mul=1)
    got = matmul_decode.block_scaled_matmul_decode(a, b, sfa5, sfb5, fmt, k=k, alpha=0.375,
                                                   out_dtype="float32", device="interp")
    assert_f32_within_bound(got, exact, bound)
    got16 = matmul.block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=0.375,
                                       device="interp", target="sm_90a")  # dispatch
    assert_bf16_consistent(got16, exact, bound)


def test_fp4_block_terms_are_exact_k_tail():
    """FP4, K = 32 (one chunk, lanes 1..31 idle): the lane sums are exact block terms, so the
    result equals the portable kernel's bit for bit."""
    rng = np.random.default_rng(7)
    for fmt in (NVFP4, FORMATS[1]):
        a, b, _, _, sfa5, sfb5 = random_dense_case(rng, fmt, 3, 40, 32)
        got = matmul_decode.block_scaled_matmul_decode(a, b, sfa5, sfb5, fmt, k=32,
                                                       out_dtype="float32", device="interp")
        want = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=32,
                                                out_dtype="float32", device="interp")
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_extreme_weight_codes():
    """Every E2M1 / E4M3 weight code (subnormals, +-0, max) decodes exactly in registers."""
    rng = np.random.default_rng(8)
    for fmt in FORMATS:
        m, n, k = 2, 32, 256
        a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
        codes = np.arange(256, dtype=np.uint8)
        if not fmt.is_fp4:
            codes[(codes & 0x7F) == 0x7F] = 0x01  # NaN codes: test_nan_weight_code_gives_nan_column
        bv = b.view(np.uint8)
        bv[:] = np.resize(codes, bv.shape)
        exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, 1.0)
        got = matmul_decode.block_scaled_matmul_decode(a, b, sfa5, sfb5, fmt, k=k,
                                                       out_dtype="float32", device="interp")
        assert_f32_within_bound(got, exact, f32_error_bound(abs_sum, fmt, k, n_mul=1))


def test_dispatch_rules(monkeypatch):
    assert matmul_grouped.FAST_PATHS[0] is matmul_decode.grouped_fast_path
    assert matmul.FAST_PATHS[0] is matmul_decode.dense_fast_path
    assert matmul_grouped_sm90.fast_path in matmul_grouped.FAST_PATHS
    gp, dp = matmul_decode.grouped_fast_path, matmul_decode.dense_fast_path
    assert gp("sm_90a", NVFP4, 64, 128, 2880, 4, False) is not None
    assert gp("sm_100a", NVFP4, 64, 128, 2880, 4, False) is None
    assert gp("sm_90a", NVFP4, 64, 128, 48, 4, False) is None  # 24-byte rows
    assert gp("sm_90a", MXFP8, 64, 128, 48, 4, False) is not None
    assert gp("sm_90a", NVFP4, 64, 128, 0, 4, False) is None  # K = 0: portable kernel
    assert dp("sm_90a", NVFP4, 16, 128, 2880, "bfloat16", None) is not None
    assert dp("sm_90a", NVFP4, 17, 128, 2880, "bfloat16", None) is None
    assert dp("sm_90a", NVFP4, 1, 128, 2880, "float32", object()) is None  # epilogue
    monkeypatch.setenv(matmul_decode.ENV_SWITCH, "0")
    assert gp("sm_90a", NVFP4, 64, 128, 2880, 4, False) is None
    assert dp("sm_90a", NVFP4, 1, 128, 2880, "bfloat16", None) is None


def spy_launches(monkeypatch, name, *hosts) -> list:
    """``name(spec)`` of every launch through the ``H.launch`` of each module in ``hosts``
    (appended to the returned list)."""
    launched = []
    real = hosts[0].H.launch

    def spy(spec, *args, **kw):
        launched.append(name(spec))
        return real(spec, *args, **kw)

    for m in hosts:
        monkeypatch.setattr(m.H, "launch", spy)
    return launched


def dispatched_within_bound(rng, fmt, counts, ids, n, k) -> None:
    """The grouped op on the interpreter through its dispatch (2 experts), checked within
    the fp32 bound."""
    case, row_scales, w_scales = make_grouped_case(rng, fmt, counts, ids, 2, n, k)
    esc = np.array([1.5, 0.75], np.float32)
    got = matmul_grouped.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=fmt, k=k,
                                                     device="interp")
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, fmt, k, esc)
    assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, fmt, k, n_mul=1))


def test_dispatch_large_group_hands_over(monkeypatch):
    """A group of 17 rows goes to the tensor-core kernel; groups of <= 16 to the decode one."""
    launched = spy_launches(monkeypatch, lambda spec: type(spec).__name__, matmul_decode,
                            matmul_grouped_sm90)
    rng = np.random.default_rng(9)
    for counts, want in (([17, 2], "Sm90GroupedSpec"), ([16, 2], "DecodeSpec")):
        launched.clear()
        dispatched_within_bound(rng, NVFP4, counts, [0, 1], 32, 64)
        assert launched == [want]


def test_bundle_specs_and_names():
    specs = matmul_decode.bundle_specs("sm_90a")
    # simt + mma, mma2, mma_p, mma_psk, mma_c, mma_c8, mma_c8t, mma_c8s2, mma_c8s4, mma_c8d2,
    # mma_shot, mma_shot7k, mma_shot16, mma_shot32, mma_shot6, mma_shot1 (7 each), mma_p5,
    # mma_c85, mma_c86, mma_c8w, mma_c8r, mma_c8r4 (grouped only: 3 each), the 12 + 8 dense
    # NVFP4 lean variants (K <= 3072 and K <= 7168; 2 each: bf16 and f32 out), mma_c8t1
    # (grouped only: 3, and 3 with sigma_out for the fused SwiGLU op's chained path), the
    # MXFP8 mma_x8 (grouped plain and sigma_out, dense bf16 / f32) and mma_x8n2 (grouped plain,
    # dense bf16 / f32)
    assert len({s.kernel_name for s in specs}) == len(specs) == \
        10 + 16 * 7 + 7 * 3 + 20 * 2 + 3 + 7
    assert matmul_decode.bundle_specs("gfx942") == []
    with pytest.raises(ValueError):
        matmul_decode.DecodeSpec("nvfp4", "dense", row_scales=True)
    with pytest.raises(ValueError):
        matmul_decode.DecodeSpec("nvfp4", "grouped", "float32")


def test_nan_scale_gives_nan_column():
    """D5: an E4M3 weight scale 0x7F (NaN) makes its output column NaN; others stay finite."""
    rng = np.random.default_rng(11)
    m, n, k = 2, 40, 64
    a, b, _sfa, sfb, sfa5, _sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    sfb_nan = sfb.copy()
    sfb_nan.view(np.uint8)[5, 1] = 0x7F
    from blockscale import layouts

    got = matmul_decode.block_scaled_matmul_decode(a, b, sfa5, layouts.interleave(sfb_nan),
                                                   NVFP4, k=k, out_dtype="float32",
                                                   device="interp")
    assert np.isnan(got[:, 5]).all() and not np.isnan(np.delete(got, 5, axis=1)).any()


@pytest.mark.parametrize("code", [0x7F, 0xFF])
def test_nan_weight_code_gives_nan_column(code):
    """An MXFP8 E4M3 weight NaN code (0x7F / 0xFF) makes its output column NaN, as in the
    reference (not the +-480 * 2^-120 its bit placement gives); other columns stay finite.
    The code sits in the last (third, partial) 512-byte window of its weight row."""
    rng = np.random.default_rng(12)
    m, n, k = 3, 40, 1040
    a, b, _sfa, _sfb, sfa5, sfb5 = random_dense_case(rng, MXFP8, m, n, k)
    bv = b.view(np.uint8)
    bv[(bv & 0x7F) == 0x7F] = 0x01  # only the planted NaN
    bv[7, 1030] = code
    got = matmul_decode.block_scaled_matmul_decode(a, b, sfa5, sfb5, MXFP8, k=k,
                                                   out_dtype="float32", device="interp")
    assert np.isnan(got[:, 7]).all() and not np.isnan(np.delete(got, 7, axis=1)).any()

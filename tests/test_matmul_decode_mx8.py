"""The MXFP8 tensor-core decode kernel ("mma_x8", blockscale/ops/_decode_mx8_ir.py), run by
the numpy interpreter: grouped (MoE) and dense, within the fp32 bound of
test_matmul_common.py against the float64 value on exactly dequantized operands; D8 zero rows;
E4M3 NaN codes and E8M0 NaN scales make their output columns NaN (D5); the dispatch runs it
for MXFP8 (BLOCKSCALE_DECODE_MX8_VARIANT=simt: the SIMT kernel).

Cases cover K tails (K % 256 != 0; K % 32 == 16: a half block), several K steps, N not a
multiple of the CTA's 64 columns, groups of 9..16 rows (two passes of 8), ids -1.
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
from test_matmul_decode import spy_launches
from test_matmul_grouped import exact_grouped, make_grouped_case

from blockscale import layouts
from blockscale.formats import MXFP8
from blockscale.ops import matmul, matmul_decode, matmul_grouped, matmul_grouped_sm90

pytestmark = pytest.mark.interp

VARIANT = "mma_x8"
GROUPED = [  # (counts, expert ids, num experts, N, K)
    ([0, 3, 1, 2], [-1, 2, -1, 0], 3, 40, 128),
    ([1, 1, 1, 1], [3, 0, 2, 1], 4, 70, 272),
    ([12, 2], [1, 0], 2, 64, 560),
    ([16], [1], 2, 130, 1040),
    ([40, 0, 7], [0, 1, 1], 2, 64, 288),  # n4: two passes of 32 rows
]


@pytest.mark.parametrize("variant", matmul_decode.MX8_VARIANTS)
@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("case_id", range(len(GROUPED)))
def test_grouped_within_bound(case_id, target, variant):
    counts, ids, e_count, n, k = GROUPED[case_id]
    rng = np.random.default_rng(70 + case_id)
    case, row_scales, w_scales = make_grouped_case(rng, MXFP8, counts, ids, e_count, n, k)
    esc = (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)
    t = case["hidden"].shape[0]
    got = matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=MXFP8, k=k,
                                              device="interp", target=target, variant=variant)
    assert got.shape == (t, n) and got.dtype == ml_dtypes.bfloat16
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, MXFP8, k, esc)
    assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, MXFP8, k, n_mul=1))
    es = case["expert_start"].astype(np.int64)
    for g, e in enumerate(ids):
        if e < 0:
            assert not got[es[g]:es[g + 1]].view(np.uint16).any()  # D8: zero rows


@pytest.mark.parametrize("variant", matmul_decode.MX8_VARIANTS)
@pytest.mark.parametrize("mnk", [(1, 40, 64), (5, 70, 272), (9, 64, 560), (16, 33, 1040)],
                         ids=lambda s: "x".join(map(str, s)))
def test_dense_within_bound(mnk, variant):
    m, n, k = mnk
    rng = np.random.default_rng(sum(mnk))
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, MXFP8, m, n, k)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, MXFP8, k, 0.375)
    got = matmul_decode.block_scaled_matmul_decode(a, b, sfa5, sfb5, MXFP8, k=k, alpha=0.375,
                                                   out_dtype="float32", device="interp",
                                                   variant=variant)
    assert_f32_within_bound(got, exact, f32_error_bound(abs_sum, MXFP8, k, n_mul=1))


def test_every_weight_code():
    """Every finite E4M3 weight code (subnormals, +-0, +-448) through cvt.rn.f16x2.e4m3x2."""
    rng = np.random.default_rng(8)
    m, n, k = 3, 64, 512
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, MXFP8, m, n, k)
    codes = np.arange(256, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x01
    b.view(np.uint8)[:] = np.resize(codes, b.shape)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, MXFP8, k, 1.0)
    got = matmul_decode.block_scaled_matmul_decode(a, b, sfa5, sfb5, MXFP8, k=k,
                                                   out_dtype="float32", device="interp",
                                                   variant=VARIANT)
    assert_f32_within_bound(got, exact, f32_error_bound(abs_sum, MXFP8, k, n_mul=1))


@pytest.mark.parametrize("where", ["weight", "activation", "weight_scale"])
def test_nan_makes_nan(where):
    """A NaN weight code (column 7), activation code (row 1) or weight scale 0xFF (column
    7), in the last, partial K step: NaN there, finite elsewhere."""
    rng = np.random.default_rng(12)
    m, n, k = 3, 40, 1040
    a, b, _sfa, sfb, sfa5, sfb5 = random_dense_case(rng, MXFP8, m, n, k)
    for x in (a, b):
        xv = x.view(np.uint8)
        xv[(xv & 0x7F) == 0x7F] = 0x01  # only the planted NaN
    if where == "weight":
        b.view(np.uint8)[7, 1030] = 0xFF
    elif where == "activation":
        a.view(np.uint8)[1, 1030] = 0x7F
    else:
        sfb = sfb.copy()
        sfb.view(np.uint8)[7, 32] = 0xFF
        sfb5 = layouts.interleave(sfb)
    got = matmul_decode.block_scaled_matmul_decode(a, b, sfa5, sfb5, MXFP8, k=k,
                                                   out_dtype="float32", device="interp",
                                                   variant=VARIANT)
    nan = np.isnan(got)
    want = np.zeros_like(nan)
    if where == "activation":
        want[1, :] = True
    else:
        want[:, 7] = True
    assert np.array_equal(nan, want)


def test_dispatch_runs_it(monkeypatch):
    """MXFP8 decode-sized calls run the tensor-core kernel: groups <= 16 rows "mma_x8" (17:
    the tiled kernel), dense M = 1 the SIMT kernel (faster there: runs DS / DT), M <= 8
    "mma_x8", 9..16 "mma_x8n2"; with BLOCKSCALE_DECODE_MX8_VARIANT=simt the SIMT kernel;
    a bad name is a ValueError."""
    launched = spy_launches(monkeypatch,
                            lambda spec: getattr(spec, "variant", type(spec).__name__),
                            matmul_decode, matmul_grouped_sm90)
    rng = np.random.default_rng(5)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, MXFP8, 2, 64, 96)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, MXFP8, 96, 1.0)
    for env, want in ((None, VARIANT), ("simt", "simt")):
        if env:
            monkeypatch.setenv(matmul_decode.MX8_VARIANT_ENV, env)
        launched.clear()
        got = matmul.block_scaled_matmul(a, b, sfa5, sfb5, MXFP8, k=96, device="interp",
                                         target="sm_90a")
        assert launched == [want]
        assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, MXFP8, 96, n_mul=1))
    launched.clear()
    monkeypatch.delenv(matmul_decode.MX8_VARIANT_ENV)
    matmul.block_scaled_matmul(a[:1], b, layouts.interleave(sfa[:1]), sfb5, MXFP8, k=96,
                               device="interp", target="sm_90a")
    assert launched == ["simt"]
    for m, want in ((8, "mma_x8"), (9, "mma_x8n2"), (16, "mma_x8n2")):
        a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, MXFP8, m, 64, 96)
        launched.clear()
        matmul.block_scaled_matmul(a, b, sfa5, sfb5, MXFP8, k=96, device="interp",
                                   target="sm_90a")
        assert launched == [want], m
    launched.clear()
    for counts, want in (([3, 0, 5], "mma_x8"), ([12, 2], "mma_x8"), ([17, 3], "Sm90GroupedSpec")):
        case, _rs, _ws = make_grouped_case(rng, MXFP8, counts, [0, 1, 1][:len(counts)], 2, 64,
                                           96)
        launched.clear()
        matmul_grouped.grouped_matmul_block_scaled(**case, expert_scales=np.ones(2, np.float32),
                                                   fmt=MXFP8, k=96, device="interp")
        assert launched == [want], counts
    monkeypatch.setenv(matmul_decode.MX8_VARIANT_ENV, "mma_c8t")
    with pytest.raises(ValueError, match=matmul_decode.MX8_VARIANT_ENV):
        matmul_decode.dispatch_variant(MXFP8)


def test_spec_checks():
    with pytest.raises(ValueError, match="mxfp8 only"):
        matmul_decode.DecodeSpec("nvfp4", "grouped", variant=VARIANT)
    with pytest.raises(ValueError, match="FP4"):
        matmul_decode.DecodeSpec("mxfp8", "grouped", variant="mma_c8t")


def test_fused_swiglu_runs_the_chained_decode(monkeypatch):
    """The fused SwiGLU op at decode sizes (groups <= 16 rows) runs the chained path with
    "mma_x8" and its σ store, so fused == grouped matmul -> fused_silu_quantize byte for
    byte (the MXFP8 block sums round in the tensor core)."""
    from test_matmul_swiglu import _b, swiglu_case

    from blockscale.ops import matmul_swiglu as SW
    from blockscale.ops.quantize_silu import fused_silu_quantize

    launched = spy_launches(monkeypatch, lambda spec: (spec.variant, spec.sigma_out),
                            matmul_decode)
    case = swiglu_case(MXFP8, [3, 0, 5], [1, -1, 0], 2, 40, 560, seed=21)
    grp = (case["expert_start"], case["a_scale_offsets"], case["expert_ids"])
    data, scales = SW.grouped_matmul_swiglu(case["hidden"], case["w_sigma"], case["a_scales"],
                                            case["sfb_sigma"], *grp, None, None, MXFP8, k=560,
                                            device="interp", target="sm_90a")
    assert launched == [(VARIANT, True)]
    gate_up = matmul_grouped.grouped_matmul_block_scaled(
        case["hidden"], case["weight"], case["a_scales"], case["b_scales"], *grp, None, MXFP8,
        k=560, device="interp", target="sm_90a")
    c_data, c_scales = fused_silu_quantize(gate_up, MXFP8, *grp, None,
                                           num_scale_tiles=case["a_scales"].shape[0],
                                           device="interp", target="sm_90a")
    np.testing.assert_array_equal(_b(data), _b(c_data))
    np.testing.assert_array_equal(_b(scales), _b(c_scales))

"""The decode kernel's tensor-core variant (``variant="mma"``, FP4; blockscale/ops/_decode_mma_ir.py)
run by the numpy interpreter: dense and grouped, NVFP4 / MXFP4, sm_90a and sm_100a.

Its K order and rounding are the portable kernel's (module docstring of _decode_mma_ir), so
dense float32 outputs are compared with the portable kernel bit for bit, on K tails (K not a
multiple of the 512-element step), N tails (not a multiple of the CTA's 64 columns), 1..8
rows (one n-tile), 9..16 (two) and 17 (two passes), every E2M1 code and scale edge values;
grouped outputs bit for bit with the portable grouped kernel (D8 zero rows, D10 row scales).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    f32_error_bound,
    random_dense_case,
)
from test_matmul_decode import GROUPED, _grouped_case
from test_matmul_grouped import exact_grouped

from blockscale import layouts
from blockscale.formats import MXFP4, MXFP8, NVFP4
from blockscale.ops import matmul, matmul_decode, matmul_grouped

pytestmark = pytest.mark.interp

FP4 = (NVFP4, MXFP4)
DENSE = [(1, 40, 64), (3, 70, 544), (8, 64, 1056), (9, 33, 96), (16, 130, 2080), (17, 20, 64)]


MMA_VARIANTS = ("mma", "mma2", "mma_p", "mma_p5")


def _dense(fmt, m, n, k, seed, target="sm_90a", alpha=0.375, variant="mma"):
    rng = np.random.default_rng(seed)
    a, b, _sfa, _sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    got = matmul_decode.block_scaled_matmul_decode(a, b, sfa5, sfb5, fmt, k=k, alpha=alpha,
                                                   out_dtype="float32", device="interp",
                                                   target=target, variant=variant)
    want = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=alpha,
                                            out_dtype="float32", device="interp")
    return got, want


@pytest.mark.parametrize("variant", MMA_VARIANTS[:3])  # (mma_p5: the mma_p IR, grouped)
@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("mnk", DENSE, ids=lambda s: "x".join(map(str, s)))
def test_dense_mma_bit_identical_to_portable(fmt, mnk, variant):
    got, want = _dense(fmt, *mnk, seed=sum(mnk), variant=variant)
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_dense_mma_sm100_ir(fmt):
    """The IR is portable to sm_100a (32-lane warps, mma.sync)."""
    got, want = _dense(fmt, 5, 70, 544, seed=3, target="sm_100a")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("variant", ["mma", "mma_p"])
@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_every_code_and_scale_edges(fmt, variant):
    """Every byte value as weights and activations (all E2M1 codes, -0, the 0.5 subnormal
    of the f16 operand), smallest / largest scales."""
    rng = np.random.default_rng(21)
    m, n, k = 16, 64, 1024
    a, b, sfa, sfb, _sfa5, _sfb5 = random_dense_case(rng, fmt, m, n, k)
    codes = np.arange(256, dtype=np.uint8)
    b.view(np.uint8)[:] = np.resize(codes, b.shape)
    a.view(np.uint8)[:] = np.resize(codes[::-1], a.shape)
    if fmt is NVFP4:  # E4M3 subnormal 2^-9, max 448, zero
        edge = np.array([0x01, 0x7E, 0x00, 0x08], np.uint8)
    else:  # E8M0 2^-127 (0x00), 2^127 (0xFE) next to 2^0 blocks
        edge = np.array([0x00, 0xFE, 0x7F, 0x80], np.uint8)
    sfa.view(np.uint8)[:, :4] = edge
    sfb.view(np.uint8)[:, -4:] = edge
    sfa5, sfb5 = layouts.interleave(sfa), layouts.interleave(sfb)
    got = matmul_decode.block_scaled_matmul_decode(a, b, sfa5, sfb5, fmt, k=k,
                                                   out_dtype="float32", device="interp",
                                                   variant=variant)
    want = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, out_dtype="float32",
                                            device="interp")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32), equal_nan=False)


@pytest.mark.parametrize("variant", ["mma", "mma_p"])
def test_nan_scale_gives_nan_column(variant):
    """D5: a weight scale 0x7F (NaN) gives a NaN column, an activation one a NaN row."""
    rng = np.random.default_rng(22)
    m, n, k = 3, 70, 544
    a, b, sfa, sfb, _sfa5, _sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    sfb.view(np.uint8)[65, 20] = 0x7F
    sfa.view(np.uint8)[1, 33] = 0xFF
    got = matmul_decode.block_scaled_matmul_decode(
        a, b, layouts.interleave(sfa), layouts.interleave(sfb), NVFP4, k=k,
        out_dtype="float32", device="interp", variant=variant)
    nan = np.isnan(got)
    assert nan[:, 65].all() and nan[1].all()
    assert nan.sum() == m + n - 1


@pytest.mark.parametrize("variant", MMA_VARIANTS)
@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("case_id", range(len(GROUPED)))
def test_grouped_mma_bit_identical_to_portable(case_id, fmt, variant, monkeypatch):
    rng = np.random.default_rng(60 + case_id)
    case, row_scales, w_scales, esc, k = _grouped_case(fmt, case_id, rng)
    t = case["hidden"].shape[0]
    rows = rng.uniform(0.5, 2, t).astype(ml_dtypes.bfloat16) if fmt is NVFP4 else None
    got = matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=fmt, k=k,
                                              a_row_scales=rows, device="interp",
                                              variant=variant)
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, fmt, k, esc, rows)
    assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, fmt, k,
                                                       n_mul=2 if rows is not None else 1))
    monkeypatch.setattr(matmul_grouped, "FAST_PATHS", [])  # the portable grouped kernel
    want = matmul_grouped.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=fmt, k=k,
                                                      a_row_scales=rows, device="interp")
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    es = case["expert_start"].astype(np.int64)
    for g, e in enumerate(GROUPED[case_id][1]):
        if e < 0:
            assert not got[es[g]:es[g + 1]].view(np.uint16).any()  # D8


def test_variant_choice(monkeypatch):
    with pytest.raises(ValueError, match="variant"):
        matmul_decode.DecodeSpec("nvfp4", variant="wide")
    with pytest.raises(ValueError, match="FP4"):
        matmul_decode.DecodeSpec("mxfp8", variant="mma")
    spec = matmul_decode.DecodeSpec("nvfp4", variant="mma")
    assert spec.block == (128, 1, 1) and spec.cols == 64
    assert spec.kernel_name.endswith("_mma")
    assert matmul_decode.grid(5760, 4, spec.cols) == (90, 4, 1)
    monkeypatch.setenv(matmul_decode.VARIANT_ENV, "mma")
    assert matmul_decode.dispatch_variant(NVFP4) == "mma"
    assert matmul_decode.dispatch_variant(MXFP8) == matmul_decode.DEFAULT_MX8_VARIANT
    monkeypatch.setenv(matmul_decode.VARIANT_ENV, "bogus")
    with pytest.raises(ValueError, match=matmul_decode.VARIANT_ENV):
        matmul_decode.dispatch_variant(NVFP4)


def record_variants(monkeypatch) -> list:
    """The ``variant`` of each spec the decode op launches from now on (None: a spec
    without one, e.g. the portable kernel's), in launch order."""
    launched = []
    real = matmul_decode.H.launch

    def spy(spec, *args, **kw):
        launched.append(getattr(spec, "variant", None))
        return real(spec, *args, **kw)

    monkeypatch.setattr(matmul_decode.H, "launch", spy)
    return launched


def test_dispatch_env_runs_mma(monkeypatch):
    """BLOCKSCALE_DECODE_VARIANT=mma: the dense dispatch launches the mma variant."""
    launched = record_variants(monkeypatch)
    monkeypatch.setenv(matmul_decode.VARIANT_ENV, "mma")
    rng = np.random.default_rng(5)
    a, b, _sfa, _sfb, sfa5, sfb5 = random_dense_case(rng, NVFP4, 2, 40, 64)
    got = matmul.block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, k=64, device="interp",
                                     target="sm_90a")
    want = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, k=64, device="interp")
    assert launched[0] == "mma"  # (then the portable kernel: None)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))



@pytest.mark.parametrize("grouped_only,dense", [("mma_p5", "mma_p"), ("mma_c86", "mma_c8")])
def test_dispatch_env_grouped_only_variant_dense(grouped_only, dense, monkeypatch):
    """BLOCKSCALE_DECODE_VARIANT=mma_p5 / mma_c86 (register-capped, bundled for the grouped
    kernels only): the dense dispatch runs mma_p / mma_c8 (the same IR at 128 registers)."""
    launched = record_variants(monkeypatch)
    monkeypatch.setenv(matmul_decode.VARIANT_ENV, grouped_only)
    rng = np.random.default_rng(6)
    a, b, _sfa, _sfb, sfa5, sfb5 = random_dense_case(rng, NVFP4, 3, 70, 544)
    got = matmul.block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, k=544, device="interp",
                                     target="sm_90a")
    want = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, k=544, device="interp")
    assert launched[0] == dense
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))

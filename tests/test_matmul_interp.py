"""The portable dense block-scaled matmul kernels, run by the numpy interpreter.

Every output is checked against a float64 computation on exactly dequantized operands with
the bounds derived in test_matmul_common.py: f32 outputs within the elementwise fp32
accumulation bound (and 1e-5 normwise relative), bf16 outputs equal to the exact value rounded
to bf16 except where the fp32 bound straddles a bf16 rounding midpoint.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    assert_f32_within_bound,
    dequantize_exact,
    exact_and_abs,
    f32_error_bound,
    random_data,
    random_dense_case,
    random_scales_2d,
)

from blockscale import reference as ref
from blockscale.formats import FORMATS, MXFP4, NVFP4, Format
from blockscale.ops import matmul
from blockscale.ops import matmul_epilogue as ep

pytestmark = pytest.mark.interp

TARGETS = ("sm_90a", "sm_100a", "gfx942", "gfx950")


def _check(out: np.ndarray, a, b, sfa, sfb, fmt: Format, k: int, alpha: float,
           out_dtype: str) -> int:
    ad, bd = dequantize_exact(a, sfa, fmt, k), dequantize_exact(b, sfb, fmt, k)
    exact, abs_sum = exact_and_abs(ad, bd)
    exact, abs_sum = exact * np.float64(np.float32(alpha)), abs_sum * abs(float(np.float32(alpha)))
    bound = f32_error_bound(abs_sum, fmt, k, n_mul=1)
    if out_dtype == "float32":
        assert out.dtype == np.float32
        assert_f32_within_bound(out, exact, bound)
        return 0
    return assert_bf16_consistent(out, exact, bound)


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("mnk", [(17, 64, 256), (129, 40, 512), (1, 24, 128), (127, 16, 64)])
def test_naive_matches_exact(fmt, mnk, out_dtype):
    m, n, k = mnk
    rng = np.random.default_rng(hash((fmt.name, mnk)) % 2 ** 32)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    out = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=0.5,
                                           out_dtype=out_dtype, device="interp")
    assert out.shape == (m, n)
    flips = _check(out, a, b, sfa, sfb, fmt, k, 0.5, out_dtype)
    assert flips <= max(1, out.size // 100)  # flips need a midpoint within the tiny bound


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_every_target_ir_runs(fmt, target):
    """The IR built for each target (same body, target attribute differs) computes the same."""
    rng = np.random.default_rng(7)
    m, n, k = 17, 20, 128
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    out = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=0.225,
                                           out_dtype="float32", device="interp", target=target)
    _check(out, a, b, sfa, sfb, fmt, k, 0.225, "float32")


@pytest.mark.parametrize("fmt,k", [(NVFP4, 24), (NVFP4, 40), (MXFP4, 48), (matmul.Format.from_name(
    "mxfp8"), 40), (matmul.Format.from_name("mxfp8"), 33)])
def test_partial_last_kblock(fmt, k):
    """K not a multiple of the block (D7): the last block has fewer elements."""
    rng = np.random.default_rng(k)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, 5, 7, k)
    out = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, out_dtype="float32",
                                           device="interp")
    _check(out, a, b, sfa, sfb, fmt, k, 1.0, "float32")


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_agrees_with_reference_module(fmt):
    """bf16 output vs blockscale.reference (float64-summed, rounded once): the same bytes
    except where fp32 accumulation flips a rounding (checked through the exact bound)."""
    rng = np.random.default_rng(11)
    m, n, k = 33, 18, 256
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    out = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=0.5,
                                           device="interp")
    want = ref.naive_block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=0.5)
    diff = out.view(np.uint16) != want.view(np.uint16)
    assert diff.sum() <= max(1, out.size // 100)
    _check(out, a, b, sfa, sfb, fmt, k, 0.5, "bfloat16")


def test_fp4_products_exact_so_result_is_exact_for_one_block():
    """K = one NVFP4 block: the kernel's sum is exact, so f32 output == exact value."""
    rng = np.random.default_rng(3)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, NVFP4, 16, 16, 16)
    out = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, k=16, out_dtype="float32",
                                           device="interp")
    ad, bd = dequantize_exact(a, sfa, NVFP4, 16), dequantize_exact(b, sfb, NVFP4, 16)
    assert np.array_equal(out.astype(np.float64), ad @ bd.T)


def test_nvfp4_scale_sign_bit_ignored():
    """D3: the E4M3 scale's sign bit is ignored (|scale|)."""
    rng = np.random.default_rng(5)
    a, b, _sfa, _sfb, sfa5, sfb5 = random_dense_case(rng, NVFP4, 9, 10, 64)
    out1 = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, device="interp")
    flipped = (sfa5.view(np.uint8) ^ 0x80).view(sfa5.dtype)
    out2 = matmul.naive_block_scaled_matmul(a, b, flipped, sfb5, NVFP4, device="interp")
    assert np.array_equal(out1.view(np.uint16), out2.view(np.uint16))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_nan_scale_propagates(fmt):
    """A NaN scale byte (E8M0 0xFF, E4M3 0x7F) makes its row's outputs NaN, others finite."""
    rng = np.random.default_rng(6)
    m, n, k = 4, 5, 64
    a, b, sfa, _sfb, _, sfb5 = random_dense_case(rng, fmt, m, n, k)
    sfa = sfa.copy()
    sfa.view(np.uint8)[2, 1] = 0xFF if fmt.is_mx else 0x7F
    out = matmul.naive_block_scaled_matmul(a, b, matmul_interleave(sfa), sfb5, fmt,
                                           out_dtype="float32", device="interp")
    assert np.all(np.isnan(out[2])) and np.all(np.isfinite(np.delete(out, 2, axis=0)))


def matmul_interleave(s2d: np.ndarray) -> np.ndarray:
    from blockscale.layouts import interleave

    return interleave(s2d)


@pytest.mark.parametrize("m", [1, 17, 127, 129])
def test_mxfp4_row_major_scales(m):
    """matmul_dynamic_block_scaled_mxfp4 (AMD-style row-major E8M0 scales, K % 32 == 0)."""
    rng = np.random.default_rng(m)
    n, k = 24, 128
    a, b = random_data(rng, MXFP4, m, k), random_data(rng, MXFP4, n, k)
    sa, sb = random_scales_2d(rng, MXFP4, m, k), random_scales_2d(rng, MXFP4, n, k)
    out = matmul.matmul_dynamic_block_scaled_mxfp4(a, b, sa, sb, out_dtype="float32",
                                                   device="interp")
    _check(out, a, b, sa, sb, MXFP4, k, 1.0, "float32")
    bf = matmul.matmul_dynamic_block_scaled_mxfp4(a, b, sa, sb, device="interp")
    want = ref.matmul_dynamic_block_scaled_mxfp4(a, b, sa, sb)
    assert np.sum(bf.view(np.uint16) != want.view(np.uint16)) <= max(1, bf.size // 100)


def test_dispatch_runs_portable_kernel_and_fast_path_hook(monkeypatch):
    rng = np.random.default_rng(9)
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, NVFP4, 8, 8, 64)
    naive = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, device="interp")
    got = matmul.block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, device="interp")
    assert np.array_equal(naive.view(np.uint16), got.view(np.uint16))
    calls = []

    def fake_fast(target, fmt, m, n, k, out_dtype, epilogue):
        calls.append((target, fmt.name, m, n, k, out_dtype, epilogue))
        return lambda *args: "fast"

    monkeypatch.setattr(matmul, "FAST_PATHS", [fake_fast])
    assert matmul.block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, device="interp") == "fast"
    assert calls == [("sm_90a", "nvfp4", 8, 8, 64, "bfloat16", None)]


# ---- fused epilogue ------------------------------------------------------------------------

@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_fused_epilogue_bias_residual_relu_scales(out_dtype):
    """chain(bias, residual, relu, row_scale, col_scale) in-kernel == the same float32 ops on
    the kernel's own f32 result (bit-exact: the epilogue sees that exact value)."""
    rng = np.random.default_rng(21)
    m, n, k = 19, 23, 128
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    bias = rng.standard_normal(n).astype(np.float32) * 100
    resid = (rng.standard_normal((m, n)) * 100).astype(ml_dtypes.bfloat16)
    rows = rng.uniform(0.5, 2, m).astype(np.float32)
    cols = rng.uniform(0.5, 2, n).astype(ml_dtypes.bfloat16)
    e = ep.chain(ep.bias(), ep.residual(), ep.relu(), ep.row_scale(),
                 ep.col_scale(dtype="bfloat16"))
    got = matmul.block_scaled_matmul_with_epilogue(
        a, b, sfa5, sfb5, NVFP4, alpha=0.5, out_dtype=out_dtype, epilogue=e,
        epilogue_inputs={"bias": bias, "residual": resid, "row_scale": rows, "col_scale": cols},
        device="interp")
    base = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, alpha=0.5,
                                            out_dtype="float32", device="interp")
    want = base + bias[None, :]
    want = want + resid.astype(np.float32)
    want = np.maximum(want, np.float32(0))
    want = want * rows[:, None]
    want = (want * cols.astype(np.float32)[None, :]).astype(np.float32)
    want = want.astype(ml_dtypes.bfloat16) if out_dtype == "bfloat16" else want
    assert got.dtype == want.dtype
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_fused_epilogue_bare_callable_and_custom_cast():
    """A bare callable epilogue builds IR on the value; returning bf16 is a custom cast."""
    from mlir.dialects import arith

    from blockscale.compiler import ir as bir

    def double_then_truncate_toward_zero(x, ctx):
        # custom cast: drop the low 16 bits (round toward zero) instead of RNE
        x2 = arith.mulf(x, ctx.f32_const(2.0))
        bits = arith.bitcast(bir.i32(), x2)
        hi = arith.trunci(bir.i16(), arith.shrui(bits, bir.const(16, bir.i32())))
        return arith.bitcast(ctx.out_type, hi)

    rng = np.random.default_rng(22)
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, NVFP4, 6, 9, 64)
    got = matmul.block_scaled_matmul_with_epilogue(
        a, b, sfa5, sfb5, NVFP4, epilogue=double_then_truncate_toward_zero, device="interp")
    base = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, out_dtype="float32",
                                            device="interp")
    want = ((base * np.float32(2)).view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal(got.view(np.uint16), want)


def test_epilogue_key_is_stable_and_distinguishes():
    assert ep.bias().key == ep.bias().key
    assert ep.bias("b1").key != ep.bias("b2").key
    assert ep.clamp(0, 1).key != ep.clamp(0, 2).key
    spec1 = matmul.MatmulSpec("nvfp4", epilogue=ep.chain(ep.bias(), ep.relu()))
    spec2 = matmul.MatmulSpec("nvfp4", epilogue=ep.chain(ep.bias(), ep.relu()))
    from blockscale.ops import _core

    assert _core.kernel_key(spec1) == _core.kernel_key(spec2)
    assert _core.kernel_key(spec1) != _core.kernel_key(matmul.MatmulSpec("nvfp4"))

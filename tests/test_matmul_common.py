"""Shared checks for the block-scaled matmul tests: exact operands, error bounds, bf16 rounding.

Error model (derived here, used by every matmul test)
-----------------------------------------------------
The kernels compute, per output, with B = block size and J = ceil(K/B) K-blocks:

    p_j = sum_{k in block j} dec(a_k) * dec(b_k)          (per-block partial)
    acc = sum_j p_j * (|sA_j| * |sB_j|)                   (fp32, sequential over j)
    out = acc * alpha  [* expert_scale * row_scale]       (fp32, one rounding each)

* FP4: every E2M1 product is a multiple of 1/4 with |.| <= 36, so a block sum of at most 32
  such products is an integer multiple of 1/4 below 2^11: exact (the kernels even sum it in
  int32). |sA| * |sB| is exact (E4M3 x E4M3 has <= 8 significant bits; E8M0 x E8M0 is a power
  of two), and p_j * (|sA| |sB|) has <= 13 + 8 bits: exact. So the only roundings are the J - 1
  additions of the accumulation and the final multiplies.
* MXFP8: an E4M3 x E4M3 product has <= 8 significant bits (exact), but a 32-term block sum can
  round: up to B - 1 more roundings per block.

With u = 2^-24 and S = alpha * sum_k |dec(a_k) dec(b_k) sA sB| (the absolute-value sum), the
standard recursive-summation bound (Higham, Thm 4.4) gives

    |out - exact| <= gamma_n * S,   n = (J - 1) + (B - 1 if MXFP8 else 0) + n_mul,
    gamma_n = n u / (1 - n u) <= 1.01 n u,

where n_mul counts the final fp32 multiplies. The tests assert this bound elementwise
(``f32_error_bound``) with ``exact`` computed in float64 on exactly dequantized operands (the
float64 matmul adds at most K * 2^-53 * S, included). They also assert the normwise relative
error ``max|out - exact| / max|exact| <= 1e-5`` that the issue asks for.

bf16 outputs: the kernel rounds its fp32 value v32 (with |v32 - exact| <= E) to bf16 with RNE.
RNE is monotone, so the bf16 output lies in [bf16(exact - E), bf16(exact + E)]; where that
interval is a single value, the output must equal bf16(exact) exactly. Only outputs whose
interval straddles a bf16 rounding midpoint may differ, and then by one bf16 ulp
(``assert_bf16_consistent``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from blockscale import formats, layouts
from blockscale.formats import Format

U32 = 2.0 ** -24  # unit roundoff of float32
U64 = 2.0 ** -53


def scale_values(scales_2d: np.ndarray, fmt: Format) -> np.ndarray:
    """Decoded |scale| (D3: the E4M3 sign bit is ignored) as float64, same shape."""
    raw = scales_2d.view(np.uint8)
    if fmt.is_mx:
        return formats.decode_e8m0(raw).astype(np.float64)
    return formats.decode_e4m3(raw & 0x7F).astype(np.float64)


def element_values(data: np.ndarray, fmt: Format, k: int) -> np.ndarray:
    """Decoded elements ``[rows, k]`` as float64 (FP4 unpacked low nibble first)."""
    if fmt.is_fp4:
        return formats.decode_e2m1(formats.unpack_fp4(data.view(np.uint8)))[:, :k].astype(
            np.float64)
    return formats.decode_e4m3(data.view(np.uint8))[:, :k].astype(np.float64)


def dequantize_exact(data: np.ndarray, scales_2d: np.ndarray, fmt: Format, k: int) -> np.ndarray:
    """Exactly dequantized operand ``[rows, k]`` in float64: dec(x) * |scale| per block."""
    vals = element_values(data, fmt, k)
    s = np.repeat(scale_values(scales_2d, fmt), fmt.block_size, axis=1)[:, :k]
    return vals * s


def exact_and_abs(a_deq: np.ndarray, b_deq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(A @ B^T, |A| @ |B|^T) in float64."""
    return a_deq @ b_deq.T, np.abs(a_deq) @ np.abs(b_deq).T


def exact_dense(a: np.ndarray, b: np.ndarray, sfa: np.ndarray, sfb: np.ndarray, fmt: Format,
                k: int, alpha: float = 1.0, rows: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(alpha A @ B^T, |alpha| |A| @ |B|^T) in float64 on the exactly dequantized operands
    (2-D scales), alpha rounded to float32 as the kernels take it; only A rows ``rows`` when
    given."""
    if rows is not None:
        a, sfa = a[rows], sfa[rows]
    exact, abs_sum = exact_and_abs(dequantize_exact(a, sfa, fmt, k),
                                   dequantize_exact(b, sfb, fmt, k))
    al = float(np.float32(alpha))
    return exact * al, abs_sum * abs(al)


def roundings(fmt: Format, k: int, n_mul: int) -> int:
    """n of the docstring: the number of fp32 roundings on the path of one output."""
    j = fmt.kblocks(k)
    return max(j - 1, 0) + (0 if fmt.is_fp4 else fmt.block_size - 1) + n_mul


def f32_error_bound(abs_sum: np.ndarray, fmt: Format, k: int, n_mul: int) -> np.ndarray:
    """Elementwise bound on |fp32 result - exact| (see the module docstring)."""
    n = roundings(fmt, k, n_mul)
    return 1.01 * n * U32 * abs_sum + (k + 1) * U64 * abs_sum + 1e-300


def assert_f32_within_bound(out: np.ndarray, exact: np.ndarray, bound: np.ndarray,
                            rel: float = 1e-5) -> None:
    """out (float32) within the elementwise bound, and within ``rel`` normwise."""
    out = np.asarray(out, dtype=np.float64)
    err = np.abs(out - exact)
    bad = err > bound
    assert not bad.any(), (f"{bad.sum()} outputs exceed the fp32 bound; first at "
                           f"{np.argwhere(bad)[0]}: out={out[bad][0]!r} exact={exact[bad][0]!r} "
                           f"bound={bound[bad][0]!r}")
    scale = np.max(np.abs(exact)) if exact.size else 0.0
    if scale > 0:
        assert err.max() <= rel * scale, f"normwise relative error {err.max() / scale:.3g} > {rel}"


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float64 -> bf16 value (as float64) with a single RNE rounding (normal range).

    Done in float64 (frexp/rint/ldexp are exact) so there is no double rounding through f32.
    """
    x = np.asarray(x, dtype=np.float64)
    m, e = np.frexp(x)  # x = m * 2^e, 0.5 <= |m| < 1: 8 significant bits = m * 2^8
    return np.ldexp(np.rint(m * 256.0), e - 8)


def assert_bf16_consistent(out: np.ndarray, exact: np.ndarray, bound: np.ndarray) -> int:
    """bf16 ``out`` equals bf16(exact) except where [exact - bound, exact + bound] straddles a
    rounding midpoint; there it must be one of the two candidates. Returns the flip count."""
    assert out.dtype == ml_dtypes.bfloat16, out.dtype
    got = out.astype(np.float64)
    want = round_bf16(exact)
    lo, hi = round_bf16(exact - bound), round_bf16(exact + bound)
    outside = (got < lo) | (got > hi)
    assert not outside.any(), (f"{outside.sum()} bf16 outputs outside [bf16(x-E), bf16(x+E)]; "
                               f"first at {np.argwhere(outside)[0]}: got={got[outside][0]!r} "
                               f"exact={exact[outside][0]!r}")
    certain = lo == hi
    assert np.array_equal(got[certain], want[certain])
    return int(np.sum(got != want))


# ---- random operands --------------------------------------------------------------------------

def random_data(rng: np.random.Generator, fmt: Format, rows: int, k: int) -> np.ndarray:
    """Random payload bytes: any E2M1 pair for FP4; finite E4M3 (no NaN) for MXFP8."""
    if fmt.is_fp4:
        return rng.integers(0, 256, size=(rows, k // 2), dtype=np.uint8)
    b = rng.integers(0, 256, size=(rows, k), dtype=np.uint8)
    b[(b & 0x7F) == 0x7F] = 0x3C  # replace NaN codes by 1.5
    return b.view(ml_dtypes.float8_e4m3fn)


def random_scales_2d(rng: np.random.Generator, fmt: Format, rows: int, k: int) -> np.ndarray:
    """Random block scales ``[rows, kblocks]`` near 1 so products stay normal.

    NVFP4: E4M3 bytes 0x28..0x44 (0.25..3.0) with random sign bits (D3 ignores them).
    MX: E8M0 bytes 124..130 (2^-3..2^3).
    """
    j = fmt.kblocks(k)
    if fmt.is_mx:
        return rng.integers(124, 131, size=(rows, j), dtype=np.uint8).view(
            ml_dtypes.float8_e8m0fnu)
    b = rng.integers(0x28, 0x45, size=(rows, j), dtype=np.uint8)
    b |= (rng.integers(0, 2, size=b.shape, dtype=np.uint8) << 7)
    return b.view(ml_dtypes.float8_e4m3fn)


def random_dense_case(rng: np.random.Generator, fmt: Format, m: int, n: int, k: int):
    """(a, b, sfa_2d, sfb_2d, sfa_5d, sfb_5d) for a dense matmul."""
    a = random_data(rng, fmt, m, k)
    b = random_data(rng, fmt, n, k)
    sfa = random_scales_2d(rng, fmt, m, k)
    sfb = random_scales_2d(rng, fmt, n, k)
    return a, b, sfa, sfb, layouts.interleave(sfa), layouts.interleave(sfb)


# ---- self-tests of the helpers -----------------------------------------------------------------

def test_round_bf16_matches_ml_dtypes_on_float32_values():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(10000).astype(np.float32) * 100
    # for float32 inputs, ml_dtypes' float32 -> bf16 cast is a single RNE rounding
    assert np.array_equal(round_bf16(x.astype(np.float64)),
                          x.astype(ml_dtypes.bfloat16).astype(np.float64))
    # ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7
    assert round_bf16(np.float64(1 + 2 ** -8)) == 1.0
    assert round_bf16(np.float64(1 + 3 * 2 ** -8)) == 1 + 2 ** -6


def test_fp4_products_and_block_sums_are_exact_in_float32():
    vals = formats.E2M1_VALUES.astype(np.float64)
    prods = np.outer(vals, vals).ravel()
    assert np.all(np.abs(prods * 4 - np.rint(prods * 4)) == 0)  # multiples of 1/4
    assert np.max(np.abs(prods)) * 32 < 2 ** 11  # block sum fits: exact in fp32 and int32

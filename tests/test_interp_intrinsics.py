"""Interpreter: the modeled target intrinsics against their ISA definitions.

The references here are written independently of blockscale.formats (nearest-value search
with ties to the even code; exact exponent arithmetic on Python floats), and are checked
exhaustively where the input space is small (every E2M1 tie point and its neighbours, every
E8M0 exponent, every E2M1 byte).
"""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("mlir")

from blockscale.runtime.interpreter import intrinsics, run_kernel

pytestmark = pytest.mark.interp

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_rne(x: float) -> int:
    """cvt.rn.satfinite.e2m1: nearest E2M1 value, ties to the even code, |x| > 6 -> 6."""
    if math.isnan(x):
        return 0x7
    sign = 8 if math.copysign(1.0, x) < 0 else 0
    a = min(abs(x), 6.0)
    d = [abs(a - v) for v in E2M1]
    best = min(d)
    cands = [i for i, di in enumerate(d) if di == best]
    code = cands[0] if len(cands) == 1 else next(i for i in cands if i % 2 == 0)
    return code | sign


def _tie_grid() -> np.ndarray:
    """Every E2M1 value and midpoint, their float32 neighbours, both signs, and specials."""
    pts = E2M1 + [(a + b) / 2 for a, b in itertools.pairwise(E2M1)] + [7.0, 1e30, 2.0**-130]
    x = np.array(pts, np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)),
                        np.nextafter(x, np.float32(-np.inf))])
    x = np.concatenate([x, -x, np.array([np.inf, -np.inf], np.float32)])
    return x


def test_e2m1x2_exhaustive_on_tie_grid_and_nibble_order():
    x = _tie_grid()
    a, b = np.meshgrid(x, x, indexing="ij")
    a, b = a.reshape(-1), b.reshape(-1)
    got = intrinsics.cvt_f32x2_to_e2m1x2(a, b).view(np.uint8)
    ref = np.array([e2m1_rne(float(v)) for v in x], np.uint8)
    want = (np.repeat(ref, x.size) << 4) | np.tile(ref, x.size)  # a -> upper nibble
    np.testing.assert_array_equal(got, want)


def test_e2m1x2_relu():
    got = intrinsics.cvt_f32x2_to_e2m1x2(np.float32([-3.0, 2.6]), np.float32([-0.0, -7]),
                                         relu=True).view(np.uint8)
    np.testing.assert_array_equal(got, [0x00, 0x50])


def ue8m0_ref(x: float, rnd: str, satfinite: bool) -> int:
    """cvt.{rp,rz}{.satfinite}.ue8m0.f32 on |x| with exact Python float arithmetic."""
    if math.isnan(x):
        return 0xFF
    x = abs(x)
    if math.isinf(x):
        return 0xFE if satfinite else 0xFF
    if x == 0:
        return 0
    m, e = math.frexp(x)  # x = m * 2^e, 0.5 <= m < 1: floor(log2 x) = e - 1
    exp = (e - 1) if (rnd == "rz" or m == 0.5) else e
    biased = exp + 127
    if biased > 254:
        return 0xFE if satfinite else 0xFF
    return max(biased, 0)


def _e8m0_inputs() -> np.ndarray:
    p = np.ldexp(np.float32(1.0), np.arange(-149, 128)).astype(np.float32)  # every power of 2
    x = np.concatenate([p, np.nextafter(p, np.float32(np.inf)),
                        np.nextafter(p, np.float32(0)), p * np.float32(1.5)])
    specials = np.array([0.0, -0.0, np.inf, np.nan, 3.0e38, np.finfo(np.float32).max],
                        np.float32)
    return np.concatenate([x[np.isfinite(x)], specials])


@pytest.mark.parametrize("rnd", ["rp", "rz"])
@pytest.mark.parametrize("sat", [False, True])
def test_ue8m0_every_exponent(rnd, sat):
    x = _e8m0_inputs()
    got = intrinsics.f32_to_ue8m0(x, rnd, sat)
    want = np.array([ue8m0_ref(float(v), rnd, sat) for v in x], np.uint8)
    np.testing.assert_array_equal(got, want)
    # each of the 255 finite codes is hit, and 2^(b-127) maps to b exactly
    assert set(range(255)) <= set(got.tolist())


def test_ue8m0x2_byte_order():
    got = intrinsics.cvt_f32x2_to_ue8m0x2(np.float32([1.0]), np.float32([3.0]), "rp")
    assert int(got.view(np.uint16)[0]) == (127 << 8) | 129  # a -> upper byte


def test_e4m3x2_saturation_ties_and_order():
    a = np.float32([1.0625, 500.0, -np.inf, np.nan])
    b = np.float32([1.1875, -0.0, 2.0**-10, 1.0])
    got = intrinsics.cvt_f32x2_to_e4m3x2(a, b).view(np.uint16)
    hi, lo = got >> 8, got & 0xFF
    np.testing.assert_array_equal(hi, [0x38, 0x7E, 0xFE, 0x7F])  # tie -> even 1.0, sat 448
    np.testing.assert_array_equal(lo, [0x3A, 0x80, 0x00, 0x38])  # 2^-10 ties to 0 (even)


def _scaled_grid() -> tuple[np.ndarray, np.ndarray]:
    """(x, scale) with x = v * scale exactly in float32 for v on the tie grid and every
    E8M0 scale 2^-127 .. 2^127."""
    v = _tie_grid()
    v = v[np.isfinite(v) & (np.abs(v) < 1e20) & (np.abs(v) > 1e-30)]
    scales = np.ldexp(1.0, np.arange(-127, 128))
    vv, ss = np.meshgrid(v.astype(np.float64), scales, indexing="ij")
    x64 = vv * ss
    with np.errstate(over="ignore"):
        x = x64.astype(np.float32)
    exact = x.astype(np.float64) == x64
    return x[exact], ss[exact].astype(np.float32)


def test_scalef32_pk_fp4_f32_every_scale_exponent_and_byte_select():
    x, s = _scaled_grid()
    n = x.size - x.size % 2
    x0, x1, s = x[:n:2], x[1:n:2], s[:n:2]
    x1 = (x1.astype(np.float64) / s.astype(np.float64) * s.astype(np.float64)).astype(
        np.float32)
    old = np.full(x0.size, 0x5A5A5A5A, np.uint32).view(np.int32)
    # the quotient is exact in float64; reference rounds it with the independent e2m1_rne
    q0 = x0.astype(np.float64) / s.astype(np.float64)
    q1 = x1.astype(np.float64) / s.astype(np.float64)
    ref = np.array([e2m1_rne(a) | (e2m1_rne(b) << 4) for a, b in zip(q0, q1)], np.uint32)
    assert len(set(np.log2(s.astype(np.float64)).tolist())) == 255  # all E8M0 exponents
    for sel in range(4):
        got = intrinsics.cvt_scalef32_pk_fp4_f32(old, x0, x1, s, sel).view(np.uint32)
        keep = np.uint32(0x5A5A5A5A) & ~np.uint32(0xFF << (8 * sel))
        np.testing.assert_array_equal(got, keep | (ref << np.uint32(8 * sel)))


def test_scalef32_pk_fp4_uses_only_the_scale_exponent():
    x = np.float32([3.0, 5.0])
    a = intrinsics.cvt_scalef32_pk_fp4_f32(np.int32([0]), x[:1], x[1:], np.float32([1.75]), 0)
    b = intrinsics.cvt_scalef32_pk_fp4_f32(np.int32([0]), x[:1], x[1:], np.float32([1.0]), 0)
    assert int(a[0]) == int(b[0]) == (e2m1_rne(3.0) | e2m1_rne(5.0) << 4)


def test_scalef32_pk_f32_fp4_decodes_every_byte():
    byte = np.arange(256, dtype=np.uint32)
    for sel, scale in [(0, 1.0), (2, 2.0**-127), (3, 2.0**100)]:
        word = (byte << np.uint32(8 * sel)) | np.uint32(0x11) * (sel != 0)
        got = intrinsics.cvt_scalef32_pk_f32_fp4(word.view(np.int32),
                                                 np.float32([scale]), sel)
        vals = np.array(E2M1 + [-v for v in E2M1])
        want = np.stack([vals[byte & 0xF], vals[byte >> 4]], -1) * scale
        np.testing.assert_array_equal(got.astype(np.float64), want)


CVT_KERNEL = """
gpu.module @m {
  gpu.func @k(%x: memref<?xf32>, %o8: memref<?xi8>, %o16: memref<?xi16>, %o32: memref<?xi32>,
              %bf: memref<?xbf16>) kernel {
    %tid = gpu.thread_id x
    %c2 = arith.constant 2 : index
    %j = arith.muli %tid, %c2 : index
    %c1 = arith.constant 1 : index
    %j1 = arith.addi %j, %c1 : index
    %a = memref.load %x[%j] : memref<?xf32>
    %b = memref.load %x[%j1] : memref<?xf32>
    %p = nvvm.convert.f32x2.to.f4x2 %a, %b : i8 (f4E2M1FN)
    memref.store %p, %o8[%tid] : memref<?xi8>
    %absa = math.absf %a : f32
    %absb = math.absf %b : f32
    %e = nvvm.convert.f32x2.to.f8x2 %absa, %absb {rnd = #nvvm.fp_rnd_mode<rp>} : i16 (f8E8M0FNU)
    memref.store %e, %o16[%tid] : memref<?xi16>
    %old = arith.constant 0x11223344 : i32
    %one = arith.constant 0.5 : f32
    %w = rocdl.cvt.scalef32.pk.fp4.f32 %a, %b, %one -> %old[1] : i32
    %ab = vector.from_elements %a, %b : vector<2xf32>
    %abf = arith.truncf %ab : vector<2xf32> to vector<2xbf16>
    %w2 = rocdl.cvt.scalef32.pk.fp4.bf16 %abf, %one -> %w[3] : i32
    memref.store %w2, %o32[%tid] : memref<?xi32>
    %d = rocdl.cvt.scalef32.pk.f32.fp4 %w2[1], %one : vector<2xf32>
    %d0 = vector.extract %d[0] : f32 from vector<2xf32>
    %d0b = arith.truncf %d0 : f32 to bf16
    memref.store %d0b, %bf[%tid] : memref<?xbf16>
    gpu.return
  }
}"""


@pytest.mark.parametrize("target", ["sm_100a", "gfx950"])
def test_intrinsic_ops_through_run_kernel(target):
    x = _tie_grid()
    x = x[np.isfinite(x)][:64]
    n = x.size // 2
    o8, o16 = np.zeros(n, np.uint8), np.zeros(n, np.uint16)
    o32, bf = np.zeros(n, np.uint32), np.zeros(n, ml_dtypes.bfloat16)
    run_kernel(CVT_KERNEL, "k", (1, 1, 1), (n, 1, 1), [x, o8, o16, o32, bf], target)
    a, b = x[0::2], x[1::2]
    np.testing.assert_array_equal(o8, [e2m1_rne(p) << 4 | e2m1_rne(q) for p, q in zip(a, b)])
    np.testing.assert_array_equal(o16, [ue8m0_ref(p, "rp", False) << 8 | ue8m0_ref(q, "rp", False)
                                        for p, q in zip(a, b)])
    lo = np.array([e2m1_rne(2 * p) | e2m1_rne(2 * q) << 4 for p, q in zip(a, b)], np.uint32)
    ab = np.stack([a, b], 1).astype(ml_dtypes.bfloat16).astype(np.float64)
    hi = np.array([e2m1_rne(2 * p) | e2m1_rne(2 * q) << 4 for p, q in ab], np.uint32)
    np.testing.assert_array_equal(o32, (hi << 24) | np.uint32(0x22 << 16) | (lo << 8) | 0x44)
    vals = np.array(E2M1 + [-v for v in E2M1])
    np.testing.assert_array_equal(bf.astype(np.float64), vals[lo & 0xF] * 0.5)

"""Formats and scalar codecs: exhaustive over every code/byte, tie cases for every rounding."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import blockscale as bs
from blockscale import formats as F

RNG = np.random.default_rng(1234)


# ---- independent oracles (tables + nearest search, ties to the even code/byte) ----

def _e2m1_oracle(x: np.ndarray) -> np.ndarray:
    vals = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)
    out = []
    for v in x.astype(np.float64):
        a = min(abs(v), 6.0)
        d = np.abs(vals - a)
        best = np.flatnonzero(d == d.min())
        code = int(best[0] if len(best) == 1 else next(c for c in best if c % 2 == 0))
        out.append(code | (8 if math.copysign(1, v) < 0 else 0))
    return np.array(out, dtype=np.uint8)


def _e4m3_value(b: int) -> float:
    s, e, m = b >> 7, (b >> 3) & 0xF, b & 7
    if e == 15 and m == 7:
        return math.nan
    v = (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if s else v


_E4M3_POS = np.array([_e4m3_value(b) for b in range(0x7F)])  # bytes 0..0x7E, ascending


def _e4m3_oracle(x: np.ndarray) -> np.ndarray:
    out = []
    for v in x.astype(np.float64):
        if math.isnan(v):
            out.append(0x7F)
            continue
        a = min(abs(v), 448.0)
        d = np.abs(_E4M3_POS - a)
        best = np.flatnonzero(d == d.min())
        b = int(best[0] if len(best) == 1 else next(c for c in best if c % 2 == 0))
        out.append(b | (0x80 if math.copysign(1, v) < 0 else 0))
    return np.array(out, dtype=np.uint8)


def _e8m0_up_oracle(x: np.ndarray) -> np.ndarray:
    out = []
    for v in x.astype(np.float64):
        if not math.isfinite(v):
            out.append(0xFF)
        elif v == 0:
            out.append(0)
        else:
            out.append(int(min(max(math.ceil(math.log2(v)) + 127, 0), 254)))
    return np.array(out, dtype=np.uint8)


# ---- Format ----

def test_format_fields_and_lookup():
    assert bs.Format.from_name("NvFp4") is bs.NVFP4 and bs.Format.from_name("mxfp8") is bs.MXFP8
    assert (bs.NVFP4.block_size, bs.MXFP4.block_size, bs.MXFP8.block_size) == (16, 32, 32)
    assert bs.NVFP4.elem_dtype == np.uint8 and bs.MXFP8.elem_dtype == ml_dtypes.float8_e4m3fn
    assert bs.NVFP4.scale_dtype == ml_dtypes.float8_e4m3fn
    assert bs.MXFP4.scale_dtype == ml_dtypes.float8_e8m0fnu
    assert (bs.MXFP4.elem_max, bs.MXFP8.elem_max) == (6.0, 448.0)
    assert bs.NVFP4.is_fp4 and bs.MXFP4.is_fp4 and not bs.MXFP8.is_fp4
    assert bs.MXFP4.default_scale_rounding == "up" and bs.NVFP4.default_scale_rounding is None
    assert bs.NVFP4.kblocks(136) == 9 and bs.MXFP4.data_cols(64) == 32
    with pytest.raises(ValueError, match="unknown format 'fp4'"):
        bs.Format.from_name("fp4")
    with pytest.raises(TypeError, match="str"):
        bs.Format.from_name(4)  # type: ignore[arg-type]


def test_scale_rounding_validation():
    assert bs.MXFP8.resolve_scale_rounding(None) == "up"
    assert bs.MXFP4.resolve_scale_rounding("floor") == "floor"
    with pytest.raises(ValueError, match="scale_rounding must be one of"):
        bs.MXFP4.resolve_scale_rounding("nearest")
    with pytest.raises(ValueError, match="must be None for nvfp4"):
        bs.NVFP4.resolve_scale_rounding("up")
    with pytest.raises(ValueError, match="must be even for nvfp4"):
        bs.NVFP4.check_k(15)


# ---- E2M1 ----

def test_e2m1_all_codes_decode_and_round_trip():
    codes = np.arange(16, dtype=np.uint8)
    vals = F.decode_e2m1(codes)
    assert vals.tolist() == [0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6]
    assert np.signbit(vals[8])  # code 8 is -0
    assert F.encode_e2m1(vals).view(np.uint8).tolist() == codes.tolist()


def test_e2m1_ties_go_to_even_code():
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)
    # 0.25: 0|0.5 -> 0 (code 0); 0.75: 0.5|1 -> 1.0 (code 2); 1.25: 1|1.5 -> 1.0 (code 2);
    # 1.75: 1.5|2 -> 2.0 (code 4); 2.5: 2|3 -> 2.0 (code 4); 3.5: 3|4 -> 4.0 (code 6);
    # 5.0: 4|6 -> 4.0 (code 6). Half-away-from-zero would give 1, 3, 3, 4, 5, 6, 7.
    assert F.encode_e2m1(ties).tolist() == [0, 2, 2, 4, 4, 6, 6]
    assert F.encode_e2m1(-ties).tolist() == [8, 10, 10, 12, 12, 14, 14]
    up = np.nextafter(ties, np.float32(10))  # just above a tie: the upper neighbour
    assert F.encode_e2m1(up).tolist() == [1, 2, 3, 4, 5, 6, 7]
    down = np.nextafter(ties, np.float32(0))  # just below: the lower neighbour
    assert F.encode_e2m1(down).tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_e2m1_saturation_sign_and_nan():
    x = np.array([6.0, 6.5, 1e30, np.inf, -7.0, -np.inf, -0.0, -1e-30, 1e-30, np.nan],
                 dtype=np.float32)
    assert F.encode_e2m1(x).tolist() == [7, 7, 7, 7, 15, 15, 8, 8, 0, 7]


def test_e2m1_matches_oracle_on_random_and_grid_values():
    grid = np.arange(-8 * 64, 8 * 64 + 1, dtype=np.float32) / 64  # all ties lie on this grid
    rnd = (RNG.standard_normal(3000) * 3).astype(np.float32)
    x = np.concatenate([grid, rnd])
    assert np.array_equal(F.encode_e2m1(x), _e2m1_oracle(x))


def test_pack_unpack_nibble_order():
    codes = np.array([[1, 2, 3, 4]], dtype=np.uint8)
    assert F.pack_fp4(codes).tolist() == [[0x21, 0x43]]  # element 2j -> low nibble
    allbytes = np.arange(256, dtype=np.uint8).reshape(4, 64)
    assert np.array_equal(F.pack_fp4(F.unpack_fp4(allbytes)), allbytes)
    with pytest.raises(ValueError, match="even last dimension"):
        F.pack_fp4(np.zeros((2, 3), np.uint8))


# ---- E4M3 ----

def test_e4m3_all_bytes_decode():
    b = np.arange(256, dtype=np.uint8)
    got = F.decode_e4m3(b)
    want = np.array([_e4m3_value(int(i)) for i in b], dtype=np.float32)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.isnan(got[[0x7F, 0xFF]]).all() and got[0x7E] == 448 and got[1] == 2.0 ** -9


def test_e4m3_encode_exact_values_round_trip():
    b = np.array([i for i in range(256) if i not in (0x7F, 0xFF)], dtype=np.uint8)
    assert np.array_equal(F.encode_e4m3(F.decode_e4m3(b)), b)


def test_e4m3_ties_to_even_mantissa():
    # Midpoints between consecutive positive values (incl. subnormals 0 | 2^-9 and the
    # normal/subnormal boundary): RNE picks the even byte (even mantissa).
    lo, hi = _E4M3_POS[:-1], _E4M3_POS[1:]
    mids = ((lo + hi) / 2).astype(np.float32)
    assert np.array_equal(mids.astype(np.float64), (lo + hi) / 2)  # exact in float32
    want = np.where(np.arange(126) % 2 == 0, np.arange(126), np.arange(1, 127)).astype(np.uint8)
    assert np.array_equal(F.encode_e4m3(mids), want)
    assert np.array_equal(F.encode_e4m3(-mids), want | 0x80)


def test_e4m3_saturation_nan_and_oracle():
    x = np.array([448, 464, 480, 1e30, np.inf, -np.inf, -500, np.nan, -np.nan, -0.0, 2.0 ** -10],
                 dtype=np.float32)
    # ml_dtypes alone gives NaN for 464 and above: saturation is ours.
    assert x[:4].astype(ml_dtypes.float8_e4m3fn).view(np.uint8).tolist()[1:] != [0x7E] * 3
    assert F.encode_e4m3(x).tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE, 0x7F, 0x7F,
                                         0x80, 0x00]  # 2^-10 ties 0|2^-9 -> 0
    rnd = np.concatenate([(RNG.standard_normal(2000) * 100).astype(np.float32),
                          (RNG.standard_normal(500) * 0.01).astype(np.float32)])
    assert np.array_equal(F.encode_e4m3(rnd), _e4m3_oracle(rnd))


# ---- E8M0 ----

def test_e8m0_all_bytes_decode():
    b = np.arange(256, dtype=np.uint8)
    got = F.decode_e8m0(b)
    want = np.array([2.0 ** (i - 127) for i in range(255)] + [math.nan], dtype=np.float32)
    assert np.array_equal(got, want, equal_nan=True)
    assert got[0] == np.float32(2.0 ** -127) and got[0] > 0  # 0x00 is 2^-127, not zero
    # ml_dtypes agrees on decoding
    ml = b.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert np.array_equal(got, ml, equal_nan=True)


def test_e8m0_up_powers_and_just_above():
    b = np.arange(255, dtype=np.uint8)
    p = F.decode_e8m0(b)
    assert np.array_equal(F.encode_e8m0_up(p), b)  # exact powers stay
    above = np.nextafter(p[:-1], np.float32(np.inf))  # one ulp above 2^e -> 2^(e+1)
    assert np.array_equal(F.encode_e8m0_up(above), b[1:])
    # ml_dtypes rounds to nearest, which is why we do not use it here: 1.4 -> 1 vs up -> 2
    assert np.float32(1.4).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8) == 127
    assert F.encode_e8m0_up(np.float32(1.4)) == 128


def test_e8m0_up_specials_and_oracle():
    x = np.array([0.0, np.nan, np.inf, 2.0 ** -127, 2.0 ** -130, 1.5 * 2.0 ** -127,
                  2.0 ** 127, 3e38], dtype=np.float32)
    # 2^-130 <= 2^-127 -> 0x00; 1.5*2^-127 (a subnormal) -> 2^-126 (0x01); 3e38 clamps to 0xFE
    assert F.encode_e8m0_up(x).tolist() == [0, 0xFF, 0xFF, 0, 0, 1, 254, 254]
    rnd = np.abs(RNG.standard_normal(2000).astype(np.float32) * 10.0 ** RNG.integers(-40, 38, 2000)
                 ).astype(np.float32)
    assert np.array_equal(F.encode_e8m0_up(rnd), _e8m0_up_oracle(rnd))
    with pytest.raises(ValueError, match="non-negative"):
        F.encode_e8m0_up(np.float32(-1))


def test_e8m0_scale_up_mode():
    a = np.array([1.0, 1.6, 6.0, 0.0, np.nan, np.inf], dtype=np.float32)
    # s = amax * f32(1/6): 1/6 -> 2^-2 (0x7D); 1.6/6 -> 2^-1 (0x7E); 6*f32(1/6) -> oracle
    s6 = np.float32(6.0) * F.RECIP_E2M1_MAX
    want6 = _e8m0_up_oracle(np.array([s6]))[0]
    assert F.e8m0_scale_from_amax(a, bs.MXFP4, "up").tolist() == [0x7D, 0x7E, want6, 0, 255, 255]
    # MXFP8: amax 1 -> 2^ceil(log2(1/448)) = 2^-8 (0x77); amax 448 -> 2^0 (0x7F)
    assert F.e8m0_scale_from_amax(np.float32([1.0, 448.0]), bs.MXFP8).tolist() == [0x77, 0x7F]


def test_e8m0_scale_even_mode():
    # MAX's AMD test values (SEMANTICS §2.4).
    a = np.array([1.0, 3.0, 6.0, 24.0, 1.6, 0.0], dtype=np.float32)
    assert F.e8m0_scale_from_amax(a, bs.MXFP4, "even").tolist() == [125, 126, 127, 129, 125, 0]
    # Tie: 1.75 is exactly halfway between 1.5 and 2.0 on a one-mantissa-bit grid -> half-up to
    # 2.0 (126); one ulp below stays 1.5 (125). 1.5 itself needs no rounding (125).
    t = np.array([1.75, np.nextafter(np.float32(1.75), np.float32(0)), 1.5], dtype=np.float32)
    assert F.e8m0_scale_from_amax(t, bs.MXFP4, "even").tolist() == [126, 125, 125]
    # MXFP8 subtracts emax 8: amax 448 -> rounds to 512 = 2^9 -> 127 + 9 - 8 = 128
    assert F.e8m0_scale_from_amax(np.float32(448), bs.MXFP8, "even") == 128


def test_e8m0_scale_floor_mode():
    # floor(log2 amax) - emax: 2^k boundaries are exact; just below drops one.
    a = np.array([1.0, np.nextafter(np.float32(2), np.float32(0)), 2.0, 6.0, 2.0 ** -140,
                  np.nan], dtype=np.float32)
    # 2^-140 (subnormal): floor(log2) = -140 -> 127 - 140 - 2 < 0 -> clamps to 0
    assert F.e8m0_scale_from_amax(a, bs.MXFP4, "floor").tolist() == [125, 125, 126, 127, 0, 255]
    assert F.e8m0_scale_from_amax(np.float32(448), bs.MXFP8, "floor") == 127
    with pytest.raises(ValueError, match="MX format"):
        F.e8m0_scale_from_amax(np.float32(1), bs.NVFP4)


def test_nvfp4_scale_from_amax():
    # 1.0 * f32(1/6) -> e4m3 0.171875 (0x23); 3.75/6 = 0.625 exactly (0x32); inf -> NaN 0x7F
    got = F.nvfp4_scale_from_amax(np.float32([1.0, 3.75, np.inf, 0.0]))
    assert got.tolist() == [0x23, 0x32, 0x7F, 0x00]
    # tensor_sf multiplies before the cast: 0.43 * (1/6) rounds per the oracle
    s = np.float32(0.43) * (np.float32(1.0) * F.RECIP_E2M1_MAX)
    assert F.nvfp4_scale_from_amax(np.float32(1.0), 0.43) == _e4m3_oracle(np.array([s]))[0]

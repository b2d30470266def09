"""Reference dense quantize/dequantize: worked examples, edge blocks, a scalar model of D2."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import blockscale as bs
from blockscale import formats as F
from blockscale import reference as ref
from blockscale.layouts import interleave

BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(99)


def _q(x, fmt, **kw):
    d, s = ref.quantize_dynamic_block_scaled(np.asarray(x, dtype=BF16).reshape(1, -1), fmt,
                                             scale_layout=bs.ROW_MAJOR, **kw)
    return d.view(np.uint8)[0], s.view(np.uint8)[0]


def _scalar_model(x: np.ndarray, fmt: bs.Format, tsf: float, rounding) -> tuple[list, list]:
    """The D2 chain one block and one element at a time with float32 scalars (no vectors)."""
    one, tsf32 = np.float32(1), np.float32(tsf)
    codes, scales = [], []
    for row in x.astype(np.float32):
        rc, rs = [], []
        for b0 in range(0, len(row), fmt.block_size):
            blk = row[b0:b0 + fmt.block_size]
            if not all(np.isfinite(v) for v in blk):
                rs.append(0xFF if fmt.is_mx else 0x7F)
                rc += [0] * len(blk)
                continue
            amax = max(abs(v) for v in blk)
            if fmt.is_mx:
                sb = int(F.e8m0_scale_from_amax(amax, fmt, rounding))
                recip = one / F.decode_e8m0(sb)[()]
            else:
                sb = int(F.encode_e4m3(tsf32 * (amax * F.RECIP_E2M1_MAX)))
                sd = F.decode_e4m3(sb)[()]
                recip = np.float32(0) if sd == 0 else one / (sd * (one / tsf32))
            rs.append(sb)
            enc = F.encode_e2m1 if fmt.is_fp4 else F.encode_e4m3
            rc += [int(enc(np.float32(v * recip))) for v in blk]
        codes.append(rc)
        scales.append(rs)
    return codes, scales


def test_nvfp4_worked_examples():
    # sixteen 1.0: s = 1*f32(1/6) -> e4m3 0.171875 (0x23); recip 5.818 -> every q = 6 (code 7)
    d, s = _q(np.ones(16), bs.NVFP4)
    assert s.tolist() == [0x23] and d.tolist() == [0x77] * 8
    # i*0.25: amax 3.75, s = 0.625 (0x32), recip 1.6
    d, s = _q(np.arange(16) * 0.25, bs.NVFP4)
    assert s.tolist() == [0x32]
    assert d.tolist() == [0x10, 0x22, 0x43, 0x54, 0x65, 0x66, 0x76, 0x77]
    deq = ref.dequantize_block_scaled(d[None], s.view(ml_dtypes.float8_e4m3fn)[None], bs.NVFP4,
                                      k=16, scale_layout="row_major")
    assert deq[0, 15] == np.float32(6 * 0.625)


def test_mx_worked_examples():
    assert _q(np.ones(32), bs.MXFP4)[1].tolist() == [0x7D]  # e8m0_up(1/6) = 2^-2
    assert _q(np.full(32, 1.6), bs.MXFP4)[1].tolist() == [0x7E]  # up: 2^-1
    assert _q(np.full(32, 1.6), bs.MXFP4, scale_rounding="even")[1].tolist() == [125]
    assert _q(np.ones(32), bs.MXFP8)[1].tolist() == [0x77]  # 2^ceil(log2(1/448)) = 2^-8
    d, s = _q(np.full(32, 448.0), bs.MXFP8)
    assert s.tolist() == [0x7F] and d.tolist() == [0x7E] * 32


def test_amd_even_mode_examples():
    rows = np.zeros((6, 32), np.float32)
    for i, a in enumerate([1.0, 3.0, 6.0, 24.0]):
        rows[i, 0] = a
    rows[4, :3] = [1.6, 0.4, -1.6]
    d, s = ref.quantize_mxfp4_amd(rows.astype(BF16))
    assert s.view(np.uint8)[:, 0].tolist() == [125, 126, 127, 129, 125, 0]
    deq = ref.dequantize_block_scaled(d, s, bs.MXFP4, k=32, scale_layout=bs.ROW_MAJOR)
    assert deq[4, :3].tolist() == [1.5, 0.375, -1.5]  # bf16(1.6)/0.25 = 6.4 -> 6 * 0.25
    assert not d[5].any()
    with pytest.raises(ValueError, match="multiple of 32"):
        ref.quantize_mxfp4_amd(np.zeros((1, 48), BF16))


@pytest.mark.parametrize("fmt,tsf,rounding,k", [
    (bs.NVFP4, 1.0, None, 72), (bs.NVFP4, 0.43, None, 40), (bs.NVFP4, 768.0, None, 48),
    (bs.MXFP4, 1.0, "up", 80), (bs.MXFP4, 1.0, "even", 64), (bs.MXFP4, 1.0, "floor", 34),
    (bs.MXFP8, 1.0, "up", 70), (bs.MXFP8, 1.0, "even", 32), (bs.MXFP8, 1.0, "floor", 64),
])
def test_matches_scalar_model(fmt, tsf, rounding, k):
    x = (RNG.standard_normal((5, k)) * RNG.choice([1e-3, 1, 30], (5, 1))).astype(BF16)
    x[0, :8] = [0, -0.0, 1e-30, -1e-30, 0.25, -0.75, 2.5, 5.0]  # signed zeros and E2M1 ties
    x[1, 3] = np.nan
    x[2, -1] = -np.inf
    x[3, :] = 0
    d, s = ref.quantize_dynamic_block_scaled(x, fmt, tensor_sf=tsf, scale_rounding=rounding,
                                             scale_layout="row_major")
    codes, scales = _scalar_model(x, fmt, tsf, rounding)
    codes = np.array(codes, np.uint8)
    want_data = F.pack_fp4(codes) if fmt.is_fp4 else codes
    assert np.array_equal(d.view(np.uint8), want_data)
    assert np.array_equal(s.view(np.uint8), np.array(scales, np.uint8))
    d5, s5 = ref.quantize_dynamic_block_scaled(x, fmt, tensor_sf=tsf, scale_rounding=rounding)
    assert np.array_equal(d5.view(np.uint8), d.view(np.uint8))
    assert np.array_equal(s5.view(np.uint8), interleave(s).view(np.uint8))


def test_output_shapes_and_dtypes():
    x = np.zeros((129, 192), BF16)
    d, s = ref.quantize_dynamic_block_scaled(x, bs.NVFP4)
    assert d.shape == (129, 96) and d.dtype == np.uint8 and s.shape == (2, 3, 32, 4, 4)
    assert s.dtype == ml_dtypes.float8_e4m3fn
    d, s = ref.quantize_dynamic_block_scaled(x, "mxfp8")
    assert d.shape == (129, 192) and d.dtype == ml_dtypes.float8_e4m3fn and s.shape == (2, 2, 32, 4, 4)
    assert s.dtype == ml_dtypes.float8_e8m0fnu
    d, s = ref.quantize_dynamic_block_scaled(np.zeros((0, 128), BF16), bs.MXFP4)
    assert d.shape == (0, 64) and s.shape == (0, 1, 32, 4, 4)


def test_near_zero_blocks_are_finite():
    # MAX near-zero test: every 16-block is [0, 1e-38 x 15]; with tsf 0.43 the e4m3 scale
    # underflows to 0 and D1 must give zeros, not 0*inf = NaN.
    for tsf in (1.0, 0.43):
        x = np.tile(np.array([0] + [1e-38] * 15, np.float32), (129, 184)).astype(BF16)
        d, s = ref.quantize_dynamic_block_scaled(x, bs.NVFP4, tensor_sf=tsf)
        deq = ref.dequantize_block_scaled(d, s, bs.NVFP4, k=x.shape[1], tensor_sf=tsf)
        assert np.isfinite(deq).all() and np.isfinite(F.decode_e4m3(s.view(np.uint8))).all()
    assert not s.view(np.uint8).any() and not d.any()  # scale 0 (underflow) and codes 0


def test_nonfinite_blocks():
    x = np.ones((2, 64), np.float32)
    x[0, 5] = np.nan
    x[1, 40] = np.inf
    for fmt in (bs.NVFP4, bs.MXFP4, bs.MXFP8):
        d, s = ref.quantize_dynamic_block_scaled(x.astype(BF16), fmt, scale_layout="row_major")
        nan_byte = 0xFF if fmt.is_mx else 0x7F
        s8 = s.view(np.uint8)
        bad0, bad1 = 5 // fmt.block_size, 40 // fmt.block_size
        assert s8[0, bad0] == nan_byte and s8[1, bad1] == nan_byte
        assert (np.delete(s8[0], bad0) != nan_byte).all()
        deq = ref.dequantize_block_scaled(d, s, fmt, k=64, scale_layout="row_major")
        bs_ = fmt.block_size
        assert np.isnan(deq[0, bad0 * bs_:(bad0 + 1) * bs_]).all()
        assert np.isfinite(np.delete(deq[0], np.arange(bad0 * bs_, (bad0 + 1) * bs_))).all()
        codes = F.unpack_fp4(d) if fmt.is_fp4 else d.view(np.uint8)
        assert not codes[0, bad0 * bs_:(bad0 + 1) * bs_].any()  # all codes 0 (D5)


def test_signed_zero_blocks():
    # An all-(-0) block: amax 0 -> scale 0x00, recip 0, every element -0 -> E2M1 0x8 (D1, D6)
    d, s = _q(np.full(16, -0.0), bs.NVFP4)
    assert s.tolist() == [0] and d.tolist() == [0x88] * 8
    d, s = _q(np.full(32, -0.0), bs.MXFP8)
    assert s.tolist() == [0] and d.tolist() == [0x80] * 32


def test_partial_blocks():
    # NVFP4 K = 24: the second block has 8 valid values; its amax ignores the padding.
    x = np.concatenate([np.full(16, 6.0), np.full(8, 0.5)]).astype(np.float32)
    d, s = _q(x, bs.NVFP4)
    assert s.tolist() == [int(F.nvfp4_scale_from_amax(6.0)), int(F.nvfp4_scale_from_amax(0.5))]
    assert d.shape == (12,)
    d, s = _q(np.full(33, 2.0), bs.MXFP8)
    assert len(s) == 2 and s[0] == s[1] and d.shape == (33,)


def test_dequantize_error_bound_mxfp8():
    # E4M3 RNE keeps 3 mantissa bits: relative error <= 2^-4, or <= 2^-10 * scale for the
    # subnormal range; "up" scales never saturate.
    x = (RNG.standard_normal((16, 576)) * 32).astype(BF16)
    d, s = ref.quantize_dynamic_block_scaled(x, bs.MXFP8, scale_layout="row_major")
    xf = x.astype(np.float32)
    err = np.abs(ref.dequantize_block_scaled(d, s, bs.MXFP8, k=576, scale_layout="row_major") - xf)
    sd = np.repeat(F.decode_e8m0(s.view(np.uint8)), 32, axis=1)
    assert (err <= np.maximum(np.abs(xf) * 2.0 ** -4, sd * 2.0 ** -10)).all()
    assert err.max() > 0  # the bound is exercised, not trivially met


def test_dequantize_ignores_nvfp4_scale_sign_and_applies_tensor_sf():
    d, s = _q(np.ones(16), bs.NVFP4, tensor_sf=2.0)
    s_neg = (s | 0x80).view(ml_dtypes.float8_e4m3fn)[None]
    a = ref.dequantize_block_scaled(d[None], s_neg, bs.NVFP4, k=16, tensor_sf=2.0,
                                    scale_layout="row_major")
    assert a[0, 0] == np.float32(6) * F.decode_e4m3(s[0]) * np.float32(0.5)


def test_validation_errors():
    x = np.zeros((4, 64), BF16)
    with pytest.raises(ValueError, match="tensor_sf must be 1.0 for mxfp4"):
        ref.quantize_dynamic_block_scaled(x, bs.MXFP4, tensor_sf=0.5)
    with pytest.raises(ValueError, match="tensor_sf must be finite"):
        ref.quantize_dynamic_block_scaled(x, bs.NVFP4, tensor_sf=float("nan"))
    with pytest.raises(ValueError, match="must be even for nvfp4"):
        ref.quantize_dynamic_block_scaled(np.zeros((4, 15), BF16), bs.NVFP4)
    with pytest.raises(TypeError, match="x must have dtype"):
        ref.quantize_dynamic_block_scaled(np.zeros((4, 64), np.float16), bs.NVFP4)
    with pytest.raises(ValueError, match="x must be 2-D"):
        ref.quantize_dynamic_block_scaled(np.zeros(64, BF16), bs.NVFP4)
    with pytest.raises(ValueError, match="must be None for nvfp4"):
        ref.quantize_dynamic_block_scaled(x, bs.NVFP4, scale_rounding="up")
    with pytest.raises(ValueError, match="scale_layout"):
        ref.quantize_dynamic_block_scaled(x, bs.NVFP4, scale_layout="blocked")
    d, s = ref.quantize_dynamic_block_scaled(x, bs.NVFP4)
    with pytest.raises(ValueError, match=r"k=62 needs 31 data columns"):
        ref.dequantize_block_scaled(d, s, bs.NVFP4, k=62)
    with pytest.raises(ValueError, match=r"scales must have shape \(4, 4\)"):
        ref.dequantize_block_scaled(d, s, bs.NVFP4, k=64, scale_layout="row_major")

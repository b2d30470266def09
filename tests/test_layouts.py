"""Scale layouts: the 5-D TCGEN mapping, interleave round trips, shape rules, QTensor."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import blockscale as bs
from blockscale.layouts import deinterleave, interleave, scale_shape, tcgen_offset

RNG = np.random.default_rng(7)


def test_parse_layouts():
    assert bs.ScaleLayout.parse("tcgen5d") is bs.TCGEN_5D
    assert bs.ScaleLayout.parse("ROW_MAJOR") is bs.ROW_MAJOR
    assert bs.ScaleLayout.parse(bs.TCGEN_5D) is bs.TCGEN_5D
    with pytest.raises(ValueError, match="scale_layout must be one of"):
        bs.ScaleLayout.parse("swizzled")


def test_tcgen_offset_worked_checks():
    # SEMANTICS §1.3 with D1 = 2 (kblocks 8)
    cases = {(0, 0): 0, (1, 0): 16, (32, 0): 4, (0, 1): 1, (0, 4): 512, (128, 0): 1024,
             (200, 5): 1673}
    for (r, j), off in cases.items():
        assert tcgen_offset(r, j, 8) == off, (r, j)
    # vectorized and int64 (D12): a row far past 2^31 bytes
    big = tcgen_offset(np.array([2**26]), np.array([0]), 4096)
    assert big.dtype == np.int64 and big[0] == (2**26 // 128) * 1024 * 512


@pytest.mark.parametrize("rows,kblocks,want", [
    (129, 12, (2, 3, 32, 4, 4)),   # input (129,192) NVFP4
    (129, 6, (2, 2, 32, 4, 4)),    # input (129,192) SFV 32
    (128, 4, (1, 1, 32, 4, 4)),    # input (128,128) MXFP4
    (129, 136, (2, 34, 32, 4, 4)),  # §3 (129,136) NVFP4
    (129, 68, (2, 17, 32, 4, 4)),  # §3 (129,68) MXFP4
    (0, 5, (0, 2, 32, 4, 4)),
])
def test_scale_shape_5d(rows, kblocks, want):
    assert scale_shape(bs.TCGEN_5D, rows, kblocks) == want
    assert scale_shape("row_major", rows, kblocks) == (rows, kblocks)
    assert interleave(np.zeros((rows, kblocks), np.uint8)).shape == want


def test_interleave_matches_offset_function():
    s = RNG.integers(1, 256, size=(129, 5), dtype=np.uint8)
    out = interleave(s)
    flat = out.reshape(-1)
    r, j = np.meshgrid(np.arange(129), np.arange(5), indexing="ij")
    off = tcgen_offset(r.ravel(), j.ravel(), 5)
    assert np.array_equal(flat[off], s.ravel())
    mask = np.ones(flat.size, bool)
    mask[off] = False
    assert not flat[mask].any()  # padding rows 129..255 and K-blocks 5..7 are zero bytes


@pytest.mark.parametrize("shape", [(128, 4), (129, 4), (129, 5), (1024, 1024)])
@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu])
def test_round_trip_small(shape, dtype):
    s = RNG.integers(0, 255, size=shape, dtype=np.uint8).view(dtype)
    out = interleave(s)
    assert out.dtype == dtype
    assert np.array_equal(deinterleave(out, *shape).view(np.uint8), s.view(np.uint8))


@pytest.mark.parametrize("shape", [(16384, 3328), (53248, 1024)])
def test_round_trip_large(shape):
    s = RNG.integers(0, 256, size=shape, dtype=np.uint8)
    out = interleave(s)
    assert out.shape == scale_shape(bs.TCGEN_5D, *shape)
    assert np.array_equal(deinterleave(out, *shape), s)
    # spot-check placement with the index function
    r = RNG.integers(0, shape[0], 1000)
    j = RNG.integers(0, shape[1], 1000)
    assert np.array_equal(out.reshape(-1)[tcgen_offset(r, j, shape[1])], s[r, j])


def test_interleave_rejects_bad_input():
    with pytest.raises(TypeError, match="1-byte dtype"):
        interleave(np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        interleave(np.zeros((4,), np.uint8))
    with pytest.raises(ValueError, match=r"\(1\+, 1, 32, 4, 4\)"):
        deinterleave(np.zeros((1, 2, 32, 4, 4), np.uint8), 100, 4)


def test_deinterleave_reads_leading_tiles_of_a_grouped_buffer():
    s = RNG.integers(0, 256, size=(100, 3), dtype=np.uint8)
    padded = np.concatenate([interleave(s), np.full((2, 1, 32, 4, 4), 9, np.uint8)])
    assert np.array_equal(deinterleave(padded, 100, 3), s)


def _qtensor(fmt, rows=130, k=64, layout=bs.TCGEN_5D):
    data = np.zeros((rows, fmt.data_cols(k)), fmt.elem_dtype)
    scales = np.zeros(scale_shape(layout, rows, fmt.kblocks(k)), np.uint8).view(fmt.scale_dtype)
    return bs.QTensor(data, scales, fmt, layout, (rows, k))


def test_qtensor_validates_and_requires():
    q = _qtensor(bs.NVFP4)
    assert q.require(layout="tcgen5d", fmt="nvfp4") is q
    with pytest.raises(ValueError, match="scale layout must be row_major, got tcgen5d"):
        q.require(layout=bs.ROW_MAJOR)
    with pytest.raises(ValueError, match="format must be mxfp4, got nvfp4"):
        q.require(fmt=bs.MXFP4)
    rm = q.with_layout("row_major")
    assert rm.layout is bs.ROW_MAJOR and rm.scales.shape == (130, 4)
    assert rm.with_layout(bs.TCGEN_5D).scales.shape == q.scales.shape


def test_qtensor_rejects_mismatches():
    good = _qtensor(bs.MXFP8, k=40)
    with pytest.raises(TypeError, match="data must have dtype float8_e4m3fn"):
        bs.QTensor(good.data.view(np.uint8), good.scales, bs.MXFP8, bs.TCGEN_5D, (130, 40))
    with pytest.raises(TypeError, match="scales must have dtype float8_e8m0fnu"):
        bs.QTensor(good.data, good.scales.view(np.uint8), bs.MXFP8, bs.TCGEN_5D, (130, 40))
    with pytest.raises(ValueError, match=r"scales must have shape \(130, 2\)"):
        bs.QTensor(good.data, good.scales, bs.MXFP8, bs.ROW_MAJOR, (130, 40))
    with pytest.raises(ValueError, match=r"data must have shape \(130, 32\)"):
        bs.QTensor(good.data, good.scales, bs.MXFP8, bs.TCGEN_5D, (130, 32))
    with pytest.raises(ValueError, match="tensor_sf must be 1.0 for mxfp8"):
        bs.QTensor(good.data, good.scales, bs.MXFP8, bs.TCGEN_5D, (130, 40), tensor_sf=0.5)

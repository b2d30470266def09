"""The decode kernel's "mma_c" variant (conflict-free shared staging, 8-byte weight scale
loads: blockscale/ops/_decode_mma_ir._Staging) run by the numpy interpreter: bit for bit
the portable kernel's results (dense and grouped, NVFP4 / MXFP4), on the shapes, code and
scale edges of tests/test_matmul_decode_mma.py, plus N tails inside the last 64 columns
whose scale rows fall in the 5-D padding (read, never stored)."""

from __future__ import annotations

import numpy as np
import pytest
from test_matmul_common import random_dense_case
from test_matmul_decode import GROUPED
from test_matmul_decode_mma import DENSE, FP4, _dense
from test_matmul_decode_mma import test_every_code_and_scale_edges as _codes_and_edges
from test_matmul_decode_mma import test_grouped_mma_bit_identical_to_portable as _grouped
from test_matmul_decode_mma import test_nan_scale_gives_nan_column as _nan_scales

from blockscale.formats import NVFP4
from blockscale.ops import matmul, matmul_decode

pytestmark = pytest.mark.interp

VARIANT = "mma_c"


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("mnk", DENSE + [(2, 200, 1536)], ids=lambda s: "x".join(map(str, s)))
def test_dense_bit_identical_to_portable(fmt, mnk):
    got, want = _dense(fmt, *mnk, seed=sum(mnk), variant=VARIANT)
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_sm100_ir(fmt):
    got, want = _dense(fmt, 5, 70, 544, seed=3, target="sm_100a", variant=VARIANT)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_codes_and_scale_edges(fmt):
    _codes_and_edges(fmt, VARIANT)


def test_nan_scales():
    _nan_scales(VARIANT)


def test_padding_scale_rows_never_reach_outputs():
    """N = 70: the second CTA's rows 70..127 read 5-D padding scale bytes (here NaN and
    the largest scale): its stored columns 64..69 are still the portable kernel's."""
    rng = np.random.default_rng(9)
    m, n, k = 4, 70, 544
    a, b, _sfa, _sfb, sfa5, sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    pad = sfb5.view(np.uint8).reshape(-1, sfb5.shape[1], 32, 4, 4)
    rows = np.arange(128)
    for r in rows[rows >= n]:  # row r: (i2, i3) = (r % 32, r // 32)
        pad[0, :, r % 32, r // 32, :] = 0x7F if r % 2 else 0x7E
    got = matmul_decode.block_scaled_matmul_decode(a, b, sfa5, sfb5, NVFP4, k=k,
                                                   out_dtype="float32", device="interp",
                                                   variant=VARIANT)
    want = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, k=k, out_dtype="float32",
                                            device="interp")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("case_id", range(len(GROUPED)))
def test_grouped_bit_identical_to_portable(case_id, fmt, monkeypatch):
    _grouped(case_id, fmt, VARIANT, monkeypatch)

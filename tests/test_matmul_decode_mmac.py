"""The decode kernel's "mma_c" variants (conflict-free shared staging, 8-byte weight scale
loads; "mma_c8*": passes of 8 rows: blockscale/ops/_decode_mma_ir._Staging) run by the numpy
interpreter: bit for bit the portable kernel's results (dense and grouped, NVFP4 / MXFP4),
on the shapes, code and scale edges of tests/test_matmul_decode_mma.py (9..17 rows: 2-3
passes of "mma_c8"), plus N tails inside the last 64 columns whose scale rows fall in the
5-D padding (read, never stored). "mma_c85" / "mma_c86" are "mma_c8"'s IR under other
register caps: one grouped case each."""

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

VARIANTS = ("mma_c", "mma_c8")


@pytest.fixture(params=VARIANTS)
def variant(request):
    return request.param


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("mnk", DENSE + [(2, 200, 1536)], ids=lambda s: "x".join(map(str, s)))
def test_dense_bit_identical_to_portable(fmt, mnk, variant):
    got, want = _dense(fmt, *mnk, seed=sum(mnk), variant=variant)
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_sm100_ir(fmt, variant):
    got, want = _dense(fmt, 5, 70, 544, seed=3, target="sm_100a", variant=variant)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_codes_and_scale_edges(fmt, variant):
    _codes_and_edges(fmt, variant)


def test_nan_scales(variant):
    _nan_scales(variant)


def test_padding_scale_rows_never_reach_outputs(variant):
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
                                                   variant=variant)
    want = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, k=k, out_dtype="float32",
                                            device="interp")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("case_id", range(len(GROUPED)))
def test_grouped_bit_identical_to_portable(case_id, fmt, variant, monkeypatch):
    _grouped(case_id, fmt, variant, monkeypatch)


@pytest.mark.parametrize("v", ["mma_c85", "mma_c86"])
def test_grouped_register_cap_variants(v, monkeypatch):
    _grouped(4, NVFP4, v, monkeypatch)
    spec = matmul_decode.DecodeSpec("nvfp4", variant=v)
    assert spec.block == (128, 1, 1) and spec.cols == 64
    assert matmul_decode.VARIANT_REGISTERS[v] < 128


def test_bundle_specs_hold_the_variants():
    names = {s.kernel_name for s in matmul_decode.bundle_specs("sm_90a")}
    for v in VARIANTS:
        assert f"bs_decode_dense_nvfp4_f32_{v}" in names
    for v in VARIANTS + ("mma_c85", "mma_c86"):
        assert f"bs_decode_grouped_mxfp4_bf16_{v}" in names
        assert f"bs_decode_grouped_nvfp4_bf16_rowsc_{v}" in names
    assert "bs_decode_dense_nvfp4_f32_mma_c86" not in names

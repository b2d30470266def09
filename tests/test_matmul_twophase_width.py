"""Two-phase tile widths that fit N to the waves (issue #9): 128 x 240 / 128 x 224 tiles
(``wgmma m64n240k16`` / ``m64n224k16``, B's workspace made for the width), the wave model
that picks the width, and the dispatch's choice of it.

* interp: bit-identical to 128 x 256 tiles (the same bf16 operands and k16 wgmma order per
  element), N tails (N not a multiple of the width) included, both stores and both layouts;
* the wave model: 8192 x 5760 on 132 SMs -> 240 (12 waves of 128 + 240 operand rows; 256
  pads to 23 column tiles: 12 waves of 128 + 256), ties to the wider tile, 192 not a
  candidate;
* gpu: byte-equal to 128 x 256 direct stores on the H200 (``-k width``)::

      BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_matmul_twophase_width.py
"""

from __future__ import annotations

import numpy as np
import pytest
from test_matmul_common import random_dense_case

from blockscale.formats import NVFP4, Format
from blockscale.ops import matmul_twophase as TP


def _pair(fmt, m, n, k, seed, device="interp", **kw):
    """(the pair with ``kw``, the default 128 x 256 direct pair) on one random case."""
    fmt = Format.from_name(fmt)
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(seed), fmt, m, n, k)
    out = kw.pop("out_dtype", "bfloat16")
    run = lambda **o: TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, fmt, alpha=0.375,
                                                      out_dtype=out, device=device, **o)
    return run(**kw), run()


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (130, 504, 224), 240, "staged", "bfloat16", "none"),  # 3 column tiles, N tail 24
    ("mxfp4", (70, 232, 96), 240, "staged", "float32", "none"),  # one tile, 8 columns short
    ("nvfp4", (130, 470, 160), 240, "direct", "float32", "none"),  # N % 4 != 0: direct
    ("nvfp4", (130, 456, 224), 224, "staged", "bfloat16", "none"),  # 5 stages, N tail 8
    ("mxfp4", (70, 300, 96), 224, "direct", "bfloat16", "none"),
    ("nvfp4", (130, 488, 224), 240, "staged", "bfloat16", "128b"),  # 30 atoms of 8 B rows
    ("mxfp4", (70, 232, 160), 224, "direct", "float32", "128b"),
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-bn{c[2]}-{c[3]}-{c[4]}-{c[5]}")
def test_interp_width(case):
    """The same bytes as 128 x 256 tiles with direct stores and no swizzle."""
    fmt, (m, n, k), bn, store, out_dtype, swizzle = case
    got, want = _pair(fmt, m, n, k, m + n + k, bn=bn, store=store, out_dtype=out_dtype,
                      swizzle=swizzle, kstep=64)
    assert got.shape == (m, n)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.interp
@pytest.mark.parametrize("bn", [240, 224])
def test_interp_width_workspace(bn):
    """B's workspace for tile ``bn``: ``padded(N, bn)`` rows, each tile-row one span of
    ``bn * k_pad * 2`` bytes holding the 256-tile workspace's rows in its own chunk order."""
    n, k = 2 * bn + 24, 96
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(bn), NVFP4, 8, n, k)
    _, wb = TP.dequantize_operands(a, b, sfa5, sfb5, NVFP4, bn=bn, device="interp")
    _, ref = TP.dequantize_operands(a, b, sfa5, sfb5, NVFP4, device="interp")
    kp = TP.k_padded(k)

    def rows(w, tile):  # stage-ordered -> [rows_pad, k_pad] bf16 bits
        t = w.view(np.uint16).reshape(-1, kp // 8, tile, 8)
        return t.transpose(0, 2, 1, 3).reshape(-1, kp)

    assert wb.size == 2 * kp * TP.padded(n, bn) == 2 * kp * 3 * bn
    np.testing.assert_array_equal(rows(wb, bn)[:n], rows(ref, 256)[:n])
    assert not rows(wb, bn)[n:].any()


def test_wave_model():
    """Cost per SM = waves x (bm + bn) operand rows ("rows") or waves x bn ("columns"),
    minimized; ties and near-ties (2 %) to the wider tile."""
    assert [TP.waves(8192, 5760, 132, bn=bn) for bn in (256, 240, 224, 192)] == [12, 12, 13, 15]
    assert TP.wave_bn(8192, 5760, 132) == 240  # 4416 < 4576 (224) < 4608 (256)
    # 192 (15 x 320 = 4800) behind 256 (4608), as measured (run O); "columns" says otherwise
    assert TP.wave_bn(8192, 5760, 132, candidates=(256, 192)) == 256
    assert TP.wave_bn(8192, 5760, 132, candidates=(256, 192), model="columns") == 192
    assert TP.wave_bn(8192, 5760, 132, candidates=(240, 192), model="columns") == 240  # tie
    assert TP.wave_bn(8192, 5760, 132, model="columns") == 240  # 2880 < 2912 < 3072
    assert TP.wave_bn(8192, 5760, 132, tolerance=0.05) == 256  # 4608 within 5 % of 4416
    # "columns": 224 -> 17 x 224 = 3808, 256 -> 15 x 256 = 3840 within 2 %: the wider
    assert TP.wave_bn(8192, 7680, 132, model="columns") == 256
    assert TP.wave_bn(8192, 7680, 132, model="columns", tolerance=0.0) == 224
    assert TP.wave_bn(8192, 7680, 132, tolerance=0.0) == 256  # rows: 5760 < 5888 < 5984
    assert TP.wave_bn(8192, 4096, 132) == 256  # 16 x 64 = 1024 tiles: 8 waves exactly
    assert TP.wave_bn(256, 480, 4) == 240  # 4 tiles of 240 (one wave) vs 6 of 224 (two)
    assert TP.wave_bn(1024, 2560, 132) == 224  # every width one wave: the narrowest
    with pytest.raises(ValueError, match="model must be one of"):
        TP.wave_bn(8192, 5760, 132, model="flops")
    with pytest.raises(ValueError, match="sms must be a positive int"):
        TP.wave_bn(8192, 5760, 0)
    with pytest.raises(ValueError, match="candidates must be"):
        TP.wave_bn(8192, 5760, 132, candidates=(200,))
    with pytest.raises(ValueError, match="bn must be one of"):
        TP.TwophaseMatmulSpec("nvfp4", bn=208)
    with pytest.raises(ValueError, match="tile must be one of"):
        TP.DequantSpec("nvfp4", tile=208)
    s = TP.TwophaseMatmulSpec("nvfp4", bn=240, store="staged")
    assert (s.stages, s.kernel_name) == (4, "bs_twophase_nvfp4_128x240_k64_s4_bf16_st")
    assert TP.TwophaseMatmulSpec("nvfp4", bn=224).stages == 4  # a power of two (run V)
    assert TP.grid(8192, 5760, bn=240) == (1536, 1, 1)


def test_dispatch_width_choice(monkeypatch):
    """DISPATCH_BN ("auto" since run T) or BLOCKSCALE_SM90_TWOPHASE_BN: "auto" takes the
    wave model at the device's SM count (the interpreter: SM_COUNTS)."""
    from blockscale.runtime import get_device

    dev = get_device("interp")
    monkeypatch.delenv(TP.ENV_BN, raising=False)
    assert TP.DISPATCH_BN == "auto" and TP.dispatch_bn(8192, 5760, dev) == 240
    monkeypatch.setenv(TP.ENV_BN, "256")
    assert TP.dispatch_bn(8192, 5760, dev) == 256
    assert TP.sm_count(dev) == TP.SM_COUNTS["sm_90a"] == 132
    monkeypatch.setenv(TP.ENV_BN, "auto")
    assert TP.dispatch_bn(8192, 5760, dev) == 240
    monkeypatch.setenv(TP.ENV_BN, "224")
    assert TP.dispatch_bn(8192, 5760, dev) == 224
    for bad in ("192", "wide"):
        monkeypatch.setenv(TP.ENV_BN, bad)
        with pytest.raises(ValueError, match="BLOCKSCALE_SM90_TWOPHASE_BN"):
            TP.dispatch_bn(8192, 5760, dev)


@pytest.mark.interp
def test_dispatch_runs_the_chosen_width(monkeypatch):
    """With "auto" the dense dispatch builds phase 2 (and B's workspace) at the model's
    width, here 240 (4 SMs), and returns the 128 x 256 pair's bytes."""
    from blockscale.ops import matmul

    m, n, k = 256, 480, 64
    fmt = NVFP4
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(4), fmt, m, n, k)
    want = TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, fmt, alpha=0.5, device="interp")
    monkeypatch.setattr(TP, "SM_COUNTS", {"sm_90a": 4})
    monkeypatch.setenv(TP.ENV_BN, "auto")
    launched = []
    real = TP._run
    monkeypatch.setattr(TP, "_run", lambda spec, *x: launched.append(spec) or real(spec, *x))
    got = matmul.block_scaled_matmul(a, b, sfa5, sfb5, fmt, alpha=0.5, device="interp",
                                     target="sm_90a")
    assert [(s.bn, s.store) for s in launched] == [(240, "staged")]
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_height_model():
    """Time per SM = waves x (bm + TILE_OVERHEAD_ROWS) tile rows, minimized; ties to 128."""
    assert TP.TILE_OVERHEAD_ROWS == 9
    assert [TP.waves(8192, 5760, 132, bm, 240) for bm in (128, 192)] == [12, 8]
    assert TP.wave_bm(8192, 5760, 132, 240) == 192  # 8 x 201 = 1608 < 12 x 137 = 1644
    assert TP.wave_bm(1024, 5760, 132, 224) == 128  # 2 waves either way
    assert TP.wave_bm(8192, 4096, 132, 256) == 128  # 8 x 137 = 1096 < 6 x 201 = 1206
    assert TP.wave_bm(8192, 5760, 132, 240, candidates=(128,)) == 128
    assert TP.wave_bm(8192, 5760, 132, 240, overhead=0) == 128  # 1536 each: the tie to 128
    with pytest.raises(ValueError, match="sms must be a positive int"):
        TP.wave_bm(8192, 5760, 0)
    with pytest.raises(ValueError, match="candidates must be"):
        TP.wave_bm(8192, 5760, 132, candidates=(256,))
    s = TP.TwophaseMatmulSpec("nvfp4", bm=192, bn=240, store="staged")
    assert (s.stages, s.block) == (4, (384, 1, 1))
    assert s.kernel_name == "bs_twophase_nvfp4_192x240_k64_s4_bf16_st"


def test_dispatch_height_choice(monkeypatch):
    """DISPATCH_BM ("auto" since run DJ) or BLOCKSCALE_SM90_TWOPHASE_BM."""
    from blockscale.runtime import get_device

    dev = get_device("interp")
    monkeypatch.delenv(TP.ENV_BM, raising=False)
    assert TP.DISPATCH_BM == "auto" and TP.dispatch_bm(8192, 5760, 240, dev) == 192
    monkeypatch.setenv(TP.ENV_BM, "128")
    assert TP.dispatch_bm(8192, 5760, 240, dev) == 128
    monkeypatch.setenv(TP.ENV_BM, "auto")
    assert TP.dispatch_bm(1024, 5760, 224, dev) == 128
    for bad in ("256", "tall"):
        monkeypatch.setenv(TP.ENV_BM, bad)
        with pytest.raises(ValueError, match="BLOCKSCALE_SM90_TWOPHASE_BM"):
            TP.dispatch_bm(8192, 5760, 240, dev)


@pytest.mark.interp
def test_dispatch_runs_the_chosen_height(monkeypatch):
    """Where the model picks 192-row tiles (here 4 SMs: 576 rows are 2 waves of 128-row
    tiles, 1 of 192) the dispatch runs them (both workspaces from the one-launch phase 1 at
    that height), with ``pdl`` too, and returns the 128 x 256 pair's bytes; in 2-CTA
    clusters it keeps 128."""
    from blockscale.ops import matmul

    m, n, k = 576, 256, 64
    fmt = NVFP4
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(6), fmt, m, n, k)
    want = TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, fmt, alpha=0.5, device="interp")
    monkeypatch.setattr(TP, "SM_COUNTS", {"sm_90a": 4})
    for env in (TP.ENV_BN, TP.ENV_BM, TP.ENV_PDL, TP.ENV_CLUSTER):
        monkeypatch.delenv(env, raising=False)
    launched = []
    real = TP._run
    monkeypatch.setattr(TP, "_run", lambda spec, *x: launched.append(spec) or real(spec, *x))
    for pdl, cluster in (("0", "1"), ("1", "1"), ("0", "2")):
        monkeypatch.setenv(TP.ENV_PDL, pdl)
        monkeypatch.setenv(TP.ENV_CLUSTER, cluster)
        got = matmul.block_scaled_matmul(a, b, sfa5, sfb5, fmt, alpha=0.5, device="interp",
                                         target="sm_90a")
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert [(s.bm, s.bn, s.store, s.pdl, s.cluster) for s in launched] == [
        (192, 256, "staged", False, 1), (192, 256, "staged", True, 1),
        (128, 256, "staged", False, 2)]


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", TP.FORMATS)
@pytest.mark.parametrize("shape", [(8192, 5760, 2944), (777, 2560, 8192), (300, 504, 512)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bm,bn,swizzle", [(128, 240, "none"), (128, 224, "none"),
                                           (128, 240, "128b"), (192, 240, "none"),
                                           (192, 256, "none"), (192, 224, "none")],
                         ids=lambda v: str(v))
def test_gpu_width(shape, out_dtype, fmt, bm, bn, swizzle):
    """On the H200: the staged ``bm`` x ``bn`` pair (192 rows: three consumer warpgroups)
    writes the 128 x 256 direct pair's bytes (the same HGMMA k16 order per element), M and N
    tails included (504 = 2 x 240 + 24)."""
    m, n, k = shape
    got, want = _pair(fmt, m, n, k, m + n + k, device="cuda", bm=bm, bn=bn, store="staged",
                      out_dtype=out_dtype, swizzle=swizzle)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (200, 504, 224), 240, "bfloat16"),  # M tail 8 in the 2nd tile, N tail 24
    ("mxfp4", (130, 448, 160), 224, "float32"),  # one 192-row tile, 2 column tiles
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-bn{c[2]}-{c[3]}")
def test_interp_height(case):
    """192 x ``bn`` staged tiles (three consumer warpgroups, the dispatch's pick at large M)
    write the 128 x 256 direct pair's bytes (the same k16 order per element)."""
    fmt, (m, n, k), bn, out_dtype = case
    got, want = _pair(fmt, m, n, k, m + n, bm=192, bn=bn, store="staged", out_dtype=out_dtype)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))

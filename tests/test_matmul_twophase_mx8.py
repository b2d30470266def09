"""The two-phase sm_90a MXFP8 matmul (per-row exact folds to bf16, the bf16 wgmma GEMM of the
FP4 pair, the folds undone in the epilogue, a fixup of flagged rows).

* interp: the fp32 bound of test_matmul_common.py (MX: the bf16 wgmma's k16 roundings, one
  more per 32-block, as the FP4 pair's MXFP4 tests) and bf16 consistency; M / N / K tails,
  both tile heights, alpha, an epilogue; bit-identical to the portable and the mma.sync
  MXFP8 kernels where every sum is exact; extreme scale bytes (0 and 254 in unflagged rows: the three-step undo;
  a row spanning them: flagged, the fixup's bytes equal the portable kernel's), NaN scale
  bytes 0xFF and NaN elements; the fold kernel against a numpy model of F and the flags.
* lower: sm_90a SASS of the five kernels (phase 1: four 128-bit loads, eight 128-bit stores,
  the e4m3x2 -> f16x2 conversions, no spills).
* gpu: the dispatch (``BLOCKSCALE_SM90_TWOPHASE_MX8=1``) within the bound on sampled rows and
  a flagged row / column equal to the portable kernel's bytes on an H100 / H200::

      BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_matmul_twophase_mx8.py
"""

from __future__ import annotations

import functools
import re

import ml_dtypes
import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    assert_f32_within_bound,
    exact_dense,
    f32_error_bound,
    random_dense_case,
)

from blockscale import layouts
from blockscale.formats import MXFP8, NVFP4
from blockscale.ops import _core
from blockscale.ops import matmul as Mm
from blockscale.ops import matmul_epilogue as ep
from blockscale.ops import matmul_twophase as TP
from blockscale.ops import matmul_twophase_mx8 as MX

ALPHA = 0.375


def _dev(name="interp"):
    from blockscale import runtime

    return runtime.get_device(name)


def _portable(a, b, sfa5, sfb5, alpha, out_dtype, epilogue=None, inputs=None, device="interp"):
    """The portable MXFP8 kernel (no fast path)."""
    d = Mm._validate(a, b, sfa5, sfb5, MXFP8, None, "tcgen5d")
    spec = Mm.MatmulSpec("mxfp8", out_dtype, "tcgen5d", epilogue, "sm_90a")
    return Mm._run_dense(spec, d, a, b, sfa5, sfb5, alpha, dict(inputs or {}), _dev(device))


def _bound(abs_sum, k):
    return f32_error_bound(abs_sum, MXFP8, k, n_mul=1 + MXFP8.kblocks(k))


def _e4m3(values):
    return np.asarray(values, np.float32).astype(ml_dtypes.float8_e4m3fn)


def _e8m0(b):
    return np.asarray(b, np.uint8).view(ml_dtypes.float8_e8m0fnu)


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ((130, 300, 96), "float32", 128, 256),  # M, N tails; K a step and a half
    ((70, 260, 224), "bfloat16", 128, 256),
    ((200, 100, 352), "float32", 192, 192),  # 3 warpgroups, n192 tiles; K tail
    ((5, 7, 32), "bfloat16", 128, 256),  # one K-block, mostly padding
], ids=lambda c: f"{'x'.join(map(str, c[0]))}-{c[1]}-bm{c[2]}-bn{c[3]}")
def test_interp_bound(case):
    (m, n, k), out_dtype, bm, bn = case
    rng = np.random.default_rng(m * 131 + n * 7 + k)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, MXFP8, m, n, k)
    got = MX.block_scaled_matmul_twophase_mx8(a, b, sfa5, sfb5, alpha=ALPHA,
                                              out_dtype=out_dtype, bm=bm, bn=bn,
                                              device="interp")
    assert got.shape == (m, n)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, MXFP8, k, ALPHA)
    if out_dtype == "float32":
        assert_f32_within_bound(got, exact, _bound(abs_sum, k))
    else:
        assert_bf16_consistent(got, exact, _bound(abs_sum, k))


def _exact_case(rng, m, n, k, spread=2):
    """Elements in {0, +-0.5, +-1, +-1.5, +-2}, scales 2^-spread .. 2^spread: every product
    is a multiple of 2^-(2 + 2 spread) below 2^(2 + 2 spread); with K * 2^(4 + 4 spread) <
    2^24 (e.g. K = 96, spread 2; K = 2944, spread 1) all fp32 sums are exact."""
    vals = np.array([0, 0.5, 1, 1.5, 2, -0.5, -1, -1.5, -2], np.float32)
    a, b = (_e4m3(rng.choice(vals, size=(r, k))) for r in (m, n))
    sfa, sfb = (_e8m0(rng.integers(127 - spread, 128 + spread, size=(r, k // 32)))
                for r in (m, n))
    return a, b, sfa, sfb, layouts.interleave(sfa), layouts.interleave(sfb)


@pytest.mark.interp
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_interp_exact_sums_equal_portable(out_dtype):
    """Where every fp32 sum is exact, the outputs are the bytes of the portable kernel and of
    the mma.sync kernel (today's sm_90a MXFP8 dispatch), alpha's single rounding included;
    with a fused epilogue too (portable)."""
    from blockscale.ops import matmul_sm90

    m, n, k = 70, 40, 96
    a, b, _, _, sfa5, sfb5 = _exact_case(np.random.default_rng(5), m, n, k)
    mma = matmul_sm90.block_scaled_matmul_sm90(a, b, sfa5, sfb5, MXFP8, alpha=ALPHA,
                                               out_dtype=out_dtype, device="interp")
    got = MX.block_scaled_matmul_twophase_mx8(a, b, sfa5, sfb5, alpha=ALPHA,
                                              out_dtype=out_dtype, device="interp")
    assert np.array_equal(got.view(np.uint8), mma.view(np.uint8))
    for epi, inputs in ((None, None),
                        (ep.chain(ep.bias(), ep.relu()),
                         {"bias": np.random.default_rng(6).standard_normal(n).astype(
                             np.float32)})):
        got = MX.block_scaled_matmul_twophase_mx8(a, b, sfa5, sfb5, alpha=ALPHA,
                                                  out_dtype=out_dtype, epilogue=epi,
                                                  epilogue_inputs=inputs, device="interp")
        want = _portable(a, b, sfa5, sfb5, ALPHA, out_dtype, epi, inputs)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def _extreme_case():
    """Random operands with crafted rows (K = 128: four K-blocks):

    A row 0: scale bytes 254 and 0 with nonzero data in both (spread 254: flagged);
    A row 1: every byte 0 (2^-127), positive data >= 1 (normal outputs): Fa = -169, the
    three-step undo; A row 2: bytes 200 / 130 (spread 70: in the window); A row 3: byte 254
    then zero blocks of byte 0 (all-zero data: not flagged); A row 4: a 0xFF byte (NaN row).
    B row 0: every byte 254; B row 1: spread 100 with nonzero data (flagged column); B row 2:
    a NaN element (0x7F)."""
    m, n, k = 40, 24, 128
    rng = np.random.default_rng(11)
    a, b, sfa, sfb, _, _ = random_dense_case(rng, MXFP8, m, n, k)
    a, b = a.view(np.uint8).copy(), b.view(np.uint8).copy()
    sfa, sfb = sfa.view(np.uint8).copy(), sfb.view(np.uint8).copy()
    sfa[0] = [254, 0, 127, 0]
    sfa[1] = 0
    a[1] = rng.integers(0x38, 0x60, size=k)  # 1 .. 8, positive
    sfa[2] = [200, 130, 200, 130]
    sfa[3] = [254, 0, 0, 0]
    a[3, 32:] = 0
    sfa[4, 2] = 0xFF
    sfb[0] = 254
    sfb[1] = [127, 27, 127, 127]
    b[2, 5] = 0x7F
    e4 = ml_dtypes.float8_e4m3fn
    return (a.view(e4), b.view(e4), _e8m0(sfa), _e8m0(sfb), layouts.interleave(_e8m0(sfa)),
            layouts.interleave(_e8m0(sfb)), k)


def _check_against_portable(got, want, exact, bound, flagged_rows, flagged_cols, out_dtype):
    """Flagged rows / columns: the portable kernel's bytes. Elsewhere: NaN where the exact
    value is NaN; +-inf (its sign) where it overflows f32 by far (the portable kernel may
    give NaN there: its running sum of block terms can meet +inf and -inf; the folded sum
    stays finite and the undo rounds once); the rest within the bound."""
    g, w = got.view(np.uint8).reshape(got.shape + (-1,)), want.view(np.uint8).reshape(
        want.shape + (-1,))
    for r in flagged_rows:
        assert np.array_equal(g[r], w[r]), r
    for c in flagged_cols:
        assert np.array_equal(g[:, c], w[:, c]), c
    gf = got.astype(np.float64)
    rest = np.ones(got.shape, bool)
    rest[list(flagged_rows)] = False
    rest[:, list(flagged_cols)] = False
    nan = rest & np.isnan(exact)
    assert np.isnan(gf[nan]).all()
    huge = rest & (np.abs(np.nan_to_num(exact)) > 2.0 * float(np.finfo(np.float32).max))
    assert np.array_equal(gf[huge], np.sign(exact[huge]) * np.inf)
    rest &= ~np.isnan(exact) & (np.abs(np.nan_to_num(exact)) <= float(np.finfo(np.float32).max))
    assert rest.sum() > rest.size // 2
    if out_dtype == "float32":
        assert_f32_within_bound(np.where(rest, gf, 0.0), np.where(rest, exact, 0.0),
                                np.where(rest, bound, 1.0))
    else:
        assert_bf16_consistent(np.where(rest, got, 0).astype(ml_dtypes.bfloat16),
                               np.where(rest, exact, 0.0), np.where(rest, bound, 1.0))


@pytest.mark.interp
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_interp_extreme_scales_nan_and_fixup(out_dtype):
    a, b, sfa, sfb, sfa5, sfb5, k = _extreme_case()
    got = MX.block_scaled_matmul_twophase_mx8(a, b, sfa5, sfb5, alpha=ALPHA,
                                              out_dtype=out_dtype, device="interp")
    want = _portable(a, b, sfa5, sfb5, ALPHA, out_dtype)
    with np.errstate(all="ignore"):
        exact, abs_sum = exact_dense(a, b, sfa, sfb, MXFP8, k, ALPHA)
        bound = _bound(abs_sum, k)
    assert np.isnan(got[4]).all() and np.isnan(got[:, 2]).all()
    g1 = got[1].astype(np.float64)  # 2^-127 x 2^-3..2^3 scales: normal, three-step undo
    assert (np.abs(g1[3:]) > 2.0 ** -126).all()
    _check_against_portable(got, want, exact, bound, [0], [1], out_dtype)


@pytest.mark.interp
def test_interp_fixup_applies_the_epilogue():
    """A flagged row and column go through alpha, the epilogue and the cast of the portable
    kernel (same bytes); the other outputs through fold_undo, then the same epilogue."""
    a, b, sfa, sfb, sfa5, sfb5, k = _extreme_case()
    m, n = a.shape[0], b.shape[0]
    rng = np.random.default_rng(2)
    inputs = {"bias": rng.standard_normal(n).astype(np.float32),
              "row_scale": rng.uniform(0.5, 2, m).astype(np.float32)}
    epi = ep.chain(ep.bias(), ep.row_scale(), ep.relu())
    got = MX.block_scaled_matmul_twophase_mx8(a, b, sfa5, sfb5, alpha=-0.5,
                                              out_dtype="float32", epilogue=epi,
                                              epilogue_inputs=inputs, device="interp")
    want = _portable(a, b, sfa5, sfb5, -0.5, "float32", epi, inputs)
    assert np.array_equal(got[0].view(np.uint32), want[0].view(np.uint32))
    assert np.array_equal(got[:, 1].view(np.uint32), want[:, 1].view(np.uint32))
    ok = np.ones((m, n), bool)
    ok[[0, 3, 4]] = False  # flagged, 2^127 scales overflow before the epilogue, NaN
    ok[:, [0, 1, 2]] = False  # 2^127 scales overflow before the epilogue, flagged, NaN
    ref = np.maximum((exact_dense(a, b, sfa, sfb, MXFP8, k, -0.5)[0] + inputs["bias"])
                     * inputs["row_scale"][:, None], 0)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-5, atol=1e-3)


@pytest.mark.interp
def test_interp_fixup_split():
    """A flagged row of A across 600 columns (outputs shared by the fixup's grid.y CTAs:
    columns 0..255 by y = 0, 256..511 by y = 1, 512.. by y = 2) and a flagged row of B at
    column 550 (a column of C: the flag's CTA is the third of B's flags chunk): the portable
    kernel's bytes there, the bound elsewhere."""
    m, n, k = 20, 600, 64
    rng = np.random.default_rng(9)
    a, b, sfa, sfb, _, _ = random_dense_case(rng, MXFP8, m, n, k)
    sfa, sfb = sfa.view(np.uint8).copy(), sfb.view(np.uint8).copy()
    sfa[3] = [230, 120]
    sfb[550] = [10, 127]
    sfa, sfb = _e8m0(sfa), _e8m0(sfb)
    sfa5, sfb5 = layouts.interleave(sfa), layouts.interleave(sfb)
    got = MX.block_scaled_matmul_twophase_mx8(a, b, sfa5, sfb5, alpha=ALPHA,
                                              out_dtype="float32", device="interp")
    want = _portable(a, b, sfa5, sfb5, ALPHA, "float32")
    exact, abs_sum = exact_dense(a, b, sfa, sfb, MXFP8, k, ALPHA)
    _check_against_portable(got, want, exact, _bound(abs_sum, k), [3], [550], "float32")


def _hoisted_vs_per_element(monkeypatch, a, b, sfa5, sfb5, **kw):
    """Phase 2 with the hoisted fold epilogue (the default) and with round 1's per-element
    one (two loads and the branch per element): the same output bytes."""
    got = MX.block_scaled_matmul_twophase_mx8(a, b, sfa5, sfb5, device="interp", **kw)
    with monkeypatch.context() as mp:
        mp.setattr(MX, "phase2_spec", functools.partial(MX.phase2_spec, hoist=False))
        want = MX.block_scaled_matmul_twophase_mx8(a, b, sfa5, sfb5, device="interp", **kw)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    return got


@pytest.mark.interp
@pytest.mark.parametrize("store", ["staged", "direct"])
@pytest.mark.parametrize("epi", [None, "relu", "bias_relu"])
def test_interp_hoisted_fold_epilogue_bytes(monkeypatch, store, epi):
    """The hoisted fold epilogue (fold exponents loaded once per row / column of a thread,
    the warp-uniform fast path of one add and one multiply where every G of a warp's rows and
    a full n-tile's columns is near, else the per-element branch) gives round 1's bytes:
    136 x 264 (a full 256-wide tile, then a 8-column tail: both paths), the extreme rows
    tiled (A row 1: Fa = -169, the three-step undo inside a full tile; 0 / 254 scales, NaN
    rows), with no epilogue, one that loads nothing (relu: the staged store's unguarded
    loop) and one that loads (bias + relu: guarded)."""
    a, b, sfa, sfb, _, _, k = _extreme_case()
    reps_m, reps_n = 136 // a.shape[0] + 1, 264 // b.shape[0] + 1
    a, sfa = np.tile(a, (reps_m, 1))[:136], np.tile(sfa, (reps_m, 1))[:136]
    b, sfb = np.tile(b, (reps_n, 1))[:264], np.tile(sfb, (reps_n, 1))[:264]
    rng = np.random.default_rng(17)
    a[40:], b[24:] = (random_dense_case(rng, MXFP8, 96, 240, k)[i] for i in (0, 1))
    sfa[40:], sfb[24:] = (random_dense_case(rng, MXFP8, 96, 240, k)[i] for i in (2, 3))
    epilogue = {None: None, "relu": ep.relu(), "bias_relu": ep.chain(ep.bias(), ep.relu())}[epi]
    inputs = {"bias": rng.standard_normal(264).astype(np.float32)} if epi == "bias_relu" \
        else None
    out = "float32" if epi != "relu" else "bfloat16"
    got = _hoisted_vs_per_element(monkeypatch, a, b, layouts.interleave(sfa),
                                  layouts.interleave(sfb), alpha=ALPHA, out_dtype=out,
                                  epilogue=epilogue, epilogue_inputs=inputs, store=store)
    assert np.isfinite(got[40:, 24:].astype(np.float32)).all()


@pytest.mark.interp
def test_interp_hoisted_fold_alpha_exponents(monkeypatch):
    """Alpha's exponent moves every G (B's folds carry it): alpha = 2^-60 and 2^70 push
    whole tiles off the fast path (G < -126 / > 127: the branch's three steps), 2^-20 keeps
    them on it; the bytes of the per-element epilogue each time."""
    m, n, k = 64, 256, 64
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(23), MXFP8, m, n, k)
    for alpha in (2.0 ** -60, 2.0 ** 70 * 1.5, -(2.0 ** -20)):
        _hoisted_vs_per_element(monkeypatch, a, b, sfa5, sfb5, alpha=alpha,
                                out_dtype="float32", store="staged")


def _fold_model(data, scales, shift=0):
    """numpy model of the fold kernel: (F + shift, flag) per row."""
    s = scales.view(np.uint8).astype(np.int64)
    finite = np.where(s == 255, 0, s)
    bmax = finite.max(axis=1)
    nz = (data.view(np.uint8).reshape(data.shape[0], -1, 32) & 0x7F).any(axis=2)
    far = (bmax[:, None] - s > MX.WINDOW) & (s != 255)
    return bmax - 127 - MX.HEADROOM + shift, (far & nz).any(axis=1).astype(np.int32)


@pytest.mark.interp
def test_interp_fold_kernel():
    """The fold exponents (stored biased) and flags of every row of A and B, against the
    numpy model: 0xFF bytes ignored, the 5-D padding (K = 96: three K-blocks, a padding
    byte per row) ignored, the window's edge (spread 80 in, 81 out), zero blocks not flagged,
    alpha's exponent added to B's."""
    from blockscale.ops import _twophase_mx8_ir as IR

    a, b, sfa, sfb, _, _, _ = _extreme_case()
    a, b = a[:, :96], b[:, :96]
    sfa, sfb = sfa.view(np.uint8)[:, :3].copy(), sfb.view(np.uint8)[:, :3].copy()
    sfa[5] = [200, 120, 255]  # spread 80: in
    sfa[6] = [201, 120, 0]  # spread 81 with nonzero data: out
    sfa[7] = 255  # all NaN: bmax 0
    sfb[3] = [10, 250, 91]
    m, n = a.shape[0], b.shape[0]
    dev = _dev()
    _, out = _core.launch_op(MX.FoldSpec(), MX.rows_grid(m, n, MX.FOLD_LANES),
                             (("fold_a", (m,), np.float32), ("fold_b", (n,), np.float32),
                              ("flags", (m + n,), np.int32)),
                             {"a": a, "b": b, "sfa": layouts.interleave(_e8m0(sfa)),
                              "sfb": layouts.interleave(_e8m0(sfb))},
                             {"m": m, "n": n, "k": 96, "shift": -3}, dev)
    fa, flag_a = _fold_model(a, sfa)
    fb, flag_b = _fold_model(b, sfb, -3)
    assert np.array_equal(out["fold_a"].view(np.int32) - IR.FOLD_BIAS, fa)
    assert np.array_equal(out["fold_b"].view(np.int32) - IR.FOLD_BIAS, fb)
    assert np.array_equal(out["flags"], np.concatenate([flag_a, flag_b]))
    assert list(flag_a[:8]) == [1, 0, 0, 0, 0, 0, 1, 0] and flag_b[1] == 1


@pytest.mark.interp
def test_interp_fold_kernel_lanes():
    """K = 1312 (41 K-blocks, 11 scale words over the 8 lanes of a row, the last word
    partly padding): the row maximum and a far block found by any lane (word 9: lane 1;
    word 10: lane 2, its padding bytes ignored)."""
    from blockscale.ops import _twophase_mx8_ir as IR

    m, n, k = 6, 3, 1312
    rng = np.random.default_rng(4)
    a, b, sfa, sfb, _, _ = random_dense_case(rng, MXFP8, m, n, k)
    sfa, sfb = sfa.view(np.uint8).copy(), sfb.view(np.uint8).copy()
    sfa[0, 37] = 220  # the maximum in lane 1's word; the others (124..130) far below
    sfa[1, 40] = 20  # a far block in the last word (lane 2)
    sfa[2, 40], sfa[2, 3] = 255, 230  # NaN byte; maximum in lane 0
    sfb[1, 36] = 0
    b[1, 36 * 32:37 * 32] = _e4m3(np.zeros(32))  # far but all zero: no flag
    dev = _dev()
    _, out = _core.launch_op(MX.FoldSpec(), MX.rows_grid(m, n, MX.FOLD_LANES),
                             (("fold_a", (m,), np.float32), ("fold_b", (n,), np.float32),
                              ("flags", (m + n,), np.int32)),
                             {"a": a, "b": b, "sfa": layouts.interleave(_e8m0(sfa)),
                              "sfb": layouts.interleave(_e8m0(sfb))},
                             {"m": m, "n": n, "k": k, "shift": 5}, dev)
    fa, flag_a = _fold_model(a, sfa)
    fb, flag_b = _fold_model(b, sfb, 5)
    assert np.array_equal(out["fold_a"].view(np.int32) - IR.FOLD_BIAS, fa)
    assert np.array_equal(out["fold_b"].view(np.int32) - IR.FOLD_BIAS, fb)
    assert np.array_equal(out["flags"], np.concatenate([flag_a, flag_b]))
    assert list(flag_a[:3]) == [1, 1, 1] and list(flag_b) == [0, 0, 0]


def test_split_alpha():
    """alpha (an f32 value, as the kernels take it) = m 2^e exactly, |m| in [1, 2) an f32."""
    for x in (1.0, 0.375, -3.0, 2.0 ** -149, 3.4e38, -0.0, 0.0, 1e-30, -1.2e-41):
        alpha = float(np.float32(x))
        m, e = MX.split_alpha(alpha)
        assert m * 2.0 ** e == alpha
        assert alpha == 0 or 1 <= abs(m) < 2
        assert float(np.float32(m)) == m


@pytest.mark.interp
def test_host_validation():
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(0), MXFP8, 4, 4, 64)
    with pytest.raises(ValueError, match="k % 32 == 0"):
        a48, b48 = a[:, :48].copy(), b[:, :48].copy()
        s48a, s48b = (layouts.interleave(_e8m0(np.full((4, 2), 127))) for _ in range(2))
        MX.block_scaled_matmul_twophase_mx8(a48, b48, s48a, s48b, device="interp")
    with pytest.raises(ValueError, match="reserved"):
        MX.block_scaled_matmul_twophase_mx8(a, b, sfa5, sfb5, epilogue=ep.row_scale(MX.FOLD_A),
                                            epilogue_inputs={MX.FOLD_A: np.ones(4, np.float32)},
                                            device="interp")
    with pytest.raises(ValueError, match="alpha"):
        MX.block_scaled_matmul_twophase_mx8(a, b, sfa5, sfb5, alpha=float("inf"),
                                            device="interp")
    with pytest.raises(ValueError, match="bm"):
        MX.block_scaled_matmul_twophase_mx8(a, b, sfa5, sfb5, bm=64, device="interp")
    with pytest.raises(TypeError):
        fp4 = random_dense_case(np.random.default_rng(0), NVFP4, 4, 4, 64)
        MX.block_scaled_matmul_twophase_mx8(fp4[0], fp4[1], fp4[4], fp4[5], device="interp")
    empty = MX.block_scaled_matmul_twophase_mx8(a[:0], b, sfa5[:0], sfb5, device="interp")
    assert empty.shape == (0, 4)
    with pytest.raises(ValueError, match="tile"):
        MX.DequantSpec("mxfp8", "sm_90a", 100)
    with pytest.raises(ValueError, match="fmt"):
        MX.FoldSpec("nvfp4")


def test_dispatch_hook(monkeypatch):
    """On by default (BLOCKSCALE_SM90_TWOPHASE_MX8=0: off): sm_90a MXFP8, K % 32 == 0,
    K <= DISPATCH_MAX_K, M >= MIN_M = 512; registered before the wgmma and mma.sync kernels."""
    from blockscale.ops import matmul_sm90, matmul_wgmma

    m = MX.MIN_M
    assert m == 512  # run U: slower than mma.sync at M = 256
    monkeypatch.delenv(MX.ENV_SWITCH, raising=False)
    assert MX.fast_path("sm_90a", MXFP8, m, 5760, 2944, "bfloat16", None) is not None
    for off in ("0", "false", "off"):
        monkeypatch.setenv(MX.ENV_SWITCH, off)
        assert MX.fast_path("sm_90a", MXFP8, m, 5760, 2944, "bfloat16", None) is None
    monkeypatch.setenv(MX.ENV_SWITCH, "1")
    assert MX.fast_path("sm_90a", MXFP8, m, 5760, 2944, "bfloat16", None) is not None
    for args in (("sm_90a", MXFP8, m - 1, 5760, 2944), ("sm_90a", NVFP4, m, 5760, 2944),
                 ("sm_90a", MXFP8, m, 5760, 2960), ("sm_100a", MXFP8, m, 5760, 2944),
                 ("sm_90a", MXFP8, 1 << 17, 8192, 8192),
                 # accuracy: above DISPATCH_MAX_K the normwise f32 error passed 1e-5 (run AC)
                 ("sm_90a", MXFP8, 777, 2560, MX.DISPATCH_MAX_K + 32),
                 ("sm_90a", MXFP8, 777, 2560, 8192)):
        assert MX.fast_path(*args, "bfloat16", None) is None, args
    assert MX.fast_path("sm_90a", MXFP8, 777, 2560, MX.DISPATCH_MAX_K, "float32", None)
    paths = Mm.FAST_PATHS
    assert paths.index(MX.fast_path) < paths.index(matmul_wgmma.fast_path)
    assert paths.index(MX.fast_path) < paths.index(matmul_sm90.fast_path)
    assert MX.MAX_WORKSPACE_BYTES == TP.MAX_WORKSPACE_BYTES


@pytest.mark.interp
def test_dispatch_runs_the_kernels(monkeypatch):
    """The dense dispatch (MIN_M lowered to this small case) returns the direct call's bytes."""
    m, n, k = 130, 264, 64
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(3), MXFP8, m, n, k)
    monkeypatch.setenv(MX.ENV_SWITCH, "1")
    monkeypatch.setattr(MX, "MIN_M", 100)
    direct = MX.block_scaled_matmul_twophase_mx8(a, b, sfa5, sfb5, alpha=0.5,
                                                 out_dtype="float32", store="staged",
                                                 device="interp")
    got = Mm.block_scaled_matmul(a, b, sfa5, sfb5, MXFP8, alpha=0.5, out_dtype="float32",
                                 device="interp", target="sm_90a")
    np.testing.assert_array_equal(got.view(np.uint32), direct.view(np.uint32))


def test_bundle_specs_cover_the_dispatch(monkeypatch):
    """Every kernel the dispatch launches at the GPU shapes (the benchmark's 8192 x 5760 x
    2944 and M = 512, 1024) is in bundle_specs, for each tile-width choice of the FP4 pair."""
    specs = set(MX.bundle_specs("sm_90a"))
    assert MX.bundle_specs("sm_100a") == []
    choices = [None] + (["auto", "240", "224"] if hasattr(TP, "dispatch_bn") else [])
    for choice in choices:
        if choice is None:
            monkeypatch.delenv("BLOCKSCALE_SM90_TWOPHASE_BN", raising=False)
        else:
            monkeypatch.setenv("BLOCKSCALE_SM90_TWOPHASE_BN", choice)
        for m, n, _ in MX.GPU_SHAPES:
            for out in ("bfloat16", "float32"):
                missing = [s for s in MX.dispatch_specs(m, n, out) if s not in specs]
                assert not missing, (choice, m, n, out, missing)
    names = [s.kernel_name for s in specs]
    assert len(set(names)) == len(names)


LOWER_SPECS = [pytest.param(s, id=s.kernel_name,
                            marks=[] if not isinstance(s, TP.TwophaseMatmulSpec) or s == MX.
                            phase2_spec("bfloat16", store="staged") else [pytest.mark.slow])
               for s in MX.bundle_specs("sm_90a")]


@pytest.mark.lower
@pytest.mark.parametrize("spec", LOWER_SPECS)
def test_kernel_sass(spec):
    """No spills anywhere. Phase 1: four 128-bit loads of E4M3, eight 128-bit stores of bf16,
    32 e4m3x2 -> f16x2 conversions (F2FP...E4M3) a thread, <= 40 registers; phase 2: the
    FP4 pair's HGMMA.64x<bn>x16 K loop with the fold epilogue; fold and fixup: no 128-bit
    stores (scalar outputs)."""
    kernel = MX.kernel(spec) if not isinstance(spec, TP.TwophaseMatmulSpec) else TP.kernel(spec)
    sass, meta = kernel.asm["sass"], kernel.meta
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0
    if isinstance(spec, MX.DequantSpec):
        assert len(re.findall(r"LDG\.E\.128", sass)) == 4
        assert len(re.findall(r"STG\.E\.128", sass)) == 8
        assert len(re.findall(r"F2FP\.F16\.E4M3\.UNPACK_B", sass)) == 32
        assert meta["registers"] <= 40
    elif isinstance(spec, TP.TwophaseMatmulSpec):
        assert len(re.findall(rf"HGMMA\.64x{spec.bn}x16\.F32\.BF16", sass)) == spec.kstep // 16
        assert re.search(r"UBLKCP", sass)
        if getattr(spec.epilogue.fn, "hoist", None) is not None and spec.store == "staged":
            # the warp's fast test (4 + 4 + 4 x 2 shuffles), then the fast loop: round 1's
            # per-element epilogue took ~28 instructions an element (4392 vs 800 without it,
            # bf16 bn256), the fast loop 586 for 128 elements (alpha, fold, pack, STS)
            assert len(re.findall(r"SHFL\.BFLY", sass)) == 16
            lines = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", ln)]
            last = max(i for i, ln in enumerate(lines) if "SHFL.BFLY" in ln)
            start = next(i for i in range(last, len(lines)) if " BRA " in lines[i])
            end = next(i for i in range(start + 1, len(lines)) if re.search(r"\bBRA\b", lines[i]))
            assert end - start <= 5 * spec.bn // 2, end - start  # elements: 64 bn / 128
    else:
        assert not re.search(r"STG\.E\.128|HGMMA", sass)


# ---- GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("shape", MX.GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_gpu_dispatch(shape, out_dtype, monkeypatch):
    """The dispatch runs the five kernels (BLOCKSCALE_SM90_TWOPHASE_MX8=1): the bound on
    sampled rows (the whole output's normwise error too)."""
    m, n, k = shape
    monkeypatch.setenv(MX.ENV_SWITCH, "1")
    rng = np.random.default_rng(m + n)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, MXFP8, m, n, k)
    got = Mm.block_scaled_matmul(a, b, sfa5, sfb5, MXFP8, alpha=ALPHA, out_dtype=out_dtype,
                                 device="cuda")
    rows = np.unique(np.concatenate([np.arange(min(m, 64)), np.arange(max(0, m - 64), m),
                                     rng.integers(0, m, 64)]))
    exact, abs_sum = exact_dense(a, b, sfa, sfb, MXFP8, k, ALPHA, rows)
    if out_dtype == "float32":
        assert_f32_within_bound(got[rows], exact, _bound(abs_sum, k))
    else:
        assert_bf16_consistent(got[rows], exact, _bound(abs_sum, k))


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_gpu_exact_sums_equal_mma(out_dtype, monkeypatch):
    """Where every fp32 sum is exact (K = 2944, scales 2^-1 .. 2^1: sums of multiples of
    2^-4 below 2^16), the HGMMA path with its folds equals the mma.sync kernel's bytes."""
    m, n, k = 1024, 5760, 2944
    a, b, _, _, sfa5, sfb5 = _exact_case(np.random.default_rng(8), m, n, k, spread=1)
    monkeypatch.setenv(MX.ENV_SWITCH, "1")
    got = Mm.block_scaled_matmul(a, b, sfa5, sfb5, MXFP8, alpha=ALPHA, out_dtype=out_dtype,
                                 device="cuda")
    monkeypatch.setenv(MX.ENV_SWITCH, "0")
    want = Mm.block_scaled_matmul(a, b, sfa5, sfb5, MXFP8, alpha=ALPHA, out_dtype=out_dtype,
                                  device="cuda")
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.gpu
@pytest.mark.cuda
def test_gpu_fixup_equals_portable(monkeypatch):
    """A flagged row and column (and NaN rows / columns) on the H200: the portable kernel's
    bytes; the rest within the bound (the crafted rows of the interp test tiled to
    512 x 264 x 128, M = MIN_M)."""
    a, b, sfa, sfb, sfa5, sfb5, k = _extreme_case()
    reps_m, reps_n = 512 // a.shape[0] + 1, 264 // b.shape[0] + 1
    a, sfa = np.tile(a, (reps_m, 1))[:512], np.tile(sfa, (reps_m, 1))[:512]
    b, sfb = np.tile(b, (reps_n, 1))[:264], np.tile(sfb, (reps_n, 1))[:264]
    sfa5, sfb5 = layouts.interleave(sfa), layouts.interleave(sfb)
    monkeypatch.setenv(MX.ENV_SWITCH, "1")
    got = Mm.block_scaled_matmul(a, b, sfa5, sfb5, MXFP8, alpha=ALPHA, out_dtype="float32",
                                 device="cuda")
    want = Mm.naive_block_scaled_matmul(a, b, sfa5, sfb5, MXFP8, alpha=ALPHA,
                                        out_dtype="float32", device="cuda")
    with np.errstate(all="ignore"):
        exact, abs_sum = exact_dense(a, b, sfa, sfb, MXFP8, k, ALPHA)
    rows = [r for r in range(512) if r % 40 == 0]
    cols = [c for c in range(264) if c % 24 == 1]
    _check_against_portable(got, want, exact, _bound(abs_sum, k), rows, cols, "float32")

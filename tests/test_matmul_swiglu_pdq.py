"""The fused SwiGLU op on the grouped producer-dequant kernel (issue #10, ops/matmul_swiglu.py).

Where the chained grouped matmul runs the grouped pdq kernel (``matmul_grouped_wgmma.
PDQ_FORMATS``: NVFP4 and MXFP4 prefill on sm_90a), ``grouped_matmul_swiglu`` runs the same
kernel on the σ-permuted weights with its σ store (``GroupedPdqSpec.sigma_out``), then
``fused_silu_quantize``. interp: the fused op's data and scale bytes equal the chained
path's (pdq matmul on the un-permuted weights, then ``fused_silu_quantize``) on small grouped
shapes with empty groups, expert id -1, groups ending mid-tile and N tails, NVFP4, MXFP4 and
MXFP8 (its flag and fixup kernels around the pdq kernel, the fixup with the σ store),
SILU and SWIGLU_OAI, row scales; the σ store (direct, staged) equals the plain store with
its columns un-permuted. GPU (``make gpu-bundle`` first)::

    BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu -s tests/test_matmul_swiglu_pdq.py
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_matmul_grouped import make_grouped_case
from test_matmul_swiglu import swiglu_case

from blockscale.formats import MXFP4, MXFP8, NVFP4, Format
from blockscale.ops import fused_silu_quantize, grouped_matmul_block_scaled
from blockscale.ops import matmul_grouped_pdq as GP
from blockscale.ops import matmul_grouped_wgmma as gw
from blockscale.ops import matmul_swiglu as SW
from blockscale.ops._staged_store_ir import ENV_SWITCH as STAGED_SWITCH


def _bytes(x: object) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x)).view(np.uint8)


def _unsigma(x: np.ndarray) -> np.ndarray:
    """Columns ``gate | up`` back to the σ order (2i gate i, 2i + 1 up i)."""
    n = x.shape[1]
    out = np.empty_like(x)
    out[:, 0::2], out[:, 1::2] = x[:, :n // 2], x[:, n // 2:]
    return out


def _spy(monkeypatch) -> list:
    """Record the spec of every grouped pdq and grouped wgmma launch."""
    specs = []
    for mod in (GP, gw):
        def spy(spec, *args, _launch=mod.launch, **kw):
            specs.append(spec)
            return _launch(spec, *args, **kw)
        monkeypatch.setattr(mod, "launch", spy)
    return specs


def fused_and_chained(case: dict, fmt: Format, k: int, act: str, device: str,
                      rows: np.ndarray | None = None) -> tuple:
    """(fused data, fused scales, chained data, chained scales) of ``case`` (swiglu_case)."""
    grp = (case["expert_start"], case["a_scale_offsets"], case["expert_ids"])
    e_count = case["weight"].shape[0]
    esc = np.linspace(1.25, 2.0, e_count).astype(np.float32) if fmt is NVFP4 else None
    isc = np.linspace(0.25, 0.75, e_count).astype(np.float32) if fmt is NVFP4 else None
    data, scales = SW.grouped_matmul_swiglu(case["hidden"], case["w_sigma"], case["a_scales"],
                                            case["sfb_sigma"], *grp, esc, isc, fmt, k=k,
                                            activation=act, a_row_scales=rows, device=device,
                                            target="sm_90a")
    gate_up = grouped_matmul_block_scaled(case["hidden"], case["weight"], case["a_scales"],
                                          case["b_scales"], *grp, esc, fmt, k=k,
                                          a_row_scales=rows, device=device, target="sm_90a")
    c_data, c_scales = fused_silu_quantize(gate_up, fmt, *grp, isc, activation=act,
                                           num_scale_tiles=case["a_scales"].shape[0],
                                           device=device, target="sm_90a")
    return data, scales, c_data, c_scales


#: (fmt, counts, expert ids, E, D, K, activation, row scales, staged store on)
CASES = [
    (NVFP4, [65, 0, 3, 70], [1, 0, -1, 2], 3, 40, 128, "silu", False, True),
    (NVFP4, [0, 30, 1, 20], [-1, 2, -1, 0], 3, 24, 64, "swiglu_oai", True, True),
    (MXFP4, [130, 5], [1, -1], 2, 16, 96, "swiglu_oai", False, True),
    (MXFP4, [17, 0, 12], [1, -1, 0], 2, 136, 64, "silu", False, True),  # 2 column tiles
    (NVFP4, [17, 0, 12], [1, -1, 0], 2, 12, 64, "silu", True, True),  # N % 16 = 8: direct σ
    (NVFP4, [65, 129], [0, 1], 2, 16, 64, "swiglu_oai", False, False),  # direct stores
    (MXFP8, [130, 0, 5], [1, -1, 0], 2, 16, 96, "silu", False, True),  # MXFP8: 192 x 192
    (MXFP8, [17, 0, 12], [1, -1, 0], 2, 136, 64, "swiglu_oai", False, True),  # skip items
    # >= 80 rows a group: the band split (150 rows: a 192 x 192 item; 100: a skip item)
    (NVFP4, [150, 100], [1, 0], 2, 16, 64, "swiglu_oai", True, True),
    (MXFP4, [100, 0, 150], [1, -1, 0], 2, 16, 64, "silu", False, True),
]


@pytest.mark.interp
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].name}-{len(c[1])}g-d{c[4]}-k{c[5]}"
                         f"-{c[6]}-rs{int(c[7])}-{'st' if c[8] else 'direct'}")
def test_fused_equals_chained(monkeypatch, case):
    """Through the dispatch (MIN_ROWS lowered; a group of > 16 rows: not the decode
    kernel): the fused op launches the σ pdq plan of
    ``dispatch_plan`` (the band split from 80 rows a group), the chained matmul the plain one;
    data and scale bytes equal."""
    fmt, counts, ids, e_count, d, k, act, with_rows, staged = case
    monkeypatch.setattr(gw, "MIN_ROWS", 1)
    if not staged:
        monkeypatch.setenv(STAGED_SWITCH, "0")
    specs = _spy(monkeypatch)
    sc = swiglu_case(fmt, counts, ids, e_count, d, k, seed=len(counts) + d + k)
    t = sum(counts)
    rows = np.random.default_rng(d).uniform(0.5, 2, t).astype(ml_dtypes.bfloat16) \
        if with_rows else None
    data, scales, c_data, c_scales = fused_and_chained(sc, fmt, k, act, "interp", rows)
    assert np.array_equal(_bytes(data), _bytes(c_data))
    assert np.array_equal(_bytes(scales), _bytes(c_scales))
    n, rpg = 2 * d, t / len(counts)  # the dispatch's routed rows a group
    want = [GP.dispatch_plan(fmt, n, with_rows, "sm_90a", "interp", True, rpg),
            GP.dispatch_plan(fmt, n, with_rows, "sm_90a", "interp", False, rpg)]
    assert specs == want
    split = staged and rpg >= GP.TRI_MIN_GROUP_ROWS and fmt.name in GP.BAND_FORMATS
    assert [len(p) for p in specs] == [2 if split else 1] * 2
    assert [p[0].store for p in specs] == ["staged" if staged and n % 16 == 0 else "direct",
                                        "staged" if staged else "direct"]
    es = sc["expert_start"]
    for g, e in enumerate(ids):  # expert id -1: zero data rows (D8)
        if e < 0:
            assert not np.any(_bytes(data)[es[g]:es[g + 1]])


@pytest.mark.interp
def test_fused_wgmma_switch(monkeypatch):
    """BLOCKSCALE_SM90_GROUPED_PDQ=0: both paths run the grouped wgmma kernel (the old
    dispatch), still byte-equal."""
    monkeypatch.setattr(gw, "MIN_ROWS", 1)
    monkeypatch.setenv(gw.PDQ_ENV_SWITCH, "0")
    specs = _spy(monkeypatch)
    sc = swiglu_case(NVFP4, [17, 0, 9], [1, -1, 0], 2, 16, 64, seed=3)
    data, scales, c_data, c_scales = fused_and_chained(sc, NVFP4, 64, "silu", "interp")
    assert np.array_equal(_bytes(data), _bytes(c_data))
    assert np.array_equal(_bytes(scales), _bytes(c_scales))
    assert [(type(s), s.sigma_out) for s in specs] == [(gw.GroupedWgmmaSpec, True),
                                                       (gw.GroupedWgmmaSpec, False)]


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    (NVFP4, [0, 3, 1, 2], [-1, 2, -1, 0], 3, 48, 128, "split", "staged", True),
    (MXFP4, [65, 129, 257], [0, 1, 2], 3, 272, 64, "lockstep", "staged", False),
    (NVFP4, [65, 129, 7], [0, -1, 2], 3, 40, 96, "lockstep", "direct", True),
], ids=lambda c: f"{c[0].name}-n{c[4]}-k{c[5]}-{c[6]}-{c[7]}-rs{int(c[8])}")
def test_sigma_store(case):
    """The σ store writes the plain store's values at the un-permuted columns (partial
    column tiles, rows past a group's end, unused groups, row scales)."""
    fmt, counts, ids, e_count, n, k, loop, store, with_rows = case
    rng = np.random.default_rng(n + k)
    c, _, _ = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
    esc = (1 + np.arange(e_count) / e_count).astype(np.float32)
    rows = rng.uniform(0.5, 2, sum(counts)).astype(ml_dtypes.bfloat16) if with_rows else None
    kw = {"expert_scales": esc, "fmt": fmt, "k": k, "a_row_scales": rows, "prefetch": True,
          "loop": loop, "store": store, "device": "interp"}
    plain = GP.grouped_matmul_block_scaled_pdq(**c, **kw)
    sigma = GP.grouped_matmul_block_scaled_pdq(**c, sigma_out=True, **kw)
    assert np.array_equal(plain.view(np.uint16), _unsigma(sigma).view(np.uint16))


@pytest.mark.interp
def test_sigma_checks():
    spec = GP.GroupedPdqSpec("nvfp4", prefetch=True, store="staged", sigma_out=True)
    assert spec.kernel_name == "bs_grouped_pdq_nvfp4_128x256_k64_s4_pf_st_sigma"
    with pytest.raises(TypeError, match="sigma_out"):
        GP.GroupedPdqSpec("nvfp4", sigma_out=1)
    c, _, _ = make_grouped_case(np.random.default_rng(0), NVFP4, [4, 4], [0, 1], 2, 24, 64)
    with pytest.raises(ValueError, match="n=24"):  # 24-byte halves: no bulk copies
        GP.grouped_matmul_block_scaled_pdq(**c, expert_scales=np.ones(2, np.float32),
                                           fmt=NVFP4, k=64, store="staged", sigma_out=True,
                                           device="interp")
    assert GP.dispatch_spec(NVFP4, 24, False, "sm_90a", "interp", True).store == "direct"
    assert GP.dispatch_spec(NVFP4, 5760, True, "sm_90a", "interp", True).loop == "lockstep"


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("act", ["silu", "swiglu_oai"])
def test_gpu_gpt_oss(fmt, act, monkeypatch):
    """gpt-oss-120b gate_up (E=128, top-4, D=2880, K=2880) at T=1024 tokens, unused experts
    included: fused (σ pdq + fused_silu_quantize) == chained (pdq + fused_silu_quantize)
    byte for byte on the H200, both through the dispatch."""
    f = Format.from_name(fmt)
    rng = np.random.default_rng(9)
    counts = list(rng.multinomial(4096, np.full(128, 1 / 128)))
    ids = [e if c else -1 for e, c in enumerate(counts)]
    specs = _spy(monkeypatch)
    sc = swiglu_case(f, counts, ids, 128, 2880, 2880, seed=4)
    data, scales, c_data, c_scales = fused_and_chained(sc, f, 2880, act, "cuda")
    assert [(type(p[0]), p[0].sigma_out, p[0].store, p[0].loop) for p in specs] == \
        [(GP.GroupedPdqSpec, True, "staged", "split"), (GP.GroupedPdqSpec, False, "staged",
                                                        "split")]
    np.testing.assert_array_equal(_bytes(data), _bytes(c_data), err_msg="data")
    np.testing.assert_array_equal(_bytes(scales), _bytes(c_scales), err_msg="scales")


@pytest.mark.interp
@pytest.mark.parametrize("case", [pytest.param(CASES[0] + (128, False), marks=pytest.mark.slow),
                                  CASES[5] + (128, False), CASES[2] + (128, True),
                                  CASES[0] + (256, False), CASES[2] + (256, False),
                                  CASES[2] + (192, False)],
                         ids=lambda c: f"{c[0].name}-{len(c[1])}g-d{c[4]}-k{c[5]}-{c[6]}"
                         f"-{'st' if c[8] else 'direct'}-bm{c[9]}{'-skip' if c[10] else ''}")
def test_fused_equals_chained_workspace(monkeypatch, case):
    """The dispatch with A from the grouped phase-1 workspace
    (``BLOCKSCALE_SM90_GROUPED_PDQ_A=workspace``; ``BLOCKSCALE_SM90_GROUPED_PDQ_BM=256`` /
    ``192``: 256 x 128 / 192 x 192 items; ``BLOCKSCALE_SM90_GROUPED_PDQ_SKIP=1``: 128-row items skipping idle
    warpgroups): the fused op runs the σ workspace spec, the chained matmul the plain one;
    data and scale bytes equal each other and the packed-A dispatch's."""
    fmt, counts, ids, e_count, d, k, act, with_rows, staged, bm, skip = case
    monkeypatch.setenv(GP.BM_ENV, str(bm))
    monkeypatch.setenv(GP.SKIP_ENV, "1" if skip else "0")
    monkeypatch.setattr(gw, "MIN_ROWS", 1)
    if not staged:
        monkeypatch.setenv(STAGED_SWITCH, "0")
    sc = swiglu_case(fmt, counts, ids, e_count, d, k, seed=len(counts) + d + k)
    t = sum(counts)
    rows = np.random.default_rng(d).uniform(0.5, 2, t).astype(ml_dtypes.bfloat16) \
        if with_rows else None
    monkeypatch.setenv(GP.A_SOURCE_ENV, "packed")
    packed = fused_and_chained(sc, fmt, k, act, "interp", rows)
    monkeypatch.setenv(GP.A_SOURCE_ENV, "workspace")
    specs = _spy(monkeypatch)
    ws = fused_and_chained(sc, fmt, k, act, "interp", rows)
    assert [(p[0].a_source, p[0].sigma_out, p[0].bm, p[0].skip, len(p)) for p in specs] == [
        ("workspace", True, bm, skip, 1), ("workspace", False, bm, skip, 1)]
    for got, want in zip(ws, packed, strict=True):
        assert np.array_equal(_bytes(got), _bytes(want))
    assert np.array_equal(_bytes(ws[0]), _bytes(ws[2]))
    assert np.array_equal(_bytes(ws[1]), _bytes(ws[3]))


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("bm,skip", [(128, False), (128, True), (256, False), (192, False)],
                         ids=["bm128", "bm128-skip", "bm256", "bm192"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gpu_gpt_oss_workspace(fmt, bm, skip, monkeypatch):
    """gpt-oss-120b gate_up at T=1024 with A from the grouped phase-1 workspace
    (BLOCKSCALE_SM90_GROUPED_PDQ_A=workspace; BLOCKSCALE_SM90_GROUPED_PDQ_BM: 128 x 256 or
    256 x 128 items): fused == chained byte for byte on the H200, and equal to the packed-A
    dispatch's bytes."""
    monkeypatch.setenv(GP.BM_ENV, str(bm))
    monkeypatch.setenv(GP.SKIP_ENV, "1" if skip else "0")
    monkeypatch.setenv(GP.A_SOURCE_ENV, "packed")
    f = Format.from_name(fmt)
    rng = np.random.default_rng(9)
    counts = list(rng.multinomial(4096, np.full(128, 1 / 128)))
    ids = [e if c else -1 for e, c in enumerate(counts)]
    sc = swiglu_case(f, counts, ids, 128, 2880, 2880, seed=4)
    packed = fused_and_chained(sc, f, 2880, "silu", "cuda")
    monkeypatch.setenv(GP.A_SOURCE_ENV, "workspace")
    specs = _spy(monkeypatch)
    ws = fused_and_chained(sc, f, 2880, "silu", "cuda")
    assert [(p[0].a_source, p[0].sigma_out, p[0].store, p[0].loop, p[0].bm, p[0].skip)
            for p in specs] == \
        [("workspace", True, "staged", "split", bm, skip),
         ("workspace", False, "staged", "split", bm, skip)]
    for name, got, want in zip(("data", "scales", "chained data", "chained scales"), ws, packed,
                               strict=True):
        np.testing.assert_array_equal(_bytes(got), _bytes(want), err_msg=name)

"""The sm_90a grouped wgmma matmul (ops/matmul_grouped_wgmma.py): interpreter and lowering.

* interp: the kernel IR run by the numpy interpreter (wgmma modeled from the PTX ISA) on
  MAX's grouped cases at small N / K (unused groups, groups spanning several row tiles,
  N and K tails), against the exact float64 grouped value within the stated fp32 bound
  (MXFP4 "fold": J more roundings) and, for NVFP4 (one rounding per block in the model), the
  portable grouped kernel bit for bit; the dispatch and the fused SwiGLU op's chained path.
* lower: ptxas / SASS of the dispatch's specs (HGMMA per step, no spills).
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from test_matmul_common import assert_bf16_consistent, f32_error_bound
from test_matmul_grouped import exact_grouped, make_grouped_case
from test_matmul_swiglu import swiglu_case

from blockscale.formats import MXFP4, MXFP8, NVFP4
from blockscale.ops import fused_silu_quantize, grouped_matmul_block_scaled
from blockscale.ops import matmul_grouped as mg
from blockscale.ops import matmul_grouped_sm90 as gs
from blockscale.ops import matmul_grouped_wgmma as gw
from blockscale.ops import matmul_swiglu as SW

#: (counts, expert ids, E, N, K): MAX's grouped cases at small N / K, plus tails
CASES = [
    ([0, 3, 1, 2], [-1, 2, -1, 0], 3, 40, 128),
    ([65, 129, 257], [0, 1, 2], 3, 24, 96),
    ([2, 2, 2, 2], [3, 1, 0, 2], 4, 16, 64),
    ([128, 256, 5], [1, -1, 0], 2, 72, 160),
    # 70 groups (three 32-group chunks of the warp-parallel scan), empty and unused ones, a
    # 2-tile group in the last chunk
    ([130 if g == 66 else (7 * g) % 5 for g in range(70)],
     [-1 if g % 9 == 4 else g % 8 for g in range(70)], 8, 16, 64),
    # 300 groups (three rounds of find_tile's loads), mostly empty: rows in three rounds, a
    # 2-tile group and an unused one in the third
    ([{3: 5, 40: 1, 255: 9, 256: 3, 290: 140, 297: 6}.get(g, 0) for g in range(300)],
     [-1 if g == 297 else g % 4 for g in range(300)], 4, 16, 64),
]


def _run_case(fmt, case_id, tiles, rows=False, variant=(None, None, None)):
    counts, ids, e_count, n, k = CASES[case_id]
    rng = np.random.default_rng(200 + case_id)
    case, row_scales, w_scales = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
    esc = (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)
    rs = rng.uniform(0.5, 2, sum(counts)).astype(ml_dtypes.bfloat16) if rows else None
    dq, ks, sc = variant
    out = gw.grouped_matmul_block_scaled_wgmma(**case, expert_scales=esc, fmt=fmt, k=k,
                                               a_row_scales=rs, tiles=tiles, dequant=dq,
                                               kstep=ks, scaling=sc, device="interp")
    assert out.dtype == ml_dtypes.bfloat16 and out.shape == (sum(counts), n)
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, fmt, k, esc, rs)
    spec = gw.GroupedWgmmaSpec(fmt.name, rows, *tiles, "sm_90a", dq, ks, sc)
    extra = fmt.kblocks(k) if spec.scaling == "fold" and fmt.is_mx else 0
    assert_bf16_consistent(out, exact, f32_error_bound(abs_sum, fmt, k,
                                                       n_mul=(2 if rows else 1) + extra))
    es = case["expert_start"].astype(np.int64)
    for g, e in enumerate(ids):  # rows of unused groups: zeros (D8)
        if e < 0:
            assert not np.any(out[es[g]:es[g + 1]].view(np.uint16))
    return case, esc, rs, k, out


@pytest.mark.interp
@pytest.mark.parametrize("tiles", gw.TILE_CHOICES, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("case_id", range(len(CASES)))
@pytest.mark.parametrize("fmt", [NVFP4, MXFP4], ids=lambda f: f.name)
def test_interp_matches_exact(fmt, case_id, tiles):
    case, esc, _, k, out = _run_case(fmt, case_id, tiles)
    if fmt is NVFP4:  # one exact block sum + one RNE per block: the portable kernel's value
        want = mg.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=fmt, k=k,
                                              device="interp", target="sm_100a")
        assert np.array_equal(out.view(np.uint16), want.view(np.uint16))


@pytest.mark.interp
@pytest.mark.parametrize("variant", [("lut", 32, "fold"), ("shift", 32, "fold"),
                                     ("lut", 64, "fold")], ids=lambda v: f"{v[0]}-k{v[1]}")
def test_interp_nvfp4_variants_and_row_scales(variant):
    case, esc, rs, k, out = _run_case(NVFP4, 1, (128, 128), rows=True, variant=variant)
    want = mg.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=NVFP4, k=k,
                                          a_row_scales=rs, device="interp", target="sm_100a")
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))


@pytest.mark.interp
@pytest.mark.parametrize("variant", [("lut", 32, "promote"), ("lut", 32, "fold")],
                         ids=lambda v: f"{v[2]}-k{v[1]}")
def test_interp_mxfp4_variants(variant):
    _run_case(MXFP4, 3, (128, 128), variant=variant)


@pytest.mark.interp
def test_dispatch(monkeypatch):
    paths = mg.FAST_PATHS
    assert paths.index(gw.fast_path) < paths.index(gs.fast_path)
    t = gw.MIN_ROWS
    assert gw.fast_path("sm_90a", NVFP4, t, 64, 128, 4, False) is not None
    assert gw.fast_path("sm_90a", MXFP4, t, 64, 128, 4, False) is not None
    # MXFP8: only through the grouped pdq kernel (tests/test_matmul_grouped_pdq_mx8.py)
    assert gw.fast_path("sm_90a", MXFP8, t, 64, 128, 4, False) is not None
    for args in (("sm_90a", NVFP4, t - 1, 64, 128), ("sm_90a", MXFP8, t - 1, 64, 128),
                 ("sm_90a", NVFP4, t, 64, 112), ("sm_100a", NVFP4, t, 64, 128),
                 ("sm_90a", NVFP4, t, 0, 128)):
        assert gw.fast_path(*args, 4, False) is None
    monkeypatch.setenv(gw.PDQ_ENV_SWITCH, "0")
    assert gw.fast_path("sm_90a", MXFP8, t, 64, 128, 4, False) is None
    monkeypatch.delenv(gw.PDQ_ENV_SWITCH)
    monkeypatch.setenv(gw.ENV_SWITCH, "0")
    assert gw.fast_path("sm_90a", NVFP4, t, 64, 128, 4, False) is None
    monkeypatch.delenv(gw.ENV_SWITCH)
    # the op takes this kernel (MIN_ROWS lowered): it is launched, with the dispatch's spec,
    # and gives the direct call's bytes; MXFP4 (PDQ_FORMATS) runs the producer-dequant kernel
    # instead, with the same bytes
    monkeypatch.setattr(gw, "MIN_ROWS", 1)
    specs = _spy_launches(monkeypatch)
    counts, ids, e_count, n, k = CASES[3]
    for fmt in (NVFP4, MXFP4):
        case, _, _ = make_grouped_case(np.random.default_rng(7), fmt, counts, ids, e_count, n, k)
        esc = np.linspace(0.5, 2.0, e_count).astype(np.float32) if fmt is NVFP4 else None
        specs.clear()
        got = grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=fmt, k=k,
                                          device="interp", target="sm_90a")
        spec = gw.spec_for(fmt, sum(counts), n, len(counts))
        direct = gw.grouped_matmul_block_scaled_wgmma(**case, expert_scales=esc, fmt=fmt, k=k,
                                                      tiles=(spec.bm, spec.bn), device="interp")
        assert specs == ([] if fmt.name in gw.PDQ_FORMATS else [spec]) + [spec]
        assert np.array_equal(got.view(np.uint16), direct.view(np.uint16))


def _spy_launches(monkeypatch) -> list:
    """Record the spec of every launch of the grouped wgmma kernel."""
    specs, launch = [], gw.launch

    def spy(spec, *args, **kw):
        specs.append(spec)
        return launch(spec, *args, **kw)
    monkeypatch.setattr(gw, "launch", spy)
    return specs


@pytest.mark.interp
@pytest.mark.parametrize("fmt,rows", [(NVFP4, False), (NVFP4, True), (MXFP4, False)],
                         ids=["nvfp4", "nvfp4-rows-oai", "mxfp4"])
@pytest.mark.parametrize("pdq", [True, False], ids=["pdq", "wgmma"])
def test_fused_swiglu_equals_chained(monkeypatch, fmt, rows, pdq):
    """Where the chained matmul runs this kernel, the fused op runs it too (σ output store,
    then fused_silu_quantize): byte-identical (with a_row_scales and SwiGLU-OAI too); with
    the producer-dequant kernel on (PDQ_FORMATS) both run that instead."""
    if not pdq:
        monkeypatch.setenv(gw.PDQ_ENV_SWITCH, "0")
    monkeypatch.setattr(gw, "MIN_ROWS", 1)
    specs = _spy_launches(monkeypatch)
    counts, ids, e_count, d, k = [65, 0, 3, 70], [1, 0, -1, 2], 3, 40, 128
    case = swiglu_case(fmt, counts, ids, e_count, d, k, seed=11)
    es = case["expert_start"]
    assert SW.chained_mainloop("sm_90a", fmt, int(es[-1]), 2 * d, k, len(counts), es) == \
        "wgmma"
    grp = (case["expert_start"], case["a_scale_offsets"], case["expert_ids"])
    esc = np.array([1.25, 1.5, 2.0], np.float32) if fmt is NVFP4 else None
    isc = np.array([0.5, 0.25, 0.75], np.float32) if fmt is NVFP4 else None
    tiles = case["a_scales"].shape[0]
    rs = np.random.default_rng(3).uniform(0.5, 2, int(es[-1])).astype(ml_dtypes.bfloat16) \
        if rows else None
    act = "swiglu_oai" if rows else "silu"
    data, scales = SW.grouped_matmul_swiglu(case["hidden"], case["w_sigma"], case["a_scales"],
                                            case["sfb_sigma"], *grp, esc, isc, fmt, k=k,
                                            activation=act, a_row_scales=rs, device="interp",
                                            target="sm_90a")
    gate_up = grouped_matmul_block_scaled(case["hidden"], case["weight"], case["a_scales"],
                                          case["b_scales"], *grp, esc, fmt, k=k,
                                          a_row_scales=rs, device="interp", target="sm_90a")
    # fused (σ store), then chained; none with the producer-dequant kernel
    assert [(s.sigma_out, s.row_scales) for s in specs] == \
        ([] if gw.uses_pdq(fmt) else [(True, rows), (False, rows)])
    c_data, c_scales = fused_silu_quantize(gate_up, fmt, *grp, isc, activation=act,
                                           num_scale_tiles=tiles, device="interp",
                                           target="sm_90a")
    assert np.array_equal(np.asarray(data).view(np.uint8), np.asarray(c_data).view(np.uint8))
    assert np.array_equal(np.asarray(scales).view(np.uint8),
                          np.asarray(c_scales).view(np.uint8))


def test_spec_checks():
    for bad in ({"fmt": "mxfp8"}, {"fmt": "nvfp4", "bm": 64, "bn": 128},
                {"fmt": "mxfp4", "row_scales": True}, {"fmt": "nvfp4", "dequant": "cvt"},
                {"fmt": "nvfp4", "target": "sm_100a"}):
        with pytest.raises(ValueError):
            gw.GroupedWgmmaSpec(**bad)
    with pytest.raises(TypeError):
        gw.GroupedWgmmaSpec("nvfp4", row_scales=1)
    spec = gw.GroupedWgmmaSpec("nvfp4", bm=128, bn=256)
    assert (spec.dequant, spec.scaling, spec.kstep) == ("shift", "fold", 64)
    assert spec.block == (256, 1, 1) and spec.dynamic_shared_bytes == spec.dense.shared_bytes
    assert gw.GroupedWgmmaSpec("mxfp4", bm=64, bn=256).block == (128, 1, 1)
    assert gw.grid(spec, 1000, 5760, 128) == (23, 8 + 128, 1)
    assert gw.choose_tiles(16384, 5760, 128) == (128, 256)
    assert gw.choose_tiles(1024, 256, 4) == (128, 128)
    assert gw.bundle_specs("sm_100a") == []
    names = {s.kernel_name for s in gw.bundle_specs()}
    assert gw.spec_for(NVFP4, 16384, 5760, 128, True).kernel_name in names
    assert gw.spec_for(NVFP4, 1920, 4096, 4, False, sigma_out=True).kernel_name in names
    counts, ids, e_count, n, k = CASES[2]
    case, _, _ = make_grouped_case(np.random.default_rng(0), NVFP4, counts, ids, e_count, n, k)
    with pytest.raises(ValueError, match="fmt"):
        gw.grouped_matmul_block_scaled_wgmma(**case, expert_scales=np.ones(4, np.float32),
                                             fmt="mxfp8", device="interp")


#: registers ptxas may give the kernel (measured: 128-171 at 128 x 128, 243-255 at bn = 256)
MAX_REGISTERS = {128: 176, 256: 255}


@pytest.mark.lower
@pytest.mark.parametrize("spec", [gw.spec_for(NVFP4, 16384, 5760, 128, True),
                                  gw.spec_for(MXFP4, 16384, 5760, 128),
                                  gw.spec_for(NVFP4, 1920, 2048, 4),
                                  gw.spec_for(NVFP4, 1920, 4096, 4, sigma_out=True),
                                  gw.GroupedWgmmaSpec("nvfp4", False, 64, 256),
                                  gw.GroupedWgmmaSpec("mxfp4", False, 64, 256)],
                         ids=lambda s: s.kernel_name)
def test_kernel_sass(spec):
    kernel = gw.kernel(spec)
    sass, meta = kernel.asm["sass"], kernel.meta
    assert len(re.findall(rf"HGMMA\.64x{spec.bn}x16\.F32\.BF16", sass)) == spec.kstep // 16
    assert "WARPGROUP.ARRIVE" in sass and "FENCE.VIEW.ASYNC.S" in sass and "HMMA" not in sass
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0
    assert meta["registers"] <= MAX_REGISTERS[spec.bn]
    if spec.dynamic_shared_bytes:
        assert meta["dynamic_shared_bytes"] == spec.dynamic_shared_bytes

"""The grouped sm_90a MXFP8 prefill (ops/matmul_grouped_pdq_mx8.py, ops/matmul_grouped_pdq.py
with fmt "mxfp8"; issue #10).

* interp: MAX's grouped cases at small N / K (unused groups, groups over several row tiles,
  empty groups, N and K tails), A packed and from the grouped phase-1 workspace, the
  192 x 192 and 128-row skip items of the dispatch: within the stated fp32 bound of the
  exact grouped value (bf16 operands exact inside the window, fp32 wgmma sums), expert id
  -1 rows zeros. Scales outside the window: the flag kernel's flags equal a numpy model of
  the rule, the flagged rows of A (rows of C) and of B (the columns of their expert's groups)
  are bit-identical to the portable grouped kernel; zero blocks with such scales are not
  flagged and stay exact; 0xFF scales give NaN where the portable kernel does.
* gpu: ``make gpu-bundle``, then ``BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu
  tests/test_matmul_grouped_pdq_mx8.py``: gpt-oss gate_up at T=1024 through the dispatch,
  within the bound, and a flagged case bit-equal to the portable kernel there.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_matmul_common import assert_bf16_consistent, f32_error_bound
from test_matmul_grouped import exact_grouped, make_grouped_case
from test_matmul_grouped_wgmma import CASES

from blockscale import layouts
from blockscale.formats import MXFP8
from blockscale.ops import grouped_matmul_block_scaled
from blockscale.ops import matmul_grouped as G
from blockscale.ops import matmul_grouped_pdq as GP
from blockscale.ops import matmul_grouped_pdq_mx8 as MX8
from blockscale.ops import matmul_grouped_wgmma as gw


def _esc(e_count):
    return (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)


def _check_bound(out, case, rows, w_scales, k, esc, mask=None):
    exact, abs_sum = exact_grouped(case, rows, w_scales, MXFP8, k, esc)
    bound = f32_error_bound(abs_sum, MXFP8, k, n_mul=1 + MXFP8.kblocks(k))
    if mask is not None:
        out, exact, bound = out[mask], exact[mask], bound[mask]
    assert_bf16_consistent(out, exact, bound)


def _zeros_of_unused(out, case, ids):
    es = case["expert_start"].astype(np.int64)
    for g, e in enumerate(ids):
        if e < 0:
            assert not np.any(out[es[g]:es[g + 1]].view(np.uint16))


@pytest.mark.interp
@pytest.mark.parametrize("case_id", range(len(CASES)))
@pytest.mark.parametrize("variant", [
    {"a_source": "packed"},
    {"a_source": "workspace", "store": "staged", "skip": True},
    {"a_source": "workspace", "store": "staged", "skip": True, "coalesce": True},
], ids=["packed", "ws-skip", "ws-skip-co"])
def test_interp_cases(case_id, variant):
    counts, ids, e_count, n, k = CASES[case_id]
    if variant.get("store") == "staged" and n % 8:
        pytest.skip("the staged store needs n % 8 == 0 (a direct store covers it)")
    rng = np.random.default_rng(40 + case_id)
    case, rows, w_scales = make_grouped_case(rng, MXFP8, counts, ids, e_count, n, k)
    esc = _esc(e_count)
    out = GP.grouped_matmul_block_scaled_pdq(**case, expert_scales=esc, fmt=MXFP8, k=k,
                                             prefetch=True, loop="lockstep", device="interp",
                                             **variant)
    _check_bound(out, case, rows, w_scales, k, esc)
    _zeros_of_unused(out, case, ids)


@pytest.mark.interp
@pytest.mark.parametrize("depth,coalesce", [(1, False), (2, False), (1, True)])
def test_interp_tri_items(depth, coalesce):
    """The 192 x 192 items (three consumer warpgroups, A from two workspace tiles), prefetch
    distance 1 and 2, and the warp-coalesced producer loads (16-element quarters)."""
    counts, ids, e_count, n, k = [200, 0, 70], [1, -1, 0], 2, 208, 96
    case, rows, w_scales = make_grouped_case(np.random.default_rng(5), MXFP8, counts, ids,
                                             e_count, n, k)
    esc = _esc(e_count)
    out = GP.grouped_matmul_block_scaled_pdq(**case, expert_scales=esc, fmt=MXFP8, k=k,
                                             prefetch=True, loop="lockstep", store="staged",
                                             a_source="workspace", bm=192, bn=GP.TRI_BN,
                                             depth=depth, coalesce=coalesce, device="interp")
    _check_bound(out, case, rows, w_scales, k, esc)
    _zeros_of_unused(out, case, ids)


def _set_scale(case, key, row, block, byte):
    """Set the 5-D / 6-D scale byte of (scale row, K-block) (``key`` b_scales: row = (e, n))."""
    v = np.ascontiguousarray(case[key]).view(np.uint8)
    if key == "a_scales":
        flat = v.reshape(-1)
        d1 = v.shape[1]
        flat[layouts_offset(row, block, d1)] = byte
    else:
        e, n = row
        flat = v[e].reshape(-1)
        flat[layouts_offset(n, block, v.shape[2])] = byte
    case[key] = v.view(case[key].dtype)


def layouts_offset(r, j, d1):
    """The 5-D byte offset of (row r, K-block j) with d1 K-groups (SEMANTICS §1.3)."""
    return (r // 128) * d1 * 512 + (j // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + j % 4


def _deinterleave(s5, kblocks):
    """5-D scale bytes -> ``[tiles * 128, kblocks]`` uint8."""
    v = np.ascontiguousarray(s5).view(np.uint8)
    return layouts.deinterleave(v, v.shape[0] * 128, kblocks)


def _scale_rows(case, k):
    """(A scales per routed row, B scales per expert) ``[rows, kblocks]`` as stored."""
    es = case["expert_start"].astype(np.int64)
    sa = _deinterleave(case["a_scales"], k // 32)
    a_rows = np.zeros((int(es[-1]), k // 32), np.uint8)
    for g in range(len(es) - 1):
        r0 = (es[g] // 128 + int(case["a_scale_offsets"][g])) * 128
        a_rows[es[g]:es[g + 1]] = sa[r0:r0 + es[g + 1] - es[g]]
    n = case["weight"].shape[1]
    w = [_deinterleave(s, k // 32)[:n].view(MXFP8.scale_dtype) for s in case["b_scales"]]
    return a_rows.view(MXFP8.scale_dtype), w


def _flag_model(case, k):
    """The flag rule in numpy: rows of A (in a used group) and of B with a block whose scale
    exponent lies outside [WINDOW_LO, WINDOW_HI] (not 0xFF) and a nonzero-magnitude code."""
    from blockscale.ops._mx8_window_ir import WINDOW_HI, WINDOW_LO  # (imports MLIR)

    es = case["expert_start"].astype(np.int64)
    ids = case["expert_ids"]
    offs = case["a_scale_offsets"].astype(np.int64)
    kb = k // 32
    a = np.ascontiguousarray(case["hidden"]).view(np.uint8)
    w = np.ascontiguousarray(case["weight"]).view(np.uint8)
    sa = _deinterleave(case["a_scales"], kb)
    sb = [_deinterleave(s, kb) for s in case["b_scales"]]

    def bad(scale, data):
        s = scale.astype(np.int64) - 127
        out = ((s < WINDOW_LO) | (s > WINDOW_HI)) & (scale != 0xFF)
        nz = (data.reshape(-1, kb, 32) & 0x7F).any(axis=2)
        return (out[:, :kb] & nz).any(axis=1)

    fa = np.zeros(a.shape[0], np.int32)
    for g, e in enumerate(ids):
        if e < 0 or es[g] == es[g + 1]:
            continue
        r0 = (es[g] // 128 + offs[g]) * 128
        rows = slice(r0, r0 + es[g + 1] - es[g])
        fa[es[g]:es[g + 1]] = bad(sa[rows], a[es[g]:es[g + 1]])
    fb = np.concatenate([bad(sb[e][:w.shape[1]], w[e]) for e in range(w.shape[0])])
    return np.concatenate([fa, fb.astype(np.int32)])


@pytest.mark.interp
def test_interp_band_split():
    """The band split (skip items for the groups outside (128, 192] rows, 192 x 192 items
    with the L2 prefetch for those inside, one output): the bytes of the skip items alone,
    within the bound, and a flagged row inside the band fixed up as the portable kernel's."""
    counts, ids, e_count, n, k = [150, 0, 70, 129, 193], [1, -1, 0, -1, 0], 2, 48, 96
    case, _, w_scales = make_grouped_case(np.random.default_rng(9), MXFP8, counts, ids,
                                          e_count, n, k)
    es = case["expert_start"].astype(np.int64)
    srow = int(case["a_scale_offsets"][0]) * 128 + 7  # group 0 (150 rows, expert 1), row 7
    _set_scale(case, "a_scales", srow, 1, 250)  # 2^123: outside the window, row 7 flagged
    esc = _esc(e_count)
    kw = {"expert_scales": esc, "fmt": MXFP8, "k": k, "prefetch": True, "loop": "lockstep",
          "store": "staged", "a_source": "workspace", "skip": True, "coalesce": True,
          "l2_ahead": GP.MX8_DISPATCH_L2_AHEAD, "device": "interp"}
    skip = GP.grouped_matmul_block_scaled_pdq(**case, **kw)
    split = GP.grouped_matmul_block_scaled_pdq(**case, band="split", **kw)
    assert np.array_equal(split.view(np.uint16), skip.view(np.uint16))
    port = _portable(case, esc, k, "interp")
    assert np.array_equal(split[7].view(np.uint16), port[7].view(np.uint16))
    a_rows, _ = _scale_rows(case, k)
    mask = np.ones(split.shape, bool)
    mask[7] = False
    _check_bound(split, case, a_rows, w_scales, k, esc, mask=mask)
    _zeros_of_unused(split, case, ids)
    assert es[-1] == sum(counts)


@pytest.mark.interp
@pytest.mark.parametrize("a_source", ["packed", "workspace"])
def test_interp_out_of_window(a_source):
    """Scales outside the window: flagged rows bit-equal to the portable kernel, the flag
    kernel equal to the rule's model, zero blocks with far scales unflagged, NaN scales
    NaN where the portable kernel's are; everything else within the bound."""
    from blockscale.ops._mx8_window_ir import WINDOW_HI, WINDOW_LO  # (imports MLIR)

    counts, ids, e_count, n, k = [40, 0, 30, 9], [1, -1, 0, 1], 2, 24, 128
    case, _, _ = make_grouped_case(np.random.default_rng(8), MXFP8, counts, ids, e_count, n, k)
    a = np.ascontiguousarray(case["hidden"]).view(np.uint8)
    a[7, 0:32] = 0x80  # row 7, block 0: -0 codes under a far scale: not flagged
    case["hidden"] = a.view(case["hidden"].dtype)
    es = case["expert_start"].astype(np.int64)
    srow = (lambda m, g: (es[g] // 128 + int(case["a_scale_offsets"][g])) * 128 + m - es[g])
    for j in range(k // 32):  # row 5 and expert 1's row 5: 2^-127 everywhere (flagged; the
        _set_scale(case, "a_scales", srow(5, 0), j, 0)  # pdq kernel's clamped 2^-126 alone
        _set_scale(case, "b_scales", (1, 5), j, 0)      # would give twice the value)
    _set_scale(case, "a_scales", srow(7, 0), 0, 3)     # zero block: not flagged
    _set_scale(case, "a_scales", srow(50, 2), 3, 200)  # 2^73: row 50 flagged
    _set_scale(case, "a_scales", srow(60, 2), 2, 0xFF)  # NaN row 60
    _set_scale(case, "b_scales", (0, 3), 2, 250)       # expert 0 row 3: flagged
    _set_scale(case, "b_scales", (1, 9), 3, 0xFF)      # NaN column 9 of expert 1's rows
    for r in range(k // 32):  # the window's edges: rows 20 (2^-54) and 21 (2^43), unflagged
        _set_scale(case, "a_scales", srow(20, 0), r, 127 + WINDOW_LO)
        _set_scale(case, "a_scales", srow(21, 0), r, 127 + WINDOW_HI)
    a_rows, w_scales = _scale_rows(case, k)

    from blockscale.runtime import get_device

    dev = get_device("interp")
    t, _, _, g_count, bufs = G.tiled_grouped_operands(
        case["hidden"], case["weight"], case["a_scales"], case["b_scales"],
        case["expert_start"], case["a_scale_offsets"], case["expert_ids"], _esc(e_count),
        MXFP8, k, None, "test")
    bufs = {x: dev.to_device(np.ascontiguousarray(v)) for x, v in bufs.items()}
    flags = dev.to_host(MX8.flags(bufs, t, n, k, g_count, e_count, "sm_90a", dev))
    model = _flag_model(case, k)
    assert np.array_equal(flags, model)
    want_a = {5, 50}
    want_b = {0 * n + 3, 1 * n + 5}
    assert set(np.flatnonzero(flags[:t])) == want_a
    assert set(np.flatnonzero(flags[t:])) == want_b

    esc = _esc(e_count)
    kw = {"expert_scales": esc, "fmt": MXFP8, "k": k, "prefetch": True, "loop": "lockstep",
          "a_source": a_source, "device": "interp"}
    out = GP.grouped_matmul_block_scaled_pdq(**case, **kw)
    port = _portable(case, esc, k, "interp")
    with pytest.MonkeyPatch.context() as mp:  # the control: without the fixup they differ
        mp.setattr(MX8, "fixup", lambda *a, **kw: None)
        raw = GP.grouped_matmul_block_scaled_pdq(**case, **kw)
    assert not np.array_equal(raw[5].view(np.uint16), port[5].view(np.uint16))
    assert not np.array_equal(raw[:40, 5].view(np.uint16), port[:40, 5].view(np.uint16))
    fixed = np.zeros(out.shape, bool)
    fixed[sorted(want_a)] = True
    for g, e in enumerate(ids):  # B rows: the columns of their expert's groups
        for f in want_b:
            if e == f // n:
                fixed[es[g]:es[g + 1], f % n] = True
    assert np.array_equal(out[fixed].view(np.uint16), port[fixed].view(np.uint16))
    nan = np.isnan(port.astype(np.float32))
    assert nan[60].all() and nan[:40, 9].all() and nan[70:, 9].all()
    assert np.array_equal(np.isnan(out.astype(np.float32)), nan)
    _check_bound(out, case, a_rows, w_scales, k, esc, mask=~fixed & ~nan)
    _zeros_of_unused(out, case, ids)


@pytest.mark.interp
def test_dispatch(monkeypatch):
    """MXFP8 prefill (MIN_ROWS lowered) dispatches to the grouped pdq kernel, whose output the
    flagged-free case gives within the bound; BLOCKSCALE_SM90_GROUPED_PDQ=0 keeps the
    mma.sync grouped kernel."""
    monkeypatch.setattr(gw, "MIN_ROWS", 1)
    specs = []

    def spy(spec, *args, _launch=GP.launch, **kw):
        specs.append(spec)
        return _launch(spec, *args, **kw)

    monkeypatch.setattr(GP, "launch", spy)
    counts, ids, e_count, n, k = [65, 0, 20], [1, -1, 0], 2, 32, 64
    case, rows, w_scales = make_grouped_case(np.random.default_rng(2), MXFP8, counts, ids,
                                             e_count, n, k)
    esc = _esc(e_count)
    out = grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=MXFP8, k=k,
                                      device="interp", target="sm_90a")
    assert specs == [GP.dispatch_plan(MXFP8, n, False, "sm_90a", "interp",
                                      rows_per_group=85 / 3)]
    assert specs[0][0].fmt == "mxfp8" and not specs[0][0].pair
    _check_bound(out, case, rows, w_scales, k, esc)
    from blockscale.runtime import get_device  # device weights, numpy group vectors (mixed)

    dev = get_device("interp")
    mixed = {**case, "weight": dev.to_device(case["weight"]),
             "b_scales": dev.to_device(np.ascontiguousarray(case["b_scales"]))}
    got = grouped_matmul_block_scaled(**mixed, expert_scales=esc, fmt=MXFP8, k=k, device=dev,
                                      target="sm_90a")
    assert np.array_equal(dev.to_host(got).view(np.uint16), out.view(np.uint16))
    monkeypatch.setenv(gw.PDQ_ENV_SWITCH, "0")
    assert gw.fast_path("sm_90a", MXFP8, 85, n, k, 3, False) is None


@pytest.mark.interp
def test_spec_checks():
    assert GP.GroupedPdqSpec("mxfp8", prefetch=True).kernel_name.startswith(
        "bs_grouped_pdq_mxfp8_128x256")
    with pytest.raises(ValueError, match="b_source"):
        GP.GroupedPdqSpec("mxfp8", a_source="workspace", b_source="tma")
    with pytest.raises(ValueError, match="row_scales"):
        GP.GroupedPdqSpec("mxfp8", row_scales=True)
    with pytest.raises(ValueError, match="dtype"):
        GP.GroupedPdqSpec("mxfp8", a_source="workspace", dtype="f16")
    names = {s.kernel_name for s in GP.bundle_specs() if getattr(s, "fmt", "") == "mxfp8"}
    for depth in ("1", "2"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(GP.MX8_DEPTH_ENV, depth)
            for sg in (False, True):
                for rpg in (10.0, 200.0):
                    spec = GP.dispatch_spec(MXFP8, 5760, False, "sm_90a", "interp", sg, rpg)
                    assert spec.depth == int(depth) and not spec.pair
                    assert dataclasses.replace(spec, loop="split").kernel_name in names
    assert {s.kernel_name for s in MX8.bundle_specs()} == {
        "bs_grouped_mx8_flags", "bs_grouped_mx8_fixup", "bs_grouped_mx8_fixup_sigma"}


def _gpt_oss(t, seed):
    counts = list(np.random.default_rng(seed).multinomial(4 * t, np.full(128, 1 / 128)))
    return counts, [e if c else -1 for e, c in enumerate(counts)]


@pytest.mark.gpu
@pytest.mark.cuda
def test_gpu_gpt_oss():
    """gpt-oss-120b gate_up (E=128, top-4, N=5760, K=2880) at T=1024 through the dispatch:
    the grouped pdq kernel, within the bound; and with far scales in rows of A and B, the
    flagged rows bit-equal to the portable kernel on the H200."""
    counts, ids = _gpt_oss(1024, 3)
    n, k, e_count = 5760, 2880, 128
    case, rows, w_scales = make_grouped_case(np.random.default_rng(4), MXFP8, counts, ids,
                                             e_count, n, k)
    esc = _esc(e_count)
    out = grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=MXFP8, k=k, device="cuda")
    _check_bound(out, case, rows, w_scales, k, esc)
    _zeros_of_unused(out, case, ids)
    from blockscale.runtime import get_device  # device weights, numpy group vectors (mixed)

    dev = get_device("cuda")
    mixed = {**case, "weight": dev.to_device(case["weight"]),
             "b_scales": dev.to_device(np.ascontiguousarray(case["b_scales"]))}
    got = grouped_matmul_block_scaled(**mixed, expert_scales=esc, fmt=MXFP8, k=k, device=dev)
    assert np.array_equal(dev.to_host(got).view(np.uint16), out.view(np.uint16))
    es = case["expert_start"].astype(np.int64)
    g = int(np.flatnonzero(np.diff(es) > 2)[0])
    m = int(es[g])  # the first row of a used group
    srow = (es[g] // 128 + int(case["a_scale_offsets"][g])) * 128
    for j in range(k // 32):  # 2^-127 everywhere: flagged (the clamped 2^-126 would double)
        _set_scale(case, "a_scales", srow, j, 0)
        _set_scale(case, "b_scales", (int(ids[g]), 100), j, 0)
    out = grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=MXFP8, k=k, device="cuda")
    port = _portable(case, esc, k, "cuda")
    assert np.array_equal(out[m].view(np.uint16), port[m].view(np.uint16))
    col = slice(es[g], es[g + 1])
    assert np.array_equal(out[col, 100].view(np.uint16), port[col, 100].view(np.uint16))


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("l2_ahead", [0, GP.MX8_DISPATCH_L2_AHEAD])
@pytest.mark.parametrize("items", ["skip", "192"])
def test_gpu_coalesce(items, l2_ahead):
    """The warp-coalesced producer loads (``coalesce``) on the H200, gpt-oss gate_up's N and
    K on 16 experts, 128 rows a group on average (the 192 x 192 items' second A tiles): the
    bytes of the same items without them (plain and σ), within the bound; with and without
    the L2 prefetch of the dispatch."""
    e_count, n, k = 16, 5760, 2880
    counts = list(np.random.default_rng(5).multinomial(2048, np.full(e_count, 1 / e_count)))
    ids = list(range(e_count))
    case, rows, w_scales = make_grouped_case(np.random.default_rng(6), MXFP8, counts, ids,
                                             e_count, n, k)
    esc = _esc(e_count)
    kw = {"skip": True} if items == "skip" else {"bm": 192, "bn": GP.TRI_BN}
    for sg in (True, False):
        outs = [GP.grouped_matmul_block_scaled_pdq(
            **case, expert_scales=esc, fmt=MXFP8, k=k, prefetch=True, store="staged",
            a_source="workspace", sigma_out=sg, coalesce=co, l2_ahead=l2_ahead if co else 0,
            device="cuda", **kw) for co in (False, True)]
        assert np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))
    _check_bound(outs[1], case, rows, w_scales, k, esc)


@pytest.mark.gpu
@pytest.mark.cuda
def test_gpu_band_split():
    """gpt-oss gate_up at T=4096 (128 +- 11 rows a group) through the band split: the bytes of
    the skip items alone (both with the L2 prefetch), within the bound."""
    counts, ids = _gpt_oss(4096, 3)
    n, k, e_count = 5760, 2880, 128
    case, rows, w_scales = make_grouped_case(np.random.default_rng(6), MXFP8, counts, ids,
                                             e_count, n, k)
    esc = _esc(e_count)
    kw = {"expert_scales": esc, "fmt": MXFP8, "k": k, "prefetch": True, "store": "staged",
          "a_source": "workspace", "skip": True, "coalesce": True,
          "l2_ahead": GP.MX8_DISPATCH_L2_AHEAD, "device": "cuda"}
    skip = GP.grouped_matmul_block_scaled_pdq(**case, **kw)
    split = GP.grouped_matmul_block_scaled_pdq(**case, band="split", **kw)
    assert np.array_equal(split.view(np.uint16), skip.view(np.uint16))
    assert any(GP.BAND_ROWS[0] < c <= GP.BAND_ROWS[1] for c in counts)
    _check_bound(split, case, rows, w_scales, k, esc)


def _portable(case, esc, k, device):
    """The portable grouped kernel itself (no fast path), on ``device``."""
    import blockscale.ops._matmul_host as H
    from blockscale.runtime import get_device

    t, n, k, g_count, bufs = G.tiled_grouped_operands(
        case["hidden"], case["weight"], case["a_scales"], case["b_scales"],
        case["expert_start"], case["a_scale_offsets"], case["expert_ids"], esc, MXFP8, k,
        None, "test")
    spec = G.GroupedMatmulSpec("mxfp8", "tcgen5d", "bfloat16", False, "sm_90a")
    return H.launch(spec, G.grid(t, n), (t, n), "bfloat16", bufs,
                    {"t": t, "n": n, "k": k, "num_groups": g_count}, get_device(device))


@pytest.mark.interp
def test_interp_swiglu_flagged(monkeypatch):
    """The fused SwiGLU op on MXFP8 prefill (MIN_ROWS lowered) with flagged rows of A and B:
    its σ fixup writes the chained path's bytes (data and scales equal)."""
    from test_matmul_swiglu import swiglu_case

    from blockscale.ops import fused_silu_quantize
    from blockscale.ops import matmul_swiglu as SW

    monkeypatch.setattr(gw, "MIN_ROWS", 1)
    d, k = 24, 96
    counts, ids = [40, 0, 25], [1, -1, 0]
    sc = swiglu_case(MXFP8, counts, ids, 2, d, k, seed=12)
    es = sc["expert_start"].astype(np.int64)
    srow = (es[2] // 128 + int(sc["a_scale_offsets"][2])) * 128 + 45 - es[2]
    for j in range(k // 32):  # 2^-127 (flagged): row 45 (expert 0), up row 3 of expert 1
        _set_scale(sc, "a_scales", srow, j, 0)
        for key, row in (("b_scales", 3 + d), ("sfb_sigma", 2 * 3 + 1)):
            _set_scale(sc, key, (1, row), j, 0)
    grp = (sc["expert_start"], sc["a_scale_offsets"], sc["expert_ids"])
    data, scales = SW.grouped_matmul_swiglu(sc["hidden"], sc["w_sigma"], sc["a_scales"],
                                            sc["sfb_sigma"], *grp, None, None, MXFP8, k=k,
                                            device="interp", target="sm_90a")
    gate_up = grouped_matmul_block_scaled(sc["hidden"], sc["weight"], sc["a_scales"],
                                          sc["b_scales"], *grp, None, MXFP8, k=k,
                                          device="interp", target="sm_90a")
    port = _portable(sc, np.ones(2, np.float32), k, "interp")
    assert np.array_equal(gate_up[45].view(np.uint16), port[45].view(np.uint16))
    assert np.array_equal(gate_up[:40, d + 3].view(np.uint16), port[:40, d + 3].view(np.uint16))
    c_data, c_scales = fused_silu_quantize(gate_up, MXFP8, *grp, None,
                                           num_scale_tiles=sc["a_scales"].shape[0],
                                           device="interp", target="sm_90a")
    for got, want in ((data, c_data), (scales, c_scales)):
        assert np.array_equal(np.ascontiguousarray(got).view(np.uint8),
                              np.ascontiguousarray(want).view(np.uint8))

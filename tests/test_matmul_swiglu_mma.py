"""The sm_90a MXFP8 fused grouped matmul + SwiGLU kernel on the tensor-core mainloop (issue #10).

On the H200 the portable fused kernel's MXFP8 K loop (31 sequential fp32 adds per block) and
the chained grouped matmul's ``mma.sync`` (the tensor core's own alignment and truncation)
rounded a few E4M3 block sums differently. The fused kernel now runs the chained kernel's
mainloop where the chained path does (:func:`matmul_swiglu.chained_mainloop`). These tests
hold it to that in the interpreter:

* fused == chained byte for byte (groups spanning tiles, empty and id -1 groups, partial
  output blocks, K % 128 != 0, a NaN input);
* both kernels issue the same ``mma.sync`` element computations: every MMA call is recorded
  (A [16x16], B [16x8], C, D per warp) and split into its 128 element evaluations (A row,
  B column, C, D); the two multisets must be equal. The per-element sequence is what the
  hardware result depends on, whichever warp or CTA runs it;
* dispatch follows the chained path (decode / mma / portable); the kernel lowers to HMMA
  with no spills.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from test_matmul_swiglu import _b, swiglu_case

from blockscale import reference as ref
from blockscale.formats import Format
from blockscale.ops import fused_silu_quantize, grouped_matmul_block_scaled
from blockscale.ops import matmul_swiglu as SW

pytest.importorskip("mlir")

from blockscale.runtime.interpreter import ops_mma

MXFP8 = Format.from_name("mxfp8")


def _chained(case: dict, k: int, act: str, esc: np.ndarray | None) -> tuple:
    grp = (case["expert_start"], case["a_scale_offsets"], case["expert_ids"])
    gate_up = grouped_matmul_block_scaled(case["hidden"], case["weight"], case["a_scales"],
                                          case["b_scales"], *grp, esc, MXFP8, k=k,
                                          device="interp", target="sm_90a")
    return fused_silu_quantize(gate_up, MXFP8, *grp, None, activation=act,
                               num_scale_tiles=case["a_scales"].shape[0], device="interp",
                               target="sm_90a")


def _fused(case: dict, k: int, act: str, esc: np.ndarray | None) -> tuple:
    grp = (case["expert_start"], case["a_scale_offsets"], case["expert_ids"])
    return SW.grouped_matmul_swiglu(case["hidden"], case["w_sigma"], case["a_scales"],
                                    case["sfb_sigma"], *grp, esc, None, MXFP8, k=k,
                                    activation=act, device="interp", target="sm_90a")


@pytest.fixture
def mma_runs(monkeypatch):
    """Counts the launches of the mma fused kernel."""
    runs: list[SW.SwigluMmaSpec] = []
    real = SW._run_mma

    def spy(spec, *args, **kw):
        runs.append(spec)
        return real(spec, *args, **kw)

    monkeypatch.setattr(SW, "_run_mma", spy)
    return runs


CASES = [  # counts, ids, E, D, K
    ([17, 0, 40, 150], [1, 0, -1, 2], 3, 40, 144),  # K % 128 = 16: padded step, half block
    ([129, 20], [0, 1], 2, 64, 256),  # two blocks per row, a tile's second half
]


@pytest.mark.interp
@pytest.mark.parametrize("act", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("counts,ids,e_count,d,k", CASES)
def test_fused_equals_chained(counts, ids, e_count, d, k, act, mma_runs) -> None:
    case = swiglu_case(MXFP8, counts, ids, e_count, d, k, seed=sum(counts) + d)
    esc = np.linspace(0.5, 2.0, e_count).astype(np.float32)
    data, scales = _fused(case, k, act, esc)
    assert [s.kernel_name for s in mma_runs] == [f"grouped_matmul_swiglu_mma_mxfp8_{act}"]
    c_data, c_scales = _chained(case, k, act, esc)
    np.testing.assert_array_equal(_b(data), _b(c_data))
    np.testing.assert_array_equal(_b(scales), _b(c_scales))
    assert _b(scales).any() and _b(data).any()
    es = case["expert_start"]
    for g, e in enumerate(ids):  # D8: id -1 rows are zero bytes
        if e < 0:
            assert not _b(data[es[g]:es[g + 1]]).any()
    # and the reference (float64 sums): the scales agree, a few element codes may not
    grp = (case["expert_start"], case["a_scale_offsets"], case["expert_ids"])
    r_data, r_scales = ref.grouped_matmul_swiglu(
        case["hidden"], case["w_sigma"], case["a_scales"], case["sfb_sigma"], *grp, esc,
        None, MXFP8, k=k, activation=act)
    np.testing.assert_array_equal(_b(scales), _b(r_scales))
    assert (_b(data) != _b(r_data)).mean() < 0.01


@pytest.mark.interp
def test_nan_input_block(mma_runs) -> None:
    """An E4M3 NaN code in A makes its rows' blocks NaN: scale 0xFF, codes 0 (D5), as chained."""
    case = swiglu_case(MXFP8, [70], [0], 1, 64, 128, seed=5)
    case["hidden"].view(np.uint8)[5, 40] = 0x7F
    data, scales = _fused(case, 128, "silu", None)
    c_data, c_scales = _chained(case, 128, "silu", None)
    assert len(mma_runs) == 1
    np.testing.assert_array_equal(_b(data), _b(c_data))
    np.testing.assert_array_equal(_b(scales), _b(c_scales))
    assert not _b(data[5]).any() and (_b(scales) == 0xFF).sum() == 2


@pytest.mark.interp
def test_empty_group_sharing_tile0(mma_runs) -> None:
    """An empty group at the tile0 of the group before it does not take its tiles over."""
    case = swiglu_case(MXFP8, [0, 20, 0], [3, 0, -1], 4, 16, 64, seed=11)
    case["a_scale_offsets"] = np.zeros(3, np.int32)
    data, scales = _fused(case, 64, "silu", None)
    c_data, c_scales = _chained(case, 64, "silu", None)
    assert len(mma_runs) == 1
    np.testing.assert_array_equal(_b(data), _b(c_data))
    np.testing.assert_array_equal(_b(scales), _b(c_scales))
    assert _b(data).any()


def _element_records(calls: list) -> Counter:
    """Every (A row, B column, C, D) element evaluation of the recorded MMAs, as bytes."""
    out: Counter = Counter()
    lane = np.arange(32)
    g, t = lane >> 2, lane & 3
    for a, b, c, d in calls:
        w = a.shape[0]
        am = np.zeros((w, 16, 16))
        bm = np.zeros((w, 16, 8))
        cm = np.zeros((w, 16, 8), np.float32)
        dm = np.zeros((w, 16, 8), np.float32)
        for r in range(4):
            for h in range(2):
                am[:, g + 8 * (r & 1), 2 * t + 8 * (r >> 1) + h] = a[:, :, r, h]
        for r in range(2):
            for h in range(2):
                bm[:, 2 * t + 8 * r + h, g] = b[:, :, r, h]
        for i in range(4):
            cm[:, g + 8 * (i >> 1), 2 * t + (i & 1)] = c[:, :, i]
            dm[:, g + 8 * (i >> 1), 2 * t + (i & 1)] = d[:, :, i]
        rows = np.broadcast_to(am[:, :, None, :], (w, 16, 8, 16)).astype(np.float16)
        cols = np.broadcast_to(bm.transpose(0, 2, 1)[:, None, :, :], (w, 16, 8, 16)
                               ).astype(np.float16)
        rec = np.concatenate([rows.view(np.uint16).astype(np.uint32),
                              cols.view(np.uint16).astype(np.uint32),
                              cm.view(np.uint32)[..., None], dm.view(np.uint32)[..., None]],
                             axis=-1).reshape(-1, 34)
        out.update(bytes(r) for r in np.ascontiguousarray(rec))
    return out


@pytest.mark.interp
def test_same_mma_element_sequence(monkeypatch, mma_runs) -> None:
    """The fused and the chained kernel compute the same MMA element evaluations (A row, B
    column, C in, D out) — equal multisets — so the tensor core sees the same operations."""
    calls: list = []
    live: list = [None]  # the executing warps of the current MMA (blocks may run batched)
    real, real_warps = ops_mma.mma_m16n8k16, ops_mma._warps

    def warps(f, what):
        idx = real_warps(f, what)
        live[0] = (np.ones(idx.shape[0], bool) if f.mask is None
                   else f.mask.reshape(-1, 32).all(axis=1))
        return idx

    def record(a, b, c):
        d = real(a, b, c)
        on = live[0]
        calls.append((a[on].copy(), b[on].copy(), c[on].copy(), d[on].copy()))
        return d

    monkeypatch.setattr(ops_mma, "_warps", warps)
    monkeypatch.setattr(ops_mma, "mma_m16n8k16", record)
    case = swiglu_case(MXFP8, [40, 0, 30], [1, 0, -1], 2, 40, 144, seed=21)
    _fused(case, 144, "silu", None)
    fused = _element_records(calls)
    calls.clear()
    _chained(case, 144, "silu", None)
    chained = _element_records(calls)
    assert len(mma_runs) == 1
    # 1 row tile x 2 column tiles x 2 K-steps x 4 blocks x 2 MMAs x 64 x 64 elements
    assert sum(fused.values()) == 1 * 2 * 2 * 4 * 2 * 64 * 64
    assert fused == chained


@pytest.mark.parametrize("counts,k,target,want", [
    ([17, 30], 128, "sm_90a", "mma"),
    ([16, 3], 128, "sm_90a", "decode"),  # the chained path takes the decode kernel
    ([17, 30], 136, "sm_90a", "portable"),  # K % 16 != 0: no tensor-core kernel
    ([17, 30], 128, "sm_100a", "portable"),
])
def test_chained_mainloop_dispatch(counts, k, target, want) -> None:
    es = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    got = SW.chained_mainloop(target, MXFP8, int(es[-1]), 64, k, len(counts), es)
    assert got == want


@pytest.mark.parametrize("env,counts,want", [("BLOCKSCALE_DECODE", [16, 3], "mma"),
                                             ("BLOCKSCALE_SM90_FAST", [17, 30], "portable")])
def test_chained_mainloop_follows_the_switches(monkeypatch, env, counts, want) -> None:
    monkeypatch.setenv(env, "0")
    es = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    assert SW.chained_mainloop("sm_90a", MXFP8, int(es[-1]), 64, 128, len(counts), es) == want


def test_mma_spec_validation() -> None:
    with pytest.raises(ValueError, match="fmt must be 'mxfp8'"):
        SW.SwigluMmaSpec("nvfp4")
    with pytest.raises(ValueError, match="target must be one of"):
        SW.SwigluMmaSpec("mxfp8", "sm_100a")
    assert {s.kernel_name for s in SW.bundle_specs("sm_90a")
            if isinstance(s, SW.SwigluMmaSpec)} == {
        "grouped_matmul_swiglu_mma_mxfp8_silu", "grouped_matmul_swiglu_mma_mxfp8_swiglu_oai"}
    assert not any(isinstance(s, SW.SwigluMmaSpec) for s in SW.bundle_specs("sm_100a"))


@pytest.mark.lower
def test_lowers_to_the_chained_kernels_instructions() -> None:
    """Same MMAs and mainloop FMAs as the chained tensor-core kernel; no spills; D10 checks."""
    from blockscale.ops import matmul_grouped_sm90 as GS

    kern = SW.kernel(SW.SwigluMmaSpec("mxfp8", "sm_90a", "swiglu_oai", 1.702, 7.0))
    chained = GS.kernel(GS.Sm90GroupedSpec("mxfp8", False, 64, 64))
    ptx, cptx = kern.asm["ptx"], chained.asm["ptx"]
    for pat in (r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32",
                r"cvt\.rn\.f16x2\.e4m3x2", r"fma\.rn\.f32"):
        assert len(re.findall(pat, ptx)) == len(re.findall(pat, cptx)) > 0, pat
    assert "cvt.rn.bf16.f32" in ptx and "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert "rcp.approx" not in ptx and "ex2" not in ptx
    assert len(re.findall(r"\bHMMA\.16816\.F32\b", kern.asm["sass"])) == 64
    assert kern.meta["spill_stores"] == 0 and kern.meta["spill_loads"] == 0

"""Reference grouped quantize, fused SiLU quantize and moe_create_indices."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import blockscale as bs
from blockscale import reference as ref
from blockscale.layouts import deinterleave

BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(5)


def _offsets(counts):
    """scales_offsets as moe_create_indices computes them: tile0(g) = sum ceil(n_h/128)."""
    starts = np.concatenate([[0], np.cumsum(counts)])
    tiles = -(-np.asarray(counts) // 128)
    tile0 = np.concatenate([[0], np.cumsum(tiles)[:-1]])
    return starts, (tile0 - starts[:-1] // 128)


def _check_against_per_expert(x, fmt, counts, ids, tsf, data, scales, rows_src=None):
    starts, offs = _offsets(counts)
    src = x if rows_src is None else rows_src
    j = fmt.kblocks(x.shape[1])
    t = int(starts[-1])
    assert scales.shape[0] == -(-t // 128) + min(len(counts), t)
    s2 = deinterleave(scales, scales.shape[0] * 128, j).view(np.uint8)
    written = np.zeros(s2.shape[0], bool)
    for g, e in enumerate(ids):
        s, end = int(starts[g]), int(starts[g + 1])
        if e < 0:
            assert not data[s:end].view(np.uint8).any()
            continue
        sf = 1.0 if tsf is None else float(tsf[e])
        d, sc = ref.quantize_dynamic_block_scaled(src[s:end], fmt, tensor_sf=sf,
                                                  scale_layout="row_major")
        assert np.array_equal(data[s:end].view(np.uint8), d.view(np.uint8))
        r0 = (s // 128 + int(offs[g])) * 128
        assert np.array_equal(s2[r0:r0 + end - s], sc.view(np.uint8))
        written[r0:r0 + end - s] = True
    assert not s2[~written].any()  # every spare byte zero (D7)
    assert not scales.view(np.uint8).reshape(-1)[s2.size:].any()


@pytest.mark.parametrize("counts,ids", [
    ([256, 128, 256], [0, 1, 2]), ([100, 200, 50], [2, 0, 1]), ([13, 999], [1, 0]),
    ([0, 3, 1, 2], [-1, 2, -1, 0]),
])
@pytest.mark.parametrize("fmt", [bs.NVFP4, bs.MXFP8])
def test_grouped_equals_per_expert(counts, ids, fmt):
    k = 704
    x = RNG.uniform(-1, 1, (sum(counts), k)).astype(BF16)
    tsf = np.array([0.43, 1.0, 0.5], np.float32) if fmt is bs.NVFP4 else None
    starts, offs = _offsets(counts)
    data, scales = ref.grouped_quantize_dynamic_scaled(x, fmt, starts, offs, np.array(ids), tsf)
    _check_against_per_expert(x, fmt, counts, ids, tsf, data, scales)


def test_grouped_mxfp4_partial_k_and_indices():
    counts, ids = [100, 60], [1, 0]
    x = RNG.uniform(-3, 3, (90, 40)).astype(BF16)
    idx = RNG.integers(0, 90 * 2, 160)
    starts, offs = _offsets(counts)
    data, scales = ref.grouped_quantize_dynamic_scaled(x, bs.MXFP4, starts, offs, np.array(ids),
                                                       None, indices=idx, indices_divisor=2)
    _check_against_per_expert(x, bs.MXFP4, counts, ids, None, data, scales,
                              rows_src=x[idx // 2])


def test_grouped_validation():
    x = np.zeros((10, 32), BF16)
    ok = {"expert_start": np.array([0, 4, 10]), "scales_offsets": np.array([0, 1]),
              "expert_ids": np.array([0, 1]), "tensor_sf": np.ones(2, np.float32)}
    ref.grouped_quantize_dynamic_scaled(x, bs.NVFP4, **ok)
    cases = [
        ({"expert_start": np.array([0, 6, 4])}, "non-decreasing"),
        ({"expert_start": np.array([0, 4, 9])}, "must equal the number of rows 10"),
        ({"expert_ids": np.array([0, -2])}, "-1 or >= 0"),
        ({"expert_ids": np.array([0, 2])}, "< len\\(tensor_sf\\)=2"),
        ({"tensor_sf": None}, "NVFP4 requires tensor_sf"),
        ({"tensor_sf": np.array([1.0, np.inf])}, "tensor_sf must be finite"),
        ({"scales_offsets": np.array([0, 0])}, "overlap"),
        ({"scales_offsets": np.array([0, 5])}, "outside the 3 tiles"),
    ]
    for change, msg in cases:
        with pytest.raises(ValueError, match=msg):
            ref.grouped_quantize_dynamic_scaled(x, bs.NVFP4, **{**ok, **change})
    with pytest.raises(ValueError, match="must be None or 1.0 for mxfp8"):
        ref.grouped_quantize_dynamic_scaled(x, bs.MXFP8, **{**ok, "tensor_sf": np.full(2, 0.5)})


def test_moe_create_indices_small_example():
    topk = np.array([[3, 1], [1, 0], [3, 1]])  # 3 tokens, top-2, 5 experts
    order, start, restore, ids, usage, offs = ref.moe_create_indices(topk, 5)
    # flat ids [3,1,1,0,3,1]: expert 0 <- flat 3; expert 1 <- 1,2,5; expert 3 <- 0,4
    assert order.tolist() == [3, 1, 2, 5, 0, 4]
    assert start.tolist() == [0, 1, 4, 6, 6, 6] and ids.tolist() == [0, 1, 3, -1, -1]
    assert np.array_equal(order[restore], np.arange(6))
    assert usage.tolist() == [3, 3] and offs.tolist() == [0, 1, 2, 3, 3]
    with pytest.raises(ValueError, match=r"topk_ids must be in \[0, 5\)"):
        ref.moe_create_indices(np.array([0, 5]), 5)


def test_moe_indices_feed_grouped_quantize():
    tokens, top_k, experts = 300, 2, 4
    topk = np.stack([RNG.choice(experts, 2, replace=False) for _ in range(tokens)])
    order, start, _restore, ids, usage, offs = ref.moe_create_indices(topk, experts)
    counts = np.diff(start)
    assert usage[0] == counts.max() and usage[1] == (counts > 0).sum()
    x = RNG.standard_normal((tokens, 64)).astype(BF16)
    tsf = np.array([1.0, 0.5, 2.0, 0.25], np.float32)
    data, scales = ref.grouped_quantize_dynamic_scaled(x, bs.NVFP4, start, offs, ids, tsf,
                                                       indices=order, indices_divisor=top_k)
    _check_against_per_expert(x, bs.NVFP4, counts, ids, tsf, data, scales,
                              rows_src=x[order // top_k])


@pytest.mark.parametrize("act", [bs.GatedActivation.SILU, bs.GatedActivation.SWIGLU_OAI])
@pytest.mark.parametrize("fmt", [bs.NVFP4, bs.MXFP8])
def test_fused_silu_quantize_equals_activation_then_grouped(act, fmt):
    counts, ids = [70, 0, 140], [2, -1, 0]
    d = 64
    gu = (RNG.standard_normal((210, 2 * d)) * 4).astype(BF16)
    starts, offs = _offsets(counts)
    inp = np.array([0.5, 1.0, 0.25], np.float32) if fmt is bs.NVFP4 else None
    data, scales = ref.fused_silu_quantize(gu, fmt, starts, offs, np.array(ids), inp,
                                           activation=act)
    assert scales.shape[0] == -(-210 // 128) + 3  # rows + G*128 sizing (§7.5)
    g, u = gu[:, :d].astype(np.float32), gu[:, d:].astype(np.float32)
    z = act(g, u)
    tsf = None if inp is None else (np.float32(1) / inp)
    d2, s2 = ref.grouped_quantize_dynamic_scaled(z, fmt, starts, offs, np.array(ids), tsf)
    assert np.array_equal(data.view(np.uint8), d2.view(np.uint8))
    n = s2.shape[0]
    assert np.array_equal(scales.view(np.uint8)[:n], s2.view(np.uint8))
    assert not scales.view(np.uint8)[n:].any()


def test_gated_activations_values():
    g = np.array([-2.0, 0.0, 1.0, 9.0], np.float32)
    u = np.array([1.0, 5.0, -9.0, 2.0], np.float32)
    silu = bs.GatedActivation.SILU(g, u)
    g64, u64 = g.astype(np.float64), u.astype(np.float64)
    np.testing.assert_allclose(silu, g64 / (1 + np.exp(-g64)) * u64, rtol=1e-6)
    oai = bs.GatedActivation.SWIGLU_OAI(g, u)
    gc, uc = np.minimum(g64, 7.0), np.clip(u64, -7, 7)  # g 9 -> 7, u -9 -> -7
    np.testing.assert_allclose(oai, (uc + 1) * gc / (1 + np.exp(-1.702 * gc)), rtol=1e-6)
    assert bs.GatedActivation.parse("swiglu_oai") == bs.GatedActivation.SWIGLU_OAI
    with pytest.raises(ValueError, match="alpha must be a finite non-zero"):
        bs.GatedActivation.swiglu_oai(alpha=0.0)

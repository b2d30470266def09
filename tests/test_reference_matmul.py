"""Reference matmuls against an independent float64 computation; D10 fused == chained."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import blockscale as bs
from blockscale import reference as ref
from blockscale.layouts import interleave, tcgen_offset

RNG = np.random.default_rng(11)
E2M1 = [0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6]


def _rand_operand(fmt, rows, k):
    """Random payload bytes and random finite scales (2-D), as MAX's matmul tests do."""
    if fmt.is_fp4:
        data = RNG.integers(0, 256, (rows, k // 2), dtype=np.uint8)
    else:
        data = RNG.integers(0, 256, (rows, k), dtype=np.uint8)
        data[(data & 0x7F) == 0x7F] = 0x38  # drop NaN patterns
        data = data.view(ml_dtypes.float8_e4m3fn)
    j = fmt.kblocks(k)
    if fmt.is_mx:
        sc = RNG.integers(124, 131, (rows, j), dtype=np.uint8)
    else:
        sc = RNG.integers(0x20, 0x48, (rows, j), dtype=np.uint8)
    return data, sc.view(fmt.scale_dtype)


def _value64(data, fmt, r, kk):
    """One element's decoded value, from bits, in float64 (independent of the package)."""
    if fmt.is_fp4:
        byte = int(data.view(np.uint8)[r, kk // 2])
        return E2M1[(byte >> 4) if kk % 2 else (byte & 0xF)]
    b = int(data.view(np.uint8)[r, kk])
    e, m = (b >> 3) & 0xF, b & 7
    v = (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if b & 0x80 else v


def _scale64(s5, fmt, r, j, kblocks):
    b = int(s5.view(np.uint8).reshape(-1)[tcgen_offset(r, j, kblocks)])
    if fmt.is_mx:
        return 2.0 ** (b - 127)
    b &= 0x7F
    e, m = b >> 3, b & 7
    return (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)


def _dequant64(data, s5, fmt, k):
    rows, kb = data.shape[0], fmt.kblocks(k)
    return np.array([[_value64(data, fmt, r, kk) * _scale64(s5, fmt, r, kk // fmt.block_size, kb)
                      for kk in range(k)] for r in range(rows)])


@pytest.mark.parametrize("fmt,k", [(bs.NVFP4, 96), (bs.NVFP4, 40), (bs.MXFP4, 64),
                                   (bs.MXFP8, 70)])
def test_naive_matmul_matches_float64(fmt, k):
    m, n = 9, 7
    a, sa = _rand_operand(fmt, m, k)
    b, sb = _rand_operand(fmt, n, k)
    sfa, sfb = interleave(sa), interleave(sb)
    want = 0.225 * (_dequant64(a, sfa, fmt, k) @ _dequant64(b, sfb, fmt, k).T)
    got = ref.naive_block_scaled_matmul(a, b, sfa, sfb, fmt, k=k, alpha=0.225,
                                        out_dtype="float32")
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=1e-30)
    bf = ref.naive_block_scaled_matmul(a, b, sfa, sfb, fmt, k=k, alpha=0.225)
    assert bf.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(bf.astype(np.float64), want, rtol=2 ** -8)
    # fp32 sequential accumulation stays within the documented bound K * 2^-24 * sum|a_k b_k|
    f32 = ref.naive_block_scaled_matmul(a, b, sfa, sfb, fmt, k=k, alpha=0.225,
                                        out_dtype="float32", accumulation="float32")
    absum = 0.225 * (np.abs(_dequant64(a, sfa, fmt, k)) @ np.abs(_dequant64(b, sfb, fmt, k)).T)
    assert (np.abs(f32 - want) <= k * 2.0 ** -24 * absum + np.abs(want) * 2.0 ** -23).all()


def test_naive_matmul_validation():
    a, sa = _rand_operand(bs.NVFP4, 4, 32)
    sfa = interleave(sa)
    with pytest.raises(ValueError, match="k=30 needs 15 data columns"):
        ref.naive_block_scaled_matmul(a, a, sfa, sfa, bs.NVFP4, k=30)
    with pytest.raises(ValueError, match=r"sfb must have shape \(1, 1, 32, 4, 4\)"):
        ref.naive_block_scaled_matmul(a, a, sfa, sa, bs.NVFP4, k=32)
    with pytest.raises(TypeError, match="sfa must have dtype"):
        ref.naive_block_scaled_matmul(a, a, sfa.view(np.uint8), sfa, bs.NVFP4, k=32)
    with pytest.raises(ValueError, match="alpha must be finite"):
        ref.naive_block_scaled_matmul(a, a, sfa, sfa, bs.NVFP4, k=32, alpha=float("inf"))
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        ref.naive_block_scaled_matmul(a, a, sfa, sfa, bs.NVFP4, k=32, out_dtype="float16")


def _grouped_inputs(fmt, counts, ids, n, k, experts):
    t = sum(counts)
    starts = np.concatenate([[0], np.cumsum(counts)])
    tiles = -(-np.array(counts) // 128)
    offs = np.concatenate([[0], np.cumsum(tiles)[:-1]]) - starts[:-1] // 128
    a, _ = _rand_operand(fmt, t, k)
    j = fmt.kblocks(k)
    sa_rows = np.zeros(((-(-t // 128) + len(counts)) * 128, j), np.uint8)
    for g in range(len(counts)):
        r0 = (starts[g] // 128 + offs[g]) * 128
        sa_rows[r0:r0 + counts[g]] = _rand_operand(fmt, counts[g], k)[1].view(np.uint8)
    sfa = interleave(sa_rows.view(fmt.scale_dtype))
    ws, ss = zip(*[_rand_operand(fmt, n, k) for _ in range(experts)])
    return a, np.stack(ws), sfa, np.stack(ss), starts, offs, sa_rows


@pytest.mark.parametrize("fmt", [bs.NVFP4, bs.MXFP8])
def test_grouped_matmul_equals_per_group_naive(fmt):
    counts, ids, n, k, experts = [0, 3, 130, 2], [-1, 2, 0, -1], 12, 64, 3
    a, w, sfa, s2, starts, offs, sa_rows = _grouped_inputs(fmt, counts, ids, n, k, experts)
    sfb = np.stack([interleave(s) for s in s2])
    esc = np.array([1.5, 2.0, 0.75], np.float32)
    row_sc = RNG.uniform(0.5, 2, sum(counts)).astype(ml_dtypes.bfloat16) if not fmt.is_mx else None
    out = ref.grouped_matmul_block_scaled(a, w, sfa, sfb, starts, offs, np.array(ids), esc, fmt,
                                          k=k, a_row_scales=row_sc)
    assert out.dtype == ml_dtypes.bfloat16 and out.shape == (135, n)
    for g, e in enumerate(ids):
        s, end = starts[g], starts[g + 1]
        if e < 0:
            assert not out[s:end].astype(np.float32).any()
            continue
        r0 = (s // 128 + offs[g]) * 128
        sub_sfa = interleave(sa_rows[r0:r0 + end - s].view(fmt.scale_dtype))
        acc = ref.naive_block_scaled_matmul(a[s:end], w[e], sub_sfa, sfb[e], fmt, k=k,
                                            out_dtype="float32") * esc[e]
        if row_sc is not None:
            acc = acc * row_sc[s:end, None].astype(np.float32)
        assert np.array_equal(out[s:end].view(np.uint16),
                              acc.astype(ml_dtypes.bfloat16).view(np.uint16))
    if fmt is bs.NVFP4:
        with pytest.raises(ValueError, match="NVFP4 requires expert_scales"):
            ref.grouped_matmul_block_scaled(a, w, sfa, sfb, starts, offs, np.array(ids), None,
                                            fmt, k=k)
    with pytest.raises(ValueError, match="expert_ids must be < num_experts=3"):
        ref.grouped_matmul_block_scaled(a, w, sfa, sfb, starts, offs, np.array([0, 3, 0, 0]),
                                        esc, fmt, k=k)


@pytest.mark.parametrize("act", [bs.GatedActivation.SILU, bs.GatedActivation.SWIGLU_OAI])
@pytest.mark.parametrize("fmt", [bs.NVFP4, bs.MXFP8])
def test_swiglu_fused_equals_chained(act, fmt):
    # D10: fused (σ-permuted weights) is byte-identical to grouped matmul + fused_silu_quantize.
    counts, ids, d, k, experts = [64, 0, 64, 5], [0, -1, 1, 1], 64, 128, 2
    a, w_cat, sfa, s_cat, starts, offs, _ = _grouped_inputs(fmt, counts, ids, 2 * d, k, experts)
    sfb_cat = np.stack([interleave(s) for s in s_cat])
    w_sig = ref.sigma_permute_rows(w_cat)
    sfb_sig = np.stack([interleave(s) for s in ref.sigma_permute_rows(s_cat)])
    assert np.array_equal(ref.sigma_unpermute_rows(w_sig).view(np.uint8), w_cat.view(np.uint8))
    esc = np.array([1.25, 0.5], np.float32)
    inp = np.array([0.5, 0.25], np.float32) if fmt is bs.NVFP4 else None
    ids = np.array(ids)
    fused = ref.grouped_matmul_swiglu(a, w_sig, sfa, sfb_sig, starts, offs, ids, esc, inp, fmt,
                                      k=k, activation=act)
    gate_up = ref.grouped_matmul_block_scaled(a, w_cat, sfa, sfb_cat, starts, offs, ids, esc,
                                              fmt, k=k)
    chained = ref.fused_silu_quantize(gate_up, fmt, starts, offs, ids, inp, activation=act,
                                      num_scale_tiles=sfa.shape[0])
    assert fused[0].shape == (133, d // 2 if fmt.is_fp4 else d)
    assert np.array_equal(fused[0].view(np.uint8), chained[0].view(np.uint8))
    assert np.array_equal(fused[1].view(np.uint8), chained[1].view(np.uint8))
    assert fused[1].view(np.uint8).any() and fused[0].view(np.uint8).any()


def test_amd_mxfp4_matmuls():
    m, n, k, experts = 6, 5, 64, 2
    a, sa = _rand_operand(bs.MXFP4, m, k)
    b, sb = _rand_operand(bs.MXFP4, n, k)
    want = _dequant64(a, interleave(sa), bs.MXFP4, k) @ _dequant64(b, interleave(sb),
                                                                   bs.MXFP4, k).T
    got = ref.matmul_dynamic_block_scaled_mxfp4(a, b, sa, sb, out_dtype="float32")
    np.testing.assert_allclose(got, want, rtol=3e-7)
    bw, bsw = zip(*[_rand_operand(bs.MXFP4, n, k) for _ in range(experts)])
    bw, bsw = np.stack(bw), np.stack(bsw)
    out = ref.grouped_matmul_block_scaled_mxfp4(a, bw, sa, bsw, np.array([0, 2, 3, 5]),
                                                np.array([1, -1, 0]), out_dtype="float32")
    np.testing.assert_allclose(
        out[:2], ref.matmul_dynamic_block_scaled_mxfp4(a[:2], bw[1], sa[:2], bsw[1],
                                                       out_dtype="float32"))
    np.testing.assert_allclose(
        out[3:5], ref.matmul_dynamic_block_scaled_mxfp4(a[3:5], bw[0], sa[3:5], bsw[0],
                                                        out_dtype="float32"))
    assert not out[2].any() and not out[5].any()  # id -1 row and the row outside every group
    with pytest.raises(ValueError, match="multiple of 32"):
        ref.matmul_dynamic_block_scaled_mxfp4(a[:, :8], b[:, :8], sa[:, :1], sb[:, :1])

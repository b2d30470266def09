"""The portable grouped (MoE) block-scaled matmul kernels, run by the numpy interpreter.

Checked against the float64 value on exactly dequantized operands (bound of
test_matmul_common.py with two more fp32 multiplies: expert scale, row scale) and against
blockscale.reference; rows of groups with expert id -1 and rows past the last group are zero.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    dequantize_exact,
    f32_error_bound,
    random_data,
    random_scales_2d,
)

from blockscale import layouts
from blockscale import reference as ref
from blockscale.formats import FORMATS, MXFP4, NVFP4, Format
from blockscale.ops import matmul_grouped as mg

pytestmark = pytest.mark.interp


def make_grouped_case(rng: np.random.Generator, fmt: Format, counts: list[int],
                      ids: list[int], num_experts: int, n: int, k: int):
    """Hidden rows sorted by group, per-group padded 5-D A scales (tile0(g) = sum of earlier
    groups' ceil(n_h/128), as moe_create_indices gives), 6-D B scales."""
    es = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    t = int(es[-1])
    tiles = [-(-c // 128) for c in counts]
    tile0 = np.concatenate([[0], np.cumsum(tiles)])[:-1].astype(np.int64)
    offsets = tile0 - es[:-1] // 128
    total_tiles = max(1, int(sum(tiles)))
    j = fmt.kblocks(k)
    sfa_rows = np.zeros((total_tiles * 128, j), dtype=np.uint8)
    row_scales = random_scales_2d(rng, fmt, t, k)  # the scale row of each token
    for g, c in enumerate(counts):
        r0 = int(tile0[g]) * 128
        sfa_rows[r0:r0 + c] = row_scales.view(np.uint8)[es[g]:es[g] + c]
    sfa5 = layouts.interleave(sfa_rows.view(fmt.scale_dtype))
    hidden = random_data(rng, fmt, t, k)
    w = np.stack([random_data(rng, fmt, n, k) for _ in range(num_experts)])
    w_scales = [random_scales_2d(rng, fmt, n, k) for _ in range(num_experts)]
    sfb6 = np.stack([layouts.interleave(s) for s in w_scales])
    return {"hidden": hidden, "weight": w, "a_scales": sfa5, "b_scales": sfb6,
                "expert_start": es.astype(np.uint32), "a_scale_offsets": offsets.astype(np.uint32),
                "expert_ids": np.array(ids, dtype=np.int32)}, row_scales, w_scales


def exact_grouped(case, row_scales, w_scales, fmt, k, expert_scales, a_row_scales=None):
    """(exact float64 [T, N], abs-sum [T, N]) per the grouped contract."""
    es, ids = case["expert_start"].astype(np.int64), case["expert_ids"]
    t, n = case["hidden"].shape[0], case["weight"].shape[1]
    exact, abs_sum = np.zeros((t, n)), np.zeros((t, n))
    ad = dequantize_exact(case["hidden"], row_scales, fmt, k)
    rs = (np.ones(t) if a_row_scales is None else a_row_scales.astype(np.float64))
    for g, e in enumerate(ids):
        s, t_ = es[g], es[g + 1]
        if e < 0 or s == t_:
            continue
        wd = dequantize_exact(case["weight"][e], w_scales[e], fmt, k)
        factor = float(expert_scales[e]) * rs[s:t_, None]
        exact[s:t_] = (ad[s:t_] @ wd.T) * factor
        abs_sum[s:t_] = (np.abs(ad[s:t_]) @ np.abs(wd).T) * np.abs(factor)
    return exact, abs_sum


GPU_CASES = [  # (counts, ids, E, N, K): MAX's grouped NVFP4 dispatch cases (SEMANTICS §5)
    ([128, 256, 512, 1024], [0, 1, 2, 3], 4, 2048, 1024),
    ([2, 2, 2, 2], [0, 1, 2, 3], 4, 2048, 1024),
    ([65, 129, 257], [0, 1, 2], 4, 2048, 1024),
    ([0, 3, 1, 2], [-1, 2, -1, 0], 4, 2048, 1024),
    ([64], [0], 6, 7168, 2048),
]


def check_grouped_on_gpu(fmt: Format, case_id: int) -> None:
    """GPU_CASES[case_id] through :func:`grouped_matmul_block_scaled` on CUDA, sm_90a (the
    dispatcher picks the kernel; NVFP4 with ``a_row_scales``): the bf16 output is consistent
    with the exact value (tests/test_matmul_{fast_,}gpu.py)."""
    counts, ids, e_count, n, k = GPU_CASES[case_id]
    rng = np.random.default_rng(case_id)
    case, row_scales, w_scales = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
    esc = (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)
    rows = rng.uniform(0.5, 2, sum(counts)).astype(ml_dtypes.bfloat16) if fmt is NVFP4 \
        else None
    out = mg.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=fmt, k=k,
                                         a_row_scales=rows, device="cuda", target="sm_90a")
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, fmt, k, esc, rows)
    # MX: the grouped wgmma kernel's "fold" rounds up to twice per 32-block (J more)
    extra = fmt.kblocks(k) if fmt.is_mx else 0
    assert_bf16_consistent(out, exact, f32_error_bound(
        abs_sum, fmt, k, n_mul=(2 if rows is not None else 1) + extra))


CASES = [  # (counts, expert ids, num experts, N, K)
    ([0, 3, 1, 2], [-1, 2, -1, 0], 3, 40, 128),
    ([65, 129, 257], [0, 1, 2], 3, 16, 64),
    ([2, 2, 2, 2], [3, 1, 0, 2], 4, 24, 96),
]


@pytest.mark.parametrize("case_id", range(len(CASES)))
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_grouped_matches_exact_and_reference(fmt, case_id):
    counts, ids, e_count, n, k = CASES[case_id]
    rng = np.random.default_rng(100 + case_id)
    case, row_scales, w_scales = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
    esc = (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)  # MAX's test choice
    out = mg.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=fmt, k=k,
                                         device="interp")
    assert out.dtype == ml_dtypes.bfloat16 and out.shape == (sum(counts), n)
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, fmt, k, esc)
    assert_bf16_consistent(out, exact, f32_error_bound(abs_sum, fmt, k, n_mul=1))
    want = ref.grouped_matmul_block_scaled(case["hidden"], case["weight"], case["a_scales"],
                                           case["b_scales"], case["expert_start"],
                                           case["a_scale_offsets"], case["expert_ids"], esc,
                                           fmt, k=k)
    assert np.sum(out.view(np.uint16) != want.view(np.uint16)) <= max(1, out.size // 100)
    es = case["expert_start"]
    for g, e in enumerate(ids):  # D8: id -1 rows are zero bytes
        if e < 0:
            assert not np.any(out[es[g]:es[g + 1]].view(np.uint16))


def test_grouped_row_scales_after_expert_scale():
    """a_row_scales (bf16, NVFP4) multiply after the expert scale, in fp32 (D10)."""
    counts, ids, e_count, n, k = [5, 0, 7], [1, 0, 0], 2, 20, 64
    rng = np.random.default_rng(5)
    case, row_scales, w_scales = make_grouped_case(rng, NVFP4, counts, ids, e_count, n, k)
    esc = np.array([0.75, 1.3], np.float32)
    rows = rng.uniform(0.25, 4, sum(counts)).astype(ml_dtypes.bfloat16)
    out = mg.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=NVFP4, k=k,
                                         a_row_scales=rows, device="interp")
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, NVFP4, k, esc, rows)
    assert_bf16_consistent(out, exact, f32_error_bound(abs_sum, NVFP4, k, n_mul=2))
    want = ref.grouped_matmul_block_scaled(case["hidden"], case["weight"], case["a_scales"],
                                           case["b_scales"], case["expert_start"],
                                           case["a_scale_offsets"], case["expert_ids"], esc,
                                           NVFP4, k=k, a_row_scales=rows)
    assert np.sum(out.view(np.uint16) != want.view(np.uint16)) <= 1


def test_grouped_mx_without_expert_scales_means_ones():
    counts, ids, e_count, n, k = [3, 4], [1, 0], 2, 8, 64
    rng = np.random.default_rng(8)
    case, _, _ = make_grouped_case(rng, MXFP4, counts, ids, e_count, n, k)
    a = mg.grouped_matmul_block_scaled(**case, expert_scales=None, fmt=MXFP4, device="interp")
    b = mg.grouped_matmul_block_scaled(**case, expert_scales=np.ones(2, np.float32), fmt=MXFP4,
                                       device="interp")
    assert np.array_equal(a.view(np.uint16), b.view(np.uint16))


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_grouped_mxfp4_row_major(out_dtype):
    """AMD-style grouped MXFP4: row-major scales, row_offsets ending before T, id -1."""
    rng = np.random.default_rng(12)
    counts, ids, e_count, n, k = [4, 0, 9, 3], [2, 0, -1, 0], 3, 24, 128
    ro = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
    t = int(ro[-1]) + 5  # 5 rows outside every group
    a, sa = random_data(rng, MXFP4, t, k), random_scales_2d(rng, MXFP4, t, k)
    b = np.stack([random_data(rng, MXFP4, n, k) for _ in range(e_count)])
    sb = np.stack([random_scales_2d(rng, MXFP4, n, k) for _ in range(e_count)])
    out = mg.grouped_matmul_block_scaled_mxfp4(a, b, sa, sb, ro, np.array(ids, np.int32),
                                               out_dtype=out_dtype, device="interp")
    want = ref.grouped_matmul_block_scaled_mxfp4(a, b, sa, sb, ro, np.array(ids, np.int32),
                                                 out_dtype=out_dtype)
    assert out.dtype == want.dtype
    ad = dequantize_exact(a, sa, MXFP4, k)
    for g, e in enumerate(ids):
        s, e_ = ro[g], ro[g + 1]
        if e < 0:
            assert not np.any(out[s:e_])
            continue
        wd = dequantize_exact(b[e], sb[e], MXFP4, k)
        bound = f32_error_bound(np.abs(ad[s:e_]) @ np.abs(wd).T, MXFP4, k, n_mul=1)
        if out_dtype == "float32":
            assert np.all(np.abs(out[s:e_] - ad[s:e_] @ wd.T) <= bound)
        else:
            assert_bf16_consistent(out[s:e_], ad[s:e_] @ wd.T, bound)
    assert not np.any(out[ro[-1]:])
    assert np.sum(out.view(np.uint8) != want.view(np.uint8)) <= max(1, out.size // 50)


# ---- validation -----------------------------------------------------------------------------

def _small_case():
    rng = np.random.default_rng(1)
    case, _, _ = make_grouped_case(rng, NVFP4, [2, 3], [0, 1], 2, 8, 32)
    return case


@pytest.mark.parametrize("change,exc,words", [
    ({"expert_ids": np.array([0, 2], np.int32)}, ValueError, "expert_ids"),
    ({"expert_ids": np.array([0], np.int32)}, ValueError, "expert_ids must have length 2"),
    ({"expert_start": np.array([0, 3, 2], np.uint32)}, ValueError, "non-decreasing"),
    ({"expert_start": np.array([0, 2, 4], np.uint32)}, ValueError, "expert_start[-1]"),
    ({"a_scale_offsets": np.array([0, 7], np.uint32)}, ValueError, "a_scale_offsets[1]"),
    ({"b_scales": np.zeros((2, 1, 1, 32, 4, 4), np.uint8)}, TypeError, "b_scales must have dtype"),
    ({"hidden": np.zeros((5, 15), np.uint8)}, ValueError, "weight.shape[2]"),
])
def test_grouped_validation(change, exc, words):
    case = {**_small_case(), **change}
    with pytest.raises(exc, match=words.replace("[", r"\[").replace("]", r"\]")):
        mg.grouped_matmul_block_scaled(**case, expert_scales=np.ones(2, np.float32),
                                       fmt=NVFP4, device="interp")


def test_grouped_nvfp4_requires_expert_scales():
    with pytest.raises(ValueError, match="expert_scales must be given for nvfp4"):
        mg.grouped_matmul_block_scaled(**_small_case(), expert_scales=None, fmt=NVFP4,
                                       device="interp")


def test_grouped_row_scales_nvfp4_only():
    rng = np.random.default_rng(2)
    case, _, _ = make_grouped_case(rng, MXFP4, [2], [0], 1, 8, 64)
    with pytest.raises(ValueError, match="a_row_scales is NVFP4 only"):
        mg.grouped_matmul_block_scaled(**case, expert_scales=None, fmt=MXFP4,
                                       a_row_scales=np.ones(2, ml_dtypes.bfloat16),
                                       device="interp")

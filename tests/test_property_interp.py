"""Property tests: the compiled ops, run by the numpy interpreter on each of the four targets,
equal the numpy reference byte for byte (quantize, grouped quantize, fused SiLU quantize,
interleave) or within the stated bound (naive matmul, fp32 accumulation).

Hypothesis draws the shapes, formats, roundings, tensor scales, group layouts and a seed; the
values are then made from the seed with a controlled share of special values: E2M1 / E4M3 /
E8M0 rounding ties, NaN, +-Inf, -0, bf16 subnormals, values near the saturation limits.
Derandomized (reproducible in CI), deadline off, few examples per property (~1 min total).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _quantize_helpers import assert_same_bytes

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("mlir")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from blockscale import reference as ref  # noqa: E402
from blockscale.ops import interleave as IL  # noqa: E402
from blockscale.ops import matmul as MM  # noqa: E402
from blockscale.ops import quantize as Q  # noqa: E402
from blockscale.ops import quantize_grouped as QG  # noqa: E402
from blockscale.ops import quantize_silu as QS  # noqa: E402

pytestmark = pytest.mark.interp
TARGETS = ("sm_90a", "sm_100a", "gfx942", "gfx950")
BF16 = ml_dtypes.bfloat16
SETTINGS = settings(max_examples=24, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(hypothesis.HealthCheck))

#: values at rounding boundaries of E2M1 (x scale), E4M3 and E8M0, signed zeros, bf16 subnormals
SPECIALS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -6.0, 448.0, 464.0, -480.0,
                     -0.0, 0.0, 1e-39, -9.2e-41, 2.0 ** -126, 3.0e38, -3.3e38, 0.5, 1.0],
                    np.float32)


def _values(rng: np.random.Generator, shape: tuple[int, int], special: float, nonfinite: float,
            scale_exp: int) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(2.0 ** scale_exp)
    n = x.size
    pick = rng.random(n) < special
    x.flat[np.flatnonzero(pick)] = rng.choice(SPECIALS, int(pick.sum())) * \
        np.float32(2.0 ** rng.integers(-3, 4))
    bad = rng.random(n) < nonfinite
    x.flat[np.flatnonzero(bad)] = rng.choice(np.array([np.nan, np.inf, -np.inf], np.float32),
                                             int(bad.sum()))
    if shape[0] > 1 and rng.random() < 0.3:  # an all-zero (or -0) row: zero guard D1
        x[rng.integers(shape[0])] = -0.0 if rng.random() < 0.5 else 0.0
    with np.errstate(over="ignore"):
        return x.astype(BF16)


values_params = st.tuples(st.integers(0, 2**31 - 1), st.sampled_from([0.0, 0.05, 0.3]),
                          st.sampled_from([0.0, 0.0, 0.02]), st.integers(-20, 12))

fmt_rounding = st.sampled_from([("nvfp4", None), ("mxfp4", "up"), ("mxfp4", "even"),
                                ("mxfp4", "floor"), ("mxfp8", "up"), ("mxfp8", "even"),
                                ("mxfp8", "floor")])


@SETTINGS
@given(fr=fmt_rounding, target=st.sampled_from(TARGETS), m=st.integers(1, 40),
       k_half=st.integers(1, 100), odd=st.booleans(), vp=values_params,
       tsf=st.sampled_from([1.0, 0.43, 3.0, 1e-3, 768.0]),
       layout=st.sampled_from(["tcgen5d", "tcgen5d", "row_major"]))
def test_dense_quantize_matches_reference(fr, target, m, k_half, odd, vp, tsf, layout):
    fmt, rounding = fr
    k = 2 * k_half - (1 if odd and fmt == "mxfp8" else 0)
    seed, special, nonfinite, exp = vp
    x = _values(np.random.default_rng(seed), (m, k), special, nonfinite, exp)
    kw = dict(scale_rounding=rounding, scale_layout=layout,
              tensor_sf=tsf if fmt == "nvfp4" else 1.0)
    d, s = Q.quantize_dynamic_block_scaled(x, fmt, device="interp", target=target, **kw)
    rd, rs = ref.quantize_dynamic_block_scaled(x, fmt, **kw)
    assert_same_bytes(d, rd, f"{fmt}/{rounding} {target} data")
    assert_same_bytes(s, rs, f"{fmt}/{rounding} {target} scales")


def _group_layout(rng: np.random.Generator, g: int, t: int, unused: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """expert_start (random cuts incl. empty groups), scales_offsets (tile0 = sum of earlier
    groups' tiles, as moe_create_indices), expert_ids (distinct experts, some -1)."""
    cuts = np.sort(rng.integers(0, t + 1, g - 1))
    es = np.concatenate([[0], cuts, [t]]).astype(np.int32)
    counts = np.diff(es)
    tiles = -(-counts // 128)
    tile0 = np.concatenate([[0], np.cumsum(tiles)[:-1]])
    offs = (tile0 - es[:-1] // 128).astype(np.int32)
    empty = counts == 0  # an empty group's placement means nothing: any offset is valid
    offs[empty] = rng.integers(-2, 3, int(empty.sum()))
    ids = rng.permutation(g + 2)[:g].astype(np.int32)
    ids[rng.random(g) < unused] = -1
    return es, offs, ids


@SETTINGS
@given(fmt=st.sampled_from(["nvfp4", "mxfp4", "mxfp8"]), target=st.sampled_from(TARGETS),
       g=st.integers(1, 5), t=st.sampled_from([0, 1, 7, 33, 130, 260]),
       k_half=st.integers(1, 72), vp=values_params, unused=st.sampled_from([0.0, 0.3]),
       gather=st.booleans())
def test_grouped_quantize_matches_reference(fmt, target, g, t, k_half, vp, unused, gather):
    seed, special, nonfinite, exp = vp
    rng = np.random.default_rng(seed)
    k = 2 * k_half
    es, offs, ids = _group_layout(rng, g, t, unused)
    tsf = (rng.uniform(0.01, 50, g + 2).astype(np.float32) if fmt == "nvfp4" else None)
    kw: dict = {}
    x_rows = t
    if gather:
        x_rows = max(1, t // 2 + 1)
        div = int(rng.integers(1, 3))
        kw = dict(indices=rng.integers(0, x_rows * div, t).astype(np.int32), indices_divisor=div)
    x = _values(rng, (x_rows, k), special, nonfinite, exp)
    d, s = QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, device="interp",
                                              target=target, **kw)
    rd, rs = ref.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, **kw)
    assert_same_bytes(d, rd, f"grouped {fmt} {target} data")
    assert_same_bytes(s, rs, f"grouped {fmt} {target} scales")


@SETTINGS
@given(fmt=st.sampled_from(["nvfp4", "mxfp8", "mxfp4"]), target=st.sampled_from(TARGETS),
       act=st.sampled_from(["silu", "swiglu_oai"]), g=st.integers(1, 4),
       t=st.sampled_from([1, 9, 129]), d_half=st.integers(1, 40), vp=values_params)
def test_fused_silu_quantize_matches_reference(fmt, target, act, g, t, d_half, vp):
    seed, special, nonfinite, exp = vp
    rng = np.random.default_rng(seed)
    es, offs, ids = _group_layout(rng, g, t, 0.25)
    isc = rng.uniform(0.01, 4, g + 2).astype(np.float32) if fmt == "nvfp4" else None
    gu = _values(rng, (t, 4 * d_half), special, nonfinite, min(exp, 4))
    d, s = QS.fused_silu_quantize(gu, fmt, es, offs, ids, isc, activation=act, device="interp",
                                  target=target)
    rd, rs = ref.fused_silu_quantize(gu, fmt, es, offs, ids, isc, activation=act)
    assert_same_bytes(d, rd, f"silu {fmt} {act} {target} data")
    assert_same_bytes(s, rs, f"silu {fmt} {act} {target} scales")


@SETTINGS
@given(target=st.sampled_from(TARGETS), rows=st.integers(1, 300), kblocks=st.integers(1, 40),
       dtype=st.sampled_from(["uint8", "float8_e4m3fn", "float8_e8m0fnu"]),
       seed=st.integers(0, 2**31 - 1))
def test_interleave_matches_reference(target, rows, kblocks, dtype, seed):
    raw = np.random.default_rng(seed).integers(0, 256, (rows, kblocks)).astype(np.uint8)
    s = raw.view(np.dtype(getattr(ml_dtypes, dtype, dtype)))
    got = IL.block_scales_interleave(s, device="interp", target=target)
    assert_same_bytes(got, ref.block_scales_interleave(s), f"interleave {dtype} {target}")


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(hypothesis.HealthCheck))
@given(fmt=st.sampled_from(["nvfp4", "mxfp4", "mxfp8"]), target=st.sampled_from(TARGETS),
       m=st.integers(1, 20), n=st.integers(1, 20), k_half=st.integers(1, 80),
       seed=st.integers(0, 2**31 - 1), alpha=st.sampled_from([1.0, 0.37, 12.0]))
def test_naive_matmul_within_fp32_bound(fmt, target, m, n, k_half, seed, alpha):
    """|C - ref| <= K * 2^-24 * alpha * sum|a*b| (any fp32 summation order) + one output
    rounding (bf16: 2^-8 relative) (reference.matmul docstring)."""
    rng = np.random.default_rng(seed)
    k = 2 * k_half
    # finite inputs (NaN / Inf blocks are covered byte-exactly by the quantize properties)
    a, sfa = ref.quantize_dynamic_block_scaled(_values(rng, (m, k), 0.0, 0.0, 0), fmt)
    b, sfb = ref.quantize_dynamic_block_scaled(_values(rng, (n, k), 0.0, 0.0, 0), fmt)
    got = MM.naive_block_scaled_matmul(a, b, sfa, sfb, fmt, k=k, alpha=alpha,
                                       out_dtype="float32", device="interp", target=target)
    want = ref.naive_block_scaled_matmul(a, b, sfa, sfb, fmt, k=k, alpha=alpha,
                                         out_dtype="float32")
    av = ref.dequantize_block_scaled(a, sfa, fmt, k=k).astype(np.float64)
    bv = ref.dequantize_block_scaled(b, sfb, fmt, k=k).astype(np.float64)
    bound = k * 2.0 ** -24 * alpha * (np.abs(av) @ np.abs(bv).T) + 2.0 ** -23 * np.abs(want)
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert np.all(err <= bound + 1e-30), f"max excess {np.max(err - bound)}"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_empty_group_sharing_tile0_with_its_neighbour(fmt, target):
    """Regression (found by benchmarks/sanitize_driver.py): an empty group placed at the same
    tile0 as the non-empty group before it must not take over that group's tiles in the
    kernel's binary search (the reference ignores empty groups' placement)."""
    es = np.array([0, 0, 1, 1], np.int32)
    offs = np.zeros(3, np.int32)
    ids = np.array([3, 0, -1], np.int32)
    tsf = np.array([0.5, 2.0, 4.0, 1.0], np.float32) if fmt == "nvfp4" else None
    x = _values(np.random.default_rng(5), (1, 136), 0.1, 0.0, 0)
    d, s = QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, device="interp",
                                              target=target)
    rd, rs = ref.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf)
    assert_same_bytes(d, rd, "data")
    assert_same_bytes(s, rs, "scales")
    gu = _values(np.random.default_rng(6), (1, 272), 0.0, 0.0, 0)
    d, s = QS.fused_silu_quantize(gu, fmt, es, offs, ids, tsf, device="interp", target=target)
    rd, rs = ref.fused_silu_quantize(gu, fmt, es, offs, ids, tsf)
    assert_same_bytes(d, rd, "silu data")
    assert_same_bytes(s, rs, "silu scales")

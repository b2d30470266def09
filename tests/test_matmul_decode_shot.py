"""The one-shot decode variants (``variant="mma_shot"`` / ``"mma_shot7k"`` /
``"mma_shot16"`` / ``"mma_shot32"`` / ``"mma_shot6"`` / ``"mma_shot1"``, FP4;
blockscale/ops/_decode_shot_ir.py) run by the numpy interpreter, their K limit and their
dispatch switch.

Numerics: warp w of a CTA sums the block terms of K chunks ``[w * per, (w + 1) * per)``
(``per = ceil(K / 32 / W)``, W = 4 warps, 6 for "mma_shot6", 8 for "mma_shot32") from zero exactly as the "mma"
kernels do on that K slice (one rounding per block, K order), and warp 0 adds the partials in
warp order 0, 1, .., W - 1.
Dense float32 is compared bit for bit with that model (the "mma_c8t" kernel, bit-identical to
the portable kernel, on each warp's K slice, summed in order in numpy), plus the fp32 bound
of test_matmul_common (J - 1 roundings on an output's path, as the sequential chain); scales
span many binades so that the order shows in the bits (the reversed order differs). Grouped
bf16 outputs are checked against the bound (D8 zero rows of an unused group, D10 row scales),
and every output is the same from run to run.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    assert_f32_within_bound,
    exact_dense,
    f32_error_bound,
)
from test_matmul_decode_mma import record_variants
from test_matmul_decode_psk import GroupedDecodeCase, _case, ordered_sum, slice_run
from test_matmul_grouped import exact_grouped, make_grouped_case

from blockscale import layouts
from blockscale.formats import MXFP4, MXFP8, NVFP4
from blockscale.ops import matmul, matmul_decode, matmul_grouped

pytestmark = pytest.mark.interp

FP4 = (NVFP4, MXFP4)
# (M, N, K): one pass and an N tail; two passes (9 rows); three passes at the K limit; K of 3
# chunks (warp 3 has none). "mma_shot16": a pass of <= 8 rows, of 9, of 16 + 1 row
DENSE = [(1, 40, 1024), (9, 20, 2080), (17, 33, 3072), (2, 18, 96)]
DENSE16 = [(3, 20, 1024), (9, 33, 2080), (17, 20, 3072)]
# "mma_shot32" (32 columns, 8 warps): an N tail of 8 (the second M-tile half empty), two
# passes, 3 chunks (5 warps without any)
DENSE32 = [(1, 40, 1024), (9, 70, 2080), (2, 33, 96)]
# (counts, expert ids, experts, N, K): an unused group (D8), an empty one, a group of 9 rows
GROUPED = [([3, 0, 5, 1], [0, 1, -1, 1], 2, 40, 1056),
           ([9, 2], [1, 0], 2, 20, 512)]


def _run(fmt, a, b, sfa, sfb, k, variant="mma_shot", alpha=1.0, out="float32"):
    return matmul_decode.block_scaled_matmul_decode(
        a, b, layouts.interleave(sfa), layouts.interleave(sfb), fmt, k=k, alpha=alpha,
        out_dtype=out, device="interp", variant=variant)


def _warp_partials(fmt, a, b, sfa, sfb, k, warps):
    """Each warp's fp32 sum (alpha 1) over its K slice: the "mma_c8t" kernel (bit-identical
    to the portable kernel) on that slice; zeros for an empty slice."""
    chunks = k // 32
    per = -(-chunks // warps)
    out = []
    for w in range(warps):
        lo, hi = min(w * per, chunks) * 32, min((w + 1) * per, chunks) * 32
        if lo == hi:
            out.append(np.zeros((a.shape[0], b.shape[0]), np.float32))
            continue
        out.append(slice_run(fmt, a, b, sfa, sfb, lo, hi, "mma_c8t"))
    return out


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize(("variant", "mnk"),
                         [("mma_shot", c) for c in DENSE] + [("mma_shot16", c) for c in DENSE16]
                         + [("mma_shot32", c) for c in DENSE32]
                         + [("mma_shot6", c) for c in DENSE[:2]]
                         + [("mma_shot1", c) for c in DENSE[1:]],
                         ids=lambda x: x if isinstance(x, str) else "x".join(map(str, x)))
def test_dense_shot_bit_exact_warp_order_model(fmt, variant, mnk):
    m, n, k = mnk
    a, b, sfa, sfb = _case(fmt, m, n, k, seed=sum(mnk) + 5)
    alpha = 0.375
    got = _run(fmt, a, b, sfa, sfb, k, variant, alpha=alpha)
    assert got.dtype == np.float32 and got.shape == (m, n)
    warps = matmul_decode.SHOT_WARPS[variant]
    parts = _warp_partials(fmt, a, b, sfa, sfb, k, warps)
    want = ordered_sum(parts, list(range(warps))) * np.float32(alpha)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    if k >= 1024:  # the order is visible in the bits (wide scales): a fixed warp order
        rev = ordered_sum(parts, list(range(warps))[::-1]) * np.float32(alpha)
        assert not np.array_equal(rev.view(np.uint32), want.view(np.uint32))
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, alpha)
    assert_f32_within_bound(got, exact, f32_error_bound(abs_sum, fmt, k, n_mul=1))
    again = _run(fmt, a, b, sfa, sfb, k, variant, alpha=alpha)  # deterministic
    assert np.array_equal(got.view(np.uint32), again.view(np.uint32))


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_dense_shot7k_at_its_limit_bf16(fmt):
    """"mma_shot7k" at K = 7168 (DeepSeek-V3): bf16 within the bound; NaN scales (D5) give
    a NaN column (weight) and a NaN row (activation) in whichever warp's slice they fall."""
    m, n, k = 2, 20, 7168
    a, b, sfa, sfb = _case(fmt, m, n, k, seed=11)
    got = _run(fmt, a, b, sfa, sfb, k, "mma_shot7k", 1.5, "bfloat16")
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, 1.5)
    assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, fmt, k, n_mul=2))
    nan_code = 0x7F if fmt is NVFP4 else 0xFF
    jb = k // fmt.block_size
    sfb.view(np.uint8)[17, jb - 1] = nan_code  # the last warp's slice
    sfa.view(np.uint8)[1, 2] = nan_code  # the first warp's
    got = _run(fmt, a, b, sfa, sfb, k, "mma_shot7k")
    nan = np.isnan(got)
    assert nan[:, 17].all() and nan[1].all() and nan.sum() == m + n - 1


@pytest.mark.parametrize("variant", ["mma_shot", "mma_shot16", "mma_shot32", "mma_shot6",
                                     "mma_shot1"])
@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("case_id", range(len(GROUPED)))
def test_grouped_shot_within_bound(case_id, fmt, variant):
    c = GroupedDecodeCase(GROUPED[case_id], fmt, 40 + case_id)
    case, kw = c.case, c.kw
    got = matmul_decode.grouped_matmul_decode(**case, **kw, variant=variant)
    c.check(got)  # the bf16 bound; D8: the rows of an unused group are (+0) zeros
    again = matmul_decode.grouped_matmul_decode(**case, **kw, variant=variant)
    assert np.array_equal(got.view(np.uint16), again.view(np.uint16))


def test_shot_k_limit_rejected():
    """K past a variant's shared rows: ValueError naming k, the limit and the variant (both
    direct calls); MXFP8 is no one-shot format."""
    rng = np.random.default_rng(2)
    m, n, k = 1, 16, 3104
    a, b, sfa, sfb = _case(NVFP4, m, n, k, seed=2)
    with pytest.raises(ValueError, match=r"k must be <= 3072 for variant 'mma_shot'.*3104"):
        _run(NVFP4, a, b, sfa, sfb, k)
    case, _rs, _ws = make_grouped_case(rng, NVFP4, [1], [0], 1, 16, 7200)
    with pytest.raises(ValueError, match=r"k must be <= 7168 for variant 'mma_shot7k'"):
        matmul_decode.grouped_matmul_decode(**case, expert_scales=np.ones(1, np.float32),
                                            fmt=NVFP4, k=7200, device="interp",
                                            variant="mma_shot7k")
    with pytest.raises(ValueError, match="needs an FP4 format"):
        matmul_decode.DecodeSpec("mxfp8", "dense", variant="mma_shot")
    assert matmul_decode.shot_variant(3072) == "mma_shot"
    assert matmul_decode.shot_variant(3104) == "mma_shot7k"
    assert matmul_decode.shot_variant(7200) is None
    assert matmul_decode.shot_variant(3072, 9) == "mma_shot16"
    assert matmul_decode.shot_variant(3104, 16) == "mma_shot7k"
    assert matmul_decode.shot_variant(3072, 17) == "mma_shot"


@pytest.mark.parametrize(("env", "m", "k", "want"), [
    ("mma_shot", 1, 1024, "mma_shot"), ("mma_shot", 1, 3104, "mma_shot7k"),
    ("mma_shot", 1, 7200, matmul_decode.SHOT_FALLBACK), ("mma_shot", 12, 512, "mma_shot16"),
    ("mma_shot32", 1, 512, "mma_shot32"), ("mma_shot32", 1, 3104, "mma_shot7k"),
    (None, 1, 1024, "mma_leanb_t8_n2"), (None, 16, 512, "mma_leanb_t16_n2"),
    (None, 1, 1056, "mma_shot"), (None, 16, 3136, "mma_leanb_t16_n2_k7168"),
    (None, 16, 3104, "mma_shot7k"), (None, 3, 7200, "mma_c8")])
def test_dispatch_env_shot_picks_by_k(monkeypatch, env, m, k, want):
    """BLOCKSCALE_DECODE_VARIANT=mma_shot: the dense dispatch runs the one-shot kernel that
    holds K ("mma_shot16" for 9..16 rows), and SHOT_FALLBACK where none does (never a kernel
    that cannot); a named one-shot variant runs where it holds K. The default (env unset):
    the lean kernel where it takes K (K % 64 == 0, K <= 7168 with one CTA an SM), else the
    same one-shot pick."""
    assert dense_dispatch_launch(monkeypatch, env, NVFP4, m, 16, k) == want


def dense_dispatch_launch(monkeypatch, env, fmt, m, n, k):
    """The decode variant the dense dispatch launches under BLOCKSCALE_DECODE_VARIANT=``env``
    (None: unset, the default) for an (M, N, K) case, its result checked against the fp32
    bound (interpreter)."""
    launched = record_variants(monkeypatch)
    if env is None:  # the default (DEFAULT_VARIANT "mma_lean")
        monkeypatch.delenv(matmul_decode.VARIANT_ENV, raising=False)
    else:
        monkeypatch.setenv(matmul_decode.VARIANT_ENV, env)
    a, b, sfa, sfb = _case(fmt, m, n, k, seed=k)
    got = matmul.block_scaled_matmul(a, b, layouts.interleave(sfa), layouts.interleave(sfb),
                                     fmt, k=k, out_dtype="float32", device="interp",
                                     target="sm_90a")
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k)
    assert_f32_within_bound(got, exact, f32_error_bound(abs_sum, fmt, k, n_mul=1))
    return launched[0]


def test_grouped_dispatch_env_shot(monkeypatch):
    """The grouped dispatch with BLOCKSCALE_DECODE_VARIANT=mma_shot launches "mma_shot";
    MXFP8 keeps its own variant (BLOCKSCALE_DECODE_MX8_VARIANT)."""
    launched = record_variants(monkeypatch)
    monkeypatch.setenv(matmul_decode.VARIANT_ENV, "mma_shot")
    rng = np.random.default_rng(8)
    case, row_scales, w_scales = make_grouped_case(rng, NVFP4, [1, 2], [1, 0], 2, 24, 512)
    esc = np.ones(2, np.float32)
    got = matmul_grouped.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=NVFP4,
                                                     k=512, device="interp", target="sm_90a")
    assert launched[0] == "mma_shot"
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, NVFP4, 512, esc)
    assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, NVFP4, 512, n_mul=2))
    assert matmul_decode.dispatch_variant(MXFP8, grouped=True) == \
        matmul_decode.DEFAULT_MX8_VARIANT


def test_shot_bundled_and_sized():
    """The one-shot variants are bundled (grouped, row scales, dense; both FP4 formats) and
    their dynamic shared memory holds 16 weight + 8 / 16 activation rows of K / 2 (+ pad)
    bytes."""
    specs = [s for s in matmul_decode.bundle_specs("sm_90a")
             if s.variant in matmul_decode.SHOT_KCAP]
    assert {(s.variant, s.fmt, s.mode, s.row_scales) for s in specs} >= {
        (v, f, mo, False) for v in matmul_decode.SHOT_KCAP for f in ("nvfp4", "mxfp4")
        for mo in ("grouped", "dense")}
    for s in specs:
        cap = matmul_decode.SHOT_KCAP[s.variant]
        warps = matmul_decode.SHOT_WARPS[s.variant]
        assert s.cols == (32 if s.variant == "mma_shot32" else 16)
        assert s.block == (32 * warps, 1, 1)
        assert s.dynamic_shared_bytes >= (s.cols + matmul_decode.SHOT_TOKENS[s.variant]) \
            * cap // 2 + 8 * warps
        assert (matmul_decode.shot_row_stride(cap) // 16) % 2 == 1


_SHOT_SPECS = [s for s in matmul_decode.bundle_specs("sm_90a")
               if s.variant in matmul_decode.SHOT_KCAP]


@pytest.mark.lower
@pytest.mark.parametrize("spec", _SHOT_SPECS, ids=lambda s: s.kernel_name)
def test_shot_sass(spec):
    """sm_90a SASS: the weight / activation rows by cp.async.bulk (UBLKCP), no spill at the
    128-register cap, 2 HMMA.16816.F32 per 16-byte chunk and n-tile (two chunks per iteration
    of the chunk loop, one more for an odd count: 6 in all; "mma_shot16" also has the
    two-n-tile loop: 18), no global load or local memory access in the chunk loop; shared
    memory and registers for 4 CTAs per SM ("mma_shot") / 2 ("mma_shot7k", "mma_shot32": 256
    threads) / 3 ("mma_shot16"; "mma_shot6": 192 threads)."""
    from test_matmul_decode_lower import _ops, _step_loop

    kernel = matmul_decode.kernel(spec)
    meta, ops = kernel.meta, _ops(kernel.asm["sass"])
    assert 0 < meta["registers"] <= matmul_decode.VARIANT_REGISTERS[spec.variant], meta
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0, meta
    # (mma_shot16: + the two-n-tile loop; mma_shot32: two M-tiles a chunk)
    assert ops.count("HMMA.16816.F32") == 6 * {"mma_shot16": 3, "mma_shot32": 2}.get(
        spec.variant, 1)
    assert any(o.startswith("UBLKCP") for o in ops)
    loop = _step_loop(kernel.asm["sass"])
    assert loop.count("HMMA.16816.F32") == 4 * (2 if spec.variant == "mma_shot32" else 1)
    assert not [o for o in loop if o.startswith(("LDG", "LDL", "STL"))], loop
    # every buffer in the dynamic shared memory: the runtime opts in above 48 KB of it, and
    # static + dynamic > 48 KB with less dynamic would not launch
    assert meta["static_shared_bytes"] == 0, meta
    smem = spec.dynamic_shared_bytes + 1024  # (+ the CTA's
    per_sm = {"mma_shot": 4, "mma_shot7k": 2, "mma_shot16": 3,  # reserved 1 KB)
              "mma_shot32": 2, "mma_shot6": 3, "mma_shot1": 4}[spec.variant]
    assert per_sm * 32 * matmul_decode.SHOT_WARPS[spec.variant] * meta["registers"] <= 65536
    assert per_sm * smem <= 228 * 1024, smem


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_dense_shot_sm100_ir(fmt):
    """The IR is portable to sm_100a (cp.async.bulk, mbarriers, mma.sync): the same bits."""
    m, n, k = 3, 20, 512
    a, b, sfa, sfb = _case(fmt, m, n, k, seed=4)
    args = (a, b, layouts.interleave(sfa), layouts.interleave(sfb), fmt)
    got = {t: matmul_decode.block_scaled_matmul_decode(*args, k=k, out_dtype="float32",
                                                       device="interp", target=t,
                                                       variant="mma_shot")
           for t in ("sm_90a", "sm_100a")}
    assert np.array_equal(got["sm_90a"].view(np.uint32), got["sm_100a"].view(np.uint32))

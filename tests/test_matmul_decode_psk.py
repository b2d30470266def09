"""The split-K prmt decode variant (``variant="mma_psk"``, FP4) run by the numpy interpreter,
its split choice, its counter cache and its dispatch switch.

Numerics: split z of S sums its K steps from a zero accumulator exactly as "mma_p" (= "mma",
bit for bit) does on that K slice; the reducing CTA adds the S fp32 partials in split order
0..S-1 (fixed: deterministic), then alpha / expert scale / row scale. The block terms are
exact and every split's first add is exact (from zero), so an output still goes through
sum_z (J_z - 1) + (S - 1) = J - 1 fp32 additions: the summation tree is deeper than none of
the sequential chain's, and Higham's bound gamma_{J-1} * S (test_matmul_common's
``f32_error_bound`` with the same ``roundings`` count, ``n_mul`` the final multiplies) holds.
Dense float32 is compared bit for bit with that model (the "mma_p" kernel on each K slice,
summed in order in numpy), plus the bound; grouped bf16 against the bound. Scales span many
binades so that the partial sums round: the reversed split order gives other bits, and the
result does not depend on which CTA reduces.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    assert_f32_within_bound,
    exact_dense,
    f32_error_bound,
    random_data,
    random_dense_case,
)
from test_matmul_decode_mma import record_variants
from test_matmul_grouped import exact_grouped, make_grouped_case

from blockscale import layouts, runtime
from blockscale.formats import MXFP4, NVFP4
from blockscale.ops import matmul, matmul_decode, matmul_grouped

pytestmark = pytest.mark.interp

FP4 = (NVFP4, MXFP4)
STEP = 512  # FP4 elements per K step (_decode_mma_ir.STEP_BYTES * 2)
# (M, N, K): 3 splits of 2 steps with an N tail; 2 splits (3 + 2 steps) with a K tail of 32;
# 2 n-tiles; two row passes
DENSE = [(1, 70, 3072), (3, 130, 2080), (9, 33, 2560), (17, 20, 2048)]
# (counts, expert ids, experts, N, K): an unused group (D8), an empty one, 2 and 3 splits
GROUPED = [([3, 0, 5, 1], [0, 1, -1, 1], 2, 70, 2080),
           ([1, 2], [1, 0], 2, 40, 3072)]


def _wide_scales(rng, fmt, rows, k):
    """Block scales over ~30 binades (so fp32 sums of partials round)."""
    j = fmt.kblocks(k)
    if fmt.is_mx:
        return rng.integers(112, 143, size=(rows, j), dtype=np.uint8).view(
            ml_dtypes.float8_e8m0fnu)
    b = rng.integers(0x08, 0x7F, size=(rows, j), dtype=np.uint8)
    return b.view(ml_dtypes.float8_e4m3fn)


def _case(fmt, m, n, k, seed):
    rng = np.random.default_rng(seed)
    return (random_data(rng, fmt, m, k), random_data(rng, fmt, n, k),
            _wide_scales(rng, fmt, m, k), _wide_scales(rng, fmt, n, k))


def _run(fmt, a, b, sfa, sfb, k, variant, alpha=1.0, out="float32"):
    return matmul_decode.block_scaled_matmul_decode(
        a, b, layouts.interleave(sfa), layouts.interleave(sfb), fmt, k=k, alpha=alpha,
        out_dtype=out, device="interp", variant=variant)


def slice_run(fmt, a, b, sfa, sfb, lo, hi, variant):
    """The ``variant`` kernel's fp32 result (alpha 1) on the K slice ``[lo, hi)``."""
    jl, jh = lo // fmt.block_size, -(-hi // fmt.block_size)
    return _run(fmt, np.ascontiguousarray(a[:, lo // 2:hi // 2]),
                np.ascontiguousarray(b[:, lo // 2:hi // 2]), np.ascontiguousarray(sfa[:, jl:jh]),
                np.ascontiguousarray(sfb[:, jl:jh]), hi - lo, variant)


def _partials(fmt, a, b, sfa, sfb, k, splits, variant="mma_p"):
    """The ``variant`` kernel's fp32 result on each split's K slice (alpha 1)."""
    steps = -(-k // STEP)
    per = -(-steps // splits)
    return [slice_run(fmt, a, b, sfa, sfb, z * per * STEP, min((z + 1) * per * STEP, k),
                      variant) for z in range(splits)]


def ordered_sum(parts, order):
    """``parts`` added in ``order`` with float32 adds (one rounding each)."""
    s = parts[order[0]].copy()
    for z in order[1:]:
        s = s + parts[z]
    return s


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("mnk", DENSE, ids=lambda s: "x".join(map(str, s)))
def test_dense_psk_bit_exact_split_order_model(fmt, mnk):
    m, n, k = mnk
    a, b, sfa, sfb = _case(fmt, m, n, k, seed=sum(mnk) + 1)
    splits = matmul_decode.split_k_p(-(-n // 64), k)
    assert splits == max(1, -(-k // STEP) // 2)  # tiny grid: as many as 2 steps a split allow
    alpha = 0.375
    got = _run(fmt, a, b, sfa, sfb, k, "mma_psk", alpha)
    parts = _partials(fmt, a, b, sfa, sfb, k, splits)
    want = ordered_sum(parts, list(range(splits))) * np.float32(alpha)
    assert got.dtype == np.float32 and got.shape == (m, n)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    if splits > 2:  # the order is visible in the bits (wide scales): fixed split order
        rev = ordered_sum(parts, list(range(splits))[::-1]) * np.float32(alpha)
        assert not np.array_equal(rev.view(np.uint32), want.view(np.uint32))
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, alpha)
    assert_f32_within_bound(got, exact, f32_error_bound(abs_sum, fmt, k, n_mul=1))


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("seed_count", [1, 2])
def test_result_independent_of_reducing_cta(fmt, seed_count, monkeypatch):
    """Seeding the tile counters makes split 2 - seed (not the last one) the CTA that sums
    (the interpreter runs the grid's CTAs in lock step: every partial is stored before the
    counters move); the bits are the same, the reversed order's are not, and the reducing
    CTA leaves the counters at 0."""
    m, n, k = 4, 100, 3072  # 3 splits of two steps
    a, b, sfa, sfb = _case(fmt, m, n, k, seed=7)
    base = _run(fmt, a, b, sfa, sfb, k, "mma_psk")
    parts = _partials(fmt, a, b, sfa, sfb, k, 3)
    fwd, rev = ordered_sum(parts, [0, 1, 2]), ordered_sum(parts, [2, 1, 0])
    assert np.array_equal(base.view(np.uint32), fwd.view(np.uint32))
    assert not np.array_equal(fwd.view(np.uint32), rev.view(np.uint32))  # order matters
    real = matmul_decode._with_split_k
    seen = {}

    def seeded(spec, grid3, rows, nn, kk, buffers, host, device):
        g3, bufs = real(spec, grid3, rows, nn, kk, buffers, host, device)
        assert g3[2] == 3
        launch = device.launch

        def spy(kernel, grid, args, *rest):  # the launched counters (the last argument)
            seen["counters"] = args[-1]
            return launch(kernel, grid, args, *rest)

        monkeypatch.setattr(device, "launch", spy)
        cnt = np.full(g3[0] * g3[1], seed_count, np.int32)
        return g3, {**bufs, "counters": cnt}

    monkeypatch.setattr(matmul_decode, "_with_split_k", seeded)
    got = _run(fmt, a, b, sfa, sfb, k, "mma_psk")
    assert np.array_equal(got.view(np.uint32), base.view(np.uint32))
    assert list(np.asarray(seen["counters"])) == [0, 0]


def test_mma_sk_removed(monkeypatch):
    """The split "mma" variant ("mma_sk", dominated by mma_psk on the H200) is gone: not a
    variant, not an env choice, not bundled."""
    assert "mma_sk" not in matmul_decode.VARIANTS
    assert matmul_decode.SPLIT_VARIANTS == ("mma_psk",)
    with pytest.raises(ValueError, match="variant must be one of"):
        matmul_decode.DecodeSpec("nvfp4", "dense", variant="mma_sk")
    monkeypatch.setenv(matmul_decode.VARIANT_ENV, "mma_sk")
    with pytest.raises(ValueError, match=matmul_decode.VARIANT_ENV):
        matmul_decode.dispatch_variant(NVFP4)
    assert not hasattr(matmul_decode, "split_k")
    assert {s.variant for s in matmul_decode.bundle_specs("sm_90a")} == set(
        matmul_decode.VARIANTS)


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_dense_psk_bf16_and_nan_scales(fmt):
    """bf16 output within the bound; D5: a NaN weight scale gives a NaN column, a NaN
    activation scale a NaN row, in whichever split their block falls."""
    rng = np.random.default_rng(31)
    m, n, k = 3, 90, 2560  # 2 splits (3 + 2 steps)
    a, b, sfa, sfb, _sfa5, _sfb5 = random_dense_case(rng, fmt, m, n, k)
    got = _run(fmt, a, b, sfa, sfb, k, "mma_psk", 1.5, "bfloat16")
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, 1.5)
    assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, fmt, k, n_mul=2))
    nan_code = 0x7F if fmt is NVFP4 else 0xFF
    jb = k // fmt.block_size  # blocks: one late (split 1) for a column, one early for a row
    sfb.view(np.uint8)[65, jb - 2] = nan_code
    sfa.view(np.uint8)[1, 3] = nan_code
    got = _run(fmt, a, b, sfa, sfb, k, "mma_psk")
    nan = np.isnan(got)
    assert nan[:, 65].all() and nan[1].all() and nan.sum() == m + n - 1


class GroupedDecodeCase:
    """A grouped decode case (``grouped``: counts, ids, experts, N, K) with expert scales and,
    for NVFP4, row scales: ``kw`` the decode call's keywords beside ``case``; :meth:`check`
    asserts the bf16 bound and D8's zero rows of unused groups."""

    def __init__(self, grouped, fmt, seed):
        counts, self.ids, e_count, self.n, self.k = grouped
        rng = np.random.default_rng(seed)
        self.case, self.row_scales, self.w_scales = make_grouped_case(
            rng, fmt, counts, self.ids, e_count, self.n, self.k)
        self.fmt, self.t = fmt, self.case["hidden"].shape[0]
        self.esc = (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)
        self.rows = rng.uniform(0.5, 2, self.t).astype(ml_dtypes.bfloat16) \
            if fmt is NVFP4 else None
        self.kw = {"expert_scales": self.esc, "fmt": fmt, "k": self.k,
                   "a_row_scales": self.rows, "device": "interp"}

    def check(self, got):
        fmt, k, rows = self.fmt, self.k, self.rows
        exact, abs_sum = exact_grouped(self.case, self.row_scales, self.w_scales, fmt, k,
                                       self.esc, rows)
        assert_bf16_consistent(got, exact, f32_error_bound(abs_sum, fmt, k,
                                                           n_mul=3 if rows is not None else 2))
        es = self.case["expert_start"].astype(np.int64)
        for g, e in enumerate(self.ids):
            if e < 0:
                assert not got[es[g]:es[g + 1]].view(np.uint16).any()  # D8: zero rows


@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("case_id", range(len(GROUPED)))
def test_grouped_psk_within_bound(case_id, fmt, monkeypatch):
    c = GroupedDecodeCase(GROUPED[case_id], fmt, 90 + case_id)
    case, kw, t, n = c.case, c.kw, c.t, c.n
    dev = runtime.get_device("interp")
    seen = []
    launch = dev.launch

    def spy(kernel, grid3, args, *rest):  # the counters the kernel ran with (the reuse
        launch(kernel, grid3, args, *rest)  # contract: left at zero after the launch)
        seen.append((tuple(grid3), np.array(args[-1])))

    monkeypatch.setattr(dev, "launch", spy)
    got = matmul_decode.grouped_matmul_decode(**case, **kw, variant="mma_psk")
    (grid3, counters), = seen
    assert grid3[2] == (2 if case_id == 0 else 3) and counters.size == grid3[0] * grid3[1]
    assert not counters.any()
    assert got.shape == (t, n) and got.dtype == ml_dtypes.bfloat16
    c.check(got)
    again = matmul_decode.grouped_matmul_decode(**case, **kw, variant="mma_psk")
    assert np.array_equal(again.view(np.uint16), got.view(np.uint16))  # deterministic


def test_split_k_p_choice():
    sk = matmul_decode.split_k_p
    assert matmul_decode.SPLIT_K_P_CTAS == 1056
    assert sk(90, 2880) == 3  # dense M=1 N=5760 K=2880: 6 steps, 2 a split, 270 CTAs
    assert sk(64, 7168) == 7  # dense N=4096 K=7168: 14 steps, 448 CTAs
    assert sk(360, 2880) == 2  # gpt-oss gate_up T=1, 4 experts: 720 CTAs (1080 > 2 waves)
    assert sk(1056, 18432) == 1 and sk(528, 18432) == 2  # two waves already / one
    assert sk(4, 1536) == 1 and sk(4, 2048) == 2  # 3 steps: no split of >= 2 steps
    for ctas in (1, 7, 90, 200, 700):
        for k in (512, 2080, 2944, 7168, 18432):
            s = sk(ctas, k)
            steps = -(-k // STEP)
            per = -(-steps // s)
            assert 1 <= s and (s - 1) * per < steps  # no empty split
            assert s == 1 or per >= matmul_decode.SPLIT_K_MIN_STEPS
            assert s == 1 or s * ctas <= matmul_decode.SPLIT_K_P_CTAS
    spec = matmul_decode.DecodeSpec("nvfp4", "dense", variant="mma_psk")
    assert spec.kernel_name.endswith("_mma_psk") and spec.cols == 64
    assert [x.name for x in spec.args()][-2:] == ["workspace", "counters"]
    with pytest.raises(ValueError, match="FP4"):
        matmul_decode.DecodeSpec("mxfp8", variant="mma_psk")
    names = {(s.mode, s.fmt) for s in matmul_decode.bundle_specs("sm_90a")
             if s.variant == "mma_psk"}
    assert names == {(mo, f) for mo in ("grouped", "dense") for f in ("nvfp4", "mxfp4")}


class _FakeGpu:
    """Records zeros() calls; arrays are numpy; ``capturing``: streams under capture."""

    def __init__(self):
        self.zeroed, self.capturing = [], set()

    def zeros(self, shape, dtype, stream=None):
        self.zeroed.append((shape[0], stream))
        return np.zeros(shape, dtype)

    def is_capturing(self, stream):
        return stream in self.capturing


def test_split_k_counters_once_per_stream(monkeypatch):
    monkeypatch.setattr(matmul_decode, "_COUNTERS", {})
    dev, other = _FakeGpu(), _FakeGpu()
    c1 = matmul_decode.split_k_counters(dev, 7, 90)
    assert matmul_decode.split_k_counters(dev, 7, 360) is c1  # reused: no memset
    assert dev.zeroed == [(1024, 7)]
    c2 = matmul_decode.split_k_counters(dev, 8, 90)  # another stream: its own buffer
    assert c2 is not c1 and dev.zeroed[-1] == (1024, 8)
    c3 = matmul_decode.split_k_counters(other, 7, 90)  # another device
    assert c3 is not c1 and other.zeroed == [(1024, 7)]
    big = matmul_decode.split_k_counters(dev, 7, 5000)  # too small: replaced
    assert big.shape == (5000,) and matmul_decode.split_k_counters(dev, 7, 10) is big
    dev.capturing.add(7)  # under capture: fresh zeros every call (captured memset)
    x, y = (matmul_decode.split_k_counters(dev, 7, 90) for _ in range(2))
    assert x is not y and x is not big and dev.zeroed[-2:] == [(90, 7), (90, 7)]


def test_dispatch_split_switch(monkeypatch):
    """mma_p dispatch: off by default; BLOCKSCALE_DECODE_SPLIT_K=<ctas> runs mma_psk for
    grids of at most that many CTAs that split, the bits of the split-order model."""
    launched = record_variants(monkeypatch)
    monkeypatch.setenv(matmul_decode.VARIANT_ENV, "mma_p")
    assert matmul_decode.SPLIT_K_MAX_CTAS == 0
    assert matmul_decode.split_variant("mma_p", 1, 18432) == "mma_p"
    rng = np.random.default_rng(8)
    m, n, k = 2, 70, 2048
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, NVFP4, m, n, k)

    def call():
        return matmul.block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, k=k, device="interp",
                                          target="sm_90a", out_dtype="float32")

    base = call()
    monkeypatch.setenv(matmul_decode.SPLIT_K_ENV, "2")
    assert matmul_decode.split_variant("mma_p", 2, k) == "mma_psk"
    assert matmul_decode.split_variant("mma_p", 3, k) == "mma_p"
    assert matmul_decode.split_variant("mma_p", 2, 1536) == "mma_p"  # one split
    assert matmul_decode.split_variant("mma", 2, k) == "mma"
    got = call()
    assert launched == ["mma_p", "mma_psk"]
    want = matmul_decode.block_scaled_matmul_decode(
        a, b, layouts.interleave(sfa), layouts.interleave(sfb), NVFP4, k=k,
        out_dtype="float32", device="interp", variant="mma_psk")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    exact, abs_sum = exact_dense(a, b, sfa, sfb, NVFP4, k)
    assert_f32_within_bound(base, exact, f32_error_bound(abs_sum, NVFP4, k, n_mul=1))
    assert_f32_within_bound(got, exact, f32_error_bound(abs_sum, NVFP4, k, n_mul=1))
    monkeypatch.setenv(matmul_decode.SPLIT_K_ENV, "-1")
    with pytest.raises(ValueError, match=matmul_decode.SPLIT_K_ENV):
        matmul_decode.split_variant("mma_p", 2, k)


def test_grouped_dispatch_split_switch(monkeypatch):
    """The grouped dispatch counts the CTAs of the non-empty groups: GROUPED[1] (2 groups of
    N=40: 2 CTAs) runs mma_psk under BLOCKSCALE_DECODE_SPLIT_K=2, not under 1 (its bits)."""
    launched = record_variants(monkeypatch)
    monkeypatch.setenv(matmul_decode.VARIANT_ENV, "mma_p")
    counts, ids, e_count, n, k = GROUPED[1]
    case, _rs, _ws = make_grouped_case(np.random.default_rng(4), NVFP4, counts, ids, e_count,
                                       n, k)
    esc = np.ones(e_count, np.float32)
    outs = []
    for limit in ("1", "2"):
        monkeypatch.setenv(matmul_decode.SPLIT_K_ENV, limit)
        outs.append(matmul_grouped.grouped_matmul_block_scaled(
            **case, expert_scales=esc, fmt=NVFP4, k=k, device="interp", target="sm_90a"))
    assert launched == ["mma_p", "mma_psk"]
    direct = matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=NVFP4, k=k,
                                                 device="interp", variant="mma_psk")
    assert np.array_equal(outs[1].view(np.uint16), direct.view(np.uint16))

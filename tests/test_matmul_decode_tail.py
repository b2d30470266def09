"""The decode kernel's "mma_c8t" variant ("mma_c8" with the last K step peeled off the step
loop: no prefetch past the end, the peeled step's unit pairs past the row end skipped;
blockscale/ops/_decode_mma_ir.emit_decode_mma ``tail``) and "mma_c8s2" / "mma_c8s4" (the
same over 2 / 4 column slices of 64 per CTA, the next slice's first step fetched during the
last step of the current one: ``slices``) run by the numpy interpreter: bit for bit the
portable kernel's results (dense and grouped, NVFP4 / MXFP4) on K values whose last step is
1, 2, 10 and 16 unit pairs long (K = 32: the peeled step alone), N of 1..5 slices (a CTA
with fewer slices than its share past N), the code and scale edges, NaN scales and the 5-D
padding rows (and "mma_c8d2": "mma_c8t" with two steps in flight); their sm_90a SASS (the step loop of "mma_c8" without its prefetch past the
end: no spill in it, one HMMA path)."""

from __future__ import annotations

import numpy as np
import pytest
from test_matmul_decode_lower import _ops, _step_loop
from test_matmul_decode_mma import FP4, _dense
from test_matmul_decode_mma import test_every_code_and_scale_edges as _codes_and_edges
from test_matmul_decode_mma import test_grouped_mma_bit_identical_to_portable as _grouped
from test_matmul_decode_mma import test_nan_scale_gives_nan_column as _nan_scales
from test_matmul_decode_mmac import test_padding_scale_rows_never_reach_outputs as _padding

from blockscale.ops import matmul_decode

TAIL = ("mma_c8t", "mma_c8s2", "mma_c8s4")
#: + "mma_c8d2" ("mma_c8t" with two steps in flight: 168 registers, 3 CTAs per SM; for grids
#: of < 1 wave such as gpt-oss T=1)
VARIANTS = (*TAIL, "mma_c8d2")
# (M, N, K): last step of 1 unit pair (K = 32, one step), 2 (K = 1088), 10 (K = 2880 as
# gpt-oss, 6 steps), 16 (K = 1024, full), 9 rows (two 8-row passes)
DENSE = [(1, 40, 32), (3, 70, 1088), (2, 64, 2880), (9, 33, 1024), (5, 20, 544),
         (2, 300, 96)]


@pytest.fixture(params=VARIANTS)
def variant(request):
    return request.param


@pytest.mark.interp
@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("mnk", DENSE, ids=lambda s: "x".join(map(str, s)))
def test_dense_bit_identical_to_portable(fmt, mnk, variant):
    got, want = _dense(fmt, *mnk, seed=sum(mnk), variant=variant)
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.interp
@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
def test_codes_and_scale_edges(fmt, variant):
    _codes_and_edges(fmt, variant)


@pytest.mark.interp
def test_nan_scales(variant):
    _nan_scales(variant)


@pytest.mark.interp
def test_padding_scale_rows(variant):
    _padding(variant)


@pytest.mark.interp
@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("case_id", [0, 3, 4])
def test_grouped_bit_identical_to_portable(case_id, fmt, variant, monkeypatch):
    _grouped(case_id, fmt, variant, monkeypatch)


@pytest.mark.parametrize("kw", [{"step_range": (0, 1), "tail": True}, {"slices": 2},
                                {"slices": 2, "tail": True, "staging": "cf8", "depth": 2},
                                {"slices": 0, "tail": True, "staging": "cf8"}])
def test_bad_options(kw):
    from blockscale.ops import _decode_mma_ir as DM
    with pytest.raises(ValueError, match="tail|slices"):
        DM.emit_decode_mma(None, matmul_decode.DecodeSpec("nvfp4").format, start=None,
                           end=None, expert=None, n_count=None, k=None, a_srow=None,
                           store=None, **kw)


def test_bundle_specs_hold_the_variant():
    names = {s.kernel_name for s in matmul_decode.bundle_specs("sm_90a")}
    for v in VARIANTS:
        for name in ("grouped_nvfp4_bf16", "grouped_mxfp4_bf16", "grouped_nvfp4_bf16_rowsc",
                     "dense_nvfp4_f32", "dense_mxfp4_bf16"):
            assert f"bs_decode_{name}_{v}" in names, (name, v)
    assert matmul_decode.DecodeSpec("nvfp4", variant="mma_c8s4").cols == 256


@pytest.mark.lower
@pytest.mark.parametrize("variant", TAIL)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_step_loop_sass(fmt, variant):
    """The step loop holds one HMMA path (32), the next step's weight loads, no spill; the
    peeled step's HMMAs sit after it (64 in all); "mma_c8t": no spill anywhere at 128
    registers ("mma_c8s*": ptxas spills <= 256 bytes around the slice loop, none in the
    step loop)."""
    spec = matmul_decode.DecodeSpec(fmt, "grouped", "bfloat16", False, "sm_90a", variant)
    kernel = matmul_decode.kernel(spec)
    sass = kernel.asm["sass"]
    loop = _step_loop(sass)
    assert loop.count("HMMA.16816.F32") == 32
    assert loop.count("LDG.E.128") >= 8
    assert _ops(sass).count("HMMA.16816.F32") == 64
    assert not [o for o in loop if o.startswith(("STL", "LDL"))]
    ref = _step_loop(matmul_decode.kernel(
        matmul_decode.DecodeSpec(fmt, "grouped", "bfloat16", False, "sm_90a", "mma_c8")
    ).asm["sass"])
    assert len(loop) <= len(ref) + 4  # (a slice offset or two)
    spill = 0 if variant == "mma_c8t" else 256
    assert kernel.meta["registers"] <= 128 and kernel.meta["spill_stores"] <= spill, kernel.meta


def test_slices_variant_by_grid():
    w = matmul_decode.WAVE_CTAS
    assert matmul_decode.slices_variant(4 * 90) == "mma_c8t"  # gpt-oss T=1: 4 experts
    assert matmul_decode.slices_variant(4 * w) == "mma_c8s2"
    assert matmul_decode.slices_variant(16 * w - 1) == "mma_c8s2"
    assert matmul_decode.slices_variant(126 * 90) == "mma_c8s4"  # gpt-oss T=128


@pytest.mark.interp
def test_auto_dispatch(monkeypatch):
    """BLOCKSCALE_DECODE_VARIANT=mma_c8a: the dense and grouped dispatch launch
    slices_variant's kernel for their grid (here small: "mma_c8t"; with a smaller wave
    units: "mma_c8s2", "mma_c8s4"), bit for bit the portable kernel's results."""
    from test_matmul_common import random_dense_case
    from test_matmul_decode_mma import record_variants

    from blockscale.formats import NVFP4
    from blockscale.ops import matmul

    launched = record_variants(monkeypatch)
    monkeypatch.setenv(matmul_decode.VARIANT_ENV, matmul_decode.AUTO_VARIANT)
    rng = np.random.default_rng(6)
    a, b, _sfa, _sfb, sfa5, sfb5 = random_dense_case(rng, NVFP4, 3, 300, 96)
    want = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, k=96, device="interp")
    for wave, variant in ((528, "mma_c8t"), (1, "mma_c8s2"), (0, "mma_c8s4")):
        monkeypatch.setattr(matmul_decode, "WAVE_CTAS", wave)
        launched.clear()
        got = matmul.block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, k=96, device="interp",
                                         target="sm_90a")
        assert launched[0] == variant
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    from test_matmul_decode import _grouped_case

    from blockscale.ops import matmul_grouped
    case, _rs, _ws, esc, k = _grouped_case(NVFP4, 4, np.random.default_rng(7))
    launched.clear()
    got = matmul_grouped.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=NVFP4, k=k,
                                                     device="interp", target="sm_90a")
    assert launched[0] == "mma_c8s4"
    monkeypatch.setattr(matmul_grouped, "FAST_PATHS", [])  # the portable grouped kernel
    want = matmul_grouped.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=NVFP4,
                                                      k=k, device="interp")
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.lower
def test_depth2_sass():
    """"mma_c8d2" (two steps' loads in flight): one HMMA path and the weight loads in the
    step loop, the peeled step after it, <= 168 registers (3 CTAs per SM), no spill store
    and <= 8 reloads in the step loop (NVFP4: 8)."""
    spec = matmul_decode.DecodeSpec("nvfp4", "grouped", "bfloat16", False, "sm_90a",
                                    "mma_c8d2")
    kernel = matmul_decode.kernel(spec)
    loop = _step_loop(kernel.asm["sass"])
    assert loop.count("HMMA.16816.F32") == 32 and loop.count("LDG.E.128") >= 8
    assert _ops(kernel.asm["sass"]).count("HMMA.16816.F32") == 64  # (+ the peeled step)
    assert not [o for o in loop if o.startswith("STL")]
    assert sum(o.startswith("LDL") for o in loop) <= 8  # (loop-invariant reloads: L1 hits)
    assert kernel.meta["registers"] <= 168

"""The persistent grouped decode variants "mma_c8w" (CTAs walking (group, 64-column tile, 8-row
pass) work units, the next unit's first step fetched during the current unit's last step;
blockscale/ops/_decode_stream_ir.py) and "mma_c8r" / "mma_c8r4" (the weights through a
3 / 4-stage cp.async.bulk ring across units) run by the numpy interpreter: bit for bit the
portable grouped kernel's results with 1, 3 and the default number of CTAs (units per CTA:
many, a few, one), on the grouped decode cases of tests/test_matmul_decode.py and T=1 / 16 / 128-like
small shapes (K whose last step is 1, 2 or 10 unit pairs long: K = 32 has no step loop, the
peeled step alone; groups of 9-16 rows: two 8-row blocks; expert id -1 with rows: zeros;
empty groups and blocks past a group's end: units that do nothing); the grouped dispatch with
``BLOCKSCALE_DECODE_VARIANT=mma_c8w`` (the dense one runs "mma_c8t"); its sm_90a SASS."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_matmul_decode import GROUPED
from test_matmul_decode_lower import _ops, _step_loop
from test_matmul_decode_mma import FP4, record_variants
from test_matmul_decode_mma import test_grouped_mma_bit_identical_to_portable as _grouped
from test_matmul_grouped import make_grouped_case

from blockscale.formats import MXFP4, NVFP4
from blockscale.ops import matmul_decode, matmul_grouped

V = "mma_c8w"
VARIANTS = matmul_decode.STREAM_VARIANTS
# (counts, expert ids, num experts, N, K): T=1-like (4 experts of 1 row, K = 2880: last
# step 10 unit pairs), T=16-like (1-3 rows, K = 1088: last step 2), T=128-like (9-16 rows:
# two passes, id -1 with 10 rows, an empty group; K = 544), one step (K = 32)
SHAPES = [
    ([1, 1, 1, 1], [5, 0, 3, 1], 6, 130, 2880),
    ([2, 1, 3, 0, 2, 1], [0, 3, 1, 2, 4, 5], 6, 100, 1088),
    ([9, 10, 0, 16, 3], [2, -1, 1, 0, 2], 3, 70, 544),
    ([3, 2], [1, 0], 2, 200, 32),
]


def _case(fmt, shape, seed):
    counts, ids, e_count, n, k = shape
    rng = np.random.default_rng(seed)
    case, _rs, _ws = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
    esc = (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)
    t = case["hidden"].shape[0]
    rows = rng.uniform(0.5, 2, t).astype(ml_dtypes.bfloat16) if fmt is NVFP4 else None
    return case, esc, rows, k


def _check(fmt, shape, seed, monkeypatch, variant=V):
    case, esc, rows, k = _case(fmt, shape, seed)
    got = matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=fmt, k=k,
                                              a_row_scales=rows, device="interp",
                                              variant=variant)
    with monkeypatch.context() as mp:
        mp.setattr(matmul_grouped, "FAST_PATHS", [])  # the portable grouped kernel
        want = matmul_grouped.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=fmt,
                                                          k=k, a_row_scales=rows,
                                                          device="interp")
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    es = case["expert_start"].astype(np.int64)
    for g, e in enumerate(shape[1]):
        if e < 0:
            assert not got[es[g]:es[g + 1]].view(np.uint16).any()  # D8
    return got


@pytest.fixture(params=VARIANTS)
def variant(request):
    return request.param


@pytest.mark.interp
@pytest.mark.parametrize("ctas", [1, 3, None])
@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_bit_identical_to_portable(shape, fmt, ctas, variant, monkeypatch):
    monkeypatch.setattr(matmul_decode, "STREAM_CTAS", ctas)
    _check(fmt, SHAPES[shape], 70 + shape, monkeypatch, variant)


@pytest.mark.interp
@pytest.mark.parametrize("fmt", FP4, ids=lambda f: f.name)
@pytest.mark.parametrize("case_id", range(len(GROUPED)))
def test_grouped_cases(case_id, fmt, variant, monkeypatch):
    monkeypatch.setattr(matmul_decode, "STREAM_CTAS", 2)
    _grouped(case_id, fmt, variant, monkeypatch)


@pytest.mark.interp
def test_all_groups_and_idle_passes(variant, monkeypatch):
    """A device-side ``expert_start`` (the grid covers every group, passes from T): units of
    empty groups and passes past a group's end do nothing (the ring variants: their fills
    arrive with no bytes), the results are unchanged."""
    got = _check(NVFP4, SHAPES[2], 5, monkeypatch, variant)
    real = matmul_decode.row_blocks
    # every group's 2 blocks (min(T, 16) rows): an empty group, short groups' second blocks
    monkeypatch.setattr(matmul_decode, "row_blocks", lambda es, g, t: real(None, g, t))
    monkeypatch.setattr(matmul_decode, "STREAM_CTAS", 4)
    again = _check(NVFP4, SHAPES[2], 5, monkeypatch, variant)
    assert np.array_equal(got.view(np.uint16), again.view(np.uint16))


@pytest.mark.interp
def test_dispatch(monkeypatch):
    """BLOCKSCALE_DECODE_VARIANT=mma_c8w: the grouped dispatch launches it (one wave of
    CTAs); the dense dispatch runs "mma_c8t"; a dense spec of it is refused."""
    from test_matmul_common import random_dense_case

    from blockscale.ops import matmul
    launched = record_variants(monkeypatch)
    monkeypatch.setenv(matmul_decode.VARIANT_ENV, V)
    case, esc, _rows, k = _case(MXFP4, SHAPES[1], 3)
    got = matmul_grouped.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=MXFP4, k=k,
                                                     device="interp", target="sm_90a")
    assert launched == [V]
    monkeypatch.setattr(matmul_grouped, "FAST_PATHS", [])
    want = matmul_grouped.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=MXFP4,
                                                      k=k, device="interp")
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    launched.clear()
    a, b, _sfa, _sfb, sfa5, sfb5 = random_dense_case(np.random.default_rng(4), NVFP4, 2, 70, 96)
    matmul.block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, k=96, device="interp", target="sm_90a")
    assert launched == ["mma_c8t"]
    with pytest.raises(ValueError, match="grouped"):
        matmul_decode.DecodeSpec("nvfp4", "dense", variant=V)


def test_row_blocks():
    """The host list holds exactly the 8-row blocks with rows (p * num_groups + g), group by
    group; a device-side ``expert_start``: every group's blocks for min(T, 16) rows, block 0
    of every group first."""
    es = np.array([0, 0, 3, 12, 28, 28])
    got = matmul_decode.row_blocks(es, 5, 28)
    assert got.dtype == np.int32
    assert got.tolist() == [1, 2, 2 + 5, 3, 3 + 5]
    assert matmul_decode.row_blocks(np.array([0, 0]), 1, 0).tolist() == [0]
    assert matmul_decode.row_blocks(None, 3, 9).tolist() == list(range(6))
    assert matmul_decode.row_blocks(None, 3, 100).tolist() == list(range(6))
    assert matmul_decode.row_blocks(None, 3, 1).tolist() == [0, 1, 2]


def test_bundle_specs():
    names = {s.kernel_name for s in matmul_decode.bundle_specs("sm_90a")}
    for v in VARIANTS:
        for name in ("grouped_nvfp4_bf16", "grouped_mxfp4_bf16", "grouped_nvfp4_bf16_rowsc"):
            assert f"bs_decode_{name}_{v}" in names
        assert not [x for x in names if x.startswith("bs_decode_dense") and x.endswith(v)]
    assert matmul_decode.stream_ctas("mma_c8r") == 3 * 132


def test_ring_needs_units():
    from blockscale.ops import _decode_mma_ir as DM
    with pytest.raises(ValueError, match="ring"):
        DM.emit_decode_mma(None, NVFP4, start=None, end=None, expert=None, n_count=None,
                           k=None, a_srow=None, store=None, staging="cf8", tail=True, ring=3)


def test_units_need_the_tail_loop():
    from blockscale.ops import _decode_mma_ir as DM
    with pytest.raises(ValueError, match="units"):
        DM.emit_decode_mma(None, NVFP4, start=None, end=None, expert=None, n_count=None,
                           k=None, a_srow=None, store=None, staging="cf8", units=object())


@pytest.mark.lower
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_sass(fmt):
    """"mma_c8w": the "mma_c8t" step loop (32 HMMAs, the next step's weight loads, no spill;
    <= 72 instructions longer: the unit's bases are not kernel constants (~25), the next
    unit's info word loads of step 0 (~40, skipped by the other steps)), the peeled step's
    32 HMMAs after it, <= 128 registers (4 CTAs per SM), no spill anywhere; the first-step loads four
    times (before the walk, the step loop, the peeled step's next unit, an idle unit's
    next)."""
    spec = matmul_decode.DecodeSpec(fmt, "grouped", "bfloat16", fmt == "nvfp4", "sm_90a", V)
    kernel = matmul_decode.kernel(spec)
    sass = kernel.asm["sass"]
    loop, ops = _step_loop(sass), _ops(sass)
    assert loop.count("HMMA.16816.F32") == 32 and loop.count("LDG.E.128") >= 8
    assert ops.count("HMMA.16816.F32") == 64
    assert ops.count("LDG.E.128") >= 4 * 8
    assert not [o for o in loop if o.startswith(("STL", "LDL"))]
    ref = _step_loop(matmul_decode.kernel(
        matmul_decode.DecodeSpec(fmt, "grouped", "bfloat16", False, "sm_90a", "mma_c8t")
    ).asm["sass"])
    assert len(loop) <= len(ref) + 72, (len(loop), len(ref))
    meta = kernel.meta
    assert meta["registers"] <= 128 and meta["spill_stores"] == 0 == meta["spill_loads"], meta


@pytest.mark.lower
@pytest.mark.parametrize("variant", VARIANTS)
def test_shared_buffers_16_byte_aligned(variant):
    """Every static shared buffer is declared ``.align 16`` (16-byte LDS / STS; the
    interpreter does not model alignment: run U's CUDA_ERROR_MISALIGNED_ADDRESS of
    "mma_c8r", its B fragments after the 24-byte mbarrier array at ``.align 4``); the ring
    ``.align 1024`` (128-byte swizzle)."""
    import re
    spec = matmul_decode.DecodeSpec("nvfp4", "grouped", "bfloat16", False, "sm_90a", variant)
    ptx = matmul_decode.kernel(spec).asm["ptx"]
    decls = re.findall(r"\.shared \.align (\d+) \.b8 (__wg_\w+)\[", ptx)
    assert decls and all(int(a) >= 16 for a, _ in decls), decls
    if variant in matmul_decode.RING:
        assert ".extern .shared .align 1024 .b8 __extern_shared[]" in ptx


@pytest.mark.lower
@pytest.mark.parametrize("variant", ["mma_c8r", "mma_c8r4"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_ring_sass(fmt, variant):
    """The ring variants: no 16-byte weight loads at all (TMA boxes: UTMALDG.2D, issued by
    one thread), 64 HMMAs, <= 128 registers and no spill; shared memory (static + the
    stages, dynamic) for 3 / 2 CTAs per SM (STREAM_PER_SM) in the H200's 228 KB (1 KB
    reserved per CTA)."""
    spec = matmul_decode.DecodeSpec(fmt, "grouped", "bfloat16", fmt == "nvfp4", "sm_90a",
                                    variant)
    kernel = matmul_decode.kernel(spec)
    ops = _ops(kernel.asm["sass"])
    assert ops.count("LDG.E.128") <= 4  # (an activation chunk per fetch site only)
    assert ops.count("UTMALDG.2D") >= 2 and ops.count("HMMA.16816.F32") == 64
    meta = kernel.meta
    assert meta["registers"] <= 128 and meta["spill_stores"] == 0 == meta["spill_loads"], meta
    assert meta["static_shared_bytes"] <= 48 * 1024
    assert spec.dynamic_shared_bytes > 48 * 1024  # (the runtime's opt-in threshold)
    per_cta = meta["static_shared_bytes"] + spec.dynamic_shared_bytes + 1024
    assert matmul_decode.STREAM_PER_SM[variant] * per_cta <= 228 * 1024, per_cta

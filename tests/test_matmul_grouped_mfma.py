"""AMD MFMA grouped (MoE) block-scaled matmul (ops/matmul_grouped_mfma.py), compile only.

The kernels lower with the intended MFMA and run in the interpreter: within the f32 bound
of the float64 value (tests/test_matmul_common.py) on both scale layouts, with empty groups,
expert id -1, groups smaller than and straddling a 64-row tile, K tails and rows past the
last group; FP4 on the bf16 path equals the portable grouped kernel bit for bit; every output
is written (NaN-filled output buffer).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    assert_f32_within_bound,
    dequantize_exact,
    f32_error_bound,
    random_data,
    random_scales_2d,
)
from test_matmul_grouped import exact_grouped, make_grouped_case

from blockscale.formats import MXFP4, MXFP8, NVFP4
from blockscale.ops import matmul_grouped as mg
from blockscale.ops import matmul_grouped_mfma as gm
from blockscale.ops import matmul_mfma

FORMATS = (NVFP4, MXFP4, MXFP8)
TARGETS = ("gfx950", "gfx942")
#: (counts, ids, E, N, K): empty group, id -1, a group straddling two 64-row tiles, K tail
CASES = [([0, 3, 70, 5], [1, -1, 0, 2], 3, 40, 128),
         ([65, 1], [1, 0], 2, 70, 96)]


def _k(fmt, k):
    return k + (16 if fmt.is_fp4 else 5)  # a partial last block


@pytest.mark.interp
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_grouped_mfma_within_bound(target, fmt, monkeypatch):
    monkeypatch.setenv(gm.GROUPED_SWITCH, "all")  # every format (default: exact ones only)
    for case_id, (counts, ids, e_count, n, k) in enumerate(CASES):
        k = k if case_id == 0 else _k(fmt, k)
        rng = np.random.default_rng(40 + case_id)
        case, row_scales, w_scales = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
        esc = (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)
        out = mg.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=fmt, k=k,
                                             device="interp", target=target)
        exact, abs_sum = exact_grouped(case, row_scales, w_scales, fmt, k, esc)
        assert_bf16_consistent(out, exact, f32_error_bound(abs_sum, fmt, k, n_mul=1))
        es = case["expert_start"]
        for g, e in enumerate(ids):  # D8: id -1 rows are zero bytes
            if e < 0:
                assert not np.any(out[es[g]:es[g + 1]].view(np.uint16))
        if matmul_mfma.path_for(target, fmt) == "bf16" and fmt.is_fp4:
            monkeypatch.setenv(matmul_mfma.ENV_SWITCH, "0")  # the portable grouped kernel
            port = mg.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=fmt, k=k,
                                                  device="interp", target=target)
            monkeypatch.delenv(matmul_mfma.ENV_SWITCH)
            np.testing.assert_array_equal(out.view(np.uint16), port.view(np.uint16))


@pytest.mark.interp
@pytest.mark.parametrize("target", TARGETS)
def test_grouped_mfma_row_scales(target, monkeypatch):
    monkeypatch.setenv(gm.GROUPED_SWITCH, "all")
    """a_row_scales (NVFP4) multiply after the expert scale (D10)."""
    counts, ids, e_count, n, k = [5, 0, 7], [1, 0, 0], 2, 20, 64
    rng = np.random.default_rng(5)
    case, row_scales, w_scales = make_grouped_case(rng, NVFP4, counts, ids, e_count, n, k)
    esc = np.array([0.75, 1.3], np.float32)
    rows = rng.uniform(0.25, 4, sum(counts)).astype(ml_dtypes.bfloat16)
    out = mg.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=NVFP4, k=k,
                                         a_row_scales=rows, device="interp", target=target)
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, NVFP4, k, esc, rows)
    assert_bf16_consistent(out, exact, f32_error_bound(abs_sum, NVFP4, k, n_mul=2))


def _row_major_case(rng, k):
    counts, ids, e_count, n = [4, 0, 70, 3], [2, 0, -1, 0], 3, 24
    ro = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
    t = int(ro[-1]) + 67  # 67 rows past the last group (two tail tiles)
    a, sa = random_data(rng, MXFP4, t, k), random_scales_2d(rng, MXFP4, t, k)
    b = np.stack([random_data(rng, MXFP4, n, k) for _ in range(e_count)])
    sb = np.stack([random_scales_2d(rng, MXFP4, n, k) for _ in range(e_count)])
    return a, b, sa, sb, ro, np.array(ids, np.int32)


def _exact_row_major(a, b, sa, sb, ro, ids, k):
    exact = np.zeros((a.shape[0], b.shape[1]))
    abs_sum = np.zeros_like(exact)
    ad = dequantize_exact(a, sa, MXFP4, k)
    for g, e in enumerate(ids):
        s, t = int(ro[g]), int(ro[g + 1])
        if e >= 0 and s < t:
            wd = dequantize_exact(b[e], sb[e], MXFP4, k)
            exact[s:t], abs_sum[s:t] = ad[s:t] @ wd.T, np.abs(ad[s:t]) @ np.abs(wd).T
    return exact, abs_sum


@pytest.mark.interp
@pytest.mark.parametrize("target", TARGETS)
def test_grouped_mfma_row_major_entry(target):
    """grouped_matmul_block_scaled_mxfp4 (row-major E8M0 scales, rows past the last group
    and of id -1 are zero) dispatches to the MFMA kernel."""
    rng = np.random.default_rng(12)
    k = 160
    a, b, sa, sb, ro, ids = _row_major_case(rng, k)
    out = mg.grouped_matmul_block_scaled_mxfp4(a, b, sa, sb, ro, ids, out_dtype="float32",
                                               device="interp", target=target)
    exact, abs_sum = _exact_row_major(a, b, sa, sb, ro, ids, k)
    assert_f32_within_bound(out, exact, f32_error_bound(abs_sum, MXFP4, k, 1))
    assert not np.any(out[int(ro[-1]):]) and not np.any(out[int(ro[2]):int(ro[3])])


def _run_sentinel(spec, vals, t, n, num_groups):
    from blockscale.ops import _core
    from blockscale.runtime.interpreter import run_kernel

    kern = _core.compile_kernel(spec)
    dt = np.float32 if spec.out_dtype == "float32" else ml_dtypes.bfloat16
    c = np.full((t, n), np.nan, dt)
    vals = {**vals, "c": c}
    args = []
    for x in spec.args():
        v = vals[x.name]
        if x.kind == "buffer":
            v = v.reshape(-1) if x.name == "c" else np.ascontiguousarray(v).reshape(-1)
            v = v.view(np.uint8) if v.dtype.itemsize == 1 else v
        args.append(v)
    run_kernel(kern.asm["mlir"], spec.kernel_name, gm.grid(t, n, num_groups), spec.block, args,
               spec.target)
    return c


@pytest.mark.interp
@pytest.mark.parametrize("target", TARGETS)
def test_grouped_mfma_writes_every_output(target):
    """Output pre-filled with NaN: every row (groups, id -1 group, rows past the last group)
    is written, with a K tail (unaligned kernel)."""
    rng = np.random.default_rng(3)
    k = 98
    a, b, sa, sb, ro, ids = _row_major_case(rng, k)
    t, n = a.shape[0], b.shape[1]
    spec = gm.spec_for(target, MXFP4, k, "row_major", "float32")
    assert not spec.aligned
    vals = {"a": a, "w": b, "sfa": sa, "sfb": sb, "expert_start": ro.astype(np.int32),
            "expert_ids": ids, "expert_scales": np.ones(b.shape[0], np.float32),
            "t": t, "n": n, "k": k, "num_groups": len(ids)}
    out = _run_sentinel(spec, vals, t, n, len(ids))
    assert not np.isnan(out).any()
    exact, abs_sum = _exact_row_major(a, b, sa, sb, ro, ids, k)
    assert_f32_within_bound(out, exact, f32_error_bound(abs_sum, MXFP4, k, 1))


@pytest.mark.lower
@pytest.mark.parametrize("target,fmt", [("gfx950", "mxfp4"), ("gfx950", "nvfp4"),
                                        ("gfx942", "mxfp8")])
def test_grouped_kernel_lowers_to_the_intended_mfma(target, fmt):
    spec = gm.MfmaGroupedSpec(fmt, "tcgen5d", "bfloat16", fmt == "nvfp4", True, target)
    k = gm.kernel(spec)
    dis = k.asm["disasm"]
    if spec.path == "scaled":
        assert dis.count("v_mfma_scale_f32_16x16x128_f8f6f4") == 4
    else:
        assert dis.count("v_mfma_f32_16x16x16_bf16") == (4 if fmt == "nvfp4" else 8)
    assert "__ockl" not in k.asm["llvm"] and k.meta["scratch_bytes"] == 0, k.meta


def test_grouped_specs():
    for t in TARGETS:
        specs = gm.bundle_specs(t)
        assert len({s.kernel_name for s in specs}) == len(specs) == 10
    assert gm.bundle_specs("sm_90a") == []
    assert gm.fast_path("sm_90a", MXFP4, 8, 8, 64, 2, False) is None
    with pytest.raises(TypeError, match="row_scales must be a bool"):
        gm.MfmaGroupedSpec("nvfp4", row_scales=1)
    assert gm.grid(130, 65, 3) == (2, 3 + 3 + 1, 1)


def test_grouped_dispatch_keeps_d10(monkeypatch):
    """By default the 5-D entry point uses the MFMA kernel only where it equals the portable
    kernel (the fused SwiGLU's mainloop on AMD) bit for bit: FP4 on the bf16 path."""
    take = {(t, f.name): gm.fast_path(t, f, 8, 8, 64, 2, False) is not None
            for t in TARGETS for f in FORMATS}
    assert take == {("gfx950", "nvfp4"): True, ("gfx950", "mxfp4"): False,
                    ("gfx950", "mxfp8"): False, ("gfx942", "nvfp4"): True,
                    ("gfx942", "mxfp4"): True, ("gfx942", "mxfp8"): False}
    monkeypatch.setenv(gm.GROUPED_SWITCH, "all")
    assert gm.fast_path("gfx950", MXFP8, 8, 8, 64, 2, False) is not None
    monkeypatch.setenv(gm.GROUPED_SWITCH, "0")
    assert gm.fast_path("gfx942", NVFP4, 8, 8, 64, 2, False) is None
    monkeypatch.setenv(gm.GROUPED_SWITCH, "yes")
    with pytest.raises(ValueError, match="BLOCKSCALE_AMD_MFMA_GROUPED must be one of"):
        gm.fast_path("gfx942", NVFP4, 8, 8, 64, 2, False)

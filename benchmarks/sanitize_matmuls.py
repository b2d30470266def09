"""The tiled matmul kernels at tail shapes, for compute-sanitizer (benchmarks/sanitize_driver.py).

Covers what the portable-kernel section of the driver does not: the sm_90a dense dispatch (the
decode kernel for M <= 16, the tensor-core kernels above), the mma.sync and wgmma kernels called
directly (incl. the TMA-fed wgmma loop and the two-phase pair), the grouped (MoE) matmul dispatch (tile scheduler, decode kernel), the fused grouped
matmul + SwiGLU + quantize, and the TMA quantize kernel. Outputs are checked against the exact
float64 value within the stated fp32 bound (tests/test_matmul_common.py) or, for the fused
SwiGLU op, against the reference with at most 1 % of bytes one rounding step away (fp32
accumulation order decides near-ties); quantize byte for byte.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))

DENSE = [(1, 72, 96), (16, 136, 256), (17, 64, 128), (130, 136, 192), (129, 256, 1024)]
GROUPED = [([0, 3, 1, 2], [-1, 2, -1, 0], 3, 40, 128), ([65, 129, 2], [0, 1, 2], 3, 136, 192),
           ([1, 1], [1, 0], 2, 64, 256),
           ([600, 0, 130, 400], [0, 2, -1, 1], 3, 264, 192)]  # >= 1024 rows: grouped wgmma


def run(device: str, check: Callable[[str, Any, Any], None], bad: list[str]) -> int:
    """Launch every tiled kernel; append failures to ``bad``; return the number of calls."""
    from test_matmul_common import (
        assert_bf16_consistent,
        assert_f32_within_bound,
        exact_dense,
        f32_error_bound,
        random_dense_case,
    )
    from test_matmul_grouped import exact_grouped, make_grouped_case

    from benchmarks.fuzz_gpu import values
    from blockscale import reference as ref
    from blockscale.formats import FORMATS, NVFP4
    from blockscale.ops import (
        matmul,
        matmul_grouped,
        matmul_sm90,
        matmul_swiglu,
        matmul_twophase,
        matmul_twophase_mx8,
        matmul_wgmma,
    )
    from blockscale.ops import quantize as Q

    calls = 0

    def expect(name: str, assertion: Callable[..., Any], got: Any, *want: Any) -> None:
        nonlocal calls
        calls += 1
        try:
            assertion(got, *want)
        except AssertionError as e:
            bad.append(f"{name}: {str(e).splitlines()[0][:160]}")

    for fmt in FORMATS:
        for m, n, k in DENSE:
            rng = np.random.default_rng(m * 7 + n + k)
            a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
            exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, 0.5, None)
            bound = f32_error_bound(abs_sum, fmt, k, n_mul=1)
            ops_args = (a, b, sfa5, sfb5, fmt)
            kw = {"k": k, "alpha": 0.5, "device": device}
            expect(f"dispatch {fmt.name} {m}x{n}x{k}", assert_bf16_consistent,
                   matmul.block_scaled_matmul(*ops_args, target="sm_90a", **kw), exact, bound)
            if m > 16:
                expect(f"mma.sync {fmt.name} {m}x{n}x{k}", assert_f32_within_bound,
                       matmul_sm90.block_scaled_matmul_sm90(*ops_args, out_dtype="float32",
                                                            **kw), exact, bound)
            if matmul_wgmma.supported(fmt, k):
                expect(f"wgmma {fmt.name} {m}x{n}x{k}", assert_f32_within_bound,
                       matmul_wgmma.block_scaled_matmul_wgmma(*ops_args, out_dtype="float32",
                                                              **kw), exact, bound)
            if k % 32 == 0 and fmt.name in matmul_twophase.FORMATS:
                expect(f"twophase {fmt.name} {m}x{n}x{k}", assert_f32_within_bound,
                       matmul_twophase.block_scaled_matmul_twophase(
                           *ops_args, out_dtype="float32", **kw), exact, bound)
                expect(f"twophase-persistent {fmt.name} {m}x{n}x{k}", assert_f32_within_bound,
                       matmul_twophase.block_scaled_matmul_twophase(  # every tile on 1 CTA
                           *ops_args, out_dtype="float32", schedule="persistent", ctas=1,
                           **kw), exact, bound)
            if k % 32 == 0 and fmt.name == "mxfp8":  # its bound: one rounding more a block
                mx8_bound = f32_error_bound(abs_sum, fmt, k, n_mul=1 + fmt.kblocks(k))
                # initcheck runs with BLOCKSCALE_SM90_STAGED_STORE=0: it does not see the
                # staged store's cp.async.bulk writes (tools/sanitize.sh)
                staged = os.environ.get("BLOCKSCALE_SM90_STAGED_STORE", "1") != "0"
                for store in ("direct", "staged") if staged else ("direct",):
                    expect(f"twophase-mx8 {store} {m}x{n}x{k}", assert_f32_within_bound,
                           matmul_twophase_mx8.block_scaled_matmul_twophase_mx8(
                               a, b, sfa5, sfb5, out_dtype="float32", store=store, **kw),
                           exact, mx8_bound)
            if matmul_wgmma.supported(fmt, k) and fmt.name in matmul_wgmma.DISPATCH_FORMATS:
                expect(f"wgmma-tma {fmt.name} {m}x{n}x{k}", assert_f32_within_bound,
                       matmul_wgmma.block_scaled_matmul_wgmma(
                           *ops_args, out_dtype="float32", tiles=(128, 256),
                           pipeline=matmul_wgmma.WIDE_PIPELINE, **kw), exact, bound)
        for counts, ids, e_count, n, k in GROUPED:
            rng = np.random.default_rng(sum(counts) + n)
            case, row_scales, w_scales = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
            esc = (1 + np.arange(e_count) / e_count).astype(np.float32)
            exact, abs_sum = exact_grouped(case, row_scales, w_scales, fmt, k, esc)
            expect(f"grouped {fmt.name} {counts} N={n} K={k}", assert_bf16_consistent,
                   matmul_grouped.grouped_matmul_block_scaled(
                       **case, expert_scales=esc, fmt=fmt, k=k, device=device, target="sm_90a"),
                   exact, f32_error_bound(abs_sum, fmt, k, n_mul=1))
            if n % 2 == 0:
                from blockscale import layouts
                w_sigma = ref.sigma_permute_rows(case["weight"])
                sfb_sigma = np.stack([layouts.interleave(ref.sigma_permute_rows(s))
                                      for s in w_scales])
                grp = (case["hidden"], w_sigma, case["a_scales"], sfb_sigma,
                       case["expert_start"], case["a_scale_offsets"], case["expert_ids"], esc,
                       (2 - np.arange(e_count) / e_count).astype(np.float32)
                       if fmt is NVFP4 else None)
                got = matmul_swiglu.grouped_matmul_swiglu(*grp, fmt, k=k, device=device,
                                                          target="sm_90a")
                want = ref.grouped_matmul_swiglu(*grp, fmt, k=k)
                calls += 1
                for g, w, what in zip(got, want, ("data", "scales")):
                    gb, wb = (np.ascontiguousarray(np.asarray(x)).view(np.uint8) for x in (g, w))
                    diff = int((gb != wb).sum())
                    if gb.shape != wb.shape or diff > max(1, gb.size // 100):
                        bad.append(f"swiglu {fmt.name} {counts} {what}: {diff} bytes differ")
    rng = np.random.default_rng(5)
    for m in (1, 129, 300):
        for k in (64, 192):
            x = values(rng, (m, k))
            check(f"quantize TMA nvfp4 M={m} K={k}",
                  Q.quantize_dynamic_scaled_fp4_async(x, tensor_sf=0.5, device=device,
                                                      target="sm_90a"),
                  ref.quantize_dynamic_block_scaled(x, NVFP4, tensor_sf=0.5))
    return calls


def specs(target: str = "sm_90a") -> list[Any]:
    """The kernel specs :func:`run` launches (for ``make gpu-bundle``): :func:`run` on the
    interpreter device with launches skipped, recording every spec it asks for."""
    from blockscale import runtime
    from blockscale.ops import _core

    if target != "sm_90a":
        return []
    seen: dict[Any, None] = {}
    original = _core.get_kernel

    def recording(spec: Any, build: Any = None) -> Any:
        seen.setdefault(spec, None)
        return original(spec, build)

    dev = runtime.get_device("interp")
    dev.launch = lambda kernel, grid, args, stream=None: None  # outputs stay unchecked
    _core.get_kernel = recording
    try:
        run(dev, lambda *a: None, [])
    finally:
        _core.get_kernel = original
        del dev.launch  # the shared interpreter device launches again
    return list(seen)

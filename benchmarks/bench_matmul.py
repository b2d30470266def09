"""Benchmark block-scaled matmul on an NVIDIA GPU against torch / Triton baselines.

    BLOCKSCALE_BUNDLE_DIR=build/gpu python benchmarks/bench_matmul.py [--fmt nvfp4|mxfp4|mxfp8]
        [--m 1,16,128,1024,8192] [--n 5760] [--k 2944] [--iters 20] [--json out.json]

For each M it builds random operands, then for each implementation: checks its output against
the float64 value on exactly dequantized operands (on a sample of rows; blockscale kernels must
pass the bf16-consistency check of tests/test_matmul_common.py, baselines are reported with
their relative error since they quantize differently), then times it with CUDA events
(``benchmarks.common.time_ms``: the queue kept full, so host overhead is excluded) and prints
one row per (M, implementation): milliseconds, TFLOP/s (2*M*N*K), and the check result.

Implementations:

* ``blockscale``: ``ops.block_scaled_matmul`` (on sm_90a the wgmma kernel of
  ``ops.matmul_wgmma`` for M > 16, else the decode / mma.sync fast paths, else the portable
  kernel);
* ``blockscale-mma``: the same call with ``BLOCKSCALE_SM90_WGMMA=0`` (the mma.sync kernel of
  ``ops.matmul_sm90``);
* ``blockscale-wgmma-{dequant}-{scaling}-k{kstep}[-128x256][-late]``, and NVFP4 / MXFP4
  ``blockscale-wgmma-{dequant}-fold-k64-128x{128,256}-{ws,tma}`` (the TMA-fed loop): every variant of the
  wgmma kernel (``matmul_wgmma.VARIANTS``; "fold" also with 128 x 256 tiles; ``pipeline``
  "early" and "late"), called directly;
* ``blockscale-twophase-128x256[-k32]``, ``-192x256``: ``ops.matmul_twophase`` (NVFP4 /
  MXFP4: dequantize to stage-ordered bf16 workspaces, then a bf16 wgmma GEMM fed by
  cp.async.bulk through an mbarrier ring; kstep 64 / 4 stages, or 32 / 9; 192-row tiles:
  3 warpgroups, kstep 64 / 4 stages); ``blockscale-twophase-phase1`` / ``-phase2``: its
  dequantization launches alone / its GEMM alone (128 x 256, kstep 64); ``-128x256-sw128``,
  ``-192x256-sw128``, ``-phase1-sw128``, ``-phase2-sw128``: the same with 128B-swizzled
  workspaces and shared stages (``swizzle="128b"``); ``-128x256-persistent``,
  ``-phase2-persistent``: phase 2 with ``schedule="persistent"`` (one CTA per SM looping
  over the tiles, its bulk-copy ring kept full across tile boundaries); ``-128x256-staged``,
  ``-phase2-staged``: phase 2's epilogue staged in shared memory and written by one bulk
  copy per row (``store="staged"``); ``-128x192-staged``: 128 x 192 tiles (``bn=192``);
  ``-128x240-staged``, ``-128x224-staged``, ``-128x240-sw128-staged``, ``-phase1-bn240``,
  ``-phase2-staged-bn240``: 128 x 240 / 224 tiles (issue #9: tiles that fill the waves);
  ``-phase2-staged-bn{192,224}-s{4,5}``: phase 2 alone at 4 and 5 stages (a 5-stage ring
  divides by 5 for its slots and parities);
* ``blockscale-twophase-128x{256,240}-staged-pdl``: the staged pair with programmatic
  dependent launch (``pdl=True``: phase 2 starts while B's phase 1 finishes);
* ``blockscale-twophase-phase2-staged-bn{256,240}-c2``, ``-128x{256,240}-staged-c2[-pdl]``:
  phase 2 alone / the pair in 2-CTA clusters along M sharing each B stage by multicast bulk
  copies (``cluster=2``; issue #9: a pair reads B's tile-row from L2 once);
* ``blockscale-dispatch-bnauto-{bn}``: the dispatch with ``BLOCKSCALE_SM90_TWOPHASE_BN=auto``
  (the wave model's tile width ``bn``, :func:`matmul_twophase.wave_bn`);
* ``blockscale-portable``: the same call with both fast paths off (``BLOCKSCALE_SM90_FAST=0``,
  ``BLOCKSCALE_SM90_WGMMA=0``);
* ``torch-bf16``: ``torch.matmul`` on bf16 dequantized A and B (the W4A16 upper bound a
  dequantize-then-GEMM path reaches);
* ``torch-fp8-rowwise``: ``torch._scaled_mm`` with FP8 E4M3 A/B and per-row / per-column f32
  scales (re-quantized from the dequantized operands);
* ``triton-dot-scaled``: a Triton kernel around ``tl.dot_scaled`` (MXFP4 / MXFP8 only: E8M0
  scales, row-major); on Hopper Triton decomposes it to bf16 dots.

Baselines that cannot run (no torch, no triton, an unsupported format) print why.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from blockscale import layouts
from blockscale.formats import Format
from blockscale.ops import matmul


def _random_case(rng: np.random.Generator, fmt: Format, m: int, n: int, k: int):
    sys.path.insert(0, "tests")
    from test_matmul_common import random_data, random_scales_2d

    a, b = random_data(rng, fmt, m, k), random_data(rng, fmt, n, k)
    sa, sb = random_scales_2d(rng, fmt, m, k), random_scales_2d(rng, fmt, n, k)
    return a, b, sa, sb


def _check_rows(out: np.ndarray, a_deq: np.ndarray, b_deq: np.ndarray, rows: np.ndarray,
                fmt: Format, k: int, strict: bool, n_mul: int = 1) -> str:
    from test_matmul_common import assert_bf16_consistent, f32_error_bound

    exact = a_deq[rows] @ b_deq.T
    got = np.asarray(out)[rows]
    rel = float(np.abs(got.astype(np.float64) - exact).max() / max(np.abs(exact).max(), 1e-30))
    if strict:
        bound = f32_error_bound(np.abs(a_deq[rows]) @ np.abs(b_deq).T, fmt, k, n_mul=n_mul)
        try:
            assert_bf16_consistent(got, exact, bound)
        except AssertionError as e:
            return f"FAIL ({str(e)[:80]})"
        return f"exact-consistent (max rel {rel:.1e})"
    return f"max rel err {rel:.2e}"


def _timer(fn: Callable[[], Any], iters: int, sync: Callable[[], None]) -> float:
    """Median GPU milliseconds of ``fn``: ``benchmarks.common.time_ms`` (CUDA events with the
    queue kept full, so the host-side cost of a Python op call is not counted; it was ~0.65 ms
    per blockscale call and dominated small M before). Without torch: blockscale events."""
    del sync  # time_ms synchronizes itself
    from benchmarks import common as C

    return C.time_ms(lambda i: fn(), min_iters=max(5, iters)).ms


def _triton_dot_scaled(fmt: Format) -> Callable[..., Any] | None:
    """A Triton matmul over ``tl.dot_scaled`` for MX formats (row-major E8M0 scales)."""
    import triton
    import triton.language as tl

    elem = "e2m1" if fmt.is_fp4 else "e4m3"
    div = 2 if fmt.is_fp4 else 1

    @triton.jit
    def kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, ELEM: tl.constexpr, DIV: tl.constexpr):
        pm, pn = tl.program_id(0), tl.program_id(1)
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kb = k0 // DIV + tl.arange(0, BK // DIV)
            a = tl.load(a_ptr + rm[:, None] * (K // DIV) + kb[None, :], mask=rm[:, None] < M,
                        other=0)
            b = tl.load(b_ptr + rn[:, None] * (K // DIV) + kb[None, :], mask=rn[:, None] < N,
                        other=0)
            ks = k0 // 32 + tl.arange(0, BK // 32)
            sa = tl.load(sa_ptr + rm[:, None] * (K // 32) + ks[None, :], mask=rm[:, None] < M,
                         other=127)
            sb = tl.load(sb_ptr + rn[:, None] * (K // 32) + ks[None, :], mask=rn[:, None] < N,
                         other=127)
            acc = tl.dot_scaled(a, sa, ELEM, tl.trans(b), sb, ELEM, acc)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

    def run(a, b, sa, sb, c, m, n, k):
        grid = (triton.cdiv(m, 64), triton.cdiv(n, 128))
        kernel[grid](a, b, sa, sb, c, m, n, k, BM=64, BN=128, BK=128, ELEM=elem, DIV=div)

    return run


def bench(fmt: Format, m: int, n: int, k: int, iters: int) -> list[dict[str, Any]]:
    sys.path.insert(0, "tests")
    from test_matmul_common import dequantize_exact

    rng = np.random.default_rng(m)
    a, b, sa, sb = _random_case(rng, fmt, m, n, k)
    sa5, sb5 = layouts.interleave(sa), layouts.interleave(sb)
    a_deq, b_deq = dequantize_exact(a, sa, fmt, k), dequantize_exact(b, sb, fmt, k)
    rows = np.unique(np.concatenate([np.arange(min(m, 32)), np.arange(max(0, m - 8), m)]))
    flops = 2.0 * m * n * k
    results: list[dict[str, Any]] = []

    def record(name: str, ms: float | None, check: str) -> None:
        tf = flops / (ms * 1e-3) / 1e12 if ms else None
        results.append({"fmt": fmt.name, "m": m, "n": n, "k": k, "impl": name, "ms": ms,
                        "tflops": tf, "check": check})
        ms_s = f"{ms:9.3f}" if ms else "        -"
        tf_s = f"{tf:8.2f}" if tf else "       -"
        print(f"{fmt.name:6} {m:6} {name:20} {ms_s} ms {tf_s} TFLOP/s  {check}", flush=True)

    # blockscale: device arrays so the timing excludes host copies
    from blockscale import runtime

    dev = runtime.get_device("cuda")
    args = [dev.to_device(x) for x in (a, b, sa5, sb5)]
    out = matmul.block_scaled_matmul(*args, fmt, k=k, device=dev, target="sm_90a")
    check = _check_rows(dev.to_host(out), a_deq, b_deq, rows, fmt, k, strict=True)
    ms = _timer(lambda: matmul.block_scaled_matmul(*args, fmt, k=k, device=dev,
                                                   target="sm_90a"),
                iters, dev.synchronize)
    record("blockscale", ms, check)
    import os

    from blockscale.ops import matmul_sm90, matmul_wgmma

    if matmul_wgmma.supported(fmt, k):  # the wgmma kernel (the default dispatch for M > 16)
        os.environ[matmul_wgmma.ENV_SWITCH] = "0"  # the mma.sync kernel, for comparison
        try:
            out = matmul.block_scaled_matmul(*args, fmt, k=k, device=dev, target="sm_90a")
            check = _check_rows(dev.to_host(out), a_deq, b_deq, rows, fmt, k, strict=True)
            record("blockscale-mma",
                   _timer(lambda: matmul.block_scaled_matmul(*args, fmt, k=k, device=dev,
                                                             target="sm_90a"),
                          iters, dev.synchronize), check)
        finally:
            del os.environ[matmul_wgmma.ENV_SWITCH]
        variants = [(dq, sc, ks, t, p)
                    for (dq, sc), ksteps in matmul_wgmma.VARIANTS[fmt.name].items()
                    for ks in ksteps for t in ((None, (128, 256)) if sc == "fold" else (None,))
                    for p in matmul_wgmma.PIPELINES]
        variants += [(dq, sc, 64, t, p)  # the TMA-fed loop (NVFP4, MXFP4)
                     for dq, sc in matmul_wgmma.ws_variants(fmt.name)
                     for p, tiles in matmul_wgmma.WS_BUNDLE_TILES.items() for t in tiles]
        for dq, sc, ks, t, p in variants:  # every variant (tiles: the default, or 128 x 256)
            def wg_variant(dq: str = dq, sc: str = sc, ks: int = ks, t: Any = t,
                           p: str = p) -> Any:
                return matmul_wgmma.block_scaled_matmul_wgmma(*args, fmt, k=k, device=dev,
                                                              dequant=dq, scaling=sc, kstep=ks,
                                                              tiles=t, pipeline=p)
            extra = fmt.kblocks(k) if fmt.is_mx and sc == "fold" else 0  # 2 k16s per block
            check = _check_rows(dev.to_host(wg_variant()), a_deq, b_deq, rows, fmt, k,
                                strict=True, n_mul=1 + extra)
            tag = ("" if t is None else f"-{t[0]}x{t[1]}") + ("" if p == "early" else f"-{p}")
            record(f"blockscale-wgmma-{dq}-{sc}-k{ks}{tag}",
                   _timer(wg_variant, iters, dev.synchronize), check)

    from blockscale.ops import matmul_twophase

    if fmt.name in matmul_twophase.FORMATS and k % 32 == 0:  # dequantize, then a bf16 GEMM
        record("blockscale-twophase-phase1",  # phase 1 alone (both operands' workspaces)
               _timer(lambda: matmul_twophase.dequantize_operands(*args, fmt, k=k, device=dev),
                      iters, dev.synchronize), "n/a (workspaces only)")
        wa, wb = matmul_twophase.dequantize_operands(*args, fmt, k=k, device=dev)

        def phase2() -> Any:  # phase 2 alone (default kstep / stages)
            return matmul_twophase.matmul_workspaces(wa, wb, fmt, m, n, k, device=dev)
        check = _check_rows(dev.to_host(phase2()), a_deq, b_deq, rows, fmt, k, strict=True,
                            n_mul=1 + (fmt.kblocks(k) if fmt.is_mx else 0))
        record("blockscale-twophase-phase2", _timer(phase2, iters, dev.synchronize), check)

        def phase2_staged() -> Any:  # phase 2 alone, the tile staged in shared memory
            return matmul_twophase.matmul_workspaces(wa, wb, fmt, m, n, k, store="staged",
                                                     device=dev)
        check = _check_rows(dev.to_host(phase2_staged()), a_deq, b_deq, rows, fmt, k,
                            strict=True, n_mul=1 + (fmt.kblocks(k) if fmt.is_mx else 0))
        record("blockscale-twophase-phase2-staged",
               _timer(phase2_staged, iters, dev.synchronize), check)

        def phase2_pers_st() -> Any:  # phase 2 alone, persistent, the tile staged
            return matmul_twophase.matmul_workspaces(wa, wb, fmt, m, n, k, store="staged",
                                                     schedule="persistent", device=dev)
        check = _check_rows(dev.to_host(phase2_pers_st()), a_deq, b_deq, rows, fmt, k,
                            strict=True, n_mul=1 + (fmt.kblocks(k) if fmt.is_mx else 0))
        record("blockscale-twophase-phase2-persistent-staged",
               _timer(phase2_pers_st, iters, dev.synchronize), check)

        def phase2_pers() -> Any:  # phase 2 alone, persistent (one CTA per SM)
            return matmul_twophase.matmul_workspaces(wa, wb, fmt, m, n, k,
                                                     schedule="persistent", device=dev)
        check = _check_rows(dev.to_host(phase2_pers()), a_deq, b_deq, rows, fmt, k,
                            strict=True, n_mul=1 + (fmt.kblocks(k) if fmt.is_mx else 0))
        record("blockscale-twophase-phase2-persistent",
               _timer(phase2_pers, iters, dev.synchronize), check)
        sw = "128b"  # the 128B-swizzled pair: phase 1 and phase 2 alone
        record("blockscale-twophase-phase1-sw128",
               _timer(lambda: matmul_twophase.dequantize_operands(*args, fmt, k=k, swizzle=sw,
                                                                  device=dev),
                      iters, dev.synchronize), "n/a (workspaces only)")
        wsa, wsb = matmul_twophase.dequantize_operands(*args, fmt, k=k, swizzle=sw, device=dev)

        def phase2_sw() -> Any:
            return matmul_twophase.matmul_workspaces(wsa, wsb, fmt, m, n, k, swizzle=sw,
                                                     device=dev)
        check = _check_rows(dev.to_host(phase2_sw()), a_deq, b_deq, rows, fmt, k, strict=True,
                            n_mul=1 + (fmt.kblocks(k) if fmt.is_mx else 0))
        record("blockscale-twophase-phase2-sw128", _timer(phase2_sw, iters, dev.synchronize),
               check)
        del wsa, wsb
        if n % 8 == 0:  # 128 x 240 tiles (issue #9: N=5760 = 24 x 240 fills 12 waves)
            record("blockscale-twophase-phase1-bn240",
                   _timer(lambda: matmul_twophase.dequantize_operands(*args, fmt, k=k, bn=240,
                                                                      device=dev),
                          iters, dev.synchronize), "n/a (workspaces only)")
            wa, wb = matmul_twophase.dequantize_operands(*args, fmt, k=k, bn=240, device=dev)

            def phase2_bn240() -> Any:  # phase 2 alone, 128 x 240 tiles, staged
                return matmul_twophase.matmul_workspaces(wa, wb, fmt, m, n, k, bn=240,
                                                         store="staged", device=dev)
            check = _check_rows(dev.to_host(phase2_bn240()), a_deq, b_deq, rows, fmt, k,
                                strict=True, n_mul=1 + (fmt.kblocks(k) if fmt.is_mx else 0))
            record("blockscale-twophase-phase2-staged-bn240",
                   _timer(phase2_bn240, iters, dev.synchronize), check)
            for w, st in ((192, 4), (192, 5), (224, 4), (224, 5)):  # does a 5-stage ring cost?
                wa, wb = matmul_twophase.dequantize_operands(*args, fmt, k=k, bn=w, device=dev)

                def phase2_w(w: int = w, st: int = st, wa: Any = wa, wb: Any = wb) -> Any:
                    return matmul_twophase.matmul_workspaces(wa, wb, fmt, m, n, k, bn=w,
                                                             stages=st, store="staged",
                                                             device=dev)
                check = _check_rows(dev.to_host(phase2_w()), a_deq, b_deq, rows, fmt, k,
                                    strict=True,
                                    n_mul=1 + (fmt.kblocks(k) if fmt.is_mx else 0))
                record(f"blockscale-twophase-phase2-staged-bn{w}-s{st}",
                       _timer(phase2_w, iters, dev.synchronize), check)
            del wa, wb
        for bn in (256, 240) if n % 8 == 0 else ():  # programmatic dependent launch
            def pdl_pair(bn: int = bn) -> Any:
                return matmul_twophase.block_scaled_matmul_twophase(
                    *args, fmt, k=k, device=dev, store="staged", bn=bn, pdl=True)
            check = _check_rows(dev.to_host(pdl_pair()), a_deq, b_deq, rows, fmt, k,
                                strict=True, n_mul=1 + (fmt.kblocks(k) if fmt.is_mx else 0))
            record(f"blockscale-twophase-128x{bn}-staged-pdl",
                   _timer(pdl_pair, iters, dev.synchronize), check)
        for bn in (256, 240) if n % 8 == 0 else ():  # 2-CTA clusters sharing B (multicast)
            wa, wb = matmul_twophase.dequantize_operands(*args, fmt, k=k, bn=bn, device=dev)

            def phase2_c2(bn: int = bn, wa: Any = wa, wb: Any = wb) -> Any:
                return matmul_twophase.matmul_workspaces(wa, wb, fmt, m, n, k, bn=bn,
                                                         store="staged", cluster=2, device=dev)
            check = _check_rows(dev.to_host(phase2_c2()), a_deq, b_deq, rows, fmt, k,
                                strict=True, n_mul=1 + (fmt.kblocks(k) if fmt.is_mx else 0))
            record(f"blockscale-twophase-phase2-staged-bn{bn}-c2",
                   _timer(phase2_c2, iters, dev.synchronize), check)
            del wa, wb
            for pdl in (False, True):
                def pair_c2(bn: int = bn, pdl: bool = pdl) -> Any:
                    return matmul_twophase.block_scaled_matmul_twophase(
                        *args, fmt, k=k, device=dev, store="staged", bn=bn, pdl=pdl,
                        cluster=2)
                check = _check_rows(dev.to_host(pair_c2()), a_deq, b_deq, rows, fmt, k,
                                    strict=True,
                                    n_mul=1 + (fmt.kblocks(k) if fmt.is_mx else 0))
                record(f"blockscale-twophase-128x{bn}-staged-c2{'-pdl' if pdl else ''}",
                       _timer(pair_c2, iters, dev.synchronize), check)
        before = os.environ.get(matmul_twophase.ENV_BN)
        os.environ[matmul_twophase.ENV_BN] = "auto"  # the dispatch with the wave model's bn
        try:
            if matmul_twophase.fast_path("sm_90a", fmt, m, n, k, "bfloat16", None):
                run = lambda: matmul.block_scaled_matmul(*args, fmt, k=k, device=dev,
                                                         target="sm_90a")
                check = _check_rows(dev.to_host(run()), a_deq, b_deq, rows, fmt, k,
                                    strict=True, n_mul=1 + (fmt.kblocks(k) if fmt.is_mx else 0))
                bn = matmul_twophase.dispatch_bn(m, n, dev)
                record(f"blockscale-dispatch-bnauto-{bn}", _timer(run, iters, dev.synchronize),
                       check)
        finally:
            if before is None:
                del os.environ[matmul_twophase.ENV_BN]
            else:
                os.environ[matmul_twophase.ENV_BN] = before
        for ks, bm, bn, swz, sch, st in ((64, 128, 256, "none", "tiles", "direct"),
                                         (64, 128, 256, "none", "tiles", "staged"),
                                         (64, 128, 192, "none", "tiles", "staged"),
                                         (64, 128, 240, "none", "tiles", "staged"),
                                         (64, 128, 224, "none", "tiles", "staged"),
                                         (64, 128, 240, sw, "tiles", "staged"),
                                         (32, 128, 256, "none", "tiles", "direct"),
                                         (64, 192, 256, "none", "tiles", "direct"),
                                         (64, 128, 256, sw, "tiles", "direct"),
                                         (64, 192, 256, sw, "tiles", "direct"),
                                         (64, 128, 256, "none", "persistent", "direct"),
                                         (64, 128, 256, "none", "persistent", "staged")):
            if st == "staged" and n % 8:
                continue
            def twophase(ks: int = ks, bm: int = bm, bn: int = bn, swz: str = swz,
                         sch: str = sch, st: str = st) -> Any:
                return matmul_twophase.block_scaled_matmul_twophase(
                    *args, fmt, k=k, device=dev, kstep=ks, bm=bm, swizzle=swz, schedule=sch,
                    store=st, bn=bn)
            extra = fmt.kblocks(k) if fmt.is_mx else 0  # the fold kernel's operands
            check = _check_rows(dev.to_host(twophase()), a_deq, b_deq, rows, fmt, k,
                                strict=True, n_mul=1 + extra)
            tag = ("" if ks == matmul_twophase.DEFAULT_KSTEP else f"-k{ks}") + (
                "" if swz == "none" else "-sw128") + ("" if sch == "tiles" else f"-{sch}") + (
                "" if st == "direct" else f"-{st}")
            record(f"blockscale-twophase-{bm}x{bn}{tag}",
                   _timer(twophase, iters, dev.synchronize),
                   check)

    os.environ[matmul_wgmma.ENV_SWITCH] = "0"
    os.environ[matmul_sm90.ENV_SWITCH] = "0"  # the portable kernel, for comparison
    try:
        out = matmul.block_scaled_matmul(*args, fmt, k=k, device=dev, target="sm_90a")
        check = _check_rows(dev.to_host(out), a_deq, b_deq, rows, fmt, k, strict=True)
        record("blockscale-portable",
               _timer(lambda: matmul.block_scaled_matmul(*args, fmt, k=k, device=dev,
                                                         target="sm_90a"),
                      max(1, iters // 4), dev.synchronize), check)
    finally:
        del os.environ[matmul_sm90.ENV_SWITCH], os.environ[matmul_wgmma.ENV_SWITCH]

    try:
        import torch
    except ImportError as e:
        record("torch-*", None, f"skipped: {e}")
        return results
    ta = torch.tensor(a_deq.astype(np.float32), device="cuda").to(torch.bfloat16)
    tb = torch.tensor(b_deq.astype(np.float32), device="cuda").to(torch.bfloat16)
    c = ta @ tb.T
    record("torch-bf16", _timer(lambda: ta @ tb.T, iters, torch.cuda.synchronize),
           _check_rows(c.float().cpu().numpy(), a_deq, b_deq, rows, fmt, k, strict=False))
    try:
        fa, fb = ta.float(), tb.float()
        s_a = (fa.abs().amax(dim=1, keepdim=True) / 448).clamp(min=1e-12)
        s_b = (fb.abs().amax(dim=1, keepdim=True) / 448).clamp(min=1e-12)
        qa = (fa / s_a).to(torch.float8_e4m3fn)
        qb = (fb / s_b).to(torch.float8_e4m3fn)
        sbt = s_b.T.contiguous()

        def fp8() -> Any:
            return torch._scaled_mm(qa, qb.T, scale_a=s_a, scale_b=sbt, out_dtype=torch.bfloat16)

        c = fp8()
        record("torch-fp8-rowwise", _timer(fp8, iters, torch.cuda.synchronize),
               _check_rows(c.float().cpu().numpy(), a_deq, b_deq, rows, fmt, k, strict=False))
    except Exception as e:  # noqa: BLE001 - report and go on
        record("torch-fp8-rowwise", None, f"skipped: {type(e).__name__}: {str(e)[:60]}")
    if not fmt.is_mx:
        record("triton-dot-scaled", None, "skipped: tl.dot_scaled takes E8M0 scales (MX only)")
        return results
    try:
        run = _triton_dot_scaled(fmt)
        da = torch.tensor(a.view(np.uint8), device="cuda")
        db = torch.tensor(b.view(np.uint8), device="cuda")
        if not fmt.is_fp4:
            da, db = da.view(torch.float8_e4m3fn), db.view(torch.float8_e4m3fn)
        dsa = torch.tensor(sa.view(np.uint8), device="cuda")
        dsb = torch.tensor(sb.view(np.uint8), device="cuda")
        c = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
        run(da, db, dsa, dsb, c, m, n, k)
        check = _check_rows(c.float().cpu().numpy(), a_deq, b_deq, rows, fmt, k, strict=False)
        record("triton-dot-scaled",
               _timer(lambda: run(da, db, dsa, dsb, c, m, n, k), iters, torch.cuda.synchronize),
               check)
    except Exception as e:  # noqa: BLE001
        record("triton-dot-scaled", None, f"skipped: {type(e).__name__}: {str(e)[:60]}")
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fmt", default="nvfp4,mxfp4,mxfp8")
    p.add_argument("--m", default="1,16,128,1024,8192")
    p.add_argument("--n", type=int, default=5760)
    p.add_argument("--k", type=int, default=2944)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", default="")
    ns = p.parse_args(argv)
    results = []
    for f in ns.fmt.split(","):
        for m in (int(x) for x in ns.m.split(",")):
            results += bench(Format.from_name(f), m, ns.n, ns.k, ns.iters)
    if ns.json:
        with open(ns.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""MXFP8 dense matmul on the H200: the mma.sync kernel (today's dispatch) against the two-phase
MXFP8 kernels (``ops/matmul_twophase_mx8.py``, issue #9), at M x 5760 x 2944.

Rows per M (bf16 output, alpha 0.375):

* ``mma.sync (dispatch)``: ``block_scaled_matmul`` as dispatched today (switch off);
* ``twophase-mx8 (dispatch)``: the same call with ``BLOCKSCALE_SM90_TWOPHASE_MX8=1`` (the
  default from M = 512);
* ``twophase-mx8 staged bn{256,240}`` / ``direct bn256``: the direct call per phase-2 store and
  tile width;
* ``  fold`` / ``  phase1 A`` / ``  phase1 B`` / ``  phase2`` / ``  fixup (no flag)``: each
  launch of the dispatch's call replayed alone; ``  phase2 without fold epilogue``: the FP4
  pair's phase 2 on the same workspaces (the fold epilogue's cost is the difference);
  ``  phase2 per-element fold (round 1)``: phase 2 with round 1's epilogue (two loads and
  the branch per element) on the same buffers (staged stores only: the bundled ones);
* ``twophase-mx8 1 flagged row`` / ``1 flagged column``: a row of A / of B whose scales span
  254 binades with nonzero data (the fixup recomputes a row / column of C).

Every row is checked on 64 sampled rows against the float64 product (the fp32 bound with the
bf16 wgmma's roundings, bf16 output rounding allowed; ``benchmarks.common.check_rows``); times
replay the recorded launches (``benchmarks.common.time_ms``).

Usage: ``BLOCKSCALE_BUNDLE_DIR=build/gpu python benchmarks/bench_mx8.py [--m 8192,1024,512]``
(kernels from ``make gpu-bundle``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])

from benchmarks.common import (
    bundle_device,
    check_rows,
    random_data,
    random_scales,
    replay,
    time_ms,
    timed_launches,
)

ALPHA = 0.375
PHASES = ("  fold", "  phase1 A", "  phase1 B", "  phase2", "  fixup (no flag)")


def _exact_rows(a: np.ndarray, b: np.ndarray, sfa: np.ndarray, sfb: np.ndarray, k: int,
                rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from blockscale import formats

    def deq(x: np.ndarray, s: np.ndarray) -> np.ndarray:
        v = formats.decode_e4m3(x.view(np.uint8)).astype(np.float64)
        return v * np.repeat(formats.decode_e8m0(s.view(np.uint8)).astype(np.float64), 32,
                             axis=1)[:, :k]

    ad, bd = deq(a[rows], sfa[rows]), deq(b, sfb)
    return ALPHA * (ad @ bd.T), ALPHA * (np.abs(ad) @ np.abs(bd).T)


def bench(dev: Any, m_values: Sequence[int], n: int = 5760, k: int = 2944,
          log: Any = print) -> list[tuple[str, str, float | None, str]]:
    import blockscale.ops._matmul_host as H
    from blockscale.formats import MXFP8
    from blockscale.layouts import interleave
    from blockscale.ops import matmul as M
    from blockscale.ops import matmul_twophase as TP
    from blockscale.ops import matmul_twophase_mx8 as MX

    rng = np.random.default_rng(1)
    b = random_data(rng, MXFP8, (n, k))
    sfb2 = random_scales(rng, MXFP8, (n, k // 32))
    rounds = 2 * (k // 32) + 31 + 1  # the wgmma's k16 roundings, alpha (test_matmul_twophase)
    out = []
    for m in m_values:
        a = random_data(rng, MXFP8, (m, k))
        sfa2 = random_scales(rng, MXFP8, (m, k // 32))
        rows = np.unique(np.concatenate([np.arange(32), rng.integers(0, m, 32)]))
        case = f"mxfp8 {m}x{n}x{k}"

        def operands(sa2: np.ndarray, sb2: np.ndarray, a_=a, b_=b):
            return (dev.to_device(a_), dev.to_device(b_), dev.to_device(interleave(sa2)),
                    dev.to_device(interleave(sb2)))

        ops = operands(sfa2, sfb2)
        exact, abs_sum = _exact_rows(a, b, sfa2, sfb2, k, rows)
        flag_a, flag_b = sfa2.view(np.uint8).copy(), sfb2.view(np.uint8).copy()
        flag_a[7, :2], flag_b[5, :2] = (254, 0), (254, 0)
        flag_a, flag_b = flag_a.view(sfa2.dtype), flag_b.view(sfb2.dtype)

        def dispatch(on: bool, o=ops) -> Any:
            os.environ[MX.ENV_SWITCH] = "1" if on else "0"
            try:
                return M.block_scaled_matmul(*o, MXFP8, alpha=ALPHA, device=dev)
            finally:
                os.environ.pop(MX.ENV_SWITCH, None)

        impls: list[tuple[str, Callable[[], Any], bool]] = [
            ("mma.sync (dispatch)", lambda: dispatch(False), True),
            ("twophase-mx8 (dispatch)", lambda: dispatch(True), True)]
        for store, bn in (("staged", 256), ("staged", 240), ("direct", 256)):
            if bn in TP.BNS:
                impls.append((f"twophase-mx8 {store} bn{bn}", lambda s=store, w=bn, o=ops:
                              MX.block_scaled_matmul_twophase_mx8(
                                  *o, alpha=ALPHA, store=s, bn=w, device=dev), True))
        for label, sa2, sb2 in (("row", flag_a, sfb2), ("column", sfa2, flag_b)):
            impls.append((f"twophase-mx8 1 flagged {label}", lambda sa2=sa2, sb2=sb2:
                          MX.block_scaled_matmul_twophase_mx8(*operands(sa2, sb2), alpha=ALPHA,
                                                              store="staged", device=dev),
                          False))
        for label, call, check in impls:
            phases = []
            try:
                got, ms, launches = timed_launches(dev, call)
                if label == "twophase-mx8 (dispatch)" and len(launches) == len(PHASES):
                    phases = [(p, time_ms(lambda i, ln=ln: replay(dev, [ln]), device=dev).ms)
                              for p, ln in zip(PHASES, launches, strict=True)]
                    p2 = MX.dispatch_specs(m, n, device=dev)[3]
                    wa, wb = launches[1].args[3], launches[2].args[3]  # the workspaces
                    phases.append((f"  phase2 without fold epilogue (bn{p2.bn})", time_ms(
                        lambda i, wa=wa, wb=wb, p2=p2, m=m: TP.matmul_workspaces(
                            wa, wb, "nvfp4", m, n, k, alpha=ALPHA, store=p2.store, bn=p2.bn,
                            device=dev), device=dev).ms))
                    if p2.store == "staged":  # round 1's phase 2 on the same buffers
                        r1 = MX.phase2_spec(p2.out_dtype, None, "sm_90a", hoist=False,
                                            store=p2.store, bn=p2.bn)
                        bufs = {"wa": wa, "wb": wb, MX.FOLD_A: launches[0].args[4],
                                MX.FOLD_B: launches[0].args[5]}
                        phases.append(("  phase2 per-element fold (round 1)", time_ms(
                            lambda i, r1=r1, bufs=bufs, m=m: H.launch(
                                r1, TP.grid(m, n, r1.bm, bn=r1.bn), (m, n), r1.out_dtype,
                                bufs, {"m": m, "n": n, "k": k,
                                       "alpha": MX.split_alpha(ALPHA)[0]}, dev),
                            device=dev).ms))
                host = np.asarray(dev.to_host(got)).astype(np.float64)
                text = check_rows(host[rows], exact, abs_sum, rounds)[1] if check else \
                    "(fixup timing; row check skipped)"
            except Exception as e:  # noqa: BLE001 - missing kernel, launch failure
                ms, text = None, f"error: {type(e).__name__}: {str(e)[:100]}"
            rate = f"{2.0 * m * n * k / ms / 1e9:7.1f} TFLOP/s" if ms else ""
            log(f"  {case:24} {label:32} {f'{ms:8.3f} ms' if ms else '       -   '} {rate} "
                f"{text}")
            out.append((case, label, ms, text))
            for p, pms in phases:
                log(f"  {case:24} {p:32} {pms:8.3f} ms")
                out.append((case, p, pms, ""))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", default="8192,1024,512")
    parser.add_argument("--n", type=int, default=5760)
    parser.add_argument("--k", type=int, default=2944)
    args = parser.parse_args(argv)
    dev = bundle_device()
    bench(dev, [int(x) for x in args.m.split(",")], args.n, args.k)
    return 0


if __name__ == "__main__":
    sys.exit(main())

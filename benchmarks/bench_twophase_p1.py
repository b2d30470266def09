"""The two-phase matmul's phase 1 on the H200: two launches (``matmul_twophase.dequantize_operands``)
against one (``matmul_twophase_p1.dequantize_both``, issue #9), alone and in the pair, at
8192 x 5760 x 2944 (bn 240, staged phase 2, PDL off / on), with cuBLAS bf16 beside them.

Rows (GPU time of the recorded launches replayed: ``benchmarks.common.time_ms``):

* ``phase1 2 launches``: the two-launch phase 1 (A, then B);
* ``phase1 1 launch p{1,2,4}[-rows]``: the one-launch phase 1 at 1 / 2 / 4 pieces a thread
  (tile-rows reversed, or in row order), with its bytes against the two-launch workspaces
  ("same bytes") and its rate (packed operands + scales in, workspaces out);
* ``pair 2-launch p1 [pdl]``: ``matmul_twophase.block_scaled_matmul_twophase`` (staged,
  bn 240); ``pair 1-launch p1 p{n} [pdl]``: ``matmul_twophase_p1.pair``, checked byte for
  byte against the former;
* ``cuBLAS bf16``: ``torch.matmul`` of bf16 ``[M, K] x [K, N]`` (needs torch).

Usage: ``BLOCKSCALE_BUNDLE_DIR=build/gpu python benchmarks/bench_twophase_p1.py [--fmt nvfp4]
[--shape 8192,5760,2944]`` (kernels from ``make gpu-bundle``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])

from benchmarks.common import (
    bundle_device,
    random_data,
    random_scales,
    time_ms,
    timed_launches,
)

ALPHA, BN = 0.375, 240


def _same(x: Any, y: Any, dev: Any) -> str:
    gx, gy = (np.asarray(dev.to_host(v)).view(np.uint8) for v in (x, y))
    return "same bytes" if np.array_equal(gx, gy) else "DIFFERENT BYTES"


def _cublas_ms(m: int, n: int, k: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    return time_ms(lambda i: a @ b.T).ms


def bench(dev: Any, fmt_name: str, m: int, n: int, k: int,
          log: Any = print) -> list[tuple[str, float | None, str]]:
    from blockscale.formats import Format
    from blockscale.layouts import interleave
    from blockscale.ops import matmul_twophase as TP
    from blockscale.ops import matmul_twophase_p1 as P1

    fmt = Format.from_name(fmt_name)
    rng = np.random.default_rng(1)
    host = (random_data(rng, fmt, (m, k // 2)), random_data(rng, fmt, (n, k // 2)),
            interleave(random_scales(rng, fmt, (m, fmt.kblocks(k)))),
            interleave(random_scales(rng, fmt, (n, fmt.kblocks(k)))))
    ops = tuple(dev.to_device(np.ascontiguousarray(v)) for v in host)
    moved = sum(v.nbytes for v in host) + TP.workspace_bytes(m, n, k, bn=BN)
    out: list[tuple[str, float | None, str]] = []

    def row(label: str, ms: float | None, text: str = "", rate: bool = False) -> None:
        extra = f"{moved / ms / 1e9:7.2f} TB/s" if rate and ms else ""
        log(f"  {fmt.name} {m}x{n}x{k} {label:34} "
            f"{f'{ms:8.4f} ms' if ms else '      -    '} {extra:12} {text}")
        out.append((label, ms, text))

    old_ws, ms, _ = timed_launches(
        dev, lambda: TP.dequantize_operands(*ops, fmt, k=k, bn=BN, device=dev))
    row("phase1 2 launches", ms, "", True)
    for p in P1.PIECES:
        for order in ("reversed", "rows") if p == P1.DEFAULT_PIECES else ("reversed",):
            try:
                ws, ms, _ = timed_launches(dev, lambda p=p, o=order: P1.dequantize_both(
                    *ops, fmt, k=k, bn=BN, device=dev, pieces=p, order=o))
                text = " / ".join(_same(x, y, dev) for x, y in zip(ws, old_ws, strict=True))
            except Exception as e:  # noqa: BLE001 - a missing kernel, a launch failure
                ms, text = None, f"error: {type(e).__name__}: {str(e)[:100]}"
            row(f"phase1 1 launch p{p}{'-rows' if order == 'rows' else ''}", ms, text, True)
    del old_ws
    for pdl in (False, True):
        tag = " pdl" if pdl else ""
        want, ms, _ = timed_launches(dev, lambda pdl=pdl: TP.block_scaled_matmul_twophase(
            *ops, fmt, alpha=ALPHA, store="staged", bn=BN, pdl=pdl, device=dev))
        row(f"pair 2-launch p1{tag}", ms)
        for p in P1.PIECES:
            try:
                got, ms, _ = timed_launches(dev, lambda p=p, pdl=pdl: P1.pair(
                    *ops, fmt, k=k, alpha=ALPHA, bn=BN, pdl=pdl, pieces=p, device=dev))
                text = _same(got, want, dev)
            except Exception as e:  # noqa: BLE001
                ms, text = None, f"error: {type(e).__name__}: {str(e)[:100]}"
            row(f"pair 1-launch p1 p{p}{tag}", ms, text)
    ms = _cublas_ms(m, n, k)
    row("cuBLAS bf16 (torch.matmul)", ms, "" if ms else "torch with CUDA unavailable")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fmt", default="nvfp4", choices=("nvfp4", "mxfp4"))
    parser.add_argument("--shape", default="8192,5760,2944")
    args = parser.parse_args(argv)
    m, n, k = (int(x) for x in args.shape.split(","))
    dev = bundle_device()
    bench(dev, args.fmt, m, n, k)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Launch every GPU kernel once at tail shapes, for compute-sanitizer (tools/sanitize.sh).

Shapes: M = 1, 129 (a partial 128-row tile); K = 8, 30, 136, 184 (and +1 for MXFP8: K % 8 != 0
and partial blocks); grouped counts with empty groups, unused (-1) experts and a gather;
interleave with R = 1, 129 and J = 1, 5, 17; the naive matmul at M, N = 1, 129. Every output
is checked against the reference (byte for byte, matmul within its bound), so a kernel that
reads uninitialised or out-of-bounds memory also shows up as a wrong answer.
The tiled matmul kernels, the fused SwiGLU op and the TMA quantize kernel:
benchmarks/sanitize_matmuls.py. Kernels come from the bundle (BLOCKSCALE_BUNDLE_DIR); the specs are those of
``benchmarks.fuzz_gpu.fuzz_specs``. Exit status 1 on any wrong result.

    BLOCKSCALE_BUNDLE_DIR=build/gpu PYTHONPATH=. python benchmarks/sanitize_driver.py [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.fuzz_gpu import FMT_ROUNDINGS, _bytes_equal, values
from blockscale import reference as ref

M_TAIL = (1, 129)
K_TAIL = (8, 30, 136, 184)


def run(device: str) -> int:
    from blockscale.ops import interleave as IL
    from blockscale.ops import matmul as MM
    from blockscale.ops import quantize as Q
    from blockscale.ops import quantize_grouped as QG
    from blockscale.ops import quantize_silu as QS

    rng = np.random.default_rng(1234)
    bad: list[str] = []
    launches = 0

    def check(name: str, got, want) -> None:
        nonlocal launches
        launches += 1
        for g, w in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,)):
            ok, why = _bytes_equal(g, w)
            if not ok:
                bad.append(f"{name}: {why}")

    for fmt, roundings in FMT_ROUNDINGS.items():
        for m in M_TAIL:
            for k in K_TAIL + ((9, 33) if fmt == "mxfp8" else (64, 128)):
                x = values(rng, (m, k))
                for r in roundings:
                    for layout in ("tcgen5d", "row_major"):
                        kw = {"scale_rounding": r, "scale_layout": layout}
                        check(f"quantize {fmt}/{r}/{layout} M={m} K={k}",
                              Q.quantize_dynamic_block_scaled(x, fmt, device=device, **kw),
                              ref.quantize_dynamic_block_scaled(x, fmt, **kw))
    groups = [  # (expert_start, scales_offsets, expert_ids): empty groups, -1, 129-row groups
        ([0, 0, 1, 1], [0, 0, 0], [3, 0, -1]),
        ([0, 129, 129, 130], [0, 1, 1], [1, -1, 0]),
        ([0, 1, 130, 130, 259], [0, 1, 2, 2], [0, 2, -1, 1]),
    ]
    for fmt in FMT_ROUNDINGS:
        for es, offs, ids in groups:
            es, offs, ids = (np.array(v, np.int32) for v in (es, offs, ids))
            t = int(es[-1])
            tsf = np.array([0.5, 2.0, 4.0, 1.0], np.float32) if fmt == "nvfp4" else None
            for k in K_TAIL:
                x = values(rng, (t, k))
                check(f"grouped {fmt} T={t} K={k}",
                      QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf,
                                                         device=device),
                      ref.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf))
                idx = rng.integers(0, 2 * max(1, t // 2), t).astype(np.int32)
                xs = values(rng, (max(1, t // 2), k))
                check(f"grouped gather {fmt} T={t} K={k}",
                      QG.grouped_quantize_dynamic_scaled(xs, fmt, es, offs, ids, tsf,
                                                         indices=idx, indices_divisor=2,
                                                         device=device),
                      ref.grouped_quantize_dynamic_scaled(xs, fmt, es, offs, ids, tsf,
                                                          indices=idx, indices_divisor=2))
                for act in ("silu", "swiglu_oai"):
                    gu = values(rng, (t, 2 * k))
                    check(f"silu {fmt} {act} T={t} D={k}",
                          QS.fused_silu_quantize(gu, fmt, es, offs, ids, tsf, activation=act,
                                                 device=device),
                          ref.fused_silu_quantize(gu, fmt, es, offs, ids, tsf, activation=act))
    for dt in ("uint8", "float8_e4m3fn", "float8_e8m0fnu"):
        for r in M_TAIL:
            for j in (1, 5, 17):
                s = rng.integers(0, 256, (r, j)).astype(np.uint8).view(
                    np.dtype(getattr(ml_dtypes, dt, np.uint8)))
                check(f"interleave {dt} R={r} J={j}",
                      IL.block_scales_interleave(s, device=device),
                      ref.block_scales_interleave(s))
    for fmt in FMT_ROUNDINGS:
        for m in M_TAIL:
            for n in M_TAIL:
                for k in K_TAIL:
                    a, sfa = ref.quantize_dynamic_block_scaled(values(rng, (m, k), finite=True),
                                                               fmt)
                    b, sfb = ref.quantize_dynamic_block_scaled(values(rng, (n, k), finite=True),
                                                               fmt)
                    got = np.asarray(MM.naive_block_scaled_matmul(
                        a, b, sfa, sfb, fmt, k=k, out_dtype="float32", device=device))
                    want = ref.naive_block_scaled_matmul(a, b, sfa, sfb, fmt, k=k,
                                                         out_dtype="float32")
                    av = ref.dequantize_block_scaled(a, sfa, fmt, k=k).astype(np.float64)
                    bv = ref.dequantize_block_scaled(b, sfb, fmt, k=k).astype(np.float64)
                    bound = k * 2.0 ** -24 * (np.abs(av) @ np.abs(bv).T) + \
                        2.0 ** -23 * np.abs(want.astype(np.float64))
                    launches += 1
                    if not np.all(np.abs(got - want.astype(np.float64)) <= bound + 1e-37):
                        bad.append(f"naive matmul {fmt} M={m} N={n} K={k}: outside the bound")
    from benchmarks import sanitize_matmuls

    launches += sanitize_matmuls.run(device, check, bad)
    for line in bad[:20]:
        print("WRONG", line)
    print(f"sanitize_driver: {launches} launches, {len(bad)} wrong results")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    ns = p.parse_args(argv)
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    return run(ns.device)


if __name__ == "__main__":
    sys.exit(main())

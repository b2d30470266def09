"""Localize wrong results of the TMA-fed wgmma matmul (``pipeline`` "tma" / "ws", issue #9).

On the GPU, from the bundle (``make gpu-bundle`` here, carry build/gpu)::

    source tools/gpu_env.sh && python3 benchmarks/debug_wgmma_tma.py

(``--device interp --quick`` checks the script itself on the CPU interpreter.) For each
variant (the register-fed ``early`` kernel is the control) and small case it prints one
line per probe:

* ``random``: random operands against the exact float64 product with the fp32 bound of the
  tests; the wrong rows / columns, and whether the wrong values are zero, non-finite or
  garbage (> 1e6 x the largest exact value);
* ``onehot``: A row i is 1.0 at one column k_i (scales 1), so C[i, :] = B[:, k_i]; for the
  wrong rows it names the column of B that C[i, :] matches (a permuted or misplaced A row)
  or "none" (garbage);
* ``step s``: random operands with A zero outside K-step s (64 elements): which K-steps
  (ring slot s % 4, lap s / 4) go wrong.

Exit status 1 when any TMA-fed probe is wrong. Takes < 60 s on an H200.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from test_matmul_common import (
    dequantize_exact,
    f32_error_bound,
    random_dense_case,
)

from blockscale import formats, layouts
from blockscale.formats import Format
from blockscale.ops import matmul_wgmma

ALPHA = 0.375
#: (fmt, dequant, pipeline, tiles); "early" is the register-fed control
VARIANTS = [("nvfp4", "shift", "early", (128, 128)), ("nvfp4", "shift", "tma", (128, 128)),
            ("nvfp4", "lut", "tma", (128, 256)), ("nvfp4", "shift", "ws", (128, 128)),
            ("mxfp4", "lut", "tma", (128, 128))]
#: (M, N, K)
CASES = [(128, 128, 64), (128, 256, 128), (128, 128, 512), (1, 256, 2944), (130, 200, 352)]
QUICK_CASES = [(128, 128, 64), (70, 130, 320)]


def _run(a, b, sa5, sb5, fmt, dequant, pipeline, tiles, device):
    return np.asarray(matmul_wgmma.block_scaled_matmul_wgmma(
        a, b, sa5, sb5, fmt, alpha=ALPHA, out_dtype="float32", tiles=tiles, dequant=dequant,
        kstep=64, scaling="fold", pipeline=pipeline, device=device), np.float64)


def _ranges(idx: np.ndarray, limit: int = 6) -> str:
    """Sorted indices as 'a-b,c,...' (at most ``limit`` runs)."""
    if idx.size == 0:
        return "-"
    runs, start, prev = [], int(idx[0]), int(idx[0])
    for x in map(int, idx[1:]):
        if x != prev + 1:
            runs.append((start, prev))
            start = x
        prev = x
    runs.append((start, prev))
    s = ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:limit])
    return s + (f",..({len(runs)} runs)" if len(runs) > limit else "")


def _diagnose(got: np.ndarray, exact: np.ndarray, bound: np.ndarray) -> tuple[bool, str]:
    bad = ~(np.abs(got - exact) <= bound * (1 + 1e-5) + 1e-30)
    if not bad.any():
        return True, "ok"
    big = max(float(np.abs(exact).max()), 1.0)
    vals = got[bad]
    kinds = (f"zero {int((vals == 0).sum())}, nonfinite {int((~np.isfinite(vals)).sum())}, "
             f"huge {int((np.abs(vals[np.isfinite(vals)]) > 1e6 * big).sum())}")
    rows, cols = np.flatnonzero(bad.any(1)), np.flatnonzero(bad.any(0))
    return False, (f"WRONG {int(bad.sum())}/{bad.size} ({kinds}); rows {_ranges(rows)}; "
                   f"cols {_ranges(cols)}")


def _bound(a_deq: np.ndarray, b_deq: np.ndarray, fmt: Format, k: int) -> np.ndarray:
    extra = fmt.kblocks(k) if fmt.is_mx else 0
    return f32_error_bound(np.abs(a_deq) @ np.abs(b_deq).T * ALPHA, fmt, k, n_mul=1 + extra)


def _unit_scales(fmt: Format, rows: int, k: int) -> np.ndarray:
    j = fmt.kblocks(k)
    one = 127 if fmt.is_mx else int(formats.encode_e4m3(1.0))
    return np.full((rows, j), one, np.uint8).view(
        ml_dtypes.float8_e8m0fnu if fmt.is_mx else ml_dtypes.float8_e4m3fn)


def probe_random(fmt, m, n, k, v, device, rng, a_mask=None):
    a, b, sfa, sfb, _, _ = random_dense_case(rng, fmt, m, n, k)
    if a_mask is not None:
        a = a.copy()
        a[:, ~a_mask] = 0
    a_deq, b_deq = dequantize_exact(a, sfa, fmt, k), dequantize_exact(b, sfb, fmt, k)
    got = _run(a, b, layouts.interleave(sfa), layouts.interleave(sfb), fmt, *v[1:], device)
    return _diagnose(got, a_deq @ b_deq.T * ALPHA, _bound(a_deq, b_deq, fmt, k))


def probe_onehot(fmt, m, n, k, v, device, rng):
    cols = (np.arange(m) * 37 + 5) % k
    codes = np.zeros((m, k), np.uint8)
    codes[np.arange(m), cols] = int(formats.encode_e2m1(1.0))
    a = formats.pack_fp4(codes)
    sfa = _unit_scales(fmt, m, k)
    _, b, _, sfb, _, _ = random_dense_case(rng, fmt, 1, n, k)
    a_deq, b_deq = dequantize_exact(a, sfa, fmt, k), dequantize_exact(b, sfb, fmt, k)
    got = _run(a, b, layouts.interleave(sfa), layouts.interleave(sfb), fmt, *v[1:], device)
    ok, msg = _diagnose(got, a_deq @ b_deq.T * ALPHA, _bound(a_deq, b_deq, fmt, k))
    if not ok:
        bt = b_deq.T * ALPHA  # [k, n]
        seen = []
        for i in np.flatnonzero(~np.all(np.abs(got - a_deq @ b_deq.T * ALPHA) <= 1e-3, 1))[:4]:
            d = np.abs(bt - got[i]).max(1)
            j = int(np.argmin(d))
            seen.append(f"row {i}: k {cols[i]} -> " + (f"k {j}" if d[j] < 1e-3 else
                                                      ("zero" if not got[i].any() else "none")))
        msg += "; " + "; ".join(seen)
    return ok, msg


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=os.environ.get("BLOCKSCALE_DEVICE", "cuda"))
    p.add_argument("--quick", action="store_true", help="two small cases, no step probes")
    args = p.parse_args()
    t0 = time.time()
    failed = 0
    for v in VARIANTS:
        fmt = Format.from_name(v[0])
        for m, n, k in (QUICK_CASES if args.quick else CASES):
            rng = np.random.default_rng(m * 7 + n + k)
            tag = f"{v[0]}-{v[1]}-{v[2]}-{v[3][0]}x{v[3][1]} {m}x{n}x{k}"
            probes = [("random", probe_random, None), ("onehot", probe_onehot, None)]
            if 512 <= k <= 1024 and not args.quick:
                probes += [(f"step {s} (slot {s % 4}, lap {s // 4})", probe_random,
                            (np.arange(k // 2) // 32) == s) for s in range(-(-k // 64))]
            for name, fn, mask in probes:
                try:
                    extra = () if mask is None else (mask,)
                    ok, msg = fn(fmt, m, n, k, v, args.device, rng, *extra)
                except Exception as e:  # noqa: BLE001 (a launch error is a finding too)
                    ok, msg = False, f"ERROR {type(e).__name__}: {str(e)[:200]}"
                failed += (not ok) and v[2] != "early"
                print(f"{tag:44s} {name:22s} {msg}", flush=True)
    print(f"{failed} TMA-fed probes wrong; {time.time() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

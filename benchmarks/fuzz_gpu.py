"""GPU fuzzing: the compiled kernels on CUDA == the numpy reference on random cases.

Usage (on the H200; kernels from the bundle, BLOCKSCALE_BUNDLE_DIR or build/gpu)::

    BLOCKSCALE_BUNDLE_DIR=build/gpu PYTHONPATH=. python benchmarks/fuzz_gpu.py [--cases 1000]
        [--seed 0] [--ops quantize_nvfp4,naive_matmul] [--device cuda]

Per op, ``--cases`` random cases (default 1000): shapes from a fixed menu of tail sizes
(M = 1 .. 513, K around every alignment and block boundary), values with rounding ties,
NaN / Inf, -0, bf16 subnormals and saturating magnitudes, random tensor scales, E8M0
roundings, group layouts with empty groups and unused (-1) experts, gathers. Ops:

* ``quantize_nvfp4`` / ``quantize_mxfp4`` / ``quantize_mxfp8`` (all E8M0 roundings, both scale
  layouts; the NVFP4 dispatcher's K % 64 path included), compared byte for byte;
* ``interleave`` (three scale dtypes), byte for byte;
* ``grouped_quantize`` (three formats, with and without ``indices``), byte for byte;
* ``fused_silu_quantize`` (SiLU and SwiGLU-OAI; NVFP4, MXFP4, MXFP8), byte for byte (the
  sigmoid's exp is ``exp_f32`` in kernel and reference; any difference is a mismatch);
* ``naive_matmul`` (three formats, bf16 / f32 out, random alpha) within the stated bound
  ``K * 2^-24 * alpha * sum|a*b|`` (any fp32 summation order) plus one output rounding;
* ``dense_matmul`` / ``grouped_matmul`` / ``grouped_swiglu``: the tiled matmul ops through
  their dispatch (decode, wgmma, mma.sync, portable kernels), checked with the stated bounds
  of tests/test_matmul_common.py; the fused SwiGLU op byte-equal to the chained compiled path
  (benchmarks/fuzz_matmuls.py has the details; benchmarks/fuzz_bundle_coverage.py checks that
  a bundle holds every kernel their case streams launch).

Prints a summary table (cases, exact / within bound, mismatches, worst case) and exits 1 on
any mismatch. Kernels are shape-generic (shapes are scalars), so every case runs one of the
specs of :func:`fuzz_specs`; the bundle must contain them (``make gpu-bundle`` collects them
when the bundle tool includes ``benchmarks.fuzz_gpu.fuzz_specs``). ``--device interp`` runs
the same cases in the numpy interpreter (slow; a smoke test of this script on a CPU).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from blockscale import reference as ref

BF16 = ml_dtypes.bfloat16
FMT_ROUNDINGS = {"nvfp4": (None,), "mxfp4": ("up", "even", "floor"),
                 "mxfp8": ("up", "even", "floor")}
M_MENU = (1, 2, 3, 7, 31, 32, 33, 127, 128, 129, 200, 255, 256, 257, 300, 513)
K_MENU = (2, 6, 8, 14, 16, 24, 30, 32, 34, 46, 62, 64, 66, 96, 128, 136, 160, 184, 192, 250,
          256, 320, 512, 520, 1000, 1024, 2048)
SPECIALS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -6.0, 448.0, 464.0, -480.0,
                     -0.0, 0.0, 1e-39, -9.2e-41, 2.0 ** -126, 3.0e38, -3.3e38, 0.5, 1.0],
                    np.float32)


# ----------------------------------------------------------------------------- specs


def fuzz_specs(target: str = "sm_90a") -> list[Any]:
    """Every kernel spec this fuzzer (and benchmarks/sanitize_driver.py) launches on
    ``target``: the bundle tool adds these to the bundle."""
    from blockscale.activations import GatedActivation
    from blockscale.formats import Format
    from blockscale.ops import interleave as IL
    from blockscale.ops import quantize_grouped as QG
    from blockscale.ops.matmul import MatmulSpec
    from blockscale.ops.quantize import QuantizeSpec
    from blockscale.ops.quantize_silu import _spec as silu_spec

    specs: list[Any] = []
    for fmt, roundings in FMT_ROUNDINGS.items():
        for r in roundings:
            for aligned in (True, False):
                for layout in ("tcgen5d", "row_major"):
                    specs.append(QuantizeSpec(fmt, target, r, layout, aligned))
    from blockscale.ops import quantize as Q

    specs += Q.bundle_specs(target)  # the dispatcher's NVFP4 K % 64 path (TMA kernel) etc.
    specs += QG.bundle_specs(target)
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        for act in (GatedActivation.SILU, GatedActivation.SWIGLU_OAI):
            for aligned in (True, False):
                specs.append(silu_spec(Format.from_name(fmt), target, act, aligned))
    specs += IL.bundle_specs(target)
    specs += [MatmulSpec(f, o, "tcgen5d", None, target) for f in FMT_ROUNDINGS
              for o in ("bfloat16", "float32")]
    from benchmarks import fuzz_matmuls

    specs += fuzz_matmuls.specs(target)  # recorded from the tiled matmul ops' case streams
    unique: dict[Any, None] = {}
    for s in specs:
        unique.setdefault(s, None)
    return list(unique)


# ----------------------------------------------------------------------------- inputs


def values(rng: np.random.Generator, shape: tuple[int, int], *, finite: bool = False
           ) -> np.ndarray:
    """bf16 values: normal data at a random magnitude, plus (unless ``finite``) rounding
    ties, signed zeros, subnormals, huge values, NaN and Inf, and sometimes all-zero rows."""
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(2.0 ** rng.integers(-20, 12))
    if not finite:
        n = x.size
        for share, pool in ((rng.choice([0.0, 0.05, 0.3]), None),
                            (rng.choice([0.0, 0.0, 0.01]), "nonfinite")):
            pick = np.flatnonzero(rng.random(n) < share)
            if pool is None:
                x.flat[pick] = rng.choice(SPECIALS, pick.size) * \
                    np.float32(2.0 ** rng.integers(-3, 4))
            else:
                x.flat[pick] = rng.choice(np.array([np.nan, np.inf, -np.inf], np.float32),
                                          pick.size)
        if shape[0] > 1 and rng.random() < 0.3:
            x[rng.integers(shape[0])] = 0.0
    with np.errstate(over="ignore"):
        return x.astype(BF16)


def group_layout(rng: np.random.Generator, t: int) -> tuple[np.ndarray, ...]:
    """(expert_start, scales_offsets, expert_ids): random cuts with empty groups, tile0 =
    sum of earlier groups' tiles (as moe_create_indices), some unused (-1) experts."""
    g = int(rng.integers(1, 9))
    cuts = np.sort(rng.integers(0, t + 1, g - 1))
    es = np.concatenate([[0], cuts, [t]]).astype(np.int32)
    tiles = -(-np.diff(es) // 128)
    tile0 = np.concatenate([[0], np.cumsum(tiles)[:-1]])
    offs = (tile0 - es[:-1] // 128).astype(np.int32)
    empty = np.diff(es) == 0  # an empty group's placement means nothing: any offset is valid
    offs[empty] = rng.integers(-2, 3, int(empty.sum()))
    ids = rng.permutation(g + 3)[:g].astype(np.int32)
    ids[rng.random(g) < 0.2] = -1
    return es, offs, ids


def _k(rng: np.random.Generator, even: bool) -> int:
    k = int(rng.choice(K_MENU))
    return k if even or rng.random() < 0.5 else k + 1


def _bytes_equal(got: Any, want: np.ndarray) -> tuple[bool, str]:
    g = np.asarray(got).view(np.uint8)
    w = np.asarray(want).view(np.uint8)
    if g.shape != w.shape:
        return False, f"shape {g.shape} != {w.shape}"
    bad = np.argwhere(g != w)
    if bad.size:
        i = tuple(bad[0])
        return False, f"{len(bad)} bytes differ, first at {i}: {g[i]:#04x} vs {w[i]:#04x}"
    return True, ""


# ----------------------------------------------------------------------------- cases
# Each case function returns (ok, detail, error measure).

def case_quantize(fmt: str) -> Callable[..., tuple[bool, str, float]]:
    def run(rng: np.random.Generator, device: str) -> tuple[bool, str, float]:
        from blockscale.ops import quantize as Q

        m, k = int(rng.choice(M_MENU)), _k(rng, fmt != "mxfp8")
        x = values(rng, (m, k))
        kw: dict[str, Any] = {"scale_layout": str(rng.choice(["tcgen5d", "tcgen5d",
                                                              "row_major"]))}
        if fmt == "nvfp4":
            kw["tensor_sf"] = float(rng.choice([1.0, 0.43, 3.0, 1e-3, 768.0]))
        else:
            kw["scale_rounding"] = str(rng.choice(FMT_ROUNDINGS[fmt]))
        d, s = Q.quantize_dynamic_block_scaled(x, fmt, device=device, **kw)
        rd, rs = ref.quantize_dynamic_block_scaled(x, fmt, **kw)
        ok1, why1 = _bytes_equal(d, rd)
        ok2, why2 = _bytes_equal(s, rs)
        return ok1 and ok2, f"M={m} K={k} {kw}: data {why1} scales {why2}", 0.0
    return run


def case_interleave(rng: np.random.Generator, device: str) -> tuple[bool, str, float]:
    from blockscale.ops import interleave as IL

    r, j = int(rng.choice(M_MENU)), int(rng.integers(1, 70))
    dt = np.dtype(getattr(ml_dtypes, str(rng.choice(["uint8", "float8_e4m3fn",
                                                     "float8_e8m0fnu"])), np.uint8))
    s = rng.integers(0, 256, (r, j)).astype(np.uint8).view(dt)
    ok, why = _bytes_equal(IL.block_scales_interleave(s, device=device),
                           ref.block_scales_interleave(s))
    return ok, f"R={r} J={j} {dt}: {why}", 0.0


def case_grouped(rng: np.random.Generator, device: str) -> tuple[bool, str, float]:
    from blockscale.ops import quantize_grouped as QG

    fmt = str(rng.choice(list(FMT_ROUNDINGS)))
    t, k = int(rng.choice((0,) + M_MENU)), _k(rng, True)
    es, offs, ids = group_layout(rng, t)
    tsf = rng.uniform(0.01, 50, len(ids) + 3).astype(np.float32) if fmt == "nvfp4" else None
    kw: dict[str, Any] = {}
    rows_in = t
    if rng.random() < 0.5:
        rows_in = max(1, t // 2 + 1)
        div = int(rng.integers(1, 3))
        kw = {"indices": rng.integers(0, rows_in * div, t).astype(np.int32),
              "indices_divisor": div}
    x = values(rng, (rows_in, k))
    d, s = QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, device=device, **kw)
    rd, rs = ref.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, **kw)
    ok1, why1 = _bytes_equal(d, rd)
    ok2, why2 = _bytes_equal(s, rs)
    return ok1 and ok2, (f"{fmt} T={t} K={k} groups={es.tolist()} ids={ids.tolist()} "
                         f"gather={bool(kw)}: data {why1} scales {why2}"), 0.0


def case_silu(rng: np.random.Generator, device: str) -> tuple[bool, str, float]:
    from blockscale.ops import quantize_silu as QS

    fmt = str(rng.choice(list(FMT_ROUNDINGS)))
    act = str(rng.choice(["silu", "swiglu_oai"]))
    t, d = int(rng.choice(M_MENU)), _k(rng, True)
    es, offs, ids = group_layout(rng, t)
    isc = rng.uniform(0.01, 4, len(ids) + 3).astype(np.float32) if fmt == "nvfp4" else None
    gu = values(rng, (t, 2 * d))
    out = QS.fused_silu_quantize(gu, fmt, es, offs, ids, isc, activation=act, device=device)
    want = ref.fused_silu_quantize(gu, fmt, es, offs, ids, isc, activation=act)
    ok1, why1 = _bytes_equal(out[0], want[0])
    ok2, why2 = _bytes_equal(out[1], want[1])
    return ok1 and ok2, f"{fmt} {act} T={t} D={d}: data {why1} scales {why2}", 0.0


def case_matmul(rng: np.random.Generator, device: str) -> tuple[bool, str, float]:
    from blockscale.ops import matmul as MM

    fmt = str(rng.choice(list(FMT_ROUNDINGS)))
    m, n = int(rng.choice(M_MENU)), int(rng.choice(M_MENU))
    k = _k(rng, fmt != "mxfp8")
    out_dtype = str(rng.choice(["bfloat16", "float32"]))
    alpha = float(rng.choice([1.0, 0.37, 12.0]))
    a, sfa = ref.quantize_dynamic_block_scaled(values(rng, (m, k), finite=True), fmt)
    b, sfb = ref.quantize_dynamic_block_scaled(values(rng, (n, k), finite=True), fmt)
    got = np.asarray(MM.naive_block_scaled_matmul(a, b, sfa, sfb, fmt, k=k, alpha=alpha,
                                                  out_dtype=out_dtype, device=device))
    want = ref.naive_block_scaled_matmul(a, b, sfa, sfb, fmt, k=k, alpha=alpha,
                                         out_dtype="float32").astype(np.float64)
    av = ref.dequantize_block_scaled(a, sfa, fmt, k=k).astype(np.float64)
    bv = ref.dequantize_block_scaled(b, sfb, fmt, k=k).astype(np.float64)
    rel_out = 2.0 ** -7 if out_dtype == "bfloat16" else 2.0 ** -23
    bound = k * 2.0 ** -24 * alpha * (np.abs(av) @ np.abs(bv).T) + rel_out * np.abs(want)
    err = np.abs(got.astype(np.float64) - want)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = float(np.max(np.where(bound > 0, err / bound, np.where(err > 0, np.inf, 0))))
    ok = bool(np.all(err <= bound + 1e-37))
    return ok, f"{fmt} M={m} N={n} K={k} {out_dtype} alpha={alpha}: err/bound {ratio:.3g}", ratio


OPS: dict[str, Callable[..., tuple[bool, str, float]]] = {
    "quantize_nvfp4": case_quantize("nvfp4"),
    "quantize_mxfp4": case_quantize("mxfp4"),
    "quantize_mxfp8": case_quantize("mxfp8"),
    "interleave": case_interleave,
    "grouped_quantize": case_grouped,
    "fused_silu_quantize": case_silu,
    "naive_matmul": case_matmul,
}
#: the tiled matmul ops (benchmarks/fuzz_matmuls.py); their cases take the kernel target
MATMUL_OPS = ("dense_matmul", "grouped_matmul", "grouped_swiglu")


def _add_matmul_ops() -> None:
    from benchmarks import fuzz_matmuls

    OPS.update({name: fuzz_matmuls.OPS[name] for name in MATMUL_OPS})


_add_matmul_ops()


# ----------------------------------------------------------------------------- driver


def check_bundle(target: str) -> list[str]:
    """Specs of :func:`fuzz_specs` that cannot be loaded here (not in the bundle and no
    compiler): empty when the run can proceed."""
    from blockscale.ops import _core

    missing = []
    for spec in fuzz_specs(target):
        try:
            _core.get_kernel(spec)
        except RuntimeError as e:
            missing.append(f"{spec!r}: {str(e).splitlines()[0][:160]}")
    return missing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=1000, help="random cases per op")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ops", default=",".join(OPS), help=f"comma list of {list(OPS)}")
    p.add_argument("--device", default="cuda", help="cuda (default) | hip | interp")
    p.add_argument("--target", default=None, help="kernel target (default: the device's)")
    p.add_argument("--show", type=int, default=3, help="mismatches printed per op")
    ns = p.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", category=RuntimeWarning)  # NaN/Inf inputs are on purpose
    ops = [o.strip() for o in ns.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        p.error(f"--ops: unknown {unknown}; expected some of {list(OPS)}")
    if ns.cases < 1:
        p.error(f"--cases must be >= 1, got {ns.cases}")

    from blockscale import runtime
    from blockscale.ops import _core

    dev = runtime.get_device(ns.device)
    target = _core.resolve_target(ns.target, dev)
    print(f"device: {dev.describe()}  target: {target}  cases/op: {ns.cases}  seed: {ns.seed}")
    missing = check_bundle(target)
    if missing:
        print(f"{len(missing)} kernels are missing (add benchmarks.fuzz_gpu.fuzz_specs to the "
              "bundle):", *missing, sep="\n  ")
        return 2

    rows = []
    failed = False
    for op in ops:
        rng = np.random.default_rng([ns.seed, list(OPS).index(op)])
        ok_n, bad, worst, worst_case, errors = 0, [], 0.0, "", 0
        t0 = time.perf_counter()
        for i in range(ns.cases):
            try:
                ok, detail, measure = (OPS[op](rng, dev, target) if op in MATMUL_OPS
                                       else OPS[op](rng, dev))
            except Exception as e:  # noqa: BLE001 - a crash is a failure of that case, reported
                ok, detail, measure = False, f"case {i}: {type(e).__name__}: {e}", 0.0
                errors += 1
            if ok:
                ok_n += 1
            else:
                bad.append(f"case {i}: {detail}")
            if measure >= worst:
                worst, worst_case = measure, detail
        secs = time.perf_counter() - t0
        failed |= bool(bad)
        rows.append((op, ns.cases, ok_n, len(bad), errors,
                     f"{worst:.3g}" if op in ("naive_matmul", "dense_matmul") else "-", secs))
        for line in bad[:ns.show]:
            print(f"[{op}] MISMATCH {line}")
        if op in ("naive_matmul", "dense_matmul"):
            print(f"[{op}] worst err/bound: {worst_case}")

    head = ("op", "cases", "exact/ok", "mismatch", "crashed", "max err/bound", "seconds")
    print()
    print(f"{head[0]:22s} {head[1]:>6s} {head[2]:>9s} {head[3]:>9s} {head[4]:>8s} "
          f"{head[5]:>14s} {head[6]:>8s}")
    for op, n, ok_n, nbad, nerr, worst_s, secs in rows:
        print(f"{op:22s} {n:6d} {ok_n:9d} {nbad:9d} {nerr:8d} {worst_s:>14s} {secs:8.1f}")
    print(f"\n{'FAIL' if failed else 'PASS'}: {sum(r[2] for r in rows)} of "
          f"{sum(r[1] for r in rows)} cases match the reference")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""One command on the GPU: every benchmark, the performance table, the JSON and the plots.

    BLOCKSCALE_BUNDLE_DIR=build/gpu python3 benchmarks/run.py [--quick] \
        [--only quantize,matmul,moe] [--out DIR] [--budget-s 450] [--no-append]

Order: ceilings (copy bandwidth, cuBLAS bf16 / FP8 GEMM), then the suites named by --only
(default all): quantize (benchmarks/bench_quantize.py), matmul (benchmarks/bench_matmul.py),
moe (benchmarks/bench_moe.py: gate_up grouped GEMM, whole expert computation). Each suite runs
under its share of a wall-clock budget and records what it had to skip. An op whose kernel is
missing from the bundle, that raises, or whose output fails its check is recorded with its
status and no number, and the run goes on. At the end the markdown table is printed, appended
to benchmarks/RESULTS.md, and written with results.json and the PNG plots to --out.

On a machine with the compiler, ``python benchmarks/run.py --bundle build/gpu`` precompiles
every kernel the benchmarks launch (all ops' bundle specs plus the few extra ones of
:func:`extra_specs`) into a bundle directory to copy to the GPU machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.common import (
    Budget,
    Record,
    failed,
    kernel_keys_without_mlir,
    short_error,
    with_rates,
)

SUITES = ("quantize", "matmul", "moe")
#: share of the budget per suite (seconds, scaled to --budget-s / 450)
SHARES = {"ceilings": 25.0, "quantize": 110.0, "matmul": 75.0, "moe": 240.0}
QUICK_SHARES = {"ceilings": 20.0, "quantize": 25.0, "matmul": 20.0, "moe": 50.0}


# ----------------------------------------------------------------------------- quantize adapter


def quantize_suite(dev: Any, budget: Budget, quick: bool, log: Callable[[str], None]
                   ) -> list[Record]:
    """bench_quantize.bench per shape and format, turned into records.

    bench_quantize checks the first and last 256 rows against the reference (SystemExit on a
    mismatch) and prints a note when torch.compile's output differs from ours; both become
    "fail" records here. Bytes moved = bf16 in + data + scales out.
    """
    from benchmarks import bench_quantize as bq

    shapes = [(8192, 8192)] if quick else [(8192, 8192), (16384, 16384)]
    fmts = ["nvfp4"] if quick else ["nvfp4", "nvfp4_tma", "mxfp4", "mxfp8"]
    use_torch = not quick and _torch_ok()
    recs: list[Record] = []
    for m, k in shapes:
        for fmt in fmts:
            case = f"{m}x{k}"
            params = {"m": m, "k": k}
            if budget.exhausted(reserve=5):
                recs.append(failed("quantize", case, "blockscale", fmt, "skipped",
                                   "skipped: time budget", params))
                continue
            buf = io.StringIO()
            try:
                with contextlib.redirect_stdout(buf):
                    out = (bq.bench_tma((m, k), dev) if fmt == "nvfp4_tma"
                           else bq.bench((m, k), fmt, dev, use_torch))
            except SystemExit as e:  # their reference check failed
                recs.append(failed("quantize", case, "blockscale", fmt, "fail",
                                   f"FAIL: {e}", params))
                log(_line(recs[-1]))
                continue
            except Exception as e:  # noqa: BLE001 - missing kernel etc.
                recs.append(failed("quantize", case, "blockscale", fmt, "error",
                                   short_error(e), params))
                log(_line(recs[-1]))
                continue
            finally:
                if buf.getvalue().strip():
                    log(buf.getvalue().rstrip())
            moved = out["GB/s"] * out["ms"] * 1e6
            params = {**params, "bytes": moved}
            note = "cuda events median, 3 rotating inputs (bench_quantize)"
            recs.append(with_rates(Record("quantize", case, "blockscale", fmt, out["ms"], "ok",
                                          "bit-exact vs reference (first/last 256 rows)",
                                          params=params, note=note), nbytes=moved))
            copy_ms = 2 * m * k * 2 / (out["copy GB/s"] * 1e6)
            recs.append(with_rates(Record("quantize", case, "D2D copy of the bf16 input", "bf16",
                                          copy_ms, "ok", "ceiling for this shape",
                                          params={**params, "bytes": 2 * m * k * 2},
                                          note=note), nbytes=2 * m * k * 2))
            if "torch.compile ms" in out:
                if "differs" in buf.getvalue():
                    recs.append(failed("quantize", case, "torch.compile (same semantics)", fmt,
                                       "fail", "FAIL: output differs from blockscale's "
                                       "reference-checked output", params))
                else:
                    recs.append(with_rates(Record(
                        "quantize", case, "torch.compile (same semantics)", fmt,
                        out["torch.compile ms"], "ok", "bytes equal to blockscale's output",
                        params=params, note=note), nbytes=moved))
            for r in recs[-3:]:
                if r.case == case and r.fmt in (fmt, "bf16"):
                    log(_line(r))
    if not quick and not budget.exhausted(reserve=30):
        from benchmarks import bench_quantize_moe

        for r in bench_quantize_moe.bench(dev):  # grouped quantize, fused SiLU-quantize
            recs.append(r)
            log(_line(r))
    return recs


# ----------------------------------------------------------------------------- matmul adapter


def matmul_suite(dev: Any, budget: Budget, quick: bool, log: Callable[[str], None]
                 ) -> list[Record]:
    """bench_matmul.bench per format and M, turned into records (a failed check: no ms)."""
    from benchmarks import bench_matmul as bm
    from blockscale.formats import Format

    n, k = 5760, 2944
    fmts = ["nvfp4"] if quick else ["nvfp4", "mxfp4", "mxfp8"]
    ms_list = [128, 1024] if quick else [1, 16, 128, 1024, 8192]
    recs: list[Record] = []
    for f in fmts:
        fmt = Format.from_name(f)
        for m in ms_list:
            case = f"M={m} N={n} K={k}"
            flops = 2.0 * m * n * k
            params = {"m": m, "n": n, "k": k, "flops": flops,
                      "bytes": _matmul_bytes("blockscale", fmt, m, n, k)}
            if budget.exhausted(reserve=5):
                recs.append(failed("matmul", case, "all", f, "skipped", "skipped: time budget",
                                   params))
                continue
            buf = io.StringIO()
            try:
                with contextlib.redirect_stdout(buf):
                    rows = bm.bench(fmt, m, n, k, iters=20)
            except Exception as e:  # noqa: BLE001 - blockscale failed first: no row at all
                recs.append(failed("matmul", case, "blockscale", f, "error",
                                   short_error(e) + " (baselines of this case not run)",
                                   params))
                log(_line(recs[-1]))
                continue
            for row in rows:
                check = str(row.get("check", ""))
                ms = row.get("ms")
                nbytes = _matmul_bytes(row["impl"], fmt, m, n, k)
                params = {**params, "bytes": nbytes}
                if check.startswith("FAIL"):
                    rec = failed("matmul", case, row["impl"], f, "fail", check, params)
                elif check.startswith("skipped") or ms is None:
                    rec = failed("matmul", case, row["impl"], f, "unavailable", check, params)
                else:
                    rec = Record("matmul", case, row["impl"], f, float(ms), "ok", check,
                                 params=params, note="bench_matmul timing (events, no "
                                 "input rotation; blockscale through its Python op)")
                recs.append(with_rates(rec, nbytes=nbytes, flops=flops))
                log(_line(rec))
            rec = dense_replay(dev, fmt, m, n, k, case, {**params, "bytes": _matmul_bytes(
                "blockscale", fmt, m, n, k)})
            recs.append(with_rates(rec, nbytes=rec.params["bytes"], flops=flops))
            log(_line(rec))
    return recs


def dense_replay(dev: Any, fmt: Any, m: int, n: int, k: int, case: str,
                 params: dict[str, Any]) -> Record:
    """``ops.block_scaled_matmul`` timed like the MoE ops: recorded launches replayed over
    rotating operand sets (GPU time only), each set checked on sampled rows x columns."""
    import numpy as np

    from benchmarks import common as C
    from blockscale import layouts, ops
    from blockscale import reference as ref

    impl = "blockscale (replayed kernels)"
    rng = np.random.default_rng(m + 7)
    per_set = (m + n) * (fmt.data_cols(k) + fmt.kblocks(k))
    caps, text = [], ""
    try:
        for si in range(C.rotation_count(per_set)):
            a = C.random_data(rng, fmt, (m, fmt.data_cols(k)))
            b = C.random_data(rng, fmt, (n, fmt.data_cols(k)))
            sa = C.random_scales(rng, fmt, (m, fmt.kblocks(k)))
            sb = C.random_scales(rng, fmt, (n, fmt.kblocks(k)))
            args = [dev.to_device(x) for x in (a, b, layouts.interleave(sa),
                                               layouts.interleave(sb))]
            with C.record_launches(dev) as launches:
                out, sec = C.first_run_s(
                    lambda args=args: ops.block_scaled_matmul(*args, fmt, k=k, device=dev),
                    dev.synchronize)
            if sec > C.FIRST_RUN_CAP_S:
                return failed("matmul", case, impl, fmt.name, "skipped",
                              f"skipped: first run took {sec:.2f} s (> 1 s cap)", params)
            rows = np.unique(np.array([0, m - 1, *rng.integers(0, m, 2)]))
            cols = np.unique(rng.integers(0, n, 256))
            da = ref.dequantize_block_scaled(a[rows], sa[rows], fmt, k=k,
                                             scale_layout="row_major").astype(np.float64)
            db = ref.dequantize_block_scaled(b[cols], sb[cols], fmt, k=k,
                                             scale_layout="row_major").astype(np.float64)
            n_round = fmt.kblocks(k) - 1 + (0 if fmt.is_fp4 else fmt.block_size - 1) + 1
            ok, t = C.check_rows(dev.to_host(out)[np.ix_(rows, cols)].astype(np.float64),
                                 da @ db.T, np.abs(da) @ np.abs(db).T, n_round)
            if not ok:
                return failed("matmul", case, impl, fmt.name, "fail", f"set {si}: {t}", params)
            text = text or t
            caps.append(launches)
    except Exception as e:  # noqa: BLE001 - missing kernel etc.
        return failed("matmul", case, impl, fmt.name, "error", short_error(e), params)
    tm = C.time_ms(lambda i: C.replay(dev, caps[i % len(caps)]), device=dev)
    names = sorted({ln.kernel.name for c in caps for ln in c})
    return Record("matmul", case, impl, fmt.name, tm.ms, "ok",
                  f"{text} x {len(cols)} cols; {len(caps)} sets checked", params=params,
                  note=f"{tm.method}; {len(caps)} rotating sets; kernels {', '.join(names)}")


def _matmul_bytes(impl: str, fmt: Any, m: int, n: int, k: int) -> float:
    """Bytes an implementation reads and writes once: its own operand types (bf16 / FP8
    baselines re-quantize the operands), bf16 output."""
    if impl.startswith("torch-bf16"):
        return 2.0 * (m + n) * k + 2.0 * m * n
    if impl.startswith("torch-fp8"):
        return 1.0 * (m + n) * k + 4.0 * (m + n) + 2.0 * m * n
    return (m + n) * (fmt.data_cols(k) + fmt.kblocks(k)) + 2.0 * m * n


# ----------------------------------------------------------------------------- moe


def moe_suite(dev: Any, budget: Budget, quick: bool, log: Callable[[str], None],
              copy_tbps: float | None) -> list[Record]:
    from benchmarks import bench_moe

    return bench_moe.run(dev, budget, copy_tbps, quick=quick, log=log)


# ----------------------------------------------------------------------------- helpers


def _torch_ok() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _line(r: Record) -> str:
    ms = f"{r.ms:9.4f} ms" if r.ms else "        - ms"
    rate = f"{r.tbps:6.2f} TB/s" if r.tbps else ""
    rate += f" {r.tflops:7.1f} TFLOP/s" if r.tflops else ""
    return f"  [{r.suite}] {r.case:22} {r.impl:34} {r.fmt:6} {ms} {rate:26} {r.status}: " \
           f"{r.check[:80]}"


def build_bundle(out: str) -> int:
    """Compile every bundle spec of every op module plus EXTRA_SPECS into ``out``."""
    from blockscale.launch import load_kernel, save_kernel
    from blockscale.ops import _core

    specs = list(_core.bundle_specs("sm_90a")) + extra_specs()
    os.makedirs(out, exist_ok=True)
    bad = 0
    for spec in specs:
        key = _core.kernel_key(spec)
        if load_kernel(out, key) is not None:
            continue
        t0 = time.perf_counter()
        try:
            save_kernel(out, key, _core.compile_kernel(spec).binary)
            print(f"compiled {key} ({time.perf_counter() - t0:.1f}s)", flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on
            bad += 1
            print(f"FAILED {key}: {short_error(e, 300)}", flush=True)
    print(f"{len(specs)} specs, {bad} failed, bundle in {out}")
    return 1 if bad else 0


def extra_specs(target: str = "sm_90a") -> list[Any]:
    """Kernels the benchmarks launch that no op module's bundle_specs lists (today: the
    MXFP4 fused SiLU quantize of the whole-MoE benchmark)."""
    from blockscale.activations import GatedActivation
    from blockscale.formats import MXFP4
    from blockscale.ops import quantize_silu

    return [quantize_silu._spec(MXFP4, target, GatedActivation.SILU, True)]


def _device() -> Any:
    from blockscale import runtime

    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.init()  # one primary context shared with blockscale's runtime
    except ImportError:
        pass
    return runtime.get_device("cuda")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a small subset (< 2 min)")
    p.add_argument("--only", default=",".join(SUITES),
                   help=f"comma-separated suites out of {','.join(SUITES)}")
    p.add_argument("--out", default=os.path.join(ROOT, "out", "bench"),
                   help="directory for results.json and the PNGs")
    p.add_argument("--budget-s", type=float, default=450.0,
                   help="wall-clock budget of the whole run in seconds")
    p.add_argument("--results-md", default=os.path.join(ROOT, "benchmarks", "RESULTS.md"))
    p.add_argument("--no-append", action="store_true", help="do not append to RESULTS.md")
    p.add_argument("--bundle", metavar="DIR", default=None,
                   help="precompile the benchmarks' kernels into DIR (needs MLIR) and exit")
    ns = p.parse_args(argv)
    out_dir = os.path.abspath(ns.out)
    results_md = os.path.abspath(ns.results_md)
    os.chdir(ROOT)  # bench_matmul reads tests/ and the default bundle dir build/gpu from here
    if ns.bundle:
        return build_bundle(os.path.abspath(ns.bundle))
    only = [s.strip() for s in ns.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SUITES))
    if unknown:
        p.error(f"--only: unknown suites {unknown}; choose from {list(SUITES)}")

    from benchmarks import ceilings, report

    t_start = time.monotonic()
    total = Budget(ns.budget_s)
    shares = QUICK_SHARES if ns.quick else SHARES
    scale = ns.budget_s / 450.0
    log = lambda s: print(s, flush=True)
    if kernel_keys_without_mlir():
        log("note: MLIR is not importable here; kernel keys computed without importing the "
            "KERNEL_SOURCES modules (workaround, see common.kernel_keys_without_mlir)")
    dev = _device()
    device_name = getattr(dev, "device_name", dev.describe())
    log(f"device: {dev.describe()}; bundle: {os.environ.get('BLOCKSCALE_BUNDLE_DIR', 'build/gpu')}")
    records: list[Record] = []
    notes: list[str] = []

    def suite(name: str, fn: Callable[[Budget], list[Record]]) -> None:
        b = Budget(min(shares[name] * scale, max(0.0, total.left())))
        log(f"== {name} (budget {b.seconds:.0f} s)")
        t0 = time.monotonic()
        try:
            records.extend(fn(b))
        except Exception as e:  # noqa: BLE001 - a suite that breaks does not end the run
            traceback.print_exc()
            records.append(failed(name, "-", "suite", "", "error", short_error(e, 300)))
        log(f"== {name} done in {time.monotonic() - t0:.0f} s")

    suite("ceilings", lambda b: ceilings.measure(dev))
    copy_tbps = ceilings.copy_tbps(records)
    if "quantize" in only:
        suite("quantize", lambda b: quantize_suite(dev, b, ns.quick, log))
    if "matmul" in only:
        suite("matmul", lambda b: matmul_suite(dev, b, ns.quick, log))
    if "moe" in only:
        suite("moe", lambda b: moe_suite(dev, b, ns.quick, log, copy_tbps))

    notes.append(f"wall time of the run: {time.monotonic() - t_start:.0f} s")
    notes.append("ms = median GPU time with CUDA events after warm-up (see each row's note; "
                 "benchmarks/README.md describes the method); TB/s counts bytes read + "
                 "written; a row without a number failed its check, errored or was skipped")
    meta = report.run_metadata(["benchmarks/run.py", *argv], device_name)
    json_path = report.write_json(records, meta, out_dir)
    plots = report.write_plots(records, out_dir)
    notes.append(f"plots: {', '.join(plots)}"
                 if isinstance(plots, list) else plots)
    md = report.markdown(records, meta, notes)
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(md + "\n")
    if not ns.no_append:
        report.append_results(md, results_md)
    print("\n" + md)
    print(f"\nJSON: {json_path}" + ("" if ns.no_append else f"; appended to {results_md}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

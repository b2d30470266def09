"""H200 timing of the MoE quantizers: grouped (per-expert) quantize and fused SiLU-quantize.

Usage (GPU machine, kernels from the bundle)::

    python3 benchmarks/bench_quantize_moe.py [--rows 8192] [--k 4096] [--experts 64]

Each op is called once per rotating input set through its public function (the output is
checked byte for byte against ``blockscale.reference`` for the first set), its kernel launches
are recorded, and the replayed launches are timed with CUDA events (median), so host work is
excluded. Every kernel schedule of the ops (``quantize_grouped.SCHEDULES``: "tiles", "rows",
"rows2", "stream", "stream2", "wide", and for the fused op "rows_lut", "rows2_lut",
"stream_lut", "stream2_lut", "wide_lut", "wide_bulk2_lut", the two-wave "wide_bulk2_lut_x2" and
the one-chunk-a-visit "wide1_bulk2_lut" / "_x2" / "_x4"; grouped only: "wide4", "wide_deep",
"wide_bulk2" / "wide_bulk3" / "wide_bulk4" and the 2- / 3- / 4-wave "wide_bulk2_x2" / "_x3" / "_x4")
gets its own row
(``--schedules`` picks some; the other "_x2" / "_x4" grids and the fused "*_plut" tables were
removed in session 6, measured slower: runs T / U). Bytes moved = bf16 input read + packed
data + scales written; the ceilings are a
device-to-device copy of the bf16 input (read + write) in the same process and a copy of the
kernel's byte count (read + write = bytes moved: the fair one for a ~25-40 us kernel, whose
fixed launch / ramp / tail cost the 1.5x larger input copy spreads over more bytes).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.common import (
    Record,
    failed,
    random_bf16,
    record_launches,
    replay,
    rotation_count,
    short_error,
    time_ms,
    with_rates,
)

OPS = ("grouped_quantize", "fused_silu_quantize")
SCHEDULES = ("tiles", "rows", "rows2", "rows_lut", "rows2_lut", "stream", "stream2",
             "stream_lut", "stream2_lut", "wide", "wide4", "wide_deep", "wide_lut",
             "wide_bulk2", "wide_bulk3", "wide_bulk4", "wide_bulk2_lut", "wide_bulk2_x2",
             "wide_bulk2_lut_x2", "wide1_bulk2_lut", "wide1_bulk2_lut_x2", "wide1_bulk2_lut_x4",
             "wide_bulk2_x3", "wide_bulk2_x4")
#: schedules benchmarked for the grouped op only
GROUPED_ONLY = ("wide4", "wide_deep", "wide_bulk2", "wide_bulk3", "wide_bulk4", "wide_bulk2_x2",
                "wide_bulk2_x3", "wide_bulk2_x4")


def _groups(rng: np.random.Generator, rows: int, experts: int) -> tuple[np.ndarray, ...]:
    """expert_start / scales_offsets / expert_ids of a uniform random routing of ``rows``."""
    counts = np.bincount(rng.integers(0, experts, rows), minlength=experts)
    start = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
    tiles = -(-counts // 128)
    tile0 = np.concatenate([[0], np.cumsum(tiles)[:-1]])
    offsets = (tile0 - start[:-1] // 128).astype(np.uint32)
    ids = np.arange(experts, dtype=np.int32)
    return start, offsets, ids


def _call(op: str, x: Any, fmt: str, groups: tuple[np.ndarray, ...], scales: np.ndarray,
          device: Any, schedule: str | None = None) -> tuple[Any, Any]:
    from blockscale import ops, reference

    start, offsets, ids = groups
    if op == "grouped_quantize":
        fn = ops.grouped_quantize_dynamic_scaled if device is not None \
            else reference.grouped_quantize_dynamic_scaled
    else:
        fn = ops.fused_silu_quantize if device is not None else reference.fused_silu_quantize
    kwargs = {"device": device, "schedule": schedule} if device is not None else {}
    return fn(x, fmt, start, offsets, ids, scales, **kwargs)


def make_case(op: str, fmt: str, rows: int, k: int, experts: int,
              rng: np.random.Generator) -> tuple[Any, ...]:
    """(groups, scales, x0, reference output, cache dict) of one (op, format): shared by its
    schedules (the reference runs once: ~1.5 s grouped, ~5 s fused at the default size; the
    cache keeps the rotating device inputs)."""
    groups = _groups(rng, rows, experts)
    scales = (rng.uniform(0.5, 2.0, experts).astype(np.float32) if fmt == "nvfp4"
              else np.ones(experts, np.float32))
    x0 = random_bf16(rng, (rows, k), scale=2.0)
    return groups, scales, x0, _call(op, x0, fmt, groups, scales, None), {}


def _rotation_inputs(dev: Any, case_data: Any, rng: np.random.Generator, n: int,
                     shape: tuple[int, int]) -> list[Any]:
    """``n`` random device inputs, made once per case (kept in ``case_data``'s dict)."""
    store = case_data[-1] if case_data and isinstance(case_data[-1], dict) else {}
    if "inputs" not in store:
        store["inputs"] = [dev.to_device(random_bf16(rng, shape, scale=2.0)) for _ in range(n)]
    return store["inputs"]


def bench_one(dev: Any, op: str, fmt: str, rows: int, k: int, experts: int,
              rng: np.random.Generator, schedule: str = "tiles", copy: bool = True,
              case_data: tuple[Any, ...] | None = None) -> list[Record]:
    """Records for one (op, format, schedule): ours (checked, then timed) and, with
    ``copy``, the copy ceiling. ``case_data``: :func:`make_case`'s (made here if None)."""
    case = f"{op} T={rows} K={k} E={experts}"
    impl = "blockscale" if schedule == "tiles" else f"blockscale-{schedule}"
    params = {"rows": rows, "k": k, "experts": experts, "schedule": schedule}
    try:
        case_data = case_data or make_case(op, fmt, rows, k, experts, rng)
        groups, scales, x0, want = case_data[:4]
        in_bytes = x0.nbytes
        got = _call(op, dev.to_device(x0), fmt, groups, scales, dev, schedule)
        for name, g, w in zip(("data", "scales"), got, want):
            g = dev.to_host(g) if not isinstance(g, np.ndarray) else g
            if not np.array_equal(g.view(np.uint8), w.view(np.uint8)):
                bad = int(np.count_nonzero(g.view(np.uint8) != w.view(np.uint8)))
                return [failed("quantize", case, impl, fmt, "fail",
                               f"FAIL: {name} differs from the reference in {bad} bytes", params)]
        out_bytes = sum(w.nbytes for w in want)
        # rotating device inputs, shared by the schedules of a case (cached in case_data)
        inputs = _rotation_inputs(dev, case_data, rng, rotation_count(in_bytes + out_bytes),
                                  (rows, k))
        sets = []
        for xd in inputs:
            with record_launches(dev) as launches:
                _call(op, xd, fmt, groups, scales, dev, schedule)
            sets.append(launches)
        t = time_ms(lambda i: replay(dev, sets[i % len(sets)]), device=dev)
    except Exception as e:  # noqa: BLE001 - missing kernel etc.: record and go on
        return [failed("quantize", case, impl, fmt, "error", short_error(e), params)]
    moved = in_bytes + out_bytes
    ours = with_rates(Record("quantize", case, impl, fmt, t.ms, "ok",
                             "bit-exact vs reference (whole output, first set)",
                             params={**params, "bytes": moved}, note=t.method), nbytes=moved)
    if not copy:
        return [ours]
    src = dev.to_device(x0)
    dst = dev.alloc(x0.shape, x0.dtype)
    ct = time_ms(lambda i: dev.copy(dst, src), device=dev) if hasattr(dev, "copy") else None
    recs = [ours]
    if ct is not None:
        recs.append(with_rates(Record("quantize", case, "D2D copy of the bf16 input", "bf16",
                                      ct.ms, "ok", "ceiling for this shape",
                                      params={**params, "bytes": 2 * in_bytes}),
                               nbytes=2 * in_bytes))
        # The same-bytes ceiling: a copy moving what the kernel moves (moved / 2 read, as
        # much written). The input copy moves ~1.5x the kernel's bytes, so its fixed cost
        # (launch ramp, last wave: ~4 us at this size) weighs less in its TB/s.
        # (3 rotating sources: ~44 MB each would otherwise sit in the 50 MB L2)
        n = moved // 2 // x0.itemsize
        src2 = [dev.alloc((n,), x0.dtype) for _ in range(3)]
        dst2 = dev.alloc((n,), x0.dtype)
        ct2 = time_ms(lambda i: dev.copy(dst2, src2[i % 3]), device=dev)
        recs.append(with_rates(Record("quantize", case, "D2D copy of the same bytes", "bf16",
                                      ct2.ms, "ok", "same-bytes ceiling",
                                      params={**params, "bytes": 2 * n * x0.itemsize}),
                               nbytes=2 * n * x0.itemsize))
    return recs


def bench(dev: Any, *, rows: int = 8192, k: int = 4096, experts: int = 64,
          fmts: Sequence[str] = ("nvfp4", "mxfp4", "mxfp8"), seed: int = 0,
          schedules: Sequence[str] = SCHEDULES) -> list[Record]:
    """Every op x format x schedule at one size (one copy ceiling per op x format)."""
    rng = np.random.default_rng(seed)
    out = []
    for op in OPS:
        # the *_lut schedules only change the fused op (grouped: the rows kernels again)
        scheds = [s for s in schedules if op != "grouped_quantize" or "lut" not in s]
        if op != "grouped_quantize":  # not bundled for the fused op (registers: see
            scheds = [s for s in scheds if s not in GROUPED_ONLY]  # quantize_grouped)
        for f in fmts:
            data = make_case(op, f, rows, k, experts, rng)
            for i, sch in enumerate(scheds):
                out += bench_one(dev, op, f, rows, k, experts, rng, sch,
                                 copy=i == len(scheds) - 1, case_data=data)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from blockscale import runtime

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--formats", default="nvfp4,mxfp4,mxfp8")
    p.add_argument("--schedules", default=",".join(SCHEDULES))
    a = p.parse_args(argv)
    dev = runtime.get_device("cuda")
    recs = bench(dev, rows=a.rows, k=a.k, experts=a.experts, fmts=a.formats.split(","),
                 schedules=a.schedules.split(","))
    for r in recs:
        tbps = "" if r.ms is None else f"{r.params['bytes'] / (r.ms * 1e9):.3f} TB/s"
        print(f"{r.case:42s} {r.impl:28s} {r.fmt:6s} {r.status:5s} "
              f"{'' if r.ms is None else f'{r.ms:.4f} ms':>10s} {tbps:>12s}  {r.check}")
    return 0 if all(r.status == "ok" for r in recs) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""H200 timing of the quantize kernels (bf16 -> NVFP4 / MXFP4 / MXFP8, 5-D scales).

Usage (on the GPU machine; kernels from the bundle dir, BLOCKSCALE_BUNDLE_DIR or build/gpu)::

    python benchmarks/bench_quantize.py [--shapes 8192x8192,16384x16384] [--torch]

Format ``<fmt>`` is the kernel variant the ops dispatch to on sm_90a
(``blockscale.ops.quantize.default_variant``; torch.compile is compared with it), ``<fmt>_p0``
the base generic kernel, ``nvfp4_tma`` the TMA + mbarrier NVFP4 kernel
(blockscale.ops.quantize_async). ``<fmt>_p<P>`` (P = 1, 2, 3) is the pipelined dense kernel (``QuantizeSpec.pipeline = P``: P row groups of loads in flight per
thread, blockscale.ops.quantize_pipe_ir), ``mxfp4_p<P>_bf16x2`` the same with the E2M1
rounding on bf16 pairs (``QuantizeSpec.bf16x2``); the default ``--formats`` times all of them.

For each shape and format: check the device output against the numpy reference (first and
last 256 rows) before timing; time with CUDA events (median of per-launch times after warm-up,
inputs rotated across buffers larger than L2); report GB/s moved (bf16 in + data + scales out)
next to device-to-device copy bandwidth of the same input bytes and of a copy moving the
kernel's byte count ("% of same-bytes copy", the fair ceiling at 8192^2), and optionally a
torch.compile'd implementation of the same semantics (benchmarks/torch_quantize.py).
"""

from __future__ import annotations

import argparse
import statistics

import ml_dtypes
import numpy as np

from blockscale import reference as ref
from blockscale.layouts import deinterleave
from blockscale.ops import _core
from blockscale.ops.quantize import QuantizeSpec, default_variant, launch_plan

ROTATE = 3  # input buffers (each >= 128 MB at 8192^2 bf16, well above the 50 MB L2)


def _median_ms(dev, fn, iters: int = 30, warmup: int = 5) -> float:
    """Median of per-launch CUDA-event times. With torch present: benchmarks.common.time_ms
    (a ``torch.cuda._sleep`` ahead of each timed launch keeps the queue full, so the host's
    Python launch cost never shows as an idle gap inside the events; it also picks the
    iteration count); else back-to-back launches."""
    try:
        from benchmarks.common import _torch_cuda, time_ms

        if _torch_cuda() is not None:
            return time_ms(fn, device=dev).ms
    except ImportError:
        pass
    for i in range(warmup):
        fn(i)
    dev.synchronize()
    times = []
    for i in range(iters):
        a, b = dev.create_event(), dev.create_event()
        a.record()
        fn(i)
        b.record()
        times.append(a.elapsed_ms(b))
    return statistics.median(times)


def _check(dev, fmt, x_host, data, scales, m, k, tsf):
    """Compare rows [0, 256) and the last 256 rows with the reference."""
    d_all, s_all = dev.to_host(data), dev.to_host(scales)
    j = k // (16 if fmt == "nvfp4" else 32)
    s2 = deinterleave(s_all, m, j).view(np.uint8)
    for lo in (0, max(0, m - 256)):
        rows = slice(lo, min(m, lo + 256))
        rd, rs = ref.quantize_dynamic_block_scaled(x_host[rows], fmt, tensor_sf=tsf,
                                                   scale_layout="row_major")
        if not (np.array_equal(d_all[rows].view(np.uint8), rd.view(np.uint8))
                and np.array_equal(s2[rows], rs.view(np.uint8))):
            raise SystemExit(f"{fmt} {m}x{k}: device output differs from the reference "
                             f"in rows {rows}")


def bench(shape: tuple[int, int], fmt: str, dev, use_torch: bool) -> dict:
    """One row. ``fmt``: "<fmt>" = the kernel variant the ops dispatch to on sm_90a
    (``quantize.default_variant``); "<fmt>_p<P>[_bf16x2]" = that variant explicitly (P = 0: the
    base kernel)."""
    m, k = shape
    label = fmt
    fmt, sep, p = fmt.partition("_p")
    p, _, packed = p.partition("_")
    if sep:
        pipeline, bf16x2 = int(p), packed == "bf16x2"
    else:
        pipeline, bf16x2 = default_variant(fmt, "sm_90a", m, k)
        label = f"{fmt} (default: p{pipeline}{'_bf16x2' if bf16x2 else ''})"
    tsf = 0.5 if fmt == "nvfp4" else 1.0
    rng = np.random.default_rng(0)
    x_host = rng.standard_normal((m, k), dtype=np.float32).astype(ml_dtypes.bfloat16)
    xs = [dev.to_device(x_host) for _ in range(ROTATE)]
    spec = QuantizeSpec(fmt, "sm_90a", None, "tcgen5d", True, pipeline=pipeline, bf16x2=bf16x2)
    kernel = _core.get_kernel(spec)
    grid, scalars = launch_plan(spec, m, k, -(-m // 128))
    scalars["tensor_sf"] = tsf
    f = spec.format
    data = dev.alloc((m, f.data_cols(k)), np.dtype(f.elem_dtype))
    scales = dev.alloc((-(-m // 128), -(-f.kblocks(k) // 4), 32, 4, 4), np.dtype(f.scale_dtype))

    def run(i):
        bufs = {"x": xs[i % ROTATE], "data": data, "scales": scales}
        args = [bufs[a.name] if a.kind == "buffer" else scalars[a.name] for a in kernel.args]
        dev.launch(kernel, grid, args)

    run(0)
    dev.synchronize()
    _check(dev, fmt, x_host, data, scales, m, k, tsf)
    ms = _median_ms(dev, run)
    moved = m * k * 2 + m * f.data_cols(k) * np.dtype(f.elem_dtype).itemsize + \
        int(np.prod((-(-m // 128), -(-f.kblocks(k) // 4), 512)))
    dst = dev.alloc((m, k), np.dtype(ml_dtypes.bfloat16))
    copy_ms = _median_ms(dev, lambda i: dev.copy(dst, xs[i % ROTATE]))
    out = {"shape": f"{m}x{k}", "fmt": label, "ms": ms, "GB/s": moved / ms / 1e6,
           "copy GB/s": 2 * m * k * 2 / copy_ms / 1e6}
    out["% of copy"] = 100 * out["GB/s"] / out["copy GB/s"]
    out.update(_same_bytes_copy(dev, xs, moved, ms))
    if use_torch and not sep:
        out["torch.compile ms"] = _torch_ms(x_host, fmt, tsf, data, scales, dev)
    return out


def _same_bytes_copy(dev, xs: list, moved: int, ms: float) -> dict:
    """The fair ceiling of a kernel moving ``moved`` bytes: a D2D copy of ``moved / 2`` bytes
    (read + write = moved). The input copy moves ~1.5x (FP4) the kernel's bytes, so its
    fixed launch / ramp / last-wave cost weighs less in its GB/s than in the kernel's."""
    n = moved // 4  # bf16 elements: 2n bytes read, 2n written (contents irrelevant)
    src = [dev.alloc((n,), np.dtype(ml_dtypes.bfloat16)) for _ in xs]
    dst = dev.alloc((n,), np.dtype(ml_dtypes.bfloat16))
    cms = _median_ms(dev, lambda i: dev.copy(dst, src[i % len(src)]))
    gbs = 4 * n / cms / 1e6
    return {"same-bytes copy GB/s": gbs, "% of same-bytes copy": 100 * moved / ms / 1e6 / gbs}


def bench_tma(shape: tuple[int, int], dev) -> dict:
    """The TMA NVFP4 kernel, checked and timed like :func:`bench` (K % 64 == 0)."""
    from blockscale.ops.quantize_async import AsyncQuantizeSpec
    from blockscale.ops.quantize_async import launch_plan as tma_plan

    m, k = shape
    tsf = 0.5
    rng = np.random.default_rng(0)
    x_host = rng.standard_normal((m, k), dtype=np.float32).astype(ml_dtypes.bfloat16)
    xs = [dev.to_device(x_host) for _ in range(ROTATE)]
    kernel = _core.get_kernel(AsyncQuantizeSpec("sm_90a"))
    grid, values = tma_plan(m, k)
    values["tensor_sf"] = tsf
    data = dev.alloc((m, k // 2), np.dtype(np.uint8))
    scales = dev.alloc((-(-m // 128), k // 64, 32, 4, 4), np.dtype(ml_dtypes.float8_e4m3fn))

    def run(i):
        bufs = {"x": xs[i % ROTATE], "data": data, "scales": scales}
        dev.launch(kernel, grid, [bufs[a.name] if a.kind == "buffer" else values[a.name]
                                  for a in kernel.args])

    run(0)
    dev.synchronize()
    _check(dev, "nvfp4", x_host, data, scales, m, k, tsf)
    ms = _median_ms(dev, run)
    moved = m * k * 2 + m * (k // 2) + -(-m // 128) * (k // 64) * 512
    dst = dev.alloc((m, k), np.dtype(ml_dtypes.bfloat16))
    copy_ms = _median_ms(dev, lambda i: dev.copy(dst, xs[i % ROTATE]))
    out = {"shape": f"{m}x{k}", "fmt": "nvfp4_tma", "ms": ms, "GB/s": moved / ms / 1e6,
           "copy GB/s": 2 * m * k * 2 / copy_ms / 1e6}
    out["% of copy"] = 100 * out["GB/s"] / out["copy GB/s"]
    return out


def _torch_ms(x_host, fmt, tsf, data, scales, dev) -> float:
    """torch.compile of the same semantics, timed like our kernel (CUDA events, median of 30
    after warm-up, the same rotated inputs).

    Compiled with ``dynamic=False`` after a dynamo reset, once per (shape, format): a plain
    ``torch.compile(quantize)`` reused across shapes sees a second shape for the same code
    object and recompiles it with dynamic (symbolic) shapes, a slower generic kernel; that
    was the odd 8192^2 vs 16384^2 ratio. ``fmt`` and ``tensor_sf`` are bound as constants.
    The warm-up also checks that the timed loop triggers no further compilation.
    """
    import torch
    import torch._dynamo

    from benchmarks.torch_quantize import quantize

    def run(x):
        return quantize(x, fmt, tsf)

    torch._dynamo.reset()
    fn = torch.compile(run, dynamic=False)
    xs = [torch.from_numpy(x_host.view(np.int16)).cuda().view(torch.bfloat16)
          for _ in range(ROTATE)]
    td, ts = fn(xs[0])
    torch.cuda.synchronize()
    same = np.array_equal(td.cpu().numpy(), dev.to_host(data).view(np.uint8)) and \
        np.array_equal(ts.cpu().numpy().ravel(), dev.to_host(scales).view(np.uint8).ravel())
    if not same:
        print(f"  note: torch {fmt} output differs from blockscale's")
    for i in range(5):
        fn(xs[i % ROTATE])
    torch.cuda.synchronize()
    frames = _dynamo_frames()
    times = []
    for i in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(xs[i % ROTATE])
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    if _dynamo_frames() != frames:
        print(f"  note: torch.compile recompiled inside the timed loop ({fmt})")
    return statistics.median(times)


def _dynamo_frames() -> int:
    """Frames dynamo has compiled so far (0 where torch lacks the counter)."""
    try:
        from torch._dynamo.utils import counters
        return int(sum(counters["stats"].get(k, 0) for k in ("unique_graphs",)))
    except Exception:  # noqa: BLE001 - optional diagnostics only
        return 0


def main() -> None:
    from blockscale import runtime

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="8192x8192,16384x16384")
    p.add_argument("--formats", default="nvfp4,nvfp4_p0,nvfp4_tma,nvfp4_p1,nvfp4_p2,nvfp4_p3,"
                   "mxfp4,mxfp4_p0,mxfp4_p1,mxfp4_p2,mxfp4_p3,mxfp4_p1_bf16x2,mxfp4_p2_bf16x2,"
                   "mxfp4_p3_bf16x2,mxfp8,mxfp8_p0,mxfp8_p1,mxfp8_p2,mxfp8_p3")
    p.add_argument("--torch", action="store_true", help="also time torch.compile")
    a = p.parse_args()
    dev = runtime.get_device("cuda")
    for s in a.shapes.split(","):
        m, k = (int(v) for v in s.split("x"))
        for fmt in a.formats.split(","):
            r = bench_tma((m, k), dev) if fmt == "nvfp4_tma" else bench((m, k), fmt, dev, a.torch)
            print("  ".join(f"{key}={val:.3f}" if isinstance(val, float) else f"{key}={val}"
                            for key, val in r.items()), flush=True)


if __name__ == "__main__":
    main()

"""Host-side cost of one blockscale op call on an NVIDIA GPU (what a decode step pays per op).

    BLOCKSCALE_BUNDLE_DIR=build/gpu PYTHONPATH=. python benchmarks/bench_host_overhead.py
    PYTHONPATH=. python benchmarks/bench_host_overhead.py --fake   # no GPU: Python cost only

For each op, on small device-resident inputs with warm kernel caches: the wall-clock time of
``calls`` back-to-back calls without synchronizing, divided by ``calls`` (the enqueue cost:
validation, kernel lookup, output allocation, argument packing, the launch), and the GPU time
of one call (CUDA events, queue kept full) for scale. The torch row is the same measurement of
``torch.matmul`` on bf16 tensors of the matmul's shape, a familiar reference point. With torch,
the ops are also timed on torch tensors, and the quantize -> matmul decode step is captured in
a CUDA graph whose replay is timed the same way. ``--fake`` times the calls on a GPU device
whose driver calls do nothing (blockscale's Python only; kernels from the bundle or compiled).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import common as C


def _host_us(fn: Callable[[], Any], sync: Callable[[], None], calls: int) -> float:
    for _ in range(5):
        fn()
    sync()
    best = float("inf")
    for _ in range(5):  # the best of 5 rounds: scheduler noise only adds
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        sync()
    return best


def _null_gpu() -> Any:
    """A GpuDevice that looks like an H200 and whose driver calls do nothing."""
    from blockscale.runtime.device import GpuDevice

    class NullGpu(GpuDevice):
        name, binary_kind, capability = "cuda", "cubin", (9, 0)

        def __init__(self) -> None:
            super().__init__(0)
            self._next = 1 << 20

        def _malloc(self, nbytes: int, stream: int = 0) -> int:
            ptr, self._next = self._next, self._next + (nbytes + 255) // 256 * 256
            return ptr

        def _free(self, *a: Any) -> None: ...
        def _htod(self, *a: Any) -> None: ...
        def _dtoh(self, *a: Any) -> None: ...
        def _memset(self, *a: Any) -> None: ...
        def _load_function(self, kernel: Any) -> Any: return kernel.name
        def _launch_raw(self, *a: Any) -> None: ...
        def stream_synchronize(self, stream: Any) -> None: ...
        def synchronize(self) -> None: ...

    return NullGpu()


def _graph_row(torch: Any, ops: Any, fmt: Any, x: Any, w: Any, sw: Any, k: int,
               calls: int) -> None:
    """Host us per replay of the captured quantize -> matmul step (and the GPU time)."""
    def step() -> Any:
        data, scales = ops.quantize_dynamic_block_scaled(x, "nvfp4")
        return ops.block_scaled_matmul(data, w, scales, sw, fmt, k=k)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    host = _host_us(graph.replay, torch.cuda.synchronize, calls)
    gpu = C.time_ms(lambda i: graph.replay()).ms * 1e3
    print(f"{'graph replay: quantize + matmul (torch in)':48} {host:12.1f} {gpu:12.1f}",
          flush=True)
    del out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--fake", action="store_true",
                   help="a no-op GPU: time blockscale's Python only (no GPU needed)")
    args = p.parse_args(argv)

    from blockscale import layouts, ops, runtime
    from blockscale.formats import NVFP4

    dev = _null_gpu() if args.fake else runtime.get_device("cuda")
    rng = np.random.default_rng(0)
    m, n, k = 1, 5760, 2944
    a = C.random_data(rng, NVFP4, (m, NVFP4.data_cols(k)))
    b = C.random_data(rng, NVFP4, (n, NVFP4.data_cols(k)))
    sa = layouts.interleave(C.random_scales(rng, NVFP4, (m, NVFP4.kblocks(k))))
    sb = layouts.interleave(C.random_scales(rng, NVFP4, (n, NVFP4.kblocks(k))))
    mm_args = [dev.to_device(x) for x in (a, b, sa, sb)]
    x = dev.to_device(C.random_bf16(rng, (16, 4096)))
    s2 = dev.to_device(C.random_scales(rng, NVFP4, (128, 256)))
    cases: list[tuple[str, Callable[[], Any]]] = [
        ("quantize_dynamic_block_scaled nvfp4 16x4096",
         lambda: ops.quantize_dynamic_block_scaled(x, "nvfp4", device=dev)),
        (f"block_scaled_matmul nvfp4 M={m} N={n} K={k}",
         lambda: ops.block_scaled_matmul(*mm_args, NVFP4, k=k, device=dev)),
        ("block_scales_interleave 128x256",
         lambda: ops.block_scales_interleave(s2, device=dev)),
    ]
    print(f"{'op':48} {'host us/call':>12} {'GPU us/call':>12}")
    for name, fn in cases:
        host = _host_us(fn, dev.synchronize, args.calls)
        gpu = float("nan") if args.fake else \
            C.time_ms(lambda i, fn=fn: fn(), device=dev).ms * 1e3
        print(f"{name:48} {host:12.1f} {gpu:12.1f}", flush=True)
    torch = None if args.fake else C._torch_cuda()
    if torch is not None:
        def tt(a: np.ndarray) -> Any:
            return torch.from_numpy(a.view(np.uint8)).cuda().view(
                {1: torch.uint8, 2: torch.int16}[a.dtype.itemsize])

        ta8, tb8 = tt(a), tt(b)
        tsa = tt(sa).view(torch.float8_e4m3fn)
        tsb = tt(sb).view(torch.float8_e4m3fn)
        tx = tt(C.random_bf16(rng, (16, 4096))).view(torch.bfloat16)
        ts2 = tt(C.random_scales(rng, NVFP4, (128, 256))).view(torch.float8_e4m3fn)
        for name, fn in [
                ("quantize (torch in)", lambda: ops.quantize_dynamic_block_scaled(tx, "nvfp4")),
                ("block_scaled_matmul (torch in)",
                 lambda: ops.block_scaled_matmul(ta8, tb8, tsa, tsb, NVFP4, k=k)),
                ("block_scales_interleave (torch in)",
                 lambda: ops.block_scales_interleave(ts2))]:
            host = _host_us(fn, torch.cuda.synchronize, args.calls)
            gpu = C.time_ms(lambda i, fn=fn: fn()).ms * 1e3
            print(f"{name:48} {host:12.1f} {gpu:12.1f}", flush=True)
        tx1 = tt(C.random_bf16(rng, (m, k))).view(torch.bfloat16)
        _graph_row(torch, ops, NVFP4, tx1, tb8, tsb, k, args.calls)
        ta = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        tb = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        fn = lambda: ta @ tb.T
        host = _host_us(fn, torch.cuda.synchronize, args.calls)
        gpu = C.time_ms(lambda i: fn()).ms * 1e3
        print(f"{'torch.matmul bf16 (same shape)':48} {host:12.1f} {gpu:12.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Per-tile overhead against per-step cost of the grouped producer-dequant kernel (issue #10).

Times the kernel (its launch alone, and with the grouped phase 1) at gpt-oss-120b gate_up routing
(T=4096, top-4 of 128 experts, N=5760, NVFP4, the dispatch's spec and the same without skip) for
K = 320 / 640 / 1280 / 2880 and fits ``ms = overhead + per_step * k64_steps``: the intercept is
what every work item costs besides its K loop (pipeline fill, epilogue, CTA launch), the slope
the K loop. GPU machine, kernels from the bundle::

    python3 benchmarks/pdq_k_sweep.py
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

KS = (320, 640, 1280, 2880)
VARIANTS = (("dispatch", {"prefetch": True, "skip": True}),
            ("noskip", {"prefetch": True, "skip": False}))


def _time(dev: Any, call: Any) -> tuple[float, float]:
    """(ms of all launches, ms of the last one: the pdq kernel), replayed."""
    from benchmarks.common import replay, time_ms, timed_launches

    _, ms, launches = timed_launches(dev, call)
    return ms, time_ms(lambda i: replay(dev, launches[-1:]), device=dev).ms


def main() -> int:
    from benchmarks import bench_moe as B
    from blockscale import runtime
    from blockscale.formats import Format
    from blockscale.ops import matmul_grouped_pdq as GP

    dev = runtime.get_device("cuda")
    fmt = Format.from_name("nvfp4")
    rng = np.random.default_rng(0)
    r = B.route(rng, 4096, 128, 4)
    times: dict[str, list[float]] = {label: [] for label, _ in VARIANTS}
    for k in KS:
        w = B.make_weights(dev, rng, fmt, 128, 5760, k)
        a = dev.to_device(B.random_data(rng, fmt, (r.rows, fmt.data_cols(k))))
        sc = dev.to_device(B.grouped_activation_scales(rng, fmt, r, k)[1])
        for label, kw in VARIANTS:
            def call(k: int = k, w: Any = w, a: Any = a, sc: Any = sc,
                     kw: dict = kw) -> Any:
                return GP.grouped_matmul_block_scaled_pdq(
                    a, w.data_dev, sc, w.scales_dev, r.expert_start, r.scales_offset,
                    r.expert_ids, w.expert_scales, fmt, k=k, device=dev, store="staged",
                    a_source="workspace", **kw)
            total, pdq = _time(dev, call)
            times[label].append(pdq)
            print(f"K={k:5d} steps={k // 64:3d} {label:9s} total {total:.4f} ms  pdq {pdq:.4f} ms",
                  flush=True)
    steps = np.array([k // 64 for k in KS], float)
    for label, ms in times.items():
        slope, intercept = np.polyfit(steps, np.array(ms), 1)
        print(f"{label:9s} pdq = {intercept:.4f} ms + {slope:.5f} ms x k64 steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A/B of the sm_90a grouped (MoE) matmul kernels at prefill sizes, on the GPU.

gpt-oss-120b gate_up (E=128, top-4, K=2880, N=5760) and DeepSeek-V3 (E=256, top-8, K=7168,
N=4096) at T tokens (uniform random routing, as benchmarks/bench_moe.py): the grouped wgmma
kernel (``ops/matmul_grouped_wgmma.py``) with each tile, the dispatch (which picks one), and
the mma.sync grouped kernel (the dispatch with ``BLOCKSCALE_SM90_GROUPED_WGMMA=0``). Every
row is checked on sampled rows against the float64 product first (bench_moe's check).

Usage: ``python benchmarks/bench_grouped_wgmma.py [--t 1024,4096] [--fmt nvfp4,mxfp4]
[--models gpt-oss-120b,deepseek-v3]``; kernels from the bundle (``make gpu-bundle``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])

from benchmarks.bench_moe import (
    GATE_UP,
    check_grouped_matmul,
    grouped_activation_scales,
    make_weights,
    route,
    sample_rows,
)
from benchmarks.common import (
    kernel_keys_without_mlir,
    random_data,
    record_launches,
    replay,
    time_ms,
)

#: (label, runner kind, tiles): the grouped wgmma kernel's tiles, the dispatch, mma.sync
IMPLS = (("wgmma 128x128", "direct", (128, 128)), ("wgmma 128x256", "direct", (128, 256)),
         ("wgmma 64x256", "direct", (64, 256)), ("dispatch", "dispatch", None),
         ("mma.sync (wgmma off)", "mma", None))


def _call(kind: str, tiles: tuple[int, int] | None, dev: Any, w: Any, a_dev: Any, sc_dev: Any,
          r: Any, k: int) -> Callable[[], Any]:
    from blockscale.ops import grouped_matmul_block_scaled
    from blockscale.ops import matmul_grouped_wgmma as gw

    args = (a_dev, w.data_dev, sc_dev, w.scales_dev, r.expert_start, r.scales_offset,
            r.expert_ids, w.expert_scales, w.fmt)
    if kind == "direct":
        return lambda: gw.grouped_matmul_block_scaled_wgmma(*args, k=k, tiles=tiles,
                                                            device=dev)
    return lambda: grouped_matmul_block_scaled(*args, k=k, device=dev)


def bench(dev: Any, t_values: Sequence[int], fmts: Sequence[str], models: Sequence[str],
          log: Any = print) -> list[tuple[str, str, float | None, str]]:
    """(case, impl, ms or None, check text) rows."""
    from blockscale.formats import Format
    from blockscale.ops import matmul_grouped_wgmma as gw

    out = []
    for shape in (s for s in GATE_UP if s.name in models):
        rng = np.random.default_rng(1)
        for f in fmts:
            fmt = Format.from_name(f)
            w = make_weights(dev, rng, fmt, shape.experts, shape.n, shape.k)
            for t in t_values:
                r = route(rng, t, shape.experts, shape.top_k)
                a = random_data(rng, fmt, (r.rows, fmt.data_cols(shape.k)))
                a_sc2d, a_sc5 = grouped_activation_scales(rng, fmt, r, shape.k)
                a_dev, sc_dev = dev.to_device(a), dev.to_device(a_sc5)
                flops = 2.0 * r.rows * shape.n * shape.k
                case = f"{shape.name} {f} T={t} ({r.rows} rows)"
                for label, kind, tiles in IMPLS:
                    old = os.environ.get(gw.ENV_SWITCH)
                    if kind == "mma":
                        os.environ[gw.ENV_SWITCH] = "0"
                    try:
                        call = _call(kind, tiles, dev, w, a_dev, sc_dev, r, shape.k)
                        with record_launches(dev) as launches:
                            got = call()
                        rows = sample_rows(rng, r.rows, 6)
                        ok, text = check_grouped_matmul(dev.to_host(got)[rows], a, a_sc2d,
                                                        rows, r, w)
                        ms = time_ms(lambda i, ln=launches: replay(dev, ln), device=dev).ms \
                            if ok else None
                    except Exception as e:  # noqa: BLE001 - missing kernel, launch failure
                        ms, text = None, f"error: {type(e).__name__}: {str(e)[:80]}"
                    finally:
                        if kind == "mma":
                            if old is None:
                                os.environ.pop(gw.ENV_SWITCH, None)
                            else:
                                os.environ[gw.ENV_SWITCH] = old
                    rate = f"{flops / ms / 1e9:7.1f} TFLOP/s" if ms else ""
                    log(f"  {case:42} {label:22} "
                        f"{f'{ms:8.3f} ms' if ms else '       -   '} {rate} {text[:60]}")
                    out.append((case, label, ms, text))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from blockscale import runtime

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--t", default="1024,4096")
    p.add_argument("--fmt", default="nvfp4,mxfp4")
    p.add_argument("--models", default="gpt-oss-120b")  # deepseek-v3: ~4 GB of weights
    ns = p.parse_args(argv)
    kernel_keys_without_mlir()
    dev = runtime.get_device("cuda")
    rows = bench(dev, [int(x) for x in ns.t.split(",")], ns.fmt.split(","),
                 ns.models.split(","))
    return 0 if all(ms is not None for _, _, ms, _ in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Run one op of a benchmark shape once between cuProfilerStart / cuProfilerStop, so Nsight
Compute profiles exactly its kernels (GPU machine, kernels from the bundle)::

    ncu --profile-from-start off --set full -o $OUT/twophase \\
        python3 benchmarks/profile_ncu.py twophase

Cases (the shapes of bench_matmul / bench_quantize_moe / bench_moe):

* ``twophase``: NVFP4 8192 x 5760 x 2944 through the dispatch (phase 1 twice, phase 2);
* ``twophase_persistent`` / ``twophase_staged``: the same pair with ``schedule="persistent"``
  / ``store="staged"``; ``twophase_staged_240`` / ``twophase_staged_192x240``: staged with
  128 x 240 / 192 x 240 tiles;
* ``grouped_quantize`` / ``silu_quantize``: NVFP4, T=8192, K=4096, 64 experts, the default
  schedule; ``grouped_quantize_large`` / ``grouped_quantize_large_mxfp4``: NVFP4 / MXFP4 at
  T=16384, K=8192 (the size rule's "wide_bulk2_x2"); ``silu_quantize_large``: NVFP4 there;
* ``dense_decode_m1`` / ``dense_decode_m16`` / ``dense_decode_m1_shot``: NVFP4 M x 5760 x 2880
  through the dispatch (``ops.block_scaled_matmul``), the last one ``mma_shot`` called directly;
  ``dense_decode_m16_shot16`` / ``dense_decode_m1_lean`` / ``dense_decode_m16_lean``: the
  ``mma_shot16`` / ``mma_leanb_t8_n6`` / ``mma_leanb_t16_n6`` kernels called directly;
* ``moe_decode`` / ``moe_decode_t1`` / ``moe_prefill``: gpt-oss-120b gate_up NVFP4 at T=128 /
  1 / 4096 (the
  dispatch); ``moe_prefill_tma`` / ``moe_prefill_ae``: T=4096, the producer-dequant kernel
  with B by TMA / with A copied a step early; ``moe_prefill_tall``: its 256 x 128 items;
  ``moe_prefill_f16``: its 192 x 192 items on f16 operands; ``moe_prefill_rs``: the
  register-A kernel (``matmul_grouped_rs``); ``moe_prefill_mx8`` / ``moe_prefill_mx8_1024``:
  MXFP8 at T=4096 / 1024 through the dispatch (flag kernel, phase 1, main kernel, fixup).

The op runs once before the profiled call (compiles nothing: the bundle; loads the module).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np


def _twophase(dev: Any, schedule: str, store: str = "direct", **tile: int
              ) -> Callable[[], Any]:
    from blockscale import layouts
    from blockscale.formats import Format
    from blockscale.ops import matmul_twophase

    sys.path.insert(0, "tests")
    from test_matmul_common import random_data, random_scales_2d

    fmt, (m, n, k) = Format.from_name("nvfp4"), (8192, 5760, 2944)
    rng = np.random.default_rng(0)
    a, b = random_data(rng, fmt, m, k), random_data(rng, fmt, n, k)
    sa, sb = random_scales_2d(rng, fmt, m, k), random_scales_2d(rng, fmt, n, k)
    args = [dev.to_device(x) for x in (a, b, layouts.interleave(sa), layouts.interleave(sb))]
    return lambda: matmul_twophase.block_scaled_matmul_twophase(
        *args, fmt, k=k, device=dev, schedule=schedule, store=store, **tile)


def _quantize(dev: Any, op: str, fmt: str = "nvfp4", rows: int = 8192, k: int = 4096
              ) -> Callable[[], Any]:
    from benchmarks import bench_quantize_moe as Q

    rng = np.random.default_rng(0)
    groups = Q._groups(rng, rows, 64)
    scales = (rng.uniform(0.5, 2.0, 64).astype(np.float32) if fmt == "nvfp4"
              else np.ones(64, np.float32))
    x = dev.to_device(Q.random_bf16(rng, (rows, k), scale=2.0))
    return lambda: Q._call(op, x, fmt, groups, scales, dev)


def _dense_decode(dev: Any, m: int, variant: str | None = None, n: int = 5760,
                  k: int = 2880) -> Callable[[], Any]:
    from benchmarks.common import random_data, random_scales
    from blockscale import layouts
    from blockscale.formats import Format
    from blockscale.ops import matmul_decode

    fmt = Format.from_name("nvfp4")
    rng = np.random.default_rng(0)
    a, b = random_data(rng, fmt, (m, fmt.data_cols(k))), random_data(rng, fmt, (n, fmt.data_cols(k)))
    sa, sb = (random_scales(rng, fmt, (r, fmt.kblocks(k))) for r in (m, n))
    args = [dev.to_device(x) for x in (a, b, layouts.interleave(sa), layouts.interleave(sb))]
    if variant is None:
        from blockscale import ops

        return lambda: ops.block_scaled_matmul(*args, fmt, k=k, out_dtype="float32", device=dev)
    return lambda: matmul_decode.block_scaled_matmul_decode(
        *args, fmt, k=k, out_dtype="float32", device=dev, variant=variant)


def _moe(dev: Any, tokens: int, fmt_name: str = "nvfp4", **pdq: Any) -> Callable[[], Any]:
    from benchmarks import bench_moe as B
    from blockscale import ops
    from blockscale.formats import Format

    fmt, shape = Format.from_name(fmt_name), B.GATE_UP[0]
    rng = np.random.default_rng(0)
    w = B.make_weights(dev, rng, fmt, shape.experts, shape.n, shape.k)
    r = B.route(rng, tokens, shape.experts, shape.top_k)
    a = dev.to_device(B.random_data(rng, fmt, (r.rows, fmt.data_cols(shape.k))))
    sc = dev.to_device(B.grouped_activation_scales(rng, fmt, r, shape.k)[1])
    if not pdq:
        return lambda: ops.grouped_matmul_block_scaled(
            a, w.data_dev, sc, w.scales_dev, r.expert_start, r.scales_offset, r.expert_ids,
            w.expert_scales, fmt, k=shape.k, device=dev, target=B.TARGET)
    if pdq.pop("rs", False):  # the register-A kernel (matmul_grouped_rs)
        from blockscale.ops import matmul_grouped_rs as GR

        return lambda: GR.grouped_matmul_block_scaled_rs(
            a, w.data_dev, sc, w.scales_dev, r.expert_start, r.scales_offset, r.expert_ids,
            w.expert_scales, fmt, k=shape.k, device=dev, **pdq)
    from blockscale.ops import matmul_grouped_pdq as GP

    return lambda: GP.grouped_matmul_block_scaled_pdq(
        a, w.data_dev, sc, w.scales_dev, r.expert_start, r.scales_offset, r.expert_ids,
        w.expert_scales, fmt, k=shape.k, device=dev,
        **{"store": "staged", "a_source": "workspace", "skip": True, **pdq})


CASES: dict[str, Callable[[Any], Callable[[], Any]]] = {
    "twophase": lambda d: _twophase(d, "tiles"),
    "twophase_persistent": lambda d: _twophase(d, "persistent"),
    "twophase_staged": lambda d: _twophase(d, "tiles", "staged"),
    "twophase_staged_240": lambda d: _twophase(d, "tiles", "staged", bn=240),
    "twophase_staged_192x240": lambda d: _twophase(d, "tiles", "staged", bm=192, bn=240),
    "grouped_quantize": lambda d: _quantize(d, "grouped_quantize"),
    "silu_quantize": lambda d: _quantize(d, "fused_silu_quantize"),
    "grouped_quantize_large": lambda d: _quantize(d, "grouped_quantize", rows=16384, k=8192),
    "grouped_quantize_large_mxfp4": lambda d: _quantize(d, "grouped_quantize", "mxfp4", 16384,
                                                        8192),
    "silu_quantize_large": lambda d: _quantize(d, "fused_silu_quantize", rows=16384, k=8192),
    "dense_decode_m1": lambda d: _dense_decode(d, 1),
    "dense_decode_m16": lambda d: _dense_decode(d, 16),
    "dense_decode_m1_shot": lambda d: _dense_decode(d, 1, "mma_shot"),
    "dense_decode_m16_shot16": lambda d: _dense_decode(d, 16, "mma_shot16"),
    "dense_decode_m1_lean": lambda d: _dense_decode(d, 1, "mma_leanb_t8_n6"),
    "dense_decode_m16_lean": lambda d: _dense_decode(d, 16, "mma_leanb_t16_n6"),
    "dense_decode_m16_lean_k7168": lambda d: _dense_decode(d, 16, "mma_leanb_t16_n4_k7168",
                                                           4096, 7168),
    "moe_decode": lambda d: _moe(d, 128),
    "moe_decode_t16": lambda d: _moe(d, 16),
    "moe_decode_t1": lambda d: _moe(d, 1),
    "moe_prefill": lambda d: _moe(d, 4096),
    "moe_prefill_tma": lambda d: _moe(d, 4096, b_source="tma"),
    "moe_prefill_ae": lambda d: _moe(d, 4096, prefetch=True, a_early=True),
    "moe_prefill_f16": lambda d: _moe(d, 4096, prefetch=True, bm=192, bn=192, skip=False,
                                      dtype="f16"),
    "moe_prefill_rs": lambda d: _moe(d, 4096, rs=True),
    "moe_prefill_mx8": lambda d: _moe(d, 4096, "mxfp8"),
    "moe_prefill_mx8_1024": lambda d: _moe(d, 1024, "mxfp8"),
    "moe_prefill_tall": lambda d: _moe(d, 4096, prefetch=True, bm=256, bn=128, unroll=2,
                                             skip=False),
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in CASES:
        print(f"usage: profile_ncu.py {{{','.join(CASES)}}}", file=sys.stderr)
        return 2
    from cuda.bindings import driver

    from blockscale import runtime

    dev = runtime.get_device("cuda")
    call = CASES[argv[0]](dev)
    call()
    dev.synchronize()
    driver.cuProfilerStart()
    call()
    dev.synchronize()
    driver.cuProfilerStop()
    print(f"profiled {argv[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

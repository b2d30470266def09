"""``blockscale demo``: the end-to-end MoE layer, compiled for every target and verified.

1. builds a small block-scaled MoE layer (NVFP4 by default) and the graph of its expert
   pipeline (grouped quantize with the fused gather -> gate/up grouped matmul -> fused SiLU
   quantize -> down grouped matmul);
2. prints the graph and the size of its MLIR module;
3. compiles it for sm_90a, sm_100a and gfx950 (gfx950 only when llc/ld.lld with the AMDGPU
   target are found; it says so otherwise) and prints every kernel's stage sizes;
4. runs the program on a GPU when one is present, else in the numpy interpreter;
5. checks the result byte for byte against the numpy reference of the same graph and the
   layer output against the float64 reference (per-token cosine), prints timings and exits
   non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import ml_dtypes
import numpy as np

TARGETS = ("sm_90a", "sm_100a", "gfx950")
COSINE_BOUNDS = {"nvfp4": 0.995, "mxfp4": 0.99, "mxfp8": 0.995}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="blockscale demo", description=__doc__.splitlines()[0])
    p.add_argument("--format", default="nvfp4", choices=sorted(COSINE_BOUNDS))
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--moe-dim", type=int, default=256)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--device", default=None, help="cuda | hip | interp (default: best)")
    p.add_argument("--seed", type=int, default=0)
    return p


def _stage_sizes(asm: dict[str, Any]) -> str:
    parts = []
    for stage, text in asm.items():
        n = len(text) if isinstance(text, (bytes, str)) else 0
        parts.append(f"{stage} {n / 1024:.1f}K")
    return ", ".join(parts)


def _compile_all(graph: Any, out: Any) -> tuple[dict[str, Any], bool]:
    from blockscale.compiler import toolchain

    programs: dict[str, Any] = {}
    ok = True
    for target in TARGETS:
        if target.startswith("gfx"):
            why = toolchain.amdgpu_tools_reason()
            if why:
                print(f"  {target}: skipped ({why})", file=out)
                continue
        elif toolchain.cuda_tools_reason():
            print(f"  {target}: skipped ({toolchain.cuda_tools_reason()})", file=out)
            continue
        t0 = time.perf_counter()
        try:
            program = graph.compile(target, keep_asm=True)
        except Exception as e:  # noqa: BLE001  (report every target, then fail)
            print(f"  {target}: FAILED to compile: {type(e).__name__}: {e}", file=out)
            ok = False
            continue
        dt = time.perf_counter() - t0
        programs[target] = program
        print(f"  {target}: {len(program.kernels)} kernels, {len(program.steps)} launches, "
              f"{dt:.2f} s", file=out)
        for key, asm in program.asm.items():
            print(f"    {program.kernels[key].name}: {_stage_sizes(asm)}", file=out)
    return programs, ok


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit code (0: everything matched)."""
    from blockscale import runtime
    from blockscale.graph import run_program
    from blockscale.moe import QuantConfig
    from blockscale.moe_layer import (
        MoELayer,
        MoEWeights,
        combine_experts,
        moe_forward_reference,
    )
    from blockscale.ops import _core

    args = _parser().parse_args(argv)
    out = sys.stdout
    t_start = time.perf_counter()
    print(f"blockscale demo: {args.format} MoE layer, T={args.tokens} H={args.hidden} "
          f"D={args.moe_dim} E={args.experts} top-{args.top_k}", file=out)

    weights = MoEWeights.random(args.hidden, args.moe_dim, args.experts, seed=args.seed)
    rng = np.random.default_rng(args.seed + 1)
    x = rng.standard_normal((args.tokens, args.hidden)).astype(ml_dtypes.bfloat16)
    layer = MoELayer(weights, QuantConfig(args.format), args.top_k, calibration=x)
    topk_ids, topk_w = layer.route(x)
    idx = layer.indices(topk_ids)
    graph = layer.expert_graph(args.tokens)
    inputs = layer.graph_inputs(x, idx)

    print("\n== graph ==", file=out)
    print(graph.summary(), file=out)
    t0 = time.perf_counter()
    text = graph.mlir("sm_90a")
    print(f"\nMLIR module (sm_90a): {len(text.splitlines())} lines, {len(text) / 1024:.1f} KiB, "
          f"{text.count('gpu.module @')} gpu.modules, {text.count('gpu.launch_func')} "
          f"gpu.launch_func ({time.perf_counter() - t0:.2f} s)", file=out)

    print("\n== compile ==", file=out)
    programs, ok = _compile_all(graph, out)

    print("\n== run ==", file=out)
    dev = runtime.get_device(args.device)
    target = _core.resolve_target(None, dev)
    program = programs.get(target) or graph.compile(target)
    print(f"  device: {dev.describe()}; program for {target}", file=out)
    t0 = time.perf_counter()
    result = run_program(program, inputs, device=dev)["y"]
    t_run = time.perf_counter() - t0
    y = np.asarray(result if isinstance(result, np.ndarray) else result.numpy())
    t0 = time.perf_counter()
    want = graph.evaluate(inputs)["y"]
    t_ref = time.perf_counter() - t0

    print("\n== verify ==", file=out)
    same = y.shape == want.shape and np.array_equal(y.view(np.uint16), want.view(np.uint16))
    print(f"  expert output vs numpy reference: {'byte-exact' if same else 'MISMATCH'} "
          f"({y.shape[0]} x {y.shape[1]} bf16)", file=out)
    if not same:
        diff = np.flatnonzero(y.view(np.uint16).reshape(-1) != want.view(np.uint16).reshape(-1))
        print(f"    {diff.size} elements differ, first at flat index {diff[:5].tolist()}",
              file=out)
    layer_out = combine_experts(y, idx.restore_order, topk_w).astype(np.float64)
    ref64 = moe_forward_reference(layer, x)
    cos = (layer_out * ref64).sum(1) / (np.linalg.norm(layer_out, axis=1)
                                        * np.linalg.norm(ref64, axis=1))
    bound = COSINE_BOUNDS[args.format]
    cos_ok = bool(cos.min() >= bound)
    print(f"  layer output vs float64 reference: per-token cosine min {cos.min():.5f} "
          f"mean {cos.mean():.5f} ({'ok' if cos_ok else 'BELOW'} bound {bound})", file=out)

    print("\n== report ==", file=out)
    print(f"  run on {dev.name}: {t_run * 1e3:.1f} ms; numpy reference: {t_ref * 1e3:.1f} ms; "
          f"total {time.perf_counter() - t_start:.1f} s", file=out)
    print(f"  compiled for: {', '.join(programs) or 'none'}", file=out)
    passed = ok and same and cos_ok
    print(f"  {'PASS' if passed else 'FAIL'}", file=out)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

"""The ``blockscale`` command: compile kernels and print any stage, list targets, run the demo.

Examples::

    blockscale compile block_scales_interleave --rows 129 --kblocks 5 --target <T> --emit amdgcn
    blockscale compile block_scales_interleave --target <T> --emit sass -o k.sass
    blockscale targets
    blockscale demo
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

EMIT_CHOICES = ("mlir", "lowered", "llvm", "ptx", "amdgcn", "sass", "cubin", "hsaco", "meta")


def _compile(ns: argparse.Namespace) -> int:
    from blockscale.compiler.targets import GPUTarget

    target = GPUTarget.parse(ns.target)
    if ns.dump_dir:
        os.environ["BLOCKSCALE_DUMP_DIR"] = ns.dump_dir
    from blockscale import ops

    fn = getattr(ops, ns.op, None)
    make_kernel = getattr(fn, "kernel", None)
    if make_kernel is None:
        print(f"blockscale compile: unknown op {ns.op!r} (an op function with .kernel(); "
              "e.g. block_scales_interleave)", file=sys.stderr)
        return 2
    kwargs: dict[str, Any] = {}
    if ns.dtype:
        kwargs["spec_or_dtype"] = ns.dtype
    if ns.rows is not None:
        kwargs["rows"] = ns.rows
    if ns.kblocks is not None:
        kwargs["kblocks"] = ns.kblocks
    kernel = make_kernel(target=target.name, **kwargs)
    if ns.emit == "meta":
        data: Any = json.dumps({k: v for k, v in kernel.meta.items() if k != "ptxas_log"},
                               indent=2, sort_keys=True, default=str) + "\n"
    else:
        if ns.emit in ("ptx", "cubin") and not target.is_cuda or \
                ns.emit in ("amdgcn", "hsaco") and not target.is_hip:
            print(f"blockscale compile: --emit {ns.emit} does not exist for target "
                  f"{target.name} (a {target.backend} target)", file=sys.stderr)
            return 2
        data = kernel.asm[ns.emit]
    if isinstance(data, bytes):
        if not ns.output:
            print(f"blockscale compile: --emit {ns.emit} is binary; give -o FILE",
                  file=sys.stderr)
            return 2
        with open(ns.output, "wb") as f:
            f.write(data)
    elif ns.output:
        with open(ns.output, "w", encoding="utf-8") as f:
            f.write(data)
    else:
        sys.stdout.write(data)
    if ns.rows is not None and ns.kblocks is not None and ns.op.startswith("block_scales_inter"):
        from blockscale.ops.interleave import launch_plan, output_shape

        plan = launch_plan(ns.rows, ns.kblocks)
        print(f"# launch: grid={plan.grid} block={kernel.block} "
              f"out_shape={output_shape(ns.rows, ns.kblocks)}", file=sys.stderr)
    return 0


def _targets(ns: argparse.Namespace) -> int:
    from blockscale.compiler import toolchain
    from blockscale.compiler.targets import TARGETS

    for t in TARGETS:
        if t.is_cuda:
            tools = {n: toolchain.find_cuda_tool(n) for n in ("ptxas", "cuobjdump", "nvdisasm")}
        else:
            tools = {n: toolchain.find_llvm_tool(n) for n in ("llc", "ld.lld", "llvm-objdump")}
        ok = all(tools[n] for n in list(tools)[:1])
        print(f"{t.name:8s} {t.backend:4s} warp {t.warp_size:2d} -> {t.binary_kind:5s}  "
              f"{'ready' if ok else 'MISSING TOOLS'}  ({t.description})")
        for n, tool in tools.items():
            print(f"    {n:13s} {tool.path + '  [' + tool.version + ']' if tool else 'not found'}")
    reason = toolchain.amdgpu_tools_reason()
    if reason:
        print(f"note: {reason}")
    return 0


def _demo(ns: argparse.Namespace) -> int:
    try:
        demo = importlib.import_module("blockscale.demo")
    except ModuleNotFoundError as e:
        if e.name != "blockscale.demo":
            raise
        print("blockscale demo: blockscale/demo.py is not available in this build",
              file=sys.stderr)
        return 2
    result = demo.main(list(ns.args))
    return int(result or 0)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``blockscale`` command."""
    parser = argparse.ArgumentParser(prog="blockscale", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compile", help="compile an op's kernel and print one stage")
    c.add_argument("op", help="op name, e.g. block_scales_interleave")
    from blockscale.compiler.targets import DEFAULT_TARGET, target_names

    c.add_argument("--target", default=DEFAULT_TARGET.name, help=" | ".join(target_names()))
    c.add_argument("--emit", default="mlir", choices=EMIT_CHOICES)
    c.add_argument("--rows", type=int, help="rows (prints the launch plan)")
    c.add_argument("--kblocks", type=int, help="K-blocks (prints the launch plan)")
    c.add_argument("--dtype", help="scale dtype (uint8, float8_e4m3fn, float8_e8m0fnu)")
    c.add_argument("-o", "--output", help="write the stage to FILE")
    c.add_argument("--dump-dir", help="also dump every stage under DIR")
    c.set_defaults(func=_compile)

    t = sub.add_parser("targets", help="list targets and whether their toolchain is found")
    t.set_defaults(func=_targets)

    d = sub.add_parser("demo", help="run the end-to-end demo (blockscale.demo)")
    d.add_argument("args", nargs=argparse.REMAINDER, help="passed to the demo")
    d.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``blockscale``); returns the exit status."""
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except (ValueError, TypeError) as e:
        print(f"blockscale {ns.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

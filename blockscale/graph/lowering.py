"""Lowering a :class:`~blockscale.graph.Graph`: launch plan, one MLIR module, a Program.

* :func:`plan_graph` (no MLIR): every node becomes kernel launches through its op module's
  spec and launch-plan function (:mod:`blockscale.graph.plans`); every tensor a buffer.
* :func:`graph_mlir` (MLIR): the ``gpu.module`` of every distinct kernel plus a host
  ``func.func`` whose arguments are the graph's inputs, constants and outputs (flat
  ``memref<?xT>``, narrow floats as ``i8``), with a ``memref.alloc`` per temporary and one
  ``gpu.launch_func`` per launch; the module is parsed and verified before it is returned.
* :func:`compile_graph`: a runtime :class:`~blockscale.runtime.program.Program`. The graph's
  constants (weights, per-expert scales) are stored in ``program.meta["constants"]``
  (base64) and bound by :func:`run_program`; ``program.asm`` (with ``keep_asm``) maps every
  kernel key to its compiled stages.
"""

from __future__ import annotations

import base64
import dataclasses
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from blockscale.graph import plans
from blockscale.graph.core import Tensor, np_dtype

__all__ = [
    "GraphPlan",
    "PlannedLaunch",
    "compile_graph",
    "graph_mlir",
    "plan_graph",
    "program_constants",
    "run_graph",
    "run_program",
]

_MEMREF_ELEM = {"uint8": "i8", "float8_e4m3fn": "i8", "float8_e8m0fnu": "i8", "int8": "i8",
                "bfloat16": "bf16", "float32": "f32", "int32": "i32", "int64": "i64"}


@dataclasses.dataclass(frozen=True)
class PlannedLaunch:
    """One kernel launch of a graph: the op spec, the grid and the argument bindings
    (kernel argument name -> buffer name or scalar)."""

    op: str
    spec: Any
    grid: tuple[int, int, int]
    bindings: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class GraphPlan:
    """Buffers (name -> (tensor, role)) and launches of a graph for one target."""

    target: str
    buffers: dict[str, tuple[Tensor, str]]
    launches: list[PlannedLaunch]


def plan_graph(graph: Any, target: str) -> GraphPlan:
    """The launch plan of ``graph`` on ``target`` (ValueError without outputs)."""
    from blockscale.compiler.targets import GPUTarget  # pure python

    tgt = GPUTarget.parse(target).name
    if not graph.outputs:
        raise ValueError(f"graph {graph.name!r} has no outputs; call graph.output(tensor)")
    roles: dict[str, str] = {}
    for t in graph.inputs:
        roles[t.name] = "input"
    for name in graph.constants:
        roles[name] = "input"
    out_tensors = {t.name for t in graph.outputs.values()}
    launches: list[PlannedLaunch] = []
    for node in graph.nodes:
        for t in node.outputs:
            roles[t.name] = "output" if t.name in out_tensors else "temp"
        for spec, grid, bindings in plans.plan_node(node, tgt):
            launches.append(PlannedLaunch(node.op, spec, tuple(grid), bindings))  # type: ignore
    buffers = {name: (graph.tensors[name], role) for name, role in roles.items()}
    return GraphPlan(tgt, buffers, launches)


# ----------------------------------------------------------------------------- MLIR


def _memref(t: Tensor) -> str:
    return f"memref<?x{_MEMREF_ELEM[t.dtype]}>"


def _scalar_literal(value: Any, kind: str) -> str:
    if kind == "f32":
        bits = struct.unpack("<I", struct.pack("<f", float(value)))[0]
        return f"0x{bits:08X} : f32"
    return f"{int(value)} : {kind}"


def _kernel_module_ops(spec: Any) -> tuple[str, list[str]]:
    """(gpu.module symbol, texts of the top-level ops of the spec's kernel module)."""
    from blockscale.ops import _core

    module = _core._builder_of(spec, None)(spec)
    texts = [str(op) for op in module.body.operations]
    return spec.kernel_name, texts


def graph_mlir(graph: Any, target: str = "sm_90a") -> str:
    """The graph as one verified MLIR module (text); see the module docstring."""
    from mlir import ir

    plan = plan_graph(graph, target)
    from blockscale.ops import _core

    kernels: dict[str, tuple[str, Any]] = {}  # kernel key -> (gpu.module symbol, spec)
    gpu_modules: list[str] = []
    symbols: set[str] = set()
    for launch in plan.launches:
        key = _core.kernel_key(launch.spec)
        if key in kernels:
            continue
        sym, texts = _kernel_module_ops(launch.spec)
        if sym in symbols:
            raise ValueError(f"two different kernels are both called {sym!r}")
        symbols.add(sym)
        kernels[key] = (sym, launch.spec)
        gpu_modules.extend(texts)

    params = [(n, t) for n, (t, role) in plan.buffers.items() if role in ("input", "output")]
    temps = [(n, t) for n, (t, role) in plan.buffers.items() if role == "temp"]
    lines = [f"  func.func @{graph.name}("
             + ", ".join(f"%{n}: {_memref(t)}" for n, t in params) + ") {"]
    for n, t in temps:
        count = int(np.prod(t.shape, dtype=np.int64))
        elem = _MEMREF_ELEM[t.dtype]
        lines.append(f"    %{n}_alloc = memref.alloc() : memref<{max(1, count)}x{elem}>")
        lines.append(f"    %{n} = memref.cast %{n}_alloc : memref<{max(1, count)}x{elem}> to "
                     f"memref<?x{elem}>")
    for i, launch in enumerate(plan.launches):
        sym, spec = kernels[_core.kernel_key(launch.spec)]
        lines.append(f"    // {launch.op}")
        dims = []
        for v in (*launch.grid, *spec.block):
            lines.append(f"    %l{i}_{len(dims)} = arith.constant {int(v)} : index")
            dims.append(f"%l{i}_{len(dims)}")
        args = []
        for a in spec.args():
            value = launch.bindings[a.name]
            if a.kind == "buffer":
                args.append(f"%{value} : {_memref(plan.buffers[value][0])}")
            else:
                lines.append(f"    %l{i}_{a.name} = arith.constant "
                             f"{_scalar_literal(value, a.dtype)}")
                args.append(f"%l{i}_{a.name} : {a.dtype}")
        lines.append(f"    gpu.launch_func @{sym}::@{spec.kernel_name} blocks in "
                     f"({', '.join(dims[:3])}) threads in ({', '.join(dims[3:])}) "
                     f"args({', '.join(args)})")
    for n, t in temps:
        count = int(np.prod(t.shape, dtype=np.int64))
        lines.append(f"    memref.dealloc %{n}_alloc : memref<{max(1, count)}x"
                     f"{_MEMREF_ELEM[t.dtype]}>")
    lines += ["    return", "  }"]
    text = "module attributes {gpu.container_module} {\n" + "\n".join(gpu_modules) + "\n" \
        + "\n".join(lines) + "\n}\n"
    with ir.Context() as ctx:
        ctx.allow_unregistered_dialects = False
        module = ir.Module.parse(text)
        module.operation.verify()
    return text  # verified; keeps the graph's buffer names (the printer would renumber them)


# ----------------------------------------------------------------------------- Program


def _encode(arr: np.ndarray) -> dict[str, Any]:
    return {"dtype": arr.dtype.name, "shape": list(arr.shape),
            "base64": base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")}


def _decode(d: Mapping[str, Any]) -> np.ndarray:
    raw = base64.b64decode(d["base64"])
    return np.frombuffer(raw, dtype=np_dtype(d["dtype"])).reshape(d["shape"]).copy()


def compile_graph(graph: Any, target: str = "sm_90a", *, keep_asm: bool = False) -> Any:
    """A :class:`~blockscale.runtime.program.Program` running ``graph`` on ``target``.

    Kernels come from :func:`blockscale.ops._core.get_kernel` (memory, bundle, disk cache,
    compile). With ``keep_asm`` every kernel is compiled with all its stages and
    ``program.asm[key]`` maps stage name -> text (``"cubin"``/``"hsaco"`` as bytes).
    """
    from blockscale.ops import _core
    from blockscale.runtime.program import BufferDecl, Program, Step

    plan = plan_graph(graph, target)
    kernels: dict[str, Any] = {}
    asm: dict[str, dict[str, Any]] = {}
    steps = []
    for launch in plan.launches:
        key = _core.kernel_key(launch.spec)
        if key not in kernels:
            if keep_asm:
                k = _core.compile_kernel(launch.spec)
                kernels[key] = k.binary
                asm[key] = dict(k.asm)
            else:
                kernels[key] = _core.get_kernel(launch.spec)
        steps.append(Step(key, launch.grid, dict(launch.bindings)))
    buffers = [BufferDecl(n, t.shape, t.dtype, role, "empty")
               for n, (t, role) in plan.buffers.items()]
    meta = {"graph": graph.name, "ops": [n.op for n in graph.nodes],
            "constants": {n: _encode(a) for n, a in graph.constants.items()},
            "output_names": {name: t.name for name, t in graph.outputs.items()}}
    program = Program(buffers, steps, kernels, meta=meta)
    program.asm = asm  # type: ignore[attr-defined]
    return program


def program_constants(program: Any) -> dict[str, np.ndarray]:
    """The constant buffers stored in a program compiled from a graph."""
    return {n: _decode(d) for n, d in program.meta.get("constants", {}).items()}


def run_program(program: Any, inputs: Mapping[str, Any], *, device: Any = None
                ) -> dict[str, Any]:
    """Run a program compiled from a graph: binds its stored constants, runs it, and returns
    ``{graph output name: array}``."""
    values = dict(inputs)
    for name, arr in program_constants(program).items():
        if name in values:
            raise ValueError(f"inputs: {name!r} is a constant of the program, not an input")
        values[name] = arr
    out = program.run(values, device=device)
    names = program.meta.get("output_names", {})
    return {graph_name: out[buf] for graph_name, buf in names.items()} if names else out


def run_graph(graph: Any, inputs: Mapping[str, np.ndarray], *, device: Any = None,
              target: str | None = None) -> dict[str, Any]:
    """Compile ``graph`` for ``target`` (default: the device's) and run it on ``device``."""
    from blockscale import runtime
    from blockscale.ops import _core

    dev = runtime.get_device(device)
    program = compile_graph(graph, _core.resolve_target(target, dev))
    return run_program(program, inputs, device=dev)

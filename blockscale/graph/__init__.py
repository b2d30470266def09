"""Op graphs from Python: typed tensors, ops of :mod:`blockscale.ops`, one MLIR module.

Build a :class:`Graph` with inputs and op calls (the same names and arguments as the
functions of :mod:`blockscale.ops`); argument types (dtype, shape, format, scale layout) are
checked as each op is added. Then:

* ``graph.evaluate(inputs)``: run it with the numpy reference (the specification);
* ``graph.mlir(target)``: one MLIR module, a host ``func.func`` of memref allocations and
  ``gpu.launch_func`` ops plus the ``gpu.module`` of every kernel (needs MLIR);
* ``graph.compile(target)``: a runtime :class:`~blockscale.runtime.program.Program` (save,
  load, run on cuda / hip / interp); ``keep_asm=True`` keeps every stage of every kernel;
* ``graph.run(inputs, device=...)``: compile for the device and run.

``import blockscale.graph`` imports no MLIR.
"""

from blockscale.graph.builder import Graph
from blockscale.graph.core import GraphTypeError, Node, Tensor
from blockscale.graph.lowering import (
    GraphPlan,
    PlannedLaunch,
    compile_graph,
    graph_mlir,
    plan_graph,
    program_constants,
    run_program,
)

__all__ = [
    "Graph",
    "GraphPlan",
    "GraphTypeError",
    "Node",
    "PlannedLaunch",
    "Tensor",
    "compile_graph",
    "graph_mlir",
    "plan_graph",
    "program_constants",
    "run_program",
]

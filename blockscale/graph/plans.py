"""Per-op launch plans of graph nodes, built from each op module's spec and plan functions.

``plan_node(node, target)`` returns ``[(spec, grid, bindings)]``: the op's kernel spec, its
launch grid and the binding of every kernel argument to a graph tensor name or a scalar. Each
adapter uses the op module's own pieces: ``QuantizeSpec`` + ``quantize.launch_plan``,
``InterleaveSpec`` + ``interleave.launch_plan``, ``MatmulSpec`` + ``matmul.grid``,
``GroupedMatmulSpec`` + ``matmul_grouped.grid``; the fused grouped SwiGLU by
``blockscale.ops.matmul_swiglu.graph_launches`` (``SwigluSpec``, one kernel).

Nothing here imports MLIR.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from blockscale.graph.core import Node

__all__ = ["PLANNERS", "plan_node"]

Launches = list[tuple[Any, tuple[int, int, int], dict[str, Any]]]
PLANNERS: dict[str, Callable[[Node, str], Launches]] = {}


def _planner(op: str) -> Callable[[Callable[[Node, str], Launches]], Callable[..., Launches]]:
    def deco(fn: Callable[[Node, str], Launches]) -> Callable[[Node, str], Launches]:
        PLANNERS[op] = fn
        return fn
    return deco


def plan_node(node: Node, target: str) -> Launches:
    """Kernel launches of ``node`` on ``target`` (NotImplementedError for an op without a
    kernel in this build)."""
    fn = PLANNERS.get(node.op)
    if fn is None:
        raise NotImplementedError(f"graph op {node.op!r} has no launch planner")
    return fn(node, target)


def _search_steps(groups: int) -> int:
    return max(1, groups - 1).bit_length() if groups > 1 else 0


@_planner("quantize_dynamic_block_scaled")
def _quantize(node: Node, target: str) -> Launches:
    from blockscale.ops import quantize as Q

    x = node.inputs["x"]
    data, scales = node.outputs
    m, k = x.shape
    if m == 0 or k == 0:
        return []
    a = node.attrs
    layout = "tcgen5d" if a["layout"].value == "tcgen5d" else "row_major"
    spec = Q.QuantizeSpec(a["fmt"].name, target, a["rounding"], layout, k % 8 == 0,
                          name="quantize_dynamic_scaled_fp4fp8")
    grid, scalars = Q.launch_plan(spec, m, k, -(-m // 128))
    bindings = {"x": x.name, "data": data.name, "scales": scales.name,
                "tensor_sf": a["tensor_sf"], **scalars}
    return [(spec, grid, bindings)]


def _grouped_common(node: Node, spec: Any, rows: int, k: int, extra: dict[str, Any]
                    ) -> Launches:
    from blockscale.ops import quantize as Q

    data, scales = node.outputs
    if rows == 0 or k == 0:
        return []
    groups = node.inputs["expert_ids"].shape[0]
    grid, scalars = Q.launch_plan(spec, rows, k, node.attrs["num_tiles"])
    scalars.update(num_groups=groups, search_steps=_search_steps(groups), **extra)
    bindings = {"data": data.name, "scales": scales.name,
                "expert_start": node.inputs["expert_start"].name,
                "scales_offsets": node.inputs["scales_offsets"].name,
                "expert_ids": node.inputs["expert_ids"].name, **scalars}
    return [(spec, grid, bindings)]


@_planner("grouped_quantize_dynamic_scaled")
def _grouped_quantize(node: Node, target: str) -> Launches:
    from blockscale.ops import quantize as Q

    x, idx = node.inputs["x"], node.inputs["indices"]
    k = x.shape[1]
    rows = idx.shape[0] if idx is not None else x.shape[0]
    spec = Q.QuantizeSpec(node.attrs["fmt"].name, target, None, "tcgen5d", k % 8 == 0,
                          "grouped", gather=idx is not None,
                          name="grouped_quantize_dynamic_scaled")
    extra: dict[str, Any] = {}
    if idx is not None:
        extra["indices_divisor"] = node.attrs["indices_divisor"]
    launches = _grouped_common(node, spec, rows, k, extra)
    for _, _, b in launches:
        b.update(x=x.name, tensor_sf=node.inputs["tensor_sf"].name)
        if idx is not None:
            b["indices"] = idx.name
    return launches


@_planner("fused_silu_quantize")
def _silu(node: Node, target: str) -> Launches:
    from blockscale.ops import quantize as Q

    gu = node.inputs["gate_up"]
    act = node.attrs["activation"]
    t, d = gu.shape[0], gu.shape[1] // 2
    spec = Q.QuantizeSpec(node.attrs["fmt"].name, target, None, "tcgen5d", d % 8 == 0, "silu",
                          False, act.kind, float(act.alpha), float(act.limit),
                          name="fused_silu_quantize")
    launches = _grouped_common(node, spec, t, d, {})
    for _, _, b in launches:
        b.update(x=gu.name, tensor_sf=node.inputs["input_scales"].name)
    return launches


@_planner("block_scales_interleave")
def _interleave(node: Node, target: str) -> Launches:
    from blockscale.ops import interleave as IL

    s = node.inputs["scales_2d"]
    rows, kblocks = s.shape
    if rows == 0 or kblocks == 0:
        raise NotImplementedError("block_scales_interleave of an empty scale matrix in a graph")
    spec = IL.InterleaveSpec(s.dtype, target)
    plan = IL.launch_plan(rows, kblocks, input_aligned=True)
    bindings = {"scales": s.name, "out": node.outputs[0].name, "rows": plan.rows,
                "kblocks": plan.kblocks, "num_chunks": plan.num_chunks, "vec_ok": plan.vec_ok}
    return [(spec, plan.grid, bindings)]


def _dense(node: Node, target: str) -> Launches:
    from blockscale.ops import matmul as MM

    a = node.attrs
    at, bt = node.inputs["a"], node.inputs["b"]
    m, n = at.shape[0], bt.shape[0]
    if m == 0 or n == 0:
        return []
    spec = MM.MatmulSpec(a["fmt"].name, a["out_dtype"], "tcgen5d", None, target)
    bindings = {"a": at.name, "b": bt.name, "sfa": node.inputs["sfa"].name,
                "sfb": node.inputs["sfb"].name, "c": node.outputs[0].name, "m": m, "n": n,
                "k": a["k"], "alpha": a["alpha"]}
    return [(spec, MM.grid(m, n), bindings)]


_planner("naive_block_scaled_matmul")(_dense)
_planner("block_scaled_matmul")(_dense)


@_planner("grouped_matmul_block_scaled")
def _grouped_matmul(node: Node, target: str) -> Launches:
    from blockscale.ops import matmul_grouped as GM

    ins = node.inputs
    t, n = ins["a"].shape[0], ins["w"].shape[1]
    if t == 0 or n == 0:
        return []
    rs = ins.get("a_row_scales")
    spec = GM.GroupedMatmulSpec(node.attrs["fmt"].name, "tcgen5d", "bfloat16", rs is not None,
                                target)
    bindings = {name: ins[name].name for name in
                ("a", "w", "sfa", "sfb", "expert_start", "a_scale_offsets", "expert_ids",
                 "expert_scales")}
    if rs is not None:
        bindings["a_row_scales"] = rs.name
    bindings.update(c=node.outputs[0].name, t=t, n=n, k=node.attrs["k"],
                    num_groups=ins["expert_ids"].shape[0])
    return [(spec, GM.grid(t, n), bindings)]


@_planner("grouped_matmul_swiglu")
def _swiglu(node: Node, target: str) -> Launches:
    from blockscale.ops import matmul_swiglu as SW

    return SW.graph_launches(node, target)

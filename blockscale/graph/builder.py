"""The :class:`Graph` builder: inputs, constants, outputs and one method per op.

Op methods mirror :mod:`blockscale.ops` (same names, same argument order, no ``device`` /
``target``): quantize, grouped quantize, interleave, dense and grouped matmuls, fused SiLU
quantize and the fused grouped SwiGLU. Each checks its argument types when called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from blockscale import reference as ref
from blockscale.activations import GatedActivation
from blockscale.formats import Format
from blockscale.graph.core import (
    REFERENCE_EVALUATORS,
    Checker,
    Node,
    Tensor,
    check_name,
    dtype_name,
    reference_evaluator,
)
from blockscale.layouts import ROW_MAJOR, TCGEN_5D, ScaleLayout, scale_shape

__all__ = ["Graph"]


def _tiles(rows: int) -> int:
    return -(-rows // 128)


class Graph:
    """An op graph of typed tensors; see :mod:`blockscale.graph`.

    Args:
        name: the graph's name (the host function's symbol in :meth:`mlir`).
    """

    def __init__(self, name: str = "graph") -> None:
        self.name = check_name(name, "name")
        self.tensors: dict[str, Tensor] = {}
        self.inputs: list[Tensor] = []
        self.constants: dict[str, np.ndarray] = {}
        self.nodes: list[Node] = []
        self.outputs: dict[str, Tensor] = {}

    def __repr__(self) -> str:
        return (f"Graph({self.name}: {len(self.inputs)} inputs, {len(self.constants)} "
                f"constants, {len(self.nodes)} ops, outputs {list(self.outputs)})")

    # ---- values
    def _new(self, base: str, shape: tuple[int, ...], dtype: str, **kw: Any) -> Tensor:
        name, i = base, 1
        while name in self.tensors:
            name, i = f"{base}_{i}", i + 1
        t = Tensor(self, name, tuple(int(s) for s in shape), dtype, **kw)
        self.tensors[name] = t
        return t

    def input(self, name: str, shape: tuple[int, ...], dtype: Any, *, fmt: Format | str |
              None = None, layout: ScaleLayout | str | None = None, k: int | None = None
              ) -> Tensor:
        """A graph input. Quantized data needs ``fmt`` and ``k``; block scales ``fmt`` and
        ``layout``."""
        check_name(name, "name")
        if name in self.tensors:
            raise ValueError(f"name: a tensor called {name!r} already exists")
        kind, f, lay = "plain", None, None
        if fmt is not None:
            f = Format.from_name(fmt)
            kind = "scales" if layout is not None else "data"
            lay = ScaleLayout.parse(layout) if layout is not None else None
            if kind == "data" and k is None:
                raise ValueError(f"k: quantized data input {name!r} needs its logical k")
        t = self._new(name, tuple(shape), dtype_name(dtype), fmt=f, layout=lay, k=k, kind=kind)
        self.inputs.append(t)
        return t

    def constant(self, value: np.ndarray, name: str = "const", *, fmt: Format | str | None = None,
                 layout: ScaleLayout | str | None = None, k: int | None = None) -> Tensor:
        """A constant tensor holding a copy of ``value`` (typed like :meth:`input`)."""
        arr = np.ascontiguousarray(value)
        check_name(name, "name")
        kind, f, lay = "plain", None, None
        if fmt is not None:
            f = Format.from_name(fmt)
            kind = "scales" if layout is not None else "data"
            lay = ScaleLayout.parse(layout) if layout is not None else None
        t = self._new(name, arr.shape, dtype_name(arr.dtype), fmt=f, layout=lay, k=k, kind=kind)
        self.constants[t.name] = arr.copy()
        return t

    def output(self, t: Tensor, name: str | None = None) -> Tensor:
        """Mark ``t`` as a graph output called ``name`` (default: its tensor name)."""
        Checker("output").tensor(t, "t")
        if t.graph is not self:
            raise ValueError(f"output: tensor {t.name!r} belongs to another graph")
        name = check_name(name or t.name, "name")
        if name in self.outputs:
            raise ValueError(f"output: an output called {name!r} already exists")
        if t.name in self.constants or t in self.inputs:
            raise ValueError(f"output: {t.name!r} is an input or constant, not computed")
        self.outputs[name] = t
        return t

    def _arg(self, c: Checker, value: Any, arg: str, **typing: Any) -> Tensor:
        """A tensor argument: a Tensor of this graph, or a numpy array made a constant."""
        if isinstance(value, np.ndarray):
            return self.constant(value, f"{c.op.split('_')[0]}_{arg}", **typing)
        t = c.tensor(value, arg)
        if t.graph is not self:
            c.fail(arg, "a tensor of this graph", f"a tensor of graph {t.graph.name!r}")
        return t

    def _opt(self, c: Checker, value: Any, arg: str, **typing: Any) -> Tensor | None:
        return None if value is None else self._arg(c, value, arg, **typing)

    def _node(self, op: str, inputs: dict[str, Tensor | None], attrs: dict[str, Any],
              outputs: tuple[Tensor, ...]) -> Node:
        node = Node(op, inputs, attrs, outputs)
        self.nodes.append(node)
        return node

    def _groups(self, c: Checker, expert_start: Any, scales_offsets: Any, expert_ids: Any,
                offsets_arg: str = "scales_offsets") -> tuple[Tensor, Tensor, Tensor]:
        es = self._arg(c, _i32(expert_start), "expert_start")
        off = self._arg(c, _i32(scales_offsets), offsets_arg)
        ids = self._arg(c, _i32(expert_ids), "expert_ids")
        c.int_vector(es, "expert_start")
        c.int_vector(ids, "expert_ids", es.shape[0] - 1)
        c.int_vector(off, offsets_arg, es.shape[0] - 1)
        return es, off, ids

    def _per_expert(self, c: Checker, fmt: Format, value: Any, arg: str, n: int,
                    required: bool) -> Tensor:
        """A float32 per-expert vector; MX formats without one get ones (D9)."""
        if value is None:
            if required and not fmt.is_mx:
                c.fail(arg, f"a float32 [E] vector for {fmt.name}", "None")
            value = np.ones(max(1, n), np.float32)
        if isinstance(value, np.ndarray):
            value = value.astype(np.float32)
        t = self._arg(c, value, arg)
        c.dtype(t, arg, "float32")
        c.ndim(t, arg, 1)
        return t

    def _x(self, c: Checker, x: Any, arg: str = "x") -> Tensor:
        t = self._arg(c, x, arg)
        c.dtype(t, arg, "bfloat16")
        c.ndim(t, arg, 2)
        return t

    # ---- ops
    def quantize_dynamic_block_scaled(self, x: Any, fmt: Format | str, *, tensor_sf: float = 1.0,
                                      scale_rounding: str | None = None,
                                      scale_layout: ScaleLayout | str = TCGEN_5D
                                      ) -> tuple[Tensor, Tensor]:
        """Dense quantize (§2.1): ``(data, scales)`` of bf16 ``x [M, K]``."""
        c = Checker("quantize_dynamic_block_scaled")
        fmt = Format.from_name(fmt)
        xt = self._x(c, x)
        m, k = xt.shape
        fmt.check_k(k, "x.shape[1]")
        rounding = fmt.resolve_scale_rounding(scale_rounding)
        layout = ScaleLayout.parse(scale_layout)
        tsf = _finite_f32(c, tensor_sf, "tensor_sf")
        if not tsf > 0:
            c.fail("tensor_sf", "a finite float32 > 0", repr(tensor_sf))
        if fmt.is_mx and tsf != 1.0:
            c.fail("tensor_sf", f"1.0 for {fmt.name} (D9)", repr(tensor_sf))
        data = self._new("q_data", (m, fmt.data_cols(k)), fmt.elem_dtype.name, fmt=fmt, k=k,
                         kind="data")
        scales = self._new("q_scales", scale_shape(layout, m, fmt.kblocks(k)),
                           fmt.scale_dtype.name, fmt=fmt, layout=layout, k=k, kind="scales")
        self._node(c.op, {"x": xt}, {"fmt": fmt, "tensor_sf": tsf, "rounding": rounding,
                                     "layout": layout}, (data, scales))
        return data, scales

    def block_scales_interleave(self, scales_2d: Any) -> Tensor:
        """Row-major block scales ``[R, J]`` -> 5-D TCGEN layout (§3)."""
        c = Checker("block_scales_interleave")
        s = self._arg(c, scales_2d, "scales_2d")
        if s.kind != "scales":
            c.fail("scales_2d", "block scales", s.type_str())
        if s.layout is not ROW_MAJOR:
            c.fail("scales_2d", f"scale layout {ROW_MAJOR.value}", s.layout.value)
        c.ndim(s, "scales_2d", 2)
        out = self._new("scales_5d", scale_shape(TCGEN_5D, *s.shape), s.dtype, fmt=s.fmt,
                        layout=TCGEN_5D, k=s.k, kind="scales")
        self._node(c.op, {"scales_2d": s}, {}, (out,))
        return out

    def _dense_matmul(self, op: str, a: Any, b: Any, sfa: Any, sfb: Any, alpha: float,
                      out_dtype: str) -> Tensor:
        c = Checker(op)
        at = self._arg(c, a, "a")
        fmt = c.data(at, "a")
        bt = self._arg(c, b, "b", fmt=fmt, k=at.k)
        c.data(bt, "b", fmt)
        c.ndim(at, "a", 2)
        c.ndim(bt, "b", 2)
        if bt.shape[1] != at.shape[1]:
            c.fail("b", f"{at.shape[1]} columns (K-major, like a)", f"shape {bt.shape}")
        j = fmt.kblocks(at.k)
        sa = self._arg(c, sfa, "sfa", fmt=fmt, layout=TCGEN_5D, k=at.k)
        sb = self._arg(c, sfb, "sfb", fmt=fmt, layout=TCGEN_5D, k=at.k)
        c.scales(sa, "sfa", fmt, TCGEN_5D, scale_shape(TCGEN_5D, at.shape[0], j))
        c.scales(sb, "sfb", fmt, TCGEN_5D, scale_shape(TCGEN_5D, bt.shape[0], j))
        c.choice(out_dtype, "out_dtype", ("bfloat16", "float32"))
        out = self._new("c", (at.shape[0], bt.shape[0]), out_dtype)
        self._node(op, {"a": at, "b": bt, "sfa": sa, "sfb": sb},
                   {"fmt": fmt, "k": at.k, "alpha": _finite_f32(c, alpha, "alpha"),
                    "out_dtype": out_dtype}, (out,))
        return out

    def naive_block_scaled_matmul(self, a: Any, b: Any, sfa: Any, sfb: Any, *,
                                  alpha: float = 1.0, out_dtype: str = "bfloat16") -> Tensor:
        """Portable dense block-scaled matmul ``[M, N]`` (§4.2); 5-D scales."""
        return self._dense_matmul("naive_block_scaled_matmul", a, b, sfa, sfb, alpha, out_dtype)

    def block_scaled_matmul(self, a: Any, b: Any, sfa: Any, sfb: Any, *, alpha: float = 1.0,
                            out_dtype: str = "bfloat16") -> Tensor:
        """Dispatched dense block-scaled matmul ``[M, N]`` (§4.3); 5-D scales."""
        return self._dense_matmul("block_scaled_matmul", a, b, sfa, sfb, alpha, out_dtype)

    def grouped_quantize_dynamic_scaled(self, x: Any, fmt: Format | str, expert_start: Any,
                                        scales_offsets: Any, expert_ids: Any, tensor_sf: Any, *,
                                        indices: Any = None, indices_divisor: int = 1
                                        ) -> tuple[Tensor, Tensor]:
        """Per-expert quantize with padded scale tiles (§2.5, D11); ``tensor_sf``: float32
        ``[E]`` encode scales by expert id (NVFP4), None for MX."""
        c = Checker("grouped_quantize_dynamic_scaled")
        fmt = Format.from_name(fmt)
        xt = self._x(c, x)
        k = xt.shape[1]
        fmt.check_k(k, "x.shape[1]")
        es, off, ids = self._groups(c, expert_start, scales_offsets, expert_ids)
        tsf = self._per_expert(c, fmt, tensor_sf, "tensor_sf", ids.shape[0], True)
        rows = xt.shape[0]
        idx = None
        if indices is not None:
            idx = self._arg(c, _i32(indices), "indices")
            c.int_vector(idx, "indices")
            rows = idx.shape[0]
            if isinstance(indices_divisor, bool) or not isinstance(indices_divisor, int) \
                    or indices_divisor < 1:
                c.fail("indices_divisor", "a positive int", repr(indices_divisor))
        elif indices_divisor != 1:
            c.fail("indices_divisor", "1 without indices", repr(indices_divisor))
        tiles = _tiles(rows) + min(ids.shape[0], rows)
        data = self._new("gq_data", (rows, fmt.data_cols(k)), fmt.elem_dtype.name, fmt=fmt,
                         k=k, kind="data")
        scales = self._new("gq_scales", (tiles, -(-fmt.kblocks(k) // 4), 32, 4, 4),
                           fmt.scale_dtype.name, fmt=fmt, layout=TCGEN_5D, k=k, kind="scales")
        self._node(c.op, {"x": xt, "expert_start": es, "scales_offsets": off, "expert_ids": ids,
                          "tensor_sf": tsf, "indices": idx},
                   {"fmt": fmt, "indices_divisor": int(indices_divisor), "num_tiles": tiles},
                   (data, scales))
        return data, scales

    def fused_silu_quantize(self, gate_up: Any, fmt: Format | str, expert_start: Any,
                            scales_offsets: Any, expert_ids: Any, input_scales: Any, *,
                            activation: GatedActivation | str | None = None
                            ) -> tuple[Tensor, Tensor]:
        """Gated activation of bf16 ``gate_up [T, 2D]`` (concat layout) then per-expert
        quantize (§7.5); ``input_scales`` raw, by expert id (NVFP4)."""
        c = Checker("fused_silu_quantize")
        fmt = Format.from_name(fmt)
        act = GatedActivation.parse(activation)
        gu = self._x(c, gate_up, "gate_up")
        t, two_d = gu.shape
        if two_d % 2:
            c.fail("gate_up", "an even number of columns (gate then up)", f"shape {gu.shape}")
        d = two_d // 2
        fmt.check_k(d, "gate_up.shape[1] // 2")
        es, off, ids = self._groups(c, expert_start, scales_offsets, expert_ids)
        isc = self._per_expert(c, fmt, input_scales, "input_scales", ids.shape[0], True)
        tiles = _tiles(t) + ids.shape[0]
        data = self._new("silu_data", (t, fmt.data_cols(d)), fmt.elem_dtype.name, fmt=fmt, k=d,
                         kind="data")
        scales = self._new("silu_scales", (tiles, -(-fmt.kblocks(d) // 4), 32, 4, 4),
                           fmt.scale_dtype.name, fmt=fmt, layout=TCGEN_5D, k=d, kind="scales")
        self._node(c.op, {"gate_up": gu, "expert_start": es, "scales_offsets": off,
                          "expert_ids": ids, "input_scales": isc},
                   {"fmt": fmt, "activation": act, "num_tiles": tiles}, (data, scales))
        return data, scales

    def _grouped_operands(self, c: Checker, a: Any, w: Any, sfa: Any, sfb: Any,
                          expert_start: Any, a_scale_offsets: Any, expert_ids: Any,
                          expert_scales: Any) -> dict[str, Any]:
        at = self._arg(c, a, "a")
        fmt = c.data(at, "a")
        c.ndim(at, "a", 2)
        k = at.k
        wt = self._arg(c, w, "w", fmt=fmt, k=k)
        c.data(wt, "w", fmt)
        c.ndim(wt, "w", 3)
        if wt.shape[2] != at.shape[1]:
            c.fail("w", f"[E, N, {at.shape[1]}] (K-major, like a)", f"shape {wt.shape}")
        e, n = wt.shape[0], wt.shape[1]
        j4 = -(-fmt.kblocks(k) // 4)
        sa = self._arg(c, sfa, "sfa", fmt=fmt, layout=TCGEN_5D, k=k)
        c.scales(sa, "sfa", fmt, TCGEN_5D, (_tiles(at.shape[0]), j4, 32, 4, 4),
                 min_rows=_tiles(at.shape[0]))
        sb = self._arg(c, sfb, "sfb", fmt=fmt, layout=TCGEN_5D, k=k)
        c.scales(sb, "sfb", fmt, TCGEN_5D, (e, _tiles(n), j4, 32, 4, 4))
        es, off, ids = self._groups(c, expert_start, a_scale_offsets, expert_ids,
                                    "a_scale_offsets")
        esc = self._per_expert(c, fmt, expert_scales, "expert_scales", e, True)
        if esc.shape[0] < e and not fmt.is_mx:
            c.fail("expert_scales", f"length >= {e} (one per expert)", f"length {esc.shape[0]}")
        return {"a": at, "w": wt, "sfa": sa, "sfb": sb, "expert_start": es,
                "a_scale_offsets": off, "expert_ids": ids, "expert_scales": esc, "fmt": fmt,
                "k": k, "n": n}

    def _row_scales(self, c: Checker, fmt: Format, a_row_scales: Any, rows: int
                    ) -> Tensor | None:
        if a_row_scales is None:
            return None
        if not fmt.is_fp4 or fmt.is_mx:
            c.fail("a_row_scales", "None (row scales are NVFP4 only)", fmt.name)
        t = self._arg(c, a_row_scales, "a_row_scales")
        c.dtype(t, "a_row_scales", "bfloat16")
        c.shape(t, "a_row_scales", (rows,))
        return t

    def grouped_matmul_block_scaled(self, a: Any, w: Any, sfa: Any, sfb: Any, expert_start: Any,
                                    a_scale_offsets: Any, expert_ids: Any, expert_scales: Any,
                                    *, a_row_scales: Any = None) -> Tensor:
        """Grouped (MoE) block-scaled matmul, bf16 ``[T, N]`` (§5)."""
        c = Checker("grouped_matmul_block_scaled")
        p = self._grouped_operands(c, a, w, sfa, sfb, expert_start, a_scale_offsets, expert_ids,
                                   expert_scales)
        rs = self._row_scales(c, p["fmt"], a_row_scales, p["a"].shape[0])
        out = self._new("gmm", (p["a"].shape[0], p["n"]), "bfloat16")
        ins = {k: v for k, v in p.items() if isinstance(v, Tensor)}
        ins["a_row_scales"] = rs
        self._node(c.op, ins, {"fmt": p["fmt"], "k": p["k"]}, (out,))
        return out

    def grouped_matmul_swiglu(self, a: Any, w: Any, sfa: Any, sfb: Any, expert_start: Any,
                              a_scale_offsets: Any, expert_ids: Any, expert_scales: Any,
                              input_scales: Any, *,
                              activation: GatedActivation | str | None = None,
                              a_row_scales: Any = None) -> tuple[Tensor, Tensor]:
        """Fused grouped matmul + gated activation + quantize (§6) on σ-permuted weights."""
        c = Checker("grouped_matmul_swiglu")
        p = self._grouped_operands(c, a, w, sfa, sfb, expert_start, a_scale_offsets, expert_ids,
                                   expert_scales)
        fmt = p["fmt"]
        if fmt.is_mx and fmt.is_fp4:
            c.fail("a", "nvfp4 or mxfp8 data (§6)", "mxfp4 data")
        if p["n"] % 2:
            c.fail("w", "an even number of rows N = 2D", f"shape {p['w'].shape}")
        d = p["n"] // 2
        isc = self._per_expert(c, fmt, input_scales, "input_scales", p["w"].shape[0], True)
        rs = self._row_scales(c, fmt, a_row_scales, p["a"].shape[0])
        t = p["a"].shape[0]
        tiles = p["sfa"].shape[0]
        data = self._new("swiglu_data", (t, fmt.data_cols(d)), fmt.elem_dtype.name, fmt=fmt,
                         k=d, kind="data")
        scales = self._new("swiglu_scales", (tiles, -(-fmt.kblocks(d) // 4), 32, 4, 4),
                           fmt.scale_dtype.name, fmt=fmt, layout=TCGEN_5D, k=d, kind="scales")
        ins = {k: v for k, v in p.items() if isinstance(v, Tensor)}
        ins.update(input_scales=isc, a_row_scales=rs)
        self._node(c.op, ins, {"fmt": fmt, "k": p["k"], "activation": GatedActivation.parse(
            activation)}, (data, scales))
        return data, scales

    # ---- evaluation
    def evaluate(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the graph with the numpy reference (:mod:`blockscale.reference`) and return
        ``{output name: array}``; the specification every compiled run is compared with."""
        values = self.bind_inputs(inputs)
        for node in self.nodes:
            fn = REFERENCE_EVALUATORS[node.op]
            args = {k: (None if t is None else values[t.name]) for k, t in node.inputs.items()}
            outs = fn(node, args)
            for t, v in zip(node.outputs, outs):
                values[t.name] = np.asarray(v)
        return {name: values[t.name] for name, t in self.outputs.items()}

    def bind_inputs(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Check ``inputs`` (every graph input, right shape and dtype) and add the constants."""
        want = {t.name for t in self.inputs}
        if set(inputs) != want:
            raise ValueError(f"inputs: expected exactly {sorted(want)}, got {sorted(inputs)}")
        values: dict[str, np.ndarray] = dict(self.constants)
        for t in self.inputs:
            v = inputs[t.name]
            if tuple(v.shape) != t.shape:
                raise ValueError(f"inputs[{t.name!r}]: expected shape {t.shape}, got "
                                 f"{tuple(v.shape)}")
            if np.dtype(v.dtype) != t.np_dtype:
                raise TypeError(f"inputs[{t.name!r}]: expected dtype {t.dtype}, got {v.dtype}")
            values[t.name] = v
        return values

    # ---- lowering (see blockscale.graph.lowering)
    def mlir(self, target: str = "sm_90a") -> str:
        """One MLIR module: a host ``func.func`` of memref allocations and
        ``gpu.launch_func`` ops plus the ``gpu.module`` of every kernel (needs MLIR)."""
        from blockscale.graph import lowering

        return lowering.graph_mlir(self, target)

    def plan(self, target: str = "sm_90a") -> Any:
        """The launch plan (buffers and kernel launches with their specs); no MLIR needed."""
        from blockscale.graph import lowering

        return lowering.plan_graph(self, target)

    def compile(self, target: str = "sm_90a", *, keep_asm: bool = False) -> Any:
        """A runtime :class:`~blockscale.runtime.program.Program` for ``target``; constants
        are stored in it (see :func:`blockscale.graph.run_program`). ``keep_asm``: also keep
        every kernel's compiled stages (``program.asm[kernel key][stage]``)."""
        from blockscale.graph import lowering

        return lowering.compile_graph(self, target, keep_asm=keep_asm)

    def run(self, inputs: Mapping[str, np.ndarray], *, device: Any = None,
            target: str | None = None) -> dict[str, Any]:
        """Compile for ``target`` (default: the device's) and run on ``device``."""
        from blockscale.graph import lowering

        return lowering.run_graph(self, inputs, device=device, target=target)

    def summary(self) -> str:
        """A readable listing: inputs, constants, ops with their operand and result types."""
        lines = [f"graph @{self.name}"]
        for t in self.inputs:
            lines.append(f"  input    %{t.name}: {t.type_str()}")
        for name in self.constants:
            lines.append(f"  constant %{name}: {self.tensors[name].type_str()}")
        for n in self.nodes:
            ins = ", ".join(f"%{t.name}" for t in n.inputs.values() if t is not None)
            outs = ", ".join(f"%{t.name}: {t.type_str()}" for t in n.outputs)
            lines.append(f"  {outs} = {n.op}({ins})")
        for name, t in self.outputs.items():
            lines.append(f"  output   {name} = %{t.name}")
        return "\n".join(lines)


def _finite_f32(c: Checker, v: Any, arg: str) -> float:
    """A finite float32 scalar attribute (NaN / Inf / non-numbers raise, naming ``arg``)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
        c.fail(arg, "a number", type(v).__name__, TypeError)
    f = float(np.float32(v))
    if not np.isfinite(f):
        c.fail(arg, "a finite float32", repr(v))
    return f


def _i32(v: Any) -> Any:
    """Host integer vectors become int32 (the kernels' index type)."""
    if isinstance(v, np.ndarray) and v.dtype != np.int32:
        return v.astype(np.int32)
    return v


# ----------------------------------------------------------------------------- reference


@reference_evaluator("quantize_dynamic_block_scaled")
def _ref_quantize(node: Node, v: dict[str, Any]) -> tuple[np.ndarray, ...]:
    a = node.attrs
    return ref.quantize_dynamic_block_scaled(v["x"], a["fmt"], tensor_sf=a["tensor_sf"],
                                             scale_rounding=a["rounding"],
                                             scale_layout=a["layout"])


@reference_evaluator("block_scales_interleave")
def _ref_interleave(node: Node, v: dict[str, Any]) -> tuple[np.ndarray, ...]:
    return (ref.block_scales_interleave(v["scales_2d"]),)


def _ref_dense(node: Node, v: dict[str, Any]) -> tuple[np.ndarray, ...]:
    a = node.attrs
    return (ref.naive_block_scaled_matmul(v["a"], v["b"], v["sfa"], v["sfb"], a["fmt"], k=a["k"],
                                          alpha=a["alpha"], out_dtype=a["out_dtype"]),)


reference_evaluator("naive_block_scaled_matmul")(_ref_dense)
reference_evaluator("block_scaled_matmul")(_ref_dense)


def _tsf_or_none(node: Node, vec: np.ndarray) -> np.ndarray | None:
    return None if node.attrs["fmt"].is_mx else vec


@reference_evaluator("grouped_quantize_dynamic_scaled")
def _ref_grouped_quantize(node: Node, v: dict[str, Any]) -> tuple[np.ndarray, ...]:
    a = node.attrs
    return ref.grouped_quantize_dynamic_scaled(
        v["x"], a["fmt"], v["expert_start"], v["scales_offsets"], v["expert_ids"],
        _tsf_or_none(node, v["tensor_sf"]), indices=v["indices"],
        indices_divisor=a["indices_divisor"] if v["indices"] is not None else 1)


@reference_evaluator("fused_silu_quantize")
def _ref_silu(node: Node, v: dict[str, Any]) -> tuple[np.ndarray, ...]:
    a = node.attrs
    return ref.fused_silu_quantize(v["gate_up"], a["fmt"], v["expert_start"], v["scales_offsets"],
                                   v["expert_ids"], _tsf_or_none(node, v["input_scales"]),
                                   activation=a["activation"], num_scale_tiles=a["num_tiles"])


@reference_evaluator("grouped_matmul_block_scaled")
def _ref_grouped_matmul(node: Node, v: dict[str, Any]) -> tuple[np.ndarray, ...]:
    a = node.attrs
    return (ref.grouped_matmul_block_scaled(
        v["a"], v["w"], v["sfa"], v["sfb"], v["expert_start"], v["a_scale_offsets"],
        v["expert_ids"], v["expert_scales"], a["fmt"], k=a["k"],
        a_row_scales=v["a_row_scales"]),)


@reference_evaluator("grouped_matmul_swiglu")
def _ref_swiglu(node: Node, v: dict[str, Any]) -> tuple[np.ndarray, ...]:
    a = node.attrs
    return ref.grouped_matmul_swiglu(
        v["a"], v["w"], v["sfa"], v["sfb"], v["expert_start"], v["a_scale_offsets"],
        v["expert_ids"], v["expert_scales"], _tsf_or_none(node, v["input_scales"]), a["fmt"],
        k=a["k"], activation=a["activation"], a_row_scales=v["a_row_scales"])


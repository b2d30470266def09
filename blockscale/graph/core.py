"""Typed tensors and the op graph: construction, type checks, reference evaluation.

A :class:`Graph` holds named :class:`Tensor` values (dtype, shape and, for quantized data and
block scales, the :class:`~blockscale.formats.Format` and the
:class:`~blockscale.layouts.ScaleLayout`) and :class:`Node` s, one per op call. Every op method
has the name and arguments of the :mod:`blockscale.ops` function it stands for; it checks its
arguments' types when it is called (a format or scale-layout mismatch raises at graph-build
time, naming the op and the argument) and returns output tensors.

Numpy arrays passed where a tensor is expected become *constants* of the graph (weights,
per-expert scale vectors); they travel with the compiled program (see
:mod:`blockscale.graph.lowering`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from blockscale.dtypes import np_dtype
from blockscale.formats import Format
from blockscale.layouts import ScaleLayout

__all__ = ["GraphTypeError", "Node", "Tensor", "dtype_name", "np_dtype"]

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: element dtypes a graph tensor may have (launch.BUFFER_DTYPES minus int8/uint32/int64)
DTYPES = ("uint8", "int32", "float32", "bfloat16", "float8_e4m3fn", "float8_e8m0fnu")


class GraphTypeError(ValueError):
    """A type mismatch found while building a graph (a ValueError)."""


def dtype_name(dtype: Any) -> str:
    """The canonical name of a numpy / ml_dtypes dtype (or name)."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in DTYPES:
        raise TypeError(f"dtype must be one of {DTYPES}, got {name!r}")
    return name


@dataclasses.dataclass(frozen=True, eq=False)
class Tensor:
    """A value of a graph.

    Attributes:
        graph: the owning graph.
        name: unique within the graph.
        shape: static shape.
        dtype: element dtype name (see ``DTYPES``).
        fmt: the format of quantized data or block scales, else None.
        layout: the layout of block scales (``ROW_MAJOR`` / ``TCGEN_5D``), else None.
        k: logical K of quantized data (columns before FP4 packing) or of block scales.
        kind: "plain", "data" (quantized payload) or "scales".
    """

    graph: Any
    name: str
    shape: tuple[int, ...]
    dtype: str
    fmt: Format | None = None
    layout: ScaleLayout | None = None
    k: int | None = None
    kind: str = "plain"

    @property
    def np_dtype(self) -> np.dtype:
        return np_dtype(self.dtype)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.np_dtype.itemsize

    def type_str(self) -> str:
        """e.g. ``uint8[64, 64] nvfp4 data (k=128)`` or ``float8_e4m3fn[1, 1, 32, 4, 4]
        nvfp4 scales tcgen5d``."""
        s = f"{self.dtype}[{', '.join(map(str, self.shape))}]"
        if self.kind == "data":
            s += f" {self.fmt.name} data (k={self.k})"
        elif self.kind == "scales":
            s += f" {self.fmt.name} scales {self.layout.value}"
        return s

    def __repr__(self) -> str:
        return f"Tensor({self.name}: {self.type_str()})"


@dataclasses.dataclass(frozen=True, eq=False)
class Node:
    """One op call: ``op`` (the blockscale.ops name), named input tensors, attributes, outputs."""

    op: str
    inputs: dict[str, Tensor | None]
    attrs: dict[str, Any]
    outputs: tuple[Tensor, ...]


class Checker:
    """Argument checks of one op call; every error names the op and the argument."""

    def __init__(self, op: str) -> None:
        self.op = op

    def fail(self, arg: str, expected: str, got: str, exc: type = GraphTypeError) -> None:
        raise exc(f"{self.op}: argument {arg!r} expects {expected}, got {got}")

    def tensor(self, t: Any, arg: str) -> Tensor:
        if not isinstance(t, Tensor):
            self.fail(arg, "a graph Tensor", type(t).__name__, TypeError)
        return t

    def dtype(self, t: Tensor, arg: str, *dtypes: str) -> None:
        if t.dtype not in dtypes:
            self.fail(arg, f"dtype {' or '.join(dtypes)}", t.dtype, TypeError)

    def ndim(self, t: Tensor, arg: str, ndim: int) -> None:
        if len(t.shape) != ndim:
            self.fail(arg, f"rank {ndim}", f"shape {t.shape}")

    def shape(self, t: Tensor, arg: str, shape: tuple[int, ...]) -> None:
        if tuple(t.shape) != tuple(shape):
            self.fail(arg, f"shape {tuple(shape)}", f"shape {t.shape}")

    def data(self, t: Tensor, arg: str, fmt: Format | None = None) -> Format:
        if t.kind != "data":
            self.fail(arg, "quantized data", t.type_str())
        if fmt is not None and t.fmt is not fmt:
            self.fail(arg, f"format {fmt.name}", t.fmt.name)
        return t.fmt  # type: ignore[return-value]

    def scales(self, t: Tensor, arg: str, fmt: Format, layout: ScaleLayout,
               shape: tuple[int, ...] | None = None, min_rows: int | None = None) -> None:
        if t.kind != "scales":
            self.fail(arg, f"{fmt.name} block scales", t.type_str())
        if t.fmt is not fmt:
            self.fail(arg, f"{fmt.name} scales", f"{t.fmt.name} scales")
        if t.layout is not layout:
            self.fail(arg, f"scale layout {layout.value}", t.layout.value)
        if shape is not None and tuple(t.shape) != tuple(shape) and (
                min_rows is None or len(t.shape) != len(shape) or t.shape[1:] != shape[1:]
                or t.shape[0] < min_rows):
            self.fail(arg, f"shape {tuple(shape)}", f"shape {t.shape}")

    def int_vector(self, t: Tensor, arg: str, length: int | None = None) -> None:
        self.dtype(t, arg, "int32")
        self.ndim(t, arg, 1)
        if length is not None and t.shape[0] != length:
            self.fail(arg, f"length {length}", f"length {t.shape[0]}")

    def choice(self, value: Any, arg: str, choices: tuple[Any, ...]) -> None:
        if value not in choices:
            self.fail(arg, f"one of {list(choices)}", repr(value))


def check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"{what} must be an identifier ([A-Za-z_][A-Za-z0-9_]*), got {name!r}")
    return name


#: op name -> reference evaluator ``fn(node, values: dict[str, np.ndarray | None]) -> tuple``
REFERENCE_EVALUATORS: dict[str, Callable[[Node, dict[str, Any]], tuple[np.ndarray, ...]]] = {}


def reference_evaluator(op: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the numpy reference evaluation of graph op ``op``."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        REFERENCE_EVALUATORS[op] = fn
        return fn
    return deco

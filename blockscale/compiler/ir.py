"""Small builder helpers over the upstream MLIR Python bindings.

Kernels are written as explicit builder calls (no AST rewriting). The helpers follow the
upstream ``scf.py`` / Mosaic GPU style:

* every helper returns ``ir.Value`` (or a tuple of them) and takes keyword-only ``loc=None``;
  by default the location is the *caller's* Python line (``ir.Location.file``), so dumps and
  verifier errors point at ``blockscale/ops/*.py``;
* region ops are built with ``with ir.InsertionPoint(block):`` and end with an explicit
  ``scf.yield``; loops and ifs with results take explicit types / initial values;
* MLIR types are functions (created in the current context), never module globals.

Entry point for a kernel::

    with kernel_module("copy", target, args, block=(256, 1, 1)) as k:
        i = global_thread_idx(k)
        with when(ult(i, k.arg("n"))):
            store(load(k.arg("src"), i), k.arg("dst"), i)
    module = k.module
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from mlir import ir
from mlir.dialects import arith, gpu, memref, scf, vector

from blockscale.compiler.ir_types import (  # noqa: F401 - re-exported
    _loc,
    bf16,
    buffer_element_type,
    caller_location,
    f16,
    f32,
    i1,
    i8,
    i16,
    i32,
    i64,
    index,
    is_float,
    is_index,
    is_integer,
    kernel_arg_type,
    memref_1d,
    scalar_type,
    vec,
)
from blockscale.compiler.targets import GPUTarget
from blockscale.launch import KernelArg

Value = ir.Value

# ----------------------------------------------------------------------------- constants, casts


def const(value: float | bool, type: ir.Type | None = None, *,
          loc: ir.Location | None = None) -> Value:
    """``arith.constant`` of ``value``; type defaults to index (int/bool) or f32 (float).

    A vector type gives a splat constant.
    """
    if type is None:
        type = f32() if isinstance(value, float) else index()
    with _loc(loc):
        if isinstance(type, ir.VectorType):
            elem = ir.VectorType(type).element_type
            attr = ir.DenseElementsAttr.get_splat(type, _scalar_attr(value, elem))
            return arith.constant(type, attr)
        return arith.constant(type, _scalar_attr(value, type))


def i32_bits(v: int, *, loc: ir.Location | None = None) -> Value:
    """An i32 constant of ``v``: a signed value or a 32-bit pattern (-2^31 <= v < 2^32; masks
    such as 0x80808080 and PRMT tables: MLIR's i32 attribute takes the signed value)."""
    if not -(1 << 31) <= v < 1 << 32:
        raise ValueError(f"i32_bits: v must be in [-2^31, 2^32), got {v}")
    return const(v - (1 << 32) if v >= 1 << 31 else v, i32(), loc=loc)


def _scalar_attr(value: float | bool, type: ir.Type) -> ir.Attribute:
    if is_float(type):
        return ir.FloatAttr.get(type, float(value))
    if is_integer(type) or is_index(type):
        return ir.IntegerAttr.get(type, int(value))
    raise TypeError(f"const: type must be an integer, index or float type, got {type}")


def to_value(x: Value | float, type: ir.Type | None = None) -> Value:
    """A Value as is, or a Python number as a constant of ``type`` (default index / f32)."""
    if isinstance(x, Value):
        return x
    if isinstance(x, bool | int | float):
        return const(x, type, loc=caller_location())
    raise TypeError(f"expected an ir.Value or a Python number, got {type(x).__name__}")


def _int_width(t: ir.Type) -> int:
    return 64 if is_index(t) else ir.IntegerType(t).width


def cast_int(v: Value, to: ir.Type, *, signed: bool = False,
             loc: ir.Location | None = None) -> Value:
    """Integer/index conversion: index_cast(ui), extsi/extui or trunci as widths require."""
    src = v.type
    if src == to:
        return v
    with _loc(loc):
        if is_index(src) or is_index(to):
            return arith.index_cast(to, v) if signed else arith.index_castui(to, v)
        sw, dw = _int_width(src), _int_width(to)
        if dw > sw:
            return arith.extsi(to, v) if signed else arith.extui(to, v)
        return arith.trunci(to, v)


def as_index(v: Value | int, *, loc: ir.Location | None = None) -> Value:
    """Unsigned cast of an integer to index (constants pass through)."""
    if isinstance(v, int):
        return const(v, index(), loc=_loc(loc))
    return cast_int(v, index(), loc=_loc(loc))


def as_i32(v: Value | int, *, loc: ir.Location | None = None) -> Value:
    if isinstance(v, int):
        return const(v, i32(), loc=_loc(loc))
    return cast_int(v, i32(), loc=_loc(loc))


def as_i64(v: Value | int, *, loc: ir.Location | None = None) -> Value:
    if isinstance(v, int):
        return const(v, i64(), loc=_loc(loc))
    return cast_int(v, i64(), loc=_loc(loc))


def bitcast(v: Value, to: ir.Type, *, loc: ir.Location | None = None) -> Value:
    """Same-width reinterpretation: ``arith.bitcast`` for scalars, ``vector.bitcast`` for
    vectors (whose total bit width must match, e.g. vector<16xi8> <-> vector<4xi32>)."""
    with _loc(loc):
        if isinstance(v.type, ir.VectorType) and isinstance(to, ir.VectorType):
            return vector.bitcast(to, v)
        return arith.bitcast(to, v)


# ----------------------------------------------------------------------------- arithmetic

def _binary(op: Callable[..., Value], a: Value | int, b: Value | int,
            loc: ir.Location | None) -> Value:
    if not isinstance(a, Value) and not isinstance(b, Value):
        raise TypeError("at least one operand must be an ir.Value")
    ty = a.type if isinstance(a, Value) else b.type
    with _loc(loc):
        a = a if isinstance(a, Value) else const(a, ty)
        b = b if isinstance(b, Value) else const(b, ty)
        return op(a, b)


def add(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    """``arith.addi`` (ints may be Python numbers, taking the other operand's type)."""
    return _binary(arith.addi, a, b, _loc(loc))


def sub(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    return _binary(arith.subi, a, b, _loc(loc))


def mul(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    return _binary(arith.muli, a, b, _loc(loc))


def udiv(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    return _binary(arith.divui, a, b, _loc(loc))


def urem(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    return _binary(arith.remui, a, b, _loc(loc))


def ceil_div(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    """Unsigned ceil(a / b) as (a + b - 1) / b."""
    loc = _loc(loc)
    return udiv(sub(add(a, b, loc=loc), 1, loc=loc), b, loc=loc)


def umin(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    return _binary(arith.minui, a, b, _loc(loc))


def umax(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    return _binary(arith.maxui, a, b, _loc(loc))


def shl(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    return _binary(arith.shli, a, b, _loc(loc))


def shru(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    return _binary(arith.shrui, a, b, _loc(loc))


def bit_and(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    return _binary(arith.andi, a, b, _loc(loc))


def bit_or(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    return _binary(arith.ori, a, b, _loc(loc))


def _cmp(pred: arith.CmpIPredicate, a: Value | int, b: Value | int,
         loc: ir.Location) -> Value:
    return _binary(lambda x, y: arith.cmpi(pred, x, y), a, b, loc)


def ult(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    """Unsigned ``a < b`` (i1)."""
    return _cmp(arith.CmpIPredicate.ult, a, b, _loc(loc))


def ule(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    return _cmp(arith.CmpIPredicate.ule, a, b, _loc(loc))


def eq(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    return _cmp(arith.CmpIPredicate.eq, a, b, _loc(loc))


def ne(a: Value | int, b: Value | int, *, loc: ir.Location | None = None) -> Value:
    return _cmp(arith.CmpIPredicate.ne, a, b, _loc(loc))


def logical_and(a: Value, b: Value, *, loc: ir.Location | None = None) -> Value:
    with _loc(loc):
        return arith.andi(a, b)


def select(cond: Value, a: Value | float, b: Value | float, *,
           loc: ir.Location | None = None) -> Value:
    """``arith.select``; a Python number takes the other operand's type."""
    ty = a.type if isinstance(a, Value) else b.type
    with _loc(loc):
        a = a if isinstance(a, Value) else const(a, ty)
        b = b if isinstance(b, Value) else const(b, ty)
        return arith.select(cond, a, b)


# ----------------------------------------------------------------------------- memory


def load(buf: Value, idx: Value | int, *, loc: ir.Location | None = None) -> Value:
    """``memref.load buf[idx]`` (idx cast to index)."""
    with _loc(loc):
        return memref.load(buf, [as_index(idx)])


def store(value: Value, buf: Value, idx: Value | int, *, loc: ir.Location | None = None) -> None:
    """``memref.store value, buf[idx]``."""
    with _loc(loc):
        memref.store(value, buf, [as_index(idx)])


def vector_load(vec_type: ir.Type, buf: Value, idx: Value | int, *, alignment: int = 0,
                loc: ir.Location | None = None) -> Value:
    """``vector.load`` of ``vec_type`` from ``buf[idx:]``; ``alignment`` in bytes (0 = element
    alignment) lets the backend emit wide accesses (``ld.global.v4.u32``,
    ``global_load_dwordx4``). The caller guarantees the alignment."""
    with _loc(loc):
        op = vector.LoadOp(vec_type, buf, [as_index(idx)])
        if alignment:
            op.attributes["alignment"] = ir.IntegerAttr.get(i64(), alignment)
        return op.result


def vector_store(value: Value, buf: Value, idx: Value | int, *, alignment: int = 0,
                 loc: ir.Location | None = None) -> None:
    """``vector.store`` of ``value`` to ``buf[idx:]``; see :func:`vector_load` for alignment."""
    with _loc(loc):
        op = vector.StoreOp(value, buf, [as_index(idx)])
        if alignment:
            op.attributes["alignment"] = ir.IntegerAttr.get(i64(), alignment)


def from_elements(vec_type: ir.Type, elems: Sequence[Value], *,
                  loc: ir.Location | None = None) -> Value:
    """``vector.from_elements``."""
    with _loc(loc):
        return vector.from_elements(vec_type, list(elems))


def extract(v: Value, position: int, *, loc: ir.Location | None = None) -> Value:
    """``vector.extract v[position]`` (static position)."""
    with _loc(loc):
        return vector.extract(v, [], [position])


# ----------------------------------------------------------------------------- control flow


@dataclasses.dataclass
class Loop:
    """A ``scf.for`` under construction: ``iv``, ``carried`` (block args) and, after the
    ``with`` block, ``results``. End the body with :meth:`yield_` when there are carried
    values (a loop without carried values gets its empty yield automatically)."""

    op: Any
    iv: Value
    carried: tuple[Value, ...]
    _yielded: bool = False

    def yield_(self, *values: Value, loc: ir.Location | None = None) -> None:
        """``scf.yield`` the next carried values (count and types must match)."""
        if len(values) != len(self.carried):
            raise ValueError(f"yield_: expected {len(self.carried)} values, got {len(values)}")
        with _loc(loc):
            scf.yield_(list(values))
        self._yielded = True

    @property
    def results(self) -> tuple[Value, ...]:
        return tuple(self.op.results)


@contextlib.contextmanager
def for_range(lower: Value | int, upper: Value | int, step: Value | int = 1, *,
              carry: Sequence[Value] = (), loc: ir.Location | None = None) -> Iterator[Loop]:
    """``scf.for`` over index range [lower, upper) with ``step`` and loop-carried ``carry``.

    ::

        with for_range(0, n, carry=[acc0]) as loop:
            loop.yield_(add(loop.carried[0], loop.iv))
        total = loop.results[0]
    """
    loc = _loc(loc)
    with loc:
        lb, ub, st = (as_index(x) for x in (lower, upper, step))
        op = scf.ForOp(lb, ub, st, list(carry))
    loop = Loop(op, op.induction_variable, tuple(op.inner_iter_args))
    with ir.InsertionPoint(op.body), loc:
        yield loop
        if not loop._yielded:
            if loop.carried:
                raise ValueError("for_range: a loop with carried values must end with "
                                 "loop.yield_(...)")
            scf.yield_([])


def fori(lower: Value | int, upper: Value | int, step: Value | int = 1, *,
         carry: Sequence[Value] = ()) -> Callable[[Callable[..., Any]], tuple[Value, ...]]:
    """Decorator form of :func:`for_range` (Mosaic ``fori``): the body ``f(iv, *carried)``
    returns the next carried values (a Value, a sequence, or None); the decorated name is
    bound to the loop results."""
    loc = caller_location()

    def wrap(body: Callable[..., Any]) -> tuple[Value, ...]:
        with for_range(lower, upper, step, carry=carry, loc=loc) as loop:
            out = body(loop.iv, *loop.carried)
            if loop.carried:
                out = (out,) if isinstance(out, Value) else tuple(out)
                loop.yield_(*out, loc=loc)
        return loop.results

    return wrap


class IfBuilder:
    """An ``scf.if`` with results: fill ``then()`` and ``else_()``, each ending in
    ``yield_``; read ``results`` afterwards."""

    def __init__(self, cond: Value, result_types: Sequence[ir.Type], loc: ir.Location):
        self._loc = loc
        with loc:
            self.op = scf.IfOp(cond, list(result_types), has_else=True)

    @contextlib.contextmanager
    def then(self) -> Iterator[IfBuilder]:
        with ir.InsertionPoint(self.op.then_block), self._loc:
            yield self

    @contextlib.contextmanager
    def else_(self) -> Iterator[IfBuilder]:
        with ir.InsertionPoint(self.op.else_block), self._loc:
            yield self

    def yield_(self, *values: Value, loc: ir.Location | None = None) -> None:
        with _loc(loc):
            scf.yield_(list(values))

    @property
    def results(self) -> tuple[Value, ...]:
        return tuple(self.op.results)


def if_(cond: Value, result_types: Sequence[ir.Type], *,
        loc: ir.Location | None = None) -> IfBuilder:
    """``scf.if`` with results (and an else region)::

        br = if_(cond, [i32()])
        with br.then():
            br.yield_(a)
        with br.else_():
            br.yield_(b)
        (x,) = br.results
    """
    return IfBuilder(cond, result_types, _loc(loc))


@contextlib.contextmanager
def when(cond: Value, *, loc: ir.Location | None = None) -> Iterator[None]:
    """``scf.if`` without results or else region: the body runs where ``cond`` holds."""
    loc = _loc(loc)
    with loc:
        op = scf.IfOp(cond, [], has_else=False)
    with ir.InsertionPoint(op.then_block), loc:
        yield
        scf.yield_([])


# ----------------------------------------------------------------------------- kernel module


_DIMS = {"x": gpu.Dimension.x, "y": gpu.Dimension.y, "z": gpu.Dimension.z}


def _dim(d: str) -> Any:
    try:
        return _DIMS[d]
    except KeyError:
        raise ValueError(f"dim must be 'x', 'y' or 'z', got {d!r}") from None


@dataclasses.dataclass
class KernelBuilder:
    """What :func:`kernel_module` yields: the module being built and its kernel function."""

    name: str
    target: GPUTarget
    args: tuple[KernelArg, ...]
    block: tuple[int, int, int]
    module: ir.Module
    func: Any
    values: dict[str, Value]

    def arg(self, name: str) -> Value:
        """The gpu.func argument of the KernelArg called ``name``."""
        try:
            return self.values[name]
        except KeyError:
            raise ValueError(f"kernel {self.name!r} has no argument {name!r}; "
                             f"arguments: {list(self.values)}") from None

    @property
    def num_threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


def _normalize_block(block: int | Sequence[int]) -> tuple[int, int, int]:
    dims = (block,) if isinstance(block, int) else tuple(block)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and d >= 1 for d in dims):
        raise ValueError(f"block must be 1 to 3 positive ints, got {block!r}")
    dims = dims + (1,) * (3 - len(dims))
    if dims[0] * dims[1] * dims[2] > 1024:
        raise ValueError(f"block must have at most 1024 threads, got {dims}")
    return dims  # type: ignore[return-value]


@contextlib.contextmanager
def kernel_module(name: str, target: GPUTarget | str, args: Sequence[KernelArg],
                  block: int | Sequence[int], *,
                  context: ir.Context | None = None) -> Iterator[KernelBuilder]:
    """Build ``module {gpu.container_module}`` holding ``gpu.module @name [target]`` with one
    ``gpu.func @name kernel`` whose parameters follow ``args`` (buffers as ``memref<?xT>``,
    scalars as i32/i64/f32) and whose ``known_block_size`` is ``block``.

    Inside the ``with`` the insertion point is the kernel body and the location is the
    caller's line; ``gpu.return`` is added on exit. Uses the active ``ir.Context`` or
    ``context``, else creates one (the module keeps it alive).
    """
    target = GPUTarget.parse(target)
    block3 = _normalize_block(block)
    args = tuple(args)
    for a in args:
        if not isinstance(a, KernelArg):
            raise TypeError(f"args must be KernelArg objects, got {type(a).__name__}")
    names = [a.name for a in args]
    if len(set(names)) != len(names):
        raise ValueError(f"args must have unique names, got {names}")
    if context is None:
        context = ir.Context.current or ir.Context()
    loc = caller_location(context=context)
    with context, loc:
        module = ir.Module.create()
        module.operation.attributes["gpu.container_module"] = ir.UnitAttr.get()
        with ir.InsertionPoint(module.body):
            gmod = gpu.GPUModuleOp(name, targets=ir.ArrayAttr.get([target.target_attr()]))
            gmod.regions[0].blocks.append()
        with ir.InsertionPoint(gmod.regions[0].blocks[0]):
            ftype = ir.FunctionType.get([kernel_arg_type(a) for a in args], [])
            func = gpu.GPUFuncOp(ftype, sym_name=name, kernel=True, known_block_size=list(block3))
            entry = func.add_entry_block()
        values = dict(zip(names, entry.arguments))
        kb = KernelBuilder(name, target, args, block3, module, func, values)
        with ir.InsertionPoint(entry), _BUILDERS.push(kb):
            yield kb
            gpu.ReturnOp([])


class _BuilderStack:
    """The kernel builders being built (innermost last), for helpers needing the block size."""

    def __init__(self) -> None:
        self.stack: list[KernelBuilder] = []

    @contextlib.contextmanager
    def push(self, kb: KernelBuilder) -> Iterator[None]:
        self.stack.append(kb)
        try:
            yield
        finally:
            self.stack.pop()

    def current(self) -> KernelBuilder:
        if not self.stack:
            raise RuntimeError("no kernel is being built: use inside `with kernel_module(...)`")
        return self.stack[-1]


_BUILDERS = _BuilderStack()


def current_kernel() -> KernelBuilder:
    """The innermost kernel under construction."""
    return _BUILDERS.current()


# ----------------------------------------------------------------------------- thread ids


def thread_idx(dim: str = "x", *, loc: ir.Location | None = None) -> Value:
    """``gpu.thread_id`` (index)."""
    with _loc(loc):
        return gpu.thread_id(_dim(dim))


def block_idx(dim: str = "x", *, loc: ir.Location | None = None) -> Value:
    """``gpu.block_id`` (index)."""
    with _loc(loc):
        return gpu.block_id(_dim(dim))


def grid_dim(dim: str = "x", *, loc: ir.Location | None = None) -> Value:
    """``gpu.grid_dim`` (index): number of blocks in the launch."""
    with _loc(loc):
        return gpu.grid_dim(_dim(dim))


def block_dim(dim: str = "x", *, loc: ir.Location | None = None) -> Value:
    """The block size along ``dim`` as an index *constant* from ``known_block_size``.

    A constant rather than ``gpu.block_dim``: on ROCDL the latter becomes a call to
    ``__ockl_get_local_size`` from the ROCm device libraries, which we do not link.
    """
    _dim(dim)  # validates
    return const(current_kernel().block["xyz".index(dim)], index(), loc=_loc(loc))


def linear_thread_idx(*, loc: ir.Location | None = None) -> Value:
    """Flat thread index within the block: x + bx * (y + by * z)."""
    loc = _loc(loc)
    bx, by, _ = current_kernel().block
    tid = thread_idx("x", loc=loc)
    if by == 1 and current_kernel().block[2] == 1:
        return tid
    yz = add(thread_idx("y", loc=loc), mul(thread_idx("z", loc=loc), by, loc=loc), loc=loc)
    return add(tid, mul(yz, bx, loc=loc), loc=loc)


def global_thread_idx(*, loc: ir.Location | None = None) -> Value:
    """``block_idx.x * block_dim.x + thread_idx.x`` (index), for 1-D launches."""
    loc = _loc(loc)
    return add(mul(block_idx("x", loc=loc), block_dim("x", loc=loc), loc=loc),
               thread_idx("x", loc=loc), loc=loc)


def lane_idx(*, loc: ir.Location | None = None) -> Value:
    """Lane within the warp/wavefront: linear thread index mod the target's warp size."""
    loc = _loc(loc)
    return urem(linear_thread_idx(loc=loc), current_kernel().target.warp_size, loc=loc)


def warp_idx(*, loc: ir.Location | None = None) -> Value:
    """Warp (wavefront) index within the block."""
    loc = _loc(loc)
    return udiv(linear_thread_idx(loc=loc), current_kernel().target.warp_size, loc=loc)


def barrier(*, loc: ir.Location | None = None) -> None:
    """``gpu.barrier``: block-wide barrier (``bar.sync 0`` / ``s_barrier``); every thread of
    the block must reach it."""
    with _loc(loc):
        gpu.barrier()

"""memref and vector ops.

memref values are :class:`memory.MemRef` objects (uniform over the threads); loads and stores
go through :mod:`memory` (bounds checks, masking, shared-memory race detection). Vectors are
arrays ``[T|1, *shape]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes, memory
from .compiler import Compiler, handles, type_str
from .frame import Frame
from .memory import Buffer, MemRef
from .ops_arith import _fma, constant_array

_DYN = -9223372036854775808  # ShapedType::kDynamic
_SHARED_SPACES = ("#gpu.address_space<workgroup>", "3", "3 : i64", "3 : i32")


def memref_info(t: Any) -> tuple[tuple[int | None, ...], tuple[int, ...], int, np.dtype, str]:
    """(shape, strides, offset, element dtype, space) of an ``ir.MemRefType``; dynamic dims
    are None; space is "shared", "private" or "global" (anything else)."""
    from mlir import ir

    mt = ir.MemRefType(t)
    shape = tuple(None if d == _DYN else int(d) for d in mt.shape)
    strides, offset = mt.get_strides_and_offset()
    if any(s == _DYN for s in strides) or offset == _DYN:
        raise NotImplementedError(f"interpreter: memref with dynamic strides/offset {t}")
    ms = "" if mt.memory_space is None else str(mt.memory_space)
    space = "shared" if ms in _SHARED_SPACES else \
        "private" if ms in ("", "#gpu.address_space<private>", "5", "5 : i64", "5 : i32") \
        else "global"
    return shape, tuple(int(s) for s in strides), int(offset), \
        dtypes.scalar_dtype(str(mt.element_type)), space


def alloc_buffer(name: str, space: str, shape: tuple[int, ...], dt: np.dtype, f: Frame,
                 check_uninit: bool) -> Buffer:
    """A fresh shared (per block) or private (per thread) buffer for the current batch."""
    size = int(np.prod(shape)) if shape else 1
    if space == "shared":
        buf = Buffer(name, "shared", np.zeros((f.nblocks, size), dt), size,
                     race=memory.RaceTracker(f.nblocks, size) if f.check_races else None,
                     check_uninit=check_uninit)
        f.shared.append(buf)
        return buf
    return Buffer(name, "private", np.zeros((f.T, size), dt), size)


@handles("memref.alloc", "memref.alloca")
def _alloc(op: Any, c: Compiler):
    if len(op.operands):
        raise NotImplementedError(f"interpreter: {op.operation.name} with dynamic sizes")
    out = c.slot(op.results[0])
    shape, strides, offset, dt, space = memref_info(op.results[0].type)
    if space == "global":
        space = "private"
    if space == "shared":
        c.uses_shared = True
    loc = str(op.location)
    name = f"{op.operation.name} {type_str(op.results[0])} at {loc}"

    def run(f: Frame) -> None:
        buf = alloc_buffer(name, space, shape, dt, f, f.check_uninit)
        f.vals[out] = MemRef(buf, shape, strides, offset)
    return run


@handles("memref.load")
def _load(op: Any, c: Compiler):
    m_s, *idx_s = c.slots(op.operands)
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        v = f.vals
        f.vals[out] = memory.load(v[m_s], [v[i] for i in idx_s], f)
    return run


@handles("memref.store")
def _store(op: Any, c: Compiler):
    val_s, m_s, *idx_s = c.slots(op.operands)

    def run(f: Frame) -> None:
        v = f.vals
        memory.store(v[m_s], [v[i] for i in idx_s], v[val_s], f)
    return run


@handles("memref.assume_alignment", "memref.cast", "memref.memory_space_cast")
def _same_memref(op: Any, c: Compiler):
    src = c.slot(op.operands[0])
    if not len(op.results):
        return lambda f: None
    out = c.slot(op.results[0])
    shape = memref_info(op.results[0].type)[0]

    def run(f: Frame) -> None:
        m: MemRef = f.vals[src]
        new_shape = tuple(d if d is not None else s for d, s in zip(shape, m.shape))
        f.vals[out] = MemRef(m.buf, new_shape, m.strides, m.offset)
    return run


def _mixed(op: Any, c: Compiler, static_attr: str, operands: list[Any]) -> Any:
    """Static values of ``static_attr`` with dynamic entries taken, in order, from
    ``operands``: returns a function frame -> list of ints or uniform arrays."""
    static = [int(x) for x in op.attributes[static_attr]]
    dyn = iter(c.slots(operands))
    parts = [("s", v) if v != _DYN else ("d", next(dyn)) for v in static]

    def get(f: Frame) -> list[Any]:
        out = []
        for kind, v in parts:
            if kind == "s":
                out.append(v)
            else:
                a = f.vals[v]
                out.append(int(a[0]) if a.shape[0] == 1 else a.astype(np.int64))
        return out
    return get


@handles("memref.subview")
def _subview(op: Any, c: Compiler):
    src = c.slot(op.operands[0])
    seg = [int(x) for x in op.attributes["operandSegmentSizes"]]
    ops_ = list(op.operands)
    o_ops = ops_[1:1 + seg[1]]
    s_ops = ops_[1 + seg[1]:1 + seg[1] + seg[2]]
    st_ops = ops_[1 + seg[1] + seg[2]:]
    offs = _mixed(op, c, "static_offsets", o_ops)
    sizes = _mixed(op, c, "static_sizes", s_ops)
    steps = _mixed(op, c, "static_strides", st_ops)
    out = c.slot(op.results[0])
    rank = len(memref_info(op.results[0].type)[0])

    def run(f: Frame) -> None:
        m: MemRef = f.vals[src]
        o, s, st = offs(f), sizes(f), steps(f)
        offset = m.offset
        for ok, sk in zip(o, m.strides):
            offset = offset + ok * sk
        dims = [(sz if isinstance(sz, int) else None, stp * stride)
                for sz, stp, stride in zip(s, st, m.strides)]
        while len(dims) > rank:  # rank-reducing: drop unit dims
            i = next(k for k, (sz, _) in enumerate(dims) if sz == 1)
            dims.pop(i)
        f.vals[out] = MemRef(m.buf, tuple(d for d, _ in dims), tuple(s for _, s in dims),
                             offset)
    return run


@handles("memref.reinterpret_cast")
def _reinterpret(op: Any, c: Compiler):
    src = c.slot(op.operands[0])
    seg = [int(x) for x in op.attributes["operandSegmentSizes"]]
    ops_ = list(op.operands)
    offs = _mixed(op, c, "static_offsets", ops_[1:1 + seg[1]])
    sizes = _mixed(op, c, "static_sizes", ops_[1 + seg[1]:1 + seg[1] + seg[2]])
    steps = _mixed(op, c, "static_strides", ops_[1 + seg[1] + seg[2]:])
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        m: MemRef = f.vals[src]
        s = sizes(f)
        f.vals[out] = MemRef(m.buf, tuple(x if isinstance(x, int) else None for x in s),
                             tuple(int(x) for x in steps(f)), offs(f)[0])
    return run


@handles("memref.dim")
def _dim(op: Any, c: Compiler):
    m_s, i_s = c.slots(op.operands)
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        m: MemRef = f.vals[m_s]
        i = int(f.vals[i_s][0])
        d = m.shape[i]
        if d is None:
            if len(m.shape) != 1:
                raise NotImplementedError("interpreter: memref.dim of a dynamic dim, rank > 1")
            d = m.buf.size - int(np.max(m.offset))
        f.vals[out] = np.array([d], np.int64)
    return run


def dynamic_shared(f: Frame) -> Buffer:
    """The block's dynamic shared memory (``f.dynamic_shared_bytes`` per block), created on
    first use."""
    buf = f.dynamic_shared
    if buf is None:
        buf = Buffer("dynamic shared memory", "shared",
                     np.zeros((f.nblocks, f.dynamic_shared_bytes), np.int8),
                     f.dynamic_shared_bytes,
                     race=memory.RaceTracker(f.nblocks, f.dynamic_shared_bytes)
                     if f.check_races else None,
                     check_uninit=f.check_uninit)
        f.shared.append(buf)
        f.dynamic_shared = buf
    return buf


@handles("memref.get_global")
def _get_global(op: Any, c: Compiler):
    from mlir import ir

    out = c.slot(op.results[0])
    name = str(op.attributes["name"]).lstrip("@")
    g = c.symbols.get(name)
    if g is None or g.operation.name != "memref.global":
        raise NotImplementedError(f"interpreter: memref.get_global @{name}: no memref.global")
    shape, strides, offset, dt, _ = memref_info(op.results[0].type)
    init = g.attributes.get("initial_value", None)
    if init is None and shape == (0,) and "workgroup" in str(op.results[0].type):
        # an external 0-byte workgroup global: CUDA's ``extern __shared__`` array, i.e. the
        # dynamic shared memory (the same bytes as gpu.dynamic_shared_memory)
        c.uses_shared = True

        def run_dynamic(f: Frame) -> None:
            f.vals[out] = MemRef(dynamic_shared(f), (None,), (1,), 0)
        return run_dynamic
    if init is None or not isinstance(init, ir.DenseElementsAttr):
        raise NotImplementedError(f"interpreter: memref.global @{name} without a dense value")
    data = constant_array(init, tuple(d for d in shape), dt, ir).reshape(-1)
    ro = "constant" in g.attributes
    buf = Buffer(f"@{name}", "global", data.copy(), data.size, readonly=ro)

    def run(f: Frame) -> None:
        f.vals[out] = MemRef(buf, shape, strides, offset)
    return run


# ---- vector ---------------------------------------------------------------------------------


def _vec_shape(value: Any) -> tuple[tuple[int, ...], np.dtype]:
    return dtypes.value_dtype(type_str(value))


@handles("vector.load")
def _vload(op: Any, c: Compiler):
    m_s, *idx_s = c.slots(op.operands)
    out = c.slot(op.results[0])
    shape, _ = _vec_shape(op.results[0])
    if len(shape) != 1:
        raise NotImplementedError("interpreter: vector.load of a multi-dimensional vector")

    def run(f: Frame) -> None:
        v = f.vals
        f.vals[out] = memory.load(v[m_s], [v[i] for i in idx_s], f, vec=shape[0])
    return run


@handles("vector.store")
def _vstore(op: Any, c: Compiler):
    val_s, m_s, *idx_s = c.slots(op.operands)
    shape, _ = _vec_shape(op.operands[0])
    if len(shape) != 1:
        raise NotImplementedError("interpreter: vector.store of a multi-dimensional vector")

    def run(f: Frame) -> None:
        v = f.vals
        memory.store(v[m_s], [v[i] for i in idx_s], v[val_s], f, vec=shape[0])
    return run


@handles("vector.broadcast", "vector.splat")
def _broadcast(op: Any, c: Compiler):
    src = c.slot(op.operands[0])
    out = c.slot(op.results[0])
    shape, dt = _vec_shape(op.results[0])

    def run(f: Frame) -> None:
        x = f.vals[src]
        x = x.reshape(x.shape[:1] + (1,) * (len(shape) + 1 - x.ndim) + x.shape[1:])
        f.vals[out] = np.broadcast_to(x, x.shape[:1] + shape).astype(dt)
    return run


def _positions(op: Any, c: Compiler, dyn_operands: list[Any]):
    return _mixed(op, c, "static_position", dyn_operands)


def _pos_index(pos: list[Any], T: int) -> tuple:
    """Index tuple into [T, *shape] for positions (ints or per-thread arrays)."""
    if all(isinstance(p, int) for p in pos):
        return (slice(None),) + tuple(pos)
    rows = np.arange(T)
    return (rows,) + tuple(np.broadcast_to(p, (T,)) for p in pos)


@handles("vector.extract")
def _extract(op: Any, c: Compiler):
    src = c.slot(op.operands[0])
    pos = _positions(op, c, list(op.operands)[1:])
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        x = f.vals[src]
        p = pos(f)
        if not all(isinstance(q, int) for q in p):
            x = f.full(x)
        f.vals[out] = np.ascontiguousarray(x[_pos_index(p, x.shape[0])])
    return run


@handles("vector.insert")
def _insert(op: Any, c: Compiler):
    val_s, dst_s = c.slots(list(op.operands)[:2])
    pos = _positions(op, c, list(op.operands)[2:])
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        val, dst = f.vals[val_s], f.vals[dst_s]
        p = pos(f)
        n = max(val.shape[0], dst.shape[0])
        if not all(isinstance(q, int) for q in p):
            n = f.T
        res = np.array(np.broadcast_to(dst, (n,) + dst.shape[1:]))
        res[_pos_index(p, n)] = val
        f.vals[out] = res
    return run


@handles("vector.extractelement")
def _extractelement(op: Any, c: Compiler):
    src = c.slot(op.operands[0])
    idx = c.slot(op.operands[1]) if len(op.operands) > 1 else None
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        x = f.vals[src]
        if idx is None:
            f.vals[out] = x[:, 0].copy()
            return
        i = f.vals[idx].astype(np.int64)
        if i.shape[0] == 1:
            f.vals[out] = x[:, int(i[0])].copy()
        else:
            x = f.full(x)
            f.vals[out] = x[np.arange(f.T), i]
    return run


@handles("vector.insertelement")
def _insertelement(op: Any, c: Compiler):
    val_s, dst_s = c.slots(list(op.operands)[:2])
    idx = c.slot(op.operands[2]) if len(op.operands) > 2 else None
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        val, dst = f.vals[val_s], f.vals[dst_s]
        i = f.vals[idx].astype(np.int64) if idx is not None else np.zeros(1, np.int64)
        n = f.T if i.shape[0] > 1 else max(val.shape[0], dst.shape[0])
        res = np.array(np.broadcast_to(dst, (n,) + dst.shape[1:]))
        if i.shape[0] == 1:
            res[:, int(i[0])] = val
        else:
            res[np.arange(n), i] = np.broadcast_to(val, (n,))
        f.vals[out] = res
    return run


@handles("vector.from_elements")
def _from_elements(op: Any, c: Compiler):
    ins = c.slots(op.operands)
    out = c.slot(op.results[0])
    shape, dt = _vec_shape(op.results[0])

    def run(f: Frame) -> None:
        parts = np.broadcast_arrays(*[f.vals[i] for i in ins])
        st = np.stack(parts, axis=1).astype(dt, copy=False)
        f.vals[out] = st.reshape(st.shape[:1] + shape)
    return run


@handles("vector.bitcast")
def _vbitcast(op: Any, c: Compiler):
    src = c.slot(op.operands[0])
    out = c.slot(op.results[0])
    shape, dt = _vec_shape(op.results[0])

    def run(f: Frame) -> None:
        x = np.ascontiguousarray(f.vals[src])
        f.vals[out] = x.view(dt).reshape(x.shape[:1] + shape)
    return run


@handles("vector.shape_cast")
def _shape_cast(op: Any, c: Compiler):
    src = c.slot(op.operands[0])
    out = c.slot(op.results[0])
    shape, _ = _vec_shape(op.results[0])

    def run(f: Frame) -> None:
        x = f.vals[src]
        f.vals[out] = x.reshape(x.shape[:1] + shape)
    return run


@handles("vector.fma")
def _vfma(op: Any, c: Compiler):
    a_s, b_s, c_s = c.slots(op.operands)
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        a, b, cc = np.broadcast_arrays(f.vals[a_s], f.vals[b_s], f.vals[c_s])
        with np.errstate(all="ignore"):
            f.vals[out] = _fma(None, a, b, cc)
    return run


@handles("vector.step")
def _step(op: Any, c: Compiler):
    out = c.slot(op.results[0])
    shape, dt = _vec_shape(op.results[0])
    value = np.arange(shape[0]).astype(dt)[None]

    def run(f: Frame) -> None:
        f.vals[out] = value
    return run


@handles("vector.shuffle")
def _vshuffle(op: Any, c: Compiler):
    a_s, b_s = c.slots(op.operands)
    out = c.slot(op.results[0])
    mask = [int(x) for x in op.attributes["mask"]]

    def run(f: Frame) -> None:
        a, b = np.broadcast_arrays(f.vals[a_s], f.vals[b_s])
        cat = np.concatenate([a, b], axis=1)
        f.vals[out] = cat[:, mask]
    return run


@handles("vector.reduction")
def _reduction(op: Any, c: Compiler):
    """vector.reduction: float add/mul are sequential in element order (LLVM's ordered
    reduction without reassoc), starting from the accumulator when given."""
    from .ops_gpu import _REDUCE

    ins = c.slots(op.operands)
    out = c.slot(op.results[0])
    kind = str(op.attributes["kind"]).rstrip(">").split("<")[-1]
    fn = _REDUCE[kind]

    def run(f: Frame) -> None:
        x = f.vals[ins[0]]
        acc = f.vals[ins[1]] if len(ins) > 1 else None
        with np.errstate(all="ignore"):
            r = x[:, 0]
            for k in range(1, x.shape[1]):
                r = fn(r, x[:, k])
            if acc is not None:
                r = fn(acc, r) if kind not in ("add", "mul") else _ordered_acc(fn, acc, x)
        f.vals[out] = np.asarray(r).astype(x.dtype, copy=False)
    return run


def _ordered_acc(fn: Any, acc: np.ndarray, x: np.ndarray) -> np.ndarray:
    r = acc
    for k in range(x.shape[1]):
        r = fn(r, x[:, k])
    return r

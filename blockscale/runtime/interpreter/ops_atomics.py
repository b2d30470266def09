"""memref.atomic_rmw, nvvm.memory.barrier (no-op), gpu.dynamic_shared_memory, memref.view.

Atomics are applied one thread at a time in linear thread order (one valid serialisation of
the hardware's unordered atomics); each thread gets the value it replaced. Atomic accesses are
exempt from shared-memory race detection (they are the synchronisation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import memory
from .compiler import Compiler, handles
from .frame import Frame
from .memory import Buffer, MemRef
from .ops_arith import _max_signed_zero
from .ops_memory import dynamic_shared, memref_info

_KINDS: dict[int, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    0: ("addf", np.add), 1: ("addi", np.add), 2: ("andi", np.bitwise_and),
    3: ("assign", lambda old, v: v),
    4: ("maximumf", lambda a, b: _max_signed_zero(a, b, True, True)),
    5: ("maxnumf", lambda a, b: _max_signed_zero(a, b, False, True)),
    6: ("maxs", np.maximum), 7: ("maxu", None),
    8: ("minimumf", lambda a, b: _max_signed_zero(a, b, True, False)),
    9: ("minnumf", lambda a, b: _max_signed_zero(a, b, False, False)),
    10: ("mins", np.minimum), 11: ("minu", None), 12: ("mulf", np.multiply),
    13: ("muli", np.multiply), 14: ("ori", np.bitwise_or), 15: ("xori", np.bitwise_xor),
}


def _unsigned(fn: Callable) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        u = a.dtype.str.replace("i", "u")
        return fn(a.view(u), b.view(u)).view(a.dtype)
    return run


@handles("memref.atomic_rmw")
def _atomic_rmw(op: Any, c: Compiler):
    val_s, m_s, *idx_s = c.slots(op.operands)
    out = c.slot(op.results[0])
    kind = int(str(op.attributes["kind"]).split(":")[0])
    name, fn = _KINDS[kind]
    if name == "maxu":
        fn = _unsigned(np.maximum)
    elif name == "minu":
        fn = _unsigned(np.minimum)

    def run(f: Frame) -> None:
        ref: MemRef = f.vals[m_s]
        buf = ref.buf
        lin = memory._linear(ref, [f.vals[i] for i in idx_s], f, 0, f"atomic_rmw {name}")
        if buf.readonly:
            raise RuntimeError(f"atomic_rmw on read-only buffer {buf.name}")
        lin = np.broadcast_to(lin, (f.T,))
        val = np.broadcast_to(np.asarray(f.vals[val_s], buf.data.dtype), (f.T,))
        rows = None if buf.space == "global" else (
            np.broadcast_to(f.blk, (f.T,)) if buf.space == "shared" else np.arange(f.T))
        old = np.zeros(f.T, buf.data.dtype)
        threads = np.arange(f.T) if f.mask is None else np.flatnonzero(f.mask)
        data = buf.data
        with np.errstate(all="ignore"):
            for t in threads:  # serial, in thread order
                key = int(lin[t]) if rows is None else (int(rows[t]), int(lin[t]))
                o = data[key]
                old[t] = o
                data[key] = fn(np.asarray(o), np.asarray(val[t]))
        f.vals[out] = old
    return run


def _static_shared(func: Any) -> str | None:
    """What static shared memory the gpu.func ``func`` declares (None: none)."""
    if "workgroup_attributions" in func.attributes and \
            int(str(func.attributes["workgroup_attributions"]).split(":")[0]) > 0:
        return "workgroup attributions"
    found: list[str] = []

    def walk(o: Any) -> None:
        for r in o.regions:
            for b in r.blocks:
                for x in b.operations:
                    if x.operation.name == "nvgpu.mbarrier.create":
                        found.append("nvgpu.mbarrier.create")
                    walk(x.operation)
    walk(func)
    return found[0] if found else None


@handles("gpu.dynamic_shared_memory")
def _dynamic_shared(op: Any, c: Compiler):
    """The dynamic shared memory. Refused next to static shared memory: the op lowers to an
    internal 0-byte global that NVPTX emits as a static ``.shared`` variable, which ptxas
    places among (not after) the static buffers, so on hardware it aliases them (issue #9;
    an external 0-byte ``memref.global`` in workgroup memory is the CUDA ``extern __shared__``
    array that works, see ``memref.get_global``)."""
    func = op.operation.parent
    while func is not None and func.name != "gpu.func":
        func = func.parent
    what = _static_shared(func) if func is not None else None
    if what is not None:
        raise NotImplementedError(
            "interpreter: gpu.dynamic_shared_memory in a kernel with static shared memory "
            f"({what}) aliases it on hardware; declare the dynamic shared memory as an "
            "external 0-byte workgroup memref.global instead")
    out = c.slot(op.results[0])
    c.uses_shared = True

    def run(f: Frame) -> None:
        f.vals[out] = MemRef(dynamic_shared(f), (None,), (1,), 0)
    return run


@handles("memref.view")
def _view(op: Any, c: Compiler):
    """A typed view of a byte buffer. The view gets its own race tracker (in its element
    units) and no uninitialised-read check; accesses through different views of the same
    bytes are not cross-checked."""
    src_s, shift_s, *size_s = c.slots(op.operands)
    if size_s:
        raise NotImplementedError("interpreter: memref.view with dynamic sizes")
    out = c.slot(op.results[0])
    shape, strides, offset, dt, _ = memref_info(op.results[0].type)

    def run(f: Frame) -> None:
        src: MemRef = f.vals[src_s]
        base = src.buf
        shift = int(np.asarray(f.vals[shift_s]).reshape(-1)[0]) + int(np.max(src.offset))
        if shift % dt.itemsize:
            raise NotImplementedError(f"interpreter: memref.view at byte {shift}, not a "
                                      f"multiple of {dt.itemsize}")
        key = (id(base), dt.str)
        views = f.views
        buf = views.get(key)
        if buf is None:
            data = base.data.view(dt)
            size = data.shape[-1]
            race = memory.RaceTracker(f.nblocks, size) if base.race is not None else None
            buf = Buffer(f"{base.name} as {dt}", base.space, data, size, race=race,
                         check_uninit=False)
            if race is not None:
                f.shared.append(buf)
            views[key] = buf
        f.vals[out] = MemRef(buf, shape, strides, shift // dt.itemsize + offset)
    return run


@handles("nvvm.memory.barrier")
def _membar(op: Any, c: Compiler):
    """``membar`` / ``fence.sc``: a no-op here (the interpreter's memory is sequentially
    consistent and the CTAs of a batch run in lock step)."""
    return lambda f: None

"""Asynchronous global -> shared copies (``nvgpu.device_async_copy`` = ``cp.async``), their
groups (``device_async_create_group`` = ``cp.async.commit_group``) and waits
(``device_async_wait`` = ``cp.async.wait_group N``).

Model: a copy reads its source when it is issued (the kernels copy inputs nobody writes),
fills its destination with *poison* (0xFF bytes: bf16 / f32 NaN) at once, and *lands* (the
real bytes) at the wait that retires its group: a wait with ``N`` keeps the newest ``N``
groups pending and applies the older ones, oldest first. So a read of the destination
before the wait sees NaNs (or never-written bytes), and a wgmma still reading the
destination when the copy is issued sees its operand change before it is retired
(:mod:`.ops_wgmma` raises): the hardware may write anywhere in between. Copies issued after
the last commit are not in any group; a wait applies none of them. Landing is a write by the
issuing thread for the race checker (so another thread's read needs a barrier after the
wait) and marks the bytes written; a wgmma reading them needs the ``fence.proxy.async``
snapshot after the landing (:mod:`.ops_wgmma`), so a kernel that waits too little or fences
too early fails here. Lock-step caveat: groups are tracked per batch of blocks, not per
thread (all threads of the kernels issue, commit and wait in the same program order); a
copy whose group is never waited for never lands.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import memory
from .compiler import Compiler, handles
from .frame import Frame
from .memory import MemRef

#: itemsize -> one element of 0xFF bytes (the in-flight destination's contents)
_POISON = {n: np.full(n, 0xFF, np.uint8) for n in (1, 2, 4, 8)}


class _Copies:
    """Per-frame state: the copies issued since the last commit, and the committed groups
    (oldest first); a copy is (buffer, rows, element offsets, values, local thread ids) of
    its active threads."""

    def __init__(self) -> None:
        self.open: list[tuple[Any, ...]] = []
        self.groups: list[list[tuple[Any, ...]]] = []


def _state(f: Frame) -> _Copies:
    s = f.__dict__.get("cp_async_state")
    if s is None:
        s = f.__dict__["cp_async_state"] = _Copies()
    return s


def _land(f: Frame, copy: tuple[Any, ...]) -> None:
    buf, rows, lin, vals, tids = copy
    buf.data[rows, lin] = vals
    if buf.race is not None and lin.size:
        keys = (rows * buf.size + lin).reshape(-1)
        buf.race.record(keys, np.repeat(tids, lin.shape[1]).astype(np.int32), True, f,
                        buf.name, buf.check_uninit)


@handles("nvgpu.device_async_copy")
def _copy(op: Any, c: Compiler):
    seg = [int(x) for x in op.attributes["operandSegmentSizes"]]
    if seg[4]:
        raise NotImplementedError("interpreter: nvgpu.device_async_copy with srcElements "
                                  "(zero fill)")
    slots = c.slots(op.operands)
    dst_s, dst_idx = slots[0], slots[1:1 + seg[1]]
    src_s, src_idx = slots[1 + seg[1]], slots[2 + seg[1]:2 + seg[1] + seg[3]]
    n = int(op.attributes["dstElements"].value)
    out = c.slot(op.results[0])
    c.uses_shared = True

    def run(f: Frame) -> None:
        v = f.vals
        dst: MemRef = v[dst_s]
        src: MemRef = v[src_s]
        if dst.buf.space != "shared" or src.buf.space != "global":
            raise ValueError(f"cp.async copies global to shared memory, got {src.buf.space} "
                             f"{src.buf.name} -> {dst.buf.space} {dst.buf.name}")
        f.vals[out] = None
        act = f.active()
        if not act.any():
            return
        vals = memory.load(src, [v[i] for i in src_idx], f, vec=n)
        lin = memory._linear(dst, [v[i] for i in dst_idx], f, n, "cp.async store")
        shape = (f.T, n)
        rows = np.broadcast_to(f.blk, (f.T,))[act][:, None]
        lin_a = np.broadcast_to(lin, shape)[act]
        dst.buf.data[rows, lin_a] = _POISON[dst.dtype.itemsize].view(dst.dtype)[0]
        _state(f).open.append((dst.buf, rows, lin_a,
                               np.broadcast_to(vals, shape)[act].astype(dst.dtype),
                               np.broadcast_to(f.tid, (f.T,))[act]))
    return run


@handles("nvgpu.device_async_create_group")
def _commit(op: Any, c: Compiler):
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        st = _state(f)
        st.groups.append(st.open)
        st.open = []
        f.vals[out] = None
    return run


@handles("nvgpu.device_async_wait")
def _wait(op: Any, c: Compiler):
    attr = op.attributes["numGroups"] if "numGroups" in op.attributes else None  # noqa: SIM401
    keep = int(attr.value) if attr is not None else 0

    def run(f: Frame) -> None:
        st = _state(f)
        while len(st.groups) > keep:
            for copy in st.groups.pop(0):
                _land(f, copy)
    return run

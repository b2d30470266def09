"""TMA tensor maps, mbarriers and bulk tensor copies (nvgpu dialect), modeled exactly.

* A ``"tensormap"`` kernel argument (blockscale.launch) is bound to a :class:`TensorMap`: the
  numpy buffer it describes, its dims and element strides, the box and the swizzle — what
  ``cuTensorMapEncodeTiled`` receives on a GPU. The kernel views its ``!llvm.ptr`` parameter
  as an ``!nvgpu.tensormap.descriptor`` through ``builtin.unrealized_conversion_cast``; the
  model checks that the descriptor type (box, swizzle, zero fill) matches the map.
* An mbarrier (PTX ISA "mbarrier") holds, per block: the current phase parity, the pending
  arrival count, the expected arrival count and the transaction count. ``init(n)``: parity 0,
  pending = expected = n, tx = 0. ``arrive.expect_tx(b)``: tx += b, then one arrival
  (pending -= 1). A copy's ``complete_tx(b)``: tx -= b. When pending == 0 and tx == 0 the
  phase completes: parity flips, pending = expected. ``try_wait.parity(p)`` returns once the
  phase of parity p has completed, i.e. when the current parity differs from p.
* ``nvgpu.tma.async.load`` (``cp.async.bulk.tensor``): the issuing thread's box at the given
  coordinates (innermost first) is read from the tensor with zero fill outside it, written to
  the shared tile in box row-major order with the swizzle applied to the byte offset inside
  the tile (span S in {32, 64, 128}: bits [4, 4 + log2(S/16)) ^= bits [7, 7 + log2(S/16));
  the tile must start on a ``8 * S`` byte boundary), and completes ``prod(box) * itemsize``
  transaction bytes on the mbarrier (the full box, OOB bytes included).

Lock-step caveats: a copy lands when it is issued (threads of a block run in program order,
so a consumer only sees it after its wait when the kernel waits properly — a read of the
tile with no wait before it is not detected); a wait whose phase has not completed when it
runs can never complete in lock-step order and raises :class:`MBarrierDeadlockError`. The copy
engine's writes are not thread accesses: they mark the bytes written (for the uninitialised-read
check) and clear the race tracker there, since the mbarrier orders them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from .compiler import Compiler, handles
from .frame import Frame
from .memory import MemRef


class MBarrierDeadlockError(RuntimeError):
    """A thread waits on an mbarrier phase that can no longer complete."""


@dataclasses.dataclass
class TensorMap:
    """What a CUtensorMap describes: ``data`` (flat numpy, element dtype) as a dense tensor of
    ``dims`` (innermost first), copied in ``box`` boxes with ``swizzle`` ("none", "32b",
    "64b", "128b") and zero fill out of bounds."""

    name: str
    data: np.ndarray
    dims: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: str

    @property
    def strides(self) -> tuple[int, ...]:
        """Element strides per dim, innermost first (dense row-major)."""
        out, s = [], 1
        for d in self.dims:
            out.append(s)
            s *= d
        return tuple(out)

    def read_box(self, coords: tuple[int, ...]) -> np.ndarray:
        """The box at ``coords`` as an array of shape ``box`` reversed; zeros outside."""
        idx = np.zeros((), np.int64)
        ok = np.ones((), bool)
        for ax, (c, b, d, st) in enumerate(zip(coords, self.box, self.dims, self.strides)):
            i = c + np.arange(b, dtype=np.int64)
            shape = [1] * len(self.box)
            shape[len(self.box) - 1 - ax] = b
            i = i.reshape(shape)
            ok = ok & (i >= 0) & (i < d)
            idx = idx + np.clip(i, 0, d - 1) * st
        return np.where(ok, self.data[idx], np.zeros((), self.data.dtype))


_SWIZZLE_SPANS = {"none": 0, "32b": 32, "64b": 64, "128b": 128}


def swizzle_offsets(nbytes: int, swizzle: str) -> np.ndarray:
    """Byte offset in the shared tile of each byte of a ``nbytes`` box image."""
    b = np.arange(nbytes, dtype=np.int64)
    span = _SWIZZLE_SPANS[swizzle]
    if span == 0:
        return b
    mask = span // 16 - 1
    return b ^ (((b >> 7) & mask) << 4)


# ---- the descriptor --------------------------------------------------------------------------


_DESC_RE = re.compile(r"tensor\s*=\s*memref<([0-9x]+)x(\w+),[^>]*>\s*,\s*swizzle\s*=\s*(\w+)"
                      r"\s*,\s*l2promo\s*=\s*\w+\s*,\s*oob\s*=\s*(\w+)")


def _descriptor_info(type_str: str) -> tuple[tuple[int, ...], str, str]:
    m = _DESC_RE.search(type_str)
    if m is None:
        raise NotImplementedError(f"interpreter: tensormap descriptor type {type_str}")
    box = tuple(reversed([int(x) for x in m.group(1).split("x")]))
    sw = m.group(3).replace("swizzle_", "")
    return box, sw, m.group(4)


@handles("builtin.unrealized_conversion_cast")
def _cast(op: Any, c: Compiler):
    if len(op.operands) != 1 or len(op.results) != 1 or \
            not str(op.results[0].type).startswith("!nvgpu.tensormap.descriptor"):
        raise NotImplementedError("interpreter: builtin.unrealized_conversion_cast other than "
                                  "!llvm.ptr -> !nvgpu.tensormap.descriptor")
    src, out = c.slot(op.operands[0]), c.slot(op.results[0])
    box, swizzle, oob = _descriptor_info(str(op.results[0].type))
    if oob != "zero":
        raise NotImplementedError(f"interpreter: tensormap with oob = {oob}")

    def run(f: Frame) -> None:
        tm = f.vals[src]
        if not isinstance(tm, TensorMap):
            raise TypeError(f"expected a tensormap argument, got {type(tm).__name__}")
        if tm.box != box or tm.swizzle != swizzle:
            raise ValueError(f"tensormap {tm.name}: the launch describes box {tm.box}, swizzle "
                             f"{tm.swizzle!r}; the kernel's descriptor type says box {box}, "
                             f"swizzle {swizzle!r}")
        f.vals[out] = tm
    return run


# ---- mbarriers -------------------------------------------------------------------------------


@dataclasses.dataclass
class MBarriers:
    """State of a group of ``n`` mbarriers, one copy per block of the batch ([B, n] arrays)."""

    inited: np.ndarray
    parity: np.ndarray
    pending: np.ndarray
    expected: np.ndarray
    tx: np.ndarray

    @classmethod
    def create(cls, nblocks: int, n: int) -> MBarriers:
        z = lambda dt: np.zeros((nblocks, n), dt)
        return cls(z(bool), z(np.int8), z(np.int64), z(np.int64), z(np.int64))

    def complete_phases(self) -> None:
        done = self.inited & (self.pending == 0) & (self.tx == 0)
        self.parity[done] ^= 1
        self.pending[done] = self.expected[done]


def _active_threads(f: Frame) -> np.ndarray:
    return np.flatnonzero(f.active())


def _per_thread(f: Frame, v: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.broadcast_to(np.asarray(v).reshape(-1), (f.T,))[t].astype(np.int64)


def _blocks(f: Frame, t: np.ndarray) -> np.ndarray:
    return np.broadcast_to(f.blk, (f.T,))[t]


def _group(f: Frame, v: Any) -> MBarriers:
    if not isinstance(v, MBarriers):
        raise TypeError(f"expected an mbarrier group, got {type(v).__name__}")
    return v


def _check_ids(f: Frame, g: MBarriers, t: np.ndarray, ids: np.ndarray, what: str,
               need_init: bool = True) -> None:
    n = g.inited.shape[1]
    bad = (ids < 0) | (ids >= n)
    if bad.any():
        i = int(np.argmax(bad))
        raise IndexError(f"{what}: mbarrier {int(ids[i])} of a group of {n} at "
                         f"{f.describe(int(t[i]))}")
    if need_init:
        un = ~g.inited[_blocks(f, t), ids]
        if un.any():
            i = int(np.argmax(un))
            raise RuntimeError(f"{what}: mbarrier {int(ids[i])} is not initialised at "
                               f"{f.describe(int(t[i]))}")


@handles("nvgpu.mbarrier.create")
def _create(op: Any, c: Compiler):
    out = c.slot(op.results[0])
    m = re.search(r"num_barriers\s*=\s*(\d+)", str(op.results[0].type))
    n = int(m.group(1)) if m else 1
    key = id(op)
    c.uses_shared = True

    def run(f: Frame) -> None:
        store = f.__dict__.setdefault("mbarriers", {})
        g = store.get(key)
        if g is None:
            g = store[key] = MBarriers.create(f.nblocks, n)
        f.vals[out] = g
    return run


def _barrier_threads(f: Frame, g_s: int, id_s: int, pred: list[int]
                     ) -> tuple[MBarriers, np.ndarray, np.ndarray]:
    """(the barrier group, the active threads whose predicate (if any) holds, their
    barrier ids) of an mbarrier op."""
    g = _group(f, f.vals[g_s])
    t = _active_threads(f)
    if pred:
        t = t[np.broadcast_to(f.vals[pred[0]].astype(bool), (f.T,))[t]]
    return g, t, _per_thread(f, f.vals[id_s], t)


@handles("nvgpu.mbarrier.init")
def _init(op: Any, c: Compiler):
    g_s, count_s, id_s, *pred = c.slots(op.operands)

    def run(f: Frame) -> None:
        g, t, ids = _barrier_threads(f, g_s, id_s, pred)
        _check_ids(f, g, t, ids, "mbarrier.init", need_init=False)
        b, cnt = _blocks(f, t), _per_thread(f, f.vals[count_s], t)
        g.inited[b, ids] = True
        g.parity[b, ids] = 0
        g.pending[b, ids] = cnt
        g.expected[b, ids] = cnt
        g.tx[b, ids] = 0
    return run


@handles("nvgpu.mbarrier.arrive.expect_tx")
def _arrive_expect_tx(op: Any, c: Compiler):
    g_s, tx_s, id_s, *pred = c.slots(op.operands)

    def run(f: Frame) -> None:
        g, t, ids = _barrier_threads(f, g_s, id_s, pred)
        _check_ids(f, g, t, ids, "mbarrier.arrive.expect_tx")
        b = _blocks(f, t)
        np.add.at(g.tx, (b, ids), _per_thread(f, f.vals[tx_s], t))
        np.subtract.at(g.pending, (b, ids), 1)
        if (g.pending[b, ids] < 0).any():
            raise RuntimeError("mbarrier.arrive.expect_tx: more arrivals than the barrier's "
                               "count in one phase")
        g.complete_phases()
    return run


@handles("nvgpu.mbarrier.try_wait.parity")
def _try_wait_parity(op: Any, c: Compiler):
    g_s, par_s, _ticks_s, id_s = c.slots(op.operands)

    def run(f: Frame) -> None:
        g = _group(f, f.vals[g_s])
        t = _active_threads(f)
        ids = _per_thread(f, f.vals[id_s], t)
        _check_ids(f, g, t, ids, "mbarrier.try_wait.parity")
        want = _per_thread(f, f.vals[par_s], t) & 1
        stuck = g.parity[_blocks(f, t), ids] == want
        if stuck.any():
            i = int(np.argmax(stuck))
            b = int(_blocks(f, t)[i])
            raise MBarrierDeadlockError(
                f"mbarrier {int(ids[i])}: {f.describe(int(t[i]))} waits for phase parity "
                f"{int(want[i])}, which has not completed (pending arrivals "
                f"{int(g.pending[b, ids[i]])}, transaction bytes {int(g.tx[b, ids[i]])}) and "
                "cannot complete later in lock-step order")
    return run


@handles("nvvm.fence.mbarrier.init", "nvgpu.tma.prefetch.descriptor", "nvvm.prefetch")
def _no_effect(op: Any, c: Compiler):
    """Ordering-only instructions and cache hints (the model applies every write at once and
    has no caches)."""
    return lambda f: None


# ---- the bulk tensor copy --------------------------------------------------------------------


@handles("nvgpu.tma.async.load")
def _tma_load(op: Any, c: Compiler):
    seg = [int(x) for x in op.attributes["operandSegmentSizes"]]
    slots = c.slots(op.operands)
    pos = np.cumsum([0] + seg)
    dst_s, g_s, desc_s = slots[pos[0]], slots[pos[1]], slots[pos[2]]
    coord_s = slots[pos[3]:pos[4]]
    id_s = slots[pos[4]]
    if seg[5]:
        raise NotImplementedError("interpreter: nvgpu.tma.async.load with a multicast mask")
    pred_s = slots[pos[6]] if seg[6] else None

    def run(f: Frame) -> None:
        dst: MemRef = f.vals[dst_s]
        g = _group(f, f.vals[g_s])
        tm: TensorMap = f.vals[desc_s]
        t = _active_threads(f)
        if pred_s is not None:
            t = t[np.broadcast_to(f.vals[pred_s].astype(bool), (f.T,))[t]]
        ids = _per_thread(f, f.vals[id_s], t)
        _check_ids(f, g, t, ids, "tma.async.load")
        coords = np.stack([_per_thread(f, f.vals[s], t) for s in coord_s], axis=1) \
            if len(t) else np.zeros((0, len(coord_s)), np.int64)
        nbytes = int(np.prod(tm.box)) * tm.data.dtype.itemsize
        for i, thread in enumerate(t):
            _copy_box(f, dst, tm, tuple(int(x) for x in coords[i]), int(_blocks(f, t)[i]),
                      int(thread))
        b = _blocks(f, t)
        np.subtract.at(g.tx, (b, ids), nbytes)
        g.complete_phases()
    return run


def _copy_box(f: Frame, dst: MemRef, tm: TensorMap, coords: tuple[int, ...], block: int,
              thread: int) -> None:
    buf = dst.buf
    if buf.space != "shared":
        raise ValueError(f"tma.async.load: the destination must be shared memory, got "
                         f"{buf.space} {buf.name}")
    if np.ndim(dst.offset):
        raise NotImplementedError("tma.async.load into a per-thread destination view")
    item = buf.data.dtype.itemsize
    if item != tm.data.dtype.itemsize:
        raise TypeError(f"tma.async.load: {tm.data.dtype} tensor into a {buf.data.dtype} tile")
    tile_shape = tuple(reversed(tm.box))
    if tuple(dst.shape) != tile_shape:
        raise ValueError(f"tma.async.load: destination shape {dst.shape}, box {tile_shape}")
    span = _SWIZZLE_SPANS[tm.swizzle]
    base = int(dst.offset) * item
    if span and (base % (8 * span) or tm.box[0] * item != span):
        raise ValueError(f"tma.async.load: swizzle {tm.swizzle} needs a tile aligned to "
                         f"{8 * span} bytes and box rows of {span} bytes (tile at byte "
                         f"{base}, rows of {tm.box[0] * item} bytes) at {f.describe(thread)}")
    img = np.ascontiguousarray(tm.read_box(coords)).reshape(-1).view(np.uint8)
    where = base + swizzle_offsets(img.size, tm.swizzle)
    if where.max() >= buf.size * item:
        raise IndexError(f"tma.async.load: box past the end of {buf.name} at "
                         f"{f.describe(thread)}")
    row = buf.data[block].view(np.uint8)
    row[where] = img
    if buf.race is not None:
        elems = np.unique(where // item)
        keys = block * buf.size + elems
        buf.race.written[keys] = True
        buf.race.wmin[keys] = np.iinfo(np.int32).max
        buf.race.wmax[keys] = -1
        buf.race.rmin[keys] = np.iinfo(np.int32).max
        buf.race.rmax[keys] = -1

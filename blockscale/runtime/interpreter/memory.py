"""Buffers, memref values, bounds-checked loads/stores and shared-memory race detection.

A :class:`Buffer` is storage in one address space:

* ``global``: a kernel argument (the caller's 1-D array, viewed as the memref element type)
  or a ``memref.global`` constant; shape ``[n]``;
* ``shared``: a workgroup allocation, one copy per block of the batch; shape ``[B, n]``;
* ``private``: a per-thread allocation; shape ``[T, n]``.

A :class:`MemRef` (the value of an SSA memref) is a strided view of a buffer. Every access is
bounds-checked per dimension and against the buffer on the active threads; shared accesses
are race-checked between barriers (see :class:`RaceTracker`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .frame import Frame, SharedMemoryRaceError, UninitializedSharedReadError

_NONE = np.iinfo(np.int32).max  # "no thread" for the min trackers


class RaceTracker:
    """Which threads read and wrote each location of a shared buffer since the last barrier.

    For every (block, element) it keeps the min and max local thread id of the writers and of
    the readers. Thread t's access conflicts when another thread wrote the location (a read or
    a write) or read it (a write), i.e. when the relevant min/max are not both t.
    """

    def __init__(self, nblocks: int, size: int) -> None:
        n = nblocks * size
        self.size = size
        self.wmin = np.full(n, _NONE, np.int32)
        self.wmax = np.full(n, -1, np.int32)
        self.rmin = np.full(n, _NONE, np.int32)
        self.rmax = np.full(n, -1, np.int32)
        self.written = np.zeros(n, bool)  # ever written (not reset by barriers)

    def reset(self, blocks: np.ndarray) -> None:
        """Forget the accesses of the blocks in ``blocks`` (a barrier was passed)."""
        for b in np.flatnonzero(blocks):
            s = slice(b * self.size, (b + 1) * self.size)
            self.wmin[s] = _NONE
            self.wmax[s] = -1
            self.rmin[s] = _NONE
            self.rmax[s] = -1

    def record(self, keys: np.ndarray, tids: np.ndarray, is_write: bool, f: Frame,
               name: str, check_uninit: bool) -> None:
        """Record accesses (flat keys ``b*size + elem``, local thread ids) and raise on a race."""
        if keys.size == 0:
            return
        if is_write:
            np.minimum.at(self.wmin, keys, tids)
            np.maximum.at(self.wmax, keys, tids)
            self.written[keys] = True
            bad_w = self.wmin[keys] != self.wmax[keys]
            rmin, rmax = self.rmin[keys], self.rmax[keys]
            bad_r = (rmax >= 0) & ((rmin != tids) | (rmax != tids))
        else:
            if check_uninit and not self.written[keys].all():
                i = int(np.argmin(self.written[keys]))
                raise UninitializedSharedReadError(
                    f"read of never-written shared memory {name}[{keys[i] % self.size}] by "
                    f"{_describe_local(f, int(keys[i] // self.size), int(tids[i]))}")
            np.minimum.at(self.rmin, keys, tids)
            np.maximum.at(self.rmax, keys, tids)
            wmin, wmax = self.wmin[keys], self.wmax[keys]
            bad_w = (wmax >= 0) & ((wmin != tids) | (wmax != tids))
            bad_r = np.zeros(keys.shape, bool)
        bad = bad_w | bad_r
        if bad.any():
            i = int(np.argmax(bad))
            k, t = int(keys[i]), int(tids[i])
            b = k // self.size
            if bad_w[i]:
                other = int(self.wmin[k]) if self.wmin[k] != t else int(self.wmax[k])
                what = "written"
            else:
                other = int(self.rmin[k]) if self.rmin[k] != t else int(self.rmax[k])
                what = "read"
            raise SharedMemoryRaceError(
                f"shared-memory race on {name}[{k % self.size}] in {f.describe_block(b)}: "
                f"{what} by thread {_local_xyz(f, other)} and "
                f"{'written' if is_write else 'read'} by thread {_local_xyz(f, t)} "
                "with no barrier in between")


def _local_xyz(f: Frame, tid: int) -> tuple[int, int, int]:
    bx, by, _ = f.block
    return (tid % bx, (tid // bx) % by, tid // (bx * by))


def _describe_local(f: Frame, b: int, tid: int) -> str:
    return f"thread {_local_xyz(f, tid)} of {f.describe_block(b)}"


@dataclasses.dataclass
class Buffer:
    """Storage of one address space (see the module docstring for the shapes)."""

    name: str
    space: str  # "global" | "shared" | "private"
    data: np.ndarray
    size: int  # elements per copy
    readonly: bool = False
    race: RaceTracker | None = None
    check_uninit: bool = True


@dataclasses.dataclass
class MemRef:
    """A strided view of a buffer: element (i0, i1, ...) is at
    ``offset + sum(i_k * strides[k])``. ``shape`` entries are None where dynamic (checked
    against the buffer only). ``offset`` may be a per-thread array."""

    buf: Buffer
    shape: tuple[int | None, ...]
    strides: tuple[int, ...]
    offset: int | np.ndarray = 0

    @property
    def dtype(self) -> np.dtype:
        return self.buf.data.dtype


def _out_of_range(i: np.ndarray, n: int) -> np.ndarray:
    """``(i < 0) | (i >= n)`` in one comparison (negative int64 views as a huge uint64)."""
    return i.view(np.uint64) >= np.uint64(n)


def _linear(ref: MemRef, idx: Sequence[np.ndarray], f: Frame, vec: int, kind: str
            ) -> np.ndarray:
    """Element offsets ``[T|1]`` (or ``[T|1, vec]`` when vec > 0) of an access, bounds-checked
    on the active threads. Inactive threads get offset 0."""
    if len(idx) != len(ref.shape):
        raise ValueError(f"{kind} of {ref.buf.name}: {len(idx)} indices for rank "
                         f"{len(ref.shape)}")
    idx = [i if i.dtype == np.int64 else i.astype(np.int64) for i in idx]
    lin: np.ndarray = np.asarray(ref.offset, np.int64).reshape(-1)
    bad = None
    last = len(idx) - 1
    for k, (i, dim, st) in enumerate(zip(idx, ref.shape, ref.strides)):
        if dim is not None:
            span = dim - (vec - 1 if vec and k == last else 0)
            b = _out_of_range(i, max(span, 0)) if span > 0 else np.ones(i.shape, bool)
            bad = b if bad is None else (bad | b)
        lin = lin + i * st if st != 1 else lin + i
    st_last = ref.strides[last] if ref.strides else 1
    span = ref.buf.size - (vec - 1) * st_last if vec else ref.buf.size
    b = _out_of_range(lin, span) if span > 0 else np.ones(lin.shape, bool)
    if vec and st_last < 0:
        b = b | _out_of_range(lin + (vec - 1) * st_last, ref.buf.size)
    bad = b if bad is None else (bad | b)
    if f.mask is not None:
        bad = bad & f.mask
    if bad.any():
        t = int(np.argmax(np.broadcast_to(bad, (f.T,))))
        index = tuple(int(np.broadcast_to(i, (f.T,))[t]) for i in idx)
        lin_t = int(np.broadcast_to(lin, (f.T,))[t])
        where_ = [lin_t + j * st_last for j in range(vec)] if vec else lin_t
        raise IndexError(
            f"out-of-bounds {kind} of {ref.buf.name} ({ref.buf.space}, {ref.buf.size} "
            f"elements, shape {ref.shape}): index {index} -> element(s) {where_} "
            f"at {f.describe(t)}")
    if f.mask is not None:
        lin = np.where(f.mask, lin, 0)
    if vec:
        lin = lin[:, None] + np.arange(vec, dtype=np.int64) * st_last
    return lin


def _row(buf: Buffer, f: Frame, lin: np.ndarray) -> np.ndarray | None:
    """First-axis index of a shared/private buffer for each access (None for global)."""
    if buf.space == "global":
        return None
    rows = f.blk if buf.space == "shared" else np.arange(f.T, dtype=np.int64)
    return rows.reshape(rows.shape + (1,) * (lin.ndim - 1))


def load(ref: MemRef, idx: Sequence[np.ndarray], f: Frame, vec: int = 0) -> np.ndarray:
    """memref.load (vec = 0) or vector.load of ``vec`` elements along the last dimension."""
    buf = ref.buf
    if f.mask is not None and not f.mask.any():
        return np.zeros((1, vec) if vec else (1,), buf.data.dtype)
    lin = _linear(ref, idx, f, vec, "load")
    row = _row(buf, f, lin)
    if buf.race is not None:
        _track(buf, f, lin, row, is_write=False)
    return buf.data[lin] if row is None else buf.data[row, lin]


def store(ref: MemRef, idx: Sequence[np.ndarray], value: np.ndarray, f: Frame,
          vec: int = 0) -> None:
    """memref.store / vector.store of ``value`` on the active threads."""
    buf = ref.buf
    if buf.readonly:
        raise RuntimeError(f"store to read-only buffer {buf.name}")
    if f.mask is not None and not f.mask.any():
        return
    lin = _linear(ref, idx, f, vec, "store")
    row = _row(buf, f, lin)
    if buf.race is not None:
        _track(buf, f, lin, row, is_write=True)
    shape = (f.T, vec) if vec else (f.T,)
    lin_f = np.broadcast_to(lin, shape)
    val_f = np.broadcast_to(np.asarray(value, buf.data.dtype), shape)
    if f.mask is not None:
        lin_f, val_f = lin_f[f.mask], val_f[f.mask]
        if row is not None:
            row = np.broadcast_to(row, shape)[f.mask]
    if row is None:
        buf.data[lin_f] = val_f
    else:
        buf.data[np.broadcast_to(row, lin_f.shape), lin_f] = val_f


def _track(buf: Buffer, f: Frame, lin: np.ndarray, row: np.ndarray, is_write: bool) -> None:
    shape = (f.T,) + lin.shape[1:]
    keys = (np.broadcast_to(row, shape) * buf.size + np.broadcast_to(lin, shape))
    tids = np.broadcast_to(f.tid.reshape(f.tid.shape + (1,) * (lin.ndim - 1)), shape)
    if f.mask is not None:
        keys, tids = keys[f.mask], tids[f.mask]
    buf.race.record(keys.reshape(-1), tids.reshape(-1).astype(np.int32), is_write, f,
                    buf.name, buf.check_uninit)

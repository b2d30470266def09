"""Execution state of one batch of thread blocks, run in lock-step.

Every SSA value is a numpy array whose leading axis is the thread axis: length ``T`` (all
threads of the batch, block-major, x fastest inside a block) or 1 when the value is uniform
(constants, scalar arguments, block dims) and broadcasts. Vector values carry their vector
shape after the thread axis. ``mask`` is None when every thread is active, else a bool [T].
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


class SharedMemoryRaceError(RuntimeError):
    """Two threads of a block touched one shared location (at least one writing) between
    two barriers."""


class BarrierDivergenceError(RuntimeError):
    """A barrier was reached by only part of a block's threads."""


class UninitializedSharedReadError(RuntimeError):
    """A thread read shared memory that no thread of its block had written."""


class ShuffleError(RuntimeError):
    """A shuffle read a lane that is inactive or does not exist."""


@dataclasses.dataclass
class Frame:
    """State of one batch of ``nblocks`` consecutive blocks (linear ids from ``first_block``)."""

    vals: list[Any]
    block: tuple[int, int, int]
    grid: tuple[int, int, int]
    first_block: int
    nblocks: int
    warp_size: int
    mask: np.ndarray | None = None
    #: raise on reads of never-written shared memory
    check_uninit: bool = True
    #: track shared-memory accesses between barriers (races, uninitialised reads)
    check_races: bool = True
    #: bytes of gpu.dynamic_shared_memory per block
    dynamic_shared_bytes: int = 0

    def __post_init__(self) -> None:
        #: shared buffers allocated in this batch (barriers reset their race trackers)
        self.shared: list[Any] = []
        self.dynamic_shared: Any = None  # the dynamic shared buffer, created on first use
        self.views: dict[Any, Any] = {}  # typed views of byte buffers (memref.view)
        self.nthreads = self.block[0] * self.block[1] * self.block[2]
        self.T = self.nthreads * self.nblocks
        t = np.arange(self.T, dtype=np.int64)
        #: linear thread id inside its block, and block index inside the batch, per thread.
        self.tid = t % self.nthreads if self.nblocks > 1 else t
        self.blk = t // self.nthreads if self.nblocks > 1 else np.zeros(1, np.int64)
        bx, by, _ = self.block
        self.thread_xyz = (self.tid % bx, (self.tid // bx) % by, self.tid // (bx * by))
        gx, gy, _ = self.grid
        lin = self.first_block + (t // self.nthreads if self.nblocks > 1 else np.zeros(1, np.int64))
        self.block_xyz = (lin % gx, (lin // gx) % gy, lin // (gx * gy))

    # ---- helpers ------------------------------------------------------------------------

    def full(self, x: np.ndarray) -> np.ndarray:
        """``x`` broadcast to the full thread axis (a read-only view when it was uniform)."""
        if x.shape[0] == self.T:
            return x
        return np.broadcast_to(x, (self.T,) + x.shape[1:])

    def active(self) -> np.ndarray:
        """The execution mask as a bool [T] array."""
        return np.ones(self.T, bool) if self.mask is None else self.mask

    def describe(self, t: int) -> str:
        """'thread (x, y, z) of block (x, y, z)' for thread ``t`` of the batch."""
        tx, ty, tz = (int(a[t]) if a.shape[0] > 1 else int(a[0]) for a in self.thread_xyz)
        b = t // self.nthreads
        gx, gy, _ = self.grid
        lin = self.first_block + b
        return (f"thread ({tx}, {ty}, {tz}) of block "
                f"({lin % gx}, {(lin // gx) % gy}, {lin // (gx * gy)})")

    def describe_block(self, b: int) -> str:
        """'block (x, y, z)' for block ``b`` of the batch."""
        gx, gy, _ = self.grid
        lin = self.first_block + b
        return f"block ({lin % gx}, {(lin // gx) % gy}, {lin // (gx * gy)})"


def where(mask: np.ndarray | None, new: np.ndarray, old: np.ndarray | None) -> np.ndarray:
    """``new`` on active threads, ``old`` elsewhere (``new`` when all are active or there is
    no old value). Broadcasts the mask over vector dims."""
    if mask is None or old is None:
        return new
    m = mask.reshape(mask.shape + (1,) * (max(np.ndim(new), np.ndim(old)) - 1))
    return np.where(m, new, old)


def and_mask(mask: np.ndarray | None, cond: np.ndarray, T: int) -> np.ndarray:
    """``mask & cond`` as a bool [T] array (cond may be uniform)."""
    c = np.broadcast_to(cond.astype(bool, copy=False), (T,))
    return c.copy() if mask is None else (mask & c)

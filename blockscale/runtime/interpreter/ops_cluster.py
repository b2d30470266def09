"""Thread-block clusters (sm_90): ``%cluster_ctarank`` / ``%cluster_nctarank``, ``mapa``
and the cluster barrier (``barrier.cluster.arrive`` / ``.wait``). ops_cpasync uses
:func:`peer_block` / :func:`decode_mapped` for multicast bulk copies and arrivals on a peer
CTA's mbarrier.

Model: a launch with a cluster dimension (``run_kernel(cluster=...)``) keeps every cluster
inside one batch of blocks, so the CTAs of a cluster run in lock-step. A CTA's rank is its
block position inside the cluster box, x fastest (CUDA's ``%cluster_ctarank``); without a
cluster launch every CTA is a cluster of one (rank 0). ``mapa(addr, r)`` encodes the CTA
of rank ``r`` above the shared window: ``addr + (r + 1) 2^32`` (shared addresses are below
2^18, global ones from 2^40). The cluster barrier: each block is fully active or inactive
at an arrive (as ``bar.sync``); a wait needs every CTA of the cluster to have arrived as
often as the waiting CTA has waited plus one (else :class:`ClusterBarrierError`: in
lock-step it could never complete), and then ends the race-detection interval of the
cluster's blocks like a CTA barrier.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import ops_gpu
from .compiler import Compiler, handles, type_str
from .frame import BarrierDivergenceError, Frame

MAPA_UNIT = 1 << 32


class ClusterBarrierError(RuntimeError):
    """A cluster barrier wait that cannot complete (a CTA of the cluster did not arrive)."""


def dims(f: Frame) -> tuple[int, int, int]:
    """The launch's cluster dimension ((1, 1, 1) without a cluster launch)."""
    return f.__dict__.get("cluster") or (1, 1, 1)


def ranks(f: Frame) -> np.ndarray:
    """Every thread's CTA rank in its cluster (x fastest)."""
    cx, cy, cz = dims(f)
    x, y, z = (np.asarray(v) for v in f.block_xyz)
    return (x % cx) + cx * ((y % cy) + cy * (z % cz))


def peer_block(f: Frame, t: int, rank: int, what: str) -> int:
    """The batch block index of the CTA of cluster rank ``rank`` in thread ``t``'s cluster."""
    cx, cy, cz = dims(f)
    if not 0 <= rank < cx * cy * cz:
        raise ValueError(f"{what}: CTA rank {rank} outside the cluster {(cx, cy, cz)} "
                         f"({f.describe(t)})")
    x, y, z = (int(np.asarray(f.full(v))[t]) if np.ndim(v) else int(v) for v in f.block_xyz)
    x, y, z = x - x % cx + rank % cx, y - y % cy + (rank // cx) % cy, z - z % cz + rank // (
        cx * cy)
    gx, gy, _ = f.grid
    b = x + gx * (y + gy * z) - f.first_block
    if not 0 <= b < f.nblocks:
        raise RuntimeError(f"{what}: CTA rank {rank} of the cluster is not in this batch of "
                           f"blocks ({f.describe(t)}); launch with run_kernel(cluster=...)")
    return b


def decode_mapped(f: Frame, t: int, addr: int, what: str) -> tuple[int, int]:
    """(batch block, shared address) of a shared::cluster address: a :func:`mapa` result, or
    a plain shared address of thread ``t``'s own CTA."""
    if addr < MAPA_UNIT:
        return (int(f.blk[t]) if f.blk.shape[0] > 1 else 0), addr
    return peer_block(f, t, addr // MAPA_UNIT - 1, what), addr % MAPA_UNIT


@handles("nvvm.read.ptx.sreg.cluster.ctarank", "nvvm.read.ptx.sreg.cluster.nctarank")
def _ctarank(op: Any, c: Compiler):
    out = c.slot(op.results[0])
    count = op.operation.name.endswith("nctarank")

    def run(f: Frame) -> None:
        v = np.array([int(np.prod(dims(f)))]) if count else ranks(f)
        f.vals[out] = np.asarray(v).reshape(-1).astype(np.int32)
    return run


@handles("nvvm.mapa")
def _mapa(op: Any, c: Compiler):
    if type_str(op.results[0]) != "!llvm.ptr<7>":
        raise NotImplementedError("interpreter: mapa to a generic address (only "
                                  "shared::cluster)")
    a_s, r_s = c.slots(op.operands)
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        a, r = np.asarray(f.full(f.vals[a_s])), np.asarray(f.full(f.vals[r_s])).astype(np.int64)
        n = int(np.prod(dims(f)))
        act = f.active()
        if np.any(act & ((r < 0) | (r >= n))) or np.any(act & (a >= MAPA_UNIT)):
            raise ValueError(f"mapa: a CTA rank outside the cluster of {n} or a non-shared::cta "
                             "address")
        f.vals[out] = a.astype(np.int64) + (r + 1) * MAPA_UNIT
    return run


def _cluster_state(f: Frame) -> dict[str, np.ndarray]:
    st = f.__dict__.get("cluster_barrier")
    if st is None:
        st = f.__dict__["cluster_barrier"] = {"arrived": np.zeros(f.nblocks, np.int64),
                                              "waited": np.zeros(f.nblocks, np.int64)}
    return st


def _whole_blocks(f: Frame, what: str) -> np.ndarray:
    if f.mask is None:
        return np.ones(f.nblocks, bool)
    per_block = f.mask.reshape(f.nblocks, f.nthreads)
    full, none = per_block.all(axis=1), ~per_block.any(axis=1)
    if not (full | none).all():
        b = int(np.argmax(~(full | none)))
        raise BarrierDivergenceError(f"{what} reached by {int(per_block[b].sum())} of "
                                     f"{f.nthreads} threads of {f.describe_block(b)}")
    return full


@handles("nvvm.cluster.arrive", "nvvm.cluster.arrive.relaxed")
def _arrive(op: Any, c: Compiler):
    def run(f: Frame) -> None:
        _cluster_state(f)["arrived"][_whole_blocks(f, "barrier.cluster.arrive")] += 1
    return run


@handles("nvvm.cluster.wait")
def _wait(op: Any, c: Compiler):
    c.uses_barrier = True

    def run(f: Frame) -> None:
        st = _cluster_state(f)
        blocks = _whole_blocks(f, "barrier.cluster.wait")
        size = int(np.prod(dims(f)))
        first_thread = np.arange(f.nblocks) * f.nthreads
        for b in np.flatnonzero(blocks):
            t = int(first_thread[b])
            need = st["waited"][b] + 1
            for r in range(size):
                p = peer_block(f, t, r, "barrier.cluster.wait")
                if st["arrived"][p] < need:
                    raise ClusterBarrierError(
                        f"barrier.cluster.wait in {f.describe_block(int(b))}: the CTA of rank "
                        f"{r} ({f.describe_block(p)}) has arrived {st['arrived'][p]} times, "
                        f"the wait needs {need}")
        st["waited"][blocks] += 1
        ops_gpu.barrier(f)
    return run

"""NVVM (CUDA) instruction helpers. Each docstring names the PTX instruction emitted.

Use inside ``with kernel_module(...)`` for a CUDA target; portable code should prefer the
``gpu`` dialect helpers of :mod:`blockscale.compiler.ir`.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import nvvm

from blockscale.compiler.ir_types import _loc, i32

FULL_MASK = 0xFFFFFFFF


def lane_id(*, loc: ir.Location | None = None) -> ir.Value:
    """Lane within the warp (i32): ``mov.u32 %r, %laneid``."""
    with _loc(loc):
        return nvvm.read_ptx_sreg_laneid(i32())


def _i32_const(v: int) -> ir.Value:
    from mlir.dialects import arith

    return arith.constant(i32(), ir.IntegerAttr.get(i32(), v if v < 2**31 else v - 2**32))


def shfl_xor(value: ir.Value, lane_mask: int, *, loc: ir.Location | None = None) -> ir.Value:
    """Butterfly exchange of an i32/f32 across the full warp:
    ``shfl.sync.bfly.b32 %r, %v, lane_mask, 0x1f, 0xffffffff``. All 32 lanes must execute it."""
    with _loc(loc):
        return nvvm.shfl_sync(value.type, _i32_const(FULL_MASK), value, _i32_const(lane_mask),
                              _i32_const(0x1F), nvvm.ShflKind.bfly)


def shfl_idx(value: ir.Value, src_lane: ir.Value | int, *,
             loc: ir.Location | None = None) -> ir.Value:
    """Read ``value`` from lane ``src_lane``: ``shfl.sync.idx.b32 %r, %v, src, 0x1f, 0xffffffff``.
    All 32 lanes must execute it."""
    with _loc(loc):
        src = _i32_const(src_lane) if isinstance(src_lane, int) else src_lane
        return nvvm.shfl_sync(value.type, _i32_const(FULL_MASK), value, src, _i32_const(0x1F),
                              nvvm.ShflKind.idx)


def byte_perm(a: ir.Value, b: ir.Value, selector: ir.Value | int, *,
              loc: ir.Location | None = None) -> ir.Value:
    """Select 4 bytes out of the 8 bytes of (b:a): ``prmt.b32 %r, %a, %b, %sel``."""
    with _loc(loc):
        sel = _i32_const(selector) if isinstance(selector, int) else selector
        return nvvm.prmt(i32(), a, sel, nvvm.PermuteMode.DEFAULT, hi=b)


def set_max_registers(count: int, increase: bool, *, loc: ir.Location | None = None) -> None:
    """Move this warpgroup's per-thread register budget to ``count`` (a multiple of 8 in
    [24, 256]; sm_90a): ``setmaxnreg.inc.sync.aligned.u32 count`` (``increase``, blocks until
    the registers are free) or ``setmaxnreg.dec.sync.aligned.u32 count``. All threads of the
    warpgroup must execute the same one."""
    if type(count) is not int or count % 8 or not 24 <= count <= 256:
        raise ValueError(f"count must be a multiple of 8 in [24, 256], got {count!r}")
    action = nvvm.SetMaxRegisterAction.increase if increase else nvvm.SetMaxRegisterAction.decrease
    with _loc(loc):
        nvvm.setmaxregister(count, action)


def grid_dependency_wait(*, loc: ir.Location | None = None) -> None:
    """Wait until the grids this one depends on (the previous kernel of the stream, when this
    grid was launched with programmatic stream serialization) have completed and their memory
    operations are visible: ``griddepcontrol.wait`` (sm_90+). A no-op for a grid launched
    the ordinary way. Per thread: every thread that reads what those grids wrote executes
    it first."""
    with _loc(loc):
        nvvm.griddepcontrol(nvvm.GridDepActionKind.wait)


def launch_dependents(*, loc: ir.Location | None = None) -> None:
    """Allow the next grid of the stream (launched with programmatic stream serialization) to
    be scheduled before this one completes, once every CTA of this grid has executed this
    or exited: ``griddepcontrol.launch_dependents`` (sm_90+). It does not make this grid's
    writes visible: the dependent still waits (:func:`grid_dependency_wait`)."""
    with _loc(loc):
        nvvm.griddepcontrol(nvvm.GridDepActionKind.launch_dependents)


def cluster_ctarank(*, loc: ir.Location | None = None) -> ir.Value:
    """This CTA's rank in its cluster (i32): ``mov.u32 %r, %cluster_ctarank``."""
    with _loc(loc):
        return nvvm.read_ptx_sreg_cluster_ctarank(i32())


def cluster_arrive(*, relaxed: bool = False, loc: ir.Location | None = None) -> None:
    """Arrive on the cluster barrier: ``barrier.cluster.arrive.aligned`` (release
    semantics: this thread's prior memory operations, e.g. arrivals on a peer CTA's
    mbarriers, are ordered before any thread's matching :func:`cluster_wait`) or with
    ``relaxed``, ``barrier.cluster.arrive.relaxed.aligned`` (no ordering). Every thread of
    every CTA of the cluster executes it once per phase (warp-uniform)."""
    with _loc(loc):
        if relaxed:
            nvvm.cluster_arrive_relaxed(aligned=True)
        else:
            nvvm.cluster_arrive(aligned=True)


def cluster_wait(*, loc: ir.Location | None = None) -> None:
    """Wait until every thread of the cluster arrived (:func:`cluster_arrive`), with
    acquire semantics: ``barrier.cluster.wait.aligned``."""
    with _loc(loc):
        nvvm.cluster_wait(aligned=True)

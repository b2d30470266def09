"""sm_80+ asynchronous global -> shared copies (``cp.async``), through the upstream ``nvgpu``
dialect (lowered by ``convert-nvgpu-to-nvvm``). Each docstring names the PTX emitted.

What the helpers rely on (PTX ISA "cp.async", "cp.async.commit_group", "cp.async.wait_group"):

* ``cp.async.cg.shared.global [dst], [src], 16``: a 16-byte copy that bypasses L1 (``.cg``;
  only 16-byte copies may), issued without waiting; both addresses 16-byte aligned.
* ``cp.async.commit_group`` closes the thread's copies issued since the last commit into a
  group; ``cp.async.wait_group N`` waits until at most N of the thread's most recent groups
  are pending: the older ones have landed in shared memory (for this thread; other threads
  see them after a barrier). The writes are made by the generic proxy: a wgmma (async proxy)
  reading them needs ``fence.proxy.async.shared::cta`` after the wait, before the barrier.

The numpy interpreter models them (:mod:`blockscale.runtime.interpreter.ops_cpasync`).
"""

from __future__ import annotations

from collections.abc import Sequence

from mlir import ir
from mlir.dialects import nvgpu

from blockscale.compiler.ir import as_index
from blockscale.compiler.ir_types import _loc

#: bytes of one copy (the only size ``.cg`` takes)
COPY_BYTES = 16


def copy16(dst: ir.Value, dst_index: ir.Value | int, src: ir.Value, src_index: ir.Value | int,
           *, loc: ir.Location | None = None) -> ir.Value:
    """Copy 16 bytes ``src[src_index:]`` (a global i8 memref) to ``dst[dst_index:]`` (a
    shared i8 memref), asynchronously: ``cp.async.cg.shared.global [dst], [src], 16, 16``.
    Returns the copy's ``!nvgpu.device.async.token`` (for :func:`commit`)."""
    with _loc(loc):
        return nvgpu.device_async_copy(dst, [as_index(dst_index)], src, [as_index(src_index)],
                                       ir.IntegerAttr.get(ir.IndexType.get(), COPY_BYTES),
                                       bypass_l1=True)


def commit(tokens: Sequence[ir.Value], *, loc: ir.Location | None = None) -> ir.Value:
    """Close the copies issued since the last commit into a group:
    ``cp.async.commit_group``. Returns the group's token (for :func:`wait`)."""
    with _loc(loc):
        return nvgpu.device_async_create_group(list(tokens))


def wait(group: ir.Value, pending: int, *, loc: ir.Location | None = None) -> None:
    """Wait until at most ``pending`` of this thread's copy groups are in flight:
    ``cp.async.wait_group pending`` (``group``: any group token; the wait counts groups, it
    does not name one)."""
    with _loc(loc):
        nvgpu.device_async_wait(group, num_groups=pending)

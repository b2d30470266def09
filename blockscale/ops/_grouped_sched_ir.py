"""IR of the grouped pdq kernel's dynamic schedule (``GroupedPdqSpec.schedule="dynamic"``).

Imports MLIR. A grid of about one CTA an SM; each CTA takes work units (column tile x work
item, column fastest: the order of the upper-bound grid's CTAs) from a global counter until
they run out (:func:`unit_loop`), so no CTA is launched for an item that does not exist
(the upper-bound grid's thousands of empty CTAs at gpt-oss T=4096, which also held back
the band pair's programmatic launch: run EJ) and the units balance over the SMs as the
hardware's CTA dispatch did. The ring's mbarriers are invalidated after each unit
(:func:`invalidate_barriers`) and initialised again by the next.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mlir import ir
from mlir.dialects import arith, llvm, memref, nvvm, scf

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import tma

#: counter words a schedule uses from its ``slot`` on: units taken, CTAs done
SLOT_WORDS = 2


def unit_loop(kb: Any, counters: Any, slot: int, units: Any,
              body: Callable[[Any], None]) -> None:
    """Run ``body(w)`` (every thread, CTA-uniform ``w``: index) for the units ``w`` this CTA
    takes: thread 0 takes the next one by ``atom.add`` on ``counters[slot]`` and hands it to
    the CTA through shared memory; the loop ends at the first ``w >= units``. Then the CTA
    counts itself done on ``counters[slot + 1]``; the last one resets both words to zero, so
    the next launch (after this grid: the same stream) finds them zero.
    ``counters``: an int32 buffer, zero before the launch."""
    i32 = bir.i32()
    tid = bir.thread_idx("x")
    share = tma.shared_buffer(kb, "1xi32", align=4)
    loop = scf.WhileOp([ir.IndexType.get()], [])
    before = loop.before.blocks.append()
    with ir.InsertionPoint(before):
        with bir.when(bir.eq(tid, 0)):
            taken = memref.atomic_rmw(arith.AtomicRMWKind.addi, bir.const(1, i32), counters,
                                      [bir.as_index(slot)])
            bir.store(taken, share, 0)
        bir.barrier()
        w = bir.as_index(bir.load(share, 0))
        bir.barrier()  # every thread has read it before thread 0 takes the next
        scf.condition(bir.ult(w, units), [w])
    after = loop.after.blocks.append(ir.IndexType.get())
    with ir.InsertionPoint(after):
        body(after.arguments[0])
        scf.yield_([])
    with bir.when(bir.eq(tid, 0)):
        done = memref.atomic_rmw(arith.AtomicRMWKind.addi, bir.const(1, i32), counters,
                                 [bir.as_index(slot + 1)])
        last = bir.eq(bir.as_index(done), bir.sub(bir.grid_dim("x"), 1))
        with bir.when(last):  # every CTA has taken its last (past the end) unit
            for j in range(SLOT_WORDS):
                bir.store(bir.const(0, i32), counters, slot + j)


def invalidate_barriers(addresses: Sequence[Any]) -> None:
    """``mbarrier.inval`` of each shared mbarrier (i64 shared addresses), so a later
    ``mbarrier.init`` of the same words is defined; call after a CTA barrier, when no
    thread uses them any more."""
    for a in addresses:
        nvvm.mbarrier_inval(llvm.inttoptr(ir.Type.parse("!llvm.ptr<3>"), a))

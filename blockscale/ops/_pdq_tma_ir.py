"""The producer's ring of PACKED weight bytes for the grouped producer-dequant kernel
(:mod:`blockscale.ops.matmul_grouped_pdq`, ``b_source="tma"``; issue #10).

Why: with ``ld.global`` the producer's loads of step t + 1 are in flight at its proxy fence
after step t's shared stores (``fence.proxy.async``: SASS MEMBAR.ALL.CTA +
FENCE.VIEW.ASYNC.S), and at 256 x 128 ncu shows its short step waiting on them. Here the
packed weights and their scale atoms arrive by TMA (the async proxy: no thread's access is in
flight at the fence) in a ring of :func:`blockscale.ops._pdq_tma.slots` steps in static shared
memory (3 of 256-row tiles, 6 of 128-row ones), filled that many steps ahead; the producer
threads read them with ``ld.shared``. Measured on the H200 (runs AF / AJ): byte-equal and
sanitizer-clean, but 3-5 % slower than the ``ld.global`` producer at both item shapes (its
loop is ~35-90 SASS a step longer): kept selectable (``b_source="tma"``), not dispatched.

Per slot: the step's B tile rows (256 or 128, the 256 x 128 items) x 32 bytes (one box of
``w_map``: the weights as a ``[E N, K / 2]`` byte tensor, 32-byte swizzle, zeros past the
last expert's rows and past K / 2) and the 512-byte scale atoms of its 128-row parts and atom
column (boxes of ``sfw_map``: the 6-D scales as ``[atoms 2, 256]`` bytes, zeros past the last
atom). ``full`` (one arrival + the slot's bytes) per slot; ``empty`` counts the 128 producer
threads' reads, after which the producers' thread 0 refills the slot with step
``t + slots``. The values read equal :func:`blockscale.ops._pdq_ir._load_step`'s (rows past
the item's rows and halves past K: zeros), so the stage bytes, and the output bytes, are the same.
"""

from __future__ import annotations

from typing import Any

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import tma
from blockscale.ops._pdq_tma import ATOM_BYTES, ROW_BYTES, slot_bytes, slots, tensormap_args

Value = ir.Value

class TmaB:
    """The ring of one grouped work item's B operand (module docstring): ``b`` the item's
    packed rows (:class:`blockscale.ops._pdq_ir.PackedRows`: ``row0`` its first weight row,
    ``rows_valid``, ``k``), ``atom0`` the scale atom row of its first 128 rows (6-D layout),
    ``d1`` atom columns a 128-row tile, ``ring`` the kernel's
    :class:`blockscale.ops._pdq_ir._PdqRing` (threads, steps)."""

    def __init__(self, kb: Any, fmt: str, b: Any, atom0: Value, d1: Value, ring: Any) -> None:
        if b.tile not in (128, 256):
            raise ValueError(f"the weight ring holds 128- or 256-row tiles, got {b.tile}")
        self.fmt, self.b, self.atom0, self.d1, self.ring = fmt, b, atom0, d1, ring
        self.rows, self.na, self.slots = b.tile, b.tile // 128, slots(b.tile)
        self.data = tma.shared_buffer(kb, f"{self.slots}x{self.rows}x{ROW_BYTES}xi8",
                                      align=1024)
        self.atoms = tma.shared_buffer(kb, f"{self.slots * self.na}x2x256xi8", align=128)
        self.full = tma.mbarrier_group(self.slots)
        self.empty = tma.mbarrier_group(self.slots)
        wmap, smap = tensormap_args(fmt, self.rows)
        self.wdesc = tma.descriptor(kb.arg("w_map"), wmap)
        self.sdesc = tma.descriptor(kb.arg("sfw_map"), smap)
        #: scale blocks of a k64 step (NVFP4 16-element blocks: a whole atom column)
        self.blocks = 4 if fmt == "nvfp4" else 2

    def init_barriers(self) -> None:
        """Producer thread 0, before the kernel's mbarrier-init fence and CTA barrier."""
        for i in range(self.slots):
            tma.mbarrier_init(self.full, 1, i)
            tma.mbarrier_init(self.empty, 128, i)

    def issue(self, t: Value) -> None:
        """Producer thread 0: copy step ``t`` (if ``t < steps``) into slot ``t % slots``."""
        from blockscale.ops._wgmma_ws_ir import _tile

        with bir.when(bir.logical_and(self.ring.is_prod, bir.ult(t, self.ring.steps))):
            slot = bir.urem(t, self.slots)
            tma.mbarrier_arrive_expect_tx(self.full, slot_bytes(self.rows), slot)
            tma.tma_load(_tile(self.data, slot, self.rows, ROW_BYTES), self.wdesc,
                         [bir.mul(t, ROW_BYTES), self.b.row0], self.full, slot)
            col = bir.udiv(bir.mul(t, self.blocks), 4)  # the step's atom column
            for j in range(self.na):
                atom = bir.add(bir.mul(bir.add(self.atom0, j), self.d1), col)
                tma.tma_load(_tile(self.atoms, bir.add(bir.mul(slot, self.na), j), 2, 256),
                             self.sdesc, [0, bir.mul(atom, 2)], self.full, slot)

    def prologue(self) -> None:
        """The first ``slots`` steps' copies (after the CTA barrier)."""
        for i in range(self.slots):
            self.issue(bir.const(i))

    def read(self, pt: Value, t: Value) -> list[Value]:
        """Producer thread ``pt``'s (data vector<16xi8>, scale bytes i32) of k-step ``t``, per
        row ``pt + 128 j`` and 32-element half (as ``_load_step``: zeros past the rows or
        K); then this thread's release of the slot, and thread 0's refill of it with step
        ``t + slots`` once all 128 have read it."""
        from blockscale.ops._wgmma_ws_ir import _load, _parity, _swizzled

        b, slot = self.b, bir.urem(t, self.slots)
        parity = _parity(bir.udiv(t, self.slots))
        rows = self.rows
        tma.mbarrier_wait(self.full, parity, slot)
        nsc = self.blocks // 2  # scale bytes of a 32-element half
        vd, vs = bir.vec(16, bir.i8()), bir.vec(nsc, bir.i8())
        word = bir.i8() if nsc == 1 else bir.i16()
        out = []
        for j in range(self.na):
            r = bir.add(pt, 128 * j)
            row_ok = bir.ult(r, b.rows_valid)
            rr = bir.urem(r, 128)
            for half in range(2):
                p = bir.add(bir.mul(t, 2), half)
                ok = bir.logical_and(row_ok, bir.ult(bir.mul(p, 32), b.k))
                off = bir.add(bir.mul(r, ROW_BYTES), half * 16)
                data = _load(self.data, vd, bir.add(bir.mul(slot, rows * ROW_BYTES),
                                                    _swizzled(off)), rows * ROW_BYTES, 16)
                blk = bir.urem(bir.mul(p, nsc), 4)
                soff = bir.add(bir.add(bir.mul(bir.urem(rr, 32), 16),
                                       bir.mul(bir.udiv(rr, 32), 4)), blk)
                atom = bir.add(bir.mul(slot, self.na), j)
                sc = _load(self.atoms, vs, bir.add(bir.mul(atom, ATOM_BYTES), soff),
                           ATOM_BYTES, nsc)
                sw = arith.extui(bir.i32(), vector.extract(
                    vector.bitcast(bir.vec(1, word), sc), [], [0]))
                out += [arith.select(ok, data, bir.const(0, vd)),
                        arith.select(ok, sw, bir.const(0, bir.i32()))]
        tma.mbarrier_arrive_expect_tx(self.empty, 0, slot)
        with bir.when(self.ring.is_prod):
            tma.mbarrier_wait(self.empty, parity, slot)
        self.issue(bir.add(t, self.slots))
        return out

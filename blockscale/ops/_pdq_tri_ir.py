"""The 192 x 192 work item of the grouped producer-dequant kernel (issue #10): :class:`Tri`,
the hooks :func:`blockscale.ops._pdq_ir.emit_mainloop` calls for it.

Imports MLIR: only :func:`blockscale.ops.matmul_grouped_pdq.build` (``bm=192``) uses it.

Why: the kernel's time is ~0.17 ms + 0.032 ms a k64 step at gpt-oss T=4096 (run AL), the step
bound by the producer warpgroup's dequantization of the item's weight tile, once per item. With
128-row items a group of 128 +- 11 rows takes two items about half the time (193 items for 128
groups), each dequantizing the expert's whole weight matrix; with 192-row items every such
group is one item (128 items): 2/3 of the weight dequantization per routed row. Three consumer
warpgroups of ``m64n192k16`` (96 fp32 accumulators a thread: the 128 registers of 512 threads
hold them, as the two-producer 128 x 192 kernel) and one producer warpgroup (three 32-element
row halves a thread and step, :func:`blockscale.ops._pdq_ir._units`).

A: the item's rows are group slabs (64 rows) ``3 i .. 3 i + 2``, i.e. slab ``i % 2`` on of the
group's 128-row workspace tile ``3 i // 2`` (:mod:`blockscale.ops._grouped_p1_ir`): the stage
holds two workspace tiles copied verbatim as in :class:`blockscale.ops._pdq_tall_ir.Tall`
(the second only where it exists), warpgroup ``w`` reads slab ``i % 2 + w`` (span ``s // 2``,
1024 bytes in for ``s % 2``: the 128-row layout, LBO 2048). B: 192 rows in the same layout
(LBO 3072), stored by the producer. Per k16 step each warpgroup issues one ``m64n192k16`` on
the same bf16 operands as the 128 x 256 kernel's ``m64n256k16`` (its 192 columns): each output
gets the same products in the same order, so the same bytes. A warpgroup whose 64 rows lie
past the group's end issues no wgmma (as ``skip``).
"""

from __future__ import annotations

from typing import Any

from mlir import ir

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import wgmma as W
from blockscale.ops import _pdq_tall_ir as TL
from blockscale.ops import _twophase_ir as T

Value = ir.Value

#: the work item (rows x columns), the consumer warpgroups, the ring's A rows (two tiles)
BM, BN, WGS, A_ROWS = 192, 192, 3, 256
#: k16 step strides of A (two 16-byte chunks of 128 rows) and of B (of 192 rows)
K16_A, K16_B = 2 * 128 * 16, 2 * BN * 16


class Tri(TL.Tall):
    """The 192 x 192 item's hooks (module docstring): ``rows`` (index) of the group from the
    item's first row on, ``has2`` (i1) whether the second copied workspace tile exists,
    ``odd`` (index 0 / 1) the item's first slab within its first tile."""

    wgs = WGS
    nacc = 1
    units = True

    def __init__(self, rows: Value, has2: Value, odd: Value) -> None:
        super().__init__(rows, has2)
        self.odd = odd

    @staticmethod
    def check(a: Any, bm: int, bn: int, producers: int) -> None:
        from blockscale.ops._pdq_ir import PackedRows

        if isinstance(a, PackedRows) or (bm, bn, producers) != (A_ROWS, BN, 1):
            raise ValueError(f"the 192 x 192 item takes A from the workspace (a ring of "
                             f"bm={A_ROWS} A rows), bn={BN} and one producer warpgroup, got "
                             f"bm={bm}, bn={bn}, producers={producers}, packed A "
                             f"{isinstance(a, PackedRows)}")

    @staticmethod
    def descriptors(ring: Any) -> None:
        """Stage-0 descriptors of A's span 0 and of B (LBO 2048 / 3072, SBO 128)."""
        ring.da0 = W.descriptor(ring.base, lbo=128 * 16, sbo=T.LBO)
        ring.db0 = W.descriptor(ring.base, lbo=BN * 16, sbo=T.LBO)

    def consume(self, ring: Any, step: Value, acc: Value) -> Value:
        """A live warpgroup's step (:meth:`blockscale.ops._twophase_ir._Ring.consume` with its
        slab's A offset): wait, four ``m64n192k16``, retire step - 1's, release its stage."""
        stage0 = TL.wait_stage(ring, step)
        s = bir.add(self.odd, ring.wg)  # the warpgroup's slab in the two copied tiles
        a_off = bir.add(bir.mul(bir.udiv(s, 2), TL.SPAN), bir.mul(bir.urem(s, 2), TL.SLAB))
        da = W.advance(ring.da0, bir.as_i64(bir.add(stage0, a_off)))
        db = W.advance(ring.db0, bir.as_i64(bir.add(stage0, ring.a_bytes)))
        W.fence()
        for h in range(4):
            acc = W.mma_async(acc, W.advance(da, h * K16_A), W.advance(db, h * K16_B), BN,
                              dtype=ring.dtype)
        TL.release_previous(ring, step, True)
        return acc

    def consumer_loop(self, ring: Any, steps: Value) -> list[Value]:
        """The consumers' K loop ("split"), warpgroups past the group's rows idle
        (:class:`blockscale.ops._pdq_tall_ir.Skip`): the accumulator."""
        return [TL.Skip(self.rows, self.consume).consumer_loop(ring, steps, BN)]

    def consume_any(self, ring: Any, step: Value, accs: list[Value]) -> list[Value]:
        """One step of the "lockstep" loop (a branch per step)."""
        return [TL.Skip(self.rows, self.consume).consume_any(ring, step, accs[0])]

"""The 256 x 128 work item of the grouped producer-dequant kernel (issue #10, step 2):
:class:`Tall`, the hooks :func:`blockscale.ops._pdq_ir.emit_mainloop` calls for it.

Imports MLIR: only :func:`blockscale.ops.matmul_grouped_pdq.build` (``bm=256``) uses it.

Why: at T = 4096 gpt-oss routing (128 +- 11 rows an expert) a 128 x 256 item dequantizes A's
128 rows and B's 256 every k64 step, and each expert's weights twice (two row tiles). Here a
CTA computes 256 rows x 128 columns: A is two consecutive tiles of the grouped phase-1
workspace (:mod:`blockscale.ops._grouped_p1_ir`: the group's row tiles ``2 i`` and ``2 i +
1``), bulk-copied by producer thread 0, and the producer warpgroup dequantizes ONE weight row
per thread and step (1/3 of the 128 x 256 item's rows for the same MMA), so at T = 4096 each
expert's weights are dequantized once.

Stage (48 KiB, as the 128 x 256 ring's): A, two 16 KiB spans (the workspace tiles' k-step
spans copied verbatim: the 128-row no-swizzle layout, chunk ``c`` of row ``r`` at ``c 2048 +
r 16``), then B, 128 rows in the same layout (the producer's stores). Consumer warpgroup ``w``
owns rows ``128 w ..`` (span ``w``) as two m64 slabs (1024 bytes apart); per k16 step ``h``
it issues ``m64n128k16`` for slab 0 then slab 1 (descriptors LBO 2048, SBO 128; A and B
advance 4096 bytes a k16 step): every output element gets its k16 products in the same
order as the 128 x 256 kernel's ``m64n256k16``, from the same bf16 operands, so the same
bytes. Registers: 2 x 64 fp32 accumulators a thread (128, as m64n256).

Skipping: a slab whose first row is past the group's last row issues no wgmma (its
accumulator stays zero; its rows are not stored). The count ``n`` (0, 1, 2) of a warpgroup's
live slabs is broadcast from lane 0 (``shfl.sync``: warp-uniform for ptxas) and branches
OUTSIDE the K loop into one of three loops (2 slabs, 1 slab, none: the idle warpgroup still
waits on every full barrier and releases every stage, so the empty barriers keep counting two
warpgroups). The tensor pipe is shared by the SM's warpgroups, so skipped slabs free it. The
second A tile is not copied when the item has 128 rows or fewer (expect_tx counts the bytes
copied: 16 or 32 KiB); warpgroup 1 is then idle and reads nothing of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlir import ir

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import cpasync
from blockscale.compiler.arch import wgmma as W
from blockscale.ops import _twophase_ir as T
from blockscale.ops._mma_ir import WarpCoords

Value = ir.Value

#: the work item (rows x columns), the consumer warpgroups, m64 slabs a warpgroup
BM, BN, WGS, SLABS = 256, 128, 2, 2
#: bytes of one 128-row workspace tile's k64 span (one warpgroup's A in a stage)
SPAN = 128 * 2 * 64
#: k16 step stride in the 128-row layout (two 16-byte chunks of 128 rows); slab stride
K16, SLAB = 2 * 128 * 16, 64 * 16


class SlabCoords(WarpCoords):
    """:class:`~blockscale.ops._mma_ir.WarpCoords` of a warpgroup's two m64 slabs: m-tile
    ``mt`` is slab ``mt`` (rows 64 apart; ``row0 = 128 wg + 16 warp``)."""

    def c_row(self, mt: int, i: int) -> Value:
        return bir.add(self.row0, bir.add(self.g, mt * 64 + 8 * (i >> 1)))


def slab_coords(wg: Value) -> SlabCoords:
    """The fragment coordinates of consumer warpgroup ``wg`` (index) of the 256 x 128 tile."""
    tid = bir.thread_idx("x")
    lane, warp = bir.urem(tid, 32), bir.urem(bir.udiv(tid, 32), 4)
    return SlabCoords(tid, bir.udiv(lane, 4), bir.urem(lane, 4),
                      bir.add(bir.mul(wg, 128), bir.mul(warp, 16)), bir.const(0))


def slab(wc: SlabCoords, j: int) -> WarpCoords:
    """Slab ``j``'s coordinates alone (m-tile 0 at ``row0 + 64 j``), for stores that take
    one m-tile row (the grouped wgmma kernel's σ direct store)."""
    return WarpCoords(wc.tid, wc.g, wc.t, bir.add(wc.row0, 64 * j), wc.col0)


def tiles(accs: tuple[Value, Value]) -> list[Any]:
    """The slab accumulators as m16n8 C tiles (m-tile = slab, :class:`SlabCoords`)."""
    from blockscale.ops._wgmma_ir import accumulator_tiles

    return [accumulator_tiles(a, BN)[0] for a in accs]


def wait_stage(ring: Any, step: Value) -> Value:
    """A consumer warpgroup: wait for the stage of CTA step ``step``; its byte offset."""
    slot = bir.urem(step, ring.stages)
    cpasync.mbarrier_wait(ring.full(slot), T._parity(bir.udiv(step, ring.stages)))
    return bir.mul(slot, ring.sbytes)


def release_previous(ring: Any, step: Value, issued: bool) -> None:
    """After step ``step``'s wgmmas (``issued``: commit them, retire step - 1's): release step
    - 1's stage, one arrival per warpgroup (step 0 releases the unused last stage, as
    :meth:`blockscale.ops._twophase_ir._Ring.consume`)."""
    if issued:
        W.commit_group()
        W.wait_group(1)
    prev = bir.urem(bir.add(step, ring.stages - 1), ring.stages)
    with bir.when(bir.eq(bir.urem(ring.tid, 128), 0)):
        cpasync.mbarrier_arrive(ring.empty(prev))


class Tall:
    """The 256 x 128 item's hooks (module docstring): ``rows`` (index) of the group from the
    item's first row on (may exceed 256), ``has2`` (i1) whether its second 128-row tile
    exists."""

    wgs = WGS
    #: accumulators a consumer thread carries; whether the producer deals units (_units)
    nacc, units = SLABS, False

    def __init__(self, rows: Value, has2: Value) -> None:
        self.rows, self.has2 = rows, has2

    @staticmethod
    def check(a: Any, bm: int, bn: int, producers: int) -> None:
        from blockscale.ops._pdq_ir import PackedRows

        if isinstance(a, PackedRows) or (bm, bn, producers) != (BM, BN, 1):
            raise ValueError(f"the 256 x 128 item takes A from the workspace, bm={BM}, bn={BN} "
                             f"and one producer warpgroup, got bm={bm}, bn={bn}, "
                             f"producers={producers}, packed A {isinstance(a, PackedRows)}")

    def copier(self, ring: Any, ws: Value, a_tile: Value | None) -> Callable[..., None]:
        """``copy(full, stage0, t)``: producer thread 0 expects the item's A bytes of k-step
        ``t`` on ``full`` and bulk-copies workspace tiles ``a_tile`` (and ``a_tile + 1``
        where it exists) into the stage's two spans."""
        if a_tile is None:
            raise ValueError("the 256 x 128 item needs the workspace tile (a_tile)")
        tb = bir.mul(ring.kp, 2 * 128)  # bytes of one workspace tile
        src0 = bir.add(cpasync.global_address(ws), bir.as_i64(bir.mul(a_tile, tb)))
        src1 = bir.add(src0, bir.as_i64(tb))
        nbytes = bir.select(self.has2, bir.const(2 * SPAN, bir.i32()),
                            bir.const(SPAN, bir.i32()))

        def copy(full: Value, stage0: Value, t: Value) -> None:
            with bir.when(ring.is_prod):
                cpasync.mbarrier_arrive_expect_tx_n(full, nbytes)
                off = bir.as_i64(bir.mul(t, SPAN))
                dst = bir.add(ring.base, bir.as_i64(stage0))
                cpasync.bulk_copy(dst, bir.add(src0, off), SPAN, full)
                with bir.when(self.has2):
                    cpasync.bulk_copy(bir.add(dst, bir.as_i64(bir.const(SPAN))),
                                      bir.add(src1, off), SPAN, full)
        return copy

    @staticmethod
    def descriptors(ring: Any) -> None:
        """Stage-0 descriptors of A's span 0 and of B (128-row layouts: LBO 2048, SBO 128)."""
        ring.da0 = W.descriptor(ring.base, lbo=128 * 16, sbo=T.LBO)
        ring.db0 = W.descriptor(ring.base, lbo=BN * 16, sbo=T.LBO)

    def live_slabs(self, ring: Any) -> Value:
        """This warpgroup's slabs with a row inside the group (i32 0 .. 2), from lane 0."""
        from blockscale.compiler.arch import nvvm

        lo = bir.mul(ring.wg, 128)
        rest = bir.select(bir.ult(lo, self.rows), bir.sub(self.rows, lo), 0)
        return nvvm.shfl_idx(bir.as_i32(bir.umin(bir.ceil_div(rest, 64), SLABS)), 0)

    @staticmethod
    def consume(ring: Any, step: Value, accs: list[Value], n: int) -> list[Value]:
        """:meth:`blockscale.ops._twophase_ir._Ring.consume` for ``n`` live slabs: wait for
        the stage, per k16 step the slabs' ``m64n128k16`` (none for n = 0), retire step - 1's
        and release its stage."""
        stage0 = wait_stage(ring, step)
        if n:
            da = W.advance(ring.da0, bir.as_i64(bir.add(stage0, bir.mul(ring.wg, SPAN))))
            db = W.advance(ring.db0, bir.as_i64(bir.add(stage0, ring.a_bytes)))
            W.fence()
            accs = list(accs)
            for h in range(4):
                for j in range(n):
                    accs[j] = W.mma_async(accs[j], W.advance(da, h * K16 + j * SLAB),
                                          W.advance(db, h * K16), BN, dtype=ring.dtype)
        release_previous(ring, step, bool(n))
        return accs

    def consumer_loop(self, ring: Any, steps: Value) -> list[Value]:
        """The consumers' K loop ("split"): one of three loops by the live slabs (a
        warp-uniform branch outside the loop); the two slab accumulators (zeros where not
        live)."""
        n = self.live_slabs(ring)
        acc_t = W.accumulator_type(BN)

        def loop(live: int) -> list[Value]:
            with bir.for_range(0, steps, carry=[W.zero_accumulator(BN)] * live) as cl:
                accs = self.consume(ring, cl.iv, list(cl.carried), live)
                if live:
                    cl.yield_(*accs)
            out = list(cl.results) if live else []
            if live:
                W.wait_group(0)
            return out + [W.zero_accumulator(BN) for _ in range(SLABS - live)]

        return self._three_way(n, acc_t, loop)

    def consume_any(self, ring: Any, step: Value, accs: list[Value]) -> list[Value]:
        """One step of the "lockstep" loop: :meth:`consume` of the live slabs (a branch per
        step; the interpreter's loop)."""
        n = self.live_slabs(ring)
        return self._three_way(n, W.accumulator_type(BN),
                               lambda live: self.consume(ring, step, accs, live))

    @staticmethod
    def _three_way(n: Value, acc_t: ir.Type, body: Callable[[int], list[Value]]
                   ) -> list[Value]:
        two = bir.if_(bir.eq(n, bir.const(2, bir.i32())), [acc_t] * SLABS)
        with two.then():
            two.yield_(*body(2))
        with two.else_():
            one = bir.if_(bir.eq(n, bir.const(1, bir.i32())), [acc_t] * SLABS)
            with one.then():
                one.yield_(*body(1))
            with one.else_():
                one.yield_(*body(0))
            two.yield_(*one.results)
        return list(two.results)


class Skip:
    """The 128 x bn item's consumers with the same skipping (``skip=True`` specs): a
    warpgroup whose 64 rows all lie past the group's last row (``rows`` from the item's first
    row on, index) issues no wgmma (a warp-uniform branch outside the K loop; the idle loop
    still waits on every full barrier and releases every stage). Its accumulator stays zero
    and its rows are not stored: the same bytes. ``consume(ring, step, acc)``: a live
    warpgroup's step (default :meth:`blockscale.ops._twophase_ir._Ring.consume`; the 192 x 192
    item passes its own, :class:`blockscale.ops._pdq_tri_ir.Tri`)."""

    def __init__(self, rows: Value,
                 consume: Callable[[Any, Value, Value], Value] | None = None) -> None:
        self.rows = rows
        self.consume = consume or (lambda ring, step, acc: ring.consume(step, acc))

    def live(self, ring: Any) -> Value:
        """i1: this warpgroup has a row inside the group (broadcast from lane 0)."""
        from blockscale.compiler.arch import nvvm

        own = bir.as_i32(bir.ult(bir.mul(ring.wg, 64), self.rows))
        return bir.ne(nvvm.shfl_idx(own, 0), bir.const(0, bir.i32()))

    def consumer_loop(self, ring: Any, steps: Value, bn: int) -> Value:
        """The consumers' K loop ("split"): the accumulator (zeros where not live)."""
        br = bir.if_(self.live(ring), [W.accumulator_type(bn)])
        with br.then():
            with bir.for_range(0, steps, carry=[W.zero_accumulator(bn)]) as cl:
                cl.yield_(self.consume(ring, cl.iv, cl.carried[0]))
            W.wait_group(0)
            br.yield_(cl.results[0])
        with br.else_():
            with bir.for_range(0, steps) as idle:
                Tall.consume(ring, idle.iv, [], 0)
            br.yield_(W.zero_accumulator(bn))
        return br.results[0]

    def consume_any(self, ring: Any, step: Value, acc: Value) -> Value:
        """One step of the "lockstep" loop (a branch per step)."""
        br = bir.if_(self.live(ring), [acc.type])
        with br.then():
            br.yield_(self.consume(ring, step, acc))
        with br.else_():
            Tall.consume(ring, step, [], 0)
            br.yield_(acc)
        return br.results[0]

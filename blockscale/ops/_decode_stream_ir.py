"""IR of the persistent grouped decode kernel (variant "mma_c8w"): CTAs walk work units.

Imports MLIR: only :func:`blockscale.ops.matmul_decode.build` imports this module.

Why
---
"mma_c8t" runs one CTA per (group, 64-column tile): each CTA pays a fixed cost (its first
step's load latency with nothing to overlap, the stores, the CTA start, the zeroing of its
B fragments), fitted at ~1.4 of K = 2880's 5.6 steps on the H200 (run P). "mma_c8w" keeps
the "mma_c8t" step loop (the same SASS per weight byte) and launches
``P = min(units, STREAM_CTAS)`` CTAs (4 per SM: one wave), CTA c computing units
c, c + P, c + 2P, ..; the peeled last step of a unit fetches the first step of the CTA's
next unit (16 KB: weights, scale words, activations) into registers before its MMAs, so
the next unit's loads are in flight during the current unit's last MMAs, stores and unit
decode. The grid is one wave: no partial last wave (T = 16: 11 waves of "mma_c8t" CTAs,
the last a third full).

Work units
----------
Unit u = y * tiles + x: row block ``group_list[y] = p * num_groups + g`` (``list_len`` of
them, :func:`blockscale.ops.matmul_decode.row_blocks`: rows ``[start + 8 p, + 8)`` of group
g), columns ``[64 x, 64 x + 64)`` (``tiles = ceil(N / 64)``). A unit is live when it has
rows and its expert id is >= 0; a unit of id -1 with rows writes its zeros (D8); a unit
without rows (an empty group, or a block past a short group's end: device-side
``expert_start`` only) does nothing. Each output
is computed by one unit in the "mma_c8t" order: bit for bit the portable kernel's result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from mlir import ir
from mlir.dialects import arith

import blockscale.ops._matmul_ir as mir
from blockscale.compiler import ir as bir
from blockscale.layouts import SF_ATOM_ROWS

Value = ir.Value

#: output columns and group rows of a unit (the "mma_c8" CTA tile and pass)
COLS = 64
ROWS = 8
#: raw info words of a unit (row block, group start and end, expert id, A scale offset)
WORDS = 5


class Unit(NamedTuple):
    """One work unit's geometry (index values unless noted)."""

    group: Value
    e: Value  #: the expert (id clamped to >= 0)
    n0: Value
    r0: Value
    rows: Value  #: rows of the unit (0..8)
    live: Value  #: i1: rows > 0 and expert id >= 0
    zero: Value  #: i1: rows > 0 and expert id < 0 (D8)
    a_srow: Callable[[Value], Value]


class Units:
    """The work units of a grouped decode launch (kernel arguments ``group_list``,
    ``list_len``, ``num_groups``, ``expert_start``, ``expert_ids``, ``a_scale_offsets``) and
    their output (``expert_scales``, ``a_row_scales`` with ``row_scales``, ``c``)."""

    def __init__(self, kb: Any, n_count: Value, row_scales: bool):
        self.kb = kb
        self.n_count = n_count
        self.row_scales = row_scales
        self.tiles = bir.ceil_div(n_count, COLS)
        self.groups = bir.as_index(kb.arg("num_groups"))
        self.count = bir.mul(bir.as_index(kb.arg("list_len")), self.tiles)

    def info(self, u: Value) -> Unit:
        """Unit u's geometry (a few L1-resident loads: group list, group bounds, id)."""
        return self.decode(u, [self.word(u, k) for k in range(WORDS)])

    def word(self, u: Value, k: int) -> Value:
        """Word k (i32) of unit u's raw info: row block, group start, end, expert id, A
        scale tile offset (the last four after a dependent load of the first)."""
        kb = self.kb
        blk = bir.load(kb.arg("group_list"), bir.udiv(u, self.tiles))
        if k == 0:
            return blk
        g = bir.urem(bir.as_index(blk), self.groups)
        name, off = (("expert_start", 0), ("expert_start", 1), ("expert_ids", 0),
                     ("a_scale_offsets", 0))[k - 1]
        return bir.load(kb.arg(name), bir.add(g, off) if off else g)

    def prefetch(self, u: Value, tid: Value) -> Value:
        """Threads 0..4: unit u's row block word (u < count; the load stays in flight); the
        first half of :meth:`prefetch_word`."""
        br = bir.if_(bir.ult(tid, WORDS), [bir.i32()])
        with br.then():
            br.yield_(self.word(u, 0))
        with br.else_():
            br.yield_(bir.const(0, bir.i32()))
        return br.results[0]

    def prefetch_word(self, blk: Value, tid: Value) -> Value:
        """Thread k in 1..4: word k of the unit whose row block word is ``blk`` (one load at
        an address from ``blk``: issue it once ``blk`` has arrived); other threads: ``blk``."""
        g = bir.urem(bir.as_index(blk), self.groups)
        out = blk
        for k, (name, off) in enumerate((("expert_start", 0), ("expert_start", 1),
                                         ("expert_ids", 0), ("a_scale_offsets", 0)), 1):
            br = bir.if_(bir.eq(tid, k), [bir.i32()])
            with br.then():
                br.yield_(bir.load(self.kb.arg(name), bir.add(g, off) if off else g))
            with br.else_():
                br.yield_(out)
            out = br.results[0]
        return out

    def publish(self, word: Value, tid: Value, smem: Value) -> None:
        """Threads 0..4 store their :meth:`prefetch` word to ``smem`` (read after a CTA
        barrier with :meth:`shared_info`)."""
        with bir.when(bir.ult(tid, WORDS)):
            bir.store(word, smem, tid)

    def shared_info(self, u: Value, smem: Value) -> Unit:
        """Unit u's geometry from the words :meth:`publish` stored (no global loads)."""
        return self.decode(u, [bir.load(smem, k) for k in range(WORDS)])

    def decode(self, u: Value, raw: list[Value]) -> Unit:
        """Unit u's geometry from its raw info words."""
        x = bir.urem(u, self.tiles)
        blk = bir.as_index(raw[0])
        g, p = bir.urem(blk, self.groups), bir.udiv(blk, self.groups)
        start, end = bir.as_index(raw[1]), bir.as_index(raw[2])
        r0 = bir.add(start, bir.mul(p, ROWS))
        rows = bir.select(bir.ult(r0, end), bir.umin(bir.sub(end, r0), ROWS), bir.const(0))
        expert = raw[3]
        active = arith.cmpi(arith.CmpIPredicate.sge, expert, bir.const(0, bir.i32()))
        some = bir.ult(bir.const(0), rows)
        e = bir.as_index(bir.select(active, expert, bir.const(0, bir.i32())))
        tile0 = bir.add(bir.udiv(start, SF_ATOM_ROWS), bir.as_index(raw[4]))
        srow0 = bir.sub(bir.mul(tile0, SF_ATOM_ROWS), start)
        not_active = arith.cmpi(arith.CmpIPredicate.slt, expert, bir.const(0, bir.i32()))
        return Unit(g, e, bir.mul(x, COLS), r0, rows, bir.logical_and(some, active),
                    bir.logical_and(some, not_active), lambda m: bir.add(srow0, m))

    def store(self, un: Unit) -> Callable[[Value, Value, Value], None]:
        """The unit's output store ``(fp32 sum, row m, column n)``: times the expert scale
        (then the row scale, D10), cast to bf16 (the grouped kernels' epilogue)."""
        kb, f32 = self.kb, bir.f32()
        scale = bir.load(kb.arg("expert_scales"), un.e)

        def store(v: Value, m: Value, n: Value) -> None:
            v = arith.mulf(v, scale)
            if self.row_scales:
                v = arith.mulf(v, arith.extf(f32, bir.load(kb.arg("a_row_scales"), m)))
            mir.store_output(v, kb.arg("c"), bir.add(bir.mul(m, self.n_count), n), "bfloat16")
        return store

    def idle(self, un: Unit) -> None:
        """A unit that is not live: zeros for its rows when its expert id is -1 (D8)."""
        with bir.when(un.zero):
            tid = bir.thread_idx("x")
            threads = bir.block_dim("x")
            with bir.for_range(tid, bir.mul(un.rows, COLS), threads) as zl:
                m = bir.add(un.r0, bir.udiv(zl.iv, COLS))
                n = bir.add(un.n0, bir.urem(zl.iv, COLS))
                with bir.when(bir.ult(n, self.n_count)):
                    mir.store_output(bir.const(0.0, bir.f32()), self.kb.arg("c"),
                                     bir.add(bir.mul(m, self.n_count), n), "bfloat16")

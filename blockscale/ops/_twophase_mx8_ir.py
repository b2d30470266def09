"""IR of the two-phase sm_90a MXFP8 matmul (:mod:`blockscale.ops.matmul_twophase_mx8`).

Imports MLIR: only :func:`blockscale.ops.matmul_twophase_mx8.build` imports it.

Three kernels of their own, around phase 2 of :mod:`blockscale.ops.matmul_twophase` (the bf16
wgmma GEMM, run as its "nvfp4" spec, whose epilogue adds no scale fix):

* :func:`emit_fold` (:data:`FOLD_LANES` lanes per row of A, then of B): the row's fold exponent
  ``F = bmax - 127 - HEADROOM`` from its largest finite scale byte ``bmax`` (0xFF, NaN, and the
  zero padding bytes of the 5-D layout do not raise it), written as an f32 integer (plus
  ``shift`` for B: alpha's exponent), and the row's flag: 1 when a K-block with a nonzero
  element (any code with a nonzero magnitude, NaN codes included) lies more than
  :data:`WINDOW` binades below ``bmax``. The flag pass loads the data of such blocks only.
* :func:`emit_dequant` (phase 1, the FP4 phase 1's thread layout and workspace layout,
  :func:`blockscale.ops._twophase_ir.ws_offset`): ``w = bf16(f32(e4m3(x)) * 2^(b - 127 - F))``
  (``cvt.rn.f16x2.e4m3x2`` decodes, exact) with
  the block's scale byte ``b`` (NaN for 0xFF; the power of two clamped to
  ``2^FACTOR_FLOOR`` below the window, where an unflagged row's elements are zeros).
* :func:`emit_fixup`: recomputes the outputs of flagged rows of A (whole rows of C) and of B
  (whole columns) with the portable kernel's K loop, alpha, epilogue and cast
  (:func:`blockscale.ops._matmul_ir.emit_block_scaled_dot`): bit-identical to
  :func:`blockscale.ops.matmul.naive_block_scaled_matmul` there. CTAs ``(b, 0..7)`` own
  flags ``256 b .. 256 b + 255`` (rows of A, then of B) and exit after one load, a warp OR
  and one barrier when none is set.

:func:`fold_undo` is the epilogue that multiplies phase 2's ``RN(acc * m_alpha)`` by
``2^(Fa[m] + Fb[n] + e_alpha)``: one multiply, or three exact steps (module docstring of
:mod:`blockscale.ops.matmul_twophase_mx8` for the proof of exactness). Round 1 ran it per
element (two global loads, the range test and the three-step branch, which ptxas predicates
inline: ~25 SASS instructions per element; run U on the H200: phase 2 0.506 ms vs 0.381
without it). Phase 2 now runs its hoisted form (``_staged_store_ir.hoisted``, issue #9):
:func:`fold_row` / :func:`fold_col` once per row / column of a thread's fragment, outside
the store guards; per warp and n-tile :func:`fold_fast_cond` (8 loads, 16 shuffles) picks
the fast loop (:func:`fold_row_fast`, :func:`fold_col_fast`, :func:`fold_undo_fast`: one
IMAD and one FMUL per element, the columns' 64 loads per thread and tile) wherever every
``G`` of the warp's rows and the full tile's columns is in [-126, 127], else the
per-element branch (:func:`fold_undo_hoisted`). Same multiplies, same bytes (tests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import mma, nvvm, tma
from blockscale.formats import MXFP8
from blockscale.ops import _matmul_ir as mir
from blockscale.ops import _mx8_window_ir as MW
from blockscale.ops._twophase_ir import KPAD, ws_offset

Value = ir.Value

#: a row's largest scale lands at 2^HEADROOM (its elements at most 448 * 2^42 < 2^51)
HEADROOM = 42
#: K-blocks more than WINDOW binades below the row's largest scale (with nonzero data) flag it
WINDOW = 80
#: the block factor's exponent floor (below the window: zero blocks of unflagged rows)
FACTOR_FLOOR = -100
#: fold_undo clamps the summed exponent here (below: the output is 0 for any phase-2 value)
UNDO_FLOOR = -378
#: threads per block of every kernel here
THREADS = 256
#: lanes of the fold kernel per row (a power of two <= 32: shuffles inside a warp)
FOLD_LANES = 8
#: CTAs (grid.y) of the fixup kernel sharing each flag chunk's outputs
FIXUP_SPLIT = 8
#: the epilogue inputs fold_undo reads (per row of A, per column = row of B)
FOLD_A, FOLD_B = "mx8_fold_a", "mx8_fold_b"
#: a fold exponent F is stored as the f32 ``F + 1.5 * 2^23``, whose bits are ``F + FOLD_BIAS``
#: (|F| < 2^22): one integer subtraction reads it back
FOLD_BIAS = 0x4B400000


def _sgt(a: Value, b: Value | int) -> Value:
    return arith.cmpi(arith.CmpIPredicate.sgt, a, bir.to_value(b, a.type))


def _i32(v: int) -> Value:
    return bir.const(v, bir.i32())


def pow2(e: Value) -> Value:
    """``2^e`` as f32 for an i32 ``e`` in [-126, 127]: the exponent field ``e + 127``."""
    return arith.bitcast(bir.f32(), arith.shli(arith.addi(e, _i32(127)), _i32(23)))


def _scale_byte(sfx: Value, row0: Value, j: Value) -> Value:
    return mir.load_byte_i32(sfx, bir.add(row0, mir.tcgen_kblock_offset(j)))


def _pick(is_a: Value, is_b: Value, types: list, from_a: Any, from_b: Any, zero: Any
          ) -> tuple[Value, ...]:
    """``from_a()`` where ``is_a``, ``from_b()`` where ``is_b``, else ``zero()`` (loads of the
    operand a lane's row belongs to, under scf.if)."""
    outer = bir.if_(is_a, types)
    with outer.then():
        outer.yield_(*from_a())
    with outer.else_():
        inner = bir.if_(is_b, types)
        with inner.then():
            inner.yield_(*from_b())
        with inner.else_():
            inner.yield_(*zero())
        outer.yield_(*inner.results)
    return outer.results


def emit_fold(kb: Any, m: Value, n: Value, k: Value, shift: Value) -> None:
    """The fold exponents and flags of every row of A (``fold_a``) and B (``fold_b``):
    :data:`FOLD_LANES` lanes per row (rows of A, then of B), lane ``sub`` taking the row's
    scale words ``sub, sub + FOLD_LANES, ...`` (4 K-blocks a word); the row's largest finite
    byte and its flag by shuffles; lane 0 stores ``F + shift`` (B; 0 for A, as the f32 of
    bits ``F + shift + FOLD_BIAS``) and the flag ``flags[row]`` (B: ``flags[m + row]``).
    Every lane reaches the shuffles (loads and stores are guarded). ``k % 32 == 0``."""
    a, b, sfa, sfb = (kb.arg(x) for x in ("a", "b", "sfa", "sfb"))
    g = bir.add(bir.mul(bir.block_idx("x"), THREADS), bir.thread_idx("x"))
    r, sub = bir.udiv(g, FOLD_LANES), bir.urem(g, FOLD_LANES)
    is_a = bir.ult(r, m)
    is_b = bir.logical_and(bir.ule(m, r), bir.ult(r, bir.add(m, n)))
    row = bir.select(is_a, r, bir.sub(r, bir.umin(r, m)))
    kblocks = bir.udiv(k, 32)
    d1 = bir.ceil_div(kblocks, 4)
    row0 = mir.tcgen_row_offset(row, d1)
    v4, i32v4 = bir.vec(4, bir.i8()), bir.vec(4, bir.i32())

    def word(i: Value) -> Value:  # scale bytes of K-blocks 4i .. 4i + 3 (zero padding)
        at = bir.add(row0, bir.mul(i, 512))
        return arith.extui(i32v4, _pick(
            is_a, is_b, [v4], lambda: [bir.vector_load(v4, sfa, at, alignment=4)],
            lambda: [bir.vector_load(v4, sfb, at, alignment=4)],
            lambda: [bir.const(0, v4)])[0])

    with bir.for_range(sub, d1, FOLD_LANES, carry=[_i32(0)]) as scan:
        best, w = scan.carried[0], word(scan.iv)
        for q in range(4):
            byte = vector.extract(w, [], [q])
            best = arith.maxui(best, bir.select(bir.eq(byte, _i32(0xFF)), _i32(0), byte))
        scan.yield_(best)
    bmax = scan.results[0]
    for lanes in (1, 2, 4):  # the row's lanes: FOLD_LANES consecutive lanes of a warp
        bmax = arith.maxui(bmax, nvvm.shfl_xor(bmax, lanes))

    def nonzero(x: Value, base: Value) -> list[Value]:  # any nonzero magnitude in 32 bytes
        data = bir.vector_load(bir.vec(32, bir.i8()), x, base, alignment=16)
        return [arith.extui(bir.i32(), MW.nonzero32(data))]

    with bir.for_range(sub, d1, FOLD_LANES, carry=[_i32(0)]) as blocks:
        flag, w = blocks.carried[0], word(blocks.iv)
        for q in range(4):
            j = bir.add(bir.mul(blocks.iv, 4), q)
            far = bir.logical_and(bir.ult(j, kblocks),  # 0xFF: bmax - b < 0
                                  _sgt(arith.subi(bmax, vector.extract(w, [], [q])), WINDOW))
            base = bir.add(bir.mul(row, k), bir.mul(j, 32))
            flag = arith.ori(flag, _pick(bir.logical_and(far, is_a), bir.logical_and(far, is_b),
                                         [bir.i32()], lambda base=base: nonzero(a, base),
                                         lambda base=base: nonzero(b, base),
                                         lambda: [_i32(0)])[0])
        blocks.yield_(flag)
    flag = blocks.results[0]
    for lanes in (1, 2, 4):
        flag = arith.ori(flag, nvvm.shfl_xor(flag, lanes))
    f = arith.subi(bmax, _i32(127 + HEADROOM))
    lead = bir.eq(sub, 0)
    with bir.when(bir.logical_and(lead, is_a)):
        bir.store(arith.bitcast(bir.f32(), arith.addi(f, _i32(FOLD_BIAS))), kb.arg("fold_a"),
                  row)
        bir.store(flag, kb.arg("flags"), r)
    with bir.when(bir.logical_and(lead, is_b)):
        bir.store(arith.bitcast(bir.f32(), arith.addi(arith.addi(f, shift), _i32(FOLD_BIAS))),
                  kb.arg("fold_b"), row)
        bir.store(flag, kb.arg("flags"), r)


def emit_dequant(x: Value, sfx: Value, fold: Value, ws: Value, rows: Value, rows_pad: Value,
                 k: Value, shift: Value, tile: int) -> None:
    """Phase 1 for one operand: ``x`` ``[rows, k]`` E4M3 (i8 memref), ``sfx`` its 5-D scales,
    ``fold`` its :func:`emit_fold` exponents (``F + shift``), ``ws`` the stage-ordered bf16
    workspace of ``rows_pad`` rows for tile ``tile`` (the FP4 phase 1's layout and thread
    mapping: thread ``t`` converts the 64-element piece ``(t // tile) % pieces`` of row
    ``(t // tile // pieces) * tile + t % tile``); zeros past the operand and past K."""
    kp = bir.mul(bir.ceil_div(k, KPAD), KPAD)
    pieces = bir.udiv(kp, 64)
    t = bir.add(bir.mul(bir.block_idx("x"), THREADS), bir.thread_idx("x"))
    rest = bir.udiv(t, tile)
    piece = bir.urem(rest, pieces)
    row = bir.add(bir.mul(bir.udiv(rest, pieces), tile), bir.urem(t, tile))
    v16 = bir.vec(16, bir.i8())
    d1 = bir.ceil_div(bir.udiv(k, 32), 4)
    with bir.when(bir.ult(row, rows_pad)):
        live = bir.ult(row, rows)
        fb = bir.if_(live, [bir.i32()])
        with fb.then():
            fb.yield_(arith.subi(read_fold(bir.load(fold, row)), shift))
        with fb.else_():
            fb.yield_(_i32(0))
        f = fb.results[0]
        for half in range(2):  # two 32-element K-blocks
            p = bir.add(bir.mul(piece, 2), half)
            ok = bir.logical_and(live, bir.ult(bir.mul(p, 32), k))
            br = bir.if_(ok, [v16, v16, bir.i32()])
            with br.then():
                base = bir.add(bir.mul(row, k), bir.mul(p, 32))
                br.yield_(bir.vector_load(v16, x, base, alignment=16),
                          bir.vector_load(v16, x, bir.add(base, 16), alignment=16),
                          _scale_byte(sfx, mir.tcgen_row_offset(row, d1), p))
            with br.else_():
                br.yield_(bir.const(0, v16), bir.const(0, v16), _i32(0))
            d_lo, d_hi, b = br.results
            e = arith.maxsi(arith.subi(arith.subi(b, _i32(127)), f), _i32(FACTOR_FLOOR))
            e = arith.minsi(e, _i32(127))
            factor = bir.select(bir.eq(b, _i32(0xFF)), float("nan"), pow2(e))
            splat = vector.broadcast(bir.vec(2, bir.f32()), factor)
            kbase = ws_offset(row, bir.mul(p, 4), tile, kp)
            pairs = [vector.bitcast(bir.vec(8, bir.i16()), d) for d in (d_lo, d_hi)]
            for c in range(4):  # 8 elements: 16 bytes of the workspace
                elems = []
                for q in range(4):
                    pr = vector.extract(pairs[c // 2], [], [4 * (c % 2) + q])
                    vals = arith.extf(bir.vec(2, bir.f32()), mma.cvt_e4m3x2_to_f16x2(pr))
                    w = arith.truncf(bir.vec(2, bir.bf16()), arith.mulf(vals, splat))  # exact
                    elems += [vector.extract(w, [], [0]), vector.extract(w, [], [1])]
                w8 = bir.from_elements(bir.vec(8, bir.bf16()), elems)
                bir.vector_store(vector.bitcast(v16, w8), ws,
                                 bir.add(kbase, 16 * tile * c), alignment=16)


def read_fold(v: Value) -> Value:
    """The i32 fold exponent stored as the f32 ``v`` (:data:`FOLD_BIAS`)."""
    return arith.subi(arith.bitcast(bir.i32(), v), _i32(FOLD_BIAS))


def _times_pow2(value: Value, near: Value, scale: Callable[[], Value],
                far: Callable[[], Value]) -> Value:
    """``value * 2^G`` (the shared body of :func:`fold_undo` and :func:`fold_undo_hoisted`):
    where ``near`` (G in [-126, 127]) one multiply by ``scale()`` (``2^G``); else (a branch)
    ``far()`` (G) clamped to >= UNDO_FLOOR in three exact steps ``2^g1 2^g2 2^g3`` (g1 = G
    clamped to [-126, 127], g2 = the rest clamped, g3 = the rest: each of the sign of G, so
    the partial products lie between value and result). ``scale`` and ``far`` emit their ops
    inside their branch (callables, not values: the IR of both callers stays as it was)."""
    br = bir.if_(near, [bir.f32()])
    with br.then():
        br.yield_(arith.mulf(value, scale()))
    with br.else_():
        g = arith.maxsi(far(), _i32(UNDO_FLOOR))
        v = value
        for last in (False, False, True):
            part = g if last else arith.minsi(arith.maxsi(g, _i32(-126)), _i32(127))
            v = arith.mulf(v, pow2(part))
            g = arith.subi(g, part)
        br.yield_(v)
    return br.results[0]


def fold_undo(value: Value, ctx: Any) -> Value:
    """Epilogue: ``value * 2^G``, ``G = fa[m] + fb[n]``: one multiply by ``2^G`` where G is in
    [-126, 127] (a single IEEE multiply: always the correctly rounded product); else the
    three exact steps of :func:`_times_pow2`."""
    g = arith.addi(read_fold(ctx.load(FOLD_A)), read_fold(ctx.load(FOLD_B)))
    near = bir.ult(arith.addi(g, _i32(126)), _i32(254))
    return _times_pow2(value, near, lambda: pow2(g), lambda: g)


def fold_row(buffers: dict, m: Value, m_count: Value) -> Value:
    """The hoisted row state of :func:`fold_undo_hoisted`: ``fa[min(m, M - 1)] + 126`` (i32;
    rows past M load row M - 1, their outputs are never written)."""
    buf = buffers[FOLD_A][1]
    return arith.addi(read_fold(bir.load(buf, bir.umin(m, bir.sub(m_count, 1)))), _i32(126))


def fold_col(buffers: dict, n: Value, n_count: Value) -> Value:
    """The hoisted column state of :func:`fold_undo_hoisted`: ``fb[min(n, N - 1)]`` (i32)."""
    buf = buffers[FOLD_B][1]
    return read_fold(bir.load(buf, bir.umin(n, bir.sub(n_count, 1))))


def fold_undo_hoisted(value: Value, row: Value, col: Value) -> Value:
    """:func:`fold_undo` from the hoisted states (:func:`fold_row`, :func:`fold_col`): ``t =
    G + 126``, so the near test is ``t <u 254`` and ``2^G`` has the exponent field ``t + 1``;
    the same multiplies, so the same bits, with one add per element in place of two loads."""
    t = arith.addi(row, col)
    near = bir.ult(t, _i32(254))
    return _times_pow2(
        value, near,
        lambda: arith.bitcast(bir.f32(), arith.shli(arith.addi(t, _i32(1)), _i32(23))),
        lambda: arith.subi(t, _i32(126)))


def fold_fast_cond(buffers: dict, rows: list[Value], m_count: Value, n0: Value,
                   n_count: Value, bn: int) -> Value:
    """i1, uniform over the warp (all 32 lanes run it: shuffles): whether the n-tile ``n0 ..
    n0 + bn`` lies inside the output (so the fast path loads columns unclamped) and ``G =
    fa[m] + fb[n]`` is in [-126, 127] (the near case of :func:`fold_undo_hoisted`) for every
    row of the warp (``rows``: this lane's) and every column of the tile: the row states'
    min / max over the lanes, the columns' (lane ``l`` loads ``n0 + l + 32 i``) over the
    lanes, then one test of the extremes."""
    ra = [fold_row(buffers, m, m_count) for m in rows]
    r_lo, r_hi = arith.minsi(ra[0], ra[1]), arith.maxsi(ra[0], ra[1])
    lane = bir.urem(bir.thread_idx("x"), 32)
    c_lo = c_hi = None
    for i in range(-(-bn // 32)):
        c = bir.add(lane, 32 * i)
        if 32 * (i + 1) > bn:
            c = bir.umin(c, bn - 1)
        g = fold_col(buffers, bir.add(n0, c), n_count)
        c_lo, c_hi = (g, g) if c_lo is None else (arith.minsi(c_lo, g), arith.maxsi(c_hi, g))
    for lanes in (1, 2, 4, 8, 16):  # rows differ in lane bits 2..4 (g), columns in all
        if lanes >= 4:
            r_lo = arith.minsi(r_lo, nvvm.shfl_xor(r_lo, lanes))
            r_hi = arith.maxsi(r_hi, nvvm.shfl_xor(r_hi, lanes))
        c_lo = arith.minsi(c_lo, nvvm.shfl_xor(c_lo, lanes))
        c_hi = arith.maxsi(c_hi, nvvm.shfl_xor(c_hi, lanes))
    near = bir.logical_and(_sgt(arith.addi(r_lo, c_lo), -1),
                           _sgt(_i32(254), arith.addi(r_hi, c_hi)))
    return bir.logical_and(near, bir.ult(bir.add(n0, bn - 1), n_count))  # a full n-tile


def fold_row_fast(buffers: dict, m: Value, m_count: Value) -> Value:
    """The fast path's row state: ``(fa + 127) << 23`` (wrapping i32)."""
    return arith.shli(arith.addi(fold_row(buffers, m, m_count), _i32(1)), _i32(23))


def fold_col_fast(buffers: dict, n: Value, n_count: Value) -> Value:
    """The fast path's column state: ``fb[n] << 23`` (wrapping i32; ``n < N``: a full tile,
    no clamp)."""
    return arith.shli(read_fold(bir.load(buffers[FOLD_B][1], n)), _i32(23))


def fold_undo_fast(value: Value, row: Value, col: Value) -> Value:
    """:func:`fold_undo_hoisted` where the near case holds (:func:`fold_fast_cond`): ``2^G``'s
    bits are ``(G + 127) << 23 = row + col`` (mod 2^32): one add and the multiply per
    element."""
    return arith.mulf(value, arith.bitcast(bir.f32(), arith.addi(row, col)))


def for_flagged_rows(kb: Any, flags: Value, total: Value,
                     on_row: Callable[[Value, Value, int], None]) -> None:
    """The fixups' walk: CTA ``b`` reads flags ``256 b + tid`` (of ``total``), keeps them in
    shared memory and only if one is set calls ``on_row(row, lane0, stride)`` for each set
    one: the FIXUP_SPLIT CTAs of grid.y share a flagged row's outputs, thread tid of CTA y
    taking outputs ``lane0 = tid + THREADS y``, then every ``stride = THREADS FIXUP_SPLIT``."""
    s_flags = tma.shared_buffer(kb, f"{THREADS}xi32", align=16)
    s_warps = tma.shared_buffer(kb, f"{THREADS // 32}xi32", align=16)
    tid = bir.thread_idx("x")
    first = bir.mul(bir.block_idx("x"), THREADS)
    r = bir.add(first, tid)
    fl = bir.if_(bir.ult(r, total), [bir.i32()])
    with fl.then():
        fl.yield_(bir.load(flags, r))
    with fl.else_():
        fl.yield_(_i32(0))
    mine = fl.results[0]
    bir.store(mine, s_flags, tid)
    any_warp = mine
    for lanes in (16, 8, 4, 2, 1):  # the warp's OR
        any_warp = arith.ori(any_warp, nvvm.shfl_xor(any_warp, lanes))
    with bir.when(bir.eq(bir.urem(tid, 32), 0)):
        bir.store(any_warp, s_warps, bir.udiv(tid, 32))
    bir.barrier()
    any_set = _i32(0)
    for w in range(THREADS // 32):
        any_set = arith.ori(any_set, bir.load(s_warps, w))
    lane0 = bir.add(tid, bir.mul(bir.block_idx("y"), THREADS))
    with (bir.when(bir.ne(any_set, _i32(0))), bir.for_range(0, THREADS) as rows,
          bir.when(bir.ne(bir.load(s_flags, rows.iv), _i32(0)))):
        on_row(bir.add(first, rows.iv), lane0, THREADS * FIXUP_SPLIT)


def emit_fixup(kb: Any, flags: Value, m_count: Value, n_count: Value, k: Value,
               finish: Callable[[Value, Value, Value], None]) -> None:
    """Recompute the outputs of flagged rows (:func:`for_flagged_rows`; flags of the rows of A
    below ``m_count``, then of the rows of B): a flagged A row ``m`` -> ``finish(acc, m, n)``
    for CTA ``y``'s share of the ``n``, a flagged B row ``n`` -> its share of the ``m``;
    ``acc`` is the portable kernel's fp32 dot product."""
    a, b, sfa, sfb = (kb.arg(x) for x in ("a", "b", "sfa", "sfb"))
    kblocks = bir.udiv(k, 32)

    def dot(m: Value, n: Value) -> Value:
        sfa_off, sfb_off = mir.scale_offsets("tcgen5d", m, n, kblocks)
        return mir.emit_block_scaled_dot(MXFP8, a=a, a_row=bir.mul(m, k), b=b,
                                         b_row=bir.mul(n, k), sfa=sfa, sfa_offset=sfa_off,
                                         sfb=sfb, sfb_offset=sfb_off, k=k)

    def on_row(rr: Value, lane0: Value, stride: int) -> None:
        with (bir.when(bir.ult(rr, m_count)),  # a row of A: a row of C
              bir.for_range(lane0, n_count, stride) as cols):
            finish(dot(rr, cols.iv), rr, cols.iv)
        with bir.when(bir.ule(m_count, rr)):  # a row of B: a column of C
            n = bir.sub(rr, m_count)
            with bir.for_range(lane0, m_count, stride) as ms:
                finish(dot(ms.iv, n), ms.iv, n)

    for_flagged_rows(kb, flags, bir.add(m_count, n_count), on_row)

"""IR of the grouped MXFP8 prefill's flag and fixup kernels
(:mod:`blockscale.ops.matmul_grouped_pdq_mx8`, issue #10).

Imports MLIR: only that module's ``build`` imports it.

* :func:`emit_flags`: :data:`FLAG_LANES` threads per row of A (the routed tokens ``m < T``,
  :func:`_a_lane_flags`), then one per four rows of B (the weight rows ``e N + n`` sharing
  the 16-byte words of the 6-D scales, :func:`_b_quad_flags`; H200 runs DW-DY, gpt-oss
  gate_up: 58 us with a thread a row of A and of B, 57 us with the B quads, 60 us with the A
  lanes too: neither the scale reads nor the rows of A bound it; not profiled yet); it walks
  the rows' K-blocks (5-D A scales in the group's padded tiles, 6-D B scales) and sets
  ``flags[row]`` to 1 when a block whose scale lies outside the exact window
  (:func:`blockscale.ops._mx8_window_ir.out_of_window`) holds a nonzero element (its 32 data
  bytes are loaded only then), else 0: every flag written by one thread, no zeroing pass.
  Rows of A outside every group or in a group of expert id -1 get 0.
* :func:`emit_fixup`: the two-phase MXFP8 fixup's walk
  (:func:`blockscale.ops._twophase_mx8_ir.for_flagged_rows`: CTAs of 256 flags exit after one
  load, a warp OR and a barrier when none is set); a flagged A row ``m`` (group g, expert e)
  recomputes ``C[m, n]`` for CTA ``y``'s share of the ``n``, a flagged B row ``(e, n)`` the
  rows of every group of expert e in column n, each with the portable grouped kernel's K loop
  and epilogue (:func:`blockscale.ops._matmul_ir.emit_block_scaled_dot`, times
  ``expert_scales[e]``, bf16): bit-identical to
  :func:`blockscale.ops.matmul_grouped.grouped_matmul_block_scaled` there. ``sigma_out``: the
  column is stored at ``(n % 2) N/2 + n // 2`` as the σ store of the main kernel.
"""

from __future__ import annotations

from typing import Any

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.formats import MXFP8
from blockscale.layouts import SF_ATOM_BYTES, SF_ATOM_ROWS
from blockscale.ops import _matmul_ir as mir
from blockscale.ops import _mx8_window_ir as MW
from blockscale.ops._twophase_mx8_ir import THREADS, for_flagged_rows

Value = ir.Value


#: lanes that scan one row of A (its 4-byte scale words ``sub, sub + FLAG_LANES, ...``)
FLAG_LANES = 8


def _far_block(x: Value, row_byte0: Value, j: Value, b: Value, ok: Value) -> Value:
    """i32 1 where ``ok`` and K-block ``j`` (scale byte ``b``, i32) of the data row at byte
    ``row_byte0`` of ``x`` lies outside the window with a nonzero element (its 32 bytes
    loaded only then), else 0."""
    br = bir.if_(bir.logical_and(ok, MW.out_of_window(b)), [bir.i32()])
    with br.then():
        data = bir.vector_load(bir.vec(32, bir.i8()), x, bir.add(row_byte0, bir.mul(j, 32)),
                               alignment=16)
        br.yield_(arith.extui(bir.i32(), MW.nonzero32(data)))
    with br.else_():
        br.yield_(bir.const(0, bir.i32()))
    return br.results[0]


def a_threads(t: Value) -> Value:
    """Threads of the A scan: :data:`FLAG_LANES` a row, padded to whole warps (the lanes of a
    warp all reach its shuffles)."""
    return bir.mul(bir.ceil_div(bir.mul(t, FLAG_LANES), 32), 32)


def emit_flags(kb: Any) -> None:
    """The flag kernel body (module docstring); args a, w, sfa, sfb, expert_start,
    a_scale_offsets, expert_ids, flags (out), t, n, k, num_groups, num_experts."""
    t, n_count, k, groups, experts = (bir.as_index(kb.arg(x)) for x in (
        "t", "n", "k", "num_groups", "num_experts"))
    r = bir.add(bir.mul(bir.block_idx("x"), THREADS), bir.thread_idx("x"))
    first_b = a_threads(t)
    with bir.when(bir.ult(r, first_b)):  # rows of A (warp-uniform)
        _a_lane_flags(kb, r, t, k, groups)
    tiles = bir.ceil_div(n_count, SF_ATOM_ROWS)
    rb = bir.sub(r, bir.umin(r, first_b))
    with bir.when(bir.logical_and(bir.ule(first_b, r), bir.ult(rb, bir.mul(experts, bir.mul(
            tiles, 32))))):
        _b_quad_flags(kb, rb, tiles, n_count, k, t)


def _a_lane_flags(kb: Any, r: Value, t: Value, k: Value, groups: Value) -> None:
    """Lane ``sub = r % FLAG_LANES`` of routed row ``m = r // FLAG_LANES``: its scale words
    ``sub, sub + FLAG_LANES, ...`` (4 K-blocks each) in the group's padded tiles; the row's
    flag by shuffles, stored by lane 0 (rows past T: none)."""
    from blockscale.compiler.arch import nvvm

    m, sub = bir.udiv(r, FLAG_LANES), bir.urem(r, FLAG_LANES)
    valid = bir.ult(m, t)
    m_safe = bir.umin(m, bir.sub(t, 1))
    g, active, _ = mir.grouped_row_group(kb, m_safe, groups)
    kblocks = bir.udiv(k, 32)
    d1 = bir.ceil_div(kblocks, 4)
    live = bir.logical_and(valid, active)
    i32 = bir.i32()
    scan = bir.if_(live, [i32])
    with scan.then():
        row0 = mir.tcgen_row_offset(mir.grouped_a_scale_row(kb, m_safe, g), d1)
        with bir.for_range(sub, d1, FLAG_LANES, carry=[bir.const(0, i32)]) as wl:
            word = bir.vector_load(bir.vec(4, bir.i8()), kb.arg("sfa"),
                                   bir.add(row0, bir.mul(wl.iv, SF_ATOM_BYTES)), alignment=4)
            flag = wl.carried[0]
            for c in range(4):
                j = bir.add(bir.mul(wl.iv, 4), c)
                b = arith.extui(i32, vector.extract(word, [], [c]))
                flag = arith.ori(flag, _far_block(kb.arg("a"), bir.mul(m_safe, k), j, b,
                                                  bir.ult(j, kblocks)))
            wl.yield_(flag)
        scan.yield_(wl.results[0])
    with scan.else_():
        scan.yield_(bir.const(0, i32))
    flag = scan.results[0]
    for lanes in (1, 2, 4):  # the row's FLAG_LANES consecutive lanes
        flag = arith.ori(flag, nvvm.shfl_xor(flag, lanes))
    with bir.when(bir.logical_and(valid, bir.eq(sub, 0))):
        bir.store(flag, kb.arg("flags"), m)


def _b_quad_flags(kb: Any, q: Value, tiles: Value, n_count: Value, k: Value, t: Value) -> None:
    """Thread ``q`` of the B scan: expert ``e = q // (32 tiles)``, its scale tile ``a`` and
    lane ``l = q % 32``: the four weight rows ``n = 128 a + l + 32 i`` whose scale bytes share
    each 16-byte word of the 6-D layout (K-blocks ``4 w ..``: one ``ld.global.v4`` a word, a
    warp reading 512 contiguous bytes); flags ``t + e N + n`` of the rows below N."""
    e, rest = bir.udiv(q, bir.mul(tiles, 32)), bir.urem(q, bir.mul(tiles, 32))
    a, lane = bir.udiv(rest, 32), bir.urem(rest, 32)
    kblocks = bir.udiv(k, 32)
    d1 = bir.ceil_div(kblocks, 4)
    n0 = bir.add(bir.mul(a, SF_ATOM_ROWS), lane)
    base = mir.tcgen_row_offset(mir.grouped_b_scale_row(e, n0, n_count), d1)  # lane's 16 B
    rows = [bir.add(n0, 32 * i) for i in range(4)]
    w = kb.arg("w")
    i32, zero = bir.i32(), bir.const(0, bir.i32())
    with bir.for_range(0, d1, carry=[zero] * 4) as wl:
        word = bir.vector_load(bir.vec(16, bir.i8()), kb.arg("sfb"),
                               bir.add(base, bir.mul(wl.iv, SF_ATOM_BYTES)), alignment=16)
        out = []
        for i, n in enumerate(rows):
            flag = wl.carried[i]
            for c in range(4):  # byte 4 i + c: row n, K-block 4 w + c
                j = bir.add(bir.mul(wl.iv, 4), c)
                b = arith.extui(i32, vector.extract(word, [], [4 * i + c]))
                row = bir.add(bir.mul(e, n_count), n)
                flag = arith.ori(flag, _far_block(w, bir.mul(row, k), j, b, bir.logical_and(
                    bir.ult(j, kblocks), bir.ult(n, n_count))))
            out.append(flag)
        wl.yield_(*out)
    for i, n in enumerate(rows):
        with bir.when(bir.ult(n, n_count)):
            bir.store(wl.results[i], kb.arg("flags"),
                      bir.add(t, bir.add(bir.mul(e, n_count), n)))


def emit_fixup(kb: Any, sigma_out: bool) -> None:
    """The fixup kernel body (module docstring); args a, w, sfa, sfb, expert_start,
    a_scale_offsets, expert_ids, expert_scales, flags, c (in/out), t, n, k, num_groups,
    num_experts."""
    t, n_count, k, groups, experts = (bir.as_index(kb.arg(x)) for x in (
        "t", "n", "k", "num_groups", "num_experts"))
    kblocks = bir.udiv(k, 32)
    d1 = bir.ceil_div(kblocks, 4)
    es = kb.arg("expert_start")

    def finish(m: Value, g: Value, e: Value, n: Value) -> None:
        a_off, b_off = mir.scale_offsets("tcgen5d", mir.grouped_a_scale_row(kb, m, g),
                                         mir.grouped_b_scale_row(e, n, n_count), kblocks, d1)
        acc = mir.emit_block_scaled_dot(
            MXFP8, a=kb.arg("a"), a_row=bir.mul(m, k), b=kb.arg("w"),
            b_row=bir.mul(bir.add(bir.mul(e, n_count), n), k), sfa=kb.arg("sfa"),
            sfa_offset=a_off, sfb=kb.arg("sfb"), sfb_offset=b_off, k=k)
        value = arith.mulf(acc, bir.load(kb.arg("expert_scales"), e))
        col = n
        if sigma_out:  # the σ store: gate | up halves
            col = bir.add(bir.mul(bir.urem(n, 2), bir.udiv(n_count, 2)), bir.udiv(n, 2))
        mir.store_output(value, kb.arg("c"), bir.add(bir.mul(m, n_count), col), "bfloat16")

    def on_row(rr: Value, lane0: Value, stride: int) -> None:
        with bir.when(bir.ult(rr, t)):  # a row of A: a row of C
            g, active, expert = mir.grouped_row_group(kb, rr, groups)
            with bir.when(active), bir.for_range(lane0, n_count, stride) as cols:
                finish(rr, g, bir.as_index(expert), cols.iv)
        rb = bir.sub(rr, bir.umin(rr, t))
        with bir.when(bir.logical_and(bir.ule(t, rr), bir.ult(rb, bir.mul(experts, n_count)))):
            e, n = bir.udiv(rb, n_count), bir.urem(rb, n_count)  # a row of B: column n
            with bir.for_range(0, groups) as gl:
                ids = bir.as_index(bir.load(kb.arg("expert_ids"), gl.iv))
                with bir.when(bir.eq(ids, e)):
                    start = bir.as_index(bir.load(es, gl.iv))
                    end = bir.as_index(bir.load(es, bir.add(gl.iv, 1)))
                    with bir.for_range(bir.add(start, lane0), end, stride) as ms:
                        finish(ms.iv, gl.iv, e, n)

    for_flagged_rows(kb, kb.arg("flags"), bir.add(t, bir.mul(experts, n_count)), on_row)

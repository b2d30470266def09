"""IR of the grouped MXFP8 prefill's flag and fixup kernels
(:mod:`blockscale.ops.matmul_grouped_pdq_mx8`, issue #10).

Imports MLIR: only that module's ``build`` imports it.

* :func:`emit_flags`: one thread per row, rows of A (the routed tokens ``m < T``) then rows of
  B (the weight rows ``e N + n``); it walks the row's K-blocks (5-D A scales in the group's
  padded tiles, 6-D B scales) and sets ``flags[row]`` to 1 when a block whose scale lies
  outside the exact window (:func:`blockscale.ops._mx8_window_ir.out_of_window`) holds a
  nonzero element (its 32 data bytes are loaded only then), else 0: every flag written by one
  thread, no zeroing pass. Rows of A outside every group or in a group of expert id -1 get 0.
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
from mlir.dialects import arith

from blockscale.compiler import ir as bir
from blockscale.formats import MXFP8
from blockscale.ops import _matmul_ir as mir
from blockscale.ops import _mx8_window_ir as MW
from blockscale.ops._twophase_mx8_ir import THREADS, for_flagged_rows

Value = ir.Value


def _row_flag(x: Value, sfx: Value, row_base: Value, srow: Value, k: Value) -> Value:
    """i32 1 when a K-block of the row (data from ``row_base``, scales of 5-D row ``srow``)
    lies outside the window with a nonzero element, else 0."""
    kblocks = bir.udiv(k, 32)
    row0 = mir.tcgen_row_offset(srow, bir.ceil_div(kblocks, 4))
    with bir.for_range(0, kblocks, carry=[bir.const(0, bir.i32())]) as jl:
        b = mir.load_byte_i32(sfx, bir.add(row0, mir.tcgen_kblock_offset(jl.iv)))
        br = bir.if_(MW.out_of_window(b), [bir.i32()])
        with br.then():
            data = bir.vector_load(bir.vec(32, bir.i8()), x,
                                   bir.add(row_base, bir.mul(jl.iv, 32)), alignment=16)
            br.yield_(arith.extui(bir.i32(), MW.nonzero32(data)))
        with br.else_():
            br.yield_(bir.const(0, bir.i32()))
        jl.yield_(arith.ori(jl.carried[0], br.results[0]))
    return jl.results[0]


def emit_flags(kb: Any) -> None:
    """The flag kernel body (module docstring); args a, w, sfa, sfb, expert_start,
    a_scale_offsets, expert_ids, flags (out), t, n, k, num_groups, num_experts."""
    t, n_count, k, groups, experts = (bir.as_index(kb.arg(x)) for x in (
        "t", "n", "k", "num_groups", "num_experts"))
    r = bir.add(bir.mul(bir.block_idx("x"), THREADS), bir.thread_idx("x"))
    flags = kb.arg("flags")
    with bir.when(bir.ult(r, t)):  # a routed row of A
        g, active, _ = mir.grouped_row_group(kb, r, groups)
        br = bir.if_(active, [bir.i32()])
        with br.then():
            br.yield_(_row_flag(kb.arg("a"), kb.arg("sfa"), bir.mul(r, k),
                                mir.grouped_a_scale_row(kb, r, g), k))
        with br.else_():
            br.yield_(bir.const(0, bir.i32()))
        bir.store(br.results[0], flags, r)
    rb = bir.sub(r, bir.umin(r, t))
    with bir.when(bir.logical_and(bir.ule(t, r), bir.ult(rb, bir.mul(experts, n_count)))):
        e, n = bir.udiv(rb, n_count), bir.urem(rb, n_count)
        bir.store(_row_flag(kb.arg("w"), kb.arg("sfb"), bir.mul(rb, k),
                            mir.grouped_b_scale_row(e, n, n_count), k), flags, r)


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

"""IR of the sm_90a grouped wgmma matmul (:mod:`blockscale.ops.matmul_grouped_wgmma`).

Imports MLIR. The work item of CTA ``(x, y)`` is found by a warp-parallel scan of ``expert_start``
(:func:`find_tile`; the same in every warp, so CTA-uniform); the K loop is
:func:`blockscale.ops._wgmma_ir.emit_mainloop` on the group's A rows (masked at the group
end, scales in the group's padded 128-row tiles) and expert ``e``'s weight rows
``e N + n`` (6-D scales ``[e, n // 128, ...]``); the epilogue is the dense kernel's store
with the grouped scaling (power-of-two fix, then ``expert_scales[e]``, then
``a_row_scales[m]``, fp32).
"""

from __future__ import annotations

from typing import Any

from mlir.dialects import arith

import blockscale.ops._wgmma_ir as X
from blockscale.compiler import ir as bir
from blockscale.ops import matmul_grouped_sm90 as _gsm90
from blockscale.ops import matmul_sm90 as _sm90

#: chunks of 32 groups a round of :func:`find_tile`: every load of a round is issued before
#: its scans, so a CTA waits about one load latency a round instead of one a chunk (4: one
#: round for gpt-oss' 128 groups with no dead chunk, two for DeepSeek-V3's 256; at 8 ptxas
#: issued a round's loads in three batches and scanned the dead chunks too)
FIND_CHUNKS = 4


def find_tile(bm: int, kb: Any, groups: Any, keep: Any = None, y: Any = None,
              with_total: bool = False) -> tuple[Any, ...]:
    """(group, row tile within the group, whether CTA y has a work item), as
    :func:`blockscale.ops.matmul_grouped_sm90._find_tile` but warp-parallel: lane l of every
    warp takes group ``32 c + l`` of chunk c (``ceil(n_g / bm)`` row tiles), an inclusive
    prefix sum over the lanes (5 ``shfl.idx``) places its tiles after the chunk's base, the
    lane whose range holds y keeps (g, first tile); after the loop a butterfly sum (only that
    lane is non-zero) gives them to every lane. The chunks run in rounds of
    :data:`FIND_CHUNKS` whose ``expert_start`` loads are all issued first (one round up to
    128 groups).

    ``keep``: a callable of a group's row count (index) giving an i1; groups it rejects get
    no work items (another launch computes them: the grouped pdq kernel's row bands).
    ``y``: the work item's index (CTA-uniform; default ``blockIdx.y``); ``with_total``: the
    work items' count (index) as a fourth result."""
    from blockscale.compiler.arch import nvvm

    y = bir.block_idx("y") if y is None else y
    es = kb.arg("expert_start")
    lane = bir.urem(bir.thread_idx("x"), 32)
    zero = bir.const(0)
    last = bir.sub(groups, 1)  # the loop runs only when groups >= 1
    with bir.for_range(0, bir.ceil_div(groups, 32 * FIND_CHUNKS),
                       carry=[zero, zero, zero]) as loop:
        base, my_g, my_start = loop.carried
        chunks = []
        for c in range(FIND_CHUNKS):  # the round's loads first
            g = bir.add(bir.mul(bir.add(bir.mul(loop.iv, FIND_CHUNKS), c), 32), lane)
            safe = bir.umin(g, last)
            chunks.append((g, bir.load(es, safe), bir.load(es, bir.add(safe, 1))))
        for g, first, end in chunks:
            live = bir.ult(g, groups)
            rows = bir.sub(bir.as_index(end), bir.as_index(first))
            if keep is not None:
                live = bir.logical_and(live, keep(rows))
            tiles = bir.select(live, bir.ceil_div(rows, bm), 0)
            incl = bir.as_i32(tiles)
            for d in (1, 2, 4, 8, 16):
                low = bir.ult(lane, d)
                src = bir.as_i32(bir.select(low, lane, bir.sub(lane, d)))
                incl = bir.add(incl, bir.select(low, 0, nvvm.shfl_idx(incl, src)))
            hi = bir.add(base, bir.as_index(incl))
            lo = bir.sub(hi, tiles)
            mine = bir.logical_and(bir.ule(lo, y), bir.ult(y, hi))
            base = bir.add(base, bir.as_index(nvvm.shfl_idx(incl, 31)))
            my_g, my_start = bir.select(mine, g, my_g), bir.select(mine, lo, my_start)
        loop.yield_(base, my_g, my_start)
    total, my_g, my_start = loop.results
    found = []
    for v in (my_g, my_start):
        v = bir.as_i32(v)
        for d in (1, 2, 4, 8, 16):
            v = bir.add(v, nvvm.shfl_xor(v, d))
        found.append(bir.as_index(v))
    g, start = found
    if with_total:
        return g, bir.sub(y, start), bir.ult(y, total), total
    return g, bir.sub(y, start), bir.ult(y, total)


def _store(spec: Any, kb: Any, tiles: list, wc: Any, m0: Any, n0: Any, end: Any,
           n_count: Any, scale: Any) -> None:
    """:func:`blockscale.ops.matmul_sm90.store_tile`, or with ``spec.sigma_out`` the σ
    store: column n to ``(n % 2) N/2 + n // 2``."""
    if not spec.sigma_out:
        _sm90.store_tile(spec, kb, tiles, wc, m0, n0, end, n_count, scale)
        return
    import blockscale.ops._matmul_ir as mir

    # n = n0 + 2 t + 8 nt + (i & 1) with n0 and the fragment's column base even: the parity
    # of n is i & 1 and n // 2 = (n0 + c_col(0, 0)) / 2 + 4 nt
    half = bir.udiv(n_count, 2)
    base = bir.udiv(bir.add(n0, wc.c_col(0, 0)), 2)
    for row in tiles:
        for nt, vals in enumerate(row):
            for i, v in enumerate(vals):
                m = bir.add(m0, wc.c_row(0, i))
                n = bir.add(n0, wc.c_col(nt, i))
                with bir.when(bir.logical_and(bir.ult(m, end), bir.ult(n, n_count))):
                    col = bir.add(base, 4 * nt)
                    if i & 1:
                        col = bir.add(col, half)
                    mir.store_output(scale(v, m, n), kb.arg("c"),
                                     bir.add(bir.mul(m, n_count), col), "bfloat16")


def build(spec: Any) -> Any:
    """The ``mlir.ir.Module`` of ``spec`` (a
    :class:`~blockscale.ops.matmul_grouped_wgmma.GroupedWgmmaSpec`)."""
    tiles = X.Tiles(spec.bm, spec.bn, spec.kstep, spec.fmt, spec.scaling, False)
    if tiles.shared_bytes != spec.shared_bytes or tiles.threads != spec.block[0]:
        raise AssertionError("GroupedWgmmaSpec.shared_bytes disagrees with _wgmma_ir.Tiles")
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        n_count, k, groups = (bir.as_index(kb.arg(x)) for x in ("n", "k", "num_groups"))
        g, tile, has_work = find_tile(spec.bm, kb, groups)
        with bir.when(has_work):  # CTA-uniform: the barriers below are reached by all
            start, end, expert, m0, n0, active = _gsm90.work_item(kb, g, tile, spec.bm, spec.bn)
            br = bir.if_(active, [])
            with br.then():
                e, a, b = _gsm90.work_operands(kb, g, tile, spec.bm, start, end, expert, m0, n0,
                                               n_count, k, tiles.block)
                acc, wg = X.emit_mainloop(kb, tiles, a, b, k, spec.dequant, spec.pipeline)
                fix = X.accumulator_scale(spec.dequant, spec.fmt, spec.scaling)
                scale_e = bir.load(kb.arg("expert_scales"), e)

                def expert_scaled(v: Any, m: Any, n: Any) -> Any:
                    if fix != 1.0:  # exact power of two first (the variant's operand scaling)
                        v = arith.mulf(v, bir.const(fix, bir.f32()))
                    v = arith.mulf(v, scale_e)
                    if spec.row_scales:  # D10: times the expert scale, then the row scale
                        v = arith.mulf(v, arith.extf(bir.f32(),
                                                     bir.load(kb.arg("a_row_scales"), m)))
                    return v

                _store(spec, kb, X.accumulator_tiles(acc, spec.bn), X.warp_coords(wg), m0, n0,
                       end, n_count, expert_scaled)
                br.yield_()
            with br.else_():  # expert id -1: zeros (D8: every output byte is written)
                wg = bir.udiv(bir.thread_idx("x"), 128)
                zero = bir.const(0.0, bir.f32())
                zeros = [[[zero] * 4 for _ in range(spec.bn // 8)]]
                _store(spec, kb, zeros, X.warp_coords(wg), m0, n0, end, n_count,
                       lambda v, m, n: v)
                br.yield_()
    return kb.module

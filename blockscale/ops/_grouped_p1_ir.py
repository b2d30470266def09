"""IR of the grouped (MoE prefill) phase 1: the routed rows' packed FP4 (or MXFP8) A -> one bf16 workspace
of per-(group, 128-row tile) tiles (:mod:`blockscale.ops.matmul_grouped_p1`, issue #10).

Imports MLIR: only :func:`blockscale.ops.matmul_grouped_p1.build` imports it.

Workspace: tile ``w`` (``ws_tiles`` of them) is the two-phase kernel's stage-ordered span of
128 rows x ``k_pad`` bf16 (:func:`blockscale.ops._twophase_ir.ws_offset` with tile 128: the
16-byte chunk ``c`` of local row ``r`` at ``w * 128 * k_pad * 2 + c * 2048 + r * 16``), so
k-step ``s`` of a tile is the one contiguous 16 KiB span the producer-dequant kernel's
``cp.async.bulk`` copies into a stage (:func:`blockscale.ops._pdq_ir.emit_mainloop` with a
workspace A). Group ``g``'s row tile ``i`` (rows ``start + 128 i ..``) is workspace tile
``w = start // 128 + a_scale_offsets[g] + i``: its 5-D scale tile (SEMANTICS §5), which D8's
placement (``tile0(g)`` = the earlier groups' ``ceil(n_h / 128)`` summed) makes distinct for
distinct (group, tile) pairs; the host checks that where the group vectors are numpy
(:func:`blockscale.ops.matmul_grouped_p1.check_tile_placement`). Rows past the group's end
(to the tile's 128) and elements past K are zeros: the bytes the producer warpgroup of the
grouped pdq kernel stores for them. Tiles of unused groups (expert id -1) are not written
(the matmul does not read them).

Grid: ``(ceil(128 * ceil(pieces / P) / 256), ceil(T / 128) + G)``; block ``y`` finds its
(group, tile) by the grouped wgmma kernel's warp-parallel scan
(:func:`blockscale.ops._grouped_wgmma_ir.find_tile`, as the matmul's CTA ``y`` does); thread
item ``t = 256 x + tid`` is local row ``t % 128`` and ``P`` consecutive 64-element pieces
``P (t // 128) ..`` of it (consecutive threads, consecutive rows: every 16-byte store of a
warp writes 512 contiguous bytes). Per thread first every load (per piece and 32-element half
one 16-byte load of packed FP4, 32 bytes of MXFP8, and its scale bytes), then per half the
conversion (:func:`blockscale.ops._twophase_p1_ir.dequant_chunks`: the bits of
``_wgmma_ir._dequant_row`` "lut" with ``_wgmma_ir._scale_values`` folded in, the same as
phase 1 and the producer; MXFP8: :func:`blockscale.ops._mx8_window_ir.chunks`) and four
16-byte stores.
"""

from __future__ import annotations

from typing import Any

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.layouts import SF_ATOM_BYTES, SF_ATOM_ROWS
from blockscale.ops import _wgmma_ir as X
from blockscale.ops._grouped_wgmma_ir import find_tile
from blockscale.ops._matmul_ir import tcgen_row_offset
from blockscale.ops._twophase_ir import KPAD
from blockscale.ops._twophase_p1_ir import dequant_chunks
from blockscale.ops.matmul_grouped_p1 import kperm_source

Value = ir.Value

#: threads per block; rows per workspace tile
THREADS, TILE = 256, 128
#: 64-element pieces per thread built
PIECES = (1, 2)


def tile_bytes(k: Value | int) -> Value | int:
    """Bytes of one workspace tile: 128 rows x k_pad bf16."""
    if isinstance(k, int):
        return TILE * 2 * (-(-k // KPAD) * KPAD)
    return bir.mul(bir.mul(bir.ceil_div(k, KPAD), KPAD), 2 * TILE)


def _chunks(data: Value, scales: Value, fmt: str, dtype: str) -> list[Value]:
    """A 32-element half's four 16-byte chunks: bf16 (``dequant_chunks`` with the
    ``_scale_values`` splats) or f16 (:mod:`blockscale.ops._f16_dequant_ir`)."""
    nscales = ir.VectorType(scales.type).shape[0]
    if fmt == "mxfp8":  # E4M3 codes times the block's power of two
        from blockscale.ops import _mx8_window_ir as MW

        b = arith.extui(bir.i32(), vector.extract(scales, [], [0]))
        return MW.chunks(data, MW.block_factor(b))
    if dtype == "f16":
        from blockscale.ops import _f16_dequant_ir as F16

        w = arith.extui(bir.i32(), vector.extract(
            vector.bitcast(bir.vec(1, bir.i16()), scales), [], [0]))
        return F16.dequant_chunks(data, F16.splats(w))
    sv = X._scale_values(arith.extui(bir.vec(nscales, bir.i32()), scales), "lut", fmt)
    splats = tuple(vector.broadcast(bir.vec(2, bir.bf16()), vector.extract(sv, [], [s]))
                   for s in range(nscales))
    return dequant_chunks(data, splats, 16 if fmt == "nvfp4" else 32)


def _kperm_chunks(chunks: list[Value]) -> list[Value]:
    """A 64-element piece's eight 16-byte chunks (``vector<4xi32>`` of f16 pairs, K order)
    -> the same pairs in :func:`kperm_source` order."""
    pairs = [vector.extract(c, [], [u]) for c in chunks for u in range(4)]  # pair 4c + u
    out = []
    for c in range(8):
        words = [pairs[kperm_source(8 * c + 2 * u) // 2] for u in range(4)]
        out.append(vector.from_elements(bir.vec(4, bir.i32()), words))
    return out


def emit(kb: Any, fmt: str, p: int, dtype: str = "bf16", kperm: bool = False) -> None:
    """The phase-1 kernel body (module docstring); kernel args a, sfa, expert_start,
    a_scale_offsets, expert_ids, ws, t, k, num_groups, ws_tiles. ``dtype`` "f16" (NVFP4):
    the f16 values of :mod:`blockscale.ops._f16_dequant_ir` (times 2^-7). ``kperm``: each
    64-element step's elements in :func:`kperm_source` order."""
    if p not in PIECES:
        raise ValueError(f"p must be one of {list(PIECES)}, got {p!r}")
    block = 16 if fmt == "nvfp4" else 32
    nscales = 32 // block  # scale bytes of a 32-element half
    k, groups, ws_tiles = (bir.as_index(kb.arg(x)) for x in ("k", "num_groups", "ws_tiles"))
    g, tile, has_work = find_tile(TILE, kb, groups)
    with bir.when(has_work):  # block-uniform
        es = kb.arg("expert_start")
        start = bir.as_index(bir.load(es, g))
        end = bir.as_index(bir.load(es, bir.add(g, 1)))
        active = arith.cmpi(arith.CmpIPredicate.sge, bir.load(kb.arg("expert_ids"), g),
                            bir.const(0, bir.i32()))
        w = bir.add(bir.add(bir.udiv(start, SF_ATOM_ROWS),
                            bir.as_index(bir.load(kb.arg("a_scale_offsets"), g))), tile)
        kp = bir.mul(bir.ceil_div(k, KPAD), KPAD)
        pieces = bir.udiv(kp, 64)
        item = bir.add(bir.mul(bir.block_idx("x"), THREADS), bir.thread_idx("x"))
        r, grp = bir.urem(item, TILE), bir.udiv(item, TILE)
        live = bir.logical_and(bir.logical_and(active, bir.ult(w, ws_tiles)),
                               bir.ult(grp, bir.ceil_div(pieces, p)))
        with bir.when(live):
            m = bir.add(bir.add(start, bir.mul(tile, TILE)), r)
            row_ok = bir.ult(m, end)
            per = 32 if fmt == "mxfp8" else 16  # packed bytes of a 32-element half
            rbase = bir.mul(m, k if fmt == "mxfp8" else bir.udiv(k, 2))
            sbase = tcgen_row_offset(bir.add(bir.mul(w, TILE), r), bir.ceil_div(
                bir.ceil_div(k, block), 4))
            vd, vs = bir.vec(per, bir.i8()), bir.vec(nscales, bir.i8())
            loaded = []
            for i in range(p):  # every load first
                pc = bir.add(bir.mul(grp, p), i)
                for h in range(2):
                    half = bir.add(bir.mul(pc, 2), h)
                    ok = bir.logical_and(row_ok, bir.ult(bir.mul(half, 32), k))
                    br = bir.if_(ok, [vd, vs])
                    with br.then():
                        data = bir.vector_load(vd, kb.arg("a"),
                                               bir.add(rbase, bir.mul(half, per)), alignment=16)
                        j = bir.mul(half, nscales)
                        off = bir.add(sbase, bir.add(bir.mul(bir.udiv(j, 4), SF_ATOM_BYTES),
                                                     bir.urem(j, 4)))
                        br.yield_(data, bir.vector_load(vs, kb.arg("sfa"), off,
                                                        alignment=nscales))
                    with br.else_():
                        br.yield_(bir.const(0, vd), bir.const(0, vs))
                    loaded.append((pc, h, *br.results))
            tbase = bir.mul(w, tile_bytes(k))
            for i in range(p):
                pc = loaded[2 * i][0]
                with bir.when(bir.ult(pc, pieces)):  # (a piece past K converts nothing)
                    chunks = [v for _, _, data, scales in loaded[2 * i:2 * i + 2]
                              for v in _chunks(data, scales, fmt, dtype)]
                    if kperm:
                        chunks = _kperm_chunks(chunks)
                    base = bir.add(tbase, bir.add(bir.mul(bir.mul(pc, 8), 16 * TILE),
                                                  bir.mul(r, 16)))
                    for c, v in enumerate(chunks):
                        bir.vector_store(vector.bitcast(bir.vec(16, bir.i8()), v), kb.arg("ws"),
                                         bir.add(base, 16 * TILE * c), alignment=16)

"""IR of the two-phase matmul's phase 1 for both operands in one launch
(:mod:`blockscale.ops.matmul_twophase_p1`, issue #9).

Imports MLIR: only :func:`blockscale.ops.matmul_twophase_p1.build` imports it.

The workspaces are :mod:`blockscale.ops._twophase_ir`'s ("stage-ordered", no swizzle): the
16-byte chunk ``c`` of row ``r`` of an operand made for tiles of ``tile`` rows is at
``(r // tile) * tile * k_pad * 2 + c * tile * 16 + (r % tile) * 16``; every element is
``_wgmma_ir._dequant_row`` ("lut") of the E2M1 codes with ``_wgmma_ir._scale_values`` of the
block's scale folded in; zeros past the operand's rows and past K. So the bytes equal
``_twophase_ir.emit_dequant``'s.

Grid (:func:`emit_both`): blocks ``[0, nA)`` dequantize A, ``[nA, nA + nB)`` B (a
block-uniform branch: two copies of the code, each with its tile height a constant). Inside
an operand, work item ``t`` (``blockIdx * THREADS + threadIdx``, ``rows_pad * groups``
items) is a row and a group of ``P`` consecutive 64-element pieces of it (``groups =
ceil(pieces / P)``, ``pieces = k_pad / 64``): ``rest = t // tile``, group ``rest % groups``,
tile-row ``rest // groups`` (``order="reversed"``: counted from the last tile-row), row
``tile-row * tile + t % tile``. Consecutive threads take consecutive rows of one tile-row,
so each 16-byte store instruction of a warp writes 512 contiguous bytes (two runs of 256
where a warp straddles a tile-row or group boundary: ``tile`` 240 / 224, full 128-byte
lines either way). Only the last block of each operand has idle threads.

Per thread: first every load (per piece two 16-byte loads of packed FP4, i.e. one 32-byte
sector, and one 4-byte (NVFP4) / 2-byte (MXFP4) load of its scale bytes; ``P`` pieces of a
row are ``32 P`` contiguous bytes), each predicated on the piece lying inside the operand
and K, then per piece the conversion and eight 16-byte stores. A piece past ``k_pad`` (the
last group when ``P`` does not divide ``pieces``) stores nothing.

``order="reversed"`` writes A's and B's last tile-rows first, so the last bytes written
(still in L2 when phase 2 starts: the workspaces, 82 MB at 8192 x 5760 x 2944, exceed the
H200's 50 MB L2) are A's first tile-rows and B's, which phase 2's first wave reads
(rasterized: A's first 8 tile-rows with B's first column tiles). Same bytes either way.

``trigger``: every thread first executes ``griddepcontrol.launch_dependents``, as
``_twophase_ir.emit_dequant``'s, so a phase 2 launched with programmatic stream
serialization (``TwophaseMatmulSpec(pdl=True)``) starts its prologue during this grid's
tail (it waits for this grid's writes before reading the workspaces).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import nvvm as N
from blockscale.compiler.arch.nvvm import byte_perm
from blockscale.layouts import SF_ATOM_BYTES
from blockscale.ops import _wgmma_ir as X
from blockscale.ops._matmul_ir import tcgen_row_offset
from blockscale.ops._mma_ir import _LUT_HI, _LUT_LO, _i32c, _scale_bf16x2
from blockscale.ops._twophase_ir import KPAD

Value = ir.Value

#: threads per block
THREADS = 256
#: pieces (64 K-elements, 32 packed bytes) per thread built
PIECES = (1, 2, 4)
#: the order operands' tile-rows are written in
ORDERS = ("rows", "reversed")


def fp4x8_bf16x2(w: Value) -> list[Value]:
    """Eight E2M1 codes (an i32, code j in nibble j) -> 4 bf16 pairs (i32), codes (0, 1),
    (2, 3), (4, 5), (6, 7): the bits of ``_wgmma_ir._fp4x8_lut`` with fewer instructions.
    Magnitudes by the same ``prmt`` byte tables (one mask of all eight codes, 2 lookups + 2
    interleaves per 4 codes); signs by one ``prmt`` per pair, byte i of ``w << 4`` (code
    2i's sign in its bit 7) to byte 1 and byte i of ``w`` (code 2i + 1's) to byte 3, merged
    by one ``lop3`` (``r | s & 0x80008000``). Per 8 codes: 12 PRMT, 1 SHL, 1 SHR, 5 LOP3
    (the lut path: 8 PRMT and ~20 shifts / LOP3)."""
    mag = bir.bit_and(w, _i32c(0x77777777))
    xs = bir.shl(w, 4)
    out = []
    for sel in (mag, bir.shru(mag, 16)):
        lo8 = byte_perm(_i32c(_LUT_LO[0]), _i32c(_LUT_LO[1]), sel)
        hi8 = byte_perm(_i32c(_LUT_HI[0]), _i32c(_LUT_HI[1]), sel)
        out += [byte_perm(lo8, hi8, 0x5140), byte_perm(lo8, hi8, 0x7362)]
    for i in range(4):  # byte 1 <- byte i of xs, byte 3 <- byte i of w (pool: xs, then w)
        sign = byte_perm(xs, w, ((4 + i) << 12) | (i << 4))
        out[i] = bir.bit_or(out[i], bir.bit_and(sign, _i32c(0x80008000)))
    return out


def dequant_chunks(codes: Value, splats: tuple[Value, ...], block: int) -> list[Value]:
    """32 E2M1 codes (vector<16xi8>) -> the 4 chunks (vector<4xi32>, 8 bf16 each) of
    ``_wgmma_ir._dequant_row(codes, splats, "lut", block)``, bit for bit (the same
    magnitudes, signs and ``mul.rn.bf16x2`` by the block's splat)."""
    words = vector.bitcast(bir.vec(4, bir.i32()), codes)
    rows = []
    for c in range(4):
        regs = fp4x8_bf16x2(vector.extract(words, [], [c]))
        regs = [_scale_bf16x2(x, splats[c * 8 // block]) for x in regs]
        rows.append(vector.from_elements(bir.vec(4, bir.i32()), regs))
    return rows


def blocks(rows_pad: Value | int, k: Value | int, p: int) -> Value:
    """Blocks of one operand (index value): ``ceil(rows_pad * groups / THREADS)``."""
    groups = bir.ceil_div(bir.udiv(bir.mul(bir.ceil_div(k, KPAD), KPAD), 64), p)
    return bir.ceil_div(bir.mul(rows_pad, groups), THREADS)


def _operand(x: Value, sfx: Value, ws: Value, rows: Value, rows_pad: Value, k: Value,
             block: Value, fmt: str, tile: int, p: int, order: str) -> None:
    """One operand's share of the grid: local block ``block`` (index), ``p`` pieces a thread."""
    sblock = 16 if fmt == "nvfp4" else 32
    per_piece = 64 // sblock  # scale bytes of a piece: 4 (NVFP4) or 2 (MXFP4)
    kp = bir.mul(bir.ceil_div(k, KPAD), KPAD)
    pieces = bir.udiv(kp, 64)
    groups = bir.ceil_div(pieces, p)
    t = bir.add(bir.mul(block, THREADS), bir.thread_idx("x"))
    rest = bir.udiv(t, tile)
    group = bir.urem(rest, groups)
    trow = bir.udiv(rest, groups)
    trows = bir.udiv(rows_pad, tile)
    if order == "reversed":
        trow = bir.sub(bir.sub(trows, 1), trow)
    r = bir.urem(t, tile)
    row = bir.add(bir.mul(trow, tile), r)
    vd, vs = bir.vec(16, bir.i8()), bir.vec(per_piece, bir.i8())
    d1 = bir.ceil_div(bir.ceil_div(k, sblock), 4)
    with bir.when(bir.ult(trow, trows)):  # the item exists (t < rows_pad * groups)
        in_rows = bir.ult(row, rows)
        rbase = bir.mul(row, bir.udiv(k, 2))
        sbase = tcgen_row_offset(row, d1)
        loaded = []
        for i in range(p):  # every load first: 2 x 16 bytes + the scale bytes per piece
            pc = bir.add(bir.mul(group, p), i)
            halves = []
            for h in range(2):
                ok = bir.logical_and(in_rows, bir.ult(bir.add(bir.mul(pc, 64), 32 * h), k))
                br = bir.if_(ok, [vd])
                with br.then():
                    br.yield_(bir.vector_load(vd, x, bir.add(rbase, bir.add(
                        bir.mul(pc, 32), 16 * h)), alignment=16))
                with br.else_():
                    br.yield_(bir.const(0, vd))
                halves.append((ok, br.results[0]))
            j = bir.mul(pc, per_piece)  # the piece's first K-block: j % 4 + per_piece <= 4
            off = bir.add(sbase, bir.add(bir.mul(bir.udiv(j, 4), SF_ATOM_BYTES),
                                         bir.urem(j, 4)))
            br = bir.if_(halves[0][0], [vs])
            with br.then():
                br.yield_(bir.vector_load(vs, sfx, off, alignment=per_piece))
            with br.else_():
                br.yield_(bir.const(0, vs))
            loaded.append((pc, halves, br.results[0]))
        for pc, halves, scales in loaded:
            # a half past K takes scale bytes 0 (as emit_dequant's): mask the upper half
            wide = bir.i32() if per_piece == 4 else bir.i16()
            keep = bir.select(halves[1][0], bir.const(-1, wide),
                              bir.const((1 << (4 * per_piece)) - 1, wide))
            word = arith.andi(vector.extract(vector.bitcast(bir.vec(1, wide), scales), [], [0]),
                              keep)
            scales = vector.bitcast(vs, vector.broadcast(bir.vec(1, wide), word))
            sv = X._scale_values(arith.extui(bir.vec(per_piece, bir.i32()), scales), "lut",
                                 fmt)
            with bir.when(bir.ult(pc, pieces)):
                for h, (_, data) in enumerate(halves):
                    splats = tuple(vector.broadcast(bir.vec(2, bir.bf16()), vector.extract(
                        sv, [], [h * per_piece // 2 + s])) for s in range(per_piece // 2))
                    base = bir.add(bir.add(bir.mul(trow, bir.mul(kp, 2 * tile)),
                                           bir.mul(bir.add(bir.mul(pc, 8), 4 * h), 16 * tile)),
                                   bir.mul(r, 16))
                    rows_out = dequant_chunks(data, splats, sblock)
                    for c, v in enumerate(rows_out):
                        bir.vector_store(vector.bitcast(vd, v), ws,
                                         bir.add(base, 16 * tile * c), alignment=16)


def emit_both(a: Value, sfa: Value, b: Value, sfb: Value, wa: Value, wb: Value, m: Value,
              m_pad: Value, n: Value, n_pad: Value, k: Value, fmt: str, bm: int, bn: int,
              p: int, order: str = "reversed", trigger: bool = False) -> None:
    """Phase 1 for A (tiles of ``bm`` rows, ``m_pad`` rows) and B (``bn``, ``n_pad``) in one
    grid of ``blocks(m_pad) + blocks(n_pad)`` blocks (module docstring); index values,
    i8 memrefs ``a`` / ``b`` / ``wa`` / ``wb``, scale memrefs ``sfa`` / ``sfb`` (5-D)."""
    if p not in PIECES:
        raise ValueError(f"p must be one of {list(PIECES)}, got {p!r}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {list(ORDERS)}, got {order!r}")
    if trigger:
        N.launch_dependents()
    na = blocks(m_pad, k, p)
    bid = bir.block_idx("x")
    is_a = bir.ult(bid, na)
    with bir.when(is_a):
        _operand(a, sfa, wa, m, m_pad, k, bid, fmt, bm, p, order)
    with bir.when(arith.xori(is_a, bir.const(True, bir.i1()))):
        _operand(b, sfb, wb, n, n_pad, k, bir.sub(bid, na), fmt, bn, p, order)

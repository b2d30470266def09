"""IR of the AMD matrix-core block-scaled matmul (:mod:`blockscale.ops.matmul_mfma`).

Imports MLIR: only the ``build`` functions of ``matmul_mfma`` and ``matmul_grouped_mfma``
import it.

A block of 4 wavefronts (2 x 2) computes a 64 x 64 tile of C; each wavefront owns 2 x 2
subtiles of 16 x 16 and loads its operand fragments straight from global memory into
registers (lane layouts: :mod:`blockscale.compiler.arch.mfma`). Rows past M / N (or a
group's end) are read from the operand's row 0 and their outputs never stored; bytes past K
read as zero. Two mainloops:

``scaled`` (gfx950, MXFP4 / MXFP8): one ``v_mfma_scale_f32_16x16x128_f8f6f4`` per subtile
and K-step of 128: A and B are the raw FP4 / FP8 bytes, the E8M0 block scales are the
instruction's scale operands (byte 0 of each lane's scale register, ``opsel`` 0; K-blocks
past K get scale byte 127 = 1.0 over zero data). The MFMA accumulates in fp32 across
steps.

``bf16`` (gfx942 every format; gfx950 NVFP4, whose E4M3 scales and 16-element blocks the
E8M0-only scale operands cannot express): per scale block, the elements are decoded to bf16
in registers (E2M1 and E4M3 are exact in bf16; FP4 on gfx950 by
``v_cvt_scalef32_pk_bf16_fp4``, else integer ops), ``v_mfma_f32_16x16x16_bf16`` chains sum the
block from a zero accumulator (one MFMA per 16 elements), then ``acc += blk * (|sA| |sB|)``
in fp32 with the decoded block scales of the lane's output rows / column. For FP4 the block
sum is exact (multiples of 1/4 below 2^12) and so is its product with the scales, so the
result is the portable kernel's bit for bit; MXFP8 block sums may round (within the
B - 1 roundings per block of the error model in tests/test_matmul_common.py).

Each lane's K elements inside a scale block are taken in the MFMA's K order for both A and
B (the same permutation on both sides leaves every block sum unchanged).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import convert, mfma
from blockscale.formats import Format
from blockscale.ops import _matmul_ir as mir

Value = ir.Value

WAVE = 64
WAVES_M, WAVES_N = 2, 2
SUB_M, SUB_N = 2, 2
BM = 16 * SUB_M * WAVES_M
BN = 16 * SUB_N * WAVES_N
THREADS = WAVE * WAVES_M * WAVES_N


@dataclasses.dataclass
class Operand:
    """One operand's buffers and rows: ``row0`` is the wavefront's first row, rows below
    ``count`` are valid (M, N, or a group's end); row ``row`` is data row ``base + row``
    (``base`` None: 0; the grouped kernel's expert offset of W); ``scale_offset(row, j)`` the
    byte index of row ``row``'s scale of K-block ``j`` (index values, in bounds for valid rows
    and blocks)."""

    data: Value
    scales: Value
    row0: Value
    count: Value
    scale_offset: Callable[[Value, Value], Value]
    base: Value | None = None

    def data_row(self, row: Value) -> Value:
        return row if self.base is None else bir.add(self.base, row)


@dataclasses.dataclass
class Lane:
    """Per-lane coordinates (index values): lane group ``g`` and row ``r`` of 16x16 shapes,
    the wavefront's row offsets ``wm`` / ``wn`` inside the block tile."""

    g: Value
    r: Value
    wm: Value
    wn: Value

    @staticmethod
    def of() -> Lane:
        tid = bir.thread_idx("x")
        wave, lane = bir.udiv(tid, WAVE), bir.urem(tid, WAVE)
        return Lane(bir.udiv(lane, 16), bir.urem(lane, 16),
                    bir.mul(bir.udiv(wave, WAVES_N), 16 * SUB_M),
                    bir.mul(bir.urem(wave, WAVES_N), 16 * SUB_N))


def _row(op: Operand, local: Value) -> tuple[Value, Value]:
    """(clamped row, valid) of the wavefront's row ``local`` (invalid rows read row 0)."""
    row = bir.add(op.row0, local)
    ok = bir.ult(row, op.count)
    return bir.select(ok, row, 0), ok


def load_chunk(buf: Value, row: Value, ok: Value, row_bytes: Value, col: Value, nbytes: int,
               aligned: bool) -> Value:
    """``nbytes`` bytes of a data row from byte ``col`` as ``vector<nbytes x i8>``, zero where
    the row is invalid or past ``row_bytes``. ``aligned``: ``row_bytes`` and ``col`` are
    multiples of ``nbytes``, so the chunk is all in or all out: one wide load."""
    base = bir.mul(row, row_bytes)
    vt = bir.vec(nbytes, bir.i8())
    if aligned:
        inside = bir.logical_and(ok, bir.ult(col, row_bytes))
        v = bir.vector_load(vt, buf, bir.add(base, bir.select(inside, col, 0)),
                            alignment=nbytes)
        return arith.select(inside, v, bir.const(0, vt))
    elems = []
    for b in range(nbytes):
        c = bir.add(col, b)
        inside = bir.logical_and(ok, bir.ult(c, row_bytes))
        x = bir.load(buf, bir.add(base, bir.select(inside, c, 0)))
        elems.append(bir.select(inside, x, bir.const(0, bir.i8())))
    return bir.from_elements(vt, elems)


def load_scale(op: Operand, row: Value, ok: Value, j: Value, kblocks: Value,
               default: int) -> Value:
    """The scale byte (i32) of ``row`` / K-block ``j``; ``default`` for invalid rows or
    blocks past ``kblocks``."""
    live = bir.logical_and(ok, bir.ult(j, kblocks))
    idx = bir.select(live, op.scale_offset(row, j), 0)
    return bir.select(live, mir.load_byte_i32(op.scales, idx), bir.const(default, bir.i32()))


def _concat(parts: list[Value]) -> Value:
    """Concatenate equal ``vector<n x i8>`` values."""
    while len(parts) > 1:
        n = ir.VectorType(parts[0].type).shape[0]
        parts = [vector.shuffle(parts[i], parts[i + 1], list(range(2 * n)))
                 for i in range(0, len(parts), 2)]
    return parts[0]


# ---- scaled mainloop (gfx950, MX formats) ----------------------------------------------------


def _scaled_fragment(fmt: Format, op: Operand, lane: Lane, sub: int, step: Value,
                     row_bytes: Value, kblocks: Value, aligned: bool) -> tuple[Value, Value]:
    """(registers, scale register) of one 16-row subtile for one K-step of 128."""
    row, ok = _row(op, bir.add(lane.r, 16 * sub))
    if fmt.is_fp4:  # 16 contiguous bytes: K-block 4 step + g
        col = bir.add(bir.mul(step, 64), bir.mul(lane.g, 16))
        regs = bir.bitcast(load_chunk(op.data, op.data_row(row), ok, row_bytes, col, 16,
                                      aligned), bir.vec(4, bir.i32()))
    else:  # two 16-byte runs: bytes 16 g and 64 + 16 g of the step
        base = bir.add(bir.mul(step, 128), bir.mul(lane.g, 16))
        parts = [load_chunk(op.data, op.data_row(row), ok, row_bytes, bir.add(base, 64 * h),
                            16, aligned) for h in range(2)]
        regs = bir.bitcast(_concat(parts), bir.vec(8, bir.i32()))
    j = bir.add(bir.mul(step, 4), lane.g)
    return regs, load_scale(op, row, ok, j, kblocks, 127)


def emit_mainloop(path: str, target: str, fmt: Format, a: Operand, b: Operand, lane: Lane,
                  k: Value, aligned: bool) -> list[list[Value]]:
    """The mainloop of ``path`` ("scaled" | "bf16") for ``target``."""
    if path == "scaled":
        return emit_scaled_mainloop(fmt, a, b, lane, k, aligned)
    return emit_bf16_mainloop(fmt, a, b, lane, k, aligned, cvt_gfx950=target == "gfx950")


def emit_scaled_mainloop(fmt: Format, a: Operand, b: Operand, lane: Lane, k: Value,
                         aligned: bool) -> list[list[Value]]:
    """``acc[i][j]`` (``vector<4xf32>``, 16x16 D layout) of the wavefront's subtiles."""
    code = mfma.FORMAT_CODES["e2m1" if fmt.is_fp4 else "e4m3"]
    name = "e2m1" if code == 4 else "e4m3"
    row_bytes = bir.udiv(k, 2) if fmt.is_fp4 else k
    kblocks = bir.ceil_div(k, fmt.block_size)
    v4 = bir.vec(4, bir.f32())
    init = [bir.const(0.0, v4)] * (SUB_M * SUB_N)
    with bir.for_range(0, bir.ceil_div(k, 128), carry=init) as loop:
        step = loop.iv
        af = [_scaled_fragment(fmt, a, lane, i, step, row_bytes, kblocks, aligned)
              for i in range(SUB_M)]
        bf = [_scaled_fragment(fmt, b, lane, j, step, row_bytes, kblocks, aligned)
              for j in range(SUB_N)]
        acc = [mfma.mfma_scale("16x16x128", af[i][0], bf[j][0], loop.carried[i * SUB_N + j],
                               a_format=name, b_format=name, scale_a=af[i][1],
                               scale_b=bf[j][1]) for i in range(SUB_M) for j in range(SUB_N)]
        loop.yield_(*acc)
    res = loop.results
    return [[res[i * SUB_N + j] for j in range(SUB_N)] for i in range(SUB_M)]


# ---- bf16 mainloop (dequantize + bf16 MFMA) -------------------------------------------------


def _vconst(values: list[int], elem: ir.Type) -> Value:
    t = bir.vec(len(values), elem)
    import numpy as np

    return arith.constant(t, ir.DenseElementsAttr.get(np.array(values, np.int32), type=t))


def fp4_to_bf16_bits(word: Value, count: int) -> Value:
    """The ``count`` E2M1 codes in the low nibbles of i32 ``word`` (code i in nibble i) ->
    ``vector<count x i16>`` of bf16 bits (exact). 0 -> 0, 1 -> 0.5, c >= 2 -> exponent
    (c >> 1) + 126 and mantissa bit c & 1; the sign moves from bit 3 to bit 15."""
    vi = bir.vec(count, bir.i32())
    codes = arith.andi(arith.shrui(vector.broadcast(vi, word),
                                   _vconst([4 * i for i in range(count)], bir.i32())),
                       bir.const(0xF, vi))
    mag = arith.andi(codes, bir.const(7, vi))
    normal = arith.ori(arith.shli(arith.addi(arith.shrui(mag, bir.const(1, vi)),
                                             bir.const(126, vi)), bir.const(7, vi)),
                       arith.shli(arith.andi(mag, bir.const(1, vi)), bir.const(6, vi)))
    eq = lambda x, v: arith.cmpi(arith.CmpIPredicate.eq, x, bir.const(v, vi))
    bits = arith.select(eq(mag, 0), bir.const(0, vi),
                        arith.select(eq(mag, 1), bir.const(0x3F00, vi), normal))
    sign = arith.shli(arith.andi(codes, bir.const(8, vi)), bir.const(12, vi))
    return arith.trunci(bir.vec(count, bir.i16()), arith.ori(bits, sign))


def e4m3_to_bf16_bits(chunk: Value) -> Value:
    """``vector<n x i8>`` of E4M3 bytes -> ``vector<n x i16>`` of bf16 bits (exact; NaN
    codes give NaN)."""
    n = ir.VectorType(chunk.type).shape[0]
    f = convert.e4m3_to_f32(arith.extui(bir.vec(n, bir.i32()), chunk))
    return bir.bitcast(arith.truncf(bir.vec(n, bir.bf16()), f), bir.vec(n, bir.i16()))


def _halves(v: Value) -> list[Value]:
    """``vector<4k x i16>`` -> k ``vector<4xi16>`` (elements 4h .. 4h+3)."""
    n = ir.VectorType(v.type).shape[0]
    return [vector.shuffle(v, v, list(range(4 * h, 4 * h + 4))) for h in range(n // 4)]


def _fp4_halves_gfx950(word: Value, nbytes: int) -> list[Value]:
    """FP4 codes of the low ``nbytes`` bytes of ``word`` -> ``vector<4xi16>`` bf16 operands
    (4 codes each) with ``v_cvt_scalef32_pk_bf16_fp4`` (2 codes per instruction)."""
    out = []
    for h in range(nbytes // 2):
        lo, hi = (mfma.fp4_pair_to_bf16_gfx950(word, 2 * h + i) for i in range(2))
        out.append(bir.bitcast(vector.shuffle(lo, hi, [0, 1, 2, 3]), bir.vec(4, bir.i16())))
    return out


def _bf16_fragment(fmt: Format, op: Operand, lane: Lane, sub: int, j: Value,
                   row_bytes: Value, aligned: bool, cvt_gfx950: bool) -> list[Value]:
    """The ``vector<4xi16>`` MFMA operands (one per 16 elements) of one subtile, block j;
    ``cvt_gfx950``: FP4 decoded by the CDNA4 conversion instruction (else integer ops)."""
    row, ok = _row(op, bir.add(lane.r, 16 * sub))
    if fmt.is_fp4:
        nbytes = fmt.block_size // 8  # 2 (NVFP4) or 4 (MXFP4) bytes per lane
        col = bir.add(bir.mul(j, fmt.block_size // 2), bir.mul(lane.g, nbytes))
        chunk = load_chunk(op.data, op.data_row(row), ok, row_bytes, col, nbytes, aligned)
        wide = bir.i16() if nbytes == 2 else bir.i32()
        word = vector.extract(bir.bitcast(chunk, bir.vec(1, wide)), [], [0])
        if nbytes == 2:
            word = arith.extui(bir.i32(), word)
        if cvt_gfx950:
            return _fp4_halves_gfx950(word, nbytes)
        return _halves(fp4_to_bf16_bits(word, 2 * nbytes))
    col = bir.add(bir.mul(j, 32), bir.mul(lane.g, 8))  # MXFP8: 8 bytes per lane
    return _halves(e4m3_to_bf16_bits(load_chunk(op.data, op.data_row(row), ok, row_bytes, col,
                                                8, aligned)))


def emit_bf16_mainloop(fmt: Format, a: Operand, b: Operand, lane: Lane, k: Value,
                       aligned: bool, cvt_gfx950: bool = False) -> list[list[Value]]:
    """``acc[i][j]`` (``vector<4xf32>``, 16x16 D layout) of the wavefront's subtiles;
    ``cvt_gfx950``: decode FP4 with ``v_cvt_scalef32_pk_bf16_fp4`` (CDNA4)."""
    row_bytes = bir.udiv(k, 2) if fmt.is_fp4 else k
    kblocks = bir.ceil_div(k, fmt.block_size)
    v4 = bir.vec(4, bir.f32())
    zero = bir.const(0.0, v4)
    with bir.for_range(0, kblocks, carry=[zero] * (SUB_M * SUB_N)) as loop:
        j = loop.iv
        af = [_bf16_fragment(fmt, a, lane, i, j, row_bytes, aligned, cvt_gfx950)
              for i in range(SUB_M)]
        bf = [_bf16_fragment(fmt, b, lane, jj, j, row_bytes, aligned, cvt_gfx950)
              for jj in range(SUB_N)]
        # |sA| of the lane's 4 output rows (4 g + e) and |sB| of its output column (r)
        sa = []
        for i in range(SUB_M):
            vals = []
            for e in range(4):
                row, ok = _row(a, bir.add(bir.mul(lane.g, 4), 16 * i + e))
                vals.append(mir.decode_scale(fmt, load_scale(a, row, ok, j, kblocks, 0)))
            sa.append(bir.from_elements(v4, vals))
        sb = []
        for jj in range(SUB_N):
            row, ok = _row(b, bir.add(lane.r, 16 * jj))
            s = mir.decode_scale(fmt, load_scale(b, row, ok, j, kblocks, 0))
            sb.append(vector.broadcast(v4, s))
        acc = []
        for i in range(SUB_M):
            for jj in range(SUB_N):
                blk = zero
                for h in range(len(af[i])):
                    blk = mfma.mfma_bf16_16x16x16(af[i][h], bf[jj][h], blk)
                # exact scale product and (FP4) exact block term: one rounding per block
                term = arith.mulf(blk, arith.mulf(sa[i], sb[jj]))
                acc.append(arith.addf(loop.carried[i * SUB_N + jj], term))
        loop.yield_(*acc)
    res = loop.results
    return [[res[i * SUB_N + jj] for jj in range(SUB_N)] for i in range(SUB_M)]


def out_coords(lane: Lane, m0: Value, n0: Value, i: int, jj: int, e: int
               ) -> tuple[Value, Value]:
    """(m, n) of accumulator element ``e`` of subtile (i, jj): row 4 g + e, column r."""
    m = bir.add(bir.add(m0, lane.wm), bir.add(bir.mul(lane.g, 4), 16 * i + e))
    n = bir.add(bir.add(n0, lane.wn), bir.add(lane.r, 16 * jj))
    return m, n


def store_acc(c: Value, out_dtype: str, acc: list[list[Value]], lane: Lane, m0: Value,
              n0: Value, m_limit: Value, n_count: Value,
              value_fn: Callable[[Value, Value, Value], Value]) -> None:
    """Store ``value_fn(acc element, m, n)`` (f32, or already the output type) to
    ``c[m * n_count + n]`` for every accumulator element with ``m < m_limit`` and
    ``n < n_count``."""
    for i, row in enumerate(acc):
        for jj, v in enumerate(row):
            for e in range(4):
                m, n = out_coords(lane, m0, n0, i, jj, e)
                with bir.when(bir.logical_and(bir.ult(m, m_limit), bir.ult(n, n_count))):
                    mir.store_output(value_fn(vector.extract(v, [], [e]), m, n), c,
                                     bir.add(bir.mul(m, n_count), n), out_dtype)

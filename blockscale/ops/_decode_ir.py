"""IR of the decode (few rows) block-scaled matmul kernels: weight streaming + FMAs.

Imports MLIR: only :func:`blockscale.ops.matmul_decode.build` imports this module.

Work split
----------
A CTA of :data:`WARPS` warps owns :data:`COLS` = WARPS x :data:`ROWS_PER_WARP` weight rows
(output columns) of one group (grouped: ``grid = (ceil(N/COLS), len(group_list))``, CTA row y
works on group ``group_list[y]``; dense: one group of M rows, expert 0). The K axis is walked
in *windows* of 32 16-byte chunks per weight row: in a window, lane l of a warp holds chunk l
of each of its ROWS_PER_WARP weight rows (``ld.global.v4`` = LDG.E.128) and the chunk's
1-byte block scales. The loads are software-pipelined: window w + 1's are issued before
window w is computed (ROWS_PER_WARP x 16 bytes in flight per lane all the time). The group's
rows are processed in passes of :data:`ROWS` (a loop; rows past the group are skipped by
warp-uniform branches, so a 1-row group costs one row of FMAs, not ROWS). The activations of
a window (ROWS x 32 chunks) are decoded once per CTA into shared memory, laid out so that a
lane's reads are 16 bytes at consecutive addresses across the warp (no bank conflicts), with
their decoded scales.

Numerics (tests/test_matmul_common.py, the stated fp32 bound)
------------------------------------------------------------
Weights are decoded in registers with shifts and masks, *without* the exponent bias.

* FP4 (NVFP4, MXFP4): E2M1 ``(s, e, m)`` -> the f16 with bits ``s<<15 | (e, m)<<9`` =
  ``dec(w) * 2^-14`` (exact, the subnormal 0.5 included), two per register (elements j and
  j + 4 of a 32-bit word: ~2 ALU ops an element). Activations are staged as f16 pairs of
  ``dec(a) * 2^8`` (exact). A lane sums 8 pairs with ``fma.rn.f16x2``: each half sums 8
  products ``dec(a) dec(w) * 2^-6``, multiples of 2^-8 of magnitude <= 288 * 2^-6, i.e. at
  most 1152 quanta < 2^11: exact in f16 (normal range, no subnormal). The halves are widened
  and added in f32 (exact), ``* 2^6`` (exact): the block's exact dot product
  ``sum dec(a) dec(w)`` (NVFP4: one chain per 16-element block, MXFP4: two per 32).
* MXFP8: E4M3 -> the f32 with bits ``s<<31 | (e, m)<<20`` = ``dec(w) * 2^-120`` (exact),
  f32 FMAs against f32 activations: products exact (quantum >= 2^-138), sums round only in
  the normal range (<= 15 roundings per half block, inside the B - 1 the bound allows); then
  ``* 2^120`` (exact).

Then ``acc = fma(p, |sA| * |sB|, acc)``: the exact block term added with one rounding. Each
lane accumulates its chunks in K order and the warp adds the 32 lane sums with a butterfly:
every block term goes through at most ceil(J / 32) + 5 roundings — an accumulation tree of
the J block terms, within the J - 1 roundings of the bound (a sum tree's error bound depends
on its height; additions of exact zeros from idle lanes do not round). Then ``* alpha``
(dense) or ``* expert_scales[e] (* a_row_scales[m])`` (grouped, D10 order), and the output
cast (RNE).

NaN: an E4M3 *weight* NaN code (0x7F / 0xFF) would decode by bit placement to
+-480 * 2^-120, so the MXFP8 kernel tests each 16-byte weight chunk for a NaN code (SWAR, ~3
ops a word, :func:`_chunk_has_e4m3_nan`) and makes that chunk's block scale NaN: the block
term, hence the output column, is NaN, as in the reference (scales and activations use the
exact decoder).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlir import ir
from mlir.dialects import arith, gpu, vector
from mlir.dialects import math as mmath

import blockscale.ops._matmul_ir as mir
from blockscale.compiler import ir as bir
from blockscale.compiler.arch import convert
from blockscale.formats import Format
from blockscale.layouts import SF_ATOM_ROWS
from blockscale.ops._mma_ir import workgroup_buffer

Value = ir.Value

WARPS = 8
THREADS = 32 * WARPS
ROWS_PER_WARP = 4
COLS = WARPS * ROWS_PER_WARP
#: activation rows per pass over the weights (a group with more rows makes several passes)
ROWS = 4
CHUNK_BYTES = 16
WINDOW_CHUNKS = 32


_i32c = bir.i32_bits  # an i32 constant from a 32-bit pattern


def _shift(x: Value, s: int) -> Value:
    if s > 0:
        return bir.shl(x, _i32c(s))
    if s < 0:
        return bir.shru(x, _i32c(-s))
    return x


class Layout:
    """Per-format chunk constants."""

    def __init__(self, fmt: Format):
        self.fmt = fmt
        self.ew = 32 if fmt.is_fp4 else 16            # elements per 16-byte chunk
        self.kw = WINDOW_CHUNKS * self.ew             # elements per window
        # scale slots per chunk and their element spans
        if fmt.is_fp4:
            self.slots = CHUNK_BYTES * 2 // fmt.block_size  # NVFP4 2, MXFP4 1
        else:
            self.slots = 1                              # MXFP8: half a block
        self.span = self.ew // self.slots               # elements per slot
        self.raw_exp = 126 if fmt.is_fp4 else 120       # raw(w) = dec(w) * 2^-raw_exp
        #: FP4: f16x2 products (weights dec * 2^-14, activations dec * 2^8: the block sum
        #: is dec-sum * 2^-6, exact in f16 for 8 products a lane half)
        self.half = fmt.is_fp4

    def block_of(self, chunk: Value, slot: int) -> Value:
        """Global K-block of scale slot ``slot`` of global chunk ``chunk`` (index)."""
        if self.fmt.is_fp4:
            return bir.add(bir.mul(chunk, self.slots), slot)
        return bir.udiv(chunk, 2)


def _dequant_weights(lay: Layout, words: list[Value]) -> list[Value]:
    """The raw values (f32, dec(w) * 2^-raw_exp) of the elements in ``words`` (i32 each,
    little-endian, low nibble first), in K order.

    Two elements at a time, as the two bf16 halves of one register (bf16 is the top half of
    an f32, so the bit placement is the f32 one): FP4 elements j and j + 4 of a word
    (``(x << 6-4j) & 0x01C001C0 | (x << 12-4j) & 0x80008000``), E4M3 bytes 0 and 2 or 1 and
    3; then each half becomes an f32 (``<< 16`` / ``& 0xFFFF0000``): ~3 ALU ops an element.
    """
    f32 = bir.f32()
    per = 8 if lay.fmt.is_fp4 else 4
    out: list[Value | None] = [None] * (len(words) * per)
    hi_mask = _i32c(0xFFFF0000)
    for w, x in enumerate(words):
        if lay.fmt.is_fp4:  # (element, element + 4, magnitude shift, sign shift)
            pairs = [(j, j + 4, 6 - 4 * j, 12 - 4 * j) for j in range(4)]
            m_mask, s_mask = 0x01C001C0, 0x80008000
        else:  # bytes (0, 2) and (1, 3)
            pairs = [(0, 2, 4, 8), (1, 3, -4, 0)]
            m_mask, s_mask = 0x07F007F0, 0x80008000
        for lo, hi, ms, ss in pairs:
            r = bir.bit_or(bir.bit_and(_shift(x, ms), _i32c(m_mask)),
                           bir.bit_and(_shift(x, ss), _i32c(s_mask)))
            out[w * per + lo] = arith.bitcast(f32, bir.shl(r, _i32c(16)))
            out[w * per + hi] = arith.bitcast(f32, bir.bit_and(r, hi_mask))
    return out  # type: ignore[return-value]


def _chunk_has_e4m3_nan(words: list[Value]) -> Value:
    """i1: whether any byte of ``words`` (i32 each, four E4M3 codes) is a NaN code (0x7F /
    0xFF). Per word ``((x & 0x7F7F7F7F) + 0x01010101) & 0x80808080``: a byte's bit 7 is set
    iff its low 7 bits are all ones (0x7F + 1 = 0x80; no carry crosses a byte)."""
    acc = None
    for x in words:
        t = bir.bit_and(bir.add(bir.bit_and(x, _i32c(0x7F7F7F7F)), _i32c(0x01010101)),
                        _i32c(0x80808080))
        acc = t if acc is None else bir.bit_or(acc, t)
    return bir.ne(acc, _i32c(0))


def _dequant_pairs_f16(words: list[Value]) -> list[Value]:
    """FP4 weights as ``vector<2xf16>`` pairs (elements j and j + 4 of each word, j = 0..3,
    in order (word, j)), value dec(w) * 2^-14 (f16 bits ``s<<15 | (e, m)<<9``, subnormal
    0.5 included): ``(x << 9-4j) & 0x0E000E00 | (x << 12-4j) & 0x80008000``, ~2 ALU ops an
    element, exact."""
    out = []
    for x in words:
        for j in range(4):
            r = bir.bit_or(bir.bit_and(_shift(x, 9 - 4 * j), _i32c(0x0E000E00)),
                           bir.bit_and(_shift(x, 12 - 4 * j), _i32c(0x80008000)))
            out.append(_as_f16x2(r))
    return out


def _contract() -> ir.Attribute:
    """``#arith.fastmath<contract>``: lets the backend fuse an exact f16x2 multiply-add
    (math.fma on f16 lowers to a libdevice f32 call instead)."""
    return ir.Attribute.parse("#arith.fastmath<contract>")


def _as_f16x2(r: Value) -> Value:
    return vector.bitcast(bir.vec(2, bir.f16()), vector.from_elements(bir.vec(1, bir.i32()),
                                                                      [r]))


def _decode_scale_fast(fmt: Format, byte: Value) -> Value:
    """|block scale| as f32, as :func:`blockscale.ops._matmul_ir.decode_scale` (same value,
    NaN for E4M3 0x7F): E4M3 by bit placement, ``bits((b & 0x7F) << 20) * 2^120`` (exact,
    subnormal scales included), 4 ops instead of the generic decoder's ~10."""
    if fmt.is_mx:
        return mir.decode_scale(fmt, byte)
    f32 = bir.f32()
    v = bir.bit_and(byte, 0x7F)
    val = arith.mulf(arith.bitcast(f32, bir.shl(v, _i32c(20))), bir.const(2.0 ** 120, f32))
    return bir.select(bir.eq(v, _i32c(0x7F)), bir.const(float("nan"), f32), val)


def _shuffle_xor(v: Value, off: int) -> Value:
    op = gpu.ShuffleOp(v, _i32c(off), _i32c(32), gpu.ShuffleMode.XOR)
    return op.results[0]


def emit_decode(kb: Any, fmt: Format, *, start: Value, end: Value, expert: Value,
                n_count: Value, k: Value, a_srow: Callable[[Value], Value],
                store: Callable[[Value, Value, Value], None]) -> None:
    """The body for one (group, column slice): rows ``[start, end)`` of ``a`` against weight
    rows ``expert * N + n`` (``n`` in this CTA's slice); ``a_srow(m)``: the 5-D scale row of
    activation row m; ``store(total, m, n)`` writes one finished fp32 dot product."""
    lay = Layout(fmt)
    f32, i32 = bir.f32(), bir.i32()
    act = (workgroup_buffer(kb, ROWS * lay.kw // 2, bir.i32()) if lay.half
           else workgroup_buffer(kb, ROWS * lay.kw, f32))
    sact = workgroup_buffer(kb, ROWS * WINDOW_CHUNKS * lay.slots, f32)
    a, w, sfa, sfb = (kb.arg(x) for x in ("a", "w" if "w" in kb.values else "b", "sfa", "sfb"))

    tid = bir.thread_idx("x")
    lane = bir.urem(tid, 32)
    warp = bir.udiv(tid, 32)
    row_bytes = bir.udiv(k, 2) if fmt.is_fp4 else k
    row_chunks = bir.udiv(row_bytes, CHUNK_BYTES)
    kblocks = bir.ceil_div(k, fmt.block_size)
    d1 = bir.ceil_div(kblocks, 4)
    windows = bir.ceil_div(row_chunks, WINDOW_CHUNKS)
    n0 = bir.add(bir.mul(bir.block_idx("x"), COLS), bir.mul(warp, ROWS_PER_WARP))
    ns = [bir.add(n0, i) for i in range(ROWS_PER_WARP)]
    nvalid = [bir.ult(n, n_count) for n in ns]
    e = bir.as_index(expert)
    # loads use clamped rows / chunks (always in bounds, no branch): a clamped row's results
    # are never stored, a clamped chunk meets zero activations (exact zero products)
    n_last = bir.sub(n_count, 1)
    ns_c = [bir.umin(n, n_last) for n in ns]
    w_rows = [bir.mul(bir.add(bir.mul(e, n_count), n), row_bytes) for n in ns_c]
    b_srow0 = bir.mul(bir.mul(e, bir.ceil_div(n_count, SF_ATOM_ROWS)), SF_ATOM_ROWS)
    sfb_rows = [mir.tcgen_row_offset(bir.add(b_srow0, n), d1) for n in ns_c]
    v16 = bir.vec(16, bir.i8())
    ident = bir.const(0.0, f32)

    with bir.for_range(start, end, ROWS) as rl:
        r0 = rl.iv
        rows_c = bir.umin(bir.sub(end, r0), ROWS)
        n_acc = ROWS_PER_WARP * ROWS

        def fetch(win: Value) -> list[Value]:
            """Window ``win``'s weight chunks (vector<16xi8>) and scale bytes (i32) of the
            warp's rows. Chunks past the row end load the row's last chunk instead (in
            bounds; the staged activations there are zeros, so they add exact zeros — a NaN
            scale there already makes the row NaN)."""
            chunk = bir.umin(bir.add(bir.mul(win, WINDOW_CHUNKS), lane),
                             bir.sub(row_chunks, 1))
            off = bir.mul(chunk, CHUNK_BYTES)
            kb_off = mir.tcgen_kblock_offset(lay.block_of(chunk, 0))
            data, sbytes = [], []
            for i in range(ROWS_PER_WARP):
                data.append(bir.vector_load(v16, w, bir.add(w_rows[i], off), alignment=16))
                if lay.slots == 2:  # NVFP4: K-blocks 2c, 2c + 1 are adjacent bytes
                    pair = bir.vector_load(bir.vec(2, bir.i8()), sfb,
                                           bir.add(sfb_rows[i], kb_off), alignment=2)
                    sbytes += [arith.extui(i32, bir.extract(pair, q)) for q in range(2)]
                else:
                    sbytes.append(mir.load_byte_i32(sfb, bir.add(sfb_rows[i], kb_off)))
            return data + sbytes

        # software pipeline: window w + 1's loads are in flight while window w is computed
        def fetch_all(win: Value) -> list[Value]:
            return fetch(win) + _stage_fetch(lay, a, sfa, tid, r0, rows_c, win, kblocks, d1,
                                             a_srow, row_bytes)

        n_w = ROWS_PER_WARP * (1 + lay.slots)  # weight chunks + scale bytes in the carry
        with bir.for_range(0, windows, carry=[ident] * n_acc + fetch_all(bir.const(0))) as wl:
            win = wl.iv
            cur = list(wl.carried[n_acc:n_acc + n_w])
            cur_act = list(wl.carried[n_acc + n_w:])
            nxt = fetch_all(bir.add(win, 1))  # activations too: no exposed load latency
            words = [[bir.extract(vector.bitcast(bir.vec(4, i32), cur[i]), q) for q in range(4)]
                     for i in range(ROWS_PER_WARP)]
            sbs = [[_decode_scale_fast(fmt, cur[ROWS_PER_WARP + i * lay.slots + s_])
                    for s_ in range(lay.slots)] for i in range(ROWS_PER_WARP)]
            if not fmt.is_fp4:  # a NaN weight code makes its block term NaN (docstring)
                nan = bir.const(float("nan"), f32)
                sbs = [[bir.select(_chunk_has_e4m3_nan(words[i]), nan, sbs[i][0])]
                       for i in range(ROWS_PER_WARP)]
            bir.barrier()  # the previous window's shared reads are done
            _stage_store(lay, act, sact, tid, rows_c, cur_act)
            bir.barrier()
            accs = list(wl.carried[:n_acc])
            for i in range(ROWS_PER_WARP):
                # Each weight row is a branch (n < N) and so is each activation row (r <
                # rows, row 0 included): no branch dominates another, so the compiler keeps
                # one weight row's 32 dequantized values and one row's activations live at a
                # time (hoisting them costs ~40 registers per weight row).
                sl = slice(i * ROWS, (i + 1) * ROWS)
                old = accs[sl]
                wb = bir.if_(nvalid[i], [f32] * ROWS)
                with wb.then():
                    # once per weight row and window
                    wv = (_dequant_pairs_f16(words[i]) if lay.half
                          else _dequant_weights(lay, words[i]))
                    new = []
                    for r in range(ROWS):
                        g = bir.if_(bir.ult(bir.const(r), rows_c), [f32])
                        with g.then():
                            g.yield_(_row_dot(lay, act, sact, lane, r, wv, sbs[i], old[r]))
                        with g.else_():
                            g.yield_(old[r])
                        new.append(g.results[0])
                    wb.yield_(*new)
                with wb.else_():
                    wb.yield_(*old)
                accs[sl] = list(wb.results)
            wl.yield_(*accs, *nxt)
        totals = list(wl.results[:n_acc])
        for r in range(ROWS):
            with bir.when(bir.ult(bir.const(r), rows_c)):
                for i in range(ROWS_PER_WARP):
                    v = totals[i * ROWS + r]
                    for off in (16, 8, 4, 2, 1):
                        v = arith.addf(v, _shuffle_xor(v, off))
                    with bir.when(bir.logical_and(bir.eq(lane, i), nvalid[i])):
                        store(v, bir.add(r0, r), ns[i])
        bir.barrier()  # the next row chunk restages the shared buffers



def _row_dot(lay: Layout, act: Value, sact: Value, lane: Value, r: int, wv: list[Value],
             sb: list[Value], acc: Value) -> Value:
    """acc plus this lane's block terms of activation row r against one weight chunk."""
    f32 = bir.f32()
    if lay.half:
        return _row_dot_f16(lay, act, sact, lane, r, wv, sb, acc)
    av: list[Value] = []
    for q in range(lay.ew // 4):  # 16-byte shared reads, consecutive across lanes
        vec = bir.vector_load(bir.vec(4, f32), act,
                              bir.add(bir.mul(lane, 4), r * lay.kw + q * 128), alignment=16)
        av += [bir.extract(vec, t) for t in range(4)]
    for s in range(lay.slots):
        p = bir.const(0.0, f32)
        for el in range(s * lay.span, (s + 1) * lay.span):
            p = mmath.fma(av[el], wv[el], p)  # exact products (module docstring)
        t = arith.mulf(p, bir.const(2.0 ** lay.raw_exp, f32))  # exact: the block sum
        sa = bir.load(sact, bir.add(bir.mul(lane, lay.slots), r * WINDOW_CHUNKS * lay.slots + s))
        acc = mmath.fma(t, arith.mulf(sa, sb[s]), acc)  # exact product, one rounding
    return acc


def _row_dot_f16(lay: Layout, act: Value, sact: Value, lane: Value, r: int, wv: list[Value],
                 sb: list[Value], acc: Value) -> Value:
    """FP4: ``fma.rn.f16x2`` chains of 8 pairs (each half sums 8 products exactly), the two
    halves widened to f32 and added (exact), then the block term as in :func:`_row_dot`."""
    f32, v2h = bir.f32(), bir.vec(2, bir.f16())
    ap: list[Value] = []
    for q in range(4):  # 16-byte shared reads: 4 pairs of word q, consecutive across lanes
        vec = bir.vector_load(bir.vec(4, bir.i32()), act,
                              bir.add(bir.mul(lane, 4), r * (lay.kw // 2) + q * 128),
                              alignment=16)
        ap += [_as_f16x2(bir.extract(vec, t)) for t in range(4)]
    groups = 16 // lay.slots // 8  # chains of 8 pairs per slot: NVFP4 1, MXFP4 2
    for s in range(lay.slots):
        p = None
        for c in range(groups):
            h = bir.const(0.0, v2h)
            base = (s * groups + c) * 8
            for x in range(base, base + 8):  # exact (Layout.half): contract -> fma.rn.f16x2
                h = arith.addf(arith.mulf(ap[x], wv[x], fastmath=_contract()), h,
                               fastmath=_contract())
            part = arith.addf(arith.extf(f32, bir.extract(h, 0)),
                              arith.extf(f32, bir.extract(h, 1)))
            p = part if p is None else arith.addf(p, part)  # exact: <= 2^13 quanta
        t = arith.mulf(p, bir.const(2.0 ** 6, f32))  # exact: the block sum
        sa = bir.load(sact, bir.add(bir.mul(lane, lay.slots), r * WINDOW_CHUNKS * lay.slots + s))
        acc = mmath.fma(t, arith.mulf(sa, sb[s]), acc)  # exact product, one rounding
    return acc


def _stage_fetch(lay: Layout, a: Value, sfa: Value, tid: Value, r0: Value, rows_c: Value,
                 win: Value, kblocks: Value, d1: Value, a_srow: Callable[[Value], Value],
                 row_bytes: Value) -> list[Value]:
    """This thread's share of window ``win``'s activations: 4-byte words (i32) and scale
    bytes (i32); 0 past the row end / the last K-block or for rows past the pass (never
    read: activations there are zeros, so any scale gives zero terms)."""
    i32 = bir.i32()
    out = []
    words_per_row = WINDOW_CHUNKS * CHUNK_BYTES // 4
    for it in range(-(-ROWS * words_per_row // THREADS)):
        idx = bir.add(tid, it * THREADS)
        r, wd = bir.udiv(idx, words_per_row), bir.urem(idx, words_per_row)
        col = bir.add(bir.mul(win, WINDOW_CHUNKS * CHUNK_BYTES), bir.mul(wd, 4))
        br = bir.if_(bir.logical_and(bir.ult(r, rows_c), bir.ult(col, row_bytes)), [i32])
        with br.then():  # 4-byte aligned: K % 32 (FP4) / K % 16 (MXFP8)
            v = bir.vector_load(bir.vec(4, bir.i8()), a,
                                bir.add(bir.mul(bir.add(r0, r), row_bytes), col), alignment=4)
            br.yield_(vector.extract(vector.bitcast(bir.vec(1, i32), v), [], [0]))
        with br.else_():
            br.yield_(bir.const(0, i32))
        out.append(br.results[0])
    per_row = WINDOW_CHUNKS * lay.slots
    for it in range(-(-ROWS * per_row // THREADS)):
        idx = bir.add(tid, it * THREADS)
        r, rem = bir.udiv(idx, per_row), bir.urem(idx, per_row)
        chunk = bir.add(bir.mul(win, WINDOW_CHUNKS), bir.udiv(rem, lay.slots))
        jb = (bir.add(bir.mul(chunk, lay.slots), bir.urem(rem, lay.slots)) if lay.fmt.is_fp4
              else bir.udiv(chunk, 2))
        br = bir.if_(bir.logical_and(bir.ult(r, rows_c), bir.ult(jb, kblocks)), [i32])
        with br.then():
            off = bir.add(mir.tcgen_row_offset(a_srow(bir.add(r0, r)), d1),
                          mir.tcgen_kblock_offset(jb))
            br.yield_(mir.load_byte_i32(sfa, off))
        with br.else_():
            br.yield_(bir.const(0, i32))
        out.append(br.results[0])
    return out


def _stage_store(lay: Layout, act: Value, sact: Value, tid: Value, rows_c: Value,
                 fetched: list[Value]) -> None:
    """Decode :func:`_stage_fetch`'s values into the shared activation / scale buffers."""
    f32 = bir.f32()
    words_per_row = WINDOW_CHUNKS * CHUNK_BYTES // 4
    n_words = -(-ROWS * words_per_row // THREADS)
    for it in range(n_words):
        idx = bir.add(tid, it * THREADS)
        r, wd = bir.udiv(idx, words_per_row), bir.urem(idx, words_per_row)
        x = fetched[it]
        with bir.when(bir.ult(r, rows_c)):
            if lay.half:  # f16 pairs (j, j + 4) of dec(a) * 2^8, exact; one 16-byte store
                raw = _dequant_weights(lay, [x])  # dec(a) * 2^-126
                vals = [arith.truncf(bir.f16(), arith.mulf(arith.mulf(
                    v, bir.const(2.0 ** 126, f32)), bir.const(2.0 ** 8, f32))) for v in raw]
                pairs = [bir.bitcast(bir.from_elements(bir.vec(2, bir.f16()),
                                                       [vals[j], vals[j + 4]]),
                                     bir.vec(1, bir.i32())) for j in range(4)]
                words4 = bir.from_elements(bir.vec(4, bir.i32()),
                                           [bir.extract(pr, 0) for pr in pairs])
                ln, q = bir.udiv(wd, 4), bir.urem(wd, 4)
                dst = bir.add(bir.add(bir.mul(r, lay.kw // 2), bir.mul(q, 128)),
                              bir.mul(ln, 4))
                bir.vector_store(words4, act, dst, alignment=16)
            else:  # MXFP8: f32 through the exact decoder (E4M3 NaN -> NaN)
                vals = [convert.e4m3_to_f32(bir.bit_and(bir.shru(x, _i32c(8 * j)), 0xFF))
                        for j in range(4)]
                el = bir.mul(wd, 4)  # first element of the word in the window
                ln, p = bir.udiv(el, lay.ew), bir.urem(el, lay.ew)
                dst = bir.add(bir.add(bir.mul(r, lay.kw), bir.mul(ln, 4)),
                              bir.mul(bir.udiv(p, 4), 128))
                bir.vector_store(bir.from_elements(bir.vec(4, f32), vals), act, dst,
                                 alignment=16)
    per_row = WINDOW_CHUNKS * lay.slots
    for it in range(-(-ROWS * per_row // THREADS)):
        idx = bir.add(tid, it * THREADS)
        with bir.when(bir.ult(bir.udiv(idx, per_row), rows_c)):
            bir.store(mir.decode_scale(lay.fmt, fetched[n_words + it]), sact, idx)

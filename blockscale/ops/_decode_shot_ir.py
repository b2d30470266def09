"""IR of the "one-shot" decode variants (``variant="mma_shot"`` / ``"mma_shot7k"``, FP4).

Imports MLIR: only :func:`blockscale.ops.matmul_decode.build` imports this module.

Why
---
"mma_c8t" gives a 128-thread CTA 64 weight rows and walks K in dependent 16 KB steps: the
dense M = 1 grid (N = 5760, K = 2944) has 90 CTAs and ~1.4 MB in flight, where the H200 needs
~4-5 MB in flight to stream at copy speed. Here a CTA owns only 16 weight rows
(one MMA M-tile: 360 CTAs for that grid, all resident) and issues *every* byte of its slice
at once: the weight rows and the pass's activation rows, one ``cp.async.bulk`` per row and K
slice (a warp's quarter, below), issued slice-major (every warp's slice-0 copies first), each
slice completing on its own mbarrier (``expect_tx`` of its bytes). The threads first load the
slice's weight scale words and the pass's activation scales with ``ld.global`` (issued before
the copies, so that they are not queued behind them), decode them into shared memory after the
copies are issued, and each warp waits on the mbarrier of its own K slice: issued first, warp
0's slice is served first by DRAM and its MMAs overlap the rest of the stream. 16 x 1472
bytes of weights per CTA, 360 CTAs: all 8.5 MB of the dense M = 1 problem are requested in
the kernel's first microseconds.

Compute
-------
The warps (4; 6 for "mma_shot6", 8 for "mma_shot7k" / "mma_shot32") each take a contiguous K slice of the
chunks (16 bytes = 32 FP4 elements = two ``mma.sync.m16n8k16`` units, swap-AB as
:mod:`blockscale.ops._decode_mma_ir`: weight rows are the MMA's M side, tokens the N side)
for all the CTA's rows. A lane's A word of a unit pair is
read from the raw shared row (NVFP4: two 4-byte reads and one ``prmt`` give
:func:`~blockscale.ops._decode_mma_ir._pair_pieces`'s word; MXFP4: the raw word t, a block
being the whole chunk) and decoded by
:func:`~blockscale.ops._decode_mma_ir.fp4_word_to_f16_pairs`; its B word is the same word of
activation row g, decoded the same way (NVFP4: times ``f16(|sA|)`` of the unit's block, as
the "mma" variants' staging does). Folding is "mma"'s: NVFP4 one MMA per block from zero and
``acc = fma(D, |sB|, acc)``, MXFP4 two chained MMAs per block and ``fma(D * 2^30,
(sA * sB) * 0.25, acc)``: every block term is exact, one rounding per block. Passes of
``tokens`` rows (8: one n-tile; 16, "mma_shot16": two n-tiles sharing each A fragment's
decode, ~27 % fewer instructions per 16 rows than two 8-row passes) re-read the weights from
shared memory (only the activation rows are copied again).

Reduction (deterministic)
-------------------------
Warps 1.. store their fp32 partials (4 per lane, M-tile and n-tile) to shared memory; warp 0
adds them to its own in the fixed order ``((p0 + p1) + p2) + ..``, then (NVFP4) times ``2^28`` and
the caller's ``store`` (alpha / expert scale / row scale, cast). An output's K blocks thus go
through J - W in-warp roundings plus W - 1 adds (J - 1, as the sequential chain; the W
warps' first terms are exact): the fp32 bound of tests/test_matmul_common.py holds, the bits
differ from the portable kernel's, and they are the same from run to run.

Shared memory (per CTA, ``kcap`` = the variant's largest K)
----------------------------------------------------------
All of it dynamic (:func:`blockscale.ops.matmul_decode.shot_layout`; the runtime opts in above
48 KB of dynamic memory, and static + dynamic > 48 KB with less dynamic would not launch): the
C weight rows and ``tokens`` activation rows of ``kcap / 2 + 16`` bytes (the 16-byte pad makes
the row stride an odd number of 16-byte chunks: the 8 rows x 4 lanes of a fragment read hit
distinct banks), an mbarrier per warp, the weight scales (f32 ``[pair][m][g][h][block]`` for
NVFP4 with kcap <= 4096, else raw E4M3 bytes decoded per use; MXFP4 f32 ``[block][m][g][h]``),
the activation scales (NVFP4 f16 pairs ``[pair][token]``, MXFP4 f32 ``[block][token]``) and
warps 1..'s partials. NVFP4 (MXFP4): "mma_shot" 52.9 KB (46.9): 4 CTAs per SM; "mma_shot6"
53.9 (47.9) for 3 CTAs of 192 threads (112 registers); "mma_shot16" 69.5 (63.5): 3;
"mma_shot32" 94.7 (82.7): 2 of 256 threads; "mma_shot7k" (kcap 7168, DeepSeek-V3, 256
threads) 101.9 (108.9): 2.

"mma_shot32": 32 columns (two M-tiles per warp: each B fragment's decode and |sA| serve both)
and 8 warps on K eighths.

sm_90a SASS of the chunk loop (2 chunks an iteration; per chunk, warp and M-tile: 16 rows x 16
bytes): "mma_shot" NVFP4 133 / 2 instructions (A decode 2 x 14, B decode and |sA| ~20, fold
9, 2 HMMA), MXFP4 123 / 2; "mma_shot16"'s two-n-tile loop 195 / 2 (MXFP4 185 / 2);
"mma_shot32" 214 / 4 (MXFP4 210 / 4); 105-128 registers, no spill.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlir import ir
from mlir.dialects import arith, memref, vector
from mlir.dialects import math as mmath

import blockscale.ops._matmul_ir as mir
from blockscale.compiler import ir as bir
from blockscale.compiler.arch import cpasync, mma, tma
from blockscale.compiler.arch import wgmma as W
from blockscale.compiler.arch.nvvm import byte_perm
from blockscale.formats import Format
from blockscale.layouts import SF_ATOM_BYTES, SF_ATOM_ROWS
from blockscale.ops._decode_ir import _decode_scale_fast
from blockscale.ops._decode_mma_ir import (
    UNSCALE,
    _f16x2,
    _Fmt,
    _i32c,
    decode_e4m3_word,
    fp4_word_to_f16_pairs,
)
from blockscale.ops.matmul_decode import shot_f32_scales, shot_row_stride

Value = ir.Value

#: weight rows of an MMA M-tile (a CTA has ``mtiles`` of them)
TILE = 16


def check_kcap(kcap: int) -> None:
    """ValueError unless ``kcap`` is a positive multiple of 128 (whole 5-D scale words)."""
    if kcap <= 0 or kcap % 128:
        raise ValueError(f"kcap must be a positive multiple of 128, got {kcap}")


def emit_decode_shot(kb: Any, fmt: Format, *, start: Value, end: Value, expert: Value,
                     n_count: Value, k: Value, a_srow: Callable[[Value], Value],
                     store: Callable[[Value, Value, Value], None], kcap: int,
                     layout: dict[str, int], tokens: int = 8, mtiles: int = 1,
                     warps: int = 4, sliced: bool = True) -> None:
    """The body for one (group, column slice) (the interface of
    :func:`blockscale.ops._decode_ir.emit_decode`; a CTA of ``32 warps`` threads computes
    columns ``[C block_idx.x, +C)``, ``C = 16 mtiles``, of rows ``[start, end)``); ``k``
    must be <= ``kcap`` (the host checks: the shared rows hold ``kcap / 2`` bytes) and a
    multiple of 32; ``tokens``: rows per pass, 8 (one n-tile) or 16 (two n-tiles sharing
    each A fragment's decode; a pass of <= 8 rows runs the one-n-tile loop); ``mtiles``: the
    M-tiles of 16 rows every warp computes (2: each B fragment's decode serves both);
    ``warps``: the K slices (4, 6 or 8); ``layout``: the byte offsets of the shared buffers
    in the dynamic shared memory (:func:`blockscale.ops.matmul_decode.shot_layout`);
    ``sliced``: a copy per row and warp K slice, an mbarrier per slice (each warp starts on
    its slice), else a copy per whole row and one mbarrier (4-8x fewer, longer copies)."""
    check_kcap(kcap)
    if tokens not in (8, 16) or mtiles not in (1, 2) or warps not in (4, 6, 8):
        raise ValueError(f"tokens must be 8 or 16, mtiles 1 or 2, warps 4, 6 or 8, got "
                         f"{tokens}, {mtiles}, {warps}")
    lay = _Fmt(fmt)
    nv = lay.nv
    nt_max = tokens // 8
    cols, threads, mt = TILE * mtiles, 32 * warps, mtiles
    # NVFP4 weight scales decoded to f32 at staging when they fit (kcap <= 4096: 12 KB a
    # M-tile); else raw E4M3, decoded per use (~7 more instructions a chunk and M-tile)
    f32_sb = shot_f32_scales(fmt.name, kcap)
    f32, i32, i16, i64 = bir.f32(), bir.i32(), bir.i16(), bir.i64()
    stride = shot_row_stride(kcap)
    pairs_cap = kcap // 32  # 16-byte chunks (unit pairs) of a row
    d1_cap = -(-kcap // (4 * fmt.block_size))  # 5-D scale words of a row
    a_off = cols * stride  # the activation rows' byte offset
    per_slice = cols + tokens  # the copies of a K slice (rows)
    buf = tma.extern_shared_buffer(kb, layout["total"], align=128)
    base = W.shared_address(buf)
    bars = arith.addi(base, bir.const(layout["bars"], i64))
    space = ir.MemRefType(buf.type).memory_space

    def typed(name: str, n: int, elem: Any) -> Value:
        """``n`` elements of ``elem`` at the layout's offset ``name`` (``memref.view``)."""
        return memref.view(ir.MemRefType.get([n], elem, memory_space=space), buf,
                           bir.const(layout[name]), [])

    def bar(w: Value) -> Value:
        """The shared address of warp ``w``'s mbarrier (its K slice's copies)."""
        return arith.addi(bars, bir.as_i64(bir.mul(w, 8)))

    # weight scales [pair][m][g][h][block 2q + s] (CTA row 16 m + 8 h + g): NVFP4 f32 (or
    # raw E4M3: an i16 per (pair, m, g, h)); MXFP4 f32 [block][m][g][h]
    sb = typed("sb", pairs_cap * cols * (2 if f32_sb else 1), f32 if f32_sb or not nv else i16)
    # activation scales: NVFP4 f16 pairs (blocks 2q, 2q + 1) [pair][token]; MXFP4 f32
    # [block][token]
    sa = typed("sa", pairs_cap * tokens, i32 if nv else f32)
    parts = mt * nt_max  # (M-tile, n-tile) accumulator groups of 4 per lane
    red = typed("red", (warps - 1) * 32 * 4 * parts, f32)
    a, w, sfa, sfb = (kb.arg(x) for x in ("a", "w" if "w" in kb.values else "b", "sfa", "sfb"))

    tid = bir.thread_idx("x")
    lane, warp = bir.urem(tid, 32), bir.udiv(tid, 32)
    g, t = bir.udiv(lane, 4), bir.urem(lane, 4)
    row_bytes = bir.udiv(k, 2)
    chunks = bir.udiv(row_bytes, 16)
    kblocks = bir.ceil_div(k, fmt.block_size)
    d1 = bir.ceil_div(kblocks, 4)
    n0 = bir.mul(bir.block_idx("x"), cols)
    n_last = bir.sub(n_count, 1)
    e = bir.as_index(expert)
    zero = bir.const(0.0, f32)

    with bir.when(bir.ult(tid, warps)):
        cpasync.mbarrier_init(bar(tid), 1)
        tma.fence_mbarrier_init()

    # ---- the weight scale words of the slice (issued before the copies: they arrive first)
    s_iters = -(-cols * d1_cap // threads)
    b_srow0 = bir.mul(bir.mul(e, bir.ceil_div(n_count, SF_ATOM_ROWS)), SF_ATOM_ROWS)

    def slots(it: int, n: int) -> tuple[Value, Value]:
        """(row, word) of load ``it`` of this thread over ``n`` rows: ``idx % n``,
        ``idx // n``."""
        idx = bir.add(tid, it * threads)
        return bir.urem(idx, n), bir.udiv(idx, n)

    def load_words(buf_: Value, iters: int, n: int, live: Callable[[Value], Value],
                   row_off: Callable[[Value], Value]) -> list[Value]:
        """This thread's 4-byte scale words (rows :func:`slots`, word q < d1 where
        ``live(row)``; else 0) at ``row_off(row) + 512 q``."""
        out = []
        for it in range(iters):
            r, q = slots(it, n)
            br = bir.if_(bir.logical_and(bir.ult(q, d1), live(r)), [i32])
            with br.then():
                off = bir.add(row_off(r), bir.mul(q, SF_ATOM_BYTES))
                v = bir.vector_load(bir.vec(4, bir.i8()), buf_, off, alignment=4)
                br.yield_(vector.extract(vector.bitcast(bir.vec(1, i32), v), [], [0]))
            with br.else_():
                br.yield_(_i32c(0))
            out.append(br.results[0])
        return out

    def load_weight_scales() -> list[Value]:
        """(5-D padding rows past N: in bounds, never stored)"""
        return load_words(sfb, s_iters, cols, lambda r: bir.ult(r, cols),
                          lambda r: mir.tcgen_row_offset(bir.add(b_srow0, bir.add(n0, r)), d1))

    def stage_weight_scales(words: list[Value]) -> None:
        for it, word in enumerate(words):
            r, q = slots(it, cols)
            mg = bir.add(bir.mul(bir.udiv(r, TILE), 8), bir.urem(r, 8))  # 8 m + g
            hh = bir.udiv(bir.urem(r, TILE), 8)
            with bir.when(bir.ult(q, d1)):
                if f32_sb:  # blocks 4q .. 4q + 3 = pairs 2q, 2q + 1: [pair][g][h][2] f32
                    svs = decode_e4m3_word(word)
                    for j in range(2):
                        dst = bir.add(bir.mul(bir.add(bir.mul(q, 2), j), 2 * cols),
                                      bir.add(bir.mul(mg, 4), bir.mul(hh, 2)))
                        bir.vector_store(bir.from_elements(bir.vec(2, f32), svs[2 * j:2 * j + 2]),
                                         sb, dst, alignment=8)
                elif nv:  # the raw bytes (b0, b1) of pair 2q, (b2, b3) of pair 2q + 1
                    for j in range(2):
                        half = arith.trunci(i16, bir.shru(word, _i32c(16 * j)) if j else word)
                        dst = bir.add(bir.mul(bir.add(bir.mul(q, 2), j), cols),
                                      bir.add(bir.mul(mg, 2), hh))
                        bir.store(half, sb, dst)
                else:  # blocks 4q + i
                    for i in range(4):
                        v = _decode_scale_fast(fmt, bir.bit_and(bir.shru(word, _i32c(8 * i)),
                                                                0xFF))
                        dst = bir.add(bir.mul(bir.add(bir.mul(q, 4), i), cols),
                                      bir.add(bir.mul(mg, 2), hh))
                        bir.store(v, sb, dst)

    a_iters = -(-tokens * d1_cap // threads)

    def load_act_scales(r0: Value, rows: Value) -> list[Value]:
        """The pass's activation scale words of this thread (rows past the pass: 0, read
        only by unstored columns)."""
        return load_words(sfa, a_iters, tokens, lambda n: bir.ult(n, rows),
                          lambda n: mir.tcgen_row_offset(a_srow(bir.add(r0, n)), d1))

    def stage_act_scales(words: list[Value]) -> None:
        for it, word in enumerate(words):
            n, q = slots(it, tokens)
            with bir.when(bir.ult(q, d1)):
                if nv:  # |sA| as f16 (exact), pairs 2q, 2q + 1
                    svs = [arith.truncf(bir.f16(), x) for x in decode_e4m3_word(word)]
                    for j in range(2):
                        pr = bir.from_elements(bir.vec(2, bir.f16()), svs[2 * j:2 * j + 2])
                        bir.store(mma.pack_i32(pr), sa,
                                  bir.add(bir.mul(bir.add(bir.mul(q, 2), j), tokens), n))
                else:
                    for i in range(4):
                        v = mir.decode_scale(fmt, bir.bit_and(bir.shru(word, _i32c(8 * i)),
                                                              0xFF))
                        bir.store(v, sa, bir.add(bir.mul(bir.add(bir.mul(q, 4), i), tokens),
                                                 n))

    per = bir.ceil_div(chunks, warps)  # a warp's K slice: chunks [c_lo, c_hi)

    def k_slice(wi: Value) -> tuple[Value, Value]:
        lo = bir.umin(bir.mul(wi, per), chunks)
        return lo, bir.umin(bir.add(lo, per), chunks)

    rpw = -(-per_slice // warps)  # the rows whose copies a warp issues
    cslices = warps if sliced else 1  # copy slices (mbarriers)

    def copy_range(sl: Value) -> tuple[Value, Value]:
        """The chunks of copy slice ``sl``: warp sl's K slice, or the whole row."""
        return k_slice(sl) if sliced else (bir.const(0), chunks)

    def issue(r0: Value, rows: Value, first: Value) -> None:
        """The pass's bulk copies, slice-major: warp w issues those of rows ``[w rpw, +rpw)``
        of the C weight rows (first pass only; rows past N copy row N - 1, never stored) and
        the pass's activation rows (after them), lane ``rpw s + i`` (then ``32 + ..``) slice
        s of row ``w rpw + i``. A warp's copies leave one lane at a time, the lowest first
        (``cp.async.bulk`` takes uniform operands: ptxas loops over the lanes), so the SM's
        copy engine gets every warp's slice-0 copies first, then slice 1, ..: DRAM serves
        them about in that order, warp 0's slice lands first and its MMAs overlap the rest
        of the stream. Thread s < warps arrives on slice s's mbarrier expecting its bytes
        (none for an empty slice). Not ``sliced``: one copy per row (lane i of warp w: row
        ``w rpw + i``), all on mbarrier 0 (thread 0 expects them)."""
        i64v = bir.as_i64
        with bir.when(bir.ult(tid, cslices)):
            nrows = bir.add(rows, bir.select(first, bir.const(cols), bir.const(0)))
            slo, shi = copy_range(tid)
            cpasync.mbarrier_arrive_expect_tx_n(
                bar(tid), bir.as_i32(bir.mul(nrows, bir.mul(bir.sub(shi, slo), 16))))
        for it in range(-(-cslices * rpw // 32)):
            ln = bir.add(lane, 32 * it)
            sl, j = bir.udiv(ln, rpw), bir.add(bir.mul(warp, rpw), bir.urem(ln, rpw))
            lo, hi = copy_range(sl)
            nbytes = bir.as_i32(bir.mul(bir.sub(hi, lo), 16))
            with bir.when(bir.logical_and(bir.logical_and(bir.ult(sl, cslices),
                                                          bir.ult(j, per_slice)),
                                          bir.ult(lo, hi))):
                col = bir.mul(lo, 16)
                with bir.when(bir.logical_and(first, bir.ult(j, cols))):
                    row = bir.add(bir.mul(e, n_count), bir.umin(bir.add(n0, j), n_last))
                    src = arith.addi(cpasync.global_address(w),
                                     i64v(bir.add(bir.mul(row, row_bytes), col)))
                    dst = arith.addi(base, i64v(bir.add(bir.mul(j, stride), col)))
                    cpasync.bulk_copy_n(dst, src, nbytes, bar(sl))
                ja = bir.sub(j, cols)
                with bir.when(bir.logical_and(bir.ule(bir.const(cols), j), bir.ult(ja, rows))):
                    src = arith.addi(cpasync.global_address(a),
                                     i64v(bir.add(bir.mul(bir.add(r0, ja), row_bytes), col)))
                    dst = arith.addi(base, i64v(bir.add(bir.add(bir.mul(ja, stride), a_off),
                                                        col)))
                    cpasync.bulk_copy_n(dst, src, nbytes, bar(sl))

    c_lo, c_hi = k_slice(warp)
    sel = bir.select(bir.eq(bir.urem(t, 2), 0), _i32c(0x5140), _i32c(0x7362)) if nv else None
    t_word = bir.mul(bir.udiv(t, 2) if nv else t, 4)  # this lane's raw word in a chunk

    def word(row_off: Value, q: Value) -> Value:
        """This lane's word of chunk q of the shared row at byte ``row_off``: NVFP4
        ``_pair_pieces``'s word t (bytes 2t, 2t + 1 of both blocks), MXFP4 the raw word t."""
        def ld(off: Value) -> Value:
            v = bir.vector_load(bir.vec(4, bir.i8()), buf, off, alignment=4)
            return vector.extract(vector.bitcast(bir.vec(1, i32), v), [], [0])
        off = bir.add(row_off, bir.add(bir.mul(q, 16), t_word))
        if not nv:
            return ld(off)
        return byte_perm(ld(off), ld(bir.add(off, 8)), sel)

    w_rows = [[bir.mul(bir.add(g, TILE * m + 8 * h), stride) for h in range(2)]
              for m in range(mt)]
    a_rows = [bir.add(bir.mul(bir.add(g, 8 * nt), stride), a_off) for nt in range(nt_max)]

    def weight_scales(q: Value, m: int) -> list[Value]:
        """Chunk q's weight scales of M-tile m, rows g, g + 8 x blocks 2q, 2q + 1 (NVFP4:
        ``[g 2q, g 2q+1, g+8 2q, g+8 2q+1]``) or block q (MXFP4: ``[g, g + 8]``)."""
        mg = bir.add(g, 8 * m)
        if f32_sb:
            v = bir.vector_load(bir.vec(4, f32), sb, bir.add(bir.mul(q, 2 * cols),
                                                             bir.mul(mg, 4)), alignment=16)
            return [bir.extract(v, i) for i in range(4)]
        if nv:
            v = bir.vector_load(bir.vec(2, i16), sb, bir.add(bir.mul(q, cols), bir.mul(mg, 2)),
                                alignment=4)
            return decode_e4m3_word(vector.extract(vector.bitcast(bir.vec(1, i32), v), [], [0]))
        v = bir.vector_load(bir.vec(2, f32), sb, bir.add(bir.mul(q, cols), bir.mul(mg, 2)),
                            alignment=8)
        return [bir.extract(v, i) for i in range(2)]

    def pair(q: Value, accs: list[Value], b_lives: list[Value]) -> list[Value]:
        """Chunk q (units 2q, 2q + 1) folded into ``accs`` (4 per (M-tile, n-tile), n-tiles
        ``len(b_lives)`` fastest; ``b_lives[nt]``: token g + 8 nt is a row of the pass)."""
        accs = list(accs)
        nts = len(b_lives)
        pas: list[Any] = [None] * mt
        sbs: list[Any] = [None] * mt
        for nt, b_live in enumerate(b_lives):
            br = bir.if_(b_live, [i32, i32] if nv else [i32])  # token's word (and |sA|)
            with br.then():
                bw = word(a_rows[nt], q)
                br.yield_(bw, bir.load(sa, bir.add(bir.mul(q, tokens), bir.add(g, 8 * nt)))) \
                    if nv else br.yield_(bw)
            with br.else_():
                br.yield_(*([_i32c(0)] * (2 if nv else 1)))
            pb = fp4_word_to_f16_pairs(br.results[0])
            if nv:  # times f16 |sA| of blocks 2q (pairs 0, 1) and 2q + 1 (pairs 2, 3)
                sw = br.results[1]
                sp = [_f16x2(byte_perm(sw, _i32c(0), s_)) for s_ in (0x1010, 0x3232)]
                pb = [arith.mulf(x, sp[i // 2]) for i, x in enumerate(pb)]
            else:
                sav = bir.vector_load(bir.vec(2, f32), sa, bir.add(
                    bir.mul(q, tokens), bir.add(bir.mul(t, 2), 8 * nt)), alignment=8)
            for m in range(mt):
                if nt == 0:  # (decoded once, used by every n-tile)
                    pas[m] = [fp4_word_to_f16_pairs(word(r, q)) for r in w_rows[m]]
                    sbs[m] = weight_scales(q, m)
                pa, base_ = pas[m], 4 * (m * nts + nt)
                d = [zero] * 4
                for s_ in range(2):
                    afr = [pa[0][2 * s_], pa[1][2 * s_], pa[0][2 * s_ + 1], pa[1][2 * s_ + 1]]
                    bfr = [pb[2 * s_], pb[2 * s_ + 1]]
                    d = list(mma.mma_m16n8k16(afr, bfr, [zero] * 4 if nv or s_ == 0 else d,
                                              input_type="f16"))
                    if nv:  # exact D * |sB| = 2^-28 t sA sB: one rounding
                        for i in range(4):
                            accs[base_ + i] = mmath.fma(d[i], sbs[m][2 * (i >> 1) + s_],
                                                        accs[base_ + i])
                if not nv:  # the portable kernel's ((sA * sB) / 4) * (4 * block sum)
                    for i in range(4):
                        dd = arith.mulf(d[i], bir.const(4 * UNSCALE, f32))
                        s = arith.mulf(arith.mulf(bir.extract(sav, i & 1), sbs[m][i >> 1]),
                                       bir.const(0.25, f32))
                        accs[base_ + i] = mmath.fma(dd, s, accs[base_ + i])
        return accs

    def chunk_loop(rows: Value, nts: int) -> list[Value]:
        """This warp's ``4 mtiles nts`` partials over its chunks, two chunks an
        iteration."""
        b_lives = [bir.ult(bir.add(g, 8 * nt), rows) for nt in range(nts)]
        n2 = bir.mul(bir.udiv(bir.sub(c_hi, c_lo), 2), 2)
        with bir.for_range(c_lo, bir.add(c_lo, n2), 2, carry=[zero] * (4 * mt * nts)) as cl:
            acc = pair(cl.iv, list(cl.carried), b_lives)
            cl.yield_(*pair(bir.add(cl.iv, 1), acc, b_lives))
        br = bir.if_(bir.ult(bir.add(c_lo, n2), c_hi), [f32] * (4 * mt * nts))
        with br.then():
            br.yield_(*pair(bir.sub(c_hi, 1), list(cl.results), b_lives))
        with br.else_():
            br.yield_(*cl.results)
        return list(br.results)

    def slice_sum(rows: Value) -> list[Value]:
        """This warp's ``4 parts`` partials, (M-tile, n-tile) groups of 4 (a pass of <= 8
        rows: the one-n-tile loop, the second n-tiles' partials zero, never stored)."""
        if nt_max == 1:
            return chunk_loop(rows, 1)
        br = bir.if_(bir.ult(bir.const(8), rows), [f32] * (4 * parts))
        with br.then():
            br.yield_(*chunk_loop(rows, 2))
        with br.else_():
            one = chunk_loop(rows, 1)
            br.yield_(*[v for m in range(mt) for v in one[4 * m:4 * m + 4] + [zero] * 4])
        return list(br.results)

    with bir.for_range(start, end, tokens) as pl:
        r0 = pl.iv
        rows = bir.umin(bir.sub(end, r0), tokens)
        first = bir.eq(r0, start)
        parity = bir.as_i32(bir.urem(bir.udiv(bir.sub(r0, start), tokens), 2))
        bir.barrier()  # the mbarriers' init; the previous pass's shared reads are done
        br = bir.if_(first, [i32] * s_iters)  # (the weight scales: once)
        with br.then():
            br.yield_(*load_weight_scales())
        with br.else_():
            br.yield_(*[_i32c(0)] * s_iters)
        awords = load_act_scales(r0, rows)
        issue(r0, rows, first)
        with bir.when(first):
            stage_weight_scales(list(br.results))
        stage_act_scales(awords)
        bir.barrier()  # the scale stores
        cpasync.mbarrier_wait(bar(warp) if sliced else bar(bir.const(0)), parity)
        accs = slice_sum(rows)
        with bir.when(bir.ne(warp, 0)):
            for pi in range(parts):
                bir.vector_store(bir.from_elements(bir.vec(4, f32), accs[4 * pi:4 * pi + 4]),
                                 red, bir.mul(bir.add(bir.mul(bir.sub(warp, 1), 32 * parts),
                                                      bir.add(lane, 32 * pi)), 4),
                                 alignment=16)
        bir.barrier()
        with bir.when(bir.eq(warp, 0)):
            for pi in range(parts):
                m, nt = divmod(pi, nt_max)
                tot = accs[4 * pi:4 * pi + 4]
                for wi in range(warps - 1):  # fixed order: warps 1, 2, ..
                    p = bir.vector_load(bir.vec(4, f32), red, bir.mul(
                        bir.add(lane, 32 * (parts * wi + pi)), 4), alignment=16)
                    tot = [arith.addf(tot[i], bir.extract(p, i)) for i in range(4)]
                if nv:  # exact: the accumulators are 2^-28 times the block sums
                    tot = [arith.mulf(v, bir.const(UNSCALE, f32)) for v in tot]
                for i in range(4):
                    col = bir.add(n0, bir.add(g, TILE * m + 8 * (i >> 1)))
                    tok = bir.add(bir.mul(t, 2), 8 * nt + (i & 1))
                    with bir.when(bir.logical_and(bir.ult(tok, rows), bir.ult(col, n_count))):
                        store(tot[i], bir.add(r0, tok), col)


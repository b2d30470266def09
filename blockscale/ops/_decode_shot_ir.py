"""IR of the "one-shot" decode variants (``variant="mma_shot"`` / ``"mma_shot7k"``, FP4).

Imports MLIR: only :func:`blockscale.ops.matmul_decode.build` imports this module.

Why
---
"mma_c8t" gives a 128-thread CTA 64 weight rows and walks K in dependent 16 KB steps: the
dense M = 1 grid (N = 5760, K = 2944) has 90 CTAs and ~1.4 MB in flight, where the H200 needs
~4-5 MB in flight to stream at copy speed. Here a CTA owns only :data:`COLS` = 16 weight rows
(one MMA M-tile: 360 CTAs for that grid, all resident) and issues *every* byte of its slice
at once: thread ``24 s + r`` copies K slice s (a warp's quarter, below) of weight row r < 16
and thread ``24 s + 16 + j`` that of activation row j of the pass, one ``cp.async.bulk`` each,
slice-major, each slice completing on its own mbarrier (``expect_tx`` of its bytes). The
threads first load the slice's weight scale words and the pass's activation scales with
``ld.global`` (issued before the copies, so that they are not queued behind them), decode them
into shared memory after the copies are issued, and each warp waits on the mbarrier of its own
K slice: issued first, warp 0's slice is served first by DRAM and its MMAs overlap the rest of
the stream. 16 x 1472 bytes of weights per CTA, 360 CTAs: all
8.5 MB of the dense M = 1 problem are requested in the kernel's first microseconds.

Compute
-------
The 4 warps each take a contiguous quarter of the K chunks (16 bytes = 32 FP4 elements = two
``mma.sync.m16n8k16`` units, swap-AB as :mod:`blockscale.ops._decode_mma_ir`: weight rows
are the MMA's M side, tokens the N side) for all 16 rows. A lane's A word of a unit pair is
read from the raw shared row (NVFP4: two 4-byte reads and one ``prmt`` give
:func:`~blockscale.ops._decode_mma_ir._pair_pieces`'s word; MXFP4: the raw word t, a block
being the whole chunk) and decoded by
:func:`~blockscale.ops._decode_mma_ir.fp4_word_to_f16_pairs`; its B word is the same word of
activation row g, decoded the same way (NVFP4: times ``f16(|sA|)`` of the unit's block, as
the "mma" variants' staging does). Folding is "mma"'s: NVFP4 one MMA per block from zero and
``acc = fma(D, |sB|, acc)``, MXFP4 two chained MMAs per block and ``fma(D * 2^30,
(sA * sB) * 0.25, acc)``: every block term is exact, one rounding per block. Passes of
:data:`TOKENS` rows re-read the weights from shared memory (only the activation rows are
copied again).

Reduction (deterministic)
-------------------------
Warps 1..3 store their fp32 partials (4 per lane) to shared memory; warp 0 adds them to its
own in the fixed order ``((p0 + p1) + p2) + p3``, then (NVFP4) times ``2^28`` and the
caller's ``store`` (alpha / expert scale / row scale, cast). An output's K blocks thus go
through J - 4 in-warp roundings plus 3 adds (J - 1, as the sequential chain; the warps'
first terms are exact): the fp32 bound of tests/test_matmul_common.py holds, the bits differ
from the portable kernel's, and they are the same from run to run.

Shared memory (per CTA, ``kcap`` = the variant's largest K)
----------------------------------------------------------
dynamic: 16 weight rows + 8 activation rows of ``kcap / 2 + 16`` bytes (the 16-byte pad makes
the row stride an odd number of 16-byte chunks: the 8 rows x 4 lanes of a fragment read hit
distinct banks) and the 4 mbarriers; static: decoded weight scales (NVFP4 raw E4M3 bytes
``[pair][g][h][block]``, MXFP4 f32 ``[block][g][h]``), activation scales (NVFP4 f16 pairs
``[pair][token]``, MXFP4 f32 ``[block][token]``) and the 3 warps' partials. "mma_shot"
(kcap 3072): 37.3 KB + 10.8 KB (MXFP4; 7.7 KB NVFP4): 4 CTAs per SM; "mma_shot7k" (kcap 7168:
DeepSeek-V3): 86.4 KB + 25 KB: 2 CTAs per SM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlir import ir
from mlir.dialects import arith, vector
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
    _align_attributions,
    _f16x2,
    _Fmt,
    _i32c,
    decode_e4m3_word,
    fp4_word_to_f16_pairs,
)
from blockscale.ops._mma_ir import workgroup_buffer
from blockscale.ops.matmul_decode import shot_dynamic_bytes, shot_row_stride

Value = ir.Value

WARPS = 4
THREADS = 32 * WARPS
#: weight rows (output columns) per CTA: one MMA M-tile
COLS = 16
#: group rows (tokens) per pass: one MMA n-tile
TOKENS = 8
#: warps whose partials go through shared memory (warp 0 adds them)
RED_WARPS = WARPS - 1


def check_kcap(kcap: int) -> None:
    """ValueError unless ``kcap`` is a positive multiple of 128 (whole 5-D scale words)."""
    if kcap <= 0 or kcap % 128:
        raise ValueError(f"kcap must be a positive multiple of 128, got {kcap}")


def emit_decode_shot(kb: Any, fmt: Format, *, start: Value, end: Value, expert: Value,
                     n_count: Value, k: Value, a_srow: Callable[[Value], Value],
                     store: Callable[[Value, Value, Value], None], kcap: int) -> None:
    """The body for one (group, 16-column slice) (the interface of
    :func:`blockscale.ops._decode_ir.emit_decode`; a CTA of :data:`THREADS` threads computes
    columns ``[16 block_idx.x, +16)`` of rows ``[start, end)``); ``k`` must be <= ``kcap``
    (the host checks: the shared rows hold ``kcap / 2`` bytes) and a multiple of 32."""
    check_kcap(kcap)
    lay = _Fmt(fmt)
    nv = lay.nv
    f32, i32, i16, i64 = bir.f32(), bir.i32(), bir.i16(), bir.i64()
    stride = shot_row_stride(kcap)
    pairs_cap = kcap // 32  # 16-byte chunks (unit pairs) of a row
    d1_cap = -(-kcap // (4 * fmt.block_size))  # 5-D scale words of a row
    a_off = COLS * stride  # the activation rows' byte offset
    buf = tma.extern_shared_buffer(kb, shot_dynamic_bytes(kcap), align=128)
    base = W.shared_address(buf)
    bars = arith.addi(base, bir.const((COLS + TOKENS) * stride, i64))

    def bar(w: Value) -> Value:
        """The shared address of warp ``w``'s mbarrier (its K slice's copies)."""
        return arith.addi(bars, bir.as_i64(bir.mul(w, 8)))

    # weight scales: NVFP4 raw E4M3 [pair][g][h][block 2q + s] (i16 per (pair, g, h)); MXFP4
    # f32 [block][g][h]
    sb = workgroup_buffer(kb, pairs_cap * COLS, i16 if nv else f32)
    # activation scales: NVFP4 f16 pairs (blocks 2q, 2q + 1) [pair][token]; MXFP4 f32
    # [block][token]
    sa = workgroup_buffer(kb, pairs_cap * TOKENS, i32 if nv else f32)
    red = workgroup_buffer(kb, RED_WARPS * 32 * 4, f32)
    a, w, sfa, sfb = (kb.arg(x) for x in ("a", "w" if "w" in kb.values else "b", "sfa", "sfb"))

    tid = bir.thread_idx("x")
    lane, warp = bir.urem(tid, 32), bir.udiv(tid, 32)
    g, t = bir.udiv(lane, 4), bir.urem(lane, 4)
    row_bytes = bir.udiv(k, 2)
    chunks = bir.udiv(row_bytes, 16)
    kblocks = bir.ceil_div(k, fmt.block_size)
    d1 = bir.ceil_div(kblocks, 4)
    n0 = bir.mul(bir.block_idx("x"), COLS)
    n_last = bir.sub(n_count, 1)
    e = bir.as_index(expert)
    zero = bir.const(0.0, f32)
    rb_i32 = bir.as_i32(row_bytes)

    with bir.when(bir.ult(tid, WARPS)):
        cpasync.mbarrier_init(bar(tid), 1)
        tma.fence_mbarrier_init()

    # ---- the weight scale words of the slice (issued before the copies: they arrive first)
    s_iters = -(-COLS * d1_cap // THREADS)
    b_srow0 = bir.mul(bir.mul(e, bir.ceil_div(n_count, SF_ATOM_ROWS)), SF_ATOM_ROWS)

    def slots(it: int, n: int) -> tuple[Value, Value]:
        """(row, word) of load ``it`` of this thread over ``n`` rows: ``idx % n``,
        ``idx // n``."""
        idx = bir.add(tid, it * THREADS)
        return bir.urem(idx, n), bir.udiv(idx, n)

    def load_weight_scales() -> list[Value]:
        """This thread's scale words: rows :func:`slots` (5-D padding rows past N: in
        bounds, never stored), words < d1 (else 0)."""
        out = []
        for it in range(s_iters):
            r, q = slots(it, COLS)
            br = bir.if_(bir.ult(q, d1), [i32])
            with br.then():
                off = bir.add(mir.tcgen_row_offset(bir.add(b_srow0, bir.add(n0, r)), d1),
                              bir.mul(q, SF_ATOM_BYTES))
                v = bir.vector_load(bir.vec(4, bir.i8()), sfb, off, alignment=4)
                br.yield_(vector.extract(vector.bitcast(bir.vec(1, i32), v), [], [0]))
            with br.else_():
                br.yield_(_i32c(0))
            out.append(br.results[0])
        return out

    def stage_weight_scales(words: list[Value]) -> None:
        for it, word in enumerate(words):
            r, q = slots(it, COLS)
            gg, hh = bir.urem(r, 8), bir.udiv(r, 8)
            with bir.when(bir.ult(q, d1)):
                if nv:  # blocks 4q .. 4q + 3 = pairs 2q (bytes 0, 1), 2q + 1 (bytes 2, 3)
                    for j in range(2):
                        half = arith.trunci(i16, bir.shru(word, _i32c(16 * j)) if j else word)
                        dst = bir.add(bir.mul(bir.add(bir.mul(q, 2), j), COLS),
                                      bir.add(bir.mul(gg, 2), hh))
                        bir.store(half, sb, dst)
                else:  # blocks 4q + i
                    for i in range(4):
                        v = _decode_scale_fast(fmt, bir.bit_and(bir.shru(word, _i32c(8 * i)),
                                                                0xFF))
                        dst = bir.add(bir.mul(bir.add(bir.mul(q, 4), i), COLS),
                                      bir.add(bir.mul(gg, 2), hh))
                        bir.store(v, sb, dst)

    a_iters = -(-TOKENS * d1_cap // THREADS)

    def load_act_scales(r0: Value, rows: Value) -> list[Value]:
        """This thread's activation scale words of the pass (tokens :func:`slots`)."""
        out = []
        for it in range(a_iters):
            n, q = slots(it, TOKENS)
            br = bir.if_(bir.logical_and(bir.ult(q, d1), bir.ult(n, rows)), [i32])
            with br.then():
                off = bir.add(mir.tcgen_row_offset(a_srow(bir.add(r0, n)), d1),
                              bir.mul(q, SF_ATOM_BYTES))
                v = bir.vector_load(bir.vec(4, bir.i8()), sfa, off, alignment=4)
                br.yield_(vector.extract(vector.bitcast(bir.vec(1, i32), v), [], [0]))
            with br.else_():  # (rows past the pass: zeros, read only by unstored columns)
                br.yield_(_i32c(0))
            out.append(br.results[0])
        return out

    def stage_act_scales(words: list[Value]) -> None:
        for it, word in enumerate(words):
            n, q = slots(it, TOKENS)
            with bir.when(bir.ult(q, d1)):
                if nv:  # |sA| as f16 (exact), pairs 2q, 2q + 1
                    svs = [arith.truncf(bir.f16(), x) for x in decode_e4m3_word(word)]
                    for j in range(2):
                        pr = bir.from_elements(bir.vec(2, bir.f16()), svs[2 * j:2 * j + 2])
                        bir.store(mma.pack_i32(pr), sa,
                                  bir.add(bir.mul(bir.add(bir.mul(q, 2), j), TOKENS), n))
                else:
                    for i in range(4):
                        v = mir.decode_scale(fmt, bir.bit_and(bir.shru(word, _i32c(8 * i)),
                                                              0xFF))
                        bir.store(v, sa, bir.add(bir.mul(bir.add(bir.mul(q, 4), i), TOKENS),
                                                 n))

    per = bir.ceil_div(chunks, WARPS)  # a warp's K slice: chunks [c_lo, c_hi)

    def k_slice(wi: Value) -> tuple[Value, Value]:
        lo = bir.umin(bir.mul(wi, per), chunks)
        return lo, bir.umin(bir.add(lo, per), chunks)

    def issue(r0: Value, rows: Value, first: Value) -> None:
        """The pass's bulk copies, slice-major (DRAM serves them about in issue order: warp
        0's slice lands first and its MMAs start while the rest streams in): thread
        ``24 s + j`` copies slice s of weight row j < 16 (first pass only; rows past N copy
        row N - 1, never stored) or of activation row ``r0 + j - 16`` (j - 16 < rows); thread
        s < 4 arrives on slice s's mbarrier expecting their bytes (none for an empty
        slice)."""
        i64v = bir.as_i64
        lo, hi = k_slice(bir.udiv(tid, COLS + TOKENS))
        nbytes = bir.mul(bir.sub(hi, lo), 16)
        with bir.when(bir.ult(tid, WARPS)):
            nrows = bir.add(rows, bir.select(first, bir.const(COLS), bir.const(0)))
            slo, shi = k_slice(tid)
            cpasync.mbarrier_arrive_expect_tx_n(
                bar(tid), bir.as_i32(bir.mul(nrows, bir.mul(bir.sub(shi, slo), 16))))
        j = bir.urem(tid, COLS + TOKENS)
        live = bir.logical_and(bir.ult(tid, WARPS * (COLS + TOKENS)), bir.ult(lo, hi))
        with bir.when(live):
            sl = bir.udiv(tid, COLS + TOKENS)
            col = bir.mul(lo, 16)
            with bir.when(bir.logical_and(first, bir.ult(j, COLS))):
                row = bir.add(bir.mul(e, n_count), bir.umin(bir.add(n0, j), n_last))
                src = arith.addi(cpasync.global_address(w),
                                 i64v(bir.add(bir.mul(row, row_bytes), col)))
                dst = arith.addi(base, i64v(bir.add(bir.mul(j, stride), col)))
                cpasync.bulk_copy_n(dst, src, bir.as_i32(nbytes), bar(sl))
            ja = bir.sub(j, COLS)
            with bir.when(bir.logical_and(bir.ule(bir.const(COLS), j), bir.ult(ja, rows))):
                src = arith.addi(cpasync.global_address(a),
                                 i64v(bir.add(bir.mul(bir.add(r0, ja), row_bytes), col)))
                dst = arith.addi(base, i64v(bir.add(bir.add(bir.mul(ja, stride), a_off), col)))
                cpasync.bulk_copy_n(dst, src, bir.as_i32(nbytes), bar(sl))

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

    w_rows = [bir.mul(bir.add(g, 8 * h), stride) for h in range(2)]
    a_row = bir.add(bir.mul(g, stride), a_off)

    def pair(q: Value, accs: list[Value], b_live: Value) -> list[Value]:
        """Chunk q (units 2q, 2q + 1) folded into ``accs``."""
        accs = list(accs)
        pa = [fp4_word_to_f16_pairs(word(r, q)) for r in w_rows]
        br = bir.if_(b_live, [i32, i32] if nv else [i32])  # token g's word (and |sA| pair)
        with br.then():
            bw = word(a_row, q)
            br.yield_(bw, bir.load(sa, bir.add(bir.mul(q, TOKENS), g))) if nv else \
                br.yield_(bw)
        with br.else_():
            br.yield_(*([_i32c(0)] * (2 if nv else 1)))
        pb = fp4_word_to_f16_pairs(br.results[0])
        if nv:  # times f16 |sA| of blocks 2q (pairs 0, 1) and 2q + 1 (pairs 2, 3)
            sw = br.results[1]
            sp = [_f16x2(byte_perm(sw, _i32c(0), s_)) for s_ in (0x1010, 0x3232)]
            pb = [arith.mulf(x, sp[i // 2]) for i, x in enumerate(pb)]
            sbw = bir.vector_load(bir.vec(2, i16), sb, bir.add(bir.mul(q, COLS), bir.mul(g, 2)),
                                  alignment=4)
            dec = decode_e4m3_word(vector.extract(vector.bitcast(bir.vec(1, i32), sbw), [], [0]))
        else:
            sbv = bir.vector_load(bir.vec(2, f32), sb, bir.add(bir.mul(q, COLS), bir.mul(g, 2)),
                                  alignment=8)
            sav = bir.vector_load(bir.vec(2, f32), sa, bir.add(bir.mul(q, TOKENS), bir.mul(t, 2)),
                                  alignment=8)
        d = [zero] * 4
        for s_ in range(2):
            afr = [pa[0][2 * s_], pa[1][2 * s_], pa[0][2 * s_ + 1], pa[1][2 * s_ + 1]]
            bfr = [pb[2 * s_], pb[2 * s_ + 1]]
            d = list(mma.mma_m16n8k16(afr, bfr, [zero] * 4 if nv or s_ == 0 else d,
                                      input_type="f16"))
            if nv:  # exact D * |sB| = 2^-28 t sA sB: one rounding
                for i in range(4):
                    accs[i] = mmath.fma(d[i], dec[2 * (i >> 1) + s_], accs[i])
        if not nv:  # the portable kernel's ((sA * sB) / 4) * (4 * block sum)
            for i in range(4):
                dd = arith.mulf(d[i], bir.const(4 * UNSCALE, f32))
                s = arith.mulf(arith.mulf(bir.extract(sav, i & 1), bir.extract(sbv, i >> 1)),
                               bir.const(0.25, f32))
                accs[i] = mmath.fma(dd, s, accs[i])
        return accs

    def slice_sum(rows: Value) -> list[Value]:
        """This warp's 4 partials over its chunks, two chunks an iteration."""
        b_live = bir.ult(g, rows)
        n2 = bir.mul(bir.udiv(bir.sub(c_hi, c_lo), 2), 2)
        with bir.for_range(c_lo, bir.add(c_lo, n2), 2, carry=[zero] * 4) as cl:
            acc = pair(cl.iv, list(cl.carried), b_live)
            cl.yield_(*pair(bir.add(cl.iv, 1), acc, b_live))
        br = bir.if_(bir.ult(bir.add(c_lo, n2), c_hi), [f32] * 4)
        with br.then():
            br.yield_(*pair(bir.sub(c_hi, 1), list(cl.results), b_live))
        with br.else_():
            br.yield_(*cl.results)
        return list(br.results)

    with bir.for_range(start, end, TOKENS) as pl:
        r0 = pl.iv
        rows = bir.umin(bir.sub(end, r0), TOKENS)
        first = bir.eq(r0, start)
        parity = bir.as_i32(bir.urem(bir.udiv(bir.sub(r0, start), TOKENS), 2))
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
        cpasync.mbarrier_wait(bar(warp), parity)  # this warp's K slice
        accs = slice_sum(rows)
        with bir.when(bir.ne(warp, 0)):
            bir.vector_store(bir.from_elements(bir.vec(4, f32), accs), red,
                             bir.mul(bir.add(bir.mul(bir.sub(warp, 1), 32), lane), 4),
                             alignment=16)
        bir.barrier()
        with bir.when(bir.eq(warp, 0)):
            tot = list(accs)
            for wi in range(RED_WARPS):  # fixed order: warps 1, 2, 3
                p = bir.vector_load(bir.vec(4, f32), red, bir.mul(bir.add(lane, 32 * wi), 4),
                                    alignment=16)
                tot = [arith.addf(tot[i], bir.extract(p, i)) for i in range(4)]
            if nv:  # exact: the accumulators are 2^-28 times the block sums
                tot = [arith.mulf(v, bir.const(UNSCALE, f32)) for v in tot]
            for i in range(4):
                col = bir.add(n0, bir.add(g, 8 * (i >> 1)))
                tok = bir.add(bir.mul(t, 2), i & 1)
                with bir.when(bir.logical_and(bir.ult(tok, rows), bir.ult(col, n_count))):
                    store(tot[i], bir.add(r0, tok), col)
    _align_attributions(kb, 16)


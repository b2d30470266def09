"""IR of the decode kernel's block-diagonal step for passes of one row ("mma_c8t1", NVFP4).

Imports MLIR: only :mod:`blockscale.ops._decode_mma_ir` imports this module.

Why
---
In "mma_c8t" (:mod:`blockscale.ops._decode_mma_ir`) every ``mma.sync.m16n8k16`` covers one
NVFP4 block of 16 weight rows against the pass's rows (the N side) and is folded at once,
one FFMA per accumulator: 128 FFMAs a warp and step of 809 SASS instructions (run CZ: the
MoE decode issues on 63 % of scheduler cycles). With one row (a decode step of one token:
every group of the grid holds one row), 7 of the 8 B columns and of each lane's folds are idle.

Here the N side holds eight blocks instead: column ``n`` of the B fragment holds the row's
activations of block ``n`` of a *set* of 8 blocks at the K slots that carry that block's
weights, zeros elsewhere (block-diagonal). Eight chained MMAs give ``D[r][n]``, the exact
sum of block ``n`` of weight row ``r`` (2 codes of each block an MMA), folded by one FFMA per
accumulator and set: 16 FFMAs a step instead of 128. The weights are staged raw (no
:func:`~blockscale.ops._decode_mma_ir._pair_pieces` PRMTs) in rows of :data:`W_STRIDE` bytes
(conflict-free ``LDS.64``), each lane reading whole blocks. Step loop: 671 SASS instructions
against 809, 128 registers, no spill (a kernel holding this pass and "mma_c8t"'s spilled
108-140 bytes around them, and ran 15 % slower than "mma_c8t" at T = 128: so this kernel
runs every row as a pass of its own, and the dispatch picks it per grid).

K slots (the same for both operands)
-----------------------------------
Lane ``(g, t)`` holds in ``a[0]`` / ``a[1]`` (rows g / g + 8, slots 2t, 2t + 1) block ``t``
of the set and in ``a[2]`` / ``a[3]`` (slots 2t + 8, 2t + 9) block ``t + 4``; MMA ``h``
(0..7) takes pair ``h % 4`` (codes j, j + 4,
:func:`~blockscale.ops._decode_mma_ir.fp4_word_to_f16_pairs`) of the block's word ``h // 4``.
B column n is then nonzero in ``b[0]`` of lane ``(n, n)`` (n < 4) and in ``b[1]`` of lane
``(n, n - 4)`` (n >= 4): slot n of a set (16 words: ``b[0]``, ``b[1]`` of each MMA, a
register pair as the MMA takes it; 16-byte chunks rotated by ``n // 2``) holds the
activation pairs and zeros; every other lane reads 16 zero bytes on banks apart from its
quarter warp's two diagonal lanes (sets 176 words apart: the stores are conflict-free too).
The D fragment of lane (g, t) is rows g / g + 8 x columns 2t, 2t + 1: blocks ``2p``,
``2p + 1`` with ``p = 4 set + t``, one ``LDS.128`` of the staged weight scales (the "cf8"
layout with block pairs :data:`SCALE_PAIR_WORDS` apart).

Numerics
--------
The activations are staged as in "mma_c8t" (``f16(dec(a) 2^-14) * f16(|sA|)``, exact): the
products of a column are exact multiples of one quantum and the chained sums stay below 2^18
of it, so ``D`` is the exact block sum (times ``2^-28 sA``), as one MMA from zero gives it;
``acc = fma(D, |sB|, acc)`` rounds once a block. A lane sums the blocks ``2p``, ``2p + 1`` of
each set (its columns) in K order; a row's total is ``(s0 + s1) + (s2 + s3)`` over the four
lanes of the row, ``s_t = acc_t,even + acc_t,odd``, then times 2^28: within the fp32 bound of
tests/test_matmul_common.py, the same bits run to run, not the portable kernel's.

Measured (H200, runs DE-DF, bench_moe's rotated routings, NVFP4 gate_up): T = 1 gpt-oss
0.0204-0.0205 ms against "mma_c8t" 0.0212-0.0214 (-4 %), DeepSeek-V3 0.0468-0.0470 against
0.0495-0.0499 (-6 %). Predicted from the instruction count -15-20 %: ncu (run DD) shows the
decode waiting on its global loads (long scoreboard, one step in flight a CTA) as much as
on issue. At T = 16 / 128 (groups of 2+ rows) one launch each for the two kernels was
within +-3 % of "mma_c8t" alone (run DF): not kept.
"""

from __future__ import annotations

from collections.abc import Callable

from mlir import ir
from mlir.dialects import arith, vector
from mlir.dialects import math as mmath

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import mma
from blockscale.compiler.arch.nvvm import shfl_xor

Value = ir.Value

#: NVFP4 blocks of a set (the N side of one chained MMA group)
SET_BLOCKS = 8
#: padded shared row of raw staged weights: lanes (g, t) of a half warp read 8 bytes at
#: ``72 g + 2 t`` words, distinct banks
W_STRIDE = 256 + 32
#: words of a set's B slot (b[0], b[1] of each of the 8 MMAs) and slots a set (8 blocks +
#: the zero slot)
SLOT_WORDS = 16
#: words a set: 8 slots, then 32 zero words (the other lanes' reads); 176 = 16 mod 32 words:
#: the stores of blocks n of sets 2 j and 2 j + 1 (one quarter warp) hit distinct banks
SET_WORDS = 176
ZERO_SLOT = SET_BLOCKS * SLOT_WORDS
#: words between the staged NVFP4 weight scales of block pairs p and p + 1 (the "cf8"
#: layout's 128 plus 8: lanes t read pairs 4 s + t on distinct banks)
SCALE_PAIR_WORDS = 136


def b_words(sets: int) -> int:
    """Words of the block-diagonal B buffer for ``sets`` sets a step."""
    return sets * SET_WORDS


def stage_act(bsm: Value, c: Value, chunk: Value, sp: list[Value],
              pairs: Callable[[Value], list[Value]]) -> None:
    """Activation chunk c of the step (blocks 2c, 2c + 1; ``sp``: their |sA| as f16
    splats) into the B slots: block b's 8 pairs into slot ``b % 8`` of set ``b // 8``, pair
    h at word ``2 h + (b % 8 >= 4)`` (``b[0]`` / ``b[1]`` of MMA h), zeros at the others."""
    words = vector.bitcast(bir.vec(4, bir.i32()), chunk)
    for s_ in range(2):
        b = bir.add(bir.mul(c, 2), s_)
        n = bir.urem(b, SET_BLOCKS)
        prs = [mma.pack_i32(arith.mulf(x, sp[s_]))
               for w in range(2) for x in pairs(bir.extract(words, 2 * s_ + w))]
        hi, nil = bir.ult(bir.const(3), n), bir.i32_bits(0)
        words_ = [v for p in prs for v in (bir.select(hi, nil, p), bir.select(hi, p, nil))]
        dst = bir.add(bir.mul(bir.udiv(b, SET_BLOCKS), SET_WORDS), bir.mul(n, SLOT_WORDS))
        for i in range(4):
            bir.vector_store(bir.from_elements(bir.vec(4, bir.i32()), words_[4 * i:4 * i + 4]),
                             bsm, bir.add(dst, _chunk_pos(i, n)), alignment=16)


def compute(accs: list[Value], *, sets: int, wsm: Value, bsm: Value, sbsm: Value,
            warp: Value, g: Value, t: Value, pairs: Callable[[Value], list[Value]],
            live: Value | None = None) -> list[Value]:
    """One step of a one-row pass: ``sets`` sets of 8 chained MMAs, each folded into the 4
    accumulators (rows g / g + 8 x the lane's two blocks of the set); ``live`` (the peeled
    last step): sets past it (past the row end) skipped by uniform branches. A set's words
    are decoded half by half (MMAs 0-3 take word 0 of each block, 4-7 word 1): 16 live f16
    pairs, not 32."""
    f32, i32 = bir.f32(), bir.i32()
    zero = bir.const(0.0, f32)
    rows = [bir.add(bir.mul(warp, 16), bir.add(g, 8 * h)) for h in range(2)]
    bases = b_read_bases(g, t)

    def one(s: int, accs: list[Value]) -> list[Value]:
        sbv = bir.vector_load(bir.vec(4, f32), sbsm, bir.add(
            bir.mul(warp, 32), bir.add(bir.mul(g, 4), bir.mul(bir.add(t, 4 * s),
                                                            SCALE_PAIR_WORDS))),
            alignment=16)
        raw = []  # raw[blk][row]: the 2 words of block t (blk 0) / t + 4 (blk 1) of the row
        for blk in range(2):
            col = bir.mul(bir.add(t, SET_BLOCKS * s + 4 * blk), 8)
            raw.append([vector.bitcast(bir.vec(2, i32), bir.vector_load(
                bir.vec(8, bir.i8()), wsm, bir.add(bir.mul(r, W_STRIDE), col), alignment=8))
                for r in rows])
        d = [zero] * 4
        for w in range(2):
            a = [[pairs(bir.extract(raw[blk][h], w)) for h in range(2)] for blk in range(2)]
            bw = []
            for i in (2 * w, 2 * w + 1):  # b[0], b[1] of MMAs 4 w .. 4 w + 3
                v = bir.vector_load(bir.vec(4, i32), bsm, bir.add(bases[i], s * SET_WORDS),
                                    alignment=16)
                bw += [bir.extract(v, j) for j in range(4)]
            for j in range(4):
                afr = [a[0][0][j], a[0][1][j], a[1][0][j], a[1][1][j]]
                bfr = [_f16x2(bw[2 * j]), _f16x2(bw[2 * j + 1])]
                d = list(mma.mma_m16n8k16(afr, bfr, d, input_type="f16"))
        sb = [bir.extract(sbv, i) for i in range(4)]
        return [mmath.fma(d[i], sb[i], accs[i]) for i in range(4)]

    accs = list(accs)
    for s in range(sets):
        if live is None or s == 0:
            accs = one(s, accs)
            continue
        br = bir.if_(bir.ult(bir.const(s), live), [f32] * 4)
        with br.then():
            br.yield_(*one(s, accs))
        with br.else_():
            br.yield_(*accs)
        accs = list(br.results)
    return accs


def _chunk_pos(i: int | Value, n: Value) -> Value:
    """Word offset in a B slot of its 16-byte chunk ``i`` (MMAs 2i, 2i + 1) for block n:
    rotated by ``n // 2`` so that the quarter warp's stores and reads hit distinct banks."""
    return bir.mul(bir.urem(bir.add(bir.udiv(n, 2), i), 4), 4)


def b_read_bases(g: Value, t: Value) -> list[Value]:
    """Lane (g, t)'s word offsets (in set 0) of its B chunks i = 0..3: slot g's rotated
    chunk on the diagonal lanes, else 16 bytes of the zero region on banks apart from the
    two diagonal lanes' of its quarter warp."""
    diag = arith.ori(bir.eq(g, t), bir.eq(g, bir.add(t, 4)))
    out = []
    for i in range(4):
        on = bir.add(bir.mul(g, SLOT_WORDS), _chunk_pos(i, g))
        off = bir.add(ZERO_SLOT, bir.mul(bir.urem(bir.add(bir.udiv(g, 2), i + 2), 8), 4))
        out.append(bir.select(diag, on, off))
    return out


def row_totals(accs: list[Value]) -> list[Value]:
    """The pass's sums for rows g, g + 8 (every lane of the row's quad gets the same
    value): ``s_t = acc[2h] + acc[2h + 1]``, then ``(s0 + s1) + (s2 + s3)``."""
    out = []
    for h in range(2):
        s = arith.addf(accs[2 * h], accs[2 * h + 1])
        for m in (1, 2):
            s = arith.addf(s, shfl_xor(s, m))
        out.append(s)
    return out


def _f16x2(r: Value) -> Value:
    return vector.bitcast(bir.vec(2, bir.f16()),
                          vector.from_elements(bir.vec(1, bir.i32()), [r]))


__all__ = ["SET_BLOCKS", "W_STRIDE", "b_words", "compute", "row_totals", "stage_act"]

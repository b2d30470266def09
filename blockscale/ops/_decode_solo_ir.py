"""IR of the decode kernel's block-diagonal step for passes of one row ("mma_c8t1", FP4).

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
accumulator and set: 16 FFMAs a step instead of 128 (MXFP4: 32-code blocks, 16 chained MMAs
a set, 8 FFMAs and 24 FMULs of the ``(sA sB) / 4`` fold instead of 64 + 128). The weights are
staged raw (no :func:`~blockscale.ops._decode_mma_ir._pair_pieces` PRMTs) in padded rows
(:class:`Layout`: conflict-free ``LDS.64`` / ``LDS.128``), each lane reading whole blocks.
Step loop: 669 (NVFP4) / 671 (MXFP4) SASS instructions against "mma_c8t"'s 809 / 921, 128
registers, no spill (a kernel holding this pass and "mma_c8t"'s spilled 108-140 bytes
around them and ran 15 % slower than "mma_c8t" at T = 128: so this kernel runs every row
as a pass of its own, and the dispatch picks it per grid).

K slots (the same for both operands)
-----------------------------------
Lane ``(g, t)`` holds in ``a[0]`` / ``a[1]`` (rows g / g + 8, slots 2t, 2t + 1) block ``t``
of the set and in ``a[2]`` / ``a[3]`` (slots 2t + 8, 2t + 9) block ``t + 4``; MMA ``h``
(0..7; MXFP4 0..15) takes pair ``h % 4`` (codes j, j + 4,
:func:`~blockscale.ops._decode_mma_ir.fp4_word_to_f16_pairs`) of the block's word ``h // 4``.
B column n is then nonzero in ``b[0]`` of lane ``(n, n)`` (n < 4) and in ``b[1]`` of lane
``(n, n - 4)`` (n >= 4): slot n of a set (``b[0]``, ``b[1]`` of each MMA, a register pair
as the MMA takes it; 16-byte chunks rotated by ``n // 2`` / ``n``) holds the
activation pairs and zeros; every other lane reads 16 zero bytes on banks apart from its
quarter warp's two diagonal lanes (the stores are conflict-free too). The D fragment of lane
(g, t) is rows g / g + 8 x columns 2t, 2t + 1: blocks ``8 set + 2t``, ``+ 1``, their staged
weight scales in one ``LDS.128`` (NVFP4: the "cf8" layout with block pairs
:data:`SCALE_PAIR_WORDS` apart) or two ``LDS.64`` (MXFP4: blocks :data:`SCALE_BLOCK_WORDS`
apart) and, MXFP4, the row's E8M0 activation scales of the two blocks.

Numerics
--------
The activations are staged as in "mma_c8t" (``f16(dec(a) 2^-14) * f16(|sA|)``, exact): the
products of a column are exact multiples of one quantum and the chained sums stay below 2^18
of it, so ``D`` is the exact block sum (times ``2^-28 sA``), as one MMA from zero gives it;
``acc = fma(D, |sB|, acc)`` rounds once a block (MXFP4: activations ``dec(a) 2^-14``, 32
products a column, ``acc = fma(D 2^30, (sA sB) / 4, acc)`` as the portable kernel forms it).
A lane sums the blocks of its two columns of each set in K order; a row's total is ``(s0 +
s1) + (s2 + s3)`` over the four lanes of the row, ``s_t = acc_t,even + acc_t,odd`` (NVFP4
then times 2^28): within the fp32 bound of tests/test_matmul_common.py, the same bits run
to run, not the portable kernel's.

Measured (H200, runs DE-DH, bench_moe's rotated routings, gate_up): T = 1 NVFP4 gpt-oss
0.0204-0.0210 ms against "mma_c8t" 0.0212-0.0220 (-4-7 %), DeepSeek-V3 0.0468-0.0471
against 0.0495-0.0504 (-6-7 %); MXFP4 (run DH) gpt-oss 0.0207 against 0.0216, DeepSeek-V3
0.0465 against 0.0503 (-4 / -7 %). Predicted from the instruction count: -15-20 %; ncu (run
DD) shows the decode waiting on its global loads (long scoreboard, one step in flight a
CTA) as much as on issue. At T = 16 / 128 (groups of 2+ rows) one launch each for the two
kernels was within +-3 % of "mma_c8t" alone (run DF): not kept.
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

#: blocks of a set (the N side of one chained MMA group)
SET_BLOCKS = 8
#: words between the staged NVFP4 weight scales of block pairs p and p + 1 (the "cf8"
#: layout's 128 plus 8: lanes t read pairs 4 s + t on distinct banks); MXFP4: between
#: blocks (64 plus 2: lanes t read blocks 8 s + 2 t + j on distinct banks)
SCALE_PAIR_WORDS = 136
SCALE_BLOCK_WORDS = 66


class Layout:
    """The shared layouts of one format's one-row step (NVFP4: 8-byte blocks, 4 sets a
    256-byte step, 8 MMAs a set; MXFP4: 16-byte blocks, 2 sets, 16 MMAs).

    Attributes:
        mx: MXFP4 (E8M0 scales folded per block after the MMAs; the activations unscaled).
        blk_bytes / sets / mmas: block bytes, sets a step, chained MMAs a set.
        w_stride: padded shared row of raw staged weights (NVFP4 288 bytes, MXFP4 320: a
            quarter warp's 8- / 16-byte block reads on distinct banks).
        slot_words / set_words / zero_slot: a B slot (b[0], b[1] of each MMA), a set (8
            slots, then 32 zero words the other lanes read; NVFP4 sets 176 words apart: 16
            mod 32, so one quarter warp's stores to two sets hit distinct banks).
    """

    def __init__(self, mx: bool):
        self.mx = mx
        self.blk_bytes = 16 if mx else 8
        self.sets = 256 // (SET_BLOCKS * self.blk_bytes)
        self.mmas = self.blk_bytes  # (2 codes of a block an MMA: blk_bytes * 2 / 2)
        self.w_stride = 256 + (64 if mx else 32)
        self.slot_words = 2 * self.mmas
        self.chunks = self.slot_words // 4  # 16-byte chunks of a slot (2 MMAs each)
        self.zero_slot = SET_BLOCKS * self.slot_words
        self.set_words = self.zero_slot + 32 + (0 if mx else 16)

    @property
    def b_words(self) -> int:
        """Words of the block-diagonal B buffer (a step's sets)."""
        return self.sets * self.set_words

    def _rot(self, n: Value) -> Value:
        """Block n's chunk rotation: ``n // 2`` (NVFP4: a thread stages blocks 2c, 2c + 1)
        / ``n`` (MXFP4)."""
        return bir.udiv(n, 2) if not self.mx else n

    def chunk_pos(self, i: int | Value, n: Value) -> Value:
        """Word offset in block n's slot of its chunk ``i`` (MMAs 2i, 2i + 1), rotated
        (:meth:`_rot`) so that a quarter warp's stores and reads hit distinct banks."""
        return bir.mul(bir.urem(bir.add(self._rot(n), i), self.chunks), 4)

    def read_bases(self, g: Value, t: Value) -> list[Value]:
        """Lane (g, t)'s word offsets (in set 0) of its B chunks: slot g's rotated chunk on
        the diagonal lanes, else 16 zero bytes on banks apart from the two diagonal lanes'
        of its quarter warp."""
        diag = arith.ori(bir.eq(g, t), bir.eq(g, bir.add(t, 4)))
        rot = self._rot(bir.sub(g, bir.urem(g, 2)))  # (the quarter warp's first row)
        out = []
        for i in range(self.chunks):
            on = bir.add(bir.mul(g, self.slot_words), self.chunk_pos(i, g))
            off = bir.add(self.zero_slot, bir.mul(bir.urem(bir.add(rot, i + 2), 8), 4))
            out.append(bir.select(diag, on, off))
        return out


def stage_act(lay: Layout, bsm: Value, c: Value, chunk: Value, sp: list[Value] | None,
              pairs: Callable[[Value], list[Value]]) -> None:
    """Activation chunk c of the step (NVFP4: blocks 2c, 2c + 1, ``sp`` their |sA| as f16
    splats; MXFP4: block c, ``sp`` None) into the B slots: block b's pairs into slot ``b %
    8`` of set ``b // 8``, pair h at word ``2 h + (b % 8 >= 4)`` (``b[0]`` / ``b[1]`` of MMA
    h, chunks rotated), zeros at the others."""
    words = vector.bitcast(bir.vec(4, bir.i32()), chunk)
    per = 16 // lay.blk_bytes  # blocks a chunk
    wpb = lay.blk_bytes // 4  # words a block
    for s_ in range(per):
        b = bir.add(bir.mul(c, per), s_)
        n = bir.urem(b, SET_BLOCKS)
        prs = [x if sp is None else arith.mulf(x, sp[s_])
               for w in range(wpb) for x in pairs(bir.extract(words, wpb * s_ + w))]
        hi, nil = bir.ult(bir.const(3), n), bir.i32_bits(0)
        prs = [mma.pack_i32(x) for x in prs]
        words_ = [v for p in prs for v in (bir.select(hi, nil, p), bir.select(hi, p, nil))]
        dst = bir.add(bir.mul(bir.udiv(b, SET_BLOCKS), lay.set_words),
                      bir.mul(n, lay.slot_words))
        for i in range(lay.chunks):
            bir.vector_store(bir.from_elements(bir.vec(4, bir.i32()), words_[4 * i:4 * i + 4]),
                             bsm, bir.add(dst, lay.chunk_pos(i, n)), alignment=16)


def compute(lay: Layout, accs: list[Value], *, wsm: Value, bsm: Value, sbsm: Value,
            warp: Value, g: Value, t: Value, pairs: Callable[[Value], list[Value]],
            sasm: Value | None = None, sa_stride: int = 0, unscale: float = 1.0,
            live: Value | None = None) -> list[Value]:
    """One step of a one-row pass: ``lay.sets`` sets of chained MMAs, each folded into the
    4 accumulators (rows g / g + 8 x the lane's two blocks of the set); ``live`` (the
    peeled last step): sets past it (past the row end) skipped by uniform branches. A set's
    words are decoded a word of each block at a time (4 MMAs: 16 live f16 pairs). MXFP4:
    ``sasm`` / ``sa_stride`` the staged activation scales, the fold the portable kernel's
    ``fma(4 * sum, (sA * sB) / 4, acc)`` with ``4 * sum = D * unscale``."""
    f32, i32 = bir.f32(), bir.i32()
    zero = bir.const(0.0, f32)
    rows = [bir.add(bir.mul(warp, 16), bir.add(g, 8 * h)) for h in range(2)]
    bases = lay.read_bases(g, t)
    vload = bir.vec(lay.blk_bytes, bir.i8())
    wpb = lay.blk_bytes // 4

    def scales(s: int) -> list[Value]:
        """(row g, row g + 8) x (block 2p, 2p + 1) scale factors of set s, D's order."""
        if not lay.mx:  # |sB| of pair p = 4 s + t: [g: 2p, 2p + 1][g + 8: 2p, 2p + 1]
            v = bir.vector_load(bir.vec(4, f32), sbsm, bir.add(
                bir.mul(warp, 32), bir.add(bir.mul(g, 4), bir.mul(bir.add(t, 4 * s),
                                                                SCALE_PAIR_WORDS))),
                alignment=16)
            return [bir.extract(v, i) for i in range(4)]
        sb, sa = [], []
        for j in range(2):  # block 8 s + 2 t + j: [g, g + 8] weight scales, the row's sA
            blk = bir.add(bir.mul(t, 2), SET_BLOCKS * s + j)
            v = bir.vector_load(bir.vec(2, f32), sbsm, bir.add(
                bir.mul(blk, SCALE_BLOCK_WORDS), bir.add(bir.mul(warp, 16), bir.mul(g, 2))),
                alignment=8)
            sb.append([bir.extract(v, 0), bir.extract(v, 1)])
            sa.append(bir.load(sasm, bir.mul(blk, sa_stride)))
        q = bir.const(0.25, f32)
        return [arith.mulf(arith.mulf(sa[i & 1], sb[i & 1][i >> 1]), q) for i in range(4)]

    def one(s: int, accs: list[Value]) -> list[Value]:
        sc = scales(s)
        raw = []  # raw[blk][row]: the words of block t (blk 0) / t + 4 (blk 1) of the row
        for blk in range(2):
            col = bir.mul(bir.add(t, SET_BLOCKS * s + 4 * blk), lay.blk_bytes)
            raw.append([vector.bitcast(bir.vec(wpb, i32), bir.vector_load(
                vload, wsm, bir.add(bir.mul(r, lay.w_stride), col), alignment=lay.blk_bytes))
                for r in rows])
        d = [zero] * 4
        for w in range(wpb):
            a = [[pairs(bir.extract(raw[blk][h], w)) for h in range(2)] for blk in range(2)]
            bw = []
            for i in (2 * w, 2 * w + 1):  # b[0], b[1] of MMAs 4 w .. 4 w + 3
                v = bir.vector_load(bir.vec(4, i32), bsm,
                                    bir.add(bases[i], s * lay.set_words), alignment=16)
                bw += [bir.extract(v, j) for j in range(4)]
            for j in range(4):
                afr = [a[0][0][j], a[0][1][j], a[1][0][j], a[1][1][j]]
                bfr = [_f16x2(bw[2 * j]), _f16x2(bw[2 * j + 1])]
                d = list(mma.mma_m16n8k16(afr, bfr, d, input_type="f16"))
        if lay.mx:  # the exact block sums in quarters
            d = [arith.mulf(x, bir.const(unscale, f32)) for x in d]
        return [mmath.fma(d[i], sc[i], accs[i]) for i in range(4)]

    accs = list(accs)
    for s in range(lay.sets):
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


__all__ = ["SET_BLOCKS", "Layout", "compute", "row_totals", "stage_act"]

"""IR of the "lean" dense decode variants (``"mma_leanb_t<T>_n<NT>"``, NVFP4, M <= 16).

Imports MLIR: only :func:`blockscale.ops.matmul_decode.build` imports this module.

Why
---
The one-shot kernels (:mod:`blockscale.ops._decode_shot_ir`) put the weights on the MMA's M
side and re-decode the activation fragment for every 16 weight rows, fold every NVFP4 block
with an FFMA per accumulator, and read the weights back from shared memory: ~4.2 (M <= 8)
and ~6.1 (M <= 16) SASS instructions per weight element (M = 16, N = 5760, K = 2880: 4.5 M
warp instructions, 17.7 us). Here:

* the tokens are the M side of ``mma.sync.m16n8k16`` (16 rows, one M-tile: M <= 16) and the
  weight rows (output columns) the N side, ``NT`` n8-tiles per CTA (``8 NT`` columns, one
  CTA per SM for the dense grids): a warp decodes an activation fragment once for all ``NT``
  tiles;
* the block scales are folded into the f16 operands (``dec(x) * 2^-14 * (|s| * 2^7)``: exact,
  <= 6 significant bits, >= 2^-17: the f16 subnormals the tensor core handles exactly, as the
  grouped prefill's f16 path does), so the MMAs chain across blocks in fp32 and no per-block
  fold is needed; the result is ``2^14`` times the accumulator;
* the CTA's rows are copied into shared memory by ``cp.async.bulk`` at the kernel's start (a
  copy a row and round of 16 units, an mbarrier a round; token rows past M not copied), so
  all of its bytes are in flight before the first MMA without load registers, and 16 warps
  (4 a scheduler, 96 registers) split K, reading their fragments with ``LDS.64``.

K order (the same for both operands, so the dot product is unchanged)
----------------------------------------------------------------------
K is cut in units of 64 codes (32 bytes a row, 4 NVFP4 blocks = one 5-D scale word). Lane
``(g, t)`` loads bytes ``[8t, 8t + 8)`` of a unit of its row (weight row ``8 nt + g``,
token ``g`` and ``g + 8``): the 16 codes of NVFP4 block ``4u + t``, so one scale byte.
:func:`~blockscale.ops._decode_mma_ir.fp4_word_to_f16_pairs` turns each of its two words into
the f16 pairs (codes j, j + 4), and MMA ``i`` of the unit (k16) takes pair ``i`` of word 0
as k-slots ``(2t, 2t + 1)`` and pair ``i`` of word 1 as ``(2t + 8, 2t + 9)``, in the A
fragment (rows g / g + 8) and in the B fragment (column g) alike.

Work split and reduction (deterministic)
-----------------------------------------
W warps (16); warp ``w`` takes unit ``j W + w`` of copy round j (``j < ceil(U / W)``,
``U = K / 64``; unrolled up to ``kcap``'s rounds), all ``NT`` tiles, waiting for round j's
mbarrier before its unit j: every warp computes while the later rounds land (session 14's
form gave warp w the contiguous units ``[w U / W, (w + 1) U / W)`` on K-quarter copies, so
the last quarter's warps did all their units after the last byte). Every warp stores its
fp32 partials to shared memory; warp ``nt`` adds tile ``nt``'s in warp order 0, 1, .. and
stores the outputs (times 2^14, then the caller's ``store``: alpha, cast). The fp32 bound of
tests/test_matmul_common.py holds (one rounding per add of the MMA chain and of the warp sum); the bits are not the
portable kernel's, and they are the same from run to run.

A first form (session 14, "mma_lean_*", removed) loaded every weight byte of the CTA into
registers instead (``LDG.E.64`` at immediate offsets, 8 warps, 212 registers): slower at
every measured M (below); a warp's 8-byte loads touch one 32-byte sector of 8 rows each.

Measured (H200, RESULTS runs CN-CS) and what bounds it
------------------------------------------------------
Dense N = 5760, K = 2880 (ms, weight sets rotated past the L2): bulk M = 1 / 8 / 16
0.0116 / 0.0115 / 0.0119, registers 0.0121 / 0.0124 / 0.0127, the one-shot kernels 0.0126 /
0.0144 / 0.0173, cuBLAS bf16 ~0.014, FP8 rowwise ~0.0155. In the same harness a torch
read-only sum of 9.4 MB (the FP4 weights and scales) takes 0.0111 ms, a copy of 4.7 MB
(9.4 MB moved) 0.0090, an empty launch of these kernels 0.0041-0.0044 (a tiny torch kernel
0.0037); without the decode and the MMAs (run CR, a removal variant) the bulk kernel takes
0.0081 (the register form 0.0098): the stream of this size, not the instructions, is most of the time, and the compute
(~2.8 M warp instructions, ~48 % of issue slots) adds ~3 us on top. So the M = 16 goals of
issue 9 (1/3 of bf16 = ~4.7 us, 1/2 of FP8 = ~7.7 us) are below what a plain device read or
copy of the same bytes costs at this size. ncu (run CR): 11.1 us, DRAM 17.6 %, issue 48 % of
active cycles; stalls long scoreboard 1.8, wait 1.1, not-selected 1.0, math-pipe throttle 1.0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlir import ir
from mlir.dialects import arith, memref, vector

import blockscale.ops._matmul_ir as mir
from blockscale.compiler import ir as bir
from blockscale.compiler.arch import mma, tma
from blockscale.formats import Format
from blockscale.layouts import SF_ATOM_BYTES, SF_ATOM_ROWS
from blockscale.ops._decode_mma_ir import _f16x2, _i32c, fp4_word_to_f16_pairs
from blockscale.ops.matmul_decode import bulk_layout, bulk_row_stride, lean_rounds

Value = ir.Value

#: K codes per unit (a lane's 16 codes = one NVFP4 block, 4 lanes of a quad)
UNIT = 64
#: the f16 operands are ``x * 2^-7`` (decode 2^-14 times scale 2^7), their products 2^-14
UNSCALE = 2.0 ** 14


def _scale_pair(byte: Value) -> Value:
    """One E4M3 scale byte (i32, sign ignored: D3) -> ``(|s| * 2^7, |s| * 2^7)`` f16x2
    (exact: 2^-2 .. 57344; 0x7F a NaN)."""
    b = bir.bit_and(byte, 0x7F)
    pair = arith.trunci(bir.i16(), bir.bit_or(b, bir.shl(b, 8)))
    two7 = bir.from_elements(bir.vec(2, bir.f16()), [bir.const(128.0, bir.f16())] * 2)
    return arith.mulf(mma.cvt_e4m3x2_to_f16x2(pair), two7)


def _scaled_pairs(words: tuple[Value, Value], scale: Value) -> list[list[Value]]:
    """A lane's two words of a unit -> per MMA i of the unit the f16 pairs (word 0 pair i,
    word 1 pair i), times ``scale`` (f16x2)."""
    p0, p1 = (fp4_word_to_f16_pairs(w) for w in words)
    return [[arith.mulf(p0[i], scale), arith.mulf(p1[i], scale)] for i in range(4)]


def _unit(live: Value, accs: list[Value], bw: list[list[Value]], bs: list[Value],
          aw: list[list[Value]], as_: list[Value]) -> list[Value]:
    """``accs`` (4 per n-tile) plus one unit's 4 MMAs per n-tile where ``live`` (uniform):
    ``bw[nt]`` / ``bs[nt]`` the lane's two weight words and scale byte of n-tile nt,
    ``aw[h]`` / ``as_[h]`` those of token row ``g + 8 h`` (one or two halves; the second
    zero when absent)."""
    f32 = bir.f32()
    zpair = _f16x2(_i32c(0))
    br = bir.if_(live, [f32] * len(accs))
    with br.then():
        apairs = [_scaled_pairs(w_, _scale_pair(s_)) for w_, s_ in zip(aw, as_)]
        out = list(accs)
        for nt in range(len(bw)):
            bp = _scaled_pairs(bw[nt], _scale_pair(bs[nt]))
            for i in range(4):
                hi_a = apairs[1][i] if len(apairs) == 2 else [zpair, zpair]
                afr = [apairs[0][i][0], hi_a[0], apairs[0][i][1], hi_a[1]]
                out[4 * nt:4 * nt + 4] = mma.mma_m16n8k16(
                    afr, bp[i], out[4 * nt:4 * nt + 4], input_type="f16")
        br.yield_(*out)
    with br.else_():
        br.yield_(*accs)
    return list(br.results)


def _reduce_store(red: Value, accs: list[Value], warps: int, lane: Value, warp: Value, g: Value,
                  t: Value, start: Value, end: Value, n0: Value, n_count: Value,
                  store: Callable[[Value, Value, Value], None]) -> None:
    """Every warp's partials (4 a lane and n-tile) to the f32 shared buffer ``red``; a
    barrier; warp ``nt`` (and ``nt + warps``, ..) adds tile nt's partials
    in warp order 0, 1, .., times 2^14, and stores the outputs (rows < end, columns < N)."""
    f32 = bir.f32()
    ntiles = len(accs) // 4

    def slot(wi: Value | int, nt: Value | int) -> Value:  # warp wi's 4 partials of tile nt
        wi = bir.const(wi) if isinstance(wi, int) else wi
        return bir.mul(bir.add(bir.mul(bir.add(bir.mul(wi, ntiles), nt), 32), lane), 4)

    for nt in range(ntiles):
        bir.vector_store(bir.from_elements(bir.vec(4, f32), accs[4 * nt:4 * nt + 4]), red,
                         slot(warp, nt), alignment=16)
    bir.barrier()
    for nt0 in range(0, ntiles, warps):
        nt = bir.add(warp, nt0)
        with bir.when(bir.ult(nt, ntiles)):
            tot = None
            for wi in range(warps):
                p = bir.vector_load(bir.vec(4, f32), red, slot(wi, nt), alignment=16)
                vals = [bir.extract(p, i) for i in range(4)]
                tot = vals if tot is None else [arith.addf(x, y) for x, y in zip(tot, vals)]
            for i in range(4):
                tok = bir.add(start, bir.add(g, 8 * (i >> 1)))
                col = bir.add(n0, bir.add(bir.mul(nt, 8), bir.add(bir.mul(t, 2), i & 1)))
                with bir.when(bir.logical_and(bir.ult(tok, end), bir.ult(col, n_count))):
                    store(arith.mulf(tot[i], bir.const(UNSCALE, f32)), tok, col)


def emit_decode_lean(kb: Any, fmt: Format, *, start: Value, end: Value, expert: Value,
                     n_count: Value, k: Value, a_srow: Callable[[Value], Value],
                     store: Callable[[Value, Value, Value], None], ntiles: int,
                     tokens: int, kcap: int, warps: int = 16) -> None:
    """The body for columns ``[8 ntiles block_idx.x, +8 ntiles)`` of rows ``[start, end)``
    (``end - start <= tokens``, the host checks) with the interface of
    :func:`blockscale.ops._decode_ir.emit_decode`: the CTA's 8 ntiles weight rows and
    ``tokens`` activation rows are copied by ``cp.async.bulk`` in rounds of ``warps`` units
    (one copy a row and round, each round on its own mbarrier, round 0 first), so all its
    bytes are in flight at once without load registers; warp w takes unit ``j warps + w`` of
    round j, waits for round j's mbarrier, reads its fragments with ``LDS.64`` and runs
    :func:`_unit`'s MMAs: every warp computes while the later rounds land, and after the
    last byte only one unit a warp is left. ``k <= kcap``, a multiple of 64 (the host
    checks)."""
    from blockscale.compiler.arch import cpasync
    from blockscale.compiler.arch import wgmma as W

    if fmt.name != "nvfp4":
        raise ValueError(f"the lean decode kernel is NVFP4 only, got {fmt.name}")
    if tokens not in (8, 16) or not 1 <= ntiles <= 8:
        raise ValueError(f"tokens must be 8 or 16, ntiles 1..8, got {tokens}, {ntiles}")
    f32, i32 = bir.f32(), bir.i32()
    halves = tokens // 8
    stride = bulk_row_stride(kcap)
    rounds = lean_rounds(kcap, warps)  # units a warp at most: one a round
    lay = bulk_layout(kcap, ntiles, tokens, rounds)
    assert warps * ntiles * 32 * 16 <= lay["bars"]  # the partials fit in the rows' bytes
    nrows = 8 * ntiles + tokens
    buf = tma.extern_shared_buffer(kb, lay["total"], align=128)
    base = W.shared_address(buf)
    space = ir.MemRefType(buf.type).memory_space
    red = memref.view(ir.MemRefType.get([warps * ntiles * 32 * 4], f32, memory_space=space),
                      buf, bir.const(lay["rows"]), [])
    a, w, sfa, sfb = (kb.arg(x) for x in ("a", "w" if "w" in kb.values else "b", "sfa", "sfb"))

    def bar(c: Value) -> Value:
        return arith.addi(base, bir.as_i64(bir.add(bir.mul(c, 8), lay["bars"])))

    tid = bir.thread_idx("x")
    lane, warp = bir.urem(tid, 32), bir.udiv(tid, 32)
    g, t = bir.udiv(lane, 4), bir.urem(lane, 4)
    row_bytes = bir.udiv(k, 2)
    units = bir.udiv(k, UNIT)
    d1 = bir.ceil_div(bir.ceil_div(k, fmt.block_size), 4)
    n0 = bir.mul(bir.block_idx("x"), 8 * ntiles)
    e = bir.as_index(expert)
    n_last = bir.sub(n_count, 1)
    b_srow0 = bir.mul(bir.mul(e, bir.ceil_div(n_count, SF_ATOM_ROWS)), SF_ATOM_ROWS)

    def round_units(c: Value) -> Value:  # the units of round c (0 past the last)
        first = bir.umin(bir.mul(c, warps), units)
        return bir.sub(bir.umin(bir.add(first, warps), units), first)

    def round_live(c: Value) -> Value:  # round c holds units
        return bir.ult(bir.mul(c, warps), units)

    with bir.when(bir.ult(tid, rounds)):
        cpasync.mbarrier_init(bar(tid), 1)
        tma.fence_mbarrier_init()
    bir.barrier()
    # the token rows past M are not copied (a clamped copy of row M - 1 per missing row
    # would send 120 CTAs x (T - M) requests to the same lines): their fragments read row M - 1
    m_rows = bir.umin(bir.sub(end, start), tokens)
    copied = bir.add(m_rows, 8 * ntiles)
    with bir.when(bir.logical_and(bir.ult(tid, rounds), round_live(tid))):
        cpasync.mbarrier_arrive_expect_tx_n(
            bar(tid), bir.as_i32(bir.mul(bir.mul(round_units(tid), 32), copied)))
    threads = 32 * warps
    for it in range(-(-nrows * rounds // threads)):  # round-major: round 0's rows first
        idx = bir.add(tid, it * threads)
        c, r = bir.udiv(idx, nrows), bir.urem(idx, nrows)
        with bir.when(bir.logical_and(bir.logical_and(bir.ult(idx, nrows * rounds),
                                                      round_live(c)), bir.ult(r, copied))):
            is_w = bir.ult(r, 8 * ntiles)
            wrow = bir.add(bir.mul(e, n_count), bir.umin(bir.add(n0, r), n_last))
            arow = bir.umin(bir.add(start, bir.sub(r, 8 * ntiles)), bir.sub(end, 1))
            col = bir.mul(bir.mul(c, warps), 32)
            src = arith.addi(arith.select(is_w, cpasync.global_address(w),
                                          cpasync.global_address(a)),
                             bir.as_i64(bir.add(bir.mul(bir.select(is_w, wrow, arow),
                                                        row_bytes), col)))
            dst = arith.addi(base, bir.as_i64(bir.add(bir.mul(r, stride), col)))
            cpasync.bulk_copy_n(dst, src, bir.as_i32(bir.mul(round_units(c), 32)), bar(c))

    # the lane's scale bytes (block 4u + t of its rows) for its units, before the waits
    cols = [bir.umin(bir.add(n0, bir.add(g, 8 * nt)), n_last) for nt in range(ntiles)]
    toks = [bir.umin(bir.add(start, bir.add(g, 8 * h)), bir.sub(end, 1)) for h in range(halves)]
    sunit0 = bir.add(bir.mul(warp, SF_ATOM_BYTES), t)
    sbase = [bir.add(mir.tcgen_row_offset(bir.add(b_srow0, c), d1), sunit0) for c in cols]
    sabase = [bir.add(mir.tcgen_row_offset(a_srow(r), d1), sunit0) for r in toks]
    lives, scales = [], []
    for j in range(rounds):
        live = bir.ult(bir.add(warp, j * warps), units)
        br = bir.if_(live, [i32] * (ntiles + halves))
        with br.then():
            step = SF_ATOM_BYTES * warps * j
            br.yield_(*[mir.load_byte_i32(sfb, bir.add(b, step)) for b in sbase],
                      *[mir.load_byte_i32(sfa, bir.add(b, step)) for b in sabase])
        with br.else_():
            br.yield_(*[_i32c(0)] * (ntiles + halves))
        lives.append(live)
        scales.append(list(br.results))

    lane_off = bir.add(bir.mul(warp, 32), bir.mul(t, 8))
    wrows = [bir.add(bir.mul(bir.add(g, 8 * nt), stride), lane_off) for nt in range(ntiles)]
    arows = [bir.add(bir.mul(bir.add(bir.umin(bir.add(g, 8 * h), bir.sub(m_rows, 1)),
                                     8 * ntiles), stride), lane_off) for h in range(halves)]

    def words(off: Value) -> list[Value]:
        v = vector.bitcast(bir.vec(2, i32), bir.vector_load(bir.vec(8, bir.i8()), buf, off,
                                                            alignment=8))
        return [bir.extract(v, 0), bir.extract(v, 1)]

    accs = [bir.const(0.0, f32)] * (4 * ntiles)
    for j, (live, sc) in enumerate(zip(lives, scales)):
        br = bir.if_(live, [i32] * (2 * (ntiles + halves)))
        with br.then():  # round j landed: this warp's unit j warps + w
            cpasync.mbarrier_wait(bar(bir.const(j)), _i32c(0))
            br.yield_(*[x for r in wrows + arows for x in words(bir.add(r, 32 * warps * j))])
        with br.else_():
            br.yield_(*[_i32c(0)] * (2 * (ntiles + halves)))
        ws = list(br.results)
        bw = [ws[2 * nt:2 * nt + 2] for nt in range(ntiles)]
        aw = [ws[2 * (ntiles + h):2 * (ntiles + h) + 2] for h in range(halves)]
        accs = _unit(live, accs, bw, sc[:ntiles], aw, sc[ntiles:])
    bir.barrier()  # every warp's fragment reads done: the partials reuse the rows' bytes
    _reduce_store(red, accs, warps, lane, warp, g, t, start, end, n0, n_count, store)

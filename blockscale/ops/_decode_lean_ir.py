"""IR of the "lean" dense decode variants (``variant="mma_lean_t<T>_n<NT>"``, NVFP4, M <= 16).

Imports MLIR: only :func:`blockscale.ops.matmul_decode.build` imports this module.

Why
---
The one-shot kernels (:mod:`blockscale.ops._decode_shot_ir`) put the weights on the MMA's M
side and re-decode the activation fragment for every 16 weight rows, fold every NVFP4 block
with an FFMA per accumulator, and read the weights back from shared memory: ~4.2 (M <= 8)
and ~6.1 (M <= 16) SASS instructions per weight element, so the M = 16 problem (N = 5760, K =
2880) runs ~3x longer than its 9.3 MB take at copy speed. Here:

* the tokens are the M side of ``mma.sync.m16n8k16`` (16 rows, one M-tile: M <= 16) and the
  weight rows (output columns) the N side, ``NT`` n8-tiles per CTA (``8 NT`` columns, one
  CTA per SM for the dense grids): a warp decodes an activation fragment once for all ``NT``
  tiles;
* the block scales are folded into the f16 operands (``dec(x) * 2^-14 * (|s| * 2^7)``: exact,
  <= 6 significant bits, >= 2^-17: the f16 subnormals the tensor core handles exactly, as the
  grouped prefill's f16 path does), so the MMAs chain across blocks in fp32 and no per-block
  fold is needed; the result is ``2^14`` times the accumulator;
* every weight byte of the CTA is loaded straight into registers at the kernel's start
  (``ld.global.v2`` of 8 bytes a lane and unit, all issued before the first MMA; ~100 KB
  in flight per SM), no shared-memory staging.

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
8 warps; warp ``w`` takes units ``[w U / 8, (w + 1) U / 8)`` (``U = K / 64``; at most
``upw`` each, unrolled), all ``NT`` tiles. Every warp stores its fp32 partials to shared
memory; warp ``nt`` adds tile ``nt``'s in warp order 0..7 and stores the outputs (times
2^14, then the caller's ``store``: alpha, cast). The fp32 bound of tests/test_matmul_common.py
holds (one rounding per add of the MMA chain and of the warp sum); the bits are not the
portable kernel's, and they are the same from run to run.

Measured (H200, RESULTS runs CN-CP) and what bounds it
------------------------------------------------------
Dense N = 5760, K = 2880: M = 16 ``t16_n6`` 0.0121-0.0125 ms (``mma_shot16`` 0.0177-0.0181,
cuBLAS bf16 0.0140), M = 1 ``t8_n6`` 0.0121-0.0122 (``mma_shot`` 0.0124-0.0126). sm_90a SASS
``t16_n6``: 2456 instructions (96 loads, 144 HMMA, ~1190 ALU: the E2M1 decode is ~9-11 ALU
ops a word), 212 registers. ncu (run CO): 0.36 issued warps a scheduler and cycle at 2 warps a
scheduler (5.6 cycles an instruction: long scoreboard 1.7, wait 0.7), DRAM 17 %: the loads
are all issued first, but a warp's ``LDG.E.64`` touches one 32-byte sector of each of 8 rows,
so far fewer bytes are in flight per SM than requested. Next: the CTA's rows by
``cp.async.bulk`` into shared memory (a whole row a copy, the TMA engine keeps them in flight;
rows of 1440 bytes give conflict-free ``LDS.64`` fragment reads), which also frees the load
registers for 16 warps a CTA (128 registers: 4 warps a scheduler to hide the MMA / decode
latencies).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlir import ir
from mlir.dialects import arith, vector

import blockscale.ops._matmul_ir as mir
from blockscale.compiler import ir as bir
from blockscale.compiler.arch import mma, tma
from blockscale.formats import Format
from blockscale.layouts import SF_ATOM_BYTES, SF_ATOM_ROWS
from blockscale.ops._decode_mma_ir import _f16x2, _i32c, fp4_word_to_f16_pairs

Value = ir.Value

WARPS = 8
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


def emit_decode_lean(kb: Any, fmt: Format, *, start: Value, end: Value, expert: Value,
                     n_count: Value, k: Value, a_srow: Callable[[Value], Value],
                     store: Callable[[Value, Value, Value], None], ntiles: int,
                     tokens: int, upw: int) -> None:
    """The body for columns ``[8 ntiles block_idx.x, +8 ntiles)`` of rows ``[start, end)``
    (``end - start <= tokens``, the host checks) with the interface of
    :func:`blockscale.ops._decode_ir.emit_decode`; ``k`` a multiple of 64 with at most
    ``upw`` units a warp (``k <= 512 upw``, the host checks); ``tokens``: 8 (one fragment row
    half, the other zero) or 16."""
    if fmt.name != "nvfp4":
        raise ValueError(f"the lean decode kernel is NVFP4 only, got {fmt.name}")
    if tokens not in (8, 16) or not 1 <= ntiles <= 8 or upw < 1:
        raise ValueError(f"tokens must be 8 or 16, ntiles 1..8, upw >= 1, got {tokens}, "
                         f"{ntiles}, {upw}")
    f32, i32 = bir.f32(), bir.i32()
    halves = tokens // 8
    red = tma.shared_buffer(kb, f"{WARPS * ntiles * 32 * 4}xf32", align=16)
    a, w, sfa, sfb = (kb.arg(x) for x in ("a", "w" if "w" in kb.values else "b", "sfa", "sfb"))

    tid = bir.thread_idx("x")
    lane, warp = bir.urem(tid, 32), bir.udiv(tid, 32)
    g, t = bir.udiv(lane, 4), bir.urem(lane, 4)
    row_bytes = bir.udiv(k, 2)
    units = bir.udiv(k, UNIT)
    d1 = bir.ceil_div(bir.ceil_div(k, fmt.block_size), 4)
    n0 = bir.mul(bir.block_idx("x"), 8 * ntiles)
    e = bir.as_index(expert)
    lo = bir.udiv(bir.mul(warp, units), WARPS)
    hi = bir.udiv(bir.mul(bir.add(warp, 1), units), WARPS)
    b_srow0 = bir.mul(bir.mul(e, bir.ceil_div(n_count, SF_ATOM_ROWS)), SF_ATOM_ROWS)
    lane_off = bir.mul(t, 8)

    def words(buf: Value, base: Value, j: int) -> list[Value]:
        """The lane's 8 bytes of the warp's unit ``lo + j`` of the row at ``base`` (two
        i32)."""
        v = vector.bitcast(bir.vec(2, i32), bir.vector_load(
            bir.vec(8, bir.i8()), buf, bir.add(base, 32 * j), alignment=8))
        return [bir.extract(v, 0), bir.extract(v, 1)]

    def scale_byte(buf: Value, base: Value, j: int) -> Value:
        """The lane's block scale byte (block ``4 (lo + j) + t``) of the row at ``base``."""
        return mir.load_byte_i32(buf, bir.add(base, SF_ATOM_BYTES * j))

    n_last = bir.sub(n_count, 1)
    cols = [bir.umin(bir.add(n0, bir.add(g, 8 * nt)), n_last) for nt in range(ntiles)]
    toks = [bir.umin(bir.add(start, bir.add(g, 8 * h)), bir.sub(end, 1)) for h in range(halves)]
    # the rows' offsets at unit lo (a slot j adds 32 j / 512 j: immediate load offsets)
    unit0 = bir.add(bir.mul(lo, 32), lane_off)
    sunit0 = bir.add(bir.mul(lo, SF_ATOM_BYTES), t)
    wbase = [bir.add(bir.mul(bir.add(bir.mul(e, n_count), c), row_bytes), unit0) for c in cols]
    sbbase = [bir.add(mir.tcgen_row_offset(bir.add(b_srow0, c), d1), sunit0) for c in cols]
    abase = [bir.add(bir.mul(r, row_bytes), unit0) for r in toks]
    sabase = [bir.add(mir.tcgen_row_offset(a_srow(r), d1), sunit0) for r in toks]
    nvals = 3 * ntiles + 3 * halves

    # ---- every load of the warp's units first (a slot past the warp's units: zeros)
    loads, lives = [], []
    for j in range(upw):
        live = bir.ult(bir.add(lo, j), hi)
        br = bir.if_(live, [i32] * nvals)
        with br.then():
            vals = [x for b in wbase for x in words(w, b, j)]
            vals += [scale_byte(sfb, b, j) for b in sbbase]
            vals += [x for b in abase for x in words(a, b, j)]
            vals += [scale_byte(sfa, b, j) for b in sabase]
            br.yield_(*vals)
        with br.else_():
            br.yield_(*[_i32c(0)] * nvals)
        r = list(br.results)
        bw = [r[2 * nt:2 * nt + 2] for nt in range(ntiles)]
        bs = r[2 * ntiles:3 * ntiles]
        aw = [r[3 * ntiles + 2 * h:3 * ntiles + 2 * h + 2] for h in range(halves)]
        loads.append((bw, bs, aw, r[3 * ntiles + 2 * halves:]))
        lives.append(live)

    zero = bir.const(0.0, f32)
    zpair = _f16x2(_i32c(0))
    accs = [zero] * (4 * ntiles)
    for (bw, bs, aw, as_), live in zip(loads, lives):
        br = bir.if_(live, [f32] * (4 * ntiles))
        with br.then():
            apairs = [_scaled_pairs(aw[h], _scale_pair(as_[h])) for h in range(halves)]
            out = list(accs)
            for nt in range(ntiles):
                bp = _scaled_pairs(bw[nt], _scale_pair(bs[nt]))
                for i in range(4):
                    hi_a = apairs[1][i] if halves == 2 else [zpair, zpair]
                    afr = [apairs[0][i][0], hi_a[0], apairs[0][i][1], hi_a[1]]
                    out[4 * nt:4 * nt + 4] = mma.mma_m16n8k16(
                        afr, bp[i], out[4 * nt:4 * nt + 4], input_type="f16")
            br.yield_(*out)
        with br.else_():
            br.yield_(*accs)
        accs = list(br.results)

    # ---- partials -> shared; warp nt sums tile nt in warp order and stores it
    for nt in range(ntiles):
        bir.vector_store(bir.from_elements(bir.vec(4, f32), accs[4 * nt:4 * nt + 4]), red,
                         bir.mul(bir.add(bir.mul(bir.add(bir.mul(warp, ntiles), nt), 32),
                                         lane), 4), alignment=16)
    bir.barrier()
    for nt0 in range(0, ntiles, WARPS):
        nt = bir.add(warp, nt0)
        with bir.when(bir.ult(nt, ntiles)):
            tot = None
            for wi in range(WARPS):
                p = bir.vector_load(bir.vec(4, f32), red, bir.mul(bir.add(bir.mul(
                    bir.add(nt, wi * ntiles), 32), lane), 4), alignment=16)
                vals = [bir.extract(p, i) for i in range(4)]
                tot = vals if tot is None else [arith.addf(x, y) for x, y in zip(tot, vals)]
            for i in range(4):
                tok = bir.add(start, bir.add(g, 8 * (i >> 1)))
                col = bir.add(n0, bir.add(bir.mul(nt, 8), bir.add(bir.mul(t, 2), i & 1)))
                with bir.when(bir.logical_and(bir.ult(tok, end), bir.ult(col, n_count))):
                    store(arith.mulf(tot[i], bir.const(UNSCALE, f32)), tok, col)

"""IR of the MXFP8 tensor-core decode variant (``variant="mma_x8"``): swap-AB ``mma.sync``.

Imports MLIR: only :func:`blockscale.ops.matmul_decode.build` imports this module.

Why
---
The SIMT decode kernel (:mod:`blockscale.ops._decode_ir`) does one FP32 FMA per weight byte
and activation row and re-reads the weights per pass of 4 rows; for MXFP8 it also spills
(160 bytes at 128 registers): gpt-oss-120b gate_up at T = 128 took 2.28 ms, slower than
torch's bf16 grouped GEMM (run DR). E4M3 needs no software decode on sm_90a:
``cvt.rn.f16x2.e4m3x2`` gives two exact f16 values in one instruction (NaN codes -> NaN).

Work split
----------
A CTA of :data:`WARPS` warps owns :data:`COLS` weight rows (output columns), 16 a warp: the
M side of ``mma.sync.m16n8k16`` (f16 inputs, f32 accumulators); the group's rows are the N
side, in passes of :data:`TOKENS`. K is walked in steps of :data:`STEP` elements (8 blocks
of 32). Lane ``(g, t)`` (``g = lane / 4``, ``t = lane % 4``) loads bytes ``[8t, 8t + 8)`` of
every block of the step for weight rows ``g`` and ``g + 8`` of its warp (``ld.global.v2``)
straight into registers, a step ahead: no shared staging of weights. MMA ``i`` (0, 1) of a
block takes bytes ``4i .. 4i + 3`` of a lane's piece: bytes (0, 1) as k-slots (2t, 2t + 1) and
(2, 3) as (2t + 8, 2t + 9), in the A fragment (rows g / g + 8) and in the B fragment (token
g) alike, so the two MMAs cover the block's 32 elements once (the block sum is unchanged by
the permutation). The step's activations (E4M3 -> f16, exact) and their decoded E8M0 scales
are staged by the whole CTA into a double-buffered shared tile (one barrier a step; a row
stride of 528 bytes keeps the 16-byte fragment reads conflict-free), fetched into registers
a step ahead as the weights are.

Numerics (the fp32 bound of tests/test_matmul_common.py; not the portable kernel's bits)
-------------------------------------------------------------------------------------------
Per block: ``D = mma(A1, B1, mma(A0, B0, 0))`` — the exact products of 32 E4M3 pairs summed in
the tensor core's fp32 — then ``acc = fma(D, |sA| * |sB|, acc)`` as the portable kernel
forms a block term (the scale product rounded once; 0x00 -> 2^-127, 0xFF -> NaN), blocks in
K order. An E4M3 NaN code in a weight or an activation is an f16 NaN in the MMA (the block
term NaN, as in the reference). Weight bytes past K (K % 32 == 16: a half block) load the
row's last valid bytes and meet zero activations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlir import ir
from mlir.dialects import arith, vector
from mlir.dialects import math as mmath

import blockscale.ops._matmul_ir as mir
from blockscale.compiler import ir as bir
from blockscale.compiler.arch import mma
from blockscale.formats import Format
from blockscale.layouts import SF_ATOM_BYTES, SF_ATOM_KBLOCKS, SF_ATOM_ROWS
from blockscale.ops._decode_mma_ir import _f16x2, _i32c
from blockscale.ops._mma_ir import workgroup_buffer

Value = ir.Value

WARPS = 4
THREADS = 32 * WARPS
#: weight rows (output columns) a CTA: 16 a warp (the MMA's M side)
COLS = 16 * WARPS
#: activation rows a pass (the MMA's N side: one n8-tile)
TOKENS = 8
#: K elements (= weight bytes a row) a step: 8 blocks of 32 (steps of 128, a quarter fewer
#: registers and no spill, were 5-40 % slower on the H200: run DS)
STEP = 256
BLOCK = 32
#: n8-tiles a pass ("mma_x8": 1, "mma_x8n2": 2; 4, a pass of 32 rows at 168 registers, was
#: 4 % faster than the tiled mma.sync kernel at gpt-oss T = 1024 and far slower below: run DT)
NTILES = (1, 2)


def _halves(x: Value) -> tuple[Value, Value]:
    """An i32's low and high 16 bits as i16."""
    i16 = bir.i16()
    return arith.trunci(i16, x), arith.trunci(i16, bir.shru(x, _i32c(16)))


def _e4m3_pairs(x: Value) -> tuple[Value, Value]:
    """Four E4M3 bytes (an i32, byte 0 first) -> the f16 pairs (bytes 0, 1), (bytes 2, 3)."""
    lo, hi = _halves(x)
    return mma.cvt_e4m3x2_to_f16x2(lo), mma.cvt_e4m3x2_to_f16x2(hi)


def _load_words(buf: Value, off: Value, nbytes: int) -> list[Value]:
    """``nbytes`` (4, 8 or 16) bytes of an i8 buffer at ``off`` (aligned) as i32 words."""
    v = bir.vector_load(bir.vec(nbytes, bir.i8()), buf, off, alignment=nbytes)
    w = vector.bitcast(bir.vec(nbytes // 4, bir.i32()), v)
    return [bir.extract(w, i) for i in range(nbytes // 4)]


def emit_decode_mx8(kb: Any, fmt: Format, *, start: Value, end: Value, expert: Value,
                    n_count: Value, k: Value, a_srow: Callable[[Value], Value],
                    store: Callable[[Value, Value, Value], None], ntiles: int = 1) -> None:
    """The body for columns ``[COLS block_idx.x, +COLS)`` of rows ``[start, end)`` with the
    interface of :func:`blockscale.ops._decode_ir.emit_decode` (MXFP8 only; K % 16 == 0, the
    host checks): passes of ``ntiles`` x :data:`TOKENS` rows (``ntiles`` n8-tiles sharing
    each weight fragment), each streaming the CTA's weight rows once."""
    if fmt.name != "mxfp8":
        raise ValueError(f"the mma_x8 decode kernel is MXFP8 only, got {fmt.name}")
    if ntiles not in NTILES:
        raise ValueError(f"ntiles must be one of {NTILES}, got {ntiles}")
    rows = TOKENS * ntiles  # activation rows a pass
    step = STEP
    step_blocks = step // BLOCK
    atoms = step_blocks // SF_ATOM_KBLOCKS  # 5-D scale atoms (4 blocks) a weight row and step
    # the staged activation row: ``step`` f16 plus 8 (a stride of 16 mod 128 bytes: the 16-byte
    # reads of 8 tokens at one K offset fall in distinct bank groups)
    act_row_words = (step + 8) // 2
    act_words = rows * act_row_words
    stage_bytes = TOKENS * step // THREADS  # activation bytes a staging thread loads a step
    f32, i32 = bir.f32(), bir.i32()
    act = workgroup_buffer(kb, 2 * act_words, i32)
    sact = workgroup_buffer(kb, 2 * step_blocks * rows, f32)
    sc_words = step_blocks * rows  # the staged scales a step
    a, w, sfa, sfb = (kb.arg(x) for x in ("a", "w" if "w" in kb.values else "b", "sfa", "sfb"))

    tid = bir.thread_idx("x")
    lane, warp = bir.urem(tid, 32), bir.udiv(tid, 32)
    g, t = bir.udiv(lane, 4), bir.urem(lane, 4)
    kblocks = bir.ceil_div(k, BLOCK)
    d1 = bir.ceil_div(kblocks, SF_ATOM_KBLOCKS)
    steps = bir.ceil_div(k, step)
    e = bir.as_index(expert)
    n_last = bir.sub(n_count, 1)
    ns = [bir.add(bir.add(bir.mul(bir.block_idx("x"), COLS), bir.mul(warp, 16)),
                  bir.add(g, 8 * h)) for h in range(2)]
    ns_c = [bir.umin(n, n_last) for n in ns]  # clamped rows: loaded, never stored
    w_rows = [bir.mul(bir.add(bir.mul(e, n_count), n), k) for n in ns_c]
    b_srow0 = bir.mul(bir.mul(e, bir.ceil_div(n_count, SF_ATOM_ROWS)), SF_ATOM_ROWS)
    sfb_rows = [mir.tcgen_row_offset(bir.add(b_srow0, n), d1) for n in ns_c]
    last8 = bir.sub(k, 8)
    # staging: thread tid loads stage_bytes of tokens tid // 16 + 8 i's step rows (i <
    # ntiles) and the activation scales idx = tid + THREADS u (token idx // 8, block idx % 8)
    st_toks = [bir.add(bir.udiv(tid, step // stage_bytes), TOKENS * i) for i in range(ntiles)]
    st_col = bir.mul(bir.urem(tid, step // stage_bytes), stage_bytes)
    sc_idx = [bir.add(tid, THREADS * u) for u in range(-(-sc_words // THREADS))]
    n_fetch = 2 * step_blocks * 2 + 2 * atoms + ntiles * stage_bytes // 4 + len(sc_idx)

    with bir.for_range(start, end, rows) as rl:
        r0 = rl.iv
        rows_c = bir.umin(bir.sub(end, r0), rows)

        def fetch(s: Value) -> list[Value]:
            """Step ``s``'s registers (zeros from step ``steps`` on): per weight row h and
            block j two words, per row h two scale words (atoms 2s, 2s + 1), the staging
            thread's activation words and scale byte."""
            br = bir.if_(bir.ult(s, steps), [i32] * n_fetch)
            with br.then():
                out: list[Value] = []
                base = bir.add(bir.mul(s, step), bir.mul(t, 8))
                for h in range(2):
                    for j in range(step_blocks):
                        off = bir.umin(bir.add(base, BLOCK * j), last8)
                        out += _load_words(w, bir.add(w_rows[h], off), 8)
                for h in range(2):
                    for q in range(atoms):
                        atom = bir.add(bir.mul(s, atoms), q)
                        sw = bir.if_(bir.ult(atom, d1), [i32])
                        with sw.then():
                            sw.yield_(*_load_words(
                                sfb, bir.add(sfb_rows[h], bir.mul(atom, SF_ATOM_BYTES)), 4))
                        with sw.else_():
                            sw.yield_(_i32c(0))
                        out.append(sw.results[0])
                col = bir.add(bir.mul(s, step), st_col)
                for st_tok in st_toks:
                    ab = bir.if_(bir.logical_and(bir.ult(st_tok, rows_c), bir.ult(col, k)),
                                 [i32] * (stage_bytes // 4))
                    with ab.then():
                        ab.yield_(*_load_words(a, bir.add(bir.mul(bir.add(r0, st_tok), k), col),
                                               stage_bytes))
                    with ab.else_():
                        ab.yield_(*[_i32c(0)] * (stage_bytes // 4))
                    out += list(ab.results)
                for idx in sc_idx:
                    sc_tok = bir.udiv(idx, step_blocks)
                    gb = bir.add(bir.mul(s, step_blocks), bir.urem(idx, step_blocks))
                    sb = bir.if_(bir.logical_and(bir.logical_and(bir.ult(idx, sc_words),
                                                                 bir.ult(sc_tok, rows_c)),
                                                 bir.ult(gb, kblocks)), [i32])
                    with sb.then():
                        off = bir.add(mir.tcgen_row_offset(a_srow(bir.add(r0, sc_tok)), d1),
                                      mir.tcgen_kblock_offset(gb))
                        sb.yield_(mir.load_byte_i32(sfa, off))
                    with sb.else_():
                        sb.yield_(_i32c(0))
                    out.append(sb.results[0])
                br.yield_(*out)
            with br.else_():
                br.yield_(*[_i32c(0)] * n_fetch)
            return list(br.results)

        zero = bir.const(0.0, f32)
        nacc = 4 * ntiles
        with bir.for_range(0, steps, carry=[zero] * nacc + fetch(bir.const(0))) as sl:
            s = sl.iv
            accs, cur = list(sl.carried[:nacc]), list(sl.carried[nacc:])
            nw, na = 4 * step_blocks, ntiles * stage_bytes // 4
            wwords, swords = cur[:nw], cur[nw:nw + 2 * atoms]
            awords = cur[nw + 2 * atoms:nw + 2 * atoms + na]
            abytes = cur[nw + 2 * atoms + na:]
            q = bir.urem(s, 2)
            # stage step s: buffer q was last read at step s - 2, before step s - 1's barrier
            per = stage_bytes // 4
            for i, st_tok in enumerate(st_toks):
                pairs = [mma.pack_i32(p) for x in awords[i * per:(i + 1) * per]
                         for p in _e4m3_pairs(x)]
                dst = bir.add(bir.mul(q, act_words),
                              bir.add(bir.mul(st_tok, act_row_words), bir.udiv(st_col, 2)))
                for c in range(0, len(pairs), 4):
                    bir.vector_store(bir.from_elements(bir.vec(4, i32), pairs[c:c + 4]), act,
                                     bir.add(dst, c), alignment=16)
            for idx, abyte in zip(sc_idx, abytes):
                sc_tok, sc_blk = bir.udiv(idx, step_blocks), bir.urem(idx, step_blocks)
                with bir.when(bir.ult(idx, sc_words)):
                    sv = bir.select(bir.ult(sc_tok, rows_c), mir.decode_scale(fmt, abyte),
                                    bir.const(0.0, f32))
                    bir.store(sv, sact, bir.add(bir.mul(q, sc_words),
                                                bir.add(bir.mul(sc_blk, rows), sc_tok)))
            bir.barrier()
            nxt = fetch(bir.add(s, 1))
            for j in range(step_blocks):
                live = bir.ult(bir.add(bir.mul(s, step_blocks), j), kblocks)  # CTA-uniform
                br = bir.if_(live, [f32] * nacc)
                with br.then():
                    afr = []  # the block's two MMAs' A fragments: bytes 4i .. 4i + 3
                    for i in range(2):
                        lo_g, hi_g = _e4m3_pairs(wwords[2 * j + i])
                        lo_g8, hi_g8 = _e4m3_pairs(wwords[2 * step_blocks + 2 * j + i])
                        afr.append([lo_g, lo_g8, hi_g, hi_g8])
                    sbv = [mir.decode_scale(fmt, bir.bit_and(bir.shru(
                        swords[atoms * h + j // SF_ATOM_KBLOCKS],
                        _i32c(8 * (j % SF_ATOM_KBLOCKS))), 0xFF)) for h in range(2)]
                    new = []
                    for nt in range(ntiles):
                        words = bir.vector_load(bir.vec(4, i32), act, bir.add(
                            bir.mul(q, act_words), bir.add(
                                bir.mul(bir.add(g, TOKENS * nt), act_row_words),
                                bir.add(16 * j, bir.mul(t, 4)))), alignment=16)
                        bw = [_f16x2(bir.extract(words, i)) for i in range(4)]
                        d = [zero] * 4
                        for i in range(2):
                            d = list(mma.mma_m16n8k16(afr[i], bw[2 * i:2 * i + 2], d,
                                                      input_type="f16"))
                        sa = bir.vector_load(bir.vec(2, f32), sact, bir.add(
                            bir.mul(q, sc_words),
                            bir.add(j * rows + TOKENS * nt, bir.mul(t, 2))), alignment=8)
                        sas = [bir.extract(sa, i) for i in range(2)]
                        for h in range(2):  # D: (row g, tokens 2t, 2t + 1), (row g + 8, ..)
                            for c in range(2):
                                new.append(mmath.fma(d[2 * h + c], arith.mulf(sas[c], sbv[h]),
                                                     accs[4 * nt + 2 * h + c]))
                    br.yield_(*new)
                with br.else_():
                    br.yield_(*accs)
                accs = list(br.results)
            sl.yield_(*accs, *nxt)
        totals = list(sl.results[:nacc])
        for nt in range(ntiles):
            for h in range(2):
                for c in range(2):
                    tok = bir.add(bir.mul(t, 2), TOKENS * nt + c)
                    with bir.when(bir.logical_and(bir.ult(tok, rows_c),
                                                  bir.ult(ns[h], n_count))):
                        store(totals[4 * nt + 2 * h + c], bir.add(r0, tok), ns[h])
        bir.barrier()  # the next pass restages the shared buffers


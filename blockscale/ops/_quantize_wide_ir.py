"""Kernel IR of the "wide" schedule of grouped and fused-activation quantize (sm_90a first).

The "stream" schedules (:mod:`blockscale.ops._quantize_stream_ir`) pay per 16-element row
visit the row's bookkeeping (row index and bounds, the group check, the scale tile / row
offsets, the load and store addresses: ~35 SASS instructions), two 4-byte data stores, and
keep 32 bytes per thread in flight; every block starts with a ~6-halving binary search over
``expert_start`` in global memory (~8 dependent L2 round trips before its first math). This
schedule:

* gives each thread ``W = spec.wide`` chunks of 16 elements of the same row per visit
  (2; "wide4": 4): chunk ``v`` of thread lane ``ci`` is ``((bx * W + v) << cbt) | ci``
  with ``cbt = cb_log2 - log2 W`` (the x coverage of a block is the plan's, so the padding
  pass, the 5-D scale placement and the MX shuffle pairs are the stream kernel's; lanes of a
  warp stay on consecutive chunks for every ``v``: coalesced). The row's bookkeeping is paid
  once per ``16 W`` elements;
* ring prefetch: the loop carries the ``W`` chunks' raw words of the thread's next row; the
  loads of chunk ``v`` of row ``r + 1`` go out right after chunk ``v`` of row ``r`` is
  quantized, so ``2 (W - 1)``-``2 W`` 16-byte loads (grouped, fused twice that) are in flight
  per thread all the time, without register moves; ``wide_deep`` (``spec.unroll = 2``)
  loads two row groups ahead (the loop unrolled by 2, so the buffers still do not move);
* NVFP4 on CUDA: D2's reciprocals of the block's first TABLE_GROUPS groups (127 per group)
  in a shared table filled in the prologue (one barrier); a chunk's reciprocal is one shared
  load instead of a decode, a multiply and a div.rn (~9 instructions with the division's
  range check); rows of a later group (blocks spanning > 4 groups) keep the division;
* the block's first group from one warp-cooperative count over the first warp x
  SCAN_UNROLL entries of ``expert_start`` (one L2 round trip; a row past them falls to the
  loop's check) instead of the binary search; later changes (about one per block) keep the
  stream kernel's search;
* one vector store per chunk (8 bytes FP4, 16 bytes MXFP8) instead of one per 8 elements;
* the padding scale words (the stream kernel's pass) are zeroed after the data loop, so the
  prologue before the first math is ~3 dependent L2 round trips (count, group vectors,
  tensor scale), covered by the first row's loads; the fused table's fill issues all of a
  thread's table loads at once (:func:`_fill_lut`).

Numerics (D2 chain, NaN / -0 handling, packing) are the tile kernel's helpers, so the bytes
are identical on every target. Aligned kernels only (K % 8 == 0).

SASS of the data loop's hot path per element (sm_90a, ``tools/sass_loop_counts.py --moe``:
the loop minus the group search, the NVFP4 NaN-sign and table-miss cold branches and the
div.rn slow path), registers, spilled bytes (NVFP4 wide: one LDL/STL per iteration):

=============  ============  =============  ==============  ==============  ===========
kernel         stream2       wide (2 x 16)  wide4 (4 x 16)  wide_deep       stream_lut
=============  ============  =============  ==============  ==============  ===========
grouped NVFP4  18.2 (48, 0)  16.0 (64, 4)   15.7 (128, 0)   15.9 (80, 44)   --
grouped MXFP4  13.6 (48, 0)  11.6 (64, 0)   11.4 (111, 0)   11.6 (80, 0)    --
grouped MXFP8  10.1 (48, 0)  8.5 (63, 0)    8.0 (127, 0)    8.7 (80, 0)     --
fused NVFP4    --            --             --              --              33.2 (58, 0)
fused MXFP4    --            --             --              --              30.4 (59, 0)
fused MXFP8    --            --             --              --              20.2 (61, 0)
=============  ============  =============  ==============  ==============  ===========

fused ``wide_lut``: 29.3 (80, 16) / 26.3 (80, 0) / 18.9 (80, 0). Blocks per SM: 4 (wide),
2 (wide4), 3 (wide_deep, fused wide_lut); 16-byte loads in flight per thread: 2-4, 6-8,
4-8 (fused: twice). What is left per NVFP4 element is the D2 chain itself: the f32 E2M1
rounding with widening and packing (~9.5), the amax (~1.1), the sign words and the per-chunk
scale; the per-row bookkeeping is ~1.3 (wide) / ~0.7 (wide4).

``wide_bulk<S>`` (sm_90a, ``spec.bulk = S``, :class:`_BulkRing`): the same visit, its words
read from a shared ring of S row groups (16 KB each, fused 32 KB: gate and up spans) that
``cp.async.bulk`` row copies fill (the first row lane of each row issues its row's copy;
the first S row groups go out before the prologue), so the bytes in flight no longer cost
registers: per SM 64-128 KB (S = 2, 4 blocks), 128-192 KB (S = 3, 4 blocks), 144-192 KB
(S = 4, 3 blocks), fused S = 2: 64-128 KB (2 blocks), against 32-64 KB of ``wide``'s
registers. Per visit: one mbarrier wait, two (fused four) ``LDS.128`` per chunk, one
block barrier, and in the row-lead warps the refill (~50 SASS). The fused table comes in
one bulk copy on its own mbarrier. Hot path per element (registers, spills), S = 2 / 3 / 4:
grouped NVFP4 15.8 (64, 0) / 16.0 (64, 0) / 15.0 (72, 0), MXFP4 11.8 (62) / 12.0 (62) /
12.4 (68), MXFP8 8.8 (64) / 9.0 (64) / 9.2 (72); fused ``wide_bulk2_lut`` 25.4 (109-119,
0) / 25.5 (99-114) / 18.8 (106-112): its FP4 packing skips ``min(|y|, 6)`` when the chunk's
``fl(amax * recip) < 7`` (:func:`_pack_fp4_unsat`, kernels with >= 80 registers: fused
NVFP4 28.7 and grouped NVFP4 S = 4 17.7 without).

Session 5: ``wide4`` (128 registers) packs FP4 unsaturated too: grouped NVFP4 15.6 -> 14.1
(128, 0). Fused kernels (CUDA): the chunk max is ``max.NaN.f32`` of ``|z|`` (:func:`_amax_f32`)
and the sigmoid table's ``lo`` folds into its address: ``wide_bulk2_lut`` 24.3 (109, 0) /
24.5 (99) / 17.7 (103), ``wide_lut`` 28.3 (80, 16) / 25.2 (80, 0) / 17.8 (80, 0).
``wide_bulk2_x2`` (``spec.waves``): the same kernel on 2 resident waves of blocks (the plan
only). Removed in session 6, measured slower (runs T / U): the other ``_x2`` / ``_x4`` wave
forms and the fused SILU ``*_plut`` product tables (15.9-26.3 SASS an element).

Session 10: the E2M1 packing reads each code from the bits of its magic-number sum
(:func:`blockscale.compiler.arch.convert.e2m1x8_pack_fast`): grouped NVFP4 ``wide_bulk2_x2``
15.8 -> 14.7, ``wide4`` 14.1 -> 13.0, fused NVFP4 ``wide_bulk2_lut`` 24.3 -> 23.2 SASS an
element, and no faster (run BH). What bounds these kernels is the SM's **ALU pipe** (half rate:
LOP3, PRMT, SHF, LEA, FMNMX, ISETP, SEL), not the issue count alone: Nsight Compute (run BI) puts
the grouped NVFP4 kernel at 75 % of the ALU pipe's peak (MXFP4: 73 %) and 71 % issue, its DRAM
at 51 %. The new packing trades FMA-pipe work (the multiply and subtraction) for ALU work (three
``prmt`` gathers), 236 -> 256 ALU instructions per 32 elements: time-neutral. Moving the pair
bytes' shifts to ``IMAD.HI`` (FMA pipe; ALU 223) made it 5 % slower (run BJ), as did the
unsaturated packing in the 64-register kernel (spills) and at 80 registers (3 blocks an SM).
The next step has to cut ALU instructions outright (the per-element ``bits(t) & 0x7F800000``,
``min(|y|, 6)`` and the bf16 high-half mask are 80 of the 256; the amax, signs and store
addressing most of the rest).

Session 11 (runs BR-BT), two ALU cuts for the kernels that saturate in the hot path (the
64-register ``wide_bulk2_x2`` / ``wide``, the dense ones): the chunk amax as ``abs.bf16x2`` +
``max.NaN.bf16x2`` (``quantize_ir._amax_bf16x2``; the abs runs as ``HFMA2``) and the words'
E2M1 packing as ``sat(|x| * recip / 8)`` (``FMUL.SAT``, saturation at 8) with a nibble-8 fix
a word (:func:`convert.e2m1x8_pack_fast`; ``min(|y|, 6)`` gone; recip +inf or below 2^-96 take
``quantize_ir._rare_recip_words``). Grouped NVFP4 ``wide_bulk2_x2`` hot path 471 -> 454 SASS,
ALU 254 -> 205 per 32 elements: 16384 x 8192 0.1126 -> 0.1081-0.1097 ms across runs (78-79 % of
the same-bytes copy; ncu: ALU pipe 71.5 -> 66.8 %, issue 74 %: now both bound it), 16384 x 2880
0.0577 -> 0.0558 (``wide4`` stays faster there).
The unsaturated kernels (``wide4``, fused ``wide_bulk2_lut``: :func:`_pack_fp4_unsat`) keep
their packing: there the ``FMUL.SAT`` form cost a nibble fix without saving a ``min``, and the
fused amax and the packing would share one materialized ``|x|`` (run BS: fused 3.6 % slower).

Session 12 (runs BX-CE): fewer instructions stopped paying. A further 7.5 % off the grouped
NVFP4 hot path (454 -> 420 SASS: reciprocal table entries pre-divided by 8 with the rare ones
negated, the sign merge in the nibble fix's ``IADD3``, a loop copy for K % 16 == 0, i32 chunk
bounds) left its time unchanged (0.1088 vs 0.1090 ms), and 32 fewer ALU instructions in the
fused kernel (upper bf16 halves widened by ``HFMA2``) made it 0.7 % slower; ncu: issue 66-73 %,
DRAM 66 %, stalls spread over not-selected / wait / long-scoreboard. Dropped. What did pay:
the NVFP4 scale bytes through shared memory (:class:`_ScaleStage`; without any scale store the
kernel ran 6 % faster): grouped ``wide_bulk2_x2`` 16384 x 8192 0.1088 -> 0.1048-0.1056 ms
(78.9 -> 81.4-81.9 % of the same-bytes copy).

Session 13 (run CH): the ring reads had 2-way bank conflicts (a lane's chunk is 32 bytes, so a
quarter warp's ``LDS.128`` at a 32-byte lane stride covers each bank twice). Lanes 4-7 of
every 8 now read their two 16-byte halves in the other order (``_BulkRing.swap``; two selects
of the packed words a chunk put them back): fused ``wide_bulk2_lut_x2`` NVFP4 0.0965 -> 0.0952
ms (80.0 % of the same-bytes copy), MXFP8 -1.6 %, fused MXFP4 -1.5 %, grouped unchanged. Timed
by removal in the same run: the sigmoid-table gathers' conflicts cost nothing (all lanes on two
addresses: same time), the fused kernel's data stores 1 % (two waves) to 5 % (one wave).
``spec.wide = 1`` (``wide1_bulk2_lut``, fused op only; runs CI-CK): one chunk a thread visit
(one row a row group at D = 4096), so 16 KB stages and 78 registers: 3 resident blocks an SM
instead of 2 (hot path 28.3 vs 25.0 SASS an NVFP4 element). Fused NVFP4 16384 x 4096 on two
waves 0.0960-0.0969 -> 0.0931-0.0937 ms (81.0-81.5 % of the same-bytes copy), MXFP8 0.0946-0.0955
-> 0.0931-0.0939; the NVFP4 / MXFP8 default (quantize_silu.SILU_SCHEDULE_BY_FORMAT). The
grouped kernel (already 4 blocks at 64 registers) was 4-12 % slower with one chunk at 5-6
blocks (run CJ): the grouped op refuses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlir import ir
from mlir.dialects import arith, gpu, vector
from mlir.dialects import math as mmath

from blockscale.compiler import ir as B
from blockscale.compiler.arch.convert import e2m1x8_pack_unsat
from blockscale.ops import _quantize_stream_ir as QS
from blockscale.ops import quantize_grouped as QG
from blockscale.ops import quantize_ir as QI
from blockscale.ops import quantize_moe_ir as QM
from blockscale.ops.quantize_ir import CHUNK, _c32, _c64

if TYPE_CHECKING:
    from blockscale.ops.quantize_grouped import MoeQuantizeSpec

BLOCK_THREADS = QS.BLOCK_THREADS  # the launch block of QS.capped_module
#: expert_start entries a lane tests per step of the first-group count
SCAN_UNROLL = 4


def build(spec: MoeQuantizeSpec) -> ir.Module:
    """The ``gpu.module`` of the wide-schedule kernel of ``spec`` (module docstring)."""
    from blockscale.ops.quantize_grouped import wide_register_cap

    k = QI._Ctx(spec)
    if k.chunk <= CHUNK:
        raise ValueError(f"the wide schedule needs an aligned spec (K % 8 == 0), got "
                         f"aligned={spec.aligned}")
    if spec.wide not in (1, 2, 4):
        raise ValueError(f"spec.wide must be 1, 2 or 4 chunks per visit, got {spec.wide!r}")
    return QS.capped_module(k, spec, wide_register_cap(spec), _body)


class _Chunk:
    """Loop-invariant facts of one of a thread's chunks: columns and offsets as i32 (K and
    the scale row < 2^31; widened where added to a row's i64 offset: fewer registers)."""

    def __init__(self, k: QI._Ctx, a, c: ir.Value, v: int) -> None:
        i32 = B.i32()
        self.v = v  # the thread's chunk index in a visit
        ncols = a("k")
        j = arith.shrui(c, _c64(k.lanes_log2))
        col0 = arith.muli(c, _c64(k.chunk))
        self.col_ok = arith.cmpi(arith.CmpIPredicate.ult, col0, ncols)
        self.chunk_ok = arith.cmpi(arith.CmpIPredicate.ult, c, a("chunks_row"))
        # the sub-chunks' load columns (a sub-chunk past K re-reads a valid one of its block)
        self.ld_cols = [arith.trunci(i32, v)
                        for v in QM.subchunk_columns(k, j, col0, self.col_ok, ncols)]
        self.okh = [self.col_ok] + [
            arith.cmpi(arith.CmpIPredicate.ult, arith.addi(col0, _c64(CHUNK * h)), ncols)
            for h in range(1, k.chunk // CHUNK)]
        j32 = arith.trunci(i32, j)
        self.s_jpart = arith.addi(arith.shli(arith.shrui(j32, _c32(2)), _c32(9)),
                                  arith.andi(j32, _c32(3)))
        per_byte = 2 if k.fmt.is_fp4 else 1
        self.dcol = arith.trunci(i32, arith.shrui(col0, _c64(per_byte - 1)))  # data bytes


def _swapped(swap: ir.Value, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(a, b)``, or ``(b, a)`` where ``swap`` (i1) holds: two selects."""
    return arith.select(swap, b, a), arith.select(swap, a, b)


def _wide(v: ir.Value) -> ir.Value:
    return arith.extui(B.i64(), v)


def _body(k: QI._Ctx, kb: B.KernelBuilder) -> None:
    spec = k.spec
    i64, i32 = B.i64(), B.i32()
    a = kb.arg
    silu = spec.mode == "silu"
    nvfp4 = not k.fmt.is_mx
    w = spec.wide
    lw = w.bit_length() - 1
    ncols, kblocks_row = a("k"), a("kblocks_row")
    tid = B.cast_int(B.thread_idx(), i64)
    bx = B.cast_int(B.block_idx("x"), i64)
    by = B.cast_int(B.block_idx("y"), i64)
    cbt = arith.subi(arith.extui(i64, a("cb_log2")), _c64(lw))  # chunk lanes per row, log2
    ci = arith.andi(tid, arith.subi(arith.shli(_c64(1), cbt), _c64(1)))
    lane0 = arith.cmpi(arith.CmpIPredicate.eq, arith.andi(ci, _c64(k.lanes - 1)), _c64(0))
    chunks = [_Chunk(k, a, arith.ori(arith.shli(arith.addi(arith.shli(bx, _c64(lw)),
                                                           _c64(v)), cbt), ci), v)
              for v in range(w)]
    in_stride = arith.shli(ncols, _c64(1)) if silu else ncols
    d1 = arith.shrui(kblocks_row, _c64(2))
    m32 = arith.trunci(i32, a("m"))
    rpb_log2 = arith.trunci(i32, arith.subi(_c64(8), cbt))
    ri = arith.trunci(i32, arith.shrui(tid, cbt))
    rpb = arith.shli(_c32(1), rpb_log2)
    n_rg = arith.extui(i64, arith.shrui(arith.addi(m32, arith.subi(rpb, _c32(1))), rpb_log2))
    gy = B.cast_int(B.grid_dim("y"), i64)
    row_bytes = arith.shrui(ncols, _c64(1)) if k.fmt.is_fp4 else ncols
    k16 = arith.cmpi(arith.CmpIPredicate.eq, arith.andi(ncols, _c64(15)), _c64(0))

    def share(n: ir.Value) -> tuple[ir.Value, ir.Value]:
        """This block's contiguous share [lo, hi) of n units (i64)."""
        return (arith.divui(arith.muli(by, n), gy),
                arith.divui(arith.muli(arith.addi(by, _c64(1)), n), gy))

    lo, hi = share(n_rg)
    x = a("x")
    vt, wt = B.vec(CHUNK, B.bf16()), B.vec(CHUNK // 2, i32)

    def drow_of(rg: ir.Value) -> ir.Value:
        return arith.addi(arith.shli(arith.trunci(i32, rg), rpb_log2), ri)

    def row_off(rg: ir.Value) -> ir.Value:
        """Element offset of row group ``rg``'s source row in ``x`` (row 0 past M)."""
        drow = drow_of(rg)
        srow = arith.select(arith.cmpi(arith.CmpIPredicate.slt, drow, m32), drow, _c32(0))
        if spec.gather:
            src = B.load(a("indices"), arith.extui(i64, srow))
            srow = arith.divui(src, a("indices_divisor"))
        return arith.muli(arith.extui(i64, srow), in_stride)

    def load(off: ir.Value, ch: _Chunk) -> list[ir.Value]:
        """The raw words (vector<4xi32> per sub-chunk; fused: gate ones, then up ones)."""
        out = []
        for base in ((off, arith.addi(off, ncols)) if silu else (off,)):
            for c in ch.ld_cols:
                v = B.vector_load(vt, x, arith.addi(base, _wide(c)), alignment=16)
                out.append(vector.bitcast(wt, v))
        return out

    ring = None
    k.scale_stage = None
    k.half_swap = None
    if spec.bulk:  # the ring's first S row groups are in flight before the prologue
        ring = _BulkRing(k, kb, tid, ci, ri, cbt, lo, hi, in_stride, chunks,
                         lambda rg: row_off(rg))
        k.half_swap = ring.swap
        first = []
        if QG.stages_scales(spec):
            k.scale_stage = _ScaleStage(k, kb, a, tid, bx, ci, ri, cbt, lw, rpb_log2, d1)
    else:
        off0 = row_off(lo)
        first = [load(off0, ch) for ch in chunks]  # out before the table fill and lookups
    k.mx_bf16x2 = (spec.mode == "grouped" and spec.fmt == "mxfp4"
                   and k.target.name == "sm_90a")
    k.lut = None
    if spec.lut:  # the sigmoid table to shared memory (one barrier)
        from blockscale.compiler.arch import tma
        from blockscale.ops.quantize_silu import MAX_LUT, sigmoid_lut

        _, lut_lo, lut_w = sigmoid_lut(spec.activation, spec.act_alpha, spec.act_limit)
        n_lut = 2 * lut_w
        lut = tma.shared_buffer(kb, f"{MAX_LUT}xf32", align=16)
        if ring is not None:  # one bulk copy, waited for after the prologue
            ring.copy_table(a("sig_table"), lut, n_lut)
        else:
            _fill_lut(a("sig_table"), lut, tid, n_lut)
            B.barrier()
        k.lut = (lut, lut_lo, lut_w)

    # ---- the group of the block's first row: a warp-cooperative count ---------------------
    row0 = arith.minsi(arith.shli(arith.trunci(i32, lo), rpb_log2), arith.subi(m32, _c32(1)))
    g0 = _first_group(k, a, tid, row0)
    table = nvfp4 and k.target.is_cuda
    state_types = [i32] * 4 + ([B.f32(), B.f32()] if nvfp4 else []) + ([i32] if table else [])
    state0 = QS.group_state(k, a, g0)
    k.recip_table = None
    if table:  # D2's reciprocals of the block's first groups (module docstring)
        k.recip_table = _fill_recip_table(k, kb, a, tid, g0)
        state0.append(_c32(0))

    def slot(g: ir.Value) -> list[ir.Value]:
        """[g's table slot] (TABLE_GROUPS: not in the table), or [] without a table."""
        if not table:
            return []
        rel = arith.subi(g, g0)  # >= 0: the thread's rows are at or past row0
        return [arith.trunci(i32, arith.minui(rel, _c64(TABLE_GROUPS)))]

    nw = len(first[0]) if first else 0

    def clamp(rg: ir.Value) -> ir.Value:
        """``rg`` if it is in the block's share, else its last row group (valid, unused)."""
        return arith.select(arith.cmpi(arith.CmpIPredicate.ult, rg, hi), rg,
                            arith.subi(hi, _c64(1)))

    def visit(rg: ir.Value, cur: list[list[ir.Value]], state: list[ir.Value],
              noff: ir.Value | None) -> tuple[list[ir.Value], list[ir.Value]]:
        """Quantize row group ``rg`` from its chunks' words ``cur``; after each chunk, the
        same chunk's loads of the row at ``noff`` (None: none). Returns (loaded, state)."""
        drow = drow_of(rg)
        row_ok = arith.cmpi(arith.CmpIPredicate.slt, drow, m32)
        rowc = arith.minsi(drow, arith.subi(m32, _c32(1)))
        sb = B.if_(arith.cmpi(arith.CmpIPredicate.sge, rowc, state[0]), state_types)
        with sb.then():
            g = QS.search(a, rowc)
            sb.yield_(*(QS.group_state(k, a, g) + slot(g)))
        with sb.else_():
            sb.yield_(*state)
        st = list(sb.results)
        _end, start, t0, expert = st[:4]
        tsf, inv_tsf = (st[4], st[5]) if nvfp4 else (None, None)
        active = arith.cmpi(arith.CmpIPredicate.sge, expert, _c32(0))
        rel = arith.subi(rowc, start)
        tile = arith.extui(i64, arith.addi(t0, arith.shrui(rel, _c32(7))))
        rr = arith.extui(i64, arith.andi(rel, _c32(127)))
        rpart = arith.ori(arith.shli(arith.andi(rr, _c64(31)), _c64(4)),
                          arith.shli(arith.shrui(rr, _c64(5)), _c64(2)))
        srow_base = arith.addi(arith.shli(arith.muli(tile, d1), _c64(9)), rpart)
        drow_base = arith.muli(arith.extui(i64, drow), row_bytes)
        row = _Row(row_ok, active, tsf, inv_tsf, srow_base, drow_base, lane0, k16)
        if k.scale_stage is not None:
            k.scale_stage.put_row(row_ok, srow_base)
        row.slot = st[6] if table else None
        nxt = []
        for ch, words in zip(chunks, cur):
            _chunk(k, a, ch, row, words)
            if noff is not None:
                nxt.append(load(noff, ch))
        return nxt, st

    depth = spec.unroll  # rows whose loads are in flight ahead of the math
    if ring is not None:
        if spec.lut:
            ring.wait_table()
        stage = k.scale_stage
        if stage is None:
            with B.for_range(lo, hi, carry=state0) as loop:
                rg = B.cast_int(loop.iv, i64)
                cur = ring.take(arith.subi(rg, lo))
                _, st = visit(rg, cur, list(loop.carried), None)
                loop.yield_(*st)
        else:  # periods of F visits, each followed by its scale bytes' write
            f = arith.extui(i64, arith.shli(_c32(1), stage.f_log2))
            n = arith.subi(hi, lo)
            periods = arith.shrui(arith.addi(n, arith.subi(f, _c64(1))),
                                  arith.extui(i64, stage.f_log2))
            with B.for_range(_c64(0), periods, carry=state0) as outer:
                p = B.cast_int(outer.iv, i64)
                it0 = arith.muli(p, f)
                cnt = arith.minui(f, arith.subi(n, it0))
                with B.for_range(_c64(0), cnt, carry=list(outer.carried)) as loop:
                    j = B.cast_int(loop.iv, i64)  # the visit in the period
                    it = arith.addi(it0, j)
                    cur = ring.take(it)  # (a block barrier)
                    stage.begin(arith.trunci(i32, p), arith.trunci(i32, j))
                    _, st = visit(arith.addi(lo, it), cur, list(loop.carried), None)
                    loop.yield_(*st)
                outer.yield_(*loop.results)
            stage.finish(arith.trunci(i32, periods), arith.trunci(
                i32, arith.subi(n, arith.muli(arith.subi(periods, _c64(1)), f))))
    elif depth == 1:
        with B.for_range(lo, hi, carry=[wv for ws in first for wv in ws] + state0) as loop:
            rg = B.cast_int(loop.iv, i64)
            cur = [list(loop.carried[v * nw:(v + 1) * nw]) for v in range(w)]
            nxt, st = visit(rg, cur, list(loop.carried[w * nw:]),
                            row_off(clamp(arith.addi(rg, _c64(1)))))
            loop.yield_(*([wv for ws in nxt for wv in ws] + st))
    else:
        # depth 2, unrolled by 2 (the buffers rotate without register moves): sub-step d
        # quantizes row group rg + d from the buffers loaded two row groups earlier and
        # loads row group rg + d + 2 into them; the second sub-step runs when rg + 1 < hi
        # (block-uniform), its loads after its math
        second = [load(row_off(clamp(arith.addi(lo, _c64(1)))), ch) for ch in chunks]
        flat = [wv for ws in first + second for wv in ws]
        with B.for_range(lo, hi, 2, carry=flat + state0) as loop:
            rg = B.cast_int(loop.iv, i64)
            bufs = [list(loop.carried[v * nw:(v + 1) * nw]) for v in range(2 * w)]
            state = list(loop.carried[2 * w * nw:])
            nxt0, st = visit(rg, bufs[:w], state, row_off(clamp(arith.addi(rg, _c64(2)))))
            rg1 = arith.addi(rg, _c64(1))
            sb = B.if_(arith.cmpi(arith.CmpIPredicate.ult, rg1, hi), state_types)
            with sb.then():
                sb.yield_(*visit(rg1, bufs[w:], st, None)[1])
            with sb.else_():
                sb.yield_(*st)
            noff1 = row_off(clamp(arith.addi(rg, _c64(3))))
            nxt1 = [load(noff1, ch) for ch in chunks]
            loop.yield_(*([wv for ws in nxt0 + nxt1 for wv in ws] + list(sb.results)))
    # the padding scale words after the data (the stream kernel zeroes them first: ~2 more
    # dependent L2 round trips before the first math, with only the first loads in flight)
    QS._padding(k, kb, _Tid(tid), d1, share)


class _BulkRing:
    """The bulk schedule's shared ring (sm_90a): ``S = spec.bulk`` stages of one row group
    each (``rpb`` rows x the block's column span, fused: gate span then up span), filled with
    ``cp.async.bulk`` row copies completing on the stage's mbarrier (thread 0 arrives
    expecting the stage's bytes; the first thread of each row's lanes copies that row, its
    source row as :func:`_body`'s ``row_off``: row 0 past M, the gather's ``indices``).
    Row group ``lo + i`` is in stage ``i % S``; a visit waits for its stage's mbarrier
    (parity ``(i / S) & 1``), reads its chunks' 16-byte words from shared memory, passes a
    block barrier (every thread has read the stage) and the row leads refill the stage with
    row group ``lo + i + S``. ``S`` row groups (``S x 16 KB``, fused 32 KB) per block
    in flight, independent of registers."""

    def __init__(self, k: QI._Ctx, kb: B.KernelBuilder, tid: ir.Value, ci: ir.Value,
                 ri: ir.Value, cbt: ir.Value, lo: ir.Value, hi: ir.Value,
                 in_stride: ir.Value, chunks: list[_Chunk], row_off) -> None:
        from blockscale.compiler.arch import cpasync, tma
        from blockscale.compiler.arch import wgmma as W

        spec = k.spec
        i64, i32 = B.i64(), B.i32()
        a = kb.arg
        self.k, self.cp = k, cpasync
        self.stages, self.stage_bytes = spec.bulk, spec.stage_bytes
        self.silu = spec.mode == "silu"
        self.lo, self.n, self.row_off = lo, arith.subi(hi, lo), row_off
        self.buf = tma.extern_shared_buffer(kb, spec.dynamic_shared_bytes, align=128)
        self.base = W.shared_address(self.buf)
        self.bars = arith.addi(self.base, _c64(self.stages * self.stage_bytes))
        cb_log2 = arith.extui(i64, a("cb_log2"))
        span = arith.shli(_c64(16), cb_log2)  # elements of a block row
        cstart = arith.muli(B.cast_int(B.block_idx("x"), i64), span)
        ncols = a("k")
        self.ncols_bytes = arith.shli(ncols, _c64(1))
        valid = arith.minui(span, arith.subi(ncols, cstart))
        self.span_bytes = arith.trunci(i32, arith.shli(valid, _c64(1)))  # K % 8: 16 B units
        self.half_row = arith.trunci(i32, arith.shli(span, _c64(1)))  # the gate part's bytes
        self.row_bytes = arith.shli(self.half_row, _c32(1)) if self.silu else self.half_row
        rpb = arith.shrui(_c32(BLOCK_THREADS), arith.trunci(i32, cbt))
        self.tx = arith.muli(arith.muli(rpb, self.span_bytes), _c32(2 if self.silu else 1))
        self.src0 = arith.addi(cpasync.global_address(a("x")), arith.shli(cstart, _c64(1)))
        self.ri = ri
        self.row_lead = arith.cmpi(arith.CmpIPredicate.eq, ci, _c64(0))
        self.tid = tid
        self.is0 = arith.cmpi(arith.CmpIPredicate.eq, tid, _c64(0))
        # this thread's read offsets in a stage: its row, then each sub-chunk's bytes (a
        # column outside the block's span, a whole-padding block's column 0, reads the
        # row's first bytes: valid, unused)
        rowoff = arith.muli(ri, self.row_bytes)
        # lanes 4-7 of every 8 read their chunk's two 16-byte halves in the other order: a
        # quarter warp's LDS.128 then covers all 32 banks once (32-byte lane stride: 2-way
        # conflicts otherwise); _chunk swaps the packed halves back
        self.swap = None
        if k.chunk == 2 * CHUNK:
            self.swap = arith.cmpi(arith.CmpIPredicate.ne,
                                   arith.andi(ci, _c64(4)), _c64(0))
        self.reads = []
        for ch in chunks:
            offs = []
            for c in ch.ld_cols:
                rel = arith.subi(arith.extui(i64, c), cstart)
                rel = arith.select(arith.cmpi(arith.CmpIPredicate.slt, rel, _c64(0)), _c64(0), rel)
                offs.append(arith.addi(rowoff, arith.trunci(i32, arith.shli(rel, _c64(1)))))
            if self.swap is not None:
                offs = list(_swapped(self.swap, *offs))
            self.reads.append(offs)
        self.nfull = self.stages + (1 if spec.lut else 0)  # + the sigmoid table's
        with B.when(self.is0):
            for s in range(self.nfull):
                cpasync.mbarrier_init(self.bar(_c32(s)), 1)
            tma.fence_mbarrier_init()
        B.barrier()
        for s in range(self.stages):
            with B.when(arith.cmpi(arith.CmpIPredicate.ult, _c64(s), self.n)):
                self.fill(_c64(s))

    def copy_table(self, src: ir.Value, dst: ir.Value, n: int) -> None:
        """Copy the ``n``-entry f32 sigmoid table ``src`` (global) to the shared ``dst``:
        thread 0 bulk-copies its first ``n * 4 // 16 * 16`` bytes on the table's mbarrier
        (one L2 round trip, overlapping the prologue; the register fill waits ~n / 4096),
        threads ``< n % 4`` store the rest (seen after :meth:`wait_table`'s barrier)."""
        from blockscale.compiler.arch import wgmma as W

        cp = self.cp
        body, tail = n * 4 // 16 * 16, n % 4
        bar = self.bar(_c32(self.stages))
        with B.when(self.is0):
            cp.mbarrier_arrive_expect_tx_n(bar, _c32(body))
            cp.bulk_copy_n(W.shared_address(dst), cp.global_address(src), _c32(body), bar)
        if tail:
            tid = self.tid
            with B.when(arith.cmpi(arith.CmpIPredicate.ult, tid, _c64(tail))):
                idx = arith.addi(tid, _c64(body // 4))
                B.store(B.load(src, idx), dst, idx)

    def wait_table(self) -> None:
        """Every thread: wait for :meth:`copy_table`'s bulk copy (phase 0), then a block
        barrier (its tail stores)."""
        self.cp.mbarrier_wait(self.bar(_c32(self.stages)), _c32(0))
        B.barrier()

    def bar(self, slot: ir.Value) -> ir.Value:
        """The shared address of stage ``slot``'s mbarrier (``slot``: i32)."""
        return arith.addi(self.bars, arith.extui(B.i64(), arith.shli(slot, _c32(3))))

    def fill(self, i: ir.Value) -> None:
        """Issue the copies of row group ``lo + i`` (i64) into stage ``i % S``."""
        cp, i32, i64 = self.cp, B.i32(), B.i64()
        slot = arith.trunci(i32, arith.remui(i, _c64(self.stages)))
        bar = self.bar(slot)
        dst = arith.addi(self.base, arith.extui(i64, arith.addi(
            arith.muli(slot, _c32(self.stage_bytes)), arith.muli(self.ri, self.row_bytes))))
        with B.when(self.is0):
            cp.mbarrier_arrive_expect_tx_n(bar, self.tx)
        with B.when(self.row_lead):
            src = arith.addi(self.src0, arith.shli(self.row_off(arith.addi(self.lo, i)), _c64(1)))
            cp.bulk_copy_n(dst, src, self.span_bytes, bar)
            if self.silu:
                cp.bulk_copy_n(arith.addi(dst, arith.extui(i64, self.half_row)),
                               arith.addi(src, self.ncols_bytes), self.span_bytes, bar)

    def take(self, i: ir.Value) -> list[list[ir.Value]]:
        """Row group ``lo + i``'s words of this thread's chunks (as :func:`_body`'s loads),
        then the stage refilled with row group ``lo + i + S`` when there is one."""
        i32 = B.i32()
        slot = arith.trunci(i32, arith.remui(i, _c64(self.stages)))
        parity = arith.andi(arith.trunci(i32, arith.divui(i, _c64(self.stages))), _c32(1))
        self.cp.mbarrier_wait(self.bar(slot), parity)
        sbase = arith.muli(slot, _c32(self.stage_bytes))
        out = []
        for offs in self.reads:
            words = []
            for part in ((_c32(0), self.half_row) if self.silu else (_c32(0),)):
                for off in offs:
                    idx = arith.addi(arith.addi(sbase, off), part)
                    v = B.vector_load(B.vec(16, B.i8()), self.buf,
                                      arith.extui(B.i64(), idx), alignment=16)
                    words.append(vector.bitcast(B.vec(CHUNK // 2, i32), v))
            out.append(words)
        # a block barrier: every thread has read the stage, refill it. (A per-stage "read"
        # mbarrier that only the row leads wait for spilled 24 bytes in NVFP4 at 64
        # registers and added ~0.5 SASS per element.)
        B.barrier()
        nxt = arith.addi(i, _c64(self.stages))
        with B.when(arith.cmpi(arith.CmpIPredicate.ult, nxt, self.n)):
            self.fill(nxt)
        return out


class _ScaleStage:
    """The NVFP4 bulk kernels' scale bytes, written through shared memory. Stored directly, a
    thread's byte of chunk ``j`` goes to its 5-D place ``(j >> 2) * 512 + 16 * (r & 31) + 4 *
    (r >> 5) + (j & 3)``: a warp's byte store (32 chunks of one row) touches 8 lines, 4 bytes
    each; those stores cost 6 % of the grouped kernel's time (RESULTS run CB, 16384 x 8192:
    0.1087 ms with them, 0.1020 without).

    Instead each visit stores its bytes to a shared record (the row group's rows x the block's
    chunks). The row loop runs in periods of ``F = max(1, 8 / rows per group)`` visits
    (``quantize_grouped.SCALE_STAGE_ROWS`` rows); visit ``s`` of a period, right after the
    ring's barrier, writes slice ``s`` of the previous period's bytes as 4-byte words (a word
    for each of the first ``rec / 4`` threads), the 32 lanes of a store over the period's
    consecutive rows (8, or a row group's) and so few word columns: 8 rows' words of one
    512-byte atom share a line. Two record sets alternate (period parity): a set is rewritten
    only after the barrier that ends the period writing it. After the loop: a barrier, the
    rest. Per row the record keeps its scale base (-1: past M). Run CD: 0.1048 / 0.1056 vs
    0.1088 ms (81.9 / 81.4 % of the same-bytes copy), the fused kernel unchanged; writing a
    whole period at once after a barrier of its own was 7 % slower than the direct stores
    (run CC)."""

    def __init__(self, k: QI._Ctx, kb: B.KernelBuilder, a, tid: ir.Value, bx: ir.Value,
                 ci: ir.Value, ri: ir.Value, cbt: ir.Value, lw: int, rpb_log2: ir.Value,
                 d1: ir.Value) -> None:
        from blockscale.compiler.arch import tma

        i32 = B.i32()
        w = k.spec.wide
        self.rec = BLOCK_THREADS * w  # bytes a visit records
        self.set_bytes = QG.SCALE_STAGE_ROWS * self.rec
        self.buf = tma.shared_buffer(kb, f"{2 * self.set_bytes}xi8", align=16)
        self.bases = tma.shared_buffer(kb, f"{2 * QG.MAX_GROUP_ROWS}xi64", align=16)
        # the shared bytes the launch plan reserves for the stage (its blocks per SM)
        assert 2 * self.set_bytes + 2 * QG.MAX_GROUP_ROWS * 8 == QG.scale_stage_bytes(k.spec)
        self.scales, self.d1 = a("scales"), arith.trunci(i32, d1)  # d1: word columns a row
        self.tid = arith.trunci(i32, tid)
        cbt32 = arith.trunci(i32, cbt)
        self.j_log2 = arith.addi(cbt32, _c32(lw))  # chunks (bytes) of a row in the block
        self.j40 = arith.trunci(i32, arith.shrui(arith.shli(bx, _wide(self.j_log2)),
                                                 B.const(2, B.i64())))  # first word column
        self.rpb_log2 = rpb_log2
        rows_log2 = QG.SCALE_STAGE_ROWS.bit_length() - 1
        self.f_log2 = arith.select(  # visits a period
            arith.cmpi(arith.CmpIPredicate.slt, rpb_log2, _c32(rows_log2)),
            arith.subi(_c32(rows_log2), rpb_log2), _c32(0))
        self.rows_log2 = arith.addi(self.f_log2, rpb_log2)  # rows of a period
        self.period_rows = arith.shli(_c32(1), self.rows_log2)
        self.rpb_m1 = arith.subi(arith.shli(_c32(1), rpb_log2), _c32(1))
        self.ri = ri  # i32
        self.row_lead = arith.cmpi(arith.CmpIPredicate.eq, ci, B.const(0, B.i64()))
        # this thread's byte of chunk v in a record: row-major (row, chunk of the block row)
        self.own = arith.addi(arith.shli(self.ri, self.j_log2), arith.trunci(i32, ci))
        self.cbt = cbt32

    def begin(self, period: ir.Value, slot: ir.Value) -> None:
        """Visit ``slot`` of ``period`` (i32), after the ring's barrier: write slice ``slot``
        of the previous period's words (every put of it is before that barrier), then point
        the puts at this visit's record."""
        with B.when(arith.cmpi(arith.CmpIPredicate.sgt, period, _c32(0))):
            prev = arith.subi(period, _c32(1))
            with B.when(arith.cmpi(arith.CmpIPredicate.ult, self.tid, _c32(self.rec // 4))):
                self._write(prev, arith.addi(arith.muli(slot, _c32(self.rec // 4)), self.tid),
                            self.period_rows)
        parity = arith.andi(period, _c32(1))
        self.rec_off = arith.addi(arith.muli(parity, _c32(self.set_bytes)),
                                  arith.muli(slot, _c32(self.rec)))
        self.row_idx = arith.addi(arith.muli(parity, _c32(QG.MAX_GROUP_ROWS)),
                                  arith.addi(arith.shli(slot, self.rpb_log2), self.ri))

    def put_row(self, row_ok: ir.Value, srow_base: ir.Value) -> None:
        """The visit's row's scale base (-1 past M), from the row's first thread."""
        with B.when(self.row_lead):
            B.store(arith.select(row_ok, srow_base, B.const(-1, B.i64())), self.bases,
                    _wide(self.row_idx))

    def put(self, v: int, byte: ir.Value) -> None:
        """This thread's scale byte (i8) of its chunk ``v``."""
        idx = arith.addi(self.rec_off, arith.addi(self.own, arith.shli(_c32(v), self.cbt)))
        B.store(byte, self.buf, _wide(idx))

    def finish(self, periods: ir.Value, last_visits: ir.Value) -> None:
        """After the loop (``periods`` >= 0 periods, the last of ``last_visits`` visits): a
        barrier, the slices of the second-to-last period the last one did not write, then
        the last period's words."""
        B.barrier()
        words = arith.muli(_c32(self.rec // 4), arith.shli(_c32(1), self.f_log2))
        last = arith.subi(periods, _c32(1))
        done = arith.muli(last_visits, _c32(self.rec // 4))  # words of last - 1 written
        with B.when(arith.cmpi(arith.CmpIPredicate.sgt, periods, _c32(0))):
            for s_ in range(QG.SCALE_STAGE_ROWS * self.rec // 4 // BLOCK_THREADS):
                n = arith.addi(_c32(s_ * BLOCK_THREADS), self.tid)
                in_period = arith.cmpi(arith.CmpIPredicate.ult, n, words)
                rest = arith.andi(in_period, arith.andi(
                    arith.cmpi(arith.CmpIPredicate.uge, n, done),
                    arith.cmpi(arith.CmpIPredicate.sgt, last, _c32(0))))
                with B.when(rest):
                    self._write(arith.subi(last, _c32(1)), n, self.period_rows)
                with B.when(in_period):
                    self._write(last, n, arith.shli(last_visits, self.rpb_log2))

    def _write(self, period: ir.Value, n: ir.Value, valid_rows: ir.Value) -> None:
        """Word ``n`` of ``period``'s records (row ``n % rows``, word column ``n / rows``,
        rows = F x rows per group) to its scale place, if its row is below ``valid_rows``,
        in the matrix (base >= 0) and its column in the scale row."""
        parity = arith.andi(period, _c32(1))
        r = arith.andi(n, arith.subi(self.period_rows, _c32(1)))
        q = arith.shrui(n, self.rows_log2)
        j4 = arith.addi(self.j40, q)
        ok = arith.andi(arith.cmpi(arith.CmpIPredicate.ult, r, valid_rows),
                        arith.cmpi(arith.CmpIPredicate.ult, j4, self.d1))
        with B.when(ok):
            slot = arith.shrui(r, self.rpb_log2)
            rin = arith.andi(r, self.rpb_m1)
            src = arith.addi(arith.addi(arith.muli(parity, _c32(self.set_bytes)),
                                        arith.muli(slot, _c32(self.rec))),
                             arith.addi(arith.shli(rin, self.j_log2), arith.shli(q, _c32(2))))
            base = B.load(self.bases, _wide(arith.addi(
                arith.muli(parity, _c32(QG.MAX_GROUP_ROWS)), r)))
            with B.when(arith.cmpi(arith.CmpIPredicate.sge, base, B.const(0, B.i64()))):
                word = B.vector_load(B.vec(4, B.i8()), self.buf, _wide(src), alignment=4)
                B.vector_store(word, self.scales,
                               arith.addi(base, arith.shli(_wide(j4), B.const(9, B.i64()))),
                               alignment=4)


#: groups (from the block's first) whose NVFP4 reciprocals the shared table holds
TABLE_GROUPS = 4


def _fill_recip_table(k: QI._Ctx, kb: B.KernelBuilder, a, tid: ir.Value,
                      g0: ir.Value) -> ir.Value:
    """Shared f32[TABLE_GROUPS * 128]: entry ``s * 128 + b`` is D2's reciprocal for scale
    byte ``b`` under group ``g0 + s``'s tensor scale, computed as the group state computes
    it (:func:`_quantize_stream_ir.group_state`: the same bits); one barrier."""
    from blockscale.compiler.arch import tma

    i32 = B.i32()
    n = TABLE_GROUPS * 128
    buf = tma.shared_buffer(kb, f"{n}xf32", align=16)
    ng = arith.extui(B.i64(), a("num_groups"))
    for i in range(n // BLOCK_THREADS):
        e = arith.addi(tid, _c64(BLOCK_THREADS * i))
        g = arith.addi(g0, arith.shrui(e, _c64(7)))
        g = arith.select(arith.cmpi(arith.CmpIPredicate.ult, g, ng), g, g0)
        expert = B.load(a("expert_ids"), g)
        ex = arith.select(arith.cmpi(arith.CmpIPredicate.sge, expert, _c32(0)), expert, _c32(0))
        v = B.load(a("tensor_sf"), B.cast_int(ex, B.index(), signed=True))
        tsf = arith.divf(QI._cf(1.0), v) if k.spec.mode == "silu" else v
        inv_tsf = arith.divf(QI._cf(1.0), tsf)
        byte = arith.trunci(i32, arith.andi(e, _c64(127)))
        B.store(QI._nvfp4_recip(byte, QI._e4m3_decode(k, byte), inv_tsf), buf, e)
    B.barrier()
    return buf


def _scale_and_recip_table(k: QI._Ctx, amax_bits: ir.Value, row: _Row
                           ) -> tuple[ir.Value, ir.Value, ir.Value]:
    """NVFP4 (scale byte, reciprocal, decoded scale) of D2 as :func:`quantize_ir.
    _scale_and_recip`, the reciprocal read from the block's table when the row's group has a
    slot there (else div.rn, as the stream kernel)."""
    from blockscale.compiler.arch import convert as C
    from blockscale.formats import RECIP_E2M1_MAX

    f32 = B.f32()
    amax = arith.bitcast(f32, amax_bits)
    s = arith.mulf(row.tsf, arith.mulf(amax, QI._cf(RECIP_E2M1_MAX)))
    byte = C.convert(s, "f32", "e4m3", rounding="rn", target=k.target)
    sd = QI._e4m3_decode(k, byte)
    br = B.if_(arith.cmpi(arith.CmpIPredicate.ult, row.slot, _c32(TABLE_GROUPS)), [f32])
    with br.then():
        idx = arith.addi(arith.shli(row.slot, _c32(7)), byte)
        br.yield_(B.load(k.recip_table, arith.extui(B.i64(), idx)))
    with br.else_():
        br.yield_(QI._nvfp4_recip(byte, sd, row.inv_tsf))
    return byte, br.results[0], sd


#: table entries a thread loads before storing them (the fill's loads in flight at once)
LUT_BATCH = 16


def _fill_lut(src: ir.Value, lut: ir.Value, tid: ir.Value, n: int) -> None:
    """Copy the ``n``-entry sigmoid table to shared memory: each thread's ~n / 256 entries
    in straight-line batches of LUT_BATCH loads (in-bounds clamped indices) followed by their
    predicated stores, so a block waits ~n / (256 * LUT_BATCH) L2 round trips, not one per
    loop iteration (~8 for SILU's 7654 entries with a 4-way unrolled loop)."""
    per = -(-n // BLOCK_THREADS)
    for b0 in range(0, per, LUT_BATCH):
        vals = []
        for i in range(b0, min(per, b0 + LUT_BATCH)):
            idx = arith.addi(tid, _c64(BLOCK_THREADS * i))
            ok = arith.cmpi(arith.CmpIPredicate.ult, idx, _c64(n))
            vals.append((ok, idx, B.load(src, arith.select(ok, idx, _c64(0)))))
        for ok, idx, v in vals:
            with B.when(ok):
                B.store(v, lut, idx)


class _Tid:
    """The one field of quantize_ir._Coords that the stream padding pass reads."""

    def __init__(self, tid: ir.Value) -> None:
        self.tid = tid


class _Row:
    """Per-visit facts shared by a row's chunks."""

    def __init__(self, row_ok, active, tsf, inv_tsf, srow_base, drow_base, lane0,
                 k16) -> None:
        self.row_ok, self.active, self.tsf, self.inv_tsf = row_ok, active, tsf, inv_tsf
        self.srow_base, self.drow_base, self.lane0 = srow_base, drow_base, lane0
        self.k16 = k16
        self.not_k16 = arith.xori(k16, B.const(True, B.i1()))


def _first_group(k: QI._Ctx, a, tid: ir.Value, row: ir.Value) -> ir.Value:
    """A group (i64) to start from for data row ``row`` (i32, block-uniform): the number of
    g in [1, min(G, warp * SCAN_UNROLL)) with expert_start[g] <= row (a prefix, as
    expert_start rises from 0), i.e. ``row``'s group when that is < warp * SCAN_UNROLL, else
    a group whose end is <= row, which the loop's group check then replaces (binary search).
    Straight-line: each lane tests SCAN_UNROLL entries with independent loads (one L2 round
    trip), xor shuffles add the counts (convergent: no branch before them)."""
    i64, i32 = B.i64(), B.i32()
    es = a("expert_start")
    ng = arith.extui(i64, a("num_groups"))
    ws = k.target.warp_size
    lane = arith.andi(tid, _c64(ws - 1))
    cnt = _c32(0)
    for u in range(SCAN_UNROLL):
        g = arith.addi(lane, _c64(u * ws + 1))
        ok = arith.cmpi(arith.CmpIPredicate.ult, g, ng)
        le = arith.cmpi(arith.CmpIPredicate.sle, B.load(es, arith.select(ok, g, _c64(0))), row)
        cnt = arith.addi(cnt, arith.extui(i32, arith.andi(ok, le)))
    width = _c32(ws)
    off = 1
    while off < ws:
        cnt = arith.addi(cnt, gpu.shuffle(cnt, _c32(off), width, gpu.ShuffleMode.XOR)[0])
        off *= 2
    return arith.extui(i64, cnt)


def _chunk(k: QI._Ctx, a, ch: _Chunk, row: _Row, words: list[ir.Value]) -> None:
    """Quantize one chunk of the row from its loaded ``words``: the D2 chain, one vector
    store of its data, its scale byte from the scale block's first lane."""
    spec = k.spec
    i32 = B.i32()
    nh = k.chunk // CHUNK
    if spec.mode == "silu":
        act = QM._activation_lut if k.lut is not None else (
            lambda _k, g, u, _s: QI._activation(spec, g, u))
        halves = []
        for h in range(nh):
            gw, uw = words[h], words[nh + h]
            sigs = QM._lut_sigs(k, gw) if k.lut is not None else [None] * CHUNK
            bits = [arith.bitcast(i32, act(k, arith.bitcast(B.f32(), gv),
                                           arith.bitcast(B.f32(), uv), sg))
                    for gv, uv, sg in zip(QI.widen_vector(gw), QI.widen_vector(uw), sigs)]
            halves.append((bits, None))
        amax = _amax_f32(k, [b for hb, _ in halves for b in hb])
    else:
        halves = [(QI.widen_vector(wv), wv) for wv in words]
        amax = QI._block_amax_bits(k, [b for hb, _ in halves for b in hb], list(words))
    nonfinite = arith.cmpi(arith.CmpIPredicate.uge, amax, _c32(0x7F800000))
    safe_amax = arith.select(nonfinite, _c32(0), amax)
    if k.recip_table is not None:
        byte, recip, sd = _scale_and_recip_table(k, safe_amax, row)
    else:
        byte, recip, sd = QI._scale_and_recip(k, safe_amax, row.tsf, row.inv_tsf)
    byte = arith.select(nonfinite, _c32(0xFF if k.fmt.is_mx else 0x7F), byte)
    xs_h = [[arith.bitcast(B.f32(), b) for b in hb] for hb, _ in halves]
    if getattr(k, "mx_bf16x2", False):
        from blockscale.ops.quantize_pipe_ir import e2m1x8_mx_bf16x2

        rbits = arith.bitcast(i32, recip)
        packed = [[e2m1x8_mx_bf16x2(wv, rbits, spec.rounding != "up")] for _, wv in halves]
    elif k.fmt.is_fp4 and QI._fast_e2m1(k) and _unsat_room(spec):
        # bulk kernels with >= 80 registers and wide4 (128; room for the saturating copy of
        # the packing: in the 64-register kernels it raised the spills from 0-4 to 16-40
        # bytes, in wide_deep's 80 to 76)
        packed = [[wd] for wd in _pack_fp4_unsat(k, xs_h, recip, sd, safe_amax,
                                             [wv for _, wv in halves])]
    elif k.fmt.is_fp4:
        packed = [[wd] for wd in QI._pack_fp4_all(k, xs_h, recip, sd, [wv for _, wv in halves])]
    else:
        packed = [QI._pack_e4m3(k, xs, recip) for xs in xs_h]
    zero = arith.ori(nonfinite, arith.xori(row.active, B.const(True, B.i1())))
    out = [arith.select(zero, _c32(0), wd) for ws in packed for wd in ws]
    per_half = len(packed[0])
    if k.half_swap is not None:  # the ring gave this lane its halves in swapped order
        pairs = [_swapped(k.half_swap, lo, hi)
                 for lo, hi in zip(out[:per_half], out[per_half:])]
        out = [p[0] for p in pairs] + [p[1] for p in pairs]
    base = arith.addi(row.drow_base, _wide(ch.dcol))
    data = a("data")

    def store(words: list[ir.Value], off: ir.Value, ok: ir.Value) -> None:
        with B.when(ok):
            nbytes = 4 * len(words)
            bv = vector.bitcast(B.vec(nbytes, B.i8()),
                                vector.from_elements(B.vec(len(words), i32), words))
            B.vector_store(bv, data, off, alignment=nbytes)

    # K % 16 == 0 (block-uniform): one 8- / 16-byte store per chunk; else (rows only 4- /
    # 8-byte aligned) one store per sub-chunk, as the stream kernel
    store(out, base, arith.andi(row.row_ok, arith.andi(row.k16, ch.col_ok)))
    half_bytes = _c64(4 * per_half)
    for h in range(nh):
        ok = arith.andi(arith.andi(row.row_ok, row.not_k16), ch.okh[h])
        store(out[h * per_half:(h + 1) * per_half],
              arith.addi(base, arith.muli(half_bytes, _c64(h))) if h else base, ok)
    has_data = arith.andi(arith.andi(row.row_ok, ch.col_ok), row.active)
    sval = arith.trunci(B.i8(), arith.select(has_data, byte, _c32(0)))
    if k.scale_stage is not None:
        k.scale_stage.put(ch.v, sval)
        return
    with B.when(arith.andi(arith.andi(row.lane0, ch.chunk_ok), row.row_ok)):
        B.store(sval, a("scales"), arith.addi(row.srow_base, _wide(ch.s_jpart)))


def _amax_f32(k: QI._Ctx, bits: list[ir.Value]) -> ir.Value:
    """:func:`quantize_ir._block_amax_bits` of f32 bit patterns as float ``maximum`` of
    absolute values (``max.NaN``: a NaN wins, as the unsigned max of the magnitude bits
    makes it; +-0 are both +0 after abs): one FMNMX an element (abs is an operand modifier)
    instead of an and plus half a three-input integer max; then the scale block's lanes.
    CUDA (``max.NaN.f32``, no flush of subnormals); other targets: the integer max."""
    if not k.target.is_cuda:
        return QI._block_amax_bits(k, bits)
    f32 = B.f32()
    m = None
    for b in bits:
        a = mmath.absf(arith.bitcast(f32, b))
        m = a if m is None else arith.maximumf(m, a)
    m = arith.bitcast(B.i32(), m)
    width = _c32(k.target.warp_size)
    off = 1
    while off < k.lanes:
        m = arith.maxui(m, gpu.shuffle(m, _c32(off), width, gpu.ShuffleMode.XOR)[0])
        off *= 2
    return m


def _unsat_room(spec: MoeQuantizeSpec) -> bool:
    """Whether the kernel's register cap leaves room for :func:`_pack_fp4_unsat`'s second
    packing: bulk kernels with >= 80 registers, register-fed ones with >= 128 (wide4)."""
    from blockscale.ops.quantize_grouped import wide_register_cap

    return wide_register_cap(spec) >= (80 if spec.bulk else 128)


#: the chunk's |y| bound below which :func:`convert.e2m1x8_pack_unsat` gives the saturated
#: codes: ``t = fma(a, a, 12)`` < 61 keeps ``T = bits(t) & 0x7F800000`` at 2^3 / 2^4 / 2^5 and
#: in (6, 7) the step-2 grid rounds to 6 (code 7), as the saturated value does
E2M1_UNSAT_BOUND = 7.0


def _pack_fp4_unsat(k: QI._Ctx, xs_h: list[list[ir.Value]], recip: ir.Value, sd: ir.Value,
                amax_bits: ir.Value, pairs_h: list[ir.Value | None]) -> list[ir.Value]:
    """:func:`quantize_ir._pack_fp4_all` (sm_90a, NVFP4 / MXFP4 without bf16x2: the fused
    bulk kernels and wide4) as :func:`convert.e2m1x8_pack_unsat` of ``y = x * recip`` for
    the chunks whose ``fl(amax * recip) < 7`` (chunk-uniform, nearly all): every ``|y| =
    fl(|x| * recip) <= fl(amax * recip)`` (RN is monotonic), and below 7 the unsaturated
    rounding gives the saturated codes (:data:`E2M1_UNSAT_BOUND`; exhaustively checked in
    tests/test_quantize_moe_bulk.py). It needs no saturation, no nibble-8 fix and no ``|x|``
    beside the amax's (the fused kernels' amax and ``sat(|x| * recip / 8)`` would share one
    materialized abs). The others (a saturating scale, an E4M3-subnormal scale, ``recip =
    +inf``: NaN / Inf products compare false) take :func:`quantize_ir._pack_fp4_min`."""
    f32, i32 = B.f32(), B.i32()
    bound = arith.mulf(arith.bitcast(f32, amax_bits), recip)
    fast = arith.cmpf(arith.CmpFPredicate.OLT, bound, QI._cf(E2M1_UNSAT_BOUND))
    br = B.if_(fast, [i32] * len(xs_h))
    with br.then():
        out = []
        for xs, p in zip(xs_h, pairs_h):
            words = QI.sign_words(xs, p)
            out.append(e2m1x8_pack_unsat([arith.mulf(x, recip) for x in xs], words))
        br.yield_(*out)
    with br.else_():
        br.yield_(*QI._pack_fp4_min(k, xs_h, recip, pairs_h))
    return list(br.results)


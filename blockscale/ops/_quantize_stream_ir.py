"""Kernel IR of the "stream" schedule of grouped and fused-activation quantize (sm_90a first).

The data rows of a grouped quantize are contiguous in ``x`` and in ``data`` (rows sorted by
expert): only the scale placement (``tile0(g)`` + the row's offset in its group), the
tensor scale and the padding scale rows depend on the groups. This schedule therefore runs
the dense pipelined kernel's loop (:mod:`blockscale.ops.quantize_pipe_ir`) over data rows:

* one resident wave of ``gy`` blocks (:func:`blockscale.ops.quantize_grouped.stream_plan`);
  block ``by`` takes the contiguous share ``[by * n / gy, (by + 1) * n / gy)`` of the
  ``n = ceil(M / rpb)`` row groups (no padding slots are visited as data);
* no shared-memory group tables, no prefix sum, no barrier (except the fused ``lut``
  variant's one table fill): each thread carries its current group (start row, end row,
  first tile, expert id, tensor scale and its reciprocal) and re-finds it only when a row
  leaves it (binary search over ``expert_start`` in global memory, ``search_steps``
  halvings; rows ascend within a block, so that is about once per block);
* (``unroll = 2``) its first row group's loads are issued first; then the block zeroes its
  share of the padding scale words (tile, pair of 512-byte atoms units; a tile's owner and
  covered rows from :func:`blockscale.ops.quantize_ir._find_group` with the warp scan, once
  per tile change) while they are in flight;
* ``unroll = 2``: the loads of row group ``g + 1`` are issued before the math of ``g``
  (the raw 16-byte words are loop-carried);
* NVFP4: the scale reciprocal is D2's division per scale block (no shared table, so no
  barrier on a group change; a two-group shared table was tried: ~0.5 instruction per
  element fewer on the hot path, at the cost of 3 binary searches + a barrier before the
  loop and more spills: dropped);
* grouped MXFP4 on sm_90a: the E2M1 rounding on bf16 pairs
  (:func:`quantize_pipe_ir.e2m1x8_mx_bf16x2`, the dense kernel's ``bf16x2`` variant).

Performance model (sm_90a; H200 132 SMs x 4 schedulers at ~1.98 GHz = 1.05e12 warp
instructions/s; bench shape T = 8192, K = 4096 (fused D = 2048), 64 experts). SASS of the
data loop per element (``tools``-style count: the loop minus the group-lookup branch; cold
NaN / div.rn slow-path branches included), registers at the cap, spills:

=============  ===============  ===============  ==================  ===================
kernel         stream           stream2          stream_lut          stream2_lut
=============  ===============  ===============  ==================  ===================
grouped NVFP4  21.4 (39, 0)     20.9 (48, 0)     --                  --
grouped MXFP4  15.1 (48, 0)     13.6 (48, 0)     --                  --
grouped MXFP8  10.6 (40, 0)     10.1 (48, 0)     --                  --
fused NVFP4    69.8 (64, 0)     69.4 (80, 0)     33.4 (58, 0)        34.0 (64, 8)
fused MXFP4    67.1 (64, 0)     67.7 (80, 4)     30.4 (59, 0)        30.9 (63, 0)
fused MXFP8    58.9 (64, 4)     59.5 (80, 0)     20.2 (61, 0)        23.2 (62, 0)
=============  ===============  ===============  ==================  ===================

(Same counter on the tile kernel's hot loop: grouped 18.5 / 16.7 / 9.3; the stream loop
pays ~35 instructions per 16-element visit for the row, group check and scale address.)
Issue time at full issue rate = SASS/elem x 33.5 M / 32 / 1.05e12: grouped NVFP4 ~21-22 us,
MXFP4 ~13-15 us, MXFP8 ~10 us, against ~22-26 us of HBM traffic (88 / 102 MB): MXFP8 and
MXFP4 should be memory-bound, NVFP4 at the issue limit. Predicted (fixed launch / ramp cost
~4 us): MXFP8 / MXFP4 ~80-90 % of the input-copy ceiling, NVFP4 ~65-75 %; fused table
kernels (16.8 M outputs, 76 MB): ~17 / 16 / 11 us issue, ~75-85 %.

Numerics, packing and stores are the rows kernel's (:func:`quantize_moe_ir._quantize`, the
tile kernel's helpers): the bytes are identical on every target. Aligned kernels only (16
elements per thread); unaligned specs keep the tile schedule (``with_schedule``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as B
from blockscale.ops import quantize_ir as QI
from blockscale.ops import quantize_moe_ir as QM
from blockscale.ops.quantize_ir import CHUNK, _c32, _c64, _cf

if TYPE_CHECKING:
    from blockscale.ops.quantize_grouped import MoeQuantizeSpec

BLOCK_THREADS = 256


def build(spec: MoeQuantizeSpec) -> ir.Module:
    """The ``gpu.module`` of the stream-schedule kernel of ``spec`` (module docstring)."""
    from blockscale.ops.quantize_grouped import stream_register_cap

    k = QI._Ctx(spec)
    if k.chunk <= CHUNK:
        raise ValueError(f"the stream schedule needs an aligned spec (K % 8 == 0), got "
                         f"aligned={spec.aligned}")
    return capped_module(k, spec, stream_register_cap(spec), _body)


def capped_module(k: QI._Ctx, spec: MoeQuantizeSpec, register_cap: int,
                  body: Any) -> ir.Module:
    """The verified kernel module of ``spec`` with :data:`BLOCK_THREADS` threads, whose
    function ``body(k, kb)`` emits, capped at ``register_cap`` registers on CUDA targets (the
    stream and wide schedules)."""
    with ir.Context(), ir.Location.unknown():
        with B.kernel_module(spec.kernel_name, spec.target, spec.args(),
                             (BLOCK_THREADS, 1, 1)) as kb:
            if k.target.is_cuda:
                kb.func.attributes["nvvm.maxnreg"] = ir.IntegerAttr.get(B.i32(), register_cap)
            body(k, kb)
        kb.module.operation.verify()
        return kb.module


def _body(k: QI._Ctx, kb: B.KernelBuilder) -> None:
    spec = k.spec
    i64, i32 = B.i64(), B.i32()
    a = kb.arg
    silu = spec.mode == "silu"
    nvfp4 = not k.fmt.is_mx
    ncols, kblocks_row = a("k"), a("kblocks_row")
    co = QI._coords(k, kb)
    tid, j, col0, col_ok = co.tid, co.j, co.col0, co.col_ok
    in_stride = arith.shli(ncols, _c64(1)) if silu else ncols
    ld_cols = QM.subchunk_columns(k, j, col0, col_ok, ncols)  # the tile kernel's load rule
    d1 = arith.shrui(kblocks_row, _c64(2))
    s_jpart = arith.addi(arith.shli(arith.shrui(j, _c64(2)), _c64(9)), arith.andi(j, _c64(3)))
    m32 = arith.trunci(i32, a("m"))
    rpb_log2 = arith.trunci(i32, co.rpb_log2)
    ri = arith.trunci(i32, co.ri)
    rpb = arith.shli(_c32(1), rpb_log2)
    n_rg = arith.extui(i64, arith.shrui(arith.addi(m32, arith.subi(rpb, _c32(1))), rpb_log2))
    gy = B.cast_int(B.grid_dim("y"), i64)
    by = co.by

    def share(n: ir.Value) -> tuple[ir.Value, ir.Value]:
        """This block's contiguous share [lo, hi) of n units (i64)."""
        return (arith.divui(arith.muli(by, n), gy),
                arith.divui(arith.muli(arith.addi(by, _c64(1)), n), gy))

    lo, hi = share(n_rg)
    x = a("x")
    vt, wt = B.vec(CHUNK, B.bf16()), B.vec(CHUNK // 2, i32)

    def drow_of(rg: ir.Value) -> ir.Value:
        return arith.addi(arith.shli(arith.trunci(i32, rg), rpb_log2), ri)

    def load(rg: ir.Value) -> list[ir.Value]:
        """The raw words (vector<4xi32> per sub-chunk; silu: gate ones, then up ones) of
        this thread's chunk of row group ``rg``'s row (row 0 past M: valid, unused)."""
        drow = drow_of(rg)
        row_ok = arith.cmpi(arith.CmpIPredicate.slt, drow, m32)
        srow = arith.select(row_ok, drow, _c32(0))
        if spec.gather:
            src = B.load(a("indices"), arith.extui(i64, srow))
            srow = arith.divui(src, a("indices_divisor"))
        row_off = arith.muli(arith.extui(i64, srow), in_stride)
        out = []
        for base in ((row_off, arith.addi(row_off, ncols)) if silu else (row_off,)):
            for c in ld_cols:
                v = B.vector_load(vt, x, arith.addi(base, c), alignment=16)
                out.append(vector.bitcast(wt, v))
        return out

    # unroll 2: the first row group's loads go out before the table fill and the padding
    first_words = load(lo) if spec.unroll == 2 else None
    # grouped MXFP4 on sm_90a: E2M1 on bf16 pairs from the loaded words (the dense
    # pipelined kernel's bf16x2 variant; exact, as MX reciprocals are powers of two)
    k.mx_bf16x2 = (spec.mode == "grouped" and spec.fmt == "mxfp4"
                   and k.target.name == "sm_90a")
    k.lut = None
    if spec.lut:  # the sigmoid table to shared memory (one barrier)
        from blockscale.compiler.arch import tma
        from blockscale.ops.quantize_silu import MAX_LUT, sigmoid_lut

        _, lut_lo, lut_w = sigmoid_lut(spec.activation, spec.act_alpha, spec.act_limit)
        lut = tma.shared_buffer(kb, f"{MAX_LUT}xf32", align=16)
        with B.for_range(tid, _c64(2 * lut_w), BLOCK_THREADS) as cl:
            i = B.cast_int(cl.iv, i64)
            B.store(B.load(a("sig_table"), i), lut, i)
        B.barrier()
        k.lut = (lut, lut_lo, lut_w)

    # ---- group state: (end row, start row, first tile, expert[, tsf, 1/tsf]) -------------
    state_types = [i32] * 4 + ([B.f32(), B.f32()] if nvfp4 else [])
    state0 = [_c32(0)] * 4 + ([_cf(1.0), _cf(1.0)] if nvfp4 else [])

    def find(row: ir.Value) -> list[ir.Value]:
        return group_state(k, a, search(a, row))

    def visit(rg: ir.Value, words: list[ir.Value], state: list[ir.Value]) -> list[ir.Value]:
        """Quantize row group ``rg`` from its loaded ``words``; returns the new state."""
        drow = drow_of(rg)
        row_ok = arith.cmpi(arith.CmpIPredicate.slt, drow, m32)
        rowc = arith.minsi(drow, arith.subi(m32, _c32(1)))
        sb = B.if_(arith.cmpi(arith.CmpIPredicate.sge, rowc, state[0]), state_types)
        with sb.then():
            sb.yield_(*find(rowc))
        with sb.else_():
            sb.yield_(*state)
        st = list(sb.results)
        _end, start, t0, expert = st[:4]
        tsf, inv_tsf = (st[4], st[5]) if nvfp4 else (None, None)
        active = arith.cmpi(arith.CmpIPredicate.sge, expert, _c32(0))
        rel = arith.subi(rowc, start)
        tile = arith.extui(i64, arith.addi(t0, arith.shrui(rel, _c32(7))))
        rr = arith.extui(i64, arith.andi(rel, _c32(127)))
        tile_soff = arith.shli(arith.muli(tile, d1), _c64(9))
        halves = []
        nh = k.chunk // CHUNK
        for h in range(nh):
            colh = arith.addi(col0, _c64(CHUNK * h))
            okh = col_ok if h == 0 else arith.cmpi(arith.CmpIPredicate.ult, colh, ncols)
            if silu:
                gw, uw = words[h], words[nh + h]
                halves.append((colh, okh, (QI.widen_vector(gw), QI.widen_vector(uw)), gw))
            else:
                halves.append((colh, okh, QI.widen_vector(words[h]), words[h]))
        QM._quantize(k, a, co, halves, arith.extui(i64, drow), row_ok, active, tsf, inv_tsf,
                     tile_soff, s_jpart, rr)
        return st

    _padding(k, kb, co, d1, share)

    if spec.unroll == 1:
        with B.for_range(lo, hi, carry=state0) as loop:
            rg = B.cast_int(loop.iv, i64)
            loop.yield_(*visit(rg, load(rg), list(loop.carried)))
        return
    nw = len(first_words)
    with B.for_range(lo, hi, carry=first_words + state0) as loop:
        rg = B.cast_int(loop.iv, i64)
        cur = list(loop.carried[:nw])
        nxt_rg = arith.addi(rg, _c64(1))
        nxt = load(arith.select(arith.cmpi(arith.CmpIPredicate.ult, nxt_rg, hi), nxt_rg, rg))
        st = visit(rg, cur, list(loop.carried[nw:]))
        loop.yield_(*(nxt + st))


def search(a, row: ir.Value) -> ir.Value:
    """The group (i64) holding data row ``row`` (i32, < M): the last g with expert_start[g]
    <= row (empty groups share their start with the next: never), ``search_steps``
    halvings of [0, G) in global memory."""
    i64 = B.i64()
    es = a("expert_start")
    with B.for_range(0, arith.extui(i64, a("search_steps")),
                     carry=[_c64(0), arith.extui(i64, a("num_groups"))]) as sl:
        glo, ghi = sl.carried
        mid = arith.shrui(arith.addi(glo, ghi), _c64(1))
        le = arith.cmpi(arith.CmpIPredicate.sle, B.load(es, mid), row)
        sl.yield_(arith.select(le, mid, glo), arith.select(le, ghi, mid))
    return sl.results[0]


def group_state(k: QI._Ctx, a, g: ir.Value) -> list[ir.Value]:
    """Group ``g``'s state (i64 index): end row, start row, first tile, expert id (i32)
    and for NVFP4 its tensor scale (fused: 1 / input scale) and that value's reciprocal."""
    es, offs, ids = a("expert_start"), a("scales_offsets"), a("expert_ids")
    start = B.load(es, g)
    end = B.load(es, arith.addi(g, _c64(1)))
    t0 = arith.addi(arith.shrui(start, _c32(7)), B.load(offs, g))
    expert = B.load(ids, g)
    out = [end, start, t0, expert]
    if not k.fmt.is_mx:
        e = arith.select(arith.cmpi(arith.CmpIPredicate.sge, expert, _c32(0)), expert,
                         _c32(0))
        v = B.load(a("tensor_sf"), B.cast_int(e, B.index(), signed=True))
        tsf = arith.divf(_cf(1.0), v) if k.spec.mode == "silu" else v
        out += [tsf, arith.divf(_cf(1.0), tsf)]
    return out


def _padding(k: QI._Ctx, kb: B.KernelBuilder, co: QI._Coords, d1: ir.Value, share) -> None:
    """Zero the scale words of rows no data row covers: rows ``[rows_valid, 128)`` of every
    tile (all 128 of a spare tile), this x-block's atoms. Units are (tile, pair of atoms):
    thread ``t`` takes row ``t & 127`` of atom ``2 * pair + (t >> 7)``; the block's share is
    contiguous, so the owner lookup (block-uniform: the warp scan's shuffles stay
    convergent) runs once per tile."""
    i64 = B.i64()
    tid = co.tid
    cb = arith.extui(i64, kb.arg("cb_log2"))
    per_x = arith.shli(_c64(1), arith.subi(cb, _c64(k.lanes_log2 + 2)))
    a0 = arith.muli(B.cast_int(B.block_idx("x"), i64), per_x)
    na = arith.minsi(per_x, arith.subi(d1, a0))
    npairs = arith.shrui(arith.addi(na, _c64(1)), _c64(1))
    n_tiles = kb.arg("n_tiles")
    p_lo, p_hi = share(arith.muli(n_tiles, npairs))
    row = arith.andi(tid, _c64(127))
    half = arith.shrui(tid, _c64(7))
    rpart = arith.ori(arith.shli(arith.andi(row, _c64(31)), _c64(4)),
                      arith.shli(arith.shrui(row, _c64(5)), _c64(2)))
    zero = arith.constant(B.vec(4, B.i8()), ir.DenseElementsAttr.get_splat(
        B.vec(4, B.i8()), ir.IntegerAttr.get(B.i8(), 0)))
    with B.for_range(p_lo, p_hi, carry=[_c64(-1), _c64(0)]) as loop:
        p = B.cast_int(loop.iv, i64)
        tile = arith.divui(p, npairs)
        pair = arith.subi(p, arith.muli(tile, npairs))
        sb = B.if_(arith.cmpi(arith.CmpIPredicate.ne, tile, loop.carried[0]), [i64, i64])
        with sb.then():
            tile_ok = B.const(True, B.i1())
            sb.yield_(tile, QI._find_group(k, kb, tile, tile_ok, scan=True)[1])
        with sb.else_():
            sb.yield_(*loop.carried)
        cur, rv = sb.results
        atom = arith.addi(arith.shli(pair, _c64(1)), half)
        ok = arith.andi(arith.cmpi(arith.CmpIPredicate.ult, atom, na),
                        arith.cmpi(arith.CmpIPredicate.sge, row, rv))
        with B.when(ok):
            soff = arith.addi(arith.shli(arith.addi(arith.muli(tile, d1), arith.addi(a0, atom)),
                                         _c64(9)), rpart)
            B.vector_store(zero, kb.arg("scales"), soff, alignment=4)
        loop.yield_(cur, rv)

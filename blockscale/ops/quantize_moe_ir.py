"""Kernel IR of the "rows" schedule of grouped and fused-activation quantize (sm_90a first).

The tile schedule of :mod:`blockscale.ops.quantize_ir` launches ~2048 short blocks over the
padded 5-D tiles (one resident wave holds ~660): each block pays a group lookup (2-3 dependent
L2 round trips), a tensor-scale load and a reciprocal-table fill before its first row load,
for only 8 rows, and half of the padded row slots carry no data (uniform routing). This
schedule instead:

* launches one resident wave (``gy`` blocks, :func:`blockscale.ops.quantize_grouped.rows_plan`)
  and hands each block a *contiguous* range of data units and one of padding units, so the lookup and the NVFP4
  reciprocal table are paid once per group change, not per block;
* a *data unit* is ``unroll << rpb_log2`` consecutive data rows of one group (rows are visited
  in data order, no padding slots); a *padding unit* (one per 5-D tile, after the data units)
  writes the tile's scale bytes of rows no data row covers (a group's last partial tile, spare
  tiles) as 4-byte zero stores;
* the group vectors (<= :data:`MAX_GROUPS` groups) and, for NVFP4, each group's tensor scale
  are copied to shared memory once per block (one load per thread), and a block-wide prefix sum gives each group's first unit; a
  unit's group is found by a shared-memory binary search, only when the unit leaves the
  current group;
* ``unroll = 2``: a thread loads both row groups of a unit before quantizing either (2x the
  bytes in flight per thread).

* ``lut`` (fused op, schedules ``*_lut``): the sigmoid comes from a shared-memory table over
  the bf16 gate's 16 bits (:func:`blockscale.ops.quantize_silu.sigmoid_lut`: D10's float32
  ``1 / (1 + exp_f32(-v))`` computed on the host and checked over all 65536 gates; constant
  outside a window of ~3.8K magnitudes per sign, 30 KiB) instead of exp_f32 (~31 SASS
  instructions per element) and the div.rn reciprocal (~11 incl. its range check and
  branch): the gate's index is ~3 integer ops per element (u16x2 clamp) and one LDS.

Numerics, chunking and packing are the tile kernel's (its helpers are reused): the bytes are
identical on every target.

Performance model (sm_90a, H200: 132 SMs x 4 schedulers, ~1.98 GHz, ~3.8 TB/s copy; the
bench shape T = 8192, K = 4096, 64 experts, uniform routing; fused: D = 2048). SASS of one
data unit's hot path per element (cold branches such as the NVFP4 NaN-sign fix and div.rn's
slow path left out; the tile kernel's row loop for comparison):

=================  ======  ==============  =============  ================
kernel             tiles   rows (regs)     rows2 (regs)   rows_lut (regs)
=================  ======  ==============  =============  ================
grouped NVFP4      ~15.9   16.6 (48, sp.)  15.8 (62)      = rows
grouped MXFP4      ~16.7   17.0 (48, sp.)  (64)           = rows
grouped MXFP8      ~9.3    9.3 (48)        (63)           = rows
fused NVFP4        ~62     65.6 (64, sp.)  --             27.1 (62); rows2_lut 26.6 (80)
fused MXFP4        ~62     --              --             27.7 (62)
fused MXFP8        ~55     58.7 (64, sp.)  --             19.9 (61)
=================  ======  ==============  =============  ================

No spills in rows2 and the table kernels; rows: grouped NVFP4 / MXFP4 12 / 8 (3 / 2 local
loads per unit, outside the element math), fused exp_f32 16 / 12 / 4 at 64 registers. The tile kernels were measured at
56 / 55 / 64 % of copy (grouped) with about the same instructions per element as the rows
kernels: their time went to the schedule (2048 blocks = 3.1 waves of 660, a 2-3 dependent L2
round-trip prologue per 8-row block, half the blocks padding). Predicted: grouped rows
~70-80 %, rows2 (64 B in flight per thread, 4 blocks per SM) ~75-85 %, MXFP8 (memory-bound,
9.3/elem) ~80-90 %. The exp_f32 fused kernels are issue-bound: 62 instructions x 16.8 M
elements / 32 at 528 issues per clock is 31 us at 100 % issue efficiency, i.e. <= 66 % of the
copy ceiling under D10's exp_f32 + div.rn (~45 % expected); the table kernels need 27 / 20
per element (14 / 10 us at full issue, below the 20-22 us copy time): ~70-85 % predicted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as B
from blockscale.compiler.arch import convert as C
from blockscale.compiler.arch import tma
from blockscale.ops import quantize_ir as QI
from blockscale.ops.quantize_ir import CHUNK, _c32, _c64, _cf

if TYPE_CHECKING:
    from blockscale.ops.quantize_grouped import MoeQuantizeSpec

#: groups the shared tables hold (one per thread in the prologue); more: the tile schedule
MAX_GROUPS = 256
BLOCK_THREADS = 256


def register_cap(mode: str, unroll: int) -> int:
    """nvvm.maxnreg of the CUDA kernels (blocks per SM = 65536 // (256 * cap))."""
    from blockscale.ops.quantize_grouped import REGISTER_CAPS

    return REGISTER_CAPS[(mode, unroll)]


def build(spec: MoeQuantizeSpec) -> ir.Module:
    """The ``gpu.module`` of the rows-schedule kernel of ``spec`` (module docstring)."""
    k = QI._Ctx(spec)
    with ir.Context(), ir.Location.unknown():
        with B.kernel_module(spec.kernel_name, spec.target, spec.args(),
                             (BLOCK_THREADS, 1, 1)) as kb:
            if k.target.is_cuda:
                kb.func.attributes["nvvm.maxnreg"] = ir.IntegerAttr.get(
                    B.i32(), register_cap(spec.mode, spec.unroll))
            _body(k, kb)
        kb.module.operation.verify()
        return kb.module


def _smem(kb: B.KernelBuilder, n: int, elem: str = "i32") -> ir.Value:
    return tma.shared_buffer(kb, f"{n}x{elem}", align=16)


def _lds(buf: ir.Value, idx: ir.Value) -> ir.Value:
    """i32 shared load at an i64 / i32 index, widened to i64 (values are >= 0 or small)."""
    return arith.extsi(B.i64(), B.load(buf, idx))


def _body(k: QI._Ctx, kb: B.KernelBuilder) -> None:
    spec = k.spec
    i64, i32 = B.i64(), B.i32()
    a = kb.arg
    ncols, kblocks_row = a("k"), a("kblocks_row")
    co = QI._coords(k, kb)
    tid, rpb_log2 = co.tid, co.rpb_log2
    j, col0, col_ok = co.j, co.col0, co.col_ok
    unroll = spec.unroll
    upr_log2 = arith.addi(rpb_log2, _c64(unroll.bit_length() - 1))  # rows per unit, log2
    in_stride = arith.shli(ncols, _c64(1)) if spec.mode == "silu" else ncols
    wide = k.chunk > CHUNK
    ld_cols = subchunk_columns(k, j, col0, col_ok, ncols) if wide else []
    d1 = arith.shrui(kblocks_row, _c64(2))
    s_jpart = arith.addi(arith.shli(arith.shrui(j, _c64(2)), _c64(9)), arith.andi(j, _c64(3)))
    nvfp4 = not k.fmt.is_mx
    table = _smem(kb, 128, "f32") if nvfp4 and k.target.is_cuda else None

    # ---- prologue: group tables in shared memory, units per group, prefix sum --------------
    t_start, t_end, t_tile0, t_ids = (_smem(kb, MAX_GROUPS) for _ in range(4))
    t_units = _smem(kb, MAX_GROUPS + 1)
    t_owner = _smem(kb, 1)
    es, offs, ids = a("expert_start"), a("scales_offsets"), a("expert_ids")
    ng = arith.extui(i64, a("num_groups"))
    gok = arith.cmpi(arith.CmpIPredicate.ult, tid, ng)
    gi = arith.select(gok, tid, _c64(0))
    start = arith.select(gok, B.load(es, gi), _c32(0))
    end = arith.select(gok, B.load(es, arith.addi(gi, _c64(1))), _c32(0))
    t0 = arith.addi(arith.shrui(start, _c32(7)), B.load(offs, gi))
    nrows = arith.subi(end, start)
    upr32 = arith.trunci(i32, upr_log2)
    units = arith.shrui(arith.addi(nrows, arith.subi(arith.shli(_c32(1), upr32), _c32(1))),
                        upr32)
    B.store(start, t_start, tid)
    B.store(end, t_end, tid)
    B.store(t0, t_tile0, tid)
    gid = B.load(ids, gi)
    B.store(gid, t_ids, tid)
    t_tsf = None
    if nvfp4:  # the group's tensor scale, so a group change needs no global load
        t_tsf = _smem(kb, MAX_GROUPS, "f32")
        expert = arith.select(arith.cmpi(arith.CmpIPredicate.sge, gid, _c32(0)), gid, _c32(0))
        B.store(B.load(a("tensor_sf"), B.cast_int(expert, B.index(), signed=True)), t_tsf,
                tid)
    slot = arith.addi(tid, _c64(1))
    B.store(units, t_units, slot)
    with B.when(arith.cmpi(arith.CmpIPredicate.eq, tid, _c64(0))):
        B.store(_c32(0), t_units, _c64(0))
    gpu_barrier = B.barrier
    k.lut = None
    if spec.lut:  # the sigmoid table to shared memory (read after the barrier below)
        from blockscale.ops.quantize_silu import MAX_LUT, sigmoid_lut

        _, lut_lo, lut_w = sigmoid_lut(spec.activation, spec.act_alpha, spec.act_limit)
        lut = _smem(kb, MAX_LUT, "f32")
        with B.for_range(tid, _c64(2 * lut_w), BLOCK_THREADS) as cl:
            i = B.cast_int(cl.iv, i64)
            B.store(B.load(a("sig_table"), i), lut, i)
        k.lut = (lut, lut_lo, lut_w)
    gpu_barrier()
    off = 1
    while off < MAX_GROUPS:  # Hillis-Steele inclusive scan of units into t_units[1..]
        v = B.load(t_units, slot)
        has = arith.cmpi(arith.CmpIPredicate.uge, tid, _c64(off))
        o = B.load(t_units, arith.select(has, arith.subi(slot, _c64(off)), _c64(0)))
        gpu_barrier()
        B.store(arith.addi(v, o), t_units, slot)
        gpu_barrier()
        off *= 2
    n_data = _lds(t_units, _c64(MAX_GROUPS))
    gy = B.cast_int(B.grid_dim("y"), i64)
    by = B.cast_int(B.block_idx("y"), i64)

    def share(n: ir.Value) -> tuple[ir.Value, ir.Value]:
        """This block's contiguous share [lo, hi) of n units."""
        return (arith.divui(arith.muli(by, n), gy),
                arith.divui(arith.muli(arith.addi(by, _c64(1)), n), gy))

    # every block takes its share of the data units, then its share of the padding units
    # (padding units at the end of one range would leave the last blocks a long tail)
    d_lo, d_hi = share(n_data)
    p_lo, p_hi = share(a("n_tiles"))

    def group_state(g: ir.Value) -> list[ir.Value]:
        """Group g's loop-carried state: (first unit of g+1, first unit of g, first row,
        end row, first tile, expert id[, tensor_sf, 1/tensor_sf]) (i32, f32); refills the
        NVFP4 reciprocal table."""
        out = [B.load(t_units, arith.addi(g, _c64(1))), B.load(t_units, g),
               B.load(t_start, g), B.load(t_end, g), B.load(t_tile0, g), B.load(t_ids, g)]
        if nvfp4:
            v = B.load(t_tsf, g)
            tsf = arith.divf(_cf(1.0), v) if spec.mode == "silu" else v
            inv_tsf = arith.divf(_cf(1.0), tsf)
            if table is not None:  # block-uniform branch: the barriers are too
                gpu_barrier()
                with B.when(arith.cmpi(arith.CmpIPredicate.ult, tid, _c64(128))):
                    tb = arith.trunci(i32, tid)
                    B.store(QI._nvfp4_recip(tb, QI._e4m3_decode(k, tb), inv_tsf), table, tid)
                gpu_barrier()
            out += [tsf, inv_tsf]
        return out

    carry_types = [i32] * 6 + ([B.f32(), B.f32()] if nvfp4 else [])
    init = [_c32(0)] * 6 + ([_cf(1.0), _cf(1.0)] if nvfp4 else [])
    with B.for_range(d_lo, arith.addi(d_hi, arith.subi(p_hi, p_lo)), carry=init) as loop:
        u = B.cast_int(loop.iv, i64)
        is_data = arith.cmpi(arith.CmpIPredicate.ult, u, d_hi)
        br = B.if_(is_data, carry_types)
        with br.then():
            leave = arith.cmpi(arith.CmpIPredicate.uge, u, arith.extsi(i64, loop.carried[0]))
            sb = B.if_(leave, carry_types)
            with sb.then():
                lo, hi = _c64(0), _c64(MAX_GROUPS)
                step = MAX_GROUPS
                while step > 1:  # last g with t_units[g] <= u (empty groups: never)
                    mid = arith.shrui(arith.addi(lo, hi), _c64(1))
                    le = arith.cmpi(arith.CmpIPredicate.ule, _lds(t_units, mid), u)
                    lo, hi = arith.select(le, mid, lo), arith.select(le, hi, mid)
                    step //= 2
                sb.yield_(*group_state(lo))
            with sb.else_():
                sb.yield_(*loop.carried)
            state = list(sb.results)
            tsf, inv_tsf = (state[6], state[7]) if nvfp4 else (None, None)
            if table is not None:
                k.recip_table = table
            _data_unit(k, kb, co, ld_cols, in_stride, d1, s_jpart, u, upr_log2, state[1:5],
                       state[5], tsf, inv_tsf)
            br.yield_(*state)
        with br.else_():
            # unit u >= d_hi is the padding unit of tile u - d_hi + p_lo (recomputed here
            # from block-uniform values: nothing more stays live across the loop)
            d_hi2 = share(_lds(t_units, _c64(MAX_GROUPS)))[1]
            tile = arith.addi(arith.subi(u, d_hi2), share(a("n_tiles"))[0])
            _padding_unit(k, kb, co, d1, tile, t_start, t_end, t_tile0, t_owner, ng)
            br.yield_(*loop.carried)
        loop.yield_(*br.results)


def subchunk_columns(k: QI._Ctx, j: ir.Value, col0: ir.Value, col_ok: ir.Value,
                     ncols: ir.Value) -> list[ir.Value]:
    """The load column of each CHUNK-wide sub-chunk of a thread's chunk: as the tile kernel,
    a sub-chunk past K re-reads a valid one of its scale block (column ``j`` block's first,
    or the chunk's own start), so the block max is unchanged and nothing of it is stored."""
    jcol = arith.muli(j, _c64(k.fmt.block_size))
    jcol = arith.select(arith.cmpi(arith.CmpIPredicate.ult, jcol, ncols), jcol, _c64(0))
    first = arith.select(col_ok, col0, jcol)
    cols = []
    for h in range(k.chunk // CHUNK):
        colh = arith.addi(col0, _c64(CHUNK * h))
        cols.append(arith.select(arith.cmpi(arith.CmpIPredicate.ult, colh, ncols), colh, first))
    return cols


def _padding_unit(k: QI._Ctx, kb: B.KernelBuilder, co: QI._Coords, d1: ir.Value,
                  tile: ir.Value, t_start: ir.Value, t_end: ir.Value, t_tile0: ir.Value,
                  t_owner: ir.Value, ng: ir.Value) -> None:
    """Zero scale bytes of tile ``tile``'s rows that no data row covers (this x-block's
    atoms): rows [rows_valid, 128), rows_valid from the owning group (0: spare tile)."""
    i64 = B.i64()
    tid = co.tid
    gok = arith.cmpi(arith.CmpIPredicate.ult, tid, ng)
    start, end = _lds(t_start, tid), _lds(t_end, tid)
    t0 = _lds(t_tile0, tid)
    nt = arith.shrui(arith.addi(arith.subi(end, start), _c64(127)), _c64(7))
    owns = arith.andi(gok, arith.andi(arith.cmpi(arith.CmpIPredicate.sle, t0, tile),
                                      arith.cmpi(arith.CmpIPredicate.slt, tile,
                                                 arith.addi(t0, nt))))
    rv_own = arith.minsi(arith.subi(end, arith.addi(start, arith.shli(arith.subi(tile, t0),
                                                                      _c64(7)))), _c64(128))
    B.barrier()  # earlier readers of t_owner are done
    with B.when(arith.cmpi(arith.CmpIPredicate.eq, tid, _c64(0))):
        B.store(_c32(0), t_owner, _c64(0))
    B.barrier()
    with B.when(owns):  # at most one owner (non-overlapping, checked on the host)
        B.store(arith.trunci(B.i32(), rv_own), t_owner, _c64(0))
    B.barrier()
    rv = _lds(t_owner, _c64(0))
    # this x-block's atoms: 2^(cb_log2 - lanes_log2 - 2) K-block quads per x-block
    cb = arith.extui(i64, kb.arg("cb_log2"))
    per_x = arith.shli(_c64(1), arith.subi(cb, _c64(k.lanes_log2 + 2)))
    a0 = arith.muli(B.cast_int(B.block_idx("x"), i64), per_x)
    na = arith.minsi(per_x, arith.subi(d1, a0))
    items = arith.muli(arith.subi(_c64(128), rv), na)
    zero = arith.constant(B.vec(4, B.i8()), ir.DenseElementsAttr.get_splat(
        B.vec(4, B.i8()), ir.IntegerAttr.get(B.i8(), 0)))
    base = arith.shli(arith.muli(tile, d1), _c64(9))
    with B.for_range(tid, items, BLOCK_THREADS) as zl:
        it = B.cast_int(zl.iv, i64)
        r = arith.addi(rv, arith.divui(it, na))
        atom = arith.addi(a0, arith.remui(it, na))
        soff = arith.addi(arith.addi(base, arith.shli(atom, _c64(9))),
                          arith.ori(arith.shli(arith.andi(r, _c64(31)), _c64(4)),
                                    arith.shli(arith.shrui(r, _c64(5)), _c64(2))))
        B.vector_store(zero, kb.arg("scales"), soff, alignment=4)


def _data_unit(k: QI._Ctx, kb: B.KernelBuilder, co: QI._Coords, ld_cols: list[ir.Value],
               in_stride: ir.Value, d1: ir.Value, s_jpart: ir.Value, u: ir.Value,
               upr_log2: ir.Value, group: list[ir.Value], expert: ir.Value,
               tsf: ir.Value | None, inv_tsf: ir.Value | None) -> None:
    """Quantize data unit ``u`` of the group whose (first unit, first row, end row, first
    tile) are ``group``: loads of all its row groups, then each."""
    spec = k.spec
    i64 = B.i64()
    a = kb.arg
    ncols = a("k")
    ufirst, start, end, t0 = group  # i32: rows and tiles fit (expert_start is int32)
    i32 = B.i32()
    active = arith.cmpi(arith.CmpIPredicate.sge, expert, _c32(0))
    first = arith.shli(arith.subi(arith.trunci(i32, u), ufirst), arith.trunci(i32, upr_log2))
    rpb_log2, ri = arith.trunci(i32, co.rpb_log2), arith.trunci(i32, co.ri)
    subs = []
    for s in range(spec.unroll):
        rel = arith.addi(first, arith.addi(arith.shli(_c32(s), rpb_log2), ri))
        drow = arith.addi(start, rel)
        row_ok = arith.cmpi(arith.CmpIPredicate.slt, drow, end)
        srow = arith.extui(i64, drow)
        if spec.gather:
            gidx = arith.select(row_ok, srow, _c64(0))
            src = arith.extsi(i64, B.load(a("indices"), gidx))
            srow = arith.divui(src, arith.extui(i64, a("indices_divisor")))
        load_ok = arith.andi(row_ok, co.col_ok)
        ok = row_ok if k.chunk > CHUNK else load_ok
        row_off = arith.muli(arith.select(ok, srow, _c64(0)), in_stride)
        subs.append((rel, drow, row_ok, _load(k, a, co, ld_cols, row_off, load_ok, ncols)))
    for rel, drow, row_ok, loaded in subs:
        tile = arith.extui(i64, arith.addi(t0, arith.shrui(rel, _c32(7))))
        rr = arith.extui(i64, arith.andi(rel, _c32(127)))
        soff = arith.shli(arith.muli(tile, d1), _c64(9))
        _quantize(k, a, co, loaded, arith.extui(i64, drow), row_ok, active, tsf, inv_tsf,
                  soff, s_jpart, rr)


def _load(k: QI._Ctx, a, co: QI._Coords, ld_cols: list[ir.Value], row_off: ir.Value,
          load_ok: ir.Value, ncols: ir.Value) -> list[tuple]:
    """The chunk's sub-chunks: (col, col ok, f32 bits, bf16-pair words or None) each; the
    fused kernel's are the activation's outputs (gate and up loaded first)."""
    wide = k.chunk > CHUNK
    halves = []
    for h in range(k.chunk // CHUNK):
        colh = arith.addi(co.col0, _c64(CHUNK * h))
        okh = co.col_ok if h == 0 else arith.cmpi(arith.CmpIPredicate.ult, colh, ncols)
        if k.spec.mode == "silu":
            lcol, lok = (ld_cols[h], None) if wide else (colh, load_ok)
            gb, gw = QI._load_chunk(k, a("x"), row_off, lcol, ncols, lok)
            ub = QI._load_chunk_bits(k, a("x"), arith.addi(row_off, ncols), lcol, ncols, lok)
            halves.append((colh, okh, (gb, ub), gw))
        elif wide:
            hb, hw = QI._load_chunk(k, a("x"), row_off, ld_cols[h], ncols, None)
            halves.append((colh, okh, hb, hw))
        else:
            hb, hw = QI._load_chunk(k, a("x"), row_off, colh, ncols, arith.andi(load_ok, okh))
            halves.append((colh, okh, hb, hw))
    return halves


def _quantize(k: QI._Ctx, a, co: QI._Coords, halves: list[tuple], drow: ir.Value,
              row_ok: ir.Value, active: ir.Value, tsf: ir.Value | None,
              inv_tsf: ir.Value | None, tile_soff: ir.Value, s_jpart: ir.Value,
              rr: ir.Value) -> None:
    """The tile kernel's row visit after the loads (D2 chain, packing, stores)."""
    spec = k.spec
    wide = k.chunk > CHUNK
    ncols = a("k")
    if spec.mode == "silu":
        act = _activation_lut if k.lut is not None else (
            lambda _k, g, u, _s: QI._activation(spec, g, u))
        out = []
        for colh, okh, (gb, ub), gw in halves:
            sigs = _lut_sigs(k, gw) if k.lut is not None and gw is not None else [None] * 8
            bits = [arith.bitcast(B.i32(), act(k, arith.bitcast(B.f32(), gv),
                                               arith.bitcast(B.f32(), uv), sg))
                    for gv, uv, sg in zip(gb, ub, sigs)]
            out.append((colh, okh, bits, None))
        halves = out
    bits = [b for hv in halves for b in hv[2]]
    wlist = [hv[3] for hv in halves]
    amax = QI._block_amax_bits(k, bits, wlist if wide and spec.mode != "silu" else None)
    nonfinite = arith.cmpi(arith.CmpIPredicate.uge, amax, _c32(0x7F800000))
    safe_amax = arith.select(nonfinite, _c32(0), amax)
    byte, recip, sd = QI._scale_and_recip(k, safe_amax, tsf, inv_tsf)
    byte = arith.select(nonfinite, _c32(0xFF if k.fmt.is_mx else 0x7F), byte)
    xs_h = [[arith.bitcast(B.f32(), b) for b in hv[2]] for hv in halves]
    if getattr(k, "mx_bf16x2", False):  # the stream kernel's grouped MXFP4 on sm_90a
        from blockscale.ops.quantize_pipe_ir import e2m1x8_mx_bf16x2

        rbits = arith.bitcast(B.i32(), recip)
        packed = [[e2m1x8_mx_bf16x2(hv[3], rbits, spec.rounding != "up")] for hv in halves]
    elif k.fmt.is_fp4:
        packed = [[w] for w in QI._pack_fp4_all(k, xs_h, recip, sd, [hv[3] for hv in halves])]
    else:
        packed = [QI._pack_e4m3(k, xs, recip) for xs in xs_h]
    zero = arith.ori(nonfinite, arith.xori(active, B.const(True, B.i1())))
    for (colh, okh, _, _), words in zip(halves, packed):
        words = [arith.select(zero, _c32(0), w) for w in words]
        QI._store_data(k, a("data"), words, drow, colh, ncols, arith.andi(row_ok, okh))
    has_data = arith.andi(row_ok, co.col_ok)
    sval = arith.trunci(B.i8(), arith.select(arith.andi(has_data, active), byte, _c32(0)))
    rpart = arith.ori(arith.shli(arith.andi(rr, _c64(31)), _c64(4)),
                      arith.shli(arith.shrui(rr, _c64(5)), _c64(2)))
    soff = arith.addi(arith.addi(tile_soff, s_jpart), rpart)
    with B.when(arith.andi(arith.andi(co.lane0, co.chunk_ok), row_ok)):
        B.store(sval, a("scales"), soff)


def _lut_sigs(k: QI._Ctx, words: ir.Value) -> list[ir.Value]:
    """The table sigmoids of the 8 gates in ``words`` (vector<4xi32> of bf16 pairs), element
    order: the table index plus ``lo`` of both halves of a word at once (u16x2 clamp of the
    magnitudes, the sign offsets ``sign * width`` added as one 32-bit add: no carry crosses
    halves); ``lo`` is subtracted from each index, which folds into the table's address."""
    lut, lo, width = k.lut
    i16 = B.i16()
    n = words.type.shape[0]
    mags = vector.bitcast(B.vec(2 * n, i16), arith.andi(words, C.const_like(words.type,
                                                                              0x7FFF7FFF)))
    mags = arith.minui(arith.maxui(mags, C.const_like(mags.type, lo)),
                       C.const_like(mags.type, lo + width - 1))
    signs = arith.andi(arith.shrui(words, C.const_like(words.type, 15)),
                       C.const_like(words.type, 0x10001))
    idx = arith.addi(vector.bitcast(words.type, mags),
                     arith.muli(signs, C.const_like(words.type, width)))
    out = []
    for i in range(n):
        w = B.extract(idx, i)
        for half in (arith.andi(w, _c32(0xFFFF)), arith.shrui(w, _c32(16))):
            out.append(B.load(lut, arith.subi(arith.extui(B.i64(), half), _c64(lo))))
    return out


def _activation_lut(k: QI._Ctx, g: ir.Value, u: ir.Value, sig: ir.Value | None) -> ir.Value:
    """D10's activation with the sigmoid read from the shared table (quantize_silu.sigmoid_lut:
    the same float32 bits as 1 / (1 + exp_f32(-v)) for the bf16 gate g); the products in D10's
    order. A few integer ops + a shared load instead of exp_f32 (~31) and div.rn (~11).
    ``sig``: the entry when :func:`_lut_sigs` already read it."""
    spec = k.spec
    lut, lo, width = k.lut
    if sig is None:
        b = arith.shrui(B.bitcast(g, B.i32()), _c32(16))  # the gate's bf16 bits
        mag = arith.andi(b, _c32(0x7FFF))
        mag = arith.minsi(arith.maxsi(mag, _c32(lo)), _c32(lo + width - 1))
        idx = arith.addi(arith.subi(mag, _c32(lo)),
                         arith.muli(arith.shrui(b, _c32(15)), _c32(width)))
        sig = B.load(lut, arith.extui(B.i64(), idx))
    if spec.activation == "silu":
        return arith.mulf(arith.mulf(g, sig), u)
    lim = _cf(spec.act_limit)
    g2 = arith.minimumf(g, lim)
    u2 = arith.minimumf(arith.maximumf(u, arith.negf(lim)), lim)
    return arith.mulf(arith.mulf(arith.addf(u2, _cf(1.0)), g2), sig)

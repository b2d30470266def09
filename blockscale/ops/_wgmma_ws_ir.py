"""K loop of the sm_90a wgmma matmul fed by TMA through an mbarrier ring (``pipeline`` "ws"
or "tma").

Imports MLIR: only :func:`blockscale.ops.matmul_wgmma.build` imports it.

NVFP4 and MXFP4, ``scaling="fold"``, ``kstep=64``, ``bm=128``, ``bn`` 128 or 256
(:data:`SHAPES`). The CTA is the ``bm / 64`` consumer warpgroups of
:mod:`blockscale.ops._wgmma_ir`; the producer is lane 0 of an extra warpgroup ("ws",
threads ``2 bm .. 2 bm + 127``: a whole warpgroup, as the interpreter's wgmma model wants
whole-warpgroup blocks) or thread 0 of the consumers ("tma": 256 threads, so 128 x 256 gets
the 255-register cap instead of 168):

* Packed ring (static shared memory, :data:`RING` stages): per stage the step's packed A
  rows (``bm x 32`` bytes), B rows (``bn x 32``) and the 512-byte 5-D scale atoms (one per
  128 rows) of the step's atom column (NVFP4: a k64 step is one column of 4 blocks; MXFP4:
  half of one, the atom is loaded for both steps). The producer fills stage ``t % RING``
  for step ``t``: waits on ``empty[t % RING]`` (the consumers released step ``t - RING``),
  ``mbarrier.arrive.expect_tx`` on ``full[t % RING]`` and issues the
  ``cp.async.bulk.tensor.2d`` copies (UTMALDG). The data boxes use the 32-byte swizzle (the
  8 rows a 16-byte load phase reads hit 8 distinct bank groups); rows past M / N and bytes
  past K / 2 arrive as zeros (TMA zero fill: the M/N/K tails).
* The bf16 stages and the scale table of :mod:`blockscale.ops._wgmma_ir` are the dynamic
  shared memory, declared ``.extern`` (:func:`tma.extern_shared_buffer`) so that it follows
  the ring and the mbarriers (``gpu.dynamic_shared_memory`` overlapped them: issue #9).
* Consumers, step ``s``: wait on ``full[s % RING]`` (phase ``(s / RING) & 1``), dequantize
  their pieces from shared memory (:func:`_wgmma_ir._store_piece`: the same bf16 operands,
  layout and scale folding as the register-fed kernel) into bf16 stage ``s % 3``, fence the
  async proxy; one CTA barrier; thread 0 arrives on ``empty[s % RING]`` (every consumer
  has read the stage before the barrier); then the four ``m64n{bn}k16`` wgmmas,
  ``commit_group`` and ``wait_group 1`` as in :func:`_wgmma_ir.emit_mainloop` (the bf16
  stage of step s is free after the ``wait_group 1`` of step s + 1).
* Producer and consumers run one loop: the copies of step ``s + RING - 1`` are issued at
  the top of step ``s``, and the producer joins the per-step CTA barrier (the lock-step
  interpreter models neither named barriers nor independent producer / consumer loops, so
  no ``setmaxnreg`` either: the producer would carry the accumulators through the loop).
  The scale bytes of blocks past K and of rows past M / N are replaced by 0 (the padding
  may hold NaN codes; the data there is zero).

Numerics are those of the register-fed "fold" kernel (same operands, same wgmma order): the
interpreter's results are bit-identical to it (tests/test_matmul_wgmma_ws.py).
"""

from __future__ import annotations

from typing import Any

from mlir import ir
from mlir.dialects import arith, memref, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import tma
from blockscale.compiler.arch import wgmma as W
from blockscale.ops import _wgmma_ir as X
from blockscale.ops import _wgmma_ws as WS
from blockscale.ops._mma_ir import Operand

Value = ir.Value

#: (bm, bn) built
SHAPES = WS.TILES
RING, ROW_BYTES = WS.RING, WS.ROW_BYTES


def _swizzled(off: Value) -> Value:
    """Where the copy engine put byte offset ``off`` of a 32-byte-swizzled tile."""
    return arith.xori(off, bir.mul(bir.urem(bir.udiv(off, 128), 2), 16))


def emit_mainloop(kb: bir.KernelBuilder, tiles: X.Tiles, a: Operand, b: Operand, k: Value,
                  dequant: str, m0: Value, n0: Value, pipeline: str = WS.PIPELINE
                  ) -> tuple[Value, Value, Value | None]:
    """The producer / consumer K loop (module docstring). Every thread of the CTA runs it.
    Returns (the warpgroup's accumulator struct, warpgroup index, the is-consumer predicate
    or None: every thread is one)."""
    if (tiles.bm, tiles.bn) not in SHAPES or tiles.kstep != WS.KSTEP \
            or tiles.fmt not in WS.FORMATS or tiles.scaling != WS.SCALING:
        raise ValueError(f"ws pipeline: {WS.FORMATS} fold k64 with (bm, bn) in {SHAPES}, got "
                         f"{tiles}")
    bm, bn = tiles.bm, tiles.bn
    na, nb = bm // 128, bn // 128  # scale atoms per stage
    smem = tma.extern_shared_buffer(kb, tiles.shared_bytes)  # after the ring (issue #9)
    ring_a = tma.shared_buffer(kb, f"{RING}x{bm}x{ROW_BYTES}xi8", align=1024)
    ring_b = tma.shared_buffer(kb, f"{RING}x{bn}x{ROW_BYTES}xi8", align=1024)
    ring_sa = tma.shared_buffer(kb, f"{RING * na}x2x256xi8", align=128)
    ring_sb = tma.shared_buffer(kb, f"{RING * nb}x2x256xi8", align=128)
    full = tma.mbarrier_group(RING)
    empty = tma.mbarrier_group(RING)
    maps = {x.name: x for x in WS.tensormap_args(bm, bn, tiles.fmt)}
    desc = {n: tma.descriptor(kb.arg(n), arg) for n, arg in maps.items()}
    tx = sum(x.box_bytes for x in maps.values()) + (na - 1) * maps["sfa_map"].box_bytes \
        + (nb - 1) * maps["sfb_map"].box_bytes

    tid = bir.thread_idx("x")
    consumers = tiles.threads
    own = WS.PRODUCER_THREADS[pipeline] > 0  # a producer warpgroup, else thread 0
    is_cons = bir.ult(tid, consumers) if own else bir.ult(tid, consumers + 1)
    is_prod = bir.eq(tid, consumers if own else 0)
    wg = bir.udiv(tid, 128)
    steps = bir.ceil_div(k, tiles.kstep)
    row_bytes = bir.udiv(k, 2)
    d1 = bir.ceil_div(bir.ceil_div(k, tiles.block), 4)
    atom_a = bir.mul(bir.udiv(m0, 128), d1)
    atom_b = bir.mul(bir.udiv(n0, 128), d1)

    with bir.when(is_prod):
        for i in range(RING):
            tma.mbarrier_init(full, 1, i)
            tma.mbarrier_init(empty, 1, i)
        tma.fence_mbarrier_init()
    with bir.when(is_cons):
        X._fill_scale_table(smem, X.STAGES * tiles.stage_bytes, tiles, dequant)
    bir.barrier()

    def produce(t: Value) -> None:
        """Producer lane: fill the ring stage of step ``t`` (if t < steps)."""
        with bir.when(bir.logical_and(is_prod, bir.ult(t, steps))):
            slot = bir.urem(t, RING)
            lap = bir.udiv(t, RING)
            with bir.when(bir.ult(bir.const(0), lap)):  # released by step t - RING
                tma.mbarrier_wait(empty, _parity(bir.add(lap, 1)), slot)
            tma.mbarrier_arrive_expect_tx(full, tx, slot)
            kx = bir.mul(t, ROW_BYTES)
            col = bir.udiv(bir.mul(t, tiles.scales_per_step), 4)  # the step's atom column
            tma.tma_load(_tile(ring_a, slot, bm, ROW_BYTES), desc["a_map"], [kx, m0], full,
                         slot)
            tma.tma_load(_tile(ring_b, slot, bn, ROW_BYTES), desc["b_map"], [kx, n0], full,
                         slot)
            for j in range(na):
                tma.tma_load(_tile(ring_sa, bir.add(bir.mul(slot, na), j), 2, 256),
                             desc["sfa_map"],
                             [0, bir.mul(bir.add(bir.add(atom_a, bir.mul(d1, j)), col), 2)],
                             full, slot)
            for j in range(nb):
                tma.tma_load(_tile(ring_sb, bir.add(bir.mul(slot, nb), j), 2, 256),
                             desc["sfb_map"],
                             [0, bir.mul(bir.add(bir.add(atom_b, bir.mul(d1, j)), col), 2)],
                             full, slot)

    for t in range(RING - 1):
        produce(bir.const(t))

    items = X._items(tiles, tid)
    a_bytes = tiles.operand_bytes[0]
    base_desc = W.descriptor(W.shared_address(smem), lbo=X.LBO, sbo=tiles.sbo)
    zero = W.zero_accumulator(bn)
    with bir.for_range(0, steps, carry=[zero]) as loop:
        step = loop.iv
        acc = loop.carried[0]
        produce(bir.add(step, RING - 1))
        slot = bir.urem(step, RING)
        stage0 = bir.mul(bir.urem(step, X.STAGES), tiles.stage_bytes)
        with bir.when(is_cons):
            tma.mbarrier_wait(full, _parity(bir.udiv(step, RING)), slot)
            for it in items:
                def body(it: Any = it) -> None:
                    data, scales = _read_item(it, slot, step, row_bytes, a, b, ring_a, ring_b,
                                              ring_sa, ring_sb, na, nb, tiles)
                    X._store_piece(smem, stage0, it, data, scales, dequant, tiles)
                if it.live is None:
                    body()
                else:
                    with bir.when(it.live):
                        body()
            W.fence_proxy_async_shared()
        bir.barrier()
        with bir.when(bir.eq(tid, 0)):
            tma.mbarrier_arrive_expect_tx(empty, 0, slot)
        br = bir.if_(is_cons, [acc.type])
        with br.then():
            da = W.advance(base_desc, bir.as_i64(bir.add(stage0, bir.mul(wg, 8 * tiles.sbo))))
            db = W.advance(base_desc, bir.as_i64(bir.add(stage0, a_bytes)))
            W.fence()
            c = acc
            for h in range(tiles.kstep // tiles.mma_k):
                c = W.mma_async(c, W.advance(da, 2 * h * X.LBO), W.advance(db, 2 * h * X.LBO),
                                bn, dtype=tiles.mma_type)
            W.commit_group()
            W.wait_group(1)
            br.yield_(c)
        with br.else_():
            br.yield_(acc)
        loop.yield_(br.results[0])
    out = bir.if_(is_cons, [zero.type])
    with out.then():
        W.wait_group(0)
        out.yield_(loop.results[0])
    with out.else_():
        out.yield_(loop.results[0])
    return out.results[0], wg, is_cons if own else None


def _parity(lap: Value) -> Value:
    """The phase parity (i1) of a ring lap."""
    return arith.trunci(ir.IntegerType.get_signless(1), bir.as_i32(lap))


def _tile(ring: Value, slot: Value, rows: int, cols: int) -> Value:
    """Stage ``slot`` of a ``[n, rows, cols]`` i8 ring as a ``memref<rows x cols>`` view."""
    t = ir.MemRefType(ring.type)
    res = ir.Type.parse(f"memref<{rows}x{cols}xi8, strided<[{cols}, 1], offset: ?>, "
                        f"{t.memory_space}>")
    dyn = ir.ShapedType.get_dynamic_stride_or_offset()
    off = bir.as_index(bir.mul(slot, rows * cols))  # (memref.reinterpret_cast: no subview
    return memref.reinterpret_cast(res, ring, [off], [], [],  # lowering in the pipeline)
                                   [dyn], [rows, cols], [cols, 1])


def _read_item(it: Any, slot: Value, step: Value, row_bytes: Value, a: Operand, b: Operand,
               ring_a: Value, ring_b: Value, ring_sa: Value, ring_sb: Value, na: int, nb: int,
               tiles: X.Tiles) -> tuple[Value, Value]:
    """(16 packed bytes, 2 scale bytes) of item ``it`` from the ring stage ``slot``; the
    scale bytes are 0 for rows past the operand and pieces past the row end."""
    vd, vs = X._item_types(tiles)

    def read(ring: Value, sring: Value, rows: int, atoms: int, op: Operand) -> list[Value]:
        off = bir.add(bir.mul(it.r, ROW_BYTES), bir.mul(it.piece, 16))
        flat = bir.add(bir.mul(slot, rows * ROW_BYTES), _swizzled(off))
        data = _load(ring, vd, flat, rows * ROW_BYTES, 16)
        r = it.r
        atom = bir.add(bir.mul(slot, atoms), bir.udiv(r, 128))
        rr = bir.urem(r, 128)
        blk = bir.urem(bir.add(bir.mul(step, tiles.scales_per_step),  # in the atom column
                               tiles.piece_block(it.piece)), 4)
        soff = bir.add(bir.add(bir.mul(bir.urem(rr, 32), 16), bir.mul(bir.udiv(rr, 32), 4)),
                       blk)
        sc = _load(sring, vs, bir.add(bir.mul(atom, 512), soff), 512, tiles.piece_scales)
        col = bir.add(bir.mul(step, ROW_BYTES), bir.mul(it.piece, 16))
        ok = bir.logical_and(op.valid(r), bir.ult(col, row_bytes))
        return [data, arith.select(ok, sc, bir.const(0, vs))]

    br = bir.if_(it.is_a, [vd, vs])
    with br.then():
        br.yield_(*read(ring_a, ring_sa, tiles.bm, 1, a))
    with br.else_():
        br.yield_(*read(ring_b, ring_sb, tiles.bn, 2 if tiles.bn > 128 else 1, b))
    return br.results[0], br.results[1]


def _load(ring: Value, vt: ir.Type, flat: Value, stage: int, align: int) -> Value:
    """A vector load at flat byte ``flat`` of a 3-D i8 ring (whose last two dims hold
    ``stage`` bytes)."""
    shape = ir.MemRefType(ring.type).shape
    inner = shape[2]
    i0 = bir.udiv(flat, shape[1] * inner)
    rem = bir.urem(flat, shape[1] * inner)
    op = vector.LoadOp(vt, ring, [bir.as_index(i0), bir.as_index(bir.udiv(rem, inner)),
                                  bir.as_index(bir.urem(rem, inner))])
    op.attributes["alignment"] = ir.IntegerAttr.get(bir.i64(), align)
    return op.result

"""IR building blocks of the sm_100a tcgen05 block-scaled matmul (NVFP4, MXFP4, MXFP8).

Imports MLIR: only :func:`blockscale.ops.matmul_tcgen05.build` imports it.

CTA: 128 threads (4 warps), a 128 x 128 tile of C, the fp32 accumulator in tensor memory.

Per K-step (one SF atom: 4 K-blocks, i.e. 64 NVFP4 / 128 MXFP4 / 128 MXFP8 elements;
:data:`STEP_BYTES` bytes of each row), stage ``s % 2`` of shared memory:

1. thread ``t`` loads row ``t`` of A's tile and row ``t`` of B's tile (16-byte ``ld.global``
   pieces when K % 32 == 0, else bytes; zeros for rows past M / N and bytes past K) into the canonical no-swizzle K-major
   layout (core matrix of row group ``g``, 16-byte chunk ``c`` at ``g * SBO + c * 128``), and
   word ``t`` of the 512-byte SF atom of A's and B's 128-row tile (the 5-D TCGEN layout is the
   layout ``tcgen05.cp.32x128b.warpx4`` consumes; K-blocks past ceil(K / SFV) are masked to
   zero bytes);
2. ``fence.proxy.async.shared::cta`` + ``bar.sync``;
3. thread 0: ``tcgen05.cp`` of both atoms into the stage's TMEM scale columns, then
   ``STEP_BYTES / 32`` ``tcgen05.mma...block_scale`` (32 bytes of K per MMA: NVFP4 4X with
   SF ID 0; MXFP4 2X with IDs 0, 2; MXFP8 1X with IDs 0..3), then ``tcgen05.commit`` to the
   stage's mbarrier;
4. before step ``s + 2`` refills the stage, every thread waits for that mbarrier phase (the
   MMAs of step ``s`` have finished reading the stage), so the loads of step ``s + 1`` overlap
   the tensor core work of step ``s``.

Epilogue: wait for the last commit, ``tcgen05.ld.32x32b.x32`` (warp ``w`` reads TMEM lanes
``32 w ..``: thread ``t`` holds row ``t`` of the tile), ``tcgen05.wait::ld``, ``alpha *
acc``, bf16 (RNE) or f32, stores masked to ``m < M``, ``n < N``; then the TMEM columns are
freed. TMEM: 256 columns, D in 0-127, the scales of stage ``st`` at ``128 + 8 st`` (A) and
``132 + 8 st`` (B).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import tcgen05 as T
from blockscale.compiler.arch import tma
from blockscale.layouts import SF_ATOM_BYTES

Value = ir.Value

#: tile rows of A (the MMA's M) and of B (its N); one thread per row
BM = BN = 128
THREADS = 128
STAGES = 2
#: format name -> (tcgen05 kind, bytes of a row per K-step = one SF atom of 4 K-blocks)
KIND = {"nvfp4": "mxf4nvf4", "mxfp4": "mxf4", "mxfp8": "mxf8f6f4"}
STEP_BYTES = {"nvfp4": 32, "mxfp4": 64, "mxfp8": 128}
#: TMEM columns allocated, accumulator base column, scale columns
TMEM_ALLOC = 256
SF_COL = 128
LBO = 128
#: static shared memory limit (bytes); above it the stages use dynamic shared memory
STATIC_LIMIT = 48 * 1024


@dataclasses.dataclass(frozen=True)
class Layout:
    """Shared-memory layout of one format's stages."""

    fmt: str

    @property
    def row_bytes(self) -> int:
        """Bytes of a row per step."""
        return STEP_BYTES[self.fmt]

    @property
    def sbo(self) -> int:
        """Stride-dimension byte offset (8 rows x the step's chunks)."""
        return 8 * self.row_bytes

    @property
    def operand_bytes(self) -> int:
        return BM * self.row_bytes

    @property
    def stage_bytes(self) -> int:
        """SFA atom, SFB atom, A tile, B tile."""
        return 2 * SF_ATOM_BYTES + 2 * self.operand_bytes

    @property
    def shared_bytes(self) -> int:
        return STAGES * self.stage_bytes

    @property
    def dynamic(self) -> bool:
        return self.shared_bytes > STATIC_LIMIT

    @property
    def mmas(self) -> int:
        """MMAs per step (32 bytes of K each)."""
        return self.row_bytes // T.MMA_ROW_BYTES

    def offsets(self, stage: int) -> dict[str, int]:
        base = stage * self.stage_bytes
        return {"sfa": base, "sfb": base + SF_ATOM_BYTES, "a": base + 2 * SF_ATOM_BYTES,
                "b": base + 2 * SF_ATOM_BYTES + self.operand_bytes}

    def sf_ids(self, i: int) -> int:
        """Scale-factor ID of MMA ``i`` of a step (the byte of the TMEM cell it starts at)."""
        per = T.KINDS[KIND[self.fmt]][5]
        return i * per if per < 4 else 0


def chunk_offset(r: Value, c: int, sbo: int) -> Value:
    """Byte offset of 16-byte chunk ``c`` of row ``r`` in a K-major no-swizzle tile."""
    return bir.add(bir.add(bir.mul(bir.udiv(r, 8), sbo), bir.mul(bir.urem(r, 8), 16)), c * LBO)


_i32 = bir.i32_bits  # an i32 constant from a 32-bit pattern


def _copy_row(src: Value, row: Value, valid: Value, row_bytes: Value, step: Value,
              smem: Value, base: Value, r: Value, layout: Layout, aligned: bool) -> None:
    """Row ``row`` (local ``r``) of an operand: the step's 16-byte pieces to shared memory,
    zeros past the row end and for invalid rows. ``aligned``: rows are whole 16-byte pieces
    (``ld.global.v4``, unrolled); otherwise a loop over the pieces loads each byte from a
    clamped, always in-bounds address and zeroes it past the end (any K; the loop bounds
    the bytes in flight, i.e. the registers)."""
    v16 = bir.vec(16, bir.i8())
    col0 = bir.mul(step, layout.row_bytes)
    if aligned:
        for c in range(layout.row_bytes // 16):
            col = bir.add(col0, 16 * c)
            br = bir.if_(bir.logical_and(valid, bir.ult(col, row_bytes)), [v16])
            with br.then():
                br.yield_(bir.vector_load(v16, src, bir.add(bir.mul(row, row_bytes), col),
                                          alignment=16))
            with br.else_():
                br.yield_(bir.const(0, v16))
            bir.vector_store(br.results[0], smem,
                             bir.add(base, chunk_offset(r, c, layout.sbo)), alignment=16)
        return
    last = bir.sub(row_bytes, 1)
    row_base = bir.mul(arith.select(valid, row, bir.const(0)), row_bytes)
    zero = bir.const(0, bir.i8())
    with bir.for_range(0, layout.row_bytes // 16) as loop:
        c = loop.iv
        col = bir.add(col0, bir.mul(c, 16))
        elems = []
        for i in range(16):
            ci = bir.add(col, i)
            v = bir.load(src, bir.add(row_base, bir.umin(ci, last)))
            elems.append(arith.select(bir.logical_and(valid, bir.ult(ci, row_bytes)), v, zero))
        dst = bir.add(bir.add(base, chunk_offset(r, 0, layout.sbo)), bir.mul(c, LBO))
        bir.vector_store(vector.from_elements(v16, elems), smem, dst, alignment=16)


def _copy_atom_word(scales: Value, atom: Value, t: Value, kmask: Value, smem: Value,
                    base: Value) -> None:
    """Word ``t`` (bytes 4t..4t+3) of the 512-byte SF atom at byte ``atom`` of the 5-D
    scales, K-blocks masked by ``kmask``, to the stage's atom copy."""
    v4 = bir.vec(4, bir.i8())
    w = vector.bitcast(bir.vec(1, bir.i32()),
                       bir.vector_load(v4, scales, bir.add(atom, bir.mul(t, 4)), alignment=4))
    w = arith.andi(w, vector.broadcast(bir.vec(1, bir.i32()), kmask))
    bir.vector_store(vector.bitcast(v4, w), smem, bir.add(base, bir.mul(t, 4)), alignment=4)


def _kblock_mask(kblocks: Value, step: Value) -> Value:
    """i32 byte mask of the step's 4 K-blocks that are < ``kblocks`` (little-endian bytes)."""
    valid = bir.as_i32(bir.umin(bir.sub(kblocks, bir.umin(kblocks, bir.mul(step, 4))), 4))
    partial = arith.subi(arith.shli(_i32(1), arith.muli(valid, _i32(8))), _i32(1))
    return arith.select(arith.cmpi(arith.CmpIPredicate.uge, valid, _i32(4)), _i32(-1), partial)


@dataclasses.dataclass
class Shared:
    """The kernel's shared buffers: the stages (i8), two mbarriers (i64) and the TMEM
    address slot (i32)."""

    stages: Value
    bars: Value
    slot: Value


def allocate_shared(kb: bir.KernelBuilder, layout: Layout) -> Shared:
    bars = tma.shared_buffer(kb, f"{STAGES}xi64", align=8)
    slot = tma.shared_buffer(kb, "1xi32", align=4)
    stages = (tma.extern_shared_buffer(kb, layout.shared_bytes, align=128) if layout.dynamic
              else tma.shared_buffer(kb, f"{layout.shared_bytes}xi8", align=128))
    return Shared(stages, bars, slot)


def emit_kernel_body(kb: bir.KernelBuilder, fmt: Any, layout: Layout, store: Any, *,
                     aligned: bool = True) -> None:
    """The whole kernel: TMEM allocation, the K loop, the epilogue (:func:`emit_epilogue`
    calls ``store(value_f32, m, n)``), TMEM free. ``aligned``: K % 32 == 0 (16-byte row
    pieces), else byte loads (:func:`_copy_row`)."""
    sh = allocate_shared(kb, layout)
    tid = bir.thread_idx("x")
    m_count, n_count, k = (bir.as_index(kb.arg(x)) for x in ("m", "n", "k"))
    m0 = bir.mul(bir.block_idx("y"), BM)
    n0 = bir.mul(bir.block_idx("x"), BN)
    row_bytes = bir.udiv(k, 2) if fmt.is_fp4 else k
    kblocks = bir.ceil_div(k, fmt.block_size)
    d1 = bir.ceil_div(kblocks, 4)
    steps = bir.ceil_div(row_bytes, layout.row_bytes)

    bars_addr = T.shared_address(sh.bars)
    stage_addr = T.shared_address(sh.stages)
    warp0 = bir.ult(tid, 32)
    is0 = bir.eq(tid, 0)
    # TMEM allocation (warp 0) and mbarrier init (thread 0)
    with bir.when(warp0):
        T.alloc(T.shared_pointer(T.shared_address(sh.slot)), TMEM_ALLOC)
        T.relinquish_alloc_permit()
    with bir.when(is0):
        for i in range(STAGES):
            T.mbarrier_init(_bar(bars_addr, bir.const(i)), 1)
        tma.fence_mbarrier_init()
    T.fence_before_thread_sync()
    bir.barrier()
    T.fence_after_thread_sync()
    tmem = bir.load(sh.slot, 0)

    row_a = bir.add(m0, tid)
    row_b = bir.add(n0, tid)
    valid_a, valid_b = bir.ult(row_a, m_count), bir.ult(row_b, n_count)
    atom_a = bir.mul(bir.mul(bir.udiv(m0, BM), d1), SF_ATOM_BYTES)
    atom_b = bir.mul(bir.mul(bir.udiv(n0, BN), d1), SF_ATOM_BYTES)
    kind = KIND[fmt.name]
    with bir.for_range(0, steps) as loop:
        s = loop.iv
        st = bir.urem(s, STAGES)
        base = bir.mul(st, layout.stage_bytes)
        bar_st = _bar(bars_addr, st)
        # the MMAs of step s - 2 read this stage: wait for their commit (phase (s - 2) / 2)
        with bir.when(bir.ule(STAGES, s)):
            T.mbarrier_wait(bar_st, bir.as_i32(bir.urem(bir.add(bir.udiv(s, STAGES), 1), 2)))
        off = layout.offsets(0)
        _copy_row(kb.arg("a"), row_a, valid_a, row_bytes, s, sh.stages,
                  bir.add(base, off["a"]), tid, layout, aligned)
        _copy_row(kb.arg("b"), row_b, valid_b, row_bytes, s, sh.stages,
                  bir.add(base, off["b"]), tid, layout, aligned)
        kmask = _kblock_mask(kblocks, s)
        step_atom = bir.mul(s, SF_ATOM_BYTES)
        _copy_atom_word(kb.arg("sfa"), bir.add(atom_a, step_atom), tid, kmask, sh.stages,
                        bir.add(base, off["sfa"]))
        _copy_atom_word(kb.arg("sfb"), bir.add(atom_b, step_atom), tid, kmask, sh.stages,
                        bir.add(base, off["sfb"]))
        T.fence_proxy_async_shared()
        bir.barrier()
        with bir.when(is0):
            T.fence_after_thread_sync()
            _issue_step(kind, layout, st, tmem, arith.addi(stage_addr, bir.as_i64(base)), s,
                        bar_st)
    # the last commit covers every MMA
    last = bir.sub(steps, 1)
    T.mbarrier_wait(_bar(bars_addr, bir.urem(last, STAGES)),
                    bir.as_i32(bir.urem(bir.udiv(last, STAGES), 2)))
    T.fence_after_thread_sync()
    emit_epilogue(tmem, tid, m0, n0, m_count, n_count, store)
    T.fence_before_thread_sync()
    bir.barrier()
    with bir.when(warp0):
        T.fence_after_thread_sync()
        T.dealloc(tmem, TMEM_ALLOC)


def _bar(bars_addr: Value, i: Value) -> Value:
    """``!llvm.ptr<3>`` of mbarrier ``i`` (index) of the pair at ``bars_addr``."""
    return T.shared_pointer(arith.addi(bars_addr, bir.as_i64(bir.mul(i, 8))))


def _issue_step(kind: str, layout: Layout, st: Value, tmem: Value, stage_addr: Value,
                s: Value, bar: Value) -> None:
    """Thread 0's async work of a step (stage ``st`` at shared address ``stage_addr``): the
    two scale-atom copies, the MMAs, the commit."""
    off = layout.offsets(0)

    def desc(byte: int, sbo: int) -> Value:
        return T.smem_descriptor(arith.addi(stage_addr, bir.const(byte, bir.i64())),
                                 lbo=LBO, sbo=sbo)

    sfa = arith.addi(tmem, arith.addi(_i32(SF_COL), bir.as_i32(bir.mul(st, 8))))
    sfb = arith.addi(sfa, _i32(4))
    T.copy_scale_atom(sfa, desc(off["sfa"], 128))
    T.copy_scale_atom(sfb, desc(off["sfb"], 128))
    adesc, bdesc = desc(off["a"], layout.sbo), desc(off["b"], layout.sbo)
    first = bir.ne(s, 0)
    for i in range(layout.mmas):
        ids = layout.sf_ids(i)
        idesc = T.instr_descriptor_bits(kind, BM, BN, ids, ids)
        T.mma_block_scale(kind, tmem, T.advance(adesc, 2 * i * LBO),
                          T.advance(bdesc, 2 * i * LBO), idesc,
                          first if i == 0 else T.true(), sfa, sfb)
    T.commit(bar)


#: accumulator columns per tcgen05.ld
LD_COLS = 32


def emit_epilogue(tmem: Value, tid: Value, m0: Value, n0: Value, m_count: Value,
                  n_count: Value, store: Any) -> None:
    """Warp ``w`` loads TMEM lanes ``32 w + lane`` (= tile row ``tid``), 32 columns at a
    time, and calls ``store(value_f32, m, n)`` for every in-bounds element."""
    warp = bir.udiv(tid, 32)
    lane_base = arith.shli(bir.as_i32(warp), _i32(21))  # (32 w) << 16
    m = bir.add(m0, tid)
    row_ok = bir.ult(m, m_count)
    for c0 in range(0, BN, LD_COLS):
        taddr = arith.addi(arith.addi(tmem, lane_base), _i32(c0))
        regs = T.load_32x32b(taddr, LD_COLS)
        T.wait_ld()
        vals = vector.bitcast(bir.vec(LD_COLS, bir.f32()), regs)
        for j in range(LD_COLS):
            n = bir.add(n0, c0 + j)
            with bir.when(bir.logical_and(row_ok, bir.ult(n, n_count))):
                store(vector.extract(vals, [], [j]), m, n)

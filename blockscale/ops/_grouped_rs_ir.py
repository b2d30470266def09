"""IR of the register-A grouped (MoE prefill) NVFP4 matmul
(:mod:`blockscale.ops.matmul_grouped_rs`, issue #10).

Imports MLIR: only :func:`blockscale.ops.matmul_grouped_rs.build` imports it.

Why: the producer-dequant kernel (:mod:`blockscale.ops._pdq_ir`) converts the weights in a
producer warpgroup, stores them to shared memory, fences the stores to the async proxy and
arrives; its consumers wait on that chain (ncu run AU: 63 % of their samples) and every k64
step moves ~128 KB through shared memory at 128 x 256. Here the roles are swapped, as the
mixed-input Hopper GEMMs do (CUTLASS's register-A collective, vLLM's Machete): the WEIGHTS are
the wgmma's A operand, converted by the consumer warpgroups themselves into registers
(:func:`blockscale.compiler.arch.wgmma.mma_async_rs`), and the routed activations (tokens)
are the B operand, bulk-copied from the grouped phase-1 workspace by lanes 0-7. No
weight stores, no proxy fence, no producer/consumer chain for the weights: a consumer loads
its weight codes a few steps ahead (``depth``) with plain 8-byte loads.

Work item (CTA ``(x, y)``): weight rows ``[256 x, 256 x + 256)`` of expert ``e`` x the
y-th (group, 128-token tile) (:func:`blockscale.ops._grouped_wgmma_ir.find_tile`). Consumer
warpgroup ``w`` (of 2, 256 threads: 255 registers a thread, no spills; 288 threads would be
capped at 168 and ``setmaxnreg`` spilled) owns the two 64-row slabs ``64 (2 j + w)`` (j = 0,
1): its accumulators are ``D[64 weight rows, nt tokens]`` per slab, ``nt`` = the tile's
token rows rounded up to 32 (32 / 64 / 96 / 128: the K loop is emitted once per width,
chosen per item).

K order: thread quad ``q`` of a warp feeds the wgmma's A columns ``2q, 2q+1, 2q+8, 2q+9`` of
every k16 slice. With the workspace written in
:func:`blockscale.ops.matmul_grouped_p1.kperm_source` order (the phase 1's ``kperm``), those
columns of slice j are the weight codes ``16 q + 4 j .. + 3`` of the 64-element step: a
thread's A registers for a whole step are the 16 consecutive codes ``16 q ..`` of each of
its rows (one 8-byte load, ONE NVFP4 block, one scale byte). The same permutation on both
operands leaves the dot products unchanged; the fp32 summation order inside a k16 wgmma is
the hardware's either way.

Values: the f16 operands of :mod:`blockscale.ops._f16_dequant_ir` (weights ``dec * |s| *
2^-7`` exact in f16, activations from the f16 phase 1, also times 2^-7); the epilogue
multiplies the fp32 accumulator by 2^14 (exact), the expert scale, then (NVFP4 D10) the row
scale, and rounds to bf16 (SEMANTICS §5).

Pipeline: ``stages`` shared stages of 128 token rows x 64 f16 (the workspace tile's k-step,
16-byte chunk c at ``c * 2048``: the K-major no-swizzle layout, LBO 2048, SBO 128). Lanes 0-7
of warp 0 fill the first ``stages`` steps (a bulk copy a lane: the nt rows of its chunk, their
bytes expected on the stage's full barrier) and, after its step s >= 1, once both
warpgroups released step s - 1's stage (parity ``((s - 1) // stages) & 1``), refills it
with step ``s - 1 + stages`` (a step late: the warpgroups may drift a step apart; measured
the same as refilling step s's stage, run BC). A step: wait full, convert the step's weights (loaded ``depth`` steps earlier;
masked rows / blocks read element 0 and get a zero scale at use, so nothing waits for a load
at its issue), issue the next loads, 8 wgmmas (2 slabs x 4 k16 slices), commit,
``wait_group 0`` (the A registers are read asynchronously:
:func:`blockscale.compiler.arch.wgmma.mma_async_rs`), fence the accumulators
(:func:`blockscale.compiler.arch.wgmma.fence_values`: otherwise LLVM hoists the epilogue's
multiplies above the wait and ptxas serializes every wgmma, C7514), release the stage (one
arrival a warpgroup). The other warpgroup's wgmmas keep the tensor pipe busy while one
converts. The lock-step interpreter runs this for any K.

Status (H200, runs AX-BG): correct (GPU tests, memcheck / racecheck), slower than the f16
paired pdq kernel: gpt-oss gate_up NVFP4 T=4096 1.74 ms (4 stages) vs 1.47, T=1024 1.20 vs
0.89, DeepSeek-V3 T=4096 5.9 vs 5.1. ncu (run BB): issue slots 37 %, 2 warps a
scheduler (255 registers, 1 CTA an SM: prologue / epilogue not overlapped), the top stall
the per-step ``wait_group 0`` (each warpgroup's convert -> mma -> wait chain). By parts (run
BF, T=4096, 4 stages): 1.85 ms; without the weight conversion 1.35; also without the ring's
waits and refills 0.95; also with ``wait_group 1`` 0.89. Both the conversion (~0.5 ms) and the
activation ring (~0.4 ms then: 8 bulk copies a step, refilled once both warpgroups
released a stage) need work before this kernel can beat the pdq one. Not dispatched.

Epilogue: every thread reaches two CTA barriers; the consumers write the scaled bf16 tile
TRANSPOSED (token rows, weight columns; a padded row pitch) into the freed ring, then the
first ``rows`` threads bulk-store one token row each (rows past the group end, columns past N
not written; N % 8 == 0). Expert id -1: zeros (D8), no K loop.
"""

from __future__ import annotations

from typing import Any

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import cpasync, tma
from blockscale.compiler.arch import wgmma as W
from blockscale.layouts import SF_ATOM_BYTES, SF_ATOM_ROWS
from blockscale.ops import _f16_dequant_ir as F16
from blockscale.ops._grouped_p1_ir import TILE, tile_bytes
from blockscale.ops._matmul_ir import tcgen_row_offset
from blockscale.ops._twophase_ir import _parity

Value = ir.Value

#: token rows per item, K step
BT, KSTEP = TILE, 64
#: (consumer warpgroups, 64-row weight slabs each): 2 x 2 (256 weight rows a CTA, 255
#: registers) or 3 x 1 (192 rows, 384 threads at 168 registers: three conversion chains)
SHAPES = ((2, 2), (3, 1))
#: token widths the K loop is emitted for (the item's rows rounded up to 32)
WIDTHS = (32, 64, 96, 128)
#: one stage: 128 token rows x 64 f16 (8 chunks of 16 bytes, 2048 bytes a chunk)
CHUNK_BYTES = BT * 16
#: 16-byte K chunks of a stage; lane c of warp 0 bulk-copies chunk c (:func:`_filler`)
CHUNKS = 8
STAGE_BYTES = CHUNKS * CHUNK_BYTES
DEPTHS = (1, 2, 3)


def weight_rows(wgs: int, slabs: int) -> int:
    """Weight rows of a CTA: ``64 wgs slabs``."""
    return 64 * wgs * slabs


def c_pitch(wgs: int, slabs: int) -> int:
    """The staged output tile's row pitch (the weight rows in bf16 + 16 bytes: the transposed
    writes of a warp spread over the banks)."""
    return 2 * weight_rows(wgs, slabs) + 16


def shared_bytes(stages: int, wgs: int = 2, slabs: int = 2) -> int:
    """The dynamic shared memory: max(ring, staged output tile) + 2 stages mbarriers."""
    return max(stages * STAGE_BYTES, BT * c_pitch(wgs, slabs)) + 16 * stages


class _Ring:
    """The stages, their full / empty mbarriers and the B descriptors."""

    def __init__(self, kb: Any, stages: int, wgs: int, slabs: int) -> None:
        self.stages = stages
        size = shared_bytes(stages, wgs, slabs)
        self.smem = tma.extern_shared_buffer(kb, size, align=128)
        self.base = W.shared_address(self.smem)
        self.bars = bir.add(self.base, bir.as_i64(bir.const(size - 16 * stages)))
        self.db0 = W.descriptor(self.base, lbo=CHUNK_BYTES, sbo=128)

    def full(self, slot: Value) -> Value:
        return bir.add(self.bars, bir.as_i64(bir.mul(slot, 8)))

    def empty(self, slot: Value) -> Value:
        return bir.add(self.bars, bir.as_i64(bir.add(bir.mul(slot, 8), 8 * self.stages)))


def _uniform(v: Value) -> Value:
    """Index ``v`` broadcast from lane 0 (``shfl.sync.idx``): provably warp-uniform."""
    from blockscale.compiler.arch import nvvm

    return bir.as_index(nvvm.shfl_idx(bir.as_i32(v), 0))


class _Weights:
    """A consumer thread's weight rows (slab j, rows g and g + 8 of its warp) and their
    per-step loads: 8 code bytes (the thread quad's NVFP4 block) and one scale byte each."""

    def __init__(self, kb: Any, e: Value, n0: Value, n_count: Value, k: Value, wgs: int,
                 slabs: int) -> None:
        tid = bir.thread_idx("x")
        wg, t = bir.udiv(tid, 128), bir.urem(tid, 128)
        warp, lane = bir.udiv(t, 32), bir.urem(t, 32)
        self.q = bir.urem(lane, 4)
        g = bir.udiv(lane, 4)
        self.k = k
        row_bytes = bir.udiv(k, 2)
        d1 = bir.ceil_div(bir.ceil_div(k, 16), 4)
        srow0 = bir.add(bir.mul(bir.mul(e, bir.ceil_div(n_count, SF_ATOM_ROWS)), SF_ATOM_ROWS), n0)
        self.slabs = slabs
        self.rows = []  # (valid, code byte offset of step 0, scale byte offset of step 0)
        for j in range(slabs):
            for h in range(2):
                local = bir.add(bir.add(bir.mul(bir.add(wg, wgs * j), 64),
                                        bir.mul(warp, 16)), bir.add(g, 8 * h))
                n = bir.add(n0, local)
                valid = bir.ult(n, n_count)
                code = bir.add(bir.mul(bir.add(bir.mul(e, n_count), n), row_bytes),
                               bir.mul(self.q, 8))
                scale = bir.add(tcgen_row_offset(bir.add(srow0, local), d1), self.q)
                self.rows.append((valid, code, scale))
        self.w, self.sfb = kb.arg("w"), kb.arg("sfb")

    def _live(self, s: Value) -> Value:
        """Whether step ``s`` holds this thread quad's block (K % 16 == 0: a block lies wholly
        inside or outside K)."""
        return bir.ult(bir.add(bir.mul(s, KSTEP), bir.mul(self.q, 16)), self.k)

    def masked(self, s: Value, regs: list[Value]) -> list[Value]:
        """Step ``s``'s loaded values with the scales of rows past N / blocks past K zeroed
        (their codes were read from element 0: finite values times 0)."""
        live = self._live(s)
        out = []
        for r, (valid, _, _) in enumerate(self.rows):
            ok = bir.logical_and(valid, live)
            out += [regs[2 * r], bir.select(ok, regs[2 * r + 1], bir.i32_bits(0))]
        return out

    def load(self, s: Value) -> list[Value]:
        """Step ``s``'s codes (``vector<2xi32>``) and scale (i32) of each row (two values a
        row); rows past N / blocks past K read element 0 (:meth:`masked` zeroes their scale
        at use, so no instruction here waits for the load)."""
        out = []
        live = self._live(s)
        for valid, code, scale in self.rows:
            ok = bir.logical_and(valid, live)
            data = vector.bitcast(bir.vec(2, bir.i32()), bir.vector_load(
                bir.vec(8, bir.i8()), self.w, bir.select(ok, bir.add(code, bir.mul(s, 32)), 0),
                alignment=8))
            sc = bir.load(self.sfb, bir.select(ok, bir.add(scale, bir.mul(s, SF_ATOM_BYTES)), 0))
            out += [data, arith.extui(bir.i32(), arith.bitcast(bir.i8(), sc))]
        return out


def a_registers(regs: list[Value]) -> list[list[list[Value]]]:
    """The step's A registers ``[slab][slice] -> 4 i32`` from :meth:`_Weights.load`'s values:
    each row's 16 codes -> 8 f16 pairs times its scale (:mod:`blockscale.ops._f16_dequant_ir`);
    slice j takes pairs 2j (registers 0 / 1: rows g / g + 8) and 2j + 1 (registers 2 / 3)."""
    out = []
    for j in range(len(regs) // 4):
        rows = []
        (d0, s0), (d1, s1) = (regs[4 * j:4 * j + 2], regs[4 * j + 2:4 * j + 4])
        splats = F16.splats(bir.bit_or(s0, bir.shl(s1, bir.i32_bits(8))))
        for data, splat in ((d0, splats[0]), (d1, splats[1])):
            rows.append([p for wd in range(2)
                         for p in F16.scaled_pairs(vector.extract(data, [], [wd]), splat)])
        out.append([[rows[0][2 * i], rows[1][2 * i], rows[0][2 * i + 1], rows[1][2 * i + 1]]
                    for i in range(4)])
    return out


def _consumer_loop(ring: _Ring, wts: _Weights, steps: Value, nt: int, depth: int,
                   fill: Any) -> list[Value]:
    """One consumer warpgroup's K loop at token width ``nt``: the slabs x nt / 2
    accumulators. Lanes 0-7 of warp 0 (:func:`_filler`) fill the first ``stages`` steps, and
    after their step s >= 1 step ``s - 1 + stages`` into step s - 1's stage, once every
    warpgroup released it."""
    st = ring.stages
    with bir.when(bir.ult(bir.thread_idx("x"), CHUNKS)):  # the filling lanes (_filler)
        for t in range(st):
            with bir.when(bir.ult(bir.const(t), steps)):
                fill(bir.const(t))
    zero = bir.const(0.0, bir.f32())
    slabs = wts.slabs
    acc0 = [zero] * (slabs * nt // 2)  # slabs of nt / 2
    nacc = len(acc0)
    pre = []
    for d in range(depth):
        pre += wts.load(bir.const(d))
    one = 2 * len(wts.rows)  # values a step loads (:meth:`_Weights.load`)
    tid = bir.thread_idx("x")
    with bir.for_range(0, steps, carry=acc0 + pre) as lp:
        s = lp.iv
        accs = list(lp.carried[:nacc])
        regs = list(lp.carried[nacc:])
        slot = bir.urem(s, ring.stages)
        cpasync.mbarrier_wait(ring.full(slot), _parity(bir.udiv(s, ring.stages)))
        a = a_registers(wts.masked(s, regs[:one]))
        nxt = regs[one:] + wts.load(bir.add(s, depth))
        db = W.advance(ring.db0, bir.as_i64(bir.mul(slot, STAGE_BYTES)))
        W.fence()
        for j in range(slabs):
            acc = accs[j * nt // 2:(j + 1) * nt // 2]
            for i in range(4):
                acc = W.mma_async_rs(acc, a[j][i], W.advance(db, 2 * i * CHUNK_BYTES), nt)
            accs[j * nt // 2:(j + 1) * nt // 2] = acc
        W.commit_group()
        # retire this step's wgmmas before the next step's A registers are computed (they
        # read their A registers asynchronously); the other warpgroup's wgmmas keep the
        # tensor pipe busy meanwhile
        W.wait_group(0)
        accs = W.fence_values(accs)
        with bir.when(bir.eq(bir.urem(tid, 128), 0)):
            cpasync.mbarrier_arrive(ring.empty(slot))
        # lanes 0-7 refill the stage of step s - 1 (not s): the other warpgroup released it
        # a step ago unless it lags by more, so the warpgroups may drift apart by a step and
        # one converts while the other's wgmmas run
        prev = bir.sub(s, 1)
        refill = bir.add(prev, st)
        with bir.when(bir.logical_and(bir.logical_and(bir.ult(tid, CHUNKS), bir.ult(0, s)),
                                      bir.ult(refill, steps))):
            cpasync.mbarrier_wait(ring.empty(bir.urem(prev, st)), _parity(bir.udiv(prev, st)))
            fill(refill)
        lp.yield_(*accs, *nxt)
    return list(lp.results[:nacc])


def _by_width(ring: _Ring, wts: _Weights, steps: Value, width: Value, depth: int, fill: Any,
              i: int = 0) -> list[Value]:
    """The K loop of the smallest :data:`WIDTHS` entry >= ``width`` (from ``WIDTHS[i]`` on),
    its accumulators padded with zeros to slabs x 64."""
    nt = WIDTHS[i]
    if i == len(WIDTHS) - 1:
        return _consumer_loop(ring, wts, steps, nt, depth, fill)
    slabs = wts.slabs
    br = bir.if_(bir.ule(width, bir.const(nt)), [bir.f32()] * (64 * slabs))
    with br.then():
        acc = _consumer_loop(ring, wts, steps, nt, depth, fill)
        pad = [bir.const(0.0, bir.f32())] * (64 - nt // 2)
        br.yield_(*[v for j in range(slabs) for v in (*acc[j * nt // 2:(j + 1) * nt // 2],
                                                      *pad)])
    with br.else_():
        br.yield_(*_by_width(ring, wts, steps, width, depth, fill, i + 1))
    return list(br.results)


def _filler(ring: _Ring, src: Value, nt_bytes: Value) -> Any:
    """``fill(t)`` for lanes 0 .. 7 of warp 0: step t's nt token rows of chunk ``lane`` into
    its (free) stage, one bulk copy a lane (one instruction for the 8), their bytes expected on
    the stage's full barrier by lane 0 first."""
    def fill(t: Value) -> None:
        lane = bir.thread_idx("x")
        slot = bir.urem(t, ring.stages)
        with bir.when(bir.eq(lane, 0)):
            cpasync.mbarrier_arrive_expect_tx_n(ring.full(slot),
                                                bir.as_i32(bir.mul(nt_bytes, CHUNKS)))
        off = bir.mul(lane, CHUNK_BYTES)
        dst = bir.add(ring.base, bir.as_i64(bir.add(bir.mul(slot, STAGE_BYTES), off)))
        cpasync.bulk_copy_n(dst, bir.add(src, bir.as_i64(bir.add(bir.mul(t, STAGE_BYTES), off))),
                            bir.as_i32(nt_bytes), ring.full(slot))
    return fill


def _stage_tile(ring: _Ring, accs: list[Value], value: Any, m0: Value, n0: Value, wgs: int
                ) -> None:
    """A consumer thread's accumulators (slabs x 64, width 128) -> bf16 ``value(v, m, n)``
    at (token row, weight column) of the staged tile."""
    tid = bir.thread_idx("x")
    wg, t = bir.udiv(tid, 128), bir.urem(tid, 128)
    warp, lane = bir.udiv(t, 32), bir.urem(t, 32)
    g, q = bir.udiv(lane, 4), bir.urem(lane, 4)
    slabs = len(accs) // 64
    pitch = c_pitch(wgs, slabs)
    for j in range(slabs):
        wrow0 = bir.add(bir.mul(bir.add(wg, wgs * j), 64), bir.add(bir.mul(warp, 16), g))
        for i in range(64):
            wrow = bir.add(wrow0, 8 * ((i % 4) // 2))
            tok = bir.add(bir.mul(q, 2), 8 * (i // 4) + i % 2)
            v = value(accs[j * 64 + i], bir.add(m0, tok), bir.add(n0, wrow))
            at = bir.add(bir.mul(tok, pitch), bir.mul(wrow, 2))
            bir.vector_store(vector.bitcast(bir.vec(2, bir.i8()),
                                            vector.from_elements(bir.vec(1, bir.bf16()), [v])),
                             ring.smem, at, alignment=2)


def emit(kb: Any, stages: int, depth: int, row_scales: bool, wgs: int = 2) -> None:
    """The kernel body (module docstring); the grouped pdq kernel's workspace arguments.
    ``wgs``: :data:`SHAPES`' consumer warpgroups (2: two slabs each, 3: one)."""
    from blockscale.ops._grouped_wgmma_ir import find_tile
    from blockscale.ops.matmul_grouped_sm90 import work_item

    if depth not in DEPTHS:
        raise ValueError(f"depth must be one of {list(DEPTHS)}, got {depth!r}")
    slabs = dict(SHAPES).get(wgs)
    if slabs is None:
        raise ValueError(f"wgs must be one of {[w for w, _ in SHAPES]}, got {wgs!r}")
    bw = weight_rows(wgs, slabs)
    n_count, k, groups = (bir.as_index(kb.arg(x)) for x in ("n", "k", "num_groups"))
    g, tile, has_work = find_tile(BT, kb, groups)
    with bir.when(has_work):  # CTA-uniform
        start, end, expert, m0, n0, active = work_item(kb, g, tile, BT, bw)
        rows = bir.umin(bir.sub(end, m0), BT)
        ring = _Ring(kb, stages, wgs, slabs)
        tid = bir.thread_idx("x")
        with bir.when(bir.eq(tid, 0)):
            for i in range(stages):
                cpasync.mbarrier_init(ring.full(bir.const(i)), 1)
                cpasync.mbarrier_init(ring.empty(bir.const(i)), wgs)
            tma.fence_mbarrier_init()
        bir.barrier()
        e = bir.as_index(bir.select(active, expert, bir.const(0, bir.i32())))
        steps = bir.select(active, bir.ceil_div(k, KSTEP), bir.const(0))
        tile0 = bir.add(bir.udiv(start, SF_ATOM_ROWS),
                        bir.as_index(bir.load(kb.arg("a_scale_offsets"), g)))
        src = bir.add(cpasync.global_address(kb.arg("wa")),
                      bir.as_i64(bir.mul(bir.add(tile0, tile), tile_bytes(k))))
        # warp-uniform values (broadcast from lane 0): ptxas serializes wgmmas under
        # branches or loop bounds it cannot prove uniform
        width = _uniform(bir.mul(bir.ceil_div(rows, 32), 32))
        steps = _uniform(steps)
        fill = _filler(ring, src, bir.mul(width, 16))
        accs = _by_width(ring, _Weights(kb, e, n0, n_count, k, wgs, slabs), steps, width,
                         depth, fill)
        f32 = bir.f32()

        scale_e = bir.select(active, bir.load(kb.arg("expert_scales"), e), bir.const(0.0, f32))
        fix = bir.const(F16.ACC_SCALE, f32)

        def value(v: Value, m: Value, n: Value) -> Value:
            v = arith.mulf(arith.mulf(v, fix), scale_e)
            if row_scales:  # D10: times the expert scale, then the row scale
                mm = bir.umin(m, bir.sub(end, 1))  # rows past the end are not stored
                v = arith.mulf(v, arith.extf(f32, bir.load(kb.arg("a_row_scales"), mm)))
            return arith.truncf(bir.bf16(), v)

        bir.barrier()  # every wgmma retired, every copy landed: the ring is free
        _stage_tile(ring, accs, value, m0, n0, wgs)
        W.fence_proxy_async_shared()
        bir.barrier()
        with bir.when(bir.ult(tid, rows)):  # one token row a thread
            cols = bir.umin(bir.sub(n_count, n0), bw)
            dst = bir.add(cpasync.global_address(kb.arg("c")), bir.as_i64(
                bir.mul(bir.add(bir.mul(bir.add(m0, tid), n_count), n0), 2)))
            cpasync.bulk_store(dst, bir.add(ring.base, bir.as_i64(bir.mul(tid, c_pitch(wgs,
                                                                                       slabs)))),
                               bir.as_i32(bir.mul(cols, 2)))
            cpasync.bulk_commit()
            cpasync.bulk_wait_read()

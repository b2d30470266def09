"""IR of the two-phase sm_90a NVFP4 / MXFP4 matmul (:mod:`blockscale.ops.matmul_twophase`).

Imports MLIR: only :func:`blockscale.ops.matmul_twophase.build` imports it.

Workspace layout ("stage-ordered"): an operand's bf16 dequantization, ``rows_pad`` rows
(a multiple of the phase-2 tile height ``tile``: 128 for A, 256 for B) x ``k_pad`` (``K``
rounded up to :data:`KPAD`), stored per tile-row (``tile`` rows) as one span of ``tile *
k_pad * 2`` bytes, chunk-major: the 16-byte chunk ``c`` (K-elements ``8 c .. 8 c + 7``) of
row ``r`` is at ``(r // tile) * tile * k_pad * 2 + c * tile * 16 + (r % tile) * 16``
(:func:`ws_offset`). That is the canonical no-swizzle K-major wgmma layout with core
matrices (8 rows x 16 bytes) at LBO = ``tile * 16`` bytes along K and SBO = 128 along
M / N, and a k-step of any ``kstep`` is ONE contiguous span of ``tile * kstep * 2`` bytes.

128B-swizzled workspaces (``swizzle="128b"``, phase 2 at kstep 64): per tile-row and
64-element K block (one k64 stage, ``tile * 128`` bytes) the rows' 128-byte lines in row
order, the 16-byte chunk ``c`` (K-elements ``8 c .. 8 c + 7`` of the block) of row ``r`` at
``(c ^ (r % 8)) * 16`` in its line: ``(r // tile) * tile * k_pad * 2 + (c8 // 8) * tile *
128 + (r % tile) * 128 + ((c8 % 8) ^ (r % 8)) * 16`` for the row's chunk ``c8``. Copied
verbatim to a 1024-byte aligned stage, that is the K-major SWIZZLE_128B wgmma layout (8-row
atoms of 1024 bytes, SBO 1024; the 128B swizzle XORs shared address bits [4:6] with [7:9]),
which CUTLASS's Hopper GEMMs use: a k16 wgmma's 8 rows x 32 bytes of an atom then sit in
distinct 16-byte bank groups, where the interleaved no-swizzle core matrices (8 rows x 16
bytes, contiguous) are the suspect of phase 2's shortfall (issue #9). The k16 steps advance
the descriptors' start by 32 bytes inside the row.

Phase 1, :func:`emit_dequant` (one launch per operand): thread ``t`` takes row
``(t // tile // pieces) * tile + t % tile`` and the 64-element piece ``(t // tile) %
pieces`` (``pieces = k_pad / 64``): two 16-byte loads of packed FP4 (one 32-byte sector)
and its scale bytes, eight 16-byte stores of bf16 with the block scale folded in exactly as
the wgmma "fold" kernel does (``_wgmma_ir._dequant_row`` with ``dequant="lut"`` and
``_wgmma_ir._scale_values``: NVFP4 E2M1 x |E4M3|, MXFP4 times ``2^(e - 127 +
MX_FOLD_EXP)``). Consecutive threads take consecutive rows, so each store instruction of a
warp writes 512 contiguous bytes. Rows past the operand and elements past K are zeros, so
phase 2 needs no guards.

Phase 2, :func:`emit_mainloop`: a pure bf16 GEMM over the workspaces. A CTA (``bm / 64``
consumer warpgroups: bm = 128, 256 threads, or 192, 384 threads) computes a ``bm x bn``
tile (``bn`` 256, or any multiple of 16 in [64, 256]: ``wgmma m64n<bn>k16``; B's
workspace is made with tile ``bn``) from a ring of ``stages`` shared stages (A: ``bm x
kstep``, then B: ``bn x kstep`` bf16) and ``2 stages`` mbarriers (full[], empty[]), all in the one dynamic shared buffer
(``tma.extern_shared_buffer``: issue #9). Thread 0 is also the producer: per step it does
``mbarrier.arrive.expect_tx`` on full[slot] and two
``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes`` (UBLKCP: the step's A
span and B span, 16 + 32 KiB at bm 128, kstep 64). Step s (every thread):

1. wait on full[s % stages] (parity ``(s / stages) & 1``);
2. ``wgmma.fence``, ``kstep / 16`` ``m64n<bn>k16`` wgmmas per warpgroup, ``commit_group``,
   ``wait_group 1`` (retires step s - 1);
3. one thread per warpgroup arrives on empty[(s - 1) % stages] (count ``bm / 64``): step
   s - 1's stage is free;
4. thread 0 waits on that empty barrier and refills the stage with step s + stages - 1.

So ``stages - 1`` steps of copies are in flight while the tensor cores run. The bulk copies
write through the async proxy, as the wgmma reads: no ``fence.proxy.async`` (whose
``MEMBAR.ALL.CTA`` waited for the in-flight cp.async copies of the previous version) and no
CTA barrier in the loop. Step 0 "releases" stage ``stages - 1`` (not yet read) instead of
branching on ``step == 0``: a first-iteration branch makes LLVM peel the loop, and the
peeled zero-accumulator moves inside its wgmma pipeline make ptxas serialize every wgmma of
the kernel (C7515). The k16 wgmma sequence and the bf16 operands equal the wgmma fold
kernel's (lut, any kstep), so in the interpreter's model the outputs are bit-identical to
``matmul_wgmma``'s fold kernel.

Persistent phase 2, :func:`emit_persistent` (``schedule="persistent"``, issue #9): a grid
of ``G`` CTAs (the host launches ``min(tiles, SMs)``), CTA ``b`` taking tiles ``b, b + G,
...`` in the rasterized order below; per tile the same k-steps and k16 wgmma order as
:func:`emit_mainloop`, then the epilogue. The ring's step counter is the CTA's (tile ``i``,
k-step ``kk``) -> ``i * steps + kk``, so the mbarrier parities continue across tiles, and
the refill at step ``s`` is of step ``s + stages - 1`` whichever tile it belongs to (this
tile's k-step: from the tile's hoisted sources; past it, by a division): the next tile's
first ``stages - 1`` stages are copied during this tile's last wgmmas and its epilogue, so
the refill at each tile's start and the CTA launch / retire between tiles disappear and
only the epilogue stays exposed. The wave quantization stays: 1472 tiles over 132 CTAs
(8192 x 5760) are 12 tiles for 20 CTAs and 11 for the others, as 12 waves were (a K split
of the last partial round would fix it but sums K in another order: not bit-identical;
tiles of mixed heights 128 / 192 would be, not built). SASS (ptxas 13.0, NVFP4
bf16 out): 235 registers (154 one CTA per tile; 1 CTA / SM either way at 196,672 shared
bytes), no spills, 4 HGMMA / 2 + 2 UBLKCP in the K loop (two refill paths), the K loop
306 static instructions (the cold later-tile refill with its divisions included), the
epilogue ~1,500 per thread and tile (930 one CTA per tile: ptxas packs the 128 store
guards' predicates into registers, P2R / LOP3).

Clusters, ``cluster=2`` (:func:`emit_mainloop`, issue #9): the grid runs as clusters of 2
CTAs along M (launch attribute CLUSTER_DIMENSION (2, 1, 1)); cluster ``blockIdx.x / 2``
takes M-tiles ``2 pm`` and ``2 pm + 1`` of one column tile (:func:`cluster_tile`), so both
CTAs read the same B tile-row. Each CTA's producer copies its own A span and half of the B
span (``%cluster_ctarank`` picks the half) with
``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster``
(ctaMask 0b11) to the same offset of both CTAs' stage; each CTA's full barrier expects the
whole stage (A + B bytes), one half of B completing from the peer. A stage is refilled
only once both CTAs are done with it, as the refill writes both: empty barriers count ``2 bm
/ 64`` arrivals, each warpgroup's releasing thread arriving on its own and (``mapa`` +
``mbarrier.arrive.shared::cluster``, release.cta: the wgmmas that read the stage retired)
on the peer's. A peer's complete_tx may reach a full barrier before that CTA's own
expect_tx (the tx-count goes negative; the pending arrival keeps the phase open), never
before the barrier's previous phase completed (the peer refills a slot only after this
CTA's consumers, past their full wait, released it). A cluster barrier after the mbarrier
init (``fence.mbarrier_init.release.cluster``, then a relaxed arrive and a wait) precedes
any remote access; every thread arrives (release) after the K loop and waits at the very
end, so no CTA exits while its peer may still arrive on its mbarriers (the peer's multicast
writes into this CTA all completed on full barriers this CTA waited on). Per pair a k64
step reads 2 x 16 + 32 KiB from L2 instead of 2 x 48 KiB (-33 % at 128 x 256; bytes per
flop (128 + 128) / (128 x 256) against (128 + 256)); the same operands and k16 order per
tile, so the same bytes. With an odd number of M-tiles the last cluster's second CTA loads
A's last tile-row again and stores nothing. SASS (ptxas 13.0, NVFP4 bf16 staged): 154
registers at 128 x 256 (146 at 240), as without clusters; K loop 128 instructions (122
without; 133 vs 127 at 240): one UBLKCP.S.G.MULTICAST + one UBLKCP, one local and one
remote arrival (SYNCS.ARRIVE.TRANS64.RED, no MEMBAR); UCGABAR_ARV / _WAIT twice.

CTA order: tile ``t`` of the 1-D grid is rasterized in groups of :data:`RASTER` M-tiles
(M fastest inside a group), so the CTAs of a wave share B's and A's workspace rows in L2.

Performance model (sm_90a SASS, tools/sass_loop_counts.py; ptxas 13.0): phase 2 154
registers at kstep 64 / 4 stages (196,672 shared bytes), 162 at kstep 32 / 9 stages
(221,328), no spills; the K loop is 121 (119) instructions per thread and step including
the producer's path: 2 UBLKCP, 4 (2) HGMMA.64x256x16, 4 SYNCS (2 waits, 2 arrivals), one
WARPGROUP.DEPBAR, no MEMBAR / BAR: ~240 issue cycles per SM against 1024 (512) tensor
cycles. Each CTA step reads 48 KiB (kstep 64) from L2 per 4.2 MFLOP: 800 TFLOP/s would
need ~9 TB/s of L2 -> SM bandwidth (no multicast), so expect it to be L2-bound below the
tensor peak; bm = 192 (154 registers, 229,440 shared bytes at 4 stages) reads 56 KiB per
6.3 MFLOP, 22% fewer bytes per flop. Phase 1: 40 registers (NVFP4), per thread two LDG.E.128 + the scale load(s)
and eight STG.E.128; ~105 MB of traffic at 8192 x 5760 x 2944. 128B-swizzled: phase 2 the
same (154 registers, 4 HGMMA / 2 UBLKCP per step; descriptors or-ed with the constant
SWIZZLE_128B | SBO 1024 | LBO 16); phase 1 stages its 32 KiB of lines in shared memory (8
STS.128, BAR.SYNC, 8 LDS.128, 8 STG.E.128 a thread; 50 registers at tile 256 NVFP4).
"""

from __future__ import annotations

from typing import Any

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import cpasync, tma
from blockscale.compiler.arch import nvvm as N
from blockscale.compiler.arch import wgmma as W
from blockscale.layouts import SF_ATOM_BYTES
from blockscale.ops import _wgmma_ir as X
from blockscale.ops._matmul_ir import tcgen_row_offset

Value = ir.Value

#: the phase-2 CTA tile (two warpgroups of m64n256); BMS: the tile heights built
BM, BN = 128, 256
BMS = (128, 192)
#: K of the workspaces is padded to a multiple of this (every phase-2 kstep divides it)
KPAD = 64
#: M-tiles per raster group of the phase-2 grid
RASTER = 8
#: phase-1 threads per block
DEQUANT_THREADS = 256
LBO = X.LBO
#: workspace / shared operand layouts: "none" (canonical interleaved core matrices) or
#: "128b" (the 128-byte swizzle; phase 2 at kstep 64 only)
SWIZZLES = ("none", "128b")
#: 128B swizzle: bytes of one 8-row atom (the SBO between row groups; stage alignment)
SW128_ATOM = 1024
#: phase-2 cluster sizes built (CTAs along M sharing B's stages by multicast)
CLUSTERS = (1, 2)


# ---- phase 1 ---------------------------------------------------------------------------------


def ws_offset(row: Value, chunk: Value | int, tile: int, kp: Value) -> Value:
    """Byte offset in a workspace of the 16-byte chunk ``chunk`` (8 K-elements) of ``row``:
    tile-row ``row // tile`` is one span of ``tile * kp * 2`` bytes, chunk-major (module
    docstring)."""
    return bir.add(bir.add(bir.mul(bir.udiv(row, tile), bir.mul(kp, 2 * tile)),
                           bir.mul(chunk, 16 * tile)), bir.mul(bir.urem(row, tile), 16))


def emit_dequant(x: Value, sfx: Value, ws: Value, rows: Value, rows_pad: Value, k: Value,
                 fmt: str, tile: int, swizzle: str = "none", kb: Any = None,
                 trigger: bool = False) -> None:
    """Phase 1 for one operand: ``x`` ``[rows, K/2]`` packed FP4 (i8 memref), ``sfx`` its
    5-D scales, ``ws`` the stage-ordered bf16 workspace of ``rows_pad`` rows (a multiple of
    ``tile``) x ``k_pad`` (i8 memref); index values. ``swizzle`` "none": :func:`ws_offset`;
    "128b": the 128B-swizzled layout (module docstring), staged through shared memory (``kb``: the kernel
    builder): thread ``t``'s piece is the workspace's 128-byte line ``t``, so a block's
    output is one contiguous span of ``DEQUANT_THREADS`` lines; the threads store their
    swizzled lines to shared memory (conflict-free: the 8 threads of a quarter warp hit 8
    different 16-byte chunks), then copy the span out 16 bytes a thread (each warp store
    writes 512 contiguous bytes; direct stores would write 16 bytes to each of 32 lines).
    ``trigger``: every thread first executes ``griddepcontrol.launch_dependents``, so a phase
    2 launched with programmatic stream serialization is scheduled once the last block of
    this grid has started (it waits for this grid's writes: :func:`emit_mainloop` ``pdl``)."""
    if swizzle not in SWIZZLES:
        raise ValueError(f"swizzle must be one of {list(SWIZZLES)}, got {swizzle!r}")
    if trigger:
        N.launch_dependents()
    stage = None
    if swizzle == "128b":
        stage = tma.shared_buffer(kb, f"{DEQUANT_THREADS * 128}xi8", align=128)
    block = 16 if fmt == "nvfp4" else 32
    nscales = 32 // block
    kp = bir.mul(bir.ceil_div(k, KPAD), KPAD)
    pieces = bir.udiv(kp, 64)
    t = bir.add(bir.mul(bir.block_idx("x"), DEQUANT_THREADS), bir.thread_idx("x"))
    rest = bir.udiv(t, tile)
    piece = bir.urem(rest, pieces)
    row = bir.add(bir.mul(bir.udiv(rest, pieces), tile), bir.urem(t, tile))
    vd, vs = bir.vec(16, bir.i8()), bir.vec(nscales, bir.i8())
    d1 = bir.ceil_div(bir.ceil_div(k, block), 4)
    with bir.when(bir.ult(row, rows_pad)):
        for half in range(2):  # two 32-element halves: one 32-byte sector of the row
            p = bir.add(bir.mul(piece, 2), half)
            ok = bir.logical_and(bir.ult(row, rows), bir.ult(bir.mul(p, 32), k))
            br = bir.if_(ok, [vd, vs])
            with br.then():
                data = bir.vector_load(vd, x, bir.add(bir.mul(row, bir.udiv(k, 2)),
                                                      bir.mul(p, 16)), alignment=16)
                j = bir.mul(p, nscales)
                off = bir.add(tcgen_row_offset(row, d1),
                              bir.add(bir.mul(bir.udiv(j, 4), SF_ATOM_BYTES), bir.urem(j, 4)))
                br.yield_(data, bir.vector_load(vs, sfx, off, alignment=nscales))
            with br.else_():
                br.yield_(bir.const(0, vd), bir.const(0, vs))
            data, scales = br.results
            sv = X._scale_values(arith.extui(bir.vec(nscales, bir.i32()), scales), "lut", fmt)
            splats = tuple(vector.broadcast(bir.vec(2, bir.bf16()), vector.extract(sv, [], [i]))
                           for i in range(nscales))
            if stage is None:
                base = ws_offset(row, bir.mul(p, 4), tile, kp)
                dst, offs = ws, [bir.add(base, 16 * tile * c) for c in range(4)]
            else:  # line tid of the block's span, chunk 4 half + c at ((4 half + c) ^ tid % 8)
                tid = bir.thread_idx("x")
                dst, offs = stage, [bir.add(bir.mul(tid, 128), bir.mul(
                    arith.xori(bir.urem(tid, 8), bir.const(4 * half + c)), 16))
                    for c in range(4)]
            for off, v in zip(offs, X._dequant_row(data, splats, "lut", block), strict=True):
                bir.vector_store(vector.bitcast(vd, v), dst, off, alignment=16)
    if stage is not None:
        bir.barrier()
        lines = bir.mul(rows_pad, pieces)  # the workspace's 128-byte lines
        span0 = bir.mul(bir.block_idx("x"), DEQUANT_THREADS)
        tid = bir.thread_idx("x")
        for i in range(8):
            j = bir.add(tid, i * DEQUANT_THREADS)  # the 16-byte unit of the span
            with bir.when(bir.ult(bir.add(span0, bir.udiv(j, 8)), lines)):
                v = bir.vector_load(vd, stage, bir.mul(j, 16), alignment=16)
                bir.vector_store(v, ws, bir.add(bir.mul(span0, 128), bir.mul(j, 16)),
                                 alignment=16)


# ---- phase 2 ---------------------------------------------------------------------------------


def stage_bytes(kstep: int, bm: int = BM, bn: int = BN) -> int:
    """Shared bytes of one stage: (bm + bn) rows of ``kstep`` bf16."""
    return (bm + bn) * 2 * kstep


def barrier_offset(kstep: int, stages: int, bm: int = BM, bn: int = BN) -> int:
    """Byte offset of the ``2 stages`` mbarriers (full, then empty) after the ring."""
    return stages * stage_bytes(kstep, bm, bn)


def shared_bytes(kstep: int, stages: int, bm: int = BM, bn: int = BN) -> int:
    """Dynamic shared bytes of phase 2: the ring and its mbarriers."""
    return barrier_offset(kstep, stages, bm, bn) + 16 * stages


def raster_tile(tiles_m: Value, tiles_n: Value, t: Value | None = None,
                group: int = RASTER) -> tuple[Value, Value]:
    """(m tile, n tile) of the 1-D tile index ``t`` (default ``blockIdx.x``), in groups of
    ``group`` (:data:`RASTER`) M-tiles."""
    t = bir.block_idx("x") if t is None else t
    per_group = bir.mul(tiles_n, group)
    first = bir.mul(bir.udiv(t, per_group), group)
    size = bir.umin(bir.sub(tiles_m, first), group)
    r = bir.urem(t, per_group)
    return bir.add(first, bir.urem(r, size)), bir.udiv(r, size)


def cluster_tile(tiles_m: Value, tiles_n: Value, rank: Value,
                 cluster: int = 2) -> tuple[Value, Value]:
    """Clusters of ``cluster`` CTAs along M (``cluster`` consecutive ``blockIdx.x``, CTA
    ``rank`` of its cluster): (m tile, n tile) of this CTA. Cluster ``blockIdx.x /
    cluster`` takes the M-tiles ``cluster * pm + rank`` of column tile ``nt``, (pm, nt)
    rasterized as :func:`raster_tile` over ``ceil(tiles_m / cluster)`` cluster rows in
    groups of ``RASTER / cluster`` (the same M span per group as without clusters), so the
    CTAs of a cluster share B's tile-row. The m tile of the last cluster row may be
    ``>= tiles_m`` (odd ``tiles_m``): that CTA loads A's last tile-row and stores nothing."""
    rows = bir.ceil_div(tiles_m, cluster)
    pm, nt = raster_tile(rows, tiles_n, bir.udiv(bir.block_idx("x"), cluster),
                         max(1, RASTER // cluster))
    return bir.add(bir.mul(pm, cluster), bir.as_index(rank)), nt


def _parity(v: Value) -> Value:
    return bir.as_i32(bir.urem(v, 2))


def _check_ring(kstep: int, stages: int, bm: int, swizzle: str, bn: int = BN) -> None:
    if swizzle not in SWIZZLES:
        raise ValueError(f"swizzle must be one of {list(SWIZZLES)}, got {swizzle!r}")
    if swizzle == "128b" and kstep != 64:
        raise ValueError(f"the 128B swizzle takes kstep 64 (one 128-byte row), got {kstep}")
    if stages < 2:
        raise ValueError(f"stages must be >= 2, got {stages}")
    if kstep % 16:
        raise ValueError(f"kstep must be a multiple of 16, got {kstep}")
    if bm % 64:
        raise ValueError(f"bm must be a multiple of 64, got {bm}")
    if bn % 16 or not 64 <= bn <= 256:  # wgmma n; 16-byte rows of C; 8-row swizzle atoms
        raise ValueError(f"bn must be a multiple of 16 in [64, 256], got {bn}")


class _Ring:
    """Phase 2's shared ring (``stages`` stages + full / empty mbarriers in the one dynamic
    shared buffer) and the per-step pieces of its protocol (:func:`emit_mainloop`); ``step``
    values are counted over the CTA's whole life, so the mbarrier phases run on across tiles
    (:func:`emit_persistent`)."""

    def __init__(self, kb: bir.KernelBuilder, k: Value, kstep: int, stages: int, bm: int,
                 swizzle: str, bn: int = BN, cluster: int = 1,
                 rank: Value | None = None) -> None:
        _check_ring(kstep, stages, bm, swizzle, bn)
        if cluster not in CLUSTERS:
            raise ValueError(f"cluster must be one of {list(CLUSTERS)}, got {cluster!r}")
        self.kstep, self.stages, self.bm, self.bn = kstep, stages, bm, bn
        self.cluster = cluster
        self.dtype = "bf16"  # the stages' operand type (the producer-dequant kernels: f16 too)
        if cluster > 1:  # this CTA's rank (i32) and its peer's
            self.rank = N.cluster_ctarank() if rank is None else rank
            self.peer = arith.xori(self.rank, bir.const(1, bir.i32()))
        self.a_bytes, self.b_bytes = bm * 2 * kstep, bn * 2 * kstep
        self.sbytes = self.a_bytes + self.b_bytes
        # the dynamic shared memory as a CUDA extern array (gpu.dynamic_shared_memory
        # becomes a "demoted" static variable: issue #9)
        self.sw = swizzle == "128b"
        smem = tma.extern_shared_buffer(kb, shared_bytes(kstep, stages, bm, bn),
                                        align=SW128_ATOM if self.sw else 128)
        self.tid = bir.thread_idx("x")
        self.wg = bir.udiv(self.tid, 128)
        self.is_prod = bir.eq(self.tid, 0)
        self.kp = bir.mul(bir.ceil_div(k, KPAD), KPAD)
        self.steps = bir.ceil_div(k, kstep)
        self.base = W.shared_address(smem)
        self.bars = bir.add(self.base,
                            bir.as_i64(bir.const(barrier_offset(kstep, stages, bm, bn))))

    def full(self, slot: Value) -> Value:
        return bir.add(self.bars, bir.as_i64(bir.mul(slot, 8)))

    def empty(self, slot: Value) -> Value:
        return bir.add(self.bars, bir.as_i64(bir.add(bir.mul(slot, 8), 8 * self.stages)))

    def sources(self, wa: Value, wb: Value, m0: Value, n0: Value) -> tuple[Value, Value]:
        """Global addresses of the tile-rows at A row ``m0``, B row ``n0``; k-step s of A is
        bytes [s a_bytes, (s + 1) a_bytes) of its span."""
        bm, bn, kp = self.bm, self.bn, self.kp
        return (bir.add(cpasync.global_address(wa),
                        bir.as_i64(bir.mul(bir.udiv(m0, bm), bir.mul(kp, 2 * bm)))),
                bir.add(cpasync.global_address(wb),
                        bir.as_i64(bir.mul(bir.udiv(n0, bn), bir.mul(kp, 2 * bn)))))

    def produce(self, step: Value, src_a: Value, src_b: Value, kk: Value) -> None:
        """Thread 0: fill the stage of CTA step ``step`` (its stage is free) with k-step
        ``kk`` of the tile-rows at ``src_a`` / ``src_b``."""
        slot = bir.urem(step, self.stages)
        dst = bir.add(self.base, bir.as_i64(bir.mul(slot, self.sbytes)))
        cpasync.mbarrier_arrive_expect_tx(self.full(slot), self.sbytes)
        cpasync.bulk_copy(dst, bir.add(src_a, bir.as_i64(bir.mul(kk, self.a_bytes))),
                          self.a_bytes, self.full(slot))
        dst_b = bir.add(dst, bir.as_i64(bir.const(self.a_bytes)))
        src_b = bir.add(src_b, bir.as_i64(bir.mul(kk, self.b_bytes)))
        if self.cluster == 1:
            cpasync.bulk_copy(dst_b, src_b, self.b_bytes, self.full(slot))
            return
        # the cluster's B stage: this CTA copies its 1 / cluster of the span to every CTA
        # of the cluster (the same offsets; each full barrier expects the whole stage)
        part = self.b_bytes // self.cluster
        off = bir.as_i64(bir.mul(bir.as_index(self.rank), part))
        cpasync.bulk_copy_multicast(bir.add(dst_b, off), bir.add(src_b, off), part,
                                    self.full(slot), (1 << self.cluster) - 1)

    def init_barriers(self) -> None:
        with bir.when(self.is_prod):
            for i in range(self.stages):
                cpasync.mbarrier_init(self.full(bir.const(i)), 1)
                # one arrival per warpgroup of each CTA of the cluster
                cpasync.mbarrier_init(self.empty(bir.const(i)), self.cluster * self.bm // 64)
            tma.fence_mbarrier_init()
        if self.cluster > 1:  # the peers' barriers are initialised before any remote use
            # (fence.mbarrier_init.release.cluster orders the inits: a relaxed arrive, as
            # CUTLASS's cluster pipelines, skips the release's MEMBAR.ALL.GPU)
            N.cluster_arrive(relaxed=True)
            N.cluster_wait()
        else:
            bir.barrier()

    def descriptors(self) -> None:
        """The stage-0 descriptors and the byte strides of warpgroups and k16 steps."""
        if self.sw:  # stages and the B span start on 1024-byte atoms (base_offset 0)
            self.da0 = W.descriptor(self.base, lbo=16, sbo=SW128_ATOM, swizzle="128b")
            self.db0 = self.da0
            self.wg_bytes, self.h_a, self.h_b = 64 * 128, 32, 32
        else:
            self.da0 = W.descriptor(self.base, lbo=self.bm * 16, sbo=LBO)
            self.db0 = W.descriptor(self.base, lbo=self.bn * 16, sbo=LBO)
            self.wg_bytes, self.h_a, self.h_b = 8 * LBO, 2 * self.bm * 16, 2 * self.bn * 16

    def consume(self, step: Value, acc: Value) -> Value:
        """Every thread: wait for the stage of CTA step ``step``, issue its ``kstep / 16``
        wgmmas, retire step - 1's (``wait_group 1``) and release its stage (one arrival per
        warpgroup). Returns the accumulator."""
        stages = self.stages
        slot = bir.urem(step, stages)
        cpasync.mbarrier_wait(self.full(slot), _parity(bir.udiv(step, stages)))
        stage0 = bir.mul(slot, self.sbytes)
        da = W.advance(self.da0, bir.as_i64(bir.add(stage0, bir.mul(self.wg, self.wg_bytes))))
        db = W.advance(self.db0, bir.as_i64(bir.add(stage0, self.a_bytes)))
        W.fence()
        for h in range(self.kstep // 16):
            acc = W.mma_async(acc, W.advance(da, h * self.h_a), W.advance(db, h * self.h_b),
                              self.bn, dtype=self.dtype)
        W.commit_group()
        W.wait_group(1)  # the wgmmas of step - 1 retired: release its stage
        # step 0 "releases" stage stages - 1 (not yet read; its producer fills it at once):
        # no branch on step == 0 (LLVM would peel the first iteration, and the peeled zero
        # accumulator moves inside its wgmma pipeline make ptxas serialize every wgmma). So
        # empty[j] completes once more for j = stages - 1, and the producer's wait at step s
        # is for parity (s / stages) & 1 on every slot.
        self.prev = bir.urem(bir.add(step, stages - 1), stages)
        with bir.when(bir.eq(bir.urem(self.tid, 128), 0)):
            cpasync.mbarrier_arrive(self.empty(self.prev))
            if self.cluster > 1:  # the peer's producer refills the stage here too (B)
                cpasync.mbarrier_arrive_cluster(
                    cpasync.map_shared_rank(self.empty(self.prev), self.peer))
        return acc

    def refill(self, step: Value, nxt: Value, total: Value,
               fill: Any) -> None:
        """Thread 0 after :meth:`consume` of ``step``: once step - 1's stage is free, fill it
        with step ``nxt`` (= step + stages - 1) if ``nxt < total`` (``fill(nxt)``)."""
        with bir.when(bir.logical_and(self.is_prod, bir.ult(nxt, total))):
            cpasync.mbarrier_wait(self.empty(self.prev), _parity(bir.udiv(step, self.stages)))
            fill(nxt)


def emit_mainloop(kb: bir.KernelBuilder, wa: Value, wb: Value, m0: Value, n0: Value,
                  k: Value, kstep: int, stages: int, bm: int = BM,
                  swizzle: str = "none", bn: int = BN,
                  pdl: bool = False, cluster: int = 1,
                  rank: Value | None = None) -> tuple[Value, Value]:
    """Phase 2's K loop over the stage-ordered workspaces ``wa`` / ``wb`` (i8 memrefs) for
    the ``bm`` x ``bn`` tile (``bm / 64`` warpgroups) at rows ``m0`` of A, ``n0`` of B; returns
    (the warpgroup's accumulator struct, warpgroup index). Every thread of the CTA must
    execute it. ``swizzle`` "128b" (kstep 64): the workspaces are 128B-swizzled,
    the ring is 1024-byte aligned and the descriptors are SWIZZLE_128B (SBO 1024, the k16
    steps 32 bytes apart inside the 128-byte row). ``pdl``: after the mbarriers' init every
    thread waits for the previous grid (``griddepcontrol.wait``: the kernel may be launched
    with programmatic stream serialization while phase 1 still runs). ``cluster`` 2: the
    kernel runs in clusters of 2 CTAs (``rank``: this CTA's, default ``%cluster_ctarank``)
    sharing ``n0`` (:func:`cluster_tile`; module docstring "Clusters"); after the loop
    every thread arrives on the cluster barrier, and the caller must end the kernel with
    :func:`cluster_exit`."""
    ring = _Ring(kb, k, kstep, stages, bm, swizzle, bn, cluster, rank)
    steps = ring.steps
    src_a, src_b = ring.sources(wa, wb, m0, n0)
    fill = lambda t: ring.produce(t, src_a, src_b, t)
    ring.init_barriers()
    if pdl:
        N.grid_dependency_wait()
    with bir.when(ring.is_prod):
        for p in range(stages - 1):
            with bir.when(bir.ult(bir.const(p), steps)):
                fill(bir.const(p))
    ring.descriptors()
    with bir.for_range(0, steps, carry=[W.zero_accumulator(bn)]) as loop:
        step = loop.iv
        acc = ring.consume(step, loop.carried[0])
        ring.refill(step, bir.add(step, stages - 1), steps, fill)
        loop.yield_(acc)
    W.wait_group(0)
    if cluster > 1:  # this CTA's last remote access (an arrival on the peer) is behind us
        N.cluster_arrive()
    return loop.results[0], ring.wg


def cluster_exit() -> None:
    """End of a clustered phase 2 (every thread, after the epilogue): wait on the cluster
    barrier :func:`emit_mainloop` arrived on, so no CTA exits while its peer may still
    arrive on its mbarriers."""
    N.cluster_wait()


def emit_persistent(kb: bir.KernelBuilder, wa: Value, wb: Value, m_count: Value,
                    n_count: Value, k: Value, kstep: int, stages: int, bm: int,
                    swizzle: str, epilogue: Any, bn: int = BN, pdl: bool = False) -> None:
    """Phase 2, persistent: CTA ``b`` of a grid of ``G`` CTAs (any G >= 1) computes the tiles
    ``t = b, b + G, ...`` (rasterized as :func:`raster_tile`), each with
    :func:`emit_mainloop`'s k-steps and wgmma order, then ``epilogue(acc, wg, m0, n0)``.
    The ring's step counter runs over the CTA's ``tiles * steps`` steps (mbarrier phases
    continue across tiles), and thread 0 refills step ``s + stages - 1`` whichever tile it
    belongs to: the next tile's first ``stages - 1`` stages are in flight during this
    tile's last wgmmas and its epilogue. ``pdl``: as :func:`emit_mainloop`'s."""
    ring = _Ring(kb, k, kstep, stages, bm, swizzle, bn)
    steps = ring.steps
    tiles_m, tiles_n = bir.ceil_div(m_count, bm), bir.ceil_div(n_count, bn)
    b, g = bir.block_idx("x"), bir.grid_dim("x")
    # this CTA's tiles: ceil((tiles - b) / G), 0 when b >= tiles (b < G, so no underflow)
    mine = bir.udiv(bir.sub(bir.add(bir.mul(tiles_m, tiles_n), bir.sub(g, 1)), b), g)
    total = bir.mul(mine, steps)

    def origin(i: Value) -> tuple[Value, Value]:
        """(m0, n0) of this CTA's i-th tile."""
        mt, nt = raster_tile(tiles_m, tiles_n, bir.add(b, bir.mul(i, g)))
        return bir.mul(mt, bm), bir.mul(nt, bn)

    def fill(s: Value) -> None:  # CTA step s: k-step s % steps of tile s / steps
        m0, n0 = origin(bir.udiv(s, steps))
        src_a, src_b = ring.sources(wa, wb, m0, n0)
        ring.produce(s, src_a, src_b, bir.urem(s, steps))

    ring.init_barriers()
    if pdl:
        N.grid_dependency_wait()
    with bir.when(ring.is_prod):
        for p in range(stages - 1):
            with bir.when(bir.ult(bir.const(p), total)):
                fill(bir.const(p))
    ring.descriptors()
    with bir.for_range(0, mine) as tiles:
        first = bir.mul(tiles.iv, steps)
        m0, n0 = origin(tiles.iv)
        src_a, src_b = ring.sources(wa, wb, m0, n0)

        def refill(s: Value, kk: Value) -> None:
            # k-step kk + stages - 1 of this tile (no divisions), else of a later tile
            ahead = bir.add(kk, stages - 1)
            with bir.when(bir.ult(ahead, steps)):
                ring.produce(s, src_a, src_b, ahead)
            with bir.when(bir.ult(bir.sub(steps, 1), ahead)):
                fill(s)

        with bir.for_range(0, steps, carry=[W.zero_accumulator(bn)]) as loop:
            step = bir.add(first, loop.iv)
            acc = ring.consume(step, loop.carried[0])
            ring.refill(step, bir.add(step, stages - 1), total,
                        lambda s, kk=loop.iv: refill(s, kk))
            loop.yield_(acc)
        W.wait_group(0)
        epilogue(loop.results[0], ring.wg, m0, n0)


def accumulator_tiles(acc: Value, bn: int = BN) -> list[Any]:
    """The fragment as m16n8 C tiles (:func:`blockscale.ops._wgmma_ir.accumulator_tiles`)."""
    return X.accumulator_tiles(acc, bn)

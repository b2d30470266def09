"""Warp-specialized "producer-dequant" sm_90a grouped (MoE prefill) block-scaled matmul: NVFP4,
MXFP4, MXFP8 (issue #10).

Same contract as :func:`blockscale.ops.matmul_grouped_wgmma.grouped_matmul_block_scaled_wgmma`
(SEMANTICS §5, D8, D10): 5-D A scales with per-group padded tiles (``a_scale_offsets``), 6-D B
scales, ``C = bf16(acc * expert_scales[e] (* a_row_scales[m]))`` in fp32, in that order;
expert id -1 -> zeros.

Kernel: the work items of the grouped wgmma kernel (CTA ``(x, y)``: column tile x of the y-th
(group, 128-row tile), :func:`blockscale.ops._grouped_wgmma_ir.find_tile`), each a 128 x 256
tile computed by :func:`blockscale.ops._pdq_ir.emit_mainloop`: two consumer warpgroups of
``m64n256k16`` bf16 wgmmas over a 4-stage shared ring, and a producer warpgroup dequantizing
BOTH operands' packed rows into it (A: the group's rows from ``m0``, zeros at the group end,
scales in the group's padded 128-row tiles; B: expert ``e``'s weight rows ``e N + n``, 6-D
scales): no per-thread dequantization in the consumers (the register-fed kernel's 243
registers and 33 % issue slots) and no bf16 weights in global memory.

Numerics: the same bf16 operands (dequant "lut", block scales folded in) and k16 wgmma order
as the grouped wgmma kernel at 128 x 256, kstep 64, so its bytes in the interpreter.

A from a workspace (issue #10, ``a_source="workspace"``): the grouped phase 1
(:mod:`blockscale.ops.matmul_grouped_p1`) dequantizes A once into per-(group, 128-row tile)
bf16 tiles (tile ``start // 128 + a_scale_offsets[g] + i``: D8's placement, checked on the
host for numpy group vectors); producer thread 0 bulk-copies each stage's A span from it and
the producer warpgroup dequantizes only B (558 / 556 SASS a k64 step, NVFP4 / MXFP4, instead
of 788 / 783). ``bm=256``: 256 x 128 items (:mod:`blockscale.ops._pdq_tall_ir`): two
consecutive workspace tiles of the group (the second only where it exists), 128 weight rows a
step (one a producer thread: 315 / 322, unrolled by 2 302 / 297), each consumer warpgroup two
m64n128 slabs, slabs past the group's end skipped; at T = 4096 gpt-oss routing every expert's
weights are dequantized once. Same bf16 operands and k16 order per output: the same bytes
(tests: against the packed-A kernel and the grouped wgmma lut kernel, plain and σ).

Dispatch: :func:`blockscale.ops.matmul_grouped_wgmma.fast_path` runs :func:`dispatch_spec`
for NVFP4 and MXFP4 prefill (``matmul_grouped_wgmma.PDQ_FORMATS``; off with
``BLOCKSCALE_SM90_GROUPED_PDQ=0``), and the fused SwiGLU op's chained path
(:mod:`blockscale.ops.matmul_swiglu`) the same spec with ``sigma_out``: the σ store changes
where a value goes, not its bits, so fused == chained byte for byte by construction.
:func:`dispatch_spec` runs A from the grouped phase-1 workspace; NVFP4 on f16 operands
(``dtype="f16"``: the producer's table-free decode, :mod:`blockscale.ops._f16_dequant_ir`) in
128 x 256 items with idle warpgroups skipped and the producer's fences paired (``pair``: two
steps a fence, so its global loads have two steps to land); MXFP4 (bf16) in 192 x 192 items
(:mod:`blockscale.ops._pdq_tri_ir`: three consumer warpgroups; a group of <= 192 rows is one
item) where the routed rows a group average at least :data:`TRI_MIN_GROUP_ROWS`, else the
paired skip items (:data:`DISPATCH_A_SOURCE`, :data:`DISPATCH_DTYPE`, :data:`DISPATCH_BM`,
:data:`DISPATCH_SKIP`, :data:`DISPATCH_PAIR`: the fastest measured on the H200, runs AA / AB /
AM / AQ / AR); ``BLOCKSCALE_SM90_GROUPED_PDQ_A=packed``, ``..._DTYPE=bf16``,
``..._BM=128|192|256``, ``..._SKIP=0`` and ``..._PAIR=0`` select the others (both ops).
Band split (:func:`dispatch_plan`, session 23): from :data:`TRI_MIN_GROUP_ROWS` routed rows a
group on, the dispatch launches two kernels into one output: the coalesced 128-row skip items
for the groups outside :data:`BAND_ROWS` (128 < rows <= 192) and their 192 x 192 twins for the
groups inside it (``band`` "out" / "in": the warp-parallel group scan gives the other band's
groups no items). A group of 129-192 rows is then one item whose weights are dequantized once,
not two 128-row items (the second mostly idle) that dequantize them twice; every other group
keeps the cheaper 128 x 256 items. At gpt-oss T = 4096 (128 +- 11 rows a group) about half the
groups are in the band (H100 run EF, T = 4096: NVFP4 -8 %, MXFP4 -5 % against the best single
kernel; MXFP8 keeps its 192 x 192 items: no gain). Same bytes as either kernel alone.
MXFP8 (:mod:`blockscale.ops.matmul_grouped_pdq_mx8`): the same kernel on exact bf16 operands
(E4M3 x 2^(b - 127) inside a fixed scale window; phase 1 and the producer convert 32 bytes
a half), bf16 items only (no f16, no TMA B, no paired fence), between a flag kernel and a
fixup that recomputes the rows a scale outside the window touches (:func:`launch`). Its
output is within the fp32 bound of the exact value, not the bytes of another kernel.
Importing this module does not import MLIR.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.ops import matmul_grouped as _grouped
from blockscale.ops import matmul_grouped_p1 as _p1
from blockscale.ops import matmul_pdq as _pdq
from blockscale.ops._staged_store_ir import check_store

#: modules whose source shapes the kernel (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._pdq_ir", "blockscale.ops._pdq_tall_ir",
                  "blockscale.ops._mx8_window_ir",
                  "blockscale.ops._pdq_tri_ir", "blockscale.ops._f16_dequant_ir",
                  "blockscale.ops._pdq_tma_ir", "blockscale.ops._pdq_tma",
                  "blockscale.ops._wgmma_ws_ir", "blockscale.ops._wgmma_ws",
                  "blockscale.ops._twophase_ir",
                  "blockscale.ops._staged_store_ir",
                  "blockscale.ops._grouped_wgmma_ir", "blockscale.ops._wgmma_ir",
                  "blockscale.ops._mma_ir", "blockscale.ops._matmul_ir",
                  "blockscale.ops.matmul_sm90", "blockscale.ops.matmul_grouped",
                  "blockscale.ops.matmul_grouped_sm90", "blockscale.ops._grouped_sched_ir")
TARGETS = ("sm_90a",)
FORMATS = ("nvfp4", "mxfp4", "mxfp8")
#: the FP4 formats (every variant below; MXFP8: B from global memory, bf16, no paired fence)
FP4_FORMATS = ("nvfp4", "mxfp4")
#: the work item's tile and the CTA (= matmul_pdq's)
BM, BN, THREADS, MAX_STAGES = _pdq.BM, _pdq.BN, _pdq.THREADS, _pdq.MAX_STAGES
LOOPS, STORES, PRODUCERS, BNS = _pdq.LOOPS, _pdq.STORES, _pdq.PRODUCERS, _pdq.BNS
#: where the stages' A comes from: "packed" (the producer dequantizes the group's packed rows
#: every step) or "workspace" (the grouped phase 1, :mod:`blockscale.ops.matmul_grouped_p1`,
#: dequantizes A once; the producer's thread 0 bulk-copies each stage's A from it)
A_SOURCES = ("packed", "workspace")
#: the dispatch's A source (:func:`dispatch_spec`): "workspace" (H200 runs AA / AB, gpt-oss
#: gate_up NVFP4 T=4096: 1.699 ms vs packed 1.938, phase 1 included; T=1024 1.191 vs 1.359);
#: BLOCKSCALE_SM90_GROUPED_PDQ_A=workspace|packed overrides it
DISPATCH_A_SOURCE = "workspace"
A_SOURCE_ENV = "BLOCKSCALE_SM90_GROUPED_PDQ_A"
#: work-item heights: 128 (x bn 256 / 192), 256 (x 128: two 128-row workspace tiles, the
#: producer dequantizes 128 weight rows a step; _pdq_tall_ir) or 192 (x 192: three consumer
#: warpgroups, 512 threads, A from two workspace tiles; _pdq_tri_ir)
BMS = (128, 256, 192)
#: the 192-row item's width (its consumers' m64n192) and the A rows of its ring (two tiles)
TRI_BN, TRI_A_ROWS = 192, 256
#: the 256-row item's width and the dispatch's producer unroll for it (302 / 297 SASS a k64
#: step instead of 315 / 322, NVFP4 / MXFP4, no spills)
TALL_BN, TALL_UNROLL = 128, 2
#: the dispatch's item height (:func:`dispatch_spec`; 192 / 256 only with the workspace A and
#: the staged store): "auto" = 192 x 192 items where the operands are bf16 (MXFP4; NVFP4 with
#: DTYPE_ENV=bf16) and the routed rows a group average at least :data:`TRI_MIN_GROUP_ROWS`,
#: else 128-row items with skip (f16 with the paired fence beat the 192-row items: run AR,
#: NVFP4 T=4096 1.458 vs 1.519 ms). H200 run AM (gpt-oss gate_up,
#: 128 +- 11 rows a group at T=4096, 32 at T=1024): T=4096 NVFP4 / MXFP4 1.533 / 1.532 ms vs
#: 1.653 / 1.658 (128-row skip), DeepSeek-V3 T=4096 (128 a group) 5.355 vs 5.513; T=1024
#: 1.359 / 1.361 vs 1.095 / 1.110. 256 x 128 items: slower everywhere (run AB: 1.788 / 1.550).
#: BLOCKSCALE_SM90_GROUPED_PDQ_BM=auto|128|192|256 overrides it
DISPATCH_BM = "auto"
#: "auto" takes the 192 x 192 items from this many routed rows a group on (measured: 32 -> 128
#: rows better, 128 -> 192 better; the threshold between is not measured: the midpoint)
TRI_MIN_GROUP_ROWS = 80
BM_ENV = "BLOCKSCALE_SM90_GROUPED_PDQ_BM"
#: whether the dispatch's 128-row items skip the wgmmas of a warpgroup past the group's end
#: (with the workspace A): on (run AB: NVFP4 T=4096 1.647 vs 1.699 ms, T=1024 1.091 vs 1.191;
#: MXFP4 1.651 / 1.106); BLOCKSCALE_SM90_GROUPED_PDQ_SKIP=1|0 overrides
DISPATCH_SKIP = True
SKIP_ENV = "BLOCKSCALE_SM90_GROUPED_PDQ_SKIP"
#: the prefetch distance of the dispatch's skip items (1 or 2; both bundled, plain and σ)
DISPATCH_DEPTH = 1
#: MXFP8's prefetch distance, skip and 192 x 192 items (its paired fence spills: four steps of
#: 32-byte halves, 8 LDL / STL in the loop): 1. Distance 2 (the next loads issued after a
#: step's fence, 606 SASS a step, no spills) was predicted faster and measured slower (H200
#: run DX, gpt-oss gate_up, the main kernel: T=1024 skip items 1.549 vs 1.290 ms, T=4096
#: 192 x 192 2.149 vs 1.771); BLOCKSCALE_SM90_GROUPED_PDQ_MX8_DEPTH=1|2 overrides it
MX8_DISPATCH_DEPTH = 1
MX8_DEPTH_ENV = "BLOCKSCALE_SM90_GROUPED_PDQ_MX8_DEPTH"
#: where the producer reads B's packed bytes and scales: "global" (``ld.global``, prefetched
#: a step ahead in registers) or "tma" (a TMA ring of packed bytes and scale atoms in shared
#: memory, :mod:`blockscale.ops._pdq_tma_ir`, filled 3-6 steps ahead: no global load in
#: flight at the producer's proxy fence; A from the workspace, one producer warpgroup, no
#: prefetch, 128 x 256 or 256 x 128 items). Measured 3-5 % slower than "global" (runs AF /
#: AJ): not dispatched; the bench and the tests call it
#: (:func:`grouped_matmul_block_scaled_pdq`)
B_SOURCES = ("global", "tma")
#: the stages' operand type: "bf16", or "f16" (NVFP4, A from the workspace: the producer's
#: table-free E5M2 decode, :mod:`blockscale.ops._f16_dequant_ir`; A
#: from an f16 phase 1; f16 wgmmas; the accumulator times 2^14 first: the same bytes)
DTYPES = _p1.DTYPES
#: the dispatch's operand type for NVFP4 with the workspace A (:func:`dispatch_spec`): f16
#: (H200 runs AP-AR, gpt-oss gate_up NVFP4, ms, bf16 -> f16: 192 x 192 items T=4096 1.550 ->
#: 1.519, DeepSeek-V3 5.414 -> 5.145; with the paired fence the 128-row skip items T=1024
#: 0.964 -> 0.893, T=4096 1.615 -> 1.458, DeepSeek-V3 T=4096 5.401 -> 5.039);
#: BLOCKSCALE_SM90_GROUPED_PDQ_DTYPE=bf16|f16 overrides it
DISPATCH_DTYPE = "f16"
DTYPE_ENV = "BLOCKSCALE_SM90_GROUPED_PDQ_DTYPE"
#: whether the dispatch's 128-row skip items fill two steps under one producer fence
#: (``pair``): on (run AR, NVFP4 bf16 T=1024 1.086 -> 0.964 ms, T=4096 1.625 -> 1.615; f16
#: above; the 192 x 192 items were slower with it: 1.550 -> 1.649);
#: BLOCKSCALE_SM90_GROUPED_PDQ_PAIR=1|0 overrides it
DISPATCH_PAIR = True
PAIR_ENV = "BLOCKSCALE_SM90_GROUPED_PDQ_PAIR"
#: whether the dispatch's 128-row skip and 192 x 192 items load B warp-coalesced
#: (``coalesce``): on (H200 runs EA-EB, gpt-oss gate_up, the whole call, ms, T=1024 / 4096:
#: NVFP4 f16 paired skip items 0.892 -> 0.865 / 1.481 -> 1.402; MXFP4 paired skip items
#: 1.003 -> 0.937, 192 x 192 1.544 -> 1.431; MXFP8 skip items 1.408 -> 1.419 / 1.985 ->
#: 1.962, 192 x 192 1.891 -> 1.844); BLOCKSCALE_SM90_GROUPED_PDQ_COALESCE=1|0 overrides it
DISPATCH_COALESCE = True
COALESCE_ENV = "BLOCKSCALE_SM90_GROUPED_PDQ_COALESCE"
#: MXFP8's L2 prefetch distance (``l2_ahead``) of its coalesced skip and 192 x 192 items:
#: step t + 2's rows brought into L2 at step t, the register loads a step ahead hit L2 and
#: the proxy fence waits less (run EB, gpt-oss, ms: skip items T=1024 1.419 -> 1.220 (4:
#: 1.237), T=4096 1.962 -> 1.842 (4: 1.881); run ED, the 192 x 192 items' rows clamped (no
#: spills): 192 x 192 T=4096 1.787 -> 1.618 against skip items 1.955, T=1024 1.306 against
#: 1.297; NVFP4 / MXFP4 with paired fences 2-7 % slower with it, run EB);
#: BLOCKSCALE_SM90_GROUPED_PDQ_MX8_L2=0 (off) | 2 overrides it
MX8_DISPATCH_L2_AHEAD = 2
MX8_L2_ENV = "BLOCKSCALE_SM90_GROUPED_PDQ_MX8_L2"
#: row bands (``band``): a kernel takes every group ("all"), only the groups of
#: ``BAND_ROWS[0] < rows <= BAND_ROWS[1]`` ("in": one 192 x 192 item each) or only the others
#: ("out": 128-row skip items). As 128-row items such a group is two items whose second is
#: mostly idle and whose weights are dequantized a second time; as one 192 x 192 item they
#: are dequantized once (30 column tiles instead of 2 x 23)
BANDS = ("all", "in", "out")
BAND_ROWS = (128, 192)
#: the dispatch's band split (:func:`dispatch_plan`): the "out" and "in" kernels, two launches
#: into one output, for :data:`BAND_FORMATS` where the routed rows a group average at least
#: :data:`TRI_MIN_GROUP_ROWS` (H100 run EF, gpt-oss gate_up T=4096, ms: NVFP4 f16 paired skip
#: items 1.449 -> 1.335, 192 x 192 f16 1.427; MXFP4 192 x 192 1.443 -> 1.366; MXFP8 192 x 192
#: with the L2 prefetch 1.658, split 1.673: no gain, its skip items are 17 % slower than its
#: 192 x 192 ones, 1.943); BLOCKSCALE_SM90_GROUPED_PDQ_BAND=0 runs the one kernel of
#: :func:`dispatch_spec` instead
DISPATCH_BAND = True
BAND_FORMATS = FP4_FORMATS
BAND_ENV = "BLOCKSCALE_SM90_GROUPED_PDQ_BAND"
#: the band split's two launches by programmatic dependent launch (``pdl``): the "in" kernel
#: is scheduled once every CTA of the "out" kernel has started, so its items fill the SMs
#: that the "out" kernel's last wave leaves idle (about half a wave of ~50 us items at
#: gpt-oss T=4096 on average); BLOCKSCALE_SM90_GROUPED_PDQ_BAND_PDL=0 launches them in order
DISPATCH_BAND_PDL = True
BAND_PDL_ENV = "BLOCKSCALE_SM90_GROUPED_PDQ_BAND_PDL"
#: work schedules (``schedule``): "grid", a CTA per (column tile, work item) of an upper
#: bound (its CTAs past the items exit after the scan); "dynamic", about a CTA an SM taking
#: the units from a counter (:mod:`blockscale.ops._grouped_sched_ir`)
SCHEDULES = ("grid", "dynamic")
#: the band split's schedule. H100 run EJ, gpt-oss T=4096, NVFP4 f16: the pair by PDL on the
#: upper-bound grids 1.336 ms, in order 1.332, by PDL on grids of exactly the items 1.268 (the
#: empty CTAs held the programmatic launch back), which "dynamic" is built to reach; it is
#: verified in the interpreter only (no device time was left in session 25), so the dispatch
#: keeps "grid" until a GPU run (build/s25/run2.sh) measures and checks it;
#: BLOCKSCALE_SM90_GROUPED_PDQ_BAND_SCHEDULE=grid | dynamic overrides it
DISPATCH_BAND_SCHEDULE = "grid"
BAND_SCHEDULE_ENV = "BLOCKSCALE_SM90_GROUPED_PDQ_BAND_SCHEDULE"


@dataclasses.dataclass(frozen=True)
class GroupedPdqSpec(FormatSpec):
    """What one grouped producer-dequant kernel is specialised on (bf16 output).

    Attributes:
        fmt: "nvfp4" | "mxfp4" | "mxfp8" (launched with its flag and fixup kernels).
        row_scales: whether the kernel reads ``a_row_scales`` (bf16 ``[T]``, NVFP4).
        target: "sm_90a".
        stages: shared stages (2 .. ``matmul_pdq.max_stages(bn)``); None: the most.
        prefetch: the producer loads step t + 1's packed rows before dequantizing step t.
        loop: :data:`LOOPS` (:class:`blockscale.ops.matmul_pdq.PdqMatmulSpec`).
        store: :data:`STORES`: "staged", the tile through the ring and out by one bulk
            copy per row of the group (rows past the group end are not copied; N % 8 == 0).
        producers, bn: as :class:`blockscale.ops.matmul_pdq.PdqMatmulSpec` (two producer
            warpgroups need the 128 x 192 tile).
        depth: the prefetch distance (:class:`blockscale.ops.matmul_pdq.PdqMatmulSpec`).
        sigma_out: store output column n (a σ-permuted gate/up weight row: 2i gate i,
            2i + 1 up i) at column ``(n % 2) N/2 + n // 2`` (the un-permuted gate | up
            layout), as :attr:`blockscale.ops.matmul_grouped_wgmma.GroupedWgmmaSpec.sigma_out`:
            the fused SwiGLU op's chained path. Staged: two bulk copies per row (gate half,
            up half; N % 16 == 0).
        a_source: :data:`A_SOURCES`. "workspace": a grouped phase-1 launch first
            (:func:`blockscale.ops.matmul_grouped_p1.launch`; tile placement per D8), then
            this kernel with ``wa`` (the workspace) in place of ``a`` / ``sfa``; the producer
            dequantizes only B (the same stage bytes, so the same output bytes).
        bm: :data:`BMS`, the work item's rows. 256: 256 x 128 items (``bn`` 128, A from the
            workspace, one producer warpgroup; :mod:`blockscale.ops._pdq_tall_ir`): the
            same k16 order per output, so the same bytes.
        unroll: producer steps per iteration of the "split" loop (1, 2: two register sets
            alternate instead of being copied back; at 128 x 256 it spills, so 1 there).
        skip: 128-row items: a consumer warpgroup whose 64 rows lie past the group's end
            issues no wgmma (:class:`blockscale.ops._pdq_tall_ir.Skip`; the 256 x 128 items
            always skip). Same bytes.
        b_source: :data:`B_SOURCES`. Same bytes.
        a_early: (A from the workspace, 128-row items, the "split" loop) step t + 1's A copy
            is issued at the start of step t instead of at its own fill
            (:func:`blockscale.ops._pdq_ir.emit_mainloop`); the lockstep loop ignores it.
            Same bytes; measured within 1 % of the copy at the fill (run AG), not dispatched.
        dtype: :data:`DTYPES`; "f16" for NVFP4 with A from the workspace. Same bytes.
        pair: ("split" loop, prefetch distance 1) the producer fills two steps under one
            proxy fence, the next two steps' loads issued at the pair's start
            (:func:`blockscale.ops._pdq_ir.emit_mainloop`); the lockstep loop ignores it.
            Same bytes.
        coalesce: the producer's loads warp-coalesced (:func:`blockscale.ops._pdq_ir._units`:
            a warp reads whole k64 steps of 16 (FP4) or 8 (MXFP8, 16-element quarters) rows,
            full 32-byte sectors, instead of half a sector of each of 32 rows); B from
            global memory. Same bytes.
        l2_ahead: 0 (off) or the steps ahead (1 .. 16) the producer brings B's packed rows
            and scales into L2 by ``cp.async.bulk.prefetch.L2`` (its register loads a step
            ahead then hit L2, so the proxy fence that waits for them waits less); B from
            global memory. Same bytes.
        band: :data:`BANDS`: which groups the kernel computes ("in": those of
            :data:`BAND_ROWS`, 192 x 192 items only; "out": the others, 128-row skip items
            only); two launches of "out" and "in" write every row of C (:func:`launch`).
            Same bytes.
        pdl: (band "out" / "in") programmatic dependent launch of the pair: every thread of
            the "out" kernel first executes ``griddepcontrol.launch_dependents``; the "in"
            kernel is launched with programmatic stream serialization (:attr:`launch_meta`),
            so its CTAs start once every "out" CTA has started, and every thread executes
            ``griddepcontrol.wait`` last, so it completes after the "out" kernel (the next
            kernel of the stream waits for both). The two write disjoint rows and read only
            what was complete before the "out" kernel started (the phase 1 workspace).
            Same bytes.
        schedule: :data:`SCHEDULES`. "dynamic": a grid of about one CTA an SM (:func:`grid`
            ``ctas``), each taking units (column tile, work item; column fastest) from the
            int32 ``counters`` argument (words :func:`counter_slot` on, zero before the
            launch and after it) until they run out; the ring is set up again for each unit
            (:mod:`blockscale.ops._grouped_sched_ir`). Not with ``b_tma``. Same bytes.
    """

    fmt: str
    row_scales: bool = False
    target: str = "sm_90a"
    stages: int | None = None
    prefetch: bool = False
    loop: str = "split"
    store: str = "direct"
    producers: int = 1
    bn: int = BN
    depth: int = 1
    sigma_out: bool = False
    a_source: str = "packed"
    bm: int = BM
    unroll: int = 1
    skip: bool = False
    b_source: str = "global"
    a_early: bool = False
    dtype: str = "bf16"
    pair: bool = False
    coalesce: bool = False
    l2_ahead: int = 0
    band: str = "all"
    pdl: bool = False
    schedule: str = "grid"

    op: ClassVar[str] = "grouped_matmul_block_scaled_pdq"
    out_dtype: ClassVar[str] = "bfloat16"
    epilogue: ClassVar[None] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Format.from_name(self.fmt).name)
        H.check_choice(self.fmt, FORMATS, "fmt")
        H.check_choice(H.target_name(self.target), TARGETS, "target")
        object.__setattr__(self, "target", H.target_name(self.target))
        for name in ("row_scales", "prefetch", "sigma_out", "skip", "a_early", "pair",
                     "coalesce", "pdl"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got "
                                f"{type(getattr(self, name)).__name__}")
        if self.row_scales and self.fmt != "nvfp4":
            raise ValueError(f"row_scales is NVFP4 only, got fmt={self.fmt}")
        H.check_choice(self.bm, BMS, "bm")
        tall = self.bm != BM
        if tall and (self.a_source, self.producers) != ("workspace", 1):
            raise ValueError(f"bm={self.bm} needs a_source='workspace' and producers=1, got "
                             f"a_source={self.a_source!r}, producers={self.producers!r}")
        H.check_choice(self.bn, {BM: BNS, 256: (TALL_BN,), 192: (TRI_BN,)}[self.bm], "bn")
        if self.bm == 192 and (self.store, self.unroll, self.b_source, self.a_early) != (
                "staged", 1, "global", False):
            raise ValueError(f"bm=192 needs store='staged', unroll=1, b_source='global' and "
                             f"no a_early, got store={self.store!r}, unroll={self.unroll!r}, "
                             f"b_source={self.b_source!r}, a_early={self.a_early!r}")
        if self.pair and (not self.prefetch or self.depth != 1 or self.a_early or self.unroll != 1
                          or self.b_source != "global"):
            raise ValueError(f"pair needs prefetch=True, depth=1, unroll=1, no a_early and "
                             f"b_source='global', got prefetch={self.prefetch}, "
                             f"depth={self.depth}, unroll={self.unroll}, "
                             f"a_early={self.a_early}, b_source={self.b_source!r}")
        H.check_choice(self.dtype, DTYPES, "dtype")
        if self.dtype == "f16" and (self.fmt, self.a_source) != ("nvfp4", "workspace"):
            raise ValueError(f"dtype='f16' is for NVFP4 with a_source='workspace', got "
                             f"fmt={self.fmt}, a_source={self.a_source!r}")
        most = _pdq.max_stages(self.bn, self.ring_rows)
        if self.stages is None:
            object.__setattr__(self, "stages", most)
        if type(self.stages) is not int or not 2 <= self.stages <= most:
            raise ValueError(f"stages must be an int in [2, {most}] at bn={self.bn}, got "
                             f"{self.stages!r}")
        H.check_choice(self.loop, LOOPS, "loop")
        H.check_choice(self.store, STORES, "store")
        if self.store == "staged":
            _pdq.check_staged_fits(self.out_dtype, self.stages, self.bn, self.ring_rows)
        if not tall:
            _pdq.check_producers(self.producers, self.bn)
        if type(self.unroll) is not int or self.unroll not in (1, 2):
            raise ValueError(f"unroll must be 1 or 2, got {self.unroll!r}")
        if self.skip and (tall or self.producers != 1):
            raise ValueError(f"skip is for 128-row items with one producer warpgroup (bm=256 "
                             f"always skips), got bm={self.bm}, producers={self.producers}")
        _pdq.check_depth(self.depth, self.prefetch)
        H.check_choice(self.a_source, A_SOURCES, "a_source")
        H.check_choice(self.b_source, B_SOURCES, "b_source")
        if (self.coalesce or self.l2_ahead) and self.b_source != "global":
            raise ValueError(f"coalesce and l2_ahead read B from global memory "
                             f"(b_source='global'), got b_source={self.b_source!r}")
        if type(self.l2_ahead) is not int or not 0 <= self.l2_ahead <= 16:
            raise ValueError(f"l2_ahead must be an int in [0, 16], got {self.l2_ahead!r}")
        H.check_choice(self.band, BANDS, "band")
        if not {"all": True, "in": self.bm == 192,
                "out": self.bm == BM and self.skip}[self.band]:
            raise ValueError(f"band='in' needs bm=192, band='out' bm={BM} with skip=True, got "
                             f"band={self.band!r}, bm={self.bm}, skip={self.skip}")
        H.check_choice(self.schedule, SCHEDULES, "schedule")
        if self.schedule == "dynamic" and self.b_source != "global":
            raise ValueError(f"schedule='dynamic' reads B from global memory (b_source="
                             f"'global'), got b_source={self.b_source!r}")
        if self.pdl and self.band == "all":
            raise ValueError(f"pdl is for the band kernels (band 'out' or 'in'), got "
                             f"band={self.band!r}")
        if self.fmt == "mxfp8" and self.b_source != "global":
            raise ValueError(f"MXFP8 reads B from global memory (b_source='global'), got "
                             f"b_source={self.b_source!r}")
        if self.a_early and (self.a_source, self.bm) != ("workspace", BM):
            raise ValueError(f"a_early needs a_source='workspace' and bm={BM}, got "
                             f"a_source={self.a_source!r}, bm={self.bm}")
        got = (self.a_source, self.producers, self.prefetch)
        if self.b_source == "tma" and (got != ("workspace", 1, False) or (
                self.bm, self.bn) not in ((BM, BN), (256, TALL_BN))):
            raise ValueError(f"b_source='tma' needs a_source='workspace', producers=1, "
                             f"prefetch=False and 128 x {BN} or 256 x {TALL_BN} items, got "
                             f"(a_source, producers, prefetch)={got}, bm={self.bm}, "
                             f"bn={self.bn}")

    @property
    def ring_rows(self) -> int:
        """A rows of a ring stage: ``bm``, the 192-row item's two workspace tiles."""
        return TRI_A_ROWS if self.bm == 192 else self.bm

    @property
    def block(self) -> tuple[int, int, int]:
        """The CTA: :data:`THREADS` + 128 a second producer warpgroup or a third consumer
        warpgroup (``bm=192``)."""
        return (THREADS + 128 * (self.producers - 1 + (self.bm == 192)), 1, 1)

    @property
    def dynamic_shared_bytes(self) -> int:
        """The ring (``stages`` x (A rows + bn) rows x 64 bf16) and its ``2 stages``
        mbarriers."""
        return _pdq.ring_bytes(self.stages, self.bn, self.ring_rows)

    @property
    def kernel_name(self) -> str:
        rs = "_rowsc" if self.row_scales else ""
        pf = "_pf" if self.prefetch else ""
        lp = "" if self.loop == "split" else f"_{self.loop}"
        st = "_st" if self.store == "staged" else ""
        pr = f"_p{self.producers}" if self.producers > 1 else ""
        pr += "_d2" if self.depth == 2 else ""
        sg = "_sigma" if self.sigma_out else ""
        ws = "_ws" if self.a_source == "workspace" else ""
        ws += f"_u{self.unroll}" if self.unroll > 1 else ""
        ws += "_sk" if self.skip else ""
        ws += "_bt" if self.b_source == "tma" else ""
        ws += "_ae" if self.a_early else ""
        ws += "_f16" if self.dtype == "f16" else ""
        ws += "_pr" if self.pair else ""
        ws += "_co" if self.coalesce else ""
        ws += f"_l2p{self.l2_ahead}" if self.l2_ahead else ""
        ws += f"_b{self.band}" if self.band != "all" else ""
        ws += "_pdl" if self.pdl else ""
        ws += "_dyn" if self.schedule == "dynamic" else ""
        return (f"bs_grouped_pdq_{self.fmt}_{self.bm}x{self.bn}_k64_s{self.stages}{pf}{lp}{st}"
                f"{pr}{rs}{sg}{ws}")

    @property
    def launch_meta(self) -> dict[str, Any]:
        """Kernel metadata the runtime launches by (ops/_core.py copies it into the kernel's
        ``meta``): ``programmatic_launch`` for the "in" kernel of a :attr:`pdl` pair."""
        return {"programmatic_launch": True} if self.pdl and self.band == "in" else {}

    def args(self) -> tuple[KernelArg, ...]:
        """The portable grouped kernel's parameters (5-D scales, bf16 output); with the
        workspace A, ``wa`` (its bytes) in place of ``a`` and ``sfa``; the dynamic schedule's
        ``counters``."""
        base = _grouped.GroupedMatmulSpec(self.fmt, "tcgen5d", "bfloat16", self.row_scales,
                                          self.target).args()
        if self.schedule == "dynamic":
            base = (*base, KernelArg("counters", "buffer", "int32", "inout"))
        if self.a_source == "packed":
            return base
        tmaps: tuple[KernelArg, ...] = ()
        if self.b_source == "tma":
            from blockscale.ops._pdq_tma import tensormap_args

            tmaps = tensormap_args(self.fmt, self.bn)
        return (KernelArg("wa", "buffer", "uint8"),
                *(a for a in base if a.name not in ("a", "sfa")), *tmaps)


def grid(t: int, n: int, num_groups: int, bn: int = BN, bm: int = BM,
         band: str = "all", ctas: int | None = None) -> tuple[int, int, int]:
    """Column tiles x an upper bound of the (group, row tile) work items (band "in": one a
    group); ``ctas`` (the dynamic schedule): that many CTAs, at most one a unit of the bound."""
    items = num_groups if band == "in" else -(-t // bm) + num_groups
    cols, items = max(1, -(-n // bn)), max(1, items)
    if ctas is not None:
        return (max(1, min(ctas, cols * items)), 1, 1)
    return (cols, items, 1)


#: the dynamic schedule's CTAs off a GPU (the interpreter): two, so units pass between CTAs
INTERP_CTAS = 2


def _grid(spec: GroupedPdqSpec, t: int, n: int, num_groups: int,
          device: Any = None) -> tuple[int, int, int]:
    ctas = None
    if spec.schedule == "dynamic":
        ctas = int(getattr(device, "sm_count", INTERP_CTAS))
    return grid(t, n, num_groups, spec.bn, spec.bm, spec.band, ctas)


#: int32 words of the dynamic schedule's ``counters`` (two a band kernel)
COUNTER_WORDS = 4


def counter_slot(spec: GroupedPdqSpec) -> int:
    """The first of the dynamic schedule's two counter words (band "in": 2, so the band pair
    may run at once, :attr:`GroupedPdqSpec.pdl`)."""
    return 2 if spec.band == "in" else 0


def _with_counters(specs: tuple[GroupedPdqSpec, ...], bufs: dict[str, Any],
                   device: Any) -> dict[str, Any]:
    """``bufs`` plus, for a dynamic schedule, ``counters``: numpy zeros beside numpy inputs
    (copied with them); on a GPU the zeroed buffer of the launch stream that every launch
    leaves at zero (:func:`blockscale.ops.matmul_decode.split_k_counters`), else fresh
    zeros."""
    if all(s.schedule != "dynamic" for s in specs):
        return bufs
    import numpy as np

    if all(isinstance(v, np.ndarray) for v in bufs.values()):
        counters = np.zeros(COUNTER_WORDS, np.int32)
    elif hasattr(device, "launch_stream"):
        from blockscale.ops.matmul_decode import split_k_counters

        counters = split_k_counters(device, device.launch_stream(bufs.values()),
                                    COUNTER_WORDS)
    else:
        counters = device.zeros((COUNTER_WORDS,), np.int32)
    return {**bufs, "counters": counters}


def build(spec: GroupedPdqSpec) -> Any:
    """The ``mlir.ir.Module`` of ``spec``'s kernel (IR only)."""
    from mlir.dialects import arith

    import blockscale.ops._grouped_wgmma_ir as GW
    import blockscale.ops._pdq_ir as P
    import blockscale.ops._pdq_tall_ir as TL
    import blockscale.ops._pdq_tri_ir as TR
    import blockscale.ops._staged_store_ir as S
    import blockscale.ops._twophase_ir as T
    import blockscale.ops._wgmma_ir as X
    from blockscale.compiler import ir as bir
    from blockscale.compiler.arch import nvvm, tma
    from blockscale.layouts import SF_ATOM_ROWS
    from blockscale.ops import matmul_grouped_sm90 as _gsm90
    from blockscale.ops._matmul_ir import tcgen_row_offset

    block, bm, bn = (16 if spec.fmt == "nvfp4" else 32), spec.bm, spec.bn
    tall = bm == TL.BM
    tri = bm == TR.BM

    def coords(wg: Any) -> Any:  # the fragment coordinates of consumer warpgroup wg
        return TL.slab_coords(wg) if tall else X.warp_coords(wg)

    def c_tiles(acc: Any) -> Any:  # the accumulators as m16n8 C tiles
        return TL.tiles(acc) if tall else T.accumulator_tiles(acc, bn)

    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        if spec.pdl and spec.band == "out":  # the "in" kernel may start (GroupedPdqSpec.pdl)
            nvvm.launch_dependents()
        n_count, k, groups = (bir.as_index(kb.arg(x)) for x in ("n", "k", "num_groups"))
        keep = _band_filter(spec.band)

        def item(g: Any, tile: Any, n0: Any) -> None:  # CTA-uniform: every thread runs it
            start, end, expert, m0, _, active = _gsm90.work_item(kb, g, tile, bm, bn)

            def direct_store(c: Any, wg: Any, scale: Any) -> None:  # per slab (tall)
                if not tall:
                    GW._store(spec, kb, c, coords(wg), m0, n0, end, n_count, scale)
                    return
                for j, row in enumerate(c):
                    GW._store(spec, kb, [row], TL.slab(coords(wg), j), m0, n0, end, n_count,
                              scale)
            br = bir.if_(active, [])
            with br.then():
                e = bir.as_index(expert)
                d1 = bir.ceil_div(bir.ceil_div(k, block), 4)
                # A: the group's padded 128-row scale tiles (as work_operands); B: expert e
                tile0 = bir.add(bir.udiv(start, SF_ATOM_ROWS),
                                bir.as_index(bir.load(kb.arg("a_scale_offsets"), g)))
                srow0 = bir.add(bir.mul(tile0, SF_ATOM_ROWS), bir.mul(tile, bm))
                b_srow0 = bir.add(bir.mul(bir.mul(e, bir.ceil_div(n_count, SF_ATOM_ROWS)),
                                          SF_ATOM_ROWS), n0)
                tall_hooks = None
                if spec.a_source == "workspace":  # the item's 128-row tiles of the workspace
                    a, a_tile = kb.arg("wa"), bir.add(tile0, bir.mul(tile, bm // 128))
                    if tall:  # rows from m0 on; the second tile exists past 128 of them
                        rows = bir.sub(end, m0)
                        tall_hooks = TL.Tall(rows, bir.ult(bir.const(128), rows))
                    if tri:  # slabs 3 tile ..: tile 3 tile // 2 on, slab 3 tile % 2 in it
                        first = bir.udiv(bir.mul(tile, 3), 2)
                        a_tile = bir.add(tile0, first)
                        tall_hooks = TR.Tri(bir.sub(end, m0), bir.ult(
                            bir.mul(bir.add(first, 1), 128), bir.sub(end, start)),
                            bir.urem(tile, 2))
                else:
                    a = P.PackedRows(kb.arg("a"), kb.arg("sfa"), m0, bir.sub(end, m0), k,
                                     lambda r: tcgen_row_offset(bir.add(srow0, r), d1), bm)
                    a_tile = None
                b = P.PackedRows(kb.arg("w"), kb.arg("sfb"),
                                 bir.add(bir.mul(e, n_count), n0), bir.sub(n_count, n0), k,
                                 lambda r: tcgen_row_offset(bir.add(b_srow0, r), d1), bn)
                # (MXFP8: exact operands, no fold; matmul_grouped_pdq_mx8)
                fix = 1.0 if spec.fmt == "mxfp8" else X.accumulator_scale("lut", spec.fmt,
                                                                          "fold")
                if spec.dtype == "f16":  # both operands times 2^-7 (exact)
                    from blockscale.ops._f16_dequant_ir import ACC_SCALE

                    fix = ACC_SCALE
                scale_e = bir.load(kb.arg("expert_scales"), e)

                def expert_scaled(v: Any, m: Any, n: Any) -> Any:
                    if fix != 1.0:  # exact power of two first (MXFP4 "fold")
                        v = arith.mulf(v, bir.const(fix, bir.f32()))
                    v = arith.mulf(v, scale_e)
                    if spec.row_scales:  # D10: times the expert scale, then the row scale
                        if spec.store == "staged":  # computes rows past the end too (not
                            m = bir.umin(m, bir.sub(end, 1))  # copied): stay inside [T]
                        v = arith.mulf(v, arith.extf(bir.f32(),
                                                     bir.load(kb.arg("a_row_scales"), m)))
                    return v

                def store(acc: Any, wg: Any, writers: Any) -> None:
                    if spec.store == "staged":  # every thread; the consumers write the stage
                        smem = tma.extern_shared_buffer(
                            kb, T.shared_bytes(64, spec.stages, spec.ring_rows, bn))
                        if spec.sigma_out:
                            P.store_tile_staged_sigma(kb, c_tiles(acc), coords(wg), smem, m0,
                                                      n0, end, n_count, expert_scaled, bm, bn,
                                                      writers)
                            return
                        S.store_tile_staged(spec, kb, c_tiles(acc), coords(wg), smem, m0, n0,
                                            end, n_count, expert_scaled, bm, bn, writers)
                        return
                    direct_store(c_tiles(acc), wg, expert_scaled)

                P.emit_mainloop(kb, a, m0, b, k, spec.fmt, spec.stages, store, spec.ring_rows,
                                spec.prefetch, spec.loop, all_threads=spec.store == "staged",
                                producers=spec.producers, bn=bn, depth=spec.depth,
                                a_tile=a_tile, tall=tall_hooks, unroll=spec.unroll,
                                skip=TL.Skip(bir.sub(end, m0)) if spec.skip else None,
                                b_tma=(bir.udiv(b_srow0, SF_ATOM_ROWS), d1)
                                if spec.b_source == "tma" else None, a_early=spec.a_early,
                                dtype=spec.dtype, pair=spec.pair, coalesce=spec.coalesce,
                                l2_ahead=spec.l2_ahead, clamp_rows=tri,
                                reuse=spec.schedule == "dynamic")
                br.yield_()
            with br.else_():  # expert id -1: zeros (D8), by the consumer warpgroups' rows
                tid = bir.thread_idx("x")
                with bir.when(bir.ult(tid, 2 * bm if tri else 256)):
                    zero = bir.const(0.0, bir.f32())
                    zeros = [[[zero] * 4 for _ in range(bn // 8)]] * (2 if tall else 1)
                    direct_store(zeros, bir.udiv(tid, 128), lambda v, m, n: v)
                br.yield_()
        if spec.schedule == "dynamic":  # units (column tile, item) from the counter
            import blockscale.ops._grouped_sched_ir as SCH

            if counter_slot(spec) + SCH.SLOT_WORDS > COUNTER_WORDS:
                raise AssertionError("COUNTER_WORDS disagrees with _grouped_sched_ir")
            cols = bir.ceil_div(n_count, bn)
            *_, total = GW.find_tile(bm, kb, groups, keep, y=bir.const(0), with_total=True)

            def unit(w: Any) -> None:
                g, tile, _ = GW.find_tile(bm, kb, groups, keep, y=bir.udiv(w, cols))
                item(g, tile, bir.mul(bir.urem(w, cols), bn))
            SCH.unit_loop(kb, kb.arg("counters"), counter_slot(spec), bir.mul(total, cols),
                          unit)
        else:
            g, tile, has_work = GW.find_tile(bm, kb, groups, keep)
            with bir.when(has_work):  # CTA-uniform: the barriers below are reached by all
                item(g, tile, bir.mul(bir.block_idx("x"), bn))
        if spec.pdl and spec.band == "in":  # complete after the "out" kernel (pdl)
            nvvm.grid_dependency_wait()
    return kb.module


def _band_filter(band: str) -> Any:
    """:func:`blockscale.ops._grouped_wgmma_ir.find_tile`'s ``keep`` for ``band``."""
    from blockscale.compiler import ir as bir

    lo, hi = BAND_ROWS
    if band == "all":
        return None
    if band == "in":
        return lambda rows: bir.logical_and(bir.ult(lo, rows), bir.ule(rows, hi))
    return lambda rows: bir.bit_or(bir.ule(rows, lo), bir.ult(hi, rows))


# ---- host side -------------------------------------------------------------------------------


def grouped_matmul_block_scaled_pdq(hidden: Any, weight: Any, a_scales: Any, b_scales: Any,
                                    expert_start: Any, a_scale_offsets: Any, expert_ids: Any,
                                    expert_scales: Any, fmt: Format | str, *,
                                    k: int | None = None, a_row_scales: Any = None,
                                    stages: int | None = None, prefetch: bool = False,
                                    loop: str = "split", store: str = "direct",
                                    producers: int = 1, bn: int = BN, depth: int = 1,
                                    sigma_out: bool = False, a_source: str = "packed",
                                    bm: int = BM, unroll: int = 1, skip: bool = False,
                                    b_source: str = "global", a_early: bool = False,
                                    dtype: str = "bf16", pair: bool = False,
                                    coalesce: bool = False, l2_ahead: int = 0,
                                    band: str = "all", pdl: bool = False,
                                    schedule: str = "grid", device: Any = None) -> Any:
    """The kernel called directly (no dispatch), e.g. by tests and benchmarks. Arguments as
    :func:`blockscale.ops.matmul_grouped.grouped_matmul_block_scaled` plus ``stages``,
    ``prefetch``, ``loop``, ``store``, ``producers``, ``bn``, ``depth``, ``sigma_out``,
    ``a_source``, ``bm``, ``unroll``, ``skip``, ``b_source``, ``a_early``, ``dtype``,
    ``pair``, ``coalesce`` and ``l2_ahead`` (:class:`GroupedPdqSpec`; ``bm=256`` with
    ``bn=128``); ``band="split"`` runs those (128-row skip) items for the groups outside
    :data:`BAND_ROWS` and :func:`band_plan`'s 192 x 192 twins for the groups inside (``pdl``:
    by programmatic dependent launch, :attr:`GroupedPdqSpec.pdl`; ``schedule``:
    :attr:`GroupedPdqSpec.schedule`). Raises
    ValueError for K % 32 != 0, a format other than NVFP4 / MXFP4 / MXFP8, a staged store with
    N % 8 != 0, ``sigma_out`` with an odd N (staged: N % 16 != 0), or (workspace A) scale
    tiles not placed as D8 says. MXFP8 runs its flag and fixup kernels around it (:mod:`blockscale.ops.matmul_grouped_pdq_mx8`)."""
    fmt = Format.from_name(fmt)
    H.check_choice(fmt.name, FORMATS, "fmt")
    t, n, k, g_count, buffers = _grouped.tiled_grouped_operands(
        hidden, weight, a_scales, b_scales, expert_start, a_scale_offsets, expert_ids,
        expert_scales, fmt, k, a_row_scales, "grouped producer-dequant kernel")
    dev, tgt = H.device_and_target(device, "sm_90a")
    H.check_choice(band, ("all", "split"), "band")
    spec: Any = GroupedPdqSpec(fmt.name, a_row_scales is not None, tgt, stages, prefetch, loop,
                               store, producers, bn, depth, sigma_out, a_source, bm, unroll,
                               skip, b_source, a_early, dtype, pair, coalesce, l2_ahead,
                               schedule=schedule)
    check_sigma_store(spec, n)
    if pdl and band != "split":
        raise ValueError(f"pdl needs band='split', got band={band!r}")
    if band == "split":
        spec = band_plan(spec, pdl, schedule)
    return launch(spec, t, n, g_count, buffers, {"t": t, "n": n, "k": k, "num_groups": g_count},
                  dev)


def check_sigma_store(spec: GroupedPdqSpec, n: int) -> None:
    """ValueError when ``spec``'s store cannot write ``n`` output columns: staged needs 16-byte
    rows (N % 8 == 0), with ``sigma_out`` 16-byte halves (N % 16 == 0); σ needs an even N."""
    if spec.sigma_out and n % (16 if spec.store == "staged" else 2):
        raise ValueError(f"sigma_out with store {spec.store!r} needs n % "
                         f"{16 if spec.store == 'staged' else 2} == 0 (gate / up halves), "
                         f"got n={n}")
    check_store(spec.store, spec.out_dtype, n)


def launch(spec: GroupedPdqSpec | tuple[GroupedPdqSpec, ...], t: int, n: int,
           num_groups: int, buffers: dict[str, Any], scalars: dict[str, Any],
           device: Any) -> Any:
    """Run ``spec`` on the grouped op's (checked) buffers (the portable kernel's names); bf16
    ``[T, N]``. A workspace spec launches the grouped phase 1 first (the workspace stays on
    the device). A plan of :func:`dispatch_plan` (a tuple: one spec, or the "out" and "in"
    band kernels) shares the phase 1 (MXFP8: the flags and the fixup too) and writes one
    output."""
    specs = spec if isinstance(spec, tuple) else (spec,)
    check_plan(specs)
    main = specs[0]
    empty = t == 0 or n == 0
    if main.fmt == "mxfp8" and not empty:
        return _launch_mx8(specs, t, n, num_groups, buffers, scalars, device)
    if main.a_source == "packed" or empty:
        return H.launch(main, _grid(main, t, n, num_groups, device), (t, n), "bfloat16",
                        _with_counters(specs, buffers, device), scalars, device, empty=empty)
    from blockscale.ops import matmul_grouped_p1 as G1

    bufs, host = G1.with_workspace(G1.GroupedP1Spec(main.fmt, main.target, dtype=main.dtype),
                                   buffers, t, scalars["k"], num_groups, device)
    if main.b_source == "tma":
        from blockscale.ops._pdq_tma import tensormap_values

        scalars = {**scalars, **tensormap_values(int(bufs["w"].size), int(bufs["sfb"].size),
                                                 scalars["k"])}
    out = _launch_plan(specs, t, n, num_groups, bufs, scalars, device)
    return device.to_host(out) if host else out


def check_plan(specs: tuple[GroupedPdqSpec, ...]) -> None:
    """ValueError unless ``specs`` is one spec of band "all", or band "out" then "in" that
    differ only in their items (the same format, A, operand type, store, row scales and
    ``pdl``: one phase 1 and one output serve both)."""
    bands = tuple(s.band for s in specs)
    if bands not in (("all",), ("out", "in")):
        raise ValueError(f"a plan is one kernel of band 'all' or the bands ('out', 'in'), got "
                         f"{bands}")
    same = ("fmt", "row_scales", "target", "a_source", "dtype", "store", "sigma_out", "pdl")
    diff = [f for f in same if len({getattr(s, f) for s in specs}) > 1]
    if diff:
        raise ValueError(f"the band kernels of a plan must agree on {diff}, got "
                         f"{[[getattr(s, f) for f in diff] for s in specs]}")


def _launch_plan(specs: tuple[GroupedPdqSpec, ...], t: int, n: int, num_groups: int,
                 bufs: dict[str, Any], scalars: dict[str, Any], device: Any) -> Any:
    """The main kernel(s) on ready buffers: the first allocates C, a band "in" kernel writes
    its groups' rows into it. Numpy inputs of a band pair (e.g. routing vectors beside device
    weights) are uploaded once before both launches, so no copy sits between them (``pdl``)."""
    if len(specs) > 1:
        import numpy as np

        bufs = {x: device.to_device(np.ascontiguousarray(v)) if isinstance(v, np.ndarray)
                else v for x, v in bufs.items()}
    bufs = _with_counters(specs, bufs, device)
    out = H.launch(specs[0], _grid(specs[0], t, n, num_groups, device), (t, n), "bfloat16",
                   bufs, scalars, device)
    for spec in specs[1:]:
        H.launch_inplace(spec, _grid(spec, t, n, num_groups, device), {**bufs, "c": out},
                         scalars, device)
    return out


def _launch_mx8(specs: tuple[GroupedPdqSpec, ...], t: int, n: int, num_groups: int,
                buffers: dict[str, Any], scalars: dict[str, Any], device: Any) -> Any:
    """MXFP8 (:mod:`blockscale.ops.matmul_grouped_pdq_mx8`): the flag kernel, ``specs`` (their
    phase 1 first with the workspace A), then the fixup of the flagged rows, in place."""
    import numpy as np

    from blockscale.ops import matmul_grouped_pdq_mx8 as MX8

    spec = specs[0]
    host = all(isinstance(v, np.ndarray) for v in buffers.values())
    if host:  # keep every intermediate on the device
        _p1.check_tile_placement(buffers["expert_start"], buffers["a_scale_offsets"],
                                 buffers["expert_ids"], int(buffers["sfa"].shape[0]))
        buffers = {x: device.to_device(np.ascontiguousarray(v)) for x, v in buffers.items()}
    k, experts = scalars["k"], int(buffers["w"].shape[0])
    flags = MX8.flags(buffers, t, n, k, num_groups, experts, spec.target, device)
    bufs = buffers
    if spec.a_source != "packed":
        bufs, _ = _p1.with_workspace(_p1.GroupedP1Spec("mxfp8", spec.target), buffers, t, k,
                                     num_groups, device)
    out = _launch_plan(specs, t, n, num_groups, bufs, scalars, device)
    MX8.fixup(out, flags, buffers, t, n, k, num_groups, experts, spec.sigma_out, spec.target,
              device)
    return device.to_host(out) if host else out


def dispatch_spec(fmt: Format, n: int, row_scales: bool, target: str, device: Any,
                  sigma_out: bool = False, rows_per_group: float | None = None
                  ) -> GroupedPdqSpec:
    """The spec the grouped dispatch (:func:`blockscale.ops.matmul_grouped_wgmma.fast_path`)
    and the fused SwiGLU op's chained path (``sigma_out``) run for ``n`` output columns: the
    prefetch, the "split" loop on the GPU and "lockstep" in the lock-step interpreter (which
    runs "split" only while the K steps fit in the ring; the same bytes), the staged store
    where the rows (σ: the halves) are 16-byte aligned and it is not switched off
    (:data:`blockscale.ops._staged_store_ir.ENV_SWITCH`), else direct stores (the same
    bytes); A from :data:`DISPATCH_A_SOURCE` (or :data:`A_SOURCE_ENV`); NVFP4 with the
    workspace A and the staged store on :data:`DISPATCH_DTYPE` (or :data:`DTYPE_ENV`) operands
    (192 x 192 and 128-row skip items), else bf16; 192 x 192
    items where :data:`DISPATCH_BM` (or :data:`BM_ENV`) is 192, or "auto", the operands bf16
    and ``rows_per_group`` (routed rows / groups) at least :data:`TRI_MIN_GROUP_ROWS`, and
    256 x 128 items where it is 256, both only when A comes from the workspace and the store
    is staged (else 128-row items: the same bytes); 128-row items with the workspace A and
    the staged store skip idle warpgroups' wgmmas where :data:`DISPATCH_SKIP` (or
    :data:`SKIP_ENV`; direct stores: the rare unaligned widths, no skip, the same bytes) and
    then, at prefetch distance 1, pair their producer fences where :data:`DISPATCH_PAIR` (or
    :data:`PAIR_ENV`); the skip and 192 x 192 items load B warp-coalesced where
    :data:`DISPATCH_COALESCE` (or :data:`COALESCE_ENV`). Every choice gives the same bytes.
    MXFP8: bf16, never paired (the pair spills), prefetch distance :data:`MX8_DISPATCH_DEPTH`
    (or :data:`MX8_DEPTH_ENV`); coalesced at distance 1, its items bring the rows
    :data:`MX8_DISPATCH_L2_AHEAD` (or :data:`MX8_L2_ENV`) steps ahead into L2."""
    import os

    from blockscale.ops._staged_store_ir import dispatch_store
    from blockscale.runtime import get_device

    loop = "lockstep" if get_device(device).name == "interp" else "split"
    store = dispatch_store("bfloat16", n // 2 if sigma_out else n)
    if sigma_out and n % 2:
        store = "direct"
    a_source = os.environ.get(A_SOURCE_ENV, DISPATCH_A_SOURCE)
    H.check_choice(a_source, A_SOURCES, A_SOURCE_ENV)
    bm_env = os.environ.get(BM_ENV, str(DISPATCH_BM))
    H.check_choice(bm_env, ("auto", *map(str, BMS)), BM_ENV)
    dtype = os.environ.get(DTYPE_ENV, DISPATCH_DTYPE)
    H.check_choice(dtype, DTYPES, DTYPE_ENV)
    if (fmt.name, a_source, store) != ("nvfp4", "workspace", "staged"):
        dtype = "bf16"  # (f16 kernels are bundled for the staged skip and 192-row items)
    co = os.environ.get(COALESCE_ENV, "1" if DISPATCH_COALESCE else "0") not in (
        "0", "false", "off")
    mx8_depth = int(os.environ.get(MX8_DEPTH_ENV, str(MX8_DISPATCH_DEPTH)))
    H.check_choice(mx8_depth, (1, 2), MX8_DEPTH_ENV)
    l2 = 0
    if fmt.name == "mxfp8" and co and mx8_depth == 1:
        l2 = int(os.environ.get(MX8_L2_ENV, str(MX8_DISPATCH_L2_AHEAD)))
        H.check_choice(l2, (0, MX8_DISPATCH_L2_AHEAD), MX8_L2_ENV)  # (the bundled ones)
    bm = int(bm_env) if bm_env != "auto" else 192 if (
        dtype == "bf16" and rows_per_group is not None
        and rows_per_group >= TRI_MIN_GROUP_ROWS) else 128
    pair = os.environ.get(PAIR_ENV, "1" if DISPATCH_PAIR else "0") not in ("0", "false", "off")
    pair = pair and fmt.name != "mxfp8"  # (MXFP8: 32-byte halves, four steps of registers)
    if bm == 256 and (a_source, store) == ("workspace", "staged"):  # (bf16: not measured)
        return GroupedPdqSpec(fmt.name, row_scales, target, prefetch=True, loop=loop,
                              store=store, sigma_out=sigma_out, a_source=a_source, bm=256,
                              bn=TALL_BN, unroll=TALL_UNROLL)
    if bm == 192 and (a_source, store) == ("workspace", "staged"):
        depth = mx8_depth if fmt.name == "mxfp8" else 1
        return GroupedPdqSpec(fmt.name, row_scales, target, prefetch=True, loop=loop,
                              store=store, sigma_out=sigma_out, a_source=a_source, bm=192,
                              bn=TRI_BN, dtype=dtype, depth=depth, coalesce=co and depth == 1,
                              l2_ahead=l2 if depth == 1 else 0)
    skip = os.environ.get(SKIP_ENV, "1" if DISPATCH_SKIP else "0") not in ("0", "false", "off")
    skip = skip and a_source == "workspace" and store == "staged"
    depth = (mx8_depth if fmt.name == "mxfp8" else DISPATCH_DEPTH) if skip else 1
    pair = pair and skip and depth == 1
    co = co and skip and depth == 1
    return GroupedPdqSpec(fmt.name, row_scales, target, prefetch=True, loop=loop, store=store,
                          sigma_out=sigma_out, a_source=a_source, skip=skip, depth=depth,
                          dtype=dtype if skip else "bf16", pair=pair, coalesce=co,
                          l2_ahead=l2 if co else 0)


def dispatch_plan(fmt: Format, n: int, row_scales: bool, target: str, device: Any,
                  sigma_out: bool = False, rows_per_group: float | None = None
                  ) -> tuple[GroupedPdqSpec, ...]:
    """What the grouped dispatch and the fused SwiGLU op's chained path launch (:func:`launch`
    takes it): for :data:`BAND_FORMATS` where :data:`DISPATCH_BAND` (or :data:`BAND_ENV`),
    the item height is "auto" (:data:`BM_ENV`), ``rows_per_group`` is at least
    :data:`TRI_MIN_GROUP_ROWS` and the dispatch's 128-row items are coalesced skip items, the
    band split: those items for the groups outside :data:`BAND_ROWS` (band "out") and 192 x
    192 items of the same operands and loads for the groups inside (band "in"), by
    programmatic dependent launch where :data:`DISPATCH_BAND_PDL` (or :data:`BAND_PDL_ENV`),
    then on :data:`DISPATCH_BAND_SCHEDULE` (or :data:`BAND_SCHEDULE_ENV`); else
    ``(dispatch_spec(...),)``. Every group's rows come from one kernel; same bytes as either
    single kernel."""
    import os

    on = os.environ.get(BAND_ENV, "1" if DISPATCH_BAND else "0") not in ("0", "false", "off")
    if (on and fmt.name in BAND_FORMATS and rows_per_group is not None
            and rows_per_group >= TRI_MIN_GROUP_ROWS
            and os.environ.get(BM_ENV, str(DISPATCH_BM)) == "auto"):
        items = dispatch_spec(fmt, n, row_scales, target, device, sigma_out)  # 128-row items
        if items.skip and items.coalesce:  # (the band kernels are bundled coalesced)
            pdl = os.environ.get(BAND_PDL_ENV, "1" if DISPATCH_BAND_PDL else "0") not in (
                "0", "false", "off")
            schedule = os.environ.get(BAND_SCHEDULE_ENV, DISPATCH_BAND_SCHEDULE)
            H.check_choice(schedule, SCHEDULES, BAND_SCHEDULE_ENV)
            if schedule == "dynamic" and not pdl:
                schedule = "grid"  # (bundled: in order on the grid, by PDL on both)
            return band_plan(items, pdl, schedule)
    return (dispatch_spec(fmt, n, row_scales, target, device, sigma_out, rows_per_group),)


def band_plan(items: GroupedPdqSpec, pdl: bool = False, schedule: str = "grid"
              ) -> tuple[GroupedPdqSpec, GroupedPdqSpec]:
    """The band split of 128-row skip items ``items``: themselves as band "out" and the
    192 x 192 items of the same operands, loads and prefetch as band "in" (no paired fence:
    at 128 registers it spills); ``pdl``: the pair by programmatic dependent launch
    (:attr:`GroupedPdqSpec.pdl`); ``schedule``: both kernels' (:data:`SCHEDULES`)."""
    if not items.skip or items.band != "all":
        raise ValueError(f"band_plan takes 128-row skip items of band 'all', got "
                         f"skip={items.skip}, band={items.band!r}")
    tri = dataclasses.replace(items, bm=192, bn=TRI_BN, skip=False, pair=False, stages=None,
                              band="in", pdl=pdl, schedule=schedule)
    return dataclasses.replace(items, band="out", pdl=pdl, schedule=schedule), tri


def kernel(spec: GroupedPdqSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


def bundle_specs(target: str = "sm_90a") -> list[Any]:
    """NVFP4 (row scales on / off) and MXFP4, 4 stages, with and without the prefetch (and
    staged stores with the prefetch; two producer warpgroups at 128 x 192, both stores, and
    staged with prefetch distance 2; the σ store of the fused SwiGLU op, both stores: the
    dispatch's :func:`dispatch_spec` on the GPU for every shape; the same four with A from
    the grouped phase-1 workspace; 256 x 128 items: staged plain and σ, direct plain, with
    the producer unrolled by 2, and staged plain without; 128-row items with ``skip``,
    staged plain and σ; both staged plain with prefetch distance 2), and
    the grouped wgmma kernels its GPU tests compare with byte for byte (128 x 256, lut /
    k64 / fold); none off sm_90a."""
    from blockscale.ops.matmul_grouped_wgmma import GroupedWgmmaSpec

    if target not in TARGETS:
        return []
    variants = [(f, rs) for f in FP4_FORMATS
                for rs in ((False, True) if f == "nvfp4" else (False,))]
    specs: list[Any] = [GroupedPdqSpec(f, rs, target, None, pf) for f, rs in variants
                        for pf in (False, True)]
    specs += [GroupedPdqSpec(f, rs, target, None, True, "split", "staged")
              for f, rs in variants]
    specs += [GroupedPdqSpec(f, rs, target, None, True, "split", st, 2, 192)
              for f, rs in variants for st in STORES]
    specs += [GroupedPdqSpec(f, rs, target, None, True, "split", "staged", 2, 192, 2)
              for f, rs in variants]
    # the fused SwiGLU op's σ store (dispatch_spec; direct: BLOCKSCALE_SM90_STAGED_STORE=0)
    specs += [GroupedPdqSpec(f, rs, target, None, True, "split", st, sigma_out=True)
              for f, rs in variants for st in STORES]
    # A from the grouped phase-1 workspace (matmul_grouped_p1 bundles phase 1): the
    # dispatch's spec (staged, plain and σ) and direct stores (BLOCKSCALE_SM90_STAGED_STORE=0)
    specs += [GroupedPdqSpec(f, rs, target, None, True, "split", st, sigma_out=sg,
                             a_source="workspace")
              for f, rs in variants for st in STORES for sg in (False, True)]
    # 192 x 192 items (workspace A, staged: plain and σ; BM_ENV=192)
    specs += [GroupedPdqSpec(f, rs, target, None, True, "split", "staged", sigma_out=sg,
                             a_source="workspace", bm=192, bn=TRI_BN)
              for f, rs in variants for sg in (False, True)]
    # NVFP4's 192 x 192 and 128-row skip items on f16 operands (DTYPE_ENV=f16), plain and σ,
    # with and without the paired producer fence; bf16 with it (the skip items: also MXFP4,
    # the dispatch's)
    items = ({"bm": 192, "bn": TRI_BN}, {"skip": True})
    specs += [GroupedPdqSpec(f, rs, target, None, True, "split", "staged", sigma_out=sg,
                             a_source="workspace", dtype=dt, pair=pr, **kw)
              for f, rs in variants if f == "nvfp4" for sg in (False, True) for kw in items
              for dt, pr in (("f16", False), ("f16", True), ("bf16", True))]
    specs += [GroupedPdqSpec(f, rs, target, None, True, "split", "staged", sigma_out=sg,
                             a_source="workspace", skip=True, pair=True)
              for f, rs in variants if f != "nvfp4" for sg in (False, True)]
    # ... and NVFP4's f16 skip items with B by the TMA ring (no global load at the fence)
    specs += [GroupedPdqSpec(f, rs, target, None, False, "split", "staged",
                             a_source="workspace", skip=True, b_source="tma", dtype="f16")
              for f, rs in variants if f == "nvfp4"]
    # A copied a step early (skip items, workspace A, staged: plain and σ; with the TMA B too)
    specs += [GroupedPdqSpec(f, rs, target, None, pf, "split", "staged", sigma_out=sg,
                             a_source="workspace", skip=True, b_source=bs, a_early=True)
              for f, rs in variants for sg in (False, True)
              for pf, bs in ((True, "global"), (False, "tma"))]
    # 256 x 128 items with B through the TMA ring (staged: plain and σ; unrolled by 2)
    specs += [GroupedPdqSpec(f, rs, target, None, False, "split", "staged", sigma_out=sg,
                             a_source="workspace", bm=256, bn=TALL_BN, unroll=TALL_UNROLL,
                             b_source="tma")
              for f, rs in variants for sg in (False, True)]
    # B through the TMA ring of packed bytes (skip items, workspace A, staged: plain and σ)
    specs += [GroupedPdqSpec(f, rs, target, None, False, "split", "staged", sigma_out=sg,
                             a_source="workspace", skip=True, b_source="tma")
              for f, rs in variants for sg in (False, True)]
    # two producer warpgroups at 128 x 192 with workspace A (staged plain): 8 producer warps
    specs += [GroupedPdqSpec(f, rs, target, None, True, "split", "staged", 2, 192,
                             a_source="workspace") for f, rs in variants]
    # 256 x 128 items (workspace A): staged plain and σ (the dispatch's at BM_ENV=256), and
    # direct plain (A/B of the store)
    # 128-row items skipping idle warpgroups' wgmmas (workspace A, staged: plain and σ)
    specs += [GroupedPdqSpec(f, rs, target, None, True, "split", "staged", sigma_out=sg,
                             a_source="workspace", skip=True)
              for f, rs in variants for sg in (False, True)]
    specs += [GroupedPdqSpec(f, rs, target, None, True, "split", st, sigma_out=sg,
                             a_source="workspace", bm=256, bn=TALL_BN, unroll=u)
              for f, rs in variants for st, sg, u in (("staged", False, TALL_UNROLL),
                                                      ("staged", True, TALL_UNROLL),
                                                      ("staged", False, 1),
                                                      ("direct", False, TALL_UNROLL))]
    # prefetch distance 2 (the producer's fence then waits for no global load in flight):
    # 256 x 128 (unrolled by 2) and 128 x 256 with skip (plain and σ: DISPATCH_DEPTH),
    # workspace A, staged
    specs += [GroupedPdqSpec(f, rs, target, None, True, "split", "staged", depth=2,
                             a_source="workspace", **kw)
              for f, rs in variants for kw in ({"bm": 256, "bn": TALL_BN, "unroll": TALL_UNROLL},
                                               {"skip": True},
                                               {"skip": True, "sigma_out": True})]
    specs += [GroupedWgmmaSpec(f, rs, 128, 256, target, dequant="lut", kstep=64,
                               scaling="fold") for f, rs in variants]
    specs += _mx8_bundle_specs(target)
    specs += _coalesced_bundle_specs(target)
    specs += _band_bundle_specs(target)
    return sorted(specs, key=lambda s: s.kernel_name)


def _band_bundle_specs(target: str) -> list[Any]:
    """The band kernels :func:`dispatch_plan` can pick: every coalesced skip item of
    :func:`_coalesced_bundle_specs` as band "out", every coalesced 192 x 192 item as "in"
    (:data:`BAND_FORMATS` also by ``pdl`` on both schedules; MXFP8's in order on the grid,
    for its tests and benchmark rows)."""
    fp4 = ((False, "grid"), (True, "grid"), (True, "dynamic"))
    return [dataclasses.replace(s, band="out" if s.skip else "in", pdl=p, schedule=sc)
            for s in _coalesced_bundle_specs(target)
            for p, sc in (fp4 if s.fmt in BAND_FORMATS else ((False, "grid"),))]


def _coalesced_bundle_specs(target: str) -> list[Any]:
    """What the dispatch picks with the warp-coalesced producer loads (:data:`COALESCE_ENV`)
    under each of its knobs, plain and σ: the 128-row skip items (FP4: bf16 and NVFP4's f16
    operands, with and without the paired fence) and the 192 x 192 items (FP4: bf16, NVFP4
    f16); MXFP8's both with and without its L2 prefetch (:data:`MX8_DISPATCH_L2_AHEAD`)."""
    kw = {"prefetch": True, "a_source": "workspace", "store": "staged", "coalesce": True}
    tri = {"bm": 192, "bn": TRI_BN}

    def items(f: str) -> list[dict[str, Any]]:
        if f == "mxfp8":
            return [{**it, "l2_ahead": d} for it in ({"skip": True}, tri)
                    for d in (0, MX8_DISPATCH_L2_AHEAD)]
        dts = ("bf16", "f16") if f == "nvfp4" else ("bf16",)
        return [{"skip": True, "dtype": d, "pair": p} for d in dts for p in (False, True)] + [
            {**tri, "dtype": d} for d in dts]

    return [GroupedPdqSpec(f, rs, target, sigma_out=sg, **kw, **it)
            for f in FORMATS for rs in ((False, True) if f == "nvfp4" else (False,))
            for it in items(f) for sg in (False, True)]


def _mx8_bundle_specs(target: str) -> list[Any]:
    """MXFP8's: the dispatch's (192 x 192 and 128-row skip items, workspace A, staged, plain
    and σ, prefetch distance 1 and 2; the workspace A with direct stores, plain and σ) and the packed-A staged one its
    GPU test compares with."""
    kw = {"prefetch": True, "a_source": "workspace"}
    specs = [GroupedPdqSpec("mxfp8", False, target, store="staged", sigma_out=sg, depth=d,
                            **kw, **it)
             for sg in (False, True) for it in ({"bm": 192, "bn": TRI_BN}, {"skip": True})
             for d in (1, 2)]
    specs += [GroupedPdqSpec("mxfp8", False, target, store="direct", sigma_out=sg, **kw)
              for sg in (False, True)]
    return [*specs, GroupedPdqSpec("mxfp8", False, target, prefetch=True, store="staged")]


_core.attach_kernel_api((grouped_matmul_block_scaled_pdq,), kernel, build)
_core.register_op_module(__name__)

__all__ = [
    "GroupedPdqSpec",
    "band_plan",
    "build",
    "bundle_specs",
    "check_plan",
    "check_sigma_store",
    "dispatch_plan",
    "dispatch_spec",
    "grid",
    "grouped_matmul_block_scaled_pdq",
    "kernel",
    "launch",
]

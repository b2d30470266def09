"""Two-phase sm_90a block-scaled matmul for large M (NVFP4, MXFP4): dequantize once, then a
pure bf16 wgmma GEMM.

Same contract as :func:`blockscale.ops.matmul.block_scaled_matmul` (SEMANTICS §4.1): 5-D
scales, fp32 accumulation, ``alpha`` on the fp32 accumulator, bf16 (RNE) or f32 output, an
optional fused :class:`~blockscale.ops.matmul_epilogue.Epilogue`. K % 32 == 0.

Kernels (:mod:`blockscale.ops._twophase_ir`):

* phase 1 (:class:`DequantSpec`, one launch per operand): packed FP4 + 5-D scales -> a bf16
  workspace ``[rows_pad, k_pad]`` (``rows_pad`` = M rounded up to ``bm`` for A, N to ``bn``
  for B; ``k_pad`` = K rounded up to 64; zeros outside the operand; stored stage-ordered: per
  tile-row, 16-byte K chunks chunk-major, see _twophase_ir) with the block scale
  folded in exactly as the wgmma "fold" kernel does (NVFP4: E2M1 x |E4M3|, exact in bf16;
  MXFP4: times ``2^(e - 127 + MX_FOLD_EXP)``, undone in the epilogue). Bandwidth-bound.
* phase 2 (:class:`TwophaseMatmulSpec`): ``bm x bn`` CTA tiles (bm 128 / 192; bn 256, 240,
  224, 192), two (three) warpgroups of ``wgmma m64n<bn>k16`` fed by a ring of ``stages`` shared stages, each filled
  by two 1-D bulk copies (``cp.async.bulk`` + mbarrier ``complete_tx``; a stage is one
  contiguous span of each workspace); full / empty mbarriers, no proxy fence; the epilogue
  of the wgmma kernel (scale fix, alpha, fused epilogue, cast), stored ``store="direct"``
  (``matmul_sm90.store_tile``: a 2- / 4-byte global store per element) or ``"staged"``
  (:mod:`blockscale.ops._staged_store_ir`: the tile into the free ring, then one
  ``cp.async.bulk`` shared -> global per row; the dispatch's choice where rows of C are
  16-byte aligned: phase 2 0.400 vs 0.503 ms at 8192 x 5760 x 2944 on the H200).
* ``swizzle="128b"`` (both specs; kstep 64): phase 1 writes the workspaces already
  128B-swizzled (the 16-byte chunk c of row r at ``(c ^ (r % 8)) * 16`` in the row's
  128-byte line; staged through shared memory for coalesced stores), phase 2 copies them to
  a 1024-byte aligned ring and reads them with SWIZZLE_128B descriptors (SBO 1024), the
  layout CUTLASS's Hopper GEMMs use. Same bytes, same k16 wgmma order: bit-identical to
  the default layout. Not the dispatch default until measured (issue #9).

* ``schedule="persistent"`` (phase 2): ``min(tiles, SMs)`` CTAs (``ctas``: a launch-time
  override), each looping over the tiles ``blockIdx.x + i gridDim.x`` with its bulk-copy
  ring kept full across tile boundaries (no ring refill at a tile's start, no CTA launch
  between tiles; only the epilogue stays exposed; the wave quantization stays). Same operands and wgmma order per tile:
  bit-identical to the default. Not the dispatch default until measured (issue #9).

* ``pdl=True`` (both specs): programmatic dependent launch. B's phase 1 executes
  ``griddepcontrol.launch_dependents`` at its start; phase 2 is launched with
  programmatic stream serialization (kernel meta ``programmatic_launch``, runtime/cuda.py
  ``cuLaunchKernelEx``) and waits (``griddepcontrol.wait``) after its mbarrier init, so its
  CTA launch and prologue overlap phase 1's tail. Same bytes. Not the dispatch default
  until measured (:data:`DISPATCH_PDL`).

* ``cluster=2`` (phase 2, schedule "tiles"): clusters of 2 CTAs along M sharing each B
  stage: each CTA bulk-copies half of it to both CTAs' rings by multicast, so a pair
  reads B's tile-row from L2 once (L2 -> SM bytes per flop -33 % at 128 x 256: 128 + 128
  rows per CTA against 128 + 256); launched with a cluster dimension (kernel meta
  ``cluster_dim``, runtime/cuda.py); the grid's M-tiles rounded up to an even count. Same
  bytes. Not the dispatch default until measured (:data:`DISPATCH_CLUSTER`;
  ``BLOCKSCALE_SM90_TWOPHASE_CLUSTER=2`` turns it on).

Tile width (issue #9): the dispatch's ``bn`` is :data:`DISPATCH_BN` ("auto": :func:`wave_bn`,
e.g. 240 at 8192 x 5760 on 132 SMs, where 256 pads N to 23 column tiles) unless
``BLOCKSCALE_SM90_TWOPHASE_BN`` names a width. Tile height: with the staged store (and no
cluster) :data:`DISPATCH_BM` ("auto": :func:`wave_bm`, waves x (bm + a tile's fixed cost),
e.g. 192 at 8192 x 5760: 8 waves of 192-row tiles for 12 of 128, 2.2 % faster on the H200,
run DJ) unless ``BLOCKSCALE_SM90_TWOPHASE_BM`` names one. Any tile gives the same bytes.

Workspace: ``2 k_pad (M_pad + N_pad)`` bytes of device memory (``dev.alloc`` per call,
stream-ordered), e.g. 82.9 MB at 8192 x 5760 x 2944.

Numerics: the same bf16 operands and the same k16 wgmma sequence as
:mod:`blockscale.ops.matmul_wgmma`'s fold kernel (dequant "lut"), so the interpreter's
results are bit-identical to it; on the H200 within the stated bound (tests/test_matmul_common.py).

Dispatch (:func:`fast_path`, registered in ``matmul.FAST_PATHS`` before the wgmma kernel):
NVFP4 / MXFP4 on sm_90a with K % 32 == 0, M >= :data:`MIN_M` and workspaces of at most
:data:`MAX_WORKSPACE_BYTES`; ``BLOCKSCALE_SM90_TWOPHASE=0`` turns it off. Importing this module
does not import MLIR.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar

import numpy as np

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.ops import _staged_store_ir as S
from blockscale.ops import matmul as _matmul
from blockscale.ops.matmul_epilogue import Epilogue

#: the dispatch runs the pair from this M on. Measured on the H200 (run O, 2026-11-30, N=5760
#: K=2944, GPU time, staged stores; the wgmma kernel the dispatch ran before beside it): NVFP4
#: M=256 0.056 vs 0.067 ms, M=512 0.055 vs 0.092, M=1024 0.090 vs 0.184; MXFP4 M=256 0.054 vs
#: 0.075, M=512 0.055 vs 0.111; at M=128 a tie (NVFP4 0.053 vs 0.055, MXFP4 0.053 vs 0.051)
MIN_M = 256
#: ... while its workspaces take at most this many bytes (larger problems: the wgmma kernel)
MAX_WORKSPACE_BYTES = 1 << 30
#: BLOCKSCALE_SM90_TWOPHASE=0 turns the dispatch to this kernel off
ENV_SWITCH = "BLOCKSCALE_SM90_TWOPHASE"
#: modules whose source shapes the kernels (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._twophase_ir", "blockscale.ops._staged_store_ir",
                  "blockscale.ops._wgmma_ir",
                  "blockscale.ops._mma_ir", "blockscale.ops.matmul_epilogue",
                  "blockscale.ops._matmul_ir", "blockscale.ops.matmul_sm90")
TARGETS = ("sm_90a",)
FORMATS = ("nvfp4", "mxfp4")
#: the phase-2 tile (= _twophase_ir.BM, BN), the workspaces' K padding (= _twophase_ir.KPAD)
BM, BN, KPAD = 128, 256, 64
#: phase-2 tile widths (wgmma n; B's workspace is made for it: a tile of that many rows). Not
#: 128: ptxas serializes its wgmmas (C7515: non-wgmma instructions define the accumulator).
#: 240 / 224 (issue #9): N=5760 = 24 x 240 fills 12 waves of 132 SMs with 1536 tiles where
#: 256 pads to 23 column tiles (1472 tiles, also 12 waves): 6.25 % fewer columns per wave
BNS = (256, 240, 224, 192)
#: phase-1 workspace tiles: A's (BMS), B's (BNS)
TILES = (128, 192, 224, 240, 256)
#: the widths the dispatch's wave model (:func:`wave_bn`) chooses from. Not 192: measured
#: slower at 8192 x 5760 (run O, 0.511 vs 0.430 ms): 15 waves of 320 operand rows (4800 vs
#: 256's 4608), 25 % more tiles per SM (prologues / epilogues) and a 5-stage ring (slot and
#: parity by divisions by 5: its K loop 147 SASS vs 122). 240: 12 waves of 368 rows (4416),
#: 4 stages (127 SASS), 146 registers
WAVE_BNS = (256, 240, 224)
#: the tile heights the dispatch's wave model (:func:`wave_bm`) chooses from (staged stores)
WAVE_BMS = (128, 192)
#: :func:`wave_bm`'s fixed cost of a tile (CTA launch, the ring's first fill, the staged
#: epilogue) in rows of its K loop. Fitted on the H200 (run DJ, 2026-12-02, NVFP4 8192 x 5760
#: x 2944, bn 240, staged, phase 2 alone): 128-row tiles 0.3924 ms over 12 waves, 192-row
#: tiles 0.3838 ms over 8, so ~2.15 us a tile against ~0.239 us a row of the K loop
TILE_OVERHEAD_ROWS = 9
#: the dispatch's tile height for staged stores: an int of :data:`WAVE_BMS`, or "auto"
#: (:func:`wave_bm`); BLOCKSCALE_SM90_TWOPHASE_BM overrides it. "auto" since run DJ (H200,
#: 8192 x 5760 x 2944: the pair NVFP4 0.4107 vs 0.4198 ms, MXFP4 0.4023-0.4046 vs 0.4091);
#: in 2-CTA clusters the dispatch keeps 128
DISPATCH_BM: int | str = "auto"
ENV_BM = "BLOCKSCALE_SM90_TWOPHASE_BM"
#: :func:`wave_bn` keeps the wider tile unless a narrower one saves more than this fraction
#: of the columns per SM (per-tile prologue / epilogue costs the model does not count)
WAVE_TOLERANCE = 0.02
#: the dispatch's tile width: an int of :data:`WAVE_BNS`, or "auto" (:func:`wave_bn`);
#: BLOCKSCALE_SM90_TWOPHASE_BN overrides it. "auto" since run T (H200, 6c84ed1): 8192 x 5760 x
#: 2944 NVFP4 0.418 vs 0.431 ms (240), MXFP4 0.408 vs 0.422; direct stores stay at 256
DISPATCH_BN: int | str = "auto"
ENV_BN = "BLOCKSCALE_SM90_TWOPHASE_BN"
#: whether the dispatch launches phase 2 with programmatic dependent launch (the ``pdl``
#: specs); BLOCKSCALE_SM90_TWOPHASE_PDL=1 / 0 overrides it. Off until measured on the H200
DISPATCH_PDL = False
ENV_PDL = "BLOCKSCALE_SM90_TWOPHASE_PDL"
#: the dispatch's phase-2 cluster size (:data:`CLUSTERS`: 2 shares B between CTA pairs);
#: BLOCKSCALE_SM90_TWOPHASE_CLUSTER=1 / 2 overrides it. 1 until measured on the H200
DISPATCH_CLUSTER = 1
ENV_CLUSTER = "BLOCKSCALE_SM90_TWOPHASE_CLUSTER"
#: SMs per target where the device does not say (the interpreter): the H200's / H100 SXM's
SM_COUNTS = {"sm_90a": 132}
#: phase-2 tile heights (bm / 64 consumer warpgroups; 192: 22% fewer L2 bytes per flop)
BMS = (128, 192)
#: phase-2 K elements per step and shared stages built (kstep 64: 48 KiB a stage)
KSTEPS = (32, 64)
DEFAULT_KSTEP = 64
#: phase-2 shared memory per CTA at most (the H200's 227 KiB) and stages at most
SHARED_LIMIT, STAGES_LIMIT = 227 * 1024, 9


def max_stages(bm: int, kstep: int, bn: int = 256, extra: int = 0) -> int:
    """The most stages of ``(bm + bn) x kstep`` bf16 (plus 16 bytes of mbarriers each) that
    fit in :data:`SHARED_LIMIT` beside ``extra`` bytes: e.g. 4 at 128 x 256 / k64, 9 at k32,
    5 at 128 x 192 / k64; 3 at 128 x 256 / k64 beside a staged bf16 tile (67,584 bytes)."""
    return min(STAGES_LIMIT, (SHARED_LIMIT - extra) // ((bm + bn) * 2 * kstep + 16))
#: phase-1 threads per block (= _twophase_ir.DEQUANT_THREADS)
DEQUANT_THREADS = 256
#: workspace / shared operand layouts (= _twophase_ir.SWIZZLES): "none", the canonical
#: interleaved core matrices; "128b", the 128-byte swizzle (phase 2 at kstep 64 only)
SWIZZLES = ("none", "128b")
#: MXFP4 "fold" operands are scaled by 2^MX_FOLD_EXP each (= _wgmma_ir.MX_FOLD_EXP)
MX_FOLD_EXP = -2
#: phase-2 CTA schedules: "tiles", one CTA per tile; "persistent", at most one CTA per SM,
#: each looping over tiles with its ring kept full across tile boundaries (issue #9)
SCHEDULES = ("tiles", "persistent")
#: phase-2 epilogue stores: "direct", 2- / 4-byte global stores per element
#: (matmul_sm90.store_tile); "staged", the tile through shared memory and out by one bulk copy
#: per row (_staged_store_ir; schedule "tiles", N * element bytes % 16 == 0)
STORES = ("direct", "staged")
#: persistent CTAs launched when the device does not say its SM count (the H200's 132)
SM_COUNT = 132
#: phase-2 cluster sizes (= _twophase_ir.CLUSTERS): 1, or 2 CTAs along M sharing B by
#: multicast bulk copies
CLUSTERS = (1, 2)


def _sw_tag(swizzle: str) -> str:
    return "" if swizzle == "none" else "_sw128"


def _scale_dtype(fmt: str) -> str:
    return Format.from_name(fmt).scale_dtype.name


def _check_pdl(pdl: Any) -> None:
    if type(pdl) is not bool:
        raise TypeError(f"pdl must be a bool, got {pdl!r}")


def _check_format(fmt: str, target: str) -> str:
    H.check_choice(fmt, FORMATS, "fmt")
    t = H.target_name(target)
    H.check_choice(t, TARGETS, "target")
    return t


@dataclasses.dataclass(frozen=True)
class DequantSpec(FormatSpec):
    """Phase 1: one operand's packed FP4 rows + 5-D scales -> its bf16 workspace.

    Attributes:
        fmt: "nvfp4" | "mxfp4".
        target: "sm_90a".
        tile: the phase-2 tile height the workspace is for (:data:`BMS` for A, 256 for B).
        swizzle: the workspace layout (:data:`SWIZZLES`); phase 2 must read it with the same.
        pdl: every thread first executes ``griddepcontrol.launch_dependents``: a phase 2
            launched next with ``pdl`` may be scheduled while this grid's last blocks run.
    """

    fmt: str
    target: str = "sm_90a"
    tile: int = BM
    swizzle: str = "none"
    pdl: bool = False

    op: ClassVar[str] = "block_scaled_matmul_twophase_dequant"
    block: ClassVar[tuple[int, int, int]] = (DEQUANT_THREADS, 1, 1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Format.from_name(self.fmt).name)
        object.__setattr__(self, "target", _check_format(self.fmt, self.target))
        H.check_choice(self.tile, TILES, "tile")
        H.check_choice(self.swizzle, SWIZZLES, "swizzle")
        _check_pdl(self.pdl)

    @property
    def kernel_name(self) -> str:
        return (f"bs_twophase_dequant_{self.fmt}_t{self.tile}{_sw_tag(self.swizzle)}"
                f"{'_pdl' if self.pdl else ''}")

    def args(self) -> tuple[KernelArg, ...]:
        """x (packed rows), sfx (5-D scales), ws (the workspace bytes), rows, rows_pad, k."""
        return (KernelArg("x", "buffer", "uint8"), KernelArg("sfx", "buffer",
                                                              _scale_dtype(self.fmt)),
                KernelArg("ws", "buffer", "uint8", "out"), KernelArg("rows", "scalar", "i32"),
                KernelArg("rows_pad", "scalar", "i32"), KernelArg("k", "scalar", "i32"))


@dataclasses.dataclass(frozen=True)
class TwophaseMatmulSpec(FormatSpec):
    """Phase 2: the bf16 wgmma GEMM over the workspaces, with the matmul epilogue.

    Attributes:
        fmt: "nvfp4" | "mxfp4" (the workspaces' scaling; MXFP4's is undone in the epilogue).
        out_dtype: "bfloat16" | "float32".
        epilogue: an optional fused :class:`Epilogue`.
        target: "sm_90a".
        kstep: K elements per step (:data:`KSTEPS`); None: :data:`DEFAULT_KSTEP`.
        stages: shared stages (2 .. :func:`max_stages`; bulk copies run ``stages - 1``
            steps ahead); None: the largest that fits (:func:`max_stages`).
        bm: the tile height (:data:`BMS`; ``bm / 64`` warpgroups, ``2 bm`` threads); the
            A workspace must be made for it (:func:`dequantize_operands` ``bm``).
        swizzle: the workspaces' and shared stages' layout (:data:`SWIZZLES`; "128b" needs
            kstep 64 and workspaces made with it).
        schedule: :data:`SCHEDULES`; "persistent" runs on any grid (:func:`grid`), each CTA
            taking tiles ``blockIdx.x + i gridDim.x`` in the rasterized order; the same
            wgmma order per tile, so the same bytes as "tiles".
        store: :data:`STORES`; "staged" needs ``N * element bytes % 16 == 0`` at launch
            (schedule "tiles": the tile is staged in the free ring, which must hold it;
            "persistent": in :attr:`staging_bytes` after the ring, so fewer stages fit).
            Same bytes as "direct".
        bn: the tile width (:data:`BNS`: ``wgmma m64n<bn>k16``); the B workspace must be
            made for it (:func:`dequantize_operands` ``bn``). Same k16 order per element,
            so the same bytes as any other width.
        pdl: programmatic dependent launch: the runtime launches the kernel with
            programmatic stream serialization (:attr:`launch_meta`), so its CTAs may start
            (mbarrier init) while the previous grid (phase 1 of B, built with ``pdl``: it
            triggers at its start) still runs; every thread executes ``griddepcontrol.wait``
            before the first workspace read. The same bytes.
        cluster: :data:`CLUSTERS`; 2 (schedule "tiles"): clusters of 2 CTAs along M (the
            grid's consecutive CTA pairs, launched with a cluster dimension: :attr:`launch_meta`)
            share each B stage, each CTA bulk-copying half of it to both by multicast, so a
            pair reads B's tile-row from L2 once (L2 -> SM bytes per flop -33 % at
            128 x 256).
            The same operands and k16 order per tile: the same bytes.
    """

    fmt: str
    out_dtype: str = "bfloat16"
    epilogue: Epilogue | None = None
    target: str = "sm_90a"
    kstep: int | None = None
    stages: int | None = None
    bm: int = BM
    swizzle: str = "none"
    schedule: str = "tiles"
    store: str = "direct"
    bn: int = BN
    pdl: bool = False
    cluster: int = 1

    op: ClassVar[str] = "block_scaled_matmul_twophase"

    @property
    def block(self) -> tuple[int, int, int]:
        return (2 * self.bm, 1, 1)

    def __post_init__(self) -> None:
        _matmul.check_spec_fields(self)
        object.__setattr__(self, "target", _check_format(self.fmt, self.target))
        if self.kstep is None:
            object.__setattr__(self, "kstep", DEFAULT_KSTEP)
        H.check_choice(self.kstep, KSTEPS, "kstep")
        H.check_choice(self.bm, BMS, "bm")
        H.check_choice(self.swizzle, SWIZZLES, "swizzle")
        H.check_choice(self.schedule, SCHEDULES, "schedule")
        if self.swizzle == "128b" and self.kstep != 64:
            raise ValueError(f"swizzle '128b' needs kstep 64 (one 128-byte row), got "
                             f"kstep={self.kstep}")
        H.check_choice(self.bn, BNS, "bn")
        H.check_choice(self.store, STORES, "store")
        _check_pdl(self.pdl)
        if type(self.cluster) is not int:
            raise TypeError(f"cluster must be an int, got {self.cluster!r}")
        H.check_choice(self.cluster, CLUSTERS, "cluster")
        if self.cluster > 1 and self.schedule != "tiles":
            raise ValueError(f"cluster={self.cluster} takes schedule 'tiles', got "
                             f"{self.schedule!r}")
        most = max_stages(self.bm, self.kstep, self.bn, self.staging_bytes)
        if self.stages is None:  # above 4, a power of two: slot / parity by shifts, not
            # divisions (run V on the H200, phase 2 at 8192 x 5760 x 2944: bn 224 4 stages
            # 0.395 vs 5 stages 0.442 ms, bn 192 0.400 vs 0.480)
            object.__setattr__(self, "stages", most if most <= 4 else 1 << (most.bit_length() - 1))
        if type(self.stages) is not int or not 2 <= self.stages <= most:
            raise ValueError(f"stages must be an int in [2, {most}] for bm={self.bm}, "
                             f"bn={self.bn}, kstep={self.kstep}, got {self.stages!r}")
        if self.store == "staged" and self.schedule == "tiles":  # the tile in the free ring
            need, ring = S.stage_bytes(self.out_dtype, self.bm, self.bn), self.stages * (
                self.bm + self.bn) * 2 * self.kstep
            if need > ring:
                raise ValueError(f"store 'staged' needs {need} bytes of the ring, but "
                                 f"stages={self.stages} x kstep={self.kstep} give {ring}")

    @property
    def staging_bytes(self) -> int:
        """Shared bytes of the staged tile beside the ring: a persistent CTA's ring keeps
        loading the next tile during the epilogue (schedule "tiles": 0, the ring is reused)."""
        if self.store != "staged" or self.schedule == "tiles":
            return 0
        return S.stage_bytes(self.out_dtype, self.bm, self.bn)

    @property
    def dynamic_shared_bytes(self) -> int:
        """The ring (``stages`` x (bm + bn) rows x ``kstep`` bf16), its ``2 stages``
        mbarriers and the :attr:`staging_bytes` after them."""
        return (self.stages * (self.bm + self.bn) * 2 * self.kstep + 16 * self.stages
                + self.staging_bytes)

    @property
    def kernel_name(self) -> str:
        ep = f"_ep{self.epilogue.key[:10]}" if self.epilogue else ""
        return (f"bs_twophase_{self.fmt}_{self.bm}x{self.bn}_k{self.kstep}_s{self.stages}_"
                f"{H.out_tag(self.out_dtype)}{_sw_tag(self.swizzle)}"
                f"{'_persistent' if self.schedule == 'persistent' else ''}"
                f"{'_st' if self.store == 'staged' else ''}{'_pdl' if self.pdl else ''}"
                f"{f'_c{self.cluster}' if self.cluster > 1 else ''}{ep}")

    @property
    def launch_meta(self) -> dict[str, Any]:
        """Kernel metadata the runtime launches by (ops/_core.py copies it into the kernel's
        ``meta``): ``programmatic_launch`` with :attr:`pdl`, ``cluster_dim`` (x, y, z) with
        :attr:`cluster` > 1 (runtime/cuda.py, the interpreter)."""
        meta: dict[str, Any] = {"programmatic_launch": True} if self.pdl else {}
        if self.cluster > 1:
            meta["cluster_dim"] = (self.cluster, 1, 1)
        return meta

    def args(self) -> tuple[KernelArg, ...]:
        """wa, wb (the workspaces' bytes), c, epilogue inputs, m, n, k, alpha."""
        base = _matmul.MatmulSpec(self.fmt, self.out_dtype, "tcgen5d", self.epilogue,
                                  self.target).args()
        return (KernelArg("wa", "buffer", "uint8"), KernelArg("wb", "buffer", "uint8"),
                *(a for a in base if a.name not in ("a", "b", "sfa", "sfb")))


def padded(rows: int, tile: int) -> int:
    """``rows`` rounded up to a multiple of ``tile`` (at least one tile)."""
    return max(1, -(-rows // tile)) * tile


def k_padded(k: int) -> int:
    """K of the workspaces: a multiple of :data:`KPAD`."""
    return -(-k // KPAD) * KPAD


def workspace_bytes(m: int, n: int, k: int, bm: int = BM, bn: int = BN) -> int:
    """Device bytes of the two bf16 workspaces of an M x N x K call (tile height ``bm``)."""
    return 2 * k_padded(k) * (padded(m, bm) + padded(n, bn))


def dequant_grid(rows_pad: int, k: int) -> tuple[int, int, int]:
    """Phase 1: one thread per 64-element piece (a 32-byte sector of packed FP4) of a row."""
    return (max(1, -(-rows_pad * (k_padded(k) // 64) // DEQUANT_THREADS)), 1, 1)


def waves(m: int, n: int, sms: int, bm: int = BM, bn: int = BN) -> int:
    """Phase 2's waves of one-CTA-per-SM tiles (``bm x bn``) at ``sms`` SMs."""
    return -(-max(1, -(-m // bm)) * max(1, -(-n // bn)) // sms)


#: :func:`wave_bn`'s cost models: "rows", the operand rows (bm + bn) an SM streams per K
#: element, waves * (bm + bn); "columns", the output columns, waves * bn
WAVE_MODELS = ("rows", "columns")


def wave_bn(m: int, n: int, sms: int, bm: int = BM,
            candidates: tuple[int, ...] = WAVE_BNS, tolerance: float = WAVE_TOLERANCE,
            model: str = "rows") -> int:
    """The tile width of ``candidates`` of the least cost per SM in lock-step waves of one
    CTA per SM: ``waves * (bm + bn)`` (``model="rows"``: the A and B rows an SM streams from
    L2 through shared memory per K element; phase 2 is bandwidth- rather than tensor-bound,
    tensor pipe 79 % in Nsight Compute, run N) or ``waves * bn`` ("columns": tensor time).
    The widest width within ``tolerance`` of the least cost wins (ties and near-ties go to
    the wider tile: fewer tiles, fewer prologues / epilogues, which neither model counts).
    8192 x 5760 on 132 SMs, "rows": 256 -> 12 waves x 384 = 4608, 240 -> 12 x 368 = 4416
    (chosen), 224 -> 13 x 352 = 4576, 192 -> 15 x 320 = 4800 (slower than 256, as measured
    in run O: 0.511 vs 0.430 ms); "columns" ranks 192 (15 x 192 = 2880) level with 240 and
    ahead of 256 (3072), against that measurement."""
    if type(sms) is not int or sms < 1:
        raise ValueError(f"sms must be a positive int, got {sms!r}")
    if not candidates or any(c not in BNS for c in candidates):
        raise ValueError(f"candidates must be a non-empty subset of {list(BNS)}, got "
                         f"{candidates!r}")
    H.check_choice(model, WAVE_MODELS, "model")
    cost = {bn: waves(m, n, sms, bm, bn) * (bn + (bm if model == "rows" else 0))
            for bn in candidates}
    best = min(cost.values())
    return max(bn for bn, c in cost.items() if c <= best * (1 + tolerance))


def wave_bm(m: int, n: int, sms: int, bn: int = BN,
            candidates: tuple[int, ...] = WAVE_BMS,
            overhead: int = TILE_OVERHEAD_ROWS) -> int:
    """The tile height of ``candidates`` of the least time per SM in lock-step waves of one
    CTA per SM: ``waves * (bm + overhead)``, a tile's K loop in rows plus its fixed cost
    (:data:`TILE_OVERHEAD_ROWS`); ties to the lower height. 8192 x 5760 (bn 240) on 132 SMs:
    128 -> 12 x 137 = 1644, 192 -> 8 x 201 = 1608 (chosen; measured 2.2 % faster, run DJ);
    1024 x 5760: 2 waves either way, 128 (274 against 402)."""
    if type(sms) is not int or sms < 1:
        raise ValueError(f"sms must be a positive int, got {sms!r}")
    if not candidates or any(c not in BMS for c in candidates):
        raise ValueError(f"candidates must be a non-empty subset of {list(BMS)}, got "
                         f"{candidates!r}")
    cost = {bm: waves(m, n, sms, bm, bn) * (bm + overhead) for bm in sorted(candidates)}
    return min(cost, key=lambda bm: (cost[bm], bm))


def dispatch_bm(m: int, n: int, bn: int, dev: Any, target: str = "sm_90a") -> int:
    """The dispatch's tile height for the staged store: :data:`ENV_BM` if set ("auto" or a
    height of :data:`WAVE_BMS`), else :data:`DISPATCH_BM`; "auto": :func:`wave_bm` at the
    device's :func:`sm_count`."""
    choice = _tile_choice(ENV_BM, DISPATCH_BM, WAVE_BMS)
    return wave_bm(m, n, sm_count(dev, target), bn) if choice == "auto" else choice


def _tile_choice(env: str, default: int | str, choices: tuple[int, ...]) -> int | str:
    """A dispatch tile size: the ``env`` variable if set, else ``default``; "auto" or an int
    of ``choices`` (anything else: ValueError naming both)."""
    choice = os.environ.get(env) or default
    if str(choice) == "auto":
        return "auto"
    try:
        size = int(choice)
    except ValueError:
        size = None
    if size not in choices:
        name = "DISPATCH_" + env.rsplit("_", 1)[1]
        raise ValueError(f"{env} / {name} must be 'auto' or one of {list(choices)}, "
                         f"got {choice!r}")
    return size


def sm_count(dev: Any, target: str = "sm_90a") -> int:
    """The device's SM count (``dev.sm_count``), else :data:`SM_COUNTS` of ``target`` (the
    interpreter), else :data:`SM_COUNT`."""
    return int(getattr(dev, "sm_count", None) or SM_COUNTS.get(target, SM_COUNT))


def dispatch_cluster() -> int:
    """The dispatch's phase-2 cluster size: :data:`ENV_CLUSTER` ("1" / "2") if set, else
    :data:`DISPATCH_CLUSTER`."""
    v = os.environ.get(ENV_CLUSTER)
    if v is None or v == "":
        return DISPATCH_CLUSTER
    if v not in ("1", "2"):
        raise ValueError(f"{ENV_CLUSTER} must be '1' or '2', got {v!r}")
    return int(v)


def dispatch_pdl() -> bool:
    """Whether the dispatch launches phase 2 with programmatic dependent launch:
    :data:`ENV_PDL` ("1" / "0") if set, else :data:`DISPATCH_PDL`."""
    v = os.environ.get(ENV_PDL)
    if v is None or v == "":
        return DISPATCH_PDL
    if v not in ("0", "1"):
        raise ValueError(f"{ENV_PDL} must be '0' or '1', got {v!r}")
    return v == "1"


def dispatch_bn(m: int, n: int, dev: Any, target: str = "sm_90a") -> int:
    """The dispatch's tile width: :data:`ENV_BN` if set, else :data:`DISPATCH_BN`; "auto":
    :func:`wave_bn` at the device's :func:`sm_count`."""
    choice = _tile_choice(ENV_BN, DISPATCH_BN, WAVE_BNS)
    return wave_bn(m, n, sm_count(dev, target)) if choice == "auto" else choice


def grid(m: int, n: int, bm: int = BM, schedule: str = "tiles",
         ctas: int | None = None, bn: int = BN, cluster: int = 1) -> tuple[int, int, int]:
    """Phase 2: one CTA per bm x bn tile of C (1-D, rasterized in the kernel); ``cluster``
    2: M-tiles rounded up to a multiple of 2 (a whole number of clusters; the odd one out
    stores nothing); schedule "persistent": ``min(tiles, ctas)`` CTAs (``ctas``: e.g. the
    SM count; None: :data:`SM_COUNT`)."""
    H.check_choice(cluster, CLUSTERS, "cluster")
    tiles_m = -(-max(1, -(-m // bm)) // cluster) * cluster
    tiles = tiles_m * max(1, -(-n // bn))
    H.check_choice(schedule, SCHEDULES, "schedule")
    if schedule == "tiles":
        return (tiles, 1, 1)
    if cluster > 1:
        raise ValueError(f"cluster={cluster} takes schedule 'tiles', got {schedule!r}")
    ctas = SM_COUNT if ctas is None else ctas
    if type(ctas) is not int or ctas < 1:
        raise ValueError(f"ctas must be a positive int, got {ctas!r}")
    return (min(tiles, ctas), 1, 1)


def _ctas(ctas: int | None, dev: Any) -> int:
    """Persistent CTAs: ``ctas``, else the device's SM count (:func:`sm_count`)."""
    return ctas if ctas is not None else sm_count(dev)


def build(spec: DequantSpec | TwophaseMatmulSpec) -> Any:
    """The ``mlir.ir.Module`` of either phase's kernel (IR only)."""
    from mlir.dialects import arith

    import blockscale.ops._twophase_ir as T
    import blockscale.ops._wgmma_ir as X
    from blockscale.compiler import ir as bir
    from blockscale.compiler.arch import nvvm as N
    from blockscale.compiler.arch import tma
    from blockscale.ops import matmul_sm90 as _sm90

    if (T.BM, T.BN, T.KPAD, T.DEQUANT_THREADS, X.MX_FOLD_EXP, T.SWIZZLES) != (
            BM, BN, KPAD, DEQUANT_THREADS, MX_FOLD_EXP, SWIZZLES) or T.CLUSTERS != CLUSTERS:
        raise AssertionError("matmul_twophase's constants disagree with _twophase_ir's")
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        if isinstance(spec, DequantSpec):
            rows, rows_pad, k = (bir.as_index(kb.arg(x)) for x in ("rows", "rows_pad", "k"))
            T.emit_dequant(kb.arg("x"), kb.arg("sfx"), kb.arg("ws"), rows, rows_pad, k,
                           spec.fmt, spec.tile, spec.swizzle, kb, spec.pdl)
            return kb.module
        if (T.shared_bytes(spec.kstep, spec.stages, spec.bm, spec.bn) + spec.staging_bytes
                != spec.dynamic_shared_bytes):
            raise AssertionError("matmul_twophase's shared bytes disagree with _twophase_ir's")
        m_count, n_count, k = (bir.as_index(kb.arg(x)) for x in ("m", "n", "k"))
        fix = X.accumulator_scale("lut", spec.fmt, "fold")

        def scale(v: Any, m: Any, n: Any) -> Any:
            if fix != 1.0:  # exact power of two first, then alpha (as the portable kernel)
                v = arith.mulf(v, bir.const(fix, bir.f32()))
            return _sm90._alpha(v, kb.arg("alpha"))

        def store(acc: Any, wg: Any, m0: Any, n0: Any) -> None:
            if spec.store == "staged":  # in the ring ("tiles"), or after it and its mbarriers
                ring = T.shared_bytes(spec.kstep, spec.stages, spec.bm, spec.bn)
                smem = tma.extern_shared_buffer(kb, spec.dynamic_shared_bytes)
                S.store_tile_staged(spec, kb, T.accumulator_tiles(acc, spec.bn),
                                    X.warp_coords(wg), smem, m0, n0, m_count, n_count, scale,
                                    spec.bm, spec.bn, base=ring if spec.staging_bytes else 0)
                return
            _sm90.store_tile(spec, kb, T.accumulator_tiles(acc, spec.bn), X.warp_coords(wg),
                             m0, n0, m_count, n_count, scale)

        if spec.schedule == "persistent":
            T.emit_persistent(kb, kb.arg("wa"), kb.arg("wb"), m_count, n_count, k,
                              spec.kstep, spec.stages, spec.bm, spec.swizzle, store, spec.bn,
                              spec.pdl)
            return kb.module
        tiles_m, tiles_n = bir.ceil_div(m_count, spec.bm), bir.ceil_div(n_count, spec.bn)
        if spec.cluster > 1:
            rank = N.cluster_ctarank()
            mt, nt = T.cluster_tile(tiles_m, tiles_n, rank, spec.cluster)
            m0, n0 = bir.mul(mt, spec.bm), bir.mul(nt, spec.bn)
            # the odd M-tile out of the last cluster row loads A's last tile-row (its B half
            # feeds the peer) and stores nothing
            m_load = bir.mul(bir.umin(mt, bir.sub(tiles_m, 1)), spec.bm)
            acc, wg = T.emit_mainloop(kb, kb.arg("wa"), kb.arg("wb"), m_load, n0, k,
                                      spec.kstep, spec.stages, spec.bm, spec.swizzle,
                                      spec.bn, spec.pdl, spec.cluster, rank)
            with bir.when(bir.ult(mt, tiles_m)):  # CTA-uniform
                store(acc, wg, m0, n0)
            T.cluster_exit()
            return kb.module
        mt, nt = T.raster_tile(tiles_m, tiles_n)
        m0, n0 = bir.mul(mt, spec.bm), bir.mul(nt, spec.bn)
        acc, wg = T.emit_mainloop(kb, kb.arg("wa"), kb.arg("wb"), m0, n0, k, spec.kstep,
                                  spec.stages, spec.bm, spec.swizzle, spec.bn, spec.pdl)
        store(acc, wg, m0, n0)
    return kb.module


# ---- host side -------------------------------------------------------------------------------


def _dequantize(fmt: str, target: str, x: Any, sfx: Any, rows: int, tile: int, k: int,
                dev: Any, swizzle: str = "none", pdl: bool = False) -> Any:
    """Phase 1 for one operand: its workspace (a device uint8 array)."""
    rows_pad = padded(rows, tile)
    _, out = _core.launch_op(DequantSpec(fmt, target, tile, swizzle, pdl),
                             dequant_grid(rows_pad, k),
                             (("ws", (2 * rows_pad * k_padded(k),), np.dtype(np.uint8)),),
                             {"x": x, "sfx": sfx}, {"rows": rows, "rows_pad": rows_pad, "k": k},
                             dev)
    return out["ws"]


def _workspaces(fmt: str, target: str, ops: dict[str, Any], m: int, n: int, k: int,
                dev: Any, bm: int = BM, swizzle: str = "none",
                bn: int = BN, pdl: bool = False) -> tuple[Any, Any]:
    """Phase 1 for A and B: their workspaces (device uint8 arrays); ``pdl``: B's launch (the
    one before phase 2) triggers its dependents."""
    return (_dequantize(fmt, target, ops["a"], ops["sfa"], m, bm, k, dev, swizzle),
            _dequantize(fmt, target, ops["b"], ops["sfb"], n, bn, k, dev, swizzle, pdl))


def phase1_operands(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, k: int | None,
                    caller: str) -> tuple[Format, Any]:
    """Phase 1's operand check: the format (one of :data:`FORMATS`) and the operands' dims
    (``_matmul._validate``: m, n, k) with k % 32 == 0 and m, n > 0; ValueError naming
    ``caller`` otherwise."""
    fmt = Format.from_name(fmt)
    if fmt.name not in FORMATS:
        raise ValueError(f"fmt must be one of {list(FORMATS)}, got {fmt.name!r}")
    d = _matmul._validate(a, b, sfa, sfb, fmt, k, "tcgen5d")
    if d.k % 32 or not d.m or not d.n:
        raise ValueError(f"{caller} takes k % 32 == 0 and m, n > 0, got m={d.m}, n={d.n}, "
                         f"k={d.k}")
    return fmt, d


def dequantize_operands(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *,
                        k: int | None = None, bm: int = BM, swizzle: str = "none",
                        bn: int = BN, device: Any = None) -> tuple[Any, Any]:
    """Phase 1 alone (e.g. to time it): the bf16 workspaces of A (``[M_pad, k_pad]``, for
    phase-2 tiles of height ``bm``) and B (``[N_pad, k_pad]``, for tiles of width ``bn``) in
    the layout ``swizzle`` (:data:`SWIZZLES`) as flat uint8 device arrays (numpy when every
    input is numpy)."""
    H.check_choice(bm, BMS, "bm")
    H.check_choice(bn, BNS, "bn")
    H.check_choice(swizzle, SWIZZLES, "swizzle")
    fmt, d = phase1_operands(a, b, sfa, sfb, fmt, k, "dequantize_operands")
    dev, tgt = H.device_and_target(device, "sm_90a")
    ops = {"a": a, "b": b, "sfa": sfa, "sfb": sfb}
    host = all(isinstance(v, np.ndarray) for v in ops.values())
    if host:
        ops = {n: dev.to_device(np.ascontiguousarray(v)) for n, v in ops.items()}
    wa, wb = _workspaces(fmt.name, tgt, ops, d.m, d.n, d.k, dev, bm, swizzle, bn)
    return (dev.to_host(wa), dev.to_host(wb)) if host else (wa, wb)


def matmul_workspaces(wa: Any, wb: Any, fmt: Format | str, m: int, n: int, k: int, *,
                      alpha: float = 1.0, out_dtype: str = "bfloat16",
                      kstep: int | None = None, stages: int | None = None, bm: int = BM,
                      swizzle: str = "none", schedule: str = "tiles",
                      ctas: int | None = None, store: str = "direct", bn: int = BN,
                      cluster: int = 1, device: Any = None) -> Any:
    """Phase 2 alone (e.g. to time it): C = A B^T from the device workspaces of
    :func:`dequantize_operands` (``fmt``, ``bm``, ``bn`` and ``swizzle``: those they were made
    with; the layouts depend on ``bm`` / ``bn``), no epilogue; ``schedule`` / ``ctas`` /
    ``store`` / ``cluster``: see :class:`TwophaseMatmulSpec` and :func:`grid`. Returns the
    device output."""
    fmt = Format.from_name(fmt)
    if fmt.name not in FORMATS:
        raise ValueError(f"fmt must be one of {list(FORMATS)}, got {fmt.name!r}")
    H.check_choice(bm, BMS, "bm")
    H.check_choice(bn, BNS, "bn")
    for name, w, rows, tile in (("wa", wa, m, bm), ("wb", wb, n, bn)):
        want = 2 * k_padded(k) * padded(rows, tile)
        if int(np.prod(w.shape)) != want:
            raise ValueError(f"{name} must hold {want} bytes (the workspace of {rows} rows, "
                             f"k={k}), got shape {tuple(w.shape)}")
    dev, tgt = H.device_and_target(device, "sm_90a")
    spec = TwophaseMatmulSpec(fmt.name, out_dtype, None, tgt, kstep, stages, bm, swizzle,
                              schedule, store, bn, cluster=cluster)
    S.check_store(spec.store, spec.out_dtype, n)
    return H.launch(spec, grid(m, n, bm, schedule, _ctas(ctas, dev), bn, cluster), (m, n),
                    out_dtype,
                    {"wa": wa, "wb": wb},
                    {"m": m, "n": n, "k": k, "alpha": H.finite_f32(alpha, "alpha")}, dev)


def block_scaled_matmul_twophase(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *,
                                 k: int | None = None, alpha: float = 1.0,
                                 out_dtype: str = "bfloat16", epilogue: Epilogue | None = None,
                                 epilogue_inputs: dict[str, Any] | None = None,
                                 kstep: int | None = None, stages: int | None = None,
                                 bm: int = BM, swizzle: str = "none",
                                 schedule: str = "tiles", ctas: int | None = None,
                                 store: str = "direct", bn: int = BN, pdl: bool = False,
                                 cluster: int = 1, device: Any = None) -> Any:
    """The two-phase kernel pair called directly (no dispatch), e.g. by tests and benchmarks.
    Same arguments as :func:`blockscale.ops.matmul_wgmma.block_scaled_matmul_wgmma` (no tile
    or variant choice), plus phase 2's ``kstep``, ``stages``, tile height ``bm``, the
    workspaces' layout ``swizzle``, CTA ``schedule``, epilogue ``store``, tile width ``bn``,
    programmatic dependent launch ``pdl`` and ``cluster`` (:class:`TwophaseMatmulSpec`;
    ``ctas``: the persistent grid's CTA count, default the device's SM count).
    Allocates :func:`workspace_bytes` of device memory per call. Raises ValueError for a
    format other than NVFP4 / MXFP4 or K % 32 != 0."""
    fmt = Format.from_name(fmt)
    if fmt.name not in FORMATS:
        raise ValueError(f"fmt must be one of {list(FORMATS)}, got {fmt.name!r}")
    d = _matmul._validate(a, b, sfa, sfb, fmt, k, "tcgen5d")
    H.require_aligned(a=a, b=b, sfa=sfa, sfb=sfb)  # no portable fallback here
    if d.k % 32:
        raise ValueError(f"the two-phase kernel takes k % 32 == 0, got k={d.k}")
    dev, tgt = H.device_and_target(device, "sm_90a")
    spec = TwophaseMatmulSpec(fmt.name, out_dtype, epilogue, tgt, kstep, stages, bm, swizzle,
                              schedule, store, bn, pdl, cluster)
    S.check_store(spec.store, spec.out_dtype, d.n)
    return _run(spec, d, a, b, sfa, sfb, alpha, dict(epilogue_inputs or {}), dev, ctas)


def _run(spec: TwophaseMatmulSpec, d: Any, a: Any, b: Any, sfa: Any, sfb: Any, alpha: float,
         extra: dict[str, Any], dev: Any, ctas: int | None = None) -> Any:
    """Both phases on validated operands ``d`` (dims) with ``spec``'s phase 2."""
    alpha = H.finite_f32(alpha, "alpha")
    H.check_epilogue_inputs(spec.epilogue.inputs if spec.epilogue else (), extra, d.m, d.n)
    ops = {"a": a, "b": b, "sfa": sfa, "sfb": sfb}
    bm, bn = spec.bm, spec.bn
    if d.m == 0 or d.n == 0:
        return H.launch(spec, grid(d.m, d.n, bm, bn=bn), (d.m, d.n), spec.out_dtype,
                        {**ops, **extra},
                        {}, dev, empty=True)
    host = all(isinstance(v, np.ndarray) for v in (*ops.values(), *extra.values()))
    if host:  # keep the workspaces on the device between the phases
        ops = {n: dev.to_device(np.ascontiguousarray(v)) for n, v in ops.items()}
    if spec.swizzle == "none":  # phase 1 for A and B in one launch (run U)
        from blockscale.ops import matmul_twophase_p1 as P1  # (it imports this module)

        wa, wb = P1.launch(P1.BothSpec(spec.fmt, bm, bn, pdl=spec.pdl, target=spec.target),
                           ops, d.m, d.n, d.k, dev)
    else:
        wa, wb = _workspaces(spec.fmt, spec.target, ops, d.m, d.n, d.k, dev, bm, spec.swizzle,
                             bn, spec.pdl)
    out = H.launch(spec, grid(d.m, d.n, bm, spec.schedule, _ctas(ctas, dev), bn, spec.cluster),
                   (d.m, d.n),
                   spec.out_dtype, {"wa": wa, "wb": wb, **extra},
                   {"m": d.m, "n": d.n, "k": d.k, "alpha": alpha}, dev)
    return dev.to_host(out) if host else out


def enabled() -> bool:
    """False when BLOCKSCALE_SM90_TWOPHASE=0."""
    return os.environ.get(ENV_SWITCH, "1") not in ("0", "false", "off")


def fast_path(target: str, fmt: Format, m: int, n: int, k: int, out_dtype: str,
              epilogue: Epilogue | None) -> Any:
    """The :data:`blockscale.ops.matmul.FAST_PATHS` hook: a runner of both phases for sm_90a,
    NVFP4 / MXFP4, K % 32 == 0, M >= :data:`MIN_M` and workspaces within
    :data:`MAX_WORKSPACE_BYTES` (unless switched off), else None (the wgmma kernel is next).
    Phase 2 stores "staged" where rows of C are 16-byte aligned (N % 8 == 0 for bf16, N % 4
    for f32), else "direct": measured on the H200 (2026-11-30, run N, 8192 x 5760 x 2944) phase 2
    0.400 vs 0.503 ms, the pair NVFP4 0.431 vs 0.532 ms, MXFP4 0.423 vs 0.527 ms."""
    if (target not in TARGETS or fmt.name not in FORMATS or k % 32 or m < MIN_M or n == 0
            or not enabled() or workspace_bytes(m, n, k) > MAX_WORKSPACE_BYTES):
        return None
    dims = _matmul._Dense(fmt, m, n, k)

    def run(a: Any, b: Any, sfa: Any, sfb: Any, alpha: float, extra: dict[str, Any],
            device: Any) -> Any:
        store = S.dispatch_store(out_dtype, n)
        bn = dispatch_bn(m, n, device, target) if store == "staged" else BN
        pdl, cluster = dispatch_pdl(), dispatch_cluster()
        bm = dispatch_bm(m, n, bn, device, target) if store == "staged" and cluster == 1 else BM
        spec = TwophaseMatmulSpec(fmt.name, out_dtype, epilogue, target, bm=bm,
                                  store=store, bn=bn, pdl=pdl, cluster=cluster)
        return _run(spec, dims, a, b, sfa, sfb, alpha, extra, device)
    return run


def kernel(spec: DequantSpec | TwophaseMatmulSpec) -> Any:
    """The compiled Kernel (every asm stage) of either phase's ``spec``; needs the compiler."""
    return H.compile_spec(spec)


#: (M, N, K) of the GPU tests and the benchmark
GPU_SHAPES = ((8192, 5760, 2944), (777, 2560, 8192), (1000, 1024, 1056), (1024, 5760, 2944))


def bundle_specs(target: str = "sm_90a") -> list[Any]:
    """Both phases for NVFP4 / MXFP4, bf16 / f32 out: 128 x 256 tiles with kstep 64 / 4
    stages and 32 / 9, 192 x 256 tiles with kstep 64 / 4; the 128B-swizzled pair (kstep 64,
    4 stages) for both tile heights; the persistent 128 x 256 kernels; the staged-store
    kernels (kstep 64) at every width of :data:`BNS` (224 / 192 also with 5 stages, bf16),
    192-row at every width of :data:`WAVE_BNS`, and 128B-swizzled at 240, with ``pdl`` at
    256 and 240 (both heights), and in 2-CTA clusters
    (``cluster=2``, also with ``pdl`` for bf16) at 256 and 240 (none off sm_90a). Phase 1 for every tile of :data:`TILES` and
    both layouts, and with ``pdl`` for B at 256 and 240."""
    if target not in TARGETS:
        return []
    specs: list[Any] = [DequantSpec(f, target, t, sw) for f in FORMATS for t in TILES
                        for sw in SWIZZLES]
    specs += [TwophaseMatmulSpec(f, o, None, target, ks) for f in FORMATS
              for o in _matmul.OUT_DTYPES for ks in KSTEPS]
    specs += [TwophaseMatmulSpec(f, o, None, target, 64, None, 192) for f in FORMATS
              for o in _matmul.OUT_DTYPES]
    specs += [TwophaseMatmulSpec(f, o, None, target, 64, None, bm, "128b") for f in FORMATS
              for o in _matmul.OUT_DTYPES for bm in BMS]
    specs += [TwophaseMatmulSpec(f, o, None, target, 64, None, BM, "none", "persistent")
              for f in FORMATS for o in _matmul.OUT_DTYPES]
    specs += [TwophaseMatmulSpec(f, o, None, target, 64, None, BM, store="staged", bn=bn)
              for f in FORMATS for o in _matmul.OUT_DTYPES for bn in BNS]
    specs += [TwophaseMatmulSpec(f, "bfloat16", None, target, 64, None, BM, "none",
                                 "persistent", "staged") for f in FORMATS]
    # 192-row staged tiles (three consumer warpgroups; a third fewer tiles per SM)
    specs += [TwophaseMatmulSpec(f, o, None, target, 64, None, 192, store="staged", bn=bn)
              for f in FORMATS for o in _matmul.OUT_DTYPES for bn in WAVE_BNS]
    specs += [TwophaseMatmulSpec(f, o, None, target, 64, None, BM, "128b", store="staged",
                                 bn=240) for f in FORMATS for o in _matmul.OUT_DTYPES]
    # 5-stage rings at the widths where 5 fit (the default is 4 there; bench_matmul: what
    # the divisions by 5 cost)
    specs += [TwophaseMatmulSpec(f, "bfloat16", None, target, 64, 5, BM, store="staged", bn=bn)
              for f in FORMATS for bn in (224, 192)]
    # programmatic dependent launch: B's phase 1 (triggers) and the staged phase 2 (waits)
    specs += [DequantSpec(f, target, bn, "none", True) for f in FORMATS for bn in WAVE_BNS[:2]]
    specs += [TwophaseMatmulSpec(f, o, None, target, 64, None, bm, store="staged", bn=bn,
                                 pdl=True)
              for f in FORMATS for o in _matmul.OUT_DTYPES for bn in WAVE_BNS[:2]
              for bm in WAVE_BMS]
    # 2-CTA clusters sharing B (multicast), staged, at 256 / 240; with pdl for bf16
    specs += [TwophaseMatmulSpec(f, o, None, target, 64, None, BM, store="staged", bn=bn,
                                 cluster=2)
              for f in FORMATS for o in _matmul.OUT_DTYPES for bn in WAVE_BNS[:2]]
    specs += [TwophaseMatmulSpec(f, "bfloat16", None, target, 64, None, BM, store="staged",
                                 bn=bn, pdl=True, cluster=2)
              for f in FORMATS for bn in WAVE_BNS[:2]]
    return sorted(specs, key=lambda s: s.kernel_name)


H.register_before(_matmul.FAST_PATHS, fast_path, "blockscale.ops.matmul_wgmma")
_core.attach_kernel_api((block_scaled_matmul_twophase,), kernel, build)
_core.register_op_module(__name__)

__all__ = [
    "DequantSpec",
    "TwophaseMatmulSpec",
    "block_scaled_matmul_twophase",
    "build",
    "bundle_specs",
    "dequantize_operands",
    "fast_path",
    "grid",
    "kernel",
    "matmul_workspaces",
    "phase1_operands",
    "workspace_bytes",
]

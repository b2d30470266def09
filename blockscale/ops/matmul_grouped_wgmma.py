"""sm_90a grouped (MoE) block-scaled matmul on warpgroup MMAs (``wgmma``): NVFP4, MXFP4.

Same contract as :func:`blockscale.ops.matmul_grouped.grouped_matmul_block_scaled`
(SEMANTICS §5, D8, D10): 5-D A scales with per-group padded tiles (``a_scale_offsets``), 6-D
B scales, ``C = bf16(acc * expert_scales[e] (* a_row_scales[m]))`` in fp32, in that order.

Kernel (:mod:`blockscale.ops._grouped_wgmma_ir`): the dense wgmma mainloop of
:mod:`blockscale.ops._wgmma_ir` (same dequantization / scale-folding variants, tiles and
3-stage shared ring) run over (group, row tile, column tile) work items: CTA ``(x, y)``
computes columns ``[x bn, (x+1) bn)`` of the y-th row tile, row tiles numbered group after
group (``ceil(n_g / bm)`` for group g, none for empty groups; a CTA-uniform scan of
``expert_start``). ``grid.y = ceil(T / bm) + G`` bounds the row tiles; CTAs past the last
exit. A tile of a group with expert id -1 writes zeros (D8) without the mainloop, as the
mma.sync grouped kernel (:mod:`blockscale.ops.matmul_grouped_sm90`).

Numerics: as the dense wgmma kernel (one fp32 accumulation per NVFP4 block; MXFP4 "fold" up
to two per 32-block), then the exact power-of-two fix of the variant, the expert scale and
the row scale: within the stated fp32 bound (with MXFP4 "fold": J more roundings), but on
the H200 not bit-identical to the portable kernel (HGMMA rounds its fp32 accumulation
differently from the interpreter's model).

Performance model (not yet measured on the GPU): a work item costs about what a dense
128 x 256 tile of the same K costs (the mainloop's SASS loop: 460 instructions per k64 step
vs the dense kernel's 496; the scan is G/32 iterations), i.e. 0.914 ms / (64 x 22.5) tiles
at K=2944 on the H200 (the dense NVFP4 run). Rows of a group's last tile are padding: at
uniform top-4 routing of gpt-oss-120b (E=128, N=5760, K=2880) T=4096 gives 188 row tiles
for 16384 rows (68% used) -> ~2.6 ms NVFP4; T=1024 gives 128 tiles of ~32 rows -> ~1.8 ms
(the kernel then dequantizes every expert's weights once: the FP4 -> bf16 dequantization
rate, not the tensor cores, bounds it).

Dispatch: registered in :data:`blockscale.ops.matmul_grouped.FAST_PATHS` before the mma.sync
grouped kernel, for NVFP4 / MXFP4, K % 32 == 0 and at least :data:`MIN_ROWS` routed rows
(prefill; the decode and mma.sync kernels keep the rest); ``BLOCKSCALE_SM90_GROUPED_WGMMA=0``
turns it off. :func:`blockscale.ops.matmul_swiglu.chained_mainloop` reports it as "wgmma"
and the fused SwiGLU op then runs this kernel with its σ output store
(:attr:`GroupedWgmmaSpec.sigma_out`) followed by ``fused_silu_quantize``, so fused ==
chained still holds byte for byte. For :data:`PDQ_FORMATS` (NVFP4, MXFP4; and MXFP8, which
this kernel does not run) the dispatch runs
the grouped producer-dequant kernel (:mod:`blockscale.ops.matmul_grouped_pdq`) instead (and
the fused op its σ store): the same bf16 operands and HGMMA k16 order as this kernel's lut /
k64 / fold variant, byte-equal to it on the H200; ``BLOCKSCALE_SM90_GROUPED_PDQ=0`` brings
this kernel back. Importing this module does not import MLIR.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, ClassVar

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.ops import matmul_grouped as _grouped
from blockscale.ops import matmul_grouped_sm90 as _mma_grouped
from blockscale.ops import matmul_wgmma as _dense

#: modules whose source shapes the kernel (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._grouped_wgmma_ir", "blockscale.ops._wgmma_ir",
                  "blockscale.ops._mma_ir", "blockscale.ops._matmul_ir",
                  "blockscale.ops.matmul_sm90", "blockscale.ops.matmul_grouped",
                  "blockscale.ops.matmul_grouped_sm90")
TARGETS = ("sm_90a",)
#: formats of this kernel (MXFP8 prefill: only through the grouped producer-dequant kernel,
#: :data:`PDQ_FORMATS`; with BLOCKSCALE_SM90_GROUPED_PDQ=0 it stays on mma.sync)
FORMATS = ("nvfp4", "mxfp4")
#: CTA tiles (bm, bn): the dense kernel's 128-row ones, and 64 x 256 (one warpgroup, for
#: groups of <= 64 rows: a third less dequantization per tile than 128 x 256; not dispatched
#: until measured, see benchmarks/bench_grouped_wgmma.py)
TILE_CHOICES = ((128, 128), (128, 256), (64, 256))
#: the dispatch takes T >= MIN_ROWS routed rows (prefill); fewer: decode / mma.sync kernels
MIN_ROWS = 1024
#: formats whose dispatch runs the grouped producer-dequant kernel instead (its output is this
#: kernel's lut / k64 / fold output byte for byte, on the H200 too, so the fused SwiGLU op,
#: which runs this kernel with the σ store, still equals the chained path). Measured on the
#: H200 (run P, 2026-11-30, gpt-oss-120b gate_up, prefetch on): MXFP4 T=1024 1.376 vs 1.866
#: ms, T=4096 2.129 vs 2.809 ms; run Q, with the staged epilogue (N % 8 == 0): 1.335 / 1.915
#: ms. NVFP4: staged pdq 1.655 / 2.370 vs this kernel's "shift" default 1.632 / 2.566, but pdq
#: equals the "lut" variant, so the fused SwiGLU op runs the grouped pdq kernel too, with its σ
#: store (matmul_grouped_pdq.dispatch_spec): switched (issue #10). MXFP8 (exact bf16 operands
#: in a scale window, flag + fixup kernels: matmul_grouped_pdq_mx8) instead of the mma.sync
#: grouped kernel: H200 numbers in benchmarks/RESULTS.md (run DW)
PDQ_FORMATS = ("mxfp4", "nvfp4", "mxfp8")
#: BLOCKSCALE_SM90_GROUPED_PDQ=0: the dispatch (and the fused SwiGLU op) run this kernel's
#: default variant for every format instead of the producer-dequant kernel
PDQ_ENV_SWITCH = "BLOCKSCALE_SM90_GROUPED_PDQ"
#: the dispatch uses 128 x 256 tiles when at least this many CTAs result (else 128 x 128)
WIDE_TILE_MIN_CTAS = 4 * 132
#: BLOCKSCALE_SM90_GROUPED_WGMMA=0 turns the fast path off (on by default)
ENV_SWITCH = "BLOCKSCALE_SM90_GROUPED_WGMMA"


@dataclasses.dataclass(frozen=True)
class GroupedWgmmaSpec(FormatSpec):
    """What one sm_90a grouped wgmma kernel is specialised on (bf16 output).

    Attributes:
        fmt: "nvfp4" | "mxfp4".
        row_scales: whether the kernel reads ``a_row_scales`` (bf16 ``[T]``, NVFP4).
        bm, bn: the CTA tile (:data:`TILE_CHOICES`).
        target: "sm_90a".
        dequant, kstep, scaling, pipeline: the mainloop variant, as
            :class:`blockscale.ops.matmul_wgmma.WgmmaMatmulSpec` (None: the format's default).
        sigma_out: store output column n (a σ-permuted gate/up weight row: 2i gate i,
            2i + 1 up i) at column ``(n % 2) N/2 + n // 2`` (the un-permuted layout); the
            fused SwiGLU op's chained path (:mod:`blockscale.ops.matmul_swiglu`).
    """

    fmt: str
    row_scales: bool = False
    bm: int = 128
    bn: int = 128
    target: str = "sm_90a"
    dequant: str | None = None
    kstep: int | None = None
    scaling: str | None = None
    pipeline: str = "early"
    sigma_out: bool = False

    op: ClassVar[str] = "grouped_matmul_block_scaled_wgmma"
    out_dtype: ClassVar[str] = "bfloat16"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Format.from_name(self.fmt).name)
        H.check_choice(self.fmt, FORMATS, "fmt")
        for name in ("row_scales", "sigma_out"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got "
                                f"{type(getattr(self, name)).__name__}")
        if self.row_scales and self.fmt != "nvfp4":
            raise ValueError(f"row_scales is NVFP4 only, got fmt={self.fmt}")
        if (self.bm, self.bn) not in TILE_CHOICES:
            raise ValueError(f"(bm, bn) must be one of {list(TILE_CHOICES)}, got "
                             f"{(self.bm, self.bn)}")
        dense = self.dense  # validates target and variant; resolves the variant's defaults
        for f in ("target", "dequant", "kstep", "scaling"):
            object.__setattr__(self, f, getattr(dense, f))

    @property
    def dense(self) -> _dense.WgmmaMatmulSpec:
        """The dense spec of the same mainloop variant (with 128 rows: the dense kernel has
        no 64 x 256 tile; the variant's choice does not depend on bm)."""
        return _dense.WgmmaMatmulSpec(self.fmt, "bfloat16", None, 128, self.bn, self.target,
                                      self.dequant, self.kstep, self.scaling, self.pipeline)

    @property
    def shared_bytes(self) -> int:
        """The 3 stages of bf16 operands (+ the f32 scales of "promote", or the bf16 scale
        table of "fold"), as ``_wgmma_ir.Tiles.shared_bytes``."""
        promote = self.scaling == "promote"
        per_row = 2 * self.kstep + (4 if promote else 0)  # type: ignore[operator]
        return 3 * (self.bm + self.bn) * per_row + (0 if promote else 512)

    @property
    def dynamic_shared_bytes(self) -> int:
        return self.shared_bytes if self.shared_bytes > 48 * 1024 else 0

    @property
    def block(self) -> tuple[int, int, int]:  # type: ignore[override]
        """The ``bm / 64`` warpgroups."""
        return (2 * self.bm, 1, 1)

    @property
    def kernel_name(self) -> str:
        rs = "_rowsc" if self.row_scales else ""
        sg = "_sigma" if self.sigma_out else ""
        pl = "" if self.pipeline == "early" else f"_{self.pipeline}"
        return (f"bs_grouped_matmul_wgmma_{self.fmt}_{self.bm}x{self.bn}_{self.dequant}_"
                f"{self.scaling}_k{self.kstep}{pl}{rs}{sg}")

    def args(self) -> tuple[KernelArg, ...]:
        """The portable grouped kernel's parameters (5-D scales, bf16 output)."""
        return _grouped.GroupedMatmulSpec(self.fmt, "tcgen5d", "bfloat16", self.row_scales,
                                          self.target).args()


def grid(spec: GroupedWgmmaSpec, t: int, n: int, num_groups: int) -> tuple[int, int, int]:
    """Launch grid: column tiles x an upper bound of the (group, row tile) work items."""
    return (max(1, -(-n // spec.bn)), -(-t // spec.bm) + num_groups, 1)


def build(spec: GroupedWgmmaSpec) -> Any:
    """The ``mlir.ir.Module`` of the kernel for ``spec`` (IR only)."""
    from blockscale.ops import _grouped_wgmma_ir

    return _grouped_wgmma_ir.build(spec)


# ---- host side -------------------------------------------------------------------------------


def enabled() -> bool:
    """False when BLOCKSCALE_SM90_GROUPED_WGMMA=0 (the mma.sync grouped kernel then runs)."""
    return os.environ.get(ENV_SWITCH, "1") not in ("0", "false", "off")


def uses_pdq(fmt: Format) -> bool:
    """Whether the fast path runs the grouped producer-dequant kernel for ``fmt``
    (:data:`PDQ_FORMATS`, unless :data:`PDQ_ENV_SWITCH` is 0)."""
    off = os.environ.get(PDQ_ENV_SWITCH, "1") in ("0", "false", "off")
    return fmt.name in PDQ_FORMATS and not off


def choose_tiles(t: int, n: int, num_groups: int) -> tuple[int, int]:
    """128 x 256 when the upper bound of the CTA count is large, else 128 x 128."""
    ctas = (-(-t // 128) + num_groups) * -(-n // 256)
    return (128, 256) if n >= 256 and ctas >= WIDE_TILE_MIN_CTAS else (128, 128)


def spec_for(fmt: Format, t: int, n: int, num_groups: int, row_scales: bool = False,
             target: str = "sm_90a", sigma_out: bool = False) -> GroupedWgmmaSpec:
    """The spec the fast path uses (the format's :data:`blockscale.ops.matmul_wgmma.DEFAULTS`
    variant)."""
    bm, bn = choose_tiles(t, n, num_groups)
    return GroupedWgmmaSpec(fmt.name, row_scales, bm, bn, target, sigma_out=sigma_out)


def applies(target: str, fmt: Format, t: int, n: int, k: int) -> bool:
    """Whether the dispatch sends these operands to this kernel (see the module docstring)."""
    ours = fmt.name in FORMATS or (fmt.name == "mxfp8" and uses_pdq(fmt))
    return (target in TARGETS and enabled() and ours and k % 32 == 0
            and t >= MIN_ROWS and n > 0)


def launch(spec: GroupedWgmmaSpec, t: int, n: int, num_groups: int, buffers: dict[str, Any],
           scalars: dict[str, Any], device: Any) -> Any:
    """Run ``spec`` on the grouped op's (checked) buffers; bf16 ``[T, N]``."""
    return H.launch(spec, grid(spec, t, n, num_groups), (t, n), "bfloat16", buffers, scalars,
                    device, empty=t == 0 or n == 0)


def fast_path(target: str, fmt: Format, t: int, n: int, k: int, num_groups: int,
              row_scales: bool) -> Callable[..., Any] | None:
    """The :data:`blockscale.ops.matmul_grouped.FAST_PATHS` hook: a runner
    ``(buffers, scalars, device) -> C`` when :func:`applies`, else None."""
    if not applies(target, fmt, t, n, k):
        return None
    if uses_pdq(fmt):  # the lut variant's bytes, sooner: the producer-dequant kernel
        from blockscale.ops import matmul_grouped_pdq as GP

        def run_pdq(buffers: dict[str, Any], scalars: dict[str, Any], device: Any) -> Any:
            pdq = GP.dispatch_plan(fmt, n, row_scales, target, device,
                                   rows_per_group=t / max(num_groups, 1))
            return GP.launch(pdq, t, n, num_groups, buffers, scalars, device)
        return run_pdq
    spec = spec_for(fmt, t, n, num_groups, row_scales, target)

    def run(buffers: dict[str, Any], scalars: dict[str, Any], device: Any) -> Any:
        return launch(spec, t, n, num_groups, buffers, scalars, device)
    return run


def grouped_matmul_block_scaled_wgmma(hidden: Any, weight: Any, a_scales: Any, b_scales: Any,
                                      expert_start: Any, a_scale_offsets: Any,
                                      expert_ids: Any, expert_scales: Any, fmt: Format | str,
                                      *, k: int | None = None, a_row_scales: Any = None,
                                      tiles: tuple[int, int] | None = None,
                                      dequant: str | None = None, kstep: int | None = None,
                                      scaling: str | None = None, pipeline: str = "early",
                                      sigma_out: bool = False, device: Any = None) -> Any:
    """The kernel called directly (no dispatch, no env switch), e.g. by tests, benchmarks and
    the fused SwiGLU op. Arguments as
    :func:`blockscale.ops.matmul_grouped.grouped_matmul_block_scaled` plus the tile, the
    mainloop variant (:class:`GroupedWgmmaSpec`) and ``sigma_out``. Raises ValueError for
    K % 32 != 0, a format other than NVFP4 / MXFP4, or an odd N with ``sigma_out``."""
    fmt = Format.from_name(fmt)
    H.check_choice(fmt.name, FORMATS, "fmt")
    t, n, k, g_count, buffers = _grouped.tiled_grouped_operands(
        hidden, weight, a_scales, b_scales, expert_start, a_scale_offsets, expert_ids,
        expert_scales, fmt, k, a_row_scales, "sm_90a grouped wgmma kernel")
    if sigma_out and n % 2:
        raise ValueError(f"sigma_out takes an even weight.shape[1] (gate/up rows), got {n}")
    dev, tgt = H.device_and_target(device, "sm_90a")
    bm, bn = tiles if tiles is not None else choose_tiles(t, n, g_count)
    spec = GroupedWgmmaSpec(fmt.name, a_row_scales is not None, bm, bn, tgt, dequant, kstep,
                            scaling, pipeline, sigma_out)
    return launch(spec, t, n, g_count, buffers,
                  {"t": t, "n": n, "k": k, "num_groups": g_count}, dev)


def kernel(spec: GroupedWgmmaSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


#: (T routed rows, N, G) of the GPU tests and tools/bundle.py: gpt-oss-120b gate_up (E=128,
#: top-4, N=5760) at T = 1024 / 4096 tokens, DeepSeek-V3 (E=256, top-8, N=4096) at 128 / 1024 /
#: 4096, the GPU test's cases (N=2048, 4 groups; 7168 x 6 groups) and the fused SwiGLU GPU
#: test's (N=4096 / 2048, 3-4 groups)
GPU_SHAPES = ((4096, 5760, 128), (16384, 5760, 128), (1024, 4096, 256), (8192, 4096, 256),
              (32768, 4096, 256),
              (1920, 2048, 4), (1024, 7168, 6), (1920, 4096, 4), (1920, 2048, 4))


def bundle_specs(target: str = "sm_90a") -> list[GroupedWgmmaSpec]:
    """The dispatch's specs for :data:`GPU_SHAPES` (row scales on / off for NVFP4, σ output
    for the fused SwiGLU op), plus both tiles of the default variants (GPU test)."""
    if target not in TARGETS:
        return []
    specs = set()
    for f in FORMATS:
        for t, n, g in GPU_SHAPES:
            for rs in ((False, True) if f == "nvfp4" else (False,)):
                for sg in (False, True):
                    specs.add(spec_for(Format.from_name(f), t, n, g, rs, target, sg))
        for tile in TILE_CHOICES:  # the GPU test runs NVFP4 with a_row_scales on every tile
            for rs in ((False, True) if f == "nvfp4" else (False,)):
                specs.add(GroupedWgmmaSpec(f, rs, *tile, target))
    return sorted(specs, key=lambda s: s.kernel_name)


def _register() -> None:
    """Put :func:`fast_path` just before the mma.sync grouped kernel's entry."""
    H.register_before(_grouped.FAST_PATHS, fast_path, _mma_grouped.__name__)


_register()
_core.attach_kernel_api((grouped_matmul_block_scaled_wgmma,), kernel, build)
_core.register_op_module(__name__)

__all__ = [
    "GroupedWgmmaSpec",
    "build",
    "bundle_specs",
    "fast_path",
    "grid",
    "grouped_matmul_block_scaled_wgmma",
    "kernel",
    "spec_for",
]

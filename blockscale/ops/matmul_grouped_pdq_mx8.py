"""The grouped sm_90a MXFP8 prefill (issue #10): the grouped producer-dequant kernel on exact
bf16 operands, with the rows it cannot hold exactly recomputed.

MXFP8 operands dequantize to ``e4m3 * 2^(b - 127)``; inside the window of
:mod:`blockscale.ops._mx8_window_ir` (block exponents in [-54, 43]) that is an exact bf16
whose products and K sums are exact fp32 operations of the bf16 wgmma, so
:mod:`blockscale.ops.matmul_grouped_pdq` runs MXFP8 as it runs MXFP4: the grouped phase 1
dequantizes A into its bf16 workspace (:mod:`blockscale.ops.matmul_grouped_p1`, fmt
"mxfp8"), the producer warpgroup B's 64-byte E4M3 rows a step. Around it
(:func:`launch`):

1. the flag kernel (:class:`FlagSpec`, :func:`blockscale.ops._grouped_mx8_ir.emit_flags`):
   per row of A and of B, whether a block outside the window holds a nonzero element;
2. phase 1 and the main kernel (every output; flagged rows' values are not used);
3. the fixup (:class:`FixupSpec`): the flagged rows' outputs (A: rows of C, B: the columns
   of its expert's groups) recomputed in place by the portable grouped kernel's K loop and
   epilogue: bit-identical to it there. It exits after one load and a warp OR per 256 flags
   when none is set (quantizer outputs: a block's scale sits within 8 binades of its
   amax, so only rows mixing blocks 2^54 apart are flagged).

Numerics elsewhere: the bf16 wgmma's fp32 sum of the exact products (the dense MXFP8 fast
path's bound, SEMANTICS §4), times ``expert_scales[e]``, bf16. Scale 0xFF: NaN outputs in the
row (column), as the reference. Importing this module does not import MLIR.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import FormatSpec
from blockscale.launch import KernelArg

#: modules whose source shapes the kernels (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._grouped_mx8_ir", "blockscale.ops._mx8_window_ir",
                  "blockscale.ops._twophase_mx8_ir", "blockscale.ops._matmul_ir")
TARGETS = ("sm_90a",)
#: threads per CTA of both kernels; CTAs (grid.y) sharing a flagged row's outputs
THREADS, FIXUP_SPLIT = 256, 8
#: threads of the flag kernel per row of A (= _grouped_mx8_ir.FLAG_LANES)
FLAG_LANES = 8


def _operand_args() -> list[KernelArg]:
    return [KernelArg("a", "buffer", "float8_e4m3fn"), KernelArg("w", "buffer", "float8_e4m3fn"),
            KernelArg("sfa", "buffer", "float8_e8m0fnu"),
            KernelArg("sfb", "buffer", "float8_e8m0fnu"),
            KernelArg("expert_start", "buffer", "int32"),
            KernelArg("a_scale_offsets", "buffer", "int32"),
            KernelArg("expert_ids", "buffer", "int32")]


_SCALARS = tuple(KernelArg(x, "scalar", "i32") for x in ("t", "n", "k", "num_groups",
                                                          "num_experts"))


@dataclasses.dataclass(frozen=True)
class FlagSpec(FormatSpec):
    """The flag kernel: ``flags[r]`` for the T rows of A, then the E N rows of B."""

    fmt: str = "mxfp8"
    target: str = "sm_90a"

    op: ClassVar[str] = "grouped_matmul_mx8_flags"
    block: ClassVar[tuple[int, int, int]] = (THREADS, 1, 1)

    def __post_init__(self) -> None:
        H.check_choice(self.fmt, ("mxfp8",), "fmt")
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, TARGETS, "target")

    @property
    def kernel_name(self) -> str:
        return "bs_grouped_mx8_flags"

    def args(self) -> tuple[KernelArg, ...]:
        """a, w, sfa, sfb, expert_start, a_scale_offsets, expert_ids, flags (i32 out), t, n,
        k, num_groups, num_experts."""
        return (*_operand_args(), KernelArg("flags", "buffer", "int32", "out"), *_SCALARS)


@dataclasses.dataclass(frozen=True)
class FixupSpec(FormatSpec):
    """The in-place recomputation of the flagged rows' outputs (``sigma_out``: the σ
    store of the fused SwiGLU op's chained path)."""

    fmt: str = "mxfp8"
    target: str = "sm_90a"
    sigma_out: bool = False

    op: ClassVar[str] = "grouped_matmul_mx8_fixup"
    block: ClassVar[tuple[int, int, int]] = (THREADS, 1, 1)

    def __post_init__(self) -> None:
        H.check_choice(self.fmt, ("mxfp8",), "fmt")
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, TARGETS, "target")
        if not isinstance(self.sigma_out, bool):
            raise TypeError(f"sigma_out must be a bool, got {type(self.sigma_out).__name__}")

    @property
    def kernel_name(self) -> str:
        return "bs_grouped_mx8_fixup" + ("_sigma" if self.sigma_out else "")

    def args(self) -> tuple[KernelArg, ...]:
        """a, w, sfa, sfb, expert_start, a_scale_offsets, expert_ids, expert_scales, flags,
        c (bf16 in/out), t, n, k, num_groups, num_experts."""
        return (*_operand_args(), KernelArg("expert_scales", "buffer", "float32"),
                KernelArg("flags", "buffer", "int32"),
                KernelArg("c", "buffer", "bfloat16", "inout"), *_SCALARS)


def build(spec: FlagSpec | FixupSpec) -> Any:
    """The ``mlir.ir.Module`` of ``spec``'s kernel (IR only)."""
    import blockscale.ops._grouped_mx8_ir as GX
    import blockscale.ops._twophase_mx8_ir as MX
    from blockscale.compiler import ir as bir

    if (GX.THREADS, MX.FIXUP_SPLIT, GX.FLAG_LANES) != (THREADS, FIXUP_SPLIT, FLAG_LANES):
        raise AssertionError("matmul_grouped_pdq_mx8's constants disagree with the IR's")
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        if isinstance(spec, FlagSpec):
            GX.emit_flags(kb)
        else:
            GX.emit_fixup(kb, spec.sigma_out)
    return kb.module


def kernel(spec: FlagSpec | FixupSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


def _rows_grid(rows: int, split: int = 1) -> tuple[int, int, int]:
    return (max(1, -(-rows // THREADS)), split, 1)


def flags(buffers: dict[str, Any], t: int, n: int, k: int, num_groups: int, num_experts: int,
          target: str, device: Any) -> Any:
    """The flags (int32 ``[T + E N]``) of the grouped op's device buffers."""
    ins = {x: buffers[x] for x in ("a", "w", "sfa", "sfb", "expert_start", "a_scale_offsets",
                                   "expert_ids")}
    rows = t + num_experts * n
    # A: FLAG_LANES a row in whole warps, B: four rows each (_grouped_mx8_ir)
    threads = -(-FLAG_LANES * t // 32) * 32 + num_experts * -(-n // 128) * 32
    _, out = _core.launch_op(FlagSpec("mxfp8", target), _rows_grid(threads),
                             (("flags", (rows,), np.dtype(np.int32)),), ins,
                             _scalars(t, n, k, num_groups, num_experts), device)
    return out["flags"]


def _scalars(t: int, n: int, k: int, num_groups: int, num_experts: int) -> dict[str, int]:
    return {"t": t, "n": n, "k": k, "num_groups": num_groups, "num_experts": num_experts}


def fixup(c: Any, flag_rows: Any, buffers: dict[str, Any], t: int, n: int, k: int,
          num_groups: int, num_experts: int, sigma_out: bool, target: str,
          device: Any) -> None:
    """Recompute the flagged rows' outputs in ``c`` (a device array, written in place); the
    other ``buffers`` as the grouped op passes them (numpy or device memory:
    :func:`blockscale.ops._matmul_host.launch_inplace`)."""
    bufs = {x: buffers[x] for x in ("a", "w", "sfa", "sfb", "expert_start", "a_scale_offsets",
                                    "expert_ids", "expert_scales")}
    H.launch_inplace(FixupSpec("mxfp8", target, sigma_out),
                     _rows_grid(t + num_experts * n, FIXUP_SPLIT),
                     {**bufs, "flags": flag_rows, "c": c},
                     _scalars(t, n, k, num_groups, num_experts), device)


def bundle_specs(target: str = "sm_90a") -> list[Any]:
    """The flag kernel and both fixups; none off sm_90a."""
    if target not in TARGETS:
        return []
    return [FlagSpec("mxfp8", target), FixupSpec("mxfp8", target),
            FixupSpec("mxfp8", target, True)]


_core.register_op_module(__name__)

__all__ = [
    "FixupSpec",
    "FlagSpec",
    "build",
    "bundle_specs",
    "fixup",
    "flags",
    "kernel",
]

"""AMD matrix-core block-scaled matmul: gfx950 (CDNA4) scaled MFMA, gfx942 (CDNA3) bf16 MFMA.

Same contract as :func:`blockscale.ops.matmul.block_scaled_matmul` (SEMANTICS §4.1): fp32
accumulation, ``alpha`` on the fp32 accumulator, bf16 (RNE) or f32 output, an optional fused
:class:`~blockscale.ops.matmul_epilogue.Epilogue`; 5-D scales, or row-major ``[rows, K/32]``
E8M0 scales for :func:`blockscale.ops.matmul.matmul_dynamic_block_scaled_mxfp4` (SEMANTICS
§4.5). Any M, N and K the portable kernel takes (tails included); every output is written.

Instruction per (target, format) — the ``path`` of :class:`MfmaMatmulSpec`:

* gfx950, MXFP4 / MXFP8: ``v_mfma_scale_f32_16x16x128_f8f6f4``, FP4 / FP8 operands and the
  E8M0 block scales as its scale operands ("scaled");
* gfx950 NVFP4 and gfx942 (every format): in-register dequantization to bf16 and
  ``v_mfma_f32_16x16x16_bf16`` per scale block, block scales applied in fp32 ("bf16").
  NVFP4 cannot use the scale operands: they are E8M0 over 32 elements, NVFP4's are E4M3 over
  16 (folding an E4M3 scale into FP4 or FP8 elements is not exact). The bf16 path is exact
  per block, so its FP4 results equal the portable kernel's bit for bit.

Kernel structure and numerics: :mod:`blockscale.ops._mfma_ir`. These targets are compile
only (no AMD GPU here): the kernels are lowered to hsaco by llc/ld.lld and run by the numpy
interpreter, whose MFMA models are in ``runtime/interpreter/ops_mfma.py``. Importing this
module does not import MLIR.
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
from blockscale.ops.matmul_epilogue import Epilogue

#: modules whose source shapes the kernel (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._mfma_ir", "blockscale.ops._matmul_ir",
                  "blockscale.ops.matmul_epilogue")
TARGETS = ("gfx942", "gfx950")
THREADS = 256
TILE = (64, 64)  # (bm, bn): 2 x 2 wavefronts of 2 x 2 16x16 subtiles (_mfma_ir)
#: BLOCKSCALE_AMD_MFMA=0 disables the MFMA path (the portable kernel runs instead)
ENV_SWITCH = "BLOCKSCALE_AMD_MFMA"


def path_for(target: str, fmt: Format) -> str:
    """"scaled" (gfx950 MX formats: scaled MFMA) or "bf16" (dequantize + bf16 MFMA)."""
    return "scaled" if target == "gfx950" and fmt.is_mx else "bf16"


def aligned_k(fmt: Format, k: int) -> bool:
    """Whether K is a multiple of the block size: every lane's chunk of a row is then all
    inside or all past K, read with one wide load (else byte loads)."""
    return k % fmt.block_size == 0


@dataclasses.dataclass(frozen=True)
class MfmaMatmulSpec(FormatSpec):
    """What one AMD MFMA dense matmul kernel is specialised on.

    Attributes:
        fmt: "nvfp4" | "mxfp4" | "mxfp8".
        out_dtype: "bfloat16" | "float32".
        scale_layout: "tcgen5d" or "row_major".
        epilogue: an optional fused :class:`Epilogue`.
        aligned: K is a multiple of the block size (:func:`aligned_k`).
        target: "gfx942" | "gfx950".
    """

    fmt: str
    out_dtype: str = "bfloat16"
    scale_layout: str = "tcgen5d"
    epilogue: Epilogue | None = None
    aligned: bool = True
    target: str = "gfx950"

    op: ClassVar[str] = "block_scaled_matmul_mfma"
    block: ClassVar[tuple[int, int, int]] = (THREADS, 1, 1)

    def __post_init__(self) -> None:
        _matmul.check_spec_fields(self, scale_layout=True)
        if not isinstance(self.aligned, bool):
            raise TypeError(f"aligned must be a bool, got {type(self.aligned).__name__}")
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, TARGETS, "target")

    @property
    def path(self) -> str:
        return path_for(self.target, self.format)

    @property
    def kernel_name(self) -> str:
        ep = f"_ep{self.epilogue.key[:10]}" if self.epilogue else ""
        lay = "5d" if self.scale_layout == "tcgen5d" else "rm"
        al = "" if self.aligned else "_tail"
        return (f"bs_matmul_mfma_{self.path}_{self.fmt}_{lay}_{H.out_tag(self.out_dtype)}"
                f"{al}{ep}")

    def args(self) -> tuple[KernelArg, ...]:
        """The portable kernel's parameters: a, b, sfa, sfb, c, epilogue inputs, m, n, k,
        alpha."""
        return _matmul.MatmulSpec(self.fmt, self.out_dtype, self.scale_layout, self.epilogue,
                                  self.target).args()


def grid(m: int, n: int) -> tuple[int, int, int]:
    """Launch grid: one block of 256 threads per 64 x 64 tile of C."""
    return (max(1, -(-n // TILE[1])), max(1, -(-m // TILE[0])), 1)


def build(spec: MfmaMatmulSpec) -> Any:
    """The ``mlir.ir.Module`` of the kernel for ``spec`` (IR only)."""
    from mlir.dialects import arith

    import blockscale.ops._matmul_ir as mir
    import blockscale.ops._mfma_ir as X
    from blockscale.compiler import ir as bir
    from blockscale.ops.matmul_epilogue import EpilogueContext

    fmt = spec.format
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        m_count, n_count, k = (bir.as_index(kb.arg(x)) for x in ("m", "n", "k"))
        m0 = bir.mul(bir.block_idx("y"), TILE[0])
        n0 = bir.mul(bir.block_idx("x"), TILE[1])
        kblocks = bir.ceil_div(k, fmt.block_size)
        lane = X.Lane.of()
        if spec.scale_layout == "tcgen5d":
            d1 = bir.ceil_div(kblocks, 4)

            def offset(row: Any, j: Any) -> Any:
                return bir.add(mir.tcgen_row_offset(row, d1), mir.tcgen_kblock_offset(j))
        else:
            def offset(row: Any, j: Any) -> Any:
                return bir.add(bir.mul(row, kblocks), j)
        a = X.Operand(kb.arg("a"), kb.arg("sfa"), bir.add(m0, lane.wm), m_count, offset)
        b = X.Operand(kb.arg("b"), kb.arg("sfb"), bir.add(n0, lane.wn), n_count, offset)
        acc = X.emit_mainloop(spec.path, spec.target, fmt, a, b, lane, k, spec.aligned)
        out_type = bir.bf16() if spec.out_dtype == "bfloat16" else bir.f32()
        ep = spec.epilogue
        buffers = {i.name: (i, kb.arg(i.name)) for i in ep.inputs} if ep else {}

        def value(v: Any, m: Any, n: Any) -> Any:
            v = arith.mulf(v, kb.arg("alpha"))
            return ep.fn(v, EpilogueContext(m, n, n_count, out_type, buffers)) if ep else v

        X.store_acc(kb.arg("c"), spec.out_dtype, acc, lane, m0, n0, m_count, n_count, value)
    return kb.module


# ---- host side -------------------------------------------------------------------------------


def enabled() -> bool:
    """False when BLOCKSCALE_AMD_MFMA=0."""
    return os.environ.get(ENV_SWITCH, "1") not in ("0", "false", "off")


def spec_for(target: str, fmt: Format, k: int, out_dtype: str = "bfloat16",
             epilogue: Epilogue | None = None, scale_layout: str = "tcgen5d"
             ) -> MfmaMatmulSpec:
    """The spec the dispatch uses for a problem."""
    return MfmaMatmulSpec(fmt.name, out_dtype, scale_layout, epilogue, aligned_k(fmt, k),
                          target)


def fast_path(target: str, fmt: Format, m: int, n: int, k: int, out_dtype: str,
              epilogue: Epilogue | None, scale_layout: str = "tcgen5d"
              ) -> Callable[..., Any] | None:
    """The :data:`blockscale.ops.matmul.FAST_PATHS` hook (5-D scales) and the row-major hook
    (``scale_layout="row_major"``): a runner on gfx942 / gfx950, else None."""
    if target not in TARGETS or not enabled() or m == 0 or n == 0:
        return None
    spec = spec_for(target, fmt, k, out_dtype, epilogue, scale_layout)
    return _matmul.dense_runner(spec, fmt, m, n, k, grid(m, n))


def row_major_path(target: str, fmt: Format, m: int, n: int, k: int, out_dtype: str,
                   epilogue: Epilogue | None) -> Callable[..., Any] | None:
    """:data:`blockscale.ops.matmul.ROW_MAJOR_PATHS` hook (row-major E8M0 scales)."""
    return fast_path(target, fmt, m, n, k, out_dtype, epilogue, "row_major")


def block_scaled_matmul_mfma(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *,
                             k: int | None = None, alpha: float = 1.0,
                             out_dtype: str = "bfloat16", epilogue: Epilogue | None = None,
                             epilogue_inputs: dict[str, Any] | None = None,
                             scale_layout: str = "tcgen5d", target: str = "gfx950",
                             device: Any = None) -> Any:
    """The MFMA kernel called directly (no dispatch), e.g. by tests: same arguments as
    :func:`blockscale.ops.matmul.block_scaled_matmul_with_epilogue` plus ``scale_layout``
    ("tcgen5d" or "row_major" ``[rows, kblocks]``) and ``target`` ("gfx942" | "gfx950")."""
    fmt = Format.from_name(fmt)
    H.check_choice(scale_layout, _matmul.SCALE_LAYOUTS, "scale_layout")
    d = _matmul._validate(a, b, sfa, sfb, fmt, k, scale_layout)
    dev, tgt = H.device_and_target(device, target)
    spec = spec_for(tgt, fmt, d.k, out_dtype, epilogue, scale_layout)
    return _matmul._run_dense(spec, d, a, b, sfa, sfb, alpha, dict(epilogue_inputs or {}),
                              dev, grid(d.m, d.n))


def kernel(spec: MfmaMatmulSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


def bundle_specs(target: str = "gfx950") -> list[MfmaMatmulSpec]:
    """Every spec the dispatch can pick on ``target`` without an epilogue (none off AMD)."""
    if target not in TARGETS:
        return []
    specs = [MfmaMatmulSpec(f, o, "tcgen5d", None, al, target)
             for f in ("nvfp4", "mxfp4", "mxfp8") for o in _matmul.OUT_DTYPES
             for al in (True, False)]
    # matmul_dynamic_block_scaled_mxfp4 requires K % 32 == 0: aligned only
    specs += [MfmaMatmulSpec("mxfp4", o, "row_major", None, True, target)
              for o in _matmul.OUT_DTYPES]
    return specs


# imported last: matmul imports this module at its end, so it must be fully defined first
from blockscale.ops import matmul as _matmul

if fast_path not in _matmul.FAST_PATHS:
    _matmul.FAST_PATHS.append(fast_path)
if row_major_path not in _matmul.ROW_MAJOR_PATHS:
    _matmul.ROW_MAJOR_PATHS.append(row_major_path)

_core.attach_kernel_api((block_scaled_matmul_mfma,), kernel, build)
_core.register_op_module(__name__)

__all__ = [
    "MfmaMatmulSpec",
    "block_scaled_matmul_mfma",
    "build",
    "bundle_specs",
    "fast_path",
    "grid",
    "kernel",
    "path_for",
]

"""sm_100a (Blackwell) block-scaled matmul on ``tcgen05.mma ... block_scale`` (compile only).

Same contract as :func:`blockscale.ops.matmul.block_scaled_matmul` (SEMANTICS §4.1): 5-D
TCGEN scales, fp32 accumulation, ``alpha`` on the fp32 accumulator, bf16 (RNE) or f32
output, an optional fused :class:`~blockscale.ops.matmul_epilogue.Epilogue`.

Kernel (:mod:`blockscale.ops._tcgen05_ir`): one CTA of 128 threads per 128 x 128 tile of C;
operands staged by the threads into the canonical K-major shared-memory layout (2 stages),
the SF atoms of the 5-D scales copied to tensor memory with ``tcgen05.cp.32x128b.warpx4``,
``tcgen05.mma.cta_group::1.kind::{mxf4nvf4|mxf4|mxf8f6f4}.block_scale`` into an fp32
accumulator in tensor memory, ``tcgen05.commit`` + mbarriers, ``tcgen05.ld`` epilogue.

No Blackwell GPU is available to the project: the kernel is built and lowered to a real
sm_100a cubin by ptxas, its SASS is checked for the tcgen05 MMA, and its IR runs in the numpy
interpreter (tcgen05 modeled from the PTX ISA: ``runtime/interpreter/ops_tcgen05.py``)
against the float64 reference. It is never called "tested on hardware".

Dispatch: the :data:`blockscale.ops.matmul.FAST_PATHS` entry takes target sm_100a for every
format and K > 0: the 16-byte-load variant when K % 32 == 0, byte loads otherwise (partial
K-blocks, rows not 16-byte aligned). Importing this module does not import MLIR.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.ops.matmul_epilogue import Epilogue

#: modules whose source shapes the kernel (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._tcgen05_ir", "blockscale.ops.matmul_epilogue",
                  "blockscale.ops._matmul_ir")
TARGETS = ("sm_100a",)
FORMATS = ("nvfp4", "mxfp4", "mxfp8")
#: = blockscale.ops._tcgen05_ir (repeated: this module does not import MLIR)
TILE = 128
THREADS = 128
STEP_BYTES = {"nvfp4": 32, "mxfp4": 64, "mxfp8": 128}
STAGES = 2
SF_ATOM_BYTES = 512
STATIC_LIMIT = 48 * 1024


@dataclasses.dataclass(frozen=True)
class Tcgen05MatmulSpec(FormatSpec):
    """What one sm_100a tcgen05 dense matmul kernel is specialised on.

    Attributes:
        fmt: "nvfp4" | "mxfp4" | "mxfp8" (both operands).
        out_dtype: "bfloat16" | "float32".
        epilogue: an optional fused :class:`Epilogue`.
        target: "sm_100a".
        aligned: K % 32 == 0 (rows of whole 16-byte pieces, ``ld.global.v4``); False loads
            the operands byte by byte (any valid K).
    """

    fmt: str
    out_dtype: str = "bfloat16"
    epilogue: Epilogue | None = None
    target: str = "sm_100a"
    aligned: bool = True

    op: ClassVar[str] = "block_scaled_matmul_tcgen05"
    block: ClassVar[tuple[int, int, int]] = (THREADS, 1, 1)

    def __post_init__(self) -> None:
        _matmul.check_spec_fields(self)
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, TARGETS, "target")

    @property
    def shared_bytes(self) -> int:
        """Shared memory of the stages (= _tcgen05_ir.Layout.shared_bytes)."""
        return STAGES * (2 * SF_ATOM_BYTES + 2 * TILE * STEP_BYTES[self.fmt])

    @property
    def dynamic_shared_bytes(self) -> int:
        """Dynamic shared memory per CTA (the stages when over the 48 KiB static limit)."""
        return self.shared_bytes if self.shared_bytes > STATIC_LIMIT else 0

    @property
    def kernel_name(self) -> str:
        ep = f"_ep{self.epilogue.key[:10]}" if self.epilogue else ""
        ua = "" if self.aligned else "_ua"
        return (f"bs_matmul_tcgen05_{self.fmt}_{TILE}x{TILE}{ua}_{H.out_tag(self.out_dtype)}"
                f"{ep}")

    def args(self) -> tuple[KernelArg, ...]:
        """The portable kernel's parameters: a, b, sfa, sfb, c, epilogue inputs, m, n, k,
        alpha."""
        return _matmul.MatmulSpec(self.fmt, self.out_dtype, "tcgen5d", self.epilogue,
                                  self.target).args()


def grid(m: int, n: int) -> tuple[int, int, int]:
    """Launch grid: one CTA per 128 x 128 tile of C."""
    return (max(1, -(-n // TILE)), max(1, -(-m // TILE)), 1)


def build(spec: Tcgen05MatmulSpec) -> Any:
    """The ``mlir.ir.Module`` of the kernel for ``spec`` (IR only)."""
    from mlir.dialects import arith

    import blockscale.ops._matmul_ir as mir
    import blockscale.ops._tcgen05_ir as X
    from blockscale.compiler import ir as bir
    from blockscale.ops.matmul_epilogue import EpilogueContext

    layout = X.Layout(spec.fmt)
    if layout.shared_bytes != spec.shared_bytes or X.BM != TILE or X.THREADS != THREADS:
        raise AssertionError("Tcgen05MatmulSpec disagrees with _tcgen05_ir")
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        out_type = bir.bf16() if spec.out_dtype == "bfloat16" else bir.f32()
        epilogue = spec.epilogue
        buffers = {i.name: (i, kb.arg(i.name)) for i in epilogue.inputs} if epilogue else {}
        n_count = bir.as_index(kb.arg("n"))

        def store(value: Any, m: Any, n: Any) -> None:
            value = arith.mulf(value, kb.arg("alpha"))
            if epilogue is not None:
                value = epilogue.fn(value, EpilogueContext(m, n, n_count, out_type, buffers))
            mir.store_output(value, kb.arg("c"), bir.add(bir.mul(m, n_count), n),
                             spec.out_dtype)

        X.emit_kernel_body(kb, spec.format, layout, store, aligned=spec.aligned)
    return kb.module


# ---- host side -------------------------------------------------------------------------------


def supported(fmt: Format, k: int) -> bool:
    """Every format, K > 0 (K = 0 is the portable kernel's: zeros)."""
    return fmt.name in FORMATS and k > 0


def spec_for(fmt: Format, k: int, out_dtype: str = "bfloat16",
             epilogue: Epilogue | None = None, target: str = "sm_100a") -> Tcgen05MatmulSpec:
    """The spec for a problem: the 16-byte-load variant when K % 32 == 0."""
    return Tcgen05MatmulSpec(fmt.name, out_dtype, epilogue, target, k % 32 == 0)


def fast_path(target: str, fmt: Format, m: int, n: int, k: int, out_dtype: str,
              epilogue: Epilogue | None) -> Callable[..., Any] | None:
    """The :data:`blockscale.ops.matmul.FAST_PATHS` hook: a runner for sm_100a (K > 0),
    else None."""
    if target not in TARGETS or not supported(fmt, k) or m == 0 or n == 0:
        return None
    spec = spec_for(fmt, k, out_dtype, epilogue, target)
    return _matmul.dense_runner(spec, fmt, m, n, k, grid(m, n))


def block_scaled_matmul_tcgen05(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *,
                                k: int | None = None, alpha: float = 1.0,
                                out_dtype: str = "bfloat16", epilogue: Epilogue | None = None,
                                epilogue_inputs: dict[str, Any] | None = None,
                                device: Any = None) -> Any:
    """The tcgen05 kernel called directly (no dispatch), e.g. by tests. Same arguments as
    :func:`blockscale.ops.matmul.block_scaled_matmul_with_epilogue`; raises ValueError when
    K == 0. Runs where an sm_100a kernel can: the interpreter (or a Blackwell GPU)."""
    fmt = Format.from_name(fmt)
    d = _matmul._validate(a, b, sfa, sfb, fmt, k, "tcgen5d")
    if not supported(fmt, d.k):
        raise ValueError(f"k must be positive for the sm_100a tcgen05 kernel ({fmt.name}), "
                         f"got {d.k}")
    dev, tgt = H.device_and_target(device, "sm_100a")
    spec = spec_for(fmt, d.k, out_dtype, epilogue, tgt)
    return _matmul._run_dense(spec, d, a, b, sfa, sfb, alpha, dict(epilogue_inputs or {}),
                              dev, grid(d.m, d.n))


def kernel(spec: Tcgen05MatmulSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


def bundle_specs(target: str = "sm_100a") -> list[Tcgen05MatmulSpec]:
    """Every tcgen05 spec on ``target`` (none off sm_100a): each format x output dtype x
    load variant."""
    if target not in TARGETS:
        return []
    return [Tcgen05MatmulSpec(f, o, None, target, al) for f in FORMATS
            for al in (True, False) for o in ("bfloat16", "float32")]


# imported last (the ops.matmul import cycle, as matmul_sm90)
from blockscale.ops import matmul as _matmul

if fast_path not in _matmul.FAST_PATHS:
    _matmul.FAST_PATHS.append(fast_path)

_core.attach_kernel_api((block_scaled_matmul_tcgen05,), kernel, build)
_core.register_op_module(__name__)

__all__ = [
    "Tcgen05MatmulSpec",
    "block_scaled_matmul_tcgen05",
    "build",
    "bundle_specs",
    "fast_path",
    "grid",
    "kernel",
]

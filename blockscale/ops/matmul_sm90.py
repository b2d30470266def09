"""sm_90a (Hopper) tensor-core block-scaled matmul: in-register dequantization + mma.sync.

Same contract as :func:`blockscale.ops.matmul.block_scaled_matmul` (SEMANTICS §4.1): 5-D
scales, fp32 accumulation, ``alpha`` on the fp32 accumulator, bf16 (RNE) or f32 output, an
optional fused :class:`~blockscale.ops.matmul_epilogue.Epilogue`. It registers itself in
:data:`blockscale.ops.matmul.FAST_PATHS` and runs when the target is sm_90a and the rows are
16-byte aligned (FP4: K % 32 == 0; MXFP8: K % 16 == 0), else the portable kernel runs.

Kernel: a CTA of 4 warps computes a ``bm x bn`` tile of C (default 64 x 128, each warp 32 x
64 as 2 x 8 ``mma.m16n8k16`` tiles); the K loop stages one K-step (4 scale blocks) of A, B and
their scales in shared memory, each warp dequantizes its fragments to bf16 (FP4) or f16
(MXFP8) in registers and runs one MMA chain per scale block, then folds the block into the
fp32 accumulators with the block scales (exact; see :mod:`blockscale.ops._mma_ir` for why the
FP4 results are bit-identical to the portable kernel's). Importing this module does not
import MLIR.
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

THREADS = 128
#: modules whose source shapes the kernel (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._mma_ir", "blockscale.ops.matmul_epilogue",
                  "blockscale.ops._matmul_ir")
TARGETS = ("sm_90a",)
#: tile shapes (bm, bn) the kernel is built for (128 x 128 spills: 255 registers)
TILE_CHOICES = ((64, 128), (64, 64))


def tiles_for(fmt: Format) -> tuple[tuple[int, int], ...]:
    """The tiles built without register spills for ``fmt`` (MXFP8 64 x 128 spills)."""
    return TILE_CHOICES if fmt.is_fp4 else ((64, 64),)


#: BLOCKSCALE_SM90_FAST=0 disables the fast path (the portable kernel runs instead)
ENV_SWITCH = "BLOCKSCALE_SM90_FAST"


@dataclasses.dataclass(frozen=True)
class Sm90MatmulSpec(FormatSpec):
    """What one sm_90a tensor-core dense matmul kernel is specialised on.

    Attributes:
        fmt: "nvfp4" | "mxfp4" | "mxfp8".
        out_dtype: "bfloat16" | "float32".
        epilogue: an optional fused :class:`Epilogue`.
        bm, bn: the CTA tile (one of :data:`TILE_CHOICES`).
        target: "sm_90a".
    """

    fmt: str
    out_dtype: str = "bfloat16"
    epilogue: Epilogue | None = None
    bm: int = 64
    bn: int = 128
    target: str = "sm_90a"

    op: ClassVar[str] = "block_scaled_matmul_sm90"
    block: ClassVar[tuple[int, int, int]] = (THREADS, 1, 1)

    def __post_init__(self) -> None:
        _matmul.check_spec_fields(self)
        if (self.bm, self.bn) not in tiles_for(self.format):
            raise ValueError(f"(bm, bn) must be one of {list(tiles_for(self.format))} for "
                             f"{self.fmt}, got {(self.bm, self.bn)}")
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, TARGETS, "target")

    @property
    def kernel_name(self) -> str:
        ep = f"_ep{self.epilogue.key[:10]}" if self.epilogue else ""
        out = H.out_tag(self.out_dtype)
        return f"bs_matmul_mma_{self.fmt}_{self.bm}x{self.bn}_{out}{ep}"

    def args(self) -> tuple[KernelArg, ...]:
        """The portable kernel's parameters: a, b, sfa, sfb, c, epilogue inputs, m, n, k,
        alpha."""
        return _matmul.MatmulSpec(self.fmt, self.out_dtype, "tcgen5d", self.epilogue,
                                  self.target).args()


def grid(spec: Sm90MatmulSpec, m: int, n: int) -> tuple[int, int, int]:
    """Launch grid: one CTA per ``bm x bn`` tile of C."""
    return (max(1, -(-n // spec.bn)), max(1, -(-m // spec.bm)), 1)


def build(spec: Sm90MatmulSpec) -> Any:
    """The ``mlir.ir.Module`` of the kernel for ``spec`` (IR only)."""
    import blockscale.ops._mma_ir as X
    from blockscale.compiler import ir as bir

    plan, tiles = X.Plan(spec.format), X.Tiles(spec.bm, spec.bn)
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        smem = X.Smem.allocate(kb, plan, tiles)
        m_count, n_count, k = (bir.as_index(kb.arg(x)) for x in ("m", "n", "k"))
        m0 = bir.mul(bir.block_idx("y"), spec.bm)
        n0 = bir.mul(bir.block_idx("x"), spec.bn)
        d1 = bir.ceil_div(bir.ceil_div(k, plan.block), 4)
        # Scale rows m0 + r < ceil(M/128)*128 for every local r (bm divides 128): in bounds.
        a = tile_operand(kb.arg("a"), kb.arg("sfa"), m0, m0, m_count, m0, d1)
        b = tile_operand(kb.arg("b"), kb.arg("sfb"), n0, n0, n_count, n0, d1)
        wc = X.WarpCoords.of(tiles)
        acc = X.emit_mainloop(plan, tiles, smem, wc, a, b, k)
        store_tile(spec, kb, acc, wc, m0, n0, m_count, n_count,
                   lambda v, m, n: _alpha(v, kb.arg("alpha")))
    return kb.module


def tile_operand(data: Any, scales: Any, row0: Any, valid0: Any, limit: Any, srow0: Any,
                 d1: Any) -> Any:
    """The :class:`~blockscale.ops._mma_ir.Operand` of a CTA's rows: local row r is data row
    ``row0 + r``, holds data while ``valid0 + r < limit``, and has its scales at 5-D row
    ``srow0 + r`` (rows of ``d1`` K-groups)."""
    import blockscale.ops._matmul_ir as mir
    import blockscale.ops._mma_ir as X
    from blockscale.compiler import ir as bir

    return X.Operand(data, scales, lambda r: bir.add(row0, r),
                     lambda r: bir.ult(bir.add(valid0, r), limit),
                     lambda r: mir.tcgen_row_offset(bir.add(srow0, r), d1))


def _alpha(value: Any, alpha: Any) -> Any:
    from mlir.dialects import arith

    return arith.mulf(value, alpha)


def store_tile(spec: Any, kb: Any, acc: list, wc: Any, m0: Any, n0: Any, m_count: Any,
               n_count: Any, scale: Callable[[Any, Any, Any], Any]) -> None:
    """Store the accumulators (``scale(value, m, n)`` applied, then the spec's epilogue and
    the cast) to ``c[m, n]`` where ``m < m_count`` and ``n < n_count``."""
    import blockscale.ops._matmul_ir as mir
    from blockscale.compiler import ir as bir
    from blockscale.ops._staged_store_ir import hoisted, tiles
    from blockscale.ops.matmul_epilogue import EpilogueContext

    epilogue = getattr(spec, "epilogue", None)
    out_type = bir.bf16() if spec.out_dtype == "bfloat16" else bir.f32()
    buffers = {i.name: (i, kb.arg(i.name)) for i in epilogue.inputs} if epilogue else {}
    hoist = hoisted(epilogue)
    if hoist is not None:  # its per-row / per-column states outside the guards
        def body(h: Any, mt: int, nt: int, vals: list, rows: list, row_states: list,
                 cols: list, col_states: list) -> None:
            for i, v in enumerate(vals):
                m, n = rows[i >> 1], cols[i & 1]
                with bir.when(bir.logical_and(bir.ult(m, m_count), bir.ult(n, n_count))):
                    ctx = EpilogueContext(m, n, n_count, out_type, buffers)
                    value = h.apply(scale(v, m, n), row_states[i >> 1], col_states[i & 1], ctx)
                    mir.store_output(value, kb.arg("c"), bir.add(bir.mul(m, n_count), n),
                                     spec.out_dtype)

        tiles(hoist, acc, wc, m0, n0, m_count, n_count, buffers, body)
        return
    for mt, row in enumerate(acc):
        for nt, vals in enumerate(row):
            for i, v in enumerate(vals):
                m = bir.add(m0, wc.c_row(mt, i))
                n = bir.add(n0, wc.c_col(nt, i))
                with bir.when(bir.logical_and(bir.ult(m, m_count), bir.ult(n, n_count))):
                    value = scale(v, m, n)
                    if epilogue is not None:
                        value = epilogue.fn(value, EpilogueContext(m, n, n_count, out_type,
                                                                   buffers))
                    mir.store_output(value, kb.arg("c"), bir.add(bir.mul(m, n_count), n),
                                     spec.out_dtype)


# ---- host side -------------------------------------------------------------------------------


def k_supported(fmt: Format, k: int) -> bool:
    """Whether rows of K elements are 16-byte aligned (the kernel's 16-byte loads)."""
    return k % 32 == 0 if fmt.is_fp4 else k % 16 == 0


def choose_tiles(fmt: Format, m: int, n: int) -> tuple[int, int]:
    """The CTA tile for an ``[m, n]`` output: 64 x 128, or 64 x 64 for MXFP8 (registers) and
    when 64 x 128 tiles would leave the GPU's 132 SMs idle."""
    if not fmt.is_fp4 or -(-m // 64) * -(-n // 128) < 132:
        return (64, 64)
    return (64, 128)


def enabled() -> bool:
    """False when BLOCKSCALE_SM90_FAST=0."""
    return os.environ.get(ENV_SWITCH, "1") not in ("0", "false", "off")


def spec_for(fmt: Format, m: int, n: int, out_dtype: str = "bfloat16",
             epilogue: Epilogue | None = None, target: str = "sm_90a") -> Sm90MatmulSpec:
    """The spec the fast path uses for a problem shape."""
    bm, bn = choose_tiles(fmt, m, n)
    return Sm90MatmulSpec(fmt.name, out_dtype, epilogue, bm, bn, target)


def fast_path(target: str, fmt: Format, m: int, n: int, k: int, out_dtype: str,
              epilogue: Epilogue | None) -> Callable[..., Any] | None:
    """The :data:`blockscale.ops.matmul.FAST_PATHS` hook: a runner for sm_90a and aligned K,
    else None."""
    if target not in TARGETS or not enabled() or not k_supported(fmt, k) or m == 0 or n == 0:
        return None
    spec = spec_for(fmt, m, n, out_dtype, epilogue, target)
    return _matmul.dense_runner(spec, fmt, m, n, k, grid(spec, m, n))


def block_scaled_matmul_sm90(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *,
                             k: int | None = None, alpha: float = 1.0,
                             out_dtype: str = "bfloat16", epilogue: Epilogue | None = None,
                             epilogue_inputs: dict[str, Any] | None = None,
                             tiles: tuple[int, int] | None = None, device: Any = None) -> Any:
    """The tensor-core kernel called directly (no dispatch), e.g. by tests and benchmarks.

    Same arguments as :func:`blockscale.ops.matmul.block_scaled_matmul_with_epilogue`;
    ``tiles`` forces ``(bm, bn)``. Raises ValueError when K is not 16-byte aligned, or an
    operand in device memory is not (:func:`~blockscale.ops._matmul_host.require_aligned`).
    """
    fmt = Format.from_name(fmt)
    d = _matmul._validate(a, b, sfa, sfb, fmt, k, "tcgen5d")
    H.require_aligned(a=a, b=b, sfa=sfa, sfb=sfb)  # no portable fallback here
    if not k_supported(fmt, d.k):
        raise ValueError(f"k must be a multiple of {32 if fmt.is_fp4 else 16} for the sm_90a "
                         f"tensor-core kernel ({fmt.name}), got {d.k}")
    dev, tgt = H.device_and_target(device, "sm_90a")
    bm, bn = tiles if tiles is not None else choose_tiles(fmt, d.m, d.n)
    spec = Sm90MatmulSpec(fmt.name, out_dtype, epilogue, bm, bn, tgt)
    return _matmul._run_dense(spec, d, a, b, sfa, sfb, alpha, dict(epilogue_inputs or {}),
                              dev, grid(spec, d.m, d.n))


def kernel(spec: Sm90MatmulSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


#: (M, N, K) of the GPU tests and the benchmark (tests/test_matmul_{fast_,}gpu.py,
#: benchmarks/bench_matmul.py); bundle_specs covers the tiles they choose.
GPU_SHAPES = ((1, 576, 7168), (777, 2560, 8192), (8192, 5760, 2944), (1000, 1024, 1056),
              *((m, 2048, 1024) for m in (1, 17, 127, 129, 255)),
              *((m, 5760, 2944) for m in (1, 16, 128, 1024, 8192)))


def bundle_specs(target: str = "sm_90a") -> list[Sm90MatmulSpec]:
    """Every spec the GPU tests and the benchmark use on ``target`` (none off sm_90a)."""
    if target not in TARGETS:
        return []
    specs = {spec_for(Format.from_name(f), m, n, o, None, target)
             for f in ("nvfp4", "mxfp4", "mxfp8") for o in _matmul.OUT_DTYPES
             for m, n, _ in GPU_SHAPES}
    return sorted(specs, key=lambda s: s.kernel_name)


# imported last: matmul imports the fast-path modules (matmul_decode -> matmul_grouped ->
# matmul_grouped_sm90 -> this module) at its end, so this module must be fully defined first
from blockscale.ops import matmul as _matmul

if fast_path not in _matmul.FAST_PATHS:
    _matmul.FAST_PATHS.append(fast_path)

_core.attach_kernel_api((block_scaled_matmul_sm90,), kernel, build)
_core.register_op_module(__name__)

__all__ = [
    "Sm90MatmulSpec",
    "block_scaled_matmul_sm90",
    "build",
    "bundle_specs",
    "fast_path",
    "grid",
    "kernel",
]

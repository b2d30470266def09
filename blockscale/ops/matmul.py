"""Dense block-scaled matmul (SEMANTICS §4): the portable kernel, dispatch and fused epilogues.

``C[m, n] = epilogue(alpha * sum_k dec(A[m,k]) dec(B[n,k]) |sA(m, k//SFV)| |sB(n, k//SFV)|)``

* ``A [M, K/2]`` uint8 (FP4) or ``[M, K]`` float8_e4m3fn (MXFP8), K-major; ``B [N, K/2 | K]``
  K-major ("transpose_b", the only mode);
* scales in the 5-D TCGEN layout (``naive_block_scaled_matmul``) or row-major ``[rows, K/32]``
  E8M0 (``matmul_dynamic_block_scaled_mxfp4``, the AMD-style entry point, K % 32 == 0);
* fp32 accumulation; ``alpha`` multiplies the fp32 accumulator; output bf16 (RNE) or f32.

The portable kernel runs one thread per output on 16x16 blocks, grid ``(ceil(N/16),
ceil(M/16))``; its K loop is in :mod:`blockscale.ops._matmul_ir`. It is built for every target
(sm_90a, sm_100a, gfx942, gfx950) from the same IR.

:func:`block_scaled_matmul` dispatches by target and shape: today always the portable kernel;
:data:`FAST_PATHS` is the hook a tiled kernel (e.g. sm_90a wgmma) registers into.
:func:`block_scaled_matmul_with_epilogue` fuses an :class:`~blockscale.ops.matmul_epilogue.
Epilogue` (bias, residual, activation, row/col scales, cast) into the same kernel.

Importing this module does not import MLIR (``build`` does, when called).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import MXFP4, Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.layouts import scale_shape
from blockscale.ops.matmul_epilogue import Epilogue

BLOCK = (16, 16, 1)
#: modules whose source shapes the kernel (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._matmul_ir", "blockscale.ops.matmul_epilogue")
OUT_DTYPES = ("bfloat16", "float32")
SCALE_LAYOUTS = ("tcgen5d", "row_major")


def check_spec_fields(spec: Any, scale_layout: bool = False) -> None:
    """The fields every dense matmul spec shares, in __post_init__: ``fmt`` to its canonical
    name, ``out_dtype`` one of :data:`OUT_DTYPES`, ``scale_layout`` (when the spec has one)
    one of :data:`SCALE_LAYOUTS`, ``epilogue`` an :class:`Epilogue` or None."""
    object.__setattr__(spec, "fmt", Format.from_name(spec.fmt).name)
    H.check_choice(spec.out_dtype, OUT_DTYPES, "out_dtype")
    if scale_layout:
        H.check_choice(spec.scale_layout, SCALE_LAYOUTS, "scale_layout")
    if spec.epilogue is not None and not isinstance(spec.epilogue, Epilogue):
        raise TypeError(f"epilogue must be an Epilogue or None, got "
                        f"{type(spec.epilogue).__name__}")


@dataclasses.dataclass(frozen=True)
class MatmulSpec(FormatSpec):
    """What one portable dense matmul kernel is specialised on.

    Attributes:
        fmt: "nvfp4" | "mxfp4" | "mxfp8" (both operands).
        out_dtype: "bfloat16" | "float32".
        scale_layout: "tcgen5d" (5-D scales) or "row_major" (``[rows, kblocks]``).
        epilogue: an optional fused :class:`Epilogue`.
        target: a GPUTarget name.
    """

    fmt: str
    out_dtype: str = "bfloat16"
    scale_layout: str = "tcgen5d"
    epilogue: Epilogue | None = None
    target: str = "sm_90a"

    op: ClassVar[str] = "block_scaled_matmul"
    block: ClassVar[tuple[int, int, int]] = BLOCK

    def __post_init__(self) -> None:
        check_spec_fields(self, scale_layout=True)
        object.__setattr__(self, "target", H.target_name(self.target))

    @property
    def kernel_name(self) -> str:
        ep = f"_ep{self.epilogue.key[:10]}" if self.epilogue else ""
        lay = "5d" if self.scale_layout == "tcgen5d" else "rm"
        out = H.out_tag(self.out_dtype)
        return f"bs_matmul_{self.fmt}_{lay}_{out}{ep}"

    def args(self) -> tuple[KernelArg, ...]:
        """Kernel parameters: a, b, sfa, sfb, c, epilogue inputs, then m, n, k, alpha."""
        fmt = self.format
        data = fmt.elem_dtype.name
        scale = fmt.scale_dtype.name
        extra = tuple(KernelArg(i.name, "buffer", i.dtype) for i in
                      (self.epilogue.inputs if self.epilogue else ()))
        return (KernelArg("a", "buffer", data), KernelArg("b", "buffer", data),
                KernelArg("sfa", "buffer", scale), KernelArg("sfb", "buffer", scale),
                KernelArg("c", "buffer", self.out_dtype, "out"), *extra,
                KernelArg("m", "scalar", "i32"), KernelArg("n", "scalar", "i32"),
                KernelArg("k", "scalar", "i32"), KernelArg("alpha", "scalar", "f32"))


def grid(m: int, n: int) -> tuple[int, int, int]:
    """Launch grid of the portable kernel for an ``[m, n]`` output."""
    return (max(1, -(-n // BLOCK[0])), max(1, -(-m // BLOCK[1])), 1)


def build(spec: MatmulSpec) -> Any:
    """The ``mlir.ir.Module`` of the portable kernel for ``spec`` (IR only, no compile)."""
    from mlir.dialects import arith

    import blockscale.ops._matmul_ir as mir
    from blockscale.compiler import ir as bir
    from blockscale.ops.matmul_epilogue import EpilogueContext

    fmt = spec.format
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), BLOCK) as kb:
        m_count, n_count, k = (bir.as_index(kb.arg(x)) for x in ("m", "n", "k"))
        n = bir.add(bir.mul(bir.block_idx("x"), BLOCK[0]), bir.thread_idx("x"))
        m = bir.add(bir.mul(bir.block_idx("y"), BLOCK[1]), bir.thread_idx("y"))
        with bir.when(bir.logical_and(bir.ult(m, m_count), bir.ult(n, n_count))):
            row_bytes = bir.udiv(k, 2) if fmt.is_fp4 else k
            kblocks = bir.ceil_div(k, fmt.block_size)
            sfa_off, sfb_off = mir.scale_offsets(spec.scale_layout, m, n, kblocks)
            acc = mir.emit_block_scaled_dot(
                fmt, a=kb.arg("a"), a_row=bir.mul(m, row_bytes), b=kb.arg("b"),
                b_row=bir.mul(n, row_bytes), sfa=kb.arg("sfa"), sfa_offset=sfa_off,
                sfb=kb.arg("sfb"), sfb_offset=sfb_off, k=k)
            value = arith.mulf(acc, kb.arg("alpha"))
            out_type = bir.bf16() if spec.out_dtype == "bfloat16" else bir.f32()
            if spec.epilogue is not None:
                buffers = {i.name: (i, kb.arg(i.name)) for i in spec.epilogue.inputs}
                ctx = EpilogueContext(m, n, n_count, out_type, buffers)
                value = spec.epilogue.fn(value, ctx)
            mir.store_output(value, kb.arg("c"), bir.add(bir.mul(m, n_count), n),
                             spec.out_dtype)
    return kb.module


# ---- host side -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Dense:
    """Validated dense-matmul operands."""

    fmt: Format
    m: int
    n: int
    k: int


#: successful _validate results per argument signature (host cost per call)
_VALIDATED = H.CheckMemo()


def _validate(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format, k: int | None,
              scale_layout: str, scale_names: tuple[str, str] = ("sfa", "sfb")) -> _Dense:
    key = (H.array_key(a), H.array_key(b), H.array_key(sfa), H.array_key(sfb), fmt.name,
           type(k), k, scale_layout, scale_names)
    hit = _VALIDATED.get(key)
    if hit is not None:
        return hit
    return _VALIDATED.put(key, _check(a, b, sfa, sfb, fmt, k, scale_layout, scale_names))


def _check(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format, k: int | None,
           scale_layout: str, scale_names: tuple[str, str]) -> _Dense:
    a_shape, b_shape = H.shape_of(a, "a", 2), H.shape_of(b, "b", 2)
    H.check_dtype(a, fmt.elem_dtype, "a", fmt)
    H.check_dtype(b, fmt.elem_dtype, "b", fmt)
    cols = a_shape[1]
    if b_shape[1] != cols:
        raise ValueError(f"b.shape[1] must equal a.shape[1] = {cols} (K-major B), "
                         f"got {b_shape[1]}")
    if k is None:
        k = 2 * cols if fmt.is_fp4 else cols
    fmt.check_k(k)
    if fmt.data_cols(k) != cols:
        raise ValueError(f"a.shape[1] must be {fmt.data_cols(k)} for k={k} ({fmt.name}), "
                         f"got {cols}")
    if k >= 2 ** 31 or max(a_shape[0], b_shape[0]) >= 2 ** 31:
        raise ValueError(f"m, n and k must be < 2^31 (i32 kernel scalars), got "
                         f"m={a_shape[0]}, n={b_shape[0]}, k={k}")
    j = fmt.kblocks(k)
    for arr, rows, name in ((sfa, a_shape[0], scale_names[0]), (sfb, b_shape[0], scale_names[1])):
        H.check_dtype(arr, fmt.scale_dtype, name, fmt)
        want = scale_shape(scale_layout, rows, j)
        if tuple(arr.shape) != want:
            raise ValueError(f"{name} must have shape {want} ({scale_layout} scales of "
                             f"{rows} rows x {j} K-blocks), got {tuple(arr.shape)}")
    return _Dense(fmt, a_shape[0], b_shape[0], k)


def dense_runner(spec: Any, fmt: Format, m: int, n: int, k: int,
                 launch_grid: tuple[int, int, int]) -> Callable[..., Any]:
    """A :data:`FAST_PATHS` runner that launches ``spec`` on ``launch_grid`` through
    :func:`_run_dense` (the sm_90a fast paths return one)."""

    def run(a: Any, b: Any, sfa: Any, sfb: Any, alpha: float, extra: dict[str, Any],
            device: Any) -> Any:
        return _run_dense(spec, _Dense(fmt, m, n, k), a, b, sfa, sfb, alpha, extra, device,
                          launch_grid)
    return run


def _run_dense(spec: Any, d: _Dense, a: Any, b: Any, sfa: Any, sfb: Any, alpha: float,
               extra: dict[str, Any], device: Any,
               launch_grid: tuple[int, int, int] | None = None) -> Any:
    """Check alpha and the epilogue inputs, then launch ``spec``'s dense kernel (``spec``:
    a MatmulSpec or a spec with its arguments, e.g. the sm_90a one) on ``launch_grid``
    (default: the portable kernel's :func:`grid`)."""
    alpha = H.finite_f32(alpha, "alpha")
    inputs = spec.epilogue.inputs if spec.epilogue else ()
    H.check_epilogue_inputs(inputs, extra, d.m, d.n)
    return H.launch(spec, launch_grid or grid(d.m, d.n), (d.m, d.n), spec.out_dtype,
                    {"a": a, "b": b, "sfa": sfa, "sfb": sfb, **extra},
                    {"m": d.m, "n": d.n, "k": d.k, "alpha": alpha}, device,
                    empty=d.m == 0 or d.n == 0)


def naive_block_scaled_matmul(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *,
                              k: int | None = None, alpha: float = 1.0,
                              out_dtype: str = "bfloat16", device: Any = None,
                              target: str | None = None) -> Any:
    """Portable block-scaled matmul with 5-D scales (SEMANTICS §4.1-4.2).

    Args:
        a: ``[M, K/2]`` uint8 (NVFP4/MXFP4) or ``[M, K]`` float8_e4m3fn (MXFP8).
        b: ``[N, K/2 | K]`` (K-major).
        sfa, sfb: 5-D scales ``[ceil(M|N/128), ceil(ceil(K/SFV)/4), 32, 4, 4]``.
        fmt: the format of both operands.
        k: logical K (default: from a's shape).
        alpha: multiplies the fp32 accumulator.
        out_dtype: "bfloat16" (RNE) or "float32".
        device: "cuda" | "hip" | "interp" | a Device; None: best available.
        target: the kernel's GPUTarget name; None: the device's.
    Returns ``[M, N]``: numpy in gives numpy out, device arrays give device arrays.
    """
    fmt = Format.from_name(fmt)
    d = _validate(a, b, sfa, sfb, fmt, k, "tcgen5d")
    dev, tgt = H.device_and_target(device, target)
    spec = MatmulSpec(fmt.name, out_dtype, "tcgen5d", None, tgt)
    return _run_dense(spec, d, a, b, sfa, sfb, alpha, {}, dev)


def matmul_dynamic_block_scaled_mxfp4(a: Any, b: Any, a_scales: Any, b_scales: Any, *,
                                      out_dtype: str = "bfloat16", device: Any = None,
                                      target: str | None = None) -> Any:
    """MXFP4 matmul with row-major E8M0 scales, MAX's AMD entry point (SEMANTICS §4.5).

    ``a [M, K/2]``, ``b [N, K/2]`` uint8, ``a_scales [M, K/32]``, ``b_scales [N, K/32]``
    float8_e8m0fnu; K = 2 * b.shape[1] must be a multiple of 32 (no silent K%32 drop). No alpha.
    """
    b_shape = H.shape_of(b, "b", 2)
    k = 2 * b_shape[1]
    if k % 32:
        raise ValueError(f"K = 2 * b.shape[1] must be a multiple of 32, got {k}")
    d = _validate(a, b, a_scales, b_scales, MXFP4, k, "row_major", ("a_scales", "b_scales"))
    dev, tgt = H.device_and_target(device, target)
    for fast in ROW_MAJOR_PATHS:
        runner = fast(tgt, MXFP4, d.m, d.n, d.k, out_dtype, None)
        if runner is not None:
            return runner(a, b, a_scales, b_scales, 1.0, {}, dev)
    spec = MatmulSpec("mxfp4", out_dtype, "row_major", None, tgt)
    return _run_dense(spec, d, a, b, a_scales, b_scales, 1.0, {}, dev)


#: Fast-path hook: callables ``(target_name, fmt, m, n, k, out_dtype, epilogue) -> runner``
#: returning a runner ``(a, b, sfa, sfb, alpha, extra, device) -> C`` or None when they do not
#: apply. :func:`block_scaled_matmul` tries them in order before the portable kernel.
FAST_PATHS: list[Callable[..., Any]] = []
#: The same hook for :func:`matmul_dynamic_block_scaled_mxfp4` (row-major E8M0 scales).
ROW_MAJOR_PATHS: list[Callable[..., Any]] = []


def block_scaled_matmul(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *,
                        k: int | None = None, alpha: float = 1.0, out_dtype: str = "bfloat16",
                        device: Any = None, target: str | None = None) -> Any:
    """Block-scaled matmul, dispatched by target and shape (same contract as
    :func:`naive_block_scaled_matmul`).

    A registered fast path (:data:`FAST_PATHS`) runs when it accepts the target and shape;
    otherwise the portable kernel runs.
    """
    return block_scaled_matmul_with_epilogue(a, b, sfa, sfb, fmt, k=k, alpha=alpha,
                                             out_dtype=out_dtype, device=device, target=target)


def block_scaled_matmul_with_epilogue(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *,
                                      k: int | None = None, alpha: float = 1.0,
                                      out_dtype: str = "bfloat16",
                                      epilogue: Epilogue | Callable[..., Any] | None = None,
                                      epilogue_inputs: dict[str, Any] | None = None,
                                      device: Any = None, target: str | None = None) -> Any:
    """Block-scaled matmul with a fused epilogue (one kernel, no read-back of C).

    ``epilogue`` is an :class:`Epilogue` (see :mod:`blockscale.ops.matmul_epilogue` for
    ``bias``, ``residual``, ``row_scale``, ``col_scale``, ``relu``, ``clamp``, ``chain``) or a
    bare callable ``fn(value_f32, ctx) -> value`` without extra inputs. It runs on the fp32
    value ``alpha * acc`` inside the kernel, before the cast to ``out_dtype``.
    ``epilogue_inputs`` maps the epilogue's input names to arrays.
    """
    fmt = Format.from_name(fmt)
    if epilogue is not None and not isinstance(epilogue, Epilogue):
        if not callable(epilogue):
            raise TypeError(f"epilogue must be an Epilogue, a callable or None, got "
                            f"{type(epilogue).__name__}")
        epilogue = Epilogue(epilogue)
    d = _validate(a, b, sfa, sfb, fmt, k, "tcgen5d")
    dev, tgt = H.device_and_target(device, target)
    # the tiled kernels load 16-byte pieces: operands at other addresses run the portable one
    for fast in FAST_PATHS if H.vector_aligned(a, b, sfa, sfb) else ():
        runner = fast(tgt, fmt, d.m, d.n, d.k, out_dtype, epilogue)
        if runner is not None:
            return runner(a, b, sfa, sfb, alpha, dict(epilogue_inputs or {}), dev)
    spec = MatmulSpec(fmt.name, out_dtype, "tcgen5d", epilogue, tgt)
    return _run_dense(spec, d, a, b, sfa, sfb, alpha, dict(epilogue_inputs or {}), dev)


def kernel(spec_or_fmt: MatmulSpec | Format | str, target: str = "sm_90a", **spec_fields: Any
           ) -> Any:
    """The compiled :class:`~blockscale.compiler.pipeline.Kernel` (all asm stages) for a spec,
    or for a format plus MatmulSpec fields. Needs the compiler."""
    spec = spec_or_fmt if isinstance(spec_or_fmt, MatmulSpec) else MatmulSpec(
        Format.from_name(spec_or_fmt).name, target=target, **spec_fields)
    return H.compile_spec(spec)


def naive_block_scaled_matmul_kernel(fmt: Format | str, target: str = "sm_90a", *,
                                    out_dtype: str = "bfloat16") -> Any:
    """Compiled Kernel behind :func:`naive_block_scaled_matmul` (the portable kernel, 5-D
    scales) for ``fmt`` on ``target``."""
    return kernel(MatmulSpec(Format.from_name(fmt).name, out_dtype, "tcgen5d", None, target))


def matmul_dynamic_block_scaled_mxfp4_kernel(target: str = "sm_90a", *,
                                             out_dtype: str = "bfloat16") -> Any:
    """Compiled Kernel behind :func:`matmul_dynamic_block_scaled_mxfp4` (row-major E8M0
    scales) on ``target``."""
    return kernel(MatmulSpec("mxfp4", out_dtype, "row_major", None, target))


def bundle_specs(target: str = "sm_90a") -> list[MatmulSpec]:
    """Every portable dense-matmul spec the GPU tests and benchmarks use on ``target``."""
    specs = [MatmulSpec(f, o, "tcgen5d", None, target)
             for f in ("nvfp4", "mxfp4", "mxfp8") for o in OUT_DTYPES]
    specs.append(MatmulSpec("mxfp4", "bfloat16", "row_major", None, target))
    return specs


_core.attach_kernel_api((naive_block_scaled_matmul, matmul_dynamic_block_scaled_mxfp4,
                         block_scaled_matmul, block_scaled_matmul_with_epilogue), kernel, build)
_core.register_op_module(__name__)

import blockscale.ops.matmul_sm90  # noqa: F401 (registers its FAST_PATHS entry)
import blockscale.ops.matmul_decode  # noqa: E402, F401 (decode kernel: first in FAST_PATHS)
import blockscale.ops.matmul_wgmma  # noqa: F401 (sm_90a default; BLOCKSCALE_SM90_WGMMA=0: off)
import blockscale.ops.matmul_twophase  # (registers its FAST_PATHS entry: sm_90a, M >= 1024, before wgmma)
import blockscale.ops.matmul_twophase_mx8  # noqa: E402, F401 (MXFP8 pair, default off)
import blockscale.ops.matmul_tcgen05  # noqa: E402, F401 (sm_100a: tcgen05 kernel)
import blockscale.ops.matmul_mfma  # noqa: E402, F401 (gfx942 / gfx950: MFMA kernels)

__all__ = [
    "FAST_PATHS",
    "MatmulSpec",
    "block_scaled_matmul",
    "block_scaled_matmul_with_epilogue",
    "build",
    "bundle_specs",
    "grid",
    "kernel",
    "matmul_dynamic_block_scaled_mxfp4",
    "matmul_dynamic_block_scaled_mxfp4_kernel",
    "naive_block_scaled_matmul",
    "naive_block_scaled_matmul_kernel",
]

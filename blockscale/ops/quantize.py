"""Dynamic block-scaled quantization kernels (SEMANTICS §2.1-§2.4, D1-D7, D9, D12).

bf16 ``[M, K]`` -> packed E2M1 ``[M, K/2]`` (NVFP4, MXFP4) or E4M3 ``[M, K]`` (MXFP8) plus one
scale per block, written directly in the 5-D TCGEN layout (or row-major where the op says so)
with every padding byte zeroed by the kernel. The D2 chain is bit-identical to
:mod:`blockscale.reference` on every target; the kernel IR lives in
:mod:`blockscale.ops.quantize_ir` (imported only to build). Grouped and fused-activation
variants: :mod:`blockscale.ops.quantize_grouped`, :mod:`blockscale.ops.quantize_silu`; the AMD
entry points: :mod:`blockscale.ops.quantize_amd`.

Per-target instructions: sm_90a exact fma-based E2M1 (``convert.e2m1x8_pack_fast``) +
``cvt.rn.satfinite.e4m3x2.f32``; sm_100a
``cvt.rn.satfinite.e2m1x2.f32`` and ``cvt.rp.satfinite.ue8m0x2.f32``; gfx950
``v_cvt_scalef32_pk_fp4_f32`` for MXFP4 (power-of-two scales); gfx942 software. The scale
reciprocal is always an IEEE division (``div.rn.f32``), never ``rcp.approx`` (CUDA NVFP4
kernels divide once per scale byte into a shared table, per launch when dense, per tile's expert
when grouped or fused; MX reciprocals are exact powers
of two built from the byte). Performance model: :mod:`blockscale.ops.quantize_ir`.

Importing this module does not import MLIR.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.layouts import TCGEN_5D, ScaleLayout, scale_shape
from blockscale.ops._matmul_host import CheckMemo, array_key, device_and_target

BLOCK = (256, 1, 1)
KERNEL_SOURCES = ("blockscale.ops.quantize_ir", "blockscale.ops.quantize_pipe_ir",
                  "blockscale.compiler.arch.convert",
                  "blockscale.ops._expf_ir", "blockscale.activations")
MODES = ("dense", "grouped", "silu")
#: blocks a launch aims for (132 SMs x 16 resident blocks of 256 threads would be 2112).
TARGET_BLOCKS = 2048
#: blocks of a dense launch (grid-stride loop): one resident wave on an H200, 132 SMs x 6
#: blocks of 256 threads (the dense CUDA kernels are capped at 40 registers,
#: quantize_ir.MAX_REGISTERS). 2048 equal blocks were 2.6-3.1 waves: the last one ran with a
#: fraction of the bytes in flight. On a GPU with fewer slots the extra blocks simply queue.
RESIDENT_BLOCKS = 792
#: SMs of the GPU the dense launches are sized for (H200)
SMS = 132
#: resident 256-thread blocks per SM of the pipelined dense kernels by ``pipeline`` depth
#: (their register caps in quantize_ir: 40, 40, 48 -> 6, 6, 5 blocks)
PIPELINE_BLOCKS_PER_SM = {1: 6, 2: 6, 3: 5}
#: ``pipeline`` of the dense kernel the ops use on sm_90a when K % 16 == 0 (0: the base
#: kernel). Measured on the H200 (run D, 2026-11-30, % of D2D copy at 16384^2 / 8192^2):
#: NVFP4 base 72 / 68 %, p1 90 / 83 %, p2 80 / 82 %; MXFP8 base 78 / 79 %, p1 92 / 90 %.
#: Other targets keep the base kernel (the variants are bit-identical there, not measured).
DEFAULT_PIPELINE = 1
#: whether the ops use the ``bf16x2`` MXFP4 variant when they use a pipelined sm_90a kernel
#: (run D: MXFP4 p1 90 / 84 %, p1 + bf16x2 95 / 86 %)
DEFAULT_BF16X2 = True
#: the targets the defaults above apply to (where they were measured)
PIPELINE_TARGETS = ("sm_90a",)


def default_variant(fmt_name: str, target: str, m: int, k: int) -> tuple[int, bool]:
    """(pipeline, bf16x2) of the dense kernel the ops use for an ``[m, k]`` input."""
    if target not in PIPELINE_TARGETS or k % 16 or m >= PIPELINE_MAX_ROWS:
        return 0, False
    return DEFAULT_PIPELINE, DEFAULT_BF16X2 and bool(DEFAULT_PIPELINE) and fmt_name == "mxfp4"


@dataclasses.dataclass(frozen=True)
class QuantizeSpec(FormatSpec):
    """What one quantize kernel is specialised on.

    Attributes:
        fmt: "nvfp4" | "mxfp4" | "mxfp8".
        target: a GPUTarget name.
        rounding: E8M0 scale rounding for MX formats ("up" | "even" | "floor"); None for NVFP4.
        layout: "tcgen5d" or "row_major" (dense only).
        aligned: K % 8 == 0 (16-byte vector loads and 4/8-byte vector stores).
        mode: "dense", "grouped" (per-expert, §2.5) or "silu" (fused gated activation, §7.5).
        gather: grouped with ``indices`` (row i reads ``x[indices[i] // indices_divisor]``).
        activation, act_alpha, act_limit: the gated activation of mode "silu".
        name: the kernel symbol's base name (the op it serves).
        pipeline: dense aligned kernels only: 0 = the base kernel; P >= 1 = the pipelined
            kernel (:mod:`blockscale.ops.quantize_pipe_ir`, needs K % 16 == 0) with P row
            groups of loads in flight per thread (1, 2 or 3).
        bf16x2: MXFP4 on sm_90a with pipeline >= 1: E2M1 rounding on bf16 pairs
            (``quantize_pipe_ir.e2m1x8_mx_bf16x2``, exact since MX reciprocals are powers
            of two).
    """

    fmt: str
    target: str = "sm_90a"
    rounding: str | None = None
    layout: str = "tcgen5d"
    aligned: bool = True
    mode: str = "dense"
    gather: bool = False
    activation: str = "silu"
    act_alpha: float = 1.0
    act_limit: float = math.inf
    name: str = "quantize_dynamic_scaled_fp4fp8"
    pipeline: int = 0
    bf16x2: bool = False

    op: ClassVar[str] = "quantize"
    block: ClassVar[tuple[int, int, int]] = BLOCK

    def __post_init__(self) -> None:
        from blockscale.ops._matmul_host import check_choice, target_name

        fmt = Format.from_name(self.fmt)
        object.__setattr__(self, "fmt", fmt.name)
        object.__setattr__(self, "rounding", fmt.resolve_scale_rounding(self.rounding))
        object.__setattr__(self, "target", target_name(self.target))
        check_choice(self.layout, ("tcgen5d", "row_major"), "layout")
        check_choice(self.mode, MODES, "mode")
        check_choice(self.activation, ("silu", "swiglu_oai"), "activation")
        if self.mode != "dense" and self.layout != "tcgen5d":
            raise ValueError(f"layout must be 'tcgen5d' for mode {self.mode!r}, "
                             f"got {self.layout!r}")
        if self.gather and self.mode != "grouped":
            raise ValueError(f"gather needs mode 'grouped', got mode {self.mode!r}")
        if not isinstance(self.pipeline, int) or isinstance(self.pipeline, bool):
            raise TypeError(f"pipeline must be an int, got {type(self.pipeline).__name__}")
        check_choice(self.pipeline, (0, *PIPELINE_BLOCKS_PER_SM), "pipeline")
        if self.pipeline and not (self.mode == "dense" and self.aligned):
            raise ValueError(f"pipeline needs mode 'dense' and aligned=True, got mode "
                             f"{self.mode!r}, aligned={self.aligned!r}")
        if self.bf16x2 and not (self.fmt == "mxfp4" and self.target == "sm_90a"
                                and self.pipeline):
            raise ValueError(f"bf16x2 needs fmt 'mxfp4', target 'sm_90a' and pipeline >= 1, "
                             f"got fmt {self.fmt!r}, target {self.target!r}, pipeline "
                             f"{self.pipeline!r}")

    @property
    def kernel_name(self) -> str:
        parts = [self.name, self.fmt, self.rounding or "rn",
                 "5d" if self.layout == "tcgen5d" else "rm", "v" if self.aligned else "s"]
        if self.gather:
            parts.append("gather")
        if self.mode == "silu":
            parts.append(self.activation)
        if self.pipeline:
            parts.append(f"p{self.pipeline}")
        if self.bf16x2:
            parts.append("bf16x2")
        return "_".join(parts)

    def args(self) -> tuple[KernelArg, ...]:
        return kernel_args(self)


def kernel_args(spec: QuantizeSpec) -> tuple[KernelArg, ...]:
    """The launch parameters of ``spec``'s kernel, in order."""
    fmt = spec.format
    data_dt = "uint8" if fmt.is_fp4 else "float8_e4m3fn"
    scale_dt = "float8_e8m0fnu" if fmt.is_mx else "float8_e4m3fn"
    args = [KernelArg("x", "buffer", "bfloat16"),
            KernelArg("data", "buffer", data_dt, "out"),
            KernelArg("scales", "buffer", scale_dt, "out")]
    if spec.mode in ("grouped", "silu"):
        args += [KernelArg("expert_start", "buffer", "int32"),
                 KernelArg("scales_offsets", "buffer", "int32"),
                 KernelArg("expert_ids", "buffer", "int32"),
                 KernelArg("tensor_sf", "buffer", "float32")]
        if spec.gather:
            args += [KernelArg("indices", "buffer", "int32"),
                     KernelArg("indices_divisor", "scalar", "i32")]
        args += [KernelArg("num_groups", "scalar", "i32"),
                 KernelArg("search_steps", "scalar", "i32")]
    else:
        args.append(KernelArg("tensor_sf", "scalar", "f32"))
    args += [KernelArg(n, "scalar", "i64") for n in
             ("m", "k", "kblocks_row", "chunks_row", "n_tiles", "tiles_per_step")]
    args += [KernelArg(n, "scalar", "i32") for n in ("tile_iters", "cb_log2", "split_log2")]
    return tuple(args)


def chunk_elems(spec: QuantizeSpec) -> int:
    """Elements a thread quantizes per row visit: 16 for aligned quantize kernels (dense,
    grouped, fused activation: two 16-byte loads per input in flight, a whole NVFP4 block per
    thread: no shuffle, one scale computation per 16 elements), else 8 (one 16-byte load or
    eight scalar loads; the fused matmul-SwiGLU kernel, mode "swiglu", keeps 8)."""
    return 16 if spec.mode in MODES and spec.aligned else 8


def build(spec: QuantizeSpec) -> Any:
    """The kernel module of ``spec`` (imports MLIR)."""
    from blockscale.ops import quantize_ir

    return quantize_ir.build(spec)


# ---- launch plan -----------------------------------------------------------------------------


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def launch_plan(spec: QuantizeSpec, m: int, k: int, n_tiles: int
                ) -> tuple[tuple[int, int, int], dict[str, int]]:
    """Grid and scalar arguments for ``m`` output rows, logical ``k`` and ``n_tiles`` tiles
    of 128 rows to visit (see :mod:`blockscale.ops.quantize_ir` for the decomposition)."""
    fmt = spec.format
    lanes = fmt.block_size // chunk_elems(spec)
    kblocks = fmt.kblocks(k)
    kblocks_row = -(-kblocks // 4) * 4 if spec.layout == "tcgen5d" else kblocks
    chunks_row = kblocks_row * lanes
    # chunk lanes per row: at least BLOCK/128 so a block never spans more than one 128-row
    # tile (a row-major NVFP4 row of K <= 16 is a single 16-element chunk)
    cb = min(BLOCK[0], max(BLOCK[0] // 128, _pow2_ceil(chunks_row)))
    gx = -(-chunks_row // cb)
    rpb = BLOCK[0] // cb
    max_splits = 128 // rpb
    want = -(-TARGET_BLOCKS // max(1, gx * n_tiles))
    splits = max(1, min(max_splits, _pow2_ceil(want)))
    tiles_per_step = max(1, min(n_tiles, 65535 // splits))
    tile_iters = -(-n_tiles // tiles_per_step)
    grid = (gx, tiles_per_step * splits, 1)
    if spec.mode == "dense":
        # The dense kernel loops over row groups with a grid stride (quantize_ir): about one
        # resident wave of blocks, so no partial last wave (see RESIDENT_BLOCKS).
        n_groups = n_tiles * 128 // rpb
        grid = (gx, max(1, min(n_groups, resident_blocks(spec) // gx)), 1)
    scalars = {"m": m, "k": k, "kblocks_row": kblocks_row, "chunks_row": chunks_row,
               "n_tiles": n_tiles, "tiles_per_step": tiles_per_step, "tile_iters": tile_iters,
               "cb_log2": cb.bit_length() - 1, "split_log2": splits.bit_length() - 1}
    return grid, scalars


def resident_blocks(spec: QuantizeSpec) -> int:
    """Blocks of one resident wave of a dense launch of ``spec`` on an H200."""
    if spec.pipeline:
        return SMS * PIPELINE_BLOCKS_PER_SM[spec.pipeline]
    return RESIDENT_BLOCKS


#: rows the pipelined kernels take (they count rows in i32, prefetch rows included; D12)
PIPELINE_MAX_ROWS = 1 << 30


def check_pipeline_shape(spec: QuantizeSpec, m: int, k: int) -> None:
    """ValueError unless the pipelined kernel of ``spec`` can take ``[m, k]``."""
    if spec.pipeline and k % 16:
        raise ValueError(f"x.shape[1] must be a multiple of 16 for pipeline="
                         f"{spec.pipeline}, got {k}")
    if spec.pipeline and m >= PIPELINE_MAX_ROWS:
        raise ValueError(f"x.shape[0] must be < {PIPELINE_MAX_ROWS} for pipeline="
                         f"{spec.pipeline}, got {m}")


def launch(spec: QuantizeSpec, grid: tuple[int, int, int], outs: dict[str, tuple[tuple, Any]],
           buffers: dict[str, Any], scalars: dict[str, Any], device: Any) -> dict[str, Any]:
    """Get the kernel, allocate the outputs ``outs`` (name -> (shape, dtype)), launch it.

    Numpy inputs are copied to the device; numpy in gives numpy out, else device arrays.
    """
    from blockscale.ops import _core

    _, out = _core.launch_op(spec, grid, [(n, shape, np.dtype(dt)) for n, (shape, dt)
                                          in outs.items()], buffers, scalars, device)
    return out


# ---- argument checks ---------------------------------------------------------------------------


def check_input(x: Any, arg: str = "x") -> tuple[int, int]:
    """Shape of a bf16 ``[M, K]`` input (numpy or device array)."""
    import ml_dtypes

    from blockscale.ops._matmul_host import check_dtype, shape_of

    shape = shape_of(x, arg, 2)
    check_dtype(x, np.dtype(ml_dtypes.bfloat16), arg)
    return shape


def check_tensor_sf(fmt: Format, tensor_sf: Any) -> float:
    """A positive finite float32 tensor scale; exactly 1.0 for MX formats (D9)."""
    from blockscale.ops._matmul_host import finite_f32

    v = finite_f32(tensor_sf, "tensor_sf")
    if v <= 0:
        raise ValueError(f"tensor_sf must be > 0, got {tensor_sf!r}")
    if fmt.is_mx and v != 1.0:
        raise ValueError(f"tensor_sf must be 1.0 for {fmt.name} (E8M0 scales take no tensor "
                         f"scale, D9), got {tensor_sf!r}")
    return v


def out_dtypes(fmt: Format) -> tuple[np.dtype, np.dtype]:
    """(data dtype, scale dtype) of ``fmt``'s outputs."""
    return np.dtype(fmt.elem_dtype), np.dtype(fmt.scale_dtype)


def _empty(device_like: bool, device: Any, shape: tuple, dt: np.dtype) -> Any:
    return np.zeros(shape, dt) if not device_like else device.zeros(shape, dt)


# ---- dense ops ---------------------------------------------------------------------------------


#: (x's type/shape/dtype, format, rounding, layout, device, target, name, variant, sizing
#: constants) -> (device, spec, grid, scalars without tensor_sf, outputs) of a dense launch
_DENSE_CALLS = CheckMemo()


def _dense(x: Any, fmt: Format, tsf: float, rounding: str | None, layout: ScaleLayout,
           device: Any, target: str | None, name: str, pipeline: int | None = None,
           bf16x2: bool = False) -> tuple[Any, Any]:
    # Everything below but the launch is a pure function of this key when ``device`` is a
    # Device (a name may resolve differently as the environment changes): memoized, so a
    # repeated call skips the checks (a bad argument never gets stored) and the planning.
    key = (array_key(x), fmt.name, rounding, layout, device, target, name, pipeline, bf16x2,
           RESIDENT_BLOCKS, SMS, TARGET_BLOCKS, DEFAULT_PIPELINE, DEFAULT_BF16X2)
    hit = _DENSE_CALLS.get(key)
    if hit is None:
        m, k = check_input(x)
        fmt.check_k(k, "x.shape[1]")
        dev, tgt = device_and_target(device, target)
        data_dt, scale_dt = out_dtypes(fmt)
        sshape = scale_shape(layout, m, fmt.kblocks(k))
        dshape = (m, fmt.data_cols(k))
        if m == 0 or k == 0:
            dl = not isinstance(x, np.ndarray)
            return _empty(dl, dev, dshape, data_dt), _empty(dl, dev, sshape, scale_dt)
        lay = "tcgen5d" if layout is TCGEN_5D else "row_major"
        if pipeline is None:
            pipeline, bf16x2 = default_variant(fmt.name, tgt, m, k)
        spec = QuantizeSpec(fmt.name, tgt, rounding, lay, k % 8 == 0, name=name,
                            pipeline=pipeline, bf16x2=bf16x2)
        check_pipeline_shape(spec, m, k)
        grid, scalars = launch_plan(spec, m, k, -(-m // 128))
        hit = (dev, spec, grid, scalars, (("data", (dshape, data_dt)),
                                          ("scales", (sshape, scale_dt))))
        if hasattr(device, "launch"):
            _DENSE_CALLS.put(key, hit)
    dev, spec, grid, scalars, outs = hit
    out = launch(spec, grid, dict(outs), {"x": x}, {**scalars, "tensor_sf": tsf}, dev)
    return out["data"], out["scales"]


def quantize_dynamic_scaled_fp4fp8(x: Any, fmt: Format | str, *, tensor_sf: float = 1.0,
                                   scale_rounding: str | None = None,
                                   scale_layout: ScaleLayout | str = TCGEN_5D,
                                   device: Any = None, target: str | None = None
                                   ) -> tuple[Any, Any]:
    """The generic quantize kernel (§2.1) for NVFP4, MXFP4 and MXFP8.

    Args:
        x: bfloat16 ``[M, K]`` (numpy or device array); FP4 needs K even, MXFP8 any K.
        fmt: the format.
        tensor_sf: NVFP4 encode scale (``1/input_scale``); 1.0 for MX formats (D9).
        scale_rounding: MX E8M0 rounding ("up" default, "even", "floor"); None for NVFP4.
        scale_layout: TCGEN_5D (default) or ROW_MAJOR.
        device: "cuda" | "hip" | "interp" | a Device; None: best available.
        target: kernel target; None: the device's.

    Returns:
        ``(data, scales)`` as :func:`blockscale.reference.quantize_dynamic_block_scaled`.
    """
    fmt = Format.from_name(fmt)
    tsf = check_tensor_sf(fmt, tensor_sf)
    rounding = fmt.resolve_scale_rounding(scale_rounding)
    return _dense(x, fmt, tsf, rounding, ScaleLayout.parse(scale_layout), device, target,
                  "quantize_dynamic_scaled_fp4fp8")


def quantize_dense_variant(x: Any, fmt: Format | str, *, pipeline: int, bf16x2: bool = False,
                           tensor_sf: float = 1.0, scale_rounding: str | None = None,
                           scale_layout: ScaleLayout | str = TCGEN_5D, device: Any = None,
                           target: str | None = None) -> tuple[Any, Any]:
    """:func:`quantize_dynamic_scaled_fp4fp8` with the dense kernel variant chosen by
    ``pipeline`` (0: the base kernel; 1-3: the pipelined kernel, K % 16 == 0) and ``bf16x2``
    (see :class:`QuantizeSpec`). Same bytes for every variant; for tests and benchmarks."""
    fmt = Format.from_name(fmt)
    tsf = check_tensor_sf(fmt, tensor_sf)
    rounding = fmt.resolve_scale_rounding(scale_rounding)
    return _dense(x, fmt, tsf, rounding, ScaleLayout.parse(scale_layout), device, target,
                  "quantize_dynamic_scaled_fp4fp8", pipeline, bf16x2)


def quantize_dynamic_scaled_fp4_async(x: Any, *, tensor_sf: float = 1.0, device: Any = None,
                                      target: str | None = None) -> tuple[Any, Any]:
    """NVFP4 quantize with 5-D scales for K % 64 == 0 (MAX's TMA kernel, §2.2).

    On sm_90a / sm_100a this runs the TMA + mbarrier kernel of
    :mod:`blockscale.ops.quantize_async`; other targets run the generic kernel (same bytes).
    Raises ValueError unless K % 64 == 0.
    """
    from blockscale.formats import NVFP4
    from blockscale.ops import quantize_async
    from blockscale.ops._matmul_host import device_and_target

    m, k = check_input(x)
    if k % 64:
        raise ValueError(f"x.shape[1] must be a multiple of 64 for the async NVFP4 kernel, "
                         f"got {k}")
    tsf = check_tensor_sf(NVFP4, tensor_sf)
    dev, tgt = device_and_target(device, target)
    if m == 0 or k == 0 or not quantize_async.uses_tma(tgt):
        return _dense(x, NVFP4, tsf, None, TCGEN_5D, dev, tgt, "quantize_dynamic_scaled_fp4fp8")
    return quantize_async.quantize_fp4_async(x, tsf, dev, tgt)


def quantize_dynamic_block_scaled(x: Any, fmt: Format | str, *, tensor_sf: float = 1.0,
                                  scale_rounding: str | None = None,
                                  scale_layout: ScaleLayout | str = TCGEN_5D,
                                  device: Any = None, target: str | None = None
                                  ) -> tuple[Any, Any]:
    """Quantize dispatcher (§2.3): same arguments and results as the reference.

    hip targets with MXFP4 and row-major scales (K % 32 == 0) use the AMD kernel
    (:func:`blockscale.ops.quantize_amd.quantize_mxfp4_amd`, with ``scale_rounding`` as given,
    default "up"); everything else the generic kernel. Unlike MAX, NVFP4 does not go to the
    TMA kernel (:func:`quantize_dynamic_scaled_fp4_async`): on the H200 the generic kernel is
    faster (16384x16384: 0.243 ms vs 0.324 ms; 8192x8192: 0.081 vs 0.106 ms, commit 7109a01,
    benchmarks/RESULTS.md); both give the same bytes.
    """
    # the checks below depend only on this key when ``device`` is a Device (see _dense)
    memo = hasattr(device, "launch")
    key = (array_key(x), fmt, type(tensor_sf), tensor_sf, scale_rounding, scale_layout,
           device, target) if memo else None
    hit = _DISPATCHED.get(key) if memo else None
    if hit is not None:
        return _dense(x, *hit, "quantize_dynamic_scaled_fp4fp8")
    fmt = Format.from_name(fmt)
    layout = ScaleLayout.parse(scale_layout)
    tsf = check_tensor_sf(fmt, tensor_sf)
    rounding = fmt.resolve_scale_rounding(scale_rounding)
    _, k = check_input(x)
    dev, tgt = device_and_target(device, target)
    from blockscale.compiler.targets import GPUTarget

    if (GPUTarget.parse(tgt).is_hip and fmt.name == "mxfp4" and layout is not TCGEN_5D
            and k % 32 == 0):
        from blockscale.ops.quantize_amd import quantize_mxfp4_amd

        return quantize_mxfp4_amd(x, scale_rounding=rounding, device=dev, target=tgt)
    if memo:
        _DISPATCHED.put(key, (fmt, tsf, rounding, layout, dev, tgt))
    return _dense(x, fmt, tsf, rounding, layout, dev, tgt, "quantize_dynamic_scaled_fp4fp8")


#: quantize_dynamic_block_scaled's checked arguments of the generic kernel per call signature
_DISPATCHED = CheckMemo()


# ---- compiled kernels (all asm stages) ---------------------------------------------------------


def kernel(spec_or_fmt: QuantizeSpec | Format | str, target: str = "sm_90a", **fields: Any
           ) -> Any:
    """The compiled Kernel (``.asm[...]``, ``.meta``) of a spec or of a format + spec fields."""
    from blockscale.ops._matmul_host import compile_spec

    spec = spec_or_fmt if isinstance(spec_or_fmt, QuantizeSpec) else QuantizeSpec(
        Format.from_name(spec_or_fmt).name, target=target, **fields)
    return compile_spec(spec)


def quantize_dynamic_scaled_fp4fp8_kernel(fmt: Format | str, target: str = "sm_90a",
                                          **fields: Any) -> Any:
    """Compiled Kernel of the generic quantize kernel for ``fmt`` on ``target``."""
    return kernel(fmt, target, **fields)


def quantize_dynamic_scaled_fp4_async_kernel(target: str = "sm_90a", **fields: Any) -> Any:
    """Compiled Kernel behind :func:`quantize_dynamic_scaled_fp4_async` (the TMA kernel on
    sm_90a / sm_100a, else the generic one)."""
    from blockscale.ops import quantize_async

    if quantize_async.uses_tma(target) and not fields:
        return quantize_async.kernel(target)
    return kernel("nvfp4", target, **fields)


def bundle_specs(target: str = "sm_90a") -> list[QuantizeSpec]:
    """Every quantize spec the GPU tests and benchmarks use on ``target``."""
    specs = []
    for aligned in (True, False):
        specs += [QuantizeSpec("nvfp4", target, None, "tcgen5d", aligned),
                  QuantizeSpec("mxfp4", target, "up", "tcgen5d", aligned),
                  QuantizeSpec("mxfp8", target, "up", "tcgen5d", aligned)]
    from blockscale.ops import quantize_async

    if quantize_async.uses_tma(target):
        specs += [quantize_async.AsyncQuantizeSpec(target)]
    specs += [QuantizeSpec("mxfp4", target, r, "tcgen5d", True) for r in ("even", "floor")]
    # the pipelined dense variants (benchmarks/bench_quantize.py rows, DEFAULT_PIPELINE)
    specs += [QuantizeSpec(f, target, None if f == "nvfp4" else "up", "tcgen5d", True,
                           pipeline=p)
              for p in PIPELINE_BLOCKS_PER_SM for f in ("nvfp4", "mxfp4", "mxfp8")]
    if target == "sm_90a":
        specs += [QuantizeSpec("mxfp4", target, r, "tcgen5d", True, pipeline=p, bf16x2=True)
                  for p in PIPELINE_BLOCKS_PER_SM for r in ("up",)]
        specs += [QuantizeSpec("mxfp4", target, r, "tcgen5d", True, pipeline=2, bf16x2=True)
                  for r in ("even", "floor")]
    # what the ops dispatch to for K % 16 == 0 (default_variant), every rounding and layout
    for f, roundings in (("nvfp4", (None,)), ("mxfp4", ("up", "even", "floor")),
                         ("mxfp8", ("up", "even", "floor"))):
        p, b = default_variant(f, target, 1, 16)
        if p:
            specs += [QuantizeSpec(f, target, r, lay, True, pipeline=p, bf16x2=b)
                      for r in roundings for lay in ("tcgen5d", "row_major")]
    from blockscale.ops import quantize_amd, quantize_grouped, quantize_silu

    for mod in (quantize_grouped, quantize_silu, quantize_amd):
        specs += mod.bundle_specs(target)
    return specs


def quantize_dynamic_scaled_async_fp4_kernel(target: str = "sm_90a", **fields: Any) -> Any:
    """MAX's ``quantize_dynamic_scaled_async_fp4_kernel`` (its word order): the compiled Kernel
    of :func:`quantize_dynamic_scaled_fp4_async_kernel`."""
    return quantize_dynamic_scaled_fp4_async_kernel(target, **fields)


__all__ = [
    "QuantizeSpec",
    "build",
    "bundle_specs",
    "kernel",
    "kernel_args",
    "launch_plan",
    "quantize_dense_variant",
    "quantize_dynamic_block_scaled",
    "quantize_dynamic_scaled_async_fp4_kernel",
    "quantize_dynamic_scaled_fp4_async",
    "quantize_dynamic_scaled_fp4_async_kernel",
    "quantize_dynamic_scaled_fp4fp8",
    "quantize_dynamic_scaled_fp4fp8_kernel",
]


import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)

_core.register_op_module(__name__)

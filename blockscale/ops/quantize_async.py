"""NVFP4 quantize through TMA + mbarrier (MAX's ``quantize_dynamic_scaled_fp4_async``, §2.2).

bf16 ``[M, K]`` with ``K % 64 == 0`` -> packed E2M1 ``[M, K/2]`` + E4M3 scales in the 5-D TCGEN
layout, byte-identical to :func:`blockscale.reference.quantize_dynamic_block_scaled` (D1-D7).
On CUDA targets (sm_90a, sm_100a) one block of 160 threads quantizes a 128 x 64 tile loaded
by the bulk tensor copy engine (``cp.async.bulk.tensor``, 128-byte swizzle) and signalled by
an mbarrier; the kernel IR and its design are in :mod:`blockscale.ops.quantize_async_ir`.

The input reaches the kernel twice: as the buffer ``x`` (whose address the runtime needs) and
as the tensormap ``x_map`` over it (box 64 x 128, swizzle 128b), whose launch value is the
dims ``(K, M)``; see the "tensormap" kind in :mod:`blockscale.launch`.

Importing this module does not import MLIR.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from blockscale.launch import KernelArg

KERNEL_SOURCES = ("blockscale.ops.quantize_async_ir", "blockscale.ops.quantize_ir",
                  "blockscale.compiler.arch.convert", "blockscale.compiler.arch.tma")
TILE_ROWS, TILE_COLS = 128, 64
#: the targets with TMA (others run the generic kernel, see :func:`quantize_fp4_async`).
TMA_TARGETS = ("sm_90a", "sm_100a")


@dataclasses.dataclass(frozen=True)
class AsyncQuantizeSpec:
    """The TMA quantize kernel (NVFP4 only, 5-D scales, K % 64 == 0) for ``target``."""

    target: str = "sm_90a"

    op: ClassVar[str] = "quantize_async"
    block: ClassVar[tuple[int, int, int]] = (TILE_ROWS + 32, 1, 1)
    kernel_name: ClassVar[str] = "quantize_dynamic_scaled_fp4_async_tma"

    def __post_init__(self) -> None:
        from blockscale.ops._matmul_host import target_name

        name = target_name(self.target)
        if name not in TMA_TARGETS:
            raise ValueError(f"target must be one of {TMA_TARGETS} for the TMA quantize "
                             f"kernel, got {name!r}")
        object.__setattr__(self, "target", name)

    def args(self) -> tuple[KernelArg, ...]:
        return kernel_args()


def kernel_args() -> tuple[KernelArg, ...]:
    """The launch parameters of the TMA kernel, in order."""
    return (KernelArg("x", "buffer", "bfloat16"),
            KernelArg("x_map", "tensormap", "bfloat16", tensor="x",
                      box=(TILE_COLS, TILE_ROWS), swizzle="128b"),
            KernelArg("data", "buffer", "uint8", "out"),
            KernelArg("scales", "buffer", "float8_e4m3fn", "out"),
            KernelArg("tensor_sf", "scalar", "f32"),
            KernelArg("m", "scalar", "i64"),
            KernelArg("k", "scalar", "i64"))


def build(spec: AsyncQuantizeSpec) -> Any:
    """The kernel module of ``spec`` (imports MLIR)."""
    from blockscale.ops import quantize_async_ir

    return quantize_async_ir.build(spec)


def launch_plan(m: int, k: int) -> tuple[tuple[int, int, int], dict[str, Any]]:
    """Grid ``(K / 64, ceil(M / 128))`` and the values of the non-buffer args."""
    if k % TILE_COLS or m < 1:
        raise ValueError(f"the TMA kernel needs M >= 1 and K % 64 == 0, got M={m}, K={k}")
    rows = -(-m // TILE_ROWS)
    if rows >= 2**16:
        raise ValueError(f"x has {m} rows; the TMA kernel's grid allows at most "
                         f"{(2**16 - 1) * TILE_ROWS}")
    return (k // TILE_COLS, rows, 1), {"x_map": (k, m), "m": m, "k": k}


def uses_tma(target: str) -> bool:
    """Whether ``target`` runs the TMA kernel (else the generic kernel serves the op)."""
    return target in TMA_TARGETS


def quantize_fp4_async(x: Any, tensor_sf: float, device: Any, target: str) -> tuple[Any, Any]:
    """Run the TMA kernel on a checked bf16 ``x`` (``K % 64 == 0``, M, K > 0): numpy in gives
    numpy out, device arrays in give device arrays out."""
    from blockscale.formats import NVFP4
    from blockscale.layouts import TCGEN_5D, scale_shape
    from blockscale.ops import _core

    m, k = (int(s) for s in x.shape)
    grid, values = launch_plan(m, k)
    values["tensor_sf"] = float(tensor_sf)
    _core.check_buffers({"x": x}, device)  # before any kernel is fetched or compiled
    kernel = _core.get_kernel(AsyncQuantizeSpec(target))
    host = isinstance(x, np.ndarray)
    xd = device.to_device(np.ascontiguousarray(x)) if host else x
    data = device.alloc((m, k // 2), np.dtype(np.uint8))
    scales = device.alloc(scale_shape(TCGEN_5D, m, NVFP4.kblocks(k)),
                          np.dtype(NVFP4.scale_dtype))
    bound = {"x": xd, "data": data, "scales": scales, **values}
    _core.run_kernel(kernel, grid, [bound[a.name] for a in kernel.args], device)
    if host:
        return device.to_host(data), device.to_host(scales)
    return data, scales


def kernel(target: str = "sm_90a") -> Any:
    """The compiled Kernel (``.asm[...]``, ``.meta``) of the TMA quantize kernel."""
    from blockscale.ops._matmul_host import compile_spec

    return compile_spec(AsyncQuantizeSpec(target))


def quantize_dynamic_scaled_async_fp4_kernel(target: str = "sm_90a") -> Any:
    """The compiled TMA kernel under MAX's kernel name (§2.2); see :func:`kernel`."""
    return kernel(target)


__all__ = [
    "AsyncQuantizeSpec",
    "build",
    "kernel",
    "kernel_args",
    "launch_plan",
    "quantize_dynamic_scaled_async_fp4_kernel",
    "quantize_fp4_async",
    "uses_tma",
]

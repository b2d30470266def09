"""``block_scales_interleave``: rank-2 scales ``[R, J]`` -> 5-D TCGEN layout, as a GPU kernel.

Output shape ``[ceil(R/128), ceil(J/4), 32, 4, 4]`` (SEMANTICS §1.3, §3): byte
``(i0, i1, i2, i3, i4)`` holds ``S[i0*128 + i3*32 + i2, i1*4 + i4]``, or zero in the padding
(rows >= R, K-blocks >= J). The numpy definition is :func:`blockscale.layouts.interleave`.

Kernel: one thread per 16-byte row ``(i0, i1, i2)`` of a 512-byte atom, so consecutive threads
write consecutive 16-byte chunks (one ``st.global.v4.b32`` / ``global_store_dwordx4`` each,
fully coalesced) and every output byte, padding included, is written by the kernel. The 16
bytes are four 4-byte words, word ``i3`` = ``S[row, 4*i1 : 4*i1+4]`` of row
``i0*128 + i3*32 + i2``: one aligned 4-byte load per word when the whole chunk is in bounds
and J % 4 == 0 (``vec_ok``), else byte loads with bounds masks. Shape-generic: one kernel per
(scale dtype, target).

Importing this module does not import MLIR (``build`` does, when called).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from blockscale.launch import KernelArg
from blockscale.ops import _core

#: 1-byte scale dtypes the op accepts (numpy / ml_dtypes names).
SCALE_DTYPES = ("uint8", "float8_e4m3fn", "float8_e8m0fnu")
BLOCK = (256, 1, 1)
ROWS_PER_ATOM, KBLOCKS_PER_ATOM, CHUNK_BYTES = 128, 4, 16
_MAX_CHUNKS = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class InterleaveSpec:
    """The interleave kernel is specialised on the scale dtype and the target only."""

    dtype: str = "uint8"
    target: str = "sm_90a"

    op: ClassVar[str] = "block_scales_interleave"
    block: ClassVar[tuple[int, int, int]] = BLOCK

    def __post_init__(self) -> None:
        if self.dtype not in SCALE_DTYPES:
            raise ValueError(f"dtype must be one of {SCALE_DTYPES}, got {self.dtype!r}")
        from blockscale.compiler.targets import GPUTarget

        object.__setattr__(self, "target", GPUTarget.parse(self.target).name)

    @property
    def kernel_name(self) -> str:
        return "block_scales_interleave"

    def args(self) -> tuple[KernelArg, ...]:
        """scales [R*J] in, out [5-D bytes] out, rows, kblocks, num_chunks, vec_ok."""
        return (KernelArg("scales", "buffer", self.dtype, "in"),
                KernelArg("out", "buffer", self.dtype, "out"),
                KernelArg("rows", "scalar", "i32"), KernelArg("kblocks", "scalar", "i32"),
                KernelArg("num_chunks", "scalar", "i32"), KernelArg("vec_ok", "scalar", "i32"))


# ----------------------------------------------------------------------------- host plan


def output_shape(rows: int, kblocks: int) -> tuple[int, int, int, int, int]:
    """``[ceil(R/128), ceil(J/4), 32, 4, 4]``."""
    return (-(-rows // ROWS_PER_ATOM), -(-kblocks // KBLOCKS_PER_ATOM), 32, 4, 4)


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Grid and scalar arguments of one call."""

    grid: tuple[int, int, int]
    rows: int
    kblocks: int
    num_chunks: int
    vec_ok: int

    def scalars(self) -> list[int]:
        return [self.rows, self.kblocks, self.num_chunks, self.vec_ok]


def launch_plan(rows: int, kblocks: int, *, input_aligned: bool = True) -> LaunchPlan:
    """One thread per 16-byte output chunk; ``vec_ok`` when 4-byte input loads are aligned."""
    d0, d1 = output_shape(rows, kblocks)[:2]
    chunks = d0 * d1 * 32
    if chunks > _MAX_CHUNKS or rows * kblocks > _MAX_CHUNKS:
        raise ValueError(f"scales_2d of shape ({rows}, {kblocks}) is too large: at most "
                         f"{_MAX_CHUNKS} 16-byte output chunks and input bytes")
    grid = (max(1, -(-chunks // BLOCK[0])), 1, 1)
    return LaunchPlan(grid, rows, kblocks, chunks, int(kblocks % 4 == 0 and input_aligned))


# ----------------------------------------------------------------------------- kernel IR


def build(spec: InterleaveSpec) -> Any:
    """The kernel module (gpu.module + gpu.func) for ``spec``."""
    from blockscale.compiler import ir as b

    with b.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as k:
        src, out = k.arg("scales"), k.arg("out")
        rows, kblocks = b.as_index(k.arg("rows")), b.as_index(k.arg("kblocks"))
        chunk = b.global_thread_idx()
        with b.when(b.ult(chunk, b.as_index(k.arg("num_chunks")))):
            i2 = b.urem(chunk, 32)
            slab = b.udiv(chunk, 32)
            d1 = b.ceil_div(kblocks, KBLOCKS_PER_ATOM)
            i1, i0 = b.urem(slab, d1), b.udiv(slab, d1)
            col0 = b.mul(i1, KBLOCKS_PER_ATOM)
            row0 = b.add(b.mul(i0, ROWS_PER_ATOM), i2)
            rows_of = [b.add(row0, 32 * i3) for i3 in range(4)]
            # Fast path: all four rows exist, the four K-blocks exist, 4-byte aligned loads.
            full = b.logical_and(b.ult(rows_of[3], rows), b.ule(b.add(col0, 4), kblocks))
            full = b.logical_and(full, b.ne(k.arg("vec_ok"), 0))
            words_t = b.vec(4, b.i32())
            br = b.if_(full, [words_t])
            with br.then():
                words = [_aligned_word(b, src, b.add(b.mul(r, kblocks), col0)) for r in rows_of]
                br.yield_(b.from_elements(words_t, words))
            with br.else_():
                words = [_masked_word(b, src, r, col0, rows, kblocks) for r in rows_of]
                br.yield_(b.from_elements(words_t, words))
            data = b.bitcast(br.results[0], b.vec(CHUNK_BYTES, b.i8()))
            b.vector_store(data, out, b.mul(chunk, CHUNK_BYTES), alignment=CHUNK_BYTES)
    return k.module


def _aligned_word(b: Any, src: Any, offset: Any) -> Any:
    """S[offset:offset+4] as one little-endian i32 (one 4-byte aligned load)."""
    bytes4 = b.vector_load(b.vec(4, b.i8()), src, offset, alignment=4)
    return b.extract(b.bitcast(bytes4, b.vec(1, b.i32())), 0)


def _masked_word(b: Any, src: Any, row: Any, col0: Any, rows: Any, kblocks: Any) -> Any:
    """S[row, col0:col0+4] as a little-endian i32, zero bytes outside [R, J]."""
    row_ok = b.ult(row, rows)
    base = b.mul(row, kblocks)
    word = b.const(0, b.i32())
    for j in range(4):
        col = b.add(col0, j)
        ok = b.logical_and(row_ok, b.ult(col, kblocks))
        idx = b.select(ok, b.add(base, col), 0)
        byte = b.select(ok, b.load(src, idx), 0)
        word = b.bit_or(word, b.shl(b.cast_int(byte, b.i32()), 8 * j))
    return word


# ----------------------------------------------------------------------------- user API


def _dtype_name(dtype: Any, arg: str) -> str:
    dt = np.dtype(dtype)
    name = "uint8" if dt == np.int8 or dt == np.uint8 else dt.name
    if name not in SCALE_DTYPES:
        raise TypeError(f"{arg} must have a 1-byte scale dtype {SCALE_DTYPES}, got {dt.name}")
    return name


def _input_aligned(x: Any) -> bool:
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0]) % 4 == 0
    return True  # numpy inputs are copied to fresh (aligned) device buffers


def block_scales_interleave(scales_2d: Any, *, device: Any = None,
                            target: str | None = None) -> Any:
    """Interleave rank-2 scales ``[R, J]`` into the 5-D TCGEN layout on a GPU (or the
    interpreter): returns ``[ceil(R/128), ceil(J/4), 32, 4, 4]`` of the same dtype with zero
    padding. Numpy in gives numpy out; device arrays in give a device array out.

    Args:
        scales_2d: uint8 / float8_e4m3fn / float8_e8m0fnu, shape ``[R, J]``.
        device: "cuda" | "hip" | "interp" | a runtime Device | None (best available).
        target: a GPUTarget name; default: the device's.
    """
    from blockscale import runtime

    shape = tuple(getattr(scales_2d, "shape", ()))
    if len(shape) != 2:
        raise ValueError(f"scales_2d must be rank 2 [rows, kblocks], got shape {shape}")
    dtype = _dtype_name(getattr(scales_2d, "dtype", None), "scales_2d")
    rows, kblocks = int(shape[0]), int(shape[1])
    dev = runtime.get_device(device)
    spec = InterleaveSpec(dtype, _core.resolve_target(target, dev))
    host_io = isinstance(scales_2d, np.ndarray)
    out_shape = output_shape(rows, kblocks)
    np_dtype = np.dtype(scales_2d.dtype) if host_io else np.dtype(dtype if dtype != "uint8"
                                                                    else np.uint8)
    if rows == 0 or kblocks == 0:
        empty = np.zeros(out_shape, np_dtype)
        return empty if host_io else dev.to_device(empty)
    plan = launch_plan(rows, kblocks, input_aligned=_input_aligned(scales_2d))
    kernel = _core.get_kernel(spec, build)
    src = dev.to_device(np.ascontiguousarray(scales_2d)) if host_io else scales_2d
    out = dev.alloc(out_shape, np_dtype)
    _core.run_kernel(kernel, plan.grid, [src, out, *plan.scalars()], dev)
    return dev.to_host(out) if host_io else out


def kernel(spec_or_dtype: InterleaveSpec | str | Any = "uint8", target: str = "sm_90a",
           **_shape: Any) -> Any:
    """The compiled ``Kernel`` (``.asm`` stages, ``.binary``) for a spec, a scale dtype, or a
    sample array. The kernel is shape-generic; shape keywords (rows=, kblocks=) are ignored."""
    if isinstance(spec_or_dtype, InterleaveSpec):
        spec = spec_or_dtype
    elif isinstance(spec_or_dtype, str):
        spec = InterleaveSpec(_dtype_name(spec_or_dtype, "dtype"), target)
    else:
        spec = InterleaveSpec(_dtype_name(spec_or_dtype.dtype, "spec_or_dtype"), target)
    return _core.compile_kernel(spec, build)


def bundle_specs(target: str = "sm_90a") -> list[InterleaveSpec]:
    """Every interleave spec the GPU tests and benchmarks use on ``target``."""
    return [InterleaveSpec(d, target) for d in SCALE_DTYPES]


block_scales_interleave.kernel = kernel  # type: ignore[attr-defined]
block_scales_interleave.build = build  # type: ignore[attr-defined]

#: Seed names (MAX ``fp4_quantization``): the launcher and the kernel.
block_scales_interleave_fp4 = block_scales_interleave
block_scales_interleave_fp4_kernel = kernel

_core.register_op_module(__name__)

__all__ = [
    "InterleaveSpec",
    "block_scales_interleave",
    "block_scales_interleave_fp4",
    "block_scales_interleave_fp4_kernel",
    "build",
    "bundle_specs",
    "kernel",
    "launch_plan",
    "output_shape",
]

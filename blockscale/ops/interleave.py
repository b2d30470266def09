"""``block_scales_interleave``: rank-2 scales ``[R, J]`` -> 5-D TCGEN layout, as a GPU kernel.

Output shape ``[ceil(R/128), ceil(J/4), 32, 4, 4]`` (SEMANTICS §1.3, §3): byte
``(i0, i1, i2, i3, i4)`` holds ``S[i0*128 + i3*32 + i2, i1*4 + i4]``, or zero in the padding
(rows >= R, K-blocks >= J). The numpy definition is :func:`blockscale.layouts.interleave`.

Kernel: one thread per group of four 16-byte atom rows ``(i0, i1..i1+3, i2)``. Word ``i3`` of
row ``(i0, i1, i2)`` is ``S[i0*128 + i3*32 + i2, 4*i1 : 4*i1+4]``, so the thread loads 16
contiguous bytes from each of its 4 source rows (one 16-byte load each when J % 16 == 0) and
writes four 16-byte stores; the 32 lanes of a warp (consecutive i2) write 512 contiguous bytes
per store, and every output byte, padding included, is written by the kernel. Near the edges
(or when J % 16 != 0) each chunk falls back to aligned 4-byte loads or to masked byte loads.
Shape-generic: one kernel per (scale dtype, target).

Importing this module does not import MLIR (``build`` does, when called).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from blockscale.compiler.targets import DEFAULT_TARGET  # pure Python, no MLIR
from blockscale.dtypes import as_np_dtype
from blockscale.launch import KernelArg
from blockscale.ops import _core

#: 1-byte scale dtypes the op accepts (numpy / ml_dtypes names).
SCALE_DTYPES = ("uint8", "float8_e4m3fn", "float8_e8m0fnu")
BLOCK = (256, 1, 1)
ROWS_PER_ATOM, KBLOCKS_PER_ATOM, CHUNK_BYTES = 128, 4, 16
#: 16-byte atom rows per thread (consecutive i1): each thread loads 16 contiguous bytes of a row
CHUNKS_PER_THREAD = 4
#: bits of the ``vec_ok`` argument: 4-byte / 16-byte input loads are aligned.
VEC4, VEC16 = 1, 2
_MAX_CHUNKS = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class InterleaveSpec:
    """The interleave kernel is specialised on the scale dtype and the target only."""

    dtype: str = "uint8"
    target: str = DEFAULT_TARGET.name

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
        """scales [R*J] in, out [5-D bytes] out, rows, kblocks, num_groups, vec_ok flags."""
        return (KernelArg("scales", "buffer", self.dtype, "in"),
                KernelArg("out", "buffer", self.dtype, "out"),
                KernelArg("rows", "scalar", "i32"), KernelArg("kblocks", "scalar", "i32"),
                KernelArg("num_groups", "scalar", "i32"), KernelArg("vec_ok", "scalar", "i32"))


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
    num_groups: int
    vec_ok: int

    def scalars(self) -> list[int]:
        return [self.rows, self.kblocks, self.num_groups, self.vec_ok]


def launch_plan(rows: int, kblocks: int, *, input_alignment: int = 16) -> LaunchPlan:
    """One thread per group of CHUNKS_PER_THREAD 16-byte output chunks (same i0, i2,
    consecutive i1). ``vec_ok`` flags the aligned load widths (J and the input base address
    ``input_alignment`` must both be multiples of the width)."""
    d0, d1 = output_shape(rows, kblocks)[:2]
    groups = d0 * (-(-d1 // CHUNKS_PER_THREAD)) * 32
    if d0 * d1 * 32 > _MAX_CHUNKS or rows * kblocks > _MAX_CHUNKS:
        raise ValueError(f"scales_2d of shape ({rows}, {kblocks}) is too large: at most "
                         f"{_MAX_CHUNKS} 16-byte output chunks and input bytes")
    grid = (max(1, -(-groups // BLOCK[0])), 1, 1)
    flags = (VEC4 if kblocks % 4 == 0 and input_alignment % 4 == 0 else 0) | \
        (VEC16 if kblocks % 16 == 0 and input_alignment % 16 == 0 else 0)
    return LaunchPlan(grid, rows, kblocks, groups, flags)


# ----------------------------------------------------------------------------- kernel IR


def build(spec: InterleaveSpec) -> Any:
    """The kernel module (gpu.module + gpu.func) for ``spec``."""
    from blockscale.compiler import ir as b

    with b.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as k:
        src, out = k.arg("scales"), k.arg("out")
        rows, kblocks = b.as_index(k.arg("rows")), b.as_index(k.arg("kblocks"))
        flags = k.arg("vec_ok")
        group = b.global_thread_idx()
        with b.when(b.ult(group, b.as_index(k.arg("num_groups")))):
            i2 = b.urem(group, 32)
            q = b.udiv(group, 32)
            d1 = b.ceil_div(kblocks, KBLOCKS_PER_ATOM)
            d1g = b.ceil_div(d1, CHUNKS_PER_THREAD)
            i1g, i0 = b.urem(q, d1g), b.udiv(q, d1g)
            row0 = b.add(b.mul(i0, ROWS_PER_ATOM), i2)
            rows_of = [b.add(row0, 32 * i3) for i3 in range(4)]
            i1_first = b.mul(i1g, CHUNKS_PER_THREAD)
            col0 = b.mul(i1_first, KBLOCKS_PER_ATOM)
            span = CHUNKS_PER_THREAD * KBLOCKS_PER_ATOM
            # Fast path: 4 rows x 16 K-blocks all in bounds, 16-byte aligned row loads.
            full = b.logical_and(b.ult(rows_of[3], rows), b.ule(b.add(col0, span), kblocks))
            full = b.logical_and(full, b.ne(b.bit_and(flags, VEC16), 0))
            br = b.if_(full, [])
            with br.then():
                words = []  # words[i3][sub]
                for r in rows_of:
                    row16 = b.vector_load(b.vec(span, b.i8()), src,
                                          b.add(b.mul(r, kblocks), col0), alignment=span)
                    w4 = b.bitcast(row16, b.vec(CHUNKS_PER_THREAD, b.i32()))
                    words.append([b.extract(w4, sub) for sub in range(CHUNKS_PER_THREAD)])
                for sub in range(CHUNKS_PER_THREAD):
                    chunk = b.from_elements(b.vec(4, b.i32()), [w[sub] for w in words])
                    _store_chunk(b, out, chunk, i0, b.add(i1_first, sub), d1, i2)
                br.yield_()
            with br.else_():
                for sub in range(CHUNKS_PER_THREAD):
                    i1 = b.add(i1_first, sub)
                    with b.when(b.ult(i1, d1)):
                        chunk = _edge_chunk(b, src, rows_of, i1, rows, kblocks, flags)
                        _store_chunk(b, out, chunk, i0, i1, d1, i2)
                br.yield_()
    return k.module


def _store_chunk(b: Any, out: Any, words: Any, i0: Any, i1: Any, d1: Any, i2: Any) -> None:
    """Store 4 words as the 16 bytes of atom row (i0, i1, i2): one 16-byte store."""
    index = b.add(b.mul(b.add(b.mul(i0, d1), i1), 32), i2)
    data = b.bitcast(words, b.vec(CHUNK_BYTES, b.i8()))
    b.vector_store(data, out, b.mul(index, CHUNK_BYTES), alignment=CHUNK_BYTES)


def _edge_chunk(b: Any, src: Any, rows_of: list[Any], i1: Any, rows: Any, kblocks: Any,
                flags: Any) -> Any:
    """The 4 words of chunk i1 near the edges: aligned 4-byte loads when in bounds, else
    masked byte loads (zero padding)."""
    col0 = b.mul(i1, KBLOCKS_PER_ATOM)
    words_t = b.vec(4, b.i32())
    full = b.logical_and(b.ult(rows_of[3], rows), b.ule(b.add(col0, 4), kblocks))
    full = b.logical_and(full, b.ne(b.bit_and(flags, VEC4), 0))
    br = b.if_(full, [words_t])
    with br.then():
        words = [_aligned_word(b, src, b.add(b.mul(r, kblocks), col0)) for r in rows_of]
        br.yield_(b.from_elements(words_t, words))
    with br.else_():
        words = [_masked_word(b, src, r, col0, rows, kblocks) for r in rows_of]
        br.yield_(b.from_elements(words_t, words))
    return br.results[0]


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
    dt = as_np_dtype(dtype)
    if dt is None:
        raise TypeError(f"{arg} must have a 1-byte scale dtype {SCALE_DTYPES}, got {dtype!r}")
    name = "uint8" if dt == np.int8 or dt == np.uint8 else dt.name
    if name not in SCALE_DTYPES:
        raise TypeError(f"{arg} must have a 1-byte scale dtype {SCALE_DTYPES}, got {dt.name}")
    return name


def _checked_input(x: Any, dev: Any) -> tuple[Any, int]:
    """``(scales_2d for the launch, the largest of 16/4/1 dividing its device address)``,
    checked once, here, so that errors name the user's argument (the kernel's is "scales"):
    numpy passes (copied to a fresh, aligned device buffer: 16); our DeviceArrays of ``dev``
    pass by type; other device memory (torch, CUDA Array Interface, DLPack) is resolved once
    and handed on as a borrowed DeviceArray of ``dev`` over the same memory and stream,
    which :func:`~blockscale.ops._core.launch_op` takes by type without resolving it
    again (what it would do itself: ``_core._borrowed``)."""
    if isinstance(x, np.ndarray):
        return x, 16
    buf = _core._checked_foreign({"scales_2d": x}, dev).get("scales_2d")
    if buf is None:  # a DeviceArray of dev
        ptr = int(x.ptr)
    else:
        ptr = int(buf.ptr)
        if hasattr(dev, "check_foreign_memory"):  # a GpuDevice
            dev.check_foreign_memory(x, "scales_2d")
            if not ptr:  # (not empty: the caller returned before)
                raise ValueError("scales_2d: null pointer")
            from blockscale.runtime.arrays import DeviceArray

            x = DeviceArray._view_of(dev, buf, x)
    return x, 16 if ptr % 16 == 0 else 4 if ptr % 4 == 0 else 1


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
    scales, alignment = _checked_input(scales_2d, dev)  # errors name the user's argument
    plan = launch_plan(rows, kblocks, input_alignment=alignment)
    # the shared launch path: follows torch's current stream (CUDA-graph capture)
    _, out = _core.launch_op(spec, plan.grid, [("out", out_shape, np_dtype)],
                             {"scales": scales},
                             {"rows": plan.rows, "kblocks": plan.kblocks,
                              "num_groups": plan.num_groups, "vec_ok": plan.vec_ok}, dev, build)
    return out["out"]


def kernel(spec_or_dtype: InterleaveSpec | str | Any = "uint8", target: str = DEFAULT_TARGET.name,
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


def bundle_specs(target: str = DEFAULT_TARGET.name) -> list[InterleaveSpec]:
    """Every interleave spec the GPU tests and benchmarks use on ``target``."""
    return [InterleaveSpec(d, target) for d in SCALE_DTYPES]


_core.attach_kernel_api((block_scales_interleave,), kernel, build)

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

"""MLIR types and source locations for the IR builder (re-exported by ``compiler.ir``).

Types are functions creating them in the current context (MLIR uniques them per context);
nothing is created at import time.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

from mlir import ir

from blockscale.launch import SCALAR_TYPES, KernelArg

# ----------------------------------------------------------------------------- locations

_COMPILER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_SKIP_FILES = (contextlib.__file__,)


def caller_location(depth: int = 0, *, context: ir.Context | None = None) -> ir.Location:
    """``ir.Location.file`` of the first Python frame outside ``blockscale/compiler``.

    ``depth`` skips that many further frames (for helpers that wrap helpers).
    """
    frame = sys._getframe(1)
    while frame is not None:
        fname = frame.f_code.co_filename
        if not (fname.startswith(_COMPILER_DIR) or fname in _SKIP_FILES):
            if depth == 0:
                break
            depth -= 1
        frame = frame.f_back
    if frame is None:
        return ir.Location.unknown(context=context)
    return ir.Location.file(frame.f_code.co_filename, frame.f_lineno, 0, context=context)


def _loc(loc: ir.Location | None) -> ir.Location:
    return loc if loc is not None else caller_location()


# ----------------------------------------------------------------------------- types


def i1() -> ir.Type:
    return ir.IntegerType.get_signless(1)


def i8() -> ir.Type:
    return ir.IntegerType.get_signless(8)


def i16() -> ir.Type:
    return ir.IntegerType.get_signless(16)


def i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def i64() -> ir.Type:
    return ir.IntegerType.get_signless(64)


def index() -> ir.Type:
    return ir.IndexType.get()


def f16() -> ir.Type:
    return ir.F16Type.get()


def bf16() -> ir.Type:
    return ir.BF16Type.get()


def f32() -> ir.Type:
    return ir.F32Type.get()


def vec(n: int, elem: ir.Type) -> ir.Type:
    """``vector<n x elem>``."""
    return ir.VectorType.get([n], elem)


def memref_1d(elem: ir.Type) -> ir.Type:
    """``memref<?xelem>``: the type of every buffer parameter (docs/internals.md)."""
    return ir.MemRefType.get([ir.ShapedType.get_dynamic_size()], elem)


#: buffer dtype (launch.BUFFER_DTYPES) -> element type builder. Narrow floats travel as i8.
_BUFFER_ELEMENT_TYPES: dict[str, Callable[[], ir.Type]] = {
    "uint8": i8, "int8": i8, "float8_e4m3fn": i8, "float8_e8m0fnu": i8,
    "int32": i32, "uint32": i32, "int64": i64, "float32": f32, "bfloat16": bf16,
}
_SCALAR_ELEMENT_TYPES: dict[str, Callable[[], ir.Type]] = {"i32": i32, "i64": i64, "f32": f32}


def buffer_element_type(dtype: str) -> ir.Type:
    """MLIR element type of a buffer of numpy dtype name ``dtype`` (launch contract)."""
    try:
        return _BUFFER_ELEMENT_TYPES[dtype]()
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(_BUFFER_ELEMENT_TYPES)}, "
                         f"got {dtype!r}") from None


def scalar_type(dtype: str) -> ir.Type:
    """MLIR type of a scalar kernel parameter ("i32" | "i64" | "f32")."""
    try:
        return _SCALAR_ELEMENT_TYPES[dtype]()
    except KeyError:
        raise ValueError(f"scalar dtype must be one of {sorted(SCALAR_TYPES)}, "
                         f"got {dtype!r}") from None


def kernel_arg_type(arg: KernelArg) -> ir.Type:
    """The gpu.func parameter type of a KernelArg (a tensormap: ``!llvm.ptr``, the generic
    address of the encoded CUtensorMap in global memory; see blockscale.launch)."""
    if arg.kind == "tensormap":
        return ir.Type.parse("!llvm.ptr")
    if arg.kind == "buffer":
        return memref_1d(buffer_element_type(arg.dtype))
    return scalar_type(arg.dtype)


def is_index(t: ir.Type) -> bool:
    return isinstance(t, ir.IndexType)


def is_integer(t: ir.Type) -> bool:
    return isinstance(t, ir.IntegerType)


def is_float(t: ir.Type) -> bool:
    return isinstance(t, ir.FloatType)

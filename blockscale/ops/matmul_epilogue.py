"""Fused matmul epilogues: Python callables that build IR on the output value in the kernel.

An :class:`Epilogue` wraps ``fn(value, ctx) -> value``. ``value`` is the fp32 accumulator after
``alpha`` (an ``mlir.ir.Value`` of type f32); ``ctx`` is an :class:`EpilogueContext` giving the
output coordinates and the epilogue's extra inputs; ``fn`` returns an f32 value (the kernel then
casts it to the output dtype with RNE) or a value already of the output element type (a custom
cast). Everything runs inside the matmul kernel, on the register value, before the single store:
no second kernel, no read-back of C.

Extra inputs (:class:`EpilogueInput`) are flat buffers indexed per row (length M), per column
(length N) or per element (``[M, N]`` row-major); they are float32 or bfloat16 and are loaded
and widened to f32 by :meth:`EpilogueContext.load`.

Ready-made epilogues: :func:`bias`, :func:`residual`, :func:`row_scale`, :func:`col_scale`,
:func:`relu`, :func:`clamp`, and :func:`chain` to compose them (left to right, each on the
result of the previous one). This module does not import MLIR at import time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from collections.abc import Callable
from typing import Any

_INDEX_KINDS = ("row", "col", "elem")
_INPUT_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class EpilogueInput:
    """An extra kernel buffer read by an epilogue.

    Attributes:
        name: the argument name (the keyword the user passes the array under).
        dtype: "float32" or "bfloat16".
        index: "row" (``[M]``, indexed by m), "col" (``[N]``, by n) or "elem" (``[M, N]``).
    """

    name: str
    dtype: str = "float32"
    index: str = "col"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"EpilogueInput name must be an identifier, got {self.name!r}")
        if self.dtype not in _INPUT_DTYPES:
            raise ValueError(f"EpilogueInput {self.name!r}: dtype must be one of "
                             f"{_INPUT_DTYPES}, got {self.dtype!r}")
        if self.index not in _INDEX_KINDS:
            raise ValueError(f"EpilogueInput {self.name!r}: index must be one of "
                             f"{_INDEX_KINDS}, got {self.index!r}")

    def shape(self, m: int, n: int) -> tuple[int, ...]:
        """The array shape this input must have for an ``[m, n]`` output."""
        return {"row": (m,), "col": (n,), "elem": (m, n)}[self.index]


def _callable_fingerprint(fn: Callable[..., Any]) -> str:
    """A stable text identifying what ``fn`` builds: its source (or code object) and the
    reprs of its closure values and defaults. Used in the kernel cache key."""
    parts = [getattr(fn, "__module__", "") or "", getattr(fn, "__qualname__", repr(fn))]
    try:
        parts.append(inspect.getsource(fn))
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        parts.append(repr((code.co_code, code.co_consts, code.co_names)) if code else repr(fn))
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # empty cell
            content = None
        parts.append(content.key if isinstance(content, Epilogue) else repr(content))
    parts.append(repr(getattr(fn, "__defaults__", None)))
    return "\n".join(parts)


class Epilogue:
    """A fused epilogue: ``fn(value_f32, ctx) -> value`` plus the extra inputs it reads.

    ``key`` identifies the IR ``fn`` builds (a hash of its source, closure values, name and
    inputs); two epilogues with the same key must build the same IR. It enters the kernel
    cache key, so give closures only values with a faithful ``repr`` (numbers, strings, other
    Epilogues). Immutable; equality and hashing go by ``key``.
    """

    __slots__ = ("fn", "inputs", "key", "name")

    def __init__(self, fn: Callable[[Any, EpilogueContext], Any],
                 inputs: tuple[EpilogueInput, ...] | list[EpilogueInput] = (),
                 name: str = "custom") -> None:
        if not callable(fn):
            raise TypeError(f"Epilogue fn must be callable, got {type(fn).__name__}")
        inputs = tuple(inputs)
        for inp in inputs:
            if not isinstance(inp, EpilogueInput):
                raise TypeError(f"Epilogue inputs must be EpilogueInput, got {type(inp).__name__}")
        names = [i.name for i in inputs]
        if len(set(names)) != len(names):
            raise ValueError(f"Epilogue inputs must have unique names, got {names}")
        for reserved in ("a", "b", "sfa", "sfb", "c", "m", "n", "k", "alpha"):
            if reserved in names:
                raise ValueError(f"Epilogue input name {reserved!r} is reserved (a kernel "
                                 f"argument), got inputs {names}")
        text = "|".join([name, repr(inputs), _callable_fingerprint(fn)])
        for attr, value in (("fn", fn), ("inputs", inputs), ("name", str(name)),
                            ("key", hashlib.sha256(text.encode()).hexdigest()[:16])):
            object.__setattr__(self, attr, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Epilogue is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Epilogue) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"Epilogue({self.name}, inputs={[i.name for i in self.inputs]}, key={self.key})"


class EpilogueContext:
    """What an epilogue callable sees: coordinates and its inputs, inside the kernel.

    Attributes:
        m, n: the output row and column (``index`` values).
        num_cols: N as an ``index`` value.
        out_type: the output element type (f32 or bf16), for custom casts.
    """

    def __init__(self, m: Any, n: Any, num_cols: Any, out_type: Any,
                 buffers: dict[str, tuple[EpilogueInput, Any]]):
        self.m, self.n, self.num_cols, self.out_type = m, n, num_cols, out_type
        self._buffers = buffers

    def load(self, name: str) -> Any:
        """The input ``name`` at this output position, widened to f32 (``memref.load`` +
        ``arith.extf`` for bf16)."""
        from mlir.dialects import arith

        from blockscale.compiler import ir as bir

        try:
            inp, buf = self._buffers[name]
        except KeyError:
            raise ValueError(f"epilogue input {name!r} is not declared; declared: "
                             f"{sorted(self._buffers)}") from None
        idx = {"row": self.m, "col": self.n,
               "elem": bir.add(bir.mul(self.m, self.num_cols), self.n)}[inp.index]
        v = bir.load(buf, idx)
        return arith.extf(bir.f32(), v) if inp.dtype == "bfloat16" else v

    @staticmethod
    def f32_const(value: float) -> Any:
        """An f32 constant."""
        from blockscale.compiler import ir as bir

        return bir.const(float(value), bir.f32())


# ---- ready-made epilogues ------------------------------------------------------------------

def _addf(a: Any, b: Any) -> Any:
    from mlir.dialects import arith

    return arith.addf(a, b)


def _mulf(a: Any, b: Any) -> Any:
    from mlir.dialects import arith

    return arith.mulf(a, b)


def bias(name: str = "bias", dtype: str = "float32") -> Epilogue:
    """``y = x + bias[n]`` (fp32 add)."""
    return Epilogue(lambda x, ctx: _addf(x, ctx.load(name)),
                    (EpilogueInput(name, dtype, "col"),), name=f"bias:{name}")


def residual(name: str = "residual", dtype: str = "bfloat16") -> Epilogue:
    """``y = x + residual[m, n]`` (fp32 add of the widened residual)."""
    return Epilogue(lambda x, ctx: _addf(x, ctx.load(name)),
                    (EpilogueInput(name, dtype, "elem"),), name=f"residual:{name}")


def row_scale(name: str = "row_scale", dtype: str = "float32") -> Epilogue:
    """``y = x * row_scale[m]`` (fp32 multiply)."""
    return Epilogue(lambda x, ctx: _mulf(x, ctx.load(name)),
                    (EpilogueInput(name, dtype, "row"),), name=f"row_scale:{name}")


def col_scale(name: str = "col_scale", dtype: str = "float32") -> Epilogue:
    """``y = x * col_scale[n]`` (fp32 multiply)."""
    return Epilogue(lambda x, ctx: _mulf(x, ctx.load(name)),
                    (EpilogueInput(name, dtype, "col"),), name=f"col_scale:{name}")


def _relu_fn(x: Any, ctx: EpilogueContext) -> Any:
    from mlir.dialects import arith

    # maximumf propagates NaN (IEEE maximum), so a NaN accumulator stays NaN
    return arith.maximumf(x, ctx.f32_const(0.0))


def relu() -> Epilogue:
    """``y = max(x, 0)`` (``arith.maximumf``: NaN propagates)."""
    return Epilogue(_relu_fn, (), name="relu")


def clamp(lo: float, hi: float) -> Epilogue:
    """``y = min(max(x, lo), hi)`` (``arith.maximumf`` / ``minimumf``: NaN propagates)."""
    lo, hi = float(lo), float(hi)
    if not lo <= hi:
        raise ValueError(f"clamp needs lo <= hi, got lo={lo}, hi={hi}")

    def _clamp(x: Any, ctx: EpilogueContext) -> Any:
        from mlir.dialects import arith

        return arith.minimumf(arith.maximumf(x, ctx.f32_const(lo)), ctx.f32_const(hi))

    return Epilogue(_clamp, (), name=f"clamp:{lo}:{hi}")


def chain(*epilogues: Epilogue) -> Epilogue:
    """Apply ``epilogues`` left to right; their inputs are merged (names must not clash)."""
    eps = tuple(epilogues)
    for e in eps:
        if not isinstance(e, Epilogue):
            raise TypeError(f"chain takes Epilogue objects, got {type(e).__name__}")
    inputs: list[EpilogueInput] = []
    for e in eps:
        for inp in e.inputs:
            if any(i.name == inp.name and i != inp for i in inputs):
                raise ValueError(f"chain: input {inp.name!r} declared twice with different "
                                 f"dtype/index")
            if inp not in inputs:
                inputs.append(inp)

    def _chained(x: Any, ctx: EpilogueContext) -> Any:
        for e in eps:
            x = e.fn(x, ctx)
        return x

    return Epilogue(_chained, tuple(inputs), name="chain(" + ",".join(e.key for e in eps) + ")")

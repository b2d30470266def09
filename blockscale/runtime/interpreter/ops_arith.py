"""arith and math ops: elementwise numpy on the thread axis, bit-faithful to MLIR semantics.

Integers are signed numpy ints of the type's width (i1 = bool); unsigned ops view them as
unsigned. Float ops compute in the operand type (float32 stays float32). Division by zero and
other poison cases give deterministic values instead of raising.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import dtypes
from .compiler import Compiler, handles, type_str, uniform

# ---- plumbing -------------------------------------------------------------------------------


def _elementwise(fn: Callable[..., np.ndarray]) -> Callable[[Any, Compiler], Any]:
    """Factory for ops computing one result from their operands with ``fn(*arrays, op)``."""
    def factory(op: Any, c: Compiler):
        ins = c.slots(op.operands)
        out = c.slot(op.results[0])
        _, dt = dtypes.value_dtype(type_str(op.results[0]))
        ctx = _OpInfo(op, dt)

        def run(f):
            v = f.vals
            with np.errstate(all="ignore"):
                r = fn(ctx, *[v[i] for i in ins])
            v[out] = np.asarray(r).astype(dt, copy=False)
        return run
    return factory


class _OpInfo:
    """Static facts about an op a handler needs at run time (result dtype, attributes)."""

    def __init__(self, op: Any, dt: np.dtype) -> None:
        self.dt = dt
        self.attrs = {k: op.attributes[k] for k in op.attributes}
        self.in_dt = (dtypes.value_dtype(type_str(op.operands[0]))[1]
                      if len(op.operands) else dt)

        self._ints: dict[str, int] = {}

    def int_attr(self, name: str) -> int:
        v = self._ints.get(name)
        if v is None:
            v = self._ints[name] = int(str(self.attrs[name]).split(":")[0].strip())
        return v


def _reg(names: str, fn: Callable[..., np.ndarray]) -> None:
    handles(*names.split())(_elementwise(fn))


def _u(x: np.ndarray) -> np.ndarray:
    return x.view(dtypes.unsigned(x.dtype))


def _nonzero(b: np.ndarray) -> np.ndarray:
    return np.where(b == 0, np.ones_like(b), b)


# ---- constants ------------------------------------------------------------------------------


@handles("arith.constant")
def _constant(op: Any, c: Compiler):
    from mlir import ir

    out = c.slot(op.results[0])
    shape, dt = dtypes.value_dtype(type_str(op.results[0]))
    attr = op.attributes["value"]
    value = uniform(constant_array(attr, shape, dt, ir))

    def run(f):
        f.vals[out] = value
    return run


def _scalar_attr(a: Any, dt: np.dtype, ir: Any) -> Any:
    if isinstance(a, ir.FloatAttr):
        s = str(a).split(":")[0].strip()
        if s.startswith("0x"):  # exact bit pattern (NaN payloads, etc.)
            return np.array(int(s, 16), dtype=dtypes.bits_dtype(dt).str.replace("i", "u"))\
                .view(dt)
        return np.array(a.value).astype(dt)
    if isinstance(a, ir.IntegerAttr):
        v = int(a.value)
        if dt == np.bool_:
            return np.array(v != 0)
        return np.array(v).astype(np.int64).astype(dt) if -2**63 <= v < 2**63 \
            else np.array(v & (2**64 - 1), np.uint64).view(np.int64).astype(dt)
    if isinstance(a, ir.BoolAttr):
        return np.array(bool(a.value))
    raise NotImplementedError(f"interpreter: constant attribute {a}")


def constant_array(attr: Any, shape: tuple[int, ...], dt: np.dtype, ir: Any) -> np.ndarray:
    """The numpy value of a scalar or dense constant attribute."""
    if isinstance(attr, ir.DenseElementsAttr):
        n = int(np.prod(shape)) if shape else 1
        if attr.is_splat:
            return np.full(shape, _scalar_attr(attr.get_splat_value(), dt, ir), dtype=dt)
        if isinstance(attr, ir.DenseIntElementsAttr):
            vals = [int(attr[i]) for i in range(n)]
            arr = np.array(vals, dtype=np.int64)
            return (arr != 0 if dt == np.bool_ else arr.astype(dt)).reshape(shape)
        vals = [float(attr[i]) for i in range(n)]
        return np.array(vals, dtype=np.float64).astype(dt).reshape(shape)
    return np.asarray(_scalar_attr(attr, dt, ir), dtype=dt)


# ---- integer ops ----------------------------------------------------------------------------


def _addi(o, a, b):
    return a ^ b if a.dtype == np.bool_ else a + b


def _subi(o, a, b):
    return a ^ b if a.dtype == np.bool_ else a - b


def _muli(o, a, b):
    return a & b if a.dtype == np.bool_ else a * b


def _divsi(o, a, b):
    b = _nonzero(b)
    q = a // b
    fix = (a - q * b != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


def _ceildivsi(o, a, b):
    b = _nonzero(b)
    q = _divsi(o, a, b)
    return q + ((a - q * b != 0) & ((a < 0) == (b < 0))).astype(q.dtype)


def _floordivsi(o, a, b):
    return a // _nonzero(b)


def _ceildivui(o, a, b):
    ua, ub = _u(a), _u(_nonzero(b))
    q = ua // ub
    return (q + (ua % ub != 0).astype(q.dtype)).view(a.dtype)


def _shift_amount(a, b):
    w = dtypes.bit_width(a.dtype)
    sh = _u(b)
    return sh, sh >= w


def _shli(o, a, b):
    sh, big = _shift_amount(a, b)
    r = _u(a) << np.where(big, 0, sh).astype(_u(a).dtype)
    return np.where(big, 0, r).astype(_u(a).dtype).view(a.dtype)


def _shrui(o, a, b):
    sh, big = _shift_amount(a, b)
    r = _u(a) >> np.where(big, 0, sh).astype(_u(a).dtype)
    return np.where(big, 0, r).astype(_u(a).dtype).view(a.dtype)


def _shrsi(o, a, b):
    sh, big = _shift_amount(a, b)
    w = dtypes.bit_width(a.dtype)
    return a >> np.where(big, w - 1, sh).astype(a.dtype)


_CMPI = {
    0: lambda a, b: a == b, 1: lambda a, b: a != b,
    2: lambda a, b: a < b, 3: lambda a, b: a <= b, 4: lambda a, b: a > b, 5: lambda a, b: a >= b,
    6: lambda a, b: _u(a) < _u(b), 7: lambda a, b: _u(a) <= _u(b),
    8: lambda a, b: _u(a) > _u(b), 9: lambda a, b: _u(a) >= _u(b),
}


def _cmpi(o, a, b):
    return _CMPI[o.int_attr("predicate")](a, b)


_reg("arith.addi", _addi)
_reg("arith.subi", _subi)
_reg("arith.muli", _muli)
_reg("arith.divsi", _divsi)
_reg("arith.divui", lambda o, a, b: (_u(a) // _u(_nonzero(b))).view(a.dtype))
_reg("arith.remsi", lambda o, a, b: np.fmod(a, _nonzero(b)))
_reg("arith.remui", lambda o, a, b: (_u(a) % _u(_nonzero(b))).view(a.dtype))
_reg("arith.ceildivsi", _ceildivsi)
_reg("arith.floordivsi", _floordivsi)
_reg("arith.ceildivui", _ceildivui)
_reg("arith.andi", lambda o, a, b: a & b)
_reg("arith.ori", lambda o, a, b: a | b)
_reg("arith.xori", lambda o, a, b: a ^ b)
_reg("arith.shli", _shli)
_reg("arith.shrui", _shrui)
_reg("arith.shrsi", _shrsi)
_reg("arith.maxsi", lambda o, a, b: np.maximum(a, b))
_reg("arith.minsi", lambda o, a, b: np.minimum(a, b))
_reg("arith.maxui", lambda o, a, b: np.maximum(_u(a), _u(b)).view(a.dtype))
_reg("arith.minui", lambda o, a, b: np.minimum(_u(a), _u(b)).view(a.dtype))
_reg("arith.cmpi", _cmpi)
_reg("math.absi", lambda o, a: np.abs(a))
_reg("math.ctpop", lambda o, a: np.bitwise_count(_u(a)).astype(a.dtype))
_reg("index.add", _addi)
_reg("index.sub", _subi)
_reg("index.mul", _muli)


# ---- float ops ------------------------------------------------------------------------------


def _max_signed_zero(a, b, nan_propagate: bool, is_max: bool):
    """IEEE 754-2019 maximum/minimum (NaN-propagating) or maximumNumber/minimumNumber
    (NaN-ignoring); -0 orders below +0 in both."""
    r = (np.maximum if is_max else np.minimum)(a, b) if nan_propagate else \
        (np.fmax if is_max else np.fmin)(a, b)
    zeros = (a == 0) & (b == 0)
    if np.any(zeros):
        pick_a = np.signbit(a) != is_max  # max: a if a is +0; min: a if a is -0
        r = np.where(zeros, np.where(pick_a, a, b), r)
    return r


def _fma(o, a, b, c):
    """Fused multiply-add with one rounding: the product is exact in float64 for f32/bf16/f16,
    the sum is rounded to odd in float64 (exact error from TwoSum), then to the result type."""
    if a.dtype == np.float64:
        raise NotImplementedError("interpreter: math.fma on f64")
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bp = s - c64
    err = (p - bp) + (c64 - (s - bp))
    odd_fix = (err != 0) & np.isfinite(s) & ((s.view(np.int64) & 1) == 0)
    s = np.where(odd_fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(a.dtype)


def _round_half_away(o, a):
    t = np.trunc(a)
    return np.where(np.abs(a - t) >= 0.5, t + np.copysign(np.ones_like(a), a), t)


_CMPF = {
    0: lambda a, b: np.zeros(np.broadcast(a, b).shape, bool),
    1: lambda a, b: a == b, 2: lambda a, b: a > b, 3: lambda a, b: a >= b,
    4: lambda a, b: a < b, 5: lambda a, b: a <= b,
    6: lambda a, b: (a != b) & ~np.isnan(a) & ~np.isnan(b),
    7: lambda a, b: ~np.isnan(a) & ~np.isnan(b),
    8: lambda a, b: ~((a != b) & ~np.isnan(a) & ~np.isnan(b)),
    9: lambda a, b: ~(a <= b), 10: lambda a, b: ~(a < b),
    11: lambda a, b: ~(a >= b), 12: lambda a, b: ~(a > b),
    13: lambda a, b: a != b,
    14: lambda a, b: np.isnan(a) | np.isnan(b),
    15: lambda a, b: np.ones(np.broadcast(a, b).shape, bool),
}

_reg("arith.addf", lambda o, a, b: a + b)
_reg("arith.subf", lambda o, a, b: a - b)
_reg("arith.mulf", lambda o, a, b: a * b)
_reg("arith.divf", lambda o, a, b: a / b)
_reg("arith.remf", lambda o, a, b: np.fmod(a, b))
_reg("arith.negf", lambda o, a: -a)
_reg("arith.maximumf", lambda o, a, b: _max_signed_zero(a, b, True, True))
_reg("arith.minimumf", lambda o, a, b: _max_signed_zero(a, b, True, False))
_reg("arith.maxnumf", lambda o, a, b: _max_signed_zero(a, b, False, True))
_reg("arith.minnumf", lambda o, a, b: _max_signed_zero(a, b, False, False))
_reg("arith.cmpf", lambda o, a, b: _CMPF[o.int_attr("predicate")](a, b))
_reg("math.absf", lambda o, a: np.abs(a))
_reg("math.copysign", lambda o, a, b: np.copysign(a, b))
_reg("math.fma", _fma)
_reg("math.sqrt", lambda o, a: np.sqrt(a))
_reg("math.rsqrt", lambda o, a: np.ones_like(a) / np.sqrt(a))
_reg("math.exp", lambda o, a: np.exp(a))
_reg("math.exp2", lambda o, a: np.exp2(a))
_reg("math.log", lambda o, a: np.log(a))
_reg("math.log2", lambda o, a: np.log2(a))
_reg("math.tanh", lambda o, a: np.tanh(a))
_reg("math.sin", lambda o, a: np.sin(a))
_reg("math.cos", lambda o, a: np.cos(a))
_reg("math.powf", lambda o, a, b: np.power(a, b))
_reg("math.floor", lambda o, a: np.floor(a))
_reg("math.ceil", lambda o, a: np.ceil(a))
_reg("math.trunc", lambda o, a: np.trunc(a))
_reg("math.roundeven", lambda o, a: np.rint(a))
_reg("math.round", _round_half_away)
_reg("math.isnan", lambda o, a: np.isnan(a))
_reg("math.isinf", lambda o, a: np.isinf(a))
_reg("math.isfinite", lambda o, a: np.isfinite(a))


# ---- select and casts ----------------------------------------------------------------------


def _select(o, cond, a, b):
    cond = cond.reshape(cond.shape + (1,) * (np.ndim(a) - cond.ndim))
    return np.where(cond, a, b)


def _ext_int(o, a, signed: bool):
    if a.dtype == np.bool_:
        return a.astype(o.dt) * (-1 if signed and o.dt != np.bool_ else 1)
    return (a if signed else _u(a)).astype(o.dt)


def _trunci(o, a):
    if o.dt == np.bool_:
        return (a & 1).astype(bool)
    return a.astype(o.dt)  # numpy int -> narrower int keeps the low bits


def _index_castui(o, a):
    src = a if a.dtype == np.bool_ else _u(a)
    return src.astype(dtypes.unsigned(o.dt)).view(o.dt) if o.dt != np.bool_ else src != 0


def _bitcast(o, a):
    if o.dt == np.bool_ or a.dtype == np.bool_:
        return a.astype(o.dt)
    return np.ascontiguousarray(a).view(o.dt)


_reg("arith.select", _select)
_reg("arith.extsi", lambda o, a: _ext_int(o, a, True))
_reg("arith.extui", lambda o, a: _ext_int(o, a, False))
_reg("arith.trunci", _trunci)
_reg("arith.index_cast", lambda o, a: a.astype(o.dt) if o.dt != np.bool_ else (a & 1) != 0)
_reg("arith.index_castui", _index_castui)
_reg("arith.bitcast", _bitcast)
_reg("arith.extf", lambda o, a: dtypes.convert_float(a, o.dt))
def _truncf(o, a):
    mode = o.attrs.get("roundingmode")
    if mode is not None and "to_nearest_even" not in str(mode) and str(mode) != "0 : i32":
        raise NotImplementedError(f"interpreter: arith.truncf with rounding mode {mode}")
    return dtypes.convert_float(a, o.dt)


_reg("arith.truncf", _truncf)
_reg("arith.sitofp", lambda o, a: dtypes.int_to_float(a, o.dt, False))
_reg("arith.uitofp", lambda o, a: dtypes.int_to_float(a, o.dt, True))
_reg("arith.fptosi", lambda o, a: dtypes.float_to_int(a, o.dt, False))
_reg("arith.fptoui", lambda o, a: dtypes.float_to_int(a, o.dt, True))


def _saturate(a: np.ndarray) -> np.ndarray:
    """PTX ``cvt.sat`` / ``.sat``: clamp to [0, 1], NaN -> +0."""
    return np.where(np.isnan(a), np.zeros_like(a), np.clip(a, 0, 1))


#: ``llvm.call_intrinsic`` names the interpreter models (overloaded ones without their type
#: suffix)
_INTRINSICS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "llvm.fabs": np.abs, "llvm.nvvm.saturate.f": _saturate}


@handles("llvm.call_intrinsic")
def _call_intrinsic(op: Any, c: Compiler):
    from mlir import ir

    name = ir.StringAttr(op.attributes["intrin"]).value
    fn = _INTRINSICS.get(name) or _INTRINSICS.get(name.rsplit(".", 1)[0])  # "...fabs.v8bf16"
    if fn is None:
        raise NotImplementedError(f"interpreter: intrinsic {name!r} is not modeled")
    return _elementwise(lambda o, *args: fn(*args))(op, c)

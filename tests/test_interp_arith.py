"""Interpreter: arith and math ops, bit for bit against their MLIR / IEEE definitions."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("mlir")

from blockscale.runtime.interpreter import run_kernel

pytestmark = pytest.mark.interp

BLOCK = 64


def _binop_kernel(op: str, tin: str, tout: str, extra: str = "") -> str:
    """A kernel computing ``o[i] = OP(x[i], y[i])``; the op text uses %a, %b and defines %r."""
    return f"""
gpu.module @m {{
  gpu.func @k(%x: memref<?x{tin}>, %y: memref<?x{tin}>, %o: memref<?x{tout}>) kernel {{
    %tid = gpu.thread_id x
    %bid = gpu.block_id x
    %bd = gpu.block_dim x
    %base = arith.muli %bid, %bd : index
    %i = arith.addi %base, %tid : index
    %a = memref.load %x[%i] : memref<?x{tin}>
    %b = memref.load %y[%i] : memref<?x{tin}>
    {op}
    {extra}
    memref.store %r, %o[%i] : memref<?x{tout}>
    gpu.return
  }}
}}
"""


def _run_binop(op: str, x: np.ndarray, y: np.ndarray, tin: str, tout: str, out_dtype,
               extra: str = "") -> np.ndarray:
    n = x.size
    pad = -n % BLOCK
    x = np.concatenate([x, np.zeros(pad, x.dtype)])
    y = np.concatenate([y, np.ones(pad, y.dtype)])
    o = np.zeros(x.size, out_dtype)
    run_kernel(_binop_kernel(op, tin, tout, extra), "k", (x.size // BLOCK, 1, 1), (BLOCK, 1, 1),
               [x, y, o], "sm_90a")
    return o[:n]


def _i32_samples() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1234)
    edge = np.array([0, 1, -1, 2, -2, 7, -7, 2**31 - 1, -2**31, 123456789, -987654321], np.int64)
    a = np.concatenate([np.repeat(edge, edge.size), rng.integers(-2**31, 2**31, 300)])
    b = np.concatenate([np.tile(edge, edge.size), rng.integers(-2**31, 2**31, 300)])
    return a.astype(np.int32), b.astype(np.int32)


def _wrap32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


INT_REFS = {
    "addi": lambda a, b: _wrap32(a + b),
    "subi": lambda a, b: _wrap32(a - b),
    "muli": lambda a, b: _wrap32(a * b),
    "divsi": lambda a, b: _wrap32(_tdiv(a, b)),
    "remsi": lambda a, b: _wrap32(a - _tdiv(a, b) * b),
    "divui": lambda a, b: _wrap32((a % 2**32) // (b % 2**32)),
    "remui": lambda a, b: _wrap32((a % 2**32) % (b % 2**32)),
    "ceildivsi": lambda a, b: _wrap32(-((-a) // b)),
    "floordivsi": lambda a, b: _wrap32(a // b),
    "ceildivui": lambda a, b: _wrap32(-(-(a % 2**32) // (b % 2**32))),
    "andi": lambda a, b: a & b,
    "ori": lambda a, b: a | b,
    "xori": lambda a, b: a ^ b,
    "maxsi": max,
    "minsi": min,
    "maxui": lambda a, b: _wrap32(max(a % 2**32, b % 2**32)),
    "minui": lambda a, b: _wrap32(min(a % 2**32, b % 2**32)),
}


@pytest.mark.parametrize("name", sorted(INT_REFS))
def test_i32_binops(name):
    a, b = _i32_samples()
    if "div" in name or "rem" in name:
        keep = (b != 0) & ~((a == -2**31) & (b == -1))  # UB cases excluded
        a, b = a[keep], b[keep]
    got = _run_binop(f"%r = arith.{name} %a, %b : i32", a, b, "i32", "i32", np.int32)
    want = np.array([INT_REFS[name](int(p), int(q)) for p, q in zip(a, b)], np.int64)
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("name,ref", [
    ("shli", lambda a, s: _wrap32(a << s)),
    ("shrsi", lambda a, s: a >> s),
    ("shrui", lambda a, s: _wrap32((a % 2**32) >> s)),
])
def test_i32_shifts(name, ref):
    a, _ = _i32_samples()
    s = (np.arange(a.size) % 32).astype(np.int32)
    got = _run_binop(f"%r = arith.{name} %a, %b : i32", a, s, "i32", "i32", np.int32)
    want = np.array([ref(int(p), int(q)) for p, q in zip(a, s)], np.int64)
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("pred", ["eq", "ne", "slt", "sle", "sgt", "sge",
                                  "ult", "ule", "ugt", "uge"])
def test_cmpi_predicates(pred):
    a, b = _i32_samples()
    got = _run_binop(f"%c = arith.cmpi {pred}, %a, %b : i32", a, b, "i32", "i8", np.int8,
                     extra="%r = arith.extui %c : i1 to i8")
    ua, ub = a.astype(np.int64) % 2**32, b.astype(np.int64) % 2**32
    sa, sb = a.astype(np.int64), b.astype(np.int64)
    want = {"eq": sa == sb, "ne": sa != sb, "slt": sa < sb, "sle": sa <= sb, "sgt": sa > sb,
            "sge": sa >= sb, "ult": ua < ub, "ule": ua <= ub, "ugt": ua > ub,
            "uge": ua >= ub}[pred]
    np.testing.assert_array_equal(got, want.astype(np.int8))


_NAN = np.float32(np.nan)
_SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1.5, -2.5], np.float32)


def _pairs():
    return np.repeat(_SPECIAL, _SPECIAL.size), np.tile(_SPECIAL, _SPECIAL.size)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("name", ["maximumf", "minimumf", "maxnumf", "minnumf"])
def test_float_min_max_nan_and_signed_zero(name):
    a, b = _pairs()
    got = _run_binop(f"%r = arith.{name} %a, %b : f32", a, b, "f32", "f32", np.float32)
    for p, q, r in zip(a, b, got):
        if name.endswith("imumf"):  # NaN-propagating
            if np.isnan(p) or np.isnan(q):
                assert np.isnan(r), (name, p, q, r)
                continue
        elif np.isnan(p) or np.isnan(q):  # NaN-ignoring (maxnum/minnum)
            other = q if np.isnan(p) else p
            assert (np.isnan(r) and np.isnan(other)) or _bits(r) == _bits(other), (p, q, r)
            continue
        if p == 0 and q == 0:  # -0 < +0
            want = (max if "max" in name else min)(
                (p, np.signbit(p)), (q, np.signbit(q)), key=lambda v: not v[1])[0]
            assert _bits(r) == _bits(want), (name, p, q, r)
        else:
            assert r == (max(p, q) if "max" in name else min(p, q)), (name, p, q, r)


@pytest.mark.parametrize("pred,fn", [
    ("oeq", lambda a, b: a == b), ("one", lambda a, b: (a < b) or (a > b)),
    ("olt", lambda a, b: a < b), ("ord", lambda a, b: not (np.isnan(a) or np.isnan(b))),
    ("ueq", lambda a, b: np.isnan(a) or np.isnan(b) or a == b),
    ("ult", lambda a, b: not (a >= b)), ("une", lambda a, b: not (a == b)),  # noqa: SIM201
    ("uno", lambda a, b: bool(np.isnan(a) or np.isnan(b))), ("ogt", lambda a, b: a > b),
    ("uge", lambda a, b: not (a < b)),
])
def test_cmpf_predicates_with_nan(pred, fn):
    a, b = _pairs()
    got = _run_binop(f"%c = arith.cmpf {pred}, %a, %b : f32", a, b, "f32", "i8", np.int8,
                     extra="%r = arith.extui %c : i1 to i8")
    want = np.array([fn(p, q) for p, q in zip(a, b)], np.int8)
    np.testing.assert_array_equal(got, want)


def test_float32_ops_stay_float32():
    """(a*b)+c as two ops rounds twice in float32; float64 intermediates would not."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal(512).astype(np.float32)
    b = rng.standard_normal(512).astype(np.float32)
    got = _run_binop("%p = arith.mulf %a, %b : f32\n    %q = arith.addf %p, %a : f32\n"
                     "    %r = arith.divf %q, %b : f32", a, b, "f32", "f32", np.float32)
    want = ((a * b) + a) / b
    np.testing.assert_array_equal(_bits(got), _bits(want))
    wide = ((a.astype(np.float64) * b) + a) / b
    assert not np.array_equal(_bits(got), _bits(wide.astype(np.float32)))


def test_fma_single_rounding():
    one_p = np.float32(1 + 2.0**-12)
    a = np.array([one_p, one_p, 3.0], np.float32)
    b = np.array([one_p, one_p, 7.0], np.float32)
    c = np.array([-1.0, 2.0**-70, 0.5], np.float32)
    # The first two would round differently as mul+add (exact tie) or via a float64 sum
    # (double rounding): fma gives 2^-11 + 2^-24 and 1 + 2^-11 + 2^-23.
    x = np.concatenate([a, b, c])
    o = np.zeros(a.size, np.float32)
    text = """
gpu.module @m {
  gpu.func @k(%x: memref<?xf32>, %o: memref<?xf32>) kernel {
    %i = gpu.thread_id x
    %n = arith.constant 3 : index
    %j = arith.addi %i, %n : index
    %n2 = arith.constant 6 : index
    %k = arith.addi %i, %n2 : index
    %a = memref.load %x[%i] : memref<?xf32>
    %b = memref.load %x[%j] : memref<?xf32>
    %c = memref.load %x[%k] : memref<?xf32>
    %r = math.fma %a, %b, %c : f32
    memref.store %r, %o[%i] : memref<?xf32>
    gpu.return
  }
}"""
    run_kernel(text, "k", (1, 1, 1), (3, 1, 1), [x, o], "sm_90a")
    assert o[0] == np.float32(2.0**-11 + 2.0**-24)
    assert o[1] == np.float32(1 + 2.0**-11 + 2.0**-23)
    assert o[2] == np.float32(21.5)


def test_truncf_bf16_round_to_nearest_even_and_extf():
    bits = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0x7FC00001, 0x80000001,
                     0x3F80FFFF, 0xBF808000], np.uint32)
    x = bits.view(np.float32)
    want = np.array([0x3F80, 0x3F82, 0x3F81, 0x7F80, None, 0x8000, 0x3F81, 0xBF80], object)
    got = _run_binop("%r = arith.truncf %a : f32 to bf16", x, x, "f32", "bf16",
                     ml_dtypes.bfloat16).view(np.uint16)
    for g, w, xb in zip(got, want, bits):
        if w is None:
            assert (g & 0x7F80) == 0x7F80 and (g & 0x7F), hex(xb)  # NaN stays NaN
        else:
            assert g == w, (hex(xb), hex(g), hex(w))
    back = _run_binop("%r = arith.extf %a : bf16 to f32", got.view(ml_dtypes.bfloat16),
                      got.view(ml_dtypes.bfloat16), "bf16", "f32", np.float32)
    np.testing.assert_array_equal(_bits(back)[[0, 1, 2, 5]],
                                  got[[0, 1, 2, 5]].astype(np.uint32) << 16)


def test_truncf_to_e4m3_and_extf_from_e4m3():
    vals = np.array([0.0, 1.0, 1.0625, 1.1875, 448.0, 2.0**-9, 3 * 2.0**-10, -17.0],
                    np.float32)
    got = _run_binop("%r = arith.truncf %a : f32 to f8E4M3FN", vals, vals, "f32",
                     "f8E4M3FN", ml_dtypes.float8_e4m3fn)
    # 1.0625 is a tie between 1.0 and 1.125 -> even (1.0); 1.1875 -> 1.25; 3*2^-10 -> 2^-8.
    np.testing.assert_array_equal(got.astype(np.float32),
                                  [0, 1, 1, 1.25, 448, 2.0**-9, 2.0**-8, -17.0 + 1])
    back = _run_binop("%r = arith.extf %a : f8E4M3FN to f32", got, got, "f8E4M3FN", "f32",
                      np.float32)
    np.testing.assert_array_equal(back, got.astype(np.float32))


def test_int_float_conversions():
    ints = np.array([16777217, -16777219, -1, 2**31 - 1, 0, 5], np.int32)
    got = _run_binop("%r = arith.sitofp %a : i32 to f32", ints, ints, "i32", "f32", np.float32)
    np.testing.assert_array_equal(got, ints.astype(np.float32))  # RNE: 16777217 -> 16777216
    got = _run_binop("%r = arith.uitofp %a : i32 to f32", ints, ints, "i32", "f32", np.float32)
    np.testing.assert_array_equal(got, (ints.astype(np.int64) % 2**32).astype(np.float32))
    f = np.array([2.9, -2.9, 1e10, -1e10, np.nan, -0.5], np.float32)
    got = _run_binop("%r = arith.fptosi %a : f32 to i32", f, f, "f32", "i32", np.int32)
    np.testing.assert_array_equal(got, [2, -2, 2**31 - 1, -2**31, 0, 0])
    got = _run_binop("%r = arith.fptoui %a : f32 to i8", f, f, "f32", "i8", np.int8)
    np.testing.assert_array_equal(got.view(np.uint8), [2, 0, 255, 0, 0, 0])


def test_int_casts_and_bitcast():
    a = np.array([-1, 255, -128, 0x12345678, -2**31], np.int32)
    got = _run_binop("%t = arith.trunci %a : i32 to i8\n    %r = arith.extsi %t : i8 to i32",
                     a, a, "i32", "i32", np.int32)
    np.testing.assert_array_equal(got, a.astype(np.int8).astype(np.int32))
    got = _run_binop("%t = arith.trunci %a : i32 to i8\n    %r = arith.extui %t : i8 to i32",
                     a, a, "i32", "i32", np.int32)
    np.testing.assert_array_equal(got, a.astype(np.uint8).astype(np.int32))
    got = _run_binop("%t = arith.index_castui %a : i32 to index\n"
                     "    %r = arith.index_cast %t : index to i64", a, a, "i32", "i64", np.int64)
    np.testing.assert_array_equal(got, a.astype(np.int64) % 2**32)
    got = _run_binop("%t = arith.index_cast %a : i32 to index\n"
                     "    %r = arith.index_cast %t : index to i64", a, a, "i32", "i64", np.int64)
    np.testing.assert_array_equal(got, a.astype(np.int64))
    got = _run_binop("%r = arith.bitcast %a : i32 to f32", a, a, "i32", "f32", np.float32)
    np.testing.assert_array_equal(got.view(np.int32), a)


def test_select_and_i1_arith():
    a = np.array([1, 0, 1, 0], np.int8)
    b = np.array([1, 1, 0, 0], np.int8)
    op = ("%p = arith.trunci %a : i8 to i1\n    %q = arith.trunci %b : i8 to i1\n"
          "    %s = arith.addi %p, %q : i1\n    %m = arith.muli %p, %q : i1\n"
          "    %c5 = arith.constant 5 : i8\n    %c9 = arith.constant 9 : i8\n"
          "    %v = arith.select %s, %c5, %c9 : i8\n    %w = arith.extui %m : i1 to i8\n"
          "    %r = arith.addi %v, %w : i8")
    got = _run_binop(op, a, b, "i8", "i8", np.int8)
    np.testing.assert_array_equal(got, [10, 5, 5, 9])  # i1 add is xor, i1 mul is and


def test_math_ops_float32():
    x = np.array([0.5, 1.0, 2.25, 100.0, -3.0, 0.0], np.float32)
    y = np.array([-1.0, 2.0, -0.0, 1.0, 3.0, -2.0], np.float32)
    got = _run_binop("%r = math.copysign %a, %b : f32", x, y, "f32", "f32", np.float32)
    np.testing.assert_array_equal(_bits(got), _bits(np.copysign(x, y)))
    got = _run_binop("%r = math.sqrt %a : f32", np.abs(x), y, "f32", "f32", np.float32)
    np.testing.assert_array_equal(got, np.sqrt(np.abs(x)))
    got = _run_binop("%r = math.exp %a : f32", x, y, "f32", "f32", np.float32)
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(got, np.exp(x), rtol=2e-7)
    assert got[3] == np.inf  # exp(100) overflows float32 (it would not in float64)
    got = _run_binop("%r = math.round %a : f32", np.array([0.5, -2.5, 1.49], np.float32),
                     y[:3], "f32", "f32", np.float32)
    np.testing.assert_array_equal(got, [1.0, -3.0, 1.0])
    got = _run_binop("%r = math.absf %a : f32", x, y, "f32", "f32", np.float32)
    np.testing.assert_array_equal(_bits(got), _bits(np.abs(x)))


def test_unmodeled_op_raises_not_implemented_naming_it():
    x = np.zeros(BLOCK, np.float32)
    with pytest.raises(NotImplementedError, match="math.erfc"):
        _run_binop("%r = math.erfc %a : f32", x, x, "f32", "f32", np.float32)

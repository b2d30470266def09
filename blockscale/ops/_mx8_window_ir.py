"""IR helpers of the grouped sm_90a MXFP8 prefill (:mod:`blockscale.ops.matmul_grouped_pdq_mx8`):
the exact E4M3 x E8M0 -> bf16 operand conversion inside a fixed scale window, and the test
for the blocks outside it.

Imports MLIR: only the kernels' ``build`` import it.

Window (:data:`WINDOW_LO`, :data:`WINDOW_HI`): where both operands' block exponents ``s = b -
127`` lie in [-54, 43], ``w = bf16(e4m3 * 2^s)`` is exact (|e4m3| in [2^-9, 448]: |w| in
[2^-63, 448 * 2^43], bf16 normals, 4 significant bits), every product of two such ``w`` is an
exact fp32 normal (>= 2^-126) and a K <= 2^24 sum of them stays below 2^128 (448^2 2^86 2^24
< 2^127.7): the bf16 wgmma's fp32 accumulation then sees exactly the dequantized operands, as
the dense and FP4 fast paths do. A block outside the window whose elements are all zeros
dequantizes to zeros either way (its factor is clamped to a finite 2^[-126, 127]); the scale
0xFF gives the factor NaN, so its block's products are NaN as the reference's. A block
outside the window with a nonzero element (:func:`out_of_window`, :func:`nonzero32`) flags
its row, whose outputs the fixup kernel recomputes with the portable kernel's K loop.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import mma

Value = ir.Value

#: the block exponents (scale byte - 127) the bf16 operands hold exactly (module docstring)
WINDOW_LO, WINDOW_HI = -54, 43


def _i32(v: int) -> Value:
    return bir.const(v, bir.i32())


def block_factor(b: Value) -> Value:
    """An E8M0 scale byte (i32 0 .. 255) -> the f32 factor ``2^(b - 127)`` with the exponent
    clamped to [-126, 127] (exact inside the window), NaN for 0xFF."""
    e = arith.minsi(arith.maxsi(arith.subi(b, _i32(127)), _i32(-126)), _i32(127))
    p = arith.bitcast(bir.f32(), arith.shli(arith.addi(e, _i32(127)), _i32(23)))
    return bir.select(bir.eq(b, _i32(0xFF)), float("nan"), p)


def chunks(data: Value, factor: Value) -> list[Value]:
    """E4M3 codes of one block (``vector<32xi8>``, or 16 of them) times ``factor`` (f32) ->
    their 16-byte chunks of 8 bf16 (``vector<4xi32>``; four, or two): per code pair
    ``cvt.rn.f16x2.e4m3x2`` (exact), the f32 widening, one multiply per element and the
    bf16 pack (exact inside the window)."""
    n = ir.VectorType(data.type).shape[0]
    pairs = vector.bitcast(bir.vec(n // 2, bir.i16()), data)
    splat = vector.broadcast(bir.vec(2, bir.f32()), factor)
    out = []
    for c in range(n // 8):
        words = []
        for q in range(4):
            f16x2 = mma.cvt_e4m3x2_to_f16x2(vector.extract(pairs, [], [4 * c + q]))
            w = arith.truncf(bir.vec(2, bir.bf16()),
                             arith.mulf(arith.extf(bir.vec(2, bir.f32()), f16x2), splat))
            words.append(mma.pack_i32(w))
        out.append(vector.from_elements(bir.vec(4, bir.i32()), words))
    return out


def out_of_window(b: Value) -> Value:
    """i1: the scale byte ``b`` (i32) is finite and its exponent outside [WINDOW_LO,
    WINDOW_HI] (one unsigned compare: ``b - (127 + LO)`` wraps below the window)."""
    span = WINDOW_HI - WINDOW_LO
    outside = bir.ult(_i32(span), arith.subi(b, _i32(127 + WINDOW_LO)))
    return bir.logical_and(outside, bir.ne(b, _i32(0xFF)))


def nonzero32(data: Value) -> Value:
    """i1: a 32-byte E4M3 block (``vector<32xi8>``) has a code with a nonzero magnitude (NaN
    codes included; -0 is zero)."""
    words = vector.bitcast(bir.vec(4, bir.i64()), data)
    bits = vector.extract(words, [], [0])
    for i in range(1, 4):
        bits = arith.ori(bits, vector.extract(words, [], [i]))
    mag = bir.const(0x7F7F7F7F7F7F7F7F, bir.i64())
    return bir.ne(arith.andi(bits, mag), bir.const(0, bir.i64()))

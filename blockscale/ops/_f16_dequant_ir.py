"""NVFP4 -> f16 dequantization for the producer-dequant kernels' ``dtype="f16"`` (issue #10).

Imports MLIR: only kernel builders import it.

Why: the grouped producer-dequant kernel's step is bound by its producer warpgroup's
conversion of the weight tile (docs/internals.md "What bounds it"): the bf16 "lut" decode costs
10 instructions per 4 E2M1 codes (two ``prmt`` table lookups, the sign placed by an ``imad``,
an interleaving ``prmt``) plus the scale's ``mul.rn.bf16x2``. An f16 is its E5M2 byte shifted
left by 8, and an E2M1 code ``s e1 e0 m`` is the E5M2 byte ``s 0 0 0 e1 e0 m 0`` of its value
times 2^-14 (f16 subnormals for e = 0: 0.5 x 2^-14 is exact), so no table is needed: the even
and odd codes of a word become E5M2 bytes by two shift-and-mask pairs each (7 instructions for
8 codes), one ``prmt`` per 4 codes interleaves them in order and one per f16 pair moves two
consecutive codes to the high bytes over zeros: 13 instructions per 8 codes against 21.

Values: a code's f16 is ``dec * 2^-14``; the NVFP4 scale pair ``|s| * 2^7`` (``cvt.rn.f16x2.e4m3x2``,
exact, then ``mul.rn.f16x2`` by 2^7: at most 448 * 128 = 57344, an f16); their product
``dec * |s| * 2^-7`` is exact in f16 (at most 6 * 448 / 128 = 21; at least 0.5 * 2^-9 * 2^-7 =
2^-17, an f16 subnormal, every product a multiple of 2^-24). A and B both carry the 2^-7, so a
wgmma product is the bf16 path's exact product times 2^-14 and the fp32 accumulation rounds at
the same relative places (no fp32 subnormals: products >= 2^-34): the epilogue's exact
``* 2^14`` (:data:`ACC_SCALE`) gives the bf16 kernel's accumulator bits. The NaN scale 0x7F
gives an f16 NaN (the bf16 path's 0x7FC0: a NaN output either way). NVFP4 only: MXFP4's E8M0
scales (2^-127 .. 2^127) are not f16 values.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import mma
from blockscale.compiler.arch.nvvm import byte_perm

Value = ir.Value

#: the f16 operands' values are the exact products times 2^-7 each: the accumulator's exact fix
ACC_SCALE = 2.0 ** 14


_i32 = bir.i32_bits  # an i32 constant from a 32-bit pattern


def _f16x2(r: Value) -> Value:
    return vector.bitcast(bir.vec(2, bir.f16()), vector.from_elements(bir.vec(1, bir.i32()),
                                                                      [r]))


def scale_pair(w: Value) -> Value:
    """A unit's two E4M3 scale bytes (i32 ``b1 << 8 | b0``) -> ``vector<2xf16>`` of
    ``|s| * 2^7`` (``and``, ``cvt.rn.f16x2.e4m3x2``, ``mul.rn.f16x2``)."""
    pair = mma.cvt_e4m3x2_to_f16x2(arith.trunci(bir.i16(), bir.bit_and(w, 0x7F7F)))
    return arith.mulf(pair, bir.const(128.0, bir.vec(2, bir.f16())))


def splats(w: Value) -> tuple[Value, Value]:
    """:func:`scale_pair`'s two lanes, each as a splat (HMUL2 ``.H0_H0`` / ``.H1_H1``)."""
    pair = scale_pair(w)
    return tuple(vector.shuffle(pair, pair, [q, q]) for q in range(2))


def fp4x8_to_f16x2x4(x: Value) -> list[Value]:
    """The eight E2M1 codes of ``x`` (code i in nibble i) -> four f16 pairs (i32) of codes
    (0, 1), (2, 3), (4, 5), (6, 7), values ``dec * 2^-14`` (module docstring)."""
    lo = bir.bit_or(bir.bit_and(bir.shl(x, _i32(1)), _i32(0x0E0E0E0E)),
                    bir.bit_and(bir.shl(x, _i32(4)), _i32(0x80808080)))  # even codes
    hi = bir.bit_or(bir.bit_and(bir.shru(x, _i32(3)), _i32(0x0E0E0E0E)),
                    bir.bit_and(x, _i32(0x80808080)))  # odd codes
    zero = _i32(0)
    out = []
    for sel in (0x5140, 0x7362):  # the E5M2 bytes of codes 0 .. 3 / 4 .. 7, in order
        codes = byte_perm(lo, hi, sel)
        # bytes 2j, 2j + 1 into the pair's high bytes, zeros below
        out += [byte_perm(codes, zero, 0x1404 + 0x2020 * j) for j in range(2)]
    return out


def scaled_pairs(x: Value, splat: Value) -> list[Value]:
    """The eight E2M1 codes of ``x`` times one scale splat (:func:`splats`): four f16 pairs
    (i32) ``dec * |s| * 2^-7`` of codes (0, 1) .. (6, 7) (:func:`fp4x8_to_f16x2x4`, one
    ``mul.rn.f16x2`` each)."""
    return [mma.pack_i32(arith.mulf(_f16x2(p), splat)) for p in fp4x8_to_f16x2x4(x)]


def dequant_chunks(codes: Value, pair_splats: tuple[Value, ...], block: int = 16) -> list[Value]:
    """32 codes (``vector<16xi8>``) times their scale splats (:func:`splats`, one per
    ``block`` codes) -> four ``vector<4xi32>`` of f16 pairs (each 8 consecutive codes: one
    16-byte chunk of a stage-ordered row), ``dec * |s| * 2^-7``."""
    words = vector.bitcast(bir.vec(4, bir.i32()), codes)
    return [vector.from_elements(bir.vec(4, bir.i32()), scaled_pairs(
        vector.extract(words, [], [c]), pair_splats[c * 8 // block])) for c in range(4)]

"""Float conversion IR builders for block-scaled formats (f32 <-> E2M1 / E4M3 / E8M0, bf16).

Every builder takes and returns ``ir.Value``s and is built at the current insertion point
(and location). Software builders are elementwise: they accept a scalar or a vector value and
return a value of the same shape. Integer results are ``i32`` (codes in the low bits) so that
kernels can pack them without extra extensions.

The bit-exact definitions are those of :mod:`blockscale.formats` (SEMANTICS.md §1.2, D2-D6):

* f32 -> E2M1: round to nearest even, saturating to ±6, sign kept (-0 -> 0x8), NaN -> 0x7;
* f32 -> E4M3FN: RNE, saturating to ±448 (0x7E/0xFE), ±Inf -> ±448, NaN -> 0x7F;
* f32 -> E8M0: toward +Inf ("rp", 2^ceil(log2 x)) or toward zero ("rz", the exponent field),
  clamped to [0, 254]; NaN and +Inf -> 0xFF; 0 -> 0x00.

:data:`CONVERSIONS` is the table keyed by ``(src, dst, rounding, target)``; :func:`convert`
dispatches through it and raises NotImplementedError for pairs it does not hold. Native
instructions are used only where their semantics are bit-identical to the software form.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from mlir import ir
from mlir.dialects import arith, llvm, nvvm, rocdl
from mlir.dialects import math as mmath

from blockscale.compiler.arch import nvvm as NV
from blockscale.compiler.targets import GPUTarget

# ---- small typed helpers (scalar or vector) -----------------------------------------------


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def _f32() -> ir.Type:
    return ir.F32Type.get()


def _shape_like(value_type: ir.Type, elem: ir.Type) -> ir.Type:
    """``elem`` with the vector shape of ``value_type`` (``elem`` itself for a scalar)."""
    if isinstance(value_type, ir.VectorType):
        return ir.VectorType.get(ir.VectorType(value_type).shape, elem)
    return elem


def const_like(like: ir.Type, value: float) -> ir.Value:
    """A constant of type ``like`` (scalar, or a vector splat) holding ``value``."""
    elem = ir.VectorType(like).element_type if isinstance(like, ir.VectorType) else like
    if isinstance(elem, ir.IntegerType):
        width = ir.IntegerType(elem).width
        v = int(value)
        if v >= 1 << (width - 1):  # unsigned bit pattern -> two's complement
            v -= 1 << width
        attr = ir.IntegerAttr.get(elem, v)
    else:
        attr = ir.FloatAttr.get(elem, float(value))
    if isinstance(like, ir.VectorType):
        return arith.constant(like, ir.DenseElementsAttr.get_splat(like, attr))
    return arith.constant(like, attr)


def _bits(x: ir.Value) -> ir.Value:
    """f32 (or vector of f32) -> i32 bit pattern."""
    return arith.bitcast(_shape_like(x.type, _i32()), x)


def _umin(a: ir.Value, bound: int) -> ir.Value:
    return arith.minui(a, const_like(a.type, bound))


def _sel(cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    return arith.select(cond, a, b)


def _cmpi(pred: arith.CmpIPredicate, a: ir.Value, b: int) -> ir.Value:
    return arith.cmpi(pred, a, const_like(a.type, b))


def _rne_shift(bits: ir.Value, shift: int) -> ir.Value:
    """``bits >> shift`` rounded to nearest even on the dropped bits (``bits`` >= 0)."""
    lsb = arith.andi(arith.shrui(bits, const_like(bits.type, shift)), const_like(bits.type, 1))
    bias = arith.addi(lsb, const_like(bits.type, (1 << (shift - 1)) - 1))
    return arith.shrui(arith.addi(bits, bias), const_like(bits.type, shift))


def _round_small(a: ir.Value, scale: float) -> ir.Value:
    """RNE integer of ``a * scale`` for ``0 <= a * scale < 2^22``, as i32 (``a`` f32).

    ``a * scale`` is exact (power-of-two scale); adding 2^23 leaves an ulp of 1, so the f32
    addition rounds to the nearest even integer, which sits in the low mantissa bits.
    """
    y = arith.addf(arith.mulf(a, const_like(a.type, scale)), const_like(a.type, 8388608.0))
    return arith.subi(_bits(y), const_like(_shape_like(a.type, _i32()), 0x4B000000))


# ---- f32 -> E2M1 ----------------------------------------------------------------------------


def e2m1_from_f32_sw(x: ir.Value) -> ir.Value:
    """f32 -> E2M1 code (i32, 0..15) in software: RNE, satfinite, sign kept, NaN -> 0x7.

    Exact integer/float bit manipulation, no special instruction (used on sm_90a, gfx942 and
    wherever no native instruction matches). |x| >= 1: round the f32 bits to one mantissa bit
    (nearest even) and rebase the exponent; |x| < 1: RNE of 2|x| via the 2^23 trick.
    """
    i32 = _shape_like(x.type, _i32())
    bits = _bits(x)
    abits = arith.andi(bits, const_like(i32, 0x7FFFFFFF))
    a = arith.bitcast(x.type, abits)
    # Normal E2M1 range: code = rne(bits >> 22) - (254 - 2), saturated at 7 (Inf, NaN too).
    high = arith.subi(_rne_shift(abits, 22), const_like(i32, 252))
    high = _umin(high, 7)
    low = _round_small(a, 2.0)  # 0, 1 or 2 (0.5 steps below 1)
    is_small = _cmpi(arith.CmpIPredicate.ult, abits, 0x3F800000)
    code = _sel(is_small, low, high)
    is_nan = _cmpi(arith.CmpIPredicate.ugt, abits, 0x7F800000)
    sign = arith.andi(arith.shrui(bits, const_like(i32, 28)), const_like(i32, 8))
    sign = _sel(is_nan, const_like(i32, 0), sign)
    return arith.ori(code, sign)


#: the grid rounding constants (``t`` bias, multiplier of the binade marker ``T``) of the fast
#: E2M1 packings, by the domain of their values: ``"u" = |y| / 8`` (:func:`e2m1x8_pack_fast`;
#: ``T = 2^(e-3)``, ``T * magic = 2^(19+e) + 220 * 2^(e-4)``, binade exponent field ``146 +
#: e``) and ``"y" = |y|`` (:func:`e2m1x8_pack_unsat`; ``T = 2^(3+e)``, ``T * magic = 2^(22+e)
#: + 214 * 2^(e-1)``, field ``149 + e``). Each magic is exact in f32, and each mantissa offset
#: plus twice the field's base is 512 (220 + 292, 214 + 298): zero in the code's low byte.
_E2M1_GRID = {"u": (12.0 / 64, 2.0 ** 22 + 220 / 2), "y": (12.0, 2.0 ** 19 + 214 / 16)}


def saturate_f32(x: ir.Value) -> ir.Value:
    """``cvt.sat.f32.f32``: ``x`` clamped to [0, 1], NaN -> +0 (ptxas folds it into the
    producing ``FMUL`` / ``FFMA`` as ``.SAT``). CUDA only."""
    return llvm.call_intrinsic(x.type, "llvm.nvvm.saturate.f", [x], [], [])


def e2m1x8_pack_fast(xs: list[ir.Value], recip8: ir.Value, sign_words: list[ir.Value]
                     ) -> ir.Value:
    """Eight f32 ``x`` -> one i32 of the packed E2M1 codes of ``y = x * (8 recip8)`` (element
    2j in the low nibble of byte j), RNE, satfinite, bit-identical to :func:`e2m1_from_f32_sw`
    of ``fl(x * recip)`` when ``recip8 = recip / 8`` exactly and ``x * recip8`` does not
    underflow where it matters (the caller's job: ``recip8`` normal, or ``x`` and ``recip8``
    rescaled). CUDA only (the signs are gathered with ``prmt``).

    ``sign_words[i]`` holds the signs of elements 2i (bit 15) and 2i+1 (bit 31), e.g. the raw
    bf16 pair word the values were widened from (sign(y) = sign(x) as ``recip8 >= +0``).

    Magnitude, per element, 3 FMA-pipe + 1 ALU instructions and ~1.5 for the packing:

    * ``u = sat(|x| * recip8)``: ``fl(|y|) / 8`` clamped to 1 (one ``FMUL.SAT``; the abs is an
      operand modifier; a NaN product gives 0), so ``a = 8u`` is ``|y|`` saturated at 8;
    * the grid step of E2M1 around ``a`` is 0.5 below 2, 1 in [2, 4), 2 in [4, 6], 4 above
      (a binade that only holds the overflow). ``t = fma(u, u, 12 / 64)`` lies in [3/16, 1/4)
      for a < 2, [1/4, 1/2) for 2 <= a < ~4.47, [1/2, 1) up to ~7.2 and [1, 19/16] above, so
      ``T = bits(t) & 0x7F800000`` is ``2^(e-3)`` for the step ``2^(e-1)`` of ``a``. The step
      boundaries may sit anywhere in [1.75, 2.25] and [3.5, 4.5]: there both grids round to
      the same value;
    * ``s = fma(T, 2^22 + 110, u)`` adds ``K = 2^(19+e) + 220 step / 8``, whose ulp is the
      step of ``u``: one RNE rounding to the grid, ties to the even multiple ``d`` (``220 +
      d`` is the mantissa field), exactly E2M1's tie rule, since in each step range E2M1
      code parity is the parity of ``d``; the code is ``d + 2e``, 0..7 up to ``a < 7`` and
      8 from there to 8;
    * ``bits(s) = (146 + e) << 23 | (220 + d)``, so ``bits(s) + (bits(s) >> 22)`` has the low
      byte ``220 + d + 292 + 2e = 512 + code``: the code. An element pair's byte is
      ``lo + (lo >> 22) + (hi << 4) + (hi >> 18)`` (its low byte: ``code_lo | code_hi << 4``;
      three shift-adds), and three ``prmt`` gather the four pair bytes;
    * the saturation: ``w - ((w >> 3) & 0x11111111)`` turns each nibble 8 into 7 (three ALU
      instructions a word instead of a ``min(|y|, 6)`` an element);
    * then the signs (:func:`e2m1x8_merge_signs`).
    """
    if len(xs) != 8 or len(sign_words) != 4:
        raise ValueError("e2m1x8_pack_fast takes 8 values and 4 sign words")
    us = [saturate_f32(arith.mulf(mmath.absf(x), recip8)) for x in xs]
    word = _e2m1x8_grid_codes(us, "u")
    word = arith.subi(word, arith.andi(arith.shrui(word, const_like(_i32(), 3)),
                                       const_like(_i32(), 0x11111111)))
    return e2m1x8_merge_signs(word, sign_words)


def e2m1x8_pack_unsat(ys: list[ir.Value], sign_words: list[ir.Value]) -> ir.Value:
    """:func:`e2m1x8_pack_fast` of eight f32 ``y`` (already ``x * recip``, so no exact
    ``recip / 8`` is needed) without the saturation, valid only when every ``|y| < 7`` and
    no ``y`` is NaN: the caller checks the chunk's ``fl(amax * recip)`` or passes ``min(|y|,
    6)``. The grid rounding runs on ``|y|`` itself (``t = fma(y, y, 12)``, ``s = fma(T, 2^19
    + 214/16, |y|)``, the abs an operand modifier; :data:`_E2M1_GRID` ``"y"``): 3 FMA-pipe +
    1 ALU instructions an element before the packing, and no nibble-8 fix (|y| < 7 gives
    codes <= 7)."""
    if len(ys) != 8 or len(sign_words) != 4:
        raise ValueError("e2m1x8_pack_unsat takes 8 values and 4 sign words")
    return e2m1x8_merge_signs(_e2m1x8_grid_codes(ys, "y"), sign_words)


def _e2m1x8_grid_codes(vals: list[ir.Value], domain: str) -> ir.Value:
    """The E2M1 magnitudes (0..8) of eight values of ``domain`` (:data:`_E2M1_GRID`), packed:
    ``t = fma(v, v, bias)``, ``T = bits(t) & 0x7F800000``, ``s = fma(T, magic, |v|)``, the
    pair bytes ``lo + (lo >> 22) + (hi << 4) + (hi >> 18)`` and three ``prmt``."""
    f32, i32 = _f32(), _i32()
    bias, magic = (const_like(f32, c) for c in _E2M1_GRID[domain])
    exp_mask = const_like(i32, 0x7F800000)

    def grid_bits(v: ir.Value) -> ir.Value:
        t = mmath.fma(v, v, bias)
        tb = arith.bitcast(f32, arith.andi(_bits(t), exp_mask))
        return _bits(mmath.fma(tb, magic, mmath.absf(v)))

    def shr(v: ir.Value, n: int) -> ir.Value:
        return arith.shrui(v, const_like(i32, n))

    pair_bytes = []
    for j in range(4):
        lo, hi = grid_bits(vals[2 * j]), grid_bits(vals[2 * j + 1])
        hi_part = arith.addi(arith.shli(hi, const_like(i32, 4)), shr(hi, 18))
        pair_bytes.append(arith.addi(arith.addi(lo, shr(lo, 22)), hi_part))
    return NV.byte_perm(NV.byte_perm(pair_bytes[0], pair_bytes[1], 0x0040),
                        NV.byte_perm(pair_bytes[2], pair_bytes[3], 0x0040), 0x5410)


def e2m1x8_merge_signs(word: ir.Value, sign_words: list[ir.Value]) -> ir.Value:
    """Eight E2M1 magnitudes packed in ``word`` (bits 3 and 7 of each byte clear) with the
    signs of ``sign_words`` (element 2i: bit 15 of word i, element 2i+1: bit 31): two ``prmt``
    gather sign-replicated bytes, two ``prmt`` sort them even / odd, two ``lop3`` merge them
    into bits 3 / 7 of each byte. CUDA only."""
    i32 = _i32()
    q0 = NV.byte_perm(sign_words[0], sign_words[1], 0xFDB9)  # [s0, s1, s2, s3] as 0x00/0xFF
    q1 = NV.byte_perm(sign_words[2], sign_words[3], 0xFDB9)  # [s4, s5, s6, s7]
    even = NV.byte_perm(q0, q1, 0x6420)  # [s0, s2, s4, s6]
    odd = NV.byte_perm(q0, q1, 0x7531)   # [s1, s3, s5, s7]
    word = arith.ori(word, arith.andi(even, const_like(i32, 0x08080808)))
    return arith.ori(word, arith.andi(odd, const_like(i32, 0x80808080)))


def e2m1x2_from_f32_nvvm(lo: ir.Value, hi: ir.Value) -> ir.Value:
    """Two f32 -> one byte of two E2M1 codes (``lo`` in the low nibble), as i32.

    Emits ``cvt.rn.satfinite.e2m1x2.f32 d, hi, lo`` (sm_100a and later; PTX puts the first
    operand in the upper half). Bit-identical to :func:`e2m1_from_f32_sw` on both nibbles.
    """
    i8 = ir.IntegerType.get_signless(8)
    byte = nvvm.convert_f32x2_to_f4x2(i8, hi, lo, ir.TypeAttr.get(ir.Type.parse("f4E2M1FN")))
    return arith.extui(_i32(), byte)


def fp4x8_from_f32_scaled_gfx950(values: list[ir.Value], scale: ir.Value) -> ir.Value:
    """Eight f32 -> 32 bits of packed E2M1 (element 2i low nibble of byte i), divided by 2^s.

    Emits four ``v_cvt_scalef32_pk_fp4_f32`` (``rocdl.cvt.scalef32.pk.fp4.f32``), which divide
    each value by the scale, use only the scale's exponent, and round RNE with saturation.
    ``scale`` is the decoded E8M0 scale (f32 2^(b-127); 0x00 gives the subnormal 2^-127, whose
    E8M0 exponent is still 0x00). Only valid where the D2 chain is ``x * (1/2^(b-127))``, i.e.
    MX formats (power-of-two scale, so x / scale == x * recip exactly).
    """
    if len(values) != 8:
        raise ValueError(f"values must hold 8 f32 values, got {len(values)}")
    word = const_like(_i32(), 0)
    for i in range(4):
        word = rocdl.CvtScaleF32PkFp4F32Op(_i32(), word, values[2 * i], values[2 * i + 1],
                                            scale, i).result
    return word


# ---- f32 -> E4M3 ----------------------------------------------------------------------------


def e4m3_from_f32_sw(x: ir.Value) -> ir.Value:
    """f32 -> E4M3FN byte (i32, 0..255) in software: RNE, saturating to ±448, NaN -> 0x7F.

    |x| >= 2^-6: round the f32 bits to three mantissa bits (nearest even) and rebase the
    exponent; below: RNE of |x| * 2^9 (subnormals, and 2^-6 itself as code 8). ±Inf saturate.
    """
    i32 = _shape_like(x.type, _i32())
    bits = _bits(x)
    abits = arith.andi(bits, const_like(i32, 0x7FFFFFFF))
    a = arith.bitcast(x.type, abits)
    normal = arith.subi(_rne_shift(abits, 20), const_like(i32, (127 - 7) << 3))
    small = _round_small(a, 512.0)
    is_small = _cmpi(arith.CmpIPredicate.ult, abits, 0x3C800000)  # 2^-6
    code = _umin(_sel(is_small, small, normal), 0x7E)
    is_nan = _cmpi(arith.CmpIPredicate.ugt, abits, 0x7F800000)
    sign = arith.andi(arith.shrui(bits, const_like(i32, 24)), const_like(i32, 0x80))
    return _sel(is_nan, const_like(i32, 0x7F), arith.ori(code, sign))


def e4m3x2_from_f32_nvvm(lo: ir.Value, hi: ir.Value) -> ir.Value:
    """Two f32 -> two E4M3FN bytes in an i32 (``lo`` in bits 0-7, ``hi`` in bits 8-15).

    Emits ``cvt.rn.satfinite.e4m3x2.f32 d, hi, lo`` (sm_89+; used on sm_90a and sm_100a):
    RNE, finite values and ±Inf saturate to ±448, NaN -> 0x7F — bit-identical to
    :func:`e4m3_from_f32_sw`.
    """
    i16 = ir.IntegerType.get_signless(16)
    pair = nvvm.convert_f32x2_to_f8x2(i16, hi, lo, ir.TypeAttr.get(ir.Type.parse("f8E4M3FN")),
                                      rnd=ir.Attribute.parse("#nvvm.fp_rnd_mode<rn>"),
                                      sat=ir.Attribute.parse("#nvvm.sat_mode<satfinite>"))
    return arith.extui(_i32(), pair)


# ---- f32 -> E8M0 ----------------------------------------------------------------------------


def e8m0_from_f32_sw(x: ir.Value, rounding: str = "rp") -> ir.Value:
    """f32 (>= 0) -> E8M0 byte (i32) in software, rounding "rp" (toward +Inf) or "rz".

    "rp": 2^ceil(log2 x): the biased exponent plus one when the mantissa is nonzero;
    subnormals give 0x00 up to 2^-127 and 0x01 above. "rz": the exponent field (floor).
    Clamped to [0, 254]; NaN and +Inf -> 0xFF. Negative inputs are not defined (scales >= 0).
    """
    if rounding not in ("rp", "rz"):
        raise ValueError(f"rounding must be 'rp' or 'rz', got {rounding!r}")
    i32 = _shape_like(x.type, _i32())
    bits = arith.andi(_bits(x), const_like(i32, 0x7FFFFFFF))
    exp = arith.shrui(bits, const_like(i32, 23))
    if rounding == "rp":
        man = arith.andi(bits, const_like(i32, 0x7FFFFF))
        up = arith.extui(i32, _cmpi(arith.CmpIPredicate.ne, man, 0))
        normal = arith.addi(exp, up)
        sub = arith.extui(i32, _cmpi(arith.CmpIPredicate.ugt, man, 1 << 22))
        exp = _sel(_cmpi(arith.CmpIPredicate.eq, exp, 0), sub, normal)
    out = _umin(exp, 254)
    nonfinite = _cmpi(arith.CmpIPredicate.uge, bits, 0x7F800000)
    return _sel(nonfinite, const_like(i32, 0xFF), out)


def e8m0_from_f32_up_sm100(x: ir.Value) -> ir.Value:
    """f32 (>= 0, scalar) -> E8M0 byte (i32) rounding up, via ``cvt.rp.satfinite.ue8m0x2.f32``.

    sm_100a only. The instruction saturates +Inf to 0xFE; D5 wants 0xFF for NaN and Inf, so
    non-finite inputs are selected to 0xFF in software; 0 selects 0x00.
    """
    i16 = ir.IntegerType.get_signless(16)
    pair = nvvm.convert_f32x2_to_f8x2(i16, x, x, ir.TypeAttr.get(ir.Type.parse("f8E8M0FNU")),
                                      rnd=ir.Attribute.parse("#nvvm.fp_rnd_mode<rp>"),
                                      sat=ir.Attribute.parse("#nvvm.sat_mode<satfinite>"))
    byte = arith.andi(arith.extui(_i32(), pair), const_like(_i32(), 0xFF))
    bits = arith.andi(_bits(x), const_like(_i32(), 0x7FFFFFFF))
    byte = _sel(_cmpi(arith.CmpIPredicate.eq, bits, 0), const_like(_i32(), 0), byte)
    nonfinite = _cmpi(arith.CmpIPredicate.uge, bits, 0x7F800000)
    return _sel(nonfinite, const_like(_i32(), 0xFF), byte)


def e8m0_block_scale(amax: ir.Value, *, rounding: str, elem_recip: float, elem_emax: int,
                     target: GPUTarget | str) -> ir.Value:
    """E8M0 block-scale byte (i32) from the block max ``amax`` (f32 >= 0), per D2/D4/D5.

    * "up": ``cvt.rp(amax * f32(1/elem_max))`` (``elem_recip`` is that f32 constant);
      ``cvt.rp.satfinite.ue8m0x2.f32`` on sm_100a, software elsewhere;
    * "even": f32 bits of amax plus 1<<21 (one mantissa bit, half up), exponent - emax;
    * "floor": exponent field of amax - emax (floor(log2 amax) - emax).

    Clamped to [0, 254]; amax 0 -> 0x00; NaN/Inf amax -> 0xFF.
    """
    target = GPUTarget.parse(target)
    i32 = _shape_like(amax.type, _i32())
    if rounding == "up":
        s = arith.mulf(amax, const_like(amax.type, elem_recip))
        if target.name == "sm_100a" and not isinstance(amax.type, ir.VectorType):
            return e8m0_from_f32_up_sm100(s)
        return e8m0_from_f32_sw(s, "rp")
    if rounding not in ("even", "floor"):
        raise ValueError(f"rounding must be 'up', 'even' or 'floor', got {rounding!r}")
    bits = arith.andi(_bits(amax), const_like(i32, 0x7FFFFFFF))
    if rounding == "even":
        exp = arith.shrui(arith.addi(bits, const_like(i32, 1 << 21)), const_like(i32, 23))
    else:
        exp = arith.shrui(bits, const_like(i32, 23))
    # clamp(exp - emax, 0, 254) on signed values; amax == 0 gives exp 0 -> 0.
    e = arith.maxsi(arith.subi(exp, const_like(i32, elem_emax)), const_like(i32, 0))
    out = arith.minsi(e, const_like(i32, 254))
    nonfinite = _cmpi(arith.CmpIPredicate.uge, bits, 0x7F800000)
    return _sel(nonfinite, const_like(i32, 0xFF), out)


# ---- decodes --------------------------------------------------------------------------------


def e4m3_to_f32(byte: ir.Value) -> ir.Value:
    """E4M3FN byte (i32, low 8 bits) -> f32, exact; 0x7F/0xFF -> NaN. Software."""
    i32 = byte.type
    f32 = _shape_like(i32, _f32())
    b = arith.andi(byte, const_like(i32, 0xFF))
    exp = arith.andi(arith.shrui(b, const_like(i32, 3)), const_like(i32, 0xF))
    man = arith.andi(b, const_like(i32, 7))
    normal = arith.ori(arith.shli(arith.addi(exp, const_like(i32, 120)), const_like(i32, 23)),
                       arith.shli(man, const_like(i32, 20)))
    sub = _bits(arith.mulf(arith.uitofp(f32, man), const_like(f32, 2.0 ** -9)))
    mag = _sel(_cmpi(arith.CmpIPredicate.eq, exp, 0), sub, normal)
    mag = _sel(_cmpi(arith.CmpIPredicate.eq, arith.andi(b, const_like(i32, 0x7F)), 0x7F),
               const_like(i32, 0x7FC00000), mag)
    sign = arith.shli(arith.andi(b, const_like(i32, 0x80)), const_like(i32, 24))
    return arith.bitcast(f32, arith.ori(mag, sign))


def e8m0_to_f32(byte: ir.Value) -> ir.Value:
    """E8M0 byte (i32, low 8 bits) -> f32 2^(b-127); 0x00 -> 2^-127 (subnormal), 0xFF -> NaN."""
    i32 = byte.type
    b = arith.andi(byte, const_like(i32, 0xFF))
    bits = arith.shli(b, const_like(i32, 23))
    bits = _sel(_cmpi(arith.CmpIPredicate.eq, b, 0), const_like(i32, 0x00400000), bits)
    bits = _sel(_cmpi(arith.CmpIPredicate.eq, b, 0xFF), const_like(i32, 0x7FC00000), bits)
    return arith.bitcast(_shape_like(i32, _f32()), bits)


def bf16_bits_to_f32(bits16: ir.Value) -> ir.Value:
    """bf16 bit pattern (i16, scalar or vector) -> f32, exact (bits << 16). Software."""
    i32 = _shape_like(bits16.type, _i32())
    wide = arith.shli(arith.extui(i32, bits16), const_like(i32, 16))
    return arith.bitcast(_shape_like(bits16.type, _f32()), wide)


def bf16_to_f32(x: ir.Value) -> ir.Value:
    """bf16 value -> f32 (``arith.extf``; exact, lowers to a shift / prmt)."""
    return arith.extf(_shape_like(x.type, _f32()), x)


# ---- the table ------------------------------------------------------------------------------


class Rounding(str, enum.Enum):
    """Rounding of a conversion, spelled as in PTX."""

    RN = "rn"  # to nearest, ties to even
    RP = "rp"  # toward +Inf
    RZ = "rz"  # toward zero


_NV = ("sm_90a", "sm_100a")
_ALL = ("sm_90a", "sm_100a", "gfx942", "gfx950")

#: (src, dst, rounding, target) -> builder over one value. E2M1 results are codes (i32),
#: E4M3/E8M0 results are bytes (i32), decodes return f32.
CONVERSIONS: dict[tuple[str, str, str, str], Callable[[ir.Value], ir.Value]] = {}
for _t in _ALL:
    CONVERSIONS[("f32", "e2m1", "rn", _t)] = e2m1_from_f32_sw
    CONVERSIONS[("f32", "e4m3", "rn", _t)] = e4m3_from_f32_sw
    CONVERSIONS[("f32", "e8m0", "rp", _t)] = lambda v: e8m0_from_f32_sw(v, "rp")
    CONVERSIONS[("f32", "e8m0", "rz", _t)] = lambda v: e8m0_from_f32_sw(v, "rz")
    CONVERSIONS[("e4m3", "f32", "exact", _t)] = e4m3_to_f32
    CONVERSIONS[("e8m0", "f32", "exact", _t)] = e8m0_to_f32
    CONVERSIONS[("bf16", "f32", "exact", _t)] = bf16_to_f32
for _t in _NV:
    CONVERSIONS[("f32", "e4m3", "rn", _t)] = (
        lambda v: arith.andi(e4m3x2_from_f32_nvvm(v, v), const_like(_i32(), 0xFF)))
CONVERSIONS[("f32", "e2m1", "rn", "sm_100a")] = (
    lambda v: arith.andi(e2m1x2_from_f32_nvvm(v, v), const_like(_i32(), 0xF)))
CONVERSIONS[("f32", "e8m0", "rp", "sm_100a")] = e8m0_from_f32_up_sm100


def convert(value: ir.Value, src: str, dst: str, *, rounding: str | Rounding,
            target: GPUTarget | str) -> ir.Value:
    """Convert ``value`` from ``src`` to ``dst`` with ``rounding`` on ``target``.

    Formats: "f32", "bf16", "e2m1", "e4m3", "e8m0"; rounding "rn", "rp", "rz" or "exact"
    (decodes). The best bit-exact implementation for the target is chosen from
    :data:`CONVERSIONS`; native pair instructions are applied to scalars only (a vector value
    uses the software form). Raises NotImplementedError for an unsupported combination.
    """
    target = GPUTarget.parse(target)
    rnd = rounding.value if isinstance(rounding, Rounding) else str(rounding)
    key = (src, dst, rnd, target.name)
    fn = CONVERSIONS.get(key)
    if fn is None:
        raise NotImplementedError(
            f"conversion {src} -> {dst} with rounding {rnd!r} on {target.name} is not "
            "supported; go via f32 (supported: "
            f"{sorted({k[:3] for k in CONVERSIONS if k[3] == target.name})})")
    if isinstance(value.type, ir.VectorType) and fn not in (
            e2m1_from_f32_sw, e4m3_from_f32_sw, e4m3_to_f32, e8m0_to_f32, bf16_to_f32):
        soft = CONVERSIONS[(src, dst, rnd, "gfx942")]
        return soft(value)
    return fn(value)

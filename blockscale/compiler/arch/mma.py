"""NVVM warp-level MMA helpers (sm_80+, used by the sm_90a block-scaled matmul).

Each docstring names the PTX instruction emitted. Operands follow the PTX ISA fragment layouts
of ``mma.m16n8k16`` (section "Matrix Fragments for mma.m16n8k16 with floating point type"),
with ``g = laneid >> 2`` and ``t = laneid % 4``:

* A (16x16, row-major), four 32-bit registers, two 16-bit elements each (low half first):
  ``a[0]`` = A[g, 2t:2t+2], ``a[1]`` = A[g+8, 2t:2t+2], ``a[2]`` = A[g, 2t+8:2t+10],
  ``a[3]`` = A[g+8, 2t+8:2t+10];
* B (16x8, "col": indexed [k, n]), two registers: ``b[0]`` = B[2t:2t+2, g],
  ``b[1]`` = B[2t+8:2t+10, g];
* C and D (16x8 f32): ``c[0..1]`` = C[g, 2t:2t+2], ``c[2..3]`` = C[g+8, 2t:2t+2].

The numpy interpreter models these exactly (:mod:`blockscale.runtime.interpreter.ops_mma`).
"""

from __future__ import annotations

from collections.abc import Sequence

from mlir import ir
from mlir.dialects import llvm, nvvm

from blockscale.compiler.ir_types import _loc, f16, f32, i16, i32, vec

#: element types accepted by :func:`mma_m16n8k16`
MMA_INPUT_TYPES = ("bf16", "f16")


def _struct_f32x4() -> ir.Type:
    return ir.Type.parse("!llvm.struct<(f32, f32, f32, f32)>")


def mma_m16n8k16(a: Sequence[ir.Value], b: Sequence[ir.Value], c: Sequence[ir.Value], *,
                 input_type: str = "bf16",
                 loc: ir.Location | None = None) -> tuple[ir.Value, ...]:
    """``D = A @ B + C`` for one warp: ``mma.sync.aligned.m16n8k16.row.col.f32.{bf16|f16}.
    {bf16|f16}.f32`` (HMMA.16816.F32[.BF16] in SASS). Every lane of the warp must execute it.

    Args:
        a: four values (i32 holding two bf16 for "bf16"; ``vector<2xf16>`` for "f16").
        b: two values of the same kind.
        c: four f32 accumulator values.
        input_type: "bf16" or "f16".
    Returns the four f32 values of D (layout in the module docstring).
    """
    if input_type not in MMA_INPUT_TYPES:
        raise ValueError(f"input_type must be one of {MMA_INPUT_TYPES}, got {input_type!r}")
    if len(a) != 4 or len(b) != 2 or len(c) != 4:
        raise ValueError(f"mma m16n8k16 takes 4 A, 2 B and 4 C registers, got "
                         f"{len(a)}, {len(b)}, {len(c)}")
    with _loc(loc):
        ptx = nvvm.MMATypes.bf16 if input_type == "bf16" else nvvm.MMATypes.f16
        kw = {"multiplicand_a_ptx_type": ptx, "multiplicand_b_ptx_type": ptx}
        shape = ir.Attribute.parse("#nvvm.shape<m = 16, n = 8, k = 16>")
        res = nvvm.mma_sync(_struct_f32x4(), shape, nvvm.MMALayout.row, nvvm.MMALayout.col,
                            list(a), list(b), list(c), **kw)
        return tuple(llvm.extractvalue(f32(), res, [i]) for i in range(4))


def cvt_e4m3x2_to_f16x2(pair: ir.Value, *, loc: ir.Location | None = None) -> ir.Value:
    """Two E4M3FN bytes (an i16, element 0 in the low byte) -> ``vector<2xf16>``, exact:
    ``cvt.rn.f16x2.e4m3x2`` (sm_89+). Every E4M3 value (subnormals, ±448) is an f16 value;
    the NaN codes 0x7F/0xFF give an f16 NaN."""
    with _loc(loc):
        if pair.type != i16():
            raise TypeError(f"cvt_e4m3x2_to_f16x2 takes an i16, got {pair.type}")
        from mlir.dialects import vector

        one = vector.from_elements(vec(1, i16()), [pair])
        src = vector.bitcast(vec(2, ir.IntegerType.get_signless(8)), one)
        return nvvm.convert_f8x2_to_f16x2(vec(2, f16()), src,
                                          ir.TypeAttr.get(ir.Type.parse("f8E4M3FN")))


def pack_i32(v: ir.Value, *, loc: ir.Location | None = None) -> ir.Value:
    """A 32-bit value (``vector<2xbf16>``, ``vector<2xf16>``, f32) as i32 (``mov.b32``)."""
    from mlir.dialects import arith, vector

    with _loc(loc):
        if isinstance(v.type, ir.VectorType):
            return vector.extract(vector.bitcast(vec(1, i32()), v), [], [0])
        return arith.bitcast(i32(), v)

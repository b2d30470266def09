"""The kernel IR of :func:`blockscale.activations.exp_f32`, blockscale's one float32 exp.

``exp_f32(x)`` emits exactly the operation sequence documented on the numpy definition (same
constants, same order, one ``arith`` op per step) so the GPU, the interpreter and the reference
produce identical bits on every target (docs/internals.md, "Decision: exp"). It uses only
``arith.mulf / addf / subf / minimumf / maximumf`` (no fast-math flags, so no fma contraction
and no reassociation), ``arith.bitcast`` and integer ``addi / subi / shrsi / shli``: no libdevice
/ ocml call. Works on an f32 scalar or a vector of f32.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith

from blockscale import activations as A
from blockscale.compiler import ir as B


def _like(v: ir.Value, elem: ir.Type) -> ir.Type:
    if isinstance(v.type, ir.VectorType):
        return ir.VectorType.get(ir.VectorType(v.type).shape, elem)
    return elem


def exp_f32(x: ir.Value) -> ir.Value:
    """``exp_f32(x)`` as IR (f32 scalar or vector); see :func:`blockscale.activations.exp_f32`."""
    ft = x.type
    it = _like(x, B.i32())

    def cf(v: float) -> ir.Value:
        return B.const(float(v), ft)

    def ci(v: int) -> ir.Value:
        return B.const(int(v), it)

    magic = cf(A.EXP_MAGIC)
    xc = arith.minimumf(arith.maximumf(x, cf(A.EXP_LO)), cf(A.EXP_HI))
    t = arith.addf(arith.mulf(xc, cf(A.EXP_LOG2E)), magic)
    kf = arith.subf(t, magic)
    k = arith.subi(B.bitcast(t, it), ci(A.EXP_MAGIC_BITS))
    r = arith.subf(arith.subf(xc, arith.mulf(kf, cf(A.EXP_LN2_HI))),
                   arith.mulf(kf, cf(A.EXP_LN2_LO)))
    q = cf(A.EXP_POLY[-1])
    for c in A.EXP_POLY[-2::-1]:
        q = arith.addf(arith.mulf(q, r), cf(c))
    e = arith.addf(cf(1.0), arith.addf(r, arith.mulf(arith.mulf(r, r), q)))
    k1 = arith.shrsi(k, ci(1))
    k2 = arith.subi(k, k1)
    s1 = B.bitcast(arith.shli(arith.addi(k1, ci(127)), ci(23)), ft)
    s2 = B.bitcast(arith.shli(arith.addi(k2, ci(127)), ci(23)), ft)
    return arith.mulf(arith.mulf(e, s1), s2)

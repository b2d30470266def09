"""ROCDL (AMD) instruction helpers. Each docstring names the AMDGCN instruction emitted.

Use inside ``with kernel_module(...)`` for a HIP target; portable code should prefer the
``gpu`` dialect helpers of :mod:`blockscale.compiler.ir`.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, rocdl

from blockscale.compiler.ir_types import _loc, i32


def _c(v: int) -> ir.Value:
    return arith.constant(i32(), ir.IntegerAttr.get(i32(), v))


def lane_id(*, loc: ir.Location | None = None) -> ir.Value:
    """Lane within the 64-wide wavefront (i32):
    ``v_mbcnt_lo_u32_b32 v, -1, 0`` then ``v_mbcnt_hi_u32_b32 v, -1, v``."""
    with _loc(loc):
        lo = rocdl.mbcnt_lo(i32(), _c(-1), _c(0))
        return rocdl.mbcnt_hi(i32(), _c(-1), lo)


def readfirstlane(value: ir.Value, *, loc: ir.Location | None = None) -> ir.Value:
    """The value of the first active lane, as a wave-uniform scalar:
    ``v_readfirstlane_b32 s, v``."""
    with _loc(loc):
        return rocdl.readfirstlane(value.type, value)


def ds_bpermute(value: ir.Value, src_lane: ir.Value, *,
                loc: ir.Location | None = None) -> ir.Value:
    """Read the i32 ``value`` of lane ``src_lane`` (a lane index, scaled to bytes here):
    ``ds_bpermute_b32 v, vaddr(src_lane*4), v``. All lanes of the wavefront participate."""
    with _loc(loc):
        addr = arith.muli(src_lane, _c(4))
        return rocdl.ds_bpermute(i32(), addr, value)

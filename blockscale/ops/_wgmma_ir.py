"""IR building blocks of the sm_90a wgmma block-scaled matmul (NVFP4).

Imports MLIR: only :func:`blockscale.ops.matmul_wgmma.build` imports it.

Data path (per K-step of :data:`STEP_ELEMS` = 32 elements, two NVFP4 blocks)
---------------------------------------------------------------------------
Every thread of the CTA owns one row of the step: threads 0..bm-1 a row of A, the next bn a
row of B. It reads the row's 16 FP4 bytes (one ``ld.global.v4``, zeros for rows past M / N
and for bytes past the row end) and the two E4M3 block scales of its row, dequantizes the 32
codes to bf16 with the block scale folded in (``prmt`` table lookup, then ``mul.rn.bf16x2``
by the scale: E2M1 x E4M3 has at most 6 significant bits in [2^-10, 2688], exact in bf16),
and stores them to shared memory in the canonical no-swizzle K-major wgmma layout: the core
matrix (8 rows x 16 bytes = 8 K-elements) of row group ``g`` and K chunk ``c`` at
``g * SBO + c * LBO`` with LBO = 128, SBO = 512 (a step's 4 chunks of a row group are one
contiguous 512-byte block). Each 16-byte store is one core-matrix row.

Then ``fence.proxy.async.shared::cta``, a CTA barrier, ``wgmma.fence``, and per warpgroup two
``wgmma.mma_async.m64n{bn}k16.f32.bf16.bf16`` (one per NVFP4 block: A rows 64 wg..64 wg+63,
all bn rows of B), ``commit_group`` and ``wait_group 1``. Shared memory holds
:data:`STAGES` = 3 steps, so the group of step s is retired (by the ``wait_group 1`` of step
s + 1, before the barrier of step s + 2) before step s + 3 overwrites its stage: one barrier
per step, and the dequantization of step s + 1 overlaps the tensor cores of step s.

Numerics (bit-identical to the portable kernel, in the interpreter's model)
-------------------------------------------------------------------------
One wgmma k16 is one NVFP4 block j. Its products ``(a sA)(b sB)`` are exact, and the block
sum ``sA sB sum(a b)`` is exact (sum(a b) a multiple of 1/4 below 2^11: 13 bits, times
sA sB: 8 bits). The tensor core adds it to the fp32 accumulator: one rounding per block after
the first (0 + p_0 is exact), i.e. ``acc_j = fl(acc_{j-1} + p_j sA sB)``, the portable
kernel's order and roundings (SEMANTICS §4.1, tests/test_matmul_common.py: n = J - 1). This
assumes the tensor core adds an exact block sum to the accumulator with one RNE rounding (the
interpreter's model, as for ``mma.sync``); hardware that truncates the final alignment would
stay within 2x of that bound (the GPU tests check the stated bound; see matmul_wgmma).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import convert
from blockscale.compiler.arch import wgmma as W
from blockscale.layouts import SF_ATOM_BYTES
from blockscale.ops._mma_ir import Operand, _scale_bf16x2, fp4x4_to_bf16x2x2, workgroup_buffer

Value = ir.Value

#: K elements per step (two NVFP4 blocks; 16 FP4 bytes per row)
STEP_ELEMS = 32
#: shared-memory stages (a stage is read by the wgmma group of its step)
STAGES = 3
#: core-matrix offsets of the operand layout (bytes)
LBO, SBO = 128, 512
CHUNKS = STEP_ELEMS // 8  # 16-byte core-matrix rows per row and step


@dataclasses.dataclass(frozen=True)
class Tiles:
    """CTA tile: ``bm = 64 * warpgroups`` rows of A, ``bn`` of B; one thread per row (so
    bm == bn: the bm + bn threads are exactly the 2 bm / 128 warpgroups that run the wgmma
    of their 64 rows of A)."""

    bm: int = 128
    bn: int = 128

    def __post_init__(self) -> None:
        if (self.bm, self.bn) not in ((64, 64), (128, 128)):
            raise ValueError(f"tiles: (bm, bn) must be (64, 64) or (128, 128), got "
                             f"{(self.bm, self.bn)}")

    @property
    def threads(self) -> int:
        return self.bm + self.bn

    @property
    def warpgroups(self) -> int:
        return self.bm // 64

    @property
    def operand_bytes(self) -> tuple[int, int]:
        """Shared bytes of A and B per stage."""
        return self.bm * 2 * STEP_ELEMS, self.bn * 2 * STEP_ELEMS

    @property
    def stage_bytes(self) -> int:
        return sum(self.operand_bytes)


def layout_offset(r: Value, c: int) -> Value:
    """Byte offset of core-matrix row (row ``r``, K chunk ``c``) in an operand tile."""
    return bir.add(bir.add(bir.mul(bir.udiv(r, 8), SBO), bir.mul(bir.urem(r, 8), 16)), c * LBO)


def _dequant_row(codes: Value, scales: tuple[Value, Value]) -> list[Value]:
    """16 FP4 bytes (vector<16xi8>) -> 4 vector<4xi32> core-matrix rows of bf16 (block j's
    |scale|, a ``vector<2xbf16>`` splat, folded into chunks 2j, 2j+1)."""
    words = vector.bitcast(bir.vec(4, bir.i32()), codes)
    rows = []
    for c in range(CHUNKS):
        w = vector.extract(words, [], [c])
        regs = [*fp4x4_to_bf16x2x2(w), *fp4x4_to_bf16x2x2(bir.shru(w, 16))]
        regs = [_scale_bf16x2(x, scales[c // 2]) for x in regs]
        rows.append(vector.from_elements(bir.vec(4, bir.i32()), regs))
    return rows


def _row_scales(op: Operand, r: Value, step: Value) -> tuple[Value, Value]:
    """|scale| of K-blocks 2 step, 2 step + 1 of local row ``r`` as bf16 splats (exact)."""
    j = bir.mul(step, 2)
    off = bir.add(op.scale_offset(r), bir.add(bir.mul(bir.udiv(j, 4), SF_ATOM_BYTES),
                                              bir.urem(j, 4)))
    pair = bir.vector_load(bir.vec(2, bir.i8()), op.scales, off, alignment=2)
    v = arith.andi(arith.extui(bir.vec(2, bir.i32()), pair), bir.const(0x7F, bir.vec(2, bir.i32())))
    s = arith.truncf(bir.vec(2, bir.bf16()), convert.e4m3_to_f32(v))
    return tuple(vector.broadcast(bir.vec(2, bir.bf16()), vector.extract(s, [], [i]))
                 for i in range(2))


def _stage_operand(op: Operand, smem: Value, base: Value, r: Value, step: Value,
                   row_bytes: Value) -> None:
    """Dequantize local row ``r`` of ``op`` for ``step`` into the tile at byte ``base``."""
    v16 = bir.vec(16, bir.i8())
    col = bir.mul(step, STEP_ELEMS // 2)
    ok = bir.logical_and(op.valid(r), bir.ult(col, row_bytes))
    br = bir.if_(ok, [v16])
    with br.then():
        br.yield_(bir.vector_load(v16, op.data, bir.add(bir.mul(op.row(r), row_bytes), col),
                                  alignment=16))
    with br.else_():
        br.yield_(bir.const(0, v16))
    rows = _dequant_row(br.results[0], _row_scales(op, r, step))
    zero = bir.const(0, bir.vec(4, bir.i32()))
    for c, v in enumerate(rows):
        # invalid rows store zeros (their scale bytes may be padding, e.g. a NaN code)
        v = vector.bitcast(bir.vec(16, bir.i8()), arith.select(ok, v, zero))
        bir.vector_store(v, smem, bir.add(base, layout_offset(r, c)), alignment=16)


def aligned_workgroup_buffer(kb: bir.KernelBuilder, size: int, align: int = 1024) -> Value:
    """An i8 workgroup buffer whose shared address is a multiple of ``align`` (the
    attribution's ``llvm.align``: ``.shared .align 1024`` in PTX), as wgmma operands need
    (16 bytes without swizzle, the swizzle pattern's repeat with one)."""
    buf = workgroup_buffer(kb, size, bir.i8())
    n = int(str(kb.func.attributes["workgroup_attributions"]).split(":")[0])
    old = list(kb.func.attributes["workgroup_attrib_attrs"]) \
        if "workgroup_attrib_attrs" in kb.func.attributes else []
    old += [ir.DictAttr.get({})] * (n - len(old))
    old[n - 1] = ir.DictAttr.get({"llvm.align": ir.IntegerAttr.get(bir.i64(), align)})
    kb.func.attributes["workgroup_attrib_attrs"] = ir.ArrayAttr.get(old)
    return buf


def emit_mainloop(kb: bir.KernelBuilder, tiles: Tiles, a: Operand, b: Operand, k: Value
                  ) -> tuple[Value, Value]:
    """The K loop; returns (the warpgroup's accumulator struct, warpgroup index). Every
    thread of the CTA must execute it (barriers, warpgroup-wide wgmma)."""
    smem = aligned_workgroup_buffer(kb, STAGES * tiles.stage_bytes)
    tid = bir.thread_idx("x")
    wg = bir.udiv(tid, 128)
    is_a = bir.ult(tid, tiles.bm)
    row_bytes = bir.udiv(k, 2)
    steps = bir.ceil_div(k, STEP_ELEMS)
    a_bytes = tiles.operand_bytes[0]
    base_desc = W.descriptor(W.shared_address(smem), lbo=LBO, sbo=SBO)
    acc0 = W.zero_accumulator(tiles.bn)
    with bir.for_range(0, steps, carry=[acc0]) as loop:
        step = loop.iv
        stage0 = bir.mul(bir.urem(step, STAGES), tiles.stage_bytes)
        with bir.when(is_a):
            _stage_operand(a, smem, stage0, tid, step, row_bytes)
        with bir.when(arith.xori(is_a, bir.const(True, bir.i1()))):
            _stage_operand(b, smem, bir.add(stage0, a_bytes), bir.sub(tid, tiles.bm), step,
                           row_bytes)
        W.fence_proxy_async_shared()
        bir.barrier()
        da = W.advance(base_desc, bir.as_i64(bir.add(stage0, bir.mul(wg, 8 * SBO))))
        db = W.advance(base_desc, bir.as_i64(bir.add(stage0, a_bytes)))
        W.fence()
        acc = loop.carried[0]
        for h in range(STEP_ELEMS // 16):
            acc = W.mma_async_bf16(acc, W.advance(da, 2 * h * LBO), W.advance(db, 2 * h * LBO),
                                   tiles.bn)
        W.commit_group()
        W.wait_group(1)
        loop.yield_(acc)
    W.wait_group(0)
    return loop.results[0], wg


def accumulator_tiles(acc: Value, n: int) -> list[list[list[Value]]]:
    """``acc[0][nt][i]``: the fragment as m16n8 C tiles (the layout of
    :class:`blockscale.ops._mma_ir.WarpCoords` with ``row0 = 64 wg + 16 warp``)."""
    vals = W.accumulator_values(acc, n)
    return [[vals[4 * nt:4 * nt + 4] for nt in range(n // 8)]]


def warp_coords(wg: Value) -> Any:
    """:class:`~blockscale.ops._mma_ir.WarpCoords` of the wgmma D fragment."""
    from blockscale.ops._mma_ir import WarpCoords

    tid = bir.thread_idx("x")
    lane = bir.urem(tid, 32)
    warp = bir.urem(bir.udiv(tid, 32), 4)
    return WarpCoords(tid, bir.udiv(lane, 4), bir.urem(lane, 4),
                      bir.add(bir.mul(wg, 64), bir.mul(warp, 16)), bir.const(0))

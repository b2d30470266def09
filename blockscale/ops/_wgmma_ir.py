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

Variants (spec fields): ``kstep=64`` stages 64 elements per step (two 16-byte loads per
row, SBO = 1024, four wgmmas per step; 96 KiB of dynamic shared memory at 128 x 128), and
``dequant="shift"`` replaces the ``prmt`` table lookups by bf16 bit placement (operands
scaled by 2^-8 each, undone exactly in the epilogue; see :func:`_fp4x8_shift`). The global
loads of the next step are issued before the current step is dequantized (:data:`PREFETCH`).

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

#: K elements per step by default (two NVFP4 blocks; 16 FP4 bytes per row)
STEP_ELEMS = 32
#: the K-steps built: 32 (3 stages in 48 KiB of static shared memory at 128 x 128) and 64
#: (two 16-byte loads per row, half the per-step overhead; 96 KiB of dynamic shared memory)
KSTEPS = (32, 64)
#: shared-memory stages (a stage is read by the wgmma group of its step)
STAGES = 3
#: core-matrix offsets of the operand layout (bytes; SBO for the default step, else
#: :attr:`Tiles.sbo`)
LBO, SBO = 128, 512
#: steps whose global loads are in flight (loop-carried registers) ahead of the dequantization
PREFETCH = 1


@dataclasses.dataclass(frozen=True)
class Tiles:
    """CTA tile: ``bm = 64 * warpgroups`` rows of A, ``bn`` of B; one thread per row (so
    bm == bn: the bm + bn threads are exactly the 2 bm / 128 warpgroups that run the wgmma
    of their 64 rows of A)."""

    bm: int = 128
    bn: int = 128
    #: K elements per step (:data:`KSTEPS`)
    kstep: int = STEP_ELEMS

    def __post_init__(self) -> None:
        if (self.bm, self.bn) not in ((64, 64), (128, 128)):
            raise ValueError(f"tiles: (bm, bn) must be (64, 64) or (128, 128), got "
                             f"{(self.bm, self.bn)}")
        if self.kstep not in KSTEPS:
            raise ValueError(f"tiles: kstep must be one of {KSTEPS}, got {self.kstep}")

    @property
    def chunks(self) -> int:
        """16-byte core-matrix rows (8 K-elements) per row and step."""
        return self.kstep // 8

    @property
    def sbo(self) -> int:
        """Stride-dimension byte offset: a row group's step is ``chunks`` core matrices."""
        return self.chunks * LBO

    @property
    def shared_bytes(self) -> int:
        return STAGES * self.stage_bytes

    @property
    def dynamic(self) -> bool:
        """Whether the stages need dynamic shared memory (over the 48 KiB static limit)."""
        return self.shared_bytes > 48 * 1024

    @property
    def threads(self) -> int:
        return self.bm + self.bn

    @property
    def warpgroups(self) -> int:
        return self.bm // 64

    @property
    def operand_bytes(self) -> tuple[int, int]:
        """Shared bytes of A and B per stage."""
        return self.bm * 2 * self.kstep, self.bn * 2 * self.kstep

    @property
    def stage_bytes(self) -> int:
        return sum(self.operand_bytes)


def layout_offset(r: Value, c: int, sbo: int = SBO) -> Value:
    """Byte offset of core-matrix row (row ``r``, K chunk ``c``) in an operand tile."""
    return bir.add(bir.add(bir.mul(bir.udiv(r, 8), sbo), bir.mul(bir.urem(r, 8), 16)), c * LBO)


#: dequantization variants: "lut" (``prmt`` table lookups, sign bits moved separately) and
#: "shift" (sign and magnitude bits placed straight into bf16 fields, see
#: :func:`_fp4x8_shift`; relies on bf16 subnormal inputs of ``mul.rn.bf16x2``)
DEQUANT = ("lut", "shift")
#: "shift" operands are the true values times 2^SHIFT_EXP (products: 2^(2 SHIFT_EXP))
SHIFT_EXP = -8


def _fp4x8_lut(w: Value) -> list[Value]:
    """Eight E2M1 codes (an i32, code i in nibble i) -> 4 bf16 pairs (i32), codes (0, 1),
    (2, 3), (4, 5), (6, 7) (:func:`blockscale.ops._mma_ir.fp4x4_to_bf16x2x2`)."""
    return [*fp4x4_to_bf16x2x2(w), *fp4x4_to_bf16x2x2(bir.shru(w, 16))]


def _fp4x8_shift(w: Value) -> list[Value]:
    """Eight E2M1 codes -> 4 bf16 pairs (i32) *times 2^-126*, codes (0, 4), (1, 5), (2, 6),
    (3, 7) (a K permutation inside the 8 codes; A and B use the same one, so every block sum
    is unchanged). Pair i: ``q = w << (12 - 4 i)`` puts code i in bits 12-15 and code i + 4
    in bits 28-31 (sign bits at 15 / 31, the bf16 sign bits); ``(q >> 6) & 0x01C001C0``
    moves the magnitudes ``e1 e0 m`` to bf16 bits 8-6 (exponent LSBs, mantissa MSB). As bf16
    that is ``2^(E-127) (1 + m/2)`` for E > 0 and the subnormal ``m 2^-127`` for E = 0: the
    E2M1 value ``2^(E-1) (1 + m/2)`` (resp. ``m / 2``) times 2^-126, exactly. 2-3 integer
    instructions per pair (SHL, SHR, LOP3)."""
    out = []
    for i in range(4):
        q = bir.shl(w, 12 - 4 * i) if i < 3 else w
        sign = bir.bit_and(q, _i32(0x80008000))
        mag = bir.bit_and(bir.shru(q, 6), _i32(0x01C001C0))
        out.append(bir.bit_or(sign, mag))
    return out


def _i32(v: int) -> Value:
    return bir.const(v - (1 << 32) if v >= 1 << 31 else v, bir.i32())


def _dequant_row(codes: Value, scales: tuple[Value, Value], dequant: str) -> list[Value]:
    """16 FP4 bytes (vector<16xi8>) -> 4 vector<4xi32> core-matrix rows of bf16 (block j's
    scale factor, a ``vector<2xbf16>`` splat from :func:`_scale_splats`, folded into chunks
    2j, 2j+1 by ``mul.rn.bf16x2``)."""
    nw = ir.VectorType(codes.type).shape[0] // 4
    words = vector.bitcast(bir.vec(nw, bir.i32()), codes)
    rows = []
    for c in range(nw):
        w = vector.extract(words, [], [c])
        regs = _fp4x8_lut(w) if dequant == "lut" else _fp4x8_shift(w)
        regs = [_scale_bf16x2(x, scales[c // 2]) for x in regs]
        rows.append(vector.from_elements(bir.vec(4, bir.i32()), regs))
    return rows


def _scale_splats(pair: Value, dequant: str) -> tuple[Value, ...]:
    """E4M3 scale bytes (vector<n x i8>) -> bf16 splats of |scale| ("lut") or
    |scale| * 2^(126 + SHIFT_EXP) ("shift": <= 448 * 2^118 < 2^127, >= 2^109), exact."""
    n = ir.VectorType(pair.type).shape[0]
    v = arith.andi(arith.extui(bir.vec(n, bir.i32()), pair),
                   bir.const(0x7F, bir.vec(n, bir.i32())))
    f = convert.e4m3_to_f32(v)
    if dequant == "shift":
        f = arith.mulf(f, bir.const(2.0 ** (126 + SHIFT_EXP), bir.vec(n, bir.f32())))
    s = arith.truncf(bir.vec(n, bir.bf16()), f)
    return tuple(vector.broadcast(bir.vec(2, bir.bf16()), vector.extract(s, [], [i]))
                 for i in range(n))


def accumulator_scale(dequant: str) -> float:
    """What the accumulators must be multiplied by (exactly: a power of two, and no partial
    sum is subnormal) to give the true sums."""
    return 1.0 if dequant == "lut" else 2.0 ** (-2 * SHIFT_EXP)


def _row_types(kstep: int) -> list[ir.Type]:
    return [bir.vec(kstep // 2, bir.i8()), bir.vec(kstep // 16, bir.i8())]


def _load_row(op: Operand, r: Value, step: Value, row_bytes: Value, kstep: int
              ) -> tuple[Value, Value]:
    """(kstep / 2 FP4 bytes, kstep / 16 scale bytes) of local row ``r`` for ``step``
    (K-blocks ``step * kstep / 16`` on); zeros for rows past the operand and 16-byte pieces
    past K (K % 32 == 0; so also for the prefetches past the last step), whose scale bytes
    may be padding or out of bounds."""
    vd, vs = _row_types(kstep)
    v16 = bir.vec(16, bir.i8())
    col = bir.mul(step, kstep // 2)
    br = bir.if_(bir.logical_and(op.valid(r), bir.ult(col, row_bytes)), [vd, vs])
    with br.then():
        base = bir.add(bir.mul(op.row(r), row_bytes), col)
        data = bir.vector_load(v16, op.data, base, alignment=16)
        if kstep == 64:  # the second 16 bytes only while in the row (K % 64 may be 32)
            hi = bir.if_(bir.ult(bir.add(col, 16), row_bytes), [v16])
            with hi.then():
                hi.yield_(bir.vector_load(v16, op.data, bir.add(base, 16), alignment=16))
            with hi.else_():
                hi.yield_(bir.const(0, v16))
            data = vector.shuffle(data, hi.results[0], list(range(32)))
        j = bir.mul(step, kstep // 16)
        off = bir.add(op.scale_offset(r), bir.add(bir.mul(bir.udiv(j, 4), SF_ATOM_BYTES),
                                                  bir.urem(j, 4)))
        br.yield_(data, bir.vector_load(vs, op.scales, off, alignment=kstep // 16))
    with br.else_():
        br.yield_(bir.const(0, vd), bir.const(0, vs))
    return br.results[0], br.results[1]


def _load_either(is_a: Value, a: Operand, b: Operand, r: Value, step: Value,
                 row_bytes: Value, kstep: int) -> list[Value]:
    """:func:`_load_row` of A's row ``r`` when ``is_a``, else of B's."""
    br = bir.if_(is_a, _row_types(kstep))
    with br.then():
        br.yield_(*_load_row(a, r, step, row_bytes, kstep))
    with br.else_():
        br.yield_(*_load_row(b, r, step, row_bytes, kstep))
    return list(br.results)


def _store_row(smem: Value, base: Value, r: Value, data: Value, scales: Value,
               dequant: str, sbo: int) -> None:
    """Dequantize one row's step (:func:`_dequant_row`) into the tile at byte ``base``."""
    for c, v in enumerate(_dequant_row(data, _scale_splats(scales, dequant), dequant)):
        bir.vector_store(vector.bitcast(bir.vec(16, bir.i8()), v), smem,
                         bir.add(base, layout_offset(r, c, sbo)), alignment=16)


def dynamic_shared_buffer() -> Value:
    """The kernel's dynamic shared memory as ``memref<?xi8, workgroup>``
    (``gpu.dynamic_shared_memory``: ``.extern .shared .align 16 .b8 __dynamic_shmem__0[]``;
    the launch passes the size, :attr:`Tiles.shared_bytes`)."""
    from mlir.dialects import gpu

    t = ir.MemRefType.get([ir.ShapedType.get_dynamic_size()], bir.i8(),
                          memory_space=ir.Attribute.parse("#gpu.address_space<workgroup>"))
    return gpu.dynamic_shared_memory(t)


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


def emit_mainloop(kb: bir.KernelBuilder, tiles: Tiles, a: Operand, b: Operand, k: Value,
                  dequant: str = "lut") -> tuple[Value, Value]:
    """The K loop; returns (the warpgroup's accumulator struct, warpgroup index). Every
    thread of the CTA must execute it (barriers, warpgroup-wide wgmma).

    The global loads of step s + :data:`PREFETCH` are issued (into loop-carried registers)
    before step s is dequantized, so their latency overlaps a step."""
    smem = dynamic_shared_buffer() if tiles.dynamic else \
        aligned_workgroup_buffer(kb, tiles.shared_bytes)
    kstep, sbo = tiles.kstep, tiles.sbo
    tid = bir.thread_idx("x")
    wg = bir.udiv(tid, 128)
    is_a = bir.ult(tid, tiles.bm)
    r = arith.select(is_a, tid, bir.sub(tid, tiles.bm))
    op_base = arith.select(is_a, bir.const(0), bir.const(tiles.operand_bytes[0]))
    row_bytes = bir.udiv(k, 2)
    steps = bir.ceil_div(k, kstep)
    a_bytes = tiles.operand_bytes[0]
    base_desc = W.descriptor(W.shared_address(smem), lbo=LBO, sbo=sbo)
    pre = [x for p in range(PREFETCH) for x in _load_either(is_a, a, b, r, bir.const(p),
                                                               row_bytes, kstep)]
    with bir.for_range(0, steps, carry=[W.zero_accumulator(tiles.bn), *pre]) as loop:
        step = loop.iv
        acc, regs = loop.carried[0], list(loop.carried[1:])
        nxt = _load_either(is_a, a, b, r, bir.add(step, PREFETCH), row_bytes, kstep)
        stage0 = bir.mul(bir.urem(step, STAGES), tiles.stage_bytes)
        _store_row(smem, bir.add(stage0, op_base), r, regs[0], regs[1], dequant, sbo)
        W.fence_proxy_async_shared()
        bir.barrier()
        da = W.advance(base_desc, bir.as_i64(bir.add(stage0, bir.mul(wg, 8 * sbo))))
        db = W.advance(base_desc, bir.as_i64(bir.add(stage0, a_bytes)))
        W.fence()
        for h in range(kstep // 16):
            acc = W.mma_async_bf16(acc, W.advance(da, 2 * h * LBO), W.advance(db, 2 * h * LBO),
                                   tiles.bn)
        W.commit_group()
        W.wait_group(1)
        loop.yield_(acc, *regs[2:], *nxt)
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

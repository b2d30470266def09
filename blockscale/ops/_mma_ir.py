"""IR building blocks of the sm_90a tensor-core block-scaled matmul (dense and grouped).

Imports MLIR: only the ``build`` functions of :mod:`blockscale.ops.matmul_sm90` import it.

Numerics (why the result is the portable kernel's, bit for bit, for FP4)
-----------------------------------------------------------------------
A K-step covers 4 scale blocks (64 elements for NVFP4, 128 for MX formats). For every block
j and every 16x8 output tile the warp runs ``mma.sync.m16n8k16`` (one per 16 elements, chained
inside the block, starting from a zero accumulator) on *dequantized* operands, then folds
the block into the fp32 accumulator with one IEEE multiply-add per output:

* NVFP4: B is dequantized with its E4M3 scale folded in (``e2m1 * |sB|`` is exact in bf16:
  at most 6 significant bits, in [2^-10, 2688]); the MMA block sum
  ``sB * sum(a * b)`` is exact (a multiple of sB/4 below 2^12 * sB: 16 significant bits),
  then ``acc += blk * |sA|`` (exact product, one rounding);
* MXFP4: operands are plain E2M1 in bf16, the block sum is exact (multiples of 1/4 below
  2^11), then ``acc += blk * (sA * sB)`` (the f32 product of the two E8M0 scales, as the
  portable kernel forms it);
* MXFP8: E4M3 -> f16 (``cvt.rn.f16x2.e4m3x2``, exact) and f16 MMAs; the 32-term block sum is
  rounded by the tensor core (twice per block in the interpreter's model), within the
  B - 1 roundings per block of tests/test_matmul_common.py; then as MXFP4.

So for FP4 the only roundings are the J - 1 accumulations and the alpha multiply, in the same
order as :mod:`blockscale.ops._matmul_ir`, provided the tensor core sums 16 products exactly
when they are multiples of one quantum within 2^16 of it (true of every published model of
HMMA fp32 accumulation: products are exact and aligned with >= 24 bits).

Data path: 16-byte global loads (``ld.global.v4``) stage each K-step of A and B into shared
memory (rows padded by 16 bytes: conflict-free fragment reads); the block scales are decoded
once to f32 into shared memory (blocks past K read as 0). Each thread then reads its fragment
bytes (PTX fragment layout of ``mma.m16n8k16``, see :mod:`blockscale.compiler.arch.mma`) and
dequantizes them in registers. The K order inside a block is permuted identically for A and
B (thread t takes bytes 2t..2t+1 of an NVFP4 block, 4t..4t+3 of an MX 16-element half), which
leaves every block sum unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from mlir import ir
from mlir.dialects import arith, math, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import convert, mma
from blockscale.compiler.arch.nvvm import byte_perm
from blockscale.formats import Format
from blockscale.layouts import SF_ATOM_BYTES

Value = ir.Value

#: bf16 bit patterns of the E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 split into byte tables
#: for ``prmt`` lookups (entry i = byte i of the 8-byte pool {hi word, lo word}).
_LUT_LO = (0xC0800000, 0xC0804000)  # low bytes: 00 00 80 C0 | 00 40 80 C0
_LUT_HI = (0x3F3F3F00, 0x40404040)  # high bytes: 00 3F 3F 3F | 40 40 40 40


@dataclasses.dataclass(frozen=True)
class Tiles:
    """CTA tiling: ``bm x bn`` outputs per CTA, ``warps_m x warps_n`` warps."""

    bm: int = 64
    bn: int = 128
    warps_m: int = 2
    warps_n: int = 2

    def __post_init__(self) -> None:
        if self.bm % (16 * self.warps_m) or self.bn % (8 * self.warps_n):
            raise ValueError(f"tiles: bm={self.bm} must be a multiple of 16*warps_m and "
                             f"bn={self.bn} of 8*warps_n")
        if 128 % self.bm or 128 % self.bn:
            raise ValueError(f"tiles: bm={self.bm} and bn={self.bn} must divide 128 (one "
                             "5-D scale tile covers the CTA's rows)")

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def wm(self) -> int:
        return self.bm // self.warps_m

    @property
    def wn(self) -> int:
        return self.bn // self.warps_n

    @property
    def m_tiles(self) -> int:
        return self.wm // 16

    @property
    def n_tiles(self) -> int:
        return self.wn // 8


@dataclasses.dataclass(frozen=True)
class Plan:
    """Per-format constants of the mainloop."""

    fmt: Format

    @property
    def block(self) -> int:
        return self.fmt.block_size

    @property
    def step_elems(self) -> int:
        """Elements of K per step: 4 scale blocks (one 32-bit word of 5-D scales per row)."""
        return 4 * self.block

    @property
    def step_bytes(self) -> int:
        return self.step_elems // 2 if self.fmt.is_fp4 else self.step_elems

    @property
    def row_stride(self) -> int:
        """Shared-memory bytes per staged row (16 bytes of padding: no bank conflicts)."""
        return self.step_bytes + 16

    @property
    def mmas_per_block(self) -> int:
        return self.block // 16

    @property
    def mma_type(self) -> str:
        return "bf16" if self.fmt.is_fp4 else "f16"

    @property
    def fold_b_scale(self) -> bool:
        """NVFP4 folds |sB| into the bf16 B operand (exact, see the module docstring)."""
        return self.fmt.is_fp4 and not self.fmt.is_mx


# ---- shared memory -----------------------------------------------------------------------


def workgroup_buffer(kb: bir.KernelBuilder, size: int, elem: ir.Type) -> Value:
    """A ``memref<size x elem, workgroup>`` workgroup attribution of the kernel (static
    shared memory, one copy per CTA)."""
    func = kb.func
    n = 0
    if "workgroup_attributions" in func.attributes:
        n = int(str(func.attributes["workgroup_attributions"]).split(":")[0])
    t = ir.MemRefType.get([size], elem,
                          memory_space=ir.Attribute.parse("#gpu.address_space<workgroup>"))
    arg = func.regions[0].blocks[0].add_argument(t, bir.caller_location())
    func.attributes["workgroup_attributions"] = ir.IntegerAttr.get(bir.i64(), n + 1)
    return arg


@dataclasses.dataclass
class Smem:
    """The shared buffers of one mainloop: staged A/B bytes and decoded f32 scales."""

    a: Value
    b: Value
    sa: Value
    sb: Value

    @staticmethod
    def allocate(kb: bir.KernelBuilder, plan: Plan, tiles: Tiles) -> Smem:
        return Smem(workgroup_buffer(kb, tiles.bm * plan.row_stride, bir.i8()),
                    workgroup_buffer(kb, tiles.bn * plan.row_stride, bir.i8()),
                    workgroup_buffer(kb, tiles.bm * 4, bir.f32()),
                    workgroup_buffer(kb, tiles.bn * 4, bir.f32()))


# ---- operand descriptions -------------------------------------------------------------------


@dataclasses.dataclass
class Operand:
    """How the CTA's rows of one operand map to global memory (index values).

    ``row(r)``: the data row of local row r; ``valid(r)``: whether it holds data (else it
    reads as zeros); ``scale_offset(r)``: byte offset of the row's K-block-0 scale in the
    5-D scale buffer (in bounds for every local row, see the callers).
    """

    data: Value
    scales: Value
    row: Callable[[Value], Value]
    valid: Callable[[Value], Value]
    scale_offset: Callable[[Value], Value]


# ---- dequantization (registers) ---------------------------------------------------------


def _i32c(v: int) -> Value:
    return bir.const(v - (1 << 32) if v >= 1 << 31 else v, bir.i32())


def fp4x4_to_bf16x2x2(x: Value) -> tuple[Value, Value]:
    """Four E2M1 codes (the low 16 bits of an i32; code i in nibble i) -> two i32 registers of
    bf16 pairs, (code 0, code 1) and (code 2, code 3), exact.

    Magnitudes by table lookup (``prmt.b32`` with the bf16 byte tables; 2 lookups + 2
    interleaves), signs moved from nibble bit 3 to bf16 bit 15 (shifts and ``lop3``).
    """
    sel = bir.bit_and(x, 0x7777)
    lo8 = byte_perm(_i32c(_LUT_LO[0]), _i32c(_LUT_LO[1]), sel)
    hi8 = byte_perm(_i32c(_LUT_HI[0]), _i32c(_LUT_HI[1]), sel)
    r0 = byte_perm(lo8, hi8, 0x5140)
    r1 = byte_perm(lo8, hi8, 0x7362)
    s0 = bir.bit_or(bir.bit_and(bir.shl(x, 12), 0x8000), bir.bit_and(bir.shl(x, 24),
                                                                      _i32c(0x80000000)))
    s1 = bir.bit_or(bir.bit_and(bir.shl(x, 4), 0x8000), bir.bit_and(bir.shl(x, 16),
                                                                     _i32c(0x80000000)))
    return bir.bit_or(r0, s0), bir.bit_or(r1, s1)


def e4m3x4_to_f16x2x2(x: Value) -> tuple[Value, Value]:
    """Four E4M3 bytes (an i32, byte i = element i) -> two ``vector<2xf16>``, (0, 1) and
    (2, 3): two ``cvt.rn.f16x2.e4m3x2`` (exact; NaN codes give NaN)."""
    lo = arith.trunci(bir.i16(), x)
    hi = arith.trunci(bir.i16(), bir.shru(x, 16))
    return mma.cvt_e4m3x2_to_f16x2(lo), mma.cvt_e4m3x2_to_f16x2(hi)


def _scale_bf16x2(reg: Value, s: Value) -> Value:
    """A bf16 pair (i32) times the bf16 splat ``s`` (``vector<2xbf16>``), as i32:
    ``mul.rn.bf16x2`` (exact for the E2M1 x E4M3 products used here)."""
    v = vector.bitcast(bir.vec(2, bir.bf16()), vector.from_elements(bir.vec(1, bir.i32()),
                                                                    [reg]))
    return mma.pack_i32(arith.mulf(v, s))


def _smem_word(buf: Value, idx: Value, nbytes: int) -> Value:
    """``nbytes`` (2 or 4) aligned bytes of an i8 shared buffer as a zero-extended i32
    (``ld.shared.u16`` / ``ld.shared.u32``)."""
    v = bir.vector_load(bir.vec(nbytes, bir.i8()), buf, idx, alignment=nbytes)
    wide = bir.i16() if nbytes == 2 else bir.i32()
    w = vector.extract(vector.bitcast(bir.vec(1, wide), v), [], [0])
    return arith.extui(bir.i32(), w) if nbytes == 2 else w


# ---- staging ------------------------------------------------------------------------------


def _stage_rows(op: Operand, smem: Value, rows: int, plan: Plan, tiles: Tiles, tid: Value,
                row_bytes: Value, kb0: Value) -> None:
    """Copy ``rows`` rows x one K-step of ``op`` to ``smem`` with 16-byte loads (zeros for
    invalid rows and bytes past the row end)."""
    per_row = plan.step_bytes // 16
    total = rows * per_row
    v16 = bir.vec(16, bir.i8())
    for it in range(-(-total // tiles.threads)):
        cid = bir.add(tid, it * tiles.threads)

        def body(cid: Value = cid) -> None:
            r = bir.udiv(cid, per_row)
            q16 = bir.mul(bir.urem(cid, per_row), 16)
            col = bir.add(kb0, q16)
            ok = bir.logical_and(op.valid(r), bir.ult(col, row_bytes))
            br = bir.if_(ok, [v16])
            with br.then():
                src = bir.add(bir.mul(op.row(r), row_bytes), col)
                br.yield_(bir.vector_load(v16, op.data, src, alignment=16))
            with br.else_():
                br.yield_(bir.const(0, v16))
            bir.vector_store(br.results[0], smem, bir.add(bir.mul(r, plan.row_stride), q16),
                             alignment=16)

        if (it + 1) * tiles.threads > total:
            with bir.when(bir.ult(cid, total)):
                body()
        else:
            body()


def _decode_scales4(fmt: Format, word: Value) -> Value:
    """vector<4xi8> of scale bytes -> vector<4xf32> of |scales| (E4M3 sign ignored, D3)."""
    v = arith.extui(bir.vec(4, bir.i32()), word)
    if fmt.is_mx:
        return convert.e8m0_to_f32(v)
    return convert.e4m3_to_f32(bir.bit_and(v, bir.const(0x7F, bir.vec(4, bir.i32()))))


def _stage_scales(op: Operand, smem: Value, rows: int, plan: Plan, tiles: Tiles, tid: Value,
                  step: Value, kblocks: Value) -> None:
    """Decode one 32-bit word of 5-D scales per row (K-blocks 4*step .. 4*step+3) to f32 in
    ``smem[r*4 + j]``; K-blocks >= ``kblocks`` are stored as 0."""
    i32v = bir.vec(4, bir.i32())
    for it in range(-(-rows // tiles.threads)):
        r = bir.add(tid, it * tiles.threads)
        with bir.when(bir.ult(r, rows)):
            off = bir.add(op.scale_offset(r), bir.mul(step, SF_ATOM_BYTES))
            word = bir.vector_load(bir.vec(4, bir.i8()), op.scales, off, alignment=4)
            val = _decode_scales4(plan.fmt, word)
            j = arith.addi(vector.broadcast(i32v, bir.as_i32(bir.mul(step, 4))),
                           arith.constant(i32v, ir.DenseElementsAttr.get(
                               np.arange(4, dtype=np.int32), type=i32v)))
            live = arith.cmpi(arith.CmpIPredicate.ult, j,
                              vector.broadcast(i32v, bir.as_i32(kblocks)))
            val = arith.select(live, val, bir.const(0.0, bir.vec(4, bir.f32())))
            bir.vector_store(val, smem, bir.mul(r, 4), alignment=16)


# ---- the mainloop ---------------------------------------------------------------------------


@dataclasses.dataclass
class WarpCoords:
    """Per-thread coordinates inside the CTA tile (index values)."""

    tid: Value
    g: Value  # lane >> 2
    t: Value  # lane & 3
    row0: Value  # first local row of the warp's tile
    col0: Value  # first local column of the warp's tile

    @staticmethod
    def of(tiles: Tiles) -> WarpCoords:
        tid = bir.thread_idx("x")
        warp, lane = bir.udiv(tid, 32), bir.urem(tid, 32)
        wm, wn = bir.udiv(warp, tiles.warps_n), bir.urem(warp, tiles.warps_n)
        return WarpCoords(tid, bir.udiv(lane, 4), bir.urem(lane, 4),
                          bir.mul(wm, tiles.wm), bir.mul(wn, tiles.wn))

    def c_row(self, mt: int, i: int) -> Value:
        """Local output row of accumulator element i of m-tile mt."""
        return bir.add(self.row0, bir.add(self.g, mt * 16 + 8 * (i >> 1)))

    def c_col(self, nt: int, i: int) -> Value:
        """Local output column of accumulator element i of n-tile nt."""
        return bir.add(self.col0, bir.add(bir.mul(self.t, 2), nt * 8 + (i & 1)))


def _fragments(plan: Plan, buf: Value, rows: Sequence[Value], j: int, h: int, t: Value
               ) -> list[tuple[Value, Value]]:
    """(k-low, k-high) registers of each local row for MMA h of block j."""
    out = []
    for r in rows:
        base = bir.mul(r, plan.row_stride)
        if plan.fmt.is_fp4 and not plan.fmt.is_mx:  # NVFP4: 2 bytes of the 8-byte block
            x = _smem_word(buf, bir.add(base, bir.add(bir.mul(t, 2), 8 * j)), 2)
            out.append(fp4x4_to_bf16x2x2(x))
        elif plan.fmt.is_fp4:  # MXFP4: 4 bytes of the 16-byte block, 2 per MMA
            x = _smem_word(buf, bir.add(base, bir.add(bir.mul(t, 4), 16 * j)), 4)
            out.append(fp4x4_to_bf16x2x2(bir.shru(x, 16 * h) if h else x))
        else:  # MXFP8: 4 bytes of each 16-byte half of the 32-byte block
            x = _smem_word(buf, bir.add(base, bir.add(bir.mul(t, 4), 32 * j + 16 * h)), 4)
            out.append(e4m3x4_to_f16x2x2(x))
    return out


def emit_mainloop(plan: Plan, tiles: Tiles, smem: Smem, wc: WarpCoords, a: Operand,
                  b: Operand, k: Value) -> list[list[list[Value]]]:
    """The K loop of one CTA tile; returns ``acc[mt][nt][i]`` (f32, layout of
    :meth:`WarpCoords.c_row` / :meth:`WarpCoords.c_col`). Every thread of the CTA must
    execute it (barriers, warp-wide MMAs)."""
    f32 = bir.f32()
    row_bytes = bir.udiv(k, 2) if plan.fmt.is_fp4 else k
    kblocks = bir.ceil_div(k, plan.block)
    steps = bir.ceil_div(k, plan.step_elems)
    mt_n, nt_n = tiles.m_tiles, tiles.n_tiles
    zero = bir.const(0.0, f32)
    init = [zero] * (mt_n * nt_n * 4)
    a_rows = [bir.add(wc.row0, bir.add(wc.g, mt * 16 + 8 * hh))
              for mt in range(mt_n) for hh in range(2)]
    b_rows = [bir.add(wc.col0, bir.add(wc.g, nt * 8)) for nt in range(nt_n)]
    with bir.for_range(0, steps, carry=init) as loop:
        step = loop.iv
        kb0 = bir.mul(step, plan.step_bytes)
        _stage_rows(a, smem.a, tiles.bm, plan, tiles, wc.tid, row_bytes, kb0)
        _stage_rows(b, smem.b, tiles.bn, plan, tiles, wc.tid, row_bytes, kb0)
        _stage_scales(a, smem.sa, tiles.bm, plan, tiles, wc.tid, step, kblocks)
        _stage_scales(b, smem.sb, tiles.bn, plan, tiles, wc.tid, step, kblocks)
        bir.barrier()
        acc = list(loop.carried)
        for j in range(4):
            sa = [bir.load(smem.sa, bir.add(bir.mul(r, 4), j)) for r in a_rows]
            if plan.fold_b_scale:
                sb = [vector.broadcast(bir.vec(2, bir.bf16()), arith.truncf(
                    bir.bf16(), bir.load(smem.sb, bir.add(bir.mul(r, 4), j)))) for r in b_rows]
            else:
                sb = [[bir.load(smem.sb, bir.add(bir.mul(wc.c_col(nt, e), 4), j))
                       for e in range(2)] for nt in range(nt_n)]
            blk: list[list[tuple[Value, ...]]] = [[(zero,) * 4] * nt_n for _ in range(mt_n)]
            for h in range(plan.mmas_per_block):
                af = _fragments(plan, smem.a, a_rows, j, h, wc.t)
                bf = _fragments(plan, smem.b, b_rows, j, h, wc.t)
                if plan.fold_b_scale:
                    bf = [(_scale_bf16x2(lo, s), _scale_bf16x2(hi, s))
                          for (lo, hi), s in zip(bf, sb)]
                for mt in range(mt_n):
                    (a0, a2), (a1, a3) = af[2 * mt], af[2 * mt + 1]
                    for nt in range(nt_n):
                        blk[mt][nt] = mma.mma_m16n8k16([a0, a1, a2, a3], list(bf[nt]),
                                                       list(blk[mt][nt]),
                                                       input_type=plan.mma_type)
            for mt in range(mt_n):
                for nt in range(nt_n):
                    for i in range(4):
                        s_row = sa[2 * mt + (i >> 1)]
                        s = s_row if plan.fold_b_scale else arith.mulf(s_row, sb[nt][i & 1])
                        idx = (mt * nt_n + nt) * 4 + i
                        # exact product: fma == add(acc, mul) bit for bit (one FFMA)
                        acc[idx] = math.fma(blk[mt][nt][i], s, acc[idx])
        bir.barrier()
        loop.yield_(*acc)
    res = loop.results
    return [[[res[(mt * nt_n + nt) * 4 + i] for i in range(4)] for nt in range(nt_n)]
            for mt in range(mt_n)]

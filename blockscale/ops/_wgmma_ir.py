"""IR building blocks of the sm_90a wgmma block-scaled matmul (NVFP4, MXFP4, MXFP8).

Imports MLIR: only :func:`blockscale.ops.matmul_wgmma.build` imports it.

Data path (per K-step of ``kstep`` elements)
--------------------------------------------
The CTA is ``bm / 64`` warpgroups (:attr:`Tiles.threads`). A step of a row is
``kstep / 2`` FP4 bytes (``kstep`` E4M3 bytes) in 16-byte *pieces*; the ``(bm + bn) * pieces``
pieces of A's rows then B's are dealt to the threads piece-major (item ``i * threads + tid``
is piece ``item // (bm + bn)`` of row ``item % (bm + bn)``; a partial last round guarded):
one for 64 x 64 / 128 x 128 at kstep 32, three for 128 x 256 at kstep 64. A thread reads its
piece (one ``ld.global.v4``, zeros for rows past M / N and for pieces past the row end) and
its scale bytes, dequantizes it to bf16 with the block scale folded in (``prmt`` table lookup,
then ``mul.rn.bf16x2`` by the scale: E2M1 x E4M3 has at most 6 significant bits in
[2^-10, 2688], exact in bf16) and stores it to shared memory in the canonical no-swizzle
K-major wgmma layout: the core matrix (8 rows x 16 bytes = 8 K-elements) of row group ``g``
and K chunk ``c`` at ``g * SBO + c * LBO`` with LBO = 128, SBO = 128 * kstep / 8 (a step's
chunks of a row group are one contiguous block). Each 16-byte store is one core-matrix row;
the 8 threads of a store phase write 8 consecutive rows (no bank conflicts).

Variants (spec fields): ``kstep=64`` stages 64 elements per step (two pieces per row,
four wgmmas per step; 96 KiB of dynamic shared memory at 128 x 128), tiles 128 x 256 (two
warpgroups of m64n256, 144 KiB at kstep 64: 0.75x the dequantization per flop), and
``dequant="shift"`` replaces the ``prmt`` table lookups by bf16 bit placement (operands
scaled by 2^-8 each, undone exactly in the epilogue; see :func:`_fp4x8_shift`). The global
loads of the next step are issued before the current step is dequantized (:data:`PREFETCH`).

MX formats (:data:`VARIANTS`): a row's step is ``kstep / 2`` (MXFP4) or ``kstep`` (MXFP8)
bytes in 16-byte pieces and ``kstep / 32`` E8M0 bytes. "fold" (MXFP4) multiplies the bf16 codes
by ``2^(e - 127 + MX_FOLD_EXP)`` (exact for every byte: 2^-130 .. 6 * 2^125) and the epilogue
by ``2^(-2 MX_FOLD_EXP)``; its 32-block is two k16 wgmmas, i.e. up to two accumulator
roundings per block. "promote" (kstep = 32, one block per step) stores plain bf16 (E2M1) or
f16 (E4M3, ``cvt.rn.f16x2.e4m3x2``) and the row's decoded f32 scale in the stage; the two
k16 wgmmas write a zero-started block fragment, which the next step (after its
``wait_group 0``) adds as ``acc = fma(blk, sA * sB, acc)`` (:func:`_promote`): the mma.sync
kernel's order, so MXFP4 equals the portable kernel and MXFP8 the mma.sync kernel bit for bit
in the interpreter.

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
interpreter's model, as for ``mma.sync``). The H200 does not (f32 outputs differ from the
portable kernel's for M >= 128) but stays within the stated bound, which the GPU tests check.

Performance model (SASS of the K loop, tools/sass_loop_counts.py): a step costs the loop's
instructions x warps / 4 schedulers issue cycles against bm bn kstep 2 / 4096 bf16 tensor
cycles per SM; at 8192 x 5760 x 2944 that ratio is 2.45 (lut, k32), 1.65 (shift, k64; the
H200 took ~1.85x the issue-bound time for both) and 1.08 at 128 x 256 (shift, k64). The MX
"promote" variants pay an FMUL + FFMA per accumulator element per 32-block (2 FP32 ops per
output and block: at most half of the E4M3 tensor rate even with no dequantization).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import convert, mma
from blockscale.compiler.arch import wgmma as W
from blockscale.layouts import SF_ATOM_BYTES
from blockscale.ops._mma_ir import (
    Operand,
    _scale_bf16x2,
    e4m3x4_to_f16x2x2,
    fp4x4_to_bf16x2x2,
    workgroup_buffer,
)

Value = ir.Value

#: K elements per step by default (two NVFP4 blocks; 16 FP4 bytes per row)
STEP_ELEMS = 32
#: the K-steps built: 32 (3 stages in 48 KiB of static shared memory at 128 x 128) and 64
#: (two 16-byte loads per row, half the per-step overhead; 96 KiB of dynamic shared memory)
KSTEPS = (32, 64)
#: shared-memory stages (a stage is read by the wgmma group of its step)
STAGES = 3
#: CTA tiles (bm, bn); 128 x 256: two warpgroups of m64n256 (128 accumulator registers)
TILES = ((64, 64), (128, 128), (128, 256), (64, 256))  # 64 x 256: the grouped kernel's
#: core-matrix offsets of the operand layout (bytes; SBO for the default step, else
#: :attr:`Tiles.sbo`)
LBO, SBO = 128, 512
#: steps whose global loads are in flight (loop-carried registers) ahead of the dequantization
PREFETCH = 1


#: per-format (dequant, scaling) variants and the K-steps each is built for. "fold": block
#: scales folded into the 16-bit operands (exact), the wgmmas accumulate in place; "promote":
#: plain operands, each scale block's wgmmas start from zero into a second fragment that is
#: then added as ``acc = fma(blk, sA * sB, acc)`` (the portable kernel's order)
VARIANTS = {
    "nvfp4": {("lut", "fold"): (32, 64), ("shift", "fold"): (32, 64)},
    "mxfp4": {("lut", "fold"): (32, 64), ("lut", "promote"): (32,), ("fp8", "promote"): (32,)},
    # ("copy", "promote"), MXFP8 bytes straight into QGMMA, was removed: on the H200 (run D,
    # 2026-11-30) ~8100 of 8192 sampled bf16 outputs fell outside the fp32 bound (QGMMA's
    # accumulation of E4M3 products is narrower than fp32)
    "mxfp8": {("cvt", "promote"): (32,)},
}
#: dequantizations to E4M3 shared operands (``wgmma ... m64nNk32.f32.e4m3.e4m3``, one per
#: 32-block): "fp8" places E2M1 bits into E4M3 times 2^FP8_SHIFT_EXP (:func:`_fp4x8_e4m3`),
#: "copy" stores MXFP8 bytes as they are
FP8_DEQUANT = ("fp8", "copy")
#: "fp8" operands are the E2M1 values times 2^FP8_SHIFT_EXP (block sums: 2^(2 FP8_SHIFT_EXP))
FP8_SHIFT_EXP = -6
#: MX "fold" operands are the true values times 2^MX_FOLD_EXP (6 * 2^127 * 2^-2 < bf16 max;
#: the smallest, 0.5 * 2^-127 * 2^-2 = 2^-130, is still an exact bf16 subnormal)
MX_FOLD_EXP = -2


@dataclasses.dataclass(frozen=True)
class Tiles:
    """CTA tile: ``bm = 64 * warpgroups`` rows of A, ``bn`` of B; one thread per row (so
    bm == bn: the bm + bn threads are exactly the 2 bm / 128 warpgroups that run the wgmma
    of their 64 rows of A); the format and the scaling variant (:data:`VARIANTS`)."""

    bm: int = 128
    bn: int = 128
    #: K elements per step (:data:`KSTEPS`)
    kstep: int = STEP_ELEMS
    fmt: str = "nvfp4"
    scaling: str = "fold"
    #: E4M3 shared operands and k32 wgmmas (:data:`FP8_DEQUANT`)
    fp8_mma: bool = False

    def __post_init__(self) -> None:
        if (self.bm, self.bn) not in TILES:
            raise ValueError(f"tiles: (bm, bn) must be one of {TILES}, got "
                             f"{(self.bm, self.bn)}")
        if self.promote and self.bn > 128:
            raise ValueError(f"tiles: scaling='promote' holds two fragments: bn <= 128, got "
                             f"{self.bn}")
        if self.kstep not in KSTEPS:
            raise ValueError(f"tiles: kstep must be one of {KSTEPS}, got {self.kstep}")
        if self.fmt not in VARIANTS:
            raise ValueError(f"tiles: fmt must be one of {list(VARIANTS)}, got {self.fmt!r}")
        if self.scaling not in ("fold", "promote"):
            raise ValueError(f"tiles: scaling must be 'fold' or 'promote', got "
                             f"{self.scaling!r}")
        if self.promote and self.kstep != self.block:
            raise ValueError(f"tiles: scaling='promote' takes one scale block per step "
                             f"(kstep={self.block}), got kstep={self.kstep}")

    @property
    def block(self) -> int:
        """Elements per scale block."""
        return 16 if self.fmt == "nvfp4" else 32

    @property
    def fp8(self) -> bool:
        return self.fmt == "mxfp8"

    @property
    def promote(self) -> bool:
        return self.scaling == "promote"

    @property
    def row_step_bytes(self) -> int:
        """Global bytes of one row per step (FP4: two codes a byte)."""
        return self.kstep if self.fp8 else self.kstep // 2

    @property
    def scales_per_step(self) -> int:
        return self.kstep // self.block

    @property
    def mma_type(self) -> str:
        """The wgmma operand type: e4m3 (:attr:`fp8_mma`), f16 for MXFP8 (exact,
        ``cvt.rn.f16x2.e4m3x2``), else bf16."""
        return "e4m3" if self.fp8_mma else "f16" if self.fp8 else "bf16"

    @property
    def elem_bytes(self) -> int:
        """Shared bytes per operand element (E4M3 1, bf16 / f16 2)."""
        return 1 if self.fp8_mma else 2

    @property
    def mma_k(self) -> int:
        """K of one wgmma (32 bytes of a row)."""
        return 32 // self.elem_bytes

    @property
    def chunks(self) -> int:
        """16-byte core-matrix rows per row and step."""
        return self.kstep * self.elem_bytes // 16

    @property
    def sbo(self) -> int:
        """Stride-dimension byte offset: a row group's step is ``chunks`` core matrices."""
        return self.chunks * LBO

    @property
    def shared_bytes(self) -> int:
        return STAGES * self.stage_bytes + self.table_bytes

    @property
    def table_bytes(self) -> int:
        """The bf16 scale table of "fold" (256 entries, one per scale byte), after the
        stages."""
        return 0 if self.promote else 512

    @property
    def dynamic(self) -> bool:
        """Whether the stages need dynamic shared memory (over the 48 KiB static limit)."""
        return self.shared_bytes > 48 * 1024

    @property
    def threads(self) -> int:
        """The warpgroups that run the wgmmas (``bm / 64``); all of them dequantize."""
        return 2 * self.bm

    @property
    def pieces(self) -> int:
        """16-byte global pieces per row and step."""
        return self.row_step_bytes // 16

    @property
    def items(self) -> int:
        """Pieces per step (A's rows, then B's, piece-major: item ``p * (bm + bn) + row``)."""
        return (self.bm + self.bn) * self.pieces

    @property
    def rounds(self) -> int:
        """Items per thread and step (the last round guarded when it is partial)."""
        return -(-self.items // self.threads)

    @property
    def piece_chunks(self) -> int:
        """Core-matrix rows per 16-byte global piece: 32 or 16 elements of
        :attr:`elem_bytes` each."""
        return (16 if self.fp8 else 32) * self.elem_bytes // 16

    @property
    def piece_scales(self) -> int:
        """Scale bytes a piece needs: 2 (NVFP4: 32 codes), 1 (MX)."""
        return 2 if self.fmt == "nvfp4" else 1

    def piece_block(self, piece: Value) -> Value:
        """The step-local index of a piece's first scale block."""
        if self.fmt == "nvfp4":
            return bir.mul(piece, 2)
        return bir.udiv(piece, 2) if self.fp8 else piece

    @property
    def warpgroups(self) -> int:
        return self.bm // 64

    @property
    def operand_bytes(self) -> tuple[int, int]:
        """Shared bytes of A and B per stage."""
        e = self.elem_bytes
        return self.bm * e * self.kstep, self.bn * e * self.kstep

    @property
    def scale_bytes(self) -> int:
        """Shared bytes of the decoded f32 scales per stage ("promote": A's bm, then B's bn)."""
        return 4 * (self.bm + self.bn) if self.promote else 0

    @property
    def stage_bytes(self) -> int:
        return sum(self.operand_bytes) + self.scale_bytes


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


_i32 = bir.i32_bits  # an i32 constant from a 32-bit pattern


def _fp8x8_cvt(w0: Value, w1: Value) -> list[Value]:
    """Eight E4M3 bytes (two i32, element i in byte i) -> 4 f16 pairs (i32), exact
    (``cvt.rn.f16x2.e4m3x2``; NaN codes give NaN)."""
    return [mma.pack_i32(h) for w in (w0, w1) for h in e4m3x4_to_f16x2x2(w)]


def _fp4x8_e4m3(w: Value) -> list[Value]:
    """Eight E2M1 codes (an i32, code i in nibble i) -> two i32 of E4M3 bytes *times
    2^FP8_SHIFT_EXP*, codes (0, 2, 4, 6) and (1, 3, 5, 7) (a K permutation inside the
    codes; A and B use the same one). E2M1 ``s e1 e0 m`` -> E4M3 ``s 00 e1 e0 m 00``: as
    E4M3 that is ``2^(E-7) (1 + m/2)`` for E > 0 and the subnormal ``(m/2) 2^-6`` for E = 0,
    the E2M1 value times 2^-6 exactly. Low nibbles: ``((w << 4) & 0x80808080) | ((w << 2) &
    0x1C1C1C1C)``; high nibbles: ``(w & 0x80808080) | ((w >> 2) & 0x1C1C1C1C)`` (7 integer
    instructions per 8 codes)."""
    lo = bir.bit_or(bir.bit_and(bir.shl(w, 4), _i32(0x80808080)),
                    bir.bit_and(bir.shl(w, 2), _i32(0x1C1C1C1C)))
    hi = bir.bit_or(bir.bit_and(w, _i32(0x80808080)),
                    bir.bit_and(bir.shru(w, 2), _i32(0x1C1C1C1C)))
    return [lo, hi]


def _dequant_row(codes: Value, scales: tuple[Value, ...] | None, dequant: str, block: int
                 ) -> list[Value]:
    """One row's step of codes (vector<n x i8>: FP4 pairs, or E4M3 for ``dequant="cvt"``)
    -> vector<4xi32> core-matrix rows (8 K-elements each) of bf16 / f16; with ``scales``
    (``vector<2xbf16>`` splats from :func:`_scale_splats`, one per scale block of ``block``
    elements) folded in by ``mul.rn.bf16x2``."""
    nw = ir.VectorType(codes.type).shape[0] // 4
    words = vector.bitcast(bir.vec(nw, bir.i32()), codes)
    word = [vector.extract(words, [], [i]) for i in range(nw)]
    if dequant in FP8_DEQUANT:  # E4M3 bytes: 4 words per 16-byte core-matrix row
        out = [x for w in word for x in _fp4x8_e4m3(w)] if dequant == "fp8" else word
        return [vector.from_elements(bir.vec(4, bir.i32()), out[4 * c:4 * c + 4])
                for c in range(len(out) // 4)]
    rows = []
    for c in range(nw // 2 if dequant == "cvt" else nw):
        if dequant == "cvt":
            regs = _fp8x8_cvt(word[2 * c], word[2 * c + 1])
        else:
            regs = _fp4x8_lut(word[c]) if dequant == "lut" else _fp4x8_shift(word[c])
        if scales is not None:
            regs = [_scale_bf16x2(x, scales[c * 8 // block]) for x in regs]
        rows.append(vector.from_elements(bir.vec(4, bir.i32()), regs))
    return rows


def _scale_values(v: Value, dequant: str, fmt: str = "nvfp4") -> Value:
    """Scale bytes (vector<n x i32>, 0..255) -> the bf16 factors folded into the operands.
    NVFP4: |scale| ("lut") or |scale| * 2^(126 + SHIFT_EXP) ("shift": <= 448 * 2^118 <
    2^127, >= 2^109), exact. MX (E8M0): scale * 2^MX_FOLD_EXP (exact: 2^-129 .. 2^125;
    0xFF -> NaN)."""
    n = ir.VectorType(v.type).shape[0]
    if fmt == "nvfp4":
        f = convert.e4m3_to_f32(arith.andi(v, bir.const(0x7F, bir.vec(n, bir.i32()))))
        if dequant == "shift":
            f = arith.mulf(f, bir.const(2.0 ** (126 + SHIFT_EXP), bir.vec(n, bir.f32())))
    else:
        f = arith.mulf(convert.e8m0_to_f32(v), bir.const(2.0 ** MX_FOLD_EXP,
                                                          bir.vec(n, bir.f32())))
    return arith.truncf(bir.vec(n, bir.bf16()), f)


def _fill_scale_table(smem: Value, table0: int, tiles: Tiles, dequant: str) -> None:
    """Entry e (bf16 at byte ``table0 + 2 e``) = :func:`_scale_values` of scale byte e, for
    e in 0..255 (``256 / threads`` entries per thread); the caller's barrier publishes it."""
    tid = bir.thread_idx("x")
    for i in range(256 // tiles.threads):
        e = bir.add(tid, i * tiles.threads)
        v = vector.broadcast(bir.vec(1, bir.i32()), bir.as_i32(e))
        s = vector.bitcast(bir.vec(2, bir.i8()), _scale_values(v, dequant, tiles.fmt))
        bir.vector_store(s, smem, bir.add(bir.mul(e, 2), table0), alignment=2)


def _scale_splats(smem: Value, table0: int, pair: Value) -> tuple[Value, ...]:
    """Scale bytes (vector<n x i8>) -> bf16 splats of their factors, one ``ld.shared.u16``
    each from the table of :func:`_fill_scale_table` (instead of a software decode per
    step and piece)."""
    n = ir.VectorType(pair.type).shape[0]
    out = []
    for i in range(n):
        e = bir.as_index(arith.extui(bir.i32(), vector.extract(pair, [], [i])))
        h = bir.vector_load(bir.vec(2, bir.i8()), smem, bir.add(bir.mul(e, 2), table0),
                            alignment=2)
        bf = vector.extract(vector.bitcast(bir.vec(1, bir.bf16()), h), [], [0])
        out.append(vector.broadcast(bir.vec(2, bir.bf16()), bf))
    return tuple(out)


def accumulator_scale(dequant: str, fmt: str = "nvfp4", scaling: str = "fold") -> float:
    """What the accumulators must be multiplied by (exactly: a power of two, and no partial
    sum is subnormal) to give the true sums."""
    if dequant == "fp8":
        return 2.0 ** (-2 * FP8_SHIFT_EXP)
    if scaling == "promote":
        return 1.0
    if fmt != "nvfp4":
        return 2.0 ** (-2 * MX_FOLD_EXP)
    return 1.0 if dequant == "lut" else 2.0 ** (-2 * SHIFT_EXP)


def _item_types(tiles: Tiles) -> list[ir.Type]:
    return [bir.vec(16, bir.i8()), bir.vec(tiles.piece_scales, bir.i8())]


@dataclasses.dataclass
class _Item:
    """One thread's piece of a round: operand row ``r`` of A (``is_a``) or B, its 16-byte
    ``piece`` of the step, ``row`` in 0 .. bm + bn - 1, ``live`` (None: always)."""

    is_a: Value
    r: Value
    row: Value
    piece: Value
    live: Value | None


def _items(tiles: Tiles, tid: Value) -> list[_Item]:
    """The thread's items of every round (item ``i * threads + tid``; piece-major, so the 8
    threads of a 16-byte store phase write 8 consecutive rows: no bank conflicts)."""
    out = []
    total = tiles.bm + tiles.bn
    for i in range(tiles.rounds):
        item = bir.add(tid, i * tiles.threads)
        row, piece = bir.urem(item, total), bir.udiv(item, total)
        is_a = bir.ult(row, tiles.bm)
        r = arith.select(is_a, row, bir.sub(row, tiles.bm))
        live = bir.ult(item, tiles.items) if (i + 1) * tiles.threads > tiles.items else None
        out.append(_Item(is_a, r, row, piece, live))
    return out


def _load_piece(op: Operand, it: _Item, step: Value, row_bytes: Value, tiles: Tiles
                ) -> tuple[Value, Value]:
    """(16 bytes, the piece's scale bytes) of ``it`` for ``step``; zeros for rows past the
    operand, pieces past the row end (so also for the prefetches past the last step) and
    dead items, whose scale bytes may be padding or out of bounds."""
    vd, vs = _item_types(tiles)
    col = bir.add(bir.mul(step, tiles.row_step_bytes), bir.mul(it.piece, 16))
    ok = bir.logical_and(op.valid(it.r), bir.ult(col, row_bytes))
    if it.live is not None:
        ok = bir.logical_and(ok, it.live)
    br = bir.if_(ok, [vd, vs])
    with br.then():
        data = bir.vector_load(vd, op.data, bir.add(bir.mul(op.row(it.r), row_bytes), col),
                               alignment=16)
        j = bir.add(bir.mul(step, tiles.scales_per_step), tiles.piece_block(it.piece))
        off = bir.add(op.scale_offset(it.r), bir.add(bir.mul(bir.udiv(j, 4), SF_ATOM_BYTES),
                                                     bir.urem(j, 4)))
        br.yield_(data, bir.vector_load(vs, op.scales, off, alignment=tiles.piece_scales))
    with br.else_():
        br.yield_(bir.const(0, vd), bir.const(0, vs))
    return br.results[0], br.results[1]


def _load_item(a: Operand, b: Operand, it: _Item, step: Value, row_bytes: Value,
               tiles: Tiles) -> list[Value]:
    """:func:`_load_piece` from A when ``it.is_a``, else from B."""
    br = bir.if_(it.is_a, _item_types(tiles))
    with br.then():
        br.yield_(*_load_piece(a, it, step, row_bytes, tiles))
    with br.else_():
        br.yield_(*_load_piece(b, it, step, row_bytes, tiles))
    return list(br.results)


def _store_piece(smem: Value, stage0: Value, it: _Item, data: Value, scales: Value,
                 dequant: str, tiles: Tiles) -> None:
    """Dequantize one piece (:func:`_dequant_row`, scales folded unless "promote") into its
    core-matrix rows of the stage at byte ``stage0``."""
    base = bir.add(stage0, arith.select(it.is_a, bir.const(0),
                                        bir.const(tiles.operand_bytes[0])))
    splats = None if tiles.promote else _scale_splats(smem, STAGES * tiles.stage_bytes, scales)
    c0 = bir.mul(it.piece, tiles.piece_chunks)
    for c, v in enumerate(_dequant_row(data, splats, dequant, tiles.block)):
        off = bir.add(layout_offset(it.r, 0, tiles.sbo), bir.mul(bir.add(c0, c), LBO))
        bir.vector_store(vector.bitcast(bir.vec(16, bir.i8()), v), smem, bir.add(base, off),
                         alignment=16)


def _store_scale(smem: Value, at: Value, scales: Value) -> None:
    """The row's (one) E8M0 scale byte decoded to f32 at shared byte ``at`` ("promote")."""
    v = arith.extui(bir.vec(1, bir.i32()), scales)
    f = arith.bitcast(bir.vec(1, bir.f32()), arith.bitcast(bir.vec(1, bir.i32()),
                                                           convert.e8m0_to_f32(v)))
    bir.vector_store(vector.bitcast(bir.vec(4, bir.i8()), f), smem, at, alignment=4)


def _load_f32(smem: Value, at: Value, n: int) -> list[Value]:
    """``n`` f32 at shared byte ``at`` (one ``ld.shared``)."""
    v = vector.bitcast(bir.vec(n, bir.f32()),
                       bir.vector_load(bir.vec(4 * n, bir.i8()), smem, at, alignment=4 * n))
    return [vector.extract(v, [], [i]) for i in range(n)]


def _promote(acc: Value, blk: Value, smem: Value, scales_at: Value, wg: Value,
             tiles: Tiles) -> Value:
    """``acc + blk * (sA * sB)`` per fragment element (one FMUL + one FFMA; the product of
    two E8M0 scales is the portable kernel's f32 product, the block sum times it is exact
    for FP4), with the f32 scales of the stage at shared byte ``scales_at``."""
    from mlir.dialects import llvm, math

    tid = bir.thread_idx("x")
    lane = bir.urem(tid, 32)
    row0 = bir.add(bir.add(bir.mul(wg, 64), bir.mul(bir.urem(bir.udiv(tid, 32), 4), 16)),
                   bir.udiv(lane, 4))
    sa = [_load_f32(smem, bir.add(scales_at, bir.mul(bir.add(row0, 8 * h), 4)), 1)[0]
          for h in range(2)]
    col0 = bir.add(tiles.bm, bir.mul(bir.urem(lane, 4), 2))
    n = tiles.bn
    sb = [_load_f32(smem, bir.add(scales_at, bir.mul(bir.add(col0, 8 * nt), 4)), 2)
          for nt in range(n // 8)]
    a_vals, b_vals = W.accumulator_values(acc, n), W.accumulator_values(blk, n)
    out = W.zero_accumulator(n)
    for i in range(n // 2):
        s = arith.mulf(sa[(i % 4) // 2], sb[i // 4][i % 2])
        out = llvm.insertvalue(out, math.fma(b_vals[i], s, a_vals[i]), [i])
    return out


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


#: where a step issues the next step's global loads: "early" (before its dequantization, so
#: they are in flight across the fence.proxy.async, whose SASS is MEMBAR.ALL.CTA +
#: FENCE.VIEW.ASYNC.S: if the MEMBAR waits for them, the load latency is exposed every step)
#: or "late" (after the wgmmas are issued: in flight during the tensor cores' step instead)
PIPELINES = ("early", "late")


def emit_mainloop(kb: bir.KernelBuilder, tiles: Tiles, a: Operand, b: Operand, k: Value,
                  dequant: str = "lut", pipeline: str = "early") -> tuple[Value, Value]:
    """The K loop; returns (the warpgroup's accumulator struct, warpgroup index). Every
    thread of the CTA must execute it (barriers, warpgroup-wide wgmma).

    The global loads of step s + :data:`PREFETCH` are issued (into loop-carried registers)
    before step s is dequantized, so their latency overlaps a step. "promote": the block
    fragment of step s is added to the accumulators in step s + 1 (after its
    ``wait_group 0``), so the wgmmas of step s overlap the dequantization of step s + 1."""
    smem = dynamic_shared_buffer() if tiles.dynamic else \
        aligned_workgroup_buffer(kb, tiles.shared_bytes)
    kstep, sbo = tiles.kstep, tiles.sbo
    tid = bir.thread_idx("x")
    wg = bir.udiv(tid, 128)
    items = _items(tiles, tid)
    row_bytes = k if tiles.fp8 else bir.udiv(k, 2)
    steps = bir.ceil_div(k, kstep)
    a_bytes = tiles.operand_bytes[0]
    scales0 = sum(tiles.operand_bytes)  # the f32 scales' offset in a stage ("promote")
    base_desc = W.descriptor(W.shared_address(smem), lbo=LBO, sbo=sbo)
    pre = [x for p in range(PREFETCH) for it in items
           for x in _load_item(a, b, it, bir.const(p), row_bytes, tiles)]
    if not tiles.promote:
        _fill_scale_table(smem, STAGES * tiles.stage_bytes, tiles, dequant)
        bir.barrier()
    zero = W.zero_accumulator(tiles.bn)
    carry = [zero, zero] if tiles.promote else [zero]
    nacc = len(carry)
    per_step = 2 * len(items)
    with bir.for_range(0, steps, carry=[*carry, *pre]) as loop:
        step = loop.iv
        acc, regs = loop.carried[0], list(loop.carried[nacc:])
        def next_loads() -> list[Value]:
            return [x for it in items
                    for x in _load_item(a, b, it, bir.add(step, PREFETCH), row_bytes, tiles)]

        if pipeline == "early":
            nxt = next_loads()
        stage0 = bir.mul(bir.urem(step, STAGES), tiles.stage_bytes)
        for i, it in enumerate(items):
            data, scales = regs[2 * i], regs[2 * i + 1]
            if it.live is None:
                _store_piece(smem, stage0, it, data, scales, dequant, tiles)
            else:
                with bir.when(it.live):
                    _store_piece(smem, stage0, it, data, scales, dequant, tiles)
            if tiles.promote:
                first = bir.eq(it.piece, 0)
                if it.live is not None:
                    first = bir.logical_and(first, it.live)
                with bir.when(first):
                    _store_scale(smem, bir.add(bir.add(stage0, scales0), bir.mul(it.row, 4)),
                                 scales)
        W.fence_proxy_async_shared()
        bir.barrier()
        da = W.advance(base_desc, bir.as_i64(bir.add(stage0, bir.mul(wg, 8 * sbo))))
        db = W.advance(base_desc, bir.as_i64(bir.add(stage0, a_bytes)))
        if tiles.promote:
            W.wait_group(0)  # the block fragment of step - 1
            prev = bir.mul(bir.urem(bir.add(step, STAGES - 1), STAGES), tiles.stage_bytes)
            br = bir.if_(bir.ult(bir.const(0), step), [acc.type])
            with br.then():
                br.yield_(_promote(acc, loop.carried[1], smem, bir.add(prev, scales0), wg,
                                   tiles))
            with br.else_():
                br.yield_(acc)
            acc, blk = br.results[0], loop.carried[1]
        W.fence()
        for h in range(kstep // tiles.mma_k):  # each wgmma reads 32 bytes of a row
            if tiles.promote:
                blk = W.mma_async(blk, W.advance(da, 2 * h * LBO), W.advance(db, 2 * h * LBO),
                                  tiles.bn, dtype=tiles.mma_type, accumulate=h > 0)
            else:
                acc = W.mma_async(acc, W.advance(da, 2 * h * LBO),
                                  W.advance(db, 2 * h * LBO), tiles.bn, dtype=tiles.mma_type)
        W.commit_group()
        if pipeline == "late":
            nxt = next_loads()
        if tiles.promote:
            loop.yield_(acc, blk, *regs[per_step:], *nxt)
        else:
            W.wait_group(1)
            loop.yield_(acc, *regs[per_step:], *nxt)
    W.wait_group(0)
    acc = loop.results[0]
    if tiles.promote:
        last = bir.mul(bir.urem(bir.add(steps, STAGES - 1), STAGES), tiles.stage_bytes)
        br = bir.if_(bir.ult(bir.const(0), steps), [acc.type])
        with br.then():
            br.yield_(_promote(acc, loop.results[1], smem, bir.add(last, scales0), wg, tiles))
        with br.else_():
            br.yield_(acc)
        acc = br.results[0]
    return acc, wg


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

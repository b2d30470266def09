"""IR of the warp-specialized "producer-dequant" sm_90a matmul (:mod:`blockscale.ops.matmul_pdq`,
:mod:`blockscale.ops.matmul_grouped_pdq`; issues #9, #10).

Imports MLIR: only the op modules' ``build`` import it.

The CTA is ``bm / 64`` consumer warpgroups (threads ``0 .. 2 bm - 1``) plus one PRODUCER
warpgroup (threads ``2 bm .. 2 bm + 127``): 384 threads at bm = 128. The consumers are the
two-phase kernel's phase 2 unchanged (:class:`blockscale.ops._twophase_ir._Ring`: a ring of
``stages`` shared stages of kstep 64 in the stage-ordered no-swizzle layout, A then B, full /
empty mbarriers, ``m64n256k16`` bf16 wgmmas, ``wait_group 1``, one release per warpgroup).
The producer fills stage ``t % stages`` with k-step ``t``:

* A (bm x 64 bf16, 16 KiB at bm 128) either from the phase-1 bf16 workspace of A
  (:func:`blockscale.ops._twophase_ir.emit_dequant`, tile ``bm``) by one
  ``cp.async.bulk`` of producer thread 0 (``mbarrier.arrive.expect_tx`` of its bytes on
  full[slot] first), or dequantized from its packed rows like B (:class:`PackedRows`: the
  grouped kernel, whose group rows are not 128-aligned in a workspace);
* B (256 x 64, 32 KiB) dequantized from the PACKED weights: producer thread ``p`` takes
  rows ``p`` and ``p + 128`` of the B tile (and row ``p`` of packed A), per row the step's
  32 FP4 bytes (two 16-byte ``ld.global.v4``) and their scale bytes (5-D layout, or the 6-D
  expert layout of the grouped kernel), converted exactly as phase 1 does (the "lut" bf16
  values of ``_mma_ir.fp4x4_to_bf16x2x2`` with the ``_wgmma_ir._scale_values`` splats
  folded in by ``mul.rn.bf16x2``; :func:`_fp4x4_lut` places the signs with one IMAD per
  pair), and stored as eight 16-byte ``st.shared`` at ``span + c * tile * 16 + row * 16``
  (the 32 lanes of a warp write one 512-byte run: no bank conflicts). Rows past N (past the
  group end for A), halves past K: zeros (phase 1's guard, so the same bytes);
* then ``fence.proxy.async.shared::cta`` (the generic-proxy stores are read by the
  wgmmas, the async proxy; SASS MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S) and one
  ``mbarrier.arrive`` per producer thread: full[] counts the 128 producers (+ the
  expect_tx arrival when A is bulk-copied).

The producer waits on empty[slot] before it overwrites a stage (the consumers' release of
step ``t - stages``; at ``t = stages - 1`` their step-0 release of the unused last stage, as
in the two-phase ring); it runs at most ``stages - 1`` steps ahead. With ``prefetch`` its
global loads of step ``t + 1`` are issued before the wait and the dequantization of step
``t`` (loop-carried registers).

Loop structures (:data:`LOOPS`). "split", the GPU kernel: ``if producer { K loop } ; if
consumer { K loop; epilogue }`` (warp-uniform branches on the warpgroup index broadcast by
``shfl.sync``, so ptxas does not serialize the wgmmas, C7518): the accumulators live only
in the consumers' code and every role fits the 168-register cap of 384 threads without
``setmaxnreg``. The lock-step interpreter runs the producer branch to its end first, so it
can run "split" only while the K steps fit in the ring (``ceil(K / 64) < stages``); past
that the producer's empty wait deadlocks (the interpreter raises). "lockstep": one K loop in
which iteration ``s`` runs the consumers' step ``s`` and then the producer's fill of step
``s + stages - 1`` (whose empty wait is for the release made in the same iteration): every
wait finds its phase complete in lock-step order, so the interpreter runs it for any K;
on the GPU the producer's path also holds the 128 accumulators (spills; not bundled). Both
are built from the same per-step pieces (:meth:`_Ring.consume`, :func:`_load_step`,
:func:`_fill`).

Epilogue: by the consumers inside their branch (the direct stores of
:func:`blockscale.ops.matmul_sm90.store_tile`), or, ``all_threads`` (the staged store of
:mod:`blockscale.ops._staged_store_ir`, whose CTA barriers need every thread), after the role
branches: the consumer branch yields its accumulator struct, the producer branch zeros, and
the store's ``writers`` predicate (the consumer role) keeps the producers out of the staged
tile; every thread joins its barriers and threads 0 .. bm - 1 its row copies. ptxas keeps
the wgmmas unserialized (no C7515) and the register count (154 / 168 with packed A).

Numerics: the stage bytes equal those the two-phase kernel copies from its workspaces and
the consumers issue the same k16 wgmmas in the same order, so the output is bit-identical to
:func:`blockscale.ops.matmul_twophase.block_scaled_matmul_twophase` (kstep 64, bm 128) in the
interpreter's model (and, on the GPU, the same HGMMA sequence on the same operands).

Variants (issue #10). Two producer warpgroups (``producers=2``, 512 threads): ptxas gives
each thread 65536 / 512 = 128 registers and does not let code after ``setmaxnreg.inc`` use
more than the count at entry (C7602, "Insufficient registers (128)", for m64n256's 128
accumulators; .maxntid + .minnctapersm 1 checked), so they come with the 128 x 192 tile
(``bn=192``, 96 accumulators, 122-128 registers, 5 stages). The producers' work is then
dealt as units, one 32-element half of one tile row each (:func:`_units`): B's 384 over 256
threads (threads 0 .. 127 two, the others one), A's 256 one a thread. ``depth=2`` issues
step t + 2's loads after step t's fence and arrival, so the fence (MEMBAR.ALL.CTA) does not
follow global loads still in flight (with ``depth=1`` step t + 1's loads precede step t's
stores and fence).

Round 2 (issue #10): the PRMT tables' first words come from shared memory once per tile
(:func:`_lut_regs`; as constants ptxas copied a uniform register into a register before each
of the 84 lookups a step), the scale bytes are loaded zero-extended (:func:`_scale_word`),
NVFP4's two of a unit decoded at once as bf16 fields (:func:`_nvfp4_scale_pair`, times a
2^120 table: 7 instructions instead of ~20) and MXFP4's as ``e << 7`` (:func:`_mx_scale`,
times a 2^-2 table); the products are exact, so the stage bytes are unchanged. The grouped
staged kernels (the dispatch's), producer loop: 991 -> 788 (NVFP4 row scales) / 905 -> 783
(MXFP4) instructions a k64 step (two producers at 128 x 192, 3 units: ~560 -> ~505), 168
registers, 8-20 bytes of spills outside the K loops (none inside; tests
``test_producer_loop_sass``). An unrolled-by-2 loop (:data:`SPLIT_UNROLL`) spills inside
it. The counts below are the round-1 ones.

Grouped A from a workspace (issue #10): ``a_tile`` names the grouped phase-1 workspace tile
(:mod:`blockscale.ops._grouped_p1_ir`) the bulk copies read; ``tall``
(:mod:`blockscale.ops._pdq_tall_ir`) swaps in the 256 x 128 item's A copies (two tiles, a
runtime expect_tx), descriptors and consumers (three loops by the live m64 slabs), the ring's
``wgs`` = 2 consumer warpgroups. Producer loop, grouped staged kernels: A packed 788 / 783,
A from the workspace 558 / 556, 256 x 128 315 / 322 (``unroll`` 2: 302 / 297) SASS a k64
step (NVFP4 row scales / MXFP4), 154-168 registers, no spills.

Round 3 (issue #10, session 8): f16 operands for NVFP4 (``dtype="f16"``,
:mod:`blockscale.ops._f16_dequant_ir`: a code is its E5M2 byte, no PRMT tables; A from an f16
phase 1; both operands times 2^-7, the accumulator times 2^14 first: the same bytes), producer
loop 558 -> 414 SASS a k64 step (128 x 256 skip items), 465 -> 353 (192 x 192). And ``pair``:
the fence after the producer's stores is MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S in SASS (the
one-way ``fence.proxy.async::generic.release.sync_restrict`` compiles to the same), and the
MEMBAR waits for the thread's global loads still in flight: the prefetch issued at a step's
start had only that step's conversion to land (ncu: the producer's loop-carried copies and
its fence stalled on the long scoreboard, ~30 % of its samples). Paired, two steps are filled
under one fence with the next two steps' loads issued at the pair's start (four steps of
registers: 167 at 128 x 256, no spills). H200 run AR, gpt-oss NVFP4: skip items f16 + pair
T=1024 0.893 ms (bf16 1.086), T=4096 1.458 (bf16 1.625; 192 x 192 bf16 1.550).

SASS (ptxas 13.0, sm_90a, tools/sass_loop_counts.py; per thread and k64 step): consumers 63
instructions + 4 HGMMA.64x256x16 (1024 tensor cycles per SM at peak); producer, A by bulk
copy: 692 (NVFP4; ALU 376, FMA-pipe 220, 16 STS.128) / 648 (MXFP4); packed A: 965 / 866
(ALU 551 / 482, 24 STS.128); grouped (both packed): 955 / 855. 154 registers (168 with the
prefetch), no spills (packed A with the prefetch: 16 bytes). Two producers at 128 x 192, the
thread with the most units: 419 / 389 (2 units; depth 2: 425), packed A 564 (3), grouped
559 / 518 (3; depth 2: 567 / 531); 122 registers (128 packed / grouped), no spills. One
producer at 128 x 192: 593 (3 units).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import cpasync, tma
from blockscale.compiler.arch import wgmma as W
from blockscale.layouts import SF_ATOM_BYTES
from blockscale.ops import _twophase_ir as T
from blockscale.ops import _wgmma_ir as X
from blockscale.ops._mma_ir import _LUT_HI, _LUT_LO

Value = ir.Value

#: K elements per step (one 32-byte sector of packed FP4 per B row) and the B tile rows
KSTEP, BN = 64, T.BN
#: threads of the producer warpgroup; B rows per producer thread and step
PRODUCER_THREADS = 128
ROWS_PER_THREAD = BN // PRODUCER_THREADS
#: producer warpgroups: one, or two (512 threads: 128 registers a thread, so the consumers'
#: tile is 128 x 192, 96 accumulator registers; ptxas does not let code after a setmaxnreg.inc
#: use more registers than the count at entry: C7602 "Insufficient registers (128)" for the
#: m64n256 wgmmas)
PRODUCERS = (1, 2)
#: B tile widths (the consumers' wgmma N)
BNS = (256, 192)


def threads(bm: int, producers: int = 1) -> int:
    """CTA threads: ``bm / 64`` consumer warpgroups and the producer warpgroup(s)."""
    return 2 * bm + PRODUCER_THREADS * producers


class _PdqRing(T._Ring):
    """Phase 2's ring (:class:`blockscale.ops._twophase_ir._Ring`: same shared layout,
    descriptors and consumer protocol) whose full barriers also count the 128 producer
    threads' arrivals; keeps the shared buffer for the producer's stores. ``wgs``: the
    consumer warpgroups (default ``bm / 64``; the 256 x 128 tile: 2 of two m64 slabs)."""

    def __init__(self, kb: bir.KernelBuilder, k: Value, stages: int, bm: int,
                 packed_a: bool = False, producers: int = 1, bn: int = BN,
                 wgs: int | None = None) -> None:
        # the producers' table words (_lut_regs): a static shared buffer (8 bytes)
        self.tables = tma.shared_buffer(kb, "8xi8", align=8)
        super().__init__(kb, k, KSTEP, stages, bm, "none", bn)
        # the ring's shared buffer: the memref under base = shared_address(smem)
        cast = self.base.owner
        self.smem = cast.operands[0].owner.operands[0]
        if self.sbytes != (bm + bn) * 2 * KSTEP:
            raise AssertionError("_PdqRing: the two-phase ring's stage is not bm + 256 rows")
        self.packed_a = packed_a
        self.wgs = bm // 64 if wgs is None else wgs
        cons = 128 * self.wgs  # consumer threads
        self.is_cons = bir.ult(self.tid, cons)
        self.pt = bir.sub(self.tid, cons)  # producer thread (valid where not is_cons)
        self.is_prod = bir.eq(self.tid, cons)  # the producer's bulk-copy thread
        self.producers = producers
        self.lut: tuple[Value, ...] | None = None  # _lut_regs (emit_mainloop)
        self.lut_words = _LUT_WORDS  # the table init_barriers stores (emit_mainloop: per fmt)

    def init_barriers(self) -> None:
        with bir.when(self.is_prod):
            words = vector.from_elements(bir.vec(2, bir.i32()),
                                         [_i32(self.lut_words[0]), _i32(self.lut_words[2])])
            bir.vector_store(vector.bitcast(bir.vec(8, bir.i8()), words), self.tables,
                             bir.const(0), alignment=8)
            for i in range(self.stages):
                # the producers' arrivals (+ the bulk copy's expect_tx one)
                cpasync.mbarrier_init(self.full(bir.const(i)), PRODUCER_THREADS * self.producers
                                      + (0 if self.packed_a else 1))
                cpasync.mbarrier_init(self.empty(bir.const(i)), self.wgs)
            tma.fence_mbarrier_init()
        bir.barrier()


class PackedRows:
    """Where the producer reads an operand's packed rows and scales: ``x`` ``[rows, K/2]``
    bytes (i8 memref) from row ``row0`` on (``rows_valid`` of them count, rows past it are
    zeros), the scale bytes of the tile's row ``r`` at ``scale_row(r)`` + the K-block
    offset (5-D / 6-D layouts). ``tile``: the tile's rows (256 for B, bm for A), stored as
    the stage span at byte ``span`` (set by :func:`emit_mainloop`)."""

    def __init__(self, x: Value, sfx: Value, row0: Value, rows_valid: Value, k: Value,
                 scale_row: Callable[[Value], Value], tile: int = BN) -> None:
        if tile % 32:  # warp-uniform units (a multiple of 128 for the one-warpgroup rows)
            raise ValueError(f"tile must be a multiple of 32, got {tile}")
        self.x, self.sfx, self.row0, self.rows_valid, self.k = x, sfx, row0, rows_valid, k
        self.scale_row, self.tile, self.span = scale_row, tile, 0

    @property
    def per_thread(self) -> int:
        return self.tile // PRODUCER_THREADS


#: the dense kernel's B operand (kept name)
BSource = PackedRows


def _data_bytes(fmt: str) -> int:
    """Packed bytes of a 32-element half: 16 (FP4), 32 (MXFP8)."""
    return 32 if fmt == "mxfp8" else 16


def _data_offset(src: PackedRows, row: Value, p: Value, fmt: str) -> Value:
    """The first packed byte of half ``p`` of ``src``'s global row ``row``."""
    per = _data_bytes(fmt)
    row_bytes = src.k if fmt == "mxfp8" else bir.udiv(src.k, 2)
    return bir.add(bir.mul(row, row_bytes), bir.mul(p, per))


def _types(ops: list[PackedRows], fmt: str) -> list[ir.Type]:
    per = [bir.vec(_data_bytes(fmt), bir.i8()), bir.i32()] * 2  # data, scales (_scale_word)
    return per * sum(op.per_thread for op in ops)


def _load_step(ops: list[PackedRows], pt: Value, t: Value, fmt: str) -> list[Value]:
    """Producer thread ``pt``'s packed data and scale bytes of k-step ``t`` (per operand,
    row ``pt + 128 j`` of its tile and 32-element half: vector<16xi8>, vector<nscales
    xi8>); zeros past the rows or K (so zeros for every t >= steps, with no memory
    access)."""
    block = 16 if fmt == "nvfp4" else 32
    nscales = 32 // block
    vd, vs = bir.vec(_data_bytes(fmt), bir.i8()), bir.i32()
    out = []
    for src in ops:
        for j in range(src.per_thread):
            r = bir.add(pt, j * PRODUCER_THREADS)
            row_ok = bir.ult(r, src.rows_valid)
            grow = bir.add(src.row0, r)
            srow = src.scale_row(r)
            for half in range(2):
                p = bir.add(bir.mul(t, 2), half)
                br = bir.if_(bir.logical_and(row_ok, bir.ult(bir.mul(p, 32), src.k)), [vd, vs])
                with br.then():
                    data = bir.vector_load(vd, src.x, _data_offset(src, grow, p, fmt),
                                           alignment=16)
                    jb = bir.mul(p, nscales)
                    off = bir.add(srow, bir.add(bir.mul(bir.udiv(jb, 4), SF_ATOM_BYTES),
                                                bir.urem(jb, 4)))
                    br.yield_(data, _scale_word(src.sfx, off, nscales))
                with br.else_():
                    br.yield_(bir.const(0, vd), bir.const(0, vs))
                out += list(br.results)
    return out


#: the E2M1 magnitude tables of :func:`_fp4x4_lut` (low bytes, then high bytes of the bf16s)
_LUT_WORDS = (*_LUT_LO, *_LUT_HI)
#: NVFP4's: the magnitudes times 2^120 (bf16 + 0x3C00: high bytes 0x7B / 0x7C), multiplied by
#: :func:`_nvfp4_scale_pair`'s |scale| * 2^-120: the same exact products
_LUT_WORDS_NV = (*_LUT_LO, 0x7B7B7B00, 0x7C7C7C7C)
#: MXFP4's: the magnitudes times 2^MX_FOLD_EXP = 2^-2 (bf16 - 0x0100: high bytes 0x3E / 0x3F),
#: multiplied by :func:`_mx_scale`'s 2^(e - 127)
_LUT_WORDS_MX = (*_LUT_LO, 0x3E3E3E00, 0x3F3F3F3F)


def lut_words(fmt: str) -> tuple[int, ...]:
    """The :func:`_fp4x4_lut` table words of ``fmt``'s producer."""
    if X.MX_FOLD_EXP != -2:
        raise AssertionError("_LUT_WORDS_MX folds MX_FOLD_EXP = -2")
    return _LUT_WORDS_NV if fmt == "nvfp4" else _LUT_WORDS_MX


def _mx_scale(e: Value) -> Value:
    """An E8M0 scale byte (i32 0 .. 255) -> bf16 2^(e - 127) (vector<2xbf16> splat): bits
    ``e << 7``, or'ed with 0x40 for e = 0 (2^-127, a bf16 subnormal) and e = 255 (0x7FC0, the
    NaN of :func:`blockscale.ops._wgmma_ir._scale_values`); times the 2^-2 of
    ``_LUT_WORDS_MX``: the same exact products as phase 1's 2^(e - 129) times the magnitudes."""
    x = bir.mul(e, 128)
    edge = bir.ult(_i32(253), bir.sub(e, 1))  # e - 1 wraps at e = 0; 254 at e = 255
    x = bir.select(edge, bir.bit_or(x, 0x40), x)
    half = vector.bitcast(bir.vec(2, bir.bf16()), vector.from_elements(bir.vec(1, bir.i32()),
                                                                       [x]))
    return vector.shuffle(half, half, [0, 0])


def _nvfp4_scale_pair(w: Value) -> Value:
    """A unit's two E4M3 scale bytes (i32 ``b1 << 8 | b0``) -> vector<2xbf16> of |scale| * 2^-120: the
    bf16 bits ``(b & 0x7F) << 4`` put the E4M3 exponent and mantissa fields in the bf16 ones
    (E4M3 subnormals on bf16 subnormals: exact), NaN (0x7F) -> 0x7FC0 as
    :func:`blockscale.ops._wgmma_ir._scale_values`. Both lanes at once: PRMT, LOP3, IADD,
    SHF, LOP3, two IMAD (phase 1's per-byte decode: ~10 instructions a scale)."""
    from blockscale.compiler.arch.nvvm import byte_perm

    x = bir.bit_and(byte_perm(w, _i32(0), 0x4140), 0x007F007F)  # b0 -> lane 0, b1 -> lane 1
    nan = bir.bit_and(bir.shru(bir.add(x, 0x00010001), 7), 0x00010001)  # lane == 0x7F
    x = bir.add(bir.mul(x, 16), bir.mul(nan, 0x7FC0 - 0x07F0))
    return vector.bitcast(bir.vec(2, bir.bf16()), vector.from_elements(bir.vec(1, bir.i32()),
                                                                       [x]))


def _splats(scales: Value, fmt: str) -> tuple[Value, ...]:
    """The bf16 splats (vector<2xbf16>) of a unit's scale bytes (:func:`_scale_word`) that
    multiply its :func:`_fp4x4_lut` pairs (tables :func:`lut_words`): NVFP4 one
    :func:`_nvfp4_scale_pair` and its two lanes (HMUL2 ``.H0_H0`` / ``.H1_H1``), MXFP4
    :func:`_mx_scale`."""
    if fmt == "nvfp4":
        pair = _nvfp4_scale_pair(scales)
        return tuple(vector.shuffle(pair, pair, [q, q]) for q in range(2))
    return (_mx_scale(scales),)


def _scale_word(sfx: Value, off: Value, nscales: int) -> Value:
    """The ``nscales`` (1, 2) scale bytes at ``sfx[off]``, zero-extended to an i32
    (``ld.global.u8`` / ``u16``: the decode needs no mask)."""
    v = bir.vector_load(bir.vec(nscales, bir.i8()), sfx, off, alignment=nscales)
    w = vector.extract(vector.bitcast(bir.vec(1, bir.i8() if nscales == 1 else bir.i16()), v),
                       [], [0])
    return arith.extui(bir.i32(), w)


_i32 = bir.i32_bits  # an i32 constant from a 32-bit pattern


def _fp4x4_lut(x: Value, tabs: tuple[Value, ...] | None = None) -> tuple[Value, Value]:
    """The bf16 pairs (i32) of the four E2M1 codes in the low 16 bits of ``x``: the same
    bits as :func:`blockscale.ops._mma_ir.fp4x4_to_bf16x2x2` (its ``prmt`` magnitude
    tables), with the sign bits placed by one multiply per pair instead of two shifts:
    ``m = x & 0x8888`` holds the signs at bits 3, 7, 11, 15; ``m * (2^12 + 2^24)`` has bit 3
    at 15 and bit 7 at 31 (the other terms land at 19, 23, 27 and above 31; the one overlap,
    at 27, carries no further than 28), ``m * (2^4 + 2^16)`` bit 11 at 15 and bit 15 at 31
    (overlap at 19: carries to 20 at most). 10 instructions per 4 codes (4 PRMT, 4 LOP3,
    2 IMAD) instead of ~14. ``tabs``: the four table words in registers (:func:`_lut_regs`;
    None: constants)."""
    from blockscale.compiler.arch.nvvm import byte_perm

    t = tabs if tabs is not None else tuple(_i32(c) for c in _LUT_WORDS)
    sel = bir.bit_and(x, 0x7777)
    lo8 = byte_perm(t[0], t[1], sel)
    hi8 = byte_perm(t[2], t[3], sel)
    signs = bir.bit_and(x, 0x8888)
    out = []
    for perm, mul in ((0x5140, (1 << 12) + (1 << 24)), (0x7362, (1 << 4) + (1 << 16))):
        s = bir.bit_and(arith.muli(signs, _i32(mul)), _i32(0x80008000))
        out.append(bir.bit_or(byte_perm(lo8, hi8, perm), s))
    return out[0], out[1]


def _lut_regs(ring: _PdqRing) -> tuple[Value, ...]:
    """The :func:`_fp4x4_lut` table words (:func:`lut_words`): the PRMTs' first operands
    (words 0, 2) in registers ptxas cannot rematerialize, one ``ld.shared.v2`` of the copy
    :meth:`_PdqRing.init_barriers` stored (as constants, or even as ``shfl`` of constants,
    ptxas keeps them in uniform registers and copies one into a register before every lookup:
    one ``IMAD.U32 R, RZ, RZ, UR`` each, ~84 a k64 step), words 1, 3 constants (the PRMT's
    immediate operand). Read once per tile, after the CTA barrier."""
    words = vector.bitcast(bir.vec(2, bir.i32()), bir.vector_load(
        bir.vec(8, bir.i8()), ring.tables, bir.const(0), alignment=8))
    lo, hi = (vector.extract(words, [], [i]) for i in range(2))
    return lo, _i32(ring.lut_words[1]), hi, _i32(ring.lut_words[3])


def _dequant_lut(codes: Value, splats: tuple[Value, ...], block: int,
                 tabs: tuple[Value, ...] | None = None) -> list[Value]:
    """:func:`blockscale.ops._wgmma_ir._dequant_row` ("lut", scales folded in), the same
    bits, through :func:`_fp4x4_lut` (``tabs``: its table registers)."""
    from blockscale.ops._mma_ir import _scale_bf16x2

    words = vector.bitcast(bir.vec(4, bir.i32()), codes)
    rows = []
    for c in range(4):
        w = vector.extract(words, [], [c])
        regs = [*_fp4x4_lut(w, tabs), *_fp4x4_lut(bir.shru(w, 16), tabs)]
        regs = [_scale_bf16x2(x, splats[c * 8 // block]) for x in regs]
        rows.append(vector.from_elements(bir.vec(4, bir.i32()), regs))
    return rows


def _dequant(ring: _PdqRing, data: Value, scales: Value, fmt: str) -> list[Value]:
    """A 32-element half's four 16-byte chunks (``vector<4xi32>``) in the ring's operand
    type: bf16 :func:`_dequant_lut` with :func:`_splats` (MXFP8: 32 E4M3 codes times the
    block's power of two, :func:`blockscale.ops._mx8_window_ir.chunks`), or f16
    (:mod:`blockscale.ops._f16_dequant_ir`, NVFP4: values times 2^-7)."""
    if ring.dtype == "f16":
        from blockscale.ops import _f16_dequant_ir as F16

        return F16.dequant_chunks(data, F16.splats(scales))
    if fmt == "mxfp8":  # E4M3 codes times the block's power of two (_mx8_window_ir)
        from blockscale.ops import _mx8_window_ir as MW

        return MW.chunks(data, MW.block_factor(scales))
    return _dequant_lut(data, _splats(scales, fmt), 16 if fmt == "nvfp4" else 32, ring.lut)


def _store_step(ring: _PdqRing, stage0: Value, ops: list[PackedRows], vals: list[Value],
                fmt: str) -> None:
    """Dequantize the registers of :func:`_load_step` as phase 1 does and store them to the
    operands' spans of the stage at ``stage0`` (byte offset in the ring): chunk ``c`` of
    tile row ``r`` at ``span + c * tile * 16 + r * 16``."""
    vd = bir.vec(16, bir.i8())
    i = 0
    for src in ops:
        for j in range(src.per_thread):
            r = bir.add(ring.pt, j * PRODUCER_THREADS)
            for half in range(2):
                data, scales = vals[i], vals[i + 1]
                i += 2
                base = bir.add(stage0, bir.add(src.span, bir.mul(r, 16)))
                for c, v in enumerate(_dequant(ring, data, scales, fmt)):
                    bir.vector_store(vector.bitcast(vd, v), ring.smem,
                                     bir.add(base, (4 * half + c) * src.tile * 16),
                                     alignment=16)



class _Unit(NamedTuple):
    """One part ``part`` (of ``parts`` a k64 step: 2, 32-element halves; 4, 16-element
    quarters) of tile row ``row`` of operand ``src`` that a producer thread converts every
    step, where ``valid`` (None: always)."""

    src: PackedRows
    row: Value
    part: Value
    valid: Value | None
    parts: int = 2


def unit_parts(fmt: str, coalesce: bool) -> int:
    """Parts of a tile row's k64 step a :class:`_Unit` is (:func:`_units`): 2 (32-element
    halves), or, ``coalesce`` with MXFP8, 4 (16-element quarters: a 16-byte load each)."""
    return 4 if coalesce and fmt == "mxfp8" else 2


def _units(ops: list[PackedRows], pt: Value, nthreads: int, parts: int = 2,
           coalesce: bool = False) -> list[_Unit]:
    """Producer thread ``pt``'s units of ``nthreads`` producers: per operand the ``parts
    tile`` row parts, unit ``u = pt + nthreads i`` for ``i < ceil(parts tile / nthreads)``
    (the last one where it exists: tile 192 over 256 threads, threads 0 .. 127 take two of
    B, the others one). Without ``coalesce`` part-major (row ``u % tile``, part ``u //
    tile``): a warp's 32 units share their part, 32 rows, each lane's 16-byte load half a
    32-byte sector of its own row (ncu: 13.3 of 32 bytes a sector used, MXFP8). With it a
    warp's units are ``R = 32 / parts`` consecutive rows times the ``parts`` parts (part
    ``(u // R) % parts``, row ``(u // 32) R + u % R``): one warp load reads R rows' whole
    k64 step (full sectors); the 8 lanes of a quarter warp still store one part of 8
    consecutive rows (128 contiguous bytes: no bank conflict). tile and nthreads multiples
    of 32."""
    out = []
    rows_w = 32 // parts
    for src in ops:
        n = parts * src.tile
        for i in range(-(-n // nthreads)):
            u = bir.add(pt, i * nthreads)
            valid = None if (i + 1) * nthreads <= n else bir.ult(u, n)
            if coalesce:
                row = bir.add(bir.mul(bir.udiv(u, 32), rows_w), bir.urem(u, rows_w))
                part = bir.urem(bir.udiv(u, rows_w), parts)
            else:
                row, part = bir.urem(u, src.tile), bir.udiv(u, src.tile)
            out.append(_Unit(src, row, part, valid, parts))
    return out


def _unit_elems(un: _Unit) -> int:
    return KSTEP // un.parts


def _unit_bytes(un: _Unit, fmt: str) -> int:
    """Packed bytes of a unit: its elements (MXFP8) or half of them (FP4)."""
    return _unit_elems(un) if fmt == "mxfp8" else _unit_elems(un) // 2


def _unit_types(units: list[_Unit], fmt: str) -> list[ir.Type]:
    return [t for un in units for t in (bir.vec(_unit_bytes(un, fmt), bir.i8()), bir.i32())]


def _load_units(units: list[_Unit], t: Value, fmt: str, clamp: bool = False) -> list[Value]:
    """:func:`_load_step` over :func:`_units`: each unit's data bytes (16, or 32 for an
    MXFP8 half) and scale bytes of k-step ``t``, zeros past the rows, K or the units. With
    ``clamp`` a row past the operand's rows loads its last row instead (no per-row
    predicate in the loop; the tile rows past N (B) or past the group end (packed A) give
    outputs no store writes): the 192 x 192 items at 128 registers then do not spill
    (MXFP8 with the L2 prefetch: H200 run ED, gpt-oss T=4096 2.217 -> 1.618 ms); the 168-register
    skip items measured 1-6 % slower with it (run ED against EB-EC), so they keep the
    predicate."""
    block = 16 if fmt == "nvfp4" else 32
    out = []
    for un in units:
        src, elems = un.src, _unit_elems(un)
        nscales = max(1, elems // block)
        vd, vs = bir.vec(_unit_bytes(un, fmt), bir.i8()), bir.i32()
        p = bir.add(bir.mul(t, un.parts), un.part)  # the unit's index along the row
        ok = bir.ult(bir.mul(p, elems), src.k)
        row = un.row
        if clamp:
            row = bir.umin(un.row, bir.sub(src.rows_valid, 1))
        else:
            ok = bir.logical_and(bir.ult(un.row, src.rows_valid), ok)
        if un.valid is not None:
            ok = bir.logical_and(un.valid, ok)
        br = bir.if_(ok, [vd, vs])
        with br.then():
            grow = bir.add(src.row0, row)
            row_bytes = src.k if fmt == "mxfp8" else bir.udiv(src.k, 2)
            off = bir.add(bir.mul(grow, row_bytes), bir.mul(p, _unit_bytes(un, fmt)))
            data = bir.vector_load(vd, src.x, off, alignment=16)
            # the unit's first K block
            jb = bir.mul(p, nscales) if elems >= block else bir.udiv(p, block // elems)
            off = bir.add(src.scale_row(row),
                          bir.add(bir.mul(bir.udiv(jb, 4), SF_ATOM_BYTES), bir.urem(jb, 4)))
            br.yield_(data, _scale_word(src.sfx, off, nscales))
        with br.else_():
            br.yield_(bir.const(0, vd), bir.const(0, vs))
        out += list(br.results)
    return out


def _store_units(ring: _PdqRing, stage0: Value, units: list[_Unit], vals: list[Value],
                 fmt: str) -> None:
    """:func:`_store_step` over :func:`_units`: chunk ``c`` of unit (row, part) at
    ``span + (8 / parts * part + c) tile 16 + row 16``; units past the operand store
    nothing."""
    vd = bir.vec(16, bir.i8())
    for i, un in enumerate(units):
        data, scales = vals[2 * i], vals[2 * i + 1]
        tile = un.src.tile
        per = 8 // un.parts  # 16-byte chunks a unit

        def store(un: _Unit = un, data: Value = data, scales: Value = scales,
                  tile: int = tile, per: int = per) -> None:
            base = bir.add(bir.add(stage0, un.src.span),
                           bir.add(bir.mul(un.row, 16), bir.mul(un.part, per * tile * 16)))
            for c, v in enumerate(_dequant(ring, data, scales, fmt)):
                bir.vector_store(vector.bitcast(vd, v), ring.smem,
                                 bir.add(base, c * tile * 16), alignment=16)

        if un.valid is None:
            store()
        else:
            with bir.when(un.valid):
                store()


def _prefetch_l2(ops: list[PackedRows], pt: Value, t: Value, fmt: str) -> None:
    """Bring k-step ``t``'s packed bytes and scale bytes of the operands' tile rows into L2
    (``prefetch.global.L2``, :func:`blockscale.compiler.arch.cpasync.prefetch_l2`: SASS
    CCTL.E.PF2, a per-thread hint writing no register; the bulk ``cp.async.bulk.prefetch``
    takes a uniform address, so ptxas loops it over the lanes, UBLKPF.L2 32 times a warp):
    producer thread ``pt``
    takes rows ``pt + 128 j``, per row the line of the step's bytes (32 FP4 / 64 MXFP8) and
    of its scale bytes (5-D / 6-D layouts). Nothing past the rows or K. The loads a step
    ahead (:func:`_load_step`, :func:`_load_units`) then hit L2 (H200 run EB, MXFP8 at
    gpt-oss T=1024: 1.42 -> 1.22 ms), and the proxy fence that waits for them
    (MEMBAR.ALL.CTA) waits for L2's latency, not DRAM's."""
    step = KSTEP if fmt == "mxfp8" else KSTEP // 2
    nblocks = KSTEP // (16 if fmt == "nvfp4" else 32)
    live = bir.ult(bir.mul(t, KSTEP), ops[0].k)
    for src in ops:
        row_bytes = src.k if fmt == "mxfp8" else bir.udiv(src.k, 2)
        off0 = bir.mul(t, step)
        base, sbase = cpasync.global_address(src.x), cpasync.global_address(src.sfx)
        jb = bir.mul(t, nblocks)
        for j in range(-(-src.tile // PRODUCER_THREADS)):
            r = bir.add(pt, j * PRODUCER_THREADS)
            ok = bir.logical_and(live, bir.ult(r, bir.umin(src.rows_valid, src.tile)))
            with bir.when(ok):
                row = bir.mul(bir.add(src.row0, r), row_bytes)
                cpasync.prefetch_l2(bir.add(base, bir.as_i64(bir.add(row, off0))))
                soff = bir.add(src.scale_row(r), bir.mul(bir.udiv(jb, 4), SF_ATOM_BYTES))
                cpasync.prefetch_l2(bir.add(sbase, bir.as_i64(soff)))


def _stage(ring: _PdqRing, t: Value) -> tuple[Value, Value]:
    """(byte offset in the ring, full barrier) of step ``t``'s stage."""
    slot = bir.urem(t, ring.stages)
    return bir.mul(slot, ring.sbytes), ring.full(slot)


def _copy_a(ring: _PdqRing, src_a: Value | Callable | None, t: Value) -> None:
    """Producer thread 0: A's bytes of step ``t`` into its (free) stage by bulk copy, their
    count expected on the stage's full barrier (nothing when A is dequantized, ``src_a``
    None)."""
    stage0, full = _stage(ring, t)
    if callable(src_a):  # the 256 x 128 tile's copies (_pdq_tall_ir.Tall.copy_a)
        src_a(full, stage0, t)
    elif src_a is not None:
        with bir.when(ring.is_prod):
            cpasync.mbarrier_arrive_expect_tx(full, ring.a_bytes)
            cpasync.bulk_copy(bir.add(ring.base, bir.as_i64(stage0)),
                              bir.add(src_a, bir.as_i64(bir.mul(t, ring.a_bytes))),
                              ring.a_bytes, full)


def _fill(ring: _PdqRing, src_a: Value | Callable | None, t: Value, ops: list[PackedRows],
          vals: list[Value], fmt: str, units: list[_Unit] | None = None,
          copy_a: bool = True) -> None:
    """Producer warpgroup: fill the (free) stage of step ``t``: A by bulk copy (thread 0 of
    the producers; unless ``src_a`` is None, A is one of ``ops``, or not ``copy_a``: copied
    a step earlier), the ``ops`` from ``vals``; fence the stores to the async proxy and
    arrive."""
    full = _fill_stores(ring, src_a, t, ops, vals, fmt, units, copy_a)
    W.fence_proxy_async_shared()
    cpasync.mbarrier_arrive(full)


def _fill_stores(ring: _PdqRing, src_a: Value | Callable | None, t: Value,
                 ops: list[PackedRows], vals: list[Value], fmt: str,
                 units: list[_Unit] | None = None, copy_a: bool = True) -> Value:
    """:func:`_fill` up to its fence: A's copy and the stores of step ``t``'s stage; returns
    the stage's full barrier."""
    stage0, full = _stage(ring, t)
    if copy_a:
        _copy_a(ring, src_a, t)
    if units is None:
        _store_step(ring, stage0, ops, vals, fmt)
    else:
        _store_units(ring, stage0, units, vals, fmt)
    return full


#: producer steps per iteration of the "split" loop. 2 alternates the prefetched registers
#: between two sets instead of copying them back each step (~20 IMAD.MOV a step: 1508 SASS
#: per 2 steps against 2 x 790, NVFP4 grouped staged), but at 168 registers ptxas then spills
#: inside the loop (36 / 48 bytes), so 1.
SPLIT_UNROLL = 1

#: loop structures: "split" (each role its own loop: the GPU design, the accumulators live
#: only in the consumers' code) and "lockstep" (one loop, both roles per iteration: the
#: interpreter runs it for any number of steps; see the module docstring)
LOOPS = ("split", "lockstep")


def _role(bm: int) -> tuple[Value, Value]:
    """(is consumer, is producer) from the warpgroup index broadcast from lane 0
    (``shfl.sync.idx``): ptxas then knows the branch is warp-uniform and keeps the
    consumers' wgmmas unserialized (C7518 otherwise)."""
    from blockscale.compiler.arch import nvvm

    wg = nvvm.shfl_idx(bir.as_i32(bir.udiv(bir.thread_idx("x"), 128)), 0)
    return bir.ult(wg, bir.const(bm // 64, bir.i32())), bir.ule(bir.const(bm // 64, bir.i32()), wg)


def emit_mainloop(kb: bir.KernelBuilder, a: Value | PackedRows, m0: Value, b: PackedRows,
                  k: Value, fmt: str, stages: int,
                  epilogue: Callable[[Value, Value, Value | None], None],
                  bm: int = T.BM, prefetch: bool = True, loop: str = "split",
                  all_threads: bool = False, producers: int = 1, bn: int = BN,
                  depth: int = 1, a_tile: Value | None = None, tall: Any = None,
                  unroll: int = SPLIT_UNROLL, skip: Any = None,
                  b_tma: tuple[Value, Value] | None = None, a_early: bool = False,
                  dtype: str = "bf16", pair: bool = False, coalesce: bool = False,
                  l2_ahead: int = 0, clamp_rows: bool = False, reuse: bool = False) -> None:
    """The producer / consumer K loop (module docstring) of the ``bm x bn`` tile of A rows
    ``a`` and B rows ``b`` (``b.tile == bn``), then ``epilogue(acc, wg, writers)``: the
    warpgroup's final accumulator struct and index. Without ``all_threads`` it runs in the
    consumer threads only (``writers`` None); with it every thread of the CTA runs it after
    the role branches (so it may use CTA barriers, e.g. the staged store), ``writers`` the
    (warp-uniform) consumer predicate and ``acc`` zeros in the producer threads.
    ``a``: the stage-ordered A workspace (i8 memref, tile ``bm``; the tile's rows from
    ``m0`` on, copied by ``cp.async.bulk``) or packed rows (:class:`PackedRows` with
    ``tile == bm``) the producer dequantizes too (``m0`` unused). Every thread of the CTA
    runs it. ``loop``: :data:`LOOPS`. ``producers``: :data:`PRODUCERS` warpgroups; other
    than one producer warpgroup at bn 256 the row halves are dealt as units
    (:func:`_units`). ``depth`` (with ``prefetch``): 1, step t + 1's loads issued before
    step t's stores; 2, step t + 2's loads issued after step t's fence and arrival (the
    fence, MEMBAR.ALL.CTA, then orders only the stores, not global loads in flight; two
    steps of registers). ``a_tile``: the workspace tile A's stages come from (index value;
    default ``m0 // bm``: the grouped kernel's per-(group, row tile) workspace,
    :mod:`blockscale.ops._grouped_p1_ir`, passes its tile). ``tall``: a
    :class:`blockscale.ops._pdq_tall_ir.Tall` (``bm`` 256, ``bn`` 128, A from the
    workspace): its A copies, descriptors and consumers (two warpgroups of two m64n128
    slabs, the slabs past the rows skipped), or a :class:`blockscale.ops._pdq_tri_ir.Tri`
    (the 192 x 192 item: ``bm`` 256 A rows, ``bn`` 192, three consumer warpgroups of one
    m64n192 slab, the producer's row halves dealt as units); with a Tall ``epilogue`` gets
    the pair of slab
    accumulators. ``unroll``: producer steps per iteration of the "split" loop
    (:data:`SPLIT_UNROLL`; 2 at 256 x 128: 302 / 297 SASS a step instead of 315 / 322, no
    spills). ``skip``: a :class:`blockscale.ops._pdq_tall_ir.Skip` (not with ``tall``, which
    always skips): a consumer warpgroup whose 64 rows lie past the item's rows issues no
    wgmma. ``b_tma``: (the scale atom row of B's first 128 rows, atom columns a tile): B's
    packed bytes and scale atoms come through the TMA ring of
    :class:`blockscale.ops._pdq_tma_ir.TmaB` (A from the workspace, one producer
    warpgroup, bn 256 or the 256 x 128 item, no register prefetch). ``a_early`` (A
    bulk-copied at bm 128, "split" loop): step t + 1's A copy is issued at the start of
    step t, after the wait for its stage, so its latency overlaps step t's dequantization;
    the lockstep loop copies A at the fill (its next stage is not free yet). Both are
    measured no faster on the H200 (runs AF / AG / AJ: the CTA-step is not bound by the
    producer's load or copy latencies). ``dtype``: the operands' type in the ring (every
    consumer's wgmmas), "bf16" or "f16" (NVFP4, A from an f16 workspace:
    :mod:`blockscale.ops._f16_dequant_ir`; both operands times 2^-7, the epilogue's
    fix). ``pair`` ("split" loop, with the prefetch at distance 1): the producer fills two
    steps per iteration under ONE proxy fence, the next two steps' global loads issued at the
    iteration's start. The fence (SASS MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S, also in its
    one-way ``sync_restrict`` form) waits for the thread's global loads still in flight, so
    with a fence per step the loads issued at a step's start bound the step by their
    latency; here they have two steps' conversion to land (four steps of registers).
    ``coalesce``: the producer's row parts are dealt as warp-coalesced units
    (:func:`_units`; MXFP8 16-element quarters, :func:`unit_parts`), any tile (not with
    ``b_tma``). ``l2_ahead`` (0: off): the producer brings step t + ``l2_ahead``'s packed
    rows into L2 at step t (:func:`_prefetch_l2`; steps 0 .. l2_ahead - 1 before its loop),
    so its register loads a step ahead hit L2 (not with ``b_tma``). ``clamp_rows``: units
    past the operand's rows load its last row (:func:`_load_units`). ``reuse``: after the
    epilogue a CTA barrier and the ring's mbarriers invalidated, so the caller may run the
    loop again (the dynamic schedule's next unit; not with ``b_tma``)."""
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {list(LOOPS)}, got {loop!r}")
    if producers not in PRODUCERS:
        raise ValueError(f"producers must be one of {list(PRODUCERS)}, got {producers!r}")
    if (bn not in BNS and tall is None) or b.tile != bn:
        raise ValueError(f"bn must be one of {list(BNS)} and the B rows' tile, got bn={bn}, "
                         f"tile {b.tile}")
    if tall is not None:
        tall.check(a, bm, bn, producers)
    if dtype != "bf16" and (dtype, fmt, isinstance(a, PackedRows)) != ("f16", "nvfp4", False):
        raise ValueError(f"dtype must be 'bf16', or 'f16' for NVFP4 with A from the "
                         f"workspace, got dtype={dtype!r}, fmt={fmt!r}")
    ring = _PdqRing(kb, k, stages, bm, packed_a=isinstance(a, PackedRows), producers=producers,
                    bn=bn, wgs=None if tall is None else tall.wgs)
    ring.dtype = dtype
    steps = ring.steps
    b.span = ring.a_bytes
    if isinstance(a, PackedRows):
        if a.tile != bm:
            raise ValueError(f"packed A rows must be a tile of bm={bm} rows, got {a.tile}")
        ops, src_a = [a, b], None
    else:
        ops = [b]
        tile = bir.udiv(m0, bm) if a_tile is None else a_tile
        src_a = bir.add(cpasync.global_address(a),
                        bir.as_i64(bir.mul(tile, bir.mul(ring.kp, 2 * bm))))
        if tall is not None:
            src_a = tall.copier(ring, a, a_tile)
    src = ops
    ring.lut_words = lut_words(fmt)
    raw = None
    if b_tma is not None:
        from blockscale.ops._pdq_tma_ir import TmaB

        if (producers, prefetch, isinstance(a, PackedRows)) != (1, False, False) or \
                (bn != BN and tall is None):
            raise ValueError("b_tma needs A from the workspace, one producer warpgroup, "
                             f"bn={BN} (or the 256 x 128 item) and no prefetch; got "
                             f"producers={producers}, bn={bn}, prefetch={prefetch}")
        raw = TmaB(kb, fmt, b, *b_tma, ring)
        with bir.when(ring.is_prod):  # before init_barriers' fence and CTA barrier
            raw.init_barriers()
    if reuse and raw is not None:
        raise ValueError("reuse is not for b_tma (its TMA ring's barriers stay initialised)")
    ring.init_barriers()
    if tall is None:
        ring.descriptors()
    else:
        tall.descriptors(ring)
    if (coalesce or l2_ahead) and raw is not None:
        raise ValueError("coalesce and l2_ahead read B from global memory (not with b_tma)")
    if type(l2_ahead) is not int or not 0 <= l2_ahead <= 16:
        raise ValueError(f"l2_ahead must be an int in [0, 16], got {l2_ahead!r}")
    units = None if not coalesce and ((producers, bn) == (1, BN) or (
        tall is not None and not tall.units)) else _units(
        ops, ring.pt, PRODUCER_THREADS * producers, unit_parts(fmt, coalesce), coalesce)
    if depth not in (1, 2) or (depth == 2 and not prefetch):
        raise ValueError(f"depth must be 1 or 2 (2 with the prefetch), got {depth!r}")
    if units is None:
        types = _types(ops, fmt) if prefetch else []
    else:
        types = _unit_types(units, fmt) if prefetch else []
    one = len(types)
    types = types * depth
    is_cons, is_prod = _role(64 * ring.wgs)
    ring.lut = _lut_regs(ring)  # after init_barriers' CTA barrier
    if raw is not None:
        raw.prologue()

    def load(t: Value) -> list[Value]:
        if raw is not None:
            return raw.read(ring.pt, t)
        if units is None:
            return _load_step(src, ring.pt, t, fmt)
        return _load_units(units, t, fmt, clamp=clamp_rows)

    def first(t: Value) -> list[Value]:
        if depth == 2:
            return load(t) + load(bir.add(t, 1))
        return load(t) if prefetch else []

    def wait_free(t: Value, wait: Value | None, wait_parity: Value | None) -> None:
        """Where ``wait`` holds (None: always), wait on step t's empty barrier for
        ``wait_parity`` (if given)."""
        if wait_parity is not None:
            empty = ring.empty(bir.urem(t, stages))
            if wait is None:
                cpasync.mbarrier_wait(empty, wait_parity)
            else:
                with bir.when(wait):
                    cpasync.mbarrier_wait(empty, wait_parity)

    def split_wait(u: Value) -> tuple[Value, Value]:
        """The "split" loop's (wait, parity) for step ``u``'s stage: from u = stages - 1 on,
        the consumers' release at their step u - stages + 1 (step u - stages's stage; the
        first, at u = stages - 1, is the consumers' step-0 release of the unused stage
        stages - 1)."""
        ahead = bir.sub(bir.add(u, 1), stages)  # wraps for u < stages - 1: unused
        return bir.ule(stages - 1, u), T._parity(bir.udiv(ahead, stages))

    def produce(t: Value, regs: list[Value], wait: Value | None,
                wait_parity: Value | None, early: bool = False) -> list[Value]:
        """Step t (if t < steps; where ``wait`` holds (None: always), wait on its empty
        barrier for ``wait_parity`` first, if given); returns the next step's prefetched
        registers. ``early``: ``wait`` / ``wait_parity`` are step t + 1's, whose stage is
        waited for and its A copied before step t's fill (step t's A was copied a step
        earlier)."""
        if l2_ahead:
            _prefetch_l2(ops, ring.pt, bir.add(t, l2_ahead), fmt)
        nxt = load(bir.add(t, 1)) if prefetch and depth == 1 else []
        if early:
            with bir.when(bir.ult(bir.add(t, 1), steps)):
                wait_free(bir.add(t, 1), wait, wait_parity)
                _copy_a(ring, src_a, bir.add(t, 1))
        with bir.when(bir.ult(t, steps)):
            if not early:
                wait_free(t, wait, wait_parity)
            _fill(ring, src_a, t, ops, regs[:one] if prefetch else load(t), fmt, units,
                  copy_a=not early)
        if depth == 2:  # after the fence: step t + 2's loads (zeros past the steps)
            return regs[one:] + load(bir.add(t, 2))
        return nxt

    def prefetch_first() -> None:
        """Steps 0 .. l2_ahead - 1 into L2 (the loop's step t brings step t + l2_ahead)."""
        for u in range(l2_ahead):
            _prefetch_l2(ops, ring.pt, bir.const(u), fmt)

    nacc = 1 if tall is None else tall.nacc  # accumulators a consumer thread carries
    accs_t = [W.accumulator_type(bn)] * nacc

    def zeros() -> list[Value]:
        return [W.zero_accumulator(bn) for _ in range(nacc)]

    def result(accs: Any) -> Any:  # the epilogue's acc: the struct (tall: the slab pair)
        return accs[0] if nacc == 1 else tuple(accs)

    if loop == "split" and pair:
        if not prefetch or depth != 1 or a_early or raw is not None:
            raise ValueError("pair needs the prefetch at distance 1, no a_early and B from "
                             "global memory")
        with bir.when(is_prod):
            prefetch_first()
        with bir.when(is_prod), bir.for_range(0, steps, 2,
                                              carry=load(bir.const(0)) + load(bir.const(1))) as pl:
            regs, fulls = list(pl.carried), []
            for j in range(2 if l2_ahead else 0):
                _prefetch_l2(ops, ring.pt, bir.add(pl.iv, l2_ahead + j), fmt)
            nxt = load(bir.add(pl.iv, 2)) + load(bir.add(pl.iv, 3))  # in flight for two steps
            for j in range(2):
                t = bir.add(pl.iv, j)
                live = bir.ult(t, steps)
                with bir.when(live):
                    wait_free(t, *split_wait(t))
                    _fill_stores(ring, src_a, t, ops, regs[j * one:(j + 1) * one], fmt, units)
                fulls.append((live, _stage(ring, t)[1]))
            W.fence_proxy_async_shared()
            for live, full in fulls:
                with bir.when(live):
                    cpasync.mbarrier_arrive(full)
            pl.yield_(*nxt)
    if loop == "split":
        # the producer first in the IR (lock-step order runs it first); its prefetch of
        # step 0 inside the branch (the with items are entered in order)
        if unroll not in (1, 2):
            raise ValueError(f"unroll must be 1 or 2, got {unroll!r}")
        if a_early and (src_a is None or callable(src_a)):
            raise ValueError("a_early needs A bulk-copied from the workspace at bm 128")
        if not pair:  # (the paired producer loop is above)
            if a_early:  # step 0's A (its stage is free)
                with bir.when(is_prod), bir.when(bir.ult(bir.const(0), steps)):
                    _copy_a(ring, src_a, bir.const(0))
            with bir.when(is_prod):
                prefetch_first()
            with bir.when(is_prod), bir.for_range(0, steps, unroll,
                                                  carry=first(bir.const(0))) as pl:
                nxt = list(pl.carried)
                for j in range(unroll):  # the step after the last one: fills nothing
                    t = bir.add(pl.iv, j)
                    u = bir.add(t, 1) if a_early else t  # (t + 1: its A copied early)
                    nxt = produce(t, nxt, *split_wait(u), early=a_early)
                if prefetch:
                    pl.yield_(*nxt)

        def consumer_loop() -> list[Value]:
            if tall is not None:
                return tall.consumer_loop(ring, steps)
            if skip is not None:
                return [skip.consumer_loop(ring, steps, bn)]
            with bir.for_range(0, steps, carry=[W.zero_accumulator(bn)]) as cl:
                cl.yield_(ring.consume(cl.iv, cl.carried[0]))
            W.wait_group(0)
            return [cl.results[0]]

        if not all_threads:
            with bir.when(is_cons):
                epilogue(result(consumer_loop()), ring.wg, None)
            _release(ring, reuse)
            return
        cons = bir.if_(is_cons, accs_t)
        with cons.then():
            cons.yield_(*consumer_loop())
        with cons.else_():
            cons.yield_(*zeros())
        epilogue(result(list(cons.results)), ring.wg, is_cons)
        _release(ring, reuse)
        return

    # lockstep: the producers fill steps 0 .. stages - 2 (all free), then one loop
    pro = bir.if_(is_prod, types)
    with pro.then():
        prefetch_first()
        regs = first(bir.const(0))
        for p in range(stages - 1):
            regs = produce(bir.const(p), regs, None, None)
        pro.yield_(*regs)
    with pro.else_():
        pro.yield_(*[bir.const(0, ty) for ty in types])
    with bir.for_range(0, steps, carry=[*zeros(), *pro.results]) as lp:
        s = lp.iv
        accs, regs = list(lp.carried[:nacc]), list(lp.carried[nacc:])
        cons = bir.if_(is_cons, accs_t)
        with cons.then():
            if tall is not None:
                cons.yield_(*tall.consume_any(ring, s, accs))
            elif skip is not None:
                cons.yield_(skip.consume_any(ring, s, accs[0]))
            else:
                cons.yield_(ring.consume(s, accs[0]))
        with cons.else_():
            cons.yield_(*accs)
        prod = bir.if_(is_prod, types)
        with prod.then():
            # the consumers released step s - 1's stage (= step s + stages - 1's) above
            prod.yield_(*produce(bir.add(s, stages - 1), regs, None,
                                 T._parity(bir.udiv(s, stages))))
        with prod.else_():
            prod.yield_(*regs)
        lp.yield_(*cons.results, *prod.results)
    with bir.when(is_cons):
        W.wait_group(0)
        if not all_threads:
            epilogue(result(list(lp.results[:nacc])), ring.wg, None)
    if all_threads:
        epilogue(result(list(lp.results[:nacc])), ring.wg, is_cons)
    _release(ring, reuse)


def _release(ring: _PdqRing, reuse: bool) -> None:
    """With ``reuse``: a CTA barrier (every thread is past the ring: the epilogue's bulk
    stores have read their stage), then the thread that initialised the ring's mbarriers
    invalidates them (:func:`blockscale.ops._grouped_sched_ir.invalidate_barriers`)."""
    if not reuse:
        return
    from blockscale.ops._grouped_sched_ir import invalidate_barriers

    bir.barrier()
    with bir.when(ring.is_prod):
        invalidate_barriers([f(bir.const(i)) for i in range(ring.stages)
                             for f in (ring.full, ring.empty)])


def store_tile_staged_sigma(kb: bir.KernelBuilder, acc: list, wc: Any, smem: Value, m0: Value,
                            n0: Value, m_count: Value, n_count: Value,
                            scale: Callable[[Value, Value, Value], Value], bm: int, bn: int,
                            writers: Value | None) -> None:
    """The staged store (:func:`blockscale.ops._staged_store_ir.store_tile_staged`: CTA
    barrier, shared stores, proxy fence, barrier, bulk copies) with the σ output placement of
    :func:`blockscale.ops._grouped_wgmma_ir._store`: tile column ``n0 + c`` (σ-permuted
    weight row: even = gate, odd = up) goes to output column ``(c % 2) N/2 + (n0 + c) // 2``.
    A thread's accumulator pair (columns 2t, 2t + 1 of an m16n8 tile) is one gate / up pair:
    the gate bf16 at byte ``2 (c // 2)`` of the staged row, the up one ``bn`` bytes further
    (two 2-byte ``st.shared``; rows at the padded pitch, conflict-free). Then thread ``r <
    rows`` copies row r's gate half to ``C[m0 + r, n0 / 2:]`` and thread ``bm + r`` its up
    half to ``C[m0 + r, N / 2 + n0 / 2:]`` (``min(bn, N - n0)`` bytes each; ``bm`` 256:
    thread r both halves). Needs N % 16 == 0 (16-byte aligned halves) and ``2 bm`` threads
    (``bm`` 256: ``bm``). Same bytes as the direct σ store."""
    from blockscale.ops import _staged_store_ir as S

    row_pitch = S.pitch("bfloat16", bn)
    bf16, pair_i8 = bir.bf16(), bir.vec(2, bir.i8())
    bir.barrier()  # every warpgroup's wgmmas retired: the ring is free

    def stage() -> None:
        for mt, row in enumerate(acc):
            for nt, vals in enumerate(row):
                for p in (0, 2):  # (gate, up) of local output column c_col(nt, p) // 2
                    r, col = wc.c_row(mt, p), wc.c_col(nt, p)
                    m, n = bir.add(m0, r), bir.add(n0, col)
                    off = bir.add(bir.mul(r, row_pitch), col)  # 2 (col // 2), col even
                    for j in range(2):
                        v = arith.truncf(bf16, scale(vals[p + j], m, bir.add(n, j)))
                        word = vector.bitcast(pair_i8, vector.from_elements(bir.vec(1, bf16),
                                                                            [v]))
                        bir.vector_store(word, smem, bir.add(off, j * bn), alignment=2)

    if writers is None:
        stage()
    else:
        with bir.when(writers):
            stage()
    W.fence_proxy_async_shared()
    bir.barrier()
    tid = bir.thread_idx("x")
    rows = bir.sub(bir.umin(bir.add(m0, bm), m_count), m0)
    nbytes = bir.sub(bir.umin(bir.add(n0, bn), n_count), n0)  # (columns / 2) * 2 bytes

    def copy(r: Value, up: Value) -> None:
        col = bir.add(bir.udiv(n0, 2), bir.select(up, bir.udiv(n_count, 2), bir.const(0)))
        dst = bir.add(cpasync.global_address(kb.arg("c")),
                      bir.as_i64(bir.mul(bir.add(bir.mul(bir.add(m0, r), n_count), col), 2)))
        src = bir.add(W.shared_address(smem),
                      bir.as_i64(bir.add(bir.mul(r, row_pitch), bir.select(up, bir.const(bn), 0))))
        cpasync.bulk_store(dst, src, bir.as_i32(nbytes))

    if bm > 128:  # the 256 x 128 tile (384 threads): thread r copies both halves of row r
        with bir.when(bir.ult(tid, rows)):
            for up in (False, True):
                copy(tid, bir.const(up, bir.i1()))
            cpasync.bulk_commit()
            cpasync.bulk_wait_read(0)
        return
    up = bir.ule(bm, tid)
    r = bir.select(up, bir.sub(tid, bm), tid)
    with bir.when(bir.logical_and(bir.ult(tid, 2 * bm), bir.ult(r, rows))):
        copy(r, up)
        cpasync.bulk_commit()
        cpasync.bulk_wait_read(0)

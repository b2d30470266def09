"""IR of the decode kernel's tensor-core variant (``variant="mma"``, FP4): swap-AB mma.sync.

Imports MLIR: only :func:`blockscale.ops.matmul_decode.build` imports this module.

The weights are the M side of ``mma.sync.m16n8k16`` (f16 inputs, f32 accumulators), the
group's rows (tokens) the N side: a warp owns 16 weight rows (output columns) and computes
them against up to 16 rows (two n-tiles; the second only when the group has > 8 rows) with
one HMMA per 16 K-elements and n-tile, instead of the SIMT variant's per-row FMAs. Cost per
weight byte no longer grows with the rows (the SIMT kernel's bound at T = 128).

Work split and streaming
------------------------
A CTA of :data:`WARPS` warps owns :data:`COLS` weight rows. K is walked in steps of
:data:`STEP_BYTES` bytes per weight row (512 FP4 elements). Each thread holds its share of the
*next* step in registers (8 x 16-byte ``ld.global.v4`` weight loads, the activation chunks
and the scale words) while the current step is computed from shared memory (register double
buffering: 16 KB of weights in flight per CTA, 4 CTAs per SM). Weight rows past N load a
clamped row (never stored), chunks past the row end a clamped chunk (their activations are
zeros, FP4 has no NaN code: exact zero products).

K order inside an MMA (the same for both operands, so every block sum is unchanged)
---------------------------------------------------------------------------------
Lane ``(g, t)`` reads the 2 bytes (4 codes c0..c3) it owns of an MMA unit (NVFP4: bytes
2t, 2t+1 of the 8-byte block; MXFP4: bytes 4t + 2h, +1 of the 16-byte block for MMA h) and
spreads them (``prmt``: byte 1 to byte 2) so that codes c0 / c2 and c1 / c3 sit 16 bits
apart; ``(y << 9) & 0x0E000E00 | (y << 12) & 0x80008000`` then gives the f16 pair (c0, c2)
and ``(y << 5) & .. | (y << 8) & ..`` the pair (c1, c3), each value ``dec(w) * 2^-14``
(exact, the 0.5 code an f16 subnormal). The pairs are A registers ``a[0]``/``a[2]`` (row g)
and ``a[1]``/``a[3]`` (row g + 8); the activations are staged per step into shared memory
in the B fragment order with the same pairing.

Numerics (bit-identical to the portable kernel)
-----------------------------------------------
* NVFP4: activations are staged as ``f16(dec(a) * 2^-14) * f16(|sA|)`` (one ``mul.f16x2``;
  exact: multiples of 2^-24 below 0.17 with <= 6 significant bits). One MMA per block from a
  zero accumulator gives ``D = 2^-28 * sA * sum(dec(a) dec(w))`` exactly (<= 16 significant
  bits; the tensor core sums products of one quantum exactly, see
  :mod:`blockscale.ops._mma_ir`); ``acc' = fma(D, |sB|, acc')``: ``2^-28`` times the exact
  block term ``t * (sA * sB)`` added with one rounding; ``acc'`` is ``2^-28`` times the
  portable kernel's accumulator exactly (block terms are multiples of 2^-20 below 2^47:
  ``acc'`` never leaves the normal range), and ``acc' * 2^28`` is its result.
* MXFP4: activations ``dec(a) * 2^-14``; two chained MMAs per 32-element block (exact, <=
  2^13 quanta); ``acc = fma(D * 2^30, (sA * sB) * 0.25, acc)`` (``D * 2^30`` = the exact
  block sum in quarters, the scale product formed as the portable kernel forms it).

Each output accumulates its blocks in K order with one rounding each: the portable kernel's
order, hence its result bit for bit (then alpha / expert scale / row scale and the cast).

Performance model (sm_90a SASS, NVFP4, per warp and 4 KB step of its 16 weight rows)
-----------------------------------------------------------------------------------
~800 instructions of MMAs with one n-tile (<= 8 rows; ~1000 with two), of which the E2M1 ->
f16 decode is ~1.9 per weight element (2 shifts + 2 ``lop3`` per f16 pair), plus ~300 of
staging (weight chunks, 16 scale decodes per thread, the pass's activations) and loads:
~0.27 instructions per weight byte, so ~2.1-2.6 TB/s at an SM issue rate of 2.5-3 per
clock (132 SMs, 1.755 GHz), independent of the rows up to 8 (the SIMT variant's cost grows
with the rows). In flight: 16 KB per CTA (``depth=1``, 4 CTAs/SM: 64 KB per SM) or 32 KB
(``depth=2``, 3 CTAs/SM: 96 KB), for grids too small to fill the SMs (dense N <= 8192).

Measured in the sm_90a SASS of the grouped NVFP4 kernel (per warp and step, rows <= 8):
staging 167 + fetch 88 + compute 721 (decode 480, fold 128 FFMA, 32 HMMA, 62 LDS) = 976
instructions (0.24 per weight byte; + ~110 per warp that stages activation rows). The prmt
decode (``decode="prmt"``, variant "mma_p": :func:`fp4_word_to_f16_pairs`, 11 ops per 8
codes; :func:`decode_e4m3_word` for the weight scales) gives 99 + 88 + 604 (decode 352) =
791 (0.19 per byte; activation rows ~84), the same f16 values. FP8 ``mma.sync.m16n8k32``
(E2M1 -> E4M3 in 7 ops per 8 codes) is no way out on sm_90a: ptxas emulates it (F2FP
unpacks + two HMMA.16816 per MMA; a 3248-instruction step loop against 2169).

Shared-memory staging ("mma_c*" variants, :class:`_Staging`)
------------------------------------------------------------
Nsight Compute on the H200 (gpt-oss gate_up NVFP4, T = 128, "mma_p", 0.637 ms against
~0.26 ms at copy speed): L1/TEX 92 % busy (the top unit), issue slots 45 %, 128 registers
with 5.2 M local spill requests. 65 M of the 97 M shared wavefronts were stores, 74 % of
them bank conflicts: the weight scales (a warp's 8 words of a row 256 words apart: 8-way)
and the B fragments (a quarter warp's chunks 256 words apart: 8-way). Per warp and step
that was ~240 store + ~120 load wavefronts against ~50 + ~110 conflict-free. "cf" pads and
reorders both (and loads the weight scales as 8-byte words: two rows, half the loads);
"cf8" runs passes of 8 rows (one n-tile): the step loop is 848 SASS instructions (0.21 per
weight byte; 433 ALU) against the 1812 of "mma_p" (both n-tile paths), and no spill in it
at 128 registers (4 bytes outside; "mma_p": 216 bytes, 9 reloads a step). With <= 4 rows,
half the lanes skip their B fragment loads. Per warp and step ~80 load + ~56 store
wavefronts; the ALU pipe (half rate: ~860 cycles a step) and L1 are now about balanced.

Per-tile overhead ("mma_c8t", "mma_c8s2" / "mma_c8s4", "mma_c8d2")
------------------------------------------------------------------
Run P: DeepSeek-V3 (K = 7168: 14 steps a tile) reaches 79 % of copy at T = 16 with the same
step loop as gpt-oss (K = 2880: 5.625 steps, 66 %). Fitting ``eff = b * S / (S + O)`` to
both gives a per-tile overhead O of ~1.4 steps (the first step's load latency with nothing
to overlap, the stores, the CTA start) and b ~0.87; gpt-oss also computes 6 full steps
for 5.625 (the last step's chunks past the row end are clamped re-reads with zero
activations) and its loop's last prefetch re-reads the last step. ``tail`` ("mma_c8t")
peels the last step: the loop prefetches only real steps, the peeled step skips its unit
pairs past the row end (uniform branches), and the loop's steps (never the last one) stage
their weight scale words without the K-padding mask; MXFP4 stages raw chunks (no byte
interleave: its block is the whole chunk). sm_90a SASS of the step loop, grouped, per warp
and 4 KB step: NVFP4 848 -> 809 (ALU 433 -> 403, FMA pipe 260 -> 251), MXFP4 982 -> 921
(ALU 445 -> 391); 127 registers, no spill. ``slices`` ("mma_c8s2" / "mma_c8s4") runs 2 / 4
column slices per CTA in turn, fetching the next slice's first step during the current
slice's peeled step: one exposed load prologue per 2 / 4 slices (loop 811 / 812 SASS;
ptxas spills ~120-180 bytes around the slice loop, none in the step loop); fewer CTAs, so
only for grids of several waves (matmul_decode.slices_variant). "mma_c8d2" is "mma_c8" at
``depth=2`` (168 registers, 3 CTAs per SM: 32 KB in flight a CTA, for grids under one wave
such as gpt-oss T = 1; with ``tail``; register copies rotate the two steps).

Persistent CTAs ("mma_c8w", "mma_c8r" / "mma_c8r4"; ``units``, ``ring``)
------------------------------------------------------------------------
At ~4.25 TB/s and ~1 us of loaded DRAM latency an SM needs ~32 KB in flight. "mma_c8t" has
16 KB per CTA in flight but only once its loop runs: each CTA's first step is exposed, and
the grid ends in a partial wave (T = 16: 5760 tiles = 10.9 waves of 528). "mma_c8w" runs one
wave of CTAs walking work units (:mod:`blockscale.ops._decode_stream_ir`: group, 64-column
tile, 8-row pass) with the "mma_c8t" step loop; the peeled last step of a unit fetches the
CTA's next unit's first step, so a CTA's loads never stop between units; the next unit's
info words are loaded a step or more ahead by threads 0..4 and published in shared memory
(no dependent global-load chain before that prefetch). sm_90a step loop 809 -> 872 SASS
NVFP4, 921 -> 972 MXFP4 (static: ~40 of it the step-0 info loads, once a unit); 128
registers, no spill. Units walk host row blocks (only 8-row blocks with rows): with the
pass as the fastest unit index, 528 CTAs and two passes gave CTA c only passes c % 2 (run
T: T = 128 twice as slow). "mma_c8r" /
"mma_c8r4" move the weights out of registers into a 3 / 4-stage shared ring filled by TMA
(128-byte boxes x 64 rows, 128B swizzle: conflict-free fragment reads; one thread issues a
step's two boxes 2 / 3 steps ahead, across units): 32 / 48 KB per CTA in flight at 3 / 2 CTAs
per SM (96 KB per SM; T = 1, 360 units: ~87 KB per SM against ~44 KB). Their step loop is
1178 SASS static NVFP4 (1239 MXFP4), of it ~150 thread 0's TMA issue, ~80 the cursor's
once-a-unit lookup and ~40 the step-0 info loads: ~900 a step for the other warps (NVFP4: 2
LDS + 1 PRMT per row and unit pair rebuild :func:`_pair_pieces`'s word from the raw row; no
weight staging); 128 registers, no spill; every static buffer ``.align 16``. Every output is still one unit's "mma_c8t" sum: bit for bit the portable kernel's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from mlir import ir
from mlir.dialects import arith, memref, nvvm, vector
from mlir.dialects import math as mmath

import blockscale.ops._decode_solo_ir as solo_ir
import blockscale.ops._matmul_ir as mir
from blockscale.compiler import ir as bir
from blockscale.compiler.arch import mma
from blockscale.compiler.arch.nvvm import byte_perm
from blockscale.formats import Format
from blockscale.layouts import SF_ATOM_BYTES, SF_ATOM_ROWS
from blockscale.ops._decode_ir import _decode_scale_fast, _dequant_pairs_f16
from blockscale.ops._mma_ir import workgroup_buffer

Value = ir.Value

WARPS = 4
THREADS = 32 * WARPS
#: weight rows (output columns) per CTA: 16 per warp (the MMA's M)
COLS = 16 * WARPS
#: group rows per pass over the weights (two n-tiles of 8)
TOKENS = 16
#: bytes of each weight row per K step (512 FP4 elements)
STEP_BYTES = 256
STEP_CHUNKS = STEP_BYTES // 16
#: MMAs (16 K-elements each) per step
UNITS = STEP_BYTES * 2 // 16
#: padded shared row of staged weights (16 bytes of padding: conflict-free fragment reads)
W_STRIDE = STEP_BYTES + 16
#: ring variants: bytes of a TMA stage row half (the 128B swizzle span) and of a stage
RING_ROW = 128
RING_STAGE = COLS * STEP_BYTES
#: the ring variants' TMA map over the weights (``w`` as [E * N rows, K / 2 bytes]): boxes
#: of 128 bytes x 64 rows, 128-byte swizzle (conflict-free fragment reads)
RING_BOX = (RING_ROW, COLS)
#: 2^28: undoes the 2^-14 of both f16 operands
UNSCALE = 2.0 ** 28


_i32c = bir.i32_bits  # an i32 constant from a 32-bit pattern


def _f16x2(r: Value) -> Value:
    return vector.bitcast(bir.vec(2, bir.f16()),
                          vector.from_elements(bir.vec(1, bir.i32()), [r]))


def fp4_piece_to_f16(x: Value) -> tuple[Value, Value]:
    """Four E2M1 codes (the low 16 bits of an i32, code i in nibble i) -> the f16 pairs
    (c0, c2) and (c1, c3) as i32, values ``dec * 2^-14`` (exact): one ``prmt`` and 3 ALU ops
    per pair."""
    y = byte_perm(x, _i32c(0), 0x4140)  # bytes (b0, 0, b1, 0): c0/c2 and c1/c3 16 bits apart
    p0 = bir.bit_or(bir.bit_and(bir.shl(y, _i32c(9)), _i32c(0x0E000E00)),
                    bir.bit_and(bir.shl(y, _i32c(12)), _i32c(0x80008000)))
    p1 = bir.bit_or(bir.bit_and(bir.shl(y, _i32c(5)), _i32c(0x0E000E00)),
                    bir.bit_and(bir.shl(y, _i32c(8)), _i32c(0x80008000)))
    return p0, p1


def fp4_word_to_f16_pairs(x: Value) -> list[Value]:
    """Eight E2M1 codes (nibbles of an i32) -> the same four ``vector<2xf16>`` pairs as
    :func:`blockscale.ops._decode_ir._dequant_pairs_f16` (pair j = codes j, j + 4, value
    ``dec * 2^-14``): the codes as E5M2 bytes in bulk (an f16 is its E5M2 byte << 8; low
    nibbles ``(x << 1) & 0x0E.. | (x << 4) & 0x80..``, high ``(x >> 3) & 0x0E.. | x & 0x80..``:
    7 ALU ops), then one ``prmt`` per pair moving two bytes into the high halves (11 ops
    for 8 codes against ~15)."""
    m, s = _i32c(0x0E0E0E0E), _i32c(0x80808080)
    lo = bir.bit_or(bir.bit_and(bir.shl(x, _i32c(1)), m), bir.bit_and(bir.shl(x, _i32c(4)), s))
    hi = bir.bit_or(bir.bit_and(bir.shru(x, _i32c(3)), m), bir.bit_and(x, s))
    zero = _i32c(0)
    # bytes (lo|hi).b(0|1) and .b(2|3) of codes j, j + 4 into bytes 1 and 3 (zeros below)
    return [_f16x2(byte_perm(src, zero, sel))
            for src, sel in ((lo, 0x2404), (hi, 0x2404), (lo, 0x3414), (hi, 0x3414))]


def decode_e4m3_word(word: Value) -> list[Value]:
    """Four E4M3 scale bytes -> their magnitudes as f32 (NaN for 0x7F, like
    :func:`blockscale.ops._decode_ir._decode_scale_fast`): ``& 0x7F7F7F7F``, two
    ``cvt.rn.f16x2.e4m3x2`` (exact) and four f16 -> f32 conversions (~7 ops for 4 scales
    against ~16)."""
    m = bir.bit_and(word, _i32c(0x7F7F7F7F))
    out = []
    for half in range(2):
        h = arith.trunci(bir.i16(), bir.shru(m, _i32c(16 * half)) if half else m)
        pair = mma.cvt_e4m3x2_to_f16x2(h)
        out += [arith.extf(bir.f32(), vector.extract(pair, [], [i])) for i in range(2)]
    return out


def _pair_pieces(nv: bool, chunk: Value) -> Value:
    """A 16-byte weight chunk (``vector<16xi8>``) reordered so that word t holds lane t's
    two pieces of the chunk's two MMA units u, v byte-interleaved, ``(u.b0, v.b0, u.b1,
    v.b1)``: nibbles j and j + 4 are then codes of one unit (:func:`_dequant_pairs_f16`
    pairs). NVFP4: u, v are the blocks of bytes 0-7 / 8-15, lane t's bytes 2t, 2t+1 of
    each; MXFP4: the one block's MMAs h = 0, 1, lane t's bytes 4t .. 4t+3."""
    w = vector.bitcast(bir.vec(4, bir.i32()), chunk)
    ws = [bir.extract(w, i) for i in range(4)]
    if nv:
        out = [byte_perm(ws[0], ws[2], 0x5140), byte_perm(ws[0], ws[2], 0x7362),
               byte_perm(ws[1], ws[3], 0x5140), byte_perm(ws[1], ws[3], 0x7362)]
    else:
        out = [byte_perm(x, _i32c(0), 0x3120) for x in ws]
    return vector.bitcast(bir.vec(16, bir.i8()), bir.from_elements(bir.vec(4, bir.i32()), out))


class _Fmt:
    """Per-format constants: blocks per step, the piece (2 bytes) of MMA unit u of lane t."""

    def __init__(self, fmt: Format):
        if not fmt.is_fp4:
            raise ValueError(f"the mma decode variant is for FP4 formats, got {fmt.name}")
        self.fmt = fmt
        self.nv = not fmt.is_mx
        self.blocks = STEP_BYTES * 2 // fmt.block_size  # NVFP4 32, MXFP4 16
        self.words = self.blocks // 4  # 5-D scale words per row and step

    def unit_block(self, u: int) -> int:
        return u if self.nv else u // 2

    def piece_byte(self, u: int, t: Value) -> Value:
        """Byte offset in the step row of lane t's 2 bytes of MMA unit u."""
        if self.nv:
            return bir.add(bir.mul(t, 2), 8 * u)
        return bir.add(bir.mul(t, 4), 16 * (u // 2) + 2 * (u % 2))

    def chunk_piece(self, p: int) -> tuple[int, int]:
        """(unit - 2c, t) of the 2-byte piece p (bytes 2p, 2p+1) of 16-byte chunk c of a step
        row (the chunk holds units 2c, 2c + 1)."""
        if self.nv:
            return p // 4, p % 4
        return p % 2, p // 2


class _Staging:
    """Shared-memory layouts and the weight scale loads of a staging scheme.

    "v1": B fragments ``[unit pair][row][t][4 words]`` (256 words a pair), MX activation
    scales ``[block][16 rows]``, NVFP4 weight scales ``[block pair][warp][g][block][h]``;
    each thread loads 4-byte scale words (one row, 4 blocks: rows 4 apart in a warp). Its
    scale stores are 8-way bank conflicts (a warp's 8 words of a row 256 words apart), and
    so are the B fragment stores (a quarter warp's chunks 256 words apart): in Nsight
    Compute, 74 % of the shared store wavefronts of the grouped NVFP4 kernel at T = 128.

    "cf" (variant "mma_c"): unit pairs 260 words apart and MX scale blocks 18 apart (a
    quarter warp's B fragment stores, a warp's scale stores on distinct banks); NVFP4 weight
    scales ``[block pair][warp][g][h][block]``, stored as ``vector<2xf32>`` (blocks 2p, 2p+1
    of one row) by lanes of consecutive rows; each thread loads 8-byte scale words (rows
    ``n0 + i`` and ``n0 + 32 + i``, 4 blocks each: adjacent in the 5-D layout since the
    CTA's 64 rows are half an atom), a warp one atom column of 32 such pairs. Rows past N
    read the 5-D padding rows (the atom holds 128 rows): never stored.

    "cf8" (variants "mma_c8*"): "cf" with passes of 8 group rows (one n-tile; a group of
    9-16 rows streams the weights twice): no second n-tile's code, accumulators or B
    fragments (132 words a unit pair, MX scales 10 a block), fewer registers and 8 KB less
    shared memory (34 KB: 6 CTAs per SM under 80 registers)."""

    def __init__(self, lay: _Fmt, staging: str):
        self.cf = staging != "v1"
        #: group rows per pass: one n-tile ("cf8") or two
        self.tokens = 8 if staging == "cf8" else TOKENS
        cf = self.cf
        self.b_stride = self.tokens * 16 + (4 if cf else 0)  # words per unit pair
        self.b_words = UNITS // 2 * self.b_stride
        self.sa_stride = self.tokens + (2 if cf else 0)  # MX activation scales per block
        #: scale words (4 blocks) per load and loads per thread and step
        self.s_rows = 2 if cf else 1
        self.s_iters = (32 if cf else COLS) * lay.words // THREADS

    def bofs(self, c: Any, n: Any, tt: Any) -> Value:
        """Word offset of lane ``tt``'s B fragments of unit pair c, row n."""
        base = c * self.b_stride if isinstance(c, int) else bir.mul(c, self.b_stride)
        return bir.add(base, bir.mul(bir.add(bir.mul(n, 4), tt), 4))

    def nv_scale_slot(self, r: Value) -> Value:
        """NVFP4: word offset of CTA row r's scales in a block pair (blocks 2p, 2p + 1)."""
        wp, rr = bir.udiv(r, 16), bir.urem(r, 16)
        gg, hh = bir.urem(rr, 8), bir.udiv(rr, 8)
        if self.cf:  # [warp][g][h][block]
            return bir.add(bir.mul(wp, 32), bir.add(bir.mul(gg, 4), bir.mul(hh, 2)))
        return bir.add(bir.mul(wp, 32), bir.add(bir.mul(gg, 4), hh))  # [warp][g][block][h]

    def nv_block_scales(self, sbq: list[Value], s_: int) -> list[Value]:
        """The weight scales (rows g, g + 8) of block 2q + s_ out of the 4 read at pair q."""
        return [sbq[s_], sbq[2 + s_]] if self.cf else sbq[2 * s_:2 * s_ + 2]


def emit_decode_mma(kb: Any, fmt: Format, *, start: Value, end: Value, expert: Value,
                    n_count: Value, k: Value, a_srow: Callable[[Value], Value],
                    store: Callable[[Value, Value, Value], None], depth: int = 1,
                    step_range: tuple[Value, Value] | None = None,
                    decode: str = "lop3", staging: str = "v1", tail: bool = False,
                    slices: int = 1, units: Any = None, ring: int = 0,
                    solo: bool = False) -> None:
    """The body for one (group, column slice) (the interface of
    :func:`blockscale.ops._decode_ir.emit_decode`; CTA of :data:`THREADS` threads, columns
    ``[COLS * block_idx.x, +COLS)``); ``depth``: steps whose loads are in flight while one
    is computed (1: 16 KB per CTA, 2: 32 KB, ~45 more registers); ``step_range``: the K
    steps ``[lo, hi)`` to sum (split K; default all, from a zero accumulator either way);
    ``decode``: "lop3" (shift/mask per f16 pair, :func:`_dequant_pairs_f16`, per-byte scale
    decodes) or "prmt" (:func:`fp4_word_to_f16_pairs`, :func:`decode_e4m3_word`; the same
    values, fewer instructions: variant "mma_p"); ``staging``: "v1" or "cf" (variant "mma_c":
    shared stores free of bank conflicts and 8-byte weight scale loads, see
    :class:`_Staging`; the same values); ``tail`` (variants "mma_c8t*"): the last K step
    peeled off the step loop: the loop's last prefetch (past the end: clamped re-reads) is
    gone and the peeled step skips its unit pairs past the row end (K = 2880: 10 of 16;
    the same values: those terms are fma(0, 0, acc) = acc);
    with ``depth=2`` ("mma_c8d2") the loop's last prefetch re-reads the last step;
    ``slices`` (variants "mma_c8s*", with ``tail``, depth 1 and "cf8"): the CTA computes ``slices``
    column slices of :data:`COLS` rows in turn (columns ``[COLS * slices * block_idx.x,
    +COLS * slices)``), the next slice's first step fetched during the current slice's peeled
    last step: one prologue (first load latency) per ``slices`` slices; ``units``
    (variant "mma_c8w", with ``tail``, depth 1, "cf8", one slice): a persistent CTA walking
    work units ``block_idx.x, + grid_dim.x, ..`` (a
    :class:`blockscale.ops._decode_stream_ir.Units`: expert, 64-column tile and 8-row pass
    of each), the next unit's first step fetched during the current unit's peeled last
    step (``expert``, ``start``, ``end``, ``a_srow`` and ``store`` are then unused: the
    units give them); ``ring`` (variant "mma_c8r", with ``units``): the weights stream
    through a shared ring of ``ring`` stages by ``cp.async.bulk`` (one 256-byte copy per
    row and step, ``ring - 1`` steps ahead across units; :func:`_walk_ring`), the scale
    words and activations through registers one step ahead; ``solo`` (variant "mma_c8t1",
    with ``tail``, depth 1, "cf8", one slice): a pass a row, on
    :mod:`blockscale.ops._decode_solo_ir`'s block-diagonal step (NVFP4: 16 FFMA folds a
    step instead of 128; within the fp32 bound, not the portable kernel's bits; a kernel of
    both pass kinds spilled ~110-140 bytes around them, so the dispatch picks it per grid)."""
    if tail and step_range is not None:
        raise ValueError("tail needs no step_range")
    if slices < 1 or (slices > 1 and not (tail and depth == 1 and staging == "cf8")):
        raise ValueError(f"slices > 1 needs tail, depth 1 and staging 'cf8', got "
                         f"slices={slices}")
    if units is not None and not (tail and depth == 1 and staging == "cf8" and slices == 1
                                  and step_range is None):
        raise ValueError("units need tail, depth 1, staging 'cf8', one slice and no "
                         "step_range")
    if ring and (units is None or ring < 2):
        raise ValueError(f"ring needs units and >= 2 stages, got ring={ring}")
    if solo and not (tail and depth == 1 and staging == "cf8" and slices == 1
                     and units is None):
        raise ValueError("solo needs tail, depth 1, staging 'cf8', one slice and no units")
    if depth not in (1, 2):
        raise ValueError(f"depth must be 1 or 2, got {depth}")
    if decode not in ("lop3", "prmt"):
        raise ValueError(f"decode must be 'lop3' or 'prmt', got {decode!r}")
    if staging not in ("v1", "cf", "cf8"):
        raise ValueError(f"staging must be 'v1', 'cf' or 'cf8', got {staging!r}")
    fast = decode == "prmt"
    lay = _Fmt(fmt)
    mx_raw = tail and not lay.nv
    st = _Staging(lay, staging)
    tokens = st.tokens
    f32, i32 = bir.f32(), bir.i32()
    v16 = bir.vec(16, bir.i8())
    # (ring: the TMA stages in dynamic shared memory, below; compute() reads ``wsm`` then)
    sol = solo_ir.Layout(not lay.nv) if solo else None
    wsm = None if ring else workgroup_buffer(
        kb, COLS * (sol.w_stride if sol else W_STRIDE), bir.i8())
    # B fragments: [unit][token][t][2] i32 (f16 pairs); solo: solo_ir's slots instead
    bsm = None if solo else workgroup_buffer(kb, st.b_words, i32)
    # weight scales [block][warp][g][2] (rows 16 warp + g + 8h), f32
    # (NVFP4 "cf8": block pairs 128 words apart, MXFP4 blocks 64; solo: 136 / 66, so that
    # the four lanes t of a row reading blocks of their own hit distinct banks)
    sb_pair = solo_ir.SCALE_PAIR_WORDS if solo else 2 * COLS
    sb_block = solo_ir.SCALE_BLOCK_WORDS if solo else COLS
    sbsm = workgroup_buffer(kb, lay.blocks // 2 * sb_pair if lay.nv else lay.blocks * sb_block,
                            f32)
    sasm = None if lay.nv else workgroup_buffer(kb, lay.blocks * st.sa_stride, f32)
    # solo: the block-diagonal B slots (their zeros written once)
    bsolo = workgroup_buffer(kb, sol.b_words, i32) if sol else None
    a, w, sfa, sfb = (kb.arg(x) for x in ("a", "w" if "w" in kb.values else "b", "sfa", "sfb"))

    tid = bir.thread_idx("x")
    lane, warp = bir.urem(tid, 32), bir.udiv(tid, 32)
    g, t = bir.udiv(lane, 4), bir.urem(lane, 4)
    row_bytes = bir.udiv(k, 2)
    kblocks = bir.ceil_div(k, fmt.block_size)
    d1 = bir.ceil_div(kblocks, 4)
    steps = bir.ceil_div(row_bytes, STEP_BYTES)
    n_last = bir.sub(n_count, 1)
    last_chunk = bir.sub(bir.udiv(row_bytes, 16), 1)
    zero = bir.const(0.0, f32)

    # this thread's weight chunks (8) and scale words: fixed rows, per-step columns
    w_iters = COLS * STEP_CHUNKS // THREADS
    wr = 0 if ring else w_iters  # weight chunks fetched through registers
    w_stride = bir.mul(row_bytes, THREADS // STEP_CHUNKS)
    w_cs = [bir.urem(tid, STEP_CHUNKS)] * w_iters
    s_iters = st.s_iters
    s_rs, s_qs = [], []
    for it in range(s_iters):
        sid = bir.add(tid, it * THREADS)
        # cf: rows n0 + i, n0 + 32 + i of word q (a warp: one q, i = lane)
        s_rs.append(bir.urem(sid, 32) if st.cf else bir.udiv(sid, lay.words))
        s_qs.append(bir.udiv(sid, 32) if st.cf else bir.urem(sid, lay.words))

    def geometry(e: Value, n0: Value) -> _Geo:
        """This thread's load bases for the weight rows ``[n0, n0 + COLS)`` of expert e."""
        b_srow0 = bir.mul(bir.mul(e, bir.ceil_div(n_count, SF_ATOM_ROWS)), SF_ATOM_ROWS)
        # rows tid // 16 + 8 it: row offsets from one base (clamped to the last row: a
        # clamped row is never stored), fewer live registers than one 64-bit address a load
        w_base = bir.mul(bir.add(bir.mul(e, n_count),
                                 bir.add(n0, bir.udiv(tid, STEP_CHUNKS))), row_bytes)
        w_last = bir.mul(bir.add(bir.mul(e, n_count), n_last), row_bytes)
        s_offs = []
        for r in s_rs:
            n_c = bir.add(n0, r) if st.cf else bir.umin(bir.add(n0, r), n_last)
            s_offs.append(mir.tcgen_row_offset(bir.add(b_srow0, n_c), d1))
        return _Geo(n0, b_srow0, w_base, w_last, s_offs)

    geo0 = None if units is not None else geometry(bir.as_index(expert),
                                                   bir.mul(bir.block_idx("x"), COLS * slices))
    a_iters = tokens * STEP_CHUNKS // THREADS

    def fetch(step: Value, r0: Value, rows: Value, j: Value | None = None,
              geo: _Geo | None = None,
              a_srow: Callable[[Value], Value] = a_srow) -> list[Value]:
        """Step ``step``'s weight chunks, weight scale words, activation chunks and
        activation scale bytes of this thread (registers); ``j``: of column slice j of the
        CTA (``slices``); ``geo`` / ``a_srow``: of a work unit (``units``)."""
        out = []
        geo = geo or geo0
        n0, b_srow0, w_base, w_last = geo.n0, geo.b_srow0, geo.w_base, geo.w_last
        wb = w_base if j is None else bir.add(w_base, bir.mul(j, bir.mul(row_bytes, COLS)))
        for it in range(wr):
            c = bir.umin(bir.add(bir.mul(step, STEP_CHUNKS), w_cs[it]), last_chunk)
            row = bir.umin(bir.add(wb, bir.mul(w_stride, it)), w_last)
            out.append(bir.vector_load(v16, w, bir.add(row, bir.mul(c, 16)), alignment=16))
        for it in range(s_iters):
            q = bir.add(bir.mul(step, lay.words), s_qs[it])
            nw = st.s_rows
            s_off = geo.s_offs[it] if j is None else mir.tcgen_row_offset(
                bir.add(b_srow0, bir.add(bir.add(n0, bir.mul(j, COLS)), s_rs[it])), d1)
            br = bir.if_(bir.ult(q, d1), [i32] * nw)
            with br.then():
                off = bir.add(s_off, bir.mul(q, SF_ATOM_BYTES))
                v = bir.vector_load(bir.vec(4 * nw, bir.i8()), sfb, off, alignment=4 * nw)
                v = vector.bitcast(bir.vec(nw, i32), v)
                br.yield_(*[vector.extract(v, [], [i]) for i in range(nw)])
            with br.else_():
                br.yield_(*[_i32c(0)] * nw)
            out += list(br.results)
        for it in range(a_iters):
            cid = bir.add(tid, it * THREADS)
            n, c = bir.udiv(cid, STEP_CHUNKS), bir.urem(cid, STEP_CHUNKS)
            col = bir.add(bir.mul(step, STEP_BYTES), bir.mul(c, 16))
            ok = bir.logical_and(bir.ult(n, rows), bir.ult(col, row_bytes))
            br = bir.if_(ok, [v16, i32])
            with br.then():
                m = bir.add(r0, n)
                v = bir.vector_load(v16, a, bir.add(bir.mul(m, row_bytes), col), alignment=16)
                # the chunk's scale bytes: NVFP4 blocks 2c', 2c'+1 (adjacent), MXFP4 block c'
                jb = bir.udiv(col, 8 if lay.nv else 16)
                off = bir.add(mir.tcgen_row_offset(a_srow(m), d1), mir.tcgen_kblock_offset(jb))
                if lay.nv:
                    pr = bir.vector_load(bir.vec(2, bir.i8()), sfa, off, alignment=2)
                    s = arith.extui(i32, vector.extract(vector.bitcast(bir.vec(1, bir.i16()),
                                                                       pr), [], [0]))
                else:
                    s = mir.load_byte_i32(sfa, off)
                br.yield_(v, s)
            with br.else_():
                br.yield_(bir.const(0, v16), _i32c(0))
            out += list(br.results)
        return out

    def _sa_splats(sbytes: Value) -> list[Value]:
        """NVFP4: |sA| of an activation chunk's two blocks as f16 splats (exact)."""
        return [vector.broadcast(bir.vec(2, bir.f16()), arith.truncf(
            bir.f16(), _decode_scale_fast(fmt, bir.bit_and(bir.shru(sbytes, _i32c(8 * s_)),
                                                           0xFF)))) for s_ in range(2)]

    def _stage_act(n: Value, c: Value, chunk: Value, sbytes: Value) -> None:
        """Activation chunk c of row n as B fragments (f16 pairs; NVFP4 times |sA|)."""
        words = vector.bitcast(bir.vec(4, i32), chunk)
        if lay.nv:  # |sA| of the chunk's two blocks as f16 splats (exact)
            sp = _sa_splats(sbytes)
        else:  # E8M0 activation scale of the chunk's block, for the fold
            bir.store(mir.decode_scale(fmt, sbytes), sasm,  # chunk c = block c of the step
                      bir.add(bir.mul(c, st.sa_stride), n))
        if fast:  # whole words: units u, v of lane tt's pieces, one 16-byte store each
            pw = vector.bitcast(bir.vec(4, i32), pair_pieces(chunk))
            for tt in range(4):
                prs = fp4_word_to_f16_pairs(bir.extract(pw, tt))
                if lay.nv:  # unit u = the chunk's block 0, v = block 1
                    prs = [arith.mulf(x, sp[i // 2]) for i, x in enumerate(prs)]
                dst = st.bofs(c, n, tt) if st.cf else \
                    bir.mul(bir.add(bir.mul(bir.add(bir.mul(c, TOKENS), n), 4), tt), 4)
                bir.vector_store(bir.from_elements(bir.vec(4, i32),
                                                   [mma.pack_i32(x) for x in prs]),
                                 bsm, dst, alignment=16)
            return
        for p in range(8):
            x = bir.extract(words, p // 2)
            if p % 2:
                x = bir.shru(x, _i32c(16))
            p0, p1 = fp4_piece_to_f16(x)
            if lay.nv:
                s = sp[p // 4]
                p0 = mma.pack_i32(arith.mulf(_f16x2(p0), s))
                p1 = mma.pack_i32(arith.mulf(_f16x2(p1), s))
            s_, tt = lay.chunk_piece(p)
            # [unit pair c][row n][t][unit 2c + s_][2 words]: one LDS.128 per pair
            dst = bir.add(st.bofs(c, n, tt) if st.cf else
                          bir.mul(bir.add(bir.mul(bir.add(bir.mul(c, TOKENS), n), 4), tt), 4),
                          2 * s_)
            bir.vector_store(bir.from_elements(bir.vec(2, i32), [p0, p1]), bsm, dst,
                             alignment=8)

    def pair_pieces(chunk: Value) -> Value:
        """Weight and activation chunks alike (one K order for both operands). MXFP4 with
        ``tail``: the raw chunk (a block is the whole chunk: any split of its 32 codes over
        the two chained MMAs gives the same exact block sum; one PRMT a word less)."""
        return chunk if mx_raw else _pair_pieces(lay.nv, chunk)

    def word_mask(q: Value) -> Value:
        """Scale word q's mask: bytes of blocks >= kblocks (5-D padding, any value) read
        as 0."""
        n_live = bir.sub(kblocks, bir.umin(bir.mul(q, 4), kblocks))
        sh = bir.mul(bir.as_i32(bir.umin(n_live, 4)), _i32c(8))
        return bir.select(bir.ult(n_live, 4), bir.sub(bir.shl(_i32c(1), sh), _i32c(1)),
                          _i32c(-1))

    def stage(step: Value, regs: list[Value], rows: Value, full: bool = False) -> None:
        """Store fetched registers to shared memory (weights raw, scales decoded,
        activations as B fragments); ``full``: a step before the last one (every block of
        it < kblocks: no scale byte to mask). ``solo``: the weights raw in rows of
        solo_ir.Layout.w_stride, the activations into the block-diagonal B slots."""
        for it in range(wr):
            cid = bir.add(tid, it * THREADS)
            r = bir.udiv(cid, STEP_CHUNKS)
            stride = sol.w_stride if sol else W_STRIDE
            bir.vector_store(regs[it] if solo else pair_pieces(regs[it]), wsm,
                             bir.add(bir.mul(r, stride), bir.mul(w_cs[it], 16)),
                             alignment=16)
        for it in range(s_iters if st.cf else 0):
            q = bir.add(bir.mul(step, lay.words), s_qs[it])
            mask = None if full else word_mask(q)
            for hw in range(2):  # rows i, i + 32
                word = regs[wr + 2 * it + hw]
                if mask is not None:
                    word = bir.bit_and(word, mask)
                r = bir.add(s_rs[it], 32 * hw)
                svs = decode_e4m3_word(word) if fast and lay.nv else [
                    _decode_scale_fast(fmt, bir.bit_and(bir.shru(word, _i32c(8 * i)), 0xFF))
                    for i in range(4)]
                if lay.nv:  # blocks 4q' + 2j, + 1 of the row: [pair 2q' + j][slot][2]
                    slot = st.nv_scale_slot(r)
                    for j in range(2):
                        dst = bir.add(bir.mul(bir.add(bir.mul(s_qs[it], 2), j), sb_pair), slot)
                        bir.vector_store(bir.from_elements(bir.vec(2, f32), svs[2 * j:2 * j + 2]),
                                         sbsm, dst, alignment=8)
                else:
                    wp, rr = bir.udiv(r, 16), bir.urem(r, 16)
                    slot = bir.add(bir.mul(wp, 16), bir.add(bir.mul(bir.urem(rr, 8), 2),
                                                            bir.udiv(rr, 8)))
                    for i in range(4):
                        jl = bir.add(bir.mul(s_qs[it], 4), i)  # block within the step
                        bir.store(svs[i], sbsm, bir.add(bir.mul(jl, sb_block), slot))
        for it in range(0 if st.cf else s_iters):
            word = regs[wr + it]
            r = s_rs[it]
            wp, rr = bir.udiv(r, 16), bir.urem(r, 16)
            gg, hh = bir.urem(rr, 8), bir.udiv(rr, 8)
            slot = bir.add(bir.mul(wp, 16), bir.add(bir.mul(gg, 2), hh))  # MXFP4
            # NVFP4: [block pair][warp][g][block 2q + s][h]: one LDS.128 per pair
            slot_nv = bir.add(bir.mul(wp, 32), bir.add(bir.mul(gg, 4), hh))
            q = bir.add(bir.mul(step, lay.words), s_qs[it])
            # bytes of blocks >= kblocks (5-D padding, any value) read as 0: one mask a word
            n_live = bir.sub(kblocks, bir.umin(bir.mul(q, 4), kblocks))
            sh = bir.mul(bir.as_i32(bir.umin(n_live, 4)), _i32c(8))
            mask = bir.select(bir.ult(n_live, 4),
                              bir.sub(bir.shl(_i32c(1), sh), _i32c(1)), _i32c(-1))
            word = bir.bit_and(word, mask)
            svs = decode_e4m3_word(word) if fast and lay.nv else None
            for i in range(4):
                jl = bir.add(bir.mul(s_qs[it], 4), i)  # block within the step
                sv = svs[i] if svs is not None else \
                    _decode_scale_fast(fmt, bir.bit_and(bir.shru(word, _i32c(8 * i)), 0xFF))
                if lay.nv:  # (the 2^28 of D is applied to the totals: acc is 2^-28 acc)
                    dst = bir.add(bir.add(bir.mul(bir.add(bir.mul(s_qs[it], 2), i // 2), 128),
                                          slot_nv), 2 * (i % 2))
                else:
                    dst = bir.add(bir.mul(jl, COLS), slot)
                bir.store(sv, sbsm, dst)
        base = wr + s_iters * st.s_rows
        for it in range(a_iters):
            cid = bir.add(tid, it * THREADS)
            n, c = bir.udiv(cid, STEP_CHUNKS), bir.urem(cid, STEP_CHUNKS)
            # rows past the pass are not staged: their stale B columns only reach
            # their own (never stored) outputs (an MMA column is one row)
            with bir.when(bir.ult(n, rows)):
                if solo:
                    sb_ = regs[base + 2 * it + 1]
                    if not lay.nv:  # E8M0 activation scale of block c, for the fold
                        bir.store(mir.decode_scale(fmt, sb_), sasm, bir.mul(c, st.sa_stride))
                    solo_ir.stage_act(sol, bsolo, c, regs[base + 2 * it],
                                      _sa_splats(sb_) if lay.nv else None,
                                      fp4_word_to_f16_pairs)
                else:
                    _stage_act(n, c, regs[base + 2 * it], regs[base + 2 * it + 1])

    def fold(accs: list[Value], j: int, blk: list[list[Value]], sb: list[Value]) -> None:
        """accs += block j's MMA sums times the scales (one rounding each); ``sb``: the
        block's weight scales of rows g, g + 8."""
        for nt in range(len(blk)):
            if not lay.nv:
                sav = bir.vector_load(bir.vec(2, f32), sasm,
                                      bir.add(bir.mul(t, 2), j * st.sa_stride + 8 * nt),
                                      alignment=8)
                sa = [bir.extract(sav, 0), bir.extract(sav, 1)]
            for i in range(4):
                idx = nt * 4 + i
                d = blk[nt][i]
                if lay.nv:  # exact D * sB = 2^-28 t sA sB, one rounding (of 2^-28 acc)
                    accs[idx] = mmath.fma(d, sb[i >> 1], accs[idx])
                else:  # the portable kernel's ((sA * sB) / 4) * (4 * block sum)
                    d = arith.mulf(d, bir.const(4 * UNSCALE, f32))  # exact: quarters
                    s = arith.mulf(arith.mulf(sa[i & 1], sb[i >> 1]), bir.const(0.25, f32))
                    accs[idx] = mmath.fma(d, s, accs[idx])

    def compute(accs: list[Value], two: bool, rows: Value | None = None,
                live: Value | None = None, slot: Value | None = None) -> list[Value]:
        """One step's MMAs of this warp (n-tile 1 only when ``two``). Units 2q, 2q + 1 come
        from one 32-bit shared word per row (staged by :func:`pair_pieces`). With ``rows``
        ("cf8"), lanes of B columns past the pass's rows skip their B fragment loads (half
        the shared wavefronts of a pass of <= 4 rows) and keep the previous unit pair's
        registers: a B column only reaches its own (never stored) outputs. With ``live``
        (the peeled last step, "tail"): unit pairs q >= live (past the row end: zero
        activations and weight scales, terms fma(0, 0, acc) = acc) are skipped (uniform
        branches). ``slot`` (``ring``): the weights are ring stage ``slot``'s raw rows (NVFP4:
        lane t's word of a unit pair is one ``prmt`` of the raw words t // 2 and 2 + t // 2,
        :func:`_pair_pieces`'s bytes; MXFP4: raw word t, as staged)."""
        accs = list(accs)
        b_live = None if rows is None else bir.ult(g, rows)
        rows_g = [bir.add(bir.mul(warp, 16), bir.add(g, 8 * h)) for h in range(2)]
        raw_nv = slot is not None and lay.nv
        if slot is None:
            wbase = [bir.add(bir.mul(r, W_STRIDE), bir.mul(t, 4)) for r in rows_g]
        else:  # TMA stage: halves of [64 rows][128 bytes], 16-byte chunk c at c ^ (row % 8)
            wbase = [bir.add(bir.mul(slot, RING_STAGE), bir.add(
                bir.mul(r, RING_ROW), bir.mul(bir.udiv(t, 2) if raw_nv else t, 4)))
                for r in rows_g]
            g16 = bir.mul(g, 16)  # (rows g, g + 8 of the warp's 16: row % 8 = g)
        # NVFP4 raw: bytes 2t, 2t + 1 of each block (t even: bytes 0, 1 of the words)
        sel = bir.select(bir.eq(bir.urem(t, 2), 0), _i32c(0x5140), _i32c(0x7362)) \
            if raw_nv else None

        def wword(h: int, off: int) -> Value:
            """The word at byte ``off`` of row h's step (``slot``: chunk off // 16 swizzled)."""
            if slot is None:
                a_ = bir.add(wbase[h], off)
            else:
                half, c16 = divmod(off // 16, RING_ROW // 16)
                sw = arith.xori(g16, bir.const(c16 * 16))
                a_ = bir.add(wbase[h], bir.add(sw, half * COLS * RING_ROW + off % 16))
            v = bir.vector_load(bir.vec(4, bir.i8()), wsm, a_, alignment=4)
            return vector.extract(vector.bitcast(bir.vec(1, i32), v), [], [0])
        nts = 2 if two else 1
        upb = UNITS // lay.blocks  # MMA units per block: NVFP4 1, MXFP4 2

        def pair(q: int, accs: list[Value], b_prev: Value | None) -> tuple[list[Value], Any]:
            """Unit pair q (units 2q, 2q + 1: whole blocks) folded into ``accs``."""
            accs = list(accs)
            if lay.nv:  # weight scales of blocks 2q, 2q + 1, rows g, g + 8
                sbv = bir.vector_load(bir.vec(4, f32), sbsm,
                                      bir.add(bir.mul(warp, 32),
                                              bir.add(bir.mul(g, 4), q * sb_pair)),
                                      alignment=16)
            else:  # block q
                sbv = bir.vector_load(bir.vec(2, f32), sbsm,
                                      bir.add(bir.mul(warp, 16),
                                              bir.add(bir.mul(g, 2), q * sb_block)),
                                      alignment=8)
            sbq = [bir.extract(sbv, i) for i in range(4 if lay.nv else 2)]
            bq = []
            for nt in range(nts):  # B fragments of units 2q, 2q + 1
                src = st.bofs(q, bir.add(g, 8 * nt), t) if st.cf else \
                    bir.mul(bir.add(bir.mul(bir.add(g, q * TOKENS + 8 * nt), 4), t), 4)
                if b_live is None:
                    bq.append(bir.vector_load(bir.vec(4, i32), bsm, src, alignment=16))
                    continue
                bl = bir.if_(b_live, [bir.vec(4, i32)])
                with bl.then():
                    bl.yield_(bir.vector_load(bir.vec(4, i32), bsm, src, alignment=16))
                with bl.else_():
                    bl.yield_(b_prev if b_prev is not None else bir.const(0, bir.vec(4, i32)))
                b_prev = bl.results[0]
                bq.append(b_prev)
            pairs = []
            for h in range(2):  # rows g, g + 8: f16 pairs (u.c0, u.c2), (u.c1, u.c3), v...
                x = wword(h, 16 * q)
                if raw_nv:
                    x = byte_perm(x, wword(h, 16 * q + 8), sel)
                pairs.append(fp4_word_to_f16_pairs(x) if fast else _dequant_pairs_f16([x]))
            blk: list[list[Value]] = []
            for s_ in range(2):
                u = 2 * q + s_
                if u % upb == 0:
                    blk = [[zero] * 4 for _ in range(nts)]
                afr = [pairs[0][2 * s_], pairs[1][2 * s_], pairs[0][2 * s_ + 1],
                       pairs[1][2 * s_ + 1]]
                for nt in range(nts):
                    bfr = [_f16x2(bir.extract(bq[nt], 2 * s_)),
                           _f16x2(bir.extract(bq[nt], 2 * s_ + 1))]
                    blk[nt] = list(mma.mma_m16n8k16(afr, bfr, blk[nt], input_type="f16"))
                if u % upb == upb - 1:
                    fold(accs, u // upb, blk, st.nv_block_scales(sbq, s_) if lay.nv else sbq)
            return accs, b_prev

        b_prev: Value | None = None
        for q in range(UNITS // 2):
            if live is None or q == 0:
                accs, b_prev = pair(q, accs, b_prev)
                continue
            if b_prev is None:  # (no B-skip: a zero placeholder carried through the branch)
                b_prev = bir.const(0, bir.vec(4, i32))
            br = bir.if_(bir.ult(bir.const(q), live), [f32] * len(accs) + [bir.vec(4, i32)])
            with br.then():
                na, nb = pair(q, accs, b_prev)
                br.yield_(*na, nb if nb is not None else b_prev)
            with br.else_():
                br.yield_(*accs, b_prev)
            accs, b_prev = list(br.results[:-1]), br.results[-1]
        return accs

    # B fragments (and MX activation scales) of rows past a pass are never staged: zero
    # them once (stale or zero, they only reach their own unstored MMA columns)
    vz = bir.const(0, bir.vec(4, i32))
    for it in range(0 if solo else -(-st.b_words // 4 // THREADS)):
        idx = bir.add(tid, it * THREADS)
        if (it + 1) * THREADS * 4 <= st.b_words:
            bir.vector_store(vz, bsm, bir.mul(idx, 4), alignment=16)
        else:
            with bir.when(bir.ult(idx, st.b_words // 4)):
                bir.vector_store(vz, bsm, bir.mul(idx, 4), alignment=16)
    for it in range(-(-sol.b_words // 4 // THREADS) if sol else 0):
        idx = bir.add(tid, it * THREADS)
        with bir.when(bir.ult(idx, sol.b_words // 4)):
            bir.vector_store(vz, bsolo, bir.mul(idx, 4), alignment=16)
    if sasm is not None:
        for it in range(-(-lay.blocks * st.sa_stride // THREADS)):
            idx = bir.add(tid, it * THREADS)
            with bir.when(bir.ult(idx, lay.blocks * st.sa_stride)):
                bir.store(zero, sasm, idx)
    if units is not None:
        types = [v16] * wr + [i32] * (s_iters * st.s_rows) + [v16, i32] * a_iters
        if ring:
            from blockscale.compiler.arch import tma  # dynamic shared memory (> 48 KB):
            wsm = tma.extern_shared_buffer(kb, ring * RING_STAGE, align=1024)  # the stages
            _walk_ring(units, geometry, fetch, stage, compute, lay, warp, g, t, steps,
                       row_bytes, zero, types, kb=kb, ring=ring, wsm=wsm, n_count=n_count,
                       tid=tid)
        else:
            _walk_units(units, geometry, fetch, stage, compute, lay, warp, g, t, steps,
                        row_bytes, zero, types)
        _align_attributions(kb, 16)
        return
    n0 = geo0.n0
    if slices > 1:  # (tail, one n-tile: passes of <= 8 rows)
        j_count = bir.umin(bir.ceil_div(bir.sub(n_count, n0), COLS), slices)
        with bir.for_range(start, end, tokens) as pl:
            r0 = pl.iv
            rows = bir.umin(bir.sub(end, r0), tokens)
            init = fetch(bir.const(0), r0, rows, bir.const(0))
            n_f = len(init)
            with bir.for_range(0, j_count, carry=init) as jl:
                j = jl.iv

                def body(step: Value, accs: list[Value], cur: list[Value],
                         nxt: Callable[[], list[Value]], live: Value | None = None,
                         ) -> list[Value]:
                    bir.barrier()  # the previous step's shared reads are done
                    stage(step, cur, rows, full=live is None)  # (the loop: not the last)
                    bir.barrier()
                    regs = nxt()
                    return compute(accs, False, rows, live) + regs

                with bir.for_range(0, bir.sub(steps, 1),
                                   carry=[zero] * 4 + list(jl.carried)) as sl:
                    sl.yield_(*body(sl.iv, list(sl.carried[:4]), list(sl.carried[4:]),
                                    lambda sl=sl, j=j: fetch(bir.add(sl.iv, 1), r0, rows, j)))
                last = bir.sub(steps, 1)
                live = bir.umin(bir.udiv(bir.sub(row_bytes, bir.mul(last, STEP_BYTES)), 16),
                                UNITS // 2)

                def next_slice(j: Value = j) -> list[Value]:
                    """The next slice's first step (none after the last slice)."""
                    more = bir.ult(bir.add(j, 1), j_count)
                    br = bir.if_(more, [v.type for v in init])
                    with br.then():
                        br.yield_(*fetch(bir.const(0), r0, rows, bir.add(j, 1)))
                    with br.else_():
                        br.yield_(*[bir.const(0, v.type) for v in init])
                    return list(br.results)

                res = body(last, list(sl.results[:4]), list(sl.results[4:]), next_slice, live)
                totals = [arith.mulf(v, bir.const(UNSCALE, f32)) if lay.nv else v
                          for v in res[:4]]
                nj = bir.add(n0, bir.mul(j, COLS))
                for i in range(4):
                    col = bir.add(nj, bir.add(bir.mul(warp, 16), bir.add(g, 8 * (i >> 1))))
                    tok = bir.add(bir.mul(t, 2), i & 1)
                    with bir.when(bir.logical_and(bir.ult(tok, rows), bir.ult(col, n_count))):
                        store(totals[i], bir.add(r0, tok), col)
                jl.yield_(*res[4:4 + n_f])
            bir.barrier()  # the next pass restages the shared buffers
        return
    def one_row_pass(r0: Value) -> None:
        """A pass of one row (``solo``): solo_ir's block-diagonal steps, the last peeled."""
        one = bir.const(1)
        init = fetch(bir.const(0), r0, one)

        def body(step: Value, accs: list[Value], cur: list[Value], live: Value | None = None,
                 nxt: Callable[[], list[Value]] = list) -> list[Value]:
            bir.barrier()  # the previous step's shared reads are done
            stage(step, cur, one, full=live is None)
            bir.barrier()
            regs = nxt()
            return solo_ir.compute(sol, accs, wsm=wsm, bsm=bsolo, sbsm=sbsm, warp=warp, g=g,
                                   t=t, pairs=fp4_word_to_f16_pairs, sasm=sasm,
                                   sa_stride=st.sa_stride, unscale=4 * UNSCALE,
                                   live=live) + regs

        with bir.for_range(0, bir.sub(steps, 1), carry=[zero] * 4 + init) as sl:
            sl.yield_(*body(sl.iv, list(sl.carried[:4]), list(sl.carried[4:]),
                            nxt=lambda sl=sl: fetch(bir.add(sl.iv, 1), r0, one)))
        last = bir.sub(steps, 1)
        live = bir.umin(bir.udiv(bir.sub(row_bytes, bir.mul(last, STEP_BYTES)), 16),
                        UNITS // 2)  # 16-byte chunks of the last step; 4 / 8 a set
        res = body(last, list(sl.results[:4]), list(sl.results[4:]),
                   bir.ceil_div(live, solo_ir.SET_BLOCKS * sol.blk_bytes // 16))
        for h, v in enumerate(solo_ir.row_totals(res[:4])):
            col = bir.add(n0, bir.add(bir.mul(warp, 16), bir.add(g, 8 * h)))
            with bir.when(bir.logical_and(bir.eq(t, 0), bir.ult(col, n_count))):
                store(arith.mulf(v, bir.const(UNSCALE, f32)) if lay.nv else v, r0, col)

    def rows_pass(r0: Value, rows: Value) -> None:
        """A pass of ``rows`` rows: the step loop of :func:`compute`."""
        two = bir.ult(bir.const(8), rows)
        s_lo, s_hi = (0, steps) if step_range is None else step_range
        init = [x for d in range(depth)
                for x in fetch(bir.const(d) if step_range is None else bir.add(s_lo, d),
                               r0, rows)]
        n_f = len(init) // depth

        def step_body(step: Value, accs: list[Value], cur: list[Value],
                      live: Value | None = None,
                      fetch_next: Callable[[], list[Value]] = list) -> list[Value]:
            """Stage step ``step`` (fetched into ``cur``), issue ``fetch_next`` and fold the
            step's MMAs into ``accs``: the 8 accumulators, then the fetched registers."""
            bir.barrier()  # the previous step's shared reads are done
            stage(step, cur, rows, full=tail and live is None)  # (tail: the loop's steps)
            bir.barrier()
            nxt = fetch_next()
            if tokens == 8:  # one n-tile (accs[4:] stay zero, never stored)
                return compute(accs[:4], False, rows, live) + accs[4:] + nxt
            br = bir.if_(two, [f32] * 8)
            with br.then():
                br.yield_(*compute(accs, True, None, live))
            with br.else_():
                br.yield_(*(compute(accs[:4], False, None, live) + accs[4:]))
            return list(br.results) + nxt

        # tail: the last step peeled off the loop (no prefetch past the end; its unit
        # pairs past the row end skipped)
        with bir.for_range(s_lo, bir.sub(s_hi, 1) if tail else s_hi,
                           carry=[zero] * 8 + init) as sl:
            step = sl.iv
            cur = list(sl.carried[8:8 + n_f])
            later = list(sl.carried[8 + n_f:])

            def fetch_next(step: Value = step, later: list[Value] = later) -> list[Value]:
                ahead = bir.add(step, depth)
                if step_range is not None or (tail and depth > 1):  # a prefetch past the
                    # end re-reads the last step (L1 / L2 hits), not the next split's
                    ahead = bir.umin(ahead, bir.sub(s_hi, 1))
                return later + fetch(ahead, r0, rows)

            sl.yield_(*step_body(step, list(sl.carried[:8]), cur, fetch_next=fetch_next))
        if tail:
            last = bir.sub(s_hi, 1)
            live = bir.udiv(bir.sub(row_bytes, bir.mul(last, STEP_BYTES)), 16)
            res = step_body(last, list(sl.results[:8]), list(sl.results[8:8 + n_f]),
                            bir.umin(live, UNITS // 2))
            sl = _Results(res)
        totals = list(sl.results[:8])
        if lay.nv:  # exact: the accumulators are 2^-28 times the portable kernel's
            totals = [arith.mulf(v, bir.const(UNSCALE, f32)) for v in totals]
        for nt in range(tokens // 8):
            for i in range(4):
                col = bir.add(n0, bir.add(bir.mul(warp, 16), bir.add(g, 8 * (i >> 1))))
                tok = bir.add(bir.mul(t, 2), nt * 8 + (i & 1))
                with bir.when(bir.logical_and(bir.ult(tok, rows), bir.ult(col, n_count))):
                    store(totals[nt * 4 + i], bir.add(r0, tok), col)

    with bir.for_range(start, end, 1 if solo else tokens) as pl:
        r0 = pl.iv
        if solo:
            one_row_pass(r0)
        else:
            rows_pass(r0, bir.umin(bir.sub(end, r0), tokens))
        bir.barrier()  # the next pass restages the shared buffers


def _walk_units(units: Any, geometry: Callable[[Value, Value], _Geo],
                fetch: Callable[..., list[Value]], stage: Callable[..., None],
                compute: Callable[..., list[Value]], lay: _Fmt, warp: Value, g: Value,
                t: Value, steps: Value, row_bytes: Value, zero: Value,
                types: list[Any]) -> None:
    """The persistent main loop of :func:`emit_decode_mma` (``units``): CTA c computes units
    c, c + P, .. (P = grid_dim.x) of ``units.count``; a live unit (rows > 0, expert >= 0)
    runs the "mma_c8t" step loop, whose peeled last step fetches the first step of the
    CTA's next live unit (else nothing: zeros) before its MMAs: the next unit's loads are
    in flight during the current unit's last MMAs and stores. The next unit's info words
    (:meth:`~blockscale.ops._decode_stream_ir.Units.prefetch`) are loaded at the unit's start
    by 5 threads and published in shared memory at its last step: the prefetch's addresses
    wait on no global load (run T: ~10 % slower than "mma_c8t" at T = 16 with them loaded
    there). A unit of expert id -1 writes its zeros (``units.idle``) and fetches the next
    unit's first step itself."""
    c, p = bir.block_idx("x"), bir.grid_dim("x")
    tid = bir.thread_idx("x")
    info_sm = workgroup_buffer(units.kb, 8, bir.i32())
    last_u = bir.sub(units.count, 1)
    first_step = _first_step_fn(units, geometry, fetch, types, last_u)

    with bir.for_range(c, units.count, p, carry=first_step(c)) as ul:
        u = ul.iv
        un = units.info(u)
        u_next = bir.add(u, p)
        br = bir.if_(un.live, types)
        with br.then():
            geo = geometry(un.e, un.n0)
            # the next unit's info words, loaded by threads 0..4 without stalling: its row
            # block now, the word at an address from it at step 0 (or the last step when it
            # is the only one), published in shared memory at the last step
            blk = units.prefetch(bir.umin(u_next, last_u), tid)

            def body(step: Value, accs: list[Value], cur: list[Value],
                     nxt: Callable[[], list[Value]], live: Value | None = None,
                     word: Value | None = None) -> list[Value]:
                bir.barrier()  # the previous step's shared reads are done
                if word is not None:  # (the last step: read after the next barrier)
                    units.publish(word, tid, info_sm)
                stage(step, cur, un.rows, full=live is None)  # (the loop: not the last)
                bir.barrier()
                regs = nxt()
                return compute(accs, False, un.rows, live) + regs

            res = _unit_steps(units, un, geo, body, fetch, first_step, u_next,
                              list(ul.carried), blk, steps, row_bytes, zero, tid, info_sm)
            _store_unit(units, un, res[:4], lay, warp, g, t)
            br.yield_(*res[4:])
        with br.else_():
            units.idle(un)
            br.yield_(*first_step(u_next))
        ul.yield_(*br.results)


def _align_attributions(kb: Any, align: int) -> None:
    """Every workgroup attribution of the kernel ``.align``-ed to ``align`` bytes (the
    16-byte shared vector accesses; :func:`workgroup_buffer` leaves the element's alignment,
    and ptxas may place a buffer after the ring's 24-byte mbarrier array: run U's
    CUDA_ERROR_MISALIGNED_ADDRESS of "mma_c8r")."""
    attrs = kb.func.attributes
    n = int(ir.IntegerAttr(attrs["workgroup_attributions"]).value)
    a = ir.DictAttr.get({"llvm.align": ir.IntegerAttr.get(bir.i64(), align)})
    attrs["workgroup_attrib_attrs"] = ir.ArrayAttr.get([a] * n)


def ring_map_arg() -> Any:
    """The ring variants' tensormap kernel argument ``w_map`` over the packed weights ``w``
    (:data:`RING_BOX`, 128-byte swizzle; launch value ``(K / 2, E * N)``)."""
    from blockscale.launch import KernelArg

    return KernelArg("w_map", "tensormap", "uint8", tensor="w", box=RING_BOX, swizzle="128b")


def _walk_ring(units: Any, geometry: Callable[[Value, Value], _Geo],
               fetch: Callable[..., list[Value]], stage: Callable[..., None],
               compute: Callable[..., list[Value]], lay: _Fmt, warp: Value, g: Value,
               t: Value, steps: Value, row_bytes: Value, zero: Value, types: list[Any], *,
               kb: Any, ring: int, wsm: Value, n_count: Value, tid: Value) -> None:
    """The main loop of :func:`emit_decode_mma` with ``units`` and ``ring``: CTA c walks units
    c, c + P, .. (as :func:`_walk_units`); its K steps over all its units, i = 0, 1, .., fill
    ring stage ``i % ring`` ``ring - 1`` steps ahead: thread 0 issues the step's two TMA
    boxes (:data:`RING_BOX`: bytes ``[256 s, + 128)`` and ``[256 s + 128, + 128)`` of the
    unit's 64 weight rows; zeros past the row end and past the last expert's rows; a box
    wholly past the row end is not issued) on the stage's mbarrier after
    ``arrive.expect_tx`` of their bytes (none for a unit that is not live: every fill
    index completes one phase, so step i waits on parity ``(i // ring) % 2``). The fills
    follow a cursor (step, unit, live, the unit's first weight row) carried through the
    loops: the next unit's geometry is looked up once per unit. The scale words and
    activations are fetched into registers one step ahead (the "mma_c8t" staging); the
    MMAs read the weights from the stage (:func:`emit_decode_mma`'s ``compute``)."""
    from blockscale.compiler.arch import tma

    c, p = bir.block_idx("x"), bir.grid_dim("x")
    bars = tma.mbarrier_group(ring)
    desc = tma.descriptor(kb.arg("w_map"), ring_map_arg())
    is0 = bir.eq(tid, 0)
    tile_t = ir.Type.parse(f"memref<{COLS}x{RING_ROW}xi8, strided<[{RING_ROW}, 1], "
                           f"offset: ?>, {ir.MemRefType(wsm.type).memory_space}>")

    def tile(slot: int, half: int) -> Value:
        """Stage ``slot``'s half as a [64 x 128] view (a constant offset per view)."""
        off = bir.const(slot * RING_STAGE + half * COLS * RING_ROW)
        return memref.reinterpret_cast(tile_t, wsm, [off], [], [],
                                       [ir.ShapedType.get_dynamic_stride_or_offset()],
                                       [COLS, RING_ROW], [RING_ROW, 1])

    def load(slot: Value, half: int, coords: list[Value]) -> None:
        """One box into stage ``slot`` (a branch per stage: constant tile views)."""
        for k_ in range(ring):
            with bir.when(bir.eq(slot, k_)):
                tma.tma_load(tile(k_, half), desc, coords, bars, k_)

    def cursor_at(u: Value) -> list[Value]:
        """[live, first weight row] of unit u."""
        un = units.info(bir.umin(u, bir.sub(units.count, 1)))
        return [bir.logical_and(bir.ult(u, units.count), un.live),
                bir.add(bir.mul(un.e, n_count), un.n0)]

    def issue(i: Value, cur: list[Value]) -> list[Value]:
        """Fill index i (the cursor's step ``cur[0]`` of unit ``cur[1]``) into stage
        i % ring when the unit is in range (thread 0); the cursor advanced by one step."""
        s, u, live, row0 = cur
        with bir.when(bir.logical_and(is0, bir.ult(u, units.count))):
            slot = bir.urem(i, ring)
            x0 = bir.mul(s, STEP_BYTES)
            two = bir.ult(bir.add(x0, RING_ROW), row_bytes)  # the second box holds bytes
            tx = bir.select(two, bir.const(RING_STAGE), bir.const(RING_STAGE // 2))
            tma.mbarrier_arrive_expect_tx(bars, bir.select(live, tx, bir.const(0)), slot)
            with bir.when(live):
                load(slot, 0, [x0, row0])
                with bir.when(two):
                    load(slot, 1, [bir.add(x0, RING_ROW), row0])
        s1 = bir.add(s, 1)
        br = bir.if_(bir.eq(s1, steps), [v.type for v in cur])
        with br.then():  # the next unit of this CTA
            u1 = bir.add(u, p)
            br.yield_(bir.const(0), u1, *cursor_at(u1))
        with br.else_():
            br.yield_(s1, *cur[1:])
        return list(br.results)

    info_sm = workgroup_buffer(kb, 8, bir.i32())
    last_u = bir.sub(units.count, 1)
    first_step = _first_step_fn(units, geometry, fetch, types, last_u)

    with bir.when(is0):
        for s_ in range(ring):
            tma.mbarrier_init(bars, 1, s_)
        tma.fence_mbarrier_init()
    bir.barrier()
    cur = [bir.const(0), c, *cursor_at(c)]
    for i in range(ring - 1):
        cur = issue(bir.const(i), cur)
    with bir.for_range(c, units.count, p, carry=first_step(c) + cur) as ul:
        u = ul.iv
        i0 = bir.mul(bir.udiv(bir.sub(u, c), p), steps)
        un = units.info(u)
        nf = len(types)
        br = bir.if_(un.live, types + [v.type for v in cur])
        with br.then():
            geo = geometry(un.e, un.n0)
            u_next = bir.add(u, p)
            blk = units.prefetch(bir.umin(u_next, last_u), tid)  # (as _walk_units)

            def body(step: Value, accs: list[Value], rest: list[Value],
                     nxt: Callable[[], list[Value]], live: Value | None = None,
                     word: Value | None = None) -> list[Value]:
                """accs, next registers, cursor (``rest``: this step's registers, cursor)."""
                cur_regs, cur = rest[:nf], rest[nf:]
                i = bir.add(i0, step)
                bir.barrier()  # the previous step's shared reads are done (its stage too)
                if word is not None:  # (the last step: read after the next barrier)
                    units.publish(word, tid, info_sm)
                cur = issue(bir.add(i, ring - 1), cur)
                stage(step, cur_regs, un.rows, full=live is None)
                slot = bir.urem(i, ring)
                tma.mbarrier_wait(bars, arith.trunci(bir.i1(), bir.as_i32(
                    bir.urem(bir.udiv(i, ring), 2))), slot)
                bir.barrier()
                regs = nxt()
                return compute(accs, False, un.rows, live, slot=slot) + regs + cur

            res = _unit_steps(units, un, geo, body, fetch, first_step, u_next,
                              list(ul.carried), blk, steps, row_bytes, zero, tid, info_sm)
            _store_unit(units, un, res[:4], lay, warp, g, t)
            br.yield_(*res[4:])
        with br.else_():
            with bir.for_range(0, steps, carry=list(ul.carried[nf:])) as il:  # (the fills
                bir.barrier()  # go on: the next units' steps)
                il.yield_(*issue(bir.add(bir.add(i0, il.iv), ring - 1), list(il.carried)))
            units.idle(un)
            br.yield_(*first_step(bir.add(u, p)), *il.results)
        ul.yield_(*br.results)


def _first_step_fn(units: Any, geometry: Callable[[Value, Value], _Geo],
                   fetch: Callable[..., list[Value]], types: list[Any],
                   last_u: Value) -> Callable[..., list[Value]]:
    """``first_step(u, un=None)`` of the persistent walks: unit u's first step's scale words
    and activations (zeros when u is past the end or not live); ``un``: its geometry, if
    known."""
    def first_step(u: Value, un: Any = None) -> list[Value]:
        un = un or units.info(bir.umin(u, last_u))
        br = bir.if_(bir.logical_and(bir.ult(u, units.count), un.live), types)
        with br.then():
            br.yield_(*fetch(bir.const(0), un.r0, un.rows, geo=geometry(un.e, un.n0),
                             a_srow=un.a_srow))
        with br.else_():
            br.yield_(*[bir.const(0, ty) for ty in types])
        return list(br.results)
    return first_step


def _unit_steps(units: Any, un: Any, geo: _Geo, body: Callable[..., list[Value]],
                fetch: Callable[..., list[Value]], first_step: Callable[..., list[Value]],
                u_next: Value, carried: list[Value], blk: Value, steps: Value,
                row_bytes: Value, zero: Value, tid: Value, info_sm: Value) -> list[Value]:
    """A live unit's K steps in the persistent walks: ``steps - 1`` loop steps, then the
    peeled last one, which fetches the next unit's first step (``first_step(u_next, ..)``
    from its info words published in ``info_sm``). ``body(step, accs, rest, nxt, live=None,
    word=None)`` runs a step (``rest``: the carried values after the 4 accumulators;
    ``nxt()``: the next step's registers) and returns accs + next registers + the rest of
    the carry. The next unit's dependent info word (from its row block ``blk``) is loaded at
    step 0 (at the last step when it is the only one) and passed to the last step as
    ``word``. Returns the last step's results."""
    with bir.for_range(0, bir.sub(steps, 1), carry=[zero] * 4 + carried + [blk]) as sl:
        cs = list(sl.carried)
        wb = bir.if_(bir.eq(sl.iv, 0), [bir.i32()])
        with wb.then():
            wb.yield_(units.prefetch_word(cs[-1], tid))
        with wb.else_():
            wb.yield_(cs[-1])
        sl.yield_(*body(sl.iv, cs[:4], cs[4:-1],
                        lambda sl=sl: fetch(bir.add(sl.iv, 1), un.r0, un.rows, geo=geo,
                                            a_srow=un.a_srow)),
                  wb.results[0])
    last = bir.sub(steps, 1)
    live = bir.umin(bir.udiv(bir.sub(row_bytes, bir.mul(last, STEP_BYTES)), 16), UNITS // 2)
    rs = list(sl.results)
    wl = bir.if_(bir.eq(last, 0), [bir.i32()])  # (no loop step: the word now)
    with wl.then():
        wl.yield_(units.prefetch_word(blk, tid))
    with wl.else_():
        wl.yield_(rs[-1])
    return body(last, rs[:4], rs[4:-1],
                lambda: first_step(u_next, units.shared_info(u_next, info_sm)), live,
                wl.results[0])


def _store_unit(units: Any, un: Any, accs: list[Value], lay: _Fmt, warp: Value, g: Value,
                t: Value) -> None:
    """Store a unit's 4 accumulators of this lane (rows 2t, 2t + 1; columns g, g + 8 of
    the warp's 16)."""
    totals = [arith.mulf(v, bir.const(UNSCALE, bir.f32())) if lay.nv else v for v in accs]
    store = units.store(un)
    for i in range(4):
        col = bir.add(un.n0, bir.add(bir.mul(warp, 16), bir.add(g, 8 * (i >> 1))))
        tok = bir.add(bir.mul(t, 2), i & 1)
        with bir.when(bir.logical_and(bir.ult(tok, un.rows), bir.ult(col, units.n_count))):
            store(totals[i], bir.add(un.r0, tok), col)


class _Geo(NamedTuple):
    """Load bases of one (expert, 64-column tile): see :func:`emit_decode_mma`."""

    n0: Value
    b_srow0: Value
    w_base: Value
    w_last: Value
    s_offs: list[Value]


class _Results:
    """Stands in for a finished loop: ``results`` only."""

    def __init__(self, results: list[Value]):
        self.results = results


def split_k_steps(k: Value, split: Value, splits: Value) -> tuple[Value, Value]:
    """The K steps ``[lo, hi)`` of split ``split`` of ``splits``: ``ceil(steps / splits)``
    consecutive steps each (the host picks ``splits`` so that none is empty)."""
    steps = bir.ceil_div(bir.udiv(k, 2), STEP_BYTES)
    per = bir.ceil_div(steps, splits)
    lo = bir.umin(bir.mul(split, per), steps)
    return lo, bir.umin(bir.add(lo, per), steps)


def emit_decode_mma_split_k(kb: Any, fmt: Format, *, start: Value, end: Value, expert: Value,
                            n_count: Value, k: Value, a_srow: Callable[[Value], Value],
                            store: Callable[[Value, Value, Value], None], workspace: Value,
                            counters: Value) -> None:
    """Split-K body (``variant="mma_psk"``) of CTA (x, y, z): the "mma_p" kernel's sums over
    the K steps of split z (:func:`split_k_steps`, ``splits = grid_dim.z``), written as fp32
    partials to ``workspace[(m * splits + z) * n + col]`` (rows m of the group); the CTA
    that arrives last at tile (x, y) (thread 0, after a CTA barrier: ``membar.gl``,
    ``atom.add`` on ``counters[x + grid_x * y]``, then ``membar.gl`` in the last CTA only;
    the threadfence-reduction pattern: NVPTX emits the atomic relaxed, the fences order the
    partials) sums them in split order 0, 1, .., splits - 1 (fixed: the result does not
    depend on which CTA is last), calls ``store`` (alpha / expert scale / row scale as in
    "mma") and resets the counter to 0 (the buffer is reusable by the next launch: the host
    may keep one zeroed counter buffer per stream)."""
    i32 = bir.i32()
    z, splits = bir.block_idx("z"), bir.grid_dim("z")
    n0 = bir.mul(bir.block_idx("x"), COLS)

    def partial(v: Value, m: Value, n: Value) -> None:
        bir.store(v, workspace, bir.add(bir.mul(bir.add(bir.mul(m, splits), z), n_count), n))

    emit_decode_mma(kb, fmt, start=start, end=end, expert=expert, n_count=n_count, k=k,
                    a_srow=a_srow, store=partial, step_range=split_k_steps(k, z, splits),
                    decode="prmt")
    flag = workgroup_buffer(kb, 1, i32)
    tid = bir.thread_idx("x")
    bir.barrier()  # every thread's partials are stored (CTA scope)
    tile = bir.add(bir.block_idx("x"), bir.mul(bir.grid_dim("x"), bir.block_idx("y")))
    with bir.when(bir.eq(tid, 0)):
        nvvm.memory_barrier(nvvm.MemScopeKind.GPU)  # membar.gl: release the CTA's partials
        old = memref.atomic_rmw(arith.AtomicRMWKind.addi, bir.const(1, i32), counters,
                                [bir.as_index(tile)])
        last = bir.eq(bir.as_index(old), bir.sub(splits, 1))
        with bir.when(last):
            bir.store(bir.const(0, i32), counters, tile)
            # acquire the other CTAs' partials (and drop stale L1 lines: CCTL.IVALL); only
            # the reducing CTA needs it
            nvvm.memory_barrier(nvvm.MemScopeKind.GPU)
        bir.store(arith.extui(i32, last), flag, 0)
    bir.barrier()
    with bir.when(bir.eq(bir.load(flag, 0), bir.const(1, i32))):
        rows = bir.sub(end, start)
        with bir.for_range(tid, bir.mul(rows, COLS), THREADS) as rl:
            m = bir.add(start, bir.udiv(rl.iv, COLS))
            n = bir.add(n0, bir.urem(rl.iv, COLS))
            with bir.when(bir.ult(n, n_count)):
                base = bir.add(bir.mul(bir.mul(m, splits), n_count), n)
                with bir.for_range(1, splits, carry=[bir.load(workspace, base)]) as zl:
                    v = bir.load(workspace, bir.add(base, bir.mul(zl.iv, n_count)))
                    zl.yield_(arith.addf(zl.carried[0], v))
                store(zl.results[0], m, n)

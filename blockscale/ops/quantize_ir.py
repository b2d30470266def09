"""The quantize kernel IR (dense, grouped per expert, fused gated activation), for all targets.

One generator builds every quantize kernel from a :class:`blockscale.ops.quantize.QuantizeSpec`.
Imported lazily (it needs MLIR); ``blockscale.ops.quantize`` holds the spec and host side.

Work decomposition (all launches: ``block = (256, 1, 1)``, ``grid = (gx, gy)``):

* a *chunk* is ``C`` contiguous elements of one row (``quantize.chunk_elems``: 16 for
  aligned quantize kernels, two 16-byte loads per input; 8 otherwise); one thread owns one
  chunk per row it visits. ``L = block_size / C`` neighbouring lanes share a scale block (NVFP4: 1 with C = 16,
  so no shuffle; 2 else; MX: 2 or 4) and reduce its amax with ``gpu.shuffle xor``; the lane
  owning the block's first element writes the scale byte (0 for padding slots), so every
  scale byte is written;
* rows are visited in 128-row *tiles* (the 5-D layout's row atom), ``blockIdx.x`` selects a
  range of ``2^cb_log2`` chunks and a block covers ``256 >> cb_log2`` rows per step. Dense
  kernels loop over those row groups with a grid stride (``gy`` = one resident wave,
  ``quantize.RESIDENT_BLOCKS``); grouped ones visit ``blockIdx.y``'s tile (and a slice of its
  rows, ``2^split_log2`` slices) per tile step, quantizing only the row groups that hold some
  of the tile's rows (the others just write zero scale bytes). Loop trip counts are uniform
  across the block, so shuffles never run under divergence;
* the grouped variant finds the group owning a tile, the one whose tiles
  ``[tile0(g), tile0(g) + ceil(n_g / 128))`` with ``tile0(g) = expert_start[g] // 128 +
  scales_offsets[g]`` hold it (non-overlapping, checked on the host), with a warp scan over
  the groups (:func:`_owner_scan`), and reads its expert's tensor scale by expert id (D8);
  inactive groups (id -1) write zero rows and zero scales;
* ``aligned`` kernels (K % 8 == 0) move 16-byte bf16 vectors in and 4- or 8-byte vectors out;
  the other kernels use masked scalar accesses (any valid K, D7).

Numerics follow D2 exactly (see :mod:`blockscale.compiler.arch.convert` for the casts); the
amax is an integer max over |bits| so NaN and Inf are never dropped (D5).

Performance model (sm_90a, H200: 132 SMs, ~3.9 TB/s copy). The FP4 kernels were issue-bound:
33.5 SASS instructions per element in the row loop (21 on the half-rate ALU pipe: the
software E2M1 alone was ~17 per element), i.e. at most ~1.0 T elements/s against the 1.29 T/s
that 85% of the copy bandwidth needs (2.56 bytes moved per element). Now (dense, aligned):
NVFP4 16.6, MXFP4 ~17, MXFP8 ~10 instructions per element (ALU ~7.2 / 7.7 / 4.3), from the
fast E2M1 (:func:`convert.e2m1x8_pack_fast`, ~8.8 per element incl. the multiply and the
sign/nibble packing; ~7.6 since session 10, trading FMA-pipe for ALU work), 16 elements per
thread (one scale computation and no shuffle per NVFP4 block), the u16x2 amax (bf16x2 since
session 11), the shared reciprocal table (NVFP4) / exact power-of-two reciprocal (MX) instead
of a decode + div.rn per block. At the ~65% issue efficiency measured before,
that is ~1.3 T elements/s for FP4, at the roofline. Memory side (Little's law, ~1 us latency:
~30 KB in flight per SM): 40 registers -> 6 blocks x 256 threads x 32 bytes = 48 KB per SM,
and one wave of 792 blocks (the former 2048 blocks were 2.6-3.1 waves, the last one running
with a fraction of the bytes in flight). Predicted: NVFP4 / MXFP4 >= 85% of copy, MXFP8 ~85-90%.

Measured (H200, commit 2c1b00e): 16384^2 NVFP4 70 %, MXFP4 80 %, MXFP8 78 % of copy; 8192^2
71 / 79 / 86 %: MXFP8, at ~10 instructions per element, is far from issue-bound, so the loop
was latency-bound: a thread issued its row's loads only after the previous row's math, so
the 48 KB per SM were in flight only part of the time. The pipelined dense kernels
(``QuantizeSpec.pipeline`` P = 1..3, :mod:`blockscale.ops.quantize_pipe_ir`) keep P row
groups of loads in flight per thread (the next row's loads go out before this row's math;
unrolled by P, no register moves), hoist the row math (i32 rows, one multiply-add per load)
and store each chunk with one 8- / 16-byte store. Static SASS of the row loop per element
(incl. the cold NaN branch), registers (all without spills), blocks per SM:
NVFP4 p1 17.2 (39 regs, 6), p2 17.2 (40, 6), p3 17.2 (47, 5) — hot path ~14 (base 19.2 / ~16.6);
MXFP4 p1-p3 14.9-15.1 (base 17.1); MXFP4 ``bf16x2`` (E2M1 on bf16 pairs, exact for the
power-of-two MX reciprocals) "up" 11.1-11.3 (32 / 37 / 45 regs), "even"/"floor" 11.6-11.9;
MXFP8 p1-p3 7.9 (base 9.9). Loads in flight per SM during the math: p2 6 x 256 x 32 B =
48 KB, p3 5 x 256 x 64 B = 80 KB, all the time (base and p1: 48 KB only between a row's loads
and its math). Predicted: MXFP8 p2/p3 >= 90 %, MXFP4 bf16x2
p2/p3 ~88-90 %, NVFP4 p2/p3 ~85 % (issue at ~14 per element needs ~60 % of the SMs' issue
slots at 85 % of copy), p1 ~ base (same load order, ~10 % fewer instructions).

Grouped and fused-activation kernels (sm_90a; SASS of the row loop, static, per element, incl.
its cold branches; same count for dense: NVFP4 19.2, MXFP4 17.1, MXFP8 9.9). They had 8
elements per thread, one 16-byte load in flight, an amax shuffle and a decode + div.rn per
8-element NVFP4 half block: grouped NVFP4 25.0 / MXFP4 20.9 / MXFP8 13.9, fused SiLU NVFP4
74.3 / MXFP4 71.5 / MXFP8 63.9 (H200, T=8192, K=4096, 64 experts: 39 / 40 / 54 % and
24 / 24 / 29 % of copy). Now they take the dense kernels' 16 elements per thread (aligned):
grouped 18.5 (19.6 before the per-tile reciprocal table) / 16.7 / 9.3 with 32 bytes in flight
per thread (capped at 48 registers: 5 blocks, 40 KB per SM; at 40 ptxas spilled into the row
loop); fused 67.7 / 65.9 / 58.5 with 64 bytes (capped at 64 registers: 4 blocks per SM as
before, its few spills outside the row loop). Before its first row load a block finds its
tile's group with a warp scan (~3 dependent L2 round trips; the binary search took ~8, ~2-3 us
per 64 KB block), and row groups past the tile's rows only write their zero scale bytes: with
uniform routing half of the 16384 padded row slots were padding, loaded (row 0), quantized and
dropped like data rows. Predicted (issue-bound before, so the padding skip is up to ~2x fewer
instructions per launch): grouped ~70-80 % of copy (at the dense kernels' level), fused ~40-50
% (exp_f32 + the sigmoid's div.rn are ~45 of the ~64 instructions issued per element: D10's
fixed sequence and the division's own range check, so the quantize part no longer bounds it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from mlir import ir
from mlir.dialects import arith, gpu, llvm, vector
from mlir.dialects import math as mmath

from blockscale.compiler import ir as B
from blockscale.compiler.arch import convert as C
from blockscale.compiler.arch import nvvm as NV
from blockscale.formats import RECIP_E2M1_MAX, Format
from blockscale.ops._expf_ir import exp_f32

if TYPE_CHECKING:
    from blockscale.ops.quantize import QuantizeSpec

BLOCK_THREADS = 256
#: register cap of the dense CUDA kernels (nvvm.maxnreg): 65536 / (6 * 256) rounded down to 8
MAX_REGISTERS = 40
#: register cap of the grouped CUDA kernels: 5 blocks of 256 threads per SM (they need 47-48;
#: at 40 ptxas spills loop invariants into the row loop)
MAX_REGISTERS_GROUPED = 48
#: register cap of the fused-activation CUDA kernels: 4 blocks of 256 threads per SM (they
#: would take 72-74 since the padding row groups are skipped: 3 blocks; at 64 their few spills
#: stay outside the row loop)
MAX_REGISTERS_FUSED = 64
#: register caps of the pipelined dense kernels (quantize_pipe_ir) by pipeline depth:
#: 6 / 6 / 5 blocks of 256 threads per SM (quantize.PIPELINE_BLOCKS_PER_SM; none spills)
MAX_REGISTERS_PIPELINE = {1: 40, 2: 40, 3: 48}
CHUNK = 8  # elements per thread per row


def _c32(v: int) -> ir.Value:
    return B.const(v, B.i32())


def _c64(v: int) -> ir.Value:
    return B.const(v, B.i64())


def _cf(v: float) -> ir.Value:
    return B.const(float(v), B.f32())


def _i64(v: ir.Value) -> ir.Value:
    return B.cast_int(v, B.i64())


def _vconst(values: list[int], elem: ir.Type) -> ir.Value:
    t = B.vec(len(values), elem)
    return arith.constant(t, ir.DenseElementsAttr.get(np.array(values, dtype=np.int32), type=t))


def _splat(v: ir.Value, n: int) -> ir.Value:
    return vector.broadcast(B.vec(n, v.type), v)


class _Ctx:
    """Per-kernel constants derived from the spec."""

    def __init__(self, spec: QuantizeSpec) -> None:
        self.spec = spec
        self.fmt = Format.from_name(spec.fmt)
        from blockscale.ops.quantize import chunk_elems

        self.chunk = chunk_elems(spec)  # elements per thread per row: 8 or 16
        self.lanes = self.fmt.block_size // self.chunk
        self.lanes_log2 = self.lanes.bit_length() - 1
        from blockscale.compiler.targets import GPUTarget

        self.target = GPUTarget.parse(spec.target)
        #: shared f32[128] of the dense NVFP4 reciprocal per scale byte (set by _body)
        self.recip_table: ir.Value | None = None


# ---- loading a chunk --------------------------------------------------------------------------


def _load_chunk_bits(k: _Ctx, buf: ir.Value, row_off: ir.Value, col0: ir.Value,
                     ncols: ir.Value, load_ok: ir.Value) -> list[ir.Value]:
    return _load_chunk(k, buf, row_off, col0, ncols, load_ok)[0]


def _load_chunk(k: _Ctx, buf: ir.Value, row_off: ir.Value, col0: ir.Value,
                ncols: ir.Value, load_ok: ir.Value) -> tuple[list[ir.Value], ir.Value | None]:
    """The f32 bit patterns (i32) of 8 bf16 at ``buf[row_off + col0 + e]``; 0 where invalid.

    Aligned kernels: one 16-byte ``vector.load`` from a clamped (always in-bounds) address,
    viewed as four bf16-pair words ``w`` (zeroed when invalid: 4 selects, not 8); element 2i is
    ``w << 16``, element 2i+1 is ``w & 0xFFFF0000`` (one instruction per element).
    Others: 8 scalar loads, each masked by ``col0 + e < ncols``.
    """
    i32 = B.i32()
    if k.spec.aligned:
        if load_ok is None:  # the caller's address is valid and no zeroing is wanted
            idx = arith.addi(row_off, col0)
        else:
            idx = arith.select(load_ok, arith.addi(row_off, col0), _c64(0))
        v = B.vector_load(B.vec(CHUNK, B.bf16()), buf, idx, alignment=16)
        words = vector.bitcast(B.vec(CHUNK // 2, i32), v)
        if load_ok is not None:
            words = arith.select(load_ok, words, C.const_like(words.type, 0))
        return widen_vector(words), words
    out = []
    for e in range(CHUNK):
        col = arith.addi(col0, _c64(e))
        ok = arith.andi(load_ok, arith.cmpi(arith.CmpIPredicate.ult, col, ncols))
        idx = arith.select(ok, arith.addi(row_off, col), _c64(0))
        v = B.load(buf, idx)
        b = arith.shli(arith.extui(i32, arith.bitcast(B.i16(), v)), _c32(16))
        out.append(arith.select(ok, b, _c32(0)))
    return out, None


def _activation(spec: QuantizeSpec, g: ir.Value, u: ir.Value) -> ir.Value:
    """The gated activation in f32 (D10): SILU ``(g * (1 / (1 + exp(-g)))) * u`` or the OAI
    clamped SwiGLU ``((u' + 1) * g') * (1 / (1 + exp(-(alpha * g'))))``; IEEE division; ``exp``
    is blockscale's :func:`~blockscale.activations.exp_f32` (``ops/_expf_ir.py``), not
    ``math.exp``, so every target computes the reference's bits."""
    one = _cf(1.0)
    if spec.activation == "silu":
        sig = arith.divf(one, arith.addf(one, exp_f32(arith.negf(g))))
        return arith.mulf(arith.mulf(g, sig), u)
    lim = _cf(spec.act_limit)
    g2 = arith.minimumf(g, lim)
    u2 = arith.minimumf(arith.maximumf(u, arith.negf(lim)), lim)
    sig = arith.divf(one, arith.addf(one, exp_f32(arith.negf(arith.mulf(_cf(spec.act_alpha), g2)))))
    return arith.mulf(arith.mulf(arith.addf(u2, one), g2), sig)


# ---- per-chunk quantization -------------------------------------------------------------------


def widen_words(words: list[ir.Value]) -> list[ir.Value]:
    """The f32 bit patterns of the bf16 pairs in i32 ``words`` (element 2i = ``w << 16``,
    2i + 1 = ``w & 0xFFFF0000``)."""
    return [v for w in words for v in (arith.shli(w, _c32(16)), arith.andi(w, _c32(-65536)))]


def widen_vector(words: ir.Value) -> list[ir.Value]:
    """:func:`widen_words` of a vector of i32 bf16-pair words."""
    return [v for i in range(words.type.shape[0]) for v in widen_words([B.extract(words, i)])]


def _block_amax_bits(k: _Ctx, bits: list[ir.Value], words: list[ir.Value] | None = None
                     ) -> ir.Value:
    """max |bits| over the chunk, then over the L lanes of the scale block (gpu.shuffle xor).

    With ``words`` (the loaded bf16-pair vectors) the max is taken on the 16-bit halves
    (CUDA: :func:`_amax_bf16x2`; else ``and 0x7FFF`` + unsigned max, as ``max.u16x2``): exact,
    as bf16 -> f32 is ``<< 16``."""
    if words and k.target.is_cuda:
        m = _amax_bf16x2(words)
    elif words:
        i16 = B.i16()
        m16 = None
        for wv in words:
            h = vector.bitcast(B.vec(2 * wv.type.shape[0], i16), wv)
            h = arith.andi(h, C.const_like(h.type, 0x7FFF))
            r = vector.reduction(i16, vector.CombiningKind.MAXUI, h)
            m16 = r if m16 is None else arith.maxui(m16, r)
        m = arith.shli(arith.extui(B.i32(), m16), _c32(16))
    else:
        mask = _c32(0x7FFFFFFF)
        m = arith.andi(bits[0], mask)
        for b in bits[1:]:
            m = arith.maxui(m, arith.andi(b, mask))
    width = _c32(k.target.warp_size)
    off = 1
    while off < k.lanes:
        other = gpu.shuffle(m, _c32(off), width, gpu.ShuffleMode.XOR)[0]
        m = arith.maxui(m, other)
        off *= 2
    return m


def _amax_bf16x2(words: list[ir.Value]) -> ir.Value:
    """CUDA form of the u16 amax: ``abs.bf16x2`` then ``max.NaN.bf16x2`` halving the vector
    with shuffles, then the word's two halves as an unsigned max of ``bits << 16`` and ``bits &
    0xFFFF0000``. The same bits for finite blocks (a float max of magnitudes is the unsigned max
    of their bits; +-0 are +0 after abs); a NaN or Inf gives bits >= 0x7F800000 (non-finite)
    either way. sm_90a SASS: the abs is an ``HFMA2.BF16_V2`` (FMA pipe), the max ``HMNMX2`` /
    three-input ``VHMNMX``; per 32 elements of the grouped NVFP4 ``wide_bulk2_x2`` hot path
    ALU 254 -> 224, FMA 157 -> 173: 1.3 % faster (ncu 4 %, ALU pipe 71.5 -> 69.3 %, run BR)."""
    bf16, i32 = B.bf16(), B.i32()
    m = None
    for wv in words:
        v = vector.bitcast(B.vec(2 * wv.type.shape[0], bf16), wv)
        # llvm.call_intrinsic: the NVVM lowering marks llvm.intr.fabs illegal (math.absf
        # would go through f32)
        h = llvm.call_intrinsic(v.type, f"llvm.fabs.v{v.type.shape[0]}bf16", [v], [], [])
        m = h if m is None else arith.maximumf(m, h)
    n = m.type.shape[0]
    while n > 2:
        n //= 2
        m = arith.maximumf(vector.shuffle(m, m, list(range(n))),
                           vector.shuffle(m, m, list(range(n, 2 * n))))
    w = vector.extract(vector.bitcast(B.vec(1, i32), m), [], [0])
    return arith.maxui(arith.shli(w, _c32(16)), arith.andi(w, _c32(-65536)))


def _scale_and_recip(k: _Ctx, amax_bits: ir.Value, tsf: ir.Value | None,
                     inv_tsf: ir.Value | None) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(scale byte i32, recip f32, decoded scale f32) of D2 for a finite block max."""
    amax = arith.bitcast(B.f32(), amax_bits)
    if k.fmt.is_mx:
        byte = C.e8m0_block_scale(amax, rounding=k.spec.rounding,
                                  elem_recip=float(k.fmt.scale_recip),
                                  elem_emax=k.fmt.elem_emax, target=k.target)
        sd = C.e8m0_to_f32(byte)
        # 1 / 2^(b-127) is the power of two 2^(127-b), exactly what div.rn gives: its bits are
        # (254 - b) << 23, except b = 254 (2^-127, the subnormal 0x00400000). The byte of a
        # finite amax is <= 254 (D5's 0xFF is selected later), so no division is needed.
        ebits = arith.shli(arith.subi(_c32(254), byte), _c32(23))
        ebits = arith.select(arith.cmpi(arith.CmpIPredicate.eq, byte, _c32(254)),
                             _c32(0x00400000), ebits)
        return byte, arith.bitcast(B.f32(), ebits), sd
    s = arith.mulf(tsf, arith.mulf(amax, _cf(RECIP_E2M1_MAX)))
    byte = C.convert(s, "f32", "e4m3", rounding="rn", target=k.target)
    sd = _e4m3_decode(k, byte)
    if k.recip_table is not None:  # the same D2 values, computed once per block (see _body)
        return byte, B.load(k.recip_table, arith.extui(B.i64(), byte)), sd
    return byte, _nvfp4_recip(byte, sd, inv_tsf), sd


def _e4m3_decode(k: _Ctx, byte: ir.Value) -> ir.Value:
    """The E4M3 scale byte (a satfinite result, <= 0x7E) as f32, exactly."""
    if k.target.is_cuda:
        # Its 7 bits placed at f32 bits 20..26 give 2^(e-127)(1 + m/8) (e != 0) or the
        # subnormal m * 2^-129; times 2^120 that is exactly the E4M3 value (2 instructions
        # instead of a software decode; CUDA f32 multiplies keep subnormal inputs).
        return arith.mulf(arith.bitcast(B.f32(), arith.shli(byte, _c32(20))), _cf(2.0 ** 120))
    return C.e4m3_to_f32(byte)


def _nvfp4_recip(byte: ir.Value, sd: ir.Value, inv_tsf: ir.Value) -> ir.Value:
    """D2's ``1 / (sd * (1 / tensor_sf))`` (div.rn), 0 for a zero scale (D1)."""
    recip = arith.divf(_cf(1.0), arith.mulf(sd, inv_tsf))
    zero = arith.cmpi(arith.CmpIPredicate.eq, byte, _c32(0))  # D1: decoded scale 0
    return arith.select(zero, _cf(0.0), recip)


def _fast_e2m1(k: _Ctx) -> bool:
    """Whether ``k``'s FP4 packing uses :func:`convert.e2m1x8_pack_fast` (sm_90a: no native
    E2M1 instruction; the software form made the kernels issue-bound). The quantize kernels
    only: the fused matmul-SwiGLU epilogue (mode "swiglu") keeps the software form, its PTX is
    held to contain no ``fma.rn.f32`` (D10's exp check) and the fast form uses exact fmas."""
    return k.target.name == "sm_90a" and k.spec.mode in ("dense", "grouped", "silu")


def _pack_fp4(k: _Ctx, xs: list[ir.Value], recip: ir.Value, sd: ir.Value,
              pairs: ir.Value | None = None) -> ir.Value:
    """Eight f32 -> i32 of packed E2M1 codes (element 2j in the low nibble of byte j).

    ``pairs``: optionally the vector<4xi32> of bf16-pair words ``xs`` were widened from (their
    sign bits; saves four ``prmt``)."""
    return _pack_fp4_all(k, [xs], recip, sd, [pairs])[0]


def _pack_fp4_all(k: _Ctx, xs_h: list[list[ir.Value]], recip: ir.Value, sd: ir.Value,
                  pairs_h: list[ir.Value | None]) -> list[ir.Value]:
    """:func:`_pack_fp4` of each 8-value sub-chunk of one scale block."""
    name = k.target.name
    if name == "gfx950" and k.fmt.is_mx:
        return [C.fp4x8_from_f32_scaled_gfx950(xs, sd) for xs in xs_h]
    if name == "sm_100a" or not _fast_e2m1(k):
        out = []
        for xs in xs_h:
            ys = [arith.mulf(x, recip) for x in xs]
            if name != "sm_100a":
                out.append(_pack_fp4_sw(ys))
                continue
            word = _c32(0)
            for j in range(4):
                byte = C.e2m1x2_from_f32_nvvm(ys[2 * j], ys[2 * j + 1])
                word = arith.ori(word, arith.shli(byte, _c32(8 * j)))
            out.append(word)
        return out
    if not all(p is not None for p in pairs_h):  # f32 values (the fused kernels)
        return _pack_fp4_min(k, xs_h, recip, pairs_h)
    words_h = [sign_words(xs, p) for xs, p in zip(xs_h, pairs_h)]
    r8 = arith.mulf(recip, _cf(0.125))  # exact: recip is a power of two (MX) or >= 2^-96
    if not k.fmt.is_mx:  # MX: recip = 2^(127-b) >= 2^-127, recip / 8 is exact, y never NaN
        words_h, r8 = _rare_recip_words(recip, r8, words_h)
        xs_h = _rewiden(words_h)  # from the (possibly) rescaled words
    return [C.e2m1x8_pack_fast(xs, r8, w) for xs, w in zip(xs_h, words_h)]


def _pack_fp4_min(k: _Ctx, xs_h: list[list[ir.Value]], recip: ir.Value,
                  pairs_h: list[ir.Value | None]) -> list[ir.Value]:
    """sm_90a fast E2M1 of ``y = x * recip`` saturated as ``min(|y|, 6)`` (one FMNMX an
    element, the abs an operand modifier): :func:`convert.e2m1x8_pack_unsat` of the clamped
    magnitudes. For f32 values (whose ``|x|`` the fused kernels' amax also takes: the
    ``FMUL.SAT`` form would materialize it) and as the saturating fallback of
    ``_quantize_wide_ir._pack_fp4_unsat``. Any reciprocal (no ``recip / 8``); NVFP4's +inf
    one: :func:`_nan_product_signs`."""
    words_h = [sign_words(xs, p) for xs, p in zip(xs_h, pairs_h)]
    if not k.fmt.is_mx:  # MX: recip = 2^(127-b) is finite, y is never NaN
        words_h = _nan_product_signs(recip, words_h)
        if all(p is not None for p in pairs_h):
            # x is re-widened from the (possibly) fixed words: -0 -> +0 still gives NaN.
            xs_h = _rewiden(words_h)
    six = _cf(6.0)
    return [C.e2m1x8_pack_unsat([arith.minnumf(mmath.absf(arith.mulf(x, recip)), six)
                                 for x in xs], w) for xs, w in zip(xs_h, words_h)]


def _rewiden(words_h: list[list[ir.Value]]) -> list[list[ir.Value]]:
    """The f32 values of each sub-chunk's bf16-pair words (after a rare branch changed them)."""
    return [[arith.bitcast(B.f32(), v) for v in widen_words(ws)] for ws in words_h]


#: NVFP4 reciprocals below this take :func:`_rare_recip_words`' rescaled path: ``recip / 8``
#: is then not always exact (``recip < 2^-123``; only with tensor_sf < ~2^-114)
RECIP_RESCALE_BELOW = 2.0 ** -96
#: the power of two the rare path moves from ``x`` to ``recip``
RECIP_RESCALE_LOG2 = 24


def _rare_recip_words(recip: ir.Value, r8: ir.Value, words_h: list[list[ir.Value]]
                      ) -> tuple[list[list[ir.Value]], ir.Value]:
    """The bf16-pair words and ``recip / 8`` for :func:`convert.e2m1x8_pack_fast`, fixed in a
    rarely taken, per-block uniform branch (no register cost in the hot path):

    * recip = +inf (NVFP4: ``sd * (1/tsf)`` underflowed): ``y = ±0 * inf`` is NaN, E2M1 code
      0x7 with the sign cleared; every other ``y`` is ±inf, code 7. ±0 halves become +2^-133
      (the least bf16 subnormal): ``u = sat(2^-133 * inf) = 1``, code 7, sign +;
    * 0 < recip < 2^-96 (only with tensor_sf < ~2^-114): ``recip / 8`` could round (below
      2^-123), so ``x`` moves 2^24 into the reciprocal: halves with an exponent field > 24
      lose 24 from it (exact), the others (``|x| < 2^-102``, ``|y| < 2^-198``: code 0) keep
      only their sign; ``x * 2^-24 * (recip * 2^21) = x * recip / 8`` exactly."""
    flat = [w for ws in words_h for w in ws]
    inf = arith.cmpf(arith.CmpFPredicate.OEQ, recip, _cf(np.inf))
    tiny = arith.andi(arith.cmpf(arith.CmpFPredicate.OLT, recip, _cf(RECIP_RESCALE_BELOW)),
                      arith.cmpf(arith.CmpFPredicate.OGT, recip, _cf(0.0)))
    br = B.if_(arith.ori(inf, tiny), [B.i32()] * len(flat) + [B.f32()])
    with br.then():
        fixed = []
        for w in flat:
            halves = []
            for sh in (0, 16):
                h = arith.andi(arith.shrui(w, _c32(sh)) if sh else w, _c32(0xFFFF))
                zero = arith.cmpi(arith.CmpIPredicate.eq, arith.andi(h, _c32(0x7FFF)), _c32(0))
                big = arith.cmpi(arith.CmpIPredicate.ugt, arith.andi(h, _c32(0x7F80)),
                                 _c32(RECIP_RESCALE_LOG2 << 7))
                scaled = arith.select(big, arith.subi(h, _c32(RECIP_RESCALE_LOG2 << 7)),
                                      arith.andi(h, _c32(0x8000)))
                h = arith.select(inf, arith.select(zero, _c32(1), h), scaled)
                halves.append(arith.shli(h, _c32(sh)) if sh else h)
            fixed.append(arith.ori(halves[0], halves[1]))
        # recip * 2^24 / 8: exact (every positive f32 times 2^21 is)
        br.yield_(*fixed, arith.select(inf, r8, arith.mulf(
            recip, _cf(2.0 ** (RECIP_RESCALE_LOG2 - 3)))))
    with br.else_():
        br.yield_(*flat, r8)
    res = list(br.results)
    n = len(words_h[0])
    return [res[i * n:(i + 1) * n] for i in range(len(words_h))], res[-1]


def sign_words(xs: list[ir.Value], pairs: ir.Value | None) -> list[ir.Value]:
    """The four bf16-pair words holding the signs of the eight f32 ``xs`` (sign(y) = sign(x)
    as recip >= +0) for :func:`convert.e2m1x8_pack_fast`: the words of ``pairs`` (the loaded
    vector<4xi32> the values were widened from), else ``prmt 0x7632`` of two f32 bit
    patterns (their upper halves)."""
    if pairs is not None:
        return [B.extract(pairs, i) for i in range(CHUNK // 2)]
    xb = [arith.bitcast(B.i32(), x) for x in xs]
    return [NV.byte_perm(xb[2 * i], xb[2 * i + 1], 0x7632) for i in range(CHUNK // 2)]


def _nan_product_signs(recip: ir.Value, words_h: list[list[ir.Value]]) -> list[list[ir.Value]]:
    """NVFP4 with recip = +inf (sd * (1/tsf) underflowing): x = ±0 gives y = 0 * inf = NaN,
    whose E2M1 code is 0x7 with the sign cleared (:func:`_pack_fp4_min` already gives
    magnitude 7 for NaN, min(NaN, 6) = 6). So clear the sign bit of -0 halves in the sign
    words: a rarely taken, per-block uniform branch that only touches these words (no
    register cost)."""
    flat = [w for ws in words_h for w in ws]
    br = B.if_(arith.cmpf(arith.CmpFPredicate.OEQ, recip, _cf(np.inf)), [B.i32()] * len(flat))
    with br.then():
        fixed = []
        for w in flat:
            lo0 = arith.cmpi(arith.CmpIPredicate.eq, arith.andi(w, _c32(0x7FFF)), _c32(0))
            hi0 = arith.cmpi(arith.CmpIPredicate.eq, arith.andi(w, _c32(0x7FFF0000)), _c32(0))
            clear = arith.ori(arith.select(lo0, _c32(0x8000), _c32(0)),
                              arith.select(hi0, _c32(-0x80000000), _c32(0)))
            fixed.append(arith.andi(w, arith.xori(clear, _c32(-1))))
        br.yield_(*fixed)
    with br.else_():
        br.yield_(*flat)
    res = list(br.results)
    n = len(words_h[0])
    return [res[i * n:(i + 1) * n] for i in range(len(words_h))]


def _pack_fp4_sw(ys: list[ir.Value]) -> ir.Value:
    """Eight f32 -> packed E2M1 word with the portable software conversion."""
    yv = vector.from_elements(B.vec(CHUNK, B.f32()), ys)
    codes = C.e2m1_from_f32_sw(yv)
    shifted = arith.shli(codes, _vconst([4 * e for e in range(CHUNK)], B.i32()))
    return vector.reduction(B.i32(), vector.CombiningKind.OR, shifted)


def _pack_e4m3(k: _Ctx, xs: list[ir.Value], recip: ir.Value) -> list[ir.Value]:
    """Eight f32 -> two i32 words of E4M3 bytes (element e in byte e % 4 of word e // 4)."""
    ys = [arith.mulf(x, recip) for x in xs]
    words = []
    for w in range(2):
        if k.target.is_cuda:
            lo = C.e4m3x2_from_f32_nvvm(ys[4 * w], ys[4 * w + 1])
            hi = C.e4m3x2_from_f32_nvvm(ys[4 * w + 2], ys[4 * w + 3])
            words.append(arith.ori(lo, arith.shli(hi, _c32(16))))
        else:
            yv = vector.from_elements(B.vec(4, B.f32()), ys[4 * w:4 * w + 4])
            codes = C.e4m3_from_f32_sw(yv)
            shifted = arith.shli(codes, _vconst([0, 8, 16, 24], B.i32()))
            words.append(vector.reduction(B.i32(), vector.CombiningKind.OR, shifted))
    return words


def _store_data(k: _Ctx, data: ir.Value, words: list[ir.Value], row: ir.Value, col0: ir.Value,
                ncols: ir.Value, row_ok: ir.Value) -> None:
    """Store the chunk's packed words at data row ``row`` (masked per byte when unaligned)."""
    per_elem = 1 if not k.fmt.is_fp4 else 2  # elements per byte
    row_bytes = ncols if not k.fmt.is_fp4 else arith.shrui(ncols, _c64(1))
    base = arith.addi(arith.muli(row, row_bytes), arith.divui(col0, _c64(per_elem)))
    nbytes = CHUNK // per_elem
    if k.spec.aligned:
        with B.when(row_ok):
            wv = vector.from_elements(B.vec(len(words), B.i32()), words)
            bv = vector.bitcast(B.vec(nbytes, B.i8()), wv)
            B.vector_store(bv, data, base, alignment=nbytes)
        return
    for b in range(nbytes):
        word = words[(b * 8) // 32]
        byte = arith.trunci(B.i8(), arith.shrui(word, _c32((b * 8) % 32)))
        col = arith.addi(col0, _c64(b * per_elem))
        ok = arith.andi(row_ok, arith.cmpi(arith.CmpIPredicate.ult, col, ncols))
        with B.when(ok):
            B.store(byte, data, arith.addi(base, _c64(b)))


def _scale_offset(k: _Ctx, srow: ir.Value, j: ir.Value, kblocks_row: ir.Value) -> ir.Value:
    """Byte offset of scale (srow, j): 5-D TCGEN (§1.3) or row-major ``srow * J + j``."""
    if k.spec.layout == "row_major":
        return arith.addi(arith.muli(srow, kblocks_row), j)
    d1 = arith.shrui(kblocks_row, _c64(2))  # kblocks padded to a multiple of 4
    tile = arith.shrui(srow, _c64(7))
    r128 = arith.andi(srow, _c64(127))
    atom = arith.addi(arith.muli(tile, d1), arith.shrui(j, _c64(2)))
    inner = arith.addi(arith.addi(arith.muli(arith.andi(r128, _c64(31)), _c64(16)),
                                  arith.muli(arith.shrui(r128, _c64(5)), _c64(4))),
                       arith.andi(j, _c64(3)))
    return arith.addi(arith.muli(atom, _c64(512)), inner)


# ---- group lookup (grouped / fused variants) -----------------------------------------------------


def _tile0(k: _Ctx, es: ir.Value, offs: ir.Value, g: ir.Value) -> ir.Value:
    """tile0(g) = expert_start[g] // 128 + scales_offsets[g] (i64)."""
    s = arith.extui(B.i64(), B.load(es, g))
    o = arith.extsi(B.i64(), B.load(offs, g))
    return arith.addi(arith.shrui(s, _c64(7)), o)


#: groups a lane tests per step of :func:`_owner_scan` (independent loads in flight)
SCAN_UNROLL = 4


def _owner_scan(k: _Ctx, kb: B.KernelBuilder, tile: ir.Value) -> ir.Value:
    """The group whose tiles ``[tile0(g), tile0(g) + ceil(n_g/128))`` hold ``tile`` (i64;
    0 when none, which then owns nothing), by a warp-parallel scan instead of the binary
    search: each lane tests SCAN_UNROLL groups per step with independent loads, one L2 round
    trip per ``warp_size * 4`` groups (G <= 128 on CUDA: one) instead of one dependent round
    trip per halving (6 for 64 experts, ~0.3-0.5 us each before the block's first row load);
    the warp takes the max of its lanes' finds with xor shuffles (uniform trip count: no
    shuffle under divergence). Non-empty groups do not overlap (checked on the host), so the
    owner is unique; unlike the binary search it needs no sorted tile0 of empty groups."""
    i64, i32 = B.i64(), B.i32()
    es, offs = kb.arg("expert_start"), kb.arg("scales_offsets")
    ng = arith.extui(i64, kb.arg("num_groups"))
    ws = k.target.warp_size
    per_step = ws * SCAN_UNROLL
    lane = arith.andi(B.cast_int(B.thread_idx(), i64), _c64(ws - 1))
    steps = arith.shrui(arith.addi(ng, _c64(per_step - 1)), _c64(per_step.bit_length() - 1))
    with B.for_range(0, steps, carry=[_c32(-1)]) as loop:
        found = loop.carried[0]
        base = arith.addi(arith.muli(B.cast_int(loop.iv, i64), _c64(per_step)), lane)
        for u in range(SCAN_UNROLL):
            g = arith.addi(base, _c64(u * ws))
            ok = arith.cmpi(arith.CmpIPredicate.ult, g, ng)
            gi = arith.select(ok, g, _c64(0))
            start = arith.extui(i64, B.load(es, gi))
            end = arith.extui(i64, B.load(es, arith.addi(gi, _c64(1))))
            t0 = arith.addi(arith.shrui(start, _c64(7)), arith.extsi(i64, B.load(offs, gi)))
            t1 = arith.addi(t0, arith.shrui(arith.addi(arith.subi(end, start), _c64(127)),
                                            _c64(7)))
            own = arith.andi(arith.andi(ok, arith.cmpi(arith.CmpIPredicate.sle, t0, tile)),
                             arith.cmpi(arith.CmpIPredicate.slt, tile, t1))
            found = arith.select(own, arith.trunci(i32, g), found)
        loop.yield_(found)
    found = loop.results[0]
    width = _c32(ws)
    off = 1
    while off < ws:
        found = arith.maxsi(found, gpu.shuffle(found, _c32(off), width, gpu.ShuffleMode.XOR)[0])
        off *= 2
    return arith.extui(i64, arith.maxsi(found, _c32(0)))


def _find_group(k: _Ctx, kb: B.KernelBuilder, tile: ir.Value, tile_ok: ir.Value, *,
                scan: bool = False) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """(row_base, rows_valid, active, expert) of the group owning 5-D tile ``tile``.

    Binary search for the last group g with tile0(g) <= tile (``search_steps`` halvings of
    [0, G)), or with ``scan`` the owner from :func:`_owner_scan` (the quantize kernels; the
    fused matmul-SwiGLU kernel keeps the binary search); the tile belongs to g when it lies
    in g's ceil(n_g/128) tiles. ``rows_valid`` is 0 for tiles no group owns; ``active`` is
    false for expert id -1 (its rows are written as 0).
    """
    es, offs, ids = kb.arg("expert_start"), kb.arg("scales_offsets"), kb.arg("expert_ids")
    if scan:
        g = _owner_scan(k, kb, tile)
    else:
        ngroups = arith.extui(B.i64(), kb.arg("num_groups"))
        with B.for_range(0, arith.extui(B.i64(), kb.arg("search_steps")),
                         carry=[_c64(0), ngroups]) as loop:
            lo, hi = loop.carried
            mid = arith.shrui(arith.addi(lo, hi), _c64(1))
            le = arith.cmpi(arith.CmpIPredicate.sle, _tile0(k, es, offs, mid), tile)
            loop.yield_(arith.select(le, mid, lo), arith.select(le, hi, mid))
        g = loop.results[0]
    t0 = _tile0(k, es, offs, g)
    start = arith.extui(B.i64(), B.load(es, g))
    end = arith.extui(B.i64(), B.load(es, arith.addi(g, _c64(1))))
    ntiles = arith.shrui(arith.addi(arith.subi(end, start), _c64(127)), _c64(7))
    rel = arith.subi(tile, t0)
    owns = arith.andi(arith.andi(tile_ok, arith.cmpi(arith.CmpIPredicate.sge, rel, _c64(0))),
                      arith.cmpi(arith.CmpIPredicate.slt, rel, ntiles))
    row_base = arith.addi(start, arith.muli(arith.select(owns, rel, _c64(0)), _c64(128)))
    left = arith.subi(end, row_base)
    rows_valid = arith.select(owns, arith.minsi(left, _c64(128)), _c64(0))
    expert = B.load(ids, g)
    active = arith.cmpi(arith.CmpIPredicate.sge, expert, _c32(0))
    expert = arith.select(active, expert, _c32(0))
    return row_base, rows_valid, active, expert


# ---- kernel ----------------------------------------------------------------------------------


def build(spec: QuantizeSpec) -> ir.Module:
    """The ``gpu.module`` of the quantize kernel described by ``spec`` (see module docstring)."""
    from blockscale.ops.quantize import kernel_args

    k = _Ctx(spec)
    with ir.Context(), ir.Location.unknown():
        with B.kernel_module(spec.kernel_name, spec.target, kernel_args(spec),
                             (BLOCK_THREADS, 1, 1)) as kb:
            if k.target.is_cuda:
                # 6 blocks of 256 threads per SM (launch_plan's RESIDENT_BLOCKS); the dense
                # kernels need 32-41 registers, none spills at 40 (grouped: 5 blocks at 48,
                # fused: 4 at 64).
                cap = {"dense": MAX_REGISTERS, "grouped": MAX_REGISTERS_GROUPED,
                       "silu": MAX_REGISTERS_FUSED}[spec.mode]
                if spec.pipeline:
                    cap = MAX_REGISTERS_PIPELINE[spec.pipeline]
                kb.func.attributes["nvvm.maxnreg"] = ir.IntegerAttr.get(B.i32(), cap)
            if spec.pipeline:
                from blockscale.ops import quantize_pipe_ir

                quantize_pipe_ir.build_body(k, kb)
            else:
                _body(k, kb)
        kb.module.operation.verify()
        return kb.module


class _Coords(NamedTuple):
    """A thread's place in the work decomposition (module docstring), i64 values.

    ``c``: its chunk (column ``col0``), ``j``: the chunk's scale block, ``lane0``: whether
    it is the block's first lane; ``ri``: its row in a group of ``2^rpb_log2`` rows;
    ``part``: the part (of ``rows_per_part`` rows) of tile ``tile_base`` (+ tile steps) its
    block covers in ``row_iters`` row groups; ``col_e_ok``: per element of the chunk, whether
    its column is < D (only when asked for)."""

    tid: ir.Value
    by: ir.Value
    ri: ir.Value
    rpb_log2: ir.Value
    j: ir.Value
    lane0: ir.Value
    chunk_ok: ir.Value
    col0: ir.Value
    col_ok: ir.Value
    col_e_ok: list[ir.Value]
    rows_per_part: ir.Value
    part: ir.Value
    tile_base: ir.Value
    row_iters: ir.Value

    def row(self, riter: ir.Value) -> ir.Value:
        """The thread's row in its tile in row-group iteration ``riter``."""
        return arith.addi(arith.addi(arith.muli(self.part, self.rows_per_part), self.ri),
                          arith.shli(riter, self.rpb_log2))


def _coords(k: _Ctx, kb: B.KernelBuilder, *, element_ok: bool = False) -> _Coords:
    """The thread's :class:`_Coords` from the launch scalars (``k`` = D columns,
    ``chunks_row``, ``cb_log2``, ``split_log2``) and the thread / block ids."""
    i64 = B.i64()
    a = kb.arg
    ncols = a("k")
    cb = arith.extui(i64, a("cb_log2"))
    split = arith.extui(i64, a("split_log2"))
    tid = B.cast_int(B.thread_idx(), i64)
    bx = B.cast_int(B.block_idx("x"), i64)
    by = B.cast_int(B.block_idx("y"), i64)
    ci = arith.andi(tid, arith.subi(arith.shli(_c64(1), cb), _c64(1)))
    ri = arith.shrui(tid, cb)
    rpb_log2 = arith.subi(_c64(8), cb)
    c = arith.ori(arith.shli(bx, cb), ci)
    j = arith.shrui(c, _c64(k.lanes_log2))
    lane0 = arith.cmpi(arith.CmpIPredicate.eq, arith.andi(c, _c64(k.lanes - 1)), _c64(0))
    chunk_ok = arith.cmpi(arith.CmpIPredicate.ult, c, a("chunks_row"))
    col0 = arith.muli(c, _c64(k.chunk))
    col_ok = arith.cmpi(arith.CmpIPredicate.ult, col0, ncols)
    col_e_ok = ([arith.cmpi(arith.CmpIPredicate.ult, arith.addi(col0, _c64(e)), ncols)
                 for e in range(k.chunk)] if element_ok else [])
    rows_per_part = arith.shrui(_c64(128), split)
    part = arith.andi(by, arith.subi(arith.shli(_c64(1), split), _c64(1)))
    tile_base = arith.shrui(by, split)
    row_iters = arith.shrui(rows_per_part, rpb_log2)
    return _Coords(tid, by, ri, rpb_log2, j, lane0, chunk_ok, col0, col_ok, col_e_ok,
                   rows_per_part, part, tile_base, row_iters)


def _body(k: _Ctx, kb: B.KernelBuilder) -> None:
    spec = k.spec
    grouped = spec.mode in ("grouped", "silu")
    i64 = B.i64()
    a = kb.arg
    m, ncols = a("m"), a("k")
    kblocks_row = a("kblocks_row")
    co = _coords(k, kb)
    tid, by, ri, rpb_log2 = co.tid, co.by, co.ri, co.rpb_log2
    j, lane0, chunk_ok, col0, col_ok = co.j, co.lane0, co.chunk_ok, co.col0, co.col_ok
    tile_base, row_iters = co.tile_base, co.row_iters
    in_stride = arith.shli(ncols, _c64(1)) if spec.mode == "silu" else ncols
    wide = k.chunk > CHUNK  # aligned quantize kernels: 16 elements, two sub-chunks of 8
    ld_cols: list[ir.Value] = []
    if wide:
        # Load columns of the sub-chunks: their own when valid, else the first column of this
        # chunk (valid) or of the scale block (0 when the whole block is padding).
        jcol = arith.muli(j, _c64(k.fmt.block_size))
        jcol = arith.select(arith.cmpi(arith.CmpIPredicate.ult, jcol, ncols), jcol, _c64(0))
        first = arith.select(col_ok, col0, jcol)
        for h in range(k.chunk // CHUNK):
            colh = arith.addi(col0, _c64(CHUNK * h))
            ld_cols.append(arith.select(arith.cmpi(arith.CmpIPredicate.ult, colh, ncols),
                                        colh, first))
    dense_inv_tsf = None
    if spec.mode == "dense" and not k.fmt.is_mx:
        dense_inv_tsf = arith.divf(_cf(1.0), a("tensor_sf"))
        if k.target.is_cuda:
            # recip depends only on the scale byte (<= 0x7E) and tensor_sf: its 127 values
            # (D2's division, zero guard) go to shared memory once per block; a block's
            # reciprocal is then one shared load instead of a decode, a multiply and a
            # div.rn (whose check-and-branch alone is 6 instructions).
            from blockscale.compiler.arch import tma

            table = tma.shared_buffer(kb, "128xf32", align=16)
            with B.when(arith.cmpi(arith.CmpIPredicate.ult, tid, _c64(128))):
                tb = arith.trunci(B.i32(), tid)
                B.store(_nvfp4_recip(tb, _e4m3_decode(k, tb), dense_inv_tsf), table, tid)
            gpu.barrier()
            k.recip_table = table

    s_jpart = arith.addi(arith.shli(arith.shrui(j, _c64(2)), _c64(9)), arith.andi(j, _c64(3)))
    def row(tile: ir.Value, tile_ok: ir.Value, row_base: ir.Value, rows_valid: ir.Value,
            active: ir.Value, tsf: ir.Value | None, inv_tsf: ir.Value | None,
            tile_soff: ir.Value, rr: ir.Value) -> None:
        """One row visit: row ``rr`` of tile ``tile``, this thread's chunk."""
        row_ok = arith.andi(tile_ok, arith.cmpi(arith.CmpIPredicate.slt, rr, rows_valid))
        drow = arith.addi(row_base, rr)
        srow = drow
        if spec.gather:
            gidx = arith.select(row_ok, drow, _c64(0))
            src = arith.extsi(i64, B.load(a("indices"), gidx))
            srow = arith.divui(src, arith.extui(i64, a("indices_divisor")))
        load_ok = arith.andi(arith.andi(row_ok, col_ok), active)
        if wide:
            # No zeroing: an invalid sub-chunk re-reads a valid one of the same scale
            # block (ld_cols), which leaves the block max unchanged; rows past M read row
            # 0; nothing of an invalid chunk is stored and its scale byte is masked; rows
            # of an inactive group (expert id -1) are quantized, then stored as zeros.
            row_off = arith.muli(arith.select(row_ok, srow, _c64(0)), in_stride)
        else:
            row_off = arith.muli(arith.select(load_ok, srow, _c64(0)), in_stride)
        if spec.mode == "silu":
            halves = []
            for h in range(k.chunk // CHUNK):
                colh = arith.addi(col0, _c64(CHUNK * h))
                okh = col_ok if h == 0 else arith.cmpi(arith.CmpIPredicate.ult, colh, ncols)
                lcol, lok = (ld_cols[h], None) if wide else (colh, load_ok)
                gb = _load_chunk_bits(k, a("x"), row_off, lcol, ncols, lok)
                ub = _load_chunk_bits(k, a("x"), arith.addi(row_off, ncols), lcol, ncols, lok)
                bits = []
                for gbit, ubit in zip(gb, ub):
                    z = _activation(spec, arith.bitcast(B.f32(), gbit),
                                    arith.bitcast(B.f32(), ubit))
                    bits.append(arith.bitcast(B.i32(), z))
                halves.append((colh, okh, bits, None))
            bits = [b for hv in halves for b in hv[2]]
        else:
            # k.chunk // 8 sub-chunks of 8 (dense aligned: 16 elements, two 16-byte loads
            # in flight per thread and one scale computation per NVFP4 block).
            halves = []
            for h in range(k.chunk // CHUNK):
                colh = arith.addi(col0, _c64(CHUNK * h))
                okh = col_ok if h == 0 else arith.cmpi(arith.CmpIPredicate.ult, colh, ncols)
                if wide:
                    hb, hw = _load_chunk(k, a("x"), row_off, ld_cols[h], ncols, None)
                else:
                    hb, hw = _load_chunk(k, a("x"), row_off, colh, ncols,
                                         arith.andi(load_ok, okh))
                halves.append((colh, okh, hb, hw))
            bits = [b for hv in halves for b in hv[2]]
        wlist = [hv[3] for hv in halves]
        amax = _block_amax_bits(k, bits, wlist if wide and spec.mode != "silu" else None)
        nonfinite = arith.cmpi(arith.CmpIPredicate.uge, amax, _c32(0x7F800000))
        safe_amax = arith.select(nonfinite, _c32(0), amax)
        byte, recip, sd = _scale_and_recip(k, safe_amax, tsf, inv_tsf)
        nan_byte = 0xFF if k.fmt.is_mx else 0x7F
        byte = arith.select(nonfinite, _c32(nan_byte), byte)
        xs_h = [[arith.bitcast(B.f32(), b) for b in hv[2]] for hv in halves]
        if k.fmt.is_fp4:
            packed = [[w] for w in _pack_fp4_all(k, xs_h, recip, sd, [hv[3] for hv in halves])]
        else:
            packed = [_pack_e4m3(k, xs, recip) for xs in xs_h]
        zero = nonfinite
        if wide and grouped:
            zero = arith.ori(nonfinite, arith.xori(active, B.const(True, B.i1())))
        for (colh, okh, _, _), words in zip(halves, packed):
            words = [arith.select(zero, _c32(0), w) for w in words]
            _store_data(k, a("data"), words, drow, colh, ncols, arith.andi(row_ok, okh))
        # Scale byte: the block's first lane writes it; padding slots get 0 (D7).
        has_data = arith.andi(row_ok, col_ok)
        sval = arith.trunci(B.i8(), arith.select(arith.andi(has_data, active), byte, _c32(0)))
        store_scale(tile_ok, tile_soff, rr, drow, row_ok, sval)

    def store_scale(tile_ok: ir.Value, tile_soff: ir.Value, rr: ir.Value, drow: ir.Value,
                    row_ok: ir.Value, sval: ir.Value) -> None:
        """Scale byte ``sval`` of row ``rr`` of the tile, by the block's first lane."""
        if spec.layout == "row_major":
            s_ok = arith.andi(arith.andi(lane0, chunk_ok), row_ok)
            soff = _scale_offset(k, drow, j, kblocks_row)
        else:
            s_ok = arith.andi(arith.andi(lane0, chunk_ok), tile_ok)
            # _scale_offset(tile * 128 + rr, j) with the tile and j parts hoisted (rr < 128)
            rpart = arith.ori(arith.shli(arith.andi(rr, _c64(31)), _c64(4)),
                              arith.shli(arith.shrui(rr, _c64(5)), _c64(2)))
            soff = arith.addi(arith.addi(tile_soff, s_jpart), rpart)
        with B.when(s_ok):
            B.store(sval, a("scales"), soff)

    if spec.mode == "dense":
        # Grid-stride loop over row groups of 2^rpb_log2 rows (all n_tiles * 128 padded rows):
        # the launch makes about one resident wave of blocks (launch_plan), each looping, so
        # there is no partial last wave (2048 equal blocks over ~660 slots left a 10% wave).
        n_groups = arith.shli(a("n_tiles"), arith.subi(_c64(7), rpb_log2))
        gy = B.cast_int(B.grid_dim("y"), i64)
        active = arith.constant(B.i1(), ir.BoolAttr.get(True))
        tsf = inv_tsf = None
        if not k.fmt.is_mx:
            tsf, inv_tsf = a("tensor_sf"), dense_inv_tsf
        with B.for_range(by, n_groups, gy) as gloop:
            row0 = arith.shli(B.cast_int(gloop.iv, i64), rpb_log2)
            tile = arith.shrui(row0, _c64(7))
            row_base = arith.shli(tile, _c64(7))
            left = arith.subi(m, row_base)
            rows_valid = arith.minsi(left, _c64(128))  # >= 1: tile < ceil(m / 128)
            tile_soff = arith.shli(arith.muli(tile, arith.shrui(kblocks_row, _c64(2))), _c64(9))
            tile_ok = arith.constant(B.i1(), ir.BoolAttr.get(True))
            row(tile, tile_ok, row_base, rows_valid, active, tsf, inv_tsf, tile_soff,
                arith.addi(arith.andi(row0, _c64(127)), ri))
        return

    tile_table = None
    if grouped and not k.fmt.is_mx and k.target.is_cuda:
        from blockscale.compiler.arch import tma

        tile_table = tma.shared_buffer(kb, "128xf32", align=16)
    with B.for_range(0, arith.extui(i64, a("tile_iters"))) as tloop:
        titer = B.cast_int(tloop.iv, i64)
        tile = arith.addi(tile_base, arith.muli(titer, a("tiles_per_step")))
        tile_soff = arith.shli(arith.muli(tile, arith.shrui(kblocks_row, _c64(2))), _c64(9))
        tile_ok = arith.cmpi(arith.CmpIPredicate.ult, tile, a("n_tiles"))
        tsf = inv_tsf = None
        if grouped:
            row_base, rows_valid, active, expert = _find_group(k, kb, tile, tile_ok,
                                                               scan=True)
            if not k.fmt.is_mx:
                v = B.load(a("tensor_sf"), B.cast_int(expert, B.index(), signed=True))
                tsf = arith.divf(_cf(1.0), v) if spec.mode == "silu" else v
                inv_tsf = arith.divf(_cf(1.0), tsf)
                if tile_table is not None:
                    # The tile's expert fixes tensor_sf: its 127 D2 reciprocals go to shared
                    # memory once per tile (as the dense kernel's per launch), so a scale
                    # block's reciprocal is one shared load, not a decode, a multiply and a
                    # div.rn (~14 instructions incl. the division's range check; grouped NVFP4
                    # row loop 19.6 -> 18.5 per element, ~ +3-5 % predicted). The trip count
                    # and the group are uniform per block, so the barriers are too.
                    gpu.barrier()  # the previous tile's readers are done
                    with B.when(arith.cmpi(arith.CmpIPredicate.ult, tid, _c64(128))):
                        tb = arith.trunci(B.i32(), tid)
                        B.store(_nvfp4_recip(tb, _e4m3_decode(k, tb), inv_tsf), tile_table,
                                tid)
                    gpu.barrier()
                    k.recip_table = tile_table
        else:
            row_base = arith.shli(tile, _c64(7))
            left = arith.subi(m, row_base)
            rows_valid = arith.select(arith.cmpi(arith.CmpIPredicate.slt, left, _c64(0)),
                                      _c64(0), arith.minsi(left, _c64(128)))
            active = arith.constant(B.i1(), ir.BoolAttr.get(True))
            if not k.fmt.is_mx:
                tsf, inv_tsf = a("tensor_sf"), dense_inv_tsf
        # Row groups holding at least one of the tile's rows_valid rows (block-uniform, so
        # shuffles stay convergent); the others only get their zero scale bytes. A group's
        # last tile is mostly padding and spare tiles have no rows: with uniform routing of
        # 8192 tokens to 64 experts, 8192 of the 16384 row slots hold data, and the padding
        # rows used to be loaded (row 0), quantized and dropped like data rows.
        first = arith.muli(co.part, co.rows_per_part)
        rpb = arith.shli(_c64(1), rpb_log2)
        todo = arith.maxsi(arith.subi(rows_valid, first), _c64(0))
        n_data = arith.minsi(arith.shrui(arith.addi(todo, arith.subi(rpb, _c64(1))), rpb_log2),
                             row_iters)
        with B.for_range(0, n_data) as rloop:
            rr = co.row(B.cast_int(rloop.iv, i64))
            row(tile, tile_ok, row_base, rows_valid, active, tsf, inv_tsf, tile_soff, rr)
        with B.for_range(n_data, row_iters) as ploop:
            rr = co.row(B.cast_int(ploop.iv, i64))
            store_scale(tile_ok, tile_soff, rr, arith.addi(row_base, rr),
                        B.const(False, B.i1()), arith.trunci(B.i8(), _c32(0)))

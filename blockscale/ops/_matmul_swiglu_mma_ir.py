"""IR of the sm_90a MXFP8 fused grouped matmul + gated activation + quantize kernel (issue #10).

Imports MLIR: only :func:`blockscale.ops.matmul_swiglu.build` imports this module, lazily.

Why a second fused kernel
-------------------------
The chained MXFP8 path on sm_90a computes gate/up with the tensor-core grouped matmul
(:mod:`blockscale.ops.matmul_grouped_sm90` -> :func:`blockscale.ops._mma_ir.emit_mainloop`):
per 32-element block j, two chained ``mma.sync.m16n8k16.f32.f16.f16.f32`` on E4M3 -> f16
operands (``cvt.rn.f16x2.e4m3x2``, exact) starting from +0, then ``acc = fma(blk, sA * sB,
acc)``. The portable fused kernel (:mod:`blockscale.ops._matmul_swiglu_ir`) sums the block's
32 exact products with 31 sequential ``add.rn.f32`` instead. For FP4 both block sums are exact
(tests/test_matmul_common.py), so the two agree bit for bit; for E4M3 x E4M3 the products
span up to 2^36 and the sum rounds, and how it rounds is the tensor core's own business: the
PTX ISA leaves the order and internal precision of the MMA sum unspecified, and the H200's
HMMA aligns and truncates differently from 31 RNE adds (and from the interpreter's model,
which rounds once per MMA). So on the H200 a few of ~2M MXFP8 bytes differed.

The only construction that is equal on any hardware is to issue, for every gate/up
accumulator, the same hardware operations in the same order with the same operands. This
kernel therefore *calls the chained kernel's mainloop* (:func:`_mma_ir.emit_mainloop`, same
:class:`~blockscale.ops._mma_ir.Plan`, same 64 x 64 :class:`~blockscale.ops._mma_ir.Tiles`,
same :func:`blockscale.ops.matmul_sm90.tile_operand` operands) and differs only in which CTA
runs which (row tile, column tile) work item and in the epilogue. Per accumulator
``(m, n)`` (n a σ-permuted weight row: 2c = gate c, 2c + 1 = up c) both kernels execute:

1. for K-step s (4 scale blocks, ``ceil(K / 128)`` steps incl. a padded last one), block
   j = 4s + i: f16 fragments of A row m and B row n read from the same staged bytes with the
   same K permutation (lane t takes bytes 4t..4t+3 of each 16-byte half block); ``blk =
   mma(A_h1, B_h1, mma(A_h0, B_h0, +0))``; ``s = sA_j * sB_j`` (f32 mul, sA first; 0 for
   blocks past K); ``acc = fma(blk, s, acc)``, acc starting at +0;
2. the epilogue: ``v = acc * expert_scales[e]`` (f32, D10; no row scales for MX), ``bf16(v)``
   (``cvt.rn.bf16.f32``) — the chained grouped matmul stores exactly this bf16 and
   ``fused_silu_quantize`` loads it back;
3. the activation, amax, E8M0 scale, reciprocal and E4M3 cast of ``fused_silu_quantize`` (the
   same :mod:`blockscale.ops.quantize_ir` helpers, as in the portable fused kernel).

The CTA placement cannot change a result: an MMA's element (i, j) depends only on A row i,
B column j and C (i, j), which are the same values here; the work items are also the same
sets of rows and columns (a 64-row half of a group's 128-row scale tile <-> the chained
kernel's 64-row group tile; a 64-weight-row column tile = one MXFP8 output block of 32
columns). ``tests/test_matmul_swiglu_mma.py`` records every ``mma.sync`` in the interpreter and
checks that both kernels issue the same multiset of (A, B, C, D) MMAs, besides byte equality.

Work decomposition (block 128 threads = 2 x 2 warps, each a 32 x 32 accumulator tile):
CTA ``(x, y)`` takes output scale block x (weight rows ``[64x, 64x + 64)``; x runs over the
5-D layout's padded K-blocks, ``4 * ceil(ceil(D / 32) / 4)``) and rows ``[64h, 64h + 64)`` of
5-D scale tile ``y >> 1`` (h = ``y & 1``). The tile's group comes from the quantize kernels'
binary search (:func:`quantize_ir._find_group`). The mainloop runs (CTA-uniform branch) only
for an active group's rows and a real K-block; every CTA writes its 64 rows' scale bytes
(0 for padding rows, padding K-blocks, spare tiles and id -1 groups, D7/D8) and the data bytes
of its valid rows (0 for id -1 groups). A row's block amax is reduced over the 4 lanes of a
quad (xor shuffles 1, 2) and the two column warps (shared memory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlir import ir
from mlir.dialects import arith, gpu

import blockscale.ops._mma_ir as X
import blockscale.ops.quantize_ir as Q
from blockscale.compiler import ir as B
from blockscale.compiler.arch import convert as C
from blockscale.layouts import SF_ATOM_ROWS
from blockscale.ops import matmul_sm90 as _dense

if TYPE_CHECKING:
    from blockscale.ops.matmul_swiglu import SwigluMmaSpec

#: weight rows (gate/up pairs) per CTA = 2 x the 32 output columns of one MXFP8 block
BN = 64
#: rows per CTA (half a 128-row scale tile)
BM = 64


def build(spec: SwigluMmaSpec) -> ir.Module:
    """The ``gpu.module`` of the sm_90a MXFP8 fused kernel described by ``spec``."""
    k = Q._Ctx(spec)  # type: ignore[arg-type]  # duck-typed: fmt, target, rounding, layout
    plan, tiles = X.Plan(spec.format), X.Tiles(BM, BN)
    if spec.format.block_size * 2 != BN or not spec.format.is_mx or spec.format.is_fp4:
        raise ValueError(f"the mma fused kernel is MXFP8 only, got fmt={spec.fmt}")
    with ir.Context(), ir.Location.unknown():
        with B.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
            _body(k, kb, plan, tiles)
        kb.module.operation.verify()
        return kb.module


def _body(k: Q._Ctx, kb: B.KernelBuilder, plan: X.Plan, tiles: X.Tiles) -> None:
    spec = k.spec
    i64, i32, f32 = B.i64(), B.i32(), B.f32()
    a = kb.arg
    c64, c32 = Q._c64, Q._c32
    smem = X.Smem.allocate(kb, plan, tiles)
    amax_smem = X.workgroup_buffer(kb, BM * tiles.warps_n, i32)
    kx = B.as_index(a("kdim"))  # matmul K
    d = a("d")  # output columns D (i64)
    n_w = B.mul(B.as_index(d), 2)  # weight rows per expert (2D)
    kblocks_out = arith.shrui(arith.addi(d, c64(31)), c64(5))  # ceil(D / 32)
    bx = B.cast_int(B.block_idx("x"), i64)
    by = B.cast_int(B.block_idx("y"), i64)
    tile = arith.shrui(by, c64(1))
    r0 = arith.muli(arith.andi(by, c64(1)), c64(BM))
    tile_ok = arith.cmpi(arith.CmpIPredicate.ult, tile, a("n_tiles"))
    row_base, rows_valid, active, expert = Q._find_group(k, kb, tile, tile_ok)
    j_ok = arith.cmpi(arith.CmpIPredicate.ult, bx, kblocks_out)
    rows_here = arith.subi(rows_valid, r0)  # valid rows of this CTA (may be <= 0)
    has_rows = arith.cmpi(arith.CmpIPredicate.sgt, rows_here, c64(0))
    run = arith.andi(arith.andi(active, j_ok), has_rows)  # CTA-uniform
    e = B.cast_int(expert, B.index(), signed=True)
    esc = B.load(a("expert_scales"), e)
    wc = X.WarpCoords.of(tiles)
    nacc = tiles.m_tiles * tiles.n_tiles * 4

    br = B.if_(run, [f32] * nacc)
    with br.then():
        # The chained grouped kernel's operands (matmul_grouped_sm90.build), for m0 = this
        # CTA's first row and n0 = its first weight row: same rows, same validity, same scales.
        m0 = B.as_index(arith.addi(row_base, r0))
        end = B.as_index(arith.addi(row_base, rows_valid))
        d1 = B.ceil_div(B.ceil_div(kx, plan.block), 4)
        srow0 = B.as_index(arith.addi(arith.shli(tile, c64(7)), r0))
        n0 = B.mul(B.as_index(bx), BN)
        w_row0 = B.add(B.mul(e, n_w), n0)
        b_srow0 = B.add(B.mul(B.mul(e, B.ceil_div(n_w, SF_ATOM_ROWS)), SF_ATOM_ROWS), n0)
        op_a = _dense.tile_operand(a("a"), a("sfa"), m0, m0, end, srow0, d1)
        op_b = _dense.tile_operand(a("w"), a("sfb"), w_row0, n0, n_w, b_srow0, d1)
        acc = X.emit_mainloop(plan, tiles, smem, wc, op_a, op_b, kx)
        br.yield_(*[v for row in acc for vals in row for v in vals])
    with br.else_():
        br.yield_(*[Q._cf(0.0)] * nacc)
    flat = list(br.results)

    def acc_at(mt: int, nt: int, i: int) -> ir.Value:
        return flat[(mt * tiles.n_tiles + nt) * 4 + i]

    def d10(v: ir.Value) -> ir.Value:  # the chained store: bf16(acc * expert_scale)
        return arith.extf(f32, arith.truncf(B.bf16(), arith.mulf(v, esc)))

    # Output column of n-tile nt for this lane: (col0 + 8 nt + 2t) / 2 (i64, in block bx)
    t64 = B.cast_int(wc.t, i64)
    ccol = [arith.addi(arith.muli(bx, c64(32)),
                       arith.addi(B.cast_int(B.udiv(wc.col0, 2), i64),
                                  arith.addi(c64(4 * nt), t64)))
            for nt in range(tiles.n_tiles)]
    col_ok = [arith.cmpi(arith.CmpIPredicate.ult, c, d) for c in ccol]
    wn = B.cast_int(B.urem(B.udiv(wc.tid, 32), tiles.warps_n), i64)  # column warp
    width = c32(32)
    rows = []  # per accumulator row of this lane: (local row, bits of its 4 z values)
    for mt in range(tiles.m_tiles):
        for hh in range(2):
            lrow = B.cast_int(wc.c_row(mt, 2 * hh), i64)
            bits = []
            for nt in range(tiles.n_tiles):
                z = Q._activation(spec, d10(acc_at(mt, nt, 2 * hh)),  # type: ignore[arg-type]
                                  d10(acc_at(mt, nt, 2 * hh + 1)))
                # columns past D: +0, as the chained kernel's amax never sees them
                bits.append(arith.select(col_ok[nt], arith.bitcast(i32, z), c32(0)))
            m = arith.andi(bits[0], c32(0x7FFFFFFF))
            for b in bits[1:]:
                m = arith.maxui(m, arith.andi(b, c32(0x7FFFFFFF)))
            for off in (1, 2):  # the quad's lanes hold the same row
                m = arith.maxui(m, gpu.shuffle(m, c32(off), width, gpu.ShuffleMode.XOR)[0])
            rows.append((lrow, bits, m))
    # the two column warps' halves of each row's block: exchange through shared memory
    lane_t0 = arith.cmpi(arith.CmpIPredicate.eq, t64, c64(0))
    for lrow, _, m in rows:
        with B.when(lane_t0):
            B.store(m, amax_smem, B.as_index(arith.addi(arith.muli(lrow, c64(2)), wn)))
    gpu.barrier()
    for lrow, bits, _ in rows:
        base = B.as_index(arith.muli(lrow, c64(2)))
        amax = arith.maxui(B.load(amax_smem, base), B.load(amax_smem, B.add(base, 1)))
        nonfinite = arith.cmpi(arith.CmpIPredicate.uge, amax, c32(0x7F800000))
        safe = arith.select(nonfinite, c32(0), amax)
        byte, recip, _sd = Q._scale_and_recip(k, safe, None, None)
        byte = arith.select(nonfinite, c32(0xFF), byte)
        ys = [arith.mulf(arith.bitcast(f32, b), recip) for b in bits]
        codes = []
        for p in range(0, len(ys), 2):  # cvt.rn.satfinite.e4m3x2.f32, as _pack_e4m3
            pair = C.e4m3x2_from_f32_nvvm(ys[p], ys[p + 1])
            codes += [arith.andi(pair, c32(0xFF)), arith.shrui(pair, c32(8))]
        rr = arith.addi(r0, lrow)  # row in the scale tile
        row_ok = arith.andi(arith.andi(tile_ok, j_ok),
                            arith.cmpi(arith.CmpIPredicate.slt, rr, rows_valid))
        drow = arith.addi(row_base, rr)
        for nt, code in enumerate(codes):
            with B.when(arith.andi(row_ok, col_ok[nt])):
                v = arith.select(active, arith.select(nonfinite, c32(0), code), c32(0))
                B.store(arith.trunci(B.i8(), v), a("data"),
                        B.as_index(arith.addi(arith.muli(drow, d), ccol[nt])))
        # scale byte: lane t = 0 of column warp 0 owns the row; padding slots get 0 (D7)
        sval = arith.select(arith.andi(row_ok, active), byte, c32(0))
        owner = arith.andi(arith.andi(lane_t0, arith.cmpi(arith.CmpIPredicate.eq, wn, c64(0))),
                           tile_ok)
        with B.when(owner):
            srow = arith.addi(arith.shli(tile, c64(7)), rr)
            B.store(arith.trunci(B.i8(), sval), a("scales"),
                    B.as_index(Q._scale_offset(k, srow, bx, a("kblocks_row"))))

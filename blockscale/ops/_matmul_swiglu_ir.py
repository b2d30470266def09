"""IR of the fused grouped matmul + gated activation + quantize kernel (SEMANTICS §6, D10).

Imports MLIR: only :func:`blockscale.ops.matmul_swiglu.build` imports this module, lazily.

The kernel is the grouped quantize kernel of :mod:`blockscale.ops.quantize_ir` (mode "silu")
with its input load replaced by the grouped matmul: the work decomposition (8-column chunks,
128-row tiles, the tile -> group binary search, amax shuffles, scale bytes written by the
block's first lane, zero rows/tiles for expert id -1 and spare tiles) and every numeric helper
(activation, D2 scale and reciprocal, E2M1/E4M3 packing, stores) are quantize_ir's own. Where
the chained path loads bf16 ``gate``/``up`` from memory, a thread here computes, for each of
its 8 output columns c, the two fp32 block-scaled dot products with σ-permuted weight rows
``2c`` (gate) and ``2c + 1`` (up) of its group's expert, in one K loop
(:func:`blockscale.ops._matmul_ir.emit_block_scaled_dots`, the grouped matmul's K loop), then

    g = f32(bf16(acc_gate * expert_scales[e] (* a_row_scales[m])))        (D10, in that order)
    u = f32(bf16(acc_up   * expert_scales[e] (* a_row_scales[m])))

which are the bits the chained path reads back from the grouped matmul's bf16 output. So the
fused kernel is byte-identical to grouped matmul + fused SiLU quantize wherever the chained
matmul runs this K loop, and for FP4 also against the sm_90a tensor-core kernel (exact block
sums, see ``ops/_mma_ir.py``); both use the same ``exp_f32`` sequence of ``ops/_expf_ir.py``.
MXFP8 block sums round, so where the chained path runs the tensor-core kernel the op runs
:mod:`blockscale.ops._matmul_swiglu_mma_ir` instead (issue #10). The A scales of row m sit at the same padded 5-D row as the output
scales (``tile * 128 + row-in-tile``), so one group lookup serves both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlir import ir
from mlir.dialects import arith

import blockscale.ops._matmul_ir as mir
import blockscale.ops.quantize_ir as Q
from blockscale.compiler import ir as B

if TYPE_CHECKING:
    from blockscale.ops.matmul_swiglu import SwigluSpec

CHUNK = Q.CHUNK


def build(spec: SwigluSpec) -> ir.Module:
    """The ``gpu.module`` of the fused kernel described by ``spec``."""
    k = Q._Ctx(spec)  # type: ignore[arg-type]  # duck-typed: fmt, target, rounding, layout, ...
    with ir.Context(), ir.Location.unknown():
        with B.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
            _body(k, kb)
        kb.module.operation.verify()
        return kb.module


def _index(v: ir.Value) -> ir.Value:
    return B.cast_int(v, B.index())


class _KOffset:
    """``tcgen_kblock_offset(j)`` computed once per K step for all B rows."""

    def __init__(self) -> None:
        self._j: Any = None
        self._off: Any = None

    def __call__(self, j: ir.Value) -> ir.Value:
        if self._j is None or self._j != j:
            self._j, self._off = j, mir.tcgen_kblock_offset(j)
        return self._off


def _gate_up_values(k: Q._Ctx, kb: B.KernelBuilder, drow: ir.Value, srow5: ir.Value,
                    col0: ir.Value, ncols: ir.Value, expert: ir.Value, esc: ir.Value
                    ) -> list[ir.Value]:
    """The activation ``z`` (f32) of the chunk's 8 columns for data row ``drow`` (i64)."""
    spec, fmt = k.spec, k.fmt
    f32 = B.f32()
    a = kb.arg
    kx = _index(a("kdim"))
    kblocks = B.ceil_div(kx, fmt.block_size)
    d1 = B.ceil_div(kblocks, 4)
    row_bytes = B.udiv(kx, 2) if fmt.is_fp4 else kx
    n_w = B.mul(_index(ncols), 2)  # weight rows per expert (2D)
    e = B.cast_int(expert, B.index(), signed=True)
    w_row0 = B.mul(e, n_w)
    b_srow0 = B.mul(B.mul(e, B.ceil_div(n_w, 128)), 128)
    sfa_row = mir.tcgen_row_offset(_index(srow5), d1)
    koff = _KOffset()
    b_rows, sfb_offsets = [], []
    if spec.aligned:
        # D % 8 == 0: the chunk's 16 weight rows 2*col0 + r (2*col0 % 16 == 0) are consecutive
        # and share one 32-row group of the 5-D layout: row r's scales are 16 bytes further.
        n0 = B.mul(_index(col0), 2)
        b_row0 = B.mul(B.add(w_row0, n0), row_bytes)
        srow0 = mir.tcgen_row_offset(B.add(b_srow0, n0), d1)
        for r in range(2 * CHUNK):
            b_rows.append(B.add(b_row0, B.mul(row_bytes, r)))
            sfb_offsets.append(lambda j, r=r: B.add(B.add(srow0, 16 * r), koff(j)))
    else:
        last = B.sub(_index(ncols), 1)
        for i in range(CHUNK):
            col = B.umin(B.add(_index(col0), i), last)  # a partial chunk's extra columns: masked
            for half in (0, 1):  # σ-permuted rows: 2c = gate c, 2c + 1 = up c
                n = B.add(B.mul(col, 2), half)
                b_rows.append(B.mul(B.add(w_row0, n), row_bytes))
                srow = mir.tcgen_row_offset(B.add(b_srow0, n), d1)
                sfb_offsets.append(lambda j, srow=srow: B.add(srow, koff(j)))
    accs = mir.emit_block_scaled_dots(
        fmt, a=a("a"), a_row=B.mul(_index(drow), row_bytes), b=a("w"), b_rows=b_rows,
        sfa=a("sfa"), sfa_offset=lambda j: B.add(sfa_row, koff(j)), sfb=a("sfb"),
        sfb_offsets=sfb_offsets, k=kx)
    row_scale = None
    if spec.row_scales:
        row_scale = arith.extf(f32, B.load(a("a_row_scales"), _index(drow)))

    def d10(acc: ir.Value) -> ir.Value:  # expert scale, then row scale, in f32; bf16 round trip
        v = arith.mulf(acc, esc)
        if row_scale is not None:
            v = arith.mulf(v, row_scale)
        return arith.extf(f32, arith.truncf(B.bf16(), v))

    return [Q._activation(spec, d10(accs[2 * i]), d10(accs[2 * i + 1]))  # type: ignore[arg-type]
            for i in range(CHUNK)]


def _body(k: Q._Ctx, kb: B.KernelBuilder) -> None:
    fmt = k.fmt
    i64, f32 = B.i64(), B.f32()
    a = kb.arg
    c64, c32, cf = Q._c64, Q._c32, Q._cf
    ncols = a("k")  # D: output columns
    kblocks_row = a("kblocks_row")
    co = Q._coords(k, kb, element_ok=True)  # the quantize kernel's decomposition
    j, lane0, chunk_ok, col0 = co.j, co.lane0, co.chunk_ok, co.col0
    col_ok, col_e_ok = co.col_ok, co.col_e_ok

    with B.for_range(0, arith.extui(i64, a("tile_iters"))) as tloop:
        titer = B.cast_int(tloop.iv, i64)
        tile = arith.addi(co.tile_base, arith.muli(titer, a("tiles_per_step")))
        tile_ok = arith.cmpi(arith.CmpIPredicate.ult, tile, a("n_tiles"))
        row_base, rows_valid, active, expert = Q._find_group(k, kb, tile, tile_ok)
        e_idx = B.cast_int(expert, B.index(), signed=True)
        esc = B.load(a("expert_scales"), e_idx)
        tsf = inv_tsf = None
        if not fmt.is_mx:  # the chained path's chain: tsf = 1/input_scale, then 1/tsf (D2)
            tsf = arith.divf(cf(1.0), B.load(a("input_scales"), e_idx))
            inv_tsf = arith.divf(cf(1.0), tsf)
        with B.for_range(0, co.row_iters) as rloop:
            rr = co.row(B.cast_int(rloop.iv, i64))
            row_ok = arith.andi(tile_ok, arith.cmpi(arith.CmpIPredicate.slt, rr, rows_valid))
            drow = arith.addi(row_base, rr)
            load_ok = arith.andi(arith.andi(row_ok, col_ok), active)
            srow5 = arith.addi(arith.shli(tile, c64(7)), rr)
            br = B.if_(load_ok, [f32] * CHUNK)
            with br.then():
                br.yield_(*_gate_up_values(k, kb, drow, srow5, col0, ncols, expert, esc))
            with br.else_():
                br.yield_(*[cf(0.0)] * CHUNK)
            # columns past D hold the bits of act(0, 0) = +0 in the chained path: zero them
            bits = [arith.select(ok, arith.bitcast(B.i32(), z), c32(0))
                    for ok, z in zip(col_e_ok, br.results)]
            amax = Q._block_amax_bits(k, bits)
            nonfinite = arith.cmpi(arith.CmpIPredicate.uge, amax, c32(0x7F800000))
            safe_amax = arith.select(nonfinite, c32(0), amax)
            byte, recip, sd = Q._scale_and_recip(k, safe_amax, tsf, inv_tsf)
            byte = arith.select(nonfinite, c32(0xFF if fmt.is_mx else 0x7F), byte)
            xs = [arith.bitcast(f32, b) for b in bits]
            words = [Q._pack_fp4(k, xs, recip, sd)] if fmt.is_fp4 else Q._pack_e4m3(k, xs, recip)
            words = [arith.select(nonfinite, c32(0), w) for w in words]
            has_data = arith.andi(row_ok, col_ok)
            Q._store_data(k, a("data"), words, drow, col0, ncols, has_data)
            # scale byte: the block's first lane writes it; padding slots get 0 (D7)
            sval = arith.trunci(B.i8(), arith.select(arith.andi(has_data, active), byte, c32(0)))
            s_ok = arith.andi(arith.andi(lane0, chunk_ok), tile_ok)
            with B.when(s_ok):
                B.store(sval, a("scales"), Q._scale_offset(k, srow5, j, kblocks_row))

"""IR building blocks shared by the portable block-scaled matmul kernels.

Imports MLIR: only the ``build`` functions of :mod:`blockscale.ops.matmul` and
:mod:`blockscale.ops.matmul_grouped` import this module, lazily.

The K loop (:func:`emit_block_scaled_dot`) walks the K-blocks of one (row, column) pair:

* per K-block j it loads and decodes the two block scales once (|E4M3| with the sign bit
  masked, D3, or E8M0) and forms their exact product;
* FP4 (NVFP4, MXFP4): it walks the block's bytes, decoding both nibbles of an A byte and of a
  B byte to *integers* ``2 * e2m1`` in {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12} with a 32-bit lookup
  constant (``0xC8643210``: nibble i holds the value of code i), multiplies them and sums the
  block in int32. The block sum is exact (|sum| <= 32 * 144) and so is its product with
  ``|sA| * |sB| / 4``;
* MXFP8: it decodes each E4M3 byte to f32 (exact products, fp32 block sum);
* it adds the block term to the fp32 accumulator (sequential in j).

So the fp32 rounding happens only once per K-block for FP4 (see tests/test_matmul_common.py
for the bound this gives).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mlir import ir
from mlir.dialects import arith

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import convert
from blockscale.formats import Format
from blockscale.layouts import SF_ATOM_BYTES, SF_ATOM_KBLOCKS, SF_ATOM_ROWS

Value = ir.Value

#: nibble i (i = E2M1 magnitude code 0..7) holds 2 * e2m1(i): 0,1,2,3,4,6,8,12.
E2M1_TWICE_LUT = 0xC8643210


def tcgen_row_offset(r: Value, kblock_tiles: Value) -> Value:
    """Byte offset of row ``r``'s scales in the 5-D layout, K-block 0 (index values):
    ``(r//128) * D1 * 512 + (r%32) * 16 + ((r%128)//32) * 4`` (SEMANTICS §1.3)."""
    tile = bir.mul(bir.mul(bir.udiv(r, SF_ATOM_ROWS), kblock_tiles), SF_ATOM_BYTES)
    inner = bir.add(bir.mul(bir.urem(r, 32), 16), bir.mul(bir.udiv(bir.urem(r, 128), 32), 4))
    return bir.add(tile, inner)


def grouped_row_group(kb: Any, m: Value, groups: Value) -> tuple[Value, Value, Value]:
    """(group, active, expert id) of routed row ``m`` of a grouped kernel (args
    ``expert_start``, ``expert_ids``): the group counts the group ends ``expert_start[1..G]``
    that are <= m (clamped to G - 1); active: m lies in a group (m < expert_start[G]) whose
    expert id is >= 0."""
    es = kb.arg("expert_start")
    with bir.for_range(1, bir.add(groups, 1), carry=[bir.const(0)]) as gl:
        end = bir.as_index(bir.load(es, gl.iv))
        gl.yield_(bir.add(gl.carried[0], bir.select(bir.ule(end, m), bir.const(1), 0)))
    g = gl.results[0]
    g_safe = bir.umin(g, bir.sub(groups, 1))
    expert = bir.load(kb.arg("expert_ids"), g_safe)
    active = bir.logical_and(bir.ult(g, groups), arith.cmpi(
        arith.CmpIPredicate.sge, expert, bir.const(0, bir.i32())))
    return g_safe, active, expert


def grouped_a_scale_row(kb: Any, m: Value, g: Value) -> Value:
    """Routed row ``m``'s 5-D scale row in group ``g``'s padded tiles (SEMANTICS §5:
    ``(start // 128 + a_scale_offsets[g]) * 128 + m - start``)."""
    start = bir.as_index(bir.load(kb.arg("expert_start"), g))
    tile0 = bir.add(bir.udiv(start, SF_ATOM_ROWS),
                    bir.as_index(bir.load(kb.arg("a_scale_offsets"), g)))
    return bir.add(bir.mul(tile0, SF_ATOM_ROWS), bir.sub(m, start))


def grouped_b_scale_row(e: Value, n: Value, n_count: Value) -> Value:
    """Weight row ``(e, n)``'s 6-D scale row: expert e's ``ceil(N / 128)`` tiles, row n."""
    return bir.add(bir.mul(bir.mul(e, bir.ceil_div(n_count, SF_ATOM_ROWS)), SF_ATOM_ROWS), n)


def tcgen_kblock_offset(j: Value) -> Value:
    """Byte offset of K-block ``j`` within a row's 5-D scales: ``(j//4) * 512 + j%4``."""
    return bir.add(bir.mul(bir.udiv(j, SF_ATOM_KBLOCKS), SF_ATOM_BYTES),
                   bir.urem(j, SF_ATOM_KBLOCKS))


def load_byte_i32(buf: Value, idx: Value) -> Value:
    """``memref.load`` of an i8 buffer, zero-extended to i32."""
    return arith.extui(bir.i32(), bir.load(buf, idx))


def decode_scale(fmt: Format, byte_i32: Value) -> Value:
    """Decoded |block scale| as f32: E8M0 (MX) or E4M3 with the sign bit ignored (NVFP4, D3)."""
    if fmt.is_mx:
        return convert.e8m0_to_f32(byte_i32)
    return convert.e4m3_to_f32(bir.bit_and(byte_i32, 0x7F))


def _e2m1_twice(code: Value) -> Value:
    """Unsigned ``2 * |e2m1(code)|`` (i32) of a 4-bit code, via the lookup constant."""
    shift = bir.shl(bir.bit_and(code, 7), 2)
    return bir.bit_and(bir.shru(bir.const(E2M1_TWICE_LUT - (1 << 32), bir.i32()), shift), 0xF)


def fp4_code_product(ca: Value, cb: Value) -> Value:
    """``4 * e2m1(ca) * e2m1(cb)`` as a signed i32 (codes in the low 4 bits): exact."""
    prod = bir.mul(_e2m1_twice(ca), _e2m1_twice(cb))
    negative = bir.ne(bir.bit_and(arith.xori(ca, cb), 8), 0)
    return bir.select(negative, bir.sub(0, prod), prod)


def fp4x2_byte_dot(a_byte: Value, b_byte: Value) -> Value:
    """Both nibbles of two FP4x2 bytes (i32, 0..255): ``4 * (a0*b0 + a1*b1)`` as i32."""
    lo = fp4_code_product(bir.bit_and(a_byte, 0xF), bir.bit_and(b_byte, 0xF))
    hi = fp4_code_product(bir.shru(a_byte, 4), bir.shru(b_byte, 4))
    return bir.add(lo, hi)


def emit_block_scaled_dot(fmt: Format, *, a: Value, a_row: Value, b: Value, b_row: Value,
                          sfa: Value, sfa_offset: Callable[[Value], Value], sfb: Value,
                          sfb_offset: Callable[[Value], Value], k: Value) -> Value:
    """The fp32 block-scaled dot product of A row and B row over logical K (module docstring).

    Args:
        a, b: i8 data buffers; ``a_row`` / ``b_row`` the index of the row's first byte.
        sfa, sfb: i8 scale buffers; ``sfa_offset(j)`` / ``sfb_offset(j)`` give the byte index
            of the row's scale for K-block ``j`` (index values).
        k: logical K (index). FP4 needs K even; a partial last block is handled.
    Returns the f32 accumulator ``sum_j (block dot) * |sA_j| * |sB_j|``.
    """
    return emit_block_scaled_dots(fmt, a=a, a_row=a_row, b=b, b_rows=[b_row], sfa=sfa,
                                  sfa_offset=sfa_offset, sfb=sfb, sfb_offsets=[sfb_offset],
                                  k=k)[0]


def emit_block_scaled_dots(fmt: Format, *, a: Value, a_row: Value, b: Value,
                           b_rows: Sequence[Value], sfa: Value,
                           sfa_offset: Callable[[Value], Value], sfb: Value,
                           sfb_offsets: Sequence[Callable[[Value], Value]], k: Value
                           ) -> list[Value]:
    """The fp32 block-scaled dot products of one A row with several B rows, in one K loop.

    Each result is computed exactly as :func:`emit_block_scaled_dot` computes it alone (the
    same operations in the same order per B row); the A bytes and A scales are loaded once
    per K step for all rows. ``b_rows[i]`` / ``sfb_offsets[i]`` describe B row i.
    """
    if len(b_rows) != len(sfb_offsets) or not b_rows:
        raise ValueError(f"b_rows and sfb_offsets must be non-empty and of equal length, got "
                         f"{len(b_rows)} and {len(sfb_offsets)}")
    n = len(b_rows)
    bs = fmt.block_size
    f32 = bir.f32()
    kblocks = bir.ceil_div(k, bs)
    with bir.for_range(0, kblocks, carry=[bir.const(0.0, f32)] * n) as jl:
        j = jl.iv
        sa = decode_scale(fmt, load_byte_i32(sfa, sfa_offset(j)))
        sabs = [arith.mulf(sa, decode_scale(fmt, load_byte_i32(sfb, off(j))))  # exact
                for off in sfb_offsets]
        k0 = bir.mul(j, bs)
        k1 = bir.umin(bir.add(k0, bs), k)
        if fmt.is_fp4:
            with bir.for_range(bir.udiv(k0, 2), bir.udiv(k1, 2),
                               carry=[bir.const(0, bir.i32())] * n) as bl:
                a_byte = load_byte_i32(a, bir.add(a_row, bl.iv))
                bl.yield_(*[bir.add(bl.carried[i], fp4x2_byte_dot(
                    a_byte, load_byte_i32(b, bir.add(b_rows[i], bl.iv)))) for i in range(n)])
            blocks = [arith.sitofp(f32, r) for r in bl.results]  # exact: |sum| <= 4608
            # the int sum counts quarters: fold the exact 1/4 into the scale product
            sabs = [arith.mulf(s, bir.const(0.25, f32)) for s in sabs]
        else:
            with bir.for_range(k0, k1, carry=[bir.const(0.0, f32)] * n) as bl:
                av = convert.e4m3_to_f32(load_byte_i32(a, bir.add(a_row, bl.iv)))
                bl.yield_(*[arith.addf(bl.carried[i], arith.mulf(av, convert.e4m3_to_f32(
                    load_byte_i32(b, bir.add(b_rows[i], bl.iv))))) for i in range(n)])
            blocks = list(bl.results)
        jl.yield_(*[arith.addf(jl.carried[i], arith.mulf(blocks[i], sabs[i]))
                    for i in range(n)])
    return list(jl.results)


def scale_offsets(layout: str, a_row: Value, b_row: Value, kblocks: Value,
                  d1: Value | None = None
                  ) -> tuple[Callable[[Value], Value], Callable[[Value], Value]]:
    """``(sfa_offset, sfb_offset)`` for :func:`emit_block_scaled_dot`: ``j`` -> byte offset
    of K-block j's scale of A scale row ``a_row`` and B scale row ``b_row`` (index values).

    ``layout`` "tcgen5d": 5-D rows of ``d1`` = ceil(kblocks / 4) K-groups (computed here
    when not given); "row_major": rows of ``kblocks`` bytes."""
    if layout == "tcgen5d":
        d1 = bir.ceil_div(kblocks, 4) if d1 is None else d1
        a0, b0 = tcgen_row_offset(a_row, d1), tcgen_row_offset(b_row, d1)
        return (lambda j: bir.add(a0, tcgen_kblock_offset(j)),
                lambda j: bir.add(b0, tcgen_kblock_offset(j)))
    a0, b0 = bir.mul(a_row, kblocks), bir.mul(b_row, kblocks)
    return lambda j: bir.add(a0, j), lambda j: bir.add(b0, j)


def store_output(value: Value, c: Value, idx: Value, out_dtype: str) -> None:
    """Store an f32 ``value`` (or a value already of the output type) to ``c[idx]``; f32 ->
    bf16 is ``arith.truncf`` (round to nearest even, ``cvt.rn.bf16.f32`` on NVIDIA)."""
    want = bir.bf16() if out_dtype == "bfloat16" else bir.f32()
    if value.type != want:
        if value.type != bir.f32():
            raise TypeError(f"epilogue must return an f32 or {want} value, got {value.type}")
        value = arith.truncf(want, value)
    bir.store(value, c, idx)

"""The pipelined dense quantize kernel (``QuantizeSpec.pipeline >= 1``), for all targets.

Same work decomposition and numerics as the dense kernel of :mod:`blockscale.ops.quantize_ir`
(16-element chunks, ``2^cb_log2`` chunks per block row group, grid-stride loop over the
``n_tiles * 128 >> rpb_log2`` row groups, D2 chain, D5 / D7 handling), restricted to
K % 16 == 0 (every chunk is wholly valid or wholly padding), and built for streaming:

* ``pipeline = P`` row groups of loads in flight per thread: the loop carries the raw
  16-byte words of the next ``P - 1`` row groups, issues the loads of row group ``g + (P-1)
  gy`` before the math of row group ``g`` (P = 1: no prefetch, the same load-then-compute
  order as the base kernel), unrolled by P so the buffers rotate without register moves.
  Past the last row group the prefetch reads row 0 (valid, unused);
* address math hoisted: per row visit one row index (i32), a select for rows past M and a
  multiply-add; the load column (``col0``, or for a padding chunk of a partly valid MX block
  the block's first chunk, so the amax shuffle sees no padding) is fixed per thread;
* ``bf16x2`` (MXFP4 on sm_90a): the E2M1 rounding on bf16 pairs (:func:`e2m1x8_mx_bf16x2`);
* one vector store per chunk: 8 bytes (FP4, ``st.global.v2.u32``) or 16 bytes (MXFP8,
  ``st.global.v4.u32``) instead of one per 8-element half.

Register caps (CUDA, ``nvvm.maxnreg``) keep ``quantize.blocks_per_sm(spec)`` blocks of 256
threads resident; the launch makes that many blocks per SM (one wave, ``launch_plan``).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, gpu, vector

from blockscale.compiler import ir as B
from blockscale.ops import quantize_ir as Q

_c32, _c64 = Q._c32, Q._c64


def build_body(k: Q._Ctx, kb: B.KernelBuilder) -> None:
    """The pipelined dense kernel body (module docstring)."""
    spec = k.spec
    depth = spec.pipeline
    i32, i64 = B.i32(), B.i64()
    a = kb.arg
    m, ncols, kblocks_row = a("m"), a("k"), a("kblocks_row")
    co = Q._coords(k, kb)
    tid, j, lane0, chunk_ok, col0, col_ok = co.tid, co.j, co.lane0, co.chunk_ok, co.col0, co.col_ok
    # Load column: this chunk's when valid, else the first chunk of its scale block (valid
    # unless the whole block is padding; then column 0). K % 16 == 0: no partial chunks.
    jcol = arith.muli(j, _c64(k.fmt.block_size))
    jcol = arith.select(arith.cmpi(arith.CmpIPredicate.ult, jcol, ncols), jcol, _c64(0))
    ld_col = arith.select(col_ok, col0, jcol)

    tsf = inv_tsf = None
    if not k.fmt.is_mx:
        tsf = a("tensor_sf")
        inv_tsf = arith.divf(Q._cf(1.0), tsf)
        if k.target.is_cuda:  # the 127 D2 reciprocals in shared memory (as quantize_ir._body)
            from blockscale.compiler.arch import tma

            table = tma.shared_buffer(kb, "128xf32", align=16)
            with B.when(arith.cmpi(arith.CmpIPredicate.ult, tid, _c64(128))):
                tb = arith.trunci(i32, tid)
                B.store(Q._nvfp4_recip(tb, Q._e4m3_decode(k, tb), inv_tsf), table, tid)
            gpu.barrier()
            k.recip_table = table

    # Rows as i32 (m < 2^31 rows; offsets stay i64, D12).
    m32 = arith.trunci(i32, m)
    ri32 = arith.trunci(i32, co.ri)
    rpb_log2_32 = arith.trunci(i32, co.rpb_log2)
    by32 = arith.trunci(i32, co.by)
    gy32 = B.grid_dim("y")
    gy32 = B.cast_int(gy32, i32)
    row_step = arith.shli(gy32, rpb_log2_32)  # rows between a thread's row visits
    n_groups = arith.shli(a("n_tiles"), arith.subi(_c64(7), co.rpb_log2))
    tile_stride = arith.shli(arith.shrui(kblocks_row, _c64(2)), _c64(9))
    s_jpart = arith.addi(arith.shli(arith.shrui(j, _c64(2)), _c64(9)), arith.andi(j, _c64(3)))
    x = a("x")
    vt = B.vec(Q.CHUNK, B.bf16())
    wt = B.vec(Q.CHUNK // 2, i32)

    def load(row: ir.Value) -> list[ir.Value]:
        """The chunk's two 16-byte word vectors of ``row`` (i32; row 0 when row >= m)."""
        r = arith.select(arith.cmpi(arith.CmpIPredicate.slt, row, m32), row, _c32(0))
        base = arith.addi(arith.muli(arith.extui(i64, r), ncols), ld_col)
        return [vector.bitcast(wt, B.vector_load(vt, x, arith.addi(base, _c64(Q.CHUNK * h)),
                                                 alignment=16))
                for h in range(2)]

    def first_row(g: ir.Value) -> ir.Value:
        return arith.addi(arith.shli(g, rpb_log2_32), ri32)

    row0 = first_row(by32)
    ahead = [load(arith.addi(row0, arith.muli(row_step, _c32(d)))) for d in range(depth - 1)]
    args = (k, a, m32, tsf, inv_tsf, j, lane0, chunk_ok, col0, col_ok, ncols, kblocks_row,
            tile_stride, s_jpart)
    if depth == 1:
        with B.for_range(co.by, n_groups, B.cast_int(gy32, i64)) as loop:
            row = first_row(arith.trunci(i32, B.cast_int(loop.iv, i64)))
            _quantize_row(*args, row, load(row))
        return
    # Unrolled by ``depth``: sub-step d loads row group g + (d + depth - 1) gy into the
    # buffer that row group g + (d - 1) gy used, then quantizes row group g + d gy; after
    # ``depth`` sub-steps the carried buffers are back in their places (no register moves).
    # Sub-steps past the last row group skip the math (block-uniform condition).
    gy64 = B.cast_int(gy32, i64)
    with B.for_range(co.by, n_groups, arith.muli(gy64, _c64(depth)),
                     carry=[w for ws in ahead for w in ws]) as loop:
        g = B.cast_int(loop.iv, i64)
        bufs = [list(loop.carried[2 * d:2 * d + 2]) for d in range(depth - 1)]
        for d in range(depth):
            gd = arith.addi(g, arith.muli(gy64, _c64(d)))
            row = first_row(arith.trunci(i32, gd))
            bufs.append(load(arith.addi(row, arith.muli(row_step, _c32(depth - 1)))))
            cur = bufs.pop(0)
            if d == 0:
                _quantize_row(*args, row, cur)
            else:
                with B.when(arith.cmpi(arith.CmpIPredicate.ult, gd, n_groups)):
                    _quantize_row(*args, row, cur)
        loop.yield_(*[w for ws in bufs for w in ws])


def _quantize_row(k: Q._Ctx, a, m32, tsf, inv_tsf, j, lane0, chunk_ok, col0, col_ok, ncols,
                  kblocks_row, tile_stride, s_jpart, row, words) -> None:
    """Quantize this thread's chunk of ``row`` (i32) from its loaded ``words`` and store
    the data (one vector store) and, from the block's first lane, the scale byte."""
    i32, i64 = B.i32(), B.i64()
    row_ok = arith.cmpi(arith.CmpIPredicate.slt, row, m32)
    halves = [Q.widen_vector(w) for w in words]
    bits = halves[0] + halves[1]
    amax = Q._block_amax_bits(k, bits, words)
    nonfinite = arith.cmpi(arith.CmpIPredicate.uge, amax, _c32(0x7F800000))
    safe_amax = arith.select(nonfinite, _c32(0), amax)
    byte, recip, sd = Q._scale_and_recip(k, safe_amax, tsf, inv_tsf)
    byte = arith.select(nonfinite, _c32(0xFF if k.fmt.is_mx else 0x7F), byte)
    xs_h = [[arith.bitcast(B.f32(), b) for b in h] for h in halves]
    if k.spec.bf16x2:
        rbits = arith.bitcast(i32, recip)
        sat = k.spec.rounding != "up"
        out = [e2m1x8_mx_bf16x2(w, rbits, sat) for w in words]
    elif k.fmt.is_fp4:
        out = Q._pack_fp4_all(k, xs_h, recip, sd, list(words))
    else:
        out = [w for xs in xs_h for w in Q._pack_e4m3(k, xs, recip)]
    out = [arith.select(nonfinite, _c32(0), w) for w in out]
    row64 = arith.extui(i64, row)
    with B.when(arith.andi(row_ok, col_ok)):
        per_elem = 2 if k.fmt.is_fp4 else 1
        row_bytes = arith.shrui(ncols, _c64(per_elem - 1))
        base = arith.addi(arith.muli(row64, row_bytes), arith.shrui(col0, _c64(per_elem - 1)))
        nbytes = 4 * len(out)
        bv = vector.bitcast(B.vec(nbytes, B.i8()), vector.from_elements(B.vec(len(out), i32),
                                                                          out))
        B.vector_store(bv, a("data"), base, alignment=nbytes)
    sval = arith.trunci(B.i8(), arith.select(arith.andi(row_ok, col_ok), byte, _c32(0)))
    if k.spec.layout == "row_major":
        s_ok = arith.andi(arith.andi(lane0, chunk_ok), row_ok)
        soff = Q._scale_offset(k, row64, j, kblocks_row)
    else:
        s_ok = arith.andi(lane0, chunk_ok)
        rr = arith.andi(row64, _c64(127))
        rpart = arith.ori(arith.shli(arith.andi(rr, _c64(31)), _c64(4)),
                          arith.shli(arith.shrui(rr, _c64(5)), _c64(2)))
        tile_soff = arith.muli(arith.shrui(row64, _c64(7)), tile_stride)
        soff = arith.addi(arith.addi(tile_soff, s_jpart), rpart)
    with B.when(s_ok):
        B.store(sval, a("scales"), soff)


# ---- MXFP4 E2M1 on bf16x2 pairs (sm_90a, QuantizeSpec.bf16x2) --------------------------------


def _bf16_splat(n: int, value: float) -> ir.Value:
    t = B.vec(n, B.bf16())
    return arith.constant(t, ir.DenseElementsAttr.get_splat(t, ir.FloatAttr.get(B.bf16(),
                                                                                value)))


def _i16_splat(value: int) -> ir.Value:
    t = B.vec(8, B.i16())
    return arith.constant(t, ir.DenseElementsAttr.get_splat(t, ir.IntegerAttr.get(B.i16(),
                                                                                  value)))


def _fma(a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """``a * b + c`` with the contract flag (NVPTX: one fma.rn.bf16x2)."""
    fm = ir.Attribute.parse("#arith.fastmath<contract>")
    return arith.addf(arith.mulf(a, b, fastmath=fm), c, fastmath=fm)


def e2m1x8_mx_bf16x2(words: ir.Value, recip_bits: ir.Value, saturate: bool = True) -> ir.Value:
    """Eight bf16 (``words``: vector<4xi32> of bf16 pairs) times the MX reciprocal
    (``recip_bits``: the f32 bits of 2^(127-b)) -> one i32 of packed E2M1 codes (element 2j
    in the low nibble of byte j), bit-identical to the f32 chain of D2.

    MX reciprocals are powers of two, so ``y = x * recip`` is exact in bf16 as in f32 (a
    product below 2^-126 may lose bits as a bf16 subnormal, but |y| < 0.25 gives code 0 with
    x's sign either way), and the magnitude rounding of
    :func:`blockscale.compiler.arch.convert.e2m1x8_pack_fast` runs on bf16x2 pairs, two
    elements per instruction (``mul.rn.bf16x2``, ``min.bf16x2``, ``fma.rn.bf16x2``):

    * ``a = min(|y|, 6)`` (``saturate``; else ``a = y``, see the code); ``t = fma(a, a, 12)`` (bf16 rounding moves the binade switch only
      inside [1.99, 2] and [4.46, 4.48], where both grids give the same value);
      ``T = bits(t) & 0x7F80`` is 8, 16 or 32;
    * ``s = fma(T, 8, a)``: M = 8T (64, 128, 256) has the bf16 ulp of the E2M1 step there
      (0.5, 1, 2) and M / ulp = 128 is even: one RNE rounding to the grid with E2M1's ties;
      ``r = fma(T, -8, s)`` is the E2M1 value exactly;
    * ``r * 2^-126`` (a bf16 subnormal for r < 1) has the bits ``code << 6``: per pair word
      codes at bits 6 and 22; ``u = c | c >> 12`` puts the odd one at bit 10 (a byte at bits
      6..13), two ``prmt`` + one masked shift-merge place the four bytes, and the signs come
      from ``words`` (:func:`blockscale.compiler.arch.convert.e2m1x8_merge_signs`).
    """
    from blockscale.compiler.arch import nvvm as NV
    from blockscale.compiler.arch.convert import e2m1x8_merge_signs

    bf, i16, i32 = B.bf16(), B.i16(), B.i32()
    xv = vector.bitcast(B.vec(8, bf), words)
    r16 = arith.trunci(i16, arith.shrui(recip_bits, _c32(16)))
    rv = vector.bitcast(B.vec(8, bf), vector.broadcast(B.vec(8, i16), r16))
    y = arith.mulf(xv, rv)
    # |y| as an integer and (math.absf / math.fma on bf16 would become f32 libdevice calls);
    # the fmas are mul + add marked contract, which NVPTX fuses into fma.rn.bf16x2: fused or
    # not, every result below is the same (a * a may round first: t only picks the binade,
    # inside the ranges where both grids agree; T * 8 and r are exact).
    if saturate:
        ybits = vector.bitcast(B.vec(8, i16), y)
        a = arith.minimumf(vector.bitcast(B.vec(8, bf), arith.andi(ybits, _i16_splat(0x7FFF))),
                           _bf16_splat(8, 6.0))
        magic = 8.0  # M = 8T at the bottom of its binade
    else:
        # "up" scales give |y| <= 6 (2^ceil(log2 s) >= amax / 6 for every bf16 amax): no
        # saturation; the signed y is rounded around M = 12T, mid-binade (M / ulp = 192, even;
        # |y| <= 6 keeps s in M's binade; RNE is symmetric). r keeps y's sign: its sign bits
        # (15, 31 of the code words) fall outside the bytes the packing below keeps.
        a = y
        magic = 12.0
    t = _fma(a, a, _bf16_splat(8, 12.0))
    tb = vector.bitcast(B.vec(8, i16), t)
    big_t = vector.bitcast(B.vec(8, bf), arith.andi(tb, _i16_splat(0x7F80)))
    s = _fma(big_t, _bf16_splat(8, magic), a)
    r = _fma(big_t, _bf16_splat(8, -magic), s)
    c = vector.bitcast(B.vec(4, i32), arith.mulf(r, _bf16_splat(8, 2.0 ** -126)))
    u = []
    for i in range(4):
        ci = B.extract(c, i)
        u.append(arith.ori(ci, arith.shrui(ci, _c32(12))))
    t02 = NV.byte_perm(u[0], u[2], 0x5410)
    t13 = NV.byte_perm(u[1], u[3], 0x5410)
    word = arith.ori(arith.andi(arith.shrui(t02, _c32(6)), _c32(0x00FF00FF)),
                     arith.andi(arith.shli(t13, _c32(2)), _c32(-0x00FF0100)))
    return e2m1x8_merge_signs(word, [B.extract(words, i) for i in range(4)])

"""IR of the NVFP4 TMA quantize kernel (SEMANTICS §2.2 structure, D1-D7 math).

Imported lazily (needs MLIR); the spec and host side are in :mod:`blockscale.ops.quantize_async`.

One block of 160 threads quantizes one 128-row x 64-column tile of the bf16 input
(``grid = (K / 64, ceil(M / 128))``):

* warp 4 is the producer: its first lane initialises one mbarrier (1 arrival), fences the
  init for the async proxy, and after a block barrier arrives on it expecting 16384
  transaction bytes and issues the TMA load of the tile (``cp.async.bulk.tensor.2d``, 128-byte
  swizzle, zero fill past the tensor's last row) into a 1024-byte aligned shared tile;
* warps 0-3 are the consumers: thread ``r`` waits on the mbarrier (phase parity 0), then owns
  tile row ``r`` and its four 16-element scale blocks. It reads the row's eight 16-byte chunks
  at their swizzled places (chunk ``c`` of row ``r`` is at ``c ^ (r % 8)``, so the 8 rows a
  quarter-warp reads hit 8 distinct chunks: every 16-byte read is bank-conflict free);
* per block the D2 chain of the generic kernel (:func:`quantize_ir._scale_and_recip`,
  :func:`quantize_ir._pack_fp4`): amax as an integer max of |bits| (NaN/Inf -> D5), E4M3
  scale, IEEE ``1 / (sd * (1 / tensor_sf))``, zero guard on the decoded scale (D1);
* each block's 8 packed bytes go to global memory as soon as it is quantized (one 8-byte
  store; rows >= M are not stored), so only one block's values are live: 47 registers, 8
  blocks (128 KB of tiles in flight) per SM, where holding the whole 64-element row took 92-114
  registers and 3-4 blocks; its four scale bytes are one 32-bit word placed in a 512-byte shared atom at
  ``(r % 32) * 16 + (r / 32) * 4`` — the 5-D layout of §1.3 — and after a block barrier
  warp 0 writes the atom to global memory with one coalesced 16-byte store per lane.
  Padding rows read zeros, so their scale bytes are 0 (D7).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlir import ir
from mlir.dialects import arith, vector

from blockscale.compiler import ir as B
from blockscale.compiler.arch import tma
from blockscale.ops import quantize_ir as QI

if TYPE_CHECKING:
    from blockscale.ops.quantize_async import AsyncQuantizeSpec

TILE_ROWS = 128
TILE_COLS = 64
CONSUMERS = TILE_ROWS
PRODUCER = CONSUMERS  # first lane of warp 4
THREADS = CONSUMERS + 32


def _c32(v: int) -> ir.Value:
    return B.const(v, B.i32())


def _c64(v: int) -> ir.Value:
    return B.const(v, B.i64())


def build(spec: AsyncQuantizeSpec) -> ir.Module:
    """The ``gpu.module`` of the TMA quantize kernel for ``spec`` (see module docstring)."""
    from blockscale.ops.quantize import QuantizeSpec

    args = spec.args()
    generic = QuantizeSpec("nvfp4", spec.target)  # for the shared D2 helpers (target, format)
    with ir.Context(), ir.Location.unknown():
        with B.kernel_module(spec.kernel_name, spec.target, args, (THREADS, 1, 1)) as kb:
            _body(QI._Ctx(generic), kb, {a.name: a for a in args}["x_map"])
        kb.module.operation.verify()
        return kb.module


def _body(k: QI._Ctx, kb: B.KernelBuilder, x_map_arg: object) -> None:
    i64 = B.i64()
    a = kb.arg
    tile = tma.shared_buffer(kb, f"{TILE_ROWS}x{TILE_COLS}xbf16", align=1024)
    atom = tma.shared_buffer(kb, f"{CONSUMERS}xi32", align=16)
    table = tma.shared_buffer(kb, f"{CONSUMERS}xf32", align=16)
    bar = tma.mbarrier_group(1)
    desc = tma.descriptor(a("x_map"), x_map_arg)  # type: ignore[arg-type]
    tid = B.cast_int(B.thread_idx(), i64)
    ctile = B.cast_int(B.block_idx("x"), i64)
    rtile = B.cast_int(B.block_idx("y"), i64)
    is_producer = arith.cmpi(arith.CmpIPredicate.eq, tid, _c64(PRODUCER))
    is_consumer = arith.cmpi(arith.CmpIPredicate.ult, tid, _c64(CONSUMERS))

    with B.when(is_producer):
        tma.mbarrier_init(bar, 1)
        tma.fence_mbarrier_init()
    _barrier()
    with B.when(is_producer):
        tma.mbarrier_arrive_expect_tx(bar, x_map_arg.box_bytes)  # type: ignore[attr-defined]
        tma.tma_load(tile, desc, [arith.muli(ctile, _c64(TILE_COLS)),
                                  arith.muli(rtile, _c64(TILE_ROWS))], bar)

    m, ncols = a("m"), a("k")
    tsf = a("tensor_sf")
    inv_tsf = arith.divf(B.const(1.0, B.f32()), tsf)
    with B.when(is_consumer):
        # The 127 NVFP4 reciprocals per scale byte (D2, zero guard), one per consumer thread
        # while the tile is in flight; a block's reciprocal is then one shared load.
        tb = arith.trunci(B.i32(), tid)
        B.store(QI._nvfp4_recip(tb, QI._e4m3_decode(k, tb), inv_tsf), table, tid)
    _barrier()
    k.recip_table = table
    with B.when(is_consumer):
        tma.mbarrier_wait(bar, 0)
        row = arith.addi(arith.muli(rtile, _c64(TILE_ROWS)), tid)
        row_ok = arith.cmpi(arith.CmpIPredicate.ult, row, m)
        base = arith.addi(arith.muli(row, arith.shrui(ncols, _c64(1))),
                          arith.muli(ctile, _c64(TILE_COLS // 2)))
        scale_word = _c32(0)
        # Block by block, each stored at once (8 bytes): only one block's values are live
        # (the 64-element row at once needed 114 registers, 3 blocks per SM).
        for j in range(TILE_COLS // 16):
            (b0, w0), (b1, w1) = _read_chunk(tile, tid, 2 * j), _read_chunk(tile, tid, 2 * j + 1)
            w, byte = _quantize_block(k, b0 + b1, tsf, inv_tsf, [w0, w1])
            scale_word = arith.ori(scale_word, arith.shli(byte, _c32(8 * j)))
            with B.when(row_ok):
                v = vector.from_elements(B.vec(2, B.i32()), w)
                B.vector_store(vector.bitcast(B.vec(8, B.i8()), v), a("data"),
                               arith.addi(base, _c64(8 * j)), alignment=8)
        slot = arith.addi(arith.muli(arith.andi(tid, _c64(31)), _c64(4)),
                          arith.shrui(tid, _c64(5)))
        B.store(scale_word, atom, slot)
    _barrier()
    with B.when(arith.cmpi(arith.CmpIPredicate.ult, tid, _c64(32))):
        v = B.vector_load(B.vec(4, B.i32()), atom, arith.muli(tid, _c64(4)), alignment=16)
        d1 = arith.shrui(ncols, _c64(6))  # scale atoms per 128 rows: K / 64
        off = arith.addi(arith.muli(arith.addi(arith.muli(rtile, d1), ctile), _c64(512)),
                         arith.muli(tid, _c64(16)))
        B.vector_store(vector.bitcast(B.vec(16, B.i8()), v), a("scales"), off, alignment=16)


def _barrier() -> None:
    """``bar.sync 0`` for the whole block (``gpu.barrier``)."""
    from mlir.dialects import gpu

    gpu.barrier()


def _read_chunk(tile: ir.Value, r: ir.Value, c: int) -> tuple[list[ir.Value], ir.Value]:
    """The f32 bit patterns (i32) of the 8 bf16 of logical chunk ``c`` of tile row ``r``, and
    the four bf16-pair words: one 16-byte ``vector.load`` (``ld.shared.v4.u32``) at the
    swizzled chunk."""
    i32 = B.i32()
    phys = tma.swizzled_chunk(r, _c64(c))
    col = arith.muli(phys, _c64(8))
    op = vector.LoadOp(B.vec(8, B.bf16()), tile, [B.as_index(r), B.as_index(col)])
    op.attributes["alignment"] = ir.IntegerAttr.get(B.i64(), 16)
    words = vector.bitcast(B.vec(4, i32), op.result)
    return QI.widen_vector(words), words


def _quantize_block(k: QI._Ctx, bits: list[ir.Value], tsf: ir.Value, inv_tsf: ir.Value,
                    pairs: list[ir.Value]) -> tuple[list[ir.Value], ir.Value]:
    """16 f32 bit patterns of one scale block -> (two i32 words of packed E2M1, scale byte)."""
    mask = _c32(0x7FFFFFFF)
    amax = arith.andi(bits[0], mask)
    for b in bits[1:]:
        amax = arith.maxui(amax, arith.andi(b, mask))
    nonfinite = arith.cmpi(arith.CmpIPredicate.uge, amax, _c32(0x7F800000))
    safe = arith.select(nonfinite, _c32(0), amax)
    byte, recip, sd = QI._scale_and_recip(k, safe, tsf, inv_tsf)
    byte = arith.select(nonfinite, _c32(0x7F), byte)
    xs = [arith.bitcast(B.f32(), b) for b in bits]
    words = QI._pack_fp4_all(k, [xs[:8], xs[8:]], recip, sd, pairs)
    return [arith.select(nonfinite, _c32(0), w) for w in words], byte

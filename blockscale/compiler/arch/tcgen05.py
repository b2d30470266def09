"""NVVM 5th-generation tensor core helpers (sm_100a ``tcgen05``), used by the sm_100a
block-scaled matmul. Each docstring names the PTX instruction emitted.

What the helpers rely on, restated from the PTX ISA ("TensorCore 5th Generation Family
Instructions"):

* Tensor memory (TMEM): per CTA 128 lanes x 512 columns of 32-bit cells. An address is
  ``lane << 16 | column``. It is allocated in columns (a power of two >= 32) by one warp with
  ``tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [smem], ncols`` (the base address
  is written to shared memory) and must be freed with ``tcgen05.dealloc`` before exit.
* ``tcgen05.mma``, ``tcgen05.cp`` and ``tcgen05.commit`` are issued by one thread; they run
  asynchronously, in issue order with respect to each other (``cp -> mma`` and ``mma -> mma``
  on the same accumulator are implicitly pipelined). ``tcgen05.commit...mbarrier::arrive::one``
  makes an mbarrier track the completion of every prior async tcgen05 op of the thread.
  ``tcgen05.ld`` / ``tcgen05.wait::ld`` are warp-wide; warp ``w % 4`` of a warpgroup may access
  lanes ``32 (w % 4) .. 32 (w % 4) + 31`` only.
* Shared memory matrix descriptor (64 bits): bits 0-13 ``(start & 0x3FFFF) >> 4``, 16-29 LBO
  >> 4, 32-45 SBO >> 4, 46-48 the constant 0b001, 49-51 base offset, 52 LBO mode (0:
  relative), 61-63 swizzle (0 none, 1 128B/32B-atom, 2 128B, 4 64B, 6 32B). K-major without
  swizzle: core matrices of 8 rows x 16 bytes (row i at +16 i); the core matrix of row group
  ``g`` and 16-byte K chunk ``c`` starts at ``start + g * SBO + c * LBO``. FP4 elements are
  packed two per byte without padding (``.kind::mxf4`` / ``mxf4nvf4``), FP8 one per byte.
* Instruction descriptor (32 bits) of ``.kind::mxf8f6f4`` / ``mxf4`` / ``mxf4nvf4``: bits 4-5
  B scale-factor ID, 7-9 atype, 10-12 btype (E4M3 = 0 for mxf8f6f4; E2M1 = 1 for mxf4 /
  mxf4nvf4), 13 / 14 negate A / B, 15 / 16 transpose A / B (0: K-major), 17-22 N >> 3, 23
  scale type (UE4M3 = 0, UE8M0 = 1), 27-28 M >> 7, 29-30 A scale-factor ID, 31 K = 96 (0 here).
* ``tcgen05.mma.cta_group::1.kind::K.block_scale.scale_vec::V [d], adesc, bdesc, idesc,
  [sfa], [sfb], enable_input_d``: ``D[128 x N] = (A * sA) (B * sB) + (enable ? D : 0)``; A
  ``[128 x Kmma]`` and B ``[N x Kmma]`` K-major in shared memory, Kmma = 64 (FP4) or 32 (FP8),
  i.e. 32 bytes per row; D row ``m`` in TMEM lane ``m``, column ``d + n`` (f32). Scale vectors:
  ``scale_vec::4X`` (mxf4nvf4, blocks of 16: 4 scales per row), ``2X`` (mxf4, blocks of 32: 2
  scales), ``1X`` (mxf8f6f4: 1 scale). The scale factors of row ``r`` (A) or column ``r`` (B)
  are bytes of the 32-bit TMEM cell at lane ``r % 32`` (the matrix is duplicated in all four
  32-lane partitions), column ``sf + r // 32``; the ID selects the byte (1X: byte ID; 2X:
  bytes ID, ID + 1; 4X: bytes 0-3, ID 0). This is exactly where
  ``tcgen05.cp.cta_group::1.32x128b.warpx4`` puts one 512-byte SF atom of the 5-D TCGEN
  layout (row ``i2`` of 16 bytes -> lane ``i2`` of all four partitions, bytes ``4 i3 .. 4 i3
  + 3`` -> column ``i3``: rows ``32 i3 + i2``, K-blocks ``i4``), so one atom feeds one
  128-row tile for 4 K-blocks.

The numpy interpreter models these (:mod:`blockscale.runtime.interpreter.ops_tcgen05`).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, llvm, memref, nvvm

from blockscale.compiler.ir_types import _loc, i1, i32, i64

#: swizzle names -> descriptor bits 61-63
SWIZZLE_MODES = {"none": 0, "128b_base32b": 1, "128b": 2, "64b": 4, "32b": 6}
#: block-scaled MMA kinds: (PTX kind, atype/btype code, scale type bit, K per MMA,
#: scale vector size, scale factors per row per MMA)
KINDS = {
    "mxf4nvf4": (nvvm.MMABlockScaleKind.MXF4NVF4, 1, 0, 64, nvvm.Tcgen05MMABlockScale.BLOCK16,
                 4),
    "mxf4": (nvvm.MMABlockScaleKind.MXF4, 1, 1, 64, nvvm.Tcgen05MMABlockScale.BLOCK32, 2),
    "mxf8f6f4": (nvvm.MMABlockScaleKind.MXF8F6F4, 0, 1, 32, nvvm.Tcgen05MMABlockScale.BLOCK32,
                 1),
}
#: bytes of one row of A / B read by one MMA (64 E2M1 or 32 E4M3 elements)
MMA_ROW_BYTES = 32
#: TMEM columns: allocation granule and total
TMEM_MIN_COLS, TMEM_COLS = 32, 512


def smem_descriptor_bits(start: int, lbo: int, sbo: int, swizzle: str = "none",
                         base_offset: int = 0) -> int:
    """The 64-bit tcgen05 shared memory descriptor (unsigned int) of an operand at byte
    address ``start`` with leading / stride byte offsets ``lbo`` / ``sbo`` (multiples of 16
    below 2^18), ``swizzle`` (a key of :data:`SWIZZLE_MODES`) and the fixed bits 46-48 =
    0b001 (module docstring)."""
    for name, v in (("start", start), ("lbo", lbo), ("sbo", sbo)):
        if v % 16 or not 0 <= v < 1 << 18:
            raise ValueError(f"{name} must be a multiple of 16 in [0, 2^18), got {v}")
    if swizzle not in SWIZZLE_MODES:
        raise ValueError(f"swizzle must be one of {list(SWIZZLE_MODES)}, got {swizzle!r}")
    if not 0 <= base_offset < 8:
        raise ValueError(f"base_offset must be in [0, 8), got {base_offset}")
    return ((start >> 4) | (lbo >> 4) << 16 | (sbo >> 4) << 32 | 1 << 46 | base_offset << 49
            | SWIZZLE_MODES[swizzle] << 61)


def instr_descriptor_bits(kind: str, m: int, n: int, sfa_id: int = 0, sfb_id: int = 0) -> int:
    """The 32-bit instruction descriptor of a dense, K-major, unnegated block-scaled MMA of
    ``kind`` (a key of :data:`KINDS`), shape ``m x n``, scale-factor IDs ``sfa_id`` /
    ``sfb_id`` (module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    if m != 128:
        raise ValueError(f"m must be 128 (cta_group::1 block-scaled MMA), got {m}")
    if n % 16 or not 16 <= n <= 256:
        raise ValueError(f"n must be a multiple of 16 in [16, 256], got {n}")
    per = KINDS[kind][5]
    ids = {4: (0,), 2: (0, 2), 1: (0, 1, 2, 3)}[per]
    for name, v in (("sfa_id", sfa_id), ("sfb_id", sfb_id)):
        if v not in ids:
            raise ValueError(f"{name} must be one of {ids} for {kind}, got {v}")
    _, code, scale_type, *_ = KINDS[kind]
    return (sfb_id << 4 | code << 7 | code << 10 | (n >> 3) << 17 | scale_type << 23
            | (m >> 7) << 27 | sfa_id << 29)


def _i64c(v: int) -> ir.Value:
    v &= (1 << 64) - 1
    return arith.constant(i64(), ir.IntegerAttr.get(i64(), v - (1 << 64) if v >> 63 else v))


def _i32c(v: int) -> ir.Value:
    v &= (1 << 32) - 1
    return arith.constant(i32(), ir.IntegerAttr.get(i32(), v - (1 << 32) if v >> 31 else v))


def shared_address(buf: ir.Value, *, loc: ir.Location | None = None) -> ir.Value:
    """The shared-window byte address (i64) of a workgroup memref's aligned base
    (``memref.extract_aligned_pointer_as_index``)."""
    with _loc(loc):
        return arith.index_castui(i64(), memref.extract_aligned_pointer_as_index(buf))


def shared_pointer(address: ir.Value, *, loc: ir.Location | None = None) -> ir.Value:
    """``!llvm.ptr<3>`` (shared::cta) of a shared byte address (i64) (``llvm.inttoptr``)."""
    with _loc(loc):
        return llvm.inttoptr(ir.Type.parse("!llvm.ptr<3>"), address)


def tmem_pointer(taddr: ir.Value, *, loc: ir.Location | None = None) -> ir.Value:
    """The ``!llvm.ptr<6>`` (tensor memory) of a TMEM address (i32 ``lane << 16 | column``)
    that the tcgen05 ops take (``llvm.inttoptr``; no instruction)."""
    with _loc(loc):
        return llvm.inttoptr(ir.Type.parse("!llvm.ptr<6>"), taddr)


def smem_descriptor(address: ir.Value, *, lbo: int, sbo: int, swizzle: str = "none",
                    loc: ir.Location | None = None) -> ir.Value:
    """The i64 shared memory descriptor of the operand at shared address ``address`` (i64, a
    multiple of 16): ``((address & 0x3FFFF) >> 4) | smem_descriptor_bits(0, lbo, sbo,
    swizzle)`` (``and.b64`` / ``shr.u64`` / ``or.b64``)."""
    with _loc(loc):
        lo = arith.shrui(arith.andi(address, _i64c(0x3FFFF)), _i64c(4))
        return arith.ori(lo, _i64c(smem_descriptor_bits(0, lbo, sbo, swizzle)))


def advance(desc: ir.Value, nbytes: int, *, loc: ir.Location | None = None) -> ir.Value:
    """``desc`` with its start address moved by ``nbytes`` (a multiple of 16; the 14-bit
    address field must not overflow): ``add.s64 desc, nbytes >> 4``."""
    if nbytes % 16:
        raise ValueError(f"nbytes must be a multiple of 16, got {nbytes}")
    with _loc(loc):
        return arith.addi(desc, _i64c(nbytes >> 4))


def alloc(slot: ir.Value, ncols: int, *, loc: ir.Location | None = None) -> None:
    """``tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [slot], ncols``: allocate
    ``ncols`` TMEM columns (a power of two in [32, 512]) and write their base address to the
    shared word at ``slot`` (``!llvm.ptr<3>``). One whole warp."""
    if ncols < TMEM_MIN_COLS or ncols > TMEM_COLS or ncols & (ncols - 1):
        raise ValueError(f"ncols must be a power of two in [32, 512], got {ncols}")
    with _loc(loc):
        nvvm.tcgen05_alloc(slot, _i32c(ncols))


def relinquish_alloc_permit(*, loc: ir.Location | None = None) -> None:
    """``tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned``: this CTA allocates no
    more TMEM. One whole warp."""
    with _loc(loc):
        nvvm.tcgen05_relinquish_alloc_permit()


def dealloc(taddr: ir.Value, ncols: int, *, loc: ir.Location | None = None) -> None:
    """``tcgen05.dealloc.cta_group::1.sync.aligned.b32 taddr, ncols``. One whole warp."""
    with _loc(loc):
        nvvm.tcgen05_dealloc(tmem_pointer(taddr), _i32c(ncols))


def fence_proxy_async_shared(*, loc: ir.Location | None = None) -> None:
    """``fence.proxy.async.shared::cta``: orders this thread's prior generic-proxy shared
    stores before later async-proxy (tcgen05.mma / tcgen05.cp) reads."""
    with _loc(loc):
        nvvm.fence_proxy(nvvm.ProxyKind.async_shared, space=nvvm.SharedSpace.shared_cta)


def fence_before_thread_sync(*, loc: ir.Location | None = None) -> None:
    """``tcgen05.fence::before_thread_sync``: orders this thread's prior tcgen05 ops before a
    following thread synchronization (bar.sync / mbarrier)."""
    with _loc(loc):
        nvvm.tcgen05_fence(nvvm.Tcgen05FenceKind.BEFORE_THREAD_SYNC)


def fence_after_thread_sync(*, loc: ir.Location | None = None) -> None:
    """``tcgen05.fence::after_thread_sync``: orders later tcgen05 ops after a preceding thread
    synchronization."""
    with _loc(loc):
        nvvm.tcgen05_fence(nvvm.Tcgen05FenceKind.AFTER_THREAD_SYNC)


def copy_scale_atom(taddr: ir.Value, desc: ir.Value, *, loc: ir.Location | None = None) -> None:
    """``tcgen05.cp.cta_group::1.32x128b.warpx4 [taddr], desc``: the 32 x 16-byte matrix at
    ``desc`` (one 512-byte SF atom: rows 16 bytes apart, SBO = 128) to lanes 0-31 of columns
    ``taddr .. taddr + 3``, duplicated into the four 32-lane partitions. One thread."""
    with _loc(loc):
        nvvm.tcgen05_cp(nvvm.Tcgen05CpShape.SHAPE_32x128b, tmem_pointer(taddr), desc,
                        multicast=nvvm.Tcgen05CpMulticast.WARPX4)


def mma_block_scale(kind: str, d: ir.Value, adesc: ir.Value, bdesc: ir.Value, idesc: int,
                    accumulate: ir.Value, sfa: ir.Value, sfb: ir.Value, *,
                    loc: ir.Location | None = None) -> None:
    """``tcgen05.mma.cta_group::1.kind::<kind>.block_scale.<block16|block32> [d], adesc,
    bdesc, idesc, [sfa], [sfb], accumulate`` (``block16`` = ``scale_vec::4X``, ``block32`` =
    ``2X`` for mxf4, ``1X`` for mxf8f6f4): ``D = (A sA)(B sB) + (accumulate ? D : 0)``. One
    thread. ``idesc`` from :func:`instr_descriptor_bits`; ``accumulate`` an i1."""
    ptx_kind, *_, block, _ = KINDS[kind]
    with _loc(loc):
        nvvm.tcgen05_mma_block_scale(ptx_kind, nvvm.CTAGroupKind.CTA_1, tmem_pointer(d), adesc,
                                     bdesc, _i32c(idesc), accumulate, tmem_pointer(sfa),
                                     tmem_pointer(sfb), block_scale=block)


def commit(mbarrier: ir.Value, *, loc: ir.Location | None = None) -> None:
    """``tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [mbarrier]``:
    one arrival on the mbarrier (``!llvm.ptr<3>``) once every prior async tcgen05 op of this
    thread has completed. One thread."""
    with _loc(loc):
        nvvm.tcgen05_commit(mbarrier)


def load_32x32b(taddr: ir.Value, num: int, *, loc: ir.Location | None = None) -> ir.Value:
    """``tcgen05.ld.sync.aligned.32x32b.x<num>.b32``: thread ``t`` of the warp gets the
    ``num`` cells of lane ``lane(taddr) + t``, columns ``col(taddr) .. + num - 1``, as
    ``vector<num x i32>``. Warp-wide; complete with :func:`wait_ld` before use."""
    if num not in (1, 2, 4, 8, 16, 32, 64, 128):
        raise ValueError(f"num must be a power of two in [1, 128], got {num}")
    with _loc(loc):
        t = i32() if num == 1 else ir.VectorType.get([num], i32())
        return nvvm.tcgen05_ld(t, nvvm.Tcgen05LdStShape.SHAPE_32X32B, tmem_pointer(taddr))


def wait_ld(*, loc: ir.Location | None = None) -> None:
    """``tcgen05.wait::ld.sync.aligned``: this thread's prior ``tcgen05.ld`` have landed."""
    with _loc(loc):
        nvvm.tcgen05_wait(nvvm.Tcgen05WaitKind.LOAD)


def mbarrier_init(bar: ir.Value, count: int, *, loc: ir.Location | None = None) -> None:
    """``mbarrier.init.shared::cta.b64 [bar], count`` (``bar``: ``!llvm.ptr<3>``). One thread."""
    with _loc(loc):
        nvvm.mbarrier_init(bar, _i32c(count))


def mbarrier_wait(bar: ir.Value, parity: ir.Value, *, ticks: int = 10_000_000,
                  loc: ir.Location | None = None) -> None:
    """Block until the phase of parity ``parity`` (i32, 0 or 1) of the mbarrier completed: a
    loop over ``mbarrier.try_wait.parity.shared::cta.b64``."""
    with _loc(loc):
        nvvm.mbarrier_try_wait_parity(bar, parity, _i32c(ticks))


def true() -> ir.Value:
    """An i1 true constant."""
    return arith.constant(i1(), ir.IntegerAttr.get(i1(), 1))


__all__ = ["KINDS", "MMA_ROW_BYTES", "SWIZZLE_MODES", "advance", "alloc", "commit",
           "copy_scale_atom", "dealloc", "fence_after_thread_sync", "fence_before_thread_sync",
           "fence_proxy_async_shared",
           "instr_descriptor_bits", "load_32x32b", "mbarrier_init", "mbarrier_wait",
           "mma_block_scale", "relinquish_alloc_permit", "shared_address", "shared_pointer",
           "smem_descriptor", "smem_descriptor_bits", "tmem_pointer", "true", "wait_ld"]

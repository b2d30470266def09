"""sm_90 bulk copies global -> shared and shared -> global (``cp.async.bulk``, non-tensor),
the pointer mbarriers that complete the former and the bulk groups that track the latter. Each docstring names the PTX emitted; the numpy interpreter
models them (:mod:`blockscale.runtime.interpreter.ops_cpasync`).

(The non-bulk ``cp.async`` of sm_80 is not used: its writes come from the generic proxy, so
a wgmma reading them needs ``fence.proxy.async``, which lowers to MEMBAR.ALL.CTA and waits
for the copies still in flight — on the H200 it serialised the two-phase matmul's first
pipeline, 1.5 ms instead of 0.5 ms.)
"""

from __future__ import annotations

from mlir import ir

from blockscale.compiler.ir_types import _loc

# ---- sm_90 bulk copies (cp.async.bulk, non-tensor) and pointer mbarriers -----------------------
#
# ``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], size,
# [mbar]`` (PTX ISA "cp.async.bulk"): one thread copies ``size`` contiguous bytes (a multiple
# of 16; both addresses 16-byte aligned) from global to shared memory through the async proxy
# (the copy engine; SASS UBLKCP), then completes ``size`` transaction bytes on the mbarrier.
# A wgmma (also the async proxy) may read the bytes once a wait observed the mbarrier's phase:
# no ``fence.proxy.async`` is needed. The CTA's shared::cta addresses are valid
# shared::cluster addresses of the CTA itself.


def _i32c(v: int) -> ir.Value:
    from mlir.dialects import arith

    t = ir.IntegerType.get_signless(32)
    return arith.constant(t, ir.IntegerAttr.get(t, v))


def _ptr(addr: ir.Value, space: int) -> ir.Value:
    from mlir.dialects import llvm

    return llvm.inttoptr(ir.Type.parse(f"!llvm.ptr<{space}>"), addr)


def global_address(buf: ir.Value, *, loc: ir.Location | None = None) -> ir.Value:
    """The generic (global) byte address of a global memref's aligned base, as i64
    (``memref.extract_aligned_pointer_as_index``: the kernel parameter)."""
    from mlir.dialects import arith, memref

    with _loc(loc):
        p = memref.extract_aligned_pointer_as_index(buf)
        return arith.index_castui(ir.IntegerType.get_signless(64), p)


def bulk_copy(dst_addr: ir.Value, src_addr: ir.Value, nbytes: int, mbar_addr: ir.Value, *,
              loc: ir.Location | None = None) -> None:
    """Copy ``nbytes`` (a multiple of 16) from global byte address ``src_addr`` (i64) to the
    shared byte address ``dst_addr`` (i64) and complete ``nbytes`` transaction bytes on the
    mbarrier at shared address ``mbar_addr`` (i64):
    ``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes``. One thread."""
    from mlir.dialects import nvvm

    if nbytes <= 0 or nbytes % 16:
        raise ValueError(f"nbytes must be a positive multiple of 16, got {nbytes}")
    with _loc(loc):
        nvvm.cp_async_bulk_shared_cluster_global(_ptr(dst_addr, 7), _ptr(src_addr, 1),
                                                 _ptr(mbar_addr, 3), _i32c(nbytes))


def prefetch_l2(addr: ir.Value, *, loc: ir.Location | None = None) -> None:
    """``prefetch.global.L2 [addr]``: bring the line holding global byte address ``addr``
    (i64) into L2. A per-thread hint (no register written)."""
    from mlir.dialects import nvvm

    with _loc(loc):
        nvvm.prefetch(_ptr(addr, 1), cache_level=nvvm.PrefetchCacheLevel.L2)


def bulk_copy_n(dst_addr: ir.Value, src_addr: ir.Value, nbytes: ir.Value, mbar_addr: ir.Value,
                *, loc: ir.Location | None = None) -> None:
    """:func:`bulk_copy` with a runtime byte count ``nbytes`` (an i32 value; the caller
    guarantees a positive multiple of 16 and 16-byte aligned addresses): the same
    ``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes``. One thread."""
    from mlir.dialects import nvvm

    with _loc(loc):
        nvvm.cp_async_bulk_shared_cluster_global(_ptr(dst_addr, 7), _ptr(src_addr, 1),
                                                 _ptr(mbar_addr, 3), nbytes)


def mbarrier_arrive_expect_tx_n(mbar_addr: ir.Value, nbytes: ir.Value, *,
                                loc: ir.Location | None = None) -> None:
    """:func:`mbarrier_arrive_expect_tx` with a runtime byte count ``nbytes`` (i32)."""
    from mlir.dialects import nvvm

    with _loc(loc):
        nvvm.mbarrier_arrive_expect_tx(None, _ptr(mbar_addr, 3), nbytes)


def mbarrier_init(mbar_addr: ir.Value, count: int, *, loc: ir.Location | None = None) -> None:
    """``mbarrier.init.shared.b64 [mbar], count`` (``mbar_addr``: i64 shared address)."""
    from mlir.dialects import nvvm

    with _loc(loc):
        nvvm.mbarrier_init(_ptr(mbar_addr, 3), _i32c(count))


def mbarrier_arrive_expect_tx(mbar_addr: ir.Value, nbytes: int, *,
                              loc: ir.Location | None = None) -> None:
    """Expect ``nbytes`` more transaction bytes, then arrive:
    ``mbarrier.arrive.expect_tx.shared.b64 _, [mbar], nbytes``."""
    from mlir.dialects import nvvm

    with _loc(loc):
        nvvm.mbarrier_arrive_expect_tx(None, _ptr(mbar_addr, 3), _i32c(nbytes))


def mbarrier_arrive(mbar_addr: ir.Value, *, loc: ir.Location | None = None) -> None:
    """One arrival: ``mbarrier.arrive.shared.b64 _, [mbar]``."""
    from mlir.dialects import nvvm

    with _loc(loc):
        nvvm.mbarrier_arrive(ir.IntegerType.get_signless(64), _ptr(mbar_addr, 3))


def mbarrier_wait(mbar_addr: ir.Value, parity: ir.Value, *, ticks: int = 10_000_000,
                  loc: ir.Location | None = None) -> None:
    """Block until the phase of parity ``parity`` (i32, 0 or 1) of the mbarrier completed: a
    loop over ``mbarrier.try_wait.parity.shared.b64``."""
    from mlir.dialects import nvvm

    with _loc(loc):
        nvvm.mbarrier_try_wait_parity(_ptr(mbar_addr, 3), parity, _i32c(ticks))


# ---- shared -> global bulk copies (bulk groups) -------------------------------------------------
#
# ``cp.async.bulk.global.shared::cta.bulk_group [dst], [src], size``: one thread copies ``size``
# bytes (a multiple of 16; both addresses 16-byte aligned) from shared to global memory through
# the async proxy (SASS UBLKCP). Generic-proxy stores to the source bytes must be made visible to
# the async proxy first (``fence.proxy.async.shared::cta`` by the writing threads, then a CTA
# barrier). ``cp.async.bulk.commit_group`` closes the thread's group of copies;
# ``cp.async.bulk.wait_group.read N`` waits until at most N groups still READ their shared
# source (the bytes may then be reused; the global writes complete on their own by kernel end).


def bulk_store(dst_addr: ir.Value, src_addr: ir.Value, nbytes: ir.Value, *,
               loc: ir.Location | None = None) -> None:
    """Copy ``nbytes`` (an i32 value, a multiple of 16) from the shared byte address
    ``src_addr`` (i64) to the global byte address ``dst_addr`` (i64):
    ``cp.async.bulk.global.shared::cta.bulk_group``. One thread; close with
    :func:`bulk_commit` and :func:`bulk_wait_read`."""
    from mlir.dialects import nvvm

    with _loc(loc):
        nvvm.cp_async_bulk_global_shared_cta(_ptr(dst_addr, 1), _ptr(src_addr, 3), nbytes)


def bulk_commit(*, loc: ir.Location | None = None) -> None:
    """``cp.async.bulk.commit_group``: the thread's bulk stores so far form one group."""
    from mlir.dialects import nvvm

    with _loc(loc):
        nvvm.cp_async_bulk_commit_group()


def bulk_wait_read(groups: int = 0, *, loc: ir.Location | None = None) -> None:
    """``cp.async.bulk.wait_group.read groups``: at most ``groups`` of the thread's bulk groups
    still read their shared source bytes."""
    from mlir.dialects import nvvm

    with _loc(loc):
        nvvm.cp_async_bulk_wait_group(ir.IntegerAttr.get(ir.IntegerType.get_signless(32),
                                                         groups), read=True)


# ---- clusters (sm_90): multicast bulk copies and remote mbarrier arrivals ---------------------
#
# A CTA of a thread-block cluster addresses its peers' shared memory through the
# shared::cluster window: ``mapa`` maps a shared::cta address of this CTA to the same offset
# in the CTA of rank ``r``. A multicast bulk copy writes the same bytes at the same offset of
# every CTA in ``ctaMask`` and completes the transaction bytes on the mbarrier at the same
# offset in each of them.


def bulk_copy_multicast(dst_addr: ir.Value, src_addr: ir.Value, nbytes: int,
                        mbar_addr: ir.Value, cta_mask: int | ir.Value, *,
                        loc: ir.Location | None = None) -> None:
    """:func:`bulk_copy` to the CTAs of the cluster whose ranks are the set bits of
    ``cta_mask`` (an int or an i16 value): ``nbytes`` land at ``dst_addr`` (this CTA's
    shared offset) of each, completing ``nbytes`` transaction bytes on the mbarrier at
    ``mbar_addr`` of each: ``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes
    .multicast::cluster`` (SASS UBLKCP with ``.MULTICAST``). One thread; needs a cluster
    launch."""
    from mlir.dialects import arith, nvvm

    if nbytes <= 0 or nbytes % 16:
        raise ValueError(f"nbytes must be a positive multiple of 16, got {nbytes}")
    if isinstance(cta_mask, int):
        if not 0 < cta_mask < 1 << 16:
            raise ValueError(f"cta_mask must be a non-zero 16-bit mask, got {cta_mask}")
        t16 = ir.IntegerType.get_signless(16)
        with _loc(loc):
            mask = arith.constant(t16, ir.IntegerAttr.get(t16, cta_mask))
    else:
        mask = cta_mask
    with _loc(loc):
        nvvm.cp_async_bulk_shared_cluster_global(_ptr(dst_addr, 7), _ptr(src_addr, 1),
                                                 _ptr(mbar_addr, 3), _i32c(nbytes),
                                                 multicast_mask=mask)


def map_shared_rank(addr: ir.Value, rank: ir.Value, *,
                    loc: ir.Location | None = None) -> ir.Value:
    """The shared::cluster pointer (``!llvm.ptr<7>``) of the byte at this CTA's shared
    address ``addr`` (i64) in the cluster's CTA of rank ``rank`` (i32):
    ``mapa.shared::cluster.u64``."""
    from mlir.dialects import nvvm

    with _loc(loc):
        return nvvm.mapa(ir.Type.parse("!llvm.ptr<7>"), _ptr(addr, 3), rank)


def mbarrier_arrive_cluster(mbar: ir.Value, *, loc: ir.Location | None = None) -> None:
    """One arrival on the mbarrier at the shared::cluster pointer ``mbar`` (a peer CTA's,
    :func:`map_shared_rank`): ``mbarrier.arrive.shared::cluster.b64 _, [mbar]`` (the default
    ``.release.cta``, SASS ``SYNCS.ARRIVE.TRANS64.RED``; ``.release.cluster`` would add
    MEMBAR.ALL.GPU before it, which waits for the thread's outstanding memory operations).
    Enough where the arrival only releases shared bytes that async-proxy reads (wgmma,
    retired by ``wgmma.wait_group``) have finished with, as CUTLASS's cluster pipelines do."""
    from mlir.dialects import nvvm

    with _loc(loc):
        nvvm.mbarrier_arrive(None, mbar)

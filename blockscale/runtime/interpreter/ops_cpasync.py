"""Bulk copies global -> shared (``nvvm.cp.async.bulk.shared.cluster.global``: the 1-D,
non-tensor ``cp.async.bulk``) and shared -> global (``nvvm.cp.async.bulk.global.shared.cta``
with its bulk groups), ``nvvm.mbarrier.arrive`` and ``nvvm.mbarrier.arrive.expect_tx``:
see the comment block above their handlers. This module extends two handlers of other modules
(imported first, so the extension is the one registered):
``memref.extract_aligned_pointer_as_index`` of global memrefs and ``llvm.inttoptr`` to
global / shared::cluster pointers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import memory
from . import ops_cluster as _cl
from . import ops_tcgen05 as _t5
from . import ops_wgmma as _wg
from .compiler import HANDLERS, Compiler, handles, type_str
from .frame import Frame
from .memory import MemRef

# ---- bulk copies (cp.async.bulk, non-tensor) and pointer-mbarrier arrivals --------------------
#
# Model: global memrefs get synthetic byte addresses (``extract_aligned_pointer_as_index``:
# base 2^40 + n 2^36 for the n-th global buffer whose address the kernel takes), shared ones
# the ops_wgmma window addresses; ``llvm.inttoptr`` to global (1) / shared::cluster (7)
# pointers keeps the integer. The pointer mbarriers are ops_tcgen05's ([parity, pending,
# expected] per (block, address)) plus a transaction count here: ``arrive.expect_tx(b)``:
# tx += b, then one arrival; ``arrive``: one arrival; a bulk copy of b bytes lands at issue
# (lock-step: the consumers see it after their wait) and does tx -= b. A phase completes when
# pending == 0 and tx == 0. The copy engine is the async proxy: its bytes are added to the
# wgmma model's async image (a wgmma may read them with no proxy fence) and are marked written
# with the race tracker cleared, as ops_tma's copies.
#
# Clusters (ops_cluster): a copy with a multicast mask lands at the same offset of every CTA
# of the cluster whose rank is in the mask and does tx -= b on the mbarrier at the same
# offset of each; an arrive on a shared::cluster pointer (``mapa``) arrives on that CTA's
# mbarrier.


_GLOBAL_BASE, _GLOBAL_SPAN = 1 << 40, 1 << 36
_prev_extract = HANDLERS["memref.extract_aligned_pointer_as_index"]
_prev_inttoptr = HANDLERS["llvm.inttoptr"]


def _global_base(f: Frame, buf: memory.Buffer) -> int:
    bases: dict[int, tuple[int, memory.Buffer]] = f.__dict__.setdefault("global_bases", {})
    if id(buf) not in bases:
        bases[id(buf)] = (_GLOBAL_BASE + len(bases) * _GLOBAL_SPAN, buf)
    return bases[id(buf)][0]


def _resolve_global(f: Frame, lo: int, n: int) -> tuple[memory.Buffer, int]:
    for base, buf in f.__dict__.get("global_bases", {}).values():
        if base <= lo and lo + n <= base + buf.size * buf.data.dtype.itemsize:
            return buf, lo - base
    raise IndexError(f"cp.async.bulk: global bytes [{lo:#x}, {lo + n:#x}) are not inside one "
                     "global buffer whose address the kernel took")


@handles("memref.extract_aligned_pointer_as_index")
def _extract_pointer(op: Any, c: Compiler):
    src, out = c.slot(op.operands[0]), c.slot(op.results[0])
    shared = _prev_extract(op, c)

    def run(f: Frame) -> None:
        m: MemRef = f.vals[src]
        if m.buf.space != "global":
            shared(f)
            return
        f.vals[out] = np.array([_global_base(f, m.buf)], np.int64)
    return run


@handles("llvm.inttoptr")
def _inttoptr(op: Any, c: Compiler):
    if type_str(op.results[0]) not in ("!llvm.ptr<1>", "!llvm.ptr<7>"):
        return _prev_inttoptr(op, c)
    src, out = c.slot(op.operands[0]), c.slot(op.results[0])

    def run(f: Frame) -> None:
        f.vals[out] = np.asarray(f.vals[src]).astype(np.int64)
    return run


def _tx(f: Frame) -> dict[tuple[int, int], int]:
    return f.__dict__.setdefault("mbarrier_tx", {})


def _bar(f: Frame, tm: Any, key: tuple[int, int], what: str, t: int) -> list[int]:
    bar = tm.bars.get(key)
    if bar is None:
        raise RuntimeError(f"{what}: mbarrier at shared address {key[1]:#x} is not initialised "
                           f"({f.describe(t)})")
    return bar


def _complete(f: Frame, bar: list[int], key: tuple[int, int]) -> None:
    if bar[1] == 0 and _tx(f).get(key, 0) == 0:
        bar[0] ^= 1
        bar[1] = bar[2]


def _arrivals(op: Any, c: Compiler, what: str, with_tx: bool):
    slots = c.slots(op.operands)
    addr_s = slots[0]
    tx_s = slots[1] if with_tx else None
    pred = slots[2:] if with_tx else []
    out = c.slot(op.results[0]) if op.results else None

    mapped = type_str(op.operands[0]) == "!llvm.ptr<7>"

    def run(f: Frame) -> None:
        tm = _t5._tmem(f)
        for t in _t5._threads(f, pred):
            key = (_cl.decode_mapped(f, t, _t5._u(f, f.vals[addr_s], t), what) if mapped
                   else (_t5._block(f, t), _t5._u(f, f.vals[addr_s], t)))
            bar = _bar(f, tm, key, what, t)
            if tx_s is not None:
                _tx(f)[key] = _tx(f).get(key, 0) + _t5._u(f, f.vals[tx_s], t, 32)
            bar[1] -= 1
            if bar[1] < 0:
                raise RuntimeError(f"{what}: more arrivals than the barrier's count in one "
                                   f"phase ({f.describe(t)})")
            _complete(f, bar, key)
        if out is not None:
            f.vals[out] = np.zeros(1, np.int64)
    return run


@handles("nvvm.mbarrier.arrive.expect_tx")
def _arrive_expect_tx(op: Any, c: Compiler):
    return _arrivals(op, c, "mbarrier.arrive.expect_tx", True)


@handles("nvvm.mbarrier.arrive")
def _arrive(op: Any, c: Compiler):
    if len(op.operands) != 1:
        raise NotImplementedError("interpreter: nvvm.mbarrier.arrive with a count")
    return _arrivals(op, c, "mbarrier.arrive", False)


def _land(f: Frame, t: int, blk: int, dst: int, src: int, n: int, bar_addr: int) -> None:
    """Thread ``t``'s bulk copy of ``n`` bytes from global ``src`` to shared ``dst`` of batch
    block ``blk``, completing ``n`` transaction bytes on that block's mbarrier ``bar_addr``."""
    key = (blk, bar_addr)
    bar = _bar(f, _t5._tmem(f), key, "cp.async.bulk", t)
    st = _wg._state(f)
    gbuf, goff = _resolve_global(f, src, n)
    sbuf, soffs = _wg.resolve_shared(f, np.array([dst, dst + n - 1], np.int64))
    s0 = int(soffs[0])
    row = sbuf.data[blk].view(np.uint8)
    row[s0:s0 + n] = gbuf.data.view(np.uint8)[goff:goff + n]
    img = st.async_image.get((id(sbuf), blk))
    if img is None:  # nothing fenced yet: only the copied bytes are async-visible
        img = st.async_image[(id(sbuf), blk)] = row ^ 0xFF
    img[s0:s0 + n] = row[s0:s0 + n]
    if sbuf.race is not None:
        item = sbuf.data.dtype.itemsize
        keys = blk * sbuf.size + np.arange(s0 // item, -(-(s0 + n) // item))
        sbuf.race.written[keys] = True
        sbuf.race.wmin[keys] = np.iinfo(np.int32).max
        sbuf.race.wmax[keys] = -1
        sbuf.race.rmin[keys] = np.iinfo(np.int32).max
        sbuf.race.rmax[keys] = -1
    _tx(f)[key] = _tx(f).get(key, 0) - n
    _complete(f, bar, key)


@handles("nvvm.cp.async.bulk.shared.cluster.global")
def _bulk_copy(op: Any, c: Compiler):
    names = [str(op.operands[i].type) for i in range(len(op.operands))]
    multicast = len(op.operands) == 5 and names[4] == "i16"
    if len(op.operands) != 4 and not multicast:
        raise NotImplementedError("interpreter: cp.async.bulk with an L2 cache hint")
    dst_s, src_s, bar_s, size_s = c.slots(op.operands)[:4]
    mask_s = c.slot(op.operands[4]) if multicast else None
    c.uses_shared = True

    def run(f: Frame) -> None:
        for t in _t5._threads(f):
            n = _t5._u(f, f.vals[size_s], t, 32)
            dst, src = _t5._u(f, f.vals[dst_s], t), _t5._u(f, f.vals[src_s], t)
            if n % 16 or dst % 16 or src % 16:
                raise ValueError(f"cp.async.bulk: size {n}, dst {dst:#x}, src {src:#x} must be "
                                 f"multiples of 16 ({f.describe(t)})")
            bar = _t5._u(f, f.vals[bar_s], t)
            if mask_s is None:
                _land(f, t, _t5._block(f, t), dst, src, n, bar)
                continue
            mask = _t5._u(f, f.vals[mask_s], t, 16)
            size = int(np.prod(_cl.dims(f)))
            if mask == 0 or mask >> size:
                raise ValueError(f"cp.async.bulk multicast: ctaMask {mask:#x} must name CTAs "
                                 f"of the cluster of {size} ({f.describe(t)})")
            for r in range(size):
                if mask >> r & 1:
                    _land(f, t, _cl.peer_block(f, t, r, "cp.async.bulk multicast"), dst, src,
                          n, bar)
    return run


# ---- bulk copies shared -> global (bulk groups) ----------------------------------------------
#
# ``cp.async.bulk.global.shared::cta.bulk_group``: the copy is the async proxy reading shared
# memory, so its source bytes must equal the block's async image (the bytes at the last
# ``fence.proxy.async.shared::cta``) and must have been written; otherwise it raises, as a wgmma
# operand read does. The bytes land in the global buffer at issue (lock-step model);
# ``commit_group`` / ``wait_group.read`` then have nothing left to order (no-ops).


@handles("nvvm.cp.async.bulk.global.shared.cta")
def _bulk_store(op: Any, c: Compiler):
    if len(op.operands) != 3:
        raise NotImplementedError("interpreter: cp.async.bulk shared -> global with an L2 cache "
                                  "hint or a byte mask")
    dst_s, src_s, size_s = c.slots(op.operands)
    c.uses_shared = True

    def run(f: Frame) -> None:
        st = _wg._state(f)
        for t in _t5._threads(f):
            blk = _t5._block(f, t)
            n = _t5._u(f, f.vals[size_s], t, 32)
            dst, src = _t5._u(f, f.vals[dst_s], t), _t5._u(f, f.vals[src_s], t)
            if n == 0 or n % 16 or dst % 16 or src % 16:
                raise ValueError(f"cp.async.bulk shared -> global: size {n}, dst {dst:#x}, src "
                                 f"{src:#x} must be non-zero multiples of 16 ({f.describe(t)})")
            sbuf, soffs = _wg.resolve_shared(f, np.array([src, src + n - 1], np.int64))
            s0 = int(soffs[0])
            row = sbuf.data[blk].view(np.uint8)
            if sbuf.race is not None and sbuf.check_uninit and f.check_uninit:
                item = sbuf.data.dtype.itemsize
                keys = blk * sbuf.size + np.arange(s0 // item, -(-(s0 + n) // item))
                if not sbuf.race.written[keys].all():
                    raise _wg.WgmmaOrderError(f"cp.async.bulk shared -> global reads never-"
                                              f"written bytes of {sbuf.name} ({f.describe(t)})")
            img = st.async_image.get((id(sbuf), blk))
            if img is None or not np.array_equal(img[s0:s0 + n], row[s0:s0 + n]):
                raise _wg.WgmmaOrderError(
                    f"cp.async.bulk shared -> global reads bytes of {sbuf.name} written after "
                    f"the last fence.proxy.async.shared::cta (or with none) ({f.describe(t)})")
            gbuf, goff = _resolve_global(f, dst, n)
            if gbuf.readonly:
                raise ValueError(f"cp.async.bulk shared -> global writes the read-only buffer "
                                 f"{gbuf.name} ({f.describe(t)})")
            gbuf.data.view(np.uint8)[goff:goff + n] = row[s0:s0 + n]
    return run


@handles("nvvm.cp.async.bulk.commit.group")
def _bulk_commit(op: Any, c: Compiler):
    return lambda f: None


@handles("nvvm.cp.async.bulk.wait_group")
def _bulk_wait(op: Any, c: Compiler):
    return lambda f: None

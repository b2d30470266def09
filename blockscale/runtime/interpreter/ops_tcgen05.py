"""5th-generation tensor core (sm_100a ``tcgen05``) and pointer mbarriers, modeled from the
PTX ISA.

Ops: ``llvm.inttoptr`` (shared / tensor-memory addresses), ``nvvm.mbarrier.init``,
``nvvm.mbarrier.inval``,
``nvvm.mbarrier.try_wait.parity``, ``nvvm.tcgen05.{alloc, dealloc, relinquish_alloc_permit,
fence, cp, mma.block_scale, commit, ld, wait}``. ``blockscale/compiler/arch/tcgen05.py``
restates the ISA definitions this module implements independently:

* Tensor memory (TMEM): per block 128 lanes x 512 columns of 32-bit cells (uint32 here);
  address = ``lane << 16 | column``. ``tcgen05.alloc`` (one full warp) takes the lowest free
  column range of ``ncols`` (a power of two in [32, 512]) aligned to ``ncols`` and writes its
  address (lane 0) as an i32 to the shared word at its pointer; a second allocation after
  ``relinquish_alloc_permit``, an overlapping ``dealloc`` or too few free columns raise.
* Shared memory descriptor (64 bits): start = bits 0-13 << 4, LBO = bits 16-29 << 4, SBO =
  bits 32-45 << 4, bits 46-48 must be 0b001, base offset bits 49-51 (must be 0 here), LBO mode
  bit 52 (must be 0), swizzle bits 61-63 (only 0, no swizzle, is modeled). K-major byte ``b``
  of row ``r``: ``start + (r // 8) SBO + (b // 16) LBO + 16 (r % 8) + b % 16``.
* ``tcgen05.cp.32x128b.warpx4 [taddr], desc``: the 32 x 16-byte matrix at ``desc`` (row ``r``
  as above, one 16-byte chunk) -> lanes ``32 p + r`` (p = 0..3: the four partitions), columns
  ``col(taddr) + j``, cell = bytes ``4 j .. 4 j + 3`` of the row (little endian).
* Instruction descriptor (32 bits, ``.kind::mxf8f6f4 / mxf4 / mxf4nvf4``): sparsity bit 2,
  B SF ID bits 4-5, atype 7-9, btype 10-12, negate 13 / 14, transpose 15 / 16, N >> 3 bits
  17-22, scale type bit 23 (UE4M3 0, UE8M0 1), M >> 7 bits 27-28, A SF ID bits 29-30, K = 96
  bit 31. Modeled: dense, no negate, no transpose (K-major), M = 128, N <= 128, K-96 off;
  atype = btype = E4M3 (0) for mxf8f6f4, E2M1 (1) for mxf4 / mxf4nvf4; anything else raises.
* ``tcgen05.mma.cta_group::1.block_scale`` (one thread): A ``[128 x K]``, B ``[N x K]``
  K-major from shared memory (32 bytes per row: K = 64 E2M1, two per byte, element 2i in the
  low nibble, or 32 E4M3); scale vector size V = 4 (block16, mxf4nvf4), 2 (block32, mxf4) or
  1 (block32, mxf8f6f4), block = K / V. The scales of row ``r`` of A (of B) are bytes ``ID ..
  ID + V - 1`` of the cell at lane ``r``, column ``col(sfa) + r // 32`` (``col(sfb)``): the
  scale matrix duplicated in the four 32-lane partitions, where the ``32x128b.warpx4`` copy of
  a 5-D SF atom puts row ``32 i3 + i2`` (lane ``i2`` of every partition, column ``i3``) [the
  ISA: "scale factors ... need to be duplicated to all 32 lane partitions"; the byte
  selection by ID per scale_vec figure; SEMANTICS §1.3]. UE4M3 scales decode as E4M3 with the
  sign bit ignored (SEMANTICS D3), UE8M0 as 2^(b - 127) (0xFF: NaN). D (f32, lane ``m``,
  columns ``col(d) + n``) = f32((enable ? D : 0) + sum_k a sA b sB): the products and their sum
  are formed in float64 (exact unless the scales inside one MMA span more than ~2^25) and
  rounded once to f32 (RNE) — one fp32 rounding per MMA.
* ``tcgen05.ld.32x32b.x<num>`` (full warps): thread ``l`` of warp ``w`` gets the cells of lane
  ``lane(taddr) + l``, columns ``col(taddr) .. + num - 1``; lanes outside ``32 (w % 4) ..
  32 (w % 4) + 31`` raise (the ISA's access restriction).
* mbarriers on pointers: per (block, address) the phase parity, pending and expected
  arrivals, as :mod:`.ops_tma` (no transaction bytes). ``tcgen05.commit`` is one arrival that
  happens once the thread's prior async tcgen05 ops completed: in the lock-step model they
  complete at issue, so the arrival is immediate.

Ordering checks (raising :class:`Tcgen05OrderError`): an MMA or cp reading shared bytes that
differ from the block's shared memory at its last ``fence.proxy.async.shared::cta`` (a
generic store not made visible to the async proxy); shared bytes read by an MMA / cp that
changed before a wait observed the completion of the commit tracking it (operands
overwritten while the tensor core may read them); a ``tcgen05.ld`` of accumulator columns
written by an MMA whose commit no thread of the block has waited for.
Not detected: ``tcgen05.fence`` placement, a missing ``tcgen05.wait::ld`` (loads land at
once here), a kernel exiting with TMEM still allocated.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from blockscale import formats

from .compiler import Compiler, handles, type_str
from .frame import Frame
from .ops_wgmma import _state as _async_state
from .ops_wgmma import resolve_shared


class Tcgen05OrderError(RuntimeError):
    """A tcgen05 ordering or access rule of the PTX ISA was broken (module docstring)."""


LANES, COLS = 128, 512
#: kind attribute -> (atype/btype code, elements per byte, scale vector size)
_KINDS = {"mxf4nvf4": (1, 2, 4), "mxf4": (1, 2, 2), "mxf8f6f4": (0, 1, 1)}


class _Tmem:
    """Tensor memory and its allocation state, one per block of the batch."""

    def __init__(self, nblocks: int) -> None:
        self.cells = np.zeros((nblocks, LANES, COLS), np.uint32)
        self.used = np.zeros((nblocks, COLS), bool)
        self.relinquished = np.zeros(nblocks, bool)
        #: (block, column) -> True while an MMA wrote it and no wait observed its commit
        self.unobserved = np.zeros((nblocks, COLS), bool)
        #: per block: async ops issued since the last commit (reads, D columns)
        self.uncommitted: dict[int, list[Any]] = {}
        #: commits not yet observed by a wait: (block, mbarrier address, phase, sequence
        #: number, the async ops they track)
        self.commits: list[tuple[int, int, int, int, list[Any]]] = []
        self.seq = 0
        #: (block, address) -> [parity, pending, expected]
        self.bars: dict[tuple[int, int], list[int]] = {}


def _tmem(f: Frame) -> _Tmem:
    t = f.__dict__.get("tcgen05_tmem")
    if t is None:
        t = f.__dict__["tcgen05_tmem"] = _Tmem(f.nblocks)
    return t


def _threads(f: Frame, pred: list | None = None) -> np.ndarray:
    """The active threads; with ``pred`` (an op's optional predicate slot, empty or one),
    those of them where it holds."""
    threads = np.flatnonzero(f.active())
    if pred:
        on = np.asarray(f.full(f.vals[pred[0]])).astype(bool)
        threads = threads[on[threads]]
    return threads


def _block(f: Frame, t: int) -> int:
    return int(f.blk[t]) if f.blk.shape[0] > 1 else 0


def _u(f: Frame, slot_val: np.ndarray, t: int, bits: int = 64) -> int:
    return int(np.asarray(f.full(slot_val))[t]) & ((1 << bits) - 1)


# ---- pointers and mbarriers ------------------------------------------------------------------


@handles("llvm.inttoptr")
def _inttoptr(op: Any, c: Compiler):
    t = type_str(op.results[0])
    if t not in ("!llvm.ptr<3>", "!llvm.ptr<6>"):
        raise NotImplementedError(f"interpreter: llvm.inttoptr to {t} (only shared::cta "
                                  "and tensor-memory pointers)")
    src, out = c.slot(op.operands[0]), c.slot(op.results[0])
    bits = 32 if t.endswith("<6>") else 64

    def run(f: Frame) -> None:
        v = np.asarray(f.vals[src]).astype(np.int64)
        f.vals[out] = v & 0xFFFFFFFF if bits == 32 else v
    return run


@handles("nvvm.mbarrier.init")
def _mbar_init(op: Any, c: Compiler):
    addr_s, count_s, *pred = c.slots(op.operands)

    def run(f: Frame) -> None:
        tm = _tmem(f)
        for t in _threads(f, pred):
            n = _u(f, f.vals[count_s], t, 32)
            tm.bars[(_block(f, t), _u(f, f.vals[addr_s], t))] = [0, n, n]
    return run


@handles("nvvm.mbarrier.inval")
def _mbar_inval(op: Any, c: Compiler):
    """``mbarrier.inval``: the word is no mbarrier any more (a wait or arrival on it raises
    until an ``mbarrier.init``)."""
    addr_s, *pred = c.slots(op.operands)

    def run(f: Frame) -> None:
        tm = _tmem(f)
        for t in _threads(f, pred):
            tm.bars.pop((_block(f, t), _u(f, f.vals[addr_s], t)), None)
    return run


def _arrive(f: Frame, tm: _Tmem, blk: int, addr: int, ops: list[Any]) -> None:
    bar = tm.bars.get((blk, addr))
    if bar is None:
        raise RuntimeError(f"tcgen05.commit: mbarrier at shared address {addr:#x} of "
                           f"{f.describe_block(blk)} is not initialised")
    tm.seq += 1
    tm.commits.append((blk, addr, bar[0], tm.seq, ops))
    bar[1] -= 1
    if bar[1] == 0:
        bar[0] ^= 1
        bar[1] = bar[2]


@handles("nvvm.mbarrier.try_wait.parity")
def _mbar_wait(op: Any, c: Compiler):
    addr_s, par_s, _ticks = c.slots(op.operands)

    def run(f: Frame) -> None:
        tm = _tmem(f)
        done: set[tuple[int, int, int]] = set()
        for t in _threads(f):
            blk, addr = _block(f, t), _u(f, f.vals[addr_s], t)
            bar = tm.bars.get((blk, addr))
            if bar is None:
                raise RuntimeError(f"mbarrier.try_wait.parity: mbarrier at shared address "
                                   f"{addr:#x} is not initialised ({f.describe(t)})")
            want = _u(f, f.vals[par_s], t, 32) & 1
            if bar[0] == want:
                from .ops_tma import MBarrierDeadlockError

                raise MBarrierDeadlockError(
                    f"mbarrier at {addr:#x}: {f.describe(t)} waits for phase parity {want}, "
                    f"which has not completed (pending arrivals {bar[1]}) and cannot "
                    "complete later in lock-step order")
            done.add((blk, addr, want))
        for key in done:
            _observe(f, tm, key)
    return run


def _observe(f: Frame, tm: _Tmem, key: tuple[int, int, int]) -> None:
    """A wait observed the phase ``key`` = (block, address, parity): the commits of that
    phase, and every earlier commit of the block (a commit tracks all prior async ops of its
    thread), are complete: their tracked reads must be intact, their D columns become
    readable."""
    blk = key[0]
    seqs = [c[3] for c in tm.commits if c[:3] == key]
    if not seqs:
        return
    last = max(seqs)
    keep = []
    for c in tm.commits:
        if c[0] != blk or c[3] > last:
            keep.append(c)
            continue
        for kind, *rest in c[4]:
            if kind == "read":
                buf, offs, snap, what = rest
                if not np.array_equal(buf.data[blk].view(np.uint8)[offs], snap):
                    raise Tcgen05OrderError(
                        f"shared bytes of {buf.name} read by {what} in "
                        f"{f.describe_block(blk)} were overwritten before a wait observed "
                        "the commit tracking it")
            else:
                tm.unobserved[blk, rest[0]] = False
    tm.commits = keep


# ---- allocation ------------------------------------------------------------------------------


def _warps(f: Frame, what: str) -> list[tuple[int, int, np.ndarray]]:
    """(block, warp of the block, thread indices) of every active warp; raises on a partial
    one."""
    ws = f.warp_size
    if f.nthreads % ws:
        raise NotImplementedError(f"interpreter: {what} needs blocks of whole warps")
    act = f.active().reshape(-1, ws)
    out = []
    for gi in range(act.shape[0]):
        if act[gi].all():
            blk, w = divmod(gi, f.nthreads // ws)
            out.append((blk, w, np.arange(gi * ws, gi * ws + ws)))
        elif act[gi].any():
            raise Tcgen05OrderError(f"{what}: executed by {int(act[gi].sum())} of {ws} threads "
                                    f"of a warp of {f.describe_block(gi * ws // f.nthreads)} "
                                    "(.sync.aligned needs all)")
    return out


@handles("nvvm.tcgen05.alloc")
def _alloc(op: Any, c: Compiler):
    if "group" in op.attributes and "cta_2" in str(op.attributes["group"]):
        raise NotImplementedError("interpreter: tcgen05.alloc.cta_group::2")
    addr_s, ncols_s = c.slots(op.operands)

    def run(f: Frame) -> None:
        tm = _tmem(f)
        for blk, _w, idx in _warps(f, "tcgen05.alloc"):
            n = _u(f, f.vals[ncols_s], int(idx[0]), 32)
            if n < 32 or n > COLS or n & (n - 1):
                raise ValueError(f"tcgen05.alloc: ncols must be a power of two in [32, 512], "
                                 f"got {n}")
            if tm.relinquished[blk]:
                raise Tcgen05OrderError(f"tcgen05.alloc after relinquish_alloc_permit in "
                                        f"{f.describe_block(blk)}")
            col = next((s for s in range(0, COLS, n) if not tm.used[blk, s:s + n].any()), None)
            if col is None:
                raise Tcgen05OrderError(f"tcgen05.alloc of {n} columns: not enough free "
                                        f"tensor memory in {f.describe_block(blk)}")
            tm.used[blk, col:col + n] = True
            addr = _u(f, f.vals[addr_s], int(idx[0]))
            buf, off = resolve_shared(f, np.array([addr, addr + 3], np.int64))
            buf.data[blk].view(np.uint8)[off[0]:off[0] + 4] = \
                np.array([col], np.uint32).view(np.uint8)
            if buf.race is not None:
                item = buf.data.dtype.itemsize
                buf.race.written[blk * buf.size + off[0] // item:
                                 blk * buf.size + (off[0] + 3) // item + 1] = True
    return run


@handles("nvvm.tcgen05.dealloc")
def _dealloc(op: Any, c: Compiler):
    taddr_s, ncols_s = c.slots(op.operands)

    def run(f: Frame) -> None:
        tm = _tmem(f)
        for blk, _w, idx in _warps(f, "tcgen05.dealloc"):
            t = int(idx[0])
            col, n = _u(f, f.vals[taddr_s], t, 32) & 0xFFFF, _u(f, f.vals[ncols_s], t, 32)
            if not tm.used[blk, col:col + n].all() or col + n > COLS:
                raise Tcgen05OrderError(f"tcgen05.dealloc of columns [{col}, {col + n}) that "
                                        f"are not allocated in {f.describe_block(blk)}")
            tm.used[blk, col:col + n] = False
    return run


@handles("nvvm.tcgen05.relinquish_alloc_permit")
def _relinquish(op: Any, c: Compiler):
    def run(f: Frame) -> None:
        tm = _tmem(f)
        for blk, _w, _idx in _warps(f, "tcgen05.relinquish_alloc_permit"):
            tm.relinquished[blk] = True
    return run


@handles("nvvm.tcgen05.fence", "nvvm.tcgen05.wait")
def _ordering_only(op: Any, c: Compiler):
    """Ordering-only in the lock-step model (async ops and loads complete at issue)."""
    return lambda f: None


# ---- shared-memory operands --------------------------------------------------------------


def decode_smem_descriptor(desc: int) -> dict[str, int]:
    """The fields of a 64-bit tcgen05 shared memory descriptor."""
    desc &= (1 << 64) - 1
    return {"start": (desc & 0x3FFF) << 4, "lbo": ((desc >> 16) & 0x3FFF) << 4,
            "sbo": ((desc >> 32) & 0x3FFF) << 4, "fixed": (desc >> 46) & 7,
            "base_offset": (desc >> 49) & 7, "lbo_mode": (desc >> 52) & 1,
            "swizzle": desc >> 61}


def operand_addresses(desc: int, rows: int, row_bytes: int) -> np.ndarray:
    """Shared byte addresses ``[rows, row_bytes]`` of a K-major no-swizzle operand."""
    d = decode_smem_descriptor(desc)
    if d["fixed"] != 1:
        raise Tcgen05OrderError(f"tcgen05 shared memory descriptor bits 46-48 must be 0b001, "
                                f"got {d['fixed']:#b}")
    if d["swizzle"] or d["base_offset"] or d["lbo_mode"]:
        raise NotImplementedError(f"interpreter: tcgen05 descriptors with swizzle / base "
                                  f"offset / absolute LBO ({d})")
    r = np.arange(rows, dtype=np.int64)[:, None]
    b = np.arange(row_bytes, dtype=np.int64)[None, :]
    return d["start"] + (r // 8) * d["sbo"] + (b // 16) * d["lbo"] + 16 * (r % 8) + b % 16


def _read_smem(f: Frame, desc: int, rows: int, row_bytes: int, blk: int, what: str
               ) -> tuple[np.ndarray, list[Any]]:
    """Operand bytes ``[rows, row_bytes]`` (uint8) and the read record for the commit;
    checks the async-proxy visibility of every byte."""
    addr = operand_addresses(desc, rows, row_bytes)
    buf, offs = resolve_shared(f, addr.reshape(-1))
    data = buf.data[blk].view(np.uint8)
    if buf.race is not None and buf.check_uninit and f.check_uninit:
        item = buf.data.dtype.itemsize
        if not buf.race.written[blk * buf.size + offs // item].all():
            raise Tcgen05OrderError(f"{what} reads never-written bytes of {buf.name} in "
                                    f"{f.describe_block(blk)}")
    snap = data[offs].copy()
    img = _async_state(f).async_image.get((id(buf), blk))
    if img is None or not np.array_equal(img[offs], snap):
        raise Tcgen05OrderError(
            f"{what} reads bytes of {buf.name} in {f.describe_block(blk)} written after the "
            "last fence.proxy.async.shared::cta (or with none)")
    return snap.reshape(rows, row_bytes), ["read", buf, offs, snap, what]


# ---- tcgen05.cp / mma / commit / ld ------------------------------------------------------


def _issuers(f: Frame) -> list[tuple[int, int]]:
    """(thread, block) of every active thread: single-thread ops are issued by each."""
    return [(int(t), _block(f, int(t))) for t in _threads(f)]


@handles("nvvm.tcgen05.cp")
def _cp(op: Any, c: Compiler):
    shape = str(op.attributes["shape"])
    multicast = str(op.attributes["multicast"]) if "multicast" in op.attributes else "none"
    if "32x128b" not in shape or "warpx4" not in multicast or "srcFormat" in op.attributes:
        raise NotImplementedError(f"interpreter: tcgen05.cp {shape} {multicast} (only "
                                  "32x128b.warpx4 without decompression)")
    if "group" in op.attributes and "cta_2" in str(op.attributes["group"]):
        raise NotImplementedError("interpreter: tcgen05.cp.cta_group::2")
    taddr_s, desc_s = c.slots(op.operands)

    def run(f: Frame) -> None:
        tm = _tmem(f)
        for t, blk in _issuers(f):
            taddr = _u(f, f.vals[taddr_s], t, 32)
            lane, col = taddr >> 16, taddr & 0xFFFF
            if lane != 0 or col + 4 > COLS or not tm.used[blk, col:col + 4].all():
                raise Tcgen05OrderError(f"tcgen05.cp to unallocated / misaligned tensor memory "
                                        f"(lane {lane}, columns {col}..{col + 3}) at "
                                        f"{f.describe(t)}")
            rows, rec = _read_smem(f, _u(f, f.vals[desc_s], t), 32, 16, blk, "tcgen05.cp")
            words = rows.copy().view(np.uint32)  # [32, 4] little-endian cells
            for p in range(4):
                tm.cells[blk, 32 * p:32 * p + 32, col:col + 4] = words
            tm.uncommitted.setdefault(blk, []).append(rec)
    return run


def decode_instr_descriptor(idesc: int) -> dict[str, int]:
    """The fields of a block-scaled instruction descriptor."""
    return {"sparse": (idesc >> 2) & 1, "sfb_id": (idesc >> 4) & 3, "atype": (idesc >> 7) & 7,
            "btype": (idesc >> 10) & 7, "negate": (idesc >> 13) & 3,
            "transpose": (idesc >> 15) & 3, "n": ((idesc >> 17) & 0x3F) << 3,
            "scale_type": (idesc >> 23) & 1, "m": ((idesc >> 27) & 3) << 7,
            "sfa_id": (idesc >> 29) & 3, "k96": idesc >> 31,
            "reserved": idesc & (0b11 | 1 << 3 | 1 << 6 | 0b111 << 24)}


def element_values(raw: np.ndarray, per_byte: int) -> np.ndarray:
    """Decoded elements ``[rows, K]`` (float64) of operand bytes ``[rows, 32]``."""
    if per_byte == 2:
        return formats.decode_e2m1(formats.unpack_fp4(raw)).astype(np.float64)
    return formats.decode_e4m3(raw).astype(np.float64)


def scale_values(cells: np.ndarray, sf_id: int, vec: int, ue8m0: bool) -> np.ndarray:
    """Decoded scales ``[rows, vec]`` (float64) of TMEM cells ``[rows]`` (uint32): bytes
    ``sf_id .. sf_id + vec - 1``."""
    b = cells.view(np.uint8).reshape(-1, 4)[:, sf_id:sf_id + vec]
    if ue8m0:
        return formats.decode_e8m0(b).astype(np.float64)
    return formats.decode_e4m3(b & 0x7F).astype(np.float64)


def block_scaled_mma(a: np.ndarray, b: np.ndarray, sa: np.ndarray, sb: np.ndarray,
                     d: np.ndarray | None) -> np.ndarray:
    """``(A sA)(B sB)^T + D`` for A ``[M, K]``, B ``[N, K]``, scales ``[M|N, V]`` (block K /
    V), D f32 ``[M, N]`` or None: float64 sum, one RNE rounding to f32."""
    blk = a.shape[1] // sa.shape[1]
    with np.errstate(all="ignore"):
        acc = (a * np.repeat(sa, blk, axis=1)) @ (b * np.repeat(sb, blk, axis=1)).T
        if d is not None:
            acc = acc + d.astype(np.float64)
    return acc.astype(np.float32)


@handles("nvvm.tcgen05.mma.block_scale")
def _mma(op: Any, c: Compiler):
    m = re.search(r"(mxf8f6f4|mxf4nvf4|mxf4)\b", str(op.attributes["kind"]))
    if m is None:
        raise NotImplementedError(f"interpreter: tcgen05.mma kind {op.attributes['kind']}")
    kind = m.group(1)
    if "cta_2" in str(op.attributes["ctaGroup"]):
        raise NotImplementedError("interpreter: tcgen05.mma.cta_group::2")
    bs = str(op.attributes["blockScale"]) if "blockScale" in op.attributes else "default"
    code, per_byte, vec = _KINDS[kind]
    want_bs = "block16" if vec == 4 else "block32"
    if want_bs not in bs:
        raise NotImplementedError(f"interpreter: tcgen05.mma kind::{kind} with {bs} (modeled: "
                                  f"{want_bs})")
    if len(op.operands) != 7:
        raise NotImplementedError("interpreter: tcgen05.mma.block_scale with A in tensor "
                                  "memory or extra operands")
    d_s, a_s, b_s, idesc_s, en_s, sfa_s, sfb_s = c.slots(op.operands)

    def run(f: Frame) -> None:
        tm = _tmem(f)
        for t, blk in _issuers(f):
            idesc = decode_instr_descriptor(_u(f, f.vals[idesc_s], t, 32))
            if (idesc["sparse"] or idesc["negate"] or idesc["transpose"] or idesc["k96"]
                    or idesc["m"] != 128 or idesc["atype"] != code or idesc["btype"] != code
                    or idesc["reserved"]):
                raise NotImplementedError(f"interpreter: tcgen05.mma instruction descriptor "
                                          f"{idesc} (modeled: dense K-major M=128, "
                                          f"{kind} types)")
            n = idesc["n"]
            if n % 16 or not 16 <= n <= 128:
                raise NotImplementedError(f"interpreter: tcgen05.mma N = {n} (modeled: "
                                          "16..128, multiples of 16)")
            ue8m0 = bool(idesc["scale_type"])
            if kind != "mxf4nvf4" and not ue8m0:
                raise Tcgen05OrderError(f"kind::{kind} needs UE8M0 scales (descriptor bit 23)")
            for name in ("sfa_id", "sfb_id"):
                if idesc[name] % vec if vec < 4 else idesc[name]:
                    raise Tcgen05OrderError(f"tcgen05.mma {name} = {idesc[name]} is invalid "
                                            f"for scale_vec::{vec}X")
            taddr = {k: _u(f, f.vals[s], t, 32) for k, s in (("d", d_s), ("sfa", sfa_s),
                                                             ("sfb", sfb_s))}
            for k, v in taddr.items():
                span = n if k == "d" else 4
                col = v & 0xFFFF
                if v >> 16 or not tm.used[blk, col:col + span].all() or col + span > COLS:
                    raise Tcgen05OrderError(f"tcgen05.mma: [{k}] (lane {v >> 16}, column "
                                            f"{col}) is not allocated lane-0 tensor memory at "
                                            f"{f.describe(t)}")
            ra, rec_a = _read_smem(f, _u(f, f.vals[a_s], t), 128, 32, blk, "tcgen05.mma A")
            rb, rec_b = _read_smem(f, _u(f, f.vals[b_s], t), n, 32, blk, "tcgen05.mma B")
            rows_a, rows_b = np.arange(128), np.arange(n)
            sfa = scale_values(tm.cells[blk, rows_a, (taddr["sfa"] & 0xFFFF) + rows_a // 32],
                               idesc["sfa_id"], vec, ue8m0)
            sfb = scale_values(tm.cells[blk, rows_b, (taddr["sfb"] & 0xFFFF) + rows_b // 32],
                               idesc["sfb_id"], vec, ue8m0)
            dcol = taddr["d"] & 0xFFFF
            cols = slice(dcol, dcol + n)
            enable = bool(np.asarray(f.full(f.vals[en_s]))[t])
            d = tm.cells[blk, :, cols].view(np.float32) if enable else None
            out = block_scaled_mma(element_values(ra, per_byte), element_values(rb, per_byte),
                                   sfa, sfb, d)
            tm.cells[blk, :, cols] = out.view(np.uint32)
            tm.unobserved[blk, cols] = True
            tm.uncommitted.setdefault(blk, []).extend(
                [rec_a, rec_b, ["dcols", np.arange(dcol, dcol + n)]])
    return run


@handles("nvvm.tcgen05.commit")
def _commit(op: Any, c: Compiler):
    if len(op.operands) != 1:
        raise NotImplementedError("interpreter: tcgen05.commit with a multicast mask")
    if "group" in op.attributes and "cta_2" in str(op.attributes["group"]):
        raise NotImplementedError("interpreter: tcgen05.commit.cta_group::2")
    addr_s = c.slot(op.operands[0])

    def run(f: Frame) -> None:
        tm = _tmem(f)
        for t, blk in _issuers(f):
            _arrive(f, tm, blk, _u(f, f.vals[addr_s], t), tm.uncommitted.pop(blk, []))
    return run


@handles("nvvm.tcgen05.ld")
def _ld(op: Any, c: Compiler):
    shape = str(op.attributes["shape"])
    if "32x32b" not in shape.lower() or "pack" in op.attributes or len(op.operands) != 1:
        raise NotImplementedError(f"interpreter: tcgen05.ld {shape} (only 32x32b, no pack)")
    rt = type_str(op.results[0])
    mv = re.fullmatch(r"vector<(\d+)xi32>", rt)
    if mv is None and rt != "i32":
        raise NotImplementedError(f"interpreter: tcgen05.ld result {rt}")
    num = int(mv.group(1)) if mv else 1
    taddr_s, out = c.slot(op.operands[0]), c.slot(op.results[0])

    def run(f: Frame) -> None:
        tm = _tmem(f)
        res = np.zeros((f.T, num), np.int32)
        for blk, w, idx in _warps(f, "tcgen05.ld"):
            taddr = np.asarray(f.full(f.vals[taddr_s]))[idx].astype(np.int64) & 0xFFFFFFFF
            if (taddr != taddr[0]).any():
                raise Tcgen05OrderError("tcgen05.ld: the address differs inside a warp")
            lane, col = int(taddr[0]) >> 16, int(taddr[0]) & 0xFFFF
            part = 32 * (w % 4)
            if not part <= lane <= part + 32 - f.warp_size or col + num > COLS:
                raise Tcgen05OrderError(f"tcgen05.ld: warp {w} of {f.describe_block(blk)} may "
                                        f"access lanes {part}..{part + 31}, not lane {lane}")
            if not tm.used[blk, col:col + num].all():
                raise Tcgen05OrderError(f"tcgen05.ld of unallocated columns {col}.."
                                        f"{col + num - 1} in {f.describe_block(blk)}")
            if tm.unobserved[blk, col:col + num].any():
                raise Tcgen05OrderError(f"tcgen05.ld of columns {col}..{col + num - 1} in "
                                        f"{f.describe_block(blk)} written by a tcgen05.mma "
                                        "whose commit no wait has observed")
            res[idx] = tm.cells[blk, lane:lane + f.warp_size, col:col + num].view(np.int32)
        f.vals[out] = res if num > 1 else res[:, 0]
    return run

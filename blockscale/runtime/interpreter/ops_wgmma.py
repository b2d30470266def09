"""Warpgroup MMA (sm_90a ``wgmma``) and shared addresses, modeled from the PTX ISA.

Ops: ``memref.extract_aligned_pointer_as_index`` (of workgroup memrefs), ``llvm.mlir.zero``
and ``llvm.insertvalue`` (of f32 structs), ``nvvm.fence.proxy`` (async.shared), ``nvvm.wgmma.fence.aligned``,
``nvvm.wgmma.mma_async``, ``nvvm.wgmma.commit.group.sync.aligned``,
``nvvm.wgmma.wait.group.sync.aligned``. ``blockscale/compiler/arch/wgmma.py`` restates the
ISA definitions this module implements independently:

* Shared addresses: every shared buffer of a block gets a synthetic shared-window base on the
  first ``extract_aligned_pointer_as_index`` of it (1024, then each next buffer at the next
  multiple of 1024 past the previous one's end: the bases are 1024-byte aligned, as the
  128B swizzle needs; all below 2^18, the descriptor's address range).
* Matrix descriptor: start = bits 0-13 << 4, LBO = bits 16-29 << 4, SBO = bits 32-45 << 4,
  base offset bits 49-51 (must be 0), swizzle bits 62-63 (0 none, 1 128B, 2 64B, 3 32B).
  K-major element (row r, K byte b < 32) of a bf16 m64nNk16 operand is at
  no swizzle: ``start + (r // 8) SBO + (b // 16) LBO + 16 (r % 8) + b % 16``;
  span S swizzle: ``a = start + (r // 8) SBO + S (r % 8) + b``, then bits [4, 4 + log2(S/16))
  of ``a`` ^= bits [7, 7 + log2(S/16)) (absolute address, as the TMA model writes them);
  LBO is unused (the 32 K bytes lie in one S-byte row). Modeled only with base offset 0,
  ``start % 8S <= S - 32`` (the start in the first row of its 8-row repeat, e.g. + 32 h for
  the k16 step h of a 128B row) and SBO a multiple of 8S; others raise NotImplementedError.
  A is [64, 16] (rows = M), B is stored [N, 16] (rows = N, K-major, "col" layout).
* D fragment: thread t of warpgroup (warp w = t // 32, g = lane // 4, q = lane % 4) register
  i = ``D[16 w + g + 8 ((i % 4) // 2), 8 (i // 4) + 2 q + i % 2]``.
* Numerics: products of bf16 / f16 (E4M3: m64nNk32, one byte per K element, the same 32-byte
  row addressing) are exact; the 16 (32) products and (scale-d ? c : 0) are summed in
  float64 and rounded once to f32 with RNE (as the ``mma.sync`` model, see ops_mma). The
  hardware's fp8 accumulation is narrower; kernels rely on it only for exact sums.

Async semantics in the lock-step model: an ``mma_async`` computes its result when it is
issued (reading shared memory then). The hazards the ISA leaves undefined are detected
where the model can see them, raising :class:`WgmmaOrderError`:

* ``mma_async`` without a ``wgmma.fence`` since the warpgroup's last ``wait_group`` (or since
  the start): the accumulator registers are not fenced;
* an operand byte that differs from the block's shared memory as it was at its last
  ``fence.proxy.async.shared::cta`` (a generic store not made visible to the async proxy),
  or that was never written;
* operand bytes changed between the issue and the ``wait_group`` that retires the group
  (shared memory overwritten while the wgmma may still read it);
* a partially active warpgroup, or descriptors that differ inside a warpgroup.

Not detected: reading the accumulator struct before its ``wait_group`` (the value is already
final here) — the kernels read it only after ``wait_group 0``.
"""

from __future__ import annotations

import re
from typing import Any

import ml_dtypes
import numpy as np

from .compiler import Compiler, handles, type_str
from .frame import Frame
from .memory import Buffer, MemRef


class WgmmaOrderError(RuntimeError):
    """A wgmma ordering rule of the PTX ISA was broken (see the module docstring)."""


_SPANS = {0: 0, 1: 128, 2: 64, 3: 32}
_SHARED_LIMIT = 1 << 18


# ---- shared addresses ------------------------------------------------------------------------


def shared_base(f: Frame, buf: Buffer) -> int:
    """The synthetic shared-window address of ``buf`` (assigned on first use)."""
    bases: dict[int, tuple[int, Buffer]] = f.__dict__.setdefault("shared_bases", {})
    if id(buf) not in bases:
        end = max((b + x.size * x.data.dtype.itemsize for b, x in bases.values()), default=0)
        base = max(1024, -(-end // 1024) * 1024)
        if base + buf.size * buf.data.dtype.itemsize > _SHARED_LIMIT:
            raise NotImplementedError("interpreter: shared addresses past 2^18 bytes")
        bases[id(buf)] = (base, buf)
    return bases[id(buf)][0]


def resolve_shared(f: Frame, addr: np.ndarray) -> tuple[Buffer, np.ndarray]:
    """The buffer holding every byte address of ``addr`` and the byte offsets in it."""
    bases = f.__dict__.get("shared_bases", {})
    lo, hi = int(addr.min()), int(addr.max())
    for base, buf in bases.values():
        size = buf.size * buf.data.dtype.itemsize
        if base <= lo and hi < base + size:
            return buf, addr - base
    raise IndexError(f"wgmma operand bytes [{lo:#x}, {hi:#x}] are not inside one shared "
                     "buffer whose address the kernel took")


@handles("memref.extract_aligned_pointer_as_index")
def _extract_pointer(op: Any, c: Compiler):
    src = c.slot(op.operands[0])
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        m: MemRef = f.vals[src]
        if m.buf.space != "shared":
            raise NotImplementedError("interpreter: extract_aligned_pointer_as_index of "
                                      f"{m.buf.space} memory ({m.buf.name})")
        f.vals[out] = np.array([shared_base(f, m.buf)], np.int64)
    return run


@handles("llvm.mlir.zero")
def _zero(op: Any, c: Compiler):
    t = type_str(op.results[0])
    m = re.fullmatch(r"!llvm\.struct<\(((?:f32, )*f32)\)>", t)
    if m is None:
        raise NotImplementedError(f"interpreter: llvm.mlir.zero of {t}")
    n = m.group(1).count("f32")
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        f.vals[out] = np.zeros((1, n), np.float32)
    return run


@handles("llvm.insertvalue")
def _insertvalue(op: Any, c: Compiler):
    """``llvm.insertvalue`` of an f32 into an f32 struct (an accumulator fragment)."""
    t = type_str(op.results[0])
    text = str(op.attributes["position"])  # "array<i64: 0>"
    pos = [int(x) for x in re.findall(r"-?\d+", text.split(":", 1)[-1])]
    m = re.fullmatch(r"!llvm\.struct<\(((?:f32, )*f32)\)>", t)
    if m is None or len(pos) != 1:
        raise NotImplementedError(f"interpreter: llvm.insertvalue {pos} into {t}")
    n, p = m.group(1).count("f32"), pos[0]
    src, val = c.slots(op.operands)
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        res = np.array(np.broadcast_to(f.full(f.vals[src]), (f.T, n)), np.float32)
        res[:, p] = f.full(f.vals[val])
        f.vals[out] = res
    return run


# ---- operand addressing ------------------------------------------------------------------


def decode_descriptor(desc: int) -> dict[str, int]:
    """The fields of a 64-bit matrix descriptor."""
    desc &= (1 << 64) - 1
    return {"start": (desc & 0x3FFF) << 4, "lbo": ((desc >> 16) & 0x3FFF) << 4,
            "sbo": ((desc >> 32) & 0x3FFF) << 4, "base_offset": (desc >> 49) & 7,
            "swizzle": desc >> 62}


def operand_addresses(desc: int, rows: int) -> np.ndarray:
    """Shared byte addresses ``[rows, 32]`` of the 16 bf16 K-elements (2 bytes each, low
    first) of each row of a K-major wgmma operand described by ``desc``."""
    d = decode_descriptor(desc)
    if d["base_offset"]:
        raise NotImplementedError("interpreter: wgmma descriptors with a base offset")
    r = np.arange(rows, dtype=np.int64)[:, None]
    b = np.arange(32, dtype=np.int64)[None, :]
    span = _SPANS[d["swizzle"]]
    if span == 0:
        return d["start"] + (r // 8) * d["sbo"] + (b // 16) * d["lbo"] + 16 * (r % 8) + b % 16
    # base offset 0: the start lies in the first row of its 8-row pattern repeat (8 span
    # bytes) and the instruction's 32 K bytes in that row; other starts are not modeled
    if d["start"] % (8 * span) + 32 > span:
        raise NotImplementedError(f"interpreter: {span}B-swizzled wgmma descriptor with start "
                                  f"{d['start']:#x} (start % {8 * span} must be <= {span - 32})")
    if d["sbo"] % (8 * span):
        raise NotImplementedError(f"interpreter: {span}B-swizzled wgmma descriptor with SBO "
                                  f"{d['sbo']} (not a multiple of the {8 * span}-byte repeat)")
    a = d["start"] + (r // 8) * d["sbo"] + span * (r % 8) + b
    return a ^ (((a >> 7) & (span // 16 - 1)) << 4)


def read_operand(data: np.ndarray, offs: np.ndarray, dtype: Any = ml_dtypes.bfloat16
                 ) -> np.ndarray:
    """bf16 / f16 (16 per row) or E4M3 (32 per row) values (float64) at byte offsets
    ``offs`` [rows, 32] of a uint8 row."""
    if dtype == ml_dtypes.float8_e4m3fn:
        return data[offs].view(dtype).astype(np.float64)
    lo = data[offs[:, 0::2]].astype(np.uint16)
    hi = data[offs[:, 1::2]].astype(np.uint16)
    return (lo | (hi << 8)).view(dtype).astype(np.float64)


def fragment_coords(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) ``[128, N/2]`` of accumulator register i of warpgroup thread t."""
    t = np.arange(128)[:, None]
    i = np.arange(n // 2)[None, :]
    w, lane = t // 32, t % 32
    row = 16 * w + lane // 4 + 8 * ((i % 4) // 2)
    col = 8 * (i // 4) + 2 * (lane % 4) + i % 2
    return row, col


def wgmma_bf16(a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> np.ndarray:
    """``A [64,16] @ B[N,16]^T + C`` (float64 in, one RNE rounding to f32)."""
    with np.errstate(all="ignore"):
        d = a @ b.T
        if c is not None:
            d = d + c.astype(np.float64)
    return d.astype(np.float32)


# ---- per-warpgroup async state --------------------------------------------------------------


class _State:
    def __init__(self) -> None:
        self.fenced: set[tuple[int, int]] = set()  # (block, warpgroup)
        self.pending: dict[tuple[int, int], list[Any]] = {}
        self.groups: dict[tuple[int, int], list[list[Any]]] = {}
        self.async_image: dict[tuple[int, int], np.ndarray] = {}  # (id(buf), block)


def _state(f: Frame) -> _State:
    s = f.__dict__.get("wgmma_state")
    if s is None:
        s = f.__dict__["wgmma_state"] = _State()
    return s


def _warpgroups(f: Frame, what: str) -> list[tuple[int, int, np.ndarray]]:
    """(block, warpgroup, thread indices [128]) of every active warpgroup; raises on a
    partial one."""
    if f.nthreads % 128:
        raise NotImplementedError(f"interpreter: {what} needs blocks of whole warpgroups, got "
                                  f"{f.nthreads} threads")
    act = f.active().reshape(-1, 128)
    out = []
    for gi in range(act.shape[0]):
        if act[gi].all():
            blk, wg = divmod(gi, f.nthreads // 128)
            out.append((blk, wg, np.arange(gi * 128, gi * 128 + 128)))
        elif act[gi].any():
            raise WgmmaOrderError(f"{what}: executed by {int(act[gi].sum())} of 128 threads of a "
                                  f"warpgroup of {f.describe_block(gi * 128 // f.nthreads)} "
                                  "(.sync.aligned needs all)")
    return out


@handles("nvvm.fence.proxy")
def _fence_proxy(op: Any, c: Compiler):
    kind = str(op.attributes["kind"])
    if "async" not in kind:
        raise NotImplementedError(f"interpreter: nvvm.fence.proxy {kind}")

    def run(f: Frame) -> None:
        st = _state(f)
        blocks = np.unique(np.asarray(f.blk)[f.active()] if f.blk.shape[0] > 1
                           else np.zeros(1, np.int64))
        for buf in f.shared:
            for blk in blocks:
                st.async_image[(id(buf), int(blk))] = buf.data[blk].view(np.uint8).copy()
    return run


@handles("nvvm.wgmma.fence.aligned")
def _wgmma_fence(op: Any, c: Compiler):
    def run(f: Frame) -> None:
        st = _state(f)
        for blk, wg, _ in _warpgroups(f, "wgmma.fence"):
            st.fenced.add((blk, wg))
    return run


@handles("nvvm.wgmma.commit.group.sync.aligned")
def _wgmma_commit(op: Any, c: Compiler):
    def run(f: Frame) -> None:
        st = _state(f)
        for blk, wg, _ in _warpgroups(f, "wgmma.commit_group"):
            key = (blk, wg)
            st.groups.setdefault(key, []).append(st.pending.pop(key, []))
    return run


@handles("nvvm.wgmma.wait.group.sync.aligned")
def _wgmma_wait(op: Any, c: Compiler):
    n = int(re.findall(r"\d+", str(op.attributes["group"]))[0])

    def run(f: Frame) -> None:
        st = _state(f)
        for blk, wg, _ in _warpgroups(f, "wgmma.wait_group"):
            key = (blk, wg)
            groups = st.groups.get(key, [])
            while len(groups) > n:
                for buf, offs, snap in groups.pop(0):
                    now = buf.data[blk].view(np.uint8)[offs]
                    if not np.array_equal(now, snap):
                        raise WgmmaOrderError(
                            f"wgmma operand bytes of {buf.name} in {f.describe_block(blk)} "
                            "were overwritten before the wait_group that retires the wgmma")
            st.fenced.discard(key)
    return run


def _uniform_desc(f: Frame, v: np.ndarray, idx: np.ndarray, what: str) -> int:
    x = np.asarray(f.full(v))[idx].astype(np.int64)
    if (x != x[0]).any():
        raise WgmmaOrderError(f"wgmma.mma_async: {what} descriptor differs inside a warpgroup")
    return int(x[0]) & ((1 << 64) - 1)


def shared_operand(f: Frame, st: _State, desc: int, nrows: int, blk: int, dtype: Any
                   ) -> tuple[np.ndarray, tuple[Any, ...]]:
    """The ``nrows`` x 16 (32 for E4M3) operand values a wgmma reads through ``desc`` in block
    ``blk`` and its pending record (buffer, offsets, bytes) for the retiring ``wait_group``;
    raises on never-written bytes or bytes written after the last async-proxy fence."""
    addr = operand_addresses(desc, nrows)
    buf, offs = resolve_shared(f, addr)
    data = buf.data[blk].view(np.uint8)
    offs = offs.reshape(nrows, 32)
    if buf.race is not None and buf.check_uninit and f.check_uninit:
        item = buf.data.dtype.itemsize
        if not buf.race.written[blk * buf.size + offs.reshape(-1) // item].all():
            raise WgmmaOrderError(f"wgmma.mma_async reads never-written bytes of "
                                  f"{buf.name} in {f.describe_block(blk)}")
    img = st.async_image.get((id(buf), blk))
    snap = data[offs].copy()
    if img is None or not np.array_equal(img[offs], snap):
        raise WgmmaOrderError(
            f"wgmma.mma_async reads bytes of {buf.name} in {f.describe_block(blk)} written "
            "after the last fence.proxy.async.shared::cta (or with none)")
    return read_operand(data, offs, dtype), (buf, offs, snap)


#: operand type -> (numpy dtype, K of one instruction: 32 bytes of a row either way)
_TYPES = {"bf16": (ml_dtypes.bfloat16, 16), "f16": (np.float16, 16),
          "e4m3": (ml_dtypes.float8_e4m3fn, 32)}


@handles("nvvm.wgmma.mma_async")
def _mma_async(op: Any, c: Compiler):
    m = re.search(r"m\s*=\s*(\d+),\s*n\s*=\s*(\d+),\s*k\s*=\s*(\d+)", str(op.attributes["shape"]))
    n = int(m.group(2)) if m is not None else 0
    types = [str(op.attributes[x]) for x in ("typeA", "typeB", "typeD")]
    lay = [str(op.attributes[x]) for x in ("layoutA", "layoutB")]
    scales = [str(op.attributes[x]) for x in ("scaleA", "scaleB")]
    ab = [t.rsplit("<", 1)[-1].rstrip(">").strip() for t in types[:2]]
    if not (ab[0] == ab[1] and ab[0] in _TYPES and "f32" in types[2]):
        raise NotImplementedError(f"interpreter: wgmma types {types} (bf16 / f16 / e4m3 -> "
                                  "f32)")
    dtype, kdim = _TYPES[ab[0]]
    if m is None or int(m.group(1)) != 64 or int(m.group(3)) != kdim:
        raise NotImplementedError(f"interpreter: wgmma shape {op.attributes['shape']} of "
                                  f"{ab[0]}")
    if "row" not in lay[0] or "col" not in lay[1] or any("one" not in s for s in scales):
        raise NotImplementedError(f"interpreter: wgmma layouts {lay} / scales {scales} "
                                  "(only K-major A and B, no negation)")
    accumulate = "one" in str(op.attributes["scaleD"])
    if "satfinite" in op.attributes:
        raise NotImplementedError("interpreter: wgmma .satfinite")
    acc_s, da_s, db_s = c.slots(op.operands)
    out = c.slot(op.results[0])
    rows, cols = fragment_coords(n)

    def operand(f: Frame, st: _State, desc: int, nrows: int, blk: int) -> tuple[Any, ...]:
        return shared_operand(f, st, desc, nrows, blk, dtype)

    def run(f: Frame) -> None:
        st = _state(f)
        acc = f.full(f.vals[acc_s])
        res = np.array(np.broadcast_to(acc, (f.T, n // 2)), np.float32)
        for blk, wg, idx in _warpgroups(f, "wgmma.mma_async"):
            key = (blk, wg)
            if key not in st.fenced:
                raise WgmmaOrderError(f"wgmma.mma_async in {f.describe_block(blk)} without a "
                                      "wgmma.fence since the last wait_group")
            da = _uniform_desc(f, f.vals[da_s], idx, "A")
            db = _uniform_desc(f, f.vals[db_s], idx, "B")
            a, rec_a = operand(f, st, da, 64, blk)
            b, rec_b = operand(f, st, db, n, blk)
            cm = None
            if accumulate:
                cm = np.zeros((64, n), np.float32)
                cm[rows, cols] = acc[idx]
            d = wgmma_bf16(a, b, cm)
            res[idx] = d[rows, cols]
            st.pending.setdefault(key, []).extend([rec_a, rec_b])
        f.vals[out] = res
    return run


# ---- register-A wgmma (inline PTX) ------------------------------------------------------------

#: the one inline-asm text modeled: ``blockscale.compiler.arch.wgmma.rs_asm`` (register A)
_RS = re.compile(r"\{\n\.reg \.pred p;\nsetp\.ne\.b32 p, 1, 0;\nwgmma\.mma_async\.sync\.aligned"
                 r"\.m64n(\d+)k16\.f32\.(f16|bf16)\.\2 \{[^}]*\}, \{[^}]*\}, \$\d+, p, 1, 1, 0;"
                 r"\n\}")


def rs_a_matrix(regs: list[np.ndarray], dtype: Any) -> np.ndarray:
    """A [64, 16] (float64) from the 128 threads' four i32 A registers (``regs[j]`` [128]):
    register j of thread t (warp w, g = lane // 4, q = lane % 4) holds A[16w + g + 8 (j % 2),
    2q + 8 (j // 2) + {0, 1}] (low half first)."""
    t = np.arange(128)
    w, lane = t // 32, t % 32
    a = np.zeros((64, 16), np.float64)
    for j, r in enumerate(regs):
        bits = np.asarray(r).astype(np.int64) & 0xFFFFFFFF
        halves = np.stack([bits & 0xFFFF, bits >> 16], axis=1).astype(np.uint16)
        vals = halves.view(dtype).astype(np.float64)
        row = 16 * w + lane // 4 + 8 * (j % 2)
        col = 2 * (lane % 4) + 8 * (j // 2)
        a[row, col] = vals[:, 0]
        a[row, col + 1] = vals[:, 1]
    return a


@handles("llvm.inline_asm")
def _inline_asm(op: Any, c: Compiler):
    from mlir import ir

    text = ir.StringAttr(op.attributes["asm_string"]).value
    if text == "":  # arch.wgmma.fence_values: the operands unchanged, as a struct
        ins = c.slots(op.operands)
        out0 = c.slot(op.results[0])

        def ident(f: Frame) -> None:
            f.vals[out0] = np.stack([f.full(f.vals[s]).astype(np.float32) for s in ins], axis=1)
        return ident
    m = _RS.fullmatch(text)
    if m is None:
        raise NotImplementedError(f"interpreter: llvm.inline_asm {text[:60]!r}")
    n, ty = int(m.group(1)), m.group(2)
    dtype = np.float16 if ty == "f16" else ml_dtypes.bfloat16
    h = n // 2
    slots = c.slots(op.operands)
    if len(slots) != h + 5:
        raise NotImplementedError(f"interpreter: register-A wgmma with {len(slots)} operands")
    acc_s, a_s, db_s = slots[:h], slots[h:h + 4], slots[h + 4]
    out = c.slot(op.results[0])
    rows, cols = fragment_coords(n)

    def run(f: Frame) -> None:
        st = _state(f)
        acc = np.stack([f.full(f.vals[s]).astype(np.float32) for s in acc_s], axis=1)
        res = np.array(acc, np.float32)
        for blk, wg, idx in _warpgroups(f, "wgmma.mma_async (register A)"):
            key = (blk, wg)
            if key not in st.fenced:
                raise WgmmaOrderError(f"wgmma.mma_async in {f.describe_block(blk)} without a "
                                      "wgmma.fence since the last wait_group")
            a = rs_a_matrix([f.full(f.vals[s])[idx] for s in a_s], dtype)
            b, rec = shared_operand(f, st, _uniform_desc(f, f.vals[db_s], idx, "B"), n, blk,
                                    dtype)
            cm = np.zeros((64, n), np.float32)
            cm[rows, cols] = acc[idx]
            res[idx] = wgmma_bf16(a, b, cm)[rows, cols]
            st.pending.setdefault(key, []).append(rec)
        f.vals[out] = res
    return run

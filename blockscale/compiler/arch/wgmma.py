"""NVVM warpgroup-level MMA helpers (sm_90a ``wgmma``), used by the sm_90a wgmma matmul.

Each docstring names the PTX instruction emitted. What the helpers rely on, restated from the
PTX ISA ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate Operation using wgmma"):

* A warpgroup is 4 consecutive warps (128 threads, the first warp's id a multiple of 4);
  every ``wgmma.*`` instruction is ``.sync.aligned``: all 128 threads execute it.
* ``wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 d, a-desc, b-desc, scale-d, 1, 1,
  0, 0``: ``D[64 x N] = A[64 x 16] @ B[16 x N] + (scale-d ? D : 0)`` with A and B read from
  shared memory through 64-bit *matrix descriptors*, both K-major (transpose bits 0:
  ``nvvm`` layouts A row, B col).
* Matrix descriptor (ISA "Matrix Descriptor Format"): bits 0-13 ``(start address & 0x3FFFF)
  >> 4``, bits 16-29 leading-dimension byte offset >> 4 (LBO), bits 32-45 stride-dimension
  byte offset >> 4 (SBO), bits 49-51 matrix base offset (0 here: swizzled tiles start on
  their pattern's repeat boundary), bits 62-63 swizzle mode (0 none, 1 128B, 2 64B, 3 32B).
* Canonical K-major layouts (bf16): the operand is made of *core matrices* of 8 rows x 16
  bytes. Without swizzle a core matrix is 128 contiguous bytes (row i at +16 i); the core
  matrix of row group ``g`` (rows 8g..8g+7) and K chunk ``c`` (bytes 16c..16c+15 of a row)
  starts at ``start + g * SBO + c * LBO``. With a 32/64/128-byte swizzle span S a row group is
  8 rows of S bytes (row i at +S i, K byte b at +b, b < S), groups SBO apart, and the address
  bits [4, 4 + log2(S/16)) are XORed with bits [7, 7 + log2(S/16)) (the TMA swizzle, so a
  TMA-swizzled tile is a valid operand); LBO is unused. K-steps inside a swizzled row advance
  the start address by 32 bytes.
* Accumulator fragment (ISA "Register fragments for wgmma, matrix D"): thread ``t`` of the
  warpgroup, warp ``w = t // 32``, ``g = (t % 32) // 4``, ``q = t % 4``, holds N/2 f32
  registers; register ``i`` is ``D[16 w + g + 8 ((i % 4) // 2), 8 (i // 4) + 2 q + i % 2]``
  (the ``mma.m16n8`` C layout repeated over N/8 column tiles, 4 warps stacked in M).
* Ordering: ``wgmma.fence.sync.aligned`` before the first ``mma_async`` and whenever the
  accumulator registers were touched by other instructions; shared-memory operand writes made
  by ordinary stores must be ordered before the async reads with
  ``fence.proxy.async.shared::cta`` (+ a CTA barrier when other threads wrote them);
  ``wgmma.commit_group.sync.aligned`` closes the pending ``mma_async``s into a group and
  ``wgmma.wait_group.sync.aligned N`` waits until at most N groups are pending; only then may
  the accumulators be read or the operand shared memory be overwritten.

The numpy interpreter models these (:mod:`blockscale.runtime.interpreter.ops_wgmma`).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, llvm, memref, nvvm

from blockscale.compiler.ir_types import _loc, f32, i64

#: swizzle names -> descriptor bits 62-63
SWIZZLE_MODES = {"none": 0, "128b": 1, "64b": 2, "32b": 3}
#: the N of m64nNk16 the helpers accept (multiples of 8 up to 256)
WGMMA_N = tuple(range(8, 257, 8))


def descriptor_bits(start: int, lbo: int, sbo: int, swizzle: str = "none",
                    base_offset: int = 0) -> int:
    """The 64-bit wgmma matrix descriptor (as an unsigned int) of a shared-memory operand at
    byte address ``start`` with leading / stride byte offsets ``lbo`` / ``sbo`` (multiples
    of 16 below 2^18) and ``swizzle`` (a key of :data:`SWIZZLE_MODES`)."""
    for name, v in (("start", start), ("lbo", lbo), ("sbo", sbo)):
        if v % 16 or not 0 <= v < 1 << 18:
            raise ValueError(f"{name} must be a multiple of 16 in [0, 2^18), got {v}")
    if swizzle not in SWIZZLE_MODES:
        raise ValueError(f"swizzle must be one of {list(SWIZZLE_MODES)}, got {swizzle!r}")
    if not 0 <= base_offset < 8:
        raise ValueError(f"base_offset must be in [0, 8), got {base_offset}")
    return ((start >> 4) | (lbo >> 4) << 16 | (sbo >> 4) << 32 | base_offset << 49
            | SWIZZLE_MODES[swizzle] << 62)


def _i64c(v: int) -> ir.Value:
    v &= (1 << 64) - 1
    return arith.constant(i64(), ir.IntegerAttr.get(i64(), v - (1 << 64) if v >> 63 else v))


def shared_address(buf: ir.Value, *, loc: ir.Location | None = None) -> ir.Value:
    """The shared-state-space byte address of a workgroup memref's aligned base, as i64
    (``memref.extract_aligned_pointer_as_index``: ``cvta``-free ``mov.u32 r, smem_sym``
    after lowering; the value the descriptor's start address field takes)."""
    with _loc(loc):
        p = memref.extract_aligned_pointer_as_index(buf)
        return arith.index_castui(i64(), p)


def descriptor(address: ir.Value, *, lbo: int, sbo: int, swizzle: str = "none",
               loc: ir.Location | None = None) -> ir.Value:
    """The i64 matrix descriptor of the operand at shared address ``address`` (i64, a
    multiple of 16): ``((address & 0x3FFFF) >> 4) | descriptor_bits(0, lbo, sbo, swizzle)``
    (``and.b64`` / ``shr.u64`` / ``or.b64``; constant-folded when ``address`` is)."""
    with _loc(loc):
        lo = arith.shrui(arith.andi(address, _i64c(0x3FFFF)), _i64c(4))
        return arith.ori(lo, _i64c(descriptor_bits(0, lbo, sbo, swizzle)))


def advance(desc: ir.Value, nbytes: int | ir.Value, *,
            loc: ir.Location | None = None) -> ir.Value:
    """``desc`` with its start address moved by ``nbytes`` (an int or an i64 value; a
    multiple of 16; the address field must not overflow): ``add.s64 desc, nbytes >> 4``."""
    with _loc(loc):
        if isinstance(nbytes, ir.Value):
            return arith.addi(desc, arith.shrui(nbytes, _i64c(4)))
        if nbytes % 16:
            raise ValueError(f"nbytes must be a multiple of 16, got {nbytes}")
        return arith.addi(desc, _i64c(nbytes >> 4))


def accumulator_type(n: int) -> ir.Type:
    """``!llvm.struct<(f32 x N/2)>``: one thread's m64nNk16 f32 accumulator fragment."""
    if n not in WGMMA_N:
        raise ValueError(f"n must be a multiple of 8 in [8, 256], got {n}")
    return ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * (n // 2)) + ")>")


def zero_accumulator(n: int, *, loc: ir.Location | None = None) -> ir.Value:
    """A zero accumulator fragment (``llvm.mlir.zero``: N/2 ``mov.f32 r, 0``)."""
    with _loc(loc):
        return llvm.mlir_zero(accumulator_type(n))


def accumulator_values(acc: ir.Value, n: int, *, loc: ir.Location | None = None
                       ) -> list[ir.Value]:
    """The N/2 f32 registers of an accumulator fragment (``llvm.extractvalue``; layout in the
    module docstring)."""
    with _loc(loc):
        return [llvm.extractvalue(f32(), acc, [i]) for i in range(n // 2)]


def fence(*, loc: ir.Location | None = None) -> None:
    """``wgmma.fence.sync.aligned`` (WARPSYNC + register ordering before ``mma_async``)."""
    with _loc(loc):
        nvvm.wgmma_fence_aligned()


def fence_proxy_async_shared(*, loc: ir.Location | None = None) -> None:
    """``fence.proxy.async.shared::cta``: orders this thread's prior generic-proxy shared
    stores before later async-proxy (wgmma / TMA) accesses."""
    with _loc(loc):
        nvvm.fence_proxy(nvvm.ProxyKind.async_shared, space=nvvm.SharedSpace.shared_cta)


def commit_group(*, loc: ir.Location | None = None) -> None:
    """``wgmma.commit_group.sync.aligned``: the pending ``mma_async``s form one group."""
    with _loc(loc):
        nvvm.wgmma_commit_group_sync_aligned()


def wait_group(pending: int, *, loc: ir.Location | None = None) -> None:
    """``wgmma.wait_group.sync.aligned pending``: wait until at most ``pending`` groups are
    in flight."""
    with _loc(loc):
        nvvm.wgmma_wait_group_sync_aligned(pending)


#: operand types of :func:`mma_async` (both operands the same type) -> K of one instruction
#: (32 bytes of a K-major row either way: 16 two-byte or 32 one-byte elements)
MMA_TYPES = {"bf16": 16, "f16": 16, "e4m3": 32}


def mma_async(acc: ir.Value, desc_a: ir.Value, desc_b: ir.Value, n: int, *,
              dtype: str = "bf16", accumulate: bool = True,
              loc: ir.Location | None = None) -> ir.Value:
    """``wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}.{bf16,f16}`` (HGMMA.64xNx16.F32
    [.BF16] in SASS) or ``...m64nNk32.f32.e4m3.e4m3`` (QGMMA.64xNx32.F32.E4M3.E4M3) with
    both operands K-major in shared memory (the same core-matrix layout: 16-byte rows): returns
    the new accumulator fragment ``A @ B + (acc if accumulate else 0)`` (``acc`` is then
    only a placeholder). Must be bracketed by :func:`fence` / :func:`commit_group` /
    :func:`wait_group` (module docstring)."""
    if dtype not in MMA_TYPES:
        raise ValueError(f"dtype must be one of {list(MMA_TYPES)}, got {dtype!r}")
    t = accumulator_type(n)
    ty = getattr(nvvm.WGMMATypes, dtype)
    with _loc(loc):
        shape = ir.Attribute.parse(f"#nvvm.shape<m = 64, n = {n}, k = {MMA_TYPES[dtype]}>")
        return nvvm.wgmma_mma_async(
            t, acc, desc_a, desc_b, shape, ty, ty, nvvm.WGMMATypes.f32,
            nvvm.WGMMAScaleOut.one if accumulate else nvvm.WGMMAScaleOut.zero,
            nvvm.WGMMAScaleIn.one, nvvm.WGMMAScaleIn.one,
            nvvm.MMALayout.row, nvvm.MMALayout.col)


def mma_async_bf16(acc: ir.Value, desc_a: ir.Value, desc_b: ir.Value, n: int, *,
                   accumulate: bool = True, loc: ir.Location | None = None) -> ir.Value:
    """:func:`mma_async` on bf16 operands (``...m64nNk16.f32.bf16.bf16``,
    HGMMA.64xNx16.F32.BF16)."""
    return mma_async(acc, desc_a, desc_b, n, dtype="bf16", accumulate=accumulate, loc=loc)


#: the register-A form's operand types (:func:`mma_async_rs`)
RS_TYPES = ("f16", "bf16")
#: the PTX of :func:`mma_async_rs` (``$i`` are LLVM inline-asm operands: the N/2 accumulator
#: outputs, their tied inputs, the 4 A registers, the B descriptor); the interpreter models
#: exactly this text (:mod:`blockscale.runtime.interpreter.ops_wgmma`)
RS_ASM = ("{{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{d}}}, {{{a}}}, ${b}, p, 1, 1, 0;"
          "\n}}")


def rs_asm(n: int, dtype: str) -> tuple[str, str]:
    """(asm text, constraints) of :func:`mma_async_rs` for ``n`` / ``dtype``."""
    h = n // 2
    text = RS_ASM.format(n=n, t=dtype, d=", ".join(f"${i}" for i in range(h)),
                         a=", ".join(f"${2 * h + i}" for i in range(4)), b=2 * h + 4)
    cons = ",".join(["=f"] * h + [str(i) for i in range(h)] + ["r"] * 4 + ["l"])
    return text, cons


def fence_values(values: list[ir.Value], *, loc: ir.Location | None = None) -> list[ir.Value]:
    """The f32 ``values`` passed through an empty volatile inline asm (tied ``=f`` / ``0``
    operands: no instruction): uses of the results cannot move above this point. Call it on
    the accumulators right after the ``wait_group`` that makes them final: LLVM does not know
    the wait defines them and otherwise hoists their first uses above it, and ptxas then
    serializes every wgmma (C7514). (CUTLASS's ``warpgroup_fence_operand``.)"""
    if not values:
        return []
    h = len(values)
    cons = ",".join(["=f"] * h + [str(i) for i in range(h)])
    t = ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * h) + ")>")
    with _loc(loc):
        res = llvm.inline_asm(t, list(values), "", cons, has_side_effects=True)
        return [llvm.extractvalue(f32(), res, [i]) for i in range(h)]


def mma_async_rs(acc: list[ir.Value], a: list[ir.Value], desc_b: ir.Value, n: int, *,
                 dtype: str = "f16", loc: ir.Location | None = None) -> list[ir.Value]:
    """``wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}`` with A from REGISTERS
    (HGMMA.64xNx16.F32 with a register A operand in SASS): ``acc + A @ B`` where ``acc`` is
    the N/2 f32 accumulator registers (:func:`accumulator_values` order), ``a`` the thread's
    four ``i32`` A registers (two 16-bit elements each, the lower first) and B K-major in
    shared memory (``desc_b``). A fragment (ISA "Register fragments for wgmma, matrix A"; the
    ``mma.m16n8k16`` A layout, warp ``w`` holding rows 16w..16w+15): with ``g = lane // 4``,
    ``q = lane % 4``, register 0 holds ``A[16w + g, 2q .. 2q+1]``, 1 ``A[16w + g + 8, 2q ..]``,
    2 ``A[16w + g, 2q+8 ..]``, 3 ``A[16w + g + 8, 2q+8 ..]``. The NVVM dialect's op takes
    only descriptors, so this is inline PTX. The tensor core reads the A registers
    asynchronously, but to LLVM and ptxas they are ordinary inputs, dead after the
    instruction: retire the wgmma (``wait_group 0``) before computing values that could
    reuse them (measured on the H200: with ``wait_group 1`` a step, wrong outputs). Same
    ordering rules as :func:`mma_async` (a :func:`fence` first; :func:`fence_values` on the
    accumulators after the wait). Returns the N/2 new accumulator values."""
    if dtype not in RS_TYPES:
        raise ValueError(f"dtype must be one of {list(RS_TYPES)}, got {dtype!r}")
    t = accumulator_type(n)
    if len(acc) != n // 2 or len(a) != 4:
        raise ValueError(f"mma_async_rs needs {n // 2} accumulator values and 4 A registers, "
                         f"got {len(acc)} and {len(a)}")
    text, cons = rs_asm(n, dtype)
    with _loc(loc):
        res = llvm.inline_asm(t, [*acc, *a, desc_b], text, cons, has_side_effects=True)
        return [llvm.extractvalue(f32(), res, [i]) for i in range(n // 2)]


__all__ = ["MMA_TYPES", "SWIZZLE_MODES", "accumulator_type", "accumulator_values", "advance",
           "commit_group", "descriptor", "descriptor_bits", "fence",
           "fence_proxy_async_shared", "fence_values", "mma_async", "mma_async_bf16",
           "mma_async_rs", "rs_asm",
           "shared_address", "wait_group", "zero_accumulator"]

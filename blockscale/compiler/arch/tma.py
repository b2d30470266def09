"""TMA (bulk tensor copy) and mbarrier helpers for sm_90a / sm_100a kernels.

Built on the upstream ``nvgpu`` dialect (lowered by ``convert-nvgpu-to-nvvm``, then
``convert-nvvm-to-llvm`` for the wait loop; see :func:`blockscale.compiler.pipeline.pass_pipeline`).
Each docstring names the PTX the helper ends up as. Use inside ``with kernel_module(...)``.

A tensor map reaches the kernel as a ``"tensormap"`` KernelArg (:mod:`blockscale.launch`): an
``!llvm.ptr`` to the 128-byte ``CUtensorMap`` the runtime encoded on the host, which
:func:`descriptor` views as the ``!nvgpu.tensormap.descriptor`` the nvgpu ops take.

Swizzle: with ``swizzle="128b"`` the copy engine stores 16-byte chunk ``c`` of the 128-byte
shared-memory row ``r`` at chunk ``c ^ (r % 8)`` (address bits [4:6] ^= bits [7:9]; the tile
must be 1024-byte aligned). :func:`swizzled_chunk` is that map, for the readers.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlir import ir
from mlir.dialects import arith, builtin, nvgpu, nvvm

from blockscale.compiler.ir_types import _loc, i64, index
from blockscale.launch import TENSORMAP_SWIZZLES, KernelArg

#: suspend-time hint (ns) of the mbarrier wait loop (the usual CUTLASS value).
WAIT_TICKS = 10_000_000
_MLIR_DTYPES = {"bfloat16": "bf16", "float32": "f32", "uint8": "i8", "int8": "i8",
                "float8_e4m3fn": "i8", "float8_e8m0fnu": "i8", "int32": "i32", "uint32": "i32",
                "int64": "i64"}
_SHARED = "#gpu.address_space<workgroup>"


def _idx(v: int | ir.Value) -> ir.Value:
    if isinstance(v, int):
        return arith.constant(index(), ir.IntegerAttr.get(index(), v))
    if isinstance(v.type, ir.IndexType):
        return v
    return arith.index_castui(index(), v)


def tile_type(arg: KernelArg) -> ir.Type:
    """The shared-memory tile one box of tensormap ``arg`` fills: ``memref<box reversed x T, 3>``
    (outermost dim first)."""
    shape = "x".join(str(b) for b in reversed(arg.box))
    return ir.Type.parse(f"memref<{shape}x{_MLIR_DTYPES[arg.dtype]}, 3>")


def descriptor_type(arg: KernelArg) -> ir.Type:
    """``!nvgpu.tensormap.descriptor`` of tensormap ``arg`` (box, swizzle, zero OOB fill)."""
    sw = "none" if arg.swizzle == "none" else f"swizzle_{arg.swizzle}"
    return ir.Type.parse(f"!nvgpu.tensormap.descriptor<tensor = {tile_type(arg)}, "
                         f"swizzle = {sw}, l2promo = none, oob = zero, interleave = none>")


def descriptor(ptr: ir.Value, arg: KernelArg, *, loc: ir.Location | None = None) -> ir.Value:
    """View the ``!llvm.ptr`` kernel parameter of tensormap ``arg`` as its nvgpu descriptor
    (``builtin.unrealized_conversion_cast``; folds away in lowering, no instruction)."""
    with _loc(loc):
        return builtin.unrealized_conversion_cast([descriptor_type(arg)], [ptr])


def shared_buffer(kb: object, memref_type: str, *, align: int = 16) -> ir.Value:
    """A static shared-memory buffer: a ``workgroup`` attribution of the kernel being built by
    ``kb`` (a :class:`blockscale.compiler.ir.KernelBuilder`), aligned to ``align`` bytes
    (``.shared .align <align> .b8 __wg_<kernel>_<n>[...]``). ``memref_type`` is the shape and
    element, e.g. ``"128x64xbf16"``."""
    func = kb.func  # type: ignore[attr-defined]
    attrs = func.attributes
    n = int(ir.IntegerAttr(attrs["workgroup_attributions"]).value) \
        if "workgroup_attributions" in attrs else 0
    t = ir.Type.parse(f"memref<{memref_type}, {_SHARED}>")
    entry = func.regions[0].blocks[0]
    ninputs = len(ir.FunctionType(ir.TypeAttr(attrs["function_type"]).value).inputs)
    if len(entry.arguments) != ninputs + n:
        raise RuntimeError("shared_buffer: add shared buffers before private attributions")
    value = entry.add_argument(t, ir.Location.unknown())
    attrs["workgroup_attributions"] = ir.IntegerAttr.get(i64(), n + 1)
    old = list(ir.ArrayAttr(attrs["workgroup_attrib_attrs"])) \
        if "workgroup_attrib_attrs" in attrs else []
    align_attr = ir.DictAttr.get({"llvm.align": ir.IntegerAttr.get(i64(), align)})
    attrs["workgroup_attrib_attrs"] = ir.ArrayAttr.get(old + [align_attr])
    return value


#: the symbol of :func:`extern_shared_buffer`
EXTERN_SHARED = "__extern_shared"


def extern_shared_buffer(kb: object, size: int, *, align: int = 16) -> ir.Value:
    """The kernel's dynamic shared memory (``size`` bytes, passed at launch) as
    ``memref<?xi8, workgroup>``, declared as CUDA's ``extern __shared__`` array:
    ``.extern .shared .align <align> .b8 __extern_shared[]`` (an external 0-byte
    ``memref.global``), which ptxas places after the static shared memory, rounded up to
    ``align``. One per kernel module (a second call returns the same bytes; ``align`` of the
    first).

    Use it instead of ``gpu.dynamic_shared_memory`` in a kernel that also has static shared
    memory (:func:`shared_buffer`, :func:`mbarrier_group`): that op lowers to an *internal*
    0-byte global, which the NVPTX backend emits as a static ``.shared`` variable (``//
    demoted variable``) that ptxas places at the start of the static shared memory, so the
    dynamic bytes overwrite the static buffers (issue #9). The interpreter refuses
    ``gpu.dynamic_shared_memory`` next to static shared memory."""
    from mlir.dialects import memref

    t = ir.MemRefType.get([0], ir.IntegerType.get_signless(8),
                          memory_space=ir.Attribute.parse(_SHARED))
    gmod = kb.func.operation.parent  # type: ignore[attr-defined]
    body = gmod.regions[0].blocks[0]
    if not any(o.operation.name == "memref.global"
               and ir.StringAttr(o.operation.attributes["sym_name"]).value == EXTERN_SHARED
               for o in body.operations):
        with ir.InsertionPoint.at_block_begin(body):
            memref.GlobalOp(sym_name=EXTERN_SHARED, type_=ir.TypeAttr.get(t),
                            sym_visibility="public", initial_value=None,
                            alignment=ir.IntegerAttr.get(i64(), align))
    dyn = ir.ShapedType.get_dynamic_size()
    res = ir.MemRefType.get([dyn], t.element_type, memory_space=t.memory_space)
    return memref.reinterpret_cast(res, memref.get_global(t, EXTERN_SHARED), [], [_idx(size)],
                                   [], [0], [dyn], [1])


def mbarrier_group(count: int = 1, *, loc: ir.Location | None = None) -> ir.Value:
    """``count`` mbarriers in shared memory (``nvgpu.mbarrier.create``:
    ``.shared .align 8 .b8 __mbarrier[8 * count]``)."""
    with _loc(loc):
        t = ir.Type.parse(f"!nvgpu.mbarrier.group<memorySpace = {_SHARED}"
                          + (f", num_barriers = {count}>" if count != 1 else ">"))
        return nvgpu.mbarrier_create(t)


def mbarrier_init(group: ir.Value, arrivals: int | ir.Value, barrier: int | ir.Value = 0, *,
                  loc: ir.Location | None = None) -> None:
    """Initialise an mbarrier for ``arrivals`` arrivals per phase, phase parity 0:
    ``mbarrier.init.shared.b64 [bar], arrivals``. One thread."""
    with _loc(loc):
        nvgpu.mbarrier_init(group, _idx(arrivals), _idx(barrier))


def fence_mbarrier_init(*, loc: ir.Location | None = None) -> None:
    """Make an mbarrier's initialisation visible to the async proxy (the copy engine):
    ``fence.mbarrier_init.release.cluster``. Follow it with a block barrier."""
    with _loc(loc):
        nvvm.fence_mbarrier_init()


def mbarrier_arrive_expect_tx(group: ir.Value, tx_bytes: int | ir.Value,
                              barrier: int | ir.Value = 0, *,
                              loc: ir.Location | None = None) -> None:
    """Add ``tx_bytes`` to the current phase's expected transaction count, then arrive:
    ``mbarrier.arrive.expect_tx.shared.b64 _, [bar], tx_bytes``."""
    with _loc(loc):
        nvgpu.mbarrier_arrive_expect_tx(group, _idx(tx_bytes), _idx(barrier))


def mbarrier_wait(group: ir.Value, parity: int | ir.Value, barrier: int | ir.Value = 0, *,
                  ticks: int = WAIT_TICKS, loc: ir.Location | None = None) -> None:
    """Block until the phase of parity ``parity`` of the mbarrier has completed (all arrivals
    and all expected transaction bytes): a loop over
    ``mbarrier.try_wait.parity.shared.b64 p, [bar], parity, ticks``."""
    with _loc(loc):
        if isinstance(parity, int):
            parity = arith.constant(ir.IntegerType.get_signless(1),
                                    ir.BoolAttr.get(bool(parity & 1)))
        nvgpu.mbarrier_try_wait_parity(group, parity, _idx(ticks), _idx(barrier))


def tma_load(dst: ir.Value, desc: ir.Value, coords: Sequence[int | ir.Value], group: ir.Value,
             barrier: int | ir.Value = 0, *, loc: ir.Location | None = None) -> None:
    """Copy the box at ``coords`` (elements, innermost dim first) of the tensor behind
    ``desc`` into the shared tile ``dst``; out-of-bounds elements are zero; the bytes complete
    the mbarrier's transaction count:
    ``cp.async.bulk.tensor.<n>d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
    [dst], [tmap, {coords}], [bar]``. One thread."""
    with _loc(loc):
        nvgpu.tma_async_load(dst, group, desc, [_idx(c) for c in coords], _idx(barrier))


def swizzled_chunk(row: ir.Value, chunk: ir.Value | int, swizzle: str = "128b", *,
                   loc: ir.Location | None = None) -> ir.Value:
    """Where the copy engine put 16-byte chunk ``chunk`` of tile row ``row`` (rows of the
    swizzle span): ``chunk ^ (row % (span / 16))``. Integer ops only; same type as ``row``."""
    span = TENSORMAP_SWIZZLES[swizzle]
    with _loc(loc):
        c = chunk if isinstance(chunk, ir.Value) else arith.constant(
            row.type, ir.IntegerAttr.get(row.type, chunk))
        if span == 0:
            return c
        mask = arith.constant(row.type, ir.IntegerAttr.get(row.type, span // 16 - 1))
        return arith.xori(c, arith.andi(row, mask))

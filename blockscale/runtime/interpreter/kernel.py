"""run_kernel: parse a module, compile the gpu.func, run the grid batch by batch."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import dtypes
from .compiler import Compiler, RegionCode
from .frame import Frame
from .memory import Buffer, MemRef

#: threads run in lock-step per batch; blocks are grouped so a batch has at most this many
#: threads (bounds memory: every SSA value is one array over the batch).
DEFAULT_BATCH_THREADS = 1 << 17


def warp_size_for(target: str) -> int:
    """Warp (wavefront) width of a target name: sm_* -> 32, gfx* -> 64."""
    if target.startswith("sm_"):
        return 32
    if target.startswith("gfx"):
        return 64
    raise ValueError(f"target must be an sm_* or gfx* name (e.g. 'sm_90a', 'gfx950'), "
                     f"got {target!r}")


class CompiledKernel:
    """A gpu.func compiled to closures, with its parameter types. Keeps its MLIR context."""

    def __init__(self, mlir_text: str, kernel_name: str) -> None:
        from mlir import ir

        from . import (  # noqa: F401
            ops_arith,
            ops_atomics,
            ops_cluster,
            ops_control,
            ops_cpasync,
            ops_gpu,
            ops_memory,
            ops_mfma,
            ops_mma,
            ops_tcgen05,
            ops_tma,
            ops_wgmma,
        )

        self.context = ir.Context()
        self.context.allow_unregistered_dialects = False
        with self.context:
            self.module = ir.Module.parse(mlir_text)
            func, symbols = _find_kernel(self.module, kernel_name)
            self.compiler = Compiler(symbols)
            attrs = func.attributes
            fn_type = ir.FunctionType(ir.TypeAttr(attrs["function_type"]).value)
            self.param_types = [str(t) for t in fn_type.inputs]
            n_in = len(self.param_types)
            n_wg = int(str(attrs["workgroup_attributions"]).split(":")[0]) \
                if "workgroup_attributions" in attrs else 0
            self.known_block = tuple(int(x) for x in attrs["known_block_size"]) \
                if "known_block_size" in attrs else None
            region = func.regions[0]
            self.body: RegionCode = self.compiler.compile_region(region)
            args = list(region.blocks[0].arguments)
            from .ops_memory import memref_info

            self.param_info = [memref_info(a.type) if t.startswith("memref") else None
                               for a, t in zip(args[:n_in], self.param_types)]
            self.attributions = [(i, memref_info(a.type), "shared" if i < n_in + n_wg
                                  else "private") for i, a in enumerate(args) if i >= n_in]
            if self.attributions and any(k == "shared" for _, _, k in self.attributions):
                self.compiler.uses_shared = True
        self.name = kernel_name


def _find_kernel(module: Any, name: str) -> tuple[Any, dict[str, Any]]:
    found = []

    def visit(ops: Any, symbols: dict[str, Any]) -> None:
        for op in ops:
            opname = op.operation.name
            if opname == "gpu.module":
                inner = {}
                body = list(op.regions[0].blocks[0].operations)
                for o in body:
                    if "sym_name" in o.attributes:
                        inner[str(o.attributes["sym_name"]).strip('"')] = o
                visit(body, inner)
            elif opname == "gpu.func" and str(op.attributes["sym_name"]).strip('"') == name:
                found.append((op, symbols))
            elif opname == "builtin.module":
                visit(op.regions[0].blocks[0].operations, symbols)

    visit(module.body.operations, {})
    if not found:
        raise ValueError(f"no gpu.func named {name!r} in the module")
    if len(found) > 1:
        raise ValueError(f"several gpu.func named {name!r} in the module")
    return found[0]


@functools.lru_cache(maxsize=32)
def compile_kernel(mlir_text: str, kernel_name: str) -> CompiledKernel:
    """Parse and compile (cached on the text and the name)."""
    return CompiledKernel(mlir_text, kernel_name)


def _check_dims(name: str, v: Sequence[int]) -> tuple[int, int, int]:
    t = tuple(int(x) for x in v)
    if len(t) != 3 or any(x < 0 for x in t):
        raise ValueError(f"{name} must be 3 non-negative ints, got {v!r}")
    return t  # type: ignore[return-value]


def run_kernel(mlir_text: str, kernel_name: str, grid: Sequence[int], block: Sequence[int],
               args: list, target: str, *, warp_size: int | None = None,
               arg_names: Sequence[str] | None = None, check_uninit: bool = True,
               batch_threads: int = DEFAULT_BATCH_THREADS,
               dynamic_shared_bytes: int = 0, check_races: bool = True,
               cluster: Sequence[int] | None = None) -> None:
    """Execute the gpu.func ``kernel_name`` of ``mlir_text`` on the CPU.

    Args:
        mlir_text: the module (before target lowering) holding a gpu.module with the kernel.
        kernel_name: the gpu.func's symbol name.
        grid, block: launch dimensions (x, y, z); ``block`` must match ``known_block_size``.
        args: one entry per kernel parameter: a contiguous numpy array for each memref
            parameter (mutated in place; viewed as the memref element type, which must have
            the same item size) and a Python number for each scalar.
        target: "sm_*" (warp 32) or "gfx*" (wavefront 64); ``warp_size`` overrides it.
        arg_names: names used in error messages (default ``arg0``, ``arg1``, ...).
        check_uninit: raise on reads of never-written shared memory.
        batch_threads: at most this many threads run in lock-step per batch of blocks.
        dynamic_shared_bytes: size of ``gpu.dynamic_shared_memory`` per block.
        check_races: track shared-memory accesses between barriers and raise on races
            (False also turns off ``check_uninit``; faster for shared-heavy kernels).
        cluster: (x, y, z) CTAs per thread-block cluster (a cluster launch; each grid
            dimension a multiple of it): every cluster runs inside one batch, in lock-step
            (:mod:`.ops_cluster`).

    Raises:
        IndexError: an out-of-bounds load or store (buffer, index, thread and block named).
        SharedMemoryRaceError, BarrierDivergenceError, ShuffleError,
        UninitializedSharedReadError: the kernel's synchronisation is wrong.
        NotImplementedError: the kernel uses an op the interpreter does not model.
    """
    grid = _check_dims("grid", grid)
    block = _check_dims("block", block)
    ws = warp_size or warp_size_for(target)
    k = compile_kernel(mlir_text, kernel_name)
    if k.known_block is not None and tuple(k.known_block) != block:
        raise ValueError(f"block {block} differs from the kernel's known_block_size "
                         f"{k.known_block}")
    if len(args) != len(k.param_types):
        raise ValueError(f"kernel {kernel_name} takes {len(k.param_types)} arguments "
                         f"{k.param_types}, got {len(args)}")
    names = list(arg_names) if arg_names is not None else [f"arg{i}" for i in range(len(args))]
    values = [_bind(a, t, info, f"{names[i]} (arg #{i})")
              for i, (a, t, info) in enumerate(zip(args, k.param_types, k.param_info))]
    nthreads = block[0] * block[1] * block[2]
    nblocks = grid[0] * grid[1] * grid[2]
    if nthreads == 0 or nblocks == 0:
        return
    per_batch = max(1, min(nblocks, batch_threads // nthreads))
    if cluster is not None:
        cdims = _check_dims("cluster", cluster)
        if min(cdims) < 1 or any(g % c for g, c in zip(grid, cdims)):
            raise ValueError(f"cluster {cdims} must be positive and divide the grid {grid}")
        # whole cluster boxes per batch: whole rows of clusters along y / z
        unit = cdims[0] * cdims[1] * cdims[2] if cdims[1] == cdims[2] == 1 else (
            grid[0] * grid[1] * cdims[2] if cdims[2] > 1 else grid[0] * cdims[1])
        per_batch = max(unit, per_batch // unit * unit)
    slots = k.compiler.nslots
    from .ops_memory import alloc_buffer

    for first in range(0, nblocks, per_batch):
        f = Frame([None] * slots, block, grid, first, min(per_batch, nblocks - first), ws,
                  check_uninit=check_uninit, dynamic_shared_bytes=dynamic_shared_bytes,
                  check_races=check_races)
        if cluster is not None:
            f.__dict__["cluster"] = cdims
        attr_vals = []
        for i, (shape, strides, offset, dt, _), space in k.attributions:
            buf = alloc_buffer(f"attribution #{i - len(args)} ({space})", space, shape, dt, f,
                               check_uninit)
            attr_vals.append(MemRef(buf, shape, strides, offset))
        k.body.run(f, values + attr_vals)


def _bind(a: Any, type_str: str, info: Any, name: str) -> Any:
    if type_str == "!llvm.ptr":  # a tensormap argument (blockscale.launch)
        from .ops_tma import TensorMap

        if not isinstance(a, TensorMap):
            raise TypeError(f"{name}: expected a TensorMap for !llvm.ptr, got "
                            f"{type(a).__name__}")
        return a
    if info is None:
        dt = dtypes.scalar_dtype(type_str)
        if isinstance(a, np.ndarray) and a.size != 1:
            raise TypeError(f"{name}: expected a scalar {type_str}, got an array")
        with np.errstate(all="ignore"):
            if dt.kind == "i" and not isinstance(a, np.ndarray):
                return np.array([int(a) & (2**64 - 1)], np.uint64).view(np.int64).astype(dt)
            return np.asarray(a).reshape(1).astype(dt)
    shape, strides, offset, dt, _ = info
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array for {type_str}, got "
                        f"{type(a).__name__}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: the array must be C-contiguous")
    if a.dtype.itemsize != dt.itemsize:
        raise TypeError(f"{name}: {a.dtype} array for {type_str} (element size "
                        f"{a.dtype.itemsize} != {dt.itemsize})")
    flat = a.reshape(-1).view(dt)
    need = offset + sum((d - 1) * s for d, s in zip(shape, strides) if d is not None) + 1
    if all(d is not None for d in shape) and flat.size < need:
        raise ValueError(f"{name}: {flat.size} elements, {type_str} needs {need}")
    return MemRef(Buffer(name, "global", flat, flat.size), shape, strides, offset)

"""Dynamic shared memory next to static shared memory (issue #9).

``gpu.dynamic_shared_memory`` lowers to an internal 0-byte global that NVPTX emits as a
*static* ``.shared`` variable, placed by ptxas among the static buffers: on the H200 the
TMA-fed wgmma kernel's stages overwrote its mbarriers and TMA ring, while the interpreter
(separate arrays) said bit-exact. The interpreter now refuses that combination, and
:func:`blockscale.compiler.arch.tma.extern_shared_buffer` (CUDA's ``extern __shared__``
array, after the static memory) is the way; both checked here, and the PTX of the fix.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from blockscale.launch import KernelArg

pytest.importorskip("mlir")

from blockscale.runtime.interpreter import run_kernel

N = 32


def _kernel(dynamic: str) -> str:
    """Thread t writes t + 100 to static[t] and t to the dynamic bytes' word t, then reads
    dynamic word (t + 1) % N + static[t] into y[t]."""
    from mlir import ir
    from mlir.dialects import gpu, memref

    from blockscale.compiler import ir as bir
    from blockscale.compiler.arch import tma

    with ir.Context(), ir.Location.unknown():
        with bir.kernel_module("k", "sm_90a", [KernelArg("y", "buffer", "int32", "out")],
                               (N, 1, 1)) as kb:
            static = tma.shared_buffer(kb, f"{N}xi32", align=16)
            if dynamic == "extern":
                dyn = tma.extern_shared_buffer(kb, 4 * N)
            else:
                t = ir.MemRefType.get([ir.ShapedType.get_dynamic_size()], bir.i8(),
                                      memory_space=ir.Attribute.parse(
                                          "#gpu.address_space<workgroup>"))
                dyn = gpu.dynamic_shared_memory(t)
            tid = bir.thread_idx("x")
            bir.store(bir.add(bir.as_i32(tid), bir.const(100, bir.i32())), static, tid)
            words = memref.view(ir.MemRefType.get([N], bir.i32(),
                                                  memory_space=ir.MemRefType(dyn.type)
                                                  .memory_space),
                                dyn, bir.as_index(bir.const(0)), [])
            bir.store(bir.as_i32(tid), words, tid)
            bir.barrier()
            nxt = bir.urem(bir.add(tid, 1), N)
            bir.store(bir.add(bir.load(words, nxt), bir.load(static, tid)), kb.arg("y"), tid)
        kb.module.operation.verify()
        return str(kb.module)


@pytest.mark.interp
def test_extern_shared_is_the_dynamic_memory_beside_static_buffers():
    y = np.zeros(N, np.int32)
    run_kernel(_kernel("extern"), "k", (1, 1, 1), (N, 1, 1), [y], "sm_90a",
               dynamic_shared_bytes=4 * N)
    t = np.arange(N)
    np.testing.assert_array_equal(y, (t + 1) % N + t + 100)


@pytest.mark.interp
def test_gpu_dynamic_shared_memory_beside_static_buffers_is_refused():
    with pytest.raises(NotImplementedError, match="aliases it on hardware"):
        run_kernel(_kernel("gpu"), "k", (1, 1, 1), (N, 1, 1), [np.zeros(N, np.int32)],
                   "sm_90a", dynamic_shared_bytes=4 * N)


@pytest.mark.lower
def test_extern_shared_ptx_follows_the_static_memory():
    """The PTX declares ``.extern .shared ... __extern_shared[]`` (no demoted 0-byte
    ``.shared`` variable), as the ws / tma wgmma kernels do."""
    from blockscale.ops import matmul_wgmma

    spec = matmul_wgmma.WgmmaMatmulSpec("nvfp4", "float32", None, 128, 128, "sm_90a", "shift",
                                        64, "fold", "tma")
    ptx = matmul_wgmma.kernel(spec).asm["ptx"]
    assert re.search(r"\.extern \.shared \.align 16 \.b8 __extern_shared\[\];", ptx)
    assert not re.search(r"\.shared \.align \d+ \.b8 \w+;", ptx)  # a 0-byte static var

"""The numpy interpreter: executes kernel IR (a gpu.func before target lowering) on the CPU.

Threads run in lock-step, vectorized over a leading thread axis that spans every thread of a
batch of blocks; divergent control flow runs under an execution mask; barriers, shuffles and
shared memory are checked (divergent barriers, races between barriers, out-of-bounds accesses
and reads of inactive lanes raise). Target intrinsics are modeled from their ISA definitions
(:mod:`.intrinsics`). mlir is imported only when a kernel is run.

Entry point: :func:`run_kernel` (docs/internals.md).

Modeling choices worth knowing:

* blocks are batched (``batch_threads`` threads at a time) whether or not they use shared
  memory: shared buffers have one copy per block, barriers are checked per block;
* ``gpu.subgroup_reduce`` combines lanes in butterfly order (xor 1, 2, 4, ...), the order of
  the upstream shuffle lowering; atomics apply in thread order;
* transcendental math ops (exp, log, tanh, ...) use numpy's float32 functions, which are not
  bit-identical to the GPU approximations (so no blockscale kernel emits them: the sigmoid's
  exp is ``exp_f32``, plain IEEE mul/add, see docs/internals.md); conversions and
  + - * / fma sqrt are exact IEEE;
* out-of-range float -> int conversions saturate (NaN -> 0); integer division by zero gives a
  deterministic value instead of UB.
"""

from .frame import (
                    BarrierDivergenceError,
                    SharedMemoryRaceError,
                    ShuffleError,
                    UninitializedSharedReadError,
)
from .kernel import run_kernel, warp_size_for

__all__ = [
                    "BarrierDivergenceError",
                    "SharedMemoryRaceError",
                    "ShuffleError",
                    "UninitializedSharedReadError",
                    "run_kernel",
                    "warp_size_for",
]

"""The numpy interpreter: executes kernel IR (a gpu.func before target lowering) on the CPU.

Threads run in lock-step, vectorized over a leading thread axis that spans every thread of a
batch of blocks; divergent control flow runs under an execution mask; barriers, shuffles and
shared memory are checked (divergent barriers, races between barriers, out-of-bounds accesses
and reads of inactive lanes raise). Target intrinsics are modeled from their ISA definitions
(:mod:`.intrinsics`). mlir is imported only when a kernel is run.

Entry point: :func:`run_kernel` (docs/internals.md).
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

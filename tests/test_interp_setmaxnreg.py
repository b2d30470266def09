"""``setmaxnreg`` (:func:`blockscale.compiler.arch.nvvm.set_max_registers`): the PTX it emits
and the interpreter's model (no effect on values; whole warpgroups; the count checked)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mlir")

from blockscale.compiler import ir as bir
from blockscale.compiler.arch import nvvm
from blockscale.launch import KernelArg
from blockscale.runtime.interpreter import run_kernel
from blockscale.runtime.interpreter.frame import BarrierDivergenceError


def _kernel(threads_in: int, count: int, increase: bool = True) -> str:
    """256 threads; threads < ``threads_in`` run setmaxnreg, then every thread writes
    its index to x[tid]."""
    args = (KernelArg("x", "buffer", "int32"),)
    with bir.kernel_module("k", "sm_90a", args, (256, 1, 1)) as kb:
        tid = bir.thread_idx("x")
        with bir.when(bir.ult(tid, threads_in)):
            nvvm.set_max_registers(count, increase)
        bir.store(bir.as_i32(tid), kb.arg("x"), tid)
    return str(kb.module)


@pytest.mark.interp
@pytest.mark.parametrize("increase", [True, False])
def test_whole_warpgroups(increase):
    text = _kernel(128, 232 if increase else 40, increase)
    assert ("setmaxregister  increase 232" if increase else "decrease 40") in text
    x = np.full(256, -1, np.int32)
    run_kernel(text, "k", (1, 1, 1), (256, 1, 1), [x], "sm_90a")
    np.testing.assert_array_equal(x, np.arange(256))


@pytest.mark.interp
def test_part_of_a_warpgroup_raises():
    x = np.zeros(256, np.int32)
    with pytest.raises(BarrierDivergenceError, match="64 of the 128 threads of warpgroup 0"):
        run_kernel(_kernel(64, 232), "k", (1, 1, 1), (256, 1, 1), [x], "sm_90a")


@pytest.mark.ir
@pytest.mark.parametrize("count", [20, 100, 264, 232.0])
def test_count_checked(count):
    with pytest.raises(ValueError, match="multiple of 8 in \\[24, 256\\]"):
        _kernel(128, count)

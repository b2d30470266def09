"""Target-specific helpers lower to the instruction their docstring names (tier lower)."""

from __future__ import annotations

import pytest

from blockscale.launch import KernelArg
from tests._compiler_helpers import skip_unless_toolchain

pytestmark = pytest.mark.lower
ARGS = (KernelArg("out", "buffer", "int32", "out"),)


def _compile(target, body):
    from blockscale.compiler import ir as b
    from blockscale.compiler import pipeline

    with b.kernel_module("arch_probe", target, ARGS, block=64) as k:
        v = body(b)
        b.store(v, k.arg("out"), b.thread_idx())
    return pipeline.compile_module(k.module, target, kernel_name="arch_probe", args=ARGS,
                                   block=(64, 1, 1))


def test_nvvm_helpers_emit_their_ptx():
    skip_unless_toolchain("sm_90a")
    from blockscale.compiler.arch import nvvm

    def body(b):
        lane = nvvm.lane_id()
        x = nvvm.shfl_xor(lane, 1)
        y = nvvm.shfl_idx(x, 3)
        return nvvm.byte_perm(x, y, 0x5410)

    ptx = _compile("sm_90a", body).asm["ptx"]
    for instr in ("%laneid", "shfl.sync.bfly.b32", "shfl.sync.idx.b32", "prmt.b32"):
        assert instr in ptx, instr


def test_rocdl_helpers_emit_their_isa():
    skip_unless_toolchain("gfx950")
    from blockscale.compiler.arch import rocdl

    def body(b):
        lane = rocdl.lane_id()
        x = rocdl.ds_bpermute(lane, b.cast_int(b.thread_idx(), b.i32()))
        return rocdl.readfirstlane(x)

    kernel = _compile("gfx950", body)
    # with a 64-thread block LLVM folds mbcnt to the thread id, so check the intrinsics
    assert "llvm.amdgcn.mbcnt.lo" in kernel.asm["llvm"]
    assert "llvm.amdgcn.mbcnt.hi" in kernel.asm["llvm"]
    for instr in ("ds_bpermute_b32", "v_readfirstlane_b32"):
        assert instr in kernel.asm["amdgcn"], instr

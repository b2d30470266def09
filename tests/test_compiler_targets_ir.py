"""GPUTarget and the IR builder helpers (tier ir: builds and verifies MLIR, no LLVM backend)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from blockscale.compiler.targets import TARGETS, GPUTarget
from blockscale.launch import KernelArg

pytestmark = pytest.mark.ir


def test_parse_targets_and_properties():
    assert [t.name for t in TARGETS] == ["sm_90a", "sm_100a", "gfx942", "gfx950"]
    sm100 = GPUTarget.parse("SM_100A")
    assert (sm100.backend, sm100.binary_kind, sm100.warp_size, sm100.asm_stage) == \
        ("cuda", "cubin", 32, "ptx")
    assert sm100.ptx_version >= (8, 6)
    gfx = GPUTarget.parse("gfx950")
    assert (gfx.backend, gfx.binary_kind, gfx.warp_size, gfx.asm_stage) == \
        ("hip", "hsaco", 64, "amdgcn")
    assert GPUTarget.parse(gfx) is gfx


def test_parse_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"target must be one of .*sm_90a.*got 'sm_80'"):
        GPUTarget.parse("sm_80")
    with pytest.raises(TypeError, match="target must be a str or GPUTarget, got int"):
        GPUTarget.parse(90)


def test_importing_package_and_ops_does_not_import_mlir():
    code = ("import sys, blockscale, blockscale.ops, blockscale.ops.interleave, "
            "blockscale.compiler.targets; "
            "from blockscale.ops import _core, interleave; "
            "_core.kernel_key(interleave.InterleaveSpec()); "
            "assert not any(m == 'mlir' or m.startswith('mlir.') for m in sys.modules), "
            "sorted(m for m in sys.modules if m.startswith('mlir'))")
    subprocess.run([sys.executable, "-c", code], check=True)


ARGS = (KernelArg("src", "buffer", "uint8"), KernelArg("dst", "buffer", "float32", "out"),
        KernelArg("n", "scalar", "i32"), KernelArg("alpha", "scalar", "f32"))


def _loop_kernel(target):
    """A kernel using loops with carried values, if-with-results, when, fori."""
    from blockscale.compiler import ir as b

    with b.kernel_module("probe", target, ARGS, block=(128, 2)) as k:
        n = b.as_index(k.arg("n"))
        with b.for_range(0, n, 1, carry=[b.const(0, b.i32())]) as loop:
            v = b.cast_int(b.load(k.arg("src"), loop.iv), b.i32())
            loop.yield_(b.add(loop.carried[0], v))
        total = loop.results[0]
        br = b.if_(b.ult(total, 100), [b.i32()])
        with br.then():
            br.yield_(total)
        with br.else_():
            br.yield_(b.const(100, b.i32()))

        @b.fori(0, 4, carry=[br.results[0]])
        def doubled(i, acc):
            return b.add(acc, acc)

        with b.when(b.eq(b.linear_thread_idx(), 0)):
            lane, warp = b.lane_idx(), b.warp_idx()
            f = b.bitcast(doubled[0], b.f32())
            b.store(f, k.arg("dst"), b.add(lane, warp))
            b.store(k.arg("alpha"), k.arg("dst"), b.block_dim("y"))
    return k


@pytest.mark.parametrize("target", ["sm_90a", "gfx950"])
def test_kernel_module_structure_and_verification(target):
    k = _loop_kernel(target)
    assert k.module.operation.verify()
    text = str(k.module)
    assert "gpu.container_module" in text
    assert GPUTarget.parse(target).target_attr_text().split("<")[0] in text
    assert "gpu.func @probe(%arg0: memref<?xi8>, %arg1: memref<?xf32>, %arg2: i32, %arg3: f32)" \
        in text
    assert "known_block_size = array<i32: 128, 2, 1>" in text
    assert "scf.for" in text and "scf.if" in text and "iter_args" in text
    warp = GPUTarget.parse(target).warp_size
    assert f"arith.constant {warp} : index" in text  # lane/warp ids use the target warp size
    assert "gpu.block_dim" not in text  # block dims are constants (no __ockl calls on AMD)


def test_locations_point_at_the_python_line():
    from blockscale.compiler import ir as b

    with b.kernel_module("loc", "sm_90a", ARGS, block=32) as k:
        idx = b.thread_idx()  # the line the location must name
        line = sys._getframe().f_lineno - 1
        b.store(b.const(1.0, b.f32()), k.arg("dst"), idx)
    text = k.module.operation.get_asm(enable_debug_info=True)
    assert f'{__file__}":{line}:' in text


def test_kernel_module_rejects_bad_arguments():
    from blockscale.compiler import ir as b

    with pytest.raises(ValueError, match="block must have at most 1024 threads"), \
            b.kernel_module("bad", "sm_90a", ARGS, block=(1024, 2)):
        pass
    with pytest.raises(ValueError, match="args must have unique names"), \
            b.kernel_module("bad", "sm_90a", ARGS + ARGS[:1], block=32):
        pass
    with pytest.raises(ValueError, match="has no argument 'nope'"), \
            b.kernel_module("bad", "sm_90a", ARGS, block=32) as k:
        k.arg("nope")


def test_loop_with_carry_must_yield():
    from blockscale.compiler import ir as b

    with pytest.raises(ValueError, match="must end with loop.yield_"), \
            b.kernel_module("bad", "sm_90a", ARGS, block=32), \
            b.for_range(0, 4, carry=[b.const(0, b.i32())]):
        pass


def test_i32_bits_takes_patterns_and_signed_values():
    from blockscale.compiler import ir as b

    with b.kernel_module("bits", "sm_90a", ARGS, block=32) as k:
        vals = [b.i32_bits(v) for v in (0x80808080, 0xFFFFFFFF, -1, 7)]
        b.store(b.const(1.0, b.f32()), k.arg("dst"), b.thread_idx())
        with pytest.raises(ValueError, match=r"v must be in \[-2\^31, 2\^32\)"):
            b.i32_bits(1 << 32)
        with pytest.raises(ValueError, match="v must be in"):
            b.i32_bits(-(1 << 31) - 1)
    assert [str(v.owner.attributes["value"]) for v in vals] == [
        "-2139062144 : i32", "-1 : i32", "-1 : i32", "7 : i32"]

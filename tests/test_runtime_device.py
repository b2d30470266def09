"""Device selection, target checks and kernel argument packing (no GPU needed)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from blockscale.launch import KernelArg, KernelBinary
from blockscale.runtime import cuda as rt_cuda
from blockscale.runtime import device as rt_device
from blockscale.runtime import hip as rt_hip
from blockscale.runtime.device import (
    ArgPack,
    check_buffer_dtype,
    check_scalar,
    cubin_runs_on,
    device_report,
    get_device,
    normalize_grid,
    parse_sm_target,
)
from blockscale.runtime.interp_device import InterpDevice


@pytest.fixture(autouse=True)
def fresh_devices(monkeypatch):
    monkeypatch.delenv("BLOCKSCALE_DEVICE", raising=False)
    rt_device._reset_for_tests()
    yield
    rt_device._reset_for_tests()


def kernel_with(args, *, name="k", target="sm_90a", kind="cubin", smem=0, mlir="module {}"):
    return KernelBinary(name=name, target=target, binary_kind=kind, binary=b"\x7fELF fake",
                        args=tuple(args), block=(128, 1, 1), dynamic_shared_bytes=smem,
                        mlir=mlir)


# ----------------------------------------------------------------------------- selection

def test_fallback_to_interpreter_records_why(monkeypatch):
    monkeypatch.setattr(rt_cuda, "cuda_unavailable_reason", lambda: "no libcuda (test)")
    monkeypatch.setattr(rt_hip, "hip_unavailable_reason", lambda: "no hip-python (test)")
    dev = get_device()
    assert isinstance(dev, InterpDevice) and dev.name == "interp"
    report = device_report()
    assert "cuda: not used: no libcuda (test)" in report
    assert "hip: not used: no hip-python (test)" in report
    assert "interp: selected" in report
    assert get_device() is dev  # chosen once


def test_this_machine_without_libcuda_falls_back_with_reason():
    reason = rt_cuda.cuda_unavailable_reason()
    if reason is None:
        pytest.skip("this machine has a usable CUDA GPU; the fallback is covered by the "
                    "monkeypatched test")
    assert get_device().name in ("hip", "interp")
    assert "cuda: not used:" in device_report()
    assert reason in device_report()
    with pytest.raises(RuntimeError, match="device 'cuda' is not usable"):
        get_device("cuda")


def test_no_driver_is_loaded_at_import():
    import subprocess
    import sys

    code = ("import sys, blockscale.runtime, blockscale.runtime.cuda, blockscale.runtime.hip, "
            "blockscale.runtime.program\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('mlir', 'torch', 'hip') "
            "or m.startswith('cuda.bindings.driver') or m.startswith('blockscale.compiler')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_env_override(monkeypatch):
    monkeypatch.setenv("BLOCKSCALE_DEVICE", "interp")
    assert get_device().name == "interp"
    assert "$BLOCKSCALE_DEVICE=interp" in device_report()


def test_env_override_bad_name(monkeypatch):
    monkeypatch.setenv("BLOCKSCALE_DEVICE", "tpu")
    with pytest.raises(ValueError, match=r"\$BLOCKSCALE_DEVICE.*'cuda', 'hip', 'interp'.*'tpu'"):
        get_device()


@pytest.mark.parametrize("name", ["cpu", "gpu", "cuda:x", "interp:1", ""])
def test_bad_names_list_the_valid_ones(name):
    with pytest.raises(ValueError, match=r"\('cuda', 'hip', 'interp'\)"):
        get_device(name)


def test_non_string_name():
    with pytest.raises(TypeError, match="device: expected a str"):
        get_device(3)


def test_device_instance_passes_through():
    dev = InterpDevice()
    assert get_device(dev) is dev
    assert get_device("INTERP") is get_device("interp")


# ----------------------------------------------------------------------------- targets

def test_parse_sm_target():
    assert parse_sm_target("sm_90a") == (9, 0, "a")
    assert parse_sm_target("sm_100a") == (10, 0, "a")
    assert parse_sm_target("sm_89") == (8, 9, "")
    with pytest.raises(ValueError, match="'gfx942'"):
        parse_sm_target("gfx942")


def test_cubin_compatibility():
    assert cubin_runs_on("sm_90a", (9, 0))
    assert not cubin_runs_on("sm_90a", (10, 0))
    assert not cubin_runs_on("sm_100a", (9, 0))
    assert cubin_runs_on("sm_80", (8, 6))
    assert not cubin_runs_on("sm_80", (9, 0))


def fake_cuda(capability=(9, 0), smem=227 * 1024):
    """A CudaDevice with the attributes a real one reads from the driver (no driver calls)."""
    dev = object.__new__(rt_cuda.CudaDevice)
    rt_device.GpuDevice.__init__(dev, 0)
    dev.capability, dev.device_name, dev.max_dynamic_smem = capability, "Fake H200", smem
    return dev


def test_cuda_rejects_foreign_binaries():
    dev = fake_cuda((9, 0))
    dev.check_kernel(kernel_with([], target="sm_90a"))
    with pytest.raises(ValueError, match=r"hsaco .*gfx942.*expected a cubin"):
        dev.check_kernel(kernel_with([], target="gfx942", kind="hsaco"))
    with pytest.raises(ValueError, match=r"sm_100a.*compute capability 9\.0.*expected a cubin "
                                         r"for sm_90"):
        dev.check_kernel(kernel_with([], target="sm_100a"))
    with pytest.raises(ValueError, match=r"sm_90a.*compute capability 10\.0"):
        fake_cuda((10, 0)).check_kernel(kernel_with([], target="sm_90a"))
    with pytest.raises(ValueError, match="300000 bytes of dynamic shared memory.*232448"):
        dev.check_kernel(kernel_with([], smem=300_000))


def test_hip_rejects_foreign_binaries():
    dev = object.__new__(rt_hip.HipDevice)
    rt_device.GpuDevice.__init__(dev, 0)
    dev.arch, dev.device_name, dev.max_dynamic_smem = "gfx950", "Fake MI355X", 160 * 1024
    dev.check_kernel(kernel_with([], target="gfx950", kind="hsaco"))
    with pytest.raises(ValueError, match=r"cubin .*expected a hsaco"):
        dev.check_kernel(kernel_with([], target="sm_90a"))
    with pytest.raises(ValueError, match=r"gfx942.*is gfx950; expected a hsaco for gfx950"):
        dev.check_kernel(kernel_with([], target="gfx942", kind="hsaco"))


def test_interp_needs_mlir():
    with pytest.raises(ValueError, match="has no MLIR text"):
        InterpDevice().check_kernel(kernel_with([], mlir=""))


def test_normalize_grid():
    assert normalize_grid(7, "k") == (7, 1, 1)
    assert normalize_grid((2, 3), "k") == (2, 3, 1)
    with pytest.raises(ValueError, match="kernel 'k': grid dims must be >= 1"):
        normalize_grid((0, 1, 1), "k")
    with pytest.raises(ValueError, match="1 to 3 dims"):
        normalize_grid((1, 1, 1, 1), "k")


# ----------------------------------------------------------------------------- packing

MIXED_ARGS = [
    KernelArg("a", "buffer", "uint8", "in"),
    KernelArg("n", "scalar", "i32"),
    KernelArg("b", "buffer", "float32", "out"),
    KernelArg("alpha", "scalar", "f32"),
    KernelArg("big", "scalar", "i64"),
]


def test_arg_pack_exact_layout():
    pack = ArgPack(kernel_with(MIXED_ARGS))
    # a: 5 x 8 bytes at 0..32; n: 4 bytes at 40; b: aligned to 48, 5 x 8; alpha at 88;
    # big: aligned to 96.
    assert pack.offsets == (0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96)
    assert pack.num_params == 13 and pack.struct.size == 104
    a_ptr, b_ptr = 0x7F0000001000, 0x7F0000002000
    pack.pack([(a_ptr, 300), 300, (b_ptr, 75), 0.5, -(2**40)])
    expected = (struct.pack("<QQqqq", a_ptr, a_ptr, 0, 300, 1) + struct.pack("<i", 300)
                + b"\0" * 4 + struct.pack("<QQqqq", b_ptr, b_ptr, 0, 75, 1)
                + struct.pack("<f", 0.5) + b"\0" * 4 + struct.pack("<q", -(2**40)))
    assert pack.packed_bytes() == expected
    base = pack.storage.ctypes.data
    assert pack.pointers.tolist() == [base + o for o in pack.offsets]
    # kernelParams[i] points at parameter i
    assert np.frombuffer(pack.storage[pack.offsets[5]:pack.offsets[5] + 4].tobytes(),
                         np.int32)[0] == 300


def test_arg_pack_scalars_only_and_empty():
    pack = ArgPack(kernel_with([KernelArg("x", "scalar", "f32"), KernelArg("y", "scalar", "f32")]))
    assert pack.offsets == (0, 4)
    assert ArgPack(kernel_with([])).num_params == 0


def test_scalar_checks_name_the_argument():
    arg = KernelArg("rows", "scalar", "i32")
    assert check_scalar("k", arg, np.int64(5)) == 5
    with pytest.raises(ValueError,
                       match=r"kernel 'k' arg 'rows': i32 must be in .* got 2147483648"):
        check_scalar("k", arg, 2**31)
    with pytest.raises(TypeError, match=r"arg 'rows': expected an int \(i32\), got float"):
        check_scalar("k", arg, 1.5)
    with pytest.raises(TypeError, match=r"expected a float \(f32\), got str"):
        check_scalar("k", KernelArg("s", "scalar", "f32"), "1")


def test_buffer_dtype_checks():
    import ml_dtypes

    arg = KernelArg("x", "buffer", "uint8")
    check_buffer_dtype("k", arg, np.dtype(ml_dtypes.float8_e4m3fn))  # bytes stand for bytes
    check_buffer_dtype("k", KernelArg("y", "buffer", "bfloat16"), np.dtype(ml_dtypes.bfloat16))
    with pytest.raises(TypeError, match="arg 'y': expected a float32 buffer, got int32"):
        check_buffer_dtype("k", KernelArg("y", "buffer", "float32"), np.dtype(np.int32))


def test_shared_memory_opt_in_counts_static_bytes():
    """MAX_DYNAMIC_SHARED_SIZE_BYTES is raised where static + dynamic shared memory passes
    48 KiB, also with less than 48 KiB dynamic (the fused quantize kernels' tables + ring)."""
    from blockscale.runtime.cuda import needs_smem_opt_in

    kib = 1024
    assert not needs_smem_opt_in(0, 40 * kib)
    assert not needs_smem_opt_in(8 * kib, 40 * kib)
    assert needs_smem_opt_in(8 * kib + 16, 40 * kib)
    assert needs_smem_opt_in(32 * kib, 40 * kib)
    assert needs_smem_opt_in(49 * kib, 0)

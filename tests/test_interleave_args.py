"""block_scales_interleave's device-memory argument: checked once (one resolution of a
foreign buffer, not one for the alignment, one for the check and one in the launch), the
errors naming the user's argument ``scales_2d`` (the kernel's is "scales"), and the
launch given the same memory, stream and vector flags as before. On a no-op GPU
(tests/test_host_overhead.NullGpu: driver calls do nothing) with fake kernels."""

from __future__ import annotations

import types

import ml_dtypes
import numpy as np
import pytest
from test_host_overhead import NullGpu, TorchLike, fake_kernels  # noqa: F401 (fixture)

from blockscale.ops import interleave
from blockscale.runtime import arrays
from blockscale.runtime.arrays import DeviceArray

pytestmark = pytest.mark.usefixtures("fake_kernels")

ROWS, KBLOCKS = 128, 256  # VEC4 | VEC16 when the input is 16-byte aligned


def _count_resolutions(monkeypatch) -> list[str]:
    """Names passed to as_device_buffer (wherever it is called from)."""
    seen: list[str] = []
    real = arrays.as_device_buffer

    def spy(obj, name, *rest, **kw):
        seen.append(name)
        return real(obj, name, *rest, **kw)

    monkeypatch.setattr(arrays, "as_device_buffer", spy)
    import blockscale.ops._core as core
    from blockscale.runtime import device as device_mod

    for mod in (core, device_mod):  # modules that imported it by name
        if hasattr(mod, "as_device_buffer"):
            monkeypatch.setattr(mod, "as_device_buffer", spy)
    return seen


def _launched_scales(dev: NullGpu, monkeypatch) -> list[tuple]:
    """(the scales launch argument, the vec_ok scalar, the launch stream) per launch."""
    out: list[tuple] = []
    launch = dev.launch

    def spy(kernel, grid, args, *rest):
        names = [a.name for a in kernel.args]
        out.append((args[names.index("scales")], args[names.index("vec_ok")], rest))
        return launch(kernel, grid, args, *rest)

    monkeypatch.setattr(dev, "launch", spy)
    return out


@pytest.mark.parametrize("offset,vec", [(0, interleave.VEC4 | interleave.VEC16),
                                        (8, interleave.VEC4), (1, 0)])
def test_torch_input_resolved_once(offset, vec, monkeypatch):
    dev = NullGpu()
    base = dev.alloc((ROWS * KBLOCKS + 16,), np.uint8, stream=9)
    mem = DeviceArray(dev, base.ptr + offset, (ROWS, KBLOCKS), ml_dtypes.float8_e4m3fn,
                      base=base)
    t = TorchLike(mem, "torch.float8_e4m3fn")
    seen = _count_resolutions(monkeypatch)
    launches = _launched_scales(dev, monkeypatch)
    out = interleave.block_scales_interleave(t, device=dev)
    assert seen == ["scales_2d"]  # once, under the user's name
    (scales, vec_ok, _), = launches
    assert type(scales) is DeviceArray and scales.device is dev and scales.ptr == mem.ptr
    assert scales.shape == (ROWS, KBLOCKS) and scales._base is t  # borrowed, kept alive
    assert vec_ok == vec
    assert out.shape == interleave.output_shape(ROWS, KBLOCKS)


def test_own_device_array_not_resolved(monkeypatch):
    dev = NullGpu()
    x = dev.alloc((ROWS, KBLOCKS), np.uint8, stream=4)
    seen = _count_resolutions(monkeypatch)
    launches = _launched_scales(dev, monkeypatch)
    interleave.block_scales_interleave(x, device=dev)
    assert seen == [] and launches[0][0] is x and launches[0][1] == (interleave.VEC4
                                                                     | interleave.VEC16)


def _bad(kind: str, dev: NullGpu):
    mem = dev.alloc((ROWS, KBLOCKS), np.uint8)
    if kind == "strided":
        return TorchLike(mem, "torch.uint8", contiguous=False)
    if kind == "other_gpu":
        t = TorchLike(mem, "torch.uint8")
        t.device = types.SimpleNamespace(type="cuda", index=3)
        return t
    if kind == "null":
        return TorchLike(DeviceArray(dev, 0, (ROWS, KBLOCKS), np.uint8), "torch.uint8")
    return DeviceArray(NullGpu(), mem.ptr, (ROWS, KBLOCKS), np.uint8)  # another device's


@pytest.mark.parametrize("kind,exc,needle", [
    ("strided", ValueError, "scales_2d: expected a C-contiguous array"),
    ("other_gpu", ValueError, "scales_2d: expected a tensor on cuda:0"),
    ("null", ValueError, "scales_2d: null pointer"),
    ("foreign_device_array", ValueError, "scales_2d: expected memory of device"),
])
def test_bad_device_memory_named_scales_2d(kind, exc, needle, monkeypatch):
    dev = NullGpu()
    if kind == "other_gpu":  # NullGpu keeps GpuDevice's no-op hook: use the CUDA device's
        from blockscale.runtime.cuda import CudaDevice

        monkeypatch.setattr(dev, "check_foreign_memory",
                            types.MethodType(CudaDevice.check_foreign_memory, dev))
    launches = _launched_scales(dev, monkeypatch)
    with pytest.raises(exc) as info:
        interleave.block_scales_interleave(_bad(kind, dev), device=dev)
    assert str(info.value).startswith(needle), str(info.value)
    assert launches == []

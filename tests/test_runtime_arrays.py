"""DeviceArray, DLPack / CUDA Array Interface interop and GpuDevice launch plumbing, checked on
a fake GPU whose "device memory" is host memory (no GPU needed)."""

from __future__ import annotations

import ctypes
import gc
import struct

import ml_dtypes
import numpy as np
import pytest

from blockscale.launch import KernelArg, KernelBinary
from blockscale.runtime import arrays as rt_arrays
from blockscale.runtime.arrays import DeviceArray, as_device_buffer, io_mode
from blockscale.runtime.device import GpuDevice


class HostMemoryGpu(GpuDevice):
    """A GpuDevice on host memory: records launches instead of running them."""

    name = "cuda"
    binary_kind = "cubin"

    def __init__(self):
        super().__init__(0)
        self.blocks: dict[int, ctypes.Array] = {}
        self.launches: list[dict] = []
        self.synced: list[int] = []

    def _malloc(self, nbytes, stream=0):
        block = ctypes.create_string_buffer(nbytes)
        self.blocks[ctypes.addressof(block)] = block
        return ctypes.addressof(block)

    def _free(self, ptr, stream=0):
        del self.blocks[ptr]

    def _htod(self, dst, src, nbytes, stream):
        ctypes.memmove(dst, src, nbytes)

    def _dtoh(self, dst, src, nbytes, stream):
        ctypes.memmove(dst, src, nbytes)

    def _memset(self, dst, nbytes, stream):
        ctypes.memset(dst, 0, nbytes)

    def _load_function(self, kernel):
        self.loaded = getattr(self, "loaded", 0) + 1
        return f"fn:{kernel.name}"

    def _set_dynamic_smem_limit(self, function, kernel):
        self.smem_limits = getattr(self, "smem_limits", []) + [kernel.dynamic_shared_bytes]

    def _launch_raw(self, function, grid, kernel, stream, params_address):
        pack = self.kernel_handle(kernel)[1]
        self.launches.append({"function": function, "grid": grid, "stream": stream,
                              "params": pack.packed_bytes(),
                              "address_ok": params_address == pack.params_address})

    def stream_synchronize(self, stream):
        self.synced.append(stream)

    def synchronize(self):
        pass

    def check_kernel(self, kernel):
        super().check_kernel(kernel)


class FakeCAI:
    """An object exposing only ``__cuda_array_interface__`` (like CuPy / numba arrays)."""

    def __init__(self, **cai):
        self._cai = {"version": 3, "data": (0x1000, False), "typestr": "<f4", **cai}

    @property
    def __cuda_array_interface__(self):
        return self._cai


class FakeTorchTensor:
    """Duck-typed like a torch tensor (the runtime never imports torch)."""

    def __init__(self, shape, dtype="torch.bfloat16", contiguous=True, is_cuda=True):
        self.shape, self.dtype, self._contig, self.is_cuda = shape, dtype, contiguous, is_cuda
        self.device = "cuda:0" if is_cuda else "cpu"

    def data_ptr(self):
        return 0xABC000

    def is_contiguous(self):
        return self._contig

    def stride(self):
        return (1, self.shape[0])


FakeTorchTensor.__module__ = "torch.fake"


@pytest.fixture
def gpu():
    return HostMemoryGpu()


# ----------------------------------------------------------------------------- DeviceArray

@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float32, ml_dtypes.bfloat16,
                                   ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu])
def test_round_trip_is_bit_exact(gpu, dtype):
    rng = np.random.default_rng(1234)
    host = rng.integers(0, 256, size=(5, 7) if np.dtype(dtype).itemsize == 1 else (5, 7 * 4),
                        dtype=np.uint8).view(dtype)
    arr = DeviceArray.from_numpy(host, device=gpu)
    assert arr.shape == host.shape and arr.dtype == np.dtype(dtype)
    back = arr.numpy()
    assert back.dtype == host.dtype
    np.testing.assert_array_equal(back.view(np.uint8), host.view(np.uint8))


def test_memory_is_freed_with_the_array(gpu):
    arr = DeviceArray.from_numpy(np.arange(10, dtype=np.int32), device=gpu)
    view = arr.view(np.float32).reshape(2, 5)
    assert view.shape == (2, 5) and len(gpu.blocks) == 1
    del arr
    gc.collect()
    assert len(gpu.blocks) == 1  # the view keeps it alive
    del view
    gc.collect()
    assert not gpu.blocks


def test_view_and_reshape_errors(gpu):
    arr = gpu.zeros((4, 4), np.uint8)
    assert np.all(arr.numpy() == 0)
    with pytest.raises(ValueError, match="dtype: expected a 1-byte dtype.*float32"):
        arr.view(np.float32)
    with pytest.raises(ValueError, match=r"cannot reshape \(4, 4\) to \(3, 5\)"):
        arr.reshape(3, 5)
    assert arr.reshape(-1).shape == (16,)


def test_from_numpy_needs_a_gpu():
    with pytest.raises(TypeError, match="needs a GPU device.*'interp'"):
        DeviceArray.from_numpy(np.zeros(3), device="interp")
    with pytest.raises(TypeError, match="array: expected a numpy.ndarray, got list"):
        DeviceArray.from_numpy([1, 2], device="interp")


def test_cuda_array_interface(gpu):
    arr = gpu.alloc((3, 4), np.float32, stream=7)
    cai = arr.__cuda_array_interface__
    assert cai == {"shape": (3, 4), "typestr": "<f4", "data": (arr.ptr, False), "version": 3,
                   "strides": None, "stream": 7}
    assert gpu.alloc((1,), np.uint8).__cuda_array_interface__["stream"] == 1  # legacy default
    buf = as_device_buffer(arr, "x")
    assert buf == (arr.ptr, (3, 4), np.dtype(np.float32), 7)


@pytest.mark.parametrize("dtype,code,bits", [(np.uint8, 1, 8), (np.int32, 0, 32),
                                             (np.float32, 2, 32), (ml_dtypes.bfloat16, 4, 16),
                                             (ml_dtypes.float8_e4m3fn, 10, 8),
                                             (ml_dtypes.float8_e8m0fnu, 14, 8)])
def test_dlpack_capsule(gpu, dtype, code, bits):
    arr = gpu.alloc((2, 3, 4), dtype)
    assert arr.__dlpack_device__() == (2, 0)  # kDLCUDA, device 0
    capsule = arr.__dlpack__(stream=None)
    ptr, shape, dt, device, contiguous = rt_arrays._import_capsule(capsule, "x")
    assert (ptr, shape, dt, device, contiguous) == (arr.ptr, (2, 3, 4), np.dtype(dtype), (2, 0),
                                                    True)
    managed = ctypes.cast(rt_arrays._capsule_get_pointer(capsule, b"dltensor"),
                          ctypes.POINTER(rt_arrays._DLManagedTensor)).contents
    assert (managed.dl_tensor.dtype.code, managed.dl_tensor.dtype.bits,
            managed.dl_tensor.dtype.lanes) == (code, bits, 1)
    assert not managed.dl_tensor.strides  # NULL = compact row-major
    n_exports = len(rt_arrays._exports)
    del capsule, managed
    gc.collect()
    assert len(rt_arrays._exports) == n_exports - 1  # the unconsumed capsule released it


def test_dlpack_export_keeps_the_array_alive(gpu):
    arr = gpu.alloc((8,), np.uint8)
    capsule = arr.__dlpack__()
    del arr
    gc.collect()
    assert len(gpu.blocks) == 1
    del capsule
    gc.collect()
    assert not gpu.blocks


def test_dlpack_syncs_the_producer_stream_and_rejects_copies(gpu):
    arr = gpu.alloc((4,), np.float32, stream=5)
    arr.__dlpack__(stream=9)
    assert gpu.synced == [5]
    arr.__dlpack__(stream=5)
    arr.__dlpack__(stream=-1)
    assert gpu.synced == [5]
    with pytest.raises(BufferError, match="copy=True"):
        arr.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="cannot export to device"):
        arr.__dlpack__(dl_device=(1, 0))


def test_dlpack_consumer_path(gpu):
    """An object that is only a DLPack producer (no CAI) is read through its capsule."""
    src = gpu.alloc((6,), ml_dtypes.bfloat16)

    class OnlyDLPack:
        def __dlpack__(self, stream=None):
            return src.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return src.__dlpack_device__()

    buf = as_device_buffer(OnlyDLPack(), "x", stream=3)
    assert buf == (src.ptr, (6,), np.dtype(ml_dtypes.bfloat16), 3)


# ----------------------------------------------------------------------------- duck typing

def test_cai_contiguous_and_strides():
    assert as_device_buffer(FakeCAI(shape=(4, 8)), "x") == (0x1000, (4, 8), np.dtype("f4"), None)
    # explicit C strides are fine; a size-1 dim's stride does not matter
    assert as_device_buffer(FakeCAI(shape=(4, 8), strides=(32, 4)), "x").shape == (4, 8)
    assert as_device_buffer(FakeCAI(shape=(1, 8), strides=(999, 4)), "x").shape == (1, 8)
    assert as_device_buffer(FakeCAI(shape=(4, 8), stream=42), "x").stream == 42


@pytest.mark.parametrize("strides", [(4, 16), (64, 4), (32, 8)])
def test_cai_non_contiguous_names_the_argument(strides):
    with pytest.raises(ValueError, match=r"scales: expected a C-contiguous array, got shape "
                                         r"\(4, 8\) with strides"):
        as_device_buffer(FakeCAI(shape=(4, 8), strides=strides), "scales")


def test_cai_bad_inputs():
    with pytest.raises(TypeError, match="x: malformed __cuda_array_interface__"):
        as_device_buffer(FakeCAI(shape=None), "x")
    with pytest.raises(TypeError, match="x: __cuda_array_interface__ typestr '<V2' is raw"):
        as_device_buffer(FakeCAI(shape=(2,), typestr="<V2"), "x")
    with pytest.raises(ValueError, match="masked"):
        as_device_buffer(FakeCAI(shape=(2,), mask=object()), "x")


def test_host_and_unknown_objects_are_rejected():
    with pytest.raises(TypeError, match="a: expected device memory, got a numpy array"):
        as_device_buffer(np.zeros(3), "a")
    with pytest.raises(TypeError, match="b: expected a DeviceArray.*got list"):
        as_device_buffer([1, 2], "b")


def test_torch_duck_typing():
    buf = as_device_buffer(FakeTorchTensor((4, 2)), "x")
    assert buf.ptr == 0xABC000 and buf.shape == (4, 2)
    assert buf.dtype == np.dtype(ml_dtypes.bfloat16)
    assert as_device_buffer(FakeTorchTensor((4,), "torch.float8_e8m0fnu"), "x").dtype == \
        np.dtype(ml_dtypes.float8_e8m0fnu)
    with pytest.raises(ValueError, match="w: expected a C-contiguous array.*contiguous()"):
        as_device_buffer(FakeTorchTensor((4, 2), contiguous=False), "w")
    with pytest.raises(ValueError, match="w: expected a CUDA tensor, got a tensor on cpu"):
        as_device_buffer(FakeTorchTensor((4, 2), is_cuda=False), "w")
    with pytest.raises(TypeError, match="w: unsupported torch dtype torch.complex64"):
        as_device_buffer(FakeTorchTensor((4,), "torch.complex64"), "w")


def test_io_mode(gpu):
    a = np.zeros(3)
    assert io_mode(a, None, 3, 1.5) == "numpy"
    assert io_mode(a, FakeCAI(shape=(3,))) == "device"
    assert io_mode(gpu.alloc((1,), np.uint8)) == "device"
    assert io_mode(FakeTorchTensor((2,))) == "device"
    with pytest.raises(TypeError, match="input 1: expected a numpy array or device memory, "
                                        "got list"):
        io_mode(a, [1])


# ----------------------------------------------------------------------------- launch

ARGS = (KernelArg("x", "buffer", "bfloat16"), KernelArg("y", "buffer", "uint8", "out"),
        KernelArg("n", "scalar", "i32"), KernelArg("s", "scalar", "f32"))
KERNEL = KernelBinary(name="scale_k", target="sm_90a", binary_kind="cubin", binary=b"cubin",
                      args=ARGS, block=(128, 1, 1))


def test_launch_packs_descriptors_and_uses_the_producer_stream(gpu):
    x = gpu.alloc((4, 8), ml_dtypes.bfloat16)
    y = gpu.alloc((16,), ml_dtypes.float8_e4m3fn)
    torch_like = FakeCAI(shape=(32,), typestr="|u1", data=(0x5000, False), stream=77)
    gpu.launch(KERNEL, (3,), [x, torch_like, 32, 0.25])
    gpu.launch(KERNEL, (3, 2), [x, y, 7, 1], stream=5)
    first, second = gpu.launches
    assert first["grid"] == (3, 1, 1) and first["stream"] == 77 and first["address_ok"]
    assert first["params"] == (struct.pack("<QQqqq", x.ptr, x.ptr, 0, 32, 1)
                               + struct.pack("<QQqqq", 0x5000, 0x5000, 0, 32, 1)
                               + struct.pack("<if", 32, 0.25))
    assert second["grid"] == (3, 2, 1) and second["stream"] == 5
    assert y.stream == 5  # our arrays remember the stream that last wrote them
    assert len(gpu._kernels) == 1  # loaded once


def test_launch_errors_name_kernel_and_argument(gpu):
    x = gpu.alloc((4,), ml_dtypes.bfloat16)
    y = gpu.alloc((4,), np.uint8)
    with pytest.raises(ValueError, match=r"kernel 'scale_k': expected 4 args \['x', 'y', 'n', "
                                         r"'s'\], got 3"):
        gpu.launch(KERNEL, (1,), [x, y, 1])
    with pytest.raises(TypeError, match="kernel 'scale_k' arg 'x': expected a bfloat16 buffer, "
                                        "got float32"):
        gpu.launch(KERNEL, (1,), [gpu.alloc((4,), np.float32), y, 1, 1.0])
    with pytest.raises(TypeError, match="kernel 'scale_k' arg 'y': expected device memory, "
                                        "got a numpy array"):
        gpu.launch(KERNEL, (1,), [x, np.zeros(4, np.uint8), 1, 1.0])
    with pytest.raises(ValueError, match="kernel 'scale_k' arg 'y': expected a C-contiguous"):
        gpu.launch(KERNEL, (1,), [x, FakeCAI(shape=(2, 2), typestr="|u1", strides=(1, 2)), 1, 1.0])
    with pytest.raises(TypeError, match="stream: expected None, an int handle"):
        gpu.launch(KERNEL, (1,), [x, y, 1, 1.0], stream="s")
    with pytest.raises(ValueError, match="kernel 'scale_k': a hsaco"):
        gpu.launch(KernelBinary("scale_k", "gfx942", "hsaco", b"h", ARGS, (64, 1, 1)),
                   (1,), [x, y, 1, 1.0])


def test_kernel_cache_rechecks_targets_and_raises_the_smem_limit(gpu):
    import dataclasses

    x, y = gpu.alloc((4,), ml_dtypes.bfloat16), gpu.alloc((4,), np.uint8)
    small = dataclasses.replace(KERNEL, dynamic_shared_bytes=1024)
    big = dataclasses.replace(KERNEL, dynamic_shared_bytes=100 * 1024)
    for k in (small, small, big, small, big):
        gpu.launch(k, (1,), [x, y, 4, 1.0])
    assert gpu.loaded == 1 and gpu.smem_limits == [1024, 100 * 1024]
    # same name and bytes, another target: checked again, not served from the cache
    with pytest.raises(ValueError, match="kernel 'scale_k': a hsaco"):
        gpu.launch(dataclasses.replace(KERNEL, binary_kind="hsaco", target="gfx942"), (1,),
                   [x, y, 4, 1.0])


def test_arrays_of_another_device_are_rejected(gpu):
    other = HostMemoryGpu()
    x, y = other.alloc((4,), ml_dtypes.bfloat16), gpu.alloc((4,), np.uint8)
    with pytest.raises(ValueError, match="kernel 'scale_k' arg 'x': expected memory on cuda:0, "
                                         "got an array on cuda:0"):
        gpu.launch(KERNEL, (1,), [x, y, 4, 1.0])

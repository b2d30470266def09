"""CUDA driver runtime on cuda-python (``cuda.bindings.driver``).

The driver is loaded on first use, never at import. A :class:`CudaDevice` retains the GPU's
primary context (the one torch and CuPy use, so pointers are shared), loads cubins with
``cuModuleLoadData``, raises the dynamic shared memory limit of kernels that need more than
48 KiB, and launches with ``cuLaunchKernel`` from a parameter block laid out once per kernel
(:class:`~blockscale.runtime.device.ArgPack`). Every driver call goes through :func:`check`,
which raises :class:`CudaError` with the CUDA error name and, for launches, the kernel name.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from blockscale.dtypes import np_dtype
from blockscale.launch import KernelArg, KernelBinary
from blockscale.runtime.device import GpuDevice, cubin_runs_on

log = logging.getLogger(__name__)

__all__ = ["CudaDevice", "CudaError", "Event", "Stream", "check", "cuda_unavailable_reason"]

#: Dynamic shared memory a kernel may use without opting in.
DEFAULT_DYNAMIC_SMEM_LIMIT = 48 * 1024


def needs_smem_opt_in(dynamic_bytes: int, static_bytes: int) -> bool:
    """Whether a launch with ``dynamic_bytes`` of dynamic shared memory, in a function with
    ``static_bytes`` of static shared memory, needs MAX_DYNAMIC_SHARED_SIZE_BYTES raised: a
    block's shared memory past 48 KiB in all is opt-in."""
    return dynamic_bytes > 0 and dynamic_bytes + static_bytes > DEFAULT_DYNAMIC_SMEM_LIMIT


#: encoded tensor maps kept on the device (a map depends only on its key, so reuse is exact).
TENSORMAP_CACHE_SIZE = 4096
_TENSORMAP_DTYPES = {"bfloat16": "BFLOAT16", "float32": "FLOAT32", "int32": "INT32",
                     "uint32": "UINT32", "int64": "INT64", "uint8": "UINT8", "int8": "UINT8",
                     "float8_e4m3fn": "UINT8", "float8_e8m0fnu": "UINT8"}
_TENSORMAP_SWIZZLES = {"none": "NONE", "32b": "32B", "64b": "64B", "128b": "128B"}


class CudaError(RuntimeError):
    """A failed CUDA driver call: ``error_name`` (e.g. CUDA_ERROR_INVALID_VALUE), ``kernel``."""

    def __init__(self, message: str, error_name: str, kernel: str | None = None):
        super().__init__(message)
        self.error_name = error_name
        self.kernel = kernel


@functools.cache
def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def _error_text(err: Any) -> tuple[str, str]:
    drv = _driver()
    try:
        e1, name = drv.cuGetErrorName(err)
        e2, desc = drv.cuGetErrorString(err)
        return (name.decode() if int(e1) == 0 else str(err),
                desc.decode() if int(e2) == 0 else "")
    except Exception:  # noqa: BLE001 (the driver may be unusable)
        return str(getattr(err, "name", err)), ""


def check(result: Any, what: str = "", kernel: str | None = None) -> Any:
    """Unpack a cuda-python ``(err, *values)`` result: None, the value, or a tuple of values.

    Raises :class:`CudaError` naming the CUDA error, the call (``what``) and the kernel.
    """
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name, desc = _error_text(err)
        where = f" (kernel {kernel!r})" if kernel else ""
        raise CudaError(f"{what or 'CUDA call'} failed{where}: {name}: {desc}", name, kernel)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def cuda_unavailable_reason() -> str | None:
    """None when a CUDA GPU can be used, else why not (no cuda-python, no libcuda, no GPU)."""
    try:
        drv = _driver()
    except Exception as e:  # noqa: BLE001
        return f"cuda-python is not importable ({type(e).__name__}: {e})"
    try:
        check(drv.cuInit(0), "cuInit")
        count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    except CudaError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 (DynamicLibNotFoundError etc. without libcuda)
        return f"the CUDA driver (libcuda) cannot be loaded: {type(e).__name__}: {e}"
    return None if count > 0 else "the CUDA driver reports no GPU"


def encode_tensormap(arg: KernelArg, ptr: int, dims: tuple[int, ...]) -> bytes:
    """The 128-byte CUtensorMap of tensormap ``arg`` over the dense row-major tensor at device
    address ``ptr`` with ``dims`` (innermost first): ``cuTensorMapEncodeTiled`` with element
    strides 1, no interleave, no L2 promotion and zero out-of-bounds fill."""
    import struct

    drv = _driver()
    if ptr % 16:
        raise ValueError(f"tensormap {arg.name!r}: the address of buffer {arg.tensor!r} must "
                         f"be 16-byte aligned, got 0x{ptr:x}")
    item = np_dtype(arg.dtype).itemsize
    strides, s = [], item
    for d in dims[:-1]:
        s *= d
        strides.append(s)
    dtype = getattr(drv.CUtensorMapDataType,
                    f"CU_TENSOR_MAP_DATA_TYPE_{_TENSORMAP_DTYPES[arg.dtype]}")
    swizzle = getattr(drv.CUtensorMapSwizzle,
                      f"CU_TENSOR_MAP_SWIZZLE_{_TENSORMAP_SWIZZLES[arg.swizzle]}")
    tmap = check(drv.cuTensorMapEncodeTiled(
        dtype, drv.cuuint32_t(len(dims)), ptr, [drv.cuuint64_t(d) for d in dims],
        [drv.cuuint64_t(st) for st in strides], [drv.cuuint32_t(b) for b in arg.box],
        [drv.cuuint32_t(1)] * len(dims),
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        f"cuTensorMapEncodeTiled({arg.name}: dims {dims}, box {arg.box}, swizzle {arg.swizzle})")
    return struct.pack("<16Q", *(int(q) for q in tmap.opaque))


#: kernel ``meta`` key: launch with programmatic stream serialization (programmatic dependent
#: launch: the kernel may start before the previous kernel of the stream completes and must
#: execute ``griddepcontrol.wait`` before reading what that kernel wrote)
PROGRAMMATIC_LAUNCH = "programmatic_launch"
#: kernel ``meta`` key: (x, y, z) CTAs per thread-block cluster (sm_90+), launched with
#: ``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION``; the grid must be a multiple of it
CLUSTER_DIM = "cluster_dim"


def launch_config(grid: Sequence[int], block: Sequence[int], shared_bytes: int, stream: int,
                  *, programmatic: bool = False,
                  cluster: Sequence[int] | None = None) -> Any:
    """The ``CUlaunchConfig`` of a ``cuLaunchKernelEx`` launch (grid, block, dynamic shared
    bytes, stream); ``programmatic``: with the attribute
    ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` = 1 (also captured into CUDA
    graphs, as a programmatic dependency edge); ``cluster``: (x, y, z) CTAs per cluster, the
    attribute ``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`` (ValueError unless each grid
    dimension is a multiple of it). Needs cuda-python, not a GPU."""
    drv = _driver()
    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = (int(v) for v in grid)
    config.blockDimX, config.blockDimY, config.blockDimZ = (int(v) for v in block)
    config.sharedMemBytes = int(shared_bytes)
    config.hStream = stream
    attrs = []
    if programmatic:
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    if cluster is not None:
        dims = tuple(int(v) for v in cluster)
        if len(dims) != 3 or min(dims) < 1 or any(g % c for g, c in zip(grid, dims)):
            raise ValueError(f"cluster must be 3 positive ints dividing the grid {tuple(grid)}, "
                             f"got {tuple(cluster)}")
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = dims
        attrs.append(attr)
    config.attrs = attrs
    config.numAttrs = len(attrs)
    return config


class Stream:
    """A CUDA stream owned by us (``handle`` is what launches take)."""

    def __init__(self, device: CudaDevice, non_blocking: bool = True):
        drv = _driver()
        device.activate()
        flags = drv.CUstream_flags.CU_STREAM_NON_BLOCKING if non_blocking else 0
        self._stream = check(drv.cuStreamCreate(flags), "cuStreamCreate")
        self.handle = int(self._stream)
        self.device = device

    def synchronize(self) -> None:
        self.device.stream_synchronize(self.handle)

    def __del__(self) -> None:
        try:
            _driver().cuStreamDestroy(self._stream)
        except Exception:  # noqa: BLE001, S110  (at interpreter exit the driver may be gone)
            pass


class Event:
    """A CUDA event for timing: ``record(stream)``, then ``elapsed_ms(end)``."""

    def __init__(self, device: CudaDevice):
        drv = _driver()
        device.activate()
        self._event = check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DEFAULT),
                            "cuEventCreate")
        self.device = device

    def record(self, stream: Any = None) -> Event:
        check(_driver().cuEventRecord(self._event, self.device.resolve_stream(stream)),
              "cuEventRecord")
        return self

    def synchronize(self) -> None:
        check(_driver().cuEventSynchronize(self._event), "cuEventSynchronize")

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to ``end`` (waits for ``end``)."""
        end.synchronize()
        return float(check(_driver().cuEventElapsedTime(self._event, end._event),
                           "cuEventElapsedTime"))

    def __del__(self) -> None:
        try:
            _driver().cuEventDestroy(self._event)
        except Exception:  # noqa: BLE001, S110  (at interpreter exit the driver may be gone)
            pass


class CudaDevice(GpuDevice):
    """One NVIDIA GPU through the CUDA driver API (primary context)."""

    name = "cuda"
    binary_kind = "cubin"

    def __init__(self, ordinal: int = 0):
        super().__init__(ordinal)
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"device 'cuda' is not usable: {reason}")
        drv = _driver()
        count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
        if not 0 <= ordinal < count:
            raise ValueError(f"device: CUDA ordinal must be in [0, {count}), got {ordinal}")
        self._dev = check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
        self._ctx = check(drv.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
        self._local = threading.local()
        self.activate()
        attr = drv.CUdevice_attribute
        get = lambda a: int(check(drv.cuDeviceGetAttribute(a, self._dev),
                                  "cuDeviceGetAttribute"))
        self.capability = (get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                           get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
        self.max_dynamic_smem = get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        #: streaming multiprocessors (e.g. the persistent grids' and wave models' SM count)
        self.sm_count = get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        raw = check(drv.cuDeviceGetName(256, self._dev), "cuDeviceGetName")
        self.device_name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
        self._modules: list[Any] = []
        self._tensormaps: dict[tuple[Any, ...], tuple[Any, np.ndarray]] = {}
        self._tensormaps_lock = threading.Lock()
        #: tensor maps written during graph captures (freed as newer ones push them out)
        self._capture_maps: collections.deque[Any] = collections.deque(maxlen=TENSORMAP_CACHE_SIZE)
        self._pool = self._stream_ordered_pool(
            get(attr.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED))

    def _stream_ordered_pool(self, supported: int) -> Any:
        """The device's default memory pool, set to keep freed memory cached, or None (then
        plain cuMemAlloc/cuMemFree). cuMemFree synchronizes the whole device, so freeing the
        previous call's output stalled every op call on the GPU; cuMemFreeAsync does not."""
        from blockscale.compiler.config import knobs

        if not supported or not knobs.cuda_mempool:
            return None
        drv = _driver()
        try:
            pool = check(drv.cuDeviceGetDefaultMemPool(self._dev), "cuDeviceGetDefaultMemPool")
            check(drv.cuMemPoolSetAttribute(
                pool, drv.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                drv.cuuint64_t(2**64 - 1)), "cuMemPoolSetAttribute")
        except Exception as e:  # noqa: BLE001 - an old driver: fall back, say why
            log.info("cuda: no stream-ordered allocator (%s); using cuMemAlloc", e)
            return None
        return pool

    def describe(self) -> str:
        major, minor = self.capability
        return f"cuda:{self.ordinal} {self.device_name} (compute capability {major}.{minor})"

    def activate(self) -> None:
        """Make the primary context current on this thread (once per thread)."""
        if getattr(self._local, "active", False):
            return
        check(_driver().cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        self._local.active = True

    # ---- kernels
    def check_kernel(self, kernel: KernelBinary) -> None:
        super().check_kernel(kernel)
        if not cubin_runs_on(kernel.target, self.capability):
            major, minor = self.capability
            raise ValueError(f"kernel {kernel.name!r}: built for {kernel.target}, which does "
                             f"not run on this GPU ({self.device_name}, compute capability "
                             f"{major}.{minor}); expected a cubin for sm_{major}{minor}")
        if kernel.dynamic_shared_bytes > self.max_dynamic_smem:
            raise ValueError(f"kernel {kernel.name!r}: needs {kernel.dynamic_shared_bytes} "
                             f"bytes of dynamic shared memory, this GPU allows at most "
                             f"{self.max_dynamic_smem}")

    def _load_function(self, kernel: KernelBinary) -> Any:
        drv = _driver()
        self.activate()
        image = np.frombuffer(kernel.binary, dtype=np.uint8)
        module = check(drv.cuModuleLoadData(image.ctypes.data), "cuModuleLoadData", kernel.name)
        self._modules.append(module)
        return check(drv.cuModuleGetFunction(module, kernel.name.encode()),
                     "cuModuleGetFunction", kernel.name)

    def _set_dynamic_smem_limit(self, function: Any, kernel: KernelBinary) -> None:
        """Opt in (cuFuncSetAttribute) where the kernel's static plus dynamic shared memory
        passes 48 KiB: without it such a launch fails with CUDA_ERROR_INVALID_VALUE, also
        when the dynamic part alone is below 48 KiB (e.g. a 40 KiB static table + a 32 KiB
        ring)."""
        if not kernel.dynamic_shared_bytes:
            return
        drv = _driver()
        self.activate()
        if kernel.dynamic_shared_bytes <= DEFAULT_DYNAMIC_SMEM_LIMIT:
            static = check(drv.cuFuncGetAttribute(
                drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function),
                "cuFuncGetAttribute(SHARED_SIZE_BYTES)", kernel.name)
            if not needs_smem_opt_in(kernel.dynamic_shared_bytes, int(static)):
                return
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(drv.cuFuncSetAttribute(function, attr, kernel.dynamic_shared_bytes),
              "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", kernel.name)

    def _launch_raw(self, function: Any, grid: tuple[int, int, int], kernel: KernelBinary,
                    stream: int, params_address: int) -> None:
        self.activate()
        programmatic, cluster = bool(kernel.meta.get(PROGRAMMATIC_LAUNCH)), kernel.meta.get(
            CLUSTER_DIM)
        if programmatic or cluster:
            config = launch_config(grid, kernel.block, kernel.dynamic_shared_bytes, stream,
                                   programmatic=programmatic, cluster=cluster)
            check(_driver().cuLaunchKernelEx(config, function, params_address, 0),
                  f"cuLaunchKernelEx(programmatic={programmatic}, cluster={cluster})",
                  kernel.name)
            return
        bx, by, bz = kernel.block
        check(_driver().cuLaunchKernel(function, grid[0], grid[1], grid[2], bx, by, bz,
                                       kernel.dynamic_shared_bytes, stream, params_address, 0),
              "cuLaunchKernel", kernel.name)

    def tensormap_address(self, arg: KernelArg, ptr: int, dims: tuple[int, ...],
                          stream: int) -> int:
        """The encoded map (:func:`encode_tensormap`) in a 128-byte device buffer, copied on
        ``stream`` before the launch that uses it; cached per (dtype, box, swizzle, address,
        dims), which determine the map's bytes."""
        if self.capability < (9, 0):
            raise ValueError(f"tensormap {arg.name!r}: TMA needs compute capability 9.0+, "
                             f"this GPU has {self.capability}")
        key = (arg.dtype, arg.box, arg.swizzle, ptr, dims)
        hit = self._tensormaps.get(key)
        if hit is not None:
            return hit[0].ptr
        if self.is_capturing(stream):
            return self._captured_tensormap(encode_tensormap(arg, ptr, dims), stream)
        host = np.frombuffer(encode_tensormap(arg, ptr, dims), np.uint8).copy()
        with self._tensormaps_lock:
            if len(self._tensormaps) >= TENSORMAP_CACHE_SIZE:
                self.synchronize()  # no launch may still read a map we free
                self._tensormaps.clear()
            dev = self.alloc((128,), np.uint8)
            self._htod(dev.ptr, host.ctypes.data, 128, stream)
            self._tensormaps[key] = (dev, host)
        return dev.ptr

    def is_capturing(self, stream: int) -> bool:
        """Whether ``stream`` is being captured into a CUDA graph (cuStreamIsCapturing)."""
        drv = _driver()
        self.activate()
        status = check(drv.cuStreamIsCapturing(stream), "cuStreamIsCapturing")
        return status != drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE

    def _captured_tensormap(self, encoded: bytes, stream: int) -> int:
        """A tensor map written inside a graph capture on ``stream``: a 128-byte buffer
        allocated on the stream (a graph allocation) and filled by 32 captured 4-byte
        memsets, which need no host memory at replay (a pageable host copy cannot be
        captured). Not cached: the graph rewrites it at every replay. The buffer is kept
        alive until capture ends (a free during capture would precede the launch)."""
        import struct

        dev = self.alloc((128,), np.uint8, stream)
        drv = _driver()
        for i, word in enumerate(struct.unpack("<32I", encoded)):
            check(drv.cuMemsetD32Async(dev.ptr + 4 * i, word, 1, stream), "cuMemsetD32Async")
        self._capture_maps.append(dev)
        return dev.ptr

    def check_foreign_memory(self, value: Any, name: str) -> None:
        """A torch tensor on another GPU is an error (other objects carry no device)."""
        dev = getattr(value, "device", None)
        index = getattr(dev, "index", None)  # torch tensors
        if getattr(dev, "type", None) == "cuda" and index is not None and index != self.ordinal:
            raise ValueError(f"{name}: expected a tensor on cuda:{self.ordinal}, got {dev}")

    # ---- memory and streams
    def _malloc(self, nbytes: int, stream: int = 0) -> int:
        self.activate()
        if self._pool is not None:  # ordered on ``stream``: usable by work queued after it
            result = _driver().cuMemAllocAsync(nbytes, stream)
            if result[0]:  # the message only when it fails (formatting costs per call)
                check(result, f"cuMemAllocAsync({nbytes} bytes)")
            return int(result[1])
        return int(check(_driver().cuMemAlloc(nbytes), f"cuMemAlloc({nbytes} bytes)"))

    def _free(self, ptr: int, stream: int = 0) -> None:
        self.activate()
        if self._pool is not None:  # reused only by work queued on ``stream`` after this
            check(_driver().cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
        else:
            check(_driver().cuMemFree(ptr), "cuMemFree")

    def _htod(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self.activate()
        check(_driver().cuMemcpyHtoDAsync(dst, src, nbytes, stream), "cuMemcpyHtoDAsync")

    def _dtoh(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self.activate()
        check(_driver().cuMemcpyDtoHAsync(dst, src, nbytes, stream), "cuMemcpyDtoHAsync")

    def _memset(self, dst: int, nbytes: int, stream: int) -> None:
        self.activate()
        check(_driver().cuMemsetD8Async(dst, 0, nbytes, stream), "cuMemsetD8Async")

    def copy(self, dst: Any, src: Any, stream: Any = None) -> None:
        """Device-to-device copy of equal-sized buffers."""
        from blockscale.runtime.arrays import as_device_buffer

        d, s = as_device_buffer(dst, "dst"), as_device_buffer(src, "src")
        nbytes = int(np.prod(s.shape, dtype=np.int64)) * s.dtype.itemsize
        dbytes = int(np.prod(d.shape, dtype=np.int64)) * d.dtype.itemsize
        if nbytes != dbytes:
            raise ValueError(f"dst: expected {nbytes} bytes like src, got {dbytes}")
        self.activate()
        check(_driver().cuMemcpyDtoDAsync(d.ptr, s.ptr, nbytes, self.resolve_stream(stream)),
              "cuMemcpyDtoDAsync")

    def default_stream(self) -> int:
        """torch's current stream when torch is already imported and initialized, else 0."""
        from blockscale.runtime.arrays import torch_current_stream

        torch_stream = torch_current_stream()
        return 0 if torch_stream is None else torch_stream

    def context_stream(self) -> int | None:
        """torch's current stream when torch is in use and it is not the default stream
        (``torch.cuda.stream(s)``, ``torch.cuda.graph`` capture), else None."""
        from blockscale.runtime.arrays import torch_current_stream

        torch_stream = torch_current_stream(self.ordinal)
        return torch_stream or None

    def create_stream(self, non_blocking: bool = True) -> Stream:
        return self.own_stream(Stream(self, non_blocking))

    def create_event(self) -> Event:
        return Event(self)

    def stream_synchronize(self, stream: int | None) -> None:
        self.activate()
        check(_driver().cuStreamSynchronize(self.resolve_stream(stream)), "cuStreamSynchronize")

    def synchronize(self) -> None:
        self.activate()
        check(_driver().cuCtxSynchronize(), "cuCtxSynchronize")

    def time_ms(self, fn: Callable[[], Any], *, stream: Any = None, warmup: int = 3,
                iters: int = 20) -> float:
        """Mean milliseconds per ``fn()`` call, timed with events on ``stream``.

        ``fn`` must queue its work on ``stream`` (the default: :meth:`default_stream`).
        """
        if iters < 1:
            raise ValueError(f"iters: expected >= 1, got {iters}")
        handle = self.resolve_stream(stream)
        for _ in range(warmup):
            fn()
        start, end = Event(self), Event(self)
        start.record(handle)
        for _ in range(iters):
            fn()
        end.record(handle)
        return start.elapsed_ms(end) / iters

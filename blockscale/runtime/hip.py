"""HIP runtime on hip-python (the optional ``rocm`` extra): the CUDA runtime's interface for
hsaco kernels on AMD GPUs.

hip-python is imported on first use, never at import. Kernels are loaded with
``hipModuleLoadData`` and launched with ``hipModuleLaunchKernel`` from the same parameter block
as CUDA (:class:`~blockscale.runtime.device.ArgPack`, ``kernelParams`` = pointer array).
Every call goes through :func:`check`, which raises :class:`HipError` with the HIP error name
and, for launches, the kernel name.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from blockscale.launch import KernelBinary
from blockscale.runtime.device import GpuDevice

__all__ = ["HipDevice", "HipError", "check", "hip_unavailable_reason"]


class HipError(RuntimeError):
    """A failed HIP call: ``error_name`` (e.g. hipErrorInvalidValue) and ``kernel``."""

    def __init__(self, message: str, error_name: str, kernel: str | None = None):
        super().__init__(message)
        self.error_name = error_name
        self.kernel = kernel


@functools.cache
def _hip() -> Any:
    from hip import hip

    return hip


def check(result: Any, what: str = "", kernel: str | None = None) -> Any:
    """Unpack a hip-python ``(err, *values)`` result; raise :class:`HipError` on failure."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        try:
            name = _hip().hipGetErrorName(err)
            name = name[-1] if isinstance(name, tuple) else name
            name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # noqa: BLE001
            name = str(getattr(err, "name", err))
        where = f" (kernel {kernel!r})" if kernel else ""
        raise HipError(f"{what or 'HIP call'} failed{where}: {name}", name, kernel)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def hip_unavailable_reason() -> str | None:
    """None when a HIP GPU can be used, else why not."""
    try:
        hip = _hip()
    except Exception as e:  # noqa: BLE001
        return (f"hip-python is not installed ({type(e).__name__}); "
                "install the 'rocm' extra on an AMD GPU machine")
    try:
        count = check(hip.hipGetDeviceCount(), "hipGetDeviceCount")
    except HipError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 (RuntimeError: failed to dlopen libamdhip64.so)
        return f"the HIP runtime cannot be loaded: {type(e).__name__}: {e}"
    return None if count > 0 else "the HIP runtime reports no GPU"


def _arch_base(name: str) -> str:
    """``"gfx942:sramecc+:xnack-"`` -> ``"gfx942"``."""
    return name.split(":", 1)[0].strip()


class HipDevice(GpuDevice):
    """One AMD GPU through the HIP module API."""

    name = "hip"
    binary_kind = "hsaco"

    def __init__(self, ordinal: int = 0):
        super().__init__(ordinal)
        reason = hip_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"device 'hip' is not usable: {reason}")
        hip = _hip()
        count = check(hip.hipGetDeviceCount(), "hipGetDeviceCount")
        if not 0 <= ordinal < count:
            raise ValueError(f"device: HIP ordinal must be in [0, {count}), got {ordinal}")
        self.activate()
        props = check(hip.hipGetDeviceProperties(ordinal), "hipGetDeviceProperties")
        arch = props.gcnArchName
        self.arch = _arch_base(arch.decode() if isinstance(arch, bytes) else str(arch))
        raw_name = props.name
        self.device_name = (raw_name.decode(errors="replace") if isinstance(raw_name, bytes)
                            else str(raw_name)).split("\0", 1)[0]
        self.max_dynamic_smem = int(props.sharedMemPerBlockOptin or props.sharedMemPerBlock)
        self._modules: list[Any] = []

    def describe(self) -> str:
        return f"hip:{self.ordinal} {self.device_name} ({self.arch})"

    def activate(self) -> None:
        check(_hip().hipSetDevice(self.ordinal), "hipSetDevice")

    def check_kernel(self, kernel: KernelBinary) -> None:
        super().check_kernel(kernel)
        if _arch_base(kernel.target) != self.arch:
            raise ValueError(f"kernel {kernel.name!r}: built for {kernel.target}, this GPU "
                             f"({self.device_name}) is {self.arch}; expected a hsaco for "
                             f"{self.arch}")
        if kernel.dynamic_shared_bytes > self.max_dynamic_smem:
            raise ValueError(f"kernel {kernel.name!r}: needs {kernel.dynamic_shared_bytes} "
                             f"bytes of dynamic shared memory (LDS), this GPU allows at most "
                             f"{self.max_dynamic_smem}")

    def _load_function(self, kernel: KernelBinary) -> Any:
        hip = _hip()
        self.activate()
        image = np.frombuffer(kernel.binary, dtype=np.uint8)
        module = check(hip.hipModuleLoadData(image.ctypes.data), "hipModuleLoadData",
                       kernel.name)
        self._modules.append(module)
        return check(hip.hipModuleGetFunction(module, kernel.name.encode()),
                     "hipModuleGetFunction", kernel.name)

    def _launch_raw(self, function: Any, grid: tuple[int, int, int], kernel: KernelBinary,
                    stream: int, params_address: int) -> None:
        bx, by, bz = kernel.block
        check(_hip().hipModuleLaunchKernel(function, grid[0], grid[1], grid[2], bx, by, bz,
                                           kernel.dynamic_shared_bytes, stream or None,
                                           params_address, None),
              "hipModuleLaunchKernel", kernel.name)

    # ---- memory and streams
    def _malloc(self, nbytes: int, stream: int = 0) -> int:
        self.activate()
        return int(check(_hip().hipMalloc(nbytes), f"hipMalloc({nbytes} bytes)"))

    def _free(self, ptr: int, stream: int = 0) -> None:
        check(_hip().hipFree(ptr), "hipFree")

    def _htod(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        check(_hip().hipMemcpyHtoDAsync(dst, src, nbytes, stream or None), "hipMemcpyHtoDAsync")

    def _dtoh(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        check(_hip().hipMemcpyDtoHAsync(dst, src, nbytes, stream or None), "hipMemcpyDtoHAsync")

    def _memset(self, dst: int, nbytes: int, stream: int) -> None:
        check(_hip().hipMemsetD8Async(dst, 0, nbytes, stream or None), "hipMemsetD8Async")

    def create_stream(self) -> Any:
        """A new non-blocking stream; its ``int()`` is the handle launches take."""
        self.activate()
        return check(_hip().hipStreamCreateWithFlags(1), "hipStreamCreateWithFlags")

    def stream_synchronize(self, stream: int | None) -> None:
        check(_hip().hipStreamSynchronize(self.resolve_stream(stream) or None),
              "hipStreamSynchronize")

    def synchronize(self) -> None:
        self.activate()
        check(_hip().hipDeviceSynchronize(), "hipDeviceSynchronize")

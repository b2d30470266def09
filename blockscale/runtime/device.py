"""The device abstraction shared by the CUDA, HIP and interpreter runtimes.

A :class:`Device` launches a :class:`~blockscale.launch.KernelBinary` on a grid with arguments
that follow ``kernel.args`` (buffers, then scalars, in declaration order), and moves arrays
between host and device. :func:`get_device` picks one: an explicit name, else the
``BLOCKSCALE_DEVICE`` environment variable, else a usable CUDA GPU, else a HIP GPU, else the
numpy interpreter. Why each candidate was passed over is kept for :func:`device_report`.

:class:`ArgPack` turns ``kernel.args`` into the byte layout the GPU backends hand to
``cuLaunchKernel`` / ``hipModuleLaunchKernel`` (``kernelParams``: an array of pointers, one per
parameter). The layout is computed once per kernel; a launch only packs values into it.

Nothing here touches a GPU or imports mlir at import time.
"""

from __future__ import annotations

import abc
import logging
import math
import os
import re
import struct
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from blockscale.dtypes import np_dtype
from blockscale.launch import KernelArg, KernelBinary, tensormap_dims
from blockscale.runtime.arrays import DeviceArray, as_device_buffer

__all__ = [
    "DEVICE_NAMES", "ArgPack", "Device", "GpuDevice", "cubin_runs_on", "device_report",
    "get_device", "normalize_grid", "parse_sm_target",
]

log = logging.getLogger("blockscale.runtime")

#: Names accepted by :func:`get_device` (GPU names may carry an ordinal: "cuda:1").
DEVICE_NAMES = ("cuda", "hip", "interp")
ENV_DEVICE = "BLOCKSCALE_DEVICE"


class Device(abc.ABC):
    """A place kernels run: a CUDA GPU, a HIP GPU or the numpy interpreter.

    Arrays "on" a device are what :meth:`alloc` / :meth:`to_device` return: DeviceArrays on
    GPUs, numpy arrays on the interpreter. :meth:`launch` also accepts any object with
    ``__cuda_array_interface__`` (torch, CuPy) on CUDA.
    """

    #: "cuda" | "hip" | "interp"
    name: str = ""
    #: the KernelBinary.binary_kind this device loads ("cubin" | "hsaco"; None: any, via MLIR)
    binary_kind: str | None = None

    @abc.abstractmethod
    def launch(self, kernel: KernelBinary, grid: Sequence[int], args: Sequence[Any],
               stream: Any = None) -> None:
        """Launch ``kernel`` on ``grid`` (1 to 3 ints) with ``args`` following ``kernel.args``."""

    @abc.abstractmethod
    def alloc(self, shape: Sequence[int], dtype: Any, stream: Any = None) -> Any:
        """A new array of ``shape`` / ``dtype`` on this device (contents undefined)."""

    @abc.abstractmethod
    def to_device(self, host: np.ndarray, stream: Any = None) -> Any:
        """Copy a numpy array to this device."""

    @abc.abstractmethod
    def to_host(self, array: Any, stream: Any = None) -> np.ndarray:
        """Copy a device array back to a new numpy array (waits for the copy)."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait for all work queued on this device."""

    def zeros(self, shape: Sequence[int], dtype: Any, stream: Any = None) -> Any:
        """A zero-filled array on this device (default: upload host zeros)."""
        return self.to_device(np.zeros(tuple(shape), dtype=np.dtype(dtype)), stream)

    def check_kernel(self, kernel: KernelBinary) -> None:
        """Raise ValueError when ``kernel`` cannot run on this device (wrong binary kind/arch)."""
        if self.binary_kind is not None and kernel.binary_kind != self.binary_kind:
            raise ValueError(
                f"kernel {kernel.name!r}: a {kernel.binary_kind} (target {kernel.target}) cannot "
                f"run on device {self.name!r}; expected a {self.binary_kind}")

    def describe(self) -> str:
        """One line naming the device (GPU model, arch)."""
        return self.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


# --------------------------------------------------------------------------- selection

_devices: dict[str, Device] = {}
_report: list[str] = []
_lock = threading.Lock()


def _parse_name(name: str) -> tuple[str, int]:
    if not isinstance(name, str):
        raise TypeError(f"device: expected a str (one of {DEVICE_NAMES}) or None, "
                        f"got {type(name).__name__}")
    base, _, ordinal = name.strip().lower().partition(":")
    if base not in DEVICE_NAMES or (ordinal and (not ordinal.isdigit() or base == "interp")):
        raise ValueError(f"device: expected one of {DEVICE_NAMES} (GPU names may add ':N'), "
                         f"got {name!r}")
    return base, int(ordinal or 0)


def _create(base: str, ordinal: int) -> Device:
    if base == "cuda":
        from blockscale.runtime.cuda import CudaDevice
        return CudaDevice(ordinal)
    if base == "hip":
        from blockscale.runtime.hip import HipDevice
        return HipDevice(ordinal)
    from blockscale.runtime.interp_device import InterpDevice
    return InterpDevice()


def get_device(name: str | Device | None = None) -> Device:
    """The device called ``name`` ("cuda", "cuda:1", "hip", "interp"), created once.

    ``None`` picks ``$BLOCKSCALE_DEVICE`` if set, else the first usable of CUDA, HIP and the
    interpreter; :func:`device_report` says why each GPU was passed over. A Device is returned
    as is. An explicit GPU name that is not usable raises RuntimeError with the reason.
    """
    if isinstance(name, Device):
        return name
    if name is None:
        env = os.environ.get(ENV_DEVICE, "").strip()
        if env:
            try:
                base, ordinal = _parse_name(env)
            except ValueError as e:
                raise ValueError(f"${ENV_DEVICE}: {e}") from None
            return _get(base, ordinal, why=f"${ENV_DEVICE}={env}")
        return _auto()
    base, ordinal = _parse_name(name)
    return _get(base, ordinal, why="requested")


def _get(base: str, ordinal: int, why: str) -> Device:
    key = f"{base}:{ordinal}"
    with _lock:
        dev = _devices.get(key)
        if dev is None:
            dev = _create(base, ordinal)
            _devices[key] = dev
            _report.append(f"{base}: selected ({why}): {dev.describe()}")
    return dev


def _auto() -> Device:
    with _lock:
        cached = _devices.get("auto")
    if cached is not None:
        return cached
    from blockscale.runtime.cuda import cuda_unavailable_reason
    from blockscale.runtime.hip import hip_unavailable_reason

    chosen: Device | None = None
    for base, probe in (("cuda", cuda_unavailable_reason), ("hip", hip_unavailable_reason)):
        reason = probe()
        if reason is None:
            chosen = _get(base, 0, why="first usable GPU")
            break
        _note(f"{base}: not used: {reason}")
    if chosen is None:
        chosen = _get("interp", 0, why="no usable GPU, falling back to the numpy interpreter")
    with _lock:
        _devices["auto"] = chosen
    return chosen


def _note(line: str) -> None:
    with _lock:
        _report.append(line)
    log.info("%s", line)


def device_report() -> str:
    """How devices were chosen so far in this process: one line per decision."""
    with _lock:
        return "\n".join(_report) if _report else "no device selected yet"


def _reset_for_tests() -> None:
    """Forget created devices and the report (tests only)."""
    with _lock:
        _devices.clear()
        _report.clear()


# --------------------------------------------------------------------------- targets

_SM_RE = re.compile(r"^sm_(\d+)(\d)([af]?)$")


def parse_sm_target(target: str) -> tuple[int, int, str]:
    """``"sm_90a"`` -> ``(9, 0, "a")``: the compute capability a cubin target needs.

    The suffix is "" (runs on the same major, equal or newer minor), "a" (that exact
    capability only) or "f" (the same major family).
    """
    m = _SM_RE.match(target)
    if not m:
        raise ValueError(f"target: expected an NVIDIA target like 'sm_<major><minor>[a|f]', "
                         f"got {target!r}")
    return int(m.group(1)), int(m.group(2)), m.group(3)


def cubin_runs_on(target: str, capability: tuple[int, int]) -> bool:
    """Whether a cubin built for ``target`` runs on a GPU of compute ``capability``."""
    major, minor, suffix = parse_sm_target(target)
    if suffix == "a":
        return capability == (major, minor)
    return capability[0] == major and capability[1] >= minor


def normalize_grid(grid: Sequence[int] | int, kernel_name: str) -> tuple[int, int, int]:
    """``grid`` as three positive ints (missing trailing dims are 1)."""
    if (type(grid) is tuple and len(grid) == 3 and all(type(v) is int for v in grid)
            and 1 <= grid[0] < 2**31 and 1 <= grid[1] < 2**16 and 1 <= grid[2] < 2**16):
        return grid  # type: ignore[return-value]  (fast path)
    g = (grid,) if isinstance(grid, (int, np.integer)) else tuple(grid)
    if not 1 <= len(g) <= 3:
        raise ValueError(f"kernel {kernel_name!r}: grid must have 1 to 3 dims, got {grid!r}")
    out = tuple(int(v) for v in g) + (1,) * (3 - len(g))
    if any(v < 1 for v in out) or out[0] >= 2**31 or any(v >= 2**16 for v in out[1:]):
        raise ValueError(f"kernel {kernel_name!r}: grid dims must be >= 1 (x < 2**31, "
                         f"y/z < 65536), got {out}")
    return out  # type: ignore[return-value]


# --------------------------------------------------------------------------- argument packing

_SCALAR_FORMATS = {"i32": "i", "i64": "q", "f32": "f"}
_SCALAR_RANGES = {"i32": (-2**31, 2**31 - 1), "i64": (-2**63, 2**63 - 1)}
# The five parameters of a lowered memref<?xT>: allocated ptr, aligned ptr, offset, size, stride.
_BUFFER_FORMAT = "QQqqq"


class ArgPack:
    """The launch parameters of one kernel as one host buffer plus a pointer array.

    Each kernel parameter sits at its natural alignment in ``storage``; ``pointers[i]`` is the
    address of parameter ``i`` (what ``kernelParams`` wants). A buffer arg expands to five
    parameters ``(ptr, ptr, 0, n, 1)``; a scalar to one. Built once per loaded kernel; not
    reentrant, so :meth:`pack` holds a lock until the caller's launch has copied the values.
    """

    def __init__(self, kernel: KernelBinary):
        self.kernel_name = kernel.name
        self.args: tuple[KernelArg, ...] = tuple(kernel.args)
        fmt, offsets, size = "<", [], 0
        for arg in self.args:
            for code in (_BUFFER_FORMAT if arg.kind == "buffer" else "Q" if arg.kind ==
                         "tensormap" else _SCALAR_FORMATS[arg.dtype]):
                width = struct.calcsize(code)
                pad = -size % width
                fmt += "x" * pad + code
                size += pad
                offsets.append(size)
                size += width
        self.offsets: tuple[int, ...] = tuple(offsets)
        self.struct = struct.Struct(fmt)
        self.storage = np.zeros(max(size, 8), dtype=np.uint8)
        base = self.storage.ctypes.data
        self.pointers = np.array([base + o for o in offsets] or [0], dtype=np.uint64)
        self._params_address = int(self.pointers.ctypes.data)
        self.lock = threading.Lock()
        #: indices of tensormap args (a pointer to the encoded map, filled in at launch)
        self.tensormaps: tuple[int, ...] = tuple(
            i for i, a in enumerate(self.args) if a.kind == "tensormap")
        # per arg: (is buffer, expected dtype (buffers), (lo, hi) int range or None (f32))
        self.checks: tuple[tuple[bool, np.dtype | None, tuple[int, int] | None], ...] = tuple(
            (a.kind == "buffer",
             np_dtype(a.dtype) if a.kind == "buffer" else None,
             _SCALAR_RANGES.get(a.dtype) if a.kind == "scalar" else None)
            for a in self.args)

    @property
    def num_params(self) -> int:
        return len(self.offsets)

    @property
    def params_address(self) -> int:
        """Address of the ``void*[]`` array for ``kernelParams``."""
        return self._params_address

    def values(self, resolved: Sequence[Any]) -> list[Any]:
        """Flatten resolved args (buffers as ``(ptr, n_elements)``, scalars as numbers,
        tensormaps as the device address of the encoded map)."""
        flat: list[Any] = []
        for arg, value in zip(self.args, resolved):
            if arg.kind == "buffer":
                ptr, n = value
                flat += [ptr, ptr, 0, n, 1]
            else:
                flat.append(value)
        return flat

    def pack(self, resolved: Sequence[Any]) -> None:
        """Write the values into ``storage`` (call under ``self.lock``)."""
        self.struct.pack_into(self.storage.data, 0, *self.values(resolved))

    def packed_bytes(self) -> bytes:
        """The packed parameter bytes (``struct.size`` of them), for inspection and tests."""
        return self.storage[: self.struct.size].tobytes()


def check_scalar(kernel_name: str, arg: KernelArg, value: Any) -> int | float:
    """Validate a scalar kernel argument against its declared type."""
    if arg.dtype == "f32":
        if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
            raise TypeError(f"kernel {kernel_name!r} arg {arg.name!r}: expected a float (f32), "
                            f"got {type(value).__name__}")
        return float(value)
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"kernel {kernel_name!r} arg {arg.name!r}: expected an int "
                        f"({arg.dtype}), got {type(value).__name__} {value!r}")
    lo, hi = _SCALAR_RANGES[arg.dtype]
    if not lo <= int(value) <= hi:
        raise ValueError(f"kernel {kernel_name!r} arg {arg.name!r}: {arg.dtype} must be in "
                         f"[{lo}, {hi}], got {int(value)}")
    return int(value)


def check_buffer_dtype(kernel_name: str, arg: KernelArg, dtype: np.dtype) -> None:
    """A buffer's dtype must be the declared one; 1-byte types may stand for each other (bytes)."""
    want = np_dtype(arg.dtype)
    if dtype == want or (dtype.itemsize == 1 and want.itemsize == 1):
        return
    raise TypeError(f"kernel {kernel_name!r} arg {arg.name!r}: expected a {arg.dtype} buffer, "
                    f"got {dtype.name}")


def check_arg_count(kernel: KernelBinary, args: Sequence[Any]) -> None:
    if len(args) != len(kernel.args):
        names = [a.name for a in kernel.args]
        raise ValueError(f"kernel {kernel.name!r}: expected {len(names)} args {names}, "
                         f"got {len(args)}")


# --------------------------------------------------------------------------- GPU base

class GpuDevice(Device):
    """What the CUDA and HIP devices share: argument resolution, kernel caching, arrays.

    Subclasses provide the raw driver calls (``_malloc``, ``_free``, ``_htod``, ``_dtoh``,
    ``_memset``, ``_load_function``, ``_launch_raw``, ``stream_synchronize``). Streams are
    plain integer handles (0 = the default stream); a ``stream`` argument may also be an
    object with a ``handle`` (ours) or ``cuda_stream`` (torch) attribute.
    """

    def __init__(self, ordinal: int = 0):
        self.ordinal = ordinal
        # (name, binary, target, kind, args) -> [function, ArgPack, dynamic smem limit set]
        self._kernels: dict[tuple[Any, ...], list[Any]] = {}
        self._by_id: dict[int, tuple[list[Any], KernelBinary]] = {}
        self._kernels_lock = threading.Lock()

    # ---- raw driver calls (subclasses)
    @abc.abstractmethod
    def _malloc(self, nbytes: int, stream: int = 0) -> int:
        """Device memory usable by work queued on ``stream`` from now on."""

    @abc.abstractmethod
    def _free(self, ptr: int, stream: int = 0) -> None:
        """Release ``ptr`` after the work queued on ``stream`` so far."""

    @abc.abstractmethod
    def _htod(self, dst: int, src: int, nbytes: int, stream: int) -> None: ...

    @abc.abstractmethod
    def _dtoh(self, dst: int, src: int, nbytes: int, stream: int) -> None: ...

    @abc.abstractmethod
    def _memset(self, dst: int, nbytes: int, stream: int) -> None: ...

    @abc.abstractmethod
    def _load_function(self, kernel: KernelBinary) -> Any: ...

    @abc.abstractmethod
    def _launch_raw(self, function: Any, grid: tuple[int, int, int], kernel: KernelBinary,
                    stream: int, params_address: int) -> None: ...

    @abc.abstractmethod
    def stream_synchronize(self, stream: int | None) -> None:
        """Wait for the work queued on ``stream``."""

    def default_stream(self) -> int:
        """The stream used when neither the call nor its arrays name one."""
        return 0

    # ---- streams
    def resolve_stream(self, stream: Any) -> int:
        """A stream handle from None (default), an int, or a stream object."""
        if type(stream) is int:
            return stream
        if stream is None:
            return self.default_stream()
        if isinstance(stream, (int, np.integer)):
            return int(stream)
        for attr in ("handle", "cuda_stream"):
            if hasattr(stream, attr):
                return int(getattr(stream, attr))
        try:
            return int(stream)  # cuda-python CUstream / hip-python hipStream_t
        except (TypeError, ValueError):
            raise TypeError(f"stream: expected None, an int handle or a stream object, got "
                            f"{type(stream).__name__}") from None

    # ---- memory
    def free_memory(self, ptr: int, stream: int | None = None) -> None:
        """Free memory from :meth:`alloc` (called by DeviceArray finalizers) in the order of
        ``stream`` (the array's stream; None: the default stream)."""
        try:
            self._free(ptr, self.default_stream() if stream is None else stream)
        except Exception as e:  # noqa: BLE001 (at interpreter exit the driver may be gone)
            log.debug("freeing 0x%x failed: %s", ptr, e)

    def alloc(self, shape: Sequence[int], dtype: Any, stream: Any = None) -> Any:
        if not (type(shape) is tuple and all(type(n) is int and n >= 0 for n in shape)):
            shape = tuple(int(n) for n in shape)
            if any(n < 0 for n in shape):
                raise ValueError(f"shape: dims must be >= 0, got {shape}")
        dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        handle = None if stream is None else self.resolve_stream(stream)
        where = self.default_stream() if handle is None else handle
        ptr = self._malloc(nbytes, where) if nbytes else 0
        arr = DeviceArray._owned(self, int(ptr), shape, dt, handle, where)
        owner = self._stream_objects.get(where) if self._stream_objects else None
        if owner is not None:  # a stream we created: it lives as long as its arrays
            arr._base = owner()
        return arr

    #: handle -> weak reference of the streams :meth:`own_stream` registered
    _stream_objects: dict[int, Any] | None = None

    def own_stream(self, stream: Any) -> Any:
        """Register a stream object this device created: arrays allocated on it keep it
        alive (their frees and later launches are ordered on it), so it is not destroyed
        while memory on it may still be in use. Returns ``stream``."""
        import weakref

        if self._stream_objects is None:
            self._stream_objects = {}
        refs = self._stream_objects
        for h in [h for h, r in refs.items() if r() is None]:
            del refs[h]
        refs[int(stream.handle)] = weakref.ref(stream)
        return stream

    def zeros(self, shape: Sequence[int], dtype: Any, stream: Any = None) -> Any:
        arr = self.alloc(shape, dtype, stream)
        if arr.nbytes:
            self._memset(arr.ptr, arr.nbytes, self.resolve_stream(stream))
        return arr

    def to_device(self, host: np.ndarray, stream: Any = None) -> Any:
        if not isinstance(host, np.ndarray):
            raise TypeError(f"host: expected a numpy.ndarray, got {type(host).__name__}")
        host = np.ascontiguousarray(host)
        arr = self.alloc(host.shape, host.dtype, stream)
        if arr.nbytes:
            self._htod(arr.ptr, host.ctypes.data, arr.nbytes, self.resolve_stream(stream))
        return arr

    def to_host(self, array: Any, stream: Any = None) -> np.ndarray:
        buf = as_device_buffer(array, "array")
        handle = self.resolve_stream(stream if stream is not None else buf.stream)
        out = np.empty(buf.shape, dtype=buf.dtype)
        if out.nbytes:
            self._dtoh(out.ctypes.data, buf.ptr, out.nbytes, handle)
            self.stream_synchronize(handle)
        return out

    # ---- launch
    def kernel_handle(self, kernel: KernelBinary) -> tuple[Any, ArgPack]:
        """Load ``kernel`` once (target check, module, function, argument layout) and cache
        it; raise the function's dynamic shared memory limit when a launch needs more."""
        hit = self._by_id.get(id(kernel))
        if hit is not None and hit[1] is kernel:  # the same object as last time: all checked
            return hit[0][0], hit[0][1]
        key = (kernel.name, kernel.binary, kernel.target, kernel.binary_kind, kernel.args)
        entry = self._kernels.get(key)
        if entry is None:
            self.check_kernel(kernel)
            with self._kernels_lock:
                entry = self._kernels.get(key)
                if entry is None:
                    entry = [self._load_function(kernel), ArgPack(kernel), 0]
                    self._kernels[key] = entry
        if kernel.dynamic_shared_bytes > entry[2]:
            self.check_kernel(kernel)
            with self._kernels_lock:
                if kernel.dynamic_shared_bytes > entry[2]:
                    self._set_dynamic_smem_limit(entry[0], kernel)
                    entry[2] = kernel.dynamic_shared_bytes
        with self._kernels_lock:
            if len(self._by_id) > 4096:
                self._by_id.clear()
            self._by_id[id(kernel)] = (entry, kernel)  # holding kernel keeps its id unique
        return entry[0], entry[1]

    def tensormap_address(self, arg: KernelArg, ptr: int, dims: tuple[int, ...],
                          stream: int) -> int:
        """Device address of the encoded TMA tensor map of tensormap ``arg`` over the buffer
        at ``ptr`` with ``dims`` (innermost first), ready before work queued on ``stream``.
        Only CUDA has tensor maps."""
        raise ValueError(f"device {self.name!r}: kernels with tensormap args (TMA) run on "
                         "CUDA GPUs of compute capability 9.0 or newer only")

    def _set_dynamic_smem_limit(self, function: Any, kernel: KernelBinary) -> None:
        """Allow ``kernel.dynamic_shared_bytes`` of dynamic shared memory (default: nothing
        to do; CUDA opts in above 48 KiB)."""

    def check_foreign_memory(self, value: Any, name: str) -> None:
        """Hook: reject device memory that is not ours (e.g. a tensor on another GPU)."""

    def resolve_args(self, kernel: KernelBinary, args: Sequence[Any], pack: ArgPack | None = None
                     ) -> tuple[list[Any], int | None]:
        """Buffers -> (ptr, n_elements), scalars -> checked numbers; plus the first stream
        named by a buffer (torch / CAI producers)."""
        if len(args) != len(kernel.args):
            check_arg_count(kernel, args)
        checks = (pack or ArgPack(kernel)).checks
        resolved: list[Any] = []
        producer_stream: int | None = None
        for (is_buffer, want, bounds), arg, value in zip(checks, kernel.args, args):
            if is_buffer:
                if type(value) is DeviceArray and value.device is self:  # fast path
                    ptr, n, dtype, stream = value.ptr, value.size, value.dtype, value.stream
                else:
                    ptr, n, dtype, stream = self._resolve_buffer(kernel, arg, value)
                if dtype is not want and dtype != want and not (
                        dtype.itemsize == 1 and want.itemsize == 1):  # type: ignore[union-attr]
                    check_buffer_dtype(kernel.name, arg, dtype)
                resolved.append((ptr, n))
                if producer_stream is None and stream is not None:
                    producer_stream = stream
            elif bounds is not None and type(value) is int and bounds[0] <= value <= bounds[1]:
                resolved.append(value)  # fast path for in-range Python ints
            elif arg.kind == "tensormap":
                resolved.append(value)  # dims; encoded in launch(), on the launch stream
            else:
                resolved.append(check_scalar(kernel.name, arg, value))
        return resolved, producer_stream

    def context_stream(self) -> int | None:
        """A stream the caller made current (torch's current stream when it is not the
        default one, e.g. inside ``torch.cuda.stream(s)`` or ``torch.cuda.graph`` capture):
        launches and their outputs go there. None here; CUDA asks torch."""
        return None

    def launch_stream(self, buffers: Iterable[Any]) -> int:
        """The stream :meth:`launch` uses when given none, for these buffer args: the
        caller's current stream (:meth:`context_stream`), else the first stream a buffer
        names (a DeviceArray's last writer, a CUDA Array Interface producer), else
        :meth:`default_stream`. Ops allocate their outputs on it."""
        current = self.context_stream()
        if current is not None:
            return current
        for value in buffers:
            if type(value) is DeviceArray:
                if value.stream is not None:
                    return value.stream
            elif value is not None and not isinstance(value, np.ndarray):
                try:
                    stream = as_device_buffer(value, "buffer").stream
                except (TypeError, ValueError):
                    continue  # launch() names the argument
                if stream is not None:
                    return stream
        return self.default_stream()

    def _flat_args(self, kernel: KernelBinary, pack: ArgPack, args: Sequence[Any]
                   ) -> tuple[list[Any], int | None]:
        """The packed parameter values of ``args`` (kernels without tensormaps) and the first
        stream a buffer names; the checks of :meth:`resolve_args`, with our arrays, in-range
        ints and floats checked inline."""
        flat: list[Any] = []
        producer: int | None = None
        for (is_buffer, want, bounds), arg, value in zip(pack.checks, pack.args, args):
            if is_buffer:
                if type(value) is DeviceArray and value.device is self:
                    ptr, n, dtype, stream = value.ptr, value.size, value.dtype, value.stream
                else:
                    ptr, n, dtype, stream = self._resolve_buffer(kernel, arg, value)
                if dtype is not want and dtype != want and not (
                        dtype.itemsize == 1 and want.itemsize == 1):  # type: ignore[union-attr]
                    check_buffer_dtype(kernel.name, arg, dtype)
                flat += (ptr, ptr, 0, n, 1)
                if producer is None:
                    producer = stream
            elif (type(value) is int and bounds is not None and bounds[0] <= value <= bounds[1]
                  or type(value) is float and bounds is None):  # in-range int, f32 float
                flat.append(value)
            else:
                flat.append(check_scalar(kernel.name, arg, value))
        return flat, producer

    def _resolve_buffer(self, kernel: KernelBinary, arg: KernelArg, value: Any
                        ) -> tuple[int, int, np.dtype, int | None]:
        """(ptr, n_elements, dtype, stream) of a buffer arg that is not our DeviceArray of this
        device (ValueError / TypeError name the kernel and the argument)."""
        if type(value) is DeviceArray:
            raise ValueError(
                f"kernel {kernel.name!r} arg {arg.name!r}: expected memory on "
                f"{self.name}:{self.ordinal}, got an array on "
                f"{value.device.name}:{getattr(value.device, 'ordinal', 0)}")
        where = f"kernel {kernel.name!r} arg {arg.name!r}"
        self.check_foreign_memory(value, where)
        ptr, shape, dtype, stream = as_device_buffer(value, where)
        n = math.prod(shape)
        if n and not ptr:
            raise ValueError(f"{where}: null pointer")
        return ptr, n, dtype, stream

    def launch(self, kernel: KernelBinary, grid: Sequence[int], args: Sequence[Any],
               stream: Any = None) -> None:
        """Launch on ``stream``; None means the caller's current stream
        (:meth:`context_stream`), else the stream of the first buffer that names one (torch's
        current stream for torch tensors), else :meth:`default_stream`. Our arrays in
        ``args`` then record the stream as their last writer."""
        function, pack = self.kernel_handle(kernel)
        grid3 = normalize_grid(grid, kernel.name)
        if pack.tensormaps:
            resolved, producer_stream = self.resolve_args(kernel, args, pack)
        else:
            if len(args) != len(pack.args):
                check_arg_count(kernel, args)
            flat, producer_stream = self._flat_args(kernel, pack, args)
        if stream is not None:
            handle = self.resolve_stream(stream)
        else:
            current = self.context_stream()
            handle = current if current is not None else producer_stream \
                if producer_stream is not None else self.default_stream()
        if pack.tensormaps:
            names = [a.name for a in kernel.args]
            for i in pack.tensormaps:
                arg = kernel.args[i]
                ptr, n = resolved[names.index(arg.tensor)]
                dims = tensormap_dims(arg, resolved[i], n, kernel.name)
                resolved[i] = self.tensormap_address(arg, ptr, dims, handle)
            flat = pack.values(resolved)
        with pack.lock:
            pack.struct.pack_into(pack.storage, 0, *flat)
            self._launch_raw(function, grid3, kernel, handle, pack.params_address)
        for value in args:  # our arrays were last written on this stream
            if type(value) is DeviceArray:
                value.stream = handle

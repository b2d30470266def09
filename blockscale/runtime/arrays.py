"""Device arrays and zero-copy interop with torch, CuPy and DLPack consumers.

:class:`DeviceArray` is GPU memory with a shape and a numpy / ml_dtypes dtype (bfloat16,
float8_e4m3fn, float8_e8m0fnu, uint8, ...). It exports ``__cuda_array_interface__`` (v3) and
``__dlpack__`` / ``__dlpack_device__`` (a legacy ``"dltensor"`` capsule built with ctypes), so
``torch.from_dlpack(arr)`` and ``cupy.asarray(arr)`` see the same memory.

Ops accept foreign device memory by duck typing, with no torch import: :func:`as_device_buffer`
takes a DeviceArray, a torch CUDA tensor, anything with ``__cuda_array_interface__`` or a
DLPack producer, checks that it is contiguous, and returns ``(ptr, shape, dtype, stream)``.
:func:`io_mode` tells an op whether to return numpy (numpy in) or device arrays (device in).
"""

from __future__ import annotations

import ctypes
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import ml_dtypes
import numpy as np

from blockscale.dtypes import TORCH_DTYPES, np_dtype, torch_dtype_name

if TYPE_CHECKING:
    from blockscale.runtime.device import GpuDevice

__all__ = ["DeviceArray", "DeviceBuffer", "as_device_buffer", "io_mode", "is_device_array",
           "torch_current_stream"]

# DLPack device types and data type codes (dlpack.h, v1.1).
KDL_CUDA, KDL_ROCM = 2, 10
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_BOOL = 0, 1, 2, 4, 6
_DL_NARROW = {"float8_e4m3fn": 10, "float8_e5m2": 12, "float8_e8m0fnu": 14, "float4_e2m1fn": 17}

def _dlpack_dtype(dtype: np.dtype) -> tuple[int, int]:
    """(type code, bits) of a numpy / ml_dtypes dtype; TypeError when DLPack has none."""
    if dtype.name in _DL_NARROW:
        return _DL_NARROW[dtype.name], 4 if dtype.name == "float4_e2m1fn" else 8
    if dtype.name == "bfloat16":
        return _DL_BFLOAT, 16
    code = {"i": _DL_INT, "u": _DL_UINT, "f": _DL_FLOAT, "b": _DL_BOOL}.get(dtype.kind)
    if code is None:
        raise TypeError(f"dtype {dtype.name} has no DLPack type code")
    return code, dtype.itemsize * 8


def _dtype_from_dlpack(code: int, bits: int, lanes: int, name: str) -> np.dtype:
    for dt_name, dt_code in _DL_NARROW.items():
        if code == dt_code:
            return np_dtype(dt_name)
    if code == _DL_BFLOAT and bits == 16:
        return np.dtype(ml_dtypes.bfloat16)
    kind = {_DL_INT: "i", _DL_UINT: "u", _DL_FLOAT: "f", _DL_BOOL: "b"}.get(code)
    if kind is None or lanes != 1 or bits % 8:
        raise TypeError(f"{name}: unsupported DLPack dtype (code={code}, bits={bits}, "
                        f"lanes={lanes})")
    return np.dtype("?" if kind == "b" else f"{kind}{bits // 8}")


def _int_tuple(shape: Any) -> bool:
    return type(shape) is tuple and all(type(n) is int for n in shape)


def _contiguous_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


def _is_contiguous(shape: Sequence[int], strides: Sequence[int] | None, itemsize: int) -> bool:
    """C-contiguous in bytes; strides of size-1 dims do not matter."""
    if strides is None:
        return True
    want = _contiguous_strides(shape, itemsize)
    return all(n <= 1 or s == w for n, s, w in zip(shape, strides, want))


class DeviceBuffer(NamedTuple):
    """What an op needs of a device array: address, shape, dtype and the producer's stream
    (a stream handle int, or None when the producer named none)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    stream: int | None


class DeviceArray:
    """Contiguous GPU memory with a shape and a numpy / ml_dtypes dtype.

    Create with :meth:`from_numpy`, :meth:`empty` or ``device.alloc``; read back with
    :meth:`numpy`. Memory this array allocated is freed when it is garbage collected.
    ``stream`` is the stream last used to write it (consumers that ask via DLPack are
    synchronized with it).
    """

    __slots__ = (
        "__weakref__",
        "_base",
        "_free_stream",
        "device",
        "dtype",
        "ptr",
        "shape",
        "size",
        "stream",
    )

    def __init__(self, device: GpuDevice, ptr: int, shape: Sequence[int], dtype: Any, *,
                 stream: int | None = None, base: Any = None, owned: bool = False,
                 alloc_stream: int | None = None):
        self.device = device
        self.ptr = int(ptr)
        self.shape = shape if _int_tuple(shape) else tuple(int(n) for n in shape)
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self.size = math.prod(self.shape)  # number of elements
        self.stream = stream
        self._base = base  # keeps the owner of borrowed memory alive
        # Owned memory is freed by __del__ (cheaper per array than weakref.finalize, which an
        # op call paid once per output): in the order of the stream that last wrote it, else
        # the one it was allocated on (``alloc_stream``; None: the device's default stream).
        self._free_stream = (-1 if not owned or not self.ptr
                             else alloc_stream if alloc_stream is not None else stream)

    @classmethod
    def _owned(cls, device: GpuDevice, ptr: int, shape: tuple[int, ...], dtype: np.dtype,
               stream: int | None, alloc_stream: int) -> DeviceArray:
        """Memory just allocated by ``device`` (shape: ints >= 0, dtype: a numpy dtype,
        both already checked): :meth:`__init__` without the conversions."""
        arr = cls.__new__(cls)
        arr.device, arr.ptr, arr.shape, arr.dtype = device, ptr, shape, dtype
        arr.size, arr.stream, arr._base = math.prod(shape), stream, None
        arr._free_stream = alloc_stream if ptr else -1
        return arr

    @classmethod
    def _view_of(cls, device: GpuDevice, buf: DeviceBuffer, base: Any) -> DeviceArray:
        """A borrowed array over the device memory ``buf`` resolved from ``base`` (shape and
        dtype already checked by :func:`as_device_buffer`); ``base`` is kept alive."""
        arr = cls.__new__(cls)
        arr.device, arr.ptr, arr.shape, arr.dtype = device, buf.ptr, buf.shape, buf.dtype
        arr.size, arr.stream, arr._base = math.prod(buf.shape), buf.stream, base
        arr._free_stream = -1
        return arr

    def __del__(self) -> None:
        free = getattr(self, "_free_stream", -1)
        if free != -1:
            self._free_stream = -1
            self.device.free_memory(self.ptr, self.stream if self.stream is not None else free)

    # ---- construction
    @classmethod
    def empty(cls, shape: Sequence[int], dtype: Any, device: Any = None,
              stream: Any = None) -> DeviceArray:
        """Uninitialized memory on a GPU device (default: :func:`get_device`)."""
        return _gpu(device).alloc(shape, dtype, stream)

    @classmethod
    def from_numpy(cls, array: np.ndarray, device: Any = None,
                   stream: Any = None) -> DeviceArray:
        """Copy a numpy array (any layout; copied C-contiguous) to a GPU device."""
        if not isinstance(array, np.ndarray):
            raise TypeError(f"array: expected a numpy.ndarray, got {type(array).__name__}")
        return _gpu(device).to_device(array, stream)

    # ---- properties
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def numpy(self) -> np.ndarray:
        """A numpy copy of the contents (waits for the array's stream)."""
        return self.device.to_host(self, self.stream)

    def view(self, dtype: Any) -> DeviceArray:
        """The same memory seen as another dtype of the same item size."""
        dt = np.dtype(dtype)
        if dt.itemsize != self.dtype.itemsize:
            raise ValueError(f"dtype: expected a {self.dtype.itemsize}-byte dtype to view "
                             f"{self.dtype.name}, got {dt.name} ({dt.itemsize} bytes)")
        return DeviceArray(self.device, self.ptr, self.shape, dt, stream=self.stream, base=self)

    def reshape(self, *shape: Any) -> DeviceArray:
        """The same memory with another shape of the same size (-1 allowed once)."""
        dims = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
        # numpy resolves -1 and checks the size on a zero-stride stand-in of the same shape
        probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), self.shape,
                                                (0,) * self.ndim)
        try:
            out_shape = probe.reshape(dims).shape
        except ValueError:
            raise ValueError(f"shape: cannot reshape {self.shape} to {dims}") from None
        return DeviceArray(self.device, self.ptr, out_shape, self.dtype, stream=self.stream,
                           base=self)

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype.name}, "
                f"device={self.device.name}:{self.device.ordinal}, ptr=0x{self.ptr:x})")

    # ---- interop
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA Array Interface v3 (strides None = C-contiguous). Narrow float dtypes have
        no numpy type string of their own and are described as raw bytes (``|V1``/``<V2``)."""
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "version": 3, "strides": None,
                "stream": self.stream if self.stream not in (None, 0) else 1}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_ROCM if self.device.name == "hip" else KDL_CUDA), self.device.ordinal

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: bool | None = None) -> Any:
        """A legacy ``"dltensor"`` capsule over this memory (zero-copy).

        ``stream`` is the consumer's stream: work queued on this array's stream is waited for
        first (unless the consumer passes -1). ``copy=True`` and other ``dl_device`` values
        raise BufferError, as the protocol asks.
        """
        if copy:
            raise BufferError("DeviceArray.__dlpack__: copy=True is not supported")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"DeviceArray.__dlpack__: cannot export to device {dl_device}; "
                              f"the array is on {self.__dlpack_device__()}")
        if stream != -1 and self.stream not in (None, stream):
            self.device.stream_synchronize(self.stream)
        return _export_capsule(self)


def _gpu(device: Any) -> GpuDevice:
    from blockscale.runtime.device import GpuDevice, get_device

    dev = get_device(device)
    if not isinstance(dev, GpuDevice):
        raise TypeError(f"device: DeviceArray needs a GPU device ('cuda' or 'hip'), got "
                        f"{dev.name!r}; the interpreter works on numpy arrays")
    return dev


# --------------------------------------------------------------------------- DLPack (ctypes)

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]

# Private prototypes over the C API (ctypes.pythonapi's shared attributes stay untouched).
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_get_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))

# manager_ctx id -> (managed struct, shape array, the exported DeviceArray)
_exports: dict[int, tuple[Any, Any, Any]] = {}
_next_export = [1]


@_DELETER
def _delete_export(managed: Any) -> None:
    _exports.pop(managed.contents.manager_ctx or 0, None)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule: int) -> None:
    # An unconsumed capsule still owns the tensor; a consumer renames it "used_dltensor".
    if _capsule_is_valid(capsule, b"dltensor"):
        ptr = _capsule_get_pointer_raw(capsule, b"dltensor")
        managed = ctypes.cast(ptr, ctypes.POINTER(_DLManagedTensor))
        managed.contents.deleter(managed)


def _export_capsule(arr: DeviceArray) -> Any:
    code, bits = _dlpack_dtype(arr.dtype)
    shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
    managed = _DLManagedTensor()
    dev_type, dev_id = arr.__dlpack_device__()
    managed.dl_tensor = _DLTensor(ctypes.c_void_p(arr.ptr), _DLDevice(dev_type, dev_id),
                                  arr.ndim, _DLDataType(code, bits, 1),
                                  ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
                                  None, 0)
    key = _next_export[0]
    _next_export[0] += 1
    managed.manager_ctx = key
    managed.deleter = _delete_export
    _exports[key] = (managed, shape, arr)
    return _capsule_new(ctypes.addressof(managed), b"dltensor",
                        ctypes.cast(_capsule_destructor, ctypes.c_void_p))


def _import_capsule(capsule: Any, name: str) -> tuple[int, tuple[int, ...], np.dtype,
                                                      tuple[int, int], bool]:
    """Read (ptr, shape, dtype, (device type, id), contiguous) from a legacy capsule.

    The capsule is not consumed: when it is dropped its destructor releases the export,
    while the producing object (held by the caller) keeps the memory alive.
    """
    ptr = _capsule_get_pointer(capsule, b"dltensor")
    t = ctypes.cast(ptr, ctypes.POINTER(_DLManagedTensor)).contents.dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    dtype = _dtype_from_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes, name)
    strides = (tuple(t.strides[i] * dtype.itemsize for i in range(t.ndim))
               if t.strides else None)
    contiguous = _is_contiguous(shape, strides, dtype.itemsize)
    return ((t.data or 0) + t.byte_offset, shape, dtype,
            (t.device.device_type, t.device.device_id), contiguous)


# --------------------------------------------------------------------------- duck typing

def torch_current_stream(index: int | None = None) -> int | None:
    """torch's current CUDA stream handle (of device ``index``; None: torch's current device),
    only if torch is already imported and its CUDA state initialized."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # an int, no Stream object
        if raw is not None:
            return int(raw(torch.cuda.current_device() if index is None else index))
        return int(torch.cuda.current_stream(index).cuda_stream)
    except Exception:  # noqa: BLE001 (torch without CUDA, or a partial import)
        return None


def _is_torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _non_contiguous(name: str, shape: Any, strides: Any) -> ValueError:
    return ValueError(f"{name}: expected a C-contiguous array, got shape {tuple(shape)} with "
                      f"strides {tuple(strides) if strides is not None else None}; "
                      "make it contiguous first (e.g. tensor.contiguous())")


#: torch dtype object -> numpy dtype (filled on first sight; str(dtype) is slow-ish)
_TORCH_DTYPE_CACHE: dict[Any, np.dtype] = {}


def _from_torch(obj: Any, name: str) -> DeviceBuffer:
    if not obj.is_cuda:
        raise ValueError(f"{name}: expected a CUDA tensor, got a tensor on {obj.device}")
    if not obj.is_contiguous():
        raise _non_contiguous(name, obj.shape, obj.stride())
    dtype = _TORCH_DTYPE_CACHE.get(obj.dtype)
    if dtype is None:
        key = torch_dtype_name(obj.dtype)
        if key not in TORCH_DTYPES:
            raise TypeError(f"{name}: unsupported torch dtype {obj.dtype}; expected one of "
                            f"{sorted(TORCH_DTYPES)}")
        dtype = _TORCH_DTYPE_CACHE[obj.dtype] = TORCH_DTYPES[key]
    return DeviceBuffer(int(obj.data_ptr()), tuple(obj.shape), dtype,
                        torch_current_stream(_device_index(obj)))


def _device_index(obj: Any) -> int | None:
    index = getattr(obj.device, "index", None)
    return index if type(index) is int else None


def _from_cai(cai: dict[str, Any], name: str) -> DeviceBuffer:
    try:
        shape = tuple(int(n) for n in cai["shape"])
        ptr, _readonly = cai["data"]
        typestr = cai["typestr"]
    except (KeyError, TypeError, ValueError) as e:
        raise TypeError(f"{name}: malformed __cuda_array_interface__ ({e!r})") from None
    dtype = np.dtype(cai["descr"][0][1]) if typestr.lstrip("<>|=").startswith("V") and \
        isinstance(cai.get("descr"), list) else np.dtype(typestr)
    if dtype.kind == "V":
        raise TypeError(f"{name}: __cuda_array_interface__ typestr {typestr!r} is raw bytes; "
                        "pass a DeviceArray, a torch tensor or a DLPack producer to keep "
                        "narrow float dtypes")
    if not _is_contiguous(shape, cai.get("strides"), dtype.itemsize):
        raise _non_contiguous(name, shape, cai.get("strides"))
    if cai.get("mask") is not None:
        raise ValueError(f"{name}: masked arrays are not supported")
    stream = cai.get("stream")
    return DeviceBuffer(int(ptr or 0), shape, dtype, None if stream is None else int(stream))


def as_device_buffer(obj: Any, name: str, stream: int | None = None) -> DeviceBuffer:
    """``(ptr, shape, dtype, stream)`` of device memory ``obj``, without copying.

    Accepts a :class:`DeviceArray`, a torch CUDA tensor (duck-typed, torch is never imported
    here), any object with ``__cuda_array_interface__`` (CuPy, numba, ...) or a DLPack
    producer on a CUDA / ROCm device. ``name`` (the argument name) is used in errors:
    TypeError for host arrays and unknown objects, ValueError for non-contiguous memory.
    ``stream`` is the consumer stream passed to DLPack producers.
    """
    if isinstance(obj, DeviceArray):
        return DeviceBuffer(obj.ptr, obj.shape, obj.dtype, obj.stream)
    if isinstance(obj, np.ndarray):
        raise TypeError(f"{name}: expected device memory, got a numpy array (host memory); "
                        "upload it with device.to_device() or DeviceArray.from_numpy()")
    if _is_torch_tensor(obj):
        return _from_torch(obj, name)
    cai = getattr(type(obj), "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cai(obj.__cuda_array_interface__, name)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        dev_type, _ = obj.__dlpack_device__()
        if int(dev_type) not in (KDL_CUDA, KDL_ROCM):
            raise ValueError(f"{name}: expected memory on a CUDA or ROCm device, got DLPack "
                             f"device type {int(dev_type)}")
        capsule = obj.__dlpack__(stream=stream if stream is not None else None)
        ptr, shape, dtype, _, contiguous = _import_capsule(capsule, name)
        if not contiguous:
            raise _non_contiguous(name, shape, None)
        return DeviceBuffer(ptr, shape, dtype, stream)
    raise TypeError(f"{name}: expected a DeviceArray, a torch CUDA tensor, an object with "
                    f"__cuda_array_interface__ or __dlpack__, got {type(obj).__name__}")


def is_device_array(obj: Any) -> bool:
    """Whether ``obj`` looks like device memory (without validating it)."""
    if isinstance(obj, DeviceArray):
        return True
    if isinstance(obj, np.ndarray):
        return False
    if _is_torch_tensor(obj):
        return bool(getattr(obj, "is_cuda", False))
    return (getattr(type(obj), "__cuda_array_interface__", None) is not None
            or (hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")))


def io_mode(*inputs: Any) -> str:
    """``"numpy"`` when every array input is a numpy array, ``"device"`` when any is device
    memory (numpy inputs are then uploaded and the outputs stay on the device).

    None and Python scalars are ignored; other objects raise TypeError.
    """
    mode = "numpy"
    for i, x in enumerate(inputs):
        if x is None or isinstance(x, (int, float, bool, np.generic)):
            continue
        if isinstance(x, np.ndarray):
            continue
        if is_device_array(x):
            mode = "device"
            continue
        raise TypeError(f"input {i}: expected a numpy array or device memory, "
                        f"got {type(x).__name__}")
    return mode

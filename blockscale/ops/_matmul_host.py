"""Host-side helpers of the matmul ops: argument checks, device/target choice, launch.

No MLIR here; compiling goes through :mod:`blockscale.ops._core` (kernel key, bundle, cache).
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from blockscale.dtypes import as_np_dtype, np_dtype
from blockscale.formats import Format

_F32_STRUCT = struct.Struct("<f")


def check_choice(value: object, choices: Sequence[str], arg: str) -> None:
    """ValueError unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{arg} must be one of {list(choices)}, got {value!r}")


def out_tag(out_dtype: str) -> str:
    """The kernel-name tag of an output dtype: "bf16" for bfloat16, else "f32"."""
    return "bf16" if out_dtype == "bfloat16" else "f32"


def target_name(target: object) -> str:
    """Canonical GPUTarget name (ValueError / TypeError for unknown ones)."""
    from blockscale.compiler.targets import GPUTarget

    return GPUTarget.parse(target).name  # type: ignore[arg-type]


def shape_of(x: object, arg: str, ndim: int) -> tuple[int, ...]:
    """The shape of an array-like with ``ndim`` dimensions (numpy, DeviceArray, torch)."""
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"{arg} must be an array (numpy or device array), got "
                        f"{type(x).__name__}")
    if not (type(shape) is tuple and all(type(s) is int for s in shape)):
        shape = tuple(int(s) for s in shape)
    if len(shape) != ndim:
        raise ValueError(f"{arg} must have {ndim} dimensions, got shape {shape}")
    return shape


#: a dtype object as found on an array (numpy, torch) -> its numpy dtype (or None)
_DTYPES: dict[Any, np.dtype | None] = {}


def _dtype_of(x: object) -> np.dtype | None:
    dt = getattr(x, "dtype", None)
    if isinstance(dt, np.dtype):
        return dt
    try:
        return _DTYPES[dt]
    except (KeyError, TypeError):
        pass
    got = as_np_dtype(dt)
    try:
        if len(_DTYPES) < 256:
            _DTYPES[dt] = got
    except TypeError:  # unhashable
        pass
    return got


#: (want, also) -> the allowed numpy dtypes of :func:`check_dtype`
_ALLOWED: dict[Any, tuple[np.dtype, ...]] = {}


def check_dtype(x: object, want: np.dtype | str, arg: str, fmt: Format | None = None,
                also: Sequence[Any] = ()) -> None:
    """TypeError unless ``x`` has dtype ``want`` (or one of ``also``)."""
    got = _dtype_of(x)
    try:
        key = (want, tuple(also)) if also else want
        allowed = _ALLOWED.get(key)
    except TypeError:
        key, allowed = None, None
    if allowed is not None and got is not None and got in allowed:
        return
    if allowed is None:
        allowed = (np.dtype(want), *(np.dtype(a) for a in also))
        if key is not None:
            _ALLOWED[key] = allowed
    if got not in allowed:
        what = f" for {fmt.name}" if fmt is not None else ""
        raise TypeError(f"{arg} must have dtype {' or '.join(str(a) for a in allowed)}{what}, "
                        f"got {got if got is not None else type(x).__name__}")


def finite_f32(v: object, arg: str) -> float:
    """A finite Python float, exactly representable as float32 after rounding."""
    if type(v) is float or type(v) is int:
        f = _f32(float(v))
    else:
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
            raise TypeError(f"{arg} must be a number, got {type(v).__name__}")
        f = float(np.float32(v))
    if not math.isfinite(f):
        raise ValueError(f"{arg} must be finite (as float32), got {v!r}")
    return f


def _f32(v: float) -> float:
    """``v`` rounded to float32 (round to nearest even; inf past the float32 range)."""
    try:
        return _F32_STRUCT.unpack(_F32_STRUCT.pack(v))[0]
    except OverflowError:  # beyond float32: numpy rounds to inf
        return float(np.float32(v))


def array_key(x: object) -> tuple[Any, ...]:
    """What host checks of an array argument depend on: ``(type, shape, dtype)`` (for memo
    keys of validated signatures; the caller catches the TypeError of unhashable parts)."""
    return type(x), getattr(x, "shape", None), getattr(x, "dtype", None)


class CheckMemo:
    """Remembers the results of a pure argument check per key, e.g. the ``(type, shape,
    dtype)`` of each array plus the other arguments it reads. Only successful checks are
    stored, so a bad argument always reaches the check and raises; equal keys get the
    same answer the check gave before. Bounded: cleared when it reaches ``size`` entries.
    """

    def __init__(self, size: int = 1024):
        self.size = size
        self._memo: dict[Any, Any] = {}

    def get(self, key: Any) -> Any:
        """The stored result for ``key`` (None when absent or unhashable)."""
        try:
            return self._memo.get(key)
        except TypeError:
            return None

    def put(self, key: Any, value: Any) -> Any:
        """Store ``value`` for ``key`` (unless unhashable) and return it."""
        try:
            if len(self._memo) >= self.size:
                self._memo.clear()
            self._memo[key] = value
        except TypeError:
            pass
        return value


def check_epilogue_inputs(inputs: Sequence[Any], given: dict[str, Any], m: int, n: int) -> None:
    """Every declared epilogue input given, with the right shape and dtype; no extras."""
    names = {i.name for i in inputs}
    extra = sorted(set(given) - names)
    if extra:
        raise ValueError(f"epilogue_inputs has unknown names {extra}; the epilogue declares "
                         f"{sorted(names)}")
    for inp in inputs:
        if inp.name not in given:
            raise ValueError(f"epilogue_inputs must include {inp.name!r} "
                             f"({inp.dtype} {inp.shape(m, n)})")
        arr = given[inp.name]
        shape = shape_of(arr, f"epilogue_inputs[{inp.name!r}]", len(inp.shape(m, n)))
        if shape != inp.shape(m, n):
            raise ValueError(f"epilogue_inputs[{inp.name!r}] must have shape "
                             f"{inp.shape(m, n)}, got {shape}")
        check_dtype(arr, np_dtype(inp.dtype), f"epilogue_inputs[{inp.name!r}]")


def device_and_target(device: Any, target: str | None) -> tuple[Any, str]:
    """The runtime Device for ``device`` (a name, a Device or None = best available) and the
    kernel target name (``target``, else the device's, else the default target)."""
    if hasattr(device, "launch"):
        dev = device
    else:
        from blockscale import runtime

        dev = runtime.get_device(device)
    return dev, _ops_core().resolve_target(target, dev)


@functools.cache
def _ops_core() -> Any:
    import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)

    return _core


def launch(spec: Any, grid: tuple[int, int, int], out_shape: tuple[int, ...], out_dtype: str,
           buffers: dict[str, Any], scalars: dict[str, Any], device: Any, *,
           empty: bool = False) -> Any:
    """Get ``spec``'s kernel, allocate the output ``c`` and launch it on ``device``.

    ``buffers`` maps input argument names to arrays (numpy or device arrays; numpy ones are
    copied to the device). The result is numpy when every input is numpy, else a device array.
    ``empty``: the output has no elements; nothing is launched.
    """
    import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)

    dt = _OUT_DTYPES.get(out_dtype) or np_dtype(out_dtype)
    if empty:
        host = all(isinstance(v, np.ndarray) for v in buffers.values())
        _core.check_buffers(buffers, device)
        return np.zeros(out_shape, dt) if host else device.zeros(out_shape, dt)
    _, out = _core.launch_op(spec, grid, (("c", out_shape, dt),), buffers, scalars, device)
    return out["c"]


def launch_inplace(spec: Any, grid: tuple[int, int, int], buffers: dict[str, Any],
                    scalars: dict[str, Any], dev: Any) -> None:
    """Launch ``spec`` on ``buffers`` in place (its "inout" and "out" buffers, ``dev``'s
    arrays, are read and written as they are); numpy inputs are copied to ``dev`` and other
    device memory (torch, ...) is borrowed, as :func:`blockscale.ops._core.launch_op` does."""
    import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)

    kernel = _core.get_kernel(spec)
    inout = {a.name for a in kernel.args if a.role in ("inout", "out")}
    ins = {n: v for n, v in buffers.items() if n not in inout}
    foreign = _core._checked_foreign(ins, dev)
    if foreign and hasattr(dev, "check_foreign_memory"):
        ins = _core._borrowed(ins, foreign, dev, kernel)
    buffers = {**buffers, **{n: dev.to_device(np.ascontiguousarray(v))
                             if isinstance(v, np.ndarray) else v for n, v in ins.items()}}
    args = [buffers[a.name] if a.kind == "buffer" else scalars[a.name] for a in kernel.args]
    pick = getattr(dev, "launch_stream", None)
    if pick is None:
        dev.launch(kernel, grid, args)
    else:
        dev.launch(kernel, grid, args, pick(buffers.values()))


_OUT_DTYPES = {"bfloat16": np_dtype("bfloat16"), "float32": np.dtype(np.float32)}


def compile_spec(spec: Any) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)

    return _core.compile_kernel(spec)


#: the alignment the tiled kernels' 16-byte loads and tensor maps need of a device operand
VECTOR_ALIGN = 16


@functools.cache
def _arrays() -> Any:
    import blockscale.runtime.arrays as arrays  # noqa: PLR0402 (imported on first use)

    return arrays


def _device_address(x: Any) -> int | None:
    """The device address of operand ``x``; None for numpy (copied to a fresh, aligned device
    buffer) and None. Our DeviceArrays and torch CUDA tensors whose dtype was seen before are
    read directly (no stream query, no DeviceBuffer: the launch resolves them once more);
    other objects go through :func:`~blockscale.runtime.arrays.as_device_buffer` (its
    TypeError / ValueError for memory no kernel can take propagate)."""
    if x is None or isinstance(x, np.ndarray):
        return None
    arrays = _arrays()
    if type(x) is arrays.DeviceArray:
        return x.ptr
    if (arrays._is_torch_tensor(x) and x.is_cuda and x.dtype in arrays._TORCH_DTYPE_CACHE
            and x.is_contiguous()):
        return int(x.data_ptr())  # what as_device_buffer would give, without the rest
    return int(arrays.as_device_buffer(x, "operand").ptr)


def vector_aligned(*arrays: Any) -> bool:
    """Whether every array can take the tiled kernels' 16-byte loads (and tensor maps): numpy
    (copied to a fresh, aligned buffer) or device memory at a 16-byte aligned address. The
    dispatches run the portable kernel (scalar loads) otherwise, also for objects that are
    not usable device memory (the portable launch then names the problem)."""
    for x in arrays:
        try:
            ptr = _device_address(x)
        except (TypeError, ValueError, AttributeError):
            return False
        if ptr is not None and ptr % VECTOR_ALIGN:
            return False
    return True


def require_aligned(**arrays: Any) -> None:
    """ValueError naming the first operand (keyword name) in device memory that is not
    16-byte aligned, e.g. ``require_aligned(a=a, b=b, sfa=sfa, sfb=sfb)``: the direct calls
    of the tiled kernels (no dispatch to fall back to the portable kernel, see
    :func:`vector_aligned`). Numpy operands always pass (they are copied); objects that are
    not device memory pass too: the launch's checks name them."""
    for name, x in arrays.items():
        try:
            ptr = _device_address(x)
        except (TypeError, ValueError, AttributeError):
            continue
        if ptr is not None and ptr % VECTOR_ALIGN:
            raise ValueError(f"{name} must be {VECTOR_ALIGN}-byte aligned device memory for "
                             f"this tiled kernel (16-byte loads / tensor maps), got address "
                             f"0x{ptr:x} (address % {VECTOR_ALIGN} = {ptr % VECTOR_ALIGN}); "
                             "pass an aligned copy, or call block_scaled_matmul (it runs the "
                             "portable kernel for such operands)")


def register_before(paths: list[Any], hook: Any, module_name: str) -> None:
    """Insert fast-path ``hook`` into ``paths`` just before the first entry defined in module
    ``module_name`` (by name: that module may still be partially imported, through an import
    cycle; when it registers later it appends, i.e. after ``hook``), else at the end. Idempotent."""
    if hook in paths:
        return
    at = [i for i, f in enumerate(paths) if f.__module__ == module_name]
    paths.insert(at[0] if at else len(paths), hook)

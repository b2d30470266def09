"""The numpy interpreter as a :class:`~blockscale.runtime.device.Device`.

Arrays on this device are plain numpy arrays. :meth:`InterpDevice.launch` hands the kernel's
MLIR (``KernelBinary.mlir``, before target lowering) to
``blockscale.runtime.interpreter.run_kernel`` with flat 1-D views of the buffers, which the
interpreter mutates in place. The interpreter, and through it mlir, is imported only here, at
the first launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from blockscale.dtypes import np_dtype
from blockscale.launch import KernelBinary
from blockscale.runtime.device import (
    Device,
    check_arg_count,
    check_buffer_dtype,
    check_scalar,
    normalize_grid,
)

__all__ = ["InterpDevice"]


def _tensormap(kernel: KernelBinary, arg: Any, dims: Any, flat: list[Any]) -> Any:
    """The interpreter's TensorMap for tensormap ``arg``: the flat view of its buffer arg with
    the launch ``dims`` (checked as the CUDA runtime checks them)."""
    from blockscale.launch import tensormap_dims
    from blockscale.runtime.interpreter.ops_tma import TensorMap

    data = flat[[a.name for a in kernel.args].index(arg.tensor)]
    dims = tensormap_dims(arg, dims, int(data.size), kernel.name)
    return TensorMap(f"{arg.name} (over {arg.tensor})", data, dims, arg.box, arg.swizzle)


class InterpDevice(Device):
    """Runs kernel IR on the CPU with the numpy interpreter (any target, no GPU)."""

    name = "interp"
    binary_kind = None

    def describe(self) -> str:
        return "interp (numpy interpreter of kernel MLIR)"

    def check_kernel(self, kernel: KernelBinary) -> None:
        if not kernel.mlir:
            raise ValueError(f"kernel {kernel.name!r}: has no MLIR text (KernelBinary.mlir is "
                             "empty), so the interpreter cannot run it; rebuild the bundle "
                             "with the kernel's MLIR kept")

    def launch(self, kernel: KernelBinary, grid: Sequence[int], args: Sequence[Any],
               stream: Any = None) -> None:
        """Interpret ``kernel`` on ``grid``; buffers are numpy arrays, updated in place.
        ``stream`` is accepted for interface parity and ignored (execution is synchronous)."""
        self.check_kernel(kernel)
        grid3 = normalize_grid(grid, kernel.name)
        check_arg_count(kernel, args)
        flat: list[Any] = []
        for arg, value in zip(kernel.args, args):
            where = f"kernel {kernel.name!r} arg {arg.name!r}"
            if arg.kind == "scalar":
                flat.append(check_scalar(kernel.name, arg, value))
                continue
            if arg.kind == "tensormap":
                flat.append(value)  # replaced by a TensorMap once the buffers are viewed
                continue
            if not isinstance(value, np.ndarray):
                raise TypeError(f"{where}: the interpreter takes numpy arrays, got "
                                f"{type(value).__name__}")
            if not value.flags.c_contiguous:
                raise ValueError(f"{where}: expected a C-contiguous array (it is updated in "
                                 f"place), got strides {value.strides} for shape {value.shape}")
            check_buffer_dtype(kernel.name, arg, value.dtype)
            view = value.reshape(-1)
            want = np_dtype(arg.dtype)
            flat.append(view if view.dtype == want else view.view(want))
        for i, arg in enumerate(kernel.args):
            if arg.kind == "tensormap":
                flat[i] = _tensormap(kernel, arg, flat[i], flat)
        from blockscale.runtime.interpreter import run_kernel

        cluster = kernel.meta.get("cluster_dim")  # a cluster launch (runtime/cuda.py)
        extra = {"cluster": tuple(cluster)} if cluster else {}
        run_kernel(kernel.mlir, kernel.name, grid3, tuple(kernel.block), flat, kernel.target,
                   dynamic_shared_bytes=kernel.dynamic_shared_bytes, **extra)

    def alloc(self, shape: Sequence[int], dtype: Any, stream: Any = None) -> np.ndarray:
        return np.empty(tuple(int(n) for n in shape), dtype=np.dtype(dtype))

    def zeros(self, shape: Sequence[int], dtype: Any, stream: Any = None) -> np.ndarray:
        return np.zeros(tuple(int(n) for n in shape), dtype=np.dtype(dtype))

    def to_device(self, host: np.ndarray, stream: Any = None) -> np.ndarray:
        if not isinstance(host, np.ndarray):
            raise TypeError(f"host: expected a numpy.ndarray, got {type(host).__name__}")
        return np.array(host, order="C", copy=True)

    def to_host(self, array: Any, stream: Any = None) -> np.ndarray:
        if not isinstance(array, np.ndarray):
            raise TypeError(f"array: the interpreter device holds numpy arrays, got "
                            f"{type(array).__name__}")
        return np.array(array, copy=True)

    def synchronize(self) -> None:
        """Nothing to wait for: the interpreter runs synchronously."""

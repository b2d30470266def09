"""The runtime: launches compiled kernels on CUDA, HIP or the numpy interpreter.

Importing it loads no GPU driver and no mlir; drivers load on first use, and mlir only when
the interpreter runs a kernel. Entry points:

* :func:`get_device` / :func:`device_report`: pick "cuda", "hip" or "interp";
* :class:`Device`: ``launch(kernel, grid, args, stream=None)``, ``alloc``, ``to_device``,
  ``to_host``, ``synchronize``;
* :class:`DeviceArray`, :func:`as_device_buffer`, :func:`io_mode`: device memory and interop;
* :class:`Program`: a compiled op or graph as a saved, self-contained launch plan.
"""

from __future__ import annotations

from typing import Any

from blockscale.runtime.arrays import DeviceArray, DeviceBuffer, as_device_buffer, io_mode
from blockscale.runtime.device import DEVICE_NAMES, Device, device_report, get_device

__all__ = ["DEVICE_NAMES", "Device", "DeviceArray", "DeviceBuffer", "Program", "as_device_buffer",
           "device_report", "get_device", "io_mode"]


def __getattr__(name: str) -> Any:
    if name == "Program":
        from blockscale.runtime.program import Program

        return Program
    raise AttributeError(f"module 'blockscale.runtime' has no attribute {name!r}")

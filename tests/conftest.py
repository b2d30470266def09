"""Test tiers and capability gates (one place for all skip logic).

Tiers (markers, registered in pyproject.toml): ir, lower, interp, gpu, cuda, rocm.
`make test` runs everything but `gpu`; on a GPU machine run `pytest -m gpu`.
"""

from __future__ import annotations

import functools

import pytest


@functools.cache
def cuda_gpu_reason() -> str | None:
    """None when a CUDA GPU is usable, else why not."""
    try:
        from cuda.bindings import driver
    except Exception as e:  # pragma: no cover - depends on the machine
        return f"cuda-python not importable: {e}"
    try:
        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return f"cuInit failed: {err}"
        err, n = driver.cuDeviceGetCount()
        if int(err) != 0 or n == 0:
            return "no CUDA device"
    except Exception as e:  # DynamicLibNotFoundError without libcuda
        return f"no CUDA driver: {type(e).__name__}: {e}"
    return None


@functools.cache
def hip_gpu_reason() -> str | None:
    """None when a HIP GPU is usable, else why not."""
    try:
        from hip import hip  # noqa: F401
    except Exception as e:
        return f"hip-python not installed ({type(e).__name__}); pip install '.[rocm]' on an AMD GPU"
    try:
        err, n = hip.hipGetDeviceCount()
        if int(err) != 0 or n == 0:
            return "no HIP device"
    except Exception as e:
        return f"no HIP runtime: {type(e).__name__}: {e}"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "cuda" in item.keywords and (why := cuda_gpu_reason()):
            item.add_marker(pytest.mark.skip(reason=f"needs an NVIDIA GPU: {why}"))
        if "rocm" in item.keywords and (why := hip_gpu_reason()):
            item.add_marker(pytest.mark.skip(reason=f"needs an AMD GPU: {why}"))

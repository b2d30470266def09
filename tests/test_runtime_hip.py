"""HIP runtime on a real AMD GPU (hip-python): memory, target checks and the interleave op
from the bundle (``make gpu-bundle BUNDLE=build/gpu`` with ``--target gfx942`` / ``gfx950``).
Skipped, with the reason, on machines without an AMD GPU (see tests/conftest.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from blockscale.launch import KernelArg, KernelBinary

pytestmark = [pytest.mark.gpu, pytest.mark.rocm]


@pytest.fixture(scope="module")
def hip():
    from blockscale.runtime import get_device

    return get_device("hip")


def test_describe_and_memory_round_trip(hip):
    from blockscale.runtime import DeviceArray

    assert hip.arch.startswith("gfx") and hip.arch in hip.describe()
    host = np.arange(4096, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    arr = DeviceArray.from_numpy(host, device=hip)
    assert arr.__dlpack_device__() == (10, hip.ordinal)  # kDLROCM
    np.testing.assert_array_equal(arr.numpy().view(np.uint8), host.view(np.uint8))
    assert not hip.zeros((17,), np.float32).numpy().any()


def test_cubin_is_rejected(hip):
    kernel = KernelBinary("k", "sm_90a", "cubin", b"\x7fELF", (KernelArg("x", "scalar", "i32"),),
                          (64, 1, 1))
    with pytest.raises(ValueError, match="a cubin .* cannot run on device 'hip'"):
        hip.launch(kernel, (1,), [1])


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e8m0fnu"])
@pytest.mark.parametrize("shape", [(128, 4), (129, 5), (1024, 1024)])
def test_interleave_on_hip(hip, shape, dtype):
    from blockscale import ops
    from blockscale import reference as ref

    rng = np.random.default_rng(1234)
    scales = rng.integers(0, 256, size=shape, dtype=np.uint8).view(getattr(ml_dtypes, dtype))
    try:
        out = ops.block_scales_interleave(scales, device="hip")
    except RuntimeError as e:
        if "not in the kernel bundle" in str(e):
            pytest.skip(f"no {hip.arch} interleave kernel bundled: {e}")
        raise
    np.testing.assert_array_equal(out.view(np.uint8),
                                  ref.block_scales_interleave(scales).view(np.uint8))

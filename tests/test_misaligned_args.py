"""The direct calls of the tiled kernels (no dispatch, so no portable fallback) reject
operands in device memory that are not 16-byte aligned: a ValueError naming the argument,
the alignment and the address mod 16, raised before any device is touched (so checked here
on the interpreter device, with DeviceArray and torch-like views 8 bytes into an
allocation). Numpy operands are copied to fresh, aligned device buffers: a numpy view at an
8-byte offset is accepted and gives the bits of its aligned copy (as the dispatch's
``H.vector_aligned`` treats it)."""

from __future__ import annotations

import numpy as np
import pytest
from test_matmul_common import random_dense_case
from test_matmul_decode import _grouped_case

from blockscale.formats import NVFP4
from blockscale.ops import matmul_decode, matmul_sm90, matmul_twophase, matmul_wgmma
from blockscale.runtime.arrays import DeviceArray

pytestmark = pytest.mark.interp

M, N, K = 16, 64, 64
DENSE_CALLS = [
    pytest.param(matmul_wgmma.block_scaled_matmul_wgmma, id="wgmma"),
    pytest.param(matmul_sm90.block_scaled_matmul_sm90, id="sm90"),
    pytest.param(matmul_decode.block_scaled_matmul_decode, id="decode"),
    pytest.param(matmul_twophase.block_scaled_matmul_twophase, id="twophase"),
]


class _NoDevice:
    """The device of the DeviceArrays below: never used (the checks run before)."""


class FakeTorch:
    """Duck-typed like a torch CUDA tensor (the runtime never imports torch)."""

    __module__ = "torch"
    is_cuda = True
    device = "cuda:0"

    def __init__(self, like: np.ndarray, ptr: int):
        self.shape, self.dtype, self.ptr = like.shape, f"torch.{like.dtype.name}", ptr

    def is_contiguous(self):
        return True

    def data_ptr(self):
        return self.ptr


def _device_view(x: np.ndarray, offset: int, kind: str):
    """Device memory of ``x``'s shape and dtype at address 0x10000 + offset."""
    if kind == "torch":
        return FakeTorch(x, 0x10000 + offset)
    return DeviceArray(_NoDevice(), 0x10000 + offset, x.shape, x.dtype)


def _dense():
    a, b, _sfa, _sfb, sfa5, sfb5 = random_dense_case(np.random.default_rng(3), NVFP4, M, N, K)
    return {"a": a, "b": b, "sfa": sfa5, "sfb": sfb5}


@pytest.mark.parametrize("kind", ["DeviceArray", "torch"])
@pytest.mark.parametrize("arg", ["a", "b", "sfa", "sfb"])
@pytest.mark.parametrize("call", DENSE_CALLS)
def test_dense_direct_call_rejects_misaligned_operand(call, arg, kind):
    ops = _dense()
    ops[arg] = _device_view(ops[arg], 8, kind)
    with pytest.raises(ValueError) as info:
        call(ops["a"], ops["b"], ops["sfa"], ops["sfb"], NVFP4, k=K, device="interp")
    msg = str(info.value)
    assert msg.startswith(f"{arg} must be 16-byte aligned"), msg
    assert "0x10008" in msg and "% 16 = 8" in msg


@pytest.mark.parametrize("call", DENSE_CALLS[:3])
def test_aligned_device_operands_pass_the_check(call):
    """16-byte aligned device memory passes: the next check (the interpreter takes numpy
    arrays only) is what rejects it, naming the first device operand."""
    ops = _dense()
    ops["b"] = _device_view(ops["b"], 16, "DeviceArray")
    with pytest.raises(TypeError, match=r"^b: device 'interp' takes numpy arrays"):
        call(ops["a"], ops["b"], ops["sfa"], ops["sfb"], NVFP4, k=K, device="interp")


@pytest.mark.parametrize("arg", ["hidden", "weight", "a_scales", "b_scales"])
def test_grouped_decode_direct_call_rejects_misaligned_operand(arg):
    """Without the check, the grouped dispatch under grouped_matmul_decode would skip its
    only fast path (the decode hook) for such operands and run the portable kernel."""
    case, _rs, _ws, esc, k = _grouped_case(NVFP4, 1, np.random.default_rng(5))
    case[arg] = _device_view(case[arg], 4, "DeviceArray")
    with pytest.raises(ValueError, match=rf"^{arg} must be 16-byte aligned.*% 16 = 4\)"):
        matmul_decode.grouped_matmul_decode(**case, expert_scales=esc, fmt=NVFP4, k=k,
                                            device="interp", variant="mma_p")


def _offset_view(x: np.ndarray, offset: int) -> np.ndarray:
    """A copy of ``x`` in a numpy buffer starting ``offset`` bytes past a 16-byte boundary."""
    raw = np.zeros(x.nbytes + 32, np.uint8)
    start = (-raw.ctypes.data) % 16 + offset
    view = raw[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    view[...] = x
    assert view.ctypes.data % 16 == offset
    return view


def test_numpy_views_at_8_bytes_are_copied_and_accepted():
    ops = _dense()
    want = matmul_sm90.block_scaled_matmul_sm90(*ops.values(), NVFP4, k=K, device="interp",
                                                out_dtype="float32")
    views = {n: _offset_view(v, 8) for n, v in ops.items()}
    got = matmul_sm90.block_scaled_matmul_sm90(*views.values(), NVFP4, k=K, device="interp",
                                               out_dtype="float32")
    assert got.shape == (M, N) and np.array_equal(got.view(np.uint32), want.view(np.uint32))

"""``_matmul_host.vector_aligned``, the dispatches' gate for the tiled kernels: its answers
for every kind of operand (numpy, our DeviceArrays, torch-like tensors, CUDA Array
Interface objects, unusable objects) equal the full resolution's (``as_device_buffer``: the
address % 16, False when it raises), and a torch tensor of a dtype seen before is read by
``data_ptr`` alone: no DeviceBuffer, no stream query (the launch resolves it once more)."""

from __future__ import annotations

import numpy as np
import pytest

from blockscale.ops import _matmul_host as H
from blockscale.runtime import arrays
from blockscale.runtime.arrays import DeviceArray


class FakeTorch:
    """Duck-typed like a torch tensor (the runtime never imports torch)."""

    __module__ = "torch"

    def __init__(self, ptr, dtype="torch.uint8", contiguous=True, cuda=True):
        self.ptr, self.dtype, self._c, self.is_cuda = ptr, dtype, contiguous, cuda
        self.shape = (4, 16)
        self.device = "cuda:0" if cuda else "cpu"
        self.data_ptr_calls = 0

    def is_contiguous(self):
        return self._c

    def stride(self):
        return (16, 1) if self._c else (1, 4)

    def data_ptr(self):
        self.data_ptr_calls += 1
        return self.ptr


class FakeCai:
    def __init__(self, ptr):
        self.ptr = ptr

    @property
    def __cuda_array_interface__(self):
        return {"data": (self.ptr, False), "shape": (16,), "typestr": "|u1", "version": 3,
                "strides": None}


def _full_resolution(x):
    """vector_aligned's answer for one operand as it was: resolve it completely."""
    if x is None or isinstance(x, np.ndarray):
        return True
    try:
        return arrays.as_device_buffer(x, "operand").ptr % 16 == 0
    except (TypeError, ValueError, AttributeError):
        return False


def _operands():
    dev = object()  # a DeviceArray's device is only stored
    host = np.zeros(64, np.uint8)
    return [None, host, host[8:], DeviceArray(dev, 0x1000, (16,), np.uint8),
            DeviceArray(dev, 0x1008, (16,), np.uint8), DeviceArray(dev, 0x1004, (4,), np.int32),
            FakeTorch(0x2000), FakeTorch(0x2008), FakeTorch(0x2000, contiguous=False),
            FakeTorch(0x2000, cuda=False), FakeTorch(0x2000, dtype="torch.complex64"),
            FakeTorch(0x2000, dtype="torch.float8_e4m3fn"), FakeCai(0x3000), FakeCai(0x3001),
            object(), 3.0]


def test_same_answers_as_the_full_resolution():
    ops = _operands()
    want = [_full_resolution(x) for x in ops]
    assert want == [True, True, True, True, False, False, True, False, False, False, False,
                    True, True, False, False, False]
    for _ in range(2):  # the second time with the torch dtypes cached
        assert [H.vector_aligned(x) for x in ops] == want
    assert H.vector_aligned(*(x for x, w in zip(ops, want) if w))
    assert not H.vector_aligned(ops[0], ops[1], ops[7])  # one misaligned operand decides


def test_torch_operand_read_by_data_ptr_alone(monkeypatch):
    """After the first sight of a dtype, a torch operand costs ``data_ptr`` and attribute
    reads: the full resolution (and its stream query) is not reached."""
    t, bad = FakeTorch(0x4000), FakeTorch(0x4008)
    assert H.vector_aligned(t)  # fills the runtime's torch dtype cache if needed

    def no(*a, **k):
        raise AssertionError("the full resolution must not run")

    monkeypatch.setattr(arrays, "as_device_buffer", no)
    monkeypatch.setattr(arrays, "torch_current_stream", no)
    t.data_ptr_calls = 0
    assert H.vector_aligned(t, None, np.zeros(4, np.uint8))
    assert not H.vector_aligned(bad)
    assert t.data_ptr_calls == 1 and bad.data_ptr_calls == 1
    with pytest.raises(AssertionError, match="full resolution"):
        H.vector_aligned(FakeCai(0x3000))  # other device memory still resolves fully

"""The tensormap launch contract and the interpreter's TMA / mbarrier model, without a GPU.

* blockscale.launch: "tensormap" KernelArg validation, JSON round trip, launch-value checks;
* the GPU launch plumbing on a fake GPU (host memory): the map's device address is packed as
  the kernel's pointer parameter; non-CUDA devices refuse tensormap args;
* runtime.cuda.encode_tensormap's cuTensorMapEncodeTiled call, on a fake driver;
* the interpreter model: box reads with zero fill, the swizzle map, mbarrier deadlock
  detection, and a launch whose tensormap disagrees with the kernel's descriptor type.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import struct
import types

import ml_dtypes
import numpy as np
import pytest

from blockscale.launch import KernelArg, KernelBinary, tensormap_dims
from blockscale.ops import quantize_async as QA
from blockscale.runtime.device import ArgPack, GpuDevice


def _tmap(**kw) -> KernelArg:
    base = {"name": "x_map", "kind": "tensormap", "dtype": "bfloat16", "tensor": "x", "box": (64, 128),
                "swizzle": "128b"}
    return KernelArg(**{**base, **kw})


# ---- launch contract ---------------------------------------------------------------------------


def test_tensormap_arg_validation():
    a = _tmap(box=[64, 128])
    assert a.box == (64, 128) and a.box_bytes == 16384
    hash(a)
    for bad, match in (({"swizzle": "256b"}, "swizzle"), ({"box": (128, 128)}, "at most 128"),
                       ({"box": (4, 8)}, "multiple of 16"), ({"box": ()}, "box"),
                       ({"box": (64, 300)}, "box"), ({"tensor": ""}, "tensor"),
                       ({"role": "out"}, "role"), ({"dtype": "float64"}, "dtype")):
        with pytest.raises(ValueError, match=match):
            _tmap(**bad)
    with pytest.raises(ValueError, match="tensormap"):
        KernelArg("x", "buffer", "bfloat16", box=(64,))
    x = KernelArg("x", "buffer", "bfloat16")
    with pytest.raises(ValueError, match="tensor must name"):
        KernelBinary("k", "sm_90a", "cubin", b"", (KernelArg("x", "buffer", "uint8"), a),
                     (160, 1, 1))
    with pytest.raises(ValueError, match="tensor must name"):
        KernelBinary("k", "sm_90a", "cubin", b"", (_tmap(tensor="y"), x), (160, 1, 1))


def test_tensormap_json_round_trip_and_plain_args_unchanged():
    args = QA.kernel_args()
    kb = KernelBinary("k", "sm_90a", "cubin", b"\0", args, (160, 1, 1))
    d = json.loads(kb.dumps())
    assert d["args"][0] == {"name": "x", "kind": "buffer", "dtype": "bfloat16", "role": "in"}
    assert d["args"][1]["box"] == [64, 128] and d["args"][1]["swizzle"] == "128b"
    assert KernelBinary.from_json(d, b"\0").args == args


def test_tensormap_dims_checks():
    a = _tmap()
    assert tensormap_dims(a, (704, 256), 704 * 256) == (704, 256)
    assert tensormap_dims(a, [np.int64(64), 3], 192) == (64, 3)
    with pytest.raises(ValueError, match="elements"):
        tensormap_dims(a, (704, 255), 704 * 256)
    with pytest.raises(ValueError, match="multiple of 16"):
        tensormap_dims(a, (4, 3), 12)
    for bad in ((704,), 704, (704.0, 2), (True, 2)):
        with pytest.raises(TypeError):
            tensormap_dims(a, bad, 1408)


# ---- GPU plumbing on a fake GPU ----------------------------------------------------------------


class FakeGpu(GpuDevice):
    """Host memory as device memory; records launches and tensormap requests."""

    name = "cuda"
    binary_kind = "cubin"

    def __init__(self):
        super().__init__(0)
        self.blocks, self.launches, self.maps = {}, [], []

    def _malloc(self, nbytes, stream=0):
        b = ctypes.create_string_buffer(nbytes)
        self.blocks[ctypes.addressof(b)] = b
        return ctypes.addressof(b)

    def _free(self, ptr, stream=0):
        del self.blocks[ptr]

    def _htod(self, dst, src, nbytes, stream):
        ctypes.memmove(dst, src, nbytes)

    _dtoh = _htod

    def _memset(self, dst, nbytes, stream):
        ctypes.memset(dst, 0, nbytes)

    def _load_function(self, kernel):
        return "fn"

    def _launch_raw(self, function, grid, kernel, stream, params_address):
        self.launches.append(self.kernel_handle(kernel)[1].packed_bytes())

    def stream_synchronize(self, stream):
        pass

    def synchronize(self):
        pass


class MapGpu(FakeGpu):
    def tensormap_address(self, arg, ptr, dims, stream):
        self.maps.append((arg.name, ptr, dims, stream))
        return 0xABCD00


def _kernel() -> KernelBinary:
    return KernelBinary(QA.AsyncQuantizeSpec.kernel_name, "sm_90a", "cubin", b"\0",
                        QA.kernel_args(), (160, 1, 1))


def _launch(dev: GpuDevice, m: int = 130, k: int = 128, dims=None):
    x = dev.to_device(np.zeros((m, k), ml_dtypes.bfloat16))
    data = dev.alloc((m, k // 2), np.uint8)
    scales = dev.alloc((2, k // 64, 32, 4, 4), ml_dtypes.float8_e4m3fn)
    grid, values = QA.launch_plan(m, k)
    if dims is not None:
        values["x_map"] = dims
    bound = {"x": x, "data": data, "scales": scales, **values, "tensor_sf": 0.5}
    dev.launch(_kernel(), grid, [bound[a.name] for a in _kernel().args], stream=7)
    return x


def test_argpack_puts_the_map_address_in_the_pointer_param():
    pack = ArgPack(_kernel())
    assert pack.tensormaps == (1,)
    assert pack.num_params == 5 + 1 + 5 + 5 + 3
    dev = MapGpu()
    x = _launch(dev)
    assert dev.maps == [("x_map", x.ptr, (128, 130), 7)]
    off = pack.offsets[5]  # after x's five descriptor params
    assert struct.unpack_from("<Q", dev.launches[0], off)[0] == 0xABCD00
    with pytest.raises(ValueError, match="elements"):
        _launch(dev, dims=(128, 129))


def test_non_cuda_devices_refuse_tensormaps():
    with pytest.raises(ValueError, match="tensormap"):
        _launch(FakeGpu())


def test_encode_tensormap_driver_call(monkeypatch):
    from cuda.bindings import driver as real

    from blockscale.runtime import cuda as rc

    seen = {}

    def encode(*args):
        seen["args"] = args
        return real.CUresult.CUDA_SUCCESS, types.SimpleNamespace(opaque=list(range(16)))

    fake = types.SimpleNamespace(**{n: getattr(real, n) for n in dir(real)
                                    if n.startswith(("CU", "cuuint"))})
    fake.cuTensorMapEncodeTiled = encode
    monkeypatch.setattr(rc, "_driver", lambda: fake)
    blob = rc.encode_tensormap(_tmap(), 0x10000, (2944, 129))
    assert blob == struct.pack("<16Q", *range(16))
    dt, rank, ptr, dims, strides, box, estr, inter, sw, _l2, oob = seen["args"]
    assert dt == real.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    assert int(rank) == 2 and ptr == 0x10000
    assert [int(d) for d in dims] == [2944, 129] and [int(s) for s in strides] == [5888]
    assert [int(b) for b in box] == [64, 128] and [int(e) for e in estr] == [1, 1]
    assert sw == real.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
    assert oob == real.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE  # zeros
    assert inter == real.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE
    with pytest.raises(ValueError, match="16-byte aligned"):
        rc.encode_tensormap(_tmap(), 0x10008, (2944, 129))


# ---- interpreter model -------------------------------------------------------------------------


def test_box_read_zero_fills_out_of_bounds():
    from blockscale.runtime.interpreter.ops_tma import TensorMap

    data = np.arange(5 * 70, dtype=np.uint16)
    tm = TensorMap("t", data, (70, 5), (16, 4), "none")
    box = tm.read_box((64, 3))
    want = np.zeros((4, 16), np.uint16)
    want[:2, :6] = data.reshape(5, 70)[3:5, 64:70]
    assert np.array_equal(box, want)
    assert not tm.read_box((-16, 0)).any() and not tm.read_box((0, 5)).any()
    assert np.array_equal(tm.read_box((-8, -2))[2:, 8:], data.reshape(5, 70)[:2, :8])


def test_swizzle_map():
    from blockscale.runtime.interpreter.ops_tma import swizzle_offsets

    off = swizzle_offsets(1024, "128b")
    for r in range(8):
        for c in range(8):
            assert off[r * 128 + c * 16] == r * 128 + (c ^ r) * 16
    assert sorted(off) == list(range(1024))
    assert np.array_equal(swizzle_offsets(256, "none"), np.arange(256))
    assert swizzle_offsets(256, "32b")[128] == 144 and swizzle_offsets(512, "64b")[384] == 432


def _mini_kernel(issue_copy: bool) -> str:
    """A 32-thread kernel: thread 0 inits the mbarrier (and optionally copies a 16x64 box),
    everyone waits, thread t writes tile[t % 16, 0]."""
    from mlir import ir
    from mlir.dialects import arith, gpu

    from blockscale.compiler import ir as B
    from blockscale.compiler.arch import tma

    arg = KernelArg("x_map", "tensormap", "bfloat16", tensor="x", box=(64, 16),
                    swizzle="128b")
    args = (KernelArg("x", "buffer", "bfloat16"), arg,
            KernelArg("out", "buffer", "bfloat16", "out"))
    with ir.Context(), ir.Location.unknown():
        with B.kernel_module("mini", "sm_90a", args, (32, 1, 1)) as kb:
            tile = tma.shared_buffer(kb, "16x64xbf16", align=1024)
            bar = tma.mbarrier_group(1)
            desc = tma.descriptor(kb.arg("x_map"), arg)
            tid = B.thread_idx()
            first = arith.cmpi(arith.CmpIPredicate.eq, tid, B.const(0))
            with B.when(first):
                tma.mbarrier_init(bar, 1)
                tma.fence_mbarrier_init()
            gpu.barrier()
            with B.when(first):
                tma.mbarrier_arrive_expect_tx(bar, arg.box_bytes)
                if issue_copy:
                    tma.tma_load(tile, desc, [0, 0], bar)
            tma.mbarrier_wait(bar, 0)
            row = arith.remui(tid, B.const(16))
            from mlir.dialects import memref

            val = memref.load(tile, [row, B.const(0)])
            B.store(val, kb.arg("out"), tid)
        return str(kb.module)


def _run_mini(text: str, box=(64, 16)) -> np.ndarray:
    from blockscale.runtime.interp_device import InterpDevice

    args = (KernelArg("x", "buffer", "bfloat16"),
            KernelArg("x_map", "tensormap", "bfloat16", tensor="x", box=box, swizzle="128b"),
            KernelArg("out", "buffer", "bfloat16", "out"))
    kb = KernelBinary("mini", "sm_90a", "cubin", b"", args, (32, 1, 1), mlir=text)
    x = np.arange(10 * 64, dtype=np.float32).reshape(10, 64).astype(ml_dtypes.bfloat16)
    out = np.zeros(32, ml_dtypes.bfloat16)
    InterpDevice().launch(kb, (1, 1, 1), [x, (64, 10), out])
    return out


def test_mini_kernel_copy_wait_and_zero_fill():
    out = _run_mini(_mini_kernel(True)).astype(np.float32)
    rows = np.arange(32) % 16
    # physical chunk 0 of swizzled row r holds logical chunk r % 8; rows 10..15 are past the
    # tensor (10 rows): zero filled
    want = np.where(rows < 10, rows * 64 + (rows % 8) * 8, 0).astype(np.float32)
    assert np.array_equal(out, want)


def test_wait_without_the_copy_deadlocks():
    from blockscale.runtime.interpreter.ops_tma import MBarrierDeadlockError

    with pytest.raises(MBarrierDeadlockError, match="transaction bytes 2048"):
        _run_mini(_mini_kernel(False))


def test_launch_box_must_match_the_descriptor_type():
    with pytest.raises(ValueError, match="descriptor type says box"):
        _run_mini(_mini_kernel(True), box=(32, 16))


def test_dataclass_replace_keeps_args_hashable():
    a = dataclasses.replace(_tmap(), box=[64, 64])
    assert a.box == (64, 64) and hash(a)

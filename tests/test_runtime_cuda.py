"""CUDA runtime on a real NVIDIA GPU: launches, dynamic shared memory > 48 KiB, streams and
events, DeviceArray <-> torch, and block_scales_interleave byte-identical to the reference on
MAX's shapes, also from a saved Program and with ``sys.modules["mlir"] = None``.

Kernels come from the bundle (``BLOCKSCALE_BUNDLE_DIR=build/gpu``, made by
``make gpu-bundle``) on machines without the compiler. One kernel is hand-written PTX that the
driver JIT-compiles, so the launch path is checked without any compiled bundle.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

from blockscale.launch import KernelArg, KernelBinary, Launch

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]

MAX_SHAPES = [(128, 4), (129, 4), (129, 5), (1024, 1024), (16384, 3328), (53248, 1024)]
SCALE_DTYPES = ["float8_e4m3fn", "float8_e8m0fnu"]

# y[i] = x[i] * alpha + x_size, staged through the TOP of the dynamic shared memory, so the
# launch needs the MAX_DYNAMIC_SHARED_SIZE_BYTES attribute when smem_words * 4 > 48 KiB.
# Parameters follow the memref-descriptor convention of blockscale.launch.
SCALE_ADD_PTX = r"""
.version 8.0
.target sm_90
.address_size 64
.extern .shared .align 16 .b8 bs_dyn_smem[];
//STATIC.shared .align 16 .b8 bs_static_smem[STATIC_BYTES];
.visible .entry bs_rt_scale_add(
    .param .u64 x_alloc, .param .u64 x_aligned, .param .u64 x_offset, .param .u64 x_size,
    .param .u64 x_stride,
    .param .u64 y_alloc, .param .u64 y_aligned, .param .u64 y_offset, .param .u64 y_size,
    .param .u64 y_stride,
    .param .u32 n, .param .f32 alpha, .param .u32 smem_words)
{
    .reg .pred %p<2>;
    .reg .b32 %r<10>;
    .reg .f32 %f<6>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [x_aligned];
    ld.param.u64 %rd2, [y_aligned];
    ld.param.u64 %rd3, [x_size];
    ld.param.u32 %r1, [n];
    ld.param.f32 %f1, [alpha];
    ld.param.u32 %r2, [smem_words];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r6, %r3, %r4, %r5;
    sub.s32 %r7, %r2, 1;
    sub.s32 %r7, %r7, %r5;
    mul.wide.u32 %rd4, %r7, 4;
    mov.u64 %rd5, bs_dyn_smem;
    add.u64 %rd5, %rd5, %rd4;
    mul.wide.s32 %rd7, %r6, 4;
    setp.lt.s32 %p1, %r6, %r1;
    mov.f32 %f2, 0f00000000;
    @!%p1 bra SKIP_LOAD;
    cvta.to.global.u64 %rd6, %rd1;
    add.u64 %rd8, %rd6, %rd7;
    ld.global.f32 %f2, [%rd8];
SKIP_LOAD:
    cvt.rn.f32.u64 %f3, %rd3;
    fma.rn.f32 %f4, %f2, %f1, %f3;
    st.shared.f32 [%rd5], %f4;
    bar.sync 0;
    ld.shared.f32 %f5, [%rd5];
//STATIC    mul.wide.u32 %rd11, %r5, 4;
//STATIC    mov.u64 %rd6, bs_static_smem;
//STATIC    add.u64 %rd6, %rd6, %rd11;
//STATIC    st.shared.f32 [%rd6], %f5;
//STATIC    bar.sync 0;
//STATIC    ld.shared.f32 %f5, [%rd6];
    @!%p1 bra DONE;
    cvta.to.global.u64 %rd9, %rd2;
    add.u64 %rd10, %rd9, %rd7;
    st.global.f32 [%rd10], %f5;
DONE:
    ret;
}
"""
SCALE_ADD_ARGS = (KernelArg("x", "buffer", "float32"), KernelArg("y", "buffer", "float32", "out"),
                  KernelArg("n", "scalar", "i32"), KernelArg("alpha", "scalar", "f32"),
                  KernelArg("smem_words", "scalar", "i32"))


@pytest.fixture(scope="module")
def cuda():
    from blockscale.runtime import get_device

    return get_device("cuda")


def scale_add_kernel(dev, smem_bytes: int, name: str = "bs_rt_scale_add",
                     static_bytes: int = 0) -> KernelBinary:
    """The PTX above as a KernelBinary for this GPU (the driver JIT-compiles PTX images);
    ``static_bytes``: the values also pass through a static shared array of that size."""
    major, minor = dev.capability
    ptx = SCALE_ADD_PTX
    if static_bytes:
        ptx = ptx.replace("//STATIC", "").replace("STATIC_BYTES", str(static_bytes))
    return KernelBinary(name=name, target=f"sm_{major}{minor}", binary_kind="cubin",
                        binary=ptx.encode() + b"\0", args=SCALE_ADD_ARGS,
                        block=(256, 1, 1), dynamic_shared_bytes=smem_bytes)


def _scales(shape, dtype, seed=1234):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=shape, dtype=np.uint8).view(getattr(ml_dtypes, dtype))


def _bytes(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


# ----------------------------------------------------------------------------- launch path

@pytest.mark.parametrize(("smem_bytes", "static_bytes"),
                         [(16 * 1024, 0), (100 * 1024, 0), (32 * 1024, 40 * 1024)])
def test_launch_with_dynamic_shared_memory(cuda, smem_bytes, static_bytes):
    """Also a kernel whose static + dynamic shared memory passes 48 KiB with less than 48 KiB
    dynamic (the fused quantize kernels' 40 KiB of tables + a 32 KiB ring): it needs the
    opt-in too (without it: CUDA_ERROR_INVALID_VALUE)."""
    from blockscale.runtime import DeviceArray

    kernel = scale_add_kernel(cuda, smem_bytes, static_bytes=static_bytes)
    x = np.arange(1000, dtype=np.float32)
    dx = DeviceArray.from_numpy(x, device=cuda)
    dy = cuda.zeros((1000,), np.float32)
    cuda.launch(kernel, (4,), [dx, dy, 1000, 0.5, smem_bytes // 4])
    np.testing.assert_array_equal(dy.numpy(), x * np.float32(0.5) + np.float32(1000))


def test_cuda_errors_carry_name_and_kernel(cuda):
    from blockscale.runtime.cuda import CudaError

    bad = scale_add_kernel(cuda, 1024, name="no_such_kernel")
    with pytest.raises(CudaError, match=r"cuModuleGetFunction failed \(kernel 'no_such_kernel'\)"
                                        r": CUDA_ERROR_NOT_FOUND") as info:
        cuda.launch(bad, (1,), [cuda.zeros((1,), np.float32)] * 2 + [1, 1.0, 256])
    assert info.value.error_name == "CUDA_ERROR_NOT_FOUND"
    with pytest.raises(ValueError, match="needs 4194304 bytes of dynamic shared memory"):
        cuda.check_kernel(scale_add_kernel(cuda, 4 << 20))


def test_streams_and_event_timing(cuda):
    kernel = scale_add_kernel(cuda, 1024)
    stream = cuda.create_stream()
    n = 1 << 20
    dx = cuda.to_device(np.ones(n, np.float32), stream)
    dy = cuda.alloc((n,), np.float32, stream)
    launch = lambda: cuda.launch(kernel, (n // 256,), [dx, dy, n, 2.0, 256],
                                 stream=stream)
    ms = cuda.time_ms(launch, stream=stream, warmup=2, iters=10)
    assert 0.0 < ms < 1000.0
    assert dy.stream == stream.handle
    np.testing.assert_array_equal(dy.numpy()[:4], np.full(4, 2.0 + n, np.float32))
    start, end = cuda.create_event(), cuda.create_event()
    start.record(stream)
    launch()
    end.record(stream)
    assert start.elapsed_ms(end) >= 0.0


def test_arrays_keep_their_stream_alive(cuda):
    """An array allocated on a stream the caller drops: the stream lives until the array is
    freed (its free and later copies are ordered on it; a destroyed stream handle never
    reaches the driver), then goes."""
    import gc
    import weakref

    stream = cuda.create_stream()
    host = np.arange(1 << 16, dtype=np.int32)
    arr = cuda.to_device(host, stream)
    alive = weakref.ref(stream)
    del stream
    gc.collect()
    assert alive() is not None
    np.testing.assert_array_equal(cuda.to_host(arr), host)  # on the array's stream
    del arr
    gc.collect()
    assert alive() is None
    assert cuda.to_host(cuda.to_device(host)).sum() == host.sum()


def test_wrong_target_is_rejected(cuda):
    kernel = scale_add_kernel(cuda, 1024)
    other = "sm_100a" if cuda.capability != (10, 0) else "sm_90a"
    cuda.launch(kernel, (1,), [cuda.zeros((1,), np.float32)] * 2 + [1, 1.0, 256])  # loaded
    wrong = KernelBinary(kernel.name, other, "cubin", kernel.binary, kernel.args, kernel.block)
    with pytest.raises(ValueError, match=f"built for {other}, which does not run on this GPU"):
        cuda.launch(wrong, (1,), [cuda.zeros((1,), np.float32)] * 2 + [1, 1.0, 256])
    cuda.synchronize()


# ----------------------------------------------------------------------------- torch interop

@pytest.mark.parametrize("dtype", ["uint8", "bfloat16", "float8_e4m3fn", "float32"])
def test_device_array_to_torch_and_back(cuda, dtype):
    torch = pytest.importorskip("torch")
    from blockscale.runtime import DeviceArray, as_device_buffer

    np_dtype = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    host = np.random.default_rng(0).integers(0, 256, size=(64, 32 * np_dtype.itemsize),
                                             dtype=np.uint8).view(np_dtype)
    if np_dtype == np.float32:
        host = np.nan_to_num(host)
    arr = DeviceArray.from_numpy(host, device=cuda)
    t = torch.from_dlpack(arr)
    assert t.is_cuda and tuple(t.shape) == host.shape and t.data_ptr() == arr.ptr
    assert str(t.dtype) == f"torch.{dtype}"
    back = t.view(torch.uint8).cpu().numpy()
    np.testing.assert_array_equal(back, host.view(np.uint8))
    buf = as_device_buffer(t, "t")
    assert buf.ptr == t.data_ptr() and buf.dtype == np_dtype
    with pytest.raises(ValueError, match="t2: expected a C-contiguous array"):
        as_device_buffer(t.t(), "t2")


# ----------------------------------------------------------------------------- interleave

@pytest.mark.parametrize("dtype", SCALE_DTYPES)
@pytest.mark.parametrize("shape", MAX_SHAPES)
def test_interleave_numpy_in_numpy_out(cuda, shape, dtype):
    from blockscale import ops
    from blockscale import reference as ref

    scales = _scales(shape, dtype)
    out = ops.block_scales_interleave(scales, device="cuda")
    want = ref.block_scales_interleave(scales)
    assert isinstance(out, np.ndarray) and out.dtype == want.dtype and out.shape == want.shape
    np.testing.assert_array_equal(_bytes(out), _bytes(want))


@pytest.mark.parametrize("dtype", SCALE_DTYPES)
@pytest.mark.parametrize("shape", MAX_SHAPES)
def test_interleave_device_array_in_device_array_out(cuda, shape, dtype):
    from blockscale import ops
    from blockscale import reference as ref
    from blockscale.runtime import DeviceArray

    scales = _scales(shape, dtype)
    out = ops.block_scales_interleave(DeviceArray.from_numpy(scales, device=cuda),
                                      device="cuda")
    assert isinstance(out, DeviceArray)
    np.testing.assert_array_equal(_bytes(out.numpy()), _bytes(ref.block_scales_interleave(scales)))


@pytest.mark.parametrize("dtype", SCALE_DTYPES)
@pytest.mark.parametrize("shape", MAX_SHAPES)
def test_interleave_torch_in_device_out(cuda, shape, dtype):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, dtype):
        pytest.skip(f"this torch has no {dtype}")
    from blockscale import ops
    from blockscale import reference as ref
    from blockscale.runtime import as_device_buffer

    scales = _scales(shape, dtype)
    t = torch.from_numpy(scales.view(np.uint8).copy()).cuda().view(getattr(torch, dtype))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # t was written on the current stream
    with torch.cuda.stream(stream):
        out = ops.block_scales_interleave(t, device="cuda")
        got = torch.from_dlpack(out) if hasattr(out, "__dlpack__") else out
        got_bytes = got.view(torch.uint8).cpu().numpy()
    assert as_device_buffer(out, "out").shape == ref.block_scales_interleave(scales).shape
    np.testing.assert_array_equal(got_bytes.reshape(-1),
                                  _bytes(ref.block_scales_interleave(scales)).reshape(-1))


def _interleave_program(rows: int, kblocks: int, dtype: str):
    from blockscale.ops import _core, interleave
    from blockscale.runtime.program import BufferDecl, Program

    kernel = _core.get_kernel(interleave.InterleaveSpec(dtype, "sm_90a"))
    plan = interleave.launch_plan(rows, kblocks)
    # the op's own argument order: scales, out, then the plan's scalars
    bindings = dict(zip([a.name for a in kernel.args], ["scales", "out", *plan.scalars()]))
    buffers = [BufferDecl("scales", (rows, kblocks), dtype, "input"),
               BufferDecl("out", interleave.output_shape(rows, kblocks), dtype, "output")]
    return Program.from_launches([Launch(kernel, plan.grid, bindings)], buffers)


def test_saved_program_runs_without_mlir(cuda, tmp_path):
    """A Program saved here runs in a fresh process where mlir cannot be imported, and the
    op API also works there from the bundle."""
    if cuda.capability != (9, 0):
        pytest.skip("the bundled interleave kernels are built for sm_90a")
    for dtype in SCALE_DTYPES:
        _interleave_program(129, 5, dtype).save(tmp_path / dtype)
    code = textwrap.dedent(f"""
        import sys
        sys.modules["mlir"] = None
        import ml_dtypes, numpy as np
        from blockscale import ops, reference as ref
        from blockscale.runtime import DeviceArray, Program, get_device
        rng = np.random.default_rng(7)
        for dtype in {SCALE_DTYPES!r}:
            prog = Program.load({str(tmp_path)!r} + "/" + dtype)
            for shape in [(129, 5)]:
                x = rng.integers(0, 256, size=shape, dtype=np.uint8).view(getattr(ml_dtypes, dtype))
                want = ref.block_scales_interleave(x).view(np.uint8)
                out = prog.run({{"scales": x}}, device="cuda")["out"]
                assert np.array_equal(out.view(np.uint8), want)
                dev_out = prog.run({{"scales": DeviceArray.from_numpy(x)}}, device="cuda")["out"]
                assert np.array_equal(dev_out.numpy().view(np.uint8), want)
            for shape in {MAX_SHAPES!r}:
                x = rng.integers(0, 256, size=shape, dtype=np.uint8).view(getattr(ml_dtypes, dtype))
                out = ops.block_scales_interleave(x, device="cuda")
                assert np.array_equal(out.view(np.uint8),
                                      ref.block_scales_interleave(x).view(np.uint8)), shape
        assert get_device().name == "cuda"
        assert sys.modules["mlir"] is None
        assert not [m for m in sys.modules if m.startswith("mlir.")]
        print("OK")
    """)
    result = subprocess.run([sys.executable, "-c", code], check=False,
                            capture_output=True, text=True,
                            env={**os.environ})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("OK")

"""Program launch plans: save/load round trip, validation, running on the interpreter device,
and loading + running with ``sys.modules["mlir"] = None`` (no GPU needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types

import ml_dtypes
import numpy as np
import pytest

from blockscale.launch import KernelArg, KernelBinary, Launch
from blockscale.runtime import cuda as rt_cuda
from blockscale.runtime import device as rt_device
from blockscale.runtime.program import BufferDecl, Program, Step

ADD_ARGS = (KernelArg("x", "buffer", "float32"), KernelArg("y", "buffer", "float32", "out"),
            KernelArg("n", "scalar", "i32"), KernelArg("alpha", "scalar", "f32"))
ADD = KernelBinary(name="add_alpha", target="sm_90a", binary_kind="cubin",
                   binary=b"\x7fELF add_alpha cubin bytes", args=ADD_ARGS, block=(128, 1, 1),
                   mlir="// add_alpha kernel IR", meta={"registers": 12})


def two_step_program() -> Program:
    """y = (x + 1) + 2.5 through a temporary, plus a zero-initialised output never written."""
    buffers = [BufferDecl("x", (4, 8), "float32", "input"),
               BufferDecl("tmp", (4, 8), "float32", "temp"),
               BufferDecl("y", (4, 8), "float32", "output"),
               BufferDecl("pad", (3,), "uint8", "output", init="zeros")]
    launches = [Launch(ADD, (1, 1, 1), {"x": "x", "y": "tmp", "n": 32, "alpha": 1.0}),
                Launch(ADD, (1, 1, 1), {"x": "tmp", "y": "y", "n": 32, "alpha": 2.5})]
    return Program.from_launches(launches, buffers, meta={"op": "add_twice"})


@pytest.fixture
def fake_interpreter(monkeypatch):
    """Stands in for blockscale.runtime.interpreter: runs add_alpha in numpy and records calls."""
    calls = []

    def run_kernel(mlir, name, grid, block, args, target, *, dynamic_shared_bytes=0):
        assert dynamic_shared_bytes == 0  # add_alpha uses no dynamic shared memory
        calls.append((mlir, name, grid, block, target))
        x, y, n, alpha = args
        assert x.ndim == 1 and y.ndim == 1  # flat buffers, as the interpreter expects
        y[:n] = x[:n] + np.float32(alpha)

    module = types.ModuleType("blockscale.runtime.interpreter")
    module.run_kernel = run_kernel
    monkeypatch.setitem(sys.modules, "blockscale.runtime.interpreter", module)
    return calls


def test_from_launches_dedups_kernels():
    prog = two_step_program()
    assert list(prog.kernels) == ["add_alpha-0"]
    assert [s.kernel for s in prog.steps] == ["add_alpha-0", "add_alpha-0"]
    assert prog.target == "sm_90a"
    assert [b.name for b in prog.inputs] == ["x"] and [b.name for b in prog.outputs] == ["y", "pad"]


def test_save_load_round_trip(tmp_path):
    prog = two_step_program()
    prog.save(tmp_path / "prog")
    files = sorted(os.listdir(tmp_path / "prog" / "kernels"))
    assert files == ["add_alpha-0.cubin", "add_alpha-0.json"]
    loaded = Program.load(tmp_path / "prog")
    assert loaded.to_json() == prog.to_json()
    assert loaded.kernels["add_alpha-0"] == ADD
    assert loaded.meta == {"op": "add_twice"} and loaded.target == "sm_90a"
    plan = json.loads((tmp_path / "prog" / "plan.json").read_text())
    assert plan["format"] == "blockscale-program" and plan["version"] == 1


def test_run_on_interpreter(fake_interpreter):
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    out = two_step_program().run({"x": x}, device="interp")
    assert set(out) == {"y", "pad"}
    assert isinstance(out["y"], np.ndarray) and out["y"].shape == (4, 8)
    np.testing.assert_array_equal(out["y"], x + 3.5)
    np.testing.assert_array_equal(out["pad"], np.zeros(3, np.uint8))
    assert [c[1:] for c in fake_interpreter] == [("add_alpha", (1, 1, 1), (128, 1, 1),
                                                  "sm_90a")] * 2
    np.testing.assert_array_equal(x, np.arange(32, dtype=np.float32).reshape(4, 8))


def test_run_validates_inputs(fake_interpreter):
    prog = two_step_program()
    with pytest.raises(ValueError, match=r"inputs: expected exactly \['x'\], got \[\]"):
        prog.run({}, device="interp")
    with pytest.raises(ValueError, match=r"input 'x': expected shape \(4, 8\), got \(8, 4\)"):
        prog.run({"x": np.zeros((8, 4), np.float32)}, device="interp")
    with pytest.raises(TypeError, match="input 'x': expected dtype float32, got bfloat16"):
        prog.run({"x": np.zeros((4, 8), ml_dtypes.bfloat16)}, device="interp")


def test_device_inputs_need_a_gpu(fake_interpreter):
    class CAI:
        @property
        def __cuda_array_interface__(self):
            return {"shape": (4, 8), "typestr": "<f4", "data": (64, False), "version": 3}

    with pytest.raises(TypeError, match="device 'interp' runs on numpy arrays"):
        two_step_program().run({"x": CAI()}, device="interp")


def test_other_target_is_a_value_error():
    dev = object.__new__(rt_cuda.CudaDevice)
    rt_device.GpuDevice.__init__(dev, 0)
    dev.capability, dev.device_name, dev.max_dynamic_smem = (8, 0), "Fake A100", 163 * 1024
    with pytest.raises(ValueError, match=r"program for target sm_90a cannot run on cuda:0 Fake "
                                         r"A100.*expected a cubin for sm_80"):
        two_step_program().run({"x": np.zeros((4, 8), np.float32)}, device=dev)
    hsaco = KernelBinary("add_alpha", "gfx942", "hsaco", b"hsaco", ADD_ARGS, (64, 1, 1))
    prog = Program([BufferDecl("x", (2,), "float32"), BufferDecl("y", (2,), "float32", "output")],
                   [Step("k", (1, 1, 1), {"x": "x", "y": "y", "n": 2, "alpha": 0.0})], {"k": hsaco})
    with pytest.raises(ValueError, match="program for target gfx942 cannot run on cuda"):
        prog.check_device(dev)


def test_plan_validation():
    x, y = BufferDecl("x", (2,), "float32"), BufferDecl("y", (2,), "float32", "output")
    good = {"x": "x", "y": "y", "n": 2, "alpha": 1.0}
    with pytest.raises(ValueError, match="step 0: unknown kernel 'nope'"):
        Program([x, y], [Step("nope", (1, 1, 1), good)], {"k": ADD})
    with pytest.raises(ValueError, match=r"bindings must name exactly the kernel args"):
        Program([x, y], [Step("k", (1, 1, 1), {"x": "x"})], {"k": ADD})
    with pytest.raises(ValueError, match=r"arg 'y': expected a buffer name, got 'z'"):
        Program([x, y], [Step("k", (1, 1, 1), {**good, "y": "z"})], {"k": ADD})
    with pytest.raises(ValueError, match=r"arg 'n': expected a scalar number, got 'x'"):
        Program([x, y], [Step("k", (1, 1, 1), {**good, "n": "x"})], {"k": ADD})
    with pytest.raises(ValueError, match="key 'a/b' must match"):
        Program([x, y], [], {"a/b": ADD})
    with pytest.raises(ValueError, match="duplicate buffer name 'x'"):
        Program([x, x], [], {})
    with pytest.raises(ValueError, match="buffer 'x': role must be one of"):
        BufferDecl("x", (2,), "float32", "inout")
    with pytest.raises(ValueError, match="buffer 'x': unknown dtype 'float33'"):
        BufferDecl("x", (2,), "float33")


def test_load_errors(tmp_path):
    with pytest.raises(ValueError, match="is not a program directory"):
        Program.load(tmp_path)
    two_step_program().save(tmp_path / "p")
    with open(tmp_path / "p" / "kernels" / "add_alpha-0.cubin", "ab") as f:
        f.write(b"tampered")
    with pytest.raises(ValueError, match="checksum mismatch"):
        Program.load(tmp_path / "p")


def test_load_and_run_without_mlir(tmp_path):
    """A saved program loads and runs (here on a host-memory fake GPU) with mlir unimportable;
    neither mlir nor the compiler is imported on the way."""
    two_step_program().save(tmp_path / "p")
    code = textwrap.dedent(f"""
        import ctypes, sys
        sys.modules["mlir"] = None
        import numpy as np
        import blockscale
        from blockscale.runtime import Program, get_device
        from blockscale.runtime.device import GpuDevice

        class HostGpu(GpuDevice):
            name, binary_kind = "cuda", "cubin"
            def __init__(self):
                super().__init__(0); self.blocks = {{}}
            def _malloc(self, n, stream=0):
                b = ctypes.create_string_buffer(n); self.blocks[ctypes.addressof(b)] = b
                return ctypes.addressof(b)
            def _free(self, p, stream=0): self.blocks.pop(p)
            def _htod(self, d, s, n, st): ctypes.memmove(d, s, n)
            def _dtoh(self, d, s, n, st): ctypes.memmove(d, s, n)
            def _memset(self, d, n, st): ctypes.memset(d, 0, n)
            def _load_function(self, k): return k.name
            def _launch_raw(self, fn, grid, k, stream, params):
                # add_alpha from the packed parameters: x desc, y desc, n, alpha
                raw = (ctypes.c_char * 88).from_address(
                    int(np.frombuffer((ctypes.c_uint64 * 1).from_address(params), np.uint64)[0]))
                import struct
                xp, _, _, xn, _, yp, _, _, _, _, n, alpha = struct.unpack("<QQqqqQQqqqif",
                                                                          bytes(raw))
                x = np.frombuffer((ctypes.c_float * xn).from_address(xp), np.float32)
                y = np.frombuffer((ctypes.c_float * n).from_address(yp), np.float32)
                y[:] = x[:n] + np.float32(alpha)
            def stream_synchronize(self, s): pass
            def synchronize(self): pass

        prog = Program.load({str(tmp_path / "p")!r})
        x = np.arange(32, dtype=np.float32).reshape(4, 8)
        out = prog.run({{"x": x}}, device=HostGpu())
        assert np.array_equal(out["y"], x + 3.5), out["y"]
        assert get_device().name in ("cuda", "hip", "interp")
        bad = [m for m in sys.modules if m.startswith(("blockscale.compiler", "mlir."))]
        assert sys.modules["mlir"] is None and not bad, bad
        print("OK")
    """)
    result = subprocess.run([sys.executable, "-c", code], check=False,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("OK")


# ----------------------------------------------------------------------------- real kernel

def interleave_program(kernel: KernelBinary, rows: int, kblocks: int, dtype: str) -> Program:
    """block_scales_interleave as a one-step Program (the op's own launch plan)."""
    from blockscale.ops import interleave

    plan = interleave.launch_plan(rows, kblocks)
    # the op's own argument order: scales, out, then the plan's scalars
    bindings = dict(zip([a.name for a in kernel.args], ["scales", "out", *plan.scalars()]))
    buffers = [BufferDecl("scales", (rows, kblocks), dtype, "input"),
               BufferDecl("out", interleave.output_shape(rows, kblocks), dtype, "output")]
    return Program.from_launches([Launch(kernel, plan.grid, bindings)], buffers,
                                 meta={"op": "block_scales_interleave"})


@pytest.mark.interp
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e8m0fnu"])
@pytest.mark.parametrize("shape", [(128, 4), (129, 5)])
def test_interleave_program_on_interpreter(tmp_path, dtype, shape):
    pytest.importorskip("mlir.ir", reason="compiling the kernel needs the MLIR bindings")
    from blockscale import reference as ref
    from blockscale.ops import _core, interleave

    try:
        kernel = _core.get_kernel(interleave.InterleaveSpec(dtype, "sm_90a"))
    except Exception as e:  # noqa: BLE001 (no ptxas here)
        pytest.skip(f"cannot compile the interleave kernel here: {e}")
    interleave_program(kernel, *shape, dtype).save(tmp_path / "p")
    prog = Program.load(tmp_path / "p")
    rng = np.random.default_rng(1234)
    scales = rng.integers(0, 256, size=shape, dtype=np.uint8).view(getattr(ml_dtypes, dtype))
    out = prog.run({"scales": scales}, device="interp")["out"]
    want = ref.block_scales_interleave(scales)
    assert out.dtype == want.dtype and out.shape == want.shape
    np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))


def test_bundle_collects_every_op_module_with_bundle_specs():
    """`make gpu-bundle` must not miss an op module that forgot to register itself (the fused
    SwiGLU kernels were missing from the H200 bundle twice)."""
    import importlib

    import blockscale.ops
    from blockscale.ops import _core
    from blockscale.tools import bundle

    entries: list = []
    specs = bundle._collect_specs(_core, "sm_90a", entries, None)
    ops_seen = {str(getattr(s, "op", "")) for s in specs}
    for name in blockscale.ops.op_module_names():
        module = importlib.import_module(f"blockscale.ops.{name}")
        fn = getattr(module, "bundle_specs", None)
        if callable(fn):
            assert {str(getattr(s, "op", "")) for s in fn("sm_90a")} <= ops_seen, name
    assert not entries

"""block_scales_interleave: spec, launch plan, kernel keys and lookup, interpreter and GPU runs
against blockscale.layouts.interleave (exact, byte for byte)."""

from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from blockscale import layouts
from blockscale.launch import KernelBinary, save_kernel
from blockscale.ops import _core, interleave
from tests._compiler_helpers import fresh_cache, skip_unless_toolchain  # noqa: F401

# SEMANTICS §3 test shapes (the two big ones only on a GPU).
SMALL_SHAPES = [(128, 4), (129, 4), (129, 5), (1, 1), (3, 7), (200, 9), (256, 8), (130, 16),
                (257, 36), (128, 20)]
GPU_SHAPES = SMALL_SHAPES + [(1024, 1024), (16384, 3328), (53248, 1024)]
DTYPES = [np.uint8, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu]


def _scales(shape, dtype, seed=1234):
    raw = np.random.default_rng(seed).integers(1, 256, shape, dtype=np.uint8)
    return raw.view(dtype)


def test_output_shape_and_plan():
    assert interleave.output_shape(129, 136) == (2, 34, 32, 4, 4)
    assert interleave.output_shape(129, 68) == (2, 17, 32, 4, 4)
    plan = interleave.launch_plan(129, 5)
    assert plan.num_groups == 2 * 1 * 32 and plan.grid == (1, 1, 1) and plan.vec_ok == 0
    assert interleave.launch_plan(16384, 3328).grid == (128 * 208 * 32 // 256, 1, 1)
    assert interleave.launch_plan(16384, 3328).vec_ok == interleave.VEC4 | interleave.VEC16
    assert interleave.launch_plan(128, 4).vec_ok == interleave.VEC4
    assert interleave.launch_plan(128, 16, input_alignment=4).vec_ok == interleave.VEC4
    assert interleave.launch_plan(128, 16, input_alignment=1).vec_ok == 0


def test_spec_and_input_validation():
    with pytest.raises(ValueError, match="dtype must be one of"):
        interleave.InterleaveSpec("float32")
    with pytest.raises(ValueError, match="target must be one of"):
        interleave.InterleaveSpec("uint8", "sm_80")
    with pytest.raises(ValueError, match=r"scales_2d must be rank 2.*\(4,\)"):
        interleave.block_scales_interleave(np.zeros(4, np.uint8), device="interp")
    with pytest.raises(TypeError, match="scales_2d must have a 1-byte scale dtype.*float32"):
        interleave.block_scales_interleave(np.zeros((4, 4), np.float32), device="interp")


def test_seed_aliases_and_public_names():
    from blockscale import ops

    assert ops.block_scales_interleave is interleave.block_scales_interleave
    assert ops.block_scales_interleave_fp4 is interleave.block_scales_interleave
    assert ops.block_scales_interleave_fp4_kernel is interleave.kernel
    assert interleave.block_scales_interleave.kernel is interleave.kernel
    assert {s.dtype for s in interleave.bundle_specs("gfx950")} == set(interleave.SCALE_DTYPES)
    assert any(isinstance(s, interleave.InterleaveSpec) for s in _core.bundle_specs("sm_90a"))


def test_kernel_key_is_stable_and_specific():
    a = _core.kernel_key(interleave.InterleaveSpec("uint8", "sm_90a"))
    assert a == _core.kernel_key(interleave.InterleaveSpec("uint8", "sm_90a"))
    assert a != _core.kernel_key(interleave.InterleaveSpec("uint8", "gfx950"))
    assert a != _core.kernel_key(interleave.InterleaveSpec("float8_e4m3fn", "sm_90a"))
    assert a.startswith("block_scales_interleave-")
    code = ("from blockscale.ops import _core, interleave; "
            "print(_core.kernel_key(interleave.InterleaveSpec('uint8', 'sm_90a')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout.strip()
    assert out == a  # same key in another process, computed without MLIR


@pytest.mark.usefixtures("fresh_cache")
def test_bundle_dir_is_used_before_compiling(tmp_path, monkeypatch):
    spec = interleave.InterleaveSpec("uint8", "sm_90a")
    fake = KernelBinary("block_scales_interleave", "sm_90a", "cubin", b"bundle-bytes",
                        spec.args(), spec.block, mlir="module {}")
    save_kernel(str(tmp_path / "bundle"), _core.kernel_key(spec), fake)
    monkeypatch.setenv("BLOCKSCALE_BUNDLE_DIR", str(tmp_path / "bundle"))
    assert _core.get_kernel(spec).binary == b"bundle-bytes"


@pytest.mark.usefixtures("fresh_cache")
def test_stripped_bundle_entry_is_used_only_without_mlir(tmp_path, monkeypatch):
    """`make gpu-bundle` strips the MLIR text: such an entry serves a machine without the
    compiler; where MLIR is importable the kernel is compiled so the interpreter can run it."""
    spec = interleave.InterleaveSpec("uint8", "sm_90a")
    fake = KernelBinary("block_scales_interleave", "sm_90a", "cubin", b"bundle-bytes",
                        spec.args(), spec.block)
    save_kernel(str(tmp_path / "bundle"), _core.kernel_key(spec), fake)
    monkeypatch.setenv("BLOCKSCALE_BUNDLE_DIR", str(tmp_path / "bundle"))
    compiled = _core.get_kernel(spec)
    assert compiled.binary != b"bundle-bytes" and compiled.mlir
    _core.clear_memory()
    monkeypatch.setattr(_core, "_mlir_available", lambda: False)
    assert _core.get_kernel(spec).binary == b"bundle-bytes"


@pytest.mark.usefixtures("fresh_cache")
def test_missing_kernel_without_mlir_names_key_and_make_target(monkeypatch):
    monkeypatch.setattr(_core, "_mlir_available", lambda: False)
    spec = interleave.InterleaveSpec("float8_e8m0fnu", "gfx942")
    with pytest.raises(RuntimeError) as info:
        _core.get_kernel(spec)
    msg = str(info.value)
    assert "block_scales_interleave" in msg and _core.kernel_key(spec) in msg
    assert "make gpu-bundle" in msg and "gfx942" in msg


@pytest.mark.lower
@pytest.mark.parametrize("target", ["sm_90a", "sm_100a", "gfx942", "gfx950"])
@pytest.mark.usefixtures("fresh_cache")
def test_get_kernel_compiles_for_every_target(target):
    skip_unless_toolchain(target)
    b = _core.get_kernel(interleave.InterleaveSpec("uint8", target))
    assert b.target == target and b.binary[:4] == b"\x7fELF"
    assert "gpu.func @block_scales_interleave" in b.mlir
    json.dumps(b.to_json())  # bundle metadata is JSON-able


def _interpreter_reason():
    try:
        from blockscale.runtime.interpreter import run_kernel  # noqa: F401
    except ImportError as e:
        return f"numpy interpreter not available: {e}"
    return None


@pytest.mark.interp
@pytest.mark.parametrize("shape", SMALL_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_interpreter_matches_layouts_interleave(shape, dtype):
    if (why := _interpreter_reason()):
        pytest.skip(why)
    x = _scales(shape, dtype)
    got = interleave.block_scales_interleave(x, device="interp")
    want = layouts.interleave(x)
    assert got.dtype == x.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.interp
@pytest.mark.parametrize("target", ["sm_90a", "gfx950"])
def test_interpreter_runs_each_backend_ir(target):
    if (why := _interpreter_reason()):
        pytest.skip(why)
    x = _scales((130, 6), np.uint8)
    got = interleave.block_scales_interleave(x, device="interp", target=target)
    np.testing.assert_array_equal(got, layouts.interleave(x))


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_cuda_matches_layouts_interleave(shape):
    x = _scales(shape, ml_dtypes.float8_e4m3fn)
    got = interleave.block_scales_interleave(x, device="cuda")
    np.testing.assert_array_equal(got.view(np.uint8), layouts.interleave(x).view(np.uint8))

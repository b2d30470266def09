"""Interpreter: the project's real kernels, run through run_kernel, against the reference.

The kernel IR comes from each op's ``build(spec)`` (the module before target lowering, as in
``Kernel.asm["mlir"]``), so no toolchain is needed.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from blockscale import reference as ref

pytest.importorskip("mlir")

from blockscale.runtime.interpreter import run_kernel

pytestmark = pytest.mark.interp

TARGETS = ("sm_90a", "sm_100a", "gfx942", "gfx950")


def _interleave_ir(target: str, dtype: str = "uint8") -> str:
    from blockscale.ops import interleave

    return str(interleave.build(interleave.InterleaveSpec(dtype, target)))


def _run_interleave(text: str, target: str, scales: np.ndarray) -> np.ndarray:
    from blockscale.ops import interleave

    rows, kblocks = scales.shape
    plan = interleave.launch_plan(rows, kblocks)
    out = np.full(interleave.output_shape(rows, kblocks), 0xA5, np.uint8)  # poison padding
    run_kernel(text, "block_scales_interleave", plan.grid, interleave.BLOCK,
               [np.ascontiguousarray(scales), out, *plan.scalars()], target,
               arg_names=["scales", "out", "rows", "kblocks", "num_chunks", "vec_ok"])
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_interleave_kernel_matches_reference(target):
    text = _interleave_ir(target)
    rng = np.random.default_rng(42)
    for shape in [(1, 1), (129, 5), (200, 7), (256, 8), (300, 12)]:
        scales = rng.integers(0, 256, shape, dtype=np.uint8)
        out = _run_interleave(text, target, scales)
        np.testing.assert_array_equal(out, ref.block_scales_interleave(scales),
                                      err_msg=f"{target} {shape}")


@pytest.mark.parametrize("target", TARGETS)
def test_interleave_kernel_large_shape_is_fast(target):
    text = _interleave_ir(target)
    scales = np.random.default_rng(0).integers(0, 256, (16384, 3328), dtype=np.uint8)
    t0 = time.perf_counter()
    out = _run_interleave(text, target, scales)
    elapsed = time.perf_counter() - t0
    np.testing.assert_array_equal(out, ref.block_scales_interleave(scales))
    assert elapsed < 10.0, f"interleave of 16384x3328 took {elapsed:.1f}s on the interpreter"


def test_interleave_kernel_reading_past_the_input_is_caught():
    """Planted bug: the launch claims one row more than the buffer holds."""
    from blockscale.ops import interleave

    text = _interleave_ir("sm_90a")
    scales = np.zeros((100, 8), np.uint8)
    plan = interleave.launch_plan(101, 8)
    out = np.zeros(interleave.output_shape(101, 8), np.uint8)
    with pytest.raises(IndexError, match=r"load of scales .* 800 elements"):
        run_kernel(text, "block_scales_interleave", plan.grid, interleave.BLOCK,
                   [scales, out, *plan.scalars()], "sm_90a",
                   arg_names=["scales", "out", "rows", "kblocks", "num_chunks", "vec_ok"])


def _bf16_input(shape: tuple[int, int], seed: int) -> np.ndarray:
    import ml_dtypes

    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, (shape[0], 1)))
    return x.astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("target", ["sm_100a", "gfx950"])
@pytest.mark.parametrize("fmt_name", ["nvfp4", "mxfp4", "mxfp8"])
def test_quantize_kernel_with_target_intrinsics(fmt_name, target):
    """The quantize kernels of the targets whose conversions are intrinsics
    (cvt.rn.satfinite.e2m1x2, cvt.rp.ue8m0x2, v_cvt_scalef32_pk_fp4) on 256x1024."""
    from blockscale import Format, ops

    fmt = Format.from_name(fmt_name)
    x = _bf16_input((256, 1024), 1)
    data, scales = ops.quantize_dynamic_block_scaled(x, fmt, device="interp", target=target)
    rdata, rscales = ref.quantize_dynamic_block_scaled(x, fmt)
    np.testing.assert_array_equal(np.asarray(data).view(np.uint8), rdata.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(scales).view(np.uint8), rscales.view(np.uint8))


def test_naive_matmul_kernel_128x128x256():
    from blockscale import NVFP4, ops

    a, b = _bf16_input((128, 256), 2), _bf16_input((128, 256), 3)
    qa, sa = ref.quantize_dynamic_block_scaled(a, NVFP4)
    qb, sb = ref.quantize_dynamic_block_scaled(b, NVFP4)
    out = ops.naive_block_scaled_matmul(qa, qb, sa, sb, NVFP4, k=256, device="interp",
                                        target="gfx942")
    want = ref.naive_block_scaled_matmul(qa, qb, sa, sb, NVFP4, k=256)
    np.testing.assert_array_equal(np.asarray(out).view(np.uint16), want.view(np.uint16))

"""64-bit offsets where a tensor can exceed 2^31 elements (SEMANTICS D12).

* ``layouts.tcgen_offset`` computes in int64: exact for rows / K-blocks near and past 2^31
  (checked against Python's unbounded ints);
* the quantize kernels take their shape scalars as i64 and compute row offsets in i64 (IR);
* the grouped quantize kernel, run by the interpreter, gathers rows of an input of 2^32
  bf16 elements (8 GiB, a sparse memory-mapped file: only the touched pages exist) at offsets
  above 2^31 and 2^32 and quantizes them exactly like the reference; an i32 offset would
  wrap and fail the interpreter's bounds check or read the wrong row;
* kernels specialised to 32-bit indexing (interleave, matmuls) refuse larger shapes on the
  host with ValueError instead of wrapping.
"""

from __future__ import annotations

import os
import re

import ml_dtypes
import numpy as np
import pytest

from blockscale import layouts
from blockscale import reference as ref

BF16 = ml_dtypes.bfloat16
_SHIFTS = (0, 1, 2, 7, 31, 32, 33, 40)


def _tcgen_offset_py(r: int, j: int, kblocks: int) -> int:
    d1 = -(-kblocks // 4)
    return ((((r // 128) * d1 + j // 4) * 32 + r % 32) * 4 + (r % 128) // 32) * 4 + j % 4


@pytest.mark.parametrize("r,j,kblocks", [
    (2**31 - 1, 0, 4), (2**31, 3, 4), (2**31 + 129, 5, 8), (2**33 + 77, 1023, 1024),
    (5, 2**31 - 1, 2**31), (3, 2**31 + 6, 2**32), (2**31 - 1, 2**31 - 1, 2**31),
])
def test_tcgen_offset_int64_exact(r, j, kblocks):
    want = _tcgen_offset_py(r, j, kblocks)
    assert want >= 2**31  # the cases exercise offsets past int32
    assert layouts.tcgen_offset(r, j, kblocks) == want
    arr = layouts.tcgen_offset(np.array([r, r], np.int32 if r < 2**31 else np.int64),
                               np.array([j, 0], np.int64), kblocks)
    assert arr.dtype == np.int64 and int(arr[0]) == want
    assert int(arr[1]) == _tcgen_offset_py(r, 0, kblocks)


def test_tcgen_offset_int32_inputs_widened():
    """int32 row / K-block arrays are widened before the multiply (no int32 wraparound)."""
    r = np.array([2**31 - 1, 2**31 - 128], np.int32)
    j = np.array([2**31 - 1, 7], np.int32)
    got = layouts.tcgen_offset(r, j, 2**31)
    want = [_tcgen_offset_py(int(a), int(b), 2**31) for a, b in zip(r, j)]
    assert got.tolist() == want and max(want) > 2**61


def test_layout_shapes_past_int32():
    assert layouts.scale_shape("tcgen5d", 2**31 + 1, 3) == (2**24 + 1, 1, 32, 4, 4)
    assert layouts.scale_shape("row_major", 2**33, 2) == (2**33, 2)


# ---- kernels --------------------------------------------------------------------------------


def _quantize_ir() -> str:
    pytest.importorskip("mlir")
    from blockscale.ops.quantize import QuantizeSpec, build

    return str(build(QuantizeSpec("nvfp4", "sm_90a", None, "tcgen5d", True, "grouped",
                                  gather=True, name="grouped_quantize_dynamic_scaled")))


@pytest.mark.ir
def test_quantize_kernel_shape_scalars_and_offsets_are_i64():
    from blockscale.ops.quantize import QuantizeSpec, kernel_args

    spec = QuantizeSpec("mxfp8", "sm_90a", "up", "tcgen5d", True, "grouped", gather=True,
                        name="grouped_quantize_dynamic_scaled")
    dt = {a.name: a.dtype for a in kernel_args(spec)}
    assert dt["m"] == dt["k"] == dt["kblocks_row"] == dt["n_tiles"] == "i64"
    text = _quantize_ir()
    # every multiply in the kernel that forms an offset is 64-bit: no i32 muli at all
    muls = re.findall(r"arith\.muli [^\n]*: (\S+)", text)
    assert muls and set(muls) <= {"i64", "index"} | {t for t in muls if "x" in t}, set(muls)
    assert "memref<?xbf16>" in text  # the input is a flat buffer indexed by i64 offsets


class _NoCopyInterp:
    """The interpreter device, but uploading a numpy array is a no-copy view (so an 8 GiB
    sparse memory map is not materialised)."""

    def __new__(cls):
        from blockscale.runtime.interp_device import InterpDevice

        class NoCopy(InterpDevice):
            def to_device(self, host, stream=None):
                return host if host.flags.c_contiguous else super().to_device(host, stream)

        return NoCopy()


def _sparse_bf16(path: str, n: int) -> np.ndarray:
    with open(path, "wb") as f:
        f.truncate(n * 2)  # sparse: no blocks allocated until written
    return np.memmap(path, dtype=BF16, mode="r+", shape=(n,))


@pytest.mark.interp
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_grouped_gather_reads_rows_past_2_31_elements(fmt, tmp_path):
    pytest.importorskip("mlir")
    from blockscale.ops import quantize_grouped as QG

    k = 1024
    t_in = 2**22 + 8  # 2^32 + 8192 elements
    try:
        flat = _sparse_bf16(str(tmp_path / "x.bin"), t_in * k)
    except (OSError, ValueError) as e:  # pragma: no cover - exotic filesystems
        pytest.skip(f"no sparse memory map here: {e}")
    x = flat.reshape(t_in, k)
    rows = [t_in - 1, 2**21 + 3, 0, 2**22 - 1, 2**21]  # offsets up to ~2^32 elements
    rng = np.random.default_rng(7)
    vals = (rng.standard_normal((len(rows), k)) * 4).astype(BF16)
    vals[1, 5] = np.nan
    for i, r in enumerate(rows):
        x[r] = vals[i]
    assert max(rows) * k > 2**32 and sorted(rows)[2] * k > 2**31
    idx = np.array(rows, np.int32)
    es = np.array([0, 2, 5], np.int32)
    offs = np.array([0, 1], np.int32)
    ids = np.array([1, 0], np.int32)
    tsf = np.array([0.5, 2.0], np.float32) if fmt == "nvfp4" else None
    d, s = QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, indices=idx,
                                              device=_NoCopyInterp(), target="sm_90a")
    rd, rs = ref.grouped_quantize_dynamic_scaled(vals, fmt, es, offs, ids, tsf,
                                                 indices=np.arange(len(rows)))
    assert np.array_equal(np.asarray(d).view(np.uint8), rd.view(np.uint8))
    assert np.array_equal(np.asarray(s).view(np.uint8), rs.view(np.uint8))
    del x, flat
    os.unlink(tmp_path / "x.bin")


# ---- 32-bit kernels refuse larger shapes on the host -------------------------------------------


def test_interleave_launch_plan_refuses_more_than_int32():
    from blockscale.ops.interleave import launch_plan

    launch_plan(2**20, 2**10)  # 2^30 scales: fine
    with pytest.raises(ValueError, match=r"scales_2d of shape \(2097152, 1024\) is too large"):
        launch_plan(2**21, 2**10)


def test_matmul_host_refuses_dims_past_int32():
    """The dense matmul kernel takes i32 m / n / k: a K of 2^31 is refused, not wrapped.
    (Arrays are never allocated: shape-only stand-ins.)"""
    from blockscale.ops import matmul as MM

    class Shaped:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, np.dtype(dtype)

    k = 2**31
    a, b = Shaped((4, k // 2), np.uint8), Shaped((3, k // 2), np.uint8)
    sf = Shaped((1, k // 64, 32, 4, 4), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"k must be < 2\^31.*k=2147483648"):
        MM.naive_block_scaled_matmul(a, b, sf, sf, "nvfp4", device="interp")

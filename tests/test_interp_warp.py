"""Interpreter: warp-level ops (shuffles, subgroup reduce, lane ids) for warp 32 and 64."""

from __future__ import annotations

import numpy as np
import pytest
from _interp_helpers import gpu_module

pytest.importorskip("mlir")

from blockscale.runtime.interpreter import ShuffleError, run_kernel

pytestmark = pytest.mark.interp


SHUFFLE = gpu_module("%x: memref<?xi32>, %y: memref<?xi32>, %ok: memref<?xi8>, %off: i32, "
                  "%w: i32", """
    %v = memref.load %x[%i] : memref<?xi32>
    %r, %valid = gpu.shuffle __MODE__ %v, %off, %w : i32
    memref.store %r, %y[%i] : memref<?xi32>
    %vb = arith.extui %valid : i1 to i8
    memref.store %vb, %ok[%i] : memref<?xi8>""")


def _shuffle_ref(x: np.ndarray, mode: str, off: int, width: int, ws: int, nthreads: int):
    lane = np.arange(x.size) % nthreads % ws
    seg = lane - lane % width
    src = {"xor": lane ^ off, "down": lane + off, "up": lane - off, "idx": seg + off}[mode]
    valid = (src >= seg) & (src < seg + width)
    gsrc = np.arange(x.size) - lane + src
    return np.where(valid, x[np.where(valid, gsrc, 0)], x), valid


@pytest.mark.parametrize("target,ws", [("sm_90a", 32), ("gfx950", 64)])
@pytest.mark.parametrize("mode,off,width", [("xor", 1, None), ("xor", 16, None),
                                            ("down", 3, None), ("up", 5, None),
                                            ("idx", 7, None), ("down", 2, 8), ("xor", 4, 16)])
def test_gpu_shuffle_modes(target, ws, mode, off, width):
    width = width or ws
    nthreads, nblocks = 128, 3
    x = np.random.default_rng(11).integers(-1000, 1000, nthreads * nblocks).astype(np.int32)
    y = np.zeros_like(x)
    ok = np.zeros(x.size, np.int8)
    run_kernel(SHUFFLE.replace("__MODE__", mode), "k", (nblocks, 1, 1), (nthreads, 1, 1),
               [x, y, ok, off, width], target)
    want, valid = _shuffle_ref(x, mode, off, width, ws, nthreads)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(ok, valid.astype(np.int8))


def test_shuffle_from_inactive_lane_is_an_error():
    text = gpu_module("%x: memref<?xi32>, %y: memref<?xi32>", """
    %c8 = arith.constant 8 : index
    %lo = arith.cmpi ult, %tid, %c8 : index
    scf.if %lo {
      %v = memref.load %x[%i] : memref<?xi32>
      %one = arith.constant 1 : i32
      %w = arith.constant 32 : i32
      %r, %ok = gpu.shuffle down %v, %one, %w : i32
      memref.store %r, %y[%i] : memref<?xi32>
    }""")
    x = np.arange(32, dtype=np.int32)
    with pytest.raises(ShuffleError, match=r"thread \(7, 0, 0\) of block \(0, 0, 0\) reads "
                                           r"inactive lane 8"):
        run_kernel(text, "k", (1, 1, 1), (32, 1, 1), [x, np.zeros_like(x)], "sm_90a")


_REDUCE = gpu_module("%x: memref<?xT>, %y: memref<?xT>", """
    %v = memref.load %x[%i] : memref<?xT>
    %r = gpu.subgroup_reduce OP %v CLUSTER : (T) -> T
    memref.store %r, %y[%i] : memref<?xT>""")


def _reduce(t: str, op: str, cluster: str) -> str:
    return _REDUCE.replace("?xT", f"?x{t}").replace("(T) -> T", f"({t}) -> {t}") \
        .replace("OP", op).replace("CLUSTER", cluster)


@pytest.mark.parametrize("target,ws", [("sm_90a", 32), ("gfx942", 64)])
def test_subgroup_reduce_int_and_float(target, ws):
    rng = np.random.default_rng(2)
    x = rng.integers(-50, 50, 256).astype(np.int32)
    y = np.zeros_like(x)
    run_kernel(_reduce(t="i32", op="add", cluster=""), "k", (2, 1, 1), (128, 1, 1),
               [x, y], target)
    np.testing.assert_array_equal(y, np.repeat(x.reshape(-1, ws).sum(1), ws))
    run_kernel(_reduce(t="i32", op="maxsi", cluster="cluster(size = 4)"), "k",
               (2, 1, 1), (128, 1, 1), [x, y], target)
    np.testing.assert_array_equal(y, np.repeat(x.reshape(-1, 4).max(1), 4))
    xf = rng.standard_normal(256).astype(np.float32)
    xf[5] = np.nan
    yf = np.zeros_like(xf)
    run_kernel(_reduce(t="f32", op="maxnumf", cluster=""), "k", (2, 1, 1), (128, 1, 1),
               [xf, yf], target)
    np.testing.assert_array_equal(yf, np.repeat(np.fmax.reduce(xf.reshape(-1, ws), 1), ws))
    run_kernel(_reduce(t="f32", op="add", cluster=""), "k", (2, 1, 1), (128, 1, 1),
               [xf, yf], target)
    # butterfly order: xor 1, 2, 4, ...: pairs, then pairs of pairs
    b = xf.reshape(-1, ws).copy()
    while b.shape[1] > 1:
        b = b[:, 0::2] + b[:, 1::2]
    np.testing.assert_array_equal(yf, np.repeat(b[:, 0], ws))


def test_lane_and_subgroup_ids_and_nvvm_shfl():
    text = gpu_module("%y: memref<?xi32>, %z: memref<?xi32>", """
    %lane = gpu.lane_id
    %sg = gpu.subgroup_id : index
    %c100 = arith.constant 100 : index
    %m = arith.muli %sg, %c100 : index
    %s = arith.addi %m, %lane : index
    %v = arith.index_cast %s : index to i32
    memref.store %v, %y[%i] : memref<?xi32>
    %full = arith.constant -1 : i32
    %c1 = arith.constant 1 : i32
    %clamp = arith.constant 31 : i32
    %r = nvvm.shfl.sync bfly %full, %v, %c1, %clamp : i32 -> i32
    %c3 = arith.constant 3 : i32
    %d = nvvm.shfl.sync down %full, %r, %c3, %clamp : i32 -> i32
    memref.store %d, %z[%i] : memref<?xi32>""")
    y = np.zeros(96, np.int32)
    z = np.zeros(96, np.int32)
    run_kernel(text, "k", (1, 1, 1), (96, 1, 1), [y, z], "sm_90a")
    t = np.arange(96)
    np.testing.assert_array_equal(y, (t // 32) * 100 + t % 32)
    lane = t % 32
    r = y[t ^ 1]
    src = np.where(lane + 3 <= 31, t + 3, t)
    np.testing.assert_array_equal(z, r[src])


def test_rocdl_ds_bpermute():
    text = gpu_module("%x: memref<?xi32>, %y: memref<?xi32>", """
    %v = memref.load %x[%i] : memref<?xi32>
    %t32 = arith.index_cast %tid : index to i32
    %c63 = arith.constant 63 : i32
    %src = arith.subi %c63, %t32 : i32
    %c2 = arith.constant 2 : i32
    %addr = arith.shli %src, %c2 : i32
    %r = rocdl.ds_bpermute %addr, %v : (i32, i32) -> i32
    memref.store %r, %y[%i] : memref<?xi32>""")
    x = np.arange(64, dtype=np.int32) * 3
    y = np.zeros_like(x)
    run_kernel(text, "k", (1, 1, 1), (64, 1, 1), [x, y], "gfx950")
    np.testing.assert_array_equal(y, x[::-1])


def test_subgroup_reduce_over_a_partial_warp_is_an_error():
    x = np.arange(48, dtype=np.int32)
    with pytest.raises(ShuffleError, match="does not exist"):
        run_kernel(_reduce("i32", "add", ""), "k", (1, 1, 1), (48, 1, 1),
                   [x, np.zeros_like(x)], "sm_90a")

"""Interpreter: memory (global, shared, private), bounds checks, barriers and race detection.

Several kernels here carry a planted bug the interpreter must catch.
"""

from __future__ import annotations

import numpy as np
import pytest
from _interp_helpers import GLOBAL_ID, gpu_module

pytest.importorskip("mlir")

from blockscale.runtime.interpreter import (
    BarrierDivergenceError,
    SharedMemoryRaceError,
    UninitializedSharedReadError,
    run_kernel,
)

pytestmark = pytest.mark.interp

SHIFT = gpu_module("%x: memref<?xf32>, %y: memref<?xf32>, %n: index", """
    %c1 = arith.constant 1 : index
    %ok = arith.cmpi slt, %i, %n : index
    scf.if %ok {
      %j = arith.addi %i, %c1 : index
      %v = memref.load %x[%j] : memref<?xf32>
      memref.store %v, %y[%i] : memref<?xf32>
    }""")


def test_off_by_one_read_names_buffer_index_thread_and_block():
    x = np.arange(100, dtype=np.float32)
    y = np.zeros(100, np.float32)
    with pytest.raises(IndexError) as e:  # thread i reads x[i + 1]: i = 99 is out of bounds
        run_kernel(SHIFT, "k", (4, 1, 1), (32, 1, 1), [x, y, 100], "sm_90a",
                   arg_names=["x", "y", "n"])
    msg = str(e.value)
    assert "load of x" in msg and "100 elements" in msg and "(100,)" in msg
    assert "thread (3, 0, 0) of block (3, 0, 0)" in msg
    # the correct bound (n - 1) passes and shifts
    run_kernel(SHIFT, "k", (4, 1, 1), (32, 1, 1), [x, y, 99], "sm_90a")
    np.testing.assert_array_equal(y[:99], x[1:])


def test_out_of_bounds_store_is_caught():
    text = gpu_module("%y: memref<?xi32>", """
    %v = arith.index_cast %i : index to i32
    memref.store %v, %y[%i] : memref<?xi32>""")
    y = np.zeros(60, np.int32)
    with pytest.raises(IndexError, match=r"store of arg0 .* index \(60,\).*thread \(28, 0, 0\) "
                                         r"of block \(1, 0, 0\)"):
        run_kernel(text, "k", (2, 1, 1), (32, 1, 1), [y], "sm_90a")


def test_vector_load_tail_out_of_bounds():
    text = gpu_module("%x: memref<?xi8>, %y: memref<?xi8>", """
    %c4 = arith.constant 4 : index
    %j = arith.muli %i, %c4 : index
    %v = vector.load %x[%j] : memref<?xi8>, vector<4xi8>
    vector.store %v, %y[%j] : memref<?xi8>, vector<4xi8>""")
    x = np.arange(64, dtype=np.uint8)
    y = np.zeros(64, np.uint8)
    run_kernel(text, "k", (1, 1, 1), (16, 1, 1), [x, y], "gfx942")
    np.testing.assert_array_equal(x, y)
    with pytest.raises(IndexError, match=r"load of arg0 .*\[60, 61, 62, 63\]"):
        run_kernel(text, "k", (1, 1, 1), (16, 1, 1), [x[:62].copy(), y], "gfx942")


REVERSE = """
gpu.module @m {{
  gpu.func @k(%x: memref<?xf32>, %y: memref<?xf32>) workgroup(%sh: memref<64xf32, 3>) kernel {{
{gid}
    %c63 = arith.constant 63 : index
    %v = memref.load %x[%i] : memref<?xf32>
    memref.store %v, %sh[%tid] : memref<64xf32, 3>
    {barrier}
    %r = arith.subi %c63, %tid : index
    %w = memref.load %sh[%r] : memref<64xf32, 3>
    memref.store %w, %y[%i] : memref<?xf32>
    gpu.return
  }}
}}"""


def test_shared_memory_reverse_with_barrier_over_many_blocks():
    x = np.arange(64 * 20, dtype=np.float32)
    y = np.zeros_like(x)
    run_kernel(REVERSE.format(gid=GLOBAL_ID, barrier="gpu.barrier"), "k", (20, 1, 1), (64, 1, 1),
               [x, y], "sm_90a")
    np.testing.assert_array_equal(y, x.reshape(20, 64)[:, ::-1].reshape(-1))


def test_missing_barrier_is_a_shared_memory_race():
    x = np.arange(64 * 3, dtype=np.float32)
    y = np.zeros_like(x)
    with pytest.raises(SharedMemoryRaceError, match=r"written by thread \(63, 0, 0\) and read "
                                                    r"by thread \(0, 0, 0\)"):
        run_kernel(REVERSE.format(gid=GLOBAL_ID, barrier=""), "k", (3, 1, 1), (64, 1, 1), [x, y],
                   "sm_90a")
    # with race tracking off the racy kernel runs (lock-step hides the race)
    run_kernel(REVERSE.format(gid=GLOBAL_ID, barrier=""), "k", (3, 1, 1), (64, 1, 1), [x, y],
               "sm_90a", check_races=False)


def test_write_write_race_between_threads():
    text = """
gpu.module @m {
  gpu.func @k(%y: memref<?xi32>) workgroup(%sh: memref<4xi32, 3>) kernel {
    %tid = gpu.thread_id x
    %c3 = arith.constant 3 : index
    %slot = arith.andi %tid, %c3 : index
    %v = arith.index_cast %tid : index to i32
    memref.store %v, %sh[%slot] : memref<4xi32, 3>
    gpu.return
  }
}"""
    with pytest.raises(SharedMemoryRaceError, match="written by thread"):
        run_kernel(text, "k", (1, 1, 1), (8, 1, 1), [np.zeros(1, np.int32)], "sm_90a")


def test_barrier_under_divergence_is_caught():
    text = gpu_module("%y: memref<?xi32>", """
    %c16 = arith.constant 16 : index
    %lo = arith.cmpi ult, %tid, %c16 : index
    scf.if %lo {
      gpu.barrier
    }""")
    with pytest.raises(BarrierDivergenceError, match=r"16 of 64 threads of block \(0, 0, 0\)"):
        run_kernel(text, "k", (2, 1, 1), (64, 1, 1), [np.zeros(1, np.int32)], "sm_90a")


def test_barrier_skipped_by_whole_blocks_is_fine():
    text = gpu_module("%y: memref<?xi32>", """
    %c1 = arith.constant 1 : index
    %first = arith.cmpi ult, %bid, %c1 : index
    scf.if %first {
      gpu.barrier
      %v = arith.index_cast %tid : index to i32
      memref.store %v, %y[%tid] : memref<?xi32>
    }""")
    y = np.zeros(32, np.int32)
    run_kernel(text, "k", (3, 1, 1), (32, 1, 1), [y], "sm_90a")
    np.testing.assert_array_equal(y, np.arange(32))


TREE_SUM = """
gpu.module @m {
  gpu.func @k(%x: memref<?xf32>, %y: memref<?xf32>) kernel {
    %tid = gpu.thread_id x
    %bid = gpu.block_id x
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c7 = arith.constant 7 : index
    %c128 = arith.constant 128 : index
    %sh = memref.alloc() : memref<128xf32, #gpu.address_space<workgroup>>
    %base = arith.muli %bid, %c128 : index
    %i = arith.addi %base, %tid : index
    %v = memref.load %x[%i] : memref<?xf32>
    memref.store %v, %sh[%tid] : memref<128xf32, #gpu.address_space<workgroup>>
    gpu.barrier
    scf.for %k = %c0 to %c7 step %c1 {
      %s0 = arith.shrui %c128, %k : index
      %s = arith.shrui %s0, %c1 : index
      %act = arith.cmpi ult, %tid, %s : index
      scf.if %act {
        %j = arith.addi %tid, %s : index
        %a = memref.load %sh[%tid] : memref<128xf32, #gpu.address_space<workgroup>>
        %b = memref.load %sh[%j] : memref<128xf32, #gpu.address_space<workgroup>>
        %r = arith.addf %a, %b : f32
        memref.store %r, %sh[%tid] : memref<128xf32, #gpu.address_space<workgroup>>
      }
      gpu.barrier
    }
    %is0 = arith.cmpi eq, %tid, %c0 : index
    scf.if %is0 {
      %t = memref.load %sh[%c0] : memref<128xf32, #gpu.address_space<workgroup>>
      memref.store %t, %y[%bid] : memref<?xf32>
    }
    gpu.return
  }
}"""


def test_shared_tree_reduction_in_a_loop():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(128 * 9).astype(np.float32)
    y = np.zeros(9, np.float32)
    run_kernel(TREE_SUM, "k", (9, 1, 1), (128, 1, 1), [x, y], "sm_90a")
    # same pairwise order as the kernel
    want = x.reshape(9, 128).copy()
    s = 64
    while s >= 1:
        want[:, :s] = want[:, :s] + want[:, s:2 * s]
        s //= 2
    np.testing.assert_array_equal(y, want[:, 0])
    # drop the barrier inside the loop: a race
    bad = TREE_SUM.replace("      }\n      gpu.barrier\n    }", "      }\n    }")
    assert bad != TREE_SUM
    with pytest.raises(SharedMemoryRaceError):
        run_kernel(bad, "k", (9, 1, 1), (128, 1, 1), [x, y], "sm_90a")


def test_read_of_never_written_shared_memory():
    text = """
gpu.module @m {
  gpu.func @k(%y: memref<?xf32>) workgroup(%sh: memref<64xf32, 3>) kernel {
    %tid = gpu.thread_id x
    %c32 = arith.constant 32 : index
    %lo = arith.cmpi ult, %tid, %c32 : index
    scf.if %lo {
      %one = arith.constant 1.0 : f32
      memref.store %one, %sh[%tid] : memref<64xf32, 3>
    }
    gpu.barrier
    %v = memref.load %sh[%tid] : memref<64xf32, 3>
    memref.store %v, %y[%tid] : memref<?xf32>
    gpu.return
  }
}"""
    y = np.full(64, 7, np.float32)
    with pytest.raises(UninitializedSharedReadError, match=r"\[32\] by thread \(32, 0, 0\)"):
        run_kernel(text, "k", (1, 1, 1), (64, 1, 1), [y], "sm_90a")
    run_kernel(text, "k", (1, 1, 1), (64, 1, 1), [y], "sm_90a", check_uninit=False)
    np.testing.assert_array_equal(y[:32], 1)


def test_multi_dim_shared_memref_checks_each_dimension():
    text = """
gpu.module @m {
  gpu.func @k(%y: memref<?xf32>, %col: index) workgroup(%sh: memref<4x8xf32, 3>) kernel {
    %tid = gpu.thread_id x
    %one = arith.constant 1.0 : f32
    memref.store %one, %sh[%tid, %col] : memref<4x8xf32, 3>
    gpu.return
  }
}"""
    run_kernel(text, "k", (1, 1, 1), (4, 1, 1), [np.zeros(1, np.float32), 7], "sm_90a")
    with pytest.raises(IndexError, match=r"index \(0, 8\)"):  # linear 8 is in the buffer
        run_kernel(text, "k", (1, 1, 1), (4, 1, 1), [np.zeros(1, np.float32), 8], "sm_90a")


def test_private_alloca_and_constant_global_table():
    text = """
gpu.module @m {
  memref.global "private" constant @lut : memref<4xf32> = dense<[0.5, 1.5, 2.5, 3.5]>
  gpu.func @k(%y: memref<?xf32>) kernel {
    %tid = gpu.thread_id x
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c3 = arith.constant 3 : index
    %c4 = arith.constant 4 : index
    %g = memref.get_global @lut : memref<4xf32>
    %p = memref.alloca() : memref<4xf32>
    scf.for %k = %c0 to %c4 step %c1 {
      %kk = arith.addi %k, %tid : index
      %m = arith.andi %kk, %c3 : index
      %v = memref.load %g[%m] : memref<4xf32>
      memref.store %v, %p[%k] : memref<4xf32>
    }
    %s = scf.for %k = %c0 to %c4 step %c1 iter_args(%acc = %tid) -> (index) {
      %v = memref.load %p[%k] : memref<4xf32>
      %w = arith.fptosi %v : f32 to i32
      %wi = arith.index_cast %w : i32 to index
      %scaled = arith.muli %acc, %c4 : index
      %n = arith.addi %scaled, %wi : index
      scf.yield %n : index
    }
    %sv = arith.index_cast %s : index to i32
    %f = arith.sitofp %sv : i32 to f32
    memref.store %f, %y[%tid] : memref<?xf32>
    gpu.return
  }
}"""
    y = np.zeros(8, np.float32)
    run_kernel(text, "k", (1, 1, 1), (8, 1, 1), [y], "sm_90a")
    lut = [0, 1, 2, 3]  # truncated values of the table
    want = []
    for t in range(8):
        acc = t
        for k in range(4):
            acc = acc * 4 + lut[(k + t) & 3]
        want.append(acc)
    np.testing.assert_array_equal(y, np.array(want, np.float32))


def test_atomic_add_histogram_returns_distinct_old_values():
    text = gpu_module("%x: memref<?xi32>, %h: memref<?xi32>, %old: memref<?xi32>", """
    %b = memref.load %x[%i] : memref<?xi32>
    %bi = arith.index_cast %b : i32 to index
    %one = arith.constant 1 : i32
    %o = memref.atomic_rmw addi %one, %h[%bi] : (i32, memref<?xi32>) -> i32
    memref.store %o, %old[%i] : memref<?xi32>""")
    x = np.random.default_rng(9).integers(0, 5, 256).astype(np.int32)
    h = np.zeros(5, np.int32)
    old = np.full(256, -1, np.int32)
    run_kernel(text, "k", (2, 1, 1), (128, 1, 1), [x, h, old], "gfx950")
    np.testing.assert_array_equal(h, np.bincount(x, minlength=5))
    for v in range(5):  # each thread of a bucket saw a different count
        np.testing.assert_array_equal(np.sort(old[x == v]), np.arange((x == v).sum()))


def test_dynamic_shared_memory_view():
    text = """
gpu.module @m {
  gpu.func @k(%x: memref<?xf32>, %y: memref<?xf32>) kernel {
    %tid = gpu.thread_id x
    %c16 = arith.constant 16 : index
    %c31 = arith.constant 31 : index
    %dyn = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
    %sh = memref.view %dyn[%c16][] : memref<?xi8, #gpu.address_space<workgroup>>
        to memref<32xf32, #gpu.address_space<workgroup>>
    %v = memref.load %x[%tid] : memref<?xf32>
    memref.store %v, %sh[%tid] : memref<32xf32, #gpu.address_space<workgroup>>
    gpu.barrier
    %r = arith.subi %c31, %tid : index
    %w = memref.load %sh[%r] : memref<32xf32, #gpu.address_space<workgroup>>
    memref.store %w, %y[%tid] : memref<?xf32>
    gpu.return
  }
}"""
    x = np.arange(32, dtype=np.float32)
    y = np.zeros_like(x)
    run_kernel(text, "k", (1, 1, 1), (32, 1, 1), [x, y], "sm_90a", dynamic_shared_bytes=144)
    np.testing.assert_array_equal(y, x[::-1])
    with pytest.raises(IndexError, match="dynamic shared memory"):  # 16 + 128 > 140 bytes
        run_kernel(text, "k", (1, 1, 1), (32, 1, 1), [x, y], "sm_90a",
                   dynamic_shared_bytes=140)
    with pytest.raises(SharedMemoryRaceError):
        run_kernel(text.replace("gpu.barrier", ""), "k", (1, 1, 1), (32, 1, 1), [x, y],
                   "sm_90a", dynamic_shared_bytes=144)

"""Interpreter: scf control flow under execution masks, vector ops, thread/block ids."""

from __future__ import annotations

import numpy as np
import pytest
from _interp_helpers import gpu_module

pytest.importorskip("mlir")

from blockscale.runtime.interpreter import run_kernel

pytestmark = pytest.mark.interp


def test_divergent_if_with_results_and_nested_if():
    text = gpu_module("%y: memref<?xi32>", """
    %c2 = arith.constant 2 : index
    %c3 = arith.constant 3 : index
    %c0 = arith.constant 0 : index
    %r2 = arith.remui %i, %c2 : index
    %even = arith.cmpi eq, %r2, %c0 : index
    %v = scf.if %even -> (index) {
      %r3 = arith.remui %i, %c3 : index
      %m3 = arith.cmpi eq, %r3, %c0 : index
      %w = scf.if %m3 -> (index) {
        %x = arith.muli %i, %c3 : index
        scf.yield %x : index
      } else {
        scf.yield %i : index
      }
      scf.yield %w : index
    } else {
      %neg = arith.subi %c0, %i : index
      scf.yield %neg : index
    }
    %vi = arith.index_cast %v : index to i32
    memref.store %vi, %y[%i] : memref<?xi32>""")
    y = np.zeros(96, np.int32)
    run_kernel(text, "k", (3, 1, 1), (32, 1, 1), [y], "sm_90a")
    i = np.arange(96)
    want = np.where(i % 2 == 0, np.where(i % 3 == 0, 3 * i, i), -i)
    np.testing.assert_array_equal(y, want)


def test_for_with_per_thread_bounds_runs_under_a_mask():
    """Thread t sums 0..t-1 (trip count t): the loop runs to the max with finished threads
    masked; their stores must not happen after they finish."""
    text = gpu_module("%y: memref<?xi32>, %hits: memref<?xi32>", """
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %z = arith.constant 0 : i32
    %s = scf.for %k = %c0 to %tid step %c1 iter_args(%acc = %z) -> (i32) {
      %ki = arith.index_cast %k : index to i32
      %n = arith.addi %acc, %ki : i32
      memref.store %ki, %hits[%i] : memref<?xi32>
      scf.yield %n : i32
    }
    memref.store %s, %y[%i] : memref<?xi32>""")
    y = np.zeros(64, np.int32)
    hits = np.full(64, -1, np.int32)
    run_kernel(text, "k", (2, 1, 1), (32, 1, 1), [y, hits], "sm_90a")
    t = np.arange(64) % 32
    np.testing.assert_array_equal(y, t * (t - 1) // 2)
    np.testing.assert_array_equal(hits, t - 1)  # last iteration each thread ran: t - 1


def test_while_with_per_thread_trip_counts():
    """Collatz steps: per-thread trip counts, results are the values passed to
    scf.condition at each thread's exit."""
    text = gpu_module("%y: memref<?xi32>", """
    %one = arith.constant 1 : i32
    %two = arith.constant 2 : i32
    %three = arith.constant 3 : i32
    %z = arith.constant 0 : i32
    %t32 = arith.index_cast %i : index to i32
    %start = arith.addi %t32, %one : i32
    %res:2 = scf.while (%n = %start, %steps = %z) : (i32, i32) -> (i32, i32) {
      %go = arith.cmpi ne, %n, %one : i32
      scf.condition(%go) %n, %steps : i32, i32
    } do {
    ^bb0(%n: i32, %steps: i32):
      %r = arith.remui %n, %two : i32
      %odd = arith.cmpi ne, %r, %z : i32
      %next = scf.if %odd -> (i32) {
        %m = arith.muli %n, %three : i32
        %p = arith.addi %m, %one : i32
        scf.yield %p : i32
      } else {
        %h = arith.divui %n, %two : i32
        scf.yield %h : i32
      }
      %s1 = arith.addi %steps, %one : i32
      scf.yield %next, %s1 : i32, i32
    }
    memref.store %res#1, %y[%i] : memref<?xi32>""")
    y = np.zeros(64, np.int32)
    run_kernel(text, "k", (1, 1, 1), (64, 1, 1), [y], "gfx950")

    def steps(n: int) -> int:
        s = 0
        while n != 1:
            n = 3 * n + 1 if n % 2 else n // 2
            s += 1
        return s
    np.testing.assert_array_equal(y, [steps(n) for n in range(1, 65)])


def test_3d_ids_and_grid_dims():
    text = """
gpu.module @m {
  gpu.func @k(%y: memref<?xi32>) kernel {
    %tx = gpu.thread_id x
    %ty = gpu.thread_id y
    %tz = gpu.thread_id z
    %bx = gpu.block_id x
    %by = gpu.block_id y
    %bz = gpu.block_id z
    %gx = gpu.grid_dim x
    %gy = gpu.grid_dim y
    %dx = gpu.block_dim x
    %dy = gpu.block_dim y
    %dz = gpu.block_dim z
    %b0 = arith.muli %bz, %gy : index
    %b1 = arith.addi %b0, %by : index
    %b2 = arith.muli %b1, %gx : index
    %blin = arith.addi %b2, %bx : index
    %t0 = arith.muli %tz, %dy : index
    %t1 = arith.addi %t0, %ty : index
    %t2 = arith.muli %t1, %dx : index
    %tlin = arith.addi %t2, %tx : index
    %nt0 = arith.muli %dx, %dy : index
    %nt = arith.muli %nt0, %dz : index
    %g0 = arith.muli %blin, %nt : index
    %g = arith.addi %g0, %tlin : index
    %gid = gpu.global_id y
    %v = arith.index_cast %gid : index to i32
    memref.store %v, %y[%g] : memref<?xi32>
    gpu.return
  }
}"""
    grid, block = (2, 3, 2), (4, 2, 3)
    y = np.full(12 * 24, -1, np.int32)
    run_kernel(text, "k", grid, block, [y], "sm_100a", batch_threads=48)
    want = np.zeros((2, 3, 2, 3, 2, 4), np.int32)  # bz, by, bx, tz, ty, tx
    for by in range(3):
        for ty in range(2):
            want[:, by, :, :, ty, :] = by * 2 + ty
    np.testing.assert_array_equal(y, want.reshape(-1))


def test_vector_ops():
    text = gpu_module("%x: memref<?xi8>, %y: memref<?xi32>, %f: memref<?xf32>", """
    %c4 = arith.constant 4 : index
    %j = arith.muli %i, %c4 : index
    %b = vector.load %x[%j] : memref<?xi8>, vector<4xi8>
    %w = vector.bitcast %b : vector<4xi8> to vector<1xi32>
    %s = vector.extract %w[0] : i32 from vector<1xi32>
    %c7 = arith.constant 7 : i32
    %v = vector.broadcast %c7 : i32 to vector<4xi32>
    %v2 = vector.insert %s, %v[2] : i32 into vector<4xi32>
    %e = vector.extract %b[3] : i8 from vector<4xi8>
    %e32 = arith.extui %e : i8 to i32
    %v3 = vector.insert %e32, %v2[0] : i32 into vector<4xi32>
    vector.store %v3, %y[%j] : memref<?xi32>, vector<4xi32>
    %fv = arith.sitofp %v3 : vector<4xi32> to vector<4xf32>
    %half = arith.constant dense<[0.5, 0.25, 1.0, 2.0]> : vector<4xf32>
    %acc = arith.constant 0.0 : f32
    %m = arith.mulf %fv, %half : vector<4xf32>
    %sum = vector.reduction <add>, %m, %acc : vector<4xf32> into f32
    %fe = vector.from_elements %sum, %sum : vector<2xf32>
    %c2 = arith.constant 2 : index
    %j2 = arith.muli %i, %c2 : index
    vector.store %fe, %f[%j2] : memref<?xf32>, vector<2xf32>""")
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, 32 * 4, dtype=np.uint8)
    y = np.zeros(32 * 4, np.int32)
    f = np.zeros(64, np.float32)
    run_kernel(text, "k", (1, 1, 1), (32, 1, 1), [x, y, f], "sm_90a")
    words = x.view(np.int32)
    want = np.stack([x[3::4].astype(np.int32), np.full(32, 7), words, np.full(32, 7)], 1)
    np.testing.assert_array_equal(y.reshape(32, 4), want)
    fw = want.astype(np.float32) * np.array([0.5, 0.25, 1.0, 2.0], np.float32)
    s = np.float32(0)
    for k in range(4):  # ordered reduction
        s = s + fw[:, k]
    np.testing.assert_array_equal(f.reshape(32, 2), np.stack([s, s], 1))


def test_block_size_must_match_known_block_size():
    text = """
gpu.module @m {
  gpu.func @k(%y: memref<?xi32>) kernel attributes {known_block_size = array<i32: 64, 1, 1>} {
    gpu.return
  }
}"""
    run_kernel(text, "k", (1, 1, 1), (64, 1, 1), [np.zeros(1, np.int32)], "sm_90a")
    with pytest.raises(ValueError, match="known_block_size"):
        run_kernel(text, "k", (1, 1, 1), (32, 1, 1), [np.zeros(1, np.int32)], "sm_90a")
    with pytest.raises(ValueError, match="no gpu.func named 'nope'"):
        run_kernel(text, "nope", (1, 1, 1), (64, 1, 1), [np.zeros(1, np.int32)], "sm_90a")
    with pytest.raises(TypeError, match="element size"):
        run_kernel(text, "k", (1, 1, 1), (64, 1, 1), [np.zeros(1, np.int8)], "sm_90a")


@pytest.mark.parametrize("target,prefix", [("sm_90a", "nvvm"), ("gfx950", "rocdl")])
def test_target_id_intrinsics(target, prefix):
    ops = {"nvvm": ("nvvm.read.ptx.sreg.tid.x", "nvvm.read.ptx.sreg.ctaid.y",
                    "nvvm.read.ptx.sreg.ntid.x", "nvvm.read.ptx.sreg.nctaid.y"),
           "rocdl": ("rocdl.workitem.id.x", "rocdl.workgroup.id.y", "rocdl.workgroup.dim.x",
                     "rocdl.grid.dim.y")}[prefix]
    text = f"""
gpu.module @m {{
  gpu.func @k(%y: memref<?xi32>) kernel {{
    %t = {ops[0]} : i32
    %b = {ops[1]} : i32
    %n = {ops[2]} : i32
    %g = {ops[3]} : i32
    %bn = arith.muli %b, %n : i32
    %i = arith.addi %bn, %t : i32
    %ii = arith.index_cast %i : i32 to index
    %gn = arith.muli %g, %n : i32
    %v = arith.addi %gn, %t : i32
    memref.store %v, %y[%ii] : memref<?xi32>
    gpu.return
  }}
}}"""
    y = np.zeros(3 * 16, np.int32)
    run_kernel(text, "k", (1, 3, 1), (16, 1, 1), [y], target)
    np.testing.assert_array_equal(y, 3 * 16 + np.tile(np.arange(16), 3))


def test_interpreter_import_does_not_import_mlir():
    import subprocess
    import sys

    code = ("import sys, blockscale.runtime.interpreter as i; "
            "sys.exit(any(m == 'mlir' or m.startswith('mlir.') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0

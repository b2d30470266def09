"""Chapter 5: an op graph -> one MLIR module -> a saved Program -> run it elsewhere."""

import tempfile

import ml_dtypes
import numpy as np

from blockscale.graph import Graph, run_program
from blockscale.runtime.program import Program

g = Graph("linear_nvfp4")
x = g.input("x", (32, 128), "bfloat16")
w = g.input("w", (64, 128), "bfloat16")
a, sa = g.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=2.0)
b, sb = g.quantize_dynamic_block_scaled(w, "nvfp4")
g.output(g.naive_block_scaled_matmul(a, b, sa, sb, alpha=0.5), "y")
print(g.summary())

text = g.mlir("sm_90a")
print("\n".join(line for line in text.splitlines() if "func.func" in line or "launch_func" in line))

rng = np.random.default_rng(6)
inputs = {"x": rng.standard_normal((32, 128)).astype(ml_dtypes.bfloat16),
          "w": rng.standard_normal((64, 128)).astype(ml_dtypes.bfloat16)}
with tempfile.TemporaryDirectory() as d:
    g.compile("sm_90a").save(d)
    program = Program.load(d)  # needs no MLIR: a machine with only the driver can run it
    print(program)
    y = run_program(program, inputs, device="interp")["y"]
want = g.evaluate(inputs)["y"]
assert np.array_equal(y.view(np.uint16), want.view(np.uint16))
print("program output == numpy reference, byte for byte")
print("PASS")

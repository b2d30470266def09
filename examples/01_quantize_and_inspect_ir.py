"""Chapter 1: quantize with a compiled kernel, check it byte for byte, look at its IR.

The kernel runs on a GPU when one is present, else in the numpy interpreter (it executes the
kernel's MLIR). ``ops.quantize.kernel(...)`` compiles a kernel and keeps every stage.
"""

import ml_dtypes
import numpy as np

import blockscale as bs
from blockscale import ops
from blockscale import reference as ref

rng = np.random.default_rng(1)
x = rng.standard_normal((130, 96)).astype(ml_dtypes.bfloat16)  # rows past a 128-row tile
for fmt in (bs.NVFP4, bs.MXFP4, bs.MXFP8):
    data, scales = ops.quantize_dynamic_block_scaled(x, fmt)
    want_d, want_s = ref.quantize_dynamic_block_scaled(x, fmt)
    assert np.array_equal(data.view(np.uint8), want_d.view(np.uint8)), fmt
    assert np.array_equal(scales.view(np.uint8), want_s.view(np.uint8)), fmt
    print(f"{fmt.name}: compiled kernel == reference, byte for byte ({data.shape}, {scales.shape})")

kernel = ops.quantize.kernel("nvfp4", target="sm_90a")
print("stages:", ", ".join(f"{k} ({len(v)} bytes)" for k, v in kernel.asm.items()))
ptx = kernel.asm["ptx"]
print("\n".join(ptx.splitlines()[:12]))
# D2: correctly rounded division / reciprocal (div.rn, rcp.rn), never rcp.approx
assert ".entry" in ptx and "rcp.approx" not in ptx and ("div.rn.f32" in ptx or "rcp.rn.f32" in ptx)
print("PASS")

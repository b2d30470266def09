"""Chapter 3: a block-scaled matmul (§4): quantize A and B, multiply with fp32 accumulation."""

import ml_dtypes
import numpy as np

import blockscale as bs
from blockscale import ops
from blockscale import reference as ref

rng = np.random.default_rng(3)
m, n, k = 40, 48, 128
x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
w = rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16)  # K-major weights ("transpose_b")
exact = x.astype(np.float64) @ w.astype(np.float64).T
for fmt in (bs.NVFP4, bs.MXFP4, bs.MXFP8):
    a, sa = ref.quantize_dynamic_block_scaled(x, fmt)
    b, sb = ref.quantize_dynamic_block_scaled(w, fmt)
    c = ops.naive_block_scaled_matmul(a, b, sa, sb, fmt, out_dtype="float32")
    want = ref.naive_block_scaled_matmul(a, b, sa, sb, fmt, k=k, out_dtype="float32")
    # fp32 accumulation vs the reference's float64 sum: within K * 2^-24 * sum|a*b|
    bound = k * 2.0**-24 * np.abs(want).max() * 4
    assert np.abs(c - want).max() <= bound, fmt
    err = np.linalg.norm(c - exact) / np.linalg.norm(exact)
    print(f"{fmt.name}: C {c.shape}, |C - reference| <= {bound:.2e}, error vs bf16 inputs {err:.3f}")
    assert err < (0.2 if fmt.is_fp4 else 0.05)
print("PASS")

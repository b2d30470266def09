"""Chapter 0: the block-scaled formats and the numpy reference (no compiler, no GPU).

NVFP4 = E2M1 elements in blocks of 16 with an E4M3 scale; MXFP4 = E2M1 in blocks of 32 with
an E8M0 scale; MXFP8 = E4M3 in blocks of 32 with an E8M0 scale (SEMANTICS §1).
"""

import ml_dtypes
import numpy as np

import blockscale as bs
from blockscale import reference as ref

for fmt in (bs.NVFP4, bs.MXFP4, bs.MXFP8):
    print(f"{fmt.name}: block {fmt.block_size}, elements {fmt.elem_dtype}, scales {fmt.scale_dtype}")

# SEMANTICS §2.1 worked example: a block of sixteen 1.0 -> scale 0x23, every code 6 (0x77)
x = np.ones((1, 16), ml_dtypes.bfloat16)
data, scales = ref.quantize_dynamic_block_scaled(x, bs.NVFP4, scale_layout=bs.ROW_MAJOR)
print("data bytes", data.tobytes().hex(), "scale byte", scales.view(np.uint8).tobytes().hex())
assert data.tobytes() == b"\x77" * 8 and scales.view(np.uint8)[0, 0] == 0x23

# second example: i * 0.25 for i = 0..15 -> scale 0x32, bytes 10 22 43 54 65 66 76 77
x = (np.arange(16) * 0.25).reshape(1, 16).astype(ml_dtypes.bfloat16)
data, scales = ref.quantize_dynamic_block_scaled(x, bs.NVFP4, scale_layout=bs.ROW_MAJOR)
assert data.tobytes().hex() == "1022435465667677" and scales.view(np.uint8)[0, 0] == 0x32

# quantize -> dequantize round trip on Gaussian data: the error each format makes
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 256)).astype(ml_dtypes.bfloat16)
for fmt in (bs.NVFP4, bs.MXFP4, bs.MXFP8):
    d, s = ref.quantize_dynamic_block_scaled(x, fmt)
    y = ref.dequantize_block_scaled(d, s, fmt, k=256)
    rel = np.linalg.norm(y - x.astype(np.float32)) / np.linalg.norm(x.astype(np.float32))
    print(f"{fmt.name}: data {d.shape} {d.dtype}, 5-D scales {s.shape}, relative error {rel:.4f}")
    assert rel < (0.12 if fmt.is_fp4 else 0.04)
print("PASS")

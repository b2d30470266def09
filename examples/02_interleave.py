"""Chapter 2: the 5-D TCGEN scale layout (cuBLAS 128x4) and the interleave kernel (§1.3, §3)."""

import numpy as np

from blockscale import ops
from blockscale import reference as ref
from blockscale.layouts import tcgen_offset

rng = np.random.default_rng(2)
rows, kblocks = 200, 6
scales = rng.integers(1, 255, (rows, kblocks), dtype=np.uint8)
out = ops.block_scales_interleave(scales)
want = ref.block_scales_interleave(scales)
print("row-major", scales.shape, "-> 5-D", out.shape)
assert out.shape == (2, 2, 32, 4, 4) and np.array_equal(out, want)

# S[r, j] lives at byte ((((r//128)*D1 + j//4)*32 + r%32)*4 + (r%128)//32)*4 + j%4
flat = out.reshape(-1)
for r, j in [(0, 0), (1, 0), (32, 0), (0, 1), (0, 4), (128, 0), (199, 5)]:
    assert flat[tcgen_offset(r, j, kblocks)] == scales[r, j]
assert tcgen_offset(200, 5, 8) == 1673  # SEMANTICS §1.3 worked check (D1 = 2)
# padding (rows 200..255, K-blocks 6..7) is zero; deinterleave inverts
assert int(out.sum()) == int(scales.astype(np.int64).sum())
assert np.array_equal(ref.block_scales_deinterleave(out, rows, kblocks), scales)
print("PASS")

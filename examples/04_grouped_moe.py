"""Chapter 4: an end-to-end block-scaled MoE layer with NvMxf4f8Strategy (§7.10).

router top-k -> moe_create_indices -> grouped quantize (gather fused, indices // top_k) ->
gate/up grouped matmul -> fused SiLU quantize -> down grouped matmul -> un-permute + combine.
The four expert steps run as compiled kernels (GPU, else the numpy interpreter).
"""

import ml_dtypes
import numpy as np

from blockscale.moe import QuantConfig
from blockscale.moe_layer import MoELayer, MoEWeights, moe_forward_reference

T, H, D, E, TOP_K = 24, 128, 128, 4, 2
weights = MoEWeights.random(H, D, E, seed=4)
x = np.random.default_rng(5).standard_normal((T, H)).astype(ml_dtypes.bfloat16)
for fmt, bound in (("nvfp4", 0.995), ("mxfp4", 0.99), ("mxfp8", 0.995)):
    layer = MoELayer(weights, QuantConfig(fmt), TOP_K, calibration=x)
    y = layer.forward(x)  # compiled ops
    backend = layer.strategy.last_backend
    y_ref = layer.forward(x, device="reference")
    assert np.array_equal(y.view(np.uint16), y_ref.view(np.uint16)), fmt
    r = moe_forward_reference(layer, x)
    yf = y.astype(np.float64)
    cos = (yf * r).sum(1) / (np.linalg.norm(yf, axis=1) * np.linalg.norm(r, axis=1))
    print(f"{fmt}: {backend} == reference byte for byte; cosine vs float64 min {cos.min():.5f}")
    assert cos.min() >= bound
print("PASS")

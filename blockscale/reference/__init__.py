"""The numpy reference semantics of every blockscale op (SEMANTICS.md, Decisions D1-D12).

Bit-exact for quantize / interleave; matmuls sum exact products in float64 (see
:mod:`blockscale.reference.matmul` for the fp32-accumulation contract and its bound).
Use as ``from blockscale import reference as ref; ref.quantize_dynamic_block_scaled(...)``.

Modules: ``quantize`` (dense quantize, dequantize, interleave, AMD MXFP4 quantize),
``grouped`` (grouped quantize, fused SiLU quantize, moe_create_indices), ``matmul`` (dense,
grouped, fused SwiGLU and AMD matmuls).
"""

from __future__ import annotations

from blockscale.reference.grouped import (
    fused_silu_quantize,
    grouped_quantize_dynamic_scaled,
    moe_create_indices,
)
from blockscale.reference.matmul import (
    grouped_matmul_block_scaled,
    grouped_matmul_block_scaled_mxfp4,
    grouped_matmul_swiglu,
    matmul_dynamic_block_scaled_mxfp4,
    naive_block_scaled_matmul,
    sigma_permute_rows,
    sigma_unpermute_rows,
)
from blockscale.reference.quantize import (
    block_scales_deinterleave,
    block_scales_interleave,
    dequantize_block_scaled,
    quantize_dynamic_block_scaled,
    quantize_mxfp4_amd,
)

__all__ = [
    "block_scales_deinterleave",
    "block_scales_interleave",
    "dequantize_block_scaled",
    "fused_silu_quantize",
    "grouped_matmul_block_scaled",
    "grouped_matmul_block_scaled_mxfp4",
    "grouped_matmul_swiglu",
    "grouped_quantize_dynamic_scaled",
    "matmul_dynamic_block_scaled_mxfp4",
    "moe_create_indices",
    "naive_block_scaled_matmul",
    "quantize_dynamic_block_scaled",
    "quantize_mxfp4_amd",
    "sigma_permute_rows",
    "sigma_unpermute_rows",
]

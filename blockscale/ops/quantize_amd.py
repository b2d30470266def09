"""AMD-style MXFP4 quantize entry points (SEMANTICS §2.4, D4): row-major E8M0 scales.

Both run the generic quantize kernel (:mod:`blockscale.ops.quantize_ir`) with row-major
scales; on gfx950 its FP4 conversion is ``v_cvt_scalef32_pk_fp4_f32`` (power-of-two scales,
bit-identical to the D2 chain), elsewhere software RNE. No MLIR at import.
"""

from __future__ import annotations

from typing import Any

from blockscale.formats import MXFP4
from blockscale.layouts import ROW_MAJOR
from blockscale.ops.quantize import QuantizeSpec, _dense, check_input


def quantize_mxfp4_amd(x: Any, *, scale_rounding: str = "even", device: Any = None,
                       target: str | None = None) -> tuple[Any, Any]:
    """MAX's ``quantize_mxfp4_amd``: bf16 ``[M, K]`` (K % 32 == 0) -> ``(data [M, K/2] uint8,
    scales [M, K/32] float8_e8m0fnu)``, E8M0 rounding "even" by default (D4)."""
    _, k = check_input(x)
    if k % 32:
        raise ValueError(f"x.shape[1] must be a multiple of 32 for quantize_mxfp4_amd, got {k}")
    rounding = MXFP4.resolve_scale_rounding(scale_rounding)
    return _dense(x, MXFP4, 1.0, rounding, ROW_MAJOR, device, target, "quantize_mxfp4_amd")


def quantize_dynamic_block_scaled_mxfp4(x: Any, *, scale_rounding: str | None = None,
                                        device: Any = None, target: str | None = None
                                        ) -> tuple[Any, Any]:
    """MAX's flat MXFP4 quantizer: the tensor as one list of elements (a multiple of 32).

    ``x`` is bf16 ``[M, K]`` with M*K % 32 == 0; group g's scale is ``scales[g]``. Returns
    ``(data [M, K/2], scales [M, K/32])`` when K % 32 == 0, else flat ``[n/2]`` / ``[n/32]``.
    E8M0 rounding defaults to "up" (D4: only ``quantize_mxfp4_amd`` defaults to "even").
    """
    m, k = check_input(x)
    n = m * k
    if n % 32:
        raise ValueError(f"x must hold a multiple of 32 elements, got {m}x{k}={n}")
    flat = x.reshape(1, n) if n else x.reshape(0, 0)
    rounding = MXFP4.resolve_scale_rounding(scale_rounding)
    data, scales = _dense(flat, MXFP4, 1.0, rounding, ROW_MAJOR, device, target,
                          "quantize_dynamic_block_scaled_mxfp4")
    if k % 32 == 0:
        return data.reshape(m, k // 2), scales.reshape(m, k // 32)
    return data.reshape(n // 2), scales.reshape(n // 32)


def quantize_mxfp4_amd_kernel(target: str = "gfx950", *, aligned: bool = True) -> Any:
    """Compiled Kernel behind :func:`quantize_mxfp4_amd` (gfx950: v_cvt_scalef32_pk_fp4)."""
    from blockscale.ops.quantize import kernel

    return kernel(QuantizeSpec("mxfp4", target, "even", "row_major", aligned,
                               name="quantize_mxfp4_amd"))


def quantize_dynamic_block_scaled_mxfp4_kernel(target: str = "sm_90a", *,
                                               scale_rounding: str | None = None,
                                               aligned: bool = True) -> Any:
    """Compiled Kernel behind :func:`quantize_dynamic_block_scaled_mxfp4` (row-major E8M0
    scales, rounding "up" by default)."""
    from blockscale.ops.quantize import kernel

    return kernel(QuantizeSpec("mxfp4", target, MXFP4.resolve_scale_rounding(scale_rounding),
                               "row_major", aligned, name="quantize_dynamic_block_scaled_mxfp4"))


def bundle_specs(target: str = "sm_90a") -> list[QuantizeSpec]:
    """AMD-entry specs (built for any target: the same IR runs everywhere)."""
    return [QuantizeSpec("mxfp4", target, r, "row_major", True, name=n)
            for r, n in (("even", "quantize_mxfp4_amd"),
                         ("up", "quantize_dynamic_block_scaled_mxfp4"))]


__all__ = [
    "bundle_specs",
    "quantize_dynamic_block_scaled_mxfp4",
    "quantize_dynamic_block_scaled_mxfp4_kernel",
    "quantize_mxfp4_amd",
    "quantize_mxfp4_amd_kernel",
]


import blockscale.ops._core as _core  # noqa: E402, PLR0402 (no package __getattr__ scan)

_core.register_op_module(__name__)

"""NvMxf4f8Strategy contracts (SEMANTICS §7) and the end-to-end MoE layer (§7.10)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import blockscale as bs
from blockscale import reference as ref
from blockscale.moe import NvMxf4f8Strategy, QuantConfig
from blockscale.moe_layer import (
    MoELayer,
    MoEWeights,
    combine_experts,
    moe_forward_reference,
    route_top_k,
)

T, H, D, E, TOP_K = 48, 128, 128, 6, 2


def _x(seed: int = 2, t: int = T) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((t, H)).astype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def weights() -> MoEWeights:
    return MoEWeights.random(H, D, E, seed=1)


@pytest.fixture(scope="module")
def layers(weights: MoEWeights) -> dict[str, MoELayer]:
    return {f: MoELayer(weights, QuantConfig(f), TOP_K, calibration=_x())
            for f in ("nvfp4", "mxfp4", "mxfp8")}


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


# ---- strategy contracts


def test_strategy_basics() -> None:
    s = NvMxf4f8Strategy(QuantConfig("nvfp4"), np.uint8)
    assert s.is_nvfp4
    assert not NvMxf4f8Strategy(QuantConfig("mxfp8"), ml_dtypes.float8_e4m3fn).is_nvfp4
    with pytest.raises(ValueError, match="dtype must be float8_e4m3fn for mxfp8, got uint8"):
        NvMxf4f8Strategy(QuantConfig("mxfp8"), np.uint8)
    with pytest.raises(TypeError, match="config must be a QuantConfig"):
        NvMxf4f8Strategy("nvfp4", np.uint8)  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError, match="use grouped_quantize instead"):
        s.quantize(np.zeros((4, 32), ml_dtypes.bfloat16), 16)


def test_nvfp4_requires_scales() -> None:
    s = NvMxf4f8Strategy(QuantConfig("nvfp4"), np.uint8)
    es, off, ids = np.array([0, 4], np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32)
    x = np.ones((4, 32), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="NVFP4 requires input_scale"):
        s.grouped_quantize(x, 16, None, es, off, ids, device="reference")
    inputs = (x, None, es, off, ids, None)
    with pytest.raises(ValueError, match="NVFP4 requires expert_scales"):
        s.grouped_matmul(np.zeros((1, 8, 16), np.uint8), None, None, inputs)
    with pytest.raises(ValueError, match="NVFP4 requires input_scales"):
        s.prepare_swiglu_operands(inputs, expert_scales=np.ones(1, np.float32))
    with pytest.raises(ValueError, match="expert_inputs must be the 6-tuple"):
        s.grouped_matmul(np.zeros((1, 8, 16), np.uint8), None, np.ones(1), (x, None))


def test_prepare_swiglu_operands_inverts_and_hosts_usage() -> None:
    s = NvMxf4f8Strategy(QuantConfig("nvfp4"), np.uint8)
    raw = np.array([0.5, 3.0, 0.1], np.float32)
    inputs = (None, None, np.array([0, 1, 2, 3]), np.zeros(3), np.arange(3), [2, 3])
    p = s.prepare_swiglu_operands(inputs, expert_scales=[1.0, 2.0, 3.0], input_scales=raw)
    assert p.c_input_scales.dtype == np.float32
    np.testing.assert_array_equal(p.c_input_scales, np.float32(1) / raw)  # inverted, f32
    np.testing.assert_array_equal(p.input_scales, raw)
    assert isinstance(p.usage_stats_host, np.ndarray)
    assert p.usage_stats_host.tolist() == [2, 3]
    assert p.expert_scales.dtype == np.float32
    # no usage stats -> MAX's host fallback [8192, G]
    p2 = s.prepare_swiglu_operands(inputs[:5] + (None,), expert_scales=[1.0] * 3,
                                   input_scales=raw)
    assert p2.usage_stats_host.tolist() == [8192, 3]
    mx = NvMxf4f8Strategy(QuantConfig("mxfp8"), ml_dtypes.float8_e4m3fn)
    p3 = mx.prepare_swiglu_operands(inputs)
    assert p3.c_input_scales is None and p3.expert_scales is None


def test_prepare_weight_scales() -> None:
    s = NvMxf4f8Strategy(QuantConfig("mxfp4"), np.uint8)
    rng = np.random.default_rng(0)
    gu = rng.integers(0, 255, (3, 130, 5), dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    dn = rng.integers(0, 255, (3, 64, 2), dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    a, b = s.prepare_weight_scales(gu, dn, "reference")
    assert a.shape == (3, 2, 2, 32, 4, 4) and b.shape == (3, 1, 1, 32, 4, 4)
    for e in range(3):
        np.testing.assert_array_equal(_bytes(a[e]), _bytes(ref.block_scales_interleave(gu[e])))
    with pytest.raises(ValueError, match="expected block scales of rank 3"):
        s.prepare_weight_scales(gu[0], dn, "reference")
    with pytest.raises(TypeError, match="expected dtype float8_e8m0fnu"):
        s.prepare_weight_scales(gu.view(np.uint8), dn, "reference")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_grouped_quantize_fused_gather_equals_explicit_gather(fmt: str) -> None:
    cfg = QuantConfig(fmt)
    s = NvMxf4f8Strategy(cfg, cfg.activation_dtype)
    x = _x(5, 20)
    ids, _ = route_top_k(x, np.random.default_rng(1).standard_normal((H, 4)).astype(np.float32),
                         2)
    to, es, _, eid, _, off = ref.moe_create_indices(ids.reshape(-1), 4)
    scale = np.full(4, 0.01, np.float32) if fmt == "nvfp4" else None
    d1, s1 = s.grouped_quantize(x, 16, scale, es, off, eid, indices=to, indices_divisor=2,
                                device="reference")
    tsf = None if scale is None else np.float32(1) / scale
    d2, s2 = ref.grouped_quantize_dynamic_scaled(x[to // 2], fmt, es, off, eid, tsf)
    np.testing.assert_array_equal(_bytes(d1), _bytes(d2))
    np.testing.assert_array_equal(_bytes(s1), _bytes(s2))
    assert s.last_backend == "reference"


# ---- the MoE layer


def _composed_reference(layer: MoELayer, x: np.ndarray) -> np.ndarray:
    """The MoE forward composed by hand from reference.py functions (explicit gather)."""
    fmt = layer.config.fmt
    q, sc = layer.quantized, layer.scales
    ids, w = route_top_k(x, layer.weights.router, layer.top_k)
    to, es, restore, eid, _, off = ref.moe_create_indices(ids.reshape(-1), E)
    gathered = x[to // layer.top_k]
    tsf = None if sc is None else (np.float32(1) / sc.gate_up_input).astype(np.float32)
    a, sa = ref.grouped_quantize_dynamic_scaled(gathered, fmt, es, off, eid, tsf)
    sfb_gu = np.stack([ref.block_scales_interleave(s) for s in q.gate_up_scales])
    sfb_dn = np.stack([ref.block_scales_interleave(s) for s in q.down_scales])
    gu = ref.grouped_matmul_block_scaled(a, q.gate_up, sa, sfb_gu, es, off, eid,
                                         None if sc is None else sc.gate_up_expert, fmt, k=H)
    h, sh = ref.fused_silu_quantize(gu, fmt, es, off, eid, None if sc is None else sc.down_input)
    y = ref.grouped_matmul_block_scaled(h, q.down, sh, sfb_dn, es, off, eid,
                                        None if sc is None else sc.down_expert, fmt, k=D)
    return combine_experts(y, restore, w)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_layer_byte_exact_with_composed_reference(layers: dict, fmt: str) -> None:
    layer = layers[fmt]
    x = _x(7)
    got = layer.forward(x, device="reference", fused=False)
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == (T, H)
    np.testing.assert_array_equal(_bytes(got), _bytes(_composed_reference(layer, x)))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_fused_swiglu_path_byte_identical_to_chained(layers: dict, fmt: str) -> None:
    x = _x(8)
    chained = layers[fmt].forward(x, device="reference", fused=False)
    fused = layers[fmt].forward(x, device="reference", fused=True)
    np.testing.assert_array_equal(_bytes(fused), _bytes(chained))


def test_fused_swiglu_rejects_mxfp4(layers: dict) -> None:
    with pytest.raises(ValueError, match="NVFP4 and MXFP8 only"):
        layers["mxfp4"].forward(_x(), device="reference", fused=True)


def _cosines(y: np.ndarray, r: np.ndarray) -> np.ndarray:
    y = np.asarray(y, dtype=np.float64)
    return (y * r).sum(1) / (np.linalg.norm(y, axis=1) * np.linalg.norm(r, axis=1))


@pytest.mark.parametrize("fmt, bound", [("nvfp4", 0.995), ("mxfp4", 0.99), ("mxfp8", 0.995)])
def test_layer_accuracy_against_float64_reference(layers: dict, fmt: str, bound: float
                                                  ) -> None:
    """Per-token cosine vs the float64 reference with activation quantize-dequantize (MAX's
    MoE test reference); bf16 rounding, fp32 accumulation and block-scale choices differ."""
    layer = layers[fmt]
    x = _x(9)
    cos = _cosines(layer.forward(x, device="reference"), moe_forward_reference(layer, x))
    assert cos.min() >= bound, (fmt, cos.min())


@pytest.mark.parametrize("fmt, mean_bound, min_bound",
                         [("nvfp4", 0.98, 0.9), ("mxfp4", 0.965, 0.9), ("mxfp8", 0.998, 0.995)])
def test_layer_accuracy_against_unquantized_activations(layers: dict, fmt: str,
                                                        mean_bound: float, min_bound: float
                                                        ) -> None:
    """Against float64 with unquantized activations the FP4 activation noise shows (two
    quantized activations; one NVFP4 round trip of Gaussian data alone has cosine ~0.995), so
    the bounds are looser (measured: NVFP4 mean 0.985, MXFP4 0.972, MXFP8 0.999)."""
    layer = layers[fmt]
    x = _x(9)
    r = moe_forward_reference(layer, x, activation_qdq=False)
    cos = _cosines(layer.forward(x, device="reference"), r)
    assert cos.mean() >= mean_bound and cos.min() >= min_bound, (fmt, cos.mean(), cos.min())


def test_layer_argument_checks(weights: MoEWeights) -> None:
    with pytest.raises(ValueError, match="calibration: NVFP4 needs a calibration batch"):
        MoELayer(weights, QuantConfig("nvfp4"), 2)
    with pytest.raises(ValueError, match=r"top_k must be an int in \[1, 6\], got 7"):
        MoELayer(weights, QuantConfig("mxfp8"), 7)
    layer = MoELayer(weights, QuantConfig("mxfp8"), 2)
    with pytest.raises(ValueError, match=r"x must have shape \[T, 128\]"):
        layer.forward(np.zeros((4, 64), ml_dtypes.bfloat16), device="reference")
    with pytest.raises(TypeError, match="x must be bfloat16"):
        layer.forward(np.zeros((4, H), np.float32), device="reference")


def test_package_exports() -> None:
    assert bs.NvMxf4f8Strategy is NvMxf4f8Strategy
    assert bs.QuantConfig is QuantConfig
    from blockscale import moe
    assert moe.GatedActivation is bs.GatedActivation
    assert moe.MoELayer is MoELayer


@pytest.mark.interp
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_layer_compiled_ops_in_interpreter_byte_exact(weights: MoEWeights, fmt: str) -> None:
    """Eager strategy calls through the compiled ops (numpy interpreter) give the same bytes
    as the reference."""
    x = _x(11, 16)
    layer = MoELayer(weights, QuantConfig(fmt), TOP_K, calibration=x)
    got = layer.forward(x, device="interp", fused=False)
    assert layer.strategy.last_backend == "ops:interp"
    np.testing.assert_array_equal(_bytes(got), _bytes(layer.forward(x, device="reference",
                                                                     fused=False)))

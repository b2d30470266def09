"""The fused grouped matmul + SwiGLU + quantize kernel (SEMANTICS §6, D10) in the interpreter.

Every case compares, byte for byte, the fused kernel with the chained compiled path
(``grouped_matmul_block_scaled`` on the un-permuted weights, then ``fused_silu_quantize``) and
with ``reference.grouped_matmul_swiglu``, on the IR of all four targets. Plus lowering, the
graph planner, the MoE strategy wiring and host validation.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from test_matmul_grouped import make_grouped_case

from blockscale import layouts
from blockscale import reference as ref
from blockscale.activations import GatedActivation
from blockscale.formats import NVFP4, Format
from blockscale.ops import fused_silu_quantize, grouped_matmul_block_scaled
from blockscale.ops import matmul_swiglu as SW

TARGETS = ("sm_90a", "sm_100a", "gfx942", "gfx950")
FMTS = ("nvfp4", "mxfp4", "mxfp8")


def _b(x: object) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x)).view(np.uint8)


def swiglu_case(fmt: Format, counts: list[int], ids: list[int], e_count: int, d: int, k: int,
                seed: int) -> dict:
    """A grouped case with 2D weight rows (gate rows then up rows) and its σ-permuted form."""
    rng = np.random.default_rng(seed)
    case, _, w_scales = make_grouped_case(rng, fmt, counts, ids, e_count, 2 * d, k)
    case["w_sigma"] = ref.sigma_permute_rows(case["weight"])
    case["sfb_sigma"] = np.stack([layouts.interleave(ref.sigma_permute_rows(s))
                                  for s in w_scales])
    return case


def max_test_case(d: int = 128, k: int = 256) -> dict:
    """MAX's test_grouped_matmul_swiglu_nvfp4_gpu: E=2, 64 tokens per expert, random uint8
    payloads and random E4M3 scale bytes (NaN patterns removed), a_scale_offsets [0, 1]."""
    rng = np.random.default_rng(2026)
    j4 = -(-NVFP4.kblocks(k) // 4)

    def e4m3_bytes(shape: tuple[int, ...]) -> np.ndarray:
        b = rng.integers(0, 256, size=shape, dtype=np.uint8)
        b[(b & 0x7F) == 0x7F] = 0x38
        return b.view(ml_dtypes.float8_e4m3fn)

    w = rng.integers(0, 256, size=(2, 2 * d, k // 2), dtype=np.uint8)
    w_scales = [e4m3_bytes((2 * d, NVFP4.kblocks(k))) for _ in range(2)]
    return {"hidden": rng.integers(0, 256, size=(128, k // 2), dtype=np.uint8),
            "weight": w, "a_scales": e4m3_bytes((2, j4, 32, 4, 4)),
            "b_scales": np.stack([layouts.interleave(s) for s in w_scales]),
            "expert_start": np.array([0, 64, 128], np.int32),
            "a_scale_offsets": np.array([0, 1], np.int32),
            "expert_ids": np.array([0, 1], np.int32),
            "w_sigma": ref.sigma_permute_rows(w),
            "sfb_sigma": np.stack([layouts.interleave(ref.sigma_permute_rows(s))
                                   for s in w_scales])}


def check_fused(case: dict, fmt: Format, k: int, esc: np.ndarray | None,
                isc: np.ndarray | None, act: str, target: str,
                row_scales: np.ndarray | None = None) -> None:
    """fused == chained (compiled, same target) == reference, byte for byte."""
    grp = (case["expert_start"], case["a_scale_offsets"], case["expert_ids"])
    tiles = case["a_scales"].shape[0]
    data, scales = SW.grouped_matmul_swiglu(
        case["hidden"], case["w_sigma"], case["a_scales"], case["sfb_sigma"], *grp, esc, isc,
        fmt, k=k, activation=act, a_row_scales=row_scales, device="interp", target=target)
    gate_up = grouped_matmul_block_scaled(case["hidden"], case["weight"], case["a_scales"],
                                          case["b_scales"], *grp, esc, fmt, k=k,
                                          a_row_scales=row_scales, device="interp",
                                          target=target)
    c_data, c_scales = fused_silu_quantize(gate_up, fmt, *grp, isc, activation=act,
                                           num_scale_tiles=tiles, device="interp",
                                           target=target)
    r_data, r_scales = ref.grouped_matmul_swiglu(
        case["hidden"], case["w_sigma"], case["a_scales"], case["sfb_sigma"], *grp, esc, isc,
        fmt, k=k, activation=act, a_row_scales=row_scales)
    d = case["weight"].shape[1] // 2
    assert data.dtype == fmt.elem_dtype and data.shape == (case["hidden"].shape[0],
                                                           fmt.data_cols(d))
    assert scales.dtype == fmt.scale_dtype and scales.shape == c_scales.shape
    assert scales.shape[0] == tiles
    np.testing.assert_array_equal(_b(data), _b(c_data))
    np.testing.assert_array_equal(_b(scales), _b(c_scales))
    np.testing.assert_array_equal(_b(data), _b(r_data))
    np.testing.assert_array_equal(_b(scales), _b(r_scales))
    es, ids = case["expert_start"], case["expert_ids"]
    for g, e in enumerate(ids):  # D8: rows of id -1 groups are zero bytes
        if e < 0:
            assert not _b(data[es[g]:es[g + 1]]).any()


def _scales_for(fmt: Format, e_count: int) -> tuple[np.ndarray, np.ndarray | None]:
    esc = (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)  # MAX's test choice
    isc = np.linspace(0.3, 0.9, e_count).astype(np.float32) if not fmt.is_mx else None
    return esc, isc


@pytest.mark.interp
@pytest.mark.parametrize("act", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("target", TARGETS)
def test_unused_and_empty_groups(target: str, fmt: str, act: str) -> None:
    """counts [0, 3, 1, 2], ids [-1, 2, -1, 0] (MAX's id -1 case)."""
    f = Format.from_name(fmt)
    case = swiglu_case(f, [0, 3, 1, 2], [-1, 2, -1, 0], 3, 40, 64, seed=len(target) + len(act))
    check_fused(case, f, 64, *_scales_for(f, 3), act, target)


@pytest.mark.interp
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("target", TARGETS)
def test_groups_spanning_tiles(target: str, fmt: str) -> None:
    """counts [65, 129, 257]: partial and multi-tile groups, padding rows in every tile."""
    f = Format.from_name(fmt)
    act = "swiglu_oai" if target in ("sm_100a", "gfx942") else "silu"
    case = swiglu_case(f, [65, 129, 257], [1, 2, 0], 3, 16, 64, seed=7)
    check_fused(case, f, 64, *_scales_for(f, 3), act, target)


@pytest.mark.interp
@pytest.mark.parametrize("act", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_max_swiglu_test_case(target: str, act: str) -> None:
    """MAX's fused SwiGLU test: E=2, D=128, K=256, expert scales 1, input scales 0.5."""
    case = max_test_case()
    check_fused(case, NVFP4, 256, np.ones(2, np.float32), np.full(2, 0.5, np.float32), act,
                target)


@pytest.mark.interp
@pytest.mark.parametrize("fmt,target", [("nvfp4", "gfx950"), ("mxfp8", "sm_90a"),
                                        ("mxfp4", "gfx950")])
def test_unaligned_d(fmt: str, target: str) -> None:
    """D % 8 != 0 (masked scalar stores, clamped weight rows of the partial chunk)."""
    f = Format.from_name(fmt)
    d = 10 if f.is_fp4 else 13
    case = swiglu_case(f, [5, 0, 9], [1, 0, 0], 2, d, 64, seed=3)
    check_fused(case, f, 64, *_scales_for(f, 2), "swiglu_oai", target)


@pytest.mark.interp
@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
def test_row_scales_after_expert_scale(target: str) -> None:
    """a_row_scales (bf16, NVFP4) multiply after the expert scale, before the bf16 round."""
    case = swiglu_case(NVFP4, [7, 0, 12], [1, -1, 0], 2, 24, 64, seed=9)
    rows = np.random.default_rng(4).uniform(0.25, 4, 19).astype(ml_dtypes.bfloat16)
    check_fused(case, NVFP4, 64, *_scales_for(NVFP4, 2), "silu", target, row_scales=rows)


@pytest.mark.interp
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_empty_group_sharing_tile0_with_its_neighbour(fmt: str) -> None:
    """An empty group placed at the tile0 of the group before it must not take over that
    group's tiles in the kernel's tile -> group search (as for fused_silu_quantize)."""
    f = Format.from_name(fmt)
    case = swiglu_case(f, [0, 1, 0], [3, 0, -1], 4, 16, 64, seed=11)
    case["a_scale_offsets"] = np.zeros(3, np.int32)
    check_fused(case, f, 64, *_scales_for(f, 4), "silu", "sm_90a")


@pytest.mark.interp
def test_mx_defaults_and_no_rows() -> None:
    """MX: expert_scales None means ones; T == 0 gives empty data and zero scales."""
    f = Format.from_name("mxfp8")
    case = swiglu_case(f, [4, 3], [1, 0], 2, 8, 32, seed=5)
    args = (case["hidden"], case["w_sigma"], case["a_scales"], case["sfb_sigma"],
            case["expert_start"], case["a_scale_offsets"], case["expert_ids"])
    a = SW.grouped_matmul_swiglu(*args, None, None, f, device="interp")
    b = SW.grouped_matmul_swiglu(*args, np.ones(2, np.float32), None, f, device="interp")
    for x, y in zip(a, b):
        np.testing.assert_array_equal(_b(x), _b(y))
    empty = SW.grouped_matmul_swiglu(case["hidden"][:0], case["w_sigma"], case["a_scales"],
                                     case["sfb_sigma"], np.array([0, 0], np.int32),
                                     np.zeros(1, np.int32), np.zeros(1, np.int32), None, None,
                                     f, device="interp")
    assert empty[0].shape == (0, 8) and not _b(empty[1]).any()


# ---- lowering ----------------------------------------------------------------------------------

@pytest.mark.lower
@pytest.mark.parametrize("target", TARGETS)
def test_lowers_on_every_target(target: str) -> None:
    for fmt, act in (("nvfp4", "silu"), ("mxfp8", "swiglu_oai"), ("mxfp4", "silu")):
        kern = SW.grouped_matmul_swiglu_kernel(fmt, target, activation=act)
        assert kern.meta["kernel"] == f"grouped_matmul_swiglu_{fmt}_v_{act}"
        if target.startswith("sm_"):
            ptx = kern.asm["ptx"]
            assert f".target {target}" in ptx and ".entry" in ptx
            assert "cvt.rn.bf16.f32" in ptx  # D10: the bf16 round trip of gate and up
            assert "rcp.approx" not in ptx  # IEEE reciprocal / division only (D2, D10)
            assert "ex2" not in ptx and "fma.rn.f32" not in ptx  # exp_f32: plain mul/add (D10)
            if target == "sm_100a" and fmt != "mxfp8":
                assert "cvt.rn.satfinite.e2m1x2.f32" in ptx
        else:
            asm = kern.asm["amdgcn"]
            assert "s_endpgm" in asm and "v_exp_f32" not in asm  # exp_f32, not ocml exp
            if target == "gfx950":
                assert "v_cvt_pk_bf16_f32" in asm
                if fmt == "mxfp4":
                    assert re.search(r"v_cvt_scalef32_pk_fp4_f32", asm)


@pytest.mark.lower
def test_bundle_specs_and_kernel_entry_points() -> None:
    specs = SW.bundle_specs("sm_90a")
    assert {(s.fmt, s.activation, s.row_scales) for s in specs} >= {
        ("nvfp4", "silu", False), ("nvfp4", "swiglu_oai", False), ("mxfp8", "silu", False),
        ("mxfp8", "swiglu_oai", False), ("nvfp4", "silu", True)}
    from blockscale import ops
    assert ops.grouped_matmul_swiglu is SW.grouped_matmul_swiglu
    assert SW.grouped_matmul_swiglu.kernel is SW.kernel
    kern = SW.kernel("nvfp4", "sm_90a", row_scales=True)
    assert kern.meta["kernel"].endswith("_rowsc") and "cubin" in kern.asm


# ---- graph and MoE -----------------------------------------------------------------------------

@pytest.mark.interp
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_graph_compiles_the_fused_node(fmt: str) -> None:
    from blockscale.graph import plans
    from blockscale.moe import QuantConfig
    from blockscale.moe_layer import MoELayer, MoEWeights

    w = MoEWeights.random(64, 64, 4, seed=3)
    x = np.random.default_rng(4).standard_normal((16, 64)).astype(ml_dtypes.bfloat16)
    layer = MoELayer(w, QuantConfig(fmt), 2, calibration=x)
    idx = layer.indices(layer.route(x)[0])
    g = layer.expert_graph(16, fused=True)
    node = next(n for n in g.nodes if n.op == "grouped_matmul_swiglu")
    ((spec, _, bindings),) = plans.plan_node(node, "gfx950")
    assert isinstance(spec, SW.SwigluSpec) and spec.target == "gfx950"
    assert bindings["scales_offsets"] == node.inputs["a_scale_offsets"].name
    inputs = layer.graph_inputs(x, idx)
    got = g.run(inputs, device="interp", target="sm_90a")
    np.testing.assert_array_equal(_b(got["y"]), _b(g.evaluate(inputs)["y"]))
    eager = layer.forward(x, device="interp", fused=True)
    assert layer.strategy.last_backend == "ops:interp"
    np.testing.assert_array_equal(_b(eager), _b(layer.forward(x, device="interp", fused=False)))


# ---- validation (host, before any kernel) ------------------------------------------------------

def _valid() -> tuple[list, dict]:
    case = swiglu_case(NVFP4, [2, 3], [0, 1], 2, 8, 32, seed=1)
    args = [case["hidden"], case["w_sigma"], case["a_scales"], case["sfb_sigma"],
            case["expert_start"], case["a_scale_offsets"], case["expert_ids"],
            np.ones(2, np.float32), np.ones(2, np.float32), "nvfp4"]
    return args, {"device": "interp"}


@pytest.mark.parametrize("index,value,exc,words", [
    (1, np.zeros((2, 15, 16), np.uint8), ValueError, "weight.shape[1] (2D"),
    (4, np.array([0, 3, 2], np.int32), ValueError, "non-decreasing"),
    (5, np.array([0, 9], np.int32), ValueError, "scales_offsets[1]"),
    (6, np.array([0, 2], np.int32), ValueError, "expert_ids"),
    (7, None, ValueError, "expert_scales must be given for nvfp4"),
    (8, None, ValueError, "NVFP4 requires input_scales"),
    (8, np.array([1.0, -1.0], np.float32), ValueError, "input_scales must be finite and > 0"),
    (2, np.zeros((1, 1, 32, 4, 4), np.uint8), TypeError, "a_scales must have dtype"),
])
def test_validation(index: int, value: object, exc: type, words: str) -> None:
    args, kw = _valid()
    args[index] = value
    with pytest.raises(exc, match=re.escape(words)):
        SW.grouped_matmul_swiglu(*args, **kw)


def test_validation_row_scales_and_activation() -> None:
    args, kw = _valid()
    with pytest.raises(ValueError, match="a_row_scales must have shape"):
        SW.grouped_matmul_swiglu(*args, a_row_scales=np.ones(3, ml_dtypes.bfloat16), **kw)
    with pytest.raises(ValueError, match="activation must be"):
        SW.grouped_matmul_swiglu(*args, activation="gelu", **kw)
    with pytest.raises(ValueError, match="row_scales is NVFP4 only"):
        SW.SwigluSpec("mxfp8", row_scales=True)
    assert GatedActivation.parse(None) == GatedActivation.SILU

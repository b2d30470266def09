"""Op graphs: build-time type checks, reference evaluation, MLIR module, Program runs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import blockscale as bs
from blockscale import reference as ref
from blockscale.graph import Graph, GraphTypeError, run_program
from blockscale.moe import QuantConfig
from blockscale.moe_layer import MoELayer, MoEWeights
from blockscale.runtime.program import Program

M, N, K = 32, 48, 64


def _bf16(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(ml_dtypes.bfloat16)


def _dense_graph(fmt: str = "nvfp4") -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("dense")
    x = g.input("x", (M, K), "bfloat16")
    w = g.input("w", (N, K), "bfloat16")
    a, sa = g.quantize_dynamic_block_scaled(x, fmt)
    b, sb = g.quantize_dynamic_block_scaled(w, fmt)
    g.output(g.naive_block_scaled_matmul(a, b, sa, sb, alpha=0.5), "c")
    g.output(a, "a")
    return g, {"x": _bf16((M, K), 1), "w": _bf16((N, K), 2)}


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def test_types_follow_the_ops() -> None:
    g = Graph("t")
    x = g.input("x", (M, K), "bfloat16")
    a, sa = g.quantize_dynamic_block_scaled(x, "mxfp8", scale_layout="row_major")
    assert (a.dtype, a.shape, a.fmt, a.k, a.kind) == ("float8_e4m3fn", (M, K), bs.MXFP8, K,
                                                      "data")
    assert (sa.layout, sa.shape, sa.dtype) == (bs.ROW_MAJOR, (M, 2), "float8_e8m0fnu")
    s5 = g.block_scales_interleave(sa)
    assert s5.layout is bs.TCGEN_5D and s5.shape == (1, 1, 32, 4, 4) and s5.fmt is bs.MXFP8


def test_layout_mismatch_is_a_build_error_naming_op_and_argument() -> None:
    g = Graph("t")
    x = g.input("x", (M, K), "bfloat16")
    a, sa_rm = g.quantize_dynamic_block_scaled(x, "nvfp4", scale_layout="row_major")
    _, sa = g.quantize_dynamic_block_scaled(x, "nvfp4")
    with pytest.raises(GraphTypeError, match="naive_block_scaled_matmul: argument 'sfa' expects "
                                             "scale layout tcgen5d, got row_major"):
        g.naive_block_scaled_matmul(a, a, sa_rm, sa)
    with pytest.raises(GraphTypeError, match="block_scales_interleave: argument 'scales_2d' "
                                             "expects scale layout row_major, got tcgen5d"):
        g.block_scales_interleave(sa)


def test_format_and_dtype_mismatch_are_build_errors() -> None:
    g = Graph("t")
    x = g.input("x", (M, K), "bfloat16")
    a, sa = g.quantize_dynamic_block_scaled(x, "nvfp4")
    b, sb = g.quantize_dynamic_block_scaled(x, "mxfp4")
    with pytest.raises(GraphTypeError, match="argument 'b' expects format nvfp4, got mxfp4"):
        g.block_scaled_matmul(a, b, sa, sb)
    with pytest.raises(GraphTypeError, match="argument 'sfb' expects nvfp4 scales, got mxfp4"):
        g.block_scaled_matmul(a, a, sa, sb)
    with pytest.raises(TypeError, match="quantize_dynamic_block_scaled: argument 'x' expects "
                                        "dtype bfloat16, got float32"):
        g.quantize_dynamic_block_scaled(g.input("f", (M, K), "float32"), "nvfp4")
    with pytest.raises(GraphTypeError, match="argument 'tensor_sf' expects 1.0 for mxfp8"):
        g.quantize_dynamic_block_scaled(x, "mxfp8", tensor_sf=2.0)
    other = Graph("o").input("y", (M, K), "bfloat16")
    with pytest.raises(GraphTypeError, match="expects a tensor of this graph"):
        g.quantize_dynamic_block_scaled(other, "nvfp4")


def test_evaluate_is_the_reference() -> None:
    g, inputs = _dense_graph()
    out = g.evaluate(inputs)
    a, sa = ref.quantize_dynamic_block_scaled(inputs["x"], "nvfp4")
    b, sb = ref.quantize_dynamic_block_scaled(inputs["w"], "nvfp4")
    want = ref.naive_block_scaled_matmul(a, b, sa, sb, "nvfp4", k=K, alpha=0.5)
    np.testing.assert_array_equal(_bytes(out["c"]), _bytes(want))
    np.testing.assert_array_equal(_bytes(out["a"]), _bytes(a))
    with pytest.raises(ValueError, match=r"inputs: expected exactly \['w', 'x'\]"):
        g.evaluate({"x": inputs["x"]})


def test_plan_needs_outputs() -> None:
    g = Graph("empty")
    g.input("x", (4, 32), "bfloat16")
    with pytest.raises(ValueError, match="has no outputs"):
        g.plan("sm_90a")


@pytest.mark.ir
def test_mlir_module_has_host_func_and_kernels() -> None:
    g, _ = _dense_graph("mxfp8")
    text = g.mlir("sm_90a")
    assert text.count("gpu.launch_func") == 3
    assert "func.func @dense(" in text
    assert text.count("gpu.module @") == 2  # one quantize kernel (used twice), one matmul
    assert "memref.alloc()" in text and "memref.dealloc" in text


def _moe_graph(fmt: str) -> tuple[MoELayer, Graph, dict[str, np.ndarray]]:
    w = MoEWeights.random(64, 64, 4, seed=3)
    x = _bf16((16, 64), 4)
    layer = MoELayer(w, QuantConfig(fmt), 2, calibration=x)
    idx = layer.indices(layer.route(x)[0])
    return layer, layer.expert_graph(16), layer.graph_inputs(x, idx)


def test_moe_expert_graph_evaluates_like_the_eager_layer() -> None:
    layer, g, inputs = _moe_graph("nvfp4")
    idx = layer.indices(layer.route(inputs["x"])[0])
    eager = layer.experts(inputs["x"], idx, device="reference")
    np.testing.assert_array_equal(_bytes(g.evaluate(inputs)["y"]), _bytes(eager))
    assert [n.op for n in g.nodes] == ["grouped_quantize_dynamic_scaled",
                                       "grouped_matmul_block_scaled", "fused_silu_quantize",
                                       "grouped_matmul_block_scaled"]


@pytest.mark.interp
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_compiled_dense_graph_in_interpreter_byte_exact(fmt: str, tmp_path) -> None:
    g, inputs = _dense_graph(fmt)
    program = g.compile("sm_90a")
    assert isinstance(program, Program) and len(program.steps) == 3
    got = run_program(program, inputs, device="interp")
    want = g.evaluate(inputs)
    for name in ("c", "a"):
        np.testing.assert_array_equal(_bytes(got[name]), _bytes(want[name]))
    program.save(tmp_path / "prog")
    again = run_program(Program.load(tmp_path / "prog"), inputs, device="interp")
    np.testing.assert_array_equal(_bytes(again["c"]), _bytes(want["c"]))


@pytest.mark.interp
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_compiled_moe_graph_in_interpreter_byte_exact(fmt: str) -> None:
    _, g, inputs = _moe_graph(fmt)
    got = g.run(inputs, device="interp", target="sm_90a")
    np.testing.assert_array_equal(_bytes(got["y"]), _bytes(g.evaluate(inputs)["y"]))


@pytest.mark.lower
def test_keep_asm_gives_every_stage() -> None:
    g, _ = _dense_graph("nvfp4")
    program = g.compile("sm_90a", keep_asm=True)
    assert len(program.asm) == 2
    for stages in program.asm.values():
        assert {"mlir", "llvm", "ptx"} <= set(stages)
        assert ".entry" in stages["ptx"]

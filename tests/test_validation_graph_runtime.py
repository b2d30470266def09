"""Bad inputs to the graph builder, the MoE strategy, the runtime (devices, Programs) and the
CLI: ValueError / TypeError naming the argument with the expected and the actual value (the
CLI: exit status 2 and the message on stderr). Nothing here compiles or needs a GPU.

A Program built for another target is refused by the device check before anything runs; the
CUDA device is a real :class:`CudaDevice` object whose driver-queried fields are set by hand
(the check under test is pure host logic).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _validation_helpers import assert_raises_naming

from blockscale import cli
from blockscale import reference as ref
from blockscale.graph import Graph, GraphTypeError
from blockscale.launch import KernelArg, KernelBinary
from blockscale.moe import NvMxf4f8Strategy, QuantConfig
from blockscale.runtime import get_device
from blockscale.runtime.program import BufferDecl, Program, Step

BF16 = ml_dtypes.bfloat16
NAN, INF = float("nan"), float("inf")


def _x(m=4, k=64, seed=0):
    return np.random.default_rng(seed).standard_normal((m, k)).astype(BF16)


# ---- graph --------------------------------------------------------------------------------------


def _g():
    g = Graph("g")
    return g, g.input("x", (4, 64), "bfloat16")


def _gq_mm(g, fmt_b="nvfp4", **kw):
    a, sfa = g.quantize_dynamic_block_scaled(g.input("xa", (4, 64), "bfloat16"), "nvfp4")
    b, sfb = g.quantize_dynamic_block_scaled(g.input("xb", (3, 64), "bfloat16"), fmt_b)
    args = dict(a=a, b=b, sfa=sfa, sfb=sfb)
    args.update(kw)
    return g.naive_block_scaled_matmul(args.pop("a"), args.pop("b"), args.pop("sfa"),
                                       args.pop("sfb"), **args)


def _other_graph_tensor():
    g2 = Graph("other")
    return g2.input("x", (4, 64), "bfloat16")


def _graph_grouped(**over):
    g, x = _g()
    kw = dict(expert_start=np.array([0, 2, 4]), scales_offsets=np.array([0, 1]),
              expert_ids=np.array([0, 1]), tensor_sf=np.ones(2, np.float32))
    kw.update(over)
    return g.grouped_quantize_dynamic_scaled(x, "nvfp4", kw.pop("expert_start"),
                                             kw.pop("scales_offsets"), kw.pop("expert_ids"),
                                             kw.pop("tensor_sf"), **kw)


def _evaluate(inputs):
    g, x = _g()
    d, _ = g.quantize_dynamic_block_scaled(x, "mxfp8")
    g.output(d, "d")
    return g.evaluate(inputs)


GRAPH_CASES = [
    ("g_tsf_nan", lambda: (lambda g, x: g.quantize_dynamic_block_scaled(
        x, "nvfp4", tensor_sf=NAN))(*_g()),
     ValueError, ["tensor_sf", "finite", "nan"]),
    ("g_tsf_zero", lambda: (lambda g, x: g.quantize_dynamic_block_scaled(
        x, "nvfp4", tensor_sf=0.0))(*_g()), ValueError, ["tensor_sf", "> 0", "0.0"]),
    ("g_tsf_mx", lambda: (lambda g, x: g.quantize_dynamic_block_scaled(
        x, "mxfp4", tensor_sf=2.0))(*_g()), ValueError, ["tensor_sf", "mxfp4", "2.0"]),
    ("g_tsf_str", lambda: (lambda g, x: g.quantize_dynamic_block_scaled(
        x, "nvfp4", tensor_sf="x"))(*_g()), TypeError, ["tensor_sf", "str"]),
    ("g_alpha_inf", lambda: _gq_mm(Graph("g"), alpha=INF), ValueError, ["alpha", "inf"]),
    ("g_alpha_nan", lambda: _gq_mm(Graph("g"), alpha=NAN), ValueError, ["alpha", "nan"]),
    ("g_fmt_mismatch", lambda: _gq_mm(Graph("g"), fmt_b="mxfp4"), ValueError,
     ["'b'", "nvfp4", "mxfp4"]),
    ("g_out_dtype", lambda: _gq_mm(Graph("g"), out_dtype="int8"), ValueError,
     ["out_dtype", "int8"]),
    ("g_x_dtype", lambda: Graph("g").quantize_dynamic_block_scaled(
        np.ones((4, 64), np.float32), "nvfp4"), TypeError, ["'x'", "bfloat16", "float32"]),
    ("g_k_odd", lambda: Graph("g").quantize_dynamic_block_scaled(_x(4, 7), "nvfp4"),
     ValueError, ["x.shape[1]", "7"]),
    ("g_other_graph", lambda: Graph("g").quantize_dynamic_block_scaled(_other_graph_tensor(),
                                                                       "nvfp4"),
     ValueError, ["'x'", "this graph", "other"]),
    ("g_interleave_not_scales", lambda: (lambda g, x: g.block_scales_interleave(x))(*_g()),
     ValueError, ["scales_2d"]),
    ("g_ids_length", lambda: _graph_grouped(expert_ids=np.array([0, 1, 1])), ValueError,
     ["expert_ids", "length 2", "length 3"]),
    ("g_tsf_missing", lambda: _graph_grouped(tensor_sf=None), ValueError,
     ["tensor_sf", "nvfp4", "None"]),
    ("g_divisor", lambda: _graph_grouped(indices=np.arange(4), indices_divisor=0), ValueError,
     ["indices_divisor", "0"]),
    ("g_eval_shape", lambda: _evaluate({"x": _x(5, 64)}), ValueError,
     ["inputs['x']", "(4, 64)", "(5, 64)"]),
    ("g_eval_dtype", lambda: _evaluate({"x": np.ones((4, 64), np.float32)}), TypeError,
     ["inputs['x']", "bfloat16", "float32"]),
    ("g_eval_missing", lambda: _evaluate({}), ValueError, ["inputs", "['x']", "[]"]),
    ("g_name", lambda: Graph("not a name"), ValueError, ["name", "not a name"]),
    ("g_input_dtype", lambda: Graph("g").input("x", (2, 2), "complex64"), TypeError,
     ["dtype", "complex64"]),
]


# ---- MoE strategy -------------------------------------------------------------------------------


def _strategy(fmt="nvfp4"):
    dt = np.uint8 if fmt != "mxfp8" else ml_dtypes.float8_e4m3fn
    return NvMxf4f8Strategy(QuantConfig(fmt), dt)


def _strat_gq(input_scale, fmt="nvfp4"):
    return _strategy(fmt).grouped_quantize(
        _x(4, 64), 16, input_scale, np.array([0, 2, 4], np.int32), np.array([0, 1], np.int32),
        np.array([0, 1], np.int32), device="reference")


STRATEGY_CASES = [
    ("s_config_fmt", lambda: QuantConfig("fp6"), ValueError, ["fmt", "fp6"]),
    ("s_config_bool", lambda: QuantConfig("nvfp4", can_use_fused_swiglu=1), TypeError,
     ["can_use_fused_swiglu", "int"]),
    ("s_config_type", lambda: NvMxf4f8Strategy("nvfp4", np.uint8), TypeError,
     ["config", "QuantConfig", "str"]),
    ("s_dtype", lambda: NvMxf4f8Strategy(QuantConfig("mxfp8"), np.uint8), ValueError,
     ["dtype", "float8_e4m3fn", "uint8"]),
    ("s_input_scale_nan", lambda: _strat_gq(np.array([1.0, NAN], np.float32)), ValueError,
     ["input_scale", "finite", "nan"]),
    ("s_input_scale_zero", lambda: _strat_gq(np.array([0.0, 1.0], np.float32)), ValueError,
     ["input_scale", "> 0"]),
    ("s_input_scale_missing", lambda: _strat_gq(None), ValueError, ["input_scale", "NVFP4"]),
    ("s_input_scale_2d", lambda: _strat_gq(np.ones((2, 1), np.float32)), TypeError,
     ["input_scale", "1-D", "(2, 1)"]),
    ("s_expert_inputs", lambda: _strategy().fused_silu_quantize(
        _x(4, 128), np.ones(2, np.float32), (1, 2, 3), device="reference"), ValueError,
     ["expert_inputs", "6-tuple", "3"]),
]


# ---- runtime ------------------------------------------------------------------------------------


def _kernel(target="sm_90a", kind="cubin", name="k"):
    return KernelBinary(name=name, target=target, binary_kind=kind, binary=b"\0" * 8,
                        args=(KernelArg("x", "buffer", "float32", "inout"),
                              KernelArg("n", "scalar", "i32")),
                        block=(32, 1, 1), mlir="module {}")


def _program(target="sm_90a", kind="cubin"):
    return Program([BufferDecl("x", (4,), "float32")], [Step("k", (1, 1, 1), {"x": "x", "n": 4})],
                   {"k": _kernel(target, kind)})


def _h200():
    from blockscale.runtime.cuda import CudaDevice

    dev = CudaDevice.__new__(CudaDevice)  # no driver: only the fields check_kernel reads
    dev.ordinal, dev.capability, dev.device_name = 0, (9, 0), "NVIDIA H200"
    dev.max_dynamic_smem = 227 * 1024
    return dev


def _bad_plan_dir(text):
    import tempfile

    d = tempfile.mkdtemp(prefix="bs-plan-")
    with open(f"{d}/plan.json", "w") as f:
        f.write(text)
    return d


RUNTIME_CASES = [
    ("p_hsaco_on_cuda", lambda: _program("gfx950", "hsaco").run({"x": np.zeros(4, np.float32)},
                                                                 device=_h200()),
     ValueError, ["target gfx950", "hsaco", "cubin"]),
    ("p_sm100_on_h200", lambda: _program("sm_100a").run({"x": np.zeros(4, np.float32)},
                                                         device=_h200()),
     ValueError, ["target sm_100a", "compute capability 9.0"]),
    ("p_inputs_missing", lambda: _program().run({}, device="interp"), ValueError,
     ["inputs", "['x']", "[]"]),
    ("p_input_shape", lambda: _program().run({"x": np.zeros(5, np.float32)}, device="interp"),
     ValueError, ["input 'x'", "(4,)", "(5,)"]),
    ("p_input_dtype", lambda: _program().run({"x": np.zeros(4, np.int32)}, device="interp"),
     TypeError, ["input 'x'", "float32", "int32"]),
    ("p_two_targets", lambda: Program([BufferDecl("x", (4,), "float32")], [],
                                      {"a": _kernel("sm_90a"), "b": _kernel("sm_100a")}),
     ValueError, ["kernels", "one target", "sm_100a"]),
    ("p_unknown_kernel", lambda: Program([BufferDecl("x", (4,), "float32")],
                                         [Step("nope", (1, 1, 1), {"x": "x", "n": 4})],
                                         {"k": _kernel()}),
     ValueError, ["unknown kernel", "nope"]),
    ("p_buffer_dtype", lambda: BufferDecl("x", (4,), "bfloat17"), ValueError,
     ["buffer 'x'", "dtype", "bfloat17"]),
    ("p_buffer_shape", lambda: BufferDecl("x", (-1,), "float32"), ValueError,
     ["buffer 'x'", ">= 0", "(-1,)"]),
    ("p_load_not_dir", lambda: Program.load(__file__), ValueError, ["path", "plan.json"]),
    ("p_load_bad_json", lambda: Program.load(_bad_plan_dir("{not json")), ValueError,
     ["path", "plan.json", "valid"]),
    ("p_load_json_list", lambda: Program.load(_bad_plan_dir("[1, 2]")), ValueError,
     ["path", "JSON object", "list"]),
    ("dev_name", lambda: get_device("cuda:x"), ValueError, ["device", "cuda:x"]),
    ("dev_type", lambda: get_device(3), TypeError, ["device", "int"]),
    ("dev_launch_args", lambda: get_device("interp").launch(_kernel(), (1,),
                                                            [np.zeros(4, np.float32)]),
     ValueError, ["args", "'x'", "'n'"]),
    ("dev_launch_grid", lambda: get_device("interp").launch(_kernel(), (0, 1, 1),
                                                            [np.zeros(4, np.float32), 4]),
     ValueError, ["grid", ">= 1"]),
    ("dev_launch_scalar", lambda: get_device("interp").launch(_kernel(), (1,),
                                                              [np.zeros(4, np.float32), 2**40]),
     ValueError, ["'n'", "i32"]),
    ("dev_launch_strided", lambda: get_device("interp").launch(
        _kernel(), (1,), [np.zeros(8, np.float32)[::2], 4]), ValueError,
     ["'x'", "C-contiguous"]),
    ("dev_launch_dtype", lambda: get_device("interp").launch(_kernel(), (1,),
                                                             [np.zeros(4, np.float64), 4]),
     TypeError, ["'x'", "float32", "float64"]),
]

CASES = GRAPH_CASES + STRATEGY_CASES + RUNTIME_CASES


@pytest.mark.parametrize("thunk,exc,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_naming_argument(thunk, exc, needles):
    assert_raises_naming(thunk, exc, needles)


def test_case_ids_distinct():
    assert len({c[0] for c in CASES}) == len(CASES) >= 40


def test_graph_type_errors_are_value_errors():
    assert issubclass(GraphTypeError, ValueError)


def test_graph_valid_scalar_attributes_kept():
    """The finite checks do not change valid values: the graph evaluates like the reference."""
    g, x = _g()
    d, s = g.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=0.43)
    g.output(d, "d")
    g.output(s, "s")
    xv = _x()
    out = g.evaluate({"x": xv})
    rd, rs = ref.quantize_dynamic_block_scaled(xv, "nvfp4", tensor_sf=0.43)
    assert np.array_equal(out["d"].view(np.uint8), rd.view(np.uint8))
    assert np.array_equal(out["s"].view(np.uint8), rs.view(np.uint8))


# ---- CLI ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,needles", [
    (["compile", "block_scales_interleave", "--target", "sm_75"], ["target", "sm_75"]),
    (["compile", "no_such_op"], ["unknown op", "no_such_op"]),
    (["compile", "block_scales_interleave", "--dtype", "float32"], ["dtype", "float32"]),
])
def test_cli_bad_arguments_exit_2(argv, needles, capsys, monkeypatch):
    import blockscale.ops._core as core

    def forbidden(*a, **k):
        raise AssertionError("the CLI must reject the arguments before compiling")

    monkeypatch.setattr(core, "compile_kernel", forbidden)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err, err


def test_cli_bad_choice_is_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["compile", "block_scales_interleave", "--emit", "exe"])
    assert info.value.code == 2
    assert "--emit" in capsys.readouterr().err

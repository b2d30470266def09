"""Bad inputs to the numpy reference (blockscale.reference): every one raises ValueError or
TypeError whose message names the argument and says what was expected and what was given.

Each case is one distinct bad input; none may crash (IndexError, AttributeError, ...), hang or
return a result. Edge inputs that are *valid* (empty tensors) are checked to give correct
empty outputs rather than errors.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _validation_helpers import assert_raises_naming

from blockscale import reference as ref

BF16 = ml_dtypes.bfloat16


def _x(m=4, k=64, seed=0):
    return np.random.default_rng(seed).standard_normal((m, k)).astype(BF16)


def _q(fmt, m=4, k=64, **kw):
    return ref.quantize_dynamic_block_scaled(_x(m, k), fmt, **kw)


def _groups(t=6, g=2):
    es = np.array([0, 2, t], np.int32) if g == 2 else np.array([0, t], np.int32)
    return es, np.zeros(len(es) - 1, np.int32), np.arange(len(es) - 1, dtype=np.int32)


def _gq(x=None, fmt="nvfp4", es=None, offs=None, ids=None, tsf="default", **kw):
    x = _x(6, 64) if x is None else x
    d_es, d_offs, d_ids = _groups()
    tsf = np.ones(2, np.float32) if isinstance(tsf, str) else tsf
    return ref.grouped_quantize_dynamic_scaled(
        x, fmt, d_es if es is None else es, d_offs if offs is None else offs,
        d_ids if ids is None else ids, tsf, **kw)


def _mm(fmt="nvfp4", **over):
    a, sfa = _q(fmt, 4, 64)
    b, sfb = _q(fmt, 3, 64)
    args = dict(a=a, b=b, sfa=sfa, sfb=sfb, fmt=fmt, k=64)
    args.update(over)
    return ref.naive_block_scaled_matmul(args.pop("a"), args.pop("b"), args.pop("sfa"),
                                         args.pop("sfb"), args.pop("fmt"), **args)


def _gmm(fmt="nvfp4", **over):
    a, _ = _q(fmt, 6, 64)
    es, _, ids = _groups()
    # per-group padded scale tiles: group 0 at tile 0, group 1 at tile 1
    _, sfa = ref.grouped_quantize_dynamic_scaled(_x(6, 64), fmt, es, np.array([0, 1]), ids,
                                                 np.ones(2, np.float32) if fmt == "nvfp4"
                                                 else None)
    w = np.stack([_q(fmt, 8, 64)[0] for _ in range(2)])
    sfb = np.stack([_q(fmt, 8, 64)[1] for _ in range(2)])
    args = dict(a=a, w=w, sfa=sfa, sfb=sfb, expert_start=es, a_scale_offsets=np.array([0, 1]),
                expert_ids=ids, expert_scales=np.ones(2, np.float32), fmt=fmt, k=64)
    args.update(over)
    pos = [args.pop(n) for n in ("a", "w", "sfa", "sfb", "expert_start", "a_scale_offsets",
                                 "expert_ids", "expert_scales", "fmt")]
    return ref.grouped_matmul_block_scaled(*pos, **args)


def _silu(fmt="nvfp4", gate_up=None, **over):
    gu = _x(6, 128) if gate_up is None else gate_up
    es, offs, ids = _groups()
    args = dict(expert_start=es, scales_offsets=offs, expert_ids=ids,
                input_scales=np.ones(2, np.float32) if fmt == "nvfp4" else None)
    args.update(over)
    return ref.fused_silu_quantize(gu, fmt, args.pop("expert_start"), args.pop("scales_offsets"),
                                   args.pop("expert_ids"), args.pop("input_scales"), **args)


Q = ref.quantize_dynamic_block_scaled
NAN, INF = float("nan"), float("inf")

#: (id, thunk, exception type, substrings the message must contain)
CASES = [
    # ---- dense quantize
    ("x_list", lambda: Q([[1.0, 2.0]], "nvfp4"), TypeError, ["x", "list"]),
    ("x_1d", lambda: Q(np.ones(32, BF16), "nvfp4"), ValueError, ["x", "2-D", "(32,)"]),
    ("x_3d", lambda: Q(np.ones((2, 2, 32), BF16), "nvfp4"), ValueError, ["x", "2-D"]),
    ("x_float16", lambda: Q(np.ones((2, 32), np.float16), "nvfp4"), TypeError,
     ["x", "float16", "bfloat16"]),
    ("x_int", lambda: Q(np.ones((2, 32), np.int32), "mxfp8"), TypeError, ["x", "int32"]),
    ("k_odd_nvfp4", lambda: Q(_x(2, 15), "nvfp4"), ValueError, ["x.shape[1]", "even", "15"]),
    ("k_odd_mxfp4", lambda: Q(_x(2, 33), "mxfp4"), ValueError, ["x.shape[1]", "33"]),
    ("fmt_unknown", lambda: Q(_x(), "nvfp8"), ValueError, ["fmt", "nvfp8", "mxfp4"]),
    ("fmt_int", lambda: Q(_x(), 4), TypeError, ["fmt", "int"]),
    ("tsf_nan", lambda: Q(_x(), "nvfp4", tensor_sf=NAN), ValueError, ["tensor_sf", "nan"]),
    ("tsf_inf", lambda: Q(_x(), "nvfp4", tensor_sf=INF), ValueError, ["tensor_sf", "inf"]),
    ("tsf_zero", lambda: Q(_x(), "nvfp4", tensor_sf=0.0), ValueError, ["tensor_sf", "0.0"]),
    ("tsf_negative", lambda: Q(_x(), "nvfp4", tensor_sf=-2.0), ValueError, ["tensor_sf", "-2.0"]),
    ("tsf_str", lambda: Q(_x(), "nvfp4", tensor_sf="1"), TypeError, ["tensor_sf", "str"]),
    ("tsf_bool", lambda: Q(_x(), "nvfp4", tensor_sf=True), TypeError, ["tensor_sf", "bool"]),
    ("tsf_with_mxfp4", lambda: Q(_x(), "mxfp4", tensor_sf=2.0), ValueError,
     ["tensor_sf", "1.0", "mxfp4", "2.0"]),
    ("tsf_with_mxfp8", lambda: Q(_x(), "mxfp8", tensor_sf=0.5), ValueError,
     ["tensor_sf", "mxfp8", "0.5"]),
    ("rounding_unknown", lambda: Q(_x(), "mxfp4", scale_rounding="nearest"), ValueError,
     ["scale_rounding", "nearest", "up"]),
    ("rounding_nvfp4", lambda: Q(_x(), "nvfp4", scale_rounding="up"), ValueError,
     ["scale_rounding", "None", "nvfp4"]),
    ("layout_unknown", lambda: Q(_x(), "nvfp4", scale_layout="swizzled"), ValueError,
     ["scale_layout", "swizzled", "tcgen5d"]),
    # ---- dequantize
    ("deq_k_mismatch", lambda: ref.dequantize_block_scaled(*_q("nvfp4"), "nvfp4", k=62),
     ValueError, ["k", "62", "32"]),
    ("deq_k_float", lambda: ref.dequantize_block_scaled(*_q("nvfp4"), "nvfp4", k=64.0),
     TypeError, ["k", "float"]),
    ("deq_scales_shape", lambda: ref.dequantize_block_scaled(
        _q("nvfp4")[0], _q("nvfp4", scale_layout="row_major")[1], "nvfp4", k=64),
     ValueError, ["scales", "(1, 1, 32, 4, 4)", "(4, 4)"]),
    ("deq_scales_dtype", lambda: ref.dequantize_block_scaled(
        _q("nvfp4")[0], _q("mxfp4")[1], "nvfp4", k=64), TypeError,
     ["scales", "float8_e8m0fnu", "float8_e4m3fn"]),
    ("deq_data_dtype", lambda: ref.dequantize_block_scaled(
        _q("mxfp8")[0], _q("mxfp4")[1], "mxfp4", k=64), TypeError, ["data", "float8_e4m3fn"]),
    # ---- dense matmul
    ("mm_b_cols", lambda: _mm(b=_q("nvfp4", 3, 32)[0]), ValueError, ["b.shape[1]", "32", "16"]),
    ("mm_k_wrong", lambda: _mm(k=32), ValueError, ["k", "32"]),
    ("mm_alpha_nan", lambda: _mm(alpha=NAN), ValueError, ["alpha", "nan"]),
    ("mm_alpha_inf", lambda: _mm(alpha=-INF), ValueError, ["alpha", "inf"]),
    ("mm_out_dtype", lambda: _mm(out_dtype="float16"), ValueError, ["out_dtype", "float16"]),
    ("mm_sfa_rowmajor", lambda: _mm(sfa=_q("nvfp4", 4, 64, scale_layout="row_major")[1]),
     ValueError, ["sfa", "(1, 1, 32, 4, 4)", "(4, 4)"]),
    ("mm_sfb_mx_dtype", lambda: _mm(sfb=_q("mxfp4", 3, 64)[1]), TypeError,
     ["sfb", "float8_e8m0fnu"]),
    ("mm_a_fmt_mismatch", lambda: _mm(fmt="mxfp8", a=np.zeros((4, 64), np.uint8)), TypeError,
     ["a", "float8_e4m3fn", "uint8"]),
    # ---- grouped quantize
    ("gq_es_not_monotonic", lambda: _gq(es=np.array([0, 5, 3, 6]), offs=np.zeros(3, np.int32),
                                        ids=np.array([0, 1, -1])),
     ValueError, ["expert_start", "non-decreasing", "[0, 5, 3, 6]"]),
    ("gq_es_total", lambda: _gq(es=np.array([0, 2, 5])), ValueError,
     ["expert_start[-1]", "6", "5"]),
    ("gq_es_start", lambda: _gq(es=np.array([1, 2, 6])), ValueError, ["expert_start[0]", "1"]),
    ("gq_es_float", lambda: _gq(es=np.array([0.0, 2.0, 6.0])), TypeError,
     ["expert_start", "float64"]),
    ("gq_ids_length", lambda: _gq(ids=np.array([0, 1, 1])), ValueError,
     ["expert_ids", "length 2", "3"]),
    ("gq_ids_minus2", lambda: _gq(ids=np.array([0, -2])), ValueError, ["expert_ids", "-2"]),
    ("gq_ids_beyond_tsf", lambda: _gq(ids=np.array([0, 2])), ValueError,
     ["expert_ids", "len(tensor_sf)=2", "2"]),
    ("gq_nvfp4_no_tsf", lambda: _gq(tsf=None), ValueError, ["tensor_sf", "NVFP4", "None"]),
    ("gq_mx_tsf_not_one", lambda: _gq(fmt="mxfp8", tsf=np.array([1.0, 2.0], np.float32)),
     ValueError, ["tensor_sf", "mxfp8", "2.0"]),
    ("gq_tsf_nan", lambda: _gq(tsf=np.array([1.0, NAN], np.float32)), ValueError,
     ["tensor_sf", "finite", "nan"]),
    ("gq_tsf_2d", lambda: _gq(tsf=np.ones((2, 1), np.float32)), TypeError,
     ["tensor_sf", "1-D", "(2, 1)"]),
    ("gq_offsets_overlap", lambda: _gq(es=np.array([0, 130, 200]), x=_x(200, 32),
                                       offs=np.array([0, -1])),
     ValueError, ["scales_offsets", "overlap"]),
    ("gq_offsets_outside", lambda: _gq(offs=np.array([0, 7])), ValueError,
     ["scales_offsets[1]", "outside"]),
    ("gq_indices_range", lambda: _gq(indices=np.array([0, 1, 2, 3, 4, 60])), ValueError,
     ["indices", "[0, 6)", "60"]),
    ("gq_indices_negative", lambda: _gq(indices=np.array([0, 1, 2, 3, 4, -1])), ValueError,
     ["indices", "[0, 6)", "-1"]),
    ("gq_divisor_zero", lambda: _gq(indices=np.arange(6), indices_divisor=0), ValueError,
     ["indices_divisor", "positive", "0"]),
    ("gq_divisor_without_indices", lambda: _gq(indices_divisor=2), ValueError,
     ["indices_divisor", "without indices", "2"]),
    # ---- fused silu quantize
    ("silu_odd_cols", lambda: _silu(gate_up=_x(6, 129)), ValueError,
     ["gate_up.shape[1]", "even", "129"]),
    ("silu_d_odd_fp4", lambda: _silu(gate_up=_x(6, 30)), ValueError,
     ["gate_up.shape[1] // 2", "15"]),
    ("silu_activation", lambda: _silu(activation="gelu"), ValueError, ["activation", "gelu"]),
    ("silu_input_scales_zero", lambda: _silu(input_scales=np.array([1.0, 0.0], np.float32)),
     ValueError, ["input_scales", "> 0"]),
    ("silu_mx_input_scales", lambda: _silu(fmt="mxfp8",
                                           input_scales=np.array([3.0, 1.0], np.float32)),
     ValueError, ["input_scales", "mxfp8", "3.0"]),
    # ---- grouped matmul
    ("gmm_ids_beyond_E", lambda: _gmm(expert_ids=np.array([0, 2])), ValueError,
     ["expert_ids", "num_experts=2", "2"]),
    ("gmm_es_total", lambda: _gmm(expert_start=np.array([0, 2, 7])), ValueError,
     ["expert_start[-1]", "6", "7"]),
    ("gmm_expert_scales_nan", lambda: _gmm(expert_scales=np.array([1.0, NAN], np.float32)),
     ValueError, ["expert_scales", "finite", "nan"]),
    ("gmm_expert_scales_len", lambda: _gmm(expert_scales=np.ones(3, np.float32)), ValueError,
     ["expert_scales", "length 2", "3"]),
    ("gmm_nvfp4_no_expert_scales", lambda: _gmm(expert_scales=None), ValueError,
     ["expert_scales", "NVFP4", "None"]),
    ("gmm_row_scales_mx", lambda: _gmm(fmt="mxfp8", a_row_scales=np.ones(6, BF16)), ValueError,
     ["a_row_scales", "mxfp8"]),
    ("gmm_offsets_outside", lambda: _gmm(a_scale_offsets=np.array([0, 5])), ValueError,
     ["a_scale_offsets[1]", "outside"]),
    ("gmm_w_2d", lambda: _gmm(w=_q("nvfp4", 8, 64)[0]), ValueError, ["w", "3-D"]),
    # ---- interleave, moe indices
    ("interleave_3d", lambda: ref.block_scales_interleave(np.zeros((2, 2, 2), np.uint8)),
     ValueError, ["scales_2d", "2-D", "(2, 2, 2)"]),
    ("interleave_float32", lambda: ref.block_scales_interleave(np.zeros((2, 2), np.float32)),
     TypeError, ["scales_2d", "1-byte", "float32"]),
    ("deinterleave_rows", lambda: ref.block_scales_deinterleave(
        np.zeros((1, 1, 32, 4, 4), np.uint8), 300, 4), ValueError, ["scales_5d", "300"]),
    ("topk_out_of_range", lambda: ref.moe_create_indices(np.array([0, 4, 1]), 4), ValueError,
     ["topk_ids", "[0, 4)", "4"]),
    ("num_experts_zero", lambda: ref.moe_create_indices(np.array([0]), 0), ValueError,
     ["num_experts", "0"]),
]


@pytest.mark.parametrize("thunk,exc,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_naming_argument(thunk, exc, needles):
    err = assert_raises_naming(thunk, exc, needles)
    assert type(err) is exc or issubclass(type(err), exc)


def test_case_ids_distinct():
    assert len({c[0] for c in CASES}) == len(CASES) >= 60


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_empty_tensors_give_empty_outputs(fmt):
    """M = 0 and K = 0 are valid: outputs of the documented shapes, zero-filled scales."""
    d, s = Q(np.zeros((0, 64), BF16), fmt)
    assert d.shape == (0, 32 if fmt != "mxfp8" else 64) and s.shape[0] == 0
    d, s = Q(np.zeros((3, 0), BF16), fmt)
    assert d.shape == (3, 0) and s.shape == (1, 0, 32, 4, 4)
    d, s = Q(np.zeros((3, 0), BF16), fmt, scale_layout="row_major")
    assert s.shape == (3, 0)


def test_non_contiguous_input_is_not_reinterpreted():
    """A strided view quantizes exactly like its contiguous copy."""
    big = _x(8, 128, seed=3)
    view = big[::2, ::2]
    assert not view.flags.c_contiguous
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        d1, s1 = Q(view, fmt)
        d2, s2 = Q(np.ascontiguousarray(view), fmt)
        assert np.array_equal(d1.view(np.uint8), d2.view(np.uint8))
        assert np.array_equal(s1.view(np.uint8), s2.view(np.uint8))

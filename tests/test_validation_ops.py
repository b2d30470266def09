"""Bad inputs to the compiled ops (blockscale.ops) are rejected on the host, BEFORE any kernel
is looked up, compiled or launched: ``_core.get_kernel`` / ``compile_kernel`` / ``run_kernel``
are replaced by functions that fail the test if reached. Every error is a ValueError or
TypeError whose message names the argument with the expected and the actual value.

Also covered: device memory the chosen device cannot use (numpy-only interpreter, strided
torch / __cuda_array_interface__ memory on a GPU device) and a target that cannot run on the
chosen device. The GPU device here is a stand-in object (no GPU needed): the checks under
test are the host-side ones, which never touch the driver.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from _validation_helpers import assert_raises_naming

from blockscale import reference as ref
from blockscale.ops import _core
from blockscale.ops import interleave as IL
from blockscale.ops import matmul as MM
from blockscale.ops import matmul_grouped as MG
from blockscale.ops import quantize as Q
from blockscale.ops import quantize_amd as QA
from blockscale.ops import quantize_grouped as QG
from blockscale.ops import quantize_silu as QS
from blockscale.runtime.device import Device

BF16 = ml_dtypes.bfloat16
NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def no_compile(monkeypatch):
    def forbidden(*a: Any, **k: Any) -> Any:
        raise AssertionError("validation must happen before a kernel is fetched or compiled")

    for name in ("get_kernel", "compile_kernel", "run_kernel"):
        monkeypatch.setattr(_core, name, forbidden)


# ---- stand-ins for device memory and a GPU device ----------------------------------------------


class FakeCudaDevice(Device):
    """Looks like an H200 to the host checks; any driver call fails the test."""

    name = "cuda"
    binary_kind = "cubin"
    capability = (9, 0)

    def _no(self, *a: Any, **k: Any) -> Any:
        raise AssertionError("the driver must not be reached")

    launch = alloc = to_device = to_host = synchronize = zeros = _no


class FakeTorchCuda:
    """Duck-typed like a torch CUDA tensor (the runtime never imports torch)."""

    __module__ = "torch"

    def __init__(self, shape, dtype="torch.bfloat16", contiguous=True, cuda=True):
        self.shape, self.dtype, self._c, self.is_cuda = tuple(shape), dtype, contiguous, cuda
        self.device = "cuda:0" if cuda else "cpu"

    def is_contiguous(self):
        return self._c

    def stride(self):
        return (1, self.shape[0]) if not self._c else (self.shape[1], 1)

    def data_ptr(self):
        return 0x10000


class FakeCai:
    """An object exposing ``__cuda_array_interface__`` (CuPy / numba style)."""

    def __init__(self, shape, typestr="|u1", strides=None):
        self.shape, self.dtype = tuple(shape), np.dtype(typestr)
        self._cai = {"shape": self.shape, "typestr": typestr, "data": (0x10000, False),
                     "strides": strides, "version": 3}

    @property
    def __cuda_array_interface__(self):
        return self._cai


# ---- valid inputs ------------------------------------------------------------------------------


def _x(m=4, k=64, seed=0):
    return np.random.default_rng(seed).standard_normal((m, k)).astype(BF16)


def _q(fmt, m=4, k=64, **kw):
    return ref.quantize_dynamic_block_scaled(_x(m, k), fmt, **kw)


def _call(fn, pos, kw, over):
    kw = {**kw, **over}
    args = [kw.pop(n) for n in pos]
    return fn(*args, **kw)


def _quant(**over):
    return _call(Q.quantize_dynamic_block_scaled, ["x", "fmt"],
                 dict(x=_x(), fmt="nvfp4", device="interp", target="sm_90a"), over)


def _gq(**over):
    kw = dict(x=_x(6, 64), fmt="nvfp4", expert_start=np.array([0, 2, 6], np.int32),
              scales_offsets=np.array([0, 1], np.int32), expert_ids=np.array([0, 1], np.int32),
              tensor_sf=np.ones(2, np.float32), device="interp", target="sm_90a")
    return _call(QG.grouped_quantize_dynamic_scaled,
                 ["x", "fmt", "expert_start", "scales_offsets", "expert_ids", "tensor_sf"],
                 kw, over)


def _silu(**over):
    kw = dict(gate_up=_x(6, 128), fmt="nvfp4", expert_start=np.array([0, 2, 6], np.int32),
              scales_offsets=np.array([0, 1], np.int32), expert_ids=np.array([0, 1], np.int32),
              input_scales=np.ones(2, np.float32), device="interp", target="sm_90a")
    return _call(QS.fused_silu_quantize,
                 ["gate_up", "fmt", "expert_start", "scales_offsets", "expert_ids",
                  "input_scales"], kw, over)


def _mm(fn=MM.naive_block_scaled_matmul, fmt="nvfp4", **over):
    a, sfa = _q(fmt, 4, 64)
    b, sfb = _q(fmt, 3, 64)
    kw = dict(a=a, b=b, sfa=sfa, sfb=sfb, fmt=fmt, device="interp", target="sm_90a")
    return _call(fn, ["a", "b", "sfa", "sfb", "fmt"], kw, over)


def _amd_mm(**over):
    a, sa = ref.quantize_mxfp4_amd(_x(4, 64))
    b, sb = ref.quantize_mxfp4_amd(_x(3, 64, 1))
    kw = dict(a=a, b=b, a_scales=sa, b_scales=sb, device="interp", target="gfx950")
    return _call(MM.matmul_dynamic_block_scaled_mxfp4, ["a", "b", "a_scales", "b_scales"], kw,
                 over)


def _gmm(fmt="nvfp4", **over):
    es, ids = np.array([0, 2, 6], np.int32), np.array([0, 1], np.int32)
    a, sfa = ref.grouped_quantize_dynamic_scaled(
        _x(6, 64), fmt, es, np.array([0, 1]), ids,
        np.ones(2, np.float32) if fmt == "nvfp4" else None)
    w = np.stack([_q(fmt, 8, 64, )[0]] * 2)
    sfb = np.stack([_q(fmt, 8, 64)[1]] * 2)
    kw = dict(hidden=a, weight=w, a_scales=sfa, b_scales=sfb, expert_start=es,
              a_scale_offsets=np.array([0, 1], np.int32), expert_ids=ids,
              expert_scales=np.ones(2, np.float32), fmt=fmt, device="interp", target="sm_90a")
    return _call(MG.grouped_matmul_block_scaled,
                 ["hidden", "weight", "a_scales", "b_scales", "expert_start", "a_scale_offsets",
                  "expert_ids", "expert_scales", "fmt"], kw, over)


def _il(scales, **kw):
    return IL.block_scales_interleave(scales, **{"device": "interp", "target": "sm_90a", **kw})


ES3 = dict(expert_start=np.array([0, 2, 6], np.int32))
CUDA = FakeCudaDevice()

#: (id, thunk, exception type, substrings the message must contain)
CASES = [
    # ---- dense quantize
    ("q_x_float32", lambda: _quant(x=np.ones((4, 64), np.float32)), TypeError,
     ["x", "bfloat16", "float32"]),
    ("q_x_3d", lambda: _quant(x=np.ones((1, 4, 64), BF16)), ValueError, ["x", "2", "(1, 4, 64)"]),
    ("q_x_list", lambda: _quant(x=[[1.0] * 64]), TypeError, ["x", "list"]),
    ("q_k_odd", lambda: _quant(x=_x(4, 63)), ValueError, ["x.shape[1]", "even", "63"]),
    ("q_fmt", lambda: _quant(fmt="fp4"), ValueError, ["fmt", "fp4", "nvfp4"]),
    ("q_tsf_nan", lambda: _quant(tensor_sf=NAN), ValueError, ["tensor_sf", "nan"]),
    ("q_tsf_inf", lambda: _quant(tensor_sf=INF), ValueError, ["tensor_sf", "inf"]),
    ("q_tsf_f32_overflow", lambda: _quant(tensor_sf=1e39), ValueError, ["tensor_sf", "1e+39"]),
    ("q_tsf_negative", lambda: _quant(tensor_sf=-1.0), ValueError, ["tensor_sf", "> 0", "-1.0"]),
    ("q_tsf_mx", lambda: _quant(fmt="mxfp4", tensor_sf=4.0), ValueError,
     ["tensor_sf", "1.0", "mxfp4", "4.0"]),
    ("q_tsf_none", lambda: _quant(tensor_sf=None), TypeError, ["tensor_sf", "NoneType"]),
    ("q_rounding", lambda: _quant(fmt="mxfp8", scale_rounding="down"), ValueError,
     ["scale_rounding", "down"]),
    ("q_layout", lambda: _quant(scale_layout="5d"), ValueError, ["scale_layout", "5d"]),
    ("q_target", lambda: _quant(target="sm_75"), ValueError, ["target", "sm_75", "sm_90a"]),
    ("q_device", lambda: _quant(device="tpu"), ValueError, ["device", "tpu", "interp"]),
    ("q_async_k64", lambda: Q.quantize_dynamic_scaled_fp4_async(_x(4, 96), device="interp"),
     ValueError, ["x.shape[1]", "64", "96"]),
    ("q_fp4fp8_tsf_mx", lambda: Q.quantize_dynamic_scaled_fp4fp8(
        _x(), "mxfp8", tensor_sf=2.0, device="interp"), ValueError, ["tensor_sf", "mxfp8"]),
    ("q_amd_k32", lambda: QA.quantize_mxfp4_amd(_x(4, 48), device="interp"), ValueError,
     ["x.shape[1]", "32", "48"]),
    ("q_amd_flat_count", lambda: QA.quantize_dynamic_block_scaled_mxfp4(_x(3, 10),
                                                                        device="interp"),
     ValueError, ["x", "32", "30"]),
    # ---- grouped quantize
    ("gq_es_not_monotonic", lambda: _gq(expert_start=np.array([0, 4, 2], np.int32)),
     ValueError, ["expert_start", "[0, 4, 2]"]),
    ("gq_es_total", lambda: _gq(expert_start=np.array([0, 2, 5], np.int32)), ValueError,
     ["expert_start", "6", "[0, 2, 5]"]),
    ("gq_es_length", lambda: _gq(expert_start=np.array([0, 6], np.int32)), ValueError,
     ["expert_start", "3 entries", "2"]),
    ("gq_es_float", lambda: _gq(expert_start=np.array([0.0, 2.0, 6.0])), TypeError,
     ["expert_start", "integer", "float64"]),
    ("gq_ids_minus2", lambda: _gq(expert_ids=np.array([0, -2], np.int32)), ValueError,
     ["expert_ids", "-1", "-2"]),
    ("gq_ids_beyond_tsf", lambda: _gq(expert_ids=np.array([0, 5], np.int32)), ValueError,
     ["expert_ids", "len(tensor_sf)=2", "5"]),
    ("gq_ids_beyond_mx_tsf", lambda: _gq(fmt="mxfp4", tensor_sf=np.ones(2, np.float32),
                                         expert_ids=np.array([0, 2], np.int32)), ValueError,
     ["expert_ids", "len(tensor_sf)=2", "2"]),
    ("gq_ids_list", lambda: _gq(expert_ids=[0, 1]), TypeError, ["expert_ids", "list"]),
    ("gq_ids_scalar", lambda: _gq(expert_ids=np.int32(0)), TypeError, ["expert_ids", "()"]),
    ("gq_tsf_none", lambda: _gq(tensor_sf=None), ValueError, ["tensor_sf", "NVFP4", "None"]),
    ("gq_tsf_nan", lambda: _gq(tensor_sf=np.array([1.0, NAN], np.float32)), ValueError,
     ["tensor_sf", "finite", "nan"]),
    ("gq_tsf_2d", lambda: _gq(tensor_sf=np.ones((1, 2), np.float32)), TypeError,
     ["tensor_sf", "1-D", "(1, 2)"]),
    ("gq_tsf_mx_not_one", lambda: _gq(fmt="mxfp8", tensor_sf=np.full(2, 0.5, np.float32)),
     ValueError, ["tensor_sf", "mxfp8", "0.5"]),
    ("gq_offsets_outside", lambda: _gq(scales_offsets=np.array([0, 9], np.int32)), ValueError,
     ["scales_offsets[1]", "<= 3"]),
    ("gq_offsets_overlap", lambda: _gq(x=_x(200, 32), expert_start=np.array([0, 130, 200],
                                                                           np.int32),
                                       scales_offsets=np.array([0, -1], np.int32)),
     ValueError, ["scales_offsets[1]", ">= 2"]),
    ("gq_indices_range", lambda: _gq(indices=np.array([0, 1, 2, 3, 4, 6], np.int32)),
     ValueError, ["indices", "[0, 6)", "6"]),
    ("gq_indices_2d", lambda: _gq(indices=np.zeros((6, 1), np.int32)), TypeError,
     ["indices", "(6, 1)"]),
    ("gq_divisor", lambda: _gq(indices=np.arange(6, dtype=np.int32), indices_divisor=-3),
     ValueError, ["indices_divisor", "-3"]),
    ("gq_divisor_no_indices", lambda: _gq(indices_divisor=2), ValueError,
     ["indices_divisor", "2"]),
    ("gq_k_odd", lambda: _gq(x=_x(6, 31)), ValueError, ["x.shape[1]", "31"]),
    # ---- fused silu quantize
    ("silu_odd", lambda: _silu(gate_up=_x(6, 127)), ValueError, ["gate_up.shape[1]", "127"]),
    ("silu_d_odd_fp4", lambda: _silu(gate_up=_x(6, 62)), ValueError,
     ["gate_up.shape[1] // 2", "31"]),
    ("silu_activation", lambda: _silu(activation="relu"), ValueError, ["activation", "relu"]),
    ("silu_scales_negative", lambda: _silu(input_scales=np.array([1.0, -1.0], np.float32)),
     ValueError, ["input_scales", "> 0"]),
    ("silu_scales_missing", lambda: _silu(input_scales=None), ValueError,
     ["input_scales", "NVFP4", "None"]),
    ("silu_tiles_negative", lambda: _silu(num_scale_tiles=-1), ValueError,
     ["num_scale_tiles", "-1"]),
    ("silu_tiles_too_few", lambda: _silu(num_scale_tiles=1), ValueError,
     ["scales_offsets[1]", "<= 1"]),
    ("silu_x_dtype", lambda: _silu(gate_up=np.ones((6, 128), np.float16)), TypeError,
     ["gate_up", "bfloat16", "float16"]),
    # ---- interleave
    ("il_3d", lambda: _il(np.zeros((2, 2, 2), np.uint8)), ValueError,
     ["scales_2d", "rank 2", "(2, 2, 2)"]),
    ("il_dtype", lambda: _il(np.zeros((4, 4), np.float32)), TypeError,
     ["scales_2d", "1-byte", "float32"]),
    ("il_target", lambda: _il(np.zeros((4, 4), np.uint8), target="gfx90a"), ValueError,
     ["target", "gfx90a"]),
    # ---- dense matmul
    ("mm_a_dtype", lambda: _mm(a=np.zeros((4, 64), ml_dtypes.float8_e4m3fn)), TypeError,
     ["a", "uint8", "float8_e4m3fn"]),
    ("mm_b_cols", lambda: _mm(b=_q("nvfp4", 3, 32)[0]), ValueError,
     ["b.shape[1]", "32", "16"]),
    ("mm_k", lambda: _mm(k=60), ValueError, ["a.shape[1]", "30", "32"]),
    ("mm_sfa_shape", lambda: _mm(sfa=_q("nvfp4", 200, 64)[1]), ValueError,
     ["sfa", "(1, 1, 32, 4, 4)", "(2, 1, 32, 4, 4)"]),
    ("mm_sfb_dtype", lambda: _mm(sfb=_q("mxfp4", 3, 64)[1]), TypeError,
     ["sfb", "float8_e4m3fn", "float8_e8m0fnu"]),
    ("mm_sfa_rowmajor", lambda: _mm(sfa=_q("nvfp4", 4, 64, scale_layout="row_major")[1]),
     ValueError, ["sfa", "(1, 1, 32, 4, 4)", "(4, 4)"]),
    ("mm_alpha_nan", lambda: _mm(alpha=NAN), ValueError, ["alpha", "nan"]),
    ("mm_alpha_inf", lambda: _mm(fn=MM.block_scaled_matmul, alpha=INF), ValueError,
     ["alpha", "inf"]),
    ("mm_alpha_str", lambda: _mm(alpha="2"), TypeError, ["alpha", "str"]),
    ("mm_out_dtype", lambda: _mm(out_dtype="float16"), ValueError, ["out_dtype", "float16"]),
    ("mm_epilogue_type", lambda: _mm(fn=MM.block_scaled_matmul_with_epilogue, epilogue=3),
     TypeError, ["epilogue", "int"]),
    ("mm_amd_k32", lambda: _amd_mm(a=np.zeros((4, 8), np.uint8), b=np.zeros((3, 8), np.uint8)),
     ValueError, ["b.shape[1]", "32", "16"]),
    ("mm_amd_scales", lambda: _amd_mm(a_scales=np.zeros((4, 1), ml_dtypes.float8_e8m0fnu)),
     ValueError, ["a_scales", "(4, 2)", "(4, 1)"]),
    # ---- grouped matmul
    ("gmm_ids_beyond_E", lambda: _gmm(expert_ids=np.array([0, 2], np.int32)), ValueError,
     ["expert_ids", "[0, 2)", "[0, 2]"]),
    ("gmm_es_total", lambda: _gmm(expert_start=np.array([0, 2, 5], np.int32)), ValueError,
     ["expert_start[-1]", "T=6", "5"]),
    ("gmm_expert_scales_nan", lambda: _gmm(expert_scales=np.array([NAN, 1], np.float32)),
     ValueError, ["expert_scales", "finite", "nan"]),
    ("gmm_expert_scales_inf", lambda: _gmm(expert_scales=np.array([1, INF], np.float32)),
     ValueError, ["expert_scales", "finite", "inf"]),
    ("gmm_expert_scales_len", lambda: _gmm(expert_scales=np.ones(3, np.float32)), ValueError,
     ["expert_scales", "(2,)", "(3,)"]),
    ("gmm_row_scales_mx", lambda: _gmm(fmt="mxfp8", a_row_scales=np.ones(6, BF16)), ValueError,
     ["a_row_scales", "mxfp8"]),
    ("gmm_offsets_outside", lambda: _gmm(a_scale_offsets=np.array([0, 4], np.int32)),
     ValueError, ["a_scale_offsets[1]", "outside"]),
    ("gmm_weight_k", lambda: _gmm(weight=np.zeros((2, 8, 16), np.uint8)), ValueError,
     ["weight.shape[2]", "32", "16"]),
    # ---- device memory and targets
    ("dev_interp_gets_device_memory", lambda: _il(FakeCai((4, 4))), TypeError,
     ["scales_2d", "interp", "FakeCai"]),
    ("dev_cuda_strided_cai", lambda: IL.block_scales_interleave(
        FakeCai((4, 8), strides=(32, 1)), device=CUDA), ValueError,
     ["scales_2d", "C-contiguous", "(32, 1)"]),
    ("dev_cuda_strided_torch", lambda: _quant(x=FakeTorchCuda((4, 64), contiguous=False),
                                              device=CUDA), ValueError,
     ["x", "C-contiguous", "(1, 4)"]),
    ("dev_cuda_cpu_torch", lambda: _quant(x=FakeTorchCuda((4, 64), cuda=False), device=CUDA),
     ValueError, ["x", "CUDA tensor", "cpu"]),
    ("dev_interp_torch", lambda: _quant(x=FakeTorchCuda((4, 64))), TypeError,
     ["x", "interp", "FakeTorchCuda"]),
    ("dev_cuda_hip_target", lambda: _quant(device=CUDA, target="gfx950"), ValueError,
     ["target", "gfx950", "hsaco", "cubin"]),
    ("dev_cuda_newer_arch", lambda: _mm(device=CUDA, target="sm_100a"), ValueError,
     ["target", "sm_100a", "(9, 0)"]),
    ("dev_cuda_arch_interleave", lambda: IL.block_scales_interleave(
        np.zeros((4, 4), np.uint8), device=CUDA, target="sm_100a"), ValueError,
     ["target", "sm_100a"]),
    ("dev_interp_matmul_device_sfa", lambda: _mm(sfa=FakeCai((1, 1, 32, 4, 4),
                                                             typestr="|u1")), TypeError,
     ["sfa", "float8_e4m3fn", "uint8"]),
]


@pytest.mark.parametrize("thunk,exc,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_rejected_before_compiling(thunk, exc, needles):
    assert_raises_naming(thunk, exc, needles)


def test_case_ids_distinct():
    assert len({c[0] for c in CASES}) == len(CASES) >= 60


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_empty_tensors_need_no_kernel(fmt):
    """M = 0 or K = 0: outputs of the reference's shapes, all zero, without a launch."""
    for m, k in ((0, 64), (5, 0)):
        x = np.zeros((m, k), BF16)
        d, s = Q.quantize_dynamic_block_scaled(x, fmt, device="interp", target="sm_90a")
        rd, rs = ref.quantize_dynamic_block_scaled(x, fmt)
        assert d.shape == rd.shape and s.shape == rs.shape
        assert not d.view(np.uint8).any() and not s.view(np.uint8).any()
    d, s = QG.grouped_quantize_dynamic_scaled(
        np.zeros((0, 64), BF16), fmt, np.zeros(3, np.int32), np.zeros(2, np.int32),
        np.array([0, 1], np.int32), np.ones(2, np.float32) if fmt == "nvfp4" else None,
        device="interp", target="sm_90a")
    assert d.shape[0] == 0 and s.shape[0] == 0


def test_empty_matmul_needs_no_kernel():
    a, sfa = _q("mxfp8", 0, 64)
    b, sfb = _q("mxfp8", 3, 64)
    c = MM.naive_block_scaled_matmul(a, b, sfa, sfb, "mxfp8", device="interp", target="sm_90a")
    assert c.shape == (0, 3)

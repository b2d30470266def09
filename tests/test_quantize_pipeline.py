"""The pipelined dense quantize kernel (``QuantizeSpec.pipeline`` 1-3) in the interpreter.

Byte for byte against blockscale.reference on all four targets, with the launch sized for one
SM (``Q.SMS = 1``) so every block loops over several row groups: the prefetched words are
carried across iterations and the prefetch past the last row group reads row 0. Inputs carry
ties, -0, near-zero rows and NaN / Inf blocks (``_edge_input``), padding rows (M % 128 != 0),
padding K-blocks of the 5-D layout and MX blocks half past K (K % 32 == 16).
"""

from __future__ import annotations

import pytest
from _quantize_helpers import assert_same_bytes
from _quantize_inputs import _all_bf16_blocks, _edge_input

from blockscale import reference as ref

pytest.importorskip("mlir")

from blockscale.ops import quantize as Q

pytestmark = pytest.mark.interp
TARGETS = ("sm_90a", "sm_100a", "gfx942", "gfx950")
CASES = ((258, 144, "tcgen5d"), (700, 48, "row_major"), (33, 2064, "tcgen5d"))


def _check(x, fmt, pipeline, target, layout):
    tsf = 0.43 if fmt == "nvfp4" else 1.0
    d, s = Q.quantize_dense_variant(x, fmt, pipeline=pipeline, tensor_sf=tsf, device="interp",
                                    target=target, scale_layout=layout)
    rd, rs = ref.quantize_dynamic_block_scaled(x, fmt, tensor_sf=tsf, scale_layout=layout)
    assert_same_bytes(d, rd, f"{fmt} p{pipeline} {target} data")
    assert_same_bytes(s, rs, f"{fmt} p{pipeline} {target} scales")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("pipeline", [1, 2, 3])
def test_pipelined_matches_reference(monkeypatch, pipeline, fmt, target):
    monkeypatch.setattr(Q, "SMS", 1)
    for m, k, layout in CASES:
        spec = Q.QuantizeSpec(fmt, target, None, layout, True, pipeline=pipeline)
        grid, scal = Q.launch_plan(spec, m, k, -(-m // 128))
        rows_per_group = 256 >> scal["cb_log2"]
        assert grid[1] < -(-m // 128) * 128 // rows_per_group  # blocks loop (>1 row group)
        _check(_edge_input(m, k, m + k), fmt, pipeline, target, layout)


def test_pipelined_one_wave_grid():
    """Without the one-SM override a 8192^2 launch is one resident wave on an H200."""
    for p, per_sm in Q.PIPELINE_BLOCKS_PER_SM.items():
        spec = Q.QuantizeSpec("nvfp4", "sm_90a", pipeline=p)
        grid, _ = Q.launch_plan(spec, 8192, 8192, 64)
        assert grid[0] * grid[1] == 132 * per_sm


def test_pipelined_bad_arguments():
    with pytest.raises(ValueError, match="pipeline must be one of"):
        Q.QuantizeSpec("nvfp4", "sm_90a", pipeline=4)
    with pytest.raises(TypeError, match="pipeline must be an int"):
        Q.QuantizeSpec("nvfp4", "sm_90a", pipeline=True)
    with pytest.raises(ValueError, match="aligned=True"):
        Q.QuantizeSpec("nvfp4", "sm_90a", aligned=False, pipeline=1)
    with pytest.raises(ValueError, match="mode 'dense'"):
        Q.QuantizeSpec("nvfp4", "sm_90a", mode="grouped", pipeline=2)
    x = _edge_input(8, 40, 1)
    with pytest.raises(ValueError, match="bf16x2 needs fmt 'mxfp4'"):
        Q.QuantizeSpec("nvfp4", "sm_90a", pipeline=2, bf16x2=True)
    with pytest.raises(ValueError, match="bf16x2 needs"):
        Q.QuantizeSpec("mxfp4", "sm_90a", "up", pipeline=0, bf16x2=True)
    with pytest.raises(ValueError, match="multiple of 16"):
        Q.quantize_dense_variant(x, "mxfp8", pipeline=2, device="interp", target="sm_90a")
    spec = Q.QuantizeSpec("mxfp8", "sm_90a", "up", pipeline=1)
    with pytest.raises(ValueError, match="x.shape.0. must be <"):
        Q.check_pipeline_shape(spec, 1 << 30, 64)
    Q.check_pipeline_shape(spec, (1 << 30) - 1, 64)


@pytest.mark.parametrize("top", [6.0, 7.96875])
@pytest.mark.parametrize("shift", [0, -126, -133, 120, 124])
def test_bf16x2_every_product(shift, top):
    """MXFP4 with ``bf16x2`` on every bf16 product value, tie and sign, at extreme scales
    (2^-126 .. 2^-133: subnormal inputs, scale byte 0 and recip 2^127; 2^124: the largest
    finite blocks), all three E8M0 roundings; byte for byte against the reference."""
    x = _all_bf16_blocks(shift, top)
    for rounding in ("up", "even", "floor"):
        d, s = Q.quantize_dense_variant(x, "mxfp4", pipeline=2, bf16x2=True,
                                        scale_rounding=rounding, device="interp",
                                        target="sm_90a")
        rd, rs = ref.quantize_dynamic_block_scaled(x, "mxfp4", scale_rounding=rounding)
        assert_same_bytes(d, rd, f"bf16x2 {rounding} 2^{shift} data")
        assert_same_bytes(s, rs, f"bf16x2 {rounding} 2^{shift} scales")


def test_bf16x2_edge_inputs(monkeypatch):
    """bf16x2 on the edge inputs (NaN / Inf blocks, ties, near zero) with looping blocks."""
    monkeypatch.setattr(Q, "SMS", 1)
    for m, k, layout in CASES:
        x = _edge_input(m, k, m + k)
        for p in (1, 3):
            for rounding in ("up", "floor"):
                d, s = Q.quantize_dense_variant(x, "mxfp4", pipeline=p, bf16x2=True,
                                                scale_rounding=rounding, scale_layout=layout,
                                                device="interp", target="sm_90a")
                rd, rs = ref.quantize_dynamic_block_scaled(x, "mxfp4", scale_rounding=rounding,
                                                           scale_layout=layout)
                assert_same_bytes(d, rd, f"p{p} {rounding} {layout} data")
                assert_same_bytes(s, rs, f"p{p} {rounding} {layout} scales")


def test_bf16x2_ptx():
    """The bf16x2 variant's E2M1 runs on packed bf16 instructions; "up" needs no saturation."""
    for rounding, sat in (("up", False), ("floor", True)):
        spec = Q.QuantizeSpec("mxfp4", "sm_90a", rounding, pipeline=2, bf16x2=True)
        ptx = Q.kernel(spec).asm["ptx"]
        for instr in ("mul.rn.bf16x2", "fma.rn.bf16x2"):
            assert instr in ptx, instr
        assert ("min.NaN.bf16x2" in ptx) == sat
        assert "cvt.f32.bf16" not in ptx  # no bf16 op was promoted to f32


def test_defaults_select_the_pipelined_kernel(monkeypatch):
    """DEFAULT_PIPELINE / DEFAULT_BF16X2 route the ops (K % 16 == 0) to the pipelined kernels;
    other K stay on the base kernel."""
    monkeypatch.setattr(Q, "DEFAULT_PIPELINE", 2)
    monkeypatch.setattr(Q, "DEFAULT_BF16X2", True)
    names = []
    real = Q.launch
    monkeypatch.setattr(Q, "launch", lambda spec, *a: names.append(spec.kernel_name)
                        or real(spec, *a))
    for k in (64, 40):
        x = _edge_input(20, k, k)
        d, s = Q.quantize_dynamic_block_scaled(x, "mxfp4", device="interp", target="sm_90a")
        rd, rs = ref.quantize_dynamic_block_scaled(x, "mxfp4")
        assert_same_bytes(d, rd)
        assert_same_bytes(s, rs)
    assert names[0].endswith("_p2_bf16x2") and not names[1].endswith(("_p2", "_bf16x2"))


@pytest.mark.parametrize("target,fmt,instr", [
    ("sm_100a", "nvfp4", "cvt.rn.satfinite.e2m1x2.f32"),
    ("sm_100a", "mxfp8", "cvt.rn.satfinite.e4m3x2.f32"),
    ("gfx950", "mxfp4", "v_cvt_scalef32_pk_fp4_f32"),
    ("gfx942", "mxfp8", "_store_dwordx4")])
def test_pipelined_lowers(target, fmt, instr):
    """The pipelined kernels compile with the real toolchains and keep the native
    conversions (and the 16-byte MXFP8 store)."""
    kern = Q.kernel(Q.QuantizeSpec(fmt, target, None if fmt == "nvfp4" else "up", pipeline=2))
    asm = kern.asm["ptx" if target.startswith("sm") else "amdgcn"]
    assert instr in asm

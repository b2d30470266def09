"""Quantize kernels in the numpy interpreter, byte for byte against blockscale.reference.

The IR of all four targets is run (sm_90a, sm_100a, gfx942, gfx950) on reduced versions of
MAX's cases (SEMANTICS §8): (258,136), (258,184), (33,8200 tsf 0.43), near-zero blocks, NaN/Inf
blocks, tie values, partial last blocks, every E8M0 rounding, and grouped counts incl. unused
experts. The full shapes run on the GPU (tests/test_quantize_gpu.py).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _quantize_helpers import assert_same_bytes, group_offsets
from _quantize_inputs import _edge_input, nvfp4_tie_blocks

from blockscale import reference as ref
from blockscale.reference import grouped as RG

pytest.importorskip("mlir")

from blockscale.ops import quantize as Q
from blockscale.ops import quantize_amd as QA
from blockscale.ops import quantize_grouped as QG
from blockscale.ops import quantize_silu as QS

pytestmark = pytest.mark.interp
TARGETS = ("sm_90a", "sm_100a", "gfx942", "gfx950")


def _bf16(a) -> np.ndarray:
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16)


def _check_dense(x, fmt, target, **kw):
    d, s = Q.quantize_dynamic_block_scaled(x, fmt, device="interp", target=target, **kw)
    rd, rs = ref.quantize_dynamic_block_scaled(x, fmt, **kw)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_max_shapes_reduced(fmt, target):
    tsf = 0.43 if fmt == "nvfp4" else 1.0
    for m, k in ((258, 136), (33, 8200)):
        _check_dense(_edge_input(m, k, m + k), fmt, target, tensor_sf=tsf)


@pytest.mark.parametrize("fmt,k", [("nvfp4", 184), ("nvfp4", 30), ("mxfp4", 46), ("mxfp8", 33),
                                   ("mxfp8", 7)])
def test_partial_blocks_unaligned(fmt, k):
    """K % 8 != 0 or partial last block (D7): amax over valid elements, padding zero."""
    for target in ("sm_90a", "gfx942"):
        _check_dense(_edge_input(131, k, k), fmt, target)


@pytest.mark.parametrize("rounding", ["up", "even", "floor"])
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_e8m0_roundings(fmt, rounding):
    x = _edge_input(40, 96, 3)
    for target in ("sm_90a", "sm_100a", "gfx950"):
        _check_dense(x, fmt, target, scale_rounding=rounding)


@pytest.mark.parametrize("layout", ["row_major", "tcgen5d"])
def test_layouts_and_tsf(layout):
    x = _edge_input(70, 64, 5)
    for tsf in (1.0, 0.5, 768.0):
        _check_dense(x, "nvfp4", "sm_90a", tensor_sf=tsf, scale_layout=layout)


@pytest.mark.parametrize("blocks", [1, 3, 7])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_dense_grid_stride(monkeypatch, fmt, blocks):
    """The dense kernel's grid-stride row loop with fewer blocks than row groups (each block
    visits several groups, some one more than others), aligned and unaligned K."""
    monkeypatch.setattr(Q, "RESIDENT_BLOCKS", blocks)
    for m, k in ((300, 136), (129, 72), (70, 48)):
        _check_dense(_edge_input(m, k, m + k), fmt, "sm_90a")
    for target in ("sm_90a", "gfx942"):
        _check_dense(_edge_input(40, 42, 9), fmt, target)
        _check_dense(_edge_input(131, 136, 4), fmt, target, scale_layout="row_major")


@pytest.mark.parametrize("target", TARGETS)
def test_infinite_recip_nan_products(target):
    """tensor_sf ~3e38 with bf16-subnormal blocks: sd * (1/tsf) underflows, recip = +inf, so
    x * recip is ±inf or NaN (for ±0). The NaN codes are 0x7 with the sign cleared (the
    sm_90a fast E2M1 path hands these blocks to the software form)."""
    row = np.array([-0.0, 0.0, 1e-40, -1e-40, -0.0, 2e-40, -0.0, 0.0] * 4 + [1.0] * 16,
                   np.float32)
    x = _bf16(np.tile(row, (3, 2)))
    for tsf in (3e38, 1e38, 2.0 ** 120):
        for k in (x.shape[1], x.shape[1] - 8):
            _check_dense(np.ascontiguousarray(x[:, :k]), "nvfp4", target, tensor_sf=tsf)


@pytest.mark.parametrize("target", TARGETS)
def test_tiny_tensor_scale_rescaled(target):
    """tensor_sf <= 2^-100 with values near the bf16 maximum: recip = 1 / (sd * (1/tsf))
    falls below 2^-96 (down to subnormal), where the sm_90a fast E2M1 path moves 2^24 from x
    into recip / 8 (which alone could round) in its rare-reciprocal branch."""
    for i, tsf in enumerate((2.0 ** -100, 2.0 ** -118, 2.0 ** -120, 1.3e-36)):
        x = _bf16(nvfp4_tie_blocks(6, 192, tsf, 21 + i))
        for k in (192, 184):
            _check_dense(np.ascontiguousarray(x[:, :k]), "nvfp4", target, tensor_sf=tsf)


def test_near_zero_blocks_finite():
    """Blocks [0, 1e-38 x15] (MAX near-zero test): finite decoded values and scales."""
    x = _bf16(np.tile(np.array([0.0] + [1e-38] * 15, np.float32), (129, 2944 // 16)))
    d, s = Q.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=0.43, device="interp")
    rd, rs = ref.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=0.43)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)
    assert np.all(np.isfinite(ref.dequantize_block_scaled(d, s, "nvfp4", k=2944,
                                                          tensor_sf=0.43)))


def test_amd_and_flat_mxfp4():
    x = _edge_input(32, 1024, 9)
    for target in ("gfx950", "gfx942", "sm_90a"):
        d, s = QA.quantize_mxfp4_amd(x, device="interp", target=target)
        rd, rs = ref.quantize_mxfp4_amd(x)
        assert_same_bytes(d, rd)
        assert_same_bytes(s, rs)
    d, s = QA.quantize_dynamic_block_scaled_mxfp4(x, device="interp", target="gfx950")
    rd, rs = ref.quantize_dynamic_block_scaled(x, "mxfp4", scale_layout="row_major")
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)
    # the dispatcher routes hip + MXFP4 + row-major to the AMD kernel
    d, s = Q.quantize_dynamic_block_scaled(x, "mxfp4", scale_layout="row_major",
                                           device="interp", target="gfx950")
    assert_same_bytes(s, rs)


@pytest.mark.parametrize("counts,ids,k", [([256, 128, 256], [0, 1, 2], 64),
                                          ([100, 200, 50], [2, 0, 1], 72),
                                          ([13, 999], [1, 0], 40),
                                          ([0, 3, 1, 2], [-1, 2, -1, 0], 30)])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_grouped(counts, ids, k, fmt):
    es, offs = group_offsets(counts)
    ids = np.asarray(ids, np.int32)
    x = _edge_input(int(es[-1]), k, k)
    tsf = np.array([0.43, 1.0, 0.5], np.float32) if fmt == "nvfp4" else None
    target = TARGETS[len(counts) % 4]
    d, s = QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, device="interp",
                                              target=target)
    rd, rs = RG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


def test_grouped_indices():
    es, offs = group_offsets([100, 60])
    rng = np.random.default_rng(2)
    x = _edge_input(81, 64, 4)
    idx = rng.integers(0, 162, 160).astype(np.int32)
    tsf = np.array([1.0, 0.5], np.float32)
    ids = np.array([0, 1], np.int32)
    d, s = QG.grouped_quantize_dynamic_scaled(x, "nvfp4", es, offs, ids, tsf, indices=idx,
                                              indices_divisor=2, device="interp")
    rd, rs = RG.grouped_quantize_dynamic_scaled(x, "nvfp4", es, offs, ids, tsf, indices=idx,
                                                indices_divisor=2)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_fused_silu(fmt, activation):
    es, offs = group_offsets([100, 0, 60])
    ids = np.array([1, -1, 0], np.int32)
    gu = _bf16(np.random.default_rng(3).standard_normal((160, 128)) * 4)
    isc = np.array([0.5, 0.25], np.float32) if fmt == "nvfp4" else None
    d, s = QS.fused_silu_quantize(gu, fmt, es, offs, ids, isc, activation=activation,
                                  device="interp", target="sm_90a")
    rd, rs = RG.fused_silu_quantize(gu, fmt, es, offs, ids, isc, activation=activation)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


def test_bad_arguments():
    x = _bf16(np.ones((4, 32)))
    with pytest.raises(ValueError, match="tensor_sf"):
        Q.quantize_dynamic_block_scaled(x, "mxfp4", tensor_sf=2.0, device="interp")
    with pytest.raises(ValueError, match="even"):
        Q.quantize_dynamic_block_scaled(_bf16(np.ones((4, 31))), "nvfp4", device="interp")
    with pytest.raises(TypeError, match="bfloat16"):
        Q.quantize_dynamic_block_scaled(np.ones((4, 32), np.float32), "nvfp4", device="interp")
    with pytest.raises(ValueError, match="multiple of 64"):
        Q.quantize_dynamic_scaled_fp4_async(_bf16(np.ones((4, 32))), device="interp")
    with pytest.raises(ValueError, match="requires tensor_sf"):
        es, offs = group_offsets([4])
        QG.grouped_quantize_dynamic_scaled(x, "nvfp4", es, offs, np.array([0], np.int32), None,
                                           device="interp")


@pytest.mark.lower
def test_sm90a_kernel_quality():
    """16-byte loads, 16 elements per thread (two loads; NVFP4: one thread per block, so no
    shuffle; MX: 2 lanes per block), IEEE reciprocal (rcp.rn / div.rn, never .approx) where
    one is needed (MX reciprocals are exact powers of two, built from the byte), no spills."""
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        k = Q.kernel(fmt, "sm_90a")
        ptx = k.asm["ptx"]
        assert ptx.count("ld.global.v4") >= 2
        assert ("shfl.sync.bfly" in ptx) == (fmt != "nvfp4")
        assert k.meta["registers"] <= 40  # 6 resident blocks per SM (Q.RESIDENT_BLOCKS)
        assert ".approx" not in ptx
        assert k.meta.get("spill_stores", 0) == 0 and k.meta.get("spill_loads", 0) == 0
    assert "rcp.rn.f32" in Q.kernel("nvfp4", "sm_90a").asm["ptx"] or \
        "div.rn.f32" in Q.kernel("nvfp4", "sm_90a").asm["ptx"]

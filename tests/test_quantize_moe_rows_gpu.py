"""The rows, stream, wide, bulk-ring wide (also one chunk a visit, "wide1_bulk2_lut") and
multi-wave ("wide_bulk2_x2" / "_x3" / "_x4", "wide_bulk2_lut_x2", "wide1_bulk2_lut_x2" / "_x4")
schedules of grouped and fused-SiLU quantize on an NVIDIA GPU (sm_90a), byte for byte against
the reference: MAX's grouped cases, the bench shape's routing, every bf16 gate through the
sigmoid-table kernels, edge values. Kernels come from the bundle (``make gpu-bundle``) or are
compiled here. Run with ``pytest -m gpu tests/test_quantize_moe_rows_gpu.py``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _quantize_helpers import assert_same_bytes, group_offsets, uniform_bf16

from blockscale.ops import quantize_grouped as QG
from blockscale.ops import quantize_silu as QS
from blockscale.reference import grouped as RG

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]
ROWS = ("rows", "rows2", "stream", "stream2", "wide", "wide4", "wide_deep", "wide_bulk2",
        "wide_bulk3", "wide_bulk4", "wide_bulk2_x2", "wide_bulk2_x3", "wide_bulk2_x4")
FUSED = ("rows", "rows2", "rows_lut", "rows2_lut", "stream", "stream2", "stream_lut",
         "stream2_lut", "wide", "wide_lut", "wide_bulk2_lut", "wide_bulk2_lut_x2",
         "wide1_bulk2_lut", "wide1_bulk2_lut_x2", "wide1_bulk2_lut_x4")


def _routing(rows: int, experts: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    counts = np.bincount(np.random.default_rng(seed).integers(0, experts, rows),
                         minlength=experts)
    return group_offsets(counts)


@pytest.mark.parametrize("schedule", ROWS)
@pytest.mark.parametrize("counts,ids,k", [([256, 128, 256], [0, 1, 2], 704),
                                          ([100, 200, 50], [0, 1, 2], 704),
                                          ([13, 999], [0, 1], 704),
                                          ([100, 60], [0, 1], 352),
                                          ([0, 3, 1, 2], [-1, 2, -1, 0], 2048),
                                          ([0, 3, 1, 2], [-1, 2, -1, 0], 30)])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_grouped_rows_max_cases(fmt, counts, ids, k, schedule):
    es, offs = group_offsets(counts)
    ids = np.asarray(ids, np.int32)
    x = uniform_bf16(int(es[-1]), k, k, 4.0)
    tsf = np.array([0.43, 1.0, 0.5], np.float32) if fmt == "nvfp4" else None
    d, s = QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, device="cuda",
                                              schedule=schedule)
    rd, rs = RG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


@pytest.mark.parametrize("schedule", ROWS)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_grouped_rows_bench_routing(fmt, schedule):
    """64 experts, uniform routing of 4096 rows (the benchmark's shape, fewer rows)."""
    es, offs = _routing(4096, 64, 1)
    ids = np.arange(64, dtype=np.int32)
    x = uniform_bf16(4096, 1024, 5, 8.0)
    tsf = np.random.default_rng(2).uniform(0.5, 2, 64).astype(np.float32) \
        if fmt == "nvfp4" else None
    d, s = QG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf, device="cuda",
                                              schedule=schedule)
    rd, rs = RG.grouped_quantize_dynamic_scaled(x, fmt, es, offs, ids, tsf)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


@pytest.mark.parametrize("schedule", FUSED)
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_fused_rows(fmt, activation, schedule):
    es, offs = _routing(2048, 16, 3)
    ids = np.arange(16, dtype=np.int32)
    ids[5] = -1
    gu = uniform_bf16(2048, 2 * 704, 4, 12.0)
    gu[7, :16] = np.float32(np.nan)
    gu[9, 704:720] = np.float32(np.inf)
    isc = np.random.default_rng(4).uniform(0.5, 2, 16).astype(np.float32) \
        if fmt == "nvfp4" else None
    d, s = QS.fused_silu_quantize(gu, fmt, es, offs, ids, isc, activation=activation,
                                  device="cuda", schedule=schedule)
    rd, rs = RG.fused_silu_quantize(gu, fmt, es, offs, ids, isc, activation=activation)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)


@pytest.mark.parametrize("schedule", ["rows_lut", "rows2_lut", "wide_lut", "wide_bulk2_lut"])
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_fused_lut_every_gate(activation, schedule):
    """All 65536 bf16 gates (NaN, Inf, subnormals, +-0) through the sigmoid-table kernels."""
    gate = np.tile(np.arange(1 << 16, dtype=np.uint16).reshape(128, 512), (2, 1))
    up = (np.random.default_rng(6).standard_normal((256, 512)) * 2).astype(ml_dtypes.bfloat16)
    gu = np.concatenate([gate.view(ml_dtypes.bfloat16), up], axis=1)
    es, offs = group_offsets([100, 156])
    ids = np.array([1, 0], np.int32)
    isc = np.array([0.7, 3.0], np.float32)
    d, s = QS.fused_silu_quantize(gu, "nvfp4", es, offs, ids, isc, activation=activation,
                                  device="cuda", schedule=schedule)
    rd, rs = RG.fused_silu_quantize(gu, "nvfp4", es, offs, ids, isc, activation=activation)
    assert_same_bytes(d, rd)
    assert_same_bytes(s, rs)

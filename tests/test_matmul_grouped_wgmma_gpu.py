"""The sm_90a grouped wgmma matmul on an NVIDIA GPU (H100 / H200).

Run on the GPU machine (kernels from ``make gpu-bundle``, which holds
``matmul_grouped_wgmma.bundle_specs``)::

    BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu -s tests/test_matmul_grouped_wgmma_gpu.py

MAX's grouped cases (tests/test_matmul_grouped.py GPU_CASES: unused groups, groups spanning
several 128-row tiles, tiny groups) through the kernel directly (every tile, NVFP4 with
``a_row_scales``), and a gpt-oss-120b gate_up case (E=128, top-4 uniform routing of 1024
tokens, N=5760, K=2880) through the dispatch, which must pick this kernel. The bf16 outputs
must be consistent with the exact float64 value within the stated fp32 bound (MXFP4 "fold":
J more roundings); HGMMA's accumulation is not bit-identical to the portable kernel's.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_matmul_common import assert_bf16_consistent, dequantize_exact, f32_error_bound
from test_matmul_grouped import GPU_CASES, exact_grouped, make_grouped_case

from blockscale import reference as ref
from blockscale.formats import MXFP4, NVFP4, Format
from blockscale.ops import matmul_grouped as mg
from blockscale.ops import matmul_grouped_wgmma as gw

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]


def _bound(fmt: Format, k: int, abs_sum: np.ndarray, rows: bool) -> np.ndarray:
    spec = gw.GroupedWgmmaSpec(fmt.name)  # the default variant: "fold"
    extra = fmt.kblocks(k) if fmt.is_mx and spec.scaling == "fold" else 0
    return f32_error_bound(abs_sum, fmt, k, n_mul=(2 if rows else 1) + extra)


@pytest.mark.parametrize("tiles", gw.TILE_CHOICES, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("case_id", range(len(GPU_CASES)))
@pytest.mark.parametrize("fmt", [NVFP4, MXFP4], ids=lambda f: f.name)
def test_grouped_wgmma_gpu(fmt, case_id, tiles):
    counts, ids, e_count, n, k = GPU_CASES[case_id]
    rng = np.random.default_rng(case_id)
    case, row_scales, w_scales = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
    esc = (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)
    rows = rng.uniform(0.5, 2, sum(counts)).astype(ml_dtypes.bfloat16) if fmt is NVFP4 \
        else None
    out = gw.grouped_matmul_block_scaled_wgmma(**case, expert_scales=esc, fmt=fmt, k=k,
                                               a_row_scales=rows, tiles=tiles, device="cuda")
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, fmt, k, esc, rows)
    flips = assert_bf16_consistent(out, exact, _bound(fmt, k, abs_sum, rows is not None))
    print(f"\n{fmt.name} case {case_id} {tiles}: {flips} bf16 outputs at a rounding midpoint")
    es = case["expert_start"].astype(np.int64)
    for g, e in enumerate(ids):  # unused groups: zeros
        if e < 0:
            assert not np.any(out[es[g]:es[g + 1]].view(np.uint16))


@pytest.mark.parametrize("fmt", [NVFP4, MXFP4], ids=lambda f: f.name)
def test_gpt_oss_gate_up_gpu(fmt, monkeypatch):
    """gpt-oss-120b gate_up at 1024 tokens (4096 routed rows) through the dispatch; 384
    sampled rows checked against the exact value."""
    e_count, top_k, n, k, tokens = 128, 4, 5760, 2880, 1024
    rng = np.random.default_rng(120)
    topk = np.argsort(rng.random((tokens, e_count)), axis=1)[:, :top_k].astype(np.int32)
    _order, es, _restore, eids, _stats, _offs = ref.moe_create_indices(topk.reshape(-1),
                                                                       e_count)
    es, eids = es.astype(np.int64), eids.astype(np.int32)
    counts = np.diff(es).tolist()
    assert gw.fast_path("sm_90a", fmt, int(es[-1]), n, k, len(counts), False) is not None
    launched = []
    launch = gw.launch

    def spy(spec, *args, **kw):
        launched.append(spec)
        return launch(spec, *args, **kw)
    monkeypatch.setattr(gw, "launch", spy)
    case, row_scales, w_scales = make_grouped_case(rng, fmt, counts, eids.tolist(), e_count,
                                                   n, k)
    esc = rng.uniform(0.5, 2, e_count).astype(np.float32) if fmt is NVFP4 else None
    out = mg.grouped_matmul_block_scaled(**case, expert_scales=esc, fmt=fmt, k=k,
                                         device="cuda", target="sm_90a")
    # MXFP4 (PDQ_FORMATS) runs the grouped producer-dequant kernel, not this one
    assert [s.bn for s in launched] == ([] if fmt.name in gw.PDQ_FORMATS else [256])
    sample = np.sort(rng.choice(int(es[-1]), 384, replace=False))
    group = np.searchsorted(es, sample, side="right") - 1
    a_deq = dequantize_exact(case["hidden"][sample], row_scales[sample], fmt, k)
    exact, abs_sum = np.zeros((len(sample), n)), np.zeros((len(sample), n))
    for g in np.unique(group):
        e = int(eids[g])
        sel = group == g
        if e < 0:
            continue
        wd = dequantize_exact(case["weight"][e], w_scales[e], fmt, k)
        f = 1.0 if esc is None else float(esc[e])
        exact[sel], abs_sum[sel] = (a_deq[sel] @ wd.T) * f, (np.abs(a_deq[sel]) @ np.abs(wd).T) * f
    assert_bf16_consistent(out[sample], exact, _bound(fmt, k, abs_sum, False))

"""Operands at addresses that are not 16-byte aligned (torch views at an 8-byte offset): the
dense and grouped dispatches run the portable kernels (the tiled kernels' 16-byte loads and
tensor maps would fault) and still meet the stated bound. Needs torch with CUDA and the bundle::

    BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_misaligned_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest
from test_matmul_common import assert_bf16_consistent, f32_error_bound
from test_matmul_grouped import exact_grouped, make_grouped_case

from blockscale.formats import MXFP4, NVFP4
from blockscale.ops import matmul_grouped

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]

torch = pytest.importorskip("torch")


def _on_gpu(x: np.ndarray, offset: int = 0):
    """``x``'s bytes in a CUDA tensor starting ``offset`` bytes into its allocation, viewed
    with the torch dtype of the same name (uint8 / float8 scales)."""
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    raw = np.ascontiguousarray(x).view(np.uint8)
    flat = torch.zeros(raw.size + offset, dtype=torch.uint8, device="cuda")
    view = flat[offset:].view(raw.shape)
    view.copy_(torch.from_numpy(raw))
    if x.dtype == np.uint8:
        return view
    dt = getattr(torch, np.dtype(x.dtype).name, None)
    if dt is None:
        pytest.skip(f"this torch has no {np.dtype(x.dtype).name}")
    return view.view(dt)


@pytest.mark.parametrize("fmt", [NVFP4, MXFP4], ids=lambda f: f.name)
def test_grouped_misaligned_hidden(fmt):
    rng = np.random.default_rng(21)
    counts, ids, e_count, n, k = [600, 0, 130, 400], [0, 2, -1, 1], 3, 264, 192
    case, row_scales, w_scales = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
    esc = (1 + np.arange(e_count) / e_count).astype(np.float32)
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, fmt, k, esc)
    args = {**case, "hidden": _on_gpu(case["hidden"], 8), "weight": _on_gpu(case["weight"]),
            "a_scales": _on_gpu(case["a_scales"]), "b_scales": _on_gpu(case["b_scales"])}
    out = matmul_grouped.grouped_matmul_block_scaled(**args, expert_scales=esc, fmt=fmt, k=k,
                                                     device="cuda", target="sm_90a")
    assert_bf16_consistent(out.numpy(), exact, f32_error_bound(abs_sum, fmt, k, n_mul=1))


@pytest.mark.parametrize("arg", ["a", "sfb"])
def test_direct_tiled_calls_reject_misaligned(arg):
    """The direct calls have no portable fallback: a ValueError naming the operand before
    any launch (the kernels' 16-byte loads would fault)."""
    from test_matmul_common import random_dense_case

    from blockscale.ops import matmul_decode, matmul_sm90, matmul_wgmma

    m, n, k = 64, 128, 256
    a, b, _sfa, _sfb, sfa5, sfb5 = random_dense_case(np.random.default_rng(2), NVFP4, m, n, k)
    ops = {"a": _on_gpu(a), "b": _on_gpu(b), "sfa": _on_gpu(sfa5), "sfb": _on_gpu(sfb5)}
    ops[arg] = _on_gpu({"a": a, "sfb": sfb5}[arg], 8)
    for call in (matmul_wgmma.block_scaled_matmul_wgmma, matmul_sm90.block_scaled_matmul_sm90,
                 matmul_decode.block_scaled_matmul_decode):
        with pytest.raises(ValueError, match=rf"^{arg} must be 16-byte aligned.*% 16 = 8\)"):
            call(*ops.values(), NVFP4, k=k, device="cuda")

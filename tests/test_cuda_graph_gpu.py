"""The ops inside ``torch.cuda.graph`` capture: quantize -> block_scaled_matmul on torch CUDA
tensors is captured (launches and output allocations go to torch's capture stream; nothing
synchronizes), replayed, and the replayed bytes equal the eager result exactly, after new
input values are copied into the captured input tensors too. Shapes: a decode step (M = 1,
the decode kernel), M = 128 (the sm_90a wgmma kernel) and M = 1024 (the two-phase pair: its
bf16 workspaces are stream-ordered allocations made inside the capture). Needs torch with CUDA and the kernel bundle::

    BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_cuda_graph_gpu.py
"""

from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest

from blockscale import layouts, ops
from blockscale import reference as ref
from blockscale.formats import NVFP4

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]

torch = pytest.importorskip("torch")


def _torch_cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    return torch


def _weights(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """NVFP4 weights [N, K/2] (any bytes) and their 5-D E4M3 scales (finite, near 1)."""
    w = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    s2 = rng.integers(0x30, 0x40, (n, NVFP4.kblocks(k)), dtype=np.uint8)
    return w, layouts.interleave(s2).view(np.uint8)


def _step(x, w, sw, k: int):
    data, scales = ops.quantize_dynamic_block_scaled(x, "nvfp4", tensor_sf=0.5)
    return ops.block_scaled_matmul(data, w, scales, sw, NVFP4, k=k, alpha=2.0)


def _bytes(out) -> np.ndarray:
    return out.numpy().view(np.uint8)


@pytest.mark.parametrize("m", [1, 128, 1024])  # decode, wgmma, two-phase (workspaces in the graph)
def test_quantize_matmul_captured_replay_is_byte_exact(m):
    t = _torch_cuda()
    n, k = 512, 2048
    rng = np.random.default_rng(7)
    w, sw = _weights(rng, n, k)
    x_host = (rng.standard_normal((m, k)) * 4).astype(np.float32)
    x = torch.from_numpy(x_host).to(device="cuda", dtype=torch.bfloat16)
    tw = torch.from_numpy(w).cuda()
    tsw = torch.from_numpy(sw).cuda().view(torch.float8_e4m3fn)

    eager = _bytes(_step(x, tw, tsw, k))
    t.cuda.synchronize()

    side = t.cuda.Stream()  # warm up on a side stream, as torch recommends before capture
    side.wait_stream(t.cuda.current_stream())
    with t.cuda.stream(side):
        for _ in range(2):
            _step(x, tw, tsw, k)
    t.cuda.current_stream().wait_stream(side)
    t.cuda.synchronize()
    gc.collect()

    graph = t.cuda.CUDAGraph()
    with t.cuda.graph(graph):
        out = _step(x, tw, tsw, k)
    graph.replay()
    t.cuda.synchronize()
    np.testing.assert_array_equal(_bytes(out), eager)

    # new values in the captured input: the replay computes them like an eager call
    x2 = torch.from_numpy(-2 * x_host).to(device="cuda", dtype=torch.bfloat16)
    eager2 = _bytes(_step(x2, tw, tsw, k))
    x.copy_(x2)
    graph.replay()
    t.cuda.synchronize()
    np.testing.assert_array_equal(_bytes(out), eager2)
    assert not np.array_equal(eager, eager2)


def test_ops_follow_torch_current_stream():
    """Outside capture, a non-default torch stream gets the launch and the outputs."""
    t = _torch_cuda()
    from blockscale.runtime import get_device

    x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    s = t.cuda.Stream()
    with t.cuda.stream(s):
        data, scales = ops.quantize_dynamic_block_scaled(x, "nvfp4")
        assert data.stream == scales.stream == s.cuda_stream
    assert get_device("cuda").context_stream() is None
    s.synchronize()
    host = x.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
    want_d, want_s = ref.quantize_dynamic_block_scaled(host, NVFP4)
    np.testing.assert_array_equal(data.numpy().view(np.uint8), want_d.view(np.uint8))
    np.testing.assert_array_equal(scales.numpy().view(np.uint8), want_s.view(np.uint8))


def test_interleave_follows_stream_and_replays_in_a_graph():
    """block_scales_interleave launches through the shared path: on torch's current stream,
    and captured in a graph whose replay writes the reference layout for new input bytes."""
    t = _torch_cuda()
    rng = np.random.default_rng(11)
    host = rng.integers(0, 256, (300, 20), dtype=np.uint8)
    src = torch.from_numpy(host).cuda()
    s = t.cuda.Stream()
    with t.cuda.stream(s):
        out = ops.block_scales_interleave(src)
        assert out.stream == s.cuda_stream
    s.synchronize()
    np.testing.assert_array_equal(out.numpy(), layouts.interleave(host))

    ops.block_scales_interleave(src)  # warm (kernel loaded) before capture
    t.cuda.synchronize()
    graph = t.cuda.CUDAGraph()
    with t.cuda.graph(graph):
        captured = ops.block_scales_interleave(src)
    host2 = rng.integers(0, 256, host.shape, dtype=np.uint8)
    src.copy_(torch.from_numpy(host2))
    graph.replay()
    t.cuda.synchronize()
    np.testing.assert_array_equal(captured.numpy(), layouts.interleave(host2))


def test_grouped_band_split_graph_replay(monkeypatch):
    """The grouped op's band split (NVFP4, >= 80 rows a group: 128-row items for the groups
    outside (128, 192] rows, 192 x 192 items for those inside, two launches into one output,
    by programmatic dependent launch) on torch tensors: byte-equal to the one-kernel dispatch
    and to the pair launched in order, also inside ``torch.cuda.graph`` (a programmatic
    edge) and on replay with new input bytes."""
    t = _torch_cuda()
    from test_matmul_grouped import make_grouped_case

    from blockscale.ops import matmul_grouped_pdq as GP

    rng = np.random.default_rng(5)
    counts = [140, 100, 170, 128, 0, 129, 192, 60, 150, 131, 90, 185]
    ids = [e if c else -1 for e, c in enumerate(counts)]
    case, _, _ = make_grouped_case(rng, NVFP4, counts, ids, len(counts), 1024, 2880)
    dev = {key: torch.from_numpy(v.view(np.uint8) if v.dtype.itemsize == 1 else
                                 v.astype(np.int32)).cuda() for key, v in case.items()}
    for key in ("a_scales", "b_scales"):
        dev[key] = dev[key].view(torch.float8_e4m3fn)
    esc = torch.linspace(0.5, 2.0, len(counts), device="cuda", dtype=torch.float32)

    def step():
        return ops.grouped_matmul_block_scaled(**dev, expert_scales=esc, fmt=NVFP4, k=2880)

    assert len(GP.dispatch_plan(NVFP4, 1024, False, "sm_90a", "cuda", False,
                                sum(counts) / len(counts))) == 2
    eager = _bytes(step())
    t.cuda.synchronize()
    monkeypatch.setenv(GP.BAND_ENV, "0")  # one kernel for every group: the same bytes
    np.testing.assert_array_equal(eager, _bytes(step()))
    monkeypatch.delenv(GP.BAND_ENV)
    monkeypatch.setenv(GP.BAND_PDL_ENV, "0")  # the pair in order (the dispatch: pdl)
    np.testing.assert_array_equal(eager, _bytes(step()))
    monkeypatch.delenv(GP.BAND_PDL_ENV)

    step()
    t.cuda.synchronize()
    gc.collect()
    graph = t.cuda.CUDAGraph()
    with t.cuda.graph(graph):
        out = step()
    dev["hidden"].copy_(torch.from_numpy(np.flip(case["hidden"], 0).copy()).cuda())
    graph.replay()
    t.cuda.synchronize()
    np.testing.assert_array_equal(_bytes(out), _bytes(step()))
    assert not np.array_equal(_bytes(out), eager)
